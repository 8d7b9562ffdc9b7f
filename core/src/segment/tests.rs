use super::*;

use crate::testdir::TestDir as Dir;

/// A segment path in a fresh directory that lives as long as the `Dir`.
fn tmp(name: &str) -> (Dir, PathBuf) {
    let d = Dir::new("seg-test", name);
    let p = d.path().join("memory.seg");
    (d, p)
}

#[test]
fn admission_is_exact_to_the_byte() {
    let (_dir, p) = tmp("exact");
    let s = Segment::open_or_create(&p).expect("open");
    let slot = s.claim_slot(1).expect("slot");
    let d = s.register_device(&[7; 16], 1000).expect("dev").0;
    assert_eq!(s.admit(d, slot, 600), Admit::Granted);
    assert_eq!(s.admit(d, slot, 400), Admit::Granted);
    assert_eq!(
        s.admit(d, slot, 1),
        Admit::Refused {
            used: 1000,
            limit: 1000
        }
    );
    s.credit(d, slot, 1);
    assert_eq!(s.admit(d, slot, 1), Admit::Granted);
    s.release_slot(slot);
    assert_eq!(s.device_usage(d).map(|u| u.used), Some(0));
}

#[test]
fn a_differing_quota_for_a_gpu_yields_to_the_segments_and_a_missing_one_is_refused() {
    let (_dir, p) = tmp("limits");
    let s = Segment::open_or_create(&p).expect("open");
    assert_eq!(s.register_device(&[1; 16], 4 << 30).ok(), Some((0, None)));
    // A live process of the slice (another open file description's
    // slot) holds the segment's figures to the slice.
    let live = Segment::open_or_create(&p).expect("open live");
    live.claim_slot(9).expect("slot");
    // Another finite value (a resize raced the process's start): the
    // segment's stands, and is said.
    assert_eq!(
        s.register_device(&[1; 16], 8 << 30).ok(),
        Some((0, Some(4 << 30)))
    );
    assert_eq!(s.device_usage(0).map(|u| u.limit), Some(4 << 30));
    // A quota on one side only: refused.
    let e = s.register_device(&[1; 16], UNLIMITED).expect_err("none");
    assert!(
        e.0.contains("already has a memory quota of 4294967296 bytes"),
        "{e}"
    );
    s.register_device(&[2; 16], UNLIMITED).expect("unlimited");
    let e = s.register_device(&[2; 16], 1 << 30).expect_err("one");
    assert!(e.0.contains("which GPUs have a quota"), "{e}");
}

#[test]
fn a_finished_jobs_figures_give_way_to_the_next_unless_a_resize_set_them() {
    let (_dir, p) = tmp("adopt");
    let uuid = [3; 16];
    {
        let first = Segment::open_or_create(&p).expect("open");
        let slot = first.claim_slot(1).expect("slot");
        first.register_device_with(&uuid, 0, 2 << 30).expect("dev");
        first.release_slot(slot);
    }
    // No process of the segment lives, nothing was resized: the next
    // job's own figures, silently; its guarantee too.
    let next = Segment::open_or_create(&p).expect("open");
    next.claim_slot(2).expect("slot");
    assert_eq!(
        next.register_device_with(&uuid, 1 << 30, 8 << 30).ok(),
        Some((0, None))
    );
    let u = next.device_usage(0).expect("usage");
    assert_eq!((u.limit, u.guarantee), (8 << 30, 1 << 30));
    // While it lives, a third with other figures is held to the
    // segment's, which is said.
    let third = Segment::open_or_create(&p).expect("open");
    third.claim_slot(3).expect("slot");
    assert_eq!(
        third.register_device_with(&uuid, 0, 4 << 30).ok(),
        Some((0, Some(8 << 30)))
    );
    drop((next, third));
    // A resize's figure holds with nobody live too, until a process
    // whose configuration has it registers.
    let root = Segment::open_existing(&p).expect("root");
    assert_eq!(root.resize_device(0, 6 << 30), Ok(None));
    assert!(root.resized(0));
    let old = Segment::open_or_create(&p).expect("open");
    old.claim_slot(4).expect("slot");
    assert_eq!(
        old.register_device_with(&uuid, 1 << 30, 8 << 30).ok(),
        Some((0, Some(6 << 30)))
    );
    drop(old);
    let new = Segment::open_or_create(&p).expect("open");
    new.claim_slot(5).expect("slot");
    assert_eq!(
        new.register_device_with(&uuid, 1 << 30, 6 << 30).ok(),
        Some((0, None))
    );
    assert!(
        !new.resized(0),
        "the mark is cleared once the figures agree"
    );
    drop(new);
    let later = Segment::open_or_create(&p).expect("open");
    later.claim_slot(6).expect("slot");
    assert_eq!(
        later.register_device_with(&uuid, 0, 3 << 30).ok(),
        Some((0, None))
    );
    assert_eq!(later.device_usage(0).map(|u| u.limit), Some(3 << 30));
    // Garbage in the spare word (an older version's padding) is no mark.
    root.resized_word()
        .store(0x1234_5678_ffff_ffff, Ordering::Release);
    assert!(!root.resized(0));
}

#[test]
fn a_tenant_keeping_the_segments_lock_holds_neither_root_nor_a_start_for_ever() {
    use std::os::fd::AsRawFd;
    let (_dir, p) = tmp("held");
    let s = Segment::open_or_create(&p).expect("open");
    s.register_device(&[4; 16], 1 << 30).expect("dev");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .expect("open");
    // SAFETY: flock on the descriptor we just opened.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    let root = Segment::open_existing(&p).expect("root");
    let t = std::time::Instant::now();
    let busy = root
        .restore_device(0, None, 2 << 30)
        .expect("entry")
        .expect("busy");
    assert!(t.elapsed() < std::time::Duration::from_secs(20));
    assert_eq!(busy.holder, Some(std::process::id()));
    // Written all the same.
    assert_eq!(s.device_usage(0).map(|u| u.limit), Some(2 << 30));
    let e = s.register_device(&[5; 16], 1 << 30).expect_err("busy");
    assert!(
        e.0.starts_with(&format!(
            "{}: its lock is held by pid {}",
            p.display(),
            std::process::id()
        )),
        "{e}"
    );
    drop(f);
    assert_eq!(root.restore_device(0, None, 1 << 30), Ok(None));
    assert!(root.restore_device(MAX_DEVICES, None, 1).is_err());
}

#[test]
fn foreign_files_are_refused() {
    let (_dir, p) = tmp("foreign");
    std::fs::create_dir_all(p.parent().expect("dir")).expect("mkdir");
    std::fs::write(&p, b"hello").expect("write");
    let e = Segment::open_or_create(&p).err().expect("must refuse");
    assert!(e.0.contains("is 5 bytes, expected"), "{e}");
    std::fs::write(&p, vec![0u8; SIZE]).expect("write");
    let e = Segment::open_or_create(&p).err().expect("must refuse");
    assert!(e.0.contains("bad magic"), "{e}");
    let mut bytes = vec![0u8; SIZE];
    bytes[..8].copy_from_slice(&MAGIC);
    bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
    std::fs::write(&p, bytes).expect("write");
    let e = Segment::open_or_create(&p).err().expect("must refuse");
    assert!(e.0.contains("layout version 99"), "{e}");
}

#[test]
fn a_segment_of_another_user_is_refused_and_roots_accepted() {
    // Another user's file could be planted to hand us forged limits;
    // root's is the host's (the OCI hook makes a container's segments
    // for whatever user it runs as). As root, the first case is tested
    // with a chown; as another user, the second needs a root-owned
    // file that is writable to us, which only root can make.
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "SKIPPED: a_segment_of_another_user_is_refused_and_roots_accepted needs root (chown)"
        );
        return;
    }
    let (_dir, p) = tmp("owner");
    drop(Segment::open_or_create(&p).expect("made by root"));
    std::os::unix::fs::chown(&p, Some(65534), None).expect("chown");
    let e = Segment::open_or_create(&p).err().expect("must refuse");
    assert!(
        e.0.ends_with("memory segment is owned by uid 65534, neither this process's uid 0 nor root; refusing to use it"),
        "{e}"
    );
    std::os::unix::fs::chown(&p, Some(0), None).expect("chown");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let dir = p.parent().expect("dir");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // A child of uid 65534 opens root's file.
    // SAFETY: fork in a test; the child only calls setuid, the segment
    // open and _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: setuid/_exit in the child.
        let ok = unsafe { libc::setuid(65534) } == 0 && Segment::open_or_create(&p).is_ok();
        // SAFETY: leaving the child without running the test harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "uid 65534 could not use root's segment (status {status})"
    );
}

#[test]
fn a_second_open_file_description_sees_our_slot_alive() {
    let (_dir, p) = tmp("alive");
    let a = Segment::open_or_create(&p).expect("open a");
    let b = Segment::open_or_create(&p).expect("open b");
    let slot = a.claim_slot(1).expect("slot");
    assert!(b.slot_alive(slot));
    // b cannot take a's slot, so it gets the next one.
    assert_eq!(b.claim_slot(2).ok(), Some(slot + 1));
    drop(a); // closing the fd drops the lock: the slot is dead now
    assert!(!b.slot_alive(slot));
}

#[test]
fn a_slot_this_process_is_sweeping_is_not_taken_for_dead_by_its_other_threads() {
    // An OFD lock never conflicts with its own holder: while one thread
    // cleans a dead process's slot (its lock held, the device lock
    // taken on its behalf), a probe from another thread of the same
    // process found that slot unlocked, took the device lock over and
    // ran beside the sweep (the soak: usage 9.5 MiB above its slots).
    let (_dir, p) = tmp("sweeping");
    let b = Segment::open_or_create(&p).expect("open b");
    let d = b.register_device(&[6; 16], 1000).expect("dev").0;
    let mine = b.claim_slot(2).expect("slot");
    let dead = {
        let a = Segment::open_or_create(&p).expect("open a");
        let s = a.claim_slot(1).expect("slot");
        assert_eq!(a.admit(d, s, 30), Admit::Granted);
        s
    };
    assert!(!b.slot_alive(dead));
    assert!(b.shm.try_lock_slot(dead), "the sweep takes the dead slot");
    assert!(b.slot_alive(dead), "held by this process: alive to it");
    assert!(
        !b.shm.try_lock_slot(dead),
        "a second sweep of the same slot"
    );
    let dev = b.device(d).expect("dev");
    let g = b.lock_device(dev, dead);
    let admitted = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let r = b.admit(d, mine, 10);
            admitted.store(true, Ordering::Release);
            r
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            !admitted.load(Ordering::Acquire),
            "another thread took the device lock over from the sweep"
        );
        // The sweep's critical section: credit the dead slot.
        let n = b.slot(dead).expect("slot").used[d].swap(0, Ordering::AcqRel);
        dev.used
            .store(dev.used.load(Ordering::Relaxed) - n, Ordering::Release);
        drop(g);
        assert_eq!(h.join().expect("admit"), Admit::Granted);
    });
    b.shm.unlock_slot(dead);
    assert!(!b.slot_alive(dead));
    assert_eq!(b.device_usage(d).map(|u| u.used), Some(10));
}

#[test]
fn claiming_the_slot_of_a_holder_that_died_in_the_lock() {
    let (_dir, p) = tmp("reuse");
    let b = Segment::open_or_create(&p).expect("open b");
    let d = b.register_device(&[5; 16], 100).expect("dev").0;
    {
        let a = Segment::open_or_create(&p).expect("open a");
        let slot = a.claim_slot(1).expect("slot");
        assert_eq!(slot, 0);
        assert_eq!(a.admit(d, slot, 30), Admit::Granted);
        a.device(d)
            .expect("dev")
            .lock
            .store(slot as u32 + 1, Ordering::Release);
    }
    // b reuses slot 0; it must neither deadlock on the stale lock nor
    // keep the dead process's 30 bytes.
    assert_eq!(b.claim_slot(2).ok(), Some(0));
    assert_eq!(b.device_usage(d).map(|u| u.used), Some(0));
    assert_eq!(b.admit(d, 0, 100), Admit::Granted);
}

#[test]
fn dead_slot_usage_is_reclaimed() {
    let (_dir, p) = tmp("reclaim");
    let b = Segment::open_or_create(&p).expect("open b");
    let d = b.register_device(&[3; 16], 100).expect("dev").0;
    {
        let a = Segment::open_or_create(&p).expect("open a");
        let slot = a.claim_slot(1).expect("slot");
        assert_eq!(a.admit(d, slot, 70), Admit::Granted);
    } // a's fd closes: as if the process died without cleaning up
    let me = b.claim_slot(2).expect("slot");
    // The claim may have reused a's slot (and reclaimed it) or not;
    // either way, after looking, the 70 bytes are back.
    b.reclaim_dead();
    assert_eq!(b.device_usage(d).map(|u| u.used), Some(0));
    assert_eq!(b.admit(d, me, 100), Admit::Granted);
}

#[test]
fn lock_of_a_dead_holder_is_taken_over_and_usage_recomputed() {
    let (_dir, p) = tmp("steal");
    let b = Segment::open_or_create(&p).expect("open b");
    let d = b.register_device(&[4; 16], 100).expect("dev").0;
    let me = b.claim_slot(2).expect("slot");
    let dead_slot;
    {
        let a = Segment::open_or_create(&p).expect("open a");
        dead_slot = a.claim_slot(1).expect("slot");
        assert_eq!(a.admit(d, dead_slot, 10), Admit::Granted);
        // Die inside the critical section, half-way through an update.
        let dev = a.device(d).expect("dev");
        dev.lock.store(dead_slot as u32 + 1, Ordering::Release);
        a.slot(dead_slot).expect("slot").used[d].fetch_add(5, Ordering::Relaxed);
    }
    assert_ne!(me, dead_slot);
    // Taking over recomputes used = 15 from the slots; then the dead
    // slot's 15 are reclaimed.
    assert_eq!(b.admit(d, me, 1), Admit::Granted);
    assert_eq!(b.device_usage(d).map(|u| u.used), Some(16));
    b.reclaim_dead();
    assert_eq!(b.device_usage(d).map(|u| u.used), Some(1));
}

#[test]
fn a_lock_word_naming_no_slot_is_taken_over() {
    // Any process of the container can write the segment. A lock word
    // that names no slot (garbage) has no live holder: it is taken over
    // and `used` recomputed from the slots. Before: every admission and
    // credit of the container spun for ever.
    let (_dir, p) = tmp("hostile-lock");
    let s = Segment::open_or_create(&p).expect("open");
    let slot = s.claim_slot(1).expect("slot");
    let d = s.register_device(&[9; 16], 100).expect("dev").0;
    assert_eq!(s.admit(d, slot, 40), Admit::Granted);
    for garbage in [u32::MAX, MAX_SLOTS as u32 + 1] {
        let dev = s.device(d).expect("dev");
        dev.lock.store(garbage, Ordering::Release);
        dev.used.store(0, Ordering::Release);
        assert_eq!(s.admit(d, slot, 60), Admit::Granted);
        assert_eq!(s.device_usage(d).map(|u| u.used), Some(100));
        assert_eq!(s.device(d).map(|x| x.lock.load(Ordering::Acquire)), Some(0));
        s.credit(d, slot, 60);
    }
    assert_eq!(
        s.admit(d, slot, 61),
        Admit::Refused {
            used: 40,
            limit: 100
        }
    );
}
