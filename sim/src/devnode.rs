//! Character device nodes made with `mknod(2)` — the one `unsafe` corner of
//! the builder.
//!
//! Modes follow what real hosts show: GPU nodes (`nvidia<N>`, `nvidiactl`,
//! `nvidia-uvm`, `nvidia-uvm-tools`) are `0666`; MIG capability nodes take
//! the `DeviceFileMode` the driver publishes for them, `0400` for `config`
//! (only the instance manager may use it) and `0444` for `monitor` and the
//! per-instance `access` capabilities. Creating a node needs root (or
//! `CAP_MKNOD`); without it the builder fails with a message that says so,
//! rather than leaving an incomplete tree.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::SimError;

/// Mode of GPU device nodes.
pub const GPU_NODE_MODE: u32 = 0o666;
/// Mode of the `config` capability node.
pub const CAP_CONFIG_MODE: u32 = 0o400;
/// Mode of the `monitor` and per-instance `access` capability nodes.
pub const CAP_ACCESS_MODE: u32 = 0o444;

/// Creates character device `major:minor` at `path` with `mode` (exactly,
/// regardless of umask). Fails if something exists there.
pub fn make_char_node(path: &Path, major: u32, minor: u32, mode: u32) -> Result<(), SimError> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| SimError::Build {
        path: path.to_path_buf(),
        reason: "path contains a NUL byte".into(),
    })?;
    let dev = libc::makedev(major, minor);
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call;
    // mknod reads it and touches no other memory of ours.
    let rc = unsafe { libc::mknod(c_path.as_ptr(), libc::S_IFCHR | (mode & 0o777), dev) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        let reason = match err.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => format!(
                "cannot create character device {major}:{minor}: {err}; making device nodes needs root (or CAP_MKNOD)"
            ),
            _ => format!("cannot create character device {major}:{minor}: {err}"),
        };
        return Err(SimError::Build {
            path: path.to_path_buf(),
            reason,
        });
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(|e| SimError::io(path, e))
}

/// Like [`make_char_node`], but keeps a node that is already there with the
/// right type and numbers, and replaces anything else.
pub fn ensure_char_node(path: &Path, major: u32, minor: u32, mode: u32) -> Result<(), SimError> {
    match fs::symlink_metadata(path) {
        Ok(m) => {
            let rdev = m.rdev();
            if m.file_type().is_char_device()
                && libc::major(rdev) == major
                && libc::minor(rdev) == minor
            {
                return Ok(());
            }
            fs::remove_file(path).map_err(|e| SimError::io(path, e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(SimError::io(path, e)),
    }
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(|e| SimError::io(dir, e))?;
    }
    match make_char_node(path, major, minor, mode) {
        // Another process made the same node between our look and our mknod.
        Err(_) if is_char_node(path, major, minor) => Ok(()),
        r => r,
    }
}

/// Whether `path` is character device `major:minor`.
pub fn is_char_node(path: &Path, major: u32, minor: u32) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| {
        m.file_type().is_char_device()
            && libc::major(m.rdev()) == major
            && libc::minor(m.rdev()) == minor
    })
}
