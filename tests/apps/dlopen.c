/* Path 2: dlopen("libcuda.so.1") + dlsym(handle, name), as JAX/XLA and
 * PyTorch's driver API loader do. Also looks up through RTLD_DEFAULT and
 * RTLD_NEXT. */
#include "workload.h"

static void *must(void *h, const char *name) {
    void *p = dlsym(h, name);
    if (!p) {
        fprintf(stderr, "FAIL dlsym(%s): %s\n", name, dlerror());
        exit(1);
    }
    return p;
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "FAIL dlopen: %s\n", dlerror());
        return 1;
    }
    struct api a;
    a.Init = must(h, "cuInit");
    a.DeviceGet = must(h, "cuDeviceGet");
    a.PrimaryCtxRetain = must(h, "cuDevicePrimaryCtxRetain");
    a.CtxSetCurrent = must(h, "cuCtxSetCurrent");
    a.MemGetInfo = must(h, "cuMemGetInfo_v2");
    a.DeviceTotalMem = must(h, "cuDeviceTotalMem_v2");
    a.MemAlloc = must(h, "cuMemAlloc_v2");
    a.MemFree = must(h, "cuMemFree_v2");
    a.MemAllocAsync = must(h, "cuMemAllocAsync");
    a.MemFreeAsync = must(h, "cuMemFreeAsync");
    a.MemCreate = must(h, "cuMemCreate");
    a.MemRelease = must(h, "cuMemRelease");
    a.ModuleLoadData = must(h, "cuModuleLoadData");
    a.ModuleGetFunction = must(h, "cuModuleGetFunction");
    a.LaunchKernel = must(h, "cuLaunchKernel");
    a.LaunchKernelEx = must(h, "cuLaunchKernelEx");
    a.CtxSynchronize = must(h, "cuCtxSynchronize");

    describe("handle:cuMemAlloc_v2", (void *)a.MemAlloc);
    describe("handle:cuLaunchKernel", (void *)a.LaunchKernel);
    describe("handle:cuLaunchKernel_ptsz", must(h, "cuLaunchKernel_ptsz"));
    describe("handle:cuGetProcAddress_v2", must(h, "cuGetProcAddress_v2"));
    describe("handle:cuDeviceGetName", must(h, "cuDeviceGetName"));
    describe("default:cuMemAlloc_v2", dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
    describe("next:cuMemAlloc_v2", dlsym(RTLD_NEXT, "cuMemAlloc_v2"));
    /* A symbol nobody defines stays unresolved. */
    describe("handle:cuNoSuchFunction", dlsym(h, "cuNoSuchFunction"));

    void *nh = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (nh) {
        describe("nvml:nvmlDeviceGetMemoryInfo", must(nh, "nvmlDeviceGetMemoryInfo"));
        describe("nvml:nvmlInit_v2", must(nh, "nvmlInit_v2"));
    }
    run_workload(&a);
    return 0;
}
