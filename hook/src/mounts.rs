//! Bind mounts with the fd-based mount API (Linux ≥ 5.12 for `mount_setattr`).
//!
//! 1. In the host's mount namespace, `open_tree(OPEN_TREE_CLONE)` clones the
//!    source named by the trusted spec into a detached mount, and
//!    `mount_setattr` makes it read-only / `nosuid` / `nodev` / `noexec` as the
//!    spec says, with private propagation. No container path is involved.
//! 2. In the container's mount namespace, the target is resolved (or created)
//!    in the container root ([`crate::rootfs`]) and `move_mount` attaches the
//!    detached mount onto the target fd. Both ends are fds: no path is
//!    resolved between check and use.
//!
//! A target whose mount is `shared` is refused: the new mount would propagate
//! to the peers of that mount, possibly the host's.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, CWD, FileType, Stat, StatxFlags};
use rustix::mount::{MoveMountFlags, OpenTreeFlags};

use crate::error::{HookError, Result};
use crate::fsutil::{file_type, fstat, same_inode};
use crate::journal::{Created, Journal};
use crate::plan::MountPlan;
use crate::procfs::{Procfs, parse_mountinfo};
use crate::rootfs::{ContainerRoot, Outcome};
use crate::sys;

/// A detached, configured clone of one mount source.
#[derive(Debug)]
pub struct Source {
    fd: OwnedFd,
    stat: Stat,
    /// What the spec asked for.
    pub plan: MountPlan,
}

/// Clones the source of `plan` into a detached mount with its attributes set.
pub fn open_source(plan: &MountPlan) -> Result<Source> {
    let what = |e: io::Error| HookError::apply(format!("bind source {}", plan.host_path), e);
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC;
    if plan.recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    let fd = rustix::mount::open_tree(CWD, plan.host_path.as_str(), flags)
        .map_err(|e| what(e.into()))?;
    let stat = fstat(&fd).map_err(what)?;
    if !matches!(
        file_type(&stat),
        FileType::Directory | FileType::RegularFile
    ) {
        return Err(HookError::Unsupported(format!(
            "bind source {} is neither a regular file nor a directory",
            plan.host_path
        )));
    }
    let mut attrs = 0;
    for (on, attr) in [
        (plan.readonly, sys::MOUNT_ATTR_RDONLY),
        (plan.nosuid, sys::MOUNT_ATTR_NOSUID),
        (plan.nodev, sys::MOUNT_ATTR_NODEV),
        (plan.noexec, sys::MOUNT_ATTR_NOEXEC),
    ] {
        if on {
            attrs |= attr;
        }
    }
    sys::mount_setattr(&fd, attrs, plan.recursive).map_err(what)?;
    Ok(Source {
        fd,
        stat,
        plan: plan.clone(),
    })
}

impl Source {
    /// Whether the source is a directory.
    pub fn is_dir(&self) -> bool {
        file_type(&self.stat) == FileType::Directory
    }

    /// Attaches the source onto its target in the container (the caller is in
    /// the container's mount namespace). A target that already shows the
    /// source (a second run) is left as it is.
    pub fn attach(
        self,
        root: &ContainerRoot,
        procfs: &Procfs,
        journal: &mut Journal,
    ) -> Result<Outcome> {
        let target_path = &self.plan.target;
        let what = |e: io::Error| {
            HookError::apply(format!("mount target {target_path} in the container"), e)
        };
        let (target, _) = root
            .mount_target(target_path, self.is_dir(), journal)
            .map_err(what)?;
        let target_stat = fstat(&target).map_err(what)?;
        if same_inode(&target_stat, &self.stat) {
            return Ok(Outcome::Existing);
        }
        let want_dir = self.is_dir();
        let is_dir = file_type(&target_stat) == FileType::Directory;
        if want_dir != is_dir || (!want_dir && file_type(&target_stat) != FileType::RegularFile) {
            return Err(HookError::Unsupported(format!(
                "mount target {target_path} in the container is a {:?}, the source {} a {:?}",
                file_type(&target_stat),
                self.plan.host_path,
                file_type(&self.stat)
            )));
        }
        refuse_shared(&target, procfs, target_path)?;
        rustix::mount::move_mount(
            self.fd.as_fd(),
            "",
            target.as_fd(),
            "",
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
        )
        .map_err(|e| what(e.into()))?;
        // Reopen through the root: the fd now names the new mount's root, which is what unmounting needs.
        let mounted = root
            .open(target_path.components(), rustix::fs::OFlags::empty())
            .map_err(what)?;
        journal.push(Created::Mount { root: mounted });
        Ok(Outcome::Created)
    }
}

/// Fails when the mount holding `target` propagates mount events to peers.
fn refuse_shared(
    target: &OwnedFd,
    procfs: &Procfs,
    path: &crate::plan::ContainerPath,
) -> Result<()> {
    let stx = rustix::fs::statx(target, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
        .map_err(|e| HookError::apply(format!("statx of mount target {path}"), e))?;
    let mountinfo = procfs
        .read("self/mountinfo")
        .map_err(|e| HookError::apply("reading the container's mountinfo", e))?;
    let shared = parse_mountinfo(&mountinfo)
        .iter()
        .any(|m| m.id == stx.stx_mnt_id && m.is_shared());
    if shared {
        return Err(HookError::Unsupported(format!(
            "mount target {path} is on a shared mount in the container; a bind mount there would propagate to other mount namespaces"
        )));
    }
    Ok(())
}
