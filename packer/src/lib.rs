//! # gpuscale-packer
//!
//! Decides where model replicas run: which GPUs are split into which MIG
//! geometry, which are time-sliced and into how many shares, which serve
//! whole (alone or in tensor-parallel groups on one node), and which replica
//! goes in which slot — the step that turns 40–60 % GPU utilisation into
//! ~85 %.
//!
//! [`pack`] is a pure function of the cluster (with its current state), the
//! validated model policies, the wanted replicas and the options: build
//! ([`classes`]), solve ([`ilp`], good_lp with HiGHS), decode ([`decode`]).
//! The ILP is a configuration (pattern) model whose size grows with GPU
//! classes, patterns and models, not with the number of GPUs. Objective:
//! cost of GPUs in use first; then, from a current state, GPUs reconfigured
//! (each MIG change wipes a GPU), then replicas moved.
//!
//! Also here: the baselines ([`baseline`]: one replica per whole GPU,
//! first-fit decreasing) and the NVIDIA artefacts ([`emit`]: mig-parted
//! config, device-plugin time-slicing config, resource snippets).
//!
//! What it does not do: any I/O (files, network, Kubernetes) or clock read
//! beyond measuring its own solve time (`solve_ms`) and giving HiGHS its
//! time limit; training-job gang placement (a later issue).

pub mod baseline;
pub mod classes;
pub mod decode;
pub mod emit;
pub mod ilp;
pub mod plan;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpuscale_policies::model::PlacementOption;
use gpuscale_policies::{Cluster, GpuModel, Health, Model};

pub use plan::{
    Baselines, GpuPlan, Mode, ModelPlan, NodePlan, Plan, Pool, Unplaced, Utilization, Variant,
};

/// Options of a solve.
#[derive(Debug, Clone, PartialEq)]
pub struct PackOptions {
    /// Wall-clock limit for the whole solve (HiGHS returns its best
    /// solution when reached).
    pub time_limit: Duration,
    /// Relative MIP gap at which HiGHS stops, also the bound the LP must
    /// prove for the MIP-free shortcuts. Default 0.005 (0.5 %): on the
    /// reference scenarios the last 0.5 % costs 20–100× the time
    /// (`bench/README.md`); 1e-4 (HiGHS's own default) for the tight plan.
    pub mip_rel_gap: f64,
    /// Most time-sliced shares per GPU considered (patterns `Share(2..=N)`).
    pub max_timeslice_replicas: u8,
    /// Fraction of a time-sliced GPU's usable memory kept free.
    pub timeslice_memory_headroom: f64,
    /// Fraction of a time-sliced GPU's compute its replicas may need.
    pub timeslice_compute_cap: f64,
    /// Most MPS partitions per GPU considered (patterns `Mps(2..=N)`).
    pub max_mps_replicas: u8,
    /// Fraction of an MPS GPU's usable memory kept free (the MPS server's
    /// own contexts).
    pub mps_memory_headroom: f64,
    /// Fraction of an MPS GPU's compute its replicas may need.
    pub mps_compute_cap: f64,
    /// Fraction of a fractional (HAMi) GPU's usable memory kept free
    /// (HAMi-core enforces each container's limit, so less than
    /// time-slicing needs; CUDA contexts count inside the limits).
    pub fractional_memory_headroom: f64,
    /// Fraction of a fractional GPU's SMs its replicas' `gpucores` may sum
    /// to.
    pub fractional_compute_cap: f64,
    /// Let HiGHS write its log to stdout (for diagnosing slow solves).
    pub solver_log: bool,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            time_limit: Duration::from_secs(30),
            mip_rel_gap: 0.005,
            max_timeslice_replicas: 4,
            timeslice_memory_headroom: 0.1,
            timeslice_compute_cap: 1.0,
            max_mps_replicas: 4,
            mps_memory_headroom: 0.05,
            mps_compute_cap: 1.0,
            fractional_memory_headroom: 0.05,
            fractional_compute_cap: 1.0,
            solver_log: false,
        }
    }
}

/// Why packing failed (not: why a replica was left out — that is in the
/// plan's `unplaced`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PackError {
    /// HiGHS failed or found no solution in time.
    #[error("solver: {0}")]
    Solver(String),
    /// The demand names a model that was not given.
    #[error("demand names `{0}`, which is not among the model policies")]
    UnknownModel(String),
}

/// The wanted replicas when no demand file is given: each policy's
/// `minReplicas`.
pub fn min_replicas(models: &[Model]) -> BTreeMap<String, u32> {
    models
        .iter()
        .map(|m| (m.name.clone(), m.scaling.min_replicas))
        .collect()
}

/// Packs `demand` (replicas per model policy name; missing models get 0)
/// onto the cluster, starting from its current state.
pub fn pack(
    cluster: &Cluster,
    models: &[Model],
    demand: &BTreeMap<String, u32>,
    options: &PackOptions,
) -> Result<Plan, PackError> {
    let start = Instant::now();
    if let Some(unknown) = demand
        .keys()
        .find(|k| !models.iter().any(|m| &m.name == *k))
    {
        return Err(PackError::UnknownModel(unknown.clone()));
    }
    let wanted: Vec<u32> = models
        .iter()
        .map(|m| demand.get(&m.name).copied().unwrap_or(0))
        .collect();
    let mut classes = classes::build(cluster, models, options);
    let mut solved = ilp::solve(&classes, models, &wanted, options)?;
    let mut decoded = decode::decode(cluster, models, &classes, &solved.counts);
    // Fractional GPUs are counted in aggregate; where decode could not pack
    // a class's replicas into the GPUs it has, count that class's capacity
    // at the share the packing achieved and solve again (twice at most),
    // keeping whichever decoded plan places most, then costs least (a
    // small class derated may place fewer than the first decode did).
    // The LP bounds stay the first solve's: the later ones are not bounds.
    let bounds = (solved.lp_cost, solved.lp_gpus, solved.lp_class_gpus.clone());
    // The classes as they are: what runs now always fits them, not always
    // their derated copies.
    let undated = classes.clone();
    let mut short = decoded.fractional_short.clone();
    for _ in 0..2 {
        if short.is_empty() {
            break;
        }
        recount(&mut classes, &short);
        let again = ilp::solve(&classes, models, &wanted, options)?;
        let redecoded = decode::decode(cluster, models, &classes, &again.counts);
        short = redecoded.fractional_short.clone();
        let (placed, cost) = placed_and_cost(cluster, &again.counts, &redecoded);
        let (placed_best, cost_best) = placed_and_cost(cluster, &solved.counts, &decoded);
        if placed > placed_best || (placed == placed_best && cost < cost_best - 1e-9) {
            solved = again;
            decoded = redecoded;
        }
    }
    (solved.lp_cost, solved.lp_gpus, solved.lp_class_gpus) = bounds;
    // Decode is exact for slots but a heuristic for fractional GPUs, so a
    // re-plan never returns a plan that places fewer replicas or costs more
    // than keeping everything that runs and adding on top of it.
    let runs_now = classes.iter().any(|c| {
        c.current_patterns.iter().any(|&n| n > 0)
            || !c.current_slots.is_empty()
            || !c.current_whole.is_empty()
            || c.current_fractional_gpus > 0
    });
    if runs_now {
        // The same repair as above where the aggregate promised room the
        // packing could not find.
        let mut kept_classes = undated;
        for _ in 0..3 {
            let Some(counts) = ilp::pinned(&kept_classes, models, &wanted) else {
                break;
            };
            let kept = decode::decode(cluster, models, &kept_classes, &counts);
            let (placed, cost) = placed_and_cost(cluster, &counts, &kept);
            let (placed_now, cost_now) = placed_and_cost(cluster, &solved.counts, &decoded);
            // Keeping what runs wins ties and near-ties: a re-plan never
            // trades a cost inside the solver's own gap for disruption.
            if placed > placed_now
                || (placed == placed_now && cost <= cost_now * (1.0 + options.mip_rel_gap) + 1e-9)
            {
                decoded = kept;
                solved.counts = counts;
                break;
            }
            if kept.fractional_short.is_empty() {
                break;
            }
            recount(&mut kept_classes, &kept.fractional_short);
        }
    }
    let mut plan = figures(cluster, models, &wanted, &solved, decoded);
    plan.pools = pools(&classes, &solved, &plan.gpus);
    plan.solve_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok(plan)
}

fn figures(
    cluster: &Cluster,
    models: &[Model],
    wanted: &[u32],
    solved: &ilp::Solved,
    decoded: decode::Decoded,
) -> Plan {
    let by_name: BTreeMap<&str, &Model> = models.iter().map(|m| (m.name.as_str(), m)).collect();
    let mut used = 0u32;
    let mut cost = 0.0;
    let (mut memory, mut usable, mut compute, mut capacity) = (0.0, 0.0, 0.0, 0.0);
    let mut dominant = 0.0;
    let mut variants: BTreeMap<(String, String), plan::Variant> = BTreeMap::new();
    let mut placed: BTreeMap<&str, u32> = BTreeMap::new();
    // A tensor-parallel replica is listed on each of its GPUs; count it once.
    let mut groups_seen: std::collections::BTreeSet<(&str, &str, u32)> = Default::default();
    // The GPUs each fractional variant's replicas are on.
    let mut fractional_gpus: BTreeMap<String, std::collections::BTreeSet<(&str, u32)>> =
        BTreeMap::new();
    for g in &decoded.gpus {
        if g.mode == Mode::Idle || g.replicas.is_empty() {
            continue;
        }
        let Some(gpu) = cluster.catalog.get(&g.gpu_model) else {
            continue;
        };
        used += 1;
        cost += gpu.price_per_hour;
        usable += gpu.usable_gib;
        capacity += gpu.compute;
        let (mut gpu_memory, mut gpu_compute) = (0.0, 0.0);
        for r in &g.replicas {
            let Some(m) = by_name.get(r.model.as_str()) else {
                continue;
            };
            let share = f64::from(r.group_size.unwrap_or(1));
            gpu_memory += m.memory_gib / share;
            gpu_compute += m.compute / share;
        }
        memory += gpu_memory;
        compute += gpu_compute;
        dominant += dominant_fraction(gpu_memory, gpu_compute, gpu);
        for r in &g.replicas {
            let Some(m) = by_name.get(r.model.as_str()) else {
                continue;
            };
            let mut node_selector =
                BTreeMap::from([(emit::PRODUCT_LABEL.to_string(), gpu.product.clone())]);
            let mut resources = BTreeMap::new();
            let suffix = match g.mode {
                Mode::Mig => {
                    let profile = r.profile.clone().unwrap_or_default();
                    resources.insert(format!("nvidia.com/mig-{profile}"), 1);
                    profile
                }
                Mode::Timeslice | Mode::Mps => {
                    let config = if g.mode == Mode::Mps {
                        emit::mps_config_name(g.mps_replicas.unwrap_or(0))
                    } else {
                        emit::device_plugin_config_name(g.timeslice_replicas)
                    };
                    node_selector
                        .insert(emit::DEVICE_PLUGIN_CONFIG_LABEL.to_string(), config.clone());
                    resources.insert("nvidia.com/gpu.shared".to_string(), 1);
                    config
                }
                Mode::Fractional => {
                    // HAMi gives each of the container's GPUs these limits.
                    let k = r.group_size.unwrap_or(1);
                    let (mib, cores) = classes::fractional_need(m, gpu.compute, k);
                    resources.insert("nvidia.com/gpu".to_string(), k);
                    resources.insert(emit::HAMI_MEMORY.to_string(), mib);
                    resources.insert(emit::HAMI_CORES.to_string(), cores);
                    node_selector.insert(
                        emit::HAMI_NODE_LABEL.0.to_string(),
                        emit::HAMI_NODE_LABEL.1.to_string(),
                    );
                    if k == 1 {
                        "fractional".to_string()
                    } else {
                        format!("fractional-tp{k}")
                    }
                }
                Mode::Whole | Mode::Idle => {
                    let k = r.group_size.unwrap_or(1);
                    resources.insert("nvidia.com/gpu".to_string(), k);
                    format!("tp{k}")
                }
            };
            let name = format!("{}-{}-{}", r.model, g.gpu_model, suffix)
                .to_lowercase()
                .replace(['.', '+', '_'], "-");
            let v = variants
                .entry((r.model.clone(), name.clone()))
                .or_insert_with(|| plan::Variant {
                    name,
                    gpu_model: g.gpu_model.clone(),
                    resources,
                    node_selector,
                    annotations: BTreeMap::new(),
                    replicas: 0,
                });
            if g.mode == Mode::Fractional {
                fractional_gpus
                    .entry(v.name.clone())
                    .or_default()
                    .insert((g.node.as_str(), g.index));
            }
            let first_gpu_of_group = r.group_size.is_none()
                || groups_seen.insert((g.node.as_str(), r.model.as_str(), r.replica));
            if first_gpu_of_group {
                v.replicas += 1;
                *placed.entry(m.name.as_str()).or_insert(0) += 1;
            }
        }
    }
    for v in variants.values_mut() {
        if let Some(on) = fractional_gpus.get(&v.name) {
            v.annotations = emit::hami_annotations(cluster, on);
        }
    }
    let model_plans: Vec<ModelPlan> = models
        .iter()
        .enumerate()
        .map(|(i, m)| ModelPlan {
            name: m.name.clone(),
            wanted: wanted[i],
            placed: placed.get(m.name.as_str()).copied().unwrap_or(0),
            variants: variants
                .iter()
                .filter(|((model, _), _)| model == &m.name)
                .map(|(_, v)| v.clone())
                .collect(),
        })
        .collect();
    let unplaced: Vec<Unplaced> = model_plans
        .iter()
        .zip(models)
        .filter(|(p, _)| p.placed < p.wanted)
        .map(|(p, m)| Unplaced {
            model: m.name.clone(),
            replicas: p.wanted - p.placed,
            reason: unplaced_reason(cluster, m, &decoded.gpus),
        })
        .collect();

    let mut plan = Plan {
        gpus_used: used,
        lp_bound_gpus: (solved.lp_gpus - 1e-6).ceil().max(0.0) as u32,
        lp_bound_cost: solved.lp_cost,
        cost_per_hour: cost,
        optimality_gap: if solved.lp_cost > 1e-9 {
            (cost - solved.lp_cost) / solved.lp_cost
        } else {
            0.0
        },
        optimal: solved.optimal,
        utilization: Utilization {
            memory: if usable > 0.0 { memory / usable } else { 0.0 },
            compute: if capacity > 0.0 {
                compute / capacity
            } else {
                0.0
            },
            dominant: if used > 0 {
                dominant / f64::from(used)
            } else {
                0.0
            },
        },
        moves: decoded.moves,
        reconfigured_gpus: decoded.reconfigured,
        solve_ms: 0.0,
        unplaced,
        pools: Vec::new(),
        gpus: decoded.gpus,
        nodes: Vec::new(),
        models: model_plans,
        baselines: None,
    };
    let (_, names) = emit::mig_parted(&plan);
    plan.nodes = cluster
        .nodes
        .iter()
        .map(|n| NodePlan {
            name: n.name.clone(),
            mig_config: names
                .get(&n.name)
                .cloned()
                .unwrap_or_else(|| emit::ALL_DISABLED.to_string()),
            timeslice_replicas: decoded.timeslice_nodes.get(&n.name).copied(),
            mps_replicas: decoded.mps_nodes.get(&n.name).copied(),
            hami: decoded.hami_nodes.contains(&n.name),
        })
        .collect();
    plan
}

/// Counts the fractional capacity of each class decode fell short in at
/// the share its packing achieved (the GPUs counted over the GPUs needed,
/// at most 0.98 of what it was).
fn recount(classes: &mut [classes::Class], short: &BTreeMap<usize, (u32, u32)>) {
    for (&c, &(counted, needed)) in short {
        if let Some(cap) = classes[c].fractional.as_mut() {
            cap.aggregate *= (f64::from(counted.max(1)) / f64::from(needed.max(1))).min(0.98);
        }
    }
}

/// Replicas placed and cost per hour of a decoded plan.
fn placed_and_cost(
    cluster: &Cluster,
    counts: &ilp::Counts,
    decoded: &decode::Decoded,
) -> (u32, f64) {
    let placed = counts.slots.values().sum::<u32>()
        + counts.whole.values().sum::<u32>()
        + counts.fractional.values().sum::<u32>();
    let cost = decoded
        .gpus
        .iter()
        .filter(|g| g.mode != Mode::Idle && !g.replicas.is_empty())
        .filter_map(|g| cluster.catalog.get(&g.gpu_model))
        .map(|m| m.price_per_hour)
        .sum();
    (placed.saturating_sub(decoded.failed.iter().sum()), cost)
}

/// Per GPU model: healthy GPUs, GPUs in use, GPUs in the cost LP.
fn pools(classes: &[classes::Class], solved: &ilp::Solved, gpus: &[GpuPlan]) -> Vec<Pool> {
    let mut pools: BTreeMap<&str, Pool> = BTreeMap::new();
    for (class, lp) in classes.iter().zip(&solved.lp_class_gpus) {
        let pool = pools.entry(&class.gpu_model).or_insert_with(|| Pool {
            gpu_model: class.gpu_model.clone(),
            gpus: 0,
            gpus_used: 0,
            lp_gpus: 0.0,
        });
        pool.gpus += class.healthy_gpus();
        pool.lp_gpus += lp;
    }
    for g in gpus {
        if g.mode != Mode::Idle
            && !g.replicas.is_empty()
            && let Some(pool) = pools.get_mut(g.gpu_model.as_str())
        {
            pool.gpus_used += 1;
        }
    }
    pools.into_values().collect()
}

/// One GPU's dominant share: the larger of the memory and the compute
/// its replicas take, each as a fraction of the GPU's.
pub(crate) fn dominant_fraction(memory: f64, compute: f64, gpu: &GpuModel) -> f64 {
    let m = if gpu.usable_gib > 0.0 {
        memory / gpu.usable_gib
    } else {
        0.0
    };
    let c = if gpu.compute > 0.0 {
        compute / gpu.compute
    } else {
        0.0
    };
    m.max(c)
}

/// Why replicas of a model were left out, in a model owner's words.
fn unplaced_reason(cluster: &Cluster, m: &Model, gpus: &[GpuPlan]) -> String {
    let options = m.options(&cluster.catalog);
    let present: Vec<&PlacementOption> = options
        .iter()
        .filter(|o| cluster.gpus_allowing(o.gpu(), o.mode()) > 0)
        .collect();
    let describe = PlacementOption::describe;
    let head = format!(
        "{} needs {:.2} GiB and {:.2} H100s of compute per replica",
        m.name, m.memory_gib, m.compute
    );
    if present.is_empty() {
        let allowed: Vec<String> = options.iter().map(describe).collect();
        return format!(
            "{head}; allowed: {}; the cluster has none of these GPUs",
            if allowed.is_empty() {
                "nothing".to_string()
            } else {
                allowed.join(", ")
            }
        );
    }
    // Free GPUs per model and the largest free block on one node.
    let mut free: BTreeMap<&str, (u32, BTreeMap<&str, u32>)> = BTreeMap::new();
    let mode: BTreeMap<(&str, u32), Mode> = gpus
        .iter()
        .map(|p| ((p.node.as_str(), p.index), p.mode))
        .collect();
    for n in &cluster.nodes {
        for g in n.gpus.iter().filter(|g| g.health == Health::Healthy) {
            let idle = mode
                .get(&(n.name.as_str(), g.index))
                .is_none_or(|&m| m == Mode::Idle);
            if idle {
                let e = free.entry(n.gpu_model.as_str()).or_default();
                e.0 += 1;
                *e.1.entry(n.name.as_str()).or_insert(0) += 1;
            }
        }
    }
    let mut models_seen: Vec<&str> = Vec::new();
    let mut room = Vec::new();
    for o in &present {
        let gpu = o.gpu();
        if models_seen.contains(&gpu) {
            continue;
        }
        models_seen.push(gpu);
        let (total, per_node) = free.get(gpu).cloned().unwrap_or_default();
        let largest = per_node.values().copied().max().unwrap_or(0);
        room.push(format!(
            "{gpu}: {total} of {} GPUs free, at most {largest} on one node",
            cluster.gpus_of(gpu)
        ));
    }
    format!(
        "{head}; allowed: {}; not enough free capacity ({}) after higher-priority and cheaper placements",
        present
            .iter()
            .map(|o| describe(o))
            .collect::<Vec<_>>()
            .join(", or "),
        room.join("; ")
    )
}
