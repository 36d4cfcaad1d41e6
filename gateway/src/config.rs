//! The gateway's configuration file (`kind: Gateway`), loaded with every
//! error located at file, line, column and field, and resolved into
//! [`Settings`]: per-model limits from the config's `models` merged over the
//! model policies it points at.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuscale_policies::document::{self, Problem};
use gpuscale_policies::load::{self, Problems};
use gpuscale_policies::model::Priority;
use serde::{Deserialize, Serialize};

/// The file: `apiVersion: gpuscale.io/v1alpha1`, `kind: Gateway`,
/// `metadata`, `spec`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GatewayDoc {
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    metadata: load::Metadata,
    spec: GatewaySpec,
}

/// `spec` of a `Gateway` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewaySpec {
    /// Traffic listener.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Admin listener: `/metrics`, `/healthz`, `/readyz`, `/v1/queues`,
    /// `/v1/replicas`.
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
    /// Model policy files or directories (relative to this file): each
    /// policy becomes a model with its `servedName`, `maxConcurrency` and
    /// `priority`.
    #[serde(default)]
    pub policies: Vec<PathBuf>,
    /// Header that names the model, overriding the body's `model` field.
    #[serde(default = "default_model_header")]
    pub model_header: String,
    /// Header that sets a request's priority class.
    #[serde(default = "default_priority_header")]
    pub priority_header: String,
    /// Request limits and timeouts.
    #[serde(default)]
    pub limits: Limits,
    /// Upstream behaviour: retries, ejection, metrics scraping.
    #[serde(default)]
    pub upstream: UpstreamSpec,
    /// Queue defaults for every model.
    #[serde(default)]
    pub queue: QueueSpec,
    /// Models (added to, or overriding, those from `policies`).
    #[serde(default)]
    pub models: Vec<ModelSpec>,
    /// Sidecar mode: one upstream on localhost serving one model.
    #[serde(default)]
    pub sidecar: Option<SidecarSpec>,
    /// Traffic workers: each a thread with its own event loop, accept
    /// queue (the port is shared with `SO_REUSEPORT`) and upstream
    /// connection pool, as nginx runs worker processes. Default: one per
    /// CPU core.
    #[serde(default)]
    pub workers: Option<usize>,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8080))
}
fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9090))
}
fn default_model_header() -> String {
    "x-gpuscale-model".into()
}
fn default_priority_header() -> String {
    "x-gpuscale-priority".into()
}

/// Request limits and timeouts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Limits {
    /// Largest request body read, bytes (413 above).
    pub max_body_bytes: usize,
    /// Largest request head, bytes (431 above; hyper's floor is 8,192).
    pub max_header_bytes: usize,
    /// Time a client has to send its request head.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Time a client has to send its body.
    #[serde(with = "humantime_serde")]
    pub body_read_timeout: Duration,
    /// Time from leaving the queue to the upstream's response head.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Longest pause between two chunks of an upstream response body.
    #[serde(with = "humantime_serde")]
    pub stream_idle_timeout: Duration,
    /// How long shutdown waits for requests in flight.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 * 1024 * 1024,
            max_header_bytes: 64 * 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Upstream behaviour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct UpstreamSpec {
    /// Other replicas tried when connecting fails (nothing was sent yet).
    pub retries: u32,
    /// Time to connect to a replica.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long a kept-alive connection to a replica may sit unused before
    /// the gateway closes it rather than reuse it. Below the model
    /// server's own keep-alive timeout (uvicorn, under vLLM, closes after
    /// 5 s), so the gateway never sends on a connection the server is
    /// closing.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Consecutive failures that eject a replica.
    pub eject_after_failures: u32,
    /// How long an ejected replica gets no traffic.
    #[serde(with = "humantime_serde")]
    pub eject_for: Duration,
    /// How often each replica's `/metrics` is scraped (when its model sets
    /// `metrics`).
    #[serde(with = "humantime_serde")]
    pub scrape_interval: Duration,
}

impl Default for UpstreamSpec {
    fn default() -> Self {
        UpstreamSpec {
            retries: 2,
            connect_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(4),
            eject_after_failures: 3,
            eject_for: Duration::from_secs(10),
            scrape_interval: Duration::from_secs(1),
        }
    }
}

/// Queue bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct QueueSpec {
    /// Requests that may wait per model (429 above).
    pub max_queue: usize,
    /// Longest wait (503 after).
    #[serde(with = "humantime_serde")]
    pub queue_timeout: Duration,
    /// Concurrency per replica when neither the model nor its policy says.
    pub max_concurrency: u32,
}

impl Default for QueueSpec {
    fn default() -> Self {
        QueueSpec {
            max_queue: 256,
            queue_timeout: Duration::from_secs(30),
            max_concurrency: 8,
        }
    }
}

/// Which model-server metrics a model's replicas export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsFormat {
    /// Not scraped.
    #[default]
    None,
    /// vLLM: `vllm:num_requests_waiting`, `vllm:num_requests_running`,
    /// `vllm:kv_cache_usage_perc`.
    Vllm,
    /// TGI: `tgi_queue_size`, `tgi_batch_current_size`.
    Tgi,
    /// SGLang: `sglang:num_queue_reqs`, `sglang:num_running_reqs`.
    Sglang,
    /// Triton: `nv_inference_pending_request_count`.
    Triton,
}

/// One model the gateway serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    /// The model name clients send.
    pub name: String,
    /// Requests one replica serves at once.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// Requests that may wait.
    #[serde(default)]
    pub max_queue: Option<usize>,
    /// Longest wait.
    #[serde(default, with = "humantime_serde")]
    pub queue_timeout: Option<Duration>,
    /// Priority class of requests that do not set one.
    #[serde(default)]
    pub priority: Option<Priority>,
    /// Replica base URLs (`http://host:port`).
    #[serde(default)]
    pub replicas: Vec<String>,
    /// Model-server metrics to scrape from each replica.
    #[serde(default)]
    pub metrics: MetricsFormat,
}

/// Sidecar mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SidecarSpec {
    /// The model served.
    pub model: String,
    /// The model server in the same pod.
    #[serde(default = "default_sidecar_upstream")]
    pub upstream: String,
}

fn default_sidecar_upstream() -> String {
    "http://127.0.0.1:8000".into()
}

/// One model, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSettings {
    /// The model name clients send.
    pub name: String,
    /// Requests one replica serves at once.
    pub max_concurrency: u32,
    /// Requests that may wait.
    pub max_queue: usize,
    /// Longest wait.
    pub queue_timeout: Duration,
    /// Default priority class.
    pub priority: Priority,
    /// Replica base URLs at start.
    pub replicas: Vec<Endpoint>,
    /// Model-server metrics format.
    pub metrics: MetricsFormat,
}

impl ModelSettings {
    /// A model with the queue defaults and no replica yet.
    fn from_queue(name: &str, q: &QueueSpec) -> Self {
        ModelSettings {
            name: name.to_string(),
            max_concurrency: q.max_concurrency,
            max_queue: q.max_queue,
            queue_timeout: q.queue_timeout,
            priority: Priority::Standard,
            replicas: Vec::new(),
            metrics: MetricsFormat::None,
        }
    }
}

/// A replica's address: `http://host:port`, no path. Cheap to clone (the
/// parsed forms the proxy needs per request are made once).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Endpoint(std::sync::Arc<EndpointInner>);

#[derive(Debug)]
struct EndpointInner {
    authority: String,
    uri_authority: http::uri::Authority,
    host: http::HeaderValue,
}

impl PartialEq for Endpoint {
    fn eq(&self, other: &Self) -> bool {
        self.0.authority == other.0.authority
    }
}
impl Eq for Endpoint {}
impl PartialOrd for Endpoint {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Endpoint {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.authority.cmp(&other.0.authority)
    }
}
impl std::hash::Hash for Endpoint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.authority.hash(state);
    }
}

impl Endpoint {
    /// Parses `http://host:port` (a trailing `/` is allowed; `https` and
    /// paths are not: the gateway talks plain HTTP/1.1 to model servers in
    /// the cluster network).
    pub fn parse(s: &str) -> Result<Endpoint, String> {
        let uri: http::Uri = s.parse().map_err(|e| format!("`{s}` is not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("`{s}`: only http:// endpoints are supported"));
        }
        let authority = uri
            .authority()
            .ok_or_else(|| format!("`{s}` has no host"))?;
        if authority.port_u16().is_none() {
            return Err(format!("`{s}` has no port"));
        }
        if !matches!(uri.path(), "" | "/") {
            return Err(format!("`{s}`: an endpoint has no path"));
        }
        let host =
            http::HeaderValue::from_str(authority.as_str()).map_err(|e| format!("`{s}`: {e}"))?;
        Ok(Endpoint(std::sync::Arc::new(EndpointInner {
            authority: authority.as_str().to_string(),
            uri_authority: authority.clone(),
            host,
        })))
    }

    /// `host:port`.
    pub fn authority(&self) -> &str {
        &self.0.authority
    }

    /// `host:port`, parsed.
    pub fn uri_authority(&self) -> &http::uri::Authority {
        &self.0.uri_authority
    }

    /// The `Host` header for requests to it.
    pub fn host_header(&self) -> &http::HeaderValue {
        &self.0.host
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.0.authority)
    }
}

impl TryFrom<String> for Endpoint {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Endpoint::parse(&s)
    }
}

impl From<Endpoint> for String {
    fn from(e: Endpoint) -> String {
        e.url()
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url())
    }
}

/// Everything the gateway runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// The config's `metadata.name`.
    pub name: String,
    /// The spec as written.
    pub spec: GatewaySpec,
    /// Models by served name.
    pub models: BTreeMap<String, ModelSettings>,
}

impl Settings {
    /// Settings from a spec without a file (tests, embedded mode): models
    /// from `spec.models` and `policies` already loaded.
    pub fn from_spec(
        name: &str,
        spec: GatewaySpec,
        policies: &[gpuscale_policies::Model],
    ) -> Result<Settings, String> {
        let q = spec.queue;
        let mut models = BTreeMap::new();
        for p in policies {
            models.insert(
                p.served_name.clone(),
                ModelSettings {
                    name: p.served_name.clone(),
                    max_concurrency: p.max_concurrency.max(1),
                    max_queue: q.max_queue,
                    queue_timeout: q.queue_timeout,
                    priority: p.priority,
                    replicas: Vec::new(),
                    metrics: MetricsFormat::None,
                },
            );
        }
        for (i, m) in spec.models.iter().enumerate() {
            let base = models
                .remove(&m.name)
                .unwrap_or(ModelSettings::from_queue(&m.name, &q));
            let replicas = m
                .replicas
                .iter()
                .enumerate()
                .map(|(j, r)| {
                    Endpoint::parse(r).map_err(|e| format!("spec.models[{i}].replicas[{j}]: {e}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if m.max_concurrency == Some(0) {
                return Err(format!(
                    "spec.models[{i}].maxConcurrency: must be at least 1"
                ));
            }
            models.insert(
                m.name.clone(),
                ModelSettings {
                    name: m.name.clone(),
                    max_concurrency: m.max_concurrency.unwrap_or(base.max_concurrency),
                    max_queue: m.max_queue.unwrap_or(base.max_queue),
                    queue_timeout: m.queue_timeout.unwrap_or(base.queue_timeout),
                    priority: m.priority.unwrap_or(base.priority),
                    replicas,
                    metrics: m.metrics,
                },
            );
        }
        if let Some(s) = &spec.sidecar {
            let upstream =
                Endpoint::parse(&s.upstream).map_err(|e| format!("spec.sidecar.upstream: {e}"))?;
            let m = models
                .entry(s.model.clone())
                .or_insert(ModelSettings::from_queue(&s.model, &q));
            m.replicas = vec![upstream];
            models.retain(|k, _| k == &s.model);
        }
        for (field, value) in [
            ("modelHeader", &spec.model_header),
            ("priorityHeader", &spec.priority_header),
        ] {
            if http::HeaderName::from_bytes(value.as_bytes()).is_err() {
                return Err(format!(
                    "spec.{field}: `{value}` is not a valid header name"
                ));
            }
        }
        if spec.workers == Some(0) {
            return Err("spec.workers: must be at least 1".into());
        }
        if spec.limits.max_header_bytes < 8192 {
            return Err("spec.limits.maxHeaderBytes: must be at least 8192".into());
        }
        Ok(Settings {
            name: name.to_string(),
            spec,
            models,
        })
    }
}

/// Loads a `kind: Gateway` file and the policies it names.
pub fn load(path: &Path) -> Result<Settings, Problems> {
    let text = load::read(path).map_err(|p| Problems(vec![p]))?;
    let docs = document::parse(path, &text).map_err(|p| Problems(vec![p]))?;
    let [doc] = docs.as_slice() else {
        return Err(Problems(vec![Problem {
            file: path.to_path_buf(),
            position: document::Position { line: 1, column: 1 },
            path: String::new(),
            message: format!(
                "expected one `kind: Gateway` document, found {}",
                docs.len()
            ),
        }]));
    };
    if doc.kind() != Some("Gateway") {
        return Err(Problems(vec![doc.problem(
            "kind",
            format!(
                "expected `Gateway`, found {}",
                doc.kind()
                    .map(|k| format!("`{k}`"))
                    .unwrap_or_else(|| "none".into())
            ),
        )]));
    }
    if doc.value.get("apiVersion").and_then(|v| v.as_str()) != Some(load::API_VERSION) {
        return Err(Problems(vec![doc.problem(
            "apiVersion",
            format!("expected `{}`", load::API_VERSION),
        )]));
    }
    let parsed: GatewayDoc = load::typed(doc).map_err(|p| Problems(vec![p]))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let policy_paths: Vec<PathBuf> = parsed.spec.policies.iter().map(|p| dir.join(p)).collect();
    let policies = if policy_paths.is_empty() {
        Vec::new()
    } else {
        load::load_paths(&policy_paths)?.models
    };
    Settings::from_spec(&parsed.metadata.name, parsed.spec, &policies).map_err(|message| {
        // `spec.models[0].replicas[1]: …` → locate that field.
        let (field, msg) = message.split_once(": ").unwrap_or(("spec", &message));
        Problems(vec![doc.problem(field, msg)])
    })
}
