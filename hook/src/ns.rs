//! Finding the container's init process, entering its mount namespace, and
//! opening its root directory there.
//!
//! Where the hook runs depends on the hook point (seen with runc 1.1 and crun 1.8):
//!
//! | hook point | hook's namespaces | state `pid` | container root at that time |
//! |---|---|---|---|
//! | `prestart`, `createRuntime` | the host's | the init's host pid | not yet pivoted: the rootfs is bind-mounted on its own host path inside the container's mount namespace, with `/dev` etc. on top |
//! | `createContainer` (runc) | the container's mount and pid namespaces, host `/proc` | `1` | same, not yet pivoted |
//! | `createContainer` (crun) | same | `0` | same |
//!
//! So: when the hook's pid in its own pid namespace differs from its pid in
//! `/proc` (the host's procfs) and the state's pid is 0, 1 or absent, it runs
//! **inside** the container; its parent is then the container's init.
//! Otherwise the state's pid is the init.
//!
//! The container root is found in the container's mount namespace: when the
//! init has not pivoted yet (its `/proc/<pid>/root` is the same directory as the
//! host's `/`), it is the bundle's rootfs path, which must be a mount root
//! there (the runtime's bind mount); once pivoted, it is `/proc/<pid>/root`,
//! opened from the host before entering. Inside the container after the pivot
//! the hook refuses to inject: host paths would resolve in the container.
//!
//! `setns(CLONE_NEWNS)` needs a single-threaded process: the hook never starts
//! a thread.

use std::os::fd::OwnedFd;

use rustix::fs::{CWD, Mode, OFlags, ResolveFlags, StatxAttributes, StatxFlags};
use rustix::thread::LinkNameSpaceType;

use crate::error::{HookError, Result};
use crate::fsutil::{fstat, same_inode};
use crate::procfs::Procfs;
use crate::rootfs::ContainerRoot;
use crate::state::State;

/// The container's init process as the host sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Container {
    /// The init's pid in the host's pid namespace.
    pub init_pid: u32,
    /// The hook runs in the container's namespaces (a `createContainer` hook).
    pub inside: bool,
}

/// Finds the container's init process.
pub fn locate(procfs: &Procfs, state: &State) -> Result<Container> {
    let io = |what: &str, e: std::io::Error| HookError::apply(what.to_owned(), e);
    let host_pid = procfs.self_pid().map_err(|e| io("reading /proc/self", e))?;
    let own_pid = rustix::process::getpid()
        .as_raw_nonzero()
        .get()
        .unsigned_abs();
    // runc passes pid 1 and crun pid 0 to a createContainer hook; a pid above 1
    // is a host pid from a prestart/createRuntime hook whatever /proc shows.
    if host_pid != own_pid && state.pid().is_none_or(|p| p == 1) {
        let init_pid = procfs
            .parent_pid("self")
            .map_err(|e| io("reading /proc/self/stat", e))?;
        let same = procfs
            .ns_id("self", "mnt")
            .map_err(|e| io("reading /proc/self/ns/mnt", e))?
            == procfs
                .ns_id(&init_pid.to_string(), "mnt")
                .map_err(|e| io("reading the parent's mount namespace", e))?;
        if !same {
            return Err(HookError::Unsupported(
                "tessera-hook runs in a child pid namespace but not in its parent's mount namespace; cannot tell which container it serves".into(),
            ));
        }
        return Ok(Container {
            init_pid,
            inside: true,
        });
    }
    let init_pid = state.pid().ok_or_else(|| {
        HookError::State(
            "no pid: run `tessera-hook prestart` as a prestart, createRuntime or createContainer hook".into(),
        )
    })?;
    procfs.ns_id(&init_pid.to_string(), "mnt").map_err(|e| {
        HookError::apply(
            format!("container init pid {init_pid}: reading /proc/{init_pid}/ns/mnt"),
            e,
        )
    })?;
    Ok(Container {
        init_pid,
        inside: false,
    })
}

/// What must be taken from the host side before entering the container's
/// mount namespace to find its root afterwards.
#[derive(Debug)]
pub struct RootProbe {
    init_root: OwnedFd,
    pivoted: bool,
}

impl RootProbe {
    /// Opens `/proc/<init>/root` and compares it with the hook's own `/`.
    pub fn take(procfs: &Procfs, container: &Container) -> Result<RootProbe> {
        let err = |e: std::io::Error| {
            HookError::apply(format!("opening /proc/{}/root", container.init_pid), e)
        };
        let init_root = procfs
            .open_link(
                &format!("{}/root", container.init_pid),
                OFlags::PATH | OFlags::DIRECTORY,
            )
            .map_err(err)?;
        let own_root = rustix::fs::open(
            "/",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| err(e.into()))?;
        let pivoted = !same_inode(
            &fstat(&init_root).map_err(err)?,
            &fstat(&own_root).map_err(err)?,
        );
        Ok(RootProbe { init_root, pivoted })
    }

    /// Opens the container root; call in the container's mount namespace.
    /// `rootfs` is the bundle's rootfs path (host path, as the runtime mounted it).
    pub fn open(self, container: &Container, rootfs: Option<&str>) -> Result<ContainerRoot> {
        if self.pivoted && !container.inside {
            return Ok(ContainerRoot::new(self.init_root));
        }
        let rootfs = rootfs.ok_or_else(|| {
            HookError::Unsupported(
                "config.json has no root.path; cannot find the container's root filesystem".into(),
            )
        })?;
        let fd = rustix::fs::openat2(
            CWD,
            rootfs,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| {
            HookError::apply(
                format!("opening the rootfs {rootfs} in the container's mount namespace"),
                e,
            )
        })?;
        let stx = rustix::fs::statx(
            &fd,
            "",
            rustix::fs::AtFlags::EMPTY_PATH,
            StatxFlags::BASIC_STATS,
        )
        .map_err(|e| HookError::apply(format!("statx of {rootfs}"), e))?;
        let mount_root = stx
            .stx_attributes_mask
            .contains(StatxAttributes::MOUNT_ROOT)
            && stx.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
        let is_own_root = same_inode(
            &fstat(&fd).map_err(|e| HookError::apply(format!("fstat of {rootfs}"), e))?,
            &fstat(&self.init_root).map_err(|e| HookError::apply("fstat of the init's root", e))?,
        );
        if !mount_root || is_own_root {
            return Err(HookError::Unsupported(if container.inside {
                format!(
                    "tessera-hook runs inside the container after its root was switched ({rootfs} is not the runtime's rootfs mount); register it as a prestart or createRuntime hook for legacy injection"
                )
            } else {
                format!(
                    "{rootfs} is not a mount in the container's mount namespace; the runtime did not set up the rootfs as runc and crun do"
                )
            }));
        }
        Ok(ContainerRoot::new(fd))
    }
}

/// The hook inside the container's mount namespace; [`Entered::leave`] goes back.
#[derive(Debug)]
pub struct Entered {
    host: Option<OwnedFd>,
}

/// Enters the init's mount namespace unless the hook is already in it.
pub fn enter(procfs: &Procfs, container: &Container) -> Result<Entered> {
    let pid = container.init_pid.to_string();
    let err = |what: &str, e: std::io::Error| {
        HookError::apply(format!("{what} (container init {pid})"), e)
    };
    let own = procfs
        .ns_id("self", "mnt")
        .map_err(|e| err("reading /proc/self/ns/mnt", e))?;
    let theirs = procfs
        .ns_id(&pid, "mnt")
        .map_err(|e| err("reading the init's mount namespace", e))?;
    if own == theirs {
        if container.inside {
            return Ok(Entered { host: None });
        }
        return Err(HookError::Unsupported(
            "the container shares the host's mount namespace; tessera-hook will not inject devices into it".into(),
        ));
    }
    let host = procfs
        .open_link("self/ns/mnt", OFlags::RDONLY)
        .map_err(|e| err("opening /proc/self/ns/mnt", e))?;
    let target = procfs
        .open_link(&format!("{pid}/ns/mnt"), OFlags::RDONLY)
        .map_err(|e| err("opening the init's mount namespace", e))?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&target),
        Some(LinkNameSpaceType::Mount),
    )
    .map_err(|e| err("entering the container's mount namespace", e.into()))?;
    Ok(Entered { host: Some(host) })
}

impl Entered {
    /// Returns to the host's mount namespace (if it was left).
    pub fn leave(self) -> Result<()> {
        if let Some(host) = self.host {
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&host),
                Some(LinkNameSpaceType::Mount),
            )
            .map_err(|e| HookError::apply("returning to the host's mount namespace", e))?;
        }
        Ok(())
    }
}
