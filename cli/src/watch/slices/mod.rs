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
//!
//! Files, by concern:
//! - this file: the slices (`Slice`, `SliceId`, whose a process is:
//!   `Owner`) and the set the watch keeps (`Slices`: what came, went or
//!   changed at each pass, `Slices::refresh`);
//! - `kinds`: each kind's slice read from its files (a container, a DRA
//!   claim, a `cuslice run` session);
//! - `classify`: which slice a host PID belongs to (namespaces, cgroups,
//!   a run process's descendants), cached;
//! - `repair`: a slice's memory segment opened for the watch to write.

mod classify;
mod kinds;
mod repair;
#[cfg(test)]
pub mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use cuslice_core::config::{self, Config};
use cuslice_core::segment::Segment;

use super::procfs::ProcSource;
use cuslice_host::container::{describe, short_id};
use cuslice_host::discover::{self, FileId, Found, PinnedSegment, Places, SESSION};
use cuslice_host::layout::{self, Layout, SliceDir};
use cuslice_host::resize::ResizeRecord;
use cuslice_host::text;

use kinds::*;
pub use repair::RepairTarget;

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

/// Whether the container record's init (PID, start time) still runs; a
/// record without one (an older hook's) is taken as live (the rule is
/// `host::container`'s, which the OCI hook follows too).
fn init_alive(p: &dyn ProcSource, init: Option<(u32, u64)>) -> bool {
    cuslice_host::container::init_alive(init, |pid| p.stat(pid))
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
