use super::*;
use std::io::Write;
use std::os::unix::fs::MetadataExt;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cuslice-host-fs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).expect("stat").mode() & 0o7777
}

#[test]
fn kept_directories_and_replaced_files_have_their_modes_whatever_the_umask() {
    let d = tmp("keep").join("root");
    // SAFETY: umask has no preconditions; restored below.
    let old = unsafe { libc::umask(0o077) };
    let r = (|| {
        let root = Dir::keep_root(&d, 0o711)?;
        let sub = root.keep_dir("s", 0o755)?;
        sub.replace_file("f", b"x\n", 0o444)?;
        root.keep_dir("t", 0o1777)?;
        // Kept where they are: made again, the same, modes set again.
        std::fs::set_permissions(
            d.join("s"),
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .map_err(|e| Error::os(&d, "chmod", &e))?;
        Dir::keep_root(&d, 0o711)?.keep_dir("s", 0o755)?;
        Ok::<_, Error>(())
    })();
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    r.expect("made");
    assert_eq!(mode(&d), 0o711);
    assert_eq!(mode(&d.join("s")), 0o755);
    assert_eq!(mode(&d.join("s/f")), 0o444);
    assert_eq!(mode(&d.join("t")), 0o1777);
    assert_eq!(std::fs::read(d.join("s/f")).expect("read"), b"x\n");
    let _ = std::fs::remove_dir_all(d.parent().expect("parent"));
}

#[test]
fn links_below_a_kept_root_are_refused_or_replaced_never_followed() {
    let t = tmp("keep-links");
    let d = t.join("root");
    let root = Dir::keep_root(&d, 0o700).expect("root");
    let victim = t.join("victim");
    std::fs::create_dir_all(&victim).expect("mkdir");
    std::fs::write(victim.join("f"), "precious").expect("write");
    // Its mode set here: another test of this binary changes the
    // process's umask while it runs (a flake: 0700 once).
    std::fs::set_permissions(&victim, std::os::unix::fs::PermissionsExt::from_mode(0o750))
        .expect("chmod");
    std::os::unix::fs::symlink(&victim, d.join("s")).expect("link");
    let e = root
        .keep_dir("s", 0o755)
        .expect_err("a link is no directory");
    assert!(
        e.to_string()
            .contains("expected a directory, got a symlink"),
        "{e}"
    );
    assert_eq!(mode(&victim), 0o750, "the link's target is untouched");
    // A file name that is a link: replaced, never written through.
    std::os::unix::fs::symlink(victim.join("f"), d.join("q")).expect("link");
    root.replace_file("q", b"new", 0o444).expect("written");
    assert_eq!(
        std::fs::read_to_string(victim.join("f")).expect("read"),
        "precious"
    );
    assert_eq!(std::fs::read(d.join("q")).expect("read"), b"new");
    // A planted temporary name is a link too: removed, not followed.
    std::os::unix::fs::symlink(victim.join("f"), d.join(".r.new")).expect("link");
    root.replace_file("r", b"r", 0o444).expect("written");
    assert_eq!(
        std::fs::read_to_string(victim.join("f")).expect("read"),
        "precious"
    );
    assert!(root.holds("r", b"r", 0o444));
    assert!(!root.holds("r", b"r", 0o644));
    assert!(!root.holds("q", b"newer", 0o444));
    for n in ["", ".", "..", "a/b"] {
        assert!(root.keep_dir(n, 0o700).is_err(), "{n:?}");
        assert!(root.replace_file(n, b"", 0o400).is_err(), "{n:?}");
    }
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn files_are_read_only_when_regular_ours_and_small() {
    let t = tmp("read");
    let d = Dir::open(&t).expect("open");
    std::fs::write(t.join("f"), "quota\n").expect("write");
    assert_eq!(d.read_file("f", 6).expect("read"), "quota\n");
    let e = d.read_file("f", 5).expect_err("too large");
    assert!(e.to_string().ends_with("/f: larger than 5 bytes"), "{e}");
    std::os::unix::fs::symlink(t.join("f"), t.join("l")).expect("link");
    let e = d.read_file("l", 100).expect_err("a link");
    assert!(e.to_string().contains("/l: cannot open the file"), "{e}");
    std::fs::create_dir(t.join("dir")).expect("mkdir");
    let e = d.read_file("dir", 100).expect_err("a directory");
    assert!(
        e.to_string()
            .ends_with("/dir: expected a regular file, got a directory"),
        "{e}"
    );
    assert!(d.read_file("../f", 100).is_err());
    assert!(d.read_file("missing", 100).is_err());
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn creates_refuse_an_existing_entry_and_never_follow_a_link() {
    let t = tmp("refuse");
    let victim = t.join("victim");
    std::fs::write(&victim, "victim\n").expect("write");
    std::fs::create_dir(t.join("victim-dir")).expect("mkdir");
    let d = Dir::open(&t).expect("open");
    std::os::unix::fs::symlink(&victim, t.join("link")).expect("symlink");
    std::os::unix::fs::symlink(t.join("nowhere"), t.join("dangling")).expect("symlink");
    std::os::unix::fs::symlink(t.join("victim-dir"), t.join("dirlink")).expect("symlink");
    std::fs::create_dir(t.join("there")).expect("mkdir");
    std::fs::write(t.join("file"), "x").expect("write");
    for name in ["link", "dangling", "dirlink", "there", "file"] {
        let e = d.create_file(os(name), 0o600).expect_err(name);
        assert!(e.already_exists(), "{name}: {e}");
        assert!(
            e.to_string()
                .starts_with(&format!("{}: ", t.join(name).display()))
        );
        let e = d.create_dir(os(name), 0o700).expect_err(name);
        assert!(e.already_exists(), "{name}: {e}");
    }
    // Nothing was created through the links.
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "victim\n");
    assert!(!t.join("nowhere").exists());
    assert_eq!(
        std::fs::read_dir(t.join("victim-dir")).expect("ls").count(),
        0
    );
    // A link where a directory is opened: refused, wherever it points.
    let e = d.open_dir(os("dirlink")).expect_err("a link");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: expected a directory, got a symlink",
            t.join("dirlink").display()
        )
    );
    let e = d.open_dir(os("file")).expect_err("a file");
    assert!(
        e.to_string()
            .ends_with("expected a directory, got a regular file"),
        "{e}"
    );
    // Only plain names.
    for bad in ["", ".", "..", "a/b", "../x"] {
        let e = d.create_file(os(bad), 0o600).expect_err(bad);
        assert!(
            !e.already_exists() && e.to_string().contains("plain name"),
            "{e}"
        );
    }
    let _ = std::fs::remove_dir_all(&t);
}

/// Modes are set, not left to the umask (the umask is the process's,
/// shared by every test thread: cli/tests/run.rs runs `cuslice run`
/// under umask 000 and 077).
#[test]
fn modes_are_exactly_those_asked_for() {
    let t = tmp("modes");
    let d = Dir::open(&t).expect("open");
    let sub = d.create_dir(os("sub"), 0o710).expect("dir");
    let mut f = d.create_file(os("f"), 0o640).expect("file");
    d.create_file(os("g"), 0o604).expect("file");
    f.write_all(b"x").expect("write");
    let mode = |p: &Path| std::fs::symlink_metadata(p).expect("lstat").mode() & 0o7777;
    assert_eq!(mode(&t.join("sub")), 0o710);
    assert_eq!(mode(&t.join("f")), 0o640);
    assert_eq!(mode(&t.join("g")), 0o604);
    assert_eq!(sub.path(), t.join("sub"));
    assert_eq!(std::fs::read(t.join("f")).expect("read"), b"x");
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn paths_below_a_directory_are_walked_without_following_a_link() {
    let t = tmp("beneath");
    std::fs::create_dir_all(t.join("a/b")).expect("mkdir");
    std::fs::write(t.join("a/b/f"), "x").expect("write");
    std::fs::create_dir_all(t.join("elsewhere/b")).expect("mkdir");
    std::os::unix::fs::symlink(t.join("elsewhere"), t.join("l")).expect("link");
    std::os::unix::fs::symlink(t.join("a/b/f"), t.join("a/b/fl")).expect("link");
    let d = Dir::open(&t).expect("open");
    let (_, st) = d.open_path_beneath(Path::new("a/b/f")).expect("a file");
    assert!(Kind::File.matches(st.st_mode));
    // The last component is described, not followed.
    let (_, st) = d.open_path_beneath(Path::new("a/b/fl")).expect("a link");
    assert_eq!(type_name(st.st_mode), "a symlink");
    let e = d
        .open_path_beneath(Path::new("l/b"))
        .expect_err("a link on the way");
    assert_eq!(
        e.to_string(),
        format!(
            "{}: expected a directory, got a symlink",
            t.join("l").display()
        )
    );
    for bad in ["", "../a", "a/../a/b", "/a"] {
        assert!(d.open_path_beneath(Path::new(bad)).is_err(), "{bad:?}");
    }
    assert_eq!(
        d.open_dir_beneath(Path::new("a/b")).expect("dir").path(),
        t.join("a/b")
    );
    assert_eq!(d.open_dir_beneath(Path::new("")).expect("itself").path(), t);
    assert!(d.open_dir_beneath(Path::new("l")).is_err());
    // What an entry is, not followed; missing is told.
    assert_eq!(type_name(d.stat("l").expect("stat").st_mode), "a symlink");
    assert!(d.stat("missing").expect_err("missing").not_found());
    // Read by a plain name only, not through a link, whoever owns it.
    let e = d.read_checked("a/b/f", None, 9).expect_err("not a name");
    assert!(e.contains("plain name"), "{e}");
    let b = d.open_dir_beneath(Path::new("a/b")).expect("dir");
    assert_eq!(b.read_checked("f", None, 1).expect("read"), "x");
    let e = b.read_checked("fl", None, 1).expect_err("a link");
    assert_eq!(
        e,
        format!(
            "{}: expected a regular file, got a symbolic link",
            t.join("a/b/fl").display()
        )
    );
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn an_entry_is_removed_whatever_it_is_and_a_link_never_followed() {
    let t = tmp("remove-entry");
    std::fs::create_dir_all(t.join("outside")).expect("mkdir");
    std::fs::write(t.join("outside/keep"), "keep").expect("write");
    std::fs::create_dir_all(t.join("d/sub")).expect("mkdir");
    std::os::unix::fs::symlink(t.join("outside"), t.join("d/sub/out")).expect("link");
    std::os::unix::fs::symlink(t.join("outside"), t.join("l")).expect("link");
    std::fs::write(t.join("f"), "x").expect("write");
    let d = Dir::open(&t).expect("open");
    for name in ["d", "l", "f", "missing"] {
        d.remove(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(std::fs::symlink_metadata(t.join(name)).is_err(), "{name}");
    }
    assert_eq!(
        std::fs::read_to_string(t.join("outside/keep")).expect("kept"),
        "keep"
    );
    assert!(d.remove("..").is_err());
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn a_synced_replace_is_a_replace_and_a_lock_is_tried_without_waiting() {
    let t = tmp("synced");
    let d = Dir::open(&t).expect("open");
    d.replace_file_synced("c", b"one", 0o600).expect("written");
    d.replace_file_synced("c", b"two", 0o600).expect("again");
    assert!(d.holds("c", b"two", 0o600));
    assert_eq!(d.list().expect("ls"), vec![std::ffi::OsString::from("c")]);
    let held = d.try_lock("lock", 0o644).expect("lock").expect("free");
    assert_eq!(mode(&t.join("lock")), 0o644);
    let other = d.try_lock("lock", 0o644).expect("lock");
    assert!(other.is_err(), "held by the first");
    drop(held);
    assert!(d.try_lock("lock", 0o644).expect("lock").is_ok());
    std::os::unix::fs::symlink(t.join("c"), t.join("linked")).expect("link");
    assert!(d.try_lock("linked", 0o644).is_err());
    assert!(d.holds("c", b"two", 0o600), "not written through the link");
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn a_lock_is_waited_for_within_a_bound() {
    use std::time::{Duration, Instant};
    let t = tmp("lock-within");
    let d = Dir::open(&t).expect("open");
    // Free: taken at once, 0600.
    let held = d
        .lock_within("lock", 0o600, Duration::from_secs(5))
        .expect("lock")
        .expect("free");
    assert_eq!(mode(&t.join("lock")), 0o600);
    // Held by another open file description: not taken within the
    // bound, the file handed back for what its holder wrote.
    let start = Instant::now();
    let other = d
        .lock_within("lock", 0o600, Duration::from_millis(200))
        .expect("lock");
    assert!(other.is_err(), "held by the first");
    assert!(start.elapsed() >= Duration::from_millis(200));
    // (A bound a loaded machine meets.)
    assert!(start.elapsed() < Duration::from_secs(10));
    // Released while waiting: taken then. (The start taken before the
    // releasing thread sleeps: a loaded machine may run this thread late,
    // not the release early.)
    let start = Instant::now();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(held);
    });
    let got = d
        .lock_within("lock", 0o600, Duration::from_secs(10))
        .expect("lock");
    assert!(got.is_ok(), "released");
    assert!(start.elapsed() >= Duration::from_millis(250));
    release.join().expect("joined");
    // Never through a link.
    std::os::unix::fs::symlink(t.join("lock"), t.join("linked")).expect("link");
    assert!(
        d.lock_within("linked", 0o600, Duration::from_millis(10))
            .is_err()
    );
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn a_tree_is_removed_without_following_its_links() {
    let t = tmp("remove");
    let outside = t.join("outside");
    std::fs::create_dir_all(outside.join("deep")).expect("mkdir");
    std::fs::write(outside.join("deep/keep"), "keep").expect("write");
    let tree = t.join("tree");
    std::fs::create_dir_all(tree.join("a/b/c")).expect("mkdir");
    std::fs::write(tree.join("a/b/c/f"), "x").expect("write");
    std::fs::write(tree.join("top"), "x").expect("write");
    std::os::unix::fs::symlink(&outside, tree.join("a/out")).expect("symlink");
    std::os::unix::fs::symlink(outside.join("deep/keep"), tree.join("a/b/keep")).expect("symlink");
    let d = Dir::open(&t).expect("open");
    let inner = d.open_dir(os("tree")).expect("tree");
    inner.remove_contents().expect("emptied");
    assert_eq!(std::fs::read_dir(&tree).expect("ls").count(), 0);
    d.remove_empty_dir(os("tree")).expect("removed");
    assert!(!tree.exists());
    assert_eq!(
        std::fs::read_to_string(outside.join("deep/keep")).expect("kept"),
        "keep"
    );
    // A link is never removed as a directory.
    std::os::unix::fs::symlink(&outside, t.join("t4")).expect("symlink");
    assert!(d.remove_empty_dir(os("t4")).is_err());
    assert!(outside.join("deep/keep").exists());
    let _ = std::fs::remove_dir_all(&t);
}

#[test]
fn a_segment_is_opened_by_a_plain_name_never_through_a_link_nor_blocking() {
    let t = tmp("segment");
    std::fs::write(t.join("s.seg"), "x").expect("write");
    std::os::unix::fs::symlink(t.join("s.seg"), t.join("l.seg")).expect("link");
    let c = std::ffi::CString::new(t.join("f.seg").as_os_str().as_bytes()).expect("path");
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let d = Dir::open(&t).expect("open");
    let access = |fd: &OwnedFd| {
        // SAFETY: F_GETFL on a descriptor we hold.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        flags & libc::O_ACCMODE
    };
    assert_eq!(
        access(&d.open_segment("s.seg", true).expect("rw")),
        libc::O_RDWR
    );
    assert_eq!(
        access(&d.open_segment("s.seg", false).expect("ro")),
        libc::O_RDONLY
    );
    let e = d.open_segment("l.seg", false).expect_err("a link");
    assert!(
        e.to_string().starts_with(&format!(
            "{}: cannot open the segment",
            t.join("l.seg").display()
        )),
        "{e}"
    );
    // A FIFO is opened without waiting for a writer (core refuses it).
    d.open_segment("f.seg", false).expect("not blocked");
    assert!(
        d.open_segment("missing.seg", false)
            .expect_err("missing")
            .not_found()
    );
    for bad in ["", "..", "a/s.seg"] {
        assert!(d.open_segment(bad, false).is_err(), "{bad:?}");
    }
    let _ = std::fs::remove_dir_all(&t);
}
