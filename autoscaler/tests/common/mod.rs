//! What the autoscaler's integration tests share: a stand-in gateway
//! admin API and a small HTTP client for the autoscaler's own.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use http::{Method, Request, Response};
use serde_json::{Value, json};

/// A `/v1/queues` document for the test model with nothing waiting,
/// nothing in flight and nothing arriving.
pub fn quiet() -> Value {
    queues(0)
}

/// A `/v1/queues` document for the test model with `waiting` requests
/// queued and nothing else.
pub fn queues(waiting: u32) -> Value {
    json!({"models": {"meta-llama/Llama-3.1-8B-Instruct": {
        "waiting": waiting, "in_flight": 0, "replicas": 1,
        "arrival_rate": {"1s": 0.0, "10s": 0.0, "60s": 0.0}}}})
}

/// A stand-in for the gateway's admin API: `GET /v1/queues` answers
/// `queues`, other reads `{}`; every write is recorded as `METHOD body`.
pub async fn stand_in_gateway(queues: Value) -> (String, Arc<Mutex<Vec<String>>>) {
    use http_body_util::BodyExt;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let s = s.clone();
            let queues = queues.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let s = s.clone();
                    let queues = queues.clone();
                    async move {
                        let method = req.method().clone();
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        if method == Method::GET {
                            // Reads: a quiet gateway.
                            let doc = if path == "/v1/queues" {
                                queues.clone()
                            } else {
                                json!({})
                            };
                            return Ok::<_, std::convert::Infallible>(Response::new(
                                http_body_util::Full::new(bytes::Bytes::from(doc.to_string())),
                            ));
                        }
                        s.lock()
                            .unwrap()
                            .push(format!("{method} {}", String::from_utf8_lossy(&body)));
                        Ok(Response::new(http_body_util::Full::new(
                            bytes::Bytes::from("[]"),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), seen)
}

/// A blocking-free HTTP GET against the admin listener: (status, body).
pub async fn admin_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    (status, text.split_once("\r\n\r\n").unwrap().1.to_string())
}
