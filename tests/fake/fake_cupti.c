/*
 * cuslice fake driver: libcupti.so.13, the activity API calls cuslice makes
 * (and the callback and profiler APIs' first calls, which the shim fronts),
 * reporting kernel records (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL / KERNEL)
 * whose start and end are the times the fake GPU timeline ran the kernels.
 * Written for cuslice's tests; see README.md beside this file ("CUPTI").
 *
 * How it works: cuptiActivityEnable claims an entry of the shared state's
 * CUPTI table (struct fake_cupti, fake_common.h) for this process and sets
 * the enabled kinds there. The fake libcuda marks each launch's ring item
 * with that entry while a kernel kind is enabled; whichever process retires
 * a marked item in the timeline (fake_timeline.h, tl_run) appends its
 * record (start, end, device, context, stream) to the entry.
 * cuptiActivityFlushAll advances the timeline to now, takes the entry's
 * records out, and delivers them in buffers from the client's callbacks, on
 * the calling thread. This library never calls libcuda.
 *
 * Rules, as in the other fake libraries: exported functions never call one
 * another; the process-wide mutex g_mu is taken before the timeline's
 * mutex; no lock is held while a client callback runs.
 */
#define _GNU_SOURCE
#include "fake_common.h"
#include "cuslice_cupti.h"

#include <pthread.h>
#include <stdbool.h>

#define WHO "fake libcupti"

#define REC_SIZE sizeof(struct cuslice_cupti_kernel_record)
_Static_assert(sizeof(struct cuslice_cupti_kernel_record) == 216, "CUDA 13.0's kernel record");

static struct fake_config g_cfg;
static struct fake_state *S; /* the shared state, once found */
static int g_state_fd = -1;   /* our own open file description: holds our entry's lock */
static const int g_slot = -1; /* we own no slot (for fake_timeline.h): our queues are probed like others' */

/* The timeline's simulation: a flush advances it to now. */
#include "fake_timeline.h"

enum { FAIL_NONE, FAIL_REGISTER, FAIL_ENABLE, FAIL_SILENT };

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;    /* everything below */
static pthread_mutex_t g_flush = PTHREAD_MUTEX_INITIALIZER; /* one flush at a time (taken before g_mu) */
static int g_fail;                                          /* FAKE_CUPTI_FAIL */
static CUpti_BuffersCallbackRequestFunc g_requested;
static CUpti_BuffersCallbackCompleteFunc g_completed;
static int g_entry = -1;     /* our entry in S->cupti, -1: not claimed yet */
static uint32_t g_entry_gen; /* its gen when we claimed it */
static uint64_t g_dropped;   /* records not delivered since the last GetNumDroppedRecords (buffer problems) */
static __thread int t_in_flush; /* this thread is inside a flush's callbacks */
/* The callback API's one subscriber (cuptiSubscribe), and whether the
 * profiler API was initialised (cuptiProfilerInitialize): kept for the
 * call log, dropped by cuptiFinalize, as the real one drops them. */
static struct fake_cupti_subscriber {
    CUpti_CallbackFunc callback;
    void *userdata;
} g_subscriber;
static bool g_subscribed;
static bool g_profiler;

/* Taken out of our entry by a flush (under g_flush). */
static struct fake_cupti_rec g_out[FAKE_CUPTI_RECS];

/* ---- call log ---------------------------------------------------------- */

__attribute__((format(printf, 3, 4))) static void cupti_log(const char *name, CUptiResult r, const char *fmt, ...)
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

#define LOGR(r, ...) cupti_log(__func__, (r), __VA_ARGS__)
#define LOGR0(r) cupti_log(__func__, (r), NULL)

/* ---- process state ------------------------------------------------------ */

static void fork_prepare(void)
{
    pthread_mutex_lock(&g_flush);
    pthread_mutex_lock(&g_mu);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_flush);
}

/* A forked child is another process: it records nothing until it enables
 * kinds itself (a new entry), and it needs an open file description of its
 * own, so that its entry's lock is its own. Callbacks stay registered. */
static void fork_child(void)
{
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_flush);
    g_entry = -1;
    g_dropped = 0;
    if (S != NULL && g_state_fd >= 0) {
        char path[64];
        snprintf(path, sizeof path, "/proc/self/fd/%d", g_state_fd);
        int fd = open(g_cfg.state_path ? g_cfg.state_path : path, O_RDWR | O_CLOEXEC);
        close(g_state_fd);
        g_state_fd = fd;
        if (fd < 0)
            S = NULL; /* cannot claim an entry: Enable reports CUPTI_ERROR_UNKNOWN */
    }
}

static void process_setup(void)
{
    fake_config_load(&g_cfg, WHO);
    const char *v = getenv("FAKE_CUPTI_FAIL");
    if (v != NULL && *v) {
        if (strcmp(v, "register") == 0)
            g_fail = FAIL_REGISTER;
        else if (strcmp(v, "enable") == 0)
            g_fail = FAIL_ENABLE;
        else if (strcmp(v, "silent") == 0)
            g_fail = FAIL_SILENT;
        else
            fake_die_env(WHO, "FAKE_CUPTI_FAIL", v, "register, enable or silent");
    }
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static inline void setup(void) { pthread_once(&g_once, process_setup); }

/* Caller holds g_mu. Maps the state libcuda uses: FAKE_CUDA_STATE's file, or
 * the process-private memfd (created here if libcuda has not run yet; it
 * finds ours then). NULL if it cannot. */
static struct fake_state *state_locked(void)
{
    if (S != NULL)
        return S;
    int fd;
    if (g_cfg.state_path != NULL) {
        fd = open(g_cfg.state_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd < 0) {
            fprintf(stderr, "%s: FAKE_CUDA_STATE=\"%s\": %s\n", WHO, g_cfg.state_path, strerror(errno));
            abort();
        }
    } else if ((fd = fake_private_state_find()) < 0) {
        fd = memfd_create(FAKE_PRIVATE_MEMFD_NAME, MFD_CLOEXEC);
        if (fd < 0)
            return NULL;
    }
    S = fake_state_map_fd(fd);
    if (S == NULL) {
        close(fd);
        return NULL;
    }
    g_state_fd = fd;
    return S;
}

/* Caller holds g_mu. Our entry in the CUPTI table, claimed at the first
 * call (a free one, or one whose owner died: its lock is free); -1 if the
 * state cannot be mapped or all FAKE_CUPTI_PROCS entries belong to live
 * processes. */
static int entry_locked(void)
{
    if (g_entry >= 0)
        return g_entry;
    if (state_locked() == NULL)
        return -1;
    int32_t pid = (int32_t)getpid();
    uint64_t pidns = fake_pidns("self"), start = fake_start_ticks("self");
    tl_lock();
    for (int i = 0; i < FAKE_CUPTI_PROCS; i++) {
        if (fake_ofd_lock(g_state_fd, FAKE_MAX_SLOTS + i, F_WRLCK) != 0)
            continue; /* a live process's (FAKE_CUPTI_LOCK_BASE + i) */
        struct fake_cupti_proc *p = &S->cupti.p[i];
        p->gen++;
        p->pid = pid;
        p->pidns = pidns;
        p->start_ticks = start;
        p->kinds = 0;
        p->head = p->tail = 0;
        p->dropped = 0;
        S->cupti.epoch++;
        g_entry = i;
        g_entry_gen = p->gen;
        break;
    }
    tl_unlock();
    if (g_entry < 0)
        fprintf(stderr, "%s: all %d CUPTI entries of the fake state are taken by live processes\n", WHO,
                FAKE_CUPTI_PROCS);
    return g_entry;
}

/* ---- exported API ------------------------------------------------------ */

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc funcBufferRequested,
                                           CUpti_BuffersCallbackCompleteFunc funcBufferCompleted)
{
    setup();
    CUptiResult r = CUPTI_SUCCESS;
    if (g_fail == FAIL_REGISTER) {
        r = CUPTI_ERROR_NOT_COMPATIBLE;
    } else if (funcBufferRequested == NULL || funcBufferCompleted == NULL) {
        r = CUPTI_ERROR_INVALID_PARAMETER;
    } else {
        pthread_mutex_lock(&g_mu);
        g_requested = funcBufferRequested;
        g_completed = funcBufferCompleted;
        pthread_mutex_unlock(&g_mu);
    }
    LOGR0(r);
    return r;
}

static bool kernel_kind(CUpti_ActivityKind kind)
{
    return kind == CUPTI_ACTIVITY_KIND_KERNEL || kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
}

static CUptiResult set_kind(CUpti_ActivityKind kind, bool on)
{
    if (!kernel_kind(kind))
        return CUPTI_SUCCESS; /* other kinds: accepted, nothing recorded */
    pthread_mutex_lock(&g_mu);
    CUptiResult r = CUPTI_SUCCESS;
    int e = on ? entry_locked() : g_entry;
    if (e < 0) {
        r = on ? CUPTI_ERROR_UNKNOWN : CUPTI_SUCCESS;
    } else {
        tl_lock();
        struct fake_cupti_proc *p = &S->cupti.p[e];
        if (p->gen == g_entry_gen) {
            if (on)
                p->kinds |= 1u << kind;
            else
                p->kinds &= ~(1u << kind);
        }
        tl_unlock();
    }
    pthread_mutex_unlock(&g_mu);
    return r;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind)
{
    setup();
    CUptiResult r = g_fail == FAIL_ENABLE ? CUPTI_ERROR_NOT_COMPATIBLE : set_kind(kind, true);
    LOGR(r, "kind=%u", (unsigned)kind);
    return r;
}

CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind)
{
    setup();
    CUptiResult r = set_kind(kind, false);
    LOGR(r, "kind=%u", (unsigned)kind);
    return r;
}

/* Detaches CUPTI from this process, as cuptiFinalize does: every kind it
 * enabled is off, the records not delivered yet, and those of its kernels
 * still queued, are dropped (not counted: the client was to flush first),
 * and its callbacks are forgotten, with the callback API's subscriber and
 * the profiler's initialisation (*subscriber_lost, *profiler_lost: there
 * was one). Nothing
 * is delivered until the client registers callbacks again (a flush is
 * refused until then, as before the first RegisterCallbacks); kinds
 * enabled again before that record, as before the first registration.
 * Refused from a buffer callback (a flush is under way). */
static CUptiResult finalize(bool *subscriber_lost, bool *profiler_lost)
{
    *subscriber_lost = *profiler_lost = false;
    if (t_in_flush)
        return CUPTI_ERROR_INVALID_OPERATION;
    pthread_mutex_lock(&g_flush);
    pthread_mutex_lock(&g_mu);
    g_requested = NULL;
    g_completed = NULL;
    g_dropped = 0;
    /* The callback API's subscriber and the profiler's session go too
     * (all of CUPTI is detached): the call log says so. */
    *subscriber_lost = g_subscribed;
    *profiler_lost = g_profiler;
    g_subscribed = g_profiler = false;
    memset(&g_subscriber, 0, sizeof g_subscriber);
    if (g_entry >= 0) {
        tl_lock();
        struct fake_cupti_proc *p = &S->cupti.p[g_entry];
        if (p->gen == g_entry_gen) {
            /* A new generation: kernels still queued, marked with the
             * old one, leave no record when they retire. libcuda looks
             * the entry up again (the epoch moves). */
            p->gen++;
            g_entry_gen = p->gen;
            p->kinds = 0;
            p->head = p->tail;
            p->dropped = 0;
            S->cupti.epoch++;
        }
        tl_unlock();
    }
    pthread_mutex_unlock(&g_mu);
    pthread_mutex_unlock(&g_flush);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiFinalize(void)
{
    setup();
    bool sub, prof;
    CUptiResult r = finalize(&sub, &prof);
    if (sub || prof)
        LOGR(r, "%s%s%s", sub ? "subscriber_lost=1" : "", sub && prof ? " " : "", prof ? "profiler_lost=1" : "");
    else
        LOGR0(r);
    return r;
}

/* The callback API's subscription, as far as the tests need it: one
 * subscriber at a time (a second -> MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
 * as the real one answers), a non-NULL handle that names it; no callback
 * is ever called (none can be enabled: cuptiEnableCallback and co. are
 * not modelled). Dropped by cuptiFinalize. */
static CUptiResult subscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata)
{
    CUptiResult r = CUPTI_SUCCESS;
    if (subscriber == NULL) {
        r = CUPTI_ERROR_INVALID_PARAMETER;
    } else {
        pthread_mutex_lock(&g_mu);
        if (g_subscribed) {
            r = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
        } else {
            g_subscribed = true;
            g_subscriber.callback = callback;
            g_subscriber.userdata = userdata;
            *subscriber = (CUpti_SubscriberHandle)(void *)&g_subscriber;
        }
        pthread_mutex_unlock(&g_mu);
    }
    return r;
}

CUptiResult cuptiSubscribe(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata)
{
    setup();
    CUptiResult r = subscribe(subscriber, callback, userdata);
    LOGR(r, "callback=0x%llx userdata=0x%llx", (unsigned long long)(uintptr_t)callback,
         (unsigned long long)(uintptr_t)userdata);
    return r;
}

/* cuptiSubscribe with parameters: as cuptiSubscribe (one subscriber; a
 * request to allow several is refused, as a CUPTI without multi-subscriber
 * support answers it); pParams may be NULL, else its structSize must be
 * set. */
CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber, CUpti_CallbackFunc callback, void *userdata,
                              CUpti_SubscriberParams *pParams)
{
    setup();
    CUptiResult r;
    if (pParams != NULL && pParams->structSize == 0)
        r = CUPTI_ERROR_INVALID_PARAMETER;
    else if (pParams != NULL && pParams->allowMultipleSubscribers)
        r = CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    else
        r = subscribe(subscriber, callback, userdata);
    LOGR(r, "callback=0x%llx userdata=0x%llx params=%s", (unsigned long long)(uintptr_t)callback,
         (unsigned long long)(uintptr_t)userdata, pParams != NULL ? "set" : "NULL");
    return r;
}

/* The profiler API's initialisation: accepted (again too) where structSize
 * is set and pPriv NULL; nothing is profiled. Dropped by cuptiFinalize. */
CUptiResult cuptiProfilerInitialize(CUpti_Profiler_Initialize_Params *pParams)
{
    setup();
    CUptiResult r = CUPTI_SUCCESS;
    if (pParams == NULL || pParams->structSize == 0 || pParams->pPriv != NULL) {
        r = CUPTI_ERROR_INVALID_PARAMETER;
    } else {
        pthread_mutex_lock(&g_mu);
        g_profiler = true;
        pthread_mutex_unlock(&g_mu);
    }
    LOGR(r, "structSize=%zu", pParams != NULL ? pParams->structSize : (size_t)0);
    return r;
}

/* Writes record `in` as a kernel activity record at `dst` (REC_SIZE bytes). */
static void write_record(uint8_t *dst, const struct fake_cupti_rec *in)
{
    struct cuslice_cupti_kernel_record k;
    memset(&k, 0, sizeof k);
    k.kind = (CUpti_ActivityKind)in->kind;
    k.start = in->start;
    k.end = in->end;
    k.deviceId = in->dev;
    k.contextId = in->ctx_id;
    k.streamId = in->stream_id;
    memcpy(dst, &k, sizeof k);
}

/* Hands records out[0..n) to the client: as many buffers as it takes, each
 * asked for with `requested` and given back with `completed` (context NULL,
 * stream 0, as the real CUPTI does). Records for which no usable buffer
 * comes (NULL, or too small for one record) are dropped and counted. Called
 * with no lock but g_flush held. */
static void deliver(CUpti_BuffersCallbackRequestFunc requested, CUpti_BuffersCallbackCompleteFunc completed,
                    const struct fake_cupti_rec *out, size_t n)
{
    size_t i = 0;
    t_in_flush = 1;
    while (i < n) {
        uint8_t *buf = NULL;
        size_t size = 0, max = 0;
        requested(&buf, &size, &max);
        if (buf == NULL || size < REC_SIZE)
            break;
        size_t cap = size / REC_SIZE;
        if (max != 0 && max < cap)
            cap = max;
        size_t k = n - i < cap ? n - i : cap;
        for (size_t j = 0; j < k; j++)
            write_record(buf + j * REC_SIZE, &out[i + j]);
        i += k;
        completed(NULL, 0, buf, size, k * REC_SIZE);
    }
    t_in_flush = 0;
    if (i < n) {
        pthread_mutex_lock(&g_mu);
        g_dropped += n - i;
        pthread_mutex_unlock(&g_mu);
    }
}

static CUptiResult flush_all(size_t *delivered)
{
    *delivered = 0;
    if (t_in_flush)
        return CUPTI_ERROR_INVALID_OPERATION; /* from a buffer callback: not allowed, as in CUPTI */
    pthread_mutex_lock(&g_flush);
    pthread_mutex_lock(&g_mu);
    CUpti_BuffersCallbackRequestFunc requested = g_requested;
    CUpti_BuffersCallbackCompleteFunc completed = g_completed;
    if (requested == NULL || completed == NULL) {
        pthread_mutex_unlock(&g_mu);
        pthread_mutex_unlock(&g_flush);
        return CUPTI_ERROR_INVALID_OPERATION;
    }
    size_t n = 0;
    if (g_entry >= 0) {
        tl_lock();
        uint64_t now = fake_now_ns();
        for (unsigned d = 0; d < g_cfg.ndev && d < FAKE_MAX_DEVICES; d++)
            tl_advance((int)d, now);
        struct fake_cupti_proc *p = &S->cupti.p[g_entry];
        if (p->gen == g_entry_gen) {
            for (; p->head < p->tail && n < FAKE_CUPTI_RECS; p->head++)
                g_out[n++] = p->rec[p->head % FAKE_CUPTI_RECS];
        }
        tl_unlock();
    }
    pthread_mutex_unlock(&g_mu);
    if (g_fail == FAIL_SILENT)
        n = 0; /* taken, but another client gets them: none for ours */
    if (n > 0)
        deliver(requested, completed, g_out, n);
    pthread_mutex_unlock(&g_flush);
    *delivered = n;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    setup();
    size_t n;
    CUptiResult r = flush_all(&n);
    LOGR(r, "flag=%u records=%zu", flag, n);
    return r;
}

static CUptiResult next_record(uint8_t *buffer, size_t valid, CUpti_Activity **record)
{
    if (buffer == NULL || record == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    size_t off;
    if (*record == NULL) {
        off = 0;
    } else {
        uint8_t *prev = (uint8_t *)*record;
        if (prev < buffer || prev >= buffer + valid || (size_t)(prev - buffer) % REC_SIZE != 0)
            return CUPTI_ERROR_INVALID_PARAMETER;
        off = (size_t)(prev - buffer) + REC_SIZE;
    }
    if (valid < REC_SIZE || off > valid - REC_SIZE)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    uint32_t kind;
    memcpy(&kind, buffer + off, sizeof kind);
    if (!kernel_kind((CUpti_ActivityKind)kind))
        return CUPTI_ERROR_INVALID_KIND;
    *record = (CUpti_Activity *)(void *)(buffer + off);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t validBufferSizeBytes, CUpti_Activity **record)
{
    setup();
    CUptiResult r = next_record(buffer, validBufferSizeBytes, record);
    LOGR(r, "buffer=0x%llx validBufferSizeBytes=%zu", (unsigned long long)(uintptr_t)buffer, validBufferSizeBytes);
    return r;
}

/* Records lost since the last call: buffers the client did not give, and
 * records that overflowed our entry in the shared state between flushes.
 * The count restarts at 0, as CUPTI's does. context and streamId are
 * ignored (one global queue). */
static CUptiResult dropped_records(size_t *dropped)
{
    if (dropped == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_mu);
    uint64_t n = g_dropped;
    g_dropped = 0;
    if (g_entry >= 0) {
        tl_lock();
        struct fake_cupti_proc *p = &S->cupti.p[g_entry];
        if (p->gen == g_entry_gen) {
            n += p->dropped;
            p->dropped = 0;
        }
        tl_unlock();
    }
    pthread_mutex_unlock(&g_mu);
    *dropped = (size_t)n;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t *dropped)
{
    setup();
    CUptiResult r = dropped_records(dropped);
    LOGR(r, "context=0x%llx streamId=%u", (unsigned long long)(uintptr_t)context, streamId);
    return r;
}

CUptiResult cuptiGetTimestamp(uint64_t *timestamp)
{
    setup();
    CUptiResult r = CUPTI_SUCCESS;
    if (timestamp == NULL)
        r = CUPTI_ERROR_INVALID_PARAMETER;
    else
        *timestamp = fake_now_ns(); /* the timeline's clock: CLOCK_MONOTONIC ns */
    LOGR0(r);
    return r;
}

CUptiResult cuptiGetResultString(CUptiResult result, const char **str)
{
    setup();
    static const struct {
        CUptiResult r;
        const char *s;
    } names[] = {
        {CUPTI_SUCCESS, "CUPTI_SUCCESS"},
        {CUPTI_ERROR_INVALID_PARAMETER, "CUPTI_ERROR_INVALID_PARAMETER"},
        {CUPTI_ERROR_INVALID_OPERATION, "CUPTI_ERROR_INVALID_OPERATION"},
        {CUPTI_ERROR_MAX_LIMIT_REACHED, "CUPTI_ERROR_MAX_LIMIT_REACHED"},
        {CUPTI_ERROR_NOT_COMPATIBLE, "CUPTI_ERROR_NOT_COMPATIBLE"},
        {CUPTI_ERROR_NOT_INITIALIZED, "CUPTI_ERROR_NOT_INITIALIZED"},
        {CUPTI_ERROR_INVALID_KIND, "CUPTI_ERROR_INVALID_KIND"},
        {CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"},
        {CUPTI_ERROR_UNKNOWN, "CUPTI_ERROR_UNKNOWN"},
    };
    CUptiResult r = CUPTI_ERROR_INVALID_PARAMETER;
    if (str != NULL) {
        *str = "CUPTI_ERROR_UNKNOWN (not a result the fake CUPTI knows)";
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (names[i].r == result) {
                *str = names[i].s;
                r = CUPTI_SUCCESS;
            }
        }
    }
    if (g_cfg.log_fd >= 0)
        fake_log(g_cfg.log_fd, __func__, "-", "result=%d", (int)result);
    return r;
}
