/* Initialisation faults (tests/init.rs), one scenario per subcommand.
 *   init_app twice
 *       cuInit twice, then a context: "R init1=A init2=B ctx=C".
 *   init_app threads N
 *       N threads call cuInit at once: "R results=r1,r2,... cpu_us=U" with
 *       U the most CPU time one thread spent in its cuInit.
 *   init_app fork
 *       a thread calls cuInit; once the shim has opened the memory segment
 *       (it shows in /proc/self/fd) and while it is still initialising
 *       (the test makes it pause there), the main thread forks. The child
 *       counts the segment descriptors it inherited ("R child
 *       inherited_seg_fds=N"), initialises CUDA itself, allocates 1 MiB
 *       and 100 MiB: "R child init=I ctx=C small=S big=B"; exit(0). The
 *       parent prints "R parent init=I small=S" and "R child status=X". */
#include "app.h"

#include <dirent.h>
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long thread_cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Descriptors of this process open on a file named memory.seg. */
static int seg_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[64], target[4096];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = 0;
        const char *base = strrchr(target, '/');
        if (base && !strcmp(base + 1, "memory.seg")) n++;
    }
    closedir(d);
    return n;
}

static CUresult context(void) {
    CUdevice dev;
    CUcontext ctx;
    CUresult r = cuDeviceGet(&dev, 0);
    if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
    if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
    return r;
}

static CUresult alloc_free(size_t n) {
    CUdeviceptr p;
    CUresult r = cuMemAlloc_v2(&p, n);
    if (r == CUDA_SUCCESS) cuMemFree_v2(p);
    return r;
}

struct slot {
    pthread_t t;
    CUresult r;
    long long cpu_us;
};

static void *init_thread(void *arg) {
    struct slot *s = arg;
    long long t0 = thread_cpu_us();
    s->r = cuInit(0);
    s->cpu_us = thread_cpu_us() - t0;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "twice")) {
        CUresult a = cuInit(0), b = cuInit(0);
        printf("R init1=%d init2=%d ctx=%d\n", a, b, context());
        return 0;
    }
    if (!strcmp(cmd, "threads") && argc > 2) {
        int n = atoi(argv[2]);
        if (n < 1 || n > 64) return 2;
        struct slot s[64];
        for (int i = 0; i < n; i++) pthread_create(&s[i].t, NULL, init_thread, &s[i]);
        long long cpu = 0;
        printf("R results=");
        for (int i = 0; i < n; i++) {
            pthread_join(s[i].t, NULL);
            printf("%s%d", i ? "," : "", s[i].r);
            if (s[i].cpu_us > cpu) cpu = s[i].cpu_us;
        }
        printf(" cpu_us=%lld\n", cpu);
        return 0;
    }
    if (!strcmp(cmd, "fork")) {
        struct slot s;
        pthread_create(&s.t, NULL, init_thread, &s);
        int seen = 0;
        for (int i = 0; i < 20000 && !(seen = seg_fds() > 0); i++) usleep(500);
        if (!seen) {
            printf("R the segment never appeared in /proc/self/fd\n");
            return 1;
        }
        /* The descriptor shows as soon as it is open, a little before the
         * shim records it; the test's pause keeps init going for longer. */
        usleep(50000);
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            printf("R child inherited_seg_fds=%d\n", seg_fds());
            CUresult i = cuInit(0);
            CUresult c = context();
            CUresult small = alloc_free(1 << 20);
            CUresult big = alloc_free((size_t)100 << 20);
            printf("R child init=%d ctx=%d small=%d big=%d\n", i, c, small, big);
            fflush(stdout);
            exit(0);
        }
        pthread_join(s.t, NULL);
        CUresult c = s.r == CUDA_SUCCESS ? context() : s.r;
        printf("R parent init=%d small=%d\n", s.r, c == CUDA_SUCCESS ? alloc_free(1 << 20) : c);
        int status = 0;
        waitpid(pid, &status, 0);
        printf("R child status=%d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return 0;
    }
    return 2;
}
