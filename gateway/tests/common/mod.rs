//! Helpers for the gateway's socket tests: a gateway on 127.0.0.1:0, a
//! gated upstream whose requests finish only when the test says so, and a
//! small HTTP client.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gpuscale_gateway::auth::AdminToken;
use gpuscale_gateway::config::{GatewaySpec, ModelSpec};
use gpuscale_gateway::{Running, Settings};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The admin token the test gateways are started with.
pub const TOKEN: &str = "test-admin-token-0123456789";

/// The header that carries it.
pub const AUTH: (&str, &str) = ("authorization", "Bearer test-admin-token-0123456789");

/// A gateway spec listening on free loopback ports; shutdown does not
/// wait for endpoint removal (`drain.announce` 0).
pub fn spec(models: Vec<ModelSpec>) -> GatewaySpec {
    let mut s: GatewaySpec = serde_json::from_value(serde_json::json!({})).unwrap();
    s.listen = "127.0.0.1:0".parse().unwrap();
    s.admin = "127.0.0.1:0".parse().unwrap();
    s.models = models;
    s.drain.announce = Duration::ZERO;
    s
}

/// A model entry.
pub fn model(name: &str, replicas: &[SocketAddr], max_concurrency: u32) -> ModelSpec {
    ModelSpec {
        name: name.into(),
        max_concurrency: Some(max_concurrency),
        max_queue: None,
        queue_timeout: None,
        order: None,
        priority: None,
        replicas: replicas.iter().map(|a| format!("http://{a}")).collect(),
        metrics: Default::default(),
        adapters: Vec::new(),
    }
}

/// Starts a gateway with the admin token [`TOKEN`].
pub async fn gateway(spec: GatewaySpec) -> Running {
    let mut settings = Settings::from_spec("test", spec, &[]).unwrap();
    settings.admin_token = Some(AdminToken::from_secret(TOKEN).unwrap());
    gpuscale_gateway::start(settings).await.unwrap()
}

/// An upstream that answers `{"server": NAME, "path": …, "model_header": …}`
/// once the test releases a permit (or at once when `open`).
pub struct Gated {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Permits to finish requests.
    pub gate: Arc<Semaphore>,
    /// Requests received.
    pub received: Arc<AtomicU64>,
}

/// Starts a gated upstream named `name`; `open` lets everything through.
pub async fn gated(name: &'static str, open: bool) -> Gated {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gate = Arc::new(Semaphore::new(if open {
        Semaphore::MAX_PERMITS
    } else {
        0
    }));
    let received = Arc::new(AtomicU64::new(0));
    let (g, r) = (gate.clone(), received.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (g, r) = (g.clone(), r.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let (g, r) = (g.clone(), r.clone());
                    async move {
                        r.fetch_add(1, Ordering::SeqCst);
                        let path = req.uri().path().to_string();
                        let header = req
                            .headers()
                            .get("x-gpuscale-model")
                            .and_then(|v| v.to_str().ok())
                            .map(str::to_string);
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        g.acquire().await.unwrap().forget();
                        let v = serde_json::json!({
                            "server": name,
                            "path": path,
                            "model_header": header,
                            "body_len": body.len(),
                        });
                        Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                            v.to_string(),
                        ))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Gated {
        addr,
        gate,
        received,
    }
}

/// A plain client.
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// A finished response: status, headers, body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// Asserts a 200 whose JSON names `server` (the upstreams of
    /// [`gated`] and the tests' own say who answered).
    pub fn assert_served_by(&self, server: &str) {
        assert_eq!(
            self.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(self.json()["server"], server);
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Sends a request and reads the whole answer.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Answer {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Full::new(body.into())).unwrap();
    let resp = client().request(req).await.expect("request");
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// `POST path` with a JSON body naming `model`.
pub async fn post_model(addr: SocketAddr, path: &str, model: &str) -> Answer {
    let body =
        serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hello"}]});
    send(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

/// `/v1/queues` for one model.
pub async fn queue(admin: SocketAddr, model: &str) -> serde_json::Value {
    let a = send(admin, "GET", "/v1/queues", &[], Bytes::new()).await;
    assert_eq!(a.status, StatusCode::OK);
    a.json()["models"][model].clone()
}

/// Waits until `check` holds on the model's queue view (at most 5 s).
pub async fn wait_queue(
    admin: SocketAddr,
    model: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let q = queue(admin, model).await;
        if check(&q) {
            return q;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "queue never reached the state: {q}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The admin `/metrics` text.
pub async fn metrics(admin: SocketAddr) -> String {
    let a = send(admin, "GET", "/metrics", &[], Bytes::new()).await;
    String::from_utf8(a.body.to_vec()).unwrap()
}

/// The value of one sample line in metrics text (`name{labels}`).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    })
}
