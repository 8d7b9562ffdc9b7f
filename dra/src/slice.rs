//! The ResourceSlice this node's GPUs are published in (`crate::publish`
//! applies it; see docs/kubernetes.md).
//!
//! One device per GPU (`gpu-<index>`), shared by many allocations
//! (`allowMultipleAllocations`, KEP-5075 consumable capacity), with two
//! capacities the scheduler hands out in pieces and never overcommits:
//!
//! | capacity | value | request policy |
//! |---|---|---|
//! | `memory` | the GPU's memory, bytes | from 256Mi up to all of it, in steps of 256Mi (the largest multiple within it); that much when a request names none |
//! | `compute` | 100 | 1 to 100, in steps of 1; all of it when a request names none |
//!
//! A request that names neither capacity gets the whole GPU, so nothing
//! is ever shared without a limit. Attributes, for CEL selectors
//! (`device.attributes["<driver>"].<name>`):
//!
//! | attribute | type | value |
//! |---|---|---|
//! | `uuid` | string | NVML's `GPU-...` |
//! | `index` | int | NVML's index |
//! | `productName` | string | NVML's name ("NVIDIA H200"); absent if NVML gave none |
//! | `cudaComputeCapability` | version | the CUDA compute capability as a semantic version, 9.0 as `9.0.0` (the name and form of NVIDIA's own DRA driver); absent where the inventory file gives none |
//!
//! An unhealthy GPU (`cuslice_host::gpu::health`) gets a device taint
//! ([`health_taint`]): key `<driver>/unhealthy`, the cause as its value
//! (`xid-48`, `lost`, ...), effect `NoSchedule` (`NoExecute` for a lost
//! GPU: its pods are evicted), added when it became unhealthy; where the
//! API server drops taints (no device taints in the cluster), its device
//! is withdrawn from the slice instead ([`resource_slice_with`]).

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::gpus::Gpu;

/// The attribute holding the GPU's CUDA compute capability (a `version`).
pub const COMPUTE_CAPABILITY: &str = "cudaComputeCapability";

/// The memory step (and smallest piece) a claim can ask for.
pub const MEMORY_STEP: u64 = 256 << 20;

fn q(v: impl ToString) -> Quantity {
    Quantity(v.to_string())
}

/// A capacity of `value` handed out from `min` in steps of `step`. The API
/// server wants the range's max and the default on the step grid from min
/// (`validateRequestPolicyRangeStep`): both are the largest such amount
/// within `value` (a GPU's memory is rarely a whole number of steps: an
/// H100 80GB has 81559 MiB, an H200 143771 MiB).
fn capacity(value: u64, min: u64, step: u64) -> DeviceCapacity {
    let top = if value <= min {
        min
    } else {
        value - (value - min) % step
    };
    DeviceCapacity {
        value: q(value),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(q(top)),
            valid_range: Some(CapacityRequestPolicyRange {
                min: q(min),
                max: Some(q(top)),
                step: Some(q(step)),
            }),
            valid_values: None,
        }),
    }
}

fn device(g: &Gpu) -> Device {
    let mut attributes = BTreeMap::new();
    attributes.insert(
        "uuid".to_string(),
        DeviceAttribute {
            string: Some(g.uuid.clone()),
            ..Default::default()
        },
    );
    attributes.insert(
        "index".to_string(),
        DeviceAttribute {
            int: Some(g.index.into()),
            ..Default::default()
        },
    );
    if !g.product.is_empty() {
        attributes.insert(
            "productName".to_string(),
            DeviceAttribute {
                string: Some(g.product.clone()),
                ..Default::default()
            },
        );
    }
    if let Some(cc) = g.compute_capability {
        attributes.insert(
            COMPUTE_CAPABILITY.to_string(),
            DeviceAttribute {
                version: Some(cc.semver()),
                ..Default::default()
            },
        );
    }
    Device {
        name: g.device_name(),
        allow_multiple_allocations: Some(true),
        attributes: Some(attributes),
        capacity: Some(BTreeMap::from([
            (
                "memory".to_string(),
                capacity(g.memory, MEMORY_STEP, MEMORY_STEP),
            ),
            ("compute".to_string(), capacity(100, 1, 1)),
        ])),
        ..Default::default()
    }
}

/// The taint key of an unhealthy GPU: `<driver>/unhealthy`.
pub fn taint_key(driver: &str) -> String {
    format!("{driver}/unhealthy")
}

/// The taint of a GPU of health `h`; None unless it is unhealthy (a
/// degraded GPU stays in service, untainted). NoExecute for a lost GPU
/// (the pods using it are evicted), else NoSchedule; added when it became
/// unhealthy (whole seconds: the API server keeps no more, and the slice
/// must read back as it was sent).
pub fn health_taint(driver: &str, h: &cuslice_host::gpu::health::Health) -> Option<DeviceTaint> {
    if h.state != cuslice_host::gpu::health::State::Unhealthy {
        return None;
    }
    Some(DeviceTaint {
        key: taint_key(driver),
        value: Some(h.cause.map_or_else(|| "unhealthy".into(), |c| c.slug())),
        effect: if h.lost { "NoExecute" } else { "NoSchedule" }.into(),
        time_added: k8s_openapi::jiff::Timestamp::from_second(h.since_unix.max(0.0) as i64)
            .ok()
            .map(Time),
    })
}

/// The node's slice: pool = the node's name, one slice in it.
pub fn resource_slice(driver: &str, node: &str, gpus: &[Gpu], generation: i64) -> ResourceSlice {
    resource_slice_with(driver, node, gpus, &BTreeMap::new(), false, generation)
}

/// [`resource_slice`] with the taints of unhealthy GPUs (by UUID) on their
/// devices, or, with `withdraw` (the API server keeps no taints), without
/// those GPUs' devices.
pub fn resource_slice_with(
    driver: &str,
    node: &str,
    gpus: &[Gpu],
    taints: &BTreeMap<String, DeviceTaint>,
    withdraw: bool,
    generation: i64,
) -> ResourceSlice {
    let devices = gpus
        .iter()
        .filter_map(|g| match taints.get(&g.uuid) {
            Some(_) if withdraw => None,
            Some(t) => Some(Device {
                taints: Some(vec![t.clone()]),
                ..device(g)
            }),
            None => Some(device(g)),
        })
        .collect();
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{node}-{driver}")),
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpus::{ComputeCapability, Inventory};

    #[test]
    fn one_shared_device_per_gpu_with_memory_and_compute() {
        let gpus = [
            Gpu {
                index: 0,
                uuid: "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b".into(),
                memory: 141 << 30,
                minor: 0,
                product: "NVIDIA H200".into(),
                compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
            },
            Gpu {
                index: 1,
                uuid: "GPU-00000000-5b7d-4c2e-9a1b-0c3d4e5f6a7c".into(),
                memory: 80 << 30,
                minor: 1,
                product: String::new(),
                compute_capability: None,
            },
        ];
        let s = resource_slice("gpu.cuslice.io", "node-1", &gpus, 3);
        assert_eq!(s.metadata.name.as_deref(), Some("node-1-gpu.cuslice.io"));
        assert_eq!(s.spec.driver, "gpu.cuslice.io");
        assert_eq!(s.spec.node_name.as_deref(), Some("node-1"));
        assert_eq!(
            (
                s.spec.pool.name.as_str(),
                s.spec.pool.generation,
                s.spec.pool.resource_slice_count
            ),
            ("node-1", 3, 1)
        );
        let devices = s.spec.devices.as_ref().expect("devices");
        assert_eq!(devices.len(), 2);
        let d = &devices[0];
        assert_eq!(d.name, "gpu-0");
        assert_eq!(d.allow_multiple_allocations, Some(true));
        let a = d.attributes.as_ref().expect("attributes");
        assert_eq!(a["uuid"].string.as_deref(), Some(gpus[0].uuid.as_str()));
        assert_eq!(a["index"].int, Some(0));
        assert_eq!(a["productName"].string.as_deref(), Some("NVIDIA H200"));
        assert_eq!(
            a["cudaComputeCapability"],
            DeviceAttribute {
                version: Some("9.0.0".into()),
                ..Default::default()
            }
        );
        let c = d.capacity.as_ref().expect("capacity");
        assert_eq!(c.len(), 2);
        let m = &c["memory"];
        assert_eq!(m.value.0, (141u64 << 30).to_string());
        let p = m.request_policy.as_ref().expect("policy");
        assert_eq!(
            p.default.as_ref().map(|q| q.0.as_str()),
            Some("151397597184")
        );
        let r = p.valid_range.as_ref().expect("range");
        assert_eq!(
            (
                r.min.0.as_str(),
                r.max.as_ref().map(|q| q.0.as_str()),
                r.step.as_ref().map(|q| q.0.as_str())
            ),
            ("268435456", Some("151397597184"), Some("268435456"))
        );
        let cp = &c["compute"];
        assert_eq!(cp.value.0, "100");
        let p = cp.request_policy.as_ref().expect("policy");
        let r = p.valid_range.as_ref().expect("range");
        assert_eq!(p.default.as_ref().map(|q| q.0.as_str()), Some("100"));
        assert_eq!(
            (
                r.min.0.as_str(),
                r.max.as_ref().map(|q| q.0.as_str()),
                r.step.as_ref().map(|q| q.0.as_str())
            ),
            ("1", Some("100"), Some("1"))
        );
        let a1 = devices[1].attributes.as_ref().expect("a");
        assert!(!a1.contains_key("productName"));
        assert!(!a1.contains_key("cudaComputeCapability"));
        // A GPU whose memory is not a whole number of steps (an H100 80GB:
        // 81559 MiB): the range's max and the default on the step grid, the
        // value the GPU's own.
        let h100 = Gpu {
            memory: 81559 << 20,
            ..gpus[1].clone()
        };
        let s100 = resource_slice("gpu.cuslice.io", "node-1", &[h100], 1);
        let m = &s100.spec.devices.as_ref().expect("devices")[0]
            .capacity
            .as_ref()
            .expect("capacity")["memory"];
        let p = m.request_policy.as_ref().expect("policy");
        let r = p.valid_range.as_ref().expect("range");
        let top: u64 = r.max.as_ref().expect("max").0.parse().expect("bytes");
        assert_eq!(m.value.0, (81559u64 << 20).to_string());
        assert_eq!(top, 81408 << 20);
        assert_eq!((top - MEMORY_STEP) % MEMORY_STEP, 0);
        assert_eq!(
            p.default.as_ref().map(|q| q.0.as_str()),
            Some(top.to_string().as_str())
        );
        // As the API server reads it: the field names of resource.k8s.io/v1.
        let j = serde_json::to_value(&s).expect("json");
        assert_eq!(j["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(j["kind"], "ResourceSlice");
        let d = &j["spec"]["devices"][0];
        assert_eq!(d["allowMultipleAllocations"], true);
        assert_eq!(
            d["capacity"]["compute"]["requestPolicy"]["validRange"]["step"],
            "1"
        );
        assert_eq!(d["attributes"]["uuid"]["string"], gpus[0].uuid.as_str());
        assert_eq!(
            d["attributes"]["cudaComputeCapability"],
            serde_json::json!({"version": "9.0.0"})
        );
        assert_eq!(j["spec"]["pool"]["resourceSliceCount"], 1);
        let back: ResourceSlice = serde_json::from_value(j).expect("parses back");
        assert_eq!(back, s);
    }

    /// The attribute a DeviceClass or a claim selects on: a `version` (a
    /// semantic version, the one type CEL's `semver` compares), nothing else
    /// set in it, from the compute capability NVML or the file gives.
    #[test]
    fn the_compute_capability_is_a_version_attribute() {
        for (major, minor, want) in [(9, 0, "9.0.0"), (8, 6, "8.6.0"), (12, 1, "12.1.0")] {
            let g = Gpu {
                index: 0,
                uuid: "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b".into(),
                memory: 80 << 30,
                minor: 0,
                product: String::new(),
                compute_capability: Some(ComputeCapability { major, minor }),
            };
            let s = resource_slice("gpu.cuslice.io", "node-1", &[g], 1);
            let j = serde_json::to_value(&s).expect("json");
            let a = &j["spec"]["devices"][0]["attributes"][COMPUTE_CAPABILITY];
            assert_eq!(a, &serde_json::json!({"version": want}), "{major}.{minor}");
            // As the API server validates a version: semver.org 2.0.0,
            // major.minor.patch, no leading zeros.
            let parts: Vec<&str> = want.split('.').collect();
            assert_eq!(parts.len(), 3);
            assert!(parts.iter().all(|p| p == &"0" || !p.starts_with('0')));
            let back: ResourceSlice = serde_json::from_value(j).expect("parses back");
            let at = &back.spec.devices.as_ref().expect("devices")[0]
                .attributes
                .as_ref()
                .expect("attributes")[COMPUTE_CAPABILITY];
            assert_eq!(at.version.as_deref(), Some(want));
            assert_eq!(
                (at.bool, at.int, at.string.as_ref(), at.strings.as_ref()),
                (None, None, None, None)
            );
        }
    }

    #[test]
    fn an_unhealthy_gpu_is_tainted_or_withdrawn() {
        use cuslice_host::gpu::health::{Cause, Health, State};
        let gpu = |i: u32| Gpu {
            index: i,
            uuid: format!("GPU-{i}"),
            memory: 80 << 30,
            minor: i,
            product: String::new(),
            compute_capability: None,
        };
        let gpus = [gpu(0), gpu(1), gpu(2)];
        let h = |state, cause, lost| Health {
            state,
            cause,
            reason: Some("why".into()),
            since_unix: 1_800_000_000.7,
            lost,
        };
        let d = "gpu.cuslice.io";
        assert_eq!(health_taint(d, &Health::healthy(0.0)), None);
        assert_eq!(
            health_taint(d, &h(State::Degraded, Some(Cause::Xid(94)), false)),
            None
        );
        let lost =
            health_taint(d, &h(State::Unhealthy, Some(Cause::Xid(79)), true)).expect("taint");
        let sick = health_taint(d, &h(State::Unhealthy, Some(Cause::RowRemapFailure), false))
            .expect("taint");
        assert_eq!(
            serde_json::to_value(&lost).expect("json"),
            serde_json::json!({"key": "gpu.cuslice.io/unhealthy", "value": "xid-79",
                "effect": "NoExecute", "timeAdded": "2027-01-15T08:00:00Z"})
        );
        assert_eq!(sick.effect, "NoSchedule");
        assert_eq!(sick.value.as_deref(), Some("row-remap-failure"));
        let taints = BTreeMap::from([("GPU-1".to_string(), lost), ("GPU-2".to_string(), sick)]);
        let s = resource_slice_with(d, "node-1", &gpus, &taints, false, 2);
        let devs = s.spec.devices.as_ref().expect("devices");
        assert_eq!(devs.len(), 3);
        assert_eq!(devs[0].taints, None);
        assert_eq!(
            devs[1].taints.as_ref().map(|t| t[0].effect.as_str()),
            Some("NoExecute")
        );
        assert_eq!(
            devs[2].taints.as_ref().map(|t| t[0].effect.as_str()),
            Some("NoSchedule")
        );
        let s = resource_slice_with(d, "node-1", &gpus, &taints, true, 2);
        let names: Vec<&str> = s
            .spec
            .devices
            .as_ref()
            .expect("devices")
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(names, ["gpu-0"]);
        // Valid as the API server checks a taint: a label name as its key, a
        // label value (63 characters at most, alphanumerics, '-', '_', '.')
        // as its value.
        for c in [
            "xid-79",
            "double-bit-ecc",
            "lost",
            "query-failed",
            "never-answered",
            "retired-pages-pending",
            "row-remap-pending",
            "row-remap-failure",
            "ecc-uncorrected",
        ] {
            assert!(c.len() <= 63 && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
        }
    }

    /// An inventory file without `compute_capability` (one written before
    /// it): the device is published without the attribute, the rest alike.
    #[test]
    fn a_gpus_file_without_a_compute_capability_publishes_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("gpus.json");
        std::fs::write(
            &f,
            r#"[{"index": 0, "uuid": "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b", "memory": 151397597184, "minor": 0, "product": "NVIDIA H200"},
                {"index": 1, "uuid": "GPU-00000000-5b7d-4c2e-9a1b-0c3d4e5f6a7c", "memory": 151397597184, "minor": 1, "product": "NVIDIA H200", "compute_capability": "9.0"}]"#,
        )
        .expect("write");
        let gpus = crate::gpus::File(f).gpus().expect("parses");
        let s = resource_slice("gpu.cuslice.io", "node-1", &gpus, 1);
        let devices = s.spec.devices.as_ref().expect("devices");
        let a0 = devices[0].attributes.as_ref().expect("attributes");
        assert!(!a0.contains_key(COMPUTE_CAPABILITY), "{a0:?}");
        assert_eq!(
            a0.keys().map(String::as_str).collect::<Vec<_>>(),
            ["index", "productName", "uuid"]
        );
        let a1 = devices[1].attributes.as_ref().expect("attributes");
        assert_eq!(a1[COMPUTE_CAPABILITY].version.as_deref(), Some("9.0.0"));
    }
}
