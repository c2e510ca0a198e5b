//! Board facts NVML reports that the MIG catalogue does not hold:
//! architecture, compute capability, PCI ids, power, clocks, PCIe link.
//!
//! Values follow NVIDIA's data sheets for the SXM (or, where the catalogue
//! model is one, PCIe/NVL) boards; PCI device ids are the boards'. They are
//! stable per model, so tests can assert on them; nothing here claims to
//! track a particular VBIOS.

use tessera_sim::state::SimGpu;

use crate::node::Res;
use crate::profiles;

/// `NVML_DEVICE_ARCH_AMPERE`.
pub const ARCH_AMPERE: u32 = 7;
/// `NVML_DEVICE_ARCH_HOPPER`.
pub const ARCH_HOPPER: u32 = 9;
/// `NVML_DEVICE_ARCH_BLACKWELL`.
pub const ARCH_BLACKWELL: u32 = 10;
/// `NVML_BRAND_NVIDIA_RTX`.
pub const BRAND_NVIDIA_RTX: u32 = 13;
/// `NVML_BRAND_NVIDIA`: what data-center boards report.
pub const BRAND_NVIDIA: u32 = 14;
/// PCI vendor id of NVIDIA.
pub const PCI_VENDOR_NVIDIA: u32 = 0x10de;

/// What one board model reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Board {
    /// `nvmlDeviceGetArchitecture`.
    pub architecture: u32,
    /// `nvmlDeviceGetCudaComputeCapability`: (major, minor).
    pub compute_capability: (i32, i32),
    /// `nvmlDeviceGetBrand`.
    pub brand: u32,
    /// PCI device id (upper half of `pciDeviceId`).
    pub pci_device: u32,
    /// PCI subsystem id (upper half of `pciSubSystemId`).
    pub pci_subsystem: u32,
    /// Board power limit (default = enforced = max), watts.
    pub power_limit_w: u32,
    /// Least settable power limit, watts.
    pub power_min_w: u32,
    /// Power drawn idle, watts.
    pub idle_power_w: u32,
    /// Max graphics/SM clock, MHz.
    pub max_sm_mhz: u32,
    /// Max memory clock, MHz.
    pub max_mem_mhz: u32,
    /// Max video clock, MHz.
    pub max_video_mhz: u32,
    /// PCIe generation.
    pub pcie_gen: u32,
    /// BAR1 aperture, MiB.
    pub bar1_mib: u64,
    /// Board part number.
    pub part_number: &'static str,
    /// VBIOS version.
    pub vbios: &'static str,
}

const fn board(
    architecture: u32,
    compute_capability: (i32, i32),
    pci_device: u32,
    power: (u32, u32, u32),
    clocks: (u32, u32, u32),
    (pcie_gen, bar1_mib): (u32, u64),
    (part_number, vbios): (&'static str, &'static str),
) -> Board {
    Board {
        architecture,
        compute_capability,
        brand: BRAND_NVIDIA,
        pci_device,
        pci_subsystem: pci_device + 0x1000,
        power_limit_w: power.0,
        power_min_w: power.1,
        idle_power_w: power.2,
        max_sm_mhz: clocks.0,
        max_mem_mhz: clocks.1,
        max_video_mhz: clocks.2,
        pcie_gen,
        bar1_mib,
        part_number,
        vbios,
    }
}

/// The board facts of a catalogue model key.
pub fn board_of_model(key: &str) -> Option<Board> {
    let b = match key {
        "A30" => board(
            ARCH_AMPERE,
            (8, 0),
            0x20b7,
            (165, 100, 32),
            (1440, 1215, 1305),
            (4, 32768),
            ("900-21001-0040-100", "92.00.66.00.01"),
        ),
        "A100-40GB" => board(
            ARCH_AMPERE,
            (8, 0),
            0x20b0,
            (400, 100, 55),
            (1410, 1215, 1275),
            (4, 65536),
            ("692-2G506-0200-006", "92.00.45.00.03"),
        ),
        "A100-80GB" => board(
            ARCH_AMPERE,
            (8, 0),
            0x20b2,
            (400, 100, 60),
            (1410, 1593, 1275),
            (4, 131072),
            ("692-2G506-0210-002", "92.00.36.00.02"),
        ),
        "H100-80GB" => board(
            ARCH_HOPPER,
            (9, 0),
            0x2330,
            (700, 200, 70),
            (1980, 2619, 1755),
            (5, 131072),
            ("692-2G520-0200-000", "96.00.99.00.01"),
        ),
        "H100-94GB" => board(
            ARCH_HOPPER,
            (9, 0),
            0x2321,
            (400, 200, 60),
            (1785, 2619, 1650),
            (5, 131072),
            ("900-21010-0020-000", "96.00.74.00.0D"),
        ),
        "H200-141GB" => board(
            ARCH_HOPPER,
            (9, 0),
            0x2335,
            (700, 200, 75),
            (1980, 3201, 1755),
            (5, 262144),
            ("692-2G520-0280-000", "96.00.A5.00.01"),
        ),
        "B200" => board(
            ARCH_BLACKWELL,
            (10, 0),
            0x2901,
            (1000, 200, 140),
            (1965, 3996, 1965),
            (5, 262144),
            ("692-2G525-0200-000", "97.00.6B.00.02"),
        ),
        "RTX-PRO-6000" => Board {
            brand: BRAND_NVIDIA_RTX,
            ..board(
                ARCH_BLACKWELL,
                (12, 0),
                0x2bb5,
                (600, 150, 30),
                (2617, 14001, 2347),
                (5, 131072),
                ("900-2G153-0000-000", "98.02.2E.00.01"),
            )
        },
        _ => return None,
    };
    Some(b)
}

/// The board facts of a GPU; `UNKNOWN` for a model this table lacks.
pub fn board_of(gpu: &SimGpu) -> Res<Board> {
    board_of_model(profiles::model(gpu)?.key).ok_or(crate::ffi::ERROR_UNKNOWN)
}

/// The GPU's board serial number: 13 decimal digits derived from its UUID,
/// stable for a node.
pub fn serial(gpu: &SimGpu) -> String {
    let digits: String = gpu
        .uuid
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .map(|b| char::from(b'0' + (b % 10)))
        .take(9)
        .collect();
    format!("1654{digits:0>9}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogue_model_has_a_board() {
        for model in tessera_model::mig::catalogue::models() {
            let b = board_of_model(model.key).unwrap_or_else(|| panic!("{}", model.key));
            assert!(b.compute_capability.0 >= 8, "{}", model.key);
            assert!(b.idle_power_w < b.power_limit_w, "{}", model.key);
        }
    }
}
