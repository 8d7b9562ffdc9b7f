//! The API server's side: a claim's allocation, looked up by the kubelet's
//! (namespace, name) and checked to be the claim of that UID. Behind
//! [`ClaimSource`], so that tests can serve claims without a cluster.

use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::claim::{AllocatedDevice, Allocation, ClaimRef, OpaqueConfig};

/// Where ResourceClaims come from.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String>;
}

/// The API server, through kube.
pub struct Kube(pub kube::Client);

#[tonic::async_trait]
impl ClaimSource for Kube {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        kube::Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| format!("cannot get ResourceClaim {namespace}/{name}: {e}"))
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
