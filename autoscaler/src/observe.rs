//! Signals from the gateway, over its admin API: `GET /v1/queues` (pull),
//! `GET /v1/queues/stream` (push: every change and every scale-from-zero
//! signal, for sub-second reaction), and the discovery calls the backends
//! make (`POST` / `DELETE /v1/replicas`). [`observations`] turns a
//! `/v1/queues` document into the recommender's [`Observation`]s (pure).
//!
//! One [`GatewayClient`] speaks to every instance of the gateway (2 or
//! more central replicas for availability; in Kubernetes their addresses
//! come from the gateway Service's EndpointSlices):
//! - the queue documents of all instances are summed per model
//!   ([`merge_queues`]); an instance that cannot be read fails the read,
//!   it does not count as an empty queue;
//! - a replica is registered with every instance, each taking an equal
//!   share of its `maxConcurrency` (`max(1, limit / instances)`), so the
//!   replica never has more than its limit in flight however the
//!   instances' traffic is spread; the shares follow membership changes
//!   (the backends register again when the set of instances changes).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

use crate::recommend::Observation;

/// Why talking to the gateway failed.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// Transport or HTTP failure.
    #[error("gateway {url}: {message}")]
    Gateway {
        /// What was asked.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// What the push stream delivers.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A fresh `/v1/queues` document.
    Queues(serde_json::Value),
    /// A request for a model with no replica.
    ScaleFromZero {
        /// Served model name.
        model: String,
    },
}

/// Per served model name, the observation in a `/v1/queues` document.
pub fn observations(view: &serde_json::Value) -> BTreeMap<String, Observation> {
    let ms = |v: &serde_json::Value| v.as_f64().map(|x| Duration::from_secs_f64(x / 1e3));
    view.get("models")
        .and_then(|m| m.as_object())
        .map(|models| {
            models
                .iter()
                .map(|(name, q)| {
                    let num = |k: &str| q.get(k).and_then(|v| v.as_f64()).unwrap_or(0.0);
                    (
                        name.clone(),
                        Observation {
                            // Requests waiting inside the model servers
                            // (their own metrics, when the gateway scrapes
                            // them) wait too.
                            waiting: num("waiting") + num("server_waiting"),
                            in_flight: num("in_flight"),
                            // Little's law over matched windows: arrivals
                            // and service time both over the last 10 s
                            // (a gateway without the 10 s figure: its
                            // 60 s p50).
                            arrival_rate: q
                                .get("arrival_rate")
                                .and_then(|r| r.get("10s"))
                                .and_then(|v| v.as_f64())
                                .unwrap_or(0.0),
                            service_time: q
                                .get("latency_p50_10s_ms")
                                .or_else(|| q.get("latency_p50_ms"))
                                .and_then(|v| v.as_f64())
                                .map(|x| x / 1e3),
                            ready: q.get("replicas").and_then(|v| v.as_f64()),
                            prefill_busy: q.get("prefill_busy").and_then(|v| v.as_f64()),
                            queue_wait_p95: q.get("queue_wait_p95_ms").and_then(ms),
                            ttft_p95: q.get("ttft_p95_ms").and_then(ms),
                            latency_p95: q.get("latency_p95_ms").and_then(ms),
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Longest silence on the queue stream before it is dropped and opened
/// again (the gateway sends at least every second).
pub const STREAM_IDLE: Duration = Duration::from_secs(5);

/// Most bytes buffered without an event boundary before the stream is
/// dropped.
pub const MAX_EVENT_BYTES: usize = 4 << 20;

/// One replica in an instance's `GET /v1/replicas`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Listed {
    endpoint: String,
    configured: bool,
    draining: bool,
}

/// The gateway instances' replica lists, per served model name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaLists {
    /// Endpoints every instance lists.
    pub everywhere: BTreeMap<String, Vec<String>>,
    /// Endpoints some instance holds as registered through the API (not
    /// written in its file) and not draining.
    pub registered: BTreeMap<String, BTreeSet<String>>,
    /// Endpoints some instance lists, in any state (a deregistered one
    /// stays listed, draining, until its last request ends).
    pub anywhere: BTreeMap<String, BTreeSet<String>>,
}

/// A client of the gateway's admin API, on every instance of it.
#[derive(Clone)]
pub struct GatewayClient {
    bases: Arc<RwLock<Arc<Vec<String>>>>,
    client: Client<HttpConnector, Full<Bytes>>,
    // `Bearer <token>`, marked sensitive (kept out of debug output).
    authorization: Option<http::HeaderValue>,
}

impl GatewayClient {
    /// A client for the admin API at `base` (`http://host:port`).
    pub fn new(base: &str) -> Self {
        Self::new_many(vec![base.to_string()])
    }

    /// A client for the admin APIs of several instances of the gateway.
    pub fn new_many(bases: Vec<String>) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        GatewayClient {
            bases: Arc::new(RwLock::new(Arc::new(normalise(bases)))),
            client: Client::builder(TokioExecutor::new()).build(connector),
            authorization: None,
        }
    }

    /// The instances now.
    pub fn bases(&self) -> Arc<Vec<String>> {
        self.bases.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the instances (discovered anew); `true` when the set changed
    /// (the shares of every replica's limit change with it).
    pub fn set_bases(&self, bases: Vec<String>) -> bool {
        let bases = normalise(bases);
        let mut now = self.bases.write().unwrap_or_else(|e| e.into_inner());
        if **now == bases {
            return false;
        }
        *now = Arc::new(bases);
        true
    }

    /// The first instance (the one address of a single gateway).
    pub fn base(&self) -> String {
        self.bases().first().cloned().unwrap_or_default()
    }

    /// Sends `token` as the admin API's bearer token on every call.
    pub fn with_token(mut self, token: &str) -> Result<Self, ObserveError> {
        let mut value =
            http::HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
                ObserveError::Gateway {
                    url: self.base(),
                    message: "the admin token is not a valid header value".into(),
                }
            })?;
        value.set_sensitive(true);
        self.authorization = Some(value);
        Ok(self)
    }

    /// Whether every instance that answers takes this client's changes:
    /// a `POST /v1/replicas` with an empty body (authentication comes
    /// before the body is read, so an accepted token gets 400 and nothing
    /// changes). A 401 (the token is wrong or missing) or a 403 (the
    /// gateway has no token, so it takes no changes) is an error: every
    /// registration would be refused and retried for ever. An instance
    /// that does not answer yet is no error (it may still be starting).
    pub async fn check_admin_access(&self) -> Result<(), ObserveError> {
        for base in self.bases().iter() {
            let Ok((status, text)) = self
                .call(
                    base,
                    Method::POST,
                    "/v1/replicas",
                    Some(serde_json::json!({})),
                )
                .await
            else {
                continue;
            };
            let why = match status {
                StatusCode::UNAUTHORIZED => {
                    "refuses the admin token (401): check spec.gateway.adminTokenFile \
                     (or the token file given) against the gateway's"
                }
                StatusCode::FORBIDDEN => {
                    "takes no changes (403): the gateway has no admin token configured"
                }
                _ => continue,
            };
            return Err(ObserveError::Gateway {
                url: format!("{base}/v1/replicas"),
                message: format!("{why} ({})", String::from_utf8_lossy(&text).trim()),
            });
        }
        Ok(())
    }

    fn request(&self, method: Method, url: &str) -> http::request::Builder {
        let mut b = Request::builder().method(method).uri(url);
        if let Some(a) = &self.authorization {
            b = b.header(http::header::AUTHORIZATION, a.clone());
        }
        b
    }

    async fn call(
        &self,
        base: &str,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(StatusCode, Bytes), ObserveError> {
        let url = format!("{base}{path}");
        let err = |message: String| ObserveError::Gateway {
            url: url.clone(),
            message,
        };
        let req = self
            .request(method, &url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .map_err(|e| err(e.to_string()))?;
        let resp = tokio::time::timeout(Duration::from_secs(5), self.client.request(req))
            .await
            .map_err(|_| err("timed out".into()))?
            .map_err(|e| err(e.to_string()))?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), 16 << 20)
            .collect()
            .await
            .map_err(|e| err(e.to_string()))?
            .to_bytes();
        Ok((status, bytes))
    }

    /// `GET path` as JSON (a 200 answer only).
    pub async fn get_json(&self, path: &str) -> Result<serde_json::Value, ObserveError> {
        let base = self.base();
        let (status, body) = self.call(&base, Method::GET, path, None).await?;
        let err = |message: String| ObserveError::Gateway {
            url: format!("{base}{path}"),
            message,
        };
        if status != StatusCode::OK {
            return Err(err(format!("status {status}")));
        }
        serde_json::from_slice(&body).map_err(|e| err(e.to_string()))
    }

    /// `GET /v1/queues` of one instance.
    async fn queues_at(&self, base: &str) -> Result<serde_json::Value, ObserveError> {
        let (status, body) = self.call(base, Method::GET, "/v1/queues", None).await?;
        if status != StatusCode::OK {
            return Err(ObserveError::Gateway {
                url: format!("{base}/v1/queues"),
                message: format!("status {status}"),
            });
        }
        serde_json::from_slice(&body).map_err(|e| ObserveError::Gateway {
            url: format!("{base}/v1/queues"),
            message: e.to_string(),
        })
    }

    /// `GET /v1/queues` of every instance, summed per model
    /// ([`merge_queues`]); one instance that cannot be read fails it.
    pub async fn queues(&self) -> Result<serde_json::Value, ObserveError> {
        let bases = self.bases();
        if bases.len() == 1 {
            return self.queues_at(&bases[0]).await;
        }
        let mut set = tokio::task::JoinSet::new();
        for (i, b) in bases.iter().enumerate() {
            let (this, b) = (self.clone(), b.clone());
            set.spawn(async move { (i, this.queues_at(&b).await) });
        }
        let mut docs = vec![serde_json::Value::Null; bases.len()];
        while let Some(done) = set.join_next().await {
            let (i, doc) = done.map_err(|e| ObserveError::Gateway {
                url: bases.join(", "),
                message: e.to_string(),
            })?;
            docs[i] = doc?;
        }
        Ok(merge_queues(&docs))
    }

    /// Registers (`true`) or deregisters a replica with every instance:
    /// each takes `max(1, max_concurrency / instances)` of its limit.
    /// Every instance is tried; the first failure is returned (the caller
    /// tries again later). Deregistering a replica an instance does not
    /// know is no failure.
    pub async fn replica(
        &self,
        register: bool,
        model: &str,
        endpoint: &str,
        max_concurrency: Option<u32>,
    ) -> Result<(), ObserveError> {
        let bases = self.bases();
        let share = max_concurrency.map(|c| share_of(c, bases.len()));
        let mut body = serde_json::json!({"model": model, "endpoint": endpoint});
        if let Some(c) = share {
            body["maxConcurrency"] = c.into();
        }
        let method = if register {
            Method::POST
        } else {
            Method::DELETE
        };
        let mut first_error = None;
        for base in bases.iter() {
            let result = self
                .call(base, method.clone(), "/v1/replicas", Some(body.clone()))
                .await;
            let failure = match result {
                Ok((status, _)) if status.is_success() => None,
                Ok((StatusCode::NOT_FOUND, text)) if !register => {
                    // Not a replica there: gone already. (An unknown
                    // model is a 404 too, and a failure.)
                    let t = String::from_utf8_lossy(&text);
                    t.contains("is not configured")
                        .then(|| ObserveError::Gateway {
                            url: format!("{base}/v1/replicas"),
                            message: format!("status 404: {t}"),
                        })
                }
                Ok((status, text)) => Some(ObserveError::Gateway {
                    url: format!("{base}/v1/replicas"),
                    message: format!("status {status}: {}", String::from_utf8_lossy(&text)),
                }),
                Err(e) => Some(e),
            };
            if let Some(e) = failure
                && first_error.is_none()
            {
                first_error = Some(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// `GET /v1/replicas` of one instance.
    async fn replica_list_at(
        &self,
        base: &str,
    ) -> Result<BTreeMap<String, Vec<Listed>>, ObserveError> {
        let url = format!("{base}/v1/replicas");
        let (status, body) = self.call(base, Method::GET, "/v1/replicas", None).await?;
        if status != StatusCode::OK {
            return Err(ObserveError::Gateway {
                url,
                message: format!("status {status}"),
            });
        }
        let v: BTreeMap<String, Vec<serde_json::Value>> =
            serde_json::from_slice(&body).map_err(|e| ObserveError::Gateway {
                url,
                message: e.to_string(),
            })?;
        Ok(v.into_iter()
            .map(|(model, replicas)| {
                let endpoints = replicas
                    .iter()
                    .filter_map(|r| {
                        let endpoint = r.get("endpoint")?.as_str()?.to_string();
                        let flag =
                            |k: &str, or: bool| r.get(k).and_then(|f| f.as_bool()).unwrap_or(or);
                        Some(Listed {
                            endpoint,
                            // A gateway that does not say is taken to
                            // have configured it: never removed.
                            configured: flag("configured", true),
                            draining: flag("draining", false),
                        })
                    })
                    .collect();
                (model, endpoints)
            })
            .collect())
    }

    /// `GET /v1/replicas`: the endpoints every instance lists, per served
    /// model name (one an instance lacks is not listed: it is registered
    /// again, with every instance).
    pub async fn replica_list(&self) -> Result<BTreeMap<String, Vec<String>>, ObserveError> {
        Ok(self.replica_lists().await?.everywhere)
    }

    /// `GET /v1/replicas` of every instance: what every instance lists,
    /// and what any instance holds as registered through the API and not
    /// draining (what a controller that registered it may have to
    /// remove).
    pub async fn replica_lists(&self) -> Result<ReplicaLists, ObserveError> {
        let bases = self.bases();
        let mut lists = Vec::new();
        for b in bases.iter() {
            lists.push(self.replica_list_at(b).await?);
        }
        let mut out = ReplicaLists::default();
        for list in &lists {
            for (model, entries) in list {
                let registered = out.registered.entry(model.clone()).or_default();
                for e in entries.iter().filter(|e| !e.configured && !e.draining) {
                    registered.insert(e.endpoint.clone());
                }
                let anywhere = out.anywhere.entry(model.clone()).or_default();
                anywhere.extend(entries.iter().map(|e| e.endpoint.clone()));
            }
        }
        let Some(first) = lists.first() else {
            return Ok(out);
        };
        out.everywhere = first
            .iter()
            .map(|(model, entries)| {
                let kept = entries
                    .iter()
                    .map(|e| &e.endpoint)
                    .filter(|e| {
                        lists[1..].iter().all(|l| {
                            l.get(model)
                                .is_some_and(|x| x.iter().any(|y| &y.endpoint == *e))
                        })
                    })
                    .cloned()
                    .collect();
                (model.clone(), kept)
            })
            .collect();
        Ok(out)
    }

    /// Follows `/v1/queues/stream` of every instance, reconnecting after
    /// a second when one drops; events arrive on the returned channel
    /// until it is dropped. With several instances a queue document is
    /// the sum of each instance's newest ([`merge_queues`]), sent once
    /// every instance has sent one; scale-from-zero signals pass at once.
    /// The channel closes when the set of instances changes (the caller
    /// opens a new stream).
    pub fn stream(&self) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::channel(4);
        let bases = self.bases();
        if bases.len() == 1 {
            self.follow_into(bases[0].clone(), tx);
            return rx;
        }
        let (itx, mut irx) = mpsc::channel::<(usize, Event)>(16);
        for (i, b) in bases.iter().enumerate() {
            let (ftx, mut frx) = mpsc::channel(4);
            self.follow_into(b.clone(), ftx);
            let itx = itx.clone();
            tokio::spawn(async move {
                while let Some(e) = frx.recv().await {
                    if itx.send((i, e)).await.is_err() {
                        return;
                    }
                }
            });
        }
        drop(itx);
        let this = self.clone();
        tokio::spawn(async move {
            let mut newest: Vec<Option<serde_json::Value>> = vec![None; bases.len()];
            let mut check = tokio::time::interval(Duration::from_secs(1));
            loop {
                let got = tokio::select! {
                    got = irx.recv() => got,
                    _ = check.tick() => {
                        if this.bases() != bases || tx.is_closed() {
                            return;
                        }
                        continue;
                    }
                };
                let Some((i, e)) = got else { return };
                let out = match e {
                    Event::Queues(v) => {
                        newest[i] = Some(v);
                        if newest.iter().any(Option::is_none) {
                            continue;
                        }
                        let docs: Vec<serde_json::Value> =
                            newest.iter().flatten().cloned().collect();
                        Event::Queues(merge_queues(&docs))
                    }
                    other => other,
                };
                if tx.send(out).await.is_err() {
                    return;
                }
            }
        });
        rx
    }

    /// Follows one instance's stream into `tx` until `tx` closes.
    fn follow_into(&self, base: String, tx: mpsc::Sender<Event>) {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                if this.follow(&base, &tx).await.is_err() && tx.is_closed() {
                    return;
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    async fn follow(&self, base: &str, tx: &mpsc::Sender<Event>) -> Result<(), ()> {
        let req = self
            .request(Method::GET, &format!("{base}/v1/queues/stream"))
            .body(Full::new(Bytes::new()))
            .map_err(|_| ())?;
        let resp = tokio::time::timeout(STREAM_IDLE, self.client.request(req))
            .await
            .map_err(|_| ())?
            .map_err(|_| ())?;
        if !resp.status().is_success() {
            tracing::warn!(status = %resp.status(), "the gateway refused the queue stream");
            return Err(());
        }
        let mut body = resp.into_body();
        let mut buf = String::new();
        // The newest document not yet handed over: a newer one replaces
        // it, so a busy controller gets the present, not a backlog.
        // Scale-from-zero signals are never dropped.
        let mut pending: Option<serde_json::Value> = None;
        loop {
            // The gateway sends at least once a second: silence for longer
            // is a dead connection, not a quiet gateway.
            let frame = tokio::select! {
                permit = tx.reserve(), if pending.is_some() => {
                    let permit = permit.map_err(|_| ())?;
                    if let Some(v) = pending.take() {
                        permit.send(Event::Queues(v));
                    }
                    continue;
                }
                frame = tokio::time::timeout(STREAM_IDLE, body.frame()) => frame,
            };
            let frame = match frame {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => return Err(()),
            };
            let Ok(frame) = frame else { return Err(()) };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.push_str(&String::from_utf8_lossy(&data));
            if buf.len() > MAX_EVENT_BYTES {
                // No event boundary in sight: not the stream we expect.
                return Err(());
            }
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                match parse_event(&event) {
                    Some(Event::Queues(v)) => pending = Some(v),
                    Some(e) => tx.send(e).await.map_err(|_| ())?,
                    None => {}
                }
            }
        }
        if let Some(v) = pending {
            let _ = tx.send(Event::Queues(v)).await;
        }
        Ok(())
    }
}

fn normalise(bases: Vec<String>) -> Vec<String> {
    let set: BTreeSet<String> = bases
        .into_iter()
        .map(|b| b.trim_end_matches('/').to_string())
        .filter(|b| !b.is_empty())
        .collect();
    set.into_iter().collect()
}

/// Each instance's share of a replica's concurrency limit: the limit
/// split evenly, at least 1 (with more instances than the limit, the
/// replica may get one request per instance: a warning says so).
pub fn share_of(limit: u32, instances: usize) -> u32 {
    let n = u32::try_from(instances.max(1)).unwrap_or(u32::MAX);
    if limit < n {
        tracing::warn!(
            limit,
            instances,
            "a replica's maxConcurrency is below the number of gateways: each takes 1"
        );
    }
    (limit / n).max(1)
}

/// The queue documents of several gateway instances as one (pure): per
/// model, the counts and rates summed (`waiting`, `in_flight`,
/// `server_waiting`, `arrival_rate` per window); `replicas` the most any
/// instance has (each has the same replicas registered); the latency
/// percentiles the worst; the p50 service time weighted by each
/// instance's 10 s arrival rate.
pub fn merge_queues(docs: &[serde_json::Value]) -> serde_json::Value {
    use serde_json::{Map, Value};
    let mut models: BTreeMap<String, Vec<&Map<String, Value>>> = BTreeMap::new();
    for d in docs {
        if let Some(m) = d.get("models").and_then(Value::as_object) {
            for (name, q) in m {
                if let Some(q) = q.as_object() {
                    models.entry(name.clone()).or_default().push(q);
                }
            }
        }
    }
    let num = |q: &Map<String, Value>, k: &str| q.get(k).and_then(Value::as_f64);
    let mut out = Map::new();
    for (name, qs) in models {
        let mut merged = qs[0].clone();
        for k in ["waiting", "in_flight", "server_waiting"] {
            if qs.iter().any(|q| q.contains_key(k)) {
                let sum: f64 = qs.iter().filter_map(|q| num(q, k)).sum();
                merged.insert(k.into(), serde_json::json!(sum));
            }
        }
        if let Some(r) = qs
            .iter()
            .filter_map(|q| num(q, "replicas"))
            .reduce(f64::max)
        {
            merged.insert("replicas".into(), serde_json::json!(r));
        }
        let mut rates = Map::new();
        for q in &qs {
            if let Some(a) = q.get("arrival_rate").and_then(Value::as_object) {
                for (w, v) in a {
                    let prev = rates.get(w).and_then(Value::as_f64).unwrap_or(0.0);
                    rates.insert(
                        w.clone(),
                        serde_json::json!(prev + v.as_f64().unwrap_or(0.0)),
                    );
                }
            }
        }
        if !rates.is_empty() {
            merged.insert("arrival_rate".into(), Value::Object(rates));
        }
        for (k, v) in qs[0] {
            if k.ends_with("_ms") && k.contains("p95") {
                if let Some(m) = qs.iter().filter_map(|q| num(q, k)).reduce(f64::max) {
                    merged.insert(k.clone(), serde_json::json!(m));
                }
            } else if k.ends_with("_ms") && k.contains("p50") && v.is_number() {
                let weight = |q: &Map<String, Value>| {
                    q.get("arrival_rate")
                        .and_then(|a| a.get("10s"))
                        .and_then(Value::as_f64)
                        .unwrap_or(0.0)
                };
                let (sum, w) = qs
                    .iter()
                    .filter_map(|q| num(q, k).map(|x| (x, weight(q))))
                    .fold((0.0, 0.0), |(s, w), (x, wi)| (s + x * wi, w + wi));
                let mean = if w > 0.0 {
                    sum / w
                } else {
                    let xs: Vec<f64> = qs.iter().filter_map(|q| num(q, k)).collect();
                    xs.iter().sum::<f64>() / xs.len().max(1) as f64
                };
                merged.insert(k.clone(), serde_json::json!(mean));
            }
        }
        out.insert(name, Value::Object(merged));
    }
    let mut doc = docs
        .first()
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    doc["models"] = Value::Object(out);
    doc["gateways"] = serde_json::json!(docs.len());
    doc
}

/// Per-model queue depth from a Prometheus server's HTTP API, as KEDA's
/// Prometheus scaler reads it: an instant PromQL query whose result
/// vector has one series per model (label `model_label` = served name);
/// the value is taken as requests waiting.
#[derive(Clone)]
pub struct PrometheusSource {
    base: String,
    query: String,
    model_label: String,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// `spec.prometheus` of the autoscaler's config.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrometheusSpec {
    /// The server (`http://host:9090`).
    pub url: String,
    /// An instant query returning one series per model.
    #[serde(default = "default_query")]
    pub query: String,
    /// The label naming the model (its served name).
    #[serde(default = "default_model_label")]
    pub model_label: String,
}

fn default_query() -> String {
    "sum by (model) (gpuscale_queue_depth) + sum by (model) (gpuscale_in_flight)".into()
}

fn default_model_label() -> String {
    "model".into()
}

impl PrometheusSource {
    /// A source for `spec`.
    pub fn new(spec: &PrometheusSpec) -> Self {
        PrometheusSource {
            base: spec.url.trim_end_matches('/').to_string(),
            query: spec.query.clone(),
            model_label: spec.model_label.clone(),
            client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        }
    }

    /// Runs the query; per served name, an observation.
    pub async fn observations(&self) -> Result<BTreeMap<String, Observation>, ObserveError> {
        let mut url = format!("{}/api/v1/query?query=", self.base);
        for b in self.query.bytes() {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                url.push(b as char);
            } else {
                url.push_str(&format!("%{b:02X}"));
            }
        }
        let err = |message: String| ObserveError::Gateway {
            url: format!("{}/api/v1/query", self.base),
            message,
        };
        let req = Request::get(&url)
            .body(Full::new(Bytes::new()))
            .map_err(|e| err(e.to_string()))?;
        let resp = tokio::time::timeout(Duration::from_secs(5), self.client.request(req))
            .await
            .map_err(|_| err("timed out".into()))?
            .map_err(|e| err(e.to_string()))?;
        let body = Limited::new(resp.into_body(), 16 << 20)
            .collect()
            .await
            .map_err(|e| err(e.to_string()))?
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| err(e.to_string()))?;
        prometheus_observations(&v, &self.model_label).map_err(err)
    }
}

/// Observations from a Prometheus `/api/v1/query` answer (pure).
pub fn prometheus_observations(
    answer: &serde_json::Value,
    model_label: &str,
) -> Result<BTreeMap<String, Observation>, String> {
    if answer.get("status").and_then(|s| s.as_str()) != Some("success") {
        return Err(format!(
            "query failed: {}",
            answer
                .get("error")
                .and_then(|e| e.as_str())
                .unwrap_or("no status")
        ));
    }
    let result = answer
        .pointer("/data/result")
        .and_then(|r| r.as_array())
        .ok_or("the answer has no data.result vector")?;
    let mut out = BTreeMap::new();
    for series in result {
        let Some(model) = series
            .pointer(&format!("/metric/{model_label}"))
            .and_then(|m| m.as_str())
        else {
            continue;
        };
        let value = series
            .pointer("/value/1")
            .and_then(|v| v.as_str())
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("series for `{model}` has no numeric value"))?;
        out.insert(
            model.to_string(),
            Observation {
                waiting: value.max(0.0),
                ..Observation::default()
            },
        );
    }
    Ok(out)
}

/// One server-sent event (`event: …\ndata: …`) as an [`Event`].
pub fn parse_event(text: &str) -> Option<Event> {
    let mut kind = "message";
    let mut data = String::new();
    for line in text.lines() {
        if let Some(k) = line.strip_prefix("event:") {
            kind = k.trim();
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.trim_start());
        }
    }
    let value: serde_json::Value = serde_json::from_str(&data).ok()?;
    match kind {
        "queues" => Some(Event::Queues(value)),
        "scale" => Some(Event::ScaleFromZero {
            model: value.get("model")?.as_str()?.to_string(),
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queues_document_becomes_observations() {
        let view = serde_json::json!({"uptime_s": 3.0, "models": {"m": {
            "waiting": 7, "in_flight": 1, "replicas": 1,
            "arrival_rate": {"1s": 8.0, "10s": 1.0, "60s": 0.2},
            "queue_wait_p95_ms": 250.0, "latency_p50_ms": 1500.0,
            "latency_p50_10s_ms": 900.0,
            "latency_p95_ms": null, "ttft_p95_ms": 2.5}}});
        let obs = observations(&view);
        let m = &obs["m"];
        // Rate and service time over the same 10 s.
        assert_eq!((m.waiting, m.in_flight, m.arrival_rate), (7.0, 1.0, 1.0));
        assert_eq!(m.service_time, Some(0.9));
        assert_eq!(m.queue_wait_p95, Some(Duration::from_millis(250)));
        assert_eq!(m.latency_p95, None);
        assert_eq!(m.ttft_p95, Some(Duration::from_micros(2500)));
    }

    #[test]
    fn a_prometheus_vector_becomes_observations() {
        let answer = serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"model": "a"}, "value": [1.0, "12"]},
            {"metric": {"model": "b"}, "value": [1.0, "0.5"]},
            {"metric": {"other": "c"}, "value": [1.0, "3"]}]}});
        let obs = prometheus_observations(&answer, "model").unwrap();
        assert_eq!(obs.len(), 2);
        assert_eq!(obs["a"].waiting, 12.0);
        assert_eq!(obs["b"].waiting, 0.5);
        let bad = serde_json::json!({"status": "error", "error": "parse error"});
        assert_eq!(
            prometheus_observations(&bad, "model").unwrap_err(),
            "query failed: parse error"
        );
    }

    #[test]
    fn server_sent_events_parse() {
        assert_eq!(
            parse_event("event: scale\ndata: {\"model\":\"m\",\"waiting\":1}\n\n"),
            Some(Event::ScaleFromZero { model: "m".into() })
        );
        assert!(matches!(
            parse_event("event: queues\ndata: {\"models\":{}}\n\n"),
            Some(Event::Queues(_))
        ));
        assert_eq!(parse_event("event: queues\ndata: not json\n\n"), None);
    }

    #[test]
    fn queue_documents_of_several_gateways_add_up() {
        let a = serde_json::json!({"models": {"m": {"waiting": 3, "in_flight": 4, "replicas": 2,
            "arrival_rate": {"1s": 1.0, "10s": 2.0}, "latency_p95_ms": 800.0, "latency_p50_10s_ms": 100.0}}});
        let b = serde_json::json!({"models": {"m": {"waiting": 5, "in_flight": 1, "replicas": 2,
            "arrival_rate": {"1s": 3.0, "10s": 6.0}, "latency_p95_ms": 1200.0, "latency_p50_10s_ms": 300.0},
            "n": {"waiting": 1}}});
        let m = merge_queues(&[a, b]);
        let q = &m["models"]["m"];
        assert_eq!(q["waiting"], 8.0);
        assert_eq!(q["in_flight"], 5.0);
        assert_eq!(q["replicas"], 2.0);
        assert_eq!(q["arrival_rate"]["10s"], 8.0);
        assert_eq!(q["latency_p95_ms"], 1200.0, "the worst p95");
        // Weighted by arrivals: (100×2 + 300×6) / 8.
        assert_eq!(q["latency_p50_10s_ms"], 250.0);
        assert_eq!(m["models"]["n"]["waiting"], 1.0);
        assert_eq!(m["gateways"], 2);
        let o = observations(&m);
        assert_eq!(o["m"].waiting, 8.0);
    }

    #[test]
    fn each_gateway_takes_an_equal_share_of_a_limit() {
        assert_eq!(share_of(32, 1), 32);
        assert_eq!(share_of(32, 3), 10);
        assert_eq!(share_of(2, 3), 1);
        assert_eq!(share_of(5, 0), 5);
    }
}
