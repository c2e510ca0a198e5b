//! One GPU memory budget per container, shared by all its processes.
//!
//! The budget lives in a file in the accounting directory (`vgpu.accounting`
//! in `/var/run/tessera/`), mapped `MAP_SHARED` by every process that uses
//! CUDA. Its layout is fixed (`#[repr(C)]`, atomics only; [`layout`] gives the
//! offsets for tools):
//!
//! ```text
//! header      64 B   magic "TSSRVGPU", layout version, sizes, device and uuid counts
//! uuids       16 × 64 B   device UUIDs in the order processes first named them
//! totals      16 × 64 B   per device: used bytes of the whole container (one cache line each)
//! slots     1024 × 192 B  per process: pid, start time, pid namespace, image token,
//!                         used bytes per device
//! ```
//!
//! - [`SharedRegion::try_charge`] is one lock-free compare-and-swap on the
//!   device total — the total never exceeds the limit, whatever the number of
//!   processes and threads — then an add to the process's own slot.
//! - [`SharedRegion::uncharge`] takes from the slot first, then the same amount
//!   from the total; both saturate, and a process can never take away more
//!   than it charged, so a double free cannot erase other processes' usage.
//! - [`SharedRegion::reclaim_dead`] returns the usage of processes that died
//!   without freeing (`kill -9`), recognising pid reuse by the start time in
//!   `/proc/<pid>/stat`.
//! - The rare paths (create, attach, register, reclaim, new device UUID) take
//!   an `flock` on a fresh descriptor, with a timeout, so a stopped process
//!   holding it cannot hang the others; the lock dies with its holder.
//! - After `fork` the child charges into a slot of its own: a `pthread_atfork`
//!   handler bumps a generation counter, and the first charge in the child
//!   registers anew (two relaxed loads on the hot path).
//!
//! Order of updates, chosen so that a process dying between two steps leaves
//! the container over-counted (safe), never under-counted: charge adds to the
//! total before the slot; uncharge takes from the slot before the total.
//!
//! Trust: the file is writable by the container's processes — by design, so
//! that processes of any uid share one budget (it is created mode 0666 in the
//! per-allocation directory). A process that writes the file directly can
//! corrupt its own container's accounting (or truncate it, which makes the
//! others fault); it cannot reach other containers. Enforcement against a
//! hostile process is the node watchdog's job, not this file's.

use std::ffi::{CStr, CString};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Devices one region accounts for.
pub const MAX_DEVICES: usize = 16;

/// Processes one region can register at once.
pub const MAX_PROCESSES: usize = 1024;

/// The layout version this library reads and writes.
pub const LAYOUT_VERSION: u32 = 1;

/// First 8 bytes of a region file ("TSSRVGPU", little-endian).
pub const MAGIC: u64 = u64::from_le_bytes(*b"TSSRVGPU");

/// Longest device UUID [`SharedRegion::device_index`] accepts (after its prefix).
pub const MAX_UUID_BYTES: usize = 64;

/// How long `open` and `device_index` wait for the region lock.
const SETUP_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long `reclaim_dead` waits for the region lock before giving up (returns 0).
const RECLAIM_LOCK_TIMEOUT: Duration = Duration::from_millis(200);

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
    /// Entries of `uuids` in use.
    uuid_count: AtomicU32,
}

#[repr(C, align(64))]
struct DeviceUuid {
    bytes: [AtomicU64; MAX_UUID_BYTES / 8],
}

#[repr(C, align(64))]
struct DeviceTotal {
    used: AtomicU64,
}

#[repr(C, align(64))]
struct Slot {
    pid: AtomicU32,
    _reserved: AtomicU32,
    /// `/proc/<pid>/stat` field 22 (clock ticks after boot); 0 when unknown.
    start_time: AtomicU64,
    /// Inode of `/proc/self/ns/pid`; 0 when unknown.
    pid_ns: AtomicU64,
    /// Random per program image: tells an `exec`ed predecessor from a sibling handle.
    token: AtomicU64,
    used: [AtomicU64; MAX_DEVICES],
}

#[repr(C)]
struct Layout {
    header: Header,
    uuids: [DeviceUuid; MAX_DEVICES],
    totals: [DeviceTotal; MAX_DEVICES],
    slots: [Slot; MAX_PROCESSES],
}

/// Byte offsets of the region file, for tools that read it (metrics, tests).
/// All values are little-endian.
pub mod layout {
    use super::{DeviceTotal, DeviceUuid, Header, Layout, MAX_DEVICES, MAX_PROCESSES, Slot};
    use std::mem::{offset_of, size_of};

    /// Size of the whole file.
    pub const SIZE: usize = size_of::<Layout>();
    /// Offset of the header's `version` (u32).
    pub const VERSION: usize = offset_of!(Header, version);
    /// Offset of the header's `layout_size` (u64).
    pub const LAYOUT_SIZE: usize = offset_of!(Header, layout_size);
    /// Offset of the first device UUID (64 bytes each, zero-padded).
    pub const UUIDS: usize = offset_of!(Layout, uuids);
    /// Size of one device UUID entry.
    pub const UUID_SIZE: usize = size_of::<DeviceUuid>();
    /// Offset of the per-device totals (u64 each, one per [`TOTAL_SIZE`]).
    pub const TOTALS: usize = offset_of!(Layout, totals);
    /// Stride of the per-device totals.
    pub const TOTAL_SIZE: usize = size_of::<DeviceTotal>();
    /// Offset of the first process slot.
    pub const SLOTS: usize = offset_of!(Layout, slots);
    /// Size of one process slot.
    pub const SLOT_SIZE: usize = size_of::<Slot>();
    /// Offset of `pid` (u32) in a slot.
    pub const SLOT_PID: usize = offset_of!(Slot, pid);
    /// Offset of `start_time` (u64) in a slot.
    pub const SLOT_START_TIME: usize = offset_of!(Slot, start_time);
    /// Offset of `pid_ns` (u64) in a slot.
    pub const SLOT_PID_NS: usize = offset_of!(Slot, pid_ns);
    /// Offset of `used` (u64 × [`MAX_DEVICES`]) in a slot.
    pub const SLOT_USED: usize = offset_of!(Slot, used);

    const _: () = assert!(SIZE == 64 + 16 * 64 + 16 * 64 + 1024 * 192);
    const _: () = assert!(SLOTS + MAX_PROCESSES * SLOT_SIZE == SIZE);
    const _: () = assert!(SLOT_USED + MAX_DEVICES * 8 <= SLOT_SIZE);
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
    /// The region lock was not obtained in time (a holder is stopped or hung).
    LockTimeout {
        /// The file.
        path: PathBuf,
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
            AccountingError::LockTimeout { path } => write!(
                f,
                "{}: region lock not obtained within {} ms",
                path.display(),
                SETUP_LOCK_TIMEOUT.as_millis()
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

extern "C" fn on_fork_child() {
    FORK_GENERATION.fetch_add(1, Ordering::Relaxed);
}

fn install_fork_handler() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // SAFETY: registers a plain `extern "C"` function with no captured
        // state; it only does an atomic add, which is async-signal-safe and
        // valid in the single-threaded child. The library is never unloaded
        // (ld.so.preload), so the function outlives the registration.
        unsafe {
            libc::pthread_atfork(None, None, Some(on_fork_child));
        }
    });
}

/// A random number per program image (exec), the same in forked children.
fn image_token() -> u64 {
    static TOKEN: OnceLock<u64> = OnceLock::new();
    *TOKEN.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        // RandomState is seeded from the OS's random source.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        h.finish() | 1
    })
}

fn current_pid() -> u32 {
    std::process::id()
}

fn pid_namespace() -> u64 {
    std::fs::metadata("/proc/self/ns/pid")
        .map(|m| m.ino())
        .unwrap_or(0)
}

/// State (field 3) and start time (field 22) from `/proc/<pid>/stat`.
fn proc_stat(pid: u32) -> Option<(u8, u64)> {
    let text = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Parses a `/proc/<pid>/stat` line; the command name (field 2) may contain
/// spaces and parentheses, so fields are counted after its last `)`.
fn parse_stat(text: &[u8]) -> Option<(u8, u64)> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    // fields 4..=21 (18 of them) lie between state and start time.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Whether `pid` still runs the process that registered with `start_time`.
/// Unknown (no /proc, no permission) counts as alive: never reclaim on a guess.
fn process_alive(pid: u32, start_time: u64) -> bool {
    let Ok(signed) = i32::try_from(pid) else {
        return false;
    };
    if signed <= 0 {
        return false;
    }
    // SAFETY: signal 0 performs only the existence and permission check; it
    // sends nothing. `signed` is a positive pid, never a process group.
    let rc = unsafe { libc::kill(signed, 0) };
    if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    match proc_stat(pid) {
        Some((_, now)) if start_time != 0 && now != start_time => false,
        // A zombie's GPU memory was released when it exited. (A main thread
        // that called pthread_exit also shows Z while other threads run on.)
        Some((b'Z' | b'X' | b'x', _)) => threads(pid).is_some_and(|n| n > 1),
        _ => true,
    }
}

/// `Threads:` of `/proc/<pid>/status`.
fn threads(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------
// File lock
// ---------------------------------------------------------------------------

/// An exclusive `flock` on its own open file description, released (LOCK_UN)
/// on drop so that a descriptor inherited by a forked child cannot keep it.
struct RegionLock {
    fd: OwnedFd,
}

impl RegionLock {
    /// Locks `fd`; `Ok(None)` when not obtained within `timeout`.
    fn on(fd: OwnedFd, timeout: Duration) -> io::Result<Option<RegionLock>> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            // SAFETY: flock on a descriptor we own; no memory is passed.
            let rc = unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                return Ok(Some(RegionLock { fd }));
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => {
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(5));
                }
                _ => return Err(err),
            }
        }
    }

    /// Opens `path` anew and locks it.
    fn path(path: &CStr, timeout: Duration) -> io::Result<Option<RegionLock>> {
        RegionLock::on(open_existing(path)?, timeout)
    }
}

impl Drop for RegionLock {
    fn drop(&mut self) {
        // SAFETY: unlocks a descriptor we own; closing it follows in OwnedFd's drop.
        unsafe {
            libc::flock(self.fd.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

fn open_existing(path: &CStr) -> io::Result<OwnedFd> {
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

/// Opens the region file, creating it (mode 0666) if absent. Opening without
/// `O_CREAT` first keeps `fs.protected_regular` from refusing a file another
/// uid created in a sticky directory.
fn open_or_create(path: &CStr) -> io::Result<OwnedFd> {
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    for _ in 0..8 {
        match open_existing(path) {
            Ok(fd) => return Ok(fd),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
        // SAFETY: as in open_existing; O_EXCL makes this process the creator.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDWR
                    | libc::O_CLOEXEC
                    | libc::O_NOFOLLOW
                    | libc::O_NOCTTY
                    | libc::O_CREAT
                    | libc::O_EXCL,
                0o666 as libc::c_uint,
            )
        };
        if fd >= 0 {
            // SAFETY: `fd` was just returned by open and is owned by nobody else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            // Every uid in the container shares the budget; undo the umask.
            // SAFETY: fchmod on a descriptor we own.
            unsafe {
                libc::fchmod(fd.as_raw_fd(), 0o666);
            }
            return Ok(fd);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EEXIST) | Some(libc::EINTR) => last = err,
            _ => return Err(err),
        }
    }
    Err(last)
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
    c_path: CString,
    /// This process's slot, or `NO_SLOT` (all slots taken, or lock timeout).
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
    /// Creates or attaches the region file at `path` and registers this
    /// process in a free slot (reclaiming dead processes' slots first).
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
        let fd = open_or_create(&c_path).map_err(io_err("open"))?;
        let lock_fd = fd.try_clone().map_err(io_err("dup"))?;
        let Some(_lock) = RegionLock::on(lock_fd, SETUP_LOCK_TIMEOUT).map_err(io_err("flock"))?
        else {
            return Err(AccountingError::LockTimeout {
                path: path.to_path_buf(),
            });
        };
        let meta = std::fs::File::from(fd.try_clone().map_err(io_err("dup"))?)
            .metadata()
            .map_err(io_err("fstat"))?;
        if !meta.file_type().is_file() {
            return Err(AccountingError::NotOurs {
                path: path.to_path_buf(),
                reason: "not a regular file".to_string(),
            });
        }
        let fresh = check_existing(path, &fd, meta.len())?;
        if fresh {
            // Allocate every block now: a hole filled later through the
            // mapping would fault (SIGBUS) on a full file system.
            // SAFETY: plain syscall on a descriptor we own.
            let rc =
                unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, layout::SIZE as libc::off_t) };
            if rc != 0 {
                return Err(io_err("fallocate")(io::Error::from_raw_os_error(rc)));
            }
        }
        // SAFETY: maps exactly layout::SIZE bytes of a file we verified (or
        // just made) to be that long; the result is checked for MAP_FAILED.
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
        let region = SharedRegion {
            layout,
            path: path.to_path_buf(),
            c_path,
            slot: AtomicU32::new(NO_SLOT),
            reg_state: AtomicU64::new(1),
            registered_pid: AtomicU32::new(0),
        };
        let header = &region.layout().header;
        if fresh {
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
            header.magic.store(MAGIC, Ordering::Release);
        }
        header
            .device_count
            .fetch_max(device_count as u32, Ordering::Relaxed);
        let generation = FORK_GENERATION.load(Ordering::Acquire);
        region.reclaim_dead_locked();
        let slot = region.register_locked();
        region.slot.store(slot, Ordering::Relaxed);
        region.reg_state.store(generation << 1, Ordering::Release);
        Ok(region)
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
        let Some(total) = layout.totals.get(device) else {
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

    /// Returns `bytes` of `device`: takes them from this process's slot, then
    /// the same amount from the total, both saturating. More than this
    /// process charged is capped at what it charged, so the counters never
    /// underflow and other processes' usage is never erased.
    #[inline]
    pub fn uncharge(&self, device: usize, bytes: u64) {
        let layout = self.layout();
        let Some(total) = layout.totals.get(device) else {
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
            .totals
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
    /// [`MAX_PROCESSES`] are taken by live processes, or the lock timed out;
    /// without one, its usage cannot be reclaimed if it dies).
    pub fn has_slot(&self) -> bool {
        self.current_slot().is_some()
    }

    /// Pids of the processes registered in the region (in its pid
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

    /// Returns the usage of processes that are gone (or whose pid now belongs
    /// to another process), frees their slots, and reports the bytes returned.
    ///
    /// Call it when a charge fails, then retry the charge once. It takes the
    /// region lock (giving up after 200 ms, returning 0) and costs a few
    /// system calls per registered process.
    pub fn reclaim_dead(&self) -> u64 {
        match RegionLock::path(&self.c_path, RECLAIM_LOCK_TIMEOUT) {
            Ok(Some(_lock)) => self.reclaim_dead_locked(),
            _ => 0,
        }
    }

    /// Registers this process anew if it is a forked child of the process
    /// that registered (cheap when nothing changed). `try_charge` and
    /// `uncharge` do this by themselves after a `fork()`; call it after a
    /// raw `clone` or `_Fork`, which skip `pthread_atfork` handlers.
    pub fn reregister_after_fork(&self) {
        if self.registered_pid.load(Ordering::Relaxed) != current_pid() {
            FORK_GENERATION.fetch_add(1, Ordering::AcqRel);
        }
        let _ = self.current_slot();
    }

    /// The region's index for the device with this UUID (`GPU-…`/`MIG-…`;
    /// prefix and case do not matter), recording it on first use.
    ///
    /// Charge with this index rather than the CUDA ordinal when processes may
    /// see devices in different orders (`CUDA_VISIBLE_DEVICES`): the same GPU
    /// then shares one total in every process. Resolve once per device.
    pub fn device_index(&self, uuid: &str) -> Result<usize, AccountingError> {
        let key = uuid_key(uuid).ok_or_else(|| AccountingError::BadUuid {
            uuid: uuid.to_string(),
        })?;
        if let Some(i) = self.find_uuid(&key) {
            return Ok(i);
        }
        let lock = RegionLock::path(&self.c_path, SETUP_LOCK_TIMEOUT).map_err(|source| {
            AccountingError::Io {
                path: self.path.clone(),
                op: "flock",
                source,
            }
        })?;
        let Some(_lock) = lock else {
            return Err(AccountingError::LockTimeout {
                path: self.path.clone(),
            });
        };
        if let Some(i) = self.find_uuid(&key) {
            return Ok(i);
        }
        let header = &self.layout().header;
        let count = header.uuid_count.load(Ordering::Acquire) as usize;
        if count >= MAX_DEVICES {
            return Err(AccountingError::TooManyDevices {
                path: self.path.clone(),
                requested: count + 1,
            });
        }
        for (word, value) in self.layout().uuids[count].bytes.iter().zip(key) {
            word.store(value, Ordering::Relaxed);
        }
        header.uuid_count.store(count as u32 + 1, Ordering::Release);
        Ok(count)
    }

    fn find_uuid(&self, key: &[u64; MAX_UUID_BYTES / 8]) -> Option<usize> {
        let layout = self.layout();
        let count = (layout.header.uuid_count.load(Ordering::Acquire) as usize).min(MAX_DEVICES);
        layout.uuids[..count].iter().position(|entry| {
            entry
                .bytes
                .iter()
                .zip(key)
                .all(|(word, value)| word.load(Ordering::Relaxed) == *value)
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
                let slot = match RegionLock::path(&self.c_path, SETUP_LOCK_TIMEOUT) {
                    Ok(Some(_lock)) => self.register_locked(),
                    _ => NO_SLOT,
                };
                self.slot.store(slot, Ordering::Relaxed);
                self.reg_state.store(generation << 1, Ordering::Release);
                return;
            }
        }
    }

    /// Claims a free slot for this process; the region lock must be held.
    /// Slots left by an earlier program image of this same process (it
    /// `exec`ed after registering) are reclaimed first: that image's GPU
    /// memory went with it.
    fn register_locked(&self) -> u32 {
        let pid = current_pid();
        let start_time = proc_stat(pid).map_or(0, |(_, start)| start);
        let token = image_token();
        let pid_ns = pid_namespace();
        self.registered_pid.store(pid, Ordering::Relaxed);
        let slots = &self.layout().slots;
        for slot in slots.iter() {
            if slot.pid.load(Ordering::Acquire) == pid
                && slot.start_time.load(Ordering::Relaxed) == start_time
                && slot.token.load(Ordering::Relaxed) != token
            {
                self.free_slot(slot);
            }
        }
        let Some(index) = slots
            .iter()
            .position(|s| s.pid.load(Ordering::Acquire) == 0)
        else {
            return NO_SLOT;
        };
        let slot = &slots[index];
        for used in &slot.used {
            used.store(0, Ordering::Relaxed);
        }
        slot.start_time.store(start_time, Ordering::Relaxed);
        slot.pid_ns.store(pid_ns, Ordering::Relaxed);
        slot.token.store(token, Ordering::Relaxed);
        slot.pid.store(pid, Ordering::Release);
        index as u32
    }

    /// Reclaims dead processes' slots; the region lock must be held.
    fn reclaim_dead_locked(&self) -> u64 {
        let my_ns = pid_namespace();
        let mut reclaimed = 0u64;
        for slot in self.layout().slots.iter() {
            let pid = slot.pid.load(Ordering::Acquire);
            if pid == 0 {
                continue;
            }
            // A pid from another pid namespace means nothing here: leave it.
            let ns = slot.pid_ns.load(Ordering::Relaxed);
            if ns != 0 && my_ns != 0 && ns != my_ns {
                continue;
            }
            if process_alive(pid, slot.start_time.load(Ordering::Relaxed)) {
                continue;
            }
            reclaimed = reclaimed.saturating_add(self.free_slot(slot));
        }
        reclaimed
    }

    /// Moves a slot's usage out of the totals and frees it; returns the bytes.
    fn free_slot(&self, slot: &Slot) -> u64 {
        let totals = &self.layout().totals;
        let mut freed = 0u64;
        for (used, total) in slot.used.iter().zip(totals) {
            let bytes = used.swap(0, Ordering::Relaxed);
            if bytes != 0 {
                saturating_sub(&total.used, bytes);
                freed = freed.saturating_add(bytes);
            }
        }
        slot.start_time.store(0, Ordering::Relaxed);
        slot.pid_ns.store(0, Ordering::Relaxed);
        slot.token.store(0, Ordering::Relaxed);
        slot.pid.store(0, Ordering::Release);
        freed
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // Give the slot back if it is ours (not a parent's, after a fork) and
        // empty; a slot still holding usage stays for reclaim_dead.
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
            slot.token.store(0, Ordering::Relaxed);
            slot.pid.store(0, Ordering::Release);
        }
        // SAFETY: unmaps exactly the mapping made in `open`; no reference into
        // it outlives `self`.
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

/// The 64-byte key a UUID is stored under: lowercase, without `GPU-`/`MIG-`.
fn uuid_key(uuid: &str) -> Option<[u64; MAX_UUID_BYTES / 8]> {
    let body = match uuid.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("GPU-") || p.eq_ignore_ascii_case("MIG-") => &uuid[4..],
        _ => uuid,
    };
    if body.is_empty() || body.len() > MAX_UUID_BYTES {
        return None;
    }
    let mut bytes = [0u8; MAX_UUID_BYTES];
    for (b, c) in bytes.iter_mut().zip(body.bytes()) {
        *b = c.to_ascii_lowercase();
    }
    let mut key = [0u64; MAX_UUID_BYTES / 8];
    for (word, chunk) in key.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(chunk);
        *word = u64::from_le_bytes(eight);
    }
    Some(key)
}

/// Checks an existing file; `Ok(true)` when it is empty (or a zero-filled
/// leftover of an interrupted creation) and must be initialized.
fn check_existing(path: &Path, fd: &OwnedFd, size: u64) -> Result<bool, AccountingError> {
    if size == 0 {
        return Ok(true);
    }
    let not_ours = |reason: String| AccountingError::NotOurs {
        path: path.to_path_buf(),
        reason,
    };
    let mut header = [0u8; 64];
    let got = pread_exact(fd, &mut header, 0).map_err(|source| AccountingError::Io {
        path: path.to_path_buf(),
        op: "read",
        source,
    })?;
    let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |o: usize| u32::from_le_bytes(header[o..o + 4].try_into().unwrap_or([0; 4]));
    let magic = u64_at(0);
    if magic == 0 && size <= layout::SIZE as u64 {
        // An interrupted creation leaves zeros only; anything else is not ours.
        let mut all = vec![0u8; size as usize];
        let got = pread_exact(fd, &mut all, 0).map_err(|source| AccountingError::Io {
            path: path.to_path_buf(),
            op: "read",
            source,
        })?;
        if got as u64 == size && all.iter().all(|&b| b == 0) {
            return Ok(true);
        }
        return Err(not_ours("no magic, not empty".to_string()));
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

    /// A fresh region path in a directory removed when the guard drops.
    fn temp_path(name: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(name);
        (dir, path)
    }

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let line =
            b"4242 (a) b (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_stat(line), Some((b'S', 987654)));
        assert_eq!(parse_stat(b"1 (x) Z 0"), None, "too short");
        assert_eq!(parse_stat(b"garbage"), None);
        let mine = proc_stat(current_pid()).expect("own /proc/self/stat");
        assert_ne!(mine.0, b'Z', "we are alive");
        assert!(mine.1 > 0);
    }

    #[test]
    fn liveness_checks_pid_and_start_time() {
        let pid = current_pid();
        let (_, start) = proc_stat(pid).expect("own stat");
        assert!(process_alive(pid, start));
        assert!(
            process_alive(pid, 0),
            "unknown start time: alive if the pid is"
        );
        assert!(
            !process_alive(pid, start + 1),
            "same pid, other start time: reused"
        );
        assert!(!process_alive(0, 0));
        assert!(!process_alive(u32::MAX, 0), "never a process group");
    }

    #[test]
    fn uuid_keys_ignore_prefix_and_case() {
        assert_eq!(uuid_key("GPU-ABCdef"), uuid_key("mig-abcDEF"));
        assert_ne!(uuid_key("GPU-abc"), uuid_key("GPU-abd"));
        assert_eq!(uuid_key("GPU-"), None);
        assert_eq!(uuid_key(&"a".repeat(65)), None);
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
    }

    #[test]
    fn reused_pid_slot_is_reclaimed() {
        let (_dir, path) = temp_path("reuse");
        let region = SharedRegion::open(&path, 1).expect("open");
        assert!(region.try_charge(0, 100, u64::MAX));
        // A slot claiming our own (live) pid with another start time: a
        // process that had our pid before us and died holding 700 bytes.
        let slots = &region.layout().slots;
        let stale = slots
            .iter()
            .find(|s| s.pid.load(Ordering::Relaxed) == 0)
            .expect("free slot");
        let (_, start) = proc_stat(current_pid()).expect("stat");
        stale.used[0].store(700, Ordering::Relaxed);
        region.layout().totals[0]
            .used
            .fetch_add(700, Ordering::Relaxed);
        stale.start_time.store(start - 1, Ordering::Relaxed);
        stale.pid.store(current_pid(), Ordering::Release);
        assert_eq!(region.used(0), 800);
        assert_eq!(region.reclaim_dead(), 700);
        assert_eq!(region.used(0), 100, "our own usage stays");
        assert_eq!(stale.pid.load(Ordering::Relaxed), 0, "slot freed");
        assert_eq!(region.reclaim_dead(), 0, "nothing left to reclaim");
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
}
