//! What NVML says now, asked as little as it can be: each GPU's
//! per-process SM samples since the previous look ([`Sampler`]: the one
//! place the look's time stamp and NVML's sampling period are kept), its
//! process listing (reused while provably current: [`Listings`]) and its
//! memory (asked once).

use std::collections::HashMap;

use cuslice_host::gpu::nvml::{
    DeviceHandle, GpuProcess, Nvml, UtilizationSample, sample_period_us, sample_window_us,
};

/// At most this many passes between two listings of a GPU's processes
/// (in between, a listing is reused while the GPU's memory in use stays
/// the same to the byte).
const FULL_LIST_EVERY: u64 = 10;

/// Per GPU (UUID): NVML's newest per-process sample time stamp seen (µs)
/// and its sampling period as seen so far (µs).
#[derive(Default)]
pub struct Sampler {
    seen: HashMap<String, (u64, u64)>,
}

/// NVML's per-process samples of a GPU since the previous look.
pub struct Sampled {
    pub samples: Vec<UtilizationSample>,
    /// The previous look's newest sample (µs; 0: no look before, or no
    /// sample then).
    pub last: u64,
    /// NVML's sampling period (µs; see `sample_period_us`).
    pub period: u64,
    /// The window the samples cover (µs; see `sample_window_us`; None:
    /// no sample).
    pub window: Option<(u64, u64)>,
}

impl Sampler {
    /// GPU `d`'s samples since the previous look (`cap`: the buffer to
    /// start with); the look is not recorded ([`keep`](Self::keep)).
    /// Err: NVML could not give them.
    pub fn take(&self, nvml: &Nvml, d: &DeviceHandle, cap: usize) -> Result<Sampled, String> {
        let last = self.seen.get(&d.uuid).map_or(0, |s| s.0);
        let samples = nvml.process_utilization(d, last, cap)?;
        Ok(self.sampled(d, samples))
    }

    /// No samples of GPU `d` (a look that failed): the period as known.
    pub fn none(&self, d: &DeviceHandle) -> Sampled {
        self.sampled(d, vec![])
    }

    fn sampled(&self, d: &DeviceHandle, samples: Vec<UtilizationSample>) -> Sampled {
        let seen = self.seen.get(&d.uuid).copied();
        let last = seen.map_or(0, |s| s.0);
        let period = sample_period_us(&samples, seen.map(|s| s.1));
        let window = sample_window_us(&samples, last, period);
        Sampled {
            samples,
            last,
            period,
            window,
        }
    }

    /// Records `s` as GPU `d`'s look: the next one starts from its newest
    /// sample (or where this one started, without a sample), with its
    /// period known.
    pub fn keep(&mut self, d: &DeviceHandle, s: &Sampled) {
        let newest = s.window.map_or(s.last, |(_, b)| b.max(s.last));
        self.seen.insert(d.uuid.clone(), (newest, s.period));
    }
}

/// A GPU's process listing and the memory in use when it was taken.
struct Listed {
    used: u64,
    pass: u64,
    procs: Vec<GpuProcess>,
    /// Each listed process's start time when listed (None: gone already):
    /// a PID reused since is not the process the listing names.
    starts: Vec<Option<u64>>,
}

/// Per GPU index: the last process listing, and its memory as NVML gave
/// it (it does not change).
#[derive(Default)]
pub struct Listings {
    listed: HashMap<u32, Listed>,
    totals: HashMap<u32, u64>,
}

/// A process's start time, from the host's `/proc`.
fn start_of(pid: u32) -> Option<u64> {
    cuslice_host::proc::stat(pid).map(|x| x.start)
}

impl Listings {
    /// GPU `d`'s processes at pass `pass`, `samples` its SM samples just
    /// taken.
    ///
    /// Listing the processes is NVML's dearest call (about 20 ms of CPU
    /// with 64 processes on an H100, measured): the last listing is
    /// reused while it is provably current, and taken again when the
    /// GPU's memory in use moved (a process started, ended, allocated or
    /// freed), a listed process ended, a process the listing lacks ran
    /// kernels, or `FULL_LIST_EVERY` passes went by. What a reuse can miss
    /// until the next full listing: a process that starts in the same
    /// interval in which listed processes free (without ending) exactly
    /// what it takes, and then neither allocates nor launches.
    pub fn processes(
        &mut self,
        nvml: &Nvml,
        d: &DeviceHandle,
        pass: u64,
        cap: usize,
        samples: &[UtilizationSample],
    ) -> Result<Vec<GpuProcess>, String> {
        let used = nvml.memory_used(d);
        let current = match (self.listed.get(&d.index), used) {
            (Some(l), Some(u)) => {
                l.used == u
                    && pass - l.pass < FULL_LIST_EVERY
                    && l.procs
                        .iter()
                        .zip(&l.starts)
                        .all(|(p, st)| start_of(p.pid) == *st)
                    && samples
                        .iter()
                        .all(|s| l.procs.iter().any(|p| p.pid == s.pid))
            }
            _ => false,
        };
        if current {
            return Ok(self.listed[&d.index].procs.clone());
        }
        match nvml.processes(d, cap) {
            Ok(p) => {
                if let Some(u) = used {
                    self.listed.insert(
                        d.index,
                        Listed {
                            used: u,
                            pass,
                            starts: p.iter().map(|q| start_of(q.pid)).collect(),
                            procs: p.clone(),
                        },
                    );
                }
                Ok(p)
            }
            Err(e) => {
                self.listed.remove(&d.index);
                Err(e)
            }
        }
    }

    /// GPU `d`'s memory (bytes): asked once (a GPU's memory does not
    /// change), and again after a failure.
    pub fn memory_total(&mut self, nvml: &Nvml, d: &DeviceHandle) -> Result<u64, String> {
        if let Some(t) = self.totals.get(&d.index) {
            return Ok(*t);
        }
        let t = nvml.memory_total(d)?;
        self.totals.insert(d.index, t);
        Ok(t)
    }
}

/// NVML's per-process SM time over its own window: from its newest sample
/// at the previous reading to its newest now.
#[derive(Debug, Default)]
pub struct NvmlTimes {
    /// The window (ns; 0: no sample since, NVML says nothing yet).
    pub window_ns: u64,
    /// Per process entry (slot): the SM time of the process behind it
    /// over the window (ns; absent: NVML lists no process found to be it).
    pub by_slot: HashMap<usize, u64>,
}
