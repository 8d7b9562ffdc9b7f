//! What the watch does about its verdicts: [`decide`], the one mapping
//! from a verdict and the host's policy to an [`Action`]; the [`Executor`]
//! that performs actions (signals through pidfds, the freezer, segment
//! repairs); the [`Record`] of findings (one log line when a finding
//! starts, when something is done about it and when it ends; the counts);
//! [`acted_on`], what an action leaves to the next passes' judging; and
//! [`Actor::act`], the act step of a pass, which does all of that in
//! order.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuslice_core::gpu::audit::Expected;

use super::config::{Policy, WatchConfig};
use super::gpuseg::{self, Finding};
use super::judge::compute::TAMPER_QUIET_NS;
use super::judge::segments::gpu_segment_findings;
use super::judge::{Case, History, Key, Verdict, slice_key};
use super::log::log;
use super::procfs::{ProcSource, Procfs};
use super::slices::{SliceId, Slices};
use cuslice_host::resize::utc_time_of_day;
use cuslice_host::text::{self, LINE_MAX};
use cuslice_host::watch_state::{self, FindingView, Kind};

/// What to do about a verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Nothing: reported (a new finding says `reported`; one already
    /// active keeps what was done last).
    Report,
    /// Not acted on, and why (shown as what was done).
    Hold(String),
    /// SIGKILL one process.
    KillProcess { pid: u32, start: u64 },
    /// SIGKILL these processes, newest first, until a slice is back under
    /// its memory quota.
    KillNewest(Vec<(u32, u64)>),
    /// SIGKILL a slice's processes on a GPU.
    KillSlice(Vec<(u32, u64)>),
    /// SIGSTOP a slice's processes on a GPU for `time`, then SIGCONT.
    Freeze {
        slice: SliceId,
        gpu: u32,
        pids: Vec<(u32, u64)>,
        time: Duration,
    },
    /// Puts entry `entry` of a slice's memory segment back to `limit`
    /// (and, a GPU of this host, to its UUID and the READY state).
    RestoreQuota {
        slice: SliceId,
        entry: usize,
        uuid: Option<[u8; 16]>,
        limit: u64,
    },
    /// Repairs the GPU segment at `path` (`core::gpu::audit::repair`).
    RepairGpuSegment {
        path: PathBuf,
        expected: Vec<Expected>,
        at_ns: u64,
    },
}

/// The policy: what is done about `v` under `cfg` (`policy`, `repair`,
/// `freeze_seconds`). Kill: memory, the newest processes until the slice
/// is under its quota; unregistered, that process, once seen in two passes
/// in a row; compute, the slice's processes on that GPU. Freeze: compute
/// only (stopping a process gives no memory back). Segments are repaired
/// in every policy unless `repair = false`. A memory quota lowered by a
/// resize: not acted on within its grace; after it, as any memory finding
/// (report: said once more, as after the grace). Never acted on: a quota,
/// share or ceiling given by index (NVML's index need not be the GPU the
/// tenant calls so), and a compute finding on a GPU whose segment was
/// tampered with lately (the split may be forged, and acting could get a
/// well-behaved tenant killed).
pub fn decide(v: &Verdict, cfg: &WatchConfig) -> Action {
    let case = match v {
        Verdict::Found { case, .. } => case,
        Verdict::GpuSegment {
            path,
            expected,
            at_ns,
            ..
        } => {
            return if cfg.repair {
                Action::RepairGpuSegment {
                    path: path.clone(),
                    expected: expected.clone(),
                    at_ns: *at_ns,
                }
            } else {
                Action::Report
            };
        }
        Verdict::Stands(_) | Verdict::Unseen(_) => return Action::Report,
    };
    match case {
        Case::Unregistered {
            pid,
            start,
            seen_before,
        } => match cfg.policy {
            Policy::Kill if *seen_before => Action::KillProcess {
                pid: *pid,
                start: *start,
            },
            _ => Action::Report,
        },
        Case::Memory { kill, certain } => match cfg.policy {
            Policy::Kill if !certain => {
                Action::Hold("not acted on: the quota file gives this quota by index".into())
            }
            Policy::Kill => Action::KillNewest(kill.clone()),
            Policy::Report | Policy::Freeze => Action::Report,
        },
        Case::MemoryResized {
            kill,
            certain,
            until_ms,
            over,
        } => {
            let until = utc_time_of_day(*until_ms as f64 / 1000.0);
            if !over {
                return Action::Hold(format!(
                    "not acted on: over its resized quota, within its grace until {until}"
                ));
            }
            match cfg.policy {
                Policy::Kill if !certain => {
                    Action::Hold("not acted on: the quota file gives this quota by index".into())
                }
                Policy::Kill => Action::KillNewest(kill.clone()),
                // Said, so that the finding does not keep the grace's
                // words.
                Policy::Report | Policy::Freeze => Action::Hold(format!(
                    "reported: over its resized quota after its grace (ended {until})"
                )),
            }
        }
        Case::Compute {
            slice,
            gpu,
            pids,
            certain,
            forged,
        } => {
            if !certain {
                return Action::Hold(
                    "not acted on: the quota file gives this share or ceiling by index".into(),
                );
            }
            if *forged {
                return Action::Hold(format!(
                    "not acted on: GPU {gpu}'s segment was tampered with within {}s (the split may be forged)",
                    TAMPER_QUIET_NS / 1_000_000_000
                ));
            }
            match cfg.policy {
                Policy::Report => Action::Report,
                Policy::Kill => Action::KillSlice(pids.clone()),
                Policy::Freeze => Action::Freeze {
                    slice: slice.clone(),
                    gpu: *gpu,
                    pids: pids.clone(),
                    time: cfg.freeze,
                },
            }
        }
        Case::MemorySegment {
            slice,
            entry,
            uuid,
            limit,
            certain,
        } => {
            if !cfg.repair {
                Action::Report
            } else if !certain {
                Action::Hold("not restored (the quota file gives it by index)".into())
            } else {
                Action::RestoreQuota {
                    slice: slice.clone(),
                    entry: *entry,
                    uuid: *uuid,
                    limit: *limit,
                }
            }
        }
    }
}

/// What an action leaves to the next passes: a slice acted on for its
/// GPU time (killed or frozen) must be over its share or ceiling for
/// `compute_sustain` passes again before it is acted on again. A finding
/// only reported, or not acted on (a share given by index, a segment
/// tampered with lately), keeps its count: it stands from pass to pass
/// instead of ending and starting again.
pub fn acted_on(h: &mut History, case: &Case, a: &Action) {
    if let Case::Compute { slice, gpu, .. } = case
        && matches!(a, Action::KillSlice(_) | Action::Freeze { .. })
    {
        h.compute.sustain.remove(&(slice.clone(), *gpu));
    }
}

/// What performing an action gave.
#[derive(Debug, Default)]
pub struct Done {
    /// What was done, as shown (None: nothing; the finding is reported).
    pub action: Option<String>,
    /// A line for the state's errors.
    pub error: Option<String>,
    /// A repair's own findings (what it found as it repaired), which stand
    /// for the audit's.
    pub found: Option<Vec<Finding>>,
}

/// A slice frozen by `freeze`: its processes and when they are let go
/// (the first pass that starts after that).
struct Frozen {
    pids: Vec<(u32, u64)>,
    until: Instant,
}

/// Performs actions; holds the slices it froze.
#[derive(Default)]
pub struct Executor {
    frozen: HashMap<(SliceId, u32), Frozen>,
}

fn pid_list(pids: &[u32]) -> String {
    pids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl Executor {
    /// The slices serving a freeze at `at` (a pass's time), per GPU:
    /// those [`thaw`](Self::thaw) does not let go at `at`.
    pub fn frozen_at(&self, at: Instant) -> HashSet<(SliceId, u32)> {
        self.frozen
            .iter()
            .filter(|(_, f)| f.until > at)
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn signal_all(pids: &[(u32, u64)], sig: libc::c_int) -> Vec<u32> {
        pids.iter()
            .filter(|(pid, start)| signal(*pid, *start, sig).is_ok())
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Performs `a` (`slices`: where a slice's memory segment is).
    pub fn perform(&mut self, a: Action, slices: &Slices) -> Done {
        let action = match a {
            Action::Report => None,
            Action::Hold(why) => Some(why),
            Action::KillProcess { pid, start } => Some(match signal(pid, start, libc::SIGKILL) {
                Ok(()) => "killed".to_string(),
                Err(e) => format!("not killed: {e}"),
            }),
            Action::KillNewest(pids) => {
                let killed = Self::signal_all(&pids, libc::SIGKILL);
                Some(if killed.is_empty() {
                    "nothing left to kill".to_string()
                } else {
                    format!("killed pid {}", pid_list(&killed))
                })
            }
            Action::KillSlice(pids) => Some(format!(
                "killed pid {}",
                pid_list(&Self::signal_all(&pids, libc::SIGKILL))
            )),
            Action::Freeze {
                slice,
                gpu,
                pids,
                time,
            } => {
                let stopped = Self::signal_all(&pids, libc::SIGSTOP);
                self.frozen.insert(
                    (slice, gpu),
                    Frozen {
                        pids,
                        until: Instant::now() + time,
                    },
                );
                Some(format!(
                    "froze pid {} for {}s",
                    pid_list(&stopped),
                    time.as_secs()
                ))
            }
            Action::RestoreQuota {
                slice,
                entry,
                uuid,
                limit,
            } => {
                // Only a file the slice's own user could write (a
                // session's file must be what `cuslice run` wrote).
                let target = slices.get(&slice).map_or_else(
                    || Err("the slice is gone".to_string()),
                    super::slices::Slice::open_mem_seg_for_repair,
                );
                Some(
                    match target.and_then(|t| restore_limit(&t, entry, uuid.as_ref(), limit)) {
                        Ok(None) => "restored".to_string(),
                        Ok(Some(busy)) => format!("restored without its lock: {busy}"),
                        Err(e) => format!("not restored: {e}"),
                    },
                )
            }
            Action::RepairGpuSegment {
                path,
                expected,
                at_ns,
            } => {
                return match gpuseg::repair(&path, &expected, at_ns) {
                    Ok(found) => Done {
                        action: Some("restored".into()),
                        error: None,
                        found: Some(found),
                    },
                    Err(e) => Done {
                        action: None,
                        error: Some(format!("{}: cannot repair: {e}", path.display())),
                        found: None,
                    },
                };
            }
        };
        Done {
            action,
            ..Done::default()
        }
    }

    /// Lets frozen slices go whose time was up at `by` (all of them:
    /// None).
    pub fn thaw(&mut self, by: Option<Instant>, slices: &Slices) {
        let due: Vec<(SliceId, u32)> = self
            .frozen
            .iter()
            .filter(|(_, f)| by.is_none_or(|t| f.until <= t))
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            if let Some(f) = self.frozen.remove(&k) {
                let woke = Self::signal_all(&f.pids, libc::SIGCONT);
                let label = slices
                    .get(&k.0)
                    .map_or_else(|| slice_key(&k.0), |s| s.label.clone());
                log(&format!(
                    "{label}: GPU {}: let pid {} go on",
                    k.1,
                    pid_list(&woke)
                ));
            }
        }
    }
}

/// What acting keeps from pass to pass: the freezes it serves, the
/// findings it records.
#[derive(Default)]
pub struct Actor {
    pub executor: Executor,
    pub record: Record,
}

impl Actor {
    /// The act step of pass `pass`, after it was judged: first lets go the
    /// freezes whose time was up at `at`, the pass's time (the judge was
    /// given the others, [`Executor::frozen_at`]), then, verdict by
    /// verdict in the order they were judged, decides, performs and
    /// records; what acting leaves to the next passes goes into `next`,
    /// the history the judge returned ([`acted_on`]). Findings this pass
    /// did not find again end. Returns the lines for the state's errors.
    pub fn act(
        &mut self,
        pass: u64,
        at: Instant,
        verdicts: Vec<Verdict>,
        next: &mut History,
        cfg: &WatchConfig,
        slices: &Slices,
    ) -> Vec<String> {
        self.executor.thaw(Some(at), slices);
        let mut errors = vec![];
        for v in verdicts {
            let action = decide(&v, cfg);
            match v {
                Verdict::Found { key, view, case } => {
                    acted_on(next, &case, &action);
                    let done = self.executor.perform(action, slices);
                    self.record.found(pass, key, view, done.action);
                }
                Verdict::Stands(key) => self.record.stands(pass, &key),
                Verdict::GpuSegment {
                    path,
                    gpu,
                    findings,
                    ..
                } => {
                    let done = self.executor.perform(action, slices);
                    errors.extend(done.error);
                    // What a repair found as it wrote stands for what the
                    // audit found: worded by the same rule.
                    let findings = done
                        .found
                        .map_or(findings, |f| gpu_segment_findings(&path, gpu, &f));
                    for (key, view) in findings {
                        self.record.found(pass, key, view, done.action.clone());
                    }
                }
                Verdict::Unseen(e) => errors.push(e),
            }
        }
        self.record.end_unseen(pass);
        errors
    }
}

/// Sends `sig` to process `pid` if it is still the one that started at
/// `start` (a pidfd, so that a PID reused meanwhile is never signalled).
fn signal(pid: u32, start: u64, sig: libc::c_int) -> Result<(), String> {
    // SAFETY: pidfd_open(pid, 0) has no memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(format!("pid {pid}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the syscall just returned this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if Procfs.stat(pid).map(|s| s.start) != Some(start) {
        return Err(format!("pid {pid}: gone"));
    }
    // SAFETY: pidfd_send_signal on our pidfd, no siginfo, no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r != 0 {
        return Err(format!("pid {pid}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Puts entry `dev` of the memory segment `target` back: its limit, and
/// with `uuid` (a GPU of this host) its UUID and READY state too (a plain
/// store: admissions read the limit under the entry's lock, so the next
/// one sees it). The segment's lock is waited for at most 2 s
/// (`Segment::restore_device`): a tenant keeping it gets the quota put
/// back all the same, and the pass goes on; Some: who kept it.
fn restore_limit(
    target: &super::slices::RepairTarget,
    dev: usize,
    uuid: Option<&[u8; 16]>,
    limit: u64,
) -> Result<Option<String>, String> {
    let seg = target.open()?;
    let busy = match seg.restore_device(dev, uuid, limit) {
        Ok(b) => b,
        Err(_) => return Err("no such device entry".into()),
    };
    if seg.truncated() {
        return Err("the file was truncated while it was written".into());
    }
    // Named as the slice names it.
    Ok(busy.map(|mut b| {
        b.path = target.path().to_path_buf();
        b.to_string()
    }))
}

struct Active {
    view: FindingView,
    seen: u64,
}

/// The findings: those active, and how many of each kind each tenant had.
#[derive(Default)]
pub struct Record {
    active: BTreeMap<Key, Active>,
    counts: BTreeMap<(Kind, String), u64>,
}

impl Record {
    /// A finding of pass `pass`, and what was done about it (None:
    /// nothing). A new one is logged and counted; an active one is logged
    /// again when its evidence or what was done changes.
    pub fn found(&mut self, pass: u64, key: Key, view: FindingView, action: Option<String>) {
        // Findings name tenants and hold paths and labels from them: escaped
        // once, here, for the log, the state file and `cuslice status`.
        let mut view = view.for_display();
        let action = action.map(|a| text::clean_to(&a, LINE_MAX));
        match self.active.get_mut(&key) {
            Some(a) => {
                a.seen = pass;
                // New evidence under the same key (a quota raised again,
                // another way, before the finding ended) is said again:
                // a description that kept the first evidence would hide it.
                let changed = view.what != a.view.what;
                if changed {
                    a.view.what = view.what;
                }
                match action {
                    Some(act) if changed || act != a.view.action => {
                        log(&format!("{}: {act}", a.view.what));
                        a.view.action = act;
                    }
                    None if changed => log(&format!("{}: {}", a.view.what, a.view.action)),
                    _ => {}
                }
                a.view.figure = view.figure;
            }
            None => {
                let act = action.unwrap_or_else(|| "reported".into());
                log(&format!("{}: {act}", view.what));
                *self
                    .counts
                    .entry((view.kind, view.tenant.clone()))
                    .or_insert(0) += 1;
                view.action = act;
                view.since_unix = watch_state::now_unix();
                self.active.insert(key, Active { view, seen: pass });
            }
        }
    }

    /// An active finding that stands in pass `pass` without being judged.
    pub fn stands(&mut self, pass: u64, key: &Key) {
        if let Some(a) = self.active.get_mut(key) {
            a.seen = pass;
        }
    }

    /// Ends (and logs) the findings pass `pass` did not find again.
    pub fn end_unseen(&mut self, pass: u64) {
        let ended: Vec<Key> = self
            .active
            .iter()
            .filter(|(_, a)| a.seen != pass)
            .map(|(k, _)| k.clone())
            .collect();
        for k in ended {
            if let Some(a) = self.active.remove(&k) {
                log(&format!("{}: ended", a.view.what));
            }
        }
    }

    pub fn views(&self) -> Vec<FindingView> {
        self.active.values().map(|a| a.view.clone()).collect()
    }

    pub fn counts(&self) -> impl Iterator<Item = (&(Kind, String), &u64)> {
        self.counts.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(case: Case) -> Verdict {
        Verdict::Found {
            key: (Kind::Compute, "container:aaa".into(), Some(0), None),
            view: FindingView {
                kind: Kind::Compute,
                tenant: "a".into(),
                slice: "container a".into(),
                gpu: Some(0),
                pid: None,
                figure: String::new(),
                limit: String::new(),
                what: "container a: something".into(),
                action: String::new(),
                since_unix: 0.0,
            },
            case,
        }
    }

    fn under(p: Policy) -> WatchConfig {
        WatchConfig {
            policy: p,
            ..WatchConfig::default()
        }
    }

    #[test]
    fn each_policy_maps_a_verdict_to_one_action() {
        let a = SliceId::Container("aaa".into());
        let unregistered = found(Case::Unregistered {
            pid: 7,
            start: 70,
            seen_before: true,
        });
        let compute = found(Case::Compute {
            slice: a.clone(),
            gpu: 0,
            pids: vec![(7, 70), (8, 80)],
            certain: true,
            forged: false,
        });
        let memory = found(Case::Memory {
            kill: vec![(8, 80)],
            certain: true,
        });
        let table = [
            (Policy::Report, &unregistered, Action::Report),
            (Policy::Report, &compute, Action::Report),
            (Policy::Report, &memory, Action::Report),
            (
                Policy::Kill,
                &unregistered,
                Action::KillProcess { pid: 7, start: 70 },
            ),
            (
                Policy::Kill,
                &compute,
                Action::KillSlice(vec![(7, 70), (8, 80)]),
            ),
            (Policy::Kill, &memory, Action::KillNewest(vec![(8, 80)])),
            // Freeze is for GPU time: stopping a process gives no memory
            // back, and an unregistered one stays unregistered.
            (Policy::Freeze, &unregistered, Action::Report),
            (
                Policy::Freeze,
                &compute,
                Action::Freeze {
                    slice: a.clone(),
                    gpu: 0,
                    pids: vec![(7, 70), (8, 80)],
                    time: Duration::from_secs(5),
                },
            ),
            (Policy::Freeze, &memory, Action::Report),
        ];
        for (p, v, want) in table {
            assert_eq!(decide(v, &under(p)), want, "{p:?} {v:?}");
        }
        // What needs no policy: nothing to do.
        let key = (Kind::Compute, "container:aaa".to_string(), Some(0), None);
        for p in [Policy::Report, Policy::Kill, Policy::Freeze] {
            assert_eq!(
                decide(&Verdict::Stands(key.clone()), &under(p)),
                Action::Report
            );
            assert_eq!(
                decide(&Verdict::Unseen("x".into()), &under(p)),
                Action::Report
            );
        }
    }

    #[test]
    fn a_finding_is_counted_once_however_long_it_lasts_and_ends_when_not_found_again() {
        let mut r = Record::default();
        let v = found(Case::Memory {
            kill: vec![],
            certain: true,
        });
        let Verdict::Found { key, view, .. } = v else {
            unreachable!()
        };
        r.found(1, key.clone(), view.clone(), None);
        assert_eq!(r.views()[0].action, "reported");
        r.found(2, key.clone(), view.clone(), Some("killed pid 8".into()));
        assert_eq!(r.views()[0].action, "killed pid 8");
        // Standing without being judged keeps it.
        r.stands(3, &key);
        r.end_unseen(3);
        assert_eq!(r.views().len(), 1);
        assert_eq!(r.counts().map(|(_, n)| *n).collect::<Vec<_>>(), [1]);
        r.end_unseen(4);
        assert!(r.views().is_empty());
        // Found again later: a new finding.
        r.found(5, key, view, None);
        assert_eq!(r.counts().map(|(_, n)| *n).collect::<Vec<_>>(), [2]);
    }

    #[test]
    fn a_quota_lowered_by_a_resize_is_held_within_its_grace_and_acted_on_after_it() {
        let within = found(Case::MemoryResized {
            kill: vec![(8, 80)],
            certain: true,
            until_ms: 86_400_000 + 3_723_000,
            over: false,
        });
        let after = found(Case::MemoryResized {
            kill: vec![(8, 80)],
            certain: true,
            until_ms: 86_400_000 + 3_723_000,
            over: true,
        });
        for p in [Policy::Report, Policy::Kill, Policy::Freeze] {
            assert_eq!(
                decide(&within, &under(p)),
                Action::Hold(
                    "not acted on: over its resized quota, within its grace until 01:02:03 UTC"
                        .into()
                )
            );
        }
        assert_eq!(
            decide(&after, &under(Policy::Kill)),
            Action::KillNewest(vec![(8, 80)])
        );
        for p in [Policy::Report, Policy::Freeze] {
            assert_eq!(
                decide(&after, &under(p)),
                Action::Hold(
                    "reported: over its resized quota after its grace (ended 01:02:03 UTC)".into()
                )
            );
        }
    }

    // ---- What the judge finds on snapshots written by hand, acted on ----

    use crate::watch::judge::fixtures::*;
    use crate::watch::judge::{History, judge};
    use cuslice_core::config::format_uuid;
    use cuslice_core::segment::{READY_STATE, RawDevice};

    #[test]
    fn an_unregistered_process_is_reported_at_once_and_acted_on_only_when_seen_in_two_passes_in_a_row()
     {
        let cfg = policy(Policy::Kill);
        let at = unregistered_at;
        let (v, h) = judge(&at(1, false), &History::default(), &cfg);
        // Found, logged, not killed: the first sighting.
        assert_eq!(decide(&v[0], &cfg), Action::Report);
        // Seen again in the next pass: killed.
        let (v, _) = judge(&at(2, false), &h, &cfg);
        assert_eq!(
            decide(&v[0], &cfg),
            Action::KillProcess { pid: 7, start: 70 }
        );
    }

    #[test]
    fn memory_over_quota_kills_the_newest_and_a_quota_given_by_index_is_never_acted_on() {
        let at = memory_at;
        let kill = policy(Policy::Kill);
        let (v, _) = judge(&at(MEM_1G), &History::default(), &kill);
        assert_eq!(decide(&v[0], &kill), Action::KillNewest(vec![(20, 200)]));
        // Stopping a process gives no memory back: reported under freeze.
        assert_eq!(decide(&v[0], &policy(Policy::Freeze)), Action::Report);
        assert_eq!(decide(&v[0], &policy(Policy::Report)), Action::Report);
        // By index: NVML's index need not be the GPU the container calls
        // so.
        let (v, _) = judge(
            &at("[device.0]\nmemory = \"1GiB\"\n"),
            &History::default(),
            &kill,
        );
        assert_eq!(
            decide(&v[0], &kill),
            Action::Hold("not acted on: the quota file gives this quota by index".into())
        );
    }

    #[test]
    fn a_compute_finding_sustained_kills_the_slices_processes_on_its_gpu() {
        let cfg = policy(Policy::Kill);
        let (_, h) = judge(&two_tenants(1, 75.0, true, 0, 0), &History::default(), &cfg);
        let (v, _) = judge(&two_tenants(2, 75.0, true, 0, 0), &h, &cfg);
        assert_eq!(decide(&v[0], &cfg), Action::KillSlice(vec![(10, 100)]));
    }

    #[test]
    fn compute_on_a_gpu_whose_segment_was_tampered_with_lately_is_reported_only() {
        let cfg = WatchConfig {
            compute_sustain: 1,
            ..policy(Policy::Kill)
        };
        let at = |ago: u64| {
            let mut h = History::default();
            h.segments.tampered.insert(0, NOW - ago);
            let (v, _) = judge(&two_tenants(1, 75.0, true, 0, 0), &h, &cfg);
            assert_eq!(v.len(), 1, "{v:?}");
            decide(&v[0], &cfg)
        };
        assert_eq!(
            at(9 * SECOND),
            Action::Hold(
                "not acted on: GPU 0's segment was tampered with within 10s (the split may be forged)"
                    .into()
            )
        );
        assert_eq!(at(11 * SECOND), Action::KillSlice(vec![(10, 100)]));
        // Another GPU's tamper says nothing about this one.
        let mut h = History::default();
        h.segments.tampered.insert(1, NOW);
        let (v, _) = judge(&two_tenants(1, 75.0, true, 0, 0), &h, &cfg);
        assert!(matches!(
            cases(&v)[..],
            [Case::Compute { forged: false, .. }]
        ));
    }

    #[test]
    fn a_share_given_by_index_is_reported_only_in_every_policy() {
        let cfg = WatchConfig {
            compute_sustain: 1,
            ..policy(Policy::Report)
        };
        let mut s = two_tenants(1, 75.0, true, 0, 0);
        s.slices.get_mut(&a()).expect("a").quota =
            Some(quota("[device.0]\ncompute = 20\ncompute_max = 40\n"));
        let (v, _) = judge(&s, &History::default(), &cfg);
        assert!(matches!(
            cases(&v)[..],
            [Case::Compute { certain: false, .. }]
        ));
        for p in [Policy::Report, Policy::Kill, Policy::Freeze] {
            assert_eq!(
                decide(&v[0], &policy(p)),
                Action::Hold(
                    "not acted on: the quota file gives this share or ceiling by index".into()
                )
            );
        }
    }

    #[test]
    fn a_compute_finding_not_acted_on_stands_and_one_acted_on_must_last_again() {
        // Judge, decide and leave to the next pass, as the watch does; the
        // passes in which the slice's compute finding is found.
        let found_in = |q: &str, p: Policy| {
            let cfg = policy(p);
            let mut h = History::default();
            let mut found = vec![];
            for pass in 1..=5 {
                let mut s = two_tenants(pass, 75.0, true, 0, 0);
                s.slices.get_mut(&a()).expect("a").quota = Some(quota(q));
                let (v, mut next) = judge(&s, &h, &cfg);
                for v in &v {
                    if let Verdict::Found { case, .. } = v {
                        acted_on(&mut next, case, &decide(v, &cfg));
                        found.push(pass);
                    }
                }
                h = next;
            }
            found
        };
        let by_uuid = format!(
            "[device.\"{}\"]\ncompute = 20\ncompute_max = 40\n",
            format_uuid(&GPU0)
        );
        let by_index = "[device.0]\ncompute = 20\ncompute_max = 40\n";
        // Reported, or not acted on: found in every pass once sustained.
        assert_eq!(found_in(&by_uuid, Policy::Report), [2, 3, 4, 5]);
        assert_eq!(found_in(by_index, Policy::Kill), [2, 3, 4, 5]);
        // Killed: it must last two passes again (here the fake slice
        // lives on).
        assert_eq!(found_in(&by_uuid, Policy::Kill), [2, 4]);
    }

    #[test]
    fn a_memory_segment_entry_is_restored_unless_repair_is_off_or_its_quota_is_given_by_index() {
        let cfg = policy(Policy::Report);
        let at = |q: &str, e: RawDevice| judge(&memory_entry_at(q, e), &History::default(), &cfg).0;
        let v = at(MEM_1G, entry(0, GPU0, READY_STATE, 2 * G));
        assert_eq!(
            decide(&v[0], &cfg),
            Action::RestoreQuota {
                slice: a(),
                entry: 0,
                uuid: Some(GPU0),
                limit: G
            }
        );
        let no_repair = WatchConfig {
            repair: false,
            ..cfg.clone()
        };
        assert_eq!(decide(&v[0], &no_repair), Action::Report);
        // A quota given by index: reported, never restored.
        let v = at(
            "[device.0]\nmemory = \"1GiB\"\n",
            entry(0, GPU0, READY_STATE, 2 * G),
        );
        assert_eq!(
            decide(&v[0], &cfg),
            Action::Hold("not restored (the quota file gives it by index)".into())
        );
    }

    #[test]
    fn a_tampered_gpu_segment_is_repaired_at_once_unless_repair_is_off() {
        let cfg = policy(Policy::Report);
        let (v, _) = judge(
            &gpu_segments_read(forged_share()),
            &History::default(),
            &cfg,
        );
        assert_eq!(
            decide(&v[0], &cfg),
            Action::RepairGpuSegment {
                path: PathBuf::from(GPU_SEGMENT),
                expected: vec![],
                at_ns: NOW
            }
        );
        let no_repair = WatchConfig {
            repair: false,
            ..cfg
        };
        assert_eq!(decide(&v[0], &no_repair), Action::Report);
    }
}
