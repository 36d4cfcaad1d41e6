//! Mapping the ILP's counts onto concrete GPUs, preferring what is already
//! there: GPUs already in the needed geometry, replicas already in place.
//!
//! Per class, in this order: (1) choose the nodes that get a device-plugin
//! config (time-slicing or MPS into `N`) or run HAMi, those already
//! configured the same way first; (2) place tensor-parallel groups, largest
//! first, on the other nodes — where the model already runs if it can,
//! else best fit; (3) time-sliced and MPS GPUs on their nodes; (4) MIG
//! GPUs (not on MPS or HAMi nodes), keeping GPUs whose current geometry has
//! the pattern's profiles; (5) fractional GPUs on HAMi nodes
//! ([`fractional`]): GPUs already running a pattern's mix keep it, the
//! shares of tensor-parallel replicas go in node blocks, the rest on free
//! GPUs; (6) replicas into slots, the slot a replica already occupies
//! first. Each step is linear in the class's GPUs and replicas (plus
//! sorting).

mod fractional;

use std::collections::{BTreeMap, BTreeSet};

use gpuscale_policies::{Cluster, Geometry, GpuMode, Health, Model};

use crate::classes::{
    Class, NodeConfig, PatternKind, SlotKind, fractional_part, node_shared, plain_counts,
};
use crate::ilp::Counts;
use crate::plan::{GpuPlan, Mode, ReplicaSlot};

/// What decoding produced.
#[derive(Debug, Clone, Default)]
pub struct Decoded {
    /// Every healthy GPU of every class, in cluster order.
    pub gpus: Vec<GpuPlan>,
    /// Replicas that the counts promised but no GPU could take (per model).
    pub failed: Vec<u32>,
    /// Replicas running now that move.
    pub moves: u32,
    /// Replicas running now that stop, per model (running now less
    /// placed, when more run than are placed).
    pub stopped: Vec<u32>,
    /// GPUs whose configuration changes.
    pub reconfigured: u32,
    /// Time-slicing `N` per node name.
    pub timeslice_nodes: BTreeMap<String, u8>,
    /// MPS `N` per node name.
    pub mps_nodes: BTreeMap<String, u8>,
    /// Nodes running HAMi.
    pub hami_nodes: BTreeSet<String>,
    /// The time-sliced MIG profile and `N` per node name.
    pub mig_timeslice_nodes: BTreeMap<String, (String, u8)>,
    next_group: u32,
}

/// (model, MIG profile, MIG start, (group size, group number)).
type PlacedReplica = (usize, Option<String>, Option<u8>, Option<(u32, u32)>);

#[derive(Debug, Clone)]
struct Slot {
    kind: SlotKind,
    start: Option<u8>,
    profile: Option<String>,
    model: Option<usize>,
    /// (group size, group number) of a tensor-parallel replica's share.
    group: Option<(u32, u32)>,
}

impl Slot {
    fn empty(kind: SlotKind) -> Slot {
        Slot {
            kind,
            start: None,
            profile: None,
            model: None,
            group: None,
        }
    }
}

#[derive(Debug, Clone)]
struct Assigned {
    mode: Mode,
    geometry: Geometry,
    share: Option<u8>,
    slots: Vec<Slot>,
    /// (model, group size, group number) for whole GPUs.
    whole: Option<(usize, u32, u32)>,
    /// On a MIG GPU of a node time-slicing a profile: it, and `N`.
    mig_share: Option<(String, u8)>,
}

/// What a node is designated for in a class.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    /// A device-plugin config (time-slicing, MPS, a time-sliced MIG
    /// profile).
    Config(NodeConfig),
    /// HAMi (fractional GPUs).
    Hami,
}

/// Decodes one solution.
pub fn decode(cluster: &Cluster, models: &[Model], classes: &[Class], counts: &Counts) -> Decoded {
    decode_with(cluster, models, classes, counts, false, Refill::Off)
}

/// [`decode`] for a re-plan that keeps what runs and adds on top: then
/// the replicas that would open a GPU of their own (a whole GPU, or a
/// fractional GPU of new replicas) go into the room that running
/// fractional GPUs have left instead, where their memory and SMs fit
/// (HAMi limits each container, so a fractional GPU takes any mix
/// without being reconfigured). The counts keep each model's replicas in
/// the slots of its own mixes, so a replica that leaves a shared GPU
/// leaves a hole only its own model's next replica could fill, and a
/// single replica added opens a GPU: between consolidations the 1,000-GPU
/// simulated fleet went from 58 GPUs at 92 % memory to 95 at 74 % with
/// the same number of replicas.
pub fn decode_refilled(
    cluster: &Cluster,
    models: &[Model],
    classes: &[Class],
    counts: &Counts,
) -> Decoded {
    decode_with(cluster, models, classes, counts, false, Refill::New)
}

/// [`decode_refilled`], and also running fractional GPUs at most half
/// full (by memory) emptied into fuller fractional GPUs' room (a
/// replica keeps its SM share, so it runs as fast there), each wholly or not
/// at all: Karpenter's single-node consolidation between the packer's
/// consolidations. A GPU is emptied or left as it is, never thinned, and
/// one that received replicas is not emptied in the same re-plan, so each
/// move frees a GPU and re-plans cannot move replicas back and forth. For
/// the re-plan that keeps what runs ([`crate::PackOptions::keep_running`]);
/// the re-plan on top of a basis stays move-free.
pub fn decode_consolidated(
    cluster: &Cluster,
    models: &[Model],
    classes: &[Class],
    counts: &Counts,
) -> Decoded {
    decode_with(cluster, models, classes, counts, false, Refill::Running)
}

/// Which GPUs [`refill_fractional`] empties into fractional room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refill {
    Off,
    /// GPUs opened for new replicas.
    New,
    /// Those, and running GPUs at most [`EMPTY_BELOW`] full.
    Running,
}

/// A running GPU is emptied between consolidations only when its
/// replicas' memory is at most this fraction of its usable memory.
const EMPTY_BELOW: f64 = 0.5;

/// [`decode`], and where keeping replicas where they run leaves some of a
/// class's replicas with no GPU (shares of tensor-parallel replicas that
/// the kept groups' nodes cannot complete, groups that kept groups split
/// the nodes for), that class decoded again as if nothing ran on it:
/// its GPUs keep their configurations where the counts want them, and its
/// replicas move where they must. For a re-plan that may move replicas (a
/// consolidation), whose counts were solved for fewer GPUs than keeping
/// needs: without it a replica short meant keeping everything.
pub fn decode_or_repack(
    cluster: &Cluster,
    models: &[Model],
    classes: &[Class],
    counts: &Counts,
) -> Decoded {
    decode_with(cluster, models, classes, counts, true, Refill::Off)
}

fn decode_with(
    cluster: &Cluster,
    models: &[Model],
    classes: &[Class],
    counts: &Counts,
    repack: bool,
    refill: Refill,
) -> Decoded {
    let model_index: BTreeMap<&str, usize> = models
        .iter()
        .enumerate()
        .map(|(i, m)| (m.name.as_str(), i))
        .collect();
    let mut out = Decoded {
        failed: vec![0; models.len()],
        ..Decoded::default()
    };
    let mut assigned: BTreeMap<(usize, u32), Assigned> = BTreeMap::new();
    for (c, class) in classes.iter().enumerate() {
        let one = |view: &Cluster, next_group: u32| {
            let mut part = Decoded {
                failed: vec![0; models.len()],
                next_group,
                ..Decoded::default()
            };
            let mut mine = BTreeMap::new();
            decode_class(view, &model_index, class, c, counts, &mut mine, &mut part);
            (part, mine)
        };
        let (mut part, mut mine) = one(cluster, out.next_group);
        let short = |d: &Decoded| d.failed.iter().sum::<u32>();
        if repack && short(&part) > 0 {
            let mut view = cluster.clone();
            for &ni in &class.nodes {
                for gpu in &mut view.nodes[ni].gpus {
                    gpu.workloads.clear();
                }
            }
            let (again, theirs) = one(&view, part.next_group);
            if short(&again) < short(&part) {
                (part, mine) = (again, theirs);
            }
        }
        assigned.extend(mine);
        for (f, p) in out.failed.iter_mut().zip(&part.failed) {
            *f += p;
        }
        out.timeslice_nodes.append(&mut part.timeslice_nodes);
        out.mps_nodes.append(&mut part.mps_nodes);
        out.hami_nodes.append(&mut part.hami_nodes);
        out.mig_timeslice_nodes
            .append(&mut part.mig_timeslice_nodes);
        out.next_group = part.next_group;
    }
    if refill != Refill::Off {
        refill_fractional(
            cluster,
            models,
            classes,
            &mut assigned,
            refill == Refill::Running,
        );
        out.hami_nodes.retain(|name| {
            cluster.nodes.iter().enumerate().any(|(ni, n)| {
                n.name == *name
                    && n.gpus.iter().any(|g| {
                        assigned
                            .get(&(ni, g.index))
                            .is_some_and(|a| a.mode == Mode::Fractional)
                    })
            })
        });
    }

    let node_class: BTreeMap<usize, usize> = classes
        .iter()
        .enumerate()
        .flat_map(|(c, class)| class.nodes.iter().map(move |&ni| (ni, c)))
        .collect();

    // Replica numbers, moves and reconfigurations over the whole cluster.
    let mut next_replica = vec![0u32; models.len()];
    let mut group_replica: BTreeMap<u32, u32> = BTreeMap::new();
    // Moves are counted in replicas: a GPU of a k-GPU group is 1/k of one.
    let mut current: Vec<f64> = vec![0.0; models.len()];
    let mut matched: Vec<f64> = vec![0.0; models.len()];
    let mut placed: Vec<u32> = vec![0; models.len()];
    for (&(_, m, _), &n) in &counts.slots {
        placed[m] += n;
    }
    for (&(_, m, _), &n) in &counts.whole {
        placed[m] += n;
    }
    for (m, p) in placed.iter_mut().enumerate() {
        *p = p.saturating_sub(out.failed[m]);
    }
    for (ni, node) in cluster.nodes.iter().enumerate() {
        for gpu in &node.gpus {
            for w in &gpu.workloads {
                if let Some(&m) = model_index.get(w.model.as_str()) {
                    current[m] += match gpu.mode {
                        GpuMode::Whole => {
                            1.0 / f64::from(smallest_group(cluster, node, &models[m]))
                        }
                        // One share of each of a tensor-parallel replica's GPUs.
                        GpuMode::Fractional => node_class.get(&ni).map_or(1.0, |&c| {
                            1.0 / f64::from(
                                fractional_part(&models[m], &classes[c]).map_or(1, |p| p.gpus),
                            )
                        }),
                        _ => 1.0,
                    };
                }
            }
            let Some(a) = assigned.get(&(ni, gpu.index)) else {
                out.gpus.push(idle(node.name.clone(), &node.gpu_model, gpu));
                continue;
            };
            let mut replicas: Vec<PlacedReplica> = Vec::new();
            for s in &a.slots {
                if let Some(m) = s.model {
                    replicas.push((m, s.profile.clone(), s.start, s.group));
                }
            }
            if let Some((m, k, group)) = a.whole {
                replicas.push((m, None, None, Some((k, group))));
            }
            // Reconfiguration: the MIG or sharing configuration changes.
            let before = config_key(gpu.mode, &gpu.geometry, node);
            let after = match a.mode {
                Mode::Mig => Some(mig_key(
                    &a.geometry,
                    a.mig_share.as_ref().map(|(p, n)| (p.as_str(), *n)),
                )),
                Mode::Timeslice => Some(format!("share:{}", a.share.unwrap_or(0))),
                Mode::Mps => Some(format!("mps:{}", a.share.unwrap_or(0))),
                Mode::Fractional => Some("fractional".to_string()),
                Mode::Whole | Mode::Idle => None,
            };
            let reconfigured = before != after;
            if reconfigured {
                out.reconfigured += 1;
            }
            // Moves: a current workload stays when the same model is in the
            // same place (the same instance start on MIG) on a GPU whose
            // configuration does not change (a MIG change restarts it).
            let mut here: Vec<(usize, Option<u8>)> = if reconfigured {
                Vec::new()
            } else {
                gpu.workloads.clone()
            }
            .iter()
            .filter_map(|w| model_index.get(w.model.as_str()).map(|&m| (m, w.slot)))
            .collect();
            for (m, _, start, group) in &replicas {
                if let Some(pos) = here
                    .iter()
                    .position(|&(cm, cs)| cm == *m && (a.mode != Mode::Mig || cs == *start))
                {
                    here.swap_remove(pos);
                    matched[*m] += group.map_or(1.0, |(k, _)| 1.0 / f64::from(k));
                }
            }
            let mut slots = Vec::new();
            for (m, profile, start, group) in replicas {
                let replica = match group {
                    Some((_, id)) => *group_replica.entry(id).or_insert_with(|| {
                        next_replica[m] += 1;
                        next_replica[m] - 1
                    }),
                    None => {
                        next_replica[m] += 1;
                        next_replica[m] - 1
                    }
                };
                slots.push(ReplicaSlot {
                    model: models[m].name.clone(),
                    replica,
                    profile,
                    start,
                    group_size: group.map(|(k, _)| k),
                    spare: false,
                });
            }
            out.gpus.push(GpuPlan {
                node: node.name.clone(),
                index: gpu.index,
                gpu_model: node.gpu_model.clone(),
                mode: a.mode,
                geometry: a.geometry.placements().to_vec(),
                timeslice_replicas: a.share.filter(|_| a.mode == Mode::Timeslice),
                mps_replicas: a.share.filter(|_| a.mode == Mode::Mps),
                replicas: slots,
                unhealthy: false,
                gang: None,
            });
        }
    }
    let mut moves = 0.0;
    out.stopped = vec![0; models.len()];
    for m in 0..models.len() {
        let unmatched = (current[m] - matched[m]).max(0.0);
        let removed = (current[m] - f64::from(placed[m])).max(0.0);
        moves += (unmatched - removed).max(0.0);
        out.stopped[m] = removed.round() as u32;
    }
    out.moves = moves.round() as u32;
    out
}

/// A host for a refilled replica: (MiB left, GPU, slot type, its need).
type Host = (u64, (usize, u32), usize, (u32, u32));

/// See [`decode_refilled`]: GPUs that nothing runs on now and that the
/// decode gave only single-GPU replicas (whole, or shares of a fractional
/// GPU), fewest replicas first, are emptied into the fractional GPUs with
/// room (best fit by memory), each GPU wholly or not at all. With
/// `running` ([`decode_consolidated`]), then running fractional GPUs of
/// single-GPU replicas at most [`EMPTY_BELOW`] full, emptiest first, into GPUs at
/// least as full.
fn refill_fractional(
    cluster: &Cluster,
    models: &[Model],
    classes: &[Class],
    assigned: &mut BTreeMap<(usize, u32), Assigned>,
    running: bool,
) {
    let node_class: BTreeMap<usize, usize> = classes
        .iter()
        .enumerate()
        .flat_map(|(c, class)| class.nodes.iter().map(move |&ni| (ni, c)))
        .collect();
    let slot_of =
        |c: usize, kind: &SlotKind| classes[c].slot_types.iter().position(|t| t.kind == *kind);
    // Hosts: fractional GPUs with replicas, and what they hold (MiB, SM %),
    // and how many replicas (HAMi serves at most `cap.shares`).
    let mut load: BTreeMap<(usize, u32), (u64, u64)> = BTreeMap::new();
    let mut held: BTreeMap<(usize, u32), u32> = BTreeMap::new();
    for (&(ni, i), a) in assigned.iter() {
        let Some(&c) = node_class.get(&ni) else {
            continue;
        };
        if a.mode != Mode::Fractional || classes[c].fractional.is_none() {
            continue;
        }
        let mut sum = (0u64, 0u64);
        let mut any = false;
        for sl in a.slots.iter().filter(|sl| sl.model.is_some()) {
            let Some((mib, pct)) = slot_of(c, &sl.kind).and_then(|t| classes[c].slot_types[t].need)
            else {
                continue;
            };
            sum.0 += u64::from(mib);
            sum.1 += u64::from(pct);
            any = true;
        }
        if any {
            load.insert((ni, i), sum);
            held.insert(
                (ni, i),
                a.slots.iter().filter(|sl| sl.model.is_some()).count() as u32,
            );
        }
    }
    if load.is_empty() {
        return;
    }
    // The fraction of a GPU's usable memory its replicas take.
    let fullness = |(ni, _): (usize, u32), replicas: &[usize]| -> f64 {
        let usable = cluster
            .catalog
            .get(&cluster.nodes[ni].gpu_model)
            .map_or(f64::INFINITY, |g| g.usable_gib);
        replicas.iter().map(|&m| models[m].memory_gib).sum::<f64>() / usable
    };
    // Candidates: GPUs opened for new replicas (fullness 0: first), and
    // with `running` the running GPUs at most half full, each replica on
    // one GPU.
    let mut candidates: Vec<((usize, u32), Vec<usize>, f64)> = Vec::new();
    for (&(ni, i), a) in assigned.iter() {
        let runs = !cluster.nodes[ni].gpus[i as usize].workloads.is_empty();
        if runs && !running {
            continue;
        }
        let Some(&c) = node_class.get(&ni) else {
            continue;
        };
        let replicas: Option<Vec<usize>> = match (a.mode, a.whole) {
            // A running whole GPU stays: its replica would run slower
            // on a share.
            (Mode::Whole, Some((m, 1, _))) if !runs => Some(vec![m]),
            (Mode::Fractional, None) => a
                .slots
                .iter()
                .filter_map(|sl| sl.model.map(|m| (m, sl)))
                .map(|(m, sl)| {
                    let t = slot_of(c, &sl.kind)?;
                    (classes[c].slot_types[t].parts <= 1 && sl.group.is_none()).then_some(m)
                })
                .collect(),
            _ => None,
        };
        let Some(r) = replicas.filter(|r| !r.is_empty()) else {
            continue;
        };
        if !runs {
            candidates.push(((ni, i), r, 0.0));
        } else {
            let full = fullness((ni, i), &r);
            if full <= EMPTY_BELOW {
                candidates.push(((ni, i), r, full));
            }
        }
    }
    candidates.sort_by(|a, b| {
        let price = |k: &(usize, u32)| classes[node_class[&k.0]].price;
        a.2.total_cmp(&b.2)
            .then(a.1.len().cmp(&b.1.len()))
            .then(price(&b.0).total_cmp(&price(&a.0)))
            .then(a.0.cmp(&b.0))
    });
    let mut received: std::collections::BTreeSet<(usize, u32)> = Default::default();
    for (gpu, mut replicas, full) in candidates {
        if received.contains(&gpu) {
            continue;
        }
        // Largest first, each into the fullest host it fits.
        replicas.sort_by(|&a, &b| models[b].memory_gib.total_cmp(&models[a].memory_gib));
        let mut tentative: BTreeMap<(usize, u32), (u64, u64)> = BTreeMap::new();
        let mut tentative_n: BTreeMap<(usize, u32), u32> = BTreeMap::new();
        let mut moves: Vec<((usize, u32), usize, usize)> = Vec::new();
        for &m in &replicas {
            let mut best: Option<Host> = None;
            for (&host, &(mib, pct)) in &load {
                if host == gpu {
                    continue;
                }
                let c = node_class[&host.0];
                let class = &classes[c];
                let (Some(cap), Some(t)) =
                    (class.fractional, class.fractional_slot(&models[m].name))
                else {
                    continue;
                };
                // A running GPU's replicas go only where it is as full or
                // fuller.
                if full > 0.0 && (mib as f64) < full * f64::from(cap.memory_mib) {
                    continue;
                }
                let st = &class.slot_types[t];
                let Some(need) = st.need.filter(|_| st.parts <= 1) else {
                    continue;
                };
                let (dm, dp) = tentative.get(&host).copied().unwrap_or((0, 0));
                let mib = mib + dm + u64::from(need.0);
                let pct = pct + dp + u64::from(need.1);
                let n = held.get(&host).copied().unwrap_or(0)
                    + tentative_n.get(&host).copied().unwrap_or(0);
                if mib > u64::from(cap.memory_mib) || pct > u64::from(cap.cores) || n >= cap.shares
                {
                    continue;
                }
                let left = u64::from(cap.memory_mib) - mib;
                if best.is_none_or(|(b, k, _, _)| (left, host) < (b, k)) {
                    best = Some((left, host, t, need));
                }
            }
            let Some((_, host, t, need)) = best else {
                moves.clear();
                break;
            };
            let e = tentative.entry(host).or_insert((0, 0));
            e.0 += u64::from(need.0);
            e.1 += u64::from(need.1);
            *tentative_n.entry(host).or_default() += 1;
            moves.push((host, m, t));
        }
        if moves.len() != replicas.len() {
            continue;
        }
        assigned.remove(&gpu);
        load.remove(&gpu);
        held.remove(&gpu);
        for (host, (dm, dp)) in tentative {
            let e = load.get_mut(&host).expect("hosts are loaded");
            e.0 += dm;
            e.1 += dp;
            received.insert(host);
        }
        for (host, n) in tentative_n {
            *held.entry(host).or_default() += n;
        }
        for (host, m, t) in moves {
            let c = node_class[&host.0];
            let a = assigned.get_mut(&host).expect("hosts are assigned");
            a.slots.push(Slot {
                kind: classes[c].slot_types[t].kind.clone(),
                start: None,
                profile: None,
                model: Some(m),
                group: None,
            });
        }
    }
}

/// The fewest whole GPUs of a node's model that hold one replica.
fn smallest_group(cluster: &Cluster, node: &gpuscale_policies::Node, model: &Model) -> u32 {
    let usable = cluster
        .catalog
        .get(&node.gpu_model)
        .map_or(f64::INFINITY, |g| g.usable_gib);
    model
        .tensor_parallel
        .iter()
        .copied()
        .find(|&k| f64::from(k) * usable + 1e-9 >= model.memory_gib)
        .unwrap_or(1)
        .max(1)
}

fn config_key(
    mode: GpuMode,
    geometry: &Geometry,
    node: &gpuscale_policies::Node,
) -> Option<String> {
    match mode {
        GpuMode::Mig => Some(mig_key(geometry, node_shared(node))),
        GpuMode::Timeslice => Some(format!("share:{}", node.timeslice_replicas.unwrap_or(0))),
        GpuMode::Mps => Some(format!("mps:{}", node.mps_replicas.unwrap_or(0))),
        GpuMode::Fractional => Some("fractional".to_string()),
        GpuMode::Whole | GpuMode::Free => None,
    }
}

/// A MIG GPU's configuration: its profile counts and, when its node
/// time-slices one of its profiles, that profile and `N`.
fn mig_key(geometry: &Geometry, shared: Option<(&str, u8)>) -> String {
    let counts = plain_counts(geometry);
    match shared.filter(|(p, _)| counts.contains_key(*p)) {
        Some((p, n)) => format!("mig:{counts:?}:{p}/{n}"),
        None => format!("mig:{counts:?}"),
    }
}

fn idle(node: String, gpu_model: &str, gpu: &gpuscale_policies::Gpu) -> GpuPlan {
    GpuPlan {
        node,
        index: gpu.index,
        gpu_model: gpu_model.to_string(),
        mode: Mode::Idle,
        geometry: if gpu.mode == GpuMode::Mig {
            gpu.geometry.placements().to_vec()
        } else {
            Vec::new()
        },
        timeslice_replicas: None,
        mps_replicas: None,
        replicas: Vec::new(),
        unhealthy: gpu.health != gpuscale_policies::Health::Healthy,
        gang: None,
    }
}

fn decode_class(
    cluster: &Cluster,
    model_index: &BTreeMap<&str, usize>,
    class: &Class,
    c: usize,
    counts: &Counts,
    assigned: &mut BTreeMap<(usize, u32), Assigned>,
    out: &mut Decoded,
) {
    let g = class.gpus_per_node.max(1);
    let healthy = |ni: usize| {
        cluster.nodes[ni]
            .gpus
            .iter()
            .filter(|x| x.health == Health::Healthy)
            .map(|x| x.index)
    };
    let gpu_state = |ni: usize, idx: u32| &cluster.nodes[ni].gpus[idx as usize];

    // (1) Nodes with a device-plugin config or HAMi: those already
    // configured the same way first, then those sharing the most GPUs now.
    let role_now = |ni: usize| -> Option<Role> {
        let node = &cluster.nodes[ni];
        if node.gpus.iter().any(|x| x.mode == GpuMode::Fractional) {
            return Some(Role::Hami);
        }
        match (
            node.timeslice_replicas,
            node.mps_replicas,
            node_shared(node),
        ) {
            (Some(n), _, _) => Some(Role::Config(NodeConfig::Share(n))),
            (None, Some(n), _) => Some(Role::Config(NodeConfig::Mps(n))),
            (None, None, Some((p, n))) => {
                Some(Role::Config(NodeConfig::MigShare(p.to_string(), n)))
            }
            (None, None, None) => None,
        }
    };
    let mut per_config: BTreeMap<NodeConfig, u32> = BTreeMap::new();
    for (p, pattern) in class.patterns.iter().enumerate() {
        if let Some(q) = pattern.kind.config()
            && counts.patterns[c][p] > 0
        {
            *per_config.entry(q).or_insert(0) += counts.patterns[c][p];
        }
    }
    let mut roles: Vec<(Role, u32)> = per_config
        .into_iter()
        .map(|(q, gpus)| (Role::Config(q), gpus))
        .collect();
    let fractional_gpus: u32 = class
        .patterns
        .iter()
        .zip(&counts.patterns[c])
        .filter(|(p, _)| p.kind == PatternKind::Fractional)
        .map(|(_, &n)| n)
        .sum();
    if fractional_gpus > 0 {
        roles.push((Role::Hami, fractional_gpus));
    }
    let mut designated: BTreeMap<usize, Role> = BTreeMap::new();
    if !roles.is_empty() {
        let mut order: Vec<usize> = class.nodes.clone();
        order.sort_by_key(|&ni| {
            let node = &cluster.nodes[ni];
            let shared = node
                .gpus
                .iter()
                .filter(|x| {
                    matches!(
                        x.mode,
                        GpuMode::Timeslice | GpuMode::Mps | GpuMode::Fractional
                    )
                })
                .count();
            (std::cmp::Reverse(shared), ni)
        });
        // Every role first gets the nodes already configured its way, then
        // the shortfalls are filled, nodes with no role now first, so no
        // role takes a node another role runs on now while others are
        // free.
        let mut short: Vec<(&Role, usize)> = Vec::new();
        for (role, gpus) in &roles {
            let need = gpus.div_ceil(g) as usize;
            let picked: Vec<usize> = order
                .iter()
                .copied()
                .filter(|ni| !designated.contains_key(ni) && role_now(*ni).as_ref() == Some(role))
                .take(need)
                .collect();
            short.push((role, need - picked.len()));
            for ni in picked {
                designated.insert(ni, role.clone());
            }
        }
        // A role's other nodes configured its way that run replicas now
        // keep it while the nodes left over still hold every whole GPU
        // and MIG GPU of the plan (the node rules the counts were solved
        // under): GPUs kept running on them do not move onto the nodes
        // the role needs, and a scale-down does not repack the rest.
        let plain_gpus: u32 = counts
            .whole
            .iter()
            .filter(|((cc, _, _), _)| *cc == c)
            .map(|(&(_, _, k), &n)| k * n)
            .sum::<u32>()
            + class
                .patterns
                .iter()
                .zip(&counts.patterns[c])
                .filter(|(p, _)| matches!(p.kind, PatternKind::Mig(_) | PatternKind::Share(_)))
                .map(|(_, &n)| n)
                .sum::<u32>();
        let missing: usize = short.iter().map(|(_, n)| n).sum();
        let mut budget = class
            .nodes
            .len()
            .saturating_sub(designated.len() + missing)
            .saturating_sub(plain_gpus.div_ceil(g) as usize);
        for (role, _) in &roles {
            let extra: Vec<usize> = order
                .iter()
                .copied()
                .filter(|&ni| {
                    !designated.contains_key(&ni)
                        && role_now(ni).as_ref() == Some(role)
                        && cluster.nodes[ni]
                            .gpus
                            .iter()
                            .any(|x| !x.workloads.is_empty())
                })
                .take(budget)
                .collect();
            budget -= extra.len();
            for ni in extra {
                designated.insert(ni, role.clone());
            }
        }
        let mut spare: Vec<usize> = order
            .iter()
            .copied()
            .filter(|ni| !designated.contains_key(ni))
            .collect();
        spare.sort_by_key(|&ni| role_now(ni).is_some());
        let mut spare = spare.into_iter();
        for (role, missing) in short {
            for ni in spare.by_ref().take(missing) {
                designated.insert(ni, role.clone());
            }
        }
    }

    // (2) Tensor-parallel groups (and single whole GPUs), largest first,
    // best fit over nodes bucketed by free GPUs; where the model runs now
    // first.
    let mut free_gpus: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    let mut buckets: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); g as usize + 1];
    for &ni in class.nodes.iter().filter(|ni| !designated.contains_key(ni)) {
        let free: Vec<u32> = healthy(ni).collect();
        buckets[free.len().min(g as usize)].insert(ni);
        free_gpus.insert(ni, free);
    }
    let mut runs_whole: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &ni in free_gpus.keys() {
        let models_here: BTreeSet<usize> = cluster.nodes[ni]
            .gpus
            .iter()
            .filter(|x| x.mode == GpuMode::Whole)
            .flat_map(|x| x.workloads.iter())
            .filter_map(|w| model_index.get(w.model.as_str()).copied())
            .collect();
        for m in models_here {
            runs_whole.entry(m).or_default().push(ni);
        }
    }
    let mut groups: Vec<(usize, u32)> = Vec::new();
    for (&(cc, m, k), &count) in &counts.whole {
        if cc == c {
            groups.extend(std::iter::repeat_n((m, k), count as usize));
        }
    }
    groups.sort_by_key(|&(m, k)| (std::cmp::Reverse(k), m));
    // Two passes: first every group that can stay where its model runs
    // now, then the new ones, best fit. In one pass a new group sorted
    // ahead (a larger one) could take the node a running group of another
    // model needs to stay on, and move it. But groups kept where they run
    // can split the nodes' free GPUs so that a larger new group finds no
    // node (a consolidation's counts, solved for fewer GPUs, then lost
    // a replica and the whole consolidation with it): then the class's
    // groups are placed again in one pass, largest first, each where its
    // model runs if a node there has room, which moves the running groups
    // that are in the way and no others.
    let class_runs = class.nodes.iter().any(|&ni| {
        cluster.nodes[ni]
            .gpus
            .iter()
            .any(|x| !x.workloads.is_empty())
    });
    let (free_before, buckets_before) = (free_gpus.clone(), buckets.clone());
    for attempt in 0..2 {
        let one_pass = attempt == 1;
        let mut inserted: Vec<(usize, u32)> = Vec::new();
        let mut failed: Vec<usize> = Vec::new();
        let mut new_groups: Vec<(usize, u32)> = Vec::new();
        let mut todo = groups.clone();
        for pass in 0..2 {
            let list = if pass == 0 {
                std::mem::take(&mut todo)
            } else {
                std::mem::take(&mut new_groups)
            };
            for (m, k) in list {
                let runs_here = |ni: usize, idx: u32| {
                    let s = gpu_state(ni, idx);
                    s.mode == GpuMode::Whole
                        && s.workloads
                            .iter()
                            .any(|w| model_index.get(w.model.as_str()) == Some(&m))
                };
                let home = runs_whole.get(&m).and_then(|nodes| {
                    nodes.iter().copied().find(|ni| {
                        free_gpus[ni].iter().filter(|&&i| runs_here(*ni, i)).count() >= k as usize
                    })
                });
                let node = match (pass, home) {
                    (_, Some(ni)) => Some(ni),
                    (0, None) if !one_pass => {
                        new_groups.push((m, k));
                        continue;
                    }
                    // A new group: where it stops the fewest GPUs running now
                    // (nodes whose replicas the plan moved off or trims), then
                    // best fit.
                    _ if class_runs => free_gpus
                        .iter()
                        .filter(|(_, free)| free.len() >= k as usize)
                        .map(|(&ni, free)| {
                            let idle = free
                                .iter()
                                .filter(|&&i| gpu_state(ni, i).workloads.is_empty())
                                .count();
                            ((k as usize).saturating_sub(idle), free.len(), ni)
                        })
                        .min()
                        .map(|(_, _, ni)| ni),
                    _ => {
                        (k as usize..buckets.len()).find_map(|f| buckets[f].iter().next().copied())
                    }
                };
                let Some(ni) = node else {
                    failed.push(m);
                    continue;
                };
                let free = free_gpus
                    .get_mut(&ni)
                    .expect("bucketed nodes have free lists");
                buckets[free.len().min(g as usize)].remove(&ni);
                // Where it runs now first, then GPUs running nothing now.
                free.sort_by_key(|&i| {
                    (!runs_here(ni, i), !gpu_state(ni, i).workloads.is_empty(), i)
                });
                let chosen: Vec<u32> = free.drain(..k as usize).collect();
                free.sort_unstable();
                buckets[free.len().min(g as usize)].insert(ni);
                out.next_group += 1;
                for i in chosen {
                    inserted.push((ni, i));
                    assigned.insert(
                        (ni, i),
                        Assigned {
                            mode: Mode::Whole,
                            geometry: Geometry::default(),
                            share: None,
                            slots: Vec::new(),
                            whole: Some((m, k, out.next_group)),
                            mig_share: None,
                        },
                    );
                }
            }
        }
        if failed.is_empty() || one_pass {
            for m in failed {
                out.failed[m] += 1;
            }
            break;
        }
        for key in inserted {
            assigned.remove(&key);
        }
        free_gpus.clone_from(&free_before);
        buckets.clone_from(&buckets_before);
    }

    // (3) Time-sliced and MPS GPUs on their nodes.
    let config_gpu = |q: &NodeConfig| {
        let (mode, slot, n) = match q {
            NodeConfig::Share(n) => (Mode::Timeslice, SlotKind::Share(*n), *n),
            NodeConfig::Mps(n) => (Mode::Mps, SlotKind::Mps(*n), *n),
            NodeConfig::MigShare(..) => unreachable!("whole-GPU configs only"),
        };
        Assigned {
            mode,
            geometry: Geometry::default(),
            share: Some(n),
            slots: (0..n).map(|_| Slot::empty(slot.clone())).collect(),
            whole: None,
            mig_share: None,
        }
    };
    for (role, gpus) in &roles {
        let Role::Config(q) = role else {
            continue;
        };
        if matches!(q, NodeConfig::MigShare(..)) {
            continue;
        }
        let gpus = *gpus;
        let mut need = gpus;
        let mut nodes: Vec<usize> = designated
            .iter()
            .filter(|&(_, r)| r == role)
            .map(|(&ni, _)| ni)
            .collect();
        // Whole GPUs may have crowded the chosen nodes: then also nodes
        // with no whole GPU and no other role.
        let spare: Vec<usize> = class
            .nodes
            .iter()
            .copied()
            .filter(|ni| {
                !designated.contains_key(ni)
                    && !healthy(*ni).any(|i| {
                        assigned
                            .get(&(*ni, i))
                            .is_some_and(|a| a.mode == Mode::Whole)
                    })
            })
            .collect();
        nodes.extend(spare);
        let shared_now = match q {
            NodeConfig::Mps(_) => GpuMode::Mps,
            _ => GpuMode::Timeslice,
        };
        for ni in nodes {
            if need == 0 {
                break;
            }
            let mut free: Vec<u32> = healthy(ni)
                .filter(|&i| !assigned.contains_key(&(ni, i)))
                .collect();
            free.sort_by_key(|&i| (gpu_state(ni, i).mode != shared_now, i));
            for i in free.into_iter().take(need as usize) {
                need -= 1;
                assigned.insert((ni, i), config_gpu(q));
                designated.insert(ni, role.clone());
                free_gpus.remove(&ni);
            }
        }
    }

    for (&ni, role) in &designated {
        let Role::Config(q) = role else {
            continue;
        };
        let shares = healthy(ni).any(|i| {
            assigned
                .get(&(ni, i))
                .is_some_and(|a| matches!(a.mode, Mode::Timeslice | Mode::Mps))
        });
        if shares {
            let name = cluster.nodes[ni].name.clone();
            match q {
                NodeConfig::Share(n) => {
                    out.timeslice_nodes.insert(name, *n);
                }
                NodeConfig::Mps(n) => {
                    out.mps_nodes.insert(name, *n);
                }
                NodeConfig::MigShare(..) => {}
            }
        }
    }

    // (4) MIG GPUs: plain geometries on nodes with no config but
    // time-slicing whole GPUs, time-sliced ones on their nodes; GPUs
    // already in the pattern's geometry first, then GPUs running nothing,
    // then the rest.
    type Pool = (
        BTreeMap<BTreeMap<String, u32>, Vec<(usize, u32)>>,
        Vec<(usize, u32)>,
        usize,
    );
    let mut pools: BTreeMap<Option<NodeConfig>, Pool> = BTreeMap::new();
    for &ni in &class.nodes {
        let pool = match designated.get(&ni) {
            Some(Role::Hami) | Some(Role::Config(NodeConfig::Mps(_))) => continue,
            Some(Role::Config(q @ NodeConfig::MigShare(..))) => Some(q.clone()),
            Some(Role::Config(NodeConfig::Share(_))) | None => None,
        };
        let (same_geometry, rest, _) = pools.entry(pool).or_default();
        for i in healthy(ni) {
            if assigned.contains_key(&(ni, i)) {
                continue;
            }
            let s = gpu_state(ni, i);
            if s.mode == GpuMode::Mig {
                same_geometry
                    .entry(plain_counts(&s.geometry))
                    .or_default()
                    .push((ni, i));
            }
            rest.push((ni, i));
        }
    }
    for (_, rest, _) in pools.values_mut() {
        rest.sort_by_key(|&(ni, i)| (!gpu_state(ni, i).workloads.is_empty(), ni, i));
    }
    for (p, pattern) in class.patterns.iter().enumerate() {
        let Some(canonical) = pattern.kind.geometry() else {
            continue;
        };
        let mut need = counts.patterns[c][p];
        if need == 0 {
            continue;
        }
        let config = pattern.kind.config();
        let mig_share = match &config {
            Some(NodeConfig::MigShare(profile, n)) => Some((profile.clone(), *n)),
            _ => None,
        };
        let Some((same_geometry, rest, cursor)) = pools.get_mut(&config) else {
            continue;
        };
        let want = plain_counts(canonical);
        let mut chosen: Vec<((usize, u32), Geometry)> = Vec::new();
        let mut picked: BTreeSet<(usize, u32)> = BTreeSet::new();
        for &(ni, i) in same_geometry.get(&want).into_iter().flatten() {
            if need == 0 {
                break;
            }
            if !assigned.contains_key(&(ni, i)) && picked.insert((ni, i)) {
                need -= 1;
                chosen.push(((ni, i), gpu_state(ni, i).geometry.clone()));
            }
        }
        while need > 0 && *cursor < rest.len() {
            let key = rest[*cursor];
            *cursor += 1;
            if assigned.contains_key(&key) || !picked.insert(key) {
                continue;
            }
            need -= 1;
            chosen.push((key, canonical.clone()));
        }
        let shared = mig_share.as_ref().map(|(p, n)| (p.as_str(), *n));
        for (key, geometry) in chosen {
            let mut slots = Vec::new();
            for pl in geometry.placements() {
                let Some(t) = class.instance_slot(&pl.profile, shared) else {
                    continue;
                };
                let copies = match &class.slot_types[t].kind {
                    SlotKind::MigShare(_, n) => *n,
                    _ => 1,
                };
                for _ in 0..copies {
                    slots.push(Slot {
                        kind: class.slot_types[t].kind.clone(),
                        start: Some(pl.start),
                        profile: Some(pl.profile.clone()),
                        model: None,
                        group: None,
                    });
                }
            }
            assigned.insert(
                key,
                Assigned {
                    mode: Mode::Mig,
                    geometry,
                    share: None,
                    slots,
                    whole: None,
                    mig_share: mig_share.clone(),
                },
            );
        }
    }

    // (5) Fractional GPUs on HAMi nodes; tensor-parallel replicas' shares
    // are placed there in their groups.
    fractional::place(
        &fractional::Context {
            cluster,
            class,
            c,
            counts,
        },
        &mut designated,
        assigned,
        out,
    );
    for (&ni, role) in &designated {
        if *role == Role::Hami
            && healthy(ni).any(|i| {
                assigned
                    .get(&(ni, i))
                    .is_some_and(|a| a.mode == Mode::Fractional)
            })
        {
            out.hami_nodes.insert(cluster.nodes[ni].name.clone());
        }
    }

    // (6) Replicas into slots: where the model runs now first.
    let class_gpus: Vec<(usize, u32)> = class
        .nodes
        .iter()
        .flat_map(|&ni| healthy(ni).map(move |i| (ni, i)))
        .filter(|key| assigned.contains_key(key))
        .collect();
    let slot_type = |kind: &SlotKind| {
        class
            .slot_types
            .iter()
            .position(|st| st.kind == *kind)
            .expect("slot kinds come from the class")
    };
    // Tensor-parallel shares were placed with their groups in (5).
    let single = |t: usize| class.slot_types[t].parts <= 1;
    let mut wanted: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    for (&(cc, m, t), &count) in &counts.slots {
        if cc == c && single(t) {
            wanted.insert((m, t), count);
        }
    }
    for &(ni, i) in &class_gpus {
        let s = gpu_state(ni, i);
        let a = assigned.get_mut(&(ni, i)).expect("listed from assigned");
        let mode = a.mode;
        if mode == Mode::Whole {
            continue;
        }
        for w in &s.workloads {
            let Some(&m) = model_index.get(w.model.as_str()) else {
                continue;
            };
            // A free slot of a type this model is wanted in (the same
            // instance on MIG); fractional GPUs have a type per model.
            if let Some(sl) = a.slots.iter_mut().find(|sl| {
                sl.model.is_none()
                    && (mode != Mode::Mig || sl.start == w.slot)
                    && wanted
                        .get(&(m, slot_type(&sl.kind)))
                        .is_some_and(|&left| left > 0)
            }) {
                *wanted
                    .get_mut(&(m, slot_type(&sl.kind)))
                    .expect("checked above") -= 1;
                sl.model = Some(m);
            }
        }
    }
    let mut free_by_type: BTreeMap<usize, Vec<(usize, u32, usize)>> = BTreeMap::new();
    for &(ni, i) in &class_gpus {
        for (k, sl) in assigned[&(ni, i)].slots.iter().enumerate() {
            if sl.model.is_none() && single(slot_type(&sl.kind)) {
                free_by_type
                    .entry(slot_type(&sl.kind))
                    .or_default()
                    .push((ni, i, k));
            }
        }
    }
    let mut cursors: BTreeMap<usize, usize> = BTreeMap::new();
    for ((m, t), left) in wanted {
        let free = free_by_type.get(&t).map(Vec::as_slice).unwrap_or(&[]);
        let at = cursors.entry(t).or_insert(0);
        for _ in 0..left {
            match free.get(*at) {
                Some(&(ni, i, k)) => {
                    *at += 1;
                    if let Some(a) = assigned.get_mut(&(ni, i)) {
                        a.slots[k].model = Some(m);
                    }
                }
                None => out.failed[m] += 1,
            }
        }
    }
    // GPUs that ended with no replica are idle after all.
    for key in class_gpus {
        let a = &assigned[&key];
        if a.whole.is_none() && a.slots.iter().all(|s| s.model.is_none()) {
            assigned.remove(&key);
        } else if let Some(shared) = &a.mig_share {
            out.mig_timeslice_nodes
                .insert(cluster.nodes[key.0].name.clone(), shared.clone());
        }
    }
}
