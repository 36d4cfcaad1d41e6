//! The admin listener (a separate port from traffic): `/metrics`
//! (OpenMetrics text), `/healthz`, `/readyz`, `/v1/queues` (JSON per
//! model) and its push variant `/v1/queues/stream` (server-sent events on
//! every change, coalesced over 10 ms, plus scale-from-zero signals), and
//! the discovery interface `/v1/replicas` (GET lists, POST registers,
//! DELETE deregisters) that the autoscaler's local backend calls.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use crate::config::Endpoint;
use crate::proxy::{Body, ChannelBody, error_response, full};
use crate::state::Shared;

/// Body of `POST` / `DELETE /v1/replicas`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReplicaRequest {
    model: String,
    endpoint: String,
    #[serde(default)]
    max_concurrency: Option<u32>,
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    let mut r = Response::new(full(
        serde_json::to_string(value).unwrap_or_else(|_| "{}".into()),
    ));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Handles one admin request.
pub async fn handle(
    shared: Arc<Shared>,
    shutdown: watch::Receiver<bool>,
    req: Request<Incoming>,
) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut out = String::new();
            if prometheus_client::encoding::text::encode(&mut out, &shared.registry).is_err() {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
            }
            // OpenMetrics for scrapers that ask for it (Prometheus does),
            // the classic text format otherwise.
            let openmetrics = req
                .headers()
                .get_all(header::ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| v.contains("application/openmetrics-text"));
            let (body, content_type) = if openmetrics {
                (
                    out,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )
            } else {
                (
                    crate::metrics::classic_text(&out),
                    "text/plain; version=0.0.4; charset=utf-8",
                )
            };
            let mut r = Response::new(full(body));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
            r
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n"),
        (&Method::GET, "/readyz") => {
            if shared.shutting_down.load(Ordering::Relaxed) {
                text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
            } else {
                text(StatusCode::OK, "ready\n")
            }
        }
        (&Method::GET, "/v1/queues") => json(StatusCode::OK, &shared.queues()),
        (&Method::GET, "/v1/queues/stream") => stream(shared, shutdown),
        (&Method::GET, "/v1/replicas") => {
            let all: std::collections::BTreeMap<&String, _> = shared
                .models
                .keys()
                .map(|m| (m, shared.replicas(m)))
                .collect();
            json(StatusCode::OK, &all)
        }
        (&Method::POST | &Method::DELETE, "/v1/replicas") => {
            let register = req.method() == Method::POST;
            let body = match Limited::new(req.into_body(), 64 * 1024).collect().await {
                Ok(b) => b.to_bytes(),
                Err(_) => {
                    return error_response(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        "body unreadable or over 64 KiB",
                    );
                }
            };
            let r: ReplicaRequest = match serde_json::from_slice(&body) {
                Ok(r) => r,
                Err(e) => {
                    return error_response(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        &format!("expected {{\"model\", \"endpoint\", \"maxConcurrency\"?}}: {e}"),
                    );
                }
            };
            let endpoint = match Endpoint::parse(&r.endpoint) {
                Ok(e) => e,
                Err(e) => {
                    return error_response(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        &format!("endpoint: {e}"),
                    );
                }
            };
            let unknown = || {
                error_response(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    &format!("The model `{}` is not configured", r.model),
                )
            };
            if register {
                match shared.register(&r.model, endpoint, r.max_concurrency) {
                    Some(_) => json(StatusCode::OK, &shared.replicas(&r.model)),
                    None => unknown(),
                }
            } else {
                match shared.deregister(&r.model, &endpoint) {
                    Some(true) => json(StatusCode::OK, &shared.replicas(&r.model)),
                    Some(false) => error_response(
                        StatusCode::NOT_FOUND,
                        "invalid_request_error",
                        &format!("{endpoint} is not a replica of `{}`", r.model),
                    ),
                    None => unknown(),
                }
            }
        }
        _ => error_response(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "admin endpoints: /metrics, /healthz, /readyz, /v1/queues, /v1/queues/stream, /v1/replicas",
        ),
    }
}

/// `/v1/queues/stream`: `event: queues` with the whole `/v1/queues`
/// document on connect, on every change (coalesced over 10 ms) and at
/// least every second; `event: scale` for each scale-from-zero signal.
fn stream(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut version = shared.version.subscribe();
        let mut signals = shared.signals.subscribe();
        loop {
            let doc = serde_json::to_string(&shared.queues()).unwrap_or_default();
            if tx
                .send(Bytes::from(format!("event: queues\ndata: {doc}\n\n")))
                .await
                .is_err()
            {
                return;
            }
            tokio::select! {
                changed = version.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    version.borrow_and_update();
                }
                signal = signals.recv() => {
                    if let Ok(s) = signal {
                        let data = serde_json::to_string(&s).unwrap_or_default();
                        if tx.send(Bytes::from(format!("event: scale\ndata: {data}\n\n"))).await.is_err() {
                            return;
                        }
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.changed() => return,
            }
        }
    });
    let mut r = Response::new(ChannelBody::new(rx).boxed_unsync());
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}
