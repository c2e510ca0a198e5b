//! MIG management: GPU-instance profiles and placements, GPU instances,
//! compute-instance profiles and compute instances.
//!
//! Profile *info* is asked for by `NVML_GPU_INSTANCE_PROFILE_*` enum index
//! (`INVALID_ARGUMENT` at or past [`GPU_INSTANCE_PROFILE_COUNT`],
//! `NOT_SUPPORTED` for an enum the model lacks); every other call takes the
//! device profile id the info reports (`INVALID_ARGUMENT` for an id the model
//! lacks). Calls that need MIG mode on answer `NOT_SUPPORTED` while it is off;
//! possible placements are answered either way, as NVML documents.
//!
//! The simulated driver gives each GPU instance at most one compute instance,
//! spanning the whole GI (the common case, and the only one Tessera makes):
//! the only compute-instance profile offered is the one whose slice count
//! equals the GI's; other valid CI profile enums are `NOT_SUPPORTED`.
//!
//! Array outputs follow NVML: the caller's buffer must hold every entry (the
//! profile's instance count, or the count a NULL query returned); `*count` is
//! output only.

use std::ffi::{c_char, c_uint};

use tessera_model::mig::catalogue::{GiProfileSpec, MigSpec};
use tessera_sim::state::{NodeState, SimGpu, SimGpuInstance};

use crate::ffi::*;
use crate::lookup;
use crate::node::{self, Res};
use crate::out;
use crate::profiles::{self, Engines};

use super::{answer, entry};

// ---------------------------------------------------------------- GI profiles

/// A versioned GI profile-info struct: what every version shares copied from
/// the unversioned `$v1`, the fields only this version has as given.
macro_rules! gi_profile_info_from {
    ($v1:expr, $info:ident { $($field:ident: $value:expr),* $(,)? }) => {{
        let v1: NvmlGpuInstanceProfileInfo = $v1;
        $info {
            id: v1.id,
            slice_count: v1.slice_count,
            instance_count: v1.instance_count,
            multiprocessor_count: v1.multiprocessor_count,
            copy_engine_count: v1.copy_engine_count,
            decoder_count: v1.decoder_count,
            encoder_count: v1.encoder_count,
            jpeg_count: v1.jpeg_count,
            ofa_count: v1.ofa_count,
            memory_size_mb: v1.memory_size_mb,
            $($field: $value,)*
        }
    }};
}

/// A GI profile as NVML reports it.
struct GiProfileInfo {
    profile: &'static GiProfileSpec,
    engines: Engines,
}

impl GiProfileInfo {
    fn new(spec: &'static MigSpec, profile: &'static GiProfileSpec) -> Self {
        GiProfileInfo {
            profile,
            engines: profiles::engines(profile, spec.axis_len),
        }
    }

    fn v1(&self) -> NvmlGpuInstanceProfileInfo {
        let (p, e) = (self.profile, self.engines);
        NvmlGpuInstanceProfileInfo {
            id: p.id,
            is_p2p_supported: 0,
            slice_count: p.compute_slices,
            instance_count: p.max_instances,
            multiprocessor_count: p.sm_count,
            copy_engine_count: e.copy,
            decoder_count: e.decoder,
            encoder_count: e.encoder,
            jpeg_count: e.jpeg,
            ofa_count: e.ofa,
            memory_size_mb: p.memory_mib,
        }
    }

    fn v2(&self) -> NvmlGpuInstanceProfileInfoV2 {
        let v1 = self.v1();
        gi_profile_info_from!(
            v1,
            NvmlGpuInstanceProfileInfoV2 {
                version: GPU_INSTANCE_PROFILE_INFO_V2,
                is_p2p_supported: v1.is_p2p_supported,
                name: profile_name(self.profile),
            }
        )
    }

    fn v3(&self) -> NvmlGpuInstanceProfileInfoV3 {
        gi_profile_info_from!(
            self.v1(),
            NvmlGpuInstanceProfileInfoV3 {
                version: GPU_INSTANCE_PROFILE_INFO_V3,
                name: profile_name(self.profile),
                capabilities: profiles::gi_capabilities(self.profile),
            }
        )
    }
}

/// The `name` field of a GI profile's info, and of its CI profile's.
fn profile_name(profile: &GiProfileSpec) -> [c_char; PROFILE_NAME_SIZE] {
    let mut name = [0; PROFILE_NAME_SIZE];
    out::fill_name(&mut name, &profiles::gi_profile_name(profile));
    name
}

/// The GI profile at enum index `profile` on the GPU behind `device`.
fn gi_profile_by_enum(
    state: &NodeState,
    device: NvmlDevice,
    profile: c_uint,
) -> Res<GiProfileInfo> {
    let gpu = lookup::physical_gpu(state, device)?;
    if profile >= GPU_INSTANCE_PROFILE_COUNT {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let spec = profiles::mig_enabled(gpu)?;
    let found = spec.profile_by_enum(profile).ok_or(ERROR_NOT_SUPPORTED)?;
    Ok(GiProfileInfo::new(spec, found))
}

/// `nvmlDeviceGetGpuInstanceProfileInfo`: the unversioned (v1) struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: NvmlDevice,
    profile: c_uint,
    info: *mut NvmlGpuInstanceProfileInfo,
) -> NvmlReturn {
    entry(|| {
        let found = node::read(|s| gi_profile_by_enum(s, device, profile))?;
        // SAFETY: NVML contract: `info` is null or valid for one write.
        unsafe { out::write(info, found.v1()) }
    })
}

/// `nvmlDeviceGetGpuInstanceProfileInfoV`: fills a `_v2` or `_v3` struct as
/// its `version` says; `ARGUMENT_VERSION_MISMATCH` for any other version.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: NvmlDevice,
    profile: c_uint,
    info: *mut NvmlGpuInstanceProfileInfoV2,
) -> NvmlReturn {
    entry(|| {
        let (found, version) = node::read(|s| {
            lookup::physical_gpu(s, device)?;
            // SAFETY: NVML contract: `info` is null or a caller-owned versioned struct.
            let version = unsafe { out::read_version(info) }?;
            if version != GPU_INSTANCE_PROFILE_INFO_V2 && version != GPU_INSTANCE_PROFILE_INFO_V3 {
                return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
            }
            Ok((gi_profile_by_enum(s, device, profile)?, version))
        })?;
        if version == GPU_INSTANCE_PROFILE_INFO_V3 {
            // SAFETY: NVML contract: a struct whose version says v3 is a
            // caller-owned nvmlGpuInstanceProfileInfo_v3_t (non-null: read above).
            unsafe { out::write(info.cast::<NvmlGpuInstanceProfileInfoV3>(), found.v3()) }
        } else {
            // SAFETY: as above, for v2.
            unsafe { out::write(info, found.v2()) }
        }
    })
}

/// The GPU behind `device` and its GI profile with device profile id `profile_id`.
fn gpu_and_profile(
    state: &NodeState,
    device: NvmlDevice,
    profile_id: c_uint,
    need_mig_on: bool,
) -> Res<(&SimGpu, &'static GiProfileSpec)> {
    let gpu = lookup::physical_gpu(state, device)?;
    let spec = if need_mig_on {
        profiles::mig_enabled(gpu)?
    } else {
        profiles::mig(gpu)?
    };
    Ok((gpu, profiles::gi_profile(spec, profile_id)?))
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: every legal placement of
/// the profile, whether free or not and whether MIG is on or not. With
/// `placements` NULL only `*count` is written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: NvmlDevice,
    profile_id: c_uint,
    placements: *mut NvmlPlacement,
    count: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let all: Vec<NvmlPlacement> = node::read(|s| {
            let (_, profile) = gpu_and_profile(s, device, profile_id, false)?;
            Ok(profile
                .starts
                .iter()
                .map(|&start| NvmlPlacement {
                    start,
                    size: profile.memory_slices,
                })
                .collect())
        })?;
        // SAFETY: NVML contract: `count` is null or valid for one write; a
        // non-null `placements` holds every placement of the profile (the
        // count a NULL query returns).
        unsafe { out::write_counted(placements, count, &all) }
    })
}

/// `nvmlDeviceGetGpuInstanceRemainingCapacity`: how many more GIs of the
/// profile fit now (free, disjoint legal placements, capped by the
/// profile's instance limit).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: NvmlDevice,
    profile_id: c_uint,
    count: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `count` is null or valid for one write.
    unsafe {
        answer(count, |s| {
            let (gpu, _) = gpu_and_profile(s, device, profile_id, true)?;
            tessera_sim::mig::remaining_capacity(gpu, profile_id).map_err(|e| node::sim_code(&e))
        })
    }
}

// ------------------------------------------------------------- GPU instances

/// Runs a create call's body: `INVALID_ARGUMENT` (and nothing created) when
/// `handle` is null, else `create`'s instance written through it.
///
/// # Safety
/// `handle` is null or valid for one write.
unsafe fn write_created<H>(handle: *mut H, create: impl FnOnce() -> Res<H>) -> NvmlReturn {
    entry(|| {
        if handle.is_null() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        let created = create()?;
        // SAFETY: the caller's contract (non-null).
        unsafe { out::write(handle, created) }
    })
}

/// Creates a GI of `profile_id` on the GPU behind `device` at `start`, or at
/// the first free legal start when `start` is `None`; returns its handle.
fn create_gpu_instance(
    device: NvmlDevice,
    profile_id: c_uint,
    placement: Option<NvmlPlacement>,
) -> Res<NvmlGpuInstance> {
    let index = node::read(|s| {
        let (gpu, profile) = gpu_and_profile(s, device, profile_id, true)?;
        if placement.is_some_and(|p| p.size != profile.memory_slices) {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        Ok(gpu.index)
    })?;
    let gi = node::update(|s| {
        lookup::gpu(s, index)?;
        let gpu = s.gpu_mut(index).ok_or(ERROR_INVALID_ARGUMENT)?;
        let sim = |e: tessera_sim::SimError| node::sim_code(&e);
        let start = match placement {
            Some(p) => p.start,
            None => tessera_sim::mig::first_free_start(gpu, profile_id)
                .map_err(sim)?
                .ok_or(ERROR_INSUFFICIENT_RESOURCES)?,
        };
        tessera_sim::mig::create_gpu_instance(gpu, profile_id, start).map_err(sim)
    })?;
    lookup::gi_handle(index, gi)
}

/// `nvmlDeviceCreateGpuInstance`: at the first free legal start, in
/// ascending order (real NVML's choice is order-sensitive; prefer the
/// `WithPlacement` call). `INSUFFICIENT_RESOURCES` when none is free or the
/// profile's instance limit is reached.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstance(
    device: NvmlDevice,
    profile_id: c_uint,
    gpu_instance: *mut NvmlGpuInstance,
) -> NvmlReturn {
    // SAFETY: NVML contract: `gpu_instance` is null or valid for one write.
    unsafe {
        write_created(gpu_instance, || {
            create_gpu_instance(device, profile_id, None)
        })
    }
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`: `INVALID_ARGUMENT` for a
/// start that is not one of the profile's legal starts or a size that is not
/// the profile's; `INSUFFICIENT_RESOURCES` when it overlaps an existing GI
/// or the profile's instance limit is reached. The GI id is the driver's
/// (see `tessera_sim::mig`), not the start.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: NvmlDevice,
    profile_id: c_uint,
    placement: *const NvmlPlacement,
    gpu_instance: *mut NvmlGpuInstance,
) -> NvmlReturn {
    let create = || {
        // SAFETY: NVML contract: `placement` is null or valid for one read.
        let placement = unsafe { out::read(placement) }?;
        create_gpu_instance(device, profile_id, Some(placement))
    };
    // SAFETY: NVML contract: `gpu_instance` is null or valid for one write.
    unsafe { write_created(gpu_instance, create) }
}

/// `nvmlGpuInstanceDestroy`: `IN_USE` while the GI holds a compute instance.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gpu_instance: NvmlGpuInstance) -> NvmlReturn {
    entry(|| {
        node::update(|s| {
            let (gpu, gi) = lookup::gpu_instance_of(s, gpu_instance)?;
            let (index, gi) = (gpu.index, gi.id);
            lookup::gpu(s, index)?;
            let gpu = s.gpu_mut(index).ok_or(ERROR_INVALID_ARGUMENT)?;
            tessera_sim::mig::destroy_gpu_instance(gpu, gi).map_err(|e| node::sim_code(&e))
        })
    })
}

/// `nvmlDeviceGetGpuInstances`: the GIs of one profile, by ascending id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: NvmlDevice,
    profile_id: c_uint,
    gpu_instances: *mut NvmlGpuInstance,
    count: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let handles = node::read(|s| {
            let (gpu, _) = gpu_and_profile(s, device, profile_id, true)?;
            let mut gis: Vec<&SimGpuInstance> = gpu
                .gpu_instances
                .iter()
                .filter(|gi| gi.profile_id == profile_id)
                .collect();
            gis.sort_by_key(|gi| gi.id);
            gis.iter()
                .map(|gi| lookup::gi_handle(gpu.index, gi.id))
                .collect::<Res<Vec<_>>>()
        })?;
        // SAFETY: NVML contract: `gpu_instances` is null or holds the
        // profile's instance count of handles, at least as many as exist;
        // `count` is null or valid for one write.
        unsafe { out::write_array(gpu_instances, count, &handles) }
    })
}

/// `nvmlDeviceGetGpuInstanceById`: `NOT_FOUND` when no GI has the id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: NvmlDevice,
    id: c_uint,
    gpu_instance: *mut NvmlGpuInstance,
) -> NvmlReturn {
    // SAFETY: NVML contract: `gpu_instance` is null or valid for one write.
    unsafe {
        answer(gpu_instance, |s| {
            let gpu = lookup::physical_gpu(s, device)?;
            profiles::mig_enabled(gpu)?;
            let gi = gpu.gpu_instance(id).ok_or(ERROR_NOT_FOUND)?;
            lookup::gi_handle(gpu.index, gi.id)
        })
    }
}

/// `nvmlGpuInstanceGetInfo`: parent device, id, profile id and placement.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gpu_instance: NvmlGpuInstance,
    info: *mut NvmlGpuInstanceInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract: `info` is null or valid for one write.
    unsafe {
        answer(info, |s| {
            let (gpu, gi) = lookup::gpu_instance_of(s, gpu_instance)?;
            Ok(NvmlGpuInstanceInfo {
                device: lookup::gpu_handle(gpu.index)?,
                id: gi.id,
                profile_id: gi.profile_id,
                placement: NvmlPlacement {
                    start: gi.start,
                    size: gi.size,
                },
            })
        })
    }
}

// ---------------------------------------------------------------- CI profiles

/// A versioned CI profile-info struct: what every version shares copied from
/// the unversioned `$v1`, the fields only this version has as given.
macro_rules! ci_profile_info_from {
    ($v1:expr, $info:ident { $($field:ident: $value:expr),* $(,)? }) => {{
        let v1: NvmlComputeInstanceProfileInfo = $v1;
        $info {
            id: v1.id,
            slice_count: v1.slice_count,
            instance_count: v1.instance_count,
            multiprocessor_count: v1.multiprocessor_count,
            shared_copy_engine_count: v1.shared_copy_engine_count,
            shared_decoder_count: v1.shared_decoder_count,
            shared_encoder_count: v1.shared_encoder_count,
            shared_jpeg_count: v1.shared_jpeg_count,
            shared_ofa_count: v1.shared_ofa_count,
            $($field: $value,)*
        }
    }};
}

/// The one compute-instance profile a GI offers.
struct CiProfileInfo {
    id: u32,
    gi_profile: &'static GiProfileSpec,
    engines: Engines,
}

impl CiProfileInfo {
    fn v1(&self) -> NvmlComputeInstanceProfileInfo {
        let (p, e) = (self.gi_profile, self.engines);
        NvmlComputeInstanceProfileInfo {
            id: self.id,
            slice_count: p.compute_slices,
            instance_count: 1,
            multiprocessor_count: p.sm_count,
            shared_copy_engine_count: e.copy,
            shared_decoder_count: e.decoder,
            shared_encoder_count: e.encoder,
            shared_jpeg_count: e.jpeg,
            shared_ofa_count: e.ofa,
        }
    }

    fn v2(&self) -> NvmlComputeInstanceProfileInfoV2 {
        ci_profile_info_from!(
            self.v1(),
            NvmlComputeInstanceProfileInfoV2 {
                version: COMPUTE_INSTANCE_PROFILE_INFO_V2,
                name: profile_name(self.gi_profile),
            }
        )
    }

    fn v3(&self) -> NvmlComputeInstanceProfileInfoV3 {
        ci_profile_info_from!(
            self.v1(),
            NvmlComputeInstanceProfileInfoV3 {
                version: COMPUTE_INSTANCE_PROFILE_INFO_V3,
                name: profile_name(self.gi_profile),
                capabilities: profiles::ci_capabilities(self.gi_profile),
            }
        )
    }
}

/// The CI profile `profile` (id = enum) of the GI behind `handle`:
/// `INVALID_ARGUMENT` past the enum's range, `NOT_SUPPORTED` unless it is
/// the profile spanning the whole GI.
fn ci_profile(
    state: &NodeState,
    handle: NvmlGpuInstance,
    profile: c_uint,
) -> Res<(&SimGpu, &SimGpuInstance, CiProfileInfo)> {
    let (gpu, gi) = lookup::gpu_instance_of(state, handle)?;
    if profile >= COMPUTE_INSTANCE_PROFILE_COUNT {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    let spec = profiles::mig(gpu)?;
    let gi_profile = profiles::gi_profile_of(gpu, gi)?;
    let id = profiles::full_ci_profile(gi_profile)?;
    if profile != id {
        return Err(ERROR_NOT_SUPPORTED);
    }
    let engines = profiles::engines(gi_profile, spec.axis_len);
    Ok((
        gpu,
        gi,
        CiProfileInfo {
            id,
            gi_profile,
            engines,
        },
    ))
}

fn check_engine_profile(eng_profile: c_uint) -> Res<()> {
    if eng_profile == COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
        Ok(())
    } else {
        Err(ERROR_INVALID_ARGUMENT)
    }
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfo`: the unversioned (v1) struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gpu_instance: NvmlGpuInstance,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut NvmlComputeInstanceProfileInfo,
) -> NvmlReturn {
    entry(|| {
        let found = node::read(|s| {
            let (_, _, found) = ci_profile(s, gpu_instance, profile)?;
            check_engine_profile(eng_profile)?;
            Ok(found)
        })?;
        // SAFETY: NVML contract: `info` is null or valid for one write.
        unsafe { out::write(info, found.v1()) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceProfileInfoV`: fills a `_v2` or `_v3`
/// struct as its `version` says; `ARGUMENT_VERSION_MISMATCH` otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    gpu_instance: NvmlGpuInstance,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut NvmlComputeInstanceProfileInfoV2,
) -> NvmlReturn {
    entry(|| {
        let (found, version) = node::read(|s| {
            lookup::gpu_instance_of(s, gpu_instance)?;
            // SAFETY: NVML contract: `info` is null or a caller-owned versioned struct.
            let version = unsafe { out::read_version(info) }?;
            if version != COMPUTE_INSTANCE_PROFILE_INFO_V2
                && version != COMPUTE_INSTANCE_PROFILE_INFO_V3
            {
                return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
            }
            let (_, _, found) = ci_profile(s, gpu_instance, profile)?;
            check_engine_profile(eng_profile)?;
            Ok((found, version))
        })?;
        if version == COMPUTE_INSTANCE_PROFILE_INFO_V3 {
            // SAFETY: NVML contract: a struct whose version says v3 is a
            // caller-owned nvmlComputeInstanceProfileInfo_v3_t (non-null: read above).
            unsafe { out::write(info.cast::<NvmlComputeInstanceProfileInfoV3>(), found.v3()) }
        } else {
            // SAFETY: as above, for v2.
            unsafe { out::write(info, found.v2()) }
        }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceRemainingCapacity`: 1 while the GI has
/// no compute instance, else 0.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    count: *mut c_uint,
) -> NvmlReturn {
    // SAFETY: NVML contract: `count` is null or valid for one write.
    unsafe {
        answer(count, |s| {
            let (_, gi, _) = ci_profile(s, gpu_instance, profile_id)?;
            Ok(c_uint::from(gi.compute_instances.is_empty()))
        })
    }
}

/// `nvmlGpuInstanceGetComputeInstancePossiblePlacements`: the one placement,
/// `{0, <GI compute slices>}`. With `placements` NULL only `*count` is written.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    placements: *mut NvmlPlacement,
    count: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let placement = node::read(|s| {
            let (_, _, found) = ci_profile(s, gpu_instance, profile_id)?;
            Ok(full_ci_placement(found.gi_profile))
        })?;
        // SAFETY: NVML contract: `count` is null or valid for one write; a
        // non-null `placements` holds every placement (one).
        unsafe { out::write_counted(placements, count, &[placement]) }
    })
}

fn full_ci_placement(gi_profile: &GiProfileSpec) -> NvmlPlacement {
    NvmlPlacement {
        start: 0,
        size: gi_profile.compute_slices,
    }
}

// ---------------------------------------------------------- compute instances

/// Creates the compute instance spanning the GI behind `gpu_instance`.
fn create_compute_instance(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    placement: Option<NvmlPlacement>,
) -> Res<NvmlComputeInstance> {
    let (index, gi) = node::read(|s| {
        let (gpu, gi, found) = ci_profile(s, gpu_instance, profile_id)?;
        profiles::mig_enabled(gpu)?;
        if placement.is_some_and(|p| p != full_ci_placement(found.gi_profile)) {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        Ok((gpu.index, gi.id))
    })?;
    let ci = node::update(|s| {
        tessera_sim::mig::create_compute_instance(s, index, gi).map_err(|e| match e {
            // The GPU instance vanished between the two steps: a stale handle.
            tessera_sim::SimError::NotFound(_) => ERROR_INVALID_ARGUMENT,
            e => node::sim_code(&e),
        })
    })?;
    lookup::ci_handle(index, gi, ci)
}

/// `nvmlGpuInstanceCreateComputeInstance`: `INSUFFICIENT_RESOURCES` when the
/// GI already holds its compute instance.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    compute_instance: *mut NvmlComputeInstance,
) -> NvmlReturn {
    let create = || create_compute_instance(gpu_instance, profile_id, None);
    // SAFETY: NVML contract: `compute_instance` is null or valid for one write.
    unsafe { write_created(compute_instance, create) }
}

/// `nvmlGpuInstanceCreateComputeInstanceWithPlacement`: the placement must be
/// the one possible placement.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    placement: *const NvmlPlacement,
    compute_instance: *mut NvmlComputeInstance,
) -> NvmlReturn {
    let create = || {
        // SAFETY: NVML contract: `placement` is null or valid for one read.
        let placement = unsafe { out::read(placement) }?;
        create_compute_instance(gpu_instance, profile_id, Some(placement))
    };
    // SAFETY: NVML contract: `compute_instance` is null or valid for one write.
    unsafe { write_created(compute_instance, create) }
}

/// `nvmlComputeInstanceDestroy`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(
    compute_instance: NvmlComputeInstance,
) -> NvmlReturn {
    entry(|| {
        node::update(|s| {
            let (gpu, gi, ci) = lookup::compute_instance_of(s, compute_instance)?;
            let (index, gi, ci) = (gpu.index, gi.id, ci.id);
            lookup::gpu(s, index)?;
            let gpu = s.gpu_mut(index).ok_or(ERROR_INVALID_ARGUMENT)?;
            tessera_sim::mig::destroy_compute_instance(gpu, gi, ci).map_err(|e| node::sim_code(&e))
        })
    })
}

/// `nvmlGpuInstanceGetComputeInstances`: the GI's compute instances of one
/// profile (zero or one).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gpu_instance: NvmlGpuInstance,
    profile_id: c_uint,
    compute_instances: *mut NvmlComputeInstance,
    count: *mut c_uint,
) -> NvmlReturn {
    entry(|| {
        let handles = node::read(|s| {
            let (gpu, gi, _) = ci_profile(s, gpu_instance, profile_id)?;
            gi.compute_instances
                .iter()
                .filter(|ci| ci.profile_id == profile_id)
                .map(|ci| lookup::ci_handle(gpu.index, gi.id, ci.id))
                .collect::<Res<Vec<_>>>()
        })?;
        // SAFETY: NVML contract: `compute_instances` is null or holds the
        // profile's instance count of handles (at least as many as exist);
        // `count` is null or valid for one write.
        unsafe { out::write_array(compute_instances, count, &handles) }
    })
}

/// `nvmlGpuInstanceGetComputeInstanceById`: `NOT_FOUND` when the GI has no
/// compute instance with the id.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceById(
    gpu_instance: NvmlGpuInstance,
    id: c_uint,
    compute_instance: *mut NvmlComputeInstance,
) -> NvmlReturn {
    // SAFETY: NVML contract: `compute_instance` is null or valid for one write.
    unsafe {
        answer(compute_instance, |s| {
            let (gpu, gi) = lookup::gpu_instance_of(s, gpu_instance)?;
            let ci = gi.compute_instance(id).ok_or(ERROR_NOT_FOUND)?;
            lookup::ci_handle(gpu.index, gi.id, ci.id)
        })
    }
}

/// # Safety
/// `info` is null or valid for one write.
unsafe fn compute_instance_info(
    compute_instance: NvmlComputeInstance,
    info: *mut NvmlComputeInstanceInfo,
) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe {
        answer(info, |s| {
            let (gpu, gi, ci) = lookup::compute_instance_of(s, compute_instance)?;
            let gi_profile = profiles::gi_profile_of(gpu, gi)?;
            Ok(NvmlComputeInstanceInfo {
                device: lookup::gpu_handle(gpu.index)?,
                gpu_instance: lookup::gi_handle(gpu.index, gi.id)?,
                id: ci.id,
                profile_id: ci.profile_id,
                placement: full_ci_placement(gi_profile),
            })
        })
    }
}

/// `nvmlComputeInstanceGetInfo_v2`: parent device and GI, id, profile id,
/// placement on the GI's compute slices.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    compute_instance: NvmlComputeInstance,
    info: *mut NvmlComputeInstanceInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { compute_instance_info(compute_instance, info) }
}

/// `nvmlComputeInstanceGetInfo` (the older name): same as `_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo(
    compute_instance: NvmlComputeInstance,
    info: *mut NvmlComputeInstanceInfo,
) -> NvmlReturn {
    // SAFETY: NVML contract, forwarded.
    unsafe { compute_instance_info(compute_instance, info) }
}
