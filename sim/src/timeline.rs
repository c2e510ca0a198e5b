//! Reading a simulated device's shared timeline: how much device time each
//! process's kernels really took.
//!
//! The CUDA stand-in (`tessera-sim-cuda`, its `timeline` module) runs the
//! kernels of every process on a device on one clock kept in
//! `<root>/run/tessera-sim/timeline/gpu<N>` (`gpu<N>-gi<G>-ci<C>` for a MIG
//! device), and records there, per process (host pid), the device time its
//! work took. This is a reading of that file written from its documented
//! layout alone, not with the writer's code, for judges that must not
//! trust what they judge: the SM limiter tests and
//! `scripts/bench-sm-limit.sh` measure achieved device time here, never
//! through the utilization the stand-in publishes for NVML (which the
//! limiter reads, and which a test may bias on purpose).
//!
//! Layout (version 1, little-endian, 8256 bytes, u64 words): header of 64
//! bytes — magic `"TCTLINE1"` at 0, version (u32) at 8, slots (u32) at 12,
//! `busy_until` at 16, `enqueued_ns` at 24 — then 256 slots of 32 bytes:
//! `pid`, `enqueued_ns`, `last_end_ns`, `launches`. Device time completed
//! by `t` is `enqueued_ns − max(0, busy_until − t)`; a process's is
//! `enqueued_ns − min(enqueued_ns, max(0, last_end_ns − t))`, short by at
//! most the device's backlog at `t` (a few ms).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::SimError;
use crate::shm::SharedMap;

/// Directory of the timelines, relative to the node root.
pub const DIR: &str = "run/tessera-sim/timeline";
const MAGIC: &[u8; 8] = b"TCTLINE1";
const VERSION: u32 = 1;
const HEADER_BYTES: usize = 64;
const SLOT_BYTES: usize = 32;
const SLOTS: usize = 256;
const FILE_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;

/// The timeline file of GPU `gpu` (NVML index) of the node at `root`, or
/// of its MIG device `(gi, ci)`.
pub fn path(root: &Path, gpu: u32, mig: Option<(u32, u32)>) -> PathBuf {
    let name = match mig {
        None => format!("gpu{gpu}"),
        Some((gi, ci)) => format!("gpu{gpu}-gi{gi}-ci{ci}"),
    };
    root.join(DIR).join(name)
}

/// `CLOCK_MONOTONIC` in ns: the clock the timeline runs on.
pub use crate::clock::monotonic_ns;

/// One process's record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcessTime {
    /// Device time its work completed by the snapshot's time, ns.
    pub busy_ns: u64,
    /// Launches (kernels and graphs) it made.
    pub launches: u64,
}

/// What a timeline said at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// `CLOCK_MONOTONIC` ns the snapshot was taken at.
    pub at_ns: u64,
    /// Device time of all work completed by then, ns.
    pub device_busy_ns: u64,
    /// Per host pid.
    pub processes: BTreeMap<u32, ProcessTime>,
}

impl Snapshot {
    /// Device time completed by the processes in `pids`, ns.
    pub fn busy_of(&self, pids: &[u32]) -> u64 {
        pids.iter()
            .filter_map(|pid| self.processes.get(pid))
            .map(|p| p.busy_ns)
            .sum()
    }
}

/// The share of the device's time from `before` to `after` that the
/// processes in `pids` (all processes: `None`) kept it busy, 0.0–1.0.
pub fn busy_fraction(before: &Snapshot, after: &Snapshot, pids: Option<&[u32]>) -> f64 {
    let elapsed = after.at_ns.saturating_sub(before.at_ns);
    if elapsed == 0 {
        return 0.0;
    }
    let busy = match pids {
        None => after.device_busy_ns.saturating_sub(before.device_busy_ns),
        Some(pids) => after.busy_of(pids).saturating_sub(before.busy_of(pids)),
    };
    busy as f64 / elapsed as f64
}

/// An open timeline file, mapped (only ever read).
#[derive(Debug)]
pub struct DeviceTimeline {
    map: SharedMap,
    path: PathBuf,
}

impl DeviceTimeline {
    /// Opens the file at `path`; an error when it is missing or not a
    /// stamped timeline of this layout.
    pub fn open(path: &Path) -> Result<DeviceTimeline, SimError> {
        let io = |source| SimError::Io {
            path: path.to_path_buf(),
            source,
        };
        let corrupt = |reason: String| SimError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        // Read-write, though the reader never stores: Rust's atomics want
        // memory valid for writes, even for a load (the file is 0666).
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len != FILE_BYTES as u64 {
            return Err(corrupt(format!("{len} bytes, a timeline has {FILE_BYTES}")));
        }
        let timeline = DeviceTimeline {
            map: SharedMap::new(file, FILE_BYTES).map_err(io)?,
            path: path.to_path_buf(),
        };
        let magic = timeline.word(0).to_le_bytes();
        let version = (timeline.word(8) & 0xffff_ffff) as u32;
        if &magic != MAGIC || version != VERSION {
            return Err(corrupt(format!(
                "magic {magic:?}, version {version}: not a version {VERSION} timeline"
            )));
        }
        Ok(timeline)
    }

    /// Opens the file at `path`, waiting up to `timeout` for it to appear
    /// (it is made at the first `cuInit` on the node).
    pub fn open_waiting(path: &Path, timeout: Duration) -> Result<DeviceTimeline, SimError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match DeviceTimeline::open(path) {
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                result => return result,
            }
        }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn word(&self, offset: usize) -> u64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= FILE_BYTES);
        // SAFETY: the mapping is FILE_BYTES long, page-aligned, readable and
        // writable, and alive while self is; offset is 8-aligned and in
        // bounds; only loads are made through it. Writers change
        // the words only atomically, so an atomic load sees whole values.
        let word = unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(offset).cast()) };
        u64::from_le(word.load(Ordering::Acquire))
    }

    /// What the timeline says now. The amounts are loaded before the ends
    /// (writers store them the other way round), so no work reads as done
    /// before it is.
    pub fn snapshot(&self) -> Snapshot {
        let at_ns = monotonic_ns();
        let enqueued = self.word(24);
        let busy_until = self.word(16);
        let device_busy_ns = enqueued.saturating_sub(busy_until.saturating_sub(at_ns));
        let mut processes: BTreeMap<u32, ProcessTime> = BTreeMap::new();
        for slot in 0..SLOTS {
            let at = HEADER_BYTES + slot * SLOT_BYTES;
            let Ok(pid) = u32::try_from(self.word(at)) else {
                continue;
            };
            if pid == 0 {
                continue;
            }
            let enqueued = self.word(at + 8);
            let last_end = self.word(at + 16);
            let launches = self.word(at + 24);
            // A pid seen twice (a slot reclaimed from a process of the same
            // number) counts both.
            let entry = processes.entry(pid).or_default();
            entry.busy_ns += enqueued.saturating_sub(last_end.saturating_sub(at_ns));
            entry.launches += launches;
        }
        Snapshot {
            at_ns,
            device_busy_ns,
            processes,
        }
    }
}

/// Snapshots of the timeline at `path` (waiting for it to appear) after
/// `after` and again `window` later, as `key=value` lines: the window, the
/// device's busy fraction, and each process's busy fraction and launches
/// in it. Without `window`: what it holds now, cumulative.
pub fn report(path: &Path, after: Duration, window: Option<Duration>) -> Result<String, SimError> {
    let timeline = DeviceTimeline::open_waiting(path, after + Duration::from_secs(10))?;
    std::thread::sleep(after);
    let first = timeline.snapshot();
    let mut out = String::new();
    let Some(window) = window else {
        out.push_str(&format!(
            "at_ns={}\ndevice_busy_ns={}\n",
            first.at_ns, first.device_busy_ns
        ));
        for (pid, p) in &first.processes {
            out.push_str(&format!(
                "pid.{pid}.busy_ns={}\npid.{pid}.launches={}\n",
                p.busy_ns, p.launches
            ));
        }
        return Ok(out);
    };
    std::thread::sleep(window);
    let second = timeline.snapshot();
    let seconds = second.at_ns.saturating_sub(first.at_ns) as f64 / 1e9;
    out.push_str(&format!("window_s={seconds:.6}\n"));
    out.push_str(&format!(
        "device_busy_fraction={:.6}\n",
        busy_fraction(&first, &second, None)
    ));
    for (pid, p) in &second.processes {
        let launches = p.launches
            - first
                .processes
                .get(pid)
                .map_or(0, |q| q.launches.min(p.launches));
        out.push_str(&format!(
            "pid.{pid}.busy_fraction={:.6}\npid.{pid}.launches={launches}\n",
            busy_fraction(&first, &second, Some(&[*pid]))
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A timeline file written from the layout: `(pid, enqueued, last_end,
    /// launches)` per slot.
    fn file(busy_until: u64, enqueued: u64, slots: &[(u64, u64, u64, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; FILE_BYTES];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(SLOTS as u32).to_le_bytes());
        b[16..24].copy_from_slice(&busy_until.to_le_bytes());
        b[24..32].copy_from_slice(&enqueued.to_le_bytes());
        for (i, &(pid, enq, end, launches)) in slots.iter().enumerate() {
            let at = HEADER_BYTES + i * SLOT_BYTES;
            for (k, v) in [pid, enq, end, launches].into_iter().enumerate() {
                b[at + 8 * k..at + 8 * k + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn completed_work_per_process_and_in_total() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = path(dir.path(), 0, None);
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        // Everything ended in the past (monotonic time 1000 ns after boot).
        std::fs::write(
            &path,
            file(1_000, 700, &[(10, 300, 900, 3), (11, 400, 1_000, 4)]),
        )
        .expect("write");
        let t = DeviceTimeline::open(&path).expect("open");
        let s = t.snapshot();
        assert_eq!(s.device_busy_ns, 700);
        assert_eq!(
            s.processes[&10],
            ProcessTime {
                busy_ns: 300,
                launches: 3
            }
        );
        assert_eq!(s.busy_of(&[10, 11, 12]), 700);
        let later = Snapshot {
            at_ns: s.at_ns + 1_000,
            device_busy_ns: 1_200,
            processes: BTreeMap::from([(
                10,
                ProcessTime {
                    busy_ns: 550,
                    launches: 5,
                },
            )]),
        };
        assert!((busy_fraction(&s, &later, Some(&[10])) - 0.25).abs() < 1e-9);
        assert!((busy_fraction(&s, &later, None) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn work_still_queued_is_not_done() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gpu0");
        let far = monotonic_ns() + 3_600_000_000_000;
        std::fs::write(&path, file(far, 100, &[(10, 100, far, 1)])).expect("write");
        let s = DeviceTimeline::open(&path).expect("open").snapshot();
        assert_eq!(s.device_busy_ns, 0);
        assert_eq!(s.processes[&10].busy_ns, 0);
    }

    #[test]
    fn other_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gpu0");
        assert!(DeviceTimeline::open(&path).is_err(), "missing");
        std::fs::write(&path, b"short").expect("write");
        assert!(DeviceTimeline::open(&path).is_err(), "short");
        std::fs::write(&path, vec![0u8; FILE_BYTES]).expect("write");
        assert!(DeviceTimeline::open(&path).is_err(), "not stamped");
    }
}
