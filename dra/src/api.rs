//! The API server's side: a claim's allocation, looked up by the kubelet's
//! (namespace, name) and checked to be the claim of that UID. Behind
//! [`ClaimSource`], so that tests can serve claims without a cluster.

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::claim::{AllocatedDevice, Allocation, ClaimRef, Driver, OpaqueConfig};

/// Where ResourceClaims come from.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync {
    /// The ResourceClaim `namespace/name`: `None` only where the API server
    /// said it has no such claim (what the cleanup of prepared claims acts
    /// on, [`crate::cleanup`]); an error wherever it could not tell.
    async fn lookup(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String>;

    /// The ResourceClaim `namespace/name`; one it does not have is an error
    /// too, worded as the API server words it.
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        self.lookup(namespace, name).await?.ok_or_else(|| {
            format!(
                "cannot get ResourceClaim {namespace}/{name}: resourceclaims.resource.k8s.io \"{name}\" not found"
            )
        })
    }
}

/// The API server, through kube.
pub struct Kube(pub kube::Client);

#[tonic::async_trait]
impl ClaimSource for Kube {
    async fn lookup(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        match kube::Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get(name)
            .await
        {
            Ok(c) => Ok(Some(c)),
            // NotFound, and about this very claim: the API server says so
            // of an object it does not have (details.name), not of a
            // resource it does not serve (a 404 for the whole of
            // resource.k8s.io/v1, with no name, must not read as every
            // claim gone).
            Err(kube::Error::Api(s))
                if s.is_not_found() && s.details.as_ref().is_some_and(|d| d.name == name) =>
            {
                Ok(None)
            }
            // The API server's own words, not the whole Status.
            Err(kube::Error::Api(s)) => Err(format!(
                "cannot get ResourceClaim {namespace}/{name}: {} ({} {})",
                s.message, s.code, s.reason
            )),
            Err(e) => Err(format!("cannot get ResourceClaim {namespace}/{name}: {e}")),
        }
    }
}

/// Whether `claim` (the API server's, for the checkpointed `want`) is
/// still the claim `want` prepared, allocated a device of `driver` in its
/// pool: `Err(why not)` where it is not (another UID: the claim was
/// deleted and made again under its name; no such device: deallocated, or
/// allocated elsewhere).
pub fn still_ours(claim: &ResourceClaim, want: &ClaimRef, driver: &Driver) -> Result<(), String> {
    let uid = claim.metadata.uid.as_deref().unwrap_or("");
    if uid != want.uid {
        return Err(format!(
            "ResourceClaim {} is now another claim (uid {uid:?})",
            want.label()
        ));
    }
    let ours = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .any(|r| r.driver == driver.name && r.pool == driver.pool);
    if ours {
        Ok(())
    } else {
        Err(format!(
            "ResourceClaim {} is no longer allocated a device of {} in pool {}",
            want.label(),
            driver.name,
            driver.pool
        ))
    }
}

/// The allocation of `claim`, which must be the one `want` names (same UID:
/// a claim deleted and made again under the same name is another claim).
pub fn allocation(claim: &ResourceClaim, want: &ClaimRef) -> Result<Allocation, String> {
    let uid = claim.metadata.uid.as_deref().unwrap_or("");
    if uid != want.uid {
        return Err(format!(
            "ResourceClaim {} has uid {uid:?}, the kubelet asked for {:?}",
            want.label(),
            want.uid
        ));
    }
    let alloc = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .ok_or_else(|| format!("ResourceClaim {} is not allocated", want.label()))?;
    let devices = alloc
        .results
        .iter()
        .flatten()
        .map(|r| AllocatedDevice {
            request: r.request.clone(),
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
            consumed: r
                .consumed_capacity
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect(),
        })
        .collect();
    let config = alloc
        .config
        .iter()
        .flatten()
        .filter_map(|c| {
            c.opaque.as_ref().map(|o| OpaqueConfig {
                source: c.source.clone(),
                requests: c.requests.clone().unwrap_or_default(),
                driver: o.driver.clone(),
                parameters: o.parameters.0.clone(),
            })
        })
        .collect();
    let ns = want.namespace.as_str();
    let pods = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| format!("{ns}/{}", r.name))
        .collect();
    Ok(Allocation {
        devices,
        config,
        pods,
    })
}
