//! `tessera-cdi profiles`: the GPU-instance profiles and legal placements each
//! MIG-capable GPU reports through NVML, optionally compared with Tessera's
//! built-in catalogue. Read-only: it changes no GPU setting.

use std::fmt::Write;

use serde::Serialize;
use tessera_driver::GpuDriver;
use tessera_model::gpu::{GpuInfo, GpuInstanceProfileInfo};
use tessera_model::mig::Placement;
use tessera_model::mig::catalogue::{self, GpuModelSpec};

use super::NodeArgs;
use crate::CdiGenError;

/// Arguments of `profiles`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfilesArgs {
    #[command(flatten)]
    /// Where the node is.
    pub node: NodeArgs,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Compare every GPU's profiles with the catalogue entry of its model.
    #[arg(long)]
    pub compare_catalogue: bool,
}

/// One profile as NVML reports it, with its legal placements.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportedProfile {
    /// What NVML says about the profile.
    #[serde(flatten)]
    pub info: GpuInstanceProfileInfo,
    /// Legal placements (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`).
    pub placements: Vec<Placement>,
}

/// One GPU and its profiles.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportedGpu {
    /// The GPU.
    pub gpu: GpuInfo,
    /// Its GI profiles; empty when the GPU has no MIG.
    pub profiles: Vec<ReportedProfile>,
    /// Differences from the catalogue, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catalogue_differences: Option<Vec<String>>,
}

/// Reads every GPU's profiles and placements through the driver.
pub fn collect(driver: &dyn GpuDriver, compare: bool) -> Result<Vec<ReportedGpu>, CdiGenError> {
    let mut out = Vec::new();
    for gpu in driver.gpus()? {
        let mut profiles = Vec::new();
        if gpu.mig.is_some() {
            for info in driver.gpu_instance_profiles(gpu.index)? {
                let placements = driver.possible_placements(gpu.index, info.id)?;
                profiles.push(ReportedProfile { info, placements });
            }
        }
        let catalogue_differences = compare.then(|| compare_with_catalogue(&gpu, &profiles));
        out.push(ReportedGpu {
            gpu,
            profiles,
            catalogue_differences,
        });
    }
    Ok(out)
}

/// Every way the reported profiles differ from the catalogue entry of the GPU's
/// model (found by product name). Memory is compared loosely: the exact MiB of a
/// profile varies between driver versions.
pub fn compare_with_catalogue(gpu: &GpuInfo, reported: &[ReportedProfile]) -> Vec<String> {
    let Some(model) = catalogue::find_by_product_name(&gpu.name) else {
        return vec![format!("model {:?} is not in the catalogue", gpu.name)];
    };
    if reported.is_empty() && model.mig.is_some() {
        return vec![format!(
            "NVML reported no GI profiles ({}); nothing to compare",
            if gpu.mig_enabled() {
                "MIG on"
            } else {
                "MIG off: profiles may only be listed with MIG on"
            }
        )];
    }
    compare_with_model(model, reported)
}

fn compare_with_model(model: &GpuModelSpec, reported: &[ReportedProfile]) -> Vec<String> {
    let mut diffs = Vec::new();
    let Some(mig) = model.mig else {
        if !reported.is_empty() {
            diffs.push(format!(
                "{}: catalogue says no MIG, NVML reports {} profiles",
                model.key,
                reported.len()
            ));
        }
        return diffs;
    };
    for r in reported {
        let p = &r.info;
        let Some(c) = mig.profile_by_enum(p.enum_index) else {
            diffs.push(format!(
                "enum {} (id {}, {}): not in the catalogue",
                p.enum_index, p.id, p.name
            ));
            continue;
        };
        let mut field = |what: &str, catalogue: String, nvml: String| {
            if catalogue != nvml {
                diffs.push(format!(
                    "enum {} {}: {what}: catalogue {catalogue}, NVML {nvml}",
                    p.enum_index, c.name
                ));
            }
        };
        field("id", c.id.to_string(), p.id.to_string());
        field("name", c.name.to_owned(), p.name.clone());
        field(
            "compute slices",
            c.compute_slices.to_string(),
            p.slice_count.to_string(),
        );
        field(
            "max instances",
            c.max_instances.to_string(),
            p.instance_count.to_string(),
        );
        field(
            "SMs",
            c.sm_count.to_string(),
            p.multiprocessor_count.to_string(),
        );
        let catalogue_placements: Vec<Placement> = c.placements().collect();
        field(
            "placements",
            placement_list(&catalogue_placements),
            placement_list(&r.placements),
        );
        let (cm, nm) = (c.memory_mib as f64, p.memory_mib as f64);
        if (cm - nm).abs() > nm * 0.05 {
            diffs.push(format!(
                "enum {} {}: memory: catalogue {} MiB, NVML {} MiB",
                p.enum_index, c.name, c.memory_mib, p.memory_mib
            ));
        }
    }
    for c in mig.profiles {
        if !reported.iter().any(|r| r.info.enum_index == c.enum_index) {
            diffs.push(format!(
                "enum {} {} (id {}): in the catalogue, not reported by NVML",
                c.enum_index, c.name, c.id
            ));
        }
    }
    diffs
}

/// `{0,2,4}:2` — starts grouped by size, as mig.md writes them.
pub fn placement_list(placements: &[Placement]) -> String {
    let mut sizes: Vec<u32> = placements.iter().map(|p| p.size).collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
        .iter()
        .map(|size| {
            let starts: Vec<String> = placements
                .iter()
                .filter(|p| p.size == *size)
                .map(|p| p.start.to_string())
                .collect();
            format!("{{{}}}:{size}", starts.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Loads the node's NVML and renders the report.
pub fn run(args: &ProfilesArgs) -> Result<String, CdiGenError> {
    let driver = crate::load_driver(&args.node.driver_root, args.node.nvml_lib.as_deref())?;
    let report = collect(&driver, args.compare_catalogue)?;
    if args.json {
        let mut text = serde_json::to_string_pretty(&report).map_err(|e| CdiGenError::Parse {
            path: "<report>".into(),
            reason: e.to_string(),
        })?;
        text.push('\n');
        return Ok(text);
    }
    let mut out = String::new();
    for r in &report {
        let _ = writeln!(
            out,
            "GPU {} {} {} (MIG {})",
            r.gpu.index,
            r.gpu.name,
            r.gpu.uuid,
            match r.gpu.mig {
                None => "not supported",
                Some(m) if m.current => "on",
                Some(_) => "off",
            }
        );
        if !r.profiles.is_empty() {
            let _ = writeln!(
                out,
                "  {:>4} {:>4}  {:<14} {:>6} {:>10} {:>5} {:>5}  placements",
                "id", "enum", "name", "slices", "memory", "SMs", "inst"
            );
        }
        for p in &r.profiles {
            let i = &p.info;
            let _ = writeln!(
                out,
                "  {:>4} {:>4}  {:<14} {:>6} {:>6} MiB {:>5} {:>5}  {}",
                i.id,
                i.enum_index,
                i.name,
                i.slice_count,
                i.memory_mib,
                i.multiprocessor_count,
                i.instance_count,
                placement_list(&p.placements)
            );
        }
        if let Some(diffs) = &r.catalogue_differences {
            if diffs.is_empty() {
                let _ = writeln!(out, "  catalogue: matches");
            }
            for d in diffs {
                let _ = writeln!(out, "  catalogue differs: {d}");
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported_from_catalogue(model: &GpuModelSpec) -> Vec<ReportedProfile> {
        model
            .mig
            .unwrap()
            .profiles
            .iter()
            .map(|c| ReportedProfile {
                info: tessera_driver::fake::profile_info(c),
                placements: c.placements().collect(),
            })
            .collect()
    }

    #[test]
    fn placements_are_written_grouped_by_size() {
        let p = |start, size| Placement { start, size };
        assert_eq!(placement_list(&[p(0, 2), p(2, 2), p(4, 2)]), "{0,2,4}:2");
        assert_eq!(placement_list(&[p(0, 1), p(0, 8)]), "{0}:1 {0}:8");
    }

    #[test]
    fn a_gpu_matching_its_catalogue_entry_has_no_differences() {
        let model = catalogue::find("H200-141GB").unwrap();
        assert_eq!(
            compare_with_model(model, &reported_from_catalogue(model)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn every_kind_of_difference_is_reported() {
        let model = catalogue::find("H200-141GB").unwrap();
        let mut reported = reported_from_catalogue(model);
        // NVML says 3g has id 10, legal starts {0} only; 1g misses; memory half.
        let three = reported
            .iter_mut()
            .find(|r| r.info.name.starts_with("3g"))
            .unwrap();
        three.info.id = 10;
        three.placements.truncate(1);
        three.info.memory_mib /= 2;
        reported.retain(|r| r.info.enum_index != 0);
        let diffs = compare_with_model(model, &reported);
        assert!(
            diffs.iter().any(|d| d.contains("id: catalogue 9, NVML 10")),
            "{diffs:?}"
        );
        assert!(
            diffs
                .iter()
                .any(|d| d.contains("placements: catalogue {0,4}:4, NVML {0}:4")),
            "{diffs:?}"
        );
        assert!(diffs.iter().any(|d| d.contains("memory:")), "{diffs:?}");
        assert!(
            diffs.iter().any(|d| d.contains("not reported by NVML")),
            "{diffs:?}"
        );
    }
}
