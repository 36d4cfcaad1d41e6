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
//! | gpuscale's pods (`gpuscale.io/model`, `spec.nodeName`, device limits) | what runs where: a pod asking for `nvidia.com/mig-<profile>` takes an instance of that profile on its node, one asking for `nvidia.com/gpu: N` takes N whole GPUs |
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
use gpuscale_policies::inventory::{GpuModelOverride, GpuState, NodeSpec, Workload};
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

/// What a running pod holds: its model and device requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    /// The node it is bound to.
    pub node: String,
    /// The model (policy name).
    pub model: String,
    /// MIG profile of the instance it holds, if any.
    pub mig: Option<String>,
    /// Whole GPUs it holds.
    pub gpus: u32,
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
        let mut h = Holding {
            node,
            model,
            mig: None,
            gpus: 0,
        };
        for c in &spec.containers {
            for (k, v) in c.resources.iter().flat_map(|r| r.limits.iter().flatten()) {
                if let Some(profile) = k.strip_prefix("nvidia.com/mig-") {
                    h.mig = Some(profile.trim_end_matches(".shared").to_string());
                } else if k == "nvidia.com/gpu" {
                    h.gpus += v.0.parse::<u32>().unwrap_or(0);
                }
            }
        }
        out.push(h);
    }
    out
}

/// Puts what the pods hold on their nodes' GPUs: a MIG instance of the
/// profile not yet taken, or free healthy whole GPUs; what does not fit
/// the node as read is noted.
fn place_holdings(node: &mut NodeSpec, held: &[&Holding], notes: &mut Vec<(String, String)>) {
    let state = |index: u32, gpus: &mut Vec<GpuState>| -> usize {
        if let Some(i) = gpus.iter().position(|g| g.index == index) {
            return i;
        }
        gpus.push(free_gpu(index));
        gpus.len() - 1
    };
    for h in held {
        if let Some(profile) = &h.mig {
            let slot = node.gpus.iter_mut().find_map(|g| {
                let start = g
                    .geometry
                    .iter()
                    .find(|p| {
                        p.profile == *profile
                            && !g.workloads.iter().any(|w| w.slot == Some(p.start))
                    })?
                    .start;
                g.workloads.push(Workload {
                    model: h.model.clone(),
                    slot: Some(start),
                });
                Some(start)
            });
            if slot.is_none() {
                notes.push((
                    node.name.clone(),
                    format!(
                        "a pod of {} holds a {profile} instance the node's reading does not show",
                        h.model
                    ),
                ));
            }
        }
        for _ in 0..h.gpus {
            let free = (0..node.gpu_count).find(|&i| {
                node.gpus
                    .iter()
                    .find(|g| g.index == i)
                    .is_none_or(|g| g.mode == GpuMode::Free && g.health == Health::Healthy)
            });
            match free {
                Some(i) => {
                    let k = state(i, &mut node.gpus);
                    node.gpus[k].mode = GpuMode::Whole;
                    node.gpus[k].workloads.push(Workload {
                        model: h.model.clone(),
                        slot: None,
                    });
                }
                None => notes.push((
                    node.name.clone(),
                    format!(
                        "a pod of {} holds a whole GPU the node has no room for",
                        h.model
                    ),
                )),
            }
        }
    }
    node.gpus.sort_by_key(|g| g.index);
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
        let here: Vec<&Holding> = held.iter().filter(|h| h.node == name).collect();
        place_holdings(&mut spec, &here, &mut out.notes);
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
