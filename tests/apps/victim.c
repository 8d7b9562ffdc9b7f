/* A tenant's process under attack (tests/hostile.rs): for SECONDS it
 * allocates and frees CHUNK-byte blocks at random (up to 8 at once, so that
 * a tight quota binds), launches two KERNEL_NS sleep kernels and
 * synchronises each round, and after every operation reads its fake GPU's
 * device-wide usage (cuFakeUsedBytes: the ground truth, every process
 * sharing FAKE_CUDA_STATE) and compares it with QUOTA. A failed call is
 * counted, never fatal (only cuInit and the set-up are CHECKed). It stops
 * after SECONDS, or at the end of the round in which SIGUSR1 arrives.
 *   victim SECONDS CHUNK QUOTA KERNEL_NS
 * Every ~200 ms: "P <CLOCK_MONOTONIC ms> <rounds> <launches>".
 * At the end: "R victim violations=V errors=E" and
 *             "D rounds=N grants=G refusals=F launches=L max_used=M". */
#include "app.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_usr1(int sig) {
    (void)sig;
    stop = 1;
}

static double mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static unsigned long long quota, max_used;
static int violations, errors;

static void check_truth(void) {
    unsigned long long used = 0;
    if (cuFakeUsedBytes(0, &used) != CUDA_SUCCESS) {
        errors++;
        return;
    }
    if (used > max_used) max_used = used;
    if (used > quota) violations++;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    double seconds = atof(argv[1]);
    size_t chunk = strtoull(argv[2], NULL, 10);
    quota = strtoull(argv[3], NULL, 10);
    unsigned long long ns = strtoull(argv[4], NULL, 10);
    CUdevice dev;
    CUfunction f;
    CUstream s;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    f = sleep_kernel_on_device0(&dev);
    CHECK(cuStreamCreate(&s, 0));
    void *params[] = {&ns};
    enum { HELD = 8 };
    CUdeviceptr held[HELD] = {0};
    unsigned seed = (unsigned)getpid();
    unsigned long long rounds = 0, grants = 0, refusals = 0, launches = 0;
    double t0 = mono_ms(), next = t0;
    check_truth();
    while (!stop && mono_ms() - t0 < seconds * 1e3) {
        int k = rand_r(&seed) % HELD;
        if (held[k]) {
            if (cuMemFree_v2(held[k]) != CUDA_SUCCESS) errors++;
            held[k] = 0;
        } else {
            CUresult r = cuMemAlloc_v2(&held[k], chunk);
            if (r == CUDA_SUCCESS) grants++;
            else {
                held[k] = 0;
                if (r == CUDA_ERROR_OUT_OF_MEMORY) refusals++;
                else errors++;
            }
        }
        check_truth();
        for (int i = 0; i < 2; i++) {
            if (cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL) == CUDA_SUCCESS) launches++;
            else errors++;
        }
        if (cuStreamSynchronize(s) != CUDA_SUCCESS) errors++;
        check_truth();
        rounds++;
        double t = mono_ms();
        if (t >= next) {
            printf("P %.0f %llu %llu\n", t, rounds, launches);
            next = t + 200;
        }
    }
    for (int k = 0; k < HELD; k++)
        if (held[k] && cuMemFree_v2(held[k]) != CUDA_SUCCESS) errors++;
    check_truth();
    printf("R victim violations=%d errors=%d\n", violations, errors);
    printf("D rounds=%llu grants=%llu refusals=%llu launches=%llu max_used=%llu\n", rounds, grants, refusals,
           launches, max_used);
    return 0;
}
