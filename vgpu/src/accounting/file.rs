//! The region file: opened, never created, by the library ([`create_file`]
//! is for the node side and tests); its directory and its header are
//! checked before it is mapped.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{AccountingError, LAYOUT_VERSION, MAGIC, layout};

/// Opens the existing file at `path` read-write (never creating it, never
/// following a symlink), retrying on `EINTR`.
pub(super) fn open_existing(path: &CString) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: `path` is a valid NUL-terminated string; the flags create nothing.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NOCTTY,
            )
        };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by open and is owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Creates an empty region file at `path`, mode 0666 whatever the umask, for
/// the node side and tests (the library itself never creates one). An
/// existing file is left alone.
pub fn create_file(path: &Path) -> Result<(), AccountingError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io_err = |op: &'static str| {
        move |source: io::Error| AccountingError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file
            .set_permissions(std::fs::Permissions::from_mode(0o666))
            .map_err(io_err("chmod")),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err("create")(e)),
    }
}

/// The directory holding the region must not let group or others replace
/// entries (unless sticky, where only owners may).
pub(super) fn check_directory(path: &Path) -> Result<(), AccountingError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let meta = std::fs::metadata(dir).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            AccountingError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            AccountingError::Io {
                path: dir.to_path_buf(),
                op: "stat",
                source,
            }
        }
    })?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(AccountingError::UnsafeDirectory {
            dir: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

pub(super) fn pread_exact(fd: &OwnedFd, buf: &mut [u8], offset: usize) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `buf.len() - done` bytes into the live buffer slice.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (offset + done) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n > 0 => done += n as usize,
            _ => {
                let err = io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EINTR) {
                    return Err(err);
                }
            }
        }
    }
    Ok(done)
}

/// Checks an existing file; `Ok(true)` when it is empty (or a zero-filled
/// leftover of an interrupted creation) and must be extended to full size.
pub(super) fn check_existing(
    path: &Path,
    fd: &OwnedFd,
    size: u64,
) -> Result<bool, AccountingError> {
    if size == 0 {
        return Ok(true);
    }
    let not_ours = |reason: String| AccountingError::NotOurs {
        path: path.to_path_buf(),
        reason,
    };
    let read_err = |source| AccountingError::Io {
        path: path.to_path_buf(),
        op: "read",
        source,
    };
    let mut header = [0u8; 64];
    let got = pread_exact(fd, &mut header, 0).map_err(read_err)?;
    let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |o: usize| u32::from_le_bytes(header[o..o + 4].try_into().unwrap_or([0; 4]));
    let magic = u64_at(0);
    if magic == 0 && size < layout::SIZE as u64 {
        // An interrupted creation leaves zeros only; anything else is not ours.
        let mut all = vec![0u8; size as usize];
        let got = pread_exact(fd, &mut all, 0).map_err(read_err)?;
        if got as u64 == size && all.iter().all(|&b| b == 0) {
            return Ok(true);
        }
        return Err(not_ours("no magic, not empty".to_string()));
    }
    if magic == 0 && size == layout::SIZE as u64 {
        // Zero-filled at full size (or being initialized by another process
        // right now): `initialize` decides through the mapping.
        return Ok(false);
    }
    if got < header.len() || magic != MAGIC {
        return Err(not_ours(format!("magic {magic:#018x}")));
    }
    let version = u32_at(layout::VERSION);
    if version != LAYOUT_VERSION {
        return Err(AccountingError::VersionMismatch {
            path: path.to_path_buf(),
            found: version,
        });
    }
    let recorded = u64_at(layout::LAYOUT_SIZE);
    if recorded != layout::SIZE as u64 || size != layout::SIZE as u64 {
        return Err(AccountingError::LayoutMismatch {
            path: path.to_path_buf(),
            reason: format!(
                "header says {recorded} bytes, file has {size}, expected {}",
                layout::SIZE
            ),
        });
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::super::{SharedRegion, create_file};
    use super::*;

    #[test]
    fn the_library_never_creates_the_file_and_refuses_open_directories() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("vgpu.accounting");
        assert!(matches!(
            SharedRegion::open(&path, 1),
            Err(AccountingError::Missing { .. })
        ));
        assert!(!path.exists(), "nothing was created");
        create_file(&path).expect("create");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let err = SharedRegion::open(&path, 1).expect_err("world-writable directory");
        assert!(err.to_string().contains("mode 0777"), "{err}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        SharedRegion::open(&path, 1).expect("sticky: only owners may unlink");
    }
}
