//! The utilization file a process publishes per physical GPU, for the NVML
//! stand-in (`nvmlDeviceGetProcessUtilization`, `…GetUtilizationRates`,
//! `…GetComputeRunningProcesses_v3`, `…GetMemoryInfo`).
//!
//! Path: `<root>/run/tessera-sim/util/gpu<nvml index>-<pid>`. Format
//! version 1, little-endian, 6208 bytes, written through a shared mapping:
//!
//! ```text
//! offset size  field
//!      0    8  magic        "TCUTIL01"
//!      8    4  version      1
//!     12    4  gpu          NVML index of the physical GPU
//!     16    4  pid          the writing process
//!     20    4  gi           GPU-instance id of the MIG device in use, or 0xFFFFFFFF
//!     24    4  ci           compute-instance id, or 0xFFFFFFFF
//!     28    4  slots        128
//!     32    8  start_time   the process's start time (field 22 of /proc/<pid>/stat,
//!                           clock ticks since boot); 0 when unknown
//!     40    8  period_ns    sampling period: 10 000 000
//!     48   16  reserved     0
//!     64 6144  slot[128], 48 bytes each, all u64:
//!              seq        sample number, from 1; the sample lives in slot (seq−1) mod 128
//!              mono_ns    CLOCK_MONOTONIC when taken
//!              real_us    CLOCK_REALTIME, µs since the epoch (NVML's timeStamp)
//!              busy_ns    device time this process's work has used, cumulative
//!              mem_bytes  device memory the process holds (managed and host memory excluded)
//!              check      seq ^ rotl(mono,13) ^ rotl(real,29) ^ rotl(busy,41) ^ rotl(mem,53) ^ 0x9E3779B97F4A7C15
//! ```
//!
//! A reader copies the file and keeps the slots whose `check` matches and
//! whose `seq` fits their position: a slot caught mid-write fails the check.
//! A sample is taken every 10 ms by a background thread, on
//! `cuCtxSynchronize`/`cuStreamSynchronize`, and at exit. A new slot is
//! started only when the newest is at least [`MIN_SPACING_NS`] old;
//! otherwise the newest slot is rewritten with the fresher values (same
//! `seq`), so however often a program synchronises, 128 slots hold at
//! least 0.64 s (normally 1.28 s) of history.
//!
//! The file exists while the process has a context on the GPU (a retained
//! primary context or one of its own): it is removed when the last one
//! goes. It stays after the process ends, however that happens (the NVML
//! side skips dead pids); each process removes the files of dead processes
//! when it starts publishing.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tessera_model::proc;
use tessera_sim::shm::SharedMap;

/// `"TCUTIL01"` as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TCUTIL01");
/// Format version.
pub const VERSION: u32 = 1;
/// Samples the ring holds.
pub const SLOTS: u64 = 128;
/// Header bytes.
pub const HEADER_BYTES: usize = 64;
/// Bytes per slot.
pub const SLOT_BYTES: usize = 48;
/// File size.
pub const FILE_BYTES: usize = HEADER_BYTES + SLOTS as usize * SLOT_BYTES;
/// Sampling period.
pub const PERIOD_NS: u64 = 10_000_000;
/// Least time between the starts of two slots.
pub const MIN_SPACING_NS: u64 = PERIOD_NS / 2;
/// `gi`/`ci` of a whole-GPU user.
pub const NO_ID: u32 = u32::MAX;
/// Directory of the files, relative to the node root.
pub const UTIL_DIR: &str = "run/tessera-sim/util";

/// One sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// `CLOCK_MONOTONIC`, ns.
    pub mono_ns: u64,
    /// `CLOCK_REALTIME`, µs.
    pub real_us: u64,
    /// Cumulative busy ns.
    pub busy_ns: u64,
    /// Device bytes held.
    pub mem_bytes: u64,
}

/// The integrity word of a slot.
pub fn check(seq: u64, s: &Sample) -> u64 {
    seq ^ s.mono_ns.rotate_left(13)
        ^ s.real_us.rotate_left(29)
        ^ s.busy_ns.rotate_left(41)
        ^ s.mem_bytes.rotate_left(53)
        ^ 0x9E37_79B9_7F4A_7C15
}

/// File name of `pid`'s file for GPU `gpu`.
pub fn file_name(gpu: u32, pid: u32) -> String {
    format!("gpu{gpu}-{pid}")
}

/// The `(gpu, pid)` a file name stands for.
pub fn parse_file_name(name: &str) -> Option<(u32, u32)> {
    let (gpu, pid) = name.strip_prefix("gpu")?.split_once('-')?;
    Some((gpu.parse().ok()?, pid.parse().ok()?))
}

/// An open, mapped utilization file.
#[derive(Debug)]
pub struct UtilFile {
    map: SharedMap,
    seq: u64,
    /// When the newest slot was started.
    slot_started_ns: u64,
    /// Every sample in a slot of its own (never over the newest).
    every_sample: bool,
}

impl UtilFile {
    /// Creates (or truncates) the file at `path` and writes its header.
    pub fn create(path: &Path, gpu: u32, pid: u32, start_time: u64) -> io::Result<UtilFile> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(path)?;
        file.set_len(FILE_BYTES as u64)?;
        let util = UtilFile {
            map: SharedMap::new(file, FILE_BYTES)?,
            seq: 0,
            slot_started_ns: 0,
            every_sample: false,
        };
        util.store32(8, VERSION);
        util.store32(12, gpu);
        util.store32(16, pid);
        util.set_instance(None);
        util.store32(28, SLOTS as u32);
        util.store64(32, start_time);
        util.store64(40, PERIOD_NS);
        // The magic last: a reader ignores the file until the header is whole.
        util.store64(0, MAGIC);
        Ok(util)
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= FILE_BYTES);
        // SAFETY: the mapping is FILE_BYTES long, page-aligned and alive
        // while self is; offset is 8-aligned and in bounds (all callers pass
        // constants or slot offsets below FILE_BYTES). Other processes only
        // read the file, and this process writes it only through these
        // atomics.
        unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(offset).cast()) }
    }

    fn store64(&self, offset: usize, value: u64) {
        self.word64(offset).store(value, Ordering::Release);
    }

    fn store32(&self, offset: usize, value: u32) {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= HEADER_BYTES);
        // SAFETY: as in word64, for a 4-aligned header word.
        let word = unsafe { AtomicU32::from_ptr(self.map.as_ptr().add(offset).cast()) };
        word.store(value, Ordering::Release);
    }

    /// Records the MIG device (GI, CI) the process uses on this GPU, or
    /// `None` for the whole GPU (or a mix).
    pub fn set_instance(&self, instance: Option<(u32, u32)>) {
        let (gi, ci) = instance.unwrap_or((NO_ID, NO_ID));
        self.store32(20, gi);
        self.store32(24, ci);
    }

    /// Puts every later sample in a slot of its own, so that a reader who
    /// finds the newest slot mid-write falls back on the sample just before
    /// it (rewriting the newest in place would leave it an older one).
    pub fn set_every_sample(&mut self, every: bool) {
        self.every_sample = every;
    }

    /// Records a sample: in a new slot (overwriting the oldest) when the
    /// newest slot is [`MIN_SPACING_NS`] old (or every time, see
    /// [`UtilFile::set_every_sample`]), else over the newest.
    pub fn record(&mut self, sample: Sample) {
        if self.seq == 0
            || self.every_sample
            || sample.mono_ns.saturating_sub(self.slot_started_ns) >= MIN_SPACING_NS
        {
            self.seq += 1;
            self.slot_started_ns = sample.mono_ns;
        }
        let seq = self.seq;
        let at = HEADER_BYTES + ((seq - 1) % SLOTS) as usize * SLOT_BYTES;
        self.store64(at + 40, 0);
        self.store64(at, seq);
        self.store64(at + 8, sample.mono_ns);
        self.store64(at + 16, sample.real_us);
        self.store64(at + 24, sample.busy_ns);
        self.store64(at + 32, sample.mem_bytes);
        self.store64(at + 40, check(seq, &sample));
    }
}

/// This process's start time, field 22 of `/proc/self/stat`; 0 if unknown.
pub fn own_start_time() -> u64 {
    std::fs::read("/proc/self/stat")
        .ok()
        .and_then(|stat| proc::parse_stat(&stat))
        .map_or(0, |stat| stat.start_time)
}

/// Whether `pid` is a live (not zombie) process started at `start_time`
/// (0: not checked).
///
/// Files name processes by their host pid (the first `NSpid:` field, as the
/// real driver reports them). A process in a pid namespace of its own cannot
/// signal a host pid — `kill` would answer for whatever that number means in
/// its namespace — but reads it where `/proc` is the host's. So `/proc`
/// decides when it knows the pid, the signal only when it does not (the
/// stand-in NVML's rule, `tessera_sim_nvml::util`).
pub fn process_alive(pid: u32, start_time: u64) -> bool {
    let Ok(pid_t) = libc::pid_t::try_from(pid) else {
        return false;
    };
    match std::fs::read(format!("/proc/{pid}/stat")) {
        // The kernel's format and Tessera's one liveness rule (model::proc):
        // sharing them hides no bug of the driver this stands in for.
        Ok(stat) => proc::parse_stat(&stat).is_none_or(|s| s.is_live_since(start_time)),
        Err(_) => {
            // SAFETY: kill with signal 0 only checks that the process exists.
            let rc = unsafe { libc::kill(pid_t, 0) };
            rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

/// Removes the files of processes that are gone; errors are ignored
/// (another process may be doing the same, or own the file).
pub fn remove_stale(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((_, pid)) = name.to_str().and_then(parse_file_name) else {
            continue;
        };
        let start_time = std::fs::read(entry.path())
            .ok()
            .filter(|b| b.len() >= HEADER_BYTES)
            .map_or(0, |b| {
                u64::from_le_bytes(b[32..40].try_into().unwrap_or([0; 8]))
            });
        if !process_alive(pid, start_time) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_u64(bytes: &[u8], at: usize) -> u64 {
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    }

    #[test]
    fn samples_land_in_their_slots_with_a_valid_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file_name(3, 42));
        let mut file = UtilFile::create(&path, 3, 42, 777).unwrap();
        for i in 1..=130u64 {
            file.record(Sample {
                mono_ns: i * MIN_SPACING_NS,
                real_us: i,
                busy_ns: i * 5,
                mem_bytes: 1 << 20,
            });
        }
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), FILE_BYTES);
        assert_eq!(&bytes[..8], b"TCUTIL01");
        assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 3);
        assert_eq!(u32::from_le_bytes(bytes[20..24].try_into().unwrap()), NO_ID);
        assert_eq!(read_u64(&bytes, 32), 777);
        // Sample 130 overwrote slot 1 (sample 2).
        let slot = HEADER_BYTES + SLOT_BYTES;
        assert_eq!(read_u64(&bytes, slot), 130);
        let s = Sample {
            mono_ns: read_u64(&bytes, slot + 8),
            real_us: read_u64(&bytes, slot + 16),
            busy_ns: read_u64(&bytes, slot + 24),
            mem_bytes: read_u64(&bytes, slot + 32),
        };
        assert_eq!(s.busy_ns, 650);
        assert_eq!(read_u64(&bytes, slot + 40), check(130, &s));
    }

    #[test]
    fn samples_closer_than_the_spacing_refresh_the_newest_slot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(file_name(0, 1));
        let mut file = UtilFile::create(&path, 0, 1, 0).unwrap();
        let at = |mono_ns, busy_ns| Sample {
            mono_ns,
            real_us: mono_ns / 1000,
            busy_ns,
            mem_bytes: 0,
        };
        file.record(at(1_000_000, 0));
        file.record(at(2_000_000, 10)); // 1 ms later: same slot
        file.record(at(6_000_000, 20)); // 5 ms after the slot began: a new one
        let bytes = std::fs::read(&path).unwrap();
        let slot0 = HEADER_BYTES;
        let slot1 = HEADER_BYTES + SLOT_BYTES;
        assert_eq!(read_u64(&bytes, slot0), 1);
        assert_eq!(read_u64(&bytes, slot0 + 24), 10, "refreshed in place");
        assert_eq!(read_u64(&bytes, slot1), 2);
        assert_eq!(read_u64(&bytes, slot1 + 24), 20);
    }

    #[test]
    fn names_parse_and_this_process_is_alive() {
        assert_eq!(parse_file_name("gpu12-345"), Some((12, 345)));
        assert_eq!(parse_file_name("gpu1-x"), None);
        assert!(process_alive(std::process::id(), own_start_time()));
        assert!(!process_alive(std::process::id(), own_start_time() + 1));
    }
}
