//! The simulated device's work queue, shared by every process on the node.
//!
//! Each device has one clock: `busy_until`, the monotonic time at which
//! everything enqueued so far — by any process — is done. A launch costing
//! `c` ns starts at `max(now, busy_until)` and moves `busy_until` to its end
//! (one compare-and-swap on the shared word), so the kernels of all
//! processes on a device run one after another, as on a GPU without MPS.
//! Launches are asynchronous, but like the real launch queue the caller
//! blocks while more than [`QUEUE_DEPTH_NS`] of work is waiting ahead of
//! its launch's end. Synchronising waits for the process's own last launch.
//!
//! # The shared file
//!
//! With a node, the clock lives in a file mapped `MAP_SHARED` by every
//! process: `<root>/run/tessera-sim/timeline/gpu<N>` for a whole GPU (NVML
//! index `N`), `gpu<N>-gi<G>-ci<C>` for a MIG device (its own SMs, its own
//! clock). Without a node, or when the file cannot be used (one line on
//! stderr), the same record is kept in the process's own memory. Version 1,
//! little-endian, [`FILE_BYTES`] bytes, mode 0666, every field a u64 word
//! (or half of one) accessed atomically; a zero-filled file is an empty
//! timeline:
//!
//! ```text
//! offset size  field
//!      0    8  magic        "TCTLINE1" (stamped by the first process to map it)
//!      8    4  version      1
//!     12    4  slots        256
//!     16    8  busy_until   CLOCK_MONOTONIC ns at which all work enqueued so far is done
//!     24    8  enqueued_ns  device time of all work ever enqueued, ns
//!     32   32  reserved     0
//!     64 8192  slot[256], 32 bytes each, all u64:
//!              pid          host pid of the process (first NSpid entry); 0 = free
//!              enqueued_ns  device time of the process's work enqueued so far
//!              last_end_ns  where the process's latest launch ends on the device clock
//!              launches     launches (kernels and graphs) of the process
//! ```
//!
//! Device time completed by `t` is `enqueued_ns − max(0, busy_until − t)`
//! exactly: the work still ahead of any past `t` is one contiguous stretch
//! ending at `busy_until`. A process's completed time is
//! `enqueued_ns − min(enqueued_ns, max(0, last_end_ns − t))`, short of the
//! truth by at most the other processes' work queued before its last launch
//! (the device's backlog, a few ms). Writers update `busy_until` before
//! `enqueued_ns` and a slot's `last_end_ns` before its `enqueued_ns`, so a
//! reader that loads `enqueued_ns` first never sees work done early.
//!
//! A process takes a free slot at its first launch on the device and keeps
//! it after it exits (so its record can be read afterwards); when all are
//! taken it keeps its record to itself (its work still serializes on the
//! device clock and counts in the device's total). Slots are never
//! reclaimed: they hold host pids, and whether a host pid is gone cannot be
//! told from inside a container's pid namespace — taking a live process's
//! slot would merge two records.
//! A child of `fork` inherits its parent's slot (CUDA does not work in such
//! a child, so nothing is lost).
//!
//! # Kernel cost
//!
//! [`CostModel`]: a fixed cost per launch, plus the blocks rounded up to
//! whole waves (SMs × blocks per SM) times the cost of a block, scaled by
//! optional seeded noise. So kernel time is not proportional to blocks: a
//! partial wave costs a whole one, and small kernels pay mostly overhead.
//!
//! The launch path is a few atomic operations on the shared mapping: no
//! lock, no allocation, no system call beyond reading the clock.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock;
use crate::config::{Config, DeviceSpec};
use crate::publish;
use tessera_sim::shm::SharedMap;

/// Most queued work a launch leaves behind before it blocks its caller.
pub const QUEUE_DEPTH_NS: u64 = 5_000_000;
/// Directory of the shared timelines, relative to the node root.
pub const TIMELINE_DIR: &str = "run/tessera-sim/timeline";
/// `"TCTLINE1"` as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TCTLINE1");
/// Layout version.
pub const VERSION: u32 = 1;
/// Process slots per device.
pub const SLOTS: usize = 256;
/// Header bytes.
pub const HEADER_BYTES: usize = 64;
/// Bytes of one process slot.
pub const SLOT_BYTES: usize = 32;
/// Size of a timeline file.
pub const FILE_BYTES: usize = HEADER_BYTES + SLOTS * SLOT_BYTES;

/// How a launch's device time follows from its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostModel {
    /// Fixed cost of every launch, ns.
    pub launch_ns: u64,
    /// Cost of one block, ns (0 with `launch_ns` 0: launches are free).
    pub ns_per_block: u64,
    /// Resident blocks per SM; blocks run in waves of SMs × this and a
    /// partial wave costs a whole one. 0: no waves (linear in blocks).
    pub blocks_per_sm: u64,
    /// Each cost is scaled by a random factor in [1 − p, 1 + p] percent.
    pub noise_pct: u64,
    /// Seed of the noise.
    pub noise_seed: u64,
}

impl Default for CostModel {
    /// `TESSERA_SIM_CUDA_NS_PER_BLOCK`'s default and nothing else: linear.
    fn default() -> CostModel {
        CostModel {
            launch_ns: 0,
            ns_per_block: crate::config::DEFAULT_NS_PER_BLOCK,
            blocks_per_sm: 0,
            noise_pct: 0,
            noise_seed: 1,
        }
    }
}

/// One process's record on a device.
#[repr(C)]
#[derive(Debug)]
struct Slot {
    pid: AtomicU64,
    enqueued: AtomicU64,
    last_end: AtomicU64,
    launches: AtomicU64,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            pid: AtomicU64::new(0),
            enqueued: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            launches: AtomicU64::new(0),
        }
    }

    /// Work of this process completed by `now`, ns.
    fn completed(&self, now: u64) -> u64 {
        let enqueued = self.enqueued.load(Ordering::Acquire);
        let pending = self.last_end.load(Ordering::Acquire).saturating_sub(now);
        enqueued.saturating_sub(pending)
    }
}

/// The file's layout, as it sits in the mapping.
#[repr(C)]
#[derive(Debug)]
struct Shared {
    magic: AtomicU64,
    version: AtomicU32,
    slots: AtomicU32,
    busy_until: AtomicU64,
    enqueued: AtomicU64,
    _reserved: [AtomicU64; 4],
    slot: [Slot; SLOTS],
}

const _: () = assert!(std::mem::size_of::<Shared>() == FILE_BYTES);
const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_BYTES);

impl Shared {
    fn new() -> Shared {
        Shared {
            magic: AtomicU64::new(MAGIC),
            version: AtomicU32::new(VERSION),
            slots: AtomicU32::new(SLOTS as u32),
            busy_until: AtomicU64::new(0),
            enqueued: AtomicU64::new(0),
            _reserved: [const { AtomicU64::new(0) }; 4],
            slot: [const { Slot::new() }; SLOTS],
        }
    }
}

/// One device's timeline, as this process uses it.
#[derive(Debug)]
pub struct Timeline {
    shared: &'static Shared,
    /// This process's slot, taken at its first launch.
    own: OnceLock<&'static Slot>,
    cost: CostModel,
    /// Blocks per wave (SMs × blocks per SM); 0: no waves.
    wave_blocks: u64,
    /// Noise draws so far (the generator's counter).
    draws: AtomicU64,
    /// Seed of this device's noise.
    seed: u64,
    /// Percent by which the reported busy time is off.
    bias_pct: i64,
    /// The shared file, if any.
    path: Option<PathBuf>,
}

impl Default for Timeline {
    /// A timeline of the process's own with the default (linear) cost.
    fn default() -> Timeline {
        Timeline::local(CostModel::default(), 0)
    }
}

impl Timeline {
    /// A timeline in this process's memory only, for a device of `sms` SMs.
    pub fn local(cost: CostModel, sms: u32) -> Timeline {
        Timeline::with(Box::leak(Box::new(Shared::new())), None, cost, sms, 0, 0)
    }

    /// The timeline of `spec` as `config` says: shared through the node's
    /// file when a node is served, else (or when the file cannot be used,
    /// with one line on stderr) the process's own.
    pub fn for_device(config: &Config, spec: &DeviceSpec) -> Timeline {
        let key = file_name(spec.nvml_index, spec.mig);
        let seed = tessera_sim::ids::fnv1a64(key.as_bytes());
        let shared = config.node_root.as_deref().map(|root| {
            let path = root.join(TIMELINE_DIR).join(&key);
            (map_shared(&path), path)
        });
        let (shared, path) = match shared {
            Some((Ok(shared), path)) => (shared, Some(path)),
            Some((Err(e), path)) => {
                eprintln!(
                    "tessera-sim-cuda: cannot share the device timeline {}: {e}; this process's kernels run on a clock of their own",
                    path.display()
                );
                (&*Box::leak(Box::new(Shared::new())), None)
            }
            None => (&*Box::leak(Box::new(Shared::new())), None),
        };
        Timeline::with(
            shared,
            path,
            config.cost,
            spec.sm_count,
            seed,
            config.util_bias_pct,
        )
    }

    fn with(
        shared: &'static Shared,
        path: Option<PathBuf>,
        cost: CostModel,
        sms: u32,
        seed: u64,
        bias_pct: i64,
    ) -> Timeline {
        Timeline {
            shared,
            own: OnceLock::new(),
            wave_blocks: u64::from(sms).saturating_mul(cost.blocks_per_sm),
            cost,
            draws: AtomicU64::new(0),
            seed: seed ^ cost.noise_seed,
            bias_pct,
            path,
        }
    }

    /// The shared file this timeline lives in, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Device time of a launch of `blocks` blocks under the cost model.
    #[inline]
    pub fn cost_of(&self, blocks: u64) -> u64 {
        let c = &self.cost;
        let blocks = match self.wave_blocks {
            0 => blocks,
            wave => blocks.div_ceil(wave).saturating_mul(wave),
        };
        let base = c
            .launch_ns
            .saturating_add(blocks.saturating_mul(c.ns_per_block));
        if c.noise_pct == 0 || base == 0 {
            return base;
        }
        let draw = self.draws.fetch_add(1, Ordering::Relaxed);
        let unit = (splitmix64(self.seed ^ draw.wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 11) as f64
            / (1u64 << 53) as f64;
        let factor = 1.0 + (c.noise_pct as f64 / 100.0) * (2.0 * unit - 1.0);
        (base as f64 * factor).round() as u64
    }

    /// Enqueues a launch of `blocks` blocks; blocks while the queue is too deep.
    #[inline]
    pub fn launch(&self, blocks: u64) {
        self.enqueue(self.cost_of(blocks));
    }

    /// Enqueues `cost_ns` of work; blocks while the queue is too deep.
    #[inline]
    pub fn enqueue(&self, cost_ns: u64) {
        if cost_ns == 0 {
            return;
        }
        let own = self.own();
        let now = clock::monotonic_ns();
        let busy_until = &self.shared.busy_until;
        let mut current = busy_until.load(Ordering::Relaxed);
        let end = loop {
            let end = current.max(now).saturating_add(cost_ns);
            match busy_until.compare_exchange_weak(
                current,
                end,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break end,
                Err(seen) => current = seen,
            }
        };
        // After the CAS, and the end before the amount: a reader between
        // them sees the work as still ahead, never as done early.
        own.last_end.fetch_max(end, Ordering::AcqRel);
        own.enqueued.fetch_add(cost_ns, Ordering::AcqRel);
        own.launches.fetch_add(1, Ordering::Relaxed);
        self.shared.enqueued.fetch_add(cost_ns, Ordering::AcqRel);
        let backlog = end - now;
        if backlog > QUEUE_DEPTH_NS {
            std::thread::sleep(Duration::from_nanos(backlog - QUEUE_DEPTH_NS));
        }
    }

    /// This process's slot, taken on first use.
    fn own(&self) -> &'static Slot {
        self.own
            .get_or_init(|| claim(self.shared, publish::host_pid()))
    }

    /// Blocks until all work this process enqueued so far is done.
    pub fn wait_idle(&self) {
        let Some(own) = self.own.get() else {
            return;
        };
        loop {
            let now = clock::monotonic_ns();
            let until = own.last_end.load(Ordering::Acquire);
            if until <= now {
                return;
            }
            std::thread::sleep(Duration::from_nanos(until - now));
        }
    }

    /// Device time this process's work completed by monotonic time `now`.
    pub fn completed_ns(&self, now: u64) -> u64 {
        self.own.get().map_or(0, |own| own.completed(now))
    }

    /// The busy time this process reports for NVML (what it publishes):
    /// [`Timeline::completed_ns`], scaled by 100 + the configured bias
    /// percent (`TESSERA_SIM_CUDA_UTIL_BIAS_PCT`; 0 without one).
    pub fn busy_ns(&self, now: u64) -> u64 {
        let busy = self.completed_ns(now);
        if self.bias_pct == 0 {
            return busy;
        }
        let scaled = u128::from(busy) * (100 + self.bias_pct).max(0) as u128 / 100;
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// Device time of every process's work completed by `now`.
    pub fn device_busy_ns(&self, now: u64) -> u64 {
        let enqueued = self.shared.enqueued.load(Ordering::Acquire);
        let pending = self
            .shared
            .busy_until
            .load(Ordering::Acquire)
            .saturating_sub(now);
        enqueued.saturating_sub(pending)
    }

    /// Work still queued on the device at `now`, in ns.
    pub fn backlog_ns(&self, now: u64) -> u64 {
        self.shared
            .busy_until
            .load(Ordering::Acquire)
            .saturating_sub(now)
    }
}

/// The file name of a device's timeline.
pub fn file_name(gpu: u32, mig: Option<(u32, u32)>) -> String {
    match mig {
        None => format!("gpu{gpu}"),
        Some((gi, ci)) => format!("gpu{gpu}-gi{gi}-ci{ci}"),
    }
}

/// A free slot for `pid`, or (all taken) one of this process's own that no
/// reader sees.
fn claim(shared: &'static Shared, pid: u32) -> &'static Slot {
    let pid = u64::from(pid);
    for slot in &shared.slot {
        if slot
            .pid
            .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return slot;
        }
    }
    Box::leak(Box::new(Slot::new()))
}

/// Opens (creating it and its directory if need be) and maps the file at
/// `path`; refuses a file of another size, magic or version.
fn map_shared(path: &Path) -> io::Result<&'static Shared> {
    if let Some(dir) = path.parent()
        && !dir.is_dir()
    {
        std::fs::create_dir_all(dir)?;
        // Any user's process may launch; the util directory is the same.
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .mode(0o666)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let len = file.metadata()?.len();
    if len == 0 {
        // Zero-filled is an empty timeline; racing creators size it alike.
        file.set_len(FILE_BYTES as u64)?;
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
    } else if len != FILE_BYTES as u64 {
        return Err(io::Error::other(format!(
            "{len} bytes, not a timeline of {FILE_BYTES}"
        )));
    }
    // Kept for the life of the process: the driver lives as long.
    let map = SharedMap::new(file, FILE_BYTES)?.leak();
    // SAFETY: the mapping is FILE_BYTES long, page-aligned and never
    // unmapped, so the reference is valid for 'static; Shared is
    // repr(C), FILE_BYTES in size, made of atomics only (valid for any bit
    // pattern, zero included), and every process accesses it atomically.
    let shared: &'static Shared = unsafe { &*map.cast::<Shared>() };
    // Only a blank file is stamped: version and slot count first (the same
    // values from every process), the magic last, so a reader ignores the
    // file until it is whole. A file stamped by anyone else is only read.
    let stamped_ours = |shared: &'static Shared| -> io::Result<&'static Shared> {
        let version = shared.version.load(Ordering::Acquire);
        if version == VERSION {
            Ok(shared)
        } else {
            Err(io::Error::other(format!(
                "timeline version {version}, this library writes {VERSION}"
            )))
        }
    };
    match shared.magic.load(Ordering::Acquire) {
        MAGIC => stamped_ours(shared),
        0 => {
            shared.version.store(VERSION, Ordering::Release);
            shared.slots.store(SLOTS as u32, Ordering::Release);
            match shared
                .magic
                .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => Ok(shared),
                Err(MAGIC) => stamped_ours(shared),
                Err(other) => Err(io::Error::other(format!(
                    "magic {other:#018x} is not a Tessera timeline's"
                ))),
            }
        }
        other => Err(io::Error::other(format!(
            "magic {other:#018x} is not a Tessera timeline's"
        ))),
    }
}

/// SplitMix64: a well-mixed u64 from a counter.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear() -> Timeline {
        Timeline::local(CostModel::default(), 132)
    }

    #[test]
    fn work_runs_back_to_back_and_completes_in_time() {
        let t = linear();
        let start = clock::monotonic_ns();
        t.enqueue(1_000_000);
        t.enqueue(1_000_000);
        let now = clock::monotonic_ns();
        assert!(t.backlog_ns(now) > 1_000_000, "two launches queue up");
        assert!(t.completed_ns(now) <= now - start + 1);
        t.wait_idle();
        let end = clock::monotonic_ns();
        assert_eq!(t.completed_ns(end), 2_000_000);
        assert_eq!(t.device_busy_ns(end), 2_000_000);
        assert!(end - start >= 2_000_000);
    }

    #[test]
    fn a_deep_queue_blocks_the_caller() {
        let t = linear();
        let start = clock::monotonic_ns();
        t.enqueue(20_000_000);
        let waited = clock::monotonic_ns() - start;
        assert!(
            waited >= 15_000_000 - 1_000_000,
            "blocked only {waited} ns for 20 ms of work"
        );
        assert!(t.backlog_ns(clock::monotonic_ns()) <= QUEUE_DEPTH_NS);
    }

    #[test]
    fn free_launches_cost_nothing() {
        let t = Timeline::local(
            CostModel {
                ns_per_block: 0,
                ..CostModel::default()
            },
            132,
        );
        t.launch(1000);
        assert_eq!(t.completed_ns(clock::monotonic_ns()), 0);
        assert!(t.own.get().is_none(), "a free launch takes no slot");
    }

    #[test]
    fn kernel_cost_is_overhead_plus_whole_waves() {
        let t = Timeline::local(
            CostModel {
                launch_ns: 5_000,
                ns_per_block: 100,
                blocks_per_sm: 2,
                ..CostModel::default()
            },
            10,
        );
        // Waves of 20 blocks: 1 block costs a whole wave, 21 two.
        assert_eq!(t.cost_of(1), 5_000 + 2_000);
        assert_eq!(t.cost_of(20), 5_000 + 2_000);
        assert_eq!(t.cost_of(21), 5_000 + 4_000);
        assert_eq!(linear().cost_of(21), 21_000, "the default stays linear");
    }

    #[test]
    fn noise_stays_within_its_bounds_and_averages_out() {
        let t = Timeline::local(
            CostModel {
                noise_pct: 20,
                ..CostModel::default()
            },
            132,
        );
        let costs: Vec<u64> = (0..10_000).map(|_| t.cost_of(100)).collect();
        assert!(costs.iter().all(|&c| (80_000..=120_000).contains(&c)));
        let mean = costs.iter().sum::<u64>() as f64 / costs.len() as f64;
        assert!((mean - 100_000.0).abs() < 1_000.0, "mean {mean}");
        assert!(costs.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn a_bias_scales_the_report_not_the_record() {
        let shared = Box::leak(Box::new(Shared::new()));
        let t = Timeline::with(shared, None, CostModel::default(), 132, 0, -20);
        t.enqueue(1_000_000);
        t.wait_idle();
        let now = clock::monotonic_ns();
        assert_eq!(t.completed_ns(now), 1_000_000);
        assert_eq!(t.busy_ns(now), 800_000);
    }

    #[test]
    fn processes_on_one_file_share_one_clock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(TIMELINE_DIR).join("gpu0");
        let a = map_shared(&path).expect("map");
        let b = map_shared(&path).expect("map again");
        assert_eq!(
            std::fs::metadata(&path).expect("file").len(),
            FILE_BYTES as u64
        );
        // Two "processes" (two mappings, two slots) each enqueue 2 ms.
        let ta = Timeline::with(a, None, CostModel::default(), 132, 0, 0);
        let tb = Timeline::with(b, None, CostModel::default(), 132, 0, 0);
        ta.own.set(claim(a, 1)).expect("fresh");
        tb.own.set(claim(b, 2)).expect("fresh");
        let start = clock::monotonic_ns();
        ta.enqueue(2_000_000);
        tb.enqueue(2_000_000);
        assert!(
            tb.backlog_ns(clock::monotonic_ns()) > 3_000_000,
            "b's work queues behind a's"
        );
        tb.wait_idle();
        let end = clock::monotonic_ns();
        assert!(end - start >= 4_000_000, "serialized: {} ns", end - start);
        assert_eq!(ta.device_busy_ns(end), 4_000_000);
        assert_eq!(ta.completed_ns(end), 2_000_000);
        assert_eq!(tb.completed_ns(end), 2_000_000);
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(&bytes[..8], b"TCTLINE1");
        let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        assert_eq!(word(24), 4_000_000, "device total");
        assert_eq!((word(64), word(72)), (1, 2_000_000), "slot 0: pid 1");
        assert_eq!((word(96), word(104)), (2, 2_000_000), "slot 1: pid 2");
    }

    #[test]
    fn a_file_that_is_not_a_timeline_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("gpu0");
        std::fs::write(&path, b"not a timeline").expect("write");
        assert!(map_shared(&path).is_err());
        let foreign = vec![0xffu8; FILE_BYTES];
        std::fs::write(&path, &foreign).expect("write");
        assert!(map_shared(&path).is_err());
        assert!(
            std::fs::read(&path).expect("read") == foreign,
            "a refused file is left as it was"
        );
        // Our magic, another version: refused, and not rewritten.
        let mut other_version = vec![0u8; FILE_BYTES];
        other_version[..8].copy_from_slice(&MAGIC.to_ne_bytes());
        other_version[8..12].copy_from_slice(&(VERSION + 1).to_ne_bytes());
        std::fs::write(&path, &other_version).expect("write");
        assert!(map_shared(&path).is_err());
        assert!(
            std::fs::read(&path).expect("read") == other_version,
            "a timeline of another version is left as it was"
        );
    }
}
