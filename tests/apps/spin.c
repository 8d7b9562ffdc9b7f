/* A compute-bound tenant on the fake GPU: launches "sleep" kernels of
 * KERNEL_NS back to back for SECONDS, synchronising every BATCH launches
 * (as real programs do: a real GPU queue blocks at about a thousand
 * launches). Prints a progress line every 100 ms:
 *   P <ms since start> <GPU ms of its kernels completed>
 * and at the end: R launched=N busy_ms=B wall_ms=W
 *   spin SECONDS KERNEL_NS [BATCH] [graph] */
#include "app.h"

#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    double seconds = atof(argv[1]);
    unsigned long long ns = strtoull(argv[2], NULL, 10);
    int batch = argc > 3 ? atoi(argv[3]) : 16;
    int use_graph = argc > 4 && !strcmp(argv[4], "graph");
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUstream s;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "fake-image"));
    CHECK(cuModuleGetFunction(&f, mod, "sleep_kernel"));
    CHECK(cuStreamCreate(&s, 0));
    void *params[] = {&ns};
    CUgraphExec exec = NULL;
    if (use_graph) {
        /* One graph of one kernel, replayed like torch.cuda.CUDAGraph. */
        CUgraph g;
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        CHECK(cuStreamEndCapture(s, &g));
        CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
    }
    double t0 = now_ms(), next = t0 + 100;
    unsigned long long launched = 0, done = 0;
    for (;;) {
        for (int i = 0; i < batch; i++) {
            if (use_graph) CHECK(cuGraphLaunch(exec, s));
            else CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        }
        launched += batch;
        CHECK(cuStreamSynchronize(s));
        done = launched;
        double t = now_ms();
        if (t >= next) {
            printf("P %.1f %.3f\n", t - t0, done * (double)ns / 1e6);
            next += 100;
        }
        if (t - t0 >= seconds * 1e3) break;
    }
    printf("R launched=%llu busy_ms=%.3f wall_ms=%.3f\n", launched, launched * (double)ns / 1e6, now_ms() - t0);
    return 0;
}
