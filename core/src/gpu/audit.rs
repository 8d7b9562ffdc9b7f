//! Audit and repair of a per-GPU segment from outside the tenants (the host
//! watchdog, `cuslice watch`).
//!
//! Every tenant can write the per-GPU segment (a file every tenant's
//! processes map read-write: under the OCI hook, root's, mode 0666, reached
//! through each container's mount), so the values in it are only as good
//! as the least trustworthy
//! tenant. The shim already survives garbage (every value it reads is
//! bounds-checked, see `policy`, by the bounds of `bounds`), but a hostile tenant that *keeps*
//! writing plausible values steers arbitration: its own share and ceiling
//! raised, the others' lowered, a latency class it was not given, a lease
//! pointed at itself, waiting counts that make every holder drain.
//!
//! The watchdog knows what each tenant was given (the quota files it reads
//! as root) and which processes are alive (the kernel's locks), so it can
//! tell values no cuslice process would write and put back what it knows:
//!
//! - a known tenant's share, ceiling, burst and class: what its quota file
//!   says (the shim writes exactly these at registration);
//! - the lease: kept only by a live process entry of the tenant it names;
//! - deadlines and hints in the future beyond what any slice or stamp can
//!   reach, and ceiling buckets beyond what a bucket can hold (the same
//!   bounds the shim clamps with: `bounds`);
//! - counters (live processes, waiters, threads in a synchronising call)
//!   that disagree with the process entries by more than a registration in
//!   flight can explain;
//! - a waiting tenant whose virtual time lies further behind the others
//!   than any tenant that has waited since the others started can be;
//! - process entries in a state no cuslice writes, or naming no tenant;
//!   entries of dead processes are swept as every process sweeps them.
//!
//! Tenants are known by name and slice tag (entries are per slice, see
//! `layout::Tenant::name`): each entry is judged against the quota file of
//! its own slice, whatever other slice has the same tenant name.
//!
//! What it does not judge: a tenant it does not know (a process run with
//! the shim by hand, outside any slice, registers one), the demand window
//! and the `heavy` flag (they change every 100 ms by design), and the
//! accounting totals (`used_ns`, `throttled_ns`, a process entry's
//! `bound_ns`), which are display.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::bounds::{
    self, CLOCK_AHEAD_NS, DEADLINE_AHEAD_NS, MAX_DEBT_NS, MAX_SAVED_NS, MAX_SYNCING, STAMP_AHEAD_NS,
};
use super::layout::*;

/// A tenant the watchdog knows, with what its quota file gives it on this
/// GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub name: String,
    /// Its slice's tag (`Config::slice_tag`): the entry it is judged
    /// against is the one of this name *and* tag (entries are per slice:
    /// two slices may share a tenant name).
    pub tag: u64,
    pub spec: TenantSpec,
}

/// One value no cuslice process would have written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The tenant entry concerned, by name, if any (the lease and the
    /// scheduler words belong to none).
    pub tenant: Option<String>,
    /// A short stable key (metrics label): `tenant-config`, `lease`,
    /// `deadline`, `latency-hint`, `tokens`, `clock`, `counts`, `vtime`,
    /// `process-entry`.
    pub kind: &'static str,
    /// One line: what was found and what it should be.
    pub what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tenant {
            Some(t) => write!(f, "tenant {t}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

/// What the tenants' process entries say, per tenant: live entries,
/// waiting ones, threads inside a synchronising call.
#[derive(Default, Clone, Copy)]
struct Counted {
    procs: u32,
    waiting: u32,
    syncing: u32,
}

/// Checks the segment against what the watchdog knows. `expected` names
/// the tenants of every slice it knows (others are not judged); `now` is
/// CLOCK_MONOTONIC in ns. Reads only.
pub fn audit(seg: &GpuSegment, expected: &[Expected], now: u64) -> Vec<Finding> {
    let mut out = Vec::new();
    check(seg, expected, now, &mut out, false);
    out
}

/// Puts back what [`audit`] finds and returns what it found, each finding
/// repaired. When there is anything to repair, sweeps dead processes'
/// entries first (as every process does), then restores known tenants' configuration, frees a lease no live
/// process of its tenant holds, clears deadlines, hints and buckets no
/// cuslice process writes, recounts forged counters and wakes everyone who
/// sleeps on the segment, so that arbitration goes on from what is true.
/// Needs a writable mapping ([`GpuSegment::open_existing`]).
pub fn repair(seg: &GpuSegment, expected: &[Expected], now: u64) -> Vec<Finding> {
    // What was there, as found; then the sweep (which frees entries of
    // dead processes, forged ones included), then the fixes on what is
    // left.
    let found = audit(seg, expected, now);
    if found.is_empty() {
        return found;
    }
    seg.reclaim_dead();
    check(seg, expected, now, &mut Vec::new(), true);
    if found
        .iter()
        .any(|f| matches!(f.kind, "tenant-config" | "vtime"))
    {
        level_vtimes(seg);
    }
    {
        let s = seg.sched();
        s.generation.fetch_add(1, Ordering::AcqRel);
        s.lat_gen.fetch_add(1, Ordering::AcqRel);
        super::futex_wake_all(&s.generation);
        super::futex_wake_all(&s.lat_gen);
    }
    found
}

/// Starts every registered tenant's virtual time afresh at the least of
/// them. Virtual time is GPU time divided by share: while shares were
/// forged, the tenants' virtual times moved at the forged rates, so after
/// the shares are restored, whoever ran less at a forged share of 1 would
/// be owed up to a slice x 100 of its real share (seconds of the GPU to
/// itself: measured on the fake GPU, 30/70 read 20/80 and 37/63 over the
/// next 3.5 s). Level, the split is the shares' from the repair on.
fn level_vtimes(seg: &GpuSegment) {
    let tenants: Vec<&Tenant> = (0..MAX_TENANTS)
        .filter_map(|i| seg.tenant(i))
        .filter(|t| t.state.load(Ordering::Acquire) == READY)
        .collect();
    let Some(least) = tenants
        .iter()
        .map(|t| t.vtime.load(Ordering::Acquire))
        .min()
    else {
        return;
    };
    for t in tenants {
        t.vtime.store(least, Ordering::Release);
    }
}

fn check(seg: &GpuSegment, expected: &[Expected], now: u64, out: &mut Vec<Finding>, fix: bool) {
    let counted = count_entries(seg, out, fix);
    check_tenants(seg, expected, &counted, now, out, fix);
    check_sched(seg, now, out, fix);
}

/// Process entries: a state no cuslice writes, or a live entry naming a
/// tenant entry that is not registered, is forged. Returns what the sane
/// live entries of each tenant say.
fn count_entries(seg: &GpuSegment, out: &mut Vec<Finding>, fix: bool) -> [Counted; MAX_TENANTS] {
    let mut counted = [Counted::default(); MAX_TENANTS];
    for i in 0..MAX_PROCS {
        let Some(p) = seg.proc_entry(i) else { break };
        match p.state.load(Ordering::Acquire) {
            PROC_FREE => continue,
            PROC_LIVE => {}
            st => {
                out.push(Finding {
                    tenant: None,
                    kind: "process-entry",
                    what: format!(
                        "process entry {i} is in state {st}, which no cuslice process writes"
                    ),
                });
                if fix {
                    free_entry(seg, i);
                }
                continue;
            }
        }
        let t = p.tenant.load(Ordering::Relaxed) as usize;
        let registered = seg
            .tenant(t)
            .is_some_and(|e| e.state.load(Ordering::Acquire) == READY);
        if !registered {
            out.push(Finding {
                tenant: None,
                kind: "process-entry",
                what: format!(
                    "process entry {i} (pid {}) names tenant entry {t}, which is not registered",
                    p.pid.load(Ordering::Relaxed)
                ),
            });
            if fix {
                free_entry(seg, i);
            }
            continue;
        }
        if !seg.proc_alive(i) {
            // A dead process not swept yet (repair swept before): what it
            // left is the sweep's business, not a forgery.
            continue;
        }
        let c = &mut counted[t];
        c.procs += 1;
        c.waiting += u32::from(p.waiting.load(Ordering::Relaxed) != 0);
        c.syncing = c
            .syncing
            .saturating_add(p.syncing.load(Ordering::Relaxed).min(MAX_SYNCING));
    }
    counted
}

/// Frees a forged process entry, unless a live process owns its slot: the
/// state word is then put back to live (the owner keeps using it).
fn free_entry(seg: &GpuSegment, i: usize) {
    let Some(p) = seg.proc_entry(i) else { return };
    if seg.proc_alive(i) {
        p.state.store(PROC_LIVE, Ordering::Release);
    } else {
        p.state.store(PROC_FREE, Ordering::Release);
    }
}

fn check_tenants(
    seg: &GpuSegment,
    expected: &[Expected],
    counted: &[Counted; MAX_TENANTS],
    now: u64,
    out: &mut Vec<Finding>,
    fix: bool,
) {
    let views = seg.tenants();
    // The least virtual time among competing tenants, each tenant's own
    // excluded.
    let competing: Vec<(usize, u64)> = views
        .iter()
        .filter_map(|v| {
            let t = seg.tenant(v.index)?;
            (counted[v.index].waiting > 0).then(|| (v.index, t.vtime.load(Ordering::Acquire)))
        })
        .collect();
    for v in &views {
        let Some(t) = seg.tenant(v.index) else {
            continue;
        };
        let name = v.name.clone();
        let mut push = |kind: &'static str, what: String| {
            out.push(Finding {
                tenant: Some(name.clone()),
                kind,
                what,
            })
        };
        // Its share and ceiling as a registration would have written them.
        let registrable = share_and_ceiling(v.share, v.max);
        // By name and tag: another slice's entry of the same name is its
        // own slice's business (a non-zero tag is never a finding).
        if let Some(e) = expected.iter().find(|e| e.name == v.name && e.tag == v.tag) {
            check_config(t, &e.spec, &mut push, fix);
        } else if registrable != (v.share, v.max) {
            // An unknown tenant is not judged on its values, except ones
            // no registration can produce.
            push(
                "tenant-config",
                format!(
                    "share {} / ceiling {}: out of range (1..=100, share..=100)",
                    v.share, v.max
                ),
            );
            if fix {
                let (share, max) = registrable;
                t.share.store(share, Ordering::Relaxed);
                t.max.store(max, Ordering::Relaxed);
            }
        }
        let c = counted[v.index];
        check_count(&t.procs, c.procs, "live processes", &mut push, fix);
        check_count(&t.waiting, c.waiting, "waiting processes", &mut push, fix);
        check_count(
            &t.in_sync,
            c.syncing,
            "threads in a synchronising call",
            &mut push,
            fix,
        );
        let tokens = t.tokens.load(Ordering::Relaxed);
        if t.max.load(Ordering::Relaxed) < 100 && !bounds::tokens_in_bounds(tokens) {
            push(
                "tokens",
                format!(
                    "ceiling bucket holds {:.3} s of GPU time; a bucket holds {:.3} s owed to {:.3} s saved",
                    tokens as f64 / 1e9,
                    -(MAX_DEBT_NS as f64) / 1e9,
                    MAX_SAVED_NS as f64 / 1e9
                ),
            );
            if fix {
                t.tokens.store(0, Ordering::Relaxed);
                t.tokens_at.store(now, Ordering::Relaxed);
            }
        }
        for (word, what) in [
            (&t.tokens_at, "bucket refill time"),
            (&t.win_start, "demand window start"),
            (&t.last_active, "last activity"),
        ] {
            future(word, now, CLOCK_AHEAD_NS, what, "clock", &mut push, fix);
        }
        future(
            &t.active_until,
            now,
            STAMP_AHEAD_NS,
            "latency stamp",
            "latency-hint",
            &mut push,
            fix,
        );
        if counted[v.index].waiting > 0 {
            let vt = t.vtime.load(Ordering::Acquire);
            let others = competing
                .iter()
                .filter(|(i, _)| *i != v.index)
                .map(|&(_, vt)| vt)
                .min();
            if let Some(least) = others
                && bounds::vtime_lags(vt, least)
            {
                push(
                    "vtime",
                    format!(
                        "virtual time {vt} lags the other waiting tenants' ({least}) by more than any wait can"
                    ),
                );
                if fix {
                    t.vtime.store(least, Ordering::Release);
                }
            }
        }
    }
}

/// A known tenant's share, ceiling, burst and class against its quota
/// file, normalised as registration normalises them.
fn check_config(
    t: &Tenant,
    spec: &TenantSpec,
    push: &mut impl FnMut(&'static str, String),
    fix: bool,
) {
    let (share, max, class) = super::layout::normalized(spec);
    let have = (
        t.share.load(Ordering::Relaxed),
        t.max.load(Ordering::Relaxed),
        t.burst_ns.load(Ordering::Relaxed),
        t.class.load(Ordering::Relaxed),
    );
    if have == (share, max, spec.burst_ns, class) {
        return;
    }
    let class_name = |c: u32| match c {
        CLASS_STANDARD => "standard".to_string(),
        CLASS_LATENCY => "latency".to_string(),
        c => format!("class {c}"),
    };
    push(
        "tenant-config",
        format!(
            "share {} / ceiling {} / burst {} ms / {}, its quota file gives share {share} / ceiling {max} / burst {} ms / {}",
            have.0,
            have.1,
            have.2 / 1_000_000,
            class_name(have.3),
            spec.burst_ns / 1_000_000,
            class_name(class)
        ),
    );
    if fix {
        t.share.store(share, Ordering::Relaxed);
        t.max.store(max, Ordering::Relaxed);
        t.burst_ns.store(spec.burst_ns, Ordering::Relaxed);
        t.class.store(class, Ordering::Relaxed);
        if !spec.latency {
            t.active_until.store(0, Ordering::Relaxed);
        }
    }
}

fn check_count(
    word: &AtomicU32,
    counted: u32,
    what: &str,
    push: &mut impl FnMut(&'static str, String),
    fix: bool,
) {
    let v = word.load(Ordering::Acquire);
    if !bounds::count_agrees(v, counted) {
        push(
            "counts",
            format!("{v} {what} recorded, {counted} in the process entries"),
        );
        if fix {
            word.store(counted, Ordering::Release);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn future(
    word: &AtomicU64,
    now: u64,
    ahead: u64,
    what: &str,
    kind: &'static str,
    push: &mut impl FnMut(&'static str, String),
    fix: bool,
) {
    let v = word.load(Ordering::Relaxed);
    if bounds::too_far_ahead(v, now, ahead) {
        push(
            kind,
            format!(
                "{what} lies {:.3} s ahead; no cuslice process writes more than {:.3} s ahead",
                (v - now) as f64 / 1e9,
                ahead as f64 / 1e9
            ),
        );
        if fix {
            word.store(now, Ordering::Relaxed);
        }
    }
}

fn check_sched(seg: &GpuSegment, now: u64, out: &mut Vec<Finding>, fix: bool) {
    let s = seg.sched();
    let mut push = |kind: &'static str, what: String| {
        out.push(Finding {
            tenant: None,
            kind,
            what,
        })
    };
    future(
        &s.deadline,
        now,
        DEADLINE_AHEAD_NS,
        "the lease deadline",
        "deadline",
        &mut push,
        fix,
    );
    let lease = s.lease.load(Ordering::Acquire);
    if lease != 0 {
        let slot = lease as usize - 1;
        let holder = s.holder_tenant.load(Ordering::Relaxed);
        let entry = seg.proc_entry(slot);
        let why = match entry {
            None => Some(format!(
                "names process entry {slot}, beyond the {MAX_PROCS} entries"
            )),
            Some(p) if p.state.load(Ordering::Acquire) != PROC_LIVE => {
                Some(format!("names process entry {slot}, which is free"))
            }
            Some(_) if !seg.proc_alive(slot) => {
                Some(format!("names process entry {slot}, whose process is dead"))
            }
            Some(p) if p.tenant.load(Ordering::Relaxed) != holder => Some(format!(
                "names process entry {slot} of tenant entry {} as held by tenant entry {holder}",
                p.tenant.load(Ordering::Relaxed)
            )),
            Some(_) => None,
        };
        if let Some(why) = why {
            push("lease", format!("the lease {why}"));
            if fix
                && s.lease
                    .compare_exchange(lease, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                s.deadline.store(now, Ordering::Release);
            }
        }
    }
    future(
        &s.slice_start,
        now,
        CLOCK_AHEAD_NS,
        "the slice start",
        "clock",
        &mut push,
        fix,
    );
    future(
        &s.swept_at,
        now,
        CLOCK_AHEAD_NS,
        "the last sweep time",
        "clock",
        &mut push,
        fix,
    );
    let hint = s.lat_until.load(Ordering::Relaxed);
    if bounds::too_far_ahead(hint, now, STAMP_AHEAD_NS) {
        push(
            "latency-hint",
            format!(
                "the latency hint lies {:.3} s ahead; no stamp reaches more than {:.3} s ahead",
                (hint - now) as f64 / 1e9,
                STAMP_AHEAD_NS as f64 / 1e9
            ),
        );
        if fix {
            s.lat_until.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::Acquire;

    const SLICE: u64 = 20_000_000;
    const NOW: u64 = 1_000_000_000_000;

    /// A segment in a directory removed when the test ends.
    fn seg(name: &str) -> (crate::testdir::TestDir, GpuSegment) {
        crate::testdir::gpu_segment("audit", name)
    }

    fn spec(share: u32, max: u32, latency: bool) -> TenantSpec {
        TenantSpec {
            share,
            max,
            burst_ns: 200_000_000,
            latency,
        }
    }

    /// Three tenants as the shim registers them, each with a live process
    /// (its own open file description holds the entry's lock); the first
    /// holds the lease, the other two wait for it.
    fn busy(
        name: &str,
    ) -> (
        crate::testdir::TestDir,
        GpuSegment,
        Vec<GpuSegment>,
        Vec<Expected>,
    ) {
        let (d, g) = seg(name);
        let expected = vec![
            Expected {
                name: "web".into(),
                tag: 0,
                spec: spec(30, 100, true),
            },
            Expected {
                name: "train".into(),
                tag: 0x7a61,
                spec: spec(50, 80, false),
            },
            Expected {
                name: "batch".into(),
                tag: 0,
                spec: spec(20, 20, false),
            },
        ];
        let mut procs = Vec::new();
        for (k, e) in expected.iter().enumerate() {
            let (t, _) = g.register(&e.name, e.tag, e.spec, NOW).expect("tenant");
            let p = GpuSegment::open_or_create(&g.path).expect("open");
            let slot = p.claim_proc(t, 100 + k as u32).expect("proc");
            p.begin_wait(slot, t, NOW);
            if k == 0 {
                assert!(matches!(
                    p.try_acquire(slot, t, NOW, SLICE),
                    Acquire::Granted { .. }
                ));
            }
            procs.push(p);
        }
        (d, g, procs, expected)
    }

    fn tenant<'a>(g: &'a GpuSegment, name: &str) -> &'a Tenant {
        let i = g
            .tenants()
            .iter()
            .find(|v| v.name == name)
            .expect("tenant")
            .index;
        g.tenant(i).expect("entry")
    }

    fn kinds(f: &[Finding]) -> Vec<&'static str> {
        f.iter().map(|f| f.kind).collect()
    }

    #[test]
    fn what_cuslice_writes_is_not_a_finding() {
        let (_d, g, _procs, expected) = busy("clean");
        assert_eq!(audit(&g, &expected, NOW + SLICE), vec![]);
        // Repair of a sane segment changes nothing and reports nothing.
        assert_eq!(repair(&g, &expected, NOW + SLICE), vec![]);
        assert_ne!(
            g.sched().lease.load(Ordering::Acquire),
            0,
            "the live holder keeps its lease"
        );
        // A tenant the watchdog does not know is not judged on plausible
        // values.
        let (t, _) = g
            .register("by-hand", 0, spec(100, 100, true), NOW)
            .expect("tenant");
        let p = GpuSegment::open_or_create(&g.path).expect("open");
        p.claim_proc(t, 7).expect("proc");
        assert_eq!(audit(&g, &expected, NOW), vec![]);
    }

    #[test]
    fn a_tenant_that_raised_its_share_and_class_is_put_back() {
        let (_d, g, _procs, expected) = busy("config");
        let batch = tenant(&g, "batch");
        batch.share.store(100, Ordering::Relaxed);
        batch.max.store(100, Ordering::Relaxed);
        batch.class.store(CLASS_LATENCY, Ordering::Relaxed);
        let train = tenant(&g, "train");
        train.share.store(1, Ordering::Relaxed);
        let found = audit(&g, &expected, NOW);
        assert_eq!(
            kinds(&found),
            ["tenant-config", "tenant-config"],
            "{found:?}"
        );
        assert_eq!(
            found[1].to_string(),
            "tenant batch: share 100 / ceiling 100 / burst 200 ms / latency, its quota file gives share 20 / ceiling 20 / burst 200 ms / standard"
        );
        assert_eq!(repair(&g, &expected, NOW).len(), 2);
        assert_eq!(
            (
                batch.share.load(Ordering::Relaxed),
                batch.max.load(Ordering::Relaxed)
            ),
            (20, 20)
        );
        assert_eq!(batch.class.load(Ordering::Relaxed), CLASS_STANDARD);
        assert_eq!(train.share.load(Ordering::Relaxed), 50);
        assert_eq!(audit(&g, &expected, NOW), vec![]);
        // Virtual times that moved at the forged shares start afresh, level.
        batch.vtime.store(7_000_000_000, Ordering::Relaxed);
        train.vtime.store(9_000_000_000, Ordering::Relaxed);
        tenant(&g, "web")
            .vtime
            .store(8_000_000_000, Ordering::Relaxed);
        batch.share.store(100, Ordering::Relaxed);
        assert_eq!(kinds(&repair(&g, &expected, NOW)), ["tenant-config"]);
        for name in ["web", "train", "batch"] {
            assert_eq!(
                tenant(&g, name).vtime.load(Ordering::Relaxed),
                7_000_000_000,
                "{name}"
            );
        }
    }

    /// Two slices given one tenant name: each entry is put back from its
    /// own slice's quota file, in whatever order they are listed.
    #[test]
    fn one_name_in_two_slices_is_judged_per_slice() {
        let (_d, g) = seg("slices");
        let mut expected = vec![
            Expected {
                name: "shared".into(),
                tag: 0xa,
                spec: spec(50, 100, false),
            },
            Expected {
                name: "shared".into(),
                tag: 0xb,
                spec: spec(1, 1, false),
            },
        ];
        let mut procs = Vec::new();
        let mut index = Vec::new();
        for (k, e) in expected.iter().enumerate() {
            let (t, _) = g.register(&e.name, e.tag, e.spec, NOW).expect("tenant");
            let p = GpuSegment::open_or_create(&g.path).expect("open");
            p.claim_proc(t, 200 + k as u32).expect("proc");
            procs.push(p);
            index.push(t);
        }
        assert_ne!(index[0], index[1]);
        assert_eq!(audit(&g, &expected, NOW), vec![]);
        let entry = |k: usize| g.tenant(index[k]).expect("entry");
        for order in [false, true] {
            if order {
                expected.reverse();
            }
            entry(0).share.store(1, Ordering::Relaxed);
            entry(0).max.store(1, Ordering::Relaxed);
            entry(1).share.store(100, Ordering::Relaxed);
            entry(1).max.store(100, Ordering::Relaxed);
            let found = repair(&g, &expected, NOW);
            assert_eq!(
                kinds(&found),
                ["tenant-config", "tenant-config"],
                "{found:?}"
            );
            let got = |k: usize| {
                (
                    entry(k).share.load(Ordering::Relaxed),
                    entry(k).max.load(Ordering::Relaxed),
                )
            };
            assert_eq!((got(0), got(1)), ((50, 100), (1, 1)), "reversed: {order}");
            assert_eq!(audit(&g, &expected, NOW), vec![]);
        }
    }

    #[test]
    fn a_lease_no_live_process_of_its_tenant_holds_is_freed() {
        let (_d, g, procs, expected) = busy("lease");
        let s = g.sched();
        let holder = s.lease.load(Ordering::Acquire);
        let held_by = s.holder_tenant.load(Ordering::Relaxed);
        // Pointed at another tenant's live process, under the holder's
        // tenant: forged.
        s.lease.store(holder % 3 + 1, Ordering::Release);
        assert_eq!(kinds(&audit(&g, &expected, NOW)), ["lease"]);
        // Pointed at a free entry, with a deadline an hour ahead.
        s.lease.store(400, Ordering::Release);
        s.deadline.store(NOW + 3_600_000_000_000, Ordering::Release);
        let found = repair(&g, &expected, NOW);
        assert_eq!(kinds(&found), ["deadline", "lease"], "{found:?}");
        assert_eq!(s.lease.load(Ordering::Acquire), 0);
        assert!(s.deadline.load(Ordering::Relaxed) <= NOW);
        assert_eq!(audit(&g, &expected, NOW), vec![]);
        // Beyond the entries; and the entry of a process that died.
        s.lease.store(MAX_PROCS as u32 + 5, Ordering::Release);
        assert_eq!(kinds(&audit(&g, &expected, NOW)), ["lease"]);
        s.lease.store(holder, Ordering::Release);
        s.holder_tenant.store(held_by, Ordering::Relaxed);
        assert_eq!(audit(&g, &expected, NOW), vec![]);
        drop(procs);
        let found = audit(&g, &expected, NOW);
        assert!(
            found
                .iter()
                .any(|f| f.kind == "lease" && f.what.contains("dead")),
            "{found:?}"
        );
        repair(&g, &expected, NOW);
        assert_eq!(s.lease.load(Ordering::Acquire), 0);
        assert_eq!(audit(&g, &expected, NOW), vec![]);
    }

    #[test]
    fn forged_hints_buckets_and_counts_are_put_back() {
        let (_d, g, _procs, expected) = busy("words");
        let s = g.sched();
        s.lat_until.store(u64::MAX, Ordering::Relaxed);
        let web = tenant(&g, "web");
        web.active_until
            .store(NOW + 60_000_000_000, Ordering::Relaxed);
        let train = tenant(&g, "train");
        train.tokens.store(3_000_000_000_000, Ordering::Relaxed);
        tenant(&g, "batch")
            .tokens_at
            .store(NOW + 10_000_000_000, Ordering::Relaxed);
        train.waiting.store(1000, Ordering::Relaxed);
        let batch = tenant(&g, "batch");
        batch.procs.store(u32::MAX, Ordering::Relaxed);
        let mut found = kinds(&repair(&g, &expected, NOW));
        found.sort();
        assert_eq!(
            found,
            [
                "clock",
                "counts",
                "counts",
                "latency-hint",
                "latency-hint",
                "tokens"
            ]
        );
        assert_eq!(s.lat_until.load(Ordering::Relaxed), 0);
        assert!(web.active_until.load(Ordering::Relaxed) <= NOW);
        assert_eq!(train.tokens.load(Ordering::Relaxed), 0);
        assert_eq!(train.waiting.load(Ordering::Relaxed), 1);
        assert_eq!(batch.procs.load(Ordering::Relaxed), 1);
        assert_eq!(audit(&g, &expected, NOW), vec![]);
    }

    #[test]
    fn a_waiting_tenant_posing_with_virtual_time_zero_is_raised() {
        let (_d, g, _procs, expected) = busy("vtime");
        let train = tenant(&g, "train");
        let batch = tenant(&g, "batch");
        let far = 100 * bounds::VTIME_LAG;
        train.vtime.store(far, Ordering::Relaxed);
        batch.vtime.store(0, Ordering::Relaxed);
        tenant(&g, "web").vtime.store(far + 5, Ordering::Relaxed);
        let found = repair(&g, &expected, NOW);
        assert_eq!(kinds(&found), ["vtime"]);
        assert_eq!(found[0].tenant.as_deref(), Some("batch"));
        assert_eq!(batch.vtime.load(Ordering::Relaxed), far);
        // Within the lag: a tenant behind the others by a few slices is
        // what waiting looks like.
        batch
            .vtime
            .store(far - bounds::VTIME_LAG / 2, Ordering::Relaxed);
        assert_eq!(audit(&g, &expected, NOW), vec![]);
    }

    #[test]
    fn forged_process_entries_are_freed() {
        let (_d, g, _procs, expected) = busy("procs");
        let free = (0..MAX_PROCS)
            .filter(|&i| {
                g.proc_entry(i)
                    .is_some_and(|p| p.state.load(Ordering::Relaxed) == PROC_FREE)
            })
            .take(2)
            .collect::<Vec<_>>();
        let a = g.proc_entry(free[0]).expect("entry");
        a.state.store(77, Ordering::Relaxed);
        let b = g.proc_entry(free[1]).expect("entry");
        b.tenant.store(31, Ordering::Relaxed);
        b.state.store(PROC_LIVE, Ordering::Relaxed);
        let found = repair(&g, &expected, NOW);
        assert_eq!(
            kinds(&found),
            ["process-entry", "process-entry"],
            "{found:?}"
        );
        assert_eq!(a.state.load(Ordering::Relaxed), PROC_FREE);
        assert_eq!(b.state.load(Ordering::Relaxed), PROC_FREE);
        assert_eq!(audit(&g, &expected, NOW), vec![]);
    }

    #[test]
    fn after_a_repair_nothing_is_left_to_find() {
        // Random values in every word of the tenant entries and the
        // scheduler block: whatever repair finds, a second audit finds
        // nothing, and the live processes keep their entries.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..40 {
            let (_d, g, _procs, expected) = busy(&format!("random-{round}"));
            let interesting = |v: u64| match v % 4 {
                0 => v,
                1 => v % 200,
                2 => NOW + v % (4 * bounds::MAX_SLICE_NS),
                _ => v % 4,
            };
            let s = g.sched();
            for w in [&s.deadline, &s.slice_start, &s.lat_until, &s.swept_at] {
                w.store(interesting(rnd()), Ordering::Relaxed);
            }
            s.lease.store(interesting(rnd()) as u32, Ordering::Relaxed);
            for v in g.tenants() {
                let t = g.tenant(v.index).expect("entry");
                for w in [&t.share, &t.max, &t.waiting, &t.procs, &t.class, &t.in_sync] {
                    w.store(interesting(rnd()) as u32, Ordering::Relaxed);
                }
                for w in [
                    &t.vtime,
                    &t.tokens_at,
                    &t.burst_ns,
                    &t.active_until,
                    &t.win_start,
                    &t.last_active,
                ] {
                    w.store(interesting(rnd()), Ordering::Relaxed);
                }
                t.tokens.store(interesting(rnd()) as i64, Ordering::Relaxed);
            }
            repair(&g, &expected, NOW);
            assert_eq!(audit(&g, &expected, NOW), vec![], "round {round}");
            let live = (0..MAX_PROCS)
                .filter(|&i| {
                    g.proc_entry(i)
                        .is_some_and(|p| p.state.load(Ordering::Relaxed) == PROC_LIVE)
                        && g.proc_alive(i)
                })
                .count();
            assert_eq!(live, 3, "round {round}");
        }
    }
}
