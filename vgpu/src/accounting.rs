//! One GPU memory budget per container, shared by all its processes.
//!
//! The budget lives in a file in the accounting directory (`vgpu.accounting`
//! in `/var/run/tessera/`), mapped `MAP_SHARED` by every process that uses
//! CUDA. Its layout is fixed (`#[repr(C)]`, atomics only; [`layout`] gives the
//! offsets for tools):
//!
//! ```text
//! header      64 B         magic "TSSRVGPU", layout version 2, sizes
//! devices     16 × 64 B    per device: uuid hash, used bytes of the whole container
//! slots     1024 × 192 B   per process: pid, start time, pid namespace, used bytes per device
//! ```
//!
//! # No lock anyone can hold
//!
//! Nothing here waits for another process. Readers of the file (any process
//! that can open it) can take `flock`s and byte-range locks on it; a design
//! that waited on such a lock would let any reader stall or split the budget.
//!
//! - [`SharedRegion::try_charge`] is one compare-and-swap on the device total
//!   (the total never exceeds the limit, whatever the number of processes and
//!   threads), then an add to the process's own slot.
//! - [`SharedRegion::uncharge`] takes from the slot first, then the same
//!   amount from the total; both saturate, and a process never takes away
//!   more than it charged, so a double free cannot erase others' usage.
//! - **A slot belongs to whoever holds the open-file-description lock
//!   (`F_OFD_SETLK`, write lock) on the slot's first byte.** The kernel drops
//!   that lock when the process exits or `exec`s (the descriptor is
//!   close-on-exec), however it ends and in whatever pid namespace it ran: a
//!   container restart gets its dead processes' memory back, and pid reuse
//!   means nothing. Claiming a slot and testing an owner for life are the same
//!   non-blocking call: it succeeds only when no live process holds the slot.
//!   A process that holds a read lock on a slot's byte makes that slot look
//!   alive — which over-counts (refuses memory), never under-counts.
//! - Initialization is idempotent (constant header fields, the magic written
//!   last), and device UUIDs are claimed by one compare-and-swap of a 64-bit
//!   hash, so two processes starting at once need no lock either.
//! - After `fork` the child holds the parent's open file description (its
//!   descriptor and its mapping both reference it), and so the parent's slot
//!   lock: a `pthread_atfork` handler gives the child a description of its
//!   own (reopened through `/proc/self/fd`, mapped over the old mapping and
//!   `dup3`ed over the inherited number) so the parent's slot dies with the
//!   parent, and the first charge in the child claims a slot of its own.
//!
//! Order of updates, chosen so that a process dying between two steps leaves
//! the container over-counted (safe), never under-counted: charge adds to the
//! total before the slot; uncharge takes from the slot before the total.
//!
//! # Who makes the file
//!
//! The library never creates the file, and never replaces one: the node side
//! does (`tessera-hook` makes `accounting/vgpu.accounting`, mode 0666, in a
//! root-owned 0755 directory, so the workload can use it but not unlink or
//! replace it). An empty or zero-filled file is initialized by its first user.
//! A missing file, a directory that group or others may write, or a file that
//! is not this layout is an error, and the library then fails closed.
//!
//! Trust: the file is writable by the container's processes, by design (any
//! uid in the container shares the budget). A process that writes it directly
//! can corrupt its own container's accounting or truncate the file (which
//! makes the others fault); it cannot reach other containers.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Devices one region accounts for.
pub const MAX_DEVICES: usize = 16;

/// Processes one region can register at once.
pub const MAX_PROCESSES: usize = 1024;

/// The layout version this library reads and writes.
pub const LAYOUT_VERSION: u32 = 2;

/// First 8 bytes of a region file ("TSSRVGPU", little-endian).
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSSRVGPU");

/// Longest device UUID [`SharedRegion::device_index`] accepts (after its prefix).
pub const MAX_UUID_BYTES: usize = 64;

const NO_SLOT: u32 = u32::MAX;

// ---------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------

#[repr(C, align(64))]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    header_size: AtomicU32,
    layout_size: AtomicU64,
    max_devices: AtomicU32,
    max_processes: AtomicU32,
    /// Highest device count any process opened the region with.
    device_count: AtomicU32,
}

#[repr(C, align(64))]
struct Device {
    /// Hash of the device's UUID (never 0 once claimed), 0 while free.
    uuid_hash: AtomicU64,
    /// Bytes in use by the whole container.
    used: AtomicU64,
}

#[repr(C, align(64))]
struct Slot {
    /// The owner's pid in its own pid namespace (informational: liveness is
    /// the slot lock, never this number).
    pid: AtomicU32,
    _reserved: AtomicU32,
    /// `/proc/<pid>/stat` field 22 of the owner; 0 when unknown (informational).
    start_time: AtomicU64,
    /// Inode of the owner's `/proc/self/ns/pid`; 0 when unknown (informational).
    pid_ns: AtomicU64,
    _reserved2: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
struct Layout {
    header: Header,
    devices: [Device; MAX_DEVICES],
    slots: [Slot; MAX_PROCESSES],
}

/// Byte offsets of the region file, for tools that read it (metrics, tests).
/// All values are little-endian.
pub mod layout {
    use super::{Device, Header, Layout, MAX_DEVICES, MAX_PROCESSES, Slot};
    use std::mem::{offset_of, size_of};

    /// Size of the whole file.
    pub const SIZE: usize = size_of::<Layout>();
    /// Offset of the header's `version` (u32).
    pub const VERSION: usize = offset_of!(Header, version);
    /// Offset of the header's `layout_size` (u64).
    pub const LAYOUT_SIZE: usize = offset_of!(Header, layout_size);
    /// Offset of the first device entry.
    pub const DEVICES: usize = offset_of!(Layout, devices);
    /// Stride of the device entries.
    pub const DEVICE_SIZE: usize = size_of::<Device>();
    /// Offset of `uuid_hash` (u64) in a device entry.
    pub const DEVICE_UUID_HASH: usize = offset_of!(Device, uuid_hash);
    /// Offset of `used` (u64, the container's total) in a device entry.
    pub const DEVICE_USED: usize = offset_of!(Device, used);
    /// Offset of the first process slot.
    pub const SLOTS: usize = offset_of!(Layout, slots);
    /// Size of one process slot; the slot's lock is on its first byte.
    pub const SLOT_SIZE: usize = size_of::<Slot>();
    /// Offset of `pid` (u32) in a slot.
    pub const SLOT_PID: usize = offset_of!(Slot, pid);
    /// Offset of `start_time` (u64) in a slot.
    pub const SLOT_START_TIME: usize = offset_of!(Slot, start_time);
    /// Offset of `pid_ns` (u64) in a slot.
    pub const SLOT_PID_NS: usize = offset_of!(Slot, pid_ns);
    /// Offset of `used` (u64 × [`MAX_DEVICES`]) in a slot.
    pub const SLOT_USED: usize = offset_of!(Slot, used);

    const _: () = assert!(SIZE == 64 + 16 * 64 + 1024 * 192);
    const _: () = assert!(SLOTS + MAX_PROCESSES * SLOT_SIZE == SIZE);
    const _: () = assert!(SLOT_USED + MAX_DEVICES * 8 <= SLOT_SIZE);
    const _: () = assert!(DEVICES + MAX_DEVICES * DEVICE_SIZE == SLOTS);
}

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// Why a region could not be opened or a device named; one line.
#[derive(Debug)]
pub enum AccountingError {
    /// A system call on the region file failed.
    Io {
        /// The region file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The failure.
        source: io::Error,
    },
    /// The file does not exist: the node side creates it, the library never does.
    Missing {
        /// The region file.
        path: PathBuf,
    },
    /// The directory holding the file may be written by group or others, so
    /// a workload could unlink or replace the file and split the budget.
    UnsafeDirectory {
        /// The directory.
        dir: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// The file is not a Tessera region (wrong magic or shape); it was left untouched.
    NotOurs {
        /// The file.
        path: PathBuf,
        /// What did not match.
        reason: String,
    },
    /// The file is a Tessera region of another layout version; left untouched.
    VersionMismatch {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u32,
    },
    /// The file has this version's magic and version but another size.
    LayoutMismatch {
        /// The file.
        path: PathBuf,
        /// What did not match.
        reason: String,
    },
    /// More devices than a region accounts for.
    TooManyDevices {
        /// The file.
        path: PathBuf,
        /// How many were asked for.
        requested: usize,
    },
    /// A device UUID that cannot be recorded.
    BadUuid {
        /// The UUID.
        uuid: String,
    },
}

impl fmt::Display for AccountingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AccountingError::Io { path, op, source } => {
                write!(f, "{}: {op}: {source}", path.display())
            }
            AccountingError::Missing { path } => write!(
                f,
                "{}: accounting file does not exist (the node side creates it; the library never does)",
                path.display()
            ),
            AccountingError::UnsafeDirectory { dir, mode } => write!(
                f,
                "{}: accounting directory has mode {mode:04o}: group or others could unlink or replace the accounting file",
                dir.display()
            ),
            AccountingError::NotOurs { path, reason } => write!(
                f,
                "{}: not a Tessera accounting file ({reason}); left untouched",
                path.display()
            ),
            AccountingError::VersionMismatch { path, found } => write!(
                f,
                "{}: accounting layout version {found}, this library uses {LAYOUT_VERSION}; left untouched",
                path.display()
            ),
            AccountingError::LayoutMismatch { path, reason } => write!(
                f,
                "{}: accounting layout does not match ({reason}); left untouched",
                path.display()
            ),
            AccountingError::TooManyDevices { path, requested } => write!(
                f,
                "{}: {requested} devices, a region accounts for at most {MAX_DEVICES}",
                path.display()
            ),
            AccountingError::BadUuid { uuid } => write!(
                f,
                "device UUID {:?}: empty or longer than {MAX_UUID_BYTES} bytes",
                uuid.chars().take(80).collect::<String>()
            ),
        }
    }
}

impl std::error::Error for AccountingError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AccountingError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// Fork tracking and process identity
// ---------------------------------------------------------------------------

/// Bumped in the child of every `fork` (pthread_atfork): a handle whose
/// registration generation differs registers anew before its next charge.
static FORK_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Descriptors of the open regions, for the fork handler (-1: unused entry).
static REGION_FDS: [AtomicI32; 8] = [const { AtomicI32::new(-1) }; 8];
/// Addresses of their mappings, entry for entry.
static REGION_MAPS: [AtomicUsize; 8] = [const { AtomicUsize::new(0) }; 8];

extern "C" fn on_fork_child() {
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
    for (fd, map) in REGION_FDS.iter().zip(&REGION_MAPS) {
        let fd = fd.load(Ordering::Relaxed);
        if fd >= 0 {
            give_child_its_own_description(fd, map.load(Ordering::Relaxed));
        }
    }
}

/// Gives a forked child a file description of its own for the region: the
/// inherited descriptor `fd` and the inherited mapping at `map` both
/// reference the parent's open file description, and so keep the parent's
/// slot lock alive after the parent dies. The file is opened anew (through
/// `/proc/self/fd`), mapped over the old mapping at the same address (same
/// file, same contents: every pointer stays valid), and put under the same
/// descriptor number. Async-signal-safe system calls only, no allocation.
/// Without `/proc` the inherited descriptor is closed (the mapping stays,
/// and with it the parent's lock until the child exits or `exec`s).
fn give_child_its_own_description(fd: i32, map: usize) {
    let mut path = *b"/proc/self/fd/\0\0\0\0\0\0\0\0\0\0\0\0";
    let mut digits = [0u8; 10];
    let mut n = fd as u32;
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        path[14 + i] = digits[len - 1 - i];
    }
    // SAFETY: `path` is NUL-terminated (zero-filled past the digits, at most
    // 10 of 12 spare bytes used); open, mmap, dup3 and close are plain system
    // calls, valid in a forked child, and touch only this library's
    // descriptors and its own mapping (`map`, layout::SIZE bytes, replaced
    // in place by a mapping of the same file).
    unsafe {
        let fresh = libc::open(
            path.as_ptr().cast(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOCTTY,
        );
        if fresh >= 0 {
            if map != 0 {
                libc::mmap(
                    map as *mut libc::c_void,
                    layout::SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fresh,
                    0,
                );
            }
            libc::dup3(fresh, fd, libc::O_CLOEXEC);
            libc::close(fresh);
        } else {
            libc::close(fd);
        }
    }
}

fn install_fork_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no captured
        // state; it does only atomics and plain system calls (open, mmap,
        // dup3, close), valid in the single-threaded child. The library is never
        // unloaded (ld.so.preload), so the function outlives the registration.
        unsafe {
            libc::pthread_atfork(None, None, Some(on_fork_child));
        }
    });
}

fn current_pid() -> u32 {
    std::process::id()
}

fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// Start time (field 22) from `/proc/self/stat`; 0 when unknown.
fn own_start_time() -> u64 {
    std::fs::read("/proc/self/stat")
        .ok()
        .and_then(|text| parse_stat(&text))
        .map_or(0, |(_, start)| start)
}

/// Parses a `/proc/<pid>/stat` line into state (field 3) and start time
/// (field 22); the command name (field 2) may contain spaces and
/// parentheses, so fields are counted after its last `)`.
fn parse_stat(text: &[u8]) -> Option<(u8, u64)> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // fields 4..=21 (18 of them) lie between state and start time.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

// ---------------------------------------------------------------------------
// Slot locks
// ---------------------------------------------------------------------------

/// The byte whose lock owns slot `index`.
fn slot_offset(index: usize) -> i64 {
    (layout::SLOTS + index * layout::SLOT_SIZE) as i64
}

/// Takes (`F_WRLCK`) or drops (`F_UNLCK`) the OFD lock on slot `index`'s
/// byte, never waiting; `false` when another open file description holds a
/// conflicting lock (or the call failed).
fn slot_lock(fd: i32, index: usize, kind: i32) -> bool {
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = kind as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    lock.l_start = slot_offset(index);
    lock.l_len = 1;
    loop {
        // SAFETY: fcntl on a descriptor this region owns, with a pointer to
        // a live, initialized flock (l_pid 0, as OFD locks require).
        let rc = unsafe { libc::fcntl(fd, libc::F_OFD_SETLK, &mut lock) };
        if rc == 0 {
            return true;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return false;
        }
    }
}

fn open_existing(path: &CString) -> io::Result<OwnedFd> {
    loop {
        // SAFETY: `path` is a valid NUL-terminated string; the flags create nothing.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NOCTTY,
            )
        };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by open and is owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Creates an empty region file at `path`, mode 0666 whatever the umask, for
/// the node side and tests (the library itself never creates one). An
/// existing file is left alone.
pub fn create_file(path: &Path) -> Result<(), AccountingError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let io_err = |op: &'static str| {
        move |source: io::Error| AccountingError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    };
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o666)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(file) => file
            .set_permissions(std::fs::Permissions::from_mode(0o666))
            .map_err(io_err("chmod")),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io_err("create")(e)),
    }
}

/// The directory holding the region must not let group or others replace
/// entries (unless sticky, where only owners may).
fn check_directory(path: &Path) -> Result<(), AccountingError> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let meta = std::fs::metadata(dir).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            AccountingError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            AccountingError::Io {
                path: dir.to_path_buf(),
                op: "stat",
                source,
            }
        }
    })?;
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(AccountingError::UnsafeDirectory {
            dir: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

fn pread_exact(fd: &OwnedFd, buf: &mut [u8], offset: usize) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: writes at most `buf.len() - done` bytes into the live buffer slice.
        let n = unsafe {
            libc::pread(
                fd.as_raw_fd(),
                buf[done..].as_mut_ptr().cast(),
                buf.len() - done,
                (offset + done) as libc::off_t,
            )
        };
        match n {
            0 => break,
            n if n > 0 => done += n as usize,
            _ => {
                let err = io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EINTR) {
                    return Err(err);
                }
            }
        }
    }
    Ok(done)
}

// ---------------------------------------------------------------------------
// The region
// ---------------------------------------------------------------------------

/// The container's shared GPU memory budget, mapped into this process.
///
/// Open once per process (and keep it for the process's lifetime); all
/// methods take `&self` and are safe to call from any thread.
pub struct SharedRegion {
    layout: NonNull<Layout>,
    path: PathBuf,
    /// The region's descriptor: slot locks are held on its open file
    /// description. Kept open for the handle's life; in a forked child the
    /// fork handler has put a fresh description under the same number.
    fd: OwnedFd,
    /// Entry in `REGION_FDS`, if one was free.
    fd_entry: Option<usize>,
    /// This process's slot, or `NO_SLOT` (every slot held by a live process).
    slot: AtomicU32,
    /// `generation << 1` when registered for that fork generation; `| 1` while registering.
    reg_state: AtomicU64,
    /// The pid the slot was registered for.
    registered_pid: AtomicU32,
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

    fn layout(&self) -> &Layout {
        // SAFETY: the mapping is layout::SIZE bytes, page-aligned (so aligned
        // for Layout), lives until drop, and holds only atomics, so a shared
        // reference is sound even while other processes write it.
        unsafe { self.layout.as_ref() }
    }

    /// The region file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Charges `bytes` to `device` if the container's total stays within
    /// `limit`; `false` (and nothing charged) otherwise, or for a device index
    /// out of range. Lock-free; never lets the total exceed `limit`, whatever
    /// other processes and threads do at the same time.
    #[inline]
    pub fn try_charge(&self, device: usize, bytes: u64, limit: u64) -> bool {
        let layout = self.layout();
        let Some(total) = layout.devices.get(device) else {
            return false;
        };
        let slot = self.current_slot();
        let mut current = total.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = current.checked_add(bytes) else {
                return false;
            };
            if next > limit {
                return false;
            }
            match total.used.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(seen) => current = seen,
            }
        }
        if let Some(slot) = slot {
            slot.used[device].fetch_add(bytes, Ordering::Relaxed);
        }
        true
    }

    /// Charges `bytes` to `device` whatever the limit: memory the driver
    /// already holds (a context's own memory, a pool that grew by more than
    /// asked). The total may end above the limit; later charges are refused
    /// until it is back below.
    pub fn force_charge(&self, device: usize, bytes: u64) {
        let Some(total) = self.layout().devices.get(device) else {
            return;
        };
        let slot = self.current_slot();
        let _ = total
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_add(bytes))
            });
        if let Some(slot) = slot {
            slot.used[device].fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Returns `bytes` of `device`: takes them from this process's slot, then
    /// the same amount from the total, both saturating. More than this
    /// process charged is capped at what it charged, so the counters never
    /// underflow and other processes' usage is never erased.
    #[inline]
    pub fn uncharge(&self, device: usize, bytes: u64) {
        let layout = self.layout();
        let Some(total) = layout.devices.get(device) else {
            return;
        };
        let removed = match self.current_slot() {
            Some(slot) => {
                let before = saturating_sub(&slot.used[device], bytes);
                before.min(bytes)
            }
            // Without a slot there is no record to cap by; the total still saturates.
            None => bytes,
        };
        if removed != 0 {
            saturating_sub(&total.used, removed);
        }
    }

    /// Bytes in use on `device` by the whole container (0 for an index out of range).
    #[inline]
    pub fn used(&self, device: usize) -> u64 {
        self.layout()
            .devices
            .get(device)
            .map_or(0, |t| t.used.load(Ordering::Relaxed))
    }

    /// Bytes this process has charged on `device`.
    pub fn process_used(&self, device: usize) -> u64 {
        match (self.current_slot(), device < MAX_DEVICES) {
            (Some(slot), true) => slot.used[device].load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// Whether this process holds a slot (it does unless all
    /// [`MAX_PROCESSES`] are held by live processes; without one, its usage
    /// cannot be reclaimed if it dies).
    pub fn has_slot(&self) -> bool {
        self.current_slot().is_some()
    }

    /// Pids of the processes registered in the region (each in its own pid
    /// namespace), read from the mapping: no file I/O.
    pub fn registered_pids(&self) -> Vec<u32> {
        self.layout()
            .slots
            .iter()
            .map(|s| s.pid.load(Ordering::Acquire))
            .filter(|&pid| pid != 0)
            .collect()
    }

    /// Processes registered in the region.
    pub fn registered_processes(&self) -> usize {
        self.layout()
            .slots
            .iter()
            .filter(|s| s.pid.load(Ordering::Relaxed) != 0)
            .count()
    }

    /// Returns the usage of processes that are gone (their slot lock is
    /// free: they exited, were killed, or `exec`ed, in any pid namespace),
    /// frees their slots, and reports the bytes returned.
    ///
    /// Lock-free and non-blocking: one `fcntl` per occupied slot. Call it
    /// when a charge fails, then retry the charge once.
    pub fn reclaim_dead(&self) -> u64 {
        let own = self.slot.load(Ordering::Relaxed) as usize;
        let fd = self.fd.as_raw_fd();
        let mut reclaimed = 0u64;
        for (index, slot) in self.layout().slots.iter().enumerate() {
            if index == own || !slot_in_use(slot) {
                continue;
            }
            if slot_lock(fd, index, libc::F_WRLCK) {
                reclaimed = reclaimed.saturating_add(self.empty_slot(slot));
                slot_lock(fd, index, libc::F_UNLCK);
            }
        }
        reclaimed
    }

    /// Registers this process anew if it is a forked child of the process
    /// that registered (cheap when nothing changed). `try_charge` and
    /// `uncharge` do this by themselves after a `fork()`; call it after a
    /// raw `clone` or `_Fork`, which skip `pthread_atfork` handlers.
    pub fn reregister_after_fork(&self) {
        if self.registered_pid.load(Ordering::Relaxed) != current_pid() {
            give_child_its_own_description(self.fd.as_raw_fd(), self.layout.as_ptr() as usize);
            FORK_GENERATION.fetch_add(1, Ordering::AcqRel);
        }
        let _ = self.current_slot();
    }

    /// The region's index for the device with this UUID (`GPU-…`/`MIG-…`;
    /// prefix and case do not matter), recording it on first use with one
    /// compare-and-swap.
    ///
    /// Charge with this index rather than the CUDA ordinal when processes may
    /// see devices in different orders (`CUDA_VISIBLE_DEVICES`): the same GPU
    /// then shares one total in every process. Resolve once per device.
    pub fn device_index(&self, uuid: &str) -> Result<usize, AccountingError> {
        let hash = uuid_hash(uuid).ok_or_else(|| AccountingError::BadUuid {
            uuid: uuid.to_string(),
        })?;
        for (index, device) in self.layout().devices.iter().enumerate() {
            match device
                .uuid_hash
                .compare_exchange(0, hash, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Ok(index),
                Err(seen) if seen == hash => return Ok(index),
                Err(_) => {}
            }
        }
        Err(AccountingError::TooManyDevices {
            path: self.path.clone(),
            requested: MAX_DEVICES + 1,
        })
    }

    /// This process's slot for the current fork generation, registering
    /// first if this is a forked child.
    #[inline]
    fn current_slot(&self) -> Option<&Slot> {
        let generation = FORK_GENERATION.load(Ordering::Relaxed);
        if self.reg_state.load(Ordering::Acquire) != generation << 1 {
            self.register_slow();
        }
        self.layout()
            .slots
            .get(self.slot.load(Ordering::Relaxed) as usize)
    }

    #[cold]
    #[inline(never)]
    fn register_slow(&self) {
        loop {
            let generation = FORK_GENERATION.load(Ordering::Acquire);
            let state = self.reg_state.load(Ordering::Acquire);
            if state == generation << 1 {
                return;
            }
            if state == (generation << 1) | 1 {
                // Another thread of this process is registering.
                std::thread::yield_now();
                continue;
            }
            // Stale (an older generation, even one caught mid-registration by
            // the fork): claim the registration for this generation.
            if self
                .reg_state
                .compare_exchange(
                    state,
                    (generation << 1) | 1,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.slot.store(NO_SLOT, Ordering::Relaxed);
                let slot = self.claim_slot();
                self.slot.store(slot, Ordering::Relaxed);
                self.reg_state.store(generation << 1, Ordering::Release);
                return;
            }
        }
    }

    /// Claims a slot no live process holds: free ones first, then those of
    /// dead processes (whose usage is returned first). `NO_SLOT` when every
    /// slot is held.
    fn claim_slot(&self) -> u32 {
        let pid = current_pid();
        self.registered_pid.store(pid, Ordering::Relaxed);
        let fd = self.fd.as_raw_fd();
        let slots = &self.layout().slots;
        for free_only in [true, false] {
            for (index, slot) in slots.iter().enumerate() {
                if free_only == slot_in_use(slot) {
                    continue;
                }
                if !slot_lock(fd, index, libc::F_WRLCK) {
                    continue;
                }
                self.empty_slot(slot);
                slot.start_time.store(own_start_time(), Ordering::Relaxed);
                slot.pid_ns.store(pid_namespace(), Ordering::Relaxed);
                slot.pid.store(pid, Ordering::Release);
                return index as u32;
            }
        }
        NO_SLOT
    }

    /// Moves a slot's usage out of the totals and clears it; the caller
    /// holds the slot's lock. Returns the bytes.
    fn empty_slot(&self, slot: &Slot) -> u64 {
        let devices = &self.layout().devices;
        let mut freed = 0u64;
        for (used, total) in slot.used.iter().zip(devices) {
            let bytes = used.swap(0, Ordering::Relaxed);
            if bytes != 0 {
                saturating_sub(&total.used, bytes);
                freed = freed.saturating_add(bytes);
            }
        }
        slot.start_time.store(0, Ordering::Relaxed);
        slot.pid_ns.store(0, Ordering::Relaxed);
        slot.pid.store(0, Ordering::Release);
        freed
    }
}

fn slot_in_use(slot: &Slot) -> bool {
    slot.pid.load(Ordering::Acquire) != 0
        || slot.used.iter().any(|u| u.load(Ordering::Relaxed) != 0)
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

/// Subtracts `bytes`, stopping at 0; returns the value before.
#[inline]
fn saturating_sub(counter: &AtomicU64, bytes: u64) -> u64 {
    match counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(bytes))
    }) {
        Ok(before) | Err(before) => before,
    }
}

/// The 64-bit key a UUID is stored under: FNV-1a of its lowercase body
/// (without `GPU-`/`MIG-`), never 0.
fn uuid_hash(uuid: &str) -> Option<u64> {
    let body = match uuid.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("GPU-") || p.eq_ignore_ascii_case("MIG-") => &uuid[4..],
        _ => uuid,
    };
    if body.is_empty() || body.len() > MAX_UUID_BYTES {
        return None;
    }
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for b in body.bytes() {
        hash ^= u64::from(b.to_ascii_lowercase());
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    Some(hash.max(1))
}

/// Checks an existing file; `Ok(true)` when it is empty (or a zero-filled
/// leftover of an interrupted creation) and must be extended to full size.
fn check_existing(path: &Path, fd: &OwnedFd, size: u64) -> Result<bool, AccountingError> {
    if size == 0 {
        return Ok(true);
    }
    let not_ours = |reason: String| AccountingError::NotOurs {
        path: path.to_path_buf(),
        reason,
    };
    let read_err = |source| AccountingError::Io {
        path: path.to_path_buf(),
        op: "read",
        source,
    };
    let mut header = [0u8; 64];
    let got = pread_exact(fd, &mut header, 0).map_err(read_err)?;
    let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |o: usize| u32::from_le_bytes(header[o..o + 4].try_into().unwrap_or([0; 4]));
    let magic = u64_at(0);
    if magic == 0 && size < layout::SIZE as u64 {
        // An interrupted creation leaves zeros only; anything else is not ours.
        let mut all = vec![0u8; size as usize];
        let got = pread_exact(fd, &mut all, 0).map_err(read_err)?;
        if got as u64 == size && all.iter().all(|&b| b == 0) {
            return Ok(true);
        }
        return Err(not_ours("no magic, not empty".to_string()));
    }
    if magic == 0 && size == layout::SIZE as u64 {
        // Zero-filled at full size (or being initialized by another process
        // right now): `initialize` decides through the mapping.
        return Ok(false);
    }
    if got < header.len() || magic != MAGIC {
        return Err(not_ours(format!("magic {magic:#018x}")));
    }
    let version = u32_at(layout::VERSION);
    if version != LAYOUT_VERSION {
        return Err(AccountingError::VersionMismatch {
            path: path.to_path_buf(),
            found: version,
        });
    }
    let recorded = u64_at(layout::LAYOUT_SIZE);
    if recorded != layout::SIZE as u64 || size != layout::SIZE as u64 {
        return Err(AccountingError::LayoutMismatch {
            path: path.to_path_buf(),
            reason: format!(
                "header says {recorded} bytes, file has {size}, expected {}",
                layout::SIZE
            ),
        });
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty region file in a directory removed when the guard drops.
    fn temp_path(name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(name);
        create_file(&path).expect("create region file");
        (dir, path)
    }

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let line =
            b"4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some((b'S', 987654)));
        assert_eq!(parse_stat(b"1 (x) Z 0"), None, "too short");
        assert_eq!(parse_stat(b"garbage"), None);
        assert!(own_start_time() > 0, "own /proc/self/stat");
    }

    #[test]
    fn uuid_hashes_ignore_prefix_and_case() {
        assert_eq!(uuid_hash("GPU-ABCdef"), uuid_hash("mig-abcDEF"));
        assert_ne!(uuid_hash("GPU-abc"), uuid_hash("GPU-abd"));
        assert_eq!(uuid_hash("GPU-"), None);
        assert_eq!(uuid_hash(&"a".repeat(65)), None);
        assert!(uuid_hash("GPU-x").is_some_and(|h| h != 0));
    }

    #[test]
    fn charge_stops_at_the_limit_and_uncharge_saturates() {
        let (_dir, path) = temp_path("limit");
        let region = SharedRegion::open(&path, 2).expect("open");
        assert!(region.try_charge(0, 600, 1000));
        assert!(!region.try_charge(0, 401, 1000), "would exceed");
        assert!(region.try_charge(0, 400, 1000), "exactly at the limit");
        assert_eq!(region.used(0), 1000);
        assert_eq!(region.used(1), 0, "devices are separate");
        assert!(
            !region.try_charge(0, u64::MAX, u64::MAX),
            "overflow is refused"
        );
        region.uncharge(0, 5000);
        assert_eq!(region.used(0), 0);
        assert_eq!(region.process_used(0), 0);
        assert!(!region.try_charge(MAX_DEVICES, 1, u64::MAX), "out of range");
        region.uncharge(MAX_DEVICES, 1);
        assert_eq!(region.used(MAX_DEVICES), 0);
        region.force_charge(0, 1500);
        assert_eq!(region.used(0), 1500, "forced past the limit");
        assert!(!region.try_charge(0, 1, 1000), "over the limit: refused");
        region.uncharge(0, 1500);
        assert_eq!(region.used(0), 0);
    }

    #[test]
    fn a_slot_whose_lock_is_free_is_reclaimed_whatever_its_pid() {
        let (_dir, path) = temp_path("dead");
        let region = SharedRegion::open(&path, 1).expect("open");
        assert!(region.try_charge(0, 100, u64::MAX));
        // A slot naming our own (live) pid, but nobody holds its lock: a
        // process in another pid namespace that had our pid number and died
        // holding 700 bytes.
        let slots = &region.layout().slots;
        let stale = slots
            .iter()
            .find(|s| s.pid.load(Ordering::Relaxed) == 0)
            .expect("free slot");
        stale.used[0].store(700, Ordering::Relaxed);
        region.layout().devices[0]
            .used
            .fetch_add(700, Ordering::Relaxed);
        stale.pid.store(current_pid(), Ordering::Release);
        assert_eq!(region.used(0), 800);
        assert_eq!(region.reclaim_dead(), 700);
        assert_eq!(region.used(0), 100, "our own usage stays");
        assert_eq!(stale.pid.load(Ordering::Relaxed), 0, "slot freed");
        assert_eq!(region.reclaim_dead(), 0, "nothing left to reclaim");
    }

    #[test]
    fn a_live_handles_slot_is_never_reclaimed() {
        let (_dir, path) = temp_path("live");
        let one = SharedRegion::open(&path, 1).expect("open");
        let two = SharedRegion::open(&path, 1).expect("open");
        assert!(one.try_charge(0, 300, u64::MAX));
        assert_eq!(two.reclaim_dead(), 0, "one's lock is held");
        assert_eq!(two.used(0), 300);
        drop(one);
        assert_eq!(two.reclaim_dead(), 300, "one's descriptor closed");
        assert_eq!(two.used(0), 0);
    }

    #[test]
    fn device_index_is_stable_across_handles() {
        let (_dir, path) = temp_path("uuids");
        let a = SharedRegion::open(&path, 2).expect("open");
        let b = SharedRegion::open(&path, 2).expect("open");
        let x = a.device_index("GPU-aaaa").expect("index");
        let y = b.device_index("GPU-bbbb").expect("index");
        assert_ne!(x, y);
        assert_eq!(b.device_index("gpu-AAAA").expect("index"), x);
        assert_eq!(a.device_index("GPU-bbbb").expect("index"), y);
        assert!(a.device_index("").is_err());
        for i in 0..MAX_DEVICES - 2 {
            a.device_index(&format!("GPU-{i}")).expect("room");
        }
        assert!(matches!(
            a.device_index("GPU-one-too-many"),
            Err(AccountingError::TooManyDevices { .. })
        ));
    }

    #[test]
    fn dropping_an_empty_handle_frees_its_slot() {
        let (_dir, path) = temp_path("drop");
        let keep = SharedRegion::open(&path, 1).expect("open");
        let before = keep.registered_processes();
        let second = SharedRegion::open(&path, 1).expect("open");
        assert_eq!(keep.registered_processes(), before + 1);
        assert_eq!(
            keep.registered_pids(),
            vec![current_pid(); before + 1],
            "both handles are this process"
        );
        drop(second);
        assert_eq!(keep.registered_processes(), before);
    }

    #[test]
    fn the_library_never_creates_the_file_and_refuses_open_directories() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("vgpu.accounting");
        assert!(matches!(
            SharedRegion::open(&path, 1),
            Err(AccountingError::Missing { .. })
        ));
        assert!(!path.exists(), "nothing was created");
        create_file(&path).expect("create");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let err = SharedRegion::open(&path, 1).expect_err("world-writable directory");
        assert!(err.to_string().contains("mode 0777"), "{err}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
            .expect("chmod");
        SharedRegion::open(&path, 1).expect("sticky: only owners may unlink");
    }
}
