//! What the autoscaler's integration tests share: a stand-in gateway
//! admin API and a small HTTP client for the autoscaler's own.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
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

/// What the stand-in gateway holds: the writes it was sent (`METHOD
/// body`), and its replica list per model (emptied to play a restart).
#[derive(Clone, Default)]
pub struct StandIn {
    /// Every write, in order.
    pub seen: Arc<Mutex<Vec<String>>>,
    /// model → endpoints, as `POST` / `DELETE /v1/replicas` left them.
    pub replicas: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    /// With `drain` set, a `DELETE` moves the endpoint here, listed as
    /// draining (its requests not done yet), until the test empties it.
    pub draining: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
    /// Whether a `DELETE` leaves the endpoint draining.
    pub drain: Arc<std::sync::atomic::AtomicBool>,
}

impl StandIn {
    /// The endpoints registered for `served` now (not draining).
    pub fn listed(&self, served: &str) -> BTreeSet<String> {
        Self::of(&self.replicas, served)
    }

    /// The endpoints of `served` deregistered and still draining.
    pub fn draining_of(&self, served: &str) -> BTreeSet<String> {
        Self::of(&self.draining, served)
    }

    fn of(set: &Mutex<BTreeMap<String, BTreeSet<String>>>, served: &str) -> BTreeSet<String> {
        set.lock().unwrap().get(served).cloned().unwrap_or_default()
    }
}

/// A stand-in for the gateway's admin API: `GET /v1/queues` answers
/// `queues`, `GET /v1/replicas` the list the writes built, other reads
/// `{}`; every write is recorded.
pub async fn stand_in_gateway(queues: Value) -> (String, StandIn) {
    use http_body_util::BodyExt;
    let state = StandIn::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let st = state.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let st = st.clone();
            let queues = queues.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let st = st.clone();
                    let queues = queues.clone();
                    async move {
                        let method = req.method().clone();
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let doc = if method == Method::GET {
                            match path.as_str() {
                                "/v1/queues" => queues.clone(),
                                "/v1/replicas" => {
                                    let mut lists: BTreeMap<String, Vec<Value>> = BTreeMap::new();
                                    for (m, e) in st.replicas.lock().unwrap().iter() {
                                        lists.entry(m.clone()).or_default().extend(
                                            e.iter().map(
                                                |e| json!({"endpoint": e, "configured": false}),
                                            ),
                                        );
                                    }
                                    for (m, e) in st.draining.lock().unwrap().iter() {
                                        lists.entry(m.clone()).or_default().extend(e.iter().map(
                                            |e| json!({"endpoint": e, "configured": false, "draining": true}),
                                        ));
                                    }
                                    json!(lists)
                                }
                                _ => json!({}),
                            }
                        } else {
                            st.seen
                                .lock()
                                .unwrap()
                                .push(format!("{method} {}", String::from_utf8_lossy(&body)));
                            let v: Value = serde_json::from_slice(&body).unwrap_or_default();
                            if let (Some(m), Some(e)) =
                                (v["model"].as_str(), v["endpoint"].as_str())
                            {
                                let mut r = st.replicas.lock().unwrap();
                                let list = r.entry(m.to_string()).or_default();
                                if method == Method::POST {
                                    list.insert(e.to_string());
                                } else if list.remove(e)
                                    && st.drain.load(std::sync::atomic::Ordering::SeqCst)
                                {
                                    st.draining
                                        .lock()
                                        .unwrap()
                                        .entry(m.to_string())
                                        .or_default()
                                        .insert(e.to_string());
                                }
                            }
                            json!([])
                        };
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(doc.to_string()),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), state)
}

/// A blocking-free HTTP GET against the admin listener: (status, body).
pub async fn admin_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    (status, text.split_once("\r\n\r\n").unwrap().1.to_string())
}

/// Autoscaler settings as a user writes them: a ModelPolicy `llama`
/// (`policy_spec` lines appended to its spec, indented two spaces) and a
/// `kind: Autoscaler` pointing at the gateway admin API `gateway`
/// (`spec_lines` appended to its spec), loaded as the binary loads them.
pub fn settings(
    gateway: &str,
    policy_spec: &str,
    spec_lines: &str,
) -> gpuscale_autoscaler::config::Settings {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policies.yaml"),
        format!("apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: llama\nspec:\n  servedName: meta-llama/Llama-3.1-8B-Instruct\n  resources:\n    memoryGiB: 21\n    compute: 0.3\n    maxConcurrency: 32\n{policy_spec}"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("autoscaler.yaml"),
        format!("apiVersion: gpuscale.io/v1alpha1\nkind: Autoscaler\nmetadata: {{name: t}}\nspec:\n  policies: [policies.yaml]\n  gateway: {{admin: \"{gateway}\"}}\n  admin: 127.0.0.1:0\n{spec_lines}"),
    )
    .unwrap();
    gpuscale_autoscaler::config::load(&dir.path().join("autoscaler.yaml")).unwrap()
}
