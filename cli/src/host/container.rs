//! A container's record on the host, the data contract between the OCI hook
//! (which writes it), `cuslice status` / `top` / `exporter` and `cuslice
//! watch` (which read it): `<root>/containers/<id>/container.json`.

use serde::{Deserialize, Serialize};

/// The hook's root, where it keeps the GPU segments, the per-container
/// directories and `ld.so.preload`.
pub const DEFAULT_ROOT: &str = "/run/cuslice";

/// The file the hook writes next to a container's quota file.
pub const META_FILE: &str = "container.json";

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
}

impl ContainerMeta {
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
        }
    }
}
