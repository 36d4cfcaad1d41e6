//! The model SLO policy: what a model owner writes.
//!
//! [`ModelPolicySpec`] is both the file format (`kind: ModelPolicy` in YAML or
//! JSON) and the spec of the Kubernetes custom resource `ModelPolicy`
//! (`gpuscale.io/v1alpha1`), so `gpuscale crd` prints a schema generated from
//! the very types the loader reads. Field names are camelCase, as in every
//! Kubernetes API.
//!
//! [`Model`] is the validated runtime form, built by [`Model::from_policy`]:
//! memory resolved from parameters, defaults filled in (HPA's for the scaling
//! behaviour), and static feasibility checked against the GPU catalogue.
//!
//! ## Units
//! - memory in GiB (2^30 bytes); weights take `paramsB × 10^9 × bytes per
//!   parameter` (bf16/fp16 2, fp8/int8 1, int4 0.5, fp32 4);
//! - compute as a fraction of one H100-80GB at the model's target throughput
//!   (see [`crate::catalog`]): 0.25 means a quarter of an H100, or 0.79 of an
//!   A100 (relative compute 0.315);
//! - durations as human text: `500ms`, `30s`, `5m`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::FieldError;
use crate::catalog::Catalog;

/// Default runtime overhead per replica (CUDA context, activations), GiB.
pub const DEFAULT_OVERHEAD_GIB: f64 = 2.0;

/// Bytes per GiB.
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A model owner's policy for one served model.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gpuscale.io",
    version = "v1alpha1",
    kind = "ModelPolicy",
    plural = "modelpolicies",
    shortname = "mp",
    namespaced,
    status = "ModelPolicyStatus",
    printcolumn = r#"{"name":"Min","type":"integer","jsonPath":".spec.scaling.minReplicas"}"#,
    printcolumn = r#"{"name":"Max","type":"integer","jsonPath":".spec.scaling.maxReplicas"}"#,
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".status.desiredReplicas"}"#,
    printcolumn = r#"{"name":"Current","type":"integer","jsonPath":".status.currentReplicas"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.lastDecision.reason","priority":1}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelPolicySpec {
    /// The model name clients send (the OpenAI `model` field); defaults to
    /// the policy's `metadata.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_name: Option<String>,
    /// Labels of the model's pods: every pod gpuscale runs for the model
    /// carries them beside its own (what your Services, NetworkPolicies
    /// and monitors select the model's pods by).
    #[serde(default)]
    pub selector: WorkloadSelector,
    /// What one replica needs.
    pub resources: ReplicaResources,
    /// Where replicas may run.
    #[serde(default)]
    pub placement: PlacementPolicy,
    /// Service-level objectives.
    #[serde(default)]
    pub slo: SloTargets,
    /// How the replica count follows demand.
    #[serde(default)]
    pub scaling: ScalingPolicy,
    /// Who wins when GPUs are short.
    #[serde(default)]
    pub priority: Priority,
    /// LoRA adapters this model's replicas serve (vLLM `--lora-modules`,
    /// or loaded on demand): a request whose `model` names one goes to
    /// this model's replicas, preferring those that have it loaded, and
    /// counts in this model's queue.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<String>,
    /// More arguments for the model server of this model's replicas (on
    /// Kubernetes), after those gpuscale sets: `--model`, `--port`, and
    /// what the plan gives each replica (`--tensor-parallel-size`,
    /// `--gpu-memory-utilization`), which are refused here. For example
    /// `["--max-model-len", "8192"]`, so that one full-length request's
    /// KV cache fits a shared device's memory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_args: Vec<String>,
}

/// Flags of the model server that gpuscale sets itself (vLLM's names,
/// with `-tp`, the short form of `--tensor-parallel-size`).
pub const RESERVED_SERVER_FLAGS: [&str; 5] = [
    "--model",
    "--port",
    "--tensor-parallel-size",
    "-tp",
    "--gpu-memory-utilization",
];

/// The reserved flag an argument sets, as the server's parser reads it:
/// vLLM's `FlexibleArgumentParser` takes `_` for `-`
/// (`--gpu_memory_utilization`), argparse takes a unique prefix of a long
/// flag (`--gpu-memory-util`) and a short flag glued to its value
/// (`-tp8`). Any of these spellings is refused.
pub fn reserved_flag(arg: &str) -> Option<&'static str> {
    let flag = arg.split('=').next().unwrap_or_default().trim();
    if !flag.starts_with('-') {
        return None;
    }
    let flag = flag.replace('_', "-");
    RESERVED_SERVER_FLAGS.iter().copied().find(|&r| {
        if r.starts_with("--") {
            flag == r || (flag.len() > 2 && flag.starts_with("--") && r.starts_with(flag.as_str()))
        } else {
            !flag.starts_with("--") && flag.starts_with(r)
        }
    })
}

/// Labels of the model's pods (Kubernetes label syntax; not gpuscale's
/// own `gpuscale.io/…` keys, `app.kubernetes.io/managed-by` or
/// `hami.io/webhook`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkloadSelector {
    /// Label key → value, each set on every pod of the model.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// Numeric type of the weights.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// 4 bytes per parameter.
    Fp32,
    /// 2 bytes per parameter.
    #[default]
    Bf16,
    /// 2 bytes per parameter.
    Fp16,
    /// 1 byte per parameter.
    Fp8,
    /// 1 byte per parameter.
    Int8,
    /// Half a byte per parameter.
    Int4,
}

impl Dtype {
    /// Bytes per parameter.
    pub fn bytes(self) -> f64 {
        match self {
            Dtype::Fp32 => 4.0,
            Dtype::Bf16 | Dtype::Fp16 => 2.0,
            Dtype::Fp8 | Dtype::Int8 => 1.0,
            Dtype::Int4 => 0.5,
        }
    }
}

/// What one replica needs: memory (given, or from parameters), compute,
/// concurrency.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaResources {
    /// Total GPU memory of one replica, GiB. Give this, or `paramsB`.
    #[serde(default, rename = "memoryGiB", skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true, "maximum" = 1_048_576))]
    pub memory_gib: Option<f64>,
    /// Parameters, in billions; memory is then weights + KV cache + overhead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true, "maximum" = 100_000))]
    pub params_b: Option<f64>,
    /// Weight type (default bf16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    /// KV-cache budget, GiB (default 0).
    #[serde(
        default,
        rename = "kvCacheGiB",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 1_048_576))]
    pub kv_cache_gib: Option<f64>,
    /// Runtime overhead, GiB (default 2).
    #[serde(
        default,
        rename = "overheadGiB",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 1_048_576))]
    pub overhead_gib: Option<f64>,
    /// Compute at the target throughput, as a fraction of one H100-80GB.
    // OpenAPI 3.0, as the API server reads it: a boolean beside `minimum`.
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true, "maximum" = 1_000))]
    pub compute: f64,
    /// Requests one replica serves at once.
    #[schemars(range(min = 1, max = 65_536))]
    pub max_concurrency: u32,
    /// Prefill speed and prompt sizes: compute is raised to what
    /// prefills a 95th-percentile prompt within [`PREFILL_BUDGET`] of the
    /// `ttftP95` target, or of `latencyP95` for a model with no TTFT
    /// target (an embedding model, whose request is all prefill): a share
    /// too small for its prompts misses the target whatever the replica
    /// count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill: Option<PrefillSpec>,
}

/// A model's prefill, as its owner measures it (vLLM's
/// `benchmark_serving`, or the server's own prefill metrics).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrefillSpec {
    /// Prompt tokens per second one replica prefills on a whole
    /// H100-80GB (compute 1.0).
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
    pub tokens_per_second: f64,
    /// The 95th percentile of its prompts, tokens.
    #[schemars(range(min = 1))]
    pub prompt_tokens_p95: u32,
}

/// The part of the TTFT target a 95th-percentile prompt may take to
/// prefill on an idle replica; the rest is its wait for the prefills
/// ahead of it. With the autoscaler's prefill target of 0.7 and a mean
/// prompt about a quarter of the p95 (the Azure conversation trace:
/// 1,155 and 4,083 tokens), M/D/1's mean wait is about a third of the
/// p95 prompt's prefill, so that prompt's TTFT is about 1.33 × its
/// prefill: 0.75 of the target.
pub const PREFILL_BUDGET: f64 = 0.75;

impl PrefillSpec {
    /// The compute (fraction of an H100-80GB) that prefills the p95
    /// prompt within [`PREFILL_BUDGET`] of `ttft`.
    pub fn compute_for(&self, ttft: Duration) -> f64 {
        f64::from(self.prompt_tokens_p95)
            / (self.tokens_per_second * PREFILL_BUDGET * ttft.as_secs_f64().max(1e-9))
    }
}

impl ReplicaResources {
    /// Weights in GiB when given by parameters.
    pub fn weights_gib(&self) -> Option<f64> {
        self.params_b
            .map(|p| p * 1e9 * self.dtype.unwrap_or_default().bytes() / GIB)
    }

    /// Memory per replica in GiB: `memoryGiB`, or weights + KV + overhead.
    pub fn memory_gib(&self) -> Option<f64> {
        self.memory_gib.or_else(|| {
            self.weights_gib().map(|w| {
                w + self.kv_cache_gib.unwrap_or(0.0)
                    + self.overhead_gib.unwrap_or(DEFAULT_OVERHEAD_GIB)
            })
        })
    }
}

/// How a replica may use GPUs.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum SharingMode {
    /// A MIG slice (hardware isolation).
    Mig,
    /// A time-sliced share of a GPU (no memory isolation).
    Timeslice,
    /// One or more whole GPUs.
    Whole,
    /// One of `N` equal MPS partitions of a GPU (the device plugin's
    /// `sharing.mps`: memory and compute limits enforced per client).
    Mps,
    /// A fractional GPU under HAMi: any memory (`nvidia.com/gpumem`) and
    /// SM percentage (`nvidia.com/gpucores`), enforced by HAMi-core.
    Fractional,
    /// One of `N` time-sliced shares of a MIG slice (the device plugin's
    /// `sharing.timeSlicing` on a `nvidia.com/mig-<profile>` resource,
    /// mixed MIG strategy): the slice's hardware isolation from other
    /// slices, no memory isolation within it.
    #[serde(rename = "mig-timeslice")]
    MigTimeslice,
}

impl fmt::Display for SharingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SharingMode::Mig => "mig",
            SharingMode::Timeslice => "timeslice",
            SharingMode::Whole => "whole",
            SharingMode::Mps => "mps",
            SharingMode::Fractional => "fractional",
            SharingMode::MigTimeslice => "mig-timeslice",
        })
    }
}

fn all_modes() -> Vec<SharingMode> {
    vec![SharingMode::Mig, SharingMode::Timeslice, SharingMode::Whole]
}

fn tp_one() -> Vec<u32> {
    vec![1]
}

/// Where replicas may run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacementPolicy {
    /// Allowed sharing modes (default: `[mig, timeslice, whole]`; `mps`,
    /// `fractional` and `mig-timeslice` are opt-in).
    #[serde(default = "all_modes")]
    pub sharing: Vec<SharingMode>,
    /// Allowed GPU models by catalogue name (default: any).
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Allowed tensor-parallel degrees: a replica takes that many whole GPUs
    /// on one node (default `[1]`).
    #[serde(default = "tp_one")]
    #[schemars(length(min = 1), inner(range(min = 1, max = 16)))]
    pub tensor_parallel: Vec<u32>,
}

impl Default for PlacementPolicy {
    fn default() -> Self {
        PlacementPolicy {
            sharing: all_modes(),
            gpu_models: Vec::new(),
            tensor_parallel: tp_one(),
        }
    }
}

/// p95 targets; any may be left out.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SloTargets {
    /// p95 time to first token (streams).
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub ttft_p95: Option<Duration>,
    /// p95 end-to-end latency.
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub latency_p95: Option<Duration>,
    /// p95 time spent in the gateway's queue.
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub queue_wait_p95: Option<Duration>,
    /// Extra time the owner allows a request that arrives while the model
    /// has no replica serving (scaled to zero, or its first replica still
    /// starting): every target above is met by such a request when it is
    /// met with this added. For rarely used models that may go to zero.
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub cold_start_allowance: Option<Duration>,
}

/// Criticality: who is placed first and shed last.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Placed first, shed last.
    Critical,
    /// The default.
    #[default]
    Standard,
    /// Placed last, shed first.
    Sheddable,
}

fn one() -> u32 {
    1
}
fn ten() -> u32 {
    10
}
fn eight() -> f64 {
    8.0
}
fn five_minutes() -> Duration {
    Duration::from_secs(300)
}
fn one_minute() -> Duration {
    Duration::from_secs(60)
}

/// How the replica count follows demand (HPA/KEDA/Knative vocabulary).
///
/// The CRD's schema refuses what loading refuses where a schema can say
/// it (bounds, and `minReplicas ≤ maxReplicas` as a CEL rule, over the
/// defaulted object), so `kubectl apply` fails where the controller and
/// the gateway would.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.minReplicas <= self.maxReplicas",
    "message": "minReplicas is above maxReplicas",
}]))]
pub struct ScalingPolicy {
    /// Fewest replicas; 0 allows scale to zero (default 1).
    #[serde(default = "one")]
    #[schemars(range(max = 1_000_000))]
    pub min_replicas: u32,
    /// Most replicas (default 10).
    #[serde(default = "ten")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub max_replicas: u32,
    /// Requests (waiting + in flight) per replica to aim at (default 8).
    #[serde(default = "eight")]
    #[schemars(extend("minimum" = 0, "exclusiveMinimum" = true))]
    pub target_queue_depth: f64,
    /// Queue depth strictly above which a model at zero is activated
    /// (KEDA's activation threshold; default 0).
    #[serde(default)]
    pub activation_queue_depth: f64,
    /// Idle time before scaling to zero when `minReplicas` is 0 (default 5m).
    #[serde(default = "five_minutes", with = "crate::duration")]
    #[schemars(with = "String")]
    pub scale_to_zero_after: Duration,
    /// Time from starting a replica to it serving (default 1m); used to
    /// scale ahead of forecast demand.
    #[serde(default = "one_minute", with = "crate::duration")]
    #[schemars(with = "String")]
    pub startup_time: Duration,
    /// Rate limits and stabilisation (HPA `behavior`).
    #[serde(default)]
    pub behavior: Behavior,
}

impl Default for ScalingPolicy {
    fn default() -> Self {
        ScalingPolicy {
            min_replicas: one(),
            max_replicas: ten(),
            target_queue_depth: eight(),
            activation_queue_depth: 0.0,
            scale_to_zero_after: five_minutes(),
            startup_time: one_minute(),
            behavior: Behavior::default(),
        }
    }
}

/// HPA `behavior`: per direction, a stabilisation window and rate policies.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Behavior {
    /// Rules for scaling up (HPA defaults: window 0 s; 100 % or 4 pods per
    /// 15 s, the larger).
    #[serde(default)]
    pub scale_up: ScalingRules,
    /// Rules for scaling down (HPA defaults: window 300 s; 100 % per 15 s).
    #[serde(default)]
    pub scale_down: ScalingRules,
}

/// One direction's rules; anything left out takes HPA's default for that
/// direction.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScalingRules {
    /// Recommendations over this window are combined (max when scaling
    /// down, min when scaling up) before acting.
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub stabilization_window: Option<Duration>,
    /// How the policies combine (default Max).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<SelectPolicy>,
    /// Rate policies (empty: HPA's defaults for this direction).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<RatePolicy>,
}

/// HPA `selectPolicy`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SelectPolicy {
    /// The policy allowing the largest change.
    #[default]
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No scaling in this direction.
    Disabled,
}

/// HPA rate policy type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum RatePolicyType {
    /// At most `value` pods per period.
    Pods,
    /// At most `value` percent of the current replicas per period.
    Percent,
}

/// One HPA rate policy.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RatePolicy {
    /// Pods or Percent.
    #[serde(rename = "type")]
    pub kind: RatePolicyType,
    /// The limit per period.
    pub value: u32,
    /// The period.
    #[serde(with = "crate::duration")]
    #[schemars(with = "String")]
    pub period: Duration,
}

/// The last decision the autoscaler made, kept in the resource's status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// The replica count decided.
    pub replicas: u32,
    /// The sentence explaining it.
    pub reason: String,
    /// When (RFC 3339).
    pub time: String,
}

/// Status subresource of `ModelPolicy`, written by the autoscaler.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelPolicyStatus {
    /// Replicas serving now.
    #[serde(default)]
    pub current_replicas: u32,
    /// Replicas the autoscaler wants.
    #[serde(default)]
    pub desired_replicas: u32,
    /// The last decision and its reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_decision: Option<Decision>,
    /// The spec generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// What the autoscaler's stabilisation windows and rate limits
    /// remember, so that a restarted controller or a new leader goes on
    /// from where the last one stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaling_memory: Option<ScalingMemory>,
    /// Conditions, as Kubernetes writes them (`DeploymentsOwned`: `False`
    /// when a Deployment the plan names exists and gpuscale did not
    /// create it, so gpuscale leaves it alone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<PolicyCondition>,
}

/// One condition of a policy's status (the fields of Kubernetes'
/// `metav1.Condition` that gpuscale writes).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyCondition {
    /// The condition's type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Why, in one CamelCase word.
    pub reason: String,
    /// Why, in words.
    #[serde(default)]
    pub message: String,
    /// When the status last changed (RFC 3339).
    pub last_transition_time: String,
}

/// The autoscaler's memory of one model (HPA keeps the same in its
/// controller's process): the recommendations inside the longest
/// stabilisation window and the scale events inside the longest rate
/// period of each direction. Times are RFC 3339 with milliseconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingMemory {
    /// Recommendations, oldest first (a run of equal ones is kept as its
    /// last: the windows' min and max see no difference).
    #[serde(default)]
    pub recommendations: Vec<TimedReplicas>,
    /// Scale-ups, as HPA's `storeScaleEvent` keeps them.
    #[serde(default)]
    pub scale_up_events: Vec<RememberedScaleEvent>,
    /// Scale-downs, likewise.
    #[serde(default)]
    pub scale_down_events: Vec<RememberedScaleEvent>,
}

/// A recommendation and when it was made.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimedReplicas {
    /// When (RFC 3339).
    pub time: String,
    /// The count recommended.
    pub replicas: u32,
}

/// A scale event: replicas added or removed at a time.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RememberedScaleEvent {
    /// When (RFC 3339).
    pub time: String,
    /// Replicas added (scale-up) or removed (scale-down).
    pub change: u32,
    /// Aged past its direction's longest rate period.
    #[serde(default)]
    pub outdated: bool,
}

/// One direction's rules with every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedRules {
    /// Stabilisation window.
    pub stabilization_window: Duration,
    /// How policies combine.
    pub select_policy: SelectPolicy,
    /// The rate policies.
    pub policies: Vec<RatePolicy>,
}

impl ScalingRules {
    fn resolve(&self, up: bool) -> ResolvedRules {
        let period = Duration::from_secs(15);
        let default_policies = if up {
            vec![
                RatePolicy {
                    kind: RatePolicyType::Percent,
                    value: 100,
                    period,
                },
                RatePolicy {
                    kind: RatePolicyType::Pods,
                    value: 4,
                    period,
                },
            ]
        } else {
            vec![RatePolicy {
                kind: RatePolicyType::Percent,
                value: 100,
                period,
            }]
        };
        ResolvedRules {
            stabilization_window: self.stabilization_window.unwrap_or(if up {
                Duration::ZERO
            } else {
                Duration::from_secs(300)
            }),
            select_policy: self.select_policy.unwrap_or_default(),
            policies: if self.policies.is_empty() {
                default_policies
            } else {
                self.policies.clone()
            },
        }
    }
}

/// A validated model policy with defaults resolved: what the packer, the
/// gateway and the autoscaler use.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The policy's name (`metadata.name`).
    pub name: String,
    /// The policy's namespace, if any.
    pub namespace: Option<String>,
    /// The model name clients send.
    pub served_name: String,
    /// Memory per replica, GiB.
    pub memory_gib: f64,
    /// Compute per replica, fraction of one H100-80GB.
    pub compute: f64,
    /// Requests one replica serves at once.
    pub max_concurrency: u32,
    /// Allowed sharing modes.
    pub sharing: Vec<SharingMode>,
    /// Allowed GPU models (resolved: never empty).
    pub gpu_models: Vec<String>,
    /// Allowed tensor-parallel degrees, ascending.
    pub tensor_parallel: Vec<u32>,
    /// SLO targets.
    pub slo: SloTargets,
    /// Scaling settings as written.
    pub scaling: ScalingPolicy,
    /// Scale-up rules, defaults resolved.
    pub scale_up: ResolvedRules,
    /// Scale-down rules, defaults resolved.
    pub scale_down: ResolvedRules,
    /// Priority.
    pub priority: Priority,
    /// LoRA adapters served by its replicas.
    pub adapters: Vec<String>,
    /// More model-server arguments (`spec.serverArgs`).
    pub server_args: Vec<String>,
    /// Labels every pod of the model carries, beside gpuscale's own
    /// (`spec.selector.matchLabels`: what your Services and monitors
    /// select the model's pods by).
    pub pod_labels: BTreeMap<String, String>,
}

/// Most requests one replica may be given at once (`maxConcurrency`, in
/// a policy, a gateway file or a registration): far above any model
/// server's batch (vLLM's `--max-num-seqs` defaults to 256 to 1,024), and
/// low enough that a model's sum over its replicas stays inside a `u32`.
pub const MAX_CONCURRENCY: u32 = 65_536;

/// Most replicas one model may scale to (`scaling.maxReplicas`): a
/// million, far above any cluster's GPUs and MIG slices, and small enough
/// that every plan and baseline over them stays in memory.
pub const MAX_REPLICAS: u32 = 1_000_000;

/// Why a name clients send cannot be a model's, if it cannot: empty,
/// padded with white space or holding a control character (no JSON body
/// a client sends names it so, and a header cannot carry a newline),
/// longer than [`MAX_NAME_BYTES`]; and the gateway's KServe route
/// (`/v2/models/{name}/infer`) refuses paths a model server could read as
/// another (dot segments, `#`, `?`, `\`), so such a name would be
/// reachable on `/v1` and not there.
pub fn unroutable(name: &str) -> Option<&'static str> {
    if name.trim().is_empty() {
        Some("is empty")
    } else if name.trim() != name {
        Some("starts or ends with white space, which clients do not send")
    } else if name.chars().any(char::is_control) {
        Some("holds a control character (a newline, a tab), which no header or URL carries")
    } else if name.len() > MAX_NAME_BYTES {
        Some("is longer than 256 bytes")
    } else if name.contains(['#', '?', '\\']) {
        Some("holds `#`, `?` or `\\`, which a URL path cannot carry as they are")
    } else if name.split('/').any(|seg| seg == "." || seg == "..") {
        Some("has a `.` or `..` segment, which a URL path resolves away")
    } else {
        None
    }
}

/// The label gpuscale sets to a policy's name on the model's pods.
pub const NAME_LABEL: &str = "app.kubernetes.io/name";

/// The longest served name, adapter or model name a client may route by,
/// in bytes: Hugging Face repository ids are at most 96 characters.
pub const MAX_NAME_BYTES: usize = 256;

/// A name as an error message shows it: control characters escaped, and
/// cut to its first 64 characters.
pub fn shown(name: &str) -> String {
    let escaped: String = name.chars().flat_map(char::escape_debug).collect();
    match escaped.char_indices().nth(64) {
        Some((at, _)) => format!("{}…", &escaped[..at]),
        None => escaped,
    }
}

/// The prefix of gpuscale's own component names (`gpuscale-gateway`,
/// `gpuscale-controller`, `gpuscale-agent`): no ModelPolicy may take it,
/// since its pods and Services are labelled with the policy's name.
pub const RESERVED_PREFIX: &str = "gpuscale-";

/// Whether a ModelPolicy name is one gpuscale keeps for itself.
pub fn is_reserved(name: &str) -> bool {
    name == "gpuscale" || name.starts_with(RESERVED_PREFIX)
}

/// One way a replica could be placed, statically.
#[derive(Debug, Clone, PartialEq)]
pub enum PlacementOption {
    /// A MIG instance of a profile.
    Mig {
        /// GPU model.
        gpu: String,
        /// Profile name.
        profile: String,
    },
    /// A time-sliced share of one GPU.
    Timeslice {
        /// GPU model.
        gpu: String,
    },
    /// A time-sliced share of a MIG instance of a profile.
    MigTimeslice {
        /// GPU model.
        gpu: String,
        /// Profile name.
        profile: String,
    },
    /// An MPS partition of one GPU.
    Mps {
        /// GPU model.
        gpu: String,
    },
    /// Fractional (HAMi) shares of `gpus` GPUs on one node (one share
    /// of each; `gpus` > 1 is tensor parallelism).
    Fractional {
        /// GPU model.
        gpu: String,
        /// Tensor-parallel degree.
        gpus: u32,
    },
    /// `gpus` whole GPUs on one node.
    Whole {
        /// GPU model.
        gpu: String,
        /// Tensor-parallel degree.
        gpus: u32,
    },
}

impl PlacementOption {
    /// The GPU model it is on.
    pub fn gpu(&self) -> &str {
        match self {
            PlacementOption::Mig { gpu, .. }
            | PlacementOption::MigTimeslice { gpu, .. }
            | PlacementOption::Timeslice { gpu }
            | PlacementOption::Mps { gpu }
            | PlacementOption::Fractional { gpu, .. }
            | PlacementOption::Whole { gpu, .. } => gpu,
        }
    }

    /// The sharing mode it uses (a node must allow it, `whole` aside).
    pub fn mode(&self) -> SharingMode {
        match self {
            PlacementOption::Mig { .. } => SharingMode::Mig,
            PlacementOption::MigTimeslice { .. } => SharingMode::MigTimeslice,
            PlacementOption::Timeslice { .. } => SharingMode::Timeslice,
            PlacementOption::Mps { .. } => SharingMode::Mps,
            PlacementOption::Fractional { .. } => SharingMode::Fractional,
            PlacementOption::Whole { .. } => SharingMode::Whole,
        }
    }

    /// In a model owner's words: "a H100-80GB 1g.10gb slice".
    pub fn describe(&self) -> String {
        match self {
            PlacementOption::Mig { gpu, profile } => format!("a {gpu} {profile} slice"),
            PlacementOption::MigTimeslice { gpu, profile } => {
                format!("a time-sliced {gpu} {profile} slice")
            }
            PlacementOption::Timeslice { gpu } => format!("a time-sliced {gpu}"),
            PlacementOption::Mps { gpu } => format!("an MPS share of a {gpu}"),
            PlacementOption::Fractional { gpu, gpus: 1 } => format!("a fractional (HAMi) {gpu}"),
            PlacementOption::Fractional { gpu, gpus } => {
                format!("fractional (HAMi) shares of {gpus}×{gpu} on one node")
            }
            PlacementOption::Whole { gpu, gpus: 1 } => format!("a whole {gpu}"),
            PlacementOption::Whole { gpu, gpus } => format!("{gpus}×{gpu} on one node"),
        }
    }
}

/// The most memory a replica may state, GiB (1 PiB: 64 GPUs of 192 GB
/// are 12 TiB).
pub const MAX_GIB: f64 = 1_048_576.0;

/// The most parameters a model may state, billions (100 trillion).
pub const MAX_PARAMS_B: f64 = 100_000.0;

/// The most compute a replica may state, in H100-80GBs.
pub const MAX_COMPUTE: f64 = 1_000.0;

impl Model {
    /// The names clients reach this model by at the gateway, each with
    /// the field that gives it: the served name and every LoRA adapter.
    /// No two policies may share one: the gateway routes by name, so the
    /// second policy's replicas would take the first one's requests.
    pub fn served_names(&self) -> Vec<(String, &str)> {
        std::iter::once(("spec.servedName".to_string(), self.served_name.as_str()))
            .chain(
                self.adapters
                    .iter()
                    .enumerate()
                    .map(|(i, a)| (format!("spec.adapters[{i}]"), a.as_str())),
            )
            .collect()
    }

    /// Validates a policy against the catalogue. Every problem is reported,
    /// each with the field path it concerns (relative to the document).
    pub fn from_policy(policy: &ModelPolicy, catalog: &Catalog) -> Result<Model, Vec<FieldError>> {
        let spec = &policy.spec;
        let r = &spec.resources;
        let mut errors = Vec::new();
        let mut err = |path: &str, message: String| {
            errors.push(FieldError {
                path: path.to_string(),
                message,
            })
        };
        let name = policy.metadata.name.clone().unwrap_or_default();
        if is_reserved(&name) {
            err(
                "metadata.name",
                format!(
                    "`{name}`: names starting `{RESERVED_PREFIX}` are reserved for gpuscale's own components; a policy's pods carry app.kubernetes.io/name: <policy>, and the gateway's Service and the network policies select gpuscale-gateway, gpuscale-controller and gpuscale-agent by that label"
                ),
            );
        }

        match (r.memory_gib, r.params_b) {
            (Some(_), Some(_)) => err(
                "spec.resources.memoryGiB",
                "give either memoryGiB or paramsB (with dtype, kvCacheGiB, overheadGiB), not both"
                    .into(),
            ),
            (None, None) => err(
                "spec.resources",
                "missing memory: give memoryGiB, or paramsB (with dtype, kvCacheGiB, overheadGiB)"
                    .into(),
            ),
            (Some(m), None) if !(m > 0.0 && m.is_finite()) => {
                err("spec.resources.memoryGiB", format!("must be > 0, got {m}"))
            }
            (None, Some(p)) if !(p > 0.0 && p.is_finite()) => {
                err("spec.resources.paramsB", format!("must be > 0, got {p}"))
            }
            _ => {}
        }
        if r.memory_gib.is_some() {
            for (field, set) in [
                ("dtype", r.dtype.is_some()),
                ("kvCacheGiB", r.kv_cache_gib.is_some()),
                ("overheadGiB", r.overhead_gib.is_some()),
            ] {
                if set {
                    err(
                        &format!("spec.resources.{field}"),
                        format!(
                            "{field} only applies with paramsB; memoryGiB is the total already"
                        ),
                    );
                }
            }
        }
        for (field, v) in [
            ("kvCacheGiB", r.kv_cache_gib),
            ("overheadGiB", r.overhead_gib),
        ] {
            if let Some(v) = v
                && !(v >= 0.0 && v.is_finite())
            {
                err(
                    &format!("spec.resources.{field}"),
                    format!("must be >= 0, got {v}"),
                );
            }
        }
        // Beyond any model or GPU there is: a typo (an exponent, a unit
        // in bytes), told as such rather than carried into plans and
        // messages as 300-digit figures.
        for (field, v, max, what) in [
            ("memoryGiB", r.memory_gib, MAX_GIB, "GiB (1 PiB)"),
            ("kvCacheGiB", r.kv_cache_gib, MAX_GIB, "GiB (1 PiB)"),
            ("overheadGiB", r.overhead_gib, MAX_GIB, "GiB (1 PiB)"),
            (
                "paramsB",
                r.params_b,
                MAX_PARAMS_B,
                "billion parameters (100 trillion)",
            ),
            (
                "compute",
                Some(r.compute),
                MAX_COMPUTE,
                "H100s of compute per replica",
            ),
        ] {
            if let Some(v) = v
                && v.is_finite()
                && v > max
            {
                err(
                    &format!("spec.resources.{field}"),
                    format!("{v:e} is beyond {max} {what}; check the unit"),
                );
            }
        }
        if !(r.compute > 0.0 && r.compute.is_finite()) {
            err(
                "spec.resources.compute",
                format!(
                    "must be > 0 (a fraction of one H100-80GB), got {}",
                    r.compute
                ),
            );
        }
        if !(1..=MAX_CONCURRENCY).contains(&r.max_concurrency) {
            err(
                "spec.resources.maxConcurrency",
                format!("must be 1 to {MAX_CONCURRENCY}, got {}", r.max_concurrency),
            );
        }
        if let Some(pf) = &r.prefill {
            if !(pf.tokens_per_second > 0.0 && pf.tokens_per_second.is_finite()) {
                err(
                    "spec.resources.prefill.tokensPerSecond",
                    format!("must be > 0, got {}", pf.tokens_per_second),
                );
            }
            if pf.prompt_tokens_p95 == 0 {
                err(
                    "spec.resources.prefill.promptTokensP95",
                    "must be at least 1".into(),
                );
            }
        }

        let p = &spec.placement;
        if p.sharing.is_empty() {
            err(
                "spec.placement.sharing",
                "allow at least one of mig, timeslice, whole, mps, fractional, mig-timeslice"
                    .into(),
            );
        }
        let mut gpu_models = Vec::new();
        for (i, g) in p.gpu_models.iter().enumerate() {
            match catalog.get(g) {
                Some(m) => gpu_models.push(m.name.clone()),
                None => err(
                    &format!("spec.placement.gpuModels[{i}]"),
                    format!(
                        "unknown GPU model `{g}`; the catalogue has: {}",
                        catalog.names().join(", ")
                    ),
                ),
            }
        }
        if p.gpu_models.is_empty() {
            gpu_models = catalog.names().into_iter().map(str::to_string).collect();
        }
        let mut tensor_parallel = p.tensor_parallel.clone();
        tensor_parallel.sort_unstable();
        tensor_parallel.dedup();
        if tensor_parallel.is_empty() {
            err(
                "spec.placement.tensorParallel",
                "give at least one degree (1 for a single GPU)".into(),
            );
        }
        for (i, &k) in p.tensor_parallel.iter().enumerate() {
            if k == 0 || k > 16 {
                err(
                    &format!("spec.placement.tensorParallel[{i}]"),
                    format!("must be between 1 and 16, got {k}"),
                );
            }
        }
        if tensor_parallel.iter().any(|&k| k > 1)
            && !p.sharing.contains(&SharingMode::Whole)
            && !p.sharing.contains(&SharingMode::Fractional)
        {
            err(
                "spec.placement.tensorParallel",
                "tensor parallelism > 1 takes whole GPUs or fractional (HAMi) shares of several: add `whole` or `fractional` to sharing".into(),
            );
        }

        // A zero target can never be met: every request would miss it.
        for (field, target) in [
            ("ttftP95", spec.slo.ttft_p95),
            ("latencyP95", spec.slo.latency_p95),
            ("queueWaitP95", spec.slo.queue_wait_p95),
        ] {
            if target.is_some_and(|t| t.is_zero()) {
                err(
                    &format!("spec.slo.{field}"),
                    "must be more than 0 (leave it out for no target)".into(),
                );
            }
        }

        let s = &spec.scaling;
        // Beyond any real cold start or idle period: such a value is a
        // typo, and a clock it is added to overflows.
        for (field, value, most, limit) in [
            (
                "startupTime",
                s.startup_time,
                Duration::from_secs(24 * 3600),
                "24h",
            ),
            (
                "scaleToZeroAfter",
                s.scale_to_zero_after,
                Duration::from_secs(30 * 24 * 3600),
                "30d",
            ),
        ] {
            if value > most {
                err(
                    &format!("spec.scaling.{field}"),
                    format!(
                        "must be at most {limit}, got {}",
                        crate::duration::show(value)
                    ),
                );
            }
        }
        if s.max_replicas == 0 {
            err("spec.scaling.maxReplicas", "must be at least 1".into());
        }
        if s.max_replicas > MAX_REPLICAS {
            err(
                "spec.scaling.maxReplicas",
                format!(
                    "must be at most {MAX_REPLICAS} (more replicas than any cluster holds), got {}",
                    s.max_replicas
                ),
            );
        }
        if s.min_replicas > s.max_replicas {
            err(
                "spec.scaling.minReplicas",
                format!(
                    "minReplicas ({}) is above maxReplicas ({})",
                    s.min_replicas, s.max_replicas
                ),
            );
        }
        if !(s.target_queue_depth > 0.0 && s.target_queue_depth.is_finite()) {
            err(
                "spec.scaling.targetQueueDepth",
                format!("must be > 0, got {}", s.target_queue_depth),
            );
        }
        if !(s.activation_queue_depth >= 0.0 && s.activation_queue_depth.is_finite()) {
            err(
                "spec.scaling.activationQueueDepth",
                format!("must be >= 0, got {}", s.activation_queue_depth),
            );
        }
        for (dir, rules) in [
            ("scaleUp", &s.behavior.scale_up),
            ("scaleDown", &s.behavior.scale_down),
        ] {
            for (i, rp) in rules.policies.iter().enumerate() {
                let path = format!("spec.scaling.behavior.{dir}.policies[{i}]");
                if rp.value == 0 {
                    err(&format!("{path}.value"), "must be at least 1".into());
                }
                if rp.period.is_zero() || rp.period > Duration::from_secs(1800) {
                    err(
                        &format!("{path}.period"),
                        "must be between 1s and 30m (HPA's limits)".into(),
                    );
                }
            }
            if let Some(w) = rules.stabilization_window
                && w > Duration::from_secs(3600)
            {
                err(
                    &format!("spec.scaling.behavior.{dir}.stabilizationWindow"),
                    "must be at most 1h (HPA's limit)".into(),
                );
            }
        }

        // The selector's labels go on every pod gpuscale runs for the
        // model (a Service or a monitor of yours selects them): the API
        // server's label rules, and none of gpuscale's own keys.
        for (k, v) in &spec.selector.match_labels {
            let path = format!("spec.selector.matchLabels.{}", crate::model::shown(k));
            if let Some(why) = crate::labels::key_problem(k) {
                err(&path, format!("the key {why}"));
            } else if let Some(why) = crate::labels::reserved(k) {
                err(&path, format!("is kept by gpuscale: {why}"));
            } else if let Some(why) = crate::labels::value_problem(v) {
                err(&path, why);
            } else if k == NAME_LABEL && *v != name {
                // gpuscale's Services, network policies and disruption
                // budgets select its own pods by this label (policy names
                // starting `gpuscale-` are refused for that reason).
                err(
                    &path,
                    format!(
                        "must be the policy's name, `{name}`: gpuscale labels the model's pods so, and selects its own components' pods by this label"
                    ),
                );
            }
        }
        let served = spec.served_name.as_deref().unwrap_or(&name);
        if let Some(why) = unroutable(served) {
            err("spec.servedName", format!("`{}` {why}", shown(served)));
        }
        for (i, a) in spec.adapters.iter().enumerate() {
            let problem = if a.trim().is_empty() {
                Some("must not be empty".to_string())
            } else if let Some(why) = unroutable(a) {
                Some(format!("`{}` {why}", shown(a)))
            } else if spec.adapters[..i].contains(a) {
                Some(format!("`{a}` is listed twice"))
            } else if a == served {
                Some(format!("`{a}` is the model's own served name"))
            } else {
                None
            };
            if let Some(message) = problem {
                err(&format!("spec.adapters[{i}]"), message);
            }
        }
        for (i, a) in spec.server_args.iter().enumerate() {
            if a.trim().is_empty() {
                err(&format!("spec.serverArgs[{i}]"), "must not be empty".into());
            } else if let Some(r) = reserved_flag(a) {
                let flag = a.split('=').next().unwrap_or_default();
                err(
                    &format!("spec.serverArgs[{i}]"),
                    if flag == r {
                        format!("`{flag}` is set by gpuscale (from the policy and the plan)")
                    } else {
                        format!(
                            "`{flag}` is how the server reads `{r}`, which gpuscale sets (from the policy and the plan)"
                        )
                    },
                );
            }
        }
        let memory_gib = r.memory_gib().unwrap_or(0.0);
        let mut model = Model {
            served_name: spec.served_name.clone().unwrap_or_else(|| name.clone()),
            name,
            namespace: policy.metadata.namespace.clone(),
            memory_gib,
            compute: match (&r.prefill, spec.slo.ttft_p95.or(spec.slo.latency_p95)) {
                (Some(pf), Some(target)) if pf.tokens_per_second > 0.0 => {
                    r.compute.max(pf.compute_for(target))
                }
                _ => r.compute,
            },
            max_concurrency: r.max_concurrency,
            sharing: p.sharing.clone(),
            gpu_models,
            tensor_parallel,
            slo: spec.slo.clone(),
            scaling: s.clone(),
            scale_up: s.behavior.scale_up.resolve(true),
            scale_down: s.behavior.scale_down.resolve(false),
            priority: spec.priority,
            adapters: spec.adapters.clone(),
            server_args: spec.server_args.clone(),
            pod_labels: spec.selector.match_labels.clone(),
        };
        model.sharing.sort_unstable();
        model.sharing.dedup();

        if errors.is_empty() && model.options(catalog).is_empty() {
            errors.push(FieldError {
                path: "spec.resources".into(),
                message: model.infeasibility(catalog),
            });
        }
        if errors.is_empty() {
            Ok(model)
        } else {
            Err(errors)
        }
    }

    /// Whether `k` devices of this memory and compute cover one replica.
    fn fits(&self, memory_gib: f64, compute: f64, k: u32) -> bool {
        f64::from(k) * memory_gib + 1e-9 >= self.memory_gib
            && f64::from(k) * compute + 1e-9 >= self.compute
    }

    /// Every static placement option: (GPU model, mode, profile or degree)
    /// whose memory and compute cover one replica. Node sizes are not
    /// considered here (the cluster check does that).
    pub fn options(&self, catalog: &Catalog) -> Vec<PlacementOption> {
        let mut out = Vec::new();
        for gpu in self.gpu_models.iter().filter_map(|g| catalog.get(g)) {
            let single = self.tensor_parallel.contains(&1);
            if single && let Some(mig) = &gpu.mig {
                for prof in &mig.profiles {
                    let compute = prof.compute(gpu.compute);
                    if prof.media_extensions || !self.fits(prof.usable_gib, compute, 1) {
                        continue;
                    }
                    if self.sharing.contains(&SharingMode::Mig) {
                        out.push(PlacementOption::Mig {
                            gpu: gpu.name.clone(),
                            profile: prof.name.clone(),
                        });
                    }
                    if self.sharing.contains(&SharingMode::MigTimeslice) {
                        out.push(PlacementOption::MigTimeslice {
                            gpu: gpu.name.clone(),
                            profile: prof.name.clone(),
                        });
                    }
                }
            }
            if single
                && self.sharing.contains(&SharingMode::Timeslice)
                && self.fits(gpu.usable_gib, gpu.compute, 1)
            {
                out.push(PlacementOption::Timeslice {
                    gpu: gpu.name.clone(),
                });
            }
            if single
                && self.sharing.contains(&SharingMode::Mps)
                && self.fits(gpu.usable_gib, gpu.compute, 1)
            {
                out.push(PlacementOption::Mps {
                    gpu: gpu.name.clone(),
                });
            }
            if self.sharing.contains(&SharingMode::Fractional) {
                for &k in &self.tensor_parallel {
                    if self.fits(gpu.usable_gib, gpu.compute, k) {
                        out.push(PlacementOption::Fractional {
                            gpu: gpu.name.clone(),
                            gpus: k,
                        });
                    }
                }
            }
            if self.sharing.contains(&SharingMode::Whole) {
                for &k in &self.tensor_parallel {
                    if self.fits(gpu.usable_gib, gpu.compute, k) {
                        out.push(PlacementOption::Whole {
                            gpu: gpu.name.clone(),
                            gpus: k,
                        });
                    }
                }
            }
        }
        out
    }

    /// Why no option fits, in a model owner's words.
    fn infeasibility(&self, catalog: &Catalog) -> String {
        let tp: Vec<String> = self.tensor_parallel.iter().map(u32::to_string).collect();
        let sharing: Vec<String> = self.sharing.iter().map(|m| m.to_string()).collect();
        let best: Vec<String> = self
            .gpu_models
            .iter()
            .filter_map(|g| catalog.get(g))
            .map(|g| {
                let k = if self.sharing.contains(&SharingMode::Whole) {
                    self.tensor_parallel.iter().copied().max().unwrap_or(1)
                } else {
                    1
                };
                format!(
                    "{}×{} gives {:.2} GiB and {:.2} compute",
                    k,
                    g.name,
                    f64::from(k) * g.usable_gib,
                    f64::from(k) * g.compute
                )
            })
            .collect();
        format!(
            "needs {:.2} GiB and {:.2} H100s of compute per replica, and no allowed option fits \
             (sharing: [{}], tensor parallel: [{}]); largest per GPU model: {}",
            self.memory_gib,
            self.compute,
            sharing.join(", "),
            tp.join(", "),
            best.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(resources: ReplicaResources, placement: PlacementPolicy) -> ModelPolicy {
        let mut p = ModelPolicy::new(
            "m",
            ModelPolicySpec {
                served_name: None,
                selector: WorkloadSelector::default(),
                resources,
                placement,
                slo: SloTargets::default(),
                scaling: ScalingPolicy::default(),
                priority: Priority::Standard,
                adapters: Vec::new(),
                server_args: Vec::new(),
            },
        );
        p.metadata.namespace = Some("ns".into());
        p
    }

    fn res(memory: f64, compute: f64) -> ReplicaResources {
        ReplicaResources {
            memory_gib: Some(memory),
            params_b: None,
            dtype: None,
            kv_cache_gib: None,
            overhead_gib: None,
            compute,
            max_concurrency: 8,
            prefill: None,
        }
    }

    #[test]
    fn memory_from_parameters() {
        let r = ReplicaResources {
            memory_gib: None,
            params_b: Some(8.03),
            dtype: Some(Dtype::Bf16),
            kv_cache_gib: Some(4.0),
            overhead_gib: None,
            compute: 0.2,
            max_concurrency: 8,
            prefill: None,
        };
        let w = 8.03e9 * 2.0 / GIB;
        assert!((r.memory_gib().unwrap() - (w + 4.0 + 2.0)).abs() < 1e-9);
        assert!((w - 14.957).abs() < 1e-3);
    }

    #[test]
    fn hpa_defaults_are_resolved() {
        let m = Model::from_policy(
            &policy(res(10.0, 0.1), PlacementPolicy::default()),
            &Catalog::builtin(),
        )
        .unwrap();
        assert_eq!(m.scale_down.stabilization_window, Duration::from_secs(300));
        assert_eq!(m.scale_up.stabilization_window, Duration::ZERO);
        assert_eq!(m.scale_up.policies.len(), 2);
        assert_eq!(m.scale_up.select_policy, SelectPolicy::Max);
        assert_eq!(m.served_name, "m");
        assert_eq!(m.gpu_models.len(), Catalog::builtin().names().len());
    }

    /// The MIG profiles a model may take, in the order it lists them.
    fn mig_profiles(m: &Model, c: &Catalog) -> Vec<String> {
        m.options(c)
            .into_iter()
            .map(|o| match o {
                PlacementOption::Mig { profile, .. } => profile,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn small_models_fit_mig_slices_and_big_ones_need_tensor_parallel() {
        let c = Catalog::builtin();
        let placement = PlacementPolicy {
            sharing: vec![SharingMode::Mig],
            gpu_models: vec!["H100-80GB".into()],
            tensor_parallel: vec![1],
        };
        let m = Model::from_policy(&policy(res(19.0, 0.2), placement), &c).unwrap();
        let profiles = mig_profiles(&m, &c);
        // 1g.20gb has the memory but 26 of the H100's 132 SMs
        // (`nvidia-smi mig -lgip`): 0.197 < 0.2.
        assert_eq!(profiles, ["2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]);

        let whole = PlacementPolicy {
            sharing: vec![SharingMode::Whole],
            gpu_models: vec!["H100-80GB".into()],
            tensor_parallel: vec![1],
        };
        let errors = Model::from_policy(&policy(res(150.0, 1.0), whole.clone()), &c).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].path, "spec.resources");
        assert!(
            errors[0].message.contains("needs 150.00 GiB"),
            "{}",
            errors[0].message
        );
        let tp2 = PlacementPolicy {
            tensor_parallel: vec![2],
            ..whole
        };
        let m = Model::from_policy(&policy(res(150.0, 1.0), tp2), &c).unwrap();
        assert_eq!(
            m.options(&c),
            [PlacementOption::Whole {
                gpu: "H100-80GB".into(),
                gpus: 2
            }]
        );
    }

    #[test]
    fn a_declared_prefill_raises_compute_to_meet_the_ttft_target() {
        let c = Catalog::builtin();
        let mig = PlacementPolicy {
            sharing: vec![SharingMode::Mig],
            gpu_models: vec!["H100-80GB".into()],
            tensor_parallel: vec![1],
        };
        let mut p = policy(res(19.0, 0.2), mig);
        // 4,083-token prompts at 30,000 tokens/s on an H100 in 0.75 of
        // 400 ms: 4083 / (30000 × 0.3) = 0.4537 of an H100, by hand.
        p.spec.resources.prefill = Some(PrefillSpec {
            tokens_per_second: 30_000.0,
            prompt_tokens_p95: 4083,
        });
        // Without a TTFT or latency target it is the declared 0.2.
        p.spec.slo.ttft_p95 = None;
        p.spec.slo.latency_p95 = None;
        let m = Model::from_policy(&p, &c).unwrap();
        assert_eq!(m.compute, 0.2);
        // With a latency target only (an embedding model: the request is
        // its prefill), against that: 4083 / (30000 × 0.75 × 2) = 0.0907,
        // under the declared 0.2; at 500 ms, 0.3629.
        p.spec.slo.latency_p95 = Some(Duration::from_secs(2));
        assert_eq!(Model::from_policy(&p, &c).unwrap().compute, 0.2);
        p.spec.slo.latency_p95 = Some(Duration::from_millis(500));
        let m = Model::from_policy(&p, &c).unwrap();
        assert!((m.compute - 0.362_933).abs() < 1e-5, "{}", m.compute);
        // A TTFT target, when there is one, is the one that counts.
        p.spec.slo.latency_p95 = Some(Duration::from_secs(20));
        p.spec.slo.ttft_p95 = Some(Duration::from_millis(400));
        let m = Model::from_policy(&p, &c).unwrap();
        assert!((m.compute - 0.453_666).abs() < 1e-5, "{}", m.compute);
        // 2g.20gb's 32 of 132 SMs are not enough any more; 3g.40gb's 60
        // (0.4545, not 3/7 = 0.43) just are.
        let profiles = mig_profiles(&m, &c);
        assert_eq!(profiles, ["3g.40gb", "4g.40gb", "7g.80gb"]);
        // At 399 ms it needs a hair more (0.4548) and the 3g is out too.
        p.spec.slo.ttft_p95 = Some(Duration::from_millis(399));
        let m = Model::from_policy(&p, &c).unwrap();
        assert!(m.compute > 60.0 / 132.0, "{}", m.compute);
        assert_eq!(mig_profiles(&m, &c), ["4g.40gb", "7g.80gb"]);
        p.spec.slo.ttft_p95 = Some(Duration::from_millis(400));
        // A declared compute above it stays.
        p.spec.resources.compute = 0.6;
        assert_eq!(Model::from_policy(&p, &c).unwrap().compute, 0.6);
        // Bad figures are located.
        p.spec.resources.prefill = Some(PrefillSpec {
            tokens_per_second: 0.0,
            prompt_tokens_p95: 0,
        });
        let errors = Model::from_policy(&p, &c).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.resources.prefill.tokensPerSecond",
                "spec.resources.prefill.promptTokensP95"
            ]
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut p = policy(
            res(-1.0, 0.0),
            PlacementPolicy {
                sharing: vec![],
                gpu_models: vec!["H900".into()],
                tensor_parallel: vec![0],
            },
        );
        p.spec.scaling.min_replicas = 5;
        p.spec.scaling.max_replicas = 2;
        p.spec.resources.max_concurrency = 0;
        let errors = Model::from_policy(&p, &Catalog::builtin()).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        for want in [
            "spec.resources.memoryGiB",
            "spec.resources.compute",
            "spec.resources.maxConcurrency",
            "spec.placement.sharing",
            "spec.placement.gpuModels[0]",
            "spec.placement.tensorParallel[0]",
            "spec.scaling.minReplicas",
        ] {
            assert!(paths.contains(&want), "{want} missing from {paths:?}");
        }
    }
}
