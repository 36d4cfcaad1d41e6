//! The traffic listener's request handling, for a request whose head and
//! body [`crate::traffic`] has read: route by model, decide the priority,
//! wait for admission, forward to the replica (retrying another replica
//! when connecting fails, before anything was sent) and return its
//! response head with the body still to come and the replica's slot held
//! ([`Relayed`]), or the gateway's own answer ([`Local`]).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body::{Body as HttpBody, Frame};
use http_body_util::{BodyExt, Full};

use crate::affinity::{self, Hint, Policy};
use crate::fairness::Client;
use crate::h1::RawResponse;
use crate::h1_server::{self, RequestHead};
use crate::metrics::CodeLabels;
use crate::route::{self, Route, RouteError};
use crate::state::{ModelState, Permit, Reject, Shared};
use crate::timer::CoarseTimer;
use crate::upstream::{SendError, Upstream, UpstreamBody};
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

fn rejection(r: Reject, queue_timeout: Duration) -> Local {
    let (status, message) = match r {
        Reject::QueueFull => (
            StatusCode::TOO_MANY_REQUESTS,
            "the model's queue is full; retry later",
        ),
        Reject::Displaced => (
            StatusCode::TOO_MANY_REQUESTS,
            "the model's queue is full and more important requests took this one's place; retry later",
        ),
        Reject::Overdue => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the model's queue is full and this request had waited past the model's queue budget; a newer one took its place; retry later",
        ),
        Reject::Timeout => (
            StatusCode::SERVICE_UNAVAILABLE,
            "no replica of the model was free (or, with none running, started) within the queue timeout; retry later",
        ),
        Reject::ShuttingDown => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is shutting down",
        ),
        Reject::Crowded => (
            StatusCode::TOO_MANY_REQUESTS,
            "the model's queue is full and this client held more of it than another, whose request took this one's place; retry later",
        ),
        Reject::RateLimited => (
            StatusCode::TOO_MANY_REQUESTS,
            "this client has sent its rate's worth of requests; retry after the seconds in Retry-After",
        ),
    };
    // A client past its own rate is told so in the type too (clients
    // branch on it): the others are the model's overload.
    let kind = if r == Reject::RateLimited {
        "rate_limit_exceeded"
    } else {
        "overloaded"
    };
    let mut local = local_error(status, kind, message);
    local.retry_after = Some(match r {
        Reject::Timeout => queue_timeout.as_secs().max(1),
        _ => 1,
    });
    // Shutting down: reconnect, to another gateway replica if there is one.
    local.close = r == Reject::ShuttingDown;
    local
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

/// What the traffic listener answers a request with.
// Relayed is the common reply: boxing it would allocate for every
// proxied request to shrink the rare Local one.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// An answer the gateway makes itself: a JSON body.
    Local(Local),
    /// The replica's response, relayed.
    Relayed(Relayed),
}

impl Reply {
    /// The status code.
    pub fn status(&self) -> StatusCode {
        match self {
            Reply::Local(l) => l.status,
            Reply::Relayed(r) => r.head.status,
        }
    }
}

/// An answer of the gateway's own, with a JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Local {
    /// Status code.
    pub status: StatusCode,
    /// The JSON body.
    pub body: Bytes,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
    /// Close the connection after it.
    pub close: bool,
    /// `Allow`, on a 405.
    pub allow: Option<&'static str>,
    /// Carries this gateway's `Via` entry: the 508 for a request that came
    /// back through it, by which the hop that sent it knows the loop.
    pub via: bool,
}

/// An OpenAI-style JSON error of the traffic listener.
pub fn local_error(status: StatusCode, kind: &str, message: &str) -> Local {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": status.as_u16()}
    });
    Local {
        status,
        body: body.to_string().into(),
        retry_after: None,
        close: false,
        allow: None,
        via: false,
    }
}

/// A replica's response on its way to the client: its head as the
/// replica sent it, its body as it arrives, the slot it holds until the
/// body's end.
pub struct Relayed {
    /// The response head.
    pub head: RawResponse,
    /// The body.
    pub body: UpstreamBody,
    /// The replica's slot: freed at the body's end, with the latency
    /// recorded, or when the relay fails.
    pub permit: Permit,
    /// `x-gpuscale-route`, when `routing.explain` is on.
    pub explain: Option<HeaderValue>,
    /// A server-sent event stream: the first chunk's time is its TTFT.
    pub streaming: bool,
}

/// Handles one request on the traffic listener, its head and its whole
/// body read. Never fails: every outcome is a reply.
pub async fn handle(worker: &Worker, peer: SocketAddr, head: &RequestHead, body: Bytes) -> Reply {
    let shared = &worker.shared;
    let (reply, model) = handle_inner(worker, peer, head, body).await;
    let code = reply.status().as_u16();
    match model {
        Some(m) => m.count_response(&shared.metrics, code),
        None => count_unrouted(shared, code),
    }
    reply
}

/// Counts an answer to a request that reached no model, under an empty
/// `model` (Prometheus reads it as no label): no model's name, which any
/// word such as `unknown` could be.
pub fn count_unrouted(shared: &Shared, code: u16) {
    shared
        .metrics
        .requests
        .get_or_create(&CodeLabels {
            model: String::new(),
            code,
        })
        .inc();
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
    head: &RequestHead,
    bytes: Bytes,
) -> (Reply, Option<Arc<ModelState>>) {
    let shared = &worker.shared;
    let spec = &shared.settings.spec;
    let local = |status, kind, message: &str| Reply::Local(local_error(status, kind, message));
    // A request this gateway forwarded has come back to it: a replica
    // address registered here leads to the gateway (a Service or a proxy
    // in front of it). Refused before any queue or replica, so the loop
    // ends here; the hop that sent it sees its own `Via` on the 508 and
    // ejects that replica.
    if head.values("via").any(|v| shared.via_is_mine(v)) {
        tracing::debug!("a request came back through this gateway (its Via entry): 508");
        let mut answer = local_error(
            StatusCode::LOOP_DETECTED,
            "upstream_error",
            "the request came back to the gateway that forwarded it: a replica address \
             registered with the gateway leads back to the gateway",
        );
        answer.via = true;
        return (Reply::Local(answer), None);
    }
    // Bound to loopback: what a browser page sends there (a rebound DNS
    // name, a cross-origin POST that needs no preflight) is refused
    // (`gpuscale_policies::listener`).
    if spec.listen.ip().is_loopback() {
        let field = |name| {
            head.get(name)
                .map(|v| std::str::from_utf8(v).unwrap_or("\u{fffd}"))
        };
        if let Some(why) = gpuscale_policies::listener::refusal(field("host"), field("origin")) {
            return (local(StatusCode::FORBIDDEN, "permission_error", why), None);
        }
    }
    let header_model = head
        .get(shared.model_header.as_str())
        .and_then(|v| std::str::from_utf8(v).ok());
    let routed = match route::route_request(&head.method, head.path(), header_model, &bytes, |m| {
        shared.models.contains_key(m)
    }) {
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
            let mut answer = local_error(status, kind, &e.to_string());
            if e == RouteError::MethodNotAllowed {
                answer.allow = Some(route::allowed_methods(head.path()));
            }
            return (Reply::Local(answer), None);
        }
    };
    let prompt = routed.prompt;
    let named = routed.named;
    let name = match routed.route {
        Route::ListModels => {
            let data: Vec<serde_json::Value> = shared
                .models
                .keys()
                .map(|m| serde_json::json!({"id": m, "object": "model", "owned_by": "gpuscale"}))
                .collect();
            let body = serde_json::json!({"object": "list", "data": data});
            let list = Local {
                status: StatusCode::OK,
                body: body.to_string().into(),
                retry_after: None,
                close: false,
                allow: None,
                via: false,
            };
            return (Reply::Local(list), None);
        }
        Route::Model(name) => name,
    };
    let Some((model, adapter)) = shared.model_for(&name).map(|(m, a)| (m.clone(), a)) else {
        return (
            local(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                &format!("The model `{name}` does not exist"),
            ),
            None,
        );
    };
    // The header chose one served model and the request names another:
    // its queue, priority and concurrency would be the header's while the
    // replica runs the request's model (on a server that hosts both).
    if let Some(named) = &named
        && let Some((other, _)) = shared.model_for(named)
        && !Arc::ptr_eq(other, &model)
    {
        return (
            local(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!(
                    "the `{}` header names the model `{name}` and the request the model \
                     `{named}`: send one model (or leave the header out)",
                    shared.model_header
                ),
            ),
            None,
        );
    }
    let rules = &shared.settings.priorities;
    let (priority, key) = if rules.is_empty() {
        // The default: no trusted source, no keys, no routes; no header
        // is even looked at.
        (model.settings.priority, None)
    } else {
        // Routes match the path the request was routed by, not the bytes
        // it was sent as: a KServe path as `/v2/models/<the model it
        // resolved to>/infer` (after percent-decoding and the model
        // header), so neither `%51wen` nor a header naming another model
        // moves a request out of its route's class or into another's.
        let kserve;
        let path = if head.path().starts_with("/v2/models/") {
            kserve = format!("/v2/models/{name}/infer");
            kserve.as_str()
        } else {
            head.path()
        };
        let (priority, _, key) = rules.decide_keyed(
            priority::Request {
                peer: peer.ip(),
                authorization: head.get("authorization"),
                path,
                header: head.get(shared.priority_header.as_str()),
            },
            model.settings.priority,
        );
        (priority, key)
    };
    let proxies: &[ipnet::IpNet] = if rules.forwarded_for {
        &rules.trusted_networks
    } else {
        &[]
    };
    let source = crate::fairness::source(peer.ip(), head.values("x-forwarded-for"), proxies);
    let client = Client::of(source, key);
    if let Err(wait) = shared.within_rate(&model, client, key) {
        let mut local = rejection(Reject::RateLimited, model.settings.queue_timeout);
        local.retry_after = Some(wait.as_secs_f64().ceil().max(1.0) as u64);
        return (Reply::Local(local), Some(model.clone()));
    }
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
    let mut permit = match shared.admit(&model, priority, hint, client).await {
        Ok(p) => p,
        Err(r) => {
            return (
                Reply::Local(rejection(r, model.settings.queue_timeout)),
                Some(model.clone()),
            );
        }
    };

    let with_length =
        matches!(head.method, Method::POST | Method::PUT | Method::PATCH) || !bytes.is_empty();
    let head_request = head.method == Method::HEAD;
    let mut out = Vec::with_capacity(head.len() + 64);
    let mut tried = Vec::new();
    loop {
        out.clear();
        head.encode_forward(
            &mut out,
            permit.endpoint.host_header().as_bytes(),
            if head.http10 {
                shared.via10.as_bytes()
            } else {
                shared.via.as_bytes()
            },
            with_length.then_some(bytes.len()),
        );
        let sent = worker
            .timer
            .timeout(
                spec.limits.request_timeout,
                worker
                    .upstream
                    .send_head(&permit.endpoint, &out, &bytes, head_request),
            )
            .await;
        match sent {
            // This gateway's own 508 for this request, which came back to
            // it through the replica's address: that address is not a
            // model server. Nothing ran, so another replica may take it.
            Some(Ok((answer, _))) if looped(shared, head, &answer) => {
                shared.failed(&model, permit.replica);
                tried.push(permit.replica);
                tracing::warn!(
                    model = %model.settings.name,
                    replica = %permit.endpoint,
                    "the replica's address leads back to this gateway (the request came back \
                     through it): not a model server; counted as a failed replica"
                );
                let Some(p) = retry(shared, &model, permit, &tried, spec.upstream.retries) else {
                    return (bad_gateway(LOOPED), Some(model.clone()));
                };
                permit = p;
            }
            Some(Ok((head, body))) => {
                permit.succeeded();
                let explain = spec.routing.explain.then(|| explain(&permit));
                let streaming = head
                    .get("content-type")
                    .is_some_and(|v| v.starts_with(b"text/event-stream"));
                let relayed = Relayed {
                    head,
                    body,
                    permit,
                    explain,
                    streaming,
                };
                return (Reply::Relayed(relayed), Some(model.clone()));
            }
            Some(Err(SendError::Local(what))) => {
                // The gateway's own shortage: the replica is not to blame
                // (no ejection), and the client is told to come back.
                drop(permit);
                model.missed_after_admission();
                tracing::warn!(model = %model.settings.name, "connect: the gateway is out of {what}");
                let mut answer = local_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded",
                    &format!("the gateway is out of {what}; retry later"),
                );
                answer.retry_after = Some(1);
                return (Reply::Local(answer), Some(model.clone()));
            }
            Some(Err(e)) if e.is_connect() => {
                shared.failed(&model, permit.replica);
                tried.push(permit.replica);
                tracing::debug!(model = %model.settings.name, "{e}");
                let Some(p) = retry(shared, &model, permit, &tried, spec.upstream.retries) else {
                    return (bad_gateway(NO_REPLICA), Some(model.clone()));
                };
                permit = p;
            }
            Some(Err(e)) => {
                shared.failed(&model, permit.replica);
                model.missed_after_admission();
                tracing::debug!(model = %model.settings.name, replica = %permit.endpoint, "{e}");
                return (bad_gateway("the replica failed"), Some(model.clone()));
            }
            None => {
                // (Sent as it left the queue: no clock read of its own.)
                shared.timed_out(&model, permit.replica, permit.admitted);
                model.missed_after_admission();
                return (
                    local(
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

/// Whether a replica's answer is a 508 for a loop through this request's
/// own path: its `Via` names this gateway, or a gateway the request came
/// through (an edge gateway in front of this one, which a replica's
/// address here leads back to). Either way the replica's address is
/// wrong, and no replica ran the request.
fn looped(shared: &Shared, request: &RequestHead, answer: &RawResponse) -> bool {
    answer.status == StatusCode::LOOP_DETECTED
        && answer
            .fields()
            .filter(|(n, _)| n.eq_ignore_ascii_case(b"via"))
            .any(|(_, v)| {
                shared.via_is_mine(v)
                    || h1_server::via_received_by(v).any(|by| {
                        std::str::from_utf8(by).is_ok_and(|by| {
                            request
                                .values("via")
                                .any(|came| h1_server::via_names(came, by))
                        })
                    })
            })
}

/// The 502's message when no replica took the request.
const NO_REPLICA: &str = "could not connect to a replica";
const LOOPED: &str = "the replica's address leads back to a gateway this request came through \
                      (a request loop), and no other replica could take it";

/// Another replica for a request no replica has taken yet (its connect
/// failed, or it came back through this gateway), within `retries`;
/// `None`: the request has missed (the caller answers 502).
fn retry(
    shared: &Arc<Shared>,
    model: &ModelState,
    permit: Permit,
    tried: &[crate::admission::ReplicaId],
    retries: u32,
) -> Option<Permit> {
    let again = if tried.len() as u32 > retries {
        drop(permit);
        None
    } else {
        shared.retry_elsewhere(permit, tried)
    };
    if again.is_none() {
        model.missed_after_admission();
    }
    again
}

/// A 502 whose message never names the replica or the transport error:
/// replica addresses are not the client's business (they are logged at
/// debug level).
fn bad_gateway(what: &str) -> Reply {
    Reply::Local(local_error(StatusCode::BAD_GATEWAY, "upstream_error", what))
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
