//! The container's device cgroup (cgroup v1 `devices` controller).
//!
//! On cgroup v1 (and hybrid) hosts the runtime leaves a container's device
//! cgroup denying everything it did not list; legacy injection adds one
//! `c major:minor access` line to `devices.allow` per node. The file is reached
//! through the host's cgroup mount: the mount point from the host's
//! `mountinfo`, then the container's cgroup path resolved beneath it with no
//! symlinks and no mount crossings, so nothing the container controls is on the
//! way.
//!
//! On a cgroup v2 host there is no `devices` controller: device access is an
//! eBPF program the runtime attaches, which a hook cannot extend. The hook
//! refuses there (fail closed) and names the ways that work.
//!
//! Rules written behind the runtime's back are lost when systemd re-applies a
//! unit's device policy (`systemctl daemon-reload`); devices granted through
//! CDI or the device plugin's Allocate answer are not. Legacy injection is for
//! engines that offer neither.

use std::io;
use std::os::fd::OwnedFd;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use crate::error::{HookError, Result};
use crate::ns::Container;
use crate::procfs::{CgroupEntry, MountInfo, Procfs, parse_mountinfo};

/// The error a cgroup v2 host gets: what to use instead.
pub const V2_REFUSAL: &str = "this host has no cgroup v1 devices controller (cgroup v2): device access is an eBPF program only the runtime can extend, so tessera-hook cannot grant the devices; use a CDI-enabled runtime (containerd >= 1.7 with enable_cdi, CRI-O, podman --device tessera.io/...) or the device plugin's native Allocate devices";

/// Where the container's `devices.allow` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCgroupPath {
    /// Mount point of the devices hierarchy (host side).
    pub mount_point: String,
    /// The container's cgroup relative to that mount; empty for the root cgroup.
    pub relative: String,
}

/// Finds the container's devices cgroup from its `/proc/<pid>/cgroup` and the
/// host's `mountinfo`. `Err` says why (v2 host, no mount, path outside the mount).
pub fn devices_cgroup_path(
    cgroup: &[CgroupEntry],
    mounts: &[MountInfo],
) -> Result<DeviceCgroupPath, String> {
    let entry = cgroup
        .iter()
        .find(|e| e.controllers.iter().any(|c| c == "devices"))
        .ok_or_else(|| V2_REFUSAL.to_owned())?;
    let mount = mounts
        .iter()
        .find(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == "devices"))
        .ok_or_else(|| {
            "the devices cgroup controller is in use but not mounted on this host".to_owned()
        })?;
    let root = mount.root.trim_end_matches('/');
    let relative = entry
        .path
        .strip_prefix(root)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
        .ok_or_else(|| {
            format!(
                "the container's devices cgroup {} is outside the host's mount of that hierarchy ({})",
                entry.path, mount.root
            )
        })?
        .trim_start_matches('/')
        .to_owned();
    if relative.split('/').any(|c| c == "..") {
        return Err(format!(
            "devices cgroup path {} contains \"..\"",
            entry.path
        ));
    }
    Ok(DeviceCgroupPath {
        mount_point: mount.mount_point.clone(),
        relative,
    })
}

/// An open `devices.allow` of one container.
#[derive(Debug)]
pub struct DeviceCgroup {
    allow: Option<OwnedFd>,
    path: String,
}

impl DeviceCgroup {
    /// Locates and opens the devices cgroup of the container's init (nothing
    /// is written yet).
    pub fn open(procfs: &Procfs, container: &Container) -> Result<DeviceCgroup> {
        let mountinfo = procfs
            .read("self/mountinfo")
            .map_err(|e| HookError::apply("reading /proc/self/mountinfo", e))?;
        let found = devices_cgroup_path(&container.cgroups, &parse_mountinfo(&mountinfo))
            .map_err(HookError::Unsupported)?;
        let path = format!("{}/{}", found.mount_point, found.relative);
        if found.relative.is_empty() {
            // The root cgroup allows every device; there is nothing to add.
            return Ok(DeviceCgroup { allow: None, path });
        }
        let what = |e: io::Error| HookError::apply(format!("opening {path}/devices.allow"), e);
        let mount = rustix::fs::open(
            found.mount_point.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| what(e.into()))?;
        let dir = rustix::fs::openat2(
            &mount,
            found.relative.as_str(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
        )
        .map_err(|e| what(e.into()))?;
        let allow = rustix::fs::openat(
            &dir,
            "devices.allow",
            OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| what(e.into()))?;
        Ok(DeviceCgroup {
            allow: Some(allow),
            path,
        })
    }

    /// The cgroup directory, for messages.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Writes one rule (`c 195:0 rw`) to `devices.allow`.
    pub fn allow(&self, rule: &str) -> Result<()> {
        let Some(fd) = &self.allow else { return Ok(()) };
        rustix::io::write(fd, rule.as_bytes())
            .map(drop)
            .map_err(|e| {
                HookError::apply(
                    format!("writing {rule:?} to {}/devices.allow", self.path),
                    e,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::parse_cgroup;

    fn mounts(text: &str) -> Vec<MountInfo> {
        parse_mountinfo(text)
    }

    const HYBRID: &str = "55 50 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n\
                          60 50 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";

    #[test]
    fn v1_devices_path_is_relative_to_the_mount() {
        let p = devices_cgroup_path(&parse_cgroup("5:devices:/t4\n0::/\n"), &mounts(HYBRID))
            .expect("v1");
        assert_eq!(p.mount_point, "/sys/fs/cgroup/devices");
        assert_eq!(p.relative, "t4");
        let root =
            devices_cgroup_path(&parse_cgroup("5:devices:/\n"), &mounts(HYBRID)).expect("root");
        assert_eq!(root.relative, "");
    }

    #[test]
    fn a_mount_of_a_subtree_is_honoured() {
        let m =
            mounts("55 50 0:33 /kubepods /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n");
        let p = devices_cgroup_path(&parse_cgroup("5:devices:/kubepods/pod1/c1\n"), &m)
            .expect("inside");
        assert_eq!(p.relative, "pod1/c1");
        let e = devices_cgroup_path(&parse_cgroup("5:devices:/kubepodsX/c1\n"), &m)
            .expect_err("outside");
        assert!(e.contains("outside"), "{e}");
    }

    #[test]
    fn cgroup_v2_is_refused_naming_cdi() {
        let e = devices_cgroup_path(
            &parse_cgroup("0::/system.slice/x.scope\n"),
            &mounts("30 20 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"),
        )
        .expect_err("v2");
        assert!(e.contains("cgroup v2") && e.contains("CDI"), "{e}");
        assert!(!e.contains('\n'));
    }
}
