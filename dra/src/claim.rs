//! A claim's allocation as this plugin needs it, and the quota file it
//! becomes. No transport, no API types: [`crate::api`] turns a
//! ResourceClaim into an [`Allocation`], [`crate::node`] writes the result.
//!
//! For each claim: exactly one device of this driver (one GPU slice per
//! claim, for now), its consumed capacity `memory` (bytes, at most the
//! GPU's) and `compute` (1-100, the guaranteed share of GPU time), and the
//! opaque configuration of this driver that applies to its request:
//!
//! ```json
//! {"apiVersion": "gpu.cuslice.io/v1alpha1", "kind": "SliceConfig",
//!  "computeMax": 60, "latency": true, "burstMs": 200,
//!  "memoryMax": "60Gi", "memoryWait": "30s"}
//! ```
//!
//! all optional (`computeMax`: ceiling 1-100, not below `compute`;
//! `latency`: the latency class; `burstMs`: 1-10000, only with
//! `computeMax`; see docs/compute-share.md; `memoryMax`: a quantity, not
//! below the claim's `memory`, which stays its guarantee: what it may use
//! while memory no tenant is guaranteed is free; `memoryWait`: how long a
//! refused allocation waits, as the quota file's `memory_wait`; see
//! docs/memory-quota.md), any other key an error.
//! Configurations from the class come first, the claim's override them
//! key by key. The quota file is built with `cuslice_core::config::QuotaFile`
//! and checked with `cuslice_core::config::parse_file`, the shim's own
//! reader: a claim the shim would refuse is refused here, and one without
//! limits never passes.

use std::collections::BTreeMap;
use std::path::Path;

use cuslice_core::config;
use serde::Deserialize;

use crate::gpus::Gpu;

/// The opaque configuration's `apiVersion` and `kind`, where given.
pub const CONFIG_API_VERSION: &str = "gpu.cuslice.io/v1alpha1";
pub const CONFIG_KIND: &str = "SliceConfig";

/// A ResourceClaim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl ClaimRef {
    /// `namespace/name`, for messages.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// One allocated device (`status.allocation.devices.results[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocatedDevice {
    pub request: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    /// `consumedCapacity`: capacity name -> quantity as written.
    pub consumed: BTreeMap<String, String>,
}

/// One opaque configuration (`status.allocation.devices.config[]`).
#[derive(Debug, Clone, PartialEq)]
pub struct OpaqueConfig {
    /// `FromClass` or `FromClaim`.
    pub source: String,
    /// The requests it applies to (empty: all).
    pub requests: Vec<String>,
    pub driver: String,
    pub parameters: serde_json::Value,
}

/// A claim's allocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Allocation {
    pub devices: Vec<AllocatedDevice>,
    pub config: Vec<OpaqueConfig>,
    /// The pods the claim is reserved for (`status.reservedFor`), as
    /// `namespace/name`: what `cuslice status` names the claim's row by.
    pub pods: Vec<String>,
}

/// What the plugin serves: its driver name and the pool (the node's name)
/// its devices are in.
#[derive(Debug, Clone)]
pub struct Driver {
    pub name: String,
    pub pool: String,
}

/// The opaque parameters of this driver.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Params {
    api_version: Option<String>,
    kind: Option<String>,
    compute_max: Option<i64>,
    latency: Option<bool>,
    burst_ms: Option<i64>,
    memory_max: Option<String>,
    memory_wait: Option<String>,
}

/// The settings that apply to one device, all configurations merged.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub compute_max: Option<u8>,
    pub latency: bool,
    pub burst_ms: Option<u32>,
    pub memory_max: Option<u64>,
    pub memory_wait_ms: Option<u64>,
}

/// A claim, checked: its GPU and the quota file for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    pub device: AllocatedDevice,
    pub gpu: Gpu,
    /// The quota file's text (checked by the shim's reader).
    pub quota: String,
    pub memory: u64,
    pub compute: u8,
}

/// The main request of a result's `request` (`main` or `main/sub`).
pub fn base_request(request: &str) -> &str {
    request.split('/').next().unwrap_or(request)
}

/// Whether `request` (a result's `request`, `main` or `main/sub`) is one
/// of `requests` (a configuration's, naming `main` or `main/sub`).
fn applies(requests: &[String], request: &str) -> bool {
    let main = base_request(request);
    requests.is_empty() || requests.iter().any(|r| r == request || r == main)
}

/// The configurations of `driver` that apply to `request`, merged: the
/// class's first, the claim's over them, each key by key.
pub fn settings(config: &[OpaqueConfig], driver: &str, request: &str) -> Result<Settings, String> {
    let mut ours: Vec<&OpaqueConfig> = config
        .iter()
        .filter(|c| c.driver == driver && applies(&c.requests, request))
        .collect();
    // Stable: within a source, the order the API gives.
    ours.sort_by_key(|c| c.source != "FromClass");
    let mut s = Settings::default();
    for c in ours {
        let what = format!(
            "opaque config of driver {driver} ({})",
            if c.source.is_empty() { "?" } else { &c.source }
        );
        let p: Params =
            serde_json::from_value(c.parameters.clone()).map_err(|e| format!("{what}: {e}"))?;
        if let Some(v) = p.api_version
            && v != CONFIG_API_VERSION
        {
            return Err(format!(
                "{what}: apiVersion: expected {CONFIG_API_VERSION:?}, got {v:?}"
            ));
        }
        if let Some(k) = p.kind
            && k != CONFIG_KIND
        {
            return Err(format!("{what}: kind: expected {CONFIG_KIND:?}, got {k:?}"));
        }
        if let Some(m) = p.compute_max {
            s.compute_max = Some(
                u8::try_from(m)
                    .ok()
                    .filter(|m| (1..=100).contains(m))
                    .ok_or_else(|| format!("{what}: computeMax: expected 1 to 100, got {m}"))?,
            );
        }
        if let Some(l) = p.latency {
            s.latency = l;
        }
        if let Some(m) = &p.memory_max {
            let bytes = crate::quantity::parse_whole(m)
                .ok()
                .and_then(|b| u64::try_from(b).ok())
                .filter(|b| (config::MIN_MEMORY..=config::MAX_MEMORY).contains(b))
                .ok_or_else(|| {
                    format!("{what}: memoryMax: expected a quantity from 1Mi to 1Pi, got {m:?}")
                })?;
            s.memory_max = Some(bytes);
        }
        if let Some(w) = &p.memory_wait {
            s.memory_wait_ms =
                Some(config::parse_wait(w).map_err(|e| format!("{what}: memoryWait: {e}"))?);
        }
        if let Some(b) = p.burst_ms {
            s.burst_ms = Some(
                u32::try_from(b)
                    .ok()
                    .filter(|b| (1..=config::MAX_COMPUTE_BURST_MS).contains(b))
                    .ok_or_else(|| {
                        format!(
                            "{what}: burstMs: expected 1 to {}, got {b}",
                            config::MAX_COMPUTE_BURST_MS
                        )
                    })?,
            );
        }
    }
    if s.burst_ms.is_some() && s.compute_max.is_none() {
        return Err(format!(
            "opaque config of driver {driver}: burstMs only applies with computeMax (it shapes how a ceiling is enforced)"
        ));
    }
    Ok(s)
}

/// The one device of `driver` in `alloc`.
fn our_device<'a>(alloc: &'a Allocation, d: &Driver) -> Result<&'a AllocatedDevice, String> {
    let ours: Vec<&AllocatedDevice> = alloc
        .devices
        .iter()
        .filter(|x| x.driver == d.name)
        .collect();
    match ours[..] {
        [one] => Ok(one),
        [] => {
            let others: std::collections::BTreeSet<&str> =
                alloc.devices.iter().map(|x| x.driver.as_str()).collect();
            Err(if others.is_empty() {
                "the claim has no allocated device".to_string()
            } else {
                format!(
                    "the claim's allocation is not ours: no device of driver {}, only of {}",
                    d.name,
                    others.into_iter().collect::<Vec<_>>().join(", ")
                )
            })
        }
        _ => Err(format!(
            "{} devices of driver {} in one claim: cuslice gives one GPU slice per claim for now (ask for each GPU in a claim of its own)",
            ours.len(),
            d.name
        )),
    }
}

/// One consumed capacity as a whole number.
fn consumed(dev: &AllocatedDevice, name: &str) -> Result<u128, String> {
    let q = dev.consumed.get(name).ok_or_else(|| {
        format!(
            "device {} has no consumed capacity {name:?}: cuslice shares a GPU only by capacity (memory and compute), refusing to give it without limits",
            dev.device
        )
    })?;
    crate::quantity::parse_whole(q)
        .map_err(|e| format!("device {}: consumed capacity {name}: {e}", dev.device))
}

/// `tenant` for a claim: `namespace/name` where the shim accepts it (at
/// most [`config::TENANT_MAX_LEN`] characters), else `claim-<uid>` (cut to
/// fit; a Kubernetes UID is 36 characters).
fn tenant(c: &ClaimRef) -> String {
    let t = c.label();
    let ok = t.len() <= config::TENANT_MAX_LEN
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'));
    if ok {
        t
    } else {
        let room = config::TENANT_MAX_LEN - "claim-".len();
        format!("claim-{}", &c.uid[..c.uid.len().min(room)])
    }
}

/// Checks a claim's allocation against the node's GPUs and builds its
/// quota file. Every error is one line, for the kubelet.
pub fn slice(c: &ClaimRef, alloc: &Allocation, d: &Driver, gpus: &[Gpu]) -> Result<Slice, String> {
    let dev = our_device(alloc, d)?;
    if dev.pool != d.pool {
        return Err(format!(
            "device {} is allocated from pool {:?}, this node's is {:?}",
            dev.device, dev.pool, d.pool
        ));
    }
    let gpu = gpus
        .iter()
        .find(|g| g.device_name() == dev.device)
        .ok_or_else(|| {
            format!(
                "device {} is not on this node (its GPUs: {}): it vanished, or the allocation is stale",
                dev.device,
                gpus.iter().map(Gpu::device_name).collect::<Vec<_>>().join(", ")
            )
        })?;
    let uuid = config::parse_uuid(&gpu.uuid)
        .map_err(|e| format!("GPU {} UUID {:?}: {e}", gpu.index, gpu.uuid))?;
    let memory = consumed(dev, "memory")?;
    if memory > u128::from(gpu.memory) {
        return Err(format!(
            "device {}: the claim asks {} of memory, the GPU ({}) has {}",
            dev.device,
            config::format_size(u64::try_from(memory).unwrap_or(u64::MAX)),
            gpu.uuid,
            config::format_size(gpu.memory)
        ));
    }
    let compute = consumed(dev, "compute")?;
    let compute = u8::try_from(compute)
        .ok()
        .filter(|c| (1..=100).contains(c))
        .ok_or_else(|| {
            format!(
                "device {}: consumed capacity compute: expected 1 to 100, got {compute}",
                dev.device
            )
        })?;
    let s = settings(&alloc.config, &d.name, &dev.request)?;
    if let Some(m) = s.compute_max
        && m < compute
    {
        return Err(format!(
            "opaque config of driver {}: computeMax {m} is below the claim's compute {compute}",
            d.name
        ));
    }
    if let Some(m) = s.memory_max
        && u128::from(m) < memory
    {
        return Err(format!(
            "opaque config of driver {}: memoryMax {} is below the claim's memory {}",
            d.name,
            config::format_size(m),
            config::format_size(u64::try_from(memory).unwrap_or(u64::MAX))
        ));
    }
    let limits = config::Limits {
        memory: Some(u64::try_from(memory).unwrap_or(u64::MAX)),
        memory_max: s.memory_max,
        compute: Some(compute),
        compute_max: s.compute_max,
    };
    let file = config::QuotaFile {
        tenant: Some(tenant(c)),
        // The claim's own slice: its containers share one entry of the GPU
        // segment, which no other container or claim of the same tenant
        // name can change.
        slice: Some(format!("claim-{}", c.uid)),
        segment_dir: Some(config::CONTAINER_SEGMENT_DIR.into()),
        gpu_segment_dir: Some(config::CONTAINER_GPU_SEGMENT_DIR.into()),
        latency: s.latency,
        compute_burst_ms: s.burst_ms,
        memory_wait_ms: s.memory_wait_ms,
        by_uuid: [(uuid, limits)].into(),
        ..config::QuotaFile::default()
    };
    // The shim's reader is the judge: what it refuses, or a file that
    // would leave this GPU unlimited, is never handed out.
    let (quota, cfg) = file
        .render(
            &format!(
                "written by cuslice-dra-plugin for ResourceClaim {} (uid {})",
                c.label(),
                c.uid
            ),
            Path::new(cuslice_host::layout::QUOTA_FILE),
        )
        .map_err(|e| e.to_string())?;
    let l = cfg.by_uuid.get(&uuid).copied().unwrap_or_default();
    let want_mem = u64::try_from(memory).ok();
    if l.memory != want_mem || l.compute != Some(compute) {
        return Err(format!(
            "the quota file written for device {} does not hold its limits: refusing it",
            dev.device
        ));
    }
    Ok(Slice {
        device: dev.clone(),
        gpu: gpu.clone(),
        quota,
        memory: want_mem.unwrap_or(u64::MAX),
        compute,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn h200() -> Gpu {
        Gpu {
            index: 0,
            uuid: "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b".into(),
            memory: 141 << 30,
            minor: 0,
            product: "NVIDIA H200".into(),
            compute_capability: None,
        }
    }

    fn driver() -> Driver {
        Driver {
            name: "gpu.cuslice.io".into(),
            pool: "node-1".into(),
        }
    }

    fn claim() -> ClaimRef {
        ClaimRef {
            namespace: "team-a".into(),
            name: "trainer".into(),
            uid: "0b1c2d3e-0000-4000-8000-000000000001".into(),
        }
    }

    fn alloc(memory: &str, compute: &str, params: Option<serde_json::Value>) -> Allocation {
        Allocation {
            devices: vec![AllocatedDevice {
                request: "gpu".into(),
                driver: "gpu.cuslice.io".into(),
                pool: "node-1".into(),
                device: "gpu-0".into(),
                consumed: [("memory", memory), ("compute", compute)]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            }],
            config: params
                .into_iter()
                .map(|p| OpaqueConfig {
                    source: "FromClaim".into(),
                    requests: vec![],
                    driver: "gpu.cuslice.io".into(),
                    parameters: p,
                })
                .collect(),
            pods: vec![],
        }
    }

    #[test]
    fn consumed_capacity_becomes_the_gpus_limits() {
        let s = slice(&claim(), &alloc("40Gi", "50", None), &driver(), &[h200()]).expect("ok");
        assert_eq!((s.memory, s.compute), (40 << 30, 50));
        assert_eq!(
            s.quota,
            "# written by cuslice-dra-plugin for ResourceClaim team-a/trainer (uid 0b1c2d3e-0000-4000-8000-000000000001)\n\
             gpu_segment_dir = \"/run/cuslice/gpu\"\n\
             segment_dir = \"/run/cuslice/segment\"\n\
             slice = \"claim-0b1c2d3e-0000-4000-8000-000000000001\"\n\
             tenant = \"team-a/trainer\"\n\
             \n\
             [device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b]\n\
             compute = 50\n\
             memory = 42949672960\n"
        );
        let cfg = config::parse_file(Path::new("q"), &s.quota).expect("the shim reads it");
        let uuid = config::parse_uuid(&h200().uuid).expect("uuid");
        assert_eq!(
            cfg.limits_for(3, &uuid),
            config::Limits {
                memory: Some(40 << 30),
                memory_max: None,
                compute: Some(50),
                compute_max: None
            }
        );
        assert!(cfg.all.is_empty() && cfg.by_index.is_empty());
        assert!(!cfg.latency);
        // The opaque configuration: ceiling, latency class, burst.
        let p = serde_json::json!({"apiVersion": CONFIG_API_VERSION, "kind": CONFIG_KIND,
            "computeMax": 60, "latency": true, "burstMs": 100});
        let s = slice(&claim(), &alloc("16G", "20", Some(p)), &driver(), &[h200()]).expect("ok");
        let cfg = config::parse_file(Path::new("q"), &s.quota).expect("parses");
        assert_eq!(
            cfg.by_uuid.get(&uuid),
            Some(&config::Limits {
                memory: Some(16_000_000_000),
                memory_max: None,
                compute: Some(20),
                compute_max: Some(60)
            })
        );
        assert!(cfg.latency);
        assert_eq!(cfg.compute_burst_ms, Some(100));
        // A name the shim would not take as a tenant (over 56 characters):
        // the uid instead.
        let mut c = claim();
        c.name = "x".repeat(57 - "team-a/".len());
        let s = slice(&c, &alloc("1Gi", "1", None), &driver(), &[h200()]).expect("ok");
        assert!(
            s.quota
                .contains("tenant = \"claim-0b1c2d3e-0000-4000-8000-000000000001\""),
            "{}",
            s.quota
        );
        c.name = "x".repeat(56 - "team-a/".len());
        let s = slice(&c, &alloc("1Gi", "1", None), &driver(), &[h200()]).expect("ok");
        assert!(s.quota.contains(&format!("tenant = \"{}\"", c.label())));
        // A UID that is not a Kubernetes one, longer: cut to fit.
        c.name = "x".repeat(70);
        c.uid = "u".repeat(60);
        let s = slice(&c, &alloc("1Gi", "1", None), &driver(), &[h200()]).expect("ok");
        let cfg = config::parse_file(Path::new("q"), &s.quota).expect("parses");
        assert_eq!(cfg.tenant.map(|t| t.len()), Some(56));
        assert_eq!(cfg.slice, Some(format!("claim-{}", c.uid)));
    }

    #[test]
    fn class_configuration_comes_first_and_the_claims_wins() {
        let cfg = |source: &str, requests: &[&str], p: serde_json::Value| OpaqueConfig {
            source: source.into(),
            requests: requests.iter().map(|r| r.to_string()).collect(),
            driver: "gpu.cuslice.io".into(),
            parameters: p,
        };
        let list = vec![
            cfg("FromClaim", &["gpu"], serde_json::json!({"computeMax": 70})),
            cfg(
                "FromClass",
                &[],
                serde_json::json!({"computeMax": 40, "latency": true}),
            ),
            cfg(
                "FromClaim",
                &["other"],
                serde_json::json!({"computeMax": 90}),
            ),
            OpaqueConfig {
                driver: "gpu.nvidia.com".into(),
                ..cfg("FromClaim", &[], serde_json::json!({"sharing": {}}))
            },
        ];
        assert_eq!(
            settings(&list, "gpu.cuslice.io", "gpu"),
            Ok(Settings {
                compute_max: Some(70),
                latency: true,
                burst_ms: None,
                memory_max: None,
                memory_wait_ms: None,
            })
        );
        // A subrequest takes its main request's configuration.
        assert_eq!(
            settings(&list, "gpu.cuslice.io", "other/big").map(|s| s.compute_max),
            Ok(Some(90))
        );
    }

    #[test]
    fn memory_max_and_memory_wait_reach_the_quota_file() {
        let p = serde_json::json!({"memoryMax": "60Gi", "memoryWait": "30s"});
        let s = slice(
            &claim(),
            &alloc("20Gi", "50", Some(p)),
            &driver(),
            &[h200()],
        )
        .expect("ok");
        let cfg = config::parse_file(Path::new("q"), &s.quota).expect("the shim reads it");
        let uuid = config::parse_uuid(&h200().uuid).expect("uuid");
        let l = cfg.limits_for(0, &uuid);
        assert_eq!((l.memory, l.memory_max), (Some(20 << 30), Some(60 << 30)));
        assert_eq!(cfg.memory_wait_ms, Some(30_000));
        let e = |p| {
            slice(
                &claim(),
                &alloc("20Gi", "50", Some(p)),
                &driver(),
                &[h200()],
            )
            .expect_err("refused")
        };
        assert_eq!(
            e(serde_json::json!({"memoryMax": "10Gi"})),
            "opaque config of driver gpu.cuslice.io: memoryMax 10GiB is below the claim's memory 20GiB"
        );
        assert_eq!(
            e(serde_json::json!({"memoryMax": "lots"})),
            "opaque config of driver gpu.cuslice.io (FromClaim): memoryMax: expected a quantity from 1Mi to 1Pi, got \"lots\""
        );
        assert!(e(serde_json::json!({"memoryWait": "forever"})).starts_with(
            "opaque config of driver gpu.cuslice.io (FromClaim): memoryWait: expected a duration"
        ));
    }

    #[test]
    fn bad_claims_are_one_clear_line() {
        let d = driver();
        let gpus = [h200()];
        let e = |a: Allocation| slice(&claim(), &a, &d, &gpus).expect_err("refused");
        for (a, want) in [
            (
                alloc("200Gi", "50", None),
                "device gpu-0: the claim asks 200GiB of memory, the GPU (GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b) has 141GiB",
            ),
            (
                alloc("4Gi", "130", None),
                "device gpu-0: consumed capacity compute: expected 1 to 100, got 130",
            ),
            (
                alloc("4Gi", "0", None),
                "device gpu-0: consumed capacity compute: expected 1 to 100, got 0",
            ),
            (
                alloc("4Gi", "500m", None),
                "device gpu-0: consumed capacity compute: expected a whole quantity such as 40Gi, 16G or 50, got \"500m\": not a whole number",
            ),
            (
                alloc(
                    "4Gi",
                    "50",
                    Some(serde_json::json!({"computeMax": 60, "turbo": true})),
                ),
                "opaque config of driver gpu.cuslice.io (FromClaim): unknown field `turbo`, expected one of `apiVersion`, `kind`, `computeMax`, `latency`, `burstMs`, `memoryMax`, `memoryWait`",
            ),
            (
                alloc("4Gi", "50", Some(serde_json::json!({"computeMax": 40}))),
                "opaque config of driver gpu.cuslice.io: computeMax 40 is below the claim's compute 50",
            ),
            (
                alloc("4Gi", "50", Some(serde_json::json!({"computeMax": 101}))),
                "opaque config of driver gpu.cuslice.io (FromClaim): computeMax: expected 1 to 100, got 101",
            ),
            (
                alloc("4Gi", "50", Some(serde_json::json!({"burstMs": 100}))),
                "opaque config of driver gpu.cuslice.io: burstMs only applies with computeMax (it shapes how a ceiling is enforced)",
            ),
            (
                alloc("4Gi", "50", Some(serde_json::json!({"kind": "GpuConfig"}))),
                "opaque config of driver gpu.cuslice.io (FromClaim): kind: expected \"SliceConfig\", got \"GpuConfig\"",
            ),
            (
                alloc("4Gi", "50", Some(serde_json::json!({"latency": "yes"}))),
                "opaque config of driver gpu.cuslice.io (FromClaim): invalid type: string \"yes\", expected a boolean",
            ),
        ] {
            assert_eq!(e(a), want);
        }
        // Not ours, none, two, another pool, a GPU that vanished, no
        // capacity, a memory below what the shim takes.
        let mut a = alloc("4Gi", "50", None);
        a.devices[0].driver = "gpu.nvidia.com".into();
        assert_eq!(
            e(a.clone()),
            "the claim's allocation is not ours: no device of driver gpu.cuslice.io, only of gpu.nvidia.com"
        );
        a.devices.clear();
        assert_eq!(e(a), "the claim has no allocated device");
        let mut a = alloc("4Gi", "50", None);
        a.devices.push(a.devices[0].clone());
        assert!(e(a).starts_with("2 devices of driver gpu.cuslice.io in one claim: "));
        let mut a = alloc("4Gi", "50", None);
        a.devices[0].pool = "node-2".into();
        assert_eq!(
            e(a),
            "device gpu-0 is allocated from pool \"node-2\", this node's is \"node-1\""
        );
        let mut a = alloc("4Gi", "50", None);
        a.devices[0].device = "gpu-1".into();
        assert_eq!(
            e(a),
            "device gpu-1 is not on this node (its GPUs: gpu-0): it vanished, or the allocation is stale"
        );
        let mut a = alloc("4Gi", "50", None);
        a.devices[0].consumed.remove("memory");
        assert!(e(a).starts_with("device gpu-0 has no consumed capacity \"memory\": "));
        let m = e(alloc("1Ki", "50", None));
        assert!(m.contains("expected a size from 1MiB to 1PiB"), "{m}");
    }
}
