//! The per-worker connection pool against raw loopback sockets: keep-alive
//! reuse, a connection the replica closed is replaced without an error, a
//! response cut short closes its connection, connect failures say so.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gpuscale_gateway::Endpoint;
use gpuscale_gateway::upstream::Upstream;
use http::Request;
use http_body_util::{BodyExt, Full};
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

fn get(endpoint: &Endpoint) -> Request<Full<Bytes>> {
    Request::get("/x")
        .header(http::header::HOST, endpoint.host_header().clone())
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn fetch(up: &Upstream, endpoint: &Endpoint) -> Bytes {
    let (resp, lease) = up.send(endpoint, get(endpoint)).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    lease.release();
    body
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
    let leases: Vec<_> = futures_join(&up, &endpoint, 3).await;
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
    for l in leases {
        l.release();
    }
    assert_eq!(up.idle(&endpoint), 3);
    for _ in 0..3 {
        fetch(&up, &endpoint).await;
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

/// `n` requests in flight at once, bodies read, leases held.
async fn futures_join(
    up: &Upstream,
    endpoint: &Endpoint,
    n: usize,
) -> Vec<gpuscale_gateway::upstream::Lease> {
    let mut leases = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..n {
        pending.push(up.send(endpoint, get(endpoint)));
    }
    for p in pending {
        let (resp, lease) = p.await.unwrap();
        resp.into_body().collect().await.unwrap();
        leases.push(lease);
    }
    leases
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
    let (resp, lease) = up.send(&endpoint, get(&endpoint)).await.unwrap();
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"hi"));
    drop(body);
    drop(lease);
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
    let err = match up.send(&endpoint, get(&endpoint)).await {
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
