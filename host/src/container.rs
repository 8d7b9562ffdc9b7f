//! The records on the host, the data contracts between their writers and
//! readers: a container's (`<root>/containers/<id>/container.json`, written
//! by the OCI hook) and a DRA claim's (`<root>/claims/<uid>/claim.json`,
//! written by the DRA plugin), read by `cuslice status` / `top` /
//! `exporter`, `cuslice watch` and the hook's tenant check; how `status`
//! and the watch read a slice's directory (its quota file and records,
//! through the layer, each with the owner it requires); and how a
//! recorded container is named to people ([`describe`]), alike in
//! `cuslice status` and the watch's log.

use std::os::fd::BorrowedFd;
use std::path::Path;

use cuslice_core::config::{self, Config};
use serde::{Deserialize, Serialize};

use crate::fs::{self, Dir};
use crate::layout::{CLAIM_RECORD, CONTAINER_RECORD, QUOTA_FILE};

/// The most of a container record (`container.json`) that is read: it
/// holds the container's command, which the tenant writes (one argument may
/// be 128 KiB, and JSON may write a byte as six), so the bound is far above
/// any real record and only keeps a planted huge file from stalling the
/// reader.
pub const RECORD_MAX: u64 = 16 << 20;

/// The most of a claim record (`claim.json`) that is read.
pub const CLAIM_RECORD_MAX: u64 = 64 << 10;

/// What `create` records about a container in `container.json`, for
/// `cuslice status` / `top`. Fields a runtime does not give are absent.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContainerMeta {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `namespace/pod` (Kubernetes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The container's process: its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// For `cuslice watch`, which maps host PIDs to containers by what
    /// their processes cannot change: the inode of the container's PID
    /// namespace (its init's `/proc/<pid>/ns/pid` at creation), and its
    /// init's cgroup (the v2 path, else the memory controller's), used
    /// where the container shares the host's PID namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The container's init as the hook saw it: its host PID and its start
    /// time (field 22 of `/proc/<pid>/stat`). Inode numbers of namespaces
    /// are reused once freed: `cuslice watch` matches processes to this
    /// record only while this process lives, so that a record left behind
    /// (a container stopped but not deleted, a missed poststop) never
    /// claims the processes of a namespace that later got the same inode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_start: Option<u64>,
    /// The UID of the Kubernetes ResourceClaim the container was given its
    /// slice by (`oci-hook create --claim`): its quota file and memory
    /// segment are the claim's, `<root>/claims/<uid>/`, shared by every
    /// container of the claim. `cuslice watch` judges all of them as one
    /// slice, against the claim's quota file. Absent for a container whose
    /// quota came from its annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The driver's own memory limit on the container's cgroup, as the
    /// hook left it: "set: ..." (per GPU), "unsupported: why" (a driver
    /// before R615, cgroup v1) or "failed: why"; absent where the
    /// container has no memory quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_memory_limit: Option<String>,
}

impl ContainerMeta {
    /// The container's init as recorded: (host PID, start time); None in
    /// an older hook's record.
    pub fn init(&self) -> Option<(u32, u64)> {
        Some((self.init_pid?, self.init_start?))
    }

    /// The record for display: every string in it comes from the container's
    /// spec (the tenant's), so each is escaped and bounded by
    /// [`text::clean`](super::text::clean). What `cuslice status`, `top`
    /// and the exporter show; the watch matches processes on the record as
    /// written.
    pub fn for_display(&self) -> ContainerMeta {
        use super::text::clean;
        let opt = |o: &Option<String>| o.as_deref().map(clean);
        ContainerMeta {
            id: clean(&self.id),
            name: opt(&self.name),
            pod: opt(&self.pod),
            image: opt(&self.image),
            command: self.command.iter().map(|a| clean(a)).collect(),
            pid_ns: self.pid_ns,
            cgroup: opt(&self.cgroup),
            init_pid: self.init_pid,
            init_start: self.init_start,
            claim: opt(&self.claim),
            driver_memory_limit: opt(&self.driver_memory_limit),
        }
    }
}

/// The DRA plugin's record of a claim (`claim.json`): who the claim is,
/// and the pods it is reserved for. Fields a record lacks read as empty.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClaimRecord {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uid: String,
    #[serde(default)]
    pub pods: Vec<String>,
}

impl ClaimRecord {
    /// `namespace/name`, as given (not escaped); None where either is
    /// missing.
    pub fn namespaced_name(&self) -> Option<String> {
        (!self.namespace.is_empty() && !self.name.is_empty())
            .then(|| format!("{}/{}", self.namespace, self.name))
    }
}

/// The quota file in `dir`, the directory a slice's quota file is in
/// (`layout::open_quota_dir`: a container's quota directory, a claim's or
/// a session's own directory; `shown`: the file's path, for errors),
/// parsed: opened from the directory's descriptor without
/// following a link or blocking, a regular file owned by `owner` where
/// given, at most [`config::MAX_FILE_BYTES`] (a FIFO, a link to /dev/zero
/// or a huge file never stalls the reader).
pub fn read_quota(
    dir: BorrowedFd,
    shown: &Path,
    owner: Option<(u32, &str)>,
) -> Result<Config, String> {
    let text = fs::read_checked_at(dir, Path::new(QUOTA_FILE), owner, config::MAX_FILE_BYTES)
        .map_err(|e| format!("{}: {e}", shown.display()))?;
    config::parse_file(shown, &text).map_err(|e| e.to_string())
}

/// The container record (`container.json`) of a slice's directory `dir`,
/// read as [`read_quota`] reads (owned by `owner` where given), at most
/// [`RECORD_MAX`]: Err where it cannot be read (the hook writes it last),
/// Ok(None) where what is there is no record.
pub fn read_record(dir: &Dir, owner: Option<(u32, &str)>) -> Result<Option<ContainerMeta>, String> {
    let text = dir.read_checked(CONTAINER_RECORD, owner, RECORD_MAX)?;
    Ok(serde_json::from_str(&text).ok())
}

/// The DRA plugin's record of a claim (`claim.json`) in the claim's
/// directory `dir`, read as [`read_quota`] reads (owned by `owner` where
/// given), at most [`CLAIM_RECORD_MAX`]; None where there is no readable
/// record.
pub fn read_claim_record(dir: &Dir, owner: Option<(u32, &str)>) -> Option<ClaimRecord> {
    dir.read_checked(CLAIM_RECORD, owner, CLAIM_RECORD_MAX)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
}

/// The `runs` text of a container the hook recorded: its pod and name,
/// its image, else its command, else its id; escaped and bounded by
/// [`text::clean`](super::text::clean) (whether `m` was or not). What
/// `cuslice status` shows a container's tenant running, and what the
/// watch's labels name a container by.
pub fn describe(m: &ContainerMeta) -> String {
    let mut parts = vec![];
    match (&m.pod, &m.name) {
        (Some(p), Some(n)) => parts.push(format!("{p}/{n}")),
        (Some(p), None) => parts.push(p.clone()),
        (None, Some(n)) => parts.push(n.clone()),
        (None, None) => {}
    }
    if let Some(i) = &m.image {
        parts.push(i.clone());
    }
    if parts.is_empty() && !m.command.is_empty() {
        parts.push(command_line(&m.command));
    }
    if parts.is_empty() {
        parts.push(format!("container {}", short_id(&m.id)));
    }
    super::text::clean(&parts.join(" "))
}

/// A command for display: the program's file name, then its arguments
/// (the directory it lives in takes the room of what it was asked to do).
/// Not escaped.
pub fn command_line(args: &[String]) -> String {
    let mut v: Vec<&str> = args.iter().map(String::as_str).collect();
    if let Some(first) = args.first() {
        v[0] = std::path::Path::new(first)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(first);
    }
    v.join(" ")
}

/// A container id (or a claim's UID) as `docker ps` shortens an id: its
/// first 12 characters.
pub fn short_id(id: &str) -> String {
    id.chars().take(12).collect()
}

/// Whether a container whose record names `init` (host PID, start time)
/// still runs: that PID is a process started at that time, `stat` reading
/// `/proc/<pid>/stat` (the watch's `ProcSource`, or
/// [`proc::stat`](super::proc::stat)). A record without one (an older
/// hook's) is taken as live: a record left behind cannot be told from a
/// live one. What the watch matches processes by, and what the OCI hook
/// checks a tenant name against.
pub fn init_alive(
    init: Option<(u32, u64)>,
    stat: impl Fn(u32) -> Option<super::proc::Stat>,
) -> bool {
    init.is_none_or(|(pid, start)| stat(pid).is_some_and(|s| s.start == start))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The claim is written only for a container of one, and a record
    /// without it (an older hook's, or a container of annotations) reads
    /// as none.
    #[test]
    fn a_record_names_its_claim_only_where_there_is_one() {
        let m = ContainerMeta {
            id: "abc".into(),
            claim: Some("0b1c2d3e-0000-4000-8000-000000000001".into()),
            ..ContainerMeta::default()
        };
        let text = serde_json::to_string(&m).expect("encode");
        assert_eq!(
            text,
            r#"{"id":"abc","claim":"0b1c2d3e-0000-4000-8000-000000000001"}"#
        );
        assert_eq!(
            serde_json::from_str::<ContainerMeta>(&text).expect("decode"),
            m
        );
        let old: ContainerMeta =
            serde_json::from_str(r#"{"id":"abc","pid_ns":5}"#).expect("decode");
        assert_eq!(old.claim, None);
        assert!(
            !serde_json::to_string(&old)
                .expect("encode")
                .contains("claim")
        );
    }

    #[test]
    fn a_container_is_described_by_what_its_runtime_says() {
        let m = |name: Option<&str>, pod: Option<&str>, image: Option<&str>, cmd: &[&str]| {
            ContainerMeta {
                id: "0123456789abcdef0123".into(),
                name: name.map(Into::into),
                pod: pod.map(Into::into),
                image: image.map(Into::into),
                command: cmd.iter().map(|c| c.to_string()).collect(),
                ..ContainerMeta::default()
            }
        };
        let cmd = ["/usr/bin/python3", "train.py"];
        assert_eq!(
            describe(&m(
                Some("trainer"),
                Some("team-a/train-0"),
                Some("pytorch:2.3"),
                &cmd
            )),
            "team-a/train-0/trainer pytorch:2.3"
        );
        assert_eq!(describe(&m(Some("svc"), None, None, &cmd)), "svc");
        assert_eq!(describe(&m(None, None, Some("img"), &cmd)), "img");
        assert_eq!(describe(&m(None, None, None, &cmd)), "python3 train.py");
        assert_eq!(
            describe(&m(None, None, None, &[])),
            "container 0123456789ab"
        );
        assert_eq!(short_id("é".repeat(20).as_str()), "é".repeat(12));
    }

    /// What `status` and the watch read of a slice's directory, each with
    /// the owner it requires.
    #[test]
    fn a_slice_directory_is_read_with_the_owner_each_reader_requires() {
        use std::os::fd::AsFd;
        let t = std::env::temp_dir().join(format!("cuslice-container-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        std::fs::create_dir_all(&t).expect("dir");
        let d = Dir::open(&t).expect("open");
        let me = crate::sys::euid();
        // Nothing there yet: no quota, no record (the hook writes it last).
        assert!(read_quota(d.as_fd(), &t.join(QUOTA_FILE), None).is_err());
        assert!(read_record(&d, None).is_err());
        assert_eq!(read_claim_record(&d, None), None);
        std::fs::write(
            t.join(QUOTA_FILE),
            "tenant = \"web\"\n[all]\nmemory = \"1GiB\"\n",
        )
        .expect("quota");
        std::fs::write(t.join(CONTAINER_RECORD), r#"{"id":"abc"}"#).expect("record");
        std::fs::write(t.join(CLAIM_RECORD), r#"{"name":"x","pods":["p"]}"#).expect("claim");
        let q = read_quota(d.as_fd(), &t.join(QUOTA_FILE), Some((me, "our"))).expect("quota");
        assert_eq!(q.tenant_name(), "web");
        assert_eq!(
            read_record(&d, Some((me, "our")))
                .expect("read")
                .map(|m| m.id),
            Some("abc".into())
        );
        assert_eq!(
            read_claim_record(&d, None).map(|r| r.pods),
            Some(vec!["p".to_string()])
        );
        // Another owner required: not read.
        let other = me.wrapping_add(1);
        assert!(read_quota(d.as_fd(), &t.join(QUOTA_FILE), Some((other, "their"))).is_err());
        assert!(read_record(&d, Some((other, "their"))).is_err());
        assert_eq!(read_claim_record(&d, Some((other, "their"))), None);
        // A record that is no record: read, and none.
        std::fs::write(t.join(CONTAINER_RECORD), "not json").expect("record");
        assert_eq!(read_record(&d, None), Ok(None));
        // A link is not followed.
        std::fs::remove_file(t.join(QUOTA_FILE)).expect("rm");
        std::os::unix::fs::symlink("/etc/hostname", t.join(QUOTA_FILE)).expect("link");
        assert!(read_quota(d.as_fd(), &t.join(QUOTA_FILE), None).is_err());
        let _ = std::fs::remove_dir_all(&t);
    }

    /// The DRA plugin writes what status, the watch and the hook read.
    #[test]
    fn a_claim_record_reads_what_the_plugin_writes() {
        let r = ClaimRecord {
            namespace: "team-a".into(),
            name: "trainer".into(),
            uid: "u".into(),
            pods: vec!["team-a/trainer-0".into()],
        };
        let text = serde_json::to_string(&r).expect("encode");
        assert_eq!(
            text,
            r#"{"namespace":"team-a","name":"trainer","uid":"u","pods":["team-a/trainer-0"]}"#
        );
        assert_eq!(
            serde_json::from_str::<ClaimRecord>(&text).expect("decode"),
            r
        );
        assert_eq!(r.namespaced_name().as_deref(), Some("team-a/trainer"));
        let partial: ClaimRecord = serde_json::from_str(r#"{"name":"x"}"#).expect("decode");
        assert_eq!(partial.namespaced_name(), None);
        assert!(partial.pods.is_empty());
    }
}
