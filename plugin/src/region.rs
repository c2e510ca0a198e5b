//! The accounting region mapped shared (the plugin's one `unsafe` module).
//!
//! The node monitor publishes each allocation's utilization into the
//! allocation's region file (`<state_dir>/alloc/<id>/accounting/vgpu.accounting`),
//! at the offsets `tessera_model::vgpu_region` defines and the vGPU library
//! maps the same file by. Every access is an atomic of the field's size at
//! a naturally aligned offset of the mapping, so the library's processes and
//! the plugin never tear each other's values.
//!
//! The plugin never initializes or extends a region: a file that is not a
//! full-size, initialized region of this layout version is left alone (its
//! library has not run yet, or it is not ours), and nothing is published.
//!
//! Trust: the file is writable by the container. The plugin maps exactly
//! [`vgpu_region::SIZE`] bytes and re-checks the file's size before every
//! pass of stores; a container that truncates its own file between that
//! check and a store could still make the store fault (`SIGBUS`). The
//! window is a few microseconds per period; closing it needs the stores to
//! go through the file (`pwrite`) instead, which the library's atomics
//! could then see torn.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tessera_model::vgpu_region::{self, Published};

/// Why a region file could not be mapped.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// An I/O call on the file failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// The region file.
        path: PathBuf,
        /// The call.
        op: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// One allocation's region file, mapped shared, read-write.
pub struct MappedRegion {
    base: NonNull<u8>,
    file: File,
    path: PathBuf,
    dev_ino: (u64, u64),
}

// SAFETY: the mapping is valid until drop, and every access to it is an
// atomic operation, so using it from several threads is sound.
unsafe impl Send for MappedRegion {}
// SAFETY: as for Send: shared access goes through atomics only.
unsafe impl Sync for MappedRegion {}

impl std::fmt::Debug for MappedRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedRegion")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl MappedRegion {
    /// Maps the region at `path`; `Ok(None)` when the file is missing, not a
    /// regular file, not full size, or not an initialized region of this
    /// layout version (nothing to publish into yet).
    pub fn open(path: &Path) -> Result<Option<MappedRegion>, RegionError> {
        let io_err = |op: &'static str| {
            move |source: io::Error| RegionError::Io {
                path: path.to_path_buf(),
                op,
                source,
            }
        };
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
            Err(e) => return Err(io_err("open")(e)),
        };
        let meta = file.metadata().map_err(io_err("fstat"))?;
        if !meta.file_type().is_file() || meta.len() != vgpu_region::SIZE as u64 {
            return Ok(None);
        }
        // SAFETY: maps exactly SIZE bytes of a regular file we just checked
        // is that long; the result is checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                vgpu_region::SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io_err("mmap")(io::Error::last_os_error()));
        }
        let Some(base) = NonNull::new(ptr.cast::<u8>()) else {
            return Err(io_err("mmap")(io::Error::other("null mapping")));
        };
        let region = MappedRegion {
            base,
            file,
            path: path.to_path_buf(),
            dev_ino: (meta.dev(), meta.ino()),
        };
        if !region.intact() {
            return Ok(None);
        }
        let header_ok = region
            .u64_at(vgpu_region::HEADER_MAGIC)
            .load(Ordering::Acquire)
            == vgpu_region::MAGIC
            && region
                .u32_at(vgpu_region::HEADER_VERSION)
                .load(Ordering::Relaxed)
                == vgpu_region::LAYOUT_VERSION
            && region
                .u64_at(vgpu_region::HEADER_LAYOUT_SIZE)
                .load(Ordering::Relaxed)
                == vgpu_region::SIZE as u64;
        Ok(header_ok.then_some(region))
    }

    /// Device and inode of the file mapped (a replaced file has others).
    pub fn dev_ino(&self) -> (u64, u64) {
        self.dev_ino
    }

    /// Whether the file still has its full size: checked before every pass
    /// of accesses (a shorter file would make them fault).
    pub fn intact(&self) -> bool {
        self.file
            .metadata()
            .is_ok_and(|m| m.len() >= vgpu_region::SIZE as u64)
    }

    /// The device entry holding `uuid`'s counters, if the library claimed
    /// one (the plugin never claims entries).
    pub fn device_index(&self, uuid: &str) -> Option<usize> {
        let hash = vgpu_region::uuid_hash(uuid)?;
        (0..vgpu_region::MAX_DEVICES).find(|&i| {
            self.u64_at(vgpu_region::device_offset(i) + vgpu_region::DEVICE_UUID_HASH)
                .load(Ordering::Acquire)
                == hash
        })
    }

    /// Bytes the container's library has charged on device entry `index`.
    pub fn used(&self, index: usize) -> u64 {
        if index >= vgpu_region::MAX_DEVICES {
            return 0;
        }
        self.u64_at(vgpu_region::device_offset(index) + vgpu_region::DEVICE_USED)
            .load(Ordering::Relaxed)
    }

    /// Publishes `figure` into device entry `index`: the figures first, the
    /// stamp last (release), as `vgpu_region` documents.
    pub fn publish(&self, index: usize, figure: &Published) {
        if index >= vgpu_region::MAX_DEVICES {
            return;
        }
        let entry = vgpu_region::device_offset(index);
        self.u32_at(entry + vgpu_region::DEVICE_SM_PERMILLE)
            .store(figure.sm_permille, Ordering::Relaxed);
        self.u32_at(entry + vgpu_region::DEVICE_PROCESSES)
            .store(figure.processes, Ordering::Relaxed);
        self.u64_at(entry + vgpu_region::DEVICE_NVML_USED)
            .store(figure.nvml_used, Ordering::Relaxed);
        self.u64_at(entry + vgpu_region::DEVICE_PUBLISHED_MS)
            .store(figure.at_ms, Ordering::Release);
    }

    /// What device entry `index` holds as published.
    #[cfg(test)]
    pub fn published(&self, index: usize) -> Published {
        if index >= vgpu_region::MAX_DEVICES {
            return Published::default();
        }
        let entry = vgpu_region::device_offset(index);
        let at_ms = self
            .u64_at(entry + vgpu_region::DEVICE_PUBLISHED_MS)
            .load(Ordering::Acquire);
        Published {
            sm_permille: self
                .u32_at(entry + vgpu_region::DEVICE_SM_PERMILLE)
                .load(Ordering::Relaxed),
            processes: self
                .u32_at(entry + vgpu_region::DEVICE_PROCESSES)
                .load(Ordering::Relaxed),
            at_ms,
            nvml_used: self
                .u64_at(entry + vgpu_region::DEVICE_NVML_USED)
                .load(Ordering::Relaxed),
        }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        assert!(offset.is_multiple_of(8) && offset + 8 <= vgpu_region::SIZE);
        // SAFETY: offset is 8-aligned and inside the SIZE-byte mapping (the
        // mapping is page-aligned), which lives as long as `self`; the bytes
        // are only ever accessed atomically, by every party.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        assert!(offset.is_multiple_of(4) && offset + 4 <= vgpu_region::SIZE);
        // SAFETY: as for u64_at, 4-aligned.
        unsafe { &*self.base.as_ptr().add(offset).cast::<AtomicU32>() }
    }
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `open`; no reference
        // into it outlives `self`.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), vgpu_region::SIZE);
        }
    }
}

/// `CLOCK_MONOTONIC` now, in milliseconds (never 0): the stamp's clock.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ((ts.tv_sec as u64).saturating_mul(1000) + (ts.tv_nsec as u64) / 1_000_000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full-size region as the library leaves it: header, one device claimed.
    fn library_region(path: &Path, uuid: &str) {
        let mut bytes = vec![0u8; vgpu_region::SIZE];
        bytes[..8].copy_from_slice(&vgpu_region::MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&vgpu_region::LAYOUT_VERSION.to_le_bytes());
        bytes[16..24].copy_from_slice(&(vgpu_region::SIZE as u64).to_le_bytes());
        let entry = vgpu_region::device_offset(3);
        let hash = vgpu_region::uuid_hash(uuid).expect("uuid");
        bytes[entry..entry + 8].copy_from_slice(&hash.to_le_bytes());
        bytes[entry + 8..entry + 16].copy_from_slice(&4096u64.to_le_bytes());
        std::fs::write(path, bytes).expect("write region");
    }

    #[test]
    fn publishes_at_the_models_offsets() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("vgpu.accounting");
        library_region(&path, "GPU-abc");
        let region = MappedRegion::open(&path).expect("open").expect("ours");
        assert_eq!(region.device_index("gpu-ABC"), Some(3));
        assert_eq!(region.device_index("GPU-other"), None);
        assert_eq!(region.used(3), 4096);
        let figure = Published {
            sm_permille: 301,
            processes: 2,
            at_ms: 1234,
            nvml_used: 1 << 30,
        };
        region.publish(3, &figure);
        assert_eq!(region.published(3), figure);
        drop(region);
        let bytes = std::fs::read(&path).expect("read");
        let entry = vgpu_region::device_offset(3);
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8"));
        assert_eq!(u32_at(entry + vgpu_region::DEVICE_SM_PERMILLE), 301);
        assert_eq!(u64_at(entry + vgpu_region::DEVICE_PUBLISHED_MS), 1234);
        assert_eq!(u64_at(entry + vgpu_region::DEVICE_NVML_USED), 1 << 30);
    }

    #[test]
    fn leaves_uninitialized_and_foreign_files_alone() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("vgpu.accounting");
        assert!(MappedRegion::open(&path).expect("missing").is_none());
        std::fs::write(&path, b"").expect("empty");
        assert!(MappedRegion::open(&path).expect("empty").is_none());
        std::fs::write(&path, vec![0u8; vgpu_region::SIZE]).expect("zeros");
        assert!(MappedRegion::open(&path).expect("zeros").is_none());
        assert_eq!(
            std::fs::metadata(&path).expect("stat").len(),
            vgpu_region::SIZE as u64
        );
        assert!(
            std::fs::read(&path).expect("read").iter().all(|&b| b == 0),
            "nothing written"
        );
        let mut bytes = vec![0u8; vgpu_region::SIZE];
        bytes[..8].copy_from_slice(&vgpu_region::MAGIC.to_le_bytes());
        bytes[8..12].copy_from_slice(&99u32.to_le_bytes());
        std::fs::write(&path, bytes).expect("other version");
        assert!(MappedRegion::open(&path).expect("version").is_none());
    }

    #[test]
    fn the_clock_moves_and_is_never_zero() {
        let a = monotonic_ms();
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(monotonic_ms() > a && a > 0);
    }
}
