//! What one run created, so a failure can undo it (best effort, newest first).
//!
//! Entries hold the parent directory's fd and the name, never a path: undoing
//! goes through the same fds the creation used, so a symlink swapped in later
//! cannot redirect the removal.

use std::os::fd::OwnedFd;

use rustix::fs::AtFlags;
use rustix::mount::UnmountFlags;

use crate::procfs::Procfs;

/// One thing created by this run.
#[derive(Debug)]
pub enum Created {
    /// A directory `name` in `parent`.
    Dir {
        /// The parent directory.
        parent: OwnedFd,
        /// The new directory's name.
        name: String,
    },
    /// A file or device node `name` in `parent`.
    File {
        /// The parent directory.
        parent: OwnedFd,
        /// The new entry's name.
        name: String,
    },
    /// A file that replaced earlier content (`binding.json`): undo writes the old bytes back.
    Replaced {
        /// The parent directory.
        parent: OwnedFd,
        /// The file's name.
        name: String,
        /// What it held before.
        previous: Vec<u8>,
    },
    /// A mount attached in the container; the fd is the mounted root (opened after attaching).
    Mount {
        /// An `O_PATH` fd of the mount's root.
        root: OwnedFd,
    },
}

/// The undo log of one run.
#[derive(Debug, Default)]
pub struct Journal {
    entries: Vec<Created>,
}

impl Journal {
    /// Records a creation.
    pub fn push(&mut self, entry: Created) {
        self.entries.push(entry);
    }

    /// How many creations were recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing was created.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets the entries: the run succeeded.
    pub fn commit(mut self) {
        self.entries.clear();
    }

    /// Undoes every entry, newest first; failures are logged, not returned.
    /// Unmounting needs the caller to be in the mount's namespace and `procfs`
    /// (to name the mount by fd).
    pub fn undo(mut self, procfs: Option<&Procfs>) {
        while let Some(entry) = self.entries.pop() {
            let result = match &entry {
                Created::Dir { parent, name } => {
                    rustix::fs::unlinkat(parent, name.as_str(), AtFlags::REMOVEDIR)
                        .map_err(Into::into)
                }
                Created::File { parent, name } => {
                    rustix::fs::unlinkat(parent, name.as_str(), AtFlags::empty())
                        .map_err(Into::into)
                }
                Created::Replaced {
                    parent,
                    name,
                    previous,
                } => crate::binding::write_atomic(parent, name, previous),
                Created::Mount { root } => match procfs {
                    Some(procfs) => unmount_fd(procfs, root),
                    None => Ok(()),
                },
            };
            if let Err(e) = result {
                crate::warn!("undoing {entry:?}: {e}");
            }
        }
    }
}

/// Unmounts the mount whose root `fd` is: through `/proc/self/fd/<n>`, resolved
/// from the procfs fd so the container's own `/proc` plays no part.
fn unmount_fd(procfs: &Procfs, fd: &OwnedFd) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    rustix::process::fchdir(procfs.fd())?;
    let path = format!("self/fd/{}", fd.as_raw_fd());
    rustix::mount::unmount(path.as_str(), UnmountFlags::DETACH)?;
    Ok(())
}
