//! Helpers of the unit tests.

/// The process's effective uid and gid (a node owner any user may set).
pub fn own_ids() -> (u32, u32) {
    (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    )
}

/// The permission bits of `path` (not following a symlink).
pub fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

/// Opens the directory `path` with `access` (`RDONLY` or `PATH`), close-on-exec.
pub fn open_dir(path: &std::path::Path, access: rustix::fs::OFlags) -> std::os::fd::OwnedFd {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        path,
        access | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .expect("open dir")
}
