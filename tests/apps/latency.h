/* Shared by the request-driven test programs (ping, decode): the clock, a
 * sleep to an absolute time, and the latency report
 *   T <p50_us> <p99_us> <max_us> <count>   (requests due from 250 ms on)
 *   L <p50_us> <p99_us> <max_us> <served> <due>
 * Not a library: header-only helpers, included once per program. */
#ifndef CUSLICE_TEST_LATENCY_H
#define CUSLICE_TEST_LATENCY_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
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

static int cmp_u64(const void *a, const void *b) {
    unsigned long long x = *(const unsigned long long *)a, y = *(const unsigned long long *)b;
    return x < y ? -1 : x > y;
}

/* Prints the T and L lines for `served` latencies (ns; sorted in place) of
 * requests due every `period` ns, `due` of them in the window. Returns 0,
 * or 1 when out of memory. */
static int report_latencies(unsigned long long *lat, unsigned long long served,
                            unsigned long long due, unsigned long long period) {
    /* The requests due from 250 ms on (a tenant's first windows left out). */
    unsigned long long skip = 250000000ull / period, tn = served > skip ? served - skip : 0;
    if (tn) {
        unsigned long long *tail = calloc(tn, sizeof *tail);
        if (!tail) return 1;
        memcpy(tail, lat + skip, tn * sizeof *tail);
        qsort(tail, tn, sizeof *tail, cmp_u64);
        printf("T %llu %llu %llu %llu\n", tail[tn / 2] / 1000, tail[(tn * 99 + 99) / 100 - 1] / 1000,
               tail[tn - 1] / 1000, tn);
        free(tail);
    }
    unsigned long long p50 = 0, p99 = 0, max = 0;
    if (served) {
        qsort(lat, served, sizeof *lat, cmp_u64);
        p50 = lat[served / 2];
        p99 = lat[(served * 99 + 99) / 100 - 1];
        max = lat[served - 1];
    }
    printf("L %llu %llu %llu %llu %llu\n", p50 / 1000, p99 / 1000, max / 1000, served, due);
    return 0;
}

#endif
