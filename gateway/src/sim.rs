//! A simulated OpenAI-compatible model server, for tests, benchmarks and
//! the embedded default: `/v1/chat/completions`, `/v1/completions` (both
//! with SSE streaming), `/v1/embeddings`, `/v1/models`, `/health`, and
//! vLLM-style `/metrics` (`vllm:num_requests_waiting`,
//! `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`,
//! `vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`,
//! `vllm:lora_requests_info`).
//!
//! And the KServe v2 (Open Inference Protocol) REST routes that the
//! gateway forwards, as KServe's model servers and Triton answer them:
//! `POST /v2/models/{name}[/versions/{v}]/infer`, `GET /v2/health/live`,
//! `GET /v2/health/ready`, `GET /v2/models/{name}[/versions/{v}]/ready`
//! and the model's metadata, `GET /v2/models/{name}[/versions/{v}]`. An
//! inference request's tensors are checked as such a server checks them
//! (every input has a name, a shape of non-negative integers, a datatype
//! of the protocol's and as many data elements as its shape holds; else
//! 400 with the protocol's `{"error": …}`); it runs like an embedding: one
//! prefill, of its elements ÷ 4 tokens (a prompt character's weight), no
//! decode, and it answers one FP32 output tensor of shape `[1, 8]`.
//!
//! Latency model: [`SimProfile`], which is
//! [`gpuscale_policies::serving::ServiceProfile`] — the one the trace-driven
//! simulator (`gpuscale simulate`) uses too, so a simulated replica and a
//! simulated server run at the same speed. At most `max_concurrency`
//! requests run at once (the rest wait inside, as in vLLM), and their
//! prefills run one at a time, in the order they start. Prompt tokens are
//! estimated as characters ÷ 4. Its speed, the share of a GPU it runs
//! on, can change while it runs ([`SimServer::set_speed`], `sim_speed` in
//! `/metrics`): the local backend moves a replica so.
//!
//! Prefix cache ([`PrefixCache`]), when the profile gives it room
//! (`prefix_cache_tokens`): the prompt, read as the gateway reads it
//! ([`crate::affinity::canonical`]), is cut into blocks of 16 tokens (64
//! bytes at 4 bytes a token, vLLM's default block size) hashed chained, so
//! a block's hash stands for the whole prefix up to it. The leading blocks
//! found in the cache are hits; prefill then takes only the uncached
//! tokens, at least one (vLLM recomputes the last token). Every block of
//! the prompt then enters the cache, last block first, so that under
//! pressure a sequence's tail is evicted before its head, as vLLM's
//! free-block queue does; the least recently used blocks go first. Hits
//! and queries are counted in tokens, as vLLM counts them. Simplification:
//! the blocks of running requests count in the same LRU rather than being
//! pinned apart from it, and decoded tokens are not cached.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};

use crate::proxy::{Body, ChannelBody, error_response, full};

use gpuscale_policies::serving::PrefillLane;
/// The latency model of a simulated server (one place for it: the
/// simulator uses the same).
pub use gpuscale_policies::serving::ServiceProfile as SimProfile;

/// Waits `d`; no wait at all for zero. (A zero `tokio::time::sleep`
/// still waits for the timer's next 1 ms tick: the `instant` profile
/// would hold every request about a millisecond.)
async fn pause(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

/// Counters of a simulated server.
#[derive(Debug, Default)]
pub struct SimCounters {
    /// Requests received.
    pub requests: AtomicU64,
    /// Requests finished (last byte written).
    pub completed: AtomicU64,
    /// Requests whose client went away before the end.
    pub cancelled: AtomicU64,
    /// Waiting for a slot.
    pub waiting: AtomicU64,
    /// Running.
    pub running: AtomicU64,
    /// The most requests it has held at once, waiting or running (what a
    /// test checks against the concurrency limit the gateways promise).
    pub peak_in_flight: AtomicU64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: AtomicU64,
    /// Prompt tokens found there.
    pub prefix_hits: AtomicU64,
    /// KV tokens of running requests (prompt and output).
    pub running_tokens: AtomicU64,
}

/// A replica's prefix cache: an LRU of chained block hashes
/// ([`crate::affinity::block_hashes`]).
#[derive(Debug)]
pub struct PrefixCache {
    blocks: lru::LruCache<u64, ()>,
}

impl PrefixCache {
    /// A cache of `capacity` blocks (at least one).
    pub fn new(capacity: usize) -> Self {
        PrefixCache {
            blocks: lru::LruCache::new(
                std::num::NonZeroUsize::new(capacity.max(1)).expect("at least one"),
            ),
        }
    }

    /// Looks a prompt's blocks up and caches them: returns how many
    /// leading blocks were cached already.
    pub fn lookup(&mut self, blocks: &[u64]) -> usize {
        let hit = blocks
            .iter()
            .take_while(|b| self.blocks.contains(b))
            .count();
        for b in blocks.iter().rev() {
            self.blocks.put(*b, ());
        }
        hit
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// Bytes per prefix-cache block: 16 tokens at 4 bytes a token.
pub const BLOCK_BYTES: usize = gpuscale_policies::serving::BLOCK_TOKENS as usize * 4;

/// Prompt tokens served from the cache out of `prompt_tokens` when
/// `hit_blocks` leading blocks were cached: at most all but one.
pub fn cached_tokens(hit_blocks: usize, prompt_tokens: u32) -> u32 {
    let cached = (hit_blocks as u64) * u64::from(gpuscale_policies::serving::BLOCK_TOKENS);
    (cached.min(u64::from(prompt_tokens.saturating_sub(1)))) as u32
}

struct Sim {
    profile: SimProfile,
    slots: Arc<Semaphore>,
    counters: Arc<SimCounters>,
    next_id: AtomicU64,
    cache: Option<std::sync::Mutex<PrefixCache>>,
    /// Prefills, one at a time ([`PrefillLane`]), in seconds since
    /// `origin`, and when each booked prefill that has not begun begins
    /// (they wait, as in vLLM's waiting queue).
    lane: std::sync::Mutex<PrefillLane>,
    origin: std::time::Instant,
    /// LoRA adapters it serves, and how many requests for each run now.
    adapters: std::sync::Mutex<Vec<(String, u32)>>,
    /// The share of a GPU it runs on now (`f64` bits): the profile's
    /// `speed` until [`SimServer::set_speed`] changes it.
    speed: AtomicU64,
}

impl Sim {
    /// How much slower than its profile it runs now.
    fn slowdown(&self) -> f64 {
        let now = f64::from_bits(self.speed.load(Ordering::Relaxed));
        if now > 0.0 && self.profile.speed > 0.0 {
            self.profile.speed / now
        } else {
            1.0
        }
    }

    /// [`SimProfile::prefill`] at the speed it runs now.
    fn prefill(&self, prompt_tokens: u32) -> Duration {
        self.profile.prefill(prompt_tokens).mul_f64(self.slowdown())
    }

    /// [`SimProfile::per_token`] at the speed it runs now.
    fn per_token(&self, running: u32) -> Duration {
        self.profile.per_token(running).mul_f64(self.slowdown())
    }
}

/// A running simulated server.
pub struct SimServer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its counters.
    pub counters: Arc<SimCounters>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    sim: Arc<Sim>,
}

impl SimServer {
    /// Runs it from now on at `speed`, a share of a GPU in (0, 1] (its
    /// replica was moved to another share): requests running take the
    /// new pace from their next token.
    pub fn set_speed(&self, speed: f64) -> Result<(), String> {
        if !(speed > 0.0 && speed <= 1.0) {
            return Err(format!("speed must be in (0, 1], got {speed}"));
        }
        self.sim.speed.store(speed.to_bits(), Ordering::Relaxed);
        Ok(())
    }

    /// The share of a GPU it runs on now.
    pub fn speed(&self) -> f64 {
        f64::from_bits(self.sim.speed.load(Ordering::Relaxed))
    }

    /// Stops it: closes the listener and every connection at once (a
    /// replica going away).
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

/// Binds `addr` and serves.
pub async fn start(profile: SimProfile, addr: SocketAddr) -> std::io::Result<SimServer> {
    start_with_adapters(profile, addr, &[]).await
}

/// Connections a simulated server keeps open at once (more are closed
/// as they arrive).
pub const MAX_CONNECTIONS: usize = 4096;

/// Binds `addr` and serves, with LoRA adapters: a request whose `model`
/// names one runs as that adapter and shows in `vllm:lora_requests_info`.
pub async fn start_with_adapters(
    profile: SimProfile,
    addr: SocketAddr,
    adapters: &[String],
) -> std::io::Result<SimServer> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let counters = Arc::new(SimCounters::default());
    let blocks = profile.prefix_cache_tokens / u64::from(gpuscale_policies::serving::BLOCK_TOKENS);
    let sim = Arc::new(Sim {
        slots: Arc::new(Semaphore::new(profile.max_concurrency.max(1) as usize)),
        cache: (blocks > 0).then(|| std::sync::Mutex::new(PrefixCache::new(blocks as usize))),
        adapters: std::sync::Mutex::new(adapters.iter().map(|a| (a.clone(), 0)).collect()),
        lane: std::sync::Mutex::new(PrefillLane::default()),
        origin: std::time::Instant::now(),
        speed: AtomicU64::new(profile.speed.to_bits()),
        profile,
        counters: counters.clone(),
        next_id: AtomicU64::new(0),
    });
    let (shutdown, mut rx) = watch::channel(false);
    let server_sim = sim.clone();
    let task = tokio::spawn(async move {
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(10));
        let graceful = GracefulShutdown::new();
        let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(e) => {
                            // Out of file descriptors and the like: back
                            // off, as the gateway does, rather than spin
                            // on the error at full CPU.
                            tracing::debug!("sim-server accept failed: {e}");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    // Over the cap the connection is closed at once: the
                    // client sees it end rather than wait.
                    let Ok(slot) = connections.clone().try_acquire_owned() else {
                        drop(stream);
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let sim = sim.clone();
                    let service = service_fn(move |req| {
                        let sim = sim.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(sim, req).await) }
                    });
                    let conn = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
                    let mut stop = rx.clone();
                    tokio::spawn(async move {
                        let _slot = slot;
                        tokio::select! {
                            _ = conn => {}
                            _ = stop.changed() => {}
                        }
                    });
                }
                _ = rx.changed() => break,
            }
        }
    });
    Ok(SimServer {
        addr,
        counters,
        shutdown,
        task,
        sim: server_sim,
    })
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: serde_json::Value,
}

#[derive(Deserialize)]
struct PromptFields<'a> {
    #[serde(default, borrow)]
    messages: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    prompt: Option<&'a serde_json::value::RawValue>,
}

#[derive(Deserialize)]
struct GenRequest {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    messages: Vec<Message>,
    #[serde(default)]
    prompt: serde_json::Value,
    #[serde(default)]
    input: serde_json::Value,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    stream: bool,
    /// OpenAI's `stream_options`: `include_usage` asks for a last chunk
    /// with the usage and no choices, before `[DONE]` (as vLLM sends).
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

fn chars(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::String(s) => s.chars().count(),
        serde_json::Value::Array(a) => a.iter().map(chars).sum(),
        serde_json::Value::Object(o) => o.get("text").map(chars).unwrap_or(0),
        _ => 0,
    }
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The word for output token `i` (deterministic, so tests can check
/// content byte for byte).
pub fn token(i: u32) -> String {
    const WORDS: [&str; 8] = [
        "gpu", "scale", "packs", "models", "onto", "slices", "quickly", "today",
    ];
    format!("{} ", WORDS[i as usize % WORDS.len()])
}

async fn handle(sim: Arc<Sim>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/health") => Response::new(full("ok\n")),
        (Method::GET, "/metrics") => {
            let c = &sim.counters;
            // Waiting: for a slot, or (holding one) for the prefills
            // booked before theirs.
            let (prefill_waiting, prefill_seconds, prefills) = {
                let now = sim.origin.elapsed().as_secs_f64();
                let mut lane = crate::lock(&sim.lane);
                (
                    u64::from(lane.waiting(now)),
                    lane.busy_seconds(now),
                    c.requests.load(Ordering::Relaxed),
                )
            };
            let running = c
                .running
                .load(Ordering::Relaxed)
                .saturating_sub(prefill_waiting);
            let kv = if sim.profile.prefix_cache_tokens > 0 {
                (c.running_tokens.load(Ordering::Relaxed) as f64
                    / sim.profile.prefix_cache_tokens as f64)
                    .min(1.0)
            } else {
                running as f64 / f64::from(sim.profile.max_concurrency.max(1))
            };
            let lora = {
                let adapters = crate::lock(&sim.adapters);
                if adapters.is_empty() {
                    String::new()
                } else {
                    let running: Vec<&str> = adapters
                        .iter()
                        .filter(|(_, n)| *n > 0)
                        .map(|(a, _)| a.as_str())
                        .collect();
                    format!(
                        "# TYPE vllm:lora_requests_info gauge\n\
                         vllm:lora_requests_info{{max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"\"}} {}\n",
                        adapters.len(),
                        running.join(","),
                        now_unix()
                    )
                }
            };
            let text = format!(
                "# TYPE vllm:num_requests_waiting gauge\n\
                 vllm:num_requests_waiting{{model_name=\"{m}\"}} {}\n\
                 # TYPE vllm:num_requests_running gauge\n\
                 vllm:num_requests_running{{model_name=\"{m}\"}} {running}\n\
                 # TYPE vllm:request_prefill_time_seconds histogram\n\
                 vllm:request_prefill_time_seconds_bucket{{model_name=\"{m}\",le=\"+Inf\"}} {prefills}\n\
                 vllm:request_prefill_time_seconds_sum{{model_name=\"{m}\"}} {prefill_seconds}\n\
                 vllm:request_prefill_time_seconds_count{{model_name=\"{m}\"}} {prefills}\n\
                 # TYPE vllm:kv_cache_usage_perc gauge\n\
                 vllm:kv_cache_usage_perc{{model_name=\"{m}\"}} {}\n\
                 # TYPE vllm:prefix_cache_queries counter\n\
                 vllm:prefix_cache_queries_total{{model_name=\"{m}\"}} {}\n\
                 # TYPE vllm:prefix_cache_hits counter\n\
                 vllm:prefix_cache_hits_total{{model_name=\"{m}\"}} {}\n\
                 {lora}\
                 # TYPE sim_requests_total counter\n\
                 sim_requests_total {}\n\
                 # TYPE sim_cancelled_total counter\n\
                 sim_cancelled_total {}\n\
                 # TYPE sim_speed gauge\n\
                 sim_speed {}\n",
                c.waiting.load(Ordering::Relaxed) + prefill_waiting,
                kv,
                c.prefix_queries.load(Ordering::Relaxed),
                c.prefix_hits.load(Ordering::Relaxed),
                c.requests.load(Ordering::Relaxed),
                c.cancelled.load(Ordering::Relaxed),
                f64::from_bits(sim.speed.load(Ordering::Relaxed)),
                m = sim.profile.model,
            );
            let mut r = Response::new(full(text));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        (Method::GET, "/v1/models") => {
            // As vLLM lists them: the base model, then each LoRA adapter
            // with the base model as its parent.
            let mut data = vec![serde_json::json!(
                {"id": sim.profile.model, "object": "model", "owned_by": "gpuscale-sim"}
            )];
            for (a, _) in crate::lock(&sim.adapters).iter() {
                data.push(serde_json::json!({"id": a, "object": "model",
                    "owned_by": "gpuscale-sim", "parent": sim.profile.model}));
            }
            json(serde_json::json!({"object": "list", "data": data}))
        }
        (Method::POST, "/v1/chat/completions" | "/v1/completions" | "/v1/embeddings") => {
            generate(sim, &path, req).await
        }
        (Method::GET, "/v2/health/live") => json(serde_json::json!({"live": true})),
        (Method::GET, "/v2/health/ready") => json(serde_json::json!({"ready": true})),
        (method, p) if p.starts_with("/v2/models/") => {
            let rest = &p["/v2/models/".len()..];
            kserve(sim, &method, rest, req).await
        }
        _ => error_response(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no such endpoint",
        ),
    }
}

/// The protocol's error answer: `{"error": message}`.
fn kserve_error(status: StatusCode, message: &str) -> Response<Body> {
    let mut r = json(serde_json::json!({ "error": message }));
    *r.status_mut() = status;
    r
}

/// The Open Inference Protocol's tensor datatypes.
const KSERVE_DATATYPES: [&str; 13] = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
    "FP32", "FP64", "BYTES",
];

/// One input tensor of an inference request.
#[derive(Deserialize)]
struct KserveInput {
    name: String,
    shape: Vec<u64>,
    datatype: String,
    data: serde_json::Value,
}

/// An inference request (`parameters` and `outputs` are accepted and not
/// used: the simulated model has one output).
#[derive(Deserialize)]
struct KserveRequest {
    #[serde(default)]
    id: Option<String>,
    inputs: Vec<KserveInput>,
}

/// Data elements of a tensor's `data`, flattened (nested arrays are the
/// protocol's row-major form).
fn elements(v: &serde_json::Value) -> u64 {
    match v {
        serde_json::Value::Array(a) => a.iter().map(elements).sum(),
        _ => 1,
    }
}

/// The input elements of a KServe v2 inference request, or why it is
/// not one.
fn kserve_elements(body: &[u8]) -> Result<(Option<String>, u64), String> {
    let r: KserveRequest =
        serde_json::from_slice(body).map_err(|e| format!("invalid inference request: {e}"))?;
    if r.inputs.is_empty() {
        return Err("invalid inference request: no inputs".into());
    }
    let mut total: u64 = 0;
    for (i, input) in r.inputs.iter().enumerate() {
        if input.name.is_empty() {
            return Err(format!("input {i}: empty name"));
        }
        if !KSERVE_DATATYPES.contains(&input.datatype.as_str()) {
            return Err(format!(
                "input '{}': unknown datatype '{}'",
                input.name, input.datatype
            ));
        }
        let expected = input
            .shape
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| format!("input '{}': shape too large", input.name))?;
        let got = elements(&input.data);
        if got != expected {
            return Err(format!(
                "input '{}': shape {:?} holds {expected} elements, data has {got}",
                input.name, input.shape
            ));
        }
        total = total.saturating_add(got);
    }
    Ok((r.id, total))
}

/// The KServe v2 routes under `/v2/models/` (`rest` follows it).
async fn kserve(
    sim: Arc<Sim>,
    method: &Method,
    rest: &str,
    req: Request<Incoming>,
) -> Response<Body> {
    let served = |name: &str| {
        name == sim.profile.model || crate::lock(&sim.adapters).iter().any(|(a, _)| a == name)
    };
    let decoded = percent_encoding::percent_decode_str(rest)
        .decode_utf8_lossy()
        .into_owned();
    // `{name}[/versions/{v}]` and what follows it (`infer`, `ready`,
    // nothing for the metadata).
    let (target, action) = if *method == Method::POST {
        match decoded.strip_suffix("/infer") {
            Some(name) => (name.to_string(), "infer"),
            None => return kserve_error(StatusCode::NOT_FOUND, "no such endpoint"),
        }
    } else if let Some(name) = decoded.strip_suffix("/ready") {
        (name.to_string(), "ready")
    } else {
        (decoded.clone(), "metadata")
    };
    let (name, version) = match target.rsplit_once("/versions/") {
        Some((n, v)) if !served(&target) && !v.contains('/') => {
            (n.to_string(), Some(v.to_string()))
        }
        _ => (target, None),
    };
    if !served(&name) {
        return kserve_error(StatusCode::NOT_FOUND, &format!("Model {name} is not found"));
    }
    match (method.clone(), action) {
        (Method::GET, "ready") => json(serde_json::json!({"name": name, "ready": true})),
        (Method::GET, "metadata") => json(serde_json::json!({
            "name": name,
            "versions": version.into_iter().collect::<Vec<_>>(),
            "platform": "gpuscale-sim",
            "inputs": [],
            "outputs": [{"name": "output0", "datatype": "FP32", "shape": [1, 8]}]
        })),
        (Method::POST, "infer") => infer(sim, name, version, req).await,
        _ => kserve_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"),
    }
}

/// A KServe v2 inference: one prefill, no decode (module docs).
async fn infer(
    sim: Arc<Sim>,
    model: String,
    version: Option<String>,
    req: Request<Incoming>,
) -> Response<Body> {
    sim.counters.requests.fetch_add(1, Ordering::Relaxed);
    let Ok(body) = Limited::new(req.into_body(), 16 << 20).collect().await else {
        return kserve_error(StatusCode::BAD_REQUEST, "bad body");
    };
    let (id, elements) = match kserve_elements(&body.to_bytes()) {
        Ok(parsed) => parsed,
        Err(e) => return kserve_error(StatusCode::BAD_REQUEST, &e),
    };
    let tokens = u32::try_from(elements.div_ceil(4))
        .unwrap_or(u32::MAX)
        .max(1);
    let Some((mut guard, permit)) = admit(&sim).await else {
        return kserve_error(StatusCode::SERVICE_UNAVAILABLE, "closed");
    };
    let prefill = book_prefill(&sim, sim.prefill(tokens));
    let running = Running::start(&sim, u64::from(tokens), &model);
    {
        let _running = Gauge::up(&sim.counters.running);
        pause(prefill).await;
    }
    drop((permit, running));
    guard.armed = false;
    sim.counters.completed.fetch_add(1, Ordering::Relaxed);
    let id = id.unwrap_or_else(|| format!("sim-{}", sim.next_id.fetch_add(1, Ordering::Relaxed)));
    let data: Vec<f64> = (0..8).map(|k| (k as f64 * 0.37).sin()).collect();
    let mut answer = serde_json::json!({
        "model_name": model,
        "id": id,
        "outputs": [{"name": "output0", "datatype": "FP32", "shape": [1, 8], "data": data}]
    });
    if let Some(v) = version {
        answer["model_version"] = v.into();
    }
    json(answer)
}

fn json(v: serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// Waits for one of the server's slots, counted as waiting meanwhile:
/// the slot, and the guard that counts the request cancelled if its
/// client goes away before the end; `None` once the server has closed.
async fn admit(sim: &Arc<Sim>) -> Option<(CancelGuard, tokio::sync::OwnedSemaphorePermit)> {
    let mut guard = CancelGuard {
        counters: sim.counters.clone(),
        armed: true,
    };
    let _waiting = Gauge::up(&sim.counters.waiting);
    let held =
        sim.counters.waiting.load(Ordering::Relaxed) + sim.counters.running.load(Ordering::Relaxed);
    sim.counters
        .peak_in_flight
        .fetch_max(held, Ordering::Relaxed);
    match sim.slots.clone().acquire_owned().await {
        Ok(permit) => Some((guard, permit)),
        Err(_) => {
            guard.armed = false;
            None
        }
    }
}

/// Books a prefill of `took` behind those already booked on this replica
/// (one at a time): how long from now until it is done.
fn book_prefill(sim: &Sim, took: Duration) -> Duration {
    let now = sim.origin.elapsed().as_secs_f64();
    let end = crate::lock(&sim.lane).book(now, took.as_secs_f64());
    Duration::from_secs_f64((end - now).max(0.0))
}

/// Counts a request as cancelled unless disarmed (dropped with the
/// handler when the client goes away).
struct CancelGuard {
    counters: Arc<SimCounters>,
    armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            self.counters.cancelled.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What a running request holds: its KV tokens, and a count on its
/// adapter; given back when dropped.
struct Running {
    sim: Arc<Sim>,
    tokens: u64,
    adapter: Option<String>,
}

impl Running {
    fn start(sim: &Arc<Sim>, tokens: u64, model: &str) -> Running {
        sim.counters
            .running_tokens
            .fetch_add(tokens, Ordering::Relaxed);
        let mut adapters = crate::lock(&sim.adapters);
        let adapter = adapters.iter_mut().find(|(a, _)| a == model).map(|(a, n)| {
            *n += 1;
            a.clone()
        });
        Running {
            sim: sim.clone(),
            tokens,
            adapter,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.sim
            .counters
            .running_tokens
            .fetch_sub(self.tokens, Ordering::Relaxed);
        if let Some(a) = &self.adapter
            && let Some((_, n)) = crate::lock(&self.sim.adapters)
                .iter_mut()
                .find(|(x, _)| x == a)
        {
            *n = n.saturating_sub(1);
        }
    }
}

/// Decrements a gauge when dropped.
struct Gauge<'a>(&'a AtomicU64);

impl<'a> Gauge<'a> {
    fn up(a: &'a AtomicU64) -> Self {
        a.fetch_add(1, Ordering::Relaxed);
        Gauge(a)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn generate(sim: Arc<Sim>, path: &str, req: Request<Incoming>) -> Response<Body> {
    sim.counters.requests.fetch_add(1, Ordering::Relaxed);
    let body = match Limited::new(req.into_body(), 16 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", "bad body");
        }
    };
    let r: GenRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("invalid JSON: {e}"),
            );
        }
    };
    let model = r.model.clone().unwrap_or_else(|| sim.profile.model.clone());
    // As vLLM answers a model it does not serve (neither its served name
    // nor a LoRA adapter it has): 404, so a request routed to the wrong
    // replicas shows, instead of being served as if it were right.
    if model != sim.profile.model && !crate::lock(&sim.adapters).iter().any(|(a, _)| *a == model) {
        return error_response(
            StatusCode::NOT_FOUND,
            "NotFoundError",
            &format!("The model `{model}` does not exist."),
        );
    }
    let chat = path == "/v1/chat/completions";
    let embeddings = path == "/v1/embeddings";
    let prompt_chars = if chat {
        r.messages.iter().map(|m| chars(&m.content)).sum()
    } else if embeddings {
        chars(&r.input)
    } else {
        chars(&r.prompt)
    };
    let prompt_tokens = (prompt_chars as u32).div_ceil(4).max(1);
    // The prefix cache (not for embeddings: no KV cache to reuse).
    let cached = match (&sim.cache, embeddings) {
        (Some(cache), false) => {
            let fields: PromptFields = serde_json::from_slice(&body).unwrap_or(PromptFields {
                messages: None,
                prompt: None,
            });
            let canonical = crate::affinity::canonical(&crate::affinity::Prompt {
                messages: fields.messages.filter(|_| chat),
                prompt: fields.prompt.filter(|_| !chat),
            });
            let blocks = canonical
                .map(|c| crate::affinity::block_hashes(&c.bytes, BLOCK_BYTES))
                .unwrap_or_default();
            let hit = crate::lock(cache).lookup(&blocks);
            let cached = cached_tokens(hit, prompt_tokens);
            let c = &sim.counters;
            c.prefix_queries
                .fetch_add(u64::from(prompt_tokens), Ordering::Relaxed);
            c.prefix_hits
                .fetch_add(u64::from(cached), Ordering::Relaxed);
            cached
        }
        _ => 0,
    };
    let prefill = sim.prefill(prompt_tokens - cached);
    let max_tokens = if embeddings {
        0
    } else {
        r.max_completion_tokens
            .or(r.max_tokens)
            .unwrap_or(sim.profile.default_max_tokens)
            .min(8192)
    };
    let Some((mut guard, permit)) = admit(&sim).await else {
        return error_response(StatusCode::SERVICE_UNAVAILABLE, "server_error", "closed");
    };
    let prefill = book_prefill(&sim, prefill);
    let running = Running::start(
        &sim,
        u64::from(prompt_tokens) + u64::from(max_tokens),
        &model,
    );
    let id = sim.next_id.fetch_add(1, Ordering::Relaxed);
    let created = now_unix();
    let usage = serde_json::json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens
    });
    if embeddings {
        let _running = Gauge::up(&sim.counters.running);
        pause(prefill).await;
        drop((permit, running));
        guard.armed = false;
        sim.counters.completed.fetch_add(1, Ordering::Relaxed);
        let inputs = match &r.input {
            serde_json::Value::Array(a) if a.iter().all(|x| x.is_string()) => a.len().max(1),
            _ => 1,
        };
        let data: Vec<serde_json::Value> = (0..inputs)
            .map(|i| {
                let v: Vec<f64> = (0..8).map(|k| ((i * 8 + k) as f64 * 0.37).sin()).collect();
                serde_json::json!({"object": "embedding", "index": i, "embedding": v})
            })
            .collect();
        return json(serde_json::json!({
            "object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        }));
    }
    let object = if chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    let rid = format!("{}-sim-{id}", if chat { "chatcmpl" } else { "cmpl" });
    if !r.stream {
        let _running = Gauge::up(&sim.counters.running);
        pause(prefill).await;
        let mut text = String::new();
        for i in 0..max_tokens {
            let running = sim.counters.running.load(Ordering::Relaxed) as u32;
            pause(sim.per_token(running)).await;
            text.push_str(&token(i));
        }
        drop((permit, running));
        guard.armed = false;
        sim.counters.completed.fetch_add(1, Ordering::Relaxed);
        let choice = if chat {
            serde_json::json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length", "logprobs": null})
        } else {
            serde_json::json!({"index": 0, "text": text, "finish_reason": "length", "logprobs": null})
        };
        return json(serde_json::json!({
            "id": rid, "object": object, "created": created, "model": model,
            "choices": [choice], "usage": usage
        }));
    }
    // Streaming: a task produces the chunks; a send that fails means the
    // client went away.
    guard.armed = false;
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let counters = sim.counters.clone();
    let include_usage = r.stream_options.as_ref().is_some_and(|o| o.include_usage);
    tokio::spawn(async move {
        let _permit = permit;
        let _running = running;
        let _running = Gauge::up(&counters.running);
        let chunk_object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let send = |v: serde_json::Value| Bytes::from(format!("data: {v}\n\n"));
        pause(prefill).await;
        for i in 0..max_tokens {
            if i > 0 {
                let running = counters.running.load(Ordering::Relaxed) as u32;
                pause(sim.per_token(running)).await;
            }
            let choice = if chat {
                let mut delta = serde_json::json!({"content": token(i)});
                if i == 0 {
                    delta["role"] = "assistant".into();
                }
                serde_json::json!({"index": 0, "delta": delta, "finish_reason": null})
            } else {
                serde_json::json!({"index": 0, "text": token(i), "finish_reason": null})
            };
            let v = serde_json::json!({"id": rid, "object": chunk_object, "created": created, "model": model, "choices": [choice]});
            if tx.send(send(v)).await.is_err() {
                counters.cancelled.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let end = if chat {
            serde_json::json!({"index": 0, "delta": {}, "finish_reason": "length"})
        } else {
            serde_json::json!({"index": 0, "text": "", "finish_reason": "length"})
        };
        let v = serde_json::json!({"id": rid, "object": chunk_object, "created": created, "model": model, "choices": [end]});
        let usage_chunk = include_usage.then(|| {
            send(serde_json::json!({"id": rid, "object": chunk_object, "created": created, "model": model, "choices": [], "usage": usage}))
        });
        if tx.send(send(v)).await.is_err()
            || match usage_chunk {
                Some(u) => tx.send(u).await.is_err(),
                None => false,
            }
            || tx
                .send(Bytes::from_static(b"data: [DONE]\n\n"))
                .await
                .is_err()
        {
            counters.cancelled.fetch_add(1, Ordering::Relaxed);
            return;
        }
        counters.completed.fetch_add(1, Ordering::Relaxed);
    });
    let mut resp = Response::new(ChannelBody::new(rx).boxed_unsync());
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_cache_counts_leading_hits_and_evicts_tails_first() {
        let mut c = PrefixCache::new(4);
        assert_eq!(c.lookup(&[1, 2, 3]), 0, "cold");
        assert_eq!(c.lookup(&[1, 2, 3, 4]), 3, "a longer turn hits its history");
        assert_eq!(c.lookup(&[1, 9, 3]), 1, "only the leading run counts");
        // Full: block 9 evicted block 4, the tail of the longest
        // sequence, inserted first and so least recently used.
        assert_eq!(c.len(), 4);
        assert_eq!(c.lookup(&[1, 2]), 2, "the head survived");
        assert_eq!(c.lookup(&[5, 6, 7, 8]), 0);
        assert_eq!(c.lookup(&[5, 6]), 2);
        assert_eq!(c.lookup(&[1]), 0, "evicted by the newer sequence");
        // Tokens: 16 per block, never the whole prompt.
        assert_eq!(cached_tokens(2, 100), 32);
        assert_eq!(cached_tokens(2, 32), 31, "the last token is recomputed");
        assert_eq!(cached_tokens(0, 1), 0);
    }

    #[test]
    fn smaller_shares_and_bigger_batches_are_slower() {
        let whole = SimProfile::named("small", "m").unwrap();
        let slice = SimProfile {
            speed: 3.0 / 7.0,
            ..whole.clone()
        };
        assert!(slice.per_token(1) > whole.per_token(1));
        assert!(slice.prefill(1000) > whole.prefill(1000));
        assert!(whole.per_token(16) > whole.per_token(1));
        // Throughput still grows with the batch: 16 requests at once emit
        // more tokens per second than one.
        let tps = |n: u32| f64::from(n) / whole.per_token(n).as_secs_f64();
        assert!(tps(16) > 10.0 * tps(1));
        assert_eq!(
            SimProfile::named("instant", "m").unwrap().per_token(8),
            Duration::ZERO
        );
    }
}
