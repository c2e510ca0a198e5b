//! The HTTP side: request paths to resources, verbs to store calls, store
//! results to JSON responses (objects, lists, Tables, watch streams — of
//! one-row Tables when the Accept header asks for Tables) and errors to
//! `metav1.Status`. Create, update and patch honour `fieldValidation`
//! (`Strict`: 400 naming unknown fields; `Warn`, the default: `Warning`
//! headers; `Ignore`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::patch::PatchType;
use crate::resources::{self, Resource};
use crate::selectors::{FieldSelector, LabelSelector, Selectors};
use crate::status::ApiError;
use crate::store::{DeleteOpts, Object, Store};
use crate::{discovery, openapi, table, types};

/// A response body: whole, or a stream of watch events.
pub type Body = BoxBody<Bytes, Infallible>;

/// What every request handler shares.
pub struct App {
    /// The objects.
    pub store: Arc<Store>,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// Time between BOOKMARK events of watches that allow them.
    pub bookmark_interval: Duration,
    /// Becomes `true` when the server stops (watches end).
    pub shutdown: watch::Receiver<bool>,
}

/// A request path that names a resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The resource.
    pub resource: &'static Resource,
    /// The namespace in the path, if any.
    pub namespace: Option<String>,
    /// The object's name, if any.
    pub name: Option<String>,
    /// The subresource (`status`, `binding`), if any.
    pub subresource: Option<String>,
    /// The legacy `/watch/` path prefix was used.
    pub watch: bool,
}

/// Maps a path to a [`Route`]; `None` when it names no resource served here.
pub fn route(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, mut rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let mut watch = false;
    if rest.first() == Some(&"watch") {
        watch = true;
        rest = &rest[1..];
    }
    if rest.iter().any(|s| s.is_empty()) {
        return None;
    }
    let (resource, namespace, tail) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if resources::find(group, version, plural).is_some_and(|r| r.namespaced) =>
        {
            (
                resources::find(group, version, plural)?,
                Some((*ns).to_owned()),
                tail,
            )
        }
        [plural, tail @ ..] => {
            let r = resources::find(group, version, plural)?;
            if r.namespaced && !tail.is_empty() {
                return None;
            }
            (r, None, tail)
        }
        [] => return None,
    };
    let (name, subresource) = match tail {
        [] => (None, None),
        [name] => (Some((*name).to_owned()), None),
        [name, sub] if resource.subresources.contains(sub) => {
            (Some((*name).to_owned()), Some((*sub).to_owned()))
        }
        _ => return None,
    };
    if watch && subresource.is_some() {
        return None;
    }
    Some(Route {
        resource,
        namespace,
        name,
        subresource,
        watch,
    })
}

/// Decodes `%XX` escapes and `+` (a space in a query).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query parameters (last one wins).
pub fn parse_query(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(pair), String::new()),
        })
        .collect()
}

fn json_response(code: StatusCode, content_type: &str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = code;
    if let Ok(v) = content_type.parse() {
        response.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    response
}

fn value_response(code: StatusCode, value: &Value) -> Response<Body> {
    json_response(code, "application/json", Bytes::from(value.to_string()))
}

/// The Status response of an error.
pub fn error_response(error: &ApiError) -> Response<Body> {
    let code = StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    value_response(code, &error.to_status())
}

fn object_response(code: StatusCode, object: &Object) -> Response<Body> {
    json_response(code, "application/json", object.bytes.clone())
}

/// A `<Kind>List` assembled from the objects' stored bytes.
fn list_bytes(resource: &Resource, metadata: &Value, items: &[Object]) -> Bytes {
    let head = format!(
        "{{\"kind\":\"{}\",\"apiVersion\":\"{}\",\"metadata\":{},\"items\":[",
        resource.list_kind(),
        resource.api_version(),
        metadata
    );
    let mut out = BytesMut::with_capacity(
        head.len() + items.iter().map(|o| o.bytes.len() + 1).sum::<usize>() + 2,
    );
    out.put_slice(head.as_bytes());
    for (i, o) in items.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(&o.bytes);
    }
    out.put_slice(b"]}");
    out.freeze()
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> &str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// Handles one request; never fails (errors become Status responses).
pub async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = parse_query(request.uri().query().unwrap_or(""));
    let response = match serve(&app, request, &query).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(%method, path, code = e.code, "{}", e.message);
            error_response(&e)
        }
    };
    tracing::trace!(%method, path, status = response.status().as_u16(), "request");
    Ok(response)
}

async fn read_body(app: &App, request: Request<Incoming>) -> Result<(HeaderMap, Bytes), ApiError> {
    let (parts, body) = request.into_parts();
    let declared = header_str(&parts.headers, header::CONTENT_LENGTH)
        .parse::<usize>()
        .ok();
    if declared.is_some_and(|n| n > app.max_body_bytes) {
        return Err(ApiError::too_large(app.max_body_bytes));
    }
    match Limited::new(body, app.max_body_bytes).collect().await {
        Ok(collected) => Ok((parts.headers, collected.to_bytes())),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(ApiError::too_large(app.max_body_bytes))
        }
        Err(e) => Err(ApiError::bad_request(format!(
            "reading the request body: {e}"
        ))),
    }
}

async fn serve(
    app: &Arc<App>,
    request: Request<Incoming>,
    query: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let accept = header_str(request.headers(), header::ACCEPT).to_owned();
    if method == Method::GET
        && let Some(r) = serve_fixed(&path, &accept, request.headers())
    {
        return Ok(r);
    }
    let Some(route) = route(&path) else {
        if path.starts_with("/openapi/") && openapi::document(&path, "application/json").is_some() {
            return Err(ApiError {
                code: 406,
                reason: "NotAcceptable",
                message: "only application/json is served here".into(),
                details: None,
            });
        }
        return Err(ApiError::unknown_resource());
    };
    if let Some(dry_run) = query.get("dryRun").filter(|v| !v.is_empty()) {
        return Err(ApiError::bad_request(format!(
            "dryRun={dry_run} is not supported by the tessera-sim API server"
        )));
    }
    if route.watch && method != Method::GET {
        return Err(ApiError::method_not_allowed());
    }
    let (headers, body) = read_body(app, request).await?;
    let resource = route.resource;
    if resource.namespaced && route.name.is_some() && route.namespace.is_none() {
        return Err(ApiError::unknown_resource());
    }
    let ns = route.namespace.as_deref();
    let is_watch =
        route.watch || matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    match (&method, route.name.as_deref(), route.subresource.as_deref()) {
        (&Method::GET, _, None) if is_watch => start_watch(app, &route, query, &accept),
        (&Method::GET, None, None) => list(app, &route, query, &accept),
        (&Method::GET, Some(name), None | Some("status")) => {
            let object = app.store.get(resource, ns, name)?;
            if table::wants_table(&accept) {
                let include = query
                    .get("includeObject")
                    .map_or("Metadata", String::as_str);
                let t = table::to_table(
                    resource,
                    std::slice::from_ref(&object.value),
                    include,
                    json!({"resourceVersion": object.rv.to_string()}),
                );
                return Ok(json_response(
                    StatusCode::OK,
                    table::TABLE_CONTENT_TYPE,
                    Bytes::from(t.to_string()),
                ));
            }
            Ok(object_response(StatusCode::OK, &object))
        }
        (&Method::POST, None, None) => {
            if resource.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed());
            }
            let (value, warnings) = decode_checked(resource, &headers, &body, query)?;
            let created = app.store.create(resource, ns, value)?;
            Ok(with_warnings(
                object_response(StatusCode::CREATED, &created),
                &warnings,
            ))
        }
        (&Method::POST, Some(name), Some("binding")) => {
            let binding = types::binding(&body)?;
            app.store.bind(resource, ns.unwrap_or(""), name, &binding)?;
            Ok(value_response(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (&Method::PUT, Some(name), None | Some("status")) => {
            let (value, warnings) = decode_checked(resource, &headers, &body, query)?;
            let status_only = route.subresource.is_some();
            let updated = app.store.update(resource, ns, name, value, status_only)?;
            Ok(with_warnings(
                object_response(StatusCode::OK, &updated),
                &warnings,
            ))
        }
        (&Method::PATCH, Some(name), None | Some("status")) => {
            let content_type = header_str(&headers, header::CONTENT_TYPE);
            let Some(kind) = PatchType::from_content_type(content_type) else {
                return Err(unsupported_patch(content_type));
            };
            let status_only = route.subresource.is_some();
            let (patched, warnings) = app.store.patch_validated(
                resource,
                ns,
                name,
                kind,
                &body,
                status_only,
                validation(query)?,
            )?;
            Ok(with_warnings(
                object_response(StatusCode::OK, &patched),
                &warnings,
            ))
        }
        (&Method::DELETE, Some(name), None) => {
            let opts = delete_options(&body, query)?;
            let (deleted, gone) = app.store.delete_reporting(resource, ns, name, &opts)?;
            // A deletion still waiting (grace period, finalizers) is 202.
            let code = if gone {
                StatusCode::OK
            } else {
                StatusCode::ACCEPTED
            };
            Ok(object_response(code, &deleted))
        }
        (&Method::DELETE, None, None) => {
            let opts = delete_options(&body, query)?;
            let selectors = selectors(resource, query)?;
            let deleted = app
                .store
                .delete_collection(resource, ns, &selectors, &opts)?;
            let metadata = json!({"resourceVersion": app.store.current_rv().to_string()});
            Ok(json_response(
                StatusCode::OK,
                "application/json",
                list_bytes(resource, &metadata, &deleted),
            ))
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn validation(query: &HashMap<String, String>) -> Result<types::FieldValidation, ApiError> {
    types::FieldValidation::from_query(query.get("fieldValidation").map(String::as_str))
}

/// Adds one `Warning: 299 - "<text>"` header per warning (what clients such
/// as kubectl print as `Warning: <text>`).
fn with_warnings(mut response: Response<Body>, warnings: &[String]) -> Response<Body> {
    for text in warnings {
        let quoted = text.replace('\\', "\\\\").replace('"', "\\\"");
        match http::HeaderValue::from_str(&format!("299 - \"{quoted}\"")) {
            Ok(v) => {
                response.headers_mut().append(header::WARNING, v);
            }
            Err(e) => tracing::debug!(%e, text, "a warning that cannot be a header"),
        }
    }
    response
}

/// Discovery, OpenAPI and health paths (GET only).
fn serve_fixed(path: &str, accept: &str, headers: &HeaderMap) -> Option<Response<Body>> {
    match path.trim_end_matches('/') {
        "/healthz" | "/readyz" | "/livez" => {
            return Some(json_response(
                StatusCode::OK,
                "text/plain; charset=utf-8",
                Bytes::from_static(b"ok"),
            ));
        }
        _ => {}
    }
    if discovery::wants_aggregated(accept)
        && let Some(doc) = discovery::aggregated(path)
    {
        return Some(json_response(
            StatusCode::OK,
            discovery::AGGREGATED_CONTENT_TYPE,
            Bytes::from(doc.to_string()),
        ));
    }
    let host = header_str(headers, header::HOST);
    if let Some(doc) = discovery::document(path, host) {
        return Some(value_response(StatusCode::OK, &doc));
    }
    openapi::document(path, accept).map(|(ct, body)| json_response(StatusCode::OK, ct, body))
}

fn unsupported_patch(content_type: &str) -> ApiError {
    if content_type.starts_with("application/apply-patch") {
        ApiError::unsupported_media_type(
            "server-side apply (application/apply-patch+yaml) is not supported by the tessera-sim API server; use client-side kubectl apply or a merge, JSON or strategic merge patch",
        )
    } else {
        ApiError::unsupported_media_type(format!(
            "the patch content type {content_type:?} is not supported: use application/merge-patch+json, application/json-patch+json or application/strategic-merge-patch+json"
        ))
    }
}

/// A create/update body, decoded and checked under the request's
/// `fieldValidation`: the object and the warnings to send.
fn decode_checked(
    resource: &Resource,
    headers: &HeaderMap,
    body: &[u8],
    query: &HashMap<String, String>,
) -> Result<(Value, Vec<String>), ApiError> {
    types::normalize_checked(
        resource,
        decode_object(headers, body)?,
        validation(query)?,
        true,
    )
}

/// A create/update body: JSON (or YAML), never protobuf.
fn decode_object(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    let content_type = header_str(headers, header::CONTENT_TYPE);
    if content_type.contains("protobuf") {
        return Err(ApiError::unsupported_media_type(
            "protobuf bodies are not supported by the tessera-sim API server; send application/json",
        ));
    }
    if content_type.contains("yaml") {
        let value: Value = serde_yaml::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the request body is not valid YAML: {e}"))
        })?;
        if !value.is_object() {
            return Err(ApiError::bad_request("the request body must be an object"));
        }
        return Ok(value);
    }
    types::parse_body(body)
}

fn delete_options(body: &[u8], query: &HashMap<String, String>) -> Result<DeleteOpts, ApiError> {
    let options = types::delete_options(body)?;
    if options.dry_run.as_ref().is_some_and(|d| !d.is_empty()) {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the tessera-sim API server",
        ));
    }
    let mut grace = options.grace_period_seconds;
    if let Some(q) = query.get("gracePeriodSeconds").filter(|q| !q.is_empty()) {
        grace = Some(q.parse().map_err(|_| {
            ApiError::bad_request(format!("gracePeriodSeconds: {q:?} is not an integer"))
        })?);
    }
    let preconditions = options.preconditions.unwrap_or_default();
    Ok(DeleteOpts {
        grace,
        uid: preconditions.uid,
        resource_version: preconditions.resource_version,
    })
}

fn selectors(resource: &Resource, query: &HashMap<String, String>) -> Result<Selectors, ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").map_or("", String::as_str),
        resource,
    )
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(Selectors { labels, fields })
}

fn parse_rv(query: &HashMap<String, String>) -> Result<Option<u64>, ApiError> {
    match query.get("resourceVersion").map(String::as_str) {
        None | Some("") => Ok(None),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {text:?}"))),
    }
}

fn list(
    app: &App,
    route: &Route,
    query: &HashMap<String, String>,
    accept: &str,
) -> Result<Response<Body>, ApiError> {
    let resource = route.resource;
    let selectors = selectors(resource, query)?;
    parse_rv(query)?;
    let limit = match query.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => Some(
            l.parse::<usize>()
                .map_err(|_| ApiError::bad_request(format!("limit: {l:?} is not a number")))?,
        ),
        None => None,
    };
    let page = app.store.list(
        resource,
        route.namespace.as_deref(),
        &selectors,
        limit,
        query.get("continue").map(String::as_str),
    )?;
    let mut metadata = json!({"resourceVersion": page.rv.to_string()});
    if let Some(token) = &page.continue_token {
        metadata["continue"] = json!(token);
    }
    if table::wants_table(accept) {
        let values: Vec<Value> = page.items.iter().map(|o| o.value.clone()).collect();
        let include = query
            .get("includeObject")
            .map_or("Metadata", String::as_str);
        let t = table::to_table(resource, &values, include, metadata);
        return Ok(json_response(
            StatusCode::OK,
            table::TABLE_CONTENT_TYPE,
            Bytes::from(t.to_string()),
        ));
    }
    Ok(json_response(
        StatusCode::OK,
        "application/json",
        list_bytes(resource, &metadata, &page.items),
    ))
}

fn start_watch(
    app: &Arc<App>,
    route: &Route,
    query: &HashMap<String, String>,
    accept: &str,
) -> Result<Response<Body>, ApiError> {
    let resource = route.resource;
    let selectors = selectors(resource, query)?;
    let flag = |name: &str| matches!(query.get(name).map(String::as_str), Some("true" | "1"));
    let rv = parse_rv(query)?;
    let send_initial = query.get("sendInitialEvents").map(String::as_str);
    let initial_events = match send_initial {
        Some("true" | "1") => true,
        Some(_) => false,
        None => rv.is_none_or(|r| r == 0),
    };
    // 0 means the server's default, as on the real server: here, none.
    let timeout = match query.get("timeoutSeconds").filter(|t| !t.is_empty()) {
        Some(t) => Some(t.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("timeoutSeconds: {t:?} is not a number"))
        })?)
        .filter(|secs| *secs > 0)
        .map(Duration::from_secs),
        None => None,
    };
    let mut selectors = selectors;
    if let Some(name) = &route.name {
        // `/watch/<plural>/<name>` watches one object.
        let by_name = FieldSelector::parse(&format!("metadata.name={name}"), resource)
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        selectors.fields = by_name;
    }
    let content_type = if table::wants_table(accept) {
        table::TABLE_CONTENT_TYPE
    } else {
        "application/json"
    };
    let request = crate::watch::WatchRequest {
        resource,
        namespace: route.namespace.clone(),
        selectors,
        resource_version: rv.filter(|r| *r != 0),
        initial_events,
        initial_events_end: initial_events && send_initial.is_some(),
        bookmarks: flag("allowWatchBookmarks"),
        bookmark_interval: app.bookmark_interval,
        timeout,
        stall_timeout: crate::watch::STALL_TIMEOUT,
        table: table::wants_table(accept).then(|| {
            query
                .get("includeObject")
                .map_or("Metadata", String::as_str)
                .to_owned()
        }),
    };
    let rx = crate::watch::start(app.store.clone(), request, app.shutdown.clone());
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx)
        .map(|line| Ok::<_, Infallible>(Frame::data(line)));
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let r = route("/api/v1/namespaces/default/pods/p/status").expect("routes");
        assert_eq!(
            (
                r.resource.plural,
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.subresource.as_deref()
            ),
            ("pods", Some("default"), Some("p"), Some("status"))
        );
        let r = route("/api/v1/namespaces/default").expect("routes");
        assert_eq!(
            (r.resource.plural, r.name.as_deref()),
            ("namespaces", Some("default"))
        );
        let r = route("/api/v1/namespaces/x/status").expect("routes");
        assert_eq!(
            (r.resource.plural, r.subresource.as_deref()),
            ("namespaces", Some("status"))
        );
        let r = route("/api/v1/pods").expect("routes");
        assert_eq!((r.resource.plural, r.namespace), ("pods", None));
        let r = route("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1")
            .expect("routes");
        assert_eq!(r.resource.kind, "Lease");
        let r = route("/api/v1/watch/namespaces/default/pods").expect("routes");
        assert!(r.watch);
        assert!(
            route("/api/v1/pods/p").is_none(),
            "a namespaced object needs its namespace"
        );
        assert!(route("/api/v1/namespaces/default/widgets").is_none());
        assert!(route("/api/v1/namespaces/default/pods/p/exec").is_none());
        assert!(route("/apis/batch/v1/jobs").is_none());
        assert!(
            route("/apis/apps/v1/namespaces/kube-system/daemonsets/d").is_some(),
            "a stored kind of another group"
        );
        assert!(route("/api/v2/pods").is_none());
        assert!(route("/api/v1/nodes/n/binding").is_none());
    }

    #[test]
    fn warnings_become_quoted_299_headers() {
        let response = with_warnings(
            value_response(StatusCode::OK, &json!({})),
            &[r#"unknown field "spec.foo""#.to_owned(), "b".to_owned()],
        );
        let values: Vec<&str> = response
            .headers()
            .get_all(header::WARNING)
            .iter()
            .map(|v| v.to_str().expect("ascii"))
            .collect();
        assert_eq!(
            values,
            [r#"299 - "unknown field \"spec.foo\"""#, r#"299 - "b""#]
        );
    }

    #[test]
    fn query_decoding() {
        let q = parse_query("labelSelector=app%3Dweb%2Ctier+in+%28a%29&watch=1&x");
        assert_eq!(q["labelSelector"], "app=web,tier in (a)");
        assert_eq!(q["watch"], "1");
        assert_eq!(q["x"], "");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}
