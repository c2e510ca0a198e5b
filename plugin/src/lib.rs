//! `tessera-device-plugin`: the node half of a reservation.
//!
//! The scheduler extender reserves (which GPU, which vGPU slice or which MIG
//! profile at which placement) and writes the pod's `tessera.io/allocation`;
//! kubelet then calls this plugin's `Allocate`. The plugin finds the pod by
//! the node's bind lock, creates the MIG instances at the reserved
//! placements, writes one transient CDI spec per container, answers kubelet,
//! and reclaims all of it when the pod is gone.
//!
//! Modules, by subject:
//!
//! - [`api`]: the kubelet gRPC APIs (device plugin v1beta1, PodResources v1),
//!   compiled from `proto/`.
//! - [`config`]: flags and the cluster config file → [`config::PluginConfig`].
//! - [`devices`]: the device list kubelet sees (split replicas of share GPUs,
//!   MIG capacity units), pure.
//! - [`health`]: XID events and lost GPUs → device health.
//! - [`server`]: the DevicePlugin service, registration with kubelet and
//!   re-registration when kubelet restarts.
//! - [`inventory`]: the node's `tessera.io/node-gpus` and handshake annotations
//!   from live NVML discovery.
//! - [`cluster`]: the Kubernetes side of Allocate: the bind lock Lease, the pod,
//!   its annotations.
//! - [`allocate`]: realizing one container's reservation.
//! - [`transient`]: the transient CDI spec of one allocation and the files it
//!   mounts.
//! - [`checkpoint`]: what this plugin created, under `--state-dir`, so that a
//!   crash leaks nothing and nothing else is ever destroyed.
//! - [`reconcile`]: reclaiming what ended pods held; the startup sweep.
//! - [`monitor`]: NVML host pids → allocations; per-allocation utilization
//!   published into each accounting region.
//! - `region`: the one `unsafe` module: the accounting region mapped shared.
//! - [`metrics`]: the node monitor's `/metrics` on `:31992`.
//! - [`failpoint`]: crash points for the crash tests.
//! - [`run`]: puts it all together; the binary calls [`run::run`].

pub mod allocate;
pub mod api;
pub mod checkpoint;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod devices;
pub mod failpoint;
pub mod health;
pub mod inventory;
pub mod metrics;
pub mod monitor;
pub mod reconcile;
mod region;
pub mod run;
pub mod server;
pub mod transient;
