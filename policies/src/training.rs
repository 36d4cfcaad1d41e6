//! Training job specs (`kind: TrainingJob`): gangs of workers that the
//! packer places all or nothing, topology-aware.

use std::fmt;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::PodTemplateSpec;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::FieldError;
use crate::catalog::Catalog;
use crate::model::Priority;

/// How close the workers of a gang must be.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyLevel {
    /// All GPUs on one node.
    Node,
    /// All nodes in one NVLink domain (e.g. an NVL72 rack).
    NvlinkDomain,
    /// All nodes in one rack.
    Rack,
    /// All nodes in one zone.
    Zone,
    /// Anywhere.
    #[default]
    Any,
}

impl fmt::Display for TopologyLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TopologyLevel::Node => "node",
            TopologyLevel::NvlinkDomain => "nvlink-domain",
            TopologyLevel::Rack => "rack",
            TopologyLevel::Zone => "zone",
            TopologyLevel::Any => "any",
        })
    }
}

/// Whether a topology level must hold or is only preferred.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TopologyMode {
    /// The job waits rather than spread wider.
    #[default]
    Required,
    /// Spread wider when the level cannot hold.
    Preferred,
}

/// The topology requirement of a gang.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// The level all workers must share.
    #[serde(default)]
    pub level: TopologyLevel,
    /// Required or preferred.
    #[serde(default)]
    pub mode: TopologyMode,
}

/// A training job as written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingJobSpec {
    /// Number of workers (processes), each on one node.
    pub workers: u32,
    /// Whole GPUs each worker takes on its node.
    pub gpus_per_worker: u32,
    /// Allowed GPU models (default: any); all workers use one model.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// How close the workers must be.
    #[serde(default)]
    pub topology: Topology,
    /// Priority against other jobs and models.
    #[serde(default)]
    pub priority: Priority,
    /// Whether higher-priority work may preempt it.
    #[serde(default)]
    pub preemptible: bool,
    /// Expected runtime, if known.
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub estimated_runtime: Option<Duration>,
    /// How often the job checkpoints, if it does: a preemption loses at
    /// most this much of its work.
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub checkpoint_interval: Option<Duration>,
    /// The partition it runs in (default: the queue's default partition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    /// The team (fair-share account) it is charged to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// When it was submitted (RFC 3339; in Kubernetes, the object's
    /// `creationTimestamp`): its age raises its priority.
    #[serde(
        default,
        with = "crate::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub submitted_at: Option<SystemTime>,
    /// When its workers started, if it runs (RFC 3339): with its runtime,
    /// when its GPUs free up.
    #[serde(
        default,
        with = "crate::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub started_at: Option<SystemTime>,
    /// The worker pods' template (a Kubernetes `PodTemplateSpec`: image,
    /// command, environment, volumes). With it, `plan --emit` writes one
    /// complete `Pod` per placed worker; without it, one `PodTemplate`
    /// holding the placement, to merge into the job's own template. The
    /// placement (GPU limit, node affinity, scheduler, gang labels) is
    /// added to it; the template must not set a node or a GPU count of
    /// its own that disagrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<serde_json::Value>")]
    pub template: Option<Box<PodTemplateSpec>>,
}

/// A template's `nodeSelector` and required node affinity as the API
/// server validates them (`ValidateNodeSelector`,
/// `ValidateNodeSelectorRequirement`, `ValidateNodeFieldSelectorRequirement`):
/// at least one term, no empty term (it matches no node), an operator it
/// knows with the values it takes, label keys and values, and fields only
/// `metadata.name` with `In`/`NotIn` and one value.
fn check_node_rules(spec: &k8s_openapi::api::core::v1::PodSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (k, v) in spec.node_selector.iter().flatten() {
        let path = format!("spec.template.spec.nodeSelector.{}", crate::model::shown(k));
        if let Some(why) = crate::labels::key_problem(k) {
            errors.push(FieldError::new(path, format!("the key {why}")));
        } else if let Some(why) = crate::labels::value_problem(v) {
            errors.push(FieldError::new(path, why));
        }
    }
    let Some(required) = required_node_affinity(spec) else {
        return errors;
    };
    let base = "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
    if required.node_selector_terms.is_empty() {
        errors.push(FieldError::new(
            base,
            "needs at least one term (the API server's rule)",
        ));
    }
    for (i, term) in required.node_selector_terms.iter().enumerate() {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            errors.push(FieldError::new(
                format!("{base}[{i}]"),
                "an empty term matches no node (Kubernetes' NodeSelectorTerm); leave it out",
            ));
        }
        for (j, e) in exprs.iter().enumerate() {
            let path = format!("{base}[{i}].matchExpressions[{j}]");
            let values = e.values.as_deref().unwrap_or_default();
            if let Some(why) = crate::labels::key_problem(&e.key) {
                errors.push(FieldError::new(
                    format!("{path}.key"),
                    format!("the key {why}"),
                ));
            }
            let problem = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => Some("`In` and `NotIn` need values"),
                "In" | "NotIn" => values
                    .iter()
                    .any(|v| crate::labels::value_problem(v).is_some())
                    .then_some("every value must be a label value"),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    Some("`Exists` and `DoesNotExist` take no values")
                }
                "Exists" | "DoesNotExist" => None,
                "Gt" | "Lt" => (values.len() != 1 || values[0].parse::<i64>().is_err())
                    .then_some("`Gt` and `Lt` take one value, an integer"),
                _ => Some("the operator is one of In, NotIn, Exists, DoesNotExist, Gt, Lt"),
            };
            if let Some(why) = problem {
                errors.push(FieldError::new(format!("{path}.operator"), why));
            }
        }
        for (j, f) in fields.iter().enumerate() {
            let path = format!("{base}[{i}].matchFields[{j}]");
            if f.key != "metadata.name" {
                errors.push(FieldError::new(
                    format!("{path}.key"),
                    "a node field selector reads `metadata.name` only",
                ));
            } else if !matches!(f.operator.as_str(), "In" | "NotIn")
                || f.values.as_ref().is_none_or(|v| v.len() != 1)
            {
                errors.push(FieldError::new(
                    format!("{path}.operator"),
                    "a node field selector is `In` or `NotIn` with one value",
                ));
            }
        }
    }
    errors
}

/// A pod spec's required node affinity, if it has one.
fn required_node_affinity(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Option<&k8s_openapi::api::core::v1::NodeSelector> {
    spec.affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()
}

/// Pod label and annotation keys the placement sets on every worker.
const PLACEMENT_KEYS: [&str; 8] = [
    "kueue.x-k8s.io/role-hash",
    "scheduling.x-k8s.io/pod-group",
    "scheduling.k8s.io/group-name",
    "kueue.x-k8s.io/pod-group-name",
    "kueue.x-k8s.io/pod-group-total-count",
    "kueue.x-k8s.io/podset-required-topology",
    "kueue.x-k8s.io/podset-preferred-topology",
    "kueue.x-k8s.io/podset-unconstrained-topology",
];

/// The GPU resource a worker's container asks the device plugin for.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// What a worker pod template must satisfy for the placement to be
/// added to it: containers with images (a `Pod` needs one), no node of
/// its own (`nodeName` bypasses the scheduler and the gang), and at most
/// one container asking for GPUs, for `gpus_per_worker` if it says.
fn check_template(t: &PodTemplateSpec, gpus_per_worker: u32, workers: u32) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let Some(spec) = &t.spec else {
        errors.push(FieldError::new(
            "spec.template.spec",
            "a worker template needs a pod spec with at least one container",
        ));
        return errors;
    };
    if spec.containers.is_empty() {
        errors.push(FieldError::new(
            "spec.template.spec.containers",
            "a worker template needs at least one container",
        ));
    }
    match spec.restart_policy.as_deref() {
        Some("Always") => errors.push(FieldError::new(
            "spec.template.spec.restartPolicy",
            "a worker is a bare Pod: `Always` would run its training again when it finishes; use `Never` or `OnFailure`",
        )),
        Some("Never" | "OnFailure") | None => {}
        Some(other) => errors.push(FieldError::new(
            "spec.template.spec.restartPolicy",
            format!(
                "`{}` is not a restart policy: `Never` or `OnFailure`",
                crate::model::shown(other)
            ),
        )),
    }
    // The pod's labels and annotations, as the API server checks them;
    // none of the keys the placement sets (a stale group name would put
    // the workers in another gang).
    let meta = t.metadata.as_ref();
    if meta.is_some_and(|m| m.namespace.is_some()) {
        errors.push(FieldError::new(
            "spec.template.metadata.namespace",
            "the job's own `metadata.namespace` says where its pods go; leave this out",
        ));
    }
    // The API server's cap on a pod's annotations, keys and values.
    let annotation_bytes: usize = meta
        .and_then(|m| m.annotations.as_ref())
        .map(|a| a.iter().map(|(k, v)| k.len() + v.len()).sum())
        .unwrap_or(0);
    if annotation_bytes > 256 * 1024 {
        errors.push(FieldError::new(
            "spec.template.metadata.annotations",
            format!("hold {annotation_bytes} bytes: the API server takes at most 262144 (256 KiB)"),
        ));
    }
    for (what, map) in [
        ("labels", meta.and_then(|m| m.labels.as_ref())),
        ("annotations", meta.and_then(|m| m.annotations.as_ref())),
    ] {
        for (k, v) in map.into_iter().flatten() {
            let path = format!("spec.template.metadata.{what}.{}", crate::model::shown(k));
            if let Some(why) = crate::labels::key_problem(k) {
                errors.push(FieldError::new(path, format!("the key {why}")));
            } else if PLACEMENT_KEYS.contains(&k.as_str())
                || k.split_once('/').is_some_and(|(p, _)| p == "gpuscale.io")
            {
                errors.push(FieldError::new(
                    path,
                    "is set by the placement (the gang's group, its topology, gpuscale's own keys); leave it out",
                ));
            } else if what == "labels"
                && let Some(why) = crate::labels::value_problem(v)
            {
                errors.push(FieldError::new(path, why));
            }
        }
    }
    errors.extend(check_node_rules(spec));
    // gpuscale pins each worker to its planned node: a required rule of
    // the template's own about other pods could leave a worker unable to
    // schedule there, and the gang waiting for it forever.
    if let Some(a) = &spec.affinity {
        for (field, required) in [
            (
                "podAffinity",
                a.pod_affinity.as_ref().is_some_and(|p| {
                    p.required_during_scheduling_ignored_during_execution
                        .as_ref()
                        .is_some_and(|r| !r.is_empty())
                }),
            ),
            (
                "podAntiAffinity",
                a.pod_anti_affinity.as_ref().is_some_and(|p| {
                    p.required_during_scheduling_ignored_during_execution
                        .as_ref()
                        .is_some_and(|r| !r.is_empty())
                }),
            ),
        ] {
            if required {
                errors.push(FieldError::new(
                    format!(
                        "spec.template.spec.affinity.{field}.requiredDuringSchedulingIgnoredDuringExecution"
                    ),
                    "gpuscale places each worker on its node and the gang by `spec.topology`; a required rule about other pods could leave a worker unschedulable there (a preferred one is fine)",
                ));
            }
        }
    }
    for (i, c) in spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .enumerate()
    {
        if c.when_unsatisfiable == "DoNotSchedule" {
            errors.push(FieldError::new(
                format!("spec.template.spec.topologySpreadConstraints[{i}].whenUnsatisfiable"),
                "gpuscale places each worker on its node and the gang by `spec.topology`; `DoNotSchedule` could leave a worker unschedulable there (use `ScheduleAnyway`)",
            ));
        }
    }
    // Every quantity as the API server reads it: one it refuses would
    // fail every worker pod at `kubectl apply`, after the plan.
    for (field, list) in [
        ("containers", spec.containers.as_slice()),
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or(&[]),
        ),
    ] {
        for (i, c) in list.iter().enumerate() {
            let Some(r) = &c.resources else { continue };
            for (kind, map) in [("limits", &r.limits), ("requests", &r.requests)] {
                for (k, q) in map.iter().flatten() {
                    if let Some(why) = crate::load::quantity_problem(&q.0) {
                        errors.push(FieldError::new(
                            format!(
                                "spec.template.spec.{field}[{i}].resources.{kind}.{}",
                                crate::model::shown(k)
                            ),
                            why,
                        ));
                    }
                }
            }
        }
    }
    // The plan gives the GPUs to the worker's container; an init
    // container asking for any would raise the pod's request past it.
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let Some(r) = &c.resources else { continue };
        for (kind, map) in [("limits", &r.limits), ("requests", &r.requests)] {
            for k in map.iter().flat_map(|m| m.keys()) {
                if k.starts_with("nvidia.com/") {
                    errors.push(FieldError::new(
                        format!("spec.template.spec.initContainers[{i}].resources.{kind}.{k}"),
                        "the plan gives the worker's GPUs to its container; an init container asks for none",
                    ));
                }
            }
        }
    }
    // Two workers may share a node: a host port would let only one start
    // there, and the gang wait for the other forever (kube-scheduler's
    // NodePorts filter).
    if workers > 1 {
        for (i, c) in spec.containers.iter().enumerate() {
            for (j, p) in c.ports.iter().flatten().enumerate() {
                if p.host_port.is_some_and(|h| h != 0) {
                    errors.push(FieldError::new(
                        format!("spec.template.spec.containers[{i}].ports[{j}].hostPort"),
                        "two workers of the gang may share a node, where one host port lets only one start; leave hostPort out",
                    ));
                }
            }
        }
    }
    // Container names: DNS-1123 labels, unique in the pod.
    let mut names = std::collections::BTreeSet::new();
    for (field, list) in [
        ("containers", spec.containers.as_slice()),
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or(&[]),
        ),
    ] {
        for (i, c) in list.iter().enumerate() {
            let path = format!("spec.template.spec.{field}[{i}].name");
            if let Some(why) = crate::load::namespace_problem(&c.name) {
                errors.push(FieldError::new(
                    path,
                    why.replace("is not a namespace", "is not a container name"),
                ));
            } else if !names.insert(c.name.as_str()) {
                errors.push(FieldError::new(
                    path,
                    format!("`{}` names two containers of the pod", c.name),
                ));
            }
        }
    }
    if spec.node_name.as_deref().is_some_and(|n| !n.is_empty()) {
        errors.push(FieldError::new(
            "spec.template.spec.nodeName",
            "gpuscale places each worker on its node; a fixed node would bypass the gang scheduler",
        ));
    }
    let mut asking = 0;
    for (i, c) in spec.containers.iter().enumerate() {
        if c.image.as_deref().is_none_or(|s| s.trim().is_empty()) {
            errors.push(FieldError::new(
                format!("spec.template.spec.containers[{i}].image"),
                "a worker pod needs an image",
            ));
        }
        let Some(r) = &c.resources else { continue };
        // Workers take whole GPUs: a share, a MIG slice or HAMi's memory
        // and cores beside the placement's `nvidia.com/gpu` would ask the
        // node for a device the plan did not count.
        for (kind, map) in [("limits", &r.limits), ("requests", &r.requests)] {
            for k in map.iter().flat_map(|m| m.keys()) {
                if k.starts_with("nvidia.com/") && k != GPU_RESOURCE {
                    errors.push(FieldError::new(
                        format!("spec.template.spec.containers[{i}].resources.{kind}.{k}"),
                        format!(
                            "workers take whole GPUs (spec.gpusPerWorker, as `{GPU_RESOURCE}`, set by the plan); leave `{k}` out"
                        ),
                    ));
                }
            }
        }
        let mut asks = false;
        for (kind, map) in [("limits", &r.limits), ("requests", &r.requests)] {
            let Some(q) = map.as_ref().and_then(|m| m.get(GPU_RESOURCE)) else {
                continue;
            };
            asks = true;
            // By value (`2`, `2.0` and `2000m` are one count); one the
            // API server would refuse is said once, above.
            let value = crate::load::quantity_value(&q.0);
            if let Some(v) = value
                && v.fract() != 0.0
            {
                errors.push(FieldError::new(
                    format!("spec.template.spec.containers[{i}].resources.{kind}.{GPU_RESOURCE}"),
                    format!("`{}`: GPUs are counted whole", q.0),
                ));
            } else if value.is_some_and(|v| v != f64::from(gpus_per_worker)) {
                errors.push(FieldError::new(
                    format!("spec.template.spec.containers[{i}].resources.{kind}.{GPU_RESOURCE}"),
                    format!(
                        "`{}` disagrees with spec.gpusPerWorker ({gpus_per_worker}); leave it out and the plan sets it",
                        q.0
                    ),
                ));
            }
        }
        if asks {
            asking += 1;
            if asking > 1 {
                errors.push(FieldError::new(
                    format!("spec.template.spec.containers[{i}].resources"),
                    format!("only one container of a worker may ask for {GPU_RESOURCE}"),
                ));
            }
        }
    }
    errors
}

/// A partition of the training queue, as Slurm's: which GPUs its jobs may
/// use, how many at once, for how long, and its priority tier.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Partition {
    /// Partition name (`spec.partition` of a job).
    pub name: String,
    /// Most GPUs its jobs hold at once (default: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gpus: Option<u32>,
    /// Longest runtime a job may ask for; a job without an estimate gets
    /// it as its time limit.
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub max_runtime: Option<Duration>,
    /// Runtime of a job that gives no estimate (Slurm's `DefaultTime`;
    /// default: `maxRuntime`, else the queue's `defaultRuntime`). At most
    /// `maxRuntime`.
    #[serde(
        default,
        with = "crate::duration::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub default_runtime: Option<Duration>,
    /// GPU models its jobs may use (default: any).
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Nodes its jobs may use (default: every node). Nodes left out of
    /// every training partition are reserved for inference.
    #[serde(default)]
    pub nodes: Vec<String>,
    /// Slurm's `PriorityTier`: a higher tier's jobs go first.
    #[serde(default)]
    pub priority_tier: u32,
    /// Jobs that name no partition run here (at most one).
    #[serde(default)]
    pub default: bool,
}

impl Partition {
    /// A partition as a file naming only `name` reads: no limits, every
    /// node and GPU model, tier 0, not the default.
    pub fn new(name: impl Into<String>) -> Partition {
        Partition {
            name: name.into(),
            max_gpus: None,
            max_runtime: None,
            default_runtime: None,
            gpu_models: vec![],
            nodes: vec![],
            priority_tier: 0,
            default: false,
        }
    }
}

/// A team's fair share.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Account {
    /// Account (team) name.
    pub name: String,
    /// Its shares of the cluster (default 1).
    #[serde(default = "one")]
    pub shares: f64,
    /// Its recent GPU-hours, decayed with the half-life (as Slurm's
    /// `RawUsage`).
    #[serde(default)]
    pub usage_gpu_hours: f64,
}

fn one() -> f64 {
    1.0
}

fn week() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}

fn day() -> Duration {
    Duration::from_secs(24 * 3600)
}

/// Fair share across teams (Slurm's classic fair-share factor
/// `2^(-usage/shares)`, both normalised).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FairShare {
    /// Half-life of recorded usage (Slurm's `PriorityDecayHalfLife`,
    /// default 7 days).
    #[serde(default = "week", with = "crate::duration")]
    #[schemars(with = "String")]
    pub half_life: Duration,
    /// The teams; one not listed has 1 share and no usage.
    #[serde(default)]
    pub accounts: Vec<Account>,
}

impl Default for FairShare {
    fn default() -> Self {
        FairShare {
            half_life: week(),
            accounts: Vec::new(),
        }
    }
}

/// Weights of the multifactor priority (Slurm's `PriorityWeight*`); each
/// factor is in [0, 1].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PriorityWeights {
    /// The job's priority class (QOS): critical 1, standard 0.5,
    /// sheddable 0.
    #[serde(default = "w_qos")]
    pub qos: f64,
    /// Its partition's tier over the highest tier.
    #[serde(default = "w_partition")]
    pub partition: f64,
    /// Its account's fair-share factor.
    #[serde(default = "w_fair")]
    pub fair_share: f64,
    /// Its age over `maxAge` (capped at 1).
    #[serde(default = "w_age")]
    pub age: f64,
    /// Its estimate ([`TrainingQueueSpec::runtime_factor`]: within its
    /// partition's `maxRuntime`, over the queue's longest partition limit
    /// ([`TrainingQueueSpec::runtime_scale`]), capped at 1; 0 with no
    /// estimate): longest first, which shortens the tail a backlog drains
    /// in (Graham's LPT rule). Not one of Slurm's factors; default 0
    /// (off), since it lets a user's own estimate raise the job's
    /// priority.
    #[serde(default)]
    pub runtime: f64,
    /// Age at which the age factor reaches 1 (Slurm's `PriorityMaxAge`,
    /// default 7 days).
    #[serde(default = "week", with = "crate::duration")]
    #[schemars(with = "String")]
    pub max_age: Duration,
}

fn w_qos() -> f64 {
    100_000.0
}
fn w_partition() -> f64 {
    10_000.0
}
fn w_fair() -> f64 {
    5_000.0
}
fn w_age() -> f64 {
    1_000.0
}

impl Default for PriorityWeights {
    fn default() -> Self {
        PriorityWeights {
            qos: w_qos(),
            partition: w_partition(),
            fair_share: w_fair(),
            age: w_age(),
            runtime: 0.0,
            max_age: week(),
        }
    }
}

/// A number as a person reads it: in exponent form when far from 1
/// (`1e300`, not three hundred digits; `1e-300`, not as many zeros).
pub fn number(v: f64) -> String {
    if v.is_finite() && v != 0.0 && !(1e-4..1e12).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// The largest priority weight: Slurm's `PriorityWeight*` are 32-bit.
pub const MAX_WEIGHT: f64 = 4_294_967_295.0;

/// `kind: TrainingQueue`: partitions, fair share and priority weights.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingQueueSpec {
    /// Partitions (default: one, `default`, with no limits).
    #[serde(default)]
    pub partitions: Vec<Partition>,
    /// Fair share across teams.
    #[serde(default)]
    pub fair_share: FairShare,
    /// Multifactor priority weights.
    #[serde(default)]
    pub weights: PriorityWeights,
    /// Runtime assumed for a job with no estimate and no partition limit
    /// (default 24 h).
    #[serde(default = "day", with = "crate::duration")]
    #[schemars(with = "String")]
    pub default_runtime: Duration,
}

impl Default for TrainingQueueSpec {
    fn default() -> Self {
        TrainingQueueSpec {
            partitions: Vec::new(),
            fair_share: FairShare::default(),
            weights: PriorityWeights::default(),
            default_runtime: day(),
        }
    }
}

/// Why `name` cannot be a Slurm partition or account name, if it cannot:
/// gpuscale writes these names into `#SBATCH --partition=` and
/// `--account=` lines and into the `queue` table, so they are single
/// tokens of letters, digits, `_`, `-` and `.` (at most 64), never text
/// that could end a directive line or start another.
pub fn slurm_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".to_string());
    }
    let ok = name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    (!ok).then(|| {
        format!(
            "`{}` is not a Slurm name: letters, digits, '_', '-' and '.', at most 64 characters",
            crate::model::shown(name)
        )
    })
}

impl TrainingQueueSpec {
    /// Checks the queue on its own: unique partition names, at most one
    /// default, known GPU models, positive shares and weights.
    pub fn validate(&self, catalog: &Catalog) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        let mut defaults = 0;
        for (i, p) in self.partitions.iter().enumerate() {
            if !names.insert(p.name.as_str()) {
                errors.push(FieldError::new(
                    format!("spec.partitions[{i}].name"),
                    format!("partition `{}` is defined twice", p.name),
                ));
            }
            if p.default {
                defaults += 1;
                if defaults > 1 {
                    errors.push(FieldError::new(
                        format!("spec.partitions[{i}].default"),
                        "only one partition may be the default",
                    ));
                }
            }
            for (k, g) in p.gpu_models.iter().enumerate() {
                if catalog.get(g).is_none() {
                    errors.push(FieldError::new(
                        format!("spec.partitions[{i}].gpuModels[{k}]"),
                        format!(
                            "unknown GPU model `{g}`; the catalogue has: {}",
                            catalog.names().join(", ")
                        ),
                    ));
                }
            }
            if p.max_gpus == Some(0) {
                errors.push(FieldError::new(
                    format!("spec.partitions[{i}].maxGpus"),
                    "must be at least 1 (leave it out for no limit)",
                ));
            }
        }
        for (i, p) in self.partitions.iter().enumerate() {
            if let Some(problem) = slurm_name_problem(&p.name) {
                errors.push(FieldError::new(
                    format!("spec.partitions[{i}].name"),
                    problem,
                ));
            }
            if p.max_runtime.is_some_and(|d| d.is_zero()) {
                errors.push(FieldError::new(
                    format!("spec.partitions[{i}].maxRuntime"),
                    "must be longer than zero (leave it out for no limit)",
                ));
            }
            if let Some(d) = p.default_runtime {
                if d.is_zero() {
                    errors.push(FieldError::new(
                        format!("spec.partitions[{i}].defaultRuntime"),
                        "must be longer than zero (leave it out for the partition's maxRuntime)",
                    ));
                } else if let Some(max) = p.max_runtime.filter(|m| d > *m) {
                    errors.push(FieldError::new(
                        format!("spec.partitions[{i}].defaultRuntime"),
                        format!(
                            "{} is over the partition's maxRuntime of {}",
                            crate::duration::show(d),
                            crate::duration::show(max)
                        ),
                    ));
                }
            }
        }
        if self.weights.max_age.is_zero() {
            errors.push(FieldError::new(
                "spec.weights.maxAge",
                "must be longer than zero (the age at which the age factor reaches 1)",
            ));
        }
        if self.default_runtime.is_zero() {
            errors.push(FieldError::new(
                "spec.defaultRuntime",
                "must be longer than zero",
            ));
        }
        let mut accounts = std::collections::BTreeSet::new();
        for (i, a) in self.fair_share.accounts.iter().enumerate() {
            if let Some(problem) = slurm_name_problem(&a.name) {
                errors.push(FieldError::new(
                    format!("spec.fairShare.accounts[{i}].name"),
                    problem,
                ));
            } else if !accounts.insert(a.name.as_str()) {
                errors.push(FieldError::new(
                    format!("spec.fairShare.accounts[{i}].name"),
                    format!("account `{}` is listed twice", a.name),
                ));
            }
            if !(a.shares.is_finite() && a.shares > 0.0) {
                errors.push(FieldError::new(
                    format!("spec.fairShare.accounts[{i}].shares"),
                    format!("must be a positive number, got {}", a.shares),
                ));
            }
            if !(a.usage_gpu_hours.is_finite() && a.usage_gpu_hours >= 0.0) {
                errors.push(FieldError::new(
                    format!("spec.fairShare.accounts[{i}].usageGpuHours"),
                    format!("must be zero or more, got {}", a.usage_gpu_hours),
                ));
            }
        }
        if self.fair_share.half_life.is_zero() {
            errors.push(FieldError::new(
                "spec.fairShare.halfLife",
                "must be longer than zero",
            ));
        }
        let w = &self.weights;
        for (field, v) in [
            ("qos", w.qos),
            ("partition", w.partition),
            ("fairShare", w.fair_share),
            ("age", w.age),
            ("runtime", w.runtime),
        ] {
            // Slurm's PriorityWeight* are 32-bit; far past that, the
            // weighted sum of the factors overflows to infinity and every
            // job ties.
            if !(v.is_finite() && (0.0..=MAX_WEIGHT).contains(&v)) {
                errors.push(FieldError::new(
                    format!("spec.weights.{field}"),
                    format!("must be 0 to 4294967295 (Slurm's range), got {}", number(v)),
                ));
            }
        }
        errors
    }

    /// The partition a job runs in: the one it names, else the default.
    pub fn partition_of(&self, job: &TrainingJob) -> Option<&Partition> {
        match &job.spec.partition {
            Some(name) => self.partitions.iter().find(|p| &p.name == name),
            None => self.partitions.iter().find(|p| p.default),
        }
    }

    /// A job's runtime for scheduling, as Slurm's time limit: its
    /// estimate, else its partition's `defaultRuntime` (`DefaultTime`),
    /// else the partition's limit (`MaxTime`), else the queue's
    /// `defaultRuntime`; never above the partition's limit.
    pub fn runtime_of(&self, job: &TrainingJob) -> Duration {
        let partition = self.partition_of(job);
        let limit = partition.and_then(|p| p.max_runtime);
        let r = job
            .spec
            .estimated_runtime
            .or(partition.and_then(|p| p.default_runtime))
            .or(limit)
            .unwrap_or(self.default_runtime);
        limit.map_or(r, |l| r.min(l))
    }

    /// A job's runtime factor (for `weights.runtime`): its estimate,
    /// within its partition's `maxRuntime` as [`Self::runtime_of`] caps
    /// it, over [`Self::runtime_scale`], capped at 1; 0 for a job with no
    /// estimate (a default runtime is the operator's guess, not the
    /// job's, and would otherwise rank every job that gives none first).
    pub fn runtime_factor(&self, job: &TrainingJob) -> f64 {
        if job.spec.estimated_runtime.is_none() {
            return 0.0;
        }
        let scale = self.runtime_scale().as_secs_f64();
        if scale <= 0.0 {
            return 0.0;
        }
        (self.runtime_of(job).as_secs_f64() / scale).min(1.0)
    }

    /// One scale for every job's runtime factor, so that a longer job
    /// never ranks below a shorter one whatever their partitions: the
    /// longest partition's `maxRuntime`, a partition without one counting
    /// as the queue's `defaultRuntime` (its estimates are unbounded, so
    /// the factor's cap at 1 bounds them); the queue's `defaultRuntime`
    /// when there are no partitions.
    pub fn runtime_scale(&self) -> Duration {
        self.partitions
            .iter()
            .map(|p| p.max_runtime.unwrap_or(self.default_runtime))
            .max()
            .unwrap_or(self.default_runtime)
    }

    /// Checks a job against its partition: the partition exists, its
    /// estimate is within the limit, and it shares a GPU model.
    pub fn check_job(&self, job: &TrainingJob) -> Vec<FieldError> {
        let mut errors = Vec::new();
        let Some(p) = self.partition_of(job) else {
            if let Some(name) = &job.spec.partition {
                let known: Vec<&str> = self.partitions.iter().map(|p| p.name.as_str()).collect();
                errors.push(FieldError::new(
                    "spec.partition",
                    format!(
                        "no partition `{name}` in the TrainingQueue; it has: {}",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            } else if !self.partitions.is_empty() {
                // As Slurm refuses such a job ("No partition specified or
                // system default partition"): partitions decide which
                // nodes training may use, and with none chosen the job
                // would run on any, inference's reserved ones too.
                let known: Vec<&str> = self.partitions.iter().map(|p| p.name.as_str()).collect();
                errors.push(FieldError::new(
                    "spec.partition",
                    format!(
                        "the job names no partition and the TrainingQueue has no default one; name one of {} here, or mark one `default: true`",
                        known.join(", ")
                    ),
                ));
            }
            return errors;
        };
        if let (Some(est), Some(max)) = (job.spec.estimated_runtime, p.max_runtime)
            && est > max
        {
            errors.push(FieldError::new(
                "spec.estimatedRuntime",
                format!(
                    "{} is over partition `{}`'s maxRuntime of {}",
                    crate::duration::show(est),
                    p.name,
                    crate::duration::show(max)
                ),
            ));
        }
        if !p.gpu_models.is_empty() && !job.gpu_models.iter().any(|g| p.gpu_models.contains(g)) {
            errors.push(FieldError::new(
                "spec.gpuModels",
                format!(
                    "none of [{}] is allowed in partition `{}` ([{}])",
                    job.gpu_models.join(", "),
                    p.name,
                    p.gpu_models.join(", ")
                ),
            ));
        }
        if let Some(max) = p.max_gpus
            && job.total_gpus() > max
        {
            errors.push(FieldError::new(
                "spec.workers",
                format!(
                    "{} GPUs is over partition `{}`'s maxGpus of {max}",
                    job.total_gpus(),
                    p.name
                ),
            ));
        }
        errors
    }
}

/// A validated training job.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingJob {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, if given: where its PodGroup and worker pods
    /// go (else `gpuscale plan --training-namespace`).
    pub namespace: Option<String>,
    /// The spec, validated.
    pub spec: TrainingJobSpec,
    /// Allowed GPU models, resolved (never empty).
    pub gpu_models: Vec<String>,
}

impl TrainingJob {
    /// Total GPUs the gang takes.
    pub fn total_gpus(&self) -> u32 {
        self.spec.workers.saturating_mul(self.spec.gpus_per_worker)
    }

    /// GPU-hours a preemption would lose: the GPUs times the checkpoint
    /// interval for a job that checkpoints (the worst case since its last
    /// checkpoint), its estimated runtime for one that does not
    /// (everything may be lost), and a day when neither is known (an
    /// unknown job without checkpoints is the dearest to stop).
    pub fn preemption_cost_gpu_hours(&self) -> f64 {
        let span = self
            .spec
            .checkpoint_interval
            .or(self.spec.estimated_runtime)
            .unwrap_or(Duration::from_secs(24 * 3600));
        f64::from(self.total_gpus()) * span.as_secs_f64() / 3600.0
    }

    /// Validates a spec against the catalogue, reporting every problem.
    pub fn from_spec(
        name: &str,
        spec: &TrainingJobSpec,
        catalog: &Catalog,
    ) -> Result<TrainingJob, Vec<FieldError>> {
        let mut errors = Vec::new();
        if spec.workers == 0 {
            errors.push(FieldError::new("spec.workers", "must be at least 1"));
        }
        if spec.gpus_per_worker == 0 || spec.gpus_per_worker > 16 {
            errors.push(FieldError::new(
                "spec.gpusPerWorker",
                format!("must be between 1 and 16, got {}", spec.gpus_per_worker),
            ));
        }
        let mut gpu_models = Vec::new();
        for (i, g) in spec.gpu_models.iter().enumerate() {
            if spec.gpu_models[..i].contains(g) {
                errors.push(FieldError::new(
                    format!("spec.gpuModels[{i}]"),
                    format!("`{g}` is listed twice"),
                ));
            } else if catalog.get(g).is_some() {
                gpu_models.push(g.clone());
            } else {
                errors.push(FieldError::new(
                    format!("spec.gpuModels[{i}]"),
                    format!(
                        "unknown GPU model `{g}`; the catalogue has: {}",
                        catalog.names().join(", ")
                    ),
                ));
            }
        }
        if spec.gpu_models.is_empty() {
            gpu_models = catalog.names().into_iter().map(str::to_string).collect();
        }
        for (field, d) in [
            ("spec.estimatedRuntime", spec.estimated_runtime),
            ("spec.checkpointInterval", spec.checkpoint_interval),
        ] {
            if d.is_some_and(|d| d.is_zero()) {
                errors.push(FieldError::new(field, "must be longer than zero"));
            }
        }
        if let (Some(submitted), Some(started)) = (spec.submitted_at, spec.started_at)
            && started < submitted
        {
            errors.push(FieldError::new(
                "spec.startedAt",
                format!(
                    "{} is before submittedAt ({}): a job starts after it is submitted",
                    humantime::format_rfc3339_seconds(started),
                    humantime::format_rfc3339_seconds(submitted)
                ),
            ));
        }
        if let Some(problem) = spec.account.as_deref().and_then(slurm_name_problem) {
            errors.push(FieldError::new("spec.account", problem));
        }
        if let Some(t) = &spec.template {
            errors.extend(check_template(t, spec.gpus_per_worker, spec.workers));
        }
        if errors.is_empty() {
            Ok(TrainingJob {
                name: name.to_string(),
                namespace: None,
                spec: spec.clone(),
                gpu_models,
            })
        } else {
            Err(errors)
        }
    }
}

/// One requirement of a worker template on its node's labels.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRule {
    /// Where it is written (`spec.template.spec.nodeSelector.<key>`, or
    /// a match expression's `key`).
    pub path: String,
    /// The label key (`metadata.name` reads the node's name).
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt` or `Lt`.
    pub operator: String,
    /// The values it compares with.
    pub values: Vec<String>,
}

impl NodeRule {
    /// Whether a node with `labels` (and `name`) meets it.
    pub fn holds(&self, labels: &std::collections::BTreeMap<String, String>, name: &str) -> bool {
        let value = if self.key == "metadata.name" {
            Some(name)
        } else {
            labels.get(&self.key).map(String::as_str)
        };
        let number = |v: &str| v.parse::<i64>().ok();
        match self.operator.as_str() {
            "In" => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            "NotIn" => value.is_none_or(|v| self.values.iter().all(|x| x != v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "Gt" | "Lt" => match (
                value.and_then(number),
                self.values.first().and_then(|x| number(x)),
            ) {
                (Some(v), Some(x)) if self.operator == "Gt" => v > x,
                (Some(v), Some(x)) => v < x,
                _ => false,
            },
            _ => false,
        }
    }
}

/// The node rules of a worker template: its `nodeSelector` (all of
/// them), and its required node affinity's terms (any one of them, each
/// all of its expressions), as kube-scheduler reads them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeRules {
    /// `nodeSelector`, as `In` rules.
    pub selector: Vec<NodeRule>,
    /// `requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`.
    pub terms: Vec<Vec<NodeRule>>,
}

impl NodeRules {
    /// The rules of a template.
    pub fn of(t: &PodTemplateSpec) -> NodeRules {
        let mut out = NodeRules::default();
        let Some(spec) = &t.spec else { return out };
        for (k, v) in spec.node_selector.iter().flatten() {
            out.selector.push(NodeRule {
                path: format!("spec.template.spec.nodeSelector.{}", crate::model::shown(k)),
                key: k.clone(),
                operator: "In".into(),
                values: vec![v.clone()],
            });
        }
        let terms = required_node_affinity(spec)
            .map(|r| r.node_selector_terms.as_slice())
            .unwrap_or_default();
        for (i, term) in terms.iter().enumerate() {
            let mut rules = Vec::new();
            for (field, list) in [
                ("matchExpressions", term.match_expressions.as_deref()),
                ("matchFields", term.match_fields.as_deref()),
            ] {
                for (j, e) in list.unwrap_or_default().iter().enumerate() {
                    rules.push(NodeRule {
                        path: format!(
                            "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}].{field}[{j}].key"
                        ),
                        key: e.key.clone(),
                        operator: e.operator.clone(),
                        values: e.values.clone().unwrap_or_default(),
                    });
                }
            }
            out.terms.push(rules);
        }
        out
    }

    /// Whether a node with `labels` and `name` meets them; rules on a
    /// key outside `evaluated` are taken as met (keys gpuscale does not
    /// know on any node, which the job's check allows only for labels
    /// every node carries).
    pub fn admit(
        &self,
        labels: &std::collections::BTreeMap<String, String>,
        name: &str,
        evaluated: &std::collections::BTreeSet<String>,
    ) -> bool {
        let holds = |r: &NodeRule| {
            !(r.key == "metadata.name" || evaluated.contains(&r.key)) || r.holds(labels, name)
        };
        // An empty term matches no node (the API's NodeSelectorTerm).
        self.selector.iter().all(holds)
            && (self.terms.is_empty()
                || self
                    .terms
                    .iter()
                    .any(|t| !t.is_empty() && t.iter().all(holds)))
    }

    /// Every rule.
    pub fn all(&self) -> impl Iterator<Item = &NodeRule> {
        self.selector.iter().chain(self.terms.iter().flatten())
    }
}

/// Node label keys every GPU node carries whose values gpuscale does not
/// track: a worker template may require them (`kubernetes.io/os: linux`)
/// without the cluster file listing them.
pub const EVERY_NODE_LABELS: [&str; 3] = [
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "nvidia.com/gpu.present",
];

#[cfg(test)]
mod tests {
    use super::{Partition, number};

    #[test]
    fn a_new_partition_is_one_that_names_only_itself() {
        let read: Partition = serde_json::from_str(r#"{"name": "dev"}"#).unwrap();
        assert_eq!(Partition::new("dev"), read);
    }

    #[test]
    fn numbers_far_from_one_are_shown_with_an_exponent() {
        assert_eq!(number(5000.0), "5000");
        assert_eq!(number(0.5), "0.5");
        assert_eq!(number(4_294_967_295.0), "4294967295");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(1e300), "1e300");
        assert_eq!(number(-1e300), "-1e300");
        assert_eq!(number(1e-300), "1e-300");
        assert_eq!(number(f64::INFINITY), "inf");
    }
}
