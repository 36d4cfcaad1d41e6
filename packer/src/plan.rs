//! The packer's output: where every replica goes, how every GPU is
//! configured, and the figures that judge it. Serialised as the JSON/YAML
//! schema documented in the README (`gpuscale plan --format json`).

use std::collections::BTreeMap;

use gpuscale_policies::{Cluster, Placement};
use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm};
use serde::{Deserialize, Serialize};

/// How a GPU is used in a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Partitioned with MIG.
    Mig,
    /// Time-sliced.
    Timeslice,
    /// Split into equal MPS partitions.
    Mps,
    /// Shared fractionally under HAMi.
    Fractional,
    /// Used whole (alone or in a tensor-parallel group).
    Whole,
    /// Nothing placed; its configuration is left as it is.
    Idle,
}

/// One replica on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaSlot {
    /// Model policy name.
    pub model: String,
    /// Replica number within the model (0-based, stable within a plan).
    pub replica: u32,
    /// MIG profile of the instance (mode `mig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Start slot of the instance (mode `mig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u8>,
    /// GPUs of the replica's tensor-parallel group (mode `whole`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u32>,
    /// A spare: placed in room the GPU in use left, beyond the replicas
    /// wanted ([`crate::spare`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spare: bool,
}

/// One GPU of the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPlan {
    /// Node name.
    pub node: String,
    /// Index on the node.
    pub index: u32,
    /// GPU model.
    pub gpu_model: String,
    /// Mode.
    pub mode: Mode,
    /// MIG geometry (mode `mig`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub geometry: Vec<Placement>,
    /// Shares per GPU (mode `timeslice`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice_replicas: Option<u8>,
    /// Partitions per GPU (mode `mps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_replicas: Option<u8>,
    /// Replicas on it.
    pub replicas: Vec<ReplicaSlot>,
    /// Unhealthy (idle, never placed on).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unhealthy: bool,
    /// The training gang's worker that holds it whole (then `replicas` is
    /// empty and `mode` is `whole`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangSlot>,
}

/// A GPU held by a training gang's worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangSlot {
    /// Training job name.
    pub job: String,
    /// Worker number.
    pub worker: u32,
}

/// A way a model's replicas are placed, and what each such pod requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// Variant name (`<model>-<gpu>-<mig profile|timeslice-N|mps-N|
    /// fractional|tpK-<node>>`), lowercase.
    pub name: String,
    /// GPU model.
    pub gpu_model: String,
    /// Device-plugin resources one pod requests.
    pub resources: BTreeMap<String, u32>,
    /// Node labels a pod of this variant must land on: the GPU product
    /// (`nvidia.com/gpu.product`, from the cluster's catalogue) and, for a
    /// shared GPU, the device-plugin config that shares it the way the
    /// plan assumed (`nvidia.com/device-plugin.config: timeslice-N`), so a
    /// share planned on a 3-way node never lands on a 4-way one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Pod annotations (fractional variants: HAMi's GPU type filter,
    /// bin-pack policy and, when the inventory knows the UUIDs, the GPUs
    /// the plan chose).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// Pod labels: on a cluster with HAMi nodes, whole-GPU variants carry
    /// `hami.io/webhook: ignore`. Their pods ask for `nvidia.com/gpu`,
    /// HAMi's resource name too, and HAMi's admission webhook would hand
    /// them to its scheduler, which takes only HAMi's nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The pods' required node affinity, one term (ANDed with
    /// `node_selector`): whole-GPU variants stay off HAMi's nodes (`gpu
    /// NotIn [on]`, where HAMi's device plugin counts `nvidia.com/gpu` by
    /// its splits) and off nodes where a training gang holds GPUs
    /// (`metadata.name NotIn`, one value each, as the API server
    /// requires); the replicas planned on such a node are a variant of
    /// their own, pinned to it (`metadata.name In`). Otherwise the default
    /// scheduler could bind a whole-GPU replica to a GPU the plan gave a
    /// gang, and the gang, pinned per worker, would never start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<NodeSelectorTerm>,
    /// Replicas of this variant, spares included.
    pub replicas: u32,
    /// Of `replicas`, the spares ([`crate::spare`]): room left on GPUs in
    /// use, not demand.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spares: u32,
    /// GPUs one replica spans (tensor parallelism, whole or fractional
    /// GPUs): the model server's `--tensor-parallel-size`. 1 on a MIG
    /// slice or a share.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tensor_parallel: u32,
    /// On a device other replicas share (time-slicing, of a whole GPU or
    /// of a MIG slice, or MPS): the fraction of the device's memory one
    /// replica may take, `(1 − headroom) / N` rounded down to 3 decimals,
    /// so that the shares' sum stays within the device's memory less the
    /// headroom. The model server's `--gpu-memory-utilization`, which
    /// vLLM takes of the total memory CUDA reports, per instance: its
    /// default (0.9; 0.92 in later versions) would let the first replica
    /// on a time-sliced device take the memory of all of them, and under
    /// MPS, whose per-client cap (the device ÷ N) leaves the reported
    /// total whole, it would stop at startup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_fraction: Option<f64>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// One of `n` equal shares of a device's memory less `headroom`, rounded
/// down to 3 decimals ([`Variant::memory_fraction`]).
pub fn share_fraction(headroom: f64, n: u8) -> f64 {
    ((1.0 - headroom) / f64::from(n.max(1)) * 1000.0).floor() / 1000.0
}

/// One model in the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelPlan {
    /// Model policy name.
    pub name: String,
    /// Replicas wanted.
    pub wanted: u32,
    /// Replicas placed.
    pub placed: u32,
    /// Placement variants.
    pub variants: Vec<Variant>,
}

/// Per node: the configuration NVIDIA's tools apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodePlan {
    /// Node name.
    pub name: String,
    /// Value of the `nvidia.com/mig.config` label (a mig-parted config name).
    pub mig_config: String,
    /// Device-plugin time-slicing replicas, when the node shares GPUs
    /// (value of `nvidia.com/device-plugin.config`: `timeslice-<N>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice_replicas: Option<u8>,
    /// Device-plugin MPS replicas, when the node shares GPUs through MPS
    /// (`nvidia.com/device-plugin.config: mps-<N>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_replicas: Option<u8>,
    /// The MIG profile whose instances the node's device plugin
    /// time-slices, and into how many shares
    /// (`nvidia.com/device-plugin.config: mig-<profile>-timeslice-<N>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_timeslice: Option<gpuscale_policies::MigTimeslice>,
    /// Whether the node runs HAMi (fractional GPUs): labelled `gpu: "on"`
    /// for HAMi's device plugin and `nvidia.com/gpu.deploy.device-plugin:
    /// "false"` so the GPU Operator's does not run beside it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hami: bool,
    /// Whether the node may run HAMi (its `sharing` allows `fractional`):
    /// such a node that this plan does not use for HAMi gets its HAMi
    /// labels removed, in case an earlier plan set them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hami_capable: bool,
    /// The node's rack, when the cluster says (labelled `gpuscale.io/rack`:
    /// Kueue's topology-aware scheduling reads it for the `rack` level,
    /// and no standard label carries it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// The node's NVLink domain, when the cluster says (labelled
    /// `gpuscale.io/nvlink-domain`, which Kueue reads for the
    /// `nvlink-domain` level).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
    /// On a HAMi node, the most replicas the plan put on one of its GPUs
    /// may reach: the node's `hamiSplitCount`, else the packer's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hami_split_count: Option<u32>,
}

/// A model's replicas that could not be placed, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unplaced {
    /// Model policy name.
    pub model: String,
    /// Replicas not placed.
    pub replicas: u32,
    /// Why, in words.
    pub reason: String,
}

/// Memory and compute utilisation of the GPUs in use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Utilization {
    /// Σ replica memory ÷ Σ usable memory of GPUs in use.
    pub memory: f64,
    /// Σ replica compute ÷ Σ compute of GPUs in use.
    pub compute: f64,
    /// The dominant-resource view (as in DRF): for each GPU in use, the
    /// larger of its memory and compute fractions, averaged over the GPUs.
    /// A GPU full on compute but half full on memory counts as full.
    #[serde(default)]
    pub dominant: f64,
}

/// One GPU pool (all healthy GPUs of one model): GPUs the plan uses and
/// the GPUs of that model in the cost-optimal LP relaxation. A plan at the
/// LP optimum uses `⌈lp_gpus⌉` in every pool; any pool above that is the
/// integrality gap, reported rather than hidden.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    /// GPU model.
    pub gpu_model: String,
    /// Healthy GPUs of that model.
    pub gpus: u32,
    /// GPUs of that model with at least one replica.
    pub gpus_used: u32,
    /// GPUs of that model in the cost LP relaxation (fractional).
    pub lp_gpus: f64,
}

/// A sum of prices per hour to the micro-dollar: the catalogue's prices
/// are decimal, their float sum is not (`57.99999999999998`), and plans
/// are read, compared and diffed as JSON.
pub fn dollars(sum: f64) -> f64 {
    (sum * 1e6).round() / 1e6
}

/// A baseline's figures, for comparison.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineFigures {
    /// GPUs used.
    pub gpus_used: u32,
    /// Cost per hour.
    pub cost_per_hour: f64,
    /// Utilisation.
    pub utilization: Utilization,
    /// Replicas it could not place.
    pub unplaced: u32,
}

/// Baselines of `plan --compare`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baselines {
    /// One replica per whole GPU (or k whole GPUs for tensor parallelism).
    pub whole_gpu: BaselineFigures,
    /// First-fit decreasing over the same rules.
    pub ffd: BaselineFigures,
}

fn yes() -> bool {
    true
}

/// The plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// GPUs with at least one replica.
    pub gpus_used: u32,
    /// ⌈LP-relaxation lower bound on GPUs⌉.
    pub lp_bound_gpus: u32,
    /// LP-relaxation lower bound on cost per hour.
    pub lp_bound_cost: f64,
    /// Cost per hour of the GPUs in use.
    pub cost_per_hour: f64,
    /// (cost − LP cost bound) ÷ LP cost bound; `None` where the bound
    /// says nothing of this plan: no LP was solved (`lp_bound_known`
    /// false), or the plan leaves replicas out (the bound is for placing
    /// the whole demand, and a plan that places less can cost less).
    #[serde(default)]
    pub optimality_gap: Option<f64>,
    /// Whether the LP bounds above were computed. A re-plan that keeps
    /// what runs (`--keep-running`) without a prior plan's proven bound
    /// solves no LP: the three figures above are then 0 and say nothing.
    #[serde(default = "yes")]
    pub lp_bound_known: bool,
    /// Whether the solver proved optimality within its limits.
    pub optimal: bool,
    /// Utilisation of the GPUs in use.
    pub utilization: Utilization,
    /// Replicas running now that move (scale-downs excluded).
    pub moves: u32,
    /// GPUs whose MIG or sharing configuration changes.
    pub reconfigured_gpus: u32,
    /// Time to build, solve and decode, ms.
    pub solve_ms: f64,
    /// Replicas not placed, with reasons.
    pub unplaced: Vec<Unplaced>,
    /// Per GPU pool (GPU model): GPUs used against the cost LP's own count.
    #[serde(default)]
    pub pools: Vec<Pool>,
    /// Every GPU.
    pub gpus: Vec<GpuPlan>,
    /// Every node's configuration.
    pub nodes: Vec<NodePlan>,
    /// Every model's variants.
    pub models: Vec<ModelPlan>,
    /// Baselines, with `--compare`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baselines: Option<Baselines>,
    /// What the LP bound was proven for, when every replica was placed: a
    /// later re-plan from this plan may carry the bound
    /// ([`crate::pack_from`], [`crate::basis`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basis: Option<crate::basis::Basis>,
    /// Training jobs, placed gang-wise (`gangs` in JSON; empty without
    /// training jobs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gangs: Vec<crate::gang::GangPlan>,
    /// Training's GPUs and the fragmentation of what is left free for it
    /// (with training jobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<crate::gang::GangSummary>,
}

impl Plan {
    /// What is wrong with this plan as the state of `cluster` running
    /// `models` (`--current PLAN.json`), each as (field path, why): a GPU
    /// the node does not have or listed twice, a GPU model other than the
    /// node's, a MIG geometry the GPU model cannot hold (or MIG on a GPU
    /// without it), share counts below 2, a replica of a model not
    /// loaded or on an unhealthy GPU, a tensor-parallel group larger than
    /// the node, a GPU held for a training job neither in `jobs` nor
    /// among the plan's `gangs`. GPUs on
    /// nodes the cluster no longer has are not checked
    /// (their replicas are planned again). Read from a file a user may
    /// have edited, a plan is held to the checks a cluster file gets:
    /// unchecked, an impossible geometry went on into the emitted
    /// mig-parted config.
    pub fn problems_against(
        &self,
        cluster: &Cluster,
        models: &[&str],
        jobs: &[&str],
    ) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for (i, g) in self.gpus.iter().enumerate() {
            let at = |field: &str| format!("gpus[{i}].{field}");
            let Some(node) = cluster.nodes.iter().find(|n| n.name == g.node) else {
                continue;
            };
            if g.index as usize >= node.gpus.len() {
                out.push((
                    at("index"),
                    format!(
                        "node {} has {} GPUs (0..{})",
                        node.name,
                        node.gpus.len(),
                        node.gpus.len().saturating_sub(1)
                    ),
                ));
                continue;
            }
            if !seen.insert((g.node.as_str(), g.index)) {
                out.push((
                    at("index"),
                    format!("GPU {} of node {} is listed twice", g.index, g.node),
                ));
            }
            if g.gpu_model != node.gpu_model {
                out.push((
                    at("gpu_model"),
                    format!(
                        "node {} has {}, not {}",
                        node.name, node.gpu_model, g.gpu_model
                    ),
                ));
            }
            match (
                g.mode,
                cluster
                    .catalog
                    .get(&node.gpu_model)
                    .and_then(|m| m.mig.as_ref()),
            ) {
                (Mode::Mig, None) => out.push((
                    at("mode"),
                    format!("{} does not support MIG", node.gpu_model),
                )),
                (Mode::Mig, Some(spec)) => {
                    if let Err(e) = gpuscale_policies::mig::validate(spec, &g.geometry) {
                        out.push((at("geometry"), e.to_string()));
                    }
                }
                _ if !g.geometry.is_empty() => {
                    out.push((at("geometry"), "a geometry is only for mode `mig`".into()));
                }
                _ => {}
            }
            for (field, n) in [
                ("timeslice_replicas", g.timeslice_replicas),
                ("mps_replicas", g.mps_replicas),
            ] {
                if n.is_some_and(|n| n < 2) {
                    out.push((at(field), "a shared GPU has at least 2 shares".into()));
                }
            }
            if g.unhealthy && !g.replicas.is_empty() {
                out.push((at("replicas"), "an unhealthy GPU runs nothing".into()));
            }
            // A GPU held for a job neither loaded nor among the plan's
            // gangs is an edit that names no job (it would be taken as
            // free). A gang of the plan whose file is gone has finished:
            // deleting its TrainingJob is how that is said, and its GPUs
            // are free.
            if let Some(gang) = &g.gang
                && !jobs.contains(&gang.job.as_str())
                && !self.gangs.iter().any(|p| p.name == gang.job)
            {
                out.push((
                    at("gang.job"),
                    format!("no training job `{}` is loaded", gang.job),
                ));
            }
            for (r, slot) in g.replicas.iter().enumerate() {
                if !models.contains(&slot.model.as_str()) {
                    out.push((
                        format!("gpus[{i}].replicas[{r}].model"),
                        format!("no model policy `{}` is loaded", slot.model),
                    ));
                }
                if slot
                    .group_size
                    .is_some_and(|k| k == 0 || k as usize > node.gpus.len())
                {
                    out.push((
                        format!("gpus[{i}].replicas[{r}].group_size"),
                        format!(
                            "a tensor-parallel group is 1 to {} GPUs on node {}",
                            node.gpus.len(),
                            node.name
                        ),
                    ));
                }
            }
        }
        out
    }

    /// The cluster as it will be once this plan is applied: the current
    /// state for an incremental re-plan (`--current PLAN.json`). GPUs the
    /// plan does not mention keep their state.
    pub fn apply_to(&self, cluster: &Cluster) -> Cluster {
        use gpuscale_policies::inventory::Workload;
        use gpuscale_policies::{Geometry, GpuMode};
        let mut out = cluster.clone();
        let mut by_gpu: BTreeMap<(&str, u32), &GpuPlan> = BTreeMap::new();
        for g in &self.gpus {
            by_gpu.insert((g.node.as_str(), g.index), g);
        }
        for node in &mut out.nodes {
            let plan_node = self.nodes.iter().find(|n| n.name == node.name);
            if let Some(n) = plan_node {
                if n.timeslice_replicas.is_some() {
                    node.timeslice_replicas = n.timeslice_replicas;
                    node.mps_replicas = None;
                }
                if n.mps_replicas.is_some() {
                    node.mps_replicas = n.mps_replicas;
                    node.timeslice_replicas = None;
                }
                // The plan names every node's device-plugin config.
                node.mig_timeslice = n.mig_timeslice.clone();
                if n.mig_timeslice.is_some() {
                    node.timeslice_replicas = None;
                    node.mps_replicas = None;
                }
            }
            for gpu in &mut node.gpus {
                let Some(p) = by_gpu.get(&(node.name.as_str(), gpu.index)) else {
                    continue;
                };
                let mut workloads: Vec<Workload> = p
                    .replicas
                    .iter()
                    .map(|r| Workload {
                        model: r.model.clone(),
                        slot: r.start,
                    })
                    .collect();
                if let Some(g) = &p.gang {
                    workloads.push(Workload {
                        model: g.job.clone(),
                        slot: None,
                    });
                }
                match p.mode {
                    Mode::Mig => {
                        gpu.mode = GpuMode::Mig;
                        gpu.geometry = Geometry::new(p.geometry.clone());
                        gpu.workloads = workloads;
                    }
                    Mode::Timeslice => {
                        gpu.mode = GpuMode::Timeslice;
                        gpu.geometry = Geometry::default();
                        gpu.workloads = workloads;
                    }
                    Mode::Mps => {
                        gpu.mode = GpuMode::Mps;
                        gpu.geometry = Geometry::default();
                        gpu.workloads = workloads;
                    }
                    Mode::Fractional => {
                        gpu.mode = GpuMode::Fractional;
                        gpu.geometry = Geometry::default();
                        gpu.workloads = workloads;
                    }
                    Mode::Whole => {
                        gpu.mode = GpuMode::Whole;
                        gpu.geometry = Geometry::default();
                        gpu.workloads = workloads;
                    }
                    Mode::Idle => gpu.workloads.clear(),
                }
            }
        }
        out
    }
}

/// A replica's part on one GPU of a plan: what it holds there and the
/// compute it runs with.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaPart {
    /// Node name.
    pub node: String,
    /// GPU index on the node.
    pub index: u32,
    /// What it holds, stable across re-plans while the replica stays:
    /// `mig[<geometry>]-<profile>@<start>`, `timeslice`, `mps`,
    /// `hami-<gpucores>` or `whole` (a GPU reconfigured to another MIG
    /// geometry is wiped, so the geometry is part of it).
    pub what: String,
    /// Compute it runs with, in H100-80GB units: a 3g MIG slice of an
    /// H100 3/7 of it; a GPU time-sliced or split by MPS `N` ways `1/N`
    /// (the worst case, every share busy); a MIG instance time-sliced `N`
    /// ways `1/N` of the instance; a HAMi share its `gpucores` percentage.
    pub speed: f64,
    /// GPU memory it takes here, GiB.
    pub memory_gib: f64,
}

impl Variant {
    /// Whether its pods take whole GPUs from the NVIDIA device plugin
    /// (`nvidia.com/gpu` without HAMi's memory limit).
    pub fn whole_gpus(&self) -> bool {
        self.resources.contains_key("nvidia.com/gpu")
            && !self.resources.contains_key(crate::emit::HAMI_MEMORY)
    }

    /// Whether its node affinity pins it to one node (`metadata.name In
    /// [node]`).
    pub fn pinned_to_a_node(&self) -> bool {
        self.node_affinity
            .as_ref()
            .and_then(|t| t.match_fields.as_ref())
            .is_some_and(|fields| {
                fields.iter().any(|r| {
                    r.key == "metadata.name"
                        && r.operator == "In"
                        && r.values.as_ref().is_some_and(|v| v.len() == 1)
                })
            })
    }
}

/// One node requirement of a node-affinity term.
fn requirement(key: &str, operator: &str, values: Vec<String>) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: operator.to_string(),
        values: Some(values),
    }
}

/// The affinity term that pins pods to one node (`metadata.name In
/// [node]`, one value, as the API server requires of a field).
pub fn on_node(node: &str) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![requirement(
            "metadata.name",
            "In",
            vec![node.to_string()],
        )]),
    }
}

/// The affinity term that keeps whole-GPU pods off HAMi's nodes (`gpu
/// NotIn [on]`, the label HAMi's device plugin selects).
pub fn off_hami_nodes() -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(vec![requirement(
            crate::emit::HAMI_NODE_LABEL.0,
            "NotIn",
            vec![crate::emit::HAMI_NODE_LABEL.1.to_string()],
        )]),
        match_fields: None,
    }
}

impl Plan {
    /// Keeps whole-GPU inference variants off the nodes where a training
    /// gang holds GPUs ([`Variant::node_affinity`]): each excludes those
    /// nodes by name, and its replicas planned on one of them become a
    /// variant of their own pinned there (`<variant>-<node>`), with the
    /// count planned there. Variants left with no replica are dropped.
    pub fn keep_whole_gpus_off_gangs(&mut self) {
        let gang_nodes: std::collections::BTreeSet<&str> = self
            .gpus
            .iter()
            .filter(|g| g.gang.is_some())
            .map(|g| g.node.as_str())
            .collect();
        if gang_nodes.is_empty() {
            return;
        }
        // Whole-GPU replicas on those nodes: (model, GPU model, GPUs per
        // replica, node) → replica numbers.
        let mut there: BTreeMap<(&str, &str, u32, &str), std::collections::BTreeSet<u32>> =
            BTreeMap::new();
        for g in self.gpus.iter().filter(|g| {
            g.gang.is_none() && g.mode == Mode::Whole && gang_nodes.contains(g.node.as_str())
        }) {
            for r in &g.replicas {
                there
                    .entry((
                        r.model.as_str(),
                        g.gpu_model.as_str(),
                        r.group_size.unwrap_or(1),
                        g.node.as_str(),
                    ))
                    .or_default()
                    .insert(r.replica);
            }
        }
        for m in &mut self.models {
            let mut pinned = Vec::new();
            // (A variant pinned to its node already, as `pack` pins every
            // whole-GPU variant, needs nothing more.)
            for v in m
                .variants
                .iter_mut()
                .filter(|v| v.whole_gpus() && !v.pinned_to_a_node())
            {
                let before = v.node_affinity.clone().unwrap_or_default();
                let mut term = before.clone();
                let fields = term.match_fields.get_or_insert_with(Vec::new);
                for &n in &gang_nodes {
                    fields.push(requirement("metadata.name", "NotIn", vec![n.to_string()]));
                    let count = there
                        .get(&(m.name.as_str(), v.gpu_model.as_str(), v.tensor_parallel, n))
                        .map_or(0, |r| r.len() as u32);
                    if count == 0 {
                        continue;
                    }
                    v.replicas = v.replicas.saturating_sub(count);
                    let mut on = before.clone();
                    on.match_fields
                        .get_or_insert_with(Vec::new)
                        .push(requirement("metadata.name", "In", vec![n.to_string()]));
                    pinned.push(Variant {
                        name: crate::emit::bounded_name(
                            format!("{}-{n}", v.name)
                                .to_lowercase()
                                .replace(['.', '+', '_'], "-"),
                        ),
                        replicas: count,
                        node_affinity: Some(on),
                        ..v.clone()
                    });
                }
                v.node_affinity = Some(term);
            }
            m.variants.retain(|v| v.replicas > 0);
            m.variants.extend(pinned);
            m.variants.sort_by(|a, b| a.name.cmp(&b.name));
        }
    }

    /// The nodes that time-slice a MIG profile: node name → (profile,
    /// shares per instance).
    pub fn mig_timeslices(&self) -> BTreeMap<&str, (&str, u8)> {
        self.nodes
            .iter()
            .filter_map(|n| {
                let t = n.mig_timeslice.as_ref()?;
                Some((n.name.as_str(), (t.profile.as_str(), t.replicas)))
            })
            .collect()
    }

    /// Every placed replica's parts, by (model policy name, replica
    /// number), each replica's parts in (node, index) order. The one
    /// place that says how fast a replica runs on its share: the
    /// simulator's replicas and the local backend's simulated servers
    /// both run at this speed.
    pub fn replica_parts(
        &self,
        cluster: &Cluster,
        models: &[gpuscale_policies::Model],
    ) -> BTreeMap<(String, u32), Vec<ReplicaPart>> {
        let mut parts: BTreeMap<(String, u32), Vec<ReplicaPart>> = BTreeMap::new();
        let shared = self.mig_timeslices();
        for g in &self.gpus {
            let Some(gm) = cluster.catalog.get(&g.gpu_model) else {
                continue;
            };
            for r in &g.replicas {
                let Some(model) = models.iter().find(|m| m.name == r.model) else {
                    continue;
                };
                let k = r.group_size.unwrap_or(1).max(1);
                let (what, speed) = match g.mode {
                    Mode::Mig => {
                        let profile = r.profile.clone().unwrap_or_default();
                        let share = gm
                            .mig
                            .as_ref()
                            .and_then(|m| m.profile(&profile))
                            .map_or(1.0, |p| p.compute_fraction);
                        let n = match shared.get(g.node.as_str()) {
                            Some(&(p, n)) if p == profile => n.max(1),
                            _ => 1,
                        };
                        let geometry: Vec<String> = g
                            .geometry
                            .iter()
                            .map(|p| format!("{}@{}", p.profile, p.start))
                            .collect();
                        (
                            format!(
                                "mig[{}]-{profile}@{}",
                                geometry.join(","),
                                r.start.unwrap_or(0)
                            ),
                            gm.compute * share / f64::from(n),
                        )
                    }
                    Mode::Timeslice => {
                        let n = g.timeslice_replicas.unwrap_or(1).max(1);
                        ("timeslice".to_string(), gm.compute / f64::from(n))
                    }
                    Mode::Mps => {
                        let n = g.mps_replicas.unwrap_or(1).max(1);
                        ("mps".to_string(), gm.compute / f64::from(n))
                    }
                    Mode::Fractional => {
                        let (_, pct) = crate::classes::fractional_need(model, gm.compute, k);
                        (format!("hami-{pct}"), gm.compute * f64::from(pct) / 100.0)
                    }
                    Mode::Whole | Mode::Idle => ("whole".to_string(), gm.compute),
                };
                parts
                    .entry((r.model.clone(), r.replica))
                    .or_default()
                    .push(ReplicaPart {
                        node: g.node.clone(),
                        index: g.index,
                        what,
                        speed,
                        memory_gib: model.memory_gib / f64::from(k),
                    });
            }
        }
        for on in parts.values_mut() {
            on.sort_by(|a, b| (&a.node, a.index).cmp(&(&b.node, b.index)));
        }
        parts
    }
}
