//! The per-worker connection pool and its HTTP/1.1 client against raw
//! loopback sockets: keep-alive reuse, a connection the replica closed is
//! replaced without an error (and swept when idle), a response cut short
//! closes its connection, connect failures say so; the exact request bytes
//! on the wire, chunked and close-delimited bodies, a truncated body.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gpuscale_gateway::Endpoint;
use gpuscale_gateway::upstream::{Outgoing, SendError, Upstream, UpstreamBody};
use http::{HeaderMap, Method, Response};
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// A replica that answers every request on a connection with `ok`, and
/// closes each connection after `requests_per_connection` answers.
/// Returns its endpoint and the count of connections it accepted.
async fn replica(requests_per_connection: usize) -> (Endpoint, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                for _ in 0..requests_per_connection {
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    if s.write_all(RESPONSE).await.is_err() {
                        return;
                    }
                }
                // Closes the connection (dropped).
            });
        }
    });
    (
        Endpoint::parse(&format!("http://{addr}")).unwrap(),
        accepted,
    )
}

/// `GET /x`: its response head, or why there is none.
async fn try_get(up: &Upstream, endpoint: &Endpoint) -> Result<Response<UpstreamBody>, SendError> {
    let (headers, body) = (HeaderMap::new(), Bytes::new());
    let req = Outgoing {
        method: &Method::GET,
        target: "/x",
        headers: &headers,
        body: &body,
    };
    up.send(endpoint, req).await
}

/// `GET /x`, its response head.
async fn get(up: &Upstream, endpoint: &Endpoint) -> Response<UpstreamBody> {
    try_get(up, endpoint).await.unwrap()
}

/// `GET /x`, its body read to the end (the connection back in the pool).
async fn fetch(up: &Upstream, endpoint: &Endpoint) -> Bytes {
    let resp = get(up, endpoint).await;
    resp.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn sequential_requests_share_one_keep_alive_connection() {
    let (endpoint, accepted) = replica(usize::MAX).await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    for _ in 0..5 {
        assert_eq!(fetch(&up, &endpoint).await, Bytes::from_static(b"ok"));
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    assert_eq!(up.idle(&endpoint), 1);
}

#[tokio::test]
async fn concurrent_requests_open_one_connection_each_then_reuse_them() {
    let (endpoint, accepted) = replica(usize::MAX).await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    // Three response heads in hand, their bodies unread: three connections.
    let mut heads = Vec::new();
    for _ in 0..3 {
        heads.push(get(&up, &endpoint).await);
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    assert_eq!(up.idle(&endpoint), 0);
    for h in heads {
        h.into_body().collect().await.unwrap();
    }
    assert_eq!(up.idle(&endpoint), 3);
    for _ in 0..3 {
        fetch(&up, &endpoint).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_connection_the_replica_closed_is_replaced_without_an_error() {
    // One answer per connection, then the replica closes it.
    let (endpoint, accepted) = replica(1).await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    for _ in 0..4 {
        assert_eq!(fetch(&up, &endpoint).await, Bytes::from_static(b"ok"));
        // Give the connection's task a moment to see the close (or not:
        // a request that could not start on it is sent again anyway).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_response_cut_short_closes_its_connection() {
    // A replica that sends the head and one chunk, then waits.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
            .await
            .unwrap();
        // EOF once the client side closes.
        let n = s.read(&mut buf).await.unwrap_or(0);
        let _ = closed_tx.send(n);
    });
    let endpoint = Endpoint::parse(&format!("http://{addr}")).unwrap();
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    let mut body = get(&up, &endpoint).await.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"hi"));
    drop(body);
    let n = tokio::time::timeout(Duration::from_secs(5), closed_rx)
        .await
        .expect("the replica saw its connection close")
        .unwrap();
    assert_eq!(n, 0);
    assert_eq!(up.idle(&endpoint), 0);
}

#[tokio::test]
async fn a_refused_connect_is_a_connect_error() {
    // A port nobody listens on: bind, note, close.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let endpoint = Endpoint::parse(&format!("http://{addr}")).unwrap();
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    let err = match try_get(&up, &endpoint).await {
        Ok(_) => panic!("nobody listens there"),
        Err(e) => e,
    };
    assert!(err.is_connect(), "{err}");
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

#[tokio::test]
async fn a_connection_idle_past_the_idle_timeout_is_closed_not_reused() {
    let (endpoint, accepted) = replica(usize::MAX).await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_millis(50));
    fetch(&up, &endpoint).await;
    assert_eq!(up.idle(&endpoint), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    fetch(&up, &endpoint).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    assert_eq!(up.idle(&endpoint), 1);
}

/// A replica that reads one request head (and `content-length` bytes of
/// body), hands what it read to the test, answers with `response`, and
/// keeps the connection open until the client closes it.
async fn recording_replica(
    response: &'static [u8],
) -> (Endpoint, tokio::sync::mpsc::Receiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 4096];
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                if got.len() >= end + 4 + len {
                    break;
                }
            }
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client closed before sending its request");
            got.extend_from_slice(&buf[..n]);
        }
        tx.send(got).await.unwrap();
        s.write_all(response).await.unwrap();
        let _ = s.read(&mut buf).await;
    });
    (Endpoint::parse(&format!("http://{addr}")).unwrap(), rx)
}

#[tokio::test]
async fn the_request_goes_out_with_the_replicas_host_its_length_and_end_to_end_headers() {
    let (endpoint, mut seen) =
        recording_replica(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    let mut headers = HeaderMap::new();
    for (k, v) in [
        ("host", "gateway.example"),
        ("content-length", "999"),
        ("connection", "keep-alive, x-hop"),
        ("x-hop", "1"),
        ("transfer-encoding", "chunked"),
        ("authorization", "Bearer t"),
    ] {
        headers.insert(k, v.parse().unwrap());
    }
    let body = Bytes::from_static(br#"{"model":"m"}"#);
    let req = Outgoing {
        method: &Method::POST,
        target: "/v1/completions?stream=false",
        headers: &headers,
        body: &body,
    };
    let resp = up.send(&endpoint, req).await.unwrap();
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");
    let wire = String::from_utf8(seen.recv().await.unwrap()).unwrap();
    assert_eq!(
        wire,
        format!(
            "POST /v1/completions?stream=false HTTP/1.1\r\nhost: {}\r\n\
             authorization: Bearer t\r\ncontent-length: 13\r\n\r\n{{\"model\":\"m\"}}",
            endpoint.authority()
        )
    );
}

#[tokio::test]
async fn a_chunked_response_streams_decoded_and_frees_its_connection_at_the_end() {
    let (endpoint, _seen) = recording_replica(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
          6\r\ndata: \r\n3\r\nhi\n\r\n0\r\n\r\n",
    )
    .await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    let resp = get(&up, &endpoint).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(!resp.headers().contains_key("transfer-encoding"));
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "data: hi\n");
    assert_eq!(up.idle(&endpoint), 1);
}

/// A replica that reads one request, writes `pieces` 20 ms apart, and
/// closes the connection.
async fn closing_replica(pieces: &'static [&'static [u8]]) -> Endpoint {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        let _ = s.read(&mut buf).await.unwrap();
        for (i, piece) in pieces.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            s.write_all(piece).await.unwrap();
        }
    });
    Endpoint::parse(&format!("http://{addr}")).unwrap()
}

#[tokio::test]
async fn a_response_without_length_runs_to_the_close_and_is_not_pooled() {
    let endpoint = closing_replica(&[b"HTTP/1.1 200 OK\r\n\r\nuntil ", b"the end"]).await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    let body = fetch(&up, &endpoint).await;
    assert_eq!(body, "until the end");
    assert_eq!(up.idle(&endpoint), 0);
}

#[tokio::test]
async fn a_response_cut_before_its_length_is_an_error() {
    let endpoint = closing_replica(&[b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort"]).await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    let err = get(&up, &endpoint)
        .await
        .into_body()
        .collect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("before the end"), "{err}");
    assert_eq!(up.idle(&endpoint), 0);
}

#[tokio::test]
async fn an_idle_connection_the_replica_closed_is_swept_without_traffic() {
    let (endpoint, _) = replica(1).await;
    let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(90));
    fetch(&up, &endpoint).await;
    // The replica closes after one answer; the sweep (every second)
    // notices long before the idle timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while up.idle(&endpoint) > 0 {
        assert!(std::time::Instant::now() < deadline, "never swept");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
