//! cuslice's Kubernetes DRA kubelet plugin (`cuslice-dra-plugin`): it
//! registers with the kubelet, serves the DRA node service v1, and turns
//! each ResourceClaim's consumed capacity (`memory`, `compute`) and opaque
//! configuration into a quota file and a per-claim CDI spec whose hook
//! gives the container that slice (see [`node`]).
//!
//! Its own crate, so that the shim and the `cuslice` command stay lean
//! (tokio, tonic, kube live only here).

pub mod api;
pub mod claim;
pub mod cleanup;
pub mod gpus;
pub mod node;
pub mod publish;
pub mod quantity;
pub mod server;
pub mod slice;

/// The kubelet's gRPC messages and services, generated at build time from
/// proto/ (see build.rs).
pub mod proto {
    /// `pluginregistration` (k8s.io/kubelet/pkg/apis/pluginregistration/v1).
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
    /// `k8s.io.kubelet.pkg.apis.dra.v1`.
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// The compiled descriptors of both (a `FileDescriptorSet`).
    pub const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));
}

/// The driver name this plugin publishes and serves by default.
pub const DEFAULT_DRIVER: &str = "gpu.cuslice.io";
