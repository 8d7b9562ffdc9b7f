//! What the host holds now: the segments (memory and GPU segments, the
//! GPUs' memory pools), what NVML says of each GPU and its processes, and
//! what `/proc` says of a process. The one place the command reads them:
//! `cuslice watch` (its observe step, `watch::observe`) and the displays
//! (`view`: `status`, `top`, the exporter) both read through a
//! [`Readings`], and judge or show what it read; nothing here judges,
//! shows or writes.
//!
//! - [`segments`]: the segments opened read-only by core's `shm` (the last
//!   component not followed, never blocking), kept mapped between the
//!   watch's passes or read afresh for a display, a reading through a
//!   truncated file void; a GPU segment's process entries.
//! - [`memory`]: where the displays look for memory segments (the slices
//!   `host::discover` finds, as the watch does), each read through its
//!   pinned directory with what its slice's files say.
//! - [`nvml`]: NVML's per-process samples, process listings and memory,
//!   asked as little as can be.
//! - [`procs`]: a process's command line, open files and exit state.
//!
//! Trust: a segment and a pool are tenant-writable. Nothing here waits
//! on a lock a tenant can take (segments are opened without blocking; a
//! process entry's liveness is a test of its lock, not a wait), and
//! nothing here decides on a number a tenant could write: the watch's
//! judge checks each against NVML or root's own files, and the displays
//! show them as read, escaped.

pub mod memory;
pub mod nvml;
pub mod procs;
pub mod segments;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use cuslice_core::gpu::monotonic_ns;
use cuslice_core::pool::EntryView;

use cuslice_host::gpu::health::view as health;
use cuslice_host::gpu::nvml::{DeviceHandle, GpuInfo, GpuProcess, Nvml};
use cuslice_host::text::{self, LINE_MAX};
use cuslice_host::watch_state;
use memory::{MemRead, Sources, read_mem};
use nvml::{Listings, NvmlTimes, Sampled, Sampler};
use procs::holds_open;
use segments::{Entry, GpuRead, Maps};

/// (device, inode) of the file at `p` (a link followed).
pub fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// (device, inode) of the file behind `raw` (a segment's descriptor):
/// the file read, whatever its name leads to by now.
pub fn fd_file_id(raw: i32) -> Option<(u64, u64)> {
    // SAFETY: a segment's descriptor, live while the segment is (the
    // caller holds it).
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(raw) };
    cuslice_host::sys::fstat(fd)
        .ok()
        .map(|st| (st.st_dev, st.st_ino))
}

/// This host's name (empty where it has none).
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `len` bytes into our buffer.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let n = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

/// Reads the host, keeping what saves reads and what the next look
/// needs: NVML (or why it is not there), its sampling state per GPU, the
/// last process listings, and the segments the watch keeps mapped.
pub struct Readings {
    nvml: Result<Nvml, String>,
    sampler: Sampler,
    listings: Listings,
    /// The segments kept mapped between passes (the watch's).
    pub maps: Maps,
}

/// Everything a display reads at one time ([`Readings::take`]).
pub struct Reading {
    /// CLOCK_MONOTONIC (ns) when it was taken.
    pub at: u64,
    pub gpus: Vec<GpuRead>,
    pub mems: Vec<MemRead>,
    /// Per GPU UUID, the entries of its memory pools (one per GPU segment
    /// directory).
    pub pools: Vec<(String, Vec<EntryView>)>,
    pub nvml: Result<Vec<GpuInfo>, String>,
    /// Every GPU's health (None without NVML).
    pub health: Option<health::View>,
    pub errors: Vec<String>,
}

impl Readings {
    /// Over `nvml` (Err: why it is not there; the segments are still
    /// read).
    pub fn new(nvml: Result<Nvml, String>) -> Readings {
        Readings {
            nvml,
            sampler: Sampler::default(),
            listings: Listings::default(),
            maps: Maps::default(),
        }
    }

    /// GPU `d`'s per-process SM samples since the previous look (`cap`:
    /// the buffer to start with), not yet recorded as a look
    /// ([`keep_samples`](Self::keep_samples)).
    pub fn samples(&self, d: &DeviceHandle, cap: usize) -> Result<Sampled, String> {
        let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
        self.sampler.take(nvml, d, cap)
    }

    /// No samples of GPU `d`, for a look that failed: its sampling period
    /// as known.
    pub fn no_samples(&self, d: &DeviceHandle) -> Sampled {
        self.sampler.none(d)
    }

    /// Records `s` as GPU `d`'s look: the next starts where it ends.
    pub fn keep_samples(&mut self, d: &DeviceHandle, s: &Sampled) {
        self.sampler.keep(d, s);
    }

    /// GPU `d`'s processes at pass `pass` (see [`Listings::processes`]).
    pub fn processes(
        &mut self,
        d: &DeviceHandle,
        pass: u64,
        cap: usize,
        s: &Sampled,
    ) -> Result<Vec<GpuProcess>, String> {
        let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
        self.listings.processes(nvml, d, pass, cap, &s.samples)
    }

    /// GPU `d`'s memory (bytes; asked once).
    pub fn memory_total(&mut self, d: &DeviceHandle) -> Result<u64, String> {
        let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
        self.listings.memory_total(nvml, d)
    }

    /// Everything the displays show, read afresh from `src`: the GPU
    /// segments and pools in its directories, its memory segments, NVML's
    /// GPUs, the time NVML gives the entries charged an upper bound since
    /// `prev` (the previous reading), every GPU's health. What could not
    /// be read is a line of the reading's errors (escaped).
    pub fn take(&mut self, src: &Sources, prev: Option<&Reading>) -> Reading {
        let mut errors = vec![];
        let mut gpus = segments::read_gpus(&src.gpu_dirs, &mut errors);
        let pools = segments::read_pools(&src.gpu_dirs, &mut errors);
        let mut mems = vec![];
        let given = src.given();
        for m in src.memory_files() {
            match read_mem(&m) {
                Ok(mut m) => {
                    errors.extend(m.resize_error.take().map(|e| text::clean_to(&e, LINE_MAX)));
                    mems.push(m);
                }
                // A segment found by looking that went away meanwhile (its
                // container or program ended) is no error.
                Err(_) if !given && m.gone() => {}
                Err(e) => errors.push(text::clean_to(&e, LINE_MAX)),
            }
        }
        let nvml = match &self.nvml {
            Ok(n) => n.gpus(),
            Err(e) => Err(e.clone()),
        };
        let devices = match &self.nvml {
            Ok(n) => n.devices(),
            Err(e) => Err(e.clone()),
        };
        let mut mem_files: HashMap<(String, u64), Vec<(u64, u64)>> = HashMap::new();
        for m in &mems {
            if let Some(f) = m.file {
                mem_files
                    .entry((m.view.tenant.clone(), m.view.tag))
                    .or_default()
                    .push(f);
            }
        }
        for g in &mut gpus {
            g.nvml = self.nvml_times(g, &devices, &mem_files, prev);
        }
        let health = match (&self.nvml, &devices) {
            (Ok(n), Ok(d)) => Some(health::view(src.layout(), n, d, watch_state::now_unix())),
            _ => None,
        };
        Reading {
            at: monotonic_ns(),
            gpus,
            mems,
            pools,
            nvml,
            health,
            errors,
        }
    }

    /// NVML's SM time over the interval since the previous reading
    /// (`prev`) of the processes behind `g`'s entries whose upper-bound
    /// charge grew (see `GpuRead::nvml`). A process NVML lists is behind
    /// an entry if it sees itself by the entry's PID, holds `g`'s segment
    /// open and, where memory segments of the entry's tenant are known
    /// (`mem_files`, by tenant name and slice tag), one of those; an entry
    /// two processes could be behind (containers of one tenant each with
    /// its PID 1) is left unchecked.
    fn nvml_times(
        &mut self,
        g: &GpuRead,
        devices: &Result<Vec<DeviceHandle>, String>,
        mem_files: &HashMap<(String, u64), Vec<(u64, u64)>>,
        prev: Option<&Reading>,
    ) -> Result<NvmlTimes, String> {
        let nvml = self.nvml.as_ref().map_err(Clone::clone)?;
        let d = devices
            .as_ref()
            .map_err(Clone::clone)?
            .iter()
            .find(|d| d.uuid == g.uuid)
            .ok_or_else(|| format!("NVML lists no GPU {}", g.uuid))?;
        let s = self.sampler.take(nvml, d, 64)?;
        self.sampler.keep(d, &s);
        // The first look only finds where NVML's samples stand.
        let Some(before) = prev
            .filter(|_| s.last > 0)
            .and_then(|p| p.gpus.iter().find(|x| x.uuid == g.uuid))
        else {
            return Ok(NvmlTimes::default());
        };
        let grew: Vec<&Entry> = g
            .procs
            .iter()
            .filter(|p| p.bound_ns > before.bound_before(p))
            .collect();
        // Periods lost from NVML's buffer are not taken for idle: scaling
        // what is there can only overstate a process, and an upper bound
        // is never raised.
        let window_ns = s.window.map_or(0, |(a, b)| (b - a).saturating_mul(1000));
        if grew.is_empty() || window_ns == 0 {
            return Ok(NvmlTimes::default());
        }
        let mut busy: HashMap<u32, u64> = HashMap::new();
        for x in &s.samples {
            *busy.entry(x.pid).or_default() += u64::from(x.sm.min(100)) * s.period * 10;
        }
        let seg: Vec<(u64, u64)> = g.file.into_iter().collect();
        // Each listed process with the PID it sees itself by.
        let listed: Vec<(u32, Option<u32>)> = nvml
            .processes(d, 64)?
            .iter()
            .map(|h| (h.pid, cuslice_host::proc::inner_pid(h.pid)))
            .collect();
        let mut out = HashMap::new();
        for p in grew {
            let mem = g
                .tenants
                .iter()
                .find(|(t, _)| t.index == p.tenant)
                .and_then(|(t, _)| mem_files.get(&(t.name.clone(), t.tag)));
            let behind: Vec<u32> = listed
                .iter()
                .filter(|&&(h, inner)| {
                    inner == Some(p.pid)
                        && holds_open(h, &seg)
                        && mem.is_none_or(|m| holds_open(h, m))
                })
                .map(|&(h, _)| h)
                .collect();
            if let [h] = behind[..] {
                out.insert(p.slot, busy.get(&h).copied().unwrap_or(0));
            }
        }
        Ok(NvmlTimes {
            window_ns,
            by_slot: out,
        })
    }
}
