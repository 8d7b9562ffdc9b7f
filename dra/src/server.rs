//! The kubelet's two gRPC services on unix sockets: the registration
//! service (in the kubelet's `plugins_registry` directory, where the
//! kubelet finds it) and the DRA node service v1 (the endpoint registration
//! names), wired to [`crate::node`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::api::ClaimSource;
use crate::claim::ClaimRef;
use crate::gpus::Inventory;
use crate::node::Node;
use crate::proto::dra::{self, dra_plugin_server::DraPluginServer};
use crate::proto::registration::{self, registration_server::RegistrationServer};

/// `PluginInfo.type` of a DRA driver.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA node service this plugin serves, as registration lists it.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["v1.DRAPlugin"];

/// The registration service.
pub struct Registration {
    pub driver: String,
    pub endpoint: PathBuf,
    /// The kubelet's last verdict: None before it gave one, else
    /// Ok(()) registered, Err(why) not.
    pub status: watch::Sender<Option<Result<(), String>>>,
}

#[tonic::async_trait]
impl registration::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<registration::InfoRequest>,
    ) -> Result<Response<registration::PluginInfo>, Status> {
        Ok(Response::new(registration::PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.driver.clone(),
            endpoint: self.endpoint.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        r: Request<registration::RegistrationStatus>,
    ) -> Result<Response<registration::RegistrationStatusResponse>, Status> {
        let r = r.into_inner();
        let v = if r.plugin_registered {
            eprintln!("cuslice-dra-plugin: registered with the kubelet");
            Ok(())
        } else {
            eprintln!(
                "cuslice-dra-plugin: the kubelet refused the registration: {}",
                r.error
            );
            Err(r.error)
        };
        self.status.send_replace(Some(v));
        Ok(Response::new(registration::RegistrationStatusResponse {}))
    }
}

/// The DRA node service.
pub struct Plugin {
    pub node: Arc<Node>,
    pub claims: Arc<dyn ClaimSource>,
    pub gpus: Arc<dyn Inventory>,
}

impl Plugin {
    async fn prepare_one(
        &self,
        c: &dra::Claim,
        gpus: &Result<Vec<crate::gpus::Gpu>, String>,
    ) -> Result<Vec<dra::Device>, String> {
        let want = ClaimRef {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
        };
        crate::node::check_uid(&want.uid)?;
        let claim = self.claims.get(&want.namespace, &want.name).await?;
        let alloc = crate::api::allocation(&claim, &want)?;
        let gpus = gpus
            .as_ref()
            .map_err(|e| format!("cannot list this node's GPUs: {e}"))?;
        let node = self.node.clone();
        let gpus = gpus.clone();
        let devices = tokio::task::spawn_blocking(move || node.prepare(&want, &alloc, &gpus))
            .await
            .map_err(|e| format!("prepare failed: {e}"))??;
        Ok(devices
            .into_iter()
            .map(|d| dra::Device {
                request_names: d.request_names,
                pool_name: d.pool_name,
                device_name: d.device_name,
                cdi_device_ids: d.cdi_device_ids,
            })
            .collect())
    }
}

#[tonic::async_trait]
impl dra::dra_plugin_server::DraPlugin for Plugin {
    async fn node_prepare_resources(
        &self,
        r: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let gpus = self.gpus.gpus();
        let mut out = dra::NodePrepareResourcesResponse::default();
        for c in r.into_inner().claims {
            let entry = match self.prepare_one(&c, &gpus).await {
                Ok(devices) => dra::NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(e) => {
                    let e = claim_error(&c.namespace, &c.name, &c.uid, &e);
                    eprintln!("cuslice-dra-plugin: prepare: {e}");
                    dra::NodePrepareResourceResponse {
                        devices: vec![],
                        error: e,
                    }
                }
            };
            out.claims.insert(c.uid, entry);
        }
        Ok(Response::new(out))
    }

    async fn node_unprepare_resources(
        &self,
        r: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let mut out = dra::NodeUnprepareResourcesResponse::default();
        for c in r.into_inner().claims {
            let node = self.node.clone();
            let uid = c.uid.clone();
            let r = tokio::task::spawn_blocking(move || node.unprepare(&uid))
                .await
                .map_err(|e| format!("unprepare failed: {e}"))
                .and_then(|r| r);
            let error = match r {
                Ok(()) => String::new(),
                Err(e) => {
                    let e = claim_error(&c.namespace, &c.name, &c.uid, &e);
                    eprintln!("cuslice-dra-plugin: unprepare: {e}");
                    e
                }
            };
            out.claims
                .insert(c.uid, dra::NodeUnprepareResourceResponse { error });
        }
        Ok(Response::new(out))
    }
}

/// A claim's error, for the plugin's log and the kubelet: one line, what
/// the claim's author wrote escaped (a parameter's unknown key reaches
/// serde's message verbatim: a newline or terminal escapes in it would
/// forge log lines).
fn claim_error(namespace: &str, name: &str, uid: &str, e: &str) -> String {
    cuslice_host::text::clean_to(
        &format!("claim {namespace}/{name} ({uid}): {e}"),
        cuslice_host::text::LINE_MAX,
    )
}

/// A unix socket to serve on: a stale socket of an earlier run removed
/// (anything else there is left and is an error).
fn listen(path: &Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(|e| format!("{}: {e}", path.display()))?
        }
        Ok(_) => return Err(format!("{}: exists and is not a socket", path.display())),
        Err(_) => {}
    }
    tokio::net::UnixListener::bind(path)
        .map_err(|e| format!("{}: cannot listen: {e}", path.display()))
}

/// Serves both services until `stop` resolves; the sockets are removed
/// then (the kubelet takes a vanished registration socket as the plugin's
/// going away).
pub async fn serve(
    registration: Registration,
    registration_socket: &Path,
    plugin: Plugin,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let dra_socket = registration.endpoint.clone();
    let dra_listener = listen(&dra_socket)?;
    let reg_listener = listen(registration_socket)?;
    let (tx, rx) = watch::channel(false);
    let wait = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let dra_server = tonic::transport::Server::builder()
        .add_service(DraPluginServer::new(plugin))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(dra_listener),
            wait(rx.clone()),
        );
    let reg_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(registration))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(reg_listener),
            wait(rx),
        );
    let stopper = async move {
        stop.await;
        let _ = tx.send(true);
    };
    let (a, b, ()) = tokio::join!(dra_server, reg_server, stopper);
    let _ = std::fs::remove_file(registration_socket);
    let _ = std::fs::remove_file(&dra_socket);
    a.map_err(|e| format!("{}: {e}", dra_socket.display()))?;
    b.map_err(|e| format!("{}: {e}", registration_socket.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_claims_error_is_one_line_with_what_its_author_wrote_escaped() {
        let e = super::claim_error(
            "ns",
            "c",
            "uid-1",
            "unknown field `x\n\u{1b}[2Jcuslice-dra-plugin: forged`",
        );
        assert!(!e.contains('\n') && !e.contains('\u{1b}'), "{e}");
        assert!(e.starts_with("claim ns/c (uid-1): unknown field"), "{e}");
    }
}
