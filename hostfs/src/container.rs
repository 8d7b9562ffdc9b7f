//! The records on the host, the data contracts between their writers and
//! readers: a container's (`<root>/containers/<id>/container.json`, written
//! by the OCI hook) and a DRA claim's (`<root>/claims/<uid>/claim.json`,
//! written by the DRA plugin), read by `cuslice status` / `top` /
//! `exporter`, `cuslice watch` and the hook's tenant check.

use serde::{Deserialize, Serialize};

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
