//! The segments as they are now: the memory and GPU segments and the GPU
//! memory pools, opened read-only by core's `shm` (the last component
//! never followed, never blocking), kept mapped between passes for the
//! watch ([`Maps`]) or opened afresh for a display's reading
//! ([`read_gpu`], [`read_pools`]). A mapping whose file was truncated
//! under it reads zeros: it is never reused, and a reading taken through
//! it is void ([`void_if_truncated`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use cuslice_core::gpu::{self as coregpu, GpuSegment, MAX_PROCS, PROC_FREE};
use cuslice_core::pool::{EntryView, Pool};
use cuslice_core::segment::Segment;

use super::nvml::NvmlTimes;
use super::{fd_file_id, file_id};
use cuslice_host::fs::Dir;
use cuslice_host::text::{self, LINE_MAX, clean};

/// A segment kept mapped between passes, with the file it maps.
struct Mapped<T> {
    seg: T,
    id: (u64, u64),
    used: u64,
}

/// A segment whose file can be truncated under its mapping.
pub trait Voidable {
    fn truncated(&self) -> bool;
}

impl Voidable for Segment {
    fn truncated(&self) -> bool {
        Segment::truncated(self)
    }
}

impl Voidable for GpuSegment {
    fn truncated(&self) -> bool {
        GpuSegment::truncated(self)
    }
}

impl Voidable for Pool {
    fn truncated(&self) -> bool {
        Pool::truncated(self)
    }
}

/// Opens `path` with `open`, or reuses the mapping of the same file
/// (never one whose file was truncated under it: that one reads zeros).
/// None: there is no file at `path`.
fn mapped<'a, T: Voidable>(
    cache: &'a mut HashMap<PathBuf, Mapped<T>>,
    path: &Path,
    pass: u64,
    open: impl Fn(&Path) -> Result<T, String>,
) -> Option<Result<&'a T, String>> {
    let id = file_id(path)?;
    if cache
        .get(path)
        .is_none_or(|m| m.id != id || m.seg.truncated())
    {
        match open(path) {
            Ok(seg) => {
                cache.insert(
                    path.to_path_buf(),
                    Mapped {
                        seg,
                        id,
                        used: pass,
                    },
                );
            }
            Err(e) => {
                cache.remove(path);
                return Some(Err(e));
            }
        }
    }
    let m = cache.get_mut(path)?;
    m.used = pass;
    Some(Ok(&m.seg))
}

pub fn open_mem(p: &Path) -> Result<Segment, String> {
    Segment::open_read_only(p).map_err(|e| e.to_string())
}

pub fn open_pool(p: &Path) -> Result<Pool, String> {
    Pool::open_read_only(p).map_err(|e| e.to_string())
}

pub fn open_gpu(p: &Path) -> Result<GpuSegment, String> {
    GpuSegment::open_read_only(p).map_err(|e| e.to_string())
}

/// Segments of one kind kept mapped between passes, by path: each reused
/// while its path leads to the same file, untruncated.
pub struct Cache<T> {
    map: HashMap<PathBuf, Mapped<T>>,
    open: fn(&Path) -> Result<T, String>,
}

impl<T: Voidable> Cache<T> {
    fn new(open: fn(&Path) -> Result<T, String>) -> Cache<T> {
        Cache {
            map: HashMap::new(),
            open,
        }
    }

    /// The segment at `path`, used at pass `pass` (None: no file there).
    pub fn get(&mut self, path: &Path, pass: u64) -> Option<Result<&T, String>> {
        mapped(&mut self.map, path, pass, self.open)
    }

    fn forget_unused(&mut self, pass: u64) {
        self.map.retain(|_, m| m.used + 8 > pass);
    }
}

/// The watch's mappings: memory segments, GPU segments and memory pools.
/// One not used for 8 passes is let go
/// ([`forget_unused`](Self::forget_unused)).
pub struct Maps {
    pub mem: Cache<Segment>,
    pub gpu: Cache<GpuSegment>,
    pub pools: Cache<Pool>,
}

impl Default for Maps {
    fn default() -> Maps {
        Maps {
            mem: Cache::new(open_mem),
            gpu: Cache::new(open_gpu),
            pools: Cache::new(open_pool),
        }
    }
}

impl Maps {
    /// Lets go of the mappings not used in the 8 passes up to `pass`.
    pub fn forget_unused(&mut self, pass: u64) {
        self.mem.forget_unused(pass);
        self.gpu.forget_unused(pass);
        self.pools.forget_unused(pass);
    }
}

/// A reading of a segment that was truncated while it was read holds
/// zeros where the file was: an error, not figures.
pub fn void_if_truncated<T>(r: T, truncated: bool, path: &Path) -> Result<T, String> {
    if truncated {
        Err(format!(
            "{}: the file was truncated while it was read",
            path.display()
        ))
    } else {
        Ok(r)
    }
}

/// A process entry in use in a GPU segment.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    pub slot: usize,
    /// The index of its tenant's entry.
    pub tenant: usize,
    /// As the process sees itself.
    pub pid: u32,
    /// GPU time charged for it as an upper bound so far (`Proc::bound_ns`).
    pub bound_ns: u64,
    /// Whether the kernel's lock says its process is alive (liveness from
    /// the entry's lock, not from the counters: only the shim sweeps dead
    /// processes, and observers write nothing).
    pub alive: bool,
}

/// The process entries in use in `g` of the tenants `of` keeps (by the
/// index of their entry), in slot order; only theirs are looked at.
pub fn entries(g: &GpuSegment, of: impl Fn(usize) -> bool) -> Vec<Entry> {
    let mut out = vec![];
    for i in 0..MAX_PROCS {
        let Some(e) = g.proc_entry(i) else { break };
        if e.state.load(Ordering::Acquire) == PROC_FREE {
            continue;
        }
        let tenant = e.tenant.load(Ordering::Relaxed) as usize;
        if !of(tenant) {
            continue;
        }
        out.push(Entry {
            slot: i,
            tenant,
            pid: e.pid.load(Ordering::Relaxed),
            bound_ns: e.bound_ns.load(Ordering::Relaxed),
            alive: g.proc_alive(i),
        });
    }
    out
}

/// One GPU segment, read whole (for the displays).
pub struct GpuRead {
    pub uuid: String,
    pub path: PathBuf,
    /// (device, inode) of the file, to find the processes that map it.
    pub file: Option<(u64, u64)>,
    pub handovers: u64,
    /// Each tenant with the PIDs of its live processes.
    pub tenants: Vec<(coregpu::TenantView, Vec<u32>)>,
    /// The live process entries.
    pub procs: Vec<Entry>,
    /// NVML's time for the entries whose upper-bound charge grew since
    /// the previous reading. Err: why NVML cannot say.
    pub nvml: Result<NvmlTimes, String>,
}

impl GpuRead {
    /// What entry `p` had charged as an upper bound at this reading (0:
    /// not there then, or another process in its slot), `p` being of a
    /// later reading.
    pub fn bound_before(&self, p: &Entry) -> u64 {
        self.procs
            .iter()
            .find(|q| q.slot == p.slot && q.pid == p.pid)
            .map_or(0, |q| q.bound_ns.min(p.bound_ns))
    }
}

/// The GPU segment at `path`, opened afresh: its tenants (names escaped:
/// the tenants write them) and its live process entries.
pub fn read_gpu(path: &Path) -> Result<GpuRead, String> {
    let g = open_gpu(path)?;
    let procs: Vec<Entry> = entries(&g, |_| true)
        .into_iter()
        .filter(|e| e.alive)
        .collect();
    let mut pids: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for r in &procs {
        pids.entry(r.tenant).or_default().push(r.pid);
    }
    Ok(GpuRead {
        // A file in a directory every tenant can write.
        uuid: path
            .file_stem()
            .map(|s| clean(&s.to_string_lossy()))
            .unwrap_or_default(),
        path: path.to_path_buf(),
        file: fd_file_id(g.raw_fd()),
        handovers: g.sched().handovers.load(Ordering::Relaxed),
        tenants: g
            .tenants()
            .into_iter()
            .map(|mut t| {
                let p = pids.remove(&t.index).unwrap_or_default();
                // Written by the tenant itself.
                t.name = clean(&t.name);
                (t, p)
            })
            .collect(),
        procs,
        nvml: Ok(NvmlTimes::default()),
    })
    .and_then(|r| void_if_truncated(r, g.truncated(), path))
}

/// The names in the directory at `path` (a place given, or the layout's:
/// links on the way to it followed), none if it cannot be listed.
fn listed(path: &Path) -> Vec<std::ffi::OsString> {
    Dir::open(path).and_then(|d| d.list()).unwrap_or_default()
}

/// The files of `dirs` named `*.<ext>`, sorted.
fn files_in(dirs: &[PathBuf], ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = dirs
        .iter()
        .flat_map(|d| listed(d).into_iter().map(move |n| d.join(n)))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

/// Every GPU segment in `dirs` (`<uuid>.seg`), read; each one that could
/// not be read a line of `errors`.
pub fn read_gpus(dirs: &[PathBuf], errors: &mut Vec<String>) -> Vec<GpuRead> {
    let mut gpus = vec![];
    for p in files_in(dirs, "seg") {
        match read_gpu(&p) {
            Ok(g) => gpus.push(g),
            Err(e) => errors.push(text::clean_to(&e, LINE_MAX)),
        }
    }
    gpus
}

/// Per GPU UUID, the entries of its memory pools in `dirs`
/// (`<uuid>.memory`, one per directory); each pool that could not be
/// read a line of `errors`. Every entry is tenant-writable: shown, never
/// judged.
pub fn read_pools(dirs: &[PathBuf], errors: &mut Vec<String>) -> Vec<(String, Vec<EntryView>)> {
    let mut pools = vec![];
    for p in files_in(dirs, "memory") {
        match Pool::open_read_only(&p) {
            Ok(pool) => pools.push((
                p.file_stem()
                    .map(|s| clean(&s.to_string_lossy()))
                    .unwrap_or_default(),
                pool.entries(),
            )),
            Err(e) => errors.push(text::clean_to(&e.to_string(), LINE_MAX)),
        }
    }
    pools
}
