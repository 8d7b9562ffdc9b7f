/* Load: THREADS threads each do OPS random operations (allocate a random
 * size, free a random live allocation, or launch), then free everything.
 *   load THREADS OPS [GO]
 * With GO (a path), the threads start only once that file exists, after
 * the context is made: processes started together then all hold their
 * context before any of them fills the quota.
 * Prints "R ok allocs=A frees=F launches=L refused=X" (refusals under a
 * tight quota are expected and counted). */
#include "app.h"

#include <pthread.h>
#include <unistd.h>

static CUcontext ctx;
static CUfunction fn;
static int threads, ops;
static unsigned long long n_alloc, n_free, n_launch, n_refused, n_errors;

static void *worker(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 7919u + 17u;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) __atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
    enum { LIVE = 64 };
    CUdeviceptr live[LIVE] = {0};
    unsigned long long ns = 0;
    void *params[] = {&ns};
    for (int i = 0; i < ops; i++) {
        int k = rand_r(&seed) % LIVE;
        int what = rand_r(&seed) % 3;
        if (what == 0 && !live[k]) {
            size_t size = (size_t)(1 + rand_r(&seed) % 4096) * 256;
            CUresult r = cuMemAlloc_v2(&live[k], size);
            if (r == CUDA_SUCCESS) __atomic_add_fetch(&n_alloc, 1, __ATOMIC_RELAXED);
            else if (r == CUDA_ERROR_OUT_OF_MEMORY) { live[k] = 0; __atomic_add_fetch(&n_refused, 1, __ATOMIC_RELAXED); }
            else __atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
        } else if (what == 1 && live[k]) {
            if (cuMemFree_v2(live[k]) == CUDA_SUCCESS) __atomic_add_fetch(&n_free, 1, __ATOMIC_RELAXED);
            else __atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
            live[k] = 0;
        } else {
            if (cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, params, NULL) == CUDA_SUCCESS)
                __atomic_add_fetch(&n_launch, 1, __ATOMIC_RELAXED);
            else __atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
        }
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k]) {
            if (cuMemFree_v2(live[k]) == CUDA_SUCCESS) __atomic_add_fetch(&n_free, 1, __ATOMIC_RELAXED);
            else __atomic_add_fetch(&n_errors, 1, __ATOMIC_RELAXED);
        }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    threads = atoi(argv[1]);
    ops = atoi(argv[2]);
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "fake-image"));
    CHECK(cuModuleGetFunction(&fn, mod, "empty"));
    if (argc > 3)
        while (access(argv[3], F_OK) != 0) usleep(1000);
    pthread_t t[256];
    for (int i = 0; i < threads && i < 256; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    for (int i = 0; i < threads && i < 256; i++) pthread_join(t[i], NULL);
    CHECK(cuCtxSynchronize());
    printf("R %s allocs=%llu frees=%llu launches=%llu refused=%llu errors=%llu\n", n_errors ? "errors" : "ok", n_alloc,
           n_free, n_launch, n_refused, n_errors);
    fflush(stdout);
    return n_errors ? 1 : 0;
}
