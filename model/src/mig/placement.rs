//! Placements on the memory-slice axis of a MIG-capable GPU.

use serde::{Deserialize, Serialize};

/// A GPU instance's position on the memory-slice axis: slices `start .. start+size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Placement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}
