//! Loading Tessera's CDI specs from the trusted directory and turning the
//! requested devices into one set of container edits.
//!
//! Parsing is strict ([`Spec`] rejects unknown fields, [`Spec::validate`] every
//! rule), and the kind and device names are checked against the contract:
//! a transient spec is kind `tessera.io/alloc` with exactly one device named
//! after the allocation; the static spec is kind `tessera.io/gpu`.

use tessera_model::alloc::AllocId;
use tessera_model::cdi::{ContainerEdits, Spec};
use tessera_model::contract::cdi::{ALL_DEVICES, ALLOC_KIND, GPU_KIND};
use tessera_model::contract::env::VISIBLE_DEVICES;

use crate::error::{HookError, Result, one_line};
use crate::oci::OciConfig;
use crate::request::VisibleDevices;
use crate::trust::TrustedDir;

/// Parses and validates a spec document; the error is one line.
pub fn parse_spec(raw: &[u8]) -> std::result::Result<Spec, String> {
    let spec: Spec = serde_json::from_slice(raw).map_err(|e| one_line(&e.to_string()))?;
    spec.validate_tessera().map_err(|problems| {
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })?;
    Ok(spec)
}

/// The edits of an allocation's transient spec: the spec-level edits, then the
/// device's, merged as the CDI applier merges them.
pub fn alloc_edits(spec: &Spec, id: &AllocId) -> std::result::Result<ContainerEdits, String> {
    if spec.kind != ALLOC_KIND {
        return Err(format!("kind is {:?}, expected {ALLOC_KIND:?}", spec.kind));
    }
    match spec.devices.as_slice() {
        [device] if device.name == id.as_str() => Ok(ContainerEdits::merged([
            &spec.container_edits,
            &device.container_edits,
        ])),
        [device] => Err(format!(
            "its device is named {:?}, expected the allocation id {:?}",
            device.name,
            id.as_str()
        )),
        devices => Err(format!(
            "has {} devices, expected exactly one named {:?}",
            devices.len(),
            id.as_str()
        )),
    }
}

/// The edits for `NVIDIA_VISIBLE_DEVICES` from the static spec: the spec-level
/// edits, then each named device's, in the order named.
pub fn static_edits(
    spec: &Spec,
    wanted: &VisibleDevices,
) -> std::result::Result<ContainerEdits, String> {
    if spec.kind != GPU_KIND {
        return Err(format!("kind is {:?}, expected {GPU_KIND:?}", spec.kind));
    }
    let all = [ALL_DEVICES.to_owned()];
    let names: &[String] = match wanted {
        VisibleDevices::All => &all,
        VisibleDevices::Named(names) => names,
    };
    let mut edits = spec.container_edits.clone();
    for name in names {
        let device = spec.devices.iter().find(|d| &d.name == name).ok_or_else(|| {
            let known: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
            format!(
                "{VISIBLE_DEVICES} names {name:?}, which is not a device of {GPU_KIND} (devices: {})",
                known.join(", ")
            )
        })?;
        edits.append(&device.container_edits);
    }
    Ok(edits)
}

/// The mounts of `spec` (its spec-level edits and every device's) that the
/// runtime put in the container's config as they are: a config mount with the
/// same destination and the same source. These are the host files a
/// container that asked the hook for nothing got from a trusted spec, and the
/// only ones [`crate::libraries`] may register for it.
pub fn applied_mounts(spec: &Spec, oci: &OciConfig) -> ContainerEdits {
    let mut edits = ContainerEdits::default();
    let all = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits));
    for m in all.flat_map(|e| &e.mounts) {
        let applied = oci.mounts.iter().any(|c| {
            c.destination == m.container_path && c.source.as_deref() == Some(m.host_path.as_str())
        });
        if applied && !edits.mounts.contains(m) {
            edits.mounts.push(m.clone());
        }
    }
    edits
}

/// Reads, parses and validates a spec file from the trusted directory;
/// `Ok(None)` when the directory or file does not exist.
pub fn load_spec(dir: Option<&TrustedDir>, file: &str) -> Result<Option<Spec>> {
    let Some(dir) = dir else { return Ok(None) };
    let Some(raw) = dir.read(file)? else {
        return Ok(None);
    };
    parse_spec(&raw).map(Some).map_err(|reason| {
        HookError::untrusted(dir.path().join(file), format!("invalid CDI spec: {reason}"))
    })
}

/// Loads the allocation's transient spec and returns its edits; `Ok(None)`
/// when the spec does not exist.
pub fn load_alloc_edits(dir: Option<&TrustedDir>, id: &AllocId) -> Result<Option<ContainerEdits>> {
    let file = id.spec_file_name();
    let Some(spec) = load_spec(dir, &file)? else {
        return Ok(None);
    };
    alloc_edits(&spec, id).map(Some).map_err(|reason| {
        let path = dir.map(|d| d.path().join(&file)).unwrap_or_default();
        HookError::untrusted(path, reason)
    })
}

#[cfg(test)]
mod tests {
    use tessera_model::cdi::{Device, DeviceNode, Hook, Mount};
    use tessera_model::contract::hook::{BINARY_NAME, BINARY_PATH, PATH_ENV};
    use tessera_model::contract::vgpu::{CONTAINER_LIBRARY, HOST_LIBRARY};

    use super::*;

    fn node(path: &str, minor: u32) -> DeviceNode {
        DeviceNode::char(path, 195, minor)
    }

    fn edits_with(nodes: Vec<DeviceNode>) -> ContainerEdits {
        ContainerEdits {
            device_nodes: nodes,
            ..Default::default()
        }
    }

    fn common() -> ContainerEdits {
        ContainerEdits {
            env: vec![format!("{VISIBLE_DEVICES}=void")],
            device_nodes: vec![node("/dev/nvidiactl", 255)],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: BINARY_PATH.into(),
                args: vec![BINARY_NAME.into(), "prestart".into()],
                env: vec![PATH_ENV.into()],
                timeout: None,
            }],
            mounts: vec![Mount {
                host_path: HOST_LIBRARY.into(),
                container_path: CONTAINER_LIBRARY.into(),
                options: vec!["ro".into(), "bind".into()],
                mount_type: None,
            }],
            ..Default::default()
        }
    }

    /// A complete transient spec: `TESSERA_ALLOC_ID` and both hook entries.
    fn alloc_spec(id: &str) -> Spec {
        let mut device = edits_with(vec![node("/dev/nvidia0", 0)]);
        device.env = vec![format!("TESSERA_ALLOC_ID={id}")];
        let mut spec_level = common();
        let mut unbind = spec_level.hooks[0].clone();
        unbind.hook_name = "poststop".into();
        unbind.args = vec![BINARY_NAME.into(), "poststop".into()];
        spec_level.hooks.push(unbind);
        Spec::new(ALLOC_KIND, vec![Device::new(id, device)], spec_level).expect("valid spec")
    }

    #[test]
    fn alloc_spec_edits_are_common_then_device() {
        let id = AllocId::new("pod-0").expect("id");
        let edits = alloc_edits(&alloc_spec("pod-0"), &id).expect("edits");
        let paths: Vec<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, ["/dev/nvidiactl", "/dev/nvidia0"]);
        assert_eq!(edits.mounts.len(), 1);
    }

    #[test]
    fn alloc_spec_must_match_kind_and_id() {
        let id = AllocId::new("pod-0").expect("id");
        let e = alloc_edits(&alloc_spec("pod-1"), &id).expect_err("other id");
        assert!(e.contains("named \"pod-1\""), "{e}");
        let mut two = alloc_spec("pod-0");
        two.devices.push(Device::new(
            "pod-1",
            edits_with(vec![node("/dev/nvidia1", 1)]),
        ));
        assert!(
            alloc_edits(&two, &id)
                .expect_err("two")
                .contains("has 2 devices")
        );
        let mut wrong_kind = alloc_spec("pod-0");
        wrong_kind.kind = GPU_KIND.into();
        assert!(
            alloc_edits(&wrong_kind, &id)
                .expect_err("kind")
                .contains("kind is")
        );
    }

    #[test]
    fn parse_spec_is_strict() {
        let spec = alloc_spec("pod-0");
        let mut json: serde_json::Value = serde_json::to_value(&spec).expect("json");
        assert!(parse_spec(json.to_string().as_bytes()).is_ok());
        json["devices"][0]["containerEdits"]["extra"] = serde_json::json!(1);
        let e = parse_spec(json.to_string().as_bytes()).expect_err("unknown field");
        assert!(e.contains("unknown field `extra`"), "{e}");
        let mut bad = serde_json::to_value(&spec).expect("json");
        bad["devices"][0]["containerEdits"]["deviceNodes"][0]["type"] = serde_json::json!("x");
        let e = parse_spec(bad.to_string().as_bytes()).expect_err("bad type");
        assert!(e.contains("deviceNodes[0].type"), "{e}");
        assert!(!e.contains('\n'));
        // The transient spec contract: without TESSERA_ALLOC_ID and the
        // poststop hook, the spec is refused, naming both.
        let mut incomplete = serde_json::to_value(&spec).expect("json");
        incomplete["devices"][0]["containerEdits"]["env"] = serde_json::json!([]);
        incomplete["containerEdits"]["hooks"]
            .as_array_mut()
            .expect("hooks")
            .pop();
        let e = parse_spec(incomplete.to_string().as_bytes()).expect_err("incomplete");
        assert!(e.contains("missing \"TESSERA_ALLOC_ID=pod-0\""), "{e}");
        assert!(e.contains("no poststop hook"), "{e}");
        assert!(!e.contains('\n'));
    }

    #[test]
    fn visible_devices_resolve_against_the_static_spec() {
        let spec = Spec::new(
            GPU_KIND,
            vec![
                Device::new("0", edits_with(vec![node("/dev/nvidia0", 0)])),
                Device::new("GPU-aaaa", edits_with(vec![node("/dev/nvidia0", 0)])),
                Device::new("1", edits_with(vec![node("/dev/nvidia1", 1)])),
                Device::new(
                    ALL_DEVICES,
                    edits_with(vec![node("/dev/nvidia0", 0), node("/dev/nvidia1", 1)]),
                ),
            ],
            common(),
        )
        .expect("static spec");
        let paths = |e: &ContainerEdits| -> Vec<String> {
            e.device_nodes.iter().map(|n| n.path.clone()).collect()
        };
        let e = static_edits(
            &spec,
            &VisibleDevices::Named(vec!["GPU-aaaa".into(), "0".into()]),
        )
        .expect("ok");
        assert_eq!(paths(&e), ["/dev/nvidiactl", "/dev/nvidia0"]);
        let e = static_edits(&spec, &VisibleDevices::All).expect("all");
        assert_eq!(
            paths(&e),
            ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]
        );
        let e = static_edits(&spec, &VisibleDevices::Named(vec!["7".into()])).expect_err("unknown");
        assert!(
            e.contains("\"7\"") && e.contains("devices: 0, GPU-aaaa, 1, all"),
            "{e}"
        );
    }

    #[test]
    fn only_spec_mounts_applied_with_the_same_source_count() {
        let spec = Spec::new(
            GPU_KIND,
            vec![Device::new("0", edits_with(vec![node("/dev/nvidia0", 0)]))],
            common(),
        )
        .expect("static spec");
        let config = |mounts: serde_json::Value| {
            crate::oci::parse_config(
                serde_json::json!({ "mounts": mounts })
                    .to_string()
                    .as_bytes(),
            )
            .expect("config")
        };
        let applied = config(serde_json::json!([
            {"destination": "/proc", "source": "proc", "type": "proc"},
            {"destination": CONTAINER_LIBRARY, "source": HOST_LIBRARY, "type": "bind"},
        ]));
        let edits = applied_mounts(&spec, &applied);
        assert_eq!(edits.mounts, common().mounts);
        // The same destination from another source (the pod's own volume) is not the spec's.
        let other = config(serde_json::json!([
            {"destination": CONTAINER_LIBRARY, "source": "/home/user/evil.so", "type": "bind"},
        ]));
        assert!(applied_mounts(&spec, &other).mounts.is_empty());
        assert!(
            applied_mounts(&spec, &config(serde_json::json!([])))
                .mounts
                .is_empty()
        );
    }
}
