/* Soak worker (tests/soak.rs): random allocations, frees, launches and
 * memory queries for a while, in this process and in FORKS forked children
 * (each initialises CUDA afresh), then an exit of the chosen kind.
 *   soak_mix SEED MS MAX_CHUNK FORKS EXIT KERNEL_NS QUOTA
 * MAX_CHUNK: largest allocation (bytes); KERNEL_NS: longest "sleep" kernel
 * (0: none launched); QUOTA: the container's quota in bytes (what
 * cuMemGetInfo must report as the total).
 * EXIT: 0 free everything and return from main; 1 return from main leaving
 * the allocations to the driver; 2 _exit(0) with allocations live (no exit
 * handlers: the shim's slot is reclaimed as a dead process's).
 * Exit status: 0 done, 3 the context was refused (the container's quota is
 * full: expected under load), 1 anything unexpected (message on stderr).
 * A child that ends with status 3 or is SIGKILLed (the soak kills some) is
 * fine with the parent.
 * Prints "R ok allocs=A refused=X launches=L" per process that finished. */
#include "app.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { LIVE = 32 };

static unsigned long long max_chunk, kernel_ns, quota;
static int exit_mode;

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define FAIL(...)                                             \
    do {                                                      \
        fprintf(stderr, "FAIL pid %d: ", (int)getpid());      \
        fprintf(stderr, __VA_ARGS__);                         \
        fprintf(stderr, "\n");                                \
        fflush(stderr);                                       \
        _exit(1);                                             \
    } while (0)

/* Initialises CUDA in this process; returns 0, or 3 if the context does not
 * fit in the quota. */
static int setup(CUfunction *fn) {
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUresult r;
    if ((r = cuInit(0)) != CUDA_SUCCESS) FAIL("cuInit -> %d", (int)r);
    if ((r = cuDeviceGet(&dev, 0)) != CUDA_SUCCESS) FAIL("cuDeviceGet -> %d", (int)r);
    r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return 3;
    if (r != CUDA_SUCCESS) FAIL("cuDevicePrimaryCtxRetain -> %d", (int)r);
    if ((r = cuCtxSetCurrent(ctx)) != CUDA_SUCCESS) FAIL("cuCtxSetCurrent -> %d", (int)r);
    if ((r = cuModuleLoadData(&mod, "fake-image")) != CUDA_SUCCESS) FAIL("cuModuleLoadData -> %d", (int)r);
    if ((r = cuModuleGetFunction(fn, mod, "sleep_kernel")) != CUDA_SUCCESS)
        FAIL("cuModuleGetFunction -> %d", (int)r);
    return 0;
}

/* The random work, then the exit; never returns. */
static void work(unsigned seed, double ms, CUfunction fn) {
    CUdeviceptr live[LIVE] = {0};
    unsigned long long allocs = 0, refused = 0, launches = 0;
    double end = now_ms() + ms;
    CUresult r;
    do {
        int k = rand_r(&seed) % LIVE;
        switch (rand_r(&seed) % 10) {
        case 0: case 1: case 2: case 3:
            if (!live[k]) {
                size_t size = 1 + (size_t)(((unsigned long long)rand_r(&seed) << 16 ^ rand_r(&seed)) % max_chunk);
                r = cuMemAlloc_v2(&live[k], size);
                if (r == CUDA_SUCCESS) allocs++;
                else if (r == CUDA_ERROR_OUT_OF_MEMORY) { live[k] = 0; refused++; }
                else FAIL("cuMemAlloc_v2(%zu) -> %d", size, (int)r);
            }
            break;
        case 4: case 5:
            if (live[k]) {
                if ((r = cuMemFree_v2(live[k])) != CUDA_SUCCESS) FAIL("cuMemFree_v2 -> %d", (int)r);
                live[k] = 0;
            }
            break;
        case 6: case 7:
            if (kernel_ns) {
                unsigned long long ns = ((unsigned long long)rand_r(&seed) << 16 ^ rand_r(&seed)) % (kernel_ns + 1);
                void *params[] = {&ns};
                if ((r = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, params, NULL)) != CUDA_SUCCESS)
                    FAIL("cuLaunchKernel -> %d", (int)r);
                launches++;
                if (rand_r(&seed) % 4 == 0 && (r = cuCtxSynchronize()) != CUDA_SUCCESS)
                    FAIL("cuCtxSynchronize -> %d", (int)r);
            }
            break;
        case 8: {
            size_t free_b = 0, total = 0;
            if ((r = cuMemGetInfo_v2(&free_b, &total)) != CUDA_SUCCESS) FAIL("cuMemGetInfo_v2 -> %d", (int)r);
            if (total != quota || free_b > total)
                FAIL("cuMemGetInfo_v2: free=%zu total=%zu, quota %llu", free_b, total, quota);
            break;
        }
        default:
            usleep((useconds_t)(rand_r(&seed) % 2000));
        }
    } while (now_ms() < end);
    if (exit_mode == 0) {
        for (int i = 0; i < LIVE; i++)
            if (live[i] && (r = cuMemFree_v2(live[i])) != CUDA_SUCCESS) FAIL("cuMemFree_v2 -> %d", (int)r);
        if ((r = cuCtxSynchronize()) != CUDA_SUCCESS) FAIL("cuCtxSynchronize -> %d", (int)r);
    }
    printf("R ok pid=%d allocs=%llu refused=%llu launches=%llu\n", (int)getpid(), allocs, refused, launches);
    fflush(stdout);
    if (exit_mode == 2) _exit(0);
    exit(0);
}

int main(int argc, char **argv) {
    if (argc < 8) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    unsigned seed = (unsigned)strtoul(argv[1], NULL, 10);
    double ms = atof(argv[2]);
    max_chunk = strtoull(argv[3], NULL, 10);
    int forks = atoi(argv[4]);
    exit_mode = atoi(argv[5]);
    kernel_ns = strtoull(argv[6], NULL, 10);
    quota = strtoull(argv[7], NULL, 10);
    if (max_chunk == 0) max_chunk = 1;
    CUfunction fn;
    if (setup(&fn) == 3) {
        printf("R refused\n");
        return 3;
    }
    pid_t kids[16];
    int n = 0;
    for (int i = 0; i < forks && i < 16; i++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid < 0) FAIL("fork: %s", strerror(errno));
        if (pid == 0) {
            CUfunction cfn;
            if (setup(&cfn) == 3) {
                printf("R refused child\n");
                fflush(stdout);
                _exit(3);
            }
            work(seed * 31u + (unsigned)i + 1u, ms, cfn);
        }
        kids[n++] = pid;
    }
    /* The parent works too, then collects its children (its own exit comes
     * after theirs, so a finished process group is a finished worker). */
    if (n == 0) work(seed, ms, fn);
    unsigned pseed = seed;
    double end = now_ms() + ms;
    CUdeviceptr p = 0;
    while (now_ms() < end) {
        if (!p) {
            CUresult r = cuMemAlloc_v2(&p, 1 + rand_r(&pseed) % max_chunk);
            if (r == CUDA_ERROR_OUT_OF_MEMORY) p = 0;
            else if (r != CUDA_SUCCESS) FAIL("parent cuMemAlloc_v2 -> %d", (int)r);
        } else {
            if (cuMemFree_v2(p) != CUDA_SUCCESS) FAIL("parent cuMemFree_v2");
            p = 0;
        }
        usleep(1000 + rand_r(&pseed) % 4000);
    }
    int killed = 0;
    for (int i = 0; i < n; i++) {
        int st = 0;
        while (waitpid(kids[i], &st, 0) < 0 && errno == EINTR) {
        }
        if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
            killed++;
        else if (!WIFEXITED(st) || (WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 3))
            FAIL("child %d ended with status 0x%x", (int)kids[i], st);
    }
    if (p && exit_mode == 0 && cuMemFree_v2(p) != CUDA_SUCCESS) FAIL("parent cuMemFree_v2");
    printf("R ok parent children=%d killed=%d\n", n, killed);
    fflush(stdout);
    if (exit_mode == 2) _exit(0);
    return 0;
}
