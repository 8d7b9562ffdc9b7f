// Start-up cost probe: cuInit, primary context, one allocation, exit.
// Prints "INITUS <microseconds from before cuInit to after the free>".
// With the argument "init": cuInit, cuDeviceGet and cuDeviceTotalMem only
// (no context: hundreds of contexts do not fit in one GPU's memory).
#include <cuda.h>
#include <cstdio>
#include <cstring>
#include <ctime>
static double now_us() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
int main(int argc, char **argv) {
    bool init_only = argc > 1 && std::strcmp(argv[1], "init") == 0;
    CUdevice d;
    CUcontext c;
    CUdeviceptr p;
    double t0 = now_us();
    CUresult r;
    const char *step = "cuInit";
    size_t total = 0;
    if ((r = cuInit(0)) == CUDA_SUCCESS && (step = "cuDeviceGet", r = cuDeviceGet(&d, 0)) == CUDA_SUCCESS &&
        (step = "cuDeviceTotalMem", r = cuDeviceTotalMem(&total, d)) == CUDA_SUCCESS && !init_only &&
        (step = "cuDevicePrimaryCtxRetain", r = cuDevicePrimaryCtxRetain(&c, d)) == CUDA_SUCCESS &&
        (step = "cuCtxSetCurrent", r = cuCtxSetCurrent(c)) == CUDA_SUCCESS)
        step = "cuMemAlloc", r = cuMemAlloc(&p, 1 << 20);
    if (r != CUDA_SUCCESS) {
        std::printf("FAIL %s %d\n", step, (int)r);
        return 1;
    }
    if (!init_only) cuMemFree(p);
    std::printf("INITUS %.0f\n", now_us() - t0);
    return 0;
}
