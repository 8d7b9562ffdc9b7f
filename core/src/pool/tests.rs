use super::*;
use crate::segment::{Admit, Segment};
use crate::testdir::TestDir;

const MIB: u64 = 1 << 20;
const UUID: [u8; 16] = [0x5a; 16];

/// A tenant: its container's memory segment, and one process (its own
/// open file descriptions of the segment and of the pool, as in a
/// process of its own) per `procs`.
struct Tenant {
    guarantee: u64,
    procs: Vec<(Segment, usize, usize)>,
    /// Per process, the sizes it holds.
    held: Vec<Vec<u64>>,
}

fn tenant(dir: &TestDir, pool_path: &Path, i: usize, g: u64, max: u64, procs: usize) -> Tenant {
    let seg_path = dir.path().join(format!("t{i}/memory.seg"));
    let mut v = Vec::new();
    for p in 0..procs {
        let seg = Segment::open_or_create(&seg_path).expect("segment");
        let slot = seg.claim_slot(p as u32 + 1).expect("slot");
        let (d, _) = seg.register_device_with(&UUID, g, max).expect("device");
        let pool: &'static Pool =
            Box::leak(Box::new(Pool::open_or_create(pool_path).expect("pool")));
        let (entry, _) = pool
            .join(&format!("t{i}"), 0, g, max, 1024 * MIB, 1)
            .expect("join");
        seg.link_pool(d, pool, entry);
        v.push((seg, slot, d));
    }
    Tenant {
        guarantee: g,
        held: vec![Vec::new(); procs],
        procs: v,
    }
}

fn used(t: &Tenant) -> u64 {
    let (seg, _, d) = &t.procs[0];
    seg.device_usage(*d).expect("usage").used
}

/// The promise of guaranteed memory: whatever the others burst, and
/// whatever order allocations and frees come in from several processes
/// of several tenants, the tenants together never hold more than the
/// GPU, and a tenant below its guarantee always gets up to it.
#[test]
fn bursts_never_take_what_another_tenant_is_guaranteed() {
    let dir = TestDir::new("pool", "random");
    let pool_path = path(dir.path(), &UUID);
    // 1 GiB GPU; guarantees 128+192+256+64 = 640 MiB; maxima up to all.
    let spec = [(128, 1024), (192, 512), (256, 256), (64, 900)];
    let ts: Vec<Tenant> = spec
        .iter()
        .enumerate()
        .map(|(i, (g, m))| tenant(&dir, &pool_path, i, g * MIB, m * MIB, 2))
        .collect();
    let mut ts = ts;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let (mut granted, mut refused, mut probes) = (0, 0, 0);
    for _ in 0..20_000 {
        let t = rnd(ts.len() as u64) as usize;
        let p = rnd(2) as usize;
        let tn = &mut ts[t];
        if rnd(3) > 0 || tn.held[p].is_empty() {
            let size = (1 + rnd(96)) * MIB;
            let (seg, slot, d) = &tn.procs[p];
            match seg.admit_or_burst(*d, *slot, size).0 {
                Admit::Granted => {
                    tn.held[p].push(size);
                    granted += 1;
                }
                _ => refused += 1,
            }
        } else {
            let k = rnd(tn.held[p].len() as u64) as usize;
            let size = tn.held[p].swap_remove(k);
            let (seg, slot, d) = &tn.procs[p];
            seg.credit(*d, *slot, size);
        }
        let total: u64 = ts.iter().map(used).sum();
        assert!(
            total <= 1024 * MIB,
            "tenants hold {total} bytes of a 1 GiB GPU"
        );
        // A tenant below its guarantee reaches it at once.
        let q = rnd(ts.len() as u64) as usize;
        let tq = &ts[q];
        let short = tq.guarantee.saturating_sub(used(tq));
        if short > 0 {
            let (seg, slot, d) = &tq.procs[0];
            assert_eq!(
                seg.admit_or_burst(*d, *slot, short).0,
                Admit::Granted,
                "tenant {q} at {} of its {} guaranteed could not reach it",
                used(tq),
                tq.guarantee
            );
            seg.credit(*d, *slot, short);
            probes += 1;
        }
    }
    assert!(
        granted > 1000 && refused > 100 && probes > 1000,
        "{granted} {refused} {probes}"
    );
}

/// A burst is given back as the tenant frees, and a tenant whose
/// processes are all gone leaves the pool (its guarantee too) once its
/// linger is over.
#[test]
fn a_burst_is_given_back_as_it_is_freed_and_a_gone_tenant_leaves_the_pool() {
    let dir = TestDir::new("pool", "giveback");
    let pool_path = path(dir.path(), &UUID);
    let a = tenant(&dir, &pool_path, 0, 256 * MIB, 1024 * MIB, 1);
    let b = tenant(&dir, &pool_path, 1, 512 * MIB, 512 * MIB, 1);
    let (seg, slot, d) = &a.procs[0];
    let pool = seg.pool_link(*d).expect("linked").pool;
    assert_eq!(pool.room(), 256 * MIB);
    assert_eq!(seg.admit_or_burst(*d, *slot, 400 * MIB).0, Admit::Granted);
    assert_eq!(pool.room(), 112 * MIB, "144 MiB of burst taken");
    // Past the room: refused, with what there was.
    let (r, room) = seg.admit_or_burst(*d, *slot, 200 * MIB);
    assert_eq!((r, room), (Admit::Burst { short: 200 * MIB }, 112 * MIB));
    let waiter = pool.waiting().expect("joined");
    let seen = waiter.generation();
    seg.credit(*d, *slot, 300 * MIB);
    assert_ne!(waiter.generation(), seen, "a free wakes the pool's waiters");
    drop(waiter);
    assert_eq!(
        pool.room(),
        256 * MIB,
        "back to its guarantee: no burst held"
    );
    // A third tenant joins (128 MiB guaranteed) and its process ends:
    // its guarantee lingers, then goes back to the pool.
    let c: &'static Pool = Box::leak(Box::new(Pool::open_or_create(&pool_path).expect("c")));
    let (_, cs) = c
        .join("t9", 0, 128 * MIB, 128 * MIB, 1024 * MIB, 9)
        .expect("join");
    assert_eq!(pool.room(), 128 * MIB);
    assert_eq!(pool.entries().len(), 3);
    c.leave(cs);
    // A holds 100 MiB: 356 more need 200 MiB of burst, which only fits
    // once the gone tenant's guarantee is back: not within its linger.
    let (r, room) = seg.admit_or_burst(*d, *slot, 356 * MIB);
    assert_eq!((r, room), (Admit::Burst { short: 200 * MIB }, 128 * MIB));
    assert_eq!(pool.entries().len(), 3, "{:?}", pool.entries());
    let since = pool
        .entries()
        .iter()
        .find(|e| e.name == "t9")
        .and_then(|e| e.lingering_since)
        .expect("t9 lingers");
    pool.sweep_at(since + LINGER_NS);
    assert_eq!(pool.entries().len(), 2);
    assert_eq!(seg.admit_or_burst(*d, *slot, 356 * MIB).0, Admit::Granted);
    assert_eq!(pool.room(), 56 * MIB);
    let _ = b;
}

/// A process killed while it waits for memory never drops its waiter
/// guard: once its slot is swept, the pool's waiter count is back to
/// what live waiters account for, so frees stop writing the shared
/// wake-up word (and making the wake-up syscall) for nobody.
#[test]
fn a_waiter_killed_while_it_waits_is_no_longer_counted_once_swept() {
    let dir = TestDir::new("pool", "killedwaiter");
    let pool_path = path(dir.path(), &UUID);
    let pool = Pool::open_or_create(&pool_path).expect("pool");
    let (entry, mine) = pool
        .join("live", 0, 64 * MIB, 64 * MIB, 1024 * MIB, 1)
        .expect("join");
    let live = pool.waiting().expect("joined");
    let mut fds = [0i32; 2];
    // SAFETY: pipe into a two-int array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    let [rfd, wfd] = fds;
    // SAFETY: fork in a test; the child opens the pool (the parent's
    // mapping is not inherited: MADV_DONTFORK), joins it, counts two
    // waiters, says so and sleeps until killed.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let child = Pool::open_or_create(&pool_path);
        let joined = child.as_ref().is_ok_and(|c| {
            c.join("dead", 0, 64 * MIB, 128 * MIB, 1024 * MIB, 2)
                .is_ok()
        });
        if let (Ok(c), true) = (&child, joined)
            && let (Some(_a), Some(_b)) = (c.waiting(), c.waiting())
        {
            // SAFETY: one byte from a local to our pipe's write end.
            unsafe { libc::write(wfd, b"w".as_ptr().cast(), 1) };
            loop {
                // SAFETY: sleeps until a signal (the parent's SIGKILL).
                unsafe { libc::pause() };
            }
        }
        // SAFETY: leaving the child without running the test harness.
        unsafe { libc::_exit(1) };
    }
    assert!(pid > 0, "fork");
    // SAFETY: closing our copy of the write end, then one byte from
    // the read end into a local (0 bytes: the child failed and exited).
    let got = unsafe {
        libc::close(wfd);
        let mut b = 0u8;
        libc::read(rfd, (&mut b as *mut u8).cast(), 1)
    };
    // SAFETY: our pipe's read end.
    unsafe { libc::close(rfd) };
    assert_eq!(got, 1, "the child could not join the pool and wait");
    let h = pool.head();
    assert_eq!(h.waiters.load(Ordering::Acquire), 3);
    // SAFETY: killing and reaping our own child.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
    }
    assert_eq!(
        h.waiters.load(Ordering::Acquire),
        3,
        "nothing recovers the count before a sweep"
    );
    // A reservation short of room sweeps the dead process's slot.
    assert!(pool.reserve(entry, 2048 * MIB).is_err());
    let dead: Vec<u32> = pool
        .entries()
        .iter()
        .filter(|e| e.name == "dead")
        .map(|e| e.procs)
        .collect();
    assert_eq!(dead, [0], "the dead tenant's slot was swept (it lingers)");
    assert_eq!(
        h.waiters.load(Ordering::Acquire),
        1,
        "the killed process's waiters are still counted after its slot was swept"
    );
    for s in 0..MAX_PROCS {
        let w = pool
            .proc_slot(s)
            .expect("slot")
            .waiting
            .load(Ordering::Acquire);
        assert_eq!(w, u32::from(s == mine), "slot {s}");
    }
    let seen = live.generation();
    pool.freed();
    assert_ne!(live.generation(), seen, "the live waiter is still woken");
    drop(live);
    assert_eq!(h.waiters.load(Ordering::Acquire), 0);
    let before = h.freed_gen.load(Ordering::Acquire);
    pool.freed();
    assert_eq!(
        h.freed_gen.load(Ordering::Acquire),
        before,
        "a free with nobody waiting writes nothing"
    );
}

/// A slot given back while a thread of its process still waits (an
/// exit) takes that waiter off the count, and the waiter's guard then
/// takes nothing more (another process's waiter stays counted); a slot
/// claimed with waiters of a dead owner in it gives them back.
#[test]
fn a_slot_given_back_or_claimed_again_takes_its_waiters_off_the_count() {
    let dir = TestDir::new("pool", "leavewaiter");
    let pool_path = path(dir.path(), &UUID);
    let a = Pool::open_or_create(&pool_path).expect("a");
    let b = Pool::open_or_create(&pool_path).expect("b");
    let (_, sa) = a.join("a", 0, 0, MIB, 1024 * MIB, 1).expect("join a");
    b.join("b", 0, 0, MIB, 1024 * MIB, 2).expect("join b");
    let h = a.head();
    let wa = a.waiting().expect("a joined");
    let wb = b.waiting().expect("b joined");
    assert_eq!(h.waiters.load(Ordering::Acquire), 2);
    a.leave(sa);
    assert_eq!(
        h.waiters.load(Ordering::Acquire),
        1,
        "a's waiter left with it"
    );
    assert!(
        a.waiting().is_none(),
        "no slot: nothing to count a waiter in"
    );
    drop(wa);
    assert_eq!(
        h.waiters.load(Ordering::Acquire),
        1,
        "a's late guard uncounted b's waiter"
    );
    drop(wb);
    assert_eq!(h.waiters.load(Ordering::Acquire), 0);
    // A free slot with a dead owner's waiters still in it (its owner
    // died after a join's sweep, before its claim): the next claim,
    // which takes the first free slot, gives them back.
    let stale = (0..MAX_PROCS)
        .find(|&s| a.proc_slot(s).expect("slot").state.load(Ordering::Acquire) == EMPTY)
        .expect("a free slot");
    a.proc_slot(stale)
        .expect("slot")
        .waiting
        .store(2, Ordering::Release);
    h.waiters.fetch_add(3, Ordering::AcqRel);
    let c = Pool::open_or_create(&pool_path).expect("c");
    let (_, sc) = c.join("c", 0, 0, MIB, 1024 * MIB, 3).expect("join c");
    assert_eq!(sc, stale);
    assert_eq!(h.waiters.load(Ordering::Acquire), 1);
    assert_eq!(
        c.proc_slot(sc)
            .expect("slot")
            .waiting
            .load(Ordering::Acquire),
        0
    );
}

fn view(p: &Pool, name: &str) -> Option<EntryView> {
    p.entries().into_iter().find(|e| e.name == name)
}

/// A tenant whose last process died keeps its guarantee in the pool
/// for the linger (what bursts may take leaves it out), its burst
/// released at once; its next process takes the same entry back,
/// counted once; a sweep after the linger frees it.
#[test]
fn a_gone_tenants_guarantee_lingers_and_its_next_process_takes_it_back() {
    let dir = TestDir::new("pool", "linger");
    let pool_path = path(dir.path(), &UUID);
    let b = Pool::open_or_create(&pool_path).expect("b");
    let (eb, _) = b
        .join("b", 0, 256 * MIB, 1024 * MIB, 1024 * MIB, 2)
        .expect("join b");
    // A: 512 MiB guaranteed; its process bursts 100 MiB and dies (its
    // descriptor closed: its slot's lock goes with it, as at a death).
    let a = Pool::open_or_create(&pool_path).expect("a");
    let (ea, _) = a
        .join("a", 0, 512 * MIB, 1024 * MIB, 1024 * MIB, 1)
        .expect("join a");
    a.reserve(ea, 100 * MIB).expect("a's burst");
    assert_eq!(b.room(), 156 * MIB);
    drop(a);
    // B, short of room, sweeps: A's burst comes back, its guarantee
    // does not.
    assert_eq!(b.reserve(eb, 300 * MIB), Err(256 * MIB));
    let va = view(&b, "a").expect("a lingers");
    assert_eq!((va.procs, va.guarantee, va.burst), (0, 512 * MIB, 0));
    let since = va.lingering_since.expect("its linger's start");
    assert_eq!(b.reserve(eb, 256 * MIB), Ok(()));
    assert_eq!(b.room(), 0);
    // Within the linger, a sweep keeps it.
    b.sweep_at(since + LINGER_NS - 1);
    assert_eq!(b.committed(), 1024 * MIB);
    // A's next process: the same entry, its guarantee counted once.
    let a2 = Pool::open_or_create(&pool_path).expect("a2");
    let (ea2, _) = a2
        .join("a", 0, 512 * MIB, 1024 * MIB, 1024 * MIB, 3)
        .expect("join a again");
    assert_eq!(ea2, ea);
    assert_eq!(b.entries().len(), 2);
    assert_eq!(b.committed(), 1024 * MIB);
    let va = view(&b, "a").expect("a");
    assert_eq!((va.procs, va.lingering_since), (1, None));
    // Gone again: a sweep after the linger frees it.
    drop(a2);
    b.sweep_at(crate::gpu::monotonic_ns());
    let since = view(&b, "a")
        .and_then(|v| v.lingering_since)
        .expect("a lingers again");
    b.sweep_at(since + LINGER_NS - 1);
    assert!(view(&b, "a").is_some(), "freed before its linger was over");
    b.sweep_at(since + LINGER_NS);
    assert_eq!(view(&b, "a"), None);
    assert_eq!(b.room(), 512 * MIB);
    // A start after the sweeper's clock (another clock's stamp, or a
    // tenant's) ends the linger at once rather than never.
    let c = Pool::open_or_create(&pool_path).expect("c");
    c.join("c", 0, 64 * MIB, 64 * MIB, 1024 * MIB, 4)
        .expect("join c");
    drop(c);
    let now = crate::gpu::monotonic_ns();
    b.sweep_at(now);
    assert!(view(&b, "c").is_some_and(|v| v.lingering_since == Some(now)));
    b.sweep_at(now - 1);
    assert_eq!(view(&b, "c"), None);
}

/// A look at the room (`cuMemGetInfo`) tidies the pool: a dead
/// process's burst stops counting as taken at once, without waiting
/// for a join or a reservation short of room; at most once every
/// [`TIDY_EVERY_NS`] per process, and never waiting for a lock another
/// holds.
#[test]
fn a_look_at_the_room_gives_back_a_dead_processs_burst() {
    let dir = TestDir::new("pool", "tidy");
    let pool_path = path(dir.path(), &UUID);
    let b = Pool::open_or_create(&pool_path).expect("b");
    b.join("b", 0, 256 * MIB, 1024 * MIB, 1024 * MIB, 2)
        .expect("join b");
    let a = Pool::open_or_create(&pool_path).expect("a");
    let (ea, _) = a
        .join("a", 0, 512 * MIB, 1024 * MIB, 1024 * MIB, 1)
        .expect("join a");
    a.reserve(ea, 100 * MIB).expect("a's burst");
    // A's process dies (its descriptor closed: its slot's lock goes).
    drop(a);
    assert_eq!(b.room(), 156 * MIB, "nothing swept before anyone looks");
    // Another holds the pool's lock: no wait, no sweep.
    let other = Pool::open_or_create(&pool_path).expect("other");
    let t0 = 1_000_000_000_000;
    assert!(
        !other.shm.with_flock(|| b.tidy_at(t0)),
        "swept under another's lock"
    );
    assert_eq!(b.room(), 156 * MIB);
    // Within TIDY_EVERY_NS of that try: not again.
    assert!(!b.tidy_at(t0 + TIDY_EVERY_NS - 1));
    assert_eq!(b.room(), 156 * MIB);
    assert!(b.tidy_at(t0 + TIDY_EVERY_NS));
    assert_eq!(b.room(), 256 * MIB, "a's burst is back, its guarantee kept");
    let va = view(&b, "a").expect("a lingers");
    assert_eq!((va.procs, va.burst, va.guarantee), (0, 0, 512 * MIB));
}

/// With every entry taken, a new tenant's process takes the entry that
/// lingered longest: the linger never shuts a tenant out of the pool.
#[test]
fn a_lingering_entry_gives_way_when_every_entry_is_taken() {
    let dir = TestDir::new("pool", "full");
    let pool_path = path(dir.path(), &UUID);
    let open = || Pool::open_or_create(&pool_path).expect("pool");
    let mut live = Vec::new();
    for i in 0..MAX_ENTRIES - 2 {
        let p = open();
        p.join(&format!("live{i}"), 0, MIB, MIB, 1024 * MIB, 1)
            .expect("join");
        live.push(p);
    }
    for name in ["old", "young"] {
        let p = open();
        p.join(name, 0, MIB, MIB, 1024 * MIB, 1).expect("join");
        drop(p);
        live[0].sweep_at(crate::gpu::monotonic_ns());
    }
    assert_eq!(live[0].entries().len(), MAX_ENTRIES);
    let new = open();
    new.join("new", 0, MIB, MIB, 1024 * MIB, 1)
        .expect("a new tenant joins a full pool");
    let names: Vec<String> = live[0].entries().into_iter().map(|e| e.name).collect();
    assert!(
        names.contains(&"new".into())
            && names.contains(&"young".into())
            && !names.contains(&"old".into()),
        "{names:?}"
    );
    let other = open();
    let e = other
        .join("another", 0, MIB, MIB, 1024 * MIB, 1)
        .expect("the young one gives way too");
    assert!(view(&other, "young").is_none(), "{e:?}");
    let err = open()
        .join("one-more", 0, MIB, MIB, 1024 * MIB, 1)
        .expect_err("every entry has a live process");
    assert!(err.0.contains("in use by live processes"), "{}", err.0);
}

/// A tenant that arrives while its guarantee is lent out (issue 41's
/// late arrival): it reserves at once only what nobody reserved or
/// holds, the rest is pending; the earlier tenant's guarantee is
/// reachable at once; the borrower keeps its burst; what the borrower
/// frees goes to the pending guarantee before any new burst.
#[test]
fn a_late_guarantee_is_pending_while_lent_out_and_taken_back_as_the_borrower_frees() {
    let dir = TestDir::new("pool", "late");
    let pool_path = path(dir.path(), &UUID);
    // 1 GiB GPU. C is guaranteed 512 MiB (holds nothing yet); A is
    // guaranteed 128 MiB and bursts into all that nobody is
    // guaranteed: 384 MiB more.
    let c = tenant(&dir, &pool_path, 0, 512 * MIB, 512 * MIB, 1);
    let a = tenant(&dir, &pool_path, 1, 128 * MIB, 1024 * MIB, 1);
    let (aseg, aslot, ad) = &a.procs[0];
    assert_eq!(
        aseg.admit_or_burst(*ad, *aslot, 512 * MIB).0,
        Admit::Granted
    );
    // B, guaranteed 256 MiB, arrives now: nothing is free for it.
    let b = tenant(&dir, &pool_path, 2, 256 * MIB, 256 * MIB, 1);
    let (bseg, bslot, bd) = &b.procs[0];
    let pool = bseg.pool_link(*bd).expect("linked").pool;
    let e = view(pool, "t2").expect("B's entry");
    assert_eq!((e.guarantee, e.pending), (256 * MIB, 256 * MIB));
    assert!(pool.committed() <= 1024 * MIB, "{}", pool.committed());
    // B is refused (the driver would have given it C's memory before).
    assert!(matches!(
        bseg.admit_or_burst(*bd, *bslot, 64 * MIB).0,
        Admit::Burst { .. }
    ));
    assert_eq!(pool.borrowers(), vec![("t1".to_string(), 384 * MIB)]);
    // C reaches all of its guarantee at once, beside the borrower.
    let (cseg, cslot, cd) = &c.procs[0];
    assert_eq!(
        cseg.admit_or_burst(*cd, *cslot, 512 * MIB).0,
        Admit::Granted
    );
    assert_eq!(used(&c) + used(&a), 1024 * MIB);
    // A frees 200 MiB: they go to B's pending guarantee, not to a new
    // burst (A's own, here).
    aseg.credit(*ad, *aslot, 200 * MIB);
    assert!(matches!(
        aseg.admit_or_burst(*ad, *aslot, 8 * MIB).0,
        Admit::Burst { .. }
    ));
    assert_eq!(
        bseg.admit_or_burst(*bd, *bslot, 200 * MIB).0,
        Admit::Granted
    );
    assert_eq!(view(pool, "t2").expect("B").pending, 56 * MIB);
    assert!(matches!(
        bseg.admit_or_burst(*bd, *bslot, 40 * MIB).0,
        Admit::Burst { .. }
    ));
    // The borrower frees the rest of its burst: B reaches its whole
    // guarantee; nobody ever held more than the GPU.
    aseg.credit(*ad, *aslot, 184 * MIB);
    assert_eq!(bseg.admit_or_burst(*bd, *bslot, 56 * MIB).0, Admit::Granted);
    assert_eq!(view(pool, "t2").expect("B").pending, 0);
    assert_eq!(used(&a) + used(&b) + used(&c), 896 * MIB);
    assert!(pool.committed() <= 1024 * MIB);
}

/// A slice registered by its maker holds its guarantee before its first
/// process and between its processes (no linger runs out on it), and
/// leaves the pool when released; a guarantee that could never fit is
/// refused, counted against the capacity the maker gives, not the
/// file's.
#[test]
fn a_registered_slice_keeps_its_guarantee_without_a_process_until_released() {
    let dir = TestDir::new("pool", "registered");
    let pool_path = path(dir.path(), &UUID);
    let root = Pool::open_or_create(&pool_path).expect("pool");
    let r = root
        .register("c", 7, 600 * MIB, 600 * MIB, 1024 * MIB, Maker::Root)
        .expect("fits");
    assert_eq!((r.pending, r.slot), (0, None));
    // A forged capacity in the file changes nothing root decides.
    root.head().capacity.store(1 << 62, Ordering::Release);
    let err = root
        .register("d", 0, 500 * MIB, 500 * MIB, 1024 * MIB, Maker::Root)
        .expect_err("600 + 500 MiB guaranteed on a 1 GiB GPU");
    assert!(err.0.contains("does not fit"), "{}", err.0);
    // No process, long past any linger: still there.
    root.sweep_at(crate::gpu::monotonic_ns() + 10 * LINGER_NS);
    let e = view(&root, "c").expect("kept");
    assert!(e.held && e.procs == 0 && e.guarantee == 600 * MIB, "{e:?}");
    // A burster next to it gets only what is left.
    let a = tenant(&dir, &pool_path, 1, 64 * MIB, 1024 * MIB, 1);
    let (aseg, aslot, ad) = &a.procs[0];
    let (r, room) = aseg.admit_or_burst(*ad, *aslot, 512 * MIB);
    assert_eq!((r, room), (Admit::Burst { short: 448 * MIB }, 360 * MIB));
    // A process of the slice joins (from the root-written quota file)
    // and leaves: the guarantee is the maker's, and stays.
    let p = Pool::open_or_create(&pool_path).expect("pool");
    let (_, slot) = p.join("c", 7, MIB, MIB, 1024 * MIB, 42).expect("join");
    assert_eq!(view(&p, "c").expect("c").guarantee, 600 * MIB);
    p.leave(slot);
    root.sweep_at(crate::gpu::monotonic_ns() + 10 * LINGER_NS);
    assert_eq!(view(&root, "c").expect("kept").guarantee, 600 * MIB);
    assert_eq!(root.release("c", 7), (true, None));
    assert!(view(&root, "c").is_none());
    assert_eq!(root.room(), 1024 * MIB - 64 * MIB);
    // A maker process (`cuslice run`): kept while it lives, not a
    // process others wait on.
    let run = Pool::open_or_create(&pool_path).expect("pool");
    let r = run
        .register("r", 0, 256 * MIB, 256 * MIB, 1024 * MIB, Maker::Process)
        .expect("fits");
    assert!(r.slot.is_some());
    assert!(!p.others_live() || a.procs.len() == 1);
    run.sweep_at(crate::gpu::monotonic_ns() + 10 * LINGER_NS);
    assert_eq!(view(&run, "r").expect("kept").guarantee, 256 * MIB);
}

/// The promise in any order: tenants arrive (some registered before
/// their first process, some not), burst, free and leave at random;
/// the tenants together never hold more than the GPU, and a tenant
/// below what it reserved of its guarantee always gets up to it at
/// once, and a pending part is only ever lent to bursts taken before
/// it arrived.
#[test]
fn guarantees_hold_in_any_order_of_arrival() {
    let dir = TestDir::new("pool", "anyorder");
    let pool_path = path(dir.path(), &UUID);
    let spec = [(128, 1024), (192, 512), (256, 256), (64, 900), (300, 300)];
    let mut ts: Vec<Option<Tenant>> = spec.iter().map(|_| None).collect();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let (mut granted, mut probes, mut pendings) = (0, 0, 0);
    for step in 0..20_000 {
        let t = rnd(ts.len() as u64) as usize;
        if ts[t].is_none() {
            if rnd(50) == 0 || step == 0 {
                let (g, m) = spec[t];
                ts[t] = Some(tenant(&dir, &pool_path, t, g * MIB, m * MIB, 2));
            }
            continue;
        }
        let tn = ts[t].as_mut().expect("arrived");
        let p = rnd(2) as usize;
        if rnd(3) > 0 || tn.held[p].is_empty() {
            let size = (1 + rnd(96)) * MIB;
            let (seg, slot, d) = &tn.procs[p];
            if seg.admit_or_burst(*d, *slot, size).0 == Admit::Granted {
                tn.held[p].push(size);
                granted += 1;
            }
        } else {
            let k = rnd(tn.held[p].len() as u64) as usize;
            let size = tn.held[p].swap_remove(k);
            let (seg, slot, d) = &tn.procs[p];
            seg.credit(*d, *slot, size);
        }
        let total: u64 = ts.iter().flatten().map(used).sum();
        assert!(total <= 1024 * MIB, "tenants hold {total} bytes of 1 GiB");
        let q = rnd(ts.len() as u64) as usize;
        let Some(tq) = ts[q].as_ref() else { continue };
        let (seg, slot, d) = &tq.procs[0];
        let link = seg.pool_link(*d).expect("linked");
        let pending = link.pool.pending(link.entry);
        if pending > 0 {
            pendings += 1;
        }
        let short = (tq.guarantee - pending).saturating_sub(used(tq));
        if short > 0 {
            assert_eq!(
                seg.admit_or_burst(*d, *slot, short).0,
                Admit::Granted,
                "tenant {q} at {} of its {} reserved could not reach it",
                used(tq),
                tq.guarantee - pending
            );
            seg.credit(*d, *slot, short);
            probes += 1;
        }
    }
    assert!(
        granted > 1000 && probes > 500 && pendings > 0,
        "{granted} {probes} {pendings}"
    );
}

#[test]
fn a_raised_guarantee_takes_its_own_burst_then_the_room_and_the_rest_is_pending() {
    // Lowered: reserved down to it, burst untouched.
    assert_eq!(regrant(500, 100, 300, 0), (300, 100));
    // Raised by 300: 100 of its own burst, 150 of room, 50 pending.
    assert_eq!(regrant(500, 100, 800, 150), (750, 0));
    // Room enough: all reserved.
    assert_eq!(regrant(500, 0, 800, 1000), (800, 0));
}

/// H4 for the pool: a tenant keeping the pool file's lock holds
/// another tenant's start and burst only a bounded time (the start
/// then fails closed naming the file and the holder), and root's
/// release goes on without it.
#[test]
fn a_tenant_keeping_the_pools_lock_holds_a_start_and_a_release_only_a_bounded_time() {
    let dir = TestDir::new("pool", "kept");
    let pool_path = path(dir.path(), &UUID);
    let root = Pool::open_or_create(&pool_path).expect("pool");
    root.register("c", 1, 64 * MIB, 64 * MIB, 1024 * MIB, Maker::Root)
        .expect("fits");
    let hostile = Pool::open_or_create(&pool_path).expect("pool");
    // SAFETY: flock on the hostile tenant's own descriptor.
    assert_eq!(unsafe { libc::flock(hostile.raw_fd(), libc::LOCK_EX) }, 0);
    let t0 = std::time::Instant::now();
    let err = Pool::open_or_create(&pool_path)
        .expect("pool")
        .join("t", 0, 64 * MIB, 64 * MIB, 1024 * MIB, 1)
        .expect_err("the lock is kept");
    let waited = t0.elapsed();
    assert!(
        waited >= TENANT_WAIT && waited < TENANT_WAIT * 6,
        "{waited:?}"
    );
    assert!(
        err.0.contains(&pool_path.display().to_string())
            && err.0.contains(&format!("pid {}", std::process::id())),
        "{}",
        err.0
    );
    let (found, busy) = root.release("c", 1);
    assert!(found && busy.is_some());
    assert!(view(&root, "c").is_none(), "released without the lock");
}

/// A borrower's name reaches another tenant's log line: whatever the
/// borrower wrote there, no control character gets through.
#[test]
fn a_borrowers_name_reaches_a_log_without_control_characters() {
    let dir = TestDir::new("pool", "names");
    let p = Pool::open_or_create(&path(dir.path(), &UUID)).expect("pool");
    let (i, _) = p
        .join("a\x1b[2Jb", 0, MIB, 8 * MIB, 1024 * MIB, 1)
        .expect("join");
    p.entry(i)
        .expect("entry")
        .burst
        .store(MIB, Ordering::Release);
    assert_eq!(p.borrowers(), vec![("a?[2Jb".to_string(), MIB)]);
}
