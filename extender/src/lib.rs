//! `tessera-scheduler-extender`: kube-scheduler's extender for GPUs. It picks
//! node + GPU + (vGPU slice | MIG profile and placement), writes that
//! reservation onto the pod (`tessera.io/allocation`) and binds; it never
//! touches a GPU. The device plugin realizes the reservation.
//!
//! - [`wire`]: the extender v1 JSON types, as kube-scheduler sends and reads them;
//! - [`state`]: the cluster as the extender sees it (reflectors on nodes and
//!   pods, plus reservations in flight), rebuilt from the API alone;
//! - [`lock`]: the per-node bind lock (a Lease taken by resourceVersion CAS);
//! - [`verbs`]: filter, prioritize and bind;
//! - [`metrics`]: Prometheus metrics under HAMi's names;
//! - [`inspect`]: the cluster's GPU allocation report (`/inspect`, `kubectl tessera inspect`);
//! - [`server`]: the HTTP server;
//! - [`cli`]: options and start-up of the binary.
#![deny(missing_docs)]

pub mod cli;
pub mod inspect;
pub mod lock;
pub mod metrics;
pub mod server;
pub mod state;
pub mod verbs;
pub mod wire;
