/* A program that profiles itself with CUPTI's activity API, as PyTorch's
 * profiler does (linked against libcupti; registers its own buffer
 * callbacks, records kernels, flushes). Launches N kernels of KERNEL_NS,
 * waits, flushes, and prints
 *   R records <kernel records its callbacks received> <sum of their durations, ns>
 * so that a test can check that cuslice's GPU time meter steps aside and the
 * program's own profiling still gets every record.
 *   profiled N KERNEL_NS */
#include "app.h"
#include "cuslice_cupti.h"

#include <stdint.h>

static unsigned long long records, sum_ns;

static void requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    static uint8_t buf[8][64 * 1024] __attribute__((aligned(8)));
    static int next;
    *buffer = buf[next++ % 8];
    *size = sizeof buf[0];
    *max_records = 0;
}

static void completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
            const struct cuslice_cupti_kernel_record *k = (const struct cuslice_cupti_kernel_record *)r;
            records++;
            sum_ns += k->end - k->start;
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: profiled N KERNEL_NS\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = atoi(argv[1]);
    unsigned long long ns = strtoull(argv[2], NULL, 10);
    CUdevice dev;
    CUfunction f;
    f = sleep_kernel_on_device0(&dev);
    if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "FAIL cupti\n");
        return 1;
    }
    void *params[] = {&ns};
    for (int i = 0; i < n; i++)
        CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    cuptiActivityFlushAll(0);
    printf("R records %llu %llu\n", records, sum_ns);
    return 0;
}
