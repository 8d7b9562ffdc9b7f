//! The memory segments as they are now, with what their slices' files
//! say: where to look ([`Sources`]: the slices `host::discover` finds, as
//! the watch finds them, or the segments given), each segment read
//! through its pinned directory ([`read_mem`]), its tenant and slice tag
//! from its quota file, what the hook recorded, its last resize.
//!
//! Every string here that a tenant wrote or could have written is
//! escaped by [`clean`] where it is read.

use std::collections::BTreeMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use cuslice_core::config::{self, format_uuid};
use cuslice_core::segment::{MAX_DEVICES, UNLIMITED};
use serde::Serialize;

use super::fd_file_id;
use super::segments::void_if_truncated;
use cuslice_host::container::{self, ContainerMeta, short_id};
use cuslice_host::discover::{self, Found, PinnedSegment, Places};
use cuslice_host::fs::{Dir, Kind};
use cuslice_host::layout::{self, Layout, MEMORY_SEGMENT, QUOTA_FILE, SliceKind};
use cuslice_host::resize::{self, ResizeRecord};
use cuslice_host::text::clean;

/// Where to look.
#[derive(Debug, Clone)]
pub struct Sources {
    /// Directories of the per-GPU scheduling segments.
    pub gpu_dirs: Vec<PathBuf>,
    /// Memory segment files given (`--memory-segment`): only those.
    memory: Vec<PathBuf>,
    /// Else: the slices (containers, DRA claims) under the hook's root, as
    /// `cuslice watch` finds them; and where `cuslice watch` last wrote its
    /// state (`<root>/watch/state.json`).
    places: Places,
}

impl Sources {
    /// The GPU segment directory given, else `$CUSLICE_GPU_SEGMENT_DIR`,
    /// else both the hook's and the shim's default; the memory segments
    /// given, else (found afresh at every reading, see
    /// [`memory_files`](Self::memory_files)) those under the containers
    /// root given (and the claims beside it) or the hook's root.
    pub fn resolve(
        gpu_dir: Option<PathBuf>,
        memory: Vec<PathBuf>,
        root: Option<PathBuf>,
    ) -> Sources {
        let gpu_dirs = match gpu_dir.or_else(|| {
            // Empty counts as unset, as for the shim.
            std::env::var_os("CUSLICE_GPU_SEGMENT_DIR")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from)
        }) {
            Some(d) => vec![d],
            // The hook's host directory (containers) and the local default.
            None => vec![
                Layout::default().gpu_dir(),
                PathBuf::from(config::DEFAULT_GPU_SEGMENT_DIR),
            ],
        };
        let places = match root {
            Some(r) => Places::with_containers_dir(&r),
            None => Places::new(Layout::default()),
        };
        Sources {
            gpu_dirs,
            memory,
            places,
        }
    }

    /// Whether memory segments were given: then only those are read, and
    /// one that is not there is an error.
    pub fn given(&self) -> bool {
        !self.memory.is_empty()
    }

    /// The host's layout, where the watch and the health source publish.
    pub fn layout(&self) -> &Layout {
        self.places.layout()
    }

    /// The memory segments: those given, else the slices' as the host
    /// file layer's discovery finds them (`host::discover`, which the
    /// watch uses too): every container's under the containers root,
    /// every DRA claim's beside it, those of programs started by `cuslice
    /// run` (in `$XDG_RUNTIME_DIR`, else `$TMPDIR`, else /tmp); and the
    /// default segment directory's. Looked for at every reading: `top` and
    /// the exporter see containers come and go. Below the directory listed
    /// no link is followed, and a segment is listed only where it is a
    /// regular file itself.
    pub fn memory_files(&self) -> Vec<MemFile> {
        if !self.memory.is_empty() {
            return self.memory.iter().map(|p| MemFile::given(p)).collect();
        }
        let slices = self
            .places
            .containers()
            .into_iter()
            .chain(self.places.claims())
            // Programs started by `cuslice run` (its private directories,
            // where `run` puts them from this environment: the layout's
            // run base).
            .chain(discover::runs_in(&layout::run_base_here()));
        let mut mem: Vec<MemFile> = slices
            .filter(Found::has_segment)
            .map(MemFile::Slice)
            .collect();
        // Where a process without a quota file keeps its segment: the
        // shim's `CUSLICE_SEGMENT_DIR` (empty counts as unset), else the
        // default.
        let local = std::env::var_os("CUSLICE_SEGMENT_DIR")
            .filter(|d| !d.is_empty())
            .map_or_else(|| PathBuf::from(config::DEFAULT_SEGMENT_DIR), PathBuf::from)
            .join(MEMORY_SEGMENT);
        let local = MemFile::given(&local);
        if local.is_segment() {
            mem.push(local);
        }
        mem
    }
}

/// A memory segment to read. Everything above it is opened through the
/// host file layer, no link followed; the segment itself by core's `shm`
/// through its directory's descriptor (its last component not followed,
/// never blocking). Its quota file and record are in the directory above
/// its own.
#[derive(Debug)]
pub enum MemFile {
    /// A slice's, found by the discovery: `segment/memory.seg` in its
    /// directory, read as the discovery reads a slice of its kind.
    Slice(Found),
    /// One named on the command line (or the local default): `rel` below
    /// `base` (as given: links on the way to it followed).
    Given { base: PathBuf, rel: PathBuf },
}

impl MemFile {
    #[cfg(test)]
    fn at(base: &Path, rel: PathBuf) -> MemFile {
        MemFile::Given {
            base: base.to_path_buf(),
            rel,
        }
    }

    /// A segment named on the command line (or the local default): below
    /// the directory above its own, as given.
    fn given(path: &Path) -> MemFile {
        let up = path.parent().and_then(Path::parent);
        let (base, rel) = match up.and_then(|u| Some((u, path.strip_prefix(u).ok()?))) {
            Some((u, rel)) if !u.as_os_str().is_empty() => (u.to_path_buf(), rel.to_path_buf()),
            _ => (PathBuf::from("."), path.to_path_buf()),
        };
        MemFile::Given { base, rel }
    }

    /// Its path, as opened and shown.
    fn path(&self) -> PathBuf {
        match self {
            MemFile::Slice(f) => f.paths.memory_segment(),
            MemFile::Given { base, rel } => base.join(rel),
        }
    }

    /// Whether it is there: a regular file itself, every directory on the
    /// way below `base` a directory itself (a link is not followed).
    fn is_segment(&self) -> bool {
        match self {
            MemFile::Slice(f) => f.has_segment(),
            MemFile::Given { .. } => self.find().is_some_and(|st| Kind::File.matches(st.st_mode)),
        }
    }

    /// Whether it is not there (went away since it was found).
    pub fn gone(&self) -> bool {
        match self {
            MemFile::Slice(f) => !f.has_segment(),
            MemFile::Given { .. } => self.find().is_none(),
        }
    }

    fn find(&self) -> Option<libc::stat> {
        let MemFile::Given { base, rel } = self else {
            return None;
        };
        let base = Dir::open(base).ok()?;
        base.open_path_beneath(rel).ok().map(|(_, st)| st)
    }

    /// Its own directory, opened through the layer (no link on the way
    /// below `base`) and held, the segment to be opened from it: so that
    /// the directory checked is the one read (a run directory's owner
    /// could swap a link in between otherwise).
    fn pinned(&self) -> Result<PinnedSegment, String> {
        let (base, rel) = match self {
            MemFile::Slice(f) => return f.segment(None),
            MemFile::Given { base, rel } => (base, rel),
        };
        let (Some(dir), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Err(format!(
                "{}: not a segment file's path",
                self.path().display()
            ));
        };
        let d = Dir::open(base)
            .and_then(|b| b.open_dir_beneath(dir))
            .map_err(|e| e.to_string())?;
        Ok(PinnedSegment::at(d, name))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ContainerView {
    pub segment: String,
    /// The tenant its processes register as (its quota file's `tenant`).
    pub tenant: String,
    /// Its quota file's slice tag (not shown): with `tenant`, the GPU
    /// segment entry that is its.
    #[serde(skip)]
    pub tag: u64,
    pub container: Option<ContainerMeta>,
    /// Its last resize (`cuslice resize`), while its quota file still
    /// holds what that resize wrote.
    pub resize: Option<ResizeRecord>,
    pub devices: Vec<DeviceView>,
    pub processes: Vec<ProcessView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DeviceView {
    pub uuid: String,
    /// None: no quota (usage is still counted).
    pub limit_bytes: Option<u64>,
    /// The guarantee below the quota (None: none).
    pub guarantee_bytes: Option<u64>,
    pub used_bytes: u64,
    pub peak_bytes: u64,
    pub refused: u64,
    /// Over a quota its last resize lowered: the seconds left of the
    /// resize's grace before `cuslice watch` applies its policy (0: over).
    pub grace_left_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProcessView {
    pub pid: u32,
    pub alive: bool,
    pub started_unix: u64,
    /// GPU UUID -> bytes.
    pub used_bytes: BTreeMap<String, u64>,
}

/// One memory segment, read.
pub struct MemRead {
    pub view: ContainerView,
    /// Why its resize record could not be read (a line of the errors).
    pub resize_error: Option<String>,
    pub file: Option<(u64, u64)>,
    /// What runs there where no container record says more: `container
    /// <id>` (the hook's layout) or `DRA claim <uid>` (the DRA plugin's).
    pub origin: Option<String>,
}

/// What owns a memory segment: its tenant name and slice tag, what the
/// hook recorded, where it comes from (see [`segment_owner`]).
type Owner = ((String, u64), Option<ContainerMeta>, Option<String>);

/// The tenant of the memory segment `seg` (`<dir>/segment/memory.seg`):
/// the `tenant` and slice tag of its quota file (`<dir>/etc/quota.toml`
/// for a container, `<dir>/quota.toml` for a container of an older hook,
/// a DRA claim or a `cuslice run` session: `host::layout`), else the name the shim derives from
/// the segment directory (and no slice); what the hook recorded in a
/// container's `<dir>/container.json`; and where it comes from (a
/// container, a DRA claim).
fn segment_owner(seg: &MemFile) -> Owner {
    let path = seg.path();
    let seg_dir = path.parent().unwrap_or(Path::new("/"));
    let default = || (config::default_tenant(seg_dir), 0);
    let tenant = |q: Result<config::Config, String>| {
        q.map(|c| (c.tenant_name(), c.slice_tag()))
            .unwrap_or_else(|_| default())
    };
    let ((name, tag), meta, origin) = match seg {
        // Read as the watch reads a slice of its kind (`host::discover`):
        // a container's and a claim's files ours, a session's its user's,
        // no record in a session's directory.
        MemFile::Slice(f) => {
            let id = clean(&f.name);
            let origin = match f.kind {
                SliceKind::Container => Some(format!("container {}", short_id(&id))),
                SliceKind::Claim => {
                    // The pods the claim is reserved for, from the
                    // plugin's record.
                    let pods: Vec<String> = f
                        .claim_record()
                        .map(|r| r.pods.iter().take(4).map(|p| clean(p)).collect())
                        .unwrap_or_default();
                    Some(if pods.is_empty() {
                        format!("DRA claim {}", short_id(&id))
                    } else {
                        format!("pod {} (DRA claim {})", pods.join(", "), short_id(&id))
                    })
                }
                SliceKind::Run => None,
            };
            let meta = f.record().ok().flatten();
            (tenant(f.quota()), meta, origin)
        }
        // A segment named on the command line, or the local default
        // (/dev/shm/cuslice, where any user may plant files beside it):
        // its quota file the directory's owner's, a record ours.
        MemFile::Given { base, rel } => {
            let up = rel.parent().and_then(Path::parent);
            let owner = up.and_then(|u| Dir::open(base).ok()?.open_dir_beneath(u).ok());
            let uid = owner
                .as_ref()
                .and_then(|d| cuslice_host::sys::fstat(d.as_fd()).ok())
                .map(|st| st.st_uid);
            let q = match (&owner, uid) {
                (Some(d), Some(uid)) => {
                    let whose = Some((uid, "the directory's"));
                    // Whatever slice's it is, its quota file is where the
                    // layout has a container's: in its quota directory
                    // where it has one (a claim's or a session's never
                    // has), else beside its segment directory.
                    layout::open_quota_dir(d, SliceKind::Container, whose).and_then(|q| {
                        container::read_quota(q.dir.as_fd(), &q.dir.join(QUOTA_FILE), whose)
                    })
                }
                _ => Err(String::new()),
            };
            let ours = Some((cuslice_host::sys::euid(), "our"));
            let meta = owner
                .as_ref()
                .and_then(|d| container::read_record(d, ours).ok().flatten());
            (tenant(q), meta, None)
        }
    };
    ((clean(&name), tag), meta.map(|m| m.for_display()), origin)
}

/// A slice's last resize, while its quota file holds what it wrote, and
/// for each GPU over a quota it lowered the grace left; or why its record
/// could not be read.
fn resized(mem: &MemFile, devices: &mut [DeviceView]) -> (Option<ResizeRecord>, Option<String>) {
    let MemFile::Slice(f) = mem else {
        return (None, None);
    };
    let mut r = match f.resize() {
        Ok(Some(r)) => r,
        Ok(None) => return (None, None),
        Err(e) => return (None, Some(e)),
    };
    let Some(q) = f.quota().ok().filter(|q| r.applies_to(q)) else {
        return (None, None);
    };
    // A session's record is its user's: what it says is shown escaped.
    for c in &mut r.changes {
        c.entry = clean(&c.entry);
        c.field = clean(&c.field);
    }
    let now = resize::now_unix();
    for d in devices.iter_mut() {
        let over = d.limit_bytes.is_some_and(|l| d.used_bytes > l);
        if let (true, Ok(uuid)) = (over, config::parse_uuid(&d.uuid)) {
            d.grace_left_seconds = r.grace_on(&q, &uuid).map(|until| (until - now).max(0.0));
        }
    }
    (Some(r), None)
}

pub fn read_mem(mem: &MemFile) -> Result<MemRead, String> {
    let path = &mem.path();
    // From its pinned directory, without following a link.
    let s = mem.pinned()?.open(false)?;
    let mut uuids = BTreeMap::new();
    let mut devices = vec![];
    for d in 0..MAX_DEVICES {
        if let Some(u) = s.device_usage(d) {
            let uuid = format_uuid(&u.uuid);
            uuids.insert(d, uuid.clone());
            devices.push(DeviceView {
                uuid,
                limit_bytes: (u.limit != UNLIMITED).then_some(u.limit),
                guarantee_bytes: (u.guarantee != 0 && u.guarantee < u.limit).then_some(u.guarantee),
                used_bytes: u.used,
                peak_bytes: u.peak,
                refused: u.refused,
                grace_left_seconds: None,
            });
        }
    }
    let processes = s
        .processes()
        .into_iter()
        .map(|p| ProcessView {
            pid: p.pid,
            alive: p.alive,
            started_unix: p.started,
            used_bytes: p
                .used
                .iter()
                .enumerate()
                .filter(|(_, b)| **b > 0)
                .map(|(d, b)| {
                    (
                        uuids
                            .get(&d)
                            .cloned()
                            .unwrap_or_else(|| format!("device-{d}")),
                        *b,
                    )
                })
                .collect(),
        })
        .collect();
    let ((tenant, tag), container, origin) = segment_owner(mem);
    void_if_truncated((), s.truncated(), path)?;
    let (resize, resize_error) = resized(mem, &mut devices);
    Ok(MemRead {
        resize_error,
        view: ContainerView {
            segment: clean(&path.display().to_string()),
            tenant,
            tag,
            container,
            resize,
            devices,
            processes,
        },
        file: fd_file_id(s.raw_fd()),
        origin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cuslice_core::segment::Segment;

    /// A segment found in a run directory whose owner then swaps the
    /// segment's directory for a link to another slice's (a race an
    /// attacker's review won 20 times in 80): the reading goes through the
    /// directory that was checked, or fails; it never shows the other's.
    #[test]
    fn a_segment_is_read_through_the_directory_checked_not_one_swapped_in() {
        let t = std::env::temp_dir().join(format!("cuslice-status-pin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let make = |dir: &Path, limit: u64| {
            std::fs::create_dir_all(dir).expect("mkdir");
            let s = Segment::open_or_create(&dir.join(MEMORY_SEGMENT)).expect("segment");
            s.register_device(&[7; 16], limit).expect("device");
        };
        make(&t.join("run/segment"), 1 << 30);
        make(&t.join("victim/segment"), 7_777_777_777);
        let mem = MemFile::at(&t, PathBuf::from("run/segment").join(MEMORY_SEGMENT));
        assert!(mem.is_segment());
        // Read while pinned: the directory checked is the one read, even
        // with the swap made between the open of the directory and of the
        // file.
        let pinned = mem.pinned().expect("pinned");
        std::fs::rename(t.join("run/segment"), t.join("run/old")).expect("move away");
        std::os::unix::fs::symlink(t.join("victim/segment"), t.join("run/segment")).expect("link");
        let s = pinned.open(false).expect("through the pinned directory");
        assert_eq!(s.device_usage(0).map(|u| u.limit), Some(1 << 30));
        drop(pinned);
        // After the swap, a new reading refuses the link.
        let e = read_mem(&mem).err().expect("a link on the way is refused");
        assert!(e.contains("symlink") || e.contains("symbolic link"), "{e}");
        let _ = std::fs::remove_dir_all(&t);
    }
}
