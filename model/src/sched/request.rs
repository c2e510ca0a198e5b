//! What a pod asks for: per container the number of GPUs, memory and cores,
//! from its resource limits (requests where a limit is absent), and per pod
//! the mode, type and uuid filters and policies from its annotations.
//!
//! Input is plain data (names and quantity strings), so this stays pure; the
//! extender copies it out of the Kubernetes Pod.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::config::NvidiaConfig;
use crate::contract::annotations;

/// binpack or spread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Fill the most used first (fewer, fuller nodes or GPUs).
    #[default]
    Binpack,
    /// Fill the least used first.
    Spread,
}

/// The pod's `nvidia.com/vgpu-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum ModeRequest {
    /// No annotation: the unified pool, a share slice or a MIG instance.
    #[default]
    Any,
    /// `share` (or `hami-core`): vGPU slices of whole GPUs only.
    Share,
    /// `mig`: MIG instances only.
    Mig,
}

/// Memory per GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MemoryRequest {
    /// MiB (already multiplied by `memoryFactor`).
    Mib(u64),
    /// Percent of the GPU's memory, 1..=100.
    Percent(u32),
    /// The whole GPU's memory (`defaultMemory: 0` and nothing named).
    Whole,
}

/// One container's ask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRequest {
    /// Position in `initContainers ++ containers` (the allocation's index).
    pub index: u32,
    /// Container name.
    pub name: String,
    /// An init container (runs alone, before the regular containers).
    pub init: bool,
    /// Number of devices (GPUs or MIG instances), ≥ 1.
    pub count: u32,
    /// Memory per device.
    pub memory: MemoryRequest,
    /// SM share per device, percent 0..=100 (100 = a whole GPU to itself).
    pub cores: u32,
}

/// The whole pod's ask; only containers that want a GPU are listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRequest {
    /// Containers asking for GPUs, init containers first.
    pub containers: Vec<ContainerRequest>,
    /// Share, MIG or either.
    pub mode: ModeRequest,
    /// `nvidia.com/use-gputype`: only GPUs whose model matches one of these.
    pub use_types: Vec<String>,
    /// `nvidia.com/nouse-gputype`: never GPUs whose model matches one of these.
    pub nouse_types: Vec<String>,
    /// `nvidia.com/use-gpuuuid`: only these GPUs.
    pub use_uuids: Vec<String>,
    /// `nvidia.com/nouse-gpuuuid`: never these GPUs.
    pub nouse_uuids: Vec<String>,
    /// `tessera.io/gpu-policy`, else the config's default.
    pub gpu_policy: Option<Policy>,
    /// `tessera.io/node-policy`, else the config's default.
    pub node_policy: Option<Policy>,
}

/// One container's resources as written in the pod (quantity strings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResources {
    /// Container name.
    pub name: String,
    /// `resources.limits`.
    pub limits: BTreeMap<String, String>,
    /// `resources.requests`.
    pub requests: BTreeMap<String, String>,
}

/// Why a pod's ask could not be read. Each names the container and field or
/// the annotation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RequestError {
    /// A resource quantity that is not a whole non-negative number, or out of range.
    #[error("container {container:?}: {resource}: {problem}")]
    Resource {
        /// Container name.
        container: String,
        /// Resource name.
        resource: String,
        /// What is wrong.
        problem: String,
    },
    /// An annotation with a value outside its set.
    #[error("annotation {key}: {problem}")]
    Annotation {
        /// Annotation key.
        key: String,
        /// What is wrong.
        problem: String,
    },
}

/// Most devices one container may ask for (the allocation's limit too).
pub const MAX_COUNT: u32 = 64;

impl PodRequest {
    /// Reads a pod's ask; `Ok(None)` when no container wants a GPU.
    ///
    /// Per container: the count resource; memory from the memory resource ×
    /// `memoryFactor`, else the percentage resource, else `defaultMemory`
    /// (0 = [`MemoryRequest::Whole`]); cores from the core resource, else
    /// `defaultCores`; a container naming memory or cores but no count gets
    /// `defaultGPUNum` (0: it asks for none). Limits win over requests.
    /// Quantities are Kubernetes quantities that must be whole numbers
    /// (`8000`, `8k`, `1Ki`, `1e3`; `0.5` or `-1` refused); count ≤ 64, cores ≤ 100,
    /// percentage 1..=100, memory ≥ 1. An explicit count of 0 asks for none.
    /// Annotations: `nvidia.com/vgpu-mode` share | mig |
    /// hami-core (= share), the type and uuid lists comma-separated (blanks
    /// trimmed, empty items dropped), policies binpack | spread.
    pub fn from_pod(
        init_containers: &[ContainerResources],
        containers: &[ContainerResources],
        annotations: &BTreeMap<String, String>,
        config: &NvidiaConfig,
    ) -> Result<Option<PodRequest>, RequestError> {
        let mut asks = Vec::new();
        let all = init_containers
            .iter()
            .map(|c| (c, true))
            .chain(containers.iter().map(|c| (c, false)));
        for (index, (container, init)) in all.enumerate() {
            let index = u32::try_from(index).map_err(|_| RequestError::Resource {
                container: container.name.clone(),
                resource: "containers".into(),
                problem: "too many containers".into(),
            })?;
            if let Some(ask) = container_request(index, container, init, config)? {
                asks.push(ask);
            }
        }
        if asks.is_empty() {
            return Ok(None);
        }
        let mode = match annotation(annotations, annotations::VGPU_MODE) {
            None => ModeRequest::Any,
            Some(value) => match value.to_ascii_lowercase().as_str() {
                "share" | "hami-core" => ModeRequest::Share,
                "mig" => ModeRequest::Mig,
                _ => {
                    return Err(RequestError::Annotation {
                        key: annotations::VGPU_MODE.into(),
                        problem: format!("{value:?} is not one of share, mig, hami-core"),
                    });
                }
            },
        };
        Ok(Some(PodRequest {
            containers: asks,
            mode,
            use_types: list(annotations, annotations::USE_GPU_TYPE),
            nouse_types: list(annotations, annotations::NOUSE_GPU_TYPE),
            use_uuids: list(annotations, annotations::USE_GPU_UUID),
            nouse_uuids: list(annotations, annotations::NOUSE_GPU_UUID),
            gpu_policy: policy(annotations, annotations::GPU_POLICY)?,
            node_policy: policy(annotations, annotations::NODE_POLICY)?,
        }))
    }
}

/// One container's ask, or `None` when it wants no GPU.
fn container_request(
    index: u32,
    container: &ContainerResources,
    init: bool,
    config: &NvidiaConfig,
) -> Result<Option<ContainerRequest>, RequestError> {
    let error = |resource: &str, problem: String| RequestError::Resource {
        container: container.name.clone(),
        resource: resource.to_owned(),
        problem,
    };
    let read = |resource: &str| -> Result<Option<u64>, RequestError> {
        let text = container
            .limits
            .get(resource)
            .or_else(|| container.requests.get(resource));
        match text {
            None => Ok(None),
            Some(text) => parse_quantity(text)
                .map(Some)
                .map_err(|problem| error(resource, problem)),
        }
    };
    let count = read(&config.resource_count_name)?;
    let memory = read(&config.resource_memory_name)?;
    let percent = read(&config.resource_memory_percentage_name)?;
    let cores = read(&config.resource_core_name)?;

    let count = match count {
        Some(n) => n,
        None if memory.is_some() || percent.is_some() || cores.is_some() => {
            u64::from(config.default_gpu_num)
        }
        None => 0,
    };
    if count == 0 {
        return Ok(None);
    }
    if count > u64::from(MAX_COUNT) {
        return Err(error(
            &config.resource_count_name,
            format!("{count} is over {MAX_COUNT}"),
        ));
    }
    let memory = match (memory, percent) {
        (Some(0), _) => {
            return Err(error(&config.resource_memory_name, "0 is not ≥ 1".into()));
        }
        (Some(units), _) => {
            let mib = units.checked_mul(config.memory_factor).ok_or_else(|| {
                error(
                    &config.resource_memory_name,
                    format!("{units} × memoryFactor {} overflows", config.memory_factor),
                )
            })?;
            MemoryRequest::Mib(mib)
        }
        (None, Some(p)) if (1..=100).contains(&p) => MemoryRequest::Percent(p as u32),
        (None, Some(p)) => {
            return Err(error(
                &config.resource_memory_percentage_name,
                format!("{p} is outside 1..=100"),
            ));
        }
        (None, None) if config.default_memory == 0 => MemoryRequest::Whole,
        (None, None) => MemoryRequest::Mib(config.default_memory),
    };
    let cores = match cores {
        Some(c) if c <= 100 => c as u32,
        Some(c) => {
            return Err(error(
                &config.resource_core_name,
                format!("{c} is over 100"),
            ));
        }
        None => config.default_cores.min(100),
    };
    Ok(Some(ContainerRequest {
        index,
        name: container.name.clone(),
        init,
        count: count as u32,
        memory,
        cores,
    }))
}

/// An annotation's trimmed value; `None` when absent.
fn annotation<'a>(annotations: &'a BTreeMap<String, String>, key: &str) -> Option<&'a str> {
    annotations.get(key).map(|v| v.trim())
}

/// A comma-separated list annotation: items trimmed, empty ones dropped.
fn list(annotations: &BTreeMap<String, String>, key: &str) -> Vec<String> {
    annotation(annotations, key)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// A policy annotation: binpack | spread.
fn policy(
    annotations: &BTreeMap<String, String>,
    key: &str,
) -> Result<Option<Policy>, RequestError> {
    match annotation(annotations, key) {
        None => Ok(None),
        Some(v) if v.eq_ignore_ascii_case("binpack") => Ok(Some(Policy::Binpack)),
        Some(v) if v.eq_ignore_ascii_case("spread") => Ok(Some(Policy::Spread)),
        Some(v) => Err(RequestError::Annotation {
            key: key.to_owned(),
            problem: format!("{v:?} is not one of binpack, spread"),
        }),
    }
}

/// Parses a Kubernetes quantity whose value is a whole non-negative number:
/// digits with an optional fraction, then a binary suffix (`Ki` … `Ei`), a
/// decimal suffix (`m`, `k`, `M` … `E`) or an exponent (`e3`, `E3`). The value
/// is computed exactly; a fraction that does not cancel (`0.5`, `1500m`), a
/// sign, or a value over `u64` is an error saying so.
pub fn parse_quantity(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let shown = || format!("{text:?}");
    let body = text.strip_prefix('+').unwrap_or(text);
    if body.starts_with('-') {
        return Err(format!("{} is negative", shown()));
    }
    let number_len = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(format!("{} is not a quantity", shown()));
    }
    let (ten_power, binary_power): (i64, u32) = match suffix {
        "" => (0, 0),
        "Ki" => (0, 1),
        "Mi" => (0, 2),
        "Gi" => (0, 3),
        "Ti" => (0, 4),
        "Pi" => (0, 5),
        "Ei" => (0, 6),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        exponent if exponent.starts_with(['e', 'E']) => {
            let digits = &exponent[1..];
            let unsigned = digits.strip_prefix(['+', '-']).unwrap_or(digits);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("{} is not a quantity", shown()));
            }
            let power: i64 = digits
                .parse()
                .map_err(|_| format!("{} is out of range", shown()))?;
            (power, 0)
        }
        _ => return Err(format!("{} is not a quantity", shown())),
    };
    let too_big = || format!("{} is too large", shown());
    let digits = format!("{whole}{fraction}");
    let digits = digits.trim_start_matches('0');
    if digits.len() > 38 {
        return Err(too_big());
    }
    let mut value: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| too_big())?
    };
    value = value
        .checked_mul(1u128 << (10 * binary_power))
        .ok_or_else(too_big)?;
    let ten_power = ten_power - fraction.len() as i64;
    if value != 0 {
        if ten_power > 0 {
            let scale = u32::try_from(ten_power)
                .ok()
                .and_then(|p| 10u128.checked_pow(p))
                .ok_or_else(too_big)?;
            value = value.checked_mul(scale).ok_or_else(too_big)?;
        } else if ten_power < 0 {
            let divisor = u32::try_from(-ten_power)
                .ok()
                .and_then(|p| 10u128.checked_pow(p));
            match divisor {
                Some(d) if value.is_multiple_of(d) => value /= d,
                _ => return Err(format!("{} is not a whole number", shown())),
            }
        }
    }
    u64::try_from(value).map_err(|_| too_big())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_exactly() {
        let cases: [(&str, u64); 16] = [
            ("8000", 8000),
            ("+3", 3),
            ("8k", 8000),
            ("1Ki", 1024),
            ("2Mi", 2 * 1024 * 1024),
            ("1Gi", 1 << 30),
            ("1M", 1_000_000),
            ("1G", 1_000_000_000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("2E", 2_000_000_000_000_000_000),
            ("1.5k", 1500),
            ("1000m", 1),
            ("0", 0),
            ("007", 7),
            ("0.0", 0),
        ];
        for (text, value) in cases {
            assert_eq!(parse_quantity(text), Ok(value), "{text}");
        }
    }

    #[test]
    fn bad_quantities_say_why() {
        let cases = [
            ("-1", "negative"),
            ("0.5", "not a whole number"),
            ("1500m", "not a whole number"),
            ("1e-3", "not a whole number"),
            ("abc", "not a quantity"),
            ("", "not a quantity"),
            ("1K", "not a quantity"),
            ("1e", "not a quantity"),
            ("1.2.3", "not a quantity"),
            ("20Ei", "too large"),
            ("99999999999999999999", "too large"),
            ("1e40", "too large"),
            ("1e99999999999", "too large"),
            ("1e99999999999999999999", "out of range"),
        ];
        for (text, problem) in cases {
            let err = parse_quantity(text).expect_err(text);
            assert!(err.contains(problem), "{text}: {err}");
        }
    }
}

#[cfg(test)]
mod pod_tests {
    use super::*;

    fn container(name: &str, limits: &[(&str, &str)]) -> ContainerResources {
        ContainerResources {
            name: name.into(),
            limits: limits
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            requests: BTreeMap::new(),
        }
    }

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn one(limits: &[(&str, &str)]) -> Result<Option<PodRequest>, RequestError> {
        PodRequest::from_pod(
            &[],
            &[container("main", limits)],
            &BTreeMap::new(),
            &NvidiaConfig::default(),
        )
    }

    fn ask(limits: &[(&str, &str)]) -> ContainerRequest {
        one(limits)
            .expect("valid")
            .expect("asks for a GPU")
            .containers
            .remove(0)
    }

    #[test]
    fn hamis_documented_examples() {
        let c = ask(&[("nvidia.com/gpu", "1"), ("nvidia.com/gpumem", "3000")]);
        assert_eq!(
            (c.count, c.memory, c.cores),
            (1, MemoryRequest::Mib(3000), 0)
        );
        let c = ask(&[
            ("nvidia.com/gpu", "2"),
            ("nvidia.com/gpumem-percentage", "50"),
        ]);
        assert_eq!((c.count, c.memory), (2, MemoryRequest::Percent(50)));
        let c = ask(&[("nvidia.com/gpu", "1"), ("nvidia.com/gpucores", "100")]);
        assert_eq!((c.count, c.memory, c.cores), (1, MemoryRequest::Whole, 100));
        // Memory but no count: defaultGPUNum (1).
        let c = ask(&[("nvidia.com/gpumem", "4000")]);
        assert_eq!((c.count, c.memory), (1, MemoryRequest::Mib(4000)));
        // Memory wins over percentage.
        let c = ask(&[
            ("nvidia.com/gpumem", "1k"),
            ("nvidia.com/gpumem-percentage", "50"),
        ]);
        assert_eq!(c.memory, MemoryRequest::Mib(1000));
        assert_eq!(one(&[("cpu", "1")]), Ok(None));
        assert_eq!(one(&[("nvidia.com/gpu", "0")]), Ok(None));
    }

    #[test]
    fn limits_win_over_requests_and_defaults_apply() {
        let mut c = container("main", &[("nvidia.com/gpumem", "2000")]);
        c.requests.insert("nvidia.com/gpumem".into(), "1000".into());
        c.requests.insert("nvidia.com/gpu".into(), "2".into());
        let config = NvidiaConfig {
            memory_factor: 2,
            default_cores: 30,
            default_gpu_num: 0,
            ..NvidiaConfig::default()
        };
        let pod = PodRequest::from_pod(&[], &[c], &BTreeMap::new(), &config)
            .expect("valid")
            .expect("asks");
        let c = &pod.containers[0];
        assert_eq!(
            (c.count, c.memory, c.cores),
            (2, MemoryRequest::Mib(4000), 30)
        );
        // defaultGPUNum 0: memory alone asks for nothing.
        let pod = PodRequest::from_pod(
            &[],
            &[container("m", &[("nvidia.com/gpumem", "1000")])],
            &BTreeMap::new(),
            &config,
        );
        assert_eq!(pod, Ok(None));
        let config = NvidiaConfig {
            default_memory: 5000,
            ..NvidiaConfig::default()
        };
        let pod = PodRequest::from_pod(
            &[],
            &[container("m", &[("nvidia.com/gpu", "1")])],
            &BTreeMap::new(),
            &config,
        )
        .expect("valid")
        .expect("asks");
        assert_eq!(pod.containers[0].memory, MemoryRequest::Mib(5000));
    }

    #[test]
    fn init_containers_come_first_with_their_index() {
        let pod = PodRequest::from_pod(
            &[container("setup", &[("nvidia.com/gpu", "1")])],
            &[
                container("sidecar", &[("cpu", "1")]),
                container("main", &[("nvidia.com/gpu", "1")]),
            ],
            &BTreeMap::new(),
            &NvidiaConfig::default(),
        )
        .expect("valid")
        .expect("asks");
        let summary: Vec<(u32, &str, bool)> = pod
            .containers
            .iter()
            .map(|c| (c.index, c.name.as_str(), c.init))
            .collect();
        assert_eq!(summary, [(0, "setup", true), (2, "main", false)]);
    }

    #[test]
    fn bad_values_name_container_and_resource() {
        let cases: [(&[(&str, &str)], &str); 10] = [
            (
                &[("nvidia.com/gpu", "-1")],
                "container \"main\": nvidia.com/gpu: \"-1\" is negative",
            ),
            (
                &[("nvidia.com/gpu", "0.5")],
                "container \"main\": nvidia.com/gpu: \"0.5\" is not a whole number",
            ),
            (
                &[("nvidia.com/gpu", "abc")],
                "container \"main\": nvidia.com/gpu: \"abc\" is not a quantity",
            ),
            (
                &[("nvidia.com/gpu", "65")],
                "container \"main\": nvidia.com/gpu: 65 is over 64",
            ),
            (
                &[("nvidia.com/gpucores", "101")],
                "container \"main\": nvidia.com/gpucores: 101 is over 100",
            ),
            (
                &[("nvidia.com/gpumem-percentage", "0")],
                "container \"main\": nvidia.com/gpumem-percentage: 0 is outside 1..=100",
            ),
            (
                &[("nvidia.com/gpumem-percentage", "101")],
                "container \"main\": nvidia.com/gpumem-percentage: 101 is outside 1..=100",
            ),
            (
                &[("nvidia.com/gpumem", "0")],
                "container \"main\": nvidia.com/gpumem: 0 is not ≥ 1",
            ),
            (
                &[("nvidia.com/gpumem", "20Ei")],
                "container \"main\": nvidia.com/gpumem: \"20Ei\" is too large",
            ),
            (
                &[("nvidia.com/gpu", "1"), ("nvidia.com/gpumem", "1e-3")],
                "container \"main\": nvidia.com/gpumem: \"1e-3\" is not a whole number",
            ),
        ];
        for (limits, expected) in cases {
            let err = one(limits).expect_err(expected).to_string();
            assert_eq!(err, expected);
        }
        // An exponent that is a whole number is read.
        assert_eq!(
            ask(&[("nvidia.com/gpumem", "8e3")]).memory,
            MemoryRequest::Mib(8000)
        );
        // The memory factor overflowing is an error, not a wrap.
        let config = NvidiaConfig {
            memory_factor: 1 << 40,
            ..NvidiaConfig::default()
        };
        let err = PodRequest::from_pod(
            &[],
            &[container("main", &[("nvidia.com/gpumem", "16777216")])],
            &BTreeMap::new(),
            &config,
        )
        .expect_err("overflow")
        .to_string();
        assert!(err.contains("overflows"), "{err}");
    }

    #[test]
    fn annotations_are_read_and_bad_ones_refused() {
        let gpu = [container("main", &[("nvidia.com/gpu", "1")])];
        let read = |pairs: &[(&str, &str)]| {
            PodRequest::from_pod(&[], &gpu, &annotations(pairs), &NvidiaConfig::default())
        };
        let pod = read(&[
            ("nvidia.com/vgpu-mode", "hami-core"),
            ("nvidia.com/use-gputype", " A100 , H100,,"),
            ("nvidia.com/nouse-gputype", "A30"),
            ("nvidia.com/use-gpuuuid", "GPU-a"),
            ("nvidia.com/nouse-gpuuuid", "GPU-b,GPU-c"),
            ("tessera.io/gpu-policy", "binpack"),
            ("tessera.io/node-policy", "spread"),
        ])
        .expect("valid")
        .expect("asks");
        assert_eq!(pod.mode, ModeRequest::Share);
        assert_eq!(pod.use_types, ["A100", "H100"]);
        assert_eq!(pod.nouse_types, ["A30"]);
        assert_eq!(pod.use_uuids, ["GPU-a"]);
        assert_eq!(pod.nouse_uuids, ["GPU-b", "GPU-c"]);
        assert_eq!(pod.gpu_policy, Some(Policy::Binpack));
        assert_eq!(pod.node_policy, Some(Policy::Spread));
        let pod = read(&[("nvidia.com/vgpu-mode", "mig")])
            .expect("valid")
            .expect("asks");
        assert_eq!(pod.mode, ModeRequest::Mig);
        let pod = read(&[]).expect("valid").expect("asks");
        assert_eq!((pod.mode, pod.gpu_policy), (ModeRequest::Any, None));
        assert_eq!(
            read(&[("nvidia.com/vgpu-mode", "time")])
                .expect_err("time")
                .to_string(),
            "annotation nvidia.com/vgpu-mode: \"time\" is not one of share, mig, hami-core"
        );
        assert_eq!(
            read(&[("tessera.io/gpu-policy", "pack")])
                .expect_err("pack")
                .to_string(),
            "annotation tessera.io/gpu-policy: \"pack\" is not one of binpack, spread"
        );
    }
}
