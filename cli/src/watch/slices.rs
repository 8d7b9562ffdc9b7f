//! Which slice a host PID belongs to.
//!
//! - **A container** made through the OCI hook: `<root>/containers/<id>/`
//!   holds its quota file, its memory segment and `container.json`, where
//!   the hook recorded the inode of the container's PID namespace and its
//!   cgroup. A process belongs to it if its PID namespace, or any parent of
//!   it (a process may nest namespaces), is the container's; failing that
//!   (a container sharing the host's PID namespace, or one recorded by an
//!   older hook) if its cgroup is the container's or below it. Neither can
//!   be changed from inside a container without privileges it lacks.
//! - **A `cuslice run` session**: every descendant of a `cuslice run`
//!   process (an executable named `cuslice` with `run` as its first
//!   argument), found through the parent chain (`cuslice run` is a child
//!   subreaper, so orphans stay its descendants). Its quota file,
//!   `$XDG_RUNTIME_DIR` (else `$TMPDIR`, else /tmp) of the run process's
//!   initial environment + `cuslice-run-<pid>/quota.toml`, is read once,
//!   when the session is first seen: the user owns that file and could
//!   edit it later.
//!
//! The answer for a PID is cached under (PID, start time), so a pass reads
//! `/proc/<pid>/stat` once per process NVML lists, and the rest only for a
//! process not seen before.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use cuslice_core::config::{self, Config};

use super::procfs::ProcSource;
use crate::oci::{ContainerMeta, META_FILE};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SliceId {
    /// The container's id.
    Container(String),
    /// The `cuslice run` process: its PID and start time.
    Run { pid: u32, start: u64 },
}

#[derive(Debug, Clone)]
pub struct Slice {
    pub id: SliceId,
    /// The tenant its processes register as.
    pub tenant: String,
    /// For messages: `container web-1 (0123456789ab)`, `cuslice run 4242
    /// (python3 train.py)`.
    pub label: String,
    /// Its quota file, parsed (None: unreadable; see the note).
    pub quota: Option<Config>,
    /// Its memory segment, as a path here (None: no memory quota).
    pub mem_seg: Option<PathBuf>,
    /// Its GPU segment directory, as a path here.
    pub gpu_dir: PathBuf,
    pub pid_ns: Option<u64>,
    pub cgroup: Option<String>,
}

pub struct Slices {
    root: PathBuf,
    /// The watch's own PID namespace: a container recorded with it shares
    /// the host's, and is found by cgroup.
    host_ns: Option<u64>,
    pub containers: BTreeMap<String, Slice>,
    pub runs: BTreeMap<(u32, u64), Slice>,
    /// PID -> (start time, its slice).
    cache: HashMap<u32, (u64, Option<SliceId>)>,
    /// PID -> (start time, whether it is a `cuslice run` process).
    run_check: HashMap<u32, (u64, bool)>,
    /// Lines to log, once each (drained by the daemon).
    pub notes: Vec<String>,
}

fn short(id: &str) -> String {
    id.chars().take(12).collect()
}

/// `cuslice run [flags] -- prog args`: `prog args`.
fn run_command(args: &[String]) -> String {
    let after = args
        .iter()
        .position(|a| a == "--")
        .map_or(args.get(2..).unwrap_or(&[]), |i| &args[i + 1..]);
    let mut v: Vec<String> = after.to_vec();
    if let Some(first) = v.first_mut()
        && let Some(n) = Path::new(first.as_str()).file_name()
    {
        *first = n.to_string_lossy().into_owned();
    }
    one_line(&v.join(" "), 60)
}

/// `s` on one line (control characters as `?`), cut to `max` characters
/// with `…`: a session's command goes into one-line log messages.
fn one_line(s: &str, max: usize) -> String {
    let mut out: String = s
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(max + 1)
        .collect();
    if out.chars().count() > max {
        out = out.chars().take(max - 1).collect();
        out.push('…');
    }
    out
}

fn read_quota(path: &Path, shown: &Path) -> Result<Config, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", shown.display()))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| format!("{}: expected UTF-8 text", shown.display()))?;
    config::parse_file(shown, &text).map_err(|e| e.to_string())
}

fn any_memory(c: &Config) -> bool {
    c.all.memory.is_some()
        || c.by_index.values().any(|l| l.memory.is_some())
        || c.by_uuid.values().any(|l| l.memory.is_some())
}

impl Slices {
    pub fn new(root: &Path, host_ns: Option<u64>) -> Slices {
        Slices {
            root: root.to_path_buf(),
            host_ns,
            containers: BTreeMap::new(),
            runs: BTreeMap::new(),
            cache: HashMap::new(),
            run_check: HashMap::new(),
            notes: vec![],
        }
    }

    pub fn get(&self, id: &SliceId) -> Option<&Slice> {
        match id {
            SliceId::Container(c) => self.containers.get(c),
            SliceId::Run { pid, start } => self.runs.get(&(*pid, *start)),
        }
    }

    pub fn all(&self) -> impl Iterator<Item = &Slice> {
        self.containers.values().chain(self.runs.values())
    }

    /// Finds containers that came or went and sessions that ended. One
    /// directory listing, and one `stat` per live session.
    pub fn refresh(&mut self, p: &dyn ProcSource) {
        let dir = self.root.join("containers");
        let mut ids: Vec<String> = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        ids.sort();
        let before = self.containers.len();
        self.containers
            .retain(|id, _| ids.binary_search(id).is_ok());
        let mut changed = before != self.containers.len();
        for id in ids {
            if self.containers.contains_key(&id) {
                continue;
            }
            if let Some(s) = self.load_container(&dir.join(&id), &id) {
                self.containers.insert(id, s);
                changed = true;
            }
        }
        let before = self.runs.len();
        self.runs
            .retain(|(pid, start), _| p.stat(*pid).is_some_and(|s| s.start == *start));
        changed |= before != self.runs.len();
        if changed {
            // A new container may own processes seen outside any slice;
            // a gone one owns none.
            let containers = &self.containers;
            let runs = &self.runs;
            self.cache.retain(|_, (_, id)| match id {
                None => false,
                Some(SliceId::Container(c)) => containers.contains_key(c),
                Some(SliceId::Run { pid, start }) => runs.contains_key(&(*pid, *start)),
            });
        }
    }

    fn load_container(&mut self, dir: &Path, id: &str) -> Option<Slice> {
        // The hook writes the quota file, then container.json: until both
        // are there, try again at the next pass.
        let meta_bytes = std::fs::read(dir.join(META_FILE)).ok()?;
        let q = dir.join("quota.toml");
        let quota = match read_quota(&q, &q) {
            Ok(c) => Some(c),
            Err(e) => {
                self.notes
                    .push(format!("container {}: {e}: not checked", short(id)));
                None
            }
        };
        let meta: Option<ContainerMeta> = serde_json::from_slice(&meta_bytes).ok();
        let label = match &meta {
            Some(m) if m.name.is_some() || m.pod.is_some() || m.image.is_some() => {
                format!("container {} ({})", crate::status::describe(m), short(id))
            }
            _ => format!("container {}", short(id)),
        };
        let (pid_ns, cgroup) = meta
            .as_ref()
            .map_or((None, None), |m| (m.pid_ns, m.cgroup.clone()));
        if pid_ns.is_none() && cgroup.is_none() {
            self.notes.push(format!(
                "{label}: {} records no PID namespace or cgroup (made by an older cuslice oci-hook): its processes cannot be told apart, it is not checked",
                dir.join(META_FILE).display()
            ));
        } else if pid_ns.is_none() {
            self.notes.push(format!(
                "{label}: {} records no PID namespace (made by an older cuslice oci-hook): its processes are found by cgroup",
                dir.join(META_FILE).display()
            ));
        }
        Some(Slice {
            id: SliceId::Container(id.to_string()),
            tenant: quota
                .as_ref()
                .map_or_else(|| format!("ctr-{}", short(id)), Config::tenant_name),
            label,
            mem_seg: quota
                .as_ref()
                .filter(|c| any_memory(c))
                .map(|_| dir.join("segment").join("memory.seg")),
            quota,
            gpu_dir: self.root.join("gpu"),
            pid_ns,
            cgroup,
        })
    }

    fn load_run(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> Slice {
        let inner = p.inner_pid(pid).unwrap_or(pid);
        let base = p
            .environ(pid, "XDG_RUNTIME_DIR")
            .filter(|v| !v.is_empty())
            .or_else(|| p.environ(pid, "TMPDIR").filter(|v| !v.is_empty()))
            .unwrap_or_else(|| "/tmp".into());
        let shown = Path::new(&base)
            .join(format!("cuslice-run-{inner}"))
            .join("quota.toml");
        let label = format!("cuslice run {pid} ({})", run_command(&p.cmdline(pid)));
        let quota = match read_quota(&p.in_root(pid, &shown), &shown) {
            Ok(c) => Some(c),
            Err(e) => {
                // `run` without limits writes no quota file (it becomes the
                // program): nothing to hold it to.
                self.notes.push(format!("{label}: {e}: not checked"));
                None
            }
        };
        Slice {
            id: SliceId::Run { pid, start },
            tenant: quota
                .as_ref()
                .map_or_else(|| format!("run-{inner}"), Config::tenant_name),
            label,
            mem_seg: quota
                .as_ref()
                .filter(|c| any_memory(c))
                .map(|c| p.in_root(pid, &c.segment_dir.join("memory.seg"))),
            gpu_dir: quota.as_ref().map_or_else(
                || PathBuf::from(config::DEFAULT_GPU_SEGMENT_DIR),
                |c| p.in_root(pid, &c.gpu_segment_dir),
            ),
            quota,
            pid_ns: None,
            cgroup: None,
        }
    }

    fn is_run(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> bool {
        if let Some((s, yes)) = self.run_check.get(&pid)
            && *s == start
        {
            return *yes;
        }
        let yes = p.exe_name(pid).as_deref() == Some("cuslice")
            && p.cmdline(pid).get(1).map(String::as_str) == Some("run");
        self.run_check.insert(pid, (start, yes));
        yes
    }

    /// The slice of host PID `pid` and its start time; None: no such
    /// process. The slice is None for a process outside any slice.
    pub fn slice_of(&mut self, p: &dyn ProcSource, pid: u32) -> Option<(u64, Option<SliceId>)> {
        let st = p.stat(pid)?;
        if let Some((s, id)) = self.cache.get(&pid)
            && *s == st.start
        {
            return Some((st.start, id.clone()));
        }
        let id = self.classify(p, pid, st.start);
        self.cache.insert(pid, (st.start, id.clone()));
        Some((st.start, id))
    }

    fn classify(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> Option<SliceId> {
        let host = self.host_ns;
        let namespaces = p.pid_namespaces(pid);
        for ns in &namespaces {
            if Some(*ns) == host {
                break;
            }
            if let Some(c) = self
                .containers
                .values()
                .find(|c| c.pid_ns == Some(*ns) && c.pid_ns != host)
            {
                return Some(c.id.clone());
            }
        }
        if let Some(cg) = p.cgroup(pid)
            && let Some(c) = self.containers.values().find(|c| {
                c.cgroup.as_deref().is_some_and(|mine| {
                    let mine = mine.trim_end_matches('/');
                    !mine.is_empty()
                        && (cg == mine || cg.strip_prefix(mine).is_some_and(|r| r.starts_with('/')))
                })
            })
        {
            return Some(c.id.clone());
        }
        // A process in a PID namespace of its own that is no container's
        // is in no session either (its ancestors are not ours to read).
        if namespaces.first().is_some_and(|n| Some(*n) != host) && host.is_some() {
            return None;
        }
        let (mut cur, mut cur_start) = (pid, start);
        for _ in 0..4096 {
            if self.is_run(p, cur, cur_start) {
                if !self.runs.contains_key(&(cur, cur_start)) {
                    let s = self.load_run(p, cur, cur_start);
                    self.runs.insert((cur, cur_start), s);
                }
                return Some(SliceId::Run {
                    pid: cur,
                    start: cur_start,
                });
            }
            let st = p.stat(cur)?;
            if st.ppid <= 1 {
                return None;
            }
            let parent = p.stat(st.ppid)?;
            (cur, cur_start) = (st.ppid, parent.start);
        }
        None
    }

    /// Forgets cached PIDs not in `keep` (called with the PIDs NVML lists,
    /// every so often).
    pub fn prune(&mut self, keep: &std::collections::HashSet<u32>) {
        self.cache.retain(|pid, _| keep.contains(pid));
        if self.run_check.len() > 4096 {
            self.run_check.clear();
        }
    }

    /// What a PID is known as, without reading anything.
    #[cfg(test)]
    pub fn cached(&self, pid: u32) -> Option<&(u64, Option<SliceId>)> {
        self.cache.get(&pid)
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::watch::procfs::Stat;
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
            long.starts_with("sh -c python3 serve.py &?while true"),
            "{long}"
        );
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
        fn in_root(&self, _pid: u32, path: &Path) -> PathBuf {
            self.root.join(path.strip_prefix("/").unwrap_or(path))
        }
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

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cuslice-watch-slices-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    fn container(root: &Path, id: &str, meta: serde_json::Value, quota: &str) {
        let d = root.join("containers").join(id);
        std::fs::create_dir_all(d.join("segment")).expect("mkdir");
        std::fs::write(d.join("quota.toml"), quota).expect("quota");
        std::fs::write(d.join(META_FILE), meta.to_string()).expect("meta");
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
        std::fs::create_dir_all(run_root.join("xdg/cuslice-run-500")).expect("mkdir");
        std::fs::write(
            run_root.join("xdg/cuslice-run-500/quota.toml"),
            "tenant = \"run-500\"\nsegment_dir = \"/xdg/cuslice-run-500/segment\"\n[all]\nmemory = \"2GiB\"\ncompute = 30\n",
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
                    .join("xdg/cuslice-run-500/segment/memory.seg")
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
}
