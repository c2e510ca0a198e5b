//! What the process sees: the devices `cuInit` enumerates, read once from
//! the node (or the default configuration) and the environment.
//!
//! - **Node**: every GPU of the node state, in NVML index order, as a whole
//!   GPU, MIG mode or not (a MIG-enabled GPU is not split into its MIG
//!   devices by default). A `MIG-<uuid>` entry in `CUDA_VISIBLE_DEVICES`
//!   presents that MIG device instead: its profile's name, memory and SMs.
//! - **No node**: one `NVIDIA H100 80GB HBM3` with 80 GiB and the fixed
//!   UUID [`default_gpu_uuid`].
//! - `CUDA_VISIBLE_DEVICES` is applied as the real driver does: a comma
//!   list of indexes, `GPU-<uuid prefix>` or `MIG-<uuid prefix>` entries;
//!   enumeration stops at the first entry that names no device, names one
//!   ambiguously, or names one already listed. Set but empty: no devices.
//! - `TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB` replaces every device's capacity.
//! - `TESSERA_SIM_CUDA_NS_PER_BLOCK` sets the cost of one thread block of a
//!   kernel launch in simulated device time (default 1000 ns; 0 = free).
//! - The rest of the kernel cost model ([`crate::timeline::CostModel`]):
//!   `TESSERA_SIM_CUDA_LAUNCH_NS` (a fixed cost per launch, default 0),
//!   `TESSERA_SIM_CUDA_BLOCKS_PER_SM` (blocks run in waves of SMs × this,
//!   a partial wave costs a whole one; default 0 = no waves),
//!   `TESSERA_SIM_CUDA_NOISE_PCT` and `TESSERA_SIM_CUDA_NOISE_SEED` (each
//!   kernel's cost scaled by a seeded random factor within ± that percent).
//! - `TESSERA_SIM_CUDA_UTIL_BIAS_PCT` (signed, default 0) scales the busy
//!   time the process *reports* for NVML by 100 + that percent — a
//!   deliberately wrong utilization figure for tests of the SM limiter. The
//!   shared device timeline (what really ran) is not scaled.

use std::path::{Path, PathBuf};

use tessera_model::mig::catalogue::{self, GpuModelSpec};
use tessera_sim::state::{NodeState, StateStore};

use crate::root::{self, RootSource};
use crate::timeline::CostModel;

/// Replaces every device's memory capacity, in MiB.
pub const DEVICE_MEMORY_ENV: &str = "TESSERA_SIM_CUDA_DEVICE_MEMORY_MIB";
/// Simulated device time one thread block of a launch costs, in ns.
pub const NS_PER_BLOCK_ENV: &str = "TESSERA_SIM_CUDA_NS_PER_BLOCK";
/// Device memory (MiB) every live context takes for itself; default 0.
pub const CONTEXT_MIB_ENV: &str = "TESSERA_SIM_CUDA_CONTEXT_MIB";
/// `1`: publish a utilization sample at every change of device memory, in
/// the call that made it (tests that watch memory from outside need it).
pub const PUBLISH_ON_MEMORY_ENV: &str = "TESSERA_SIM_CUDA_PUBLISH_ON_MEMORY";
/// Fixed device time of every kernel launch, in ns (default 0).
pub const LAUNCH_NS_ENV: &str = "TESSERA_SIM_CUDA_LAUNCH_NS";
/// Resident blocks per SM: a kernel runs in waves of SMs × this many
/// blocks and a partial wave costs a whole one (default 0: no waves, the
/// cost is linear in blocks).
pub const BLOCKS_PER_SM_ENV: &str = "TESSERA_SIM_CUDA_BLOCKS_PER_SM";
/// Each kernel's cost is scaled by a random factor in [1 − p, 1 + p] %
/// (default 0: no noise), drawn from a generator seeded with
/// [`NOISE_SEED_ENV`].
pub const NOISE_PCT_ENV: &str = "TESSERA_SIM_CUDA_NOISE_PCT";
/// Seed of the cost noise (default 1); the same seed gives every process
/// the same sequence of factors per device.
pub const NOISE_SEED_ENV: &str = "TESSERA_SIM_CUDA_NOISE_SEED";
/// Signed percent by which the busy time a process publishes for NVML is
/// off (−20: it reports 80 % of what ran). For tests of a limiter that
/// trusts the figure; the shared device timeline is never biased.
pub const UTIL_BIAS_PCT_ENV: &str = "TESSERA_SIM_CUDA_UTIL_BIAS_PCT";
/// Makes the library explain itself on stderr (shared with the NVML stand-in).
pub use tessera_sim::libroot::DEBUG_ENV;
/// The device filter every CUDA program honours.
pub const VISIBLE_DEVICES_ENV: &str = "CUDA_VISIBLE_DEVICES";
/// Default cost of one thread block.
pub const DEFAULT_NS_PER_BLOCK: u64 = 1000;
/// Capacity of the default GPU: 80 GiB.
pub const DEFAULT_GPU_BYTES: u64 = 80 << 30;
/// Catalogue model of the default GPU.
pub const DEFAULT_GPU_MODEL: &str = "H100-80GB";
/// CUDA driver version reported without a node (12.8).
pub const DEFAULT_DRIVER_VERSION: i32 = 12080;

const MIB: u64 = 1 << 20;

/// The UUID of the default GPU, the same in every process and on every machine.
pub fn default_gpu_uuid() -> String {
    tessera_sim::ids::gpu_uuid("tessera-sim-cuda-default", 0, DEFAULT_GPU_MODEL)
}

/// One device as CUDA presents it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// `cuDeviceGetName`.
    pub name: String,
    /// `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// The physical GPU's `GPU-…` (the device's own for a whole GPU).
    pub gpu_uuid: String,
    /// NVML index of the physical GPU (the util file's `gpu<index>`).
    pub nvml_index: u32,
    /// `(GI id, CI id)` of a MIG device.
    pub mig: Option<(u32, u32)>,
    /// Capacity in bytes.
    pub total_bytes: u64,
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Compute capability `(major, minor)`.
    pub compute_capability: (i32, i32),
    /// PCI bus number.
    pub pci_bus: u32,
}

/// Everything `cuInit` settles.
#[derive(Debug, Clone)]
pub struct Config {
    /// The devices, in CUDA ordinal order.
    pub devices: Vec<DeviceSpec>,
    /// The node root, when a node is served: utilization is published there.
    pub node_root: Option<PathBuf>,
    /// `cuDriverGetVersion`.
    pub driver_version: i32,
    /// Simulated ns per thread block.
    pub ns_per_block: u64,
    /// The whole kernel cost model (its `ns_per_block` is the one above).
    pub cost: CostModel,
    /// Percent by which published busy time is off (0: the truth).
    pub util_bias_pct: i64,
    /// Device memory every live context takes for itself (the driver's own
    /// per-context state, which `nvidia-smi` counts against the process).
    pub context_bytes: u64,
    /// Publish a sample at every change of device memory, before the call
    /// returns (`TESSERA_SIM_CUDA_PUBLISH_ON_MEMORY=1`): what a process
    /// publishes is then never below what it holds once a call returned.
    pub publish_on_memory: bool,
    /// `TESSERA_SIM_DEBUG` is set.
    pub debug: bool,
}

/// A physical GPU of the node (or the default one), before filtering.
#[derive(Debug, Clone)]
struct Gpu {
    spec: DeviceSpec,
    /// Its MIG devices: `(MIG uuid, device)`.
    migs: Vec<DeviceSpec>,
}

/// Reads the node and the environment. `Err` is a one-line reason, for a
/// node named by `TESSERA_SIM_ROOT` that cannot be served.
pub fn load() -> Result<Config, String> {
    let debug = std::env::var_os(DEBUG_ENV).is_some_and(|v| !v.is_empty());
    let (root, state) = match root::discover() {
        RootSource::Env(root) => {
            let state = read_state(&root)
                .map_err(|e| format!("{} names {}: {e}", root::ROOT_ENV, root.display()))?;
            (Some(root), Some(state))
        }
        RootSource::LibraryPath(root) => match read_state(&root) {
            Ok(state) => (Some(root), Some(state)),
            // Installed under a directory that holds no node: no node.
            Err(_) => (None, None),
        },
        RootSource::Unknown { .. } => (None, None),
    };
    let gpus = match &state {
        Some(state) => node_gpus(state)?,
        None => vec![default_gpu()],
    };
    let visible = std::env::var(VISIBLE_DEVICES_ENV).ok();
    let mut devices = match visible.as_deref() {
        Some(list) => select_visible(list, &gpus),
        None => gpus.iter().map(|g| g.spec.clone()).collect(),
    };
    if let Some(mib) = env_u64(DEVICE_MEMORY_ENV).filter(|&m| m > 0) {
        for device in &mut devices {
            device.total_bytes = mib.saturating_mul(MIB);
        }
    }
    let ns_per_block = env_u64(NS_PER_BLOCK_ENV).unwrap_or(DEFAULT_NS_PER_BLOCK);
    let cost = CostModel {
        launch_ns: env_u64(LAUNCH_NS_ENV).unwrap_or(0),
        ns_per_block,
        blocks_per_sm: env_u64(BLOCKS_PER_SM_ENV).unwrap_or(0),
        noise_pct: env_u64(NOISE_PCT_ENV).unwrap_or(0).min(100),
        noise_seed: env_u64(NOISE_SEED_ENV).unwrap_or(1),
    };
    let util_bias_pct = env_i64(UTIL_BIAS_PCT_ENV).unwrap_or(0).clamp(-100, 1000);
    let context_bytes = env_u64(CONTEXT_MIB_ENV).map_or(0, |mib| mib.saturating_mul(MIB));
    let publish_on_memory = env_u64(PUBLISH_ON_MEMORY_ENV) == Some(1);
    let driver_version = state
        .as_ref()
        .map_or(DEFAULT_DRIVER_VERSION, |s| s.cuda_driver_version);
    Ok(Config {
        devices,
        node_root: root.filter(|_| state.is_some()),
        driver_version,
        ns_per_block,
        cost,
        util_bias_pct,
        context_bytes,
        publish_on_memory,
        debug,
    })
}

/// The CUDA driver version without initialising: the node's, or 12.8.
/// Read once per process (`cuGetProcAddress` asks for it on every call
/// before `cuInit`).
pub fn driver_version() -> i32 {
    static VERSION: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        let root = match root::discover() {
            RootSource::Env(root) | RootSource::LibraryPath(root) => root,
            RootSource::Unknown { .. } => return DEFAULT_DRIVER_VERSION,
        };
        read_state(&root).map_or(DEFAULT_DRIVER_VERSION, |s| s.cuda_driver_version)
    })
}

fn read_state(root: &Path) -> Result<NodeState, String> {
    let store = StateStore::open(root).map_err(|e| e.to_string())?;
    store.read().map_err(|e| e.to_string())
}

/// An unsigned number from the environment; a value that does not parse is
/// reported on stderr and ignored.
fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    match text.trim().parse() {
        Ok(value) => Some(value),
        Err(_) => {
            eprintln!("tessera-sim-cuda: ignoring {name}={text:?}: not an unsigned integer");
            None
        }
    }
}

/// A signed number from the environment, as [`env_u64`].
fn env_i64(name: &str) -> Option<i64> {
    let text = std::env::var(name).ok()?;
    match text.trim().parse() {
        Ok(value) => Some(value),
        Err(_) => {
            eprintln!("tessera-sim-cuda: ignoring {name}={text:?}: not an integer");
            None
        }
    }
}

fn default_gpu() -> Gpu {
    let model = catalogue::find(DEFAULT_GPU_MODEL);
    let uuid = default_gpu_uuid();
    Gpu {
        spec: DeviceSpec {
            name: model
                .map_or("NVIDIA H100 80GB HBM3", |m| m.product_name)
                .to_string(),
            gpu_uuid: uuid.clone(),
            uuid,
            nvml_index: 0,
            mig: None,
            total_bytes: DEFAULT_GPU_BYTES,
            sm_count: model.map_or(132, |m| m.sm_count),
            compute_capability: (9, 0),
            pci_bus: pci_bus(0),
        },
        migs: Vec::new(),
    }
}

fn node_gpus(state: &NodeState) -> Result<Vec<Gpu>, String> {
    let mut gpus = Vec::with_capacity(state.gpus.len());
    for gpu in &state.gpus {
        let model = catalogue::find(&gpu.model)
            .ok_or_else(|| format!("gpu {}: unknown model {:?}", gpu.index, gpu.model))?;
        let cc = compute_capability(model);
        let spec = DeviceSpec {
            name: model.product_name.to_string(),
            uuid: gpu.uuid.clone(),
            gpu_uuid: gpu.uuid.clone(),
            nvml_index: gpu.index,
            mig: None,
            total_bytes: model.memory_mib * MIB,
            sm_count: model.sm_count,
            compute_capability: cc,
            pci_bus: pci_bus(gpu.index),
        };
        let mut migs = Vec::new();
        if gpu.mig_enabled {
            for (_, gi, ci) in tessera_sim::mig::mig_devices(gpu) {
                let Ok(profile) = tessera_sim::mig::profile_spec(gpu, gi.profile_id) else {
                    continue;
                };
                migs.push(DeviceSpec {
                    name: format!("{} MIG {}", model.product_name, profile.name),
                    uuid: ci.uuid.clone(),
                    gpu_uuid: gpu.uuid.clone(),
                    nvml_index: gpu.index,
                    mig: Some((gi.id, ci.id)),
                    total_bytes: profile.memory_mib * MIB,
                    sm_count: profile.sm_count,
                    compute_capability: cc,
                    pci_bus: spec.pci_bus,
                });
            }
        }
        gpus.push(Gpu { spec, migs });
    }
    Ok(gpus)
}

/// Compute capability by architecture: Ampere 8.0, Hopper 9.0, Blackwell
/// datacenter 10.0, Blackwell workstation 12.0.
fn compute_capability(model: &GpuModelSpec) -> (i32, i32) {
    let key = model.key.to_ascii_uppercase();
    if key.starts_with("A100") || key.starts_with("A30") {
        (8, 0)
    } else if key.starts_with("B200") {
        (10, 0)
    } else if key.starts_with("RTX-PRO") {
        (12, 0)
    } else {
        (9, 0)
    }
}

/// PCI bus numbers of an 8-GPU HGX board, in index order.
fn pci_bus(index: u32) -> u32 {
    const BUSES: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    BUSES
        .get(index as usize)
        .copied()
        .unwrap_or(0xe0 + index % 0x1f)
}

/// Applies a `CUDA_VISIBLE_DEVICES` value to the GPUs.
fn select_visible(list: &str, gpus: &[Gpu]) -> Vec<DeviceSpec> {
    let mut chosen: Vec<DeviceSpec> = Vec::new();
    if list.trim().is_empty() {
        return chosen;
    }
    for entry in list.split(',') {
        let Some(device) = lookup(entry.trim(), gpus) else {
            break;
        };
        if chosen.iter().any(|d| d.uuid == device.uuid) {
            break;
        }
        chosen.push(device.clone());
    }
    chosen
}

/// The one device an entry names, if exactly one.
fn lookup<'a>(entry: &str, gpus: &'a [Gpu]) -> Option<&'a DeviceSpec> {
    if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
        let index: usize = entry.parse().ok()?;
        return gpus.get(index).map(|g| &g.spec);
    }
    let lower = entry.to_ascii_lowercase();
    if lower.starts_with("gpu-") {
        return unique(gpus.iter().map(|g| &g.spec), &lower);
    }
    if let Some(rest) = lower.strip_prefix("mig-gpu-") {
        // The pre-R470 form: MIG-GPU-<gpu uuid>/<gi>/<ci>.
        let mut parts = rest.split('/');
        let (gpu, gi, ci) = (parts.next()?, parts.next()?, parts.next()?);
        let (gi, ci): (u32, u32) = (gi.parse().ok()?, ci.parse().ok()?);
        let gpu = unique(gpus.iter().map(|g| &g.spec), &format!("gpu-{gpu}"))?;
        let parent = gpus.iter().find(|g| g.spec.uuid == gpu.uuid)?;
        return parent.migs.iter().find(|m| m.mig == Some((gi, ci)));
    }
    if lower.starts_with("mig-") {
        return unique(gpus.iter().flat_map(|g| g.migs.iter()), &lower);
    }
    None
}

fn unique<'a>(
    mut devices: impl Iterator<Item = &'a DeviceSpec>,
    prefix: &str,
) -> Option<&'a DeviceSpec> {
    let matches = |d: &&DeviceSpec| d.uuid.to_ascii_lowercase().starts_with(prefix);
    let first = devices.find(matches)?;
    devices.find(matches).is_none().then_some(first)
}

/// The 16 bytes of a `GPU-…`/`MIG-…` UUID; a malformed one is hashed so
/// that devices still get distinct bytes.
pub fn uuid_bytes(uuid: &str) -> [u8; 16] {
    let hex: String = uuid
        .split_once('-')
        .map_or(uuid, |(_, rest)| rest)
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut bytes = [0u8; 16];
    if hex.len() == 32
        && hex
            .as_bytes()
            .chunks(2)
            .zip(bytes.iter_mut())
            .all(|(pair, out)| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
                    .map(|b| *out = b)
                    .is_some()
            })
    {
        return bytes;
    }
    let hi = tessera_sim::ids::fnv1a64(uuid.as_bytes());
    let lo = tessera_sim::ids::fnv1a64(format!("{uuid}/lo").as_bytes());
    bytes[..8].copy_from_slice(&hi.to_be_bytes());
    bytes[8..].copy_from_slice(&lo.to_be_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(uuid: &str, index: u32) -> DeviceSpec {
        DeviceSpec {
            name: format!("gpu{index}"),
            uuid: uuid.to_string(),
            gpu_uuid: uuid.to_string(),
            nvml_index: index,
            mig: None,
            total_bytes: 1 << 30,
            sm_count: 1,
            compute_capability: (9, 0),
            pci_bus: 1,
        }
    }

    fn gpus() -> Vec<Gpu> {
        let mig = DeviceSpec {
            mig: Some((1, 0)),
            uuid: "MIG-aaaa0000-0000-0000-0000-000000000001".into(),
            ..spec("GPU-bbbb0000-0000-0000-0000-000000000000", 1)
        };
        vec![
            Gpu {
                spec: spec("GPU-aaaa0000-0000-0000-0000-000000000000", 0),
                migs: vec![],
            },
            Gpu {
                spec: spec("GPU-aaab0000-0000-0000-0000-000000000000", 1),
                migs: vec![mig],
            },
            Gpu {
                spec: spec("GPU-cccc0000-0000-0000-0000-000000000000", 2),
                migs: vec![],
            },
        ]
    }

    fn names(list: &str) -> Vec<String> {
        select_visible(list, &gpus())
            .into_iter()
            .map(|d| d.uuid[..8].to_string())
            .collect()
    }

    #[test]
    fn indexes_select_and_reorder() {
        assert_eq!(names("2,0"), ["GPU-cccc", "GPU-aaaa"]);
        assert_eq!(names(" 1 , 0 "), ["GPU-aaab", "GPU-aaaa"]);
    }

    #[test]
    fn enumeration_stops_at_the_first_invalid_entry() {
        assert_eq!(names("0,7,2"), ["GPU-aaaa"]);
        assert_eq!(names("0,,2"), ["GPU-aaaa"]);
        assert_eq!(names("bogus,0"), Vec::<String>::new());
        assert_eq!(names("0,0,1"), ["GPU-aaaa"], "a repeat ends the list");
        assert!(names("").is_empty());
        assert!(names("-1").is_empty());
    }

    #[test]
    fn uuid_prefixes_must_be_unique() {
        assert_eq!(names("GPU-cc"), ["GPU-cccc"]);
        assert_eq!(names("gpu-AAAB,2"), ["GPU-aaab", "GPU-cccc"]);
        assert!(names("GPU-aaa").is_empty(), "ambiguous prefix");
        assert_eq!(names("MIG-aaaa"), ["MIG-aaaa"]);
        assert_eq!(
            names("MIG-GPU-aaab0000-0000-0000-0000-000000000000/1/0"),
            ["MIG-aaaa"]
        );
    }

    #[test]
    fn uuid_text_becomes_its_sixteen_bytes() {
        let b = uuid_bytes("GPU-01234567-89ab-cdef-0011-223344556677");
        assert_eq!(b[0], 0x01);
        assert_eq!(b[15], 0x77);
        assert_ne!(uuid_bytes("GPU-x"), uuid_bytes("GPU-y"));
    }
}
