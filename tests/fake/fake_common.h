/*
 * cuslice fake driver: state shared by the fake libcuda.so.1, the fake
 * libnvidia-ml.so.1 and the fake libcupti.so.13, the environment they read,
 * and the call log.
 *
 * Written for cuslice's tests. The three libraries include this header; so may a
 * test that wants to read the simulated device counters directly (see
 * fake_state_attach). Everything here is `static inline`, so each includer
 * gets its own copy and nothing here is exported.
 *
 * Requires _GNU_SOURCE (for F_OFD_SETLK and memfd_create): define it before
 * any system header, or compile with -D_GNU_SOURCE.
 */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#ifndef _GNU_SOURCE
#error "fake_common.h needs _GNU_SOURCE: define it before any #include (or pass -D_GNU_SOURCE)"
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- limits and layout of the shared state ---------------------------- */

#define FAKE_MAX_DEVICES 16
#define FAKE_MAX_SLOTS 128
/* "FAKEGPU1" read as a little-endian u64. */
#define FAKE_STATE_MAGIC 0x31555047454B4146ULL
#define FAKE_STATE_VERSION 5u
/* OFD lock on byte FAKE_SLOT_LOCK_BASE + i of the state file proves that the
 * process owning slot i is alive (the kernel drops the lock when it dies).
 * Locks beyond end of file are fine. */
#define FAKE_SLOT_LOCK_BASE (1 << 20)
/* The same for entry i of the fake CUPTI's table (struct fake_cupti): byte
 * FAKE_CUPTI_LOCK_BASE + i, held by the fake libcupti of the owner. */
#define FAKE_CUPTI_LOCK_BASE (FAKE_SLOT_LOCK_BASE + FAKE_MAX_SLOTS)
/* Name of the memfd that holds a process-private state (FAKE_CUDA_STATE
 * unset); the fake NVML finds the fake libcuda's state by this name. */
#define FAKE_PRIVATE_MEMFD_NAME "cuslice_fake_cuda_state"

_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free to share them between processes");

/* One simulated GPU. All fields are device-wide: every process that maps the
 * same state file adds to the same counters, like a real GPU. */
struct fake_dev_state {
    _Atomic uint64_t used_bytes;     /* device memory in use, all processes */
    _Atomic uint64_t busy_until_ns;  /* CLOCK_MONOTONIC end of all queued work if nothing more is submitted */
    _Atomic uint64_t kernels_run;    /* kernels put on the timeline (a graph adds its kernel count) */
    _Atomic uint64_t busy_ns_total;  /* sum of the durations put on the timeline */
    _Atomic uint64_t launches;       /* launch calls that reached the timeline (kernel or graph) */
    _Atomic uint64_t graph_launches; /* cuGraphLaunch calls that reached the timeline */
    uint64_t reserved_[2];
};

/* One process that allocated through the fake libcuda. used[] mirrors what
 * that process added to dev[].used_bytes, so that the next process to look
 * can give a dead process's memory back (a real GPU frees it at exit).
 * The fields after used[] (version 3) are what the fake NVML reports per
 * process: who it is as any PID namespace sees it, whether it has a context
 * on a device, and how long each device ran its work. */
struct fake_slot {
    _Atomic int32_t pid;  /* 0: free; else getpid() in the owner's own PID namespace */
    _Atomic uint32_t gen; /* bumped each time the slot is claimed: tells its owners apart */
    _Atomic uint64_t used[FAKE_MAX_DEVICES];
    _Atomic uint64_t pidns;       /* inode of the owner's /proc/self/ns/pid (0: unknown) */
    _Atomic uint64_t start_ticks; /* field 22 of the owner's /proc/self/stat (clock ticks since boot) */
    _Atomic uint32_t ctxs[FAKE_MAX_DEVICES];     /* live contexts of the owner on each device */
    _Atomic uint64_t run_ns[FAKE_MAX_DEVICES];   /* ns the device ran the owner's work (retired or dropped mid-way) */
    _Atomic uint64_t first_ns[FAKE_MAX_DEVICES]; /* CLOCK_MONOTONIC start of the owner's first work there, 0: none */
};

/* ---- the GPU timeline (fake_cuda.c, "==== timeline", runs it) ---------- *
 *
 * Each context that has launched work owns one queue from a pool: a ring
 * of work items in submission order (all its streams together). Per
 * device, one queue at a time holds the device ("running"); the simulation
 * is advanced lazily, under `mu`, by whichever process calls in. Positions
 * in a queue are counts: item n (0-based) is ring[n % FAKE_TL_RING]; a
 * "mark" m means "the first m items", done once head >= m. */
#define FAKE_TL_QUEUES 128
#define FAKE_TL_RING 1024
#define FAKE_TIMESLICE_NS_DEFAULT 2000000ull

struct fake_tl_item {
    uint64_t ns; /* duration */
    uint64_t t;  /* pending: submission time (never starts before it); retired: end time */
    /* For the fake CUPTI's kernel records (fake_cupti.c), set at launch: */
    uint32_t ctx_id;    /* the launching context's contextId */
    uint32_t stream_id; /* the stream's streamId */
    uint16_t cupti;     /* 0: not recorded; else 1 + the fake CUPTI entry (cupti.p[]) that wants a record */
    uint16_t kind;      /* the record's activity kind (CUPTI_ACTIVITY_KIND_*) */
    uint32_t cupti_gen; /* that entry's gen at launch: a record for an entry claimed since is discarded */
};

struct fake_tl_queue {
    int32_t dev;        /* -1: free */
    int32_t owner;      /* slot of the owning process; -1: none (never reclaimed) */
    uint32_t owner_gen; /* slot[owner].gen when the queue was taken */
    uint32_t pad_;
    uint64_t epoch;      /* bumped when the queue is taken and when it is dropped */
    uint64_t head;       /* items retired */
    uint64_t tail;       /* items submitted; tail - head <= FAKE_TL_RING are pending */
    uint64_t started_ns; /* start of item `head` while this queue holds its device */
    uint64_t checked_ns; /* when the owner was last found alive */
    struct fake_tl_item ring[FAKE_TL_RING];
};

struct fake_tl_dev {
    int32_t running;   /* queue holding the device, -1: idle */
    int32_t last;      /* queue that held it last: round robin resumes after it */
    uint32_t npending; /* queues of this device with pending work */
    uint32_t pad_;
    uint64_t clock_ns;       /* simulated up to here (CLOCK_MONOTONIC) */
    uint64_t slice_start_ns; /* when `running` got the device */
};

struct fake_timeline {
    /* Process-shared, robust: guards everything below. A process killed
     * while holding it leaves EOWNERDEAD to the next locker, which repairs
     * the counts and carries on. */
    pthread_mutex_t mu;
    uint64_t repairs; /* times a locker found the owner dead (EOWNERDEAD) */
    struct fake_tl_dev dev[FAKE_MAX_DEVICES];
    struct fake_tl_queue q[FAKE_TL_QUEUES];
};

/* ---- the fake CUPTI (fake_cupti.c) ------------------------------------ *
 *
 * One entry per process that enabled kernel records through the fake
 * libcupti.so.13 (claimed at its first cuptiActivityEnable, kept until it
 * dies). libcuda reads `kinds` at each launch and marks the ring item
 * (fake_tl_item.cupti); whichever process retires a marked item in the
 * timeline (fake_timeline.h, tl_run) appends its record here; the owner's
 * cuptiActivityFlushAll takes them out. Everything is guarded by the
 * timeline's mutex (tl.mu). The records are copied out of the queue's ring
 * when the item retires, before its ring entry can be reused. */
#define FAKE_CUPTI_PROCS 64
#define FAKE_CUPTI_RECS 8192

struct fake_cupti_rec {
    uint64_t start, end; /* CLOCK_MONOTONIC ns: when the timeline started and completed the item */
    uint32_t dev, ctx_id, stream_id, kind;
};

struct fake_cupti_proc {
    int32_t pid;          /* 0: never claimed; else getpid() in the owner's own PID namespace */
    uint32_t gen;         /* bumped at each claim and at the owner's cuptiFinalize */
    uint64_t pidns;       /* as fake_slot's: who the owner is from any namespace */
    uint64_t start_ticks;
    uint32_t kinds;       /* bit k set: activity kind k enabled (CUPTI_ACTIVITY_KIND_KERNEL 3, CONCURRENT_KERNEL 10) */
    uint32_t pad_;
    uint64_t head, tail;  /* records [head, tail) wait for a flush: rec[n % FAKE_CUPTI_RECS] */
    uint64_t dropped;     /* records lost since the owner last read the count: rec[] was full */
    struct fake_cupti_rec rec[FAKE_CUPTI_RECS];
};

struct fake_cupti {
    uint64_t epoch; /* bumped at every claim and cuptiFinalize: libcuda looks its entry up again */
    struct fake_cupti_proc p[FAKE_CUPTI_PROCS];
};

/* The fake NVML's utilization samples (version 5): per slot and device,
 * the owner's run time (run_ns) at each boundary of the sample grid
 * (multiples of FAKE_NVML_SAMPLE_MS on CLOCK_MONOTONIC), the last
 * FAKE_SAMPLES of them; written by the timeline as it credits run time,
 * under its mutex. */
#define FAKE_SAMPLES 32
struct fake_samp {
    uint32_t gen;                 /* the slot's gen these boundaries belong to (0: none yet) */
    uint32_t reserved_;
    uint64_t k;                   /* the last boundary recorded (its index on the grid) */
    uint64_t k0;                  /* the first (the owner ran nothing before it) */
    uint64_t run[FAKE_SAMPLES];   /* run_ns at boundary j, at run[j % FAKE_SAMPLES] */
};

struct fake_state {
    _Atomic uint64_t magic; /* FAKE_STATE_MAGIC once initialised (written last) */
    uint32_t version;       /* FAKE_STATE_VERSION */
    uint32_t size;          /* sizeof(struct fake_state) */
    uint64_t reserved_[6];
    struct fake_dev_state dev[FAKE_MAX_DEVICES];
    struct fake_slot slot[FAKE_MAX_SLOTS];
    struct fake_timeline tl;
    struct fake_cupti cupti; /* after the timeline: a fresh file keeps it sparse until used */
    struct fake_samp samp[FAKE_MAX_SLOTS][FAKE_MAX_DEVICES];
};

/* ---- time ------------------------------------------------------------ */

static inline uint64_t fake_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleeps (never spins) until CLOCK_MONOTONIC reaches t. */
static inline void fake_sleep_until_ns(uint64_t t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)(t / 1000000000ull);
    ts.tv_nsec = (long)(t % 1000000000ull);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* ---- environment ----------------------------------------------------- */

/* Parses "123", "4K", "4KiB", "512m", "16GiB", "1T" (binary multiples, case
 * insensitive, optional "B"/"iB"). Returns 0 on success, -1 on bad input or
 * overflow. */
static inline int fake_parse_size(const char *s, uint64_t *out)
{
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    case 't': case 'T': shift = 40; end++; break;
    default: return -1;
    }
    if (shift != 0) {
        if ((end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B'))
            end += 2;
        else if (end[0] == 'b' || end[0] == 'B')
            end += 1;
    }
    if (*end != '\0')
        return -1;
    if (shift != 0 && v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

struct fake_config {
    unsigned ndev;         /* FAKE_CUDA_DEVICES, 0..16, default 1 */
    uint64_t mem_total;    /* FAKE_CUDA_MEM, default 16 GiB */
    uint64_t ctx_overhead; /* FAKE_CUDA_CTX_OVERHEAD, default 0 */
    uint64_t kernel_ns;    /* FAKE_CUDA_KERNEL_NS, default 0 */
    uint64_t timeslice_ns; /* FAKE_CUDA_TIMESLICE_NS, default 2 ms */
    uint64_t pitch_align;  /* FAKE_CUDA_PITCH_ALIGN, a power of two 4..65536, default 512 */
    uint64_t granularity;  /* FAKE_CUDA_ALLOC_GRANULARITY, a power of two 4 KiB..1 GiB, default 2 MiB */
    uint64_t sample_ns;    /* FAKE_NVML_SAMPLE_MS in ns, 1 ms..10 s, default 166 ms */
    int driver_version;    /* FAKE_CUDA_VERSION, default 13000 */
    int log_fd;            /* FAKE_CUDA_LOG opened O_APPEND, or -1 */
    const char *state_path;/* FAKE_CUDA_STATE, or NULL */
};

static inline void fake_die_env(const char *who, const char *var, const char *val, const char *expected)
{
    fprintf(stderr, "%s: %s=\"%s\": expected %s\n", who, var, val, expected);
    abort();
}

/* Reads the FAKE_CUDA_* variables. A malformed value is a test bug: it is
 * reported on stderr and the process aborts. */
static inline void fake_config_load(struct fake_config *c, const char *who)
{
    const char *v;
    uint64_t n;

    c->ndev = 1;
    if ((v = getenv("FAKE_CUDA_DEVICES")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0 || n > FAKE_MAX_DEVICES || strspn(v, "0123456789") != strlen(v))
            fake_die_env(who, "FAKE_CUDA_DEVICES", v, "an integer 0..16");
        c->ndev = (unsigned)n;
    }
    c->mem_total = 16ull << 30;
    if ((v = getenv("FAKE_CUDA_MEM")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0)
            fake_die_env(who, "FAKE_CUDA_MEM", v, "a size: bytes, or a K/M/G/T/KiB/MiB/GiB/TiB suffix");
        c->mem_total = n;
    }
    c->ctx_overhead = 0;
    if ((v = getenv("FAKE_CUDA_CTX_OVERHEAD")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0)
            fake_die_env(who, "FAKE_CUDA_CTX_OVERHEAD", v, "a size: bytes, or a K/M/G/T/KiB/MiB/GiB/TiB suffix");
        c->ctx_overhead = n;
    }
    c->kernel_ns = 0;
    if ((v = getenv("FAKE_CUDA_KERNEL_NS")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0 || strspn(v, "0123456789") != strlen(v))
            fake_die_env(who, "FAKE_CUDA_KERNEL_NS", v, "an integer number of nanoseconds");
        c->kernel_ns = n;
    }
    c->timeslice_ns = FAKE_TIMESLICE_NS_DEFAULT;
    if ((v = getenv("FAKE_CUDA_TIMESLICE_NS")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0 || strspn(v, "0123456789") != strlen(v))
            fake_die_env(who, "FAKE_CUDA_TIMESLICE_NS", v, "an integer number of nanoseconds");
        c->timeslice_ns = n;
    }
    /* The row pitch cuMemAllocPitch pads to: a device property, which the
     * shim does not know (it admits an upper bound, then settles to what
     * the driver gave). Varied by tests so that the two never agree by
     * construction. */
    c->pitch_align = 512;
    if ((v = getenv("FAKE_CUDA_PITCH_ALIGN")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0 || strspn(v, "0123456789") != strlen(v) || n < 4 || n > 65536 ||
            (n & (n - 1)) != 0)
            fake_die_env(who, "FAKE_CUDA_PITCH_ALIGN", v, "a power of two from 4 to 65536");
        c->pitch_align = n;
    }
    /* The device's page: a linear allocation of at least one takes whole
     * pages (what cuMemGetInfo and NVML then count), a smaller one is
     * sub-allocated and counted as asked; cuMemGetAllocationGranularity
     * answers it. Varied by tests, so that what the driver takes and what
     * a caller asked for differ as on a real GPU. */
    c->granularity = 2ull << 20;
    if ((v = getenv("FAKE_CUDA_ALLOC_GRANULARITY")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0 || n < 4096 || n > (1ull << 30) || (n & (n - 1)) != 0)
            fake_die_env(who, "FAKE_CUDA_ALLOC_GRANULARITY", v, "a power of two from 4KiB to 1GiB");
        c->granularity = n;
    }
    /* The fake NVML's per-process utilization sample period: like a real
     * NVML's (about 1/6 s), each sample covers one period of a fixed grid
     * (multiples of it on CLOCK_MONOTONIC, the same for every process). */
    c->sample_ns = 166000000ull;
    if ((v = getenv("FAKE_NVML_SAMPLE_MS")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0 || strspn(v, "0123456789") != strlen(v) || n < 1 || n > 10000)
            fake_die_env(who, "FAKE_NVML_SAMPLE_MS", v, "an integer number of milliseconds from 1 to 10000");
        c->sample_ns = n * 1000000ull;
    }
    c->driver_version = 13000;
    if ((v = getenv("FAKE_CUDA_VERSION")) != NULL && *v) {
        if (fake_parse_size(v, &n) != 0 || n == 0 || n > 0x7fffffff || strspn(v, "0123456789") != strlen(v))
            fake_die_env(who, "FAKE_CUDA_VERSION", v, "a positive integer such as 13000");
        c->driver_version = (int)n;
    }
    c->log_fd = -1;
    if ((v = getenv("FAKE_CUDA_LOG")) != NULL && *v) {
        c->log_fd = open(v, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
        if (c->log_fd < 0) {
            fprintf(stderr, "%s: FAKE_CUDA_LOG=\"%s\": %s\n", who, v, strerror(errno));
            abort();
        }
    }
    c->state_path = NULL;
    if ((v = getenv("FAKE_CUDA_STATE")) != NULL && *v)
        c->state_path = strdup(v);
}

/* ---- call log -------------------------------------------------------- */

/* Appends "<pid> <name>[ <args>] -> <result>\n" with one write(2). `args` is
 * a printf format of space-separated key=value pairs, or NULL. */
static inline void fake_log_result(int fd, const char *name, const char *result, const char *fmt, va_list ap)
{
    if (fd < 0)
        return;
    char buf[768];
    size_t cap = sizeof buf - 48; /* room for " -> <result>\n" */
    int n = snprintf(buf, cap, "%ld %s", (long)getpid(), name);
    if (n < 0)
        return;
    size_t len = (size_t)n < cap ? (size_t)n : cap - 1;
    if (fmt != NULL && len < cap - 2) {
        buf[len++] = ' ';
        int m = vsnprintf(buf + len, cap - len, fmt, ap);
        if (m > 0)
            len += (size_t)m < cap - len ? (size_t)m : cap - len - 1;
    }
    n = snprintf(buf + len, sizeof buf - len, " -> %.32s\n", result);
    if (n > 0)
        len += (size_t)n;
    ssize_t w = write(fd, buf, len);
    (void)w;
}

/* Same, variadic; `fmt` may be NULL (no arguments to log). */
static inline void fake_log(int fd, const char *name, const char *result, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fake_log_result(fd, name, result, fmt, ap);
    va_end(ap);
}

/* ---- uuids ----------------------------------------------------------- */

/* The 16 bytes cuDeviceGetUuid returns for device `idx`:
 * c511ce00-fa4e-4000-8000-0000000000XX (XX = idx in hex). */
static inline void fake_uuid_bytes(int idx, unsigned char out[16])
{
    static const unsigned char base[16] = {0xc5, 0x11, 0xce, 0x00, 0xfa, 0x4e, 0x40, 0x00,
                                           0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    memcpy(out, base, 16);
    out[15] = (unsigned char)idx;
}

/* "GPU-c511ce00-fa4e-4000-8000-0000000000XX" (40 characters + NUL). */
static inline void fake_uuid_string(int idx, char out[41])
{
    unsigned char b[16];
    fake_uuid_bytes(idx, b);
    snprintf(out, 41, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

#define FAKE_DEVICE_NAME "cuslice Fake GPU"

/* ---- the state mapping ----------------------------------------------- */

/* Maps the state held by `fd` (sizing and initialising it under flock when
 * its magic is absent). Returns NULL on failure. */
static inline struct fake_state *fake_state_map_fd(int fd)
{
    if (flock(fd, LOCK_EX) != 0)
        return NULL;
    struct stat st;
    struct fake_state *s = NULL;
    if (fstat(fd, &st) != 0)
        goto out;
    if ((uint64_t)st.st_size < sizeof(struct fake_state) && ftruncate(fd, (off_t)sizeof(struct fake_state)) != 0)
        goto out;
    void *p = mmap(NULL, sizeof(struct fake_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        goto out;
    s = p;
    if (atomic_load(&s->magic) != FAKE_STATE_MAGIC || s->version != FAKE_STATE_VERSION ||
        s->size != sizeof(struct fake_state)) {
        /* ftruncate zero-filled what lies beyond the old size: clear only
         * the old part, so that a fresh file stays sparse. */
        size_t dirty = (uint64_t)st.st_size < sizeof *s ? (size_t)st.st_size : sizeof *s;
        memset((void *)s, 0, dirty);
        pthread_mutexattr_t a;
        if (pthread_mutexattr_init(&a) != 0 || pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED) != 0 ||
            pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST) != 0 || pthread_mutex_init(&s->tl.mu, &a) != 0) {
            munmap(p, sizeof(struct fake_state));
            s = NULL;
            goto out;
        }
        pthread_mutexattr_destroy(&a);
        for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
            s->tl.dev[d].running = -1;
            s->tl.dev[d].last = -1;
        }
        for (int i = 0; i < FAKE_TL_QUEUES; i++)
            s->tl.q[i].dev = -1;
        s->version = FAKE_STATE_VERSION;
        s->size = sizeof(struct fake_state);
        atomic_store(&s->magic, FAKE_STATE_MAGIC);
    }
out:
    flock(fd, LOCK_UN);
    return s;
}

/* The process-private state (FAKE_CUDA_STATE unset) that another library
 * of this process created: a memfd named FAKE_PRIVATE_MEMFD_NAME among our
 * open files. Returns a new open file description of it (its own OFD
 * locks), or -1 if there is none. */
static inline int fake_private_state_find(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    static const char want[] = "/memfd:" FAKE_PRIVATE_MEMFD_NAME;
    int found = -1;
    struct dirent *e;
    while (found < 0 && (e = readdir(d)) != NULL) {
        char path[64], target[256];
        snprintf(path, sizeof path, "/proc/self/fd/%.20s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0)
            continue;
        target[n] = '\0';
        if (strncmp(target, want, sizeof want - 1) == 0 &&
            (target[sizeof want - 1] == '\0' || target[sizeof want - 1] == ' '))
            found = open(path, O_RDWR | O_CLOEXEC);
    }
    closedir(d);
    return found;
}

/* Opens (creating if missing) and maps a state file. For tests that read the
 * counters: `fake_state_attach(getenv("FAKE_CUDA_STATE"), &fd)`. The fd must
 * stay open only if you use fake_state_reclaim_dead. Returns NULL on error. */
static inline struct fake_state *fake_state_attach(const char *path, int *fd_out)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        return NULL;
    struct fake_state *s = fake_state_map_fd(fd);
    if (s == NULL) {
        close(fd);
        return NULL;
    }
    if (fd_out != NULL)
        *fd_out = fd;
    else
        close(fd);
    return s;
}

static inline int fake_ofd_lock(int fd, int slot, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)FAKE_SLOT_LOCK_BASE + slot;
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* Gives back the device memory of processes that died without freeing it.
 * `fd` must be an open file description of the state of its own (an OFD lock
 * never conflicts with itself), `own_slot` the caller's slot or -1. */
static inline void fake_state_reclaim_dead(struct fake_state *s, int fd, int own_slot)
{
    if (s == NULL || fd < 0)
        return;
    for (int i = 0; i < FAKE_MAX_SLOTS; i++) {
        if (i == own_slot || atomic_load(&s->slot[i].pid) == 0)
            continue;
        if (fake_ofd_lock(fd, i, F_WRLCK) != 0)
            continue; /* alive */
        if (atomic_load(&s->slot[i].pid) != 0) {
            for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
                uint64_t v = atomic_exchange(&s->slot[i].used[d], 0);
                if (v != 0)
                    atomic_fetch_sub(&s->dev[d].used_bytes, v);
                atomic_store(&s->slot[i].ctxs[d], 0);
            }
            atomic_store(&s->slot[i].pid, 0);
        }
        fake_ofd_lock(fd, i, F_UNLCK);
    }
}

/* Does a live process hold slot i's lock? (F_OFD_GETLK: takes nothing.) `fd`
 * must not be the description that holds the lock (a lock never conflicts
 * with its own description), so never ask about your own slot. */
static inline int fake_slot_locked(int fd, int slot)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)FAKE_SLOT_LOCK_BASE + slot;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0)
        return 1; /* cannot tell: assume alive */
    return fl.l_type != F_UNLCK;
}

/* ---- processes as /proc shows them ------------------------------------ */

/* Inode of /proc/<pid>/ns/pid (`pid` "self" or a number): names the PID
 * namespace the same way from every namespace. 0 if it cannot be read. */
static inline uint64_t fake_pidns(const char *pid)
{
    char path[64];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%.20s/ns/pid", pid);
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Field 22 (starttime) of /proc/<pid>/stat: clock ticks since boot, the same
 * in every PID namespace. 0 if it cannot be read. */
/* Reads /proc/<pid>/<file> (one read) into buf, NUL-terminated; false if
 * it cannot be read. */
static inline bool fake_read_proc(const char *pid, const char *file, char *buf, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%.20s/%s", pid, file);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    return true;
}

static inline uint64_t fake_start_ticks(const char *pid)
{
    char buf[1024];
    if (!fake_read_proc(pid, "stat", buf, sizeof buf))
        return 0;
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and ')' */
    if (p == NULL)
        return 0;
    p++;
    /* after ")": field 3 (state) onwards; starttime is the 20th of them */
    for (int field = 3; field < 22; field++) {
        p = strchr(p + 1, ' ');
        if (p == NULL)
            return 0;
    }
    return strtoull(p + 1, NULL, 10);
}

/* Claims a free (or dead) slot for this process and keeps its lock on `fd`.
 * Returns the slot index or -1 when all are taken. */
static inline int fake_state_claim_slot(struct fake_state *s, int fd)
{
    for (int i = 0; i < FAKE_MAX_SLOTS; i++) {
        if (fake_ofd_lock(fd, i, F_WRLCK) != 0)
            continue;
        for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
            uint64_t v = atomic_exchange(&s->slot[i].used[d], 0);
            if (v != 0)
                atomic_fetch_sub(&s->dev[d].used_bytes, v);
        }
        for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
            atomic_store(&s->slot[i].ctxs[d], 0);
            atomic_store(&s->slot[i].run_ns[d], 0);
            atomic_store(&s->slot[i].first_ns[d], 0);
        }
        atomic_store(&s->slot[i].pidns, fake_pidns("self"));
        atomic_store(&s->slot[i].start_ticks, fake_start_ticks("self"));
        atomic_fetch_add(&s->slot[i].gen, 1);
        atomic_store(&s->slot[i].pid, (int32_t)getpid());
        return i;
    }
    return -1;
}

#endif /* FAKE_COMMON_H */
