//! What NVML reports about a GPU model and its MIG profiles, derived from the
//! model catalogue (`tessera_model::mig::catalogue`).
//!
//! The catalogue holds the facts Tessera relies on (ids, enum indexes,
//! slices, memory, SMs, placements). The engine counts NVML also reports are
//! not in it; they follow the shape of real `nvidia-smi mig -lgip` output on
//! A100: one copy engine per compute slice, `⌊5·slices/7⌋` decoders, a JPEG
//! decoder and an OFA only on the whole-GPU profile and on `+me` profiles,
//! no encoders.
//!
//! Names follow NVML: a GPU-instance profile's versioned-info `name` is
//! `MIG <profile>` (`MIG 1g.10gb`, as `nvidia-smi mig -lgip` prints it); the
//! compute-instance profile that spans the whole GI has the GI's name; a MIG
//! device's `nvmlDeviceGetName` is `<product> MIG <profile>`
//! (`NVIDIA A100-SXM4-40GB MIG 1g.5gb`).

use tessera_model::mig::catalogue::{self, GiProfileSpec, GpuModelSpec, MigSpec};
use tessera_sim::state::{SimGpu, SimGpuInstance};

use crate::ffi::{
    COMPUTE_INSTANCE_PROFILE_CAPS_GFX, ERROR_INVALID_ARGUMENT, ERROR_NOT_SUPPORTED, ERROR_UNKNOWN,
    GPU_INSTANCE_PROFILE_CAPS_GFX,
};
use crate::node::Res;

const MIB: u64 = 1024 * 1024;

/// The catalogue entry of the GPU's model; `UNKNOWN` when the state names a
/// model the catalogue lacks (a state file from another version).
pub fn model(gpu: &SimGpu) -> Res<&'static GpuModelSpec> {
    catalogue::find(&gpu.model).ok_or(ERROR_UNKNOWN)
}

/// The GPU's MIG description; `NOT_SUPPORTED` for a model without MIG.
pub fn mig(gpu: &SimGpu) -> Res<&'static MigSpec> {
    model(gpu)?.mig.as_ref().ok_or(ERROR_NOT_SUPPORTED)
}

/// Like [`mig`], but also `NOT_SUPPORTED` while MIG mode is off: what every
/// call that needs MIG enabled answers.
pub fn mig_enabled(gpu: &SimGpu) -> Res<&'static MigSpec> {
    let spec = mig(gpu)?;
    if gpu.mig_enabled {
        Ok(spec)
    } else {
        Err(ERROR_NOT_SUPPORTED)
    }
}

/// The GI profile with device profile id `id`; `INVALID_ARGUMENT` when the
/// model has none (as the simulated driver's rules answer).
pub fn gi_profile(spec: &'static MigSpec, id: u32) -> Res<&'static GiProfileSpec> {
    spec.profile_by_id(id).ok_or(ERROR_INVALID_ARGUMENT)
}

/// The profile of an existing GPU instance.
pub fn gi_profile_of(gpu: &SimGpu, gi: &SimGpuInstance) -> Res<&'static GiProfileSpec> {
    // A live GI with a profile the catalogue lacks is a broken state file.
    mig(gpu)?.profile_by_id(gi.profile_id).ok_or(ERROR_UNKNOWN)
}

/// Bytes of `mib` MiB.
pub fn bytes(mib: u64) -> u64 {
    mib * MIB
}

/// Engine counts of a GI profile, shared by its compute instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Engines {
    /// Copy engines.
    pub copy: u32,
    /// Video decoders.
    pub decoder: u32,
    /// Video encoders.
    pub encoder: u32,
    /// JPEG decoders.
    pub jpeg: u32,
    /// Optical-flow accelerators.
    pub ofa: u32,
}

/// The engines of `profile` on a GPU whose memory axis is `axis_len` slices long.
pub fn engines(profile: &GiProfileSpec, axis_len: u32) -> Engines {
    let no_media = profile.name.contains("-me");
    let media = !no_media && (profile.name.contains("+me") || profile.memory_slices == axis_len);
    let decoder = if no_media {
        0
    } else {
        (profile.compute_slices * 5 / 7).max(u32::from(media))
    };
    Engines {
        copy: profile.compute_slices,
        decoder,
        encoder: 0,
        jpeg: u32::from(media),
        ofa: u32::from(media),
    }
}

/// `MIG <profile>`, the versioned GI-profile-info name.
pub fn gi_profile_name(profile: &GiProfileSpec) -> String {
    format!("MIG {}", profile.name)
}

/// `NVML_GPU_INSTANCE_PROFILE_CAPS_*` of a profile.
pub fn gi_capabilities(profile: &GiProfileSpec) -> u32 {
    if profile.name.contains("+gfx") {
        GPU_INSTANCE_PROFILE_CAPS_GFX
    } else {
        0
    }
}

/// `NVML_COMPUTE_INSTANCE_PROFILE_CAPS_*` of the compute instance spanning `profile`.
pub fn ci_capabilities(profile: &GiProfileSpec) -> u32 {
    if profile.name.contains("+gfx") {
        COMPUTE_INSTANCE_PROFILE_CAPS_GFX
    } else {
        0
    }
}

/// The CI profile id (= its `NVML_COMPUTE_INSTANCE_PROFILE_*` enum) of the
/// compute instance that spans a GI of `profile`: the only CI profile the
/// simulated driver offers.
pub fn full_ci_profile(profile: &GiProfileSpec) -> Res<u32> {
    catalogue::whole_ci_profile(profile.compute_slices).ok_or(ERROR_UNKNOWN)
}

/// `nvmlDeviceGetName` of a MIG device on a GPU of `model`.
pub fn mig_device_name(model: &GpuModelSpec, profile: &GiProfileSpec) -> String {
    format!("{} MIG {}", model.product_name, profile.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100(name: &str) -> &'static GiProfileSpec {
        let spec = catalogue::find("A100-40GB").unwrap().mig.as_ref().unwrap();
        spec.profile_by_name(name).unwrap()
    }

    #[test]
    fn engines_follow_the_a100_lgip_table() {
        let e = |n| engines(a100(n), 8);
        assert_eq!(
            e("1g.5gb"),
            Engines {
                copy: 1,
                decoder: 0,
                encoder: 0,
                jpeg: 0,
                ofa: 0
            }
        );
        assert_eq!(
            e("1g.5gb+me"),
            Engines {
                copy: 1,
                decoder: 1,
                encoder: 0,
                jpeg: 1,
                ofa: 1
            }
        );
        assert_eq!(e("2g.10gb").decoder, 1);
        assert_eq!(e("3g.20gb").decoder, 2);
        assert_eq!(e("4g.20gb").decoder, 2);
        assert_eq!(
            e("7g.40gb"),
            Engines {
                copy: 7,
                decoder: 5,
                encoder: 0,
                jpeg: 1,
                ofa: 1
            }
        );
    }

    #[test]
    fn names_carry_the_mig_prefix() {
        assert_eq!(gi_profile_name(a100("1g.10gb")), "MIG 1g.10gb");
        let model = catalogue::find("A100-40GB").unwrap();
        assert_eq!(
            mig_device_name(model, a100("1g.5gb")),
            "NVIDIA A100-SXM4-40GB MIG 1g.5gb"
        );
    }

    #[test]
    fn full_compute_instance_profile_matches_the_slices() {
        assert_eq!(full_ci_profile(a100("1g.5gb")), Ok(0));
        assert_eq!(full_ci_profile(a100("3g.20gb")), Ok(2));
        assert_eq!(full_ci_profile(a100("7g.40gb")), Ok(4));
    }
}
