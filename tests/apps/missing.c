/* Calls the shim's exports through RTLD_DEFAULT (the program is not linked
 * against any driver) and prints the status codes. */
#include "app.h"

int main(void) {
    CUresult (*init)(unsigned int) = (CUresult(*)(unsigned int))dlsym(RTLD_DEFAULT, "cuInit");
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
    CUresult (*launch)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                       unsigned int, unsigned int, unsigned int, CUstream, void **, void **) =
        (CUresult(*)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                     unsigned int, unsigned int, CUstream, void **, void **))dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    if (!init || !alloc || !launch) {
        printf("R exports-missing\n");
        return 1;
    }
    CUdeviceptr p = 0;
    printf("R init=%d\n", (int)init(0));
    printf("R alloc=%d\n", (int)alloc(&p, 1024));
    printf("R launch=%d\n", (int)launch(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
    return 0;
}
