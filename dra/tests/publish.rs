//! Publishing the node's ResourceSlice through kube, against a fake API
//! server that keeps ResourceSlices and one Node, and records every
//! request: what the scheduler then reads, the server-side apply the API
//! server is asked for, the generation across changes, the Node as owner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
fn as_kept(v: &mut serde_json::Value, gate_off: bool) {
    for d in v["spec"]["devices"].as_array_mut().into_iter().flatten() {
        let d = d.as_object_mut().expect("device");
        if gate_off {
            d.remove("allowMultipleAllocations");
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
            as_kept(&mut v, st.gate_off);
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
    let state = Arc::new(Mutex::new(State {
        node_readable,
        gate_off,
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
