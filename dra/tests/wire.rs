//! The kubelet's gRPC definitions in proto/, pinned: every package,
//! message, field name, number and type, and every method's full path, as
//! noted from the published API (kubernetes/kubernetes,
//! staging/src/k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto and
//! staging/src/k8s.io/kubelet/pkg/apis/dra/v1/api.proto). A drift in
//! proto/ fails here, not in a kubelet.

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type};

/// `package.Message field number type label`, one line each, sorted.
fn fields() -> Vec<String> {
    let set = prost_types::FileDescriptorSet::decode(cuslice_dra::proto::DESCRIPTORS)
        .expect("descriptors");
    let mut out = vec![];
    for f in &set.file {
        let pkg = f.package();
        for m in &f.message_type {
            for fd in &m.field {
                let ty = match fd.r#type() {
                    Type::Message => fd.type_name().to_string(),
                    t => format!("{t:?}").to_lowercase(),
                };
                let label = match fd.label() {
                    Label::Repeated => "repeated",
                    _ => "single",
                };
                out.push(format!(
                    "{pkg}.{} {} {} {ty} {label}",
                    m.name(),
                    fd.name(),
                    fd.number()
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn messages_and_field_numbers_are_the_kubelets() {
    const D: &str = "k8s.io.kubelet.pkg.apis.dra.v1";
    let mut want: Vec<String> = [
        "pluginregistration.PluginInfo type 1 string single".to_string(),
        "pluginregistration.PluginInfo name 2 string single".into(),
        "pluginregistration.PluginInfo endpoint 3 string single".into(),
        "pluginregistration.PluginInfo supported_versions 4 string repeated".into(),
        "pluginregistration.RegistrationStatus plugin_registered 1 bool single".into(),
        "pluginregistration.RegistrationStatus error 2 string single".into(),
        format!("{D}.Claim namespace 1 string single"),
        format!("{D}.Claim uid 2 string single"),
        format!("{D}.Claim name 3 string single"),
        format!("{D}.NodePrepareResourcesRequest claims 1 .{D}.Claim repeated"),
        // A map is a repeated entry message: key 1, value 2.
        format!("{D}.NodePrepareResourcesResponse claims 1 .{D}.NodePrepareResourcesResponse.ClaimsEntry repeated"),
        format!("{D}.NodePrepareResourceResponse devices 1 .{D}.Device repeated"),
        format!("{D}.NodePrepareResourceResponse error 2 string single"),
        format!("{D}.Device request_names 1 string repeated"),
        format!("{D}.Device pool_name 2 string single"),
        format!("{D}.Device device_name 3 string single"),
        format!("{D}.Device cdi_device_ids 4 string repeated"),
        format!("{D}.NodeUnprepareResourcesRequest claims 1 .{D}.Claim repeated"),
        format!("{D}.NodeUnprepareResourcesResponse claims 1 .{D}.NodeUnprepareResourcesResponse.ClaimsEntry repeated"),
        format!("{D}.NodeUnprepareResourceResponse error 1 string single"),
    ]
    .into();
    want.sort();
    assert_eq!(fields(), want);
    // The map entries.
    let set = prost_types::FileDescriptorSet::decode(cuslice_dra::proto::DESCRIPTORS)
        .expect("descriptors");
    let dra = set
        .file
        .iter()
        .find(|f| f.package() == D)
        .expect("dra file");
    for (msg, value) in [
        (
            "NodePrepareResourcesResponse",
            "NodePrepareResourceResponse",
        ),
        (
            "NodeUnprepareResourcesResponse",
            "NodeUnprepareResourceResponse",
        ),
    ] {
        let m = dra
            .message_type
            .iter()
            .find(|m| m.name() == msg)
            .expect(msg);
        let e = &m.nested_type[0];
        assert!(
            e.options.as_ref().is_some_and(|o| o.map_entry()),
            "{msg}: a map"
        );
        let kv: Vec<(String, i32, String)> = e
            .field
            .iter()
            .map(|f| (f.name().to_string(), f.number(), f.type_name().to_string()))
            .collect();
        assert_eq!(
            kv,
            [
                ("key".to_string(), 1, String::new()),
                ("value".to_string(), 2, format!(".{D}.{value}"))
            ]
        );
    }
    // The empty messages exist and stay empty.
    let reg = set
        .file
        .iter()
        .find(|f| f.package() == "pluginregistration")
        .expect("reg");
    for m in ["InfoRequest", "RegistrationStatusResponse"] {
        let m = reg.message_type.iter().find(|x| x.name() == m).expect(m);
        assert!(m.field.is_empty());
    }
}

#[test]
fn method_paths_are_the_kubelets() {
    let set = prost_types::FileDescriptorSet::decode(cuslice_dra::proto::DESCRIPTORS)
        .expect("descriptors");
    let mut paths = vec![];
    for f in &set.file {
        for s in &f.service {
            for m in &s.method {
                paths.push(format!(
                    "/{}.{}/{} {} -> {}",
                    f.package(),
                    s.name(),
                    m.name(),
                    m.input_type(),
                    m.output_type()
                ));
            }
        }
    }
    paths.sort();
    assert_eq!(
        paths,
        [
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources .k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest -> .k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources .k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesRequest -> .k8s.io.kubelet.pkg.apis.dra.v1.NodeUnprepareResourcesResponse",
            "/pluginregistration.Registration/GetInfo .pluginregistration.InfoRequest -> .pluginregistration.PluginInfo",
            "/pluginregistration.Registration/NotifyRegistrationStatus .pluginregistration.RegistrationStatus -> .pluginregistration.RegistrationStatusResponse",
        ]
    );
}

#[test]
fn generated_messages_encode_as_the_kubelet_expects() {
    use cuslice_dra::proto::{dra, registration};
    let c = dra::Claim {
        namespace: "a".into(),
        uid: "b".into(),
        name: "c".into(),
    };
    assert_eq!(
        c.encode_to_vec(),
        [0x0a, 1, b'a', 0x12, 1, b'b', 0x1a, 1, b'c']
    );
    let i = registration::PluginInfo {
        r#type: "T".into(),
        name: "n".into(),
        endpoint: "e".into(),
        supported_versions: vec!["v".into()],
    };
    assert_eq!(
        i.encode_to_vec(),
        [0x0a, 1, b'T', 0x12, 1, b'n', 0x1a, 1, b'e', 0x22, 1, b'v']
    );
    let mut r = dra::NodeUnprepareResourcesResponse::default();
    r.claims.insert(
        "u".into(),
        dra::NodeUnprepareResourceResponse { error: "x".into() },
    );
    // claims (1, bytes) { key (1) "u", value (2) { error (1) "x" } }
    assert_eq!(
        r.encode_to_vec(),
        [0x0a, 8, 0x0a, 1, b'u', 0x12, 3, 0x0a, 1, b'x']
    );
}
