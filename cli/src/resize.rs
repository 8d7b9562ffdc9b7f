//! `cuslice resize TARGET [--memory SIZE] [--compute PCT] [--compute-max
//! PCT] [--device all|UUID] [--grace DURATION]`: changes the limits of a
//! running slice (a container, a DRA claim, a `cuslice run` session).
//!
//! In this order, each through the host file layer (whole files renamed
//! into place, no link followed, modes kept):
//!
//! 1. the record of the resize, `resize.json` in the slice's directory
//!    (`host::resize`): what changed, when, the grace; first, so that a
//!    watch that sees the new quota file finds its record with it;
//! 2. the quota file the watch restores from, only the fields given
//!    changed, checked by the grammar the shim loads it with (a
//!    container's in its quota directory, which the OCI hook mounts at
//!    `/etc/cuslice`: the processes it starts from now on read the new
//!    file); for a DRA claim, then each of its containers' copies of it
//!    (what their shims read, likewise mounted), the same text;
//! 3. the memory segment's entries the new memory quota applies to (by
//!    UUID): admission and `cuMemGetInfo` read the entry, so running
//!    processes see the new quota at their next allocation or query;
//! 4. the slice's tenant entries in the GPU segments (share, ceiling),
//!    which every process's scheduler reads;
//! 5. where the OCI hook set the driver's own memory limit on a
//!    container's cgroup (`driver_memory_limit` "set: ..."), the new one,
//!    and the container's record.
//!
//! Steps 3 and 4 take the segment's whole-file lock, which a tenant can
//! take and keep (issue 41 H3: a kept lock hung the resize, the quota file
//! and record already written): each waits at most 2 s for it, then
//! writes all the same (a few atomic stores, sound without the lock: see
//! `Shm::with_flock_or_without`) and says so in one line naming the file
//! and the holder. Every step is applied, in this order, and the resize
//! exits 0.
//!
//! Who may: root for a container or a claim (their files are root's,
//! under the hook's root); root or the session's own user for a session
//! (its files are the user's: root resizes one as that user, so every file
//! written stays the user's and nothing the user could not write is
//! written).
//!
//! Which entry of the quota file a field is changed in: `--device all`
//! `[all]` (a GPU's own entry keeps its value), `--device UUID` that GPU's
//! entry (made where missing, from what `[all]` gave it). Without
//! `--device`: `[all]` where it gives the field and no GPU's own entry
//! does; the one GPU entry that gives it where `[all]` does not (a DRA
//! claim's file names its GPU by UUID); otherwise refused (say which with
//! `--device`). Refused too: a field given by index anywhere in the file (which
//! GPU an index is depends on each process's `CUDA_VISIBLE_DEVICES`; the
//! segments know GPUs by UUID), and a limit the slice's processes never
//! registered (a memory quota where it has none, a share where it has
//! none: they cannot take one on while they run).
//!
//! A container made by an older OCI hook had its quota file mounted as a
//! file (`<root>/containers/<id>/quota.toml`, `host::layout`): that file
//! is rewritten all the same (the watch and `status` read it), but the
//! container's mount still shows the file it was created with, so the
//! processes it starts later read the old quota until it is recreated;
//! the resize says so in a line.

use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use cuslice_core::config::{self, Config, Limits};
use cuslice_core::gpu::GpuSegment;
use cuslice_core::segment::{READY_STATE, Segment, UNLIMITED};

use crate::host::container::short_id;
use crate::host::discover::{self, Found, Places, SESSION};
use crate::host::fs::Dir;
use crate::host::layout::{self, CONTAINER_RECORD, Layout, QUOTA_FILE, SliceKind};
use crate::host::resize::{self as record, Change, ResizeRecord};
use crate::host::{proc, text};
use crate::limits;

#[derive(clap::Args)]
pub struct ResizeArgs {
    /// What to resize: a container (its id, or a unique prefix of it as
    /// `cuslice status` shows it, or `container:ID`), a Kubernetes DRA claim
    /// (`claim:UID`, or `claim:NAMESPACE/NAME`; an operator's override: the
    /// claim itself is immutable), or a `cuslice run` session (`run:PID`, or
    /// PID: its `cuslice run` process or any process of it).
    pub target: String,
    /// New memory quota per GPU: 4GiB, 4096MiB, 4g, 512m or bytes.
    #[arg(long)]
    pub memory: Option<String>,
    /// New guaranteed share of GPU time, percent (30 or 30%).
    #[arg(long)]
    pub compute: Option<String>,
    /// New ceiling on GPU time, percent.
    #[arg(long)]
    pub compute_max: Option<String>,
    /// Which entry of the quota file to change: `all` ([all], every GPU
    /// without an entry of its own) or a GPU's UUID (its own entry).
    /// Default: [all] where it alone gives the field, else the one GPU
    /// entry that gives it (a DRA claim's); several: say which.
    #[arg(long)]
    pub device: Option<String>,
    /// With --memory: how long `cuslice watch` leaves a tenant over its
    /// lowered quota to its shim (which refuses every new allocation above
    /// it at once) before its policy applies: 30s (default), 500ms, 2m, 0;
    /// at most 1h.
    #[arg(long)]
    pub grace: Option<String>,
    /// The hook's host directory, where containers and claims are.
    #[arg(long, default_value = layout::DEFAULT_ROOT)]
    pub root: PathBuf,
}

/// `--grace`: a duration as `--memory-wait` takes one ("30s", "500ms",
/// "2m", "0"; at most an hour), in seconds.
pub fn parse_grace(s: &str) -> Result<f64, String> {
    config::parse_wait(s)
        .map(|ms| ms as f64 / 1000.0)
        .map_err(|e| format!("--grace {s:?}: {e}"))
}

/// The entry a resize changes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// `[all]`, named with `--device all` (a GPU's own entry then keeps
    /// its value), or no `--device` (`plan` picks per field: `[all]`, or
    /// the one GPU entry that gives the field).
    All { named: bool },
    /// `[device."GPU-..."]`.
    Gpu([u8; 16]),
}

impl Entry {
    fn parse(device: Option<&str>) -> Result<Entry, String> {
        let Some(d) = device.map(str::trim) else {
            return Ok(Entry::All { named: false });
        };
        if d == "all" {
            return Ok(Entry::All { named: true });
        }
        if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!(
                "--device {d}: a GPU by index cannot be resized live (CUDA numbers each process's GPUs after its CUDA_VISIBLE_DEVICES; the segments know GPUs by UUID): give its UUID (nvidia-smi -L), or all"
            ));
        }
        config::parse_uuid(d)
            .map(Entry::Gpu)
            .map_err(|e| format!("--device {d:?}: expected all or a GPU's UUID: {e}"))
    }

    /// Its name in the record.
    fn record_name(&self) -> String {
        match self {
            Entry::All { .. } => record::ALL.to_string(),
            Entry::Gpu(u) => record::device_entry(u),
        }
    }
}

/// A limit field: its key in the quota file and its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Memory,
    Compute,
    ComputeMax,
}

impl Field {
    fn key(self) -> &'static str {
        self.limit().key()
    }

    fn flag(self) -> &'static str {
        match self {
            Field::Memory => "--memory",
            Field::Compute => "--compute",
            Field::ComputeMax => "--compute-max",
        }
    }

    fn of(self, l: &Limits) -> Option<u64> {
        self.limit().of(l)
    }

    /// The quota file's limit it is.
    fn limit(self) -> config::LimitKey {
        match self {
            Field::Memory => config::LimitKey::Memory,
            Field::Compute => config::LimitKey::Compute,
            Field::ComputeMax => config::LimitKey::ComputeMax,
        }
    }

    /// What applies to the GPUs of an entry whose limits are `l`: a share
    /// given by its ceiling alone is the ceiling.
    fn effective(self, l: &Limits) -> Option<u64> {
        match self {
            Field::Compute => l.compute.or(l.compute_max).map(u64::from),
            _ => self.of(l),
        }
    }

    /// Whether the slice's processes registered this kind of limit where
    /// `l` applies: a memory quota, or a share or ceiling.
    fn registered(self, l: &Limits) -> bool {
        match self {
            Field::Memory => l.memory.is_some(),
            Field::Compute | Field::ComputeMax => l.compute.is_some() || l.compute_max.is_some(),
        }
    }
}

/// The fields given, validated as `run`'s flags are: (field, value).
fn given(a: &ResizeArgs) -> Result<Vec<(Field, u64)>, String> {
    let l = limits::Limits {
        memory: a.memory.clone(),
        compute: a.compute.clone(),
        compute_max: a.compute_max.clone(),
        ..limits::Limits::default()
    };
    let (_, table) = limits::to_quota(&l, &limits::FLAGS)?;
    let mut out = vec![];
    for f in [Field::Memory, Field::Compute, Field::ComputeMax] {
        if let Some(v) = f.of(&table) {
            out.push((f, v));
        }
    }
    if out.is_empty() {
        return Err("nothing to resize: give --memory, --compute or --compute-max".into());
    }
    if a.grace.is_some() && a.memory.is_none() {
        return Err(
            "--grace: only applies with --memory (the time a tenant over a lowered memory quota is given)"
                .into(),
        );
    }
    Ok(out)
}

/// A slice found, and what is needed to write it.
struct Target {
    found: Found,
    /// For messages: `container 3f2a9c8b7d6e (web-1)`, `DRA claim
    /// team-a/trainer (0b1c2d3e-000)`, `cuslice run 4242`.
    label: String,
    /// A session's user (uid, gid): the files are theirs.
    user: Option<(u32, u32)>,
}

/// The slices a target matched.
type Matched = Vec<Target>;

/// The containers under `places` whose id is `want` or starts with it
/// (an exact id alone where there is one).
fn containers(places: &Places, want: &str) -> Matched {
    let all = places.containers();
    let exact = all.iter().any(|f| f.name == want);
    all.into_iter()
        .filter(|f| {
            if exact {
                f.name == want
            } else {
                f.name.starts_with(want)
            }
        })
        .map(|f| {
            let rec = f.record().ok().flatten();
            let label = match rec
                .as_ref()
                .filter(|m| m.name.is_some() || m.image.is_some())
            {
                Some(m) => format!(
                    "container {} ({})",
                    text::clean(&short_id(&f.name)),
                    crate::host::container::describe(m)
                ),
                None => format!("container {}", text::clean(&short_id(&f.name))),
            };
            Target {
                found: f,
                label,
                user: None,
            }
        })
        .collect()
}

/// The DRA claims whose UID is `want` or starts with it, or (with a `/`)
/// whose namespace/name is `want`.
fn claims(places: &Places, want: &str) -> Matched {
    let all = places.claims();
    let exact = all.iter().any(|f| f.name == want);
    all.into_iter()
        .filter(|f| {
            if want.contains('/') {
                f.claim_record()
                    .and_then(|r| r.namespaced_name())
                    .is_some_and(|n| n == want)
            } else if exact {
                f.name == want
            } else {
                f.name.starts_with(want)
            }
        })
        .map(|f| {
            let shown = text::clean(&short_id(&f.name));
            let label = match f.claim_record().and_then(|r| r.namespaced_name()) {
                Some(n) => format!("DRA claim {} ({shown})", text::clean(&n)),
                None => format!("DRA claim {shown}"),
            };
            Target {
                found: f,
                label,
                user: None,
            }
        })
        .collect()
}

/// The `cuslice run` process `pid` is or runs under (its parent chain:
/// `run` is a child subreaper, so every process of the session is its
/// descendant); None: no such process, or none of its ancestors is one.
fn run_process_of(pid: u32) -> Option<u32> {
    let mut cur = pid;
    for _ in 0..4096 {
        let st = proc::stat(cur)?;
        // Another user's executable cannot be read (its `exe` link needs
        // ptrace access): its command line then says, so that the user is
        // told the session is not theirs (nothing is read or written).
        let argv = proc::cmdline(cur);
        let exe = proc::exe_name(cur).or_else(|| {
            argv.first()
                .and_then(|a| Path::new(a).file_name())
                .map(|n| n.to_string_lossy().into_owned())
        });
        if exe.as_deref() == Some("cuslice") && argv.get(1).map(String::as_str) == Some("run") {
            return Some(cur);
        }
        if st.ppid <= 1 {
            return None;
        }
        cur = st.ppid;
    }
    None
}

/// The session of the `cuslice run` process `run`: its directory found
/// as the watch finds it (the one it holds open, named for its PID as it
/// sees itself, in its `$XDG_RUNTIME_DIR`, else `$TMPDIR`, else /tmp),
/// opened from its base without following a link and checked to be the
/// run process's user's.
fn session(run: u32) -> Result<Target, String> {
    let label = format!("cuslice run {run}");
    let inner = proc::inner_pid(run).unwrap_or(run);
    let env = |k: &str| proc::environ(run, k).filter(|v| !v.is_empty());
    let base = layout::run_base(|k| env(k).map(OsString::from));
    if !base.is_absolute() {
        return Err(format!(
            "{label}: its runtime directory {} is not an absolute path",
            base.display()
        ));
    }
    let uid = proc::uid(run).ok_or_else(|| format!("{label}: cannot read its user"))?;
    let me = crate::host::sys::euid();
    if me != 0 && me != uid {
        return Err(format!(
            "{label}: the session is uid {uid}'s: only that user or root may resize it"
        ));
    }
    let in_root = proc::in_root(run, &base);
    let same = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let id = |q: &Path| std::fs::metadata(q).ok().map(|m| (m.dev(), m.ino()));
        p == base || id(&proc::in_root(run, p)).is_some_and(|i| id(&in_root) == Some(i))
    };
    let names: Vec<OsString> = proc::fd_paths(run)
        .into_iter()
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| layout::is_run_dir_of(n, inner))
                && d.parent().is_some_and(same)
        })
        .filter_map(|d| d.file_name().map(OsString::from))
        .collect();
    let [name] = names.as_slice() else {
        return Err(format!(
            "{label}: no run directory {}* among its open files (a session started without limits has no quota to resize)",
            base.join(layout::run_name_prefix(inner)).display()
        ));
    };
    let found = discover::run(&in_root, name, &base.join(name), Some(uid))?;
    let gid = found
        .dir
        .as_ref()
        .ok()
        .and_then(|d| crate::host::sys::fstat(d.as_fd()).ok())
        .map(|st| st.st_gid)
        .ok_or_else(|| format!("{label}: cannot stat its directory"))?;
    Ok(Target {
        found,
        label,
        user: Some((uid, gid)),
    })
}

/// The slice `target` names (see [`ResizeArgs::target`]); one line naming
/// what matched where it is none or several.
fn resolve(places: &Places, target: &str) -> Result<Target, String> {
    let t = target.trim();
    let pid_session = |s: &str| -> Result<Option<Target>, String> {
        let Ok(pid) = s.parse::<u32>() else {
            return Err(format!("{target:?}: expected run:PID"));
        };
        match run_process_of(pid) {
            Some(run) => session(run).map(Some),
            None => Ok(None),
        }
    };
    let mut matched: Matched = if let Some(id) = t.strip_prefix("container:") {
        containers(places, id)
    } else if let Some(c) = t.strip_prefix("claim:") {
        claims(places, c)
    } else if let Some(p) = t.strip_prefix("run:") {
        pid_session(p)?.into_iter().collect()
    } else if t.is_empty() {
        vec![]
    } else {
        let mut m = containers(places, t);
        m.extend(claims(places, t));
        if t.bytes().all(|b| b.is_ascii_digit()) {
            m.extend(pid_session(t)?);
        }
        m
    };
    match matched.len() {
        1 => Ok(matched.remove(0)),
        0 => Err(format!(
            "{target:?}: matches no container in {}, no DRA claim in {} and no cuslice run process (targets: a container id or its prefix, claim:UID, claim:NAMESPACE/NAME, run:PID)",
            places.containers_dir().display(),
            places.layout().claims_dir().display()
        )),
        _ => Err(format!(
            "{target:?}: matches {}: say which",
            matched
                .iter()
                .map(|m| m.label.clone())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Makes this process the session's user for good: every file it writes
/// from now on is theirs, and it can write nothing they could not.
fn become_user(uid: u32, gid: u32) -> Result<(), String> {
    // SAFETY: setgroups with no groups, setresgid/setresuid with plain
    // ids: no pointers but a null list of length 0.
    let ok = unsafe {
        libc::setgroups(0, std::ptr::null()) == 0
            && libc::setresgid(gid, gid, gid) == 0
            && libc::setresuid(uid, uid, uid) == 0
    };
    if !ok {
        return Err(format!(
            "cannot become uid {uid} (gid {gid}), the session's user: {}",
            std::io::Error::last_os_error()
        ));
    }
    // A change of user makes the process undumpable, and its own
    // /proc/self/fd root's: the pinned directories are reached there.
    // SAFETY: prctl(PR_SET_DUMPABLE, 1) takes no pointers.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
    Ok(())
}

/// The changes `fields` make to the quota file `quota` (path `shown`) at
/// `entry`: the file changed in place, and what changed (a field already
/// at its value is left out).
fn plan(
    quota: &mut config::QuotaEdit,
    entry: &Entry,
    fields: &[(Field, u64)],
    shown: &Path,
    label: &str,
) -> Result<Vec<Change>, String> {
    let old = quota.config().clone();
    let mut changes = vec![];
    for &(f, to) in fields {
        let by_index: Vec<String> = old
            .by_index
            .iter()
            .filter(|(_, l)| f.of(l).is_some())
            .map(|(i, _)| format!("[device.{i}]"))
            .collect();
        if !by_index.is_empty() {
            return Err(format!(
                "{}: {} is given by index in {}: cuslice resize cannot tell which GPU that is to the slice's processes (CUDA numbers each process's GPUs after its CUDA_VISIBLE_DEVICES; the segments know GPUs by UUID)",
                shown.display(),
                f.key(),
                by_index.join(", ")
            ));
        }
        // The entry for this field: as named, else `[all]` where it gives
        // the field and no GPU's own entry does, else the one GPU entry
        // that gives it.
        let own: Vec<[u8; 16]> = old
            .by_uuid
            .iter()
            .filter(|(_, l)| f.registered(l))
            .map(|(u, _)| *u)
            .collect();
        let listed = |v: &[[u8; 16]]| {
            v.iter()
                .map(|u| format!("[device.\"{}\"]", config::format_uuid(u)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let entry = match entry {
            Entry::All { named: false } if !f.registered(&old.all) && own.len() == 1 => {
                Entry::Gpu(own[0])
            }
            Entry::All { named: false } if !own.is_empty() => {
                return Err(format!(
                    "{}: {} is given per GPU in {}{}: say which entry with --device (all, or a GPU's UUID)",
                    shown.display(),
                    f.key(),
                    listed(&own),
                    if f.registered(&old.all) {
                        " as well as in [all]"
                    } else {
                        ""
                    }
                ));
            }
            e => e.clone(),
        };
        let entry = &entry;
        let (limits, from) = match entry {
            Entry::All { .. } => (old.all, f.effective(&old.all)),
            Entry::Gpu(u) => {
                let l = old.limits_for(u32::MAX, u);
                (l, f.effective(&l))
            }
        };
        if !f.registered(&limits) {
            let what = match f {
                Field::Memory => "no memory quota",
                _ => "no compute share or ceiling",
            };
            let on = match entry {
                Entry::All { .. } => "for every GPU ([all])".to_string(),
                Entry::Gpu(u) => format!("on GPU {}", config::format_uuid(u)),
            };
            return Err(format!(
                "{label} has {what} {on}: its processes registered none, and cannot take one on while they run ({} {})",
                f.flag(),
                shown.display()
            ));
        }
        if from == Some(to) {
            continue;
        }
        let to_entry = match entry {
            Entry::All { .. } => config::LimitsEntry::All,
            Entry::Gpu(u) => config::LimitsEntry::Gpu(*u),
        };
        quota
            .set(to_entry, f.limit(), to)
            .map_err(|e| e.to_string())?;
        changes.push(Change {
            entry: entry.record_name(),
            field: f.key().to_string(),
            from,
            to,
        });
    }
    Ok(changes)
}

/// Writes the new memory quota into the segment's entries it applies to
/// (by UUID; entries without a quota, or not registered, left alone).
/// Returns a line per entry written, and per GPU now over its quota; and
/// whether one is.
fn write_segment(t: &Target, new: &Config, gpu_dir: &Path) -> Result<(Vec<String>, bool), String> {
    if !t.found.has_segment() {
        return Ok((
            vec![
                "memory segment: none yet (no process of it has used CUDA): its processes register the new quota".into(),
            ],
            false,
        ));
    }
    let owner = t.user.map(|(uid, _)| (uid, SESSION));
    let pinned = t.found.segment(owner)?;
    let shown = t.found.paths.memory_segment();
    let seg = Segment::open_existing(pinned.path()).map_err(|e| {
        e.to_string()
            .replace(&*pinned.path().to_string_lossy(), &shown.to_string_lossy())
    })?;
    let mut out = vec![];
    let mut over = false;
    for r in seg.raw_devices() {
        if r.state != READY_STATE || r.limit == UNLIMITED {
            continue;
        }
        let l = new.limits_for(u32::MAX, &r.uuid);
        let Some(want) = l.memory_limit() else {
            continue;
        };
        let uuid = config::format_uuid(&r.uuid);
        // A tenant keeping the segment's lock: root waits at most 2 s,
        // then writes all the same (`Segment::resize_device`), said.
        let kept = |b: Option<cuslice_core::shm::LockBusy>| {
            b.map(|mut b| {
                b.path = shown.clone();
                format!("memory segment: written without its lock: {b}")
            })
        };
        if want != r.limit {
            let busy = seg
                .resize_device(r.index, want)
                .map_err(|e| e.to_string())?;
            out.push(format!(
                "memory segment: GPU {uuid} quota {} (was {})",
                config::format_size(want),
                config::format_size(r.limit)
            ));
            out.extend(kept(busy));
        }
        // A tenant that may burst: its guarantee, here and in the GPU's
        // memory pool.
        let guarantee = l.memory.filter(|g| *g < want).unwrap_or(0);
        let had = seg
            .device(r.index)
            .map_or(0, |d| d.guarantee.load(Ordering::Acquire));
        if guarantee != had {
            let busy = seg
                .set_guarantee(r.index, guarantee)
                .map_err(|e| e.to_string())?;
            out.push(format!(
                "memory segment: GPU {uuid} guarantee {} (was {})",
                shown_guarantee(guarantee, want),
                shown_guarantee(had, r.limit)
            ));
            out.extend(kept(busy));
        }
        let used = seg.device_usage(r.index).map_or(r.used, |u| u.used);
        out.extend(write_pool(gpu_dir, new, &r.uuid, guarantee, want, used)?);
        if used > want {
            over = true;
            out.push(format!(
                "GPU {uuid}: {:.2} GiB in use, over the new quota: every new allocation above it is refused from now on",
                used as f64 / (1u64 << 30) as f64
            ));
        }
    }
    if seg.truncated() {
        return Err(format!(
            "{}: the file was truncated while it was written",
            shown.display()
        ));
    }
    Ok((out, over))
}

/// A guarantee as status shows it: none below the quota is the quota.
fn shown_guarantee(g: u64, limit: u64) -> String {
    config::format_size(if g == 0 { limit } else { g })
}

/// Writes the slice's new guarantee and most into its entry in the GPU
/// `uuid`'s memory pool in `gpu_dir` (no entry: none of its processes
/// uses that GPU; they join with the new values; an entry lingering after
/// its last process keeps the new guarantee for the rest of its linger).
/// Use past a lowered guarantee becomes burst there at once, whether the
/// pool had room or not: the operator's resize is what the host goes by.
fn write_pool(
    gpu_dir: &Path,
    new: &Config,
    uuid: &[u8; 16],
    guarantee: u64,
    limit: u64,
    used: u64,
) -> Result<Vec<String>, String> {
    let Ok(d) = Dir::open(gpu_dir) else {
        return Ok(vec![]);
    };
    let file = cuslice_core::pool::path(Path::new(""), uuid);
    let file = file.to_string_lossy();
    let via = PathBuf::from(format!("/proc/self/fd/{}", d.as_fd().as_raw_fd())).join(&*file);
    if via.symlink_metadata().is_err() {
        return Ok(vec![]);
    }
    let shown = gpu_dir.join(&*file);
    let pool = cuslice_core::pool::Pool::open_existing(&via).map_err(|e| {
        e.to_string()
            .replace(&*via.to_string_lossy(), &shown.to_string_lossy())
    })?;
    let (name, tag) = (new.tenant_name(), new.slice_tag());
    let Some(v) = pool
        .entries()
        .into_iter()
        .find(|e| e.name == name && e.tag == tag)
    else {
        return Ok(vec![]);
    };
    let g = if guarantee == 0 { limit } else { guarantee };
    // A lingering entry (no process) holds no burst: its memory went with
    // its processes, whatever the segment still counts of them.
    let need = if v.procs == 0 {
        0
    } else {
        used.saturating_sub(g)
    };
    // A raised guarantee is reserved as far as the pool has room, the
    // rest pending (never over-admitted); without the pool's lock.
    // The room counted against NVML's memory, not the file's.
    let capacity = crate::host::nvml::Nvml::open()
        .and_then(|n| {
            let text = config::format_uuid(uuid);
            let d = n
                .devices()?
                .into_iter()
                .find(|d| config::parse_uuid(&d.uuid).is_ok_and(|u| u == *uuid))
                .ok_or_else(|| format!("NVML lists no GPU {text}"))?;
            n.memory_total(&d)
        })
        .unwrap_or(0);
    pool.resize_entry(v.index, g, limit, need, capacity);
    Ok((v.guarantee != g)
        .then(|| {
            format!(
                "GPU memory pool {}: guarantee {} (was {})",
                shown.display(),
                config::format_size(g),
                config::format_size(v.guarantee)
            )
        })
        .into_iter()
        .collect())
}

/// Writes the new share and ceiling into the slice's tenant entries in
/// the GPU segments of `gpu_dir` (of every GPU, or of `only`'s). A GPU
/// whose segment holds no entry of the tenant is left alone: none of its
/// processes uses it.
fn write_gpu_segments(
    gpu_dir: &Path,
    new: &Config,
    only: Option<&[[u8; 16]]>,
) -> Result<Vec<String>, String> {
    let Ok(d) = Dir::open(gpu_dir) else {
        return Ok(vec![format!(
            "GPU segments: none in {} yet: its processes register the new share",
            gpu_dir.display()
        )]);
    };
    let (name, tag) = (new.tenant_name(), new.slice_tag());
    let mut out = vec![];
    for file in d.list().map_err(String::from)? {
        let Some(stem) = Path::new(&file)
            .file_stem()
            .filter(|_| Path::new(&file).extension().is_some_and(|x| x == "seg"))
        else {
            continue;
        };
        let Ok(uuid) = config::parse_uuid(&stem.to_string_lossy()) else {
            continue;
        };
        if only.is_some_and(|o| !o.contains(&uuid)) {
            continue;
        }
        let Some(spec) = new.tenant_spec(u32::MAX, &uuid) else {
            continue;
        };
        // Through the directory held open: its last component is opened
        // by core without following a link.
        let via = PathBuf::from(format!("/proc/self/fd/{}", d.as_fd().as_raw_fd())).join(&file);
        let shown = gpu_dir.join(&file);
        let g = GpuSegment::open_existing(&via).map_err(|e| {
            e.to_string()
                .replace(&*via.to_string_lossy(), &shown.to_string_lossy())
        })?;
        // Only the slice's own entry, never a new one; the segment's
        // lock waited for at most 2 s, then written without it, said.
        let (found, busy) = g.update_tenant(&name, tag, spec);
        let Some((_, before)) = found else {
            continue;
        };
        if g.truncated() {
            return Err(format!(
                "{}: the file was truncated while it was written",
                shown.display()
            ));
        }
        if let Some((share, max)) = before {
            out.push(format!(
                "GPU segment {}: share {}% ceiling {} (was {share}% {})",
                shown.display(),
                spec.share,
                ceiling(spec.max),
                ceiling(max)
            ));
        }
        if let Some(mut b) = busy {
            b.path = shown;
            out.push(format!("GPU segment: written without its lock: {b}"));
        }
    }
    Ok(out)
}

fn ceiling(max: u32) -> String {
    if max >= 100 {
        "none".into()
    } else {
        format!("{max}%")
    }
}

/// The line a resize adds for a container made by an older OCI hook
/// (`label`), whose quota file is mounted as a file.
fn legacy_note(label: &str) -> String {
    format!(
        "note: {label} was made by an older cuslice oci-hook, which mounted its quota file as a file: the processes it starts from now on still read the quota it was created with (its memory segment holds them to the new memory quota, with a warning; `cuslice watch` puts back their share); recreate the container for them to read the new file"
    )
}

/// Writes `text` (the claim's resized quota file) over the copy of it in
/// the claim's container `ctr` (its quota directory, mounted at
/// `/etc/cuslice`: what the container's processes started from now on
/// read), its mode kept. The lines to show.
fn write_claim_copy(ctr: &Found, text: &str) -> Result<Vec<String>, String> {
    let q = ctr.quota_file()?;
    // The mode the OCI hook gives a container's quota file.
    q.dir.replace_file(QUOTA_FILE, text.as_bytes(), 0o444)?;
    let label = format!("container {}", text::clean(&short_id(&ctr.name)));
    let mut out = vec![format!(
        "{}: written ({label}'s copy of the claim's quota file)",
        q.shown.display()
    )];
    if q.legacy {
        out.push(legacy_note(&label));
    }
    Ok(out)
}

/// The containers whose records name claim `uid`.
fn claim_containers(places: &Places, uid: &str) -> Vec<Found> {
    places
        .containers()
        .into_iter()
        .filter(|f| {
            f.record()
                .ok()
                .flatten()
                .is_some_and(|m| m.claim.as_deref() == Some(uid))
        })
        .collect()
}

/// Where the OCI hook set the driver's own memory limit on a container's
/// cgroup (its record says `set: ... on <cgroup>`), sets the new quota
/// there on every GPU it applies to (as the hook does) and writes what
/// became of it into the record. A line saying what was done; Err only
/// where the record cannot be read or written (a driver that refuses is
/// said in the line and the record, as by the hook: the shim enforces the
/// quota either way).
fn driver_limit(ctr: &Found, new: &Config) -> Result<Option<String>, String> {
    let Ok(d) = ctr.dir.as_ref() else {
        return Ok(None);
    };
    let text = d.read_checked(
        CONTAINER_RECORD,
        Some((crate::host::sys::euid(), "our")),
        crate::host::container::RECORD_MAX,
    )?;
    let shown = ctr.paths.record().unwrap_or_default();
    // As JSON values: a field this version does not know is kept.
    let mut rec: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a container record: {e}", shown.display()))?;
    let Some(cgroup) = rec
        .get("driver_memory_limit")
        .and_then(|v| v.as_str())
        .and_then(|s| s.strip_prefix("set: "))
        .and_then(|s| s.split_once(" on "))
        .map(|(_, dir)| dir.to_string())
    else {
        return Ok(None);
    };
    let outcome = crate::host::nvml::Nvml::open()
        .and_then(|nvml| nvml.set_quota_limits(new, &cgroup))
        .unwrap_or_else(|e| format!("failed: {e}"));
    rec["driver_memory_limit"] = serde_json::Value::String(outcome.clone());
    let json = serde_json::to_string(&rec).map_err(|e| e.to_string())?;
    d.replace_file(CONTAINER_RECORD, (json + "\n").as_bytes(), 0o644)?;
    Ok(Some(format!(
        "driver memory limit of {}: {}",
        text::clean(&short_id(&ctr.name)),
        text::clean(&outcome)
    )))
}

/// `cuslice resize`: what was done, a line each.
pub fn resize(a: &ResizeArgs) -> Result<Vec<String>, String> {
    let fields = given(a)?;
    let grace = match &a.grace {
        Some(g) => parse_grace(g)?,
        None => record::DEFAULT_GRACE_SECONDS,
    };
    let entry = Entry::parse(a.device.as_deref())?;
    let me = crate::host::sys::euid();
    let places = Places::new(Layout::new(&a.root));
    let t = resolve(&places, &a.target).map_err(|e| {
        if me != 0 && !a.target.starts_with("run:") {
            format!("{e} (resizing a container or a claim needs root: its files are root's)")
        } else {
            e
        }
    })?;
    let label = t.label.clone();
    if t.found.kind == SliceKind::Container
        && let Some(uid) = t.found.record().ok().flatten().and_then(|m| m.claim)
    {
        return Err(format!(
            "{label} is a container of DRA claim {}: resize the claim (claim:{}), whose quota all its containers share",
            text::clean(&short_id(&uid)),
            text::clean(&uid)
        ));
    }
    // A session's files are its user's: root writes them as that user
    // (`session` let no other user this far).
    if let Some((uid, gid)) = t.user
        && me == 0
        && uid != 0
    {
        become_user(uid, gid)?;
    }
    let dir = t.found.dir.as_ref().map_err(Clone::clone)?;
    // Where its quota file is: a container's in its quota directory (or
    // where an older hook put it), a claim's or a session's in its
    // directory.
    let quota = t.found.quota_file()?;
    let shown = quota.shown.clone();
    let text_before = t.found.quota_text()?;
    let mut quota_edit =
        config::QuotaEdit::parse(&shown, &text_before).map_err(|e| e.to_string())?;
    let changes = plan(&mut quota_edit, &entry, &fields, &shown, &label)?;
    if changes.is_empty() {
        return Ok(vec![format!(
            "{label}: nothing to change: {} already as given",
            shown.display()
        )]);
    }
    let comment = match quota_edit.comment() {
        Some(c) => format!("{c}; resized by `cuslice resize`"),
        None => "resized by `cuslice resize`".to_string(),
    };
    let (text_after, new) = quota_edit
        .render(&comment)
        .map_err(|e| format!("the resized quota file would not load: {e}"))?;
    let rec = ResizeRecord {
        at_unix: record::now_unix(),
        grace_seconds: grace,
        by_uid: me,
        changes,
    };
    let mut out = vec![format!("{label}: {}", rec.describe())];
    // A claim's containers: the copies of its quota file and the
    // driver's limits to write.
    let members = match t.found.kind {
        SliceKind::Claim => claim_containers(&places, &t.found.name),
        SliceKind::Container | SliceKind::Run => vec![],
    };
    // 1. The record, then 2. the quota file (its mode kept).
    rec.write(dir)?;
    let mode = quota
        .dir
        .stat(QUOTA_FILE)
        .map(|st| st.st_mode & 0o7777)
        .map_err(String::from)?;
    quota
        .dir
        .replace_file(QUOTA_FILE, text_after.as_bytes(), mode)?;
    out.push(format!("{}: written", shown.display()));
    if quota.legacy {
        out.push(legacy_note(&label));
    }
    // A claim's containers' copies, which their shims read.
    for m in &members {
        out.extend(write_claim_copy(m, &text_after)?);
    }
    let memory = rec.changes.iter().any(|c| c.field == "memory");
    let compute = rec.changes.iter().any(|c| c.field != "memory");
    // 3. The memory segment.
    let mut over = false;
    // The GPU segments and memory pools: the hook's for a container or a
    // claim, the session's own (as its file names it) for a session.
    let gpu_dir = match t.found.kind {
        SliceKind::Run => new.gpu_segment_dir.clone(),
        _ => places.layout().gpu_dir(),
    };
    if memory {
        let (lines, o) = write_segment(&t, &new, &gpu_dir)?;
        out.extend(lines);
        over = o;
    }
    // 4. The GPU segments.
    if compute {
        // Every GPU's where a share for all changed, else those named.
        let named: Vec<[u8; 16]> = rec
            .changes
            .iter()
            .filter(|c| c.field != "memory")
            .filter_map(|c| config::parse_uuid(c.entry.strip_prefix("device.")?).ok())
            .collect();
        let all = rec
            .changes
            .iter()
            .any(|c| c.field != "memory" && c.entry == record::ALL);
        out.extend(write_gpu_segments(
            &gpu_dir,
            &new,
            (!all).then_some(named.as_slice()),
        )?);
    }
    // 5. The driver's own limit on the containers' cgroups.
    if memory {
        let own = [t.found];
        let members = match own[0].kind {
            SliceKind::Container => &own[..],
            SliceKind::Claim | SliceKind::Run => &members[..],
        };
        for m in members {
            out.extend(driver_limit(m, &new)?);
        }
    }
    if over {
        out.push(format!(
            "grace: `cuslice watch` applies its policy to a GPU still over its lowered quota after {}s ({})",
            rec.grace_seconds,
            record::utc_time_of_day(rec.grace_until())
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grace_is_a_duration_as_memory_wait_takes_one() {
        assert_eq!(parse_grace("30s"), Ok(30.0));
        assert_eq!(parse_grace("500ms"), Ok(0.5));
        assert_eq!(parse_grace("2m"), Ok(120.0));
        assert_eq!(parse_grace("0"), Ok(0.0));
        assert_eq!(parse_grace("1h"), Ok(3600.0));
        for bad in ["", "-1s", "2h", "1.5s", "30", "30 potatoes"] {
            let e = parse_grace(bad).expect_err(bad);
            assert!(e.starts_with("--grace "), "{e}");
        }
    }

    fn cfg(text: &str) -> config::QuotaEdit {
        config::QuotaEdit::parse(Path::new("/r/quota.toml"), text).expect("quota")
    }

    const UUID: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";
    const G: u64 = 1 << 30;

    fn planned(
        text: &str,
        entry: &Entry,
        fields: &[(Field, u64)],
    ) -> Result<(Vec<Change>, Config), String> {
        let mut t = cfg(text);
        let p = Path::new("/r/quota.toml");
        let c = plan(&mut t, entry, fields, p, "container x")?;
        let (new, _) = t.render("c").map_err(|e| e.to_string())?;
        Ok((
            c,
            config::parse_file(p, &new).expect("renders a valid file"),
        ))
    }

    #[test]
    fn memory_for_all_gpus_changes_all_and_only_the_fields_given() {
        let all = Entry::All { named: false };
        let (c, new) = planned(
            "tenant = \"t\"\nslice = \"ctr-x\"\n[all]\nmemory = \"8GiB\"\ncompute = 30\n",
            &all,
            &[(Field::Memory, 4 * G)],
        )
        .expect("planned");
        assert_eq!(
            c,
            [Change {
                entry: "all".into(),
                field: "memory".into(),
                from: Some(8 * G),
                to: 4 * G
            }]
        );
        assert_eq!(new.all.memory, Some(4 * G));
        assert_eq!(new.all.compute, Some(30));
        assert_eq!(new.tenant.as_deref(), Some("t"));
        assert_eq!(new.slice.as_deref(), Some("ctr-x"));
        // Already so: nothing.
        let (c, _) = planned(
            "[all]\nmemory = \"8GiB\"\n",
            &all,
            &[(Field::Memory, 8 * G)],
        )
        .expect("planned");
        assert!(c.is_empty());
        // A share given by its ceiling alone: that is what it was.
        let (c, new) =
            planned("[all]\ncompute_max = 50\n", &all, &[(Field::Compute, 20)]).expect("planned");
        assert_eq!(c[0].from, Some(50));
        assert_eq!((new.all.compute, new.all.compute_max), (Some(20), Some(50)));
    }

    #[test]
    fn what_a_resize_cannot_do_live_is_one_line_naming_why() {
        let all = Entry::All { named: false };
        // No memory quota: the processes registered none.
        let e = planned("[all]\ncompute = 30\n", &all, &[(Field::Memory, G)]).expect_err("none");
        assert_eq!(
            e,
            "container x has no memory quota for every GPU ([all]): its processes registered none, and cannot take one on while they run (--memory /r/quota.toml)"
        );
        let e =
            planned("[all]\nmemory = \"1GiB\"\n", &all, &[(Field::Compute, 30)]).expect_err("none");
        assert!(
            e.contains("has no compute share or ceiling for every GPU"),
            "{e}"
        );
        // Given by index.
        let e = planned(
            "[all]\nmemory = \"1GiB\"\n[device.0]\nmemory = \"2GiB\"\n",
            &Entry::Gpu(config::parse_uuid(UUID).expect("uuid")),
            &[(Field::Memory, G)],
        )
        .expect_err("index");
        assert!(
            e.starts_with("/r/quota.toml: memory is given by index in [device.0]: "),
            "{e}"
        );
        // Per GPU too, and no entry named.
        let text = format!("[all]\nmemory = \"1GiB\"\n[device.\"{UUID}\"]\nmemory = \"2GiB\"\n");
        let e = planned(&text, &all, &[(Field::Memory, G)]).expect_err("per GPU");
        assert_eq!(
            e,
            format!(
                "/r/quota.toml: memory is given per GPU in [device.\"{UUID}\"] as well as in [all]: say which entry with --device (all, or a GPU's UUID)"
            )
        );
        // A GPU's entry alone (a DRA claim's file): that one.
        let u = config::parse_uuid(UUID).expect("uuid");
        let (c, new) = planned(
            &format!("[device.\"{UUID}\"]\nmemory = \"2GiB\"\ncompute = 50\n"),
            &all,
            &[(Field::Memory, G), (Field::Compute, 40)],
        )
        .expect("the GPU's entry");
        assert_eq!(c[0].entry, format!("device.{UUID}"));
        assert_eq!(
            (new.limits_for(0, &u).memory, new.limits_for(0, &u).compute),
            (Some(G), Some(40))
        );
        assert_eq!(new.all.memory, None);
        // Named: [all] changes, the GPU's own entry keeps its value.
        let (_, new) = planned(
            &text,
            &Entry::All { named: true },
            &[(Field::Memory, 3 * G)],
        )
        .expect("named");
        let u = config::parse_uuid(UUID).expect("uuid");
        assert_eq!(new.all.memory, Some(3 * G));
        assert_eq!(new.limits_for(0, &u).memory, Some(2 * G));
        // A tenant that may burst: --memory is its guarantee, never past
        // its memory_max (the grammar's line).
        let (_, new) = planned(
            "[all]\nmemory = \"1GiB\"\nmemory_max = \"4GiB\"\n",
            &all,
            &[(Field::Memory, 2 * G)],
        )
        .expect("a guarantee");
        assert_eq!(
            (new.all.memory, new.all.memory_max),
            (Some(2 * G), Some(4 * G))
        );
        let e = planned(
            "[all]\nmemory = \"1GiB\"\nmemory_max = \"2GiB\"\n",
            &all,
            &[(Field::Memory, 3 * G)],
        )
        .expect_err("past memory_max");
        assert!(
            e.contains("all.memory_max: expected at least the guaranteed memory"),
            "{e}"
        );
        // A ceiling below the share: the grammar's line.
        let e =
            planned("[all]\ncompute = 40\n", &all, &[(Field::ComputeMax, 30)]).expect_err("below");
        assert!(e.contains("/r/quota.toml: all"), "{e}");
        // An index given as the entry.
        let e = Entry::parse(Some("0")).expect_err("index");
        assert!(
            e.starts_with("--device 0: a GPU by index cannot be resized live"),
            "{e}"
        );
    }

    #[test]
    fn a_gpus_own_entry_is_changed_in_its_own_spelling_or_made() {
        let u = config::parse_uuid(UUID).expect("uuid");
        let lower = UUID.to_lowercase();
        let text = format!("[all]\nmemory = \"1GiB\"\n[device.\"{lower}\"]\nmemory = \"2GiB\"\n");
        let mut t = cfg(&text);
        let p = Path::new("/r/quota.toml");
        let c = plan(&mut t, &Entry::Gpu(u), &[(Field::Memory, 3 * G)], p, "x").expect("planned");
        assert_eq!(c[0].entry, format!("device.{UUID}"));
        assert_eq!(c[0].from, Some(2 * G));
        // The one entry, in its own spelling (bare: a UUID needs no quotes).
        let (new, _) = t.render("c").expect("renders");
        assert_eq!(
            new.matches("[device.").collect::<Vec<_>>().len(),
            1,
            "{new}"
        );
        assert!(
            new.contains(&format!("[device.{lower}]\nmemory = 3221225472\n")),
            "{new}"
        );
        // Made from [all] where the GPU has no entry of its own.
        let (_, new) = planned(
            "[all]\nmemory = \"1GiB\"\n",
            &Entry::Gpu(u),
            &[(Field::Memory, 3 * G)],
        )
        .expect("made");
        assert_eq!(new.limits_for(0, &u).memory, Some(3 * G));
        assert_eq!(new.all.memory, Some(G));
    }
}
