//! The gateway's shared state and the async shell around [`admission`]:
//! a request waits for a slot (a oneshot channel per waiter), a [`Permit`]
//! holds the slot until the response's last byte and hands it on when
//! dropped; every change updates the gauges and wakes the `/v1/queues`
//! stream; a request for a model with no replica signals the autoscaler.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuscale_policies::model::Priority;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::{broadcast, oneshot, watch};

use crate::admission::{Enqueued, Group, Pool, ReplicaId, Slot};
use crate::affinity::{Hint, Reason};
use crate::config::{Endpoint, ModelSettings, Settings};
use crate::fairness::Client;
use crate::lock;
use crate::metrics::{CodeLabels, Metrics, ModelLabel, ReasonLabels};
use crate::stats::ModelStats;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// Why a request was refused before reaching a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// The queue was full (429).
    QueueFull,
    /// A more important request took this one's place in a full queue (429).
    Displaced,
    /// It had waited past its model's budget in a full, backed-up queue and
    /// a newer request took its place (503).
    Overdue,
    /// The wait passed the queue timeout (503).
    Timeout,
    /// The gateway is shutting down (503).
    ShuttingDown,
    /// Its client held more of the full queue than another client, whose
    /// request took this one's place (429; [`crate::fairness`]).
    Crowded,
    /// Its client had sent its rate's worth (429; [`crate::ratelimit`]).
    RateLimited,
}

impl Reject {
    /// Every reason, for the counters that start at 0.
    pub const ALL: [Reject; 7] = [
        Reject::QueueFull,
        Reject::Displaced,
        Reject::Overdue,
        Reject::Timeout,
        Reject::ShuttingDown,
        Reject::Crowded,
        Reject::RateLimited,
    ];

    /// The codes besides 200 the gateway answers a model's requests with
    /// itself (refused: 429, 503; the upstream failed or timed out: 502,
    /// 504), whose `requests_total` series start at 0.
    pub const CODES: [u16; 4] = [429, 502, 503, 504];

    /// Label value for `gpuscale_rejections_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Reject::QueueFull => "queue_full",
            Reject::Displaced => "displaced",
            Reject::Overdue => "overdue",
            Reject::Timeout => "queue_timeout",
            Reject::ShuttingDown => "shutting_down",
            Reject::Crowded => "fair_share",
            Reject::RateLimited => "rate_limited",
        }
    }
}

/// Why a replica was not registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    /// The model is not configured.
    #[error("the model is not configured")]
    UnknownModel,
    /// The model has as many replicas as it may.
    #[error("the model already has {0} replicas, the most registration.maxReplicasPerModel allows")]
    TooMany(usize),
}

type Waiter = oneshot::Sender<Result<Slot, Reject>>;

struct Inner {
    pool: Pool<Waiter>,
    last_signal: Option<Instant>,
}

/// One model: settings, pool, statistics.
pub struct ModelState {
    /// Resolved settings.
    pub settings: ModelSettings,
    inner: Mutex<Inner>,
    stats: Mutex<ModelStats>,
    handles: Handles,
    /// [`Shared::version`], bumped on every change of this model.
    version: watch::Sender<u64>,
}

/// The model's metric series, looked up once (the hot path touches no
/// metric family map).
struct Handles {
    queue_depth: Gauge,
    in_flight: Gauge,
    replicas: Gauge,
    queue_wait: Histogram,
    latency: Histogram,
    ttft: Histogram,
    /// `requests_total{code="200"}`, the common case.
    ok: Counter,
    upstream_errors: Counter,
    scale_signals: Counter,
    newest_first: Counter,
    /// `route_decisions_total` by [`Reason::index`].
    routes: [Counter; 5],
    /// Per SLO the model declares: its target (seconds) and the met and
    /// missed counters.
    slo_queue_wait: Option<SloCounter>,
    slo_latency: Option<SloCounter>,
    slo_ttft: Option<SloCounter>,
}

/// One SLO target and its two counters.
struct SloCounter {
    target: f64,
    met: Counter,
    missed: Counter,
}

impl SloCounter {
    fn new(m: &Metrics, model: &str, slo: &str, target: Option<f64>) -> Option<Self> {
        let counter = |result: &str| {
            m.slo
                .get_or_create(&crate::metrics::SloLabels {
                    model: model.to_string(),
                    slo: slo.to_string(),
                    result: result.to_string(),
                })
                .clone()
        };
        target.map(|target| SloCounter {
            target,
            met: counter("met"),
            missed: counter("missed"),
        })
    }

    fn count(this: &Option<Self>, seconds: f64) {
        if let Some(c) = this {
            if seconds <= c.target {
                c.met.inc();
            } else {
                c.missed.inc();
            }
        }
    }
}

impl Handles {
    fn new(m: &Metrics, l: &ModelLabel, settings: &crate::config::ModelSettings) -> Self {
        m.queue_limit
            .get_or_create(l)
            .set(i64::try_from(settings.max_queue).unwrap_or(i64::MAX));
        // Refusals at 0 for every reason and code, so an increase() sees
        // the first wave of them.
        for r in Reject::ALL {
            let _ = m.rejections.get_or_create(&ReasonLabels {
                model: l.model.clone(),
                reason: r.reason().into(),
            });
        }
        for code in Reject::CODES {
            let _ = m.requests.get_or_create(&CodeLabels {
                model: l.model.clone(),
                code,
            });
        }
        Handles {
            slo_queue_wait: SloCounter::new(m, &l.model, "queue_wait", settings.slo.queue_wait),
            slo_latency: SloCounter::new(m, &l.model, "latency", settings.slo.latency),
            slo_ttft: SloCounter::new(m, &l.model, "ttft", settings.slo.ttft),
            queue_depth: m.queue_depth.get_or_create(l).clone(),
            in_flight: m.in_flight.get_or_create(l).clone(),
            replicas: m.replicas.get_or_create(l).clone(),
            queue_wait: m.queue_wait.get_or_create(l).clone(),
            latency: m.latency.get_or_create(l).clone(),
            ttft: m.ttft.get_or_create(l).clone(),
            // Present at 0 from the start, so a rate() over them works
            // before the first event.
            upstream_errors: m.upstream_errors.get_or_create(l).clone(),
            scale_signals: m.scale_signals.get_or_create(l).clone(),
            newest_first: m.newest_first.get_or_create(l).clone(),

            routes: Reason::ALL.map(|r| {
                m.route_decisions
                    .get_or_create(&ReasonLabels {
                        model: l.model.clone(),
                        reason: r.label().into(),
                    })
                    .clone()
            }),
            ok: m
                .requests
                .get_or_create(&CodeLabels {
                    model: l.model.clone(),
                    code: 200,
                })
                .clone(),
        }
    }
}

impl ModelState {
    /// The request was admitted (its queue wait counted) and then failed
    /// at the replica (the gateway answers 502 or 504): it misses the
    /// targets counted when the answer is known, latency and TTFT, as a
    /// refused request misses them all.
    pub(crate) fn missed_after_admission(&self) {
        let h = &self.handles;
        for c in [&h.slo_latency, &h.slo_ttft].into_iter().flatten() {
            c.missed.inc();
        }
    }

    /// The index of one of the model's adapters.
    pub fn adapter_id(&self, name: &str) -> Option<u16> {
        self.settings
            .adapters
            .iter()
            .position(|a| a == name)
            .and_then(|i| u16::try_from(i).ok())
    }

    /// Updates a model's gauges and wakes watchers.
    fn changed(&self, pool: &Pool<Waiter>) {
        // A store only on change: both workers write these, and an
        // unchanged line stays shared between their caches.
        let set = |g: &Gauge, v: i64| {
            if g.get() != v {
                g.set(v);
            }
        };
        let h = &self.handles;
        set(&h.queue_depth, pool.waiting() as i64);
        set(&h.in_flight, i64::from(pool.in_flight()));
        set(&h.replicas, pool.ready_replicas() as i64);
        // Waking watchers costs a few locks: only when someone watches
        // (a `/v1/queues/stream` client, the embedded autoscaler).
        if self.version.receiver_count() > 0 {
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// Records a queue wait from `arrived` to `now` (the `/v1/queues`
    /// quantiles and `gpuscale_queue_wait_seconds`); returns it, seconds.
    fn record_wait(&self, arrived: Instant, now: Instant) -> f64 {
        let wait = now.saturating_duration_since(arrived).as_secs_f64();
        lock(&self.stats).queue_wait.record(now, wait);
        self.handles.queue_wait.observe(wait);
        wait
    }

    /// Hands freed slots to waiters; a waiter that is gone gives its slot
    /// straight back.
    fn dispatch(&self, inner: &mut Inner) {
        if inner.pool.waiting() == 0 {
            self.changed(&inner.pool);
            return;
        }
        let now = Instant::now();
        let overtaken = inner.pool.newest_first_grants();
        loop {
            let grants = inner.pool.dispatch(now);
            if grants.is_empty() {
                break;
            }
            for (w, slot) in grants {
                let replica = slot.replica;
                if w.send(Ok(slot)).is_err() {
                    inner.pool.release(replica);
                }
            }
        }
        let overtook = inner.pool.newest_first_grants() - overtaken;
        if overtook > 0 {
            self.handles.newest_first.inc_by(overtook);
        }
        self.changed(&inner.pool);
    }

    /// A slot on `replica` for a request that arrived at `arrived`: records
    /// its queue wait, and its arrival too when it never queued (`now` is
    /// then `arrived`: one lock, one clock read).
    fn permit(self: &Arc<Self>, slot: Slot, hint: Hint, arrived: Instant, queued: bool) -> Permit {
        let now = if queued { Instant::now() } else { arrived };
        if !queued {
            lock(&self.stats).arrivals.record(arrived);
        }
        let wait = self.record_wait(arrived, now);
        SloCounter::count(&self.handles.slo_queue_wait, wait);
        self.handles.routes[slot.reason.index()].inc();
        Permit {
            model: self.clone(),
            replica: slot.replica,
            endpoint: slot.endpoint,
            reason: slot.reason,
            // A retry elsewhere is routed as this slot was.
            hint: Hint {
                shared: slot.shared,
                ..hint
            },
            admitted: now,
            arrived,
            answered: false,
            replica_answered: slot.answered,
            noted: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Counts an answered request by status code.
    pub fn count_response(&self, metrics: &Metrics, code: u16) {
        if code == 200 {
            self.handles.ok.inc();
        } else {
            metrics
                .requests
                .get_or_create(&CodeLabels {
                    model: self.settings.name.clone(),
                    code,
                })
                .inc();
        }
    }
}

/// A request for a model that has no replica: start one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScaleSignal {
    /// Served model name.
    pub model: String,
    /// Requests waiting when it was sent.
    pub waiting: usize,
}

/// State shared by the traffic and admin listeners.
pub struct Shared {
    /// Settings.
    pub settings: Settings,
    /// Models by served name.
    pub models: BTreeMap<String, Arc<ModelState>>,
    /// Metrics.
    pub metrics: Metrics,
    /// Their registry.
    pub registry: Registry,
    /// Bumped on every queue, in-flight or replica change.
    pub version: watch::Sender<u64>,
    /// Scale-from-zero signals.
    pub signals: broadcast::Sender<ScaleSignal>,
    /// No new requests once set.
    pub shutting_down: AtomicBool,
    /// `/v1/queues/stream` subscribers now.
    pub stream_subscribers: std::sync::atomic::AtomicUsize,
    /// The request bytes the traffic listener holds
    /// (`limits.maxBufferedBytes`).
    pub buffered: Arc<crate::budget::Budget>,
    /// The header that names the model (parsed once).
    pub model_header: http::HeaderName,
    /// The header that sets the priority class (parsed once).
    pub priority_header: http::HeaderName,
    /// Adapter names → the served model whose replicas serve them, and the
    /// adapter's index in that model's list.
    pub adapters: BTreeMap<String, (String, u16)>,
    /// This process's `Via` entry (`1.1 gpuscale-<random>`, RFC 9110
    /// §7.6.3), added to every request it forwards: a request that comes
    /// back carrying it has looped ([`crate::h1_server::via_names`]).
    pub via: Box<str>,
    /// The same for a request received as HTTP/1.0 (`1.0 gpuscale-…`:
    /// the protocol is the received message's).
    pub via10: Box<str>,
    /// Clients' request rates, when any is configured.
    pub limiter: Option<std::sync::Mutex<crate::ratelimit::Limiter>>,
    next_waiter: AtomicU64,
    origin: Instant,
}

/// The protocol part of this gateway's `Via` entry.
const VIA_PROTOCOL: &str = "1.1 ";

/// `1.1 gpuscale-<16 hex digits>`, random per process (a pseudonym, as
/// RFC 9110 §7.6.3 allows, so no address leaks to replicas): two gateways,
/// or two processes of one, never share it.
fn via_entry() -> Box<str> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 8];
    // Without the OS's random source, the clock and the process id still
    // tell processes apart (a loop is only ever through this process).
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        bytes = (nanos ^ u64::from(std::process::id()).rotate_left(32)).to_be_bytes();
    }
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{VIA_PROTOCOL}gpuscale-{hex}").into_boxed_str()
}

impl Shared {
    /// State for these settings, replicas from the config registered.
    pub fn new(settings: Settings) -> Arc<Shared> {
        let origin = Instant::now();
        let (metrics, registry) = Metrics::new();
        let version = watch::channel(0).0;
        let models = settings
            .models
            .values()
            .map(|m| {
                if let Some(why) = m.newest_first_unreachable() {
                    tracing::warn!("{why}");
                }
                let mut pool = Pool::new(m.max_queue, m.max_concurrency);
                pool.set_balance(settings.balance);
                pool.set_newest_first_after(m.newest_first_after);
                for r in &m.replicas {
                    pool.add_replica(r.clone(), None);
                }
                let state = Arc::new(ModelState {
                    settings: m.clone(),
                    inner: Mutex::new(Inner {
                        pool,
                        last_signal: None,
                    }),
                    stats: Mutex::new(ModelStats::new(origin)),
                    handles: Handles::new(
                        &metrics,
                        &ModelLabel {
                            model: m.name.clone(),
                        },
                        m,
                    ),
                    version: version.clone(),
                });
                (m.name.clone(), state)
            })
            .collect();
        let header = |name: &str, fallback: &'static str| {
            http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
                .unwrap_or_else(|_| http::HeaderName::from_static(fallback))
        };
        let model_header = header(&settings.spec.model_header, "x-gpuscale-model");
        let priority_header = header(&settings.spec.priority_header, "x-gpuscale-priority");
        let adapters = settings
            .models
            .values()
            .flat_map(|m| {
                m.adapters
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (a.clone(), (m.name.clone(), i as u16)))
            })
            .collect();
        let via = via_entry();
        let buffered = crate::budget::Budget::new(settings.spec.limits.max_buffered_bytes);
        let limiter =
            crate::ratelimit::Limiter::new(settings.rates.clone()).map(std::sync::Mutex::new);
        let shared = Arc::new(Shared {
            adapters,
            via10: format!("1.0 {}", &via[VIA_PROTOCOL.len()..]).into_boxed_str(),
            via,
            model_header,
            priority_header,
            settings,
            models,
            metrics,
            registry,
            version,
            signals: broadcast::channel(256).0,
            shutting_down: AtomicBool::new(false),
            stream_subscribers: std::sync::atomic::AtomicUsize::new(0),
            buffered,
            limiter,
            next_waiter: AtomicU64::new(0),
            origin,
        });
        for m in shared.models.values() {
            let inner = lock(&m.inner);
            m.changed(&inner.pool);
        }
        shared
    }

    /// Whether a `Via` field value received names this process: the
    /// request or response passed through this gateway already.
    pub fn via_is_mine(&self, value: &[u8]) -> bool {
        crate::h1_server::via_names(value, &self.via[VIA_PROTOCOL.len()..])
    }

    /// Waits for a slot on one of the model's replicas.
    pub async fn admit(
        self: &Arc<Self>,
        model: &Arc<ModelState>,
        priority: Priority,
        hint: Hint,
        client: Client,
    ) -> Result<Permit, Reject> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err(self.rejected(model, Reject::ShuttingDown));
        }
        let arrived = Instant::now();
        let (id, rx) = {
            let mut inner = lock(&model.inner);
            if let Some(slot) = inner.pool.acquire(arrived, hint) {
                model.changed(&inner.pool);
                drop(inner);
                return Ok(model.permit(slot, hint, arrived, false));
            }
            lock(&model.stats).arrivals.record(arrived);
            let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
            let (tx, rx) = oneshot::channel();
            match inner
                .pool
                .enqueue_from(client, id, priority, hint, tx, arrived)
            {
                Enqueued::Waiting => {}
                Enqueued::Rejected(_) => {
                    drop(inner);
                    return Err(self.rejected(model, Reject::QueueFull));
                }
                Enqueued::Displaced(other) => {
                    let _ = other.send(Err(Reject::Displaced));
                }
                Enqueued::Overdue(other) => {
                    let _ = other.send(Err(Reject::Overdue));
                }
                Enqueued::Crowded(other) => {
                    let _ = other.send(Err(Reject::Crowded));
                }
            }
            if inner.pool.ready_replicas() == 0
                && inner
                    .last_signal
                    .is_none_or(|t| arrived.duration_since(t) >= Duration::from_secs(1))
            {
                inner.last_signal = Some(arrived);
                let _ = self.signals.send(ScaleSignal {
                    model: model.settings.name.clone(),
                    waiting: inner.pool.waiting(),
                });
                model.handles.scale_signals.inc();
            }
            model.changed(&inner.pool);
            (id, rx)
        };
        // Leaves the queue if this future is dropped (client gone), and
        // gives back a slot granted in the meantime.
        let mut guard = WaitGuard {
            model,
            id,
            rx,
            armed: true,
        };
        let outcome = match tokio::time::timeout(model.settings.queue_timeout, &mut guard.rx).await
        {
            Ok(Ok(outcome)) => outcome,
            // The sender was dropped without an answer: cannot happen while
            // the pool holds it; treat as a timeout rather than hang.
            Ok(Err(_)) => Err(Reject::Timeout),
            Err(_) => {
                let mut inner = lock(&model.inner);
                if inner.pool.remove_waiter(id).is_some() {
                    model.changed(&inner.pool);
                    Err(Reject::Timeout)
                } else {
                    // Granted or displaced at the last moment: the answer
                    // is in the channel.
                    drop(inner);
                    guard.rx.try_recv().unwrap_or(Err(Reject::Timeout))
                }
            }
        };
        guard.armed = false;
        match outcome {
            Ok(slot) => Ok(model.permit(slot, hint, arrived, true)),
            Err(r) => {
                // Its wait counts too: under overload, served newest first,
                // the longest waits are those that end refused, and a p95
                // of the served alone would hide them from the autoscaler.
                model.record_wait(arrived, Instant::now());
                Err(self.rejected(model, r))
            }
        }
    }

    /// Takes a token of `client`'s rate (`key`: the configured key its
    /// request carries) for a request to `model`: `Err` with the time
    /// until one is back, counted as a refusal (`rate_limited`) but not as
    /// an SLO miss (the client went past its quota; nothing failed it).
    pub fn within_rate(
        &self,
        model: &ModelState,
        client: crate::fairness::Client,
        key: Option<usize>,
    ) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else {
            return Ok(());
        };
        let taken = crate::lock(limiter).take(client, key, Instant::now());
        if taken.is_err() {
            self.metrics
                .rejections
                .get_or_create(&ReasonLabels {
                    model: model.settings.name.clone(),
                    reason: Reject::RateLimited.reason().into(),
                })
                .inc();
        }
        taken
    }

    fn rejected(&self, model: &ModelState, r: Reject) -> Reject {
        // A refused request misses every target its model declares.
        let h = &model.handles;
        for c in [&h.slo_queue_wait, &h.slo_latency, &h.slo_ttft]
            .into_iter()
            .flatten()
        {
            c.missed.inc();
        }
        self.metrics
            .rejections
            .get_or_create(&ReasonLabels {
                model: model.settings.name.clone(),
                reason: r.reason().into(),
            })
            .inc();
        r
    }

    /// Registers a replica (the discovery interface); waiting requests go
    /// to it at once. A replica registered again keeps its id (and stops
    /// draining); a new one beyond `registration.maxReplicasPerModel` is
    /// refused.
    pub fn register(
        &self,
        model: &str,
        endpoint: Endpoint,
        limit: Option<u32>,
    ) -> Result<ReplicaId, RegisterError> {
        let m = self.models.get(model).ok_or(RegisterError::UnknownModel)?;
        let mut inner = lock(&m.inner);
        let cap = self.settings.registration.max_replicas_per_model;
        if !inner.pool.has_replica(&endpoint) && inner.pool.replicas().len() >= cap {
            return Err(RegisterError::TooMany(cap));
        }
        let id = inner.pool.add_replica(endpoint, limit);
        m.dispatch(&mut inner);
        Ok(id)
    }

    /// Records the adapters a registered replica has loaded; `Err` names
    /// the first that the model does not serve.
    pub fn set_replica_adapters(
        &self,
        model: &str,
        endpoint: &Endpoint,
        adapters: &[String],
    ) -> Result<(), String> {
        let Some(m) = self.models.get(model) else {
            return Err(model.to_string());
        };
        let ids = adapters
            .iter()
            .map(|a| m.adapter_id(a).ok_or_else(|| a.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut inner = lock(&m.inner);
        inner.pool.set_adapters(endpoint, &ids);
        m.dispatch(&mut inner);
        Ok(())
    }

    /// Deregisters a replica: no new requests; those in flight finish.
    /// `None` when the model is not configured, `Some(false)` when the
    /// replica was not registered.
    pub fn deregister(&self, model: &str, endpoint: &Endpoint) -> Option<bool> {
        let m = self.models.get(model)?;
        let mut inner = lock(&m.inner);
        let known = inner.pool.remove_replica(endpoint);
        m.changed(&inner.pool);
        Some(known)
    }

    /// Records a transport failure on a replica (it may be ejected).
    pub fn failed(&self, model: &Arc<ModelState>, replica: ReplicaId) {
        self.failed_since(model, replica, None);
    }

    /// A request sent to `replica` at `sent` had no answer within the
    /// request timeout: counted as the replica's failure only where it
    /// answered nothing since ([`crate::admission::Pool::record_timeout`]).
    pub fn timed_out(&self, model: &Arc<ModelState>, replica: ReplicaId, sent: Instant) {
        self.failed_since(model, replica, Some(sent));
    }

    fn failed_since(&self, model: &Arc<ModelState>, replica: ReplicaId, sent: Option<Instant>) {
        model.handles.upstream_errors.inc();
        let up = &self.settings.spec.upstream;
        let mut inner = lock(&model.inner);
        let now = Instant::now();
        let ejected = match sent {
            None => inner
                .pool
                .record_failure(replica, now, up.eject_after_failures, up.eject_for),
            Some(sent) => {
                inner
                    .pool
                    .record_timeout(replica, sent, now, up.eject_after_failures, up.eject_for)
            }
        };
        if let Some(endpoint) = ejected {
            tracing::warn!(
                model = %model.settings.name,
                replica = %endpoint,
                "replica ejected for {:?} after {} failures in a row",
                up.eject_for,
                up.eject_after_failures
            );
            // Requests queued meanwhile get the replica back when its
            // ejection ends: nothing else may free a slot before their
            // queue timeout (with every replica ejected, they waited it
            // out and got 503).
            let (m, after) = (model.clone(), up.eject_for);
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let mut inner = lock(&m.inner);
                m.dispatch(&mut inner);
            });
        }
    }

    /// Another replica for a request whose connect failed, if one is free
    /// now; the failed permit's slot is released first.
    pub fn retry_elsewhere(
        self: &Arc<Self>,
        failed: Permit,
        tried: &[ReplicaId],
    ) -> Option<Permit> {
        let model = failed.model.clone();
        let (admitted, arrived, hint) = (failed.admitted, failed.arrived, failed.hint);
        drop(failed);
        let mut inner = lock(&model.inner);
        let slot = inner.pool.acquire_other(Instant::now(), tried, hint)?;
        model.changed(&inner.pool);
        drop(inner);
        model.handles.routes[slot.reason.index()].inc();
        Some(Permit {
            model,
            replica: slot.replica,
            endpoint: slot.endpoint,
            reason: slot.reason,
            hint,
            admitted,
            arrived,
            answered: false,
            replica_answered: slot.answered,
            noted: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Sets what a replica's own metrics report: requests waiting inside
    /// it, its KV-cache utilisation, and the adapters they show (names the
    /// model does not serve are ignored).
    pub fn set_server_state(
        &self,
        model: &str,
        endpoint: &Endpoint,
        waiting: u32,
        kv: Option<f64>,
        adapters: &[&str],
    ) {
        if let Some(m) = self.models.get(model) {
            let ids: Vec<u16> = adapters.iter().filter_map(|a| m.adapter_id(a)).collect();
            let until = Instant::now() + self.settings.spec.routing.adapter_memory;
            lock(&m.inner)
                .pool
                .set_server_state(endpoint, waiting, kv, &ids, until);
        }
    }

    /// Records a replica's prefill seconds as its metrics report them now
    /// (see [`crate::admission::Pool::set_prefill_seconds`]).
    pub fn set_prefill_seconds(&self, model: &str, endpoint: &Endpoint, sum: f64) {
        if let Some(m) = self.models.get(model) {
            lock(&m.inner)
                .pool
                .set_prefill_seconds(endpoint, sum, Instant::now());
        }
    }

    /// The model a served name or adapter name routes to, and the
    /// adapter's index for an adapter.
    pub fn model_for(&self, name: &str) -> Option<(&Arc<ModelState>, Option<u16>)> {
        if let Some(m) = self.models.get(name) {
            return Some((m, None));
        }
        let (base, id) = self.adapters.get(name)?;
        Some((self.models.get(base)?, Some(*id)))
    }

    /// Replica endpoints of a model (for scraping and listing).
    pub fn replicas(&self, model: &str) -> Vec<ReplicaView> {
        let Some(m) = self.models.get(model) else {
            return Vec::new();
        };
        let now = Instant::now();
        lock(&m.inner)
            .pool
            .replicas()
            .iter()
            .map(|r| ReplicaView {
                endpoint: r.endpoint.url(),
                configured: m.settings.replicas.contains(&r.endpoint),
                in_flight: r.in_flight,
                max_concurrency: r.limit,
                draining: r.draining,
                ejected: r.ejected_until.is_some_and(|t| t > now),
                server_waiting: r.server_waiting,
            })
            .collect()
    }

    /// The `/v1/queues` document.
    pub fn queues(&self) -> QueuesView {
        let now = Instant::now();
        let models = self
            .models
            .iter()
            .map(|(name, m)| {
                let inner = lock(&m.inner);
                let view = QueueView::of_pool(&inner.pool, now);
                drop(inner);
                let view = lock(&m.stats).add_to(view, now);
                (name.clone(), view)
            })
            .collect();
        QueuesView {
            uptime_s: now.duration_since(self.origin).as_secs_f64(),
            models,
        }
    }
}

struct WaitGuard<'a> {
    model: &'a ModelState,
    id: u64,
    /// Where the answer comes.
    rx: oneshot::Receiver<Result<Slot, Reject>>,
    armed: bool,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut inner = lock(&self.model.inner);
            if inner.pool.remove_waiter(self.id).is_some() {
                self.model.changed(&inner.pool);
            } else if let Ok(Ok(slot)) = self.rx.try_recv() {
                // Granted a slot just as the client went: it is nobody's,
                // so it goes back (and to the next waiter), or the replica
                // would lose that capacity for good.
                inner.pool.release(slot.replica);
                self.model.dispatch(&mut inner);
            }
        }
    }
}

/// A slot on a replica, held until the response's last byte (or the
/// request's end); dropping it frees the slot and hands it to the next
/// waiter.
pub struct Permit {
    model: Arc<ModelState>,
    /// The replica.
    pub replica: ReplicaId,
    /// Its address.
    pub endpoint: Endpoint,
    /// Why it was chosen.
    pub reason: Reason,
    /// What the request asked of the choice (kept for a retry).
    hint: Hint,
    /// When the request left the queue.
    pub admitted: Instant,
    /// When it reached the gateway (its SLOs count from here).
    arrived: Instant,
    /// The replica answered (its failure count resets when the slot is
    /// freed: one lock, not two).
    answered: bool,
    /// Where the replica's last answer is noted, lock-free and mostly with
    /// the clock reads the request makes anyway: a stream's first token,
    /// another response's first chunk of several ([`Permit::answering`])
    /// or its last byte; a response that ends otherwise (the client gone,
    /// the replica failing mid-body), when the slot is freed.
    replica_answered: crate::admission::Answered,
    /// Noted already.
    noted: std::sync::atomic::AtomicBool,
}

impl Permit {
    /// The model.
    pub fn model(&self) -> &Arc<ModelState> {
        &self.model
    }

    /// The upstream answered: count a success.
    pub fn succeeded(&mut self) {
        self.answered = true;
    }

    /// The first chunk of a response that has more to come (a stream that
    /// is not server-sent events, a large body): the replica answers.
    pub fn answering(&self) {
        self.note(Instant::now());
    }

    fn note(&self, now: Instant) {
        self.replica_answered.note(now);
        self.noted.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The response's last byte went out at `now`: records the latency
    /// since admission. A replica's server error (`ok` false) is an
    /// answer but not a good one: it misses the latency target however
    /// fast it came.
    pub fn record_latency(&self, now: Instant, ok: bool) {
        self.note(now);
        let seconds = now.saturating_duration_since(self.admitted).as_secs_f64();
        // The SLO is end to end: from arrival, the queue wait included.
        let total = now.saturating_duration_since(self.arrived).as_secs_f64();
        {
            let mut stats = lock(&self.model.stats);
            stats.latency.record(now, seconds);
            stats.latency_total.record(now, total);
        }
        self.model.handles.latency.observe(seconds);
        if !ok {
            if let Some(c) = &self.model.handles.slo_latency {
                c.missed.inc();
            }
            return;
        }
        SloCounter::count(&self.model.handles.slo_latency, total);
    }

    /// Records a stream's time to first token.
    pub fn record_ttft(&self, seconds: f64) {
        let now = Instant::now();
        // The stream's first token: the replica answers.
        self.note(now);
        let waited = self.admitted.saturating_duration_since(self.arrived);
        let total = seconds + waited.as_secs_f64();
        {
            let mut stats = lock(&self.model.stats);
            stats.ttft.record(now, seconds);
            stats.ttft_total.record(now, total);
        }
        self.model.handles.ttft.observe(seconds);
        SloCounter::count(&self.model.handles.slo_ttft, total);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut inner = lock(&self.model.inner);
        if self.answered {
            inner.pool.record_success(self.replica);
            if !self.noted.load(std::sync::atomic::Ordering::Relaxed) {
                self.replica_answered.note(Instant::now());
            }
        }
        inner.pool.release(self.replica);
        self.model.dispatch(&mut inner);
    }
}

/// `/v1/queues`.
#[derive(Debug, Clone, Serialize)]
pub struct QueuesView {
    /// Seconds since the gateway started.
    pub uptime_s: f64,
    /// Per served model name.
    pub models: BTreeMap<String, QueueView>,
}

/// One model in `/v1/queues`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QueueView {
    /// Requests waiting in the gateway.
    pub waiting: usize,
    /// The same by priority class.
    pub waiting_by_priority: WaitingByPriority,
    /// Requests on replicas that take traffic.
    pub in_flight: u32,
    /// Replicas taking requests (registered, not draining, not ejected).
    pub replicas: usize,
    /// Replicas ejected for failing (the same as `ejected.replicas`).
    pub ejected_replicas: usize,
    /// Σ max concurrency of the replicas taking requests.
    pub capacity: u32,
    /// Ejected replicas: they take no traffic until their ejection ends.
    pub ejected: Group,
    /// Deregistered replicas finishing their requests.
    pub draining: Group,
    /// Requests waiting inside the model servers (their own metrics).
    pub server_waiting: u32,
    /// Prefill seconds per second, averaged over the replicas taking
    /// requests that report it (their metrics, between the last two
    /// scrapes): 1 is a prefill lane busy all the time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_busy: Option<f64>,
    /// How long the oldest waiter has waited, ms (absent when nobody
    /// waits).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oldest_wait_ms: Option<f64>,
    /// Whether a priority class is backed up past the model's budget and
    /// served newest first now (`queue.order: adaptive`).
    pub newest_first: bool,
    /// Arrivals per second.
    pub arrival_rate: ArrivalRate,
    /// Queue wait p50, ms (last 60 s).
    pub queue_wait_p50_ms: Option<f64>,
    /// Queue wait p95, ms.
    pub queue_wait_p95_ms: Option<f64>,
    /// Upstream latency p50, ms (the autoscaler's service-time estimate).
    pub latency_p50_ms: Option<f64>,
    /// Upstream latency p50 over the last 10 s, ms: the service time
    /// matched with `arrival_rate.10s` for Little's law.
    pub latency_p50_10s_ms: Option<f64>,
    /// Upstream latency p95, ms.
    pub latency_p95_ms: Option<f64>,
    /// Time to first token p95, ms (streams), from leaving the queue.
    pub ttft_p95_ms: Option<f64>,
    /// Latency p95 from arrival at the gateway, the queue wait included,
    /// ms, of the requests a replica answered: the measure the latency SLO
    /// uses (`gpuscale_slo_requests_total`, which also counts refused and
    /// timed-out requests and server errors as missed; those are not in
    /// this quantile).
    pub latency_total_p95_ms: Option<f64>,
    /// Time to first token p95 from arrival, the queue wait included, ms
    /// (streams a replica answered): the measure the TTFT SLO uses.
    pub ttft_total_p95_ms: Option<f64>,
}

impl QueueView {
    /// The queue and replica half of a model's view, from its pool (pure:
    /// the gateway and the simulator build their views alike).
    pub fn of_pool<W>(pool: &crate::admission::Pool<W>, now: Instant) -> QueueView {
        let [critical, standard, sheddable] = pool.waiting_by_class();
        let census = pool.census(now);
        QueueView {
            waiting: pool.waiting(),
            waiting_by_priority: WaitingByPriority {
                critical,
                standard,
                sheddable,
            },
            in_flight: census.ready.in_flight,
            replicas: census.ready.replicas,
            capacity: census.ready.capacity,
            ejected_replicas: census.ejected.replicas,
            ejected: census.ejected,
            draining: census.draining,
            server_waiting: pool.replicas().iter().map(|r| r.server_waiting).sum(),
            prefill_busy: pool.prefill_busy(now),
            oldest_wait_ms: pool
                .oldest_wait(now)
                .map(|d| (d.as_secs_f64() * 1e4).round() / 10.0),
            newest_first: pool.newest_first(now),
            ..QueueView::default()
        }
    }
}

impl crate::stats::ModelStats {
    /// `view` with this model's rates and quantiles added (ms, to 0.1).
    pub fn add_to(&mut self, view: QueueView, now: Instant) -> QueueView {
        let ms = |x: Option<f64>| x.map(|v| (v * 1e4).round() / 10.0);
        QueueView {
            arrival_rate: ArrivalRate {
                s1: self.arrivals.per_second(now, 1),
                s10: self.arrivals.per_second(now, 10),
                s60: self.arrivals.per_second(now, 60),
            },
            queue_wait_p50_ms: ms(self.queue_wait.quantile(now, 0.5)),
            queue_wait_p95_ms: ms(self.queue_wait.quantile(now, 0.95)),
            latency_p50_ms: ms(self.latency.quantile(now, 0.5)),
            latency_p50_10s_ms: ms(self
                .latency
                .quantile_within(now, 0.5, Duration::from_secs(10))),
            latency_p95_ms: ms(self.latency.quantile(now, 0.95)),
            ttft_p95_ms: ms(self.ttft.quantile(now, 0.95)),
            latency_total_p95_ms: ms(self.latency_total.quantile(now, 0.95)),
            ttft_total_p95_ms: ms(self.ttft_total.quantile(now, 0.95)),
            ..view
        }
    }
}

/// Waiting requests per priority class.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WaitingByPriority {
    /// Critical.
    pub critical: usize,
    /// Standard.
    pub standard: usize,
    /// Sheddable.
    pub sheddable: usize,
}

/// Arrivals per second over three windows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ArrivalRate {
    /// Last second.
    #[serde(rename = "1s")]
    pub s1: f64,
    /// Last 10 s.
    #[serde(rename = "10s")]
    pub s10: f64,
    /// Last 60 s.
    #[serde(rename = "60s")]
    pub s60: f64,
}

/// A replica in `/v1/replicas`.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaView {
    /// `http://host:port`.
    pub endpoint: String,
    /// Written in the gateway's own file (the operator's word), not
    /// registered through `/v1/replicas`: a controller that cleans up
    /// what it registered leaves it alone.
    pub configured: bool,
    /// Requests in flight.
    pub in_flight: u32,
    /// Its limit.
    pub max_concurrency: u32,
    /// Deregistered, finishing its requests.
    pub draining: bool,
    /// Ejected for failing.
    pub ejected: bool,
    /// Waiting inside it, from its metrics.
    pub server_waiting: u32,
}
