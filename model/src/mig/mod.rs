//! MIG: the profile catalogue of known GPU models and the placement engine.

pub mod catalogue;
pub mod placement;

pub use catalogue::{GiProfileSpec, GpuModelSpec, MigSpec};
pub use placement::{
    Occupancy, Placement, PlacementError, PlacementPolicy, ProfileLayout, ProfilePlacements,
};
