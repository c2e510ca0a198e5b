//! The fd-relative writer against hostile root filesystems: symlinks planted
//! in the image, absolute or full of `..`, never lead a created node, directory
//! or mount target out of the container root.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, symlink};

use rustix::fs::{Mode, OFlags};
use tessera_hook::journal::Journal;
use tessera_hook::plan::{ContainerPath, NodeKind, NodePlan};
use tessera_hook::rootfs::{ContainerRoot, Outcome};

struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    fn new() -> Tree {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("rootfs")).expect("rootfs");
        fs::create_dir_all(dir.path().join("host")).expect("host");
        fs::write(dir.path().join("host/secret"), "host data").expect("secret");
        Tree { dir }
    }
    fn p(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }
    fn root(&self) -> ContainerRoot {
        let fd = rustix::fs::open(
            self.p("rootfs").as_path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open rootfs");
        ContainerRoot::new(fd)
    }
    fn host_untouched(&self) {
        let names: Vec<_> = fs::read_dir(self.p("host"))
            .expect("host dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["secret"], "something was created in the host dir");
        assert_eq!(
            fs::read_to_string(self.p("host/secret")).expect("read"),
            "host data"
        );
    }
}

/// The rootfs writer sets the process umask around each creation, as the
/// single-threaded hook may; the test harness runs tests on threads, so these
/// tests take turns to keep one test's umask out of another's creations.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn node(path: &str, minor: u32) -> NodePlan {
    NodePlan {
        path: ContainerPath::parse(path).expect("path"),
        kind: NodeKind::Char,
        major: 195,
        minor,
        mode: 0o666,
        uid: 1000,
        gid: 1000,
        access: "rw".into(),
    }
}

#[test]
fn nodes_are_created_in_the_root_with_missing_parents_and_idempotently() {
    let _turn = one_at_a_time();
    if common::skip_unless_root(
        "nodes_are_created_in_the_root_with_missing_parents_and_idempotently",
    ) {
        return;
    }
    let t = Tree::new();
    let root = t.root();
    let mut journal = Journal::default();
    let cap = node("/dev/nvidia-caps/nvidia-cap12", 12);
    assert_eq!(
        root.make_node(&cap, 1000, 1000, &mut journal)
            .expect("mknod"),
        Outcome::Created
    );
    let meta = fs::metadata(t.p("rootfs/dev/nvidia-caps/nvidia-cap12")).expect("node");
    assert!(meta.file_type().is_char_device());
    assert_eq!(
        (meta.rdev(), meta.mode() & 0o7777, meta.uid()),
        (rustix::fs::makedev(195, 12), 0o666, 1000)
    );
    assert_eq!(
        fs::metadata(t.p("rootfs/dev/nvidia-caps"))
            .expect("dir")
            .mode()
            & 0o777,
        0o755
    );
    // dev, nvidia-caps, the node.
    assert_eq!(journal.len(), 3);
    journal.commit();

    let mut again = Journal::default();
    assert_eq!(
        root.make_node(&cap, 1000, 1000, &mut again)
            .expect("second run"),
        Outcome::Existing
    );
    assert!(again.is_empty());

    let other = node("/dev/nvidia-caps/nvidia-cap12", 13);
    let e = root
        .make_node(&other, 0, 0, &mut again)
        .expect_err("different numbers");
    assert!(
        e.to_string().contains("is not the device the spec names"),
        "{e}"
    );
}

#[test]
fn undo_removes_what_the_run_created() {
    let _turn = one_at_a_time();
    if common::skip_unless_root("undo_removes_what_the_run_created") {
        return;
    }
    let t = Tree::new();
    fs::create_dir(t.p("rootfs/dev")).expect("dev");
    let root = t.root();
    let mut journal = Journal::default();
    root.make_node(&node("/dev/nvidia-caps/nvidia-cap1", 1), 0, 0, &mut journal)
        .expect("mknod");
    let target = ContainerPath::parse("/usr/local/tessera/vgpu.json").expect("path");
    root.mount_target(&target, false, &mut journal)
        .expect("target");
    journal.undo(None);
    assert!(t.p("rootfs/dev").is_dir(), "pre-existing dir kept");
    assert!(!t.p("rootfs/dev/nvidia-caps").exists());
    assert!(!t.p("rootfs/usr").exists());
}

#[test]
fn absolute_symlinks_in_the_image_stay_inside() {
    let _turn = one_at_a_time();
    if common::skip_unless_root("absolute_symlinks_in_the_image_stay_inside") {
        return;
    }
    let t = Tree::new();
    // /dev points at the host directory by its absolute host path.
    symlink(t.p("host"), t.p("rootfs/dev")).expect("symlink dev");
    let root = t.root();
    let mut journal = Journal::default();
    let result = root.make_node(&node("/dev/nvidia0", 0), 0, 0, &mut journal);
    // The link resolves inside the root, where its target does not exist; the
    // hook will not create directories through a symlink, so it refuses.
    assert!(result.is_err(), "{result:?}");
    journal.undo(None);
    t.host_untouched();
    let inside = t
        .p("rootfs")
        .join(t.p("host").strip_prefix("/").expect("abs"));
    assert!(!inside.exists(), "nothing created inside either");
}

#[test]
fn dotdot_symlinks_in_the_image_stay_inside() {
    let _turn = one_at_a_time();
    if common::skip_unless_root("dotdot_symlinks_in_the_image_stay_inside") {
        return;
    }
    let t = Tree::new();
    fs::create_dir(t.p("rootfs/dev")).expect("dev");
    symlink(
        "../../../../../../../../host",
        t.p("rootfs/dev/nvidia-caps"),
    )
    .expect("symlink caps");
    symlink("../../host/secret", t.p("rootfs/dev/nvidia0")).expect("symlink node");
    let root = t.root();
    let mut journal = Journal::default();
    let caps = root.make_node(&node("/dev/nvidia-caps/nvidia-cap1", 1), 0, 0, &mut journal);
    let gpu = root.make_node(&node("/dev/nvidia0", 0), 0, 0, &mut journal);
    assert!(caps.is_err(), "{caps:?}");
    assert!(gpu.is_err(), "a symlink where the node goes is not a node");
    journal.undo(None);
    t.host_untouched();
}

#[test]
fn mount_targets_are_never_created_through_symlinks() {
    let _turn = one_at_a_time();
    if common::skip_unless_root("mount_targets_are_never_created_through_symlinks") {
        return;
    }
    let t = Tree::new();
    fs::create_dir(t.p("rootfs/etc")).expect("etc");
    symlink(t.p("host/secret"), t.p("rootfs/etc/ld.so.preload")).expect("symlink preload");
    symlink(t.p("host"), t.p("rootfs/usr")).expect("symlink usr");
    let root = t.root();
    let mut journal = Journal::default();
    let preload = ContainerPath::parse("/etc/ld.so.preload").expect("path");
    assert!(
        root.mount_target(&preload, false, &mut journal).is_err(),
        "dangling-in-root symlink is refused"
    );
    let lib = ContainerPath::parse("/usr/local/tessera/libtessera_vgpu.so").expect("path");
    let r = root.mount_target(&lib, false, &mut journal);
    assert!(r.is_err(), "{r:?}");
    journal.undo(None);
    t.host_untouched();
}

#[test]
fn a_symlink_inside_the_root_is_followed_inside() {
    let _turn = one_at_a_time();
    if common::skip_unless_root("a_symlink_inside_the_root_is_followed_inside") {
        return;
    }
    let t = Tree::new();
    fs::create_dir_all(t.p("rootfs/real/etc")).expect("dirs");
    fs::write(t.p("rootfs/real/etc/ld.so.preload"), "").expect("file");
    symlink("/real/etc", t.p("rootfs/etc")).expect("symlink etc");
    let root = t.root();
    let mut journal = Journal::default();
    let preload = ContainerPath::parse("/etc/ld.so.preload").expect("path");
    let (fd, outcome) = root
        .mount_target(&preload, false, &mut journal)
        .expect("target in root");
    assert_eq!(outcome, Outcome::Existing);
    let st = rustix::fs::fstat(&fd).expect("fstat");
    let want = fs::metadata(t.p("rootfs/real/etc/ld.so.preload")).expect("meta");
    assert_eq!((st.st_dev, st.st_ino), (want.dev(), want.ino()));
    journal.commit();
}
