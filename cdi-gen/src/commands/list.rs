//! `tessera-cdi list`: what the node offers, as a table for people.

use std::fmt::Write;

use tessera_model::contract::cdi::{GPU_KIND, mig_device_name};
use tessera_model::facts::{GpuFacts, NodeFacts};

use super::NodeArgs;
use crate::CdiGenError;

/// Arguments of `list`.
#[derive(Debug, Clone, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    /// Where the node is.
    pub node: NodeArgs,
}

/// Discovers the node and renders its table.
pub fn run(args: &ListArgs) -> Result<String, CdiGenError> {
    let facts = crate::discover_node(&args.node.layout(), args.node.nvml_lib.as_deref())?;
    Ok(table(&facts))
}

/// One row per device the static spec offers, plus a line per MIG-enabled GPU
/// without instances, so an operator sees why it offers nothing.
pub fn table(facts: &NodeFacts) -> String {
    let mut rows: Vec<[String; 6]> = vec![[
        "DEVICE".into(),
        "UUID".into(),
        "MODEL / PROFILE".into(),
        "MEMORY".into(),
        "PLACEMENT".into(),
        "DEVICE NODES".into(),
    ]];
    for gpu in &facts.gpus {
        if gpu.info.mig_enabled() {
            if gpu.mig_devices.is_empty() {
                rows.push(gpu_row(
                    gpu,
                    format!("{GPU_KIND}={} (MIG on)", gpu.info.index),
                    "no MIG devices".into(),
                ));
            }
            for mig in &gpu.mig_devices {
                let d = &mig.device;
                rows.push([
                    format!(
                        "{GPU_KIND}={}",
                        mig_device_name(gpu.info.index, d.mig_index)
                    ),
                    d.uuid.clone(),
                    format!(
                        "{} (GI {}, CI {})",
                        d.profile, d.gpu_instance_id, d.compute_instance_id
                    ),
                    mib(d.memory_mib),
                    format!("{}+{}", d.placement.start, d.placement.size),
                    [&gpu.node, &mig.gi_cap, &mig.ci_cap]
                        .iter()
                        .map(|n| n.container_path.as_str())
                        .collect::<Vec<_>>()
                        .join(" "),
                ]);
            }
        } else {
            rows.push(gpu_row(
                gpu,
                format!("{GPU_KIND}={}", gpu.info.index),
                gpu.node.container_path.clone(),
            ));
        }
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    let _ = writeln!(
        out,
        "\n{} GPU(s), driver {}; common: {}",
        facts.gpus.len(),
        facts.driver_version.as_deref().unwrap_or("unknown"),
        facts
            .control_nodes
            .iter()
            .map(|n| n.container_path.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    );
    out
}

/// A whole GPU's row: no placement.
fn gpu_row(gpu: &GpuFacts, device: String, nodes: String) -> [String; 6] {
    [
        device,
        gpu.info.uuid.clone(),
        gpu.info.name.clone(),
        mib(gpu.info.memory_mib),
        "-".into(),
        nodes,
    ]
}

fn mib(value: u64) -> String {
    format!("{value} MiB")
}
