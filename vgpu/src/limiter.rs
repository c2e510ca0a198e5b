//! The compute (SM) limit: a token bucket per device, refilled at a rate a
//! feedback controller sets from NVML's measured utilization.
//!
//! # Design
//!
//! - **Cost.** A kernel launch costs its grid size in blocks
//!   (`gridDimX × gridDimY × gridDimZ`); a graph launch costs
//!   [`GRAPH_LAUNCH_BLOCKS`] (its kernels are not visible at launch time).
//! - **Bucket.** Tokens are blocks. A launch takes its cost when the bucket
//!   is not in debt (it may drive it negative, so a grid larger than the
//!   bucket still runs, and the launches after it wait for the debt to be
//!   repaid); otherwise it sleeps until the refill covers the debt. The
//!   bucket holds at most [`BURST_SECONDS`] of refill, so idle time does
//!   not bank a burst.
//! - **Watcher.** One thread per process, started by the first launch on a
//!   limited device. Every [`PERIOD`] it reads the SM utilization of the
//!   container's processes on each limited device
//!   (`nvmlDeviceGetProcessUtilization`, summed over the container's pids:
//!   those registered in the shared region, read through its published
//!   layout, and this process) and the blocks this process admitted in the
//!   same window, and sets the refill rate with [`Controller`]. Several
//!   processes of one container each scale their own rate by the
//!   container's utilization, so together they converge on the target.
//! - **Controller** ([`Controller`], [`Horizon`]). Utilization is modelled
//!   as proportional to the admitted block rate (the factor is the device
//!   time per block, re-estimated every period), so the rate that meets the
//!   target is `admitted × target / util`, both measured over the last
//!   half second ([`HORIZON`]). Measuring both over the same horizon makes the
//!   estimate immune to NVML's sampling lag (no oscillation) and makes
//!   bursty workloads (a few long kernels a second) measurable; the rate
//!   moves by at most ×4 per period. Until the first measurement launches
//!   run unthrottled, and the watcher samples every [`FIRST_PERIOD`].
//! - **Pids.** NVML reports host pids. In a container with its own pid
//!   namespace, the container's pids differ, and no sample matches them.
//!   Then the node monitor's figure is used: the device plugin maps NVML's
//!   host pids to allocations on the host and publishes each allocation's
//!   utilization into its accounting region (`tessera_model::vgpu_region`),
//!   stamped with `CLOCK_MONOTONIC`. A figure at most
//!   `vgpu_region::FRESH_MS` old is used when it is new since the last
//!   period (an unchanged one waits for the next publication, as a period
//!   without an NVML sample does). Only when there is no fresh figure (no
//!   monitor, an older node, a time namespace) is the utilization of *all*
//!   processes on the device used, which over-throttles when other tenants
//!   are busy but never lets this container exceed its share. [`choose`]
//!   is that decision.
//! - **Off.** A limit of 0 or 100 limits nothing. Without NVML (one line
//!   on stderr), or without a limited device, [`off`] is true for good, and
//!   each launch wrapper is one relaxed atomic load and a tail call into
//!   the driver.
//! - **Fork.** The watcher does not survive `fork`; a `pthread_atfork`
//!   handler lets the child's first launch start its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::log::{self, Level, Once};
use crate::runtime::{MAX_ORDINALS, Runtime};

/// Blocks a `cuGraphLaunch` costs.
pub const GRAPH_LAUNCH_BLOCKS: u64 = 1024;
/// How often the watcher samples utilization.
pub const PERIOD: Duration = Duration::from_millis(100);
/// How often it samples until the first measurement of every limited
/// device (launches are unthrottled until then).
pub const FIRST_PERIOD: Duration = Duration::from_millis(20);
/// Seconds of refill the bucket can hold.
pub const BURST_SECONDS: f64 = 0.02;
/// Longest single sleep of a waiting launch (it re-reads the rate after).
const MAX_SLEEP: Duration = Duration::from_millis(20);

/// The limiter has not decided yet (no launch so far).
pub const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// Whether the limiter is known to be off: the launch hot path's only check.
static STATE: AtomicU8 = AtomicU8::new(UNKNOWN);
static WATCHER_STARTED: AtomicBool = AtomicBool::new(false);
static NVML_MISSING: Once = Once::new();
static WATCHER_FAILED: Once = Once::new();

/// Whether every launch passes straight through (no device is limited).
#[inline(always)]
pub fn off() -> bool {
    STATE.load(Ordering::Relaxed) == OFF
}

/// Turns the limiter off for good (nothing to measure with).
fn switch_off() {
    STATE.store(OFF, Ordering::Relaxed);
}

/// Called in the child after `fork`: the watcher thread did not survive.
pub fn after_fork_in_child() {
    WATCHER_STARTED.store(false, Ordering::Relaxed);
}

/// What NVML's new samples on a device say about the container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampled {
    /// Some of the container's pids appear: their summed utilization, percent.
    Own(f64),
    /// None of them appears (a pid namespace of its own): the whole
    /// device's utilization, percent.
    OthersOnly(f64),
}

/// The node monitor's published figure for a device, as the watcher finds it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Published {
    /// Nothing fresh: never published, or older than `FRESH_MS`.
    Stale,
    /// Fresh, but the same publication the last period used.
    Unchanged,
    /// A fresh publication not used yet: the allocation's utilization, percent.
    New(f64),
}

impl Published {
    /// Classifies a device entry's figure at `now_ms`, given the stamp of the
    /// publication used last (`last_seen_ms`, 0: none).
    pub fn classify(
        figure: &tessera_model::vgpu_region::Published,
        last_seen_ms: u64,
        now_ms: u64,
    ) -> Published {
        if !figure.is_fresh(now_ms) {
            Published::Stale
        } else if figure.at_ms == last_seen_ms {
            Published::Unchanged
        } else {
            Published::New(figure.sm_percent())
        }
    }
}

/// The utilization the controller gets this period (`None`: no new
/// measurement; the period is merged into the next one).
///
/// - the container's own pids are in NVML's samples: their sum;
/// - otherwise a fresh figure from the node monitor: that figure when it is
///   new, nothing when it is the one used already;
/// - otherwise the whole device's utilization (over-throttles beside busy
///   neighbours, never lets the container exceed its share).
pub fn choose(sampled: Option<Sampled>, published: Published) -> Option<f64> {
    match (sampled, published) {
        (Some(Sampled::Own(util)), _) => Some(util),
        (_, Published::New(util)) => Some(util),
        (_, Published::Unchanged) => None,
        (Some(Sampled::OthersOnly(total)), Published::Stale) => Some(total),
        (None, Published::Stale) => None,
    }
}

/// The measurement the controller is driven by.
pub trait UtilSource {
    /// What NVML's samples on the device with `uuid` since the last call say
    /// about the processes in `pids`; `None` when there is no new sample.
    fn utilization(&mut self, uuid: &str, pids: &[u32]) -> Option<Sampled>;
}

/// What the limiter needs from the layer above it: the process's runtime,
/// the measurement, and word of `fork`. The interception layer provides the
/// real one; the limiter never reaches up into it.
pub trait Host: Sync {
    /// The process's runtime.
    fn runtime(&self) -> &'static Runtime;
    /// Opens the utilization source (NVML), or says why it cannot.
    fn open_source(&self) -> Result<Box<dyn UtilSource>, String>;
    /// Makes [`after_fork_in_child`] run in the child of every later `fork`
    /// (idempotent).
    fn register_fork_handler(&self);
}

/// A device's bucket and controller.
pub struct DeviceLimiter {
    uuid: Option<String>,
    /// The device's entry in the shared region (where the node monitor publishes).
    slot: usize,
    /// Stamp of the last published figure the watcher used (0: none).
    published_seen: AtomicU64,
    bucket: Mutex<Bucket>,
    admitted: AtomicU64,
    controller: Mutex<ControlState>,
}

struct ControlState {
    controller: Controller,
    horizon: Horizon,
    last_admitted: u64,
    last_tick: Instant,
}

static LIMITERS: [OnceLock<Option<Arc<DeviceLimiter>>>; MAX_ORDINALS] =
    [const { OnceLock::new() }; MAX_ORDINALS];

/// Slow path of every launch: decides whether the limiter is on (first
/// launch), and makes a launch on a limited device wait for its tokens.
pub fn admit(ordinal: Option<i32>, blocks: u64, host: &'static dyn Host) {
    if STATE.load(Ordering::Relaxed) == UNKNOWN {
        let rt = host.runtime();
        let on = rt.any_sm_limit();
        STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
    }
    if off() {
        return;
    }
    let Some(limiter) = ordinal.and_then(|o| limiter_for(host, o)) else {
        return;
    };
    ensure_watcher(host);
    limiter.acquire(blocks);
}

fn limiter_for(host: &dyn Host, ordinal: i32) -> Option<Arc<DeviceLimiter>> {
    let index = usize::try_from(ordinal)
        .ok()
        .filter(|&i| i < MAX_ORDINALS)?;
    LIMITERS[index]
        .get_or_init(|| {
            let device = host.runtime().device(ordinal)?;
            let target = device.sm_limit?;
            let mut limiter = DeviceLimiter::new(device.uuid.clone(), f64::from(target));
            limiter.slot = device.slot;
            Some(Arc::new(limiter))
        })
        .clone()
}

fn ensure_watcher(host: &'static dyn Host) {
    if WATCHER_STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    host.register_fork_handler();
    let spawned = std::thread::Builder::new()
        .name("tessera-vgpu-sm".into())
        .spawn(move || watch(host));
    if let Err(e) = spawned {
        log::once(&WATCHER_FAILED, Level::Warn, || {
            format!("cannot start the SM limiter thread ({e}); compute is not limited")
        });
        release_all();
    }
}

/// Lets every launch through from now on.
fn release_all() {
    switch_off();
    for limiter in LIMITERS.iter().filter_map(|l| l.get().cloned().flatten()) {
        limiter.set_rate(f64::INFINITY);
    }
}

fn watch(host: &'static dyn Host) {
    let mut source = match host.open_source() {
        Ok(source) => source,
        Err(reason) => {
            log::once(&NVML_MISSING, Level::Warn, || {
                format!("{reason}; the SM limit is not enforced")
            });
            release_all();
            return;
        }
    };
    let rt = host.runtime();
    let mut period = FIRST_PERIOD;
    loop {
        std::thread::sleep(period);
        let limiters: Vec<Arc<DeviceLimiter>> = LIMITERS
            .iter()
            .filter_map(|l| l.get().cloned().flatten())
            .collect();
        // Until every limited device has its first measurement, sample
        // often: launches run unthrottled until then.
        period = if limiters.iter().all(|l| l.rate().is_finite()) {
            PERIOD
        } else {
            FIRST_PERIOD
        };
        if limiters.is_empty() {
            continue;
        }
        let pids = rt.container_pids();
        for limiter in limiters {
            let sampled = limiter
                .uuid
                .as_deref()
                .and_then(|uuid| source.utilization(uuid, &pids));
            let figure = rt.published(limiter.slot);
            let published = Published::classify(
                &figure,
                limiter.published_seen.load(Ordering::Relaxed),
                crate::accounting::monotonic_ms(),
            );
            let util = choose(sampled, published);
            if matches!(published, Published::New(_)) {
                limiter
                    .published_seen
                    .store(figure.at_ms, Ordering::Relaxed);
            }
            limiter.tick(util, Instant::now());
            log::log(Level::Debug, || {
                format!(
                    "sm limiter {}: nvml {sampled:?}, published {published:?}: utilization {util:?} %, pids {pids:?}, rate {:.0} blocks/s",
                    limiter.uuid.as_deref().unwrap_or("?"),
                    limiter.rate()
                )
            });
        }
    }
}

impl DeviceLimiter {
    /// A limiter for a device with `uuid` and `target` percent; unthrottled
    /// until the first measurement.
    pub fn new(uuid: Option<String>, target: f64) -> DeviceLimiter {
        let now = Instant::now();
        DeviceLimiter {
            uuid,
            slot: 0,
            published_seen: AtomicU64::new(0),
            bucket: Mutex::new(Bucket::new(f64::INFINITY, now)),
            admitted: AtomicU64::new(0),
            controller: Mutex::new(ControlState {
                controller: Controller::new(target),
                horizon: Horizon::default(),
                last_admitted: 0,
                last_tick: now,
            }),
        }
    }

    /// Waits until `blocks` may run, then counts them as admitted.
    pub fn acquire(&self, blocks: u64) {
        loop {
            let wait = {
                let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
                bucket.take(blocks as f64, Instant::now())
            };
            match wait {
                None => break,
                Some(wait) => std::thread::sleep(wait.min(MAX_SLEEP)),
            }
        }
        self.admitted.fetch_add(blocks, Ordering::Relaxed);
    }

    /// One controller step with the utilization measured since the last
    /// step that had a measurement (`None`: no new NVML sample).
    pub fn tick(&self, util: Option<f64>, now: Instant) {
        let rate = {
            let mut state = self
                .controller
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let admitted = self.admitted.load(Ordering::Relaxed);
            let dt = now.duration_since(state.last_tick).as_secs_f64();
            if dt <= 0.0 {
                return;
            }
            let blocks = admitted.saturating_sub(state.last_admitted);
            state.last_admitted = admitted;
            state.last_tick = now;
            let Some((util, consumed)) = state.horizon.record(dt, blocks, util) else {
                return;
            };
            let rate = state.controller.update(util, consumed);
            log::log(Level::Debug, || {
                format!(
                    "sm limiter {}: over {:.2} s: utilization {util:.1} %, admitted {consumed:.0} blocks/s; rate {rate:.0} blocks/s",
                    self.uuid.as_deref().unwrap_or("?"),
                    state.horizon.span()
                )
            });
            rate
        };
        self.set_rate(rate);
    }

    fn set_rate(&self, rate: f64) {
        let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        bucket.set_rate(rate, Instant::now());
    }

    /// The refill rate in blocks per second (infinite: unthrottled).
    pub fn rate(&self) -> f64 {
        self.bucket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rate
    }
}

/// A token bucket of blocks, refilled at `rate` per second.
#[derive(Debug, Clone)]
pub struct Bucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket refilled at `rate` blocks per second.
    pub fn new(rate: f64, now: Instant) -> Bucket {
        Bucket {
            rate,
            tokens: Self::capacity_for(rate),
            last: now,
        }
    }

    fn capacity_for(rate: f64) -> f64 {
        (rate * BURST_SECONDS).max(1.0)
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        if self.rate.is_finite() {
            self.tokens = (self.tokens + self.rate * dt).min(Self::capacity_for(self.rate));
        }
    }

    /// Takes `cost` tokens if the bucket is not in debt (`None`), or says
    /// how long to wait before asking again.
    pub fn take(&mut self, cost: f64, now: Instant) -> Option<Duration> {
        if !self.rate.is_finite() {
            return None;
        }
        self.refill(now);
        if self.tokens >= 0.0 {
            self.tokens -= cost;
            return None;
        }
        let seconds = -self.tokens / self.rate.max(1e-3);
        Some(Duration::from_secs_f64(seconds.clamp(20e-6, 1.0)))
    }

    /// Changes the refill rate, keeping what is in the bucket (within the
    /// new capacity).
    pub fn set_rate(&mut self, rate: f64, now: Instant) {
        self.refill(now);
        self.rate = rate;
        if rate.is_finite() {
            self.tokens = self.tokens.min(Self::capacity_for(rate));
        } else {
            self.tokens = 0.0;
        }
    }
}

/// The measurements of the last [`HORIZON`] seconds.
///
/// NVML's per-process utilization is "since the last sample you saw": a
/// period without a new sample is merged into the next one that has one
/// (which covers both). Averaging over a horizon of several periods makes
/// bursty workloads (a few long kernels per second) measurable: most
/// periods of such a workload see no launch at all.
#[derive(Debug, Clone, Default)]
pub struct Horizon {
    /// (seconds, utilization %, blocks admitted), oldest first.
    windows: std::collections::VecDeque<(f64, f64, u64)>,
    /// A period without a sample yet: its seconds and blocks.
    pending: (f64, u64),
}

/// Seconds of measurements the controller averages over.
pub const HORIZON: f64 = 0.5;

impl Horizon {
    /// Adds a period of `dt` seconds with `blocks` admitted and utilization
    /// `util` (since the last measured period); returns the horizon's mean
    /// utilization and admitted blocks/s, or `None` without a measurement.
    pub fn record(&mut self, dt: f64, blocks: u64, util: Option<f64>) -> Option<(f64, f64)> {
        self.pending.0 += dt;
        self.pending.1 += blocks;
        let util = util?;
        let (dt, blocks) = std::mem::take(&mut self.pending);
        self.windows.push_back((dt, util.max(0.0), blocks));
        while self.windows.len() > 1 && self.span() - self.windows[0].0 >= HORIZON {
            self.windows.pop_front();
        }
        let span = self.span();
        let busy: f64 = self.windows.iter().map(|&(dt, u, _)| dt * u).sum();
        let blocks: u64 = self.windows.iter().map(|&(.., b)| b).sum();
        Some((busy / span, blocks as f64 / span))
    }

    /// Seconds the horizon covers.
    pub fn span(&self) -> f64 {
        self.windows.iter().map(|&(dt, ..)| dt).sum()
    }
}

/// The feedback controller: from measured utilization and admitted block
/// rate (both over the [`Horizon`]) to the next refill rate.
///
/// Utilization is modelled as proportional to the admitted block rate
/// (`util = gain × blocks/s`; the gain is the device time a block takes,
/// which the measurements re-estimate every period), so the rate that
/// meets the target is `admitted × target / util`. Each estimate comes from
/// the same horizon for both numbers, so measurement lag does not bias it
/// and the loop does not oscillate; the rate moves by at most ×4 per
/// period, so a noisy period cannot swing it.
#[derive(Debug, Clone)]
pub struct Controller {
    target: f64,
    /// Current refill rate (infinite: not throttling yet).
    rate: f64,
}

/// Largest change of the rate per period.
const MAX_STEP: f64 = 4.0;

impl Controller {
    /// A controller aiming at `target` percent.
    pub fn new(target: f64) -> Controller {
        Controller {
            target,
            rate: f64::INFINITY,
        }
    }

    /// The rate in force.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// One step with the mean utilization and admitted blocks/s of the
    /// horizon; returns the new rate.
    pub fn update(&mut self, util: f64, consumed: f64) -> f64 {
        if util < 0.5 || consumed <= 0.0 {
            // Nothing ran (or nothing was seen): nothing to learn.
            return self.rate;
        }
        if !self.rate.is_finite() && util <= self.target {
            // Within its share unthrottled: nothing to limit yet.
            return self.rate;
        }
        let wanted = consumed * self.target / util;
        let next = if self.rate.is_finite() {
            wanted.clamp(self.rate / MAX_STEP, self.rate * MAX_STEP)
        } else {
            wanted
        };
        self.rate = next.max(1.0);
        self.rate
    }
}

/// Per-pid samples to a utilization: the average of each pid's new samples,
/// summed over `pids` ([`Sampled::Own`]); summed over all pids when none of
/// `pids` appears ([`Sampled::OthersOnly`]: a container in its own pid
/// namespace, see the module docs); `None` without samples.
pub fn container_utilization(samples: &[(u32, u32)], pids: &[u32]) -> Option<Sampled> {
    if samples.is_empty() {
        return None;
    }
    let mut per_pid: HashMap<u32, (u64, u64)> = HashMap::new();
    for &(pid, util) in samples {
        let entry = per_pid.entry(pid).or_default();
        entry.0 += u64::from(util);
        entry.1 += 1;
    }
    let mean = |&(sum, n): &(u64, u64)| sum as f64 / n.max(1) as f64;
    let ours: Vec<f64> = per_pid
        .iter()
        .filter(|(pid, _)| pids.contains(pid))
        .map(|(_, s)| mean(s))
        .collect();
    // Not capped at 100: per-process samples are averaged over windows that
    // need not line up, so their sum can pass 100 for a while, and the
    // controller must see that excess to back off by the right amount.
    Some(if ours.is_empty() {
        Sampled::OthersOnly(per_pid.values().map(mean).sum::<f64>())
    } else {
        Sampled::Own(ours.iter().sum::<f64>())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device whose utilization is `gain × admitted rate`, capped at 100,
    /// measured `lag` ticks late; the workload wants `demand` blocks/s, and
    /// (like a real launch queue) its launches block once the device is
    /// full.
    fn run(target: f64, gain: f64, demand: f64, lag: usize, ticks: usize) -> Vec<f64> {
        let mut c = Controller::new(target);
        let mut horizon = Horizon::default();
        let mut history = vec![0.0; lag];
        let mut utils = Vec::new();
        for _ in 0..ticks {
            let admitted = demand.min(c.rate()).min(100.0 / gain);
            let true_util = (gain * admitted).min(100.0);
            history.push(true_util);
            let measured = history[history.len() - 1 - lag];
            if let Some((u, consumed)) =
                horizon.record(0.1, (admitted * 0.1) as u64, Some(measured))
            {
                c.update(u, consumed);
            }
            utils.push(true_util);
        }
        utils
    }

    /// Asserts that the mean of the last 10 ticks of `utils` is within
    /// `tolerance` of `expected`.
    fn assert_settles_at(utils: &[f64], expected: f64, tolerance: f64) {
        let tail = &utils[utils.len() - 10..];
        let settled = tail.iter().sum::<f64>() / tail.len() as f64;
        assert!((settled - expected).abs() < tolerance, "{utils:?}");
    }

    #[test]
    fn converges_on_a_saturated_device() {
        // Unthrottled the workload would use the whole device (and more).
        assert_settles_at(&run(30.0, 0.01, 1e6, 0, 40), 30.0, 2.0);
    }

    #[test]
    fn converges_with_measurement_lag() {
        assert_settles_at(&run(30.0, 0.01, 1e6, 1, 60), 30.0, 3.0);
        assert_settles_at(&run(50.0, 0.002, 1e7, 2, 80), 50.0, 5.0);
    }

    #[test]
    fn a_light_workload_is_left_alone() {
        // It wants 10 %; the limit is 30 %.
        assert_settles_at(&run(30.0, 0.01, 1000.0, 0, 40), 10.0, 0.5);
    }

    #[test]
    fn periods_without_a_sample_are_merged_into_the_next() {
        let mut h = Horizon::default();
        assert_eq!(h.record(0.1, 500, None), None);
        // The sample covers both periods: 0.2 s at 25 %, 1000 blocks.
        assert_eq!(h.record(0.1, 500, Some(25.0)), Some((25.0, 5000.0)));
        for _ in 0..20 {
            h.record(0.1, 0, Some(0.0));
        }
        assert!((h.span() - HORIZON).abs() < 0.15, "{}", h.span());
    }

    #[test]
    fn bucket_lets_a_launch_through_then_makes_the_next_wait() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000.0, t0);
        assert_eq!(b.take(500.0, t0), None, "not in debt: runs, into debt");
        let wait = b.take(1.0, t0).expect("in debt");
        assert!(wait >= Duration::from_millis(400), "{wait:?}");
        let later = t0 + Duration::from_millis(500);
        assert_eq!(b.take(1.0, later), None);
    }

    #[test]
    fn infinite_rate_never_waits() {
        let t0 = Instant::now();
        let mut b = Bucket::new(f64::INFINITY, t0);
        for _ in 0..1000 {
            assert_eq!(b.take(1e9, t0), None);
        }
    }

    #[test]
    fn utilization_sums_the_containers_pids_or_all_when_none_match() {
        let samples = [(10, 20), (10, 40), (11, 10), (99, 50)];
        assert_eq!(
            container_utilization(&samples, &[10, 11]),
            Some(Sampled::Own(40.0))
        );
        assert_eq!(
            container_utilization(&samples, &[7]),
            Some(Sampled::OthersOnly(90.0))
        );
        assert_eq!(container_utilization(&[], &[7]), None);
    }

    #[test]
    fn own_pids_win_then_a_fresh_publication_then_the_whole_device() {
        use Published::{New, Stale, Unchanged};
        let own = Some(Sampled::Own(28.0));
        let others = Some(Sampled::OthersOnly(60.0));
        // Own pids visible: NVML's figure, whatever was published.
        for p in [Stale, Unchanged, New(31.0)] {
            assert_eq!(choose(own, p), Some(28.0), "{p:?}");
        }
        // Not visible: a new publication is the allocation's figure...
        assert_eq!(choose(others, New(31.0)), Some(31.0));
        assert_eq!(choose(None, New(31.0)), Some(31.0));
        // ...one already used is no new measurement (not the whole device)...
        assert_eq!(choose(others, Unchanged), None);
        assert_eq!(choose(None, Unchanged), None);
        // ...and without a fresh one, the whole device (today's fallback).
        assert_eq!(choose(others, Stale), Some(60.0));
        assert_eq!(choose(None, Stale), None);
    }

    #[test]
    fn publications_are_classified_by_age_and_by_whether_they_were_used() {
        use tessera_model::vgpu_region::Published as Figure;
        let figure = Figure {
            sm_permille: 300,
            processes: 1,
            at_ms: 50_000,
            nvml_used: 0,
        };
        assert_eq!(
            Published::classify(&figure, 0, 50_400),
            Published::New(30.0)
        );
        assert_eq!(
            Published::classify(&figure, 50_000, 50_400),
            Published::Unchanged
        );
        assert_eq!(Published::classify(&figure, 0, 51_001), Published::Stale);
        assert_eq!(
            Published::classify(&Figure::default(), 0, 100),
            Published::Stale,
            "an old file: nothing published"
        );
    }
}
