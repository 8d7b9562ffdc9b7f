//! `test-reaper PROGRAM ARGS...`: runs one test process so that nothing it
//! starts outlives it. scripts/test.sh makes it nextest's target runner, so
//! every test binary nextest lists or runs is started through it.
//!
//! Why: nextest puts each test in a process group of its own and, past the
//! test's time limit, signals that group. Much of what our tests start is
//! not in it: `cuslice run` sessions, the watch and the soak tenants get
//! process groups of their own (so that a test can stop them as a whole),
//! and podman's conmon double-forks into a session of its own. Killed by
//! its time limit, a test's `Drop` guards never run, and those processes
//! would run on beside later tests (or hold the run's pipes open).
//!
//! How: the reaper is a child subreaper (`PR_SET_CHILD_SUBREAPER`): every
//! process the test orphans, however it detached, becomes the reaper's
//! child instead of init's. When the test exits, or when nextest asks it to
//! stop (SIGTERM, SIGINT, SIGHUP, SIGQUIT: the test is killed at once, its
//! time is up), the reaper kills every process below it, says which it
//! found, removes the podman containers and images and runc containers the
//! test labelled as its own (`cuslice.test.owner=<test pid>`) where the
//! test did not end normally, and exits as the test did.
//!
//! Each test also gets a temporary directory of its own: `TMPDIR` points at
//! a fresh `cuslice-test-XXXXXX` (mode 1777, like /tmp) and
//! `XDG_RUNTIME_DIR` is unset, so that what one test leaves in the
//! temporary directory, and the `cuslice run` sessions `cuslice status`
//! finds there, are never another test's (nextest runs tests of different
//! binaries side by side: a podman test's status once listed a concurrent
//! run test's session). It is removed when the test passes, kept (and
//! named) when it fails.

use std::collections::{HashMap, HashSet};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The label (podman) or annotation (runc) naming the test process that
/// made a container or image.
const OWNER: &str = "cuslice.test.owner";

/// How long the reaper keeps killing what is left before it gives up and
/// says so (nextest's SIGKILL follows its grace period anyway).
const REAP_FOR: Duration = Duration::from_secs(5);

const STOP_SIGNALS: [i32; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: test-reaper PROGRAM [ARGS...]");
        return ExitCode::from(2);
    };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        eprintln!(
            "test-reaper: cannot become a child subreaper: {}",
            std::io::Error::last_os_error()
        );
        return ExitCode::from(2);
    }
    // The stop signals and SIGCHLD are taken with sigtimedwait, never by a
    // handler: blocked here before the test starts, unblocked in the test.
    let set = signal_set();
    // SAFETY: a valid set; this thread is the only one.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    let tmp = match private_tmp() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("test-reaper: cannot make the test's temporary directory: {e}");
            return ExitCode::from(2);
        }
    };
    let mut cmd = Command::new(&program);
    cmd.args(args)
        .env("TMPDIR", &tmp)
        .env_remove("XDG_RUNTIME_DIR");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let empty = empty_set();
            libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "test-reaper: cannot start {}: {e}",
                program.to_string_lossy()
            );
            return ExitCode::from(2);
        }
    };
    let pid = child.id() as libc::pid_t;
    let (status, stopped_by) = wait_for_test(pid, &set);

    let left = reap_all();
    if !left.is_empty() {
        eprintln!(
            "test-reaper: the test (pid {pid}) left {} process(es) running, killed: {}",
            left.len(),
            left.join(", ")
        );
    }
    let normal = stopped_by.is_none() && libc::WIFEXITED(status);
    if !normal || !left.is_empty() {
        remove_containers(pid);
    }
    if normal && libc::WEXITSTATUS(status) == 0 {
        if let Err(e) = std::fs::remove_dir_all(&tmp) {
            eprintln!(
                "test-reaper: cannot remove the test's temporary directory {}: {e}",
                tmp.display()
            );
        }
    } else {
        eprintln!(
            "test-reaper: the test's temporary directory is kept: {}",
            tmp.display()
        );
    }
    if let Some(sig) = stopped_by {
        eprintln!(
            "test-reaper: stopped by signal {sig} (the test's time limit): killed the test (pid {pid}) and all it started"
        );
        die_by(sig);
    }
    let st = std::process::ExitStatus::from_raw(status);
    if let Some(code) = st.code() {
        return ExitCode::from(code as u8);
    }
    die_by(st.signal().unwrap_or(libc::SIGKILL));
}

/// A fresh directory for the test's temporary files, in the reaper's own
/// temporary directory, open to every user as /tmp is (1777: tests run
/// programs as other users).
fn private_tmp() -> std::io::Result<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let template = std::env::temp_dir().join("cuslice-test-XXXXXX");
    let mut bytes = template.as_os_str().as_bytes().to_vec();
    bytes.push(0);
    // SAFETY: a NUL-terminated, writable template that mkdtemp fills in.
    let p = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(std::io::Error::last_os_error());
    }
    bytes.pop();
    let dir = PathBuf::from(std::ffi::OsStr::from_bytes(&bytes));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))?;
    Ok(dir)
}

fn empty_set() -> libc::sigset_t {
    // SAFETY: sigemptyset fills the zeroed set it is given.
    unsafe {
        let mut s: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut s);
        s
    }
}

fn signal_set() -> libc::sigset_t {
    let mut s = empty_set();
    for sig in STOP_SIGNALS.into_iter().chain([libc::SIGCHLD]) {
        // SAFETY: a valid set and signal number.
        unsafe { libc::sigaddset(&mut s, sig) };
    }
    s
}

/// Waits for the test to exit: its wait status, and the stop signal that
/// ended it early (the test is then SIGKILLed).
fn wait_for_test(pid: libc::pid_t, set: &libc::sigset_t) -> (i32, Option<i32>) {
    let mut stopped_by = None;
    loop {
        let tick = libc::timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        };
        // SAFETY: a valid set and timeout; no siginfo wanted.
        let sig = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), &tick) };
        if STOP_SIGNALS.contains(&sig) && stopped_by.is_none() {
            stopped_by = Some(sig);
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // Reap whatever exited (the test, or orphans handed to us).
        loop {
            let mut status = 0;
            // SAFETY: waitpid on our children, with a valid status pointer.
            let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if r == pid {
                return (status, stopped_by);
            }
            if r <= 0 {
                break;
            }
        }
    }
}

/// Every process below this one: pid -> "pid (comm)".
fn descendants() -> HashMap<i32, String> {
    let me = std::process::id() as i32;
    let mut parent: HashMap<i32, (i32, String)> = HashMap::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid ...": comm may hold spaces and parens.
            let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
                continue;
            };
            let comm = stat[open + 1..close].to_string();
            let mut rest = stat[close + 1..].split_whitespace();
            let (_state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse().ok()));
            if let Some(ppid) = ppid {
                parent.insert(pid, (ppid, comm));
            }
        }
    }
    let mut below = HashMap::new();
    let mut frontier: HashSet<i32> = HashSet::from([me]);
    while !frontier.is_empty() {
        let next: HashSet<i32> = parent
            .iter()
            .filter(|(p, (pp, _))| frontier.contains(pp) && !below.contains_key(*p))
            .map(|(p, _)| *p)
            .collect();
        for p in &next {
            below.insert(*p, format!("{p} ({})", parent[p].1));
        }
        frontier = next;
    }
    below
}

/// Kills every process below this one until none is left (or
/// [`REAP_FOR`] has passed): what it found, once each.
fn reap_all() -> Vec<String> {
    let start = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    loop {
        let below = descendants();
        // Zombies not yet reaped are ours and harmless; the rest are killed.
        if below.is_empty() {
            break;
        }
        for (p, what) in &below {
            // SAFETY: kill(2) on a process below this one.
            unsafe { libc::kill(*p, libc::SIGKILL) };
            if !seen.contains(what) {
                seen.push(what.clone());
            }
        }
        loop {
            // SAFETY: waitpid on our children, no status wanted.
            let r = unsafe { libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) };
            if r <= 0 {
                break;
            }
        }
        if start.elapsed() > REAP_FOR {
            eprintln!(
                "test-reaper: after {REAP_FOR:?} these are still alive (unkillable?): {:?}",
                below.values().collect::<Vec<_>>()
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    seen.sort();
    seen
}

/// Output of `prog args` (empty when it cannot run: the tool is absent).
fn capture(prog: &str, args: &[&str]) -> String {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Removes the containers and images the test `pid` labelled as its own.
fn remove_containers(pid: libc::pid_t) {
    let filter = format!("label={OWNER}={pid}");
    for id in capture("podman", &["ps", "-aq", "--filter", &filter]).split_whitespace() {
        let _ = capture("podman", &["rm", "--force", id]);
        eprintln!("test-reaper: removed podman container {id} of the test (pid {pid})");
    }
    for id in capture("podman", &["images", "-q", "--filter", &filter]).split_whitespace() {
        let _ = capture("podman", &["rmi", "--force", id]);
        eprintln!("test-reaper: removed podman image {id} of the test (pid {pid})");
    }
    let owner = format!("\"{OWNER}\":\"{pid}\"");
    for id in capture("runc", &["list", "-q"]).split_whitespace() {
        let state: String = capture("runc", &["state", id])
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if state.contains(&owner) {
            let _ = capture("runc", &["delete", "--force", id]);
            eprintln!("test-reaper: removed runc container {id} of the test (pid {pid})");
        }
    }
}

/// Ends this process by `sig`, as the test ended (nextest reads a death by
/// signal, not an exit code, as a crash or a time-out).
fn die_by(sig: i32) -> ! {
    // SAFETY: default disposition, then unblock and raise: the process ends.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let empty = empty_set();
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::raise(sig);
    }
    std::process::exit(128 + sig)
}
