//! Where the host's files are, as types: the one place that spells the
//! names the OCI hook, the DRA plugin, `cuslice run`, `cuslice status` and
//! `cuslice watch` find each other's files by.
//!
//! ```text
//! <root>                      the hook's --root, /run/cuslice (DEFAULT_ROOT); root's, 0700
//!   gpu/<uuid>.seg            the host's per-GPU segments
//!   containers/<id>/          one per container the hook gave a slice
//!     etc/quota.toml          its quota file, alone in its directory (the
//!                             directory is mounted read-only at /etc/cuslice)
//!     container.json          its record (ContainerMeta)
//!     resize.json             the last `cuslice resize` of it (ResizeRecord)
//!     segment/memory.seg      its memory segment (the directory is mounted)
//!     (quota.toml             an older hook's container: its quota file,
//!                             mounted as a file at /etc/cuslice/quota.toml)
//!   claims/<uid>/             one per DRA ResourceClaim the plugin prepared
//!     quota.toml  claim.json  segment/memory.seg  resize.json
//!   ld.so.preload             what the hook mounts at /etc/ld.so.preload
//!   hook.lock                 the hook's tenant check runs under its lock
//!   watch/lock  watch/state.json
//!   health/lock  health/state.json  health/clear.json   GPU health: the
//!                             source's lock, what it publishes, operators' clears
//!
//! <base>/cuslice-run-<pid>-<16 hex digits>/    a `cuslice run` session's
//!   quota.toml  segment/memory.seg             (base: $XDG_RUNTIME_DIR, else $TMPDIR, else /tmp)
//!   resize.json
//! ```
//!
//! [`Layout`] gives the paths under a root (for messages, and for the
//! places that must name a path: a quota file's `segment_dir`, a bind
//! mount's source) and opens them through [`fs::Dir`]: from the root (a
//! path the administrator chose, links on the way to it followed), every
//! component below it is opened without following a link.
//!
//! A container's quota file has a directory of its own, and that
//! directory is what the hook mounts: `cuslice resize` replaces the file
//! by renaming a new one into place, and a bind mount of the file itself
//! would keep showing the container the inode it was given (its new
//! processes would read the old quota); through a mounted directory, the
//! name leads to the current file. Nothing else is put there: the
//! container sees the whole directory (the resize record, the container
//! record and the segment directory stay in the container's directory,
//! out of its sight). A container made by an older hook has its quota
//! file at `containers/<id>/quota.toml`, mounted as a file: it is found
//! there where `containers/<id>/etc` does not exist ([`open_quota_dir`]),
//! and its processes see a resize only once it is recreated.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use crate::fs::{self, Dir};

/// The hook's root, where it keeps the GPU segments, the per-container
/// directories and `ld.so.preload`; the DRA plugin keeps its claims'
/// there too.
pub const DEFAULT_ROOT: &str = "/run/cuslice";
/// The host's per-GPU segments, under the root.
pub const GPU_DIR: &str = "gpu";
/// One directory per container, under the root.
pub const CONTAINERS_DIR: &str = "containers";
/// One directory per DRA claim, under the root: `<root>/claims/<uid>/`
/// holds the claim's quota file `quota.toml` (root's, 0444), its record
/// [`CLAIM_RECORD`] and its memory segment directory `segment/`, which the
/// OCI hook mounts into every container of the claim.
pub const CLAIMS_DIR: &str = "claims";
/// A slice's quota file, in its directory (a container's: in its quota
/// directory, [`QUOTA_DIR`]).
pub const QUOTA_FILE: &str = "quota.toml";
/// A container's quota directory, in its directory: it holds the quota
/// file alone, and the OCI hook mounts it read-only at `/etc/cuslice` in
/// the container (see the module documentation for why a directory).
pub const QUOTA_DIR: &str = "etc";
/// The container record the hook writes in a container's directory.
pub const CONTAINER_RECORD: &str = "container.json";
/// The DRA plugin's record of a claim, in its directory beside its quota
/// file: its namespace, name, UID and the pods it is reserved for (what
/// `cuslice status` and `cuslice watch` name it by).
pub const CLAIM_RECORD: &str = "claim.json";
/// The record of the last `cuslice resize` of a slice, in its directory
/// (`resize::ResizeRecord`; a container's beside its quota directory, out
/// of the container's sight).
pub const RESIZE_RECORD: &str = "resize.json";
/// A slice's memory segment directory, in its directory.
pub const SEGMENT_DIR: &str = "segment";
/// The memory segment file, in a segment directory.
pub const MEMORY_SEGMENT: &str = "memory.seg";
/// The lock file under the root that the hook's tenant check and record
/// write are made under.
pub const LOCK_FILE: &str = "hook.lock";
/// The preload file under the root, mounted at `/etc/ld.so.preload`.
pub const PRELOAD_FILE: &str = "ld.so.preload";
/// The watch's directory under the root: its lock and its state.
pub const WATCH_DIR: &str = "watch";
/// The watch's lock file, in its directory.
pub const WATCH_LOCK: &str = "lock";
/// What the watch last published, in its directory.
pub const WATCH_STATE: &str = "state.json";
/// GPU health's directory under the root (`crate::gpu::health`).
pub const HEALTH_DIR: &str = "health";
/// The lock of the health source that publishes (one per host), in the
/// health directory.
pub const HEALTH_LOCK: &str = "lock";
/// Every GPU's health as the source last published it, in the health
/// directory.
pub const HEALTH_STATE: &str = "state.json";
/// The operators' clears (GPU UUID to the time of the clear), in the
/// health directory.
pub const HEALTH_CLEARS: &str = "clear.json";

/// The host's directories under one root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    root: PathBuf,
}

impl Default for Layout {
    fn default() -> Layout {
        Layout::new(DEFAULT_ROOT)
    }
}

impl Layout {
    pub fn new(root: impl Into<PathBuf>) -> Layout {
        Layout { root: root.into() }
    }

    /// The layout whose containers directory is `dir` (`cuslice status
    /// --containers-root`): its parent's.
    pub fn of_containers_dir(dir: &Path) -> Layout {
        match dir.parent() {
            // A relative name alone (`containers`): the current directory.
            Some(p) if p.as_os_str().is_empty() => Layout::new("."),
            Some(p) => Layout::new(p),
            None => Layout::new("/"),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/gpu`.
    pub fn gpu_dir(&self) -> PathBuf {
        self.root.join(GPU_DIR)
    }

    /// `<root>/containers`.
    pub fn containers_dir(&self) -> PathBuf {
        self.root.join(CONTAINERS_DIR)
    }

    /// `<root>/claims`.
    pub fn claims_dir(&self) -> PathBuf {
        self.root.join(CLAIMS_DIR)
    }

    /// `<root>/containers/<id>`.
    pub fn container(&self, id: &str) -> SliceDir {
        SliceDir {
            kind: SliceKind::Container,
            path: self.containers_dir().join(id),
        }
    }

    /// `<root>/claims/<uid>`.
    pub fn claim(&self, uid: &str) -> SliceDir {
        SliceDir {
            kind: SliceKind::Claim,
            path: self.claims_dir().join(uid),
        }
    }

    /// `<root>/ld.so.preload`.
    pub fn preload(&self) -> PathBuf {
        self.root.join(PRELOAD_FILE)
    }

    /// `<root>/hook.lock`.
    pub fn lock_file(&self) -> PathBuf {
        self.root.join(LOCK_FILE)
    }

    /// `<root>/watch`.
    pub fn watch_dir(&self) -> PathBuf {
        self.root.join(WATCH_DIR)
    }

    /// `<root>/watch/state.json`.
    pub fn watch_state(&self) -> PathBuf {
        self.watch_dir().join(WATCH_STATE)
    }

    /// `<root>/health`.
    pub fn health_dir(&self) -> PathBuf {
        self.root.join(HEALTH_DIR)
    }

    /// `<root>/health/state.json`.
    pub fn health_state(&self) -> PathBuf {
        self.health_dir().join(HEALTH_STATE)
    }

    /// The root, opened: links on the way to it followed (the
    /// administrator's path), nothing below it.
    pub fn open(&self) -> Result<Dir, fs::Error> {
        Dir::open(&self.root)
    }

    /// `<root>/containers/<id>`, opened from the root without following a
    /// link below it.
    pub fn open_container(&self, id: impl AsRef<OsStr>) -> Result<Dir, fs::Error> {
        self.open()?.open_dir(CONTAINERS_DIR)?.open_dir(id)
    }

    /// `<root>/claims/<uid>`, opened from the root without following a
    /// link below it.
    pub fn open_claim(&self, uid: impl AsRef<OsStr>) -> Result<Dir, fs::Error> {
        self.open()?.open_dir(CLAIMS_DIR)?.open_dir(uid)
    }
}

/// Whose directory a [`SliceDir`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliceKind {
    /// `<root>/containers/<id>`: the OCI hook's.
    Container,
    /// `<root>/claims/<uid>`: the DRA plugin's.
    Claim,
    /// `<base>/cuslice-run-<pid>-<random>`: a `cuslice run` session's.
    Run,
}

impl SliceKind {
    /// Its directory under the root (`containers`, `claims`); None for a
    /// run directory, which is in its base.
    pub fn dir_name(self) -> Option<&'static str> {
        match self {
            SliceKind::Container => Some(CONTAINERS_DIR),
            SliceKind::Claim => Some(CLAIMS_DIR),
            SliceKind::Run => None,
        }
    }

    /// Its record in its directory (`container.json`, `claim.json`);
    /// None for a run directory.
    pub fn record(self) -> Option<&'static str> {
        match self {
            SliceKind::Container => Some(CONTAINER_RECORD),
            SliceKind::Claim => Some(CLAIM_RECORD),
            SliceKind::Run => None,
        }
    }

    /// The directory its quota file has to itself, in its directory
    /// ([`QUOTA_DIR`] for a container, whose quota directory is mounted);
    /// None where the quota file is in the slice's directory itself (a
    /// claim's, which the hook copies into each of its containers' quota
    /// directories; a session's, read by its path).
    pub fn quota_dir(self) -> Option<&'static str> {
        match self {
            SliceKind::Container => Some(QUOTA_DIR),
            SliceKind::Claim | SliceKind::Run => None,
        }
    }
}

/// A slice's directory: its quota file, its record and its memory
/// segment directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceDir {
    kind: SliceKind,
    path: PathBuf,
}

impl SliceDir {
    /// The directory of a slice of `kind` at `path` (a container's or a
    /// claim's as listed, a run directory: its base joined with its name).
    pub fn new(kind: SliceKind, path: impl Into<PathBuf>) -> SliceDir {
        SliceDir {
            kind,
            path: path.into(),
        }
    }

    /// The run directory at `path` (its base joined with its name).
    pub fn run(path: impl Into<PathBuf>) -> SliceDir {
        SliceDir {
            kind: SliceKind::Run,
            path: path.into(),
        }
    }

    pub fn kind(&self) -> SliceKind {
        self.kind
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory its quota file is in: `<dir>/etc` for a container
    /// (mounted at `/etc/cuslice` in it), `<dir>` itself for a claim or a
    /// session.
    pub fn quota_dir(&self) -> PathBuf {
        match self.kind.quota_dir() {
            Some(d) => self.path.join(d),
            None => self.path.clone(),
        }
    }

    /// Its quota file: `<dir>/etc/quota.toml` for a container,
    /// `<dir>/quota.toml` for a claim or a session.
    pub fn quota(&self) -> PathBuf {
        self.quota_dir().join(QUOTA_FILE)
    }

    /// Where an older OCI hook put a container's quota file (and mounted
    /// it as a file): `<dir>/quota.toml`; None for a claim or a session,
    /// whose quota file never moved.
    pub fn legacy_quota(&self) -> Option<PathBuf> {
        self.kind.quota_dir().map(|_| self.path.join(QUOTA_FILE))
    }

    /// `<dir>/container.json` or `<dir>/claim.json`; None for a run
    /// directory.
    pub fn record(&self) -> Option<PathBuf> {
        self.kind.record().map(|r| self.path.join(r))
    }

    /// `<dir>/resize.json`.
    pub fn resize_record(&self) -> PathBuf {
        self.path.join(RESIZE_RECORD)
    }

    /// `<dir>/segment`.
    pub fn segment_dir(&self) -> PathBuf {
        self.path.join(SEGMENT_DIR)
    }

    /// `<dir>/segment/memory.seg`.
    pub fn memory_segment(&self) -> PathBuf {
        self.segment_dir().join(MEMORY_SEGMENT)
    }
}

/// The directory a slice's quota file is in, opened ([`open_quota_dir`]).
#[derive(Debug)]
pub struct QuotaDir {
    /// The directory, opened without following a link: the quota file is
    /// [`QUOTA_FILE`] in it.
    pub dir: Dir,
    /// Whether it is the container's own directory because an older hook
    /// put the quota file there (and mounted the file itself: a resize
    /// does not reach the container's new processes).
    pub legacy: bool,
}

/// The directory holding the quota file of the slice of `kind` whose
/// directory `slice` is (opened): for a container its quota directory
/// [`QUOTA_DIR`], opened without following a link (checked to be
/// `owner`'s where given) or, where there is none and a `quota.toml` is
/// in `slice` (a container an older hook made), `slice` itself; for a
/// claim or a session, `slice` itself. A quota directory that is a link
/// or not a directory is an error, never a reason to look elsewhere;
/// neither there is the error of the quota directory missing.
pub fn open_quota_dir(
    slice: &Dir,
    kind: SliceKind,
    owner: Option<(u32, &str)>,
) -> Result<QuotaDir, String> {
    let here = |legacy: bool| -> Result<QuotaDir, String> {
        Ok(QuotaDir {
            dir: slice.try_clone()?,
            legacy,
        })
    };
    let Some(name) = kind.quota_dir() else {
        return here(false);
    };
    // Missing, and an older hook's quota file beside the record (`stat`
    // describes a link there without following it: reading it refuses it).
    if slice.stat(name).is_err_and(|e| e.not_found()) && slice.stat(QUOTA_FILE).is_ok() {
        return here(true);
    }
    let dir = slice
        .open_dir_checked(name, owner)
        .map_err(|e| format!("{}: {e}", slice.join(name).display()))?;
    Ok(QuotaDir { dir, legacy: false })
}

/// What every run directory's name starts with.
pub const RUN_PREFIX: &str = "cuslice-run-";
/// The random part of a run directory's name: hex digits of a u64.
const RUN_RANDOM_DIGITS: usize = 16;

/// Where run directories go, given a process's environment (`var`): its
/// `$XDG_RUNTIME_DIR`, else `$TMPDIR`, else `/tmp`; empty counts as unset.
pub fn run_base(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let var = |k: &str| var(k).filter(|v| !v.is_empty());
    var("XDG_RUNTIME_DIR")
        .or_else(|| var("TMPDIR"))
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
}

/// [`run_base`] for this process.
pub fn run_base_here() -> PathBuf {
    run_base(|k| std::env::var_os(k))
}

/// The name of `pid`'s run directory up to its random part, for messages:
/// `cuslice-run-<pid>-`.
pub fn run_name_prefix(pid: u32) -> String {
    format!("{RUN_PREFIX}{pid}-")
}

/// The name of `pid`'s run directory of random part `random`:
/// `cuslice-run-<pid>-<16 lowercase hex digits>`.
pub fn run_name(pid: u32, random: u64) -> String {
    format!("{}{random:016x}", run_name_prefix(pid))
}

/// The PID whose run directory `name` is: `cuslice-run-<pid>-` and 16
/// lowercase hex digits; None for any other name (the old predictable
/// `cuslice-run-<pid>` included).
pub fn parse_run_name(name: &OsStr) -> Option<u32> {
    let rest = name.to_str()?.strip_prefix(RUN_PREFIX)?;
    let (pid, random) = rest.split_once('-')?;
    let digits = |s: &str, ok: fn(&u8) -> bool| !s.is_empty() && s.bytes().all(|b| ok(&b));
    let hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    if !digits(pid, u8::is_ascii_digit)
        || (pid.len() > 1 && pid.starts_with('0'))
        || random.len() != RUN_RANDOM_DIGITS
        || !digits(random, hex)
    {
        return None;
    }
    pid.parse().ok()
}

/// Whether `name` is the run directory of the run process `pid` (as it
/// sees itself).
pub fn is_run_dir_of(name: &OsStr, pid: u32) -> bool {
    parse_run_name(name) == Some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| {
            vars.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn the_layout_names_every_file_under_its_root() {
        let l = Layout::new("/r");
        assert_eq!(Layout::default().root(), Path::new("/run/cuslice"));
        assert_eq!(l.gpu_dir(), Path::new("/r/gpu"));
        assert_eq!(l.containers_dir(), Path::new("/r/containers"));
        assert_eq!(l.claims_dir(), Path::new("/r/claims"));
        assert_eq!(l.preload(), Path::new("/r/ld.so.preload"));
        assert_eq!(l.lock_file(), Path::new("/r/hook.lock"));
        assert_eq!(l.watch_state(), Path::new("/r/watch/state.json"));
        assert_eq!(l.health_state(), Path::new("/r/health/state.json"));
        let c = l.container("abc");
        assert_eq!(c.kind(), SliceKind::Container);
        assert_eq!(c.path(), Path::new("/r/containers/abc"));
        assert_eq!(c.quota_dir(), Path::new("/r/containers/abc/etc"));
        assert_eq!(c.quota(), Path::new("/r/containers/abc/etc/quota.toml"));
        assert_eq!(
            c.legacy_quota().as_deref(),
            Some(Path::new("/r/containers/abc/quota.toml"))
        );
        assert_eq!(
            c.resize_record(),
            Path::new("/r/containers/abc/resize.json")
        );
        assert_eq!(
            c.record().as_deref(),
            Some(Path::new("/r/containers/abc/container.json"))
        );
        assert_eq!(c.segment_dir(), Path::new("/r/containers/abc/segment"));
        assert_eq!(
            c.memory_segment(),
            Path::new("/r/containers/abc/segment/memory.seg")
        );
        let u = l.claim("uid-1");
        assert_eq!(u.quota_dir(), Path::new("/r/claims/uid-1"));
        assert_eq!(u.quota(), Path::new("/r/claims/uid-1/quota.toml"));
        assert_eq!(u.legacy_quota(), None);
        assert_eq!(
            u.record().as_deref(),
            Some(Path::new("/r/claims/uid-1/claim.json"))
        );
        assert_eq!(
            u.memory_segment(),
            Path::new("/r/claims/uid-1/segment/memory.seg")
        );
        let r = SliceDir::run("/tmp/cuslice-run-1-0123456789abcdef");
        assert_eq!(r.record(), None);
        assert_eq!(
            r.quota(),
            Path::new("/tmp/cuslice-run-1-0123456789abcdef/quota.toml")
        );
        assert_eq!(r.legacy_quota(), None);
        assert_eq!(
            r.segment_dir(),
            Path::new("/tmp/cuslice-run-1-0123456789abcdef/segment")
        );
        assert_eq!(
            Layout::of_containers_dir(Path::new("/x/containers")).root(),
            Path::new("/x")
        );
        assert_eq!(
            Layout::of_containers_dir(Path::new("containers")).root(),
            Path::new(".")
        );
    }

    #[test]
    fn a_slice_directory_is_opened_from_the_root_without_following_a_link() {
        let t = std::env::temp_dir().join(format!("cuslice-layout-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(t.join("root/claims/uid-1")).expect("mkdir");
        std::fs::create_dir_all(t.join("elsewhere")).expect("mkdir");
        std::os::unix::fs::symlink(t.join("elsewhere"), t.join("root/claims/uid-2")).expect("link");
        std::os::unix::fs::symlink(t.join("elsewhere"), t.join("root/containers")).expect("link");
        // The root itself is the administrator's path: a link to it is
        // followed.
        std::os::unix::fs::symlink(t.join("root"), t.join("rootlink")).expect("link");
        let l = Layout::new(t.join("rootlink"));
        let d = l.open_claim("uid-1").expect("a claim");
        assert_eq!(d.path(), t.join("rootlink/claims/uid-1"));
        let e = l.open_claim("uid-2").expect_err("a link");
        assert_eq!(
            e.to_string(),
            format!(
                "{}: expected a directory, got a symlink",
                t.join("rootlink/claims/uid-2").display()
            )
        );
        let e = l.open_container("x").expect_err("a link on the way");
        assert!(
            e.to_string()
                .ends_with("containers: expected a directory, got a symlink"),
            "{e}"
        );
        assert!(l.open_claim("../claims").is_err());
        let _ = std::fs::remove_dir_all(&t);
    }

    /// A container's quota file is in its quota directory; where that is
    /// missing and a `quota.toml` is in the container's directory (an
    /// older hook's container), there; a quota directory that is a link
    /// or a file is an error, never a reason to read the older place. A
    /// claim's and a session's are in their directories.
    #[test]
    fn a_containers_quota_file_is_in_its_quota_directory_else_where_an_older_hook_put_it() {
        let t = std::env::temp_dir().join(format!("cuslice-layout-quota-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let l = Layout::new(&t);
        let ctr = |id: &str| t.join(CONTAINERS_DIR).join(id);
        let opened = |id: &str| {
            let d = l.open_container(id).expect("the container's directory");
            open_quota_dir(&d, SliceKind::Container, None)
        };
        // As this hook lays it out; an older hook's quota file left beside
        // it (a container recreated under the same id) is not the one.
        std::fs::create_dir_all(ctr("new").join(QUOTA_DIR)).expect("mkdir");
        std::fs::write(ctr("new").join(QUOTA_DIR).join(QUOTA_FILE), "new").expect("quota");
        std::fs::write(ctr("new").join(QUOTA_FILE), "old").expect("quota");
        let q = opened("new").expect("the quota directory");
        assert!(!q.legacy);
        assert_eq!(q.dir.path(), l.container("new").quota_dir());
        assert_eq!(q.dir.read_file(QUOTA_FILE, 16).expect("read"), "new");
        // As an older hook laid it out.
        std::fs::create_dir_all(ctr("old")).expect("mkdir");
        std::fs::write(ctr("old").join(QUOTA_FILE), "old").expect("quota");
        let q = opened("old").expect("the container's directory");
        assert!(q.legacy);
        assert_eq!(q.dir.path(), l.container("old").path());
        assert_eq!(q.dir.read_file(QUOTA_FILE, 16).expect("read"), "old");
        // An older hook's quota file that is a link: found there, and
        // refused when read.
        std::fs::create_dir_all(ctr("oldlink")).expect("mkdir");
        std::os::unix::fs::symlink(ctr("old").join(QUOTA_FILE), ctr("oldlink").join(QUOTA_FILE))
            .expect("link");
        let q = opened("oldlink").expect("the container's directory");
        assert!(q.legacy && q.dir.read_file(QUOTA_FILE, 16).is_err());
        // The quota directory a link (to a container's that holds one), or
        // a file: an error naming it, not the older place.
        for (id, what) in [("link", "a symbolic link"), ("file", "a regular file")] {
            std::fs::create_dir_all(ctr(id)).expect("mkdir");
            std::fs::write(ctr(id).join(QUOTA_FILE), "old").expect("quota");
            match id {
                "link" => {
                    std::os::unix::fs::symlink(ctr("new").join(QUOTA_DIR), ctr(id).join(QUOTA_DIR))
                        .expect("link")
                }
                _ => std::fs::write(ctr(id).join(QUOTA_DIR), "x").expect("file"),
            }
            let e = opened(id).expect_err("not a directory");
            assert_eq!(
                e,
                format!(
                    "{}: expected a directory, got {what}",
                    ctr(id).join(QUOTA_DIR).display()
                )
            );
        }
        // Neither: the quota directory is missing.
        std::fs::create_dir_all(ctr("none")).expect("mkdir");
        let e = opened("none").expect_err("no quota file");
        assert!(
            e.starts_with(&format!("{}: ", ctr("none").join(QUOTA_DIR).display())),
            "{e}"
        );
        // Owned by another user than the one required.
        let e = open_quota_dir(
            &l.open_container("new").expect("dir"),
            SliceKind::Container,
            Some((crate::sys::euid() + 1, "the test's")),
        )
        .expect_err("another user's");
        assert!(e.contains("not by the test's uid"), "{e}");
        // A claim's: its directory itself, whatever is in it.
        std::fs::create_dir_all(t.join(CLAIMS_DIR).join("uid-1").join(QUOTA_DIR)).expect("mkdir");
        let d = l.open_claim("uid-1").expect("claim");
        let q = open_quota_dir(&d, SliceKind::Claim, None).expect("claim");
        assert!(!q.legacy);
        assert_eq!(q.dir.path(), l.claim("uid-1").path());
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn the_run_base_is_xdg_runtime_dir_else_tmpdir_else_tmp_empty_being_unset() {
        let x = "XDG_RUNTIME_DIR";
        assert_eq!(
            run_base(env(&[(x, "/run/user/1000"), ("TMPDIR", "/t")])),
            Path::new("/run/user/1000")
        );
        assert_eq!(run_base(env(&[(x, ""), ("TMPDIR", "/t")])), Path::new("/t"));
        assert_eq!(run_base(env(&[("TMPDIR", "/t")])), Path::new("/t"));
        assert_eq!(run_base(env(&[(x, ""), ("TMPDIR", "")])), Path::new("/tmp"));
        assert_eq!(run_base(env(&[])), Path::new("/tmp"));
    }

    #[test]
    fn a_run_directory_name_is_its_pid_and_sixteen_random_hex_digits() {
        let n = run_name(4242, 0x0123_4567_89ab_cdef);
        assert_eq!(n, "cuslice-run-4242-0123456789abcdef");
        assert_eq!(parse_run_name(OsStr::new(&n)), Some(4242));
        assert!(is_run_dir_of(OsStr::new(&n), 4242));
        assert!(!is_run_dir_of(OsStr::new(&n), 424));
        assert!(!is_run_dir_of(OsStr::new(&n), 42420));
        assert_eq!(run_name(7, 1), "cuslice-run-7-0000000000000001");
        assert_eq!(run_name_prefix(7), "cuslice-run-7-");
        for bad in [
            // The old, predictable name.
            "cuslice-run-4242",
            "cuslice-run-4242-",
            "cuslice-run-4242-0123456789abcde",
            "cuslice-run-4242-0123456789abcdef0",
            "cuslice-run-4242-0123456789ABCDEF",
            "cuslice-run-4242-0123456789abcdeg",
            "cuslice-run--0123456789abcdef",
            "cuslice-run-04242-0123456789abcdef",
            "cuslice-run-+4242-0123456789abcdef",
            "cuslice-run-99999999999-0123456789abcdef",
            "cuslice-run-4242-0123456789abcdef (deleted)",
            "xcuslice-run-4242-0123456789abcdef",
            "cuslice-run-4242-01234567-89abcdef",
        ] {
            assert_eq!(parse_run_name(OsStr::new(bad)), None, "{bad}");
        }
    }
}
