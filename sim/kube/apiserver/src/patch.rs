//! The three patch types: JSON merge patch (RFC 7386), JSON patch (RFC 6902)
//! and strategic merge patch for the pod and node fields Tessera and kubectl
//! touch. Server-side apply (`application/apply-patch+yaml`) is not served:
//! it answers 415.

use serde_json::{Map, Value};

/// A patch that cannot be applied.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The body is not JSON of the right shape.
    #[error("the patch is not valid JSON: {0}")]
    Malformed(String),
    /// A JSON patch operation failed (missing path, failed test).
    #[error("the JSON patch could not be applied: {0}")]
    JsonPatch(String),
    /// A strategic merge patch directive that makes no sense here.
    #[error("the strategic merge patch is invalid: {0}")]
    Strategic(String),
    /// A JSON patch with more operations than the server takes.
    #[error("The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPS}, got {0}")]
    TooManyOperations(usize),
    /// A JSON patch whose copies would grow the object past the limit.
    #[error("the JSON patch copies or moves more than {0} bytes")]
    TooLarge(usize),
}

/// Most operations one JSON patch may carry (as on the real server).
pub const MAX_JSON_PATCH_OPS: usize = 10_000;

/// A patch body parsed (before the store is locked), ready to apply.
#[derive(Debug, Clone)]
pub enum Patch {
    /// A JSON merge patch (an object).
    Merge(Value),
    /// A JSON patch, at most [`MAX_JSON_PATCH_OPS`] operations.
    Json(json_patch::Patch),
    /// A strategic merge patch (an object).
    Strategic(Value),
}

/// Parses a patch body of `kind`.
pub fn parse(kind: PatchType, body: &[u8]) -> Result<Patch, PatchError> {
    match kind {
        PatchType::Merge => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Malformed(e.to_string()))?;
            if !patch.is_object() {
                return Err(PatchError::Malformed(
                    "a merge patch must be a JSON object".into(),
                ));
            }
            Ok(Patch::Merge(patch))
        }
        PatchType::Json => {
            let patch: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| PatchError::Malformed(e.to_string()))?;
            if patch.0.len() > MAX_JSON_PATCH_OPS {
                return Err(PatchError::TooManyOperations(patch.0.len()));
            }
            Ok(Patch::Json(patch))
        }
        PatchType::Strategic => {
            let patch: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Malformed(e.to_string()))?;
            if !patch.is_object() {
                return Err(PatchError::Malformed(
                    "a strategic merge patch must be a JSON object".into(),
                ));
            }
            Ok(Patch::Strategic(patch))
        }
    }
}

/// Counts the bytes a value serializes to, without keeping them.
struct ByteCounter(usize);

impl std::io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn encoded_len(value: &Value) -> usize {
    let mut counter = ByteCounter(0);
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

impl Patch {
    /// Applies the patch to `target`. A JSON patch is applied one operation
    /// at a time, and fails once its copies and moves add up to more than
    /// `copy_budget` bytes (a few `copy` operations of the root would
    /// otherwise double the object each time).
    pub fn apply(&self, target: &Value, copy_budget: usize) -> Result<Value, PatchError> {
        match self {
            Patch::Merge(patch) => {
                let mut out = target.clone();
                json_patch::merge(&mut out, patch);
                Ok(out)
            }
            Patch::Json(patch) => {
                let mut out = target.clone();
                let mut copied = 0usize;
                for op in &patch.0 {
                    let from = match op {
                        json_patch::PatchOperation::Copy(c) => Some(c.from.as_str()),
                        json_patch::PatchOperation::Move(m) => Some(m.from.as_str()),
                        _ => None,
                    };
                    if let Some(from) = from {
                        copied = copied.saturating_add(out.pointer(from).map_or(0, encoded_len));
                        if copied > copy_budget {
                            return Err(PatchError::TooLarge(copy_budget));
                        }
                    }
                    json_patch::patch(&mut out, std::slice::from_ref(op))
                        .map_err(|e| PatchError::JsonPatch(e.to_string()))?;
                }
                Ok(out)
            }
            Patch::Strategic(patch) => strategic_merge(target, patch),
        }
    }
}

/// The patch content types served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
}

impl PatchType {
    /// The patch type of a `Content-Type` (parameters ignored); `None` when
    /// it is not one served (server-side apply included).
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        match content_type.split(';').next().unwrap_or("").trim() {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            _ => None,
        }
    }
}

/// Parses and applies a patch body of `kind` to `target` (see [`Patch::apply`]).
pub fn apply(
    kind: PatchType,
    target: &Value,
    body: &[u8],
    copy_budget: usize,
) -> Result<Value, PatchError> {
    parse(kind, body)?.apply(target, copy_budget)
}

/// The merge key of the list field `field` of an object held by the field
/// `parent` (for list items: the list's field), under strategic merge: the
/// fields of Pod and Node that carry `patchMergeKey`. By parent, because a
/// name alone can mean different lists (`ports` of a container is keyed by
/// `containerPort`; other `ports` lists are not).
fn merge_key(parent: &str, field: &str) -> Option<&'static str> {
    const CONTAINERS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
    Some(match (parent, field) {
        ("spec", "containers" | "initContainers" | "ephemeralContainers") => "name",
        ("spec", "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates") => "name",
        ("spec", "topologySpreadConstraints") => "topologyKey",
        ("spec", "hostAliases") => "ip",
        ("spec", "readinessGates") => "conditionType",
        ("spec", "taints") => "key",
        (p, "env") if CONTAINERS.contains(&p) => "name",
        (p, "ports") if CONTAINERS.contains(&p) => "containerPort",
        (p, "volumeMounts") if CONTAINERS.contains(&p) => "mountPath",
        (p, "volumeDevices") if CONTAINERS.contains(&p) => "devicePath",
        ("resources", "claims") => "name",
        ("status", "conditions" | "addresses") => "type",
        ("status", "podIPs" | "hostIPs") => "ip",
        ("metadata", "ownerReferences") => "uid",
        _ => return None,
    })
}

/// List fields of primitives merged as sets (`patchStrategy: merge`).
fn merges_as_set(field: &str) -> bool {
    field == "finalizers"
}

/// Strategic merge patch of `patch` onto `target`.
pub fn strategic_merge(target: &Value, patch: &Value) -> Result<Value, PatchError> {
    let Value::Object(patch) = patch else {
        return Err(PatchError::Malformed(
            "a strategic merge patch must be a JSON object".into(),
        ));
    };
    let original = match target {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    match merge_map(original, patch, "")? {
        Some(map) => Ok(Value::Object(map)),
        None => Err(PatchError::Strategic(
            "$patch: delete of the whole object".into(),
        )),
    }
}

/// Merges a patch map into an original map held by the field `held_by`;
/// `None` when the patch says `$patch: delete`.
fn merge_map(
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
    held_by: &str,
) -> Result<Option<Map<String, Value>>, PatchError> {
    match patch.get("$patch") {
        None => {}
        Some(Value::String(d)) if d == "delete" => return Ok(None),
        Some(Value::String(d)) if d == "replace" => {
            let mut replaced = Map::new();
            for (k, v) in patch {
                if !k.starts_with('$') {
                    replaced.insert(k.clone(), strip_directives(v));
                }
            }
            return Ok(Some(replaced));
        }
        Some(Value::String(d)) if d == "merge" => {}
        Some(other) => {
            return Err(PatchError::Strategic(format!(
                "unknown $patch directive {other}"
            )));
        }
    }
    for (key, value) in patch {
        if key == "$patch" || key == "$retainKeys" || key.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            let Value::Array(remove) = value else {
                return Err(PatchError::Strategic(format!("{key} must be a list")));
            };
            if let Some(Value::Array(list)) = original.get_mut(field) {
                list.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if key.starts_with('$') {
            return Err(PatchError::Strategic(format!("unknown directive {key}")));
        }
        match value {
            Value::Null => {
                original.remove(key);
            }
            Value::Object(sub) => {
                let merged = match original.remove(key) {
                    Some(Value::Object(orig)) => merge_map(orig, sub, key)?,
                    _ => merge_map(Map::new(), sub, key)?,
                };
                if let Some(m) = merged {
                    original.insert(key.clone(), Value::Object(m));
                }
            }
            Value::Array(items) => {
                let orig = match original.remove(key) {
                    Some(Value::Array(list)) => list,
                    _ => Vec::new(),
                };
                original.insert(
                    key.clone(),
                    Value::Array(merge_list(held_by, key, orig, items)?),
                );
            }
            other => {
                original.insert(key.clone(), other.clone());
            }
        }
    }
    if let Some(Value::Array(retain)) = patch.get("$retainKeys") {
        original.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k)));
    }
    Ok(Some(original))
}

fn merge_list(
    parent: &str,
    field: &str,
    mut original: Vec<Value>,
    patch: &[Value],
) -> Result<Vec<Value>, PatchError> {
    let key = merge_key(parent, field);
    // `[{"$patch": "replace"}, ...]` (an element without a merge key)
    // replaces the whole list; an element with its merge key and
    // `$patch: replace` replaces that element only.
    let replace = patch.iter().any(|item| {
        item.get("$patch").and_then(Value::as_str) == Some("replace")
            && key.is_none_or(|k| item.get(k).is_none())
    });
    if replace {
        return Ok(patch
            .iter()
            .filter(|item| item.get("$patch").is_none())
            .map(strip_directives)
            .collect());
    }
    if merges_as_set(field) {
        for item in patch {
            if !original.contains(item) {
                original.push(item.clone());
            }
        }
        return Ok(original);
    }
    let Some(key) = key else {
        return Ok(patch.iter().map(strip_directives).collect());
    };
    for item in patch {
        let Value::Object(item_map) = item else {
            return Err(PatchError::Strategic(format!(
                "{field}: list items must be objects"
            )));
        };
        let Some(id) = item_map.get(key) else {
            return Err(PatchError::Strategic(format!(
                "{field}: an item lacks its merge key {key:?}"
            )));
        };
        let position = original.iter().position(|o| o.get(key) == Some(id));
        match position {
            Some(i) => {
                let orig = match original.remove(i) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                if let Some(merged) = merge_map(orig, item_map, field)? {
                    original.insert(i, Value::Object(merged));
                }
            }
            None => {
                if item_map.get("$patch").and_then(Value::as_str) != Some("delete")
                    && let Some(fresh) = merge_map(Map::new(), item_map, field)?
                {
                    original.push(Value::Object(fresh));
                }
            }
        }
    }
    Ok(original)
}

/// A patch value with its directives removed (for parts taken as they are).
fn strip_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Applies with a budget far above what these patches copy.
    fn apply(kind: PatchType, target: &Value, body: &[u8]) -> Result<Value, PatchError> {
        super::apply(kind, target, body, 1 << 20)
    }

    fn pod() -> Value {
        json!({
            "metadata": {"name": "p", "labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
            "spec": {
                "containers": [
                    {"name": "c1", "image": "i1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                     "ports": [{"containerPort": 80, "protocol": "TCP"}]},
                    {"name": "c2", "image": "i2"}
                ],
                "tolerations": [{"key": "t1", "operator": "Exists"}]
            },
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}
        })
    }

    #[test]
    fn containers_merge_by_name_and_env_by_name() {
        let patch = json!({"spec": {"containers": [{"name": "c1", "image": "new", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]}]}});
        let out = strategic_merge(&pod(), &patch).expect("applies");
        let c = &out["spec"]["containers"];
        assert_eq!(c.as_array().map(Vec::len), Some(2), "c2 kept");
        assert_eq!(c[0]["image"], "new");
        assert_eq!(
            c[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "3"}, {"name": "C", "value": "4"}])
        );
        assert_eq!(c[0]["ports"][0]["containerPort"], 80);
        assert_eq!(c[1]["image"], "i2");
    }

    #[test]
    fn delete_directive_and_null_removal() {
        let patch = json!({"metadata": {"labels": {"a": null}},
                           "spec": {"containers": [{"name": "c2", "$patch": "delete"}]}});
        let out = strategic_merge(&pod(), &patch).expect("applies");
        assert_eq!(out["metadata"]["labels"], json!({"b": "2"}));
        assert_eq!(out["spec"]["containers"].as_array().map(Vec::len), Some(1));
        assert_eq!(out["spec"]["containers"][0]["name"], "c1");
    }

    #[test]
    fn conditions_merge_by_type_tolerations_replace() {
        let patch = json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]},
                           "spec": {"tolerations": [{"key": "t2", "operator": "Exists"}]}});
        let out = strategic_merge(&pod(), &patch).expect("applies");
        assert_eq!(
            out["status"]["conditions"],
            json!([{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}])
        );
        assert_eq!(
            out["spec"]["tolerations"],
            json!([{"key": "t2", "operator": "Exists"}])
        );
    }

    #[test]
    fn replace_directives() {
        let patch = json!({"metadata": {"labels": {"$patch": "replace", "z": "9"}},
                           "spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "o"}]}});
        let out = strategic_merge(&pod(), &patch).expect("applies");
        assert_eq!(out["metadata"]["labels"], json!({"z": "9"}));
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "only", "image": "o"}])
        );
    }

    #[test]
    fn finalizers_merge_as_a_set_and_delete_from_primitive_list() {
        let add = json!({"metadata": {"finalizers": ["x", "y"]}});
        let out = strategic_merge(&pod(), &add).expect("applies");
        assert_eq!(out["metadata"]["finalizers"], json!(["x", "y"]));
        let remove = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}});
        let out = strategic_merge(&out, &remove).expect("applies");
        assert_eq!(out["metadata"]["finalizers"], json!(["y"]));
    }

    #[test]
    fn taints_by_key_and_addresses_by_type() {
        let node = json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
                          "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.1"}]}});
        let patch = json!({"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]},
                           "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.2"}, {"type": "Hostname", "address": "n"}]}});
        let out = strategic_merge(&node, &patch).expect("applies");
        assert_eq!(out["spec"]["taints"].as_array().map(Vec::len), Some(2));
        assert_eq!(
            out["status"]["addresses"],
            json!([{"type": "InternalIP", "address": "10.0.0.2"}, {"type": "Hostname", "address": "n"}])
        );
    }

    #[test]
    fn malformed_patches_are_errors() {
        assert!(apply(PatchType::Merge, &pod(), b"{").is_err());
        assert!(apply(PatchType::Merge, &pod(), b"[1]").is_err());
        assert!(apply(PatchType::Json, &pod(), b"{\"op\":\"add\"}").is_err());
        assert!(
            apply(
                PatchType::Json,
                &pod(),
                br#"[{"op":"remove","path":"/nope"}]"#
            )
            .is_err()
        );
        assert!(
            apply(
                PatchType::Strategic,
                &pod(),
                br#"{"spec":{"containers":[{"image":"x"}]}}"#
            )
            .is_err()
        );
        assert!(apply(PatchType::Strategic, &pod(), b"\"s\"").is_err());
    }

    #[test]
    fn json_patch_and_merge_patch() {
        let out = apply(
            PatchType::Json,
            &pod(),
            br#"[{"op":"replace","path":"/metadata/labels/a","value":"9"}]"#,
        )
        .expect("applies");
        assert_eq!(out["metadata"]["labels"]["a"], "9");
        let out = apply(
            PatchType::Merge,
            &pod(),
            br#"{"spec":{"containers":[{"name":"n"}]}}"#,
        )
        .expect("applies");
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "n"}]),
            "merge patch replaces lists"
        );
        assert_eq!(
            PatchType::from_content_type("application/apply-patch+yaml"),
            None
        );
    }
    #[test]
    fn json_patch_copies_that_double_the_object_stop_at_the_budget() {
        // Each copy of the root to a new key doubles the document.
        let ops: Vec<String> = (0..40)
            .map(|i| format!(r#"{{"op":"copy","from":"","path":"/x{i}"}}"#))
            .collect();
        let body = format!("[{}]", ops.join(","));
        let e = super::apply(PatchType::Json, &pod(), body.as_bytes(), 64 * 1024)
            .expect_err("over budget");
        assert!(matches!(e, PatchError::TooLarge(_)), "{e}");
        // A few copies within the budget apply.
        let small = format!("[{}]", ops[..2].join(","));
        let out = super::apply(PatchType::Json, &pod(), small.as_bytes(), 64 * 1024)
            .expect("within budget");
        assert!(out["x1"]["x0"]["spec"].is_object());
    }

    #[test]
    fn json_patch_over_ten_thousand_operations_is_refused() {
        let op = r#"{"op":"test","path":"/metadata/name","value":"p"}"#;
        let body = format!("[{}]", vec![op; MAX_JSON_PATCH_OPS + 1].join(","));
        let e = apply(PatchType::Json, &pod(), body.as_bytes()).expect_err("too many");
        assert_eq!(
            e.to_string(),
            "The allowed maximum operations in a JSON patch is 10000, got 10001"
        );
        let body = format!("[{}]", vec![op; MAX_JSON_PATCH_OPS].join(","));
        apply(PatchType::Json, &pod(), body.as_bytes()).expect("at the limit");
    }

    #[test]
    fn an_element_with_its_merge_key_and_replace_replaces_that_element_only() {
        let patch = json!({"spec": {"containers": [
            {"name": "c1", "image": "r", "$patch": "replace"}]}});
        let out = strategic_merge(&pod(), &patch).expect("applies");
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "c1", "image": "r"}, {"name": "c2", "image": "i2"}])
        );
    }

    #[test]
    fn topology_spread_and_scheduling_gates_merge_by_key() {
        let target = json!({"spec": {
            "topologySpreadConstraints": [
                {"topologyKey": "zone", "maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}],
            "schedulingGates": [{"name": "a"}]}});
        let patch = json!({"spec": {
            "topologySpreadConstraints": [
                {"topologyKey": "host", "maxSkew": 2, "whenUnsatisfiable": "ScheduleAnyway"}],
            "schedulingGates": [{"name": "b"}]}});
        let out = strategic_merge(&target, &patch).expect("applies");
        let keys: Vec<&str> = out["spec"]["topologySpreadConstraints"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|c| c["topologyKey"].as_str())
            .collect();
        assert_eq!(keys, ["zone", "host"]);
        assert_eq!(
            out["spec"]["schedulingGates"],
            json!([{"name": "a"}, {"name": "b"}])
        );
        // `ports` is keyed by containerPort under a container only.
        let other = json!({"ports": [{"port": 1}]});
        let out = strategic_merge(&other, &json!({"ports": [{"port": 2}]})).expect("applies");
        assert_eq!(out["ports"], json!([{"port": 2}]), "no merge key: replaced");
    }
}
