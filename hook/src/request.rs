//! What a container asks of Tessera, read from its `config.json`: an
//! allocation id, or (where the operator allows it) `NVIDIA_VISIBLE_DEVICES`.
//!
//! Sources of an allocation id, in order of trust:
//!
//! 1. the annotation `tessera.io/alloc-id: <id>` (engines without CDI);
//! 2. a CDI annotation `cdi.k8s.io/<anything>: …,tessera.io/alloc=<id>,…` (the
//!    device plugin's fallback; only `tessera.io/alloc=` entries are read, so
//!    other vendors' annotations never fail a container here);
//! 3. `TESSERA_ALLOC_ID=<id>` in the process env, which a transient spec sets.
//!    Any image can set an env variable, so this source alone only ever leads to
//!    a binding record, and only when the spec's edits are verifiably already in
//!    the container (the runtime applied CDI) — never to injection.
//!
//! Every id is validated ([`AllocId::new`]); two sources naming different ids
//! fail the container. Parsing is pure and cheap: this is the fast path every
//! container without a GPU takes.

use std::collections::BTreeMap;

use tessera_model::alloc::AllocId;
use tessera_model::cdi::name::validate_device_name;
use tessera_model::contract::annotations::ALLOC_ID as ALLOC_ID_ANNOTATION;
use tessera_model::contract::cdi::{ALL_DEVICES, ALLOC_KIND, ANNOTATION_PREFIX};
use tessera_model::contract::env::{
    ALLOC_ID as ALLOC_ID_ENV, VISIBLE_DEVICES as VISIBLE_DEVICES_ENV,
};

/// Where an allocation id came from, most trusted first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum IdSource {
    /// `tessera.io/alloc-id` annotation.
    Annotation,
    /// A `cdi.k8s.io/…` annotation naming `tessera.io/alloc=<id>`.
    CdiAnnotation,
    /// `TESSERA_ALLOC_ID` in the process env.
    Env,
}

impl IdSource {
    /// Whether this source may request injection (not just a binding record).
    pub fn may_inject(self) -> bool {
        !matches!(self, IdSource::Env)
    }
}

impl std::fmt::Display for IdSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IdSource::Annotation => write!(f, "annotation {ALLOC_ID_ANNOTATION}"),
            IdSource::CdiAnnotation => write!(f, "a {ANNOTATION_PREFIX} annotation"),
            IdSource::Env => write!(f, "env {ALLOC_ID_ENV}"),
        }
    }
}

/// The allocation a container names, with its most trusted source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocRequest {
    /// The validated id.
    pub id: AllocId,
    /// The most trusted source that named it.
    pub source: IdSource,
}

/// Devices named by `NVIDIA_VISIBLE_DEVICES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleDevices {
    /// `all`.
    All,
    /// A list of indices, `GPU-`/`MIG-` uuids or `<gpu>:<mig>` names, in order, without repeats.
    Named(Vec<String>),
}

/// Everything a container asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// The allocation, if any source names one.
    pub alloc: Option<AllocRequest>,
    /// The raw `NVIDIA_VISIBLE_DEVICES` value when it asks for something
    /// (not empty, `void` or `none`); parsed only once the config allows it.
    pub visible_devices: Option<String>,
}

impl Request {
    /// True when the container asks Tessera for nothing: the fast path.
    pub fn is_empty(&self) -> bool {
        self.alloc.is_none() && self.visible_devices.is_none()
    }
}

/// The last value of `key` in `KEY=VALUE` entries.
pub fn env_value<'a>(env: &'a [String], key: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find_map(|e| e.strip_prefix(key).and_then(|rest| rest.strip_prefix('=')))
}

/// Reads the request from a container's annotations and env.
pub fn parse_request(
    annotations: &BTreeMap<String, String>,
    env: &[String],
) -> Result<Request, String> {
    let mut found: Vec<(AllocId, IdSource)> = Vec::new();
    let mut add = |raw: &str, source: IdSource| -> Result<(), String> {
        let id = AllocId::new(raw).map_err(|e| format!("{source}: {e}"))?;
        if let Some((other, other_source)) = found.iter().find(|(o, _)| *o != id) {
            return Err(format!(
                "conflicting allocation ids: {other} ({other_source}) and {id} ({source})"
            ));
        }
        found.push((id, source));
        Ok(())
    };
    if let Some(raw) = annotations.get(ALLOC_ID_ANNOTATION) {
        add(raw, IdSource::Annotation)?;
    }
    let alloc_prefix = format!("{ALLOC_KIND}=");
    for (key, value) in annotations.range(ANNOTATION_PREFIX.to_owned()..) {
        if !key.starts_with(ANNOTATION_PREFIX) {
            break;
        }
        for entry in value.split(',') {
            if let Some(raw) = entry.trim().strip_prefix(&alloc_prefix) {
                add(raw, IdSource::CdiAnnotation)?;
            }
        }
    }
    if let Some(raw) = env_value(env, ALLOC_ID_ENV) {
        add(raw, IdSource::Env)?;
    }
    let alloc = found
        .iter()
        .min_by_key(|(_, source)| *source)
        .map(|(id, source)| AllocRequest {
            id: id.clone(),
            source: *source,
        });
    let visible_devices = env_value(env, VISIBLE_DEVICES_ENV)
        .filter(|v| !matches!(v.trim(), "" | "void" | "none"))
        .map(str::to_owned);
    Ok(Request {
        alloc,
        visible_devices,
    })
}

/// Parses an `NVIDIA_VISIBLE_DEVICES` value: `all`, or a comma list of device
/// names (indices, `GPU-<uuid>`, `MIG-<uuid>`, `<gpu>:<mig>`); `None` for
/// empty, `void` or `none`.
pub fn parse_visible_devices(value: &str) -> Result<Option<VisibleDevices>, String> {
    let value = value.trim();
    if matches!(value, "" | "void" | "none") {
        return Ok(None);
    }
    let mut names: Vec<String> = Vec::new();
    for entry in value.split(',').map(str::trim) {
        if entry == ALL_DEVICES {
            return Ok(Some(VisibleDevices::All));
        }
        validate_device_name(entry).map_err(|e| {
            format!(
                "{VISIBLE_DEVICES_ENV}: entry {entry:?} is not a device index, uuid or name ({e})"
            )
        })?;
        if !names.iter().any(|n| n == entry) {
            names.push(entry.to_owned());
        }
    }
    Ok(Some(VisibleDevices::Named(names)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn env(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn nothing_asked_is_the_fast_path() {
        let r = parse_request(
            &ann(&[
                ("org.opencontainers.image.title", "x"),
                ("cdi.k8s.io/other_x", "vendor.com/dev=1"),
            ]),
            &env(&[
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=void",
                "TESSERA_ALLOC_IDX=1",
            ]),
        )
        .expect("ok");
        assert!(r.is_empty(), "{r:?}");
        for v in ["", "none", " void "] {
            let r = parse_request(&ann(&[]), &env(&[&format!("NVIDIA_VISIBLE_DEVICES={v}")]))
                .expect("ok");
            assert!(r.is_empty(), "{v:?}");
        }
    }

    #[test]
    fn each_source_names_the_allocation_and_the_most_trusted_wins() {
        let r = parse_request(&ann(&[("tessera.io/alloc-id", "pod-0")]), &[]).expect("ok");
        assert_eq!(
            r.alloc.map(|a| (a.id.to_string(), a.source)),
            Some(("pod-0".into(), IdSource::Annotation))
        );
        let r = parse_request(
            &ann(&[(
                "cdi.k8s.io/tessera_pod-0",
                "vendor.com/x=1, tessera.io/alloc=pod-0",
            )]),
            &env(&["TESSERA_ALLOC_ID=pod-0"]),
        )
        .expect("ok");
        assert_eq!(r.alloc.map(|a| a.source), Some(IdSource::CdiAnnotation));
        let r = parse_request(&ann(&[]), &env(&["TESSERA_ALLOC_ID=pod-0"])).expect("ok");
        let a = r.alloc.expect("env id");
        assert_eq!(a.source, IdSource::Env);
        assert!(!a.source.may_inject());
    }

    #[test]
    fn bad_or_conflicting_ids_are_refused() {
        let e = parse_request(&ann(&[("tessera.io/alloc-id", "../etc")]), &[]).expect_err("bad");
        assert!(
            e.starts_with("annotation tessera.io/alloc-id: allocation id"),
            "{e}"
        );
        let e =
            parse_request(&ann(&[("cdi.k8s.io/t", "tessera.io/alloc=A")]), &[]).expect_err("upper");
        assert!(e.contains("'A' at byte 0"), "{e}");
        let e = parse_request(
            &ann(&[("tessera.io/alloc-id", "a-0")]),
            &env(&["TESSERA_ALLOC_ID=b-0"]),
        )
        .expect_err("conflict");
        assert_eq!(
            e,
            "conflicting allocation ids: a-0 (annotation tessera.io/alloc-id) and b-0 (env TESSERA_ALLOC_ID)"
        );
    }

    #[test]
    fn visible_devices_forms() {
        assert_eq!(parse_visible_devices("void"), Ok(None));
        assert_eq!(parse_visible_devices(" "), Ok(None));
        assert_eq!(parse_visible_devices("all"), Ok(Some(VisibleDevices::All)));
        assert_eq!(
            parse_visible_devices("0,all"),
            Ok(Some(VisibleDevices::All))
        );
        assert_eq!(
            parse_visible_devices("0, GPU-1234-abcd,0:1,MIG-99,0"),
            Ok(Some(VisibleDevices::Named(vec![
                "0".into(),
                "GPU-1234-abcd".into(),
                "0:1".into(),
                "MIG-99".into()
            ])))
        );
        for bad in ["0,,1", "../x", "a b", "-1"] {
            assert!(parse_visible_devices(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_last_env_entry_wins() {
        let e = env(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=void"]);
        assert_eq!(env_value(&e, "NVIDIA_VISIBLE_DEVICES"), Some("void"));
        assert_eq!(
            env_value(
                &env(&["NVIDIA_VISIBLE_DEVICESX=1"]),
                "NVIDIA_VISIBLE_DEVICES"
            ),
            None
        );
    }
}
