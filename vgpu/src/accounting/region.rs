//! [`SharedRegion`]: the region file mapped into this process, initialized
//! on first use, and unmapped (its slot given back when empty) on drop.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::file::{check_directory, check_existing, open_existing};
use super::fork::{FORK_GENERATION, REGION_FDS, REGION_MAPS, current_pid, install_fork_handler};
use super::layout::{self, Header, Layout};
use super::{AccountingError, LAYOUT_VERSION, MAGIC, MAX_DEVICES, MAX_PROCESSES, NO_SLOT};

/// The container's shared GPU memory budget, mapped into this process.
///
/// Open once per process (and keep it for the process's lifetime); all
/// methods take `&self` and are safe to call from any thread.
pub struct SharedRegion {
    pub(super) layout: NonNull<Layout>,
    pub(super) path: PathBuf,
    /// The region's descriptor: slot locks are held on its open file
    /// description. Kept open for the handle's life; in a forked child the
    /// fork handler has put a fresh description under the same number.
    pub(super) fd: OwnedFd,
    /// Entry in `REGION_FDS`, if one was free.
    pub(super) fd_entry: Option<usize>,
    /// This process's slot, or `NO_SLOT` (every slot held by a live process).
    pub(super) slot: AtomicU32,
    /// `generation << 1` when registered for that fork generation; `| 1` while registering.
    pub(super) reg_state: AtomicU64,
    /// The pid the slot was registered for.
    pub(super) registered_pid: AtomicU32,
}

// SAFETY: the mapping is process-wide and stays valid until drop; every field
// of `Layout` is an atomic, so concurrent access from any thread is sound.
unsafe impl Send for SharedRegion {}
// SAFETY: as for Send: shared access goes through atomics only.
unsafe impl Sync for SharedRegion {}

impl fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRegion")
            .field("path", &self.path)
            .field("slot", &self.slot.load(Ordering::Relaxed))
            .finish()
    }
}

impl SharedRegion {
    /// Attaches the region file at `path` (initializing an empty or
    /// zero-filled one) and claims a slot for this process, reclaiming the
    /// slots of processes that are gone. Never creates the file, never waits
    /// for another process.
    ///
    /// A file that is not a Tessera region, or of another layout version, is
    /// an error and is never written. `device_count` is how many devices this
    /// process will charge (at most [`MAX_DEVICES`]).
    pub fn open(path: &Path, device_count: usize) -> Result<SharedRegion, AccountingError> {
        let io_err = |op: &'static str| {
            move |source: io::Error| AccountingError::Io {
                path: path.to_path_buf(),
                op,
                source,
            }
        };
        if device_count > MAX_DEVICES {
            return Err(AccountingError::TooManyDevices {
                path: path.to_path_buf(),
                requested: device_count,
            });
        }
        install_fork_handler();
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            io_err("open")(io::Error::new(
                io::ErrorKind::InvalidInput,
                "path contains NUL",
            ))
        })?;
        check_directory(path)?;
        let fd = open_existing(&c_path).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOENT) {
                AccountingError::Missing {
                    path: path.to_path_buf(),
                }
            } else {
                io_err("open")(e)
            }
        })?;
        let meta = std::fs::File::from(fd.try_clone().map_err(io_err("dup"))?)
            .metadata()
            .map_err(io_err("fstat"))?;
        if !meta.file_type().is_file() {
            return Err(AccountingError::NotOurs {
                path: path.to_path_buf(),
                reason: "not a regular file".to_string(),
            });
        }
        if check_existing(path, &fd, meta.len())? {
            // Allocate every block now: a hole filled later through the
            // mapping would fault (SIGBUS) on a full file system. Several
            // processes may do this at once; it is idempotent.
            // SAFETY: plain syscall on a descriptor we own.
            let rc =
                unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, layout::SIZE as libc::off_t) };
            if rc != 0 {
                return Err(io_err("fallocate")(io::Error::from_raw_os_error(rc)));
            }
        }
        // SAFETY: maps exactly layout::SIZE bytes of a file we verified (or
        // just extended) to be that long; the result is checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout::SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io_err("mmap")(io::Error::last_os_error()));
        }
        let Some(layout) = NonNull::new(ptr.cast::<Layout>()) else {
            return Err(io_err("mmap")(io::Error::other("null mapping")));
        };
        let fd_entry = REGION_FDS.iter().position(|e| {
            e.compare_exchange(-1, fd.as_raw_fd(), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        if let Some(entry) = fd_entry {
            REGION_MAPS[entry].store(layout.as_ptr() as usize, Ordering::Release);
        }
        let region = SharedRegion {
            layout,
            path: path.to_path_buf(),
            fd,
            fd_entry,
            slot: AtomicU32::new(NO_SLOT),
            reg_state: AtomicU64::new(1),
            registered_pid: AtomicU32::new(0),
        };
        region.initialize()?;
        region
            .layout()
            .header
            .device_count
            .fetch_max(device_count as u32, Ordering::Relaxed);
        let generation = FORK_GENERATION.load(Ordering::Acquire);
        region.reclaim_dead();
        let slot = region.claim_slot();
        region.slot.store(slot, Ordering::Relaxed);
        region.reg_state.store(generation << 1, Ordering::Release);
        Ok(region)
    }

    /// Writes the header of a zero-filled region (idempotent: every field is
    /// a constant, the magic goes last), or checks an initialized one.
    fn initialize(&self) -> Result<(), AccountingError> {
        let header = &self.layout().header;
        match header.magic.load(Ordering::Acquire) {
            MAGIC => return self.check_header(),
            0 => {}
            other => {
                return Err(AccountingError::NotOurs {
                    path: self.path.clone(),
                    reason: format!("magic {other:#018x}"),
                });
            }
        }
        header.version.store(LAYOUT_VERSION, Ordering::Relaxed);
        header
            .header_size
            .store(size_of::<Header>() as u32, Ordering::Relaxed);
        header
            .layout_size
            .store(layout::SIZE as u64, Ordering::Relaxed);
        header
            .max_devices
            .store(MAX_DEVICES as u32, Ordering::Relaxed);
        header
            .max_processes
            .store(MAX_PROCESSES as u32, Ordering::Relaxed);
        match header
            .magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) | Err(MAGIC) => Ok(()),
            Err(other) => Err(AccountingError::NotOurs {
                path: self.path.clone(),
                reason: format!("magic {other:#018x}"),
            }),
        }
    }

    fn check_header(&self) -> Result<(), AccountingError> {
        let header = &self.layout().header;
        let version = header.version.load(Ordering::Relaxed);
        if version != LAYOUT_VERSION {
            return Err(AccountingError::VersionMismatch {
                path: self.path.clone(),
                found: version,
            });
        }
        let recorded = header.layout_size.load(Ordering::Relaxed);
        if recorded != layout::SIZE as u64 {
            return Err(AccountingError::LayoutMismatch {
                path: self.path.clone(),
                reason: format!("header says {recorded} bytes, expected {}", layout::SIZE),
            });
        }
        Ok(())
    }

    pub(super) fn layout(&self) -> &Layout {
        // SAFETY: the mapping is layout::SIZE bytes, page-aligned (so aligned
        // for Layout), lives until drop, and holds only atomics, so a shared
        // reference is sound even while other processes write it.
        unsafe { self.layout.as_ref() }
    }

    /// The region file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // Give the slot back if it is ours (not a parent's, after a fork) and
        // empty; a slot still holding usage is left for others to reclaim
        // once this descriptor (and its lock) is closed.
        let generation = FORK_GENERATION.load(Ordering::Acquire);
        if self.reg_state.load(Ordering::Acquire) == generation << 1
            && self.registered_pid.load(Ordering::Relaxed) == current_pid()
            && let Some(slot) = self
                .layout()
                .slots
                .get(self.slot.load(Ordering::Relaxed) as usize)
            && slot.used.iter().all(|u| u.load(Ordering::Relaxed) == 0)
        {
            slot.start_time.store(0, Ordering::Relaxed);
            slot.pid_ns.store(0, Ordering::Relaxed);
            slot.pid.store(0, Ordering::Release);
        }
        if let Some(entry) = self.fd_entry {
            REGION_MAPS[entry].store(0, Ordering::Release);
            REGION_FDS[entry].store(-1, Ordering::Release);
        }
        // SAFETY: unmaps exactly the mapping made in `open`; no reference into
        // it outlives `self`. The descriptor (and its locks) close after this.
        unsafe {
            libc::munmap(self.layout.as_ptr().cast(), layout::SIZE);
        }
    }
}
