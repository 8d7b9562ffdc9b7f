/* A launch-bound tenant on the fake GPU: an LLM-style decode loop. A
 * request is due every PERIOD_US; it is TOKENS tokens; a token is KERNELS
 * "sleep" kernels of KERNEL_NS each, launched back to back on one stream
 * with GAP_NS of host busy-wait before each launch after the first (the
 * framework's CPU overhead between kernels), then one cuStreamSynchronize
 * (the `.item()` that reads the token back). So the GPU is idle between a
 * token's kernels whenever GAP_NS > KERNEL_NS, and the tenant's wall time
 * in flight overstates its GPU time.
 *
 * As ping.c (the loop is decode_loop.h's): the schedule is fixed (request i
 * is due at t0 + i * PERIOD_US; a late request starts at once rather than
 * shifting the rest), latency is measured from the due time to the last
 * token's synchronise, requests stop when SECONDS have passed, and it
 * prints
 *   L <p50_us> <p99_us> <max_us> <served> <due>
 * preceded by "T <p50_us> <p99_us> <max_us> <count>" over the requests due
 * from 250 ms on. WARMUP_NS, if given: one kernel that long first, waited
 * for, not counted.
 *   decode SECONDS PERIOD_US TOKENS KERNELS KERNEL_NS GAP_NS [WARMUP_NS]
 * With DECODE_THEN_BATCH_S=S in its environment, the same process then
 * turns into a batch job for S seconds (a decode server that starts
 * training): 5 ms kernels back to back, synchronised every 4, after a line
 *   BATCH_AT <CLOCK_MONOTONIC ms>
 * (the clock of the shim's debug lines).
 * With DECODE_GRAPH=1, the process first captures a graph of one kernel
 * and replays it once (a server that uses CUDA graphs somewhere). */
#include "decode_loop.h"

/* The batch phase: its own stream on device 0's primary context. */
static void batch(double seconds) {
    CUdevice dev;
    CUstream s;
    unsigned long long ns = 5000000;
    void *params[] = {&ns};
    CUfunction f = sleep_kernel_on_device0(&dev);
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    unsigned long long t0 = now_ns(), end = t0 + (unsigned long long)(seconds * 1e9);
    printf("BATCH_AT %.3f\n", t0 / 1e6);
    while (now_ns() < end) {
        for (int i = 0; i < 4; i++) CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        CHECK(cuStreamSynchronize(s));
    }
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
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
    struct decode_shape sh = {
        .seconds = atof(argv[1]),
        .period_ns = arg(argv[2], "PERIOD_US") * 1000ull,
        .tokens = arg(argv[3], "TOKENS"),
        .kernels = arg(argv[4], "KERNELS"),
        .kernel_ns = arg(argv[5], "KERNEL_NS"),
        .gap_ns = arg(argv[6], "GAP_NS"),
        .warmup_ns = argc == 8 ? arg(argv[7], "WARMUP_NS") : 0,
    };
    if (sh.seconds <= 0 || sh.period_ns == 0 || sh.tokens == 0 || sh.kernels == 0) {
        fprintf(stderr, "decode: SECONDS, PERIOD_US, TOKENS and KERNELS must be positive\n");
        return 2;
    }
    const char *then = getenv("DECODE_THEN_BATCH_S");
    double batch_s = then ? atof(then) : 0;
    if (then && batch_s <= 0) {
        fprintf(stderr, "decode: DECODE_THEN_BATCH_S=\"%s\" is not a positive number of seconds\n", then);
        return 2;
    }
    const char *graph = getenv("DECODE_GRAPH");
    if (graph && strcmp(graph, "1") == 0) {
        CUdevice dev;
        CUstream s;
        CUgraph g;
        CUgraphExec exec;
        unsigned long long ns = sh.kernel_ns;
        void *params[] = {&ns};
        CUfunction f = sleep_kernel_on_device0(&dev);
        CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CHECK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        CHECK(cuStreamEndCapture(s, &g));
        CHECK(cuGraphInstantiateWithFlags(&exec, g, 0));
        CHECK(cuGraphLaunch(exec, s));
        CHECK(cuStreamSynchronize(s));
        CHECK(cuStreamDestroy(s));
        CHECK(cuDevicePrimaryCtxRelease(dev));
    }
    int r = decode_run(&sh, NULL, NULL);
    if (r == 0 && batch_s > 0) batch(batch_s);
    return r;
}
