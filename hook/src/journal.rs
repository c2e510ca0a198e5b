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

/// The undo log of one run. The entries are [`Created`] for the real
/// writers; other implementations of the container filesystem trait
/// (`container_fs::ContainerFs`) bring their own.
#[derive(Debug)]
pub struct Journal<E = Created> {
    entries: Vec<E>,
}

impl<E> Default for Journal<E> {
    fn default() -> Self {
        Journal {
            entries: Vec::new(),
        }
    }
}

impl<E: std::fmt::Debug> Journal<E> {
    /// Records a creation.
    pub fn push(&mut self, entry: E) {
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

    /// Undoes every entry with `undo_one`, newest first. A failure is
    /// logged, and the older entries are still undone.
    pub fn undo_with(mut self, mut undo_one: impl FnMut(E) -> std::io::Result<()>) {
        while let Some(entry) = self.entries.pop() {
            let shown = format!("{entry:?}");
            if let Err(e) = undo_one(entry) {
                crate::warn!("undoing {shown}: {e}");
            }
        }
    }
}

impl Journal {
    /// Undoes every entry, newest first; failures are logged, not returned.
    /// Unmounting needs the caller to be in the mount's namespace and `procfs`
    /// (to name the mount by fd); without it mounts are left.
    pub fn undo(self, procfs: Option<&Procfs>) {
        self.undo_with(|entry| undo(&entry, procfs));
    }
}

/// Undoes one real creation through the fds it holds.
pub fn undo(entry: &Created, procfs: Option<&Procfs>) -> std::io::Result<()> {
    match entry {
        Created::Dir { parent, name } => {
            rustix::fs::unlinkat(parent, name.as_str(), AtFlags::REMOVEDIR).map_err(Into::into)
        }
        Created::File { parent, name } => {
            rustix::fs::unlinkat(parent, name.as_str(), AtFlags::empty()).map_err(Into::into)
        }
        Created::Replaced {
            parent,
            name,
            previous,
        } => crate::fsutil::write_atomic(
            parent,
            name,
            previous,
            // What is replaced and put back is a binding record.
            crate::fsutil::Durability::WhileRunning,
        ),
        Created::Mount { root } => match procfs {
            Some(procfs) => unmount_fd(procfs, root),
            None => Ok(()),
        },
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rustix::fs::OFlags;

    use super::*;
    use crate::testing::open_dir;

    fn dir_fd(path: &Path) -> OwnedFd {
        open_dir(path, OFlags::RDONLY)
    }

    fn file(parent: &Path, name: &str) -> Created {
        Created::File {
            parent: dir_fd(parent),
            name: name.into(),
        }
    }

    /// A temporary directory with an empty file `name`, and a journal that
    /// records having made it.
    fn journaled_file(name: &str) -> (tempfile::TempDir, Journal) {
        let t = tempfile::tempdir().expect("tempdir");
        std::fs::write(t.path().join(name), b"").expect("file");
        let mut journal = Journal::default();
        journal.push(file(t.path(), name));
        (t, journal)
    }

    fn dir(parent: &Path, name: &str) -> Created {
        Created::Dir {
            parent: dir_fd(parent),
            name: name.into(),
        }
    }

    #[test]
    fn undo_removes_newest_first_so_directories_are_empty_by_then() {
        let t = tempfile::tempdir().expect("tempdir");
        let mut journal = Journal::default();
        std::fs::create_dir(t.path().join("dev")).expect("dev");
        journal.push(dir(t.path(), "dev"));
        std::fs::create_dir(t.path().join("dev/caps")).expect("caps");
        journal.push(dir(&t.path().join("dev"), "caps"));
        std::fs::write(t.path().join("dev/caps/node"), b"").expect("node");
        journal.push(file(&t.path().join("dev/caps"), "node"));
        assert_eq!(journal.len(), 3);
        journal.undo(None);
        assert!(!t.path().join("dev").exists(), "everything removed");
    }

    #[test]
    fn a_committed_run_keeps_what_it_made() {
        let (t, journal) = journaled_file("kept");
        journal.commit();
        assert!(t.path().join("kept").exists());
    }

    #[test]
    fn a_replaced_file_gets_its_old_content_back() {
        let t = tempfile::tempdir().expect("tempdir");
        std::fs::write(t.path().join("binding.json"), b"new").expect("file");
        let mut journal = Journal::default();
        journal.push(Created::Replaced {
            parent: dir_fd(t.path()),
            name: "binding.json".into(),
            previous: b"old".to_vec(),
        });
        journal.undo(None);
        assert_eq!(
            std::fs::read(t.path().join("binding.json")).expect("read"),
            b"old"
        );
    }

    #[test]
    fn a_failed_removal_does_not_stop_the_older_ones() {
        let (t, mut journal) = journaled_file("first");
        // Already gone: its removal fails.
        journal.push(file(t.path(), "gone"));
        journal.undo(None);
        assert!(!t.path().join("first").exists());
    }

    #[test]
    fn without_procfs_mounts_are_left_and_the_rest_undone() {
        let (t, mut journal) = journaled_file("target");
        journal.push(Created::Mount {
            root: dir_fd(t.path()),
        });
        journal.undo(None);
        assert!(!t.path().join("target").exists());
        assert!(t.path().exists(), "nothing unmounted or removed above it");
    }

    #[test]
    fn undo_with_hands_each_entry_over_newest_first() {
        let mut journal = Journal::<u32>::default();
        for n in 1..=4 {
            journal.push(n);
        }
        let mut seen = Vec::new();
        journal.undo_with(|n| {
            seen.push(n);
            if n == 3 {
                Err(std::io::Error::other("fails"))
            } else {
                Ok(())
            }
        });
        assert_eq!(seen, [4, 3, 2, 1]);
    }
}
