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
#include "latency.h"

static void busy_wait(unsigned long long ns) {
    if (ns == 0) return;
    unsigned long long end = now_ns() + ns;
    while (now_ns() < end) {
    }
}

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

int main(int argc, char **argv) {
    if (argc != 10 || (strcmp(argv[1], "subscribe") && strcmp(argv[1], "subscribe2") && strcmp(argv[1], "profiler")) ||
        (strcmp(argv[2], "global") && strcmp(argv[2], "private"))) {
        fprintf(stderr, "usage: cupti_user subscribe|subscribe2|profiler global|private AT_MS SECONDS PERIOD_US TOKENS "
                        "KERNELS KERNEL_NS GAP_NS\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    int subscribe = strcmp(argv[1], "subscribe2") == 0 ? 2 : strcmp(argv[1], "subscribe") == 0, global = strcmp(argv[2], "global") == 0;
    unsigned long long at = arg(argv[3], "AT_MS") * 1000000ull;
    double seconds = atof(argv[4]);
    unsigned long long period = arg(argv[5], "PERIOD_US") * 1000ull;
    unsigned long long tokens = arg(argv[6], "TOKENS");
    unsigned long long kernels = arg(argv[7], "KERNELS");
    unsigned long long ns = arg(argv[8], "KERNEL_NS");
    unsigned long long gap = arg(argv[9], "GAP_NS");
    if (seconds <= 0 || period == 0 || tokens == 0 || kernels == 0) {
        fprintf(stderr, "cupti_user: SECONDS, PERIOD_US, TOKENS and KERNELS must be positive\n");
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
    int used = 0;
    unsigned long long t0 = now_ns(), end = t0 + span, served = 0;
    for (unsigned long long i = 0; i < due; i++) {
        unsigned long long d = t0 + i * period;
        if (now_ns() >= end) break;
        sleep_until(d);
        if (!used && now_ns() >= t0 + at) {
            use_cupti(subscribe, global);
            used = 1;
        }
        for (unsigned long long t = 0; t < tokens; t++) {
            for (unsigned long long k = 0; k < kernels; k++) {
                if (k > 0) busy_wait(gap);
                CHECK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL));
            }
            CHECK(cuStreamSynchronize(s));
        }
        lat[served++] = now_ns() - d;
    }
    if (!used) {
        fprintf(stderr, "FAIL the run ended before AT_MS\n");
        return 1;
    }
    if (report_latencies(lat, served, due, period)) return 1;
    CHECK(cuStreamDestroy(s));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(lat);
    return 0;
}
