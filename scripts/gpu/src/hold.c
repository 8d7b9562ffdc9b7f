/* A GPU process that holds memory and does nothing else, for the host
 * watchdog's cost measurement (scripts/gpu/watch-cost.sh): creates a
 * context on device 0, allocates MIB MiB, prints "HOLD <pid> <bytes>",
 * then sleeps until killed (at most SECONDS).
 *   hold MIB SECONDS
 * Built on the GPU host against its driver:
 *   gcc -O2 -I/usr/local/cuda/include hold.c -o hold -lcuda */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CHECK(call)                                                          \
    do {                                                                     \
        CUresult r_ = (call);                                                \
        if (r_ != CUDA_SUCCESS) {                                            \
            fprintf(stderr, "hold: %s failed: %d\n", #call, (int)r_);       \
            return 1;                                                        \
        }                                                                    \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: hold MIB SECONDS\n");
        return 2;
    }
    size_t bytes = (size_t)strtoull(argv[1], NULL, 10) << 20;
    unsigned seconds = (unsigned)strtoul(argv[2], NULL, 10);
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuMemAlloc(&p, bytes));
    printf("HOLD %d %zu\n", (int)getpid(), bytes);
    fflush(stdout);
    sleep(seconds);
    return 0;
}
