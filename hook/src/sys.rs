//! The hook's only `unsafe`: two calls the safe crates do not offer.
//!
//! - `mount_setattr(2)` (Linux ≥ 5.12), to make a detached bind mount
//!   read-only, `nosuid`, … and private before it is attached;
//! - clearing the process environment at start.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// `MOUNT_ATTR_RDONLY`.
pub const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
/// `MOUNT_ATTR_NOSUID`.
pub const MOUNT_ATTR_NOSUID: u64 = 0x0000_0002;
/// `MOUNT_ATTR_NODEV`.
pub const MOUNT_ATTR_NODEV: u64 = 0x0000_0004;
/// `MOUNT_ATTR_NOEXEC`.
pub const MOUNT_ATTR_NOEXEC: u64 = 0x0000_0008;
/// `MS_PRIVATE`, as a propagation type for `mount_setattr`.
pub const MS_PRIVATE: u64 = 1 << 18;

/// `struct mount_attr` (uapi `linux/mount.h`, `MOUNT_ATTR_SIZE_VER0`).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets `attr_set` and private propagation on the mount `fd` refers to
/// (`AT_EMPTY_PATH`), recursively when `recursive`.
pub fn mount_setattr(fd: impl AsFd, attr_set: u64, recursive: bool) -> io::Result<()> {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: MS_PRIVATE,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: the path is a valid NUL-terminated empty string, `attr` is a live
    // `struct mount_attr` of the size passed, and the fd is borrowed for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_fd().as_raw_fd(),
            c"".as_ptr(),
            flags,
            &raw const attr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Removes every environment variable of this process.
///
/// The hook never reads its environment and runs no other program, but a
/// runtime that finds a hook entry without `env` passes the container's
/// (CVE-2025-23266); clearing it first means nothing from there survives into
/// anything the process does later. Call before any thread exists.
pub fn clear_environment() {
    // SAFETY: `main` calls this first, while the process has one thread, so no
    // other thread reads or writes the environment concurrently; `clearenv`
    // only resets `environ`, and std reads `environ` afresh on each access.
    let ret = unsafe { libc::clearenv() };
    debug_assert_eq!(ret, 0);
}
