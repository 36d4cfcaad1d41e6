//! Training and inference on one inventory.
//!
//! 1. Gangs that run now keep their GPUs ([`super::running`]); inference
//!    is packed on the rest (the plan inference would get alone, `full`).
//! 2. Pending gangs are placed ([`super::place`]) on the GPUs `full`
//!    leaves idle, on nodes whose device plugin does not share GPUs; a
//!    gang may also take GPUs whose inference replicas are all of lower
//!    priority, and preempt lower-priority preemptible gangs.
//! 3. Inference is packed again without the gangs' GPUs, and nodes that
//!    hold a worker lose time-slicing, MPS and HAMi (their device plugin
//!    would hand out shares of the gang's GPUs).
//! 4. The guard: no model may end below `min(minReplicas, what full
//!    placed)`, and none may lose replicas to a gang of its own or lower
//!    priority. When step 3 breaks it, the least important gang that
//!    took inference GPUs is left to free GPUs and the queue placed again
//!    (one gang at a time, so that the others still start); then the
//!    gangs that took inference GPUs wait instead, then every gang
//!    started on a node inference used; in the end the plan is `full`
//!    with only the running gangs.
//!
//! Replicas lost to a gang are named in its `preempts`, and in the plan's
//! `unplaced` with the gang as the reason.

use std::collections::{BTreeMap, BTreeSet};

use gpuscale_policies::model::SharingMode;
use gpuscale_policies::training::TrainingJob;
use gpuscale_policies::{Cluster, Model};

use super::{
    GangOptions, GangPlan, GangStatus, GpuRef, Inventory, Preemption, VictimKind, place, rank,
    running, summary,
};
use crate::basis::Basis;
use crate::plan::{GangSlot, GpuPlan, Mode, Plan, Unplaced};
use crate::{PackError, PackOptions, emit, pack_from};

/// Most gangs left to free GPUs, one per trial, when the gangs that move
/// inference cannot all do so (each trial packs inference once).
const MAX_LEFT_TO_FREE_GPUS: usize = 8;

/// The cluster inference is packed on: `taken` GPUs out of use (marked
/// unhealthy, so the packer never places on them and GPU indices stay
/// where its decoder expects them), and no GPU sharing through the device
/// plugin on nodes that hold a worker.
pub fn for_inference(cluster: &Cluster, taken: &BTreeSet<GpuRef>) -> Cluster {
    let mut out = cluster.clone();
    for (n, node) in out.nodes.iter_mut().enumerate() {
        let mut any = false;
        for g in &mut node.gpus {
            if taken.contains(&(n, g.index)) {
                g.health = gpuscale_policies::Health::Unhealthy;
                g.workloads.clear();
                any = true;
            }
        }
        if any {
            node.sharing.retain(|s| {
                matches!(
                    s,
                    SharingMode::Mig | SharingMode::MigTimeslice | SharingMode::Whole
                )
            });
            node.timeslice_replicas = None;
            node.mps_replicas = None;
        }
    }
    out
}

/// Whether a node's device plugin shares whole GPUs in `plan`.
fn shares(plan: &Plan, node: &str) -> bool {
    plan.nodes
        .iter()
        .find(|n| n.name == node)
        .is_some_and(|n| n.timeslice_replicas.is_some() || n.mps_replicas.is_some() || n.hami)
}

/// What gangs may take from a plan of inference: idle GPUs, and GPUs
/// with replicas (ranked by their most important model). On a node whose
/// device plugin shares GPUs and runs replicas, idle GPUs count as the
/// node's inference (taking them changes the node's configuration).
pub fn inventory(cluster: &Cluster, plan: &Plan, models: &[Model]) -> Inventory {
    let rank_of = |model: &str| {
        models
            .iter()
            .find(|m| m.name == model)
            .map_or(2, |m| rank(m.priority))
    };
    let mut inv = Inventory::default();
    for (n, node) in cluster.nodes.iter().enumerate() {
        let gpus: Vec<&GpuPlan> = plan.gpus.iter().filter(|g| g.node == node.name).collect();
        let busy: Vec<&&GpuPlan> = gpus
            .iter()
            .filter(|g| g.mode != Mode::Idle && !g.replicas.is_empty())
            .collect();
        let node_rank = busy
            .iter()
            .flat_map(|g| g.replicas.iter())
            .map(|r| rank_of(&r.model))
            .max();
        let shared = shares(plan, &node.name) && !busy.is_empty();
        for gpu in &node.gpus {
            if gpu.health != gpuscale_policies::Health::Healthy {
                continue;
            }
            let p = gpus.iter().find(|g| g.index == gpu.index);
            let idle = p.is_none_or(|g| g.mode == Mode::Idle || g.replicas.is_empty());
            if idle && !shared {
                inv.free.entry(n).or_default().insert(gpu.index);
            } else if idle {
                inv.inference
                    .entry(n)
                    .or_default()
                    .push((gpu.index, node_rank.unwrap_or(0)));
            } else {
                let r = p
                    .into_iter()
                    .flat_map(|g| g.replicas.iter())
                    .map(|r| rank_of(&r.model))
                    .max()
                    .unwrap_or(0);
                let r = if shared {
                    r.max(node_rank.unwrap_or(0))
                } else {
                    r
                };
                inv.inference.entry(n).or_default().push((gpu.index, r));
            }
        }
    }
    inv
}

fn placed_by_model(plan: &Plan) -> BTreeMap<String, u32> {
    plan.models
        .iter()
        .map(|m| (m.name.clone(), m.placed))
        .collect()
}

/// The training side of a joint plan.
#[derive(Debug, Clone, Copy)]
pub struct Training<'a> {
    /// The training jobs (running ones are read from the cluster).
    pub jobs: &'a [TrainingJob],
    /// The queue and the time of the plan.
    pub queue: &'a super::queue::Queue,
    /// Gang solver options.
    pub options: &'a GangOptions,
}

/// Packs inference and places training jobs together (see the module
/// docs). Without jobs it is [`pack_from`].
pub fn plan(
    cluster: &Cluster,
    models: &[Model],
    training: Training<'_>,
    demand: &BTreeMap<String, u32>,
    options: &PackOptions,
    basis: Option<&Basis>,
) -> Result<Plan, PackError> {
    let Training {
        jobs,
        queue: q,
        options: gang_options,
    } = training;
    if jobs.is_empty() {
        return pack_from(cluster, models, demand, options, basis);
    }
    let held = running(cluster, jobs);
    let held_gpus: BTreeSet<GpuRef> = held
        .values()
        .filter(|h| h.intact)
        .flat_map(|h| h.gpus.iter().copied())
        .collect();
    // Broken gangs' GPUs are not held: the gangs restart whole, and a
    // gang may start on them (naming the broken one, whose pods must be
    // deleted first). Inference stays off them: its pods would wait for
    // those deletions with nothing in the plan to say so.
    let broken: BTreeSet<GpuRef> = held
        .values()
        .filter(|h| !h.intact)
        .flat_map(|h| h.gpus.iter().copied())
        .filter(|&(n, i)| {
            cluster.nodes[n]
                .gpus
                .iter()
                .any(|g| g.index == i && g.health == gpuscale_policies::Health::Healthy)
        })
        .collect();
    let base = without_job_workloads(cluster, jobs);
    let for_inference = |taken: &BTreeSet<GpuRef>| {
        let all: BTreeSet<GpuRef> = taken.union(&broken).copied().collect();
        for_inference(&base, &all)
    };
    let inf0 = for_inference(&held_gpus);
    let full = pack_from(&inf0, models, demand, options, basis)?;
    let mut inv = inventory(&inf0, &full, models);
    for &(n, i) in &broken {
        inv.free.entry(n).or_default().insert(i);
    }
    let mut placed = place(&base, jobs, &held, &inv, q, gang_options);
    // The inventory `placed` came from.
    let mut source = inv.clone();

    let full_placed = placed_by_model(&full);
    let mins: BTreeMap<&str, u32> = models
        .iter()
        .map(|m| (m.name.as_str(), m.scaling.min_replicas))
        .collect();
    // Whether inference packed as `p` keeps what `full` placed, but for
    // replicas above minReplicas of models less important than `rank_`.
    let keeps = |p: &Plan, rank_: u8| {
        let now = placed_by_model(p);
        models.iter().all(|m| {
            let before = full_placed.get(&m.name).copied().unwrap_or(0);
            let after = now.get(&m.name).copied().unwrap_or(0);
            let floor = before.min(mins.get(m.name.as_str()).copied().unwrap_or(0));
            after >= before || (rank(m.priority) < rank_ && after >= floor)
        })
    };
    // Gangs still waiting: would inference, packed again around them,
    // make room? (Inference left alone may spread over every node; moving
    // some replicas frees whole nodes.) The queue is placed once more with
    // every inference GPU movable — the same priority order, partitions
    // and backfill reservations — and inference is packed around what the
    // gangs then take; that plan stands if no replica is lost that may not
    // yield. First with free and inference GPUs tried level by level (a
    // preferred level met by moving inference), which stands only if
    // every replica is kept: a preference moves replicas, never stops
    // them. Then in the usual order, free GPUs at every level first (at
    // most two packs).
    let mut cache: Option<(BTreeSet<GpuRef>, Plan)> = None;
    let waiting = placed.gangs.iter().any(|g| g.status == GangStatus::Pending);
    'orders: for level_first in [true, false] {
        if !waiting || inv.inference.is_empty() {
            break;
        }
        // When the gangs that move inference would together push a model
        // below what it keeps, the least important of them is left to
        // free GPUs and the queue placed again (it then waits with a
        // reservation, or starts elsewhere): one gang that fits is
        // better than none.
        let mut free_only: BTreeSet<String> = BTreeSet::new();
        for _ in 0..=MAX_LEFT_TO_FREE_GPUS {
            let movable = Inventory {
                free: inv.free.clone(),
                inference: inv.inference.clone(),
                inference_movable: true,
                level_first,
                free_only: free_only.clone(),
            };
            let trial = place(&base, jobs, &held, &movable, q, gang_options);
            if trial.from_inference.is_empty() {
                if free_only.is_empty() {
                    // No inference GPU taken: the other order takes none
                    // either.
                    break 'orders;
                }
                break;
            }
            let gpus = gang_gpus(&base, &trial.gangs);
            let p = pack_from(&for_inference(&gpus), models, demand, options, None)?;
            let takers: Vec<&GangPlan> = trial
                .gangs
                .iter()
                .filter(|g| g.status == GangStatus::Starting)
                .filter(|g| took_inference(&base, g, &trial.from_inference))
                .collect();
            let taker_rank = if level_first {
                0
            } else {
                takers.iter().map(|g| rank(g.priority)).max().unwrap_or(0)
            };
            if keeps(&p, taker_rank) {
                placed = trial;
                source = movable;
                let moves = p.moves + displaced(&base, &starting_gpus(&base, &placed.gangs)).0;
                for g in &mut placed.gangs {
                    if g.status == GangStatus::Starting
                        && took_inference(&base, g, &placed.from_inference)
                    {
                        g.reason = format!(
                            "{}; inference packed again around it ({moves} running replicas move or stop)",
                            g.reason
                        );
                    }
                }
                cache = Some((gpus, p));
                break 'orders;
            }
            // The gangs are in the order placed (priority order): the
            // last taker is the least important.
            match takers.last() {
                Some(g) => {
                    free_only.insert(g.name.clone());
                }
                None => break,
            }
        }
    }

    let mut attempt = 0;
    let (final_plan, lost) = loop {
        let gang_gpus: BTreeSet<GpuRef> = gang_gpus(&base, &placed.gangs);
        if gang_gpus == held_gpus {
            break (full.clone(), BTreeMap::new());
        }
        let p = match &cache {
            Some((set, p)) if *set == gang_gpus => p.clone(),
            _ => {
                let inf = for_inference(&gang_gpus);
                pack_from(&inf, models, demand, options, None)?
            }
        };
        let now = placed_by_model(&p);
        // The most important gang that took inference GPUs: models below
        // it may yield.
        let taker_rank = placed
            .gangs
            .iter()
            .filter(|g| g.status == GangStatus::Starting)
            .filter(|g| took_inference(&base, g, &placed.from_inference))
            .map(|g| rank(g.priority))
            .max();
        let mut lost: BTreeMap<String, u32> = BTreeMap::new();
        let mut ok = true;
        for m in models {
            let before = full_placed.get(&m.name).copied().unwrap_or(0);
            let after = now.get(&m.name).copied().unwrap_or(0);
            if after >= before {
                continue;
            }
            let floor = before.min(mins.get(m.name.as_str()).copied().unwrap_or(0));
            let may_yield = taker_rank.is_some_and(|r| rank(m.priority) < r);
            if after < floor || !may_yield {
                ok = false;
            }
            lost.insert(m.name.clone(), before - after);
        }
        if ok {
            break (p, lost);
        }
        // The least important gang that took inference GPUs is left to
        // free GPUs, and the queue placed again from the same inventory.
        let last_taker = placed
            .gangs
            .iter()
            .filter(|g| g.status == GangStatus::Starting)
            .rfind(|g| took_inference(&base, g, &placed.from_inference));
        if let Some(g) = last_taker
            && source.free_only.len() < MAX_LEFT_TO_FREE_GPUS
        {
            source.free_only.insert(g.name.clone());
            placed = place(&base, jobs, &held, &source, q, gang_options);
            cache = None;
            continue;
        }
        // Place the queue again, with less to take: no inference GPU;
        // then only nodes inference does not use (a worker beside it
        // changes its node's sharing); then no free GPU at all (the
        // running gangs alone, the rest reserved).
        attempt += 1;
        let inference_nodes: BTreeSet<usize> = full
            .gpus
            .iter()
            .filter(|g| !g.replicas.is_empty())
            .map(|g| node_index(&base, &g.node))
            .collect();
        let narrower = Inventory {
            free: match attempt {
                1 => inv.free.clone(),
                2 => inv
                    .free
                    .iter()
                    .filter(|(n, _)| !inference_nodes.contains(n))
                    .map(|(n, s)| (*n, s.clone()))
                    .collect(),
                _ => BTreeMap::new(),
            },
            inference: BTreeMap::new(),
            inference_movable: false,
            level_first: false,
            free_only: BTreeSet::new(),
        };
        placed = place(&base, jobs, &held, &narrower, q, gang_options);
        cache = None;
        if attempt > 3 {
            // Only running gangs and preemptions among them are left; they
            // never change inference's GPUs.
            break (full.clone(), BTreeMap::new());
        }
    };

    // Name the replicas lost in the gangs that took inference GPUs.
    if !lost.is_empty() {
        let from_inference = placed.from_inference.clone();
        let taker = placed
            .gangs
            .iter_mut()
            .filter(|g| g.status == GangStatus::Starting)
            .filter(|g| took_inference(&base, g, &from_inference))
            .max_by_key(|g| rank(g.priority));
        if let Some(t) = taker {
            for (model, n) in &lost {
                let m = models.iter().find(|m| &m.name == model);
                // Replicas the plan no longer places: running ones stop;
                // with none running, they were only wanted.
                let runs = base
                    .nodes
                    .iter()
                    .flat_map(|n| &n.gpus)
                    .flat_map(|g| &g.workloads)
                    .any(|w| &w.model == model);
                t.preempts.push(Preemption {
                    kind: VictimKind::Replicas,
                    name: model.clone(),
                    count: *n,
                    lost_gpu_hours: 0.0,
                    reason: format!(
                        "above minReplicas ({}), {} priority; {}",
                        m.map_or(0, |m| m.scaling.min_replicas),
                        m.map_or("standard".to_string(), |m| format!("{:?}", m.priority)
                            .to_lowercase()),
                        if runs {
                            "those of them running now stop"
                        } else {
                            "none runs now: they are not started"
                        }
                    ),
                });
            }
        }
    }
    let mut plan = final_plan;
    // Replicas and configurations the gangs displace (the packer saw
    // their GPUs as out of use, so it did not count them).
    let (replicas, reconfigured) = displaced(&base, &starting_gpus(&base, &placed.gangs));
    let lost_replicas: u32 = lost.values().sum();
    plan.moves += replicas.saturating_sub(lost_replicas);
    plan.reconfigured_gpus += reconfigured;
    for (model, n) in &lost {
        let taker = placed
            .gangs
            .iter()
            .find(|g| g.preempts.iter().any(|p| &p.name == model))
            .map_or(String::new(), |g| g.name.clone());
        let reason = format!("yield to training job `{taker}` (higher priority)");
        match plan.unplaced.iter_mut().find(|u| &u.model == model) {
            Some(u) => u.reason = reason,
            None => plan.unplaced.push(Unplaced {
                model: model.clone(),
                replicas: *n,
                reason,
            }),
        }
    }
    // The gangs' GPUs, whole, in the plan.
    for g in placed.gangs.iter().filter(|g| g.holds()) {
        for w in &g.workers {
            let n = node_index(&base, &w.node);
            for &i in &w.gpus {
                plan.gpus.retain(|p| !(p.node == w.node && p.index == i));
                plan.gpus.push(GpuPlan {
                    node: w.node.clone(),
                    index: i,
                    gpu_model: base.nodes[n].gpu_model.clone(),
                    mode: Mode::Whole,
                    geometry: Vec::new(),
                    timeslice_replicas: None,
                    mps_replicas: None,
                    replicas: Vec::new(),
                    unhealthy: false,
                    gang: Some(GangSlot {
                        job: g.name.clone(),
                        worker: w.worker,
                    }),
                });
            }
        }
    }
    plan.gpus.sort_by(|a, b| {
        node_index(&base, &a.node)
            .cmp(&node_index(&base, &b.node))
            .then(a.index.cmp(&b.index))
    });
    plan.keep_whole_gpus_off_gangs();
    let (_, names) = emit::mig_parted(&plan);
    for n in &mut plan.nodes {
        if let Some(name) = names.get(&n.name) {
            n.mig_config = name.clone();
        }
        // Whether the node may run HAMi is the cluster's word, not the
        // inference view's (which takes `fractional` off a gang's node):
        // a gang's node is exactly where an earlier plan's HAMi must go.
        if let Some(b) = base.nodes.iter().find(|b| b.name == n.name) {
            n.hami_capable = b
                .sharing
                .contains(&gpuscale_policies::SharingMode::Fractional);
        }
    }
    // What is left free for training.
    let taken = gang_gpus(&base, &placed.gangs);
    let inf = for_inference(&taken);
    let left = inventory(&inf, &plan, models);
    plan.training = Some(summary(&base, &placed.gangs, &left.free));
    plan.gangs = placed.gangs;
    Ok(plan)
}

/// What gangs starting on `gpus` displace in the current state: inference
/// replicas running there (they move, or stop where they yield), and GPUs
/// whose configuration changes to whole (MIG, shared).
fn displaced(cluster: &Cluster, gpus: &BTreeSet<GpuRef>) -> (u32, u32) {
    use gpuscale_policies::GpuMode;
    let mut replicas = 0;
    let mut reconfigured = 0;
    for &(n, i) in gpus {
        let Some(g) = cluster.nodes[n].gpus.iter().find(|g| g.index == i) else {
            continue;
        };
        replicas += g.workloads.len() as u32;
        if !matches!(g.mode, GpuMode::Free | GpuMode::Whole) || !g.geometry.is_empty() {
            reconfigured += 1;
        }
    }
    (replicas, reconfigured)
}

/// GPUs of gangs that start in this plan.
fn starting_gpus(cluster: &Cluster, gangs: &[GangPlan]) -> BTreeSet<GpuRef> {
    gangs
        .iter()
        .filter(|g| g.status == GangStatus::Starting)
        .flat_map(|g| {
            g.workers.iter().flat_map(|w| {
                let n = node_index(cluster, &w.node);
                w.gpus.iter().map(move |&i| (n, i))
            })
        })
        .collect()
}

/// Whether a gang holds any GPU it took from inference.
fn took_inference(cluster: &Cluster, g: &GangPlan, from_inference: &BTreeSet<GpuRef>) -> bool {
    g.workers.iter().any(|w| {
        let n = node_index(cluster, &w.node);
        w.gpus.iter().any(|i| from_inference.contains(&(n, *i)))
    })
}

fn node_index(cluster: &Cluster, name: &str) -> usize {
    cluster
        .nodes
        .iter()
        .position(|n| n.name == name)
        .expect("gang workers name the cluster's nodes")
}

/// Every GPU gangs hold in a plan.
pub fn gang_gpus(cluster: &Cluster, gangs: &[GangPlan]) -> BTreeSet<GpuRef> {
    gangs
        .iter()
        .filter(|g| g.holds())
        .flat_map(|g| {
            g.workers.iter().flat_map(|w| {
                let n = node_index(cluster, &w.node);
                w.gpus.iter().map(move |&i| (n, i))
            })
        })
        .collect()
}

/// The cluster with training jobs' workloads removed from its GPUs (they
/// are accounted for as gangs, not as inference).
fn without_job_workloads(cluster: &Cluster, jobs: &[TrainingJob]) -> Cluster {
    let mut out = cluster.clone();
    for node in &mut out.nodes {
        for gpu in &mut node.gpus {
            gpu.workloads
                .retain(|w| !jobs.iter().any(|j| j.name == w.model));
        }
    }
    out
}
