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
//! | `topology.kubernetes.io/zone`, `gpuscale.io/rack`, `nvidia.com/gpu.clique` | zone, rack, NVLink domain |
//! | annotation `gpuscale.io/sharing` (`mig, timeslice, whole`) | the sharing the node may be set up for (default `mig, whole`: what the controller sets up itself) |
//! | condition `Ready` | a node not ready has no usable GPU |
//! | the agent's reading | per GPU: UUID, MIG mode and instances with their start slots, uncorrectable ECC errors, memory the driver reserves, the MIG profiles' measured memory |
//! | label `nvidia.com/device-plugin.config` (`timeslice-N`, `mps-N`, `mig-<profile>-timeslice-N`: the names gpuscale writes) | how many shares the device plugin makes of each GPU or instance now |
//! | gpuscale's pods (`gpuscale.io/model`, `spec.nodeName`, device limits, HAMi's `nvidia.com/use-gpuuuid`) | what runs where ([`Held`]): `nvidia.com/mig-<profile>` an instance of that profile, `nvidia.com/mig-<profile>.shared` a share of one (the fullest with a share left), `nvidia.com/gpu.shared` a share of a time-sliced or MPS GPU (likewise), `nvidia.com/gpu: N` with HAMi's `nvidia.com/gpumem` a fractional share of N GPUs (the pinned ones, else binpack by `gpumem` and `gpucores`), `nvidia.com/gpu: N` alone N whole GPUs |
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
pub const RACK: &str = "gpuscale.io/rack";
/// The annotation listing the sharing a node may be set up for.
pub const SHARING: &str = "gpuscale.io/sharing";

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
    /// `nvidia.com/gpu: N` with HAMi's `nvidia.com/gpumem` (and
    /// `nvidia.com/gpucores`): a fractional share of each of N GPUs, with
    /// the UUIDs HAMi may choose from (annotation `nvidia.com/use-gpuuuid`;
    /// empty: any of the node's GPUs).
    Fractional {
        /// GPUs (tensor-parallel degree).
        gpus: u32,
        /// `nvidia.com/gpumem` per GPU (MiB).
        mib: u64,
        /// `nvidia.com/gpucores` per GPU (percent).
        cores: u32,
        /// The GPUs it may be on.
        uuids: Vec<String>,
    },
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
}

/// What gpuscale's pods hold (those bound to a node and not finished).
pub fn holdings(pods: &[Pod]) -> Vec<Holding> {
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
        let Some(model) = p
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(crate::kubernetes::MODEL_LABEL))
            .cloned()
        else {
            continue;
        };
        let uuids: Vec<String> = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(gpuscale_packer::emit::HAMI_USE_UUID))
            .map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let mut held = Vec::new();
        for c in &spec.containers {
            let limits = c.resources.as_ref().and_then(|r| r.limits.as_ref());
            let get = |k: &str| {
                limits
                    .and_then(|l| l.get(k))
                    .and_then(|v| v.0.parse::<u64>().ok())
            };
            for k in limits.iter().flat_map(|l| l.keys()) {
                if let Some(profile) = k.strip_prefix("nvidia.com/mig-") {
                    held.push(match profile.strip_suffix(".shared") {
                        Some(p) => Held::MigShare(p.to_string()),
                        None => Held::Mig(profile.to_string()),
                    });
                } else if k == "nvidia.com/gpu.shared" {
                    for _ in 0..get(k).unwrap_or(0) {
                        held.push(Held::Share);
                    }
                }
            }
            let gpus = get("nvidia.com/gpu").unwrap_or(0) as u32;
            if gpus > 0 {
                held.push(match get(gpuscale_packer::emit::HAMI_MEMORY) {
                    Some(mib) => Held::Fractional {
                        gpus,
                        mib,
                        cores: get(gpuscale_packer::emit::HAMI_CORES).unwrap_or(100) as u32,
                        uuids: uuids.clone(),
                    },
                    None => Held::Whole(gpus),
                });
            }
        }
        out.push(Holding { node, model, held });
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
fn apply_plugin_config(
    node: &mut NodeSpec,
    label: Option<&str>,
    gpu: &gpuscale_policies::GpuModel,
    notes: &mut Vec<(String, String)>,
) {
    let Some(label) = label else { return };
    let label_name = gpuscale_packer::emit::DEVICE_PLUGIN_CONFIG_LABEL;
    match plugin_config(label) {
        Some(PluginConfig::Default) => {}
        Some(PluginConfig::Timeslice(n)) => node.timeslice_replicas = Some(n),
        Some(PluginConfig::Mps(n)) => node.mps_replicas = Some(n),
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

/// Lets the node run what its pods show it runs: a mode the `sharing`
/// annotation leaves out is added, with a note (the pods are there; a plan
/// that ignored them would count their GPUs as free).
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

/// Puts what the pods hold on their nodes' GPUs (`memory_mib`: one GPU's
/// memory, for HAMi's shares):
/// - a MIG instance of the profile not yet taken;
/// - a time-sliced share of an instance: the fullest instance of the
///   profile with a share left (the node's `mig-<profile>-timeslice-N`);
/// - a share of a time-sliced or MPS GPU: the fullest such GPU with a share
///   left, else a free one (the node's `timeslice-N` or `mps-N`);
/// - a HAMi share: among the GPUs it may be on, the fullest fractional GPU
///   with room for its `gpumem` and `gpucores` (HAMi's `binpack`, which
///   gpuscale's pods ask for), else a free one;
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
    let state = |index: u32, gpus: &mut Vec<GpuState>| -> usize {
        if let Some(i) = gpus.iter().position(|g| g.index == index) {
            return i;
        }
        gpus.push(free_gpu(index));
        gpus.len() - 1
    };
    let free = |node: &NodeSpec, i: u32, skip: &[u32]| {
        !skip.contains(&i)
            && node
                .gpus
                .iter()
                .find(|g| g.index == i)
                .is_none_or(|g| g.mode == GpuMode::Free && g.health == Health::Healthy)
    };
    // (MiB, percent) HAMi's shares take per GPU.
    let mut fractional_use: BTreeMap<u32, (u64, u32)> = BTreeMap::new();
    for h in held {
        for device in &h.held {
            match device {
                Held::Mig(profile) => {
                    if !take_instance(node, profile, &h.model, 1) {
                        no_room(
                            notes,
                            &node.name,
                            &h.model,
                            &format!("a {profile} instance"),
                        );
                    }
                }
                Held::MigShare(profile) => {
                    let per = node
                        .mig_timeslice
                        .as_ref()
                        .filter(|t| t.profile == *profile)
                        .map_or(1, |t| usize::from(t.replicas));
                    if per > 1 {
                        allow(
                            node,
                            SharingMode::MigTimeslice,
                            "runs time-sliced MIG",
                            notes,
                        );
                    } else {
                        notes.push((
                            node.name.clone(),
                            format!(
                                "a pod of {} holds a share of a {profile} instance and the node's \
                                 device-plugin config does not time-slice {profile}: counted as \
                                 the whole instance",
                                h.model
                            ),
                        ));
                    }
                    if !take_instance(node, profile, &h.model, per) {
                        no_room(
                            notes,
                            &node.name,
                            &h.model,
                            &format!("a share of a {profile} instance"),
                        );
                    }
                }
                Held::Share => {
                    let (mode, per, sharing) = match (node.mps_replicas, node.timeslice_replicas) {
                        (Some(n), _) => (GpuMode::Mps, usize::from(n), SharingMode::Mps),
                        (None, Some(n)) => {
                            (GpuMode::Timeslice, usize::from(n), SharingMode::Timeslice)
                        }
                        (None, None) => {
                            notes.push((
                                node.name.clone(),
                                format!(
                                    "a pod of {} holds a GPU share and the node's device-plugin \
                                     config does not say how many shares a GPU takes: counted as \
                                     a whole GPU",
                                    h.model
                                ),
                            ));
                            (GpuMode::Whole, 1, SharingMode::Whole)
                        }
                    };
                    let fullest = node
                        .gpus
                        .iter()
                        .filter(|g| {
                            g.mode == mode
                                && mode != GpuMode::Whole
                                && g.health == Health::Healthy
                                && g.workloads.len() < per
                        })
                        .max_by_key(|g| (g.workloads.len(), std::cmp::Reverse(g.index)))
                        .map(|g| g.index);
                    let Some(i) =
                        fullest.or_else(|| (0..node.gpu_count).find(|&i| free(node, i, &[])))
                    else {
                        no_room(notes, &node.name, &h.model, "a GPU share");
                        continue;
                    };
                    if mode != GpuMode::Whole {
                        allow(node, sharing, "runs shared GPUs", notes);
                    }
                    let k = state(i, &mut node.gpus);
                    node.gpus[k].mode = mode;
                    node.gpus[k].workloads.push(Workload {
                        model: h.model.clone(),
                        slot: None,
                    });
                }
                Held::Fractional {
                    gpus,
                    mib,
                    cores,
                    uuids,
                } => {
                    let may = |node: &NodeSpec, i: u32| {
                        uuids.is_empty()
                            || node.gpus.iter().any(|g| {
                                g.index == i && g.uuid.as_ref().is_some_and(|u| uuids.contains(u))
                            })
                    };
                    let mut taken: Vec<u32> = Vec::new();
                    for _ in 0..*gpus {
                        let room = |i: u32| {
                            let (m, c) = fractional_use.get(&i).copied().unwrap_or_default();
                            m + mib <= memory_mib && c + cores <= 100
                        };
                        let fullest = node
                            .gpus
                            .iter()
                            .filter(|g| {
                                g.mode == GpuMode::Fractional
                                    && g.health == Health::Healthy
                                    && !taken.contains(&g.index)
                                    && may(node, g.index)
                                    && room(g.index)
                            })
                            .max_by_key(|g| {
                                let (m, _) =
                                    fractional_use.get(&g.index).copied().unwrap_or_default();
                                (m, std::cmp::Reverse(g.index))
                            })
                            .map(|g| g.index);
                        let Some(i) = fullest.or_else(|| {
                            (0..node.gpu_count).find(|&i| free(node, i, &taken) && may(node, i))
                        }) else {
                            no_room(notes, &node.name, &h.model, "a fractional GPU share");
                            break;
                        };
                        allow(node, SharingMode::Fractional, "runs HAMi shares", notes);
                        taken.push(i);
                        let used = fractional_use.entry(i).or_default();
                        used.0 += mib;
                        used.1 += cores;
                        let k = state(i, &mut node.gpus);
                        node.gpus[k].mode = GpuMode::Fractional;
                        node.gpus[k].workloads.push(Workload {
                            model: h.model.clone(),
                            slot: None,
                        });
                    }
                }
                Held::Whole(n) => {
                    for _ in 0..*n {
                        let Some(i) = (0..node.gpu_count).find(|&i| free(node, i, &[])) else {
                            no_room(notes, &node.name, &h.model, "a whole GPU");
                            break;
                        };
                        let k = state(i, &mut node.gpus);
                        node.gpus[k].mode = GpuMode::Whole;
                        node.gpus[k].workloads.push(Workload {
                            model: h.model.clone(),
                            slot: None,
                        });
                    }
                }
            }
        }
    }
    node.gpus.sort_by_key(|g| g.index);
}

fn no_room(notes: &mut Vec<(String, String)>, node: &str, model: &str, what: &str) {
    notes.push((
        node.to_string(),
        format!("a pod of {model} holds {what} the node has no room for"),
    ));
}

/// Puts `model` on an instance of `profile` running fewer than `per`
/// workloads, the fullest first; `false` when there is none.
fn take_instance(node: &mut NodeSpec, profile: &str, model: &str, per: usize) -> bool {
    let mut best: Option<(usize, usize, u8)> = None;
    for (k, g) in node.gpus.iter().enumerate() {
        for p in g.geometry.iter().filter(|p| p.profile == profile) {
            let here = g
                .workloads
                .iter()
                .filter(|w| w.slot == Some(p.start))
                .count();
            if here < per && best.is_none_or(|(_, n, _)| here > n) {
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
            zone: labels.get(ZONE).cloned(),
            rack: labels.get(RACK).cloned(),
            nvlink_domain: labels.get(CLIQUE).cloned(),
            labels: labels
                .iter()
                .filter(|(k, _)| !k.starts_with("nvidia.com/") && !k.starts_with("feature.node"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
            gpu_model: gpu_model.to_string(),
            gpu_count: count,
            timeslice_replicas: None,
            mps_replicas: None,
            mig_timeslice: None,
            sharing,
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
