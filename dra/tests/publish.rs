//! Publishing the node's ResourceSlice through kube, against a fake API
//! server that keeps ResourceSlices and one Node, and records every
//! request: what the scheduler then reads, the server-side apply the API
//! server is asked for, the generation across changes, the Node as owner;
//! an unhealthy GPU tainted (or withdrawn where the API server keeps no
//! taints), republished within 10 s of the event, back only after the
//! quiet period or an operator's clear (the health source on the fake
//! NVML, `FAKE_NVML_HEALTH`).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuslice_dra::gpus::{ComputeCapability, Gpu};
use cuslice_dra::publish::{self, Published};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use k8s_openapi::api::resource::v1::ResourceSlice;

const DRIVER: &str = cuslice_dra::DEFAULT_DRIVER;
const NODE: &str = "node-1";
const NODE_UID: &str = "5a1e7c3b-0f4d-4e8a-9b2c-1d3e5f7a9b0c";

fn gpus() -> Vec<Gpu> {
    vec![
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
            memory: 141 << 30,
            minor: 1,
            product: "NVIDIA H200".into(),
            compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
        },
    ]
}

/// A request the fake API server saw: method, path, query, content type.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: String,
    content_type: String,
}

#[derive(Default)]
struct State {
    slices: HashMap<String, serde_json::Value>,
    seen: Vec<Seen>,
    /// Whether GET nodes answers (else 403, as without the RBAC rule).
    node_readable: bool,
    /// Whether the API server's DRAConsumableCapacity gate is off: it
    /// drops allowMultipleAllocations and requestPolicy.
    gate_off: bool,
    /// Whether its DRADeviceTaints gate is off: it drops devices' taints.
    taints_off: bool,
}

/// A plain number as the API server writes a decimal quantity back: in
/// its canonical form, with the largest power of 1000 as a suffix
/// (`1073741824000` as `1073741824k`).
fn canonical(v: &mut serde_json::Value) {
    let Some(mut n) = v.as_str().and_then(|s| s.parse::<u64>().ok()) else {
        return;
    };
    let mut e = 0;
    while n != 0 && n % 1000 == 0 && e < 6 {
        n /= 1000;
        e += 1;
    }
    *v = format!("{n}{}", ["", "k", "M", "G", "T", "P", "E"][e]).into();
}

/// What an API server keeps of an applied slice: quantities in canonical
/// form, and without the consumable-capacity fields where the gate is off.
fn as_kept(v: &mut serde_json::Value, gate_off: bool, taints_off: bool) {
    for d in v["spec"]["devices"].as_array_mut().into_iter().flatten() {
        let d = d.as_object_mut().expect("device");
        if gate_off {
            d.remove("allowMultipleAllocations");
        }
        if taints_off {
            d.remove("taints");
        }
        for cap in d
            .get_mut("capacity")
            .and_then(|c| c.as_object_mut())
            .into_iter()
            .flat_map(|c| c.values_mut())
        {
            let cap = cap.as_object_mut().expect("capacity");
            if gate_off {
                cap.remove("requestPolicy");
            }
            if let Some(x) = cap.get_mut("value") {
                canonical(x);
            }
            if let Some(p) = cap.get_mut("requestPolicy") {
                if let Some(x) = p.get_mut("default") {
                    canonical(x);
                }
                if let Some(r) = p.get_mut("validRange").and_then(|r| r.as_object_mut()) {
                    r.values_mut().for_each(canonical);
                }
            }
        }
    }
}

fn status(code: u16, reason: &str, message: &str) -> (u16, serde_json::Value) {
    (
        code,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": message, "reason": reason, "code": code}),
    )
}

fn answer(st: &Mutex<State>, method: &str, path: &str, body: &[u8]) -> (u16, serde_json::Value) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut st = st.lock().expect("lock");
    match (method, &parts[..]) {
        ("GET", ["api", "v1", "nodes", name]) if *name == NODE && st.node_readable => (
            200,
            serde_json::json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": NODE, "uid": NODE_UID}}),
        ),
        ("GET", ["api", "v1", "nodes", _]) => status(403, "Forbidden", "nodes is forbidden"),
        ("GET", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            match st.slices.get(*name) {
                Some(v) => (200, v.clone()),
                None => status(404, "NotFound", "resourceslices not found"),
            }
        }
        ("PATCH", ["apis", "resource.k8s.io", "v1", "resourceslices", name]) => {
            // An apply patch is YAML, and JSON is YAML: kube sends JSON.
            let mut v: serde_json::Value = match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(e) => return status(400, "BadRequest", &e.to_string()),
            };
            v["metadata"]["uid"] = "slice-uid".into();
            let (gate_off, taints_off) = (st.gate_off, st.taints_off);
            as_kept(&mut v, gate_off, taints_off);
            st.slices.insert(name.to_string(), v.clone());
            (200, v)
        }
        _ => status(404, "NotFound", "no such path in the fake"),
    }
}

/// Starts the fake API server; returns a kube client for it and its state.
async fn api_server(node_readable: bool) -> (kube::Client, Arc<Mutex<State>>) {
    api_server_with(node_readable, false).await
}

async fn api_server_with(node_readable: bool, gate_off: bool) -> (kube::Client, Arc<Mutex<State>>) {
    api_server_full(node_readable, gate_off, false).await
}

async fn api_server_full(
    node_readable: bool,
    gate_off: bool,
    taints_off: bool,
) -> (kube::Client, Arc<Mutex<State>>) {
    let state = Arc::new(Mutex::new(State {
        node_readable,
        gate_off,
        taints_off,
        ..State::default()
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let st = state.clone();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let st = st.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let st = st.clone();
                        async move {
                            let seen = Seen {
                                method: req.method().to_string(),
                                path: req.uri().path().to_string(),
                                query: req.uri().query().unwrap_or_default().to_string(),
                                content_type: req
                                    .headers()
                                    .get("content-type")
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or_default()
                                    .to_string(),
                            };
                            let body = req
                                .into_body()
                                .collect()
                                .await
                                .map(|b| b.to_bytes())
                                .unwrap_or_default();
                            let (code, v) = answer(&st, &seen.method, &seen.path, &body);
                            st.lock().expect("lock").seen.push(seen);
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .status(code)
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(
                                        serde_json::to_vec(&v).expect("json"),
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
    (kube::Client::try_from(cfg).expect("client"), state)
}

/// The slice the fake API server holds, as the scheduler reads it.
fn stored(state: &Mutex<State>) -> ResourceSlice {
    let v = state.lock().expect("lock").slices[&format!("{NODE}-{DRIVER}")].clone();
    serde_json::from_value(v).expect("a ResourceSlice of resource.k8s.io/v1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_slice_is_applied_owned_by_its_node_and_its_generation_follows_the_gpus() {
    let (client, state) = api_server(true).await;
    let sink = publish::Kube(client);
    let all = gpus();

    // First publish: created at generation 1, owned by the Node.
    let r = publish::publish(&sink, DRIVER, NODE, &all).await;
    assert_eq!(r, Ok(Published::Changed { generation: 1 }));
    let s = stored(&state);
    assert_eq!(s.metadata.name.as_deref(), Some("node-1-gpu.cuslice.io"));
    assert_eq!(s.spec.driver, DRIVER);
    assert_eq!(s.spec.node_name.as_deref(), Some(NODE));
    assert_eq!(
        (s.spec.pool.name.as_str(), s.spec.pool.generation),
        (NODE, 1)
    );
    let devices = s.spec.devices.as_ref().expect("devices");
    assert_eq!(
        devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        ["gpu-0", "gpu-1"]
    );
    assert!(
        devices
            .iter()
            .all(|d| d.allow_multiple_allocations == Some(true))
    );
    let caps = devices[1].capacity.as_ref().expect("capacity");
    assert_eq!(caps["memory"].value.0, (141u64 << 30).to_string());
    assert_eq!(caps["compute"].value.0, "100");
    // The compute capability as a version attribute, as a selector reads it
    // (and read back equal: the next publish finds the devices unchanged).
    let attrs = devices[1].attributes.as_ref().expect("attributes");
    assert_eq!(
        attrs["cudaComputeCapability"].version.as_deref(),
        Some("9.0.0")
    );
    let owner = s.metadata.owner_references.as_ref().expect("owner")[0].clone();
    assert_eq!(
        (
            owner.api_version.as_str(),
            owner.kind.as_str(),
            owner.name.as_str(),
            owner.uid.as_str()
        ),
        ("v1", "Node", NODE, NODE_UID)
    );
    // A server-side apply, forced, by the plugin's field manager.
    let applies: Vec<Seen> = state
        .lock()
        .expect("lock")
        .seen
        .iter()
        .filter(|s| s.method == "PATCH")
        .cloned()
        .collect();
    assert_eq!(applies.len(), 1, "{applies:?}");
    let a = &applies[0];
    assert_eq!(
        a.path,
        "/apis/resource.k8s.io/v1/resourceslices/node-1-gpu.cuslice.io"
    );
    assert_eq!(a.content_type, "application/apply-patch+yaml");
    assert!(
        a.query.contains("fieldManager=cuslice-dra-plugin") && a.query.contains("force=true"),
        "{a:?}"
    );

    // The same GPUs again: the generation stays.
    let r = publish::publish(&sink, DRIVER, NODE, &all).await;
    assert_eq!(r, Ok(Published::Unchanged { generation: 1 }));
    assert_eq!(stored(&state).spec.pool.generation, 1);

    // A GPU gone: one device left, the generation up by one; back: up again.
    let r = publish::publish(&sink, DRIVER, NODE, &all[..1]).await;
    assert_eq!(r, Ok(Published::Changed { generation: 2 }));
    let s = stored(&state);
    assert_eq!(s.spec.pool.generation, 2);
    assert_eq!(s.spec.devices.as_ref().expect("devices").len(), 1);
    let r = publish::publish(&sink, DRIVER, NODE, &all).await;
    assert_eq!(r, Ok(Published::Changed { generation: 3 }));
}

fn patches(state: &Mutex<State>) -> usize {
    let st = state.lock().expect("lock");
    st.seen.iter().filter(|s| s.method == "PATCH").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_kept_as_the_api_server_keeps_it_is_unchanged_and_not_applied_again() {
    // Quantities come back canonical (1073741824k for the 1073741824000
    // bytes of a GPU whose memory is a multiple of 1000); with the
    // DRAConsumableCapacity gate off, without allowMultipleAllocations and
    // request policies. Neither is a change: the generation stays, and a
    // round that finds the slice as it should be applies nothing.
    for gate_off in [false, true] {
        let (client, state) = api_server_with(true, gate_off).await;
        let sink = publish::Kube(client);
        let mut all = gpus();
        all[0].memory = 1000 << 30;
        let r = publish::publish(&sink, DRIVER, NODE, &all).await;
        assert_eq!(r, Ok(Published::Changed { generation: 1 }));
        let caps = stored(&state).spec.devices.expect("devices")[0]
            .capacity
            .clone()
            .expect("capacity");
        assert_eq!(caps["memory"].value.0, "1073741824k");
        let gets_before = state.lock().expect("lock").seen.len();
        for _ in 0..3 {
            let r = publish::publish(&sink, DRIVER, NODE, &all).await;
            assert_eq!(
                r,
                Ok(Published::Unchanged { generation: 1 }),
                "gate off: {gate_off}"
            );
        }
        assert_eq!(patches(&state), 1, "gate off: {gate_off}");
        // One GET of the slice a round, and no GET of the Node: its owner
        // is there already.
        let seen = state.lock().expect("lock").seen[gets_before..].to_vec();
        assert!(
            seen.len() == 3
                && seen
                    .iter()
                    .all(|s| s.method == "GET" && s.path.contains("resourceslices")),
            "{seen:?}"
        );
        // A change still is one.
        let r = publish::publish(&sink, DRIVER, NODE, &all[..1]).await;
        assert_eq!(r, Ok(Published::Changed { generation: 2 }));
        assert_eq!(patches(&state), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_it_cannot_read_leaves_the_slice_published_without_an_owner() {
    let (client, state) = api_server(false).await;
    let sink = publish::Kube(client);
    let r = publish::publish(&sink, DRIVER, NODE, &gpus()).await;
    assert_eq!(r, Ok(Published::Changed { generation: 1 }));
    let s = stored(&state);
    assert!(s.metadata.owner_references.is_none(), "{s:?}");
    assert_eq!(s.spec.devices.as_ref().expect("devices").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_that_refuses_the_slice_is_an_error_naming_it() {
    // No fake at all behind the address: the apply cannot happen.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let cfg = kube::Config::new(format!("http://{addr}").parse().expect("uri"));
    let sink = publish::Kube(kube::Client::try_from(cfg).expect("client"));
    let e = publish::publish(&sink, DRIVER, NODE, &gpus())
        .await
        .expect_err("nothing to publish to");
    assert!(
        e.starts_with("cannot get ResourceSlice node-1-gpu.cuslice.io: "),
        "{e}"
    );
}

/// A GPU judged unhealthy by XID `xid` at `at` (Unix time).
fn sick(uuid: &str, xid: u64, at: f64) -> cuslice_host::gpu::health::file::GpuHealth {
    let mut judge = cuslice_host::gpu::health::Judge::new(at - 10.0, 300.0);
    judge.observe(&cuslice_host::gpu::health::Input::Xid(xid), at);
    cuslice_host::gpu::health::file::GpuHealth {
        index: 1,
        uuid: uuid.into(),
        events: true,
        judge,
    }
}

fn device_taints(
    s: &ResourceSlice,
    name: &str,
) -> Option<Vec<k8s_openapi::api::resource::v1::DeviceTaint>> {
    s.spec
        .devices
        .as_ref()
        .and_then(|d| d.iter().find(|d| d.name == name))
        .and_then(|d| d.taints.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_gpu_is_tainted_where_the_cluster_has_device_taints_and_withdrawn_where_not() {
    let all = gpus();
    let health = [sick(&all[1].uuid, 48, 1_800_000_000.0)];
    let taints = publish::health_taints(DRIVER, &health);
    // Device taints kept: gpu-1 tainted NoSchedule, the taint read back as
    // sent (the next rounds change nothing).
    let (client, state) = api_server(true).await;
    let sink = publish::Kube(client);
    let r = publish::publish_with(&sink, DRIVER, NODE, &all, &taints, false).await;
    assert_eq!(r, Ok((Published::Changed { generation: 1 }, false)));
    let s = stored(&state);
    assert_eq!(device_taints(&s, "gpu-0"), None);
    let t = device_taints(&s, "gpu-1").expect("taint");
    assert_eq!(
        serde_json::to_value(&t).expect("json"),
        serde_json::json!([{"key": "gpu.cuslice.io/unhealthy", "value": "xid-48",
            "effect": "NoSchedule", "timeAdded": "2027-01-15T08:00:00Z"}])
    );
    for _ in 0..2 {
        let r = publish::publish_with(&sink, DRIVER, NODE, &all, &taints, false).await;
        assert_eq!(r, Ok((Published::Unchanged { generation: 1 }, false)));
    }
    // A lost GPU: NoExecute (its pods are evicted).
    let lost = publish::health_taints(DRIVER, &[sick(&all[1].uuid, 79, 1_800_000_000.0)]);
    let r = publish::publish_with(&sink, DRIVER, NODE, &all, &lost, false).await;
    assert_eq!(r, Ok((Published::Changed { generation: 2 }, false)));
    let t = device_taints(&stored(&state), "gpu-1").expect("taint");
    assert_eq!(
        (t[0].effect.as_str(), t[0].value.as_deref()),
        ("NoExecute", Some("xid-79"))
    );
    // Healthy again: untainted, the generation up.
    let r = publish::publish_with(&sink, DRIVER, NODE, &all, &BTreeMap::new(), false).await;
    assert_eq!(r, Ok((Published::Changed { generation: 3 }, false)));
    assert_eq!(device_taints(&stored(&state), "gpu-1"), None);

    // An API server without device taints drops them: said (dropped), and
    // withdrawn instead.
    let (client, state) = api_server_full(true, false, true).await;
    let sink = publish::Kube(client);
    let r = publish::publish_with(&sink, DRIVER, NODE, &all, &taints, false).await;
    assert_eq!(r, Ok((Published::Changed { generation: 1 }, true)));
    let r = publish::publish_with(&sink, DRIVER, NODE, &all, &taints, true).await;
    assert_eq!(r, Ok((Published::Changed { generation: 2 }, false)));
    let names: Vec<String> = stored(&state)
        .spec
        .devices
        .expect("devices")
        .iter()
        .map(|d| d.name.clone())
        .collect();
    assert_eq!(names, ["gpu-0"]);
    let r = publish::publish_with(&sink, DRIVER, NODE, &all, &taints, true).await;
    assert_eq!(r, Ok((Published::Unchanged { generation: 2 }, false)));
}

/// The fake NVML's two GPUs, as the inventory lists them.
fn fake_gpus() -> Vec<Gpu> {
    (0..2u8)
        .map(|i| Gpu {
            index: u32::from(i),
            uuid: format!("GPU-c511ce00-fa4e-4000-8000-0000000000{i:02x}"),
            memory: 16 << 30,
            minor: u32::from(i),
            product: "cuslice Fake GPU".into(),
            compute_capability: Some(ComputeCapability { major: 9, minor: 0 }),
        })
        .collect()
}

/// The plugin's publishing loop with a health source on the fake NVML (two
/// GPUs, made sick through `inject`), against the fake API server.
struct Plugin {
    /// Runs the publishing loop (kept alive with the test).
    _rt: tokio::runtime::Runtime,
    state: Arc<Mutex<State>>,
    inject: std::path::PathBuf,
    root: std::path::PathBuf,
    _source: Arc<cuslice_host::gpu::health::source::Source>,
    _dir: tempfile::TempDir,
}

impl Plugin {
    fn start(quiet: Duration, taints_off: bool) -> Plugin {
        let dir = tempfile::tempdir().expect("tmp");
        let inject = dir.path().join("inject");
        std::fs::write(&inject, "").expect("inject");
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).expect("root");
        // SAFETY: set before any thread of this test process starts (the
        // runtime is built below); the fake NVML and the loader read them.
        unsafe {
            std::env::set_var(
                "CUSLICE_REAL_NVML",
                common::env().fake.join("libnvidia-ml.so.1"),
            );
            std::env::set_var("FAKE_NVML_HEALTH", &inject);
            std::env::set_var("FAKE_CUDA_DEVICES", "2");
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let wake = Arc::new(tokio::sync::Notify::new());
        let w = wake.clone();
        let cfg = cuslice_host::gpu::health::source::Config {
            root: root.clone(),
            writer: "cuslice-dra-plugin".into(),
            poll: Duration::from_millis(200),
            check: Duration::from_millis(500),
            quiet,
        };
        let source = Arc::new(
            cuslice_host::gpu::health::source::Source::start(
                cfg,
                Box::new(move |r| {
                    if let cuslice_host::gpu::health::source::Report::Change(_) = r {
                        w.notify_one();
                    }
                }),
            )
            .expect("health source"),
        );
        let (client, state) = rt.block_on(api_server_full(true, false, taints_off));
        let health: Arc<dyn publish::HealthSource> = source.clone();
        rt.spawn(publish::keep_published(
            Arc::new(publish::Kube(client)),
            Arc::new(cuslice_dra::gpus::Fixed(fake_gpus())),
            DRIVER.into(),
            NODE.into(),
            // No refresh within a test: what republishes the slice is the
            // health change's wake, and nothing else (the plugin refreshes
            // every `publish::REFRESH`, 10 s, which made "within 10 s" true
            // without the wake; the tests' bounds are then free to be ones
            // a loaded machine meets).
            Duration::from_secs(3600),
            Some(health),
            wake,
        ));
        let p = Plugin {
            _rt: rt,
            state,
            inject,
            root,
            _source: source,
            _dir: dir,
        };
        p.until("the first publish", Duration::from_secs(30), |_| true);
        p
    }

    fn inject(&self, line: &str) {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.inject)
            .expect("inject")
            .write_all(line.as_bytes())
            .expect("write");
    }

    /// Waits at most `limit` for the stored slice to satisfy `f`; how long
    /// it took.
    fn until(&self, what: &str, limit: Duration, f: impl Fn(&ResourceSlice) -> bool) -> Duration {
        let t0 = Instant::now();
        loop {
            let s = self
                .state
                .lock()
                .expect("lock")
                .slices
                .get(&format!("{NODE}-{DRIVER}"))
                .cloned()
                .map(|v| serde_json::from_value::<ResourceSlice>(v).expect("slice"));
            if s.as_ref().is_some_and(&f) {
                return t0.elapsed();
            }
            assert!(t0.elapsed() < limit, "{what}: not within {limit:?}: {s:#?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn the_slice_is_republished_at_a_health_change_and_a_gpu_returns_after_the_quiet_period() {
    let quiet = Duration::from_secs(6);
    let p = Plugin::start(quiet, false);
    let effect = |name: &'static str| {
        move |s: &ResourceSlice| {
            device_taints(s, name).map(|t| (t[0].effect.clone(), t[0].value.clone()))
        }
    };
    // XID 48 on GPU 1: tainted NoSchedule, republished by the health
    // change's wake (the test's loop has no refresh: see `Plugin`), within
    // 10 s of the event on an idle machine; waited for up to 30 s.
    let t0 = Instant::now();
    p.inject("1 xid 48\n");
    let took = p.until("gpu-1 tainted", Duration::from_secs(30), |s| {
        effect("gpu-1")(s) == Some(("NoSchedule".into(), Some("xid-48".into())))
    });
    eprintln!("XID 48 to the slice republished tainted: {took:?}");
    // No flapping: still tainted inside the quiet period (counted from the
    // XID, which is after t0), though the GPU answers every query
    // meanwhile; looked at 2 s on, where the machine let the test look
    // before the quiet period ended.
    std::thread::sleep(Duration::from_secs(2));
    let still = effect("gpu-1")(&stored(&p.state)).is_some();
    let at = t0.elapsed();
    if at < quiet {
        assert!(still, "untainted {at:?} after the XID (quiet {quiet:?})");
    } else {
        eprintln!("the flapping check was not made: the test looked {at:?} after the XID");
    }
    // Back once the quiet period has passed since the XID.
    p.until("gpu-1 untainted", Duration::from_secs(40), |s| {
        effect("gpu-1")(s).is_none()
    });
    assert!(
        t0.elapsed() >= quiet - Duration::from_millis(500),
        "back after {:?} (quiet {quiet:?})",
        t0.elapsed()
    );
}

/// GPU 0 falls off the bus: NoExecute; an operator's clear (the GPU was
/// reset: it answers again) lifts it long before the quiet period (here
/// 300 s: only the clear can, however long a loaded machine takes).
#[test]
fn an_operators_clear_lifts_a_lost_gpus_taint_before_the_quiet_period() {
    let p = Plugin::start(Duration::from_secs(300), false);
    let effect = |s: &ResourceSlice| {
        device_taints(s, "gpu-0").map(|t| (t[0].effect.clone(), t[0].value.clone()))
    };
    p.inject("0 xid 79\n");
    p.until("gpu-0 tainted NoExecute", Duration::from_secs(30), |s| {
        effect(s) == Some(("NoExecute".into(), Some("xid-79".into())))
    });
    cuslice_host::gpu::health::file::request_clear(
        &cuslice_host::layout::Layout::new(&p.root),
        &fake_gpus()[0].uuid,
        cuslice_host::gpu::health::source::now_unix(),
    )
    .expect("clear");
    let took = p.until("gpu-0 cleared", Duration::from_secs(30), |s| {
        effect(s).is_none()
    });
    eprintln!("the clear to the slice republished untainted: {took:?}");
}

#[test]
fn where_the_cluster_has_no_device_taints_an_unhealthy_gpu_is_withdrawn_within_10s() {
    let p = Plugin::start(Duration::from_secs(300), true);
    let names = |s: &ResourceSlice| -> Vec<String> {
        s.spec
            .devices
            .iter()
            .flatten()
            .map(|d| d.name.clone())
            .collect()
    };
    assert_eq!(names(&stored(&p.state)), ["gpu-0", "gpu-1"]);
    // By the health change's wake (no refresh in the test's loop), within
    // 10 s on an idle machine; waited for up to 30 s.
    p.inject("1 xid 95\n");
    let took = p.until("gpu-1 withdrawn", Duration::from_secs(30), |s| {
        names(s) == ["gpu-0"]
    });
    eprintln!("XID 95 to the slice republished without gpu-1: {took:?}");
}
