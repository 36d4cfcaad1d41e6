//! Scenario files (`kind: Scenario`): the cluster and policies to run, the
//! workloads that drive them, the autoscalers to compare and how. Paths
//! inside are relative to the scenario file. Every problem — in the file
//! itself, in the cluster and policies it names, in a trace — is reported
//! at its file, line and column.
//!
//! ```yaml
//! apiVersion: gpuscale.io/v1alpha1
//! kind: Scenario
//! metadata: {name: azure-conv}
//! spec:
//!   seed: 7
//!   duration: 1h
//!   cluster: ../../examples/cluster.yaml
//!   policies: [../../examples/policies]
//!   workloads:
//!     - model: llama-3-1-8b
//!       arrivals: {trace: {file: data/azure_llm_2023_conv.csv}}
//!       service: {prefillTps: 8000, decodeTps: 60, batchSlowdown: 0.02}
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpuscale_gateway::config::{QueueOrder, QueueSpec};
use gpuscale_policies::document::{self, Document, Position, Problem};
use gpuscale_policies::load::{self, Problems};
use gpuscale_policies::serving::ServiceProfile;
use gpuscale_policies::{Cluster, Model, Priority};
use serde::Deserialize;

use crate::arrivals::{Diurnal, Process, Shape, Step, Tokens, Workload};
use crate::trace::Trace;

/// The autoscalers a scenario can compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// gpuscale's recommender (`recommend()`), its decision round and packer.
    Gpuscale,
    /// Kubernetes HPA v2 on average in-flight requests per replica.
    Hpa,
    /// KEDA on top of HPA: polling, activation, cooldown, scale to zero.
    Keda,
    /// Knative's KPA: stable and panic windows on concurrency.
    Knative,
    /// A fixed count, provisioned for the peak.
    StaticPeak,
}

impl PolicyKind {
    /// Every kind, in report order.
    pub const ALL: [PolicyKind; 5] = [
        PolicyKind::Gpuscale,
        PolicyKind::Hpa,
        PolicyKind::Keda,
        PolicyKind::Knative,
        PolicyKind::StaticPeak,
    ];

    /// The name in files and reports.
    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Gpuscale => "gpuscale",
            PolicyKind::Hpa => "hpa",
            PolicyKind::Keda => "keda",
            PolicyKind::Knative => "knative",
            PolicyKind::StaticPeak => "static-peak",
        }
    }
}

/// Where replicas go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementKind {
    /// gpuscale's packer (MIG, sharing, whole GPUs), re-planned on change.
    Packer,
    /// One replica per whole GPU (or tensor-parallel group), first fit.
    WholeGpu,
}

impl PlacementKind {
    /// The name in files and reports.
    pub fn name(self) -> &'static str {
        match self {
            PlacementKind::Packer => "packer",
            PlacementKind::WholeGpu => "whole-gpu",
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScenarioDoc {
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    metadata: load::Metadata,
    spec: ScenarioSpec,
}

fn seed() -> u64 {
    1
}
fn second() -> Duration {
    Duration::from_secs(1)
}
fn all_policies() -> Vec<PolicyKind> {
    PolicyKind::ALL.to_vec()
}
fn both_placements() -> Vec<PlacementKind> {
    vec![PlacementKind::Packer, PlacementKind::WholeGpu]
}

/// `spec` of a scenario, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioSpec {
    /// Seed of every random draw.
    #[serde(default = "seed")]
    pub seed: u64,
    /// Simulated time.
    #[serde(with = "gpuscale_policies::duration")]
    pub duration: Duration,
    /// The cluster file.
    pub cluster: PathBuf,
    /// Model policy files or folders.
    pub policies: Vec<PathBuf>,
    /// The gateway's queue.
    #[serde(default)]
    pub gateway: GatewaySpec,
    /// How long a new replica takes to serve.
    #[serde(default)]
    pub cold_start: ColdStartSpec,
    /// gpuscale's decision interval (the controller's tick).
    #[serde(default = "second", with = "gpuscale_policies::duration")]
    pub tick: Duration,
    /// The autoscalers to run.
    #[serde(default = "all_policies")]
    pub compare: Vec<PolicyKind>,
    /// The placements each runs with.
    #[serde(default = "both_placements")]
    pub placements: Vec<PlacementKind>,
    /// The packer's per-solve time limit (a re-plan in the controller has
    /// 5 s).
    #[serde(default = "pack_limit", with = "gpuscale_policies::duration")]
    pub pack_time_limit: Duration,
    /// The packer's clock-bound improvement of its heuristic plan
    /// (`--improve-limit`; the controller's default is 1 s). 0, the
    /// default here, skips it: plans are then a function of the input
    /// alone (the same seed gives the same report at any size), and a day
    /// of re-plans takes minutes, not hours; the plans may cost a little
    /// more than the controller's, which counts against gpuscale.
    #[serde(default, with = "gpuscale_policies::duration")]
    pub pack_improve_limit: Duration,
    /// How often a re-plan may move running replicas to save GPUs (the
    /// controller's `consolidateEvery`); between, re-plans keep every
    /// running replica where it is. 0s (the default): every re-plan may
    /// move.
    #[serde(default = "consolidate_every", with = "gpuscale_policies::duration")]
    pub consolidate_every: Duration,
    /// Whether the packer's placement runs spare replicas in the room its
    /// GPUs in use leave idle (the controller's `spec.packer.spares`,
    /// on by default; `gpuscale_packer::spare`), for every autoscaler it
    /// places for.
    #[serde(default = "yes")]
    pub spares: bool,
    /// Whether gpuscale also decides on the gateway's pushes (on every
    /// arrival, at most every 100 ms, as the controller does), not only on
    /// its tick. On by default; a scenario without bursts may turn it off
    /// to simulate ten times fewer decisions (a day of a thousand GPUs).
    #[serde(default = "yes")]
    pub decide_on_push: bool,
    /// What arrives.
    pub workloads: Vec<WorkloadSpec>,
}

fn yes() -> bool {
    true
}

fn pack_limit() -> Duration {
    Duration::from_secs(5)
}

fn consolidate_every() -> Duration {
    gpuscale_autoscaler::config::DEFAULT_CONSOLIDATE_EVERY
}

/// The gateway's admission settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GatewaySpec {
    /// Waiting requests per model before 429.
    pub max_queue: usize,
    /// Longest wait before 503.
    #[serde(with = "gpuscale_policies::duration")]
    pub queue_timeout: Duration,
    /// The gateway scrapes each replica's vLLM metrics every tick
    /// (`metrics: vllm` in its config): the prompts waiting for a
    /// replica's prefill (`vllm:num_requests_waiting`) count as waiting,
    /// and its prefill seconds per second reach the autoscaler. Off by
    /// default, as the example policies deploy.
    pub scrape_server_metrics: bool,
    /// The order a class's waiters are served in (the gateway's
    /// `queue.order`): `adaptive` (newest first while the oldest waiter
    /// is past its model's budget) or `fifo`.
    pub order: QueueOrder,
    /// The budget of a model whose policy sets no queue-wait or TTFT
    /// target (the gateway's `queue.newestFirstAfter`).
    #[serde(with = "gpuscale_policies::duration")]
    pub newest_first_after: Duration,
}

impl Default for GatewaySpec {
    fn default() -> Self {
        // The gateway's own defaults (`gateway::config`).
        let q = QueueSpec::default();
        GatewaySpec {
            max_queue: q.max_queue,
            queue_timeout: q.queue_timeout,
            scrape_server_metrics: false,
            order: q.order,
            newest_first_after: q.newest_first_after,
        }
    }
}

/// Cold start: the image pull, then the weights loaded at a rate.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ColdStartSpec {
    /// Pulling the serving image, on a node that does not have it.
    #[serde(with = "gpuscale_policies::duration")]
    pub image_pull: Duration,
    /// Whether a node keeps the image once pulled (the kubelet's cache;
    /// every model serves from the one image, as the Kubernetes backend's
    /// `spec.kubernetes.image`): a replica on a node that has it loads
    /// only its weights. `false`: every start pulls.
    pub image_cache: bool,
    /// GiB of replica memory loaded per second.
    #[serde(rename = "loadGiBPerSecond")]
    pub load_gib_per_second: f64,
}

impl Default for ColdStartSpec {
    fn default() -> Self {
        ColdStartSpec {
            image_pull: Duration::from_secs(20),
            image_cache: true,
            load_gib_per_second: 2.0,
        }
    }
}

impl ColdStartSpec {
    /// Cold start of a replica of `memory_gib` on a node without the
    /// image.
    pub fn of(&self, memory_gib: f64) -> Duration {
        self.image_pull + self.load(memory_gib)
    }

    /// Loading the weights of a replica of `memory_gib`.
    pub fn load(&self, memory_gib: f64) -> Duration {
        Duration::from_secs_f64(memory_gib / self.load_gib_per_second)
    }
}

/// One workload as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadSpec {
    /// The model policy's name.
    pub model: String,
    /// Arrivals.
    pub arrivals: ArrivalsSpec,
    /// Sizes (generators only; a trace brings its own).
    #[serde(default)]
    pub tokens: Option<TokensSpec>,
    /// Service speed of a replica on one H100's compute.
    #[serde(default)]
    pub service: ServiceSpec,
    /// Priority class of its requests (default: the policy's).
    #[serde(default)]
    pub priority: Option<Priority>,
}

/// Arrivals as written: one process, and a shape for generators.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArrivalsSpec {
    /// Poisson.
    #[serde(default)]
    pub poisson: Option<RateSpec>,
    /// Gamma gaps.
    #[serde(default)]
    pub gamma: Option<GammaSpec>,
    /// Trace replay.
    #[serde(default)]
    pub trace: Option<TraceSpec>,
    /// Diurnal shape.
    #[serde(default)]
    pub diurnal: Option<DiurnalSpec>,
    /// Step bursts.
    #[serde(default)]
    pub steps: Vec<StepSpec>,
}

/// `{rate}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateSpec {
    /// Mean requests per second.
    pub rate: f64,
}

/// `{rate, cv}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GammaSpec {
    /// Mean requests per second.
    pub rate: f64,
    /// Coefficient of variation of the gaps.
    pub cv: f64,
}

fn one_f() -> f64 {
    1.0
}
fn one_u() -> u32 {
    1
}

/// Trace replay.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TraceSpec {
    /// The CSV file.
    pub file: PathBuf,
    /// Time compression.
    #[serde(default = "one_f")]
    pub speedup: f64,
    /// Share of the rows this model receives.
    #[serde(default = "one_f")]
    pub share: f64,
    /// Copies of each kept row.
    #[serde(default = "one_u")]
    pub copies: u32,
}

/// Diurnal shape.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiurnalSpec {
    /// 0–1.
    pub amplitude: f64,
    /// Cycle length (default 24 h).
    #[serde(default = "day", with = "gpuscale_policies::duration")]
    pub period: Duration,
    /// Time of the peak within the cycle.
    #[serde(with = "gpuscale_policies::duration")]
    pub peak_at: Duration,
}

fn day() -> Duration {
    Duration::from_secs(86_400)
}

/// A step burst.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepSpec {
    /// Start.
    #[serde(with = "gpuscale_policies::duration")]
    pub at: Duration,
    /// Length.
    #[serde(rename = "for", with = "gpuscale_policies::duration")]
    pub length: Duration,
    /// Rate multiplier.
    pub factor: f64,
}

/// Sizes: fixed, or sampled from a trace's rows.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokensSpec {
    /// Fixed prompt tokens.
    #[serde(default)]
    pub prompt: Option<u32>,
    /// Fixed output tokens.
    #[serde(default)]
    pub output: Option<u32>,
    /// Sample (prompt, output) pairs from this trace.
    #[serde(default)]
    pub trace: Option<PathBuf>,
}

/// A replica's speed on one H100's compute.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServiceSpec {
    /// Prompt tokens per second.
    pub prefill_tps: f64,
    /// Output tokens per second of one request alone.
    pub decode_tps: f64,
    /// Per-token slowdown per other request in the batch.
    pub batch_slowdown: f64,
}

impl Default for ServiceSpec {
    fn default() -> Self {
        // `gpuscale sim-server --profile small`: an 8B model on an H100.
        let p = ServiceProfile::named("small", "").expect("a built-in profile");
        ServiceSpec {
            prefill_tps: p.prefill_tps,
            decode_tps: p.decode_tps,
            batch_slowdown: p.batch_slowdown,
        }
    }
}

/// A loaded, validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// `metadata.name`.
    pub name: String,
    /// The file.
    pub file: PathBuf,
    /// The spec (paths resolved).
    pub spec: ScenarioSpec,
    /// The cluster.
    pub cluster: Cluster,
    /// The model policies.
    pub models: Vec<Model>,
    /// Per workload: the model's index in `models`.
    pub workload_models: Vec<usize>,
    /// Per workload: its arrivals.
    pub workloads: Vec<Workload>,
    /// Per workload: the service profile on one H100 (speed 1).
    pub services: Vec<ServiceProfile>,
    /// Per workload: the priority class of its requests.
    pub priorities: Vec<Priority>,
}

fn at_start(file: &Path, message: String) -> Problems {
    Problems(vec![Problem {
        file: file.to_path_buf(),
        position: Position { line: 1, column: 1 },
        path: String::new(),
        message,
    }])
}

impl Scenario {
    /// Loads a scenario file with everything it names.
    pub fn load(file: &Path) -> Result<Scenario, Problems> {
        let text = load::read(file).map_err(|p| Problems(vec![p]))?;
        let docs = document::parse(file, &text).map_err(|p| Problems(vec![p]))?;
        let [doc] = docs.as_slice() else {
            return Err(at_start(
                file,
                format!(
                    "expected one `kind: Scenario` document, found {}",
                    docs.len()
                ),
            ));
        };
        if doc.kind() != Some("Scenario") {
            return Err(Problems(vec![doc.problem("kind", "expected `Scenario`")]));
        }
        let parsed: ScenarioDoc = load::typed(doc)?;
        let dir = file.parent().unwrap_or(Path::new("."));
        let mut spec = parsed.spec;
        // Every problem at once: the spec's own, those of the files it
        // names, those of its workloads.
        let mut problems = check(&spec, doc);
        spec.cluster = dir.join(&spec.cluster);
        spec.policies = spec.policies.iter().map(|p| dir.join(p)).collect();
        let mut named: Vec<(String, &Path)> =
            Document::each("spec.policies", &spec.policies).collect();
        named.push(("spec.cluster".into(), spec.cluster.as_path()));
        let missing = doc.missing(named);
        if !missing.is_empty() {
            problems.extend(missing);
            problems.sort();
            return Err(Problems(problems));
        }
        let mut paths = spec.policies.clone();
        paths.push(spec.cluster.clone());
        let bundle = match load::load_paths(&paths) {
            Ok(b) => b,
            Err(Problems(more)) => {
                problems.extend(more);
                problems.sort();
                return Err(Problems(problems));
            }
        };
        let Some(cluster) = bundle.cluster else {
            problems.push(doc.problem("spec.cluster", "no `kind: Cluster` document there"));
            problems.sort();
            return Err(Problems(problems));
        };
        let models = bundle.models;
        let mut traces: BTreeMap<PathBuf, Arc<Trace>> = BTreeMap::new();
        let mut trace = |path: &Path, field: String| -> Result<Arc<Trace>, Problem> {
            let p = dir.join(path);
            if let Some(t) = traces.get(&p) {
                return Ok(t.clone());
            }
            match Trace::read(&p) {
                Ok(t) => {
                    let t = Arc::new(t);
                    traces.insert(p, t.clone());
                    Ok(t)
                }
                Err(e) if e.line == 1 && e.message.starts_with("cannot read") => {
                    Err(doc.problem(field, format!("{}: {}", p.display(), e.message)))
                }
                Err(e) => Err(Problem {
                    file: e.file,
                    position: Position {
                        line: e.line,
                        column: e.column,
                    },
                    path: String::new(),
                    message: e.message,
                }),
            }
        };
        let mut workload_models = Vec::new();
        let mut workloads = Vec::new();
        let mut services = Vec::new();
        let mut priorities = Vec::new();
        for (i, w) in spec.workloads.iter().enumerate() {
            let at = |f: &str| format!("spec.workloads[{i}].{f}");
            let Some(m) = models.iter().position(|m| m.name == w.model) else {
                problems.push(doc.problem(
                    at("model"),
                    if models.is_empty() {
                        format!(
                            "no model policy `{}`: `spec.policies` hold no ModelPolicy",
                            w.model
                        )
                    } else {
                        format!(
                            "no model policy `{}` among {}",
                            w.model,
                            models
                                .iter()
                                .map(|m| m.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    },
                ));
                continue;
            };
            let a = &w.arrivals;
            let process = if let Some(p) = &a.poisson {
                Process::Poisson { rate: p.rate }
            } else if let Some(g) = &a.gamma {
                Process::Gamma {
                    rate: g.rate,
                    cv: g.cv,
                }
            } else if let Some(t) = &a.trace {
                match trace(&t.file, at("arrivals.trace.file")) {
                    Ok(tr) => {
                        if let Some(why) = replay_problem(&tr, t, spec.duration.as_secs_f64()) {
                            problems.push(doc.problem(at("arrivals.trace"), why));
                            continue;
                        }
                        Process::Trace {
                            trace: tr,
                            speedup: t.speedup,
                            share: t.share,
                            copies: t.copies,
                        }
                    }
                    Err(p) => {
                        problems.push(p);
                        continue;
                    }
                }
            } else {
                continue; // reported by `check`
            };
            let tokens = match &w.tokens {
                Some(TokensSpec {
                    trace: Some(path), ..
                }) => match trace(path, at("tokens.trace")) {
                    Ok(t) => Tokens::Sampled(t),
                    Err(p) => {
                        problems.push(p);
                        continue;
                    }
                },
                Some(t) => Tokens::Fixed {
                    prompt: t.prompt.unwrap_or(0),
                    output: t.output.unwrap_or(0),
                },
                None => Tokens::Fixed {
                    prompt: 0,
                    output: 0,
                },
            };
            let shape = Shape {
                diurnal: a.diurnal.as_ref().map(|d| Diurnal {
                    amplitude: d.amplitude,
                    period: d.period.as_secs_f64(),
                    peak: d.peak_at.as_secs_f64(),
                }),
                steps: a
                    .steps
                    .iter()
                    .map(|s| Step {
                        at: s.at.as_secs_f64(),
                        length: s.length.as_secs_f64(),
                        factor: s.factor,
                    })
                    .collect(),
            };
            let model = &models[m];
            services.push(ServiceProfile {
                model: model.served_name.clone(),
                prefill_tps: w.service.prefill_tps,
                decode_tps: w.service.decode_tps,
                max_concurrency: model.max_concurrency,
                batch_slowdown: w.service.batch_slowdown,
                speed: 1.0,
                default_max_tokens: 16,
                // The trace has token counts, not prompts.
                prefix_cache_tokens: 0,
            });
            priorities.push(w.priority.unwrap_or(model.priority));
            workload_models.push(m);
            workloads.push(Workload {
                process,
                shape,
                tokens,
            });
        }
        if !problems.is_empty() {
            // A trace two workloads read has its problem once.
            problems.sort();
            problems.dedup();
            return Err(Problems(problems));
        }
        Ok(Scenario {
            name: parsed.metadata.name,
            file: file.to_path_buf(),
            spec,
            cluster,
            models,
            workload_models,
            workloads,
            services,
            priorities,
        })
    }
}

/// Every bound of the spec, each a located problem.
fn check(spec: &ScenarioSpec, doc: &Document) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut bad = |path: String, message: &str| out.push(doc.problem(path, message));
    if spec.duration.is_zero() {
        bad("spec.duration".into(), "must be more than 0");
    }
    if spec.duration > MAX_DURATION {
        bad(
            "spec.duration".into(),
            "must be at most 31 days (the simulation steps every second)",
        );
    }
    if spec.tick.is_zero() || spec.tick.subsec_nanos() != 0 {
        bad(
            "spec.tick".into(),
            "must be a whole number of seconds, at least 1s (the simulation steps every second)",
        );
    }
    if spec.gateway.max_queue == 0 {
        bad("spec.gateway.maxQueue".into(), "must be at least 1");
    }
    if spec.gateway.newest_first_after.is_zero() || spec.gateway.newest_first_after > MAX_DURATION {
        bad(
            "spec.gateway.newestFirstAfter".into(),
            "must be above 0s and at most 31 days (0s would serve every queue newest first always; `order: fifo` is the way to say oldest first)",
        );
    }
    if !(spec.cold_start.load_gib_per_second > 0.0
        && spec.cold_start.load_gib_per_second.is_finite())
    {
        bad(
            "spec.coldStart.loadGiBPerSecond".into(),
            "must be a positive number",
        );
    }
    if spec.policies.is_empty() {
        bad(
            "spec.policies".into(),
            "name at least one policy file or folder",
        );
    }
    if spec.compare.is_empty() {
        bad("spec.compare".into(), "name at least one autoscaler");
    }
    if spec.placements.is_empty() {
        bad("spec.placements".into(), "name at least one placement");
    }
    // A run named twice ran twice and wrote two runs of one name into
    // report.json (the later hiding the earlier in `policies`).
    for (i, c) in spec.compare.iter().enumerate() {
        if spec.compare[..i].contains(c) {
            bad(format!("spec.compare[{i}]"), "is listed twice");
        }
    }
    for (i, p) in spec.placements.iter().enumerate() {
        if spec.placements[..i].contains(p) {
            bad(format!("spec.placements[{i}]"), "is listed twice");
        }
    }
    if spec.workloads.is_empty() {
        bad("spec.workloads".into(), "give at least one workload");
    }
    let positive = |x: f64| x > 0.0 && x.is_finite();
    for (i, w) in spec.workloads.iter().enumerate() {
        let at = |f: &str| format!("spec.workloads[{i}].{f}");
        let a = &w.arrivals;
        let n = [a.poisson.is_some(), a.gamma.is_some(), a.trace.is_some()]
            .iter()
            .filter(|x| **x)
            .count();
        if n != 1 {
            bad(
                at("arrivals"),
                "give exactly one of `poisson`, `gamma` and `trace`",
            );
        }
        if let Some(p) = &a.poisson
            && !(p.rate >= 0.0 && p.rate.is_finite())
        {
            bad(at("arrivals.poisson.rate"), "must be a rate ≥ 0 per second");
        }
        if let Some(g) = &a.gamma {
            if !(g.rate >= 0.0 && g.rate.is_finite()) {
                bad(at("arrivals.gamma.rate"), "must be a rate ≥ 0 per second");
            }
            if !(g.cv >= MIN_CV && g.cv <= MAX_CV) {
                bad(
                    at("arrivals.gamma.cv"),
                    &format!("must be at least {MIN_CV} and at most {MAX_CV}"),
                );
            }
        }
        if let Some(t) = &a.trace {
            if !positive(t.speedup) {
                bad(at("arrivals.trace.speedup"), "must be more than 0");
            }
            if !(t.share > 0.0 && t.share <= 1.0) {
                bad(at("arrivals.trace.share"), "must be in (0, 1]");
            }
            if t.copies == 0 {
                bad(at("arrivals.trace.copies"), "must be at least 1");
            }
            if a.diurnal.is_some() || !a.steps.is_empty() {
                bad(
                    at("arrivals"),
                    "a trace keeps its own shape: `diurnal` and `steps` are for generators",
                );
            }
            if w.tokens.is_some() {
                bad(at("tokens"), "a trace brings its own token counts");
            }
        }
        if let Some(d) = &a.diurnal {
            if !(0.0..=1.0).contains(&d.amplitude) {
                bad(at("arrivals.diurnal.amplitude"), "must be in [0, 1]");
            }
            if d.period.is_zero() {
                bad(at("arrivals.diurnal.period"), "must be more than 0");
            }
        }
        for (k, s) in a.steps.iter().enumerate() {
            if s.length.is_zero() {
                bad(
                    at(&format!("arrivals.steps[{k}].for")),
                    "must be longer than 0s",
                );
            }
            if !(s.factor >= 0.0 && s.factor.is_finite()) {
                bad(at(&format!("arrivals.steps[{k}].factor")), "must be ≥ 0");
            }
            if s.at >= spec.duration {
                bad(
                    at(&format!("arrivals.steps[{k}].at")),
                    "starts after the scenario ends (`spec.duration`)",
                );
            }
        }
        // Every arrival is generated up front and held in memory: a
        // generator's count, at most its rate × the duration × its peak
        // multiplier, is bounded.
        let rate = a
            .poisson
            .as_ref()
            .map(|p| p.rate)
            .or(a.gamma.as_ref().map(|g| g.rate));
        if let Some(rate) = rate.filter(|r| r.is_finite()) {
            let peak = a.diurnal.as_ref().map_or(1.0, |d| 1.0 + d.amplitude.abs())
                * a.steps
                    .iter()
                    .map(|s| s.factor.max(1.0))
                    .filter(|f| f.is_finite())
                    .product::<f64>();
            let expected = rate * spec.duration.as_secs_f64() * peak;
            if expected > MAX_ARRIVALS as f64 {
                bad(
                    at("arrivals"),
                    &format!(
                        "expects up to {expected:.3e} requests; the simulator holds every \
                         request in memory and takes at most {MAX_ARRIVALS} per workload \
                         (lower the rate or the duration)"
                    ),
                );
            }
        }
        if let Some(t) = &a.trace
            && t.copies > MAX_COPIES
        {
            bad(
                at("arrivals.trace.copies"),
                &format!("must be at most {MAX_COPIES}"),
            );
        }
        if a.trace.is_none() && w.tokens.is_none() {
            bad(
                at("tokens"),
                "a generator needs request sizes: `tokens: {trace: FILE}` or `{prompt: N, output: N}`",
            );
        }
        if let Some(t) = &w.tokens {
            match (t.trace.is_some(), t.prompt.is_some() || t.output.is_some()) {
                (true, true) => bad(
                    at("tokens"),
                    "give `trace` (sizes sampled from it) or fixed `prompt`/`output`, not both",
                ),
                (false, false) => bad(at("tokens"), "give `trace` or `prompt`/`output`"),
                _ => {}
            }
            // Fixed sizes: a request is at least one token, and no
            // request outgrows every model's context window.
            if t.trace.is_none() {
                let (prompt, output) = (t.prompt.unwrap_or(0), t.output.unwrap_or(0));
                if prompt == 0 {
                    bad(
                        at("tokens.prompt"),
                        "a request has a prompt of at least one token (`output` may be 0, as for an embedding)",
                    );
                }
                for (f, v) in [("tokens.prompt", prompt), ("tokens.output", output)] {
                    if v > MAX_TOKENS {
                        bad(
                            at(f),
                            &format!(
                                "must be at most {MAX_TOKENS} tokens (longer than any model's context)"
                            ),
                        );
                    }
                }
            }
        }
        let s = &w.service;
        for (f, v) in [
            ("service.prefillTps", s.prefill_tps),
            ("service.decodeTps", s.decode_tps),
        ] {
            if !(v >= ServiceProfile::MIN_TPS && v.is_finite()) {
                bad(
                    at(f),
                    &format!(
                        "must be at least {} tokens per second",
                        ServiceProfile::MIN_TPS
                    ),
                );
            }
        }
        if !(s.batch_slowdown >= 0.0 && s.batch_slowdown <= ServiceProfile::MAX_BATCH_SLOWDOWN) {
            bad(
                at("service.batchSlowdown"),
                &format!(
                    "must be from 0 to {} (the slowdown per other request in the batch)",
                    ServiceProfile::MAX_BATCH_SLOWDOWN
                ),
            );
        }
    }
    out
}

/// Why replaying `trace` as `t` says over `duration` seconds would bring
/// more requests than the simulator holds (or visit more rows than it
/// would ever finish): looped as [`crate::arrivals`] loops it.
fn replay_problem(trace: &Trace, t: &TraceSpec, duration: f64) -> Option<String> {
    let rows = trace.rows.len().max(1) as f64;
    let span = trace.span() / t.speedup;
    let period = span + span / rows;
    let passes = if period > 0.0 && period.is_finite() {
        (duration / period).ceil().max(1.0)
    } else {
        f64::INFINITY
    };
    let visited = passes * rows;
    let requests = visited * t.share * f64::from(t.copies);
    (visited > MAX_ARRIVALS as f64 || requests > MAX_ARRIVALS as f64).then(|| {
        format!(
            "replays the trace's {} rows {passes:.3e} times over `spec.duration` (speedup {}), \
             each row kept with probability {} and {} copies: up to {requests:.3e} requests, more \
             than the {MAX_ARRIVALS} per workload the simulator holds in memory (lower the \
             speedup, the copies or the duration)",
            trace.rows.len(),
            t.speedup,
            t.share,
            t.copies,
        )
    })
}

/// The largest coefficient of variation of Gamma gaps: 20 is a shape of
/// 1/400, already one arrival in a hundred carrying most of the gaps'
/// time (serving studies use CVs up to about 8); far beyond it the gaps
/// underflow to zero and a stream is a handful of giant clumps.
const MAX_CV: f64 = 20.0;
/// The least: the gamma's shape is 1/cv², 10,000 here (as regular as
/// arrivals get; below, the shape overflows).
const MIN_CV: f64 = 0.01;

/// Longest scenario.
const MAX_DURATION: Duration = Duration::from_secs(31 * 86_400);

/// Most requests one generated workload may bring (fleet-1000's day,
/// all 40 workloads together, brings 42 million).
const MAX_ARRIVALS: u64 = 100_000_000;

/// Most copies of each trace row.
const MAX_COPIES: u32 = 10_000;
/// Most tokens of a fixed-size request's prompt or output: 10 M, above
/// the longest context any served model has.
const MAX_TOKENS: u32 = 10_000_000;
