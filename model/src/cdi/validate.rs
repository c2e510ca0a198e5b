//! Strict validation of a parsed CDI spec, reporting every problem at once.
//!
//! What the reference loader (`tags.cncf.io/container-device-interface`) rejects
//! is rejected here too: an unknown or too-low `cdiVersion`, a bad kind, no
//! devices, bad or duplicate device names, a device whose edits are empty, an
//! `env` entry without `KEY=`, a device node type outside `b c u p`, permissions
//! outside `rwm` (or the reference's `none`), an unknown hook name, an empty hook
//! path or mount path, an invalid Intel RDT `closID`, and empty or duplicate net
//! devices. Tessera is stricter in a few places where a runtime would fail later
//! or the value cannot mean what it says:
//!
//! - device node `path`, `hostPath` (when set), mount `containerPath` and hook
//!   `path` must be absolute;
//! - a fifo (`p`) carries no `major`/`minor`; a non-zero `minor` needs a non-zero
//!   `major` (the reference would otherwise take both from the host node);
//!   numbers are not negative (an omitted `minor` with a `major` means 0, which is
//!   how the Go library writes minor 0);
//! - a hook `timeout` is positive (the OCI runtime spec requires it);
//! - annotation keys are Kubernetes qualified names and all annotations of one
//!   map total at most 256 KiB (the reference means to check this but does not).
//!
//! Each [`SpecProblem`] names the field by its JSON path, e.g.
//! `devices[2].containerEdits.deviceNodes[0].type`.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use super::name::{validate_device_name, validate_kind};
use super::spec::SpecProblem;
use super::spec::{
    ContainerEdits, Device, DeviceNode, HOOK_NAMES, Hook, IntelRdt, Mount, Spec, SpecError,
};
use super::version::{CdiVersion, minimum_version, version_requirement};

/// Total size limit of one annotation map, keys plus values, as in Kubernetes.
pub const ANNOTATIONS_SIZE_LIMIT: usize = 256 * 1024;

/// Problems gathered in document order.
#[derive(Debug, Default)]
pub(crate) struct Problems(pub(crate) Vec<SpecProblem>);

impl Problems {
    pub(crate) fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(SpecProblem {
            path: path.into(),
            message: message.into(),
        });
    }

    fn into_result(self) -> Result<(), Vec<SpecProblem>> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(self.0)
        }
    }
}

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

// Building a spec validates it and stamps its version, so it sits here, above
// both `spec` (the types) and `version`.
impl Spec {
    /// Builds a spec of `kind` with `devices` and spec-level `container_edits`,
    /// validates it, and sets `cdi_version` to the minimum its content needs, so
    /// the oldest runtimes that can load it will.
    pub fn new(
        kind: &str,
        devices: Vec<Device>,
        container_edits: ContainerEdits,
    ) -> Result<Spec, SpecError> {
        let mut spec = Spec {
            cdi_version: String::new(),
            kind: kind.to_owned(),
            annotations: BTreeMap::new(),
            devices,
            container_edits,
        };
        spec.cdi_version = minimum_version(&spec).to_string();
        spec.validate().map_err(|problems| SpecError::Invalid {
            kind: kind.to_owned(),
            problems,
        })?;
        Ok(spec)
    }

    /// Sets `cdi_version` to the minimum the content needs, after a change made
    /// through the public fields (annotations, say); [`Spec::validate`] checks the rest.
    pub fn set_minimum_version(&mut self) {
        self.cdi_version = minimum_version(self).to_string();
    }
}

impl Spec {
    /// Checks the whole spec and returns every problem found, in document order.
    pub fn validate(&self) -> Result<(), Vec<SpecProblem>> {
        let mut out = Problems(Vec::new());
        check_version(self, &mut out);
        if let Err(e) = validate_kind(&self.kind) {
            out.push("kind", e.to_string());
        }
        check_annotations("annotations", &self.annotations, &mut out);
        if self.devices.is_empty() {
            out.push("devices", "a spec needs at least one device");
        }
        let mut seen: HashMap<&str, usize> = HashMap::new();
        for (i, device) in self.devices.iter().enumerate() {
            let at = format!("devices[{i}]");
            match validate_device_name(&device.name) {
                Err(e) => out.push(format!("{at}.name"), e.to_string()),
                Ok(()) => match seen.entry(&device.name) {
                    Entry::Occupied(first) => out.push(
                        format!("{at}.name"),
                        format!(
                            "{:?} is already the name of devices[{}]",
                            device.name,
                            first.get()
                        ),
                    ),
                    Entry::Vacant(slot) => {
                        slot.insert(i);
                    }
                },
            }
            check_annotations(&format!("{at}.annotations"), &device.annotations, &mut out);
            let edits_at = format!("{at}.containerEdits");
            if device.container_edits.is_empty() {
                out.push(
                    edits_at.clone(),
                    "a device must change something (env, deviceNodes, mounts, hooks, \
                     intelRdt, additionalGids or netDevices)",
                );
            }
            check_edits(&edits_at, &device.container_edits, &mut out);
        }
        check_edits("containerEdits", &self.container_edits, &mut out);
        out.into_result()
    }
}

impl ContainerEdits {
    /// Checks these edits on their own; paths start at the field (`env[0]`,
    /// `deviceNodes[1].type`). Emptiness is not a problem here: it is one only
    /// for a device, and [`Spec::validate`] checks that.
    pub fn validate(&self) -> Result<(), Vec<SpecProblem>> {
        let mut out = Problems(Vec::new());
        check_edits("", self, &mut out);
        out.into_result()
    }
}

fn check_version(spec: &Spec, out: &mut Problems) {
    match CdiVersion::parse(&spec.cdi_version) {
        Err(e) => out.push("cdiVersion", e.to_string()),
        Ok(declared) => {
            let need = version_requirement(spec);
            if declared < need.version {
                out.push(
                    "cdiVersion",
                    format!(
                        "{:?} is below {}, the minimum this content needs ({})",
                        spec.cdi_version, need.version, need.reason
                    ),
                );
            }
        }
    }
}

fn check_edits(at: &str, edits: &ContainerEdits, out: &mut Problems) {
    check_env(&join(at, "env"), &edits.env, out);
    for (i, node) in edits.device_nodes.iter().enumerate() {
        check_device_node(&join(at, &format!("deviceNodes[{i}]")), node, out);
    }
    for (i, hook) in edits.hooks.iter().enumerate() {
        check_hook(&join(at, &format!("hooks[{i}]")), hook, out);
    }
    for (i, mount) in edits.mounts.iter().enumerate() {
        check_mount(&join(at, &format!("mounts[{i}]")), mount, out);
    }
    if let Some(rdt) = &edits.intel_rdt {
        check_intel_rdt(&join(at, "intelRdt"), rdt, out);
    }
    let mut hosts: HashMap<&str, usize> = HashMap::new();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, dev) in edits.net_devices.iter().enumerate() {
        let dev_at = join(at, &format!("netDevices[{i}]"));
        for (field, value, seen) in [
            ("hostInterfaceName", &dev.host_interface_name, &mut hosts),
            ("name", &dev.name, &mut names),
        ] {
            if value.is_empty() {
                out.push(format!("{dev_at}.{field}"), "must not be empty");
            } else if let Some(first) = seen.get(value.as_str()) {
                out.push(
                    format!("{dev_at}.{field}"),
                    format!("{value:?} is already used by netDevices[{first}]"),
                );
            } else {
                seen.insert(value, i);
            }
        }
    }
}

fn check_env(at: &str, env: &[String], out: &mut Problems) {
    for (i, entry) in env.iter().enumerate() {
        if entry.find('=').is_none_or(|eq| eq == 0) {
            out.push(
                format!("{at}[{i}]"),
                format!("{entry:?} is not KEY=VALUE with a non-empty KEY"),
            );
        }
    }
}

fn check_absolute(at: String, value: &str, out: &mut Problems) {
    if !value.starts_with('/') {
        out.push(at, format!("{value:?} is not an absolute path"));
    }
}

fn check_device_node(at: &str, node: &DeviceNode, out: &mut Problems) {
    check_absolute(format!("{at}.path"), &node.path, out);
    if let Some(host) = node.host_path.as_deref().filter(|h| !h.is_empty()) {
        check_absolute(format!("{at}.hostPath"), host, out);
    }
    let node_type = node.node_type.as_deref().unwrap_or("");
    if !matches!(node_type, "" | "b" | "c" | "u" | "p") {
        out.push(
            format!("{at}.type"),
            format!("{node_type:?} is not one of b, c, u, p"),
        );
    }
    for (field, value) in [("major", node.major), ("minor", node.minor)] {
        let Some(n) = value else { continue };
        if node_type == "p" {
            out.push(
                format!("{at}.{field}"),
                format!("{n}: a fifo (type \"p\") has no device numbers"),
            );
        } else if n < 0 {
            out.push(format!("{at}.{field}"), format!("{n} is negative"));
        }
    }
    if node_type != "p" && node.minor.is_some_and(|m| m > 0) && node.major.is_none_or(|m| m == 0) {
        out.push(
            format!("{at}.minor"),
            format!(
                "{} is given without a major number (the runtime would take both from the host)",
                node.minor.unwrap_or_default()
            ),
        );
    }
    if let Some(perms) = node.permissions.as_deref() {
        let ok = perms.is_empty()
            || perms == "none"
            || perms.chars().all(|c| matches!(c, 'r' | 'w' | 'm'));
        if !ok {
            out.push(
                format!("{at}.permissions"),
                format!("{perms:?} is not a subset of rwm (or \"none\")"),
            );
        }
    }
}

fn check_hook(at: &str, hook: &Hook, out: &mut Problems) {
    if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
        out.push(
            format!("{at}.hookName"),
            format!(
                "{:?} is not one of {}",
                hook.hook_name,
                HOOK_NAMES.join(", ")
            ),
        );
    }
    check_absolute(format!("{at}.path"), &hook.path, out);
    check_env(&format!("{at}.env"), &hook.env, out);
    if let Some(t) = hook.timeout.filter(|t| *t <= 0) {
        out.push(format!("{at}.timeout"), format!("{t} is not positive"));
    }
}

fn check_mount(at: &str, mount: &Mount, out: &mut Problems) {
    if mount.host_path.is_empty() {
        out.push(format!("{at}.hostPath"), "must not be empty");
    }
    check_absolute(format!("{at}.containerPath"), &mount.container_path, out);
}

fn check_intel_rdt(at: &str, rdt: &IntelRdt, out: &mut Problems) {
    if let Some(clos) = rdt.clos_id.as_deref() {
        let bad = clos != "/"
            && (clos.len() >= 4096 || clos == "." || clos == ".." || clos.contains(['/', '\n']));
        if bad {
            out.push(
                format!("{at}.closID"),
                format!("{clos:?} is not a file name (nor \"/\" for the root class)"),
            );
        }
    }
}

fn check_annotations(at: &str, annotations: &BTreeMap<String, String>, out: &mut Problems) {
    let mut size = 0usize;
    for (key, value) in annotations {
        size = size.saturating_add(key.len()).saturating_add(value.len());
        if let Err(why) = check_annotation_key(&key.to_ascii_lowercase()) {
            out.push(format!("{at}[{key:?}]"), format!("key {why}"));
        }
    }
    if size > ANNOTATIONS_SIZE_LIMIT {
        out.push(
            at,
            format!("{size} bytes in all, more than the limit of {ANNOTATIONS_SIZE_LIMIT}"),
        );
    }
}

/// Kubernetes "qualified name": `[prefix/]name`, prefix a DNS-1123 subdomain.
fn check_annotation_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = match key.split_once('/') {
        None => (None, key),
        Some((_, rest)) if rest.contains('/') => return Err("has more than one '/'"),
        Some((prefix, name)) => (Some(prefix), name),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err("has an empty prefix before '/'");
        }
        let label_ok = |l: &str| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        };
        if prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err("prefix is not a DNS subdomain (lowercase letters, digits, '-', '.')");
        }
    }
    if name.is_empty() {
        return Err("has an empty name part");
    }
    if name.len() > 63 {
        return Err("name part is longer than 63 characters");
    }
    let b = name.as_bytes();
    let ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric();
    if !ok {
        return Err(
            "name part must be letters, digits, '-', '_', '.', starting and ending alphanumeric",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{Device, NetDevice};

    fn node(path: &str) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            ..Default::default()
        }
    }

    fn good_spec() -> Spec {
        let edits = ContainerEdits {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
            device_nodes: vec![DeviceNode {
                permissions: Some("rw".into()),
                ..DeviceNode::char("/dev/nvidia0", 195, 0)
            }],
            ..Default::default()
        };
        Spec::new(
            "tessera.io/gpu",
            vec![Device::new("gpu0", edits)],
            ContainerEdits::default(),
        )
        .expect("good spec")
    }

    /// Validates and returns the problems as their one-line messages.
    fn problems(spec: &Spec) -> Vec<String> {
        match spec.validate() {
            Ok(()) => vec![],
            Err(p) => p.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn a_good_spec_has_no_problems() {
        let spec = good_spec();
        assert_eq!(spec.cdi_version, "0.3.0");
        assert_eq!(problems(&spec), Vec::<String>::new());
    }

    #[test]
    fn unknown_and_too_low_versions() {
        let mut spec = good_spec();
        spec.cdi_version = "0.9.0".into();
        assert_eq!(
            problems(&spec),
            ["cdiVersion: \"0.9.0\" is not a known CDI version (known: 0.1.0 to 1.1.0)"]
        );
        spec.cdi_version = "0.4.0".into();
        spec.devices[0].name = "0".into();
        assert_eq!(
            problems(&spec),
            [
                "cdiVersion: \"0.4.0\" is below 0.5.0, the minimum this content needs (a device name starts with a digit)"
            ]
        );
        spec.cdi_version = "v1.1.0".into();
        assert_eq!(
            problems(&spec),
            Vec::<String>::new(),
            "higher than needed is fine"
        );
        spec.cdi_version = "0.2.0".into();
        spec.devices[0].name = "gpu0".into();
        assert_eq!(
            problems(&spec),
            [
                "cdiVersion: \"0.2.0\" is below 0.3.0, the minimum this content needs (the earliest version)"
            ]
        );
    }

    #[test]
    fn kind_and_device_list_problems() {
        let mut spec = good_spec();
        spec.kind = "tessera.io".into();
        spec.devices.clear();
        assert_eq!(
            problems(&spec),
            [
                "kind: kind \"tessera.io\": expected \"vendor/class\"",
                "devices: a spec needs at least one device",
            ]
        );
    }

    #[test]
    fn device_name_problems_and_duplicates() {
        let mut spec = good_spec();
        let d = spec.devices[0].clone();
        spec.devices.push(Device {
            name: "-x".into(),
            ..d.clone()
        });
        spec.devices.push(d.clone());
        spec.devices.push(d);
        assert_eq!(
            problems(&spec),
            [
                "devices[1].name: device name \"-x\": must start with a letter or digit",
                "devices[2].name: \"gpu0\" is already the name of devices[0]",
                "devices[3].name: \"gpu0\" is already the name of devices[0]",
            ]
        );
    }

    #[test]
    fn device_edits_must_not_be_empty_but_spec_edits_may() {
        let mut spec = good_spec();
        spec.devices[0].container_edits = ContainerEdits::default();
        assert_eq!(
            problems(&spec),
            [
                "devices[0].containerEdits: a device must change something (env, deviceNodes, mounts, hooks, intelRdt, additionalGids or netDevices)"
            ]
        );
    }

    #[test]
    fn env_entries_need_a_key() {
        let mut spec = good_spec();
        spec.container_edits.env = vec!["A=1".into(), "B".into(), "=x".into(), "C=".into()];
        assert_eq!(
            problems(&spec),
            [
                "containerEdits.env[1]: \"B\" is not KEY=VALUE with a non-empty KEY",
                "containerEdits.env[2]: \"=x\" is not KEY=VALUE with a non-empty KEY",
            ]
        );
    }

    #[test]
    fn device_node_problems() {
        let mut spec = good_spec();
        let nodes = &mut spec.devices[0].container_edits.device_nodes;
        nodes.push(DeviceNode {
            node_type: Some("x".into()),
            permissions: Some("rwx".into()),
            host_path: Some("dev/b".into()),
            ..node("dev/a")
        });
        nodes.push(DeviceNode {
            node_type: Some("p".into()),
            major: Some(1),
            minor: Some(2),
            ..node("/dev/fifo")
        });
        nodes.push(DeviceNode {
            node_type: Some("c".into()),
            minor: Some(3),
            ..node("/dev/c")
        });
        nodes.push(DeviceNode {
            node_type: Some("b".into()),
            major: Some(-1),
            ..node("/dev/b")
        });
        // Accepted: major without minor (minor 0), "none", "", no type at all.
        nodes.push(DeviceNode {
            node_type: Some("c".into()),
            major: Some(195),
            permissions: Some("none".into()),
            ..node("/dev/nvidia1")
        });
        nodes.push(DeviceNode {
            permissions: Some(String::new()),
            host_path: Some(String::new()),
            ..node("/dev/nvidiactl")
        });
        spec.set_minimum_version();
        let p = "devices[0].containerEdits.deviceNodes";
        assert_eq!(
            problems(&spec),
            [
                format!("{p}[1].path: \"dev/a\" is not an absolute path"),
                format!("{p}[1].hostPath: \"dev/b\" is not an absolute path"),
                format!("{p}[1].type: \"x\" is not one of b, c, u, p"),
                format!("{p}[1].permissions: \"rwx\" is not a subset of rwm (or \"none\")"),
                format!("{p}[2].major: 1: a fifo (type \"p\") has no device numbers"),
                format!("{p}[2].minor: 2: a fifo (type \"p\") has no device numbers"),
                format!(
                    "{p}[3].minor: 3 is given without a major number (the runtime would take both from the host)"
                ),
                format!("{p}[4].major: -1 is negative"),
            ]
        );
    }

    #[test]
    fn mount_problems() {
        let mut spec = good_spec();
        spec.container_edits.mounts = vec![
            Mount {
                host_path: String::new(),
                container_path: "usr/lib/x".into(),
                ..Default::default()
            },
            Mount {
                host_path: "tmpfs".into(),
                container_path: "/tmp".into(),
                mount_type: Some("tmpfs".into()),
                ..Default::default()
            },
        ];
        spec.set_minimum_version();
        assert_eq!(
            problems(&spec),
            [
                "containerEdits.mounts[0].hostPath: must not be empty",
                "containerEdits.mounts[0].containerPath: \"usr/lib/x\" is not an absolute path",
            ]
        );
    }

    #[test]
    fn hook_problems() {
        let mut spec = good_spec();
        spec.container_edits.hooks = vec![
            Hook {
                hook_name: "preStart".into(),
                path: "tessera-hook".into(),
                env: vec!["PATH=/bin".into(), "oops".into()],
                timeout: Some(0),
                ..Default::default()
            },
            Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/tessera-hook".into(),
                args: vec!["tessera-hook".into(), "create-container".into()],
                env: vec!["PATH=/usr/bin".into()],
                timeout: Some(10),
            },
        ];
        let p = "containerEdits.hooks[0]";
        assert_eq!(
            problems(&spec),
            [
                format!(
                    "{p}.hookName: \"preStart\" is not one of prestart, createRuntime, createContainer, startContainer, poststart, poststop"
                ),
                format!("{p}.path: \"tessera-hook\" is not an absolute path"),
                format!("{p}.env[1]: \"oops\" is not KEY=VALUE with a non-empty KEY"),
                format!("{p}.timeout: 0 is not positive"),
            ]
        );
    }

    #[test]
    fn intel_rdt_and_net_device_problems() {
        let mut spec = good_spec();
        spec.container_edits.intel_rdt = Some(IntelRdt {
            clos_id: Some("a/b".into()),
            ..Default::default()
        });
        spec.container_edits.net_devices = vec![
            NetDevice {
                host_interface_name: "eth1".into(),
                name: "net0".into(),
            },
            NetDevice {
                host_interface_name: "eth1".into(),
                name: String::new(),
            },
        ];
        spec.set_minimum_version();
        assert_eq!(spec.cdi_version, "1.1.0");
        assert_eq!(
            problems(&spec),
            [
                "containerEdits.intelRdt.closID: \"a/b\" is not a file name (nor \"/\" for the root class)",
                "containerEdits.netDevices[1].hostInterfaceName: \"eth1\" is already used by netDevices[0]",
                "containerEdits.netDevices[1].name: must not be empty",
            ]
        );
    }

    #[test]
    fn annotation_key_problems() {
        let mut spec = good_spec();
        spec.annotations
            .insert("tessera.io/alloc-id".into(), "x".into());
        spec.annotations.insert("a/b/c".into(), "x".into());
        spec.annotations.insert("Bad_Prefix/x".into(), "x".into());
        spec.annotations.insert("-x".into(), "x".into());
        spec.devices[0]
            .annotations
            .insert("k".repeat(64), "x".into());
        spec.set_minimum_version();
        let long = "k".repeat(64);
        assert_eq!(
            problems(&spec),
            [
                "annotations[\"-x\"]: key name part must be letters, digits, '-', '_', '.', starting and ending alphanumeric".to_owned(),
                "annotations[\"Bad_Prefix/x\"]: key prefix is not a DNS subdomain (lowercase letters, digits, '-', '.')".to_owned(),
                "annotations[\"a/b/c\"]: key has more than one '/'".to_owned(),
                format!("devices[0].annotations[\"{long}\"]: key name part is longer than 63 characters"),
            ]
        );
    }

    #[test]
    fn annotation_size_limit() {
        let mut spec = good_spec();
        spec.annotations
            .insert("big".into(), "x".repeat(ANNOTATIONS_SIZE_LIMIT));
        spec.set_minimum_version();
        assert_eq!(
            problems(&spec),
            ["annotations: 262147 bytes in all, more than the limit of 262144"]
        );
    }

    #[test]
    fn container_edits_validate_on_their_own() {
        let edits = ContainerEdits {
            env: vec!["X".into()],
            ..Default::default()
        };
        let problems: Vec<String> = edits
            .validate()
            .expect_err("bad env")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            problems,
            ["env[0]: \"X\" is not KEY=VALUE with a non-empty KEY"]
        );
        assert_eq!(ContainerEdits::default().validate(), Ok(()));
    }

    #[test]
    fn spec_new_reports_every_problem_in_one_line() {
        let err = Spec::new(
            "tessera.io/gpu",
            vec![Device::new("-x", ContainerEdits::default())],
            ContainerEdits::default(),
        )
        .expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "invalid CDI spec for kind \"tessera.io/gpu\": devices[0].name: device name \"-x\": must start with a letter or digit; devices[0].containerEdits: a device must change something (env, deviceNodes, mounts, hooks, intelRdt, additionalGids or netDevices)"
        );
    }
}
