//! The simulated device's work queue.
//!
//! Each device has one timeline: `busy_until`, the monotonic time at which
//! everything enqueued so far is done. A launch costing `c` ns starts at
//! `max(now, busy_until)` and moves `busy_until` to its end. Launches are
//! asynchronous, but like the real launch queue the caller blocks while
//! more than [`QUEUE_DEPTH_NS`] of work is waiting. Synchronising waits for
//! `busy_until`.
//!
//! Busy time completed up to `t` is `enqueued − max(0, busy_until − t)`:
//! everything enqueued, minus the backlog still ahead of `t`, which is one
//! contiguous stretch ending at `busy_until`. The launch path is one
//! compare-and-swap and one add; no lock, no allocation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::clock;

/// Most queued work a launch leaves behind before it blocks its caller.
pub const QUEUE_DEPTH_NS: u64 = 5_000_000;

/// One device's timeline.
#[derive(Debug, Default)]
pub struct Timeline {
    busy_until: AtomicU64,
    enqueued: AtomicU64,
}

impl Timeline {
    /// Enqueues `cost_ns` of work; blocks while the queue is too deep.
    #[inline]
    pub fn enqueue(&self, cost_ns: u64) {
        if cost_ns == 0 {
            return;
        }
        let now = clock::monotonic_ns();
        let mut current = self.busy_until.load(Ordering::Relaxed);
        let end = loop {
            let end = current.max(now).saturating_add(cost_ns);
            match self.busy_until.compare_exchange_weak(
                current,
                end,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break end,
                Err(seen) => current = seen,
            }
        };
        // After the CAS: a reader between the two sees the work as still
        // ahead, never as done early.
        self.enqueued.fetch_add(cost_ns, Ordering::AcqRel);
        let backlog = end - now;
        if backlog > QUEUE_DEPTH_NS {
            std::thread::sleep(Duration::from_nanos(backlog - QUEUE_DEPTH_NS));
        }
    }

    /// Blocks until all work enqueued so far is done.
    pub fn wait_idle(&self) {
        loop {
            let now = clock::monotonic_ns();
            let until = self.busy_until.load(Ordering::Acquire);
            if until <= now {
                return;
            }
            std::thread::sleep(Duration::from_nanos(until - now));
        }
    }

    /// Busy ns completed by monotonic time `now`.
    pub fn busy_ns(&self, now: u64) -> u64 {
        loop {
            let until = self.busy_until.load(Ordering::Acquire);
            let enqueued = self.enqueued.load(Ordering::Acquire);
            if self.busy_until.load(Ordering::Acquire) == until {
                return enqueued.saturating_sub(until.saturating_sub(now));
            }
        }
    }

    /// Work still queued at `now`, in ns.
    pub fn backlog_ns(&self, now: u64) -> u64 {
        self.busy_until.load(Ordering::Acquire).saturating_sub(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_runs_back_to_back_and_completes_in_time() {
        let t = Timeline::default();
        let start = clock::monotonic_ns();
        t.enqueue(1_000_000);
        t.enqueue(1_000_000);
        let now = clock::monotonic_ns();
        assert!(t.backlog_ns(now) > 1_000_000, "two launches queue up");
        assert!(t.busy_ns(now) <= now - start + 1);
        t.wait_idle();
        let end = clock::monotonic_ns();
        assert_eq!(t.busy_ns(end), 2_000_000);
        assert!(end - start >= 2_000_000);
    }

    #[test]
    fn a_deep_queue_blocks_the_caller() {
        let t = Timeline::default();
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
        let t = Timeline::default();
        t.enqueue(0);
        assert_eq!(t.busy_ns(clock::monotonic_ns()), 0);
    }
}
