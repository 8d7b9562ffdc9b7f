/* One fixed workload expressed through a table of function pointers, so that
 * every entry path (direct link, dlsym, cuGetProcAddress) runs the same
 * calls. Counts: 8 cuMemAlloc_v2, 8 cuMemFree_v2, 16 cuLaunchKernel,
 * 2 cuLaunchKernelEx, 2 cuMemGetInfo_v2, 1 cuDeviceTotalMem_v2,
 * 1 cuMemAllocAsync + 1 cuMemFreeAsync, 1 cuMemCreate + 1 cuMemRelease. */
#ifndef CUSLICE_TEST_WORKLOAD_H
#define CUSLICE_TEST_WORKLOAD_H

#include "app.h"

struct api {
    CUresult (*Init)(unsigned int);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*MemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
    CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*CtxSynchronize)(void);
};

static void run_workload(const struct api *a) {
    CUdevice dev;
    CUcontext ctx;
    CHECK(a->Init(0));
    CHECK(a->DeviceGet(&dev, 0));
    CHECK(a->PrimaryCtxRetain(&ctx, dev));
    CHECK(a->CtxSetCurrent(ctx));

    size_t free0 = 0, total = 0, tm = 0;
    CHECK(a->MemGetInfo(&free0, &total));
    CHECK(a->DeviceTotalMem(&tm, dev));
    printf("R total=%zu devtotal=%zu\n", total, tm);

    CUdeviceptr p[8];
    for (int i = 0; i < 8; i++) CHECK(a->MemAlloc(&p[i], (size_t)(i + 1) << 20));
    size_t free1 = 0;
    CHECK(a->MemGetInfo(&free1, &total));
    printf("R used_by_allocs=%zu\n", free0 - free1);

    CUdeviceptr ap;
    CHECK(a->MemAllocAsync(&ap, 3 << 20, 0));
    CHECK(a->MemFreeAsync(ap, 0));

    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h;
    CHECK(a->MemCreate(&h, 2 << 20, &prop, 0));
    CHECK(a->MemRelease(h));

    CUmodule mod;
    CUfunction fn;
    CHECK(a->ModuleLoadData(&mod, "fake-image"));
    CHECK(a->ModuleGetFunction(&fn, mod, "sleep_kernel"));
    unsigned long long ns = 1000;
    void *params[] = {&ns};
    for (int i = 0; i < 16; i++) CHECK(a->LaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, params, NULL));
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 32;
    cfg.blockDimY = cfg.blockDimZ = 1;
    for (int i = 0; i < 2; i++) CHECK(a->LaunchKernelEx(&cfg, fn, params, NULL));
    CHECK(a->CtxSynchronize());

    for (int i = 0; i < 8; i++) CHECK(a->MemFree(p[i]));
    /* An allocation the device cannot hold: the error code must pass through. */
    CUdeviceptr big;
    CUresult r = a->MemAlloc(&big, total + 1);
    printf("R oversize_alloc=%d\n", (int)r);
    printf("R done\n");
}

#endif
