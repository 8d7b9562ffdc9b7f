/* A launch-bound tenant that uses CUPTI itself, but not its activity API:
 * decode.c's loop (a request due every PERIOD_US of TOKENS tokens of
 * KERNELS "sleep" kernels of KERNEL_NS, GAP_NS of host busy-wait between
 * launches, one synchronise per token), which, AT_MS after its first
 * request was due (0: before it), makes one CUPTI call:
 *   subscribe  cuptiSubscribe (the callback API; a tracer such as an
 *              NVTX or API-trace tool)
 *   subscribe2 cuptiSubscribe_v2 (its CUDA 13 successor), with parameters
 *   profiler   cuptiProfilerInitialize (the range profiler)
 * A detach of CUPTI (cuptiFinalize) after that call ends the program's
 * subscription or profiler session: the fake CUPTI logs it. The call is
 * found as HOW says:
 *   global   libcupti opened RTLD_GLOBAL, the name looked up in the global
 *            scope (dlsym(RTLD_DEFAULT)): the definition a program linked
 *            against libcupti binds to
 *   private  libcupti opened RTLD_LOCAL, the name looked up in its handle
 *            (as Python's ctypes does): invisible to RTLD_NEXT
 * Prints "D <name> <object> <symbol>" (where the function found lives),
 * "C <name> <result>" once the call is made, then decode.c's
 *   T <p50_us> <p99_us> <max_us> <count>
 *   L <p50_us> <p99_us> <max_us> <served> <due>
 * Exits 1 if the call fails.
 *   cupti_user subscribe|subscribe2|profiler global|private AT_MS SECONDS PERIOD_US TOKENS KERNELS KERNEL_NS GAP_NS */
#include "app.h"
#include "cuslice_cupti.h"
#include "decode_loop.h"

static unsigned long long arg(const char *s, const char *what) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0') {
        fprintf(stderr, "cupti_user: %s: \"%s\" is not a number\n", what, s);
        exit(2);
    }
    return v;
}

static void callback(void *userdata, uint32_t domain, CUpti_CallbackId cbid, const void *cbdata) {
    (void)userdata;
    (void)domain;
    (void)cbid;
    (void)cbdata;
}

/* Makes the CUPTI call; exits 1 where it fails. */
static void use_cupti(int subscribe, int global) {
    const char *name = subscribe == 2 ? "cuptiSubscribe_v2" : subscribe ? "cuptiSubscribe" : "cuptiProfilerInitialize";
    void *h = dlopen("libcupti.so.13", RTLD_NOW | (global ? RTLD_GLOBAL : RTLD_LOCAL));
    if (h == NULL) {
        fprintf(stderr, "FAIL dlopen libcupti.so.13: %s\n", dlerror());
        exit(1);
    }
    void *p = dlsym(global ? RTLD_DEFAULT : h, name);
    describe(name, p);
    if (p == NULL) {
        fprintf(stderr, "FAIL dlsym %s\n", name);
        exit(1);
    }
    CUptiResult r;
    if (subscribe == 2) {
        static CUpti_SubscriberHandle sub;
        CUpti_SubscriberParams params = {.structSize = sizeof params, .subscriberName = "cupti_user"};
        __typeof__(cuptiSubscribe_v2) *f;
        *(void **)&f = p;
        r = f(&sub, callback, NULL, &params);
        if (r == CUPTI_SUCCESS && sub == NULL) {
            fprintf(stderr, "FAIL cuptiSubscribe_v2 gave no handle\n");
            exit(1);
        }
    } else if (subscribe) {
        static CUpti_SubscriberHandle sub;
        __typeof__(cuptiSubscribe) *f;
        *(void **)&f = p;
        r = f(&sub, callback, NULL);
        if (r == CUPTI_SUCCESS && sub == NULL) {
            fprintf(stderr, "FAIL cuptiSubscribe gave no handle\n");
            exit(1);
        }
    } else {
        CUpti_Profiler_Initialize_Params params = {sizeof params, NULL};
        __typeof__(cuptiProfilerInitialize) *f;
        *(void **)&f = p;
        r = f(&params);
    }
    printf("C %s %d\n", name, (int)r);
    if (r != CUPTI_SUCCESS) {
        fprintf(stderr, "FAIL %s -> %d\n", name, (int)r);
        exit(1);
    }
}

struct when {
    unsigned long long at_ns;
    int subscribe, global, used;
};

/* Before each request: the CUPTI call, once AT_MS has passed. */
static void maybe_use(unsigned long long since_ns, void *arg) {
    struct when *w = arg;
    if (!w->used && since_ns >= w->at_ns) {
        use_cupti(w->subscribe, w->global);
        w->used = 1;
    }
}

int main(int argc, char **argv) {
    if (argc != 10 || (strcmp(argv[1], "subscribe") && strcmp(argv[1], "subscribe2") && strcmp(argv[1], "profiler")) ||
        (strcmp(argv[2], "global") && strcmp(argv[2], "private"))) {
        fprintf(stderr, "usage: cupti_user subscribe|subscribe2|profiler global|private AT_MS SECONDS PERIOD_US TOKENS "
                        "KERNELS KERNEL_NS GAP_NS\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    struct when w = {
        .at_ns = arg(argv[3], "AT_MS") * 1000000ull,
        .subscribe = strcmp(argv[1], "subscribe2") == 0 ? 2 : strcmp(argv[1], "subscribe") == 0,
        .global = strcmp(argv[2], "global") == 0,
    };
    struct decode_shape sh = {
        .seconds = atof(argv[4]),
        .period_ns = arg(argv[5], "PERIOD_US") * 1000ull,
        .tokens = arg(argv[6], "TOKENS"),
        .kernels = arg(argv[7], "KERNELS"),
        .kernel_ns = arg(argv[8], "KERNEL_NS"),
        .gap_ns = arg(argv[9], "GAP_NS"),
    };
    if (sh.seconds <= 0 || sh.period_ns == 0 || sh.tokens == 0 || sh.kernels == 0) {
        fprintf(stderr, "cupti_user: SECONDS, PERIOD_US, TOKENS and KERNELS must be positive\n");
        return 2;
    }
    int r = decode_run(&sh, maybe_use, &w);
    if (!w.used) {
        fprintf(stderr, "FAIL the run ended before AT_MS\n");
        return 1;
    }
    return r;
}
