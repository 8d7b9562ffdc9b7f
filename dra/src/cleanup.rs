//! Claims the kubelet never unprepared: where the plugin was down when a
//! claim's pod went, or the kubelet lost track of it, a prepared claim's
//! files, CDI spec and checkpoint entry would stay for ever. At start and
//! then every [`PERIOD`] (`--cleanup-interval`), each checkpointed claim is
//! looked up in the API server by its namespace and name; one that is
//! gone is unprepared exactly as NodeUnprepareResources would, with one log
//! line. Gone means:
//!
//! - the API server has no ResourceClaim of that name (NotFound, naming
//!   it);
//! - it has one of another UID (deleted and made again under that name);
//! - it has the same claim, no longer allocated a device of this driver in
//!   this node's pool (deallocated once no pod uses it, or allocated
//!   elsewhere).
//!
//! Never on an error: a claim whose lookup fails (the API server not
//! reached, an answer that is neither the claim nor a NotFound naming it,
//! no answer within [`LOOKUP_TIMEOUT`]) is kept, and the pass says in one
//! line how many it could not check. Claims prepared by hand
//! (`prepare --claim FILE`) are left to `unprepare` by hand.
//!
//! Each claim found gone is looked up again under the node lock before it
//! is removed ([`CONFIRM_TIMEOUT`]): a prepare of the same claim (one
//! deallocated and then allocated here again) either finished before, and
//! the claim is then found allocated, or waits for the lock and writes its
//! files after the removal.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::api::{self, ClaimSource};
use crate::claim::Driver;
use crate::node::{Node, Prepared};

/// How often the checkpointed claims are checked against the API server
/// by default (one GET per claim).
pub const PERIOD: Duration = Duration::from_secs(300);
/// How long one lookup may take before its claim is kept for this pass.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the lookup made again under the node lock may take: well
/// within the lock's wait ([`crate::node::LOCK_WAIT`]), so that a prepare
/// waiting behind it still gets the lock.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// What a pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    /// The claims unprepared (their UIDs).
    pub unprepared: Vec<String>,
    /// Claims the API server still has as they were prepared.
    pub kept: usize,
    /// Claims whose lookup failed (kept).
    pub unchecked: usize,
    /// Claims prepared by hand (not looked up).
    pub by_hand: usize,
    /// Claims found gone whose removal failed (tried again next pass).
    pub failed: usize,
}

/// `Ok(())` where `found` (the API server's answer for the entry's claim)
/// is still the claim `entry` prepared and allocated here, else why it is
/// gone.
pub fn judge(
    found: Option<&ResourceClaim>,
    entry: &Prepared,
    driver: &Driver,
) -> Result<(), String> {
    match found {
        None => Err(format!(
            "the API server has no ResourceClaim {}",
            entry.claim.label()
        )),
        Some(c) => api::still_ours(c, &entry.claim, driver),
    }
}

/// `f` on the node, off the async runtime (the node's calls block: files,
/// the lock's wait).
async fn blocking<T: Send + 'static>(
    node: &Arc<Node>,
    f: impl FnOnce(&Node) -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let n = node.clone();
    tokio::task::spawn_blocking(move || f(&n))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
}

/// The lookup of `entry`'s claim, within `limit`.
async fn lookup(
    claims: &dyn ClaimSource,
    entry: &Prepared,
    limit: Duration,
) -> Result<Option<ResourceClaim>, String> {
    let c = &entry.claim;
    match tokio::time::timeout(limit, claims.lookup(&c.namespace, &c.name)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "cannot get ResourceClaim {}: no answer within {limit:?}",
            c.label()
        )),
    }
}

fn log(line: &str) {
    eprintln!(
        "cuslice-dra-plugin: cleanup: {}",
        cuslice_host::text::clean(line)
    );
}

/// One pass over the checkpoint (see the module's documentation).
pub async fn pass(node: &Arc<Node>, claims: &dyn ClaimSource) -> Pass {
    let mut out = Pass::default();
    let driver = &node.config().driver;
    let entries = match blocking(node, |n| n.prepared()).await {
        Ok(e) => e,
        Err(e) => {
            log(&format!("cannot read the checkpoint: {e}"));
            return out;
        }
    };
    let mut gone = vec![];
    let mut first_error = None;
    for (uid, entry) in entries {
        if entry.by_hand {
            out.by_hand += 1;
            continue;
        }
        match lookup(claims, &entry, LOOKUP_TIMEOUT).await {
            Err(e) => {
                out.unchecked += 1;
                first_error.get_or_insert(e);
            }
            Ok(found) => match judge(found.as_ref(), &entry, driver) {
                Ok(()) => out.kept += 1,
                Err(_) => gone.push((uid, entry)),
            },
        }
    }
    for (uid, entry) in gone {
        let lock = match blocking(node, |n| n.lock()).await {
            Ok(l) => l,
            Err(e) => {
                out.failed += 1;
                log(&format!(
                    "claim {} ({uid}): not unprepared: {e}",
                    entry.claim.label()
                ));
                continue;
            }
        };
        // Again, under the lock: what decides.
        let why = match lookup(claims, &entry, CONFIRM_TIMEOUT).await {
            Err(e) => {
                out.unchecked += 1;
                first_error.get_or_insert(e);
                continue;
            }
            Ok(found) => match judge(found.as_ref(), &entry, driver) {
                Ok(()) => {
                    out.kept += 1;
                    continue;
                }
                Err(why) => why,
            },
        };
        let u = uid.clone();
        // The lock moves into the task and is let go when it ends.
        match blocking(node, move |n| n.unprepare_held(&lock, &u)).await {
            Ok(_) => {
                log(&format!(
                    "claim {} ({uid}) unprepared: {why}",
                    entry.claim.label()
                ));
                out.unprepared.push(uid);
            }
            Err(e) => {
                out.failed += 1;
                log(&format!(
                    "claim {} ({uid}): {why}, but not unprepared: {e}",
                    entry.claim.label()
                ));
            }
        }
    }
    if let Some(e) = first_error {
        log(&format!(
            "{} claim(s) kept unchecked (the API server did not tell): {e}",
            out.unchecked
        ));
    }
    out
}

/// A pass now and then every `every`, for as long as the plugin runs.
pub async fn keep_clean(node: Arc<Node>, claims: Arc<dyn ClaimSource>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        pass(&node, claims.as_ref()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::ClaimRef;

    const UID: &str = "11111111-2222-4333-8444-555555555555";

    fn entry() -> Prepared {
        Prepared {
            claim: ClaimRef {
                namespace: "ns".into(),
                name: "svc".into(),
                uid: UID.into(),
            },
            gpu_uuid: "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b".into(),
            memory: 1 << 30,
            compute: 10,
            devices: vec![],
            by_hand: false,
        }
    }

    fn driver() -> Driver {
        Driver {
            name: "gpu.cuslice.io".into(),
            pool: "node-1".into(),
        }
    }

    fn claim(uid: &str, results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"namespace": "ns", "name": "svc", "uid": uid},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}},
        }))
        .expect("a ResourceClaim")
    }

    fn result(driver: &str, pool: &str) -> serde_json::Value {
        serde_json::json!({"request": "gpu", "driver": driver, "pool": pool, "device": "gpu-0"})
    }

    #[test]
    fn a_claim_is_gone_when_missing_replaced_or_no_longer_allocated_here() {
        let e = entry();
        let d = driver();
        let ours = claim(UID, serde_json::json!([result("gpu.cuslice.io", "node-1")]));
        assert_eq!(judge(Some(&ours), &e, &d), Ok(()));
        // Beside another driver's device: still ours.
        let mixed = claim(
            UID,
            serde_json::json!([
                result("gpu.nvidia.com", "node-1"),
                result("gpu.cuslice.io", "node-1")
            ]),
        );
        assert_eq!(judge(Some(&mixed), &e, &d), Ok(()));
        assert_eq!(
            judge(None, &e, &d),
            Err("the API server has no ResourceClaim ns/svc".into())
        );
        let other = claim(
            "99999999-2222-4333-8444-555555555555",
            serde_json::json!([result("gpu.cuslice.io", "node-1")]),
        );
        assert_eq!(
            judge(Some(&other), &e, &d),
            Err(
                "ResourceClaim ns/svc is now another claim (uid \"99999999-2222-4333-8444-555555555555\")"
                    .into()
            )
        );
        let gone =
            "ResourceClaim ns/svc is no longer allocated a device of gpu.cuslice.io in pool node-1";
        for results in [
            serde_json::json!([]),
            serde_json::json!([result("gpu.cuslice.io", "node-2")]),
            serde_json::json!([result("gpu.nvidia.com", "node-1")]),
        ] {
            assert_eq!(judge(Some(&claim(UID, results)), &e, &d), Err(gone.into()));
        }
        let mut deallocated = ours;
        deallocated.status = None;
        assert_eq!(judge(Some(&deallocated), &e, &d), Err(gone.into()));
    }
}
