//! The host files of GPU health, under `<root>/health/` (the layout's
//! `HEALTH_*`): what the health source publishes (`state.json`: every
//! GPU's judge, so that short-lived commands read the judgement of a
//! source that saw the XID events, and a restarted source takes it up
//! again), its lock (`lock`: one source publishes per host), and the
//! operators' clears (`clear.json`: GPU UUID to the time it was cleared).
//! Root's directory (0755) and files (0644), written whole through the
//! host file layer (replaced, never through a link), read back without
//! following a link, bounded (by root, only root's files).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::judge::Judge;
use crate::fs::Dir;
use crate::layout::{HEALTH_CLEARS, HEALTH_DIR, HEALTH_LOCK, HEALTH_STATE, Layout};

/// The most of either file that is read.
const FILE_MAX: u64 = 4 << 20;

/// One GPU as the source judges it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuHealth {
    /// NVML's index.
    pub index: u32,
    /// `GPU-...`.
    pub uuid: String,
    /// Whether its XID events are watched (false: NVML cannot deliver
    /// them for this GPU; its checks are still made).
    pub events: bool,
    /// What was seen and the health it makes (`judge.health`).
    pub judge: Judge,
}

/// What the health source publishes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Published {
    /// `cuslice watch`, `cuslice health follow`, `cuslice-dra-plugin`.
    pub writer: String,
    pub pid: u32,
    /// False once it stopped (it writes that on its way out).
    pub running: bool,
    pub started_unix: f64,
    /// When it last wrote (at each change, and at least every
    /// `check_seconds` while it runs).
    pub updated_unix: f64,
    /// Its cadence: how long it waits for an event before it asks each GPU
    /// whether it is alive, and how often it makes the memory checks.
    pub poll_seconds: f64,
    pub check_seconds: f64,
    pub quiet_seconds: f64,
    pub gpus: Vec<GpuHealth>,
}

impl Published {
    /// Whether its writer runs and wrote lately (within two of its
    /// heartbeats, every `check_seconds`, and five seconds): what a
    /// short-lived command trusts.
    pub fn fresh(&self, now: f64) -> bool {
        self.running
            && now - self.updated_unix <= 2.0 * self.check_seconds.max(self.poll_seconds) + 5.0
    }

    /// The GPU of UUID `uuid`.
    pub fn gpu(&self, uuid: &str) -> Option<&GpuHealth> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }
}

/// `<root>/health`, kept (made where missing, root's, 0755; a link there
/// is an error). The root itself is the administrator's path and must
/// exist.
pub fn keep_dir(layout: &Layout) -> Result<Dir, String> {
    Ok(layout.open()?.keep_dir(HEALTH_DIR, 0o755)?)
}

/// Takes the publisher's lock in `dir` without waiting: Some(the lock) if
/// this process is to publish, None where another source holds it.
pub fn try_lock(dir: &Dir) -> Result<Option<std::fs::File>, String> {
    use std::io::{Seek, Write};
    match dir.try_lock(HEALTH_LOCK, 0o644)? {
        Ok(mut f) => {
            let _ = f.set_len(0);
            let _ = f.rewind();
            let _ = writeln!(f, "{}", std::process::id());
            Ok(Some(f))
        }
        Err(_) => Ok(None),
    }
}

/// Writes `p` whole into `dir` (`<root>/health`, held open), 0644.
pub fn write(dir: &Dir, p: &Published) -> Result<(), String> {
    let text = serde_json::to_string_pretty(p)
        .map_err(|e| format!("{}: {e}", dir.join(HEALTH_STATE).display()))?;
    Ok(dir.replace_file(HEALTH_STATE, (text + "\n").as_bytes(), 0o644)?)
}

/// The health directory, opened from the root without following a link;
/// None where it is not there.
fn open_dir(layout: &Layout) -> Result<Option<Dir>, String> {
    match layout.open().and_then(|r| r.open_dir(HEALTH_DIR)) {
        Ok(d) => Ok(Some(d)),
        Err(e) if e.not_found() => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// A file of the health directory, as text; None where it is not there.
/// Read without following a link or blocking, bounded; by root (the OCI
/// hook, the DRA plugin, the watch), only a file of root's: what it acts
/// on is root's to write. Another user reads what it can, for display.
fn read_text(layout: &Layout, name: &str) -> Result<Option<String>, String> {
    let Some(dir) = open_dir(layout)? else {
        return Ok(None);
    };
    match dir.stat(name) {
        Err(e) if e.not_found() => return Ok(None),
        Err(e) => return Err(e.to_string()),
        Ok(_) => {}
    }
    let owner = (crate::sys::euid() == 0).then_some((0, "root's"));
    dir.read_checked(name, owner, FILE_MAX).map(Some)
}

/// What the source under `layout` last published; None where no source
/// ever did. An error (one line, naming the file) where it is there but
/// cannot be read: never taken for "no source".
pub fn read(layout: &Layout) -> Result<Option<Published>, String> {
    let Some(text) = read_text(layout, HEALTH_STATE)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", layout.health_state().display()))
}

/// The operators' clears: GPU UUID to the time (Unix) of its last clear.
pub fn read_clears(layout: &Layout) -> Result<BTreeMap<String, f64>, String> {
    let Some(text) = read_text(layout, HEALTH_CLEARS)? else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_str(&text)
        .map_err(|e| format!("{}: {e}", layout.health_dir().join(HEALTH_CLEARS).display()))
}

/// Records an operator's clear of GPU `uuid` at `at` (Unix time): the
/// health source returns the GPU to service at its next wake (within its
/// poll interval), forgetting what it saw up to then.
pub fn request_clear(layout: &Layout, uuid: &str, at: f64) -> Result<(), String> {
    let dir = keep_dir(layout)?;
    let mut clears = read_clears(layout)?;
    clears.insert(uuid.to_string(), at);
    let text = serde_json::to_string_pretty(&clears)
        .map_err(|e| format!("{}: {e}", dir.join(HEALTH_CLEARS).display()))?;
    Ok(dir.replace_file(HEALTH_CLEARS, (text + "\n").as_bytes(), 0o644)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::health::judge::{Input, Judge};

    #[test]
    fn what_is_published_is_read_back_and_a_bad_file_is_an_error_naming_it() {
        let t = std::env::temp_dir().join(format!("cuslice-health-file-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(&t).expect("mkdir");
        let layout = Layout::new(&t);
        assert_eq!(read(&layout), Ok(None));
        assert_eq!(read_clears(&layout), Ok(BTreeMap::new()));
        let dir = keep_dir(&layout).expect("health dir");
        let mut j = Judge::new(1.0, 300.0);
        j.observe(&Input::Xid(79), 2.0);
        let p = Published {
            writer: "cuslice watch".into(),
            pid: 42,
            running: true,
            started_unix: 1.0,
            updated_unix: 100.0,
            poll_seconds: 5.0,
            check_seconds: 30.0,
            quiet_seconds: 300.0,
            gpus: vec![GpuHealth {
                index: 0,
                uuid: "GPU-x".into(),
                events: true,
                judge: j,
            }],
        };
        write(&dir, &p).expect("written");
        assert_eq!(read(&layout), Ok(Some(p.clone())));
        // Two heartbeats (checks) and 5 s.
        assert!(p.fresh(165.0) && !p.fresh(165.5));
        assert!(
            !Published {
                running: false,
                ..p.clone()
            }
            .fresh(100.0)
        );
        let lock = try_lock(&dir).expect("lock").expect("ours");
        // flock: another open file description cannot take it meanwhile.
        assert!(try_lock(&dir).expect("lock").is_none());
        drop(lock);
        assert!(try_lock(&dir).expect("lock").is_some());
        request_clear(&layout, "GPU-x", 50.0).expect("clear");
        request_clear(&layout, "GPU-y", 60.0).expect("clear");
        assert_eq!(
            read_clears(&layout),
            Ok(BTreeMap::from([
                ("GPU-x".into(), 50.0),
                ("GPU-y".into(), 60.0)
            ]))
        );
        std::fs::write(layout.health_state(), "{not json").expect("write");
        let e = read(&layout).expect_err("bad");
        assert!(
            e.starts_with(&format!("{}: ", layout.health_state().display())),
            "{e}"
        );
        // A link in its place is not followed.
        std::fs::remove_file(layout.health_state()).expect("rm");
        std::os::unix::fs::symlink("/etc/hostname", layout.health_state()).expect("link");
        assert!(read(&layout).is_err());
        let _ = std::fs::remove_dir_all(&t);
    }
}
