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

/// The `MOUNT_ATTR_*` bits `plan`'s options ask for.
pub fn attributes(plan: &MountPlan) -> u64 {
    [
        (plan.readonly, sys::MOUNT_ATTR_RDONLY),
        (plan.nosuid, sys::MOUNT_ATTR_NOSUID),
        (plan.nodev, sys::MOUNT_ATTR_NODEV),
        (plan.noexec, sys::MOUNT_ATTR_NOEXEC),
    ]
    .into_iter()
    .filter(|(on, _)| *on)
    .fold(0, |attrs, (_, attr)| attrs | attr)
}

/// Whether the mount `mount_id` is a shared one in `mountinfo` (its mount
/// events propagate to peers).
pub fn is_shared_mount(mount_id: u64, mountinfo: &str) -> bool {
    parse_mountinfo(mountinfo)
        .iter()
        .any(|m| m.id == mount_id && m.is_shared())
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
    sys::mount_setattr(&fd, attributes(plan), plan.recursive).map_err(what)?;
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
    if is_shared_mount(stx.stx_mnt_id, &mountinfo) {
        return Err(HookError::Unsupported(format!(
            "mount target {path} is on a shared mount in the container; a bind mount there would propagate to other mount namespaces"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::ContainerPath;
    use tessera_test_support::prereq::Need;

    fn plan(host: &str, options: [bool; 4]) -> MountPlan {
        let [readonly, nosuid, nodev, noexec] = options;
        MountPlan {
            host_path: host.into(),
            target: ContainerPath::parse("/usr/local/tessera/vgpu.json").expect("target"),
            recursive: false,
            readonly,
            nosuid,
            nodev,
            noexec,
        }
    }

    #[test]
    fn each_option_sets_its_attribute_and_nothing_else() {
        assert_eq!(attributes(&plan("/x", [false; 4])), 0);
        assert_eq!(
            attributes(&plan("/x", [true, false, false, false])),
            sys::MOUNT_ATTR_RDONLY
        );
        assert_eq!(
            attributes(&plan("/x", [false, true, false, true])),
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC
        );
        assert_eq!(
            attributes(&plan("/x", [true; 4])),
            sys::MOUNT_ATTR_RDONLY
                | sys::MOUNT_ATTR_NOSUID
                | sys::MOUNT_ATTR_NODEV
                | sys::MOUNT_ATTR_NOEXEC
        );
    }

    #[test]
    fn only_a_mount_with_a_shared_peer_group_counts_as_shared() {
        let mountinfo = "20 1 0:5 / / rw shared:1 - ext4 /dev/vda rw\n\
                         30 20 0:6 / /dev rw master:2 - tmpfs tmpfs rw\n\
                         31 20 0:7 / /etc rw - ext4 /dev/vda rw\n";
        assert!(is_shared_mount(20, mountinfo));
        assert!(
            !is_shared_mount(30, mountinfo),
            "a slave does not propagate back"
        );
        assert!(!is_shared_mount(31, mountinfo));
        assert!(
            !is_shared_mount(99, mountinfo),
            "an unknown mount is not shared"
        );
    }

    #[test]
    fn a_source_that_is_neither_file_nor_directory_is_unsupported() {
        tessera_test_support::require!(Need::Root);
        let t = tempfile::tempdir().expect("tempdir");
        let fifo = t.path().join("fifo");
        rustix::fs::mknodat(
            CWD,
            fifo.as_path(),
            FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("fifo");
        let e = open_source(&plan(fifo.to_str().expect("utf-8"), [true; 4]))
            .expect_err("a fifo source");
        assert!(
            matches!(e, HookError::Unsupported(ref why) if why.contains("neither a regular file nor a directory")),
            "{e}"
        );
    }

    #[test]
    fn a_file_source_becomes_a_detached_mount_of_that_file() {
        tessera_test_support::require!(Need::Root);
        let t = tempfile::tempdir().expect("tempdir");
        let file = t.path().join("vgpu.json");
        std::fs::write(&file, b"{}").expect("file");
        let source =
            open_source(&plan(file.to_str().expect("utf-8"), [true; 4])).expect("open_tree");
        assert!(!source.is_dir());
        let st = rustix::fs::stat(file.as_path()).expect("stat");
        assert!(same_inode(&source.stat, &st), "the clone shows the source");
        let e = open_source(&plan("/nonexistent/tessera/x", [false; 4])).expect_err("missing");
        assert!(
            e.to_string()
                .starts_with("bind source /nonexistent/tessera/x"),
            "{e}"
        );
    }
}
