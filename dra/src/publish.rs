//! Publishing the node's ResourceSlice ([`crate::slice`]) to the API
//! server, and keeping it current.
//!
//! - At start, and then every `REFRESH` (a GPU that vanished or came back
//!   changes the slice; the kubelet deletes the node's slices when it
//!   starts and 30 s after it loses the plugin), the plugin reads its GPUs
//!   and the slice the API server has, and where they differ applies the
//!   slice with server-side apply (field manager `cuslice-dra-plugin`,
//!   forced: the slice is this plugin's alone). Devices are compared as
//!   the API server keeps them: quantities by value, and without the
//!   consumable-capacity fields where its `DRAConsumableCapacity` gate is
//!   off (said once: no claim gets a share of a GPU then).
//! - The pool's generation goes up by one whenever the devices change (the
//!   scheduler trusts the slice of the highest generation in a pool), and
//!   stays put when nothing changed.
//! - The slice is owned by its Node (an ownerReference with the Node's
//!   UID), so that deleting the node deletes its slice. A Node that cannot
//!   be read leaves the slice without an owner, said once.
//! - GPU health (`cuslice_host::gpu::health`, the plugin's own health source):
//!   an unhealthy GPU's device carries a taint ([`crate::slice::health_taint`]:
//!   NoSchedule, NoExecute for a lost GPU). A change of a GPU's health wakes
//!   the loop at once, so the slice is republished within a second of the
//!   source seeing it (and the source sees an XID event at once, a GPU that
//!   stopped answering within its poll, 5 s). Where the API server keeps
//!   the slice without the taints (its `DRADeviceTaints` gate is off), the
//!   plugin says so once and withdraws unhealthy GPUs' devices from the
//!   slice instead, from then on. A GPU returns when its health does: after
//!   the source's quiet period, or an operator's clear.
//! - The plugin does not delete its slice when it stops: a plugin restarted
//!   for an upgrade must not make the node's GPUs vanish from the
//!   scheduler's view in between, and the kubelet removes the slices of a
//!   driver whose plugin stays unregistered.
//!
//! Behind [`SliceSink`], so that tests can play the API server.

use std::sync::atomic::{AtomicBool, Ordering};

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::gpus::Gpu;

/// The field manager of the plugin's server-side applies.
pub const FIELD_MANAGER: &str = "cuslice-dra-plugin";
/// How often the slice is checked against the node's GPUs (a GET; an
/// apply only where it differs): also how long a slice the kubelet wiped
/// (at its start, or 30 s after it lost the plugin) stays missing.
pub const REFRESH: std::time::Duration = std::time::Duration::from_secs(10);

/// Where ResourceSlices go.
#[tonic::async_trait]
pub trait SliceSink: Send + Sync {
    /// The slice named `name`, if the API server has it.
    async fn get(&self, name: &str) -> Result<Option<ResourceSlice>, String>;
    /// Server-side apply of `slice` (its name in its metadata).
    async fn apply(&self, slice: &ResourceSlice) -> Result<ResourceSlice, String>;
    /// The UID of Node `name`.
    async fn node_uid(&self, name: &str) -> Result<String, String>;
}

/// The API server, through kube.
pub struct Kube(pub kube::Client);

#[tonic::async_trait]
impl SliceSink for Kube {
    async fn get(&self, name: &str) -> Result<Option<ResourceSlice>, String> {
        kube::Api::<ResourceSlice>::all(self.0.clone())
            .get_opt(name)
            .await
            .map_err(|e| format!("cannot get ResourceSlice {name}: {e}"))
    }

    async fn apply(&self, slice: &ResourceSlice) -> Result<ResourceSlice, String> {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        kube::Api::<ResourceSlice>::all(self.0.clone())
            .patch(
                name,
                &kube::api::PatchParams::apply(FIELD_MANAGER).force(),
                &kube::api::Patch::Apply(slice),
            )
            .await
            .map_err(|e| format!("cannot apply ResourceSlice {name}: {e}"))
    }

    async fn node_uid(&self, name: &str) -> Result<String, String> {
        let n = kube::Api::<k8s_openapi::api::core::v1::Node>::all(self.0.clone())
            .get(name)
            .await
            .map_err(|e| format!("cannot get Node {name}: {e}"))?;
        n.metadata
            .uid
            .ok_or_else(|| format!("Node {name} has no uid"))
    }
}

/// Whether the missing owner was said.
static SAID: AtomicBool = AtomicBool::new(false);

/// Whether the feature gate that is off was said.
static GATE_SAID: AtomicBool = AtomicBool::new(false);

/// Whether the API server kept `s`'s devices without the field that
/// consumable capacity adds (every device the plugin publishes has it).
fn lacks_consumable_capacity(s: &ResourceSlice) -> bool {
    s.spec
        .devices
        .as_ref()
        .is_some_and(|d| !d.is_empty() && d.iter().all(|d| d.allow_multiple_allocations.is_none()))
}

/// `devices` as JSON for comparison: each capacity's quantities as whole
/// numbers (`16Gi` and `17179869184` alike), and with `strip`, without
/// `allowMultipleAllocations` and the request policies.
fn comparable(
    devices: &Option<Vec<k8s_openapi::api::resource::v1::Device>>,
    strip: bool,
) -> serde_json::Value {
    fn canon(v: &mut serde_json::Value) {
        if let Some(s) = v.as_str()
            && let Ok(n) = crate::quantity::parse_whole(s)
        {
            *v = serde_json::Value::String(n.to_string());
        }
    }
    let mut v = serde_json::to_value(devices).unwrap_or_default();
    for d in v.as_array_mut().into_iter().flatten() {
        let Some(d) = d.as_object_mut() else { continue };
        if strip {
            d.remove("allowMultipleAllocations");
        }
        let Some(caps) = d.get_mut("capacity").and_then(|c| c.as_object_mut()) else {
            continue;
        };
        for cap in caps.values_mut() {
            let Some(cap) = cap.as_object_mut() else {
                continue;
            };
            if strip {
                cap.remove("requestPolicy");
            }
            if let Some(value) = cap.get_mut("value") {
                canon(value);
            }
            let Some(p) = cap.get_mut("requestPolicy") else {
                continue;
            };
            if let Some(x) = p.get_mut("default") {
                canon(x);
            }
            if let Some(r) = p.get_mut("validRange").and_then(|r| r.as_object_mut()) {
                r.values_mut().for_each(canon);
            }
            if let Some(vs) = p.get_mut("validValues").and_then(|v| v.as_array_mut()) {
                vs.iter_mut().for_each(canon);
            }
        }
    }
    v
}

/// What a publish did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// The slice was created or its devices changed: now at `generation`.
    Changed { generation: i64 },
    /// The API server's slice already had these devices (applied again).
    Unchanged { generation: i64 },
}

/// Publishes the slice of `node`'s `gpus` for `driver` to `sink`.
pub async fn publish(
    sink: &dyn SliceSink,
    driver: &str,
    node: &str,
    gpus: &[Gpu],
) -> Result<Published, String> {
    publish_with(sink, driver, node, gpus, &BTreeMap::new(), false)
        .await
        .map(|(p, _)| p)
}

/// Whether the API server kept `stored` without a taint `sent` had: its
/// device taints are off.
fn taints_dropped(sent: &ResourceSlice, stored: &ResourceSlice) -> bool {
    let tainted = |s: &ResourceSlice| -> Vec<String> {
        s.spec
            .devices
            .iter()
            .flatten()
            .filter(|d| d.taints.as_ref().is_some_and(|t| !t.is_empty()))
            .map(|d| d.name.clone())
            .collect()
    };
    let kept = tainted(stored);
    tainted(sent).iter().any(|n| !kept.contains(n))
}

/// [`publish`] with the taints of unhealthy GPUs (by UUID), or, with
/// `withdraw`, without those GPUs' devices; also whether the API server
/// dropped the taints sent (then publish again with `withdraw`).
pub async fn publish_with(
    sink: &dyn SliceSink,
    driver: &str,
    node: &str,
    gpus: &[Gpu],
    taints: &BTreeMap<String, DeviceTaint>,
    withdraw: bool,
) -> Result<(Published, bool), String> {
    let mut slice = crate::slice::resource_slice_with(driver, node, gpus, taints, withdraw, 0);
    let name = slice.metadata.name.clone().unwrap_or_default();
    let old = sink.get(&name).await?;
    let (generation, changed) = match &old {
        None => (1, true),
        Some(o) => {
            // As the API server keeps them: quantities in its canonical
            // form, and without the consumable-capacity fields where its
            // feature gate is off (else every round would count a change).
            let strip = lacks_consumable_capacity(o);
            let same = comparable(&o.spec.devices, strip) == comparable(&slice.spec.devices, strip)
                && o.spec.driver == slice.spec.driver
                && o.spec.node_name == slice.spec.node_name
                && o.spec.pool.name == slice.spec.pool.name;
            let g = o.spec.pool.generation.max(0);
            if same { (g, false) } else { (g + 1, true) }
        }
    };
    slice.spec.pool.generation = generation;
    // The owner as the slice there has it, when it names this Node: no GET
    // of the Node each round.
    let owned = old.as_ref().and_then(|o| {
        o.metadata
            .owner_references
            .clone()
            .filter(|r| r.iter().any(|r| r.kind == "Node" && r.name == node))
    });
    let uid = match owned {
        Some(refs) => Ok(refs),
        None => sink.node_uid(node).await.map(|uid| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node.into(),
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            }]
        }),
    };
    match uid {
        Ok(refs) => slice.metadata.owner_references = Some(refs),
        Err(e) => {
            // Kept from the slice already there, if it had one.
            slice.metadata.owner_references = old
                .as_ref()
                .and_then(|o| o.metadata.owner_references.clone());
            if slice.metadata.owner_references.is_none() && !SAID.swap(true, Ordering::Relaxed) {
                eprintln!(
                    "cuslice-dra-plugin: {e}: ResourceSlice {name} is published without an owner (deleting the node will not delete it)"
                );
            }
        }
    }
    // Applied only where something differs: a round that finds the slice
    // as it should be costs the API server one GET.
    let stored = match &old {
        Some(o) if !changed && o.metadata.owner_references == slice.metadata.owner_references => {
            o.clone()
        }
        _ => sink.apply(&slice).await?,
    };
    let dropped = taints_dropped(&slice, &stored);
    if lacks_consumable_capacity(&stored) && !GATE_SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "cuslice-dra-plugin: the API server stored ResourceSlice {name} without allowMultipleAllocations and requestPolicy: its DRAConsumableCapacity feature gate is off (alpha in Kubernetes 1.34 and 1.35, see docs/kubernetes.md); no claim of this driver gets a slice of a GPU until it is on"
        );
    }
    Ok((
        if changed {
            Published::Changed { generation }
        } else {
            Published::Unchanged { generation }
        },
        dropped,
    ))
}

/// The GPUs' health, as the plugin's health source judges it.
pub trait HealthSource: Send + Sync {
    fn gpus(&self) -> Vec<cuslice_host::gpu::health::file::GpuHealth>;
}

impl HealthSource for cuslice_host::gpu::health::source::Source {
    fn gpus(&self) -> Vec<cuslice_host::gpu::health::file::GpuHealth> {
        cuslice_host::gpu::health::source::Source::gpus(self)
    }
}

/// The taints of the unhealthy GPUs among `health`, by UUID.
pub fn health_taints(
    driver: &str,
    health: &[cuslice_host::gpu::health::file::GpuHealth],
) -> BTreeMap<String, DeviceTaint> {
    health
        .iter()
        .filter_map(|g| {
            crate::slice::health_taint(driver, g.judge.health()).map(|t| (g.uuid.clone(), t))
        })
        .collect()
}

/// Publishes now and then every `every` (and at once when `wake` is
/// notified: a GPU's health changed), until the task is dropped: each
/// round reads the node's GPUs afresh, and their health from `health`
/// where the plugin runs a health source; a failure is said (once per kind
/// of failure in a row) and retried at the next round.
pub async fn keep_published(
    sink: std::sync::Arc<dyn SliceSink>,
    inventory: std::sync::Arc<dyn crate::gpus::Inventory>,
    driver: String,
    node: String,
    every: std::time::Duration,
    health: Option<std::sync::Arc<dyn HealthSource>>,
    wake: std::sync::Arc<tokio::sync::Notify>,
) {
    let mut last: Option<Result<Published, String>> = None;
    // Where the API server keeps no taints: unhealthy GPUs withdrawn.
    let mut withdraw = false;
    loop {
        let taints = health
            .as_ref()
            .map(|h| health_taints(&driver, &h.gpus()))
            .unwrap_or_default();
        let r = match inventory.gpus() {
            Ok(gpus) => publish_with(sink.as_ref(), &driver, &node, &gpus, &taints, withdraw)
                .await
                .map(|(p, dropped)| {
                    if dropped && !withdraw {
                        withdraw = true;
                        eprintln!(
                            "cuslice-dra-plugin: the API server stored ResourceSlice {node}-{driver} without its device taints: its DRADeviceTaints feature gate is off (see docs/kubernetes.md); unhealthy GPUs are withdrawn from the slice instead"
                        );
                    }
                    (p, dropped)
                }),
            Err(e) => Err(format!("cannot list this node's GPUs: {e}")),
        };
        let again = matches!(r, Ok((_, true)));
        let r = r.map(|(p, _)| p);
        match &r {
            Ok(Published::Changed { generation }) => eprintln!(
                "cuslice-dra-plugin: ResourceSlice {node}-{driver} published (pool {node}, generation {generation}){}",
                describe_health(&taints, withdraw)
            ),
            Ok(Published::Unchanged { .. }) => {}
            Err(e) if last.as_ref().is_some_and(|l| l.as_ref().err() == Some(e)) => {}
            Err(e) => eprintln!(
                "cuslice-dra-plugin: {e} (retried every {} s)",
                every.as_secs()
            ),
        }
        last = Some(r);
        if again {
            // The slice sent carried taints the API server dropped: again
            // now, the unhealthy GPUs withdrawn.
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = wake.notified() => {}
        }
    }
}

/// `; GPU-... tainted (xid-48, NoSchedule)` for each unhealthy GPU.
fn describe_health(taints: &BTreeMap<String, DeviceTaint>, withdraw: bool) -> String {
    taints
        .iter()
        .map(|(uuid, t)| {
            if withdraw {
                format!(
                    "; {uuid} withdrawn (unhealthy: {})",
                    t.value.as_deref().unwrap_or("-")
                )
            } else {
                format!(
                    "; {uuid} tainted ({}, {})",
                    t.value.as_deref().unwrap_or("-"),
                    t.effect
                )
            }
        })
        .collect()
}
