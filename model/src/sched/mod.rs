//! Scheduling: what the scheduler extender decides and the device plugin
//! realizes, as pure data and rules.
//!
//! - [`inventory`]: the node annotation `tessera.io/node-gpus` (the device
//!   plugin's report of a node's GPUs and MIG profiles), versioned, strict on read;
//! - [`allocation`]: the pod annotation `tessera.io/allocation` (the
//!   reservation the extender writes and the plugin realizes);
//! - [`bind`]: the bind-phase rule (a phase counts for the bind that took
//!   the node's lock only when its bind-time is no earlier);
//! - [`config`]: the cluster configuration file (the shape of HAMi's device
//!   ConfigMap plus its `nodeconfig` list), strict;
//! - [`request`]: what a pod asks for, from its resources and annotations;
//! - [`gpu_type`]: the model-name rule shared by allowlists and type filters;
//! - [`fit`]: per-node fit, GPU choice, MIG profile and placement, scores and
//!   the reasons a node does not fit.

pub mod allocation;
pub mod bind;
pub mod config;
pub mod fit;
pub mod gpu_type;
pub mod inventory;
pub mod request;

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Why [`parse_versioned`] refused a value.
enum VersionedParseError {
    /// The value declares another schema version.
    Version(u32),
    /// Not JSON, or not the schema (serde's message).
    Malformed(String),
}

/// Parses a versioned annotation value strictly, reading its `version` first
/// so that another version is reported as such rather than as whatever field
/// that version added. An absent `version` is left to the schema to judge.
fn parse_versioned<T: DeserializeOwned>(
    text: &str,
    supported: u32,
) -> Result<T, VersionedParseError> {
    #[derive(Deserialize)]
    struct VersionOnly {
        version: Option<u32>,
    }
    if let Ok(VersionOnly {
        version: Some(found),
    }) = serde_json::from_str::<VersionOnly>(text)
        && found != supported
    {
        return Err(VersionedParseError::Version(found));
    }
    serde_json::from_str(text).map_err(|e| VersionedParseError::Malformed(e.to_string()))
}
