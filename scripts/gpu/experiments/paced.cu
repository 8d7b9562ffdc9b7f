// A launch-bound loop in C, for the per-kernel cost of recording kernel
// activity (less noisy than a Python decode loop): an empty kernel, then
// GAP_US of host busy-wait (a framework's CPU time per kernel), and a
// cuCtxSynchronize every PER_SYNC launches (a token read back), for SECONDS.
// Prints "PACED <launches per second>".
//   paced KERNELS.ptx SECONDS GAP_US PER_SYNC
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { std::fprintf(stderr, "%s -> %d\n", #x, (int)r_); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: paced KERNELS.ptx SECONDS GAP_US PER_SYNC\n");
        return 2;
    }
    double seconds = std::atof(argv[2]);
    double gap_us = std::atof(argv[3]);
    long per_sync = std::atol(argv[4]);
    CK(cuInit(0));
    CUdevice d;
    CUcontext c;
    CK(cuDeviceGet(&d, 0));
    CK(cuDevicePrimaryCtxRetain(&c, d));
    CK(cuCtxSetCurrent(c));
    CUmodule mod;
    CUfunction f;
    CK(cuModuleLoad(&mod, argv[1]));
    CK(cuModuleGetFunction(&f, mod, "empty"));
    using clk = std::chrono::steady_clock;
    auto us = [](clk::duration x) { return std::chrono::duration<double, std::micro>(x).count(); };
    auto t0 = clk::now();
    long n = 0;
    while (us(clk::now() - t0) < seconds * 1e6) {
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
        auto g = clk::now();
        while (us(clk::now() - g) < gap_us) {
        }
        if (++n % per_sync == 0) CK(cuCtxSynchronize());
    }
    CK(cuCtxSynchronize());
    std::printf("PACED %.1f\n", n / (us(clk::now() - t0) / 1e6));
    return 0;
}
