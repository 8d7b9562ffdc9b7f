//! GPU time as the GPU spent it: CUPTI's kernel activity records.
//!
//! Under time-slicing, a process whose work is in flight is not on the GPU
//! for most of that time: a decode loop beside a trainer is in flight
//! 67-77 % of the time while its kernels run 4.5 %
//! (docs/benchmarks/2026-11-24-h100-gpu-time-signals.md). Only CUPTI's
//! kernel records say when the GPU ran a process's kernels. But recording
//! costs every launch about a microsecond (more through PyTorch: a decode
//! loop's requests took ~15 % longer while recorded,
//! docs/benchmarks/2026-11-26-h200-decode-tail.md), so the meter records
//! only where the answer can change a decision, and then in **probes**:
//!
//! - A process that launches freely on a contended GPU is charged its wall
//!   time in flight (an upper bound of its GPU time) while that bound is
//!   well under its share: it is light either way, and nothing is recorded
//!   (two light services beside each other never pay for recording).
//! - Where the bound could make it heavy (in flight at least half its
//!   share over a demand window, or a busy stretch of `NEED_BUSY_NS`), the
//!   limiter asks for a probe (`want`): the meter records kernels for
//!   `PROBE_NS`, then rests for `REST_NS` before the next. During a probe
//!   the process is charged its kernels' GPU time from the records; at its
//!   end the limiter learns the ratio of GPU time to wall time in flight
//!   (`crate::limiter::probe_end`), and until the ratio is stale it charges
//!   wall time in flight times that ratio. So recording costs a launch-bound
//!   loop a tenth of what it did; the price is that a change in a process's
//!   ratio (a decode server that turns into a batch job) is seen at the next
//!   probe, within about `PROBE_NS + REST_NS`.
//! - A steady process is probed less and less often: after a probe whose
//!   ratio agreed with the one before it (within a point or a quarter of
//!   it), the rest doubles, up to `REST_LONGEST_NS` (3.6 s). Each probe
//!   costs a launch-bound loop's requests time (re-attaching CUPTI, ~20 ms
//!   on an H100, and recording: the requests a probe fell in were the
//!   slowest); a decode server beside a trainer, 6 interleaved starts on
//!   one H100: p50 median 322 ms with a probe every second, 246 ms with
//!   lengthened rests, 252 ms for the native pair. A lengthened rest
//!   ends early (back to `REST_NS` after the probe) where the process's
//!   launches per time in flight move by more than 2x either way from the
//!   probe's (its kernels changed size: a decode loop that turns into a
//!   batch job is probed again within about `REST_NS`), or where the
//!   tenants competing for its GPU change (one starts or stops, or turns
//!   heavy or light: what its kernels get of the GPU changes with them).
//! - `CUSLICE_METER=continuous` records all the time the GPU is shared (the
//!   meter before probes, for comparisons), and while a holder alone under
//!   a ceiling does not keep the GPU fed (`want_measured`); `always`
//!   records all the time, alone too (experiments).
//! - `libcupti` is the tenant's (`CUSLICE_CUPTI=<path>`, else the one the
//!   program already loaded, else `libcupti.so.13` / `.12` / `libcupti.so`
//!   on the search path or in the CUDA installation); `CUSLICE_CUPTI=off`
//!   turns the meter off. Without it, the shim charges wall time as before
//!   (and says so once).
//! - Alone under a ceiling, a process holding the lease that does not keep
//!   the GPU fed (a launch-bound loop) is probed the same way, so that its
//!   ceiling counts its kernels' GPU time, not its hold
//!   (`crate::limiter`'s `hold_ppm`).
//! - CUPTI is loaded, and its callbacks registered, by the meter's thread
//!   the first time the process launches freely on a contended GPU, or
//!   holds the lease alone under a ceiling without keeping the GPU fed
//!   (`prepare`), not before: a process alone on its GPU otherwise never
//!   loads it (initialised, CUPTI costs every launch a little, and loading
//!   it takes milliseconds).
//! - At the program's exit, an exit handler registered when CUPTI is loaded
//!   (after the CUDA runtime's, so it runs first) has the meter's thread
//!   stop recording and detach CUPTI before the runtime destroys its
//!   contexts.
//! - A thread of ours flushes the records every `FLUSH_NS` while recording;
//!   the charges lag the GPU by about that much.
//! - The tenant's own profiler wins: when the program registers its own
//!   activity callbacks (`cuptiActivityRegisterCallbacks`, which the shim
//!   exports so that it sees the call), when a profiler is injected
//!   (`CUDA_INJECTION64_PATH`: Nsight), or when records stop coming while
//!   the process launches, the meter stops for good and the process is
//!   charged wall time again (said once, at info level).
//! - Between probes CUPTI is detached (the default under probes;
//!   `CUSLICE_METER_DETACH=0` keeps it attached; never under `continuous`
//!   or `always`): once a probe's last records are in, the meter's thread
//!   detaches CUPTI from the process (`cuptiFinalize`, after a forced
//!   flush) and, before the next probe, registers its callbacks again. Why:
//!   on an H100, a PyTorch decode loop's requests stayed ~8-11 % slower for
//!   as long as CUPTI stayed attached after its activity API had been used
//!   (recording off), and were as fast as before once `cuptiFinalize`
//!   detached it; so a launch-bound tenant, attached between probes, pays
//!   for recording all the time its GPU is shared (on the GPU, a decode
//!   server beside a trainer: p99 median 323 ms detached, 364 ms attached,
//!   332 ms for the pair without cuslice; 6 starts each, no crash). A
//!   libcupti without `cuptiFinalize` stays attached (said once).
//!   `cuptiFinalize` detaches all of CUPTI, so the meter never detaches
//!   while the program uses CUPTI itself, as far as the shim can see it:
//!   its own activity callbacks (the meter steps aside altogether, above),
//!   or CUPTI's callback API (`cuptiSubscribe`, `cuptiSubscribe_v2`) or
//!   range profiler (`cuptiProfilerInitialize`), which the shim exports
//!   too, in front of CUPTI's: from the program's first call to one, the
//!   meter keeps
//!   probing but leaves CUPTI attached between probes (said once). Each
//!   check and detach is made under the lock those calls take before they
//!   reach CUPTI, so that nothing is detached from under them. (The
//!   program's calls to these exports go on to CUPTI's functions: those the
//!   dlsym hook found where it handed ours out, as for a libcupti opened
//!   privately, else the meter's library's, else the next definitions
//!   after ours.) Not
//!   covered: a program that reaches CUPTI only through other entry points
//!   (the event and metric, PM sampling, PC sampling or SASS metrics APIs,
//!   ...) would lose its session at the next detach
//!   (`CUSLICE_METER_DETACH=0` for such a program); and NVIDIA recommends
//!   calling `cuptiFinalize` from an API exit callback, while the meter
//!   calls it from its own thread, between probes, while the program may
//!   be launching.

use std::ffi::{CStr, c_char, c_void};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::limiter::now_ns;
use crate::sys::CUcontext;

/// How often our thread flushes CUPTI's records while recording.
const FLUSH_NS: u64 = 4_000_000;
/// A probe records this long...
pub const PROBE_NS: u64 = 100_000_000;
/// ...and the next begins no sooner than this after it ended...
pub const REST_NS: u64 = 900_000_000;
/// ...doubled after each probe that measured what the one before it did
/// (a steady process: the ratio within `STEADY_PPM` or a quarter of
/// itself), up to `REST_NS << REST_MAX_SHIFT`: a steady decode loop beside a
/// trainer pays for a probe every 3.7 s instead of every second (each
/// probe's requests took ~10-25 % longer on an H100).
const REST_MAX_SHIFT: u32 = 2;
/// The longest rest between probes.
pub const REST_LONGEST_NS: u64 = REST_NS << REST_MAX_SHIFT;
/// A lengthened rest ends (back to `REST_NS` after the probe) when the
/// process's launches per unit of time in flight move by more than this
/// factor, either way, from what they were during the probe: its kernels
/// changed size (a decode loop that turned into a batch job), so the
/// probe's ratio no longer describes it. Judged over at least
/// `GUARD_WALL_NS` of time in flight.
const GUARD_FACTOR: u128 = 2;
const GUARD_WALL_NS: u64 = 50_000_000;
/// Under this much time in flight, a probe's launches per time in flight
/// are no baseline for the guard: the rest is not lengthened.
const GUARD_MIN_PROBE_WALL_NS: u64 = 10_000_000;
/// A probe begins only while the process asked for one this recently (it
/// launches, and needs it).
const WANT_FRESH_NS: u64 = 50_000_000;
/// `continuous`: recording stops this long after the process last wanted
/// it.
const IDLE_OFF_NS: u64 = 2_000_000_000;
/// The records-stopped check: over this long, a process that launched at
/// least `LOST_LAUNCHES` kernels but got no record, twice in a row, has lost
/// its callbacks to someone else.
const LOST_CHECK_NS: u64 = 200_000_000;
const LOST_LAUNCHES: u64 = 16;
/// One record buffer (CUPTI wants 8-byte alignment).
const BUFFER_BYTES: usize = 256 * 1024;
const BUFFER_ALIGN: usize = 8;
/// Recalibrate CUPTI's clock against ours this often.
const CALIBRATE_NS: u64 = 10_000_000_000;

const CUPTI_SUCCESS: i32 = 0;
const CUPTI_ERROR_MAX_LIMIT_REACHED: i32 = 12;
const CUPTI_ERROR_UNKNOWN: i32 = 999;
/// `cuptiActivityFlushAll`'s flag: buffers holding incomplete records too.
const CUPTI_ACTIVITY_FLAG_FLUSH_FORCED: u32 = 1;
const KIND_KERNEL: u32 = 3;
const KIND_CONCURRENT_KERNEL: u32 = 10;
/// Offsets in a kernel record (`CUpti_ActivityKernel4` to `10`, CUDA 11 to
/// 13: unchanged; checked against NVIDIA's header on the GPU host).
const REC_START: usize = 16;
const REC_END: usize = 24;
const REC_DEVICE: usize = 40;

type Requested = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
type Completed = unsafe extern "C" fn(CUcontext, u32, *mut u8, usize, usize);
/// `CUpti_CallbackFunc`: (userdata, domain, callback id, callback data).
type CallbackFunc = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
/// `cuptiSubscribe(CUpti_SubscriberHandle *, CUpti_CallbackFunc, void *)`:
/// the handle is a pointer to an opaque struct.
type Subscribe = unsafe extern "C" fn(*mut *mut c_void, Option<CallbackFunc>, *mut c_void) -> i32;
/// `cuptiSubscribe_v2(..., CUpti_SubscriberParams *)`: `cuptiSubscribe`
/// with optional parameters.
type Subscribe2 =
    unsafe extern "C" fn(*mut *mut c_void, Option<CallbackFunc>, *mut c_void, *mut c_void) -> i32;
/// `cuptiProfilerInitialize(CUpti_Profiler_Initialize_Params *)`.
type ProfilerInit = unsafe extern "C" fn(*mut c_void) -> i32;

struct Api {
    register: unsafe extern "C" fn(Option<Requested>, Option<Completed>) -> i32,
    enable: unsafe extern "C" fn(u32) -> i32,
    disable: unsafe extern "C" fn(u32) -> i32,
    flush_all: unsafe extern "C" fn(u32) -> i32,
    next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut u8) -> i32,
    timestamp: unsafe extern "C" fn(*mut u64) -> i32,
    result_string: Option<unsafe extern "C" fn(i32, *mut *const c_char) -> i32>,
    /// `cuptiFinalize` (optional: without it CUPTI stays attached between
    /// probes).
    finalize: Option<unsafe extern "C" fn() -> i32>,
    /// `cuptiSubscribe`, `cuptiSubscribe_v2` and `cuptiProfilerInitialize`, where the library
    /// has them: where the program's calls to ours go on to.
    subscribe: Option<Subscribe>,
    subscribe2: Option<Subscribe2>,
    profiler_init: Option<ProfilerInit>,
}

struct Meter {
    api: Api,
    path: String,
    /// Recording now, since `since` (our clock): kernels launched before are
    /// not in the records. `until`: when the last recording ended
    /// (`u64::MAX` while it goes on).
    enabled: AtomicBool,
    since: AtomicU64,
    until: AtomicU64,
    /// CUPTI's clock minus ours.
    offset: AtomicI64,
    /// Given up for good (the tenant's profiler took CUPTI, or CUPTI failed).
    lost: AtomicBool,
    /// Records seen, and kernels launched (counted by the limiter), for the
    /// records-stopped check.
    records: AtomicU64,
    launches: AtomicU64,
    /// Per CUDA ordinal: end of the GPU time already counted (the union of
    /// a process's concurrent kernels is charged once).
    covered: Box<[AtomicU64]>,
    pool: Mutex<Vec<usize>>,
}

static METER: OnceLock<Meter> = OnceLock::new();
/// Set once the program registered its own activity callbacks (even
/// before the meter started: then it never starts).
static TENANT_PROFILES: AtomicBool = AtomicBool::new(false);
/// Set once the program called CUPTI's callback API (`cuptiSubscribe`, `_v2`) or
/// range profiler (`cuptiProfilerInitialize`): the program uses CUPTI
/// itself, and the meter never detaches it again (set under `LOADING`).
static TENANT_CUPTI: AtomicBool = AtomicBool::new(false);
/// Said once: `TENANT_CUPTI` kept CUPTI attached.
static KEPT_SAID: AtomicBool = AtomicBool::new(false);
/// Set at the program's first CUDA graph launch (`note_graph_launch`):
/// from then on the meter never detaches CUPTI (`cuptiFinalize`), and a
/// holder alone under a ceiling is not probed (`crate::limiter`'s
/// `hold_ppm`). On an H200 (driver 580, PyTorch's CUPTI), a graph-replayed
/// matmul loop alone under a 30 % ceiling, probed while it held the lease
/// and detached after each probe, died with "unspecified launch failure"
/// in 2 of 7 runs (docs/benchmarks/2026-11-27-h200-s16.md); NVIDIA's
/// CUPTI release notes (12.4 Update 1) list "a crash when cuptiFinalize is
/// used for applications using CUDA Graph" as fixed, so older CUPTIs, the
/// ones frameworks ship, have it.
static GRAPHS: AtomicBool = AtomicBool::new(false);
/// Said once: `GRAPHS` kept CUPTI attached.
static GRAPHS_SAID: AtomicBool = AtomicBool::new(false);
/// Held while the meter loads CUPTI and registers its callbacks, and while
/// the program's own registration makes the meter step aside: whichever
/// comes second sees the first.
static LOADING: Mutex<()> = Mutex::new(());
/// When the process last asked for recording (our clock; 0: never), and
/// whether its GPU was ever shared (CUPTI is loaded then). Kept outside
/// `Meter`, which exists only once CUPTI is loaded.
static WANTED_AT: AtomicU64 = AtomicU64::new(0);
static SHARED: AtomicBool = AtomicBool::new(false);
/// `CUSLICE_METER`: probes (`shared`, the default), `continuous` or
/// `always`.
static MODE: AtomicU8 = AtomicU8::new(PROBES);
const PROBES: u8 = 0;
const CONTINUOUS: u8 = 1;
const ALWAYS: u8 = 2;
/// Under probes, unless `CUSLICE_METER_DETACH=0`: CUPTI is detached
/// between probes (read once, by `start`).
static DETACH: AtomicBool = AtomicBool::new(false);
/// Probes taken, and wall time recorded in all (ns), for the exit report.
static PROBES_TAKEN: AtomicU64 = AtomicU64::new(0);
/// The next probe begins no sooner than this (our clock).
static REST_UNTIL: AtomicU64 = AtomicU64::new(0);
/// Wall time in flight of the process's free passes (ns, all GPUs), counted
/// by the limiter once CUPTI is loaded: with `Meter::launches`, the
/// launches per time in flight that the rest's guard watches.
static IN_FLIGHT_NS: AtomicU64 = AtomicU64::new(0);
/// Rests lengthened, and cut short by the guard, for the exit report.
static RESTS_LONGER: AtomicU64 = AtomicU64::new(0);
static RESTS_CUT: AtomicU64 = AtomicU64::new(0);
static RECORDED_NS: AtomicU64 = AtomicU64::new(0);
/// Time the meter's thread spent in CUPTI, for the exit report: loading it
/// (`dlopen` and the first registration), switching recording on at each
/// probe (registering again where it was detached, enabling), detaching it
/// after a probe. Where CUPTI makes the program's launches wait meanwhile,
/// these bound that wait.
static LOADING_SPENT: Spent = Spent::new();
static SWITCHING_ON: Spent = Spent::new();
static DETACHING: Spent = Spent::new();
/// The meter's thread runs (it loads CUPTI when first wanted).
static STARTED: AtomicBool = AtomicBool::new(false);
/// The program exits (`at_program_exit`), and the meter's thread has
/// stopped for it.
static EXITING: AtomicBool = AtomicBool::new(false);
static STOPPED: AtomicBool = AtomicBool::new(false);
/// How long the program's exit waits for the meter's thread.
const EXIT_WAIT_NS: u64 = 200_000_000;
/// How often the meter's thread looks whether it is wanted before CUPTI is
/// loaded.
const UNLOADED_NAP_NS: u64 = 10_000_000;

fn cupti_error(m: &Meter, r: i32) -> String {
    if let Some(f) = m.api.result_string {
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: CUPTI call with a valid out pointer; the string is static.
        if unsafe { f(r, &mut s) } == CUPTI_SUCCESS && !s.is_null() {
            // SAFETY: non-null NUL-terminated static string from CUPTI.
            return format!("{} ({r})", unsafe { CStr::from_ptr(s) }.to_string_lossy());
        }
    }
    format!("CUPTI error {r}")
}

/// Where to look for libcupti, in order, after `CUSLICE_CUPTI`.
fn candidates() -> Vec<String> {
    let mut v: Vec<String> = ["libcupti.so.13", "libcupti.so.12", "libcupti.so"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut roots = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(r) = std::env::var(var)
            && !r.is_empty()
        {
            roots.push(r);
        }
    }
    roots.push("/usr/local/cuda".into());
    for r in roots {
        for sub in ["extras/CUPTI/lib64", "targets/x86_64-linux/lib", "lib64"] {
            for so in ["libcupti.so.13", "libcupti.so.12", "libcupti.so"] {
                v.push(format!("{r}/{sub}/{so}"));
            }
        }
    }
    v
}

fn open_cupti() -> Result<(*mut c_void, String), String> {
    let chosen = std::env::var("CUSLICE_CUPTI").unwrap_or_default();
    let list = if chosen.is_empty() {
        // Already loaded by the program (PyTorch's profiler links it): that one.
        for (so, c) in [
            ("libcupti.so.13", c"libcupti.so.13"),
            ("libcupti.so.12", c"libcupti.so.12"),
            ("libcupti.so", c"libcupti.so"),
        ] {
            // SAFETY: dlopen with a NUL-terminated name; RTLD_NOLOAD only
            // returns an object already loaded.
            let h = unsafe {
                libc::dlopen(
                    c.as_ptr(),
                    libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_LOCAL,
                )
            };
            if !h.is_null() {
                return Ok((h, so.to_string()));
            }
        }
        candidates()
    } else {
        vec![chosen.clone()]
    };
    for p in &list {
        let Ok(c) = std::ffi::CString::new(p.as_str()) else {
            continue;
        };
        // SAFETY: dlopen with a NUL-terminated path.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if !h.is_null() {
            return Ok((h, p.clone()));
        }
    }
    Err(if chosen.is_empty() {
        "no libcupti.so.13, .12 or libcupti.so on the library path or under CUDA_HOME, CUDA_PATH or /usr/local/cuda (set CUSLICE_CUPTI to its path)".into()
    } else {
        // SAFETY: dlerror returns null or a NUL-terminated string.
        let e = unsafe { libc::dlerror() };
        let why = if e.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: non-null NUL-terminated.
            unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
        };
        format!("CUSLICE_CUPTI={chosen}: cannot load it: {why}")
    })
}

/// A function pointer of type `F` from a symbol's address.
///
/// # Safety
/// `p` is the address of a function of type `F`.
unsafe fn cast<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the caller vouches for the type.
    unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
}

fn load_api(h: *mut c_void) -> Result<Api, String> {
    let get = |name: &CStr| -> Result<*mut c_void, String> {
        let p = crate::real::sym(h, name);
        if p.is_null() {
            Err(format!("it has no {}", name.to_string_lossy()))
        } else {
            Ok(p)
        }
    };
    // SAFETY: each symbol is CUPTI's function of the documented
    // signature its field declares.
    unsafe {
        Ok(Api {
            register: cast(get(c"cuptiActivityRegisterCallbacks")?),
            enable: cast(get(c"cuptiActivityEnable")?),
            disable: cast(get(c"cuptiActivityDisable")?),
            flush_all: cast(get(c"cuptiActivityFlushAll")?),
            next_record: cast(get(c"cuptiActivityGetNextRecord")?),
            timestamp: cast(get(c"cuptiGetTimestamp")?),
            result_string: get(c"cuptiGetResultString").ok().map(|p| cast(p)),
            finalize: get(c"cuptiFinalize").ok().map(|p| cast(p)),
            subscribe: get(c"cuptiSubscribe").ok().map(|p| cast(p)),
            subscribe2: get(c"cuptiSubscribe_v2").ok().map(|p| cast(p)),
            profiler_init: get(c"cuptiProfilerInitialize").ok().map(|p| cast(p)),
        })
    }
}

/// Starts the meter for `devices` CUDA ordinals (from the limiter's build,
/// after it is published): its thread, which loads CUPTI once the process
/// first launches freely on a shared GPU. Says once why not, where it
/// cannot.
pub fn start(devices: usize) {
    match std::env::var("CUSLICE_CUPTI").as_deref() {
        Ok("off") | Ok("0") | Ok("false") | Ok("no") => {
            crate::info!(
                "CUSLICE_CUPTI=off: a process that launches freely on a shared GPU is charged its wall time in flight"
            );
            return;
        }
        _ => {}
    }
    if std::env::var_os("CUDA_INJECTION64_PATH").is_some_and(|v| !v.is_empty()) {
        crate::info!(
            "a profiler is injected (CUDA_INJECTION64_PATH): cuslice leaves CUPTI to it and charges wall time in flight"
        );
        return;
    }
    if TENANT_PROFILES.load(Ordering::Acquire) {
        crate::info!(
            "the program uses CUPTI's activity API itself: cuslice leaves it alone and charges wall time in flight"
        );
        return;
    }
    let mode = match std::env::var("CUSLICE_METER").as_deref() {
        Ok("always") => ALWAYS,
        Ok("continuous") => CONTINUOUS,
        Ok("") | Ok("shared") | Err(_) => PROBES,
        Ok(v) => {
            crate::warn!("CUSLICE_METER={v} is not shared, continuous or always; using shared");
            PROBES
        }
    };
    MODE.store(mode, Ordering::Relaxed);
    // Detached between probes unless `0`; only probes ever detach.
    let detach = match std::env::var_os("CUSLICE_METER_DETACH") {
        None => true,
        Some(v) if v.is_empty() => true,
        Some(v) if v == "0" => false,
        Some(v) if v == "1" => {
            if mode != PROBES {
                crate::warn!(
                    "CUSLICE_METER_DETACH=1 applies to probes (CUSLICE_METER=shared) only; CUPTI stays attached"
                );
            }
            true
        }
        Some(v) => {
            crate::warn!(
                "CUSLICE_METER_DETACH={} is not 0 or 1; {}",
                v.to_string_lossy(),
                if mode == PROBES {
                    "detaching CUPTI between probes (the default)"
                } else {
                    "CUPTI stays attached (CUSLICE_METER=continuous or always never detaches)"
                }
            );
            true
        }
    };
    DETACH.store(detach && mode == PROBES, Ordering::Relaxed);
    let spawned = std::thread::Builder::new()
        .name("cuslice-meter".into())
        .spawn(move || {
            if load(devices) {
                run();
            }
        });
    match spawned {
        Ok(_) => STARTED.store(true, Ordering::Release),
        Err(e) => crate::warn!(
            "cannot start the GPU time meter's thread ({e}): charging wall time in flight"
        ),
    }
}

/// On the meter's thread: waits until recording is first wanted, then
/// loads CUPTI and registers the callbacks. False where it cannot (said
/// once) or the program's own profiler came first.
fn load(devices: usize) -> bool {
    while !SHARED.load(Ordering::Relaxed) && MODE.load(Ordering::Relaxed) != ALWAYS {
        std::thread::sleep(std::time::Duration::from_nanos(UNLOADED_NAP_NS));
    }
    if TENANT_PROFILES.load(Ordering::Acquire) {
        return false;
    }
    // The library is opened before `LOADING` is taken: a program thread
    // that registers its callbacks from a library's constructor holds the
    // loader's lock while it waits for `LOADING`.
    let loading_since = now_ns();
    let (h, path) = match open_cupti() {
        Ok(x) => x,
        Err(why) => {
            crate::info!(
                "GPU time meter off ({why}): a process that launches freely on a shared GPU is charged its wall time in flight, an upper bound"
            );
            return false;
        }
    };
    let api = match load_api(h) {
        Ok(a) => a,
        Err(why) => {
            crate::warn!("{path} is not a usable libcupti ({why}): charging wall time in flight");
            return false;
        }
    };
    let _g = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if TENANT_PROFILES.load(Ordering::Acquire) {
        return false;
    }
    let m = Meter {
        api,
        path,
        enabled: AtomicBool::new(false),
        since: AtomicU64::new(0),
        until: AtomicU64::new(0),
        offset: AtomicI64::new(0),
        lost: AtomicBool::new(false),
        records: AtomicU64::new(0),
        launches: AtomicU64::new(0),
        covered: (0..devices).map(|_| AtomicU64::new(0)).collect(),
        pool: Mutex::new(Vec::new()),
    };
    if METER.set(m).is_err() {
        return false;
    }
    let Some(m) = METER.get() else { return false };
    // SAFETY: CUPTI call with our two callbacks (valid for the process).
    let r = unsafe { (m.api.register)(Some(requested), Some(completed)) };
    if r != CUPTI_SUCCESS {
        m.lost.store(true, Ordering::Release);
        crate::warn!(
            "{}: cannot register activity callbacks: {}; charging wall time in flight",
            m.path,
            cupti_error(m, r)
        );
        return false;
    }
    LOADING_SPENT.since(loading_since);
    // Registered now, after the program's CUDA runtime registered its own
    // teardown: ours runs first (exit handlers run in reverse order).
    // SAFETY: registering a plain `extern "C" fn()`.
    unsafe { libc::atexit(at_program_exit) };
    crate::info!(
        "GPU time meter: {} (kernel records while the GPU is shared or a ceiling applies)",
        m.path
    );
    if DETACH.load(Ordering::Relaxed) && m.api.finalize.is_none() {
        crate::info!(
            "{} has no cuptiFinalize: CUPTI stays attached between probes",
            m.path
        );
    }
    true
}

/// The program exits: the meter's thread stops recording and detaches
/// CUPTI (if a probe was on) before the CUDA runtime's own exit handler
/// destroys its contexts; waits for it at most `EXIT_WAIT_NS`. (A test
/// program on an H100 crashed at exit, once in about nine runs, with CUPTI
/// loaded for its ceiling.)
extern "C" fn at_program_exit() {
    // A meter that stopped for good (its thread returned, or a fork child,
    // which has no meter thread) has nothing to stop: the exit must not
    // wait for it.
    if given_up() {
        return;
    }
    EXITING.store(true, Ordering::Release);
    let until = now_ns() + EXIT_WAIT_NS;
    while !STOPPED.load(Ordering::Acquire) && now_ns() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The current or last recording, `(since, until)` (our clock; `until` is
/// `u64::MAX` while it goes on): kernels launched in it are charged from
/// the records. None where the meter is not loaded or has stopped for good.
#[inline]
pub fn window() -> Option<(u64, u64)> {
    let m = METER.get()?;
    if m.lost.load(Ordering::Acquire) {
        return None;
    }
    let until = m.until.load(Ordering::Acquire);
    let since = m.since.load(Ordering::Acquire);
    (since != 0).then_some((since, until))
}

/// Whether the meter records now.
#[inline]
pub fn recording() -> bool {
    METER
        .get()
        .is_some_and(|m| m.enabled.load(Ordering::Acquire) && !m.lost.load(Ordering::Acquire))
}

/// The program launches a CUDA graph (`cuGraphLaunch`): see `GRAPHS`. A
/// load and, once per process, a store.
#[inline]
pub fn note_graph_launch() {
    if !GRAPHS.load(Ordering::Relaxed) {
        GRAPHS.store(true, Ordering::Relaxed);
    }
}

/// Whether the program has launched a CUDA graph (see `GRAPHS`).
#[inline]
pub fn graphs_launched() -> bool {
    GRAPHS.load(Ordering::Relaxed)
}

/// Whether a ratio learned from probes may stand in for records: the
/// meter works (loaded, not given up).
#[inline]
pub fn usable() -> bool {
    METER.get().is_some_and(|m| !m.lost.load(Ordering::Acquire))
}

/// Whether the meter has stopped for good.
#[inline]
pub fn given_up() -> bool {
    METER.get().is_some_and(|m| m.lost.load(Ordering::Acquire))
}

/// Whether a probe the process asked for is coming: asked for within the
/// last `WANT_FRESH_NS`, the meter not given up, and (loaded or not) not
/// recording yet. A busy stretch is not judged saturating unmeasured while
/// its measurement is on its way.
#[inline]
pub fn coming(now: u64) -> bool {
    if !STARTED.load(Ordering::Acquire) || recording() {
        return false;
    }
    if METER.get().is_some_and(|m| m.lost.load(Ordering::Acquire)) {
        return false;
    }
    let at = WANTED_AT.load(Ordering::Relaxed);
    at != 0 && now.saturating_sub(at) < WANT_FRESH_NS && now >= REST_UNTIL.load(Ordering::Relaxed)
}

/// The process launches freely on a contended GPU: CUPTI is loaded (once)
/// so that a probe can begin at once when one is wanted.
#[inline]
pub fn prepare() {
    if !SHARED.load(Ordering::Relaxed) {
        SHARED.store(true, Ordering::Relaxed);
    }
}

/// A holder alone under a ceiling does not keep the GPU fed: its kernels
/// are to be measured (`crate::limiter`'s `hold_ppm`), in every mode
/// (`continuous` records while the GPU is shared, and a ceiling counts GPU
/// time alone too).
#[inline]
pub fn want_measured(now: u64) {
    WANTED_AT.store(now, Ordering::Relaxed);
}

/// The process launches freely where its wall time in flight could make it
/// heavy on a contended GPU or hold it to a ceiling (`need`), or just on a
/// contended GPU (`contended`): a probe is wanted where `need`, recording
/// all along under `continuous` where contended, and always under
/// `always`.
#[inline]
pub fn want(contended: bool, need: bool, now: u64) {
    let wanted = match MODE.load(Ordering::Relaxed) {
        PROBES => need,
        CONTINUOUS => contended,
        _ => true,
    };
    if wanted {
        WANTED_AT.store(now, Ordering::Relaxed);
    }
}

/// The process stops launching for a while (it waits for the lease or its
/// ceiling): a probe wanted before is no longer (one begun then would
/// measure nothing).
#[inline]
pub fn unwant() {
    WANTED_AT.store(0, Ordering::Relaxed);
}

/// How often something took how long (ns): a count, the sum, the longest.
struct Spent {
    n: AtomicU64,
    sum: AtomicU64,
    max: AtomicU64,
}

impl Spent {
    const fn new() -> Self {
        Spent {
            n: AtomicU64::new(0),
            sum: AtomicU64::new(0),
            max: AtomicU64::new(0),
        }
    }

    /// Adds one that began at `since` (our clock) and ends now.
    fn since(&self, since: u64) {
        let ns = now_ns().saturating_sub(since);
        self.n.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(ns, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    /// "N in X ms (longest Y ms)" ("1 in X ms"), or None where there was
    /// none.
    fn said(&self) -> Option<String> {
        let n = self.n.load(Ordering::Relaxed);
        let ms = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        match n {
            0 => None,
            1 => Some(format!("1 in {:.2} ms", ms(&self.sum))),
            _ => Some(format!(
                "{n} in {:.2} ms (longest {:.2} ms)",
                ms(&self.sum),
                ms(&self.max)
            )),
        }
    }
}

/// The exit report's line, where the meter was loaded: probes taken, wall
/// time recorded, and the time spent loading CUPTI, switching recording on
/// and detaching CUPTI.
pub fn summary() -> Option<String> {
    METER.get()?;
    let mut s = format!(
        "recorded kernels in {} probes, {:.0} ms in all",
        PROBES_TAKEN.load(Ordering::Relaxed),
        RECORDED_NS.load(Ordering::Relaxed) as f64 / 1e6
    );
    let (longer, cut) = (
        RESTS_LONGER.load(Ordering::Relaxed),
        RESTS_CUT.load(Ordering::Relaxed),
    );
    if longer > 0 {
        s.push_str(&format!(
            "; rests lengthened after {longer} steady probes ({cut} cut short)"
        ));
    }
    for (what, spent) in [
        ("loading CUPTI", &LOADING_SPENT),
        ("switching recording on", &SWITCHING_ON),
        ("detaching CUPTI", &DETACHING),
    ] {
        if let Some(x) = spent.said() {
            s.push_str(&format!("; {what} {x}"));
        }
    }
    Some(s)
}

/// Kernels launched (for the records-stopped check and the rest's guard).
#[inline]
pub fn launched(n: u64) {
    if let Some(m) = METER.get() {
        m.launches.fetch_add(n, Ordering::Relaxed);
    }
}

/// Wall time in flight of a free pass that ended (for the rest's guard).
#[inline]
pub fn in_flight(ns: u64) {
    if METER.get().is_some() {
        IN_FLIGHT_NS.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Launches and time in flight so far (the guard's counters).
fn density_now(m: &Meter) -> (u64, u64) {
    (
        m.launches.load(Ordering::Relaxed),
        IN_FLIGHT_NS.load(Ordering::Relaxed),
    )
}

/// Whether launches per time in flight moved by more than `GUARD_FACTOR`
/// either way from `base` (launches, ns) to `now` (the same, since).
fn density_moved(base: (u64, u64), now: (u64, u64)) -> bool {
    let (bl, bw) = (u128::from(base.0), u128::from(base.1));
    let (nl, nw) = (u128::from(now.0), u128::from(now.1));
    nl * bw > GUARD_FACTOR * bl * nw || bl * nw > GUARD_FACTOR * nl * bw
}

fn calibrate(m: &Meter) {
    let mut ts = 0u64;
    let a = now_ns();
    // SAFETY: CUPTI call with a valid out pointer.
    let r = unsafe { (m.api.timestamp)(&mut ts) };
    let b = now_ns();
    if r == CUPTI_SUCCESS {
        let ours = a / 2 + b / 2;
        m.offset.store(ts as i64 - ours as i64, Ordering::Release);
    }
}

fn give_up(m: &Meter, why: &str) {
    if m.lost.swap(true, Ordering::AcqRel) {
        return;
    }
    crate::info!("GPU time meter stops ({why}): charging wall time in flight from now on");
}

/// The records-stopped check, against `(records, launches)` as they were
/// at the last look: a look that finds no new record while the process
/// launched at least `LOST_LAUNCHES` kernels counts in `silent`; the
/// second in a row means someone else took CUPTI, and the meter gives up
/// (None). Else `(records, launches)` now.
fn lost(m: &Meter, (seen, launched): (u64, u64), silent: &mut u32) -> Option<(u64, u64)> {
    let (r, l) = (
        m.records.load(Ordering::Relaxed),
        m.launches.load(Ordering::Relaxed),
    );
    *silent = if r == seen && l.saturating_sub(launched) >= LOST_LAUNCHES {
        *silent + 1
    } else {
        0
    };
    if *silent >= 2 {
        give_up(
            m,
            "no kernel records while the process launches: another CUPTI client took them",
        );
        return None;
    }
    Some((r, l))
}

/// Switches recording off at `now` (the records so far are flushed; the
/// last ones at the next tick, when the probe's end is reported).
fn stop_recording(m: &Meter, now: u64) {
    m.enabled.store(false, Ordering::Release);
    m.until.store(now, Ordering::Release);
    // SAFETY: CUPTI calls.
    unsafe {
        (m.api.disable)(KIND_CONCURRENT_KERNEL);
        (m.api.flush_all)(0);
    }
    RECORDED_NS.fetch_add(
        now.saturating_sub(m.since.load(Ordering::Relaxed)),
        Ordering::Relaxed,
    );
}

/// Detaching between probes, once a probe's last records are in: the
/// records still in CUPTI's buffers are delivered (a forced flush gives our
/// buffers back), then CUPTI is detached (`finalize`). True where it is
/// detached; false where the program's own profiler has CUPTI (or the
/// meter stopped), or the program uses CUPTI's callback or profiler API
/// (`TENANT_CUPTI`, said once): it is left alone. The check and the detach
/// are made under `LOADING`, which the program's registration,
/// subscription and profiler initialisation take before they reach CUPTI:
/// a program that makes one of those calls meanwhile makes it after the
/// detach (CUPTI attaches again for it), never before it. Err:
/// `cuptiFinalize`'s error.
fn detach(m: &Meter, finalize: unsafe extern "C" fn() -> i32) -> Result<bool, i32> {
    let _g = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if TENANT_PROFILES.load(Ordering::Acquire) || m.lost.load(Ordering::Acquire) {
        return Ok(false);
    }
    if TENANT_CUPTI.load(Ordering::Acquire) {
        if !KEPT_SAID.swap(true, Ordering::Relaxed) {
            crate::info!(
                "the program uses CUPTI's callback/profiler API: cuslice keeps CUPTI attached between probes"
            );
        }
        return Ok(false);
    }
    if GRAPHS.load(Ordering::Relaxed) {
        if !GRAPHS_SAID.swap(true, Ordering::Relaxed) {
            crate::info!(
                "the program launches CUDA graphs: cuslice keeps CUPTI attached between probes (detaching it crashed graph replays)"
            );
        }
        return Ok(false);
    }
    // SAFETY: CUPTI calls: the flush delivers buffers to `completed` on
    // this thread (our callbacks: the program's registration waits for
    // `LOADING`); then the detach, recording off and flushed.
    let r = unsafe {
        (m.api.flush_all)(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
        finalize()
    };
    if r == CUPTI_SUCCESS { Ok(true) } else { Err(r) }
}

/// Before a probe where CUPTI was detached: our
/// callbacks registered again (CUPTI attaches anew). False, the meter
/// stopped for good, where the program's own profiler took CUPTI meanwhile
/// or the registration failed (said).
fn attach(m: &Meter) -> bool {
    let _g = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if TENANT_PROFILES.load(Ordering::Acquire) || m.lost.load(Ordering::Acquire) {
        m.lost.store(true, Ordering::Release);
        return false;
    }
    // SAFETY: CUPTI call with our two callbacks (valid for the process).
    let r = unsafe { (m.api.register)(Some(requested), Some(completed)) };
    if r != CUPTI_SUCCESS {
        crate::warn!(
            "{}: cannot register activity callbacks again: {}; charging wall time in flight",
            m.path,
            cupti_error(m, r)
        );
        m.lost.store(true, Ordering::Release);
        return false;
    }
    true
}

/// The meter's thread: takes probes (switches recording on and off),
/// flushes.
fn run() {
    let Some(m) = METER.get() else { return };
    let mut calibrated_at = 0u64;
    let mut check_at = 0u64;
    let (mut seen, mut launched, mut silent) = (0u64, 0u64, 0u32);
    // End of the current probe, earliest start of the next, and whether a
    // probe that ended waits for its last records to be reported.
    let (mut probe_until, mut rest_until, mut ending) = (0u64, 0u64, false);
    let mode = MODE.load(Ordering::Relaxed);
    // Detaching between probes: `cuptiFinalize` where it is on and the
    // library has it (None once it failed), and whether CUPTI is detached
    // now.
    let mut finalize = if DETACH.load(Ordering::Relaxed) && mode == PROBES {
        m.api.finalize
    } else {
        None
    };
    let mut detached = false;
    // Lengthened rests: the doubling count, the guard's counters at the
    // probe's start and at the rest's current window, and the probe's
    // launches and time in flight (its baseline; None: too little).
    let mut backoff = 0u32;
    let (mut probe_base, mut rest_base) = ((0u64, 0u64), (0u64, 0u64));
    let mut probe_density: Option<(u64, u64)> = None;
    // Who else competed for the GPU when the last probe ended.
    let mut probe_competition = 0u64;
    loop {
        if EXITING.load(Ordering::Acquire) {
            // The program exits (`at_program_exit`): no probe is left
            // recording, nor CUPTI attached after one, when its CUDA
            // runtime tears its contexts down.
            if !m.lost.load(Ordering::Acquire) && !TENANT_PROFILES.load(Ordering::Acquire) {
                if m.enabled.load(Ordering::Acquire) {
                    stop_recording(m, now_ns());
                }
                if let Some(f) = finalize.filter(|_| !detached) {
                    let _ = detach(m, f);
                }
            }
            STOPPED.store(true, Ordering::Release);
            return;
        }
        if m.lost.load(Ordering::Acquire) {
            if m.enabled.swap(false, Ordering::AcqRel) && !TENANT_PROFILES.load(Ordering::Acquire) {
                // SAFETY: CUPTI calls without arguments to check.
                unsafe {
                    (m.api.disable)(KIND_CONCURRENT_KERNEL);
                }
            }
            STOPPED.store(true, Ordering::Release);
            return;
        }
        let now = now_ns();
        let wanted_at = WANTED_AT.load(Ordering::Relaxed);
        let fresh = if mode == CONTINUOUS {
            IDLE_OFF_NS
        } else {
            WANT_FRESH_NS
        };
        let wanted = mode == ALWAYS || (wanted_at != 0 && now.saturating_sub(wanted_at) < fresh);
        let enabled = m.enabled.load(Ordering::Acquire);
        if !enabled && ending {
            // The probe's last records (the kernels that were still running
            // when it ended) are in: its ratio can be taken.
            // SAFETY: CUPTI call; delivers completed buffers here.
            unsafe { (m.api.flush_all)(0) };
            let (measured, steady) = crate::limiter::probe_end(now);
            ending = false;
            if !measured {
                // Nothing in flight in it (the process waited through it,
                // for its ceiling say): no reason to rest before the next.
                rest_until = now;
                REST_UNTIL.store(rest_until, Ordering::Relaxed);
            }
            let d = density_now(m);
            let during = (
                d.0.saturating_sub(probe_base.0),
                d.1.saturating_sub(probe_base.1),
            );
            probe_density = (during.1 >= GUARD_MIN_PROBE_WALL_NS && during.0 > 0).then_some(during);
            backoff = if steady && probe_density.is_some() && mode == PROBES {
                (backoff + 1).min(REST_MAX_SHIFT)
            } else {
                0
            };
            rest_base = d;
            probe_competition = crate::limiter::competition(now);
            if backoff > 0 {
                RESTS_LONGER.fetch_add(1, Ordering::Relaxed);
                rest_until = m.until.load(Ordering::Relaxed) + (REST_NS << backoff);
                REST_UNTIL.store(rest_until, Ordering::Relaxed);
            }
            // Over two probes in a row.
            if lost(m, (seen, launched), &mut silent).is_none() {
                continue;
            }
            if let Some(f) = finalize {
                let detaching_since = now_ns();
                let r = detach(m, f);
                if matches!(r, Ok(true)) {
                    DETACHING.since(detaching_since);
                }
                match r {
                    Ok(d) => detached = d,
                    Err(r) => {
                        crate::info!(
                            "{}: cannot detach CUPTI between probes: {}; it stays attached",
                            m.path,
                            cupti_error(m, r)
                        );
                        finalize = None;
                    }
                }
            }
            crate::debug!(
                "GPU time meter off at {:.3} ms (CLOCK_MONOTONIC; {})",
                now_ns() as f64 / 1e6,
                if detached {
                    "CUPTI detached"
                } else {
                    "CUPTI stays attached"
                }
            );
        }
        if !enabled && !ending && backoff > 0 && now < rest_until {
            // A lengthened rest: cut back to `REST_NS` where the tenants
            // competing for the GPU changed (what its kernels get of the
            // GPU changed with them), or the process's kernels changed size.
            let d = density_now(m);
            let since = (
                d.0.saturating_sub(rest_base.0),
                d.1.saturating_sub(rest_base.1),
            );
            let mut why = None;
            if crate::limiter::competition(now) != probe_competition {
                why = Some("the tenants competing for its GPU changed".to_string());
            } else if since.1 >= GUARD_WALL_NS {
                if let Some(p) = probe_density.filter(|&p| density_moved(p, since)) {
                    why = Some(format!(
                        "launches per time in flight moved from {} per {:.1} ms to {} per {:.1} ms",
                        p.0,
                        p.1 as f64 / 1e6,
                        since.0,
                        since.1 as f64 / 1e6
                    ));
                }
                rest_base = d;
            }
            if let Some(why) = why {
                backoff = 0;
                let base = m.until.load(Ordering::Relaxed) + REST_NS;
                rest_until = rest_until.min(base.max(now));
                REST_UNTIL.store(rest_until, Ordering::Relaxed);
                RESTS_CUT.fetch_add(1, Ordering::Relaxed);
                crate::debug!(
                    "GPU time meter: {why} since the last probe; the next probe comes sooner"
                );
            }
        }
        if wanted && !enabled && now >= rest_until {
            let switching_since = now_ns();
            if detached {
                if !attach(m) {
                    continue;
                }
                detached = false;
            }
            calibrate(m);
            calibrated_at = now;
            // SAFETY: CUPTI call.
            let r = unsafe { (m.api.enable)(KIND_CONCURRENT_KERNEL) };
            if r != CUPTI_SUCCESS {
                crate::warn!(
                    "{}: cannot record kernel activity: {}; charging wall time in flight",
                    m.path,
                    cupti_error(m, r)
                );
                m.lost.store(true, Ordering::Release);
                continue;
            }
            for c in m.covered.iter() {
                c.store(0, Ordering::Relaxed);
            }
            SWITCHING_ON.since(switching_since);
            probe_base = density_now(m);
            crate::limiter::probe_begin();
            let t = now_ns();
            m.until.store(u64::MAX, Ordering::Release);
            m.since.store(t, Ordering::Release);
            m.enabled.store(true, Ordering::Release);
            PROBES_TAKEN.fetch_add(1, Ordering::Relaxed);
            probe_until = if mode == PROBES {
                t + PROBE_NS
            } else {
                u64::MAX
            };
            check_at = now + LOST_CHECK_NS;
            seen = m.records.load(Ordering::Relaxed);
            launched = m.launches.load(Ordering::Relaxed);
            crate::debug!(
                "GPU time meter on at {:.3} ms (CLOCK_MONOTONIC)",
                t as f64 / 1e6
            );
        } else if enabled {
            // SAFETY: CUPTI call; delivers completed buffers to `completed`
            // on this thread.
            unsafe { (m.api.flush_all)(0) };
            if now >= probe_until || (mode == CONTINUOUS && !wanted) {
                stop_recording(m, now);
                rest_until = now + REST_NS;
                REST_UNTIL.store(rest_until, Ordering::Relaxed);
                ending = true;
            } else if now >= check_at {
                // Over two checks in a row (recording longer than a probe).
                if let Some(now_seen) = lost(m, (seen, launched), &mut silent) {
                    (seen, launched) = now_seen;
                }
                check_at = now + LOST_CHECK_NS;
            }
            if now.saturating_sub(calibrated_at) >= CALIBRATE_NS {
                calibrate(m);
                calibrated_at = now;
            }
        }
        let nap = if m.enabled.load(Ordering::Acquire) || ending {
            FLUSH_NS
        } else {
            FLUSH_NS * 5
        };
        std::thread::sleep(std::time::Duration::from_nanos(nap));
    }
}

unsafe extern "C" fn requested(buffer: *mut *mut u8, size: *mut usize, max_records: *mut usize) {
    let Some(m) = METER.get() else { return };
    let reused = m.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let p = reused.unwrap_or_else(|| {
        match std::alloc::Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN) {
            // SAFETY: a layout of non-zero size.
            Ok(layout) => unsafe { std::alloc::alloc(layout) as usize },
            // Unreachable for these constants; CUPTI then drops records.
            Err(_) => 0,
        }
    });
    // SAFETY: CUPTI passes valid out pointers.
    unsafe {
        *buffer = p as *mut u8;
        *size = if p == 0 { 0 } else { BUFFER_BYTES };
        *max_records = 0;
    }
}

unsafe extern "C" fn completed(
    _ctx: CUcontext,
    _stream: u32,
    buf: *mut u8,
    _size: usize,
    valid: usize,
) {
    let Some(m) = METER.get() else { return };
    if buf.is_null() {
        return;
    }
    let offset = m.offset.load(Ordering::Acquire);
    let since = m.since.load(Ordering::Acquire);
    let mut rec: *mut u8 = std::ptr::null_mut();
    let mut n = 0u64;
    loop {
        // SAFETY: CUPTI walks the buffer it filled; `rec` is null or its
        // previous answer.
        let r = unsafe { (m.api.next_record)(buf, valid, &mut rec) };
        if r != CUPTI_SUCCESS || rec.is_null() {
            if r != CUPTI_ERROR_MAX_LIMIT_REACHED && r != CUPTI_SUCCESS {
                crate::debug!("reading kernel records: {}", cupti_error(m, r));
            }
            break;
        }
        // SAFETY: every record starts with its u32 kind; kernel records hold
        // start, end and deviceId at these offsets (CUpti_ActivityKernel4..10). Unaligned
        // reads: the layout is CUPTI's, not ours.
        let (start, end, dev) = unsafe {
            let kind = (rec as *const u32).read_unaligned();
            if kind != KIND_CONCURRENT_KERNEL && kind != KIND_KERNEL {
                continue;
            }
            (
                (rec.add(REC_START) as *const u64).read_unaligned(),
                (rec.add(REC_END) as *const u64).read_unaligned(),
                (rec.add(REC_DEVICE) as *const u32).read_unaligned(),
            )
        };
        n += 1;
        let (s, e) = (
            (start as i64).wrapping_sub(offset).max(0) as u64,
            (end as i64).wrapping_sub(offset).max(0) as u64,
        );
        let Some(cov) = m.covered.get(dev as usize) else {
            continue;
        };
        if e <= s || e < since {
            continue;
        }
        // The union of this process's kernels on the device: what lies
        // before the end already counted is not counted again.
        let from = s.max(cov.load(Ordering::Relaxed)).max(since);
        cov.fetch_max(e, Ordering::Relaxed);
        if e > from {
            crate::limiter::metered(dev as usize, from, e);
        }
    }
    m.records.fetch_add(n, Ordering::Relaxed);
    crate::limiter::metered_flush(now_ns());
    m.pool
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(buf as usize);
}

/// A fork child: the meter's thread did not come along, so nothing would
/// flush its records; it charges wall time in flight (CUDA in a child of a
/// process that initialised it is not supported anyway).
pub fn after_fork_child() {
    if let Some(m) = METER.get() {
        m.lost.store(true, Ordering::Release);
    }
}

/// The program registers its own activity callbacks (a profiler: PyTorch's,
/// Nsight's in-process part): the meter steps aside for good, and the call
/// goes on to CUPTI.
pub fn tenant_registers() {
    let _g = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    if TENANT_PROFILES.swap(true, Ordering::AcqRel) {
        return;
    }
    match METER.get() {
        Some(m) if !m.lost.swap(true, Ordering::AcqRel) => {
            if m.enabled.swap(false, Ordering::AcqRel) {
                // SAFETY: CUPTI calls: ours off and delivered before the
                // program's callbacks replace ours.
                unsafe {
                    (m.api.disable)(KIND_CONCURRENT_KERNEL);
                    (m.api.flush_all)(0);
                }
            }
        }
        Some(_) => return,
        // Started, CUPTI not loaded yet: it never will be.
        None if STARTED.load(Ordering::Acquire) => {}
        None => return,
    }
    crate::info!(
        "the program registers its own CUPTI activity callbacks (a profiler): cuslice's GPU time meter steps aside; charging wall time in flight"
    );
}

/// The CUPTI entry points the shim exports in front of CUPTI's own, so
/// that it sees the program call them (the dlsym hook hands ours out for
/// their names too).
#[derive(Clone, Copy)]
enum Front {
    Register = 0,
    Subscribe = 1,
    ProfilerInit = 2,
    Subscribe2 = 3,
}

const FRONT_NAMES: [&CStr; 4] = [
    c"cuptiActivityRegisterCallbacks",
    c"cuptiSubscribe",
    c"cuptiProfilerInitialize",
    c"cuptiSubscribe_v2",
];

/// Per entry point: CUPTI's function for the program's calls, once found;
/// and the real address the dlsym hook found for the name when it handed
/// ours out (a program that opened libcupti privately, as Python's ctypes
/// does, is not reached through `RTLD_NEXT`).
static FRONT_REAL: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
static FRONT_SEEN: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];

/// Our exports, by `Front`.
fn front_hooks() -> [*mut c_void; 4] {
    [
        cuptiActivityRegisterCallbacks as *mut c_void,
        cuptiSubscribe as *mut c_void,
        cuptiProfilerInitialize as *mut c_void,
        cuptiSubscribe_v2 as *mut c_void,
    ]
}

/// CUPTI's function behind our export `f`, for a program's call: the one
/// the dlsym hook found for the program where it looked the name up, else
/// the meter's library's where it is loaded and has it, else the next
/// definition after ours.
/// Null: there is none (no CUPTI in the process).
fn front_real(f: Front) -> *mut c_void {
    let i = f as usize;
    let p = FRONT_REAL[i].load(Ordering::Acquire);
    if p != 0 {
        return p as *mut c_void;
    }
    // What the program's own lookup found comes first: a program that
    // opened a libcupti of its own privately calls that library, not the
    // meter's.
    let seen = FRONT_SEEN[i].load(Ordering::Acquire);
    let meter = METER.get().and_then(|m| match f {
        Front::Register => Some(m.api.register as *mut c_void),
        Front::Subscribe => m.api.subscribe.map(|s| s as *mut c_void),
        Front::ProfilerInit => m.api.profiler_init.map(|s| s as *mut c_void),
        Front::Subscribe2 => m.api.subscribe2.map(|s| s as *mut c_void),
    });
    let p = match (seen, meter) {
        (0, Some(p)) => p,
        (0, None) => crate::real::sym(libc::RTLD_NEXT, FRONT_NAMES[i]),
        (seen, _) => seen as *mut c_void,
    };
    if !p.is_null() {
        FRONT_REAL[i].store(p as usize, Ordering::Release);
    }
    p
}

/// For the dlsym hook: our export where `name` is one of the CUPTI entry
/// points we front (`real`: what glibc's dlsym found for it, not null,
/// remembered as where the program's calls go on to).
pub fn front_for(name: &CStr, real: *mut c_void) -> Option<*mut c_void> {
    let i = FRONT_NAMES.iter().position(|n| *n == name)?;
    let ours = front_hooks()[i];
    if real != ours {
        let _ =
            FRONT_SEEN[i].compare_exchange(0, real as usize, Ordering::AcqRel, Ordering::Acquire);
    }
    Some(ours)
}

/// The program's `cuptiActivityRegisterCallbacks` (exported so that a
/// profiler's registration is seen): the meter steps aside, then CUPTI
/// registers the program's callbacks.
///
/// # Safety
/// CUPTI's contract for `cuptiActivityRegisterCallbacks`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // CUPTI's name, exported as is
pub unsafe extern "C" fn cuptiActivityRegisterCallbacks(
    requested: Option<Requested>,
    completed: Option<Completed>,
) -> i32 {
    tenant_registers();
    let p = front_real(Front::Register);
    if p.is_null() {
        // No CUPTI in the process: what CUPTI's own stub would say.
        return CUPTI_ERROR_UNKNOWN;
    }
    // SAFETY: p is CUPTI's cuptiActivityRegisterCallbacks (never ours:
    // the meter's handle, the address glibc's dlsym found, which is not
    // ours, or RTLD_NEXT).
    let f: unsafe extern "C" fn(Option<Requested>, Option<Completed>) -> i32 = unsafe { cast(p) };
    // SAFETY: forwarding the program's arguments.
    unsafe { f(requested, completed) }
}

/// The program uses CUPTI's callback API or range profiler: from now on
/// the meter never detaches CUPTI (set under `LOADING`, so that a detach
/// under way ends before the program's call reaches CUPTI, and none
/// begins after).
fn tenant_uses_cupti() {
    let _g = LOADING.lock().unwrap_or_else(|e| e.into_inner());
    TENANT_CUPTI.store(true, Ordering::Release);
}

/// The program's `cuptiSubscribe` (exported so that the meter sees that
/// the program uses CUPTI's callback API, which a detach would end): the
/// meter stops detaching CUPTI, then CUPTI subscribes the program.
///
/// # Safety
/// CUPTI's contract for `cuptiSubscribe`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // CUPTI's name, exported as is
pub unsafe extern "C" fn cuptiSubscribe(
    subscriber: *mut *mut c_void,
    callback: Option<CallbackFunc>,
    userdata: *mut c_void,
) -> i32 {
    tenant_uses_cupti();
    let p = front_real(Front::Subscribe);
    if p.is_null() {
        return CUPTI_ERROR_UNKNOWN;
    }
    // SAFETY: p is CUPTI's cuptiSubscribe (never ours: see
    // cuptiActivityRegisterCallbacks).
    let f: Subscribe = unsafe { cast(p) };
    // SAFETY: forwarding the program's arguments.
    unsafe { f(subscriber, callback, userdata) }
}

/// The program's `cuptiSubscribe_v2` (CUDA 13's successor of
/// `cuptiSubscribe`; exported for the same reason).
///
/// # Safety
/// CUPTI's contract for `cuptiSubscribe_v2`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // CUPTI's name, exported as is
pub unsafe extern "C" fn cuptiSubscribe_v2(
    subscriber: *mut *mut c_void,
    callback: Option<CallbackFunc>,
    userdata: *mut c_void,
    params: *mut c_void,
) -> i32 {
    tenant_uses_cupti();
    let p = front_real(Front::Subscribe2);
    if p.is_null() {
        return CUPTI_ERROR_UNKNOWN;
    }
    // SAFETY: p is CUPTI's cuptiSubscribe_v2 (never ours: see
    // cuptiActivityRegisterCallbacks).
    let f: Subscribe2 = unsafe { cast(p) };
    // SAFETY: forwarding the program's arguments.
    unsafe { f(subscriber, callback, userdata, params) }
}

/// The program's `cuptiProfilerInitialize` (exported so that the meter
/// sees that the program uses CUPTI's range profiler, which a detach
/// would end): the meter stops detaching CUPTI, then CUPTI initialises
/// the profiler.
///
/// # Safety
/// CUPTI's contract for `cuptiProfilerInitialize`.
#[cfg_attr(not(test), unsafe(no_mangle))]
#[allow(non_snake_case)] // CUPTI's name, exported as is
pub unsafe extern "C" fn cuptiProfilerInitialize(params: *mut c_void) -> i32 {
    tenant_uses_cupti();
    let p = front_real(Front::ProfilerInit);
    if p.is_null() {
        return CUPTI_ERROR_UNKNOWN;
    }
    // SAFETY: p is CUPTI's cuptiProfilerInitialize (never ours: see
    // cuptiActivityRegisterCallbacks).
    let f: ProfilerInit = unsafe { cast(p) };
    // SAFETY: forwarding the program's argument.
    unsafe { f(params) }
}
