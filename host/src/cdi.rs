//! CDI (Container Device Interface) specs, the JSON files root writes for
//! the container runtimes: `cuslice cdi generate`'s (`cuslice.io/gpu=all`,
//! the hooks alone) and the DRA plugin's, one per claim
//! (`cuslice.io/claim=<uid>`, the GPU's device nodes and the hooks). The one
//! place either is spelled: the typed spec (the parts cuslice writes), the
//! names CDI accepts, the version a spec declares, and the `cuslice oci-hook`
//! command lines its hooks run.
//!
//! # The version
//!
//! A runtime's CDI library refuses a spec that declares a version it does
//! not know (podman 4.3, Debian 12's, knows up to 0.5.0: "unresolvable CDI
//! devices"), and, from container-device-interface v0.5.4 on, one whose
//! content needs a later version than it declares (its
//! `MinimumRequiredVersion`). So a spec here declares the lowest version
//! its content needs, by the rules of CDI's own version table:
//!
//! | version | needed by |
//! |---|---|
//! | 0.3.0 | anything else here (device hooks named by OCI stage, device nodes, mounts, env) |
//! | 0.4.0 | a mount with a `type` |
//! | 0.5.0 | a device name that does not start with a letter (a claim UID starts with a digit 10 times in 16); a device node with a `hostPath` |
//! | 0.6.0 | a dot in the kind's class (`vendor.com/a.b`) |
//!
//! The fields of each type are declared in the order their JSON names sort
//! in: the order serde_json wrote the specs in when they were built by hand
//! as maps, so that a spec is byte for byte what earlier releases wrote.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The kind of `cuslice cdi generate`'s spec (one device, `all`).
pub const GPU_KIND: &str = "cuslice.io/gpu";
/// The kind of the DRA plugin's per-claim specs (a device per claim, named
/// by the claim's UID).
pub const CLAIM_KIND: &str = "cuslice.io/claim";

/// The OCI stages a CDI hook may name (CDI's list).
const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// The CDI versions whose rules this module knows (see the module's
/// table), lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    V0_3_0,
    V0_4_0,
    V0_5_0,
    V0_6_0,
}

impl Version {
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_3_0 => "0.3.0",
            Version::V0_4_0 => "0.4.0",
            Version::V0_5_0 => "0.5.0",
            Version::V0_6_0 => "0.6.0",
        }
    }

    /// A declared `cdiVersion` ("0.5.0" or "v0.5.0", as CDI reads it), if
    /// one of these.
    pub fn parse(s: &str) -> Option<Version> {
        let s = s.strip_prefix('v').unwrap_or(s);
        [
            Version::V0_3_0,
            Version::V0_4_0,
            Version::V0_5_0,
            Version::V0_6_0,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A CDI spec: its kind, its devices and the edits made for any of them.
/// Made by [`Spec::new`] (or read by [`Spec::parse`]), which checks the
/// names and declares the version the content needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    cdi_version: String,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    container_edits: ContainerEdits,
    devices: Vec<Device>,
    kind: String,
}

/// One device of a spec: the name a runtime is asked for
/// (`<kind>=<name>`) and what it adds to a container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Always written (CDI requires it of a device), empty or not.
    #[serde(default)]
    pub container_edits: ContainerEdits,
    pub name: String,
}

/// The edits made to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// `NAME=value`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.device_nodes.is_empty()
            && self.env.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
    }
}

/// A device node the container gets (`path` in the container; from
/// `host_path` on the host where that differs: CDI 0.5.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    pub path: String,
}

impl DeviceNode {
    /// The node at the same path on the host and in the container.
    pub fn at(path: impl Into<String>) -> DeviceNode {
        DeviceNode {
            host_path: None,
            path: path.into(),
        }
    }
}

/// An OCI hook: `path` run with `args` (`args[0]` included) and `env`
/// at the stage `hook_name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    pub hook_name: String,
    pub path: String,
}

/// A mount (`type`: CDI 0.4.0).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl Spec {
    /// A spec of `kind` with `devices` (at least one) and `container_edits`
    /// (made for any of them), its names checked as CDI checks them and its
    /// version the lowest its content needs.
    pub fn new(
        kind: &str,
        devices: Vec<Device>,
        container_edits: ContainerEdits,
    ) -> Result<Spec, String> {
        let mut s = Spec {
            cdi_version: String::new(),
            container_edits,
            devices,
            kind: kind.to_string(),
        };
        s.check_content()?;
        s.cdi_version = s.minimum_version().as_str().to_string();
        Ok(s)
    }

    /// A spec as a file holds it, checked as [`Spec::new`] checks one, and
    /// its declared version one CDI knows and at least what its content
    /// needs (what a runtime's CDI library checks before it uses a spec).
    pub fn parse(text: &str) -> Result<Spec, String> {
        let s: Spec =
            serde_json::from_str(text).map_err(|e| format!("not a CDI spec of ours: {e}"))?;
        s.check_content()?;
        let declared = Version::parse(&s.cdi_version)
            .ok_or_else(|| format!("cdiVersion {:?} is not one CDI knows", s.cdi_version))?;
        let needed = s.minimum_version();
        if declared < needed {
            return Err(format!(
                "cdiVersion {declared}, but its content needs {needed} at least"
            ));
        }
        Ok(s)
    }

    /// The declared `cdiVersion`.
    pub fn version(&self) -> &str {
        &self.cdi_version
    }

    pub fn kind(&self) -> &str {
        &self.kind
    }

    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    pub fn container_edits(&self) -> &ContainerEdits {
        &self.container_edits
    }

    /// The lowest CDI version this content needs (the module's table).
    pub fn minimum_version(&self) -> Version {
        let mut v = Version::V0_3_0;
        let edits = || {
            self.devices
                .iter()
                .map(|d| &d.container_edits)
                .chain([&self.container_edits])
        };
        if edits().any(|e| e.mounts.iter().any(|m| m.kind.is_some())) {
            v = v.max(Version::V0_4_0);
        }
        if self
            .devices
            .iter()
            .any(|d| !d.name.starts_with(|c: char| c.is_ascii_alphabetic()))
            || edits().any(|e| e.device_nodes.iter().any(|n| n.host_path.is_some()))
        {
            v = v.max(Version::V0_5_0);
        }
        if self
            .kind
            .split_once('/')
            .is_some_and(|(_, class)| class.contains('.'))
        {
            v = v.max(Version::V0_6_0);
        }
        v
    }

    /// The spec as its file holds it: indented JSON and a newline.
    pub fn to_json(&self) -> String {
        // Only strings, lists and maps with string keys: serializing cannot
        // fail.
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// The fully qualified name of its device `name`, as a runtime is asked
    /// for it.
    pub fn qualified(&self, name: &str) -> String {
        qualified(&self.kind, name)
    }

    /// Everything but the version: the kind, at least one device, unique
    /// and valid device names, and each edit (hook stages, absolute hook
    /// paths, `NAME=value` environment entries, non-empty paths).
    fn check_content(&self) -> Result<(), String> {
        check_kind(&self.kind)?;
        if self.devices.is_empty() {
            return Err(format!("CDI spec of kind {}: no device", self.kind));
        }
        let mut seen = BTreeSet::new();
        for d in &self.devices {
            check_device_name(&d.name)?;
            if !seen.insert(d.name.as_str()) {
                return Err(format!("CDI device name {:?} given twice", d.name));
            }
            check_edits(&d.container_edits)
                .map_err(|e| format!("CDI device {}: {e}", self.qualified(&d.name)))?;
        }
        check_edits(&self.container_edits)
            .map_err(|e| format!("CDI spec of kind {}: {e}", self.kind))
    }
}

/// `<kind>=<name>`: a device as a runtime is asked for it.
pub fn qualified(kind: &str, name: &str) -> String {
    format!("{kind}={name}")
}

/// The file name of a spec with one device `name` of `kind` in a CDI
/// directory: `<vendor>-<class>_<name>.json` (CDI's name for such a
/// "transient" spec; `cuslice.io-claim_<uid>.json`).
pub fn file_name(kind: &str, name: &str) -> String {
    format!("{}_{name}.json", kind.replace('/', "-"))
}

/// A device name as CDI accepts one: letters, digits, `_`, `-`, `.` and
/// `:`, beginning and ending with a letter or a digit (one starting with a
/// digit needs CDI 0.5.0, which [`Spec::new`] then declares).
pub fn check_device_name(name: &str) -> Result<(), String> {
    let b = name.as_bytes();
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    let ok = match b {
        [] => false,
        [c] => alnum(*c),
        [first, mid @ .., last] => {
            alnum(*first)
                && alnum(*last)
                && mid
                    .iter()
                    .all(|&c| alnum(c) || matches!(c, b'_' | b'-' | b'.' | b':'))
        }
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a CDI device name (letters, digits, _ - . : between a letter or digit at each end)"
        ))
    }
}

/// A kind as CDI accepts one: `<vendor>/<class>`, each of letters, digits,
/// `_`, `-` and `.`, starting with a letter and ending with a letter or a
/// digit.
fn check_kind(kind: &str) -> Result<(), String> {
    let part = |s: &str| {
        let b = s.as_bytes();
        b.first().is_some_and(|c| c.is_ascii_alphabetic())
            && b.last().is_some_and(|c| c.is_ascii_alphanumeric())
            && b.iter()
                .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
    };
    match kind.split_once('/') {
        Some((vendor, class)) if part(vendor) && part(class) => Ok(()),
        _ => Err(format!(
            "{kind:?} is not a CDI kind (vendor/class: letters, digits, _ - ., from a letter to a letter or digit)"
        )),
    }
}

fn check_env(env: &[String]) -> Result<(), String> {
    match env.iter().find(|e| e.find('=').is_none_or(|i| i == 0)) {
        Some(e) => Err(format!("environment entry {e:?} is not NAME=value")),
        None => Ok(()),
    }
}

fn check_edits(e: &ContainerEdits) -> Result<(), String> {
    check_env(&e.env)?;
    for h in &e.hooks {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(format!(
                "hook stage {:?} is none of {}",
                h.hook_name,
                HOOK_NAMES.join(", ")
            ));
        }
        if !h.path.starts_with('/') {
            return Err(format!("hook path {:?} is not absolute", h.path));
        }
        check_env(&h.env)?;
    }
    for n in &e.device_nodes {
        if n.path.is_empty() || n.host_path.as_deref() == Some("") {
            return Err("a device node with an empty path".into());
        }
    }
    for m in &e.mounts {
        if m.host_path.is_empty() || m.container_path.is_empty() {
            return Err("a mount with an empty path".into());
        }
    }
    Ok(())
}

/// The two hooks of every cuslice CDI device: `cuslice oci-hook create`
/// at `createRuntime` and `cuslice oci-hook poststop` at `poststop`, each
/// with `--root` and `--lib` where given, and `create` with `--claim`
/// for a DRA claim's device.
pub struct OciHooks<'a> {
    /// The `cuslice` command, as the runtime finds it on the host.
    pub cuslice: &'a Path,
    pub root: Option<&'a Path>,
    pub lib: Option<&'a Path>,
    pub claim: Option<&'a str>,
}

impl OciHooks<'_> {
    /// The hooks; a path that is not UTF-8 is an error (a CDI spec is JSON:
    /// a path written lossily would name another file).
    pub fn hooks(&self) -> Result<Vec<Hook>, String> {
        let text = |what: &str, p: &Path| {
            p.to_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{what} {}: not UTF-8", p.display()))
        };
        let path = text("the cuslice command", self.cuslice)?;
        let mut common = vec![];
        if let Some(r) = self.root {
            common.extend(["--root".to_string(), text("--root", r)?]);
        }
        if let Some(l) = self.lib {
            common.extend(["--lib".to_string(), text("--lib", l)?]);
        }
        let hook = |stage: &str, name: &str, extra: &[String]| Hook {
            args: ["cuslice", "oci-hook", name]
                .into_iter()
                .map(str::to_string)
                .chain(common.iter().cloned())
                .chain(extra.iter().cloned())
                .collect(),
            env: vec![],
            hook_name: stage.into(),
            path: path.clone(),
        };
        let claim: Vec<String> = self
            .claim
            .map(|c| vec!["--claim".to_string(), c.to_string()])
            .unwrap_or_default();
        Ok(vec![
            hook("createRuntime", "create", &claim),
            hook("poststop", "poststop", &[]),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(name: &str) -> Device {
        Device {
            container_edits: ContainerEdits {
                device_nodes: vec![DeviceNode::at("/dev/nvidia0")],
                ..ContainerEdits::default()
            },
            name: name.into(),
        }
    }

    fn version(kind: &str, d: Device) -> Result<String, String> {
        Spec::new(kind, vec![d], ContainerEdits::default()).map(|s| s.version().to_string())
    }

    #[test]
    fn the_version_is_the_lowest_the_content_needs() {
        // A letter first: 0.3.0 (what podman 4.3 reads, like 0.4.0 and 0.5.0).
        assert_eq!(version(GPU_KIND, device("all")).as_deref(), Ok("0.3.0"));
        assert_eq!(
            version(CLAIM_KIND, device("a7e3-x")).as_deref(),
            Ok("0.3.0")
        );
        // A claim UID starting with a digit: 0.5.0 (CDI's libraries from
        // v0.5.4 on drop an older spec with such a name).
        assert_eq!(
            version(CLAIM_KIND, device("7e3a1111-2222-4333-8444-555555555555")).as_deref(),
            Ok("0.5.0")
        );
        let mut d = device("all");
        d.container_edits.device_nodes[0].host_path = Some("/dev/nvidia3".into());
        assert_eq!(version(GPU_KIND, d).as_deref(), Ok("0.5.0"));
        let mut d = device("all");
        d.container_edits.mounts.push(Mount {
            container_path: "/x".into(),
            host_path: "/y".into(),
            options: vec!["ro".into()],
            kind: None,
        });
        assert_eq!(version(GPU_KIND, d.clone()).as_deref(), Ok("0.3.0"));
        d.container_edits.mounts[0].kind = Some("bind".into());
        assert_eq!(version(GPU_KIND, d).as_deref(), Ok("0.4.0"));
        // A mount with a type among the spec-wide edits counts too.
        let edits = ContainerEdits {
            mounts: vec![Mount {
                container_path: "/x".into(),
                host_path: "/y".into(),
                options: vec![],
                kind: Some("bind".into()),
            }],
            ..ContainerEdits::default()
        };
        let s = Spec::new(GPU_KIND, vec![device("all")], edits).expect("spec");
        assert_eq!(s.version(), "0.4.0");
        assert_eq!(
            version("cuslice.io/gpu.v2", device("all")).as_deref(),
            Ok("0.6.0")
        );
        assert_eq!(
            version("cuslice.io/gpu.v2", device("0")).as_deref(),
            Ok("0.6.0")
        );
    }

    #[test]
    fn names_cdi_refuses_are_refused() {
        for bad in ["", "-x", "x-", ".x", "a/b", "a b", "a=b", "é", "uid\n"] {
            let e = version(CLAIM_KIND, device(bad)).expect_err(bad);
            assert!(e.contains("is not a CDI device name"), "{e}");
        }
        for good in [
            "0",
            "a",
            "a:b_c.d-e",
            "11111111-2222-4333-8444-555555555555",
        ] {
            assert!(version(CLAIM_KIND, device(good)).is_ok(), "{good}");
        }
        for bad in [
            "cuslice.io",
            "/gpu",
            "cuslice.io/",
            "1x/gpu",
            "x/gpu-",
            "x/g/p",
            "x y/gpu",
        ] {
            let e = version(bad, device("all")).expect_err(bad);
            assert!(e.contains("is not a CDI kind"), "{e}");
        }
        let e = Spec::new(GPU_KIND, vec![], ContainerEdits::default()).expect_err("no device");
        assert!(e.ends_with("no device"), "{e}");
        let e = Spec::new(
            GPU_KIND,
            vec![device("a"), device("a")],
            ContainerEdits::default(),
        )
        .expect_err("twice");
        assert!(e.ends_with("given twice"), "{e}");
    }

    #[test]
    fn hooks_are_checked_and_spelled_once() {
        let cuslice = Path::new("/usr/bin/cuslice");
        let root = Path::new("/srv/cuslice");
        let hooks = OciHooks {
            cuslice,
            root: Some(root),
            lib: None,
            claim: Some("u-1"),
        }
        .hooks()
        .expect("hooks");
        assert_eq!(
            hooks.iter().map(|h| h.args.join(" ")).collect::<Vec<_>>(),
            [
                "cuslice oci-hook create --root /srv/cuslice --claim u-1",
                "cuslice oci-hook poststop --root /srv/cuslice"
            ]
        );
        let mut d = device("all");
        d.container_edits.hooks = hooks;
        assert!(Spec::new(GPU_KIND, vec![d.clone()], ContainerEdits::default()).is_ok());
        let mut bad = d.clone();
        bad.container_edits.hooks[0].hook_name = "prestop".into();
        let e = Spec::new(GPU_KIND, vec![bad], ContainerEdits::default()).expect_err("stage");
        assert!(e.contains("hook stage \"prestop\" is none of"), "{e}");
        let mut bad = d.clone();
        bad.container_edits.hooks[0].path = "cuslice".into();
        assert!(Spec::new(GPU_KIND, vec![bad], ContainerEdits::default()).is_err());
        let mut bad = d;
        bad.container_edits.hooks[1].env = vec!["=x".into()];
        assert!(Spec::new(GPU_KIND, vec![bad], ContainerEdits::default()).is_err());
        // A path that is not UTF-8 is not written lossily.
        use std::os::unix::ffi::OsStrExt;
        let odd = Path::new(std::ffi::OsStr::from_bytes(b"/opt/\xff/cuslice"));
        let e = OciHooks {
            cuslice: odd,
            root: None,
            lib: None,
            claim: None,
        }
        .hooks()
        .expect_err("not UTF-8");
        assert!(e.ends_with("not UTF-8"), "{e}");
    }

    #[test]
    fn a_spec_reads_back_and_a_version_below_its_content_is_refused() {
        let s =
            Spec::new(CLAIM_KIND, vec![device("1d0c")], ContainerEdits::default()).expect("spec");
        let text = s.to_json();
        assert!(text.ends_with("}\n"));
        assert_eq!(Spec::parse(&text).expect("parses"), s);
        assert_eq!(s.qualified("1d0c"), "cuslice.io/claim=1d0c");
        assert_eq!(file_name(CLAIM_KIND, "1d0c"), "cuslice.io-claim_1d0c.json");
        let old = text.replace("\"0.5.0\"", "\"0.3.0\"");
        let e = Spec::parse(&old).expect_err("too old for a digit");
        assert_eq!(e, "cdiVersion 0.3.0, but its content needs 0.5.0 at least");
        let unknown = text.replace("\"0.5.0\"", "\"0.9.9\"");
        assert!(Spec::parse(&unknown).is_err());
        assert_eq!(
            Spec::parse(&text.replace("\"0.5.0\"", "\"v0.6.0\""))
                .expect("later is fine")
                .version(),
            "v0.6.0"
        );
    }

    /// Byte for byte what the hand-built specs were (keys in sorted order,
    /// two-space indent): `cuslice cdi generate --root --lib` and a claim's.
    #[test]
    fn the_json_is_what_the_hand_built_specs_were() {
        let hooks = OciHooks {
            cuslice: Path::new("/x/cuslice"),
            root: Some(Path::new("/srv/cuslice")),
            lib: Some(Path::new("/opt/libcuslice.so")),
            claim: None,
        }
        .hooks()
        .expect("hooks");
        let s = Spec::new(
            GPU_KIND,
            vec![Device {
                container_edits: ContainerEdits {
                    hooks,
                    ..ContainerEdits::default()
                },
                name: "all".into(),
            }],
            ContainerEdits::default(),
        )
        .expect("spec");
        let hook = |stage: &str, name: &str| {
            format!(
                r#"          {{
            "args": [
              "cuslice",
              "oci-hook",
              "{name}",
              "--root",
              "/srv/cuslice",
              "--lib",
              "/opt/libcuslice.so"
            ],
            "hookName": "{stage}",
            "path": "/x/cuslice"
          }}"#
            )
        };
        let want = format!(
            r#"{{
  "cdiVersion": "0.3.0",
  "devices": [
    {{
      "containerEdits": {{
        "hooks": [
{},
{}
        ]
      }},
      "name": "all"
    }}
  ],
  "kind": "cuslice.io/gpu"
}}
"#,
            hook("createRuntime", "create"),
            hook("poststop", "poststop")
        );
        assert_eq!(s.to_json(), want);
        let uid = "3c9b2f4e-1a7d-4b6e-8f0a-5d2c4e6a8b0d";
        let hooks = OciHooks {
            cuslice: Path::new("/opt/cuslice/bin/cuslice"),
            root: Some(Path::new("/run/cuslice")),
            lib: None,
            claim: Some(uid),
        }
        .hooks()
        .expect("hooks");
        let s = Spec::new(
            CLAIM_KIND,
            vec![Device {
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode::at("/dev/nvidia2")],
                    hooks,
                    ..ContainerEdits::default()
                },
                name: uid.into(),
            }],
            ContainerEdits::default(),
        )
        .expect("spec");
        let want = format!(
            r#"{{
  "cdiVersion": "0.5.0",
  "devices": [
    {{
      "containerEdits": {{
        "deviceNodes": [
          {{
            "path": "/dev/nvidia2"
          }}
        ],
        "hooks": [
          {{
            "args": [
              "cuslice",
              "oci-hook",
              "create",
              "--root",
              "/run/cuslice",
              "--claim",
              "{uid}"
            ],
            "hookName": "createRuntime",
            "path": "/opt/cuslice/bin/cuslice"
          }},
          {{
            "args": [
              "cuslice",
              "oci-hook",
              "poststop",
              "--root",
              "/run/cuslice"
            ],
            "hookName": "poststop",
            "path": "/opt/cuslice/bin/cuslice"
          }}
        ]
      }},
      "name": "{uid}"
    }}
  ],
  "kind": "cuslice.io/claim"
}}
"#
        );
        assert_eq!(s.to_json(), want);
    }
}
