//! A child whose output lines are collected (with when each came), in a
//! process group of its own: dropping it kills the group, so that what it
//! started (a `cuslice run` session's program, a watch) does not outlive a
//! test that failed. Test files add the waits they need (`impl Proc` in
//! the test's own module).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub struct Proc {
    pub child: Child,
    pub lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Proc {
    /// Starts `c` (stdout and stderr piped and collected) as the leader
    /// of a new process group.
    pub fn spawn(mut c: Command, what: &str) -> Proc {
        use std::os::unix::process::CommandExt;
        c.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = c
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let lines = Arc::new(Mutex::new(vec![]));
        for r in [
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().expect("stderr")),
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for l in BufReader::new(r).lines() {
                    let Ok(l) = l else { break };
                    lines.lock().expect("lock").push((Instant::now(), l));
                }
            });
        }
        Proc { child, lines }
    }

    /// Every line so far.
    pub fn text(&self) -> String {
        self.lines
            .lock()
            .expect("lock")
            .iter()
            .map(|(_, l)| format!("{l}\n"))
            .collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: SIGKILL to the process group our child leads.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
