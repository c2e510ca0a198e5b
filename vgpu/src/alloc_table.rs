//! Live device allocations of this process: device pointer → (device, bytes,
//! kind), for the free paths to know what to uncharge.
//!
//! 64 shards chosen by a hash of the pointer, each a small spin lock around a
//! `HashMap` with a multiply-fold hasher: O(1) whatever the number of live
//! allocations, no global lock, no allocation on the hot path beyond the maps'
//! own growth. The process-wide table ([`global`]) is fork-safe: a
//! `pthread_atfork` handler takes every shard before `fork` and releases them
//! after, in parent and child, so a child never inherits a shard locked by a
//! thread that no longer exists.

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Number of shards (a power of two).
pub const SHARDS: usize = 64;

/// What the table records of one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Entry {
    /// Bytes charged for it.
    pub bytes: u64,
    /// The accounting device index it was charged to.
    pub device: u32,
    /// The interception layer's tag (which API allocated it, and so which
    /// free path and counter it belongs to); opaque here.
    pub kind: u8,
    /// What the allocation's life is bound to (a context, a pool), as the
    /// interception layer names it; 0 for nothing. Opaque here.
    pub owner: u64,
}

/// A device-pointer → [`Entry`] map, sharded for concurrent use.
pub struct AllocTable {
    shards: [Shard; SHARDS],
}

type Map = HashMap<u64, Entry, BuildHasherDefault<PtrHasher>>;

#[repr(align(64))]
struct Shard {
    locked: AtomicBool,
    map: UnsafeCell<Map>,
}

// SAFETY: `map` is only reached through `ShardGuard`, which exists only while
// `locked` is held (acquire on lock, release on unlock), so one thread at a
// time touches each map; `Entry` and `u64` are `Send`.
unsafe impl Sync for AllocTable {}

struct ShardGuard<'a> {
    shard: &'a Shard,
}

impl Shard {
    const fn new() -> Shard {
        Shard {
            locked: AtomicBool::new(false),
            map: UnsafeCell::new(HashMap::with_hasher(BuildHasherDefault::new())),
        }
    }

    #[inline]
    fn lock(&self) -> ShardGuard<'_> {
        if self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_contended(None);
        }
        ShardGuard { shard: self }
    }

    /// Spins, then yields, until the lock is taken; with a deadline, gives up
    /// at it and returns `false`.
    #[cold]
    fn lock_contended(&self, deadline: Option<Instant>) -> bool {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 100 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return false;
                    }
                    std::thread::yield_now();
                }
            }
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return true;
            }
        }
    }

    fn unlock(&self) {
        self.locked.store(false, Ordering::Release);
    }
}

impl std::ops::Deref for ShardGuard<'_> {
    type Target = Map;

    fn deref(&self) -> &Map {
        // SAFETY: the guard holds the shard's lock, so no other reference to
        // the map exists (see `unsafe impl Sync`).
        unsafe { &*self.shard.map.get() }
    }
}

impl std::ops::DerefMut for ShardGuard<'_> {
    fn deref_mut(&mut self) -> &mut Map {
        // SAFETY: as in `deref`; `&mut self` makes this the only borrow.
        unsafe { &mut *self.shard.map.get() }
    }
}

impl Drop for ShardGuard<'_> {
    fn drop(&mut self) {
        self.shard.unlock();
    }
}

/// Multiply-fold mixing: the 128-bit product of the key and an odd constant,
/// high half XOR low half. Device pointers are 512-byte aligned or more, so
/// plain multiplication would leave the low bits (the map's bucket index)
/// zero; folding brings the high bits down.
#[inline]
fn mix(x: u64) -> u64 {
    let product = u128::from(x) * 0x9E37_79B9_7F4A_7C15_u128;
    (product as u64) ^ ((product >> 64) as u64)
}

/// The maps' hasher: a multiply-fold of the pointer (one 64×64→128-bit
/// multiplication, high half XOR low half).
#[derive(Default, Clone, Copy)]
pub struct PtrHasher {
    state: u64,
}

impl Hasher for PtrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.state = mix(self.state ^ value);
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut eight = [0u8; 8];
            eight[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(eight));
        }
    }
}

/// The shard of a pointer: bits of the mixed value the maps do not use for
/// their own bucket index (low bits) or tag (top 7 bits).
#[inline]
fn shard_of(ptr: u64) -> usize {
    ((mix(ptr) >> 32) as usize) & (SHARDS - 1)
}

impl AllocTable {
    /// An empty table; allocates nothing until the first insert.
    pub const fn new() -> AllocTable {
        AllocTable {
            shards: [const { Shard::new() }; SHARDS],
        }
    }

    /// Records a live allocation. Returns the entry it replaces, if the
    /// pointer was already recorded (a free the layer missed: uncharge it).
    #[inline]
    pub fn insert(&self, ptr: u64, device: u32, bytes: u64, kind: u8) -> Option<Entry> {
        self.insert_entry(
            ptr,
            Entry {
                bytes,
                device,
                kind,
                owner: 0,
            },
        )
    }

    /// [`AllocTable::insert`] with the whole entry (an owner).
    #[inline]
    pub fn insert_entry(&self, ptr: u64, entry: Entry) -> Option<Entry> {
        self.shards[shard_of(ptr)].lock().insert(ptr, entry)
    }

    /// Takes out every entry `pred` selects (shard by shard) and returns
    /// them: what a destroyed context or a reset device took with it. Walks
    /// the whole table; for the rare teardown paths only.
    pub fn drain(&self, mut pred: impl FnMut(u64, &Entry) -> bool) -> Vec<(u64, Entry)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            let mut map = shard.lock();
            map.retain(|&ptr, entry| {
                if pred(ptr, entry) {
                    out.push((ptr, *entry));
                    false
                } else {
                    true
                }
            });
        }
        out
    }

    /// Forgets an allocation and returns what was recorded, or `None` for a
    /// pointer the table does not know (allocated before interception, or
    /// through an API that is not counted: pass the free through).
    #[inline]
    pub fn remove(&self, ptr: u64) -> Option<Entry> {
        self.shards[shard_of(ptr)].lock().remove(&ptr)
    }

    /// What is recorded for `ptr`.
    #[inline]
    pub fn get(&self, ptr: u64) -> Option<Entry> {
        self.shards[shard_of(ptr)].lock().get(&ptr).copied()
    }

    /// Live allocations recorded (shard by shard, so only a snapshot under
    /// concurrent use).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| s.lock().is_empty())
    }

    /// Bytes recorded per device index (for reports; walks every shard).
    pub fn bytes_by_device(&self) -> Vec<(u32, u64)> {
        let mut totals: Vec<(u32, u64)> = Vec::new();
        for shard in &self.shards {
            for entry in shard.lock().values() {
                match totals.iter_mut().find(|(d, _)| *d == entry.device) {
                    Some((_, bytes)) => *bytes = bytes.saturating_add(entry.bytes),
                    None => totals.push((entry.device, entry.bytes)),
                }
            }
        }
        totals.sort_unstable();
        totals
    }
}

impl Default for AllocTable {
    fn default() -> Self {
        AllocTable::new()
    }
}

// ---------------------------------------------------------------------------
// The process-wide table
// ---------------------------------------------------------------------------

static GLOBAL: AllocTable = AllocTable::new();

/// Shards the pre-fork handler took (bit i = shard i), for the post-fork handlers.
static HELD_FOR_FORK: AtomicU64 = AtomicU64::new(0);

/// How long the pre-fork handler waits for one shard before giving up on it
/// (a thread that forked from a signal handler inside a shard's lock).
const FORK_LOCK_TIMEOUT: Duration = Duration::from_millis(200);

/// The process's table of live allocations (fork-safe; see module docs).
#[inline]
pub fn global() -> &'static AllocTable {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // SAFETY: registers plain `extern "C"` functions without captured
        // state that touch only statics; the library is never unloaded
        // (ld.so.preload), so they outlive the registration.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork),
                Some(after_fork_parent),
                Some(after_fork_child),
            );
        }
    });
    &GLOBAL
}

extern "C" fn before_fork() {
    let mut held = 0u64;
    for (i, shard) in GLOBAL.shards.iter().enumerate() {
        let taken = shard
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
            || shard.lock_contended(Some(Instant::now() + FORK_LOCK_TIMEOUT));
        if taken {
            held |= 1 << i;
        }
    }
    HELD_FOR_FORK.store(held, Ordering::Relaxed);
}

extern "C" fn after_fork_parent() {
    let held = HELD_FOR_FORK.swap(0, Ordering::Relaxed);
    for (i, shard) in GLOBAL.shards.iter().enumerate() {
        if held & (1 << i) != 0 {
            shard.unlock();
        }
    }
}

extern "C" fn after_fork_child() {
    let held = HELD_FOR_FORK.swap(0, Ordering::Relaxed);
    for (i, shard) in GLOBAL.shards.iter().enumerate() {
        if held & (1 << i) == 0 {
            // Some thread of the parent held this shard through the fork; its
            // map may be half-updated. The child is single-threaded now:
            // abandon that map (leaked, never read) for an empty one.
            // SAFETY: the only thread of the child is running this handler,
            // and no guard of this shard exists on its stack (the pre-fork
            // handler would have taken it otherwise), so nothing else
            // references the map; `write` does not drop the old value.
            unsafe {
                std::ptr::write(
                    shard.map.get(),
                    HashMap::with_hasher(BuildHasherDefault::new()),
                );
            }
        }
        shard.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_takes_out_exactly_what_is_selected() {
        let table = AllocTable::new();
        for i in 0..100u64 {
            table.insert_entry(
                0x1000 + (i << 12),
                Entry {
                    bytes: i,
                    device: 0,
                    kind: 0,
                    owner: i % 3,
                },
            );
        }
        let mut gone = table.drain(|_, e| e.owner == 1);
        gone.sort_unstable_by_key(|(ptr, _)| *ptr);
        assert_eq!(gone.len(), 33);
        assert!(gone.iter().all(|(_, e)| e.owner == 1));
        assert_eq!(table.len(), 67);
        assert!(table.drain(|_, e| e.owner == 1).is_empty(), "once only");
    }

    #[test]
    fn insert_get_remove() {
        let table = AllocTable::new();
        assert!(table.is_empty());
        assert_eq!(table.insert(0x7f00_0000_0000, 1, 4096, 2), None);
        assert_eq!(
            table.get(0x7f00_0000_0000),
            Some(Entry {
                bytes: 4096,
                device: 1,
                kind: 2,
                owner: 0
            })
        );
        let replaced = table.insert(0x7f00_0000_0000, 1, 8192, 2);
        assert_eq!(
            replaced.map(|e| e.bytes),
            Some(4096),
            "a missed free shows up"
        );
        assert_eq!(table.len(), 1);
        assert_eq!(table.remove(0x7f00_0000_0000).map(|e| e.bytes), Some(8192));
        assert_eq!(table.remove(0x7f00_0000_0000), None);
        assert!(table.is_empty());
    }

    #[test]
    fn aligned_pointers_spread_over_shards_and_buckets() {
        // 4096 allocations of 2 MiB, as the driver hands them out.
        let base = 0x7f12_0000_0000_u64;
        let mut per_shard = [0usize; SHARDS];
        let mut low_bits = std::collections::HashSet::new();
        for i in 0..4096u64 {
            let ptr = base + i * (2 << 20);
            per_shard[shard_of(ptr)] += 1;
            low_bits.insert(mix(ptr) & 0xfff);
        }
        let (min, max) = (
            per_shard.iter().min().copied().unwrap_or(0),
            per_shard.iter().max().copied().unwrap_or(0),
        );
        assert!(
            min >= 32 && max <= 100,
            "shards from {min} to {max} of mean 64"
        );
        assert!(
            low_bits.len() > 2500,
            "bucket bits: {} distinct of 4096",
            low_bits.len()
        );
    }

    #[test]
    fn concurrent_threads_keep_every_entry() {
        let table = AllocTable::new();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let table = &table;
                s.spawn(move || {
                    for i in 0..10_000u64 {
                        let ptr = (t << 40) | (i << 9);
                        assert_eq!(table.insert(ptr, t as u32, i, 0), None);
                        if i % 2 == 0 {
                            assert_eq!(table.remove(ptr).map(|e| e.bytes), Some(i));
                        }
                    }
                });
            }
        });
        assert_eq!(table.len(), 4 * 5_000);
        let by_device = table.bytes_by_device();
        let odd_sum: u64 = (0..10_000u64).filter(|i| i % 2 == 1).sum();
        assert_eq!(by_device, (0..4).map(|d| (d, odd_sum)).collect::<Vec<_>>());
    }

    #[test]
    fn global_table_survives_fork_with_a_busy_thread() {
        let table = global();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    table.insert(0x5000_0000_0000 + (i << 9), 0, 1, 0);
                    table.remove(0x5000_0000_0000 + (i << 9));
                    i = (i + 1) % 100_000;
                }
            });
            for _ in 0..20 {
                // SAFETY: the child calls only the table (spin locks, no
                // allocation on remove of an absent key... and insert may
                // allocate, which glibc allows after fork) and then `_exit`.
                let pid = unsafe { libc::fork() };
                assert!(pid >= 0, "fork failed");
                if pid == 0 {
                    let t = global();
                    t.insert(0x6000_0000_0000, 0, 1, 0);
                    let ok = t.remove(0x6000_0000_0000).is_some();
                    // SAFETY: terminates the child without running the parent's
                    // atexit handlers or test harness.
                    unsafe { libc::_exit(if ok { 0 } else { 1 }) };
                }
                let mut status = 0;
                // SAFETY: waits for the child just forked; `status` is a valid out-pointer.
                let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
                assert_eq!(waited, pid);
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "child failed"
                );
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}
