//! GPU health on the simulated node: XID errors and GPUs that fell off the bus.
//!
//! Both live in the state file ([`NodeState::health`]), so every process
//! serving the node sees them: `tessera-sim inject-xid` and `tessera-sim
//! lose-gpu` write them, the NVML stand-in reads them. Each change is recorded
//! as an [`Event`] with a sequence number that only grows (the newest
//! [`EVENT_LOG_LEN`] are kept), which is what the stand-in's event sets
//! (`nvmlEventSetWait_v2`) deliver from: the events newer than the one they
//! saw last. A lost GPU answers every NVML call that names it with
//! `NVML_ERROR_GPU_IS_LOST` until it is restored.

use serde::{Deserialize, Serialize};

use crate::SimError;
use crate::state::NodeState;

/// How many of the newest events the state file keeps.
pub const EVENT_LOG_LEN: usize = 128;

/// The node's health: lost GPUs and the event log.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// NVML indexes of the GPUs that fell off the bus, ascending.
    #[serde(default)]
    pub lost: Vec<u32>,
    /// Sequence number of the newest event ever recorded (0: none yet).
    #[serde(default)]
    pub last_seq: u64,
    /// The newest events, oldest first, at most [`EVENT_LOG_LEN`].
    #[serde(default)]
    pub events: Vec<Event>,
}

/// One recorded health change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// Sequence number, 1 for the node's first event, one more for each next.
    pub seq: u64,
    /// NVML index of the GPU.
    pub gpu: u32,
    /// What happened.
    pub kind: EventKind,
}

/// What a health event says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum EventKind {
    /// An XID critical error (`nvmlEventTypeXidCriticalError`).
    Xid {
        /// The XID number.
        xid: u64,
        /// `(GI id, CI id)` when the error is attributed to a MIG instance.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instance: Option<(u32, u32)>,
    },
    /// The GPU fell off the bus.
    Lost,
    /// The GPU answers again.
    Restored,
}

impl Health {
    /// Whether nothing was ever recorded (the state file then omits the section).
    pub fn is_empty(&self) -> bool {
        self.lost.is_empty() && self.last_seq == 0 && self.events.is_empty()
    }

    /// Whether the GPU with NVML index `gpu` is lost.
    pub fn is_lost(&self, gpu: u32) -> bool {
        self.lost.contains(&gpu)
    }

    /// The kept events newer than `seq`, oldest first.
    pub fn events_after(&self, seq: u64) -> impl Iterator<Item = &Event> {
        self.events.iter().filter(move |e| e.seq > seq)
    }

    fn record(&mut self, gpu: u32, kind: EventKind) -> u64 {
        self.last_seq += 1;
        self.events.push(Event {
            seq: self.last_seq,
            gpu,
            kind,
        });
        if self.events.len() > EVENT_LOG_LEN {
            let excess = self.events.len() - EVENT_LOG_LEN;
            self.events.drain(..excess);
        }
        self.last_seq
    }
}

/// The NVML index of the GPU `spec` names: its index (`1`) or its UUID
/// (`GPU-…`). [`SimError::NotFound`] names what the node has.
pub fn resolve_gpu(state: &NodeState, spec: &str) -> Result<u32, SimError> {
    let found = match spec.parse::<u32>() {
        Ok(index) => state.gpu(index),
        Err(_) => state.gpu_by_uuid(spec),
    };
    found.map(|g| g.index).ok_or_else(|| {
        let known: Vec<String> = state.gpus.iter().map(|g| g.index.to_string()).collect();
        SimError::NotFound(format!(
            "--gpu {spec}: the node has no such GPU (indexes: {}; or give a GPU-… uuid)",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        ))
    })
}

/// Records XID `xid` on GPU `gpu`, inside MIG instance `(GI id, CI id)` when
/// given (which must exist); returns the event's sequence number.
pub fn inject_xid(
    state: &mut NodeState,
    gpu: u32,
    xid: u64,
    instance: Option<(u32, u32)>,
) -> Result<u64, SimError> {
    if xid == 0 {
        return Err(SimError::InvalidArgument(
            "--xid 0: an XID is a positive number".into(),
        ));
    }
    let sim_gpu = state
        .gpu(gpu)
        .ok_or_else(|| SimError::NotFound(format!("--gpu {gpu}: the node has no such GPU")))?;
    if let Some((gi, ci)) = instance {
        if !sim_gpu.mig_enabled {
            return Err(SimError::InvalidArgument(format!(
                "--gi {gi} --ci {ci}: MIG is off on GPU {gpu}"
            )));
        }
        let found = sim_gpu
            .gpu_instance(gi)
            .and_then(|g| g.compute_instance(ci))
            .is_some();
        if !found {
            return Err(SimError::NotFound(format!(
                "--gi {gi} --ci {ci}: GPU {gpu} has no such compute instance"
            )));
        }
    }
    Ok(state.health.record(gpu, EventKind::Xid { xid, instance }))
}

/// Marks GPU `gpu` lost (or, with `lost` false, restored); returns the
/// event's sequence number, or `None` when it already was in that state.
pub fn set_lost(state: &mut NodeState, gpu: u32, lost: bool) -> Result<Option<u64>, SimError> {
    if state.gpu(gpu).is_none() {
        return Err(SimError::NotFound(format!(
            "--gpu {gpu}: the node has no such GPU"
        )));
    }
    if state.health.is_lost(gpu) == lost {
        return Ok(None);
    }
    let health = &mut state.health;
    if lost {
        health.lost.push(gpu);
        health.lost.sort_unstable();
        Ok(Some(health.record(gpu, EventKind::Lost)))
    } else {
        health.lost.retain(|&g| g != gpu);
        Ok(Some(health.record(gpu, EventKind::Restored)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{SimComputeInstance, SimGpu, SimGpuInstance};

    fn node() -> NodeState {
        let mut s = NodeState::new("570.133.20");
        for (index, mig) in [(0, false), (1, true)] {
            s.gpus.push(SimGpu {
                index,
                minor: index,
                uuid: format!("GPU-0000000{index}-0000-0000-0000-000000000000"),
                model: "A100-40GB".into(),
                pci_bus: None,
                mig_enabled: mig,
                mig_pending: mig,
                gpu_instances: Vec::new(),
            });
        }
        s.gpus[1].gpu_instances.push(SimGpuInstance {
            id: 2,
            profile_id: 9,
            start: 4,
            size: 4,
            compute_instances: vec![SimComputeInstance {
                id: 0,
                profile_id: 2,
                uuid: "MIG-00000000-0000-0000-0000-000000000000".into(),
            }],
        });
        s
    }

    #[test]
    fn gpus_resolve_by_index_or_uuid() {
        let s = node();
        assert_eq!(resolve_gpu(&s, "1").unwrap(), 1);
        assert_eq!(
            resolve_gpu(&s, "GPU-00000000-0000-0000-0000-000000000000").unwrap(),
            0
        );
        let err = resolve_gpu(&s, "7").unwrap_err().to_string();
        assert!(err.contains("--gpu 7") && err.contains("0, 1"), "{err}");
    }

    #[test]
    fn events_get_growing_sequence_numbers_and_the_log_is_bounded() {
        let mut s = node();
        assert_eq!(inject_xid(&mut s, 0, 79, None).unwrap(), 1);
        assert_eq!(inject_xid(&mut s, 1, 48, Some((2, 0))).unwrap(), 2);
        assert_eq!(set_lost(&mut s, 0, true).unwrap(), Some(3));
        assert_eq!(set_lost(&mut s, 0, true).unwrap(), None, "already lost");
        assert!(s.health.is_lost(0));
        assert_eq!(set_lost(&mut s, 0, false).unwrap(), Some(4));
        assert!(!s.health.is_lost(0));
        let after: Vec<u64> = s.health.events_after(2).map(|e| e.seq).collect();
        assert_eq!(after, [3, 4]);
        for _ in 0..EVENT_LOG_LEN {
            inject_xid(&mut s, 0, 13, None).unwrap();
        }
        assert_eq!(s.health.events.len(), EVENT_LOG_LEN);
        assert_eq!(s.health.last_seq, 4 + EVENT_LOG_LEN as u64);
        assert_eq!(s.health.events[0].seq, 5);
    }

    #[test]
    fn bad_requests_change_nothing() {
        let mut s = node();
        let before = s.clone();
        assert!(matches!(
            inject_xid(&mut s, 0, 0, None),
            Err(SimError::InvalidArgument(_))
        ));
        assert!(matches!(
            inject_xid(&mut s, 5, 79, None),
            Err(SimError::NotFound(_))
        ));
        assert!(matches!(
            inject_xid(&mut s, 0, 79, Some((2, 0))),
            Err(SimError::InvalidArgument(_))
        ));
        assert!(matches!(
            inject_xid(&mut s, 1, 79, Some((3, 0))),
            Err(SimError::NotFound(_))
        ));
        assert!(matches!(
            set_lost(&mut s, 9, true),
            Err(SimError::NotFound(_))
        ));
        assert_eq!(s, before);
    }

    #[test]
    fn health_round_trips_through_json() {
        let mut s = node();
        inject_xid(&mut s, 1, 48, Some((2, 0))).unwrap();
        set_lost(&mut s, 0, true).unwrap();
        let text = serde_json::to_string(&s).unwrap();
        let back: NodeState = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        let plain = serde_json::to_string(&node()).unwrap();
        assert!(!plain.contains("health"), "{plain}");
    }
}
