//! The scheduling queue: pods wait in order (higher `spec.priority` first,
//! then creation time, then arrival). As in kube-scheduler, a pod the
//! scheduler's own filters rejected is parked as unschedulable until the
//! cluster changes in a way that may let it fit (a node added or changed, a
//! pod deleted or finished, the pod itself updated), or at the latest after
//! [`MAX_IN_UNSCHEDULABLE`]; a pod that failed otherwise (an error, or only
//! extenders rejected it) waits out a back-off (initial, doubling to a
//! maximum), cut short by the same changes. A change seen while a pod is
//! being tried counts too: that pod is retried at once.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use tokio::time::Instant;

/// How long a pod stays parked as unschedulable with no cluster change
/// (kube-scheduler's podMaxInUnschedulablePodsDuration).
pub const MAX_IN_UNSCHEDULABLE: Duration = Duration::from_secs(5 * 60);

/// Where a pod sorts: priority (higher first), creation time, arrival.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Order {
    /// Negated `spec.priority`, so that higher priorities sort first.
    pub neg_priority: i64,
    /// `metadata.creationTimestamp`, seconds.
    pub created: i64,
    /// When the queue first saw it.
    pub arrival: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Active,
    InFlight { cycle: u64 },
    BackingOff { until: Instant },
    Unschedulable { until: Instant },
}

impl State {
    /// Waiting for a cluster change or a deadline.
    fn waiting(&self) -> Option<Instant> {
        match self {
            State::BackingOff { until } | State::Unschedulable { until } => Some(*until),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    order: Order,
    state: State,
    attempts: u32,
}

/// The queue of pods to schedule, keyed by pod uid.
#[derive(Debug)]
pub struct SchedulingQueue {
    entries: HashMap<String, Entry>,
    active: BTreeSet<(Order, String)>,
    arrivals: u64,
    move_cycle: u64,
    initial_backoff: Duration,
    max_backoff: Duration,
    max_in_unschedulable: Duration,
}

impl SchedulingQueue {
    /// An empty queue with the given back-off bounds.
    pub fn new(initial_backoff: Duration, max_backoff: Duration) -> SchedulingQueue {
        SchedulingQueue {
            entries: HashMap::new(),
            active: BTreeSet::new(),
            arrivals: 0,
            move_cycle: 0,
            initial_backoff,
            max_backoff,
            max_in_unschedulable: MAX_IN_UNSCHEDULABLE,
        }
    }

    /// The same queue, parking unschedulable pods for at most `max`.
    pub fn with_max_in_unschedulable(mut self, max: Duration) -> SchedulingQueue {
        self.max_in_unschedulable = max;
        self
    }

    /// Adds a pod if it is not queued yet (waiting, in flight or backing off).
    pub fn add(&mut self, uid: &str, priority: i32, created: i64) {
        if self.entries.contains_key(uid) {
            return;
        }
        self.arrivals += 1;
        let order = Order {
            neg_priority: -i64::from(priority),
            created,
            arrival: self.arrivals,
        };
        self.active.insert((order.clone(), uid.to_owned()));
        self.entries.insert(
            uid.to_owned(),
            Entry {
                order,
                state: State::Active,
                attempts: 0,
            },
        );
    }

    /// The uids of every queued pod.
    pub fn uids(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// Whether the pod is queued in any state.
    pub fn contains(&self, uid: &str) -> bool {
        self.entries.contains_key(uid)
    }

    /// Forgets a pod (deleted, bound, no longer ours).
    pub fn remove(&mut self, uid: &str) {
        if let Some(e) = self.entries.remove(uid) {
            self.active.remove(&(e.order, uid.to_owned()));
        }
    }

    /// Takes the next pod to try, marking it in flight.
    pub fn pop(&mut self) -> Option<String> {
        let (_, uid) = self.active.pop_first()?;
        if let Some(e) = self.entries.get_mut(&uid) {
            e.state = State::InFlight {
                cycle: self.move_cycle,
            };
        }
        Some(uid)
    }

    /// The pod was scheduled: it leaves the queue.
    pub fn done(&mut self, uid: &str) {
        self.remove(uid);
    }

    /// The attempt failed with an error, or only extenders rejected the
    /// pod: it backs off (1 s, 2 s, 4 s, … up to the maximum), unless the
    /// cluster changed while it was being tried.
    pub fn failed(&mut self, uid: &str, now: Instant) {
        let (initial, max) = (self.initial_backoff, self.max_backoff);
        self.requeue(uid, |attempts| {
            let doublings = attempts.saturating_sub(1).min(16);
            let backoff = initial.saturating_mul(1 << doublings).min(max);
            State::BackingOff {
                until: now + backoff,
            }
        });
    }

    /// The scheduler's own filters rejected the pod: it is parked until a
    /// cluster change ([`Self::move_all_to_active`], [`Self::move_to_active`])
    /// or [`MAX_IN_UNSCHEDULABLE`], unless the cluster changed while it was
    /// being tried.
    pub fn unschedulable(&mut self, uid: &str, now: Instant) {
        let until = now + self.max_in_unschedulable;
        self.requeue(uid, |_| State::Unschedulable { until });
    }

    fn requeue(&mut self, uid: &str, state: impl FnOnce(u32) -> State) {
        let cycle = self.move_cycle;
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        e.attempts = e.attempts.saturating_add(1);
        let changed_meanwhile = matches!(e.state, State::InFlight { cycle: c } if c != cycle);
        if changed_meanwhile {
            e.state = State::Active;
            self.active.insert((e.order.clone(), uid.to_owned()));
            return;
        }
        e.state = state(e.attempts);
    }

    /// The cluster changed: every pod backing off or parked is tried again
    /// now.
    pub fn move_all_to_active(&mut self) {
        self.move_cycle += 1;
        for (uid, e) in &mut self.entries {
            if e.state.waiting().is_some() {
                e.state = State::Active;
                self.active.insert((e.order.clone(), uid.clone()));
            }
        }
    }

    /// The pod itself changed: if it waits, it is tried again now.
    pub fn move_to_active(&mut self, uid: &str) {
        if let Some(e) = self.entries.get_mut(uid)
            && e.state.waiting().is_some()
        {
            e.state = State::Active;
            self.active.insert((e.order.clone(), uid.to_owned()));
        }
    }

    /// Moves pods whose back-off, or longest stay parked, is over to the
    /// waiting line.
    pub fn flush_backoff(&mut self, now: Instant) {
        for (uid, e) in &mut self.entries {
            if e.state.waiting().is_some_and(|until| until <= now) {
                e.state = State::Active;
                self.active.insert((e.order.clone(), uid.clone()));
            }
        }
    }

    /// When the earliest back-off (or stay parked) ends.
    pub fn next_backoff_end(&self) -> Option<Instant> {
        self.entries
            .values()
            .filter_map(|e| e.state.waiting())
            .min()
    }

    /// Whether the pod is parked as unschedulable.
    pub fn is_parked(&self, uid: &str) -> bool {
        self.entries
            .get(uid)
            .is_some_and(|e| matches!(e.state, State::Unschedulable { .. }))
    }

    /// Whether a pod is waiting to be tried now.
    pub fn has_active(&self) -> bool {
        !self.active.is_empty()
    }

    /// How many pods are queued in any state.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no pod is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> SchedulingQueue {
        SchedulingQueue::new(Duration::from_secs(1), Duration::from_secs(10))
    }

    #[test]
    fn fifo_by_priority_creation_and_arrival() {
        let mut q = q();
        q.add("late", 0, 20);
        q.add("early-b", 0, 10);
        q.add("early-a", 0, 10);
        q.add("urgent", 100, 30);
        q.add("early-b", 0, 10); // already queued: no change
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec!["urgent", "early-b", "early-a", "late"]);
        assert_eq!(q.len(), 4, "popped pods stay queued while in flight");
        q.done("urgent");
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn backoff_doubles_to_the_maximum() {
        let mut q = q();
        let t0 = Instant::now();
        q.add("p", 0, 0);
        let mut waits = Vec::new();
        for _ in 0..6 {
            assert_eq!(q.pop().as_deref(), Some("p"));
            q.failed("p", t0);
            let end = q.next_backoff_end().expect("backing off");
            waits.push((end - t0).as_secs());
            assert!(!q.has_active());
            q.flush_backoff(end - Duration::from_millis(1));
            assert!(!q.has_active(), "not before the back-off ends");
            q.flush_backoff(end);
            assert!(q.has_active());
        }
        assert_eq!(waits, vec![1, 2, 4, 8, 10, 10]);
    }

    #[test]
    fn cluster_changes_retry_at_once() {
        let mut q = q();
        let now = Instant::now();
        q.add("a", 0, 0);
        q.add("b", 0, 1);
        assert_eq!(q.pop().as_deref(), Some("a"));
        q.failed("a", now);
        assert_eq!(q.pop().as_deref(), Some("b"));
        // A node changes while b is being tried.
        q.move_all_to_active();
        q.failed("b", now);
        // a was backing off and b failed after the change: both are back.
        assert_eq!(q.pop().as_deref(), Some("a"));
        assert_eq!(q.pop().as_deref(), Some("b"));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn unschedulable_pods_wait_for_a_change_not_a_backoff() {
        let mut q = q();
        let t0 = Instant::now();
        q.add("parked", 0, 0);
        q.add("erred", 0, 1);
        assert_eq!(q.pop().as_deref(), Some("parked"));
        q.unschedulable("parked", t0);
        assert_eq!(q.pop().as_deref(), Some("erred"));
        q.failed("erred", t0);
        assert!(q.is_parked("parked") && !q.is_parked("erred"));
        // Back-offs end; the parked pod stays, up to five minutes.
        q.flush_backoff(t0 + Duration::from_secs(60));
        assert_eq!(q.pop().as_deref(), Some("erred"));
        assert_eq!(q.pop(), None);
        assert_eq!(q.next_backoff_end(), Some(t0 + MAX_IN_UNSCHEDULABLE));
        q.flush_backoff(t0 + MAX_IN_UNSCHEDULABLE - Duration::from_millis(1));
        assert!(!q.has_active());
        q.flush_backoff(t0 + MAX_IN_UNSCHEDULABLE);
        assert_eq!(q.pop().as_deref(), Some("parked"));
        // Parked again: an update of the pod itself, or any cluster change,
        // brings it back at once.
        q.unschedulable("parked", t0);
        q.move_to_active("other");
        assert!(!q.has_active());
        q.move_to_active("parked");
        assert_eq!(q.pop().as_deref(), Some("parked"));
        q.unschedulable("parked", t0);
        q.move_all_to_active();
        assert_eq!(q.pop().as_deref(), Some("parked"));
        // A change while it was tried: not parked at all.
        q.move_all_to_active();
        q.unschedulable("parked", t0);
        assert!(!q.is_parked("parked"));
        assert_eq!(q.pop().as_deref(), Some("parked"));
        // A shorter stay when configured so.
        let mut q = SchedulingQueue::new(Duration::from_secs(1), Duration::from_secs(10))
            .with_max_in_unschedulable(Duration::from_secs(3));
        q.add("p", 0, 0);
        q.pop();
        q.unschedulable("p", t0);
        assert_eq!(q.next_backoff_end(), Some(t0 + Duration::from_secs(3)));
    }

    #[test]
    fn removed_pods_are_gone_in_any_state() {
        let mut q = q();
        q.add("a", 0, 0);
        q.add("b", 0, 0);
        q.remove("a");
        assert_eq!(q.pop().as_deref(), Some("b"));
        q.remove("b");
        q.failed("b", Instant::now());
        assert!(q.is_empty());
        assert_eq!(q.next_backoff_end(), None);
    }
}
