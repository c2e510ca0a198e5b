//! The CDI annotation form: a pod or container annotation
//! `cdi.k8s.io/<plugin>_<device-id>` whose value lists qualified device names,
//! comma-separated. Runtimes with CDI support read it from any kubelet, so it is
//! Tessera's fallback where kubelet does not pass `cdi_devices`.
//!
//! Key rules follow the reference library's `AnnotationKey`: plugin and device id
//! are non-empty, a `/` in the device id becomes `_`, and the part after the
//! prefix is at most 63 characters, starts and ends with an ASCII letter or
//! digit, and has only letters, digits, `-`, `_` and `.` inside.
//!
//! Tessera's key is `cdi.k8s.io/tessera_<alloc-id>` ([`tessera_annotation`]).
//! An alloc id (`<pod-uid>-<container-index>`, 38+ characters) fits, but
//! [`annotation_key_shortened`] makes any id fit, deterministically, so the key
//! is always valid.

use std::fmt::Write as _;

use super::name::{NameError, QualifiedName};
use crate::contract::cdi::ALLOC_KIND;

use crate::contract::cdi::{
    ANNOTATION_PLUGIN as TESSERA_PLUGIN, ANNOTATION_PREFIX, MAX_ANNOTATION_NAME_LEN,
};

/// Length of the hash suffix [`annotation_key_shortened`] appends (hex digits).
const HASH_LEN: usize = 16;

/// Why an annotation key or value could not be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// The plugin name is empty.
    #[error("CDI annotation: the plugin name is empty")]
    EmptyPlugin,
    /// The device id is empty.
    #[error("CDI annotation: the device id is empty")]
    EmptyDeviceId,
    /// `<plugin>_<device-id>` is longer than 63 characters.
    #[error("CDI annotation key {name:?}: {len} characters after \"cdi.k8s.io/\", more than 63")]
    TooLong {
        /// The part after the prefix.
        name: String,
        /// Its length in bytes.
        len: usize,
    },
    /// `<plugin>_<device-id>` does not start with a letter or digit.
    #[error("CDI annotation key {name:?}: must start with a letter or digit, not {found:?}")]
    BadStart {
        /// The part after the prefix.
        name: String,
        /// The first character.
        found: char,
    },
    /// `<plugin>_<device-id>` does not end with a letter or digit.
    #[error("CDI annotation key {name:?}: must end with a letter or digit, not {found:?}")]
    BadEnd {
        /// The part after the prefix.
        name: String,
        /// The last character.
        found: char,
    },
    /// `<plugin>_<device-id>` has a character other than letters, digits, `-`, `_`, `.`.
    #[error(
        "CDI annotation key {name:?}: character {found:?} is not allowed; use letters, digits and '-', '_', '.'"
    )]
    BadCharacter {
        /// The part after the prefix.
        name: String,
        /// The first offending character.
        found: char,
    },
    /// The plugin name leaves no room for a shortened device id, or is itself invalid.
    #[error(
        "CDI annotation plugin {plugin:?}: must be 1 to {max} letters, digits, '-', '_', '.', starting with a letter or digit"
    )]
    BadPlugin {
        /// The rejected plugin name.
        plugin: String,
        /// The longest plugin name that still leaves room for a hash.
        max: usize,
    },
    /// An annotation value must name at least one device.
    #[error("CDI annotation value: no devices")]
    NoDevices,
    /// A device listed under a key is not a qualified name.
    #[error("CDI annotation {key:?}: {reason}")]
    BadDevice {
        /// The annotation key.
        key: String,
        /// Why the device was rejected.
        reason: NameError,
    },
    /// A device in a bare value is not a qualified name.
    #[error("CDI annotation value: {reason}")]
    BadValue {
        /// Why the device was rejected.
        reason: NameError,
    },
}

/// Builds `cdi.k8s.io/<plugin>_<device-id>` exactly as the reference library
/// does, or says which rule the result would break.
pub fn annotation_key(plugin: &str, device_id: &str) -> Result<String, AnnotationError> {
    if plugin.is_empty() {
        return Err(AnnotationError::EmptyPlugin);
    }
    if device_id.is_empty() {
        return Err(AnnotationError::EmptyDeviceId);
    }
    let name = format!("{plugin}_{}", device_id.replace('/', "_"));
    check_name(&name)?;
    Ok(format!("{ANNOTATION_PREFIX}{name}"))
}

fn check_name(name: &str) -> Result<(), AnnotationError> {
    if name.len() > MAX_ANNOTATION_NAME_LEN {
        return Err(AnnotationError::TooLong {
            name: name.to_owned(),
            len: name.len(),
        });
    }
    let mut chars = name.chars();
    let (Some(first), last) = (chars.next(), chars.next_back()) else {
        return Err(AnnotationError::EmptyPlugin);
    };
    if !first.is_ascii_alphanumeric() {
        return Err(AnnotationError::BadStart {
            name: name.to_owned(),
            found: first,
        });
    }
    if let Some(found) = chars.find(|c| !is_inside(*c)) {
        return Err(AnnotationError::BadCharacter {
            name: name.to_owned(),
            found,
        });
    }
    match last {
        Some(found) if !found.is_ascii_alphanumeric() => Err(AnnotationError::BadEnd {
            name: name.to_owned(),
            found,
        }),
        _ => Ok(()),
    }
}

fn is_inside(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

/// Like [`annotation_key`], but when `<plugin>_<device-id>` would break a rule
/// (too long, or characters not allowed) the device-id part is replaced
/// deterministically by a valid one:
///
/// 1. each character of the id other than a letter, digit, `-`, `_`, `.` becomes
///    `-` (a `/` becomes `_`, as in [`annotation_key`]);
/// 2. the result is cut to leave room for `-` and 16 hex digits, and trailing
///    characters that are not letters or digits are dropped;
/// 3. `-` and the 64-bit FNV-1a hash of the **original** id, as 16 lowercase hex
///    digits, are appended (just the hash when nothing is left of the id).
///
/// Two different ids thus get different keys (up to a hash collision), and the
/// same id always gets the same key. The plugin itself must be valid and at most
/// 63 − 1 − 16 = 46 characters long.
pub fn annotation_key_shortened(plugin: &str, device_id: &str) -> Result<String, AnnotationError> {
    let max_plugin = MAX_ANNOTATION_NAME_LEN - 1 - HASH_LEN;
    let plugin_ok = !plugin.is_empty()
        && plugin.len() <= max_plugin
        && plugin.starts_with(|c: char| c.is_ascii_alphanumeric())
        && plugin.chars().all(is_inside);
    if !plugin_ok {
        return Err(AnnotationError::BadPlugin {
            plugin: plugin.to_owned(),
            max: max_plugin,
        });
    }
    if device_id.is_empty() {
        return Err(AnnotationError::EmptyDeviceId);
    }
    if let Ok(key) = annotation_key(plugin, device_id) {
        return Ok(key);
    }
    let budget = MAX_ANNOTATION_NAME_LEN - plugin.len() - 1;
    let keep = budget.saturating_sub(HASH_LEN + 1);
    let mut prefix: String = device_id
        .chars()
        .map(|c| match c {
            '/' => '_',
            c if is_inside(c) => c,
            _ => '-',
        })
        .take(keep)
        .collect();
    while prefix.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        prefix.pop();
    }
    let mut name = format!("{plugin}_{prefix}");
    if !prefix.is_empty() {
        name.push('-');
    }
    // Writing to a String cannot fail.
    let _ = write!(name, "{:016x}", fnv1a_64(device_id.as_bytes()));
    debug_assert!(
        check_name(&name).is_ok(),
        "shortened key {name:?} must be valid"
    );
    Ok(format!("{ANNOTATION_PREFIX}{name}"))
}

/// 64-bit FNV-1a: small, stable across releases and platforms.
fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME))
}

/// The annotation value for `devices`: their qualified names, comma-separated.
pub fn annotation_value(devices: &[QualifiedName]) -> Result<String, AnnotationError> {
    if devices.is_empty() {
        return Err(AnnotationError::NoDevices);
    }
    Ok(devices
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(","))
}

/// Parses one annotation value into qualified names; every entry must be one.
pub fn parse_annotation_value(value: &str) -> Result<Vec<QualifiedName>, AnnotationError> {
    value
        .split(',')
        .map(|d| QualifiedName::parse(d).map_err(|reason| AnnotationError::BadValue { reason }))
        .collect()
}

/// The CDI requests found in a set of annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CdiAnnotations {
    /// The keys that start with [`ANNOTATION_PREFIX`], in input order.
    pub keys: Vec<String>,
    /// Every device they request, in input order.
    pub devices: Vec<QualifiedName>,
}

/// Collects the CDI device requests from pod or container annotations, as the
/// reference `ParseAnnotations` does: keys without [`ANNOTATION_PREFIX`] are
/// ignored, and one bad device name fails the whole set.
pub fn parse_annotations<I, K, V>(annotations: I) -> Result<CdiAnnotations, AnnotationError>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let mut found = CdiAnnotations::default();
    for (key, value) in annotations {
        let key = key.as_ref();
        if !key.starts_with(ANNOTATION_PREFIX) {
            continue;
        }
        let devices = parse_annotation_value(value.as_ref()).map_err(|e| match e {
            AnnotationError::BadValue { reason } => AnnotationError::BadDevice {
                key: key.to_owned(),
                reason,
            },
            other => other,
        })?;
        found.devices.extend(devices);
        found.keys.push(key.to_owned());
    }
    Ok(found)
}

/// Tessera's annotation for one allocation: the key
/// `cdi.k8s.io/tessera_<alloc-id>` (shortened if needed) and the value
/// `tessera.io/alloc=<alloc-id>`. The alloc id must be a valid device name.
pub fn tessera_annotation(alloc_id: &str) -> Result<(String, String), AnnotationError> {
    let device = QualifiedName::parse(&format!("{ALLOC_KIND}={alloc_id}"))
        .map_err(|reason| AnnotationError::BadValue { reason })?;
    let key = annotation_key_shortened(TESSERA_PLUGIN, alloc_id)?;
    Ok((key, device.to_string()))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    const POD_UID: &str = "3f2b7c1a-9d4e-4f6a-8b1c-2d3e4f5a6b7c";

    fn q(s: &str) -> QualifiedName {
        QualifiedName::parse(s).expect("valid qualified name")
    }

    #[test]
    fn key_is_prefix_plugin_underscore_id() {
        assert_eq!(
            annotation_key("tessera", "abc-0").as_deref(),
            Ok("cdi.k8s.io/tessera_abc-0")
        );
        assert_eq!(
            annotation_key("vendor.gpu", "a/b").as_deref(),
            Ok("cdi.k8s.io/vendor.gpu_a_b"),
            "a slash in the id becomes an underscore"
        );
    }

    #[test]
    fn key_length_limit_is_63_after_the_prefix() {
        let id_at_limit = "x".repeat(63 - "tessera_".len());
        let key = annotation_key("tessera", &id_at_limit).expect("63 is allowed");
        assert_eq!(key.len() - ANNOTATION_PREFIX.len(), 63);
        let too_long = format!("{id_at_limit}y");
        assert_eq!(
            annotation_key("tessera", &too_long)
                .expect_err("64 is too long")
                .to_string(),
            format!(
                "CDI annotation key \"tessera_{too_long}\": 64 characters after \"cdi.k8s.io/\", more than 63"
            )
        );
    }

    #[test]
    fn key_edge_and_inner_characters() {
        let cases = [
            ("", "x", "CDI annotation: the plugin name is empty"),
            ("tessera", "", "CDI annotation: the device id is empty"),
            (
                "-p",
                "x",
                "CDI annotation key \"-p_x\": must start with a letter or digit, not '-'",
            ),
            (
                "p",
                "x-",
                "CDI annotation key \"p_x-\": must end with a letter or digit, not '-'",
            ),
            (
                "p",
                "x.",
                "CDI annotation key \"p_x.\": must end with a letter or digit, not '.'",
            ),
            (
                "p",
                "a:b",
                "CDI annotation key \"p_a:b\": character ':' is not allowed; use letters, digits and '-', '_', '.'",
            ),
            (
                "p",
                "a=b",
                "CDI annotation key \"p_a=b\": character '=' is not allowed; use letters, digits and '-', '_', '.'",
            ),
        ];
        for (plugin, id, message) in cases {
            let err = annotation_key(plugin, id).expect_err(id);
            assert_eq!(err.to_string(), message, "plugin {plugin:?} id {id:?}");
        }
        assert!(annotation_key("p", "a.b_c-d").is_ok());
    }

    #[test]
    fn pod_uid_and_index_fit_without_shortening() {
        let alloc_id = format!("{POD_UID}-0");
        assert_eq!(alloc_id.len(), 38);
        let (key, value) = tessera_annotation(&alloc_id).expect("valid");
        assert_eq!(key, format!("cdi.k8s.io/tessera_{alloc_id}"));
        assert_eq!(value, format!("tessera.io/alloc={alloc_id}"));
        assert_eq!(annotation_key_shortened("tessera", &alloc_id), Ok(key));
    }

    #[test]
    fn long_ids_are_shortened_deterministically_and_stay_valid() {
        let long = format!("{POD_UID}-{POD_UID}-12");
        let key = annotation_key_shortened("tessera", &long).expect("shortened");
        let name = key.strip_prefix(ANNOTATION_PREFIX).expect("prefix");
        assert_eq!(name.len(), 63);
        assert!(check_name(name).is_ok(), "{name}");
        assert_eq!(
            annotation_key_shortened("tessera", &long),
            Ok(key.clone()),
            "same id, same key"
        );
        // The uid part is cut; the hash of the whole id keeps ids apart.
        assert!(
            name.starts_with("tessera_3f2b7c1a-9d4e-4f6a-8b1c-2d3e"),
            "{name}"
        );
        let other = format!("{POD_UID}-{POD_UID}-13");
        assert_ne!(annotation_key_shortened("tessera", &other), Ok(key));
    }

    #[test]
    fn shortening_pins_the_hash() {
        // FNV-1a 64 of "a" is af63dc4c8601ec8c; pinned so keys stay stable across releases.
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(
            annotation_key_shortened("tessera", "a-").as_deref(),
            Ok("cdi.k8s.io/tessera_a-089bf707b5451593"),
        );
        assert_eq!(
            annotation_key_shortened("tessera", "-").as_deref(),
            Ok(format!("cdi.k8s.io/tessera_{:016x}", fnv1a_64(b"-")).as_str()),
        );
    }

    #[test]
    fn shortening_repairs_bad_characters() {
        let key = annotation_key_shortened("tessera", "gpu:0 é").expect("repaired");
        let name = key.strip_prefix(ANNOTATION_PREFIX).expect("prefix");
        assert!(name.starts_with("tessera_gpu-0-"), "{name}");
        assert!(check_name(name).is_ok(), "{name}");
    }

    #[test]
    fn shortening_needs_a_valid_short_plugin() {
        assert_eq!(
            annotation_key_shortened(&"p".repeat(47), "x")
                .expect_err("too long")
                .to_string(),
            format!(
                "CDI annotation plugin \"{}\": must be 1 to 46 letters, digits, '-', '_', '.', starting with a letter or digit",
                "p".repeat(47)
            )
        );
        assert!(annotation_key_shortened("", "x").is_err());
        assert!(annotation_key_shortened("a b", "x").is_err());
        assert_eq!(
            annotation_key_shortened("tessera", ""),
            Err(AnnotationError::EmptyDeviceId)
        );
    }

    #[test]
    fn value_is_comma_joined_and_parses_back() {
        let devices = vec![q("tessera.io/alloc=abc-0"), q("tessera.io/gpu=0")];
        let value = annotation_value(&devices).expect("non-empty");
        assert_eq!(value, "tessera.io/alloc=abc-0,tessera.io/gpu=0");
        assert_eq!(parse_annotation_value(&value), Ok(devices));
        assert_eq!(annotation_value(&[]), Err(AnnotationError::NoDevices));
    }

    #[test]
    fn parse_collects_cdi_keys_and_rejects_bad_devices() {
        let mut annotations = BTreeMap::new();
        annotations.insert("cdi.k8s.io/tessera_abc-0", "tessera.io/alloc=abc-0");
        annotations.insert("cdi.k8s.io/other_x", "vendor.com/net=a,vendor.com/net=b");
        annotations.insert("tessera.io/bind-phase", "allocating");
        let found = parse_annotations(&annotations).expect("valid");
        assert_eq!(
            found.keys,
            ["cdi.k8s.io/other_x", "cdi.k8s.io/tessera_abc-0"]
        );
        assert_eq!(
            found.devices,
            [
                q("vendor.com/net=a"),
                q("vendor.com/net=b"),
                q("tessera.io/alloc=abc-0")
            ]
        );

        annotations.insert("cdi.k8s.io/bad", "tessera.io/alloc=abc-0,,x");
        assert_eq!(
            parse_annotations(&annotations)
                .expect_err("empty entry")
                .to_string(),
            "CDI annotation \"cdi.k8s.io/bad\": qualified device name \"\": expected \"vendor/class=name\""
        );
    }

    #[test]
    fn tessera_annotation_rejects_an_invalid_alloc_id() {
        assert_eq!(
            tessera_annotation("abc-").expect_err("bad id").to_string(),
            "CDI annotation value: qualified device name \"tessera.io/alloc=abc-\": device name \"abc-\": must end with a letter or digit"
        );
    }
}
