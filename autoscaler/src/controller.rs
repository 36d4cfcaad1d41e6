//! The controller: the thin async shell around [`recommend`]. It watches
//! the gateway (the push stream for sub-second reaction, a pull every
//! `interval` otherwise), decides per model, packs the new replica counts
//! incrementally when a cluster is given (a replica that fits no GPU is not
//! started), and applies them through the backend (local or Kubernetes).
//! Its decisions are
//! exported as metrics and at `/v1/decisions` on its admin port.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use gpuscale_packer::{PackOptions, Plan, pack_from};
use gpuscale_policies::{Cluster, Model};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::watch;

use gpuscale_policies::model::ScalingMemory;

use crate::backend::{Backend, Change, Observed};
use crate::config::Settings;
use crate::dashboard::{self, Live};
use crate::observe::{Event, GatewayClient, observations};
use crate::recommend::{Mode, State};

/// Decisions on stream events are at most this frequent (ticks always
/// decide).
pub const MIN_EVENT_GAP: Duration = Duration::from_millis(100);

/// Longest a placement solve may take (HiGHS returns its best plan then).
pub const PACK_BUDGET: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    model: String,
    mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    gpu_model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabel {
    resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RepairLabels {
    model: String,
    repair: String,
}

/// The autoscaler's metrics (prefix `gpuscale_autoscaler_`).
#[derive(Clone)]
struct Metrics {
    desired: Family<ModelLabel, Gauge>,
    ready: Family<ModelLabel, Gauge>,
    min: Family<ModelLabel, Gauge>,
    max: Family<ModelLabel, Gauge>,
    decisions: Family<ModeLabels, Counter>,
    panic: Family<ModelLabel, Gauge>,
    signal_to_decision: Histogram,
    pool_gpus: Family<PoolLabel, Gauge>,
    pool_used: Family<PoolLabel, Gauge>,
    utilization: Family<ResourceLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    repairs: Family<RepairLabels, Counter>,
}

/// The kinds of [`Metrics::repairs`].
const REPAIRS: [&str; 3] = ["replaced", "reregistered", "removed"];

impl Metrics {
    /// A model's repair counters, at zero from the start: a series that
    /// first appears at its first count would hide that count from
    /// `increase()`.
    fn zero_repairs(&self, model: &str) {
        for repair in REPAIRS {
            let _ = self.repairs.get_or_create(&RepairLabels {
                model: model.into(),
                repair: repair.into(),
            });
        }
    }

    fn new() -> (Metrics, Registry) {
        let m = Metrics {
            desired: Family::default(),
            ready: Family::default(),
            min: Family::default(),
            max: Family::default(),
            decisions: Family::default(),
            panic: Family::default(),
            signal_to_decision: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            pool_gpus: Family::default(),
            pool_used: Family::default(),
            utilization: Family::default(),
            repairs: Family::default(),
        };
        let mut r = Registry::with_prefix("gpuscale_autoscaler");
        r.register(
            "desired_replicas",
            "Replicas the autoscaler wants",
            m.desired.clone(),
        );
        r.register(
            "ready_replicas",
            "Replicas registered and serving",
            m.ready.clone(),
        );
        r.register("min_replicas", "The policy's minReplicas", m.min.clone());
        r.register(
            "max_replicas",
            "The most replicas the model may run: the policy's maxReplicas, or the local backend's maxReplicasPerModel where lower",
            m.max.clone(),
        );
        r.register(
            "pool_gpus",
            "Healthy GPUs of each GPU model (the packer's pools)",
            m.pool_gpus.clone(),
        );
        r.register(
            "pool_gpus_used",
            "GPUs of each GPU model holding a replica in the last plan",
            m.pool_used.clone(),
        );
        r.register(
            "plan_utilization",
            "Memory, compute and dominant-resource utilisation of the GPUs in use, in the last plan (0-1)",
            m.utilization.clone(),
        );
        r.register(
            "decisions",
            "Decisions that changed the replica count, by mode",
            m.decisions.clone(),
        );
        r.register(
            "repairs",
            "Differences the reconciler found between what should run and what runs, and repaired: replaced (a replica process found dead), reregistered (a replica the gateway had lost), removed (a gateway registration no replica owns)",
            m.repairs.clone(),
        );
        r.register(
            "panic",
            "1 while the model is in panic mode",
            m.panic.clone(),
        );
        r.register(
            "signal_to_decision_seconds",
            "Time from a gateway event to the decision it caused",
            m.signal_to_decision.clone(),
        );
        (m, r)
    }
}

/// Every family the autoscaler exports, one placeholder series each
/// (`model="example"`), as OpenMetrics text: what dashboards and rules are
/// checked against. The destructuring has no `..`: a family added to the
/// metrics does not compile until it is listed here.
pub fn exposition() -> String {
    let (m, registry) = Metrics::new();
    let Metrics {
        desired,
        ready,
        min,
        max,
        decisions,
        panic,
        signal_to_decision: _,
        pool_gpus,
        pool_used,
        utilization,
        repairs,
    } = &m;
    let model = ModelLabel {
        model: "example".into(),
    };
    for g in [desired, ready, min, max, panic] {
        let _ = g.get_or_create(&model);
    }
    let _ = decisions.get_or_create(&ModeLabels {
        model: "example".into(),
        mode: "normal".into(),
    });
    let pool = PoolLabel {
        gpu_model: "H100-80GB".into(),
    };
    let _ = pool_gpus.get_or_create(&pool);
    let _ = pool_used.get_or_create(&pool);
    let _ = utilization.get_or_create(&ResourceLabel {
        resource: "memory".into(),
    });
    let _ = repairs.get_or_create(&RepairLabels {
        model: "example".into(),
        repair: "replaced".into(),
    });
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// One model's last decision, for `/v1/decisions`.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionView {
    /// Replicas wanted.
    pub desired: u32,
    /// Replicas serving.
    pub ready: u32,
    /// The rule set that decided.
    pub mode: Mode,
    /// The sentence.
    pub reason: String,
    /// When (RFC 3339, UTC, milliseconds).
    pub at: String,
}

/// One model in `/v1/decisions`: its last decision, and the last
/// [`HISTORY`] decisions that changed its count, oldest first.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelDecisions {
    /// The last decision (every tick and event decides).
    #[serde(flatten)]
    pub latest: Option<DecisionView>,
    /// Recent changes of the count.
    pub history: VecDeque<DecisionView>,
}

/// Changes kept per model in `/v1/decisions`.
pub const HISTORY: usize = 50;

/// `now` (since the Unix epoch) as RFC 3339 with milliseconds.
fn rfc3339(now: Duration) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + now).to_string()
}

/// The controller's liveness and readiness, as the admin listener
/// reports them.
#[derive(Debug)]
struct Health {
    /// The control loop is running (cleared when its task ends, panics
    /// included).
    alive: AtomicBool,
    /// When the loop last went round (ms since the Unix epoch).
    beat_ms: AtomicU64,
    /// Longest a round may take before the loop counts as stuck.
    stall: Duration,
    /// Consecutive failed metric reads.
    failures: AtomicU32,
    /// Failures at which the controller is not ready (the fallback
    /// threshold).
    failure_threshold: u32,
}

/// Sets `alive` false however the loop ends.
struct AliveGuard(Arc<Health>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Relaxed);
    }
}

/// What the admin listener shows.
#[derive(Clone)]
pub struct Report {
    registry: Arc<Registry>,
    decisions: Arc<Mutex<BTreeMap<String, ModelDecisions>>>,
    health: Arc<Health>,
    live: Arc<Mutex<Live>>,
    models: Arc<std::sync::RwLock<Vec<Model>>>,
    cluster: Arc<std::sync::RwLock<Option<Arc<Cluster>>>>,
}

impl Default for Report {
    /// An empty report (no metric, no decision yet; a loop that is
    /// neither running nor failing).
    fn default() -> Self {
        Report {
            registry: Arc::new(Registry::default()),
            decisions: Arc::new(Mutex::new(BTreeMap::new())),
            health: Arc::new(Health {
                alive: AtomicBool::new(true),
                beat_ms: AtomicU64::new(0),
                stall: Duration::MAX,
                failures: AtomicU32::new(0),
                failure_threshold: u32::MAX,
            }),
            live: Arc::default(),
            models: Arc::default(),
            cluster: Arc::default(),
        }
    }
}

impl Report {
    /// `Err(why)` when the control loop has stopped or has not gone round
    /// for longer than it may (`/healthz`).
    pub fn live(&self) -> Result<(), String> {
        let h = &self.health;
        if !h.alive.load(Ordering::Relaxed) {
            return Err("the control loop has stopped".into());
        }
        let beat = h.beat_ms.load(Ordering::Relaxed);
        let now = unix_now().as_millis() as u64;
        let since = Duration::from_millis(now.saturating_sub(beat));
        if beat > 0 && since > h.stall {
            return Err(format!(
                "the control loop has not gone round for {}s",
                since.as_secs()
            ));
        }
        Ok(())
    }

    /// `Err(why)` while metric reads keep failing, at or past the
    /// fallback threshold (`/readyz`).
    pub fn ready(&self) -> Result<(), String> {
        self.live()?;
        let h = &self.health;
        let failures = h.failures.load(Ordering::Relaxed);
        if failures >= h.failure_threshold {
            return Err(format!(
                "{failures} metric reads in a row failed (threshold {})",
                h.failure_threshold
            ));
        }
        Ok(())
    }

    /// OpenMetrics text.
    pub fn metrics(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The last decision per model.
    pub fn decisions(&self) -> BTreeMap<String, ModelDecisions> {
        self.decisions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The dashboard's view now (`/v1/dashboard`).
    pub fn dashboard(&self) -> dashboard::View {
        let decisions = self.decisions();
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        dashboard::view(
            unix_now().as_secs_f64(),
            &self.models.read().unwrap_or_else(|e| e.into_inner()),
            self.cluster
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_deref(),
            &live,
            &decisions,
        )
    }

    fn set_plan(&self, plan: &Plan) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).plan = Some(Arc::new(plan.clone()));
    }

    fn set_queues(&self, queues: &serde_json::Value) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).queues = Some(queues.clone());
    }

    /// Adds a sample to the dashboard's time series (at most one per
    /// [`dashboard::SAMPLE_EVERY`]).
    fn sample(&self) {
        let decisions = self.decisions();
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let s = dashboard::sample(
            unix_now().as_secs_f64(),
            &self.models.read().unwrap_or_else(|e| e.into_inner()),
            self.cluster
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .as_deref(),
            live.plan.as_deref(),
            live.queues.as_ref(),
            &decisions,
        );
        live.push(s);
    }
}

/// The most replicas `m` may run: its policy's `maxReplicas`, or the
/// backend's own cap where lower (the local backend's
/// `maxReplicasPerModel`, which caps every decision).
fn capped_max(m: &Model, cap: Option<u32>) -> u32 {
    cap.map_or(m.scaling.max_replicas, |c| m.scaling.max_replicas.min(c))
}

/// The models as the dashboard shows them: each `maxReplicas` capped as
/// [`capped_max`] has it.
fn shown(models: &[Model], cap: Option<u32>) -> Vec<Model> {
    models
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.scaling.max_replicas = capped_max(&m, cap);
            m
        })
        .collect()
}

/// How often a controller still waiting for its first inventory says so.
const INVENTORY_NAG: Duration = Duration::from_secs(60);

/// The controller.
pub struct Controller {
    settings: Settings,
    gateway: GatewayClient,
    backend: Backend,
    states: BTreeMap<String, State>,
    prometheus: Option<crate::observe::PrometheusSource>,
    plan: Option<Plan>,
    metrics: Metrics,
    report: Report,
    last_decision: Option<Instant>,
    /// When a re-plan last could move running replicas.
    last_consolidation: Option<Instant>,
    /// Whether a round has placed yet.
    placed_once: bool,
    /// Since when decisions wait for the first inventory, and when that
    /// was last said.
    awaiting_inventory: Option<Duration>,
    inventory_said: Option<Duration>,
    /// The last plan with its spare replicas, when the backend runs them
    /// (`self.plan` is the plan without: what the next re-plan starts
    /// from).
    filled: Option<Plan>,
    /// Spare replicas per model, as last applied.
    spares: BTreeMap<String, u32>,
}

/// Per model, the speed of each placed replica in replica order, as a
/// share of what its policy asks for: the compute it gets (H100 units,
/// summed over its GPUs) over the policy's `compute` (the compute that
/// reaches its target throughput), at most 1. What the local backend
/// slows its simulated servers to: a replica squeezed onto a smaller share
/// than its policy asks for (a worst-case time-sliced one) runs slower.
pub fn speeds(plan: &Plan, cluster: &Cluster, models: &[Model]) -> BTreeMap<String, Vec<f64>> {
    let mut out: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for ((model, _), parts) in plan.replica_parts(cluster, models) {
        let asks = models
            .iter()
            .find(|m| m.name == model)
            .map_or(1.0, |m| m.compute)
            .max(f64::MIN_POSITIVE);
        let gets: f64 = parts.iter().map(|p| p.speed).sum();
        out.entry(model).or_default().push((gets / asks).min(1.0));
    }
    out
}

/// How long a round of the control loop may take before `/healthz`
/// fails: ten intervals, and never under a minute (a placement solve, a
/// slow API server).
fn stall_limit(interval: Duration) -> Duration {
    (interval * 10).max(Duration::from_secs(60))
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

impl Controller {
    /// A controller over these settings, watching `gateway`, acting
    /// through `backend`. Models start at zero replicas when their
    /// `minReplicas` is 0, else at `minReplicas`.
    pub fn new(settings: Settings, gateway: GatewayClient, mut backend: Backend) -> Self {
        let (metrics, registry) = Metrics::new();
        let mut states = BTreeMap::new();
        let cap = backend.cap();
        for m in &settings.models {
            if let Some(cap) = cap
                && cap < m.scaling.min_replicas
            {
                tracing::warn!(
                    model = %m.name,
                    min_replicas = m.scaling.min_replicas,
                    "local.maxReplicasPerModel {cap} is below minReplicas: the model runs at most {cap}"
                );
            }
            let start = match cap {
                Some(cap) => m.scaling.min_replicas.min(cap),
                None => m.scaling.min_replicas,
            };
            if let Backend::Local(local) = &mut backend {
                local.scale_initial(m, start);
            }
            states.insert(m.name.clone(), State::new(start));
            let label = ModelLabel {
                model: m.name.clone(),
            };
            metrics
                .min
                .get_or_create(&label)
                .set(i64::from(m.scaling.min_replicas));
            metrics
                .max
                .get_or_create(&label)
                .set(i64::from(capped_max(m, cap)));
            metrics
                .desired
                .get_or_create(&ModelLabel {
                    model: m.name.clone(),
                })
                .set(i64::from(start));
            metrics.zero_repairs(&m.name);
        }
        let stall = stall_limit(settings.spec.interval);
        // The dashboard shows the most a model may run, the backend's cap
        // included.
        let report_models = Arc::new(std::sync::RwLock::new(shown(&settings.models, cap)));
        let report_cluster = Arc::new(std::sync::RwLock::new(
            settings.cluster.clone().map(Arc::new),
        ));
        let failure_threshold = settings.spec.tuning.fallback_after.max(1);
        Controller {
            prometheus: settings
                .spec
                .prometheus
                .as_ref()
                .map(crate::observe::PrometheusSource::new),
            settings,
            gateway,
            backend,
            states,
            plan: None,
            metrics,
            report: Report {
                registry: Arc::new(registry),
                decisions: Arc::new(Mutex::new(BTreeMap::new())),
                health: Arc::new(Health {
                    alive: AtomicBool::new(true),
                    beat_ms: AtomicU64::new(0),
                    stall,
                    failures: AtomicU32::new(0),
                    failure_threshold,
                }),
                live: Arc::default(),
                models: report_models,
                cluster: report_cluster,
            },
            last_decision: None,
            last_consolidation: None,
            placed_once: false,
            awaiting_inventory: None,
            inventory_said: None,
            filled: None,
            spares: BTreeMap::new(),
        }
    }

    /// What the admin listener serves.
    pub fn report(&self) -> Report {
        self.report.clone()
    }

    /// One tick: reconcile (the backend's live counts and repairs), read
    /// the signals, decide, persist the memory.
    pub async fn tick(&mut self) {
        let now = unix_now();
        let observed = self.backend.tick(&self.settings.models, now).await;
        self.adopt(&observed);
        let obs = self.observe().await;
        self.decide(obs, None).await;
        let plan = self.filled.as_ref().or(self.plan.as_ref());
        self.backend.roll(&self.settings.models, plan).await;
        self.report.sample();
        let memory: BTreeMap<String, ScalingMemory> = self
            .states
            .iter()
            .map(|(k, s)| (k.clone(), s.memory(now)))
            .collect();
        self.backend.remember(&memory, now).await;
    }

    /// Takes what the backend observed as the count to work from: on
    /// taking over (start, leader change) the state is rebuilt from the
    /// live count and the memory the last leader left; otherwise a count
    /// that differs from the one decided (someone scaled by hand, a
    /// write that did not land) replaces it, as HPA reads `/scale`
    /// every cycle.
    fn adopt(&mut self, observed: &Observed) {
        let r = &observed.repairs;
        for (repair, counts) in REPAIRS
            .into_iter()
            .zip([&r.replaced, &r.reregistered, &r.removed])
        {
            for (model, &n) in counts {
                self.metrics
                    .repairs
                    .get_or_create(&RepairLabels {
                        model: model.clone(),
                        repair: repair.into(),
                    })
                    .inc_by(u64::from(n));
            }
        }
        if let Some(models) = &observed.policies {
            self.set_models(models.clone());
        }
        if let Some(cluster) = &observed.cluster {
            *self
                .report
                .cluster
                .write()
                .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(cluster.clone()));
            self.settings.cluster = Some(cluster.clone());
        }
        for (name, &n) in &observed.replicas {
            let state = self.states.entry(name.clone()).or_default();
            if observed.took_over {
                *state = match observed.memory.get(name) {
                    Some(m) => State::restored(n, m),
                    None => State::new(n),
                };
                tracing::info!(model = %name, replicas = n, remembered = observed.memory.contains_key(name), "taking over at the live count");
            } else if state.current != n {
                tracing::warn!(model = %name, decided = state.current, running = n, "the live count differs from the decided one; working from the live count");
                state.current = n;
            }
        }
    }

    /// Runs these models from now on (the watched ModelPolicies changed):
    /// a new model starts from its `minReplicas` until the cluster's
    /// live count is read; a removed one is forgotten (a deleted
    /// policy's Deployments and Service go with it, through their owner
    /// reference; those of a policy left out as invalid stay as they
    /// are).
    fn set_models(&mut self, models: Vec<Model>) {
        let names: BTreeSet<&str> = models.iter().map(|m| m.name.as_str()).collect();
        for gone in self
            .settings
            .models
            .iter()
            .filter(|m| !names.contains(m.name.as_str()))
        {
            tracing::warn!(model = %gone.name, "ModelPolicy removed or left out: no longer scaled (a deleted policy's Deployments and Service go with it; an invalid one's stay as they are)");
            self.states.remove(&gone.name);
        }
        for m in &models {
            if !self.states.contains_key(&m.name) {
                tracing::info!(model = %m.name, "ModelPolicy added");
                self.states
                    .insert(m.name.clone(), State::new(m.scaling.min_replicas));
            }
            let label = ModelLabel {
                model: m.name.clone(),
            };
            self.metrics
                .min
                .get_or_create(&label)
                .set(i64::from(m.scaling.min_replicas));
            self.metrics
                .max
                .get_or_create(&label)
                .set(i64::from(capped_max(m, self.backend.cap())));
            self.metrics.zero_repairs(&m.name);
        }
        *self
            .report
            .models
            .write()
            .unwrap_or_else(|e| e.into_inner()) = shown(&models, self.backend.cap());
        self.settings.models = models;
    }

    /// Runs until `shutdown` turns true, then stops every replica.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let _alive = AliveGuard(self.report.health.clone());
        let mut stream = self.gateway.stream();
        let mut tick = tokio::time::interval(self.settings.spec.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A pushed change that came within MIN_EVENT_GAP of the last
        // decision is not dropped: it is decided at the end of the gap,
        // on the newest document pushed by then.
        let mut deferred: Option<(tokio::time::Instant, Instant, serde_json::Value)> = None;
        loop {
            let due = deferred.as_ref().map(|(at, _, _)| *at);
            let deferred_due = async move {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            self.report
                .health
                .beat_ms
                .store(unix_now().as_millis() as u64, Ordering::Relaxed);
            tokio::select! {
                _ = tick.tick() => self.tick().await,
                () = deferred_due => {
                    if let Some((_, received, v)) = deferred.take() {
                        let obs = match &self.prometheus {
                            Some(_) => self.observe().await,
                            None => Some(observations(&v)),
                        };
                        self.decide(obs, Some(received)).await;
                    }
                }
                event = stream.recv() => {
                    let received = Instant::now();
                    // Only the newest document counts: the stream sends on
                    // every change, and under load the events pile up
                    // faster than decisions (each may pack); deciding on
                    // each in turn would decide on the past. A
                    // scale-from-zero signal is kept over later documents
                    // (its path reads a fresh one).
                    let mut event = event;
                    while let Ok(next) = stream.try_recv() {
                        event = Some(match (event, next) {
                            (Some(Event::ScaleFromZero { model }), Event::Queues(_)) => {
                                Event::ScaleFromZero { model }
                            }
                            (_, next) => next,
                        });
                    }
                    match event {
                        Some(Event::Queues(v)) => {
                            self.report.set_queues(&v);
                            let since = self.last_decision.map(|t| t.elapsed());
                            if since.is_none_or(|s| s >= MIN_EVENT_GAP) {
                                deferred = None;
                                let obs = match &self.prometheus {
                                    Some(_) => self.observe().await,
                                    None => Some(observations(&v)),
                                };
                                self.decide(obs, Some(received)).await;
                            } else {
                                let wait = MIN_EVENT_GAP - since.unwrap_or_default();
                                let first = deferred.as_ref().map_or(received, |(_, r, _)| *r);
                                let at = deferred
                                    .as_ref()
                                    .map_or(tokio::time::Instant::now() + wait, |(a, _, _)| *a);
                                deferred = Some((at, first, v));
                            }
                        }
                        Some(Event::ScaleFromZero { model }) => {
                            tracing::info!(%model, "scale-from-zero signal");
                            if let Ok(v) = self.gateway.queues().await {
                                let obs = match &self.prometheus {
                                    Some(_) => self.observe().await,
                                    None => Some(observations(&v)),
                                };
                                self.decide(obs, Some(received)).await;
                            }
                        }
                        None => {
                            // The stream task ended: poll only.
                            stream = self.gateway.stream();
                        }
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
        self.backend.shutdown().await;
    }

    /// One decision round over every model. `view` is `None` when the
    /// gateway could not be read.
    /// Reads the signals: Prometheus when configured, else the gateway.
    /// `None` when the read failed.
    async fn observe(&self) -> Option<BTreeMap<String, crate::recommend::Observation>> {
        let read = match &self.prometheus {
            Some(p) => p.observations().await,
            None => self.gateway.queues().await.map(|v| {
                self.report.set_queues(&v);
                observations(&v)
            }),
        };
        let failures = &self.report.health.failures;
        match read {
            Ok(o) => {
                failures.store(0, Ordering::Relaxed);
                Some(o)
            }
            Err(e) => {
                failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("{e}");
                None
            }
        }
    }

    async fn decide(
        &mut self,
        obs: Option<BTreeMap<String, crate::recommend::Observation>>,
        signal: Option<Instant>,
    ) {
        let now = unix_now();
        self.last_decision = Some(Instant::now());
        // No decision before the first inventory when the plans come from
        // one: with no plan a change would move every replica to a
        // whole-GPU variant (which MIG and shared nodes may not run).
        if self.settings.cluster.is_none() && self.backend.plans_from_inventory() {
            // Said at once, then every minute it goes on (an inventory
            // that never comes is a set-up problem: the node agents, the
            // Role's nodes and pods, GPU Feature Discovery's labels).
            let since = *self.awaiting_inventory.get_or_insert(now);
            let said = self
                .inventory_said
                .is_some_and(|t| now.saturating_sub(t) < INVENTORY_NAG);
            if !said {
                tracing::warn!(
                    waited_s = now.saturating_sub(since).as_secs(),
                    "no inventory of the nodes yet: decisions wait for the first"
                );
                self.inventory_said = Some(now);
            }
            return;
        }
        let cap = self.backend.cap();
        let mut recs = crate::decide::recommend_all(
            &self.settings.models,
            obs.as_ref(),
            &self.settings.spec.tuning,
            &mut self.states,
            cap,
            now,
        );
        let mut desired: BTreeMap<String, u32> =
            recs.iter().map(|(k, r)| (k.clone(), r.replicas)).collect();
        let before = self.backend.desired();
        let changed = self
            .settings
            .models
            .iter()
            .any(|m| before.get(&m.name).copied().unwrap_or(0) != desired[&m.name]);
        let mut before_plan = None;
        // The first round places what runs from the start (minReplicas),
        // so the plan (and the dashboard's GPU map) exists before any
        // change.
        let first = !self.placed_once;
        if (changed || first)
            && let Some(cluster) = &self.settings.cluster
        {
            self.placed_once = true;
            before_plan = Some(self.place(cluster.clone(), &mut desired, &mut recs).await);
        }
        let ready = self.backend.ready(&self.settings.models);
        let spares = self
            .filled
            .as_ref()
            .map(gpuscale_packer::spare::count)
            .unwrap_or_default();
        let mut changes = Vec::new();
        let mut views = Vec::new();
        for m in &self.settings.models.clone() {
            let rec = &recs[&m.name];
            let want = desired[&m.name];
            let label = ModelLabel {
                model: m.name.clone(),
            };
            self.metrics
                .panic
                .get_or_create(&label)
                .set(i64::from(rec.mode == Mode::Panic));
            self.metrics
                .ready
                .get_or_create(&label)
                .set(i64::from(ready.get(&m.name).copied().unwrap_or(0)));
            let spare = spares.get(&m.name).copied().unwrap_or(0);
            let spares_changed = self.spares.get(&m.name).copied().unwrap_or(0) != spare;
            if before.get(&m.name).copied().unwrap_or(0) != want || spares_changed {
                if spares_changed {
                    tracing::info!(model = %m.name, spares = spare, "spare replicas in room GPUs in use leave idle");
                }
                changes.push(Change {
                    model: m.clone(),
                    from: before.get(&m.name).copied().unwrap_or(0),
                    rec: rec.clone(),
                    memory: self.states.get(&m.name).map(|s| s.memory(now)),
                    spares: spare,
                });
            }
            if before.get(&m.name).copied().unwrap_or(0) != want {
                tracing::info!(model = %m.name, replicas = want, mode = ?rec.mode, "{}", rec.reason);
                self.metrics
                    .desired
                    .get_or_create(&label)
                    .set(i64::from(want));
                self.metrics
                    .decisions
                    .get_or_create(&ModeLabels {
                        model: m.name.clone(),
                        mode: format!("{:?}", rec.mode).to_lowercase(),
                    })
                    .inc();
                if let Some(t) = signal {
                    self.metrics
                        .signal_to_decision
                        .observe(t.elapsed().as_secs_f64());
                }
            }
            views.push((
                m.name.clone(),
                DecisionView {
                    desired: want,
                    ready: ready.get(&m.name).copied().unwrap_or(0),
                    mode: rec.mode,
                    reason: rec.reason.clone(),
                    at: rfc3339(now),
                },
                before.get(&m.name).copied().unwrap_or(0) != want,
            ));
        }
        {
            let mut decisions = self
                .report
                .decisions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for (model, view, changed) in views {
                let d = decisions.entry(model).or_default();
                if changed {
                    if d.history.len() == HISTORY {
                        d.history.pop_front();
                    }
                    d.history.push_back(view.clone());
                }
                d.latest = Some(view);
            }
        }
        let mut spares = spares;
        if !changes.is_empty() {
            // The plan with its spares: the variants' counts include them.
            let plan = self.filled.as_ref().or(self.plan.as_ref());
            let failed = self
                .backend
                .apply(&changes, plan, before_plan.as_ref(), now)
                .await;
            // A model whose write failed keeps the spares it had, so the
            // next round writes them again (its count is retried the same
            // way: the backend's desired count did not move).
            for m in failed {
                match self.spares.get(&m) {
                    Some(&n) => spares.insert(m, n),
                    None => spares.remove(&m),
                };
            }
        }
        self.spares = spares;
    }

    /// Packs the wanted counts from the last plan; a model whose replicas
    /// do not all fit gets what was placed, and says why. Returns the
    /// cluster as it was before this plan.
    ///
    /// The solve runs on the blocking pool (it is CPU work, up to
    /// [`PACK_BUDGET`]), so the runtime it shares with the embedded
    /// gateway keeps serving meanwhile.
    async fn place(
        &mut self,
        cluster: gpuscale_policies::Cluster,
        desired: &mut BTreeMap<String, u32>,
        recs: &mut BTreeMap<String, crate::recommend::Recommendation>,
    ) -> gpuscale_policies::Cluster {
        let current = match &self.plan {
            Some(p) => p.apply_to(&cluster),
            None => cluster,
        };
        let models: Vec<Model> = self.settings.models.clone();
        let wanted = desired.clone();
        let on = current.clone();
        let basis = self.plan.as_ref().and_then(|p| p.basis.clone());
        // Moves (cold starts) only at a consolidation; between, what
        // runs stays where it is.
        let keep = self
            .last_consolidation
            .is_some_and(|t| t.elapsed() < self.settings.spec.consolidate_every);
        if !keep {
            self.last_consolidation = Some(Instant::now());
        }
        let options = PackOptions {
            time_limit: PACK_BUDGET,
            keep_running: keep,
            ..self.settings.spec.packer.options()
        };
        let spares = self.settings.spec.packer.spares;
        let previous = self.filled.clone();
        let speeds_cluster = self.settings.cluster.clone();
        // The spares' fill and the replicas' speeds are CPU work over the
        // plan too (a column build and a pass per GPU): on the blocking
        // pool with the solve.
        let solved = tokio::task::spawn_blocking(move || {
            pack_from(&on, &models, &wanted, &options, basis.as_ref()).map(|base| {
                // Spares fill the room the plan's GPUs leave idle; the
                // next re-plan starts from the plan without them.
                let filled = spares.then(|| {
                    gpuscale_packer::spare::fill(&base, &on, &models, &options, previous.as_ref())
                });
                let speeds = speeds_cluster
                    .as_ref()
                    .map(|c| speeds(filled.as_ref().unwrap_or(&base), c, &models));
                (base, filled, speeds)
            })
        })
        .await;
        let solved = match solved {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("the packer task failed, counts applied unplaced: {e}");
                return current;
            }
        };
        match solved {
            Ok((base, filled, speeds)) => {
                crate::decide::take_placement(&base, desired, recs, &mut self.states);
                let plan = match filled {
                    Some(filled) => {
                        self.filled = Some(filled.clone());
                        filled
                    }
                    None => base.clone(),
                };
                tracing::info!(
                    gpus = plan.gpus_used,
                    moves = plan.moves,
                    reconfigured = plan.reconfigured_gpus,
                    ms = (plan.solve_ms * 10.0).round() / 10.0,
                    "placement"
                );
                self.report.set_plan(&plan);
                for pool in &plan.pools {
                    let label = PoolLabel {
                        gpu_model: pool.gpu_model.clone(),
                    };
                    self.metrics
                        .pool_gpus
                        .get_or_create(&label)
                        .set(i64::from(pool.gpus));
                    self.metrics
                        .pool_used
                        .get_or_create(&label)
                        .set(i64::from(pool.gpus_used));
                }
                for (resource, v) in [
                    ("memory", plan.utilization.memory),
                    ("compute", plan.utilization.compute),
                    ("dominant", plan.utilization.dominant),
                ] {
                    self.metrics
                        .utilization
                        .get_or_create(&ResourceLabel {
                            resource: resource.into(),
                        })
                        .set(v);
                }
                if let Some(speeds) = speeds {
                    self.backend.placed(&speeds);
                }
                self.plan = Some(base);
            }
            Err(e) => tracing::error!("packing failed, counts applied unplaced: {e}"),
        }
        current
    }
}
