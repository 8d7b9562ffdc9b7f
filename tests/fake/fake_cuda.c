/*
 * cuslice fake driver: libcuda.so.1 backed by host memory, with a simulated
 * GPU timeline. Written for cuslice's tests (CI has no GPU); see README.md
 * beside this file for what it simulates and how.
 *
 * Rules this file keeps:
 * - Every exported function is a real CUDA 13 driver entry point with the
 *   real signature; the compiler checks each definition against
 *   cuslice_cuda.h / fake_extra.h.
 * - Exported functions never call each other: they all go through static
 *   helpers. A preloaded shim interposes on the exported names, and an
 *   internal call through one (cuMemAlloc -> cuMemAlloc_v2) would be
 *   counted twice.
 * - cuGetProcAddress answers from a static table built from the same list
 *   as the exports, holding the addresses of hidden aliases of the exported
 *   functions: the same addresses dlsym(handle, name) returns, and never the
 *   preloaded shim's.
 * - One process-wide mutex guards the process-local tables. It is never
 *   held while sleeping. The simulated timeline, shared by all processes,
 *   has its own process-shared robust mutex in the state, taken after it.
 */
#define _GNU_SOURCE
#include "fake_common.h"
#include "fake_extra.h"

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <sys/syscall.h>

#define WHO "fake libcuda"

#define P(x) ((unsigned long long)(uintptr_t)(x))

/* ==== handle objects =================================================== */

enum {
    MAGIC_CTX = 0x43545831,
    MAGIC_STREAM = 0x53545231,
    MAGIC_EVENT = 0x45564e31,
    MAGIC_MOD = 0x4d4f4431,
    MAGIC_FUNC = 0x46554e31,
    MAGIC_GRAPH = 0x47524131,
    MAGIC_EXEC = 0x45584531,
    MAGIC_POOL = 0x504f4f31,
    MAGIC_ARRAY = 0x41525231,
    MAGIC_MIPMAP = 0x4d495031,
    MAGIC_DEAD = 0x44454144
};

struct CUgraph_st {
    uint32_t magic;
    uint64_t total_ns; /* sum of the captured launches' durations */
    uint64_t kernels;  /* number of captured kernels */
};

struct CUgraphExec_st {
    uint32_t magic;
    uint64_t total_ns;
    uint64_t kernels;
};

struct CUctx_st;
struct CUevent_st;

/* A position in a context's timeline queue (see "==== timeline"): done once
 * queue `q` has retired its first `mark` items, or was dropped (its epoch
 * moved on). mark 0: nothing to wait for. */
struct tl_pos {
    int q;
    uint64_t epoch;
    uint64_t mark;
};

struct CUstream_st {
    uint32_t magic;
    uint32_t id; /* its CUPTI streamId (fake_cupti.c's records) */
    struct CUctx_st *ctx;
    uint64_t gen; /* ctx->gen at creation: a reset context invalidates its streams */
    unsigned flags;
    struct tl_pos pos; /* after the last work queued on this stream */
    int capturing;
    struct CUgraph_st *capture;
};

struct CUctx_st {
    uint32_t magic;
    uint32_t id; /* its CUPTI contextId, new at each activation (fake_cupti.c's records) */
    int dev;
    int primary;
    int active;        /* holds FAKE_CUDA_CTX_OVERHEAD of device memory */
    unsigned refcount; /* primary contexts only */
    uint64_t gen;      /* bumped each time the context is torn down */
    int q;             /* its timeline queue (all its streams share it), -1: none yet */
    uint64_t qepoch;   /* that queue's epoch when this context took it */
    struct CUevent_st *tev; /* timing events recorded here whose time is not known yet */
    struct CUstream_st dstream; /* NULL / CU_STREAM_LEGACY / CU_STREAM_PER_THREAD */
    struct CUctx_st *next_created;
};

struct CUevent_st {
    uint32_t magic;
    unsigned flags;
    struct CUctx_st *ctx; /* where it was created */
    int recorded;
    int resolved;         /* complete, and `time` is known */
    int dev;              /* device of the stream it was recorded on */
    struct CUctx_st *rctx;/* context it was last recorded in */
    struct tl_pos pos;    /* the recording stream's position at record time */
    uint64_t rec_ns;      /* when it was recorded */
    uint64_t time;        /* once resolved: when it completed */
    struct CUevent_st *tprev, *tnext; /* in rctx->tev while unresolved (timing events only) */
};

enum { FK_DEFAULT, FK_SLEEP, FK_EMPTY };

struct CUfunc_st {
    uint32_t magic;
    int kind;
    struct CUfunc_st *next;
    char name[96];
};

struct CUmod_st {
    uint32_t magic;
    struct CUctx_st *ctx;
    struct CUfunc_st *funcs;
};

struct CUmemPoolHandle_st {
    uint32_t magic;
    int dev;
    uint64_t reserved; /* counted device-wide */
    uint64_t used;     /* handed out to live allocations */
    uint64_t threshold;
    uint64_t reserved_high;
    uint64_t used_high;
    int reuse[3];
};

struct CUarray_st {
    uint32_t magic;
    int dev;
    struct CUctx_st *ctx;
    uint64_t bytes;
    struct CUarray_st *next;
};

struct CUmipmappedArray_st {
    uint32_t magic;
    int dev;
    struct CUctx_st *ctx;
    uint64_t bytes;
    struct CUmipmappedArray_st *next;
};

/* Linear allocations, by address. */
enum { AK_DEV = 1, AK_ASYNC, AK_HOST };

struct alloc {
    uintptr_t ptr;
    uint64_t size;
    uint64_t charged; /* device memory it takes (AK_DEV: size in whole pages if at least one) */
    size_t map_len;
    int dev;
    int kind;
    struct CUctx_st *ctx;
    struct alloc *next;
};

#define NBUCKET 4096

/* VMM: physical allocations live in one sparse memfd so that mappings of
 * the same handle alias like real device memory. */
struct vmm_phys {
    CUmemGenericAllocationHandle id;
    int dev;
    uint64_t size;
    off_t off;
    size_t span;
    unsigned refs; /* 1 for the handle until cuMemRelease, +1 per mapping */
    int released;
    struct vmm_phys *next;
};

struct vmm_resv {
    uintptr_t base;
    size_t size;
    size_t map_len;
    struct vmm_resv *next;
};

struct vmm_map {
    uintptr_t va;
    size_t size;
    struct vmm_phys *ph;
    struct vmm_map *next;
};

/* ==== process state ==================================================== */

static struct fake_config g_cfg;
static struct fake_state *S;
static int g_state_fd = -1; /* our own open file description: holds our slot's lock */
static int g_slot = -1;     /* -1: not claimed yet; -2: none available */
static atomic_int g_init_ok;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static struct CUctx_st g_primary[FAKE_MAX_DEVICES];
static struct CUctx_st *g_created; /* every context made by cuCtxCreate*, live or dead */
static struct CUmemPoolHandle_st g_pools[FAKE_MAX_DEVICES];
static struct alloc *g_alloc[NBUCKET];
static struct CUarray_st *g_arrays;
static struct CUmipmappedArray_st *g_mipmaps;
static struct vmm_phys *g_phys;
static struct vmm_resv *g_resv;
static struct vmm_map *g_maps;
static int g_vmm_fd = -1;
static off_t g_vmm_next;
static CUmemGenericAllocationHandle g_vmm_next_id = 0x1000;
static uint32_t g_ctx_ids, g_stream_ids; /* the last CUPTI contextId / streamId given (under g_mu) */

#define CTX_STACK_MAX 64
static __thread struct CUctx_st *t_stack[CTX_STACK_MAX];
static __thread int t_depth;

#define VMM_ARENA_SIZE ((off_t)1 << 46)

static void fork_prepare(void) { pthread_mutex_lock(&g_mu); }
static void fork_parent(void) { pthread_mutex_unlock(&g_mu); }
static void fork_child(void);

static void pools_reset(void)
{
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        memset(&g_pools[d], 0, sizeof g_pools[d]);
        g_pools[d].magic = MAGIC_POOL;
        g_pools[d].dev = d;
        g_pools[d].reuse[0] = g_pools[d].reuse[1] = g_pools[d].reuse[2] = 1;
    }
}

static void process_setup(void)
{
    fake_config_load(&g_cfg, WHO);
    int fd;
    if (g_cfg.state_path != NULL) {
        fd = open(g_cfg.state_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) {
            fprintf(stderr, "%s: FAKE_CUDA_STATE=\"%s\": %s\n", WHO, g_cfg.state_path, strerror(errno));
            abort();
        }
    } else if ((fd = fake_private_state_find()) < 0) {
        /* (the fake libcupti may have created it first: found above) */
        fd = memfd_create(FAKE_PRIVATE_MEMFD_NAME, MFD_CLOEXEC);
        if (fd < 0) {
            fprintf(stderr, "%s: memfd_create: %s\n", WHO, strerror(errno));
            abort();
        }
    }
    S = fake_state_map_fd(fd);
    if (S == NULL) {
        fprintf(stderr, "%s: cannot map the state (%s): %s\n", WHO,
                g_cfg.state_path ? g_cfg.state_path : "memfd", strerror(errno));
        abort();
    }
    g_state_fd = fd;
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        g_primary[d].magic = MAGIC_CTX;
        g_primary[d].dev = d;
        g_primary[d].primary = 1;
    }
    pools_reset();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static inline void setup(void) { pthread_once(&g_once, process_setup); }

/* ---- call log --------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static void flog(const char *name, CUresult r, const char *fmt, ...)
{
    if (g_cfg.log_fd < 0)
        return;
    char res[16];
    snprintf(res, sizeof res, "%d", (int)r);
    va_list ap;
    va_start(ap, fmt);
    fake_log_result(g_cfg.log_fd, name, res, fmt, ap);
    va_end(ap);
}

static void flog0(const char *name, CUresult r)
{
    if (g_cfg.log_fd < 0)
        return;
    char res[16];
    snprintf(res, sizeof res, "%d", (int)r);
    fake_log(g_cfg.log_fd, name, res, NULL);
}

#define LOGR(r, ...) flog(__func__, (r), __VA_ARGS__)
#define LOGR0(r) flog0(__func__, (r))

/* A printable, space-free copy of a caller's string for the log. */
static const char *log_str(const char *s, char *buf, size_t cap)
{
    if (s == NULL)
        return "(null)";
    size_t i = 0;
    for (; s[i] != '\0' && i + 1 < cap; i++)
        buf[i] = (s[i] > ' ' && s[i] < 0x7f) ? s[i] : '?';
    buf[i] = '\0';
    return buf;
}

/* ---- checks ----------------------------------------------------------- */

#define NEED_INIT()                                                                                                \
    do {                                                                                                           \
        if (!atomic_load(&g_init_ok))                                                                              \
            return CUDA_ERROR_NOT_INITIALIZED;                                                                     \
    } while (0)

/* Not-initialised wins over argument checks, as in the real driver. */
#define INIT_OR(expr) (atomic_load(&g_init_ok) ? (expr) : CUDA_ERROR_NOT_INITIALIZED)

static bool dev_ok(CUdevice d) { return d >= 0 && (unsigned)d < g_cfg.ndev; }

static struct CUctx_st *cur_ctx(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

static bool ctx_usable(const struct CUctx_st *c) { return c != NULL && c->magic == MAGIC_CTX && c->active; }

/* Caller holds g_mu. */
static CUresult need_ctx(struct CUctx_st **out)
{
    struct CUctx_st *c = cur_ctx();
    if (!ctx_usable(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *out = c;
    return CUDA_SUCCESS;
}

static bool is_special_stream(CUstream h) { return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD; }

/* Caller holds g_mu and has a usable current context `c`. */
static CUresult resolve_stream(struct CUctx_st *c, CUstream h, struct CUstream_st **out)
{
    if (is_special_stream(h)) {
        *out = &c->dstream;
        return CUDA_SUCCESS;
    }
    if (h->magic != MAGIC_STREAM)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!ctx_usable(h->ctx) || h->gen != h->ctx->gen)
        return CUDA_ERROR_INVALID_HANDLE;
    *out = h;
    return CUDA_SUCCESS;
}

/* ==== device memory accounting ========================================= */

/* Fetch-add on the device-wide counter, rolled back when over the total.
 * Before failing, gives back the memory of dead processes and retries. */
static int acct_reserve(int dev, uint64_t bytes)
{
    if (bytes == 0)
        return 0;
    if (bytes > g_cfg.mem_total)
        return -1;
    struct fake_dev_state *d = &S->dev[dev];
    for (int attempt = 0; attempt < 2; attempt++) {
        uint64_t prev = atomic_fetch_add(&d->used_bytes, bytes);
        if (prev <= g_cfg.mem_total - bytes) {
            if (g_slot >= 0)
                atomic_fetch_add(&S->slot[g_slot].used[dev], bytes);
            return 0;
        }
        atomic_fetch_sub(&d->used_bytes, bytes);
        if (attempt == 0)
            fake_state_reclaim_dead(S, g_state_fd, g_slot);
    }
    return -1;
}

static void acct_release(int dev, uint64_t bytes)
{
    if (bytes == 0)
        return;
    if (g_slot >= 0)
        atomic_fetch_sub(&S->slot[g_slot].used[dev], bytes);
    atomic_fetch_sub(&S->dev[dev].used_bytes, bytes);
}

static uint64_t dev_used(int dev)
{
    uint64_t u = atomic_load(&S->dev[dev].used_bytes);
    return u > g_cfg.mem_total ? g_cfg.mem_total : u;
}

/* ==== linear allocation table ========================================== */

static size_t bucket_of(uintptr_t p) { return (size_t)((((uint64_t)p >> 12) * 0x9E3779B97F4A7C15ull) >> 52); }

static void alloc_insert(struct alloc *a)
{
    size_t b = bucket_of(a->ptr);
    a->next = g_alloc[b];
    g_alloc[b] = a;
}

static struct alloc *alloc_find(uintptr_t p)
{
    for (struct alloc *a = g_alloc[bucket_of(p)]; a; a = a->next)
        if (a->ptr == p)
            return a;
    return NULL;
}

static void alloc_unlink(struct alloc *a)
{
    struct alloc **pp = &g_alloc[bucket_of(a->ptr)];
    while (*pp && *pp != a)
        pp = &(*pp)->next;
    if (*pp)
        *pp = a->next;
}

static void *map_backing(size_t len, bool low32)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (low32) {
#ifdef MAP_32BIT
        flags |= MAP_32BIT;
#else
        return NULL;
#endif
    }
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    if (low32 && (uint64_t)(uintptr_t)p + len > 0xffffffffull) {
        munmap(p, len);
        return NULL;
    }
    return p;
}

/* Caller holds g_mu. Frees one table entry and credits its memory back. */
static void alloc_drop(struct alloc *a)
{
    alloc_unlink(a);
    munmap((void *)a->ptr, a->map_len);
    if (a->kind == AK_DEV) {
        acct_release(a->dev, a->charged);
    } else if (a->kind == AK_ASYNC) {
        struct CUmemPoolHandle_st *p = &g_pools[a->dev];
        p->used -= a->size < p->used ? a->size : p->used;
    }
    free(a);
}

/* Caller holds g_mu. Allocates `size` bytes of counted device memory on the
 * current context's device. */
static CUresult dev_alloc_locked(uintptr_t *out, uint64_t size, bool low32, int kind)
{
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r != CUDA_SUCCESS)
        return r;
    /* Whole pages for an allocation of at least one page; a smaller one is
     * sub-allocated (counted as asked: the shared page is not modelled). */
    uint64_t g = g_cfg.granularity, take = size;
    if (kind == AK_DEV && size >= g) {
        take = (size + g - 1) & ~(g - 1);
        if (take < size)
            return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (kind != AK_HOST && acct_reserve(c->dev, take) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = map_backing((size_t)size, low32);
    struct alloc *a = p ? calloc(1, sizeof *a) : NULL;
    if (a == NULL) {
        if (p)
            munmap(p, (size_t)size);
        if (kind != AK_HOST)
            acct_release(c->dev, take);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->ptr = (uintptr_t)p;
    a->size = size;
    a->charged = take;
    a->map_len = (size_t)size;
    a->dev = c->dev;
    a->kind = kind;
    a->ctx = c;
    alloc_insert(a);
    *out = (uintptr_t)p;
    return CUDA_SUCCESS;
}

static CUresult mem_alloc(uintptr_t *out, uint64_t size, bool low32)
{
    NEED_INIT();
    if (out == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = dev_alloc_locked(out, size, low32, AK_DEV);
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult mem_free(uintptr_t p)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS) {
        struct alloc *a = alloc_find(p);
        if (a == NULL || a->kind == AK_HOST)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            alloc_drop(a);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Caller holds g_mu. Is [p, p+n) inside one live allocation or mapping? */
static bool range_ok(uintptr_t p, size_t n)
{
    if (n == 0)
        return true;
    if (p + n < p)
        return false;
    for (size_t b = 0; b < NBUCKET; b++)
        for (struct alloc *a = g_alloc[b]; a; a = a->next)
            if (p >= a->ptr && p + n <= a->ptr + a->size)
                return true;
    for (struct vmm_map *m = g_maps; m; m = m->next)
        if (p >= m->va && p + n <= m->va + m->size)
            return true;
    return false;
}

/* ==== pools ============================================================ */

static void pool_note_high(struct CUmemPoolHandle_st *p)
{
    if (p->reserved > p->reserved_high)
        p->reserved_high = p->reserved;
    if (p->used > p->used_high)
        p->used_high = p->used;
}

/* Caller holds g_mu. */
static void pool_trim_locked(struct CUmemPoolHandle_st *p, uint64_t keep)
{
    uint64_t floor = p->used > keep ? p->used : keep;
    if (p->reserved > floor) {
        acct_release(p->dev, p->reserved - floor);
        p->reserved = floor;
    }
}

/* Like the real driver: at a synchronisation, every pool of the device
 * gives back its reserve above max(used, release threshold). */
static void sync_trim(int dev)
{
    pthread_mutex_lock(&g_mu);
    if (dev >= 0 && dev < FAKE_MAX_DEVICES)
        pool_trim_locked(&g_pools[dev], g_pools[dev].threshold);
    pthread_mutex_unlock(&g_mu);
}

static bool pool_ok(CUmemoryPool p)
{
    return p != NULL && p >= &g_pools[0] && p < &g_pools[FAKE_MAX_DEVICES] && p->magic == MAGIC_POOL &&
           dev_ok(p->dev);
}

static CUresult pool_alloc(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream hs, bool default_pool)
{
    NEED_INIT();
    if (dptr == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r != CUDA_SUCCESS)
        goto out;
    if (default_pool)
        pool = &g_pools[s->ctx->dev];
    else if (!pool_ok(pool)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    uint64_t spare = pool->reserved - pool->used;
    if (spare < size) {
        uint64_t need = size - spare;
        if (acct_reserve(pool->dev, need) != 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        pool->reserved += need;
    }
    void *p = map_backing(size, false);
    struct alloc *a = p ? calloc(1, sizeof *a) : NULL;
    if (a == NULL) {
        if (p)
            munmap(p, size);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    pool->used += size;
    pool_note_high(pool);
    a->ptr = (uintptr_t)p;
    a->size = size;
    a->map_len = size;
    a->dev = pool->dev;
    a->kind = AK_ASYNC;
    a->ctx = c;
    alloc_insert(a);
    *dptr = (CUdeviceptr)(uintptr_t)p;
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult pool_free(CUdeviceptr dptr, CUstream hs)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r == CUDA_SUCCESS) {
        struct alloc *a = alloc_find((uintptr_t)dptr);
        if (a == NULL || a->kind == AK_HOST)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            alloc_drop(a); /* async: back to its pool, still reserved */
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* ==== arrays =========================================================== */

static unsigned format_size(CUarray_format f)
{
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        return 0;
    }
}

static bool array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned nch, uint64_t *out)
{
    unsigned es = format_size(f);
    if (es == 0 || w == 0 || (nch != 1 && nch != 2 && nch != 4))
        return false;
    uint64_t v = w;
    if (__builtin_mul_overflow(v, (uint64_t)(h ? h : 1), &v) || __builtin_mul_overflow(v, (uint64_t)(d ? d : 1), &v) ||
        __builtin_mul_overflow(v, (uint64_t)nch * es, &v))
        return false;
    *out = v;
    return true;
}

static CUresult array_create(CUarray *ph, size_t w, size_t h, size_t d, CUarray_format f, unsigned nch)
{
    NEED_INIT();
    uint64_t bytes;
    if (ph == NULL || !array_bytes(w, h, d, f, nch, &bytes))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS) {
        struct CUarray_st *a = calloc(1, sizeof *a);
        if (a == NULL || acct_reserve(c->dev, bytes) != 0) {
            free(a);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            a->magic = MAGIC_ARRAY;
            a->dev = c->dev;
            a->ctx = c;
            a->bytes = bytes;
            a->next = g_arrays;
            g_arrays = a;
            *ph = a;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Caller holds g_mu. */
static void array_drop(struct CUarray_st *a)
{
    struct CUarray_st **pp = &g_arrays;
    while (*pp && *pp != a)
        pp = &(*pp)->next;
    if (*pp)
        *pp = a->next;
    acct_release(a->dev, a->bytes);
    a->magic = MAGIC_DEAD;
    free(a);
}

static void mipmap_drop(struct CUmipmappedArray_st *m)
{
    struct CUmipmappedArray_st **pp = &g_mipmaps;
    while (*pp && *pp != m)
        pp = &(*pp)->next;
    if (*pp)
        *pp = m->next;
    acct_release(m->dev, m->bytes);
    m->magic = MAGIC_DEAD;
    free(m);
}

/* ==== contexts ========================================================= */

static void tl_ctx_teardown(struct CUctx_st *c);

/* Caller holds g_mu. Takes the context's overhead and readies its default
 * stream. */
static CUresult ctx_activate(struct CUctx_st *c)
{
    if (acct_reserve(c->dev, g_cfg.ctx_overhead) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (g_slot >= 0)
        atomic_fetch_add(&S->slot[g_slot].ctxs[c->dev], 1);
    c->active = 1;
    c->q = -1;
    c->tev = NULL;
    memset(&c->dstream, 0, sizeof c->dstream);
    c->dstream.magic = MAGIC_STREAM;
    c->dstream.ctx = c;
    c->dstream.gen = c->gen;
    c->id = ++g_ctx_ids;
    c->dstream.id = ++g_stream_ids;
    return CUDA_SUCCESS;
}

/* Caller holds g_mu. Frees everything the context owns (like the real
 * driver on cuCtxDestroy / primary reset) and gives its overhead back. */
static void ctx_teardown(struct CUctx_st *c)
{
    if (!c->active)
        return;
    for (size_t b = 0; b < NBUCKET; b++) {
        struct alloc *a = g_alloc[b];
        while (a) {
            struct alloc *n = a->next;
            if (a->ctx == c)
                alloc_drop(a);
            a = n;
        }
    }
    for (struct CUarray_st *a = g_arrays, *n; a; a = n) {
        n = a->next;
        if (a->ctx == c)
            array_drop(a);
    }
    for (struct CUmipmappedArray_st *m = g_mipmaps, *n; m; m = n) {
        n = m->next;
        if (m->ctx == c)
            mipmap_drop(m);
    }
    if (c->dstream.capture)
        free(c->dstream.capture);
    c->dstream.magic = MAGIC_DEAD;
    tl_ctx_teardown(c);
    acct_release(c->dev, g_cfg.ctx_overhead);
    if (g_slot >= 0 && atomic_load(&S->slot[g_slot].ctxs[c->dev]) > 0)
        atomic_fetch_sub(&S->slot[g_slot].ctxs[c->dev], 1);
    c->active = 0;
    c->gen++;
    pool_trim_locked(&g_pools[c->dev], g_pools[c->dev].threshold);
}

static CUresult ctx_create(CUcontext *pctx, CUdevice dev)
{
    NEED_INIT();
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (t_depth >= CTX_STACK_MAX) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (c == NULL) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    c->magic = MAGIC_CTX;
    c->dev = dev;
    r = ctx_activate(c);
    if (r != CUDA_SUCCESS) {
        free(c);
        goto out;
    }
    c->next_created = g_created;
    g_created = c;
    t_stack[t_depth++] = c;
    *pctx = c;
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult ctx_destroy(CUcontext c)
{
    NEED_INIT();
    if (c == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (c->magic != MAGIC_CTX || c->primary || !c->active) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else {
        ctx_teardown(c);
        c->magic = MAGIC_DEAD; /* kept allocated: other threads may still hold it */
        int j = 0;
        for (int i = 0; i < t_depth; i++)
            if (t_stack[i] != c)
                t_stack[j++] = t_stack[i];
        t_depth = j;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult primary_release(CUdevice dev)
{
    NEED_INIT();
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    struct CUctx_st *c = &g_primary[dev];
    if (c->refcount == 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->refcount == 0) {
        ctx_teardown(c);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult primary_reset(CUdevice dev)
{
    NEED_INIT();
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c = &g_primary[dev];
    ctx_teardown(c);
    c->refcount = 0;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

static CUresult ctx_push(CUcontext c)
{
    NEED_INIT();
    if (c == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (c->magic != MAGIC_CTX)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (t_depth >= CTX_STACK_MAX)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        t_stack[t_depth++] = c;
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult ctx_pop(CUcontext *pctx)
{
    NEED_INIT();
    if (t_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *c = t_stack[--t_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

/* ==== timeline ========================================================= *
 *
 * The model, as measured on an H100 without MPS: a device runs one context
 * at a time, each context's work in submission order (all its streams share
 * one FIFO), and time-slices between contexts that have work: the running
 * context keeps the device while it has work, but once it has had it for
 * FAKE_CUDA_TIMESLICE_NS and another context has pending work, the device
 * goes to the next context with work (round robin) at the next kernel
 * boundary. Kernels are never preempted mid-way (a real GPU can preempt
 * them; the fake keeps kernels whole so that durations stay exact). A
 * context whose queue empties gives the device up at once.
 *
 * The queues live in the shared state (struct fake_timeline), so contexts
 * of all processes compete. Completion times depend on what other contexts
 * submit later, so nothing is fixed at submit time: every call that
 * launches or looks (sync, query, events) first advances the device's
 * simulation to "now" (read under the mutex, so it never goes back), and
 * a waiter sleeps until its target would complete if nothing else were
 * submitted, then checks again (new work elsewhere can only delay it).
 *
 * Lock order: g_mu, then TL->mu. TL->mu is never held while sleeping. */

#include "fake_timeline.h"

/* Caller holds TL->mu, device advanced to `now`. When queue qi would have
 * retired its first `mark` items if nothing more were submitted (0: never;
 * cannot happen for a live queue). */
static uint64_t tl_project(int dev, int qi, uint64_t mark, uint64_t now)
{
    struct fake_tl_dev d = TL->dev[dev];
    uint64_t head[NQ], started[NQ];
    for (int i = 0; i < NQ; i++) {
        head[i] = TL->q[i].head;
        started[i] = TL->q[i].started_ns;
    }
    struct tl_view v = {&d, head, started, 1, false, now};
    return tl_run(&v, dev, UINT64_MAX, qi, mark);
}

/* Caller holds TL->mu. */
static bool tl_pos_done(const struct tl_pos *p)
{
    if (p->mark == 0 || p->q < 0 || p->q >= NQ)
        return true;
    const struct fake_tl_queue *q = &TL->q[p->q];
    return q->epoch != p->epoch || q->head >= p->mark;
}

/* Sleeps until `p` (a position in a queue of device `dev`) is done. Called
 * without g_mu: `p` is a copy, and a dropped queue counts as done. */
static void tl_wait(int dev, struct tl_pos p)
{
    if (p.mark == 0)
        return;
    for (;;) {
        tl_lock();
        uint64_t now = fake_now_ns();
        tl_advance(dev, now);
        bool done = tl_pos_done(&p);
        uint64_t until = done ? 0 : tl_project(dev, p.q, p.mark, now);
        tl_unlock();
        if (done)
            return;
        fake_sleep_until_ns(until > now ? until : now + 1000000);
    }
}

/* Caller holds g_mu and TL->mu. The context's queue, or NULL (none yet, or
 * dropped, which happens only if we were taken for dead). */
static struct fake_tl_queue *ctx_queue(struct CUctx_st *c)
{
    if (c->q < 0)
        return NULL;
    struct fake_tl_queue *q = &TL->q[c->q];
    if (q->epoch != c->qepoch || q->dev != c->dev) {
        c->q = -1;
        return NULL;
    }
    return q;
}

/* Caller holds g_mu and TL->mu. The position after everything the context
 * has submitted. */
static struct tl_pos ctx_pos(struct CUctx_st *c)
{
    struct tl_pos p = {-1, 0, 0};
    struct fake_tl_queue *q = ctx_queue(c);
    if (q != NULL) {
        p.q = c->q;
        p.epoch = q->epoch;
        p.mark = q->tail;
    }
    return p;
}

/* Caller holds TL->mu. Takes a free queue for the calling process (a dead
 * process's queue if none is free). -1: all taken. */
static int tl_queue_take(int dev, uint64_t now)
{
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < NQ; i++) {
            struct fake_tl_queue *q = &TL->q[i];
            if (q->dev >= 0) {
                if (pass == 0 || tl_alive(i, now, true))
                    continue;
                tl_drop(i, now);
            }
            q->owner = g_slot >= 0 ? g_slot : -1;
            q->owner_gen = g_slot >= 0 ? atomic_load(&S->slot[g_slot].gen) : 0;
            q->head = q->tail = 0;
            q->started_ns = 0;
            q->checked_ns = 0; /* first probe by another process: at once */
            q->epoch++;
            q->dev = dev; /* last: a process killed before this leaves the queue free */
            return i;
        }
    }
    return -1;
}

/* ---- events' times ---- */

/* Caller holds g_mu. */
static void ev_unlink(struct CUevent_st *e)
{
    if (e->rctx == NULL)
        return;
    if (e->tprev != NULL)
        e->tprev->tnext = e->tnext;
    else if (e->rctx->tev == e)
        e->rctx->tev = e->tnext;
    if (e->tnext != NULL)
        e->tnext->tprev = e->tprev;
    e->tprev = e->tnext = NULL;
}

static void ev_resolve(struct CUevent_st *e, uint64_t t)
{
    e->time = max_u64(e->rec_ns, t);
    e->resolved = 1;
    ev_unlink(e);
}

/* Caller holds g_mu and TL->mu, e's device advanced to `now`. Is e
 * complete? Resolves its time when it is: the end of the stream's last item
 * at record time (still in the ring: see ev_before_overwrite), or the record
 * time if that was already done. */
static bool ev_complete(struct CUevent_st *e, uint64_t now)
{
    if (!e->recorded || e->resolved)
        return true;
    if (e->pos.mark == 0 || e->pos.q < 0 || e->pos.q >= NQ) {
        ev_resolve(e, e->rec_ns);
        return true;
    }
    const struct fake_tl_queue *q = &TL->q[e->pos.q];
    if (q->epoch != e->pos.epoch) { /* its context is gone */
        ev_resolve(e, now);
        return true;
    }
    if (q->head < e->pos.mark)
        return false;
    ev_resolve(e, q->ring[(e->pos.mark - 1) % RING].t);
    return true;
}

/* Caller holds g_mu and TL->mu. Item `p` of c's queue (retired) is about to
 * be overwritten: timing events ending there take their time now. */
static void ev_before_overwrite(struct CUctx_st *c, const struct fake_tl_queue *q, uint64_t p)
{
    for (struct CUevent_st *e = c->tev, *n; e != NULL; e = n) {
        n = e->tnext;
        if (e->pos.q == c->q && e->pos.epoch == q->epoch && e->pos.mark <= p + 1)
            ev_resolve(e, e->pos.mark == p + 1 ? q->ring[p % RING].t : e->rec_ns);
    }
}

/* Caller holds g_mu. The context is torn down: resolve its events, drop its
 * queue (its pending work is discarded, as the real driver kills the work
 * of a destroyed context). */
static void tl_ctx_teardown(struct CUctx_st *c)
{
    if (c->q < 0 && c->tev == NULL)
        return;
    tl_lock();
    uint64_t now = fake_now_ns();
    tl_advance(c->dev, now);
    while (c->tev != NULL)
        if (!ev_complete(c->tev, now))
            ev_resolve(c->tev, now);
    if (ctx_queue(c) != NULL)
        tl_drop(c->q, now);
    tl_unlock();
    c->q = -1;
}

/* ---- the fake CUPTI's recording flag ---- *
 *
 * fake_cupti.c (libcupti.so.13, a separate library that exports only
 * cupti*) claims an entry of S->cupti for its process and sets the kinds it
 * records there; a launch marks its ring item with that entry, and the item
 * leaves its record there when it retires (fake_timeline.h). This process's
 * entry is found by who we are (pid, PID namespace, start time) and looked
 * up again whenever an entry is claimed anywhere (the epoch moves). */
static uint64_t g_cupti_epoch; /* S->cupti.epoch at the last lookup */
static int g_cupti_idx = -1;   /* our entry, -1: none */
static uint32_t g_cupti_gen;   /* its gen then */
static int32_t g_self_pid;     /* 0: who we are is not known yet (reset in a forked child) */
static uint64_t g_self_pidns, g_self_start;

/* Caller holds g_mu and TL->mu. Marks item `it` for a record if this
 * process's fake CUPTI records kernels now. */
static void cupti_mark(struct fake_tl_item *it)
{
    it->cupti = 0;
    it->kind = 0;
    it->cupti_gen = 0;
    struct fake_cupti *C = &S->cupti;
    if (g_self_pid == 0) {
        g_self_pid = (int32_t)getpid();
        g_self_pidns = fake_pidns("self");
        g_self_start = fake_start_ticks("self");
        g_cupti_idx = -1;
        g_cupti_epoch = C->epoch - 1; /* look up now */
    }
    if (C->epoch != g_cupti_epoch) {
        g_cupti_epoch = C->epoch;
        g_cupti_idx = -1;
        for (int i = 0; i < FAKE_CUPTI_PROCS; i++) {
            const struct fake_cupti_proc *p = &C->p[i];
            if (p->pid == g_self_pid && p->pidns == g_self_pidns && p->start_ticks == g_self_start) {
                g_cupti_idx = i;
                g_cupti_gen = p->gen;
                break;
            }
        }
    }
    if (g_cupti_idx < 0)
        return;
    const struct fake_cupti_proc *p = &C->p[g_cupti_idx];
    if (p->gen != g_cupti_gen)
        return;
    uint16_t kind = (p->kinds & (1u << 10)) ? 10 : (p->kinds & (1u << 3)) ? 3 : 0;
    if (kind == 0)
        return;
    it->cupti = (uint16_t)(g_cupti_idx + 1);
    it->kind = kind;
    it->cupti_gen = g_cupti_gen;
}

/* Caller holds g_mu. Puts `d` ns of work on stream `s` (a capturing stream
 * records instead). CUDA_ERROR_NOT_READY: the context's ring is full; retry
 * at *retry, without g_mu held meanwhile (a real push buffer blocks too).
 * CUDA_ERROR_OUT_OF_MEMORY: no queue is left in the shared pool. */
static CUresult submit_locked(struct CUstream_st *s, uint64_t d, uint64_t kernels, bool graph, uint64_t *retry)
{
    if (s->capturing) {
        s->capture->total_ns += d;
        s->capture->kernels += kernels;
        return CUDA_SUCCESS;
    }
    struct CUctx_st *c = s->ctx;
    int dev = c->dev;
    struct fake_dev_state *DS = &S->dev[dev];
    tl_lock();
    uint64_t now = fake_now_ns();
    tl_advance(dev, now);
    struct fake_tl_dev *D = &TL->dev[dev];
    struct fake_tl_queue *q = ctx_queue(c);
    if (d == 0 && ((q != NULL && q->head < q->tail) || D->npending == 0)) {
        /* Zero-length work completes with the item before it, or at once
         * on an idle device: nothing to queue (keeps empty launches cheap). */
        s->pos = ctx_pos(c);
        goto counted;
    }
    if (q == NULL) {
        int i = tl_queue_take(dev, now);
        if (i < 0) {
            tl_unlock();
            static atomic_int told;
            if (!atomic_exchange(&told, 1))
                fprintf(stderr, "%s: all %d timeline queues are taken by live contexts; launch refused\n", WHO,
                        NQ);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        c->q = i;
        c->qepoch = TL->q[i].epoch;
        q = &TL->q[i];
    }
    if (q->tail - q->head >= RING) {
        *retry = tl_project(dev, c->q, q->head + 1, now);
        tl_unlock();
        if (*retry <= now)
            *retry = now + 1000000;
        return CUDA_ERROR_NOT_READY;
    }
    if (q->tail >= RING && c->tev != NULL)
        ev_before_overwrite(c, q, q->tail - RING);
    struct fake_tl_item *it = &q->ring[q->tail % RING];
    it->ns = d;
    it->t = now;
    it->ctx_id = c->id;
    it->stream_id = s->id;
    cupti_mark(it);
    if (q->head == q->tail)
        D->npending++;
    q->tail++;
    s->pos = ctx_pos(c);
    uint64_t bu = atomic_load(&DS->busy_until_ns);
    atomic_store(&DS->busy_until_ns, add_sat(max_u64(bu, now), d));
counted:
    tl_unlock();
    atomic_fetch_add(&DS->busy_ns_total, d);
    atomic_fetch_add(&DS->kernels_run, kernels);
    atomic_fetch_add(&DS->launches, 1);
    if (graph)
        atomic_fetch_add(&DS->graph_launches, 1);
    return CUDA_SUCCESS;
}

static bool func_ok(CUfunction f) { return f != NULL && f->magic == MAGIC_FUNC; }

/* Duration of one launch of f. A "sleep*" kernel reads its first parameter
 * (unsigned long long ns) from kernelParams[0] or from the start of a
 * CU_LAUNCH_PARAM_BUFFER_POINTER buffer. */
static CUresult kernel_ns(CUfunction f, void **params, void **extra, uint64_t *out)
{
    switch (f->kind) {
    case FK_EMPTY:
        *out = 0;
        return CUDA_SUCCESS;
    case FK_SLEEP:
        if (params != NULL && params[0] != NULL) {
            *out = *(const unsigned long long *)params[0];
            return CUDA_SUCCESS;
        }
        if (extra != NULL) {
            void *buf = NULL;
            size_t size = 0;
            for (int i = 0; extra[i] != CU_LAUNCH_PARAM_END && i < 64; i += 2) {
                if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
                    buf = extra[i + 1];
                else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != NULL)
                    size = *(size_t *)extra[i + 1];
            }
            if (buf != NULL && size >= sizeof(unsigned long long)) {
                unsigned long long v;
                memcpy(&v, buf, sizeof v);
                *out = v;
                return CUDA_SUCCESS;
            }
        }
        return CUDA_ERROR_INVALID_VALUE;
    default:
        *out = g_cfg.kernel_ns;
        return CUDA_SUCCESS;
    }
}

struct launch_info {
    const char *name;
    uint64_t ns;
};

static CUresult launch_once(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, CUstream hs, void **params, void **extra, struct launch_info *li,
                            uint64_t *retry)
{
    li->name = "?";
    li->ns = 0;
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r != CUDA_SUCCESS)
        goto out;
    if (!func_ok(f)) {
        r = CUDA_ERROR_INVALID_HANDLE;
        goto out;
    }
    li->name = f->name;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    r = resolve_stream(c, hs, &s);
    if (r != CUDA_SUCCESS)
        goto out;
    r = kernel_ns(f, params, extra, &li->ns);
    if (r != CUDA_SUCCESS)
        goto out;
    r = submit_locked(s, li->ns, 1, false, retry);
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* A full queue makes the launch wait for room, with no lock held, then try
 * again from the start (the stream may have gone meanwhile). */
static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       CUstream hs, void **params, void **extra, struct launch_info *li)
{
    for (;;) {
        uint64_t retry = 0;
        CUresult r = launch_once(f, gx, gy, gz, bx, by, bz, hs, params, extra, li, &retry);
        if (r != CUDA_ERROR_NOT_READY)
            return r;
        fake_sleep_until_ns(retry);
    }
}

static CUresult graph_launch_once(CUgraphExec g, CUstream hs, uint64_t *ns, uint64_t *retry)
{
    *ns = 0;
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS && (g == NULL || g->magic != MAGIC_EXEC))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r == CUDA_SUCCESS) {
        *ns = g->total_ns;
        r = submit_locked(s, g->total_ns, g->kernels, true, retry);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult graph_launch(CUgraphExec g, CUstream hs, uint64_t *ns)
{
    for (;;) {
        uint64_t retry = 0;
        CUresult r = graph_launch_once(g, hs, ns, &retry);
        if (r != CUDA_ERROR_NOT_READY)
            return r;
        fake_sleep_until_ns(retry);
    }
}

/* ==== synchronisation ================================================== */

static CUresult stream_sync(CUstream hs)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r == CUDA_SUCCESS && s->capturing)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    struct tl_pos until = {-1, 0, 0};
    int dev = -1;
    if (r == CUDA_SUCCESS) {
        until = s->pos;
        dev = s->ctx->dev;
    }
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS) {
        tl_wait(dev, until);
        sync_trim(dev);
    }
    return r;
}

static CUresult stream_query(CUstream hs)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r == CUDA_SUCCESS && s->capturing)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (r == CUDA_SUCCESS && s->pos.mark != 0) {
        tl_lock();
        tl_advance(s->ctx->dev, fake_now_ns());
        if (!tl_pos_done(&s->pos))
            r = CUDA_ERROR_NOT_READY;
        tl_unlock();
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Caller holds g_mu. Everything c has submitted so far. */
static struct tl_pos ctx_all(struct CUctx_st *c)
{
    if (c->q < 0)
        return (struct tl_pos){-1, 0, 0};
    tl_lock();
    struct tl_pos p = ctx_pos(c);
    tl_unlock();
    return p;
}

/* Synchronous copies wait for the context's queued work first, like the
 * real driver's copies on the legacy default stream. */
static CUresult sync_copy(void *dst, const void *src, size_t n, uintptr_t devp, int value)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS && (!range_ok(devp, n) || (value < 0 && (dst == NULL || src == NULL) && n)))
        r = CUDA_ERROR_INVALID_VALUE;
    struct tl_pos until = {-1, 0, 0};
    int dev = -1;
    if (r == CUDA_SUCCESS) {
        until = ctx_all(c);
        dev = c->dev;
    }
    pthread_mutex_unlock(&g_mu);
    if (r != CUDA_SUCCESS)
        return r;
    tl_wait(dev, until);
    if (n == 0)
        return CUDA_SUCCESS;
    if (value >= 0)
        memset(dst, value, n);
    else
        memcpy(dst, src, n);
    return CUDA_SUCCESS;
}

/* ==== events =========================================================== */

static bool event_ok(CUevent e) { return e != NULL && e->magic == MAGIC_EVENT; }

static CUresult event_record(CUevent e, CUstream hs, unsigned flags)
{
    NEED_INIT();
    if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS && !event_ok(e))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r == CUDA_SUCCESS && !s->capturing) {
        ev_unlink(e);
        tl_lock();
        uint64_t now = fake_now_ns();
        tl_advance(s->ctx->dev, now);
        e->recorded = 1;
        e->resolved = 0;
        e->dev = s->ctx->dev;
        e->rctx = s->ctx;
        e->pos = s->pos;
        e->rec_ns = now;
        e->time = now;
        if (tl_pos_done(&e->pos)) {
            e->resolved = 1; /* the stream was idle: completes at record time */
        } else if (!(e->flags & CU_EVENT_DISABLE_TIMING)) {
            e->tprev = NULL; /* its time is needed later: see ev_before_overwrite */
            e->tnext = s->ctx->tev;
            if (e->tnext != NULL)
                e->tnext->tprev = e;
            s->ctx->tev = e;
        }
        tl_unlock();
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* Caller holds g_mu. Advances e's device and tells whether e is complete. */
static bool event_done_locked(struct CUevent_st *e)
{
    if (!e->recorded || e->resolved)
        return true;
    tl_lock();
    uint64_t now = fake_now_ns();
    tl_advance(e->dev, now);
    bool done = ev_complete(e, now);
    tl_unlock();
    return done;
}

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
    NEED_INIT();
    if (ms == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (!event_ok(a) || !event_ok(b))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->recorded || !b->recorded)
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!event_done_locked(a) || !event_done_locked(b))
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)(b->time - a->time)) / 1e6);
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult event_destroy(CUevent e)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (!event_ok(e))
        r = CUDA_ERROR_INVALID_HANDLE;
    else {
        ev_unlink(e);
        e->magic = MAGIC_DEAD;
        free(e);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

/* ==== streams and capture ============================================== */

static CUresult stream_destroy(CUstream h)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (is_special_stream(h) || h->magic != MAGIC_STREAM) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        free(h->capture);
        h->magic = MAGIC_DEAD;
        free(h);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult begin_capture(CUstream hs, int mode)
{
    NEED_INIT();
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS && is_special_stream(hs))
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r == CUDA_SUCCESS && s->capturing)
        r = CUDA_ERROR_ILLEGAL_STATE;
    if (r == CUDA_SUCCESS) {
        s->capture = calloc(1, sizeof *s->capture);
        if (s->capture == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            s->capture->magic = MAGIC_GRAPH;
            s->capturing = 1;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult end_capture(CUstream hs, CUgraph *pg)
{
    NEED_INIT();
    if (pg == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r == CUDA_SUCCESS && !s->capturing)
        r = CUDA_ERROR_ILLEGAL_STATE;
    if (r == CUDA_SUCCESS) {
        *pg = s->capture;
        s->capture = NULL;
        s->capturing = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult is_capturing(CUstream hs, CUstreamCaptureStatus *st)
{
    NEED_INIT();
    if (st == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    if (r == CUDA_SUCCESS)
        *st = s->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&g_mu);
    return r;
}

static CUresult stream_wait_event(CUstream hs, CUevent e, unsigned flags)
{
    NEED_INIT();
    (void)flags;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    struct CUstream_st *s;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS && !event_ok(e))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        r = resolve_stream(c, hs, &s);
    /* Work queued on s after this waits for e. Within one context the
     * FIFO already orders it; s's position moves to e's so that syncing s
     * also waits for e. The fake has no dependencies between queues: an
     * event of another context is waited for here, by the caller. */
    struct tl_pos other = {-1, 0, 0};
    int other_dev = -1;
    if (r == CUDA_SUCCESS && !s->capturing && e->recorded && !e->resolved) {
        if (e->rctx == s->ctx) {
            if (s->pos.mark == 0 || s->pos.q != e->pos.q || s->pos.epoch != e->pos.epoch || e->pos.mark > s->pos.mark)
                s->pos = e->pos;
        } else {
            other = e->pos;
            other_dev = e->dev;
        }
    }
    pthread_mutex_unlock(&g_mu);
    if (other.mark != 0)
        tl_wait(other_dev, other);
    return r;
}

/* ==== forked child ===================================================== */

/* A child of fork() starts with no CUDA state, as with the real driver: it
 * must call cuInit again, and it gets its own slot (its own open file
 * description of the state, so that its lock is its own). Inherited
 * handles are invalid; inherited memory stays counted to the parent. */
static void fork_child(void)
{
    pthread_mutex_unlock(&g_mu); /* locked by fork_prepare */
    atomic_store(&g_init_ok, 0);
    t_depth = 0;
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        g_primary[d].active = 0;
        g_primary[d].refcount = 0;
        g_primary[d].gen++;
        g_primary[d].dstream.magic = MAGIC_DEAD;
        g_primary[d].q = -1; /* the timeline queues stay the parent's */
        g_primary[d].tev = NULL;
    }
    for (struct CUctx_st *c = g_created; c; c = c->next_created) {
        c->magic = MAGIC_DEAD;
        c->gen++;
        c->q = -1;
        c->tev = NULL;
    }
    pools_reset();
    for (size_t b = 0; b < NBUCKET; b++) {
        for (struct alloc *a = g_alloc[b], *n; a; a = n) {
            n = a->next;
            free(a);
        }
        g_alloc[b] = NULL;
    }
    for (struct CUarray_st *a = g_arrays, *n; a; a = n) {
        n = a->next;
        a->magic = MAGIC_DEAD;
        free(a);
    }
    g_arrays = NULL;
    for (struct CUmipmappedArray_st *m = g_mipmaps, *n; m; m = n) {
        n = m->next;
        m->magic = MAGIC_DEAD;
        free(m);
    }
    g_mipmaps = NULL;
    for (struct vmm_phys *p = g_phys, *n; p; p = n) {
        n = p->next;
        free(p);
    }
    g_phys = NULL;
    for (struct vmm_resv *v = g_resv, *n; v; v = n) {
        n = v->next;
        free(v);
    }
    g_resv = NULL;
    for (struct vmm_map *m = g_maps, *n; m; m = n) {
        n = m->next;
        free(m);
    }
    g_maps = NULL;
    if (g_vmm_fd >= 0)
        close(g_vmm_fd);
    g_vmm_fd = -1;
    g_vmm_next = 0;

    g_self_pid = 0; /* a new process: its own fake CUPTI entry, if any */
    g_slot = -2;
    if (S != NULL && g_state_fd >= 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", g_state_fd);
        int fd = open(g_cfg.state_path ? g_cfg.state_path : path, O_RDWR | O_CLOEXEC);
        if (fd >= 0) {
            close(g_state_fd);
            g_state_fd = fd;
            g_slot = -1;
        }
    }
}

/* ==== exported API ===================================================== */

/* ---- initialisation ---------------------------------------------------- */

CUresult cuInit(unsigned int Flags)
{
    setup();
    CUresult r = CUDA_SUCCESS;
    if (Flags != 0) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (g_cfg.ndev == 0) {
        r = CUDA_ERROR_NO_DEVICE;
    } else {
        pthread_mutex_lock(&g_mu);
        if (g_slot == -1) {
            fake_state_reclaim_dead(S, g_state_fd, -1);
            g_slot = fake_state_claim_slot(S, g_state_fd);
            if (g_slot < 0) {
                g_slot = -2;
                fprintf(stderr, "%s: all %d state slots are taken; this process's memory will not be "
                                "reclaimed if it dies\n", WHO, FAKE_MAX_SLOTS);
            }
        }
        atomic_store(&g_init_ok, 1);
        pthread_mutex_unlock(&g_mu);
    }
    LOGR(r, "flags=%u", Flags);
    return r;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    setup();
    CUresult r = CUDA_SUCCESS;
    if (driverVersion == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        *driverVersion = g_cfg.driver_version;
    LOGR0(r);
    return r;
}

/* ---- devices ----------------------------------------------------------- */

static CUresult device_get(CUdevice *device, int ordinal)
{
    NEED_INIT();
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    setup();
    CUresult r = device_get(device, ordinal);
    LOGR(r, "ordinal=%d", ordinal);
    return r;
}

static CUresult device_count(int *count)
{
    NEED_INIT();
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = (int)g_cfg.ndev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    setup();
    CUresult r = device_count(count);
    LOGR0(r);
    return r;
}

static CUresult device_name(char *name, int len, CUdevice dev)
{
    NEED_INIT();
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", FAKE_DEVICE_NAME);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    setup();
    CUresult r = device_name(name, len, dev);
    LOGR(r, "len=%d dev=%d", len, dev);
    return r;
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
    NEED_INIT();
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    fake_uuid_bytes(dev, (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    setup();
    CUresult r = device_uuid(uuid, dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    setup();
    CUresult r = device_uuid(uuid, dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

static CUresult device_attr(int *pi, int attrib, CUdevice dev)
{
    NEED_INIT();
    if (pi == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    setup();
    CUresult r = device_attr(pi, (int)attrib, dev);
    LOGR(r, "attrib=%d dev=%d", (int)attrib, dev);
    return r;
}

static CUresult total_mem(uint64_t *out, CUdevice dev)
{
    NEED_INIT();
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *out = g_cfg.mem_total;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    setup();
    uint64_t v = 0;
    CUresult r = INIT_OR(bytes ? total_mem(&v, dev) : CUDA_ERROR_INVALID_VALUE);
    if (r == CUDA_SUCCESS)
        *bytes = (size_t)v;
    LOGR(r, "dev=%d", dev);
    return r;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    setup();
    uint64_t v = 0;
    CUresult r = INIT_OR(bytes ? total_mem(&v, dev) : CUDA_ERROR_INVALID_VALUE);
    if (r == CUDA_SUCCESS)
        *bytes = v > UINT_MAX ? UINT_MAX : (unsigned int)v;
    LOGR(r, "dev=%d", dev);
    return r;
}

static CUresult default_pool(CUmemoryPool *out, CUdevice dev)
{
    NEED_INIT();
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    *out = &g_pools[dev];
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    setup();
    CUresult r = default_pool(pool_out, dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

/* The device's current pool: the fake never changes it from the default. */
CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    setup();
    CUresult r = default_pool(pool, dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

/* Test hook (no real driver has it): the device-wide bytes in use across all
 * processes sharing the fake GPU, after reclaiming dead processes. Lets a test
 * check the quota against the ground truth, past the shim's spoofed info. */
CUresult cuFakeUsedBytes(CUdevice dev, unsigned long long *used)
{
    setup();
    NEED_INIT();
    if (!used || dev < 0 || (unsigned)dev >= g_cfg.ndev)
        return CUDA_ERROR_INVALID_VALUE;
    fake_state_reclaim_dead(S, g_state_fd, g_slot);
    *used = dev_used(dev);
    return CUDA_SUCCESS;
}

/* ---- primary contexts -------------------------------------------------- */

static CUresult primary_retain(CUcontext *pctx, CUdevice dev)
{
    NEED_INIT();
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c = &g_primary[dev];
    CUresult r = CUDA_SUCCESS;
    if (c->refcount == 0 && !c->active)
        r = ctx_activate(c);
    if (r == CUDA_SUCCESS) {
        c->refcount++;
        *pctx = c;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    setup();
    CUresult r = primary_retain(pctx, dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    setup();
    CUresult r = primary_release(dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    setup();
    CUresult r = primary_release(dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    setup();
    CUresult r = primary_reset(dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    setup();
    CUresult r = primary_reset(dev);
    LOGR(r, "dev=%d", dev);
    return r;
}

static CUresult primary_state(CUdevice dev, unsigned int *flags, int *active)
{
    NEED_INIT();
    if (flags == NULL || active == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_mu);
    *flags = 0;
    *active = g_primary[dev].active;
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    setup();
    CUresult r = primary_state(dev, flags, active);
    LOGR(r, "dev=%d", dev);
    return r;
}

/* ---- contexts ---------------------------------------------------------- */

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    setup();
    CUresult r = ctx_create(pctx, dev);
    LOGR(r, "flags=%u dev=%d", flags, dev);
    return r;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    setup();
    CUresult r = ctx_create(pctx, dev);
    LOGR(r, "flags=%u dev=%d", flags, dev);
    return r;
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,
                        CUdevice dev)
{
    setup();
    CUresult r = INIT_OR((numParams < 0 || (numParams > 0 && paramsArray == NULL)) ? CUDA_ERROR_INVALID_VALUE
                                                                                   : ctx_create(pctx, dev));
    LOGR(r, "numParams=%d flags=%u dev=%d", numParams, flags, dev);
    return r;
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev)
{
    setup();
    CUresult r = ctx_create(pctx, dev);
    LOGR(r, "params=0x%llx flags=%u dev=%d", P(ctxCreateParams), flags, dev);
    return r;
}

CUresult cuCtxDestroy(CUcontext ctx)
{
    setup();
    CUresult r = ctx_destroy(ctx);
    LOGR(r, "ctx=0x%llx", P(ctx));
    return r;
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    setup();
    CUresult r = ctx_destroy(ctx);
    LOGR(r, "ctx=0x%llx", P(ctx));
    return r;
}

static CUresult ctx_get_current(CUcontext *pctx)
{
    NEED_INIT();
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = cur_ctx();
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    setup();
    CUresult r = ctx_get_current(pctx);
    LOGR0(r);
    return r;
}

static CUresult ctx_set_current(CUcontext c)
{
    NEED_INIT();
    if (c == NULL) {
        if (t_depth > 0)
            t_depth--;
        return CUDA_SUCCESS;
    }
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (c->magic != MAGIC_CTX)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (t_depth == 0)
        t_stack[t_depth++] = c;
    else
        t_stack[t_depth - 1] = c;
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    setup();
    CUresult r = ctx_set_current(ctx);
    LOGR(r, "ctx=0x%llx", P(ctx));
    return r;
}

static CUresult ctx_get_device(CUdevice *device)
{
    NEED_INIT();
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS)
        *device = c->dev;
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    setup();
    CUresult r = ctx_get_device(device);
    LOGR0(r);
    return r;
}

/* Waits for a context's queued work: the current one (ctx NULL), or ctx. */
static CUresult ctx_sync(CUcontext ctx)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c = ctx;
    CUresult r = CUDA_SUCCESS;
    if (c == NULL)
        r = need_ctx(&c);
    else if (!ctx_usable(c))
        r = CUDA_ERROR_INVALID_CONTEXT;
    struct tl_pos until = r == CUDA_SUCCESS ? ctx_all(c) : (struct tl_pos){-1, 0, 0};
    int dev = r == CUDA_SUCCESS ? c->dev : -1;
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS) {
        tl_wait(dev, until);
        sync_trim(dev);
    }
    return r;
}

CUresult cuCtxSynchronize(void)
{
    setup();
    CUresult r = ctx_sync(NULL);
    LOGR0(r);
    return r;
}

CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    setup();
    CUresult r = ctx_sync(ctx);
    LOGR(r, "ctx=0x%llx", P(ctx));
    return r;
}

CUresult cuCtxPushCurrent(CUcontext ctx)
{
    setup();
    CUresult r = ctx_push(ctx);
    LOGR(r, "ctx=0x%llx", P(ctx));
    return r;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    setup();
    CUresult r = ctx_push(ctx);
    LOGR(r, "ctx=0x%llx", P(ctx));
    return r;
}

CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    setup();
    CUresult r = ctx_pop(pctx);
    LOGR0(r);
    return r;
}

CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    setup();
    CUresult r = ctx_pop(pctx);
    LOGR0(r);
    return r;
}

/* ---- linear memory ----------------------------------------------------- */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    setup();
    uintptr_t p = 0;
    CUresult r = INIT_OR(dptr ? mem_alloc(&p, bytesize, false) : CUDA_ERROR_INVALID_VALUE);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)p;
    LOGR(r, "size=%zu", bytesize);
    return r;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    setup();
    uintptr_t p = 0;
    CUresult r = INIT_OR(dptr ? mem_alloc(&p, bytesize, true) : CUDA_ERROR_INVALID_VALUE);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)p;
    LOGR(r, "size=%u", bytesize);
    return r;
}

static CUresult pitch_alloc(uintptr_t *p, uint64_t *pitch, uint64_t w, uint64_t h, unsigned es, bool low32)
{
    NEED_INIT();
    if (w == 0 || h == 0 || (es != 4 && es != 8 && es != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t al = g_cfg.pitch_align, pt = (w + al - 1) & ~(al - 1), size;
    if (pt < w || __builtin_mul_overflow(pt, h, &size))
        return CUDA_ERROR_INVALID_VALUE;
    if (low32 && (pt > UINT_MAX || size > UINT_MAX))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = mem_alloc(p, size, low32);
    if (r == CUDA_SUCCESS)
        *pitch = pt;
    return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    setup();
    uintptr_t p = 0;
    uint64_t pitch = 0;
    CUresult r = INIT_OR((dptr && pPitch) ? pitch_alloc(&p, &pitch, WidthInBytes, Height, ElementSizeBytes, false)
                                          : CUDA_ERROR_INVALID_VALUE);
    if (r == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr)p;
        *pPitch = (size_t)pitch;
    }
    LOGR(r, "width=%zu height=%zu elemsize=%u", WidthInBytes, Height, ElementSizeBytes);
    return r;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height,
                         unsigned int ElementSizeBytes)
{
    setup();
    uintptr_t p = 0;
    uint64_t pitch = 0;
    CUresult r = INIT_OR((dptr && pPitch) ? pitch_alloc(&p, &pitch, WidthInBytes, Height, ElementSizeBytes, true)
                                          : CUDA_ERROR_INVALID_VALUE);
    if (r == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)p;
        *pPitch = (unsigned int)pitch;
    }
    LOGR(r, "width=%u height=%u elemsize=%u", WidthInBytes, Height, ElementSizeBytes);
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    setup();
    uintptr_t p = 0;
    CUresult r = INIT_OR((dptr == NULL || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
                             ? CUDA_ERROR_INVALID_VALUE
                             : mem_alloc(&p, bytesize, false));
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)p;
    LOGR(r, "size=%zu flags=%u", bytesize, flags);
    return r;
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    setup();
    CUresult r = mem_free((uintptr_t)dptr);
    LOGR(r, "ptr=0x%llx", (unsigned long long)dptr);
    return r;
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    setup();
    CUresult r = mem_free((uintptr_t)dptr);
    LOGR(r, "ptr=0x%llx", (unsigned long long)dptr);
    return r;
}

static CUresult host_alloc(void **pp, size_t size, unsigned flags)
{
    NEED_INIT();
    if (pp == NULL || size == 0 || (flags & ~7u))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    uintptr_t p = 0;
    CUresult r = dev_alloc_locked(&p, size, false, AK_HOST);
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS)
        *pp = (void *)p;
    return r;
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    setup();
    CUresult r = host_alloc(pp, bytesize, Flags);
    LOGR(r, "size=%zu flags=%u", bytesize, Flags);
    return r;
}

static CUresult host_free(void *p)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS) {
        struct alloc *a = alloc_find((uintptr_t)p);
        if (a == NULL || a->kind != AK_HOST)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            alloc_drop(a);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemFreeHost(void *p)
{
    setup();
    CUresult r = host_free(p);
    LOGR(r, "ptr=0x%llx", P(p));
    return r;
}

static CUresult mem_info(uint64_t *fr, uint64_t *tot)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS) {
        fake_state_reclaim_dead(S, g_state_fd, g_slot);
        *tot = g_cfg.mem_total;
        *fr = g_cfg.mem_total - dev_used(c->dev);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    setup();
    uint64_t f = 0, t = 0;
    CUresult r = INIT_OR((free && total) ? mem_info(&f, &t) : CUDA_ERROR_INVALID_VALUE);
    if (r == CUDA_SUCCESS) {
        *free = (size_t)f;
        *total = (size_t)t;
    }
    LOGR0(r);
    return r;
}

CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    setup();
    uint64_t f = 0, t = 0;
    CUresult r = INIT_OR((free && total) ? mem_info(&f, &t) : CUDA_ERROR_INVALID_VALUE);
    if (r == CUDA_SUCCESS) {
        *free = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
        *total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
    }
    LOGR0(r);
    return r;
}

/* ---- synchronous copies ------------------------------------------------ */

CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    setup();
    CUresult r = sync_copy((void *)(uintptr_t)dstDevice, srcHost, ByteCount, (uintptr_t)dstDevice, -1);
    LOGR(r, "dst=0x%llx size=%zu", (unsigned long long)dstDevice, ByteCount);
    return r;
}

CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    setup();
    CUresult r = sync_copy((void *)(uintptr_t)dstDevice, srcHost, ByteCount, (uintptr_t)dstDevice, -1);
    LOGR(r, "dst=0x%llx size=%zu", (unsigned long long)dstDevice, ByteCount);
    return r;
}

CUresult cuMemcpyHtoD(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount)
{
    setup();
    CUresult r = sync_copy((void *)(uintptr_t)dstDevice, srcHost, ByteCount, (uintptr_t)dstDevice, -1);
    LOGR(r, "dst=0x%llx size=%u", (unsigned long long)dstDevice, ByteCount);
    return r;
}

CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    setup();
    CUresult r = sync_copy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount, (uintptr_t)srcDevice, -1);
    LOGR(r, "src=0x%llx size=%zu", (unsigned long long)srcDevice, ByteCount);
    return r;
}

CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    setup();
    CUresult r = sync_copy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount, (uintptr_t)srcDevice, -1);
    LOGR(r, "src=0x%llx size=%zu", (unsigned long long)srcDevice, ByteCount);
    return r;
}

CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount)
{
    setup();
    CUresult r = sync_copy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount, (uintptr_t)srcDevice, -1);
    LOGR(r, "src=0x%llx size=%u", (unsigned long long)srcDevice, ByteCount);
    return r;
}

CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    setup();
    CUresult r = sync_copy((void *)(uintptr_t)dstDevice, NULL, N, (uintptr_t)dstDevice, uc);
    LOGR(r, "dst=0x%llx value=%u size=%zu", (unsigned long long)dstDevice, uc, N);
    return r;
}

CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    setup();
    CUresult r = sync_copy((void *)(uintptr_t)dstDevice, NULL, N, (uintptr_t)dstDevice, uc);
    LOGR(r, "dst=0x%llx value=%u size=%zu", (unsigned long long)dstDevice, uc, N);
    return r;
}

CUresult cuMemsetD8(CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N)
{
    setup();
    CUresult r = sync_copy((void *)(uintptr_t)dstDevice, NULL, N, (uintptr_t)dstDevice, uc);
    LOGR(r, "dst=0x%llx value=%u size=%u", (unsigned long long)dstDevice, uc, N);
    return r;
}

/* ---- stream-ordered allocator ------------------------------------------ */

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    setup();
    CUresult r = pool_alloc(dptr, bytesize, NULL, hStream, true);
    LOGR(r, "size=%zu stream=0x%llx", bytesize, P(hStream));
    return r;
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    setup();
    CUresult r = pool_alloc(dptr, bytesize, NULL, hStream, true);
    LOGR(r, "size=%zu stream=0x%llx", bytesize, P(hStream));
    return r;
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    setup();
    CUresult r = pool_alloc(dptr, bytesize, pool, hStream, false);
    LOGR(r, "size=%zu pool=0x%llx stream=0x%llx", bytesize, P(pool), P(hStream));
    return r;
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    setup();
    CUresult r = pool_alloc(dptr, bytesize, pool, hStream, false);
    LOGR(r, "size=%zu pool=0x%llx stream=0x%llx", bytesize, P(pool), P(hStream));
    return r;
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    setup();
    CUresult r = pool_free(dptr, hStream);
    LOGR(r, "ptr=0x%llx stream=0x%llx", (unsigned long long)dptr, P(hStream));
    return r;
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    setup();
    CUresult r = pool_free(dptr, hStream);
    LOGR(r, "ptr=0x%llx stream=0x%llx", (unsigned long long)dptr, P(hStream));
    return r;
}

static CUresult pool_trim(CUmemoryPool pool, size_t keep)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (!pool_ok(pool))
        r = CUDA_ERROR_INVALID_VALUE;
    else
        pool_trim_locked(pool, keep);
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    setup();
    CUresult r = pool_trim(pool, minBytesToKeep);
    LOGR(r, "pool=0x%llx keep=%zu", P(pool), minBytesToKeep);
    return r;
}

static CUresult pool_attr(CUmemoryPool pool, int attr, void *value, bool set)
{
    NEED_INIT();
    if (value == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (!pool_ok(pool)) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    cuuint64_t *v64 = value;
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        if (set)
            pool->reuse[attr - 1] = *(int *)value != 0;
        else
            *(int *)value = pool->reuse[attr - 1];
        break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        if (set)
            pool->threshold = *v64;
        else
            *v64 = pool->threshold;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        if (set)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            *v64 = pool->reserved;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        if (set)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            *v64 = pool->used;
        break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (set && *v64 != 0)
            r = CUDA_ERROR_INVALID_VALUE;
        else if (set)
            pool->reserved_high = pool->reserved;
        else
            *v64 = pool->reserved_high;
        break;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (set && *v64 != 0)
            r = CUDA_ERROR_INVALID_VALUE;
        else if (set)
            pool->used_high = pool->used;
        else
            *v64 = pool->used_high;
        break;
    default:
        r = CUDA_ERROR_INVALID_VALUE;
    }
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    setup();
    CUresult r = pool_attr(pool, (int)attr, value, true);
    LOGR(r, "pool=0x%llx attr=%d", P(pool), (int)attr);
    return r;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    setup();
    CUresult r = pool_attr(pool, (int)attr, value, false);
    LOGR(r, "pool=0x%llx attr=%d", P(pool), (int)attr);
    return r;
}

/* ---- virtual memory management ----------------------------------------- */

static struct vmm_phys *phys_find(CUmemGenericAllocationHandle id)
{
    for (struct vmm_phys *p = g_phys; p; p = p->next)
        if (p->id == id)
            return p;
    return NULL;
}

/* Caller holds g_mu. Physical memory goes when the handle is released and
 * no mapping remains. */
static void phys_unref(struct vmm_phys *ph)
{
    if (--ph->refs != 0)
        return;
    struct vmm_phys **pp = &g_phys;
    while (*pp && *pp != ph)
        pp = &(*pp)->next;
    if (*pp)
        *pp = ph->next;
    if (g_vmm_fd >= 0)
        fallocate(g_vmm_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, ph->off, (off_t)ph->span);
    if (ph->dev >= 0)
        acct_release(ph->dev, ph->size);
    free(ph);
}

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static CUresult mem_create(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                           unsigned long long flags)
{
    NEED_INIT();
    if (handle == NULL || prop == NULL || size == 0 || flags != 0 || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE && prop->location.type != CU_MEM_LOCATION_TYPE_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    /* Host memory (location HOST, its id ignored, as the driver does): in
     * the same arena, mappable at a reserved range, not the GPU's. */
    int host = prop->location.type == CU_MEM_LOCATION_TYPE_HOST;
    if (!host && !dev_ok(prop->location.id))
        return CUDA_ERROR_INVALID_DEVICE;
    int dev = host ? -1 : prop->location.id;
    size_t pg = page_size();
    size_t span = (size + pg - 1) & ~(pg - 1);
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (g_vmm_fd < 0) {
        g_vmm_fd = memfd_create("cuslice_fake_vmm", MFD_CLOEXEC);
        if (g_vmm_fd >= 0 && ftruncate(g_vmm_fd, VMM_ARENA_SIZE) != 0) {
            close(g_vmm_fd);
            g_vmm_fd = -1;
        }
        if (g_vmm_fd < 0) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
    }
    if (span < size || g_vmm_next + (off_t)span > VMM_ARENA_SIZE) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    struct vmm_phys *ph = calloc(1, sizeof *ph);
    if (ph == NULL || (dev >= 0 && acct_reserve(dev, size) != 0)) {
        free(ph);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    ph->id = g_vmm_next_id++;
    ph->dev = dev;
    ph->size = size;
    ph->off = g_vmm_next;
    ph->span = span;
    ph->refs = 1;
    g_vmm_next += (off_t)span;
    ph->next = g_phys;
    g_phys = ph;
    *handle = ph->id;
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    setup();
    CUresult r = mem_create(handle, size, prop, flags);
    LOGR(r, "size=%zu dev=%d flags=%llu", size, prop ? prop->location.id : -1, flags);
    return r;
}

static CUresult mem_release(CUmemGenericAllocationHandle h)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    struct vmm_phys *ph = phys_find(h);
    if (ph == NULL || ph->released) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        ph->released = 1;
        phys_unref(ph);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    setup();
    CUresult r = mem_release(handle);
    LOGR(r, "handle=0x%llx", (unsigned long long)handle);
    return r;
}

static CUresult addr_reserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr)
{
    NEED_INIT();
    if (ptr == NULL || size == 0 || (align & (align - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pg = page_size();
    if (align < pg)
        align = pg;
    size_t len = (size + pg - 1) & ~(pg - 1);
    if (len < size || len + align < len)
        return CUDA_ERROR_OUT_OF_MEMORY;
    size_t over = len + align - pg;
    uint8_t *p = mmap((void *)(uintptr_t)addr, over, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)p)
        munmap(p, base - (uintptr_t)p);
    uintptr_t end = (uintptr_t)p + over;
    if (end > base + len)
        munmap((void *)(base + len), end - (base + len));
    struct vmm_resv *v = calloc(1, sizeof *v);
    if (v == NULL) {
        munmap((void *)base, len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->base = base;
    v->size = size;
    v->map_len = len;
    pthread_mutex_lock(&g_mu);
    v->next = g_resv;
    g_resv = v;
    pthread_mutex_unlock(&g_mu);
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    setup();
    CUresult r = addr_reserve(ptr, size, alignment, addr);
    LOGR(r, "size=%zu alignment=%zu addr=0x%llx flags=%llu", size, alignment, (unsigned long long)addr, flags);
    return r;
}

/* Caller holds g_mu. */
static void map_drop(struct vmm_map *m)
{
    struct vmm_map **pp = &g_maps;
    while (*pp && *pp != m)
        pp = &(*pp)->next;
    if (*pp)
        *pp = m->next;
    mmap((void *)m->va, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    phys_unref(m->ph);
    free(m);
}

static CUresult addr_free(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    struct vmm_resv **pp = &g_resv;
    while (*pp && !((*pp)->base == (uintptr_t)ptr && (*pp)->size == size))
        pp = &(*pp)->next;
    struct vmm_resv *v = *pp;
    if (v == NULL) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        *pp = v->next;
        for (struct vmm_map *m = g_maps, *n; m; m = n) {
            n = m->next;
            if (m->va >= v->base && m->va < v->base + v->map_len)
                map_drop(m);
        }
        munmap((void *)v->base, v->map_len);
        free(v);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    setup();
    CUresult r = addr_free(ptr, size);
    LOGR(r, "ptr=0x%llx size=%zu", (unsigned long long)ptr, size);
    return r;
}

static CUresult mem_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                        unsigned long long flags)
{
    NEED_INIT();
    size_t pg = page_size();
    if (size == 0 || flags != 0 || (ptr & (pg - 1)) != 0 || (offset & (pg - 1)) != 0 || ptr + size < ptr)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    uintptr_t va = (uintptr_t)ptr;
    struct vmm_phys *ph = phys_find(h);
    struct vmm_resv *v = g_resv;
    struct vmm_map *m = NULL;
    if (ph == NULL || ph->released) {
        r = CUDA_ERROR_INVALID_HANDLE;
        goto out;
    }
    if (offset > ph->size || size > ph->size - offset) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    while (v && !(va >= v->base && va + size <= v->base + v->map_len))
        v = v->next;
    if (v == NULL) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    for (struct vmm_map *o = g_maps; o; o = o->next)
        if (va < o->va + o->size && o->va < va + size) {
            r = CUDA_ERROR_INVALID_VALUE;
            goto out;
        }
    m = calloc(1, sizeof *m);
    if (m == NULL || mmap((void *)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, g_vmm_fd,
                          ph->off + (off_t)offset) == MAP_FAILED) {
        free(m);
        r = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    m->va = va;
    m->size = size;
    m->ph = ph;
    ph->refs++;
    m->next = g_maps;
    g_maps = m;
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    setup();
    CUresult r = mem_map(ptr, size, offset, handle, flags);
    LOGR(r, "ptr=0x%llx size=%zu offset=%zu handle=0x%llx flags=%llu", (unsigned long long)ptr, size, offset,
         (unsigned long long)handle, flags);
    return r;
}

static CUresult mem_unmap(CUdeviceptr ptr, size_t size)
{
    NEED_INIT();
    uintptr_t lo = (uintptr_t)ptr, hi = lo + size;
    if (size == 0 || hi < lo)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    int found = 0;
    for (struct vmm_map *m = g_maps; m; m = m->next) {
        bool overlap = m->va < hi && lo < m->va + m->size;
        bool inside = m->va >= lo && m->va + m->size <= hi;
        if (overlap && !inside) {
            r = CUDA_ERROR_INVALID_VALUE;
            goto out;
        }
        found += inside;
    }
    if (found == 0) {
        r = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    for (struct vmm_map *m = g_maps, *n; m; m = n) {
        n = m->next;
        if (m->va >= lo && m->va + m->size <= hi)
            map_drop(m);
    }
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    setup();
    CUresult r = mem_unmap(ptr, size);
    LOGR(r, "ptr=0x%llx size=%zu", (unsigned long long)ptr, size);
    return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    setup();
    CUresult r = CUDA_SUCCESS;
    if (!atomic_load(&g_init_ok))
        r = CUDA_ERROR_NOT_INITIALIZED;
    else if (size == 0 || (count > 0 && desc == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    LOGR(r, "ptr=0x%llx size=%zu count=%zu", (unsigned long long)ptr, size, count);
    return r;
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    setup();
    CUresult r = CUDA_SUCCESS;
    if (!atomic_load(&g_init_ok))
        r = CUDA_ERROR_NOT_INITIALIZED;
    else if (granularity == NULL || prop == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    else
        *granularity = (size_t)g_cfg.granularity;
    LOGR(r, "option=%d", (int)option);
    return r;
}

/* ---- arrays ------------------------------------------------------------ */

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *d)
{
    setup();
    CUresult r = INIT_OR(d ? array_create(pHandle, d->Width, d->Height, 0, d->Format, d->NumChannels) : CUDA_ERROR_INVALID_VALUE);
    if (d)
        LOGR(r, "width=%zu height=%zu format=%d channels=%u", d->Width, d->Height, (int)d->Format, d->NumChannels);
    else
        LOGR0(r);
    return r;
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d)
{
    setup();
    CUresult r = INIT_OR(d ? array_create(pHandle, d->Width, d->Height, d->Depth, d->Format, d->NumChannels) : CUDA_ERROR_INVALID_VALUE);
    if (d)
        LOGR(r, "width=%zu height=%zu depth=%zu format=%d channels=%u", d->Width, d->Height, d->Depth,
             (int)d->Format, d->NumChannels);
    else
        LOGR0(r);
    return r;
}

static CUresult array_destroy(CUarray a)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    struct CUarray_st *x = g_arrays;
    while (x && x != a)
        x = x->next;
    if (x == NULL)
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        array_drop(x);
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuArrayDestroy(CUarray hArray)
{
    setup();
    CUresult r = array_destroy(hArray);
    LOGR(r, "array=0x%llx", P(hArray));
    return r;
}

static CUresult mipmap_create(CUmipmappedArray *ph, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels)
{
    NEED_INIT();
    if (ph == NULL || d == NULL || levels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t total = 0;
    size_t w = d->Width, h = d->Height ? d->Height : 1, z = d->Depth ? d->Depth : 1;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t b;
        if (!array_bytes(w, h, z, d->Format, d->NumChannels, &b) || __builtin_add_overflow(total, b, &total))
            return CUDA_ERROR_INVALID_VALUE;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : 1;
        z = z > 1 ? z / 2 : 1;
    }
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS) {
        struct CUmipmappedArray_st *m = calloc(1, sizeof *m);
        if (m == NULL || acct_reserve(c->dev, total) != 0) {
            free(m);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            m->magic = MAGIC_MIPMAP;
            m->dev = c->dev;
            m->ctx = c;
            m->bytes = total;
            m->next = g_mipmaps;
            g_mipmaps = m;
            *ph = m;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *d,
                                unsigned int numMipmapLevels)
{
    setup();
    CUresult r = mipmap_create(pHandle, d, numMipmapLevels);
    if (d)
        LOGR(r, "width=%zu height=%zu depth=%zu format=%d channels=%u levels=%u", d->Width, d->Height, d->Depth,
             (int)d->Format, d->NumChannels, numMipmapLevels);
    else
        LOGR(r, "levels=%u", numMipmapLevels);
    return r;
}

static CUresult mipmap_destroy(CUmipmappedArray a)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    struct CUmipmappedArray_st *x = g_mipmaps;
    while (x && x != a)
        x = x->next;
    if (x == NULL)
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        mipmap_drop(x);
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    setup();
    CUresult r = mipmap_destroy(hMipmappedArray);
    LOGR(r, "array=0x%llx", P(hMipmappedArray));
    return r;
}

/* ---- modules ----------------------------------------------------------- */

static CUresult module_load(CUmodule *pm, const void *image)
{
    NEED_INIT();
    if (pm == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS) {
        struct CUmod_st *m = calloc(1, sizeof *m);
        if (m == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            m->magic = MAGIC_MOD;
            m->ctx = c;
            *pm = m;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    setup();
    CUresult r = module_load(module, image);
    LOGR(r, "image=0x%llx", P(image));
    return r;
}

static CUresult module_function(CUfunction *pf, CUmodule m, const char *name)
{
    NEED_INIT();
    if (pf == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (m == NULL || m->magic != MAGIC_MOD) {
        r = CUDA_ERROR_INVALID_HANDLE;
        goto out;
    }
    struct CUfunc_st *f = m->funcs;
    while (f && strncmp(f->name, name, sizeof f->name - 1) != 0)
        f = f->next;
    if (f == NULL) {
        f = calloc(1, sizeof *f);
        if (f == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
            goto out;
        }
        f->magic = MAGIC_FUNC;
        snprintf(f->name, sizeof f->name, "%s", name);
        f->kind = strncmp(name, "sleep", 5) == 0 ? FK_SLEEP : strncmp(name, "empty", 5) == 0 ? FK_EMPTY : FK_DEFAULT;
        f->next = m->funcs;
        m->funcs = f;
    }
    *pf = f;
out:
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    setup();
    CUresult r = module_function(hfunc, hmod, name);
    char buf[96];
    LOGR(r, "module=0x%llx name=%s", P(hmod), log_str(name, buf, sizeof buf));
    return r;
}

static CUresult module_unload(CUmodule m)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (m == NULL || m->magic != MAGIC_MOD) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        /* Kept allocated but poisoned, so a launch of an unloaded function
         * fails cleanly with CUDA_ERROR_INVALID_HANDLE. */
        for (struct CUfunc_st *f = m->funcs; f; f = f->next)
            f->magic = MAGIC_DEAD;
        m->magic = MAGIC_DEAD;
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuModuleUnload(CUmodule hmod)
{
    setup();
    CUresult r = module_unload(hmod);
    LOGR(r, "module=0x%llx", P(hmod));
    return r;
}

/* ---- launches ---------------------------------------------------------- */

#define LAUNCH_LOG(r, li, hs, gx, gy, gz, bx, by, bz)                                                              \
    do {                                                                                                           \
        char nb_[96];                                                                                              \
        LOGR((r), "func=%s grid=%u,%u,%u block=%u,%u,%u stream=0x%llx ns=%llu",                                    \
             log_str((li).name, nb_, sizeof nb_), (gx), (gy), (gz), (bx), (by), (bz), P(hs),                      \
             (unsigned long long)(li).ns);                                                                         \
    } while (0)

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                        unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                        unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    setup();
    struct launch_info li;
    (void)sharedMemBytes;
    CUresult r = launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams,
                        extra, &li);
    LAUNCH_LOG(r, li, hStream, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ);
    return r;
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                             unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                             unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
{
    setup();
    struct launch_info li;
    (void)sharedMemBytes;
    CUresult r = launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams,
                        extra, &li);
    LAUNCH_LOG(r, li, hStream, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ);
    return r;
}

static CUresult launch_ex(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra,
                          struct launch_info *li)
{
    if (cfg == NULL) {
        li->name = "?";
        li->ns = 0;
        return atomic_load(&g_init_ok) ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_INITIALIZED;
    }
    return launch(f, cfg->gridDimX, cfg->gridDimY, cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ,
                  cfg->hStream, params, extra, li);
}

#define LAUNCH_EX_LOG(r, li, cfg)                                                                                  \
    do {                                                                                                           \
        if (cfg)                                                                                                   \
            LAUNCH_LOG((r), (li), (cfg)->hStream, (cfg)->gridDimX, (cfg)->gridDimY, (cfg)->gridDimZ,               \
                       (cfg)->blockDimX, (cfg)->blockDimY, (cfg)->blockDimZ);                                      \
        else                                                                                                       \
            LOGR((r), "config=0x0");                                                                               \
    } while (0)

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    setup();
    struct launch_info li;
    CUresult r = launch_ex(config, f, kernelParams, extra, &li);
    LAUNCH_EX_LOG(r, li, config);
    return r;
}

CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra)
{
    setup();
    struct launch_info li;
    CUresult r = launch_ex(config, f, kernelParams, extra, &li);
    LAUNCH_EX_LOG(r, li, config);
    return r;
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
                                   unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
                                   unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
{
    setup();
    struct launch_info li;
    (void)sharedMemBytes;
    CUresult r = launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams,
                        NULL, &li);
    LAUNCH_LOG(r, li, hStream, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ);
    return r;
}

CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams)
{
    setup();
    struct launch_info li;
    (void)sharedMemBytes;
    CUresult r = launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream, kernelParams,
                        NULL, &li);
    LAUNCH_LOG(r, li, hStream, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ);
    return r;
}

CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    setup();
    uint64_t ns;
    CUresult r = graph_launch(hGraphExec, hStream, &ns);
    LOGR(r, "graph=0x%llx stream=0x%llx ns=%llu", P(hGraphExec), P(hStream), (unsigned long long)ns);
    return r;
}

CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    setup();
    uint64_t ns;
    CUresult r = graph_launch(hGraphExec, hStream, &ns);
    LOGR(r, "graph=0x%llx stream=0x%llx ns=%llu", P(hGraphExec), P(hStream), (unsigned long long)ns);
    return r;
}

/* ---- streams ----------------------------------------------------------- */

static CUresult stream_create(CUstream *ph, unsigned flags)
{
    NEED_INIT();
    if (ph == NULL || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS) {
        struct CUstream_st *s = calloc(1, sizeof *s);
        if (s == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            s->magic = MAGIC_STREAM;
            s->id = ++g_stream_ids;
            s->ctx = c;
            s->gen = c->gen;
            s->flags = flags;
            *ph = s;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    setup();
    CUresult r = stream_create(phStream, Flags);
    LOGR(r, "flags=%u", Flags);
    return r;
}

CUresult cuStreamDestroy(CUstream hStream)
{
    setup();
    CUresult r = stream_destroy(hStream);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    setup();
    CUresult r = stream_destroy(hStream);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    setup();
    CUresult r = stream_sync(hStream);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    setup();
    CUresult r = stream_sync(hStream);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamQuery(CUstream hStream)
{
    setup();
    CUresult r = stream_query(hStream);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    setup();
    CUresult r = stream_query(hStream);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    setup();
    CUresult r = stream_wait_event(hStream, hEvent, Flags);
    LOGR(r, "stream=0x%llx event=0x%llx flags=%u", P(hStream), P(hEvent), Flags);
    return r;
}

CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    setup();
    CUresult r = stream_wait_event(hStream, hEvent, Flags);
    LOGR(r, "stream=0x%llx event=0x%llx flags=%u", P(hStream), P(hEvent), Flags);
    return r;
}

CUresult cuStreamBeginCapture(CUstream hStream)
{
    setup();
    CUresult r = begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    setup();
    CUresult r = begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    setup();
    CUresult r = begin_capture(hStream, (int)mode);
    LOGR(r, "stream=0x%llx mode=%d", P(hStream), (int)mode);
    return r;
}

CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    setup();
    CUresult r = begin_capture(hStream, (int)mode);
    LOGR(r, "stream=0x%llx mode=%d", P(hStream), (int)mode);
    return r;
}

CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    setup();
    CUresult r = end_capture(hStream, phGraph);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    setup();
    CUresult r = end_capture(hStream, phGraph);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    setup();
    CUresult r = is_capturing(hStream, captureStatus);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    setup();
    CUresult r = is_capturing(hStream, captureStatus);
    LOGR(r, "stream=0x%llx", P(hStream));
    return r;
}

/* ---- graphs ------------------------------------------------------------ */

static CUresult graph_instantiate(CUgraphExec *pe, CUgraph g)
{
    NEED_INIT();
    if (pe == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (g == NULL || g->magic != MAGIC_GRAPH) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        struct CUgraphExec_st *e = calloc(1, sizeof *e);
        if (e == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            e->magic = MAGIC_EXEC;
            e->total_ns = g->total_ns;
            e->kernels = g->kernels;
            *pe = e;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
    setup();
    CUresult r = graph_instantiate(phGraphExec, hGraph);
    LOGR(r, "graph=0x%llx flags=%llu", P(hGraph), flags);
    return r;
}

static CUresult graph_free(void *g, uint32_t magic)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (g == NULL || *(uint32_t *)g != magic) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        *(uint32_t *)g = MAGIC_DEAD;
        free(g);
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    setup();
    CUresult r = graph_free(hGraphExec, MAGIC_EXEC);
    LOGR(r, "graph=0x%llx", P(hGraphExec));
    return r;
}

CUresult cuGraphDestroy(CUgraph hGraph)
{
    setup();
    CUresult r = graph_free(hGraph, MAGIC_GRAPH);
    LOGR(r, "graph=0x%llx", P(hGraph));
    return r;
}

/* ---- events ------------------------------------------------------------ */

static CUresult event_create(CUevent *pe, unsigned flags)
{
    NEED_INIT();
    if (pe == NULL || (flags & ~7u))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    struct CUctx_st *c;
    CUresult r = need_ctx(&c);
    if (r == CUDA_SUCCESS) {
        struct CUevent_st *e = calloc(1, sizeof *e);
        if (e == NULL) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            e->magic = MAGIC_EVENT;
            e->flags = flags;
            e->ctx = c;
            *pe = e;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    setup();
    CUresult r = event_create(phEvent, Flags);
    LOGR(r, "flags=%u", Flags);
    return r;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    setup();
    CUresult r = event_record(hEvent, hStream, 0);
    LOGR(r, "event=0x%llx stream=0x%llx", P(hEvent), P(hStream));
    return r;
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    setup();
    CUresult r = event_record(hEvent, hStream, 0);
    LOGR(r, "event=0x%llx stream=0x%llx", P(hEvent), P(hStream));
    return r;
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    setup();
    CUresult r = event_record(hEvent, hStream, flags);
    LOGR(r, "event=0x%llx stream=0x%llx flags=%u", P(hEvent), P(hStream), flags);
    return r;
}

CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    setup();
    CUresult r = event_record(hEvent, hStream, flags);
    LOGR(r, "event=0x%llx stream=0x%llx flags=%u", P(hEvent), P(hStream), flags);
    return r;
}

static CUresult event_query(CUevent e)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    if (!event_ok(e))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (!event_done_locked(e))
        r = CUDA_ERROR_NOT_READY;
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUresult cuEventQuery(CUevent hEvent)
{
    setup();
    CUresult r = event_query(hEvent);
    LOGR(r, "event=0x%llx", P(hEvent));
    return r;
}

static CUresult event_sync(CUevent e)
{
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    CUresult r = CUDA_SUCCESS;
    struct tl_pos until = {-1, 0, 0};
    int dev = -1;
    if (!event_ok(e)) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        if (e->recorded && !e->resolved)
            until = e->pos;
        if (e->recorded)
            dev = e->dev;
        else if (e->ctx != NULL && e->ctx->magic == MAGIC_CTX)
            dev = e->ctx->dev;
    }
    pthread_mutex_unlock(&g_mu);
    if (r == CUDA_SUCCESS) {
        tl_wait(dev, until);
        sync_trim(dev);
    }
    return r;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    setup();
    CUresult r = event_sync(hEvent);
    LOGR(r, "event=0x%llx", P(hEvent));
    return r;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    setup();
    CUresult r = elapsed(pMilliseconds, hStart, hEnd);
    LOGR(r, "start=0x%llx end=0x%llx", P(hStart), P(hEnd));
    return r;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    setup();
    CUresult r = elapsed(pMilliseconds, hStart, hEnd);
    LOGR(r, "start=0x%llx end=0x%llx", P(hStart), P(hEnd));
    return r;
}

CUresult cuEventDestroy(CUevent hEvent)
{
    setup();
    CUresult r = event_destroy(hEvent);
    LOGR(r, "event=0x%llx", P(hEvent));
    return r;
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    setup();
    CUresult r = event_destroy(hEvent);
    LOGR(r, "event=0x%llx", P(hEvent));
    return r;
}

/* ---- cuGetProcAddress -------------------------------------------------- */

static CUresult proc_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    setup();
    CUresult r = proc_lookup(symbol, pfn, cudaVersion, flags, NULL);
    char buf[128];
    LOGR(r, "symbol=%s version=%d flags=%llu", log_str(symbol, buf, sizeof buf), cudaVersion,
         (unsigned long long)flags);
    return r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    setup();
    CUresult r = proc_lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
    char buf[128];
    LOGR(r, "symbol=%s version=%d flags=%llu", log_str(symbol, buf, sizeof buf), cudaVersion,
         (unsigned long long)flags);
    return r;
}

/* ==== export table ===================================================== */

/* Every exported function, once. build.sh checks this list against
 * `nm -D` of the built library and against cuslice_cuda.h. */
#define FAKE_CUDA_EXPORTS(X)                                                                                       \
    X(cuInit)                                                                                                      \
    X(cuDriverGetVersion)                                                                                          \
    X(cuGetProcAddress)                                                                                            \
    X(cuGetProcAddress_v2)                                                                                         \
    X(cuDeviceGet)                                                                                                 \
    X(cuDeviceGetCount)                                                                                            \
    X(cuDeviceGetName)                                                                                             \
    X(cuDeviceGetUuid)                                                                                             \
    X(cuDeviceGetUuid_v2)                                                                                          \
    X(cuDeviceGetAttribute)                                                                                        \
    X(cuDeviceTotalMem)                                                                                            \
    X(cuDeviceTotalMem_v2)                                                                                         \
    X(cuDeviceGetDefaultMemPool)                                                                                   \
    X(cuDeviceGetMemPool)                                                                                          \
    X(cuFakeUsedBytes)                                                                                             \
    X(cuDevicePrimaryCtxRetain)                                                                                    \
    X(cuDevicePrimaryCtxRelease)                                                                                   \
    X(cuDevicePrimaryCtxRelease_v2)                                                                                \
    X(cuDevicePrimaryCtxReset)                                                                                     \
    X(cuDevicePrimaryCtxReset_v2)                                                                                  \
    X(cuDevicePrimaryCtxGetState)                                                                                  \
    X(cuCtxCreate)                                                                                                 \
    X(cuCtxCreate_v2)                                                                                              \
    X(cuCtxCreate_v3)                                                                                              \
    X(cuCtxCreate_v4)                                                                                              \
    X(cuCtxDestroy)                                                                                                \
    X(cuCtxDestroy_v2)                                                                                             \
    X(cuCtxGetCurrent)                                                                                             \
    X(cuCtxSetCurrent)                                                                                             \
    X(cuCtxGetDevice)                                                                                              \
    X(cuCtxSynchronize)                                                                                            \
    X(cuCtxSynchronize_v2)                                                                                         \
    X(cuCtxPushCurrent)                                                                                            \
    X(cuCtxPushCurrent_v2)                                                                                         \
    X(cuCtxPopCurrent)                                                                                             \
    X(cuCtxPopCurrent_v2)                                                                                          \
    X(cuMemAlloc)                                                                                                  \
    X(cuMemAlloc_v2)                                                                                               \
    X(cuMemAllocPitch)                                                                                             \
    X(cuMemAllocPitch_v2)                                                                                          \
    X(cuMemAllocManaged)                                                                                           \
    X(cuMemFree)                                                                                                   \
    X(cuMemFree_v2)                                                                                                \
    X(cuMemHostAlloc)                                                                                              \
    X(cuMemFreeHost)                                                                                               \
    X(cuMemGetInfo)                                                                                                \
    X(cuMemGetInfo_v2)                                                                                             \
    X(cuMemcpyHtoD)                                                                                                \
    X(cuMemcpyHtoD_v2)                                                                                             \
    X(cuMemcpyHtoD_v2_ptds)                                                                                        \
    X(cuMemcpyDtoH)                                                                                                \
    X(cuMemcpyDtoH_v2)                                                                                             \
    X(cuMemcpyDtoH_v2_ptds)                                                                                        \
    X(cuMemsetD8)                                                                                                  \
    X(cuMemsetD8_v2)                                                                                               \
    X(cuMemsetD8_v2_ptds)                                                                                          \
    X(cuMemAllocAsync)                                                                                             \
    X(cuMemAllocAsync_ptsz)                                                                                        \
    X(cuMemAllocFromPoolAsync)                                                                                     \
    X(cuMemAllocFromPoolAsync_ptsz)                                                                                \
    X(cuMemFreeAsync)                                                                                              \
    X(cuMemFreeAsync_ptsz)                                                                                         \
    X(cuMemPoolTrimTo)                                                                                             \
    X(cuMemPoolSetAttribute)                                                                                       \
    X(cuMemPoolGetAttribute)                                                                                       \
    X(cuMemCreate)                                                                                                 \
    X(cuMemRelease)                                                                                                \
    X(cuMemAddressReserve)                                                                                         \
    X(cuMemAddressFree)                                                                                            \
    X(cuMemMap)                                                                                                    \
    X(cuMemUnmap)                                                                                                  \
    X(cuMemSetAccess)                                                                                              \
    X(cuMemGetAllocationGranularity)                                                                               \
    X(cuArrayCreate_v2)                                                                                            \
    X(cuArray3DCreate_v2)                                                                                          \
    X(cuArrayDestroy)                                                                                              \
    X(cuMipmappedArrayCreate)                                                                                      \
    X(cuMipmappedArrayDestroy)                                                                                     \
    X(cuModuleLoadData)                                                                                            \
    X(cuModuleGetFunction)                                                                                         \
    X(cuModuleUnload)                                                                                              \
    X(cuLaunchKernel)                                                                                              \
    X(cuLaunchKernel_ptsz)                                                                                         \
    X(cuLaunchKernelEx)                                                                                            \
    X(cuLaunchKernelEx_ptsz)                                                                                       \
    X(cuLaunchCooperativeKernel)                                                                                   \
    X(cuLaunchCooperativeKernel_ptsz)                                                                              \
    X(cuGraphLaunch)                                                                                               \
    X(cuGraphLaunch_ptsz)                                                                                          \
    X(cuStreamCreate)                                                                                              \
    X(cuStreamDestroy)                                                                                             \
    X(cuStreamDestroy_v2)                                                                                          \
    X(cuStreamSynchronize)                                                                                         \
    X(cuStreamSynchronize_ptsz)                                                                                    \
    X(cuStreamQuery)                                                                                               \
    X(cuStreamQuery_ptsz)                                                                                          \
    X(cuStreamWaitEvent)                                                                                           \
    X(cuStreamWaitEvent_ptsz)                                                                                      \
    X(cuStreamBeginCapture)                                                                                        \
    X(cuStreamBeginCapture_ptsz)                                                                                   \
    X(cuStreamBeginCapture_v2)                                                                                     \
    X(cuStreamBeginCapture_v2_ptsz)                                                                                \
    X(cuStreamEndCapture)                                                                                          \
    X(cuStreamEndCapture_ptsz)                                                                                     \
    X(cuStreamIsCapturing)                                                                                         \
    X(cuStreamIsCapturing_ptsz)                                                                                    \
    X(cuGraphInstantiateWithFlags)                                                                                 \
    X(cuGraphExecDestroy)                                                                                          \
    X(cuGraphDestroy)                                                                                              \
    X(cuEventCreate)                                                                                               \
    X(cuEventRecord)                                                                                               \
    X(cuEventRecord_ptsz)                                                                                          \
    X(cuEventRecordWithFlags)                                                                                      \
    X(cuEventRecordWithFlags_ptsz)                                                                                 \
    X(cuEventQuery)                                                                                                \
    X(cuEventSynchronize)                                                                                          \
    X(cuEventElapsedTime)                                                                                          \
    X(cuEventElapsedTime_v2)                                                                                       \
    X(cuEventDestroy)                                                                                              \
    X(cuEventDestroy_v2)

/* Hidden aliases: taking their address yields this library's own function
 * (a reference to the exported name could bind to a preloaded shim's). */
#define FAKE_ALIAS(n) extern __typeof__(n) fake_local_##n __attribute__((alias(#n), visibility("hidden")));
FAKE_CUDA_EXPORTS(FAKE_ALIAS)

typedef void (*fake_fn)(void);

struct proc_entry {
    const char *name;
    fake_fn fn;
};

#define FAKE_ENTRY(n) {#n, (fake_fn)&fake_local_##n},
static const struct proc_entry g_procs[] = {FAKE_CUDA_EXPORTS(FAKE_ENTRY)};

/* Which versioned entry a base name means for a caller built against
 * cudaVersion (first match wins, so newer rows come first). */
struct ver_map {
    const char *base;
    const char *target;
    int min_version;
};

static const struct ver_map g_vmap[] = {
    {"cuMemAlloc", "cuMemAlloc_v2", 3020},
    {"cuMemFree", "cuMemFree_v2", 3020},
    {"cuMemGetInfo", "cuMemGetInfo_v2", 3020},
    {"cuMemAllocPitch", "cuMemAllocPitch_v2", 3020},
    {"cuDeviceTotalMem", "cuDeviceTotalMem_v2", 3020},
    {"cuArrayCreate", "cuArrayCreate_v2", 3020},
    {"cuArray3DCreate", "cuArray3DCreate_v2", 3020},
    {"cuMemcpyHtoD", "cuMemcpyHtoD_v2", 3020},
    {"cuMemcpyDtoH", "cuMemcpyDtoH_v2", 3020},
    {"cuMemsetD8", "cuMemsetD8_v2", 3020},
    {"cuCtxCreate", "cuCtxCreate_v4", 12050},
    {"cuCtxCreate", "cuCtxCreate_v3", 11040},
    {"cuCtxCreate", "cuCtxCreate_v2", 3020},
    {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxRelease_v2", 11000},
    {"cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxReset_v2", 11000},
    {"cuCtxDestroy", "cuCtxDestroy_v2", 4000},
    {"cuCtxPushCurrent", "cuCtxPushCurrent_v2", 4000},
    {"cuCtxPopCurrent", "cuCtxPopCurrent_v2", 4000},
    {"cuEventDestroy", "cuEventDestroy_v2", 4000},
    {"cuStreamDestroy", "cuStreamDestroy_v2", 4000},
    {"cuGetProcAddress", "cuGetProcAddress_v2", 12000},
    {"cuDeviceGetUuid", "cuDeviceGetUuid_v2", 11040},
    {"cuEventElapsedTime", "cuEventElapsedTime_v2", 12080},
    {"cuStreamBeginCapture", "cuStreamBeginCapture_v2", 10010},
    {"cuGraphInstantiate", "cuGraphInstantiateWithFlags", 12000},
};

static void *proc_find(const char *name)
{
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++)
        if (strcmp(g_procs[i].name, name) == 0) {
            void *p; /* POSIX guarantees a function pointer fits a void * */
            memcpy(&p, &g_procs[i].fn, sizeof p);
            return p;
        }
    return NULL;
}

static CUresult proc_lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                            CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL || (flags & ~(cuuint64_t)3) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    const char *target = symbol;
    for (size_t i = 0; i < sizeof g_vmap / sizeof g_vmap[0]; i++)
        if (strcmp(g_vmap[i].base, symbol) == 0 && version >= g_vmap[i].min_version) {
            target = g_vmap[i].target;
            break;
        }
    void *fn = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        char name[160];
        snprintf(name, sizeof name, "%s_ptsz", target);
        fn = proc_find(name);
        if (fn == NULL) {
            snprintf(name, sizeof name, "%s_ptds", target);
            fn = proc_find(name);
        }
    }
    if (fn == NULL)
        fn = proc_find(target);
    *pfn = fn;
    if (status)
        *status = fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
