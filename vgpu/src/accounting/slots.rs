//! Slot ownership: a slot belongs to whoever holds the open-file-description
//! lock on its first byte; claiming a slot and testing its owner for life
//! are the same non-blocking call.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use super::fork::{
    FORK_GENERATION, current_pid, give_child_its_own_description, own_start_time, pid_namespace,
};
use super::layout::{self, Slot};
use super::usage::saturating_sub;
use super::{NO_SLOT, SharedRegion};

/// The byte whose lock owns slot `index`.
pub(super) fn slot_offset(index: usize) -> i64 {
    (layout::SLOTS + index * layout::SLOT_SIZE) as i64
}

/// Takes (`F_WRLCK`) or drops (`F_UNLCK`) the OFD lock on slot `index`'s
/// byte, never waiting; `false` when another open file description holds a
/// conflicting lock (or the call failed).
pub(super) fn slot_lock(fd: i32, index: usize, kind: i32) -> bool {
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

impl SharedRegion {
    /// Whether this process holds a slot (it does unless all
    /// [`MAX_PROCESSES`](super::MAX_PROCESSES) are held by live processes;
    /// without one, its usage cannot be reclaimed if it dies).
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

    /// This process's slot for the current fork generation, registering
    /// first if this is a forked child.
    #[inline]
    pub(super) fn current_slot(&self) -> Option<&Slot> {
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
    pub(super) fn claim_slot(&self) -> u32 {
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

#[cfg(test)]
mod tests {
    use super::super::test_support::{temp_path, temp_region};
    use super::*;

    #[test]
    fn a_slot_whose_lock_is_free_is_reclaimed_whatever_its_pid() {
        let (_dir, region) = temp_region("dead", 1);
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
