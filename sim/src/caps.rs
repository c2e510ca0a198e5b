//! MIG capability minors: `/proc/driver/nvidia-caps/mig-minors` and the
//! `/dev/nvidia-caps/nvidia-cap<minor>` nodes it describes.
//!
//! The real driver prints a static table of every capability it could ever
//! hand out, whether or not the GPU or instance exists: `config 1`,
//! `monitor 2`, then for GPU minors 0..31, GI ids 0..14 and CI ids 0..7, in
//! that nesting order, `gpu<g>/gi<i>/access` followed by its eight
//! `gpu<g>/gi<i>/ci<c>/access` lines, minors counting up from 3. So
//!
//! ```text
//! gi access minor = 3 + 135·g + 9·i        ci access minor = gi access minor + 1 + c
//! ```
//!
//! which reproduces the published samples (`gpu0/gi0/access 3`,
//! `gpu0/gi0/ci0/access 4`, `gpu3/gi3/ci3/access 439`,
//! `gpu6/gi11/ci7/access 920`, last line `gpu31/gi14/ci7/access 4322`).
//! `g` is the GPU's device minor, not its NVML index. Consumers must parse the
//! file rather than compute minors; the formula lives here only because this
//! crate plays the driver that prints the file.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use crate::SimError;

/// Minor of the `config` capability (create/destroy MIG instances).
pub const CONFIG_MINOR: u32 = 1;
/// Minor of the `monitor` capability.
pub const MONITOR_MINOR: u32 = 2;
/// GPU minors the table covers (0..32).
pub const TABLE_GPUS: u32 = 32;
/// GI ids per GPU the table covers (0..15).
pub const TABLE_GIS: u32 = 15;
/// CI ids per GI the table covers (0..8).
pub const TABLE_CIS: u32 = 8;

const FIRST_GI_MINOR: u32 = 3;
const PER_GI: u32 = 1 + TABLE_CIS;
const PER_GPU: u32 = TABLE_GIS * PER_GI;

/// Minor of `gpu<gpu_minor>/gi<gi>/access`; `None` outside the table.
pub fn gi_access_minor(gpu_minor: u32, gi: u32) -> Option<u32> {
    (gpu_minor < TABLE_GPUS && gi < TABLE_GIS)
        .then(|| FIRST_GI_MINOR + gpu_minor * PER_GPU + gi * PER_GI)
}

/// Minor of `gpu<gpu_minor>/gi<gi>/ci<ci>/access`; `None` outside the table.
pub fn ci_access_minor(gpu_minor: u32, gi: u32, ci: u32) -> Option<u32> {
    if ci >= TABLE_CIS {
        return None;
    }
    gi_access_minor(gpu_minor, gi).map(|m| m + 1 + ci)
}

/// The full text of `/proc/driver/nvidia-caps/mig-minors`, as the real driver prints it.
pub fn mig_minors_table() -> String {
    let mut out = String::with_capacity(120_000);
    let _ = writeln!(out, "config {CONFIG_MINOR}");
    let _ = writeln!(out, "monitor {MONITOR_MINOR}");
    for g in 0..TABLE_GPUS {
        for i in 0..TABLE_GIS {
            let base = FIRST_GI_MINOR + g * PER_GPU + i * PER_GI;
            let _ = writeln!(out, "gpu{g}/gi{i}/access {base}");
            for c in 0..TABLE_CIS {
                let _ = writeln!(out, "gpu{g}/gi{i}/ci{c}/access {}", base + 1 + c);
            }
        }
    }
    out
}

/// Path of the cap node with `minor` under `root`.
pub fn cap_node_path(root: &Path, minor: u32) -> PathBuf {
    root.join(format!("dev/nvidia-caps/nvidia-cap{minor}"))
}

/// The major of `name` in a `/proc/devices` text (character devices only).
pub fn char_major(proc_devices: &str, name: &str) -> Option<u32> {
    proc_devices
        .lines()
        .skip_while(|l| l.trim() != "Character devices:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.trim().split_once(' '))
        .find(|(_, n)| n.trim() == name)
        .and_then(|(m, _)| m.parse().ok())
}

/// Makes sure the two cap nodes of MIG device ⟨gpu_minor, gi, ci⟩ exist under
/// `root` (as `nvidia-modprobe -f` does on a real host when an instance is
/// first used) and returns their paths (GI access, CI access). The caps major
/// is read from `<root>/proc/devices`. Needs the right to `mknod`.
pub fn ensure_cap_nodes(
    root: &Path,
    gpu_minor: u32,
    gi: u32,
    ci: u32,
) -> Result<(PathBuf, PathBuf), SimError> {
    let devices = root.join("proc/devices");
    let text = fs::read_to_string(&devices).map_err(|e| SimError::io(&devices, e))?;
    let major = char_major(&text, "nvidia-caps").ok_or_else(|| SimError::Corrupt {
        path: devices.clone(),
        reason: "no \"nvidia-caps\" line under \"Character devices:\"".into(),
    })?;
    let out_of_table = || {
        SimError::InvalidArgument(format!(
            "gpu{gpu_minor}/gi{gi}/ci{ci} is outside the mig-minors table"
        ))
    };
    let gi_minor = gi_access_minor(gpu_minor, gi).ok_or_else(out_of_table)?;
    let ci_minor = ci_access_minor(gpu_minor, gi, ci).ok_or_else(out_of_table)?;
    let mut paths = Vec::with_capacity(2);
    for minor in [gi_minor, ci_minor] {
        let path = cap_node_path(root, minor);
        crate::devnode::ensure_char_node(&path, major, minor, crate::devnode::CAP_ACCESS_MODE)?;
        paths.push(path);
    }
    let ci_path = paths.pop().unwrap_or_default();
    let gi_path = paths.pop().unwrap_or_default();
    Ok((gi_path, ci_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minors_match_the_published_samples() {
        assert_eq!(gi_access_minor(0, 0), Some(3));
        assert_eq!(ci_access_minor(0, 0, 0), Some(4));
        assert_eq!(ci_access_minor(0, 0, 2), Some(6));
        assert_eq!(ci_access_minor(3, 3, 3), Some(439));
        assert_eq!(ci_access_minor(6, 11, 7), Some(920));
        assert_eq!(ci_access_minor(31, 14, 7), Some(4322));
        assert_eq!(gi_access_minor(32, 0), None);
        assert_eq!(gi_access_minor(0, 15), None);
        assert_eq!(ci_access_minor(0, 0, 8), None);
    }

    #[test]
    fn table_is_complete_and_ordered() {
        let t = mig_minors_table();
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2 + 32 * 15 * 9);
        assert_eq!(lines[0], "config 1");
        assert_eq!(lines[1], "monitor 2");
        assert_eq!(lines[2], "gpu0/gi0/access 3");
        assert_eq!(lines[3], "gpu0/gi0/ci0/access 4");
        assert_eq!(lines[10], "gpu0/gi0/ci7/access 11");
        assert_eq!(lines[11], "gpu0/gi1/access 12");
        assert_eq!(*lines.last().unwrap(), "gpu31/gi14/ci7/access 4322");
        for (i, l) in lines.iter().enumerate() {
            let minor: usize = l.rsplit(' ').next().unwrap().parse().unwrap();
            assert_eq!(minor, i + 1, "line {l}");
        }
    }

    #[test]
    fn char_major_reads_the_character_section_only() {
        let t = "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-caps\n\nBlock devices:\n508 nvidia-caps\n";
        assert_eq!(char_major(t, "nvidia-caps"), Some(508));
        assert_eq!(char_major(t, "nvidia-frontend"), Some(195));
        assert_eq!(char_major(t, "mem"), Some(1));
        assert_eq!(char_major(t, "nvidia-uvm"), None);
    }
}
