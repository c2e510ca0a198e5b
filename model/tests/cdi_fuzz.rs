//! Property tests: the CDI parsers never panic on arbitrary input, and whatever
//! parses re-serializes and re-parses to the same value.

use std::collections::BTreeMap;

use proptest::prelude::*;
use tessera_model::cdi::{
    ContainerEdits, Device, DeviceNode, Hook, IntelRdt, Kind, Mount, NetDevice, QualifiedName,
    Spec, annotation_key_shortened, minimum_version, name, parse_annotation_value,
    parse_annotations,
};
use tessera_model::contract::cdi::ANNOTATION_PREFIX;

/// Strings that are sometimes valid names: the CDI punctuation plus a little noise.
fn namey() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9._:/=,-]{0,16}",
        1 => any::<String>(),
    ]
}

fn short() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-zA-Z0-9/._=-]{0,10}",
        1 => any::<String>(),
    ]
}

fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(short(), short(), 0..3)
}

fn device_node() -> impl Strategy<Value = DeviceNode> {
    (
        (
            short(),
            prop::option::of(short()),
            prop::option::of("[bcupx]?"),
        ),
        (
            prop::option::of(any::<i64>()),
            prop::option::of(any::<i64>()),
            prop::option::of(any::<u32>()),
        ),
        (
            prop::option::of("[rwmnoe]{0,4}"),
            prop::option::of(any::<u32>()),
            prop::option::of(any::<u32>()),
        ),
    )
        .prop_map(
            |((path, host_path, node_type), (major, minor, file_mode), (permissions, uid, gid))| {
                DeviceNode {
                    path,
                    host_path,
                    node_type,
                    major,
                    minor,
                    file_mode,
                    permissions,
                    uid,
                    gid,
                }
            },
        )
}

fn mount() -> impl Strategy<Value = Mount> {
    (
        short(),
        short(),
        prop::collection::vec(short(), 0..3),
        prop::option::of(short()),
    )
        .prop_map(|(host_path, container_path, options, mount_type)| Mount {
            host_path,
            container_path,
            options,
            mount_type,
        })
}

fn hook() -> impl Strategy<Value = Hook> {
    (
        prop_oneof![Just("createContainer".to_owned()), short()],
        short(),
        prop::collection::vec(short(), 0..3),
        prop::collection::vec(short(), 0..3),
        prop::option::of(any::<i64>()),
    )
        .prop_map(|(hook_name, path, args, env, timeout)| Hook {
            hook_name,
            path,
            args,
            env,
            timeout,
        })
}

fn intel_rdt() -> impl Strategy<Value = IntelRdt> {
    (
        prop::option::of(short()),
        prop::option::of(short()),
        prop::option::of(short()),
        prop::option::of(prop::collection::vec(short(), 0..2)),
        any::<bool>(),
    )
        .prop_map(
            |(clos_id, l3_cache_schema, mem_bw_schema, schemata, enable_monitoring)| IntelRdt {
                clos_id,
                l3_cache_schema,
                mem_bw_schema,
                schemata,
                enable_monitoring,
            },
        )
}

fn edits() -> impl Strategy<Value = ContainerEdits> {
    (
        prop::collection::vec(short(), 0..3),
        prop::collection::vec(device_node(), 0..3),
        prop::collection::vec(hook(), 0..2),
        prop::collection::vec(mount(), 0..3),
        prop::option::of(intel_rdt()),
        prop::collection::vec(any::<u32>(), 0..2),
        prop::collection::vec(
            (short(), short()).prop_map(|(host_interface_name, name)| NetDevice {
                host_interface_name,
                name,
            }),
            0..2,
        ),
    )
        .prop_map(
            |(env, device_nodes, hooks, mounts, intel_rdt, additional_gids, net_devices)| {
                ContainerEdits {
                    env,
                    device_nodes,
                    hooks,
                    mounts,
                    intel_rdt,
                    additional_gids,
                    net_devices,
                }
            },
        )
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop_oneof![Just("0.3.0".to_owned()), Just("1.1.0".to_owned()), short()],
        namey(),
        map(),
        prop::collection::vec(
            (namey(), map(), edits()).prop_map(|(name, annotations, container_edits)| Device {
                name,
                annotations,
                container_edits,
            }),
            0..3,
        ),
        edits(),
    )
        .prop_map(
            |(cdi_version, kind, annotations, devices, container_edits)| Spec {
                cdi_version,
                kind,
                annotations,
                devices,
                container_edits,
            },
        )
}

/// Parses JSON text as a spec; when it parses, it must round-trip and validate without panicking.
fn check_spec_text(text: &str) -> Result<(), TestCaseError> {
    if let Ok(spec) = serde_json::from_str::<Spec>(text) {
        let _ = spec.validate();
        let again = serde_json::to_string(&spec).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let reparsed: Spec =
            serde_json::from_str(&again).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(reparsed, spec);
    }
    Ok(())
}

/// Edits built only from valid parts, so a spec of them must be accepted.
fn valid_edits() -> impl Strategy<Value = ContainerEdits> {
    let path = "(/[a-z0-9._-]{1,8}){1,3}";
    (
        prop::collection::vec("[A-Z_][A-Z0-9_]{0,6}=[ -~]{0,6}", 0..3),
        prop::collection::vec(
            (
                path,
                prop::option::of(path),
                prop_oneof![
                    Just(None),
                    Just(Some("c".to_owned())),
                    Just(Some("b".to_owned()))
                ],
                1i64..512,
                0i64..1024,
                prop::option::of("(r?w?m?|none)"),
            )
                .prop_map(|(path, host_path, node_type, major, minor, permissions)| {
                    let numbered = node_type.is_some();
                    DeviceNode {
                        path,
                        host_path,
                        node_type,
                        major: numbered.then_some(major),
                        minor: numbered.then_some(minor),
                        permissions,
                        ..Default::default()
                    }
                }),
            0..3,
        ),
        prop::collection::vec(
            (
                prop::sample::select(tessera_model::cdi::HOOK_NAMES.to_vec()),
                path,
                1i64..60,
            )
                .prop_map(|(name, path, timeout)| Hook {
                    hook_name: name.to_owned(),
                    path,
                    timeout: Some(timeout),
                    ..Default::default()
                }),
            0..2,
        ),
        prop::collection::vec(
            (path, path, prop::option::of("bind|tmpfs")).prop_map(|(host, container, t)| Mount {
                host_path: host,
                container_path: container,
                options: vec!["ro".into()],
                mount_type: t,
            }),
            0..3,
        ),
        prop::collection::vec(1u32..100, 0..2),
    )
        .prop_map(
            |(env, device_nodes, hooks, mounts, additional_gids)| ContainerEdits {
                env,
                device_nodes,
                hooks,
                mounts,
                additional_gids,
                ..Default::default()
            },
        )
}

const VALID: &str = r#"{"cdiVersion":"0.5.0","kind":"tessera.io/gpu","devices":[{"name":"0","containerEdits":{"env":["A=1"],"deviceNodes":[{"path":"/dev/nvidia0","type":"c","major":195,"minor":0}],"mounts":[{"hostPath":"/a","containerPath":"/b","options":["ro"]}],"hooks":[{"hookName":"createContainer","path":"/usr/bin/tessera-hook"}]}}]}"#;

proptest! {
    #[test]
    fn qualified_name_parser_never_panics_and_round_trips(s in namey()) {
        if let Ok(q) = QualifiedName::parse(&s) {
            prop_assert_eq!(q.to_string(), s.clone());
            prop_assert_eq!(QualifiedName::parse(&q.to_string()), Ok(q));
        }
        if let Ok(k) = Kind::parse(&s) {
            prop_assert_eq!(k.to_string(), s.clone());
        }
        let _ = name::validate_vendor(&s);
        let _ = name::validate_class(&s);
        if name::validate_device_name(&s).is_ok() {
            prop_assert!(s.starts_with(|c: char| c.is_ascii_alphanumeric()));
            prop_assert!(s.ends_with(|c: char| c.is_ascii_alphanumeric()));
        }
    }

    #[test]
    fn annotation_parser_never_panics_and_round_trips(key in namey(), value in namey()) {
        let key = format!("{ANNOTATION_PREFIX}{key}");
        if let Ok(found) = parse_annotations([(key.as_str(), value.as_str())]) {
            prop_assert_eq!(found.keys, vec![key]);
            let joined: Vec<String> = found.devices.iter().map(ToString::to_string).collect();
            prop_assert_eq!(joined.join(","), value.clone());
        }
        if let Ok(devices) = parse_annotation_value(&value) {
            prop_assert!(!devices.is_empty());
        }
    }

    #[test]
    fn shortened_keys_are_always_valid(id in any::<String>(), plugin in "[a-z][a-z0-9.-]{0,20}[a-z0-9]") {
        match annotation_key_shortened(&plugin, &id) {
            Err(_) => prop_assert!(id.is_empty()),
            Ok(key) => {
                let name = key.strip_prefix(ANNOTATION_PREFIX).expect("prefix");
                prop_assert!(name.len() <= 63, "{name}");
                let plugin_part = format!("{plugin}_");
                prop_assert!(name.starts_with(&plugin_part));
                prop_assert!(name.ends_with(|c: char| c.is_ascii_alphanumeric()), "{name}");
                prop_assert!(
                    name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                    "{name}"
                );
                prop_assert_eq!(annotation_key_shortened(&plugin, &id), Ok(key.clone()));
            }
        }
    }

    #[test]
    fn arbitrary_text_never_panics_the_spec_reader(text in any::<String>()) {
        check_spec_text(&text)?;
    }

    #[test]
    fn mutated_valid_json_never_panics_the_spec_reader(
        at in 0..VALID.len(),
        cut in 0usize..4,
        insert in "[\"{}\\[\\]:,a-z0-9 ]{0,3}",
    ) {
        let mut text = VALID.to_owned();
        let end = (at + cut).min(text.len());
        text.replace_range(at..end, &insert);
        check_spec_text(&text)?;
    }

    #[test]
    fn generated_specs_round_trip_and_validate(spec in spec()) {
        let text = serde_json::to_string(&spec).expect("serializes");
        let back: Spec = serde_json::from_str(&text).expect("reparses");
        prop_assert_eq!(&back, &spec);
        let _ = spec.validate();
        // Spec::new either fails with problems or yields a spec that validates
        // and declares exactly the minimum version.
        if let Ok(built) = Spec::new(&spec.kind, spec.devices.clone(), spec.container_edits.clone()) {
            prop_assert_eq!(built.validate(), Ok(()));
            prop_assert_eq!(built.cdi_version.clone(), minimum_version(&built).to_string());
        }
    }

    #[test]
    fn valid_content_is_accepted_with_its_minimum_version(
        kind in "[a-z][a-z0-9.-]{0,8}[a-z0-9]/[a-z][a-z0-9._-]{0,6}[a-z0-9]",
        names in prop::collection::btree_set("[a-z0-9]([a-z0-9_.:-]{0,8}[a-z0-9])?", 1..4),
        device_edits in prop::collection::vec(valid_edits(), 4),
        common in valid_edits(),
    ) {
        let devices: Vec<Device> = names
            .into_iter()
            .zip(device_edits)
            .map(|(name, mut edits)| {
                edits.env.push("TESSERA=1".into());
                Device::new(name, edits)
            })
            .collect();
        let spec = Spec::new(&kind, devices, common);
        prop_assert!(spec.is_ok(), "{:?}", spec.err().map(|e| e.to_string()));
        let spec = spec.expect("checked");
        let text = serde_json::to_string(&spec).expect("serializes");
        let back: Spec = serde_json::from_str(&text).expect("reparses");
        prop_assert_eq!(back.validate(), Ok(()));
        prop_assert_eq!(back, spec);
    }

    #[test]
    fn merging_is_idempotent_for_env_nodes_and_mounts(a in edits(), b in edits()) {
        let mut once = a.clone();
        once.append(&b);
        let mut twice = once.clone();
        twice.append(&b);
        prop_assert_eq!(&twice.env, &once.env);
        prop_assert_eq!(&twice.device_nodes, &once.device_nodes);
        prop_assert_eq!(&twice.mounts, &once.mounts);
        prop_assert_eq!(&twice.additional_gids, &once.additional_gids);
    }
}

#[test]
fn valid_fixture_is_valid() {
    let spec: Spec = serde_json::from_str(VALID).expect("parses");
    assert_eq!(spec.validate(), Ok(()));
}
