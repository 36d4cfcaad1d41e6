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
use gpuscale_policies::model::MAX_CONCURRENCY;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};

use crate::auth::{self, Verdict};
use crate::proxy::{Body, ChannelBody, error_response, full, head_too_large};
use crate::state::{RegisterError, Shared};

/// Body of `POST` / `DELETE /v1/replicas`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ReplicaRequest {
    model: String,
    endpoint: String,
    #[serde(default)]
    max_concurrency: Option<u32>,
    /// LoRA adapters the replica has loaded (names from the model's
    /// `adapters`): requests for them prefer it.
    #[serde(default)]
    adapters: Option<Vec<String>>,
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
    let settings = &shared.settings;
    // Bound to loopback: what a browser page sends there (a rebound DNS
    // name, another origin) is refused (`gpuscale_policies::listener`).
    if settings.spec.admin.ip().is_loopback() {
        let field = |name| {
            req.headers()
                .get(name)
                .map(|v: &HeaderValue| v.to_str().unwrap_or("\u{fffd}"))
        };
        if let Some(why) =
            gpuscale_policies::listener::refusal(field(header::HOST), field(header::ORIGIN))
        {
            return error_response(StatusCode::FORBIDDEN, "permission_error", why);
        }
    }
    // The admin token's holder (the autoscaler) has stream places of its
    // own, so that readers without it cannot take them all.
    let token_holder = settings
        .admin_token
        .as_ref()
        .is_some_and(|t| t.verify(req.headers().get(header::AUTHORIZATION)));
    let access = auth::classify(req.method(), req.uri().path());
    match auth::decide(
        access,
        settings.spec.admin.ip().is_loopback(),
        settings.admin_token.as_ref(),
        settings.read_token.as_ref(),
        req.headers().get(header::AUTHORIZATION),
    ) {
        Verdict::Allow => {}
        Verdict::Unauthorized => {
            let mut r = error_response(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "this admin endpoint needs `Authorization: Bearer <admin token>`",
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"gpuscale-admin\""),
            );
            return r;
        }
        Verdict::ReadOnly => {
            return error_response(
                StatusCode::FORBIDDEN,
                "permission_error",
                "the read-only token reads; changes need the admin token",
            );
        }
        Verdict::NoTokenConfigured => {
            return error_response(
                StatusCode::FORBIDDEN,
                "permission_error",
                "changes through the admin API are off: no admin token is configured \
                 (--admin-token-file, GPUSCALE_ADMIN_TOKEN_FILE or spec.adminTokenFile)",
            );
        }
    }
    let (parts, body) = req.into_parts();
    if let Some(r) = head_too_large(&parts, settings.spec.limits.max_header_bytes) {
        return r;
    }
    let req = Request::from_parts(parts, body);
    // HEAD is GET without the body (hyper leaves it out), as RFC 9110
    // §9.3.2 has it: it was classed a read and then answered 404.
    let method = if req.method() == Method::HEAD {
        Method::GET
    } else {
        req.method().clone()
    };
    match (&method, req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let mut out = String::new();
            if prometheus_client::encoding::text::encode(&mut out, &shared.registry).is_err() {
                return text(StatusCode::INTERNAL_SERVER_ERROR, "encoding failed\n");
            }
            // OpenMetrics for scrapers that ask for it (Prometheus does),
            // the classic text format otherwise.
            let (body, content_type) = gpuscale_policies::exposition::negotiate(
                req.headers()
                    .get_all(header::ACCEPT)
                    .iter()
                    .filter_map(|v| v.to_str().ok()),
                out,
            );
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
        (&Method::GET, "/v1/queues/stream") => {
            let open = settings.spec.limits.max_stream_subscribers;
            let cap = if token_holder {
                open + TOKEN_STREAMS
            } else {
                open
            };
            match Subscriber::join(&shared, cap) {
                Some(sub) => stream(shared.clone(), shutdown, sub),
                None => {
                    let mut r = error_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "overloaded",
                        &format!("{open} stream subscribers already (limits.maxStreamSubscribers)"),
                    );
                    r.headers_mut()
                        .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
                    r
                }
            }
        }
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
                        &format!(
                            "expected {{\"model\", \"endpoint\", \"maxConcurrency\"?, \"adapters\"?}}: {e}"
                        ),
                    );
                }
            };
            let own = [
                (settings.spec.listen, "traffic"),
                (settings.spec.admin, "admin"),
            ];
            let endpoint = match settings.registration.check(&r.endpoint, &own) {
                Ok(e) => e,
                Err(e) => {
                    return error_response(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        &format!("endpoint: {e}"),
                    );
                }
            };
            if let Some(n) = r.max_concurrency
                && !(1..=MAX_CONCURRENCY).contains(&n)
            {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("maxConcurrency: must be 1 to {MAX_CONCURRENCY}, got {n}"),
                );
            }
            let unknown = || {
                error_response(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    &format!("The model `{}` is not configured", r.model),
                )
            };
            if let (Some(adapters), Some(m)) = (&r.adapters, shared.models.get(&r.model))
                && let Some(bad) = adapters.iter().find(|a| m.adapter_id(a).is_none())
            {
                return error_response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    &format!("adapters: `{bad}` is not an adapter of `{}`", r.model),
                );
            }
            if register {
                match shared.register(&r.model, endpoint.clone(), r.max_concurrency) {
                    Ok(_) => {
                        if let Some(adapters) = &r.adapters {
                            let _ = shared.set_replica_adapters(&r.model, &endpoint, adapters);
                        }
                        json(StatusCode::OK, &shared.replicas(&r.model))
                    }
                    Err(RegisterError::UnknownModel) => unknown(),
                    Err(e @ RegisterError::TooMany(_)) => error_response(
                        StatusCode::CONFLICT,
                        "invalid_request_error",
                        &e.to_string(),
                    ),
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

/// Stream places above `limits.maxStreamSubscribers` that only a request
/// with the admin token may take: on a loopback admin port reads need no
/// token, and 64 idle readers held every place the autoscaler's push
/// stream needs.
const TOKEN_STREAMS: usize = 8;

/// One `/v1/queues/stream` subscriber, counted against
/// `limits.maxStreamSubscribers` while it lives.
struct Subscriber(Arc<Shared>);

impl Subscriber {
    fn join(shared: &Arc<Shared>, cap: usize) -> Option<Subscriber> {
        let n = &shared.stream_subscribers;
        n.fetch_update(Ordering::AcqRel, Ordering::Acquire, |k| {
            (k < cap).then_some(k + 1)
        })
        .ok()
        .map(|_| Subscriber(shared.clone()))
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.0.stream_subscribers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// `/v1/queues/stream`: `event: queues` with the whole `/v1/queues`
/// document on connect, on every change (coalesced over 10 ms) and at
/// least every second; `event: scale` for each scale-from-zero signal.
fn stream(
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    subscriber: Subscriber,
) -> Response<Body> {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let _subscriber = subscriber;
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
                // A subscriber that went away is noticed at once, not at
                // the next event.
                () = tx.closed() => return,
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
