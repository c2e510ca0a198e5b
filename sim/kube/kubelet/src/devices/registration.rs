//! The Registration server (`device-plugins/kubelet.sock`): checks a
//! plugin's RegisterRequest as kubelet does and, when it is sound, connects
//! to the plugin. A refused request changes nothing; the plugin gets the
//! reason as a gRPC status.

use std::sync::Arc;

use tessera_kube_proto::deviceplugin::v1beta1 as api;
use tonic::{Request, Response, Status};

use super::Shared;

/// The only device plugin API version kubelet (and this stand-in) speaks.
pub(crate) const API_VERSION: &str = "v1beta1";

/// The kubelet's own socket name in the device-plugins dir.
pub(crate) const KUBELET_SOCKET: &str = "kubelet.sock";

/// Why a RegisterRequest is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RegisterError {
    /// `version` is not `v1beta1`.
    #[error(
        "version: requested API version {0:?} is not supported by kubelet; supported versions are [\"v1beta1\"]"
    )]
    Version(String),
    /// `resource_name` is not an extended resource name.
    #[error("resource_name: the ResourceName {name:?} is invalid: {reason}")]
    ResourceName {
        /// The name sent.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `endpoint` is not a plain socket file name in the plugins dir.
    #[error("endpoint: {endpoint:?} {reason}")]
    Endpoint {
        /// The endpoint sent.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// Checks every field of a RegisterRequest.
pub(crate) fn validate(request: &api::RegisterRequest) -> Result<(), RegisterError> {
    if request.version != API_VERSION {
        return Err(RegisterError::Version(request.version.clone()));
    }
    extended_resource_name(&request.resource_name).map_err(|reason| {
        RegisterError::ResourceName {
            name: request.resource_name.clone(),
            reason,
        }
    })?;
    endpoint_name(&request.endpoint).map_err(|reason| RegisterError::Endpoint {
        endpoint: request.endpoint.clone(),
        reason,
    })
}

/// An extended resource name: `<domain>/<name>`, a valid qualified name,
/// outside the `kubernetes.io` domain, not starting with `requests.`.
pub(crate) fn extended_resource_name(name: &str) -> Result<(), String> {
    let Some((domain, short)) = name.split_once('/') else {
        return Err("an extended resource name is <domain>/<name>".to_owned());
    };
    if name.contains("kubernetes.io/") {
        return Err("the kubernetes.io domain is reserved for native resources".to_owned());
    }
    if name.starts_with("requests.") {
        return Err("the prefix \"requests.\" is reserved for quota".to_owned());
    }
    if short.contains('/') {
        return Err("a qualified name has at most one '/'".to_owned());
    }
    // Kubernetes checks "requests." + name as a qualified name, so the
    // domain must leave room for that prefix.
    dns_subdomain(&format!("requests.{domain}"))?;
    qualified_name_part(short)
}

fn dns_subdomain(text: &str) -> Result<(), String> {
    if text.len() > 253 {
        return Err(format!(
            "domain {text:?} is longer than 253 characters (with \"requests.\")"
        ));
    }
    for label in text.split('.') {
        let ok = !label.is_empty()
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "domain {:?} is not a DNS subdomain (lower-case alphanumerics, '-' and '.', alphanumeric at both ends of each label)",
                text.trim_start_matches("requests.")
            ));
        }
    }
    Ok(())
}

fn qualified_name_part(text: &str) -> Result<(), String> {
    let bytes = text.as_bytes();
    let inner_ok = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ends_ok = bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric);
    if text.len() > 63 || !inner_ok || !ends_ok {
        return Err(format!(
            "name {text:?} must be 1 to 63 characters, alphanumerics, '-', '_' or '.', alphanumeric at both ends"
        ));
    }
    Ok(())
}

/// A socket file name directly inside the device-plugins dir.
pub(crate) fn endpoint_name(endpoint: &str) -> Result<(), &'static str> {
    if endpoint.is_empty() {
        return Err("is empty; it must name the plugin's socket in the device-plugins dir");
    }
    if endpoint.contains('/') || endpoint == "." || endpoint == ".." {
        return Err("must be a file name in the device-plugins dir, without '/'");
    }
    if endpoint.contains('\0') {
        return Err("contains a NUL byte");
    }
    if endpoint == KUBELET_SOCKET {
        return Err("is kubelet's own socket");
    }
    Ok(())
}

/// The Registration service.
pub(crate) struct RegistrationService {
    pub shared: Arc<Shared>,
}

#[tonic::async_trait]
impl api::registration_server::Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let request = request.into_inner();
        tracing::info!(
            resource = %request.resource_name,
            endpoint = %request.endpoint,
            version = %request.version,
            "device plugin registration request"
        );
        if let Err(e) = validate(&request) {
            tracing::warn!(resource = %request.resource_name, "registration refused: {e}");
            return Err(Status::invalid_argument(e.to_string()));
        }
        self.shared
            .connect(&request.resource_name, &request.endpoint)
            .await
            .map_err(|e| {
                tracing::warn!(resource = %request.resource_name, "registration failed: {e}");
                Status::failed_precondition(e.to_string())
            })?;
        Ok(Response::new(api::Empty {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(version: &str, resource: &str, endpoint: &str) -> api::RegisterRequest {
        api::RegisterRequest {
            version: version.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: None,
        }
    }

    #[test]
    fn sound_requests_pass() {
        for resource in [
            "example.com/dev",
            "nvidia.com/gpu",
            "tessera.io/mig-1g.10gb",
            "a.b-c.d/X_y.z",
        ] {
            assert_eq!(
                validate(&request("v1beta1", resource, "p.sock")),
                Ok(()),
                "{resource}"
            );
        }
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (request("v1alpha", "example.com/dev", "p.sock"), "version:"),
            (request("", "example.com/dev", "p.sock"), "version:"),
            (request("v1beta1", "gpu", "p.sock"), "resource_name:"),
            (
                request("v1beta1", "kubernetes.io/x", "p.sock"),
                "resource_name:",
            ),
            (
                request("v1beta1", "foo.kubernetes.io/x", "p.sock"),
                "resource_name:",
            ),
            (
                request("v1beta1", "requests.example.com/x", "p.sock"),
                "resource_name:",
            ),
            (
                request("v1beta1", "Example.com/x", "p.sock"),
                "resource_name:",
            ),
            (
                request("v1beta1", "example.com/", "p.sock"),
                "resource_name:",
            ),
            (
                request("v1beta1", "example.com/a/b", "p.sock"),
                "resource_name:",
            ),
            (
                request("v1beta1", "example.com/-x", "p.sock"),
                "resource_name:",
            ),
            (
                request(
                    "v1beta1",
                    &format!("example.com/{}", "x".repeat(64)),
                    "p.sock",
                ),
                "resource_name:",
            ),
            (request("v1beta1", "example.com/dev", ""), "endpoint:"),
            (
                request("v1beta1", "example.com/dev", "../p.sock"),
                "endpoint:",
            ),
            (
                request("v1beta1", "example.com/dev", "x/../../p.sock"),
                "endpoint:",
            ),
            (
                request("v1beta1", "example.com/dev", "/tmp/p.sock"),
                "endpoint:",
            ),
            (request("v1beta1", "example.com/dev", ".."), "endpoint:"),
            (
                request("v1beta1", "example.com/dev", "kubelet.sock"),
                "endpoint:",
            ),
        ];
        for (req, field) in cases {
            let err = validate(&req).expect_err(&format!("{req:?} must be refused"));
            assert!(err.to_string().starts_with(field), "{req:?}: {err}");
        }
    }
}
