//! Static MIG profile catalogue of the GPU models Tessera knows.
//!
//! Real nodes always **query** NVML for profiles and placements; this table is
//! what the simulated node serves and what tests check the placement engine
//! against. The data follow `reference/mig.md`. Each model's entries say which
//! facts were seen in real `nvidia-smi mig -lgip/-lgipp` output ("verified")
//! and which were carried over from the same die or layout ("inferred").
//! Memory sizes are picked inside the ranges real drivers report; exact MiB
//! vary with the driver version.

use super::placement::{Placement, ProfileLayout};

/// One GPU model: what NVML reports for the whole GPU, and its MIG profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GpuModelSpec {
    /// Short key Tessera uses for the model, e.g. `A100-40GB` (see [`find`]).
    pub key: &'static str,
    /// Product name as `nvmlDeviceGetName` reports it, e.g. `NVIDIA A100-SXM4-40GB`.
    pub product_name: &'static str,
    /// Total framebuffer memory in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of the whole GPU.
    pub sm_count: u32,
    /// MIG support; `None` when the model cannot be partitioned.
    pub mig: Option<MigSpec>,
}

/// How a MIG-capable model partitions: its placement axis and GPU-instance profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MigSpec {
    /// Length of the memory-slice axis: `max(start + size)` over all profiles
    /// (8 on A100/H100/H200/B200, 4 on A30, 12 on RTX PRO 6000 Blackwell).
    pub axis_len: u32,
    /// Most MIG devices the GPU can hold at once (`nvmlDeviceGetMaxMigDeviceCount`).
    pub max_mig_devices: u32,
    /// GPU-instance profiles, grouped by size (NVML enumerates them by enum
    /// index: see [`MigSpec::profile_by_enum`]).
    pub profiles: &'static [GiProfileSpec],
}

impl MigSpec {
    /// The profile with this **device profile id** (19, 14, 9, 0 …), the id every
    /// MIG call but the profile-info query takes.
    pub fn profile_by_id(&self, id: u32) -> Option<&'static GiProfileSpec> {
        self.profiles.iter().find(|p| p.id == id)
    }

    /// The profile with this name, e.g. `3g.40gb` or `1g.10gb+me` (case-insensitive).
    pub fn profile_by_name(&self, name: &str) -> Option<&'static GiProfileSpec> {
        let name = name.trim();
        self.profiles
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
    }

    /// The profile NVML reports for this `NVML_GPU_INSTANCE_PROFILE_*` **enum index**.
    pub fn profile_by_enum(&self, enum_index: u32) -> Option<&'static GiProfileSpec> {
        self.profiles.iter().find(|p| p.enum_index == enum_index)
    }
}

/// One GPU-instance profile of one GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GiProfileSpec {
    /// Profile name as NVIDIA writes it, e.g. `1g.10gb`, `1g.10gb+me`.
    pub name: &'static str,
    /// Device profile id (`nvmlGpuInstanceProfileInfo_t.id`).
    pub id: u32,
    /// `NVML_GPU_INSTANCE_PROFILE_*` enum index the profile is queried with.
    pub enum_index: u32,
    /// Compute slices (the `N` of `Ng`).
    pub compute_slices: u32,
    /// Memory slices: the size of every placement of this profile.
    pub memory_slices: u32,
    /// Memory of one instance in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    pub sm_count: u32,
    /// Most instances of this profile the GPU can hold.
    pub max_instances: u32,
    /// Legal placement starts on the memory-slice axis, ascending.
    pub starts: &'static [u32],
}

impl GiProfileSpec {
    /// Legal placements of this profile, ascending by start.
    pub fn placements(&self) -> impl Iterator<Item = Placement> {
        let size = self.memory_slices;
        self.starts
            .iter()
            .map(move |&start| Placement { start, size })
    }
}

impl ProfileLayout for GiProfileSpec {
    fn profile_id(&self) -> u32 {
        self.id
    }

    fn profile_name(&self) -> &str {
        self.name
    }

    fn legal_placements(&self) -> impl Iterator<Item = Placement> {
        self.placements()
    }
}

/// Every model in the catalogue.
pub fn models() -> &'static [GpuModelSpec] {
    MODELS
}

/// The model with this key (`A30`, `A100-40GB`, `A100-80GB`, `H100-80GB`,
/// `H100-94GB`, `H200-141GB`, `B200`, `RTX-PRO-6000`), compared case-insensitively.
pub fn find(key: &str) -> Option<&'static GpuModelSpec> {
    let key = key.trim();
    MODELS.iter().find(|m| m.key.eq_ignore_ascii_case(key))
}

/// The model whose product name (as `nvmlDeviceGetName` reports it) is `name`,
/// compared case-insensitively. Only the exact board names in the catalogue
/// match (e.g. `NVIDIA H100 PCIe`, with 114 SMs, is not `H100-80GB`).
pub fn find_by_product_name(name: &str) -> Option<&'static GpuModelSpec> {
    let name = name.trim();
    MODELS
        .iter()
        .find(|m| m.product_name.eq_ignore_ascii_case(name))
}

/// The compute-instance profile (`NVML_COMPUTE_INSTANCE_PROFILE_*`, which is
/// also its id) of the compute instance that spans a whole GPU instance of
/// `compute_slices` compute slices; `None` for a count no CI profile has.
pub fn whole_ci_profile(compute_slices: u32) -> Option<u32> {
    match compute_slices {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

// NVML_GPU_INSTANCE_PROFILE_* enum indexes used below.
const E_1: u32 = 0;
const E_2: u32 = 1;
const E_3: u32 = 2;
const E_4: u32 = 3;
const E_7: u32 = 4;
const E_1_REV1: u32 = 7; // 1g +me
const E_2_REV1: u32 = 8; // 2g +me (A30)
const E_1_REV2: u32 = 9; // 1g with double memory
const E_1_GFX: u32 = 0xA;
const E_2_GFX: u32 = 0xB;
const E_4_GFX: u32 = 0xC;
const E_1_NO_ME: u32 = 0xD;
const E_2_NO_ME: u32 = 0xE;
const E_1_ALL_ME: u32 = 0xF;
const E_2_ALL_ME: u32 = 0x10;

// Start sets shared by the models with an 8-slice axis (A100 layout).
const S_1G: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const S_1G_DOUBLE: &[u32] = &[0, 2, 4, 6];
const S_2G: &[u32] = &[0, 2, 4];
const S_3G: &[u32] = &[0, 4];
const S_0: &[u32] = &[0];

/// The seven profile names of the A100/H100 family layout, in the order
/// [`a100_layout`] takes them, from the GB in the names of its 1g, 1g double
/// memory (and 2g), 3g (and 4g) and 7g profiles.
macro_rules! a100_names {
    ($g1:literal, $g2:literal, $g4:literal, $g7:literal) => {
        [
            concat!("1g.", $g1, "gb"),
            concat!("1g.", $g1, "gb+me"),
            concat!("1g.", $g2, "gb"),
            concat!("2g.", $g2, "gb"),
            concat!("3g.", $g4, "gb"),
            concat!("4g.", $g4, "gb"),
            concat!("7g.", $g7, "gb"),
        ]
    };
}

/// SMs of 1g, 1g double memory, 2g, 3g, 4g and 7g on the A100 (108-SM die).
const SM_A100: [u32; 6] = [14, 14, 28, 42, 56, 98];
/// SMs of 1g, 1g double memory, 2g, 3g, 4g and 7g on the H100/H200 (132 SMs).
const SM_H100: [u32; 6] = [16, 26, 32, 60, 64, 132];

/// Builds the seven profiles of the A100/H100 family layout (8-slice axis).
/// Arguments: the names ([`a100_names`]); memory MiB of 1g, 1g double memory
/// (= 2g), 3g (= 4g) and 7g; SMs of 1g, 1g double memory, 2g, 3g, 4g and 7g.
const fn a100_layout(
    names: [&'static str; 7],
    memory: [u64; 4],
    sm: [u32; 6],
) -> [GiProfileSpec; 7] {
    let [n1, n1me, n1d, n2, n3, n4, n7] = names;
    let [mem_1g, mem_1g_double, mem_half, mem_full] = memory;
    let [sm1, sm1d, sm2, sm3, sm4, sm7] = sm;
    [
        gi(n1, 19, E_1, 1, 1, mem_1g, sm1, 7, S_1G),
        gi(n1me, 20, E_1_REV1, 1, 1, mem_1g, sm1, 1, S_1G),
        gi(n1d, 15, E_1_REV2, 1, 2, mem_1g_double, sm1d, 4, S_1G_DOUBLE),
        gi(n2, 14, E_2, 2, 2, mem_1g_double, sm2, 3, S_2G),
        gi(n3, 9, E_3, 3, 4, mem_half, sm3, 2, S_3G),
        gi(n4, 5, E_4, 4, 4, mem_half, sm4, 1, S_0),
        gi(n7, 0, E_7, 7, 8, mem_full, sm7, 1, S_0),
    ]
}

#[allow(clippy::too_many_arguments)]
const fn gi(
    name: &'static str,
    id: u32,
    enum_index: u32,
    compute_slices: u32,
    memory_slices: u32,
    memory_mib: u64,
    sm_count: u32,
    max_instances: u32,
    starts: &'static [u32],
) -> GiProfileSpec {
    GiProfileSpec {
        name,
        id,
        enum_index,
        compute_slices,
        memory_slices,
        memory_mib,
        sm_count,
        max_instances,
        starts,
    }
}

/// A100-SXM4-40GB / PCIe 40GB: names, ids, placements, SMs and instance
/// counts verified (mig.md). Memory as nvidia-smi shows it: ≈ 4.75 / 9.62 /
/// 19.62 / 39.25–39.5 GiB (mig.md). The exact MiB are **inferred**, read off
/// those GiB figures (4864 = 4.75 GiB, 9856 = 9.625, 20096 = 19.625, 40448 =
/// 39.5 GiB, the top of the 7g range); no output seen confirms them.
const A100_40GB: [GiProfileSpec; 7] = a100_layout(
    a100_names!(5, 10, 20, 40),
    [4864, 9856, 20096, 40448],
    SM_A100,
);

/// A100-80GB: names and memory verified; ids, placements and SMs inferred = A100-40GB.
const A100_80GB: [GiProfileSpec; 7] = a100_layout(
    a100_names!(10, 20, 40, 80),
    [9728, 19968, 40192, 80896],
    SM_A100,
);

/// H100 80GB SXM5: names, ids, placements, SMs verified. Memory ≈ 9.75 / 19.62 /
/// 39.5 / 79.25 GiB. The +me SM count is inferred = 1g.
const H100_80GB: [GiProfileSpec; 7] = a100_layout(
    a100_names!(10, 20, 40, 80),
    [9984, 20096, 40448, 81152],
    SM_H100,
);

/// H100 94GB NVL: names, ids, placements verified (same as H100 80GB); memory ≈
/// 10.75 / 21.62 / 46.38 / 93.12 GiB; SMs inferred = H100 80GB SXM5.
const H100_94GB: [GiProfileSpec; 7] = a100_layout(
    a100_names!(12, 24, 47, 94),
    [11008, 22144, 47488, 95360],
    SM_H100,
);

/// H200 141GB: ids 19/20/14/0 verified, 15/9/5 and placements inferred = H100.
/// Memory verified for 1g (16 GiB), 2g (32.5 GiB) and 7g (140 GiB); 1g.35gb
/// inferred = 2g; 3g/4g (66.5 GiB) inferred. SMs verified for 1g/2g/7g
/// (16/32/132), the rest inferred = H100.
const H200_141GB: [GiProfileSpec; 7] = a100_layout(
    a100_names!(18, 35, 71, 141),
    [16384, 33280, 68096, 143360],
    SM_H100,
);

/// B200 180GB: names, 1g = 18 SMs and 148 SMs in all from mig.md; ids,
/// placements, memory and the other SM counts inferred (H100 fractions:
/// 3g takes 4 of 8 memory slices but 3 of 7 compute slices).
const B200: [GiProfileSpec; 7] = a100_layout(
    a100_names!(23, 45, 90, 180),
    [22784, 45312, 90880, 182272],
    [18, 18, 36, 54, 72, 148],
);

/// A30 24GB: names, ids, placements and memory (5952 / 11968 / ≈ 24000 MiB)
/// verified; SMs inferred (56 SMs in all, 14 per compute slice).
const A30: [GiProfileSpec; 5] = [
    gi("1g.6gb", 14, E_1, 1, 1, 5952, 14, 4, &[0, 1, 2, 3]),
    gi("1g.6gb+me", 21, E_1_REV1, 1, 1, 5952, 14, 1, &[0, 1, 2, 3]),
    gi("2g.12gb", 5, E_2, 2, 2, 11968, 28, 2, &[0, 2]),
    gi("2g.12gb+me", 6, E_2_REV1, 2, 2, 11968, 28, 1, &[0, 2]),
    gi("4g.24gb", 0, E_4, 4, 4, 24192, 56, 1, S_0),
];

const RTX_1G: &[u32] = &[0, 3, 6, 9];
const RTX_2G: &[u32] = &[0, 6];

/// RTX PRO 6000 Blackwell Server Edition 96GB: 12-slice axis; names, ids and
/// placements verified. Memory per profile and SMs inferred (188 SMs in all).
/// Max instances: plain profiles follow from the placements; +me and +me.all
/// inferred as 1 (as on other GPUs), +gfx and -me inferred as the plain profile.
const RTX_PRO_6000: [GiProfileSpec; 11] = [
    gi("1g.24gb", 14, E_1, 1, 3, 24064, 46, 4, RTX_1G),
    gi("2g.48gb", 5, E_2, 2, 6, 48384, 94, 2, RTX_2G),
    gi("4g.96gb", 0, E_4, 4, 12, 97024, 188, 1, S_0),
    gi("1g.24gb+me", 21, E_1_REV1, 1, 3, 24064, 46, 1, RTX_1G),
    gi("1g.24gb+gfx", 47, E_1_GFX, 1, 3, 24064, 46, 4, RTX_1G),
    gi("2g.48gb+gfx", 35, E_2_GFX, 2, 6, 48384, 94, 2, RTX_2G),
    gi("4g.96gb+gfx", 32, E_4_GFX, 4, 12, 97024, 188, 1, S_0),
    gi("1g.24gb-me", 67, E_1_NO_ME, 1, 3, 24064, 46, 4, RTX_1G),
    gi("2g.48gb-me", 66, E_2_NO_ME, 2, 6, 48384, 94, 2, RTX_2G),
    gi("1g.24gb+me.all", 65, E_1_ALL_ME, 1, 3, 24064, 46, 1, RTX_1G),
    gi("2g.48gb+me.all", 64, E_2_ALL_ME, 2, 6, 48384, 94, 1, RTX_2G),
    // No 4g +me.all / -me variant appears in mig.md: 4g already holds every media engine.
];

const fn mig(
    axis_len: u32,
    max_mig_devices: u32,
    profiles: &'static [GiProfileSpec],
) -> Option<MigSpec> {
    Some(MigSpec {
        axis_len,
        max_mig_devices,
        profiles,
    })
}

/// Whole-GPU memory and SM counts: product names from mig.md; memory is what
/// `nvidia-smi` shows for the board (inferred where not in mig.md).
static MODELS: &[GpuModelSpec] = &[
    GpuModelSpec {
        key: "A30",
        product_name: "NVIDIA A30",
        memory_mib: 24576,
        sm_count: 56,
        mig: mig(4, 4, &A30),
    },
    GpuModelSpec {
        key: "A100-40GB",
        product_name: "NVIDIA A100-SXM4-40GB",
        memory_mib: 40960,
        sm_count: 108,
        mig: mig(8, 7, &A100_40GB),
    },
    GpuModelSpec {
        key: "A100-80GB",
        product_name: "NVIDIA A100-SXM4-80GB",
        memory_mib: 81920,
        sm_count: 108,
        mig: mig(8, 7, &A100_80GB),
    },
    GpuModelSpec {
        key: "H100-80GB",
        product_name: "NVIDIA H100 80GB HBM3",
        memory_mib: 81559,
        sm_count: 132,
        mig: mig(8, 7, &H100_80GB),
    },
    GpuModelSpec {
        key: "H100-94GB",
        product_name: "NVIDIA H100 NVL",
        memory_mib: 95830,
        sm_count: 132,
        mig: mig(8, 7, &H100_94GB),
    },
    GpuModelSpec {
        key: "H200-141GB",
        product_name: "NVIDIA H200",
        memory_mib: 143771,
        sm_count: 132,
        mig: mig(8, 7, &H200_141GB),
    },
    GpuModelSpec {
        key: "B200",
        product_name: "NVIDIA B200",
        memory_mib: 183359,
        sm_count: 148,
        mig: mig(8, 7, &B200),
    },
    GpuModelSpec {
        key: "RTX-PRO-6000",
        product_name: "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        memory_mib: 97887,
        sm_count: 188,
        mig: mig(12, 4, &RTX_PRO_6000),
    },
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn mig_models() -> impl Iterator<Item = (&'static GpuModelSpec, MigSpec)> {
        models().iter().filter_map(|m| m.mig.map(|mig| (m, mig)))
    }

    /// Splits `<N>g.<M>gb[suffix]` into (N, M, suffix).
    fn parse_name(name: &str) -> Option<(u32, u32, &str)> {
        let (n, rest) = name.split_once("g.")?;
        let gb = rest.find("gb")?;
        let (m, suffix) = (&rest[..gb], &rest[gb + 2..]);
        Some((n.parse().ok()?, m.parse().ok()?, suffix))
    }

    #[test]
    fn keys_are_the_documented_ones() {
        let keys: Vec<&str> = models().iter().map(|m| m.key).collect();
        assert_eq!(
            keys,
            [
                "A30",
                "A100-40GB",
                "A100-80GB",
                "H100-80GB",
                "H100-94GB",
                "H200-141GB",
                "B200",
                "RTX-PRO-6000"
            ]
        );
        let names: HashSet<&str> = models().iter().map(|m| m.product_name).collect();
        assert_eq!(names.len(), models().len(), "product names are unique");
    }

    #[test]
    fn find_is_case_insensitive() {
        assert_eq!(find("a100-40gb").map(|m| m.key), Some("A100-40GB"));
        assert_eq!(find(" rtx-pro-6000 ").map(|m| m.key), Some("RTX-PRO-6000"));
        assert_eq!(find("V100"), None);
        assert_eq!(
            find_by_product_name("NVIDIA H100 80GB HBM3").map(|m| m.key),
            Some("H100-80GB")
        );
        assert_eq!(
            find_by_product_name("nvidia h100 nvl").map(|m| m.key),
            Some("H100-94GB")
        );
        assert_eq!(
            find_by_product_name("NVIDIA RTX PRO 6000 Blackwell Server Edition").map(|m| m.key),
            Some("RTX-PRO-6000")
        );
        assert_eq!(find_by_product_name("NVIDIA H100 PCIe"), None);
    }

    #[test]
    fn placements_lie_on_the_axis_and_the_axis_is_their_end() {
        for (model, mig) in mig_models() {
            assert!(mig.axis_len >= 1 && mig.axis_len <= 64, "{}", model.key);
            let mut max_end = 0;
            for p in mig.profiles {
                assert!(
                    !p.starts.is_empty(),
                    "{} {} has no placement",
                    model.key,
                    p.name
                );
                assert!(
                    p.starts.windows(2).all(|w| w[0] < w[1]),
                    "{} {} starts ascend",
                    model.key,
                    p.name
                );
                for pl in p.placements() {
                    assert_eq!(pl.size, p.memory_slices);
                    assert_eq!(
                        Placement::new(pl.start, pl.size),
                        Ok(pl),
                        "{} {}",
                        model.key,
                        p.name
                    );
                    assert!(
                        pl.end() <= mig.axis_len,
                        "{} {} {pl} past the axis",
                        model.key,
                        p.name
                    );
                    max_end = max_end.max(pl.end());
                }
            }
            assert_eq!(
                mig.axis_len, max_end,
                "{}: axis_len is max(start + size)",
                model.key
            );
        }
        assert_eq!(find("A30").and_then(|m| m.mig).map(|m| m.axis_len), Some(4));
        assert_eq!(
            find("RTX-PRO-6000").and_then(|m| m.mig).map(|m| m.axis_len),
            Some(12)
        );
        assert_eq!(
            find("H200-141GB").and_then(|m| m.mig).map(|m| m.axis_len),
            Some(8)
        );
    }

    #[test]
    fn ids_enums_and_names_are_unique_per_model() {
        for (model, mig) in mig_models() {
            let ids: HashSet<u32> = mig.profiles.iter().map(|p| p.id).collect();
            let enums: HashSet<u32> = mig.profiles.iter().map(|p| p.enum_index).collect();
            let names: HashSet<&str> = mig.profiles.iter().map(|p| p.name).collect();
            assert_eq!(ids.len(), mig.profiles.len(), "{}: ids unique", model.key);
            assert_eq!(
                enums.len(),
                mig.profiles.len(),
                "{}: enum indexes unique",
                model.key
            );
            assert_eq!(
                names.len(),
                mig.profiles.len(),
                "{}: names unique",
                model.key
            );
            for p in mig.profiles {
                assert_eq!(mig.profile_by_id(p.id), Some(p));
                assert_eq!(mig.profile_by_enum(p.enum_index), Some(p));
                assert_eq!(mig.profile_by_name(&p.name.to_uppercase()), Some(p));
            }
        }
    }

    #[test]
    fn names_parse_and_agree_with_slices_and_memory() {
        for (model, mig) in mig_models() {
            for p in mig.profiles {
                let (n, gb, suffix) = parse_name(p.name)
                    .unwrap_or_else(|| panic!("{} {}: not <N>g.<M>gb[suffix]", model.key, p.name));
                assert!(
                    ["", "+me", "+gfx", "+me.all", "-me"].contains(&suffix),
                    "{} {}: unknown suffix {suffix:?}",
                    model.key,
                    p.name
                );
                assert_eq!(n, p.compute_slices, "{} {}", model.key, p.name);
                // The name's GB and the MiB differ by rounding and reserved memory: within 10%.
                let named_mib = f64::from(gb) * 1e9 / 1_048_576.0;
                let ratio = p.memory_mib as f64 / named_mib;
                assert!(
                    (0.9..=1.1).contains(&ratio),
                    "{} {}: {} MiB does not look like {gb} GB",
                    model.key,
                    p.name,
                    p.memory_mib
                );
                assert!(p.memory_mib <= model.memory_mib, "{} {}", model.key, p.name);
                assert!(p.sm_count <= model.sm_count, "{} {}", model.key, p.name);
                assert!(p.sm_count > 0 && p.compute_slices > 0 && p.memory_slices > 0);
            }
        }
    }

    #[test]
    fn enum_indexes_match_the_slice_counts_and_variants() {
        for (model, mig) in mig_models() {
            for p in mig.profiles {
                let expected_slices = match p.enum_index {
                    E_1 | E_1_REV1 | E_1_REV2 | E_1_GFX | E_1_NO_ME | E_1_ALL_ME => 1,
                    E_2 | E_2_REV1 | E_2_GFX | E_2_NO_ME | E_2_ALL_ME => 2,
                    E_3 => 3,
                    E_4 | E_4_GFX => 4,
                    E_7 => 7,
                    other => panic!("{} {}: unexpected enum {other}", model.key, p.name),
                };
                assert_eq!(
                    p.compute_slices, expected_slices,
                    "{} {}",
                    model.key, p.name
                );
                let variant = match p.enum_index {
                    E_1_REV1 | E_2_REV1 => "+me",
                    E_1_GFX | E_2_GFX | E_4_GFX => "+gfx",
                    E_1_NO_ME | E_2_NO_ME => "-me",
                    E_1_ALL_ME | E_2_ALL_ME => "+me.all",
                    _ => "",
                };
                assert!(
                    p.name.ends_with(&format!("gb{variant}")),
                    "{} {}",
                    model.key,
                    p.name
                );
                if variant == "+me" || variant == "+me.all" {
                    assert_eq!(
                        p.max_instances, 1,
                        "{} {}: one media-engine instance",
                        model.key, p.name
                    );
                }
            }
        }
    }

    #[test]
    fn max_instances_fit_side_by_side() {
        for (model, mig) in mig_models() {
            assert!(mig.max_mig_devices >= 1);
            for p in mig.profiles {
                assert!(p.max_instances >= 1 && p.max_instances <= mig.max_mig_devices);
                // Greedy over ascending starts finds the most disjoint placements.
                let mut end = 0;
                let mut disjoint = 0;
                for pl in p.placements() {
                    if pl.start >= end {
                        disjoint += 1;
                        end = pl.end();
                    }
                }
                assert!(
                    p.max_instances <= disjoint,
                    "{} {}: {} instances cannot fit",
                    model.key,
                    p.name,
                    p.max_instances
                );
            }
        }
    }

    #[test]
    fn every_profile_has_a_whole_gi_compute_instance_profile() {
        for (model, mig) in mig_models() {
            for p in mig.profiles {
                assert!(
                    whole_ci_profile(p.compute_slices).is_some(),
                    "{} {}",
                    model.key,
                    p.name
                );
            }
        }
        assert_eq!(whole_ci_profile(3), Some(2));
        assert_eq!(whole_ci_profile(7), Some(4));
        assert_eq!(whole_ci_profile(5), None);
    }

    #[test]
    fn a100_40gb_7g_is_39_5_gib() {
        // mig.md: nvidia-smi shows ≈ 39.25–39.5 GiB; the MiB figure is inferred.
        let a100 = find("A100-40GB").and_then(|m| m.mig).unwrap();
        assert_eq!(
            a100.profile_by_name("7g.40gb").map(|p| p.memory_mib),
            Some(40448)
        );
    }

    #[test]
    fn known_ids_by_model_and_enum() {
        let id = |key: &str, e: u32| {
            find(key)
                .and_then(|m| m.mig)
                .and_then(|m| m.profile_by_enum(e))
                .map(|p| p.id)
        };
        for key in [
            "A100-40GB",
            "A100-80GB",
            "H100-80GB",
            "H100-94GB",
            "H200-141GB",
            "B200",
        ] {
            assert_eq!(id(key, E_1), Some(19), "{key}");
            assert_eq!(id(key, E_1_REV1), Some(20), "{key}");
            assert_eq!(id(key, E_1_REV2), Some(15), "{key}");
            assert_eq!(id(key, E_2), Some(14), "{key}");
            assert_eq!(id(key, E_3), Some(9), "{key}");
            assert_eq!(id(key, E_4), Some(5), "{key}");
            assert_eq!(id(key, E_7), Some(0), "{key}");
        }
        assert_eq!(id("A30", E_1), Some(14));
        assert_eq!(id("A30", E_1_REV1), Some(21));
        assert_eq!(id("A30", E_2), Some(5));
        assert_eq!(id("A30", E_2_REV1), Some(6));
        assert_eq!(id("A30", E_4), Some(0));
        assert_eq!(id("RTX-PRO-6000", E_1), Some(14));
        assert_eq!(id("RTX-PRO-6000", E_1_REV1), Some(21));
        assert_eq!(id("RTX-PRO-6000", E_2), Some(5));
        assert_eq!(id("RTX-PRO-6000", E_4), Some(0));
        let a100 = find("A100-40GB").and_then(|m| m.mig).unwrap();
        let p = a100.profile_by_name("1g.10gb").unwrap();
        assert_eq!((p.id, p.enum_index, p.memory_slices), (15, 9, 2));
        assert_eq!(a100.profile_by_name("2g.10gb").map(|p| p.id), Some(14));
    }
}
