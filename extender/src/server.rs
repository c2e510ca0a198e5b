//! The HTTP server: the verbs, health, readiness, metrics and the report.
//!
//! `POST /filter`, `POST /prioritize`, `POST /bind` (extender v1 JSON; a
//! malformed body is HTTP 400, a body over [`MAX_BODY_BYTES`] HTTP 413, each
//! with one line of JSON `{"Error": "..."}`),
//! `GET /healthz` (200 while the process runs), `GET /readyz` (200 once the
//! reflectors have synced, else 503), `GET /metrics` (Prometheus text),
//! `GET /inspect` (the allocation report, JSON).

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;

use crate::verbs::Extender;
use crate::wire::{ExtenderArgs, ExtenderBindingArgs};

/// The largest request body read: without nodeCacheCapable kube-scheduler
/// sends whole Node objects, megabytes for a few hundred nodes.
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// The router of every endpoint.
pub fn router(extender: Extender) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/inspect", get(inspect))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(extender)
}

fn json_reply<T: Serialize>(status: StatusCode, value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => (status, [(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding the reply: {e}"),
        )
            .into_response(),
    }
}

fn bad_request(error: impl std::fmt::Display) -> Response {
    tracing::warn!(%error, "bad request");
    json_reply(
        StatusCode::BAD_REQUEST,
        &serde_json::json!({"Error": error.to_string()}),
    )
}

/// A body that could not be read (over the limit, cut off): its status,
/// with the one-line JSON error every verb answers.
fn unreadable_body(rejection: BytesRejection) -> Response {
    let error = rejection.body_text();
    let line = error.lines().next().unwrap_or("unreadable request body");
    tracing::warn!(error = %line, "request body refused");
    json_reply(
        rejection.status(),
        &serde_json::json!({"Error": format!("request body: {line}")}),
    )
}

async fn filter(State(extender): State<Extender>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return unreadable_body(rejection),
    };
    match ExtenderArgs::parse(&body) {
        Ok(args) => {
            let result = tokio::task::spawn_blocking(move || extender.filter(&args)).await;
            match result {
                Ok(reply) => json_reply(StatusCode::OK, &reply),
                Err(e) => internal(e),
            }
        }
        Err(e) => bad_request(e),
    }
}

async fn prioritize(
    State(extender): State<Extender>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return unreadable_body(rejection),
    };
    match ExtenderArgs::parse(&body) {
        Ok(args) => {
            let result = tokio::task::spawn_blocking(move || extender.prioritize(&args)).await;
            match result {
                Ok(reply) => json_reply(StatusCode::OK, &reply),
                Err(e) => internal(e),
            }
        }
        Err(e) => bad_request(e),
    }
}

fn internal(e: tokio::task::JoinError) -> Response {
    tracing::error!(error = %e, "verb failed");
    json_reply(
        StatusCode::INTERNAL_SERVER_ERROR,
        &serde_json::json!({"Error": format!("internal error: {e}")}),
    )
}

async fn bind(State(extender): State<Extender>, body: Result<Bytes, BytesRejection>) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => return unreadable_body(rejection),
    };
    match ExtenderBindingArgs::parse(&body) {
        Ok(args) => {
            // A task of its own: a scheduler that gives up waiting must not
            // cancel a bind half-way (annotations written, no Binding).
            match tokio::spawn(async move { extender.bind(&args).await }).await {
                Ok(reply) => json_reply(StatusCode::OK, &reply),
                Err(e) => internal(e),
            }
        }
        Err(e) => bad_request(e),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(extender): State<Extender>) -> Response {
    if extender.state.is_ready() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "nodes and pods not synced yet\n",
        )
            .into_response()
    }
}

async fn metrics(State(extender): State<Extender>) -> Response {
    let text = extender.metrics.render(&extender.state);
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn inspect(State(extender): State<Extender>) -> Response {
    let nodes: Vec<_> = extender
        .state
        .nodes()
        .iter()
        .map(|n| n.as_ref().clone())
        .collect();
    let pods: Vec<_> = extender
        .state
        .pods()
        .iter()
        .map(|p| p.as_ref().clone())
        .collect();
    let report = tokio::task::spawn_blocking(move || crate::inspect::build(&nodes, &pods)).await;
    match report {
        Ok(report) => json_reply(StatusCode::OK, &report),
        Err(e) => internal(e),
    }
}
