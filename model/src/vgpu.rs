//! vGPU limits: the container's limits file (`/usr/local/tessera/vgpu.json`),
//! the HAMi-core environment names, and the one resolved form the
//! interception library enforces.
//!
//! - [`VgpuConfig`]: the limits file, strict on read (unknown fields, duplicate
//!   fields and out-of-range values are errors naming the field), keyed by GPU
//!   UUID so that a reordered `CUDA_VISIBLE_DEVICES` cannot mix up limits;
//! - [`EnvLimits`]: the HAMi-core environment (`CUDA_DEVICE_MEMORY_LIMIT[_<i>]`,
//!   `CUDA_DEVICE_SM_LIMIT[_<i>]`, `CUDA_DEVICE_MEMORY_SHARED_CACHE`,
//!   `CUDA_OVERSUBSCRIBE`, `LIBCUDA_LOG_LEVEL`), keyed by visible device index,
//!   read only where the file is absent;
//! - [`ResolvedLimits`]: what either resolves to, with
//!   [`ResolvedLimits::limit_for`] answering "what is the limit of this device".
//!
//! The format is documented for operators in `docs/vgpu.md`. Reading files
//! and the process environment is the library's job (`tessera-vgpu`'s
//! `config` module); everything here is pure.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::vgpu::{
    ACCOUNTING_DIR as DEFAULT_ACCOUNTING_DIR, ACCOUNTING_FILE as ACCOUNTING_FILE_NAME, MAX_DEVICES,
};

/// The limits file version this library reads.
pub const CONFIG_VERSION: u32 = 1;

/// Largest accepted `memoryScaling`.
pub const MAX_MEMORY_SCALING: f64 = 64.0;

/// Bytes in one MiB.
pub const MIB: u64 = 1 << 20;

/// The HAMi-core environment names, read only where the limits file is absent.
use crate::contract::env::hami as env_names;

/// How much the interception library logs (to stderr of the workload).
///
/// HAMi-core's `LIBCUDA_LOG_LEVEL` numbers map as HAMi-core reads them: errors
/// are always printed; `0`–`1` errors only, `2` (its default) warnings, `3`
/// info, `4` and above debug.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    /// Errors only.
    Error,
    /// Errors and warnings (the default).
    #[default]
    Warn,
    /// Also one line per notable event (limits loaded, reclaims).
    Info,
    /// Also per-call tracing.
    Debug,
}

impl LogLevel {
    /// The level's name as the limits file spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
        }
    }

    /// Reads a `LIBCUDA_LOG_LEVEL` value: a HAMi-core number (any integer) or
    /// a level name (`error`, `warn`/`warning`, `info`, `debug`, any case).
    pub fn from_env_value(value: &str) -> Option<LogLevel> {
        let value = value.trim();
        if let Ok(n) = value.parse::<i64>() {
            return Some(match n {
                ..=1 => LogLevel::Error,
                2 => LogLevel::Warn,
                3 => LogLevel::Info,
                _ => LogLevel::Debug,
            });
        }
        match value.to_ascii_lowercase().as_str() {
            "error" => Some(LogLevel::Error),
            "warn" | "warning" => Some(LogLevel::Warn),
            "info" => Some(LogLevel::Info),
            "debug" => Some(LogLevel::Debug),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// The limits file
// ---------------------------------------------------------------------------

/// The limits file, `/usr/local/tessera/vgpu.json`: written by the device
/// plugin, mounted read-only, authoritative over the environment.
///
/// Read it with [`VgpuConfig::parse`], which also runs [`VgpuConfig::validate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VgpuConfig {
    /// Format version; this library reads [`CONFIG_VERSION`].
    pub version: u32,
    /// The container's devices and their limits, keyed by UUID. A device the
    /// list does not name gets no GPU memory (see [`ResolvedLimits::unlisted`]).
    pub devices: Vec<DeviceConfig>,
    /// Directory of the shared accounting file; absolute.
    #[serde(default = "default_accounting_dir")]
    pub accounting_dir: PathBuf,
    /// Whether an allocation within the limit that does not fit in device
    /// memory may fall back to host-backed managed memory.
    #[serde(default)]
    pub oversubscribe: bool,
    /// HAMi's `deviceMemoryScaling`: the factor by which the node oversubscribes
    /// the device's physical memory (> 1: the limits of all slices may add up to
    /// more than the device has). Informational for the library, which enforces
    /// each limit as written; in `(0, 64]`.
    #[serde(default = "default_memory_scaling")]
    pub memory_scaling: f64,
    /// How much the library logs.
    #[serde(default)]
    pub log_level: LogLevel,
}

/// One device of the limits file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceConfig {
    /// NVML UUID: `GPU-…` for a whole GPU, `MIG-…` for a MIG device.
    pub uuid: String,
    /// Memory limit in MiB; 0 means no memory limit.
    #[serde(default, rename = "memoryLimitMiB")]
    pub memory_limit_mib: u64,
    /// Share of the device's SMs in percent; 0 or 100 means no SM limit.
    #[serde(default)]
    pub sm_limit_percent: u32,
}

fn default_accounting_dir() -> PathBuf {
    PathBuf::from(DEFAULT_ACCOUNTING_DIR)
}

fn default_memory_scaling() -> f64 {
    1.0
}

/// Why a limits file was refused; one line, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VgpuConfigError {
    /// Not JSON, or a problem serde found that could not be pinned to a field
    /// (a duplicate field, for one).
    #[error("line {line} column {column}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A field has a wrong type, an unknown name, or a value out of range.
    #[error("{field}: {message}")]
    Field {
        /// Path of the field, e.g. `devices[1].smLimitPercent`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl VgpuConfigError {
    fn field(field: impl Into<String>, message: impl Into<String>) -> Self {
        VgpuConfigError::Field {
            field: field.into(),
            message: message.into(),
        }
    }

    fn syntax(error: &serde_json::Error) -> Self {
        // serde_json appends " at line L column C"; keep only the message.
        let text = error.to_string();
        let message = match text.rfind(" at line ") {
            Some(at) => text[..at].to_string(),
            None => text,
        };
        VgpuConfigError::Syntax {
            line: error.line(),
            column: error.column(),
            message,
        }
    }
}

/// Checks one field of the limits file, given its full name and value.
type FieldCheck = fn(&str, &Value) -> Option<VgpuConfigError>;

/// The fields of the file's top level, in the order errors list them.
const TOP_FIELDS: [(&str, FieldCheck); 6] = [
    ("version", check_type::<u32>),
    ("devices", |_, v| locate_devices(v)),
    ("accountingDir", check_type::<PathBuf>),
    ("oversubscribe", check_type::<bool>),
    ("memoryScaling", check_type::<f64>),
    ("logLevel", check_type::<LogLevel>),
];

/// The fields of one `devices[]` entry.
const DEVICE_FIELDS: [(&str, FieldCheck); 3] = [
    ("uuid", check_type::<String>),
    ("memoryLimitMiB", check_type::<u64>),
    ("smLimitPercent", check_type::<u32>),
];

impl VgpuConfig {
    /// Parses and validates a limits file. Errors are one line and name the
    /// field (`devices[1].smLimitPercent: 140 is above 100`).
    pub fn parse(text: &str) -> Result<VgpuConfig, VgpuConfigError> {
        let value: Value = serde_json::from_str(text).map_err(|e| VgpuConfigError::syntax(&e))?;
        // The version first: a newer file's new fields should read as "newer
        // version", not as "unknown field".
        if let Some(version) = value.get("version")
            && let Some(n) = version.as_u64()
            && n != u64::from(CONFIG_VERSION)
        {
            return Err(VgpuConfigError::field(
                "version",
                format!("{n} is not supported (this library reads version {CONFIG_VERSION})"),
            ));
        }
        // Deserialize from the text, not the value: only the text still shows
        // duplicate fields.
        let config: VgpuConfig = match serde_json::from_str(text) {
            Ok(config) => config,
            Err(e) => return Err(locate(&value).unwrap_or_else(|| VgpuConfigError::syntax(&e))),
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks values serde cannot: the version, UUID form and uniqueness,
    /// limit ranges, the accounting directory, `memoryScaling`.
    pub fn validate(&self) -> Result<(), VgpuConfigError> {
        if self.version != CONFIG_VERSION {
            return Err(VgpuConfigError::field(
                "version",
                format!(
                    "{} is not supported (this library reads version {CONFIG_VERSION})",
                    self.version
                ),
            ));
        }
        if self.devices.len() > MAX_DEVICES {
            return Err(VgpuConfigError::field(
                "devices",
                format!("{} devices, at most {MAX_DEVICES}", self.devices.len()),
            ));
        }
        for (i, device) in self.devices.iter().enumerate() {
            check_uuid(&device.uuid)
                .map_err(|m| VgpuConfigError::field(format!("devices[{i}].uuid"), m))?;
            if let Some(j) = self.devices[..i]
                .iter()
                .position(|d| same_uuid(&d.uuid, &device.uuid))
            {
                return Err(VgpuConfigError::field(
                    format!("devices[{i}].uuid"),
                    format!("{:?} repeats devices[{j}]", device.uuid),
                ));
            }
            if device.memory_limit_mib.checked_mul(MIB).is_none() {
                return Err(VgpuConfigError::field(
                    format!("devices[{i}].memoryLimitMiB"),
                    format!(
                        "{} MiB does not fit in 64-bit bytes",
                        device.memory_limit_mib
                    ),
                ));
            }
            if device.sm_limit_percent > 100 {
                return Err(VgpuConfigError::field(
                    format!("devices[{i}].smLimitPercent"),
                    format!("{} is above 100", device.sm_limit_percent),
                ));
            }
        }
        check_accounting_dir(&self.accounting_dir)
            .map_err(|m| VgpuConfigError::field("accountingDir", m))?;
        let s = self.memory_scaling;
        if !s.is_finite() || s <= 0.0 || s > MAX_MEMORY_SCALING {
            return Err(VgpuConfigError::field(
                "memoryScaling",
                format!("{s} is outside (0, {MAX_MEMORY_SCALING}]"),
            ));
        }
        Ok(())
    }

    /// What this file means for the library: per-UUID limits, and no GPU
    /// memory for a device the file does not name.
    pub fn resolve(&self) -> ResolvedLimits {
        let per_device = self
            .devices
            .iter()
            .map(|d| DeviceLimit {
                uuid: Some(d.uuid.clone()),
                memory_limit_bytes: match d.memory_limit_mib {
                    0 => None,
                    mib => Some(mib.saturating_mul(MIB)),
                },
                sm_limit_percent: sm_limit(d.sm_limit_percent),
            })
            .collect();
        ResolvedLimits {
            source: LimitsSource::File,
            per_device,
            unlisted: DeviceLimit::denied(),
            accounting_path: self.accounting_dir.join(ACCOUNTING_FILE_NAME),
            oversubscribe: self.oversubscribe,
            memory_scaling: self.memory_scaling,
            log_level: self.log_level,
        }
    }
}

/// Finds the first field serde would refuse, to name it in the error.
fn locate(value: &Value) -> Option<VgpuConfigError> {
    let Some(object) = value.as_object() else {
        return Some(VgpuConfigError::field(
            "(top level)",
            format!("expected an object, found {}", kind_of(value)),
        ));
    };
    locate_in(object, "", &["version", "devices"], &TOP_FIELDS)
}

fn locate_devices(value: &Value) -> Option<VgpuConfigError> {
    let Some(devices) = value.as_array() else {
        return Some(VgpuConfigError::field(
            "devices",
            format!("expected an array, found {}", kind_of(value)),
        ));
    };
    devices.iter().enumerate().find_map(|(i, device)| {
        let Some(object) = device.as_object() else {
            return Some(VgpuConfigError::field(
                format!("devices[{i}]"),
                format!("expected an object, found {}", kind_of(device)),
            ));
        };
        locate_in(object, &format!("devices[{i}]."), &["uuid"], &DEVICE_FIELDS)
    })
}

/// The first problem of one object: a `required` field missing, else a field
/// its check refuses or one not in `fields`. Fields are named `<prefix><key>`.
fn locate_in(
    object: &serde_json::Map<String, Value>,
    prefix: &str,
    required: &[&str],
    fields: &[(&str, FieldCheck)],
) -> Option<VgpuConfigError> {
    if let Some(missing) = required.iter().find(|name| !object.contains_key(**name)) {
        return Some(VgpuConfigError::field(
            format!("{prefix}{missing}"),
            "missing",
        ));
    }
    object.iter().find_map(|(key, v)| {
        let field = format!("{prefix}{key}");
        match fields.iter().find(|(name, _)| name == key) {
            Some((_, check)) => check(&field, v),
            None => {
                let names: Vec<&str> = fields.iter().map(|(name, _)| *name).collect();
                Some(VgpuConfigError::field(
                    field,
                    format!("unknown field (expected one of {})", names.join(", ")),
                ))
            }
        }
    })
}

fn check_type<T: DeserializeOwned>(field: &str, value: &Value) -> Option<VgpuConfigError> {
    T::deserialize(value)
        .err()
        .map(|e| VgpuConfigError::field(field, e.to_string()))
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A UUID as NVML prints it: `GPU-` or `MIG-`, then letters, digits, `-`, and
/// (old-style MIG names, `MIG-GPU-<uuid>/<gi>/<ci>`) `/`.
fn check_uuid(uuid: &str) -> Result<(), String> {
    let Some(body) = uuid_body(uuid) else {
        return Err(format!("{uuid:?} does not start with GPU- or MIG-"));
    };
    if body.is_empty() {
        return Err(format!("{uuid:?} has nothing after the prefix"));
    }
    if uuid.len() > 80 {
        return Err(format!("{} characters, at most 80", uuid.len()));
    }
    if let Some(c) = body
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '/'))
    {
        return Err(format!("{uuid:?} contains {c:?}"));
    }
    Ok(())
}

/// The part of a UUID after `GPU-`/`MIG-` (any case), or `None` without a prefix.
fn uuid_body(uuid: &str) -> Option<&str> {
    let prefix = uuid.get(..4)?;
    (prefix.eq_ignore_ascii_case("GPU-") || prefix.eq_ignore_ascii_case("MIG-")).then(|| &uuid[4..])
}

/// Whether two UUIDs name the same device: the part after the prefix, any case.
///
/// The prefix is ignored because the CUDA driver reports a device UUID as 16
/// bytes and the caller chooses the prefix when printing it; the bytes of a
/// MIG device and of a GPU never coincide.
fn same_uuid(a: &str, b: &str) -> bool {
    let a = uuid_body(a).unwrap_or(a);
    let b = uuid_body(b).unwrap_or(b);
    !a.is_empty() && a.eq_ignore_ascii_case(b)
}

fn check_accounting_dir(dir: &std::path::Path) -> Result<(), String> {
    let text = dir.to_string_lossy();
    if !dir.is_absolute() {
        return Err(format!("{text:?} is not an absolute path"));
    }
    if text.contains('\0') {
        return Err(format!("{text:?} contains a NUL byte"));
    }
    if dir
        .components()
        .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(format!("{text:?} contains \"..\""));
    }
    Ok(())
}

fn sm_limit(percent: u32) -> Option<u32> {
    match percent {
        0 | 100.. => None,
        p => Some(p),
    }
}

// ---------------------------------------------------------------------------
// The HAMi-core environment
// ---------------------------------------------------------------------------

/// The HAMi-core environment, read where the limits file is absent.
///
/// Value rules (HAMi-core's, made strict; see `docs/vgpu.md`):
/// - memory: decimal digits with an optional `k`, `m` or `g` suffix (any
///   case; powers of 1024); a plain number is **bytes**, as in HAMi-core.
///   HAMi-core also reads hex (`0x…`) and octal (leading `0`) through
///   `strtoul(…, 0)` and ignores trailing junk; those are refused here.
///   `0` or empty means "not set";
/// - SM share: decimal percent 0–100; 0 (or unset) and 100 mean no SM limit;
/// - a per-device `_<i>` value of 0 falls back to the value without suffix,
///   as in HAMi-core; `<i>` is the CUDA device ordinal the process sees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvLimits {
    /// Whether any of the HAMi-core names was set at all.
    pub present: bool,
    /// `CUDA_DEVICE_MEMORY_LIMIT`, bytes; `None` when unset or 0.
    pub memory_limit_bytes: Option<u64>,
    /// `CUDA_DEVICE_MEMORY_LIMIT_<i>`, bytes, by device ordinal (non-zero only).
    pub device_memory_limit_bytes: BTreeMap<usize, u64>,
    /// `CUDA_DEVICE_SM_LIMIT`, percent; `None` when unset or 0.
    pub sm_limit_percent: Option<u32>,
    /// `CUDA_DEVICE_SM_LIMIT_<i>`, percent, by device ordinal (non-zero only).
    pub device_sm_limit_percent: BTreeMap<usize, u32>,
    /// `CUDA_DEVICE_MEMORY_SHARED_CACHE`: the accounting file (absolute).
    pub shared_cache: Option<PathBuf>,
    /// `CUDA_OVERSUBSCRIBE`.
    pub oversubscribe: bool,
    /// `LIBCUDA_LOG_LEVEL`.
    pub log_level: LogLevel,
    /// Values that were ignored, one line each (for the library to log).
    pub warnings: Vec<String>,
}

/// A HAMi-core variable whose value cannot be a limit; one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?}: {message}")]
pub struct EnvLimitsError {
    /// The variable.
    pub var: String,
    /// Its value (shortened to 64 characters).
    pub value: String,
    /// What is wrong.
    pub message: String,
}

impl EnvLimitsError {
    fn new(var: &str, value: &str, message: impl Into<String>) -> Self {
        EnvLimitsError {
            var: var.to_string(),
            value: value.chars().take(64).collect(),
            message: message.into(),
        }
    }
}

impl EnvLimits {
    /// Reads the HAMi-core names from `(name, value)` pairs (the process
    /// environment, typically); other names are ignored.
    ///
    /// A memory or SM value that is not a valid limit is an error (a limit was
    /// meant and cannot be known); a bad log level, oversubscribe flag or
    /// cache path is a warning and falls back to its default.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<EnvLimits, EnvLimitsError> {
        use env_names::*;
        let mut limits = EnvLimits::default();
        for (name, value) in vars {
            let name = name.as_str();
            if limits.set_limit(
                (name, &value),
                (MEMORY_LIMIT, MEMORY_LIMIT_PREFIX),
                parse_memory_size,
                |l| (&mut l.memory_limit_bytes, &mut l.device_memory_limit_bytes),
            )? || limits.set_limit(
                (name, &value),
                (SM_LIMIT, SM_LIMIT_PREFIX),
                parse_percent,
                |l| (&mut l.sm_limit_percent, &mut l.device_sm_limit_percent),
            )? {
                continue;
            }
            if name == SHARED_CACHE {
                limits.present = true;
                let path = PathBuf::from(value.trim());
                if value.trim().is_empty() {
                    limits.shared_cache = None;
                } else if !path.is_absolute() || value.contains('\0') {
                    limits.warnings.push(format!(
                        "{name}={value:?} is not an absolute path; using {DEFAULT_ACCOUNTING_DIR}/{ACCOUNTING_FILE_NAME}"
                    ));
                    limits.shared_cache = None;
                } else {
                    limits.shared_cache = Some(path);
                }
            } else if name == OVERSUBSCRIBE {
                limits.present = true;
                limits.oversubscribe = match value.trim().to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" | "on" => true,
                    "false" | "0" | "no" | "off" | "" => false,
                    _ => {
                        limits.warnings.push(format!(
                            "{name}={value:?} is not true/false; oversubscription stays off"
                        ));
                        false
                    }
                };
            } else if name == LOG_LEVEL {
                match LogLevel::from_env_value(&value) {
                    Some(level) => limits.log_level = level,
                    None => {
                        limits.log_level = LogLevel::default();
                        limits.warnings.push(format!(
                            "{name}={value:?} is not a log level (0-4, error, warn, info, debug); using warn"
                        ));
                    }
                }
            }
        }
        Ok(limits)
    }

    /// What these variables mean for the library: limits by device ordinal,
    /// the unsuffixed values for any other device.
    pub fn resolve(&self) -> ResolvedLimits {
        let highest = self
            .device_memory_limit_bytes
            .keys()
            .chain(self.device_sm_limit_percent.keys())
            .max()
            .copied();
        let per_device = match highest {
            None => Vec::new(),
            Some(highest) => (0..=highest)
                .map(|i| DeviceLimit {
                    uuid: None,
                    memory_limit_bytes: self
                        .device_memory_limit_bytes
                        .get(&i)
                        .copied()
                        .or(self.memory_limit_bytes),
                    sm_limit_percent: sm_limit(
                        self.device_sm_limit_percent
                            .get(&i)
                            .copied()
                            .or(self.sm_limit_percent)
                            .unwrap_or(0),
                    ),
                })
                .collect(),
        };
        ResolvedLimits {
            source: if self.present {
                LimitsSource::Env
            } else {
                LimitsSource::Unlimited
            },
            per_device,
            unlisted: DeviceLimit {
                uuid: None,
                memory_limit_bytes: self.memory_limit_bytes,
                sm_limit_percent: sm_limit(self.sm_limit_percent.unwrap_or(0)),
            },
            accounting_path: self
                .shared_cache
                .clone()
                .unwrap_or_else(default_accounting_path),
            oversubscribe: self.oversubscribe,
            memory_scaling: 1.0,
            log_level: self.log_level,
        }
    }
}

/// A limit's fields in [`EnvLimits`]: for every device, and by device ordinal.
type LimitFields<'a, T> = (&'a mut Option<T>, &'a mut BTreeMap<usize, T>);

impl EnvLimits {
    /// Reads a limit set for every device (`bare`) or for one (`<prefix><i>`)
    /// into the fields `fields` picks; 0 clears it. False when `name` is
    /// neither, so the caller tries the other variables.
    fn set_limit<T: Default + PartialEq>(
        &mut self,
        (name, value): (&str, &str),
        (bare, prefix): (&str, &str),
        parse: fn(&str) -> Result<T, String>,
        fields: fn(&mut EnvLimits) -> LimitFields<'_, T>,
    ) -> Result<bool, EnvLimitsError> {
        let device = if name == bare {
            None
        } else if let Some(index) = name.strip_prefix(prefix) {
            self.present = true;
            match env_index(name, index, value, &mut self.warnings)? {
                Some(index) => Some(index),
                None => return Ok(true),
            }
        } else {
            return Ok(false);
        };
        self.present = true;
        let limit = parse(value).map_err(|m| EnvLimitsError::new(name, value, m))?;
        let (every_device, by_device) = fields(self);
        match device {
            None => *every_device = nonzero(limit),
            Some(index) if limit == T::default() => {
                by_device.remove(&index);
            }
            Some(index) => {
                by_device.insert(index, limit);
            }
        }
        Ok(true)
    }
}

fn nonzero<T: Default + PartialEq>(v: T) -> Option<T> {
    (v != T::default()).then_some(v)
}

/// The `<i>` of `…_<i>`: `Ok(None)` (with a warning) when it is not a number,
/// an error when it names a device beyond [`MAX_DEVICES`].
fn env_index(
    name: &str,
    index: &str,
    value: &str,
    warnings: &mut Vec<String>,
) -> Result<Option<usize>, EnvLimitsError> {
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        warnings.push(format!("{name} is not <name>_<device index>; ignored"));
        return Ok(None);
    }
    match index.parse::<usize>() {
        Ok(i) if i < MAX_DEVICES => Ok(Some(i)),
        _ => Err(EnvLimitsError::new(
            name,
            value,
            format!("device index {index} is beyond the {MAX_DEVICES} devices supported"),
        )),
    }
}

/// Parses a HAMi-core memory size: decimal digits, optional `k`/`m`/`g`
/// suffix (any case, powers of 1024); a plain number is bytes; empty is 0.
pub fn parse_memory_size(value: &str) -> Result<u64, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(0);
    }
    let (digits, unit) = match value.as_bytes()[value.len() - 1] {
        b'k' | b'K' => (&value[..value.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&value[..value.len() - 1], 1 << 20),
        b'g' | b'G' => (&value[..value.len() - 1], 1 << 30),
        _ => (value, 1),
    };
    let number = parse_decimal(digits)?;
    number
        .checked_mul(unit)
        .ok_or_else(|| "does not fit in 64-bit bytes".to_string())
}

/// Parses an SM share: decimal percent, 0–100; empty is 0.
pub fn parse_percent(value: &str) -> Result<u32, String> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(0);
    }
    let n = parse_decimal(value)?;
    if n > 100 {
        return Err(format!("{n} is above 100"));
    }
    Ok(n as u32)
}

fn parse_decimal(digits: &str) -> Result<u64, String> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("expected decimal digits with an optional k, m or g suffix".to_string());
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Err("a leading zero is ambiguous (HAMi-core reads it as octal)".to_string());
    }
    digits
        .parse::<u64>()
        .map_err(|_| "does not fit in 64 bits".to_string())
}

fn default_accounting_path() -> PathBuf {
    PathBuf::from(DEFAULT_ACCOUNTING_DIR).join(ACCOUNTING_FILE_NAME)
}

// ---------------------------------------------------------------------------
// Resolved limits
// ---------------------------------------------------------------------------

/// The limits of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceLimit {
    /// The device's UUID where the limits are keyed by UUID (the limits file);
    /// `None` where they are keyed by device ordinal (the environment).
    pub uuid: Option<String>,
    /// Memory limit in bytes; `None`: no limit; `Some(0)`: no GPU memory at all.
    pub memory_limit_bytes: Option<u64>,
    /// SM share in percent, 1–99; `None`: no SM limit.
    pub sm_limit_percent: Option<u32>,
}

impl DeviceLimit {
    /// No limit of any kind.
    pub fn unlimited() -> DeviceLimit {
        DeviceLimit {
            uuid: None,
            memory_limit_bytes: None,
            sm_limit_percent: None,
        }
    }

    /// No GPU memory at all: every allocation is refused.
    pub fn denied() -> DeviceLimit {
        DeviceLimit {
            uuid: None,
            memory_limit_bytes: Some(0),
            sm_limit_percent: None,
        }
    }

    /// Whether neither memory nor SMs are limited.
    pub fn is_unlimited(&self) -> bool {
        self.memory_limit_bytes.is_none() && self.sm_limit_percent.is_none()
    }
}

/// Where resolved limits came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitsSource {
    /// The limits file (the container's, or the test override).
    File,
    /// The HAMi-core environment.
    Env,
    /// Neither the file nor any HAMi-core name: nothing is limited.
    Unlimited,
    /// The limits could not be read; no GPU memory is granted.
    FailClosed {
        /// The one-line reason, for the log.
        reason: String,
    },
}

/// The limits the interception library enforces, whatever their source.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedLimits {
    /// Where they came from.
    pub source: LimitsSource,
    /// Per-device limits: keyed by `uuid` (from the file) or, where `uuid` is
    /// `None`, by position = device ordinal (from the environment).
    pub per_device: Vec<DeviceLimit>,
    /// The limit of a device `per_device` does not cover: from the file, no
    /// memory (the file names every device the container was granted); from
    /// the environment, the unsuffixed `CUDA_DEVICE_*_LIMIT` values.
    pub unlisted: DeviceLimit,
    /// The shared accounting file.
    pub accounting_path: PathBuf,
    /// Whether allocations may fall back to host-backed managed memory.
    pub oversubscribe: bool,
    /// The node's memory oversubscription factor (1 without one).
    pub memory_scaling: f64,
    /// How much the library logs.
    pub log_level: LogLevel,
}

impl ResolvedLimits {
    /// No limits: neither the file nor any HAMi-core name is present.
    pub fn unlimited() -> ResolvedLimits {
        ResolvedLimits {
            source: LimitsSource::Unlimited,
            per_device: Vec::new(),
            unlisted: DeviceLimit::unlimited(),
            accounting_path: default_accounting_path(),
            oversubscribe: false,
            memory_scaling: 1.0,
            log_level: LogLevel::default(),
        }
    }

    /// The limits to enforce when the authoritative limits could not be read:
    /// every device gets no GPU memory, so a broken file never means "no limit".
    pub fn fail_closed(reason: impl Into<String>) -> ResolvedLimits {
        ResolvedLimits {
            source: LimitsSource::FailClosed {
                reason: reason.into(),
            },
            per_device: Vec::new(),
            unlisted: DeviceLimit::denied(),
            accounting_path: default_accounting_path(),
            oversubscribe: false,
            memory_scaling: 1.0,
            log_level: LogLevel::default(),
        }
    }

    /// The limit of the device with CUDA ordinal `ordinal` and UUID `uuid`
    /// (`GPU-…`/`MIG-…`, any case; `""` when unknown).
    ///
    /// A UUID match wins (the file is keyed by UUID, so a reordered
    /// `CUDA_VISIBLE_DEVICES` cannot swap limits); then an entry keyed by
    /// ordinal (the environment); then [`ResolvedLimits::unlisted`]. Allocates
    /// a copy of the UUID: resolve once per device, not per allocation.
    pub fn limit_for(&self, ordinal: usize, uuid: &str) -> DeviceLimit {
        if !uuid.is_empty()
            && let Some(limit) = self
                .per_device
                .iter()
                .find(|d| d.uuid.as_deref().is_some_and(|u| same_uuid(u, uuid)))
        {
            return limit.clone();
        }
        if let Some(limit) = self.per_device.get(ordinal)
            && limit.uuid.is_none()
        {
            return limit.clone();
        }
        self.unlisted.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID_A: &str = "GPU-5a4b3c2d-1e0f-4a5b-8c7d-6e5f4a3b2c1d";
    const UUID_B: &str = "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
    const MIG_C: &str = "MIG-11111111-2222-3333-4444-555555555555";

    fn file(devices: &str) -> String {
        format!(r#"{{"version": 1, "devices": [{devices}]}}"#)
    }

    fn parse_err(text: &str) -> String {
        VgpuConfig::parse(text)
            .expect_err("should be refused")
            .to_string()
    }

    fn env(pairs: &[(&str, &str)]) -> Result<EnvLimits, EnvLimitsError> {
        EnvLimits::from_vars(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn full_file_parses_with_every_field() {
        let text = format!(
            r#"{{"version": 1,
                "devices": [{{"uuid": "{UUID_A}", "memoryLimitMiB": 4096, "smLimitPercent": 30}},
                            {{"uuid": "{MIG_C}"}}],
                "accountingDir": "/var/run/tessera",
                "oversubscribe": true,
                "memoryScaling": 1.5,
                "logLevel": "debug"}}"#
        );
        let config = VgpuConfig::parse(&text).expect("valid file");
        assert_eq!(config.devices.len(), 2);
        assert_eq!(config.devices[0].memory_limit_mib, 4096);
        assert_eq!(
            config.devices[1].memory_limit_mib, 0,
            "memory limit defaults to none"
        );
        assert!(config.oversubscribe);
        assert_eq!(config.memory_scaling, 1.5);
        assert_eq!(config.log_level, LogLevel::Debug);
    }

    #[test]
    fn minimal_file_takes_the_defaults() {
        let config =
            VgpuConfig::parse(&file(&format!(r#"{{"uuid": "{UUID_A}"}}"#))).expect("valid");
        assert_eq!(config.accounting_dir, PathBuf::from(DEFAULT_ACCOUNTING_DIR));
        assert!(!config.oversubscribe);
        assert_eq!(config.memory_scaling, 1.0);
        assert_eq!(config.log_level, LogLevel::Warn);
    }

    #[test]
    fn sm_limit_above_100_names_the_device_and_field() {
        let text = file(&format!(
            r#"{{"uuid": "{UUID_A}"}}, {{"uuid": "{UUID_B}", "smLimitPercent": 140}}"#
        ));
        assert_eq!(
            parse_err(&text),
            "devices[1].smLimitPercent: 140 is above 100"
        );
    }

    #[test]
    fn unknown_fields_are_named_at_both_levels() {
        let text = r#"{"version": 1, "devices": [], "memoryLimit": 3}"#;
        assert!(
            parse_err(text).starts_with("memoryLimit: unknown field"),
            "{}",
            parse_err(text)
        );
        let text = file(&format!(r#"{{"uuid": "{UUID_A}", "memoryLimitMib": 3}}"#));
        assert!(
            parse_err(&text).starts_with("devices[0].memoryLimitMib: unknown field"),
            "{}",
            parse_err(&text)
        );
    }

    #[test]
    fn wrong_types_are_named() {
        let text = file(&format!(
            r#"{{"uuid": "{UUID_A}", "memoryLimitMiB": "4g"}}"#
        ));
        assert!(
            parse_err(&text).starts_with("devices[0].memoryLimitMiB: invalid type"),
            "{}",
            parse_err(&text)
        );
        let text = file(&format!(r#"{{"uuid": "{UUID_A}", "memoryLimitMiB": -1}}"#));
        assert!(
            parse_err(&text).starts_with("devices[0].memoryLimitMiB:"),
            "{}",
            parse_err(&text)
        );
        assert_eq!(
            parse_err(r#"{"version": 1, "devices": [], "logLevel": "loud"}"#)
                .split(':')
                .next(),
            Some("logLevel")
        );
        assert_eq!(
            parse_err("[]"),
            "(top level): expected an object, found an array"
        );
        assert_eq!(parse_err(r#"{"devices": []}"#), "version: missing");
        assert_eq!(parse_err(r#"{"version": 1}"#), "devices: missing");
        assert_eq!(
            parse_err(&file("3")),
            "devices[0]: expected an object, found a number"
        );
    }

    #[test]
    fn duplicate_fields_are_refused_with_a_position() {
        let text = file(&format!(
            r#"{{"uuid": "{UUID_A}", "memoryLimitMiB": 10, "memoryLimitMiB": 0}}"#
        ));
        let err = parse_err(&text);
        assert!(err.contains("duplicate field"), "{err}");
        assert!(err.starts_with("line 1 column"), "{err}");
    }

    #[test]
    fn syntax_errors_give_line_and_column() {
        let err = parse_err("{\"version\": 1,\n \"devices\": [,]}");
        assert!(err.starts_with("line 2 column"), "{err}");
        assert!(!err.contains(" at line "), "position said once: {err}");
    }

    #[test]
    fn newer_version_is_reported_as_such_even_with_new_fields() {
        let err = parse_err(r#"{"version": 2, "devices": [], "somethingNew": true}"#);
        assert_eq!(
            err,
            "version: 2 is not supported (this library reads version 1)"
        );
    }

    #[test]
    fn uuids_need_a_prefix_and_must_not_repeat() {
        assert_eq!(
            parse_err(&file(r#"{"uuid": "5a4b3c2d"}"#)),
            "devices[0].uuid: \"5a4b3c2d\" does not start with GPU- or MIG-"
        );
        assert_eq!(
            parse_err(&file(r#"{"uuid": "GPU-"}"#)),
            "devices[0].uuid: \"GPU-\" has nothing after the prefix"
        );
        let upper = UUID_A.to_ascii_uppercase();
        let text = file(&format!(r#"{{"uuid": "{UUID_A}"}}, {{"uuid": "{upper}"}}"#));
        assert!(
            parse_err(&text).starts_with("devices[1].uuid:"),
            "{}",
            parse_err(&text)
        );
        assert!(parse_err(&text).ends_with("repeats devices[0]"));
        assert!(parse_err(&file(r#"{"uuid": "GPU-a b"}"#)).contains("contains ' '"));
    }

    #[test]
    fn more_than_sixteen_devices_are_refused() {
        let devices: Vec<String> = (0..17)
            .map(|i| format!(r#"{{"uuid": "GPU-{i:08x}"}}"#))
            .collect();
        assert_eq!(
            parse_err(&file(&devices.join(","))),
            "devices: 17 devices, at most 16"
        );
    }

    #[test]
    fn memory_limit_that_overflows_bytes_is_refused() {
        let text = file(&format!(
            r#"{{"uuid": "{UUID_A}", "memoryLimitMiB": {}}}"#,
            u64::MAX / MIB + 1
        ));
        assert!(parse_err(&text).starts_with("devices[0].memoryLimitMiB:"));
    }

    #[test]
    fn accounting_dir_and_scaling_are_checked() {
        assert_eq!(
            parse_err(r#"{"version": 1, "devices": [], "accountingDir": "run/tessera"}"#),
            "accountingDir: \"run/tessera\" is not an absolute path"
        );
        assert!(
            parse_err(r#"{"version": 1, "devices": [], "accountingDir": "/var/../etc"}"#)
                .starts_with("accountingDir:")
        );
        for bad in ["0", "-1", "64.5", "1e-400"] {
            let text = format!(r#"{{"version": 1, "devices": [], "memoryScaling": {bad}}}"#);
            assert!(
                parse_err(&text).starts_with("memoryScaling"),
                "{bad}: {}",
                parse_err(&text)
            );
        }
    }

    #[test]
    fn file_limits_resolve_by_uuid_whatever_the_ordinal() {
        let text = file(&format!(
            r#"{{"uuid": "{UUID_A}", "memoryLimitMiB": 1024, "smLimitPercent": 30}},
               {{"uuid": "{UUID_B}", "memoryLimitMiB": 0, "smLimitPercent": 100}}"#
        ));
        let limits = VgpuConfig::parse(&text).expect("valid").resolve();
        assert_eq!(limits.source, LimitsSource::File);
        // CUDA_VISIBLE_DEVICES=1,0: ordinal 0 is B, ordinal 1 is A.
        let a = limits.limit_for(1, UUID_A);
        assert_eq!(a.memory_limit_bytes, Some(1024 * MIB));
        assert_eq!(a.sm_limit_percent, Some(30));
        let b = limits.limit_for(0, UUID_B);
        assert!(b.is_unlimited(), "0 MiB and 100 % mean no limit: {b:?}");
        // Case and the prefix do not matter.
        assert_eq!(limits.limit_for(7, &UUID_A.to_ascii_lowercase()), a);
        assert_eq!(limits.limit_for(7, &UUID_A.replace("GPU-", "MIG-")), a);
        // A device the file does not name gets no memory, even at a listed ordinal.
        assert_eq!(limits.limit_for(0, MIG_C), DeviceLimit::denied());
        assert_eq!(limits.limit_for(0, ""), DeviceLimit::denied());
        assert_eq!(
            limits.accounting_path,
            PathBuf::from("/var/run/tessera/vgpu.accounting")
        );
    }

    #[test]
    fn hami_memory_sizes() {
        assert_eq!(parse_memory_size("1024"), Ok(1024), "plain number is bytes");
        assert_eq!(parse_memory_size("4k"), Ok(4 << 10));
        assert_eq!(parse_memory_size("4K"), Ok(4 << 10));
        assert_eq!(parse_memory_size("12000m"), Ok(12000 << 20));
        assert_eq!(parse_memory_size("2G"), Ok(2 << 30));
        assert_eq!(parse_memory_size(" 2g\n"), Ok(2 << 30));
        assert_eq!(parse_memory_size("0"), Ok(0));
        assert_eq!(parse_memory_size("0m"), Ok(0));
        assert_eq!(parse_memory_size(""), Ok(0));
        for bad in [
            "0x10",
            "010m",
            "1.5g",
            "g",
            "-1",
            "4 g",
            "4gb",
            "4GiB",
            "18446744073709551616",
        ] {
            assert!(parse_memory_size(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(
            parse_memory_size("17179869184g").is_err(),
            "overflow after scaling"
        );
    }

    #[test]
    fn env_limits_follow_hami_fallbacks() {
        let limits = env(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "12000m"),
            ("CUDA_DEVICE_MEMORY_LIMIT_2", "0"),
            ("CUDA_DEVICE_SM_LIMIT", "40"),
            ("CUDA_DEVICE_SM_LIMIT_2", "100"),
            ("PATH", "/usr/bin"),
        ])
        .expect("valid env");
        assert!(limits.present);
        let r = limits.resolve();
        assert_eq!(r.source, LimitsSource::Env);
        let uuid = "GPU-whatever";
        assert_eq!(r.limit_for(0, uuid).memory_limit_bytes, Some(2 << 30));
        assert_eq!(r.limit_for(1, uuid).memory_limit_bytes, Some(12000 << 20));
        assert_eq!(
            r.limit_for(2, uuid).memory_limit_bytes,
            Some(2 << 30),
            "_2=0 falls back to the unsuffixed value"
        );
        assert_eq!(r.limit_for(0, uuid).sm_limit_percent, Some(40));
        assert_eq!(
            r.limit_for(2, uuid).sm_limit_percent,
            None,
            "100 % is no limit"
        );
        assert_eq!(r.limit_for(9, uuid).memory_limit_bytes, Some(2 << 30));
    }

    #[test]
    fn empty_env_means_no_limits() {
        let limits = env(&[("HOME", "/root")]).expect("valid");
        assert!(!limits.present);
        let r = limits.resolve();
        assert_eq!(r.source, LimitsSource::Unlimited);
        assert!(r.limit_for(0, UUID_A).is_unlimited());
        assert_eq!(
            r.accounting_path,
            PathBuf::from("/var/run/tessera/vgpu.accounting")
        );
    }

    #[test]
    fn bad_limit_values_are_errors_naming_the_variable() {
        let err = env(&[("CUDA_DEVICE_MEMORY_LIMIT_0", "lots")]).expect_err("refused");
        assert!(
            err.to_string()
                .starts_with("CUDA_DEVICE_MEMORY_LIMIT_0=\"lots\": "),
            "{err}"
        );
        let err = env(&[("CUDA_DEVICE_SM_LIMIT", "140")]).expect_err("refused");
        assert_eq!(
            err.to_string(),
            "CUDA_DEVICE_SM_LIMIT=\"140\": 140 is above 100"
        );
        let err = env(&[("CUDA_DEVICE_MEMORY_LIMIT_16", "1g")]).expect_err("refused");
        assert!(err.message.contains("beyond"), "{err}");
    }

    #[test]
    fn cosmetic_values_warn_and_default() {
        let limits = env(&[
            ("LIBCUDA_LOG_LEVEL", "loud"),
            ("CUDA_OVERSUBSCRIBE", "perhaps"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "relative/cache"),
            ("CUDA_DEVICE_MEMORY_LIMIT_X", "1g"),
        ])
        .expect("warnings only");
        assert_eq!(limits.warnings.len(), 4, "{:?}", limits.warnings);
        assert_eq!(limits.log_level, LogLevel::Warn);
        assert!(!limits.oversubscribe);
        assert_eq!(limits.shared_cache, None);
    }

    #[test]
    fn oversubscribe_cache_and_log_level_from_env() {
        let limits = env(&[
            ("CUDA_OVERSUBSCRIBE", "true"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/abc.cache"),
            ("LIBCUDA_LOG_LEVEL", "4"),
        ])
        .expect("valid");
        let r = limits.resolve();
        assert!(r.oversubscribe);
        assert_eq!(r.accounting_path, PathBuf::from("/tmp/vgpu/abc.cache"));
        assert_eq!(r.log_level, LogLevel::Debug);
        assert_eq!(
            env(&[("CUDA_OVERSUBSCRIBE", "1")]).map(|l| l.oversubscribe),
            Ok(true)
        );
    }

    #[test]
    fn hami_log_levels() {
        for (value, level) in [
            ("0", LogLevel::Error),
            ("1", LogLevel::Error),
            ("-3", LogLevel::Error),
            ("2", LogLevel::Warn),
            ("3", LogLevel::Info),
            ("4", LogLevel::Debug),
            ("8", LogLevel::Debug),
            ("WARNING", LogLevel::Warn),
            ("info", LogLevel::Info),
        ] {
            assert_eq!(LogLevel::from_env_value(value), Some(level), "{value}");
        }
        assert_eq!(LogLevel::from_env_value("verbose"), None);
    }

    #[test]
    fn fail_closed_denies_every_device() {
        let r = ResolvedLimits::fail_closed("vgpu.json: broken");
        assert_eq!(r.limit_for(0, UUID_A), DeviceLimit::denied());
        assert!(matches!(r.source, LimitsSource::FailClosed { .. }));
    }

    #[test]
    fn serialized_file_parses_back() {
        let config = VgpuConfig {
            version: CONFIG_VERSION,
            devices: vec![DeviceConfig {
                uuid: UUID_A.to_string(),
                memory_limit_mib: 8000,
                sm_limit_percent: 25,
            }],
            accounting_dir: PathBuf::from(DEFAULT_ACCOUNTING_DIR),
            oversubscribe: false,
            memory_scaling: 2.0,
            log_level: LogLevel::Info,
        };
        let text = serde_json::to_string(&config).expect("serializes");
        assert!(text.contains("\"memoryLimitMiB\":8000"), "{text}");
        assert_eq!(VgpuConfig::parse(&text), Ok(config));
    }
}
