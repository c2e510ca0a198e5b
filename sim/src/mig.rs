//! The simulated driver's MIG rules: creating and destroying GPU instances
//! (GIs) and compute instances (CIs) on a [`SimGpu`], as NVML would.
//!
//! Profiles, legal starts and instance limits come from the model catalogue
//! (`tessera_model::mig::catalogue`). The overlap check is written here on
//! purpose, as a plain interval test, rather than borrowed from the model's
//! placement engine: the simulated node is what that engine is tested
//! against, so it must not share its code.
//!
//! # GPU-instance ids
//!
//! The driver assigns GI ids; they are not the placement start. Observed on
//! A100/H100 (8-slice axis): 7g@0 → 0, 3g@4 → 1, 3g@0 → 2, 2g@{0,2,4} → 3/4/5,
//! 1g@0..6 → 7..13; on RTX PRO 6000 (12-slice axis): 1g@{0,3,6,9} → 3..6.
//! These fit one rule, a binary tree laid over the memory-slice axis and
//! numbered level by level like a heap (see [`gpu_instance_id`]):
//!
//! * a placement of `size` slices sits at level `L = log2(axis_len / size)`;
//!   level `L` holds ids `2^L - 1 ..= 2^(L+1) - 2`;
//! * within a level the id grows with the start (`pos = start / size`), except
//!   at level 1, where the driver numbers the upper half first (3g@4 → 1,
//!   3g@0 → 2).
//!
//! So on the 4-slice A30 axis: 4g → 0, 2g@2 → 1, 2g@0 → 2, 1g@s → 3 + s; on
//! 8 slices: size 8 → 0, size 4 → 1/2, size 2 → 3 + start/2, size 1 → 7 + start;
//! on 12 slices: size 12 → 0, size 6 @6 → 1, @0 → 2, size 3 → 3 + start/3.
//! Ids stay below 15, the GI range of `/proc/driver/nvidia-caps/mig-minors`.
//! Two live instances never share an id, because instances of one level that
//! share an id would overlap. A size that does not divide the axis into a
//! power of two (no catalogue profile has one) gets the lowest id ≥ 15 not in
//! use.
//!
//! # Compute instances
//!
//! Each GI holds at most one CI, which spans the whole GI: its CI profile id is
//! the CI profile enum whose slice count equals the GI's compute slices
//! (`1→0, 2→1, 3→2, 4→3, 7→4, 8→5, 6→6`). CI ids start at 0. Each CI gets a
//! new MIG UUID from the node's serial counter, so a CI destroyed and made
//! again has a new UUID, as on real hardware.

use crate::SimError;
use crate::catalogue::{self, GiProfileSpec, GpuModelSpec, MigSpec};
use crate::ids;
use crate::state::{NodeState, SimComputeInstance, SimGpu, SimGpuInstance};

/// GI ids from the tree rule are below this; fallback ids start here.
pub const TREE_GI_IDS: u32 = 15;

/// The catalogue entry of model `key`.
pub fn model_spec(key: &str) -> Result<&'static GpuModelSpec, SimError> {
    catalogue::find(key).ok_or_else(|| SimError::UnknownModel {
        key: key.to_string(),
        known: known_models(),
    })
}

/// The catalogue's model keys, comma separated (for error messages).
pub fn known_models() -> String {
    catalogue::models()
        .iter()
        .map(|m| m.key)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The MIG description of the GPU's model; `NotSupported` when the model has
/// no MIG.
pub fn mig_spec(gpu: &SimGpu) -> Result<&'static MigSpec, SimError> {
    let model = model_spec(&gpu.model)?;
    model.mig.as_ref().ok_or_else(|| {
        SimError::NotSupported(format!(
            "GPU {} ({}) does not support MIG",
            gpu.index, gpu.model
        ))
    })
}

/// The GI profile `profile_id` (device profile id, not enum index) of the GPU's model.
pub fn profile_spec(gpu: &SimGpu, profile_id: u32) -> Result<&'static GiProfileSpec, SimError> {
    let spec = mig_spec(gpu)?;
    spec.profile_by_id(profile_id).ok_or_else(|| {
        SimError::InvalidArgument(format!(
            "GPU {} ({}): unknown GPU instance profile id {profile_id} (known: {})",
            gpu.index,
            gpu.model,
            spec.profiles
                .iter()
                .map(|p| format!("{} {}", p.id, p.name))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })
}

/// The driver's GI id for a placement `{start, size}` on an axis of `axis_len`
/// memory slices, by the tree rule in the module docs; `None` where the rule
/// does not apply (size does not split the axis into a power of two, or start
/// is not a multiple of size).
pub fn gpu_instance_id(axis_len: u32, start: u32, size: u32) -> Option<u32> {
    if size == 0
        || !axis_len.is_multiple_of(size)
        || !start.is_multiple_of(size)
        || start + size > axis_len
    {
        return None;
    }
    let ratio = axis_len / size;
    if !ratio.is_power_of_two() {
        return None;
    }
    let level = ratio.trailing_zeros();
    let mut pos = start / size;
    if level == 1 {
        // Observed: the upper half of the axis gets the lower id.
        pos = 1 - pos;
    }
    let id = (1u32 << level) - 1 + pos;
    (id < TREE_GI_IDS).then_some(id)
}

fn overlaps(a_start: u32, a_size: u32, b_start: u32, b_size: u32) -> bool {
    a_start < b_start + b_size && b_start < a_start + a_size
}

fn free_at(gpu: &SimGpu, start: u32, size: u32) -> bool {
    !gpu.gpu_instances
        .iter()
        .any(|gi| overlaps(gi.start, gi.size, start, size))
}

fn require_mig(gpu: &SimGpu) -> Result<(), SimError> {
    mig_spec(gpu)?;
    if !gpu.mig_enabled {
        return Err(SimError::InvalidArgument(format!(
            "GPU {}: MIG mode is disabled",
            gpu.index
        )));
    }
    Ok(())
}

/// Creates a GPU instance of profile `profile_id` at memory slice `start` and
/// returns its driver-assigned id.
///
/// Errors: MIG disabled, unknown profile or a start that is not a legal start
/// of the profile → `InvalidArgument`; overlap with an existing GI, or the
/// profile's instance limit reached → `InsufficientResources`.
pub fn create_gpu_instance(gpu: &mut SimGpu, profile_id: u32, start: u32) -> Result<u32, SimError> {
    require_mig(gpu)?;
    let spec = mig_spec(gpu)?;
    let profile = profile_spec(gpu, profile_id)?;
    let size = profile.memory_slices;
    if !profile.starts.contains(&start) {
        return Err(SimError::InvalidArgument(format!(
            "GPU {}: profile {} at start {start}: not a legal start (legal: {})",
            gpu.index,
            profile.name,
            join(profile.starts)
        )));
    }
    let existing = gpu
        .gpu_instances
        .iter()
        .filter(|gi| gi.profile_id == profile_id)
        .count();
    if existing >= profile.max_instances as usize {
        return Err(SimError::InsufficientResources(format!(
            "GPU {}: profile {} at start {start}: the profile's maximum of {} instance(s) is reached",
            gpu.index, profile.name, profile.max_instances
        )));
    }
    if let Some(other) = gpu
        .gpu_instances
        .iter()
        .find(|gi| overlaps(gi.start, gi.size, start, size))
    {
        let other_name = spec.profile_by_id(other.profile_id).map_or("?", |p| p.name);
        return Err(SimError::InsufficientResources(format!(
            "GPU {}: profile {} at start {start}: overlaps GPU instance {} ({other_name} at start {}, {} slice(s))",
            gpu.index, profile.name, other.id, other.start, other.size
        )));
    }
    let used = |id: u32| gpu.gpu_instances.iter().any(|gi| gi.id == id);
    let id = match gpu_instance_id(spec.axis_len, start, size) {
        Some(id) if !used(id) => id,
        _ => (TREE_GI_IDS..)
            .find(|id| !used(*id))
            .ok_or_else(|| SimError::InsufficientResources("no free GPU instance id".into()))?,
    };
    let gi = SimGpuInstance {
        id,
        profile_id,
        start,
        size,
        compute_instances: Vec::new(),
    };
    let at = gpu.gpu_instances.partition_point(|g| g.id < id);
    gpu.gpu_instances.insert(at, gi);
    Ok(id)
}

/// The first legal start of profile `profile_id` that is free on the GPU, if any.
/// Does not check the profile's instance limit.
pub fn first_free_start(gpu: &SimGpu, profile_id: u32) -> Result<Option<u32>, SimError> {
    let profile = profile_spec(gpu, profile_id)?;
    Ok(profile
        .starts
        .iter()
        .copied()
        .find(|s| free_at(gpu, *s, profile.memory_slices)))
}

/// The starts of profile `profile_id` at which a GI could be created now
/// (empty when the profile's instance limit is reached or MIG is off).
pub fn free_starts(gpu: &SimGpu, profile_id: u32) -> Result<Vec<u32>, SimError> {
    let profile = profile_spec(gpu, profile_id)?;
    let existing = gpu
        .gpu_instances
        .iter()
        .filter(|gi| gi.profile_id == profile_id)
        .count();
    if !gpu.mig_enabled || existing >= profile.max_instances as usize {
        return Ok(Vec::new());
    }
    Ok(profile
        .starts
        .iter()
        .copied()
        .filter(|s| free_at(gpu, *s, profile.memory_slices))
        .collect())
}

/// How many more GIs of profile `profile_id` fit on the GPU as it is now
/// (`nvmlDeviceGetGpuInstanceRemainingCapacity`): free, pairwise disjoint
/// legal placements, capped by the profile's instance limit.
pub fn remaining_capacity(gpu: &SimGpu, profile_id: u32) -> Result<u32, SimError> {
    let profile = profile_spec(gpu, profile_id)?;
    let existing = gpu
        .gpu_instances
        .iter()
        .filter(|gi| gi.profile_id == profile_id)
        .count() as u32;
    if !gpu.mig_enabled {
        return Ok(0);
    }
    // Equal-length intervals: taking free starts greedily left to right is optimal.
    let size = profile.memory_slices;
    let mut starts: Vec<u32> = profile.starts.to_vec();
    starts.sort_unstable();
    let mut count = 0u32;
    let mut next_free = 0u32;
    for s in starts {
        if s >= next_free && free_at(gpu, s, size) {
            count += 1;
            next_free = s + size;
        }
    }
    Ok(count.min(profile.max_instances.saturating_sub(existing)))
}

/// Creates the compute instance spanning GI `gi_id` of GPU `gpu_index` and
/// returns its id. Takes the whole node because the MIG UUID is drawn from
/// the node's serial counter.
///
/// Errors: no such GPU or GI → `NotFound`; MIG disabled → `InvalidArgument`;
/// the GI already holds its full-size CI → `InsufficientResources`.
pub fn create_compute_instance(
    node: &mut NodeState,
    gpu_index: u32,
    gi_id: u32,
) -> Result<u32, SimError> {
    let serial = node.serial + 1;
    let gpu = node
        .gpu_mut(gpu_index)
        .ok_or_else(|| SimError::NotFound(format!("no GPU with index {gpu_index}")))?;
    require_mig(gpu)?;
    let gpu_index = gpu.index;
    let gpu_uuid = gpu.uuid.clone();
    let gi = gpu
        .gpu_instances
        .iter()
        .find(|gi| gi.id == gi_id)
        .ok_or_else(|| {
            SimError::NotFound(format!("GPU {gpu_index}: no GPU instance with id {gi_id}"))
        })?;
    let profile = profile_spec(gpu, gi.profile_id)?;
    let ci_profile = catalogue::whole_ci_profile(profile.compute_slices).ok_or_else(|| {
        SimError::InvalidArgument(format!(
            "profile {}: no compute instance profile spans {} compute slices",
            profile.name, profile.compute_slices
        ))
    })?;
    if !gi.compute_instances.is_empty() {
        return Err(SimError::InsufficientResources(format!(
            "GPU {gpu_index}: GPU instance {gi_id} already holds its compute instance"
        )));
    }
    let gi = gpu
        .gpu_instance_mut(gi_id)
        .ok_or_else(|| SimError::NotFound(format!("GPU {gpu_index}: GPU instance {gi_id}")))?;
    let ci_id = (0..)
        .find(|id| gi.compute_instances.iter().all(|ci| ci.id != *id))
        .unwrap_or(0);
    let uuid = ids::mig_uuid(&gpu_uuid, gi_id, ci_id, serial);
    let at = gi.compute_instances.partition_point(|c| c.id < ci_id);
    gi.compute_instances.insert(
        at,
        SimComputeInstance {
            id: ci_id,
            profile_id: ci_profile,
            uuid,
        },
    );
    node.serial = serial;
    Ok(ci_id)
}

/// Destroys compute instance `ci_id` of GI `gi_id`; `NotFound` if either is absent.
pub fn destroy_compute_instance(gpu: &mut SimGpu, gi_id: u32, ci_id: u32) -> Result<(), SimError> {
    let index = gpu.index;
    let gi = gpu.gpu_instance_mut(gi_id).ok_or_else(|| {
        SimError::NotFound(format!("GPU {index}: no GPU instance with id {gi_id}"))
    })?;
    let pos = gi
        .compute_instances
        .iter()
        .position(|ci| ci.id == ci_id)
        .ok_or_else(|| {
            SimError::NotFound(format!(
                "GPU {index}: GPU instance {gi_id} has no compute instance {ci_id}"
            ))
        })?;
    gi.compute_instances.remove(pos);
    Ok(())
}

/// Destroys GI `gi_id`; `InUse` while it holds compute instances, `NotFound`
/// if absent.
pub fn destroy_gpu_instance(gpu: &mut SimGpu, gi_id: u32) -> Result<(), SimError> {
    let index = gpu.index;
    let pos = gpu
        .gpu_instances
        .iter()
        .position(|gi| gi.id == gi_id)
        .ok_or_else(|| {
            SimError::NotFound(format!("GPU {index}: no GPU instance with id {gi_id}"))
        })?;
    let n = gpu.gpu_instances[pos].compute_instances.len();
    if n > 0 {
        return Err(SimError::InUse(format!(
            "GPU {index}: GPU instance {gi_id} still holds {n} compute instance(s)"
        )));
    }
    gpu.gpu_instances.remove(pos);
    Ok(())
}

/// Sets the MIG mode. The simulated GPU switches at once (current = pending),
/// as Hopper and later do. `NotSupported` on a model without MIG; `InUse`
/// when disabling while GPU instances exist.
pub fn set_mig_mode(gpu: &mut SimGpu, enabled: bool) -> Result<(), SimError> {
    mig_spec(gpu)?;
    if !enabled && !gpu.gpu_instances.is_empty() {
        return Err(SimError::InUse(format!(
            "GPU {}: {} GPU instance(s) exist; destroy them before disabling MIG",
            gpu.index,
            gpu.gpu_instances.len()
        )));
    }
    gpu.mig_enabled = enabled;
    gpu.mig_pending = enabled;
    Ok(())
}

/// The GPU's MIG devices (one per compute instance) with their MIG index,
/// ordered by (GI id, CI id) and numbered 0..n — the order
/// `nvmlDeviceGetMigDeviceHandleByIndex` walks.
pub fn mig_devices(gpu: &SimGpu) -> Vec<(u32, &SimGpuInstance, &SimComputeInstance)> {
    let mut all: Vec<(&SimGpuInstance, &SimComputeInstance)> = gpu
        .gpu_instances
        .iter()
        .flat_map(|gi| gi.compute_instances.iter().map(move |ci| (gi, ci)))
        .collect();
    all.sort_by_key(|(gi, ci)| (gi.id, ci.id));
    all.into_iter()
        .enumerate()
        .map(|(i, (gi, ci))| (i as u32, gi, ci))
        .collect()
}

fn join(xs: &[u32]) -> String {
    xs.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(model: &str) -> SimGpu {
        SimGpu {
            index: 0,
            minor: 0,
            uuid: ids::gpu_uuid("t", 0, model),
            model: model.into(),
            pci_bus: None,
            mig_enabled: true,
            mig_pending: true,
            gpu_instances: Vec::new(),
        }
    }

    fn node(model: &str) -> NodeState {
        let mut n = NodeState::new("570.133.20");
        n.gpus.push(gpu(model));
        n
    }

    #[test]
    fn gi_ids_follow_the_observed_tree_on_eight_slices() {
        assert_eq!(gpu_instance_id(8, 0, 8), Some(0));
        assert_eq!(gpu_instance_id(8, 4, 4), Some(1));
        assert_eq!(gpu_instance_id(8, 0, 4), Some(2));
        assert_eq!(
            [0, 2, 4, 6].map(|s| gpu_instance_id(8, s, 2)),
            [Some(3), Some(4), Some(5), Some(6)]
        );
        assert_eq!(
            (0..7).map(|s| gpu_instance_id(8, s, 1)).collect::<Vec<_>>(),
            (7..14).map(Some).collect::<Vec<_>>()
        );
    }

    #[test]
    fn gi_ids_follow_the_tree_on_four_and_twelve_slices() {
        assert_eq!(gpu_instance_id(4, 0, 4), Some(0));
        assert_eq!(gpu_instance_id(4, 2, 2), Some(1));
        assert_eq!(gpu_instance_id(4, 0, 2), Some(2));
        assert_eq!(
            [0, 1, 2, 3].map(|s| gpu_instance_id(4, s, 1)),
            [3, 4, 5, 6].map(Some)
        );
        assert_eq!(gpu_instance_id(12, 0, 12), Some(0));
        assert_eq!(gpu_instance_id(12, 6, 6), Some(1));
        assert_eq!(gpu_instance_id(12, 0, 6), Some(2));
        assert_eq!(
            [0, 3, 6, 9].map(|s| gpu_instance_id(12, s, 3)),
            [3, 4, 5, 6].map(Some)
        );
        assert_eq!(gpu_instance_id(12, 0, 4), None);
    }

    #[test]
    fn created_gpu_instances_get_driver_ids_not_starts() {
        let mut g = gpu("A100-40GB");
        assert_eq!(create_gpu_instance(&mut g, 9, 4).unwrap(), 1);
        assert_eq!(create_gpu_instance(&mut g, 14, 0).unwrap(), 3);
        assert_eq!(create_gpu_instance(&mut g, 19, 2).unwrap(), 9);
        assert_eq!(create_gpu_instance(&mut g, 19, 3).unwrap(), 10);
        let ids: Vec<u32> = g.gpu_instances.iter().map(|gi| gi.id).collect();
        assert_eq!(ids, [1, 3, 9, 10]);
        let mut r = gpu("RTX-PRO-6000");
        assert_eq!(create_gpu_instance(&mut r, 14, 9).unwrap(), 6);
        assert_eq!(create_gpu_instance(&mut r, 5, 0).unwrap(), 2);
    }

    #[test]
    fn overlap_is_insufficient_resources() {
        let mut g = gpu("A100-40GB");
        create_gpu_instance(&mut g, 9, 0).unwrap();
        let err = create_gpu_instance(&mut g, 14, 2).unwrap_err();
        assert!(matches!(err, SimError::InsufficientResources(_)), "{err}");
        let err = create_gpu_instance(&mut g, 0, 0).unwrap_err();
        assert!(matches!(err, SimError::InsufficientResources(_)), "{err}");
    }

    #[test]
    fn instance_limit_is_insufficient_resources() {
        let mut g = gpu("A100-40GB");
        create_gpu_instance(&mut g, 20, 0).unwrap();
        let err = create_gpu_instance(&mut g, 20, 1).unwrap_err();
        assert!(matches!(err, SimError::InsufficientResources(_)), "{err}");
    }

    #[test]
    fn illegal_start_unknown_profile_and_mig_off_are_invalid_argument() {
        let mut g = gpu("A100-40GB");
        let err = create_gpu_instance(&mut g, 9, 2).unwrap_err();
        assert!(matches!(err, SimError::InvalidArgument(_)), "{err}");
        assert!(err.to_string().contains("legal: 0, 4"), "{err}");
        let err = create_gpu_instance(&mut g, 77, 0).unwrap_err();
        assert!(matches!(err, SimError::InvalidArgument(_)), "{err}");
        g.mig_enabled = false;
        let err = create_gpu_instance(&mut g, 9, 0).unwrap_err();
        assert!(matches!(err, SimError::InvalidArgument(_)), "{err}");
    }

    #[test]
    fn compute_instance_spans_the_gpu_instance_once() {
        let mut n = node("H100-80GB");
        let gi = create_gpu_instance(&mut n.gpus[0], 9, 0).unwrap();
        assert_eq!(create_compute_instance(&mut n, 0, gi).unwrap(), 0);
        let ci = &n.gpus[0].gpu_instance(gi).unwrap().compute_instances[0];
        assert_eq!(ci.profile_id, 2, "3g spans CI profile 3_SLICE");
        assert!(ids::is_uuid("MIG", &ci.uuid), "{}", ci.uuid);
        let err = create_compute_instance(&mut n, 0, gi).unwrap_err();
        assert!(matches!(err, SimError::InsufficientResources(_)), "{err}");
        let err = create_compute_instance(&mut n, 0, 5).unwrap_err();
        assert!(matches!(err, SimError::NotFound(_)), "{err}");
        let err = create_compute_instance(&mut n, 3, gi).unwrap_err();
        assert!(matches!(err, SimError::NotFound(_)), "{err}");
    }

    #[test]
    fn recreated_compute_instance_gets_a_new_uuid() {
        let mut n = node("H100-80GB");
        let gi = create_gpu_instance(&mut n.gpus[0], 19, 0).unwrap();
        create_compute_instance(&mut n, 0, gi).unwrap();
        let first = n.gpus[0].gpu_instances[0].compute_instances[0].uuid.clone();
        destroy_compute_instance(&mut n.gpus[0], gi, 0).unwrap();
        create_compute_instance(&mut n, 0, gi).unwrap();
        assert_ne!(n.gpus[0].gpu_instances[0].compute_instances[0].uuid, first);
        assert_eq!(n.serial, 2);
    }

    #[test]
    fn destroying_a_gpu_instance_with_a_compute_instance_is_in_use() {
        let mut n = node("A30");
        let gi = create_gpu_instance(&mut n.gpus[0], 5, 2).unwrap();
        assert_eq!(gi, 1);
        create_compute_instance(&mut n, 0, gi).unwrap();
        let err = destroy_gpu_instance(&mut n.gpus[0], gi).unwrap_err();
        assert!(matches!(err, SimError::InUse(_)), "{err}");
        destroy_compute_instance(&mut n.gpus[0], gi, 0).unwrap();
        let err = destroy_compute_instance(&mut n.gpus[0], gi, 0).unwrap_err();
        assert!(matches!(err, SimError::NotFound(_)), "{err}");
        destroy_gpu_instance(&mut n.gpus[0], gi).unwrap();
        let err = destroy_gpu_instance(&mut n.gpus[0], gi).unwrap_err();
        assert!(matches!(err, SimError::NotFound(_)), "{err}");
    }

    #[test]
    fn mig_devices_are_numbered_by_gi_then_ci() {
        let mut n = node("A100-40GB");
        for (p, s) in [(19, 6), (9, 0), (14, 4)] {
            let gi = create_gpu_instance(&mut n.gpus[0], p, s).unwrap();
            create_compute_instance(&mut n, 0, gi).unwrap();
        }
        let devs: Vec<(u32, u32)> = mig_devices(&n.gpus[0])
            .iter()
            .map(|(i, gi, _)| (*i, gi.id))
            .collect();
        assert_eq!(devs, [(0, 2), (1, 5), (2, 13)]);
    }

    #[test]
    fn remaining_capacity_counts_disjoint_free_placements() {
        let mut g = gpu("A100-40GB");
        assert_eq!(remaining_capacity(&g, 19).unwrap(), 7);
        assert_eq!(remaining_capacity(&g, 9).unwrap(), 2);
        create_gpu_instance(&mut g, 14, 2).unwrap();
        assert_eq!(remaining_capacity(&g, 9).unwrap(), 1);
        assert_eq!(remaining_capacity(&g, 19).unwrap(), 5);
        assert_eq!(free_starts(&g, 9).unwrap(), [4]);
        assert_eq!(first_free_start(&g, 14).unwrap(), Some(0));
    }

    #[test]
    fn mig_mode_cannot_be_disabled_with_instances() {
        let mut g = gpu("H100-80GB");
        create_gpu_instance(&mut g, 0, 0).unwrap();
        assert!(matches!(
            set_mig_mode(&mut g, false),
            Err(SimError::InUse(_))
        ));
        destroy_gpu_instance(&mut g, 0).unwrap();
        set_mig_mode(&mut g, false).unwrap();
        assert!(!g.mig_enabled && !g.mig_pending);
    }
}
