//! Busybox root filesystems and root-owned scratch directories for containers,
//! and a container root beside a host directory for escape tests.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rustix::fs::{Mode, OFlags};

/// Root-owned, not world-writable base of every scratch directory: the hook
/// refuses specs in directories others can write, and `/tmp` is one.
pub const SCRATCH_BASE: &str = "/var/lib/tessera-e2e";

/// The busybox applets every test rootfs links in `/bin`.
pub const APPLETS: [&str; 17] = [
    "sh", "ls", "cat", "stat", "find", "echo", "touch", "head", "grep", "sed", "tr", "sleep",
    "test", "xargs", "wc", "mkdir", "true",
];

/// The static busybox of the host (`apt-get install busybox-static`).
pub fn busybox() -> Result<PathBuf> {
    ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .context("busybox-static is not installed (apt-get install busybox-static)")
}

/// `dir/rootfs`: a busybox-static root filesystem with [`APPLETS`] linked in `/bin`.
pub fn busybox_rootfs(dir: &Path) -> Result<PathBuf> {
    let rootfs = dir.join("rootfs");
    fs::create_dir_all(rootfs.join("bin"))?;
    fs::copy(busybox()?, rootfs.join("bin/busybox"))?;
    for applet in APPLETS {
        let link = rootfs.join("bin").join(applet);
        if fs::symlink_metadata(&link).is_err() {
            symlink("busybox", link)?;
        }
    }
    Ok(rootfs)
}

/// A fresh scratch directory under [`SCRATCH_BASE`] (mode 0700, root's),
/// removed on drop.
pub fn scratch_dir(tag: &str) -> Result<tempfile::TempDir> {
    fs::create_dir_all(SCRATCH_BASE)?;
    fs::set_permissions(SCRATCH_BASE, fs::Permissions::from_mode(0o755))?;
    Ok(tempfile::Builder::new()
        .prefix(&format!("{tag}-"))
        .tempdir_in(SCRATCH_BASE)?)
}

/// The mount points of this process's mount namespace (the host's), less
/// runc's own transient ones (see [`is_runc_sealed_binary`]): those come and
/// go with any container another test is creating at the same moment.
pub fn host_mount_points() -> Result<std::collections::BTreeSet<String>> {
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .filter(|m| !is_runc_sealed_binary(m))
        .collect())
}

/// Whether a mount point is runc's read-only copy of its own binary,
/// `<runc root>/<container id>/runc.XXXXXX`: runc (the CVE-2019-5736 fix)
/// mounts it while `runc init` starts a container and removes it right after,
/// so a host mount table read at that moment shows it. Our hook never mounts
/// in a runtime's state directory.
pub fn is_runc_sealed_binary(mount_point: &str) -> bool {
    let mut parts = mount_point.rsplit('/');
    let (Some(name), Some(_id), Some(root)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    name.starts_with("runc.") && root == "runc"
}

/// Host mount points at or under `dir`: a hook that mounted through a rootfs
/// symlink into the host's namespace leaves one there.
pub fn mounts_under(dir: &Path) -> Result<Vec<String>> {
    let dir = dir.display().to_string();
    Ok(host_mount_points()?
        .into_iter()
        .filter(|m| m == &dir || m.starts_with(&format!("{dir}/")))
        .collect())
}

/// A container root beside a host directory, both in a temporary directory:
/// for tests that a writer working in `rootfs/` creates nothing in `host/`,
/// however the image's symlinks point.
pub struct RootBesideHost {
    dir: tempfile::TempDir,
}

impl RootBesideHost {
    /// Empty `rootfs/` and `host/`.
    pub fn new() -> RootBesideHost {
        let dir = tempfile::tempdir().expect("tempdir");
        for sub in ["rootfs", "host"] {
            fs::create_dir(dir.path().join(sub)).expect(sub);
        }
        RootBesideHost { dir }
    }

    /// A path in the temporary directory (`rootfs/dev`, `host/secret`).
    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes `content` to the file at `rel`, making its missing parents.
    pub fn write(&self, rel: &str, content: impl AsRef<[u8]>) {
        let path = self.p(rel);
        fs::create_dir_all(path.parent().expect("a parent")).expect("parents");
        fs::write(&path, content).expect("write");
    }

    /// `rootfs/` opened as the hook holds a container root: `O_PATH`, a
    /// directory, close-on-exec.
    pub fn open_root(&self) -> OwnedFd {
        rustix::fs::open(
            self.p("rootfs").as_path(),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("open rootfs")
    }

    /// The names in `host/`.
    pub fn host_names(&self) -> Vec<String> {
        fs::read_dir(self.p("host"))
            .expect("host dir")
            .map(|e| {
                e.expect("host entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }
}

impl Default for RootBesideHost {
    fn default() -> RootBesideHost {
        RootBesideHost::new()
    }
}

#[cfg(test)]
mod tests {
    use super::is_runc_sealed_binary;

    #[test]
    fn only_runcs_copy_of_itself_in_its_state_directory_is_left_out() {
        // The mount point a CI run saw while another test created a container.
        assert!(is_runc_sealed_binary(
            "/run/runc/tessera-e2e-pidns-12639-16/runc.scV4wS"
        ));
        assert!(is_runc_sealed_binary("/tmp/state/runc/c1/runc.abc"));
        for kept in [
            "/run/runc/c1",
            "/run/runc/c1/rootfs/dev/nvidia0",
            "/run/crun/c1/runc.abc",
            "/var/lib/x/rootfs/runc.abc",
            "runc.abc",
            "/",
        ] {
            assert!(!is_runc_sealed_binary(kept), "{kept}");
        }
    }
}
