//! CDI spec versions and the minimum version a spec's content needs.
//!
//! The reference loader rejects a spec whose declared `cdiVersion` is unknown or
//! lower than the minimum its content needs, so Tessera always writes the
//! minimum: old runtimes (which only know old versions) can then load what it
//! writes. The rules follow `specs-go/version.go` of
//! `tags.cncf.io/container-device-interface` (spec 1.1.0), checked newest first:
//!
//! | version | needed when |
//! |---|---|
//! | 1.1.0 | any `netDevices`, or an `intelRdt` with `schemata` (even empty) or `enableMonitoring: true` |
//! | 1.0.0 | never (the bump moved version checks into the spec package) |
//! | 0.8.0 | never (the bump removed Go conversion functions) |
//! | 0.7.0 | any `intelRdt`, or non-empty `additionalGids` |
//! | 0.6.0 | spec or device `annotations`, or a `.` in the class of `kind` |
//! | 0.5.0 | a device name starting with a digit, or a device node `hostPath` |
//! | 0.4.0 | a mount `type` |
//! | 0.3.0 | otherwise (the earliest version the reference still emits) |
//!
//! Edits are inspected both at spec level and in every device. An empty string
//! in `hostPath` or a mount `type` counts as absent, as the Go library's
//! `omitempty` strings do.

use std::fmt;
use std::str::FromStr;

use super::spec::{ContainerEdits, Spec};

/// A released CDI spec version, ordered oldest to newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CdiVersion {
    /// 0.1.0 (known to the reference loader, but below any minimum it computes).
    V0_1_0,
    /// 0.2.0 (known to the reference loader, but below any minimum it computes).
    V0_2_0,
    /// 0.3.0, the earliest version the reference library emits.
    V0_3_0,
    /// 0.4.0: mount `type`.
    V0_4_0,
    /// 0.5.0: device node `hostPath`, device names starting with a digit.
    V0_5_0,
    /// 0.6.0: annotations, a dot in the class.
    V0_6_0,
    /// 0.7.0: `intelRdt`, `additionalGids`.
    V0_7_0,
    /// 0.8.0: no spec change.
    V0_8_0,
    /// 1.0.0: no spec change.
    V1_0_0,
    /// 1.1.0: `netDevices`, `intelRdt.schemata`, `intelRdt.enableMonitoring`.
    V1_1_0,
}

impl CdiVersion {
    /// Every known version, oldest first.
    pub const ALL: [CdiVersion; 10] = [
        CdiVersion::V0_1_0,
        CdiVersion::V0_2_0,
        CdiVersion::V0_3_0,
        CdiVersion::V0_4_0,
        CdiVersion::V0_5_0,
        CdiVersion::V0_6_0,
        CdiVersion::V0_7_0,
        CdiVersion::V0_8_0,
        CdiVersion::V1_0_0,
        CdiVersion::V1_1_0,
    ];

    /// The earliest version a computed minimum can be.
    pub const EARLIEST: CdiVersion = CdiVersion::V0_3_0;

    /// The newest version this crate knows.
    pub const LATEST: CdiVersion = CdiVersion::V1_1_0;

    /// The version as written in a spec, e.g. `"0.5.0"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CdiVersion::V0_1_0 => "0.1.0",
            CdiVersion::V0_2_0 => "0.2.0",
            CdiVersion::V0_3_0 => "0.3.0",
            CdiVersion::V0_4_0 => "0.4.0",
            CdiVersion::V0_5_0 => "0.5.0",
            CdiVersion::V0_6_0 => "0.6.0",
            CdiVersion::V0_7_0 => "0.7.0",
            CdiVersion::V0_8_0 => "0.8.0",
            CdiVersion::V1_0_0 => "1.0.0",
            CdiVersion::V1_1_0 => "1.1.0",
        }
    }

    /// Parses a version; like the reference loader, one leading `v` is ignored.
    pub fn parse(value: &str) -> Result<Self, VersionError> {
        let bare = value.strip_prefix('v').unwrap_or(value);
        Self::ALL
            .into_iter()
            .find(|v| v.as_str() == bare)
            .ok_or_else(|| VersionError::Unknown {
                value: value.to_owned(),
            })
    }
}

impl fmt::Display for CdiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CdiVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, VersionError> {
        Self::parse(s)
    }
}

/// Errors about CDI versions.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Not a released CDI version.
    #[error("{value:?} is not a known CDI version (known: 0.1.0 to {latest})", latest = CdiVersion::LATEST)]
    Unknown {
        /// The rejected version string.
        value: String,
    },
}

/// The minimum version a spec needs, and the first feature found that needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionRequirement {
    /// The minimum version.
    pub version: CdiVersion,
    /// What in the content needs it, for messages (`"a device name starts with a digit"`);
    /// for [`CdiVersion::EARLIEST`] it is `"the earliest version"`.
    pub reason: &'static str,
}

/// The minimum cdiVersion the content of `spec` needs (see the module docs).
pub fn minimum_version(spec: &Spec) -> CdiVersion {
    version_requirement(spec).version
}

/// Like [`minimum_version`], with the reason, for error messages.
pub fn version_requirement(spec: &Spec) -> VersionRequirement {
    let all_edits = || {
        std::iter::once(&spec.container_edits)
            .chain(spec.devices.iter().map(|d| &d.container_edits))
    };
    let any_edits = |f: fn(&ContainerEdits) -> bool| all_edits().any(f);
    let need = |version, reason| VersionRequirement { version, reason };

    if any_edits(|e| !e.net_devices.is_empty()) {
        return need(CdiVersion::V1_1_0, "netDevices are used");
    }
    if any_edits(|e| {
        e.intel_rdt
            .as_ref()
            .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring)
    }) {
        return need(
            CdiVersion::V1_1_0,
            "intelRdt uses schemata or enableMonitoring",
        );
    }
    // 1.0.0 and 0.8.0 add no fields.
    if any_edits(|e| e.intel_rdt.is_some()) {
        return need(CdiVersion::V0_7_0, "intelRdt is used");
    }
    if any_edits(|e| !e.additional_gids.is_empty()) {
        return need(CdiVersion::V0_7_0, "additionalGids are used");
    }
    if !spec.annotations.is_empty() {
        return need(CdiVersion::V0_6_0, "the spec has annotations");
    }
    if spec.devices.iter().any(|d| !d.annotations.is_empty()) {
        return need(CdiVersion::V0_6_0, "a device has annotations");
    }
    if spec
        .kind
        .split_once('/')
        .is_some_and(|(_, class)| class.contains('.'))
    {
        return need(CdiVersion::V0_6_0, "the class in kind contains a dot");
    }
    if spec
        .devices
        .iter()
        .any(|d| d.name.as_bytes().first().is_some_and(u8::is_ascii_digit))
    {
        return need(CdiVersion::V0_5_0, "a device name starts with a digit");
    }
    if any_edits(|e| {
        e.device_nodes
            .iter()
            .any(|n| n.host_path.as_deref().is_some_and(|p| !p.is_empty()))
    }) {
        return need(CdiVersion::V0_5_0, "a device node has a hostPath");
    }
    if any_edits(|e| {
        e.mounts
            .iter()
            .any(|m| m.mount_type.as_deref().is_some_and(|t| !t.is_empty()))
    }) {
        return need(CdiVersion::V0_4_0, "a mount has a type");
    }
    need(CdiVersion::EARLIEST, "the earliest version")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cdi::spec::{Device, DeviceNode, IntelRdt, Mount, NetDevice};

    fn spec_with(kind: &str, name: &str, edits: ContainerEdits) -> Spec {
        Spec {
            cdi_version: String::new(),
            kind: kind.to_owned(),
            annotations: BTreeMap::new(),
            devices: vec![Device {
                name: name.to_owned(),
                annotations: BTreeMap::new(),
                container_edits: edits,
            }],
            container_edits: ContainerEdits::default(),
        }
    }

    fn env_only() -> ContainerEdits {
        ContainerEdits {
            env: vec!["A=1".into()],
            ..Default::default()
        }
    }

    /// The minimum version of a one-device spec whose device edits are
    /// [`env_only`] with `change` applied.
    fn needed_with(change: impl FnOnce(&mut ContainerEdits)) -> CdiVersion {
        let mut edits = env_only();
        change(&mut edits);
        minimum_version(&spec_with("tessera.io/gpu", "all", edits))
    }

    #[test]
    fn versions_parse_display_and_order() {
        for v in CdiVersion::ALL {
            assert_eq!(CdiVersion::parse(v.as_str()), Ok(v));
            assert_eq!(v.to_string(), v.as_str());
        }
        assert_eq!(CdiVersion::parse("v0.6.0"), Ok(CdiVersion::V0_6_0));
        assert!(CdiVersion::V0_3_0 < CdiVersion::V0_4_0);
        assert!(CdiVersion::V0_8_0 < CdiVersion::V1_0_0);
        assert!(CdiVersion::V1_0_0 < CdiVersion::V1_1_0);
        assert!(CdiVersion::ALL.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(
            CdiVersion::parse("0.9.0").expect_err("unknown").to_string(),
            "\"0.9.0\" is not a known CDI version (known: 0.1.0 to 1.1.0)"
        );
        assert!(CdiVersion::parse("1.1").is_err());
        assert!(CdiVersion::parse("").is_err());
        assert!(CdiVersion::parse("vv1.0.0").is_err());
    }

    #[test]
    fn plain_content_needs_0_3_0() {
        let spec = spec_with("tessera.io/gpu", "all", env_only());
        assert_eq!(minimum_version(&spec), CdiVersion::V0_3_0);
    }

    #[test]
    fn mount_type_needs_0_4_0() {
        let mount = |mount_type: &str| Mount {
            host_path: "/a".into(),
            container_path: "/b".into(),
            options: vec![],
            mount_type: Some(mount_type.into()),
        };
        assert_eq!(
            needed_with(|e| e.mounts.push(mount("bind"))),
            CdiVersion::V0_4_0
        );
        assert_eq!(
            needed_with(|e| e.mounts.push(mount(""))),
            CdiVersion::V0_3_0,
            "an empty type is absent, as in the Go library"
        );
    }

    #[test]
    fn digit_first_device_name_needs_0_5_0() {
        let spec = spec_with("tessera.io/gpu", "0", env_only());
        let req = version_requirement(&spec);
        assert_eq!(req.version, CdiVersion::V0_5_0);
        assert_eq!(req.reason, "a device name starts with a digit");
    }

    #[test]
    fn host_path_needs_0_5_0_at_device_or_spec_level() {
        let node = DeviceNode {
            path: "/dev/nvidia0".into(),
            host_path: Some("/dev/nvidia1".into()),
            ..Default::default()
        };
        assert_eq!(
            needed_with(|e| e.device_nodes.push(node.clone())),
            CdiVersion::V0_5_0
        );
        let mut spec = spec_with("tessera.io/gpu", "all", env_only());
        spec.container_edits.device_nodes.push(node);
        assert_eq!(minimum_version(&spec), CdiVersion::V0_5_0);
    }

    #[test]
    fn annotations_or_dotted_class_need_0_6_0() {
        let mut spec = spec_with("tessera.io/gpu", "all", env_only());
        spec.annotations.insert("a".into(), "b".into());
        assert_eq!(minimum_version(&spec), CdiVersion::V0_6_0);

        let mut spec = spec_with("tessera.io/gpu", "all", env_only());
        spec.devices[0].annotations.insert("a".into(), "b".into());
        assert_eq!(minimum_version(&spec), CdiVersion::V0_6_0);

        let spec = spec_with("tessera.io/g.pu", "all", env_only());
        assert_eq!(minimum_version(&spec), CdiVersion::V0_6_0);

        let spec = spec_with("tessera.io/gpu", "all", env_only());
        assert_eq!(
            minimum_version(&spec),
            CdiVersion::V0_3_0,
            "a dot in the vendor needs nothing"
        );
    }

    #[test]
    fn additional_gids_or_intel_rdt_need_0_7_0() {
        assert_eq!(
            needed_with(|e| e.additional_gids.push(44)),
            CdiVersion::V0_7_0
        );
        let mut spec = spec_with("tessera.io/gpu", "all", env_only());
        spec.container_edits.intel_rdt = Some(IntelRdt {
            clos_id: Some("gold".into()),
            ..Default::default()
        });
        assert_eq!(minimum_version(&spec), CdiVersion::V0_7_0);
    }

    #[test]
    fn net_devices_or_new_intel_rdt_fields_need_1_1_0() {
        let net_device = NetDevice {
            host_interface_name: "eth1".into(),
            name: "net0".into(),
        };
        assert_eq!(
            needed_with(|e| e.net_devices.push(net_device)),
            CdiVersion::V1_1_0
        );
        let schemata = IntelRdt {
            schemata: Some(vec![]),
            ..Default::default()
        };
        let monitoring = IntelRdt {
            enable_monitoring: true,
            ..Default::default()
        };
        for rdt in [schemata, monitoring] {
            assert_eq!(needed_with(|e| e.intel_rdt = Some(rdt)), CdiVersion::V1_1_0);
        }
    }

    #[test]
    fn newest_rule_wins() {
        let mut edits = env_only();
        edits.additional_gids.push(44);
        let mut spec = spec_with("tessera.io/g.pu", "0", edits);
        spec.annotations.insert("a".into(), "b".into());
        let req = version_requirement(&spec);
        assert_eq!(req.version, CdiVersion::V0_7_0);
        assert_eq!(req.reason, "additionalGids are used");
    }
}
