//! The autoscaler's admin listener: `/metrics` (OpenMetrics), `/healthz`
//! (503 once the control loop has stopped or stalled), `/readyz` (503
//! while metric reads keep failing, at or past the fallback threshold),
//! and `/v1/decisions` (the last decision per model, with its sentence,
//! and the recent changes). Read-only; at most [`MAX_CONNECTIONS`] open
//! connections (one more is closed at once).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode, header};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::controller::Report;

/// Time a client has to send a request head (also the keep-alive idle
/// limit): a connection that sends nothing is closed after it.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Most connections open at once; another is closed as soon as it is
/// accepted.
pub const MAX_CONNECTIONS: usize = 256;

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

/// [`serve`] with another header-read timeout.
pub async fn serve_with(
    addr: SocketAddr,
    report: Report,
    mut shutdown: watch::Receiver<bool>,
    header_read_timeout: std::time::Duration,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            // Out of file descriptors and the like: back
                            // off rather than spin on the error.
                            tracing::warn!("admin accept failed: {e}");
                            tokio::time::sleep(ACCEPT_BACKOFF).await;
                            continue;
                        }
                    };
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        drop(stream);
                        continue;
                    };
                    let report = report.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                            let report = report.clone();
                            async move {
                                let (status, kind, body) = match req.uri().path() {
                                    "/metrics" => (StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", report.metrics()),
                                    "/healthz" => match report.live() {
                                        Ok(()) => (StatusCode::OK, "text/plain", "ok\n".to_string()),
                                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
                                    },
                                    "/readyz" => match report.ready() {
                                        Ok(()) => (StatusCode::OK, "text/plain", "ready\n".to_string()),
                                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{why}\n")),
                                    },
                                    "/v1/decisions" => (
                                        StatusCode::OK,
                                        "application/json",
                                        serde_json::to_string(&report.decisions()).unwrap_or_default(),
                                    ),
                                    _ => (StatusCode::NOT_FOUND, "text/plain", "admin endpoints: /metrics, /healthz, /readyz, /v1/decisions\n".to_string()),
                                };
                                let mut r = Response::new(Full::new(Bytes::from(body)));
                                *r.status_mut() = status;
                                r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
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
        s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    }
}
