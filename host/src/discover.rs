//! Finding the slices on the host, and reading their directories: the one
//! discovery that `cuslice status` (and `top`, the exporter) and `cuslice
//! watch` share, so that status shows the slices the watch would judge.
//!
//! A slice's directory ([`Found`]) is one of
//!
//! - a container's, `<root>/containers/<id>/` (the OCI hook's): listed
//!   from the root (or the containers root given: `status
//!   --containers-root`), each opened from the listing without following
//!   a link;
//! - a DRA claim's, `<root>/claims/<uid>/` (the plugin's): likewise, from
//!   the root;
//! - a `cuslice run` session's, `<base>/cuslice-run-<pid>-<random>/`:
//!   every one named as `run` names them in a base (`status`: its own
//!   environment's), or the one a run process holds open (the watch),
//!   opened from its base without following a link, the session user's
//!   where that user is known.
//!
//! What is read in one follows one rule per kind, whoever reads:
//!
//! | kind | quota file | record | resize record |
//! |---|---|---|---|
//! | container | `etc/quota.toml` (an older hook's container: `quota.toml`, [`layout::open_quota_dir`]), ours (the effective uid: root's in production), [`Dir::read_file`] | `container.json`, ours | `resize.json`, ours |
//! | claim | `quota.toml`, ours, [`Dir::read_file`] | `claim.json`, ours | `resize.json`, ours |
//! | session | `quota.toml`, its directory's owner's (the session user's) | none: a `container.json` there is not read | `resize.json`, the session user's |
//!
//! Every file is opened from the directory's descriptor without following
//! a link or blocking on a FIFO, and read bounded. The memory segment is
//! `segment/memory.seg` in the directory (nowhere else), reached from it
//! without following a link; the directory is held and the segment opened
//! from its descriptor ([`PinnedSegment::open`]), so the directory checked
//! is the one read.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use cuslice_core::config::{self, Config};
use cuslice_core::segment::Segment;

use crate::container::{self, ClaimRecord, ContainerMeta, RECORD_MAX};
use crate::fs::{self, Dir, Kind};
use crate::layout::{
    self, CLAIMS_DIR, CONTAINER_RECORD, CONTAINERS_DIR, Layout, MEMORY_SEGMENT, QUOTA_FILE,
    RESIZE_RECORD, SEGMENT_DIR, SliceDir, SliceKind,
};

/// A slice's quota file, found: the directory it is in, opened without
/// following a link, and its path as shown.
#[derive(Debug)]
pub struct QuotaFile {
    /// The directory; the file is [`QUOTA_FILE`] in it.
    pub dir: Dir,
    /// The file's path, as shown.
    pub shown: PathBuf,
    /// Whether it is where an older OCI hook put a container's quota file
    /// (mounted as a file: a resize does not reach the container's new
    /// processes; see `layout`).
    pub legacy: bool,
}
use crate::resize::{self, ResizeRecord};

/// Whose uid an owner check of a session's files names.
pub const SESSION: &str = "the session's";

/// A file's identity, a link described, not followed: device, inode,
/// modification time (s, ns). What tells a file written again.
pub type FileId = (u64, u64, i64, i64);

fn id_of(st: &libc::stat) -> FileId {
    (st.st_dev, st.st_ino, st.st_mtime, st.st_mtime_nsec)
}

/// Where the slices under one root are.
#[derive(Debug, Clone)]
pub struct Places {
    layout: Layout,
    /// A containers root given as such (`status --containers-root`): the
    /// caller's path, links on the way to it followed. None: the layout's,
    /// opened from the root without following a link.
    containers: Option<PathBuf>,
}

impl Places {
    /// The slices under `layout`'s root.
    pub fn new(layout: Layout) -> Places {
        Places {
            layout,
            containers: None,
        }
    }

    /// The containers in `dir` (a containers root given), the claims
    /// beside it (`<dir>/../claims`, from its parent).
    pub fn with_containers_dir(dir: &Path) -> Places {
        Places {
            layout: Layout::of_containers_dir(dir),
            containers: Some(dir.to_path_buf()),
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The containers root, as shown.
    pub fn containers_dir(&self) -> PathBuf {
        self.containers
            .clone()
            .unwrap_or_else(|| self.layout.containers_dir())
    }

    /// The containers root, opened: the one given as it is, else
    /// `<root>/containers` from the root without following a link.
    pub fn open_containers(&self) -> Result<Dir, fs::Error> {
        match &self.containers {
            Some(d) => Dir::open(d),
            None => self.layout.open()?.open_dir(CONTAINERS_DIR),
        }
    }

    /// `<root>/claims`, from the root without following a link.
    pub fn open_claims(&self) -> Result<Dir, fs::Error> {
        self.layout.open()?.open_dir(CLAIMS_DIR)
    }

    /// Every container's directory, by id (names that are not UTF-8 are no
    /// container's); none where the containers root cannot be listed.
    pub fn containers(&self) -> Vec<Found> {
        let Ok(d) = self.open_containers() else {
            return vec![];
        };
        let root = self.containers_dir();
        listed(&d)
            .into_iter()
            .map(|id| Found::in_dir(&d, SliceKind::Container, &id, root.join(&id)))
            .collect()
    }

    /// Every DRA claim's directory, by UID.
    pub fn claims(&self) -> Vec<Found> {
        let Ok(d) = self.open_claims() else {
            return vec![];
        };
        listed(&d)
            .into_iter()
            .map(|uid| self.claim_in(&d, &uid))
            .collect()
    }

    /// The claims directory's entry `uid` (`claims`: `<root>/claims`,
    /// opened).
    pub fn claim_in(&self, claims: &Dir, uid: &str) -> Found {
        Found::in_dir(
            claims,
            SliceKind::Claim,
            uid,
            self.layout.claim(uid).path().to_path_buf(),
        )
    }

    /// Claim `uid`'s directory (Err in `dir` where `<root>/claims` is not
    /// there or is a link).
    pub fn claim(&self, uid: &str) -> Found {
        match self.open_claims() {
            Ok(d) => self.claim_in(&d, uid),
            Err(e) => Found {
                kind: SliceKind::Claim,
                name: uid.to_string(),
                paths: self.layout.claim(uid),
                entry: None,
                dir: Err(e.to_string()),
            },
        }
    }
}

/// The names in `d` that are UTF-8, sorted.
fn listed(d: &Dir) -> Vec<String> {
    let mut v: Vec<String> = d
        .list()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .collect();
    v.sort();
    v
}

/// Every run directory in `base` (a path as the reader reaches it, links
/// on the way followed: the user's base may be one), by name: those named
/// as `cuslice run` names them, each opened without following a link,
/// whoever owns it (its files are then its owner's). None where `base`
/// cannot be listed.
pub fn runs_in(base: &Path) -> Vec<Found> {
    let Ok(b) = Dir::open(base) else {
        return vec![];
    };
    listed(&b)
        .into_iter()
        .filter(|n| layout::parse_run_name(OsStr::new(n)).is_some())
        .map(|n| {
            let dir = b
                .open_dir_checked(&n, None)
                .map_err(|e| named(&base.join(&n), e));
            Found {
                kind: SliceKind::Run,
                entry: b.stat(&n).ok().map(|st| id_of(&st)),
                paths: SliceDir::run(base.join(&n)),
                name: n,
                dir,
            }
        })
        .collect()
}

/// The run directory `name` in `base` (reached as [`runs_in`] reaches
/// it), shown as `shown` (the directory as the run process sees it),
/// opened without following a link and, where `owner` is given, checked
/// to be that uid's (the run process's user's).
pub fn run(base: &Path, name: &OsStr, shown: &Path, owner: Option<u32>) -> Result<Found, String> {
    let b = Dir::open(base).map_err(String::from)?;
    let dir = b
        .open_dir_checked(name, owner.map(|u| (u, SESSION)))
        .map_err(|e| named(shown, e))?;
    Ok(Found {
        kind: SliceKind::Run,
        name: name.to_string_lossy().into_owned(),
        paths: SliceDir::run(shown),
        entry: b.stat(name).ok().map(|st| id_of(&st)),
        dir: Ok(dir),
    })
}

fn named(p: &Path, e: impl std::fmt::Display) -> String {
    format!("{}: {e}", p.display())
}

/// A slice's directory found on the host.
#[derive(Debug)]
pub struct Found {
    pub kind: SliceKind,
    /// The container's id, the claim's UID, the run directory's name.
    pub name: String,
    /// Its paths, as shown (a session's as its run process sees them).
    pub paths: SliceDir,
    /// The identity of its entry in the directory listed (a link planted
    /// there is a change too); None: not there.
    pub entry: Option<FileId>,
    /// The directory, opened without following a link; Err: why not (a
    /// link, not a directory, gone, another user's).
    pub dir: Result<Dir, String>,
}

impl Found {
    fn in_dir(parent: &Dir, kind: SliceKind, name: &str, shown: PathBuf) -> Found {
        Found {
            kind,
            name: name.to_string(),
            paths: SliceDir::new(kind, shown),
            entry: parent.stat(name).ok().map(|st| id_of(&st)),
            dir: parent.open_dir(name).map_err(String::from),
        }
    }

    fn dir(&self) -> Result<&Dir, String> {
        self.dir.as_ref().map_err(Clone::clone)
    }

    /// The identity of the entry `name` in its directory (None: not
    /// there, or the directory could not be opened).
    pub fn file_id(&self, name: &str) -> Option<FileId> {
        let st = self.dir.as_ref().ok()?.stat(name).ok()?;
        Some(id_of(&st))
    }

    /// Where its quota file is ([`layout::open_quota_dir`]: a container's
    /// in its quota directory, or where an older hook put it; a claim's or
    /// a session's in its directory), the quota directory checked to be
    /// the owner's its files must be.
    pub fn quota_file(&self) -> Result<QuotaFile, String> {
        let d = self.dir()?;
        let q = layout::open_quota_dir(d, self.kind, Some(self.files_owner()?))?;
        let shown = match self.paths.legacy_quota() {
            Some(old) if q.legacy => old,
            _ => self.paths.quota(),
        };
        Ok(QuotaFile {
            dir: q.dir,
            shown,
            legacy: q.legacy,
        })
    }

    /// The identity of its quota file (where [`Found::quota_file`] finds
    /// it).
    pub fn quota_id(&self) -> Option<FileId> {
        let st = self.quota_file().ok()?.dir.stat(QUOTA_FILE).ok()?;
        Some(id_of(&st))
    }

    /// The identity of its record (`container.json`, `claim.json`; None
    /// for a session).
    pub fn record_id(&self) -> Option<FileId> {
        self.file_id(self.kind.record()?)
    }

    /// Who owns the directory (a session's: its user).
    pub fn owner(&self) -> Option<u32> {
        let d = self.dir.as_ref().ok()?;
        crate::sys::fstat(d.as_fd()).ok().map(|st| st.st_uid)
    }

    /// Its quota file, parsed: a container's or a claim's ours (root's in
    /// production: the hook and the plugin write them), a session's its
    /// directory's owner's; never followed, never blocking, bounded.
    pub fn quota(&self) -> Result<Config, String> {
        let q = self.quota_file()?;
        match self.kind {
            SliceKind::Container | SliceKind::Claim => {
                let text = q.dir.read_file(QUOTA_FILE, config::MAX_FILE_BYTES)?;
                config::parse_file(&q.shown, &text).map_err(|e| e.to_string())
            }
            SliceKind::Run => {
                let uid = self
                    .owner()
                    .ok_or_else(|| named(self.paths.path(), "cannot stat it"))?;
                container::read_quota(q.dir.as_fd(), &q.shown, Some((uid, SESSION)))
            }
        }
    }

    /// Who must own the files in its directory: ours for a container or a
    /// claim (root's in production), the directory's owner's (the session
    /// user's) for a session.
    fn files_owner(&self) -> Result<(u32, &'static str), String> {
        match self.kind {
            SliceKind::Container | SliceKind::Claim => Ok(ours()),
            SliceKind::Run => self
                .owner()
                .map(|uid| (uid, SESSION))
                .ok_or_else(|| named(self.paths.path(), "cannot stat it")),
        }
    }

    /// Its quota file's text, read as [`Found::quota`] reads it (what
    /// `cuslice resize` rewrites).
    pub fn quota_text(&self) -> Result<String, String> {
        let q = self.quota_file()?;
        let owner = self.files_owner()?;
        q.dir
            .read_checked(QUOTA_FILE, Some(owner), config::MAX_FILE_BYTES)
    }

    /// The record of its last resize (`resize.json`), read as its quota
    /// file is (whose, never followed, never blocking, bounded): Ok(None)
    /// where there is none, Err where what is there is not one.
    pub fn resize(&self) -> Result<Option<ResizeRecord>, String> {
        let d = self.dir()?;
        if d.stat(RESIZE_RECORD).is_err_and(|e| e.not_found()) {
            return Ok(None);
        }
        let owner = self.files_owner()?;
        let text = d.read_checked(RESIZE_RECORD, Some(owner), resize::RECORD_MAX)?;
        ResizeRecord::parse(&self.paths.resize_record(), &text).map(Some)
    }

    /// A container's record (`container.json`), ours: Err where it cannot
    /// be read (the hook writes it last) or for a slice of another kind,
    /// Ok(None) where what is there is no record.
    pub fn record(&self) -> Result<Option<ContainerMeta>, String> {
        if self.kind != SliceKind::Container {
            return Err(named(self.paths.path(), "not a container's directory"));
        }
        let d = self.dir()?;
        let text = d.read_checked(CONTAINER_RECORD, Some(ours()), RECORD_MAX)?;
        Ok(serde_json::from_str(&text).ok())
    }

    /// A claim's record (`claim.json`), ours; None where there is no
    /// readable one (or for a slice of another kind).
    pub fn claim_record(&self) -> Option<ClaimRecord> {
        if self.kind != SliceKind::Claim {
            return None;
        }
        container::read_claim_record(self.dir.as_ref().ok()?, Some(ours()))
    }

    /// Whether its memory segment is there: `segment/memory.seg` a regular
    /// file itself, `segment/` a directory itself (a link is not
    /// followed).
    pub fn has_segment(&self) -> bool {
        self.dir.as_ref().is_ok_and(|d| {
            d.open_path_beneath(&Path::new(SEGMENT_DIR).join(MEMORY_SEGMENT))
                .is_ok_and(|(_, st)| Kind::File.matches(st.st_mode))
        })
    }

    /// Its memory segment's directory, opened from its directory without
    /// following a link (checked to be `owner`'s where given), held: the
    /// segment is opened from it ([`PinnedSegment::open`]).
    pub fn segment(&self, owner: Option<(u32, &str)>) -> Result<PinnedSegment, String> {
        let d = self.dir()?;
        let seg = d
            .open_dir_checked(SEGMENT_DIR, owner)
            .map_err(|e| named(&self.paths.segment_dir(), e))?;
        Ok(PinnedSegment::at(seg, MEMORY_SEGMENT))
    }
}

/// A segment's directory held open, and the segment's name in it: the
/// segment is opened from the directory's descriptor, so that the
/// directory checked is the one read (its owner cannot swap a link in
/// between).
#[derive(Debug)]
pub struct PinnedSegment {
    dir: Dir,
    name: OsString,
}

impl PinnedSegment {
    /// The segment `name` (a plain name) in `dir`, held.
    pub fn at(dir: Dir, name: impl Into<OsString>) -> PinnedSegment {
        PinnedSegment {
            dir,
            name: name.into(),
        }
    }

    /// The segment's path, as shown.
    pub fn shown(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// The memory segment, mapped read-write where `writable` (whoever
    /// owns it), else read-only: opened from the held directory without
    /// following a link or blocking ([`Dir::open_segment`], core's
    /// [`Segment::from_fd`]). Errors name [`PinnedSegment::shown`].
    pub fn open(&self, writable: bool) -> Result<Segment, String> {
        self.open_owned(writable, None)
    }

    /// [`PinnedSegment::open`], the file checked on the descriptor it is
    /// mapped from to be a regular file owned by `owner` where given (a
    /// session's segment: its user's, for the watch's repair).
    pub fn open_owned(
        &self,
        writable: bool,
        owner: Option<(u32, &str)>,
    ) -> Result<Segment, String> {
        let shown = self.shown();
        let fd = self
            .dir
            .open_segment(&self.name, writable)
            .map_err(|e| open_failed(&e, &shown, "memory segment"))?;
        if owner.is_some() {
            fs::check_fd(fd.as_fd(), Kind::File, owner).map_err(|e| named(&shown, e))?;
        }
        Segment::from_fd(fd, &shown).map_err(|e| e.to_string())
    }

    /// Whether the segment is there as a regular file owned by `owner`
    /// where given, checked on a descriptor opened from the held directory
    /// (no link followed, never blocking), without mapping it; Err names
    /// it and says what is wrong.
    pub fn check(&self, owner: Option<(u32, &str)>) -> Result<(), String> {
        let fd = self.dir.open_segment(&self.name, false)?;
        fs::check_fd(fd.as_fd(), Kind::File, owner).map_err(|e| named(&self.shown(), e))
    }
}

/// Why the segment file `shown` (core's `what`: "memory segment", "GPU
/// memory pool") could not be opened, in the words core's own open says
/// it.
pub fn open_failed(e: &fs::Error, shown: &Path, what: &str) -> String {
    match e.errno() {
        Some(n) => format!(
            "{}: cannot open {what}: {}",
            shown.display(),
            std::io::Error::from_raw_os_error(n)
        ),
        None => e.to_string(),
    }
}

/// The owner required of the files under the hook's root: the reader's
/// effective uid (root, in production).
fn ours() -> (u32, &'static str) {
    (crate::sys::euid(), "our")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{CLAIM_RECORD, QUOTA_DIR};
    use std::os::unix::fs::symlink;

    /// A test's directory, removed when the test ends.
    struct Tmp(PathBuf);

    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tmp(name: &str) -> Tmp {
        let d = std::env::temp_dir().join(format!(
            "cuslice-host-discover-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        Tmp(d)
    }

    fn fifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "{p:?}");
    }

    /// A slice's directory: a quota file naming `tenant`, a segment file
    /// (its content is core's business, not the discovery's).
    fn slice(d: &Path, tenant: &str) {
        std::fs::create_dir_all(d.join(SEGMENT_DIR)).expect("mkdir");
        std::fs::write(d.join(QUOTA_FILE), format!("tenant = \"{tenant}\"\n")).expect("quota");
        std::fs::write(d.join(SEGMENT_DIR).join(MEMORY_SEGMENT), b"seg").expect("seg");
    }

    const RUN: &str = "cuslice-run-42-0123456789abcdef";

    /// A host with a container, a claim and a run session, and junk
    /// beside each: a container directory that is a link, a claim whose
    /// record is a FIFO and whose quota file is a link, a run directory
    /// whose segment directory is a link and one with a planted
    /// `container.json`, a name `run` never gives.
    fn host(t: &Path) -> (Places, PathBuf) {
        let root = t.join("root");
        let base = t.join("base");
        // The container, as the hook lays it out: its quota file in its
        // quota directory.
        let c = root.join(CONTAINERS_DIR).join("c1");
        slice(&c, "web");
        std::fs::create_dir(c.join(QUOTA_DIR)).expect("mkdir");
        std::fs::rename(c.join(QUOTA_FILE), c.join(QUOTA_DIR).join(QUOTA_FILE)).expect("mv");
        std::fs::write(c.join(CONTAINER_RECORD), r#"{"id":"c1","name":"web-1"}"#).expect("rec");
        // Junk: a container directory that is a link to a slice elsewhere.
        slice(&t.join("elsewhere"), "planted");
        symlink(t.join("elsewhere"), root.join(CONTAINERS_DIR).join("c2")).expect("link");
        // The claim, as the plugin lays it out.
        let u = root.join(CLAIMS_DIR).join("uid-1");
        slice(&u, "team-a/trainer");
        std::fs::write(
            u.join(CLAIM_RECORD),
            r#"{"namespace":"team-a","name":"trainer","pods":["team-a/trainer-0"]}"#,
        )
        .expect("rec");
        // Junk: a claim whose quota file is a link and record a FIFO.
        let bad = root.join(CLAIMS_DIR).join("uid-2");
        slice(&bad, "unused");
        std::fs::remove_file(bad.join(QUOTA_FILE)).expect("rm");
        symlink("/dev/zero", bad.join(QUOTA_FILE)).expect("link");
        fifo(&bad.join(CLAIM_RECORD));
        // The session, as `run` lays it out, with a container record
        // planted beside its quota file.
        let r = base.join(RUN);
        slice(&r, "run-42");
        std::fs::write(r.join(CONTAINER_RECORD), r#"{"id":"forged","name":"prod"}"#).expect("rec");
        // Junk: a run directory whose segment directory is a link, one
        // that is a link, a name `run` never gives.
        let r2 = base.join("cuslice-run-43-0123456789abcdef");
        std::fs::create_dir_all(&r2).expect("mkdir");
        std::fs::write(r2.join(QUOTA_FILE), "tenant = \"run-43\"\n").expect("quota");
        symlink(t.join("elsewhere").join(SEGMENT_DIR), r2.join(SEGMENT_DIR)).expect("link");
        symlink(
            t.join("elsewhere"),
            base.join("cuslice-run-44-0123456789abcdef"),
        )
        .expect("link");
        slice(&base.join("cuslice-run-45"), "old-name");
        (Places::new(Layout::new(&root)), base)
    }

    #[test]
    fn containers_claims_and_sessions_are_found_and_nothing_planted_is_followed() {
        let t = tmp("find");
        let (places, base) = host(&t.0);
        let c = places.containers();
        assert_eq!(
            c.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["c1", "c2"]
        );
        let c1 = &c[0];
        assert_eq!(c1.kind, SliceKind::Container);
        assert_eq!(c1.paths.path(), t.0.join("root/containers/c1"));
        assert_eq!(c1.quota().map(|q| q.tenant_name()), Ok("web".into()));
        assert!(c1.quota_id().is_some());
        assert_eq!(
            c1.record().map(|r| r.and_then(|r| r.name)),
            Ok(Some("web-1".into()))
        );
        assert!(c1.has_segment() && c1.record_id().is_some() && c1.entry.is_some());
        let seg = c1.segment(None).expect("segment");
        assert!(seg.check(None).is_ok(), "a regular file, held");
        assert_eq!(seg.shown(), c1.paths.memory_segment());
        // Opened from its directory's descriptor: "seg" is no segment,
        // said naming the file as shown.
        let e = seg.open(false).err().expect("not a segment");
        assert!(
            e.starts_with(&format!(
                "{}: not a cuslice memory segment",
                seg.shown().display()
            )),
            "{e}"
        );
        // What cannot be opened is said as core's open says it.
        let missing = PinnedSegment::at(Dir::open(&t.0).expect("dir"), "missing.seg");
        assert_eq!(
            missing.open(false).err().expect("missing"),
            format!(
                "{}: cannot open memory segment: No such file or directory (os error 2)",
                t.0.join("missing.seg").display()
            )
        );
        let me = crate::sys::euid();
        seg.check(Some((me, "our"))).expect("a file of ours");
        let e = seg.check(Some((me + 1, SESSION))).expect_err("another's");
        assert!(
            e.ends_with(&format!("not by the session's uid {}", me + 1)),
            "{e}"
        );
        let e = seg
            .open_owned(false, Some((me + 1, SESSION)))
            .err()
            .expect("another's");
        assert!(
            e.ends_with(&format!("not by the session's uid {}", me + 1)),
            "{e}"
        );
        // The link: listed (its entry is there, a change to watch), never
        // opened.
        let c2 = &c[1];
        assert!(
            c2.dir.as_ref().is_err_and(|e| e.contains("got a symlink")),
            "{:?}",
            c2.dir
        );
        assert!(c2.quota().is_err() && c2.record().is_err() && !c2.has_segment());
        assert!(c2.entry.is_some());

        let u = places.claims();
        assert_eq!(
            u.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            ["uid-1", "uid-2"]
        );
        assert_eq!(
            u[0].quota().map(|q| q.tenant_name()),
            Ok("team-a/trainer".into())
        );
        assert_eq!(
            u[0].claim_record().and_then(|r| r.namespaced_name()),
            Some("team-a/trainer".into())
        );
        assert!(u[0].has_segment());
        // A quota file that is a link to /dev/zero, a record that is a
        // FIFO: neither read, nothing blocks.
        let e = u[1].quota().expect_err("a link");
        assert!(e.contains("uid-2/quota.toml"), "{e}");
        assert_eq!(u[1].claim_record(), None);
        // A claim is found alone by its UID too; a record of another kind
        // is no claim's.
        assert_eq!(
            places.claim("uid-1").quota().map(|q| q.tenant_name()),
            Ok("team-a/trainer".into())
        );
        assert_eq!(u[0].record().ok(), None);

        let r = runs_in(&base);
        assert_eq!(
            r.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
            [
                RUN,
                "cuslice-run-43-0123456789abcdef",
                "cuslice-run-44-0123456789abcdef"
            ]
        );
        assert_eq!(r[0].quota().map(|q| q.tenant_name()), Ok("run-42".into()));
        // A session has no record: a container.json planted there is not
        // read.
        assert!(r[0].record().is_err() && r[0].record_id().is_none());
        assert!(r[0].has_segment());
        // Its segment directory a link: no segment, and not opened.
        assert!(!r[1].has_segment());
        assert!(r[1].segment(None).is_err());
        // The directory a link: not opened.
        assert!(r[2].dir.is_err() && r[2].quota().is_err());
    }

    #[test]
    fn a_file_of_the_wrong_owner_is_not_read() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return; // needs chown
        }
        let t = tmp("owner");
        let (places, base) = host(&t.0);
        let c = t.0.join("root/containers/c1");
        std::os::unix::fs::chown(c.join(CONTAINER_RECORD), Some(4242), None).expect("chown");
        std::os::unix::fs::chown(c.join(QUOTA_DIR).join(QUOTA_FILE), Some(4242), None)
            .expect("chown");
        let u = t.0.join("root/claims/uid-1");
        std::os::unix::fs::chown(u.join(CLAIM_RECORD), Some(4242), None).expect("chown");
        let found = places.containers();
        let e = found[0].record().expect_err("another user's record");
        assert!(e.contains("owned by uid 4242, not by our uid 0"), "{e}");
        let e = found[0].quota().expect_err("another user's quota file");
        assert!(
            e.contains("expected a file of uid 0, got one of uid 4242"),
            "{e}"
        );
        assert_eq!(places.claims()[0].claim_record(), None);
        // A session's files are its user's: the directory's owner's.
        let r = base.join(RUN);
        std::os::unix::fs::chown(&r, Some(4242), None).expect("chown");
        let found = runs_in(&base);
        let e = found[0]
            .quota()
            .expect_err("root's file in the user's directory");
        assert!(e.contains("not by the session's uid 4242"), "{e}");
        std::os::unix::fs::chown(r.join(QUOTA_FILE), Some(4242), None).expect("chown");
        assert_eq!(
            runs_in(&base)[0].quota().map(|q| q.tenant_name()),
            Ok("run-42".into())
        );
        // Opened for a given user: another's directory is refused.
        let e = run(&base, OsStr::new(RUN), Path::new("/shown"), Some(7)).expect_err("owner");
        assert!(
            e.starts_with("/shown: owned by uid 4242, not by the session's uid 7"),
            "{e}"
        );
        assert!(run(&base, OsStr::new(RUN), Path::new("/shown"), Some(4242)).is_ok());
    }

    /// A container's quota file is read, written (`quota_text`, what a
    /// resize rewrites) and watched (`quota_id`) in its quota directory;
    /// a container of an older hook, whose quota file is in its directory
    /// itself, is read there and said to be one; a quota directory that
    /// is a link is refused, not passed over for the older place.
    #[test]
    fn a_containers_quota_file_is_in_its_quota_directory_or_where_an_older_hook_put_it() {
        let t = tmp("quota-dir");
        let root = t.0.join("root");
        let ctrs = root.join(CONTAINERS_DIR);
        let places = Places::new(Layout::new(&root));
        // As this hook lays it out, and as an older one did.
        slice(&ctrs.join("new"), "older-copy");
        std::fs::create_dir(ctrs.join("new").join(QUOTA_DIR)).expect("mkdir");
        std::fs::write(
            ctrs.join("new").join(QUOTA_DIR).join(QUOTA_FILE),
            "tenant = \"web\"\n",
        )
        .expect("quota");
        slice(&ctrs.join("old"), "legacy");
        // A quota directory that is a link to another container's.
        slice(&ctrs.join("planted"), "legacy-2");
        symlink(
            ctrs.join("new").join(QUOTA_DIR),
            ctrs.join("planted").join(QUOTA_DIR),
        )
        .expect("link");
        let found = places.containers();
        let by = |id: &str| found.iter().find(|f| f.name == id).expect("listed");
        let new = by("new").quota_file().expect("new");
        assert!(!new.legacy);
        assert_eq!(new.shown, ctrs.join("new").join(QUOTA_DIR).join(QUOTA_FILE));
        assert_eq!(by("new").quota().map(|q| q.tenant_name()), Ok("web".into()));
        assert_eq!(by("new").quota_text().as_deref(), Ok("tenant = \"web\"\n"));
        let old = by("old").quota_file().expect("old");
        assert!(old.legacy);
        assert_eq!(old.shown, ctrs.join("old").join(QUOTA_FILE));
        assert_eq!(
            by("old").quota().map(|q| q.tenant_name()),
            Ok("legacy".into())
        );
        // The identity follows the file a resize renames into place.
        let before = by("new").quota_id().expect("id");
        let q = by("new").quota_file().expect("new");
        q.dir
            .replace_file(QUOTA_FILE, b"tenant = \"web-2\"\n", 0o444)
            .expect("replace");
        assert_ne!(by("new").quota_id(), Some(before));
        assert_eq!(
            by("new").quota().map(|q| q.tenant_name()),
            Ok("web-2".into())
        );
        let e = by("planted").quota().expect_err("a link");
        assert!(
            e.contains("planted/etc: expected a directory, got a symbolic link"),
            "{e}"
        );
        assert!(by("planted").quota_id().is_none());
    }

    #[test]
    fn a_containers_root_given_is_followed_and_its_claims_are_beside_it() {
        let t = tmp("given");
        let (_, _) = host(&t.0);
        symlink(t.0.join("root/containers"), t.0.join("ctrs")).expect("link");
        // Given as a path: a link to it followed (the caller's).
        let p = Places::with_containers_dir(&t.0.join("ctrs"));
        assert_eq!(p.containers().len(), 2);
        // The layout's: `containers` a link under the root is not.
        let root2 = t.0.join("root2");
        std::fs::create_dir_all(&root2).expect("mkdir");
        symlink(t.0.join("root/containers"), root2.join(CONTAINERS_DIR)).expect("link");
        assert!(Places::new(Layout::new(&root2)).containers().is_empty());
        assert_eq!(
            Places::with_containers_dir(&t.0.join("root/containers"))
                .claims()
                .len(),
            2
        );
    }
}
