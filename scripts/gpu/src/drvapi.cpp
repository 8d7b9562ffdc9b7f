// A driver-API program: primary context, module from PTX, cuMemAlloc,
// cuLaunchKernel, copies. Prints a checksum that must not change under the
// shim. Usage: drvapi KERNELS.ptx
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                            \
    do {                                                                    \
        CUresult r_ = (x);                                                  \
        if (r_ != CUDA_SUCCESS) {                                           \
            const char *s = nullptr;                                        \
            cuGetErrorString(r_, &s);                                       \
            std::fprintf(stderr, "%s:%d %s -> %d %s\n", __FILE__, __LINE__, \
                         #x, (int)r_, s ? s : "?");                         \
            std::exit(1);                                                   \
        }                                                                   \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    CUdevice dev;
    CUcontext ctx;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    size_t free_b = 0, total_b = 0;
    CHECK(cuMemGetInfo(&free_b, &total_b));
    CUmodule mod;
    CUfunction f;
    CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&f, mod, "saxpy"));
    int n = 1 << 20;
    std::vector<float> x(n), y(n);
    for (int i = 0; i < n; i++) { x[i] = (float)(i % 1000) * 0.001f; y[i] = 1.0f; }
    CUdeviceptr dx, dy;
    CHECK(cuMemAlloc(&dx, n * sizeof(float)));
    CHECK(cuMemAlloc(&dy, n * sizeof(float)));
    CHECK(cuMemcpyHtoD(dx, x.data(), n * sizeof(float)));
    CHECK(cuMemcpyHtoD(dy, y.data(), n * sizeof(float)));
    float a = 2.0f;
    void *params[] = {&n, &a, &dx, &dy};
    for (int rep = 0; rep < 10; rep++)
        CHECK(cuLaunchKernel(f, (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr, params, nullptr));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(y.data(), dy, n * sizeof(float)));
    double sum = 0;
    for (float v : y) sum += v;
    CHECK(cuMemFree(dx));
    CHECK(cuMemFree(dy));
    std::printf("RESULT drvapi checksum=%.6e total_gib=%.3f\n", sum, total_b / 1073741824.0);
    return 0;
}
