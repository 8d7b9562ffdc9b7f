//! The plugin as a kubelet sees it, without a cluster: this test plays the
//! kubelet over the plugin's unix sockets (method paths written out here,
//! not taken from the generated client) and the API server (a fake
//! ClaimSource, and a fake HTTP API server for the kube client).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cuslice_dra::api::ClaimSource;
use cuslice_dra::claim::Driver;
use cuslice_dra::gpus::{Fixed, Gpu};
use cuslice_dra::node::{Config, Node};
use cuslice_dra::proto::{dra, registration};
use cuslice_dra::server;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint, Uri};

const DRIVER: &str = "gpu.cuslice.io";
const H200: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";

fn gpus() -> Vec<Gpu> {
    vec![Gpu {
        index: 0,
        uuid: H200.into(),
        memory: 141 << 30,
        minor: 0,
        product: "NVIDIA H200".into(),
        compute_capability: None,
    }]
}

/// A ResourceClaim as the API server returns it once allocated.
fn resource_claim(
    ns: &str,
    name: &str,
    uid: &str,
    driver: &str,
    consumed: &[(&str, &str)],
    params: Option<serde_json::Value>,
) -> ResourceClaim {
    let consumed: BTreeMap<&str, &str> = consumed.iter().copied().collect();
    let config: Vec<serde_json::Value> = params
        .into_iter()
        .map(|p| {
            serde_json::json!({"source": "FromClaim", "requests": ["gpu"],
                "opaque": {"driver": driver, "parameters": p}})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": ns, "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.cuslice.io"}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": driver, "pool": "node-1", "device": "gpu-0",
                         "shareID": "9f0c6c3e-7b1a-4c55-8d7e-1f2a3b4c5d6e",
                         "consumedCapacity": consumed}],
            "config": config,
        }}},
    }))
    .expect("a ResourceClaim")
}

/// The API server, played by a map (namespace/name -> claim).
#[derive(Default, Clone)]
struct FakeClaims {
    claims: Arc<Mutex<BTreeMap<String, ResourceClaim>>>,
    /// How many lookups it answered.
    lookups: Arc<std::sync::atomic::AtomicUsize>,
}

impl FakeClaims {
    fn put(&self, c: ResourceClaim) {
        let key = format!(
            "{}/{}",
            c.metadata.namespace.clone().unwrap_or_default(),
            c.metadata.name.clone().unwrap_or_default()
        );
        self.claims.lock().expect("lock").insert(key, c);
    }

    fn delete(&self, ns: &str, name: &str) {
        self.claims
            .lock()
            .expect("lock")
            .remove(&format!("{ns}/{name}"));
    }
}

#[tonic::async_trait]
impl ClaimSource for FakeClaims {
    async fn lookup(&self, ns: &str, name: &str) -> Result<Option<ResourceClaim>, String> {
        let found = self
            .claims
            .lock()
            .expect("lock")
            .get(&format!("{ns}/{name}"))
            .cloned();
        // Counted once answered: a test that waits for a lookup knows its
        // answer was made.
        self.lookups
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(found)
    }
}

struct Running {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), String>>,
    status: tokio::sync::watch::Receiver<Option<Result<(), String>>>,
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().expect("once").send(());
        self.task.await.expect("joined").expect("served");
    }
}

fn paths(t: &Path) -> (PathBuf, PathBuf) {
    (
        t.join("plugins_registry")
            .join(format!("{DRIVER}-reg.sock")),
        t.join("plugins").join(DRIVER).join("dra.sock"),
    )
}

fn node_config(t: &Path) -> Config {
    Config {
        driver: Driver {
            name: DRIVER.into(),
            pool: "node-1".into(),
        },
        root: t.join("run/cuslice"),
        cdi_dir: t.join("cdi"),
        state_dir: t.join("plugins").join(DRIVER),
        cuslice: "/usr/bin/cuslice".into(),
        lib: None,
        lock_wait: cuslice_dra::node::LOCK_WAIT,
    }
}

/// Starts a plugin (a new Node from the checkpoint) and waits for its
/// sockets.
async fn start(t: &Path, claims: Arc<dyn ClaimSource>) -> Running {
    start_node(
        t,
        Arc::new(Node::open(node_config(t)).expect("node")),
        claims,
    )
    .await
}

async fn start_node(t: &Path, node: Arc<Node>, claims: Arc<dyn ClaimSource>) -> Running {
    let (reg, dra_sock) = paths(t);
    let (status, rx) = tokio::sync::watch::channel(None);
    let registration = server::Registration {
        driver: DRIVER.into(),
        endpoint: dra_sock.clone(),
        status,
    };
    let plugin = server::Plugin {
        node,
        claims,
        gpus: Arc::new(Fixed(gpus())),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server::serve(registration, &reg, plugin, async {
            let _ = stopped.await;
        })
        .await
    });
    let (reg, _) = paths(t);
    // Up to 60 s (a loaded machine), returning once both are there.
    for _ in 0..6000 {
        if reg.exists() && dra_sock.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    Running {
        stop: Some(stop),
        task,
        status: rx,
    }
}

/// A gRPC channel over a unix socket, as the kubelet dials it.
async fn dial(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .expect("connected")
}

/// One unary call by its full method path.
async fn call<Q, R>(ch: &Channel, path: &'static str, req: Q) -> R
where
    Q: prost::Message + Send + Sync + 'static,
    R: prost::Message + Default + Send + Sync + 'static,
{
    let mut g = tonic::client::Grpc::new(ch.clone());
    g.ready().await.expect("ready");
    g.unary(
        tonic::Request::new(req),
        PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::default(),
    )
    .await
    .expect("call")
    .into_inner()
}

const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";
const NOTIFY: &str = "/pluginregistration.Registration/NotifyRegistrationStatus";
const PREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources";
const UNPREPARE: &str = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources";

fn claim(ns: &str, name: &str, uid: &str) -> dra::Claim {
    dra::Claim {
        namespace: ns.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

async fn prepare(ch: &Channel, claims: Vec<dra::Claim>) -> dra::NodePrepareResourcesResponse {
    call(ch, PREPARE, dra::NodePrepareResourcesRequest { claims }).await
}

async fn unprepare(ch: &Channel, claims: Vec<dra::Claim>) -> dra::NodeUnprepareResourcesResponse {
    call(ch, UNPREPARE, dra::NodeUnprepareResourcesRequest { claims }).await
}

const TRAINER: &str = "aaaaaaaa-0000-4000-8000-000000000001";
const INFER: &str = "aaaaaaaa-0000-4000-8000-000000000002";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_prepare_restart_unprepare() {
    let t = tempfile::tempdir().expect("tmp");
    let api = FakeClaims::default();
    api.put(resource_claim(
        "team-a",
        "trainer",
        TRAINER,
        DRIVER,
        &[("memory", "40Gi"), ("compute", "50")],
        None,
    ));
    api.put(resource_claim(
        "team-b",
        "infer",
        INFER,
        DRIVER,
        &[("memory", "16Gi"), ("compute", "20")],
        Some(
            serde_json::json!({"apiVersion": "gpu.cuslice.io/v1alpha1", "kind": "SliceConfig",
            "computeMax": 40, "latency": true, "memoryMax": "32Gi", "memoryWait": "30s"}),
        ),
    ));
    let p = start(t.path(), Arc::new(api.clone())).await;
    let (reg, dra_sock) = paths(t.path());

    // Registration, as the kubelet's plugin watcher does it.
    let ch = dial(&reg).await;
    let info: registration::PluginInfo = call(&ch, GET_INFO, registration::InfoRequest {}).await;
    assert_eq!(
        info,
        registration::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: DRIVER.into(),
            endpoint: dra_sock.to_string_lossy().into_owned(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        }
    );
    let _: registration::RegistrationStatusResponse = call(
        &ch,
        NOTIFY,
        registration::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        },
    )
    .await;
    assert_eq!(*p.status.borrow(), Some(Ok(())));

    // Two claims on one GPU.
    let ch = dial(&dra_sock).await;
    let r = prepare(
        &ch,
        vec![
            claim("team-a", "trainer", TRAINER),
            claim("team-b", "infer", INFER),
        ],
    )
    .await;
    assert_eq!(r.claims.len(), 2);
    for uid in [TRAINER, INFER] {
        assert_eq!(
            r.claims[uid],
            dra::NodePrepareResourceResponse {
                devices: vec![dra::Device {
                    request_names: vec!["gpu".into()],
                    pool_name: "node-1".into(),
                    device_name: "gpu-0".into(),
                    cdi_device_ids: vec![format!("cuslice.io/claim={uid}")],
                }],
                error: String::new(),
            }
        );
    }
    let quota = |uid: &str| {
        let text = std::fs::read_to_string(
            t.path()
                .join("run/cuslice/claims")
                .join(uid)
                .join("quota.toml"),
        )
        .expect("quota file");
        cuslice_core::config::parse_file(Path::new("q"), &text).expect("the shim reads it")
    };
    let u = cuslice_core::config::parse_uuid(H200).expect("uuid");
    let q = quota(TRAINER);
    assert_eq!(q.tenant.as_deref(), Some("team-a/trainer"));
    assert_eq!(
        q.by_uuid[&u],
        cuslice_core::config::Limits {
            memory: Some(40 << 30),
            memory_max: None,
            compute: Some(50),
            compute_max: None
        }
    );
    assert!(!q.latency);
    let q = quota(INFER);
    // Its opaque config's memoryMax (what it may burst to) and
    // memoryWait (how long a refused allocation waits) reach its quota
    // file as the shim reads them.
    assert_eq!(
        q.by_uuid[&u],
        cuslice_core::config::Limits {
            memory: Some(16 << 30),
            memory_max: Some(32 << 30),
            compute: Some(20),
            compute_max: Some(40)
        }
    );
    assert!(q.latency);
    assert_eq!(q.memory_wait_ms, Some(30_000));
    assert_eq!(quota(TRAINER).memory_wait_ms, None);
    let spec = |uid: &str| t.path().join(format!("cdi/cuslice.io-claim_{uid}.json"));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(spec(INFER)).expect("spec")).expect("json");
    assert_eq!(s["kind"], "cuslice.io/claim");
    assert_eq!(s["devices"][0]["name"], INFER);
    assert_eq!(
        s["devices"][0]["containerEdits"]["hooks"][0]["args"],
        serde_json::json!([
            "cuslice",
            "oci-hook",
            "create",
            "--root",
            t.path().join("run/cuslice").to_string_lossy(),
            "--claim",
            INFER
        ])
    );

    // A restart between prepare and unprepare: a new plugin, from the
    // checkpoint alone.
    drop(ch);
    p.stop().await;
    assert!(!reg.exists() && !dra_sock.exists(), "sockets removed");
    let p = start(t.path(), Arc::new(FakeClaims::default())).await;
    let ch = dial(&dra_sock).await;
    // Prepared again (the kubelet retries): the API has no such claim now.
    let r = prepare(&ch, vec![claim("team-a", "trainer", TRAINER)]).await;
    assert!(
        r.claims[TRAINER].error.contains("\"trainer\" not found"),
        "{:?}",
        r.claims[TRAINER]
    );
    let r = unprepare(
        &ch,
        vec![
            claim("team-a", "trainer", TRAINER),
            claim("team-b", "infer", INFER),
        ],
    )
    .await;
    assert_eq!(r.claims.len(), 2);
    assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");
    for uid in [TRAINER, INFER] {
        assert!(!spec(uid).exists());
        assert!(!t.path().join("run/cuslice/claims").join(uid).exists());
    }
    // Again: nothing to do, no error.
    let r = unprepare(&ch, vec![claim("team-a", "trainer", TRAINER)]).await;
    assert_eq!(r.claims[TRAINER].error, "");
    let cp: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            t.path()
                .join("plugins")
                .join(DRIVER)
                .join("checkpoint.json"),
        )
        .expect("checkpoint"),
    )
    .expect("json");
    assert_eq!(cp["claims"], serde_json::json!({}));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_claims_get_their_own_error_and_no_files() {
    let t = tempfile::tempdir().expect("tmp");
    let api = FakeClaims::default();
    let uid = |n: u32| format!("bbbbbbbb-0000-4000-8000-{n:012}");
    api.put(resource_claim(
        "ns",
        "greedy",
        &uid(1),
        DRIVER,
        &[("memory", "200Gi"), ("compute", "50")],
        None,
    ));
    api.put(resource_claim(
        "ns",
        "hog",
        &uid(2),
        DRIVER,
        &[("memory", "4Gi"), ("compute", "150")],
        None,
    ));
    api.put(resource_claim(
        "ns",
        "odd",
        &uid(3),
        DRIVER,
        &[("memory", "4Gi"), ("compute", "50")],
        Some(serde_json::json!({"computeMax": 60, "priority": "high"})),
    ));
    api.put(resource_claim(
        "ns",
        "theirs",
        &uid(4),
        "gpu.nvidia.com",
        &[("memory", "4Gi"), ("compute", "50")],
        None,
    ));
    api.put(resource_claim(
        "ns",
        "good",
        &uid(5),
        DRIVER,
        &[("memory", "4Gi"), ("compute", "50")],
        None,
    ));
    let mut gone = resource_claim(
        "ns",
        "gone",
        &uid(6),
        DRIVER,
        &[("memory", "4Gi"), ("compute", "50")],
        None,
    );
    if let Some(r) = gone
        .status
        .as_mut()
        .and_then(|s| s.allocation.as_mut())
        .and_then(|a| a.devices.as_mut())
        .and_then(|d| d.results.as_mut())
    {
        r[0].device = "gpu-3".into();
    }
    api.put(gone);
    let p = start(t.path(), Arc::new(api)).await;
    let (_, dra_sock) = paths(t.path());
    let ch = dial(&dra_sock).await;
    let names = ["greedy", "hog", "odd", "theirs", "good", "gone"];
    let mut claims: Vec<dra::Claim> = names
        .iter()
        .enumerate()
        .map(|(i, n)| claim("ns", n, &uid(i as u32 + 1)))
        .collect();
    // Recreated under the same name: another uid than the kubelet's.
    claims.push(claim("ns", "good", &uid(7)));
    let r = prepare(&ch, claims).await;
    let err = |n: u32| r.claims[&uid(n)].error.clone();
    assert_eq!(
        err(1),
        format!(
            "claim ns/greedy ({}): device gpu-0: the claim asks 200GiB of memory, the GPU ({H200}) has 141GiB",
            uid(1)
        )
    );
    assert!(
        err(2).ends_with("consumed capacity compute: expected 1 to 100, got 150"),
        "{}",
        err(2)
    );
    assert!(err(3).contains("unknown field `priority`"), "{}", err(3));
    assert!(err(4).ends_with("the claim's allocation is not ours: no device of driver gpu.cuslice.io, only of gpu.nvidia.com"), "{}", err(4));
    assert_eq!(err(5), "");
    assert!(
        err(6).contains("device gpu-3 is not on this node (its GPUs: gpu-0)"),
        "{}",
        err(6)
    );
    assert!(
        err(7).ends_with(&format!(
            "ResourceClaim ns/good has uid \"{}\", the kubelet asked for \"{}\"",
            uid(5),
            uid(7)
        )),
        "{}",
        err(7)
    );
    for n in [1, 2, 3, 4, 6, 7] {
        assert!(r.claims[&uid(n)].devices.is_empty());
        assert!(!t.path().join("run/cuslice/claims").join(uid(n)).exists());
        assert!(
            !t.path()
                .join(format!("cdi/cuslice.io-claim_{}.json", uid(n)))
                .exists()
        );
    }
    assert!(
        t.path()
            .join("run/cuslice/claims")
            .join(uid(5))
            .join("quota.toml")
            .exists()
    );
    p.stop().await;
}

/// How the fake API server answers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Each claim it has, and a NotFound naming one it has not (as the
    /// real API server words it).
    Claims,
    /// 500 to everything.
    Failing,
    /// 404 without naming the claim: what an API server answers for a
    /// resource it does not serve.
    NotServed,
}

/// A fake API server answering GET resourceclaims from `claims`, as
/// `answer` says; a kube client for it, and the requests it saw.
async fn api_server(
    claims: FakeClaims,
    answer: Arc<Mutex<Answer>>,
) -> (kube::Client, Arc<Mutex<Vec<String>>>) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let (served, seen, answer) = (claims.clone(), seen2.clone(), answer.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (served, seen, answer) = (served.clone(), seen.clone(), answer.clone());
                        async move {
                            let path = req.uri().path().to_string();
                            seen.lock()
                                .expect("lock")
                                .push(format!("{} {path}", req.method()));
                            let parts: Vec<&str> =
                                path.trim_start_matches('/').split('/').collect();
                            let name = match parts[..] {
                                [
                                    "apis",
                                    "resource.k8s.io",
                                    "v1",
                                    "namespaces",
                                    ns,
                                    "resourceclaims",
                                    name,
                                ] => Some((ns, name)),
                                _ => None,
                            };
                            let status = |code: u16, reason: &str, message: String, details| {
                                serde_json::json!({
                                    "kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Failure", "message": message, "reason": reason,
                                    "details": details, "code": code
                                })
                            };
                            let mode = *answer.lock().expect("lock");
                            let (code, body) = match (mode, name) {
                                (Answer::Failing, _) => (
                                    500,
                                    status(
                                        500,
                                        "InternalError",
                                        "etcdserver: request timed out".into(),
                                        serde_json::json!({}),
                                    ),
                                ),
                                (Answer::NotServed, _) | (_, None) => (
                                    404,
                                    status(
                                        404,
                                        "NotFound",
                                        "the server could not find the requested resource".into(),
                                        serde_json::json!({}),
                                    ),
                                ),
                                (Answer::Claims, Some((ns, name))) => {
                                    match served.lookup(ns, name).await.ok().flatten() {
                                        Some(c) => (200, serde_json::to_value(&c).expect("json")),
                                        None => (
                                            404,
                                            status(
                                                404,
                                                "NotFound",
                                                format!(
                                                    "resourceclaims.resource.k8s.io \"{name}\" not found"
                                                ),
                                                serde_json::json!({"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"}),
                                            ),
                                        ),
                                    }
                                }
                            };
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(code)
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(
                                        serde_json::to_vec(&body).expect("json"),
                                    )))
                                    .expect("response"),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    let cfg = kube::Config::new(format!("http://{addr}").parse().expect("uri"));
    (kube::Client::try_from(cfg).expect("client"), seen)
}

/// The kube client path: a fake API server answering GET resourceclaims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kube_client_reads_claims_from_the_api_server() {
    let claims = FakeClaims::default();
    claims.put(resource_claim(
        "team-a",
        "trainer",
        TRAINER,
        DRIVER,
        &[("memory", "40Gi"), ("compute", "50")],
        None,
    ));
    let (client, seen) = api_server(claims, Arc::new(Mutex::new(Answer::Claims))).await;
    let source = cuslice_dra::api::Kube(client);
    let t = tempfile::tempdir().expect("tmp");
    let p = start(t.path(), Arc::new(source)).await;
    let (_, dra_sock) = paths(t.path());
    let ch = dial(&dra_sock).await;
    let r = prepare(
        &ch,
        vec![
            claim("team-a", "trainer", TRAINER),
            claim("team-a", "nope", INFER),
        ],
    )
    .await;
    assert_eq!(r.claims[TRAINER].error, "");
    assert_eq!(
        r.claims[TRAINER].devices[0].cdi_device_ids,
        [format!("cuslice.io/claim={TRAINER}")]
    );
    assert!(
        r.claims[INFER]
            .error
            .contains("cannot get ResourceClaim team-a/nope: "),
        "{}",
        r.claims[INFER].error
    );
    assert_eq!(
        seen.lock().expect("lock")[..],
        [
            "GET /apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/trainer".to_string(),
            "GET /apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/nope".into(),
        ]
    );
    p.stop().await;
}

/// Whether claim `uid`'s files are on the node: its directory, its CDI
/// spec and its checkpoint entry (all three or none, else a panic).
fn on_node(t: &Path, uid: &str) -> bool {
    let (dir, spec, entry) = claim_files(t, uid);
    assert!(
        dir == spec && spec == entry,
        "{uid}: directory {dir}, CDI spec {spec}, checkpoint entry {entry}"
    );
    dir
}

/// Whether claim `uid`'s directory, CDI spec and checkpoint entry are on
/// the node. An unprepare removes them one after another (the checkpoint
/// entry last, so that a plugin that dies in between finishes at its next
/// start): a look while one runs may find some of them, which only
/// settled states ([`on_node`]) may not.
fn claim_files(t: &Path, uid: &str) -> (bool, bool, bool) {
    let dir = t.join("run/cuslice/claims").join(uid).exists();
    let spec = t.join(format!("cdi/cuslice.io-claim_{uid}.json")).exists();
    // The checkpoint is replaced whole (renamed into place): a read sees
    // the old or the new one.
    let cp = std::fs::read_to_string(t.join("plugins").join(DRIVER).join("checkpoint.json"))
        .expect("checkpoint");
    let cp: serde_json::Value = serde_json::from_str(&cp).expect("json");
    (dir, spec, cp["claims"].get(uid).is_some())
}

const JOB: &str = "aaaaaaaa-0000-4000-8000-000000000003";
const IDLE: &str = "aaaaaaaa-0000-4000-8000-000000000004";
const BY_HAND: &str = "aaaaaaaa-0000-4000-8000-000000000005";

/// Prepared claims the kubelet never unprepared: a pass unprepares those
/// the API server (through kube, against the fake API server) no longer
/// has, has under another UID or no longer allocated here, keeps the one
/// it still has and the one prepared by hand, and keeps everything while
/// the API server does not tell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_pass_unprepares_claims_gone_from_the_api_server_and_keeps_the_others() {
    use cuslice_dra::cleanup;
    let t = tempfile::tempdir().expect("tmp");
    let api = FakeClaims::default();
    let rc = |ns: &str, name: &str, uid: &str| {
        resource_claim(
            ns,
            name,
            uid,
            DRIVER,
            &[("memory", "8Gi"), ("compute", "10")],
            None,
        )
    };
    api.put(rc("team-a", "trainer", TRAINER));
    api.put(rc("team-b", "infer", INFER));
    api.put(rc("team-c", "job", JOB));
    api.put(rc("team-d", "idle", IDLE));
    let answer = Arc::new(Mutex::new(Answer::Claims));
    let (client, seen) = api_server(api.clone(), answer.clone()).await;
    let claims: Arc<dyn ClaimSource> = Arc::new(cuslice_dra::api::Kube(client));
    let node = Arc::new(Node::open(node_config(t.path())).expect("node"));
    let p = start_node(t.path(), node.clone(), claims.clone()).await;
    let (_, dra_sock) = paths(t.path());
    let ch = dial(&dra_sock).await;
    let r = prepare(
        &ch,
        vec![
            claim("team-a", "trainer", TRAINER),
            claim("team-b", "infer", INFER),
            claim("team-c", "job", JOB),
            claim("team-d", "idle", IDLE),
        ],
    )
    .await;
    assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");
    // And one by hand, of a claim the API server never had.
    let alloc = cuslice_dra::api::allocation(
        &rc("ops", "try", BY_HAND),
        &cuslice_dra::claim::ClaimRef {
            namespace: "ops".into(),
            name: "try".into(),
            uid: BY_HAND.into(),
        },
    )
    .expect("allocation");
    node.prepare_by_hand(
        &cuslice_dra::claim::ClaimRef {
            namespace: "ops".into(),
            name: "try".into(),
            uid: BY_HAND.into(),
        },
        &alloc,
        &gpus(),
    )
    .expect("by hand");
    let all = [TRAINER, INFER, JOB, IDLE, BY_HAND];

    // All there: all kept.
    let pass = cleanup::pass(&node, claims.as_ref()).await;
    assert_eq!(
        pass,
        cleanup::Pass {
            kept: 4,
            by_hand: 1,
            ..cleanup::Pass::default()
        }
    );
    assert!(all.iter().all(|u| on_node(t.path(), u)));

    // The pods went while the plugin was down: trainer deleted, job
    // deleted and made again under its name, idle deallocated.
    api.delete("team-a", "trainer");
    api.put(rc("team-c", "job", "cccccccc-0000-4000-8000-000000000003"));
    let mut idle = rc("team-d", "idle", IDLE);
    idle.status = None;
    api.put(idle);

    // The API server failing, or answering 404 for the whole resource
    // (not naming the claim), or not there at all: nothing is touched.
    *answer.lock().expect("lock") = Answer::Failing;
    let pass = cleanup::pass(&node, claims.as_ref()).await;
    assert_eq!(
        pass,
        cleanup::Pass {
            unchecked: 4,
            by_hand: 1,
            ..cleanup::Pass::default()
        }
    );
    *answer.lock().expect("lock") = Answer::NotServed;
    let pass = cleanup::pass(&node, claims.as_ref()).await;
    assert_eq!((pass.unprepared.len(), pass.unchecked), (0, 4));
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let unreachable = cuslice_dra::api::Kube(
        kube::Client::try_from(kube::Config::new(
            format!("http://{addr}").parse().expect("uri"),
        ))
        .expect("client"),
    );
    let pass = cleanup::pass(&node, &unreachable).await;
    assert_eq!((pass.unprepared.len(), pass.unchecked), (0, 4));
    assert!(all.iter().all(|u| on_node(t.path(), u)));

    // Answering again: the next pass unprepares the three gone, looked up
    // once and again under the node lock, and keeps infer and the claim
    // prepared by hand.
    *answer.lock().expect("lock") = Answer::Claims;
    seen.lock().expect("lock").clear();
    let pass = cleanup::pass(&node, claims.as_ref()).await;
    assert_eq!(
        pass,
        cleanup::Pass {
            unprepared: vec![TRAINER.into(), JOB.into(), IDLE.into()],
            kept: 1,
            by_hand: 1,
            ..cleanup::Pass::default()
        }
    );
    for uid in [TRAINER, JOB, IDLE] {
        assert!(!on_node(t.path(), uid), "{uid} cleaned up");
    }
    assert!(on_node(t.path(), INFER) && on_node(t.path(), BY_HAND));
    let gets = |name: &str| {
        seen.lock()
            .expect("lock")
            .iter()
            .filter(|s| s.ends_with(&format!("/resourceclaims/{name}")))
            .count()
    };
    assert_eq!(
        (gets("trainer"), gets("job"), gets("idle"), gets("infer")),
        (2, 2, 2, 1)
    );
    // The kubelet's unprepare, should it come after all: nothing to do.
    let r = unprepare(&ch, vec![claim("team-a", "trainer", TRAINER)]).await;
    assert_eq!(r.claims[TRAINER].error, "");
    // The next pass finds nothing more to do.
    let pass = cleanup::pass(&node, claims.as_ref()).await;
    assert_eq!((pass.unprepared.len(), pass.kept), (0, 1));
    p.stop().await;
}

/// The plugin's cleanup runs at start (a claim deleted while the plugin
/// was down) and then every interval (a claim deleted while it runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleanup_runs_at_start_and_then_every_interval() {
    let t = tempfile::tempdir().expect("tmp");
    let api = FakeClaims::default();
    for (ns, name, uid) in [("team-a", "trainer", TRAINER), ("team-b", "infer", INFER)] {
        api.put(resource_claim(
            ns,
            name,
            uid,
            DRIVER,
            &[("memory", "8Gi"), ("compute", "10")],
            None,
        ));
    }
    let p = start(t.path(), Arc::new(api.clone())).await;
    let (_, dra_sock) = paths(t.path());
    let ch = dial(&dra_sock).await;
    let r = prepare(
        &ch,
        vec![
            claim("team-a", "trainer", TRAINER),
            claim("team-b", "infer", INFER),
        ],
    )
    .await;
    assert!(r.claims.values().all(|c| c.error.is_empty()), "{r:?}");
    drop(ch);
    p.stop().await;
    // Deleted while no plugin ran.
    api.delete("team-a", "trainer");
    let node = Arc::new(Node::open(node_config(t.path())).expect("node"));
    let claims: Arc<dyn ClaimSource> = Arc::new(api.clone());
    let lookups = || api.lookups.load(std::sync::atomic::Ordering::SeqCst);
    let gone_within = |uid: &'static str| {
        let t = t.path().to_path_buf();
        async move {
            // Polled while the cleanup removes the claim's files one after
            // another: gone once all three are, then settled.
            for _ in 0..1500 {
                if claim_files(&t, uid) == (false, false, false) {
                    return !on_node(&t, uid);
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            false
        }
    };
    // A plugin started with an hour between passes: the one at start.
    let cleaning = tokio::spawn(cuslice_dra::cleanup::keep_clean(
        node.clone(),
        claims.clone(),
        std::time::Duration::from_secs(3600),
    ));
    assert!(gone_within(TRAINER).await, "cleaned up at start");
    assert!(on_node(t.path(), INFER));
    cleaning.abort();
    let _ = cleaning.await;
    // Every 200 ms: once its pass at start is done (infer looked up and
    // kept), infer is deleted while it runs, and a later pass finds it.
    let before = lookups();
    let cleaning = tokio::spawn(cuslice_dra::cleanup::keep_clean(
        node.clone(),
        claims.clone(),
        std::time::Duration::from_millis(200),
    ));
    for _ in 0..3000 {
        if lookups() > before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(lookups() > before, "a pass at start");
    assert!(on_node(t.path(), INFER), "kept: the API server has it");
    api.delete("team-b", "infer");
    assert!(gone_within(INFER).await, "cleaned up by a later pass");
    cleaning.abort();
}
