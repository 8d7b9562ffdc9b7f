/* 32 threads allocate, launch and free at once through the exported symbols:
 * results unchanged, every call seen. */
#include "app.h"

#include <pthread.h>

#define THREADS 32
#define ROUNDS 200

static CUcontext ctx;
static CUfunction fn;
static int failures;

static void *worker(void *arg) {
    (void)arg;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    unsigned long long ns = 0;
    void *params[] = {&ns};
    for (int i = 0; i < ROUNDS; i++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 1 << 16) != CUDA_SUCCESS ||
            cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, params, NULL) != CUDA_SUCCESS ||
            cuMemFree_v2(p) != CUDA_SUCCESS)
            __atomic_add_fetch(&failures, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

int main(void) {
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "fake-image"));
    CHECK(cuModuleGetFunction(&fn, mod, "empty"));
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    CHECK(cuCtxSynchronize());
    size_t free = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free, &total));
    printf("R failures=%d leaked=%zu\n", failures, total - free);
    return 0;
}
