//! The container's root filesystem, reached only through a directory fd.
//!
//! Every container-side path is resolved relative to the root fd with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: a symlink in the image
//! (absolute or full of `..`) resolves as it would inside the container and can
//! never lead out of it, and `/proc/self/root`-style magic links are refused.
//! Missing directories are created one component at a time relative to the
//! fd of their parent, and every entry is created with `*at` calls on the
//! resolved parent fd (`mknodat`, `mkdirat`, `openat(O_CREAT | O_EXCL |
//! O_NOFOLLOW)`), so nothing is ever created through a symlink. No host path
//! string is ever built from a container path.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::fsutil::file_type;
use crate::journal::{Created, Journal};
use crate::plan::{ContainerPath, NodeKind, NodePlan};

/// What happened to one node or mount target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Created by this run.
    Created,
    /// Already there and as wanted (a second run of the hook).
    Existing,
}

/// The container's root directory.
#[derive(Debug)]
pub struct ContainerRoot {
    fd: OwnedFd,
}

fn in_root() -> ResolveFlags {
    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS
}

fn beneath_no_symlinks() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// Runs `f` with the process umask at 0, so created entries get exactly the
/// mode asked for (the hook is single-threaded; the old mask is restored).
fn exact_mode<T>(f: impl FnOnce() -> T) -> T {
    let old = rustix::process::umask(Mode::empty());
    let result = f();
    rustix::process::umask(old);
    result
}

/// `openat2` as an `io::Result`.
fn open2(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    resolve: ResolveFlags,
) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat2(
        dir,
        path,
        flags | OFlags::CLOEXEC,
        Mode::empty(),
        resolve,
    )?)
}

impl ContainerRoot {
    /// Wraps a directory fd of the container's root.
    pub fn new(fd: OwnedFd) -> ContainerRoot {
        ContainerRoot { fd }
    }

    /// The root fd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens `components` (a path in the container) as `O_PATH`, resolved in the root.
    pub fn open(&self, components: &[String], flags: OFlags) -> io::Result<OwnedFd> {
        let path = if components.is_empty() {
            ".".to_owned()
        } else {
            components.join("/")
        };
        open2(self.fd(), &path, OFlags::PATH | flags, in_root())
    }

    /// Resolves the directory `components`, creating missing ones (mode 0755,
    /// owned by the hook, i.e. root) and recording them in `journal`.
    pub fn dir(&self, components: &[String], journal: &mut Journal) -> io::Result<OwnedFd> {
        let mut current = self.open(&[], OFlags::DIRECTORY)?;
        for (i, name) in components.iter().enumerate() {
            match self.open(&components[..=i], OFlags::DIRECTORY) {
                Ok(fd) => current = fd,
                Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {
                    match exact_mode(|| {
                        rustix::fs::mkdirat(&current, name.as_str(), Mode::from_raw_mode(0o755))
                    }) {
                        Ok(()) => journal.push(Created::Dir {
                            parent: current.try_clone()?,
                            name: name.clone(),
                        }),
                        Err(Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                    current = open2(
                        current.as_fd(),
                        name,
                        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW,
                        beneath_no_symlinks(),
                    )?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(current)
    }

    /// Creates the device node `node` (owner `uid`:`gid` on the host side),
    /// or accepts an existing node of the same kind and numbers.
    pub fn make_node(
        &self,
        node: &NodePlan,
        uid: u32,
        gid: u32,
        journal: &mut Journal,
    ) -> io::Result<Outcome> {
        let parent = self.dir(node.path.parent(), journal)?;
        let name = node.path.name();
        let wanted = match node.kind {
            NodeKind::Char => FileType::CharacterDevice,
            NodeKind::Block => FileType::BlockDevice,
            NodeKind::Fifo => FileType::Fifo,
        };
        let dev = rustix::fs::makedev(node.major, node.minor);
        match exact_mode(|| {
            rustix::fs::mknodat(&parent, name, wanted, Mode::from_raw_mode(node.mode), dev)
        }) {
            Ok(()) => {
                journal.push(Created::File {
                    parent: parent.try_clone()?,
                    name: name.to_owned(),
                });
                rustix::fs::chownat(
                    &parent,
                    name,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )?;
                Ok(Outcome::Created)
            }
            Err(Errno::EXIST) => {
                let st = rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
                let same =
                    file_type(&st) == wanted && (node.kind == NodeKind::Fifo || st.st_rdev == dev);
                if same {
                    Ok(Outcome::Existing)
                } else {
                    Err(io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        format!("{} exists and is not the device the spec names", node.path),
                    ))
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Opens the mount target `path` (`O_PATH`, resolved in the root), creating
    /// it first when missing: an empty directory (0755) when `dir`, else an
    /// empty file (0644).
    pub fn mount_target(
        &self,
        path: &ContainerPath,
        dir: bool,
        journal: &mut Journal,
    ) -> io::Result<(OwnedFd, Outcome)> {
        match self.open(path.components(), OFlags::empty()) {
            Ok(fd) => return Ok((fd, Outcome::Existing)),
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => {}
            Err(e) => return Err(e),
        }
        let parent = self.dir(path.parent(), journal)?;
        let name = path.name();
        if dir {
            exact_mode(|| rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755)))?;
        } else {
            drop(exact_mode(|| {
                rustix::fs::openat(
                    &parent,
                    name,
                    OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::WRONLY
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
            })?);
        }
        journal.push(if dir {
            Created::Dir {
                parent: parent.try_clone()?,
                name: name.to_owned(),
            }
        } else {
            Created::File {
                parent: parent.try_clone()?,
                name: name.to_owned(),
            }
        });
        let fd = open2(
            parent.as_fd(),
            name,
            OFlags::PATH | OFlags::NOFOLLOW,
            beneath_no_symlinks(),
        )?;
        Ok((fd, Outcome::Created))
    }
}
