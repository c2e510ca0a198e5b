//! Text the `tessera-sim` binary prints: profile list, node summary.

use std::fmt::Write as _;
use std::path::Path;

use crate::builder::BuiltNode;
use crate::mig;
use crate::profile::{NodeProfile, shipped_profiles};
use crate::state::NodeState;

/// One line per shipped profile: name and description.
pub fn list_profiles() -> String {
    let width = shipped_profiles()
        .iter()
        .map(|(n, _)| n.len())
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for (name, _) in shipped_profiles() {
        let description = match NodeProfile::shipped(name) {
            Some(Ok(p)) => p.description,
            Some(Err(e)) => format!("(broken: {e})"),
            None => String::new(),
        };
        let _ = writeln!(out, "{name:<width$}  {description}");
    }
    out
}

/// The GPUs and MIG devices of a node, one line each.
pub fn describe_node(root: &Path, state: &NodeState) -> String {
    let mut out = String::new();
    let cuda = state.cuda_driver_version;
    let _ = writeln!(
        out,
        "node {}: driver {}, CUDA {}.{}, {} GPU(s)",
        root.display(),
        state.driver_version,
        cuda / 1000,
        (cuda % 1000) / 10,
        state.gpus.len()
    );
    for gpu in &state.gpus {
        let mode = match (gpu.mig_enabled, gpu.mig_pending) {
            (true, true) => "MIG on",
            (false, false) => "MIG off",
            (true, false) => "MIG on (off pending)",
            (false, true) => "MIG off (on pending)",
        };
        let _ = writeln!(
            out,
            "GPU {} {} {} minor {} {mode}",
            gpu.index, gpu.model, gpu.uuid, gpu.minor
        );
        for gi in &gpu.gpu_instances {
            let name = mig::profile_spec(gpu, gi.profile_id).map_or("?", |p| p.name);
            if gi.compute_instances.is_empty() {
                let _ = writeln!(
                    out,
                    "  GI {:>2} {name} (profile {}) at {}+{}, no compute instance",
                    gi.id, gi.profile_id, gi.start, gi.size
                );
            }
        }
        for (index, gi, ci) in mig::mig_devices(gpu) {
            let name = mig::profile_spec(gpu, gi.profile_id).map_or("?", |p| p.name);
            let _ = writeln!(
                out,
                "  MIG {index} GI {:>2} CI {} {name} (profile {}) at {}+{} {}",
                gi.id, ci.id, gi.profile_id, gi.start, gi.size, ci.uuid
            );
        }
    }
    out
}

/// What `tessera-sim create` prints.
pub fn build_summary(profile: &NodeProfile, built: &BuiltNode) -> String {
    let mig_devices: usize = built
        .state
        .gpus
        .iter()
        .map(|g| mig::mig_devices(g).len())
        .sum();
    let mut out = format!(
        "built node {:?} at {}: {} GPU(s), {} MIG device(s), {} device node(s)\n",
        profile.name,
        built.root.display(),
        built.state.gpus.len(),
        mig_devices,
        built.device_nodes.len()
    );
    out.push_str(&describe_node(&built.root, &built.state));
    let _ = writeln!(
        out,
        "NVML stand-in: {}\nstate: {}",
        built.nvml_library.display(),
        built.root.join("run/tessera-sim/state.json").display()
    );
    out
}
/// A command-line error of one of the simulator's binaries as one line:
/// clap's message without its usage block, whitespace folded, pointing at
/// `<program> --help`.
pub fn usage_error_line(program: &str, clap_message: &str) -> String {
    let message = clap_message.split("Usage:").next().unwrap_or_default();
    let message = message.strip_prefix("error:").unwrap_or(message);
    let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
    format!("{program}: {message} (see {program} --help)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_fold_to_one_line() {
        let clap = "error: unexpected argument '--x' found\n\n  tip: use '--'\n\nUsage: tessera-sim show\n\nFor more information, try '--help'.\n";
        assert_eq!(
            usage_error_line("tessera-sim", clap),
            "tessera-sim: unexpected argument '--x' found tip: use '--' (see tessera-sim --help)"
        );
    }
}
