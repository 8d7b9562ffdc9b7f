// Pass-through overhead loops. Usage: bench MODE N KERNELS.ptx
//   drv-launch   N cuLaunchKernel of an empty kernel (exported symbol path)
//   rt-launch    N <<<1,1>>> launches (cudart -> cuGetProcAddress path)
//   drv-alloc    N cuMemAlloc(1 MiB) + cuMemFree pairs
//   rt-alloc     N cudaMalloc(1 MiB) + cudaFree pairs
// Prints "BENCH MODE ns_per_op".
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

__global__ void k_empty() {}

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { std::fprintf(stderr, "%s -> %d\n", #x, (int)r_); return 1; } } while (0)
#define RK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { std::fprintf(stderr, "%s -> %s\n", #x, cudaGetErrorString(e_)); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const char *mode = argv[1];
    long n = std::atol(argv[2]);
    RK(cudaFree(0));  // initialise the runtime and the primary context
    CUmodule mod;
    CUfunction f;
    CK(cuModuleLoad(&mod, argv[3]));
    CK(cuModuleGetFunction(&f, mod, "empty"));
    auto now = [] { return std::chrono::steady_clock::now(); };
    double ns = 0;
    if (!std::strcmp(mode, "drv-launch")) {
        for (int i = 0; i < 2000; i++) CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
        CK(cuCtxSynchronize());
        auto t0 = now();
        for (long i = 0; i < n; i++) CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr));
        CK(cuCtxSynchronize());
        ns = std::chrono::duration<double, std::nano>(now() - t0).count() / n;
    } else if (!std::strcmp(mode, "rt-launch")) {
        for (int i = 0; i < 2000; i++) k_empty<<<1, 1>>>();
        RK(cudaDeviceSynchronize());
        auto t0 = now();
        for (long i = 0; i < n; i++) k_empty<<<1, 1>>>();
        RK(cudaDeviceSynchronize());
        ns = std::chrono::duration<double, std::nano>(now() - t0).count() / n;
    } else if (!std::strcmp(mode, "drv-alloc")) {
        auto t0 = now();
        for (long i = 0; i < n; i++) {
            CUdeviceptr p;
            CK(cuMemAlloc(&p, 1 << 20));
            CK(cuMemFree(p));
        }
        ns = std::chrono::duration<double, std::nano>(now() - t0).count() / n;
    } else if (!std::strcmp(mode, "rt-alloc")) {
        auto t0 = now();
        for (long i = 0; i < n; i++) {
            void *p;
            RK(cudaMalloc(&p, 1 << 20));
            RK(cudaFree(p));
        }
        ns = std::chrono::duration<double, std::nano>(now() - t0).count() / n;
    } else {
        return 2;
    }
    std::printf("BENCH %s %.1f\n", mode, ns);
    return 0;
}
