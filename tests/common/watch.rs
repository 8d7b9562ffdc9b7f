//! `cuslice watch` in the command's tests (cli/tests): its config file,
//! its state, its start. Apart from `common/mod.rs` because it reads JSON,
//! which the library's own tests have no reader for; a test file takes it
//! with `#[path = "../../tests/common/watch.rs"] mod watch_host;`.
// Each test file uses what it needs (as common/mod.rs).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{self, Proc};

/// Writes `dir/watch.toml`: the watch of the test host whose root is
/// `root`, every `interval_ms`, and `extra` lines.
pub fn config(dir: &Path, root: &Path, interval_ms: u64, extra: &str) -> PathBuf {
    let p = dir.join("watch.toml");
    std::fs::write(
        &p,
        format!(
            "interval = \"{interval_ms}ms\"\nroot = \"{}\"\n{extra}\n",
            root.display()
        ),
    )
    .expect("write watch.toml");
    p
}

/// The watch's published state under `root` (None: none yet, or being
/// written).
pub fn state(root: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(root.join("watch/state.json")).ok()?).ok()
}

/// Starts `cuslice watch --config cfg` (`cuslice`: the command, on the
/// test host's fake GPU) and waits for its first pass.
pub fn start(mut cuslice: Command, cfg: &Path, root: &Path) -> Proc {
    cuslice.args(["watch", "--config"]).arg(cfg);
    let p = Proc::spawn(cuslice, "cuslice watch");
    common::wait_for(
        || format!("the watch never passed:\n{}", p.text()),
        Duration::from_secs(20),
        || state(root).filter(|s| s["passes"].as_u64() >= Some(1) && s["running"] == true),
    );
    p
}

/// The watch's pass count in its state under `root` (waited for, up to
/// 60 s: none yet, or the file being replaced).
pub fn passes(root: &Path) -> u64 {
    common::wait_for(
        || format!("no pass count in the watch's state: {:?}", state(root)),
        Duration::from_secs(60),
        || state(root)?["passes"].as_u64(),
    )
}

/// Waits (up to 60 s) until the watch under `root` has made `n` whole
/// passes from now (the one under way, if any, not counted): what must
/// not happen is checked over passes that ran, however slow the machine,
/// not over a fixed sleep.
pub fn after_passes(root: &Path, n: u64) {
    let until = passes(root) + n + 1;
    common::wait_for(
        || {
            format!(
                "the watch stopped passing before pass {until}: {:?}",
                state(root)
            )
        },
        Duration::from_secs(60),
        || (state(root)?["passes"].as_u64()? >= until).then_some(()),
    );
}
