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
//!
//! Modes are set explicitly after each creation (`fchmod`, or through
//! `/proc/self/fd` for a device node), so the process umask plays no part.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::fsutil::{file_type, set_mode};
use crate::journal::{Created, Journal};
use crate::plan::{ContainerPath, NodeKind, NodePlan};
use crate::procfs::Procfs;

/// Mode of the directories the hook creates in a container.
pub const DIR_MODE: u32 = 0o755;
/// Mode of the empty files the hook creates as mount targets.
pub const FILE_MODE: u32 = 0o644;

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
    /// The hook's checked `/proc`, for setting the mode of device nodes;
    /// opened on demand when not given.
    procfs: Option<Procfs>,
}

fn in_root() -> ResolveFlags {
    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS
}

fn beneath_no_symlinks() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

fn is_missing(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::NOENT.raw_os_error())
}

/// How often a lookup is retried when the kernel saw a rename or mount
/// race (`EAGAIN`); a container that keeps racing gets the error.
const RACE_RETRIES: usize = 16;

/// `openat2` as an `io::Result`, retried on `EAGAIN`: with `RESOLVE_IN_ROOT`
/// or `RESOLVE_BENEATH` the kernel refuses a lookup through `..` while any
/// rename or mount happens on the machine, and asks the caller to retry. On
/// a busy node that is common and says nothing about the container.
fn open2(
    dir: BorrowedFd<'_>,
    path: &str,
    flags: OFlags,
    resolve: ResolveFlags,
) -> io::Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(dir, path, flags | OFlags::CLOEXEC, Mode::empty(), resolve) {
            Err(Errno::AGAIN) if tries < RACE_RETRIES => tries += 1,
            result => return Ok(result?),
        }
    }
}

/// Makes the directory `name` in `parent` (mode [`DIR_MODE`]) and records it;
/// `Existing` when an entry of that name appeared meanwhile.
fn mkdir_in(parent: &OwnedFd, name: &str, journal: &mut Journal) -> io::Result<Outcome> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(DIR_MODE)) {
        Ok(()) => {}
        Err(Errno::EXIST) => return Ok(Outcome::Existing),
        Err(e) => return Err(e.into()),
    }
    journal.push(Created::Dir {
        parent: parent.try_clone()?,
        name: name.to_owned(),
    });
    let dir = open2(
        parent.as_fd(),
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
        beneath_no_symlinks(),
    )?;
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(DIR_MODE))?;
    Ok(Outcome::Created)
}

/// Creates the empty file `name` in `parent` (mode [`FILE_MODE`]; never
/// through a symlink, never over an existing entry) and records it.
fn create_file_in(parent: &OwnedFd, name: &str, journal: &mut Journal) -> io::Result<()> {
    let file = rustix::fs::openat(
        parent,
        name,
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(FILE_MODE),
    )?;
    journal.push(Created::File {
        parent: parent.try_clone()?,
        name: name.to_owned(),
    });
    rustix::fs::fchmod(&file, Mode::from_raw_mode(FILE_MODE))?;
    Ok(())
}

impl ContainerRoot {
    /// Wraps a directory fd of the container's root.
    pub fn new(fd: OwnedFd) -> ContainerRoot {
        ContainerRoot { fd, procfs: None }
    }

    /// Wraps a directory fd of the container's root, with the hook's checked
    /// `/proc` for setting the modes of device nodes.
    pub fn with_procfs(fd: OwnedFd, procfs: &Procfs) -> io::Result<ContainerRoot> {
        Ok(ContainerRoot {
            fd,
            procfs: Some(procfs.try_clone()?),
        })
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

    /// Opens the regular file `components` for reading, resolved in the root
    /// (`O_NONBLOCK | O_NOCTTY`, so a FIFO or device put there cannot block
    /// or become a terminal); anything but a regular file is refused.
    pub fn open_regular(&self, components: &[String]) -> io::Result<OwnedFd> {
        let fd = open2(
            self.fd(),
            &components.join("/"),
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            in_root(),
        )?;
        if file_type(&rustix::fs::fstat(&fd)?) != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok(fd)
    }

    /// Makes the directory `components` (mode 0755, owned by the hook, i.e.
    /// root) in its existing parent, unless an entry of that name is there
    /// (of any type: its user checks it).
    pub fn make_dir(&self, components: &[String], journal: &mut Journal) -> io::Result<Outcome> {
        let Some((name, parent)) = components.split_last() else {
            return Ok(Outcome::Existing);
        };
        match self.open(components, OFlags::empty()) {
            Ok(_) => return Ok(Outcome::Existing),
            Err(e) if is_missing(&e) => {}
            Err(e) => return Err(e),
        }
        let parent = self.open(parent, OFlags::DIRECTORY)?;
        mkdir_in(&parent, name, journal)
    }

    /// Creates the empty file `path` (mode 0644) in its existing parent,
    /// unless an entry of that name is there (of any type: its user checks it).
    pub fn create_file(&self, path: &ContainerPath, journal: &mut Journal) -> io::Result<Outcome> {
        match self.open(path.components(), OFlags::empty()) {
            Ok(_) => return Ok(Outcome::Existing),
            Err(e) if is_missing(&e) => {}
            Err(e) => return Err(e),
        }
        let parent = self.open(path.parent(), OFlags::DIRECTORY)?;
        create_file_in(&parent, path.name(), journal)?;
        Ok(Outcome::Created)
    }

    /// Resolves the directory `components`, creating missing ones (mode 0755,
    /// owned by the hook, i.e. root) and recording them in `journal`.
    pub fn dir(&self, components: &[String], journal: &mut Journal) -> io::Result<OwnedFd> {
        let mut current = self.open(&[], OFlags::DIRECTORY)?;
        for (i, name) in components.iter().enumerate() {
            match self.open(&components[..=i], OFlags::DIRECTORY) {
                Ok(fd) => current = fd,
                Err(e) if is_missing(&e) => {
                    mkdir_in(&current, name, journal)?;
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
    /// with its missing parent directories, or accepts an existing node of
    /// the same kind and numbers.
    pub fn make_node(
        &self,
        node: &NodePlan,
        uid: u32,
        gid: u32,
        journal: &mut Journal,
    ) -> io::Result<Outcome> {
        let parent = self.dir(node.path.parent(), journal)?;
        self.node_in(&parent, node, uid, gid, journal)
    }

    /// Creates the device node `node` in its existing parent directory, or
    /// accepts an existing node of the same kind and numbers.
    pub fn create_node(
        &self,
        node: &NodePlan,
        uid: u32,
        gid: u32,
        journal: &mut Journal,
    ) -> io::Result<Outcome> {
        let parent = self.open(node.path.parent(), OFlags::DIRECTORY)?;
        self.node_in(&parent, node, uid, gid, journal)
    }

    fn node_in(
        &self,
        parent: &OwnedFd,
        node: &NodePlan,
        uid: u32,
        gid: u32,
        journal: &mut Journal,
    ) -> io::Result<Outcome> {
        let name = node.path.name();
        let wanted = match node.kind {
            NodeKind::Char => FileType::CharacterDevice,
            NodeKind::Block => FileType::BlockDevice,
            NodeKind::Fifo => FileType::Fifo,
        };
        let dev = rustix::fs::makedev(node.major, node.minor);
        match rustix::fs::mknodat(parent, name, wanted, Mode::from_raw_mode(node.mode), dev) {
            Ok(()) => {
                journal.push(Created::File {
                    parent: parent.try_clone()?,
                    name: name.to_owned(),
                });
                rustix::fs::chownat(
                    parent,
                    name,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(gid)),
                    AtFlags::SYMLINK_NOFOLLOW,
                )?;
                // Never opened for I/O (that would reach the driver): an
                // O_PATH fd names the new node for setting its mode.
                let fd = open2(
                    parent.as_fd(),
                    name,
                    OFlags::PATH | OFlags::NOFOLLOW,
                    beneath_no_symlinks(),
                )?;
                match &self.procfs {
                    Some(procfs) => set_mode(&fd, node.mode, procfs.fd())?,
                    None => set_mode(&fd, node.mode, Procfs::open()?.fd())?,
                }
                Ok(Outcome::Created)
            }
            Err(Errno::EXIST) => {
                let st = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)?;
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
    /// it first when missing (with its missing parents): an empty directory
    /// (0755) when `dir`, else an empty file (0644).
    pub fn mount_target(
        &self,
        path: &ContainerPath,
        dir: bool,
        journal: &mut Journal,
    ) -> io::Result<(OwnedFd, Outcome)> {
        match self.open(path.components(), OFlags::empty()) {
            Ok(fd) => return Ok((fd, Outcome::Existing)),
            Err(e) if is_missing(&e) => {}
            Err(e) => return Err(e),
        }
        let parent = self.dir(path.parent(), journal)?;
        let name = path.name();
        if dir {
            if mkdir_in(&parent, name, journal)? == Outcome::Existing {
                return Err(Errno::EXIST.into());
            }
        } else {
            create_file_in(&parent, name, journal)?;
        }
        let fd = open2(
            parent.as_fd(),
            name,
            OFlags::PATH | OFlags::NOFOLLOW,
            beneath_no_symlinks(),
        )?;
        Ok((fd, Outcome::Created))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileTypeExt, symlink};
    use std::path::Path;

    use super::*;
    use crate::testing::{mode_of, own_ids};
    use tessera_test_support::prereq::Need;
    use tessera_test_support::rootfs::RootBesideHost as Tree;

    trait Root {
        fn root(&self) -> ContainerRoot;
    }

    impl Root for Tree {
        fn root(&self) -> ContainerRoot {
            ContainerRoot::new(self.open_root())
        }
    }

    fn fifo(path: &str, mode: u32) -> NodePlan {
        let (uid, gid) = own_ids();
        NodePlan {
            path: ContainerPath::parse(path).expect("path"),
            kind: NodeKind::Fifo,
            major: 0,
            minor: 0,
            mode,
            uid,
            gid,
            access: String::new(),
        }
    }

    fn components(path: &str) -> Vec<String> {
        ContainerPath::parse(path)
            .expect("path")
            .components()
            .to_vec()
    }

    #[test]
    fn modes_are_exact_whatever_the_umask() {
        // The hook no longer sets the umask; a strict one must not change
        // what it creates. The only test that touches the umask; the others
        // are unaffected meanwhile: the hook's writers set every mode, and
        // fixtures only need to be the owner's.
        let old = rustix::process::umask(Mode::from_raw_mode(0o077));
        let t = Tree::new();
        let root = t.root();
        let mut journal = Journal::default();
        let made = (
            root.make_node(
                &fifo("/dev/caps/fifo", 0o666),
                own_ids().0,
                own_ids().1,
                &mut journal,
            ),
            root.create_file(
                &ContainerPath::parse("/dev/file").expect("path"),
                &mut journal,
            ),
            root.make_dir(&components("/dev/dir"), &mut journal),
        );
        rustix::process::umask(old);
        assert_eq!(made.0.expect("node"), Outcome::Created);
        assert_eq!(made.1.expect("file"), Outcome::Created);
        assert_eq!(made.2.expect("dir"), Outcome::Created);
        assert_eq!(mode_of(&t.p("rootfs/dev")), 0o755);
        assert_eq!(mode_of(&t.p("rootfs/dev/caps")), 0o755);
        assert_eq!(mode_of(&t.p("rootfs/dev/caps/fifo")), 0o666);
        assert_eq!(mode_of(&t.p("rootfs/dev/file")), 0o644);
        assert_eq!(mode_of(&t.p("rootfs/dev/dir")), 0o755);
        journal.commit();
    }

    #[test]
    fn a_second_run_finds_the_node_and_records_nothing() {
        let t = Tree::new();
        let root = t.root();
        let (uid, gid) = own_ids();
        let node = fifo("/dev/fifo", 0o600);
        let mut first = Journal::default();
        assert_eq!(
            root.make_node(&node, uid, gid, &mut first).expect("make"),
            Outcome::Created
        );
        assert_eq!(first.len(), 2, "dev and the node");
        first.commit();
        let mut again = Journal::default();
        assert_eq!(
            root.create_node(&node, uid, gid, &mut again)
                .expect("again"),
            Outcome::Existing
        );
        assert!(again.is_empty());
    }

    #[test]
    fn an_entry_of_another_kind_where_the_node_goes_fails_and_is_kept() {
        let t = Tree::new();
        t.write("rootfs/dev/fifo", b"image data");
        let root = t.root();
        let (uid, gid) = own_ids();
        let mut journal = Journal::default();
        let e = root
            .create_node(&fifo("/dev/fifo", 0o666), uid, gid, &mut journal)
            .expect_err("a regular file is there");
        assert!(
            e.to_string().contains("is not the device the spec names"),
            "{e}"
        );
        assert!(journal.is_empty());
        assert_eq!(
            std::fs::read(t.p("rootfs/dev/fifo")).expect("kept"),
            b"image data"
        );
    }

    #[test]
    fn symlinks_in_the_image_resolve_inside_the_root() {
        let t = Tree::new();
        std::fs::create_dir(t.p("rootfs/host")).expect("a /host in the image");
        // An absolute symlink and one full of `..`, as seen from the host
        // both aiming at its `host` dir.
        symlink("/host", t.p("rootfs/dev")).expect("symlink dev");
        symlink("../../../../../host", t.p("rootfs/etc")).expect("symlink etc");
        let root = t.root();
        let (uid, gid) = own_ids();
        let mut journal = Journal::default();
        root.make_node(&fifo("/dev/fifo", 0o666), uid, gid, &mut journal)
            .expect("made inside");
        root.mount_target(
            &ContainerPath::parse("/etc/ld.so.preload").expect("path"),
            false,
            &mut journal,
        )
        .expect("made inside");
        assert!(
            t.host_names().is_empty(),
            "something was created in the host dir"
        );
        assert!(
            std::fs::symlink_metadata(t.p("rootfs/host/fifo"))
                .expect("node in the root")
                .file_type()
                .is_fifo()
        );
        assert!(t.p("rootfs/host/ld.so.preload").is_file());
        journal.undo(None);
        assert!(!t.p("rootfs/host/ld.so.preload").exists());
        assert!(!t.p("rootfs/host/fifo").exists());
    }

    #[test]
    fn a_dangling_symlink_for_a_directory_fails_closed() {
        let t = Tree::new();
        symlink(t.p("host"), t.p("rootfs/dev")).expect("symlink dev");
        let root = t.root();
        let (uid, gid) = own_ids();
        let mut journal = Journal::default();
        assert!(
            root.make_node(&fifo("/dev/fifo", 0o666), uid, gid, &mut journal)
                .is_err()
        );
        assert!(
            t.host_names().is_empty(),
            "something was created in the host dir"
        );
        assert!(journal.is_empty());
    }

    #[test]
    fn make_dir_and_create_file_keep_whatever_is_there() {
        let t = Tree::new();
        t.write("rootfs/etc/ld.so.preload", b"x");
        let root = t.root();
        let mut journal = Journal::default();
        assert_eq!(
            root.make_dir(&components("/etc/ld.so.preload"), &mut journal)
                .expect("existing"),
            Outcome::Existing,
            "a file where a directory is asked for is its user's to refuse"
        );
        assert_eq!(
            root.create_file(
                &ContainerPath::parse("/etc/ld.so.preload").expect("path"),
                &mut journal
            )
            .expect("existing"),
            Outcome::Existing
        );
        assert!(journal.is_empty());
        let e = root
            .make_dir(&components("/nope/dir"), &mut journal)
            .expect_err("parent missing");
        assert!(is_missing(&e), "{e}");
    }

    #[test]
    fn a_magic_link_is_never_followed() {
        let t = Tree::new();
        symlink("/proc/self/root", t.p("rootfs/escape")).expect("symlink");
        let root = t.root();
        let mut journal = Journal::default();
        // Resolved in the root, /proc/self/root names nothing there.
        assert!(
            root.make_dir(&components("/escape/x"), &mut journal)
                .is_err()
        );
        assert!(t.host_names().is_empty());
        assert!(journal.is_empty());
    }

    #[test]
    fn a_char_device_gets_its_numbers_owner_and_mode() {
        tessera_test_support::require!(Need::Root);
        let t = Tree::new();
        let root = t.root();
        let mut node = fifo("/dev/nvidia-caps/nvidia-cap3", 0o640);
        node.kind = NodeKind::Char;
        node.major = 195;
        node.minor = 3;
        let mut journal = Journal::default();
        assert_eq!(
            root.make_node(&node, 1000, 1001, &mut journal)
                .expect("mknod"),
            Outcome::Created
        );
        let path: &Path = &t.p("rootfs/dev/nvidia-caps/nvidia-cap3");
        let st = rustix::fs::stat(path).expect("stat");
        assert!(
            std::fs::symlink_metadata(path)
                .expect("meta")
                .file_type()
                .is_char_device()
        );
        assert_eq!(
            (st.st_rdev, st.st_uid, st.st_gid, st.st_mode & 0o7777),
            (rustix::fs::makedev(195, 3), 1000, 1001, 0o640)
        );
        let mut other = node.clone();
        other.minor = 4;
        assert!(
            root.create_node(&other, 0, 0, &mut Journal::default())
                .is_err()
        );
        journal.undo(None);
        assert!(!t.p("rootfs/dev").exists());
    }
}
