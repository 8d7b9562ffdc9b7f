/*
 * cuslice fake driver: the GPU timeline's simulation core, shared by the
 * fake libcuda.so.1 (which submits work and waits for it), the fake
 * libnvidia-ml.so.1 (which advances the simulation to "now" before it
 * reports per-process utilization) and the fake libcupti.so.13 (which does
 * the same before it flushes kernel records; retiring items leave their
 * records for it, see tl_cupti_record). See the "==== timeline" comment in
 * fake_cuda.c for the model, and README.md.
 *
 * Not a self-contained header: it is included once by each library, after
 * it has defined
 *   struct fake_state *S;     the mapped shared state
 *   struct fake_config g_cfg; (timeslice_ns)
 *   int g_slot;               the caller's own slot, or < 0
 *   int g_state_fd;           its own open file description of the state, or -1
 *   WHO                       the library's name for messages
 * Everything here is static: each library has its own copy.
 */
#ifndef FAKE_TIMELINE_H
#define FAKE_TIMELINE_H

#include <stdbool.h>
#define TL (&S->tl)
#define RING FAKE_TL_RING
#define NQ FAKE_TL_QUEUES
/* A queue of another process is probed (one fcntl) at most this often. */
#define TL_PROBE_NS 1000000ull

_Static_assert(sizeof(struct fake_tl_queue) % sizeof(uint64_t) == 0, "queue stride in u64 units");
#define QSTRIDE (sizeof(struct fake_tl_queue) / sizeof(uint64_t))

static uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }
static uint64_t add_sat(uint64_t a, uint64_t b) { return a + b < a ? UINT64_MAX : a + b; }

/* Caller holds TL->mu after EOWNERDEAD: a process died inside the lock.
 * Every single store leaves the state usable; only the per-device counts
 * and the running queue can disagree with the queues, so recompute them. */
static void tl_repair(void)
{
    for (int d = 0; d < FAKE_MAX_DEVICES; d++)
        TL->dev[d].npending = 0;
    for (int i = 0; i < NQ; i++) {
        struct fake_tl_queue *q = &TL->q[i];
        if (q->dev < 0 || q->dev >= FAKE_MAX_DEVICES) {
            q->dev = -1;
            continue;
        }
        if (q->head > q->tail || q->tail - q->head > RING)
            q->head = q->tail;
        if (q->head < q->tail)
            TL->dev[q->dev].npending++;
    }
    for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
        struct fake_tl_dev *D = &TL->dev[d];
        int r = D->running;
        if (r >= NQ || (r >= 0 && (TL->q[r].dev != d || TL->q[r].head == TL->q[r].tail)))
            D->running = -1;
        if (D->last >= NQ || D->last < -1)
            D->last = -1;
    }
    for (int i = 0; i < FAKE_CUPTI_PROCS; i++) {
        struct fake_cupti_proc *p = &S->cupti.p[i];
        if (p->head > p->tail || p->tail - p->head > FAKE_CUPTI_RECS)
            p->head = p->tail;
    }
}

static void tl_lock(void)
{
    int r = pthread_mutex_lock(&TL->mu);
    if (r == EOWNERDEAD) {
        TL->repairs++;
        tl_repair();
        pthread_mutex_consistent(&TL->mu);
    } else if (r != 0) {
        fprintf(stderr, "%s: timeline mutex: %s\n", WHO, strerror(r));
        abort();
    }
}

static void tl_unlock(void) { pthread_mutex_unlock(&TL->mu); }

/* The simulation state a run advances: the shared one (commit: for good),
 * or a copy that a waiter runs forward to see when its target completes. */
struct tl_view {
    struct fake_tl_dev *D;
    uint64_t *head, *started; /* queue i's at [i * stride] */
    size_t stride;
    bool commit;
    uint64_t now; /* the real time of this call (for probes) */
};

#define VH(v, i) ((v)->head[(size_t)(i) * (v)->stride])
#define VS(v, i) ((v)->started[(size_t)(i) * (v)->stride])

/* Caller holds TL->mu. Is the process owning queue i alive? Our own queues
 * are; a freed or re-claimed slot is dead; otherwise the slot's OFD lock
 * tells, probed at most every TL_PROBE_NS unless `force`. */
static bool tl_alive(int i, uint64_t now, bool force)
{
    struct fake_tl_queue *q = &TL->q[i];
    if (q->owner < 0 || q->owner >= FAKE_MAX_SLOTS)
        return true;
    struct fake_slot *sl = &S->slot[q->owner];
    if (atomic_load(&sl->pid) == 0 || atomic_load(&sl->gen) != q->owner_gen)
        return false;
    if (q->owner == g_slot)
        return true;
    if (!force && now < q->checked_ns + TL_PROBE_NS)
        return true;
    q->checked_ns = now;
    return g_state_fd < 0 || fake_slot_locked(g_state_fd, q->owner);
}

/* Caller holds TL->mu. Credits `ns` of device time to the process owning
 * queue q (for the fake NVML's per-process utilization), if that process
 * still owns its slot. */
/* Caller holds TL->mu. Records slot `slot`'s run time at the sample grid's
 * boundaries up to the one at or before `b`: `before` at those at or
 * before `a`, and `before` + the part of [a, b] elapsed at those inside
 * it (its work ran from a to b, `before` had run until a). */
static void tl_sample(int slot, uint32_t gen, int dev, uint64_t before, uint64_t a, uint64_t b)
{
    struct fake_samp *sp = &S->samp[slot][dev];
    uint64_t P = g_cfg.sample_ns, kb = b / P;
    if (sp->gen != gen) {
        /* a new owner: nothing recorded before its first credit */
        sp->gen = gen;
        sp->k = sp->k0 = a / P;
        sp->run[sp->k % FAKE_SAMPLES] = before;
    }
    if (kb <= sp->k)
        return;
    uint64_t k = sp->k + 1;
    if (kb - k >= FAKE_SAMPLES)
        k = kb - FAKE_SAMPLES + 1;
    for (; k <= kb; k++) {
        uint64_t B = k * P;
        sp->run[k % FAKE_SAMPLES] = before + (B > a ? B - a : 0);
    }
    sp->k = kb;
}

/* Caller holds TL->mu. Queue q's owner ran `ns` on `dev`, ending at `end`. */
static void tl_credit(const struct fake_tl_queue *q, int dev, uint64_t ns, uint64_t end)
{
    if (q->owner < 0 || q->owner >= FAKE_MAX_SLOTS || ns == 0)
        return;
    struct fake_slot *sl = &S->slot[q->owner];
    if (atomic_load(&sl->gen) == q->owner_gen) {
        uint64_t before = atomic_fetch_add(&sl->run_ns[dev], ns);
        tl_sample(q->owner, q->owner_gen, dev, before, end - ns, end);
    }
}

/* Caller holds TL->mu. Item `it` of queue q ran on `dev` from `start` to
 * `end` and retires: if the fake CUPTI of the process that launched it
 * wants its record, append it to that process's entry (a full entry drops
 * it and counts it). */
static void tl_cupti_record(const struct fake_tl_item *it, int dev, uint64_t start, uint64_t end)
{
    if (it->cupti == 0 || it->cupti > FAKE_CUPTI_PROCS)
        return;
    struct fake_cupti_proc *p = &S->cupti.p[it->cupti - 1];
    if (p->gen != it->cupti_gen || p->pid == 0)
        return; /* the entry was claimed again since: its launcher is gone */
    if (p->tail - p->head >= FAKE_CUPTI_RECS) {
        p->dropped++;
        return;
    }
    struct fake_cupti_rec *r = &p->rec[p->tail % FAKE_CUPTI_RECS];
    r->start = start;
    r->end = end;
    r->dev = (uint32_t)dev;
    r->ctx_id = it->ctx_id;
    r->stream_id = it->stream_id;
    r->kind = it->kind;
    p->tail++;
}

/* Caller holds TL->mu. Queue q's work starts running on `dev` at t: the
 * owner's first work there, if it had none before. */
static void tl_note_start(const struct fake_tl_queue *q, int dev, uint64_t t)
{
    if (q->owner < 0 || q->owner >= FAKE_MAX_SLOTS)
        return;
    struct fake_slot *sl = &S->slot[q->owner];
    uint64_t zero = 0;
    if (atomic_load(&sl->gen) == q->owner_gen)
        atomic_compare_exchange_strong(&sl->first_ns[dev], &zero, t == 0 ? 1 : t);
}

/* Caller holds TL->mu. Discards queue i's pending work at time t (its
 * context is gone: a real GPU kills the work of a destroyed context, even
 * a kernel mid-way) and frees the queue. */
static void tl_drop(int i, uint64_t t)
{
    struct fake_tl_queue *q = &TL->q[i];
    int dev = q->dev;
    if (dev < 0)
        return;
    struct fake_tl_dev *D = &TL->dev[dev];
    uint64_t left = 0;
    for (uint64_t p = q->head; p < q->tail; p++)
        left = add_sat(left, q->ring[p % RING].ns);
    if (D->running == i) {
        uint64_t ran = t > q->started_ns ? t - q->started_ns : 0;
        if (q->head < q->tail) {
            uint64_t cur = q->ring[q->head % RING].ns; /* the item mid-way ran this much of itself */
            uint64_t c = ran < cur ? ran : cur;
            tl_credit(q, dev, c, q->started_ns + c);
        }
        left -= ran < left ? ran : left;
        D->running = -1;
        D->last = i;
    }
    if (q->head < q->tail && D->npending > 0)
        D->npending--;
    q->head = q->tail;
    q->epoch++;
    q->dev = -1;
    /* busy_until_ns is only written under TL->mu */
    uint64_t bu = atomic_load(&S->dev[dev].busy_until_ns);
    atomic_store(&S->dev[dev].busy_until_ns, bu > left ? bu - left : 0);
}

/* Caller holds TL->mu. The next queue of `dev` with pending work after the
 * one that ran last (round robin). Dead owners' queues are skipped: a
 * commit run drops them, a projection assumes the commit run will (so that
 * a waiter does not sleep through a dead process's slice). -1: none. */
static int tl_pick(struct tl_view *v, int dev, uint64_t t)
{
    int last = v->D->last;
    for (int k = 1; k <= NQ; k++) {
        int i = (last + k) % NQ;
        struct fake_tl_queue *q = &TL->q[i];
        if (q->dev != dev || VH(v, i) >= q->tail)
            continue;
        if (!tl_alive(i, v->now, false)) {
            if (v->commit)
                tl_drop(i, t);
            continue;
        }
        return i;
    }
    return -1;
}

/* Caller holds TL->mu. Runs device `dev` forward from its clock. A commit
 * view runs up to `until` and stores the result (retired items get their end
 * times). A projection runs until queue `tq` has retired its first `tmark`
 * items and returns when that happens (0: it never does, as nothing more is
 * pending). */
static uint64_t tl_run(struct tl_view *v, int dev, uint64_t until, int tq, uint64_t tmark)
{
    struct fake_tl_dev *D = v->D;
    uint64_t t = D->clock_ns;
    for (;;) {
        if (tq >= 0 && VH(v, tq) >= tmark)
            return t;
        int r = D->running;
        if (r < 0) {
            if (D->npending == 0)
                break;
            r = tl_pick(v, dev, t);
            if (r < 0)
                break;
            /* Work never starts before it was submitted (the device was
             * idle when it came). */
            uint64_t st = max_u64(t, TL->q[r].ring[VH(v, r) % RING].t);
            if (st > until)
                break;
            t = st;
            VS(v, r) = t;
            D->running = r;
            D->slice_start_ns = t;
            if (v->commit)
                tl_note_start(&TL->q[r], dev, t);
        }
        struct fake_tl_queue *q = &TL->q[r];
        struct fake_tl_item *it = &q->ring[VH(v, r) % RING];
        uint64_t end = add_sat(VS(v, r), it->ns);
        if (end > until)
            break;
        t = end;
        if (v->commit) {
            tl_cupti_record(it, dev, VS(v, r), end); /* VS: when this item started */
            it->t = end;
            tl_credit(q, dev, it->ns, end);
        }
        VH(v, r)++;
        if (VH(v, r) == q->tail) { /* empty: gives the device up at once */
            D->npending--;
            D->running = -1;
            D->last = r;
        } else if (t - D->slice_start_ns >= g_cfg.timeslice_ns && D->npending > 1) {
            D->running = -1; /* slice used and others wait: next kernel boundary is now */
            D->last = r;
        } else {
            VS(v, r) = max_u64(t, q->ring[VH(v, r) % RING].t);
        }
    }
    if (v->commit && until != UINT64_MAX && until > D->clock_ns)
        D->clock_ns = until;
    return 0;
}

/* Caller holds TL->mu. Advances device `dev` to `now` for good; a dead
 * process's work holding the device is dropped. */
static void tl_advance(int dev, uint64_t now)
{
    struct tl_view v = {&TL->dev[dev], &TL->q[0].head, &TL->q[0].started_ns, QSTRIDE, true, now};
    tl_run(&v, dev, now, -1, 0);
    int r = TL->dev[dev].running;
    if (r >= 0 && !tl_alive(r, now, false))
        tl_drop(r, now);
}


#endif /* FAKE_TIMELINE_H */
