//! What GPU processes are doing: read from the utilization files the CUDA
//! stand-in (`tessera-sim-cuda`) publishes under the node root.
//!
//! Each process that has a context on a GPU keeps
//! `<root>/run/tessera-sim/util/gpu<index>-<pid>`: a 64-byte header (magic
//! `TCUTIL01`, version 1, GPU index, pid, GI and CI ids of the MIG device in
//! use or `0xFFFFFFFF`, slot count, the process's start time, the sampling
//! period) and a ring of 128 samples of 48 bytes (`seq`, monotonic ns,
//! wall-clock µs, cumulative busy ns, device bytes held, check word), one
//! every 10 ms. The layout is documented in `tessera_sim_cuda::utilfile`;
//! this is an independent reading of it, so either side's mistake shows in
//! the tests that run both.
//!
//! A file counts when its process is alive (not a zombie) and is the one
//! that wrote it (same start time), and it holds at least one valid sample.

use std::path::Path;

use tessera_model::proc;

/// Directory of the files, relative to the node root.
pub const UTIL_DIR: &str = "run/tessera-sim/util";
const MAGIC: &[u8; 8] = b"TCUTIL01";
const HEADER: usize = 64;
const SLOT: usize = 48;
const NO_ID: u32 = u32::MAX;

/// One utilization sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    seq: u64,
    /// `CLOCK_MONOTONIC` when taken, ns.
    pub mono_ns: u64,
    /// Wall clock when taken, µs since the epoch.
    pub real_us: u64,
    /// Device time the process's work has used so far, ns.
    pub busy_ns: u64,
    /// Device memory the process holds, bytes.
    pub mem_bytes: u64,
}

/// A live process using a GPU, with its samples, oldest first.
#[derive(Debug, Clone)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// `(GI id, CI id)` of the MIG device it uses, if it uses exactly one.
    pub instance: Option<(u32, u32)>,
    samples: Vec<Sample>,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut word = [0; 4];
    word.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(word)
}

fn check_word(seq: u64, s: &Sample) -> u64 {
    seq ^ s.mono_ns.rotate_left(13)
        ^ s.real_us.rotate_left(29)
        ^ s.busy_ns.rotate_left(41)
        ^ s.mem_bytes.rotate_left(53)
        ^ 0x9E37_79B9_7F4A_7C15
}

/// What a file says.
#[derive(Debug)]
struct Parsed {
    pid: u32,
    instance: Option<(u32, u32)>,
    start_time: u64,
    samples: Vec<Sample>,
}

/// The header fields and valid samples of a file's bytes.
fn parse(bytes: &[u8], gpu: u32) -> Option<Parsed> {
    if bytes.len() < HEADER || &bytes[..8] != MAGIC || u32_at(bytes, 8) != 1 {
        return None;
    }
    if u32_at(bytes, 12) != gpu {
        return None;
    }
    let pid = u32_at(bytes, 16);
    let (gi, ci) = (u32_at(bytes, 20), u32_at(bytes, 24));
    let instance = (gi != NO_ID && ci != NO_ID).then_some((gi, ci));
    let slots = u32_at(bytes, 28) as usize;
    let start_time = u64_at(bytes, 32);
    let mut samples: Vec<Sample> = (0..slots)
        .filter_map(|i| {
            let at = HEADER + i * SLOT;
            let slot = bytes.get(at..at + SLOT)?;
            let s = Sample {
                seq: u64_at(slot, 0),
                mono_ns: u64_at(slot, 8),
                real_us: u64_at(slot, 16),
                busy_ns: u64_at(slot, 24),
                mem_bytes: u64_at(slot, 32),
            };
            let placed = s.seq != 0 && (s.seq - 1) % slots as u64 == i as u64;
            (placed && u64_at(slot, 40) == check_word(s.seq, &s)).then_some(s)
        })
        .collect();
    samples.sort_by_key(|s| s.seq);
    Some(Parsed {
        pid,
        instance,
        start_time,
        samples,
    })
}

/// Whether `pid` is alive, not a zombie, and started at `start_time` (0: unchecked).
///
/// Files name processes by their host pid, as the real driver reports them;
/// a caller in a container's pid namespace cannot signal that pid, but can
/// read it where `/proc` is the host's. So `/proc` decides when it knows
/// the pid, the signal check only when it does not.
fn alive(pid: u32, start_time: u64) -> bool {
    let Ok(pid_t) = libc::pid_t::try_from(pid) else {
        return false;
    };
    match std::fs::read(format!("/proc/{pid}/stat")) {
        // The kernel's format and Tessera's one liveness rule (model::proc):
        // sharing them hides no bug of the NVML this stands in for.
        Ok(stat) => proc::parse_stat(&stat).is_none_or(|s| s.is_live_since(start_time)),
        Err(_) => {
            // SAFETY: signal 0 only checks that the process exists.
            let rc = unsafe { libc::kill(pid_t, 0) };
            rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
        }
    }
}

/// The live processes using GPU `gpu` of the node at `root`, by pid.
pub fn processes(root: &Path, gpu: u32) -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir(root.join(UTIL_DIR)) else {
        return Vec::new();
    };
    let prefix = format!("gpu{gpu}-");
    let mut found: Vec<Process> = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .is_some_and(|pid| pid.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|bytes| parse(&bytes, gpu))
        .filter(|f| !f.samples.is_empty() && alive(f.pid, f.start_time))
        .map(|f| Process {
            pid: f.pid,
            instance: f.instance,
            samples: f.samples,
        })
        .collect();
    found.sort_by_key(|p| p.pid);
    found
}

/// `CLOCK_MONOTONIC` now, ns.
pub use tessera_sim::clock::monotonic_ns;

/// A busy fraction as NVML's whole percent, 0–100.
pub fn percent(fraction: f64) -> u32 {
    (fraction * 100.0).round().clamp(0.0, 100.0) as u32
}

impl Process {
    /// The newest sample.
    pub fn newest(&self) -> &Sample {
        // Never empty: `processes` keeps only files with samples.
        &self.samples[self.samples.len() - 1]
    }

    /// The sample utilization since `last_seen_us` is measured from: the
    /// newest at or before it, or the oldest the ring still holds.
    pub fn base_since(&self, last_seen_us: u64) -> &Sample {
        self.samples
            .iter()
            .rev()
            .find(|s| s.real_us <= last_seen_us)
            .unwrap_or(&self.samples[0])
    }

    /// The oldest sample within `window_ns` before the newest.
    pub fn base_within(&self, window_ns: u64) -> &Sample {
        let from = self.newest().mono_ns.saturating_sub(window_ns);
        self.samples
            .iter()
            .find(|s| s.mono_ns >= from)
            .unwrap_or(self.newest())
    }

    /// Fraction of the time from `base` to the newest sample the GPU was
    /// busy with this process's work; 0 over an empty interval.
    pub fn busy_since(&self, base: &Sample) -> f64 {
        let newest = self.newest();
        let elapsed = newest.mono_ns.saturating_sub(base.mono_ns);
        if elapsed == 0 {
            return 0.0;
        }
        newest.busy_ns.saturating_sub(base.busy_ns) as f64 / elapsed as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a file in the documented layout, independently of the writer.
    fn file(gpu: u32, pid: u32, start_time: u64, samples: &[(u64, u64, u64, u64, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER + 128 * SLOT];
        b[..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[12..16].copy_from_slice(&gpu.to_le_bytes());
        b[16..20].copy_from_slice(&pid.to_le_bytes());
        b[20..24].copy_from_slice(&NO_ID.to_le_bytes());
        b[24..28].copy_from_slice(&NO_ID.to_le_bytes());
        b[28..32].copy_from_slice(&128u32.to_le_bytes());
        b[32..40].copy_from_slice(&start_time.to_le_bytes());
        for &(seq, mono_ns, real_us, busy_ns, mem_bytes) in samples {
            let s = Sample {
                seq,
                mono_ns,
                real_us,
                busy_ns,
                mem_bytes,
            };
            let at = HEADER + ((seq - 1) % 128) as usize * SLOT;
            for (i, v) in [
                seq,
                mono_ns,
                real_us,
                busy_ns,
                mem_bytes,
                check_word(seq, &s),
            ]
            .into_iter()
            .enumerate()
            {
                b[at + i * 8..at + i * 8 + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    #[test]
    fn valid_samples_parse_in_order_and_torn_ones_do_not() {
        let mut b = file(
            2,
            77,
            5,
            &[
                (3, 300, 30, 150, 9),
                (1, 100, 10, 0, 9),
                (2, 200, 20, 50, 9),
            ],
        );
        let f = parse(&b, 2).unwrap();
        assert_eq!((f.pid, f.instance, f.start_time), (77, None, 5));
        assert_eq!(
            f.samples.iter().map(|s| s.seq).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        // Corrupt sample 2's busy time: its check word no longer matches.
        b[HEADER + SLOT + 24] ^= 1;
        let f = parse(&b, 2).unwrap();
        assert_eq!(f.samples.iter().map(|s| s.seq).collect::<Vec<_>>(), [1, 3]);
        assert!(parse(&b, 3).is_none(), "another GPU's file");
        assert!(parse(&b[..10], 2).is_none());
    }

    #[test]
    fn utilization_is_busy_time_over_elapsed_time() {
        let b = file(
            0,
            1,
            0,
            &[
                (1, 1_000, 100, 0, 0),
                (2, 2_000, 200, 500, 0),
                (3, 3_000, 300, 1_500, 0),
            ],
        );
        let f = parse(&b, 0).unwrap();
        let p = Process {
            pid: f.pid,
            instance: f.instance,
            samples: f.samples,
        };
        assert_eq!(p.base_since(250).seq, 2);
        assert_eq!(p.base_since(0).seq, 1, "older than the ring: the oldest");
        assert!((p.busy_since(p.base_since(250)) - 1.0).abs() < 1e-9);
        assert!((p.busy_since(p.base_since(0)) - 0.75).abs() < 1e-9);
        assert_eq!(p.base_within(1_000).seq, 2);
        assert_eq!(percent(0.754), 75);
        assert_eq!(percent(1.7), 100);
    }

    #[test]
    fn dead_and_reused_pids_do_not_count() {
        let dir = tempfile::tempdir().unwrap();
        let util = dir.path().join(UTIL_DIR);
        std::fs::create_dir_all(&util).unwrap();
        let me = std::process::id();
        let stat = std::fs::read("/proc/self/stat").unwrap();
        let started = proc::parse_stat(&stat).unwrap().start_time;
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let sample = [(1, 1, 1, 0, 4096)];
        std::fs::write(
            util.join(format!("gpu0-{me}")),
            file(0, me, started, &sample),
        )
        .unwrap();
        std::fs::write(util.join(format!("gpu0-{dead}")), file(0, dead, 0, &sample)).unwrap();
        std::fs::write(util.join("gpu1-1"), file(1, me, started + 1, &sample)).unwrap();
        let found = processes(dir.path(), 0);
        assert_eq!(found.iter().map(|p| p.pid).collect::<Vec<_>>(), [me]);
        assert_eq!(found[0].newest().mem_bytes, 4096);
        assert!(
            processes(dir.path(), 1).is_empty(),
            "start time differs: pid reused"
        );
    }
}
