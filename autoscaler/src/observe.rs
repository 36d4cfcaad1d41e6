//! Signals from the gateway, over its admin API: `GET /v1/queues` (pull),
//! `GET /v1/queues/stream` (push: every change and every scale-from-zero
//! signal, for sub-second reaction), and the discovery calls the local
//! backend makes (`POST` / `DELETE /v1/replicas`). [`observations`] turns a
//! `/v1/queues` document into the recommender's [`Observation`]s (pure).

use std::collections::BTreeMap;
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

/// A client of one gateway's admin API.
#[derive(Clone)]
pub struct GatewayClient {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
    // `Bearer <token>`, marked sensitive (kept out of debug output).
    authorization: Option<http::HeaderValue>,
}

impl GatewayClient {
    /// A client for the admin API at `base` (`http://host:port`).
    pub fn new(base: &str) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        GatewayClient {
            base: base.trim_end_matches('/').to_string(),
            client: Client::builder(TokioExecutor::new()).build(connector),
            authorization: None,
        }
    }

    /// Sends `token` as the admin API's bearer token on every call.
    pub fn with_token(mut self, token: &str) -> Result<Self, ObserveError> {
        let mut value =
            http::HeaderValue::from_str(&format!("Bearer {}", token.trim())).map_err(|_| {
                ObserveError::Gateway {
                    url: self.base.clone(),
                    message: "the admin token is not a valid header value".into(),
                }
            })?;
        value.set_sensitive(true);
        self.authorization = Some(value);
        Ok(self)
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
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(StatusCode, Bytes), ObserveError> {
        let url = format!("{}{path}", self.base);
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
        let (status, body) = self.call(Method::GET, path, None).await?;
        let err = |message: String| ObserveError::Gateway {
            url: format!("{}{path}", self.base),
            message,
        };
        if status != StatusCode::OK {
            return Err(err(format!("status {status}")));
        }
        serde_json::from_slice(&body).map_err(|e| err(e.to_string()))
    }

    /// `GET /v1/queues`.
    pub async fn queues(&self) -> Result<serde_json::Value, ObserveError> {
        let (status, body) = self.call(Method::GET, "/v1/queues", None).await?;
        if status != StatusCode::OK {
            return Err(ObserveError::Gateway {
                url: format!("{}/v1/queues", self.base),
                message: format!("status {status}"),
            });
        }
        serde_json::from_slice(&body).map_err(|e| ObserveError::Gateway {
            url: format!("{}/v1/queues", self.base),
            message: e.to_string(),
        })
    }

    /// Registers (`true`) or deregisters a replica.
    pub async fn replica(
        &self,
        register: bool,
        model: &str,
        endpoint: &str,
        max_concurrency: Option<u32>,
    ) -> Result<(), ObserveError> {
        let mut body = serde_json::json!({"model": model, "endpoint": endpoint});
        if let Some(c) = max_concurrency {
            body["maxConcurrency"] = c.into();
        }
        let method = if register {
            Method::POST
        } else {
            Method::DELETE
        };
        let (status, text) = self.call(method, "/v1/replicas", Some(body)).await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(ObserveError::Gateway {
                url: format!("{}/v1/replicas", self.base),
                message: format!("status {status}: {}", String::from_utf8_lossy(&text)),
            })
        }
    }

    /// `GET /v1/replicas`: the endpoints the gateway lists, per served
    /// model name.
    pub async fn replica_list(&self) -> Result<BTreeMap<String, Vec<String>>, ObserveError> {
        let url = format!("{}/v1/replicas", self.base);
        let (status, body) = self.call(Method::GET, "/v1/replicas", None).await?;
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
                    .filter_map(|r| r.get("endpoint").and_then(|e| e.as_str()))
                    .map(str::to_string)
                    .collect();
                (model, endpoints)
            })
            .collect())
    }

    /// Follows `/v1/queues/stream`, reconnecting after a second when it
    /// drops; events arrive on the returned channel until it is dropped.
    pub fn stream(&self) -> mpsc::Receiver<Event> {
        let (tx, rx) = mpsc::channel(4);
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                if this.follow(&tx).await.is_err() && tx.is_closed() {
                    return;
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        rx
    }

    async fn follow(&self, tx: &mpsc::Sender<Event>) -> Result<(), ()> {
        let req = self
            .request(Method::GET, &format!("{}/v1/queues/stream", self.base))
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
}
