//! Which slice a host PID belongs to.
//!
//! - **A container** made through the OCI hook: `<root>/containers/<id>/`
//!   holds its quota file, its memory segment and `container.json`, where
//!   the hook recorded the inode of the container's PID namespace, its
//!   cgroup and its init (host PID and start time). A process belongs to it
//!   if its PID namespace, or any parent of it (a process may nest
//!   namespaces), is the container's; failing that (a container sharing
//!   the host's PID namespace, or one recorded by an older hook) if its
//!   cgroup is the container's or below it. Neither can be changed from
//!   inside a container without privileges it lacks. A record whose init
//!   is gone matches nothing (namespace inodes are reused: a stale record
//!   would claim whatever namespace got its inode next) until its
//!   `container.json` is written again.
//! - **A Kubernetes DRA claim** (`SliceId::Claim(uid)`): every container
//!   whose `container.json` names the claim (`claim`, recorded by
//!   `oci-hook create --claim <uid>`) is a member of one slice, the
//!   claim's, and the container's record then only maps processes to it
//!   (as above; processes that several containers of the one claim claim
//!   alike are the claim's, not ambiguous). The claim's containers share
//!   one memory segment and one quota, so they are judged together: usage
//!   summed over all their processes, against the claim's quota file
//!   `<root>/claims/<uid>/quota.toml` (not the copy in each container's
//!   directory), its memory segment `<root>/claims/<uid>/segment/memory.seg`
//!   audited and repaired. The quota file is read as the OCI hook reads it,
//!   through `host::fs` from `<root>`: no link followed on the way from
//!   `<root>/claims`, a regular file of the watch's own user (root), at most
//!   [`config::MAX_FILE_BYTES`], with some limit in it; it is read again
//!   when it or the claim's record changes. A claim whose directory or
//!   quota file is missing or bad is one note naming the path and what is
//!   wrong and its containers are not checked (never judged against their
//!   own copies, nor as unlimited without a word). Shown as `DRA claim
//!   <namespace>/<name> (<uid, 12 characters>)` from the DRA plugin's
//!   record `<root>/claims/<uid>/claim.json` (read the same way), else
//!   `DRA claim <uid, 12 characters>`; its finding keys name `claim:<uid>`.
//! - **A `cuslice run` session**: every descendant of a `cuslice run`
//!   process (an executable named `cuslice` with `run` as its first
//!   argument), found through the parent chain (`cuslice run` is a child
//!   subreaper, so orphans stay its descendants), in host PIDs whatever PID
//!   namespaces its processes enter. Where its files are follows the rule
//!   `cuslice run` follows (the host file layer's `layout` and `run_dir`),
//!   from the run process's PID (as it sees itself) and initial
//!   environment: in `$XDG_RUNTIME_DIR` (else `$TMPDIR`, else /tmp) the
//!   directory `cuslice-run-<pid>-<random>` that the run process holds
//!   open (found among its descriptors: the name is unpredictable), its GPU
//!   segment directory `$CUSLICE_GPU_SEGMENT_DIR` (else the default). Its
//!   quota file there is read when the session is first seen, and again
//!   whenever it is written again (`cuslice resize` of the session, by its
//!   user or root; the user owns the file and chooses the session's
//!   limits, as with `cuslice run`'s flags), from the directory
//!   opened in its base without following a link (the run process's
//!   user's), opened without following a link or blocking,
//!   and only as a regular file of the run process's user of at most
//!   1 MiB. Only its limits are taken from it: a file whose `tenant`,
//!   `segment_dir` or `gpu_segment_dir` is not what `cuslice run` wrote is
//!   reported, and the session's segments are then never written by the
//!   watch (`repair`).
//!
//! A slice's quota file is read again when it changes (a container's or a
//! session's as a claim's always was), so that a resize (`cuslice
//! resize`) is what the watch holds the slice to and restores its
//! segment from; the record of the last resize (`resize.json` in the
//! slice's directory, read by the same rule) is read with it. A
//! container's quota file is in its quota directory (`etc/`, mounted at
//! `/etc/cuslice` in it), or, for a container an older hook made, beside
//! its record: `host::layout::open_quota_dir`, through the discovery.
//!
//! The answer for a PID is cached under (PID, start time), so a pass reads
//! `/proc/<pid>/stat` once per process NVML lists, and the rest only for a
//! process not seen before.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cuslice_core::config::{self, Config};

use super::procfs::ProcSource;
use crate::host::container::{describe, short_id};
use crate::host::discover::{self, FileId, Found, PinnedSegment, Places, SESSION};
use crate::host::fs::{self, Kind};
use crate::host::layout::{self, Layout, SliceDir};
use crate::host::resize::ResizeRecord;
use crate::host::text;

/// Whose a host process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    Slice(SliceId),
    /// Outside any slice.
    Nobody,
    /// Claimed alike by several containers (a PID namespace or cgroup they
    /// share, and nothing that tells which): no one's, never judged or
    /// acted on. The containers that claim it.
    Ambiguous(Vec<SliceId>),
}

impl Owner {
    /// The slice, where exactly one owns the process.
    pub fn slice(&self) -> Option<&SliceId> {
        match self {
            Owner::Slice(id) => Some(id),
            Owner::Nobody | Owner::Ambiguous(_) => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SliceId {
    /// The container's id (a container not of a DRA claim).
    Container(String),
    /// The UID of a Kubernetes ResourceClaim: every container whose record
    /// names it.
    Claim(String),
    /// The `cuslice run` process: its PID and start time.
    Run { pid: u32, start: u64 },
}

#[derive(Debug, Clone)]
pub struct Slice {
    pub id: SliceId,
    /// The tenant its processes register as.
    pub tenant: String,
    /// Its quota file's slice tag (`Config::slice_tag`; 0 without a quota
    /// file or a `slice` in it): with `tenant`, what its entries in the GPU
    /// segments are found by. Two slices of one tenant name (quota files
    /// written by hand, or by an older hook) have an entry each.
    pub tag: u64,
    /// For messages: `container web-1 (0123456789ab)`, `DRA claim
    /// team-a/trainer (0b1c2d3e-000)`, `cuslice run 4242 (python3
    /// train.py)`.
    pub label: String,
    /// Its quota file, parsed (None: unreadable; see the note).
    pub quota: Option<Config>,
    /// The record of its last resize (`resize.json` in its directory),
    /// read with its quota file; the judge gives it weight only while it holds
    /// for the file (`ResizeRecord::applies_to`).
    pub resize: Option<ResizeRecord>,
    /// A session's quota file as it was read: where (its base as reached
    /// from here, its name, its path as shown) and its identity; a file
    /// written again since is read again (`Slices::refresh`).
    pub run_quota: Option<RunQuota>,
    /// Its memory segment, as a path here (None: no memory quota).
    pub mem_seg: Option<PathBuf>,
    /// Its GPU segment directory, as a path here.
    pub gpu_dir: PathBuf,
    pub pid_ns: Option<u64>,
    pub cgroup: Option<String>,
    /// A container's init (host PID, start time), as its hook recorded it
    /// (None: an older hook's record).
    pub init: Option<(u32, u64)>,
    /// Whether the watch may write this slice's memory segment (restore its
    /// quota): false for a session whose quota file is not what `cuslice
    /// run` wrote. See [`Slice::open_mem_seg_for_repair`].
    pub repair: bool,
    /// The user the memory segment and the directories above it up to the
    /// session's directory must belong to before the watch writes it: the
    /// `cuslice run` process's uid (None: a container's, under the
    /// root-only `<root>/containers`, or a claim's, under the root-only
    /// `<root>/claims`).
    pub mem_seg_owner: Option<u32>,
    /// A container record naming a DRA claim: the claim's UID. Such a
    /// record only maps processes to the claim's slice
    /// ([`SliceId::Claim`]); its own quota, tenant and memory segment are
    /// unset (the claim's are judged).
    pub claim: Option<String>,
}

impl Slice {
    /// The slice the processes this record matches belong to: the claim's
    /// for a container of a DRA claim, else its own.
    fn owner(&self) -> SliceId {
        match &self.claim {
            Some(uid) => SliceId::Claim(uid.clone()),
            None => self.id.clone(),
        }
    }
}

/// Where a session's quota file was read, and what it was.
#[derive(Debug, Clone)]
pub struct RunQuota {
    base: PathBuf,
    name: OsString,
    shown: PathBuf,
    uid: u32,
    id: Option<FileId>,
}

impl RunQuota {
    /// The identity of the quota file now (None: not reached).
    fn now(&self) -> Option<FileId> {
        discover::run(&self.base, &self.name, &self.shown, Some(self.uid))
            .ok()?
            .quota_id()
    }
}

/// A slice's resize record (`Found::resize`): a bad one is a note, and
/// none.
fn resize_of(f: &Found, label: &str, notes: &mut Vec<String>) -> Option<ResizeRecord> {
    match f.resize() {
        Ok(r) => r,
        Err(e) => {
            notes.push(format!(
                "{label}: {e}: the grace of its last resize is not given"
            ));
            None
        }
    }
}

/// The one slice that every record of `records` belongs to (containers of
/// one DRA claim are one slice); None for none or several.
fn one_slice(records: &[&Slice]) -> Option<SliceId> {
    let first = records.first()?.owner();
    records[1..]
        .iter()
        .all(|c| c.owner() == first)
        .then_some(first)
}

/// The slices `records` belong to, each once, in order.
fn owner_ids(records: &[&Slice]) -> Vec<SliceId> {
    let set: std::collections::BTreeSet<SliceId> = records.iter().map(|c| c.owner()).collect();
    set.into_iter().collect()
}

/// The identities of a claim's directory entry (`<root>/claims/<uid>`
/// itself: a link planted there is a change too), its `quota.toml` and its
/// `claim.json` (None: missing, or not reached without following a link):
/// a claim is read again when any changes.
type ClaimFiles = (Option<FileId>, Option<FileId>, Option<FileId>);

pub struct Slices {
    layout: Layout,
    /// The containers and claims under the root, found and read as
    /// `cuslice status` finds them (`host::discover`).
    places: Places,
    /// The watch's own PID namespace: a container recorded with it shares
    /// the host's, and is found by cgroup.
    host_ns: Option<u64>,
    /// Every container record loaded: a slice of its own, or (`claim`) a
    /// member of a claim's.
    pub containers: BTreeMap<String, Slice>,
    /// The DRA claims the loaded container records name, by UID.
    pub claims: BTreeMap<String, Slice>,
    pub runs: BTreeMap<(u32, u64), Slice>,
    /// The `container.json` and `quota.toml` each container (loaded or
    /// stale) was read from.
    meta_ids: HashMap<String, (FileId, Option<FileId>)>,
    /// The claim's quota file and record each claim was read from.
    claim_ids: HashMap<String, ClaimFiles>,
    /// Containers whose recorded init is gone: not loaded again until their
    /// `container.json` changes.
    stale: HashSet<String>,
    /// `cuslice run` processes seen while a host-wide quota file applied:
    /// no slices of their own (noted once).
    shared_runs: HashSet<(u32, u64)>,
    /// PID -> (start time, whose it is).
    cache: HashMap<u32, (u64, Owner)>,
    /// PID -> (start time, whether it is a `cuslice run` process).
    run_check: HashMap<u32, (u64, bool)>,
    /// Lines to log, once each (drained by the daemon).
    pub notes: Vec<String>,
}

/// `cuslice run [flags] -- prog args`: `prog args`, escaped and cut to 60
/// characters (the user's command goes into one-line log messages).
fn run_command(args: &[String]) -> String {
    let after = args
        .iter()
        .position(|a| a == "--")
        .map_or(args.get(2..).unwrap_or(&[]), |i| &args[i + 1..]);
    let mut v: Vec<String> = after.to_vec();
    if let Some(first) = v.first_mut()
        && let Some(n) = Path::new(first.as_str()).file_name()
    {
        *first = n.to_string_lossy().into_owned();
    }
    text::clean_to(&v.join(" "), 60)
}

/// The memory segment of a slice, as the watch may write it: see
/// [`Slice::open_mem_seg_for_repair`].
#[derive(Debug)]
pub struct RepairTarget {
    /// The segment's directory, pinned (None: a container's, by path).
    _dir: Option<PinnedSegment>,
    path: PathBuf,
}

impl RepairTarget {
    /// The path to open the segment by, valid while this lives:
    /// `/proc/self/fd/<its directory>/memory.seg` for a session (its
    /// last component a plain name, opened without following a link).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Slice {
    /// This slice's memory segment for the watch to write (restore its
    /// quota), or why not: the slice may not be repaired (a session whose
    /// quota file is not what `cuslice run` wrote), or (a session) the
    /// segment, its directory or the session's directory is a link or not
    /// the run process's user's. Each step is opened from the one above
    /// without following links and checked on the open descriptor, and the
    /// segment's directory stays open: what is written is a file in a
    /// directory of the session's user, never one reached through a link
    /// they planted.
    pub fn open_mem_seg_for_repair(&self) -> Result<RepairTarget, String> {
        if !self.repair {
            return Err("its quota file is not what `cuslice run` wrote".into());
        }
        let path = self.mem_seg.as_deref().ok_or("no memory segment")?;
        let Some(uid) = self.mem_seg_owner else {
            return Ok(RepairTarget {
                _dir: None,
                path: path.to_path_buf(),
            });
        };
        let Some(run_dir) = path.parent().and_then(Path::parent) else {
            return Err("no memory segment".into());
        };
        let (Some(base), Some(run_name)) = (run_dir.parent(), run_dir.file_name()) else {
            return Err("no memory segment".into());
        };
        let owner = Some((uid, SESSION));
        // The session's directory: in its base, wherever the base leads
        // (the user's XDG_RUNTIME_DIR may be a link), not itself a link,
        // the user's own; its segment directory likewise, held open.
        let s = discover::run(base, run_name, run_dir, Some(uid))?.segment(owner)?;
        fs::open_checked(None, s.path(), Kind::File, owner)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(RepairTarget {
            path: s.path().to_path_buf(),
            _dir: Some(s),
        })
    }
}

/// The run directory of the run process `pid` (`inner`: its PID as it
/// sees itself) in `base` (as it sees it), as a path it sees: the one it
/// holds open (`cuslice run` keeps it open for its whole life) whose name
/// is `inner`'s run directory's and whose parent is `base`, by path or, a
/// base reached through a link, by device and inode. Named `base` + its
/// name, as `run` named it in the quota file.
fn find_run_dir(p: &dyn ProcSource, pid: u32, inner: u32, base: &Path) -> Option<PathBuf> {
    // A stat of the base as the run process sees it, its links followed
    // on purpose (the base may be reached through one): no open.
    let id = |d: &Path| {
        std::fs::metadata(p.in_root(pid, d))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let mut base_id = None;
    p.fd_paths(pid).into_iter().find_map(|d| {
        let name = d.file_name()?;
        if !layout::is_run_dir_of(name, inner) {
            return None;
        }
        let parent = d.parent()?;
        let same = parent == base || {
            let b = *base_id.get_or_insert_with(|| id(base));
            b.is_some() && id(parent) == b
        };
        same.then(|| base.join(name))
    })
}

/// Of `slices`, those whose recorded cgroup holds `cg` (the same or an
/// ancestor of it), the most specific only (the longest path): a process
/// in `/pod/b` is `b`'s even if another container recorded `/pod`.
fn most_specific<'a>(cg: Option<&str>, slices: Vec<&'a Slice>) -> Vec<&'a Slice> {
    let Some(cg) = cg else { return vec![] };
    let within: Vec<(&'a Slice, usize)> = slices
        .into_iter()
        .filter_map(|c| {
            let mine = c.cgroup.as_deref()?.trim_end_matches('/');
            (!mine.is_empty()
                && (cg == mine || cg.strip_prefix(mine).is_some_and(|r| r.starts_with('/'))))
            .then_some((c, mine.len()))
        })
        .collect();
    let best = within.iter().map(|(_, n)| *n).max().unwrap_or(0);
    within
        .into_iter()
        .filter(|(_, n)| *n == best)
        .map(|(c, _)| c)
        .collect()
}

/// Whether the container record's init (PID, start time) still runs; a
/// record without one (an older hook's) is taken as live (the rule is
/// `host::container`'s, which the OCI hook follows too).
fn init_alive(p: &dyn ProcSource, init: Option<(u32, u64)>) -> bool {
    crate::host::container::init_alive(init, |pid| p.stat(pid))
}

/// Whether `/etc/cuslice/quota.toml` exists as the run process `pid` sees
/// it (the shim then follows it).
fn host_wide_quota(p: &dyn ProcSource, pid: u32) -> bool {
    let path = p.in_root(pid, Path::new(config::DEFAULT_CONFIG_PATH));
    !matches!(std::fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

impl Slices {
    pub fn new(root: &Path, host_ns: Option<u64>) -> Slices {
        Slices {
            layout: Layout::new(root),
            places: Places::new(Layout::new(root)),
            host_ns,
            containers: BTreeMap::new(),
            claims: BTreeMap::new(),
            runs: BTreeMap::new(),
            meta_ids: HashMap::new(),
            claim_ids: HashMap::new(),
            stale: HashSet::new(),
            shared_runs: HashSet::new(),
            cache: HashMap::new(),
            run_check: HashMap::new(),
            notes: vec![],
        }
    }

    pub fn get(&self, id: &SliceId) -> Option<&Slice> {
        match id {
            SliceId::Container(c) => self.containers.get(c),
            SliceId::Claim(uid) => self.claims.get(uid),
            SliceId::Run { pid, start } => self.runs.get(&(*pid, *start)),
        }
    }

    /// Every slice: the containers not of a claim, the claims, the
    /// sessions.
    pub fn all(&self) -> impl Iterator<Item = &Slice> {
        self.containers
            .values()
            .filter(|c| c.claim.is_none())
            .chain(self.claims.values())
            .chain(self.runs.values())
    }

    /// Finds containers that came, went, were written again (their record
    /// or their quota file: a resize) or whose init ended, claims whose
    /// files changed, sessions that ended and sessions whose quota file was
    /// written again. One directory listing, and per container two `stat`s
    /// (its `container.json` and `quota.toml`) and one read of its init's
    /// `/proc/<pid>/stat`; two `stat`s per claim; per live session one
    /// `stat` of its run process, and its directory opened from its base
    /// for one `stat` of its quota file.
    pub fn refresh(&mut self, p: &dyn ProcSource) {
        // `<root>/containers`, from the root without following a link
        // below it; each container's directory likewise (the discovery
        // `cuslice status` shares, sorted by id).
        let found = self.places.containers();
        let ids: Vec<String> = found.iter().map(|f| f.name.clone()).collect();
        let before = self.containers.len();
        self.containers
            .retain(|id, _| ids.binary_search(id).is_ok());
        self.meta_ids.retain(|id, _| ids.binary_search(id).is_ok());
        self.stale.retain(|id| ids.binary_search(id).is_ok());
        let mut changed = before != self.containers.len();
        for ctr in found {
            let id = ctr.name.clone();
            let meta = self.layout.container(&id).record().unwrap_or_default();
            let now = ctr.record_id().map(|r| (r, ctr.quota_id()));
            if self.meta_ids.get(&id) != now.as_ref() {
                // New, or written again (a container restarted under the
                // same id, its quota file resized): read afresh.
                changed |= self.containers.remove(&id).is_some();
                self.stale.remove(&id);
                self.meta_ids.remove(&id);
            } else if self.stale.contains(&id) {
                continue;
            }
            if let Some(c) = self.containers.get(&id) {
                if init_alive(p, c.init) {
                    continue;
                }
                let c = self.containers.remove(&id).map(|c| c.label);
                self.stale_note(c.as_deref().unwrap_or(&id), &meta);
                self.stale.insert(id);
                changed = true;
                continue;
            }
            let (Some(now), Ok(_)) = (now, &ctr.dir) else {
                continue;
            };
            if let Some(s) = self.load_container(&ctr) {
                self.meta_ids.insert(id.clone(), now);
                if init_alive(p, s.init) {
                    self.containers.insert(id, s);
                    changed = true;
                } else {
                    self.stale_note(&s.label, &meta);
                    self.stale.insert(id);
                }
            }
        }
        changed |= self.refresh_claims();
        let before = self.runs.len();
        let alive = |(pid, start): &(u32, u64)| p.stat(*pid).is_some_and(|s| s.start == *start);
        self.runs.retain(|k, _| alive(k));
        self.shared_runs.retain(alive);
        changed |= before != self.runs.len();
        // A session whose quota file was written again (a resize): read
        // afresh, by the same rule as when it was first seen.
        let rewritten: Vec<(u32, u64)> = self
            .runs
            .iter()
            .filter(|(_, s)| s.run_quota.as_ref().is_some_and(|q| q.now() != q.id))
            .map(|(k, _)| *k)
            .collect();
        for (pid, start) in rewritten {
            let s = self.load_run(p, pid, start);
            self.runs.insert((pid, start), s);
        }
        if changed {
            // A new container may own processes seen outside any slice;
            // a gone one owns none. A claim's processes are classified
            // again (rare: containers come and go): which of its
            // containers each was in is not kept, and one may be gone.
            let containers = &self.containers;
            let runs = &self.runs;
            self.cache.retain(|_, (_, o)| match o {
                Owner::Nobody | Owner::Ambiguous(_) | Owner::Slice(SliceId::Claim(_)) => false,
                Owner::Slice(SliceId::Container(c)) => {
                    containers.get(c).is_some_and(|c| c.claim.is_none())
                }
                Owner::Slice(SliceId::Run { pid, start }) => runs.contains_key(&(*pid, *start)),
            });
        }
    }

    /// The claims the loaded container records name: those no record
    /// names any more are forgotten, a new one or one whose quota file or
    /// record changed is read. Whether anything changed.
    fn refresh_claims(&mut self) -> bool {
        let mut named: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for c in self.containers.values() {
            if let Some(uid) = &c.claim {
                named.entry(uid.clone()).or_default().push(c.label.clone());
            }
        }
        let before = self.claims.len();
        self.claims.retain(|uid, _| named.contains_key(uid));
        self.claim_ids.retain(|uid, _| named.contains_key(uid));
        let mut changed = before != self.claims.len();
        let claims = self.places.open_claims();
        for (uid, members) in named {
            // Taken before the files are read: a change meanwhile is read
            // at the next pass.
            let f = match &claims {
                Ok(c) => self.places.claim_in(c, &uid),
                // Err in the claim's `dir`: why not.
                Err(_) => self.places.claim(&uid),
            };
            let now = (f.entry, f.quota_id(), f.record_id());
            if self.claims.contains_key(&uid) && self.claim_ids.get(&uid) == Some(&now) {
                continue;
            }
            let s = self.load_claim(&f, &members);
            self.claim_ids.insert(uid.clone(), now);
            self.claims.insert(uid, s);
            changed = true;
        }
        changed
    }

    /// Claim `uid`'s slice, `members` the labels of the containers whose
    /// records name it (for the note on a claim that cannot be checked).
    fn load_claim(&mut self, f: &Found, members: &[String]) -> Slice {
        let uid = f.name.as_str();
        let shown = text::clean(&short_id(uid));
        // The plugin's record, for the label: best effort (a claim is
        // judged whatever its record says).
        let record = f.claim_record().and_then(|r| r.namespaced_name());
        let label = match record {
            Some(n) => format!("DRA claim {} ({shown})", text::clean(&n)),
            None => format!("DRA claim {shown}"),
        };
        // Root's (the watch's own), not followed, bounded: as `status`
        // reads it (`host::discover`).
        let quota = f.quota().and_then(|cfg| {
            if !cfg.has_limits() {
                // What the hook refuses to give a container.
                return Err(format!("{}: no limit in it", f.paths.quota().display()));
            }
            Ok(cfg)
        });
        let quota = match quota {
            Ok(c) => Some(c),
            Err(e) => {
                self.notes.push(format!(
                    "{label} (named by {}): {e}: its containers are not checked",
                    members.join(", ")
                ));
                None
            }
        };
        let claim = self.layout.claim(uid);
        let resize = quota
            .as_ref()
            .and_then(|_| resize_of(f, &label, &mut self.notes));
        Slice {
            id: SliceId::Claim(uid.to_string()),
            resize,
            run_quota: None,
            tenant: quota
                .as_ref()
                .map_or_else(|| format!("claim-{uid}"), Config::tenant_name),
            tag: quota.as_ref().map_or(0, Config::slice_tag),
            label,
            mem_seg: quota
                .as_ref()
                .filter(|c| c.has_memory())
                .map(|_| claim.memory_segment()),
            quota,
            gpu_dir: self.layout.gpu_dir(),
            pid_ns: None,
            cgroup: None,
            init: None,
            repair: true,
            mem_seg_owner: None,
            claim: None,
        }
    }

    fn stale_note(&mut self, label: &str, meta: &Path) {
        self.notes.push(format!(
            "{label}: the init process {} records is gone (a container stopped but not deleted, or a record left behind): its record matches no process until it is written again",
            meta.display()
        ));
    }

    /// The container `ctr` found (`<root>/containers/<id>`, opened
    /// without following a link): its record and (a container not of a
    /// claim) its quota file are read as `host::discover` reads a
    /// container's (no link followed, never blocking, bounded; both
    /// root's).
    fn load_container(&mut self, ctr: &Found) -> Option<Slice> {
        let id = ctr.name.as_str();
        let paths = self.layout.container(id);
        let record = paths.record().unwrap_or_default();
        // The hook writes the quota file, then container.json: until both
        // are there, try again at the next pass.
        let meta = ctr.record().ok()?;
        // A container of a DRA claim is judged with the claim's other
        // containers, against the claim's quota file (`refresh_claims`):
        // its own copy is not read.
        let claim = meta.as_ref().and_then(|m| m.claim.clone());
        let quota = match claim {
            Some(_) => None,
            None => match ctr.quota() {
                Ok(c) => Some(c),
                Err(e) => {
                    self.notes
                        .push(format!("container {}: {e}: not checked", short_id(id)));
                    None
                }
            },
        };
        // The name, pod and image are annotations, the command the spec's:
        // the tenant's, escaped by `describe`.
        let label = match &meta {
            Some(m) if m.name.is_some() || m.pod.is_some() || m.image.is_some() => {
                format!("container {} ({})", describe(m), short_id(id))
            }
            _ => format!("container {}", short_id(id)),
        };
        let (pid_ns, cgroup) = meta
            .as_ref()
            .map_or((None, None), |m| (m.pid_ns, m.cgroup.clone()));
        let init = meta
            .as_ref()
            .and_then(|m| Some((m.init_pid?, m.init_start?)));
        let resize = quota
            .as_ref()
            .and_then(|_| resize_of(ctr, &label, &mut self.notes));
        let older = "(made by an older cuslice oci-hook)";
        let no_init = if init.is_none() {
            "; nor its init process: a record left behind is not told from a live one"
        } else {
            ""
        };
        if pid_ns.is_none() && cgroup.is_none() {
            self.notes.push(format!(
                "{label}: {} records no PID namespace or cgroup {older}: its processes cannot be told apart, it is not checked",
                record.display()
            ));
        } else if pid_ns.is_none() {
            self.notes.push(format!(
                "{label}: {} records no PID namespace {older}: its processes are found by cgroup{no_init}",
                record.display()
            ));
        } else if init.is_none() {
            self.notes.push(format!(
                "{label}: {} records no init process {older}: a record left behind is not told from a live one",
                record.display()
            ));
        }
        Some(Slice {
            id: SliceId::Container(id.to_string()),
            resize,
            run_quota: None,
            tenant: match (&quota, &claim) {
                (Some(c), _) => c.tenant_name(),
                // A claim's container registers as the claim's tenant.
                (None, Some(_)) => String::new(),
                (None, None) => format!("ctr-{}", short_id(id)),
            },
            tag: quota.as_ref().map_or(0, Config::slice_tag),
            label,
            mem_seg: quota
                .as_ref()
                .filter(|c| c.has_memory())
                .map(|_| paths.memory_segment()),
            quota,
            gpu_dir: self.layout.gpu_dir(),
            pid_ns,
            cgroup,
            init,
            repair: true,
            mem_seg_owner: None,
            claim,
        })
    }

    /// A session, its files found by the rule `cuslice run` follows (the
    /// host file layer's `layout`); only the limits are taken from its
    /// quota file.
    fn load_run(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> Slice {
        let inner = p.inner_pid(pid).unwrap_or(pid);
        // As `cuslice run`: empty counts as unset.
        let env = |k: &str| p.environ(pid, k).filter(|v| !v.is_empty());
        let base = layout::run_base(|k| env(k).map(OsString::from));
        let gpu = env("CUSLICE_GPU_SEGMENT_DIR").map_or_else(
            || PathBuf::from(config::DEFAULT_GPU_SEGMENT_DIR),
            PathBuf::from,
        );
        let tenant = format!("run-{inner}");
        let label = format!("cuslice run {pid} ({})", run_command(&p.cmdline(pid)));
        let uid = p.uid(pid);
        let mut slice = Slice {
            id: SliceId::Run { pid, start },
            resize: None,
            run_quota: None,
            tenant: tenant.clone(),
            tag: 0,
            label: label.clone(),
            quota: None,
            mem_seg: None,
            gpu_dir: p.in_root(pid, &gpu),
            pid_ns: None,
            cgroup: None,
            init: None,
            repair: false,
            mem_seg_owner: uid,
            claim: None,
        };
        let Some(uid) = uid else {
            self.notes
                .push(format!("{label}: cannot read its user: not checked"));
            return slice;
        };
        if !base.is_absolute() || !gpu.is_absolute() {
            // `cuslice run` itself refuses such a quota file.
            self.notes.push(format!(
                "{label}: its runtime or GPU segment directory ({}, {}) is not an absolute path: not checked",
                base.display(),
                gpu.display()
            ));
            return slice;
        }
        let Some(run_dir) = find_run_dir(p, pid, inner, &base) else {
            self.notes.push(format!(
                "{label}: no run directory {}* among the run process's open files: not checked",
                base.join(layout::run_name_prefix(inner)).display()
            ));
            return slice;
        };
        let paths = SliceDir::run(&run_dir);
        let seg_dir = paths.segment_dir();
        let shown = paths.quota();
        // The run directory as the watch reaches it: its base through the
        // run process's root (links on the way followed: the user's), the
        // directory itself not a link and the user's, its quota file read
        // from its descriptor.
        let name = run_dir.file_name().unwrap_or_default();
        let found = discover::run(&p.in_root(pid, &base), name, &run_dir, Some(uid));
        slice.run_quota = Some(RunQuota {
            base: p.in_root(pid, &base),
            name: name.to_os_string(),
            shown: run_dir.clone(),
            uid,
            id: found.as_ref().ok().and_then(Found::quota_id),
        });
        let cfg = match found.as_ref().map_err(Clone::clone).and_then(Found::quota) {
            Ok(c) => c,
            Err(e) => {
                // `run` without limits writes no quota file (it becomes the
                // program): nothing to hold it to.
                self.notes.push(format!("{label}: {e}: not checked"));
                return slice;
            }
        };
        // Only a slice with the same tenant *and* slice tag is the same
        // entry of the GPU segment (a session's own slice is unique, so
        // this takes a file written by hand or by an older `cuslice run`).
        let tag = cfg.slice_tag();
        if let Some(c) = self
            .containers
            .values()
            .filter(|c| c.claim.is_none())
            .chain(self.claims.values())
            .find(|c| c.tenant == tenant && c.tag == tag)
        {
            self.notes.push(format!(
                "{label}: its tenant {tenant} is also {}'s: not checked",
                c.label
            ));
            return slice;
        }
        let mut wrong = vec![];
        if cfg.tenant.as_deref() != Some(tenant.as_str()) {
            wrong.push(format!(
                "tenant {:?} (`cuslice run` wrote {tenant:?})",
                cfg.tenant_name()
            ));
        }
        // `run-<its run directory's name>`; none from an older `cuslice
        // run`.
        let want_slice = run_dir
            .file_name()
            .map(|n| format!("run-{}", n.to_string_lossy()));
        if let Some(have) = &cfg.slice
            && Some(have) != want_slice.as_ref()
        {
            wrong.push(format!(
                "slice {have:?} (`cuslice run` wrote {:?})",
                want_slice.unwrap_or_default()
            ));
        }
        for (key, have, want) in [
            ("segment_dir", &cfg.segment_dir, &seg_dir),
            ("gpu_segment_dir", &cfg.gpu_segment_dir, &gpu),
        ] {
            if have != want {
                wrong.push(format!(
                    "{key} {:?} (`cuslice run` wrote {:?})",
                    have.display().to_string(),
                    want.display().to_string()
                ));
            }
        }
        if !wrong.is_empty() {
            // Held to the limits there (the user could have asked `run` for
            // any), as tenant run-<pid> at the places `run` gave it: a
            // process registered elsewhere is unregistered here. Its
            // segments are never written by the watch.
            self.notes.push(format!(
                "{label}: {}: {} not what `cuslice run` wrote: its segments are not repaired; it is checked against the file's limits as tenant {tenant} with its memory segment in {}",
                shown.display(),
                wrong.join(", "),
                seg_dir.display()
            ));
        }
        slice.repair = wrong.is_empty();
        slice.tag = tag;
        if let Ok(f) = &found {
            slice.resize = resize_of(f, &label, &mut self.notes);
        }
        slice.mem_seg = cfg
            .has_memory()
            .then(|| p.in_root(pid, &paths.memory_segment()));
        slice.quota = Some(cfg);
        slice
    }

    fn is_run(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> bool {
        if let Some((s, yes)) = self.run_check.get(&pid)
            && *s == start
        {
            return *yes;
        }
        let yes = p.exe_name(pid).as_deref() == Some("cuslice")
            && p.cmdline(pid).get(1).map(String::as_str) == Some("run");
        self.run_check.insert(pid, (start, yes));
        yes
    }

    /// The slice of host PID `pid` and its start time; None: no such
    /// process. The slice is None for a process outside any slice or
    /// claimed by several ([`Slices::owner_of`] tells which).
    #[cfg(test)]
    pub fn slice_of(&mut self, p: &dyn ProcSource, pid: u32) -> Option<(u64, Option<SliceId>)> {
        self.owner_of(p, pid)
            .map(|(start, o)| (start, o.slice().cloned()))
    }

    /// Whose host PID `pid` is, and its start time; None: no such process.
    pub fn owner_of(&mut self, p: &dyn ProcSource, pid: u32) -> Option<(u64, Owner)> {
        let st = p.stat(pid)?;
        if let Some((s, o)) = self.cache.get(&pid)
            && *s == st.start
        {
            return Some((st.start, o.clone()));
        }
        let o = self.classify(p, pid, st.start);
        self.cache.insert(pid, (st.start, o.clone()));
        Some((st.start, o))
    }

    fn classify(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> Owner {
        let host = self.host_ns;
        let namespaces = p.pid_namespaces(pid);
        let cg = p.cgroup(pid);
        for ns in &namespaces {
            if Some(*ns) == host {
                break;
            }
            let owners: Vec<&Slice> = self
                .containers
                .values()
                .filter(|c| c.pid_ns == Some(*ns) && c.pid_ns != host)
                .collect();
            if owners.is_empty() {
                continue;
            }
            // One container, or containers of one DRA claim (a pod's
            // containers sharing its PID namespace): one slice.
            if let Some(id) = one_slice(&owners) {
                return Owner::Slice(id);
            }
            // Containers of several slices sharing a PID namespace (`--pid
            // container:`, a pod's shareProcessNamespace): told apart by
            // cgroup; a process none or several claim alike is no one's,
            // never acted on.
            let by_cg = most_specific(cg.as_deref(), owners.clone());
            if let Some(id) = one_slice(&by_cg) {
                return Owner::Slice(id);
            }
            let names: Vec<&str> = by_cg.iter().map(|c| c.label.as_str()).collect();
            self.notes.push(format!(
                "pid {pid}: in a PID namespace that several containers share, and its cgroup ({}) does not tell which of them it belongs to{}: not checked",
                cg.as_deref().unwrap_or("unknown"),
                if names.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", names.join(", "))
                }
            ));
            let claim = if by_cg.is_empty() { owners } else { by_cg };
            return Owner::Ambiguous(owner_ids(&claim));
        }
        let all: Vec<&Slice> = self.containers.values().collect();
        let by_cg = most_specific(cg.as_deref(), all);
        if let Some(id) = one_slice(&by_cg) {
            return Owner::Slice(id);
        }
        if !by_cg.is_empty() {
            let names: Vec<&str> = by_cg.iter().map(|c| c.label.as_str()).collect();
            self.notes.push(format!(
                "pid {pid}: its cgroup ({}) is recorded by several containers ({}): not checked",
                cg.as_deref().unwrap_or("unknown"),
                names.join(", ")
            ));
            return Owner::Ambiguous(owner_ids(&by_cg));
        }
        // A process in a PID namespace of its own that is no container's
        // (`unshare -Urpf` needs no privilege) is walked up like any
        // other: /proc/<pid>/stat, read here, gives its parent in host
        // PIDs.
        let (mut cur, mut cur_start) = (pid, start);
        for _ in 0..4096 {
            if self.is_run(p, cur, cur_start) {
                let key = (cur, cur_start);
                if self.shared_runs.contains(&key) {
                    return Owner::Nobody;
                }
                if !self.runs.contains_key(&key) {
                    if host_wide_quota(p, cur) {
                        // The shim follows that file, not the session's:
                        // so does the watch (no slice of its own).
                        self.notes.push(format!(
                            "cuslice run {cur} ({}): {} exists, its processes follow it, not the session's quota file: not checked as a slice of its own",
                            run_command(&p.cmdline(cur)),
                            config::DEFAULT_CONFIG_PATH
                        ));
                        self.shared_runs.insert(key);
                        return Owner::Nobody;
                    }
                    let s = self.load_run(p, cur, cur_start);
                    self.runs.insert(key, s);
                }
                return Owner::Slice(SliceId::Run {
                    pid: cur,
                    start: cur_start,
                });
            }
            let Some(st) = p.stat(cur) else {
                return Owner::Nobody;
            };
            if st.ppid <= 1 {
                return Owner::Nobody;
            }
            let Some(parent) = p.stat(st.ppid) else {
                return Owner::Nobody;
            };
            (cur, cur_start) = (st.ppid, parent.start);
        }
        Owner::Nobody
    }

    /// Forgets cached PIDs not in `keep` (called with the PIDs NVML lists,
    /// every so often).
    pub fn prune(&mut self, keep: &std::collections::HashSet<u32>) {
        self.cache.retain(|pid, _| keep.contains(pid));
        if self.run_check.len() > 4096 {
            self.run_check.clear();
        }
    }

    /// What a PID is known as, without reading anything.
    #[cfg(test)]
    pub fn cached(&self, pid: u32) -> Option<(u64, Option<SliceId>)> {
        self.cache
            .get(&pid)
            .map(|(start, o)| (*start, o.slice().cloned()))
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::host::layout::CONTAINER_RECORD;
    use crate::watch::procfs::Stat;
    use std::collections::HashMap;

    #[test]
    fn a_session_is_named_on_one_short_line() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            run_command(&args(&[
                "/usr/bin/cuslice",
                "run",
                "--memory",
                "1GiB",
                "--",
                "/opt/x/train",
                "-n",
                "3"
            ])),
            "train -n 3"
        );
        let long = run_command(&args(&[
            "cuslice",
            "run",
            "--",
            "sh",
            "-c",
            "python3 serve.py &\nwhile true; do sleep 1; done # and a great deal more script than fits",
        ]));
        assert_eq!(long.chars().count(), 60, "{long}");
        assert!(long.ends_with('…') && !long.contains('\n'), "{long}");
        assert!(
            long.starts_with("sh -c python3 serve.py &\\nwhile true"),
            "{long}"
        );
        // What reorders text or drives the terminal is shown escaped.
        assert_eq!(
            run_command(&args(&[
                "cuslice",
                "run",
                "--",
                "x\u{202e}yz",
                "\x1b]0;t\x07"
            ])),
            "x\\u{202e}yz \\x1b]0;t\\x07"
        );
    }

    /// A container's name (an annotation: the tenant's) with a newline and
    /// what looks like a line of the watch's log is one line of its label,
    /// and of every note naming it.
    #[test]
    fn a_container_name_with_a_newline_is_one_line_of_the_log() {
        let root = tmp("inject");
        let name = "web\ncuslice watch: container db (0123): resolved\x1b[2J\u{202e}";
        container(
            &root,
            "aaa",
            serde_json::json!({"id": "aaa", "name": name}),
            QUOTA,
        );
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&FakeProc::default());
        let label = &s.containers.get("aaa").expect("aaa").label;
        assert_eq!(
            label,
            "container web\\ncuslice watch: container db (0123): resolved\\x1b[2J\\u{202e} (aaa)"
        );
        let note = s
            .notes
            .iter()
            .find(|n| n.contains("records no PID namespace or cgroup"))
            .unwrap_or_else(|| panic!("{:?}", s.notes));
        assert!(note.starts_with(label.as_str()), "{note}");
        assert!(!note.contains(['\n', '\x1b', '\u{202e}']), "{note}");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A synthetic /proc.
    #[derive(Default)]
    pub struct FakeProc {
        pub procs: HashMap<u32, FakeP>,
        pub root: PathBuf,
    }

    #[derive(Default, Clone)]
    pub struct FakeP {
        pub ppid: u32,
        pub start: u64,
        pub ns: Vec<u64>,
        pub cgroup: String,
        pub inner: u32,
        pub exe: String,
        pub args: Vec<String>,
        pub env: Vec<(String, String)>,
        /// None: this test's own user (who owns the files it writes).
        pub uid: Option<u32>,
        /// What its descriptors name (as it sees them).
        pub fds: Vec<PathBuf>,
    }

    impl ProcSource for FakeProc {
        fn stat(&self, pid: u32) -> Option<Stat> {
            self.procs.get(&pid).map(|p| Stat {
                ppid: p.ppid,
                start: p.start,
            })
        }
        fn pid_namespaces(&self, pid: u32) -> Vec<u64> {
            self.procs
                .get(&pid)
                .map(|p| p.ns.clone())
                .unwrap_or_default()
        }
        fn cgroup(&self, pid: u32) -> Option<String> {
            self.procs.get(&pid).map(|p| p.cgroup.clone())
        }
        fn inner_pid(&self, pid: u32) -> Option<u32> {
            self.procs
                .get(&pid)
                .map(|p| if p.inner == 0 { pid } else { p.inner })
        }
        fn cmdline(&self, pid: u32) -> Vec<String> {
            self.procs
                .get(&pid)
                .map(|p| p.args.clone())
                .unwrap_or_default()
        }
        fn exe_name(&self, pid: u32) -> Option<String> {
            self.procs.get(&pid).map(|p| p.exe.clone())
        }
        fn environ(&self, pid: u32, key: &str) -> Option<String> {
            self.procs
                .get(&pid)?
                .env
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        }
        fn uid(&self, pid: u32) -> Option<u32> {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            self.procs.get(&pid).map(|p| p.uid.unwrap_or(me))
        }
        fn in_root(&self, _pid: u32, path: &Path) -> PathBuf {
            self.root.join(path.strip_prefix("/").unwrap_or(path))
        }
        fn fd_paths(&self, pid: u32) -> Vec<PathBuf> {
            self.procs
                .get(&pid)
                .map(|p| p.fds.clone())
                .unwrap_or_default()
        }
    }

    /// The run directory of the run process 500 in the tests' `/xdg`.
    pub const RUN_500: &str = "/xdg/cuslice-run-500-0123456789abcdef";

    /// What a `cuslice run` process holds open: the base it made its
    /// directory in, that directory, a terminal.
    fn run_fds(base: &str, dir: &str) -> Vec<PathBuf> {
        [base, dir, "/dev/pts/0"].map(PathBuf::from).to_vec()
    }

    const HOST: u64 = 4026531836;

    fn p(ppid: u32, start: u64, ns: &[u64], cgroup: &str, exe: &str, args: &[&str]) -> FakeP {
        FakeP {
            ppid,
            start,
            ns: ns.to_vec(),
            cgroup: cgroup.into(),
            exe: exe.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            ..FakeP::default()
        }
    }

    /// A test's root directory, removed when the test ends (pass or fail).
    struct TmpRoot(PathBuf);

    impl std::ops::Deref for TmpRoot {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl AsRef<Path> for TmpRoot {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TmpRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tmp(name: &str) -> TmpRoot {
        let d = std::env::temp_dir().join(format!(
            "cuslice-watch-slices-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        TmpRoot(d)
    }

    fn container(root: &Path, id: &str, meta: serde_json::Value, quota: &str) {
        let d = root.join("containers").join(id);
        std::fs::create_dir_all(d.join("segment")).expect("mkdir");
        std::fs::write(d.join("quota.toml"), quota).expect("quota");
        std::fs::write(d.join(CONTAINER_RECORD), meta.to_string()).expect("meta");
    }

    const QUOTA: &str = "tenant = \"ctr-a\"\nsegment_dir = \"/run/cuslice/segment\"\ngpu_segment_dir = \"/run/cuslice/gpu\"\n[all]\nmemory = \"1GiB\"\n";

    #[test]
    fn pids_map_to_containers_by_namespace_then_cgroup_and_to_run_sessions_by_ancestry() {
        let root = tmp("map");
        container(
            &root,
            "aaa",
            serde_json::json!({"id": "aaa", "pid_ns": 111, "cgroup": "/ctr/aaa"}),
            QUOTA,
        );
        // Shares the host's PID namespace: found by cgroup.
        container(
            &root,
            "bbb",
            serde_json::json!({"id": "bbb", "pid_ns": HOST, "cgroup": "/ctr/bbb"}),
            &QUOTA.replace("ctr-a", "ctr-b"),
        );
        // Recorded by an older hook: nothing to map by.
        container(&root, "old", serde_json::json!({"id": "old"}), QUOTA);
        let run_root = root.join("runroot");
        std::fs::create_dir_all(run_root.join("xdg/cuslice-run-500-0123456789abcdef"))
            .expect("mkdir");
        std::fs::write(
            run_root.join("xdg/cuslice-run-500-0123456789abcdef/quota.toml"),
            "tenant = \"run-500\"\nsegment_dir = \"/xdg/cuslice-run-500-0123456789abcdef/segment\"\n[all]\nmemory = \"2GiB\"\ncompute = 30\n",
        )
        .expect("quota");
        let mut fp = FakeProc {
            root: run_root,
            ..FakeProc::default()
        };
        let h = [HOST];
        fp.procs.insert(1, p(0, 1, &h, "/", "systemd", &["init"]));
        // Container aaa: its init, a process in a nested PID namespace,
        // one that moved to a sub-cgroup of another container (the
        // namespace wins).
        fp.procs
            .insert(10, p(1, 5, &[111, HOST], "/ctr/aaa", "sh", &[]));
        fp.procs.insert(
            11,
            p(10, 6, &[222, 111, HOST], "/ctr/aaa/x", "python3", &[]),
        );
        fp.procs
            .insert(12, p(10, 7, &[111, HOST], "/ctr/bbb", "python3", &[]));
        // Container bbb (host namespace), in a sub-cgroup.
        fp.procs
            .insert(20, p(1, 8, &h, "/ctr/bbb/sub", "python3", &[]));
        // Not bbb: a cgroup that only starts with its name.
        fp.procs
            .insert(21, p(1, 9, &h, "/ctr/bbbb", "python3", &[]));
        // A run session: cuslice run (500) -> sh (501) -> python (502), and
        // an orphan reparented to the subreaper (503); a process of the
        // same user outside it (600).
        let mut run = p(
            1,
            20,
            &h,
            "/user",
            "cuslice",
            &[
                "cuslice",
                "run",
                "--memory",
                "2GiB",
                "--",
                "/usr/bin/python3",
                "x.py",
            ],
        );
        run.env = vec![("XDG_RUNTIME_DIR".into(), "/xdg".into())];
        run.fds = run_fds("/xdg", RUN_500);
        fp.procs.insert(500, run);
        fp.procs.insert(501, p(500, 21, &h, "/user", "sh", &[]));
        fp.procs
            .insert(502, p(501, 22, &h, "/user", "python3", &[]));
        fp.procs
            .insert(503, p(500, 23, &h, "/user", "python3", &[]));
        fp.procs.insert(600, p(1, 24, &h, "/user", "python3", &[]));
        // A `cuslice status` is no session.
        fp.procs.insert(
            700,
            p(1, 25, &h, "/user", "cuslice", &["cuslice", "status"]),
        );
        fp.procs
            .insert(701, p(700, 26, &h, "/user", "python3", &[]));

        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        assert_eq!(s.containers.len(), 3);
        assert!(
            s.notes.iter().any(|n| n.starts_with("container old: ")
                && n.contains("records no PID namespace or cgroup")),
            "{:?}",
            s.notes
        );
        let ctr = |id: &str| Some(SliceId::Container(id.into()));
        let run = Some(SliceId::Run {
            pid: 500,
            start: 20,
        });
        for (pid, want) in [
            (10, ctr("aaa")),
            (11, ctr("aaa")),
            (12, ctr("aaa")),
            (20, ctr("bbb")),
            (21, None),
            (502, run.clone()),
            (503, run.clone()),
            (600, None),
            (701, None),
        ] {
            assert_eq!(s.slice_of(&fp, pid).map(|x| x.1), Some(want), "pid {pid}");
        }
        assert_eq!(s.slice_of(&fp, 9999), None);
        let r = s.runs.get(&(500, 20)).expect("session");
        assert_eq!(r.tenant, "run-500");
        assert_eq!(r.label, "cuslice run 500 (python3 x.py)");
        assert_eq!(r.quota.as_ref().and_then(|c| c.all.memory), Some(2 << 30));
        assert_eq!(
            r.mem_seg.as_deref(),
            Some(
                fp.root
                    .join("xdg/cuslice-run-500-0123456789abcdef/segment/memory.seg")
                    .as_path()
            )
        );
        let a = s.containers.get("aaa").expect("aaa");
        assert_eq!(a.tenant, "ctr-a");
        assert_eq!(
            a.mem_seg.as_deref(),
            Some(root.join("containers/aaa/segment/memory.seg").as_path())
        );

        // A PID reused by another process is classified afresh.
        fp.procs.insert(502, p(1, 99, &h, "/user", "python3", &[]));
        assert_eq!(s.slice_of(&fp, 502).map(|x| x.1), Some(None));
        // The session ends: it is forgotten, and so are its processes.
        fp.procs.remove(&500);
        s.refresh(&fp);
        assert!(s.runs.is_empty());
        assert_eq!(s.cached(503), None);
        // A container that goes away takes its processes with it.
        std::fs::remove_dir_all(root.join("containers/aaa")).expect("rm");
        s.refresh(&fp);
        assert!(s.cached(10).is_none());
        assert_eq!(s.slice_of(&fp, 10).map(|x| x.1), Some(None));
        let _ = std::fs::remove_dir_all(&root);
    }

    fn run_proc(xdg: &str, env: &[(&str, &str)]) -> FakeP {
        let mut r = p(
            1,
            20,
            &[HOST],
            "/user",
            "cuslice",
            &["cuslice", "run", "--memory", "2GiB", "--", "prog"],
        );
        r.env = std::iter::once(("XDG_RUNTIME_DIR", xdg))
            .chain(env.iter().copied())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        r.fds = run_fds(xdg, RUN_500);
        r
    }

    #[test]
    fn containers_sharing_a_pid_namespace_are_told_apart_by_cgroup_and_an_ambiguous_process_is_no_ones()
     {
        // `--pid container:ppp` or a pod's shareProcessNamespace: both
        // records name namespace 333. Mapping every process to the first
        // record once had the watch kill a well-behaved process of qqq.
        let root = tmp("sharedns");
        container(
            &root,
            "ppp",
            serde_json::json!({"id": "ppp", "pid_ns": 333, "cgroup": "/pod/ppp"}),
            QUOTA,
        );
        container(
            &root,
            "qqq",
            serde_json::json!({"id": "qqq", "pid_ns": 333, "cgroup": "/pod/qqq"}),
            &QUOTA.replace("ctr-a", "ctr-q"),
        );
        // A record of the pod's cgroup itself: less specific than qqq's.
        container(
            &root,
            "pod",
            serde_json::json!({"id": "pod", "pid_ns": 444, "cgroup": "/pod"}),
            &QUOTA.replace("ctr-a", "ctr-pod"),
        );
        let mut fp = FakeProc::default();
        fp.procs
            .insert(30, p(1, 5, &[333, HOST], "/pod/qqq/x", "python3", &[]));
        fp.procs
            .insert(31, p(1, 6, &[333, HOST], "/pod/ppp", "python3", &[]));
        fp.procs
            .insert(32, p(1, 7, &[333, HOST], "/elsewhere", "python3", &[]));
        fp.procs
            .insert(33, p(1, 8, &[HOST], "/pod/qqq", "python3", &[]));
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        let of = |s: &mut Slices, pid| s.slice_of(&fp, pid).and_then(|x| x.1);
        assert_eq!(of(&mut s, 30), Some(SliceId::Container("qqq".into())));
        assert_eq!(of(&mut s, 31), Some(SliceId::Container("ppp".into())));
        assert_eq!(of(&mut s, 32), None, "ambiguous: no one's");
        // Said as such, with the containers that claim it alike.
        assert_eq!(
            s.owner_of(&fp, 32).map(|x| x.1),
            Some(Owner::Ambiguous(vec![
                SliceId::Container("ppp".into()),
                SliceId::Container("qqq".into())
            ]))
        );
        assert!(
            s.notes
                .iter()
                .any(|n| n.starts_with("pid 32: in a PID namespace that several containers share")),
            "{:?}",
            s.notes
        );
        // By cgroup alone (the host's namespace): the most specific record.
        assert_eq!(of(&mut s, 33), Some(SliceId::Container("qqq".into())));
    }

    /// A DRA claim's files as its plugin writes them: `quota`, a record
    /// when given, an empty segment directory.
    fn claim(root: &Path, uid: &str, quota: &str, record: Option<serde_json::Value>) {
        let d = root.join("claims").join(uid);
        std::fs::create_dir_all(d.join("segment")).expect("mkdir");
        std::fs::write(d.join("quota.toml"), quota).expect("quota");
        if let Some(r) = record {
            std::fs::write(d.join("claim.json"), r.to_string()).expect("record");
        }
    }

    /// What `cuslice-dra-plugin` writes for a claim of 2 GiB.
    const CLAIM_QUOTA: &str = "tenant = \"team-a/trainer\"\nsegment_dir = \"/run/cuslice/segment\"\ngpu_segment_dir = \"/run/cuslice/gpu\"\n[all]\nmemory = \"2GiB\"\n";

    /// A container record of claim `uid` (or none), its init `init` (host
    /// PID, start time 1), in PID namespace `ns` and cgroup `/pod/<id>`.
    fn member(root: &Path, id: &str, ns: u64, init: u32, uid: Option<&str>) {
        let mut meta = serde_json::json!({"id": id, "pid_ns": ns, "cgroup": format!("/pod/{id}"),
            "init_pid": init, "init_start": 1});
        if let Some(u) = uid {
            meta["claim"] = u.into();
        }
        // Its copy of the claim's quota file: what its shim reads, not
        // what the watch judges it by (100 GiB here, to tell them apart).
        container(root, id, meta, &CLAIM_QUOTA.replace("2GiB", "100GiB"));
    }

    #[test]
    fn the_containers_of_a_dra_claim_are_one_slice_held_to_the_claims_quota_file_and_segment() {
        let root = tmp("claim");
        claim(
            &root,
            "uid-1",
            CLAIM_QUOTA,
            Some(
                serde_json::json!({"namespace": "team-a", "name": "trainer\u{1b}[2J", "uid": "uid-1", "pods": ["team-a/t-0"]}),
            ),
        );
        member(&root, "aaa", 111, 10, Some("uid-1"));
        member(&root, "bbb", 222, 20, Some("uid-1"));
        // Two more of the claim sharing a PID namespace (a pod's
        // shareProcessNamespace): whichever of them a process is in, it
        // is the claim's.
        member(&root, "ddd", 444, 40, Some("uid-1"));
        member(&root, "eee", 444, 41, Some("uid-1"));
        // A container of its own beside them.
        container(
            &root,
            "ccc",
            serde_json::json!({"id": "ccc", "pid_ns": 333, "cgroup": "/pod/ccc", "init_pid": 30, "init_start": 1}),
            QUOTA,
        );
        let mut fp = FakeProc::default();
        for (pid, ns) in [(10, 111), (20, 222), (30, 333), (40, 444), (41, 444)] {
            fp.procs
                .insert(pid, p(1, 1, &[ns, HOST], &format!("/pod/{pid}"), "sh", &[]));
        }
        fp.procs
            .insert(11, p(10, 2, &[111, HOST], "/pod/aaa", "python3", &[]));
        fp.procs
            .insert(21, p(20, 2, &[222, HOST], "/pod/bbb", "python3", &[]));
        fp.procs
            .insert(31, p(30, 2, &[333, HOST], "/pod/ccc", "python3", &[]));
        fp.procs
            .insert(42, p(40, 2, &[444, HOST], "/elsewhere", "python3", &[]));
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        let claim_id = Some(SliceId::Claim("uid-1".into()));
        for (pid, want) in [
            (11, claim_id.clone()),
            (21, claim_id.clone()),
            (42, claim_id.clone()),
            (31, Some(SliceId::Container("ccc".into()))),
        ] {
            assert_eq!(s.slice_of(&fp, pid).map(|x| x.1), Some(want), "pid {pid}");
        }
        // One slice for the claim, none for its containers.
        let ids: Vec<SliceId> = s.all().map(|x| x.id.clone()).collect();
        assert_eq!(
            ids,
            [
                SliceId::Container("ccc".into()),
                SliceId::Claim("uid-1".into())
            ]
        );
        let c = s.get(&SliceId::Claim("uid-1".into())).expect("claim");
        assert_eq!(c.label, "DRA claim team-a/trainer\\x1b[2J (uid-1)");
        assert_eq!(c.tenant, "team-a/trainer");
        assert_eq!(c.quota.as_ref().and_then(|q| q.all.memory), Some(2 << 30));
        let seg = root.join("claims/uid-1/segment/memory.seg");
        assert_eq!(c.mem_seg.as_deref(), Some(seg.as_path()));
        assert_eq!(
            c.open_mem_seg_for_repair().expect("repair").path(),
            seg.as_path()
        );
        // Its record gone: named by its UID, read again.
        std::fs::remove_file(root.join("claims/uid-1/claim.json")).expect("rm");
        s.refresh(&fp);
        assert_eq!(s.claims["uid-1"].label, "DRA claim uid-1");
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        // A container of the claim goes: its processes are no one's, the
        // others' stay the claim's.
        std::fs::remove_dir_all(root.join("containers/aaa")).expect("rm");
        s.refresh(&fp);
        assert_eq!(s.cached(11), None);
        assert_eq!(s.slice_of(&fp, 11).map(|x| x.1), Some(None));
        assert_eq!(s.slice_of(&fp, 21).map(|x| x.1), Some(claim_id.clone()));
        // The last ones go: so does the claim.
        for id in ["bbb", "ddd", "eee"] {
            std::fs::remove_dir_all(root.join("containers").join(id)).expect("rm");
        }
        s.refresh(&fp);
        assert!(s.claims.is_empty());
        assert_eq!(s.slice_of(&fp, 21).map(|x| x.1), Some(None));
    }

    #[test]
    fn a_claim_whose_directory_or_quota_file_is_missing_or_bad_is_one_note_naming_the_path_and_is_not_checked()
     {
        let root = tmp("badclaim");
        let mut fp = FakeProc::default();
        fp.procs
            .insert(10, p(1, 1, &[111, HOST], "/pod/aaa", "sh", &[]));
        fp.procs
            .insert(11, p(10, 2, &[111, HOST], "/pod/aaa", "python3", &[]));
        member(&root, "aaa", 111, 10, Some("uid-2"));
        let uid2 = root.join("claims/uid-2");
        // (what is done to the claim, what the note says). A claim is read
        // again when its quota file or record changes: each case changes
        // the quota file as `stat` sees it.
        let cases: Vec<(Box<dyn Fn()>, String)> = vec![
            (
                Box::new(|| ()),
                format!(
                    "{}: cannot open the directory: No such file or directory",
                    root.join("claims").display()
                ),
            ),
            (
                Box::new(|| {
                    claim(&root, "elsewhere", CLAIM_QUOTA, None);
                    std::os::unix::fs::symlink(root.join("claims/elsewhere"), &uid2)
                        .expect("symlink");
                }),
                format!("{}: expected a directory, got a symlink", uid2.display()),
            ),
            (
                Box::new(|| {
                    std::fs::remove_file(&uid2).expect("rm");
                    std::fs::create_dir_all(&uid2).expect("mkdir");
                }),
                format!(
                    "{}: cannot open the file: No such file or directory",
                    uid2.join("quota.toml").display()
                ),
            ),
            (
                Box::new(|| {
                    std::os::unix::fs::symlink(
                        root.join("claims/elsewhere/quota.toml"),
                        uid2.join("quota.toml"),
                    )
                    .expect("symlink");
                }),
                format!(
                    "{}: cannot open the file: Too many levels of symbolic links",
                    uid2.join("quota.toml").display()
                ),
            ),
            (
                Box::new(|| {
                    std::fs::remove_file(uid2.join("quota.toml")).expect("rm");
                    std::fs::write(uid2.join("quota.toml"), "[all]\nmemory = \"lots\"\n")
                        .expect("write");
                }),
                format!(
                    "{}: all.memory: expected a size",
                    uid2.join("quota.toml").display()
                ),
            ),
            (
                Box::new(|| {
                    std::fs::write(uid2.join("quota.toml"), "tenant = \"team-a/x\"\n")
                        .expect("write");
                }),
                format!("{}: no limit in it", uid2.join("quota.toml").display()),
            ),
            (
                Box::new(|| {
                    std::fs::write(
                        uid2.join("quota.toml"),
                        vec![b'#'; (config::MAX_FILE_BYTES + 1) as usize],
                    )
                    .expect("write");
                }),
                format!("{}: larger than", uid2.join("quota.toml").display()),
            ),
        ];
        let mut s = Slices::new(&root, Some(HOST));
        for (i, (make, want)) in cases.iter().enumerate() {
            make();
            // Each change seen as one (a file written in the same clock
            // tick as the last is not told from it).
            std::thread::sleep(std::time::Duration::from_millis(20));
            s.refresh(&fp);
            assert_eq!(s.notes.len(), 1, "case {i}: {:?}", s.notes);
            let n = s.notes.remove(0);
            assert!(
                n.starts_with("DRA claim uid-2 (named by container aaa): ")
                    && n.contains(want.as_str())
                    && n.ends_with(": its containers are not checked"),
                "case {i}: {n}\nwanted {want}"
            );
            // The claim's processes: the claim's, not judged; never the
            // container's own (its copy gives 100 GiB).
            let c = &s.claims["uid-2"];
            assert!(c.quota.is_none() && c.mem_seg.is_none(), "case {i}");
            assert_eq!(
                s.slice_of(&fp, 11).map(|x| x.1),
                Some(Some(SliceId::Claim("uid-2".into()))),
                "case {i}"
            );
            assert_eq!(s.all().count(), 1);
            // Said once.
            s.refresh(&fp);
            assert!(s.notes.is_empty(), "case {i}: {:?}", s.notes);
        }
        // Another user's file (the watch runs as root: root's only).
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let q = uid2.join("quota.toml");
            std::fs::write(&q, CLAIM_QUOTA).expect("write");
            std::os::unix::fs::chown(&q, Some(4242), None).expect("chown");
            std::thread::sleep(std::time::Duration::from_millis(20));
            s.refresh(&fp);
            assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
            assert!(
                s.notes[0].contains(&format!(
                    "{}: expected a file of uid 0, got one of uid 4242",
                    q.display()
                )),
                "{}",
                s.notes[0]
            );
            s.notes.clear();
            std::os::unix::fs::chown(&q, Some(0), None).expect("chown");
        }
        // Made right: read again, judged, no note.
        std::fs::write(uid2.join("quota.toml"), CLAIM_QUOTA).expect("write");
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.refresh(&fp);
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        assert_eq!(
            s.claims["uid-2"].quota.as_ref().and_then(|q| q.all.memory),
            Some(2 << 30)
        );
    }

    #[test]
    fn a_container_whose_init_is_gone_matches_nothing_until_its_record_is_written_again() {
        let root = tmp("stale");
        let meta = |start: u64| serde_json::json!({"id": "aaa", "pid_ns": 111, "cgroup": "/ctr/aaa", "init_pid": 10, "init_start": start});
        container(&root, "aaa", meta(5), QUOTA);
        let mut fp = FakeProc::default();
        fp.procs
            .insert(10, p(1, 5, &[111, HOST], "/ctr/aaa", "sh", &[]));
        fp.procs
            .insert(11, p(10, 6, &[111, HOST], "/ctr/aaa", "python3", &[]));
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        assert_eq!(
            s.slice_of(&fp, 11).map(|x| x.1),
            Some(Some(SliceId::Container("aaa".into())))
        );
        // The container ends, its record stays (not deleted yet); the
        // namespace inode goes to an unrelated process tree.
        fp.procs.clear();
        fp.procs
            .insert(30, p(1, 50, &[111, HOST], "/other", "python3", &[]));
        s.refresh(&fp);
        assert!(s.containers.is_empty());
        assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
        assert!(s.notes[0].contains("init process") && s.notes[0].contains("is gone"));
        assert_eq!(s.slice_of(&fp, 30).map(|x| x.1), Some(None));
        // Said once, not loaded again while the record is unchanged.
        s.refresh(&fp);
        assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
        assert!(s.containers.is_empty());
        // Restarted under the same id: the new record is read.
        fp.procs
            .insert(40, p(1, 60, &[111, HOST], "/ctr/aaa", "sh", &[]));
        std::thread::sleep(std::time::Duration::from_millis(20));
        container(
            &root,
            "aaa",
            serde_json::json!({"id": "aaa", "pid_ns": 111, "cgroup": "/ctr/aaa", "init_pid": 40, "init_start": 60}),
            QUOTA,
        );
        s.refresh(&fp);
        assert_eq!(s.containers.len(), 1);
        fp.procs
            .insert(41, p(40, 61, &[111, HOST], "/ctr/aaa", "python3", &[]));
        assert_eq!(
            s.slice_of(&fp, 41).map(|x| x.1),
            Some(Some(SliceId::Container("aaa".into())))
        );
        // A record found stale at its first reading is not loaded either.
        container(
            &root,
            "bbb",
            serde_json::json!({"id": "bbb", "pid_ns": 222, "init_pid": 70, "init_start": 1}),
            QUOTA,
        );
        s.refresh(&fp);
        assert!(!s.containers.contains_key("bbb"));
        assert!(
            s.notes
                .last()
                .is_some_and(|n| n.starts_with("container bbb: ") && n.contains("is gone"))
        );
        // An older hook's record: one note, taken as live.
        container(
            &root,
            "ccc",
            serde_json::json!({"id": "ccc", "pid_ns": 333}),
            QUOTA,
        );
        let n = s.notes.len();
        s.refresh(&fp);
        s.refresh(&fp);
        assert!(s.containers.contains_key("ccc"));
        assert_eq!(s.notes.len(), n + 1, "{:?}", s.notes);
        assert!(
            s.notes[n].contains("records no init process"),
            "{}",
            s.notes[n]
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A container's quota file in its quota directory (as the hook lays
    /// it out now) and one where an older hook put it are both read, and
    /// read again when a resize renames a new one into place.
    #[test]
    fn a_containers_quota_file_is_read_again_when_resized_in_its_quota_directory_or_an_older_hooks_place()
     {
        let root = tmp("quota-dir");
        let meta = |id: &str, ns: u64| serde_json::json!({"id": id, "pid_ns": ns, "init_pid": 10, "init_start": 5});
        // An older hook's: the quota file beside the record.
        container(&root, "old", meta("old", 111), QUOTA);
        // This hook's: in the quota directory (the older place left empty).
        container(&root, "new", meta("new", 222), QUOTA);
        let d = root.join("containers/new");
        std::fs::create_dir(d.join("etc")).expect("mkdir");
        std::fs::rename(d.join("quota.toml"), d.join("etc/quota.toml")).expect("mv");
        let mut fp = FakeProc::default();
        fp.procs.insert(10, p(1, 5, &[111, HOST], "/", "sh", &[]));
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        let memory = |s: &Slices, id: &str| {
            s.containers
                .get(id)
                .and_then(|c| c.quota.as_ref())
                .and_then(|q| q.all.memory)
        };
        assert_eq!(memory(&s, "old"), Some(1 << 30));
        assert_eq!(memory(&s, "new"), Some(1 << 30));
        // Resized: a new file renamed into place, in each's place.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let resized = QUOTA.replace("1GiB", "2GiB");
        for q in [
            d.join("etc/quota.toml"),
            root.join("containers/old/quota.toml"),
        ] {
            let tmp = q.with_extension("new");
            std::fs::write(&tmp, &resized).expect("write");
            std::fs::rename(&tmp, &q).expect("rename");
        }
        s.refresh(&fp);
        assert_eq!(memory(&s, "old"), Some(2 << 30));
        assert_eq!(memory(&s, "new"), Some(2 << 30));
        assert!(s.notes.is_empty(), "{:?}", s.notes);
    }

    #[test]
    fn a_session_takes_only_limits_from_its_quota_file() {
        let root = tmp("runfile");
        let run_root = root.join("runroot");
        let d = run_root.join("xdg/cuslice-run-500-0123456789abcdef");
        std::fs::create_dir_all(d.join("segment")).expect("mkdir");
        let mut fp = FakeProc {
            root: run_root.clone(),
            ..FakeProc::default()
        };
        fp.procs
            .insert(1, p(0, 1, &[HOST], "/", "systemd", &["init"]));
        fp.procs.insert(
            500,
            run_proc("/xdg", &[("CUSLICE_GPU_SEGMENT_DIR", "/gpu")]),
        );
        fp.procs
            .insert(501, p(500, 21, &[HOST], "/user", "python3", &[]));
        let session = |fp: &FakeProc, quota: &str| {
            std::fs::write(d.join("quota.toml"), quota).expect("quota");
            let mut s = Slices::new(&root, Some(HOST));
            s.refresh(fp);
            assert_eq!(
                s.slice_of(fp, 501).map(|x| x.1),
                Some(Some(SliceId::Run {
                    pid: 500,
                    start: 20
                }))
            );
            let r = s.runs.get(&(500, 20)).expect("session").clone();
            (r, std::mem::take(&mut s.notes))
        };
        // What `cuslice run` writes: repaired, no note.
        let good = "tenant = \"run-500\"\nsegment_dir = \"/xdg/cuslice-run-500-0123456789abcdef/segment\"\ngpu_segment_dir = \"/gpu\"\n[all]\nmemory = \"2GiB\"\n";
        let (r, notes) = session(&fp, good);
        assert!(notes.is_empty(), "{notes:?}");
        assert!(r.repair);
        assert_eq!(r.tenant, "run-500");
        assert_eq!(r.gpu_dir, run_root.join("gpu"));
        assert_eq!(r.mem_seg, Some(d.join("segment/memory.seg")));
        // Rewritten: a note naming the file and each key; the paths and the
        // tenant stay `run`'s, the limits are the file's, no repair.
        let (r, notes) = session(
            &fp,
            "tenant = \"ctr-a\"\nsegment_dir = \"/run/cuslice/containers/aaa/segment\"\ngpu_segment_dir = \"/elsewhere\"\n[all]\nmemory = \"100GiB\"\n",
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        let n = &notes[0];
        assert!(
            n.starts_with(
                "cuslice run 500 (prog): /xdg/cuslice-run-500-0123456789abcdef/quota.toml: "
            ) && n.contains("tenant \"ctr-a\"")
                && n.contains("segment_dir \"/run/cuslice/containers/aaa/segment\"")
                && n.contains("gpu_segment_dir \"/elsewhere\"")
                && n.contains("not repaired"),
            "{n}"
        );
        assert!(!r.repair);
        assert_eq!(r.tenant, "run-500");
        assert_eq!(r.gpu_dir, run_root.join("gpu"));
        assert_eq!(r.mem_seg, Some(d.join("segment/memory.seg")));
        assert_eq!(r.quota.as_ref().and_then(|c| c.all.memory), Some(100 << 30));
        assert!(r.open_mem_seg_for_repair().is_err());
        // The default GPU directory, where the run process has no variable.
        fp.procs.insert(500, run_proc("/xdg", &[]));
        let (r, notes) = session(&fp, &good.replace("gpu_segment_dir = \"/gpu\"\n", ""));
        assert!(notes.is_empty() && r.repair, "{notes:?}");
        assert_eq!(r.gpu_dir, run_root.join("dev/shm/cuslice/gpu"));
        let (r, notes) = session(&fp, good);
        assert!(
            !r.repair && notes[0].contains("gpu_segment_dir \"/gpu\""),
            "{notes:?}"
        );
        fp.procs.insert(
            500,
            run_proc("/xdg", &[("CUSLICE_GPU_SEGMENT_DIR", "/gpu")]),
        );
        // Not the session user's file, or not a regular file: not checked.
        fp.procs.get_mut(&500).expect("run").uid = Some(4242);
        let (r, notes) = session(&fp, good);
        assert!(r.quota.is_none() && !r.repair);
        assert!(
            notes[0].contains("not by the session's uid 4242") && notes[0].ends_with("not checked"),
            "{notes:?}"
        );
        fp.procs.get_mut(&500).expect("run").uid = None;
        std::fs::remove_file(d.join("quota.toml")).expect("rm");
        let target = root.join("elsewhere.toml");
        std::fs::write(&target, good).expect("write");
        std::os::unix::fs::symlink(&target, d.join("quota.toml")).expect("symlink");
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        s.slice_of(&fp, 501);
        assert!(s.runs[&(500, 20)].quota.is_none());
        assert!(s.notes[0].contains("got a symbolic link"), "{:?}", s.notes);
        std::fs::remove_file(d.join("quota.toml")).expect("rm");
        std::fs::write(
            d.join("quota.toml"),
            vec![b'#'; (config::MAX_FILE_BYTES + 1) as usize],
        )
        .expect("write");
        let mut s = Slices::new(&root, Some(HOST));
        s.slice_of(&fp, 501);
        assert!(s.notes[0].contains("at most 1MiB"), "{:?}", s.notes);
        // A tenant name a container has: not checked.
        container(
            &root,
            "ccc",
            serde_json::json!({"id": "ccc", "pid_ns": 7}),
            &QUOTA.replace("ctr-a", "run-500"),
        );
        let (r, notes) = session(&fp, good);
        assert!(r.quota.is_none() && !r.repair);
        assert!(
            notes
                .iter()
                .any(|n| n.contains("its tenant run-500 is also container ccc's")),
            "{notes:?}"
        );
        // Not where the two are different slices (what `cuslice run` and
        // the hook write: each its own): two entries of the GPU segment,
        // each checked on its own.
        let own = good.replace(
            "[all]",
            "slice = \"run-cuslice-run-500-0123456789abcdef\"\n[all]",
        );
        std::fs::write(d.join("quota.toml"), &own).expect("quota");
        let (r, notes) = session(&fp, &own);
        assert!(
            r.repair && !notes.iter().any(|n| n.contains("is also")),
            "{notes:?}"
        );
        assert_eq!(
            (r.tenant.as_str(), r.tag),
            ("run-500", r.quota.as_ref().expect("quota").slice_tag())
        );
        assert_ne!(r.tag, 0);
        // A slice that is not the session's own is not what `cuslice run`
        // wrote.
        let other = good.replace("[all]", "slice = \"ctr-ccc\"\n[all]");
        let (r, notes) = session(&fp, &other);
        assert!(!r.repair, "{notes:?}");
        assert!(
            notes.iter().any(|n| n.contains(
                "slice \"ctr-ccc\" (`cuslice run` wrote \"run-cuslice-run-500-0123456789abcdef\")"
            )),
            "{notes:?}"
        );
        std::fs::remove_dir_all(root.join("containers")).expect("rm");
        // The segment is opened for repair only through the user's own
        // directories, none of them a link.
        std::fs::write(d.join("quota.toml"), good).expect("quota");
        let (r, _) = session(&fp, good);
        assert!(r.open_mem_seg_for_repair().is_err(), "no segment yet");
        std::fs::write(d.join("segment/memory.seg"), "x").expect("seg");
        let t = r.open_mem_seg_for_repair().expect("the user's own segment");
        assert_eq!(std::fs::read(t.path()).expect("reopen"), b"x");
        let victim = root.join("victim");
        std::fs::create_dir_all(&victim).expect("mkdir");
        std::fs::write(victim.join("memory.seg"), "x").expect("seg");
        std::fs::remove_dir_all(d.join("segment")).expect("rm");
        std::os::unix::fs::symlink(&victim, d.join("segment")).expect("symlink");
        let e = r.open_mem_seg_for_repair().expect_err("followed a link");
        assert!(e.contains("segment"), "{e}");
        std::fs::remove_file(d.join("segment")).expect("rm");
        std::fs::create_dir_all(d.join("segment")).expect("mkdir");
        std::os::unix::fs::symlink(victim.join("memory.seg"), d.join("segment/memory.seg"))
            .expect("symlink");
        assert!(r.open_mem_seg_for_repair().is_err());
        let mut other = r.clone();
        other.mem_seg_owner = Some(4242);
        std::fs::remove_file(d.join("segment/memory.seg")).expect("rm");
        std::fs::write(d.join("segment/memory.seg"), "x").expect("seg");
        let e = other.open_mem_seg_for_repair().expect_err("another user's");
        assert!(e.contains("not by the session's uid 4242"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A session's directory that is a link (to another directory, whose
    /// quota file claims more): not read through, one note naming it, the
    /// session not checked.
    #[test]
    fn a_run_directory_that_is_a_link_is_not_read_through() {
        let root = tmp("runlink");
        let run_root = root.join("runroot");
        let elsewhere = run_root.join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("segment")).expect("mkdir");
        std::fs::write(
            elsewhere.join("quota.toml"),
            format!("tenant = \"run-500\"\nsegment_dir = \"{RUN_500}/segment\"\n[all]\nmemory = \"100GiB\"\n"),
        )
        .expect("quota");
        std::fs::create_dir_all(run_root.join("xdg")).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, run_root.join(RUN_500.trim_start_matches('/')))
            .expect("link");
        let mut fp = FakeProc {
            root: run_root.clone(),
            ..FakeProc::default()
        };
        fp.procs
            .insert(1, p(0, 1, &[HOST], "/", "systemd", &["init"]));
        fp.procs.insert(500, run_proc("/xdg", &[]));
        fp.procs
            .insert(501, p(500, 21, &[HOST], "/user", "python3", &[]));
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        assert_eq!(
            s.slice_of(&fp, 501).map(|x| x.1),
            Some(Some(SliceId::Run {
                pid: 500,
                start: 20
            }))
        );
        let r = &s.runs[&(500, 20)];
        assert!(r.quota.is_none() && !r.repair && r.mem_seg.is_none());
        assert_eq!(
            s.notes,
            vec![format!(
                "cuslice run 500 (prog): {RUN_500}: expected a directory, got a symbolic link: not checked"
            )]
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The run directory's name is unpredictable: it is the one the run
    /// process holds open, named as its PID's, in its base; a directory
    /// under the old predictable name, another PID's or one in another
    /// place is not it, and a session whose directory is not found is one
    /// note and not checked.
    #[test]
    fn a_sessions_directory_is_the_one_its_run_process_holds_open() {
        let root = tmp("runfd");
        let run_root = root.join("runroot");
        let good = |dir: &str| {
            format!(
                "tenant = \"run-500\"\nsegment_dir = \"{dir}/segment\"\n[all]\nmemory = \"2GiB\"\n"
            )
        };
        // Planted, each with a quota file claiming 100 GiB.
        let bad = "tenant = \"run-500\"\n[all]\nmemory = \"100GiB\"\n";
        for d in [
            "xdg/cuslice-run-500",
            "xdg/cuslice-run-501-0123456789abcdef",
            "other/cuslice-run-500-0123456789abcdef",
            "xdg/cuslice-run-500-fedcba9876543210",
        ] {
            std::fs::create_dir_all(run_root.join(d)).expect("mkdir");
            std::fs::write(run_root.join(d).join("quota.toml"), bad).expect("quota");
        }
        let d = run_root.join(RUN_500.trim_start_matches('/'));
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join("quota.toml"), good(RUN_500)).expect("quota");
        let mut fp = FakeProc {
            root: run_root.clone(),
            ..FakeProc::default()
        };
        fp.procs
            .insert(1, p(0, 1, &[HOST], "/", "systemd", &["init"]));
        fp.procs
            .insert(501, p(500, 21, &[HOST], "/user", "python3", &[]));
        let session = |fp: &FakeProc| {
            let mut s = Slices::new(&root, Some(HOST));
            s.refresh(fp);
            assert!(s.slice_of(fp, 501).is_some_and(|x| x.1.is_some()));
            let r = s.runs.get(&(500, 20)).expect("session").clone();
            (r, std::mem::take(&mut s.notes))
        };
        let mut run = run_proc("/xdg", &[]);
        let planted = [
            "/xdg/cuslice-run-500",
            "/xdg/cuslice-run-501-0123456789abcdef",
            "/other/cuslice-run-500-0123456789abcdef",
            "/xdg/cuslice-run-500-0123456789abcdef (deleted)",
        ]
        .map(PathBuf::from);
        run.fds = planted.to_vec();
        run.fds.push(PathBuf::from(RUN_500));
        fp.procs.insert(500, run.clone());
        let (r, notes) = session(&fp);
        assert!(notes.is_empty() && r.repair, "{notes:?}");
        assert_eq!(r.quota.as_ref().and_then(|c| c.all.memory), Some(2 << 30));
        assert_eq!(r.mem_seg, Some(d.join("segment/memory.seg")));
        // Not held open (only the planted ones): not found, not checked.
        run.fds = planted.to_vec();
        fp.procs.insert(500, run.clone());
        let (r, notes) = session(&fp);
        assert!(r.quota.is_none() && !r.repair && r.mem_seg.is_none());
        assert_eq!(
            notes,
            vec![
                "cuslice run 500 (prog): no run directory /xdg/cuslice-run-500-* among the run process's open files: not checked"
                    .to_string()
            ]
        );
        // A base reached through a link: the directory is found by what the
        // base is, and named through the base as `run` named it.
        std::os::unix::fs::symlink(run_root.join("xdg"), run_root.join("xdglink"))
            .expect("symlink");
        let linked = "/xdglink/cuslice-run-500-0123456789abcdef";
        std::fs::write(d.join("quota.toml"), good(linked)).expect("quota");
        let mut run = run_proc("/xdglink", &[]);
        run.fds = run_fds("/xdg", RUN_500);
        fp.procs.insert(500, run);
        let (r, notes) = session(&fp);
        assert!(notes.is_empty() && r.repair, "{notes:?}");
        assert_eq!(
            r.mem_seg,
            Some(run_root.join("xdglink/cuslice-run-500-0123456789abcdef/segment/memory.seg"))
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn sessions_under_a_host_wide_quota_file_and_processes_in_pid_namespaces_of_their_own() {
        let root = tmp("hostwide");
        let run_root = root.join("runroot");
        let d = run_root.join("xdg/cuslice-run-500-0123456789abcdef");
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("quota.toml"),
            "tenant = \"run-500\"\nsegment_dir = \"/xdg/cuslice-run-500-0123456789abcdef/segment\"\n[all]\nmemory = \"2GiB\"\n",
        )
        .expect("quota");
        let mut fp = FakeProc {
            root: run_root.clone(),
            ..FakeProc::default()
        };
        fp.procs
            .insert(1, p(0, 1, &[HOST], "/", "systemd", &["init"]));
        fp.procs.insert(500, run_proc("/xdg", &[]));
        // unshare -pf: the child is PID 1 of a namespace of its own.
        fp.procs
            .insert(501, p(500, 21, &[HOST], "/user", "unshare", &[]));
        fp.procs
            .insert(502, p(501, 22, &[999, HOST], "/user", "prog", &[]));
        let run = Some(SliceId::Run {
            pid: 500,
            start: 20,
        });
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        assert_eq!(s.slice_of(&fp, 502).map(|x| x.1), Some(run));
        assert!(s.notes.is_empty(), "{:?}", s.notes);
        // /etc/cuslice/quota.toml, as the session sees it: the shim follows
        // it, the session is no slice of its own (said once).
        std::fs::create_dir_all(run_root.join("etc/cuslice")).expect("mkdir");
        std::fs::write(run_root.join("etc/cuslice/quota.toml"), "[all]\n").expect("write");
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(&fp);
        assert_eq!(s.slice_of(&fp, 502).map(|x| x.1), Some(None));
        assert_eq!(s.slice_of(&fp, 501).map(|x| x.1), Some(None));
        assert!(s.runs.is_empty());
        assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
        assert!(
            s.notes[0].contains("/etc/cuslice/quota.toml exists"),
            "{}",
            s.notes[0]
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
