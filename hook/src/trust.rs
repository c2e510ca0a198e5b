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
    owner_and_mode_problem(stat.st_uid, mode_bits(stat))
}

/// Why owner `uid` and permission bits `mode` make a file or directory
/// untrusted, if they do: anyone but root could change it.
pub fn owner_and_mode_problem(uid: u32, mode: u32) -> Option<String> {
    if uid != 0 {
        Some(format!("owned by uid {uid}, not root"))
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;
    use crate::error::exit;
    use tessera_test_support::prereq::Need;

    #[test]
    fn only_root_owned_and_not_group_or_world_writable_is_trusted() {
        for (uid, mode, problem) in [
            (0, 0o755, None),
            (0, 0o700, None),
            (0, 0o644, None),
            (0, 0o4755, None),
            (0, 0o1777, Some("world-writable (mode 1777)")),
            (0, 0o757, Some("world-writable (mode 0757)")),
            (0, 0o775, Some("group-writable (mode 0775)")),
            (1000, 0o755, Some("owned by uid 1000, not root")),
            (65534, 0o777, Some("owned by uid 65534, not root")),
        ] {
            assert_eq!(
                owner_and_mode_problem(uid, mode).as_deref(),
                problem,
                "uid {uid} mode {mode:o}"
            );
        }
    }

    #[test]
    fn a_missing_directory_means_no_spec() {
        assert!(
            TrustedDir::open(Path::new("/nonexistent/tessera/cdi"))
                .expect("no error")
                .is_none()
        );
        assert!(
            read_trusted_file(Path::new("/nonexistent/tessera/hook.toml"))
                .expect("no error")
                .is_none()
        );
    }

    #[test]
    fn a_symlinked_directory_is_refused_naming_the_symlink() {
        let t = tempfile::tempdir().expect("tempdir");
        symlink("/etc", t.path().join("cdi")).expect("symlink");
        let e = TrustedDir::open(&t.path().join("cdi")).expect_err("symlink");
        assert_eq!(e.exit_code(), exit::REFUSED);
        assert!(
            e.to_string()
                .ends_with("is a symlink; refusing to follow it"),
            "{e}"
        );
    }

    #[test]
    fn a_directory_not_owned_by_root_is_refused() {
        let t = tempfile::tempdir().expect("tempdir");
        if rustix::process::geteuid().is_root() {
            rustix::fs::chown(
                t.path(),
                Some(rustix::fs::Uid::from_raw(65534)),
                Some(rustix::fs::Gid::from_raw(65534)),
            )
            .expect("chown");
        }
        let e = TrustedDir::open(t.path()).expect_err("not root's");
        assert_eq!(e.exit_code(), exit::REFUSED);
        assert!(e.to_string().contains("not root; refusing it"), "{e}");
    }

    #[test]
    fn names_with_a_slash_or_dots_are_not_read() {
        // `/` is root's and not writable by others on every system.
        let root = TrustedDir::open(Path::new("/"))
            .expect("trusted")
            .expect("exists");
        for name in ["etc/passwd", "..", ".", ""] {
            let e = root.read(name).expect_err(name);
            assert!(
                e.to_string().contains("not a plain file name"),
                "{name:?}: {e}"
            );
        }
        assert!(
            root.read("nonexistent-tessera-file")
                .expect("missing")
                .is_none()
        );
    }

    #[test]
    fn a_root_owned_file_is_read_and_a_world_writable_one_refused() {
        tessera_test_support::require!(Need::Root);
        let t = tempfile::tempdir().expect("tempdir");
        let dir = TrustedDir::open(t.path())
            .expect("trusted")
            .expect("exists");
        std::fs::write(t.path().join("good.json"), b"{}").expect("file");
        std::fs::set_permissions(t.path().join("good.json"), PermissionsExt::from_mode(0o644))
            .expect("chmod");
        assert_eq!(
            dir.read("good.json").expect("read").as_deref(),
            Some(&b"{}"[..])
        );
        std::fs::write(t.path().join("open.json"), b"{}").expect("file");
        std::fs::set_permissions(t.path().join("open.json"), PermissionsExt::from_mode(0o666))
            .expect("chmod");
        let e = dir.read("open.json").expect_err("world-writable");
        assert!(e.to_string().contains("world-writable"), "{e}");
        symlink(t.path().join("good.json"), t.path().join("link.json")).expect("symlink");
        let e = dir.read("link.json").expect_err("symlink");
        assert!(e.to_string().contains("is a symlink"), "{e}");
        std::fs::create_dir(t.path().join("sub")).expect("dir");
        let e = dir.read("sub").expect_err("a directory");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
