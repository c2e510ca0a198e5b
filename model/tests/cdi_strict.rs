//! Reading CDI specs is strict, as in the reference loader: an unknown field
//! anywhere fails the whole spec, in JSON and in YAML.

use tessera_model::cdi::{CdiVersion, Spec, minimum_version};

/// A spec using every field at every level (cdiVersion 1.1.0 for netDevices).
const FULL: &str = r#"{
  "cdiVersion": "1.1.0",
  "kind": "tessera.io/gpu",
  "annotations": {"tessera.io/node": "gpu-node-1"},
  "devices": [
    {
      "name": "0",
      "annotations": {"tessera.io/uuid": "GPU-1"},
      "containerEdits": {
        "env": ["NVIDIA_VISIBLE_DEVICES=void"],
        "deviceNodes": [
          {"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0", "type": "c", "major": 195,
           "minor": 0, "fileMode": 438, "permissions": "rw", "uid": 0, "gid": 0}
        ],
        "hooks": [
          {"hookName": "createContainer", "path": "/usr/bin/tessera-hook",
           "args": ["tessera-hook", "create-container"], "env": ["PATH=/usr/bin"], "timeout": 10}
        ],
        "mounts": [
          {"hostPath": "/usr/lib/tessera/libtessera_vgpu.so",
           "containerPath": "/usr/local/tessera/libtessera_vgpu.so",
           "options": ["ro", "nosuid", "nodev", "bind"], "type": "bind"}
        ],
        "intelRdt": {"closID": "gold", "l3CacheSchema": "L3:0=f", "memBwSchema": "MB:0=50",
                     "schemata": ["L3:0=f"], "enableMonitoring": true},
        "additionalGids": [44],
        "netDevices": [{"hostInterfaceName": "eth1", "name": "net0"}]
      }
    }
  ],
  "containerEdits": {
    "deviceNodes": [{"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255}]
  }
}"#;

/// Inserts `"bogus": 1,` as the first member of the object that follows `anchor`.
fn with_unknown_field_after(anchor: &str) -> String {
    let at = FULL
        .find(anchor)
        .unwrap_or_else(|| panic!("anchor {anchor:?} not in the fixture"));
    let brace = at + FULL[at..].find('{').expect("an object follows the anchor");
    format!("{}\"bogus\": 1, {}", &FULL[..=brace], &FULL[brace + 1..])
}

#[test]
fn the_full_fixture_parses_validates_and_round_trips() {
    let spec: Spec = serde_json::from_str(FULL).expect("fixture parses");
    assert_eq!(spec.validate(), Ok(()));
    assert_eq!(minimum_version(&spec), CdiVersion::V1_1_0);
    let again: Spec =
        serde_json::from_str(&serde_json::to_string(&spec).expect("serializes")).expect("reparses");
    assert_eq!(again, spec);
    let yaml = serde_yaml::to_string(&spec).expect("to yaml");
    let from_yaml: Spec = serde_yaml::from_str(&yaml).expect("yaml reparses");
    assert_eq!(from_yaml, spec);
}

#[test]
fn an_unknown_field_anywhere_fails_deserialization() {
    let anchors = [
        ("spec", "{"),
        ("device", "\"devices\": ["),
        (
            "device containerEdits",
            "\"containerEdits\": {\n        \"env\"",
        ),
        ("deviceNode", "\"deviceNodes\": ["),
        ("hook", "\"hooks\": ["),
        ("mount", "\"mounts\": ["),
        ("intelRdt", "\"intelRdt\":"),
        ("netDevice", "\"netDevices\":"),
        (
            "spec containerEdits",
            "\"additionalGids\": [44],\n        \"netDevices\": [{\"hostInterfaceName\": \"eth1\", \"name\": \"net0\"}]\n      }\n    }\n  ],\n  \"containerEdits\":",
        ),
    ];
    for (level, anchor) in anchors {
        let text = with_unknown_field_after(anchor);
        let err = serde_json::from_str::<Spec>(&text)
            .expect_err(&format!("unknown field in {level} must fail:\n{text}"));
        assert!(
            err.to_string().contains("unknown field `bogus`"),
            "{level}: {err}"
        );
        let yaml_err = serde_yaml::from_str::<Spec>(&text)
            .expect_err(&format!("unknown field in {level} must fail as YAML too"));
        assert!(
            yaml_err.to_string().contains("unknown field `bogus`"),
            "{level} (yaml): {yaml_err}"
        );
    }
}

#[test]
fn required_fields_are_required() {
    for (what, text) in [
        ("cdiVersion", r#"{"kind":"a/b","devices":[]}"#),
        ("kind", r#"{"cdiVersion":"0.3.0","devices":[]}"#),
        ("devices", r#"{"cdiVersion":"0.3.0","kind":"a/b"}"#),
        (
            "device containerEdits",
            r#"{"cdiVersion":"0.3.0","kind":"a/b","devices":[{"name":"x"}]}"#,
        ),
        (
            "deviceNode path",
            r#"{"cdiVersion":"0.3.0","kind":"a/b","devices":[{"name":"x","containerEdits":{"deviceNodes":[{"type":"c"}]}}]}"#,
        ),
        (
            "mount containerPath",
            r#"{"cdiVersion":"0.3.0","kind":"a/b","devices":[{"name":"x","containerEdits":{"mounts":[{"hostPath":"/a"}]}}]}"#,
        ),
        (
            "hook path",
            r#"{"cdiVersion":"0.3.0","kind":"a/b","devices":[{"name":"x","containerEdits":{"hooks":[{"hookName":"prestart"}]}}]}"#,
        ),
    ] {
        let err = serde_json::from_str::<Spec>(text).expect_err(what);
        assert!(err.to_string().contains("missing field"), "{what}: {err}");
    }
}

#[test]
fn a_spec_like_the_nvidia_toolkit_writes_loads_from_yaml() {
    let yaml = r#"
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  - path: /dev/nvidia-uvm
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15
    options:
    - ro
    - nosuid
    - nodev
    - bind
"#;
    let spec: Spec = serde_yaml::from_str(yaml).expect("parses");
    assert_eq!(spec.validate(), Ok(()));
    assert_eq!(minimum_version(&spec), CdiVersion::V0_5_0);
}

#[test]
fn declaring_less_than_the_content_needs_is_a_problem() {
    let text = FULL.replace("\"cdiVersion\": \"1.1.0\"", "\"cdiVersion\": \"1.0.0\"");
    let spec: Spec = serde_json::from_str(&text).expect("parses");
    let problems: Vec<String> = spec
        .validate()
        .expect_err("too low")
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        problems,
        [
            "cdiVersion: \"1.0.0\" is below 1.1.0, the minimum this content needs (netDevices are used)"
        ]
    );
}
