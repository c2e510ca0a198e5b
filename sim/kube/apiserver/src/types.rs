//! Request bodies decoded into the k8s-openapi types before anything is
//! stored: a wrong type or an unknown kind is a 400, never a panic, and what
//! is stored is what the typed object serializes to (unknown fields pruned,
//! as the real server prunes them).

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Binding, ConfigMap, Event, Namespace, Node, Pod, Service, ServiceAccount,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::resources::Resource;
use crate::status::ApiError;

fn roundtrip<T: DeserializeOwned + Serialize>(value: Value, what: &str) -> Result<Value, ApiError> {
    let typed: T = serde_json::from_value(value).map_err(|e| {
        ApiError::bad_request(format!("the {what} object provided is invalid: {e}"))
    })?;
    serde_json::to_value(typed).map_err(|e| ApiError::internal(format!("encoding a {what}: {e}")))
}

/// A custom resource as the stand-in stores it: typed metadata, a free-form
/// `spec` (as a CRD whose schema preserves unknown fields), nothing else.
#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct CustomObject {
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    spec: Option<Value>,
}

/// The round trip of a custom resource: the kind and apiVersion must be the
/// resource's (or absent: filled in), unknown top-level fields are pruned.
fn custom_resource(resource: &Resource, value: Value) -> Result<Value, ApiError> {
    let what = resource.kind;
    let mut object: CustomObject = serde_json::from_value(value).map_err(|e| {
        ApiError::bad_request(format!("the {what} object provided is invalid: {e}"))
    })?;
    let api_version = resource.api_version();
    for (field, given, want) in [
        ("kind", object.kind.as_deref(), what),
        (
            "apiVersion",
            object.api_version.as_deref(),
            api_version.as_str(),
        ),
    ] {
        if given.is_some_and(|g| g != want) {
            return Err(ApiError::bad_request(format!(
                "the {what} object provided is invalid: {field} {:?}, expected {want:?}",
                given.unwrap_or_default()
            )));
        }
    }
    object.kind = Some(what.to_owned());
    object.api_version = Some(api_version);
    serde_json::to_value(object).map_err(|e| ApiError::internal(format!("encoding a {what}: {e}")))
}

/// Parses a JSON request body (400 on malformed JSON or a non-object).
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "the request body is empty; an object was expected",
        ));
    }
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

/// Decodes an object of `resource` into its k8s-openapi type and back.
pub fn normalize(resource: &Resource, value: Value) -> Result<Value, ApiError> {
    match resource.kind {
        "Pod" => roundtrip::<Pod>(value, "Pod"),
        "Node" => roundtrip::<Node>(value, "Node"),
        "Namespace" => roundtrip::<Namespace>(value, "Namespace"),
        "Event" => roundtrip::<Event>(value, "Event"),
        "ConfigMap" => roundtrip::<ConfigMap>(value, "ConfigMap"),
        "Lease" => roundtrip::<Lease>(value, "Lease"),
        "ServiceAccount" => roundtrip::<ServiceAccount>(value, "ServiceAccount"),
        "Service" => roundtrip::<Service>(value, "Service"),
        "DaemonSet" => roundtrip::<DaemonSet>(value, "DaemonSet"),
        "Deployment" => roundtrip::<Deployment>(value, "Deployment"),
        "ClusterRole" => roundtrip::<ClusterRole>(value, "ClusterRole"),
        "ClusterRoleBinding" => roundtrip::<ClusterRoleBinding>(value, "ClusterRoleBinding"),
        "Role" => roundtrip::<Role>(value, "Role"),
        "RoleBinding" => roundtrip::<RoleBinding>(value, "RoleBinding"),
        "PodDisruptionBudget" => roundtrip::<PodDisruptionBudget>(value, "PodDisruptionBudget"),
        "ServiceMonitor" => custom_resource(resource, value),
        other => Err(ApiError::internal(format!("no type for kind {other}"))),
    }
}

/// The `fieldValidation` query parameter of create, update and patch: what
/// happens to fields the object's type does not have (they are never stored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    /// Dropped silently.
    Ignore,
    /// Dropped, with a `Warning` response header for each (the default, as
    /// on the real server).
    Warn,
    /// The request fails with 400 BadRequest naming them.
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter (absent or empty: `Warn`).
    pub fn from_query(value: Option<&str>) -> Result<FieldValidation, ApiError> {
        match value.unwrap_or("") {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation: invalid value {other:?}: must be one of Ignore, Warn or Strict"
            ))),
        }
    }
}

/// The paths (`spec.containers[0].foo`) present in `given` but not in
/// `decoded`, its round trip through the typed object: the fields the type
/// does not know. Nulls count as absent.
pub fn unknown_fields(given: &Value, decoded: &Value) -> Vec<String> {
    fn walk(given: &Value, decoded: &Value, path: &str, out: &mut Vec<String>) {
        match (given, decoded) {
            (Value::Object(g), Value::Object(d)) => {
                for (key, value) in g {
                    if value.is_null() {
                        continue;
                    }
                    let here = if path.is_empty() {
                        key.clone()
                    } else {
                        format!("{path}.{key}")
                    };
                    match d.get(key) {
                        Some(inner) => walk(value, inner, &here, out),
                        None => out.push(here),
                    }
                }
            }
            (Value::Array(g), Value::Array(d)) => {
                for (i, (value, inner)) in g.iter().zip(d).enumerate() {
                    walk(value, inner, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(given, decoded, "", &mut out);
    out
}

/// [`normalize`] under a `fieldValidation` mode: the decoded object and the
/// warnings to send (`Warn`), or 400 naming every unknown field (`Strict`;
/// `context` prefixes the message, as the real server's create and update
/// say which kind could not be decoded).
pub fn normalize_checked(
    resource: &Resource,
    value: Value,
    validation: FieldValidation,
    context: bool,
) -> Result<(Value, Vec<String>), ApiError> {
    if validation == FieldValidation::Ignore {
        return Ok((normalize(resource, value)?, Vec::new()));
    }
    let decoded = normalize(resource, value.clone())?;
    let unknown = unknown_fields(&value, &decoded);
    if unknown.is_empty() {
        return Ok((decoded, Vec::new()));
    }
    let each: Vec<String> = unknown
        .iter()
        .map(|path| format!("unknown field {}", Value::String(path.clone())))
        .collect();
    if validation == FieldValidation::Strict {
        let prefix = if context {
            format!(
                "{kind} in version {version} cannot be handled as a {kind}: ",
                kind = resource.kind,
                version = Value::String(resource.version.to_owned()),
            )
        } else {
            String::new()
        };
        return Err(ApiError::bad_request(format!(
            "{prefix}strict decoding error: {}",
            each.join(", ")
        )));
    }
    Ok((decoded, each))
}

/// Decodes a `Binding` body.
pub fn binding(body: &[u8]) -> Result<Binding, ApiError> {
    let value = parse_body(body)?;
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("the Binding object provided is invalid: {e}")))
}

/// Decodes a `DeleteOptions` body (an empty body is the default options).
pub fn delete_options(body: &[u8]) -> Result<DeleteOptions, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DeleteOptions::default());
    }
    let value = parse_body(body)?;
    serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("the DeleteOptions provided are invalid: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::resources;

    #[test]
    fn wrong_types_and_kinds_are_bad_requests() {
        let pods = resources::find("", "v1", "pods").expect("pods");
        let e = normalize(pods, json!({"metadata": {"name": 5}})).expect_err("refused");
        assert_eq!(e.code, 400);
        let e = normalize(
            pods,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}),
        )
        .expect_err("refused");
        assert_eq!(e.code, 400);
        assert_eq!(parse_body(b"{").expect_err("refused").code, 400);
        assert_eq!(parse_body(b"[]").expect_err("refused").code, 400);
    }

    #[test]
    fn unknown_fields_are_named_by_path_under_each_mode() {
        let pods = resources::find("", "v1", "pods").expect("pods");
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"any": "key"}, "creationTimestamp": null},
            "spec": {"foo": 1, "containers": [
                {"name": "a", "image": "i", "resources": {}},
                {"name": "b", "image": "i", "imagePullPolise": "Always", "ports": [{"containerPort": 80, "nmae": "x"}]}
            ]},
            "bogus": {"deep": true}
        });
        let (_, warnings) =
            normalize_checked(pods, pod.clone(), FieldValidation::Warn, true).expect("accepted");
        assert_eq!(
            warnings,
            [
                r#"unknown field "bogus""#,
                r#"unknown field "spec.containers[1].imagePullPolise""#,
                r#"unknown field "spec.containers[1].ports[0].nmae""#,
                r#"unknown field "spec.foo""#,
            ]
        );
        let (ignored, none) =
            normalize_checked(pods, pod.clone(), FieldValidation::Ignore, true).expect("accepted");
        assert!(none.is_empty());
        assert!(ignored["spec"].get("foo").is_none(), "never stored");
        let e = normalize_checked(pods, pod, FieldValidation::Strict, true).expect_err("refused");
        assert_eq!(e.code, 400);
        assert_eq!(e.reason, "BadRequest");
        assert!(
            e.message.starts_with(
                r#"Pod in version "v1" cannot be handled as a Pod: strict decoding error: unknown field "bogus", unknown field "spec.containers[1].imagePullPolise""#
            ),
            "{}",
            e.message
        );
        let clean = json!({"metadata": {"name": "p", "annotations": {"a": "b"}},
                           "spec": {"containers": [{"name": "a", "image": "i", "env": [{"name": "X", "value": "1"}]}],
                                    "nodeSelector": {"k": "v"}, "securityContext": {}}});
        let (_, none) =
            normalize_checked(pods, clean, FieldValidation::Strict, true).expect("all known");
        assert!(none.is_empty());
        assert_eq!(
            FieldValidation::from_query(None).expect("default"),
            FieldValidation::Warn
        );
        assert_eq!(
            FieldValidation::from_query(Some("Loose"))
                .expect_err("refused")
                .code,
            400
        );
    }

    #[test]
    fn unknown_fields_are_pruned_and_kind_filled_in() {
        let cms = resources::find("", "v1", "configmaps").expect("configmaps");
        let v = normalize(
            cms,
            json!({"metadata": {"name": "x"}, "bogus": 1, "data": {"a": "b"}}),
        )
        .expect("decodes");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b"}})
        );
    }
}
