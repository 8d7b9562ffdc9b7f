/* A launch-bound tenant on the fake GPU: an LLM-style decode loop. A
 * request is due every PERIOD_US; it is TOKENS tokens; a token is KERNELS
 * "sleep" kernels of KERNEL_NS each, launched back to back on one stream
 * with GAP_NS of host busy-wait before each launch after the first (the
 * framework's CPU overhead between kernels), then one cuStreamSynchronize
 * (the `.item()` that reads the token back). So the GPU is idle between a
 * token's kernels whenever GAP_NS > KERNEL_NS, and the tenant's wall time
 * in flight overstates its GPU time.
 *
 * As ping.c: the schedule is fixed (request i is due at t0 + i * PERIOD_US;
 * a late request starts at once rather than shifting the rest), latency is
 * measured from the due time to the last token's synchronise, requests stop
 * when SECONDS have passed, and it prints
 *   L <p50_us> <p99_us> <max_us> <served> <due>
 * preceded by "T <p50_us> <p99_us> <max_us> <count>" over the requests due
 * from 250 ms on. WARMUP_NS, if given: one kernel that long first, waited
 * for, not counted.
 *   decode SECONDS PERIOD_US TOKENS KERNELS KERNEL_NS GAP_NS [WARMUP_NS] */
#include "app.h"
#include "latency.h"

/* The CPU stays busy (a framework's Python between two launches). */
static void busy_wait(unsigned long long ns) {
    if (ns == 0) return;
    unsigned long long end = now_ns() + ns;
    while (now_ns() < end) {
    }
}

static unsigned long long arg(const char *s, const char *what) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0') {
        fprintf(stderr, "decode: %s: \"%s\" is not a number\n", what, s);
        exit(2);
    }
    return v;
}

int main(int argc, char **argv) {
    if (argc != 7 && argc != 8) {
        fprintf(stderr, "usage: decode SECONDS PERIOD_US TOKENS KERNELS KERNEL_NS GAP_NS [WARMUP_NS]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    double seconds = atof(argv[1]);
    unsigned long long period = arg(argv[2], "PERIOD_US") * 1000ull;
    unsigned long long tokens = arg(argv[3], "TOKENS");
    unsigned long long kernels = arg(argv[4], "KERNELS");
    unsigned long long ns = arg(argv[5], "KERNEL_NS");
    unsigned long long gap = arg(argv[6], "GAP_NS");
    if (seconds <= 0 || period == 0 || tokens == 0 || kernels == 0) {
        fprintf(stderr, "decode: SECONDS, PERIOD_US, TOKENS and KERNELS must be positive\n");
        return 2;
    }
    unsigned long long span = (unsigned long long)(seconds * 1e9);
    unsigned long long due = (span + period - 1) / period;
    unsigned long long *lat = calloc(due, sizeof *lat);
    if (!lat) return 1;
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
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *params[] = {&ns};
    if (argc == 8) {
        unsigned long long warm = arg(argv[7], "WARMUP_NS");
        void *wparams[] = {&warm};
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, wparams, NULL));
        CHECK(cuStreamSynchronize(s));
    }
    unsigned long long t0 = now_ns(), end = t0 + span, served = 0;
    for (unsigned long long i = 0; i < due; i++) {
        unsigned long long d = t0 + i * period;
        if (now_ns() >= end) break;
        sleep_until(d);
        for (unsigned long long t = 0; t < tokens; t++) {
            for (unsigned long long k = 0; k < kernels; k++) {
                if (k > 0) busy_wait(gap);
                CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
            }
            CHECK(cuStreamSynchronize(s));
        }
        lat[served++] = now_ns() - d;
    }
    if (report_latencies(lat, served, due, period)) return 1;
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(lat);
    return 0;
}
