//! The manifests of `deploy/kubernetes/` (docs/kubernetes.md), checked the
//! way a cluster would take them and against what the plugin expects:
//!
//! - every document of every file, recursively, is a kind this driver
//!   ships and reads as the typed `k8s-openapi` object of that kind (its
//!   `v1_37` API, the crate's); written back it is the same document, so a
//!   misspelled or misplaced field (which the API server would drop or
//!   refuse) fails here;
//! - `kubectl apply -f deploy/kubernetes/` works in one go: files in name
//!   order, each namespaced object's namespace made before it;
//! - the DeviceClass selects this driver; the ClusterRole grants what the
//!   plugin calls and nothing else, to the ServiceAccount the DaemonSet
//!   runs as; the DaemonSet gives the plugin the kubelet's directories, the
//!   CDI directory and the hook's root at the paths it defaults to, its
//!   node's name, and the `cuslice` command and shim its CDI hooks name,
//!   copied onto the host by its init container;
//! - each example claim template asks for capacity the published
//!   ResourceSlice can give (`memory` in 256Mi steps, `compute` 1-100),
//!   its opaque config is accepted by the plugin's own parser, and the
//!   plugin turns the allocation it would get into a quota file; the
//!   example pods name templates that exist.
//!
//! No cluster: this is what can be known without one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use serde::Deserialize;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use cuslice_dra::DEFAULT_DRIVER;
use cuslice_dra::claim::{self, AllocatedDevice, Allocation, ClaimRef, Driver, OpaqueConfig};
use cuslice_dra::gpus::Gpu;
use cuslice_dra::quantity::parse_whole;
use cuslice_dra::slice::MEMORY_STEP;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// The YAML files under `dir`, recursively, each directory's in name order.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    let mut files = Vec::new();
    for p in entries {
        if p.is_dir() {
            files.extend(yaml_files(&p));
        } else if matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
            files.push(p);
        } else {
            panic!(
                "{}: not a YAML file: `kubectl apply -f` would refuse it",
                p.display()
            );
        }
    }
    files
}

/// A document as JSON, without null values (which the typed objects drop,
/// as does the API server).
fn drop_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, drop_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(drop_nulls).collect()),
        v => v,
    }
}

/// The documents of one file, as JSON (empty documents skipped, as
/// kubectl does).
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::Deserializer::from_str(&text)
        .enumerate()
        .map(|(i, d)| {
            Value::deserialize(d)
                .unwrap_or_else(|e| panic!("{} document {}: {e}", path.display(), i + 1))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// Where `a` and `b` first differ, as a JSON path with both values.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let at = format!("{at}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(a), Some(b)) => first_difference(a, b, &at),
                    (a, b) => Some(format!("{at}: {a:?} in the file, {b:?} as read")),
                }
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (a, b))| first_difference(a, b, &format!("{at}[{i}]"))),
        _ => (a != b).then(|| format!("{at}: {a} in the file, {b} as read")),
    }
}

/// `doc` read as `T`, then written back: the same document, or a field
/// `T` does not know (misspelled, misplaced, of another version) or a
/// value of another shape (a quantity written as a number).
fn typed<T: DeserializeOwned + Serialize>(doc: &Value, what: &str) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: not a valid object of its kind: {e}"));
    let back = drop_nulls(serde_json::to_value(&t).expect("serializes"));
    let want = drop_nulls(doc.clone());
    if let Some(d) = first_difference(&want, &back, "") {
        panic!(
            "{what}: read as its type and written back, it differs (a field the type does not know, or a value of another shape): {d}"
        );
    }
    t
}

/// Each boxed: the types differ much in size.
#[derive(Debug)]
enum Object {
    Namespace(Box<Namespace>),
    ServiceAccount(Box<ServiceAccount>),
    ClusterRole(Box<ClusterRole>),
    ClusterRoleBinding(Box<ClusterRoleBinding>),
    DaemonSet(Box<DaemonSet>),
    DeviceClass(Box<DeviceClass>),
    ResourceClaimTemplate(Box<ResourceClaimTemplate>),
    Pod(Box<Pod>),
}

impl Object {
    fn kind(&self) -> &'static str {
        match self {
            Object::Namespace(_) => "Namespace",
            Object::ServiceAccount(_) => "ServiceAccount",
            Object::ClusterRole(_) => "ClusterRole",
            Object::ClusterRoleBinding(_) => "ClusterRoleBinding",
            Object::DaemonSet(_) => "DaemonSet",
            Object::DeviceClass(_) => "DeviceClass",
            Object::ResourceClaimTemplate(_) => "ResourceClaimTemplate",
            Object::Pod(_) => "Pod",
        }
    }

    fn name_and_namespace(&self) -> (Option<&str>, Option<&str>) {
        let m = match self {
            Object::Namespace(o) => &o.metadata,
            Object::ServiceAccount(o) => &o.metadata,
            Object::ClusterRole(o) => &o.metadata,
            Object::ClusterRoleBinding(o) => &o.metadata,
            Object::DaemonSet(o) => &o.metadata,
            Object::DeviceClass(o) => &o.metadata,
            Object::ResourceClaimTemplate(o) => &o.metadata,
            Object::Pod(o) => &o.metadata,
        };
        (m.name.as_deref(), m.namespace.as_deref())
    }

    fn namespaced(&self) -> bool {
        !matches!(
            self,
            Object::Namespace(_)
                | Object::ClusterRole(_)
                | Object::ClusterRoleBinding(_)
                | Object::DeviceClass(_)
        )
    }
}

struct Manifest {
    /// Relative to deploy/kubernetes.
    file: PathBuf,
    object: Object,
}

fn read_object(doc: &Value, what: &str) -> Object {
    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Namespace") => Object::Namespace(Box::new(typed(doc, what))),
        ("v1", "ServiceAccount") => Object::ServiceAccount(Box::new(typed(doc, what))),
        ("v1", "Pod") => Object::Pod(Box::new(typed(doc, what))),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
            Object::ClusterRole(Box::new(typed(doc, what)))
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            Object::ClusterRoleBinding(Box::new(typed(doc, what)))
        }
        ("apps/v1", "DaemonSet") => Object::DaemonSet(Box::new(typed(doc, what))),
        ("resource.k8s.io/v1", "DeviceClass") => Object::DeviceClass(Box::new(typed(doc, what))),
        ("resource.k8s.io/v1", "ResourceClaimTemplate") => {
            Object::ResourceClaimTemplate(Box::new(typed(doc, what)))
        }
        _ => panic!("{what}: apiVersion {api_version:?} kind {kind:?}: not a kind this test knows"),
    }
}

/// Every object under deploy/kubernetes, in file order.
fn manifests() -> Vec<Manifest> {
    let dir = deploy_dir();
    let files = yaml_files(&dir);
    assert!(!files.is_empty(), "{}: no manifests", dir.display());
    let mut out = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&dir).expect("under the dir").to_path_buf();
        let docs = documents(&f);
        assert!(!docs.is_empty(), "{}: no document", rel.display());
        for (i, doc) in docs.iter().enumerate() {
            let what = format!("{} document {}", rel.display(), i + 1);
            let object = read_object(doc, &what);
            let (name, ns) = object.name_and_namespace();
            assert!(name.is_some_and(|n| !n.is_empty()), "{what}: no name");
            assert_eq!(
                ns.is_some(),
                object.namespaced(),
                "{what}: a namespaced object names its namespace, a cluster-scoped one none"
            );
            out.push(Manifest {
                file: rel.clone(),
                object,
            });
        }
    }
    out
}

/// The objects of one kind.
macro_rules! all {
    ($ms:expr, $kind:ident) => {
        $ms.iter()
            .filter_map(|m| match &m.object {
                Object::$kind(o) => Some(&**o),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
}

fn one<'a, T>(v: Vec<&'a T>, what: &str) -> &'a T {
    assert_eq!(v.len(), 1, "exactly one {what} in deploy/kubernetes");
    v[0]
}

fn name(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    m.name.as_deref().unwrap_or_default()
}

fn namespace(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    m.namespace.as_deref().unwrap_or_default()
}

#[test]
fn every_document_is_a_known_kind_with_known_fields() {
    let ms = manifests();
    let kinds: BTreeSet<&str> = ms.iter().map(|m| m.object.kind()).collect();
    for k in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "DeviceClass",
        "ResourceClaimTemplate",
        "Pod",
    ] {
        assert!(kinds.contains(k), "no {k} in deploy/kubernetes");
    }
    // The driver's objects are at the top, the examples under examples/
    // (`kubectl apply -f deploy/kubernetes/` is not recursive).
    for m in &ms {
        let example = m.file.starts_with("examples");
        let is_example = matches!(m.object, Object::ResourceClaimTemplate(_) | Object::Pod(_));
        assert_eq!(
            example,
            is_example,
            "{}: {:?} belongs {}",
            m.file.display(),
            m.object.name_and_namespace(),
            if is_example {
                "under examples/"
            } else {
                "at the top"
            }
        );
    }
    // Each object once (a Namespace may be repeated, the same each time).
    let mut seen: BTreeMap<(&str, String, String), &Object> = BTreeMap::new();
    for m in &ms {
        let (n, ns) = m.object.name_and_namespace();
        let key = (
            m.object.kind(),
            ns.unwrap_or_default().into(),
            n.unwrap_or_default().into(),
        );
        if let Some(prev) = seen.insert(key.clone(), &m.object) {
            match (prev, &m.object) {
                (Object::Namespace(a), Object::Namespace(b)) => {
                    assert_eq!(a, b, "Namespace {} is written twice, differently", key.2)
                }
                _ => panic!("{key:?} is written twice ({})", m.file.display()),
            }
        }
    }
}

/// `kubectl apply -f deploy/kubernetes/` then `-f deploy/kubernetes/examples/`:
/// each directory's files in name order, each file's documents in order.
/// A namespaced object whose namespace is not there yet is refused.
#[test]
fn kubectl_apply_of_the_directory_works_in_one_go() {
    let ms = manifests();
    let mut namespaces: BTreeSet<String> = ["default".to_string()].into();
    for dir in [Path::new(""), Path::new("examples")] {
        for m in ms.iter().filter(|m| m.file.parent() == Some(dir)) {
            let (n, ns) = m.object.name_and_namespace();
            if let Object::Namespace(_) = m.object {
                namespaces.insert(n.unwrap_or_default().into());
            }
            if let Some(ns) = ns {
                assert!(
                    namespaces.contains(ns),
                    "{}: {n:?} is in namespace {ns}, which `kubectl apply -f {}` has not made yet (files go in name order)",
                    m.file.display(),
                    Path::new("deploy/kubernetes").join(dir).display()
                );
            }
        }
    }
    assert!(
        ms.iter().all(|m| m.file.components().count() <= 2),
        "only deploy/kubernetes/ and deploy/kubernetes/examples/ are applied"
    );
}

#[test]
fn the_device_class_selects_this_driver() {
    let ms = manifests();
    let c = one(all!(ms, DeviceClass), "DeviceClass");
    assert_eq!(name(&c.metadata), DEFAULT_DRIVER);
    let selectors = c
        .spec
        .as_ref()
        .and_then(|s| s.selectors.as_deref())
        .unwrap_or_default();
    let exprs: Vec<&str> = selectors
        .iter()
        .map(|s| s.cel.as_ref().expect("a CEL selector").expression.trim())
        .collect();
    assert_eq!(
        exprs,
        [format!("device.driver == \"{DEFAULT_DRIVER}\"")],
        "the class selects the devices of {DEFAULT_DRIVER}, and only by driver"
    );
    // Every template asks for this class.
    for t in all!(ms, ResourceClaimTemplate) {
        for r in requests(t) {
            let e = r.exactly.as_ref().expect("exactly");
            assert_eq!(
                e.device_class_name,
                name(&c.metadata),
                "{}",
                name(&t.metadata)
            );
        }
    }
}

/// What the plugin calls: (API group, resource, verb). Claims: GET
/// (dra/src/api.rs). Its node's ResourceSlice: GET, then server-side
/// apply, a PATCH that the API server also authorizes as `create` where
/// the slice is not there yet; never deleted (dra/src/publish.rs). Its
/// Node: GET, for the slice's ownerReference.
const PLUGIN_CALLS: &[(&str, &str, &str)] = &[
    ("resource.k8s.io", "resourceclaims", "get"),
    ("resource.k8s.io", "resourceslices", "get"),
    ("resource.k8s.io", "resourceslices", "create"),
    ("resource.k8s.io", "resourceslices", "patch"),
    ("", "nodes", "get"),
];

#[test]
fn the_plugin_may_call_what_it_calls_and_nothing_else() {
    let ms = manifests();
    let role = one(all!(ms, ClusterRole), "ClusterRole");
    let rules = role.rules.as_deref().unwrap_or_default();
    assert!(role.aggregation_rule.is_none());
    let mut granted = BTreeSet::new();
    for r in rules {
        assert!(
            r.resource_names.is_none() && r.non_resource_urls.is_none(),
            "{r:?}: only whole resources"
        );
        for g in r.api_groups.as_deref().unwrap_or_default() {
            for res in r.resources.as_deref().unwrap_or_default() {
                for v in &r.verbs {
                    assert!(
                        ![g, res, v].contains(&&"*".to_string()),
                        "{r:?}: no wildcards"
                    );
                    granted.insert((g.clone(), res.clone(), v.clone()));
                }
            }
        }
    }
    let want: BTreeSet<(String, String, String)> = PLUGIN_CALLS
        .iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    assert_eq!(granted, want);

    // Bound to the ServiceAccount the DaemonSet runs as, in its namespace.
    let ds = one(all!(ms, DaemonSet), "DaemonSet");
    let pod = pod_spec(ds);
    let sa_name = pod
        .service_account_name
        .as_deref()
        .expect("the DaemonSet names its ServiceAccount");
    let ds_ns = namespace(&ds.metadata);
    assert!(
        all!(ms, ServiceAccount)
            .iter()
            .any(|sa| name(&sa.metadata) == sa_name && namespace(&sa.metadata) == ds_ns),
        "ServiceAccount {ds_ns}/{sa_name} is in the manifests"
    );
    assert!(pod.automount_service_account_token != Some(false));
    let b = one(all!(ms, ClusterRoleBinding), "ClusterRoleBinding");
    assert_eq!(
        (
            b.role_ref.api_group.as_deref(),
            b.role_ref.kind.as_str(),
            b.role_ref.name.as_str()
        ),
        (
            Some("rbac.authorization.k8s.io"),
            "ClusterRole",
            name(&role.metadata)
        )
    );
    let subjects = b.subjects.as_deref().unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    let s = &subjects[0];
    assert_eq!(
        (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()),
        ("ServiceAccount", sa_name, Some(ds_ns))
    );
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec
        .template
        .spec
        .as_ref()
        .expect("the DaemonSet's pod template")
}

/// A container's command line.
fn argv(c: &Container) -> Vec<&str> {
    c.command
        .iter()
        .chain(c.args.iter())
        .flatten()
        .map(String::as_str)
        .collect()
}

/// The value of `--flag V` or `--flag=V`.
fn flag<'a>(argv: &[&'a str], flag: &str) -> Option<&'a str> {
    argv.iter().enumerate().find_map(|(i, a)| {
        if *a == flag {
            argv.get(i + 1).copied()
        } else {
            a.strip_prefix(flag).and_then(|r| r.strip_prefix('='))
        }
    })
}

/// The host path `path` (in container `c`) lies at, through a hostPath
/// volume mounted at the same path it has on the host: `None` if no such
/// volume holds it.
fn host_path_of(pod: &PodSpec, c: &Container, path: &str) -> Option<String> {
    let volumes = pod.volumes.as_deref().unwrap_or_default();
    c.volume_mounts
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|m| {
            Path::new(path).starts_with(&m.mount_path)
                && m.sub_path.is_none()
                && m.sub_path_expr.is_none()
        })
        .max_by_key(|m| m.mount_path.len())
        .and_then(|m| {
            let v = volumes.iter().find(|v| v.name == m.name)?;
            let h = v.host_path.as_ref()?;
            (h.path == m.mount_path).then(|| path.to_string())
        })
}

#[test]
fn the_daemonset_runs_the_plugin_with_what_it_needs() {
    let ms = manifests();
    let ds = one(all!(ms, DaemonSet), "DaemonSet");
    let pod = pod_spec(ds);
    let spec = &ds.spec;
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref());
    for (k, v) in spec.selector.match_labels.as_ref().expect("matchLabels") {
        assert_eq!(
            labels.and_then(|l| l.get(k)),
            Some(v),
            "the selector matches the pod template's labels"
        );
    }
    assert_eq!(
        pod.node_selector
            .as_ref()
            .and_then(|s| s.get("cuslice.io/gpu"))
            .map(String::as_str),
        Some("true"),
        "only nodes labelled cuslice.io/gpu=true (docs/kubernetes.md)"
    );
    let containers = &pod.containers;
    assert_eq!(containers.len(), 1);
    let plugin = &containers[0];
    let args = argv(plugin);
    assert_eq!(
        args.first().copied(),
        Some("cuslice-dra-plugin"),
        "{args:?}"
    );
    assert_eq!(
        plugin.security_context.as_ref().and_then(|s| s.privileged),
        Some(true),
        "root on the host's files"
    );

    // Its node's name, the pool its GPUs are published in.
    let env = plugin.env.as_deref().unwrap_or_default();
    let node = env
        .iter()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME in the plugin's environment");
    assert_eq!(
        node.value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
    assert!(flag(&args, "--node-name").is_none(), "NODE_NAME says it");

    // The paths the plugin defaults to (dra/src/main.rs): the kubelet's
    // registration directory, its plugins' directory (the plugin's is
    // <that>/gpu.cuslice.io), where CDI specs go, the hook's root; each
    // the host's own directory, writable.
    for (f, default) in [
        ("--registry-dir", "/var/lib/kubelet/plugins_registry"),
        ("--plugin-dir", "/var/lib/kubelet/plugins"),
        ("--cdi-dir", "/var/run/cdi"),
        ("--root", "/run/cuslice"),
    ] {
        assert!(
            flag(&args, f).is_none(),
            "{f}: the manifest keeps the plugin's default"
        );
        let m = plugin
            .volume_mounts
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|m| m.mount_path == default)
            .unwrap_or_else(|| panic!("the plugin container mounts {default}"));
        assert_ne!(m.read_only, Some(true), "{default} is written");
        assert_eq!(
            host_path_of(pod, plugin, default).as_deref(),
            Some(default),
            "{default}: the host's {default}"
        );
    }
    assert!(flag(&args, "--driver-name").is_none_or(|d| d == DEFAULT_DRIVER));
    assert!(flag(&args, "--gpus-file").is_none(), "NVML, not a file");

    // The command and library the CDI hooks name: on the host (the
    // runtime runs the hooks there), where the init container put them,
    // at the same path inside the plugin's container.
    let init = pod.init_containers.as_deref().unwrap_or_default();
    assert_eq!(init.len(), 1);
    let install = &init[0];
    assert_eq!(
        install.image, plugin.image,
        "the init container copies the plugin image's own files"
    );
    let script = argv(install).join(" ");
    for (f, from) in [
        ("--cuslice", "/usr/bin/cuslice"),
        ("--lib", "/usr/lib/cuslice/libcuslice.so"),
    ] {
        let path = flag(&args, f).unwrap_or_else(|| panic!("{f} in {args:?}"));
        assert!(path.starts_with("/opt/cuslice/"), "{f} {path}");
        assert_eq!(
            host_path_of(pod, plugin, path).as_deref(),
            Some(path),
            "{f} {path}: on a hostPath volume of the plugin's container"
        );
        assert_eq!(
            host_path_of(pod, install, path).as_deref(),
            Some(path),
            "{f} {path}: on a hostPath volume of the init container"
        );
        // Copied from the image beside its place, then renamed over it.
        assert!(script.contains(from), "the init container copies {from}");
        let last = script
            .lines()
            .rfind(|l| l.contains(path))
            .unwrap_or_else(|| panic!("the init container writes {path}:\n{script}"));
        assert!(
            last.trim_start().starts_with("mv -f ")
                && last.trim_end().ends_with(&format!(" {path}")),
            "{path} is renamed into place (a running hook or a mapped library keeps a whole file): {last:?}"
        );
    }
}

fn requests(t: &ResourceClaimTemplate) -> &[k8s_openapi::api::resource::v1::DeviceRequest] {
    t.spec
        .as_ref()
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.requests.as_deref())
        .unwrap_or_default()
}

/// The capacity one template asks for: (memory, compute).
fn capacity(t: &ResourceClaimTemplate) -> (u64, u8) {
    let what = name(&t.metadata);
    let rs = requests(t);
    assert_eq!(rs.len(), 1, "{what}: one request (one GPU slice per claim)");
    let e = rs[0].exactly.as_ref().expect("exactly");
    assert_eq!(e.count, Some(1), "{what}: one device");
    assert!(
        e.allocation_mode
            .as_deref()
            .is_none_or(|m| m == "ExactCount"),
        "{what}"
    );
    let caps = e
        .capacity
        .as_ref()
        .and_then(|c| c.requests.as_ref())
        .expect("capacity requests");
    assert_eq!(
        caps.keys().map(String::as_str).collect::<Vec<_>>(),
        ["compute", "memory"],
        "{what}: the device's two capacities"
    );
    let memory = parse_whole(&caps["memory"].0).unwrap_or_else(|e| panic!("{what}: memory: {e}"));
    let compute =
        parse_whole(&caps["compute"].0).unwrap_or_else(|e| panic!("{what}: compute: {e}"));
    // The published policy (dra/src/slice.rs): memory from one step, in
    // steps; compute 1 to 100.
    let step = u128::from(MEMORY_STEP);
    assert!(
        memory >= step && memory.is_multiple_of(step),
        "{what}: memory {memory} is not a multiple of {step}"
    );
    assert!((1..=100).contains(&compute), "{what}: compute {compute}");
    (
        u64::try_from(memory).expect("memory"),
        u8::try_from(compute).expect("compute"),
    )
}

/// The opaque configs of a template, as the plugin reads them from an
/// allocation.
fn opaque_configs(t: &ResourceClaimTemplate) -> Vec<OpaqueConfig> {
    let what = name(&t.metadata);
    let request_names: BTreeSet<&str> = requests(t).iter().map(|r| r.name.as_str()).collect();
    t.spec
        .as_ref()
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.devices.as_ref())
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let requests = c.requests.clone().unwrap_or_default();
            for r in &requests {
                assert!(
                    request_names.contains(r.as_str()),
                    "{what}: config for request {r}, which it has not"
                );
            }
            let o = c.opaque.as_ref().expect("an opaque config");
            OpaqueConfig {
                source: "FromClaim".into(),
                requests,
                driver: o.driver.clone(),
                parameters: o.parameters.0.clone(),
            }
        })
        .collect()
}

/// An H100 80GB as NVML reports it (81559 MiB).
fn h100() -> Gpu {
    Gpu {
        index: 0,
        uuid: "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b".into(),
        memory: 81559 << 20,
        minor: 0,
        product: "NVIDIA H100 80GB HBM3".into(),
        compute_capability: None,
    }
}

#[test]
fn the_example_claims_fit_one_gpu_and_the_plugin_takes_them() {
    let ms = manifests();
    let templates = all!(ms, ResourceClaimTemplate);
    let by_name: BTreeMap<&str, &ResourceClaimTemplate> =
        templates.iter().map(|t| (name(&t.metadata), *t)).collect();
    assert_eq!(
        by_name.keys().copied().collect::<Vec<_>>(),
        ["inference-slice", "trainer-slice"]
    );
    assert_eq!(capacity(by_name["trainer-slice"]), (40 << 30, 50));
    assert_eq!(capacity(by_name["inference-slice"]), (16 << 30, 20));
    // Both on one GPU: the scheduler never overcommits a device.
    let gpu = h100();
    let (m, c) = templates
        .iter()
        .map(|t| capacity(t))
        .fold((0, 0), |a, (m, c)| (a.0 + m, a.1 + u32::from(c)));
    assert!(m <= gpu.memory && c <= 100, "{m} bytes, {c} % on one GPU");

    // The plugin's own parser takes the configs: the inference slice is
    // in the latency class, the trainer's has none.
    let inference = opaque_configs(by_name["inference-slice"]);
    assert_eq!(inference.len(), 1);
    assert_eq!(inference[0].driver, DEFAULT_DRIVER);
    assert_eq!(
        inference[0].parameters["apiVersion"],
        claim::CONFIG_API_VERSION
    );
    assert_eq!(inference[0].parameters["kind"], claim::CONFIG_KIND);
    assert_eq!(
        claim::settings(&inference, DEFAULT_DRIVER, "gpu"),
        Ok(claim::Settings {
            compute_max: None,
            latency: true,
            ..claim::Settings::default()
        })
    );
    assert!(opaque_configs(by_name["trainer-slice"]).is_empty());

    // And the allocation each would get (consumedCapacity = the request,
    // already on the policy's steps) becomes its quota file.
    let driver = Driver {
        name: DEFAULT_DRIVER.into(),
        pool: "gpu-node-1".into(),
    };
    for t in &templates {
        let (memory, compute) = capacity(t);
        let r = &requests(t)[0];
        let caps = r
            .exactly
            .as_ref()
            .and_then(|e| e.capacity.as_ref())
            .and_then(|c| c.requests.as_ref())
            .expect("capacity");
        let alloc = Allocation {
            devices: vec![AllocatedDevice {
                request: r.name.clone(),
                driver: DEFAULT_DRIVER.into(),
                pool: driver.pool.clone(),
                device: gpu.device_name(),
                consumed: caps.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect(),
            }],
            config: opaque_configs(t),
            pods: vec![],
        };
        let c = ClaimRef {
            namespace: namespace(&t.metadata).into(),
            name: format!("{}-x7k2p", name(&t.metadata)),
            uid: "0b1c2d3e-0000-4000-8000-000000000001".into(),
        };
        let s = claim::slice(&c, &alloc, &driver, std::slice::from_ref(&gpu))
            .unwrap_or_else(|e| panic!("{}: the plugin refuses it: {e}", name(&t.metadata)));
        assert_eq!((s.memory, s.compute), (memory, compute));
        assert_eq!(
            s.quota.contains("\nlatency = true\n"),
            name(&t.metadata) == "inference-slice",
            "{}",
            s.quota
        );
    }
}

#[test]
fn the_example_pods_use_templates_that_exist() {
    let ms = manifests();
    let templates: BTreeSet<(&str, &str)> = all!(ms, ResourceClaimTemplate)
        .iter()
        .map(|t| (namespace(&t.metadata), name(&t.metadata)))
        .collect();
    let mut used = BTreeMap::new();
    for p in all!(ms, Pod) {
        let what = name(&p.metadata);
        let ns = namespace(&p.metadata);
        let spec = p.spec.as_ref().expect("spec");
        let claims = spec.resource_claims.as_deref().unwrap_or_default();
        assert!(!claims.is_empty(), "{what}: no claim");
        for c in claims {
            let t = c
                .resource_claim_template_name
                .as_deref()
                .unwrap_or_else(|| panic!("{what}: claim {} names no template", c.name));
            assert!(
                templates.contains(&(ns, t)),
                "{what}: template {ns}/{t} is not in the manifests"
            );
            used.insert(what, t);
        }
        let names: BTreeSet<&str> = claims.iter().map(|c| c.name.as_str()).collect();
        for k in &spec.containers {
            // The image asks NVIDIA's toolkit for every GPU of the node
            // (NVIDIA_VISIBLE_DEVICES=all); the claim's CDI spec is what
            // gives the container its GPU.
            let visible = k
                .env
                .as_deref()
                .unwrap_or_default()
                .iter()
                .find(|e| e.name == "NVIDIA_VISIBLE_DEVICES");
            assert_eq!(
                visible.and_then(|e| e.value.as_deref()),
                Some("none"),
                "{what}/{}: NVIDIA_VISIBLE_DEVICES=none, or the toolkit hands it the node's other GPUs, unlimited",
                k.name
            );
            let uses = k
                .resources
                .as_ref()
                .and_then(|r| r.claims.as_deref())
                .unwrap_or_default();
            assert!(!uses.is_empty(), "{what}/{}: uses no claim", k.name);
            for u in uses {
                assert!(
                    names.contains(u.name.as_str()),
                    "{what}/{}: claim {} is not the pod's",
                    k.name,
                    u.name
                );
            }
        }
    }
    assert_eq!(
        used,
        BTreeMap::from([
            ("inference", "inference-slice"),
            ("trainer", "trainer-slice")
        ])
    );
}
