//! What the runtime hands the hook: the OCI state on stdin and the parts
//! of the bundle's `config.json` the hook reads (annotations, the
//! process's arguments and user, the user namespace, the GPU device
//! nodes, the root file system); and the user check, which refuses a
//! container whose processes would not be host root.

use super::*;

/// The OCI state the runtime passes on stdin.
#[derive(Debug, Deserialize)]
pub(super) struct State {
    pub(super) id: String,
    #[serde(default)]
    pub(super) pid: Option<i32>,
    pub(super) bundle: PathBuf,
    #[serde(default)]
    pub(super) annotations: BTreeMap<String, String>,
}

/// The part of the bundle's config.json we need.
#[derive(Debug, Deserialize)]
pub(super) struct Spec {
    pub(super) root: Option<SpecRoot>,
    #[serde(default)]
    pub(super) annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub(super) process: Option<SpecProcess>,
    #[serde(default)]
    pub(super) linux: Option<SpecLinux>,
}

#[derive(Debug, Deserialize)]
pub(super) struct SpecProcess {
    #[serde(default)]
    pub(super) args: Vec<String>,
    #[serde(default)]
    pub(super) user: SpecUser,
}

/// `process.user`: who the container's processes run as.
#[derive(Debug, Default, Deserialize)]
pub(super) struct SpecUser {
    #[serde(default)]
    pub(super) uid: u32,
    #[serde(default)]
    pub(super) gid: u32,
    #[serde(default, rename = "additionalGids")]
    pub(super) additional_gids: Vec<u32>,
}

#[derive(Debug, Default, Deserialize)]
pub(super) struct SpecLinux {
    #[serde(default)]
    namespaces: Vec<SpecNamespace>,
    #[serde(default, rename = "uidMappings")]
    uid_mappings: Vec<SpecIdMapping>,
    /// The device nodes the runtime makes in the container (CDI's, the
    /// runtime's `--device`s): which GPUs it gets (`/dev/nvidia<minor>`).
    #[serde(default)]
    pub(super) devices: Vec<SpecDevice>,
}

#[derive(Debug, Deserialize)]
pub(super) struct SpecDevice {
    pub(super) path: String,
}

/// The minors of the GPU device nodes (`/dev/nvidia<minor>`, not
/// `nvidiactl`, `nvidia-uvm`, ...) among a spec's devices.
pub(super) fn gpu_minors(devices: &[SpecDevice]) -> Vec<u32> {
    devices
        .iter()
        .filter_map(|d| d.path.strip_prefix("/dev/nvidia"))
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .filter_map(|n| n.parse().ok())
        .collect()
}

#[derive(Debug, Deserialize)]
struct SpecNamespace {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
struct SpecIdMapping {
    #[serde(rename = "containerID")]
    container_id: u32,
    #[serde(rename = "hostID")]
    host_id: u32,
    size: u32,
}

#[derive(Debug, Deserialize)]
pub(super) struct SpecRoot {
    pub(super) path: PathBuf,
}

pub(super) fn read_state() -> Result<State, String> {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
        .map_err(|e| format!("cannot read the OCI state on stdin: {e}"))?;
    serde_json::from_str(&s).map_err(|e| format!("the OCI state on stdin is not valid: {e}"))
}

pub(super) fn read_spec(bundle: &Path) -> Result<Spec, String> {
    let p = bundle.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

/// The uid map of this process (`/proc/self/uid_map`): None outside any
/// user namespace (the initial namespace maps all of 0..2^32-1 to itself),
/// else the host uid its uid 0 is (None if unmapped: `?`).
pub(super) fn own_user_namespace() -> Option<String> {
    let map = std::fs::read_to_string("/proc/self/uid_map").ok()?;
    let rows: Vec<Vec<&str>> = map
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    if rows.len() == 1 && rows[0] == ["0", "0", "4294967295"] {
        return None;
    }
    Some(
        rows.iter()
            .find(|r| r.first() == Some(&"0"))
            .and_then(|r| r.get(1))
            .map_or_else(|| "?".to_string(), |h| h.to_string()),
    )
}

/// Refuses a container whose processes would not be host root (see the
/// module documentation): the hook running in a user namespace (a rootless
/// runtime: `host_uid` is what the hook's uid 0 is on the host), or a
/// container with its own user namespace.
pub(super) fn check_user_namespaces(
    host_uid: Option<String>,
    linux: &SpecLinux,
) -> Result<(), String> {
    const WHY: &str = "its processes would not be host root, and the segments tenants share are root's files (a segment owned by another uid is refused)";
    if let Some(h) = host_uid {
        return Err(format!(
            "the runtime is rootless (this hook runs in a user namespace, as host uid {h}): cuslice needs a rootful runtime, since {WHY}"
        ));
    }
    if linux.namespaces.iter().any(|n| n.kind == "user") || !linux.uid_mappings.is_empty() {
        let root = linux
            .uid_mappings
            .iter()
            .find(|m| m.container_id == 0 && m.size > 0)
            .map_or_else(
                || "unmapped".to_string(),
                |m| format!("host uid {}", m.host_id),
            );
        return Err(format!(
            "the container has its own user namespace (its uid 0 is {root}): cuslice cannot give it a slice, since {WHY}; run it without a user namespace (no --userns / --uidmap)"
        ));
    }
    Ok(())
}
