/* Memory-quota scenarios, one per subcommand; results as "R ..." lines.
 *   memtest boundary FAMILY USABLE   fill USABLE bytes, then 1 more unit, free, refill
 *   memtest info USED                allocate USED bytes, then print every memory query
 *   memtest race ROUNDS CHUNK QUOTA  allocate/free CHUNKs at random; check the device-wide
 *                                    usage (fake ground truth) never exceeds QUOTA
 *   memtest hold BYTES               allocate, say so, and sleep until killed
 *   memtest serve BYTES              allocate BYTES (0: none), say so, then answer one line of
 *                                    stdin at a time until it ends: "info" (cuMemGetInfo_v2's
 *                                    total and free, NVML's total and used), "alloc N" (one
 *                                    allocation, kept where it succeeds: its status), "free"
 *                                    (every allocation "alloc" kept)
 *   memtest alloc BYTES              one allocation, print its status
 *   memtest timed BYTES              one allocation: its status, when it was asked and
 *                                    when it returned (CLOCK_MONOTONIC ns), then hold it
 *                                    until stdin closes
 *   memtest freeon BYTES             allocate, say so, free when a line arrives on
 *                                    stdin and say when it asked (CLOCK_MONOTONIC ns), then hold
 *                                    nothing until stdin closes
 *   memtest meminfo                  cuMemGetInfo_v2 and cuDeviceTotalMem_v2
 *   memtest asyncalloc BYTES         one cuMemAllocAsync on the legacy stream, then a
 *                                    synchronise: its status, asked/done as `timed`
 *   memtest devices B0 B1            allocate B0 on device 0 and B1 on device 1
 *   memtest fill CHUNK               cuMemAlloc_v2 CHUNKs until one fails (at most 4096);
 *                                    how many, the last status, the device's usage as the
 *                                    driver counts it (fake ground truth) and as the quota
 *                                    does (cuMemGetInfo_v2); then free them all
 *   memtest arrays N                 create 1-byte arrays until one fails (at most N),
 *                                    then destroy them all; the container's usage
 *                                    (cuMemGetInfo) with them and after
 */
#include "app.h"

#include <time.h>
#include <unistd.h>

static CUcontext ctx;

static void init(int ordinal) {
    CUdevice dev;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, ordinal));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
}

typedef CUresult (*alloc_fn)(size_t size, unsigned long long *handle);
typedef CUresult (*free_fn)(unsigned long long handle);

static CUstream stream0 = 0;

static CUresult a_alloc(size_t n, unsigned long long *h) { return cuMemAlloc_v2((CUdeviceptr *)h, n); }
static CUresult f_alloc(unsigned long long h) { return cuMemFree_v2(h); }
static CUresult a_v1(size_t n, unsigned long long *h) {
    CUdeviceptr_v1 p = 0;
    CUresult r = cuMemAlloc(&p, (unsigned int)n);
    *h = p;
    return r;
}
static CUresult f_v1(unsigned long long h) { return cuMemFree((CUdeviceptr_v1)h); }
static CUresult a_managed(size_t n, unsigned long long *h) {
    return cuMemAllocManaged((CUdeviceptr *)h, n, 1 /* CU_MEM_ATTACH_GLOBAL */);
}
static CUresult a_pitch(size_t n, unsigned long long *h) {
    size_t pitch = 0;
    return cuMemAllocPitch_v2((CUdeviceptr *)h, &pitch, 4096, n / 4096, 4);
}
/* The legacy entry point (32-bit pitch and pointer). */
static CUresult a_pitch_v1(size_t n, unsigned long long *h) {
    CUdeviceptr_v1 p = 0;
    unsigned int pitch = 0;
    CUresult r = cuMemAllocPitch(&p, &pitch, 4096, (unsigned int)(n / 4096), 4);
    *h = p;
    return r;
}
static CUresult a_async(size_t n, unsigned long long *h) { return cuMemAllocAsync((CUdeviceptr *)h, n, stream0); }
static CUresult f_async(unsigned long long h) {
    CUresult r = cuMemFreeAsync(h, stream0);
    if (r == CUDA_SUCCESS) r = cuStreamSynchronize(stream0);
    return r;
}
static CUresult a_pool(size_t n, unsigned long long *h) {
    CUmemoryPool pool;
    CUresult r = cuDeviceGetDefaultMemPool(&pool, 0);
    if (r != CUDA_SUCCESS) return r;
    return cuMemAllocFromPoolAsync((CUdeviceptr *)h, n, pool, stream0);
}
static CUresult a_vmm(size_t n, unsigned long long *h) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return cuMemCreate((CUmemGenericAllocationHandle *)h, n, &prop, 0);
}
static CUresult f_vmm(unsigned long long h) { return cuMemRelease(h); }

/* hostvmm BYTES: host memory of BYTES made by cuMemCreate (location HOST)
 * and mapped at a reserved range, then a plain allocation of PLAIN bytes
 * while it is held: host memory is not the GPU's, so the quota must not
 * count it. */
static int hostvmm(size_t n, size_t plain_n) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0, p = 0;
    CUresult create = cuMemCreate(&h, n, &prop, 0);
    CUresult reserve = cuMemAddressReserve(&va, n, 0, 0, 0);
    CUresult map = create == CUDA_SUCCESS && reserve == CUDA_SUCCESS ? cuMemMap(va, n, 0, h, 0) : CUDA_ERROR_UNKNOWN;
    CUresult plain = cuMemAlloc_v2(&p, plain_n);
    if (plain == CUDA_SUCCESS) cuMemFree_v2(p);
    if (map == CUDA_SUCCESS) cuMemUnmap(va, n);
    if (reserve == CUDA_SUCCESS) cuMemAddressFree(va, n);
    CUresult release = create == CUDA_SUCCESS ? cuMemRelease(h) : CUDA_ERROR_UNKNOWN;
    printf("R hostvmm create=%d map=%d plain=%d release=%d\n", create, map, plain, release);
    return 0;
}
static CUresult a_array(size_t n, unsigned long long *h) {
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 1024, .Height = n / 4096, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    return cuArrayCreate_v2((CUarray *)h, &d);
}
static CUresult f_array(unsigned long long h) { return cuArrayDestroy((CUarray)h); }
static CUresult a_array3d(size_t n, unsigned long long *h) {
    CUDA_ARRAY3D_DESCRIPTOR d = {
        .Width = 256, .Height = 4, .Depth = n / 4096, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 4};
    return cuArray3DCreate_v2((CUarray *)h, &d);
}
static CUresult a_mipmap(size_t n, unsigned long long *h) {
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = 1024, .Height = n / 4096, .Format = CU_AD_FORMAT_HALF, .NumChannels = 2};
    return cuMipmappedArrayCreate((CUmipmappedArray *)h, &d, 1);
}
static CUresult f_mipmap(unsigned long long h) { return cuMipmappedArrayDestroy((CUmipmappedArray)h); }

/* Fill the quota with one allocation of exactly `usable` bytes, then one
 * more `unit` must be refused; free; the same allocation fits again. */
static int boundary(const char *family, size_t usable) {
    alloc_fn a;
    free_fn f;
    size_t unit = 4096;
    if (!strcmp(family, "alloc")) a = a_alloc, f = f_alloc;
    else if (!strcmp(family, "alloc_v1")) a = a_v1, f = f_v1;
    else if (!strcmp(family, "managed")) a = a_managed, f = f_alloc;
    else if (!strcmp(family, "pitch")) a = a_pitch, f = f_alloc;
    else if (!strcmp(family, "pitch_v1")) a = a_pitch_v1, f = f_v1;
    else if (!strcmp(family, "async")) a = a_async, f = f_async, unit = 2 << 20;
    else if (!strcmp(family, "pool")) a = a_pool, f = f_async, unit = 2 << 20;
    else if (!strcmp(family, "vmm")) a = a_vmm, f = f_vmm, unit = 2 << 20;
    else if (!strcmp(family, "array")) a = a_array, f = f_array;
    else if (!strcmp(family, "array3d")) a = a_array3d, f = f_array;
    else if (!strcmp(family, "mipmap")) a = a_mipmap, f = f_mipmap;
    else return 2;
    unsigned long long h1 = 0, h2 = 0;
    CUresult fill = a(usable, &h1);
    CUresult over = a(unit, &h2);
    CUresult freed = fill == CUDA_SUCCESS ? f(h1) : CUDA_ERROR_UNKNOWN;
    CUresult refill = a(usable, &h1);
    if (refill == CUDA_SUCCESS) f(h1);
    /* A plain allocation after all that: nothing may be left charged. */
    CUdeviceptr p;
    CUresult plain = cuMemAlloc_v2(&p, usable);
    if (plain == CUDA_SUCCESS) cuMemFree_v2(p);
    printf("R %s fill=%d over=%d free=%d refill=%d plain=%d\n", family, fill, over, freed, refill, plain);
    return 0;
}

static void info(size_t used) {
    CUdeviceptr p = 0;
    if (used) CHECK(cuMemAlloc_v2(&p, used));
    size_t free2 = 0, total2 = 0, tm2 = 0;
    unsigned int free1 = 0, total1 = 0, tm1 = 0;
    CHECK(cuMemGetInfo_v2(&free2, &total2));
    CHECK(cuMemGetInfo(&free1, &total1));
    CHECK(cuDeviceTotalMem_v2(&tm2, 0));
    CHECK(cuDeviceTotalMem(&tm1, 0));
    printf("R cuMemGetInfo_v2 free=%zu total=%zu\n", free2, total2);
    printf("R cuMemGetInfo free=%u total=%u\n", free1, total1);
    printf("R cuDeviceTotalMem_v2 %zu\n", tm2);
    printf("R cuDeviceTotalMem %u\n", tm1);
    nvmlDevice_t nd;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &nd) != NVML_SUCCESS) {
        printf("R nvml unavailable\n");
        return;
    }
    nvmlMemory_t m1;
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = (unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24));
    nvmlReturn_t r1 = nvmlDeviceGetMemoryInfo(nd, &m1);
    nvmlReturn_t r2 = nvmlDeviceGetMemoryInfo_v2(nd, &m2);
    printf("R nvmlDeviceGetMemoryInfo %d total=%llu used=%llu free=%llu\n", r1, m1.total, m1.used, m1.free);
    printf("R nvmlDeviceGetMemoryInfo_v2 %d total=%llu used=%llu free=%llu\n", r2, m2.total, m2.used, m2.free);
}

static int race(int rounds, size_t chunk, unsigned long long quota) {
    enum { HELD = 8 };
    CUdeviceptr held[HELD] = {0};
    int grants = 0, refusals = 0, violations = 0;
    unsigned seed = (unsigned)getpid();
    for (int i = 0; i < rounds; i++) {
        int k = rand_r(&seed) % HELD;
        if (held[k]) {
            CHECK(cuMemFree_v2(held[k]));
            held[k] = 0;
        } else {
            CUresult r = cuMemAlloc_v2(&held[k], chunk);
            if (r == CUDA_SUCCESS) grants++;
            else if (r == CUDA_ERROR_OUT_OF_MEMORY) refusals++, held[k] = 0;
            else CHECK(r);
        }
        unsigned long long used = 0;
        CHECK(cuFakeUsedBytes(0, &used));
        if (used > quota) violations++;
    }
    for (int k = 0; k < HELD; k++)
        if (held[k]) CHECK(cuMemFree_v2(held[k]));
    printf("R violations=%d\n", violations);
    printf("D grants=%d refusals=%d\n", grants, refusals);
    return 0;
}

static int fill(size_t chunk) {
    enum { MAX = 4096 };
    static CUdeviceptr p[MAX];
    int n = 0;
    CUresult r = CUDA_SUCCESS;
    while (n < MAX && (r = cuMemAlloc_v2(&p[n], chunk)) == CUDA_SUCCESS) n++;
    unsigned long long truth = 0;
    CHECK(cuFakeUsedBytes(0, &truth));
    size_t free2 = 0, total2 = 0;
    CHECK(cuMemGetInfo_v2(&free2, &total2));
    printf("R fill n=%d r=%d truth=%llu quota_used=%zu\n", n, r, truth, total2 - free2);
    for (int i = 0; i < n; i++) CHECK(cuMemFree_v2(p[i]));
    return 0;
}

static size_t used_now(void) {
    size_t free = 0, total = 0;
    CHECK(cuMemGetInfo_v2(&free, &total));
    return total - free;
}

static int arrays(int n) {
    CUarray *a = calloc((size_t)n, sizeof *a);
    if (!a) return 2;
    CUDA_ARRAY_DESCRIPTOR d = {.Width = 1, .Height = 1, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    int created = 0;
    CUresult refused = CUDA_SUCCESS;
    while (created < n && (refused = cuArrayCreate_v2(&a[created], &d)) == CUDA_SUCCESS) created++;
    size_t used = used_now();
    /* Newest first: the fake keeps its arrays in a list, newest at the head. */
    int errors = 0;
    for (int i = created - 1; i >= 0; i--) errors += cuArrayDestroy(a[i]) != CUDA_SUCCESS;
    printf("R arrays created=%d refused=%d used=%zu after=%zu errors=%d\n", created, refused, used, used_now(),
           errors);
    free(a);
    return 0;
}

/* memtest serve: a running process whose quota changes under it (cuslice
 * resize) answers what it sees, when asked. */
static int serve(size_t bytes) {
    enum { MAX = 1024 };
    static CUdeviceptr kept[MAX];
    int n = 0;
    CUdeviceptr p = 0;
    if (bytes) CHECK(cuMemAlloc_v2(&p, bytes));
    printf("R held\n");
    nvmlDevice_t nd;
    int nvml = nvmlInit_v2() == NVML_SUCCESS && nvmlDeviceGetHandleByIndex_v2(0, &nd) == NVML_SUCCESS;
    char line[128];
    while (fgets(line, sizeof line, stdin) != NULL) {
        if (!strncmp(line, "info", 4)) {
            size_t free2 = 0, total2 = 0;
            CHECK(cuMemGetInfo_v2(&free2, &total2));
            nvmlMemory_t m;
            memset(&m, 0, sizeof m);
            if (!nvml || nvmlDeviceGetMemoryInfo(nd, &m) != NVML_SUCCESS) m.total = m.used = 0;
            printf("R info total=%zu free=%zu nvml_total=%llu nvml_used=%llu\n", total2, free2, m.total, m.used);
        } else if (!strncmp(line, "alloc ", 6)) {
            CUdeviceptr q = 0;
            CUresult r = n < MAX ? cuMemAlloc_v2(&q, strtoull(line + 6, NULL, 10)) : CUDA_ERROR_OUT_OF_MEMORY;
            if (r == CUDA_SUCCESS) kept[n++] = q;
            printf("R alloc=%d\n", r);
        } else if (!strncmp(line, "free", 4)) {
            int freed = 0;
            while (n > 0) freed += cuMemFree_v2(kept[--n]) == CUDA_SUCCESS;
            printf("R freed=%d\n", freed);
        } else {
            printf("R unknown\n");
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argv[1];
    if (!strcmp(cmd, "devices")) {
        CUresult r[2];
        for (int d = 0; d < 2; d++) {
            init(d);
            CUdeviceptr p;
            r[d] = cuMemAlloc_v2(&p, strtoull(argv[2 + d], NULL, 10));
            size_t f = 0, t = 0;
            CHECK(cuMemGetInfo_v2(&f, &t));
            printf("R dev%d alloc=%d total=%zu\n", d, r[d], t);
        }
        return 0;
    }
    init(0);
    if (!strcmp(cmd, "boundary")) return boundary(argv[2], strtoull(argv[3], NULL, 10));
    if (!strcmp(cmd, "hostvmm")) return hostvmm(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10));
    if (!strcmp(cmd, "info")) {
        info(strtoull(argv[2], NULL, 10));
        return 0;
    }
    if (!strcmp(cmd, "race")) return race(atoi(argv[2]), strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    if (!strcmp(cmd, "arrays")) return arrays(atoi(argv[2]));
    if (!strcmp(cmd, "fill")) return fill(strtoull(argv[2], NULL, 10));
    if (!strcmp(cmd, "pitched")) {
        /* pitched v1|v2 ROWS: rows of 2200 bytes through the legacy or the
         * _v2 entry; prints the pitch the driver chose and what the quota
         * accounts in use (total - free of cuMemGetInfo_v2: the context
         * charge and the allocation). */
        unsigned rows = (unsigned)strtoul(argv[3], NULL, 10);
        size_t pitch = 0, free2 = 0, total2 = 0;
        CUresult r;
        if (!strcmp(argv[2], "v1")) {
            CUdeviceptr_v1 p1 = 0;
            unsigned int pt = 0;
            r = cuMemAllocPitch(&p1, &pt, 2200, rows, 4);
            pitch = pt;
        } else {
            CUdeviceptr p2 = 0;
            r = cuMemAllocPitch_v2(&p2, &pitch, 2200, rows, 4);
        }
        CHECK(cuMemGetInfo_v2(&free2, &total2));
        printf("R pitched r=%d pitch=%zu used=%zu\n", r, pitch, total2 - free2);
        return 0;
    }
    if (!strcmp(cmd, "alloc")) {
        CUdeviceptr p;
        printf("R alloc=%d\n", cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 10)));
        return 0;
    }
    if (!strcmp(cmd, "timed")) {
        CUdeviceptr p;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        CUresult r = cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 10));
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("R timed=%d asked=%lld done=%lld\n", r,
               (long long)a.tv_sec * 1000000000LL + a.tv_nsec,
               (long long)b.tv_sec * 1000000000LL + b.tv_nsec);
        fflush(stdout);
        char line[64];
        while (fgets(line, sizeof line, stdin) != NULL) {}
        return 0;
    }
    if (!strcmp(cmd, "freeon")) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 10)));
        printf("R held\n");
        fflush(stdout);
        char line[64];
        if (fgets(line, sizeof line, stdin) == NULL) return 0;
        struct timespec a;
        clock_gettime(CLOCK_MONOTONIC, &a); /* when the free was asked */
        CHECK(cuMemFree_v2(p));
        printf("R freed=%lld\n", (long long)a.tv_sec * 1000000000LL + a.tv_nsec);
        fflush(stdout);
        while (fgets(line, sizeof line, stdin) != NULL) {}
        return 0;
    }
    if (!strcmp(cmd, "asyncalloc")) {
        CUdeviceptr p;
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        CUresult r = cuMemAllocAsync(&p, strtoull(argv[2], NULL, 10), stream0);
        if (r == CUDA_SUCCESS) r = cuStreamSynchronize(stream0);
        clock_gettime(CLOCK_MONOTONIC, &b);
        printf("R timed=%d asked=%lld done=%lld\n", r,
               (long long)a.tv_sec * 1000000000LL + a.tv_nsec,
               (long long)b.tv_sec * 1000000000LL + b.tv_nsec);
        return 0;
    }
    if (!strcmp(cmd, "meminfo")) {
        size_t f = 0, t = 0, dt = 0;
        CUdevice dev;
        CHECK(cuMemGetInfo_v2(&f, &t));
        CHECK(cuCtxGetDevice(&dev));
        CHECK(cuDeviceTotalMem_v2(&dt, dev));
        printf("R free=%zu total=%zu devtotal=%zu\n", f, t, dt);
        return 0;
    }
    if (!strcmp(cmd, "serve")) return serve(strtoull(argv[2], NULL, 10));
    if (!strcmp(cmd, "hold")) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, strtoull(argv[2], NULL, 10)));
        printf("R held\n");
        for (;;) pause();
    }
    return 2;
}
