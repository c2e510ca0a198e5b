//! Reading files the hook trusts: CDI specs and `hook.toml`.
//!
//! A spec decides which host files get mounted into a container and which
//! devices it may open, so it is only read when nobody but root could have
//! written it:
//!
//! - the directory is opened with `O_DIRECTORY | O_NOFOLLOW` (its last
//!   component is not a symlink) and, on that fd, must be owned by root and not
//!   group- or world-writable;
//! - the file is opened relative to that fd with `O_NOFOLLOW` (not a symlink)
//!   and, on the opened fd, must be a regular file owned by root, not group- or
//!   world-writable, and at most a size bound.
//!
//! Checking the opened fds, not the paths, leaves no window between check and use.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::error::{HookError, Result};
use crate::fsutil::{file_type, mode_bits, read_bounded};

/// The most bytes of a spec or `hook.toml` read.
pub const MAX_TRUSTED_FILE_BYTES: usize = 1024 * 1024;

/// A directory that passed the trust checks.
#[derive(Debug)]
pub struct TrustedDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Why the owner and mode of `stat` make it untrusted, if they do.
pub fn ownership_problem(stat: &Stat) -> Option<String> {
    let mode = mode_bits(stat);
    if stat.st_uid != 0 {
        Some(format!("owned by uid {}, not root", stat.st_uid))
    } else if mode & 0o002 != 0 {
        Some(format!("world-writable (mode {mode:04o})"))
    } else if mode & 0o020 != 0 {
        Some(format!("group-writable (mode {mode:04o})"))
    } else {
        None
    }
}

/// Opens the directory `path` without following a symlink in its last
/// component and checks, on the fd, that it is owned by root and not group- or
/// world-writable; `Ok(None)` when it does not exist.
pub fn open_root_dir(path: &Path) -> Result<Option<OwnedFd>> {
    let fd = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(Errno::LOOP | Errno::NOTDIR) => {
            let link =
                rustix::fs::statat(rustix::fs::CWD, path, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| file_type(&st) == FileType::Symlink);
            return Err(HookError::untrusted(
                path,
                if link {
                    "is a symlink; refusing to follow it"
                } else {
                    "not a directory"
                },
            ));
        }
        Err(e) => return Err(HookError::untrusted(path, format!("opening: {e}"))),
    };
    let stat = rustix::fs::fstat(&fd).map_err(|e| HookError::untrusted(path, e.to_string()))?;
    if let Some(problem) = ownership_problem(&stat) {
        return Err(HookError::untrusted(
            path,
            format!("directory {problem}; refusing it"),
        ));
    }
    Ok(Some(fd))
}

impl TrustedDir {
    /// Opens `path` and checks it ([`open_root_dir`]); `Ok(None)` when it does not exist.
    pub fn open(path: &Path) -> Result<Option<TrustedDir>> {
        Ok(open_root_dir(path)?.map(|fd| TrustedDir {
            fd,
            path: path.to_path_buf(),
        }))
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads `name` from the directory after the file checks; `Ok(None)` when
    /// it does not exist.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path.join(name);
        if name.contains('/') || name == "." || name == ".." || name.is_empty() {
            return Err(HookError::untrusted(&path, "not a plain file name"));
        }
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP) => {
                return Err(HookError::untrusted(
                    &path,
                    "is a symlink; refusing to follow it",
                ));
            }
            Err(e) => return Err(HookError::untrusted(&path, format!("opening: {e}"))),
        };
        let stat =
            rustix::fs::fstat(&fd).map_err(|e| HookError::untrusted(&path, e.to_string()))?;
        if file_type(&stat) != FileType::RegularFile {
            return Err(HookError::untrusted(&path, "not a regular file"));
        }
        if let Some(problem) = ownership_problem(&stat) {
            return Err(HookError::untrusted(
                &path,
                format!("{problem}; refusing it"),
            ));
        }
        let raw = read_bounded(fd, MAX_TRUSTED_FILE_BYTES)
            .map_err(|e| HookError::untrusted(&path, e.to_string()))?;
        Ok(Some(raw))
    }
}

/// Reads the trusted file at `path` (directory and file checked); `Ok(None)`
/// when the directory or the file does not exist.
pub fn read_trusted_file(path: &Path) -> Result<Option<Vec<u8>>> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Err(HookError::untrusted(path, "not a file path"));
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    match TrustedDir::open(dir)? {
        Some(dir) => dir.read(name),
        None => Ok(None),
    }
}
