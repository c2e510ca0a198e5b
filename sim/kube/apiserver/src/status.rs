//! API errors as the real server reports them: a `metav1.Status` body with
//! the HTTP code, `reason` and `details` clients branch on (kube-rs turns it
//! into `kube::Error::Api`, kubectl prints `message`).

use serde_json::{Value, json};

use crate::resources::Resource;

/// One failed request, ready to be sent as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `reason`, e.g. `NotFound`.
    pub reason: &'static str,
    /// Human-readable message, worded as the real server words it.
    pub message: String,
    /// `details` (name, group, kind, causes), when the error is about one object.
    pub details: Option<Value>,
}

/// One field error of a 422 Invalid.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// Path of the field, e.g. `metadata.name`.
    pub field: String,
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueDuplicate`, ...
    pub reason: &'static str,
    /// The message after the field path, e.g. `Invalid value: "X": ...`.
    pub detail: String,
}

impl FieldError {
    /// `field: Invalid value: "<value>": <why>`.
    pub fn invalid(field: impl Into<String>, value: &str, why: &str) -> FieldError {
        FieldError {
            field: field.into(),
            reason: "FieldValueInvalid",
            detail: format!("Invalid value: {}: {why}", Value::String(value.to_owned())),
        }
    }

    /// `field: Required value`.
    pub fn required(field: impl Into<String>, why: &str) -> FieldError {
        let detail = if why.is_empty() {
            "Required value".to_owned()
        } else {
            format!("Required value: {why}")
        };
        FieldError {
            field: field.into(),
            reason: "FieldValueRequired",
            detail,
        }
    }

    /// `field: Duplicate value: "<value>"`.
    pub fn duplicate(field: impl Into<String>, value: &str) -> FieldError {
        FieldError {
            field: field.into(),
            reason: "FieldValueDuplicate",
            detail: format!("Duplicate value: {}", Value::String(value.to_owned())),
        }
    }

    /// `field: Forbidden: <why>`.
    pub fn forbidden(field: impl Into<String>, why: &str) -> FieldError {
        FieldError {
            field: field.into(),
            reason: "FieldValueForbidden",
            detail: format!("Forbidden: {why}"),
        }
    }
}

/// `<plural>` or `<plural>.<group>`, as messages name a resource.
pub fn qualified(resource: &Resource) -> String {
    if resource.group.is_empty() {
        resource.plural.to_owned()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    }
}

fn object_details(resource: &Resource, name: &str) -> Value {
    let mut details = json!({"name": name, "kind": resource.plural});
    if !resource.group.is_empty() {
        details["group"] = json!(resource.group);
    }
    details
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 404 for a path that names no resource served here.
    pub fn unknown_resource() -> ApiError {
        let mut e = ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(json!({}));
        e
    }

    /// 404 NotFound for one object: `pods "x" not found`.
    pub fn not_found(resource: &Resource, name: &str) -> ApiError {
        let mut e = ApiError::new(
            404,
            "NotFound",
            format!(
                "{} {} not found",
                qualified(resource),
                Value::String(name.to_owned())
            ),
        );
        e.details = Some(object_details(resource, name));
        e
    }

    /// 404 for a namespaced request whose namespace does not exist.
    pub fn namespace_not_found(name: &str) -> ApiError {
        let mut e = ApiError::new(
            404,
            "NotFound",
            format!("namespaces {} not found", Value::String(name.to_owned())),
        );
        e.details = Some(json!({"name": name, "kind": "namespaces"}));
        e
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> ApiError {
        let mut e = ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        );
        e.details = Some(json!({}));
        e
    }

    /// 409 AlreadyExists.
    pub fn already_exists(resource: &Resource, name: &str) -> ApiError {
        let mut e = ApiError::new(
            409,
            "AlreadyExists",
            format!(
                "{} {} already exists",
                qualified(resource),
                Value::String(name.to_owned())
            ),
        );
        e.details = Some(object_details(resource, name));
        e
    }

    /// 409 Conflict: `Operation cannot be fulfilled on pods "x": <why>`.
    pub fn conflict(resource: &Resource, name: &str, why: &str) -> ApiError {
        let mut e = ApiError::conflict_on(&qualified(resource), name, why);
        e.details = Some(object_details(resource, name));
        e
    }

    /// 409 Conflict on something other than a plain resource, e.g. `pods/binding`.
    pub fn conflict_on(what: &str, name: &str, why: &str) -> ApiError {
        let mut e = ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what} {}: {why}",
                Value::String(name.to_owned())
            ),
        );
        e.details = Some(json!({"name": name, "kind": what}));
        e
    }

    /// 409 Conflict for a stale `metadata.resourceVersion`.
    pub fn stale(resource: &Resource, name: &str) -> ApiError {
        ApiError::conflict(
            resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 410 Expired: a resourceVersion or continue token older than what is kept.
    pub fn expired(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(403, "Forbidden", message)
    }

    /// 422 Invalid without field causes (a JSON patch operation that fails).
    pub fn unprocessable(message: impl Into<String>) -> ApiError {
        ApiError::new(422, "Invalid", message)
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(message: impl Into<String>) -> ApiError {
        ApiError::new(415, "UnsupportedMediaType", message)
    }

    /// 422 Invalid: `Pod "x" is invalid: <field errors>`.
    pub fn invalid(resource: &Resource, name: &str, errors: &[FieldError]) -> ApiError {
        let listed: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.detail))
            .collect();
        let joined = if listed.len() == 1 {
            listed[0].clone()
        } else {
            format!("[{}]", listed.join(", "))
        };
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason, "message": e.detail, "field": e.field}))
            .collect();
        let mut details = json!({"name": name, "kind": resource.kind, "causes": causes});
        if !resource.group.is_empty() {
            details["group"] = json!(resource.group);
        }
        ApiError {
            code: 422,
            reason: "Invalid",
            message: format!(
                "{} {} is invalid: {joined}",
                resource.kind,
                Value::String(name.to_owned())
            ),
            details: Some(details),
        }
    }

    /// 500 InternalError (a bug of the stand-in, reported rather than panicking).
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    /// The `metav1.Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    #[test]
    fn not_found_names_group_qualified_resource() {
        let lease = resources::find("coordination.k8s.io", "v1", "leases").expect("leases");
        let status = ApiError::not_found(lease, "a").to_status();
        assert_eq!(
            status["message"],
            "leases.coordination.k8s.io \"a\" not found"
        );
        assert_eq!(status["details"]["group"], "coordination.k8s.io");
        assert_eq!(status["code"], 404);
    }

    #[test]
    fn invalid_lists_several_field_errors_in_brackets() {
        let pods = resources::find("", "v1", "pods").expect("pods");
        let e = ApiError::invalid(
            pods,
            "x",
            &[
                FieldError::required("spec.containers", ""),
                FieldError::invalid("metadata.name", "X", "bad"),
            ],
        );
        assert_eq!(
            e.message,
            "Pod \"x\" is invalid: [spec.containers: Required value, metadata.name: Invalid value: \"X\": bad]"
        );
        assert_eq!(
            e.to_status()["details"]["causes"][1]["field"],
            "metadata.name"
        );
    }
}
