//! The autoscaler's admin listener: `/metrics` (OpenMetrics), `/healthz`
//! (503 once the control loop has stopped or stalled), `/readyz` (503
//! while metric reads keep failing, at or past the fallback threshold),
//! `/v1/decisions` (the last decision per model, with its sentence, and
//! the recent changes), and the dashboard: the page at `/`, its data at
//! `/v1/dashboard`, and the same pushed every [`DASHBOARD_EVERY`] as
//! server-sent events at `/v1/dashboard/events`. Read-only; at most
//! [`MAX_CONNECTIONS`] open connections (one more is closed at once).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::controller::Report;

/// Time a client has to send a request head (also the keep-alive idle
/// limit): a connection that sends nothing is closed after it.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Most connections open at once; another gets a probe's answer or 503
/// and is closed ([`over_cap`]).
pub const MAX_CONNECTIONS: usize = 256;

/// How often `/v1/dashboard/events` pushes the view.
pub const DASHBOARD_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Most `/v1/dashboard/events` streams open at once (each holds a
/// connection): the rest of the port, `/healthz` included, always keeps
/// [`MAX_CONNECTIONS`] minus these. One more is answered 503.
pub const MAX_EVENT_STREAMS: usize = 32;

type AdminBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn respond(status: StatusCode, kind: &'static str, body: String) -> Response<AdminBody> {
    let mut r = Response::new(Full::new(Bytes::from(body)).boxed());
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    r
}

/// The dashboard's view as server-sent events, one `data:` line of JSON
/// every [`DASHBOARD_EVERY`], until the client goes away or the listener
/// stops. The first event carries the whole time series; each later one
/// only the samples taken since (the page appends them).
fn dashboard_events(
    report: Report,
    mut shutdown: watch::Receiver<bool>,
    streams: &Arc<tokio::sync::Semaphore>,
) -> Response<AdminBody> {
    let Ok(slot) = streams.clone().try_acquire_owned() else {
        return respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!(
                "{MAX_EVENT_STREAMS} dashboard streams are open already; GET /v1/dashboard instead\n"
            ),
        );
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(2);
    tokio::spawn(async move {
        let _slot = slot;
        let mut every = tokio::time::interval(DASHBOARD_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent_up_to: Option<f64> = None;
        loop {
            tokio::select! {
                _ = every.tick() => {}
                _ = shutdown.changed() => return,
            }
            let mut view = report.dashboard();
            if let Some(t) = sent_up_to {
                view.history.retain(|s| s.t > t);
            }
            if let Some(last) = view.history.last() {
                sent_up_to = Some(last.t);
            }
            let json = serde_json::to_string(&view).unwrap_or_default();
            let event = Bytes::from(format!("data: {json}\n\n"));
            if tx.send(Ok(Frame::data(event))).await.is_err() {
                return;
            }
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed();
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-cache"),
    );
    r
}

/// Pause after a failed accept (out of file descriptors, say).
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// Binds `addr`; serves until `shutdown` turns true. Returns the bound
/// address and the serving task.
pub async fn serve(
    addr: SocketAddr,
    report: Report,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_with(addr, report, shutdown, HEADER_READ_TIMEOUT).await
}

/// A connection over [`MAX_CONNECTIONS`]: a probe (`GET /healthz`,
/// `GET /readyz`, read within 50 ms) gets its real answer, so idle or
/// half-sent connections holding the port cannot fail the kubelet's
/// probes; anything else 503. Then the connection closes.
async fn over_cap(stream: tokio::net::TcpStream, report: Report) {
    answer_over_cap(stream, MAX_CONNECTIONS, |probe| async move {
        match probe {
            Probe::Live => report.live().map(|()| "ok\n".to_string()),
            Probe::Ready => report.ready().map(|()| "ready\n".to_string()),
        }
    })
    .await;
}

/// A kubelet probe, as a connection over a port's cap reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `GET /healthz`.
    Live,
    /// `GET /readyz`.
    Ready,
}

/// Answers a connection over a read-only port's cap of `cap`: a probe
/// (`GET /healthz`, `GET /readyz`, read within 50 ms) gets `health`'s
/// answer (200 with its text, or 503 with the reason), anything else 503;
/// then the connection closes. Idle or half-sent connections holding the
/// port so cannot fail the kubelet's probes.
pub async fn answer_over_cap<F, Fut, E>(mut stream: tokio::net::TcpStream, cap: usize, health: F)
where
    F: FnOnce(Probe) -> Fut,
    Fut: std::future::Future<Output = Result<String, E>>,
    E: std::fmt::Display,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = [0u8; 1024];
    // The request line, read until its end (a read may return part of
    // it), within a deadline long enough for a probe's request to arrive
    // on a loaded node (at 50 ms a kubelet probe could be answered 503
    // before it was read; at 250 ms and at 500 ms, one read, the agent's
    // test saw it once each under CI's load on two cores), and short of
    // the kubelet's default probe timeout (1 s).
    let mut n = 0;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(900);
    while n < buf.len() && !buf[..n].windows(2).any(|w| w == b"\r\n") {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf[n..])).await {
            Ok(Ok(k)) if k > 0 => n += k,
            _ => break,
        }
    }
    let is = |p: &[u8]| {
        buf[..n]
            .strip_prefix(b"GET ")
            .and_then(|r| r.strip_prefix(p))
            .is_some_and(|rest| rest.first().is_some_and(|&c| c == b' ' || c == b'?'))
    };
    let probe = if is(b"/healthz") {
        Some(Probe::Live)
    } else if is(b"/readyz") {
        Some(Probe::Ready)
    } else {
        None
    };
    let (status, body) = match probe {
        Some(p) => match health(p).await {
            Ok(text) => ("200 OK", text),
            Err(why) => ("503 Service Unavailable", format!("{why}\n")),
        },
        None => (
            "503 Service Unavailable",
            format!("{cap} connections open; retry later\n"),
        ),
    };
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let written = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        stream.write_all(answer.as_bytes()),
    )
    .await;
    // A lingering close, as the gateway's: the write side shut, then what
    // the client still sends read and dropped (for at most a second), so
    // the close is a FIN after the answer. Closed with the request unread
    // (one that came after the read above, on a loaded machine), the
    // kernel sends a reset, which can reach the client before it has read
    // the answer: the agent's test saw its read fail that way.
    if matches!(written, Ok(Ok(()))) {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), async move {
            if stream.shutdown().await.is_err() {
                return;
            }
            let mut sink = [0u8; 1024];
            while let Ok(n) = stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
    }
}

/// Why a request to the loopback-bound listener comes from a web page
/// it must not answer ([`gpuscale_policies::listener::refusal`]).
fn browser_refusal<B>(req: &http::Request<B>) -> Option<&'static str> {
    let field = |name| {
        req.headers()
            .get(name)
            .map(|v| v.to_str().unwrap_or("\u{fffd}"))
    };
    gpuscale_policies::listener::refusal(field(header::HOST), field(header::ORIGIN))
}

/// [`serve`] with another header-read timeout.
pub async fn serve_with(
    addr: SocketAddr,
    report: Report,
    mut shutdown: watch::Receiver<bool>,
    header_read_timeout: std::time::Duration,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    // Bound to loopback: what a browser page sends there (a rebound DNS
    // name, another origin) is refused (`gpuscale_policies::listener`).
    let loopback = bound.ip().is_loopback();
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let streams = Arc::new(tokio::sync::Semaphore::new(MAX_EVENT_STREAMS));
    let task = tokio::spawn(async move {
        let mut accept_errors = 0u64;
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            // Out of file descriptors and the like: back
                            // off rather than spin on the error.
                            // Said once per power of two, not per error.
                            accept_errors += 1;
                            if accept_errors.is_power_of_two() {
                                tracing::warn!(errors = accept_errors, "admin accept failed: {e}");
                            }
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                            continue;
                        }
                    };
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tokio::spawn(over_cap(stream, report.clone()));
                        continue;
                    };
                    let report = report.clone();
                    let stopping = shutdown.clone();
                    let streams = streams.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                            let report = report.clone();
                            let stopping = stopping.clone();
                            let streams = streams.clone();
                            async move {
                                if loopback
                                    && let Some(why) = browser_refusal(&req)
                                {
                                    return Ok::<_, Infallible>(respond(StatusCode::FORBIDDEN, "text/plain", format!("{why}\n")));
                                }
                                // Read-only: anything but GET and HEAD is refused.
                                if !matches!(*req.method(), http::Method::GET | http::Method::HEAD) {
                                    let mut r = respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "the admin port is read-only: GET only\n".to_string());
                                    r.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
                                    return Ok::<_, Infallible>(r);
                                }
                                let r = match req.uri().path() {
                                    "/metrics" => {
                                        // OpenMetrics to whoever asks (Prometheus), the
                                        // classic text format otherwise, as the gateway.
                                        let (body, kind) = gpuscale_policies::exposition::negotiate(
                                            req.headers().get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()),
                                            report.metrics(),
                                        );
                                        respond(StatusCode::OK, kind, body)
                                    }
                                    "/healthz" => match report.live() {
                                        Ok(()) => respond(StatusCode::OK, "text/plain", "ok\n".to_string()),
                                        Err(why) => respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
                                    },
                                    "/readyz" => match report.ready() {
                                        Ok(()) => respond(StatusCode::OK, "text/plain", "ready\n".to_string()),
                                        Err(why) => respond(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
                                    },
                                    "/v1/decisions" => respond(
                                        StatusCode::OK,
                                        "application/json",
                                        serde_json::to_string(&report.decisions()).unwrap_or_default(),
                                    ),
                                    "/" | "/dashboard" => respond(StatusCode::OK, "text/html; charset=utf-8", crate::dashboard::PAGE.to_string()),
                                    "/v1/dashboard" => respond(
                                        StatusCode::OK,
                                        "application/json",
                                        serde_json::to_string(&report.dashboard()).unwrap_or_default(),
                                    ),
                                    "/v1/dashboard/events" => dashboard_events(report, stopping, &streams),
                                    _ => respond(StatusCode::NOT_FOUND, "text/plain", "admin endpoints: / (dashboard), /v1/dashboard, /v1/dashboard/events, /metrics, /healthz, /readyz, /v1/decisions\n".to_string()),
                                };
                                Ok::<_, Infallible>(r)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(header_read_timeout)
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    });
                }
                _ = shutdown.changed() => return,
            }
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_client_that_sends_no_head_is_closed_after_the_timeout() {
        let (_stop, stopped) = watch::channel(false);
        let (addr, _task) = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            Report::default(),
            stopped,
            std::time::Duration::from_millis(300),
        )
        .await
        .unwrap();
        // A half-sent head, then silence.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        let started = std::time::Instant::now();
        let mut buf = [0u8; 256];
        let closed = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the connection stayed open");
        assert!(started.elapsed() >= std::time::Duration::from_millis(250));
        // A whole request is still served.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    }
}
