//! Node profiles: which GPUs a simulated node has, and which MIG instances
//! exist when it is built.
//!
//! A profile is TOML (or JSON, chosen by the `.json` extension):
//!
//! ```toml
//! name = "demo"                   # optional; default: the file stem
//! description = "one line"        # optional; shown by `tessera-sim profiles`
//! driver_version = "570.133.20"   # optional
//! cuda_driver_version = 12080     # optional
//! [[gpu]]                         # one entry per group of identical GPUs
//! model = "H100-80GB"             # a catalogue key
//! count = 1                       # default 1
//! mig = false                     # default false
//! minor = 4                       # optional: device minor of the group's first GPU
//! pci_bus = 0x9a                  # optional: PCI bus of the group's first GPU
//! [[gpu]]
//! model = "A100-40GB"
//! mig = true
//! instances = [ { profile = "3g.20gb", start = 4 }, { profile = "1g.5gb" } ]
//! ```
//!
//! Every group of `count` GPUs gets the same instances, each a GPU instance
//! with one compute instance spanning it; a missing `start` means the first
//! legal start that is still free. GPUs are numbered (NVML index) in file
//! order. The device minor (`/dev/nvidia<minor>`, `nvmlDeviceGetMinorNumber`,
//! the key of the mig-minors table) equals the index unless the group sets
//! `minor`: then its GPUs get `minor`, `minor + 1`, … — on real multi-GPU
//! nodes the minors follow the driver's probe order, not the PCI order NVML
//! indexes by, so they often differ. Minors must be distinct and below
//! [`MAX_GPUS`]. Likewise `pci_bus` numbers the group's GPUs' PCI buses
//! (`0000:<bus>:00.0`), default [`crate::state::default_pci_bus`] of the
//! index; buses must be distinct and at most 0xff.
//!
//! Unknown keys are refused. Errors are one line naming the file and the
//! field, e.g. `profile nodes/x.toml: gpu[1].model: unknown GPU model "H300"
//! (known: A30, …)`; `gpu[i]` counts `[[gpu]]` entries from 0.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::state::{NodeState, SimGpu};
use crate::{SimError, ids, mig};

/// The profiles shipped with the crate, `(name, TOML text)`, from `sim/profiles/`.
pub fn shipped_profiles() -> &'static [(&'static str, &'static str)] {
    SHIPPED
}

static SHIPPED: &[(&str, &str)] = &[
    ("demo", include_str!("../profiles/demo.toml")),
    ("mig-mixed", include_str!("../profiles/mig-mixed.toml")),
    ("dynamic", include_str!("../profiles/dynamic.toml")),
    ("probe-order", include_str!("../profiles/probe-order.toml")),
    (
        "bench-8xh100",
        include_str!("../profiles/bench-8xh100.toml"),
    ),
    ("a30", include_str!("../profiles/a30.toml")),
    ("a100-40gb", include_str!("../profiles/a100-40gb.toml")),
    (
        "a100-40gb-dynamic",
        include_str!("../profiles/a100-40gb-dynamic.toml"),
    ),
    ("a100-80gb", include_str!("../profiles/a100-80gb.toml")),
    ("h100-80gb", include_str!("../profiles/h100-80gb.toml")),
    ("h100-94gb", include_str!("../profiles/h100-94gb.toml")),
    ("h200", include_str!("../profiles/h200.toml")),
    ("b200", include_str!("../profiles/b200.toml")),
    (
        "rtx-pro-6000",
        include_str!("../profiles/rtx-pro-6000.toml"),
    ),
];

/// Most GPUs a node may have: the mig-minors table covers GPU minors 0..31.
pub const MAX_GPUS: u32 = crate::caps::TABLE_GPUS;

/// A parsed, validated node profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeProfile {
    /// Profile name; seeds the GPU UUIDs.
    pub name: String,
    /// One-line description.
    #[serde(default)]
    pub description: String,
    /// Driver version the node reports.
    pub driver_version: String,
    /// CUDA driver version the node reports (`cuDriverGetVersion` encoding).
    pub cuda_driver_version: i32,
    /// GPU groups in file order.
    #[serde(rename = "gpu")]
    pub gpus: Vec<GpuGroup>,
}

/// `count` identical GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuGroup {
    /// Catalogue key, e.g. `A100-40GB`.
    pub model: String,
    /// How many GPUs.
    pub count: u32,
    /// MIG mode at build time.
    pub mig: bool,
    /// MIG instances made on each GPU of the group at build time.
    #[serde(default)]
    pub instances: Vec<InstanceSpec>,
    /// Device minor of the group's first GPU (the next ones count up);
    /// `None`: the minors equal the indexes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<u32>,
    /// PCI bus of the group's first GPU (the next ones count up); `None`:
    /// [`crate::state::default_pci_bus`] of each index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus: Option<u32>,
}

/// One pre-created MIG instance (GI plus one full-size CI).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSpec {
    /// GI profile name, e.g. `3g.20gb`.
    pub profile: String,
    /// Placement start in memory slices; `None`: first free legal start.
    #[serde(default)]
    pub start: Option<u32>,
}

impl NodeProfile {
    /// Loads a shipped profile by name, or a profile file by path. A name
    /// without `/` and without a `.toml`/`.json` extension that is not an
    /// existing file is looked up among the shipped profiles.
    pub fn load(path_or_name: &str) -> Result<NodeProfile, SimError> {
        let path = Path::new(path_or_name);
        let looks_like_path = path_or_name.contains('/')
            || path_or_name.ends_with(".toml")
            || path_or_name.ends_with(".json");
        if looks_like_path || path.is_file() {
            return NodeProfile::from_file(path);
        }
        NodeProfile::shipped(path_or_name).unwrap_or_else(|| {
            Err(SimError::UnknownProfile {
                name: path_or_name.to_string(),
                shipped: SHIPPED
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        })
    }

    /// The shipped profile `name`, parsed; `None` if there is none.
    pub fn shipped(name: &str) -> Option<Result<NodeProfile, SimError>> {
        SHIPPED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(n, text)| NodeProfile::parse_toml(text, n, n))
    }

    /// Reads and parses a profile file (JSON if it ends in `.json`, else TOML).
    pub fn from_file(path: &Path) -> Result<NodeProfile, SimError> {
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Profile {
            source_name: source.clone(),
            field: "file".into(),
            reason: format!("cannot read: {e}"),
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "node".into());
        if path.extension().is_some_and(|e| e == "json") {
            NodeProfile::parse_json(&text, &source, &stem)
        } else {
            NodeProfile::parse_toml(&text, &source, &stem)
        }
    }

    /// Parses TOML text; `source` names it in errors, `default_name` is used
    /// when the text has no `name`.
    pub fn parse_toml(
        text: &str,
        source: &str,
        default_name: &str,
    ) -> Result<NodeProfile, SimError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| {
            let field = e
                .span()
                .map(|s| {
                    let (line, col) = line_col(text, s.start);
                    format!("line {line}, column {col}")
                })
                .unwrap_or_else(|| "document".into());
            SimError::Profile {
                source_name: source.to_string(),
                field,
                reason: one_line(e.message()),
            }
        })?;
        let value = serde_json::to_value(&table).map_err(|e| SimError::Profile {
            source_name: source.to_string(),
            field: "document".into(),
            reason: one_line(&e.to_string()),
        })?;
        NodeProfile::from_value(&value, source, default_name)
    }

    /// Parses JSON text, same schema as TOML.
    pub fn parse_json(
        text: &str,
        source: &str,
        default_name: &str,
    ) -> Result<NodeProfile, SimError> {
        let value: Value = serde_json::from_str(text).map_err(|e| SimError::Profile {
            source_name: source.to_string(),
            field: format!("line {}, column {}", e.line(), e.column()),
            reason: json_message(&e),
        })?;
        NodeProfile::from_value(&value, source, default_name)
    }

    fn from_value(
        value: &Value,
        source: &str,
        default_name: &str,
    ) -> Result<NodeProfile, SimError> {
        let w = Walker { source };
        let top = w.table(value, "document")?;
        w.known_keys(
            top,
            "",
            &[
                "name",
                "description",
                "driver_version",
                "cuda_driver_version",
                "gpu",
            ],
        )?;
        let name = w
            .opt_str(top, "", "name")?
            .unwrap_or(default_name)
            .to_string();
        if name.is_empty() {
            return Err(w.err("name", "must not be empty".into()));
        }
        let description = w.opt_str(top, "", "description")?.unwrap_or("").to_string();
        let driver_version = w
            .opt_str(top, "", "driver_version")?
            .unwrap_or(crate::DEFAULT_DRIVER_VERSION)
            .to_string();
        if driver_version.is_empty()
            || !driver_version
                .split('.')
                .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(w.err(
                "driver_version",
                format!("{driver_version:?} is not a version like \"570.133.20\""),
            ));
        }
        let cuda_driver_version = match w.opt_uint(top, "", "cuda_driver_version")? {
            None => crate::DEFAULT_CUDA_DRIVER_VERSION,
            Some(v) => i32::try_from(v)
                .ok()
                .filter(|v| *v >= 1000)
                .ok_or_else(|| {
                    w.err(
                        "cuda_driver_version",
                        format!("{v} is not a CUDA version like 12080 (major·1000 + minor·10)"),
                    )
                })?,
        };
        let gpus = match top.get("gpu") {
            None => {
                return Err(w.err(
                    "gpu",
                    "missing: a profile needs at least one [[gpu]]".into(),
                ));
            }
            Some(Value::Array(items)) if items.is_empty() => {
                return Err(w.err("gpu", "empty: a profile needs at least one [[gpu]]".into()));
            }
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| w.gpu_group(item, &format!("gpu[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(w.err(
                    "gpu",
                    format!(
                        "expected an array of tables ([[gpu]]), found {}",
                        kind(other)
                    ),
                ));
            }
        };
        let profile = NodeProfile {
            name,
            description,
            driver_version,
            cuda_driver_version,
            gpus,
        };
        profile.validate(source)?;
        Ok(profile)
    }

    /// Checks the profile against the catalogue and the MIG rules, by laying
    /// out every GPU's instances; `source` names the profile in errors.
    pub fn validate(&self, source: &str) -> Result<(), SimError> {
        self.node_state(source).map(|_| ())
    }

    /// Number of GPUs the profile describes.
    pub fn gpu_count(&self) -> u32 {
        self.gpus.iter().map(|g| g.count).sum()
    }

    /// The node's initial state: GPUs with deterministic UUIDs and the
    /// profile's instances created through [`crate::mig`], each with its CI.
    pub fn node_state(&self, source: &str) -> Result<NodeState, SimError> {
        let err = |field: String, reason: String| SimError::Profile {
            source_name: source.to_string(),
            field,
            reason,
        };
        let total: u64 = self.gpus.iter().map(|g| u64::from(g.count)).sum();
        if total > u64::from(MAX_GPUS) {
            return Err(err(
                "gpu".into(),
                format!("{total} GPUs in all; a node has at most {MAX_GPUS}"),
            ));
        }
        let mut node = NodeState::new(self.driver_version.clone());
        node.cuda_driver_version = self.cuda_driver_version;
        let mut index = 0u32;
        for (g, group) in self.gpus.iter().enumerate() {
            let at = format!("gpu[{g}]");
            let model = mig::model_spec(&group.model).map_err(|e| {
                err(
                    format!("{at}.model"),
                    match e {
                        SimError::UnknownModel { key, known } => {
                            format!("unknown GPU model {key:?} (known: {known})")
                        }
                        other => other.to_string(),
                    },
                )
            })?;
            if group.count == 0 {
                return Err(err(format!("{at}.count"), "must be at least 1".into()));
            }
            if group.mig && model.mig.is_none() {
                return Err(err(
                    format!("{at}.mig"),
                    format!("model {} does not support MIG", group.model),
                ));
            }
            if !group.instances.is_empty() && !group.mig {
                return Err(err(
                    format!("{at}.instances"),
                    "MIG instances need mig = true on this GPU".into(),
                ));
            }
            for k in 0..group.count {
                let minor = group.minor.map_or(index, |m| m + k);
                if minor >= MAX_GPUS {
                    return Err(err(
                        format!("{at}.minor"),
                        format!(
                            "minor {minor} is past the last the mig-minors table covers ({})",
                            MAX_GPUS - 1
                        ),
                    ));
                }
                if node.gpus.iter().any(|g| g.minor == minor) {
                    return Err(err(
                        format!("{at}.minor"),
                        format!("minor {minor} is already taken by another GPU"),
                    ));
                }
                let pci_bus = group
                    .pci_bus
                    .map_or_else(|| crate::state::default_pci_bus(index), |b| b + k);
                if pci_bus > 0xff {
                    return Err(err(
                        format!("{at}.pci_bus"),
                        format!("bus {pci_bus:#x} is past 0xff"),
                    ));
                }
                if node.gpus.iter().any(|g| g.pci_bus() == pci_bus) {
                    return Err(err(
                        format!("{at}.pci_bus"),
                        format!("bus {pci_bus:#x} is already taken by another GPU"),
                    ));
                }
                node.gpus.push(SimGpu {
                    index,
                    minor,
                    uuid: ids::gpu_uuid(&self.name, index, &group.model),
                    model: group.model.clone(),
                    pci_bus: Some(pci_bus),
                    mig_enabled: group.mig,
                    mig_pending: group.mig,
                    gpu_instances: Vec::new(),
                });
                for (j, inst) in group.instances.iter().enumerate() {
                    let field = format!("{at}.instances[{j}]");
                    let gi = place_instance(&mut node, index, inst).map_err(|r| err(field, r))?;
                    mig::create_compute_instance(&mut node, index, gi)
                        .map_err(|e| err(format!("{at}.instances[{j}]"), e.to_string()))?;
                }
                index += 1;
            }
        }
        Ok(node)
    }
}

/// Creates the GI for `inst` on GPU `index`; the error is the reason text.
fn place_instance(node: &mut NodeState, index: u32, inst: &InstanceSpec) -> Result<u32, String> {
    let gpu = node
        .gpu_mut(index)
        .ok_or_else(|| format!("internal: GPU {index} missing"))?;
    let spec = mig::mig_spec(gpu).map_err(|e| e.to_string())?;
    let profile = spec.profile_by_name(&inst.profile).ok_or_else(|| {
        format!(
            "unknown MIG profile {:?} for {} (known: {})",
            inst.profile,
            gpu.model,
            spec.profiles
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let legal = || {
        profile
            .starts
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let start = match inst.start {
        Some(s) => {
            if !profile.starts.contains(&s) {
                return Err(format!(
                    "profile {} at start {s}: not a legal start (legal: {})",
                    profile.name,
                    legal()
                ));
            }
            s
        }
        None => mig::first_free_start(gpu, profile.id)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| {
                format!(
                    "profile {}: no legal start is free (legal: {})",
                    profile.name,
                    legal()
                )
            })?,
    };
    mig::create_gpu_instance(gpu, profile.id, start).map_err(|e| match e {
        // The driver's messages start with "GPU <n>: "; the field already says where.
        SimError::InsufficientResources(m) | SimError::InvalidArgument(m) => m
            .split_once(": ")
            .map_or(m.as_str(), |(_, rest)| rest)
            .to_string(),
        other => other.to_string(),
    })
}

/// Field-aware accessors over the parsed document.
struct Walker<'a> {
    source: &'a str,
}

impl Walker<'_> {
    fn err(&self, field: &str, reason: String) -> SimError {
        SimError::Profile {
            source_name: self.source.to_string(),
            field: field.to_string(),
            reason,
        }
    }

    fn table<'v>(&self, v: &'v Value, field: &str) -> Result<&'v Map<String, Value>, SimError> {
        v.as_object()
            .ok_or_else(|| self.err(field, format!("expected a table, found {}", kind(v))))
    }

    fn known_keys(&self, t: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), SimError> {
        match t.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => Err(self.err(
                &join_field(at, k),
                format!("unknown field (expected one of: {})", known.join(", ")),
            )),
        }
    }

    fn opt_str<'v>(
        &self,
        t: &'v Map<String, Value>,
        at: &str,
        key: &str,
    ) -> Result<Option<&'v str>, SimError> {
        match t.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(
                &join_field(at, key),
                format!("expected a string, found {}", kind(v)),
            )),
        }
    }

    fn opt_uint(
        &self,
        t: &Map<String, Value>,
        at: &str,
        key: &str,
    ) -> Result<Option<u64>, SimError> {
        match t.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                self.err(
                    &join_field(at, key),
                    format!("expected a non-negative integer, found {}", kind(v)),
                )
            }),
        }
    }

    fn opt_u32(
        &self,
        t: &Map<String, Value>,
        at: &str,
        key: &str,
    ) -> Result<Option<u32>, SimError> {
        match self.opt_uint(t, at, key)? {
            None => Ok(None),
            Some(v) => u32::try_from(v)
                .map(Some)
                .map_err(|_| self.err(&join_field(at, key), format!("{v} is out of range"))),
        }
    }

    fn opt_bool(
        &self,
        t: &Map<String, Value>,
        at: &str,
        key: &str,
    ) -> Result<Option<bool>, SimError> {
        match t.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(
                &join_field(at, key),
                format!("expected true or false, found {}", kind(v)),
            )),
        }
    }

    fn gpu_group(&self, v: &Value, at: &str) -> Result<GpuGroup, SimError> {
        let t = self.table(v, at)?;
        self.known_keys(
            t,
            at,
            &["model", "count", "mig", "instances", "minor", "pci_bus"],
        )?;
        let model = self
            .opt_str(t, at, "model")?
            .ok_or_else(|| self.err(&format!("{at}.model"), "missing".into()))?
            .to_string();
        let count = match self.opt_uint(t, at, "count")? {
            None => 1,
            Some(c) => u32::try_from(c)
                .ok()
                .filter(|c| (1..=MAX_GPUS).contains(c))
                .ok_or_else(|| {
                    self.err(
                        &format!("{at}.count"),
                        format!("{c} is not between 1 and {MAX_GPUS}"),
                    )
                })?,
        };
        let mig = self.opt_bool(t, at, "mig")?.unwrap_or(false);
        let instances = match t.get("instances") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(j, item)| self.instance(item, &format!("{at}.instances[{j}]")))
                .collect::<Result<Vec<_>, _>>()?,
            Some(other) => {
                return Err(self.err(
                    &format!("{at}.instances"),
                    format!("expected an array of tables, found {}", kind(other)),
                ));
            }
        };
        let minor = self.opt_u32(t, at, "minor")?;
        let pci_bus = self.opt_u32(t, at, "pci_bus")?;
        Ok(GpuGroup {
            model,
            count,
            mig,
            instances,
            minor,
            pci_bus,
        })
    }

    fn instance(&self, v: &Value, at: &str) -> Result<InstanceSpec, SimError> {
        let t = self.table(v, at)?;
        self.known_keys(t, at, &["profile", "start"])?;
        let profile = self
            .opt_str(t, at, "profile")?
            .ok_or_else(|| self.err(&format!("{at}.profile"), "missing".into()))?
            .to_string();
        let start =
            match self.opt_uint(t, at, "start")? {
                None => None,
                Some(s) => Some(u32::try_from(s).map_err(|_| {
                    self.err(&format!("{at}.start"), format!("{s} is out of range"))
                })?),
            };
        Ok(InstanceSpec { profile, start })
    }
}

fn join_field(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "a table".into(),
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn json_message(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let msg = full
        .rsplit_once(" at line ")
        .map_or(full.as_str(), |(m, _)| m);
    one_line(msg)
}
