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

    /// Bytes this process has charged on `device`.
    pub fn process_used(&self, device: usize) -> u64 {
        match (self.current_slot(), device < MAX_DEVICES) {
            (Some(slot), true) => slot.used[device].load(Ordering::Relaxed),
            _ => 0,
        }
    }
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
}
