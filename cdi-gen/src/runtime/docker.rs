//! Docker: `features.cdi = true` in `/etc/docker/daemon.json`, every other
//! key kept in its place. Docker reads `/etc/cdi` and `/var/run/cdi` by
//! default; `cdi-spec-dirs` is touched only when it is already set (then
//! the missing directories are added) or when other directories are asked for.
//!
//! JSON has no comments to keep; the object's key order and the file's
//! indentation are kept by parsing into an order-preserving tree.

use std::fmt;
use std::path::Path;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use super::{DEFAULT_CDI_SPEC_DIRS, RuntimeError, missing_dirs, same_dir};

/// A JSON value whose objects keep their key order.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "a boolean",
            Json::Number(_) => "a number",
            Json::String(_) => "a string",
            Json::Array(_) => "an array",
            Json::Object(_) => "an object",
        }
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Number(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json, E> {
        serde_json::Number::from_f64(v)
            .map(Json::Number)
            .ok_or_else(|| E::custom("a number JSON cannot hold"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Json, E> {
        Ok(Json::String(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries: Vec<(String, Json)> = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Json>()? {
            // Docker refuses duplicate keys; so does this.
            if entries.iter().any(|(k, _)| *k == key) {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            entries.push((key, value));
        }
        Ok(Json::Object(entries))
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Number(n) => n.serialize(s),
            Json::String(v) => s.serialize_str(v),
            Json::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Json::Object(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// The member `key` of an object's entries, added (as `init`) when absent.
fn member<'a>(entries: &'a mut Vec<(String, Json)>, key: &str, init: Json) -> &'a mut Json {
    let index = match entries.iter().position(|(k, _)| k == key) {
        Some(i) => i,
        None => {
            entries.push((key.to_owned(), init));
            entries.len() - 1
        }
    };
    &mut entries[index].1
}

/// The indentation unit of a pretty-printed file: the leading white space
/// of its first indented line; two spaces when it has none.
fn indent_of(text: &str) -> String {
    text.lines()
        .skip(1)
        .map(|l| &l[..l.len() - l.trim_start().len()])
        .find(|w| !w.is_empty())
        .unwrap_or("  ")
        .to_owned()
}

/// Sets `features.cdi = true` in the `daemon.json` text (empty: a new file)
/// and makes a `cdi-spec-dirs` list hold `dirs`. `None` when nothing needs
/// to change.
pub fn enable_cdi(
    text: &str,
    path: &Path,
    dirs: &[String],
) -> Result<Option<String>, RuntimeError> {
    let mut root = if text.trim().is_empty() {
        Json::Object(Vec::new())
    } else {
        serde_json::from_str::<Json>(text)
            .map_err(|e| RuntimeError::malformed(path, format!("invalid JSON: {e}")))?
    };
    let Json::Object(entries) = &mut root else {
        return Err(RuntimeError::malformed(
            path,
            format!("expected a JSON object, found {}", root.type_name()),
        ));
    };
    let mut changed = false;
    let features = member(entries, "features", Json::Object(Vec::new()));
    let Json::Object(features) = features else {
        return Err(RuntimeError::malformed(
            path,
            format!(
                "features: expected an object, found {}",
                features.type_name()
            ),
        ));
    };
    let cdi = member(features, "cdi", Json::Null);
    match cdi {
        Json::Bool(true) => {}
        Json::Bool(false) | Json::Null => {
            *cdi = Json::Bool(true);
            changed = true;
        }
        other => {
            return Err(RuntimeError::malformed(
                path,
                format!(
                    "features.cdi: expected a boolean, found {}",
                    other.type_name()
                ),
            ));
        }
    }
    let defaults_suffice = dirs
        .iter()
        .all(|d| DEFAULT_CDI_SPEC_DIRS.iter().any(|x| same_dir(x, d)));
    let has_dirs = entries.iter().any(|(k, _)| k == "cdi-spec-dirs");
    if has_dirs || !defaults_suffice {
        let mut wanted: Vec<String> = Vec::new();
        if !has_dirs {
            // Setting the list replaces Docker's defaults: keep them.
            wanted.extend(DEFAULT_CDI_SPEC_DIRS.iter().map(|d| (*d).to_owned()));
        }
        wanted.extend(dirs.iter().cloned());
        let list = member(entries, "cdi-spec-dirs", Json::Array(Vec::new()));
        let bad = |found: &str| {
            RuntimeError::malformed(
                path,
                format!("cdi-spec-dirs: expected an array of strings, found {found}"),
            )
        };
        let Json::Array(items) = list else {
            return Err(bad(list.type_name()));
        };
        let present = items
            .iter()
            .map(|i| match i {
                Json::String(s) => Ok(s.clone()),
                other => Err(bad(other.type_name())),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut added: Vec<&String> = Vec::new();
        for dir in missing_dirs(&present, &wanted) {
            if !added.iter().any(|a| same_dir(a, dir)) {
                added.push(dir);
            }
        }
        for dir in added {
            items.push(Json::String(dir.clone()));
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    let indent = indent_of(text);
    let mut out = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
    root.serialize(&mut ser)
        .map_err(|e| RuntimeError::malformed(path, e.to_string()))?;
    let mut out =
        String::from_utf8(out).map_err(|e| RuntimeError::malformed(path, e.to_string()))?;
    out.push('\n');
    Ok(Some(out))
}
