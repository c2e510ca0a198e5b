//! The fd-relative writer against hostile root filesystems: symlinks planted
//! in the image, absolute or full of `..`, never lead a created node, directory
//! or mount target out of the container root.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, symlink};

use common::{Need, require};
use tessera_hook::journal::Journal;
use tessera_hook::plan::{ContainerPath, NodeKind, NodePlan};
use tessera_hook::rootfs::{ContainerRoot, Outcome};
use tessera_test_support::rootfs::RootBesideHost as Tree;

trait Root {
    fn root(&self) -> ContainerRoot;
}

impl Root for Tree {
    fn root(&self) -> ContainerRoot {
        ContainerRoot::new(self.open_root())
    }
}

/// A root beside a host directory holding one file, `secret`.
fn tree() -> Tree {
    let t = Tree::new();
    t.write("host/secret", "host data");
    t
}

fn host_untouched(t: &Tree) {
    assert_eq!(
        t.host_names(),
        ["secret"],
        "something was created in the host dir"
    );
    assert_eq!(
        fs::read_to_string(t.p("host/secret")).expect("read"),
        "host data"
    );
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

/// This test's turn and a fresh tree; `None`, after a skip, without root.
fn turn_and_tree() -> Option<(std::sync::MutexGuard<'static, ()>, Tree)> {
    let turn = one_at_a_time();
    require(&[Need::Root]).ok()?;
    Some((turn, tree()))
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
    let Some((_turn, t)) = turn_and_tree() else {
        return;
    };
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
    let Some((_turn, t)) = turn_and_tree() else {
        return;
    };
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
    let Some((_turn, t)) = turn_and_tree() else {
        return;
    };
    // /dev points at the host directory by its absolute host path.
    symlink(t.p("host"), t.p("rootfs/dev")).expect("symlink dev");
    let root = t.root();
    let mut journal = Journal::default();
    let result = root.make_node(&node("/dev/nvidia0", 0), 0, 0, &mut journal);
    // The link resolves inside the root, where its target does not exist; the
    // hook will not create directories through a symlink, so it refuses.
    assert!(result.is_err(), "{result:?}");
    journal.undo(None);
    host_untouched(&t);
    let inside = t
        .p("rootfs")
        .join(t.p("host").strip_prefix("/").expect("abs"));
    assert!(!inside.exists(), "nothing created inside either");
}

#[test]
fn dotdot_symlinks_in_the_image_stay_inside() {
    let Some((_turn, t)) = turn_and_tree() else {
        return;
    };
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
    host_untouched(&t);
}

#[test]
fn mount_targets_are_never_created_through_symlinks() {
    let Some((_turn, t)) = turn_and_tree() else {
        return;
    };
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
    host_untouched(&t);
}

#[test]
fn a_symlink_inside_the_root_is_followed_inside() {
    let Some((_turn, t)) = turn_and_tree() else {
        return;
    };
    t.write("rootfs/real/etc/ld.so.preload", "");
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
