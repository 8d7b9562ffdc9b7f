//! The container's annotations: the `cuslice.io/*` ones turned into its
//! quota file ([`quota_from_annotations`], validated as the shim loads
//! it), its slice (`ctr-<id>`), the annotation that allows an unhealthy
//! GPU; and the runtimes' own, for the record's name, pod and image.

use super::*;

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

pub(super) fn container_meta(
    id: &str,
    ann: &BTreeMap<String, String>,
    args: &[String],
) -> ContainerMeta {
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

/// The quota file's `slice` for container `id`: `ctr-<id>`, unique per
/// container (an id is a plain name of at most 128 characters; one too
/// long for a slice keeps its first 107 and a hash of the whole).
pub(super) fn container_slice(id: &str) -> String {
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

pub(super) fn check_id(id: &str) -> Result<(), String> {
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
        let gpus = cuslice_host::gpu::nvml::Nvml::open().and_then(|n| n.gpus())?;
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

/// The annotation naming a container's tenant.
pub(super) const TENANT_ANNOTATION: &str = "cuslice.io/tenant";

/// The annotation that starts a container on a GPU whose health is
/// unhealthy (docs/containers.md).
pub(super) const ALLOW_UNHEALTHY_ANNOTATION: &str = "cuslice.io/allow-unhealthy-gpu";

/// Whether the container's annotations allow an unhealthy GPU (`true`;
/// absent or `false`: not). Read for claims' containers too.
pub(super) fn allow_unhealthy(ann: &BTreeMap<String, String>) -> Result<bool, String> {
    match ann.get(ALLOW_UNHEALTHY_ANNOTATION).map(|v| v.trim()) {
        None => Ok(false),
        Some(v) => config::parse_switch(v)
            .map_err(|e| format!("annotation {ALLOW_UNHEALTHY_ANNOTATION}={v:?}: {e}")),
    }
}
