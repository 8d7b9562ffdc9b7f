//! `cuslice top` on a real terminal: tmux runs it at 80x24, beside three
//! slices started with `cuslice run` on the fake GPU, and the test reads
//! the screen (`tmux capture-pane`) as a person would: the GPU header from
//! the (fake) NVML, the two live slices with what they run, the third one
//! dimmed and marked `ended` once it stops, then gone after its linger time
//! (`--linger`, 3 s here instead of a minute); no line wraps at 80 columns;
//! `q` and SIGINT both quit and leave the terminal as it was (the normal
//! screen, canonical mode). Needs tmux (scripts/setup.sh installs it).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A private tmux server, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn new() -> Tmux {
        assert!(
            Command::new("tmux")
                .arg("-V")
                .output()
                .is_ok_and(|o| o.status.success()),
            "tmux is not installed (scripts/setup.sh installs it)"
        );
        Tmux {
            socket: format!("cuslice-top-{}", std::process::id()),
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new("tmux");
        c.args(["-L", &self.socket, "-f", "/dev/null"]);
        c
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The screen of `target`: plain, with escape codes (`-e`), or with
    /// wrapped lines joined (`-J`).
    fn screen(&self, target: &str, flag: &str) -> String {
        let mut args = vec!["capture-pane", "-p", "-t", target];
        if !flag.is_empty() {
            args.push(flag);
        }
        self.ok(&args)
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // kill-server leaves the socket file behind: remove it too.
        let socket = self
            .cmd()
            .args(["display-message", "-p", "#{socket_path}"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        let _ = self.cmd().arg("kill-server").output();
        if !socket.is_empty() {
            let _ = std::fs::remove_file(socket);
        }
    }
}

/// A slice started with `cuslice run`, stopped when dropped.
struct Slice {
    child: Child,
}

impl Slice {
    fn tenant(&self) -> String {
        format!("run-{}", self.child.id())
    }

    fn stop(&mut self) {
        // `cuslice run` forwards SIGTERM to the program and then exits.
        // SAFETY: kill on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Slice {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Env {
    dir: PathBuf,
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Env {
    fn vars(&self) -> Vec<(&'static str, String)> {
        let e = common::env();
        vec![
            ("PATH", std::env::var("PATH").unwrap_or_default()),
            (
                "LD_LIBRARY_PATH",
                format!("{}:{}", e.fake.display(), e.apps.display()),
            ),
            ("CUSLICE_LIB", e.shim.display().to_string()),
            (
                "FAKE_CUDA_STATE",
                self.dir.join("fake.state").display().to_string(),
            ),
            (
                "CUSLICE_GPU_SEGMENT_DIR",
                self.dir.join("gpu").display().to_string(),
            ),
            (
                "XDG_RUNTIME_DIR",
                self.dir.join("xdg").display().to_string(),
            ),
            (
                "CUSLICE_REAL_NVML",
                e.fake.join("libnvidia-ml.so.1").display().to_string(),
            ),
            ("CUSLICE_LOG", "warn".into()),
        ]
    }

    /// `cuslice run FLAGS -- PROGRAM ARGS`.
    fn slice(&self, flags: &[&str], program: &str, args: &[&str]) -> Slice {
        let e = common::env();
        let child = Command::new(env!("CARGO_BIN_EXE_cuslice"))
            .env_clear()
            .envs(self.vars())
            .arg("run")
            .args(flags)
            .arg("--")
            .arg(e.apps.join(program))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cuslice run");
        Slice { child }
    }
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The row of `tenant` on `screen`, if shown.
fn row<'a>(screen: &'a str, tenant: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.split_whitespace().next() == Some(tenant))
}

/// The pid of the child of `parent` (the shell tmux started runs top).
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        // pid (comm) state ppid ...: comm may hold spaces, not ')'.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == parent).then_some(pid)
    })
}

fn no_line_wider_than_80(t: &Tmux, target: &str) {
    let joined = t.screen(target, "-J");
    for l in joined.lines() {
        assert!(
            l.trim_end().chars().count() <= 80,
            "a line wraps at 80 columns: {l:?}\n{joined}"
        );
    }
}

#[test]
fn top_on_a_terminal_shows_live_slices_and_lets_an_ended_one_go() {
    let env = Env {
        dir: std::env::temp_dir().join(format!("cuslice-top-{}", std::process::id())),
    };
    let _ = std::fs::remove_dir_all(&env.dir);
    std::fs::create_dir_all(env.dir.join("xdg")).expect("mkdir");
    let gpu_seg = env.dir.join("gpu").join(format!(
        "{}.seg",
        cuslice_core::config::format_uuid(&common::FAKE_UUID)
    ));
    let a = env.slice(&["--compute", "50"], "spin", &["120", "1000000", "4"]);
    let mut c = env.slice(&["--compute", "20"], "memtest", &["hold", "1048576"]);
    let wait_registered = |names: &[String]| {
        common::wait_for(
            || format!("live tenants {names:?} in {}", gpu_seg.display()),
            Duration::from_secs(30),
            || {
                let g = cuslice_core::gpu::GpuSegment::open_read_only(&gpu_seg).ok()?;
                let v = common::GpuView::of(&g);
                names
                    .iter()
                    .all(|n| {
                        v.tenants
                            .iter()
                            .any(|t| &t.name == n && v.procs.iter().any(|p| p.tenant == t.index))
                    })
                    .then_some(())
            },
        )
    };
    wait_registered(&[a.tenant(), c.tenant()]);

    let tmux = Tmux::new();
    let vars: Vec<String> = env
        .vars()
        .into_iter()
        .map(|(k, v)| format!("{k}={}", quote(&v)))
        .collect();
    let top = format!(
        "env -i {} {} top --interval 0.5 --linger 3; echo TOP-EXITED $?; stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon; sleep 600",
        vars.join(" "),
        quote(env!("CARGO_BIN_EXE_cuslice"))
    );
    tmux.ok(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "80",
        "-y",
        "24",
        "sh",
        "-c",
        &top,
    ]);
    let screen = |flag: &str| tmux.screen("top", flag);
    let live = |s: &str, n: &str| row(s, n).is_some_and(|r| r.ends_with(" 1"));
    common::wait_for(
        || format!("top's first frame:\n{}", screen("")),
        Duration::from_secs(30),
        || live(&screen(""), &a.tenant()).then_some(()),
    );
    // A slice that starts while top runs is found, its memory segment too.
    let b = env.slice(
        &["--compute", "30", "--memory", "2GiB"],
        "spin",
        &["120", "1000000", "4"],
    );
    let names = [a.tenant(), b.tenant(), c.tenant()];
    wait_registered(&names);

    // The header, and the three slices live, with their share over the
    // interval and what they run.
    let s = common::wait_for(
        || format!("three live rows with shares:\n{}", screen("")),
        Duration::from_secs(30),
        || {
            let s = screen("");
            // GPU% and THR% measured: numbers, not "-".
            let measured = row(&s, &names[0]).is_some_and(|r| {
                let w: Vec<&str> = r.split_whitespace().collect();
                w.len() > 3 && w[w.len() - 3].parse::<f64>().is_ok()
            });
            (names.iter().all(|n| live(&s, n)) && measured).then_some(s)
        },
    );
    assert!(s.lines().any(|l| l.starts_with("cuslice top ")), "{s}");
    assert!(
        s.lines().any(
            |l| l.starts_with("GPU 0  healthy  cuslice Fake GPU  mem ") && l.contains(" util ")
        ),
        "{s}"
    );
    let ra = row(&s, &names[0]).expect("row");
    assert!(ra.contains(" spin 120 1"), "what it runs: {ra}");
    assert!(ra.contains(" 50% "), "{ra}");
    assert!(
        row(&s, &names[2]).is_some_and(|r| r.contains("memtest hold")),
        "{s}"
    );
    no_line_wider_than_80(&tmux, "top");

    // The third slice stops: its row stays, dimmed and marked ended.
    c.stop();
    let s = common::wait_for(
        || format!("the ended slice dimmed:\n{}", screen("-e")),
        Duration::from_secs(30),
        || {
            let plain = screen("");
            let esc = screen("-e");
            // Marked ended, still saying what it ran.
            let ended = row(&plain, &names[2])
                .is_some_and(|r| r.ends_with(" ended") && r.contains("memtest hold"));
            let dim = esc
                .lines()
                .any(|l| l.contains(&names[2]) && l.contains("\x1b[2m"));
            (ended && dim).then_some(plain)
        },
    );
    assert!(live(&s, &names[0]) && live(&s, &names[1]), "{s}");
    let esc = screen("-e");
    for n in &names[..2] {
        let l = esc.lines().find(|l| l.contains(n.as_str())).expect("row");
        assert!(!l.contains("\x1b[2m"), "a live row is dimmed: {l:?}");
    }
    no_line_wider_than_80(&tmux, "top");

    // Its linger time passes: the row goes, the live ones stay.
    let s = common::wait_for(
        || format!("the ended slice gone:\n{}", screen("")),
        Duration::from_secs(30),
        || {
            let s = screen("");
            row(&s, &names[2]).is_none().then_some(s)
        },
    );
    assert!(live(&s, &names[0]) && live(&s, &names[1]), "{s}");
    assert!(s.contains("2 tenants, 2 live"), "{s}");

    // q quits; the normal screen is back, the terminal in canonical mode.
    tmux.ok(&["send-keys", "-t", "top", "q"]);
    let s = common::wait_for(
        || format!("top to quit on q:\n{}", screen("")),
        Duration::from_secs(20),
        || {
            let s = screen("");
            s.lines().any(|l| l == "icanon").then_some(s)
        },
    );
    assert!(s.contains("TOP-EXITED 0"), "{s}");
    assert!(
        !s.contains("GPU 0"),
        "the frame stays on the normal screen:\n{s}"
    );
    assert_eq!(
        tmux.ok(&["display-message", "-p", "-t", "top", "#{alternate_on}"])
            .trim(),
        "0"
    );

    // SIGINT quits as cleanly.
    tmux.ok(&[
        "new-session",
        "-d",
        "-s",
        "int",
        "-x",
        "80",
        "-y",
        "24",
        "sh",
        "-c",
        &top,
    ]);
    common::wait_for(
        || format!("the second top's frame:\n{}", tmux.screen("int", "")),
        Duration::from_secs(30),
        || live(&tmux.screen("int", ""), &names[0]).then_some(()),
    );
    let shell: u32 = tmux
        .ok(&["display-message", "-p", "-t", "int", "#{pane_pid}"])
        .trim()
        .parse()
        .expect("pane pid");
    let pid = common::wait_for(
        || "top's pid".into(),
        Duration::from_secs(10),
        || child_of(shell),
    );
    // SAFETY: kill on the pid of the top the test started.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let s = common::wait_for(
        || format!("top to quit on SIGINT:\n{}", tmux.screen("int", "")),
        Duration::from_secs(20),
        || {
            let s = tmux.screen("int", "");
            s.lines().any(|l| l == "icanon").then_some(s)
        },
    );
    assert!(s.contains("TOP-EXITED 0"), "{s}");
    assert_eq!(
        tmux.ok(&["display-message", "-p", "-t", "int", "#{alternate_on}"])
            .trim(),
        "0"
    );

    // Its terminal goes away: top ends too (it used to spin at full CPU on
    // the hung-up terminal).
    tmux.ok(&[
        "new-session",
        "-d",
        "-s",
        "hup",
        "-x",
        "80",
        "-y",
        "24",
        "sh",
        "-c",
        &top,
    ]);
    common::wait_for(
        || format!("the third top's frame:\n{}", tmux.screen("hup", "")),
        Duration::from_secs(30),
        || live(&tmux.screen("hup", ""), &names[0]).then_some(()),
    );
    let shell: u32 = tmux
        .ok(&["display-message", "-p", "-t", "hup", "#{pane_pid}"])
        .trim()
        .parse()
        .expect("pane pid");
    let pid = common::wait_for(
        || "top's pid".into(),
        Duration::from_secs(10),
        || child_of(shell),
    );
    tmux.ok(&["kill-session", "-t", "hup"]);
    common::wait_for(
        || format!("top {pid} to end with its terminal"),
        Duration::from_secs(10),
        || {
            // Gone, or a zombie nobody reaps (its parent shell is gone).
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next());
            matches!(state, None | Some("Z" | "X")).then_some(())
        },
    );
    drop((a, b));
}
