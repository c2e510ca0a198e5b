//! GPU health: XID events and lost or vanished GPUs → a [`HealthMap`] that
//! ListAndWatch turns into `Healthy`/`Unhealthy` devices.
//!
//! One blocking thread waits on the driver's health events
//! ([`tessera_driver::GpuDriver::wait_health_event`], 500 ms at a time) and, every second,
//! lists the GPUs and asks each whether it still answers
//! ([`tessera_driver::GpuDriver::check_gpu`]). The rules:
//!
//! - an XID that says nothing about the GPU (an application's error: 13, 31,
//!   43, 45, 68, 109 — [`contract::kubelet::IGNORED_XIDS`], overridden by
//!   `$TESSERA_IGNORED_XIDS`) is logged and changes nothing;
//! - any other XID marks the GPU unhealthy until the plugin restarts. An XID
//!   inside a MIG instance marks the **whole GPU** in this version (every
//!   MIG unit of it): the device ids kubelet sees are capacity units, not
//!   instances;
//! - a GPU that stopped answering (`GPU_IS_LOST`, or a `Lost` event) is
//!   unhealthy, and healthy again once it answers;
//! - a GPU that vanished from the GPU list is unhealthy (while it is gone).
//!
//! A change is published at once on a `watch` channel, so an unhealthy GPU
//! reaches ListAndWatch well within 2 s of its XID.
//!
//! [`contract::kubelet::IGNORED_XIDS`]: tessera_model::contract::kubelet::IGNORED_XIDS

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_driver::{DriverError, HealthEvent};
use tessera_model::contract::kubelet;
use tokio::sync::watch;

use crate::run::NodeContext;

/// How long one wait for a health event lasts.
pub const EVENT_WAIT: Duration = Duration::from_millis(500);
/// How often every GPU is asked whether it still answers.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// One GPU's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHealth {
    /// Whether its devices are offered as healthy.
    pub healthy: bool,
    /// Why not (`XID 79`, `lost: …`, `vanished from NVML`).
    pub reason: Option<String>,
}

impl GpuHealth {
    /// A healthy GPU.
    pub fn healthy() -> GpuHealth {
        GpuHealth {
            healthy: true,
            reason: None,
        }
    }
}

/// Health by GPU uuid.
pub type HealthMap = BTreeMap<String, GpuHealth>;

/// The XIDs that leave a GPU healthy: `value` of `$TESSERA_IGNORED_XIDS`
/// (comma-separated numbers; empty: none), or the default list.
pub fn ignored_xids(value: Option<&str>) -> Result<BTreeSet<u64>, String> {
    match value {
        None => Ok(kubelet::IGNORED_XIDS.iter().copied().collect()),
        Some(text) => text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<u64>().map_err(|_| {
                    format!("${}: {s:?} is not an XID number", kubelet::IGNORED_XIDS_ENV)
                })
            })
            .collect(),
    }
}

#[derive(Debug, Default, Clone)]
struct GpuState {
    /// The first critical XID seen (sticky).
    xid: Option<u64>,
    /// Why it stopped answering, while it does not answer.
    lost: Option<String>,
    /// Missing from the GPU list.
    vanished: bool,
}

impl GpuState {
    fn health(&self) -> GpuHealth {
        let reason = if let Some(xid) = self.xid {
            Some(format!("XID {xid}"))
        } else if let Some(why) = &self.lost {
            Some(format!("lost: {why}"))
        } else if self.vanished {
            Some("vanished from NVML".to_owned())
        } else {
            None
        };
        GpuHealth {
            healthy: reason.is_none(),
            reason,
        }
    }
}

/// The rules, without threads: what the events and polls say so far.
#[derive(Debug, Default)]
pub struct Tracker {
    ignored: BTreeSet<u64>,
    gpus: BTreeMap<String, GpuState>,
}

impl Tracker {
    /// A tracker that ignores `ignored` XIDs.
    pub fn new(ignored: BTreeSet<u64>) -> Tracker {
        Tracker {
            ignored,
            gpus: BTreeMap::new(),
        }
    }

    /// The health of every GPU seen.
    pub fn map(&self) -> HealthMap {
        self.gpus
            .iter()
            .map(|(uuid, s)| (uuid.clone(), s.health()))
            .collect()
    }

    /// Applies one driver event.
    pub fn event(&mut self, event: &HealthEvent) {
        match event {
            HealthEvent::Xid {
                uuid,
                xid,
                instance,
            } => {
                if self.ignored.contains(xid) {
                    tracing::info!(%uuid, xid, ?instance, "application XID: GPU stays healthy");
                    return;
                }
                let state = self.gpus.entry(uuid.clone()).or_default();
                tracing::warn!(
                    %uuid,
                    xid,
                    ?instance,
                    "critical XID: the GPU's devices are unhealthy (the whole GPU, also for an XID in one MIG instance)"
                );
                state.xid.get_or_insert(*xid);
            }
            HealthEvent::Lost { uuid } => {
                tracing::warn!(%uuid, "GPU lost: its devices are unhealthy");
                self.gpus.entry(uuid.clone()).or_default().lost =
                    Some("the GPU stopped answering".to_owned());
            }
        }
    }

    /// Applies one poll: the uuids listed now, and each listed GPU's answer
    /// to `check_gpu` (`None`: it answered, `Some(why)`: it is lost).
    pub fn poll(&mut self, listed: &[(String, Option<String>)]) {
        let present: BTreeSet<&str> = listed.iter().map(|(u, _)| u.as_str()).collect();
        for (uuid, state) in &mut self.gpus {
            let gone = !present.contains(uuid.as_str());
            if gone && !state.vanished {
                tracing::warn!(%uuid, "GPU vanished from NVML: its devices are unhealthy");
            }
            if !gone && state.vanished {
                tracing::info!(%uuid, "GPU is back in NVML");
            }
            state.vanished = gone;
        }
        for (uuid, lost) in listed {
            let state = self.gpus.entry(uuid.clone()).or_default();
            match (lost, &state.lost) {
                (None, Some(_)) => {
                    tracing::info!(%uuid, "GPU answers again");
                    state.lost = None;
                }
                (Some(why), None) => {
                    tracing::warn!(%uuid, reason = %why, "GPU lost: its devices are unhealthy");
                    state.lost = Some(why.clone());
                }
                _ => {}
            }
        }
    }
}

/// The node's GPU health, shared: a watcher thread updates it, ListAndWatch
/// and the inventory read it.
pub struct Health {
    ctx: Arc<NodeContext>,
    tracker: Mutex<Tracker>,
    /// The last successful GPU listing: (index, uuid).
    listing: Mutex<Vec<(u32, String)>>,
    tx: watch::Sender<HealthMap>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("map", &*self.tx.borrow())
            .finish_non_exhaustive()
    }
}

impl Health {
    /// Health for the node's GPUs, all healthy until told otherwise.
    pub fn new(ctx: Arc<NodeContext>) -> Arc<Health> {
        let env = std::env::var(kubelet::IGNORED_XIDS_ENV).ok();
        let ignored = ignored_xids(env.as_deref()).unwrap_or_else(|e| {
            tracing::warn!("{e}; using the default list");
            kubelet::IGNORED_XIDS.iter().copied().collect()
        });
        let mut tracker = Tracker::new(ignored);
        let mut listing = Vec::new();
        match ctx.driver.gpus() {
            Ok(gpus) => {
                listing = gpus.into_iter().map(|g| (g.index, g.uuid)).collect();
                let listed: Vec<(String, Option<String>)> = listing
                    .iter()
                    .map(|(_, uuid)| (uuid.clone(), None))
                    .collect();
                tracker.poll(&listed);
            }
            Err(e) => tracing::warn!(error = %e, "listing GPUs for health"),
        }
        let (tx, _) = watch::channel(tracker.map());
        Arc::new(Health {
            ctx,
            tracker: Mutex::new(tracker),
            listing: Mutex::new(listing),
            tx,
        })
    }

    /// The health map now and on every change.
    pub fn subscribe(&self) -> watch::Receiver<HealthMap> {
        self.tx.subscribe()
    }

    /// Watches until `shutdown` turns true (or its sender is gone).
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let stop = Arc::new(AtomicBool::new(false));
        let (me, flag) = (self.clone(), stop.clone());
        let watcher = tokio::task::spawn_blocking(move || me.watch(&flag));
        let _ = shutdown.wait_for(|s| *s).await;
        stop.store(true, Ordering::Relaxed);
        if let Err(e) = watcher.await {
            tracing::error!(error = %e, "health watcher panicked");
        }
    }

    fn watch(&self, stop: &AtomicBool) {
        let driver = &self.ctx.driver;
        let mut last_poll: Option<Instant> = None;
        let mut events_unsupported = false;
        let mut last_error: Option<String> = None;
        while !stop.load(Ordering::Relaxed) {
            if last_poll.is_none_or(|t| t.elapsed() >= POLL_INTERVAL) {
                last_poll = Some(Instant::now());
                self.poll();
            }
            if events_unsupported {
                std::thread::sleep(EVENT_WAIT);
                continue;
            }
            match driver.wait_health_event(EVENT_WAIT) {
                Ok(Some(event)) => self.update(|t| t.event(&event)),
                Ok(None) => {}
                Err(DriverError::NotSupported(why)) => {
                    tracing::warn!(%why, "no health events from the driver; polling only");
                    events_unsupported = true;
                }
                Err(e) => {
                    let text = e.to_string();
                    if last_error.as_ref() != Some(&text) {
                        tracing::warn!(error = %text, "waiting for health events");
                        last_error = Some(text);
                    }
                    std::thread::sleep(EVENT_WAIT);
                }
            }
        }
    }

    fn poll(&self) {
        let driver = &self.ctx.driver;
        // A lost GPU can make the whole listing fail (its uuid no longer
        // answers): then the GPUs of the last listing are checked one by one.
        let gpus: Vec<(u32, String)> = match driver.gpus() {
            Ok(gpus) => {
                let gpus: Vec<(u32, String)> =
                    gpus.into_iter().map(|g| (g.index, g.uuid)).collect();
                *self.listing.lock().unwrap_or_else(|p| p.into_inner()) = gpus.clone();
                gpus
            }
            Err(e) => {
                tracing::debug!(error = %e, "listing GPUs for health; checking the last listing");
                self.listing
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone()
            }
        };
        let listed: Vec<(String, Option<String>)> = gpus
            .into_iter()
            .map(|(index, uuid)| {
                let lost = match driver.check_gpu(index) {
                    Err(DriverError::GpuLost(why)) => Some(why),
                    Err(e) => {
                        tracing::debug!(gpu = index, error = %e, "checking GPU");
                        None
                    }
                    Ok(()) => None,
                };
                (uuid, lost)
            })
            .collect();
        self.update(|t| t.poll(&listed));
    }

    fn update(&self, change: impl FnOnce(&mut Tracker)) {
        let map = {
            let mut tracker = self.tracker.lock().unwrap_or_else(|p| p.into_inner());
            change(&mut tracker);
            tracker.map()
        };
        self.tx.send_if_modified(|current| {
            if *current == map {
                false
            } else {
                *current = map;
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xid(uuid: &str, xid: u64) -> HealthEvent {
        HealthEvent::Xid {
            uuid: uuid.into(),
            xid,
            instance: None,
        }
    }

    fn listed(uuids: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
        uuids
            .iter()
            .map(|(u, l)| ((*u).to_owned(), l.map(str::to_owned)))
            .collect()
    }

    fn tracker() -> Tracker {
        let mut t = Tracker::new(ignored_xids(None).expect("default list"));
        t.poll(&listed(&[("GPU-a", None), ("GPU-b", None)]));
        t
    }

    #[test]
    fn application_xids_leave_the_gpu_healthy() {
        let mut t = tracker();
        for x in kubelet::IGNORED_XIDS {
            t.event(&xid("GPU-a", *x));
        }
        assert!(t.map().values().all(|h| h.healthy), "{:?}", t.map());
    }

    #[test]
    fn a_critical_xid_marks_the_gpu_for_good() {
        let mut t = tracker();
        t.event(&HealthEvent::Xid {
            uuid: "GPU-a".into(),
            xid: 79,
            instance: Some((1, 0)),
        });
        t.poll(&listed(&[("GPU-a", None), ("GPU-b", None)]));
        let map = t.map();
        assert_eq!(
            map["GPU-a"],
            GpuHealth {
                healthy: false,
                reason: Some("XID 79".into())
            }
        );
        assert!(map["GPU-b"].healthy);
    }

    #[test]
    fn a_lost_gpu_recovers_when_it_answers() {
        let mut t = tracker();
        t.poll(&listed(&[
            ("GPU-a", Some("fell off the bus")),
            ("GPU-b", None),
        ]));
        assert!(!t.map()["GPU-a"].healthy);
        assert_eq!(
            t.map()["GPU-a"].reason.as_deref(),
            Some("lost: fell off the bus")
        );
        t.poll(&listed(&[("GPU-a", None), ("GPU-b", None)]));
        assert!(t.map()["GPU-a"].healthy);

        t.event(&HealthEvent::Lost {
            uuid: "GPU-b".into(),
        });
        assert!(!t.map()["GPU-b"].healthy);
        t.poll(&listed(&[("GPU-a", None), ("GPU-b", None)]));
        assert!(t.map()["GPU-b"].healthy);
    }

    #[test]
    fn a_vanished_gpu_is_unhealthy_while_gone() {
        let mut t = tracker();
        t.poll(&listed(&[("GPU-a", None)]));
        assert_eq!(
            t.map()["GPU-b"].reason.as_deref(),
            Some("vanished from NVML")
        );
        t.poll(&listed(&[("GPU-a", None), ("GPU-b", None)]));
        assert!(t.map()["GPU-b"].healthy);
    }

    #[test]
    fn the_ignored_list_comes_from_the_environment() {
        assert_eq!(
            ignored_xids(Some("13, 79")).expect("valid"),
            BTreeSet::from([13, 79])
        );
        assert!(ignored_xids(Some("")).expect("valid").is_empty());
        assert!(ignored_xids(Some("13,x")).is_err());
        let mut t = Tracker::new(ignored_xids(Some("79")).expect("valid"));
        t.event(&xid("GPU-a", 79));
        t.event(&xid("GPU-b", 13));
        assert!(
            !t.map().contains_key("GPU-a"),
            "79 ignored: nothing recorded"
        );
        assert!(!t.map()["GPU-b"].healthy, "13 is critical once not ignored");
    }
}
