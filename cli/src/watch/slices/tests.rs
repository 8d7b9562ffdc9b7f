use super::*;
use crate::watch::procfs::Stat;
use cuslice_host::layout::CONTAINER_RECORD;
use std::collections::HashMap;

#[test]
fn a_session_is_named_on_one_short_line() {
    let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        run_command(&args(&[
            "/usr/bin/cuslice",
            "run",
            "--memory",
            "1GiB",
            "--",
            "/opt/x/train",
            "-n",
            "3"
        ])),
        "train -n 3"
    );
    let long = run_command(&args(&[
        "cuslice",
        "run",
        "--",
        "sh",
        "-c",
        "python3 serve.py &\nwhile true; do sleep 1; done # and a great deal more script than fits",
    ]));
    assert_eq!(long.chars().count(), 60, "{long}");
    assert!(long.ends_with('…') && !long.contains('\n'), "{long}");
    assert!(
        long.starts_with("sh -c python3 serve.py &\\nwhile true"),
        "{long}"
    );
    // What reorders text or drives the terminal is shown escaped.
    assert_eq!(
        run_command(&args(&[
            "cuslice",
            "run",
            "--",
            "x\u{202e}yz",
            "\x1b]0;t\x07"
        ])),
        "x\\u{202e}yz \\x1b]0;t\\x07"
    );
}

/// A container's name (an annotation: the tenant's) with a newline and
/// what looks like a line of the watch's log is one line of its label,
/// and of every note naming it.
#[test]
fn a_container_name_with_a_newline_is_one_line_of_the_log() {
    let root = tmp("inject");
    let name = "web\ncuslice watch: container db (0123): resolved\x1b[2J\u{202e}";
    container(
        &root,
        "aaa",
        serde_json::json!({"id": "aaa", "name": name}),
        QUOTA,
    );
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&FakeProc::default());
    let label = &s.containers.get("aaa").expect("aaa").label;
    assert_eq!(
        label,
        "container web\\ncuslice watch: container db (0123): resolved\\x1b[2J\\u{202e} (aaa)"
    );
    let note = s
        .notes
        .iter()
        .find(|n| n.contains("records no PID namespace or cgroup"))
        .unwrap_or_else(|| panic!("{:?}", s.notes));
    assert!(note.starts_with(label.as_str()), "{note}");
    assert!(!note.contains(['\n', '\x1b', '\u{202e}']), "{note}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A synthetic /proc.
#[derive(Default)]
pub struct FakeProc {
    pub procs: HashMap<u32, FakeP>,
    pub root: PathBuf,
}

#[derive(Default, Clone)]
pub struct FakeP {
    pub ppid: u32,
    pub start: u64,
    pub ns: Vec<u64>,
    pub cgroup: String,
    pub inner: u32,
    pub exe: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// None: this test's own user (who owns the files it writes).
    pub uid: Option<u32>,
    /// What its descriptors name (as it sees them).
    pub fds: Vec<PathBuf>,
}

impl ProcSource for FakeProc {
    fn stat(&self, pid: u32) -> Option<Stat> {
        self.procs.get(&pid).map(|p| Stat {
            ppid: p.ppid,
            start: p.start,
        })
    }
    fn pid_namespaces(&self, pid: u32) -> Vec<u64> {
        self.procs
            .get(&pid)
            .map(|p| p.ns.clone())
            .unwrap_or_default()
    }
    fn cgroup(&self, pid: u32) -> Option<String> {
        self.procs.get(&pid).map(|p| p.cgroup.clone())
    }
    fn inner_pid(&self, pid: u32) -> Option<u32> {
        self.procs
            .get(&pid)
            .map(|p| if p.inner == 0 { pid } else { p.inner })
    }
    fn cmdline(&self, pid: u32) -> Vec<String> {
        self.procs
            .get(&pid)
            .map(|p| p.args.clone())
            .unwrap_or_default()
    }
    fn exe_name(&self, pid: u32) -> Option<String> {
        self.procs.get(&pid).map(|p| p.exe.clone())
    }
    fn environ(&self, pid: u32, key: &str) -> Option<String> {
        self.procs
            .get(&pid)?
            .env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }
    fn uid(&self, pid: u32) -> Option<u32> {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        self.procs.get(&pid).map(|p| p.uid.unwrap_or(me))
    }
    fn in_root(&self, _pid: u32, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }
    fn fd_paths(&self, pid: u32) -> Vec<PathBuf> {
        self.procs
            .get(&pid)
            .map(|p| p.fds.clone())
            .unwrap_or_default()
    }
}

/// The run directory of the run process 500 in the tests' `/xdg`.
pub const RUN_500: &str = "/xdg/cuslice-run-500-0123456789abcdef";

/// What a `cuslice run` process holds open: the base it made its
/// directory in, that directory, a terminal.
fn run_fds(base: &str, dir: &str) -> Vec<PathBuf> {
    [base, dir, "/dev/pts/0"].map(PathBuf::from).to_vec()
}

const HOST: u64 = 4026531836;

fn p(ppid: u32, start: u64, ns: &[u64], cgroup: &str, exe: &str, args: &[&str]) -> FakeP {
    FakeP {
        ppid,
        start,
        ns: ns.to_vec(),
        cgroup: cgroup.into(),
        exe: exe.into(),
        args: args.iter().map(|a| a.to_string()).collect(),
        ..FakeP::default()
    }
}

/// A test's root directory, removed when the test ends (pass or fail).
struct TmpRoot(PathBuf);

impl std::ops::Deref for TmpRoot {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TmpRoot {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TmpRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tmp(name: &str) -> TmpRoot {
    let d = std::env::temp_dir().join(format!(
        "cuslice-watch-slices-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    TmpRoot(d)
}

fn container(root: &Path, id: &str, meta: serde_json::Value, quota: &str) {
    let d = root.join("containers").join(id);
    std::fs::create_dir_all(d.join("segment")).expect("mkdir");
    std::fs::write(d.join("quota.toml"), quota).expect("quota");
    std::fs::write(d.join(CONTAINER_RECORD), meta.to_string()).expect("meta");
}

const QUOTA: &str = "tenant = \"ctr-a\"\nsegment_dir = \"/run/cuslice/segment\"\ngpu_segment_dir = \"/run/cuslice/gpu\"\n[all]\nmemory = \"1GiB\"\n";

#[test]
fn pids_map_to_containers_by_namespace_then_cgroup_and_to_run_sessions_by_ancestry() {
    let root = tmp("map");
    container(
        &root,
        "aaa",
        serde_json::json!({"id": "aaa", "pid_ns": 111, "cgroup": "/ctr/aaa"}),
        QUOTA,
    );
    // Shares the host's PID namespace: found by cgroup.
    container(
        &root,
        "bbb",
        serde_json::json!({"id": "bbb", "pid_ns": HOST, "cgroup": "/ctr/bbb"}),
        &QUOTA.replace("ctr-a", "ctr-b"),
    );
    // Recorded by an older hook: nothing to map by.
    container(&root, "old", serde_json::json!({"id": "old"}), QUOTA);
    let run_root = root.join("runroot");
    std::fs::create_dir_all(run_root.join("xdg/cuslice-run-500-0123456789abcdef")).expect("mkdir");
    std::fs::write(
            run_root.join("xdg/cuslice-run-500-0123456789abcdef/quota.toml"),
            "tenant = \"run-500\"\nsegment_dir = \"/xdg/cuslice-run-500-0123456789abcdef/segment\"\n[all]\nmemory = \"2GiB\"\ncompute = 30\n",
        )
        .expect("quota");
    let mut fp = FakeProc {
        root: run_root,
        ..FakeProc::default()
    };
    let h = [HOST];
    fp.procs.insert(1, p(0, 1, &h, "/", "systemd", &["init"]));
    // Container aaa: its init, a process in a nested PID namespace,
    // one that moved to a sub-cgroup of another container (the
    // namespace wins).
    fp.procs
        .insert(10, p(1, 5, &[111, HOST], "/ctr/aaa", "sh", &[]));
    fp.procs.insert(
        11,
        p(10, 6, &[222, 111, HOST], "/ctr/aaa/x", "python3", &[]),
    );
    fp.procs
        .insert(12, p(10, 7, &[111, HOST], "/ctr/bbb", "python3", &[]));
    // Container bbb (host namespace), in a sub-cgroup.
    fp.procs
        .insert(20, p(1, 8, &h, "/ctr/bbb/sub", "python3", &[]));
    // Not bbb: a cgroup that only starts with its name.
    fp.procs
        .insert(21, p(1, 9, &h, "/ctr/bbbb", "python3", &[]));
    // A run session: cuslice run (500) -> sh (501) -> python (502), and
    // an orphan reparented to the subreaper (503); a process of the
    // same user outside it (600).
    let mut run = p(
        1,
        20,
        &h,
        "/user",
        "cuslice",
        &[
            "cuslice",
            "run",
            "--memory",
            "2GiB",
            "--",
            "/usr/bin/python3",
            "x.py",
        ],
    );
    run.env = vec![("XDG_RUNTIME_DIR".into(), "/xdg".into())];
    run.fds = run_fds("/xdg", RUN_500);
    fp.procs.insert(500, run);
    fp.procs.insert(501, p(500, 21, &h, "/user", "sh", &[]));
    fp.procs
        .insert(502, p(501, 22, &h, "/user", "python3", &[]));
    fp.procs
        .insert(503, p(500, 23, &h, "/user", "python3", &[]));
    fp.procs.insert(600, p(1, 24, &h, "/user", "python3", &[]));
    // A `cuslice status` is no session.
    fp.procs.insert(
        700,
        p(1, 25, &h, "/user", "cuslice", &["cuslice", "status"]),
    );
    fp.procs
        .insert(701, p(700, 26, &h, "/user", "python3", &[]));

    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    assert_eq!(s.containers.len(), 3);
    assert!(
        s.notes.iter().any(|n| n.starts_with("container old: ")
            && n.contains("records no PID namespace or cgroup")),
        "{:?}",
        s.notes
    );
    let ctr = |id: &str| Some(SliceId::Container(id.into()));
    let run = Some(SliceId::Run {
        pid: 500,
        start: 20,
    });
    for (pid, want) in [
        (10, ctr("aaa")),
        (11, ctr("aaa")),
        (12, ctr("aaa")),
        (20, ctr("bbb")),
        (21, None),
        (502, run.clone()),
        (503, run.clone()),
        (600, None),
        (701, None),
    ] {
        assert_eq!(s.slice_of(&fp, pid).map(|x| x.1), Some(want), "pid {pid}");
    }
    assert_eq!(s.slice_of(&fp, 9999), None);
    let r = s.runs.get(&(500, 20)).expect("session");
    assert_eq!(r.tenant, "run-500");
    assert_eq!(r.label, "cuslice run 500 (python3 x.py)");
    assert_eq!(r.quota.as_ref().and_then(|c| c.all.memory), Some(2 << 30));
    assert_eq!(
        r.mem_seg.as_deref(),
        Some(
            fp.root
                .join("xdg/cuslice-run-500-0123456789abcdef/segment/memory.seg")
                .as_path()
        )
    );
    let a = s.containers.get("aaa").expect("aaa");
    assert_eq!(a.tenant, "ctr-a");
    assert_eq!(
        a.mem_seg.as_deref(),
        Some(root.join("containers/aaa/segment/memory.seg").as_path())
    );

    // A PID reused by another process is classified afresh.
    fp.procs.insert(502, p(1, 99, &h, "/user", "python3", &[]));
    assert_eq!(s.slice_of(&fp, 502).map(|x| x.1), Some(None));
    // The session ends: it is forgotten, and so are its processes.
    fp.procs.remove(&500);
    s.refresh(&fp);
    assert!(s.runs.is_empty());
    assert_eq!(s.cached(503), None);
    // A container that goes away takes its processes with it.
    std::fs::remove_dir_all(root.join("containers/aaa")).expect("rm");
    s.refresh(&fp);
    assert!(s.cached(10).is_none());
    assert_eq!(s.slice_of(&fp, 10).map(|x| x.1), Some(None));
    let _ = std::fs::remove_dir_all(&root);
}

fn run_proc(xdg: &str, env: &[(&str, &str)]) -> FakeP {
    let mut r = p(
        1,
        20,
        &[HOST],
        "/user",
        "cuslice",
        &["cuslice", "run", "--memory", "2GiB", "--", "prog"],
    );
    r.env = std::iter::once(("XDG_RUNTIME_DIR", xdg))
        .chain(env.iter().copied())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    r.fds = run_fds(xdg, RUN_500);
    r
}

#[test]
fn containers_sharing_a_pid_namespace_are_told_apart_by_cgroup_and_an_ambiguous_process_is_no_ones()
{
    // `--pid container:ppp` or a pod's shareProcessNamespace: both
    // records name namespace 333. Mapping every process to the first
    // record once had the watch kill a well-behaved process of qqq.
    let root = tmp("sharedns");
    container(
        &root,
        "ppp",
        serde_json::json!({"id": "ppp", "pid_ns": 333, "cgroup": "/pod/ppp"}),
        QUOTA,
    );
    container(
        &root,
        "qqq",
        serde_json::json!({"id": "qqq", "pid_ns": 333, "cgroup": "/pod/qqq"}),
        &QUOTA.replace("ctr-a", "ctr-q"),
    );
    // A record of the pod's cgroup itself: less specific than qqq's.
    container(
        &root,
        "pod",
        serde_json::json!({"id": "pod", "pid_ns": 444, "cgroup": "/pod"}),
        &QUOTA.replace("ctr-a", "ctr-pod"),
    );
    let mut fp = FakeProc::default();
    fp.procs
        .insert(30, p(1, 5, &[333, HOST], "/pod/qqq/x", "python3", &[]));
    fp.procs
        .insert(31, p(1, 6, &[333, HOST], "/pod/ppp", "python3", &[]));
    fp.procs
        .insert(32, p(1, 7, &[333, HOST], "/elsewhere", "python3", &[]));
    fp.procs
        .insert(33, p(1, 8, &[HOST], "/pod/qqq", "python3", &[]));
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    let of = |s: &mut Slices, pid| s.slice_of(&fp, pid).and_then(|x| x.1);
    assert_eq!(of(&mut s, 30), Some(SliceId::Container("qqq".into())));
    assert_eq!(of(&mut s, 31), Some(SliceId::Container("ppp".into())));
    assert_eq!(of(&mut s, 32), None, "ambiguous: no one's");
    // Said as such, with the containers that claim it alike.
    assert_eq!(
        s.owner_of(&fp, 32).map(|x| x.1),
        Some(Owner::Ambiguous(vec![
            SliceId::Container("ppp".into()),
            SliceId::Container("qqq".into())
        ]))
    );
    assert!(
        s.notes
            .iter()
            .any(|n| n.starts_with("pid 32: in a PID namespace that several containers share")),
        "{:?}",
        s.notes
    );
    // By cgroup alone (the host's namespace): the most specific record.
    assert_eq!(of(&mut s, 33), Some(SliceId::Container("qqq".into())));
}

/// A DRA claim's files as its plugin writes them: `quota`, a record
/// when given, an empty segment directory.
fn claim(root: &Path, uid: &str, quota: &str, record: Option<serde_json::Value>) {
    let d = root.join("claims").join(uid);
    std::fs::create_dir_all(d.join("segment")).expect("mkdir");
    std::fs::write(d.join("quota.toml"), quota).expect("quota");
    if let Some(r) = record {
        std::fs::write(d.join("claim.json"), r.to_string()).expect("record");
    }
}

/// What `cuslice-dra-plugin` writes for a claim of 2 GiB.
const CLAIM_QUOTA: &str = "tenant = \"team-a/trainer\"\nsegment_dir = \"/run/cuslice/segment\"\ngpu_segment_dir = \"/run/cuslice/gpu\"\n[all]\nmemory = \"2GiB\"\n";

/// A container record of claim `uid` (or none), its init `init` (host
/// PID, start time 1), in PID namespace `ns` and cgroup `/pod/<id>`.
fn member(root: &Path, id: &str, ns: u64, init: u32, uid: Option<&str>) {
    let mut meta = serde_json::json!({"id": id, "pid_ns": ns, "cgroup": format!("/pod/{id}"),
            "init_pid": init, "init_start": 1});
    if let Some(u) = uid {
        meta["claim"] = u.into();
    }
    // Its copy of the claim's quota file: what its shim reads, not
    // what the watch judges it by (100 GiB here, to tell them apart).
    container(root, id, meta, &CLAIM_QUOTA.replace("2GiB", "100GiB"));
}

#[test]
fn the_containers_of_a_dra_claim_are_one_slice_held_to_the_claims_quota_file_and_segment() {
    let root = tmp("claim");
    claim(
        &root,
        "uid-1",
        CLAIM_QUOTA,
        Some(
            serde_json::json!({"namespace": "team-a", "name": "trainer\u{1b}[2J", "uid": "uid-1", "pods": ["team-a/t-0"]}),
        ),
    );
    member(&root, "aaa", 111, 10, Some("uid-1"));
    member(&root, "bbb", 222, 20, Some("uid-1"));
    // Two more of the claim sharing a PID namespace (a pod's
    // shareProcessNamespace): whichever of them a process is in, it
    // is the claim's.
    member(&root, "ddd", 444, 40, Some("uid-1"));
    member(&root, "eee", 444, 41, Some("uid-1"));
    // A container of its own beside them.
    container(
        &root,
        "ccc",
        serde_json::json!({"id": "ccc", "pid_ns": 333, "cgroup": "/pod/ccc", "init_pid": 30, "init_start": 1}),
        QUOTA,
    );
    let mut fp = FakeProc::default();
    for (pid, ns) in [(10, 111), (20, 222), (30, 333), (40, 444), (41, 444)] {
        fp.procs
            .insert(pid, p(1, 1, &[ns, HOST], &format!("/pod/{pid}"), "sh", &[]));
    }
    fp.procs
        .insert(11, p(10, 2, &[111, HOST], "/pod/aaa", "python3", &[]));
    fp.procs
        .insert(21, p(20, 2, &[222, HOST], "/pod/bbb", "python3", &[]));
    fp.procs
        .insert(31, p(30, 2, &[333, HOST], "/pod/ccc", "python3", &[]));
    fp.procs
        .insert(42, p(40, 2, &[444, HOST], "/elsewhere", "python3", &[]));
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    let claim_id = Some(SliceId::Claim("uid-1".into()));
    for (pid, want) in [
        (11, claim_id.clone()),
        (21, claim_id.clone()),
        (42, claim_id.clone()),
        (31, Some(SliceId::Container("ccc".into()))),
    ] {
        assert_eq!(s.slice_of(&fp, pid).map(|x| x.1), Some(want), "pid {pid}");
    }
    // One slice for the claim, none for its containers.
    let ids: Vec<SliceId> = s.all().map(|x| x.id.clone()).collect();
    assert_eq!(
        ids,
        [
            SliceId::Container("ccc".into()),
            SliceId::Claim("uid-1".into())
        ]
    );
    let c = s.get(&SliceId::Claim("uid-1".into())).expect("claim");
    assert_eq!(c.label, "DRA claim team-a/trainer\\x1b[2J (uid-1)");
    assert_eq!(c.tenant, "team-a/trainer");
    assert_eq!(c.quota.as_ref().and_then(|q| q.all.memory), Some(2 << 30));
    let seg = root.join("claims/uid-1/segment/memory.seg");
    assert_eq!(c.mem_seg.as_deref(), Some(seg.as_path()));
    assert_eq!(
        c.open_mem_seg_for_repair().expect("repair").path(),
        seg.as_path()
    );
    // Its record gone: named by its UID, read again.
    std::fs::remove_file(root.join("claims/uid-1/claim.json")).expect("rm");
    s.refresh(&fp);
    assert_eq!(s.claims["uid-1"].label, "DRA claim uid-1");
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    // A container of the claim goes: its processes are no one's, the
    // others' stay the claim's.
    std::fs::remove_dir_all(root.join("containers/aaa")).expect("rm");
    s.refresh(&fp);
    assert_eq!(s.cached(11), None);
    assert_eq!(s.slice_of(&fp, 11).map(|x| x.1), Some(None));
    assert_eq!(s.slice_of(&fp, 21).map(|x| x.1), Some(claim_id.clone()));
    // The last ones go: so does the claim.
    for id in ["bbb", "ddd", "eee"] {
        std::fs::remove_dir_all(root.join("containers").join(id)).expect("rm");
    }
    s.refresh(&fp);
    assert!(s.claims.is_empty());
    assert_eq!(s.slice_of(&fp, 21).map(|x| x.1), Some(None));
}

#[test]
fn a_claim_whose_directory_or_quota_file_is_missing_or_bad_is_one_note_naming_the_path_and_is_not_checked()
 {
    let root = tmp("badclaim");
    let mut fp = FakeProc::default();
    fp.procs
        .insert(10, p(1, 1, &[111, HOST], "/pod/aaa", "sh", &[]));
    fp.procs
        .insert(11, p(10, 2, &[111, HOST], "/pod/aaa", "python3", &[]));
    member(&root, "aaa", 111, 10, Some("uid-2"));
    let uid2 = root.join("claims/uid-2");
    // (what is done to the claim, what the note says). A claim is read
    // again when its quota file or record changes: each case changes
    // the quota file as `stat` sees it.
    let cases: Vec<(Box<dyn Fn()>, String)> = vec![
        (
            Box::new(|| ()),
            format!(
                "{}: cannot open the directory: No such file or directory",
                root.join("claims").display()
            ),
        ),
        (
            Box::new(|| {
                claim(&root, "elsewhere", CLAIM_QUOTA, None);
                std::os::unix::fs::symlink(root.join("claims/elsewhere"), &uid2).expect("symlink");
            }),
            format!("{}: expected a directory, got a symlink", uid2.display()),
        ),
        (
            Box::new(|| {
                std::fs::remove_file(&uid2).expect("rm");
                std::fs::create_dir_all(&uid2).expect("mkdir");
            }),
            format!(
                "{}: cannot open the file: No such file or directory",
                uid2.join("quota.toml").display()
            ),
        ),
        (
            Box::new(|| {
                std::os::unix::fs::symlink(
                    root.join("claims/elsewhere/quota.toml"),
                    uid2.join("quota.toml"),
                )
                .expect("symlink");
            }),
            format!(
                "{}: cannot open the file: Too many levels of symbolic links",
                uid2.join("quota.toml").display()
            ),
        ),
        (
            Box::new(|| {
                std::fs::remove_file(uid2.join("quota.toml")).expect("rm");
                std::fs::write(uid2.join("quota.toml"), "[all]\nmemory = \"lots\"\n")
                    .expect("write");
            }),
            format!(
                "{}: all.memory: expected a size",
                uid2.join("quota.toml").display()
            ),
        ),
        (
            Box::new(|| {
                std::fs::write(uid2.join("quota.toml"), "tenant = \"team-a/x\"\n").expect("write");
            }),
            format!("{}: no limit in it", uid2.join("quota.toml").display()),
        ),
        (
            Box::new(|| {
                std::fs::write(
                    uid2.join("quota.toml"),
                    vec![b'#'; (config::MAX_FILE_BYTES + 1) as usize],
                )
                .expect("write");
            }),
            format!("{}: larger than", uid2.join("quota.toml").display()),
        ),
    ];
    let mut s = Slices::new(&root, Some(HOST));
    for (i, (make, want)) in cases.iter().enumerate() {
        make();
        // Each change seen as one (a file written in the same clock
        // tick as the last is not told from it).
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.refresh(&fp);
        assert_eq!(s.notes.len(), 1, "case {i}: {:?}", s.notes);
        let n = s.notes.remove(0);
        assert!(
            n.starts_with("DRA claim uid-2 (named by container aaa): ")
                && n.contains(want.as_str())
                && n.ends_with(": its containers are not checked"),
            "case {i}: {n}\nwanted {want}"
        );
        // The claim's processes: the claim's, not judged; never the
        // container's own (its copy gives 100 GiB).
        let c = &s.claims["uid-2"];
        assert!(c.quota.is_none() && c.mem_seg.is_none(), "case {i}");
        assert_eq!(
            s.slice_of(&fp, 11).map(|x| x.1),
            Some(Some(SliceId::Claim("uid-2".into()))),
            "case {i}"
        );
        assert_eq!(s.all().count(), 1);
        // Said once.
        s.refresh(&fp);
        assert!(s.notes.is_empty(), "case {i}: {:?}", s.notes);
    }
    // Another user's file (the watch runs as root: root's only).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let q = uid2.join("quota.toml");
        std::fs::write(&q, CLAIM_QUOTA).expect("write");
        std::os::unix::fs::chown(&q, Some(4242), None).expect("chown");
        std::thread::sleep(std::time::Duration::from_millis(20));
        s.refresh(&fp);
        assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
        assert!(
            s.notes[0].contains(&format!(
                "{}: expected a file of uid 0, got one of uid 4242",
                q.display()
            )),
            "{}",
            s.notes[0]
        );
        s.notes.clear();
        std::os::unix::fs::chown(&q, Some(0), None).expect("chown");
    }
    // Made right: read again, judged, no note.
    std::fs::write(uid2.join("quota.toml"), CLAIM_QUOTA).expect("write");
    std::thread::sleep(std::time::Duration::from_millis(20));
    s.refresh(&fp);
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    assert_eq!(
        s.claims["uid-2"].quota.as_ref().and_then(|q| q.all.memory),
        Some(2 << 30)
    );
}

#[test]
fn a_container_whose_init_is_gone_matches_nothing_until_its_record_is_written_again() {
    let root = tmp("stale");
    let meta = |start: u64| serde_json::json!({"id": "aaa", "pid_ns": 111, "cgroup": "/ctr/aaa", "init_pid": 10, "init_start": start});
    container(&root, "aaa", meta(5), QUOTA);
    let mut fp = FakeProc::default();
    fp.procs
        .insert(10, p(1, 5, &[111, HOST], "/ctr/aaa", "sh", &[]));
    fp.procs
        .insert(11, p(10, 6, &[111, HOST], "/ctr/aaa", "python3", &[]));
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    assert_eq!(
        s.slice_of(&fp, 11).map(|x| x.1),
        Some(Some(SliceId::Container("aaa".into())))
    );
    // The container ends, its record stays (not deleted yet); the
    // namespace inode goes to an unrelated process tree.
    fp.procs.clear();
    fp.procs
        .insert(30, p(1, 50, &[111, HOST], "/other", "python3", &[]));
    s.refresh(&fp);
    assert!(s.containers.is_empty());
    assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
    assert!(s.notes[0].contains("init process") && s.notes[0].contains("is gone"));
    assert_eq!(s.slice_of(&fp, 30).map(|x| x.1), Some(None));
    // Said once, not loaded again while the record is unchanged.
    s.refresh(&fp);
    assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
    assert!(s.containers.is_empty());
    // Restarted under the same id: the new record is read.
    fp.procs
        .insert(40, p(1, 60, &[111, HOST], "/ctr/aaa", "sh", &[]));
    std::thread::sleep(std::time::Duration::from_millis(20));
    container(
        &root,
        "aaa",
        serde_json::json!({"id": "aaa", "pid_ns": 111, "cgroup": "/ctr/aaa", "init_pid": 40, "init_start": 60}),
        QUOTA,
    );
    s.refresh(&fp);
    assert_eq!(s.containers.len(), 1);
    fp.procs
        .insert(41, p(40, 61, &[111, HOST], "/ctr/aaa", "python3", &[]));
    assert_eq!(
        s.slice_of(&fp, 41).map(|x| x.1),
        Some(Some(SliceId::Container("aaa".into())))
    );
    // A record found stale at its first reading is not loaded either.
    container(
        &root,
        "bbb",
        serde_json::json!({"id": "bbb", "pid_ns": 222, "init_pid": 70, "init_start": 1}),
        QUOTA,
    );
    s.refresh(&fp);
    assert!(!s.containers.contains_key("bbb"));
    assert!(
        s.notes
            .last()
            .is_some_and(|n| n.starts_with("container bbb: ") && n.contains("is gone"))
    );
    // An older hook's record: one note, taken as live.
    container(
        &root,
        "ccc",
        serde_json::json!({"id": "ccc", "pid_ns": 333}),
        QUOTA,
    );
    let n = s.notes.len();
    s.refresh(&fp);
    s.refresh(&fp);
    assert!(s.containers.contains_key("ccc"));
    assert_eq!(s.notes.len(), n + 1, "{:?}", s.notes);
    assert!(
        s.notes[n].contains("records no init process"),
        "{}",
        s.notes[n]
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// A container's quota file in its quota directory (as the hook lays
/// it out now) and one where an older hook put it are both read, and
/// read again when a resize renames a new one into place.
#[test]
fn a_containers_quota_file_is_read_again_when_resized_in_its_quota_directory_or_an_older_hooks_place()
 {
    let root = tmp("quota-dir");
    let meta = |id: &str, ns: u64| serde_json::json!({"id": id, "pid_ns": ns, "init_pid": 10, "init_start": 5});
    // An older hook's: the quota file beside the record.
    container(&root, "old", meta("old", 111), QUOTA);
    // This hook's: in the quota directory (the older place left empty).
    container(&root, "new", meta("new", 222), QUOTA);
    let d = root.join("containers/new");
    std::fs::create_dir(d.join("etc")).expect("mkdir");
    std::fs::rename(d.join("quota.toml"), d.join("etc/quota.toml")).expect("mv");
    let mut fp = FakeProc::default();
    fp.procs.insert(10, p(1, 5, &[111, HOST], "/", "sh", &[]));
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    let memory = |s: &Slices, id: &str| {
        s.containers
            .get(id)
            .and_then(|c| c.quota.as_ref())
            .and_then(|q| q.all.memory)
    };
    assert_eq!(memory(&s, "old"), Some(1 << 30));
    assert_eq!(memory(&s, "new"), Some(1 << 30));
    // Resized: a new file renamed into place, in each's place.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let resized = QUOTA.replace("1GiB", "2GiB");
    for q in [
        d.join("etc/quota.toml"),
        root.join("containers/old/quota.toml"),
    ] {
        let tmp = q.with_extension("new");
        std::fs::write(&tmp, &resized).expect("write");
        std::fs::rename(&tmp, &q).expect("rename");
    }
    s.refresh(&fp);
    assert_eq!(memory(&s, "old"), Some(2 << 30));
    assert_eq!(memory(&s, "new"), Some(2 << 30));
    assert!(s.notes.is_empty(), "{:?}", s.notes);
}

#[test]
fn a_session_takes_only_limits_from_its_quota_file() {
    let root = tmp("runfile");
    let run_root = root.join("runroot");
    let d = run_root.join("xdg/cuslice-run-500-0123456789abcdef");
    std::fs::create_dir_all(d.join("segment")).expect("mkdir");
    let mut fp = FakeProc {
        root: run_root.clone(),
        ..FakeProc::default()
    };
    fp.procs
        .insert(1, p(0, 1, &[HOST], "/", "systemd", &["init"]));
    fp.procs.insert(
        500,
        run_proc("/xdg", &[("CUSLICE_GPU_SEGMENT_DIR", "/gpu")]),
    );
    fp.procs
        .insert(501, p(500, 21, &[HOST], "/user", "python3", &[]));
    let session = |fp: &FakeProc, quota: &str| {
        std::fs::write(d.join("quota.toml"), quota).expect("quota");
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(fp);
        assert_eq!(
            s.slice_of(fp, 501).map(|x| x.1),
            Some(Some(SliceId::Run {
                pid: 500,
                start: 20
            }))
        );
        let r = s.runs.get(&(500, 20)).expect("session").clone();
        (r, std::mem::take(&mut s.notes))
    };
    // What `cuslice run` writes: repaired, no note.
    let good = "tenant = \"run-500\"\nsegment_dir = \"/xdg/cuslice-run-500-0123456789abcdef/segment\"\ngpu_segment_dir = \"/gpu\"\n[all]\nmemory = \"2GiB\"\n";
    let (r, notes) = session(&fp, good);
    assert!(notes.is_empty(), "{notes:?}");
    assert!(r.repair);
    assert_eq!(r.tenant, "run-500");
    assert_eq!(r.gpu_dir, run_root.join("gpu"));
    assert_eq!(r.mem_seg, Some(d.join("segment/memory.seg")));
    // Rewritten: a note naming the file and each key; the paths and the
    // tenant stay `run`'s, the limits are the file's, no repair.
    let (r, notes) = session(
        &fp,
        "tenant = \"ctr-a\"\nsegment_dir = \"/run/cuslice/containers/aaa/segment\"\ngpu_segment_dir = \"/elsewhere\"\n[all]\nmemory = \"100GiB\"\n",
    );
    assert_eq!(notes.len(), 1, "{notes:?}");
    let n = &notes[0];
    assert!(
        n.starts_with("cuslice run 500 (prog): /xdg/cuslice-run-500-0123456789abcdef/quota.toml: ")
            && n.contains("tenant \"ctr-a\"")
            && n.contains("segment_dir \"/run/cuslice/containers/aaa/segment\"")
            && n.contains("gpu_segment_dir \"/elsewhere\"")
            && n.contains("not repaired"),
        "{n}"
    );
    assert!(!r.repair);
    assert_eq!(r.tenant, "run-500");
    assert_eq!(r.gpu_dir, run_root.join("gpu"));
    assert_eq!(r.mem_seg, Some(d.join("segment/memory.seg")));
    assert_eq!(r.quota.as_ref().and_then(|c| c.all.memory), Some(100 << 30));
    assert!(r.open_mem_seg_for_repair().is_err());
    // The default GPU directory, where the run process has no variable.
    fp.procs.insert(500, run_proc("/xdg", &[]));
    let (r, notes) = session(&fp, &good.replace("gpu_segment_dir = \"/gpu\"\n", ""));
    assert!(notes.is_empty() && r.repair, "{notes:?}");
    assert_eq!(r.gpu_dir, run_root.join("dev/shm/cuslice/gpu"));
    let (r, notes) = session(&fp, good);
    assert!(
        !r.repair && notes[0].contains("gpu_segment_dir \"/gpu\""),
        "{notes:?}"
    );
    fp.procs.insert(
        500,
        run_proc("/xdg", &[("CUSLICE_GPU_SEGMENT_DIR", "/gpu")]),
    );
    // Not the session user's file, or not a regular file: not checked.
    fp.procs.get_mut(&500).expect("run").uid = Some(4242);
    let (r, notes) = session(&fp, good);
    assert!(r.quota.is_none() && !r.repair);
    assert!(
        notes[0].contains("not by the session's uid 4242") && notes[0].ends_with("not checked"),
        "{notes:?}"
    );
    fp.procs.get_mut(&500).expect("run").uid = None;
    std::fs::remove_file(d.join("quota.toml")).expect("rm");
    let target = root.join("elsewhere.toml");
    std::fs::write(&target, good).expect("write");
    std::os::unix::fs::symlink(&target, d.join("quota.toml")).expect("symlink");
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    s.slice_of(&fp, 501);
    assert!(s.runs[&(500, 20)].quota.is_none());
    assert!(s.notes[0].contains("got a symbolic link"), "{:?}", s.notes);
    std::fs::remove_file(d.join("quota.toml")).expect("rm");
    std::fs::write(
        d.join("quota.toml"),
        vec![b'#'; (config::MAX_FILE_BYTES + 1) as usize],
    )
    .expect("write");
    let mut s = Slices::new(&root, Some(HOST));
    s.slice_of(&fp, 501);
    assert!(s.notes[0].contains("at most 1MiB"), "{:?}", s.notes);
    // A tenant name a container has: not checked.
    container(
        &root,
        "ccc",
        serde_json::json!({"id": "ccc", "pid_ns": 7}),
        &QUOTA.replace("ctr-a", "run-500"),
    );
    let (r, notes) = session(&fp, good);
    assert!(r.quota.is_none() && !r.repair);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("its tenant run-500 is also container ccc's")),
        "{notes:?}"
    );
    // Not where the two are different slices (what `cuslice run` and
    // the hook write: each its own): two entries of the GPU segment,
    // each checked on its own.
    let own = good.replace(
        "[all]",
        "slice = \"run-cuslice-run-500-0123456789abcdef\"\n[all]",
    );
    std::fs::write(d.join("quota.toml"), &own).expect("quota");
    let (r, notes) = session(&fp, &own);
    assert!(
        r.repair && !notes.iter().any(|n| n.contains("is also")),
        "{notes:?}"
    );
    assert_eq!(
        (r.tenant.as_str(), r.tag),
        ("run-500", r.quota.as_ref().expect("quota").slice_tag())
    );
    assert_ne!(r.tag, 0);
    // A slice that is not the session's own is not what `cuslice run`
    // wrote.
    let other = good.replace("[all]", "slice = \"ctr-ccc\"\n[all]");
    let (r, notes) = session(&fp, &other);
    assert!(!r.repair, "{notes:?}");
    assert!(
        notes.iter().any(|n| n.contains(
            "slice \"ctr-ccc\" (`cuslice run` wrote \"run-cuslice-run-500-0123456789abcdef\")"
        )),
        "{notes:?}"
    );
    std::fs::remove_dir_all(root.join("containers")).expect("rm");
    // The segment is opened for repair only through the user's own
    // directories, none of them a link.
    std::fs::write(d.join("quota.toml"), good).expect("quota");
    let (r, _) = session(&fp, good);
    assert!(r.open_mem_seg_for_repair().is_err(), "no segment yet");
    std::fs::write(d.join("segment/memory.seg"), "x").expect("seg");
    let t = r.open_mem_seg_for_repair().expect("the user's own segment");
    assert_eq!(std::fs::read(t.path()).expect("reopen"), b"x");
    let victim = root.join("victim");
    std::fs::create_dir_all(&victim).expect("mkdir");
    std::fs::write(victim.join("memory.seg"), "x").expect("seg");
    std::fs::remove_dir_all(d.join("segment")).expect("rm");
    std::os::unix::fs::symlink(&victim, d.join("segment")).expect("symlink");
    let e = r.open_mem_seg_for_repair().expect_err("followed a link");
    assert!(e.contains("segment"), "{e}");
    std::fs::remove_file(d.join("segment")).expect("rm");
    std::fs::create_dir_all(d.join("segment")).expect("mkdir");
    std::os::unix::fs::symlink(victim.join("memory.seg"), d.join("segment/memory.seg"))
        .expect("symlink");
    assert!(r.open_mem_seg_for_repair().is_err());
    let mut other = r.clone();
    other.mem_seg_owner = Some(4242);
    std::fs::remove_file(d.join("segment/memory.seg")).expect("rm");
    std::fs::write(d.join("segment/memory.seg"), "x").expect("seg");
    let e = other.open_mem_seg_for_repair().expect_err("another user's");
    assert!(e.contains("not by the session's uid 4242"), "{e}");
    let _ = std::fs::remove_dir_all(&root);
}

/// A session's directory that is a link (to another directory, whose
/// quota file claims more): not read through, one note naming it, the
/// session not checked.
#[test]
fn a_run_directory_that_is_a_link_is_not_read_through() {
    let root = tmp("runlink");
    let run_root = root.join("runroot");
    let elsewhere = run_root.join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("segment")).expect("mkdir");
    std::fs::write(
            elsewhere.join("quota.toml"),
            format!("tenant = \"run-500\"\nsegment_dir = \"{RUN_500}/segment\"\n[all]\nmemory = \"100GiB\"\n"),
        )
        .expect("quota");
    std::fs::create_dir_all(run_root.join("xdg")).expect("mkdir");
    std::os::unix::fs::symlink(&elsewhere, run_root.join(RUN_500.trim_start_matches('/')))
        .expect("link");
    let mut fp = FakeProc {
        root: run_root.clone(),
        ..FakeProc::default()
    };
    fp.procs
        .insert(1, p(0, 1, &[HOST], "/", "systemd", &["init"]));
    fp.procs.insert(500, run_proc("/xdg", &[]));
    fp.procs
        .insert(501, p(500, 21, &[HOST], "/user", "python3", &[]));
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    assert_eq!(
        s.slice_of(&fp, 501).map(|x| x.1),
        Some(Some(SliceId::Run {
            pid: 500,
            start: 20
        }))
    );
    let r = &s.runs[&(500, 20)];
    assert!(r.quota.is_none() && !r.repair && r.mem_seg.is_none());
    assert_eq!(
        s.notes,
        vec![format!(
            "cuslice run 500 (prog): {RUN_500}: expected a directory, got a symbolic link: not checked"
        )]
    );
    let _ = std::fs::remove_dir_all(&root);
}

/// The run directory's name is unpredictable: it is the one the run
/// process holds open, named as its PID's, in its base; a directory
/// under the old predictable name, another PID's or one in another
/// place is not it, and a session whose directory is not found is one
/// note and not checked.
#[test]
fn a_sessions_directory_is_the_one_its_run_process_holds_open() {
    let root = tmp("runfd");
    let run_root = root.join("runroot");
    let good = |dir: &str| {
        format!("tenant = \"run-500\"\nsegment_dir = \"{dir}/segment\"\n[all]\nmemory = \"2GiB\"\n")
    };
    // Planted, each with a quota file claiming 100 GiB.
    let bad = "tenant = \"run-500\"\n[all]\nmemory = \"100GiB\"\n";
    for d in [
        "xdg/cuslice-run-500",
        "xdg/cuslice-run-501-0123456789abcdef",
        "other/cuslice-run-500-0123456789abcdef",
        "xdg/cuslice-run-500-fedcba9876543210",
    ] {
        std::fs::create_dir_all(run_root.join(d)).expect("mkdir");
        std::fs::write(run_root.join(d).join("quota.toml"), bad).expect("quota");
    }
    let d = run_root.join(RUN_500.trim_start_matches('/'));
    std::fs::create_dir_all(&d).expect("mkdir");
    std::fs::write(d.join("quota.toml"), good(RUN_500)).expect("quota");
    let mut fp = FakeProc {
        root: run_root.clone(),
        ..FakeProc::default()
    };
    fp.procs
        .insert(1, p(0, 1, &[HOST], "/", "systemd", &["init"]));
    fp.procs
        .insert(501, p(500, 21, &[HOST], "/user", "python3", &[]));
    let session = |fp: &FakeProc| {
        let mut s = Slices::new(&root, Some(HOST));
        s.refresh(fp);
        assert!(s.slice_of(fp, 501).is_some_and(|x| x.1.is_some()));
        let r = s.runs.get(&(500, 20)).expect("session").clone();
        (r, std::mem::take(&mut s.notes))
    };
    let mut run = run_proc("/xdg", &[]);
    let planted = [
        "/xdg/cuslice-run-500",
        "/xdg/cuslice-run-501-0123456789abcdef",
        "/other/cuslice-run-500-0123456789abcdef",
        "/xdg/cuslice-run-500-0123456789abcdef (deleted)",
    ]
    .map(PathBuf::from);
    run.fds = planted.to_vec();
    run.fds.push(PathBuf::from(RUN_500));
    fp.procs.insert(500, run.clone());
    let (r, notes) = session(&fp);
    assert!(notes.is_empty() && r.repair, "{notes:?}");
    assert_eq!(r.quota.as_ref().and_then(|c| c.all.memory), Some(2 << 30));
    assert_eq!(r.mem_seg, Some(d.join("segment/memory.seg")));
    // Not held open (only the planted ones): not found, not checked.
    run.fds = planted.to_vec();
    fp.procs.insert(500, run.clone());
    let (r, notes) = session(&fp);
    assert!(r.quota.is_none() && !r.repair && r.mem_seg.is_none());
    assert_eq!(
            notes,
            vec![
                "cuslice run 500 (prog): no run directory /xdg/cuslice-run-500-* among the run process's open files: not checked"
                    .to_string()
            ]
        );
    // A base reached through a link: the directory is found by what the
    // base is, and named through the base as `run` named it.
    std::os::unix::fs::symlink(run_root.join("xdg"), run_root.join("xdglink")).expect("symlink");
    let linked = "/xdglink/cuslice-run-500-0123456789abcdef";
    std::fs::write(d.join("quota.toml"), good(linked)).expect("quota");
    let mut run = run_proc("/xdglink", &[]);
    run.fds = run_fds("/xdg", RUN_500);
    fp.procs.insert(500, run);
    let (r, notes) = session(&fp);
    assert!(notes.is_empty() && r.repair, "{notes:?}");
    assert_eq!(
        r.mem_seg,
        Some(run_root.join("xdglink/cuslice-run-500-0123456789abcdef/segment/memory.seg"))
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn sessions_under_a_host_wide_quota_file_and_processes_in_pid_namespaces_of_their_own() {
    let root = tmp("hostwide");
    let run_root = root.join("runroot");
    let d = run_root.join("xdg/cuslice-run-500-0123456789abcdef");
    std::fs::create_dir_all(&d).expect("mkdir");
    std::fs::write(
            d.join("quota.toml"),
            "tenant = \"run-500\"\nsegment_dir = \"/xdg/cuslice-run-500-0123456789abcdef/segment\"\n[all]\nmemory = \"2GiB\"\n",
        )
        .expect("quota");
    let mut fp = FakeProc {
        root: run_root.clone(),
        ..FakeProc::default()
    };
    fp.procs
        .insert(1, p(0, 1, &[HOST], "/", "systemd", &["init"]));
    fp.procs.insert(500, run_proc("/xdg", &[]));
    // unshare -pf: the child is PID 1 of a namespace of its own.
    fp.procs
        .insert(501, p(500, 21, &[HOST], "/user", "unshare", &[]));
    fp.procs
        .insert(502, p(501, 22, &[999, HOST], "/user", "prog", &[]));
    let run = Some(SliceId::Run {
        pid: 500,
        start: 20,
    });
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    assert_eq!(s.slice_of(&fp, 502).map(|x| x.1), Some(run));
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    // /etc/cuslice/quota.toml, as the session sees it: the shim follows
    // it, the session is no slice of its own (said once).
    std::fs::create_dir_all(run_root.join("etc/cuslice")).expect("mkdir");
    std::fs::write(run_root.join("etc/cuslice/quota.toml"), "[all]\n").expect("write");
    let mut s = Slices::new(&root, Some(HOST));
    s.refresh(&fp);
    assert_eq!(s.slice_of(&fp, 502).map(|x| x.1), Some(None));
    assert_eq!(s.slice_of(&fp, 501).map(|x| x.1), Some(None));
    assert!(s.runs.is_empty());
    assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
    assert!(
        s.notes[0].contains("/etc/cuslice/quota.toml exists"),
        "{}",
        s.notes[0]
    );
    let _ = std::fs::remove_dir_all(&root);
}
