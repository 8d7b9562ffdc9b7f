//! `cuslice oci-hook create|poststop`: the OCI runtime hook that gives a
//! container its slice.
//!
//! `create` (run it as a `createRuntime` hook, or `prestart` where only that
//! exists: podman / CRI-O hooks.d) reads the container's state on stdin,
//! turns its `cuslice.io/*` annotations into a quota file, and mounts into
//! the container, before it pivots to its root file system:
//!
//! | in the container | from the host | |
//! |---|---|---|
//! | `/etc/cuslice` | `<root>/containers/<id>/etc` (the quota file `quota.toml` alone) | read-only |
//! | `/run/cuslice/segment` | `<root>/containers/<id>/segment` | the container's memory segment |
//! | `/run/cuslice/gpu` | `<root>/gpu` | the host's per-GPU segments |
//! | `/usr/lib/cuslice/libcuslice.so` | the installed library | read-only |
//! | `/etc/ld.so.preload` | `<root>/ld.so.preload` (names the library) | read-only |
//!
//! The quota file is mounted through its directory, not as a file:
//! `cuslice resize` renames a new quota file into place, and a mount of
//! the file would keep showing the container the one it was created with;
//! through the directory, a process the container starts after a resize
//! opens the resized file. That directory holds nothing else (the
//! container's record, its resize record and its segment directory are
//! beside it, out of the container's sight), but, while a resize or this
//! hook writes the file, the new file under a hidden name
//! (`.quota.toml.new`, the same text, mode 0444) before it is renamed
//! into place. A container made by an older hook has its quota file at
//! `<root>/containers/<id>/quota.toml`, mounted as a file: `cuslice
//! resize`, `status` and `watch` still find it there, and its processes
//! see a resize only once it is recreated.
//!
//! The mounts are made from a child that enters the container's mount
//! namespace (`setns` on `/proc/<pid>/ns/mnt`): at this stage the
//! container's root is mounted at its bundle path and host paths are still
//! reachable. `poststop` removes `<root>/containers/<id>`.
//!
//! That is also why the image cannot be trusted with names: the hook is
//! host root and host paths are reachable, so a symlink in the image
//! (`/etc -> /host/etc`, `/usr/lib/cuslice -> ../../../../x`) would lead its
//! writes onto the host. Every path in the container is opened, and created
//! where missing, through `inroot` without following any symlink, and
//! mounted on through its descriptor. A symlink, a device, fifo or socket,
//! or a directory where a file belongs (or the reverse) fails container
//! creation with one line naming the path inside the container.
//!
//! With `--claim <uid>` (the per-claim CDI spec that the DRA kubelet plugin,
//! `cuslice-dra-plugin`, writes for a Kubernetes ResourceClaim), the quota
//! is not taken from annotations but from `<root>/claims/<uid>/quota.toml`
//! (the plugin's, read-only, read here without following a link and checked
//! the way the shim reads it), and the segment directory mounted at
//! `/run/cuslice/segment` is `<root>/claims/<uid>/segment`: every container
//! of the claim shares its memory quota, as they share its capacity. The
//! container's annotations are then ignored (the claim is what the
//! scheduler granted), and everything else (the checks, the other mounts,
//! the record) is the same, but for the record's `claim`: the claim's UID,
//! by which `cuslice watch` judges every container of the claim as one
//! slice against the claim's quota file and memory segment (the copy in
//! `<root>/containers/<id>/etc/quota.toml`, mounted at
//! `/etc/cuslice/quota.toml`, is what the container's shim reads; `cuslice
//! resize` of the claim writes every such copy again, so that the claim's
//! containers' new processes read the resized quota). A claim with no
//! quota file fails creation.
//!
//! A container without `cuslice.io/*` annotations is left alone. A bad
//! annotation fails container creation with one line naming it, and nothing
//! is left behind.
//!
//! A tenant name (`cuslice.io/tenant`) is one container's: a container
//! whose annotation names the tenant of another live container (its
//! recorded init still runs) or of a DRA claim under the same `--root` is
//! refused with one line naming the tenant and the other. The check and
//! the record it is made against are written under an exclusive lock on
//! `<root>/hook.lock`, so two hooks at once cannot both pass. (The GPU
//! segment keys tenants by name *and* slice, the quota file's `slice`,
//! `ctr-<id>` here: even a name shared another way never lets one
//! container change another's share.)
//!
//! So does a container that could not use its slice: one whose runtime is
//! rootless (the hook itself runs in a user namespace) or that has its own
//! user namespace. Its processes would not be host root, and the segments
//! they must share are root's files under `<root>` (a segment owned by
//! another uid is refused, by design: docs/threat-model.md); without this
//! check such a container started and only failed at its first CUDA call.
//!
//! `create` also records what the container runs, for `cuslice status` /
//! `top` (which cannot see into the container's PID namespace):
//! `<root>/containers/<id>/container.json` holds its name, pod and image
//! where an annotation of the runtime gives them, and its command line;
//! and, for `cuslice watch`, the inode of its PID namespace and its cgroup
//! (what maps a host PID to the container, whatever the process does), its
//! init (host PID and start time) and, given `--claim`, the claim's UID
//! (what maps the container to the claim's slice).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cuslice_core::config;
use serde::Deserialize;

use crate::host::container::{self, ContainerMeta};
use crate::host::fs::Dir;
use crate::host::inroot::{self, Kind};
use crate::host::layout::{
    self, CLAIMS_DIR, CONTAINER_RECORD, CONTAINERS_DIR, GPU_DIR, LOCK_FILE, Layout, MEMORY_SEGMENT,
    PRELOAD_FILE, QUOTA_DIR, QUOTA_FILE, SEGMENT_DIR, SliceKind,
};

pub use crate::host::layout::DEFAULT_ROOT;
pub const DEFAULT_LIB: &str = "/usr/lib/cuslice/libcuslice.so";

/// The OCI state the runtime passes on stdin.
#[derive(Debug, Deserialize)]
struct State {
    id: String,
    #[serde(default)]
    pid: Option<i32>,
    bundle: PathBuf,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// The part of the bundle's config.json we need.
#[derive(Debug, Deserialize)]
struct Spec {
    root: Option<SpecRoot>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    process: Option<SpecProcess>,
    #[serde(default)]
    linux: Option<SpecLinux>,
}

#[derive(Debug, Deserialize)]
struct SpecProcess {
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    user: SpecUser,
}

/// `process.user`: who the container's processes run as.
#[derive(Debug, Default, Deserialize)]
struct SpecUser {
    #[serde(default)]
    uid: u32,
    #[serde(default)]
    gid: u32,
    #[serde(default, rename = "additionalGids")]
    additional_gids: Vec<u32>,
}

#[derive(Debug, Default, Deserialize)]
struct SpecLinux {
    #[serde(default)]
    namespaces: Vec<SpecNamespace>,
    #[serde(default, rename = "uidMappings")]
    uid_mappings: Vec<SpecIdMapping>,
    /// The device nodes the runtime makes in the container (CDI's, the
    /// runtime's `--device`s): which GPUs it gets (`/dev/nvidia<minor>`).
    #[serde(default)]
    devices: Vec<SpecDevice>,
}

#[derive(Debug, Deserialize)]
struct SpecDevice {
    path: String,
}

/// The minors of the GPU device nodes (`/dev/nvidia<minor>`, not
/// `nvidiactl`, `nvidia-uvm`, ...) among a spec's devices.
fn gpu_minors(devices: &[SpecDevice]) -> Vec<u32> {
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

/// Where runtimes put a container's name, its pod and its image. Podman 4
/// puts none of them in the OCI spec (only `--annotation`s given to it):
/// its containers are shown by their command.
const NAME_ANNOTATIONS: [&str; 3] = [
    "io.kubernetes.cri.container-name", // containerd (CRI)
    "io.kubernetes.container.name",     // CRI-O
    "nerdctl/name",                     // nerdctl
];
const POD_ANNOTATIONS: [(&str, &str); 2] = [
    (
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.cri.sandbox-name",
    ),
    ("io.kubernetes.pod.namespace", "io.kubernetes.pod.name"),
];
const IMAGE_ANNOTATIONS: [&str; 2] = [
    "io.kubernetes.cri.image-name",  // containerd (CRI)
    "io.kubernetes.cri-o.ImageName", // CRI-O
];

fn container_meta(id: &str, ann: &BTreeMap<String, String>, args: &[String]) -> ContainerMeta {
    let first = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| ann.get(*k).filter(|v| !v.is_empty()).cloned())
    };
    ContainerMeta {
        id: id.to_string(),
        name: first(&NAME_ANNOTATIONS),
        pod: POD_ANNOTATIONS.iter().find_map(|(ns, pod)| {
            let (ns, pod) = (ann.get(*ns)?, ann.get(*pod)?);
            (!pod.is_empty()).then(|| format!("{ns}/{pod}"))
        }),
        image: first(&IMAGE_ANNOTATIONS),
        command: args.to_vec(),
        pid_ns: None,
        cgroup: None,
        init_pid: None,
        init_start: None,
        claim: None,
        driver_memory_limit: None,
    }
}

/// The uid map of this process (`/proc/self/uid_map`): None outside any
/// user namespace (the initial namespace maps all of 0..2^32-1 to itself),
/// else the host uid its uid 0 is (None if unmapped: `?`).
fn own_user_namespace() -> Option<String> {
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
fn check_user_namespaces(host_uid: Option<String>, linux: &SpecLinux) -> Result<(), String> {
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

#[derive(Debug, Deserialize)]
struct SpecRoot {
    path: PathBuf,
}

/// The quota file's `slice` for container `id`: `ctr-<id>`, unique per
/// container (an id is a plain name of at most 128 characters; one too
/// long for a slice keeps its first 107 and a hash of the whole).
fn container_slice(id: &str) -> String {
    let s = format!("ctr-{id}");
    if s.len() <= config::SLICE_MAX_LEN {
        return s;
    }
    let tag = config::Config {
        slice: Some(s),
        ..config::Config::unlimited(config::Source::None)
    }
    .slice_tag();
    format!("ctr-{}-{tag:016x}", &id[..id.len().min(107)])
}

fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        || id.starts_with('.')
    {
        return Err(format!("container id {id:?} is not a plain name"));
    }
    Ok(())
}

/// The quota file for a container's annotations; None without any
/// `cuslice.io/` annotation. GPU indices in `cuslice.io/gpus` are the
/// host's (NVML's, as `nvidia-smi`, `--gpus device=` and CDI's
/// `nvidia.com/gpu=<i>` number them): the file names those GPUs by UUID.
pub fn quota_from_annotations(
    id: &str,
    ann: &BTreeMap<String, String>,
) -> Result<Option<String>, String> {
    quota_from_annotations_with(id, ann, &|| {
        let gpus = crate::host::nvml::Nvml::open().and_then(|n| n.gpus())?;
        Ok(gpus.into_iter().map(|g| (g.index, g.uuid)).collect())
    })
}

/// [`quota_from_annotations`] with the host's GPUs (NVML index, UUID)
/// listed by `host_gpus`, called once where `cuslice.io/gpus` names GPUs.
pub fn quota_from_annotations_with(
    id: &str,
    ann: &BTreeMap<String, String>,
    host_gpus: &dyn Fn() -> Result<Vec<(u32, String)>, String>,
) -> Result<Option<String>, String> {
    const KNOWN: [&str; 10] = [
        "cuslice.io/memory",
        "cuslice.io/memory-max",
        "cuslice.io/memory-wait",
        "cuslice.io/compute",
        "cuslice.io/compute-max",
        "cuslice.io/compute-burst-ms",
        "cuslice.io/latency",
        "cuslice.io/gpus",
        "cuslice.io/tenant",
        ALLOW_UNHEALTHY_ANNOTATION,
    ];
    let ours: Vec<(&String, &String)> = ann
        .iter()
        .filter(|(k, _)| k.starts_with("cuslice.io/"))
        .collect();
    if ours.is_empty() {
        return Ok(None);
    }
    // The default tenant name is cut from the id, byte-wise: a plain
    // (ASCII) id is what makes that cut land between characters.
    check_id(id)?;
    for (k, _) in &ours {
        if !KNOWN.contains(&k.as_str()) {
            return Err(format!(
                "annotation {k}: unknown (expected one of {})",
                KNOWN.join(", ")
            ));
        }
    }
    let get = |k: &str| ann.get(k).map(|v| v.trim().to_string());
    allow_unhealthy(ann)?;
    let latency = match get("cuslice.io/latency") {
        None => false,
        Some(v) => config::parse_switch(&v)
            .map_err(|e| format!("annotation cuslice.io/latency={v:?}: {e}"))?,
    };
    let given = crate::limits::Limits {
        memory: get("cuslice.io/memory"),
        memory_max: get("cuslice.io/memory-max"),
        memory_wait: get("cuslice.io/memory-wait"),
        compute: get("cuslice.io/compute"),
        compute_max: get("cuslice.io/compute-max"),
        compute_burst_ms: get("cuslice.io/compute-burst-ms"),
        latency,
    };
    let (top, limits) = crate::limits::to_quota(&given, &crate::limits::ANNOTATIONS)?;
    let no_limit = limits.is_empty();
    let tenant = match get("cuslice.io/tenant") {
        Some(t) => t,
        None => format!("ctr-{}", &id[..id.len().min(24)]),
    };
    let mut file = config::QuotaFile {
        tenant: Some(tenant),
        slice: Some(container_slice(id)),
        segment_dir: Some(config::CONTAINER_SEGMENT_DIR.into()),
        gpu_segment_dir: Some(config::CONTAINER_GPU_SEGMENT_DIR.into()),
        ..top
    };
    match get("cuslice.io/gpus").as_deref() {
        None | Some("all") | Some("") => {
            file.all = limits;
        }
        Some(list) => {
            // The host's GPUs, listed once, at the first entry that asks.
            let mut listed: Option<Result<Vec<(u32, String)>, String>> = None;
            for g in list.split(',').map(str::trim) {
                let host = listed.get_or_insert_with(host_gpus);
                let uuid = if !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()) {
                    // A host index: its UUID, so that the entry names the
                    // same GPU whatever CUDA numbers it in the container
                    // (and the watch, which goes by UUID, holds it too).
                    let gpus = host.as_ref().map_err(|e| {
                        format!(
                            "annotation cuslice.io/gpus={list:?}: cannot find the UUID of host GPU {g} through NVML ({e}); give UUIDs instead"
                        )
                    })?;
                    let found = g
                        .parse::<u32>()
                        .ok()
                        .and_then(|i| gpus.iter().find(|(n, _)| *n == i));
                    let Some((_, u)) = found else {
                        return Err(format!(
                            "annotation cuslice.io/gpus={list:?}: expected GPUs of this host, got {g:?} ({} GPUs listed by NVML)",
                            gpus.len()
                        ));
                    };
                    config::parse_uuid(u).map_err(|e| format!("NVML's GPU {g} UUID {u:?}: {e}"))?
                } else {
                    let u = config::parse_uuid(g).map_err(|_| {
                        format!(
                            "annotation cuslice.io/gpus={list:?}: expected all, or GPU indices or UUIDs separated by commas, got {g:?}"
                        )
                    })?;
                    // Where NVML lists the host's GPUs, a UUID none of them
                    // has would limit no GPU: refused. (Without NVML the
                    // shim still says so in the container.)
                    if let Ok(gpus) = host
                        && !gpus
                            .iter()
                            .any(|(_, h)| config::parse_uuid(h).is_ok_and(|h| h == u))
                    {
                        return Err(format!(
                            "annotation cuslice.io/gpus={list:?}: expected GPUs of this host, got {g:?} ({} GPUs listed by NVML)",
                            gpus.len()
                        ));
                    }
                    u
                };
                // A map keeps one entry per key: the same GPU twice (by
                // index and by UUID, say) would otherwise pass unnoticed.
                if file.by_uuid.insert(uuid, limits).is_some() {
                    return Err(format!(
                        "annotation cuslice.io/gpus={list:?}: expected each GPU once, got {g:?} twice"
                    ));
                }
            }
        }
    }
    // The same validation the shim applies: a file the hook writes must load.
    let (text, _) = file
        .render(
            &format!("written by `cuslice oci-hook` for container {id}"),
            Path::new("annotations"),
        )
        .map_err(|e| e.to_string())?;
    // A container marked for cuslice (the runtime's hook selector matches
    // any cuslice.io/ annotation) but given no limit would run with the
    // whole GPU under a quota file nothing inside can override.
    if no_limit {
        return Err(
            "annotations: no limit among them (cuslice.io/memory, cuslice.io/compute or cuslice.io/compute-max): refusing to give the container an unlimited GPU".to_string(),
        );
    }
    Ok(Some(text))
}

fn read_state() -> Result<State, String> {
    let mut s = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
        .map_err(|e| format!("cannot read the OCI state on stdin: {e}"))?;
    serde_json::from_str(&s).map_err(|e| format!("the OCI state on stdin is not valid: {e}"))
}

fn read_spec(bundle: &Path) -> Result<Spec, String> {
    let p = bundle.join("config.json");
    let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

pub struct HookArgs {
    pub root: PathBuf,
    pub lib: PathBuf,
    /// `--claim`: the UID of the ResourceClaim whose quota file and segment
    /// directory (under `<root>/claims/`) the container gets.
    pub claim: Option<String>,
}

/// The quota file the DRA plugin wrote for claim `uid`
/// (`<root>/claims/<uid>/quota.toml`) and its path for messages: a regular
/// file of root's, reached without following a link, checked the way the
/// shim will read it.
fn claim_quota(root: &Path, uid: &str) -> Result<(String, PathBuf), String> {
    check_id(uid).map_err(|_| format!("claim {uid:?} is not a plain name"))?;
    let dir = Layout::new(root).open_claim(uid)?;
    let text = dir.read_file(QUOTA_FILE, config::MAX_FILE_BYTES)?;
    let path = dir.join(QUOTA_FILE);
    let cfg = config::parse_file(&path, &text).map_err(|e| e.to_string())?;
    if !cfg.has_limits() {
        return Err(format!(
            "{}: no limit in it: refusing to give the claim's container an unlimited GPU",
            path.display()
        ));
    }
    Ok((text, path))
}

pub fn create(a: &HookArgs) -> Result<(), String> {
    let st = read_state()?;
    check_id(&st.id)?;
    let spec = read_spec(&st.bundle)?;
    // Annotations reach hooks through the state (runtime-spec >= 1.0.2) or
    // the bundle's config.json; the state's win.
    let mut ann = spec.annotations;
    ann.extend(st.annotations);
    let (quota, label) = match &a.claim {
        Some(uid) => claim_quota(&a.root, uid)?,
        None => match quota_from_annotations(&st.id, &ann)? {
            Some(q) => (q, PathBuf::from("annotations")),
            None => return Ok(()),
        },
    };
    let linux = spec.linux.unwrap_or_default();
    check_user_namespaces(own_user_namespace(), &linux)?;
    let meta = container_meta(
        &st.id,
        &ann,
        spec.process.as_ref().map_or(&[][..], |p| &p.args[..]),
    );
    let user = spec
        .process
        .as_ref()
        .map(|p| inroot::User {
            uid: p.user.uid,
            gid: p.user.gid,
            groups: p.user.additional_gids.clone(),
        })
        .unwrap_or_default();
    let cfg = config::parse_file(&label, &quota).map_err(|e| e.to_string())?;
    let minors = gpu_minors(&linux.devices);
    check_gpu_health(&a.root, &cfg, &minors, allow_unhealthy(&ann)?)?;
    let gpus = gpu_segments_to_make(&cfg, &user)?;
    let pid = st
        .pid
        .filter(|p| *p > 0)
        .ok_or("the OCI state has no container pid")?;
    let meta = ContainerMeta {
        pid_ns: crate::host::proc::ns_inode(&format!("/proc/{pid}/ns/pid")),
        cgroup: std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|t| crate::host::proc::cgroup_of(&t)),
        init_pid: u32::try_from(pid).ok(),
        init_start: std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|t| crate::host::proc::parse_stat(&t))
            .map(|s| s.start),
        claim: a.claim.clone(),
        ..meta
    };
    let rootfs = match spec.root {
        Some(r) if r.path.is_absolute() => r.path,
        Some(r) => st.bundle.join(r.path),
        None => st.bundle.join("rootfs"),
    };
    if !a.lib.is_file() {
        return Err(format!(
            "{}: no such library (install cuslice, or pass --lib)",
            a.lib.display()
        ));
    }
    let cgroup_text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let meta = ContainerMeta {
        driver_memory_limit: driver_memory_limits(&cfg, &cgroup_text),
        ..meta
    };
    let layout = Layout::new(&a.root);
    let result = (|| {
        // The segments first, outside the lock: opening one waits for its
        // flock, which a tenant can hold (the files are 0666), and a hook
        // stuck there must not hold up every other container's.
        make_segments(a, &st.id, &cfg, &gpus)?;
        // The container's guarantee, registered before its first process
        // (a DRA claim's is the plugin's, at prepare).
        if a.claim.is_none() {
            register_guarantee(a, &cfg, &minors)?;
        }
        // The tenant check and the record it is made against, under the
        // root's lock (only a container that names its tenant takes it):
        // of two hooks naming one tenant at once, the second sees the
        // first's record.
        let lock = if a.claim.is_none() && ann.contains_key(TENANT_ANNOTATION) {
            let lock = lock_root(&a.root)?;
            let tenant = cfg.tenant_name();
            if let Some(other) = tenant_holder(&a.root, &st.id, &tenant, &|init| {
                crate::host::container::init_alive(init, crate::host::proc::stat)
            }) {
                return Err(format!(
                    "{TENANT_ANNOTATION} {tenant:?}: already the tenant of {other} on this host: two containers cannot share one tenant's slice; choose another name"
                ));
            }
            Some(lock)
        } else {
            None
        };
        write_records(a, &st.id, &quota, &meta)?;
        drop(lock);
        mount_into(pid, &rootfs, a, &st.id, &user)
    })();
    if result.is_err() {
        // Nothing half-created stays behind.
        if a.claim.is_none() {
            release_guarantee(&a.root, &st.id, &cfg);
        }
        let _ = remove_container(&layout, &st.id);
    }
    result
}

/// Registers the container's memory guarantee on each GPU it is given in
/// that GPU's memory pool (`cuslice_host::guarantee`), checked against
/// NVML's memory: a guarantee that cannot fit beside the others
/// registered there is refused in one line. Where the hook cannot load
/// NVML (no driver's library) nothing is registered: the container's
/// first process registers it (docs/memory-quota.md).
fn register_guarantee(a: &HookArgs, cfg: &config::Config, minors: &[u32]) -> Result<(), String> {
    use crate::host::guarantee::{self, GpuMemory};
    if !cfg.has_memory() {
        return Ok(());
    }
    let Ok(nvml) = crate::host::nvml::Nvml::open() else {
        return Ok(());
    };
    let mut gpus = vec![];
    for d in container_devices(&nvml, cfg, minors)? {
        let index = d.index;
        let total = nvml
            .memory_total(&d)
            .map_err(|e| format!("GPU {index}: cannot read its memory through NVML: {e}"))?;
        let uuid = config::parse_uuid(&d.uuid)
            .map_err(|e| format!("NVML's GPU {index} UUID {:?}: {e}", d.uuid))?;
        gpus.push(GpuMemory { index, uuid, total });
    }
    let root = Dir::keep_root(&a.root, 0o700)?;
    root.keep_dir(GPU_DIR, 0o755)?;
    let done = guarantee::register(
        &a.root.join(GPU_DIR),
        cfg,
        &gpus,
        cuslice_core::pool::Maker::Root,
        Some(0o666),
    )
    .map_err(|e| format!("the container's memory guarantee: {e}"))?;
    for line in done.iter().filter_map(|r| r.pending_line()) {
        eprintln!(
            "cuslice oci-hook: warning: {}",
            crate::host::text::clean_to(&line, crate::host::text::LINE_MAX)
        );
    }
    Ok(())
}

/// Releases the guarantee of container `id` (quota `cfg`) from the GPU
/// memory pools under `root`: only a container's own slice (a claim's
/// containers share the claim's, which the DRA plugin releases). What
/// cannot be released is said, one line each.
fn release_guarantee(root: &Path, id: &str, cfg: &config::Config) {
    if cfg.slice.as_deref() != Some(container_slice(id).as_str()) {
        return;
    }
    for e in crate::host::guarantee::release(&root.join(GPU_DIR), cfg) {
        eprintln!(
            "cuslice oci-hook: warning: the container's guarantee: {}",
            crate::host::text::clean_to(&e, crate::host::text::LINE_MAX)
        );
    }
}

/// The directory of a process's cgroup in the cgroup v2 hierarchy: its
/// `0::` line of `/proc/<pid>/cgroup` (`cgroup_text`) under where this
/// process sees the v2 hierarchy mounted (`mountinfo`: /sys/fs/cgroup on a
/// v2 host, /sys/fs/cgroup/unified on a hybrid one). Err (why not): no v2
/// hierarchy, or a process in its root cgroup (a limit there would hold
/// every process on the host), or a path that is not plain.
fn cgroup_v2_dir(cgroup_text: &str, mountinfo: &str) -> Result<String, String> {
    let mount = mountinfo
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            (right.split(' ').next() == Some("cgroup2") && f.get(3) == Some(&"/"))
                .then(|| f.get(4).map(|m| m.to_string()))
                .flatten()
        })
        .filter(|m| m.starts_with('/') && !m.contains('\\'))
        .ok_or("no cgroup v2 hierarchy is mounted")?;
    let path = cgroup_text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or("the container has no cgroup v2")?
        .trim_end_matches('/');
    if path.is_empty() {
        return Err("the container is in the root cgroup of the v2 hierarchy".into());
    }
    if !path.starts_with('/') || path.split('/').any(|c| c == ".." || c == ".") {
        return Err(format!(
            "the container's cgroup {path:?} is not a plain path"
        ));
    }
    Ok(format!("{}{path}", mount.trim_end_matches('/')))
}

/// Where the driver has a per-cgroup memory limit (NVML's
/// `nvmlDeviceSetMemoryLimits_v1`, R615 on, cgroup v2), the container's
/// cgroup gets its quota as hard (and soft) limit on every GPU it has a
/// quota on, so that a process that escapes the shim is still held by the
/// driver. Never fails the container: a driver without the limit is said
/// in the record, a driver that refuses is one warning and the record;
/// the shim enforces either way. None where the container has no memory
/// quota.
fn driver_memory_limits(cfg: &config::Config, cgroup_text: &str) -> Option<String> {
    if !cfg.has_memory() {
        return None;
    }
    let outcome = (|| -> Result<String, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let dir = match cgroup_v2_dir(cgroup_text, &mountinfo) {
            Ok(d) => d,
            Err(why) => return Ok(format!("unsupported: {why}")),
        };
        // No NVML, no driver limit (a host without the NVIDIA driver: the
        // shim has no GPU to hold either).
        let nvml = match crate::host::nvml::Nvml::open() {
            Ok(n) => n,
            Err(e) => return Ok(format!("unsupported: NVML: {e}")),
        };
        // Quota files the hook takes name GPUs by UUID or apply to all
        // (annotations' indices are mapped to UUIDs, claims name UUIDs).
        nvml.set_quota_limits(cfg, &dir)
    })();
    Some(match outcome {
        Ok(s) => s,
        Err(e) => {
            // (The cgroup path and NVML's words, shown, not sent: one line.)
            eprintln!(
                "cuslice oci-hook: warning: the driver's memory limit was not set ({}); the shim enforces the quota",
                crate::host::text::clean(&e)
            );
            format!("failed: {e}")
        }
    })
}

/// The annotation naming a container's tenant.
const TENANT_ANNOTATION: &str = "cuslice.io/tenant";

/// The annotation that starts a container on a GPU whose health is
/// unhealthy (docs/containers.md).
const ALLOW_UNHEALTHY_ANNOTATION: &str = "cuslice.io/allow-unhealthy-gpu";

/// Whether the container's annotations allow an unhealthy GPU (`true`;
/// absent or `false`: not). Read for claims' containers too.
fn allow_unhealthy(ann: &BTreeMap<String, String>) -> Result<bool, String> {
    match ann.get(ALLOW_UNHEALTHY_ANNOTATION).map(|v| v.trim()) {
        None => Ok(false),
        Some(v) => config::parse_switch(v)
            .map_err(|e| format!("annotation {ALLOW_UNHEALTHY_ANNOTATION}={v:?}: {e}")),
    }
}

/// A GPU of the host: NVML's index, UUID, and its device node's minor
/// (None where NVML does not tell).
type HostGpu = (u32, String, Option<u32>);

/// The GPUs a container is given: those its quota file names by UUID (its
/// annotation `cuslice.io/gpus`, a claim's allocation); else those whose
/// device nodes its spec makes (`/dev/nvidia<minor>`: CDI and `--device`
/// put them there); else, where neither says, every GPU of the host.
fn container_gpus<'a>(named: &[[u8; 16]], minors: &[u32], host: &'a [HostGpu]) -> Vec<&'a HostGpu> {
    if !named.is_empty() {
        return host
            .iter()
            .filter(|(_, u, _)| config::parse_uuid(u).is_ok_and(|u| named.contains(&u)))
            .collect();
    }
    if !minors.is_empty() {
        return host
            .iter()
            .filter(|(_, _, m)| m.is_some_and(|m| minors.contains(&m)))
            .collect();
    }
    host.iter().collect()
}

/// NVML's handles of the GPUs a container is given ([`container_gpus`]:
/// named by its quota file, else its device nodes' minors, else all).
fn container_devices(
    nvml: &crate::host::nvml::Nvml,
    cfg: &config::Config,
    minors: &[u32],
) -> Result<Vec<crate::host::nvml::DeviceHandle>, String> {
    let devices = nvml.devices()?;
    let host: Vec<HostGpu> = devices
        .iter()
        .map(|d| (d.index, d.uuid.clone(), nvml.minor_number(d).ok()))
        .collect();
    let named: Vec<[u8; 16]> = cfg.by_uuid.keys().copied().collect();
    let mine = container_gpus(&named, minors, &host);
    Ok(devices
        .iter()
        .filter(|d| mine.iter().any(|(i, _, _)| *i == d.index))
        .cloned()
        .collect())
}

/// What the hook does about its GPUs' health: the warnings to print (a
/// degraded GPU, an unhealthy one the annotation allows), or the refusal,
/// one line naming the first unhealthy GPU, why, since when and the
/// annotation that overrides it.
fn health_verdict(
    gpus: &[&crate::host::health::view::GpuView],
    allow: bool,
) -> Result<Vec<String>, String> {
    use crate::host::health::{State, judge::utc};
    let mut warnings = vec![];
    for g in gpus {
        let h = &g.health;
        let what = format!(
            "GPU {} ({}) is {} since {}: {}",
            g.index,
            g.uuid,
            h.state,
            utc(h.since_unix),
            h.reason.as_deref().unwrap_or("-")
        );
        match h.state {
            State::Healthy => {}
            State::Degraded => warnings.push(format!("{what}; the container starts on it")),
            State::Unhealthy if allow => warnings.push(format!(
                "{what}; the container starts on it as its annotation {ALLOW_UNHEALTHY_ANNOTATION} allows"
            )),
            State::Unhealthy => {
                return Err(format!(
                    "{what}: refusing to start the container on it (annotation {ALLOW_UNHEALTHY_ANNOTATION}: \"true\" starts it anyway)"
                ));
            }
        }
    }
    Ok(warnings)
}

/// Refuses a container whose GPU is unhealthy (as the host's health source
/// judged it, or one look now: `host::health::view`) unless `allow`;
/// warns of a degraded one. Where the hook cannot load NVML there is no
/// GPU it could judge (a host without the NVIDIA driver's library, as the
/// rest of the hook takes it): nothing is checked (docs/containers.md).
fn check_gpu_health(
    root: &Path,
    cfg: &config::Config,
    minors: &[u32],
    allow: bool,
) -> Result<(), String> {
    use crate::host::health::{source::now_unix, view};
    let Ok(nvml) = crate::host::nvml::Nvml::open() else {
        return Ok(());
    };
    let handles = container_devices(&nvml, cfg, minors)?;
    let v = view::view(&Layout::new(root), &nvml, &handles, now_unix());
    let views: Vec<&view::GpuView> = v.gpus.iter().collect();
    for w in health_verdict(&views, allow)? {
        eprintln!(
            "cuslice oci-hook: warning: {}",
            crate::host::text::clean_to(&w, crate::host::text::LINE_MAX)
        );
    }
    Ok(())
}

/// Takes the root's lock (`<root>/hook.lock`, the layout's
/// [`LOCK_FILE`]), which the tenant check and the record write are made
/// under, making the root where missing (root's, 0700, as [`make_segments`]
/// keeps it).
fn lock_root(root: &Path) -> Result<std::fs::File, String> {
    let dir = Dir::keep_root(root, 0o700)?;
    match dir.lock_within(LOCK_FILE, 0o600, LOCK_WAIT)? {
        Ok(f) => Ok(f),
        Err(_) => Err(format!(
            "{}: another container's hook still holds the tenant check's lock after {LOCK_WAIT:?}; try again",
            dir.join(LOCK_FILE).display()
        )),
    }
}

/// How long a hook waits for the tenant check's lock: it is held only
/// while one hook checks and writes two small files.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Removes `<root>/containers/<id>` and everything in it through the
/// layer: the container's segment directory is the container's to write
/// (it is mounted there), so nothing in it is followed. Not there is fine.
fn remove_container(layout: &Layout, id: &str) -> Result<(), String> {
    let dir = match layout.open().and_then(|r| r.open_dir(CONTAINERS_DIR)) {
        Ok(d) => d,
        Err(e) if e.not_found() => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    Ok(dir.remove(id)?)
}

/// Who else under `root` has the tenant name `tenant`: a live container
/// other than `own_id` (`alive` says whether a record's init still runs;
/// a container of a DRA claim is the claim's) or a DRA claim, named for
/// the refusal; None when nobody. Records are read as the watch reads
/// them (no link followed, root's files, bounded); one that cannot be
/// read, or names no live init, takes no name.
fn tenant_holder(
    root: &Path,
    own_id: &str,
    tenant: &str,
    alive: &dyn Fn(Option<(u32, u64)>) -> bool,
) -> Option<String> {
    use crate::host::container::ClaimRecord;
    use crate::host::layout::CLAIM_RECORD;
    use crate::host::text::clean;
    use std::ffi::OsStr;
    let root = Dir::open(root).ok()?;
    // A container's quota file where the layout has it (in its quota
    // directory, or where an older hook put it: such containers hold
    // their tenant names too), a claim's in its directory.
    let tenant_of = |d: &Dir, kind: SliceKind| -> Option<String> {
        let q = layout::open_quota_dir(d, kind, None).ok()?.dir;
        let text = q.read_file(QUOTA_FILE, config::MAX_FILE_BYTES).ok()?;
        let cfg = config::parse_file(&q.join(QUOTA_FILE), &text).ok()?;
        Some(cfg.tenant_name())
    };
    if let Ok(ctrs) = root.open_dir(CONTAINERS_DIR) {
        let mut ids: Vec<_> = ctrs.list().unwrap_or_default();
        ids.sort();
        for id in ids {
            if id == OsStr::new(own_id) {
                continue;
            }
            let Ok(d) = ctrs.open_dir(&id) else { continue };
            let Some(meta) = d
                .read_file(CONTAINER_RECORD, container::RECORD_MAX)
                .ok()
                .and_then(|t| serde_json::from_str::<ContainerMeta>(&t).ok())
            else {
                continue;
            };
            if meta.claim.is_some() || !alive(meta.init()) {
                continue;
            }
            if tenant_of(&d, SliceKind::Container).as_deref() == Some(tenant) {
                return Some(format!("container {}", clean(&id.to_string_lossy())));
            }
        }
    }
    if let Ok(claims) = root.open_dir(CLAIMS_DIR) {
        let mut uids: Vec<_> = claims.list().unwrap_or_default();
        uids.sort();
        for uid in uids {
            let Ok(d) = claims.open_dir(&uid) else {
                continue;
            };
            if tenant_of(&d, SliceKind::Claim).as_deref() != Some(tenant) {
                continue;
            }
            let uid = clean(&uid.to_string_lossy());
            let named = d
                .read_file(CLAIM_RECORD, container::CLAIM_RECORD_MAX)
                .ok()
                .and_then(|t| serde_json::from_str::<ClaimRecord>(&t).ok())
                .and_then(|r| r.namespaced_name());
            return Some(match named {
                Some(n) => format!("DRA claim {} ({uid})", clean(&n)),
                None => format!("DRA claim {uid}"),
            });
        }
    }
    None
}

/// The GPU segments this hook makes (UUIDs, as cuslice names them): for a
/// container with a compute share, every GPU NVML lists. The shim of a
/// container that runs as root makes a missing one itself; one that runs
/// as another user cannot (the GPU directory is root's), so without NVML
/// such a container is refused here, not at its first CUDA call.
fn gpu_segments_to_make(cfg: &config::Config, user: &inroot::User) -> Result<Vec<String>, String> {
    if !cfg.has_compute() && !cfg.has_memory() {
        return Ok(vec![]);
    }
    let listed = crate::host::nvml::Nvml::open().and_then(|n| n.gpus());
    match listed {
        Ok(gpus) => gpus
            .iter()
            .map(|g| {
                config::parse_uuid(&g.uuid)
                    .map(|u| config::format_uuid(&u))
                    .map_err(|e| format!("NVML's GPU {} UUID {:?}: {e}", g.index, g.uuid))
            })
            .collect(),
        // Root's processes make them where they need them; so does a
        // process with a memory quota only, where NVML lists no GPU (no
        // driver: no GPU to hold; were the pool then out of its reach, its
        // cuInit says so in one line).
        Err(_) if user.uid == 0 || !cfg.has_compute() => Ok(vec![]),
        Err(e) => Err(format!(
            "cannot list the GPUs through NVML ({e}): the GPU segments of a container that runs as a user other than root ({}) must be made by this hook",
            user.describe()
        )),
    }
}

/// The host's files for a container, every mode set here (never from the
/// umask), nothing reached through a link below `--root`:
///
/// | path under `--root` | mode | |
/// |---|---|---|
/// | `.` | 0700 | only root on the host reaches what is below |
/// | `gpu/` | 0755 | nobody but root makes a segment there |
/// | `gpu/<uuid>.seg` | 0666 | root's, made here (with a compute share): usable by a container of any user |
/// | `gpu/<uuid>.memory` | 0666 | the GPU's memory pool (`cuslice_core::pool`), likewise (with a memory quota) |
/// | `containers/`, `containers/<id>/` | 0700 | |
/// | `containers/<id>/segment/` | 0755 | |
/// | `containers/<id>/segment/memory.seg` | 0666 | root's, made here |
/// | `containers/<id>/etc/` | 0755 | mounted at `/etc/cuslice`: any user of the container reaches the quota file |
/// | `containers/<id>/etc/quota.toml` | 0444 | |
/// | `containers/<id>/container.json` | 0644 | |
/// | `ld.so.preload` | 0444 | |
/// | `hook.lock` | 0600 | the tenant check's lock ([`lock_root`]) |
///
/// The segments are world-writable files, but reached only through the
/// mounts of the containers they belong to: `--root` is root's alone.
fn make_segments(
    a: &HookArgs,
    id: &str,
    cfg: &config::Config,
    gpus: &[String],
) -> Result<(), String> {
    use crate::host::fs::set_file_mode;
    use std::os::fd::BorrowedFd;
    // SAFETY: a segment's descriptor, live while the segment is.
    let fd_of = |raw: i32| unsafe { BorrowedFd::borrow_raw(raw) };
    let root = Dir::keep_root(&a.root, 0o700)?;
    let gpu = root.keep_dir(GPU_DIR, 0o755)?;
    for uuid in gpus {
        if cfg.has_compute() {
            let p = gpu.join(format!("{uuid}.seg"));
            let seg =
                cuslice_core::gpu::GpuSegment::open_or_create(&p).map_err(|e| e.to_string())?;
            set_file_mode(fd_of(seg.raw_fd()), &p, 0o666)?;
        }
        if cfg.has_memory() {
            let p = gpu.join(format!("{uuid}.memory"));
            let pool = cuslice_core::pool::Pool::open_or_create(&p).map_err(|e| e.to_string())?;
            set_file_mode(fd_of(pool.raw_fd()), &p, 0o666)?;
        }
    }
    let dir = root.keep_dir(CONTAINERS_DIR, 0o700)?.keep_dir(id, 0o700)?;
    let seg = match &a.claim {
        // The plugin's directory for the claim (checked a plain name).
        Some(uid) => root
            .keep_dir(CLAIMS_DIR, 0o700)?
            .keep_dir(uid, 0o700)?
            .keep_dir(SEGMENT_DIR, 0o755)?,
        None => dir.keep_dir(SEGMENT_DIR, 0o755)?,
    };
    if cfg.has_memory() {
        let p = seg.join(MEMORY_SEGMENT);
        let s = cuslice_core::segment::Segment::open_or_create(&p).map_err(|e| e.to_string())?;
        set_file_mode(fd_of(s.raw_fd()), &p, 0o666)?;
    }
    Ok(())
}

/// The container's quota file and record, and the preload file (the files
/// of [`make_segments`]' table that are not segments).
fn write_records(a: &HookArgs, id: &str, quota: &str, meta: &ContainerMeta) -> Result<(), String> {
    let root = Dir::keep_root(&a.root, 0o700)?;
    let dir = root.keep_dir(CONTAINERS_DIR, 0o700)?.keep_dir(id, 0o700)?;
    // In a directory of its own, which is what is mounted (module
    // documentation). Read-only from its creation: written whole to a new
    // file of that mode, then renamed into place.
    dir.keep_dir(QUOTA_DIR, 0o755)?
        .replace_file(QUOTA_FILE, quota.as_bytes(), 0o444)?;
    // An older hook's quota file left in the directory (a container
    // created again under the same id without its poststop): the one in
    // the quota directory is the container's, and readers take that one
    // wherever the quota directory exists; removed, so that no other is
    // left to mistake for it.
    dir.remove(QUOTA_FILE)?;
    let text = serde_json::to_string(meta)
        .map_err(|e| format!("{}: {e}", dir.join(CONTAINER_RECORD).display()))?;
    dir.replace_file(CONTAINER_RECORD, (text + "\n").as_bytes(), 0o644)?;
    let want = format!("{}\n", "/usr/lib/cuslice/libcuslice.so");
    if !root.holds(PRELOAD_FILE, want.as_bytes(), 0o444) {
        // Renamed into place: a container that has it mounted keeps the
        // inode it has, never sees it empty.
        root.replace_file(PRELOAD_FILE, want.as_bytes(), 0o444)?;
    }
    Ok(())
}

fn cstr(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("{}: path contains NUL", p.display()))
}

/// One bind mount the hook makes into the container.
struct Bind {
    /// On the host: the hook's own files under `--root` (the layout's), or
    /// the library.
    src: PathBuf,
    /// Whether `src` is the library, opened by its path with a symlink
    /// there followed (an administrator may install it as a link). The
    /// hook's own files are opened through the layer instead: from
    /// `--root`, every component below it without following a link.
    follow_src: bool,
    /// Inside the container.
    dst: &'static str,
    kind: Kind,
    ro: bool,
}

fn binds(a: &HookArgs, id: &str) -> [Bind; 5] {
    let layout = Layout::new(&a.root);
    let ctr = layout.container(id);
    [
        // The quota file's directory, not the file: a resize renames a
        // new file into it, which a mount of the file would not show.
        Bind {
            src: ctr.quota_dir(),
            follow_src: false,
            dst: config::CONTAINER_CONFIG_DIR,
            kind: Kind::Dir,
            ro: true,
        },
        Bind {
            src: match &a.claim {
                Some(uid) => layout.claim(uid).segment_dir(),
                None => ctr.segment_dir(),
            },
            follow_src: false,
            dst: config::CONTAINER_SEGMENT_DIR,
            kind: Kind::Dir,
            ro: false,
        },
        Bind {
            src: layout.gpu_dir(),
            follow_src: false,
            dst: config::CONTAINER_GPU_SEGMENT_DIR,
            kind: Kind::Dir,
            ro: false,
        },
        Bind {
            src: a.lib.clone(),
            follow_src: true,
            dst: "/usr/lib/cuslice/libcuslice.so",
            kind: Kind::File,
            ro: true,
        },
        Bind {
            src: layout.preload(),
            follow_src: false,
            dst: "/etc/ld.so.preload",
            kind: Kind::File,
            ro: true,
        },
    ]
}

/// `/proc/self/fd/N`: the path mount(2) resolves to what descriptor N
/// refers to (its mount and inode), whatever names lead there.
fn fd_path(fd: BorrowedFd) -> CString {
    // A decimal number never contains NUL.
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default()
}

fn mount(src: Option<&CString>, target: &CString, flags: libc::c_ulong) -> std::io::Result<()> {
    // SAFETY: mount(2) with NUL-terminated paths that outlive the call (or a
    // null source, which MS_REMOUNT ignores), no file system type and no
    // data.
    let r = unsafe {
        libc::mount(
            src.map_or(std::ptr::null(), |s| s.as_ptr()),
            target.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A host source, opened O_PATH and checked to be the kind its target
/// is: the library by its path (a link there followed: the
/// administrator's), the hook's own files through the layer, from `root`
/// (`--root`, the administrator's path) with no link followed below it,
/// the last component included. Opened in the container's mount namespace
/// (a bind mount's source must be of the caller's).
fn open_source(b: &Bind, root: &Path) -> Result<(OwnedFd, libc::stat), String> {
    let (fd, st) = if b.follow_src {
        let c = cstr(&b.src)?;
        // SAFETY: `c` is NUL-terminated and outlives the call.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "host path {}: {}",
                b.src.display(),
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: open just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st =
            inroot::fstat(fd.as_fd()).map_err(|e| format!("host path {}: {e}", b.src.display()))?;
        (fd, st)
    } else {
        let rel = b.src.strip_prefix(root).map_err(|_| {
            format!(
                "host path {}: not under the hook's root {}",
                b.src.display(),
                root.display()
            )
        })?;
        Dir::open(root)
            .and_then(|r| r.open_path_beneath(rel))
            .map_err(|e| format!("host path {e}"))?
    };
    if !b.kind.matches(st.st_mode) {
        return Err(format!(
            "host path {} is {}, expected {}",
            b.src.display(),
            inroot::type_name(st.st_mode),
            b.kind.expected()
        ));
    }
    Ok((fd, st))
}

/// Makes the mounts, in the container's mount namespace (run in the child
/// after setns). Every path in the container is opened (and created where
/// missing) through `inroot`, following no symlink, and every source and
/// target is checked before anything is mounted: an image the hook refuses
/// gets no mount at all, and nothing is created outside its root.
fn mount_all(
    rootfs: &Path,
    host_root: &Path,
    binds: &[Bind],
    user: &inroot::User,
) -> Result<(), String> {
    let root = inroot::open_root(rootfs)?;
    let mut opened = Vec::with_capacity(binds.len());
    for b in binds {
        let (src, src_st) = open_source(b, host_root)?;
        let dst = inroot::open(root.as_fd(), b.dst, b.kind, true)?;
        opened.push((b, src, src_st, dst));
    }
    // The container's user must reach each of them, or the shim would not
    // load (ld.so skips an unreadable /etc/ld.so.preload without a word) or
    // not find its files: refused here, before anything is mounted.
    for (b, _, src_st, _) in &opened {
        inroot::check_search(root.as_fd(), b.dst, user)?;
        let want = match b.kind {
            Kind::File => inroot::R,
            Kind::Dir => inroot::X,
        };
        if !user.may(src_st, want) {
            return Err(inroot::denied(user, b.dst, src_st, want));
        }
    }
    for (b, src, src_st, dst) in &opened {
        // Mounted through the descriptors: the target is the inode the walk
        // checked, not whatever the name leads to by now.
        mount(
            Some(&fd_path(src.as_fd())),
            &fd_path(dst.as_fd()),
            libc::MS_BIND,
        )
        .map_err(|e| {
            format!(
                "cannot mount {} on container path {}: {e}",
                b.src.display(),
                b.dst
            )
        })?;
        if b.ro {
            remount_read_only(root.as_fd(), b, src_st)?;
        }
    }
    Ok(())
}

/// Makes the bind mount just made at `b.dst` read-only. The target's
/// descriptor still refers to the covered inode, on the mount below (the
/// container's root file system, say): a remount through it would act on
/// that mount, not the new one. The path is walked again (no symlink
/// followed) to the new mount's top, which must be the source's inode.
fn remount_read_only(root: BorrowedFd, b: &Bind, src_st: &libc::stat) -> Result<(), String> {
    let top = inroot::open(root, b.dst, b.kind, false)?;
    let st = inroot::fstat(top.as_fd())
        .map_err(|e| format!("container path {}: cannot stat it: {e}", b.dst))?;
    if (st.st_dev, st.st_ino) != (src_st.st_dev, src_st.st_ino) {
        return Err(format!(
            "container path {} is not {} after mounting it there: refusing to remount it read-only",
            b.dst,
            b.src.display()
        ));
    }
    let flags =
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    mount(None, &fd_path(top.as_fd()), flags)
        .map_err(|e| format!("cannot make container path {} read-only: {e}", b.dst))?;
    // What the container will see through that name must now be read-only.
    // SAFETY: an all-zero `statvfs` is a valid value of this plain C struct;
    // fstatvfs only writes into it.
    let mut vfs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `top` is a live descriptor, `vfs` a writable statvfs.
    let r = unsafe { libc::fstatvfs(top.as_raw_fd(), &mut vfs) };
    if r != 0 || vfs.f_flag & libc::ST_RDONLY == 0 {
        return Err(format!(
            "container path {} is still writable after remounting it read-only",
            b.dst
        ));
    }
    Ok(())
}

fn mount_into(
    pid: i32,
    rootfs: &Path,
    a: &HookArgs,
    id: &str,
    user: &inroot::User,
) -> Result<(), String> {
    let binds = binds(a, id);
    let ns = format!("/proc/{pid}/ns/mnt");
    let nsc = CString::new(ns.clone()).map_err(|_| "bad pid".to_string())?;
    // SAFETY: open a namespace file.
    let fd = unsafe { libc::open(nsc.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!("{ns}: {}", std::io::Error::last_os_error()));
    }
    let (rd, wr) = {
        let mut p = [0i32; 2];
        // SAFETY: pipe into a 2-element array.
        if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(format!("pipe: {}", std::io::Error::last_os_error()));
        }
        (p[0], p[1])
    };
    // setns(CLONE_NEWNS) needs a single-threaded process: do it in a child.
    // SAFETY: fork; the hook has no other thread, so the child may
    // allocate; it only opens, creates and mounts (mount_all), reports on
    // the pipe and _exits, never returning into the caller.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if child == 0 {
        // SAFETY: setns on the namespace fd.
        let r = if unsafe { libc::setns(fd, libc::CLONE_NEWNS) } != 0 {
            Err(format!(
                "cannot enter the container's mount namespace: {}",
                std::io::Error::last_os_error()
            ))
        } else {
            mount_all(rootfs, &a.root, &binds, user)
        };
        let msg = r.err().unwrap_or_default();
        // SAFETY: write to the pipe, then leave without running destructors.
        unsafe {
            libc::write(wr, msg.as_ptr().cast(), msg.len());
            libc::_exit(if msg.is_empty() { 0 } else { 1 });
        }
    }
    // SAFETY: closing our copies of fds we own.
    unsafe {
        libc::close(wr);
        libc::close(fd);
    }
    let mut msg = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        // SAFETY: read into a local buffer.
        let n = unsafe { libc::read(rd, buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        msg.extend_from_slice(&buf[..n as usize]);
    }
    let mut status = 0;
    // SAFETY: reaping our child; closing our fd.
    unsafe {
        libc::waitpid(child, &mut status, 0);
        libc::close(rd);
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else if !msg.is_empty() {
        Err(String::from_utf8_lossy(&msg).into_owned())
    } else {
        Err(format!(
            "mounting into the container failed (status {status})"
        ))
    }
}

pub fn poststop(a: &HookArgs) -> Result<(), String> {
    let st = read_state()?;
    check_id(&st.id)?;
    // Its guarantee leaves the GPUs' pools: the quota file says whose
    // (read without following a link, root's file, bounded).
    let quota = Layout::new(&a.root)
        .open()
        .and_then(|r| r.open_dir(CONTAINERS_DIR))
        .and_then(|d| d.open_dir(&st.id))
        .and_then(|d| d.open_dir(QUOTA_DIR))
        .and_then(|d| d.read_file(QUOTA_FILE, 1 << 20));
    if let Ok(text) = quota
        && let Ok(cfg) = config::parse_file(Path::new(QUOTA_FILE), &text)
    {
        release_guarantee(&a.root, &st.id, &cfg);
    }
    remove_container(&Layout::new(&a.root), &st.id)
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_containers_cgroup_v2_directory_is_found_under_the_v2_mount() {
        let v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let hybrid = "25 24 0:22 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                      57 47 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        let cg = "4:memory:/x\n0::/system.slice/runc-abc.scope\n";
        assert_eq!(
            cgroup_v2_dir(cg, v2).as_deref(),
            Ok("/sys/fs/cgroup/system.slice/runc-abc.scope")
        );
        assert_eq!(
            cgroup_v2_dir(cg, hybrid).as_deref(),
            Ok("/sys/fs/cgroup/unified/system.slice/runc-abc.scope")
        );
        // No v2 mount; no v2 line; the root cgroup; a path not plain; a
        // v2 mount of a subtree (root not "/") is not the hierarchy's root.
        let v1 = "25 24 0:22 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert!(cgroup_v2_dir(cg, v1).unwrap_err().contains("no cgroup v2"));
        assert!(
            cgroup_v2_dir("4:memory:/x\n", v2)
                .unwrap_err()
                .contains("no cgroup v2")
        );
        assert!(
            cgroup_v2_dir("0::/\n", v2)
                .unwrap_err()
                .contains("root cgroup")
        );
        assert!(
            cgroup_v2_dir("0::/a/../b\n", v2)
                .unwrap_err()
                .contains("not a plain")
        );
        let sub = "30 23 0:26 /x /mnt/cg rw - cgroup2 cgroup2 rw\n";
        assert!(cgroup_v2_dir(cg, sub).unwrap_err().contains("no cgroup v2"));
    }
    use super::*;

    fn ann(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_containers_gpus_are_those_its_quota_names_else_its_device_nodes_else_all() {
        let u = |i: u8| format!("GPU-c511ce00-fa4e-4000-8000-0000000000{i:02x}");
        let host: Vec<HostGpu> = (0..3)
            .map(|i| (u32::from(i), u(i), Some(u32::from(i))))
            .collect();
        let idx = |v: Vec<&HostGpu>| v.iter().map(|g| g.0).collect::<Vec<_>>();
        let named = [config::parse_uuid(&u(2)).expect("uuid")];
        assert_eq!(idx(container_gpus(&named, &[0], &host)), [2]);
        assert_eq!(idx(container_gpus(&[], &[0, 1], &host)), [0, 1]);
        assert_eq!(idx(container_gpus(&[], &[], &host)), [0, 1, 2]);
        // A minor NVML does not tell: not matched by its device node.
        let unknown: Vec<HostGpu> = vec![(0, u(0), None)];
        assert!(container_gpus(&[], &[0], &unknown).is_empty());
        let devices: Vec<SpecDevice> = [
            "/dev/nvidia3",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia12",
            "/dev/nvidia",
        ]
        .iter()
        .map(|p| SpecDevice {
            path: p.to_string(),
        })
        .collect();
        assert_eq!(gpu_minors(&devices), [3, 12]);
    }

    #[test]
    fn an_unhealthy_gpu_is_refused_in_one_line_unless_allowed_a_degraded_one_warned() {
        use crate::host::health::view::GpuView;
        use crate::host::health::{Cause, Health, State};
        let gpu = |state: State, reason: &str| GpuView {
            index: 1,
            uuid: "GPU-x".into(),
            health: Health {
                state,
                cause: Some(Cause::Xid(79)),
                reason: Some(reason.into()),
                since_unix: 0.0,
                lost: false,
            },
            judged_by: "source",
            events: Some(true),
            ignored_xid: None,
        };
        let sick = gpu(State::Unhealthy, "XID 79: the GPU has fallen off the bus");
        let meh = gpu(State::Degraded, "XID 92: high single-bit ECC error rate");
        let ok = GpuView {
            health: Health::healthy(0.0),
            ..gpu(State::Healthy, "")
        };
        assert_eq!(
            health_verdict(&[&ok, &sick], false),
            Err("GPU 1 (GPU-x) is unhealthy since 1970-01-01T00:00:00Z: XID 79: the GPU has fallen off the bus: refusing to start the container on it (annotation cuslice.io/allow-unhealthy-gpu: \"true\" starts it anyway)".into())
        );
        assert_eq!(
            health_verdict(&[&sick], true),
            Ok(vec!["GPU 1 (GPU-x) is unhealthy since 1970-01-01T00:00:00Z: XID 79: the GPU has fallen off the bus; the container starts on it as its annotation cuslice.io/allow-unhealthy-gpu allows".into()])
        );
        assert_eq!(
            health_verdict(&[&meh, &ok], false),
            Ok(vec!["GPU 1 (GPU-x) is degraded since 1970-01-01T00:00:00Z: XID 92: high single-bit ECC error rate; the container starts on it".into()])
        );
        assert_eq!(health_verdict(&[&ok], false), Ok(vec![]));
        let ann =
            |v: &str| BTreeMap::from([(ALLOW_UNHEALTHY_ANNOTATION.to_string(), v.to_string())]);
        assert_eq!(allow_unhealthy(&BTreeMap::new()), Ok(false));
        assert_eq!(allow_unhealthy(&ann("true")), Ok(true));
        assert_eq!(allow_unhealthy(&ann(" false ")), Ok(false));
        assert!(
            allow_unhealthy(&ann("sure"))
                .expect_err("bad")
                .starts_with("annotation cuslice.io/allow-unhealthy-gpu=\"sure\": ")
        );
    }

    #[test]
    fn annotations_become_a_valid_quota_file() {
        let q = quota_from_annotations(
            "abc123",
            &ann(&[
                ("cuslice.io/memory", "4GiB"),
                ("cuslice.io/compute", "30%"),
                ("other", "x"),
            ]),
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert_eq!(c.all.memory, Some(4 << 30));
        assert_eq!(c.all.compute, Some(30));
        assert_eq!(c.tenant.as_deref(), Some("ctr-abc123"));
        // Its own slice: the container's, whatever tenant it is given.
        assert_eq!(c.slice.as_deref(), Some("ctr-abc123"));
        // Host GPUs 1 and 3 (as `--gpus device=1,3` gives them, CUDA's
        // 0 and 1 inside): the file names them by UUID.
        let q = quota_from_annotations_with(
            "x",
            &ann(&[("cuslice.io/memory", "1g"), ("cuslice.io/gpus", "1,3")]),
            &host_gpus,
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert!(c.by_index.is_empty(), "{q}");
        for i in [1, 3] {
            let u = config::parse_uuid(&host_uuid(i)).expect("uuid");
            assert_eq!(c.by_uuid.get(&u).and_then(|l| l.memory), Some(1 << 30));
        }
        assert_eq!(c.by_uuid.len(), 2);
        assert_eq!(c.all.memory, None);
        // An index the host lacks, or no NVML to map it, refuses the
        // container; UUIDs need no NVML.
        let gpus = |list: &str| ann(&[("cuslice.io/memory", "1g"), ("cuslice.io/gpus", list)]);
        assert_eq!(
            quota_from_annotations_with("x", &gpus("0,7"), &host_gpus),
            Err("annotation cuslice.io/gpus=\"0,7\": expected GPUs of this host, got \"7\" (5 GPUs listed by NVML)".to_string())
        );
        let other = "GPU-99999999-1111-2222-3333-444444444444";
        assert_eq!(
            quota_from_annotations_with("x", &gpus(other), &host_gpus),
            Err(format!(
                "annotation cuslice.io/gpus={other:?}: expected GPUs of this host, got {other:?} (5 GPUs listed by NVML)"
            ))
        );
        // Annotations that set no limit would give the container the
        // whole GPU: refused.
        for a in [
            ann(&[("cuslice.io/tenant", "team-a")]),
            ann(&[("cuslice.io/gpus", "0")]),
            ann(&[("cuslice.io/latency", "false")]),
        ] {
            assert!(
                quota_from_annotations_with("x", &a, &host_gpus)
                    .expect_err("no limit")
                    .starts_with("annotations: no limit among them"),
                "{a:?}"
            );
        }
        let no_nvml = || Err("libnvidia-ml.so.1: not found".to_string());
        assert_eq!(
            quota_from_annotations_with("x", &gpus("1"), &no_nvml),
            Err("annotation cuslice.io/gpus=\"1\": cannot find the UUID of host GPU 1 through NVML (libnvidia-ml.so.1: not found); give UUIDs instead".to_string())
        );
        assert!(quota_from_annotations_with("x", &gpus(&host_uuid(2)), &no_nvml).is_ok());
        // The same GPU by index and by UUID is the same GPU twice.
        let both = format!("2,{}", host_uuid(2).to_uppercase().replace("GPU-", "gpu-"));
        assert!(
            quota_from_annotations_with("x", &gpus(&both), &host_gpus)
                .expect_err("twice")
                .ends_with("twice"),
        );
        assert_eq!(
            quota_from_annotations("x", &ann(&[("io.kubernetes.pod", "p")])),
            Ok(None)
        );
        let q = quota_from_annotations(
            "x",
            &ann(&[
                ("cuslice.io/compute-max", "40"),
                ("cuslice.io/compute-burst-ms", "500ms"),
            ]),
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert_eq!(c.compute_burst_ms, Some(500));
        assert_eq!(c.all.compute_max, Some(40));
        for (v, want) in [
            ("true", true),
            ("1", true),
            ("false", false),
            ("off", false),
        ] {
            let q = quota_from_annotations(
                "x",
                &ann(&[("cuslice.io/compute", "50"), ("cuslice.io/latency", v)]),
            )
            .expect("ok")
            .expect("some");
            let c = config::parse_file(Path::new("q"), &q).expect("parses");
            assert_eq!(c.latency, want, "{v}");
        }
    }

    /// `memory-max` (what a container may burst to past its guarantee)
    /// and `memory-wait` (how long a refused allocation waits for a free)
    /// reach the quota file as the shim reads them; a value out of range
    /// is refused in one line naming the annotation.
    #[test]
    fn memory_max_and_memory_wait_annotations_reach_the_quota_file() {
        let q = quota_from_annotations(
            "x",
            &ann(&[
                ("cuslice.io/memory", "1GiB"),
                ("cuslice.io/memory-max", "3GiB"),
                ("cuslice.io/memory-wait", "30s"),
            ]),
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert_eq!(
            (c.all.memory, c.all.memory_max),
            (Some(1 << 30), Some(3 << 30))
        );
        assert_eq!(c.memory_wait_ms, Some(30_000));
        // Per GPU, as the other limits: the burst with the guarantee.
        let q = quota_from_annotations_with(
            "x",
            &ann(&[
                ("cuslice.io/memory", "2g"),
                ("cuslice.io/memory-max", "2g"),
                ("cuslice.io/memory-wait", "0"),
                ("cuslice.io/gpus", "1"),
            ]),
            &host_gpus,
        )
        .expect("ok")
        .expect("some");
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        let host1 = config::parse_uuid(&host_uuid(1)).expect("uuid");
        let l = c.by_uuid.get(&host1).expect("gpu 1");
        assert_eq!((l.memory, l.memory_max), (Some(2 << 30), Some(2 << 30)));
        assert_eq!(c.memory_wait_ms, Some(0));
        for (kv, want) in [
            (
                [
                    ("cuslice.io/memory", "2GiB"),
                    ("cuslice.io/memory-max", "1GiB"),
                ],
                "annotation cuslice.io/memory-max=\"1GiB\": expected from cuslice.io/memory (the guarantee) to 1PiB",
            ),
            (
                [
                    ("cuslice.io/memory", "2GiB"),
                    ("cuslice.io/memory-max", "2PiB"),
                ],
                "annotation cuslice.io/memory-max=\"2PiB\": expected from cuslice.io/memory (the guarantee) to 1PiB",
            ),
            (
                [
                    ("cuslice.io/memory", "2GiB"),
                    ("cuslice.io/memory-max", "lots"),
                ],
                "annotation cuslice.io/memory-max=\"lots\": expected a size",
            ),
            (
                [
                    ("cuslice.io/memory", "2GiB"),
                    ("cuslice.io/memory-wait", "2h"),
                ],
                "annotation cuslice.io/memory-wait=\"2h\": expected a duration like \"30s\", \"500ms\" or \"2m\" (whole numbers, at most 1h)",
            ),
            (
                [
                    ("cuslice.io/memory", "2GiB"),
                    ("cuslice.io/memory-wait", "1.5s"),
                ],
                "annotation cuslice.io/memory-wait=\"1.5s\": expected a duration",
            ),
            (
                [
                    ("cuslice.io/memory", "2GiB"),
                    ("cuslice.io/memory-wiat", "1s"),
                ],
                "annotation cuslice.io/memory-wiat: unknown",
            ),
        ] {
            let e = quota_from_annotations("x", &ann(&kv)).expect_err("must fail");
            assert!(e.starts_with(want) && !e.contains('\n'), "{e}");
        }
    }

    /// A host's GPUs as NVML lists them: indices 0-3.
    fn host_uuid(i: u32) -> String {
        format!("GPU-0000000{i}-1111-2222-3333-444444444444")
    }

    fn host_gpus() -> Result<Vec<(u32, String)>, String> {
        let mut l: Vec<(u32, String)> = (0..4).map(|i| (i, host_uuid(i))).collect();
        l.push((4, "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b".to_string()));
        Ok(l)
    }

    #[test]
    fn the_quota_file_is_toml_whatever_the_values() {
        let q = quota_from_annotations_with(
            "abc",
            &ann(&[
                ("cuslice.io/memory", "2g"),
                ("cuslice.io/compute-max", "60"),
                ("cuslice.io/compute-burst-ms", "50"),
                ("cuslice.io/latency", "on"),
                (
                    "cuslice.io/gpus",
                    "0, GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b",
                ),
                ("cuslice.io/tenant", "team-a/svc"),
            ]),
            &host_gpus,
        )
        .expect("ok")
        .expect("some");
        assert!(q.starts_with("# written by `cuslice oci-hook` for container abc\n"));
        let c = config::parse_file(Path::new("q"), &q).expect("parses");
        assert_eq!(c.tenant.as_deref(), Some("team-a/svc"));
        assert_eq!(c.segment_dir, Path::new("/run/cuslice/segment"));
        assert_eq!(c.gpu_segment_dir, Path::new("/run/cuslice/gpu"));
        assert_eq!((c.compute_burst_ms, c.latency), (Some(50), true));
        let l = config::Limits {
            memory: Some(2 << 30),
            memory_max: None,
            compute: None,
            compute_max: Some(60),
        };
        let host0 = config::parse_uuid(&host_uuid(0)).expect("uuid");
        assert_eq!(c.by_uuid.get(&host0), Some(&l));
        let uuid = config::parse_uuid("GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b").expect("uuid");
        assert_eq!(c.by_uuid.get(&uuid), Some(&l));
        assert!(c.all.is_empty());
        // A tenant name reaches the shim's validation as it was written
        // (quotes and escapes included), and is refused there.
        for t in ["a\"b", "a\\b", "a\u{1b}b"] {
            let e = quota_from_annotations("x", &ann(&[("cuslice.io/tenant", t)]))
                .expect_err("not a tenant name");
            assert!(
                e.starts_with(&format!(
                    "annotations: tenant: expected 1 to 56 characters of A-Z a-z 0-9 . _ / -, got {t:?}"
                )),
                "{e}"
            );
        }
        let e = quota_from_annotations_with(
            "x",
            &ann(&[("cuslice.io/memory", "1g"), ("cuslice.io/gpus", "1, 2,1")]),
            &host_gpus,
        )
        .expect_err("twice");
        assert_eq!(
            e,
            "annotation cuslice.io/gpus=\"1, 2,1\": expected each GPU once, got \"1\" twice"
        );
    }

    /// Every container has a slice of its own, ids of any length
    /// included.
    #[test]
    fn a_containers_slice_is_its_id() {
        let ann = ann(&[("cuslice.io/compute", "10"), ("cuslice.io/tenant", "t")]);
        let slice_of = |id: &str| {
            let q = quota_from_annotations(id, &ann).expect("ok").expect("some");
            config::parse_file(Path::new("q"), &q)
                .expect("parses")
                .slice
                .expect("a slice")
        };
        let hex = "3f2a9c8b7d6e5f4a3b2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a";
        assert_eq!(slice_of(hex), format!("ctr-{hex}"));
        let long = |c: char| format!("{}{c}", "x".repeat(127));
        let (a, b) = (slice_of(&long('a')), slice_of(&long('b')));
        assert!(a.len() <= 128 && b.len() <= 128 && a != b, "{a} {b}");
        assert!(a.starts_with("ctr-xxxx"), "{a}");
    }

    /// The tenant name a container asks for is taken by a live container
    /// (its recorded init runs) or a DRA claim; not by a record whose init
    /// is gone, by a container of a claim (the claim holds it), nor by the
    /// container itself.
    #[test]
    fn a_tenant_name_is_held_by_live_containers_and_claims() {
        let t = std::env::temp_dir().join(format!("cuslice-oci-tenant-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let record = |id: &str, tenant: &str, init: u32, claim: Option<&str>| {
            let d = t.join("containers").join(id);
            std::fs::create_dir_all(d.join("etc")).expect("mkdir");
            std::fs::write(
                d.join("etc/quota.toml"),
                format!("tenant = \"{tenant}\"\n[all]\ncompute = 10\n"),
            )
            .expect("quota");
            let m = ContainerMeta {
                id: id.into(),
                init_pid: Some(init),
                init_start: Some(1),
                claim: claim.map(str::to_string),
                ..ContainerMeta::default()
            };
            std::fs::write(
                d.join(CONTAINER_RECORD),
                serde_json::to_string(&m).expect("json"),
            )
            .expect("record");
        };
        // Init 1 runs, init 2 is gone.
        let alive = |init: Option<(u32, u64)>| init.is_none_or(|(pid, _)| pid == 1);
        let holder = |own: &str, tenant: &str| tenant_holder(&t, own, tenant, &alive);
        assert_eq!(holder("new", "team-a"), None, "no root yet");
        record("live", "team-a", 1, None);
        record("gone", "team-b", 2, None);
        record("member", "team-c", 1, Some("uid-1"));
        assert_eq!(holder("new", "team-a").as_deref(), Some("container live"));
        assert_eq!(holder("live", "team-a"), None, "its own record");
        assert_eq!(holder("new", "team-b"), None, "a record left behind");
        assert_eq!(holder("new", "team-c"), None, "a claim's container");
        let claim = t.join("claims/uid-1");
        std::fs::create_dir_all(&claim).expect("mkdir");
        std::fs::write(
            claim.join("quota.toml"),
            "tenant = \"team-c\"\n[all]\ncompute = 10\n",
        )
        .expect("quota");
        assert_eq!(holder("new", "team-c").as_deref(), Some("DRA claim uid-1"));
        std::fs::write(
            claim.join("claim.json"),
            r#"{"namespace": "ns", "name": "train\u001b[2J", "uid": "uid-1"}"#,
        )
        .expect("record");
        assert_eq!(
            holder("new", "team-c").as_deref(),
            Some("DRA claim ns/train\\x1b[2J (uid-1)")
        );
        // A record without an init (an older hook's) is taken as live; its
        // quota file is where that hook put it.
        let d = t.join("containers/old");
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("quota.toml"),
            "tenant = \"team-d\"\n[all]\ncompute = 10\n",
        )
        .expect("quota");
        std::fs::write(d.join(CONTAINER_RECORD), r#"{"id": "old"}"#).expect("record");
        assert_eq!(holder("new", "team-d").as_deref(), Some("container old"));
        // The lock: made root's, 0600, in the root; held until dropped.
        let l = lock_root(&t).expect("lock");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(t.join(LOCK_FILE))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o600);
        let other = std::fs::File::open(t.join(LOCK_FILE)).expect("open");
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor we hold.
        let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, -1, "a second lock while the first is held");
        drop(l);
        // SAFETY: as above.
        let r = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(r, 0, "free once dropped");
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn a_claim_gives_its_quota_file_and_segment_directory() {
        let t = std::env::temp_dir().join(format!("cuslice-oci-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let claim = t.join("claims").join("uid-1");
        std::fs::create_dir_all(claim.join("segment")).expect("mkdir");
        let q = "tenant = \"team-a/train\"\n[device.\"GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\nmemory = 1073741824\ncompute = 30\n";
        std::fs::write(claim.join("quota.toml"), q).expect("write");
        let (text, path) = claim_quota(&t, "uid-1").expect("read");
        assert_eq!((text.as_str(), path), (q, claim.join("quota.toml")));
        let a = HookArgs {
            root: t.clone(),
            lib: PathBuf::from(DEFAULT_LIB),
            claim: Some("uid-1".into()),
        };
        let b = binds(&a, "ctr");
        // The container's copy, in its quota directory (mounted whole).
        assert_eq!(
            (b[0].src.as_path(), b[0].dst, b[0].kind, b[0].ro),
            (
                t.join("containers/ctr/etc").as_path(),
                "/etc/cuslice",
                Kind::Dir,
                true
            )
        );
        assert_eq!(
            (b[1].src.as_path(), b[1].dst),
            (claim.join("segment").as_path(), "/run/cuslice/segment")
        );
        // Not a plain name, missing, a link, no limit, invalid: refused.
        for bad in ["../x", "", ".x", "a/b"] {
            let e = claim_quota(&t, bad).expect_err("not a name");
            assert!(
                e.starts_with("claim ") && e.ends_with("is not a plain name"),
                "{e}"
            );
        }
        let e = claim_quota(&t, "uid-2").expect_err("missing");
        assert!(e.contains("claims/uid-2: cannot open the directory"), "{e}");
        std::fs::create_dir_all(t.join("claims/uid-3")).expect("mkdir");
        std::os::unix::fs::symlink(claim.join("quota.toml"), t.join("claims/uid-3/quota.toml"))
            .expect("link");
        let e = claim_quota(&t, "uid-3").expect_err("a link");
        assert!(e.contains("uid-3/quota.toml: cannot open the file"), "{e}");
        std::fs::create_dir_all(t.join("claims/uid-4")).expect("mkdir");
        std::fs::write(t.join("claims/uid-4/quota.toml"), "tenant = \"x\"\n").expect("write");
        let e = claim_quota(&t, "uid-4").expect_err("unlimited");
        assert!(
            e.ends_with("no limit in it: refusing to give the claim's container an unlimited GPU"),
            "{e}"
        );
        std::fs::write(t.join("claims/uid-4/quota.toml"), "[all]\ncompute = 130\n").expect("write");
        let e = claim_quota(&t, "uid-4").expect_err("invalid");
        assert!(e.contains("uid-4/quota.toml: all.compute: "), "{e}");
        let _ = std::fs::remove_dir_all(&t);
    }

    /// The bind mounts' sources under `--root` are opened from the root
    /// through the host file layer: a link anywhere below the root (not
    /// only as the last component) is refused, never followed; and a
    /// container's directory is removed without following what its tenant
    /// left in its segment directory.
    #[test]
    fn mount_sources_below_the_root_are_opened_without_following_a_link() {
        let t = std::env::temp_dir().join(format!("cuslice-oci-sources-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let root = t.join("root");
        std::fs::create_dir_all(root.join("containers/ctr/segment")).expect("mkdir");
        std::fs::create_dir_all(root.join("containers/ctr/etc")).expect("mkdir");
        std::fs::create_dir_all(root.join("gpu")).expect("mkdir");
        std::fs::write(root.join("containers/ctr/etc/quota.toml"), "x").expect("write");
        std::fs::write(root.join("ld.so.preload"), "x").expect("write");
        let a = HookArgs {
            root: root.clone(),
            lib: PathBuf::from(DEFAULT_LIB),
            claim: None,
        };
        let b = binds(&a, "ctr");
        for i in [0, 1, 2, 4] {
            open_source(&b[i], &root).unwrap_or_else(|e| panic!("{}: {e}", b[i].dst));
        }
        // `containers` a link to a tree of the same shape elsewhere.
        let elsewhere = t.join("elsewhere");
        std::fs::create_dir_all(elsewhere.join("ctr/segment")).expect("mkdir");
        std::fs::create_dir_all(elsewhere.join("ctr/etc")).expect("mkdir");
        std::fs::write(elsewhere.join("ctr/etc/quota.toml"), "y").expect("write");
        std::fs::rename(root.join("containers"), t.join("moved")).expect("mv");
        std::os::unix::fs::symlink(&elsewhere, root.join("containers")).expect("link");
        let e = open_source(&b[0], &root).expect_err("a link on the way");
        assert_eq!(
            e,
            format!(
                "host path {}: expected a directory, got a symlink",
                root.join("containers").display()
            )
        );
        assert!(open_source(&b[1], &root).is_err());
        std::fs::remove_file(root.join("containers")).expect("rm");
        std::fs::rename(t.join("moved"), root.join("containers")).expect("mv");
        // The last component a link: described, refused.
        std::fs::remove_dir(root.join("gpu")).expect("rmdir");
        std::os::unix::fs::symlink(&elsewhere, root.join("gpu")).expect("link");
        let e = open_source(&b[2], &root).expect_err("a link");
        assert_eq!(
            e,
            format!(
                "host path {} is a symlink, expected a directory",
                root.join("gpu").display()
            )
        );
        // What the container left in its segment directory goes with it;
        // what its links point to stays.
        std::os::unix::fs::symlink(&elsewhere, root.join("containers/ctr/segment/out"))
            .expect("link");
        remove_container(&Layout::new(&root), "ctr").expect("removed");
        assert!(!root.join("containers/ctr").exists());
        assert_eq!(
            std::fs::read_to_string(elsewhere.join("ctr/etc/quota.toml")).expect("kept"),
            "y"
        );
        remove_container(&Layout::new(&root), "ctr").expect("again: nothing to do");
        remove_container(&Layout::new(t.join("nowhere")), "ctr").expect("no root");
        let _ = std::fs::remove_dir_all(&t);
    }

    #[test]
    fn containers_that_would_not_be_host_root_are_refused() {
        let linux = |v: serde_json::Value| -> SpecLinux {
            serde_json::from_value(v).expect("linux section")
        };
        let plain = linux(serde_json::json!({"namespaces": [{"type": "pid"}, {"type": "mount"}]}));
        assert_eq!(check_user_namespaces(None, &plain), Ok(()));
        assert_eq!(check_user_namespaces(None, &SpecLinux::default()), Ok(()));
        let e = check_user_namespaces(Some("1001".into()), &plain).expect_err("rootless");
        assert!(
            e.starts_with("the runtime is rootless (this hook runs in a user namespace, as host uid 1001): cuslice needs a rootful runtime"),
            "{e}"
        );
        let userns = linux(serde_json::json!({
            "namespaces": [{"type": "user"}],
            "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
        }));
        let e = check_user_namespaces(None, &userns).expect_err("userns");
        assert!(
            e.starts_with(
                "the container has its own user namespace (its uid 0 is host uid 100000): "
            ),
            "{e}"
        );
        assert!(!e.contains('\n'));
        // This process runs outside any user namespace (the tests run as
        // the host's root or a plain user, not in a container's).
        if std::fs::read_to_string("/proc/self/uid_map")
            .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
        {
            assert_eq!(own_user_namespace(), None);
        }
    }

    #[test]
    fn the_container_record_takes_what_runtimes_annotate() {
        let args = vec!["python3".to_string(), "train.py".to_string()];
        let m = container_meta("abc", &ann(&[("cuslice.io/memory", "1g")]), &args);
        assert_eq!(
            m,
            ContainerMeta {
                id: "abc".into(),
                command: args.clone(),
                ..ContainerMeta::default()
            }
        );
        let m = container_meta(
            "abc",
            &ann(&[
                ("io.kubernetes.cri.container-name", "trainer"),
                ("io.kubernetes.cri.sandbox-namespace", "team-a"),
                ("io.kubernetes.cri.sandbox-name", "train-0"),
                (
                    "io.kubernetes.cri.image-name",
                    "docker.io/pytorch/pytorch:2.3",
                ),
            ]),
            &args,
        );
        assert_eq!(m.name.as_deref(), Some("trainer"));
        assert_eq!(m.pod.as_deref(), Some("team-a/train-0"));
        assert_eq!(m.image.as_deref(), Some("docker.io/pytorch/pytorch:2.3"));
        // CRI-O's names.
        let m = container_meta(
            "abc",
            &ann(&[
                ("io.kubernetes.container.name", "svc"),
                ("io.kubernetes.pod.namespace", "default"),
                ("io.kubernetes.pod.name", "svc-7"),
                ("io.kubernetes.cri-o.ImageName", "vllm/vllm-openai:latest"),
            ]),
            &[],
        );
        assert_eq!(
            (m.name.as_deref(), m.pod.as_deref(), m.image.as_deref()),
            (
                Some("svc"),
                Some("default/svc-7"),
                Some("vllm/vllm-openai:latest")
            )
        );
        // What is absent is left out of the file.
        let text = serde_json::to_string(&container_meta("x", &ann(&[]), &[])).expect("json");
        assert_eq!(text, r#"{"id":"x"}"#);
    }

    #[test]
    fn bad_annotations_name_themselves() {
        for (kv, want) in [
            (
                ("cuslice.io/memory", "4 potatoes"),
                "annotation cuslice.io/memory=\"4 potatoes\": expected a size",
            ),
            (
                ("cuslice.io/compute", "130"),
                "annotation cuslice.io/compute=\"130\": expected a percentage",
            ),
            (
                ("cuslice.io/gpus", "zero"),
                "annotation cuslice.io/gpus=\"zero\": expected all, or GPU indices",
            ),
            (
                ("cuslice.io/memroy", "4g"),
                "annotation cuslice.io/memroy: unknown",
            ),
            (
                ("cuslice.io/compute-burst-ms", "0"),
                "annotation cuslice.io/compute-burst-ms=\"0\": expected whole milliseconds from 1 to 10000",
            ),
            (
                ("cuslice.io/latency", "maybe"),
                "annotation cuslice.io/latency=\"maybe\": expected 1, true, yes, on or 0, false, no, off",
            ),
            (
                ("cuslice.io/latency", "true"),
                "annotation cuslice.io/latency: only applies with cuslice.io/compute or cuslice.io/compute-max",
            ),
            (
                ("cuslice.io/compute-burst-ms", "300"),
                "annotation cuslice.io/compute-burst-ms=\"300\": only applies with cuslice.io/compute-max",
            ),
            (
                ("cuslice.io/memory-max", "3GiB"),
                "annotation cuslice.io/memory-max=\"3GiB\": only applies with cuslice.io/memory",
            ),
            (
                ("cuslice.io/memory-wait", "30s"),
                "annotation cuslice.io/memory-wait=\"30s\": only applies with cuslice.io/memory",
            ),
        ] {
            let e = quota_from_annotations("x", &ann(&[kv])).expect_err("must fail");
            assert!(e.starts_with(want), "{e}");
        }
        assert!(check_id("../etc").is_err());
    }
}
