//! Binding records: which container holds which allocation.
//!
//! Layout under the configured `state_dir` (default `/var/lib/tessera`):
//!
//! ```text
//! <state_dir>/alloc/                     0755 root (created if missing)
//! <state_dir>/alloc/<id>/                0700 root
//! <state_dir>/alloc/<id>/binding.json    0644 root, written atomically (temp + rename; not fsynced, see BINDING_DURABILITY)
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
//! created relative to its parent's fd, its mode set explicitly on its fd
//! afterwards (the process umask plays no part).

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;
use tessera_model::alloc::AllocId;
use tessera_model::contract::node::{ACCOUNTING_SUBDIR, ALLOC_DIR, BINDING_FILE};
use tessera_model::contract::vgpu::ACCOUNTING_FILE;

use crate::error::{HookError, Result};
use crate::fsutil::{Durability, fstat, read_bounded, write_atomic};
use crate::journal::{Created, Journal};
use crate::procfs::CgroupEntry;
use crate::trust::ownership_problem;

/// A binding names a live container: after a crash no container is left
/// for a record to describe, so records are atomic but not fsynced (an
/// fsync would add a disk flush to every container start).
pub const BINDING_DURABILITY: Durability = Durability::WhileRunning;

/// Mode of `state_dir` (when the hook creates it) and of `alloc/`.
pub const STATE_DIR_MODE: u32 = 0o755;
/// Mode of an allocation's directory: root's alone.
pub const ALLOC_MODE: u32 = 0o700;
/// Mode of the accounting directory: root's; the workload may not add,
/// remove or replace entries.
pub const ACCOUNTING_MODE: u32 = 0o755;
/// Mode of the region file in it: every uid of the container shares it.
pub const REGION_MODE: u32 = 0o666;

/// What `binding.json` holds (defined in the model, which the device
/// plugin reads it with).
pub use tessera_model::alloc::BindingRecord as Binding;

/// Picks the cgroup path for [`Binding::cgroup`] from `/proc/<pid>/cgroup` lines.
pub fn preferred_cgroup(entries: &[CgroupEntry]) -> String {
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
/// creation), then opens it as a directory without following a symlink; a
/// directory it created gets exactly `mode`.
fn ensure_dir(
    parent: &OwnedFd,
    name: &str,
    mode: u32,
    journal: Option<&mut Journal>,
) -> io::Result<OwnedFd> {
    let created = match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(mode)) {
        Ok(()) => {
            if let Some(journal) = journal {
                journal.push(Created::Dir {
                    parent: parent.try_clone()?,
                    name: name.to_owned(),
                });
            }
            true
        }
        Err(Errno::EXIST) => false,
        Err(e) => return Err(e.into()),
    };
    let dir = open_dir_at(parent, name)?;
    if created {
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(mode))?;
    }
    Ok(dir)
}

/// Creates `path` and its missing ancestors, each with mode
/// [`STATE_DIR_MODE`] exactly (like `mkdir -p -m 0755`, umask aside).
fn create_state_dir(path: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    for dir in path.ancestors() {
        match std::fs::symlink_metadata(dir) {
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(dir),
            Err(e) => return Err(e),
        }
    }
    for dir in missing.into_iter().rev() {
        match rustix::fs::mkdir(dir, Mode::from_raw_mode(STATE_DIR_MODE)) {
            Ok(()) => {
                let fd = rustix::fs::open(
                    dir,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                rustix::fs::fchmod(&fd, Mode::from_raw_mode(STATE_DIR_MODE))?;
            }
            Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Creates the empty region file in the accounting directory `acct` (or
/// checks the one there: a regular file, which is given back to root with
/// mode 0666 in case it was not).
fn ensure_region(acct: &OwnedFd, journal: &mut Journal) -> io::Result<()> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let file = match rustix::fs::openat(
        acct,
        ACCOUNTING_FILE,
        flags,
        Mode::from_raw_mode(REGION_MODE),
    ) {
        Ok(file) => {
            journal.push(Created::File {
                parent: acct.try_clone()?,
                name: ACCOUNTING_FILE.to_owned(),
            });
            file
        }
        Err(Errno::EXIST) => {
            let file = rustix::fs::openat(
                acct,
                ACCOUNTING_FILE,
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
        let path = state_dir.join(ALLOC_DIR);
        let io =
            |e: io::Error| HookError::apply(format!("state directory {}", state_dir.display()), e);
        if create {
            create_state_dir(state_dir).map_err(io)?;
        }
        let Some(state) = crate::trust::open_root_dir(state_dir)? else {
            return Ok(None);
        };
        let fd = if create {
            ensure_dir(&state, ALLOC_DIR, STATE_DIR_MODE, None)
        } else {
            match open_dir_at(&state, ALLOC_DIR) {
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
        let dir = ensure_dir(&self.fd, id.as_str(), ALLOC_MODE, Some(journal))
            .map_err(|e| io(&dir_path, e))?;
        check_root_owned(&dir, &dir_path)?;
        let acct_path = dir_path.join(ACCOUNTING_SUBDIR);
        let acct = ensure_dir(&dir, ACCOUNTING_SUBDIR, ACCOUNTING_MODE, Some(journal))
            .map_err(|e| io(&acct_path, e))?;
        rustix::fs::fchown(
            &acct,
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::ROOT),
        )
        .map_err(|e| io(&acct_path, e.into()))?;
        rustix::fs::fchmod(&acct, Mode::from_raw_mode(ACCOUNTING_MODE))
            .map_err(|e| io(&acct_path, e.into()))?;
        let region_path = acct_path.join(ACCOUNTING_FILE);
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
        write_atomic(dir, BINDING_FILE, &json, BINDING_DURABILITY)
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::procfs::parse_cgroup;
    use crate::testing::mode_of;
    use tessera_test_support::prereq::Need;

    #[test]
    fn a_missing_state_dir_is_made_with_0755_at_every_level() {
        let t = tempfile::tempdir().expect("tempdir");
        let deep = t.path().join("var/lib/tessera");
        create_state_dir(&deep).expect("created");
        for dir in ["var", "var/lib", "var/lib/tessera"] {
            assert_eq!(mode_of(&t.path().join(dir)), STATE_DIR_MODE, "{dir}");
        }
        std::fs::set_permissions(&deep, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .expect("chmod");
        create_state_dir(&deep).expect("again");
        assert_eq!(
            mode_of(&deep),
            0o700,
            "an existing directory is left as it is"
        );
    }

    #[test]
    fn the_allocation_tree_gets_its_documented_modes_and_undoes_cleanly() {
        tessera_test_support::require!(Need::Root);
        let t = tempfile::tempdir().expect("tempdir");
        let state = t.path().join("state");
        let dirs = AllocDirs::open(&state, true)
            .expect("open")
            .expect("created");
        let id = AllocId::new("pod-0").expect("id");
        let mut journal = Journal::default();
        let dir = dirs.prepare(&id, &mut journal).expect("prepare");
        let binding = Binding {
            alloc_id: id.to_string(),
            container_id: "c1".into(),
            pid: 42,
            cgroup: "/c1".into(),
            cgroups: BTreeMap::new(),
            bundle: "/b".into(),
            mode: "legacy".into(),
            bound_at: 1,
        };
        dirs.write_binding(&dir, &binding, &mut journal)
            .expect("binding");
        let alloc = state.join(ALLOC_DIR).join("pod-0");
        assert_eq!(mode_of(&state.join(ALLOC_DIR)), STATE_DIR_MODE);
        assert_eq!(mode_of(&alloc), ALLOC_MODE);
        assert_eq!(mode_of(&alloc.join(ACCOUNTING_SUBDIR)), ACCOUNTING_MODE);
        assert_eq!(
            mode_of(&alloc.join(ACCOUNTING_SUBDIR).join(ACCOUNTING_FILE)),
            REGION_MODE
        );
        assert_eq!(mode_of(&alloc.join(BINDING_FILE)), 0o644);
        assert!(!dirs.remove_binding(&id, "c2").expect("other container"));
        journal.undo(None);
        assert!(!alloc.exists(), "the run's creations are undone");
        assert!(state.join(ALLOC_DIR).exists());
    }

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
