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
use gpuscale_policies::model::{MAX_CONCURRENCY, Priority};
use serde::{Deserialize, Serialize};

use crate::auth::AdminToken;
use crate::{priority, registration};

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
    /// A file holding the admin API's bearer token (relative to this
    /// file; a mounted Secret in Kubernetes). Overridden by
    /// `--admin-token-file` and `GPUSCALE_ADMIN_TOKEN_FILE`. Without a
    /// token, `/v1/replicas` cannot be changed and the admin listener must
    /// be on loopback.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    /// A file holding a second bearer token that reads the admin API
    /// (`/metrics`, `/v1/queues`, …) and changes nothing: what Prometheus
    /// holds, so a scraper's credential cannot register a replica (which
    /// would receive clients' prompts). Relative to this file.
    #[serde(default)]
    pub read_token_file: Option<PathBuf>,
    /// What the discovery API may register.
    #[serde(default)]
    pub registration: RegistrationSpec,
    /// Where requests' priority classes come from.
    #[serde(default)]
    pub priorities: PrioritiesSpec,
    /// Shutdown on SIGTERM.
    #[serde(default)]
    pub drain: DrainSpec,
    /// Model policy files or directories (relative to this file): each
    /// policy becomes a model with its `servedName`, `maxConcurrency` and
    /// `priority`.
    #[serde(default)]
    pub policies: Vec<PathBuf>,
    /// Header that names the model, overriding the body's `model` field
    /// (or the KServe path) where that names no model served here; a
    /// request whose body or path names another served model is refused.
    #[serde(default = "default_model_header")]
    pub model_header: String,
    /// Header that sets a request's priority class: honoured only from
    /// the trusted sources of `priorities`.
    #[serde(default = "default_priority_header")]
    pub priority_header: String,
    /// Request limits and timeouts.
    #[serde(default)]
    pub limits: Limits,
    /// Upstream behaviour: retries, ejection, metrics scraping.
    #[serde(default)]
    pub upstream: UpstreamSpec,
    /// How requests are spread over a model's replicas.
    #[serde(default)]
    pub routing: RoutingSpec,
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
    /// Request bytes the traffic listener holds at once across all its
    /// connections: bodies (from their `Content-Length`, or as chunks
    /// arrive) until their request is answered, and heads past their
    /// first 16 KiB while they arrive. A request that would go past it
    /// gets 503 with `Retry-After` before its bytes are read (`budget`).
    pub max_buffered_bytes: usize,
    /// Largest request head, bytes as received (431 above; at least
    /// 8,192, the admin listener's hyper floor).
    pub max_header_bytes: usize,
    /// Time a client has to send its request head.
    #[serde(with = "gpuscale_policies::duration")]
    pub header_read_timeout: Duration,
    /// Time a client has to send its body.
    #[serde(with = "gpuscale_policies::duration")]
    pub body_read_timeout: Duration,
    /// Time from leaving the queue to the upstream's response head.
    #[serde(with = "gpuscale_policies::duration")]
    pub request_timeout: Duration,
    /// Longest pause between two chunks of an upstream response body.
    #[serde(with = "gpuscale_policies::duration")]
    pub stream_idle_timeout: Duration,
    /// Longest a response write may make no progress (a client that
    /// stops reading): the connection is closed and the replica's slot
    /// freed.
    #[serde(with = "gpuscale_policies::duration")]
    pub write_timeout: Duration,
    /// Client connections open at once on the traffic port; above it a
    /// new connection gets 503 and is closed.
    pub max_connections: usize,
    /// Connections open at once on the admin port.
    pub max_admin_connections: usize,
    /// `/v1/queues/stream` subscribers at once (503 above).
    pub max_stream_subscribers: usize,
    /// Requests each client may send (its configured API key, else its
    /// address: [`crate::fairness`]), unless its key sets its own
    /// (`priorities.apiKeys[].rate`); none by default ([`crate::ratelimit`]).
    pub client_rate: Option<RateSpec>,
}

/// A client's rate ([`crate::ratelimit`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateSpec {
    /// Requests a minute; 0: no limit.
    pub requests_per_minute: f64,
    /// Most requests at once after a quiet spell; by default ten seconds'
    /// worth (at least 1).
    #[serde(default)]
    pub burst: Option<u32>,
}

/// Most requests a minute a rate may set.
pub const MAX_REQUESTS_PER_MINUTE: f64 = 1e9;

/// Fewest requests a minute a rate may set (besides 0, no limit): one a
/// week.
pub const MIN_REQUESTS_PER_MINUTE: f64 = 1.0 / (7.0 * 24.0 * 60.0);

impl RateSpec {
    /// The rate (`None`: no limit), or what is wrong with it, `at` naming
    /// where it is written.
    fn rate(&self, at: &str) -> Result<Option<crate::ratelimit::Rate>, String> {
        let rpm = self.requests_per_minute;
        if !rpm.is_finite()
            || !(rpm == 0.0 || (MIN_REQUESTS_PER_MINUTE..=MAX_REQUESTS_PER_MINUTE).contains(&rpm))
        {
            return Err(format!(
                "{at}.requestsPerMinute: must be 0 (no limit), or from {MIN_REQUESTS_PER_MINUTE:.6} \
                 (one a week) to {MAX_REQUESTS_PER_MINUTE}, got {rpm}"
            ));
        }
        if self.burst == Some(0) {
            return Err(format!("{at}.burst: must be at least 1"));
        }
        if rpm == 0.0 {
            return Ok(None);
        }
        let burst = self
            .burst
            .map_or_else(|| (rpm / 6.0).ceil().max(1.0), f64::from);
        Ok(Some(crate::ratelimit::Rate {
            per_minute: rpm,
            burst,
        }))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 * 1024 * 1024,
            max_buffered_bytes: 256 * 1024 * 1024,
            max_header_bytes: 64 * 1024,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(300),
            stream_idle_timeout: Duration::from_secs(120),
            write_timeout: Duration::from_secs(60),
            max_connections: 16_384,
            max_admin_connections: 256,
            max_stream_subscribers: 64,
            client_rate: None,
        }
    }
}

/// What `POST /v1/replicas` may register.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RegistrationSpec {
    /// Networks (CIDR) registered replicas may be in: loopback by
    /// default; in Kubernetes, the pod network (EndpointSlice addresses).
    /// Link-local, unspecified, multicast and broadcast addresses are
    /// refused whatever this says.
    pub allowed_networks: Vec<ipnet::IpNet>,
    /// Most replicas one model may have.
    pub max_replicas_per_model: usize,
}

impl Default for RegistrationSpec {
    fn default() -> Self {
        RegistrationSpec {
            allowed_networks: vec![
                "127.0.0.0/8".parse().expect("a valid network"),
                "::1/128".parse().expect("a valid network"),
            ],
            max_replicas_per_model: 256,
        }
    }
}

/// Where priority classes come from (see [`crate::priority`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PrioritiesSpec {
    /// Peers (CIDR) whose priority header is honoured: proxies that set
    /// it themselves. Empty by default: the header is ignored.
    pub trusted_networks: Vec<ipnet::IpNet>,
    /// Whether those peers' `X-Forwarded-For` names the client for
    /// fairness and `limits.clientRate` ([`crate::fairness::source`]).
    /// Off by default: turn it on only where every trusted proxy appends
    /// to the header (or overwrites it), never passing a client's on
    /// as it came.
    pub forwarded_for: bool,
    /// API keys (`Authorization: Bearer KEY`), by SHA-256 digest.
    pub api_keys: Vec<ApiKeySpec>,
    /// Classes by request path prefix; the first match wins.
    pub routes: Vec<RoutePrioritySpec>,
}

/// One API key's rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeySpec {
    /// A label for people (not matched).
    #[serde(default)]
    pub name: Option<String>,
    /// Hex SHA-256 of the key (`printf %s "$KEY" | sha256sum`): the file
    /// holds no secret.
    pub sha256: String,
    /// The class of its requests.
    #[serde(default)]
    pub priority: Option<Priority>,
    /// Whether its requests may set their class by header.
    #[serde(default)]
    pub allow_header: bool,
    /// Its requests' rate, instead of `limits.clientRate`
    /// (`requestsPerMinute: 0`: none).
    #[serde(default)]
    pub rate: Option<RateSpec>,
}

/// A class for requests by path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutePrioritySpec {
    /// Path prefix (`/v1/embeddings`).
    pub path_prefix: String,
    /// Class.
    pub priority: Priority,
}

/// Shutdown on SIGTERM: `/readyz` turns 503 at once; for `announce` the
/// listeners keep accepting and answer new requests 503 with
/// `Retry-After` (so a Kubernetes Service has time to drop the pod from
/// its endpoints); then they stop accepting and requests in flight get up
/// to `timeout` to finish.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DrainSpec {
    /// Time to keep accepting after SIGTERM.
    #[serde(with = "gpuscale_policies::duration")]
    pub announce: Duration,
    /// Time requests in flight get to finish after that.
    #[serde(with = "gpuscale_policies::duration")]
    pub timeout: Duration,
}

impl Default for DrainSpec {
    fn default() -> Self {
        DrainSpec {
            announce: Duration::from_secs(5),
            timeout: Duration::from_secs(30),
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
    #[serde(with = "gpuscale_policies::duration")]
    pub connect_timeout: Duration,
    /// How long a kept-alive connection to a replica may sit unused before
    /// the gateway closes it rather than reuse it. Below the model
    /// server's own keep-alive timeout (uvicorn, under vLLM, closes after
    /// 5 s), so the gateway never sends on a connection the server is
    /// closing.
    #[serde(with = "gpuscale_policies::duration")]
    pub idle_timeout: Duration,
    /// Consecutive failures that eject a replica.
    pub eject_after_failures: u32,
    /// How long an ejected replica gets no traffic.
    #[serde(with = "gpuscale_policies::duration")]
    pub eject_for: Duration,
    /// How often each replica's `/metrics` is scraped (when its model sets
    /// `metrics`).
    #[serde(with = "gpuscale_policies::duration")]
    pub scrape_interval: Duration,
    /// Model-server metrics of every model's replicas, unless its entry in
    /// `models` sets its own (`none` by default: nothing is scraped).
    pub metrics: MetricsFormat,
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
            metrics: MetricsFormat::None,
        }
    }
}

/// How requests are spread over a model's replicas
/// ([`crate::affinity`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RoutingSpec {
    /// `prefix` (prefix affinity with bounded loads, least-outstanding
    /// without a prefix), `least-outstanding` or `round-robin`.
    pub policy: crate::affinity::Policy,
    /// Bytes per block of the prompt.
    pub block_bytes: usize,
    /// Leading blocks the affinity key covers.
    pub affinity_blocks: usize,
    /// `1 + ε` of bounded loads: a replica takes a request while its load
    /// stays within this many times its share of the model's load.
    pub load_factor: f64,
    /// The load bound is never below this share (0–1) of the replica's
    /// concurrency limit.
    pub spill_floor: f64,
    /// KV-cache utilisation (0–1, from the replica's metrics) at which a
    /// replica is passed over like one at its bound.
    pub kv_spill: f64,
    /// A prefix not known to be shared (a first turn, a prompt this
    /// gateway has not routed lately) goes to its owner only when the
    /// owner holds no more than the least loaded replica, or at most this
    /// many requests more with nothing waiting inside it.
    pub fresh_slack: u32,
    /// Adds `x-gpuscale-route: <reason>; replica=<tag>` to responses.
    pub explain: bool,
    /// How long an adapter seen in a replica's metrics counts as loaded
    /// there.
    #[serde(with = "gpuscale_policies::duration")]
    pub adapter_memory: Duration,
}

impl Default for RoutingSpec {
    fn default() -> Self {
        let b = crate::affinity::Balance::default();
        RoutingSpec {
            policy: b.policy,
            block_bytes: b.block_bytes,
            affinity_blocks: b.affinity_blocks,
            load_factor: b.load_factor,
            spill_floor: b.spill_floor,
            kv_spill: b.kv_spill,
            fresh_slack: b.fresh_slack,
            explain: false,
            adapter_memory: Duration::from_secs(60),
        }
    }
}

impl RoutingSpec {
    /// The balance these settings give, or the first field out of range.
    pub fn balance(&self) -> Result<crate::affinity::Balance, String> {
        if !(16..=1 << 20).contains(&self.block_bytes) {
            return Err("spec.routing.blockBytes: must be between 16 and 1048576".into());
        }
        if !(1..=4096).contains(&self.affinity_blocks) {
            return Err("spec.routing.affinityBlocks: must be between 1 and 4096".into());
        }
        if !(self.load_factor >= 1.0 && self.load_factor <= 100.0) {
            return Err("spec.routing.loadFactor: must be between 1 and 100".into());
        }
        if !(0.0..=1.0).contains(&self.spill_floor) {
            return Err("spec.routing.spillFloor: must be between 0 and 1".into());
        }
        if !(self.kv_spill > 0.0 && self.kv_spill <= 1.0) {
            return Err("spec.routing.kvSpill: must be above 0 and at most 1".into());
        }
        Ok(crate::affinity::Balance {
            policy: self.policy,
            block_bytes: self.block_bytes,
            affinity_blocks: self.affinity_blocks,
            load_factor: self.load_factor,
            spill_floor: self.spill_floor,
            kv_spill: self.kv_spill,
            fresh_slack: self.fresh_slack,
        })
    }
}

/// Queue bounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct QueueSpec {
    /// Requests that may wait per model (429 above).
    pub max_queue: usize,
    /// Longest wait (503 after).
    #[serde(with = "gpuscale_policies::duration")]
    pub queue_timeout: Duration,
    /// Concurrency per replica when neither the model nor its policy says.
    pub max_concurrency: u32,
    /// The order waiters of one priority class are served in.
    pub order: QueueOrder,
    /// Under `order: adaptive`, the wait after which a class is served
    /// newest first, for a model whose policy sets neither
    /// `slo.queueWaitP95` nor `slo.ttftP95`.
    #[serde(with = "gpuscale_policies::duration")]
    pub newest_first_after: Duration,
}

impl Default for QueueSpec {
    fn default() -> Self {
        QueueSpec {
            max_queue: 256,
            queue_timeout: Duration::from_secs(30),
            max_concurrency: 8,
            order: QueueOrder::default(),
            newest_first_after: Duration::from_secs(1),
        }
    }
}

/// The order a model's waiters of one priority class are served in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueOrder {
    /// Adaptive LIFO: oldest first while the queue keeps up; newest first
    /// while its oldest waiter has waited past the model's budget (see
    /// [`newest_first_after`]), so that under overload the requests that
    /// can still meet the SLO are the ones served.
    #[default]
    Adaptive,
    /// Oldest first, always.
    Fifo,
}

/// How long a model's oldest waiter may wait before its class is served
/// newest first: never under [`QueueOrder::Fifo`]; else the model's
/// `slo.queueWaitP95`, else its `slo.ttftP95` (a waiter past either has
/// missed it, whatever comes next), else `default`
/// (`queue.newestFirstAfter`).
pub fn newest_first_after(
    order: QueueOrder,
    slo: &SloSeconds,
    default: Duration,
) -> Option<Duration> {
    match order {
        QueueOrder::Fifo => None,
        QueueOrder::Adaptive => Some(
            slo.queue_wait
                .or(slo.ttft)
                .map_or(default, Duration::from_secs_f64),
        ),
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
    #[serde(default, with = "gpuscale_policies::duration::option")]
    pub queue_timeout: Option<Duration>,
    /// The order its waiters are served in (default: `queue.order`).
    #[serde(default)]
    pub order: Option<QueueOrder>,
    /// Priority class of requests that do not set one.
    #[serde(default)]
    pub priority: Option<Priority>,
    /// Replica base URLs (`http://host:port`).
    #[serde(default)]
    pub replicas: Vec<String>,
    /// Model-server metrics to scrape from each replica (default:
    /// `upstream.metrics`).
    #[serde(default)]
    pub metrics: Option<MetricsFormat>,
    /// LoRA adapters served by this model's replicas: a request naming one
    /// as its `model` goes to this model's pool, preferring replicas that
    /// have it loaded.
    #[serde(default)]
    pub adapters: Vec<String>,
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
    /// LoRA adapters its replicas serve.
    pub adapters: Vec<String>,
    /// The policy's SLO targets: each request is counted as meeting or
    /// missing them (`gpuscale_slo_requests_total`).
    pub slo: SloSeconds,
    /// A priority class is served newest first while its oldest waiter has
    /// waited this long ([`newest_first_after`]); `None`: oldest first.
    pub newest_first_after: Option<Duration>,
}

/// A model's SLO targets, seconds (from its policy's `slo`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SloSeconds {
    /// p95 queue wait.
    pub queue_wait: Option<f64>,
    /// p95 latency (leaving the queue to the last byte).
    pub latency: Option<f64>,
    /// p95 time to first token (streams).
    pub ttft: Option<f64>,
}

impl SloSeconds {
    /// The targets of a policy.
    pub fn of(slo: &gpuscale_policies::model::SloTargets) -> Self {
        let s = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64());
        SloSeconds {
            queue_wait: s(slo.queue_wait_p95),
            latency: s(slo.latency_p95),
            ttft: s(slo.ttft_p95),
        }
    }
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
            adapters: Vec::new(),
            slo: SloSeconds::default(),
            newest_first_after: newest_first_after(
                q.order,
                &SloSeconds::default(),
                q.newest_first_after,
            ),
        }
    }

    /// Why the adaptive order never serves this model newest first, when
    /// it cannot: its budget is not below its queue timeout, so every
    /// waiter is answered 503 before it has waited past the budget. Not an
    /// error (the queue is served oldest first, a valid order), but rarely
    /// what was meant: the gateway logs it at start.
    pub fn newest_first_unreachable(&self) -> Option<String> {
        let after = self.newest_first_after?;
        (after >= self.queue_timeout).then(|| {
            format!(
                "model `{}`: served oldest first only: its newest-first budget ({after:?}, \
                 from slo.queueWaitP95, slo.ttftP95 or queue.newestFirstAfter) is not below \
                 its queue timeout ({:?}); lower the budget or raise queueTimeout, or say \
                 `order: fifo`",
                self.name, self.queue_timeout
            )
        })
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
        if authority.as_str().contains('@') {
            return Err(format!("`{s}`: an endpoint has no user information"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(format!("`{s}`: an endpoint has no path or query"));
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
    /// The admin API's token, if one is configured.
    pub admin_token: Option<AdminToken>,
    /// The read-only token, if one is configured.
    pub read_token: Option<AdminToken>,
    /// What the discovery API may register.
    pub registration: registration::Rules,
    /// Where priority classes come from.
    pub priorities: priority::Rules,
    /// How requests are spread over replicas.
    pub balance: crate::affinity::Balance,
    /// Clients' rates.
    pub rates: crate::ratelimit::Rates,
}

fn hex_digest(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Settings {
    /// Refuses an admin listener off loopback without a token (anyone who
    /// can reach it could read queues and replica addresses), or with a
    /// token from a file every user of the machine may read (any of them
    /// could register replicas that receive prompts).
    pub fn check_exposure(&self) -> Result<(), String> {
        if self.spec.admin.ip().is_loopback() {
            return Ok(());
        }
        if self.admin_token.is_none() && self.read_token.is_none() {
            return Err(format!(
                "spec.admin: {} is not a loopback address, and no admin token is set: \
                 give one with --admin-token-file, GPUSCALE_ADMIN_TOKEN_FILE or spec.adminTokenFile",
                self.spec.admin
            ));
        }
        for (field, token) in [
            ("the admin token", &self.admin_token),
            ("the read-only token", &self.read_token),
        ] {
            if let Some(file) = token.as_ref().and_then(AdminToken::readable_by_all) {
                return Err(format!(
                    "spec.admin: {} is not a loopback address, and {field}'s file {} is readable \
                     by every user of this machine: chmod 600 it (in Kubernetes, the Secret \
                     volume's defaultMode 0440, as deploy/ sets)",
                    self.spec.admin,
                    file.display()
                ));
            }
        }
        Ok(())
    }

    /// Settings from a spec without a file (tests, embedded mode): models
    /// from `spec.models` and `policies` already loaded.
    pub fn from_spec(
        name: &str,
        spec: GatewaySpec,
        policies: &[gpuscale_policies::Model],
    ) -> Result<Settings, String> {
        let q = spec.queue;
        // At 0s a request that finds no free slot is refused at once: a
        // queue that holds nothing (`maxQueue: 0` says that plainly).
        let zero = "must be above 0s (at 0s every request that finds no free slot gets 503 at \
                    once; `maxQueue: 0` is the way to say no queue)";
        if q.queue_timeout.is_zero() {
            return Err(format!("spec.queue.queueTimeout: {zero}"));
        }
        if q.newest_first_after.is_zero() {
            return Err(
                "spec.queue.newestFirstAfter: must be above 0s (0s would serve every \
                        queue newest first always, starving its oldest waiters; `order: fifo` is \
                        the way to say oldest first)"
                    .into(),
            );
        }
        if let Some(i) = spec
            .models
            .iter()
            .position(|m| m.queue_timeout.is_some_and(|t| t.is_zero()))
        {
            return Err(format!("spec.models[{i}].queueTimeout: {zero}"));
        }
        // One port for both listeners: the second bind fails at start-up,
        // after `validate` said the file was fine.
        let (listen, admin) = (spec.listen, spec.admin);
        if listen.port() != 0
            && listen.port() == admin.port()
            && (listen.ip() == admin.ip()
                || listen.ip().is_unspecified()
                || admin.ip().is_unspecified())
        {
            return Err(format!(
                "spec.admin: {admin} is also spec.listen ({listen}): the traffic and admin \
                 listeners need ports of their own"
            ));
        }
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
                    metrics: spec.upstream.metrics,
                    adapters: p.adapters.clone(),
                    slo: SloSeconds::of(&p.slo),
                    newest_first_after: newest_first_after(
                        q.order,
                        &SloSeconds::of(&p.slo),
                        q.newest_first_after,
                    ),
                },
            );
        }
        for (i, m) in spec.models.iter().enumerate() {
            if let Some(why) = gpuscale_policies::model::unroutable(&m.name) {
                return Err(format!(
                    "spec.models[{i}].name: `{}` {why}",
                    gpuscale_policies::model::shown(&m.name)
                ));
            }
            if let Some(j) = spec.models[..i].iter().position(|x| x.name == m.name) {
                return Err(format!(
                    "spec.models[{i}].name: `{}` is listed twice (spec.models[{j}] too)",
                    gpuscale_policies::model::shown(&m.name)
                ));
            }
            let base = models
                .remove(&m.name)
                .unwrap_or(ModelSettings::from_queue(&m.name, &q));
            let replicas = m
                .replicas
                .iter()
                .enumerate()
                .map(|(j, r)| {
                    let e = Endpoint::parse(r)
                        .map_err(|e| format!("spec.models[{i}].replicas[{j}]: {e}"))?;
                    // What a registration may never name, a file may not
                    // either (a hostname is resolved later, per request).
                    let ip = e
                        .authority()
                        .parse::<std::net::SocketAddr>()
                        .ok()
                        .map(|a| a.ip());
                    if let Some(kind) = ip.and_then(crate::registration::forbidden_kind) {
                        return Err(format!(
                            "spec.models[{i}].replicas[{j}]: `{r}` is a {kind} address, never a replica's"
                        ));
                    }
                    Ok(e)
                })
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(n) = m.max_concurrency
                && !(1..=MAX_CONCURRENCY).contains(&n)
            {
                return Err(format!(
                    "spec.models[{i}].maxConcurrency: must be 1 to {MAX_CONCURRENCY}, got {n}"
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
                    metrics: m.metrics.unwrap_or(spec.upstream.metrics),
                    adapters: if m.adapters.is_empty() {
                        base.adapters
                    } else {
                        m.adapters.clone()
                    },
                    slo: base.slo,
                    newest_first_after: newest_first_after(
                        m.order.unwrap_or(q.order),
                        &base.slo,
                        q.newest_first_after,
                    ),
                },
            );
        }
        if let Some(s) = &spec.sidecar {
            if let Some(why) = gpuscale_policies::model::unroutable(&s.model) {
                return Err(format!(
                    "spec.sidecar.model: `{}` {why}",
                    gpuscale_policies::model::shown(&s.model)
                ));
            }
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
        let mut names: BTreeMap<&str, String> = models
            .keys()
            .map(|k| (k.as_str(), format!("the model `{k}`")))
            .collect();
        // Where a model's adapter is written: its entry in spec.models
        // (the line the loader then points at), else its policy.
        let at = |model: &str, adapter: Option<&str>| -> String {
            match spec.models.iter().position(|s| s.name == model) {
                Some(i) => match adapter
                    .and_then(|a| spec.models[i].adapters.iter().position(|x| x == a))
                {
                    Some(j) => format!("spec.models[{i}].adapters[{j}]"),
                    None => format!("spec.models[{i}].adapters"),
                },
                None => "spec.policies".to_string(),
            }
        };
        for m in models.values() {
            for a in &m.adapters {
                if a.trim().is_empty() {
                    return Err(format!(
                        "{}: an adapter name of `{}` is empty",
                        at(&m.name, Some(a)),
                        m.name
                    ));
                }
                if let Some(other) = names.insert(a, format!("an adapter of `{}`", m.name)) {
                    return Err(format!(
                        "{}: `{a}` (an adapter of `{}`) is already {other}",
                        at(&m.name, Some(a)),
                        m.name
                    ));
                }
            }
            if m.adapters.len() > usize::from(u16::MAX) {
                return Err(format!(
                    "{}: `{}` has more than 65535 adapters",
                    at(&m.name, None),
                    m.name
                ));
            }
        }
        let balance = spec.routing.balance()?;
        if spec.workers == Some(0) {
            return Err("spec.workers: must be at least 1".into());
        }
        if spec.limits.max_header_bytes < 8192 {
            return Err("spec.limits.maxHeaderBytes: must be at least 8192".into());
        }
        let largest = spec.limits.max_body_bytes.max(spec.limits.max_header_bytes);
        if spec.limits.max_buffered_bytes < largest {
            return Err(format!(
                "spec.limits.maxBufferedBytes: must be at least maxBodyBytes and maxHeaderBytes \
                 ({largest}), or no request of the largest size could be read"
            ));
        }
        for (field, value) in [
            ("maxConnections", spec.limits.max_connections),
            ("maxAdminConnections", spec.limits.max_admin_connections),
            ("maxStreamSubscribers", spec.limits.max_stream_subscribers),
        ] {
            if value == 0 {
                return Err(format!("spec.limits.{field}: must be at least 1"));
            }
        }
        for (field, value) in [
            ("limits.headerReadTimeout", spec.limits.header_read_timeout),
            ("limits.bodyReadTimeout", spec.limits.body_read_timeout),
            ("limits.requestTimeout", spec.limits.request_timeout),
            ("limits.streamIdleTimeout", spec.limits.stream_idle_timeout),
            ("limits.writeTimeout", spec.limits.write_timeout),
        ] {
            if value.is_zero() {
                return Err(format!("spec.{field}: must be longer than 0s"));
            }
        }
        if !(1..=MAX_CONCURRENCY).contains(&spec.queue.max_concurrency) {
            return Err(format!(
                "spec.queue.maxConcurrency: must be 1 to {MAX_CONCURRENCY}, got {}",
                spec.queue.max_concurrency
            ));
        }
        if spec.registration.max_replicas_per_model == 0 {
            return Err("spec.registration.maxReplicasPerModel: must be at least 1".into());
        }
        let admin_token = match &spec.admin_token_file {
            Some(f) => {
                Some(AdminToken::from_file(f).map_err(|e| format!("spec.adminTokenFile: {e}"))?)
            }
            None => None,
        };
        let read_token = match &spec.read_token_file {
            Some(f) => {
                Some(AdminToken::from_file(f).map_err(|e| format!("spec.readTokenFile: {e}"))?)
            }
            None => None,
        };
        let mut keys = Vec::new();
        let mut key_rates = Vec::new();
        for (i, k) in spec.priorities.api_keys.iter().enumerate() {
            key_rates.push(match &k.rate {
                Some(r) => Some(r.rate(&format!("spec.priorities.apiKeys[{i}].rate"))?),
                None => None,
            });
            let digest = hex_digest(&k.sha256).ok_or_else(|| {
                format!("spec.priorities.apiKeys[{i}].sha256: expected 64 hex digits (the SHA-256 of the key)")
            })?;
            if let Some(j) = keys
                .iter()
                .position(|o: &priority::KeyRule| o.digest == digest)
            {
                return Err(format!(
                    "spec.priorities.apiKeys[{i}].sha256: the same key as apiKeys[{j}] \
                     (only the first would ever match)"
                ));
            }
            keys.push(priority::KeyRule {
                digest,
                priority: k.priority,
                allow_header: k.allow_header,
            });
        }
        for (i, r) in spec.priorities.routes.iter().enumerate() {
            if !r.path_prefix.starts_with('/') {
                return Err(format!(
                    "spec.priorities.routes[{i}].pathPrefix: must start with `/`"
                ));
            }
        }
        let priorities = priority::Rules {
            trusted_networks: spec.priorities.trusted_networks.clone(),
            forwarded_for: spec.priorities.forwarded_for,
            keys,
            routes: spec
                .priorities
                .routes
                .iter()
                .map(|r| (r.path_prefix.clone(), r.priority))
                .collect(),
        };
        let registration = registration::Rules {
            allowed: spec.registration.allowed_networks.clone(),
            max_replicas_per_model: spec.registration.max_replicas_per_model,
            local: Vec::new(),
        };
        let default_rate = match &spec.limits.client_rate {
            Some(r) => r.rate("spec.limits.clientRate")?,
            None => None,
        };
        Ok(Settings {
            name: name.to_string(),
            spec,
            models,
            admin_token,
            read_token,
            registration,
            priorities,
            balance,
            rates: crate::ratelimit::Rates {
                default: default_rate,
                keys: key_rates,
            },
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
    let mut parsed: GatewayDoc = load::typed(doc)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    parsed.spec.admin_token_file = parsed.spec.admin_token_file.map(|f| dir.join(f));
    parsed.spec.read_token_file = parsed.spec.read_token_file.map(|f| dir.join(f));
    let policy_paths: Vec<PathBuf> = parsed.spec.policies.iter().map(|p| dir.join(p)).collect();
    // (Not the admin token file: `--admin-token-file` may replace it.)
    let missing = doc.missing(document::Document::each("spec.policies", &policy_paths));
    if !missing.is_empty() {
        return Err(Problems(missing));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_rates_are_checked_where_written_and_burst_ten_seconds_by_default() {
        let spec = |v: serde_json::Value| -> GatewaySpec { serde_json::from_value(v).unwrap() };
        let sha = |n: u8| format!("{n:02x}").repeat(32);
        let s = Settings::from_spec(
            "g",
            spec(serde_json::json!({
                "limits": {"clientRate": {"requestsPerMinute": 600}},
                "priorities": {"apiKeys": [
                    {"sha256": sha(1)},
                    {"sha256": sha(2), "rate": {"requestsPerMinute": 0}},
                    {"sha256": sha(3), "rate": {"requestsPerMinute": 30, "burst": 2}},
                    {"sha256": sha(4), "rate": {"requestsPerMinute": 1}},
                ]},
            })),
            &[],
        )
        .unwrap();
        let rate = |per_minute, burst| crate::ratelimit::Rate { per_minute, burst };
        assert_eq!(s.rates.default, Some(rate(600.0, 100.0)));
        assert_eq!(
            s.rates.keys,
            vec![
                None,
                Some(None),
                Some(Some(rate(30.0, 2.0))),
                Some(Some(rate(1.0, 1.0)))
            ]
        );
        for (v, want) in [
            (
                serde_json::json!({"limits": {"clientRate": {"requestsPerMinute": -1}}}),
                "spec.limits.clientRate.requestsPerMinute: must be 0 (no limit), or from",
            ),
            (
                serde_json::json!({"limits": {"clientRate": {"requestsPerMinute": 5, "burst": 0}}}),
                "spec.limits.clientRate.burst: must be at least 1",
            ),
            (
                serde_json::json!({"priorities": {"apiKeys": [
                    {"sha256": sha(1)},
                    {"sha256": sha(2), "rate": {"requestsPerMinute": 1e12}},
                ]}}),
                "spec.priorities.apiKeys[1].rate.requestsPerMinute: must be 0 (no limit), or from",
            ),
            (
                // Below one a week: a wait longer than any clock holds.
                serde_json::json!({"limits": {"clientRate": {"requestsPerMinute": 1e-18}}}),
                "spec.limits.clientRate.requestsPerMinute: must be 0 (no limit), or from",
            ),
            (
                serde_json::json!({"priorities": {"apiKeys": [
                    {"sha256": sha(1)},
                    {"sha256": sha(2)},
                    {"sha256": sha(1).to_uppercase(), "rate": {"requestsPerMinute": 5}},
                ]}}),
                "spec.priorities.apiKeys[2].sha256: the same key as apiKeys[0]",
            ),
        ] {
            let e = Settings::from_spec("g", spec(v), &[]).unwrap_err();
            assert!(e.starts_with(want), "{e}");
        }
        // None configured: no rates at all.
        let s = Settings::from_spec("g", spec(serde_json::json!({})), &[]).unwrap();
        assert_eq!(s.rates, crate::ratelimit::Rates::default());
    }

    #[test]
    fn a_zero_queue_timeout_is_refused_where_it_is_written() {
        let spec = |v: serde_json::Value| -> GatewaySpec { serde_json::from_value(v).unwrap() };
        let e = Settings::from_spec(
            "g",
            spec(serde_json::json!({"queue": {"queueTimeout": "0s"}})),
            &[],
        )
        .unwrap_err();
        assert!(
            e.starts_with("spec.queue.queueTimeout: must be above 0s"),
            "{e}"
        );
        let e = Settings::from_spec(
            "g",
            spec(serde_json::json!({"models": [{"name": "a"}, {"name": "b", "queueTimeout": "0ms"}]})),
            &[],
        )
        .unwrap_err();
        assert!(
            e.starts_with("spec.models[1].queueTimeout: must be above 0s"),
            "{e}"
        );
        assert!(
            Settings::from_spec(
                "g",
                spec(serde_json::json!({"queue": {"queueTimeout": "1ms"}})),
                &[]
            )
            .is_ok()
        );
        let e = Settings::from_spec(
            "g",
            spec(serde_json::json!({"queue": {"newestFirstAfter": "0s"}})),
            &[],
        )
        .unwrap_err();
        assert!(
            e.starts_with("spec.queue.newestFirstAfter: must be above 0s"),
            "{e}"
        );
    }

    #[test]
    fn a_model_name_no_client_can_send_or_given_twice_is_refused() {
        let spec = |v: serde_json::Value| -> GatewaySpec { serde_json::from_value(v).unwrap() };
        for (models, says) in [
            (
                serde_json::json!([{"name": ""}]),
                "spec.models[0].name: `` is empty",
            ),
            (
                serde_json::json!([{"name": "a"}, {"name": "a?b"}]),
                "spec.models[1].name: `a?b` holds",
            ),
            (
                serde_json::json!([{"name": "a"}, {"name": "b"}, {"name": "a"}]),
                "spec.models[2].name: `a` is listed twice (spec.models[0] too)",
            ),
        ] {
            let e = Settings::from_spec("g", spec(serde_json::json!({"models": models})), &[])
                .unwrap_err();
            assert!(e.starts_with(says), "{e}");
        }
        let e = Settings::from_spec(
            "g",
            spec(serde_json::json!({"sidecar": {"model": "a\nb", "upstream": "127.0.0.1:1"}})),
            &[],
        )
        .unwrap_err();
        assert!(
            e.starts_with("spec.sidecar.model: `a\\nb` holds a control"),
            "{e}"
        );
    }

    #[test]
    fn a_listed_replica_is_held_to_what_a_registration_is() {
        let spec = |v: serde_json::Value| -> GatewaySpec { serde_json::from_value(v).unwrap() };
        for (replica, says) in [
            ("http://169.254.169.254:80", "link-local"),
            ("http://[::ffff:169.254.169.254]:80", "link-local"),
            ("http://0.0.0.0:8000", "unspecified"),
        ] {
            let models =
                serde_json::json!([{"name": "m", "replicas": ["http://10.0.0.1:8000", replica]}]);
            let e = Settings::from_spec("g", spec(serde_json::json!({"models": models})), &[])
                .unwrap_err();
            assert!(
                e.starts_with("spec.models[0].replicas[1]: ") && e.contains(says),
                "{e}"
            );
        }
        // A private address and a name are a replica's.
        let models = serde_json::json!([{"name": "m", "replicas": ["http://10.0.0.1:8000", "http://model-server:8000"]}]);
        Settings::from_spec("g", spec(serde_json::json!({"models": models})), &[]).unwrap();
    }

    #[test]
    fn one_port_for_both_listeners_is_refused() {
        let spec = |v: serde_json::Value| -> GatewaySpec { serde_json::from_value(v).unwrap() };
        for (listen, admin, bad) in [
            ("127.0.0.1:9000", "127.0.0.1:9000", true),
            ("0.0.0.0:9000", "127.0.0.1:9000", true),
            ("127.0.0.1:9000", "127.0.0.1:9001", false),
            ("127.0.0.1:0", "127.0.0.1:0", false),
        ] {
            let r = Settings::from_spec(
                "g",
                spec(serde_json::json!({"listen": listen, "admin": admin})),
                &[],
            );
            assert_eq!(r.is_err(), bad, "{listen} {admin}: {r:?}");
            if let Err(e) = r {
                assert!(e.starts_with("spec.admin: "), "{e}");
            }
        }
    }

    /// An adapter's problem is named by its entry, so the loader points
    /// at its line (it pointed at the document's start).
    #[test]
    fn an_adapter_problem_names_its_entry() {
        let spec = |v: serde_json::Value| -> GatewaySpec { serde_json::from_value(v).unwrap() };
        let e = Settings::from_spec(
            "g",
            spec(serde_json::json!({"models": [{"name": "a"}, {"name": "b", "adapters": ["x", " "]}]})),
            &[],
        )
        .unwrap_err();
        assert!(e.starts_with("spec.models[1].adapters[1]: "), "{e}");
        let e = Settings::from_spec(
            "g",
            spec(serde_json::json!({"models": [{"name": "a"}, {"name": "b", "adapters": ["a"]}]})),
            &[],
        )
        .unwrap_err();
        assert!(
            e.starts_with(
                "spec.models[1].adapters[0]: `a` (an adapter of `b`) is already the model `a`"
            ),
            "{e}"
        );
    }

    #[test]
    fn upstream_metrics_is_every_models_default_and_an_entry_overrides_it() {
        let dir = std::env::temp_dir().join(format!("gpuscale-gw-metrics-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let policy = |name: &str| {
            format!(
                "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata: {{name: {name}}}\n\
                 spec:\n  servedName: {name}\n  resources: {{memoryGiB: 10, compute: 0.1, maxConcurrency: 8}}\n"
            )
        };
        std::fs::write(dir.join("a.yaml"), policy("a")).unwrap();
        std::fs::write(dir.join("b.yaml"), policy("b")).unwrap();
        let gateway = |upstream: &str| {
            format!(
                "apiVersion: gpuscale.io/v1alpha1\nkind: Gateway\nmetadata: {{name: g}}\n\
                 spec:\n  policies: [a.yaml, b.yaml]\n  upstream: {upstream}\n  models:\n\
                 \x20   - {{name: b, metrics: none}}\n\
                 \x20   - {{name: c, replicas: [\"http://127.0.0.1:9\"]}}\n\
                 \x20   - {{name: d, metrics: tgi}}\n"
            )
        };
        std::fs::write(dir.join("g.yaml"), gateway("{metrics: vllm}")).unwrap();
        let s = load(&dir.join("g.yaml")).unwrap();
        let metrics = |s: &Settings, m: &str| s.models[m].metrics;
        assert_eq!(metrics(&s, "a"), MetricsFormat::Vllm, "a policy's model");
        assert_eq!(metrics(&s, "b"), MetricsFormat::None, "its entry says none");
        assert_eq!(
            metrics(&s, "c"),
            MetricsFormat::Vllm,
            "an entry that says nothing"
        );
        assert_eq!(metrics(&s, "d"), MetricsFormat::Tgi);
        // Without it, nothing is scraped unless an entry asks.
        std::fs::write(dir.join("g.yaml"), gateway("{}")).unwrap();
        let s = load(&dir.join("g.yaml")).unwrap();
        assert_eq!(metrics(&s, "a"), MetricsFormat::None);
        assert_eq!(metrics(&s, "c"), MetricsFormat::None);
        assert_eq!(metrics(&s, "d"), MetricsFormat::Tgi);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_models_newest_first_budget_is_its_queue_wait_else_its_ttft_else_the_default() {
        let dir = std::env::temp_dir().join(format!("gpuscale-gw-order-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let policy = |name: &str, slo: &str| {
            format!(
                "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata: {{name: {name}}}\n\
                 spec:\n  servedName: {name}\n  resources: {{memoryGiB: 10, compute: 0.1, maxConcurrency: 8}}\n\
                 \x20 slo: {slo}\n"
            )
        };
        std::fs::write(
            dir.join("a.yaml"),
            policy("a", "{queueWaitP95: 300ms, ttftP95: 2s}"),
        )
        .unwrap();
        std::fs::write(
            dir.join("b.yaml"),
            policy("b", "{ttftP95: 2s, latencyP95: 30s}"),
        )
        .unwrap();
        std::fs::write(dir.join("c.yaml"), policy("c", "{latencyP95: 30s}")).unwrap();
        let gateway = |queue: &str| {
            format!(
                "apiVersion: gpuscale.io/v1alpha1\nkind: Gateway\nmetadata: {{name: g}}\n\
                 spec:\n  policies: [a.yaml, b.yaml, c.yaml]\n  queue: {queue}\n  models:\n\
                 \x20   - {{name: d, replicas: [\"http://127.0.0.1:9\"]}}\n\
                 \x20   - {{name: b, order: fifo}}\n"
            )
        };
        let ms = |n: u64| Some(Duration::from_millis(n));
        std::fs::write(dir.join("g.yaml"), gateway("{newestFirstAfter: 750ms}")).unwrap();
        let s = load(&dir.join("g.yaml")).unwrap();
        let budget = |s: &Settings, m: &str| s.models[m].newest_first_after;
        assert_eq!(budget(&s, "a"), ms(300), "its queue-wait target");
        assert_eq!(budget(&s, "b"), None, "its entry says fifo");
        assert_eq!(budget(&s, "c"), ms(750), "no queue-wait or TTFT target");
        assert_eq!(budget(&s, "d"), ms(750), "no policy");
        std::fs::write(dir.join("g.yaml"), gateway("{order: fifo}")).unwrap();
        let s = load(&dir.join("g.yaml")).unwrap();
        assert!(s.models.values().all(|m| m.newest_first_after.is_none()));
        std::fs::write(
            dir.join("g.yaml"),
            gateway("{}").replace("{name: b, order: fifo}", "{name: b}"),
        )
        .unwrap();
        let s = load(&dir.join("g.yaml")).unwrap();
        assert_eq!(budget(&s, "b"), ms(2000), "its TTFT target");
        assert_eq!(budget(&s, "c"), ms(1000), "the default");
        assert!(
            s.models
                .values()
                .all(|m| m.newest_first_unreachable().is_none())
        );
        // A budget the queue timeout cuts off is named (logged at start).
        std::fs::write(
            dir.join("g.yaml"),
            gateway("{queueTimeout: 1500ms}").replace("{name: b, order: fifo}", "{name: b}"),
        )
        .unwrap();
        let s = load(&dir.join("g.yaml")).unwrap();
        let why = s.models["b"].newest_first_unreachable().unwrap();
        assert!(
            why.contains("`b`") && why.contains("2s") && why.contains("1.5s"),
            "{why}"
        );
        assert!(
            s.models["a"].newest_first_unreachable().is_none(),
            "300 ms < 1.5 s"
        );
        assert!(
            s.models["c"].newest_first_unreachable().is_none(),
            "1 s < 1.5 s"
        );
        // A value that is not an order is located.
        std::fs::write(dir.join("g.yaml"), gateway("{order: lifo}")).unwrap();
        let e = load(&dir.join("g.yaml")).unwrap_err().to_string();
        assert!(
            e.contains("g.yaml:6:") && e.contains("spec.queue.order") && e.contains("lifo"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
