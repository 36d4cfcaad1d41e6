//! Mapping the ILP's counts onto concrete GPUs, preferring what is already
//! there: GPUs already in the needed geometry, replicas already in place.
//!
//! Per class, in this order: (1) choose the nodes that get a device-plugin
//! config (time-slicing or MPS into `N`) or run HAMi, those already
//! configured the same way first; (2) place tensor-parallel groups, largest
//! first, on the other nodes — where the model already runs if it can,
//! else best fit; (3) time-sliced and MPS GPUs on their nodes; (4) MIG
//! GPUs (not on MPS or HAMi nodes), keeping GPUs whose current geometry has
//! the pattern's profiles; (5) fractional GPUs on HAMi nodes: replicas
//! already on a fractional GPU stay, and the rest fill GPU after GPU, each
//! kept near the memory-to-SM proportion of what is left to place — more
//! GPUs than the ILP's count if the
//! aggregate bound was not enough, on free GPUs of HAMi nodes, then on
//! free nodes;
//! (6) replicas into slots, the slot a replica already occupies first.
//! Each step is linear in the class's GPUs and replicas (plus sorting;
//! step 5 is replicas × models × 2).

use std::collections::{BTreeMap, BTreeSet};

use gpuscale_policies::{Cluster, Geometry, GpuMode, Health, Model};

use crate::classes::{
    Class, PatternKind, SlotKind, fractional_need, fractional_part, plain_counts,
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
    /// GPUs whose configuration changes.
    pub reconfigured: u32,
    /// Time-slicing `N` per node name.
    pub timeslice_nodes: BTreeMap<String, u8>,
    /// MPS `N` per node name.
    pub mps_nodes: BTreeMap<String, u8>,
    /// Nodes running HAMi.
    pub hami_nodes: BTreeSet<String>,
    /// Classes whose fractional replicas did not all fit: (fractional GPUs
    /// the ILP counted, GPUs the packing needed).
    pub fractional_short: BTreeMap<usize, (u32, u32)>,
    next_group: u32,
}

/// A replica on a fractional GPU: model, and (group size, group number)
/// when it is one share of a tensor-parallel replica.
type Member = (usize, Option<(u32, u32)>);

/// (model, MIG profile, MIG start, (group size, group number)).
type PlacedReplica = (usize, Option<String>, Option<u8>, Option<(u32, u32)>);

#[derive(Debug, Clone)]
struct Slot {
    kind: SlotKind,
    start: Option<u8>,
    profile: Option<String>,
    model: Option<usize>,
}

#[derive(Debug, Clone)]
struct Assigned {
    mode: Mode,
    geometry: Geometry,
    share: Option<u8>,
    slots: Vec<Slot>,
    /// (model, group size, group number) for whole GPUs.
    whole: Option<(usize, u32, u32)>,
    /// Replicas on a fractional GPU.
    fractional: Vec<Member>,
}

/// What a node is designated for in a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A device-plugin config: the pattern (time-slicing or MPS) it serves.
    Config(usize),
    /// HAMi (fractional GPUs).
    Hami,
}

/// Decodes one solution.
pub fn decode(cluster: &Cluster, models: &[Model], classes: &[Class], counts: &Counts) -> Decoded {
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
        decode_class(
            cluster,
            &model_index,
            models,
            class,
            c,
            counts,
            &mut assigned,
            &mut out,
        );
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
                    replicas.push((m, s.profile.clone(), s.start, None));
                }
            }
            if let Some((m, k, group)) = a.whole {
                replicas.push((m, None, None, Some((k, group))));
            }
            for &(m, group) in &a.fractional {
                replicas.push((m, None, None, group));
            }
            // Reconfiguration: the MIG or sharing configuration changes.
            let before = config_key(gpu.mode, &gpu.geometry, node);
            let after = match a.mode {
                Mode::Mig => Some(format!("mig:{:?}", plain_counts(&a.geometry))),
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
            });
        }
    }
    let mut moves = 0.0;
    for m in 0..models.len() {
        let unmatched = (current[m] - matched[m]).max(0.0);
        let removed = (current[m] - f64::from(placed[m])).max(0.0);
        moves += (unmatched - removed).max(0.0);
    }
    out.moves = moves.round() as u32;
    out
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
        GpuMode::Mig => Some(format!("mig:{:?}", plain_counts(geometry))),
        GpuMode::Timeslice => Some(format!("share:{}", node.timeslice_replicas.unwrap_or(0))),
        GpuMode::Mps => Some(format!("mps:{}", node.mps_replicas.unwrap_or(0))),
        GpuMode::Fractional => Some("fractional".to_string()),
        GpuMode::Whole | GpuMode::Free => None,
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
    }
}

#[allow(clippy::too_many_arguments)]
fn decode_class(
    cluster: &Cluster,
    model_index: &BTreeMap<&str, usize>,
    models: &[Model],
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
        let kind = match (node.timeslice_replicas, node.mps_replicas) {
            (Some(n), _) => PatternKind::Share(n),
            (None, Some(n)) => PatternKind::Mps(n),
            (None, None) => return None,
        };
        class
            .patterns
            .iter()
            .position(|p| p.kind == kind)
            .map(Role::Config)
    };
    let mut roles: Vec<(Role, u32)> = class
        .patterns
        .iter()
        .enumerate()
        .filter(|(p, pattern)| pattern.kind.node_config() && counts.patterns[c][*p] > 0)
        .map(|(p, _)| (Role::Config(p), counts.patterns[c][p]))
        .collect();
    let fractional_gpus = counts.fractional_gpus.get(c).copied().unwrap_or(0);
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
        for &(role, gpus) in &roles {
            let need = gpus.div_ceil(g) as usize;
            let mut picked: Vec<usize> = order
                .iter()
                .copied()
                .filter(|ni| !designated.contains_key(ni) && role_now(*ni) == Some(role))
                .take(need)
                .collect();
            if picked.len() < need {
                let more: Vec<usize> = order
                    .iter()
                    .copied()
                    .filter(|ni| !designated.contains_key(ni) && !picked.contains(ni))
                    .take(need - picked.len())
                    .collect();
                picked.extend(more);
            }
            for ni in picked {
                designated.insert(ni, role);
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
    for (m, k) in groups {
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
        let node = home.or_else(|| {
            (k as usize..buckets.len()).find_map(|f| buckets[f].iter().next().copied())
        });
        let Some(ni) = node else {
            out.failed[m] += 1;
            continue;
        };
        let free = free_gpus
            .get_mut(&ni)
            .expect("bucketed nodes have free lists");
        buckets[free.len().min(g as usize)].remove(&ni);
        free.sort_by_key(|&i| (!runs_here(ni, i), i));
        let chosen: Vec<u32> = free.drain(..k as usize).collect();
        free.sort_unstable();
        buckets[free.len().min(g as usize)].insert(ni);
        out.next_group += 1;
        for i in chosen {
            assigned.insert(
                (ni, i),
                Assigned {
                    mode: Mode::Whole,
                    geometry: Geometry::default(),
                    share: None,
                    slots: Vec::new(),
                    whole: Some((m, k, out.next_group)),
                    fractional: Vec::new(),
                },
            );
        }
    }

    // (3) Time-sliced and MPS GPUs on their nodes.
    let config_gpu = |p: usize| {
        let (mode, slot, n) = match class.patterns[p].kind {
            PatternKind::Share(n) => (Mode::Timeslice, SlotKind::Share(n), n),
            PatternKind::Mps(n) => (Mode::Mps, SlotKind::Mps(n), n),
            PatternKind::Mig(_) => unreachable!("config roles are time-slicing or MPS"),
        };
        Assigned {
            mode,
            geometry: Geometry::default(),
            share: Some(n),
            slots: (0..n)
                .map(|_| Slot {
                    kind: slot.clone(),
                    start: None,
                    profile: None,
                    model: None,
                })
                .collect(),
            whole: None,
            fractional: Vec::new(),
        }
    };
    for &(role, gpus) in &roles {
        let Role::Config(p) = role else {
            continue;
        };
        let mut need = gpus;
        let mut nodes: Vec<usize> = designated
            .iter()
            .filter(|&(_, &r)| r == role)
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
        let shared_now = match class.patterns[p].kind {
            PatternKind::Mps(_) => GpuMode::Mps,
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
                assigned.insert((ni, i), config_gpu(p));
                designated.insert(ni, role);
                free_gpus.remove(&ni);
            }
        }
    }

    for (&ni, &role) in &designated {
        let Role::Config(p) = role else {
            continue;
        };
        let shares = healthy(ni).any(|i| {
            assigned
                .get(&(ni, i))
                .is_some_and(|a| matches!(a.mode, Mode::Timeslice | Mode::Mps))
        });
        if shares {
            let name = cluster.nodes[ni].name.clone();
            match class.patterns[p].kind {
                PatternKind::Share(n) => {
                    out.timeslice_nodes.insert(name, n);
                }
                PatternKind::Mps(n) => {
                    out.mps_nodes.insert(name, n);
                }
                PatternKind::Mig(_) => {}
            }
        }
    }

    // (4) MIG GPUs: GPUs already in the pattern's geometry first, then GPUs
    // running nothing, then the rest.
    let mut same_geometry: BTreeMap<BTreeMap<String, u32>, Vec<(usize, u32)>> = BTreeMap::new();
    let mut rest: Vec<(usize, u32)> = Vec::new();
    let no_mig = |ni: &usize| match designated.get(ni) {
        Some(Role::Hami) => true,
        Some(Role::Config(p)) => matches!(class.patterns[*p].kind, PatternKind::Mps(_)),
        None => false,
    };
    for &ni in class.nodes.iter().filter(|ni| !no_mig(ni)) {
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
    rest.sort_by_key(|&(ni, i)| (!gpu_state(ni, i).workloads.is_empty(), ni, i));
    let mut cursor = 0;
    for (p, pattern) in class.patterns.iter().enumerate() {
        let PatternKind::Mig(canonical) = &pattern.kind else {
            continue;
        };
        let mut need = counts.patterns[c][p];
        if need == 0 {
            continue;
        }
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
        while need > 0 && cursor < rest.len() {
            let key = rest[cursor];
            cursor += 1;
            if assigned.contains_key(&key) || !picked.insert(key) {
                continue;
            }
            need -= 1;
            chosen.push((key, canonical.clone()));
        }
        for (key, geometry) in chosen {
            let slots = geometry
                .placements()
                .iter()
                .filter_map(|pl| {
                    class.mig_slot(&pl.profile).map(|t| Slot {
                        kind: class.slot_types[t].kind.clone(),
                        start: Some(pl.start),
                        profile: Some(pl.profile.clone()),
                        model: None,
                    })
                })
                .collect();
            assigned.insert(
                key,
                Assigned {
                    mode: Mode::Mig,
                    geometry,
                    share: None,
                    slots,
                    whole: None,
                    fractional: Vec::new(),
                },
            );
        }
    }

    // (5) Fractional GPUs on HAMi nodes.
    fractional_gpus_of_class(
        cluster,
        model_index,
        models,
        class,
        c,
        counts,
        &mut designated,
        assigned,
        out,
    );
    for (&ni, &role) in &designated {
        if role == Role::Hami
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
    let mut wanted: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    for (&(cc, m, t), &count) in &counts.slots {
        if cc == c {
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
            if let Some(sl) = a
                .slots
                .iter_mut()
                .find(|sl| sl.model.is_none() && (mode != Mode::Mig || sl.start == w.slot))
                && let Some(left) = wanted.get_mut(&(m, slot_type(&sl.kind)))
                && *left > 0
            {
                *left -= 1;
                sl.model = Some(m);
            }
        }
    }
    let mut free_by_type: BTreeMap<usize, Vec<(usize, u32, usize)>> = BTreeMap::new();
    for &(ni, i) in &class_gpus {
        for (k, sl) in assigned[&(ni, i)].slots.iter().enumerate() {
            if sl.model.is_none() {
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
        if a.whole.is_none() && a.fractional.is_empty() && a.slots.iter().all(|s| s.model.is_none())
        {
            assigned.remove(&key);
        }
    }
}

/// Step (5) of [`decode_class`]: the class's fractional replicas onto
/// concrete GPUs of HAMi nodes.
#[allow(clippy::too_many_arguments)]
fn fractional_gpus_of_class(
    cluster: &Cluster,
    model_index: &BTreeMap<&str, usize>,
    models: &[Model],
    class: &Class,
    c: usize,
    counts: &Counts,
    designated: &mut BTreeMap<usize, Role>,
    assigned: &mut BTreeMap<(usize, u32), Assigned>,
    out: &mut Decoded,
) {
    let Some(cap) = class.fractional else {
        return;
    };
    let mut left: BTreeMap<usize, u32> = counts
        .fractional
        .range((c, 0)..(c + 1, 0))
        .map(|(&(_, m), &n)| (m, n))
        .collect();
    if left.values().all(|&n| n == 0) {
        return;
    }
    let part = |m: usize| fractional_part(&models[m], class);
    let degree = |m: usize| part(m).map_or(1, |p| p.gpus);
    let need = |m: usize| {
        part(m).map_or_else(
            || fractional_need(&models[m], class.compute, 1),
            |p| p.need(),
        )
    };
    // An open GPU: (key, MiB left, SM percent left, replicas on it).
    struct Open {
        key: (usize, u32),
        mib: u32,
        pct: u32,
        models: Vec<Member>,
    }
    let mut open: Vec<Open> = Vec::new();
    let free_on = |ni: usize, assigned: &BTreeMap<(usize, u32), Assigned>| -> Vec<u32> {
        let mut free: Vec<u32> = cluster.nodes[ni]
            .gpus
            .iter()
            .filter(|x| x.health == Health::Healthy && !assigned.contains_key(&(ni, x.index)))
            .map(|x| x.index)
            .collect();
        let state = |i: u32| &cluster.nodes[ni].gpus[i as usize];
        free.sort_by_key(|&i| {
            (
                state(i).mode != GpuMode::Fractional,
                !state(i).workloads.is_empty(),
                i,
            )
        });
        free
    };
    let hami: Vec<usize> = designated
        .iter()
        .filter(|&(_, &r)| r == Role::Hami)
        .map(|(&ni, _)| ni)
        .collect();
    // Replicas already on fractional GPUs of a HAMi node stay there: a
    // tensor-parallel one where `k` GPUs of the node each run the model.
    for &ni in &hami {
        let mut here: Vec<(Open, Vec<usize>)> = free_on(ni, assigned)
            .into_iter()
            .filter(|&i| cluster.nodes[ni].gpus[i as usize].mode == GpuMode::Fractional)
            .map(|i| {
                let running = cluster.nodes[ni].gpus[i as usize]
                    .workloads
                    .iter()
                    .filter_map(|w| model_index.get(w.model.as_str()).copied())
                    .collect();
                let gpu = Open {
                    key: (ni, i),
                    mib: cap.memory_mib,
                    pct: cap.cores,
                    models: Vec::new(),
                };
                (gpu, running)
            })
            .collect();
        let grouped: BTreeSet<usize> = here
            .iter()
            .flat_map(|(_, running)| running.iter().copied())
            .filter(|&m| degree(m) > 1)
            .collect();
        for m in grouped {
            let (k, (mib, pct)) = (degree(m), need(m));
            while left.get(&m).is_some_and(|&n| n > 0) {
                let with: Vec<usize> = (0..here.len())
                    .filter(|&j| {
                        let (gpu, running) = &here[j];
                        running.contains(&m) && mib <= gpu.mib && pct <= gpu.pct
                    })
                    .take(k as usize)
                    .collect();
                if with.len() < k as usize {
                    break;
                }
                out.next_group += 1;
                for j in with {
                    let (gpu, running) = &mut here[j];
                    let at = running.iter().position(|&x| x == m).expect("filtered");
                    running.swap_remove(at);
                    gpu.mib -= mib;
                    gpu.pct -= pct;
                    gpu.models.push((m, Some((k, out.next_group))));
                }
                *left.get_mut(&m).expect("checked") -= 1;
            }
        }
        for (mut gpu, running) in here {
            for m in running {
                let (mib, pct) = need(m);
                if degree(m) == 1
                    && let Some(n) = left.get_mut(&m)
                    && *n > 0
                    && mib <= gpu.mib
                    && pct <= gpu.pct
                {
                    *n -= 1;
                    gpu.mib -= mib;
                    gpu.pct -= pct;
                    gpu.models.push((m, None));
                }
            }
            if !gpu.models.is_empty() {
                assigned.insert(gpu.key, fractional_gpu(Vec::new()));
                open.push(gpu);
            }
        }
    }
    // New tensor-parallel replicas, largest share first, into blocks (the
    // GPUs of one node, at most a node's worth), by two rules; the one that
    // needs the fewest GPUs is kept.
    let (cap_mib, cap_pct) = (cap.memory_mib, cap.cores);
    let mut grouped: Vec<GroupKind> = left
        .iter()
        .filter(|&(&m, &n)| n > 0 && degree(m) > 1)
        .map(|(&m, &n)| {
            let (mib, pct) = need(m);
            GroupKind {
                model: m,
                replicas: n,
                k: degree(m),
                mib,
                pct,
            }
        })
        .collect();
    grouped.sort_by_key(|k| {
        let (a, b) = (
            u64::from(k.mib) * u64::from(cap_pct),
            u64::from(k.pct) * u64::from(cap_mib),
        );
        (std::cmp::Reverse(a.max(b)), k.model)
    });
    let blocks_of = |rule: GroupRule| {
        place_groups(rule, &grouped, class.gpus_per_node.max(1), cap_mib, cap_pct)
    };
    let blocks = [GroupRule::BestFit, GroupRule::Spread]
        .into_iter()
        .map(blocks_of)
        .min_by_key(|blocks| blocks.iter().map(Vec::len).sum::<usize>())
        .expect("two rules");
    for k in &grouped {
        left.insert(k.model, 0);
    }
    let base = out.next_group;
    let mut groups_placed = 0;
    let mut blocks: Vec<Vec<Open>> = blocks
        .into_iter()
        .map(|block| {
            block
                .into_iter()
                .map(|share| {
                    let members = share
                        .members
                        .iter()
                        .map(|&(m, id)| {
                            groups_placed = groups_placed.max(id + 1);
                            (m, Some((degree(m), base + 1 + id)))
                        })
                        .collect();
                    Open {
                        key: (usize::MAX, 0),
                        mib: share.mib,
                        pct: share.pct,
                        models: members,
                    }
                })
                .collect()
        })
        .collect();
    out.next_group += groups_placed;
    // The single-GPU replicas: packed in the abstract onto the room the
    // GPUs above left and then new GPUs, by each of four rules, the one
    // needing the fewest new GPUs kept; then the new GPUs (and the blocks)
    // given concrete GPUs of HAMi nodes (more nodes if need be).
    let types: Vec<Kind> = left
        .iter()
        .filter(|&(_, &n)| n > 0)
        .map(|(&m, &n)| {
            let (mib, pct) = need(m);
            Kind {
                model: m,
                left: n,
                mib,
                pct,
            }
        })
        .collect();
    let kept: Vec<Bin> = open
        .iter()
        .chain(blocks.iter().flatten())
        .map(|o| Bin {
            mib: o.mib,
            pct: o.pct,
            models: Vec::new(),
        })
        .collect();
    let fractional_gpus = counts.fractional_gpus.get(c).copied().unwrap_or(0);
    let (kept_found, new) = [
        Rule::Spread,
        Rule::Proportional,
        Rule::DotProduct,
        Rule::Decreasing,
    ]
    .into_iter()
    .map(|rule| pack_bins(rule, kept.clone(), types.clone(), cap_mib, cap_pct))
    .min_by_key(|(_, new)| new.len())
    .expect("four rules");
    // Fewer GPUs than the rules found may still do (the ILP counted
    // `fractional_gpus`): in a small class, a bounded exact search tries
    // each count from there up.
    let counted = (fractional_gpus as usize).saturating_sub(kept.len());
    let replicas: u32 = types.iter().map(|k| k.left).sum();
    let (kept, new) = if replicas <= EXACT_REPLICAS {
        (counted..new.len())
            .find_map(|target| exact_bins(&kept, &types, cap_mib, cap_pct, target, EXACT_NODES))
            .unwrap_or((kept_found, new))
    } else {
        (kept_found, new)
    };
    let needed = (kept.len() + new.len()) as u32;
    let mut additions = kept.into_iter();
    for (gpu, bin) in open
        .iter_mut()
        .chain(blocks.iter_mut().flatten())
        .zip(&mut additions)
    {
        gpu.models.extend(bin.models.into_iter().map(|m| (m, None)));
    }
    let mut hami = hami;
    // A node with nothing assigned becomes a HAMi node.
    let spare_node = |designated: &BTreeMap<usize, Role>,
                      assigned: &BTreeMap<(usize, u32), Assigned>| {
        class.nodes.iter().copied().find(|&ni| {
            !designated.contains_key(&ni)
                && !cluster.nodes[ni]
                    .gpus
                    .iter()
                    .any(|x| assigned.contains_key(&(ni, x.index)))
        })
    };
    let mut cursor = 0;
    for block in blocks {
        let k = block.len();
        let mut gpus: Option<Vec<u32>> = None;
        loop {
            if cursor < hami.len() {
                let free = free_on(hami[cursor], assigned);
                if free.len() >= k {
                    gpus = Some(free.into_iter().take(k).collect());
                    break;
                }
                cursor += 1;
                continue;
            }
            match spare_node(designated, assigned) {
                Some(ni) => {
                    designated.insert(ni, Role::Hami);
                    hami.push(ni);
                }
                None => break,
            }
        }
        let Some(gpus) = gpus else {
            for g in block.iter().take(1) {
                for &(m, _) in &g.models {
                    out.failed[m] += 1;
                }
            }
            for g in block.iter().skip(1) {
                for &(m, group) in &g.models {
                    if group.is_none() {
                        out.failed[m] += 1;
                    }
                }
            }
            out.fractional_short.insert(c, (fractional_gpus, needed));
            continue;
        };
        let ni = hami[cursor];
        for (mut g, i) in block.into_iter().zip(gpus) {
            g.key = (ni, i);
            assigned.insert(g.key, fractional_gpu(Vec::new()));
            open.push(g);
        }
    }
    let mut cursor = 0;
    for bin in new {
        let mut key = None;
        loop {
            if cursor < hami.len() {
                match free_on(hami[cursor], assigned).first() {
                    Some(&i) => {
                        key = Some((hami[cursor], i));
                        break;
                    }
                    None => {
                        cursor += 1;
                        continue;
                    }
                }
            }
            match spare_node(designated, assigned) {
                Some(ni) => {
                    designated.insert(ni, Role::Hami);
                    hami.push(ni);
                }
                None => break,
            }
        }
        match key {
            Some(key) => {
                // Reserved now so later openings skip it; filled below.
                assigned.insert(key, fractional_gpu(Vec::new()));
                open.push(Open {
                    key,
                    mib: bin.mib,
                    pct: bin.pct,
                    models: bin.models.into_iter().map(|m| (m, None)).collect(),
                });
            }
            None => {
                for m in bin.models {
                    out.failed[m] += 1;
                }
                out.fractional_short.insert(c, (fractional_gpus, needed));
            }
        }
    }
    for gpu in open {
        assigned.insert(gpu.key, fractional_gpu(gpu.models));
    }

    fn fractional_gpu(models: Vec<Member>) -> Assigned {
        Assigned {
            mode: Mode::Fractional,
            geometry: Geometry::default(),
            share: None,
            slots: Vec::new(),
            whole: None,
            fractional: models,
        }
    }
}

/// A model's tensor-parallel replicas still to place on fractional GPUs:
/// `k` shares of `mib` and `pct` each, on `k` distinct GPUs of one node.
#[derive(Debug, Clone, Copy)]
struct GroupKind {
    model: usize,
    replicas: u32,
    k: u32,
    mib: u32,
    pct: u32,
}

/// A GPU of a block: room left and the shares on it (model, group index).
#[derive(Debug, Clone)]
struct ShareBin {
    mib: u32,
    pct: u32,
    members: Vec<(usize, u32)>,
}

/// How [`place_groups`] picks a group's `k` GPUs within a block.
#[derive(Debug, Clone, Copy, PartialEq)]
enum GroupRule {
    /// The open GPUs with the least room that fit, new ones only when
    /// fewer than `k` fit: the fewest GPUs.
    BestFit,
    /// The GPUs with the most room, new ones included: spreads shares so
    /// that small ones interleave (three 2-GPU replicas on three GPUs).
    Spread,
}

/// Tensor-parallel replicas onto blocks of at most `g` GPUs (one node
/// each): each replica, in order, into the first of the last few blocks
/// with `k` GPUs (open or not yet opened) that fit its share, else a new
/// block.
fn place_groups(
    rule: GroupRule,
    kinds: &[GroupKind],
    g: u32,
    cap_mib: u32,
    cap_pct: u32,
) -> Vec<Vec<ShareBin>> {
    /// Blocks looked back at: shares come largest first, so older blocks
    /// are full; a window keeps each replica's search short.
    const WINDOW: usize = 16;
    let mut blocks: Vec<Vec<ShareBin>> = Vec::new();
    let mut id = 0u32;
    for kind in kinds {
        let k = kind.k as usize;
        for _ in 0..kind.replicas {
            let fits = |b: &ShareBin| kind.mib <= b.mib && kind.pct <= b.pct;
            let from = blocks.len().saturating_sub(WINDOW);
            let mut chosen: Option<(usize, Vec<usize>)> = None;
            for (at, block) in blocks.iter().enumerate().skip(from) {
                let mut open: Vec<usize> = (0..block.len()).filter(|&i| fits(&block[i])).collect();
                let new = g as usize - block.len();
                if open.len() + new < k {
                    continue;
                }
                let room = |i: usize| {
                    u64::from(block[i].mib) * u64::from(cap_pct)
                        + u64::from(block[i].pct) * u64::from(cap_mib)
                };
                let picks: Vec<usize> = match rule {
                    GroupRule::BestFit => {
                        open.sort_by_key(|&i| (room(i), i));
                        open.truncate(k);
                        let more = k - open.len();
                        open.extend(block.len()..block.len() + more);
                        open
                    }
                    GroupRule::Spread => {
                        let fresh = new.min(k);
                        let mut picks: Vec<usize> = (block.len()..block.len() + fresh).collect();
                        open.sort_by_key(|&i| (std::cmp::Reverse(room(i)), i));
                        picks.extend(open.into_iter().take(k - fresh));
                        picks
                    }
                };
                chosen = Some((at, picks));
                break;
            }
            let (at, picks) = chosen.unwrap_or_else(|| {
                blocks.push(Vec::new());
                (blocks.len() - 1, (0..k).collect())
            });
            let block = &mut blocks[at];
            for i in picks {
                if i >= block.len() {
                    block.push(ShareBin {
                        mib: cap_mib,
                        pct: cap_pct,
                        members: Vec::new(),
                    });
                }
                block[i].mib -= kind.mib;
                block[i].pct -= kind.pct;
                block[i].members.push((kind.model, id));
            }
            id += 1;
        }
    }
    blocks
}

/// A model's replicas still to place on fractional GPUs.
#[derive(Debug, Clone, Copy)]
struct Kind {
    model: usize,
    left: u32,
    mib: u32,
    pct: u32,
}

/// A fractional GPU in the abstract: room left and what it holds.
#[derive(Debug, Clone)]
struct Bin {
    mib: u32,
    pct: u32,
    models: Vec<usize>,
}

/// How [`pack_bins`] packs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    /// Open as many GPUs as the totals need at least, then deal the
    /// replicas, largest first, each to the GPU that keeps the most room in
    /// its scarcer resource (worst fit): every GPU gets a share of every
    /// kind, as in the aggregate solution the ILP counted, so the mix
    /// stays balanced to the last GPU; more GPUs only for what fits none.
    Spread,
    /// Keep the GPU's memory and SM use in the proportion of what is left
    /// to place: the replica that fits with the largest share of whichever
    /// resource the GPU is behind on. First fit decreasing, blind to the
    /// mix, fills some GPUs' SMs with compute-heavy replicas and strands
    /// their memory while others fill memory and strand SMs.
    Proportional,
    /// The largest dot product of the replica's shares with the room left
    /// (the bin-centric "DotProduct" rule of vector bin packing, Panigrahy
    /// et al., 2011).
    DotProduct,
    /// The replica with the largest share of either resource that fits.
    Decreasing,
}

/// Packs the replicas of `kinds` onto the `kept` GPUs (already holding
/// replicas, with their room left) and then new ones, GPU by GPU under
/// `rule`; then empties new GPUs whose replicas all fit elsewhere, the
/// emptiest first. Returns the kept GPUs' additions and the new GPUs. Per
/// replica, one scan of the kinds.
fn pack_bins(
    rule: Rule,
    mut kept: Vec<Bin>,
    mut kinds: Vec<Kind>,
    cap_mib: u32,
    cap_pct: u32,
) -> (Vec<Bin>, Vec<Bin>) {
    let (cm, cp) = (f64::from(cap_mib), f64::from(cap_pct));
    let mut new: Vec<Bin> = Vec::new();
    if rule == Rule::Spread {
        spread(&mut kept, &mut new, &mut kinds, cap_mib, cap_pct);
    }
    let fill = |bin: &mut Bin, kinds: &mut Vec<Kind>| loop {
        let (total_mib, total_pct) = kinds.iter().fold((0.0, 0.0), |(a, b), k| {
            (
                a + f64::from(k.left) * f64::from(k.mib) / cm,
                b + f64::from(k.left) * f64::from(k.pct) / cp,
            )
        });
        let used_mib = 1.0 - f64::from(bin.mib) / cm;
        let used_pct = 1.0 - f64::from(bin.pct) / cp;
        let memory_behind = used_mib * total_pct <= used_pct * total_mib;
        let score = |k: &Kind| -> (f64, f64) {
            let (m, c) = (f64::from(k.mib) / cm, f64::from(k.pct) / cp);
            match rule {
                Rule::Proportional if memory_behind => (m, -c),
                Rule::Proportional => (c, -m),
                Rule::DotProduct => (
                    m * f64::from(bin.mib) / cm + c * f64::from(bin.pct) / cp,
                    0.0,
                ),
                Rule::Decreasing | Rule::Spread => (m.max(c), m.min(c)),
            }
        };
        let best = kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| k.left > 0 && k.mib <= bin.mib && k.pct <= bin.pct)
            .max_by(|(i, a), (j, b)| {
                let (sa, sb) = (score(a), score(b));
                sa.0.total_cmp(&sb.0)
                    .then(sa.1.total_cmp(&sb.1))
                    .then(j.cmp(i))
            })
            .map(|(i, _)| i);
        let Some(i) = best else {
            break;
        };
        let k = &mut kinds[i];
        k.left -= 1;
        bin.mib -= k.mib;
        bin.pct -= k.pct;
        bin.models.push(k.model);
    };
    for bin in &mut kept {
        fill(bin, &mut kinds);
    }
    while kinds.iter().any(|k| k.left > 0) {
        let mut bin = Bin {
            mib: cap_mib,
            pct: cap_pct,
            models: Vec::new(),
        };
        fill(&mut bin, &mut kinds);
        if bin.models.is_empty() {
            break; // Nothing fits an empty GPU (cannot happen for fitting models).
        }
        new.push(bin);
    }
    // Empty the emptiest new GPUs into the room the others have left (a
    // few of them: the packing leaves at most a few nearly empty).
    let size = |b: &Bin| {
        u64::from(cap_mib - b.mib) * u64::from(cap_pct)
            + u64::from(cap_pct - b.pct) * u64::from(cap_mib)
    };
    new.sort_by_key(size);
    let need = |m: usize| {
        let k = kinds.iter().find(|k| k.model == m).expect("a packed kind");
        (k.mib, k.pct)
    };
    let mut attempts = 0;
    let mut i = 0;
    while i < new.len() && attempts < 32 {
        attempts += 1;
        let mut items: Vec<usize> = new[i].models.clone();
        items.sort_by_key(|&m| std::cmp::Reverse(need(m).0.max(need(m).1)));
        let mut moved: Vec<(usize, usize)> = Vec::new();
        for &m in &items {
            let (a, b) = need(m);
            let to = (0..new.len()).find(|&j| j != i && new[j].mib >= a && new[j].pct >= b);
            let Some(j) = to else {
                break;
            };
            new[j].mib -= a;
            new[j].pct -= b;
            new[j].models.push(m);
            moved.push((j, m));
        }
        if moved.len() == items.len() {
            new.remove(i);
        } else {
            // Undo.
            for (j, m) in moved.into_iter().rev() {
                let (a, b) = need(m);
                new[j].mib += a;
                new[j].pct += b;
                new[j].models.pop();
            }
            i += 1;
        }
    }
    (kept, new)
}

/// [`Rule::Spread`]: deals every replica of `kinds` onto `kept` and new
/// GPUs (at least as many in all as the totals need), largest first, each
/// to the GPU with the most room left in its scarcer resource that fits
/// it; a GPU that fits none opens another. A max-heap on that room finds
/// the GPU in `O(log GPUs)` unless the top ones cannot fit the replica.
fn spread(kept: &mut [Bin], new: &mut Vec<Bin>, kinds: &mut [Kind], cap_mib: u32, cap_pct: u32) {
    use std::collections::BinaryHeap;
    let (cm, cp) = (u64::from(cap_mib), u64::from(cap_pct));
    let (mut total_mib, mut total_pct) = (0u64, 0u64);
    for k in kinds.iter() {
        total_mib += u64::from(k.left) * u64::from(k.mib);
        total_pct += u64::from(k.left) * u64::from(k.pct);
    }
    for b in kept.iter() {
        total_mib += u64::from(cap_mib - b.mib);
        total_pct += u64::from(cap_pct - b.pct);
    }
    let at_least = total_mib.div_ceil(cm).max(total_pct.div_ceil(cp)) as usize;
    let blank = Bin {
        mib: cap_mib,
        pct: cap_pct,
        models: Vec::new(),
    };
    new.extend(std::iter::repeat_n(
        blank.clone(),
        at_least.saturating_sub(kept.len()),
    ));
    // Room in the scarcer resource, as a fraction scaled to an integer.
    let room = |b: &Bin| (u64::from(b.mib) * cp).min(u64::from(b.pct) * cm);
    let n_kept = kept.len();
    let mut heap: BinaryHeap<(u64, std::cmp::Reverse<usize>)> = kept
        .iter()
        .chain(new.iter())
        .enumerate()
        .map(|(i, b)| (room(b), std::cmp::Reverse(i)))
        .collect();
    let mut order: Vec<usize> = (0..kinds.len()).collect();
    order.sort_by_key(|&i| {
        let k = &kinds[i];
        let (m, c) = (u64::from(k.mib) * cp, u64::from(k.pct) * cm);
        (
            std::cmp::Reverse(m.max(c)),
            std::cmp::Reverse(m.min(c)),
            k.model,
        )
    });
    for i in order {
        let k = kinds[i];
        for _ in 0..k.left {
            let mut popped = Vec::new();
            let mut placed = false;
            while let Some((r, std::cmp::Reverse(j))) = heap.pop() {
                let b = if j < n_kept {
                    &mut kept[j]
                } else {
                    &mut new[j - n_kept]
                };
                if b.mib >= k.mib && b.pct >= k.pct {
                    b.mib -= k.mib;
                    b.pct -= k.pct;
                    b.models.push(k.model);
                    heap.push((room(b), std::cmp::Reverse(j)));
                    placed = true;
                    break;
                }
                popped.push((r, std::cmp::Reverse(j)));
                if popped.len() >= 64 {
                    break;
                }
            }
            heap.extend(popped);
            if !placed {
                let mut b = blank.clone();
                b.mib -= k.mib;
                b.pct -= k.pct;
                b.models.push(k.model);
                heap.push((room(&b), std::cmp::Reverse(n_kept + new.len())));
                new.push(b);
            }
        }
        kinds[i].left = 0;
    }
    new.retain(|b| !b.models.is_empty());
}

/// Search nodes [`exact_bins`] may visit per GPU count tried.
const EXACT_NODES: u32 = 20_000;

/// Most replicas in a class for [`exact_bins`] to be tried (each node
/// scans every GPU, so larger classes would spend their time budget here).
const EXACT_REPLICAS: u32 = 64;

/// Whether the replicas of `kinds` fit the `kept` GPUs' room plus `target`
/// new GPUs: depth-first over the replicas, largest first, into each GPU
/// with a distinct room left (GPUs with the same room are interchangeable),
/// pruned when what is left exceeds the room left in either resource;
/// `None` when it does not fit or `limit` nodes were not enough to tell.
fn exact_bins(
    kept: &[Bin],
    kinds: &[Kind],
    cap_mib: u32,
    cap_pct: u32,
    target: usize,
    limit: u32,
) -> Option<(Vec<Bin>, Vec<Bin>)> {
    let mut items: Vec<Kind> = kinds.iter().filter(|k| k.left > 0).copied().collect();
    let (cm, cp) = (u64::from(cap_mib), u64::from(cap_pct));
    items.sort_by_key(|k| {
        let (m, c) = (u64::from(k.mib) * cp, u64::from(k.pct) * cm);
        (
            std::cmp::Reverse(m.max(c)),
            std::cmp::Reverse(m.min(c)),
            k.model,
        )
    });
    let order: Vec<Kind> = items
        .iter()
        .flat_map(|k| std::iter::repeat_n(*k, k.left as usize))
        .collect();
    let mut bins: Vec<Bin> = kept.to_vec();
    bins.extend(std::iter::repeat_n(
        Bin {
            mib: cap_mib,
            pct: cap_pct,
            models: Vec::new(),
        },
        target,
    ));
    // Suffix sums of what is left to place.
    let mut left_mib = vec![0u64; order.len() + 1];
    let mut left_pct = vec![0u64; order.len() + 1];
    for i in (0..order.len()).rev() {
        left_mib[i] = left_mib[i + 1] + u64::from(order[i].mib);
        left_pct[i] = left_pct[i + 1] + u64::from(order[i].pct);
    }
    struct Search<'a> {
        order: &'a [Kind],
        left_mib: &'a [u64],
        left_pct: &'a [u64],
        nodes: u32,
        limit: u32,
    }
    impl Search<'_> {
        fn go(&mut self, i: usize, bins: &mut [Bin]) -> bool {
            if i == self.order.len() {
                return true;
            }
            self.nodes += 1;
            if self.nodes > self.limit {
                return false;
            }
            let (room_mib, room_pct) = bins.iter().fold((0u64, 0u64), |(a, b), x| {
                (a + u64::from(x.mib), b + u64::from(x.pct))
            });
            if room_mib < self.left_mib[i] || room_pct < self.left_pct[i] {
                return false;
            }
            let k = self.order[i];
            let mut tried: Vec<(u32, u32)> = Vec::new();
            for j in 0..bins.len() {
                let b = &bins[j];
                if b.mib < k.mib || b.pct < k.pct || tried.contains(&(b.mib, b.pct)) {
                    continue;
                }
                tried.push((b.mib, b.pct));
                bins[j].mib -= k.mib;
                bins[j].pct -= k.pct;
                bins[j].models.push(k.model);
                if self.go(i + 1, bins) {
                    return true;
                }
                bins[j].models.pop();
                bins[j].mib += k.mib;
                bins[j].pct += k.pct;
                if self.nodes > self.limit {
                    return false;
                }
            }
            false
        }
    }
    let mut search = Search {
        order: &order,
        left_mib: &left_mib,
        left_pct: &left_pct,
        nodes: 0,
        limit,
    };
    if !search.go(0, &mut bins) {
        return None;
    }
    let new = bins.split_off(kept.len());
    // What the kept GPUs gained, as `pack_bins` returns it.
    let kept_added: Vec<Bin> = bins
        .into_iter()
        .zip(kept)
        .map(|(after, before)| Bin {
            mib: after.mib,
            pct: after.pct,
            models: after.models[before.models.len()..].to_vec(),
        })
        .collect();
    Some((
        kept_added,
        new.into_iter().filter(|b| !b.models.is_empty()).collect(),
    ))
}
