use super::lifecycle::phase_after_fork;
use super::setup::{Announced, FALLBACK_PAGE, no_pools};
use super::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn a_fork_child_starts_over_unless_its_parent_failed() {
    assert_eq!(phase_after_fork(UNINIT), UNINIT);
    // The parent's initialiser does not exist in the child: waiting
    // for it would hang the child's cuInit for ever.
    assert_eq!(phase_after_fork(INITIALIZING), UNINIT);
    assert_eq!(phase_after_fork(READY), UNINIT);
    assert_eq!(phase_after_fork(FAILED), FAILED);
}

#[test]
fn a_panic_while_building_fails_initialisation_for_good() {
    let phase = AtomicU32::new(UNINIT);
    let r = run_once(&phase, || panic!("injected"));
    assert_eq!(r, Err(CUresult::CUDA_ERROR_NOT_PERMITTED));
    assert_eq!(phase.load(Ordering::Acquire), FAILED);
    let r = run_once(&phase, || unreachable!("built twice"));
    assert_eq!(r, Err(CUresult::CUDA_ERROR_NOT_PERMITTED));
}

#[test]
fn an_error_fails_and_success_readies() {
    let phase = AtomicU32::new(UNINIT);
    assert!(run_once(&phase, || Err("bad".into())).is_err());
    assert_eq!(phase.load(Ordering::Acquire), FAILED);
    let phase = AtomicU32::new(UNINIT);
    assert_eq!(run_once(&phase, || Ok(())), Ok(()));
    assert_eq!(run_once(&phase, || unreachable!("built twice")), Ok(()));
    assert_eq!(phase.load(Ordering::Acquire), READY);
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Threads that call while another builds sleep (a yield loop burns
/// its share of a core: tens of ms over this wait even on a loaded
/// machine), and see the builder's failure, panic included.
#[test]
fn waiters_sleep_and_see_the_initialisers_failure() {
    let phase = Arc::new(AtomicU32::new(UNINIT));
    let (tx, rx) = std::sync::mpsc::channel();
    let builder = {
        let phase = phase.clone();
        std::thread::spawn(move || {
            run_once(&phase, || {
                let _ = tx.send(());
                std::thread::sleep(Duration::from_millis(400));
                panic!("injected")
            })
        })
    };
    rx.recv().expect("builder started");
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let phase = phase.clone();
            std::thread::spawn(move || {
                let (cpu, t0) = (thread_cpu(), Instant::now());
                let r = run_once(&phase, || unreachable!("built twice"));
                (r, thread_cpu() - cpu, t0.elapsed())
            })
        })
        .collect();
    assert_eq!(
        builder.join().expect("builder"),
        Err(CUresult::CUDA_ERROR_NOT_PERMITTED)
    );
    for w in waiters {
        let (r, cpu, waited) = w.join().expect("waiter");
        assert_eq!(r, Err(CUresult::CUDA_ERROR_NOT_PERMITTED));
        assert!(
            cpu < Duration::from_millis(5),
            "a waiter used {cpu:?} of CPU in {waited:?}"
        );
    }
}

fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("cuslice-quota-unit-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

/// A quota of `limit` bytes on one device, on a segment in `dir`.
fn quota(dir: &std::path::Path, limit: u64) -> Quota {
    let seg = Segment::open_or_create(&dir.join("memory.seg")).expect("segment");
    let slot = seg.claim_slot(std::process::id()).expect("slot");
    let uuid = [7u8; 16];
    let d = seg.register_device(&uuid, limit).expect("device").0;
    let table = |cap| Table::new(cap).expect("table");
    Quota {
        seg,
        slot,
        devs: vec![Dev {
            seg: d,
            limit,
            uuid,
            ctx_charged: AtomicBool::new(false),
            page: FALLBACK_PAGE,
            pool: None,
        }],
        ctx_overhead: 0,
        ptrs: table(16),
        handles: table(16),
        maps: table(16),
        arrays: table(16),
        pools: no_pools(),
        pool_sync: std::sync::Mutex::new(()),
        refusal_logged: AtomicBool::new(false),
        wait_ms: 0,
        wait_logged: AtomicBool::new(false),
    }
}

#[test]
fn an_admission_gives_its_charge_back_unless_committed() {
    let dir = scratch("admission");
    let q = quota(&dir, 1000);
    let used = || q.usage(0).expect("quota").1;
    let a = q.reserve(0, 600).expect("fits");
    assert_eq!(used(), 600);
    assert_eq!(
        q.reserve(0, 401).err(),
        Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    );
    drop(a);
    assert_eq!(used(), 0, "dropped: given back");
    q.reserve(0, 600).expect("fits again").commit();
    assert_eq!(used(), 600, "committed: stays charged");
    q.credit(0, 600);
    // Settling to what the driver really allocated.
    let mut a = q.reserve(0, 500).expect("bound");
    a.settle(300).expect("smaller");
    assert_eq!((used(), a.bytes()), (300, 300));
    a.settle(900).expect("larger, still fits");
    assert_eq!(used(), 900);
    assert_eq!(a.settle(1001), Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    assert_eq!((used(), a.bytes()), (900, 900), "a refused settle keeps it");
    drop(a);
    assert_eq!(used(), 0);
    // A device without a quota entry is not policed.
    let a = q.reserve(5, 1 << 40).expect("not policed");
    drop(a);
    assert_eq!(used(), 0);
    q.seg.release_slot(q.slot);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_segment_being_built_is_announced_until_published_or_dropped() {
    let dir = scratch("announced");
    let path = dir.join("memory.seg");
    let a = Announced::open(&path).expect("open");
    assert_eq!(BUILDING_FD.load(Ordering::SeqCst), a.raw_fd());
    drop(a);
    assert_eq!(BUILDING_FD.load(Ordering::SeqCst), -1, "withdrawn on drop");
    let a = Announced::open(&path).expect("open");
    let fd = a.raw_fd();
    let seg = a.into_segment();
    assert_eq!(
        BUILDING_FD.load(Ordering::SeqCst),
        fd,
        "still announced until the state is published"
    );
    assert_eq!(seg.raw_fd(), fd);
    BUILDING_FD.store(-1, Ordering::SeqCst);
    let _ = std::fs::remove_dir_all(&dir);
}
