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
//!  "computeMax": 60, "latency": true, "burstMs": 200}
//! ```
//!
//! all optional (`computeMax`: ceiling 1-100, not below `compute`;
//! `latency`: the latency class; `burstMs`: 1-10000, only with
//! `computeMax`; see docs/compute-share.md), any other key an error.
//! Configurations from the class come first, the claim's override them
//! key by key. The quota file is built as TOML values and checked with
//! `cuslice_core::config::parse_file`, the shim's own reader: a claim the
//! shim would refuse is refused here, and one without limits never passes.

use std::collections::BTreeMap;
use std::path::Path;

use cuslice_core::config;
use serde::Deserialize;
use toml::{Table, Value};

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
}

/// The settings that apply to one device, all configurations merged.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settings {
    pub compute_max: Option<u8>,
    pub latency: bool,
    pub burst_ms: Option<u32>,
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

/// Whether `request` (a result's `request`, `main` or `main/sub`) is one
/// of `requests` (a configuration's, naming `main` or `main/sub`).
fn applies(requests: &[String], request: &str) -> bool {
    let main = request.split('/').next().unwrap_or(request);
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

/// `tenant` for a claim: `namespace/name` where the shim accepts it, else
/// `claim-<uid>`.
fn tenant(c: &ClaimRef) -> String {
    let t = c.label();
    let ok = t.len() <= 64
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'));
    if ok {
        t
    } else {
        format!("claim-{}", &c.uid[..c.uid.len().min(58)])
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
    let mut limits = Table::new();
    limits.insert(
        "memory".into(),
        Value::Integer(i64::try_from(memory).unwrap_or(i64::MAX)),
    );
    limits.insert("compute".into(), Value::Integer(compute.into()));
    if let Some(m) = s.compute_max {
        limits.insert("compute_max".into(), Value::Integer(m.into()));
    }
    let mut devices = Table::new();
    devices.insert(config::format_uuid(&uuid), Value::Table(limits));
    let mut file = Table::new();
    file.insert("tenant".into(), Value::String(tenant(c)));
    file.insert(
        "segment_dir".into(),
        Value::String("/run/cuslice/segment".into()),
    );
    file.insert(
        "gpu_segment_dir".into(),
        Value::String("/run/cuslice/gpu".into()),
    );
    if s.latency {
        file.insert("latency".into(), Value::Boolean(true));
    }
    if let Some(b) = s.burst_ms {
        file.insert("compute_burst_ms".into(), Value::Integer(b.into()));
    }
    file.insert("device".into(), Value::Table(devices));
    let body = toml::to_string(&file).map_err(|e| format!("cannot write the quota file: {e}"))?;
    // One comment line, whatever the claim's names hold.
    let comment: String = format!(
        "written by cuslice-dra-plugin for ResourceClaim {} (uid {})",
        c.label(),
        c.uid
    )
    .chars()
    .filter(|c| !c.is_control())
    .collect();
    let quota = format!("# {comment}\n{body}");
    // The shim's reader is the judge: what it refuses, or a file that
    // would leave this GPU unlimited, is never handed out.
    let cfg = config::parse_file(Path::new("quota.toml"), &quota).map_err(|e| e.to_string())?;
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
