//! GPU health against the fake NVML (`FAKE_NVML_HEALTH`, see
//! tests/fake/README.md): the health source (`cuslice health follow`)
//! judges each failure kind and says each change once (an XID of each
//! class, a non-critical XID that takes nothing out, a query that starts
//! failing where it answered, one that never did, a lost GPU, pending
//! page retirement, row remapping, ECC counts); no flapping back to
//! healthy inside the quiet period; an operator's clear; the watch runs
//! the source and logs each change once; `status` (text and JSON), `top`
//! and the exporter show it. The OCI hook's refusal is in container.rs,
//! the DRA plugin's taints in dra/tests/health.rs.

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/watch.rs"]
mod watch_host;

use common::Proc;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The source's cadence in these tests: asked every 200 ms, memory
/// checked every 500 ms, back in service after 3 s quiet.
const POLL: &str = "200ms";
const CHECK: &str = "500ms";
const QUIET: Duration = Duration::from_secs(3);

/// A host of two fake GPUs: a root for the source and the watch, the
/// file that makes the GPUs sick.
struct Host {
    dir: PathBuf,
}

impl Host {
    fn new(name: &str) -> Host {
        let dir =
            std::env::temp_dir().join(format!("cuslice-health-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root")).expect("mkdir");
        std::fs::write(dir.join("inject"), "").expect("inject file");
        Host { dir }
    }

    fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    /// Appends lines to the injection file (the fake reads it at each
    /// call).
    fn inject(&self, lines: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.join("inject"))
            .expect("inject file");
        f.write_all(lines.as_bytes()).expect("inject");
    }

    fn cuslice(&self) -> Command {
        let e = common::env();
        let mut c = Command::new(env!("CARGO_BIN_EXE_cuslice"));
        c.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("LD_LIBRARY_PATH", &e.fake)
            .env("CUSLICE_REAL_NVML", e.fake.join("libnvidia-ml.so.1"))
            .env("FAKE_CUDA_STATE", self.dir.join("fake.state"))
            .env("FAKE_CUDA_DEVICES", "2")
            .env("FAKE_NVML_HEALTH", self.dir.join("inject"))
            .env("CUSLICE_GPU_SEGMENT_DIR", self.root().join("gpu"))
            .env("XDG_RUNTIME_DIR", &self.dir);
        c
    }

    /// `cuslice health follow` on this host.
    fn follow(&self) -> Proc {
        let mut c = self.cuslice();
        c.arg("health")
            .arg("--root")
            .arg(self.root())
            .args(["follow", "--poll", POLL, "--check", CHECK, "--quiet"])
            .arg(format!("{}s", QUIET.as_secs()));
        let p = Proc::spawn(c, "cuslice health follow");
        p.wait_line("cuslice health: 2 GPUs: ");
        p
    }

    fn output(&self, args: &[&str]) -> String {
        let out = self.cuslice().args(args).output().expect("cuslice");
        assert!(
            out.status.success(),
            "cuslice {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The health source's published state (None: none yet).
    fn published(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&std::fs::read(self.root().join("health/state.json")).ok()?).ok()
    }

    /// Waits until the source has published `n` more times (it writes at
    /// every check, 500 ms here, and at every change): what must not be
    /// said is checked over looks the source made, however slow the
    /// machine, not over a fixed sleep.
    fn after_writes(&self, n: usize) {
        let mut last: Option<f64> = None;
        let mut seen = 0;
        common::wait_for(
            || {
                format!(
                    "not {n} more writes of the health state: {:?}",
                    self.published()
                )
            },
            Duration::from_secs(60),
            || {
                let at = self.published().and_then(|v| v["updated_unix"].as_f64());
                if at.is_some() && at != last {
                    if last.is_some() {
                        seen += 1;
                    }
                    last = at;
                }
                (seen >= n).then_some(())
            },
        );
    }

    fn clear(&self, gpu: &str) -> String {
        let root = self.root().display().to_string();
        self.output(&["health", "--root", &root, "clear", gpu])
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Proc {
    /// The lines containing `needle`, with when each came.
    fn matching(&self, needle: &str) -> Vec<(Instant, String)> {
        self.lines
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, l)| l.contains(needle))
            .cloned()
            .collect()
    }

    /// Waits (at most 20 s) for a line containing `needle`; when it came.
    fn wait_line(&self, needle: &str) -> Instant {
        common::wait_for(
            || format!("no line containing {needle:?}:\n{}", self.text()),
            Duration::from_secs(20),
            || self.matching(needle).first().map(|(t, _)| *t),
        )
    }

    /// The health changes said so far (`GPU i (...): a -> b...`), in order.
    fn changes(&self) -> Vec<String> {
        self.lines
            .lock()
            .expect("lock")
            .iter()
            .filter(|(_, l)| l.contains("): ") && (l.contains(" -> ") || l.contains(": still ")))
            .map(|(_, l)| l.clone())
            .collect()
    }

    fn stop(&mut self) -> String {
        // SAFETY: SIGTERM to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "did not stop:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        self.text()
    }
}

fn uuid(i: u32) -> String {
    format!("GPU-c511ce00-fa4e-4000-8000-0000000000{i:02x}")
}

#[test]
fn each_xid_class_does_what_it_says_and_no_gpu_flaps_back_inside_the_quiet_period() {
    let h = Host::new("xid");
    let p = h.follow();
    // Non-critical XIDs (application errors, an unclassified one) take
    // nothing out: no change at all.
    // A degraded class: shown, in service. Injected after them, and said
    // after them: the one change said once it is (no fixed wait for
    // what must not be said).
    h.inject("0 xid 13\n0 xid 31\n0 xid 43\n1 xid 109\n");
    h.inject("0 xid 94\n");
    p.wait_line(&format!(
        "GPU 0 ({}): healthy -> degraded: XID 94: contained ECC error",
        uuid(0)
    ));
    assert_eq!(p.changes().len(), 1, "{}", p.text());
    // An unhealthy class: out of service, and it stays out until the quiet
    // period has passed, though the GPU answers every query meanwhile.
    h.inject("0 xid 48\n");
    let out = p.wait_line(&format!(
        "GPU 0 ({}): degraded -> unhealthy: XID 48: double-bit ECC error",
        uuid(0)
    ));
    let back = p.wait_line(&format!(
        "GPU 0 ({}): unhealthy -> healthy: nothing seen for the quiet period (3s)",
        uuid(0)
    ));
    // (Times are when the test read each line: 1 s of slack for a loaded
    // machine that read the first late; a source that did not wait would
    // be back at its next poll, 200 ms.)
    assert!(
        back.duration_since(out) >= QUIET - Duration::from_secs(1),
        "back in service {:?} after it was taken out (quiet period {QUIET:?}):\n{}",
        back.duration_since(out),
        p.text()
    );
    // The lost class: unhealthy and lost. GPU 1 only.
    h.inject("1 xid 79\n");
    p.wait_line(&format!(
        "GPU 1 ({}): healthy -> unhealthy (lost): XID 79: the GPU has fallen off the bus",
        uuid(1)
    ));
    // Each change said once, in order, and nothing of GPU 0 flapped.
    let changes = p.changes();
    assert_eq!(changes.len(), 4, "{changes:#?}");
    let text = h.output(&[
        "health",
        "--root",
        &h.root().display().to_string(),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["gpus"][1]["state"], "unhealthy", "{v}");
    assert_eq!(v["gpus"][1]["cause"], "xid-79", "{v}");
    assert_eq!(v["gpus"][1]["lost"], true, "{v}");
    assert_eq!(v["gpus"][1]["judged_by"], "source", "{v}");
    assert_eq!(v["gpus"][0]["state"], "healthy", "{v}");
    assert_eq!(v["source"]["writer"], "cuslice health follow", "{v}");
    assert_eq!(v["source"]["up"], true, "{v}");
}

#[test]
fn queries_that_start_failing_a_lost_gpu_and_an_operators_clear() {
    let h = Host::new("queries");
    // GPU 1 never answers nvmlDeviceGetRemappedRows (a driver that cannot):
    // degraded from the start, not out of service.
    h.inject("1 query_fail nvmlDeviceGetRemappedRows\n");
    let p = h.follow();
    p.wait_line(&format!(
        "GPU 1 ({}): degraded: nvmlDeviceGetRemappedRows has never answered (Unknown Error (999))",
        uuid(1)
    ));
    // On GPU 0, which answered it, the same failure is unhealthy.
    h.inject("0 query_fail nvmlDeviceGetRemappedRows\n");
    p.wait_line(&format!(
        "GPU 0 ({}): healthy -> unhealthy: nvmlDeviceGetRemappedRows fails (Unknown Error (999)) where it answered before",
        uuid(0)
    ));
    // The GPU is reset (the fake answers again), and an operator returns
    // it to service without waiting for the quiet period.
    h.inject("0 ok\n");
    let said = h.clear("0");
    assert!(
        said.contains(&format!("GPU 0 ({}): cleared at ", uuid(0)))
            && said.contains("cuslice health follow (pid "),
        "{said}"
    );
    p.wait_line(&format!(
        "GPU 0 ({}): unhealthy -> healthy: cleared by an operator",
        uuid(0)
    ));
    // A GPU that falls off the bus without an event: every query answers
    // GPU_IS_LOST; seen within a poll (200 ms) on an idle machine: the
    // bound asserted is one a loaded machine meets.
    let at = Instant::now();
    h.inject("0 lost\n");
    let seen = p.wait_line(&format!(
        "GPU 0 ({}): healthy -> unhealthy (lost): nvmlDeviceGetMemoryInfo: GPU is lost (15)",
        uuid(0)
    ));
    assert!(
        seen.duration_since(at) < Duration::from_secs(10),
        "{:?}",
        seen.duration_since(at)
    );
    // A clear while it is still lost does not return it: what is seen
    // after the clear's time still counts, and it is seen at every look.
    let applied = || {
        h.published()
            .and_then(|v| v["gpus"][0]["judge"]["cleared_unix"].as_f64())
    };
    let before = applied();
    h.clear(&uuid(0));
    // The source applied it (its published judgement has the new clear's
    // time), then looked again.
    common::wait_for(
        || format!("the clear never applied: {:?}\n{}", h.published(), p.text()),
        Duration::from_secs(30),
        || (applied() != before).then_some(()),
    );
    h.after_writes(2);
    assert_eq!(
        p.matching("cleared by an operator").len(),
        1,
        "{}",
        p.text()
    );
    let text = h.output(&["health", "--root", &h.root().display().to_string()]);
    assert!(
        text.contains(&format!("GPU 0  {}  unhealthy since ", uuid(0))),
        "{text}"
    );
    // A GPU that is not there is refused by name.
    let out = h
        .cuslice()
        .args(["health", "--root"])
        .arg(h.root())
        .args(["clear", "7"])
        .output()
        .expect("cuslice");
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "cuslice: \"7\": expected a GPU of this host, by index or UUID (2 GPUs listed by NVML)\n"
    );
}

#[test]
fn memory_checks_retirement_remapping_and_ecc_counts() {
    let h = Host::new("memory");
    let p = h.follow();
    h.inject("0 retired_pending 1\n");
    p.wait_line(&format!(
        "GPU 0 ({}): healthy -> degraded: retired pages are pending",
        uuid(0)
    ));
    h.inject("1 remap_failure 1\n");
    p.wait_line(&format!(
        "GPU 1 ({}): healthy -> unhealthy: a row remapping failed: the GPU needs service",
        uuid(1)
    ));
    // Uncorrectable ECC errors appearing while watched: unhealthy.
    h.inject("0 retired_pending 0\n0 ecc_uncorrected 3\n");
    p.wait_line(&format!(
        "GPU 0 ({}): degraded -> unhealthy: uncorrectable ECC errors since the driver loaded rose from 0 to 3",
        uuid(0)
    ));
    // The count stays: after the quiet period, degraded (the errors since
    // the driver loaded are still there), not healthy.
    p.wait_line(&format!(
        "GPU 0 ({}): unhealthy -> degraded: 3 uncorrectable ECC errors since the driver loaded",
        uuid(0)
    ));
    // A GPU without ECC (the checks are not supported) is no sick GPU.
    let h2 = Host::new("no-ecc");
    h2.inject("0 no_ecc\n1 no_events\n");
    let p2 = h2.follow();
    p2.wait_line(&format!(
        "GPU 1 ({}): its XID events cannot be watched (nvmlDeviceRegisterEvents: Not Supported (3))",
        uuid(1)
    ));
    // A few checks (every 500 ms) made: no change said.
    h2.after_writes(3);
    assert_eq!(p2.changes(), Vec::<String>::new(), "{}", p2.text());
    let text = h2.output(&["health", "--root", &h2.root().display().to_string()]);
    assert!(
        text.contains(&format!("GPU 0  {}  healthy\n", uuid(0)))
            && text.contains(&format!("GPU 1  {}  healthy\n", uuid(1)))
            && text.contains("health: cuslice health follow pid "),
        "{text}"
    );
}

/// The health source stops with its process: the file says so, and a
/// command then judges from its own look (a GPU failing now is unhealthy;
/// an XID the stopped source saw no longer counts).
#[test]
fn without_a_source_a_command_judges_from_one_look() {
    let h = Host::new("one-look");
    let root = h.root().display().to_string();
    let text = h.output(&["health", "--root", &root]);
    assert!(
        text.contains(&format!(
            "health: no health source runs here (cuslice watch or the DRA plugin publishes GPU health in {root}/health/state.json); judged from one look now: XID events are not seen"
        )),
        "{text}"
    );
    let mut p = h.follow();
    h.inject("0 xid 48\n");
    p.wait_line("healthy -> unhealthy: XID 48");
    let text = h.output(&["health", "--root", &root]);
    assert!(text.contains("unhealthy since "), "{text}");
    p.stop();
    h.inject("1 query_fail\n");
    let text = h.output(&["health", "--root", &root]);
    assert!(
        text.contains(&format!("GPU 0  {}  healthy\n", uuid(0))),
        "{text}"
    );
    assert!(
        text.contains(&format!("GPU 1  {}  unhealthy since ", uuid(1)))
            && text.contains("nvmlDeviceGetMemoryInfo fails: Unknown Error (999) [one look now]"),
        "{text}"
    );
    assert!(
        text.contains("health: the health source (cuslice health follow pid ")
            && text.contains(") stopped "),
        "{text}"
    );
}

fn watch_config(h: &Host, extra: &str) -> PathBuf {
    let health = format!(
        "health_poll = \"{POLL}\"\nhealth_check = \"{CHECK}\"\nhealth_quiet = \"{}s\"\n{extra}",
        QUIET.as_secs()
    );
    watch_host::config(&h.dir, &h.root(), 250, &health)
}

/// `cuslice watch` runs the health source: each change one log line,
/// once; `status` (text and JSON), `top --once` and the exporter show
/// each GPU's health and reason.
#[test]
fn the_watch_logs_each_change_once_and_status_top_and_the_exporter_show_it() {
    let h = Host::new("watch");
    let cfg = watch_config(&h, "");
    let mut c = h.cuslice();
    c.args(["watch", "--config"]).arg(&cfg);
    let mut w = Proc::spawn(c, "cuslice watch");
    w.wait_line("cuslice watch: health: 2 GPUs: ");
    h.inject("1 xid 79\n");
    w.wait_line(&format!(
        "cuslice watch: health: GPU 1 ({}): healthy -> unhealthy (lost): XID 79: the GPU has fallen off the bus",
        uuid(1)
    ));
    h.inject("0 xid 92\n");
    w.wait_line(&format!(
        "cuslice watch: health: GPU 0 ({}): healthy -> degraded: XID 92: high single-bit ECC error rate",
        uuid(0)
    ));
    let containers = h.root().join("containers").display().to_string();
    let status = h.output(&[
        "status",
        "--containers-root",
        &containers,
        "--interval",
        "0",
    ]);
    let lines: Vec<&str> = status.lines().collect();
    let g1 = lines
        .iter()
        .position(|l| l.starts_with("GPU 1 "))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(lines[g1].starts_with("GPU 1  UNHEALTHY  "), "{status}");
    assert!(
        lines[g1 + 1].starts_with("  ! unhealthy since ")
            && lines[g1 + 1].contains(", lost: XID 79: the GPU has fallen off the bus"),
        "{status}"
    );
    let g0 = lines
        .iter()
        .position(|l| l.starts_with("GPU 0 "))
        .unwrap_or_else(|| panic!("{status}"));
    assert!(lines[g0].starts_with("GPU 0  DEGRADED  "), "{status}");
    assert!(
        lines[g0 + 1].contains("XID 92: high single-bit ECC error rate"),
        "{status}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("health: cuslice watch pid ") && l.contains(" up, last wrote ")),
        "{status}"
    );
    let json = h.output(&[
        "status",
        "--containers-root",
        &containers,
        "--interval",
        "0",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    let gpus = v["gpus"].as_array().expect("gpus");
    let g = |i: u64| {
        gpus.iter()
            .find(|g| g["index"] == i)
            .unwrap_or_else(|| panic!("{v}"))
    };
    assert_eq!(g(1)["health"]["state"], "unhealthy", "{v}");
    assert_eq!(g(1)["health"]["cause"], "xid-79", "{v}");
    assert_eq!(g(1)["health"]["lost"], true, "{v}");
    assert_eq!(g(0)["health"]["state"], "degraded", "{v}");
    assert_eq!(v["health"]["source"]["writer"], "cuslice watch", "{v}");
    // top, one frame.
    let top = h.output(&[
        "top",
        "--once",
        "--interval",
        "0.2",
        "--containers-root",
        &containers,
    ]);
    assert!(
        top.contains("UNHEALTHY") && top.contains("  ! unhealthy since "),
        "{top}"
    );
    // The exporter: the health gauge per GPU, labelled as the others.
    let mut e = h.cuslice();
    e.args([
        "exporter",
        "--listen",
        "127.0.0.1:0",
        "--containers-root",
        &containers,
    ]);
    let ex = Proc::spawn(e, "cuslice exporter");
    ex.wait_line("listening on http://");
    let url = ex.matching("listening on http://")[0]
        .1
        .rsplit(' ')
        .next()
        .expect("url")
        .to_string();
    let body = http_get(&url);
    for (gpu, code) in [(0, 1), (1, 2)] {
        assert!(
            body.contains(&format!(
                "cuslice_gpu_health{{gpu=\"{gpu}\",UUID=\"{}\",modelName=\"cuslice Fake GPU\",Hostname=",
                uuid(gpu)
            )) && body.lines().any(|l| l.starts_with(&format!("cuslice_gpu_health{{gpu=\"{gpu}\"")) && l.ends_with(&format!(" {code}"))),
            "{body}"
        );
    }
    assert!(
        body.contains("cuslice_health_source_up{Hostname="),
        "{body}"
    );
    // Each change said once over the whole run (the source's judgement
    // was not said again at every pass): a few of its writes more.
    h.after_writes(2);
    let log = w.stop();
    assert_eq!(
        log.matches("healthy -> unhealthy (lost): XID 79").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("-> degraded: XID 92").count(), 1, "{log}");
    // Stopped: the file says so.
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(h.root().join("health/state.json")).expect("state.json"),
    )
    .expect("json");
    assert_eq!(state["running"], false, "{state}");
}

/// A minimal HTTP GET of `url` (`http://host:port/path`).
fn http_get(url: &str) -> String {
    use std::io::Read;
    let rest = url.strip_prefix("http://").expect("http url");
    let (addr, path) = rest.split_once('/').expect("path");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    write!(s, "GET /{path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("response");
    out
}

/// A watch restarted keeps a GPU out of service (the judgement is taken
/// up from what it published), and `health = false` runs no source.
#[test]
fn a_restarted_watch_keeps_a_gpu_out_and_health_false_runs_none() {
    let h = Host::new("restart");
    let cfg = watch_config(&h, "");
    let start = || {
        let mut c = h.cuslice();
        c.args(["watch", "--config"]).arg(&cfg);
        let w = Proc::spawn(c, "cuslice watch");
        w.wait_line("cuslice watch: health: 2 GPUs: ");
        w
    };
    let mut w = start();
    h.inject("0 xid 119\n");
    w.wait_line("healthy -> unhealthy: XID 119");
    w.stop();
    let mut w = start();
    // What it took up, said once it has read the published judgement
    // (after its start-up line: waited for, not read at once).
    w.wait_line(&format!(
        "cuslice watch: health: GPU 0 ({}): unhealthy: XID 119: GSP RPC timeout",
        uuid(0)
    ));
    // Still out, then back a quiet period after the XID (not after the
    // restart).
    w.wait_line("unhealthy -> healthy: nothing seen for the quiet period");
    w.stop();
    let h2 = Host::new("off");
    let cfg = watch_config(&h2, "health = false\n");
    let mut c = h2.cuslice();
    c.args(["watch", "--config"]).arg(&cfg);
    let mut w = Proc::spawn(c, "cuslice watch");
    w.wait_line("GPU health off");
    // A few passes of the watch, which run no source.
    let passes = || watch_host::state(&h2.root()).and_then(|s| s["passes"].as_u64());
    common::wait_for(
        || {
            format!(
                "the watch did not pass: {:?}\n{}",
                watch_host::state(&h2.root()),
                w.text()
            )
        },
        Duration::from_secs(60),
        || (passes()? >= 3).then_some(()),
    );
    let log = w.stop();
    assert!(!log.contains("health: "), "{log}");
    assert!(!Path::new(&h2.root().join("health")).exists());
}
