//! Cluster inventory (`kind: Cluster`): nodes with their topology labels,
//! GPUs with model, index, health and current state (free, whole,
//! time-sliced, or a MIG geometry with placements) and what runs on them,
//! plus overrides of the built-in GPU catalogue.
//!
//! A node entry with `count: N` stands for N identical nodes named
//! `NAME-0 … NAME-(N-1)`, so a 10,000-node cluster is a short file; such a
//! template cannot carry per-GPU state.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::FieldError;
use crate::catalog::{Catalog, GpuModel, MigProfile, MigSpec};
use crate::mig::{self, Geometry, Placement};
use crate::model::SharingMode;

/// The most memory a catalogue entry may give one GPU, GiB (about 100
/// TiB; the largest GPUs have under 300 GB).
pub const MAX_GPU_GIB: f64 = 100_000.0;

/// The most compute a catalogue entry may give one GPU, in H100-80GBs.
pub const MAX_GPU_COMPUTE: f64 = 1_000.0;

/// The highest price a catalogue entry may give one GPU, per hour.
pub const MAX_GPU_PRICE: f64 = 10_000.0;

/// The cluster file's spec.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// Overrides of, or additions to, the built-in GPU catalogue.
    #[serde(default)]
    pub catalog: Vec<GpuModelOverride>,
    /// The nodes.
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
}

/// Changes to one catalogue entry; a new model (not built in) gives `base`
/// or every field.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuModelOverride {
    /// Catalogue name (existing, to override; new, to add).
    pub name: String,
    /// For a new model: the built-in model to start from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// Total memory, GiB.
    #[serde(default, rename = "memoryGiB", skip_serializing_if = "Option::is_none")]
    pub memory_gib: Option<f64>,
    /// Usable memory of the whole GPU, GiB.
    #[serde(default, rename = "usableGiB", skip_serializing_if = "Option::is_none")]
    pub usable_gib: Option<f64>,
    /// Relative compute (1.0 = one H100-80GB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute: Option<f64>,
    /// Price per GPU-hour.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_per_hour: Option<f64>,
    /// `nvidia.com/gpu.product` label value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    /// Whether a node's GPUs of this model are joined by NVLink (SXM
    /// boards); a new model without `base` has none unless it says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<bool>,
    /// Usable memory per MIG profile name, GiB (e.g. read from
    /// `nvidia-smi mig -lgip`).
    #[serde(
        default,
        rename = "migUsableGiB",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub mig_usable_gib: BTreeMap<String, f64>,
    /// Share of the whole GPU's compute per MIG profile name, in (0, 1]:
    /// the instance's SMs over the GPU's with MIG off (the `SM` column of
    /// `nvidia-smi mig -lgip` over the GPU's SM count).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_compute_fraction: BTreeMap<String, f64>,
}

/// Health of a GPU.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// Usable.
    #[default]
    Healthy,
    /// Not usable (XID errors, ECC, fell off the bus): never placed on.
    Unhealthy,
}

/// How a GPU is configured now.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum GpuMode {
    /// Nothing configured, nothing running.
    #[default]
    Free,
    /// Used whole (one replica, or part of a tensor-parallel group).
    Whole,
    /// Shared by time-slicing.
    Timeslice,
    /// Partitioned with MIG (see `geometry`).
    Mig,
    /// Shared through MPS (the node's `mpsReplicas` equal partitions).
    Mps,
    /// Shared fractionally under HAMi (each workload its own memory and
    /// SM limits).
    Fractional,
}

/// One replica (or training worker) running on a GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Workload {
    /// Model policy name (or training job name).
    pub model: String,
    /// For MIG GPUs: the start slot of the instance it runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u8>,
}

/// A node's device-plugin config that time-slices one MIG profile: each
/// `nvidia.com/mig-<profile>` instance on the node is advertised as
/// `replicas` shares (mixed MIG strategy).
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigTimeslice {
    /// The MIG profile time-sliced (a plain profile, e.g. `1g.10gb`).
    pub profile: String,
    /// Shares per instance (at least 2).
    pub replicas: u8,
}

/// Current state of one GPU of a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuState {
    /// Index on the node (`nvidia-smi` order), from 0.
    pub index: u32,
    /// Health (default healthy).
    #[serde(default)]
    pub health: Health,
    /// Mode (default free).
    #[serde(default)]
    pub mode: GpuMode,
    /// MIG placements, for mode `mig`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub geometry: Vec<Placement>,
    /// What runs on it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workloads: Vec<Workload>,
    /// The GPU's UUID (`nvidia-smi -L`, `GPU-…`), when known: fractional
    /// variants are pinned to the GPUs the plan chose by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// A node (or, with `count`, a group of identical nodes).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeSpec {
    /// Node name (with `count`: the prefix).
    pub name: String,
    /// Identical nodes this entry stands for (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// `topology.kubernetes.io/zone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Rack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// NVLink domain (GPUs across nodes joined by NVLink, e.g. an NVL72).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_domain: Option<String>,
    /// Other node labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// GPU model of every GPU on the node (catalogue name).
    pub gpu_model: String,
    /// GPUs on the node.
    pub gpu_count: u32,
    /// The device plugin's time-slicing replica count configured on the
    /// node now, if it shares GPUs (default: the most workloads any of its
    /// time-sliced GPUs runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeslice_replicas: Option<u8>,
    /// The device plugin's MPS replica count configured on the node now, if
    /// it shares GPUs through MPS (default: the most workloads any of its
    /// MPS GPUs runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mps_replicas: Option<u8>,
    /// The MIG profile the node's device-plugin config time-slices now,
    /// and into how many shares (default: from the instances that run
    /// more than one workload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_timeslice: Option<MigTimeslice>,
    /// Sharing mechanisms the node may be configured for (default `[mig,
    /// timeslice, whole]`: what NVIDIA's GPU Operator does on any node).
    /// `mps` needs the device plugin's MPS support (v0.15+); `fractional`
    /// needs HAMi installed for the node (its device plugin replaces
    /// NVIDIA's there); `mig-timeslice` (MIG instances of one profile
    /// time-sliced) needs `mig` too. Whole GPUs are always allowed.
    #[serde(default = "node_sharing", skip_serializing_if = "is_default_sharing")]
    pub sharing: Vec<SharingMode>,
    /// HAMi's `deviceSplitCount` on the node: the most containers HAMi
    /// runs on one of its GPUs (it leaves the next Pending). Only with
    /// `fractional` in `sharing`. Default: the packer's
    /// (`gpuscale plan --hami-split-count`, 10 as HAMi's Helm chart).
    /// The Kubernetes inventory reads it from HAMi's
    /// `hami.io/node-nvidia-register` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hami_split_count: Option<u32>,
    /// State of GPUs that are not free and healthy (others default to that).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuState>,
}

/// A validated node.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Node name.
    pub name: String,
    /// Zone, rack, NVLink domain.
    pub zone: Option<String>,
    /// Rack.
    pub rack: Option<String>,
    /// NVLink domain.
    pub nvlink_domain: Option<String>,
    /// Other labels.
    pub labels: BTreeMap<String, String>,
    /// GPU model name.
    pub gpu_model: String,
    /// Time-slicing replica count configured now (see [`NodeSpec`]).
    pub timeslice_replicas: Option<u8>,
    /// MPS replica count configured now (see [`NodeSpec`]).
    pub mps_replicas: Option<u8>,
    /// The MIG profile time-sliced now (see [`NodeSpec`]).
    pub mig_timeslice: Option<MigTimeslice>,
    /// Sharing mechanisms allowed (see [`NodeSpec`]).
    pub sharing: Vec<SharingMode>,
    /// HAMi's containers per GPU on the node, when stated (see
    /// [`NodeSpec`]).
    pub hami_split_count: Option<u32>,
    /// Every GPU, by index.
    pub gpus: Vec<Gpu>,
}

/// A validated GPU with its current state.
#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    /// Index on the node.
    pub index: u32,
    /// Health.
    pub health: Health,
    /// Mode.
    pub mode: GpuMode,
    /// MIG geometry (empty unless mode is `mig`).
    pub geometry: Geometry,
    /// What runs on it.
    pub workloads: Vec<Workload>,
    /// UUID, when known.
    pub uuid: Option<String>,
}

impl Node {
    /// Whether the node may be configured for a sharing mode (whole GPUs
    /// always).
    pub fn allows(&self, mode: SharingMode) -> bool {
        mode == SharingMode::Whole || self.sharing.contains(&mode)
    }

    /// The node labels gpuscale knows the node by: its `labels`, its name
    /// (`kubernetes.io/hostname`), zone, rack and NVLink domain, and its
    /// GPUs' product (`nvidia.com/gpu.product`, from `catalog`).
    pub fn known_labels(&self, catalog: &Catalog) -> BTreeMap<String, String> {
        let mut out = self.labels.clone();
        out.insert(HOSTNAME_LABEL.into(), self.name.clone());
        for (key, value) in [
            (ZONE_LABEL, &self.zone),
            (RACK_LABEL, &self.rack),
            (NVLINK_DOMAIN_LABEL, &self.nvlink_domain),
        ] {
            if let Some(v) = value {
                out.insert(key.into(), v.clone());
            }
        }
        if let Some(gpu) = catalog.get(&self.gpu_model) {
            out.insert(PRODUCT_LABEL.into(), gpu.product.clone());
        }
        // NVIDIA's GPU nodes run Linux, and GPU Feature Discovery marks
        // them: a rule asking otherwise meets none.
        out.entry("kubernetes.io/os".into())
            .or_insert_with(|| "linux".into());
        out.entry("nvidia.com/gpu.present".into())
            .or_insert_with(|| "true".into());
        out
    }
}

/// Node labels gpuscale derives from a node's fields (its name, zone,
/// rack, NVLink domain and GPU model), with the field: a node's `labels`
/// may not set them apart.
pub const DERIVED_LABELS: [(&str, &str); 5] = [
    (HOSTNAME_LABEL, "name"),
    (ZONE_LABEL, "zone"),
    (RACK_LABEL, "rack"),
    (NVLINK_DOMAIN_LABEL, "nvlinkDomain"),
    (PRODUCT_LABEL, "gpuModel"),
];

/// The node label of a node's name.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The node label of a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// GPU Feature Discovery's label of a node's GPU product.
pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
/// The node label of a node's rack, which gang placement and Kueue's
/// topology-aware scheduling read for the `rack` level (no standard label
/// exists; `gpuscale.io/rack`, as the controller's inventory reads it).
pub const RACK_LABEL: &str = "gpuscale.io/rack";
/// The node label of a node's NVLink domain, written from the cluster's
/// `nvlinkDomain` where declared (Kueue's `nvlink-domain` level reads
/// it). gpuscale's own key: GPU Feature Discovery owns
/// `nvidia.com/gpu.clique` (`<cluster UUID>.<clique ID>` on multi-node
/// NVLink systems), which the controller's inventory reads where this one
/// is absent and never writes.
pub const NVLINK_DOMAIN_LABEL: &str = "gpuscale.io/nvlink-domain";

/// Most nodes one template (`count`) stands for: 160,000 GPUs of 8, twice
/// the packer's largest reference cluster.
pub const MAX_NODES_PER_TEMPLATE: u32 = 20_000;

/// The default of [`NodeSpec::sharing`].
pub fn node_sharing() -> Vec<SharingMode> {
    vec![SharingMode::Mig, SharingMode::Timeslice, SharingMode::Whole]
}

fn sharing_list(v: &[SharingMode]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

fn is_default_sharing(v: &[SharingMode]) -> bool {
    v == node_sharing().as_slice()
}

/// A validated cluster: nodes expanded, catalogue overrides applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Cluster {
    /// `metadata.name`.
    pub name: String,
    /// The catalogue with this cluster's overrides.
    pub catalog: Catalog,
    /// All nodes, templates expanded.
    pub nodes: Vec<Node>,
}

impl Cluster {
    /// Number of GPUs.
    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).sum()
    }

    /// Most GPUs of a model on any one node.
    pub fn max_gpus_per_node(&self, gpu_model: &str) -> u32 {
        self.nodes
            .iter()
            .filter(|n| n.gpu_model == gpu_model)
            .map(|n| n.gpus.len() as u32)
            .max()
            .unwrap_or(0)
    }

    /// Total GPUs of a model.
    pub fn gpus_of(&self, gpu_model: &str) -> u32 {
        self.nodes
            .iter()
            .filter(|n| n.gpu_model == gpu_model)
            .map(|n| n.gpus.len() as u32)
            .sum()
    }

    /// GPUs of a model on nodes that allow a sharing mode.
    pub fn gpus_allowing(&self, gpu_model: &str, mode: SharingMode) -> u32 {
        self.nodes
            .iter()
            .filter(|n| n.gpu_model == gpu_model && n.allows(mode))
            .map(|n| n.gpus.len() as u32)
            .sum()
    }

    /// GPUs of the largest node of a GPU model that allows a sharing mode
    /// (0 when none does).
    pub fn largest_node_allowing(&self, gpu_model: &str, mode: SharingMode) -> u32 {
        self.nodes
            .iter()
            .filter(|n| n.gpu_model == gpu_model && n.allows(mode))
            .map(|n| n.gpus.len() as u32)
            .max()
            .unwrap_or(0)
    }

    /// Validates a spec: applies catalogue overrides, expands node
    /// templates, and checks every GPU state. Every problem is reported.
    pub fn from_spec(
        name: &str,
        spec: &ClusterSpec,
        builtin: &Catalog,
    ) -> Result<Cluster, Vec<FieldError>> {
        let mut errors = Vec::new();
        let catalog = apply_overrides(builtin, &spec.catalog, &mut errors);
        let mut nodes = Vec::new();
        let mut names = BTreeSet::new();
        // GPU UUIDs across the cluster: HAMi pins a replica by UUID, and
        // two GPUs of one UUID would pin it to whichever the plugin finds.
        let mut uuids: BTreeMap<&str, String> = BTreeMap::new();
        for (i, n) in spec.nodes.iter().enumerate() {
            let path = format!("spec.nodes[{i}]");
            let gpu = catalog.get(&n.gpu_model);
            if gpu.is_none() {
                errors.push(FieldError::new(
                    format!("{path}.gpuModel"),
                    format!(
                        "unknown GPU model `{}`; the catalogue has: {}",
                        n.gpu_model,
                        catalog.names().join(", ")
                    ),
                ));
            }
            if n.gpu_count == 0 || n.gpu_count > 64 {
                errors.push(FieldError::new(
                    format!("{path}.gpuCount"),
                    format!("must be between 1 and 64, got {}", n.gpu_count),
                ));
                continue;
            }
            let count = n.count.unwrap_or(1);
            if count == 0 || count > MAX_NODES_PER_TEMPLATE {
                errors.push(FieldError::new(
                    format!("{path}.count"),
                    format!("must be between 1 and {MAX_NODES_PER_TEMPLATE}, got {count}"),
                ));
                continue;
            }
            if n.count.is_some() && !n.gpus.is_empty() {
                errors.push(FieldError::new(
                    format!("{path}.gpus"),
                    "a node template (`count`) cannot carry per-GPU state; list such nodes one by one",
                ));
            }
            // Zone, rack and NVLink domain are node label values
            // (`topology.kubernetes.io/zone`, and the rack and domain labels
            // `node-labels.yaml` sets), and `labels` are labels.
            for (field, v) in [
                ("zone", &n.zone),
                ("rack", &n.rack),
                ("nvlinkDomain", &n.nvlink_domain),
            ] {
                if let Some(v) = v {
                    let why = if v.is_empty() {
                        Some("must not be empty (leave the field out)".to_string())
                    } else {
                        crate::labels::value_problem(v)
                    };
                    if let Some(why) = why {
                        errors.push(FieldError::new(format!("{path}.{field}"), why));
                    }
                }
            }
            for (k, v) in &n.labels {
                let at = format!("{path}.labels.{}", crate::model::shown(k));
                if let Some(why) = crate::labels::key_problem(k) {
                    errors.push(FieldError::new(at, format!("the key {why}")));
                } else if let Some(field) = DERIVED_LABELS
                    .iter()
                    .find(|(key, _)| key == k)
                    .map(|(_, f)| f)
                {
                    errors.push(FieldError::new(
                        at,
                        format!(
                            "gpuscale labels the node so from its `{field}`; give that instead"
                        ),
                    ));
                } else if let Some(why) = crate::labels::value_problem(v) {
                    errors.push(FieldError::new(at, why));
                }
            }
            let configs = [
                n.timeslice_replicas.is_some(),
                n.mps_replicas.is_some(),
                n.mig_timeslice.is_some(),
            ];
            if configs.iter().filter(|&&c| c).count() > 1 {
                let field = if n.mig_timeslice.is_some() {
                    "migTimeslice"
                } else {
                    "mpsReplicas"
                };
                errors.push(FieldError::new(
                    format!("{path}.{field}"),
                    "a node has one device-plugin config: time-slicing (`timesliceReplicas`), MPS (`mpsReplicas`) or a time-sliced MIG profile (`migTimeslice`), not two",
                ));
            }
            if let Some(ts) = &n.mig_timeslice {
                check_mig_timeslice(n, ts, &path, gpu, &mut errors);
            } else if n.sharing.contains(&SharingMode::MigTimeslice)
                && !n.sharing.contains(&SharingMode::Mig)
            {
                errors.push(FieldError::new(
                    format!("{path}.sharing"),
                    format!(
                        "`mig-timeslice` time-slices MIG instances, so the node must allow `mig` too (its `sharing` is [{}])",
                        sharing_list(&n.sharing)
                    ),
                ));
            }
            for (field, v, mode) in [
                (
                    "timesliceReplicas",
                    n.timeslice_replicas,
                    SharingMode::Timeslice,
                ),
                ("mpsReplicas", n.mps_replicas, SharingMode::Mps),
            ] {
                if let Some(v) = v
                    && v < 2
                {
                    errors.push(FieldError::new(
                        format!("{path}.{field}"),
                        format!("must be at least 2 (shares per GPU), got {v}"),
                    ));
                } else if v.is_some() && !n.sharing.contains(&mode) {
                    // The device plugin's config says what the node runs:
                    // a plan would not share it that way, and would count
                    // its shares as free whole GPUs.
                    errors.push(FieldError::new(
                        format!("{path}.{field}"),
                        format!(
                            "is the node's device-plugin config, so the node must allow `{}` (its `sharing` is [{}])",
                            mode,
                            sharing_list(&n.sharing)
                        ),
                    ));
                }
            }
            if let Some(v) = n.hami_split_count {
                if !(1..=1000).contains(&v) {
                    errors.push(FieldError::new(
                        format!("{path}.hamiSplitCount"),
                        format!("must be between 1 and 1000 (HAMi's containers per GPU), got {v}"),
                    ));
                } else if !n.sharing.contains(&SharingMode::Fractional) {
                    errors.push(FieldError::new(
                        format!("{path}.hamiSplitCount"),
                        format!(
                            "is HAMi's deviceSplitCount, so the node must allow `fractional` (its `sharing` is [{}])",
                            sharing_list(&n.sharing)
                        ),
                    ));
                }
            }
            let gpus = validate_gpus(n, &path, gpu, &mut errors);
            let mig_timeslice = match &n.mig_timeslice {
                Some(ts) => Some(ts.clone()),
                None => crowded_instance(&gpus).unwrap_or_else(|e| {
                    errors.push(FieldError::new(format!("{path}.gpus"), e));
                    None
                }),
            };
            let shared_whole = gpus
                .iter()
                .any(|g| matches!(g.mode, GpuMode::Timeslice | GpuMode::Mps));
            let other_config =
                shared_whole || n.timeslice_replicas.is_some() || n.mps_replicas.is_some();
            if (n.mig_timeslice.is_none() && mig_timeslice.is_some() && other_config)
                || (n.mig_timeslice.is_some() && shared_whole)
            {
                errors.push(FieldError::new(
                    format!("{path}.gpus"),
                    "a node has one device-plugin config: it cannot share whole GPUs (time-slicing or MPS) and run several workloads on one MIG instance",
                ));
            }
            // Node names are Kubernetes node names (DNS-1123 subdomains):
            // they go into node selectors, affinities and the variant
            // names of Deployments pinned to a node.
            if let Some(why) = crate::load::check_name(&n.name) {
                errors.push(FieldError::new(format!("{path}.name"), why));
                continue;
            }
            for k in 0..count {
                let node_name = if n.count.is_some() {
                    format!("{}-{k}", n.name)
                } else {
                    n.name.clone()
                };
                if !names.insert(node_name.clone()) {
                    errors.push(FieldError::new(
                        format!("{path}.name"),
                        format!("node `{node_name}` is listed twice"),
                    ));
                    break;
                }
                // (A node written with `count` carries no per-GPU state:
                // said above.)
                for (j, g) in n.gpus.iter().enumerate().filter(|_| n.count.is_none()) {
                    let Some(u) = g.uuid.as_deref() else { continue };
                    let here = format!("node `{node_name}` GPU {}", g.index);
                    if let Some(first) = uuids.get(u) {
                        errors.push(FieldError::new(
                            format!("{path}.gpus[{j}].uuid"),
                            format!(
                                "`{}` is also the UUID of {first}: a GPU's UUID is its own (`nvidia-smi -L`)",
                                crate::model::shown(u),
                            ),
                        ));
                    } else {
                        uuids.insert(u, here);
                    }
                }
                nodes.push(Node {
                    name: node_name,
                    zone: n.zone.clone(),
                    rack: n.rack.clone(),
                    nvlink_domain: n.nvlink_domain.clone(),
                    labels: n.labels.clone(),
                    gpu_model: n.gpu_model.clone(),
                    timeslice_replicas: n.timeslice_replicas.or_else(|| {
                        gpus.iter()
                            .filter(|g| g.mode == GpuMode::Timeslice)
                            .map(|g| g.workloads.len() as u8)
                            .max()
                    }),
                    mps_replicas: n.mps_replicas.or_else(|| {
                        gpus.iter()
                            .filter(|g| g.mode == GpuMode::Mps)
                            .map(|g| g.workloads.len() as u8)
                            .max()
                    }),
                    mig_timeslice: mig_timeslice.clone(),
                    sharing: n.sharing.clone(),
                    hami_split_count: n.hami_split_count,
                    gpus: gpus.clone(),
                });
            }
        }
        if errors.is_empty() {
            Ok(Cluster {
                name: name.to_string(),
                catalog,
                nodes,
            })
        } else {
            Err(errors)
        }
    }
}

fn validate_gpus(
    n: &NodeSpec,
    path: &str,
    gpu: Option<&GpuModel>,
    errors: &mut Vec<FieldError>,
) -> Vec<Gpu> {
    let mut gpus: Vec<Gpu> = (0..n.gpu_count)
        .map(|index| Gpu {
            index,
            health: Health::Healthy,
            mode: GpuMode::Free,
            geometry: Geometry::default(),
            workloads: Vec::new(),
            uuid: None,
        })
        .collect();
    let mut seen = BTreeSet::new();
    for (j, g) in n.gpus.iter().enumerate() {
        let gp = format!("{path}.gpus[{j}]");
        if g.index >= n.gpu_count {
            errors.push(FieldError::new(
                format!("{gp}.index"),
                format!(
                    "GPU index {} is outside the node's {} GPUs (0..{})",
                    g.index,
                    n.gpu_count,
                    n.gpu_count - 1
                ),
            ));
            continue;
        }
        if !seen.insert(g.index) {
            errors.push(FieldError::new(
                format!("{gp}.index"),
                format!("GPU {} is listed twice", g.index),
            ));
            continue;
        }
        // The UUID goes into HAMi's comma-separated `use-gpuuuid`
        // annotation: one holding a comma would pin replicas to GPUs the
        // plan did not choose.
        if let Some(u) = &g.uuid
            && (u.is_empty()
                || u.len() > 128
                || !u.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        {
            errors.push(FieldError::new(
                format!("{gp}.uuid"),
                format!(
                    "`{}` is not a GPU UUID (letters, digits and `-`, at most 128, as `nvidia-smi -L` prints GPU-5fd4bd05-…)",
                    crate::model::shown(u)
                ),
            ));
        }
        match g.mode {
            GpuMode::Mig if !n.sharing.contains(&SharingMode::Mig) => {
                errors.push(FieldError::new(
                    format!("{gp}.mode"),
                    format!(
                        "the node does not allow `mig` (its `sharing` is [{}])",
                        sharing_list(&n.sharing)
                    ),
                ));
            }
            // (An unknown GPU model is said once, at `gpuModel`.)
            GpuMode::Mig if gpu.is_none() => {}
            GpuMode::Mig => match gpu.and_then(|m| m.mig.as_ref()) {
                None => errors.push(FieldError::new(
                    format!("{gp}.mode"),
                    format!("{} does not support MIG", n.gpu_model),
                )),
                Some(spec) => {
                    if let Err(e) = mig::validate(spec, &g.geometry) {
                        errors.push(FieldError::new(format!("{gp}.geometry"), e.to_string()));
                    }
                    let mut on: BTreeMap<u8, usize> = BTreeMap::new();
                    for (w, wl) in g.workloads.iter().enumerate() {
                        let instance = wl
                            .slot
                            .and_then(|s| g.geometry.iter().find(|p| p.start == s));
                        let Some(instance) = instance else {
                            errors.push(FieldError::new(
                                format!("{gp}.workloads[{w}].slot"),
                                "a workload on a MIG GPU names the start slot of one of its instances",
                            ));
                            continue;
                        };
                        let here = on.entry(instance.start).or_insert(0);
                        *here += 1;
                        if *here > 1 {
                            let shares = n
                                .mig_timeslice
                                .as_ref()
                                .filter(|ts| ts.profile == plain(&instance.profile))
                                .map(|ts| usize::from(ts.replicas));
                            let problem = match shares {
                                Some(k) if *here > k => Some(format!(
                                    "instance {} at slot {} runs {} workloads, more than the node's `migTimeslice.replicas` ({k})",
                                    instance.profile, instance.start, here
                                )),
                                Some(_) => None,
                                None if n.mig_timeslice.is_some() => Some(format!(
                                    "instance {} at slot {} runs more than one workload, but the node time-slices only {}",
                                    instance.profile,
                                    instance.start,
                                    n.mig_timeslice.as_ref().map_or("", |t| t.profile.as_str())
                                )),
                                None if !n.sharing.contains(&SharingMode::MigTimeslice) => {
                                    Some(format!(
                                        "instance {} at slot {} runs more than one workload: a MIG instance runs one unless the node allows `mig-timeslice` (its `sharing` is [{}])",
                                        instance.profile,
                                        instance.start,
                                        sharing_list(&n.sharing)
                                    ))
                                }
                                None => None,
                            };
                            if let Some(problem) = problem {
                                errors.push(FieldError::new(
                                    format!("{gp}.workloads[{w}].slot"),
                                    problem,
                                ));
                            }
                        }
                    }
                }
            },
            _ if !g.geometry.is_empty() => errors.push(FieldError::new(
                format!("{gp}.geometry"),
                "a geometry is only for mode `mig`",
            )),
            GpuMode::Free if !g.workloads.is_empty() => errors.push(FieldError::new(
                format!("{gp}.workloads"),
                "a free GPU runs nothing: set mode to whole, timeslice or mig",
            )),
            GpuMode::Whole if g.workloads.len() > 1 => errors.push(FieldError::new(
                format!("{gp}.workloads"),
                "a GPU used whole runs one workload; use mode timeslice to share it",
            )),
            GpuMode::Timeslice | GpuMode::Mps | GpuMode::Fractional => {
                let needs = match g.mode {
                    GpuMode::Timeslice => SharingMode::Timeslice,
                    GpuMode::Mps => SharingMode::Mps,
                    _ => SharingMode::Fractional,
                };
                if !n.sharing.contains(&needs) {
                    errors.push(FieldError::new(
                        format!("{gp}.mode"),
                        format!(
                            "the node does not allow `{needs}` (its `sharing` is [{}])",
                            sharing_list(&n.sharing)
                        ),
                    ));
                }
            }
            _ => {}
        }
        gpus[g.index as usize] = Gpu {
            index: g.index,
            health: g.health,
            mode: g.mode,
            geometry: Geometry::new(g.geometry.clone()),
            workloads: g.workloads.clone(),
            uuid: g.uuid.clone(),
        };
    }
    gpus
}

/// A MIG profile without its `+me` (media extensions) suffix: the device
/// plugin serves such an instance as its plain profile's resource, so it
/// is time-sliced with it.
pub(crate) fn plain(profile: &str) -> &str {
    profile.trim_end_matches("+me")
}

/// Checks a node's `migTimeslice`: the node allows it (and MIG), the GPU
/// model has that plain profile, and at least two shares.
fn check_mig_timeslice(
    n: &NodeSpec,
    ts: &MigTimeslice,
    path: &str,
    gpu: Option<&GpuModel>,
    errors: &mut Vec<FieldError>,
) {
    for needs in [SharingMode::MigTimeslice, SharingMode::Mig] {
        if !n.sharing.contains(&needs) {
            errors.push(FieldError::new(
                format!("{path}.migTimeslice"),
                format!(
                    "the node does not allow `{needs}` (its `sharing` is [{}])",
                    sharing_list(&n.sharing)
                ),
            ));
        }
    }
    if ts.replicas < 2 {
        errors.push(FieldError::new(
            format!("{path}.migTimeslice.replicas"),
            format!(
                "must be at least 2 (shares per instance), got {}",
                ts.replicas
            ),
        ));
    }
    if let Some(gpu) = gpu {
        let profiles: Vec<&str> = gpu
            .mig
            .iter()
            .flat_map(|m| m.profiles.iter())
            .filter(|p| !p.media_extensions)
            .map(|p| p.name.as_str())
            .collect();
        if !profiles.contains(&ts.profile.as_str()) {
            errors.push(FieldError::new(
                format!("{path}.migTimeslice.profile"),
                if profiles.is_empty() {
                    format!("{} does not support MIG", gpu.name)
                } else {
                    format!(
                        "`{}` is not a MIG profile of {} (without `+me`): {}",
                        ts.profile,
                        gpu.name,
                        profiles.join(", ")
                    )
                },
            ));
        }
    }
}

/// The time-slicing a node's MIG GPUs show when its spec does not say:
/// the profile of the instances running more than one workload, and the
/// most any of them runs (`None` when no instance runs two); an error when
/// they are of different profiles, which no one config serves.
fn crowded_instance(gpus: &[Gpu]) -> Result<Option<MigTimeslice>, String> {
    let mut found: Option<MigTimeslice> = None;
    for g in gpus.iter().filter(|g| g.mode == GpuMode::Mig) {
        for p in g.geometry.placements() {
            let k = g
                .workloads
                .iter()
                .filter(|w| w.slot == Some(p.start))
                .count();
            if k < 2 {
                continue;
            }
            // A `+me` instance is served as its plain profile's resource.
            let profile = plain(&p.profile);
            match &mut found {
                Some(f) if f.profile == profile => f.replicas = f.replicas.max(k as u8),
                Some(f) => {
                    return Err(format!(
                        "instances of {} and of {profile} run several workloads each, but a node's device-plugin config time-slices one MIG profile",
                        f.profile
                    ));
                }
                None => {
                    found = Some(MigTimeslice {
                        profile: profile.to_string(),
                        replicas: k as u8,
                    })
                }
            }
        }
    }
    Ok(found)
}

fn apply_overrides(
    builtin: &Catalog,
    overrides: &[GpuModelOverride],
    errors: &mut Vec<FieldError>,
) -> Catalog {
    let mut catalog = builtin.clone();
    let mut named = BTreeSet::new();
    for (i, o) in overrides.iter().enumerate() {
        let path = format!("spec.catalog[{i}]");
        if o.name.trim().is_empty() {
            errors.push(FieldError::new(format!("{path}.name"), "must not be empty"));
            continue;
        }
        if !named.insert(o.name.as_str()) {
            errors.push(FieldError::new(
                format!("{path}.name"),
                format!(
                    "`{}` is overridden twice; give one entry per GPU model",
                    o.name
                ),
            ));
            continue;
        }
        let start = match (&o.base, builtin.get(&o.name)) {
            (Some(base), _) => match builtin.get(base) {
                Some(b) => Some(b.clone()),
                None => {
                    errors.push(FieldError::new(
                        format!("{path}.base"),
                        format!(
                            "unknown base model `{base}`; built in: {}",
                            builtin.names().join(", ")
                        ),
                    ));
                    continue;
                }
            },
            (None, Some(existing)) => Some(existing.clone()),
            (None, None) => None,
        };
        let mut model = match start {
            Some(m) => m,
            None => match (o.memory_gib, o.compute, o.price_per_hour) {
                (Some(memory_gib), Some(compute), Some(price_per_hour)) => GpuModel {
                    name: o.name.clone(),
                    memory_gib,
                    usable_gib: o.usable_gib.unwrap_or(memory_gib - 0.4),
                    compute,
                    price_per_hour,
                    product: o.product.clone().unwrap_or_else(|| o.name.clone()),
                    mig: None,
                    nvlink: false,
                },
                _ => {
                    errors.push(FieldError::new(
                        path.clone(),
                        format!(
                            "`{}` is not a built-in model: give `base`, or memoryGiB, compute and pricePerHour",
                            o.name
                        ),
                    ));
                    continue;
                }
            },
        };
        model.name = o.name.clone();
        // Above `max`: beyond any GPU there is (a unit in bytes or MiB,
        // an exponent), which would reach the solver as a 300-digit cost.
        let mut number = |field: &str, v: Option<f64>, max: f64, target: &mut f64| {
            if let Some(v) = v {
                if v > 0.0 && v.is_finite() && v <= max {
                    *target = v;
                } else if v > max && v.is_finite() {
                    errors.push(FieldError::new(
                        format!("{path}.{field}"),
                        format!("{v:e} is beyond {max} for one GPU; check the unit"),
                    ));
                } else {
                    errors.push(FieldError::new(
                        format!("{path}.{field}"),
                        format!("must be > 0, got {v}"),
                    ));
                }
            }
        };
        number(
            "memoryGiB",
            o.memory_gib,
            MAX_GPU_GIB,
            &mut model.memory_gib,
        );
        number(
            "usableGiB",
            o.usable_gib,
            MAX_GPU_GIB,
            &mut model.usable_gib,
        );
        number("compute", o.compute, MAX_GPU_COMPUTE, &mut model.compute);
        number(
            "pricePerHour",
            o.price_per_hour,
            MAX_GPU_PRICE,
            &mut model.price_per_hour,
        );
        if let Some(p) = &o.product {
            model.product = p.clone();
        }
        if let Some(nvlink) = o.nvlink {
            model.nvlink = nvlink;
        }
        if model.usable_gib <= 0.0 {
            errors.push(FieldError::new(
                format!("{path}.usableGiB"),
                format!(
                    "usable memory would be {} GiB (memoryGiB less the 0.4 GiB the driver keeps): give memoryGiB above 0.4, or usableGiB",
                    model.usable_gib
                ),
            ));
        }
        if model.usable_gib > model.memory_gib {
            errors.push(FieldError::new(
                format!("{path}.usableGiB"),
                format!(
                    "usable memory ({}) exceeds total memory ({})",
                    model.usable_gib, model.memory_gib
                ),
            ));
        }
        let fractions = o.mig_compute_fraction.iter().map(|(p, &f)| (p, f, true));
        for (profile, value, is_fraction) in o
            .mig_usable_gib
            .iter()
            .map(|(p, &g)| (p, g, false))
            .chain(fractions)
        {
            let field = if is_fraction {
                format!("{path}.migComputeFraction.{profile}")
            } else {
                format!("{path}.migUsableGiB.{profile}")
            };
            if is_fraction && !(value > 0.0 && value <= 1.0) {
                errors.push(FieldError::new(
                    field,
                    format!("must be in (0, 1] (the instance's SMs over the GPU's), got {value}"),
                ));
                continue;
            }
            // An instance holds at most its memory slots' share of the
            // GPU's memory: a 3g.40gb slice given 500 GiB had a 53 GiB
            // model planned into it.
            if !is_fraction
                && let Some(spec) = model.mig.as_ref()
                && let Some(p) = spec.profile(profile)
            {
                let most = model.memory_gib * f64::from(p.memory_slots)
                    / f64::from(spec.memory_slots.max(1));
                if !(value > 0.0 && value <= most) {
                    errors.push(FieldError::new(
                        field,
                        format!(
                            "must be more than 0 and at most {most:.2} GiB ({} of {}'s {} memory slots of {} GiB), got {value}",
                            p.memory_slots, o.name, spec.memory_slots, model.memory_gib
                        ),
                    ));
                    continue;
                }
            }
            match model.mig.as_mut().map(|m: &mut MigSpec| {
                m.profiles
                    .iter_mut()
                    .filter(|p: &&mut MigProfile| p.name == *profile)
                    .collect::<Vec<_>>()
            }) {
                None => errors.push(FieldError::new(field, format!("{} has no MIG", o.name))),
                Some(found) if found.is_empty() => errors.push(FieldError::new(
                    field,
                    format!("{} has no MIG profile `{profile}`", o.name),
                )),
                Some(found) => {
                    for p in found {
                        if is_fraction {
                            p.compute_fraction = value;
                        } else {
                            p.usable_gib = value;
                        }
                    }
                }
            }
        }
        catalog.insert(model);
    }
    catalog
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, gpus: Vec<GpuState>) -> NodeSpec {
        NodeSpec {
            name: name.into(),
            count: None,
            zone: None,
            rack: None,
            nvlink_domain: None,
            labels: BTreeMap::new(),
            gpu_model: "H100-80GB".into(),
            gpu_count: 8,
            timeslice_replicas: None,
            mps_replicas: None,
            mig_timeslice: None,
            sharing: node_sharing(),
            hami_split_count: None,
            gpus,
        }
    }

    #[test]
    fn templates_expand_and_states_default_to_free() {
        let mut template = node("h100", vec![]);
        template.count = Some(3);
        let spec = ClusterSpec {
            catalog: vec![],
            nodes: vec![template],
        };
        let c = Cluster::from_spec("c", &spec, &Catalog::builtin()).unwrap();
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.nodes[2].name, "h100-2");
        assert_eq!(c.gpu_count(), 24);
        assert!(c.nodes[0].gpus.iter().all(|g| g.mode == GpuMode::Free));
    }

    #[test]
    fn bad_gpu_states_are_all_reported() {
        let state = |index, mode, geometry: Vec<Placement>, workloads: Vec<Workload>| GpuState {
            index,
            health: Health::Healthy,
            mode,
            geometry,
            workloads,
            uuid: None,
        };
        let spec = ClusterSpec {
            catalog: vec![],
            nodes: vec![node(
                "n",
                vec![
                    state(9, GpuMode::Free, vec![], vec![]),
                    state(0, GpuMode::Mig, vec![Placement::new("2g.20gb", 6)], vec![]),
                    state(
                        1,
                        GpuMode::Free,
                        vec![],
                        vec![Workload {
                            model: "x".into(),
                            slot: None,
                        }],
                    ),
                ],
            )],
        };
        let errors = Cluster::from_spec("c", &spec, &Catalog::builtin()).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.nodes[0].gpus[0].index",
                "spec.nodes[0].gpus[1].geometry",
                "spec.nodes[0].gpus[2].workloads"
            ]
        );
        assert!(errors[1].message.contains("cannot start at slot 6"));
    }

    #[test]
    fn a_node_runs_only_the_sharing_it_allows_and_one_device_plugin_config() {
        let state = |index, mode| GpuState {
            index,
            health: Health::Healthy,
            mode,
            geometry: vec![],
            workloads: vec![],
            uuid: None,
        };
        let mut n = node(
            "n",
            vec![
                state(0, GpuMode::Fractional),
                state(1, GpuMode::Mps),
                state(2, GpuMode::Timeslice),
                state(3, GpuMode::Mig),
            ],
        );
        n.sharing = vec![SharingMode::Timeslice];
        n.timeslice_replicas = Some(2);
        n.mps_replicas = Some(1);
        let spec = ClusterSpec {
            catalog: vec![],
            nodes: vec![n],
        };
        let errors = Cluster::from_spec("c", &spec, &Catalog::builtin()).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.nodes[0].mpsReplicas",
                "spec.nodes[0].mpsReplicas",
                "spec.nodes[0].gpus[0].mode",
                "spec.nodes[0].gpus[1].mode",
                "spec.nodes[0].gpus[3].mode"
            ],
            "{errors:?}"
        );
        assert!(errors[2].message.contains("does not allow `fractional`"));
        assert!(errors[4].message.contains("does not allow `mig`"));

        // A UUID that would add a GPU to HAMi's pinning annotation.
        let mut n = node("n", vec![]);
        n.gpus = vec![GpuState {
            uuid: Some("GPU-a,GPU-b".into()),
            ..state(0, GpuMode::Free)
        }];
        let spec = ClusterSpec {
            catalog: vec![],
            nodes: vec![n],
        };
        let errors = Cluster::from_spec("c", &spec, &Catalog::builtin()).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "spec.nodes[0].gpus[0].uuid");

        // One UUID on two GPUs (of two nodes): said where it repeats. A
        // node that stands for several (`count`) has no per-GPU state at
        // all, which is said instead.
        let with_uuids = |name: &str, uuids: &[(u32, &str)]| {
            let mut n = node(name, vec![]);
            n.gpus = uuids
                .iter()
                .map(|&(i, u)| GpuState {
                    uuid: Some(u.into()),
                    ..state(i, GpuMode::Free)
                })
                .collect();
            n
        };
        let mut counted = with_uuids("pool", &[(0, "GPU-c")]);
        counted.count = Some(3);
        let spec = ClusterSpec {
            catalog: vec![],
            nodes: vec![
                with_uuids("a", &[(0, "GPU-a"), (1, "GPU-b")]),
                with_uuids("b", &[(0, "GPU-x"), (1, "GPU-a")]),
                counted,
            ],
        };
        let errors = Cluster::from_spec("c", &spec, &Catalog::builtin()).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            ["spec.nodes[1].gpus[1].uuid", "spec.nodes[2].gpus"],
            "{errors:?}"
        );
        assert!(
            errors[0].message.contains("node `a` GPU 0"),
            "{}",
            errors[0].message
        );

        // A device-plugin config for sharing the node does not allow.
        for (ts, mps, field, mode) in [
            (None, Some(4), "mpsReplicas", "mps"),
            (Some(3), None, "timesliceReplicas", "timeslice"),
        ] {
            let mut n = node("n", vec![]);
            n.sharing = vec![SharingMode::Mig, SharingMode::Whole];
            n.timeslice_replicas = ts;
            n.mps_replicas = mps;
            let spec = ClusterSpec {
                catalog: vec![],
                nodes: vec![n],
            };
            let errors = Cluster::from_spec("c", &spec, &Catalog::builtin()).unwrap_err();
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(errors[0].path, format!("spec.nodes[0].{field}"));
            assert!(
                errors[0].message.contains(&format!("must allow `{mode}`")),
                "{}",
                errors[0].message
            );
        }
    }

    fn mig_gpu(index: u32, workloads: &[(&str, u8)]) -> GpuState {
        GpuState {
            index,
            health: Health::Healthy,
            mode: GpuMode::Mig,
            geometry: vec![Placement::new("3g.40gb", 4), Placement::new("1g.10gb", 0)],
            workloads: workloads
                .iter()
                .map(|&(model, slot)| Workload {
                    model: model.into(),
                    slot: Some(slot),
                })
                .collect(),
            uuid: None,
        }
    }

    fn one_node(n: NodeSpec) -> Result<Cluster, Vec<FieldError>> {
        let spec = ClusterSpec {
            catalog: vec![],
            nodes: vec![n],
        };
        Cluster::from_spec("c", &spec, &Catalog::builtin())
    }

    #[test]
    fn a_mig_instance_runs_one_workload_unless_its_profile_is_time_sliced() {
        // Two on one 1g.10gb instance: only where the node allows it.
        let n = node("n", vec![mig_gpu(0, &[("a", 0), ("b", 0)])]);
        let errors = one_node(n.clone()).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "spec.nodes[0].gpus[0].workloads[1].slot");
        assert!(errors[0].message.contains("`mig-timeslice`"), "{errors:?}");

        // Allowed, the node's config is read from what runs.
        let mut allowed = n.clone();
        allowed.sharing.push(SharingMode::MigTimeslice);
        let cluster = one_node(allowed.clone()).unwrap();
        assert_eq!(
            cluster.nodes[0].mig_timeslice,
            Some(MigTimeslice {
                profile: "1g.10gb".into(),
                replicas: 2
            })
        );

        // Stated: more than its replicas, or another profile, is an error.
        let mut stated = allowed.clone();
        stated.gpus = vec![mig_gpu(
            0,
            &[("a", 0), ("b", 0), ("c", 0), ("d", 4), ("e", 4)],
        )];
        stated.mig_timeslice = Some(MigTimeslice {
            profile: "1g.10gb".into(),
            replicas: 2,
        });
        let errors = one_node(stated).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.nodes[0].gpus[0].workloads[2].slot",
                "spec.nodes[0].gpus[0].workloads[4].slot"
            ],
            "{errors:?}"
        );
        assert!(
            errors[0]
                .message
                .contains("more than the node's `migTimeslice.replicas` (2)")
        );
        assert!(errors[1].message.contains("time-slices only 1g.10gb"));
    }

    #[test]
    fn a_media_extensions_instance_is_time_sliced_with_its_plain_profile() {
        // The device plugin serves 1g.10gb+me as nvidia.com/mig-1g.10gb.
        let gpu = GpuState {
            geometry: vec![
                Placement::new("1g.10gb+me", 0),
                Placement::new("1g.10gb", 1),
            ],
            ..mig_gpu(0, &[("a", 0), ("b", 0), ("c", 1), ("d", 1)])
        };
        let mut n = node("n", vec![gpu]);
        n.sharing.push(SharingMode::MigTimeslice);
        let read = one_node(n.clone()).unwrap();
        assert_eq!(
            read.nodes[0].mig_timeslice,
            Some(MigTimeslice {
                profile: "1g.10gb".into(),
                replicas: 2
            })
        );
        n.mig_timeslice = read.nodes[0].mig_timeslice.clone();
        one_node(n).unwrap();
    }

    #[test]
    fn mig_timeslice_without_mig_is_refused() {
        let mut n = node("n", vec![]);
        n.sharing = vec![SharingMode::MigTimeslice, SharingMode::Whole];
        let errors = one_node(n).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].path, "spec.nodes[0].sharing");
        assert!(errors[0].message.contains("must allow `mig`"));
    }

    #[test]
    fn a_mig_timeslice_config_names_a_profile_the_node_may_time_slice() {
        let mut n = node("n", vec![]);
        n.mig_timeslice = Some(MigTimeslice {
            profile: "1g.5gb".into(),
            replicas: 1,
        });
        n.timeslice_replicas = Some(2);
        let errors = one_node(n).unwrap_err();
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.nodes[0].migTimeslice",
                "spec.nodes[0].migTimeslice",
                "spec.nodes[0].migTimeslice.replicas",
                "spec.nodes[0].migTimeslice.profile"
            ],
            "{errors:?}"
        );
        assert!(errors[0].message.contains("one device-plugin config"));
        assert!(errors[1].message.contains("does not allow `mig-timeslice`"));
        assert!(
            errors[3].message.contains("1g.10gb"),
            "{}",
            errors[3].message
        );
    }

    #[test]
    fn overrides_change_prices_and_mig_memory() {
        let spec = ClusterSpec {
            catalog: vec![
                GpuModelOverride {
                    name: "H100-80GB".into(),
                    price_per_hour: Some(2.0),
                    mig_usable_gib: [("1g.10gb".to_string(), 9.5)].into(),
                    mig_compute_fraction: [("4g.40gb".to_string(), 0.5)].into(),
                    ..Default::default()
                },
                GpuModelOverride {
                    name: "H100-80GB-custom".into(),
                    base: Some("H100-80GB".into()),
                    compute: Some(0.9),
                    ..Default::default()
                },
            ],
            nodes: vec![],
        };
        let c = Cluster::from_spec("c", &spec, &Catalog::builtin()).unwrap();
        let h = c.catalog.get("H100-80GB").unwrap();
        assert_eq!(h.price_per_hour, 2.0);
        assert_eq!(
            h.mig
                .as_ref()
                .unwrap()
                .profile("1g.10gb")
                .unwrap()
                .usable_gib,
            9.5
        );
        let mig = h.mig.as_ref().unwrap();
        assert_eq!(mig.profile("4g.40gb").unwrap().compute(3.0), 1.5);
        assert!((mig.profile("3g.40gb").unwrap().compute_fraction - 60.0 / 132.0).abs() < 1e-12);
        assert_eq!(c.catalog.get("H100-80GB-custom").unwrap().compute, 0.9);
    }

    /// Node names are Kubernetes node names: they reach node selectors,
    /// affinities and pinned variants' Deployment names.
    #[test]
    fn a_node_name_kubernetes_would_refuse_is_refused() {
        for bad in ["H100 Node #1", "a/b", "", "gpu_0"] {
            let errors = one_node(node(bad, vec![])).err().unwrap_or_default();
            assert!(
                errors.iter().any(|e| e.path == "spec.nodes[0].name"),
                "{bad:?}: {errors:?}"
            );
        }
        assert!(one_node(node("gpu-a.rack-1", vec![])).is_ok());
    }

    /// Overrides that planned a model into a slice it does not fit, or
    /// gave a GPU negative usable memory, are refused at their field.
    #[test]
    fn overrides_beyond_the_gpu_are_refused() {
        let fields = |catalog: Vec<GpuModelOverride>| -> Vec<String> {
            let spec = ClusterSpec {
                catalog,
                nodes: vec![],
            };
            Cluster::from_spec("c", &spec, &Catalog::builtin())
                .err()
                .unwrap_or_default()
                .into_iter()
                .map(|e| e.path)
                .collect()
        };
        let h100 = |profile: &str, gib: f64| GpuModelOverride {
            name: "H100-80GB".into(),
            mig_usable_gib: [(profile.to_string(), gib)].into(),
            ..Default::default()
        };
        assert_eq!(
            fields(vec![h100("3g.40gb", 500.0)]),
            ["spec.catalog[0].migUsableGiB.3g.40gb"]
        );
        assert_eq!(
            fields(vec![h100("1g.10gb", -5.0)]),
            ["spec.catalog[0].migUsableGiB.1g.10gb"]
        );
        // 4 of 8 memory slots of 80 GiB: 40 at most.
        assert!(fields(vec![h100("3g.40gb", 39.5)]).is_empty());
        assert_eq!(
            fields(vec![GpuModelOverride {
                name: "TinyGPU".into(),
                memory_gib: Some(0.1),
                compute: Some(1.0),
                price_per_hour: Some(1.0),
                ..Default::default()
            }]),
            ["spec.catalog[0].usableGiB"]
        );
        assert_eq!(
            fields(vec![GpuModelOverride {
                name: "".into(),
                ..Default::default()
            }]),
            ["spec.catalog[0].name"]
        );
        let price = |p: f64| GpuModelOverride {
            name: "H100-80GB".into(),
            price_per_hour: Some(p),
            ..Default::default()
        };
        assert_eq!(
            fields(vec![price(2.0), price(3.0)]),
            ["spec.catalog[1].name"]
        );
    }

    #[test]
    fn a_mig_compute_fraction_is_a_share_of_the_gpu() {
        for (value, ok) in [(0.0, false), (1.2, false), (f64::NAN, false), (1.0, true)] {
            let spec = ClusterSpec {
                catalog: vec![GpuModelOverride {
                    name: "B200".into(),
                    mig_compute_fraction: [("1g.23gb".to_string(), value)].into(),
                    ..Default::default()
                }],
                nodes: vec![],
            };
            let got = Cluster::from_spec("c", &spec, &Catalog::builtin());
            match got {
                Ok(_) => assert!(ok, "{value} accepted"),
                Err(errors) => {
                    assert!(!ok, "{value} refused: {errors:?}");
                    assert_eq!(errors[0].path, "spec.catalog[0].migComputeFraction.1g.23gb");
                    assert!(
                        errors[0].message.contains("(0, 1]"),
                        "{}",
                        errors[0].message
                    );
                }
            }
        }
    }
}
