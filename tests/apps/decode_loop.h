/* Shared by the launch-bound test programs (decode, cupti_user): an
 * LLM-style decode loop on the fake GPU. A request is due every PERIOD_US
 * (request i at t0 + i * PERIOD_US; a late one starts at once rather than
 * shifting the rest); it is TOKENS tokens; a token is KERNELS "sleep"
 * kernels of KERNEL_NS each, launched back to back on one stream with
 * GAP_NS of host busy-wait before each launch after the first (the
 * framework's CPU overhead between kernels), then one cuStreamSynchronize
 * (the `.item()` that reads the token back). Requests stop when SECONDS
 * have passed; latency is measured from the due time to the last token's
 * synchronise and reported as latency.h says.
 * Not a library: header-only, included once per program. */
#ifndef CUSLICE_TEST_DECODE_LOOP_H
#define CUSLICE_TEST_DECODE_LOOP_H

#include "app.h"
#include "latency.h"

struct decode_shape {
    double seconds;
    unsigned long long period_ns, tokens, kernels, kernel_ns, gap_ns;
    /* One kernel this long first, waited for, not counted (0: none). */
    unsigned long long warmup_ns;
};

/* The CPU stays busy (a framework's Python between two launches). */
static void busy_wait(unsigned long long ns) {
    if (ns == 0) return;
    unsigned long long end = now_ns() + ns;
    while (now_ns() < end) {
    }
}

/* Runs the loop on device 0's primary context and prints the report.
 * BEFORE, if not NULL, is called before each request, once it is due, with
 * the time since the first was due (ns) and ARG. Returns 0, or 1 where the
 * report could not be made; a failing CUDA call exits (app.h's CHECK). */
static int decode_run(const struct decode_shape *sh, void (*before)(unsigned long long since_ns, void *arg),
                      void *arg) {
    unsigned long long span = (unsigned long long)(sh->seconds * 1e9);
    unsigned long long due = (span + sh->period_ns - 1) / sh->period_ns;
    unsigned long long *lat = calloc(due, sizeof *lat);
    if (!lat) return 1;
    unsigned long long ns = sh->kernel_ns;
    CUdevice dev;
    CUfunction f;
    CUstream s;
    f = sleep_kernel_on_device0(&dev);
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *params[] = {&ns};
    if (sh->warmup_ns) {
        unsigned long long warm = sh->warmup_ns;
        void *wparams[] = {&warm};
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, wparams, NULL));
        CHECK(cuStreamSynchronize(s));
    }
    unsigned long long t0 = now_ns(), end = t0 + span, served = 0;
    for (unsigned long long i = 0; i < due; i++) {
        unsigned long long d = t0 + i * sh->period_ns;
        if (now_ns() >= end) break;
        sleep_until(d);
        if (before) before(now_ns() - t0, arg);
        for (unsigned long long t = 0; t < sh->tokens; t++) {
            for (unsigned long long k = 0; k < sh->kernels; k++) {
                if (k > 0) busy_wait(sh->gap_ns);
                CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
            }
            CHECK(cuStreamSynchronize(s));
        }
        lat[served++] = now_ns() - d;
    }
    int r = report_latencies(lat, served, due, sh->period_ns);
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(lat);
    return r != 0;
}

#endif
