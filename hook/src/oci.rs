//! The part of the bundle's `config.json` the hook needs, parsed with a
//! targeted struct: everything else is skipped without being kept.
//!
//! The file is read with a bound, opened with `O_NOFOLLOW` relative to the
//! bundle directory's fd (the bundle path comes from the OCI state).

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use serde::{Deserialize, Deserializer};

use crate::error::{HookError, Result, one_line};
use crate::fsutil::read_bounded;

/// The most bytes of `config.json` read (engines write a few KiB; Kubernetes
/// annotations may add a few hundred).
pub const MAX_CONFIG_BYTES: usize = 4 * 1024 * 1024;

/// The fields of an OCI runtime config the hook uses.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct OciConfig {
    /// Container annotations.
    #[serde(default, deserialize_with = "null_default")]
    pub annotations: BTreeMap<String, String>,
    /// The container process.
    #[serde(default)]
    pub process: Option<Process>,
    /// The root filesystem.
    #[serde(default)]
    pub root: Option<Root>,
    /// Mounts, by destination only.
    #[serde(default, deserialize_with = "null_default")]
    pub mounts: Vec<MountEntry>,
    /// Linux-specific settings.
    #[serde(default)]
    pub linux: Option<Linux>,
}

/// `process`: its environment and user.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Process {
    /// `KEY=VALUE` entries.
    #[serde(default, deserialize_with = "null_default")]
    pub env: Vec<String>,
    /// The user the process runs as.
    #[serde(default)]
    pub user: User,
}

/// `process.user`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct User {
    /// User id in the container.
    #[serde(default)]
    pub uid: u32,
    /// Group id in the container.
    #[serde(default)]
    pub gid: u32,
}

/// `root`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Root {
    /// Path of the root filesystem, absolute or relative to the bundle.
    pub path: String,
    /// Whether the runtime makes it read-only.
    #[serde(default)]
    pub readonly: bool,
}

/// One entry of `mounts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MountEntry {
    /// Path in the container.
    pub destination: String,
    /// What is mounted (the host path of a bind mount).
    #[serde(default)]
    pub source: Option<String>,
}

/// `linux`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Linux {
    /// Device nodes the runtime creates.
    #[serde(default, deserialize_with = "null_default")]
    pub devices: Vec<LinuxDevice>,
    /// Namespaces of the container.
    #[serde(default, deserialize_with = "null_default")]
    pub namespaces: Vec<Namespace>,
    /// User namespace uid mappings.
    #[serde(default, deserialize_with = "null_default")]
    pub uid_mappings: Vec<IdMapping>,
    /// User namespace gid mappings.
    #[serde(default, deserialize_with = "null_default")]
    pub gid_mappings: Vec<IdMapping>,
    /// Where the runtime puts the container's cgroup: an absolute or relative
    /// cgroupfs path, or systemd's `slice:prefix:name`.
    #[serde(default)]
    pub cgroups_path: Option<String>,
}

/// One entry of `linux.devices`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct LinuxDevice {
    /// Path in the container.
    pub path: String,
}

/// One entry of `linux.namespaces`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Namespace {
    /// `pid`, `mount`, `cgroup`, `user`, …
    #[serde(rename = "type")]
    pub kind: String,
    /// The namespace to join (`/proc/<pid>/ns/<kind>`); absent: a new one.
    #[serde(default)]
    pub path: Option<String>,
}

/// A user namespace id mapping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdMapping {
    /// First id in the container.
    #[serde(rename = "containerID")]
    pub container_id: u32,
    /// First id on the host.
    #[serde(rename = "hostID")]
    pub host_id: u32,
    /// How many ids.
    pub size: u32,
}

fn null_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

impl OciConfig {
    /// The process environment (empty when there is no process).
    pub fn env(&self) -> &[String] {
        self.process.as_ref().map_or(&[], |p| &p.env)
    }

    /// The process user (root when unset).
    pub fn user(&self) -> User {
        self.process.as_ref().map(|p| p.user).unwrap_or_default()
    }

    /// Whether the container has its own namespace of `kind`.
    pub fn has_namespace(&self, kind: &str) -> bool {
        self.linux
            .as_ref()
            .is_some_and(|l| l.namespaces.iter().any(|n| n.kind == kind))
    }

    /// The `linux.namespaces` entry of `kind`, if the container asks for one.
    pub fn namespace(&self, kind: &str) -> Option<&Namespace> {
        self.linux
            .as_ref()
            .and_then(|l| l.namespaces.iter().find(|n| n.kind == kind))
    }

    /// `linux.cgroupsPath`, when set and not empty.
    pub fn cgroups_path(&self) -> Option<&str> {
        self.linux
            .as_ref()
            .and_then(|l| l.cgroups_path.as_deref())
            .filter(|p| !p.is_empty())
    }

    /// Whether `path` is among the device nodes the runtime creates.
    pub fn has_device(&self, path: &str) -> bool {
        self.linux
            .as_ref()
            .is_some_and(|l| l.devices.iter().any(|d| d.path == path))
    }

    /// Whether a mount targets `destination`.
    pub fn has_mount(&self, destination: &str) -> bool {
        self.mounts.iter().any(|m| m.destination == destination)
    }

    /// The host uid and gid of the container's `uid`/`gid`: the ids themselves
    /// without a user namespace, mapped through `uidMappings`/`gidMappings` with one.
    pub fn host_ids(&self, uid: u32, gid: u32) -> std::result::Result<(u32, u32), String> {
        let Some(linux) = self.linux.as_ref().filter(|_| self.has_namespace("user")) else {
            return Ok((uid, gid));
        };
        let map = |id: u32, maps: &[IdMapping], what: &str| {
            maps.iter()
                .find_map(|m| {
                    let offset = id.checked_sub(m.container_id)?;
                    (offset < m.size).then(|| m.host_id.checked_add(offset))?
                })
                .ok_or_else(|| format!("container {what} {id} has no mapping on the host"))
        };
        Ok((
            map(uid, &linux.uid_mappings, "uid")?,
            map(gid, &linux.gid_mappings, "gid")?,
        ))
    }
}

/// Parses the subset of `config.json` the hook uses.
pub fn parse_config(raw: &[u8]) -> std::result::Result<OciConfig, String> {
    if !crate::fsutil::starts_json_object(raw) {
        return Err("not a JSON object".to_owned());
    }
    serde_json::from_slice(raw).map_err(|e| one_line(&e.to_string()))
}

/// The bundle directory, opened once: `config.json` is read relative to it.
#[derive(Debug)]
pub struct Bundle {
    /// The bundle directory's fd.
    pub dir: OwnedFd,
    /// Its path, as the OCI state gives it.
    pub path: String,
}

impl Bundle {
    /// Opens the bundle directory named by the OCI state.
    pub fn open(path: &str) -> Result<Bundle> {
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| HookError::input(path, format!("opening the bundle directory: {e}")))?;
        Ok(Bundle {
            dir,
            path: path.to_owned(),
        })
    }

    /// Reads and parses `config.json` (bounded, `O_NOFOLLOW`, regular file only).
    pub fn config(&self) -> Result<OciConfig> {
        let path = Path::new(&self.path).join("config.json");
        let fd = rustix::fs::openat(
            &self.dir,
            "config.json",
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| HookError::input(&path, format!("opening: {e}")))?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| HookError::input(&path, e.to_string()))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(HookError::input(&path, "not a regular file"));
        }
        let raw = read_bounded(fd, MAX_CONFIG_BYTES)
            .map_err(|e| HookError::input(&path, e.to_string()))?;
        parse_config(&raw).map_err(|reason| HookError::input(&path, reason))
    }

    /// The root filesystem's path: `root.path`, joined to the bundle when relative.
    pub fn rootfs(&self, config: &OciConfig) -> Option<String> {
        let root = config.root.as_ref()?;
        if root.path.is_empty() || root.path.contains('\0') {
            return None;
        }
        Some(if root.path.starts_with('/') {
            root.path.clone()
        } else {
            format!("{}/{}", self.path.trim_end_matches('/'), root.path)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RUNC_SPEC: &str = r#"{
        "ociVersion": "1.0.2-dev",
        "process": {"terminal": false, "user": {"uid": 1000, "gid": 100, "additionalGids": [5]},
                    "args": ["sh"], "env": ["PATH=/bin", "TESSERA_ALLOC_ID=abc-0"], "cwd": "/",
                    "capabilities": {"bounding": ["CAP_KILL"]}, "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}]},
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "runc",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "annotations": {"tessera.io/alloc-id": "abc-0"},
        "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]},
                  "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
                  "namespaces": [{"type": "pid"}, {"type": "mount"}],
                  "maskedPaths": ["/proc/kcore"]}
    }"#;

    #[test]
    fn keeps_only_what_the_hook_needs() {
        let c = parse_config(RUNC_SPEC.as_bytes()).expect("runc spec");
        assert_eq!(c.env(), ["PATH=/bin", "TESSERA_ALLOC_ID=abc-0"]);
        assert_eq!(
            c.user(),
            User {
                uid: 1000,
                gid: 100
            }
        );
        assert_eq!(c.annotations["tessera.io/alloc-id"], "abc-0");
        assert!(c.has_device("/dev/nvidia0"));
        assert!(!c.has_device("/dev/nvidia1"));
        assert!(c.has_mount("/proc"));
        assert!(c.has_namespace("mount"));
        assert!(!c.has_namespace("user"));
        assert_eq!(c.root.as_ref().map(|r| r.readonly), Some(true));
    }

    #[test]
    fn nulls_and_absent_sections_are_empty() {
        let c = parse_config(
            br#"{"process":{"env":null},"annotations":null,"mounts":null,"linux":null}"#,
        )
        .expect("nulls");
        assert!(c.env().is_empty() && c.annotations.is_empty() && c.mounts.is_empty());
        assert_eq!(parse_config(b"{}").expect("empty"), OciConfig::default());
    }

    #[test]
    fn malformed_configs_fail_with_one_line() {
        for raw in [
            &b""[..],
            b"[]",
            b"{\"process\": {\"env\": [1]}}",
            b"{\"annotations\": {\"a\": 1}}",
            b"{\"process\": {\"user\": {\"uid\": -1}}}",
            b"{\"root\": {}}",
            b"{\"linux\": {\"devices\": [{}]}}",
        ] {
            let e = parse_config(raw).expect_err(&String::from_utf8_lossy(raw));
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn user_namespace_maps_ids_to_the_host() {
        let c = parse_config(
            br#"{"linux":{"namespaces":[{"type":"user"}],
                 "uidMappings":[{"containerID":0,"hostID":100000,"size":65536}],
                 "gidMappings":[{"containerID":0,"hostID":200000,"size":10}]}}"#,
        )
        .expect("userns");
        assert_eq!(c.host_ids(1000, 5), Ok((101000, 200005)));
        assert!(
            c.host_ids(1000, 10)
                .expect_err("gid unmapped")
                .contains("gid 10")
        );
        assert_eq!(OciConfig::default().host_ids(7, 8), Ok((7, 8)));
    }
}
