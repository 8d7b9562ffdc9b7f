//! Memory that bends, against the fake driver: a tenant bursts past its
//! guarantee (`memory`) up to `memory_max` only into memory no tenant is
//! guaranteed; with `memory_wait`, an allocation refused for want of memory
//! waits for a free instead of failing, until its deadline, and never
//! waits for its own memory.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Host, Opts};

const MIB: u64 = 1 << 20;

/// A test program under the shim on `host` with `quota`, its stdin piped.
fn start(host: &Host, quota: &std::path::Path, args: &[String]) -> Child {
    let mut env = host.env(Some(quota));
    common::set_env(&mut env, "FAKE_CUDA_MEM", "1GiB");
    common::set_env(&mut env, "CUSLICE_LOG", "info");
    let opts = Opts {
        args: args.to_vec(),
        env,
        ..Opts::default()
    };
    let mut cmd = common::command("memtest", &opts);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.spawn().expect("spawn memtest")
}

/// The next "R " line of `child`'s stdout.
fn result(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> String {
    for l in lines.by_ref() {
        let l = l.expect("read");
        if let Some(r) = l.strip_prefix("R ") {
            return r.to_string();
        }
    }
    panic!("the program ended without a result line");
}

/// `key=value` of a result line, as a number.
fn field(line: &str, key: &str) -> i64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// The result line of a program started by [`start`], once it ends (its
/// stdin closed), and its stderr.
fn finish(mut c: Child) -> (String, String) {
    let mut lines = BufReader::new(c.stdout.take().expect("stdout")).lines();
    let r = result(&mut lines);
    drop(c.stdin.take());
    let out = c.wait_with_output().expect("wait");
    (r, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// One allocation of `bytes` by a process of `quota`'s tenant: its status.
fn alloc(host: &Host, quota: &std::path::Path, bytes: u64) -> (i64, String) {
    let (r, err) = finish(start(host, quota, &["timed".into(), bytes.to_string()]));
    (field(&r, "timed"), err)
}

/// A process holding `bytes` until told to free them (a line on stdin).
struct Holder {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Holder {
    fn new(host: &Host, quota: &std::path::Path, bytes: u64) -> Holder {
        let mut child = start(host, quota, &["freeon".into(), bytes.to_string()]);
        let stdin = child.stdin.take().expect("stdin");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        assert_eq!(result(&mut lines), "held");
        Holder {
            child,
            stdin,
            lines,
        }
    }

    /// Frees; when it did (CLOCK_MONOTONIC ns).
    fn free(&mut self) -> i64 {
        writeln!(self.stdin, "free").expect("tell");
        self.stdin.flush().expect("flush");
        field(&result(&mut self.lines), "freed")
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_tenant_bursts_past_its_guarantee_only_into_memory_nobody_is_guaranteed() {
    let host = Host::new("bend", "burst").context_overhead("1MiB");
    let a = host.quota("a", "", "memory = \"256MiB\"\nmemory_max = \"1GiB\"");
    let b = host.quota("b", "", "memory = \"512MiB\"");
    // Alone on the 1 GiB GPU, A bursts to 601 MiB.
    let (r, err) = alloc(&host, &a, 600 * MIB);
    assert_eq!(r, 0, "{err}");
    // With B live (512 MiB guaranteed), A may take only what is left:
    // 256 MiB guaranteed + 256 MiB nobody is.
    let _holder = Holder::new(&host, &b, 2 * MIB);
    let (r, err) = alloc(&host, &a, 600 * MIB);
    assert_eq!(r, 2, "A took memory B is guaranteed: {err}");
    assert!(
        err.contains("past this container's guarantee") && err.contains("no tenant is guaranteed"),
        "{err}"
    );
    let (r, err) = alloc(&host, &a, 500 * MIB);
    assert_eq!(r, 0, "{err}");
    // While A holds its burst, B still reaches its guarantee.
    let mut a_holder = Holder::new(&host, &a, 500 * MIB);
    let (r, err) = alloc(&host, &b, 500 * MIB);
    assert_eq!(
        r, 0,
        "B could not reach its guarantee beside A's burst: {err}"
    );
    // A sees its memory_max as the total and what it can really get as free.
    let (info, _) = finish(start(&host, &a, &["meminfo".into()]));
    assert_eq!(field(&info, "total") as u64, 1 << 30, "{info}");
    assert_eq!(field(&info, "devtotal") as u64, 1 << 30, "{info}");
    let free = field(&info, "free") as u64;
    // 512 MiB for A, less its 500 held and two contexts (1 MiB each).
    assert_eq!(free, 10 * MIB, "{info}");
    a_holder.free();
}

/// A tenant whose process ends keeps its guarantee in the GPU's pool for
/// a while (a restart: a crash loop, a reload, a job script's next step):
/// another tenant bursting right after is held to the memory nobody is
/// guaranteed, and the tenant's next process reaches its whole guarantee
/// at once.
#[test]
fn a_restarting_tenant_finds_its_guarantee_kept_from_the_others_bursts() {
    let host = Host::new("bend", "linger").context_overhead("1MiB");
    let a = host.quota("a", "", "memory = \"512MiB\"");
    let b = host.quota("b", "", "memory = \"256MiB\"\nmemory_max = \"1GiB\"");
    // A's process uses its guarantee and ends.
    let (r, err) = alloc(&host, &a, 500 * MIB);
    assert_eq!(r, 0, "{err}");
    // Right after, B asks for 700 MiB: 445 past its guarantee (with its
    // context), of which only 256 are nobody's while A's 512 are kept.
    let (r, err) = alloc(&host, &b, 700 * MIB);
    assert_eq!(
        r, 2,
        "B took memory A is guaranteed, A between two processes: {err}"
    );
    assert!(err.contains("no tenant is guaranteed"), "{err}");
    let path = cuslice_core::pool::path(&host.gpu_dir(), &common::FAKE_UUID);
    let pool = cuslice_core::pool::Pool::open_read_only(&path).expect("the GPU's pool");
    let entries = pool.entries();
    assert!(
        entries.iter().any(|e| e.name == "a"
            && e.procs == 0
            && e.guarantee == 512 * MIB
            && e.lingering_since.is_some()),
        "A's entry does not linger: {entries:?}"
    );
    // B takes what is nobody's, and holds it.
    let _b = Holder::new(&host, &b, 500 * MIB);
    // A's next process: its whole guarantee (511 MiB and its context).
    let (r, err) = alloc(&host, &a, 511 * MIB);
    assert_eq!(r, 0, "A, back, could not reach its guarantee: {err}");
}

/// The free memory a tenant that may burst sees (`cuMemGetInfo`) gets a
/// dead process's burst back at its next look: a framework sizing its
/// caches by it is not told less than it can get until some process joins
/// the GPU's pool or is refused for want of room there.
#[test]
fn the_free_memory_a_tenant_sees_gets_a_dead_processs_burst_back() {
    let host = Host::new("bend", "tidy").context_overhead("1MiB");
    let a = host.quota("a", "", "memory = \"256MiB\"\nmemory_max = \"1GiB\"");
    let b = host.quota("b", "", "memory = \"256MiB\"\nmemory_max = \"1GiB\"");
    // B runs, asked for its free memory on demand.
    let mut server = start(&host, &b, &["serve".into(), "0".into()]);
    let mut ask = server.stdin.take().expect("stdin");
    let mut lines = BufReader::new(server.stdout.take().expect("stdout")).lines();
    assert_eq!(result(&mut lines), "held");
    let mut free = || {
        writeln!(ask, "info").expect("ask");
        ask.flush().expect("flush");
        let r = result(&mut lines);
        field(&r, "free") as u64
    };
    // A bursts past its guarantee, and its process is killed (it never
    // gives its burst back itself).
    let a_holder = Holder::new(&host, &a, 600 * MIB);
    let path = cuslice_core::pool::path(&host.gpu_dir(), &common::FAKE_UUID);
    let pool = cuslice_core::pool::Pool::open_read_only(&path).expect("the GPU's pool");
    let burst = |pool: &cuslice_core::pool::Pool| {
        pool.entries()
            .iter()
            .find(|e| e.name == "a")
            .map(|e| e.burst)
            .expect("A's entry")
    };
    let a_burst = burst(&pool);
    assert!(a_burst >= 344 * MIB, "A's burst: {a_burst}");
    let before = free();
    drop(a_holder);
    // Past the pool's rate of tidying for B's process (250 ms on an idle
    // machine): asked again until it is, up to 30 s.
    let t = Instant::now();
    let mut after = free();
    while after != before + a_burst && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(50));
        after = free();
    }
    assert_eq!(
        after,
        before + a_burst,
        "B was not told of the memory A's dead process held past its guarantee"
    );
    assert_eq!(burst(&pool), 0, "A's burst still counted");
    drop(ask);
    let _ = server.wait();
}

/// Waits (up to 60 s) until an allocation waits in `host`'s GPU's pool.
fn waiting(host: &Host) {
    let path = cuslice_core::pool::path(&host.gpu_dir(), &common::FAKE_UUID);
    let pool = cuslice_core::pool::Pool::open_read_only(&path).expect("the GPU's pool");
    let t = Instant::now();
    while pool.head().waiters.load(Ordering::Acquire) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no allocation waited in the GPU's pool"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_allocation_waits_for_a_free_and_goes_on() {
    let host = Host::new("bend", "wait").context_overhead("1MiB");
    let q = host.quota("w", "memory_wait = \"5s\"", "memory = \"64MiB\"");
    let mut holder = Holder::new(&host, &q, 48 * MIB);
    let waiter = start(&host, &q, &["timed".into(), (48 * MIB).to_string()]);
    // Freed 300 ms after the allocation is seen waiting (in the GPU's
    // pool), however late a loaded machine started it.
    waiting(&host);
    std::thread::sleep(Duration::from_millis(300));
    let freed = holder.free();
    let (r, err) = finish(waiter);
    assert_eq!(field(&r, "timed"), 0, "{err}");
    let (asked, done) = (field(&r, "asked"), field(&r, "done"));
    assert!(done - asked >= 250_000_000, "it did not wait: {r}");
    let woke_ms = (done - freed) as f64 / 1e6;
    println!("woken {woke_ms:.2} ms after the free");
    // Woken by the free (well under a millisecond on an idle machine), not
    // at its 5 s deadline: the bound is one a loaded machine meets.
    assert!(
        (0.0..2000.0).contains(&woke_ms),
        "granted {woke_ms} ms after the free"
    );
    assert!(
        err.contains("waited") && err.contains("under the quota and was granted"),
        "{err}"
    );
}

#[test]
fn a_wait_ends_at_its_deadline_and_never_waits_for_its_own_memory() {
    let host = Host::new("bend", "deadline").context_overhead("1MiB");
    let q = host.quota("d", "memory_wait = \"300ms\"", "memory = \"64MiB\"");
    let _holder = Holder::new(&host, &q, 48 * MIB);
    let c = start(&host, &q, &["timed".into(), (48 * MIB).to_string()]);
    let (r, err) = finish(c);
    assert_eq!(field(&r, "timed"), 2, "{err}");
    let waited = (field(&r, "done") - field(&r, "asked")) as f64 / 1e6;
    println!("refused {:.2} ms after its 300 ms deadline", waited - 300.0);
    // Not before its deadline; after it, by a bound a loaded machine
    // meets (an idle one: a few milliseconds).
    assert!(
        (300.0..3000.0).contains(&waited),
        "waited {waited} ms: {err}"
    );
    assert!(
        err.contains("the whole memory_wait, and was refused"),
        "{err}"
    );
    // Alone, a process over its quota has nobody to wait for.
    let q = host.quota("alone", "memory_wait = \"5s\"", "memory = \"64MiB\"");
    let t = Instant::now();
    let (r, err) = alloc(&host, &q, 100 * MIB);
    assert_eq!(r, 2, "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "waited for its own memory: {:?}",
        t.elapsed()
    );
    assert!(!err.contains("waited"), "{err}");
}

/// A process killed while its allocation waits never uncounts itself from
/// the GPU's pool's waiters: the next process to join the pool sweeps its
/// slot and takes it off, so frees stop bumping the shared wake-up word
/// (and making the wake-up syscall) for nobody.
#[test]
fn a_process_killed_while_it_waits_is_uncounted_when_the_next_joins() {
    let host = Host::new("bend", "killwait").context_overhead("1MiB");
    let q = host.quota("k", "memory_wait = \"30s\"", "memory = \"64MiB\"");
    let _holder = Holder::new(&host, &q, 48 * MIB);
    let path = cuslice_core::pool::path(&host.gpu_dir(), &common::FAKE_UUID);
    let pool = cuslice_core::pool::Pool::open_read_only(&path).expect("the GPU's pool");
    let waiters = || pool.head().waiters.load(Ordering::Acquire);
    let mut waiter = start(&host, &q, &["timed".into(), (48 * MIB).to_string()]);
    let t = Instant::now();
    while waiters() == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the allocation never waited"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(waiters(), 1);
    waiter.kill().expect("SIGKILL");
    waiter.wait().expect("reap");
    assert_eq!(waiters(), 1, "nothing uncounts it before a sweep");
    let (r, err) = alloc(&host, &q, MIB);
    assert_eq!(r, 0, "{err}");
    assert_eq!(
        waiters(),
        0,
        "the killed waiter is still counted after the next process joined"
    );
}

/// A stream-ordered allocation (it may be captured into a graph) never
/// waits: refused at once, as without `memory_wait`, though another
/// process of the container holds memory it could free.
#[test]
fn a_stream_ordered_allocation_never_waits() {
    let host = Host::new("bend", "async").context_overhead("1MiB");
    let q = host.quota("s", "memory_wait = \"5s\"", "memory = \"64MiB\"");
    let _holder = Holder::new(&host, &q, 48 * MIB);
    let c = start(&host, &q, &["asyncalloc".into(), (48 * MIB).to_string()]);
    let (r, err) = finish(c);
    assert_eq!(field(&r, "timed"), 2, "{err}");
    let ms = (field(&r, "done") - field(&r, "asked")) as f64 / 1e6;
    assert!(ms < 1000.0, "it waited {ms} ms: {err}");
    assert!(!err.contains("waited"), "{err}");
}

#[test]
fn a_burst_refused_by_the_pool_waits_for_another_tenant_to_free() {
    let host = Host::new("bend", "poolwait").context_overhead("1MiB");
    let a = host.quota(
        "a",
        "memory_wait = \"5s\"",
        "memory = \"256MiB\"\nmemory_max = \"1GiB\"",
    );
    let b = host.quota("b", "", "memory = \"256MiB\"\nmemory_max = \"1GiB\"");
    // B bursts to 700 MiB: 444 past its guarantee; A's 400 MiB would need
    // 145 MiB of burst and only 67 are nobody's.
    let mut hb = Holder::new(&host, &b, 700 * MIB);
    let waiter = start(&host, &a, &["timed".into(), (400 * MIB).to_string()]);
    // Freed 300 ms after the allocation is seen waiting.
    waiting(&host);
    std::thread::sleep(Duration::from_millis(300));
    let freed = hb.free();
    let (r, err) = finish(waiter);
    assert_eq!(field(&r, "timed"), 0, "{err}");
    assert!(field(&r, "done") - field(&r, "asked") >= 250_000_000, "{r}");
    assert!(field(&r, "done") >= freed, "{r} before the free at {freed}");
    assert!(
        err.contains("for memory no tenant is guaranteed and was granted"),
        "{err}"
    );
}

/// A GPU memory pool that cannot be used (here: a file of another size in
/// its place): a tenant that may neither burst nor wait runs on, held to
/// its quota, said in one line; one that may burst is refused CUDA, the
/// file named.
#[test]
fn an_unusable_pool_stops_only_a_tenant_that_needs_it() {
    let host = Host::new("bend", "nopool").context_overhead("1MiB");
    std::fs::create_dir_all(host.gpu_dir()).expect("gpu dir");
    let pool = host.gpu_dir().join(format!(
        "{}.memory",
        cuslice_core::config::format_uuid(&common::FAKE_UUID)
    ));
    std::fs::write(&pool, b"not a pool").expect("write");
    let plain = host.quota("plain", "", "memory = \"64MiB\"");
    let (r, err) = alloc(&host, &plain, 32 * MIB);
    assert_eq!(r, 0, "{err}");
    assert!(
        err.contains("its guarantee is not counted in the GPU's memory pool")
            && err.contains(&*pool.to_string_lossy()),
        "{err}"
    );
    let burst = host.quota("burst", "", "memory = \"64MiB\"\nmemory_max = \"128MiB\"");
    let mut env = host.env(Some(&burst));
    common::set_env(&mut env, "FAKE_CUDA_MEM", "1GiB");
    let out = common::command(
        "memtest",
        &Opts {
            args: vec!["alloc".into(), MIB.to_string()],
            env,
            ..Opts::default()
        },
    )
    .output()
    .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&*pool.to_string_lossy()) && err.contains("CUDA_ERROR_NOT_PERMITTED"),
        "{err}"
    );
}

/// Issue 41's late arrival, on one 1 GiB GPU whose memory every process
/// shares: C is guaranteed 512 MiB (holds 2); A, guaranteed 128 MiB,
/// bursts into what nobody is guaranteed; B, guaranteed 256 MiB, starts
/// after A's burst. B may take at once only what nobody reserved or holds
/// (the rest of its guarantee is pending, lent to A), so C still reaches
/// its whole guarantee beside A's burst; B's allocation past what it
/// reserved is refused in one line naming the borrower, or, with
/// `memory_wait`, waits for A's free and is granted. Before the pool knew
/// a pending guarantee, B was granted at once out of C's and C's
/// allocation was the driver's out of memory.
#[test]
fn a_late_arrival_never_takes_an_earlier_guarantee_and_gets_its_own_as_the_borrower_frees() {
    let host = Host::new("bend", "late").context_overhead("1MiB");
    let c = host.quota("c", "", "memory = \"512MiB\"");
    let a = host.quota("a", "", "memory = \"128MiB\"\nmemory_max = \"1GiB\"");
    let b = host.quota("b", "", "memory = \"256MiB\"");
    let bw = host.quota("bw", "memory_wait = \"20s\"", "memory = \"256MiB\"");
    let _c = Holder::new(&host, &c, 2 * MIB);
    // A bursts: 380 MiB and its context, 253 MiB past its guarantee (384
    // were nobody's).
    let mut ha = Holder::new(&host, &a, 380 * MIB);
    // B arrives: 131 MiB nobody reserved or holds; 200 MiB is past them.
    let (r, err) = alloc(&host, &b, 200 * MIB);
    assert_eq!(r, 2, "B was granted memory C is guaranteed: {err}");
    assert!(
        err.contains("still lent out") && err.contains("borrowers, bytes: a 26"),
        "the refusal does not name the borrower: {err}"
    );
    // What B reserved it gets at once.
    let (r, err) = alloc(&host, &b, 100 * MIB);
    assert_eq!(r, 0, "{err}");
    // C reaches its whole guarantee beside A's burst.
    let (r, err) = alloc(&host, &c, 500 * MIB);
    assert_eq!(
        r, 0,
        "C could not reach its guarantee after a late arrival: {err}"
    );
    // A waiting B is granted once A frees, not before.
    let waiter = start(&host, &bw, &["timed".into(), (200 * MIB).to_string()]);
    let path = cuslice_core::pool::path(&host.gpu_dir(), &common::FAKE_UUID);
    let pool = cuslice_core::pool::Pool::open_read_only(&path).expect("the GPU's pool");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !pool
        .entries()
        .iter()
        .any(|e| e.name == "bw" && e.pending > 0 && e.procs > 0)
    {
        assert!(Instant::now() < deadline, "{:?}", pool.entries());
        std::thread::sleep(Duration::from_millis(20));
    }
    let freed = ha.free();
    let (r, err) = finish(waiter);
    assert_eq!(field(&r, "timed"), 0, "{err}");
    assert!(
        field(&r, "done") >= freed,
        "{r} granted before the free at {freed}"
    );
    assert!(
        err.contains("lent out to others' bursts, to come back and was granted"),
        "{err}"
    );
}
