//! Mapping the ILP's counts onto concrete GPUs, preferring what is already
//! there: GPUs already in the needed geometry, replicas already in place.
//!
//! Per class, in this order: (1) choose the nodes that time-slice, those
//! already time-slicing with the same `N` first; (2) place tensor-parallel
//! groups, largest first, on the other nodes — where the model already runs
//! if it can, else best fit; (3) time-sliced GPUs on their nodes; (4) MIG
//! GPUs, keeping GPUs whose current geometry has the pattern's profiles;
//! (5) replicas into slots, the slot a replica already occupies first.
//! Each step is linear in the class's GPUs and replicas (plus sorting).

use std::collections::{BTreeMap, BTreeSet};

use gpuscale_policies::{Cluster, Geometry, GpuMode, Health, Model};

use crate::classes::{Class, PatternKind, SlotKind, plain_counts};
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
}

#[derive(Debug, Clone)]
struct Assigned {
    mode: Mode,
    geometry: Geometry,
    share: Option<u8>,
    slots: Vec<Slot>,
    /// (model, group size, group number) for whole GPUs.
    whole: Option<(usize, u32, u32)>,
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
            class,
            c,
            counts,
            &mut assigned,
            &mut out,
        );
    }

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
                    current[m] += if gpu.mode == GpuMode::Whole {
                        1.0 / f64::from(smallest_group(cluster, node, &models[m]))
                    } else {
                        1.0
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
            // Reconfiguration: the MIG or sharing configuration changes.
            let before = config_key(gpu.mode, &gpu.geometry, node.timeslice_replicas);
            let after = match a.mode {
                Mode::Mig => Some(format!("mig:{:?}", plain_counts(&a.geometry))),
                Mode::Timeslice => Some(format!("share:{}", a.share.unwrap_or(0))),
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
                timeslice_replicas: a.share,
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

fn config_key(mode: GpuMode, geometry: &Geometry, share: Option<u8>) -> Option<String> {
    match mode {
        GpuMode::Mig => Some(format!("mig:{:?}", plain_counts(geometry))),
        GpuMode::Timeslice => Some(format!("share:{}", share.unwrap_or(0))),
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
        replicas: Vec::new(),
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

    // (1) Nodes that time-slice: those already doing so with the same N
    // first, then those sharing the most GPUs now.
    let share_gpus = |n: u8| -> u32 {
        class
            .patterns
            .iter()
            .position(|p| p.kind == PatternKind::Share(n))
            .map(|p| counts.patterns[c][p])
            .unwrap_or(0)
    };
    let share_ns: Vec<u8> = counts
        .share_nodes
        .range((c, 0)..=(c, u8::MAX))
        .map(|(&(_, n), _)| n)
        .collect();
    let mut designated: BTreeMap<usize, u8> = BTreeMap::new();
    if !share_ns.is_empty() {
        let mut order: Vec<usize> = class.nodes.clone();
        order.sort_by_key(|&ni| {
            let node = &cluster.nodes[ni];
            let shared = node
                .gpus
                .iter()
                .filter(|x| x.mode == GpuMode::Timeslice)
                .count();
            (std::cmp::Reverse(shared), ni)
        });
        for &n in &share_ns {
            let need = share_gpus(n).div_ceil(g) as usize;
            let mut picked: Vec<usize> = order
                .iter()
                .copied()
                .filter(|ni| {
                    !designated.contains_key(ni) && cluster.nodes[*ni].timeslice_replicas == Some(n)
                })
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
                designated.insert(ni, n);
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
                },
            );
        }
    }

    // (3) Time-sliced GPUs on their nodes.
    let share_gpu = |n: u8| Assigned {
        mode: Mode::Timeslice,
        geometry: Geometry::default(),
        share: Some(n),
        slots: (0..n)
            .map(|_| Slot {
                kind: SlotKind::Share(n),
                start: None,
                profile: None,
                model: None,
            })
            .collect(),
        whole: None,
    };
    for &n in &share_ns {
        let mut need = share_gpus(n);
        let mut nodes: Vec<usize> = designated
            .iter()
            .filter(|&(_, &dn)| dn == n)
            .map(|(&ni, _)| ni)
            .collect();
        // Whole GPUs may have crowded the chosen nodes: then also nodes
        // with no whole GPU and no other N.
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
        for ni in nodes {
            if need == 0 {
                break;
            }
            let mut free: Vec<u32> = healthy(ni)
                .filter(|&i| !assigned.contains_key(&(ni, i)))
                .collect();
            free.sort_by_key(|&i| (gpu_state(ni, i).mode != GpuMode::Timeslice, i));
            for i in free.into_iter().take(need as usize) {
                need -= 1;
                assigned.insert((ni, i), share_gpu(n));
                designated.insert(ni, n);
                free_gpus.remove(&ni);
            }
        }
    }

    for (&ni, &n) in &designated {
        let shares = healthy(ni).any(|i| {
            assigned
                .get(&(ni, i))
                .is_some_and(|a| a.mode == Mode::Timeslice)
        });
        if shares {
            out.timeslice_nodes
                .insert(cluster.nodes[ni].name.clone(), n);
        }
    }

    // (4) MIG GPUs: GPUs already in the pattern's geometry first, then GPUs
    // running nothing, then the rest.
    let mut same_geometry: BTreeMap<BTreeMap<String, u32>, Vec<(usize, u32)>> = BTreeMap::new();
    let mut rest: Vec<(usize, u32)> = Vec::new();
    for &ni in &class.nodes {
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
                },
            );
        }
    }

    // (5) Replicas into slots: where the model runs now first.
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
        if a.whole.is_none() && a.slots.iter().all(|s| s.model.is_none()) {
            assigned.remove(&key);
        }
    }
}
