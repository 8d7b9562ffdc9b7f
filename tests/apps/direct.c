/* Path 1: the program links libcuda and calls the exported symbols. */
#include "workload.h"

int main(void) {
    struct api a = {
        cuInit, cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent, cuMemGetInfo_v2,
        cuDeviceTotalMem_v2, cuMemAlloc_v2, cuMemFree_v2, cuMemAllocAsync, cuMemFreeAsync,
        cuMemCreate, cuMemRelease, cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel,
        cuLaunchKernelEx, cuCtxSynchronize,
    };
    describe("cuMemAlloc_v2", (void *)cuMemAlloc_v2);
    run_workload(&a);
    return 0;
}
