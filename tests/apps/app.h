/* Shared helpers of the integration-test programs. Each program prints its
 * results as "R ..." lines on stdout (compared between a run with and a run
 * without the shim) and diagnostics as "D ..." lines. */
#ifndef CUSLICE_TEST_APP_H
#define CUSLICE_TEST_APP_H

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuslice_cuda.h"
#include "fake_extra.h"

#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult r_ = (call);                                                   \
        if (r_ != CUDA_SUCCESS) {                                               \
            fprintf(stderr, "FAIL %s:%d: %s -> %d\n", __FILE__, __LINE__, #call, \
                    (int)r_);                                                   \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

/* Name of the shared object that contains a function pointer, and the
 * symbol it is exported as: tells a hook ("libcuslice.so") from the driver. */
static inline void describe(const char *what, void *p) {
    Dl_info info;
    memset(&info, 0, sizeof info);
    if (p && dladdr(p, &info) && info.dli_fname) {
        const char *base = strrchr(info.dli_fname, '/');
        printf("D %s %s %s\n", what, base ? base + 1 : info.dli_fname,
               info.dli_sname ? info.dli_sname : "?");
    } else {
        printf("D %s null -\n", what);
    }
}

/* Device 0 (*dev), its primary context made current, and the fake
 * driver's "sleep_kernel" (one parameter: how long it runs, ns). Exits
 * where a step fails. */
static inline CUfunction sleep_kernel_on_device0(CUdevice *dev) {
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, *dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "fake-image"));
    CHECK(cuModuleGetFunction(&f, mod, "sleep_kernel"));
    return f;
}

#endif
