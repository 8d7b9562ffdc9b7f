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

#include <errno.h>
#include <string.h>
#include <time.h>

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static void sleep_until(unsigned long long t) {
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static int cmp(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

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
    /* The requests due from 250 ms on (a tenant's first windows left out):
     *   T <p50_us> <p99_us> <max_us> <count> */
    unsigned long long skip = 250000000ull / period, tn = served > skip ? served - skip : 0;
    if (tn) {
        unsigned long long *tail = calloc(tn, sizeof *tail);
        if (!tail) return 1;
        memcpy(tail, lat + skip, tn * sizeof *tail);
        qsort(tail, tn, sizeof *tail, cmp);
        printf("T %llu %llu %llu %llu\n", tail[tn / 2] / 1000, tail[(tn * 99 + 99) / 100 - 1] / 1000,
               tail[tn - 1] / 1000, tn);
        free(tail);
    }
    unsigned long long p50 = 0, p99 = 0, max = 0;
    if (served) {
        qsort(lat, served, sizeof *lat, cmp);
        p50 = lat[served / 2];
        p99 = lat[(served * 99 + 99) / 100 - 1];
        max = lat[served - 1];
    }
    printf("L %llu %llu %llu %llu %llu\n", p50 / 1000, p99 / 1000, max / 1000, served, due);
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(lat);
    return 0;
}
