//! The packer's inventory in Kubernetes, from the nodes themselves
//! (pure): GPU Feature Discovery's labels say what each node has, the
//! node agent's NVML readings ([`gpuscale_policies::devices`]) say how its
//! GPUs are set up now, and the node's conditions say whether it is up.
//!
//! | source | gives |
//! |---|---|
//! | `nvidia.com/gpu.product` (GFD; `-MIG-…` and `-SHARED` suffixes dropped) | the catalogue model, by its `product` |
//! | `nvidia.com/gpu.count` | GPUs on the node |
//! | `nvidia.com/gpu.memory` (MiB) | checked against the catalogue model |
//! | `nvidia.com/mig.config`, `nvidia.com/mig.config.state` | whether MIG geometries are set (and settled) |
//! | `topology.kubernetes.io/zone`, `gpuscale.io/rack`, `gpuscale.io/nvlink-domain` (else GFD's `nvidia.com/gpu.clique`) | zone, rack, NVLink domain |
//! | annotation `gpuscale.io/sharing` (`mig, timeslice, whole`) | the sharing the node may be set up for (default `mig, whole`: what the controller sets up itself) |
//! | condition `Ready` | a node not ready has no usable GPU |
//! | the agent's reading | per GPU: UUID, MIG mode and instances with their start slots, uncorrectable ECC errors, memory the driver reserves, the MIG profiles' measured memory |
//! | annotation `hami.io/node-nvidia-register` (HAMi's device plugin: per GPU `UUID,count,MiB,cores,type,numa,health[,mode,index]:`, or a JSON list with `count`) | HAMi's `deviceSplitCount` on the node, its fewest `count` (only where the node may be `fractional`; at most 1000; without one, the packer's `spec.packer.hamiSplitCount`) |
//! | label `nvidia.com/device-plugin.config` (`timeslice-N`, `mps-N`, `mig-<profile>-timeslice-N`: the names gpuscale writes) | how many shares the device plugin makes of each GPU or instance now |
//! | any other pod bound to the node that holds GPU devices (training workers, other teams' servers; all namespaces) | the GPU it most likely holds (a free one for whole GPUs; for a MIG instance or a share, a GPU set up for it with the fewest of gpuscale's replicas) marked unhealthy, with a note naming the pod: never planned on, never set up again |
//! | gpuscale's pods (`gpuscale.io/model`, `spec.nodeName`, device limits, HAMi's annotations) | what runs where ([`Held`]): `nvidia.com/mig-<profile>` an instance of that profile, `nvidia.com/mig-<profile>.shared` a share of one and `nvidia.com/gpu.shared` a share of a time-sliced or MPS GPU (the least shared, as the device plugin hands replicas out), `nvidia.com/gpu: N` with HAMi's `nvidia.com/gpumem` (or `-percentage`) a fractional share of N GPUs (where HAMi's `hami.io/vgpu-devices-allocated` says, else as its binpack would), `nvidia.com/gpu: N` alone N whole GPUs |
//!
//! Where a reading measures less memory than the catalogue assumes (a
//! whole GPU's total less the driver's reservation, or a MIG profile's
//! instance memory), the inventory lowers the catalogue entry to the
//! lowest reading of that model (an override in the spec's `catalog`) and
//! notes it: a replica planned into room that is not there crashes with an
//! out-of-memory error. A reading never raises the catalogue.
//!
//! A GPU whose set-up cannot be known (MIG configured and no reading of
//! its instances' placements) is marked unhealthy, so the packer never
//! places on it, and the node is listed with the reason.

use std::collections::BTreeMap;

use gpuscale_policies::devices::NodeGpus;
use gpuscale_policies::inventory::{GpuModelOverride, GpuState, MigTimeslice, NodeSpec, Workload};
use gpuscale_policies::mig::Placement;
use gpuscale_policies::{Catalog, ClusterSpec, GpuMode, Health, SharingMode};
use k8s_openapi::api::core::v1::{Node, Pod};

/// GFD's product label.
pub const PRODUCT: &str = "nvidia.com/gpu.product";
/// GFD's GPU count label.
pub const COUNT: &str = "nvidia.com/gpu.count";
/// GFD's memory label (MiB).
pub const MEMORY: &str = "nvidia.com/gpu.memory";
/// GFD's NVLink clique label (multi-node NVLink domains).
pub const CLIQUE: &str = "nvidia.com/gpu.clique";
/// The standard zone label.
pub const ZONE: &str = "topology.kubernetes.io/zone";
/// The rack label gpuscale reads (there is no standard one).
pub const RACK: &str = gpuscale_packer::emit::RACK_LABEL;
/// The annotation listing the sharing a node may be set up for.
pub const SHARING: &str = "gpuscale.io/sharing";
/// HAMi's device plugin's record of the node's GPUs.
pub const HAMI_REGISTER: &str = "hami.io/node-nvidia-register";
/// HAMi's `deviceSplitCount` when a node does not say (its Helm chart's
/// `devicePlugin.deviceSplitCount`).
pub const HAMI_DEFAULT_SPLIT_COUNT: u32 = 10;
/// The most containers per GPU the inventory passes on (a cluster file's
/// `hamiSplitCount` is at most this; a larger count from HAMi is clamped,
/// with a note, rather than fail the whole inventory).
pub const MAX_HAMI_SPLIT_COUNT: u32 = 1000;

/// The inventory built from the nodes, and the nodes left out or
/// degraded, with why.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FromNodes {
    /// The cluster spec, to validate with `Cluster::from_spec`.
    pub spec: ClusterSpec,
    /// (node, why) for each node left out or with GPUs not placed on.
    pub notes: Vec<(String, String)>,
}

/// The catalogue model whose product label is `product` (GFD's, with the
/// suffixes it adds under MIG's single strategy and under sharing
/// removed).
pub fn model_of_product<'c>(catalog: &'c Catalog, product: &str) -> Option<&'c str> {
    let mut p = product;
    if let Some((base, _)) = p.split_once("-MIG-") {
        p = base;
    }
    p = p.strip_suffix("-SHARED").unwrap_or(p);
    catalog
        .models()
        .find(|g| g.product == p)
        .map(|g| g.name.as_str())
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// A free, healthy GPU with nothing known about it: what a node spec's
/// missing `gpus` entry stands for.
fn free_gpu(index: u32) -> GpuState {
    GpuState {
        index,
        health: Health::Healthy,
        mode: GpuMode::Free,
        geometry: Vec::new(),
        workloads: Vec::new(),
        uuid: None,
    }
}

/// A device a running pod holds, from its container's limits.
#[derive(Debug, Clone, PartialEq)]
pub enum Held {
    /// `nvidia.com/gpu: N` without HAMi's limits: N whole GPUs.
    Whole(u32),
    /// `nvidia.com/mig-<profile>`: one MIG instance of the profile.
    Mig(String),
    /// `nvidia.com/mig-<profile>.shared`: one time-sliced share of an
    /// instance of the profile (the device plugin's mixed strategy with
    /// `renameByDefault`).
    MigShare(String),
    /// `nvidia.com/gpu.shared`: one share of a GPU the node's device
    /// plugin time-slices or partitions with MPS.
    Share,
    /// `nvidia.com/gpu: N` with HAMi's `nvidia.com/gpumem` or
    /// `nvidia.com/gpumem-percentage`: a fractional share of each of N GPUs.
    Fractional(FractionalShare),
}

/// A HAMi container's share of its GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct FractionalShare {
    /// GPUs (tensor-parallel degree).
    pub gpus: u32,
    /// Memory per GPU: MiB (`nvidia.com/gpumem`) or, when `None`, this
    /// percentage of the GPU's (`nvidia.com/gpumem-percentage`).
    pub mib: Option<u64>,
    /// `nvidia.com/gpumem-percentage`.
    pub memory_percent: u32,
    /// `nvidia.com/gpucores` (HAMi's default: 0).
    pub cores: u32,
    /// The GPUs HAMi may choose from (`nvidia.com/use-gpuuuid`; empty:
    /// any).
    pub uuids: Vec<String>,
    /// What HAMi allocated, when the pod says
    /// (`hami.io/vgpu-devices-allocated`): (UUID, MiB, cores) per GPU.
    pub allocated: Vec<(String, u64, u32)>,
}

/// What a running pod holds: its model and devices.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    /// The node it is bound to.
    pub node: String,
    /// The model (policy name).
    pub model: String,
    /// The devices its containers hold.
    pub held: Vec<Held>,
    /// `namespace/name` of a pod gpuscale does not manage (training
    /// workers, another team's servers): its devices are nobody's to plan
    /// with, so the GPUs it holds are kept out of every plan. `None` for
    /// gpuscale's own pods (`model` is then theirs).
    pub foreign: Option<String>,
}

/// HAMi's record of the devices it gave each container:
/// `UUID,Type,MiB,cores` per device, `:` after each device, `;` after
/// each container (HAMi's `EncodePodSingleDevice`).
pub const HAMI_ALLOCATED: &str = "hami.io/vgpu-devices-allocated";

/// HAMi's memory limit as a percentage of the GPU's.
pub const HAMI_MEMORY_PERCENT: &str = "nvidia.com/gpumem-percentage";

/// Most devices of one kind counted per container: limits are the pod's
/// own text, and a bound pod is listed before the kubelet rejects it.
const MOST_PER_CONTAINER: u64 = 64;

/// A Kubernetes quantity as a whole number (`30000`, `30k`, `2Gi`);
/// `None` when it is not one.
fn quantity(v: &str) -> Option<u64> {
    const SUFFIXES: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (digits, scale) = SUFFIXES
        .iter()
        .find_map(|(s, k)| v.strip_suffix(s).map(|d| (d, *k)))
        .unwrap_or((v, 1));
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

/// HAMi's containers per GPU on a node, from its device plugin's record
/// ([`HAMI_REGISTER`]): the fewest `count` over its GPUs. HAMi writes the
/// record as a JSON list of devices (`[{"id": …, "count": 10, …}]`,
/// `MarshalNodeDevices`; `count` is `omitempty`, so a device without one
/// has 0) or, before, as `UUID,count,MiB,cores,type,numa,
/// health[,mode,index]` per GPU, each ended by `:` (`EncodeNodeDevices`).
/// Devices with a count of 0 are passed over. `None` when neither form
/// reads or no GPU has a count.
pub fn hami_split_count(record: &str) -> Option<u32> {
    let record = record.trim();
    let counts: Vec<u32> = if record.starts_with('[') {
        let devices: Vec<serde_json::Value> = serde_json::from_str(record).ok()?;
        devices
            .iter()
            .map(|d| match d.get("count") {
                None => Some(0),
                Some(c) => c.as_u64().map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
            })
            .collect::<Option<Vec<u32>>>()?
    } else {
        record
            .split(':')
            .filter(|d| !d.trim().is_empty())
            .map(|d| {
                let f: Vec<&str> = d.split(',').collect();
                if f.len() < 7 {
                    return None;
                }
                let count = f[1].trim().parse::<u64>().ok()?;
                Some(u32::try_from(count).unwrap_or(u32::MAX))
            })
            .collect::<Option<Vec<u32>>>()?
    };
    counts.into_iter().filter(|&c| c > 0).min()
}

/// HAMi's allocation record, per container in the pod's order.
fn hami_allocated(record: &str) -> Vec<Vec<(String, u64, u32)>> {
    record
        .trim_end_matches(';')
        .split(';')
        .map(|container| {
            container
                .split(':')
                .filter_map(|device| {
                    let f: Vec<&str> = device.split(',').collect();
                    if f.len() < 4 || f[0].is_empty() {
                        return None;
                    }
                    Some((
                        f[0].to_string(),
                        f[2].parse().ok()?,
                        f[3].parse::<u32>().ok()?.min(100),
                    ))
                })
                .collect()
        })
        .collect()
}

/// A pod cut down to what [`holdings`] reads: its name, namespace, the
/// model label, HAMi's two annotations, the node, each container's name
/// and resources, and the phase. The controller watches every pod bound
/// to a node, cluster-wide, and keeps only this of each (a
/// pod's env, volumes, managed fields and `last-applied-configuration`
/// are most of its size), so its memory follows the GPUs' holders rather
/// than the size of every pod in the cluster.
pub fn slim(pod: Pod) -> Pod {
    let keep = |map: Option<BTreeMap<String, String>>, keys: &[&str]| {
        map.map(|m| {
            m.into_iter()
                .filter(|(k, _)| keys.contains(&k.as_str()))
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|m| !m.is_empty())
    };
    let meta = pod.metadata;
    Pod {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            labels: keep(meta.labels, &[crate::kubernetes::MODEL_LABEL]),
            annotations: keep(
                meta.annotations,
                &[gpuscale_packer::emit::HAMI_USE_UUID, HAMI_ALLOCATED],
            ),
            ..Default::default()
        },
        spec: pod.spec.map(|s| k8s_openapi::api::core::v1::PodSpec {
            node_name: s.node_name,
            containers: s
                .containers
                .into_iter()
                .map(|c| k8s_openapi::api::core::v1::Container {
                    name: c.name,
                    resources: c.resources,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        status: pod.status.map(|s| k8s_openapi::api::core::v1::PodStatus {
            phase: s.phase,
            ..Default::default()
        }),
    }
}

/// What pods bound to a node and not finished hold: those in the
/// controller's `namespace` labelled `gpuscale.io/model` as their model's
/// replicas, any other pod that holds GPU devices as foreign.
pub fn holdings(pods: &[Pod], namespace: &str) -> Vec<Holding> {
    let mut out = Vec::new();
    for p in pods {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let Some(spec) = &p.spec else { continue };
        let Some(node) = spec.node_name.clone() else {
            continue;
        };
        let labels = p.metadata.labels.as_ref();
        // The controller's namespace is the platform team's: a pod there
        // with a model label is that model's replica (the controller's
        // own, or one KEDA scales). Labels elsewhere prove nothing: any
        // tenant may write them.
        let here = p
            .metadata
            .namespace
            .as_deref()
            .is_none_or(|n| n == namespace);
        let (model, foreign) = match labels.and_then(|l| l.get(crate::kubernetes::MODEL_LABEL)) {
            Some(m) if here => (m.clone(), None),
            _ => (
                String::new(),
                Some(format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or("?")
                )),
            ),
        };
        let annotation = |k: &str| p.metadata.annotations.as_ref().and_then(|a| a.get(k));
        let uuids: Vec<String> = annotation(gpuscale_packer::emit::HAMI_USE_UUID)
            .map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let allocated = annotation(HAMI_ALLOCATED)
            .map(|r| hami_allocated(r))
            .unwrap_or_default();
        let mut held = Vec::new();
        for (i, c) in spec.containers.iter().enumerate() {
            let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
            let get = |k: &str| limits.and_then(|l| l.get(k)).and_then(|v| quantity(&v.0));
            let count = |k: &str| get(k).unwrap_or(0).min(MOST_PER_CONTAINER);
            for k in limits.iter().flat_map(|l| l.keys()) {
                if let Some(profile) = k.strip_prefix("nvidia.com/mig-") {
                    for _ in 0..count(k) {
                        held.push(match profile.strip_suffix(".shared") {
                            Some(p) => Held::MigShare(p.to_string()),
                            None => Held::Mig(profile.to_string()),
                        });
                    }
                } else if k == "nvidia.com/gpu.shared" {
                    for _ in 0..count(k) {
                        held.push(Held::Share);
                    }
                }
            }
            let gpus = count("nvidia.com/gpu") as u32;
            if gpus == 0 {
                continue;
            }
            let mib = get(gpuscale_packer::emit::HAMI_MEMORY);
            let percent = get(HAMI_MEMORY_PERCENT);
            held.push(if mib.is_some() || percent.is_some() {
                Held::Fractional(FractionalShare {
                    gpus,
                    mib,
                    memory_percent: percent.unwrap_or(100).min(100) as u32,
                    cores: get(gpuscale_packer::emit::HAMI_CORES).unwrap_or(0).min(100) as u32,
                    uuids: uuids.clone(),
                    allocated: allocated.get(i).cloned().unwrap_or_default(),
                })
            } else {
                Held::Whole(gpus)
            });
        }
        if foreign.is_some() && held.is_empty() {
            continue;
        }
        out.push(Holding {
            node,
            model,
            held,
            foreign,
        });
    }
    out
}

/// The device-plugin config a node's `nvidia.com/device-plugin.config`
/// label names, in the names gpuscale gives them (`packer::emit`):
/// `default`, `timeslice-N`, `mps-N`, `mig-<profile>-timeslice-N`.
#[derive(Debug, Clone, PartialEq)]
enum PluginConfig {
    Default,
    Timeslice(u8),
    Mps(u8),
    MigTimeslice(String, u8),
}

fn plugin_config(name: &str) -> Option<PluginConfig> {
    if name == "default" {
        return Some(PluginConfig::Default);
    }
    let n = |v: &str| v.parse::<u8>().ok().filter(|&n| n >= 2);
    if let Some(rest) = name.strip_prefix("mig-")
        && let Some((profile, k)) = rest.rsplit_once("-timeslice-")
    {
        return Some(PluginConfig::MigTimeslice(profile.to_string(), n(k)?));
    }
    if let Some(k) = name.strip_prefix("timeslice-") {
        return Some(PluginConfig::Timeslice(n(k)?));
    }
    if let Some(k) = name.strip_prefix("mps-") {
        return Some(PluginConfig::Mps(n(k)?));
    }
    None
}

/// Sets the node's device-plugin config from its label (only where the
/// GPU model has the time-sliced profile), noting names it cannot read.
/// The config is what the node runs, so a mode its `sharing` annotation
/// leaves out is allowed, with a note (a spec that named the config and
/// not the mode would not validate, and the whole inventory with it).
fn apply_plugin_config(
    node: &mut NodeSpec,
    label: Option<&str>,
    gpu: &gpuscale_policies::GpuModel,
    notes: &mut Vec<(String, String)>,
) {
    let Some(label) = label else { return };
    let label_name = gpuscale_packer::emit::DEVICE_PLUGIN_CONFIG_LABEL;
    let why = format!("its {label_name} is {label}");
    match plugin_config(label) {
        Some(PluginConfig::Default) => {}
        Some(PluginConfig::Timeslice(n)) => {
            node.timeslice_replicas = Some(n);
            allow(node, SharingMode::Timeslice, &why, notes);
        }
        Some(PluginConfig::Mps(n)) => {
            node.mps_replicas = Some(n);
            allow(node, SharingMode::Mps, &why, notes);
        }
        Some(PluginConfig::MigTimeslice(profile, n)) => {
            let known = gpu
                .mig
                .iter()
                .flat_map(|m| m.profiles.iter())
                .any(|p| !p.media_extensions && p.name == profile);
            if known {
                node.mig_timeslice = Some(MigTimeslice {
                    profile,
                    replicas: n,
                });
                allow(node, SharingMode::Mig, &why, notes);
                allow(node, SharingMode::MigTimeslice, &why, notes);
            } else {
                notes.push((
                    node.name.clone(),
                    format!(
                        "{label_name}={label}: {} has no MIG profile `{profile}`; its shares are \
                         counted as whole instances",
                        gpu.name
                    ),
                ));
            }
        }
        None => notes.push((
            node.name.clone(),
            format!(
                "{label_name}={label} is not a config gpuscale writes (default, timeslice-N, \
                 mps-N, mig-<profile>-timeslice-N): the shares on it are counted as whole GPUs \
                 and instances"
            ),
        )),
    }
}

/// Lets the node run what it runs: a mode the `sharing` annotation leaves
/// out is added, with a note (a plan that ignored it would count the
/// node's shares as free GPUs).
fn allow(node: &mut NodeSpec, mode: SharingMode, why: &str, notes: &mut Vec<(String, String)>) {
    if !node.sharing.contains(&mode) {
        node.sharing.push(mode);
        notes.push((
            node.name.clone(),
            format!(
                "{why}, which its `{SHARING}` annotation does not allow: `{mode}` allowed for \
                 what runs"
            ),
        ));
    }
}

/// The order pods' devices are put on GPUs: what is known exactly first
/// (HAMi's record), then what is bound to a kind of device, whole GPUs
/// last (any free one stands for them).
fn rank(held: &Held) -> u8 {
    match held {
        Held::Fractional(f) if !f.allocated.is_empty() => 0,
        Held::Mig(_) => 1,
        Held::MigShare(_) => 2,
        Held::Share => 3,
        Held::Fractional(f) if !f.uuids.is_empty() => 4,
        Held::Fractional(_) => 5,
        Held::Whole(_) => 6,
    }
}

/// Puts what the pods hold on their nodes' GPUs (`memory_mib`: one GPU's
/// memory, for HAMi's shares), most constrained first ([`rank`]):
/// - a HAMi share HAMi recorded (`hami.io/vgpu-devices-allocated`): on the
///   GPU of that UUID;
/// - a MIG instance: one of the profile not yet taken;
/// - a share of a time-sliced MIG instance, or of a time-sliced or MPS GPU:
///   the least shared one with a share left (free GPUs count as unshared),
///   as the device plugin hands out replicas (`distributedAlloc`);
/// - a HAMi share not recorded: among the GPUs it may be on, the fullest
///   fractional GPU with room for its memory and cores (HAMi's `binpack`,
///   which gpuscale's pods ask for), else a free GPU, else the fractional
///   GPU with the most memory left (noted: the pod is there);
/// - whole GPUs: free healthy ones.
///
/// A share on a node whose config does not say how many a device takes is
/// counted as the whole device. What does not fit the node as read is
/// noted.
fn place_holdings(
    node: &mut NodeSpec,
    held: &[&Holding],
    memory_mib: u64,
    notes: &mut Vec<(String, String)>,
) {
    let mut devices: Vec<(&str, &Held)> = held
        .iter()
        .filter(|h| h.foreign.is_none())
        .flat_map(|h| h.held.iter().map(|d| (h.model.as_str(), d)))
        .collect();
    devices.sort_by_key(|(_, d)| rank(d));
    // (MiB, percent) HAMi's shares take per GPU.
    let mut fractional_use: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    for (model, device) in devices {
        match device {
            Held::Mig(profile) => {
                if !take_instance(node, profile, model, 1) {
                    no_room(notes, &node.name, model, &format!("a {profile} instance"));
                }
            }
            Held::MigShare(profile) => {
                let per = node
                    .mig_timeslice
                    .as_ref()
                    .filter(|t| t.profile == *profile)
                    .map_or(1, |t| usize::from(t.replicas));
                if per == 1 {
                    notes.push((
                        node.name.clone(),
                        format!(
                            "a pod of {model} holds a share of a {profile} instance and the \
                             node's device-plugin config does not time-slice {profile}: counted \
                             as the whole instance"
                        ),
                    ));
                }
                if !take_instance(node, profile, model, per) {
                    no_room(
                        notes,
                        &node.name,
                        model,
                        &format!("a share of a {profile} instance"),
                    );
                }
            }
            Held::Share => {
                let (mode, per) = match (node.mps_replicas, node.timeslice_replicas) {
                    (Some(n), _) => (GpuMode::Mps, usize::from(n)),
                    (None, Some(n)) => (GpuMode::Timeslice, usize::from(n)),
                    (None, None) => {
                        notes.push((
                            node.name.clone(),
                            format!(
                                "a pod of {model} holds a GPU share and the node's device-plugin \
                                 config does not say how many shares a GPU takes: counted as a \
                                 whole GPU"
                            ),
                        ));
                        (GpuMode::Whole, 1)
                    }
                };
                let least = (0..node.gpu_count)
                    .filter_map(|i| {
                        let Some(g) = node.gpus.iter().find(|g| g.index == i) else {
                            return Some((0, i));
                        };
                        let open = g.health == Health::Healthy
                            && (g.mode == GpuMode::Free
                                || (g.mode == mode && mode != GpuMode::Whole))
                            && g.workloads.len() < per;
                        open.then_some((g.workloads.len(), i))
                    })
                    .min()
                    .map(|(_, i)| i);
                let Some(i) = least else {
                    no_room(notes, &node.name, model, "a GPU share");
                    continue;
                };
                put(node, i, mode, model);
            }
            Held::Fractional(f) => {
                place_fractional(node, f, model, memory_mib, &mut fractional_use, notes);
            }
            Held::Whole(n) => {
                for _ in 0..*n {
                    let Some(i) = (0..node.gpu_count).find(|&i| is_free(node, i)) else {
                        no_room(notes, &node.name, model, "a whole GPU");
                        break;
                    };
                    put(node, i, GpuMode::Whole, model);
                }
            }
        }
    }
    for h in held {
        if let Some(pod) = &h.foreign {
            for d in &h.held {
                keep_out(node, pod, d, notes);
            }
        }
    }
    node.gpus.sort_by_key(|g| g.index);
}

/// Keeps a GPU holding `device` of a pod gpuscale does not manage out of
/// every plan: it is marked unhealthy (never placed on, never set up
/// again), with a note naming the pod. The device plugin, not the pod,
/// says which GPU it got, so the inventory picks the one that device most
/// likely is: a free GPU for a whole one, else a GPU set up for it with
/// the fewest of gpuscale's replicas (those there are then planned
/// elsewhere: sharing a GPU with work gpuscale cannot see is not safe).
fn keep_out(node: &mut NodeSpec, pod: &str, device: &Held, notes: &mut Vec<(String, String)>) {
    let count = match device {
        Held::Whole(n) => *n,
        Held::Fractional(f) => f.gpus,
        _ => 1,
    };
    for _ in 0..count {
        let usable = |g: &GpuState| g.health == Health::Healthy;
        let fits = |g: &GpuState| match device {
            Held::Whole(_) => false,
            Held::Mig(p) | Held::MigShare(p) => g.geometry.iter().any(|x| &x.profile == p),
            Held::Share => matches!(g.mode, GpuMode::Timeslice | GpuMode::Mps),
            Held::Fractional(_) => g.mode == GpuMode::Fractional,
        };
        let free = (0..node.gpu_count).find(|&i| is_free(node, i));
        let shared = node
            .gpus
            .iter()
            .filter(|g| usable(g) && fits(g))
            .min_by_key(|g| (g.workloads.len(), g.index))
            .map(|g| g.index);
        let pick = match device {
            Held::Whole(_) => free,
            _ => shared.or(free),
        };
        let Some(i) = pick else {
            notes.push((
                node.name.clone(),
                format!("pod {pod}, which gpuscale does not manage, holds a GPU device the node has no room for"),
            ));
            return;
        };
        let k = match node.gpus.iter().position(|g| g.index == i) {
            Some(k) => k,
            None => {
                node.gpus.push(free_gpu(i));
                node.gpus.len() - 1
            }
        };
        node.gpus[k].health = Health::Unhealthy;
        notes.push((
            node.name.clone(),
            format!("GPU {i} is held by pod {pod}, which gpuscale does not manage: kept out of every plan"),
        ));
    }
}

/// Whether GPU `i` is free and healthy (a GPU the spec does not list is).
fn is_free(node: &NodeSpec, i: u32) -> bool {
    node.gpus
        .iter()
        .find(|g| g.index == i)
        .is_none_or(|g| g.mode == GpuMode::Free && g.health == Health::Healthy)
}

/// Runs `model` on GPU `i` in `mode`.
fn put(node: &mut NodeSpec, i: u32, mode: GpuMode, model: &str) {
    let k = match node.gpus.iter().position(|g| g.index == i) {
        Some(k) => k,
        None => {
            node.gpus.push(free_gpu(i));
            node.gpus.len() - 1
        }
    };
    node.gpus[k].mode = mode;
    node.gpus[k].workloads.push(Workload {
        model: model.to_string(),
        slot: None,
    });
}

/// One HAMi container's shares (see [`place_holdings`]).
fn place_fractional(
    node: &mut NodeSpec,
    f: &FractionalShare,
    model: &str,
    memory_mib: u64,
    used: &mut BTreeMap<u32, (u64, u32)>,
    notes: &mut Vec<(String, String)>,
) {
    let by_uuid = |node: &NodeSpec, uuid: &str| {
        node.gpus
            .iter()
            .find(|g| g.uuid.as_deref() == Some(uuid))
            .map(|g| g.index)
    };
    let mib = f
        .mib
        .unwrap_or(memory_mib * u64::from(f.memory_percent) / 100)
        .min(memory_mib);
    let mut taken: Vec<u32> = Vec::new();
    let add = |node: &mut NodeSpec,
               used: &mut BTreeMap<u32, (u64, u32)>,
               i: u32,
               mib: u64,
               cores: u32,
               taken: &mut Vec<u32>| {
        let u = used.entry(i).or_default();
        u.0 = u.0.saturating_add(mib);
        u.1 = u.1.saturating_add(cores);
        taken.push(i);
        put(node, i, GpuMode::Fractional, model);
    };
    let mut recorded = 0;
    for (uuid, mib, cores) in &f.allocated {
        match by_uuid(node, uuid) {
            Some(i) if !taken.contains(&i) => {
                add(node, used, i, (*mib).min(memory_mib), *cores, &mut taken);
                recorded += 1;
            }
            _ => notes.push((
                node.name.clone(),
                format!(
                    "a pod of {model}: HAMi allocated it {uuid}, which the node's reading does \
                     not show; placed as HAMi would"
                ),
            )),
        }
    }
    if !node.sharing.contains(&SharingMode::Fractional) && !taken.is_empty() {
        allow(node, SharingMode::Fractional, "it runs HAMi shares", notes);
    }
    for _ in recorded..f.gpus.max(recorded) {
        let healthy = |node: &NodeSpec, i: u32| {
            node.gpus
                .iter()
                .find(|g| g.index == i)
                .is_none_or(|g| g.health == Health::Healthy)
        };
        let may = |node: &NodeSpec, i: u32| {
            !taken.contains(&i)
                && healthy(node, i)
                && (f.uuids.is_empty()
                    || node.gpus.iter().any(|g| {
                        g.index == i && g.uuid.as_ref().is_some_and(|u| f.uuids.contains(u))
                    }))
        };
        let fractional: Vec<(u32, u64, u32)> = node
            .gpus
            .iter()
            .filter(|g| g.mode == GpuMode::Fractional && may(node, g.index))
            .map(|g| {
                let (m, c) = used.get(&g.index).copied().unwrap_or_default();
                (g.index, m, c)
            })
            .collect();
        let split = node.hami_split_count.unwrap_or(HAMI_DEFAULT_SPLIT_COUNT) as usize;
        let containers = |node: &NodeSpec, i: u32| {
            node.gpus
                .iter()
                .find(|g| g.index == i)
                .map_or(0, |g| g.workloads.len())
        };
        let fullest = fractional
            .iter()
            .filter(|(i, m, c)| {
                m.saturating_add(mib) <= memory_mib
                    && c.saturating_add(f.cores) <= 100
                    && containers(node, *i) < split
            })
            .max_by_key(|(i, m, _)| (*m, std::cmp::Reverse(*i)))
            .map(|(i, _, _)| *i);
        let free = || (0..node.gpu_count).find(|&i| is_free(node, i) && may(node, i));
        let i = match fullest.or_else(free) {
            Some(i) => i,
            None => {
                // The pod runs; its share is somewhere: on the GPU with
                // the most memory left, never left looking free.
                let Some(&(i, _, _)) = fractional.iter().min_by_key(|(i, m, _)| (*m, *i)) else {
                    no_room(notes, &node.name, model, "a fractional GPU share");
                    break;
                };
                notes.push((
                    node.name.clone(),
                    format!(
                        "a pod of {model} holds a HAMi share that fits none of the node's GPUs \
                         as HAMi's binpack would place it: counted on GPU {i}"
                    ),
                ));
                i
            }
        };
        allow(node, SharingMode::Fractional, "it runs HAMi shares", notes);
        add(node, used, i, mib, f.cores, &mut taken);
    }
}

fn no_room(notes: &mut Vec<(String, String)>, node: &str, model: &str, what: &str) {
    notes.push((
        node.to_string(),
        format!("a pod of {model} holds {what} the node has no room for"),
    ));
}

/// Puts `model` on an instance of `profile` running fewer than `per`
/// workloads, the least shared first (the first such in GPU and slot
/// order); `false` when there is none.
fn take_instance(node: &mut NodeSpec, profile: &str, model: &str, per: usize) -> bool {
    let mut best: Option<(usize, usize, u8)> = None;
    for (k, g) in node.gpus.iter().enumerate() {
        for p in g.geometry.iter().filter(|p| p.profile == profile) {
            let here = g
                .workloads
                .iter()
                .filter(|w| w.slot == Some(p.start))
                .count();
            if here < per && best.is_none_or(|(_, n, _)| here < n) {
                best = Some((k, here, p.start));
            }
        }
    }
    let Some((k, _, start)) = best else {
        return false;
    };
    node.gpus[k].workloads.push(Workload {
        model: model.to_string(),
        slot: Some(start),
    });
    true
}

/// The inventory of the GPU nodes among `nodes` (those with
/// `nvidia.com/gpu.count`), with the agent's readings by node name and
/// what gpuscale's pods hold ([`holdings`]).
pub fn from_nodes(
    nodes: &[Node],
    readings: &BTreeMap<String, NodeGpus>,
    held: &[Holding],
    catalog: &Catalog,
) -> FromNodes {
    let mut out = FromNodes::default();
    let mut measured = Measured::default();
    for node in nodes {
        let Some(name) = node.metadata.name.clone() else {
            continue;
        };
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let Some(count) = labels.get(COUNT) else {
            continue;
        };
        let mut note = |why: String| out.notes.push((name.clone(), why));
        let Ok(count) = count.parse::<u32>() else {
            note(format!("{COUNT}={count} is not a number; left out"));
            continue;
        };
        let product = labels.get(PRODUCT).cloned().unwrap_or_default();
        let Some(gpu_model) = model_of_product(catalog, &product) else {
            note(format!(
                "{PRODUCT}={product} is no catalogue model's product; left out (add it to the \
                 catalogue in a cluster file)"
            ));
            continue;
        };
        let gpu = catalog.get(gpu_model).expect("found by product");
        if let Some(mib) = labels.get(MEMORY).and_then(|m| m.parse::<f64>().ok()) {
            let gib = mib / 1024.0;
            if (gib - gpu.memory_gib).abs() > gpu.memory_gib * 0.1 {
                note(format!(
                    "{MEMORY}={mib} MiB differs from the catalogue's {} GiB for {gpu_model}",
                    gpu.memory_gib
                ));
            }
        }
        let sharing = match node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SHARING))
        {
            // MIG and whole GPUs: what the controller sets up itself
            // (time-slicing and MPS need the node's device-plugin config
            // label, which it does not set).
            None => vec![SharingMode::Mig, SharingMode::Whole],
            Some(list) => {
                let parsed: Result<Vec<SharingMode>, String> = list
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        serde_json::from_value(serde_json::Value::String(s.into()))
                            .map_err(|_| s.to_string())
                    })
                    .collect();
                match parsed {
                    Ok(v) => v,
                    Err(bad) => {
                        note(format!(
                            "annotation {SHARING}: `{bad}` is not a sharing mode (mig, \
                             timeslice, whole, mps, fractional, mig-timeslice); left out"
                        ));
                        continue;
                    }
                }
            }
        };
        let hami_record = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HAMI_REGISTER));
        // HAMi's count matters where gpuscale may put fractional shares:
        // elsewhere its record is not read, and not noted.
        let fractional = sharing.contains(&SharingMode::Fractional);
        let hami_split = match hami_record
            .filter(|_| fractional)
            .map(|r| hami_split_count(r))
        {
            None if fractional => {
                note(format!(
                    "no {HAMI_REGISTER} (HAMi has not registered its GPUs): planned with \
                     spec.packer.hamiSplitCount containers per GPU"
                ));
                None
            }
            None => None,
            Some(None) => {
                note(format!(
                    "annotation {HAMI_REGISTER} does not read as HAMi's device list: planned \
                     with spec.packer.hamiSplitCount containers per GPU"
                ));
                None
            }
            Some(Some(k)) if k > MAX_HAMI_SPLIT_COUNT => {
                note(format!(
                    "{HAMI_REGISTER}: {k} containers per GPU, planned as \
                     {MAX_HAMI_SPLIT_COUNT} (the most a cluster file may state)"
                ));
                Some(MAX_HAMI_SPLIT_COUNT)
            }
            Some(count) => count,
        };
        let up = ready(node);
        if !up {
            note("not Ready: its GPUs are not placed on".into());
        }
        let mig_config = labels
            .get(crate::kubernetes::MIG_CONFIG_LABEL)
            .map(String::as_str);
        let mig_set = mig_config.is_some_and(|c| c != "all-disabled");
        let reading = readings.get(&name);
        let mut gpus = Vec::new();
        for index in 0..count {
            let r = reading.and_then(|r| r.gpus.iter().find(|g| g.index == index));
            let mut state = GpuState {
                index,
                health: if up {
                    Health::Healthy
                } else {
                    Health::Unhealthy
                },
                mode: GpuMode::Free,
                geometry: Vec::new(),
                workloads: Vec::new(),
                uuid: r.map(|g| g.uuid.clone()).filter(|u| !u.is_empty()),
            };
            match r {
                Some(g) => {
                    measured.read(gpu, g, &name);
                    if g.unhealthy() {
                        state.health = Health::Unhealthy;
                        note(format!(
                            "GPU {index}: {} uncorrectable ECC error(s): not placed on",
                            g.ecc_uncorrected_volatile.unwrap_or(0)
                        ));
                    }
                    if g.mig_enabled == Some(true) && !g.instances.is_empty() {
                        if g.instances.iter().all(|i| i.start.is_some()) {
                            state.mode = GpuMode::Mig;
                            state.geometry = g
                                .instances
                                .iter()
                                .map(|i| {
                                    Placement::new(
                                        i.profile.split('+').next().unwrap_or_default(),
                                        i.start.unwrap_or(0),
                                    )
                                })
                                .collect();
                            state.geometry.sort_by_key(|p| p.start);
                        } else {
                            // No start slots (the agent lacks the MIG
                            // monitor capability): the first valid layout
                            // of the same instances stands for them.
                            let mut want: BTreeMap<String, u32> = BTreeMap::new();
                            for i in &g.instances {
                                *want
                                    .entry(i.profile.split('+').next().unwrap_or_default().into())
                                    .or_default() += 1;
                            }
                            let layout = gpu.mig.as_ref().and_then(|mig| {
                                gpuscale_policies::mig::all_geometries(mig)
                                    .into_iter()
                                    .find(|geo| geo.counts() == want)
                            });
                            match layout {
                                Some(geo) => {
                                    state.mode = GpuMode::Mig;
                                    state.geometry = geo.placements().to_vec();
                                    note(format!(
                                        "GPU {index}: MIG placements not read (no MIG monitor \
                                         capability): taken as the first valid layout of its \
                                         instances"
                                    ));
                                }
                                None => {
                                    state.health = Health::Unhealthy;
                                    note(format!(
                                        "GPU {index}: MIG instances without known placements \
                                         and no valid layout of them: not placed on"
                                    ));
                                }
                            }
                        }
                    }
                }
                None if mig_set => {
                    state.health = Health::Unhealthy;
                    note(format!(
                        "GPU {index}: MIG config {} and no agent reading of its instances: not \
                         placed on",
                        mig_config.unwrap_or_default()
                    ));
                }
                None => {}
            }
            if state != free_gpu(index) {
                gpus.push(state);
            }
        }
        let mut spec = NodeSpec {
            name: name.clone(),
            count: None,
            // An empty label value (valid in Kubernetes) names no domain.
            zone: labels.get(ZONE).filter(|v| !v.is_empty()).cloned(),
            rack: labels.get(RACK).filter(|v| !v.is_empty()).cloned(),
            nvlink_domain: labels
                .get(gpuscale_packer::emit::NVLINK_DOMAIN_LABEL)
                .or_else(|| labels.get(CLIQUE))
                .filter(|v| !v.is_empty())
                .cloned(),
            // What the fields above hold (zone, rack, NVLink domain, the
            // name) is not repeated as a label.
            labels: labels
                .iter()
                .filter(|(k, _)| !k.starts_with("nvidia.com/") && !k.starts_with("feature.node"))
                .filter(|(k, _)| {
                    !gpuscale_policies::inventory::DERIVED_LABELS
                        .iter()
                        .any(|(d, _)| d == k)
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
            gpu_model: gpu_model.to_string(),
            gpu_count: count,
            timeslice_replicas: None,
            mps_replicas: None,
            mig_timeslice: None,
            sharing,
            hami_split_count: hami_split,
            gpus,
        };
        apply_plugin_config(
            &mut spec,
            labels
                .get(gpuscale_packer::emit::DEVICE_PLUGIN_CONFIG_LABEL)
                .map(String::as_str),
            gpu,
            &mut out.notes,
        );
        let here: Vec<&Holding> = held.iter().filter(|h| h.node == name).collect();
        place_holdings(
            &mut spec,
            &here,
            (gpu.memory_gib * 1024.0) as u64,
            &mut out.notes,
        );
        // HAMi's count matters where gpuscale may put fractional shares.
        if !spec.sharing.contains(&SharingMode::Fractional) {
            spec.hami_split_count = None;
        }
        out.spec.nodes.push(spec);
    }
    out.spec.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let (catalog, notes) = measured.overrides();
    out.spec.catalog = catalog;
    out.notes.extend(notes);
    out
}

/// Hundredths of a GiB, rounded down (how `nvidia-smi mig -lgip` prints).
fn gib_down(mib: u64) -> f64 {
    (mib as f64 / 1024.0 * 100.0).floor() / 100.0
}

/// The lowest memory the readings measured where it is under the
/// catalogue's, per catalogue model: (GiB, catalogue's GiB, node, GPU).
#[derive(Default)]
struct Measured {
    whole: BTreeMap<String, (f64, f64, String, u32)>,
    mig: BTreeMap<(String, String), (f64, f64, String, u32)>,
}

impl Measured {
    fn lower<K: Ord>(
        slot: &mut BTreeMap<K, (f64, f64, String, u32)>,
        key: K,
        gib: f64,
        catalogue: f64,
        node: &str,
        gpu: u32,
    ) {
        if gib >= catalogue - 1e-9 {
            return;
        }
        let e = slot
            .entry(key)
            .or_insert_with(|| (gib, catalogue, node.to_string(), gpu));
        if gib < e.0 {
            *e = (gib, catalogue, node.to_string(), gpu);
        }
    }

    fn read(
        &mut self,
        model: &gpuscale_policies::GpuModel,
        g: &gpuscale_policies::devices::GpuReading,
        node: &str,
    ) {
        if let Some(mib) = g.memory_usable_mib() {
            Self::lower(
                &mut self.whole,
                model.name.clone(),
                gib_down(mib),
                model.usable_gib,
                node,
                g.index,
            );
        }
        let Some(mig) = &model.mig else {
            return;
        };
        for p in &g.mig_profiles {
            let Some(name) = &p.name else {
                continue;
            };
            if let Some(c) = mig.profiles.iter().find(|c| c.name == *name) {
                Self::lower(
                    &mut self.mig,
                    (model.name.clone(), name.clone()),
                    gib_down(p.memory_mib),
                    c.usable_gib,
                    node,
                    g.index,
                );
            }
        }
    }

    fn overrides(self) -> (Vec<GpuModelOverride>, Vec<(String, String)>) {
        fn of(
            by_model: &mut BTreeMap<String, GpuModelOverride>,
            model: String,
        ) -> &mut GpuModelOverride {
            by_model
                .entry(model.clone())
                .or_insert_with(|| GpuModelOverride {
                    name: model,
                    ..GpuModelOverride::default()
                })
        }
        let mut by_model: BTreeMap<String, GpuModelOverride> = BTreeMap::new();
        let mut notes = Vec::new();
        for (model, (gib, was, node, gpu)) in self.whole {
            notes.push((
                node,
                format!(
                    "GPU {gpu}: {gib:.2} GiB usable as a whole GPU (NVML: total less the \
                     driver's reservation), under the catalogue's {was:.2} for {model}: \
                     planned with {gib:.2}"
                ),
            ));
            of(&mut by_model, model).usable_gib = Some(gib);
        }
        for ((model, profile), (gib, was, node, gpu)) in self.mig {
            notes.push((
                node,
                format!(
                    "GPU {gpu}: MIG {profile} holds {gib:.2} GiB (NVML), under the \
                     catalogue's {was:.2} for {model}: planned with {gib:.2}"
                ),
            ));
            of(&mut by_model, model).mig_usable_gib.insert(profile, gib);
        }
        (by_model.into_values().collect(), notes)
    }
}
