//! Host-side tripwires for hostile-rootfs tests: a sentinel tree whose every
//! entry (content, mode, owner, symlink target, device numbers) is recorded
//! before a run and compared after it, and a watch over the host's root
//! directory and mount table for the cases where a rootfs symlink points at `/`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
pub use tessera_test_support::rootfs::{host_mount_points, mounts_under};

/// A string planted in every sentinel file: if a container output shows it, the
/// container read a host file it was never given.
pub const TOKEN: &str = "tessera-sentinel-7f3a9c";

/// One entry of a tree, as compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir {
        /// Permission bits and file type bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
    },
    /// A regular file.
    File {
        /// Permission bits and file type bits.
        mode: u32,
        /// Owner.
        uid: u32,
        /// Group.
        gid: u32,
        /// The whole content (sentinel files are small).
        content: Vec<u8>,
    },
    /// A symbolic link.
    Symlink {
        /// Its target, unresolved.
        target: PathBuf,
    },
    /// Anything else (device node, fifo, socket).
    Special {
        /// Mode with file type bits.
        mode: u32,
        /// Device numbers.
        rdev: u64,
    },
}

/// Every entry under a root, by path relative to it.
pub type Snapshot = BTreeMap<PathBuf, Entry>;

/// Records every entry under `root` (not following symlinks), the root included.
pub fn snapshot(root: &Path) -> Result<Snapshot> {
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out)?;
    Ok(out)
}

fn entry_of(path: &Path) -> Result<Entry> {
    let meta = fs::symlink_metadata(path).with_context(|| path.display().to_string())?;
    let ft = meta.file_type();
    Ok(if ft.is_symlink() {
        Entry::Symlink {
            target: fs::read_link(path)?,
        }
    } else if ft.is_dir() {
        Entry::Dir {
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
        }
    } else if ft.is_file() {
        Entry::File {
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            content: fs::read(path)?,
        }
    } else {
        Entry::Special {
            mode: meta.mode(),
            rdev: meta.rdev(),
        }
    })
}

fn walk(root: &Path, rel: &Path, out: &mut Snapshot) -> Result<()> {
    let path = root.join(rel);
    let entry = entry_of(&path)?;
    let is_dir = matches!(entry, Entry::Dir { .. });
    out.insert(rel.to_owned(), entry);
    if is_dir {
        for child in fs::read_dir(&path)? {
            let child = child?;
            walk(root, &rel.join(child.file_name()), out)?;
        }
    }
    Ok(())
}

/// How a tree changed: one line per added, removed or changed entry.
pub fn changes(before: &Snapshot, after: &Snapshot) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (path, entry) in after {
        match before.get(path) {
            None => out.insert(format!("added {} ({})", path.display(), describe(entry))),
            Some(old) if old != entry => out.insert(format!(
                "changed {} ({} -> {})",
                path.display(),
                describe(old),
                describe(entry)
            )),
            Some(_) => false,
        };
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        out.insert(format!("removed {}", path.display()));
    }
    out
}

fn describe(entry: &Entry) -> String {
    match entry {
        Entry::Dir { mode, uid, gid } => format!("dir {mode:o} {uid}:{gid}"),
        Entry::File {
            mode,
            uid,
            gid,
            content,
        } => format!(
            "file {mode:o} {uid}:{gid} {} bytes {:016x}",
            content.len(),
            fnv(content)
        ),
        Entry::Symlink { target } => format!("symlink -> {}", target.display()),
        Entry::Special { mode, rdev } => format!("special {mode:o} rdev {rdev:x}"),
    }
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Lays out a sentinel tree under `dir`: files named like what the hook
/// writes (`ld.so.preload`, `libtessera_vgpu.so`, `vgpu.json`, a `nvidia0`
/// decoy), a `nvidia-caps/` directory, copies of the host's `passwd` and
/// `group`, a fake `shadow`, and a symlink. Every file holds [`TOKEN`]. The
/// names of the nodes the test allocation grants are left free, so a node
/// made through a symlink shows up as an added entry.
pub fn plant(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir.join("nvidia-caps"))?;
    let files = [
        "nvidia0",
        "ld.so.preload",
        "libtessera_vgpu.so",
        "vgpu.json",
        "shadow",
        "nvidia-caps/nvidia-cap1",
    ];
    for name in files {
        fs::write(dir.join(name), format!("{TOKEN} {name}\n"))?;
    }
    for name in ["passwd", "group"] {
        let mut content = fs::read(Path::new("/etc").join(name)).unwrap_or_default();
        content.extend_from_slice(format!("# {TOKEN}\n").as_bytes());
        fs::write(dir.join(name), content)?;
    }
    fs::set_permissions(dir.join("shadow"), fs::Permissions::from_mode(0o600))?;
    std::os::unix::fs::symlink("passwd", dir.join("passwd-link"))?;
    Ok(())
}

/// The entries of the host's `/` that a hook following a rootfs symlink to `/`
/// would create or change, plus every mount point on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRootView {
    top: BTreeMap<String, Entry>,
    watched: BTreeMap<String, Option<Entry>>,
    mounts: BTreeSet<String>,
}

/// Host paths a misdirected hook would touch besides the top level of `/`.
const WATCHED: [&str; 6] = [
    "/etc/ld.so.preload",
    "/usr/local/tessera",
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidiactl",
    "/dev/nvidia-caps",
];

impl HostRootView {
    /// Reads the top level of `/` (directories by mode and owner only), the
    /// watched paths, and the host's mount points.
    pub fn read() -> Result<Self> {
        let mut top = BTreeMap::new();
        for child in fs::read_dir("/")? {
            let child = child?;
            let name = child.file_name().to_string_lossy().into_owned();
            let path = child.path();
            let mut entry = entry_of_shallow(&path)?;
            if let Entry::Dir { .. } = entry {
                // Only the kind matters for directories at the top.
                entry = Entry::Dir {
                    mode: 0,
                    uid: 0,
                    gid: 0,
                };
            }
            top.insert(name, entry);
        }
        let watched = WATCHED
            .iter()
            .map(|p| {
                (
                    (*p).to_owned(),
                    fs::symlink_metadata(p)
                        .ok()
                        .and_then(|_| entry_of(Path::new(p)).ok()),
                )
            })
            .collect();
        Ok(Self {
            top,
            watched,
            mounts: host_mount_points()?,
        })
    }

    /// What differs from `before`, one line each.
    pub fn changes_since(&self, before: &HostRootView) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (name, entry) in &self.top {
            match before.top.get(name) {
                Some(old) if old != entry => {
                    out.insert(format!("/{name}: {} -> {}", describe(old), describe(entry)));
                }
                // New entries count when a runtime or hook could have made
                // them; other programs may create files in / meanwhile.
                None if is_suspect_name(name) => {
                    out.insert(format!("/{name}: {}", describe(entry)));
                }
                _ => {}
            }
        }
        for name in before.top.keys().filter(|n| !self.top.contains_key(*n)) {
            out.insert(format!("/{name}: removed"));
        }
        for (path, entry) in &self.watched {
            if before.watched.get(path) != Some(entry) {
                out.insert(format!("{path}: changed"));
            }
        }
        for mount in self.mounts.difference(&before.mounts) {
            if is_suspect_mount(mount) {
                out.insert(format!("new host mount at {mount}"));
            }
        }
        out
    }

    /// Removes new top-level entries of `/` with the names runtimes (and a
    /// misdirected hook) create when a rootfs `/dev` points at `/` — files,
    /// symlinks, device nodes, empty directories — and lazily unmounts new
    /// host mounts under the watched paths. Returns what it removed.
    pub fn clean_up_after(before: &HostRootView) -> Vec<String> {
        let mut removed = Vec::new();
        let Ok(now) = HostRootView::read() else {
            return removed;
        };
        for mount in now.mounts.difference(&before.mounts) {
            if is_suspect_mount(mount) {
                let _ = std::process::Command::new("umount")
                    .args(["-l", mount])
                    .status();
                removed.push(format!("unmounted {mount}"));
            }
        }
        for (name, entry) in &now.top {
            if before.top.contains_key(name) || !is_suspect_name(name) {
                continue;
            }
            let path = Path::new("/").join(name);
            let ok = match entry {
                Entry::Symlink { .. } | Entry::Special { .. } | Entry::File { .. } => {
                    fs::remove_file(&path).is_ok()
                }
                // A naive hook makes `nvidia-caps/` with nodes in it.
                Entry::Dir { .. } if name.starts_with("nvidia") => {
                    fs::remove_dir_all(&path).is_ok()
                }
                Entry::Dir { .. } => fs::remove_dir(&path).is_ok(),
            };
            if ok {
                removed.push(format!("/{name}"));
            }
        }
        removed
    }
}

/// Names a runtime (its `/dev` entries) or a misdirected hook (device nodes,
/// the vGPU files and their directories) would create in `/`.
fn is_suspect_name(name: &str) -> bool {
    const RUNTIME: [&str; 15] = [
        "core", "fd", "full", "null", "ptmx", "random", "stderr", "stdin", "stdout", "tty",
        "urandom", "zero", "pts", "shm", "mqueue",
    ];
    const HOOK: [&str; 5] = [
        "ld.so.preload",
        "libtessera_vgpu.so",
        "vgpu.json",
        "tessera",
        "local",
    ];
    RUNTIME.contains(&name) || HOOK.contains(&name) || name.starts_with("nvidia")
}

/// A mount a misdirected hook could have made on the host: at a watched path or
/// directly under `/`. (Other new host mounts belong to other programs.)
fn is_suspect_mount(mount: &str) -> bool {
    WATCHED.iter().any(|w| mount.starts_with(w)) || mount.matches('/').count() == 1
}

fn entry_of_shallow(path: &Path) -> Result<Entry> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_file() {
        // Top-level regular files are compared by metadata, not content.
        return Ok(Entry::File {
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            content: meta.len().to_le_bytes().to_vec(),
        });
    }
    entry_of(path)
}
