/* A latency-sensitive tenant on the fake GPU: one "sleep" kernel of
 * KERNEL_NS on its own stream every PERIOD_US, each waited for with
 * cuStreamSynchronize. The schedule is fixed (request i is due at
 * t0 + i * PERIOD_US, and a late request is launched at once rather than
 * shifting the rest), and latency is measured from the due time, so time
 * spent waiting for an earlier request counts too. Requests stop when
 * SECONDS have passed. Prints
 *   L <p50_us> <p99_us> <max_us> <served> <due>
 * (latency percentiles of the served requests; due = requests whose due
 * time fell within SECONDS, so served < due means it fell behind).
 * WARMUP_NS, if given: before the first request, one kernel that long,
 * waited for (what a service's start does: a context, libraries, a first
 * large request), not counted.
 *   ping SECONDS PERIOD_US KERNEL_NS [WARMUP_NS] */
#include "app.h"
#include "latency.h"

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: ping SECONDS PERIOD_US KERNEL_NS [WARMUP_NS]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    double seconds = atof(argv[1]);
    unsigned long long period = strtoull(argv[2], NULL, 10) * 1000ull;
    unsigned long long ns = strtoull(argv[3], NULL, 10);
    if (seconds <= 0 || period == 0) {
        fprintf(stderr, "ping: SECONDS and PERIOD_US must be positive\n");
        return 2;
    }
    unsigned long long span = (unsigned long long)(seconds * 1e9);
    unsigned long long due = (span + period - 1) / period;
    unsigned long long *lat = calloc(due, sizeof *lat);
    if (!lat) return 1;
    CUdevice dev;
    CUfunction f;
    CUstream s;
    f = sleep_kernel_on_device0(&dev);
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *params[] = {&ns};
    if (argc == 5) {
        unsigned long long warm = strtoull(argv[4], NULL, 10);
        void *wparams[] = {&warm};
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, wparams, NULL));
        CHECK(cuStreamSynchronize(s));
    }
    unsigned long long t0 = now_ns(), end = t0 + span, served = 0;
    for (unsigned long long i = 0; i < due; i++) {
        unsigned long long d = t0 + i * period;
        if (now_ns() >= end) break;
        sleep_until(d);
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
        CHECK(cuStreamSynchronize(s));
        lat[served++] = now_ns() - d;
    }
    if (report_latencies(lat, served, due, period)) return 1;
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(lat);
    return 0;
}
