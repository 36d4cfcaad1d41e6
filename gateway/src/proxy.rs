//! The traffic listener's request handling: read the body (bounded), route
//! by model, wait for admission, forward to the replica (retrying another
//! replica when connecting fails, before anything was sent), and pass the
//! response through chunk by chunk, holding the replica's slot until the
//! last byte.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use crate::affinity::{self, Hint, Policy};
use crate::metrics::CodeLabels;
use crate::route::{self, Route, RouteError};
use crate::state::{ModelState, Permit, Reject, Shared};
use crate::timer::CoarseTimer;
use crate::upstream::{Outgoing, Upstream, UpstreamBody};
use crate::{h1, priority};

/// Errors a response body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The body of every response the gateway sends.
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// What one traffic worker (one event loop) serves with: the shared
/// state, its own connection pool and its own coarse timer.
pub struct Worker {
    /// Shared state.
    pub shared: Arc<Shared>,
    /// Connections to replicas.
    pub upstream: Upstream,
    /// Request timeouts.
    pub timer: CoarseTimer,
}

impl Worker {
    /// A worker on the current tokio runtime.
    pub fn new(shared: Arc<Shared>) -> Arc<Self> {
        let up = &shared.settings.spec.upstream;
        let upstream = Upstream::new(up.connect_timeout, up.idle_timeout);
        Arc::new(Worker {
            shared,
            upstream,
            timer: CoarseTimer::start(),
        })
    }
}

/// A small complete body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An OpenAI-style JSON error.
pub fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}
    });
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn rejection(r: Reject, queue_timeout: Duration) -> Response<Body> {
    let (status, message) = match r {
        Reject::QueueFull => (
            StatusCode::TOO_MANY_REQUESTS,
            "the model's queue is full; retry later",
        ),
        Reject::Displaced => (
            StatusCode::TOO_MANY_REQUESTS,
            "the model's queue is full and more important requests took this one's place; retry later",
        ),
        Reject::Timeout => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no replica became free within the queue timeout; retry later",
        ),
        Reject::ShuttingDown => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is shutting down",
        ),
    };
    let mut resp = error_response(status, "overloaded", message);
    let retry = match r {
        Reject::Timeout => queue_timeout.as_secs().max(1),
        _ => 1,
    };
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(retry));
    if r == Reject::ShuttingDown {
        // Reconnect, to another gateway replica if there is one.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// The response header that says why the replica was chosen
/// (`routing.explain`).
pub const ROUTE_HEADER: HeaderName = HeaderName::from_static("x-gpuscale-route");

/// `<reason>; replica=<tag>`: the reason, and the replica as the first 32
/// bits of its [`affinity::tag`] in hex (the same in every gateway, and
/// not its address).
fn explain(permit: &Permit) -> HeaderValue {
    let tag = affinity::tag(permit.endpoint.authority()) >> 32;
    HeaderValue::try_from(format!("{}; replica={tag:08x}", permit.reason.label()))
        .unwrap_or(HeaderValue::from_static("unknown"))
}

/// Handles one request on the traffic listener. Never fails: every
/// outcome is a response.
pub async fn handle(
    worker: Arc<Worker>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    let shared = &worker.shared;
    let (resp, model) = handle_inner(&worker, peer, req).await;
    let code = resp.status().as_u16();
    match model {
        Some(m) => m.count_response(&shared.metrics, code),
        None => {
            shared
                .metrics
                .requests
                .get_or_create(&CodeLabels {
                    model: "unknown".into(),
                    code,
                })
                .inc();
        }
    }
    resp
}

/// 431 when a request head is over `limits.maxHeaderBytes`, counted to
/// the byte ([`h1::request_head_len`]).
pub fn head_too_large(parts: &http::request::Parts, limit: usize) -> Option<Response<Body>> {
    let len = h1::request_head_len(&parts.method, &parts.uri, &parts.headers);
    (len > limit).then(|| {
        error_response(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "invalid_request_error",
            &format!("the request head is {len} bytes; the limit is {limit}"),
        )
    })
}

async fn handle_inner(
    worker: &Worker,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> (Response<Body>, Option<Arc<ModelState>>) {
    let shared = &worker.shared;
    let spec = &shared.settings.spec;
    let (parts, body) = req.into_parts();
    if let Some(r) = head_too_large(&parts, spec.limits.max_header_bytes) {
        return (r, None);
    }
    let needs_body = parts.method == Method::POST;
    let bytes = if needs_body {
        let limited = Limited::new(body, spec.limits.max_body_bytes);
        match worker
            .timer
            .timeout(spec.limits.body_read_timeout, limited.collect())
            .await
        {
            Some(Ok(c)) => c.to_bytes(),
            Some(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                return (
                    error_response(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "invalid_request_error",
                        &format!(
                            "the request body is larger than {} bytes",
                            spec.limits.max_body_bytes
                        ),
                    ),
                    None,
                );
            }
            Some(Err(_)) => {
                return (
                    error_response(
                        StatusCode::BAD_REQUEST,
                        "invalid_request_error",
                        "the request body could not be read",
                    ),
                    None,
                );
            }
            None => {
                return (
                    error_response(
                        StatusCode::REQUEST_TIMEOUT,
                        "invalid_request_error",
                        "the request body did not arrive in time",
                    ),
                    None,
                );
            }
        }
    } else {
        Bytes::new()
    };
    let header_model = parts
        .headers
        .get(&shared.model_header)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let routed = match route::route_request(
        &parts.method,
        parts.uri.path(),
        header_model.as_deref(),
        &bytes,
        |m| shared.models.contains_key(m),
    ) {
        Ok(r) => r,
        Err(e) => {
            let (status, kind) = match e {
                RouteError::NotFound => (StatusCode::NOT_FOUND, "invalid_request_error"),
                RouteError::MethodNotAllowed => {
                    (StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error")
                }
                RouteError::BadBody(_) | RouteError::NoModel => {
                    (StatusCode::BAD_REQUEST, "invalid_request_error")
                }
            };
            return (error_response(status, kind, &e.to_string()), None);
        }
    };
    let prompt = routed.prompt;
    let name = match routed.route {
        Route::ListModels => {
            let data: Vec<serde_json::Value> = shared
                .models
                .keys()
                .map(|m| serde_json::json!({"id": m, "object": "model", "owned_by": "gpuscale"}))
                .collect();
            let body = serde_json::json!({"object": "list", "data": data});
            let mut r = Response::new(full(body.to_string()));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            return (r, None);
        }
        Route::Model(name) => name,
    };
    let Some((model, adapter)) = shared.model_for(&name).map(|(m, a)| (m.clone(), a)) else {
        return (
            error_response(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                &format!("The model `{name}` does not exist"),
            ),
            None,
        );
    };
    let rules = &shared.settings.priorities;
    let priority = if rules.is_empty() {
        // The default: no trusted source, no keys, no routes; no header
        // is even looked at.
        model.settings.priority
    } else {
        rules
            .decide(
                priority::Request {
                    peer: peer.ip(),
                    authorization: parts
                        .headers
                        .get(header::AUTHORIZATION)
                        .map(HeaderValue::as_bytes),
                    path: parts.uri.path(),
                    header: parts
                        .headers
                        .get(&shared.priority_header)
                        .map(HeaderValue::as_bytes),
                },
                model.settings.priority,
            )
            .0
    };
    let balance = &shared.settings.balance;
    let key = if balance.policy == Policy::Prefix && !prompt.is_empty() {
        affinity::key(&prompt, balance.block_bytes, balance.affinity_blocks)
    } else {
        None
    };
    let hint = Hint {
        key: key.map(|k| k.hash),
        shared: key.is_some_and(|k| k.continued),
        adapter,
    };
    let mut permit = match shared.admit(&model, priority, hint).await {
        Ok(p) => p,
        Err(r) => {
            return (
                rejection(r, model.settings.queue_timeout),
                Some(model.clone()),
            );
        }
    };

    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let outgoing = Outgoing {
        method: &parts.method,
        target,
        headers: &parts.headers,
        body: &bytes,
    };
    let mut tried = Vec::new();
    loop {
        let sent = worker
            .timer
            .timeout(
                spec.limits.request_timeout,
                worker.upstream.send(&permit.endpoint, outgoing),
            )
            .await;
        match sent {
            Some(Ok(resp)) => {
                permit.succeeded();
                let explain = spec.routing.explain.then(|| explain(&permit));
                let mut resp = respond(resp, permit, spec.limits.stream_idle_timeout);
                if let Some(v) = explain {
                    resp.headers_mut().insert(ROUTE_HEADER, v);
                }
                return (resp, Some(model.clone()));
            }
            Some(Err(e)) if e.is_connect() => {
                shared.failed(&model, permit.replica);
                tried.push(permit.replica);
                tracing::debug!(model = %model.settings.name, "{e}");
                if tried.len() as u32 > spec.upstream.retries {
                    return (
                        bad_gateway("could not connect to a replica"),
                        Some(model.clone()),
                    );
                }
                match shared.retry_elsewhere(permit, &tried) {
                    Some(p) => permit = p,
                    None => {
                        return (
                            bad_gateway("could not connect to a replica"),
                            Some(model.clone()),
                        );
                    }
                }
            }
            Some(Err(e)) => {
                shared.failed(&model, permit.replica);
                tracing::debug!(model = %model.settings.name, replica = %permit.endpoint, "{e}");
                return (bad_gateway("the replica failed"), Some(model.clone()));
            }
            None => {
                shared.failed(&model, permit.replica);
                return (
                    error_response(
                        StatusCode::GATEWAY_TIMEOUT,
                        "upstream_error",
                        "the replica did not answer within the request timeout",
                    ),
                    Some(model.clone()),
                );
            }
        }
    }
}

/// A 502 whose message never names the replica or the transport error:
/// replica addresses are not the client's business (they are logged at
/// debug level).
fn bad_gateway(what: &str) -> Response<Body> {
    error_response(StatusCode::BAD_GATEWAY, "upstream_error", what)
}

fn respond(resp: Response<UpstreamBody>, permit: Permit, idle: Duration) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    let streaming = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let tracked = Tracked {
        inner: body,
        idle_timer: None,
        idle,
        permit: Some(permit),
        streaming,
        first: true,
    };
    Response::from_parts(parts, tracked.boxed_unsync())
}

/// A streamed body fed by a channel (server-sent events); ends when the
/// sender is dropped.
pub struct ChannelBody {
    rx: tokio::sync::mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// A body that yields what arrives on `rx`.
    pub fn new(rx: tokio::sync::mpsc::Receiver<Bytes>) -> Self {
        ChannelBody { rx }
    }
}

impl HttpBody for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.rx
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

#[derive(Debug)]
struct IdleTimeout;

impl std::fmt::Display for IdleTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the replica stopped sending its response")
    }
}

impl std::error::Error for IdleTimeout {}

pin_project! {
    /// An upstream body passed through frame by frame: holds the replica's
    /// slot until the end (or an error, or the client going away), records
    /// time to first chunk for streams and the total latency, and ends
    /// with an error when the upstream stalls past the idle timeout.
    struct Tracked {
        #[pin]
        inner: UpstreamBody,
        // Armed only when the upstream keeps the body waiting: a fast
        // response never touches the timer wheel.
        idle_timer: Option<Pin<Box<tokio::time::Sleep>>>,
        idle: Duration,
        permit: Option<Permit>,
        streaming: bool,
        first: bool,
    }
}

/// The response was passed on whole: record its latency, free the slot.
/// (The body returned its connection to the pool itself.)
fn finish(permit: &mut Option<Permit>) {
    if let Some(p) = permit.take() {
        p.record_latency(Instant::now());
    }
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if *this.first && frame.is_data() {
                    *this.first = false;
                    if *this.streaming
                        && let Some(p) = this.permit.as_ref()
                    {
                        p.record_ttft(p.admitted.elapsed().as_secs_f64());
                    }
                }
                if let Some(t) = this.idle_timer.as_mut() {
                    t.as_mut().reset(tokio::time::Instant::now() + *this.idle);
                }
                // A body with a known length is done with its last frame:
                // hyper may not poll again, so finish here.
                if this.inner.is_end_stream() {
                    finish(this.permit);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                // The slot is free at once; the client's stream ends with
                // the error.
                this.permit.take();
                Poll::Ready(Some(Err(Box::new(e))))
            }
            Poll::Ready(None) => {
                finish(this.permit);
                Poll::Ready(None)
            }
            Poll::Pending => {
                let idle = *this.idle;
                let timer = this
                    .idle_timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                ready!(timer.as_mut().poll(cx));
                this.permit.take();
                Poll::Ready(Some(Err(Box::new(IdleTimeout))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
