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
//!   those registered in the shared region, and this process) and the
//!   blocks this process admitted in the same window, and sets the refill
//!   rate with [`Controller`].
//! - **Controller.** Model-based with integral trim: utilization is taken to
//!   be proportional to the admitted block rate, `util ≈ gain × rate`; the
//!   gain is estimated from smoothed measurements, the rate set to
//!   `target / gain`, and a slow multiplicative trim removes what the
//!   proportional model gets wrong. The rate changes by at most ×4 per tick
//!   and the trim only winds up while the bucket is what limits the
//!   workload, so an idle or lightly loaded process does not bank a high
//!   rate.
//! - **Pids.** NVML reports host pids. In a container with its own pid
//!   namespace, the container's pids differ, and no sample matches them;
//!   then the utilization of *all* processes on the device is used, which
//!   over-throttles when other tenants are busy but never lets this
//!   container exceed its share. The simulated node has one pid namespace.
//! - **Off.** A limit of 0 or 100 limits nothing. Without NVML, or without
//!   a limited device, [`off`] is true and `cuLaunchKernel` costs one relaxed
//!   atomic load more than the driver.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::log::{self, Level, Once};
use crate::runtime::{self, MAX_DEVICES};

/// Blocks a `cuGraphLaunch` costs.
pub const GRAPH_LAUNCH_BLOCKS: u64 = 1024;
/// How often the watcher samples utilization.
pub const PERIOD: Duration = Duration::from_millis(100);
/// Seconds of refill the bucket can hold.
pub const BURST_SECONDS: f64 = 0.02;
/// Longest single sleep of a waiting launch (it re-reads the rate after).
const MAX_SLEEP: Duration = Duration::from_millis(20);

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

/// Whether the limiter is known to be off (the launch hot path's only check).
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

/// The measurement the controller is driven by.
pub trait UtilSource {
    /// SM utilization (percent of the device) of the processes in `pids` on
    /// the device with `uuid` since the last call; `None` when there is no
    /// new sample.
    fn utilization(&mut self, uuid: &str, pids: &[u32]) -> Option<f64>;
}

/// Opens the utilization source (NVML), or says why it cannot.
pub type SourceFactory = fn() -> Result<Box<dyn UtilSource>, String>;

/// A device's bucket and controller.
pub struct DeviceLimiter {
    uuid: Option<String>,
    bucket: Mutex<Bucket>,
    admitted: AtomicU64,
    controller: Mutex<ControlState>,
}

struct ControlState {
    controller: Controller,
    last_admitted: u64,
    last_tick: Instant,
}

static LIMITERS: [OnceLock<Option<Arc<DeviceLimiter>>>; MAX_DEVICES] =
    [const { OnceLock::new() }; MAX_DEVICES];

/// Slow path of every launch: decides whether the limiter is on (first
/// launch), and makes a launch on a limited device wait for its tokens.
pub fn admit(ordinal: Option<i32>, blocks: u64, source: SourceFactory) {
    if STATE.load(Ordering::Relaxed) == UNKNOWN {
        let rt = runtime::global();
        let on = rt.any_sm_limit();
        STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
    }
    if off() {
        return;
    }
    let Some(limiter) = ordinal.and_then(limiter_for) else {
        return;
    };
    ensure_watcher(source);
    limiter.acquire(blocks);
}

fn limiter_for(ordinal: i32) -> Option<Arc<DeviceLimiter>> {
    let index = usize::try_from(ordinal).ok().filter(|&i| i < MAX_DEVICES)?;
    LIMITERS[index]
        .get_or_init(|| {
            let device = runtime::global().device(ordinal)?;
            let target = device.sm_limit?;
            Some(Arc::new(DeviceLimiter::new(device.uuid.clone(), f64::from(target))))
        })
        .clone()
}

fn ensure_watcher(source: SourceFactory) {
    if WATCHER_STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    crate::ffi::register_fork_handler();
    let spawned = std::thread::Builder::new()
        .name("tessera-vgpu-sm".into())
        .spawn(move || watch(source));
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

fn watch(source: SourceFactory) {
    let mut source = match source() {
        Ok(source) => source,
        Err(reason) => {
            log::once(&NVML_MISSING, Level::Warn, || {
                format!("{reason}; the SM limit is not enforced")
            });
            release_all();
            return;
        }
    };
    let rt = runtime::global();
    loop {
        std::thread::sleep(PERIOD);
        let limiters: Vec<Arc<DeviceLimiter>> = LIMITERS
            .iter()
            .filter_map(|l| l.get().cloned().flatten())
            .collect();
        if limiters.is_empty() {
            continue;
        }
        let pids = rt.container_pids();
        for limiter in limiters {
            let util = limiter
                .uuid
                .as_deref()
                .and_then(|uuid| source.utilization(uuid, &pids));
            limiter.tick(util, Instant::now());
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
            bucket: Mutex::new(Bucket::new(f64::INFINITY, now)),
            admitted: AtomicU64::new(0),
            controller: Mutex::new(ControlState {
                controller: Controller::new(target),
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

    /// One controller step with the utilization measured since the last.
    pub fn tick(&self, util: Option<f64>, now: Instant) {
        let rate = {
            let mut state = self.controller.lock().unwrap_or_else(PoisonError::into_inner);
            let admitted = self.admitted.load(Ordering::Relaxed);
            let dt = now.duration_since(state.last_tick).as_secs_f64();
            if dt <= 0.0 {
                return;
            }
            let consumed = admitted.saturating_sub(state.last_admitted) as f64 / dt;
            state.last_admitted = admitted;
            state.last_tick = now;
            match util {
                Some(util) => state.controller.update(util, consumed),
                None => return,
            }
        };
        self.set_rate(rate);
    }

    fn set_rate(&self, rate: f64) {
        let mut bucket = self.bucket.lock().unwrap_or_else(PoisonError::into_inner);
        bucket.set_rate(rate, Instant::now());
    }

    /// The refill rate in blocks per second (infinite: unthrottled).
    pub fn rate(&self) -> f64 {
        self.bucket.lock().unwrap_or_else(PoisonError::into_inner).rate
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

/// The feedback controller: from measured utilization and admitted block
/// rate to the next refill rate.
#[derive(Debug, Clone)]
pub struct Controller {
    target: f64,
    /// Smoothed utilization (percent).
    util: Option<f64>,
    /// Smoothed admitted rate (blocks/s).
    consumed: Option<f64>,
    /// Multiplicative correction of the proportional model.
    trim: f64,
    /// Current refill rate (infinite: not throttling yet).
    rate: f64,
}

/// Smoothing of the measurements (weight of the newest).
const SMOOTHING: f64 = 0.6;
/// Integral gain of the trim, per tick, on the relative error.
const TRIM_GAIN: f64 = 0.15;
/// Largest change of the rate per tick.
const MAX_STEP: f64 = 4.0;

impl Controller {
    /// A controller aiming at `target` percent.
    pub fn new(target: f64) -> Controller {
        Controller {
            target,
            util: None,
            consumed: None,
            trim: 1.0,
            rate: f64::INFINITY,
        }
    }

    /// The rate in force.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// One step: `util` measured and `consumed` blocks/s admitted over the
    /// same window; returns the new rate.
    pub fn update(&mut self, util: f64, consumed: f64) -> f64 {
        let util = util.clamp(0.0, 100.0);
        let smooth = |old: Option<f64>, new: f64| match old {
            Some(old) => old + SMOOTHING * (new - old),
            None => new,
        };
        let bound = self.rate.is_finite() && consumed >= 0.7 * self.rate;
        self.util = Some(smooth(self.util, util));
        self.consumed = Some(smooth(self.consumed, consumed));
        let (Some(u), Some(c)) = (self.util, self.consumed) else {
            return self.rate;
        };
        if u < 0.5 || c <= 0.0 {
            // Nothing ran: nothing to learn; keep the rate.
            return self.rate;
        }
        let gain = u / c;
        // The trim corrects the model only while the bucket is the limit,
        // or the device is over target in any case.
        let error = (self.target - util) / self.target.max(1.0);
        if bound || util > self.target {
            self.trim = (self.trim * (1.0 + TRIM_GAIN * error)).clamp(0.25, 4.0);
        }
        let wanted = self.target / gain * self.trim;
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
/// summed over `pids`; all pids when none of `pids` appears (a container in
/// its own pid namespace, see the module docs).
pub fn container_utilization(samples: &[(u32, u32)], pids: &[u32]) -> Option<f64> {
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
    let total = if ours.is_empty() {
        per_pid.values().map(mean).sum::<f64>()
    } else {
        ours.iter().sum::<f64>()
    };
    Some(total.min(100.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device whose utilization is `gain × admitted rate`, capped at 100,
    /// measured `lag` ticks late; the workload wants `demand` blocks/s.
    fn run(target: f64, gain: f64, demand: f64, lag: usize, ticks: usize) -> Vec<f64> {
        let mut c = Controller::new(target);
        let mut history = vec![0.0; lag];
        let mut utils = Vec::new();
        for _ in 0..ticks {
            let admitted = demand.min(c.rate());
            let true_util = (gain * admitted).min(100.0);
            history.push(true_util);
            let measured = history[history.len() - 1 - lag];
            c.update(measured, admitted);
            utils.push(true_util);
        }
        utils
    }

    fn settled(utils: &[f64]) -> f64 {
        let tail = &utils[utils.len() - 10..];
        tail.iter().sum::<f64>() / tail.len() as f64
    }

    #[test]
    fn converges_on_a_saturated_device() {
        // Unthrottled the workload would use the whole device (and more).
        let utils = run(30.0, 0.01, 1e6, 0, 40);
        assert!((settled(&utils) - 30.0).abs() < 2.0, "{utils:?}");
    }

    #[test]
    fn converges_with_measurement_lag() {
        let utils = run(30.0, 0.01, 1e6, 1, 60);
        assert!((settled(&utils) - 30.0).abs() < 3.0, "{utils:?}");
        let utils = run(50.0, 0.002, 1e7, 2, 80);
        assert!((settled(&utils) - 50.0).abs() < 5.0, "{utils:?}");
    }

    #[test]
    fn a_light_workload_is_left_alone() {
        // It wants 10 %; the limit is 30 %.
        let utils = run(30.0, 0.01, 1000.0, 0, 40);
        assert!((settled(&utils) - 10.0).abs() < 0.5, "{utils:?}");
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
        assert_eq!(container_utilization(&samples, &[10, 11]), Some(40.0));
        assert_eq!(container_utilization(&samples, &[7]), Some(90.0));
        assert_eq!(container_utilization(&[], &[7]), None);
    }
}
