//! Usage: charges (one compare-and-swap on the device total, then the
//! process's own slot), uncharges (the slot first, then the total, both
//! saturating), and reads — all lock-free, from the mapping.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{MAX_DEVICES, SharedRegion};

impl SharedRegion {
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

    /// What the node monitor last published for `device` (all zero, stamp
    /// included, where none was: an older node, or no monitor). The stamp is
    /// read first (acquire; the monitor stores it last).
    pub fn published(&self, device: usize) -> tessera_model::vgpu_region::Published {
        let Some(entry) = self.layout().devices.get(device) else {
            return tessera_model::vgpu_region::Published::default();
        };
        let at_ms = entry.published_ms.load(Ordering::Acquire);
        tessera_model::vgpu_region::Published {
            sm_permille: entry.sm_permille.load(Ordering::Relaxed),
            processes: entry.processes.load(Ordering::Relaxed),
            at_ms,
            nvml_used: entry.nvml_used.load(Ordering::Relaxed),
        }
    }

    /// Bytes this process has charged on `device`.
    pub fn process_used(&self, device: usize) -> u64 {
        match (self.current_slot(), device < MAX_DEVICES) {
            (Some(slot), true) => slot.used[device].load(Ordering::Relaxed),
            _ => 0,
        }
    }
}

/// `CLOCK_MONOTONIC` now, in milliseconds: the clock the node monitor
/// stamps its published figures with (`tessera_model::vgpu_region`).
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1000) + (ts.tv_nsec as u64) / 1_000_000
}

/// Subtracts `bytes`, stopping at 0; returns the value before.
#[inline]
pub(super) fn saturating_sub(counter: &AtomicU64, bytes: u64) -> u64 {
    match counter.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        Some(v.saturating_sub(bytes))
    }) {
        Ok(before) | Err(before) => before,
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::temp_region;
    use super::*;

    #[test]
    fn charge_stops_at_the_limit_and_uncharge_saturates() {
        let (_dir, region) = temp_region("limit", 2);
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
    fn published_figures_are_read_at_the_models_offsets() {
        use tessera_model::vgpu_region as model;
        let (_dir, region) = temp_region("published", 2);
        assert_eq!(region.published(1), model::Published::default(), "none yet");
        // Write as the node monitor does: raw bytes at the model's offsets.
        let base = region.layout.as_ptr().cast::<u8>();
        let at = |off: usize| {
            // SAFETY: off is inside the mapping (the model's offsets within
            // SIZE) and naturally aligned for the field's atomic.
            unsafe { base.add(model::device_offset(1) + off) }
        };
        // SAFETY: as above; atomics of the field's size at aligned offsets.
        unsafe {
            (*at(model::DEVICE_SM_PERMILLE).cast::<std::sync::atomic::AtomicU32>())
                .store(305, Ordering::Relaxed);
            (*at(model::DEVICE_PROCESSES).cast::<std::sync::atomic::AtomicU32>())
                .store(2, Ordering::Relaxed);
            (*at(model::DEVICE_NVML_USED).cast::<AtomicU64>()).store(4096, Ordering::Relaxed);
            (*at(model::DEVICE_PUBLISHED_MS).cast::<AtomicU64>()).store(77, Ordering::Release);
        }
        assert_eq!(
            region.published(1),
            model::Published {
                sm_permille: 305,
                processes: 2,
                at_ms: 77,
                nvml_used: 4096
            }
        );
        assert_eq!(region.published(0), model::Published::default());
        assert_eq!(region.published(MAX_DEVICES), model::Published::default());
    }
}
