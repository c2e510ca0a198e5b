//! Scheduling: what the scheduler extender decides and the device plugin
//! realizes, as pure data and rules.
//!
//! - [`inventory`]: the node annotation `tessera.io/node-gpus` (the device
//!   plugin's report of a node's GPUs and MIG profiles), versioned, strict on read;
//! - [`allocation`]: the pod annotation `tessera.io/allocation` (the
//!   reservation the extender writes and the plugin realizes);
//! - [`config`]: the cluster configuration file (the shape of HAMi's device
//!   ConfigMap plus its `nodeconfig` list), strict;
//! - [`request`]: what a pod asks for, from its resources and annotations;
//! - [`gpu_type`]: the model-name rule shared by allowlists and type filters;
//! - [`fit`]: per-node fit, GPU choice, MIG profile and placement, scores and
//!   the reasons a node does not fit.

pub mod allocation;
pub mod config;
pub mod fit;
pub mod gpu_type;
pub mod inventory;
pub mod request;
