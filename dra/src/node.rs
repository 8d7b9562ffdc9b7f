//! The node service's core, without gRPC: prepare a claim (its quota file,
//! its CDI spec, a checkpoint entry) and unprepare it. Both idempotent;
//! the checkpoint (`<state dir>/checkpoint.json`, replaced atomically) lets
//! a restarted plugin answer for, and unprepare, what an earlier one
//! prepared.
//!
//! # The node lock
//!
//! Two plugin processes may run on one node at once (a DaemonSet's rolling
//! update starts the new pod while the old one still serves, and
//! `prepare`/`unprepare` by hand run beside both). Each prepare and
//! unprepare (and each claim the cleanup removes, [`crate::cleanup`])
//! therefore runs under an exclusive `flock` on `<state dir>/node.lock`
//! (0600, taken through the host file layer), and reads the checkpoint
//! afresh under it: no two interleave their files, and none writes back a
//! checkpoint that misses what another recorded meanwhile. The holder
//! writes who it is in the file (`cuslice-dra-plugin pid <pid> on <host
//! name>`, the pod's name in Kubernetes). The wait is bounded
//! ([`LOCK_WAIT`]): past it the call fails with one line naming the lock
//! and, where it wrote itself in, its holder.
//!
//! # How a container gets the claim's limits
//!
//! The per-claim CDI spec (`<cdi dir>/cuslice.io-claim_<uid>.json`, device
//! `cuslice.io/claim=<uid>`) does not mount anything itself. It gives the
//! GPU's device nodes (`/dev/nvidia<minor>`, `/dev/nvidiactl`,
//! `/dev/nvidia-uvm`) and runs the OCI hook every other cuslice container
//! uses, `cuslice oci-hook create --claim <uid>` (createRuntime) and
//! `poststop`. The hook takes the quota file this plugin wrote,
//! `<root>/claims/<uid>/quota.toml` (root's, 0444), instead of
//! annotations, copies it into the container's quota directory
//! (`<root>/containers/<id>/etc`, which it mounts read-only at
//! `/etc/cuslice`: `cuslice resize claim:<uid>` writes those copies too,
//! so that a resize reaches the processes the claim's containers start
//! afterwards; this plugin writes only the claim's own file), and mounts
//! the claim's segment directory `<root>/claims/<uid>/segment` (shared by all
//! the claim's containers: they share its memory) at
//! `/run/cuslice/segment`, the host's GPU segments, the library and
//! `/etc/ld.so.preload`. Why the hook and not CDI `mounts`: the hook is
//! what already handles hostile images (it follows no symlink in the
//! image, refuses a directory where a file belongs), refuses containers
//! whose processes would not be host root (user namespaces, rootless
//! runtimes), checks that the container's user can reach every mounted
//! file (ld.so skips an unreadable preload file without a word), and makes
//! the segments with the right modes. CDI mounts would do none of that, and
//! a container could start without its limits. If the hook fails, the
//! container does not start.
//!
//! # Files
//!
//! | path | mode | |
//! |---|---|---|
//! | `<root>` (`/run/cuslice`) | 0700 | as the hook keeps it |
//! | `<root>/claims/<uid>/` | 0700 | |
//! | `<root>/claims/<uid>/quota.toml` | 0444 | |
//! | `<root>/claims/<uid>/segment/` | 0755 | the hook makes `memory.seg` in it |
//! | `<cdi dir>/cuslice.io-claim_<uid>.json` | 0644 | |
//! | `<state dir>/checkpoint.json` | 0600 | |
//! | `<state dir>/node.lock` | 0600 | the node lock |
//!
//! Every file is written through the host file layer (`cuslice-host`, the
//! OCI hook's too): whole, to a new name created exclusively with its mode
//! set (never through a link), synced, renamed into place, the directory
//! synced. The root, the CDI directory and the state directory (the
//! administrator's paths: links on the way to them followed) and every
//! directory below the root (opened without following a link) are kept
//! ours, their modes set and checked. A symlink where a directory of ours
//! belongs is an error, never followed; one where a file of ours belongs
//! is replaced, never written through; unprepare removes a link, never
//! what it points to.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use cuslice_core::config;
use cuslice_host::cdi;
use cuslice_host::container::ClaimRecord;
use cuslice_host::fs::Dir;
use cuslice_host::guarantee;
use cuslice_host::layout::{
    CLAIM_RECORD, CLAIMS_DIR, GPU_DIR, Layout, QUOTA_FILE, RESIZE_RECORD, SEGMENT_DIR,
};
use cuslice_host::resize::{self, ResizeRecord};
use serde::{Deserialize, Serialize};

use crate::claim::{self, Allocation, ClaimRef, Driver, base_request};
use crate::gpus::Gpu;

/// The CDI kind of the per-claim specs.
pub const CDI_KIND: &str = cdi::CLAIM_KIND;

/// How long a prepare or unprepare waits for the node lock (see the
/// module's documentation) before it fails.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// Where things are.
#[derive(Debug, Clone)]
pub struct Config {
    pub driver: Driver,
    /// The hook's `--root` (`/run/cuslice`).
    pub root: PathBuf,
    /// Where CDI specs go (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// Where the checkpoint is (the plugin's directory).
    pub state_dir: PathBuf,
    /// The `cuslice` command the CDI hooks run.
    pub cuslice: PathBuf,
    /// The hook's `--lib`, where not its default.
    pub lib: Option<PathBuf>,
    /// How long to wait for the node lock ([`LOCK_WAIT`]).
    pub lock_wait: Duration,
}

/// One device of a prepared claim, as the kubelet is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    pub request_names: Vec<String>,
    pub pool_name: String,
    pub device_name: String,
    pub cdi_device_ids: Vec<String>,
}

/// A prepared claim, as checkpointed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    pub claim: ClaimRef,
    pub gpu_uuid: String,
    pub memory: u64,
    pub compute: u8,
    pub devices: Vec<PreparedDevice>,
    /// Prepared by hand (`cuslice-dra-plugin prepare --claim FILE`), not
    /// for the kubelet: the cleanup leaves it to `unprepare` by hand (its
    /// claim need not be the API server's).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_hand: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Checkpoint {
    version: u32,
    /// claim UID -> what was prepared.
    claims: BTreeMap<String, Prepared>,
}

const CHECKPOINT_VERSION: u32 = 1;
const CHECKPOINT: &str = "checkpoint.json";
/// The most of the checkpoint that is read (a few hundred bytes a claim).
const CHECKPOINT_MAX: u64 = 64 << 20;
/// The node lock, in the state directory.
pub const LOCK_FILE: &str = "node.lock";
/// The most of the lock file that is read (its holder's line).
const LOCK_HOLDER_MAX: u64 = 256;

pub struct Node {
    cfg: Config,
}

/// The node lock, held until dropped (see the module's documentation):
/// what [`Node::unprepare_held`] asks for, so that it runs under it.
pub struct NodeLock {
    file: std::fs::File,
}

impl Drop for NodeLock {
    fn drop(&mut self) {
        // Its holder's line goes with it (still held here: the lock is let
        // go when the file closes), so that a line in the file is always
        // its holder's.
        let _ = self.file.set_len(0);
    }
}

/// The file name of claim `uid`'s CDI spec in the CDI directory.
fn cdi_spec_name(uid: &str) -> String {
    cdi::file_name(CDI_KIND, uid)
}

/// The claim's quota file `fresh` (as this prepare writes it) with what a
/// `cuslice resize` of the claim on this node set kept over it: where the
/// claim's file in `dir` is still what that resize wrote (its record
/// there applies to it), the same fields set again in `fresh`, and the
/// record (which then applies to the new file too). Ok(None): no resize
/// to keep (none, or the file written again since). Err: one to keep that
/// could not be (the caller writes `fresh` and says so).
fn keep_resize(dir: &Dir, fresh: &str) -> Result<Option<(String, ResizeRecord)>, String> {
    let absent = |e: &cuslice_host::fs::Error| e.not_found();
    let rec_text = match dir.read_file(RESIZE_RECORD, resize::RECORD_MAX) {
        Ok(t) => t,
        Err(e) if absent(&e) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let text = match dir.read_file(QUOTA_FILE, config::MAX_FILE_BYTES) {
        Ok(t) => t,
        Err(e) if absent(&e) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let rec = ResizeRecord::parse(&dir.join(RESIZE_RECORD), &rec_text)?;
    let now = config::parse_file(&dir.join(QUOTA_FILE), &text).map_err(|e| e.to_string())?;
    if !rec.applies_to(&now) {
        return Ok(None);
    }
    let shown = dir.join(QUOTA_FILE);
    let mut edit = config::QuotaEdit::parse(&shown, fresh).map_err(|e| e.to_string())?;
    for c in &rec.changes {
        let entry = if c.entry == resize::ALL {
            Some(config::LimitsEntry::All)
        } else {
            c.entry
                .strip_prefix("device.")
                .and_then(|u| config::parse_uuid(u).ok())
                .map(config::LimitsEntry::Gpu)
        }
        .filter(|e| edit.has(*e))
        .ok_or_else(|| {
            format!(
                "the resize changed [{}], which the claim's quota file no longer has",
                c.entry
            )
        })?;
        let key = config::LimitKey::from_key(&c.field).ok_or_else(|| {
            format!(
                "the resize changed {} in [{}], which is no limit of a quota file",
                c.field, c.entry
            )
        })?;
        edit.set(entry, key, c.to).map_err(|e| e.to_string())?;
    }
    let comment = edit.comment().unwrap_or("written by cuslice-dra-plugin");
    // The shim's reader judges it, as it judges the claim's own file.
    let (kept, cfg) = edit
        .render(&format!("{comment}; resized by `cuslice resize`, kept"))
        .map_err(|e| e.to_string())?;
    if !rec.applies_to(&cfg) {
        return Err("the claim's quota file does not hold the resized limits".into());
    }
    Ok(Some((kept, rec)))
}

/// One line of the plugin's log; the claim's names in it come from the
/// API server (or a claim file given by hand): cleaned for the terminal.
fn log(line: &str) {
    eprintln!("cuslice-dra-plugin: {}", cuslice_host::text::clean(line));
}

/// Who this process is, as it writes itself into the lock it holds.
fn holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let mut s = format!("cuslice-dra-plugin pid {}", std::process::id());
    if !host.is_empty() {
        s.push_str(" on ");
        s.push_str(host);
    }
    s
}

/// A claim UID as a file name: what Kubernetes makes (a UUID), nothing that
/// could climb out of a directory.
pub fn check_uid(uid: &str) -> Result<(), String> {
    let ok = !uid.is_empty()
        && uid.len() <= 64
        && !uid.starts_with(['.', '-'])
        && uid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!("claim uid {uid:?} is not a plain name"))
    }
}

impl Node {
    /// The node; its checkpoint, where there is one, must read.
    pub fn open(cfg: Config) -> Result<Node, String> {
        let node = Node { cfg };
        node.load()?;
        Ok(node)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The checkpoint as the state directory holds it now (replaced whole:
    /// a read without the lock sees one state or the next).
    fn load(&self) -> Result<Checkpoint, String> {
        let p = self.cfg.state_dir.join(CHECKPOINT);
        // The plugin's own file: a regular file of ours, not a link,
        // bounded.
        let text =
            Dir::open(&self.cfg.state_dir).and_then(|d| d.read_file(CHECKPOINT, CHECKPOINT_MAX));
        match text {
            Ok(t) => {
                let c: Checkpoint =
                    serde_json::from_str(&t).map_err(|e| format!("{}: {e}", p.display()))?;
                if c.version != CHECKPOINT_VERSION {
                    return Err(format!(
                        "{}: version {}, this plugin knows {CHECKPOINT_VERSION}",
                        p.display(),
                        c.version
                    ));
                }
                Ok(c)
            }
            Err(e) if e.not_found() => Ok(Checkpoint {
                version: CHECKPOINT_VERSION,
                claims: BTreeMap::new(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    fn save(&self, c: &Checkpoint) -> Result<(), String> {
        let dir = Dir::keep_root(&self.cfg.state_dir, 0o700)?;
        let text = serde_json::to_string_pretty(c).map_err(|e| e.to_string())?;
        Ok(dir.replace_file_synced(CHECKPOINT, text.as_bytes(), 0o600)?)
    }

    /// Takes the node lock (`<state dir>/node.lock`, 0600, the state
    /// directory made 0700 where missing), waiting at most the configured
    /// bound; past it, one line naming the lock and, where it wrote itself
    /// in, its holder. Blocks: call it off the async runtime.
    pub fn lock(&self) -> Result<NodeLock, String> {
        use std::io::{Read, Seek, Write};
        let dir = Dir::keep_root(&self.cfg.state_dir, 0o700)?;
        let wait = self.cfg.lock_wait;
        match dir.lock_within(LOCK_FILE, 0o600, wait)? {
            Ok(mut f) => {
                // Who holds it, for whoever waits on it in vain.
                let _ = f.set_len(0);
                let _ = f.rewind();
                let _ = writeln!(f, "{}", holder());
                Ok(NodeLock { file: f })
            }
            Err(f) => {
                let mut s = String::new();
                let _ = f.take(LOCK_HOLDER_MAX).read_to_string(&mut s);
                let who = cuslice_host::text::clean(s.lines().next().unwrap_or("").trim());
                let path = dir.join(LOCK_FILE);
                Err(if who.is_empty() {
                    format!(
                        "cannot take the node lock {}: another process still holds it after {wait:?}",
                        path.display()
                    )
                } else {
                    format!(
                        "cannot take the node lock {}: {who} still holds it after {wait:?}",
                        path.display()
                    )
                })
            }
        }
    }

    /// The hook's root, as the layout names what is under it.
    fn layout(&self) -> Layout {
        Layout::new(&self.cfg.root)
    }

    /// What is prepared now (claim UID -> entry), as the checkpoint says:
    /// this plugin's and any other's on the node.
    pub fn prepared(&self) -> Result<BTreeMap<String, Prepared>, String> {
        Ok(self.load()?.claims)
    }

    pub fn claim_dir(&self, uid: &str) -> PathBuf {
        self.layout().claim(uid).path().to_path_buf()
    }

    pub fn cdi_spec_path(&self, uid: &str) -> PathBuf {
        self.cfg.cdi_dir.join(cdi_spec_name(uid))
    }

    /// The CDI spec for a prepared claim: the device `<uid>` of kind
    /// [`CDI_KIND`], the GPU's device nodes and cuslice's hooks (`create`
    /// with `--claim <uid>`). Built by the host layer's `cdi`, which
    /// checks the name as CDI does and declares the version it needs (0.5.0
    /// for a UID that starts with a digit, which containerd's and CRI-O's
    /// CDI libraries require; 0.3.0 otherwise). An error where the UID is
    /// no CDI device name or a configured path is not UTF-8.
    pub fn cdi_spec(&self, uid: &str, gpu: &Gpu) -> Result<cdi::Spec, String> {
        let hooks = cdi::OciHooks {
            cuslice: &self.cfg.cuslice,
            root: Some(&self.cfg.root),
            lib: self.cfg.lib.as_deref(),
            claim: Some(uid),
        }
        .hooks()?;
        let device = cdi::Device {
            container_edits: cdi::ContainerEdits {
                device_nodes: [
                    format!("/dev/nvidia{}", gpu.minor),
                    "/dev/nvidiactl".into(),
                    "/dev/nvidia-uvm".into(),
                ]
                .into_iter()
                .map(cdi::DeviceNode::at)
                .collect(),
                hooks,
                ..cdi::ContainerEdits::default()
            },
            name: uid.to_string(),
        };
        cdi::Spec::new(CDI_KIND, vec![device], cdi::ContainerEdits::default())
    }

    /// Prepares `c` for the kubelet: checks its allocation against `gpus`,
    /// writes its quota file and CDI spec, records it, under the node
    /// lock. Again for a prepared claim: the same answer, the files written
    /// again.
    pub fn prepare(
        &self,
        c: &ClaimRef,
        alloc: &Allocation,
        gpus: &[Gpu],
    ) -> Result<Vec<PreparedDevice>, String> {
        self.prepare_as(c, alloc, gpus, false)
    }

    /// [`Node::prepare`] by hand (`prepare --claim FILE`): recorded so, the
    /// cleanup of claims gone from the API server leaves it alone.
    pub fn prepare_by_hand(
        &self,
        c: &ClaimRef,
        alloc: &Allocation,
        gpus: &[Gpu],
    ) -> Result<Vec<PreparedDevice>, String> {
        self.prepare_as(c, alloc, gpus, true)
    }

    fn prepare_as(
        &self,
        c: &ClaimRef,
        alloc: &Allocation,
        gpus: &[Gpu],
        by_hand: bool,
    ) -> Result<Vec<PreparedDevice>, String> {
        // Everything that needs no file first: a bad claim waits for no
        // lock and leaves nothing.
        check_uid(&c.uid)?;
        let s = claim::slice(c, alloc, &self.cfg.driver, gpus)?;
        let spec = self
            .cdi_spec(&c.uid, &s.gpu)
            .map_err(|e| format!("claim {}: {e}", c.label()))?;
        let devices = vec![PreparedDevice {
            // The request a container names (`resources.claims[].request`)
            // is a main one: the kubelet hands a container the devices
            // whose names hold it, so a subrequest of a prioritized list
            // (`gpu/small`) goes by its main request's name (`gpu`).
            request_names: vec![base_request(&s.device.request).to_string()],
            pool_name: s.device.pool.clone(),
            device_name: s.device.device.clone(),
            cdi_device_ids: vec![spec.qualified(&c.uid)],
        }];
        let entry = Prepared {
            claim: c.clone(),
            gpu_uuid: s.gpu.uuid.clone(),
            memory: s.memory,
            compute: s.compute,
            devices: devices.clone(),
            by_hand,
        };
        let _lock = self.lock()?;
        let mut st = self.load()?;
        // Recorded first: a plugin that dies halfway still knows to clean
        // up whatever of it was written.
        let before = st.claims.insert(c.uid.clone(), entry.clone());
        if before.as_ref() != Some(&entry) {
            self.save(&st)?;
        }
        let written = (|| -> Result<(), String> {
            // The root as the hook keeps it: its parents made 0755 (the
            // administrator's path), itself ours and 0700.
            let root = Dir::keep_root(&self.cfg.root, 0o700)?;
            let dir = root.keep_dir(CLAIMS_DIR, 0o700)?.keep_dir(&c.uid, 0o700)?;
            dir.keep_dir(SEGMENT_DIR, 0o755)?;
            // Prepared again (another pod of the claim starting, the
            // plugin restarted): an operator's `cuslice resize` of the
            // claim on this node is kept over the claim's own limits, or
            // a restart would undo it without a word (and leave the
            // claim's containers' copies, which the resize wrote too,
            // disagreeing with the claim's file).
            let quota = match keep_resize(&dir, &s.quota) {
                Ok(None) => s.quota.clone(),
                Ok(Some((text, rec))) => {
                    log(&format!(
                        "claim {}: kept what `cuslice resize` set on this node at {}: {}",
                        c.label(),
                        resize::utc_time_of_day(rec.at_unix),
                        rec.describe()
                    ));
                    text
                }
                Err(e) => {
                    log(&format!(
                        "claim {}: the claim's own limits written again, not what `cuslice resize` set on this node: {e}",
                        c.label()
                    ));
                    s.quota.clone()
                }
            };
            dir.replace_file_synced(QUOTA_FILE, quota.as_bytes(), 0o444)?;
            // The claim's guarantee, registered in its GPU's memory pool
            // before any of its containers runs, kept until unprepare
            // (cuslice_host::guarantee): one that cannot fit beside the
            // others registered there fails the prepare in one line.
            let cfg =
                config::parse_file(&dir.join(QUOTA_FILE), &quota).map_err(|e| e.to_string())?;
            let uuid = config::parse_uuid(&s.gpu.uuid)
                .map_err(|e| format!("GPU {} UUID {:?}: {e}", s.gpu.index, s.gpu.uuid))?;
            root.keep_dir(GPU_DIR, 0o755)?;
            let held = guarantee::register(
                &self.cfg.root.join(GPU_DIR),
                &cfg,
                &[guarantee::GpuMemory {
                    index: s.gpu.index,
                    uuid,
                    total: s.gpu.memory,
                }],
                cuslice_core::pool::Maker::Root,
                Some(0o666),
            )
            .map_err(|e| format!("its memory guarantee: {e}"))?;
            for line in held.iter().filter_map(|r| r.pending_line()) {
                log(&format!("claim {}: {line}", c.label()));
            }
            // Who the claim is for, for `cuslice status` (its row is the
            // claim's namespace/name, its pods say what runs there).
            let record = ClaimRecord {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                uid: c.uid.clone(),
                pods: alloc.pods.clone(),
            };
            let record = serde_json::to_string(&record).map_err(|e| e.to_string())?;
            dir.replace_file_synced(CLAIM_RECORD, (record + "\n").as_bytes(), 0o444)?;
            let cdi = Dir::keep_root(&self.cfg.cdi_dir, 0o755)?;
            cdi.replace_file_synced(&cdi_spec_name(&c.uid), spec.to_json().as_bytes(), 0o644)?;
            Ok(())
        })();
        if let Err(e) = written {
            // Nothing half-made is handed out; the entry stays for
            // unprepare (or the next prepare) to finish.
            return Err(format!("claim {}: {e}", c.label()));
        }
        Ok(devices)
    }

    /// Removes a claim's files and its entry, under the node lock; nothing
    /// to do for a claim not prepared (again, or by nobody).
    pub fn unprepare(&self, uid: &str) -> Result<(), String> {
        check_uid(uid)?;
        let lock = self.lock()?;
        self.unprepare_held(&lock, uid).map(|_| ())
    }

    /// [`Node::unprepare`] with the node lock already held (the cleanup
    /// holds it while it confirms the claim is gone); whether the
    /// checkpoint had the claim.
    pub fn unprepare_held(&self, _lock: &NodeLock, uid: &str) -> Result<bool, String> {
        check_uid(uid)?;
        let mut st = self.load()?;
        // Each removed through its directory's descriptor: a link there
        // is unlinked, never followed; below the claim's directory (the
        // segment directory its containers write) nothing is followed.
        let removed = |dir: Result<Dir, cuslice_host::fs::Error>, name: &str| match dir {
            Ok(d) => d.remove(name),
            Err(e) if e.not_found() => Ok(()),
            Err(e) => Err(e),
        };
        removed(Dir::open(&self.cfg.cdi_dir), &cdi_spec_name(uid))?;
        // Its guarantee leaves its GPU's memory pool: the claim's quota
        // file says whose (read without following a link, bounded).
        let quota = self
            .layout()
            .open()
            .and_then(|r| r.open_dir(CLAIMS_DIR))
            .and_then(|d| d.open_dir(uid))
            .and_then(|d| d.read_file(QUOTA_FILE, config::MAX_FILE_BYTES));
        if let Ok(text) = quota
            && let Ok(cfg) = config::parse_file(std::path::Path::new(QUOTA_FILE), &text)
        {
            for e in guarantee::release(&self.cfg.root.join(GPU_DIR), &cfg) {
                log(&format!("claim {uid}: its memory guarantee: {e}"));
            }
        }
        let claims = self.layout().open().and_then(|r| r.open_dir(CLAIMS_DIR));
        removed(claims, uid)?;
        let had = st.claims.remove(uid).is_some();
        if had {
            self.save(&st)?;
        }
        Ok(had)
    }
}

#[cfg(test)]
mod tests;
