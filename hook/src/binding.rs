//! Binding records: which container holds which allocation.
//!
//! Layout under the configured `state_dir` (default `/var/lib/tessera`):
//!
//! ```text
//! <state_dir>/alloc/                     0755 root (created if missing)
//! <state_dir>/alloc/<id>/                0700 root
//! <state_dir>/alloc/<id>/binding.json    0644 root, written atomically (temp + rename; no fsync, see `write_atomic`)
//! <state_dir>/alloc/<id>/accounting/     0755 root
//! <state_dir>/alloc/<id>/accounting/vgpu.accounting   0666 root, empty (the vGPU library fills it)
//! ```
//!
//! The accounting directory is the container's `/var/run/tessera/`. It is
//! root's and not writable by the workload, so no process of the container
//! (running as any uid but the host's root) can unlink or replace the region
//! file and split the container's budget; the file itself is writable by
//! every uid of the container, which shares one budget.
//!
//! `binding.json` is removed at poststop, only when it still names the
//! stopping container (a restarted container may already have replaced it).
//! The allocation directory and its accounting directory stay: the
//! allocation outlives a container restart; the device plugin removes them
//! with the allocation.
//!
//! Every directory is opened with `O_DIRECTORY | O_NOFOLLOW` and checked on
//! its fd (root-owned, not group- or world-writable), and every entry is
//! created relative to its parent's fd.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use tessera_model::alloc::AllocId;
use tessera_model::vgpu::ACCOUNTING_FILE_NAME;

use crate::error::{HookError, Result};
use crate::fsutil::{fstat, read_bounded};
use crate::journal::{Created, Journal};
use crate::trust::ownership_problem;

/// The binding record's file name.
pub const BINDING_FILE: &str = "binding.json";
/// The accounting directory's name inside the allocation directory.
pub const ACCOUNTING_DIR: &str = "accounting";
/// Mode of the accounting directory: root's; the workload may not add,
/// remove or replace entries.
pub const ACCOUNTING_MODE: u32 = 0o755;
/// Mode of the region file in it: every uid of the container shares it.
pub const REGION_MODE: u32 = 0o666;

/// What `binding.json` holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Binding {
    /// The allocation.
    pub alloc_id: String,
    /// The OCI container id.
    pub container_id: String,
    /// The container's init pid in the host's pid namespace.
    pub pid: u32,
    /// The container's cgroup: the v2 path where the host has one in use, else
    /// the `memory` (or first) v1 controller's path.
    pub cgroup: String,
    /// Every line of `/proc/<pid>/cgroup`: controllers (`""` for v2) → path.
    pub cgroups: BTreeMap<String, String>,
    /// The bundle directory.
    pub bundle: String,
    /// `cdi` when the runtime applied the spec, `legacy` when the hook did,
    /// `binding` when the hook only recorded the binding.
    pub mode: String,
    /// When the record was written, seconds since the Unix epoch.
    pub bound_at: u64,
}

/// Picks the cgroup path for [`Binding::cgroup`] from `/proc/<pid>/cgroup` lines.
pub fn preferred_cgroup(entries: &[crate::procfs::CgroupEntry]) -> String {
    let v2 = entries
        .iter()
        .find(|e| e.hierarchy == 0 && e.controllers.is_empty());
    let memory = entries
        .iter()
        .find(|e| e.controllers.iter().any(|c| c == "memory"));
    match (v2, memory) {
        (Some(v2), _) if v2.path != "/" => v2.path.clone(),
        (_, Some(m)) => m.path.clone(),
        (Some(v2), None) => v2.path.clone(),
        (None, None) => entries.first().map(|e| e.path.clone()).unwrap_or_default(),
    }
}

/// `<state_dir>/alloc`, opened and checked.
#[derive(Debug)]
pub struct AllocDirs {
    fd: OwnedFd,
    path: PathBuf,
}

fn open_dir_at(parent: impl AsFd, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

fn check_root_owned(fd: &OwnedFd, path: &Path) -> Result<()> {
    let st = fstat(fd).map_err(|e| HookError::apply(format!("fstat {}", path.display()), e))?;
    match ownership_problem(&st) {
        Some(problem) => Err(HookError::untrusted(
            path,
            format!("state directory {problem}"),
        )),
        None => Ok(()),
    }
}

/// Creates `name` in `parent` with `mode` unless it exists (recording a
/// creation), then opens it as a directory without following a symlink.
fn ensure_dir(
    parent: &OwnedFd,
    name: &str,
    mode: u32,
    journal: Option<&mut Journal>,
) -> io::Result<OwnedFd> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode)) {
        Ok(()) => {
            if let Some(journal) = journal {
                journal.push(Created::Dir {
                    parent: parent.try_clone()?,
                    name: name.to_owned(),
                });
            }
        }
        Err(Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    open_dir_at(parent, name)
}

/// Creates the empty region file in the accounting directory `acct` (or
/// checks the one there: a regular file, which is given back to root with
/// mode 0666 in case it was not).
fn ensure_region(acct: &OwnedFd, journal: &mut Journal) -> io::Result<()> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let file = match rustix::fs::openat(
        acct,
        ACCOUNTING_FILE_NAME,
        flags,
        Mode::from_raw_mode(REGION_MODE),
    ) {
        Ok(file) => {
            journal.push(Created::File {
                parent: acct.try_clone()?,
                name: ACCOUNTING_FILE_NAME.to_owned(),
            });
            file
        }
        Err(Errno::EXIST) => {
            let file = rustix::fs::openat(
                acct,
                ACCOUNTING_FILE_NAME,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )?;
            if !rustix::fs::FileType::from_raw_mode(fstat(&file)?.st_mode).is_file() {
                return Err(io::Error::other("not a regular file"));
            }
            file
        }
        Err(e) => return Err(e.into()),
    };
    rustix::fs::fchown(
        &file,
        Some(rustix::fs::Uid::ROOT),
        Some(rustix::fs::Gid::ROOT),
    )?;
    rustix::fs::fchmod(&file, Mode::from_raw_mode(REGION_MODE))?;
    Ok(())
}

impl AllocDirs {
    /// Opens `<state_dir>/alloc`; with `create`, makes `state_dir` (0755) and
    /// `alloc` (0755) when missing. `Ok(None)` when missing and not created.
    pub fn open(state_dir: &Path, create: bool) -> Result<Option<AllocDirs>> {
        let path = state_dir.join("alloc");
        let io =
            |e: io::Error| HookError::apply(format!("state directory {}", state_dir.display()), e);
        if create {
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o755,
            )
            .create(state_dir)
            .map_err(io)?;
        }
        let Some(state) = crate::trust::open_root_dir(state_dir)? else {
            return Ok(None);
        };
        let fd = if create {
            ensure_dir(&state, "alloc", 0o755, None)
        } else {
            match open_dir_at(&state, "alloc") {
                Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => return Ok(None),
                other => other,
            }
        }
        .map_err(|e| HookError::apply(format!("state directory {}", path.display()), e))?;
        check_root_owned(&fd, &path)?;
        Ok(Some(AllocDirs { fd, path }))
    }

    /// Creates (or opens) `alloc/<id>/` (0700 root), its accounting
    /// directory (0755 root; one a previous version made for the container's
    /// user is taken back) and the empty region file in it (0666 root).
    /// Returns the allocation directory's fd.
    pub fn prepare(&self, id: &AllocId, journal: &mut Journal) -> Result<OwnedFd> {
        let dir_path = self.path.join(id.as_str());
        let io = |what: &Path, e: io::Error| HookError::apply(format!("{}", what.display()), e);
        let dir = ensure_dir(&self.fd, id.as_str(), 0o700, Some(journal))
            .map_err(|e| io(&dir_path, e))?;
        check_root_owned(&dir, &dir_path)?;
        let acct_path = dir_path.join(ACCOUNTING_DIR);
        let acct = ensure_dir(&dir, ACCOUNTING_DIR, ACCOUNTING_MODE, Some(journal))
            .map_err(|e| io(&acct_path, e))?;
        rustix::fs::fchown(
            &acct,
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::ROOT),
        )
        .map_err(|e| io(&acct_path, e.into()))?;
        rustix::fs::fchmod(&acct, Mode::from_raw_mode(ACCOUNTING_MODE))
            .map_err(|e| io(&acct_path, e.into()))?;
        let region_path = acct_path.join(ACCOUNTING_FILE_NAME);
        ensure_region(&acct, journal).map_err(|e| io(&region_path, e))?;
        Ok(dir)
    }

    /// Writes `binding` atomically into the allocation directory `dir`.
    pub fn write_binding(
        &self,
        dir: &OwnedFd,
        binding: &Binding,
        journal: &mut Journal,
    ) -> Result<()> {
        let path = self.path.join(&binding.alloc_id).join(BINDING_FILE);
        let previous = read_file_at(dir, BINDING_FILE)
            .map_err(|e| HookError::apply(path.display().to_string(), e))?;
        let mut json = serde_json::to_vec_pretty(binding)
            .map_err(|e| HookError::apply(path.display().to_string(), io::Error::other(e)))?;
        json.push(b'\n');
        write_atomic(dir, BINDING_FILE, &json)
            .map_err(|e| HookError::apply(format!("writing {}", path.display()), e))?;
        journal.push(match previous {
            Some(previous) => Created::Replaced {
                parent: dir
                    .try_clone()
                    .map_err(|e| HookError::apply(path.display().to_string(), e))?,
                name: BINDING_FILE.to_owned(),
                previous,
            },
            None => Created::File {
                parent: dir
                    .try_clone()
                    .map_err(|e| HookError::apply(path.display().to_string(), e))?,
                name: BINDING_FILE.to_owned(),
            },
        });
        Ok(())
    }

    /// Removes `alloc/<id>/binding.json` if it names `container_id`. Returns
    /// whether a record was removed.
    pub fn remove_binding(&self, id: &AllocId, container_id: &str) -> Result<bool> {
        let path = self.path.join(id.as_str()).join(BINDING_FILE);
        let io = |e: io::Error| HookError::apply(format!("{}", path.display()), e);
        let dir = match open_dir_at(&self.fd, id.as_str()) {
            Ok(dir) => dir,
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => return Ok(false),
            Err(e) => return Err(io(e)),
        };
        check_root_owned(&dir, &self.path.join(id.as_str()))?;
        let Some(raw) = read_file_at(&dir, BINDING_FILE).map_err(io)? else {
            return Ok(false);
        };
        match serde_json::from_slice::<Binding>(&raw) {
            Ok(b) if b.container_id != container_id => {
                crate::info!(
                    "{} names container {}, not {container_id}; left in place",
                    path.display(),
                    b.container_id
                );
                return Ok(false);
            }
            Ok(_) => {}
            Err(e) => crate::warn!("{}: unreadable ({e}); removing it", path.display()),
        }
        rustix::fs::unlinkat(&dir, BINDING_FILE, AtFlags::empty()).map_err(|e| io(e.into()))?;
        Ok(true)
    }
}

/// Reads a small file relative to `dir` (no symlink); `None` when missing.
fn read_file_at(dir: &OwnedFd, name: &str) -> io::Result<Option<Vec<u8>>> {
    match rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => read_bounded(fd, 64 * 1024).map(Some),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Writes `name` in `dir` atomically: a temporary file (`O_EXCL`, 0644)
/// renamed over `name`, so a reader sees the old record or the new one.
///
/// No fsync: a binding record describes a running container, and no container
/// survives the crash or power loss that fsync would guard against, so a lost
/// record after a reboot is exactly right; skipping it keeps milliseconds of
/// disk latency off every GPU container's start.
pub fn write_atomic(dir: &OwnedFd, name: &str, content: &[u8]) -> io::Result<()> {
    let tmp = format!(".{name}.{}.tmp", std::process::id());
    let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    let fd = rustix::fs::openat(
        dir,
        tmp.as_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    let result = (|| -> io::Result<()> {
        let mut file = std::fs::File::from(fd);
        std::io::Write::write_all(&mut file, content)?;
        rustix::fs::renameat(dir, tmp.as_str(), dir, name)?;
        Ok(())
    })();
    if result.is_err() {
        let _ = rustix::fs::unlinkat(dir, tmp.as_str(), AtFlags::empty());
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procfs::parse_cgroup;

    #[test]
    fn preferred_cgroup_takes_v2_then_memory() {
        assert_eq!(
            preferred_cgroup(&parse_cgroup("0::/kubepods/pod1/c1\n")),
            "/kubepods/pod1/c1"
        );
        assert_eq!(
            preferred_cgroup(&parse_cgroup("5:devices:/t4\n4:memory:/m/t4\n0::/\n")),
            "/m/t4"
        );
        assert_eq!(preferred_cgroup(&parse_cgroup("5:devices:/t4\n")), "/t4");
        assert_eq!(preferred_cgroup(&[]), "");
    }
}
