// In-process A/B of the shim's per-call cost: the same loop alternately
// through the shim's hook and through the driver's own function, in blocks,
// in one process (no process-to-process noise). Run it under the shim.
// Usage: bench_ab KERNELS.ptx OFF_LAUNCH OFF_ALLOC OFF_FREE
//   OFF_*: the driver's symbol offsets (nm -D libcuda.so.1) of
//   cuLaunchKernel, cuMemAlloc_v2, cuMemFree_v2.
#include <cuda.h>
#include <dlfcn.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*free_t)(CUdeviceptr);

static double now_ns() {
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    Dl_info info;
    if (!dladdr((void *)&cuDeviceGetName, &info)) return 3;  // not hooked: lives in libcuda
    char *base = (char *)info.dli_fbase;
    launch_t real_launch = (launch_t)(base + strtoull(argv[2], nullptr, 16));
    alloc_t real_alloc = (alloc_t)(base + strtoull(argv[3], nullptr, 16));
    free_t real_free = (free_t)(base + strtoull(argv[4], nullptr, 16));
    launch_t hook_launch = &cuLaunchKernel;
    alloc_t hook_alloc = &cuMemAlloc;
    free_t hook_free = &cuMemFree;
    Dl_info hi;
    dladdr((void *)hook_launch, &hi);
    std::printf("hook cuLaunchKernel in %s, driver's at %p\n", hi.dli_fname, (void *)real_launch);
    if ((void *)hook_launch == (void *)real_launch) {
        std::fprintf(stderr, "not running under the shim\n");
        return 4;
    }
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    cuInit(0);
    cuDeviceGet(&dev, 0);
    cuDevicePrimaryCtxRetain(&ctx, dev);
    cuCtxSetCurrent(ctx);
    if (cuModuleLoad(&mod, argv[1]) || cuModuleGetFunction(&f, mod, "empty")) return 5;
    const char *nb = std::getenv("AB_BLOCKS");
    const int blocks = nb ? std::atoi(nb) : 101, per_launch = 10000, per_alloc = 1000;
    std::vector<double> lh, lr, ah, ar;
    for (int i = 0; i < 2000; i++) real_launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
    cuCtxSynchronize();
    for (int b = 0; b < blocks; b++) {
        for (int side = 0; side < 2; side++) {
            bool hook = (b + side) % 2 == 0;  // alternate which goes first
            launch_t L = hook ? hook_launch : real_launch;
            double t0 = now_ns();
            for (int i = 0; i < per_launch; i++) L(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr);
            cuCtxSynchronize();
            (hook ? lh : lr).push_back((now_ns() - t0) / per_launch);
            alloc_t A = hook ? hook_alloc : real_alloc;
            free_t F = hook ? hook_free : real_free;
            t0 = now_ns();
            for (int i = 0; i < per_alloc; i++) {
                CUdeviceptr p;
                A(&p, 1 << 20);
                F(p);
            }
            (hook ? ah : ar).push_back((now_ns() - t0) / per_alloc);
        }
    }
    // Each block's hook time over the driver time of the same block: the
    // median of these ratios is robust to drift between blocks.
    std::vector<double> rl, ra;
    for (int b = 0; b < blocks; b++) {
        rl.push_back(lh[b] / lr[b]);
        ra.push_back(ah[b] / ar[b]);
    }
    std::printf("BENCHAB launch %.1f %.1f %+.2f\n", median(lr), median(lh), 100 * (median(rl) - 1));
    std::printf("BENCHAB allocfree %.1f %.1f %+.2f\n", median(ar), median(ah), 100 * (median(ra) - 1));
    return 0;
}
