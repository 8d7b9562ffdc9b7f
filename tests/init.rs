//! Initialisation faults (issue #14): whatever goes wrong while cuInit
//! builds the quota state, a failure or a panic, ends with CUDA refused
//! (CUDA_ERROR_NOT_PERMITTED) and one error line, for every later cuInit
//! and every thread that waited; nothing hangs. A fork while another thread
//! initialises leaves a child that initialises on its own and holds none of
//! its parent's segment descriptors.
//!
//! The panic and the pause inside initialisation are injected through
//! `CUSLICE_TEST_PANIC_IN_INIT` / `CUSLICE_TEST_INIT_DELAY_MS`, which only
//! debug builds of the shim read (the tests run one).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Host, Opts};

const NOT_PERMITTED: i32 = 800;

/// A host with one container, tenant "t": 64 MiB usable, 1 MiB context.
struct Scene {
    host: Host,
    quota: PathBuf,
}

impl Scene {
    fn new(name: &str) -> Scene {
        let host = Host::new("init", name).context_overhead("1MiB");
        let quota = host.quota("t", "", "memory = \"65MiB\"");
        Scene { host, quota }
    }

    /// Runs `init_app ARGS` under the shim with `extra` in its
    /// environment; fails the test if it does not exit within `limit`.
    fn run(&self, args: &[&str], extra: &[(&'static str, &str)], limit: Duration) -> Done {
        let mut env = self.host.env(Some(&self.quota));
        env.push(("FAKE_CUDA_MEM", "16GiB".to_string()));
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        let opts = Opts {
            args: args.iter().map(|a| a.to_string()).collect(),
            env,
            ..Opts::default()
        };
        let mut child = common::spawn("init_app", &opts);
        let t0 = Instant::now();
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if t0.elapsed() > limit {
                // Its fork children first: they hold the output pipes open.
                for pid in descendants(child.id()) {
                    // SAFETY: kill(2) on a process this test started.
                    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                }
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "init_app {args:?} did not exit within {limit:?}: it hangs\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = child.wait_with_output().expect("output");
        Done {
            ok: status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// The processes below `pid` (children of any of its threads, and
/// theirs).
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let kids = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            for k in kids.split_whitespace().filter_map(|k| k.parse().ok()) {
                all.push(k);
                todo.push(k);
            }
        }
    }
    all
}

struct Done {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Done {
    fn results(&self) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.starts_with("R "))
            .collect()
    }

    /// The line starting with `prefix`.
    fn result(&self, prefix: &str) -> &str {
        self.results()
            .into_iter()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line:\n{}", self.dump()))
    }

    /// cuslice's error lines.
    fn errors(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("cuslice[") && l.contains("]: error: "))
            .collect()
    }

    fn dump(&self) -> String {
        format!("stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }
}

const LIMIT: Duration = Duration::from_secs(30);

#[test]
fn a_panic_while_initialising_refuses_cuda_without_hanging() {
    let s = Scene::new("panic");
    let d = s.run(&["twice"], &[("CUSLICE_TEST_PANIC_IN_INIT", "1")], LIMIT);
    assert!(d.ok, "{}", d.dump());
    assert_eq!(
        d.results(),
        vec![format!("R init1={NOT_PERMITTED} init2={NOT_PERMITTED} ctx={NOT_PERMITTED}").as_str()],
        "{}",
        d.dump()
    );
    let errors = d.errors();
    assert_eq!(errors.len(), 1, "one error line:\n{}", d.dump());
    assert!(
        errors[0].contains("internal error (panic) while setting up")
            && errors[0].contains("CUDA_ERROR_NOT_PERMITTED"),
        "{}",
        d.dump()
    );
}

/// Threads that call cuInit while the first one builds (paused, then
/// panicking) sleep until it is done and get its failure.
#[test]
fn threads_waiting_for_a_panicking_initialiser_see_it_fail() {
    let s = Scene::new("threads");
    let d = s.run(
        &["threads", "8"],
        &[
            ("CUSLICE_TEST_INIT_DELAY_MS", "700"),
            ("CUSLICE_TEST_PANIC_IN_INIT", "1"),
        ],
        LIMIT,
    );
    assert!(d.ok, "{}", d.dump());
    let line = d.result("R results=");
    let want = vec![NOT_PERMITTED.to_string(); 8].join(",");
    assert!(
        line.starts_with(&format!("R results={want} ")),
        "{}",
        d.dump()
    );
    // A waiter that spun would burn its share of a core for the whole
    // 700 ms pause; sleeping ones cost next to nothing.
    let cpu_us: u64 = line
        .rsplit_once("cpu_us=")
        .and_then(|(_, v)| v.parse().ok())
        .expect("cpu_us");
    assert!(
        cpu_us < 300_000,
        "a thread spent {cpu_us} µs of CPU in cuInit"
    );
    assert_eq!(d.errors().len(), 1, "one error line:\n{}", d.dump());
}

/// A real failure path (not injected): a memory segment of the wrong size.
#[test]
fn a_segment_that_cannot_be_used_refuses_every_cuinit() {
    let s = Scene::new("badseg");
    std::fs::create_dir_all(s.host.mem_dir("t")).expect("mkdir");
    let seg = s.host.mem_seg("t");
    std::fs::write(&seg, [0x5au8; 100]).expect("write");
    let d = s.run(&["twice"], &[], LIMIT);
    assert!(d.ok, "{}", d.dump());
    assert_eq!(
        d.results(),
        vec![format!("R init1={NOT_PERMITTED} init2={NOT_PERMITTED} ctx={NOT_PERMITTED}").as_str()],
        "{}",
        d.dump()
    );
    let errors = d.errors();
    assert_eq!(errors.len(), 1, "one error line:\n{}", d.dump());
    assert!(
        errors[0].contains(&seg.display().to_string()) && errors[0].contains("is 100 bytes"),
        "the line names the segment and what is wrong with it:\n{}",
        d.dump()
    );
}

/// The parent forks while its other thread is inside cuInit (paused with
/// the memory segment open and its slot claimed). The child must not
/// inherit the segment descriptor (it would keep the parent's slot lock
/// alive), must not wait for an initialiser it does not have, and must
/// initialise on its own under the same quota.
#[test]
fn a_fork_during_initialisation_leaves_a_usable_child() {
    let s = Scene::new("fork");
    let d = s.run(&["fork"], &[("CUSLICE_TEST_INIT_DELAY_MS", "1500")], LIMIT);
    assert!(d.ok, "{}", d.dump());
    assert_eq!(
        d.result("R child inherited_seg_fds="),
        "R child inherited_seg_fds=0",
        "{}",
        d.dump()
    );
    // Initialised on its own, and policed: 1 MiB fits, 100 MiB does not.
    assert_eq!(
        d.result("R child init="),
        "R child init=0 ctx=0 small=0 big=2",
        "{}",
        d.dump()
    );
    assert_eq!(
        d.result("R child status="),
        "R child status=0",
        "{}",
        d.dump()
    );
    assert_eq!(
        d.result("R parent init="),
        "R parent init=0 small=0",
        "{}",
        d.dump()
    );
}
