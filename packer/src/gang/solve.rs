//! One gang's placement: a small ILP (good_lp with HiGHS) over the nodes
//! of one GPU model at one topology level.
//!
//! Variables: workers per node `w_n` (integer), node used `u_n`, domain
//! chosen `y_d`, inference GPUs taken per node `k_n` (integer), running
//! gangs preempted `p_v`, fresh NVLink domains touched `z_D` (binaries).
//!
//! - `Σ w_n = workers` — all or nothing (the ILP is infeasible otherwise,
//!   and the job waits);
//! - `Σ y_d = 1`, `w_n ≤ cap_n · y_d(n)` — one domain of the level;
//! - `gpusPerWorker · w_n ≤ free_n + k_n + Σ_v held_vn · p_v` — whole GPUs.
//!
//! Objective, in this order of weight: GPU-hours lost to preemption;
//! inference GPUs taken (their replicas move or, above `minReplicas`,
//! stop); nodes used (the fewest); whole free nodes and NVLink domains
//! broken into (kept for larger gangs); then best fit (the domain and the
//! nodes with the least free capacity that hold it).
//!
//! [`best`] tries free GPUs first at every allowed level (narrowest
//! first), then lower-priority inference GPUs as well, then preemption of
//! lower-priority preemptible gangs; at each step the GPU model with the
//! cheapest solution wins. Where inference is packed again around the
//! gangs, free and inference GPUs are tried together level by level, so a
//! preferred level holds wherever moving inference can make room.

use std::collections::{BTreeMap, BTreeSet};

use good_lp::solvers::highs::highs;
use good_lp::{Expression, ProblemVariables, Solution, SolverModel, Variable, variable};
use gpuscale_policies::training::{TopologyLevel, TrainingJob};
use gpuscale_policies::{Cluster, Health};

use super::{GangOptions, GpuRef, domain};

/// A running gang that may be preempted.
#[derive(Debug, Clone, PartialEq)]
pub struct Victim {
    /// Index of the job.
    pub job: usize,
    /// Its GPUs.
    pub gpus: Vec<GpuRef>,
    /// GPU-hours its preemption loses.
    pub lost_gpu_hours: f64,
}

/// A placement found for one gang.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// GPU model.
    pub gpu_model: String,
    /// The level it was placed at.
    pub level: TopologyLevel,
    /// The GPUs, every worker's.
    pub gpus: Vec<GpuRef>,
    /// The gangs it preempts.
    pub victims: Vec<Victim>,
    /// What it took: free GPUs, inference GPUs, preemption.
    pub why: String,
    objective: f64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stage {
    Free,
    Inference,
    Preempt,
}

/// The best placement for `job`, or `None` when it must wait.
pub fn best(
    cluster: &Cluster,
    job: &TrainingJob,
    free: &BTreeMap<usize, BTreeSet<u32>>,
    inference: &BTreeMap<usize, Vec<u32>>,
    victims: &[Victim],
    options: &GangOptions,
    level_first: bool,
) -> Option<Choice> {
    let empty_inf = BTreeMap::new();
    // The order of the tries: by default free GPUs at every level first,
    // then inference's, then preemption. `level_first` (inference packed
    // again around the gangs): free then inference GPUs at each level
    // before the next wider one, so a preferred level is relaxed only
    // when moving inference cannot meet it either.
    let levels = super::levels(job);
    let mut tries: Vec<(Stage, TopologyLevel)> = Vec::new();
    if level_first {
        for &level in &levels {
            tries.push((Stage::Free, level));
            tries.push((Stage::Inference, level));
        }
    } else {
        tries.extend(levels.iter().map(|&l| (Stage::Free, l)));
        tries.extend(levels.iter().map(|&l| (Stage::Inference, l)));
    }
    tries.extend(levels.iter().map(|&l| (Stage::Preempt, l)));
    for (stage, level) in tries {
        if stage == Stage::Inference && inference.is_empty() {
            continue;
        }
        if stage == Stage::Preempt && victims.is_empty() {
            continue;
        }
        let inf = if stage == Stage::Free {
            &empty_inf
        } else {
            inference
        };
        let vs: &[Victim] = if stage == Stage::Preempt {
            victims
        } else {
            &[]
        };
        {
            let mut found: Option<Choice> = None;
            for m in &job.gpu_models {
                if let Some(c) = solve_one(cluster, job, m, level, free, inf, vs, options)
                    && found
                        .as_ref()
                        .is_none_or(|f| c.objective < f.objective - 1e-9)
                {
                    found = Some(c);
                }
            }
            if let Some(mut c) = found {
                let taken_inf = c
                    .gpus
                    .iter()
                    .filter(|(n, i)| !free.get(n).is_some_and(|s| s.contains(i)))
                    .filter(|(n, i)| {
                        !c.victims
                            .iter()
                            .any(|v| v.gpus.iter().any(|g| g == &(*n, *i)))
                    })
                    .count();
                c.why = match stage {
                    Stage::Free => "free GPUs".to_string(),
                    Stage::Inference => {
                        format!("takes {taken_inf} GPUs planned for inference")
                    }
                    Stage::Preempt if taken_inf > 0 => format!(
                        "preempts {} lower-priority gang(s), takes {taken_inf} GPUs planned for inference",
                        c.victims.len()
                    ),
                    Stage::Preempt => {
                        format!("preempts {} lower-priority gang(s)", c.victims.len())
                    }
                };
                return Some(c);
            }
        }
    }
    None
}

/// Per node: (free, takeable inference, healthy) GPU counts of one model.
fn capacity(
    cluster: &Cluster,
    m: &str,
    free: &BTreeMap<usize, BTreeSet<u32>>,
    inference: &BTreeMap<usize, Vec<u32>>,
    victims: &[Victim],
) -> Vec<(usize, u32, u32, u32, u32)> {
    let mut out = Vec::new();
    for (n, node) in cluster.nodes.iter().enumerate() {
        if node.gpu_model != m {
            continue;
        }
        let f = free.get(&n).map_or(0, |s| s.len() as u32);
        let i = inference.get(&n).map_or(0, |v| v.len() as u32);
        let h: u32 = victims
            .iter()
            .map(|v| v.gpus.iter().filter(|g| g.0 == n).count() as u32)
            .sum();
        let healthy = node
            .gpus
            .iter()
            .filter(|g| g.health == Health::Healthy)
            .count() as u32;
        if f + i + h > 0 {
            out.push((n, f, i, h, healthy));
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn solve_one(
    cluster: &Cluster,
    job: &TrainingJob,
    m: &str,
    level: TopologyLevel,
    free: &BTreeMap<usize, BTreeSet<u32>>,
    inference: &BTreeMap<usize, Vec<u32>>,
    victims: &[Victim],
    options: &GangOptions,
) -> Option<Choice> {
    let workers = job.spec.workers;
    let gpw = job.spec.gpus_per_worker.max(1);
    let nodes = capacity(cluster, m, free, inference, victims);
    // Domains that could hold the whole gang at all.
    let mut domains: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (k, &(n, ..)) in nodes.iter().enumerate() {
        if let Some(d) = domain(cluster, n, level) {
            domains.entry(d).or_default().push(k);
        }
    }
    let cap = |k: usize| {
        let (_, f, i, h, _) = nodes[k];
        (f + i + h) / gpw
    };
    domains.retain(|_, ks| ks.iter().map(|&k| cap(k)).sum::<u32>() >= workers);
    if domains.is_empty() {
        return None;
    }
    let used: Vec<usize> = domains.values().flatten().copied().collect();
    let victims: Vec<&Victim> = victims
        .iter()
        .filter(|v| {
            v.gpus
                .iter()
                .any(|g| used.iter().any(|&k| nodes[k].0 == g.0))
        })
        .collect();

    let mut vars = ProblemVariables::new();
    let mut w: BTreeMap<usize, Variable> = BTreeMap::new();
    let mut u: BTreeMap<usize, Variable> = BTreeMap::new();
    let mut kv: BTreeMap<usize, Variable> = BTreeMap::new();
    for &k in &used {
        w.insert(
            k,
            vars.add(variable().integer().min(0).max(cap(k).min(workers))),
        );
        u.insert(k, vars.add(variable().binary()));
        if nodes[k].2 > 0 {
            kv.insert(k, vars.add(variable().integer().min(0).max(nodes[k].2)));
        }
    }
    let y: BTreeMap<&String, Variable> = domains
        .keys()
        .map(|d| (d, vars.add(variable().binary())))
        .collect();
    let p: Vec<Variable> = victims
        .iter()
        .map(|_| vars.add(variable().binary()))
        .collect();
    // Fresh NVLink domains of several nodes.
    let mut nvl: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &k in &used {
        let n = nodes[k].0;
        if let Some(d) = &cluster.nodes[n].nvlink_domain {
            nvl.entry(d.clone()).or_default().push(k);
        }
    }
    let fresh = |k: usize| nodes[k].1 > 0 && nodes[k].1 == nodes[k].4;
    nvl.retain(|_, ks| ks.len() > 1 && ks.iter().all(|&k| fresh(k)));
    let z: BTreeMap<&String, Variable> = nvl
        .keys()
        .map(|d| (d, vars.add(variable().binary())))
        .collect();

    let max_free = used.iter().map(|&k| nodes[k].1).max().unwrap_or(1).max(1);
    let max_spare = domains
        .values()
        .map(|ks| ks.iter().map(|&k| nodes[k].1).sum::<u32>())
        .max()
        .unwrap_or(1)
        .max(1);
    let mut obj = Expression::from(0.0);
    for (v, &pv) in victims.iter().zip(&p) {
        obj += 10_000.0 * v.lost_gpu_hours.max(0.01) * pv;
    }
    for (&k, &kvar) in &kv {
        let _ = k;
        obj += 1_000.0 * kvar;
    }
    for &k in &used {
        let mut c = 100.0 + f64::from(nodes[k].1) / f64::from(max_free);
        if fresh(k) {
            c += 30.0;
        }
        obj += c * u[&k];
    }
    for &zv in z.values() {
        obj += 30.0 * zv;
    }
    for (d, &yv) in &y {
        let spare: u32 = domains[*d].iter().map(|&k| nodes[k].1).sum();
        obj += (f64::from(spare) / f64::from(max_spare)) * yv;
    }
    let mut problem = vars.minimise(obj.clone()).using(highs);
    problem.set_verbose(false);
    let mut problem = problem.set_time_limit(options.time_limit.as_secs_f64().max(0.05));
    let total: Expression = used.iter().map(|&k| w[&k]).sum();
    problem.add_constraint(total.eq(f64::from(workers)));
    let ys: Expression = y.values().copied().sum();
    problem.add_constraint(ys.eq(1.0));
    for (d, ks) in &domains {
        for &k in ks {
            let c = f64::from(cap(k).min(workers));
            problem.add_constraint((Expression::from(w[&k]) - c * y[d]).leq(0.0));
            problem.add_constraint((Expression::from(w[&k]) - c * u[&k]).leq(0.0));
        }
    }
    for &k in &used {
        let n = nodes[k].0;
        let mut rhs = Expression::from(f64::from(nodes[k].1));
        if let Some(&kvar) = kv.get(&k) {
            rhs += kvar;
        }
        for (v, &pv) in victims.iter().zip(&p) {
            let h = v.gpus.iter().filter(|g| g.0 == n).count() as f64;
            if h > 0.0 {
                rhs += h * pv;
            }
        }
        problem.add_constraint((f64::from(gpw) * w[&k] - rhs).leq(0.0));
    }
    for (d, ks) in &nvl {
        for &k in ks {
            problem.add_constraint((Expression::from(u[&k]) - z[d]).leq(0.0));
        }
    }
    let sol = problem.solve().ok()?;
    let objective = obj.eval_with(&sol);
    let chosen: Vec<Victim> = victims
        .iter()
        .zip(&p)
        .filter(|(_, pv)| sol.value(**pv) > 0.5)
        .map(|(v, _)| (*v).clone())
        .collect();
    // Decode: free GPUs first, then the victims', then inference's.
    let mut gpus = Vec::new();
    for &k in &used {
        let count = sol.value(w[&k]).round() as u32;
        if count == 0 {
            continue;
        }
        let n = nodes[k].0;
        let mut need = (count * gpw) as usize;
        let mut pool: Vec<u32> = free.get(&n).into_iter().flatten().copied().collect();
        let mut from_victims: Vec<u32> = chosen
            .iter()
            .flat_map(|v| v.gpus.iter().filter(|g| g.0 == n).map(|g| g.1))
            .collect();
        from_victims.sort_unstable();
        pool.extend(from_victims);
        pool.extend(inference.get(&n).into_iter().flatten().copied());
        for i in pool {
            if need == 0 {
                break;
            }
            gpus.push((n, i));
            need -= 1;
        }
        if need > 0 {
            // The ILP promised more than the node has: never place part of
            // a gang.
            return None;
        }
    }
    Some(Choice {
        gpu_model: m.to_string(),
        level,
        gpus,
        victims: chosen,
        why: String::new(),
        objective,
    })
}

/// Why a job cannot start: the most GPUs any one domain of its level
/// could give it, free and with what it may take.
pub fn why_waiting(
    cluster: &Cluster,
    job: &TrainingJob,
    free: &BTreeMap<usize, BTreeSet<u32>>,
    inference: &BTreeMap<usize, Vec<u32>>,
    victims: &[Victim],
) -> String {
    let level = *super::levels(job).last().expect("at least one level");
    let gpw = job.spec.gpus_per_worker.max(1);
    let mut best_free = 0;
    let mut best_all = 0;
    for m in &job.gpu_models {
        let nodes = capacity(cluster, m, free, inference, victims);
        let mut per: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        for (n, f, i, h, _) in nodes {
            let Some(d) = domain(cluster, n, level) else {
                continue;
            };
            let e = per.entry(d).or_default();
            e.0 += f / gpw;
            e.1 += (f + i + h) / gpw;
        }
        for (a, b) in per.values() {
            best_free = best_free.max(*a);
            best_all = best_all.max(*b);
        }
    }
    let scope = match level {
        TopologyLevel::Any => "the cluster".to_string(),
        l => format!("any one {l}"),
    };
    let mut s = format!(
        "waits: needs {} worker{} × {} GPUs of [{}]; {scope} has room for {best_free} such worker{} on free GPUs",
        job.spec.workers,
        if job.spec.workers == 1 { "" } else { "s" },
        gpw,
        job.gpu_models.join(", "),
        if best_free == 1 { "" } else { "s" },
    );
    if best_all > best_free {
        s.push_str(&format!(
            " ({best_all} with lower-priority work it may displace)"
        ));
    }
    s
}
