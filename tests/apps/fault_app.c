/* Programs of the fault tests (tests/faults.rs), one per subcommand. Times
 * are CLOCK_MONOTONIC ns, the clock of the shim's GPU segment, so that the
 * test can place a program's progress against the moments it killed others.
 *
 *   worker SECONDS KERNEL_NS ALLOC_THREADS [STOPFILE]
 *       the main thread launches KERNEL_NS "sleep" kernels (4 per stream
 *       synchronisation) for SECONDS or until STOPFILE exists, printing
 *       "P <ns> <kernels done>" every 50 ms; ALLOC_THREADS threads allocate,
 *       free and launch empty kernels meanwhile (refusals counted, not
 *       errors). Ends with "R ok|errors launched=N allocs=A refused=X errors=E".
 *   alloc THREADS MAXCHUNK STOPFILE SECONDS
 *       THREADS threads allocate (64 KiB .. MAXCHUNK) and free at random as
 *       fast as they can until STOPFILE exists (or SECONDS pass); a context
 *       refused under the full quota is retried; "P <ns> <grants>
 *       <refusals>" every 20 ms; frees everything; "R ok|errors grants=G
 *       refusals=X errors=E".
 *   watch once | watch poll STOPFILE [LIMIT]      (run without the shim)
 *       the fake driver's ground truth: its device-wide usage once, or its
 *       maximum over many samples until STOPFILE exists, then what its live
 *       processes hold: "R max=M samples=S last=L held=H episodes=E"; each
 *       stretch of samples above LIMIT: "O <from ns> <to ns> <max bytes>".
 *   fork exec|fork|orphan
 *       allocates 8 MiB and launches, then forks. exec: the child execs
 *       "fault_app child"; fork: the child runs the same without exec;
 *       both print "R child ready pid=C", wait for one byte on stdin and
 *       exit(0) holding 16 MiB. The parent prints "R child status=S", waits
 *       for one more byte, launches, allocates, frees, "R parent done".
 *       orphan: the child never uses CUDA: "R orphan pid=C", then it waits
 *       for EOF on stdin; the parent prints "R parent waiting" and sleeps
 *       until killed.
 *   threads WAVES PER_WAVE
 *       4 threads allocate, launch and free throughout, while WAVES waves
 *       of PER_WAVE short-lived threads allocate and launch, and exit: a
 *       third free everything, a third pthread_exit holding all they
 *       allocated, a third return holding half. At the end
 *       "R ok|errors threads=N leaked=L used=U errors=E refused=X", with L
 *       what the driver takes for the allocations they kept (whole pages of
 *       cuMemGetAllocationGranularity from one page up), U what
 *       cuMemGetInfo says is in use (the container's usage under the
 *       shim), and exit(0) with the leaked allocations live.
 *   exitrace THREADS MS
 *       THREADS threads allocate (keeping a quarter), launch and free
 *       without pause; after MS ms the main thread prints "R exiting
 *       allocs=N errors=E" and calls exit(0) while they are inside driver
 *       calls.
 *   gate KERNEL_NS
 *       a thread launches KERNEL_NS kernels (synchronising every 4) for
 *       ever; the main thread prints "R started pid=P", and on a byte (or
 *       EOF) on stdin prints "R exiting launched=N" and calls exit(0). */
#include "app.h"
#include "fake_common.h"

#include <errno.h>
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static unsigned long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

static CUcontext ctx;
static CUfunction f_sleep, f_empty;

/* Under a full quota the context itself (charged to the quota) is refused:
 * with `patient`, retry for up to 20 s, as the others free memory. */
static void setup_cuda_retry(int patient) {
    CUdevice dev;
    CUmodule mod;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CUresult r;
    for (int i = 0; (r = cuDevicePrimaryCtxRetain(&ctx, dev)) == CUDA_ERROR_OUT_OF_MEMORY && patient && i < 20000; i++)
        usleep(1000);
    CHECK(r);
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, "fake-image"));
    CHECK(cuModuleGetFunction(&f_sleep, mod, "sleep_kernel"));
    CHECK(cuModuleGetFunction(&f_empty, mod, "empty"));
}

static void setup_cuda(void) { setup_cuda_retry(0); }

static CUresult launch(CUfunction f, CUstream s, unsigned long long ns) {
    void *params[] = {&ns};
    return cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
}

static int exists(const char *path) { return path && strcmp(path, "-") && access(path, F_OK) == 0; }

static int stop_flag;
static unsigned long long n_alloc, n_refused, n_errors, n_launch;

#define ADD(v, n) __atomic_add_fetch(&(v), (n), __ATOMIC_RELAXED)
#define GET(v) __atomic_load_n(&(v), __ATOMIC_RELAXED)
#define STOPPED() __atomic_load_n(&stop_flag, __ATOMIC_ACQUIRE)

static void count(CUresult r) {
    if (r == CUDA_SUCCESS) ADD(n_alloc, 1);
    else if (r == CUDA_ERROR_OUT_OF_MEMORY) ADD(n_refused, 1);
    else ADD(n_errors, 1);
}

/* ---- worker -------------------------------------------------------------- */

static void *worker_alloc(void *arg) {
    unsigned seed = (unsigned)getpid() * 31u + (unsigned)(size_t)arg;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ADD(n_errors, 1);
    enum { LIVE = 16 };
    CUdeviceptr live[LIVE] = {0};
    while (!STOPPED()) {
        int k = rand_r(&seed) % LIVE;
        int what = rand_r(&seed) % 4;
        if (what == 2) {
            if (launch(f_empty, NULL, 0) != CUDA_SUCCESS) ADD(n_errors, 1);
        } else if (what < 2 && !live[k]) {
            CUresult r = cuMemAlloc_v2(&live[k], (size_t)(1 + rand_r(&seed) % 16) << 16);
            count(r);
            if (r != CUDA_SUCCESS) live[k] = 0;
        } else if (live[k]) {
            if (cuMemFree_v2(live[k]) != CUDA_SUCCESS) ADD(n_errors, 1);
            live[k] = 0;
        }
        usleep(200);
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k] && cuMemFree_v2(live[k]) != CUDA_SUCCESS) ADD(n_errors, 1);
    return NULL;
}

static int worker(double seconds, unsigned long long ns, int threads, const char *stopfile) {
    setup_cuda();
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    pthread_t t[64];
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker_alloc, (void *)(size_t)i);
    unsigned long long t0 = mono_ns(), next = t0, done = 0;
    for (;;) {
        for (int i = 0; i < 4; i++)
            if (launch(f_sleep, s, ns) != CUDA_SUCCESS) ADD(n_errors, 1);
        if (cuStreamSynchronize(s) != CUDA_SUCCESS) ADD(n_errors, 1);
        done += 4;
        unsigned long long now = mono_ns();
        if (now >= next) {
            printf("P %llu %llu\n", now, done);
            next = now + 50000000ull;
            if (exists(stopfile)) break;
        }
        if (now - t0 >= (unsigned long long)(seconds * 1e9)) break;
    }
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    if (cuCtxSynchronize() != CUDA_SUCCESS) ADD(n_errors, 1);
    printf("P %llu %llu\n", mono_ns(), done);
    printf("R %s launched=%llu allocs=%llu refused=%llu errors=%llu\n", GET(n_errors) ? "errors" : "ok", done,
           GET(n_alloc), GET(n_refused), GET(n_errors));
    return GET(n_errors) ? 1 : 0;
}

/* ---- alloc --------------------------------------------------------------- */

static size_t max_chunk;

static void *hammer(void *arg) {
    unsigned seed = (unsigned)getpid() * 131u + (unsigned)(size_t)arg * 7u;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ADD(n_errors, 1);
    enum { LIVE = 8 };
    CUdeviceptr live[LIVE] = {0};
    size_t units = max_chunk >> 16;
    if (units < 1) units = 1;
    while (!STOPPED()) {
        int k = rand_r(&seed) % LIVE;
        if (live[k]) {
            if (cuMemFree_v2(live[k]) != CUDA_SUCCESS) ADD(n_errors, 1);
            live[k] = 0;
        } else {
            CUresult r = cuMemAlloc_v2(&live[k], (size_t)(1 + rand_r(&seed) % units) << 16);
            count(r);
            if (r != CUDA_SUCCESS) live[k] = 0;
        }
    }
    for (int k = 0; k < LIVE; k++)
        if (live[k] && cuMemFree_v2(live[k]) != CUDA_SUCCESS) ADD(n_errors, 1);
    return NULL;
}

static int alloc_main(int threads, size_t chunk, const char *stopfile, double seconds) {
    setup_cuda_retry(1);
    max_chunk = chunk;
    pthread_t t[64];
    if (threads > 64) threads = 64;
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, hammer, (void *)(size_t)i);
    unsigned long long t0 = mono_ns();
    while (!exists(stopfile) && mono_ns() - t0 < (unsigned long long)(seconds * 1e9)) {
        printf("P %llu %llu %llu\n", mono_ns(), GET(n_alloc), GET(n_refused));
        usleep(20000);
    }
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("P %llu %llu %llu\n", mono_ns(), GET(n_alloc), GET(n_refused));
    printf("R %s grants=%llu refusals=%llu errors=%llu\n", GET(n_errors) ? "errors" : "ok", GET(n_alloc),
           GET(n_refused), GET(n_errors));
    return GET(n_errors) ? 1 : 0;
}

/* ---- watch --------------------------------------------------------------- */

/* Device memory the fake's live processes hold: the sum of their slots'
 * usage (dead ones given back first). Unlike the device-wide counter it
 * cannot drift when a process is killed inside the fake's own two-step
 * bookkeeping (counter, then slot), but it is not one atomic snapshot:
 * read it when nothing else runs. */
static unsigned long long held(struct fake_state *s, int fd) {
    fake_state_reclaim_dead(s, fd, -1);
    unsigned long long sum = 0;
    for (int i = 0; i < FAKE_MAX_SLOTS; i++)
        if (atomic_load(&s->slot[i].pid) != 0) sum += atomic_load(&s->slot[i].used[0]);
    return sum;
}

static int watch(const char *stopfile, unsigned long long limit) {
    CHECK(cuInit(0));
    const char *path = getenv("FAKE_CUDA_STATE");
    int fd = -1;
    struct fake_state *s = path ? fake_state_attach(path, &fd) : NULL;
    if (!s) {
        fprintf(stderr, "watch: cannot attach FAKE_CUDA_STATE\n");
        return 1;
    }
    unsigned long long used = 0, max = 0, samples = 0, over_since = 0, over_max = 0, episodes = 0;
    do {
        CHECK(cuFakeUsedBytes(0, &used));
        unsigned long long t = mono_ns();
        if (used > max) max = used;
        if (limit && used > limit) {
            if (!over_since) over_since = t, over_max = 0, episodes++;
            if (used > over_max) over_max = used;
        } else if (over_since) {
            printf("O %llu %llu %llu\n", over_since, t, over_max);
            over_since = 0;
        }
        samples++;
        if (stopfile) usleep(200);
    } while (stopfile && !exists(stopfile));
    if (over_since) printf("O %llu %llu %llu\n", over_since, mono_ns(), over_max);
    printf("R max=%llu samples=%llu last=%llu held=%llu episodes=%llu\n", max, samples, used, held(s, fd), episodes);
    return 0;
}

/* ---- fork ---------------------------------------------------------------- */

static void launches(int n) {
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    for (int i = 0; i < n; i++) CHECK(launch(f_sleep, s, 1000000));
    CHECK(cuStreamSynchronize(s));
}

static int read_byte(void) {
    char c;
    ssize_t n;
    do n = read(0, &c, 1);
    while (n < 0 && errno == EINTR);
    return n == 1 ? c : -1;
}

static void child_main(void) {
    setup_cuda();
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 16 << 20));
    launches(8);
    printf("R child ready pid=%d\n", (int)getpid());
    read_byte();
    exit(0); /* holding 16 MiB: the exit path gives it back */
}

static int fork_main(const char *mode, const char *self) {
    setup_cuda();
    CUdeviceptr mine;
    CHECK(cuMemAlloc_v2(&mine, 8 << 20));
    launches(8);
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) return 3;
    if (pid == 0) {
        if (!strcmp(mode, "exec")) {
            execl(self, self, "child", (char *)NULL);
            _exit(127);
        }
        if (!strcmp(mode, "fork")) child_main();
        /* orphan: no CUDA at all, lives on after its parent */
        printf("R orphan pid=%d\n", (int)getpid());
        while (read_byte() >= 0) {
        }
        exit(0);
    }
    if (!strcmp(mode, "orphan")) {
        printf("R parent waiting\n");
        for (;;) pause();
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("R child status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    read_byte();
    launches(8);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 1 << 20));
    CHECK(cuMemFree_v2(p));
    CHECK(cuMemFree_v2(mine));
    printf("R parent done\n");
    return 0;
}

/* ---- threads ------------------------------------------------------------- */

static unsigned long long leaked, finished;

static void *busy(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 977u + 5u;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ADD(n_errors, 1);
    CUstream s;
    if (cuStreamCreate(&s, 0) != CUDA_SUCCESS) {
        ADD(n_errors, 1);
        return NULL;
    }
    for (unsigned i = 0; !STOPPED(); i++) {
        CUdeviceptr p;
        CUresult r = cuMemAlloc_v2(&p, (size_t)(1 + rand_r(&seed) % 16) << 12);
        count(r);
        if (launch(f_sleep, s, 20000) != CUDA_SUCCESS) ADD(n_errors, 1);
        if (r == CUDA_SUCCESS && cuMemFree_v2(p) != CUDA_SUCCESS) ADD(n_errors, 1);
        if (i % 16 == 15 && cuStreamSynchronize(s) != CUDA_SUCCESS) ADD(n_errors, 1);
    }
    if (cuStreamSynchronize(s) != CUDA_SUCCESS) ADD(n_errors, 1);
    return NULL;
}

/* The device's page (cuMemGetAllocationGranularity) and what the driver
 * takes for an allocation of n bytes: whole pages from one page up. */
static size_t page = 1;
static size_t taken(size_t n) { return n < page ? n : (n + page - 1) / page * page; }

static void *short_lived(void *arg) {
    size_t id = (size_t)arg;
    unsigned seed = (unsigned)id * 2654435761u;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ADD(n_errors, 1);
    CUdeviceptr p[8] = {0};
    size_t size[8] = {0};
    int n = 1 + rand_r(&seed) % 8;
    for (int i = 0; i < n; i++) {
        size[i] = (size_t)(1 + rand_r(&seed) % 64) << 12;
        CUresult r = cuMemAlloc_v2(&p[i], size[i]);
        count(r);
        if (r != CUDA_SUCCESS) p[i] = 0;
        if (launch(i % 2 ? f_empty : f_sleep, NULL, 10000) != CUDA_SUCCESS) ADD(n_errors, 1);
    }
    unsigned long long kept = 0;
    for (int i = 0; i < n; i++) {
        int free_it = id % 3 == 0 || (id % 3 == 2 && i % 2 == 0);
        if (!p[i]) continue;
        if (free_it) {
            if (cuMemFree_v2(p[i]) != CUDA_SUCCESS) ADD(n_errors, 1);
        } else {
            kept += taken(size[i]);
        }
    }
    ADD(leaked, kept);
    ADD(finished, 1);
    if (id % 3 == 1) pthread_exit(NULL);
    return NULL;
}

static int threads_main(int waves, int per_wave) {
    setup_cuda();
    {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CHECK(cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    }
    pthread_t b[4];
    for (int i = 0; i < 4; i++) pthread_create(&b[i], NULL, busy, (void *)(size_t)i);
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    unsigned long long started = 0;
    for (int w = 0; w < waves; w++) {
        pthread_t t[256];
        int joinable[256];
        for (int i = 0; i < per_wave && i < 256; i++) {
            size_t id = (size_t)w * 1000 + (size_t)i;
            joinable[i] = i % 2 == 0;
            if (pthread_create(&t[i], joinable[i] ? NULL : &detached, short_lived, (void *)id) == 0) started++;
            else ADD(n_errors, 1), joinable[i] = 0;
        }
        for (int i = 0; i < per_wave && i < 256; i++)
            if (joinable[i]) pthread_join(t[i], NULL);
    }
    /* The detached ones finish on their own. */
    for (int i = 0; i < 30000 && GET(finished) < started; i++) usleep(1000);
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < 4; i++) pthread_join(b[i], NULL);
    if (cuCtxSynchronize() != CUDA_SUCCESS) ADD(n_errors, 1);
    size_t free_b = 0, total_b = 0;
    CHECK(cuMemGetInfo_v2(&free_b, &total_b));
    printf("R %s threads=%llu finished=%llu leaked=%llu used=%llu errors=%llu refused=%llu\n",
           GET(n_errors) ? "errors" : "ok", started, GET(finished), GET(leaked),
           (unsigned long long)(total_b - free_b), GET(n_errors), GET(n_refused));
    fflush(stdout);
    exit(0); /* with the leaked allocations live */
}

/* ---- gate ---------------------------------------------------------------- */

static unsigned long long gate_ns;

static void *gate_launcher(void *arg) {
    (void)arg;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ADD(n_errors, 1);
    CUstream s;
    if (cuStreamCreate(&s, 0) != CUDA_SUCCESS) return NULL;
    for (;;) {
        for (int i = 0; i < 4; i++) {
            if (launch(f_sleep, s, gate_ns) != CUDA_SUCCESS) ADD(n_errors, 1);
            ADD(n_launch, 1);
        }
        cuStreamSynchronize(s);
    }
    return NULL;
}

static int gate_main(unsigned long long ns) {
    setup_cuda();
    gate_ns = ns;
    pthread_t t;
    pthread_create(&t, NULL, gate_launcher, NULL);
    printf("R started pid=%d\n", (int)getpid());
    read_byte();
    printf("R exiting launched=%llu errors=%llu\n", GET(n_launch), GET(n_errors));
    fflush(stdout);
    exit(0);
}

/* ---- exit while threads allocate ----------------------------------------- */

static void *churn(void *arg) {
    unsigned seed = (unsigned)(size_t)arg * 40503u + 1u;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) ADD(n_errors, 1);
    for (;;) {
        CUdeviceptr p;
        CUresult r = cuMemAlloc_v2(&p, (size_t)(1 + rand_r(&seed) % 16) << 16);
        count(r);
        if (launch(f_empty, NULL, 0) != CUDA_SUCCESS) ADD(n_errors, 1);
        if (r == CUDA_SUCCESS && rand_r(&seed) % 4 && cuMemFree_v2(p) != CUDA_SUCCESS) ADD(n_errors, 1);
    }
    return NULL;
}

static int exit_race(int threads, int ms) {
    setup_cuda();
    pthread_t t;
    for (int i = 0; i < threads; i++) pthread_create(&t, NULL, churn, (void *)(size_t)i);
    usleep((useconds_t)ms * 1000);
    printf("R exiting allocs=%llu errors=%llu\n", GET(n_alloc), GET(n_errors));
    fflush(stdout);
    exit(0); /* the other threads are inside driver calls */
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *cmd = argv[1];
    if (!strcmp(cmd, "worker") && argc >= 5)
        return worker(atof(argv[2]), strtoull(argv[3], NULL, 10), atoi(argv[4]), argc > 5 ? argv[5] : NULL);
    if (!strcmp(cmd, "alloc") && argc >= 6)
        return alloc_main(atoi(argv[2]), strtoull(argv[3], NULL, 10), argv[4], atof(argv[5]));
    if (!strcmp(cmd, "watch") && argc >= 3)
        return watch(!strcmp(argv[2], "poll") && argc >= 4 ? argv[3] : NULL, argc >= 5 ? strtoull(argv[4], NULL, 10) : 0);
    if (!strcmp(cmd, "fork") && argc >= 3) return fork_main(argv[2], argv[0]);
    if (!strcmp(cmd, "child")) {
        child_main();
        return 0;
    }
    if (!strcmp(cmd, "threads") && argc >= 4) return threads_main(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(cmd, "exitrace") && argc >= 4) return exit_race(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(cmd, "gate") && argc >= 3) return gate_main(strtoull(argv[2], NULL, 10));
    return 2;
}
