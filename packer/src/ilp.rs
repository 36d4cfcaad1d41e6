//! The configuration ILP: build, solve (HiGHS through good_lp), read back.
//!
//! Indices: `c` class, `p` pattern of `c`, `t` slot type of `c`, `m` model,
//! `k` tensor-parallel degree, `N` time-slicing replica count.
//!
//! Variables (non-negative integers; continuous for the LP bound):
//! - `n[c,p]` GPUs of class `c` configured as pattern `p`;
//! - `x[c,m,t]` replicas of `m` on slots of type `t` in `c`;
//! - `w[c,m,k]` tensor-parallel groups of `k` whole GPUs for `m` in `c`;
//! - `u[c,q]` nodes of `c` whose device-plugin config is `q` (time-slicing
//!   or MPS into `N`; one per node);
//! - `f[c]` fractional (HAMi) GPUs of `c`, `h[c]` nodes of `c` running
//!   HAMi, `y[c,m]` replicas of `m` on fractional GPUs of `c`;
//! - `s[m]` replicas of `m` left unplaced.
//!
//! Constraints, one function each:
//! - [`capacity`]: `Σp n[c,p] + f[c] + Σm,k k·w[c,m,k] ≤ healthy GPUs of c`;
//! - [`slots`]: `Σm x[c,m,t] ≤ Σp slots(p,t)·n[c,p]`;
//! - [`fractional`]: `Σm MiB[m]·y[c,m] ≤ MiB(c)·f[c]`, the same for SM
//!   percent, and six dual-feasible-function cuts
//!   ([`crate::classes::fractional_weights`]) — aggregate capacity: a valid
//!   relaxation of packing the replicas onto `f[c]` GPUs, which decode
//!   then does (first fit decreasing, more GPUs if it must);
//! - [`demand`]: `Σc,t x[c,m,t] + Σc y[c,m] + Σc,k w[c,m,k] + s[m] = D[m]`;
//! - [`node_configs`]: `Σ_q u[c,q] + h[c] ≤ nodes(c)`, `n[c,q] ≤ G·u[c,q]`,
//!   `f[c] ≤ G·h[c]`, `Σ k·w[c,m,k] ≤ G·(nodes(c) − Σ_q u[c,q] − h[c])`
//!   (one device-plugin config per node; no whole GPU on a node that
//!   shares), and MIG, time-sliced and whole GPUs together `≤ G·(nodes(c)
//!   − Σ u[c,MPS] − h[c])` (MPS and HAMi nodes run no MIG);
//! - [`tensor_parallel_fit`]: for `k` that does not divide `G`,
//!   `Σm w[c,m,k] ≤ nodes(c)·⌊G/k⌋`.
//!
//! Objectives: phase 1 minimises `Σ price·GPUs + Σ penalty[m]·s[m]` (the
//! penalty dwarfs any GPU, weighted by priority); when there is a current
//! state, phase 2 keeps phase 1's objective within its MIP gap and minimises
//! `W·reconfigured + moved`, with `keep[c,p] ≤ min(n[c,p], cur[c,p])` and
//! `stay ≤ min(x, cur)`: reconfigured = `Σ n − Σ keep`, moved = `Σ cur − Σ
//! stay`, `W` = current replicas + 1 so one GPU wiped outweighs any moves.

use std::collections::BTreeMap;
use std::time::Instant;

use good_lp::solvers::highs::highs;
use good_lp::{
    Constraint, Expression, ProblemVariables, Solution, SolutionStatus, SolverModel, Variable,
    variable,
};
use gpuscale_policies::{Model, Priority};

use crate::classes::{
    Class, PatternKind, fits_fractional, fits_slot, fractional_part, fractional_weights,
    whole_degrees,
};
use crate::{PackError, PackOptions};

/// The variables of one formulation.
struct Vars {
    n: Vec<Vec<Variable>>,
    x: Vec<(usize, usize, usize, Variable)>,
    w: Vec<(usize, usize, u32, Variable)>,
    u: Vec<(usize, usize, Variable)>,
    f: Vec<Option<(Variable, Variable)>>,
    y: Vec<(usize, usize, Variable)>,
    s: Vec<Variable>,
}

/// What the solve decided, in counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// GPUs per (class, pattern).
    pub patterns: Vec<Vec<u32>>,
    /// Replicas per (class, model, slot type).
    pub slots: BTreeMap<(usize, usize, usize), u32>,
    /// Tensor-parallel groups per (class, model, k).
    pub whole: BTreeMap<(usize, usize, u32), u32>,
    /// Nodes per (class, pattern) for patterns that need a device-plugin
    /// config (time-slicing or MPS).
    pub config_nodes: BTreeMap<(usize, usize), u32>,
    /// Fractional GPUs per class.
    pub fractional_gpus: Vec<u32>,
    /// Fractional replicas per (class, model).
    pub fractional: BTreeMap<(usize, usize), u32>,
    /// Unplaced replicas per model.
    pub unplaced: Vec<u32>,
}

/// The result of [`solve`].
#[derive(Debug, Clone)]
pub struct Solved {
    /// The integer solution.
    pub counts: Counts,
    /// Whether HiGHS proved optimality (false: time or gap limit).
    pub optimal: bool,
    /// LP-relaxation lower bound on cost per hour.
    pub lp_cost: f64,
    /// LP-relaxation lower bound on GPUs.
    pub lp_gpus: f64,
    /// GPUs per class in the cost LP relaxation's solution (parallel to
    /// the classes): what the plan's per-pool GPU counts are compared with.
    pub lp_class_gpus: Vec<f64>,
    /// Solver wall time, ms.
    pub solve_ms: f64,
}

fn penalty(model: &Model, max_gpus: u32, max_price: f64) -> f64 {
    let weight = match model.priority {
        Priority::Critical => 100.0,
        Priority::Standard => 10.0,
        Priority::Sheddable => 1.0,
    };
    // More than all the GPUs any replica could take (the largest
    // tensor-parallel degree at the highest price), so placing a replica
    // always beats leaving it out, and the same for every model of a
    // priority, so the most replicas are placed before cost counts; kept
    // as small as that allows so the objective stays well scaled.
    weight * (f64::from(max_gpus) * max_price + 1.0)
}

fn build_vars(
    vars: &mut ProblemVariables,
    classes: &[Class],
    models: &[Model],
    demand: &[u32],
    integer: bool,
) -> Vars {
    let int = |d: good_lp::variable::VariableDefinition| if integer { d.integer() } else { d };
    let mut v = Vars {
        n: Vec::new(),
        x: Vec::new(),
        w: Vec::new(),
        u: Vec::new(),
        f: Vec::new(),
        y: Vec::new(),
        s: Vec::new(),
    };
    for (c, class) in classes.iter().enumerate() {
        let healthy = f64::from(class.healthy_gpus());
        v.n.push(
            class
                .patterns
                .iter()
                .map(|_| vars.add(int(variable().min(0).max(healthy))))
                .collect(),
        );
        for (m, model) in models.iter().enumerate() {
            if demand[m] == 0 {
                continue;
            }
            for (t, slot) in class.slot_types.iter().enumerate() {
                if fits_slot(model, class, slot) {
                    let var = vars.add(int(variable().min(0).max(f64::from(demand[m]))));
                    v.x.push((c, m, t, var));
                }
            }
            for k in whole_degrees(model, class) {
                let var = vars.add(int(variable().min(0).max(f64::from(demand[m]))));
                v.w.push((c, m, k, var));
            }
        }
        for (p, pattern) in class.patterns.iter().enumerate() {
            if pattern.kind.node_config() {
                let var = vars.add(int(variable().min(0).max(class.nodes.len() as f64)));
                v.u.push((c, p, var));
            }
        }
        let fractional_models: Vec<usize> = (0..models.len())
            .filter(|&m| demand[m] > 0 && fits_fractional(&models[m], class))
            .collect();
        if fractional_models.is_empty() {
            v.f.push(None);
        } else {
            let f = vars.add(int(variable().min(0).max(healthy)));
            let h = vars.add(int(variable().min(0).max(class.nodes.len() as f64)));
            v.f.push(Some((f, h)));
            for m in fractional_models {
                let var = vars.add(int(variable().min(0).max(f64::from(demand[m]))));
                v.y.push((c, m, var));
            }
        }
    }
    for &d in demand {
        v.s.push(vars.add(int(variable().min(0).max(f64::from(d)))));
    }
    v
}

/// GPUs in use in class `c` (patterns and whole GPUs).
fn gpus_expr(v: &Vars, c: usize) -> Expression {
    let mut e = Expression::with_capacity(v.n[c].len() + 8);
    for &var in &v.n[c] {
        e.add_mul(1.0, var);
    }
    if let Some((f, _)) = v.f[c] {
        e.add_mul(1.0, f);
    }
    for &(cc, _, k, var) in &v.w {
        if cc == c {
            e.add_mul(f64::from(k), var);
        }
    }
    e
}

/// `Σp n[c,p] + Σ k·w[c,m,k] ≤ healthy GPUs of c`.
fn capacity(v: &Vars, classes: &[Class]) -> Vec<Constraint> {
    (0..classes.len())
        .map(|c| gpus_expr(v, c).leq(f64::from(classes[c].healthy_gpus())))
        .collect()
}

/// `Σm x[c,m,t] ≤ Σp slots(p,t)·n[c,p]`.
fn slots(v: &Vars, classes: &[Class]) -> Vec<Constraint> {
    let mut out = Vec::new();
    for (c, class) in classes.iter().enumerate() {
        for t in 0..class.slot_types.len() {
            let users: Vec<Variable> =
                v.x.iter()
                    .filter(|&&(cc, _, tt, _)| cc == c && tt == t)
                    .map(|&(_, _, _, var)| var)
                    .collect();
            if users.is_empty() {
                continue;
            }
            let mut e = Expression::with_capacity(users.len() + 8);
            for var in users {
                e.add_mul(1.0, var);
            }
            for (p, pattern) in class.patterns.iter().enumerate() {
                for &(tt, count) in &pattern.slots {
                    if tt == t {
                        e.add_mul(-f64::from(count), v.n[c][p]);
                    }
                }
            }
            out.push(e.leq(0.0));
        }
    }
    out
}

/// `Σ x[c,m,t] + Σ w[c,m,k] + s[m] = D[m]`.
fn demand(v: &Vars, demand: &[u32]) -> Vec<Constraint> {
    demand
        .iter()
        .enumerate()
        .map(|(m, &d)| {
            let mut e = Expression::with_capacity(16);
            e.add_mul(1.0, v.s[m]);
            for &(_, mm, _, var) in &v.x {
                if mm == m {
                    e.add_mul(1.0, var);
                }
            }
            for &(_, mm, _, var) in &v.w {
                if mm == m {
                    e.add_mul(1.0, var);
                }
            }
            for &(_, mm, var) in &v.y {
                if mm == m {
                    e.add_mul(1.0, var);
                }
            }
            e.eq(f64::from(d))
        })
        .collect()
}

/// Aggregate memory and SM capacity of each class's fractional GPUs, and
/// at most one replica larger than half a GPU on each.
fn fractional(v: &Vars, classes: &[Class], models: &[Model]) -> Vec<Constraint> {
    let mut out = Vec::new();
    for (c, class) in classes.iter().enumerate() {
        let (Some((f, _)), Some(cap)) = (v.f[c], class.fractional) else {
            continue;
        };
        let mut memory = Expression::with_capacity(16);
        let mut cores = Expression::with_capacity(16);
        let mut cuts: Vec<Expression> = (0..6).map(|_| Expression::with_capacity(16)).collect();
        for &(cc, m, var) in &v.y {
            if cc != c {
                continue;
            }
            let part = fractional_part(&models[m], class).expect("y only where it fits");
            let (need, k) = (part.need(), f64::from(part.gpus));
            // GiB and fractions of a GPU keep the coefficients near 1; a
            // tensor-parallel replica is `k` items, one on each of `k` GPUs.
            memory.add_mul(k * f64::from(need.0) / 1024.0, var);
            cores.add_mul(k * f64::from(need.1) / 100.0, var);
            for (cut, w) in cuts.iter_mut().zip(fractional_weights(need, cap)) {
                if w > 0.0 {
                    cut.add_mul(k * w, var);
                }
            }
        }
        memory.add_mul(-f64::from(cap.memory_mib) / 1024.0 * cap.aggregate, f);
        cores.add_mul(-f64::from(cap.cores) / 100.0 * cap.aggregate, f);
        out.push(memory.leq(0.0));
        out.push(cores.leq(0.0));
        for mut cut in cuts {
            cut.add_mul(-cap.aggregate, f);
            out.push(cut.leq(0.0));
        }
    }
    out
}

/// One device-plugin config per node; no whole GPU on a node that shares;
/// no MIG on MPS or HAMi nodes.
fn node_configs(v: &Vars, classes: &[Class]) -> Vec<Constraint> {
    let mut out = Vec::new();
    for (c, class) in classes.iter().enumerate() {
        let g = f64::from(class.gpus_per_node);
        let nodes = class.nodes.len() as f64;
        let mut configured = Expression::with_capacity(8);
        let mut no_mig = Expression::with_capacity(8);
        for &(cc, p, u) in &v.u {
            if cc != c {
                continue;
            }
            configured.add_mul(1.0, u);
            if matches!(class.patterns[p].kind, PatternKind::Mps(_)) {
                no_mig.add_mul(1.0, u);
            }
            let mut e = Expression::with_capacity(2);
            e.add_mul(1.0, v.n[c][p]);
            e.add_mul(-g, u);
            out.push(e.leq(0.0));
        }
        if let Some((f, h)) = v.f[c] {
            configured.add_mul(1.0, h);
            no_mig.add_mul(1.0, h);
            let mut e = Expression::with_capacity(2);
            e.add_mul(1.0, f);
            e.add_mul(-g, h);
            out.push(e.leq(0.0));
        }
        let mut whole = Expression::with_capacity(8);
        for &(cc, _, k, var) in &v.w {
            if cc == c {
                whole.add_mul(f64::from(k), var);
            }
        }
        let mut whole_room = whole.clone();
        whole_room.add_mul(g, configured.clone());
        out.push(whole_room.leq(g * nodes));
        out.push(configured.leq(nodes));
        let mut mig_room = whole;
        for (p, pattern) in class.patterns.iter().enumerate() {
            if matches!(pattern.kind, PatternKind::Mig(_) | PatternKind::Share(_)) {
                mig_room.add_mul(1.0, v.n[c][p]);
            }
        }
        mig_room.add_mul(g, no_mig);
        out.push(mig_room.leq(g * nodes));
    }
    out
}

/// Groups whose size does not divide the node size fit `⌊G/k⌋` per node.
fn tensor_parallel_fit(v: &Vars, classes: &[Class]) -> Vec<Constraint> {
    let mut per: BTreeMap<(usize, u32), Expression> = BTreeMap::new();
    for &(c, _, k, var) in &v.w {
        if k > 1 && !classes[c].gpus_per_node.is_multiple_of(k) {
            per.entry((c, k)).or_default().add_mul(1.0, var);
        }
    }
    per.into_iter()
        .map(|((c, k), e)| {
            let class = &classes[c];
            e.leq((class.nodes.len() as u32 * (class.gpus_per_node / k)) as f64)
        })
        .collect()
}

fn max_group(models: &[Model]) -> u32 {
    models
        .iter()
        .flat_map(|m| m.tensor_parallel.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1)
}

fn cost_expr(v: &Vars, classes: &[Class], models: &[Model]) -> Expression {
    let max_price = classes.iter().map(|c| c.price).fold(0.0, f64::max);
    let max_gpus = max_group(models);
    let mut e = Expression::with_capacity(64);
    for (c, class) in classes.iter().enumerate() {
        e.add_mul(class.price, gpus_expr(v, c));
    }
    for (m, model) in models.iter().enumerate() {
        e.add_mul(penalty(model, max_gpus, max_price), v.s[m]);
    }
    e
}

fn gpu_count_expr(v: &Vars, classes: &[Class], models: &[Model]) -> Expression {
    let mut e = Expression::with_capacity(64);
    for c in 0..classes.len() {
        e.add_mul(1.0, gpus_expr(v, c));
    }
    for (m, model) in models.iter().enumerate() {
        e.add_mul(penalty(model, max_group(models), 1.0), v.s[m]);
    }
    e
}

fn all_constraints(
    v: &Vars,
    classes: &[Class],
    models: &[Model],
    demand_: &[u32],
) -> Vec<Constraint> {
    let mut out = capacity(v, classes);
    out.extend(slots(v, classes));
    out.extend(fractional(v, classes, models));
    out.extend(demand(v, demand_));
    out.extend(node_configs(v, classes));
    out.extend(tensor_parallel_fit(v, classes));
    out
}

/// The relaxation's values, for rounding into a fallback solution.
struct Relaxed {
    n: Vec<Vec<f64>>,
    x: BTreeMap<(usize, usize, usize), f64>,
    w: BTreeMap<(usize, usize, u32), f64>,
    f: Vec<f64>,
    y: BTreeMap<(usize, usize), f64>,
}

fn lp_value(
    classes: &[Class],
    models: &[Model],
    demand_: &[u32],
    objective: fn(&Vars, &[Class], &[Model]) -> Expression,
) -> Result<(f64, Vec<f64>, Relaxed), PackError> {
    let mut vars = ProblemVariables::new();
    let v = build_vars(&mut vars, classes, models, demand_, false);
    let obj = objective(&v, classes, models);
    let mut problem = vars.minimise(obj).using(highs);
    for c in all_constraints(&v, classes, models, demand_) {
        problem.add_constraint(c);
    }
    let sol = problem
        .solve()
        .map_err(|e| PackError::Solver(e.to_string()))?;
    let gpus: Vec<f64> = (0..classes.len())
        .map(|c| gpus_expr(&v, c).eval_with(&sol))
        .collect();
    let cost: f64 = classes.iter().zip(&gpus).map(|(c, g)| c.price * g).sum();
    let relaxed = Relaxed {
        n: v.n
            .iter()
            .map(|ns| ns.iter().map(|&var| sol.value(var)).collect())
            .collect(),
        x: v.x
            .iter()
            .map(|&(c, m, t, var)| ((c, m, t), sol.value(var)))
            .collect(),
        w: v.w
            .iter()
            .map(|&(c, m, k, var)| ((c, m, k), sol.value(var)))
            .collect(),
        f: v.f
            .iter()
            .map(|f| f.map_or(0.0, |(f, _)| sol.value(f)))
            .collect(),
        y: v.y
            .iter()
            .map(|&(c, m, var)| ((c, m), sol.value(var)))
            .collect(),
    };
    Ok((cost, gpus, relaxed))
}

/// Rounds the relaxation into a feasible integer solution: patterns up,
/// replicas down, then the replicas left over placed greedily (spare slots,
/// then whole GPUs, then newly configured GPUs), the rest unplaced. HiGHS
/// starts from it, so it prunes from the first node instead of searching for
/// an incumbent. `None` when the rounding breaks a node-level rule.
fn round(classes: &[Class], models: &[Model], demand_: &[u32], r: &Relaxed) -> Option<Counts> {
    let up = |v: f64| (v - 1e-6).ceil().max(0.0) as u32;
    let down = |v: f64| (v + 1e-6).floor().max(0.0) as u32;
    let mut counts = Counts {
        patterns: r
            .n
            .iter()
            .map(|ns| ns.iter().map(|&v| up(v)).collect())
            .collect(),
        fractional_gpus: r.f.iter().map(|&v| up(v)).collect(),
        unplaced: vec![0; models.len()],
        ..Counts::default()
    };
    let mut remaining: Vec<u32> = demand_.to_vec();
    for (&key, &v) in &r.y {
        let k = down(v).min(remaining[key.1]);
        if k > 0 {
            counts.fractional.insert(key, k);
            remaining[key.1] -= k;
        }
    }
    for (&key, &v) in &r.x {
        let k = down(v).min(remaining[key.1]);
        if k > 0 {
            counts.slots.insert(key, k);
            remaining[key.1] -= k;
        }
    }
    for (&key, &v) in &r.w {
        let k = down(v).min(remaining[key.1]);
        if k > 0 {
            counts.whole.insert(key, k);
            remaining[key.1] -= k;
        }
    }
    let mut used: Vec<u32> = (0..classes.len())
        .map(|c| {
            counts.patterns[c].iter().sum::<u32>()
                + counts.fractional_gpus[c]
                + counts
                    .whole
                    .iter()
                    .filter(|((cc, _, _), _)| *cc == c)
                    .map(|(&(_, _, k), &n)| k * n)
                    .sum::<u32>()
        })
        .collect();
    let mut spare: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    for (c, class) in classes.iter().enumerate() {
        for (p, pattern) in class.patterns.iter().enumerate() {
            for &(t, k) in &pattern.slots {
                *spare.entry((c, t)).or_insert(0) += i64::from(k * counts.patterns[c][p]);
            }
        }
    }
    for (&(c, _, t), &k) in &counts.slots {
        *spare.entry((c, t)).or_insert(0) -= i64::from(k);
    }
    // Rounding patterns up can overrun a class: take back the GPUs rounded
    // up least, and the replicas their slots held go back to the greedy.
    for (c, class) in classes.iter().enumerate() {
        // Fractional GPUs rounded up first go back while they overrun.
        while used[c] > class.healthy_gpus() && counts.fractional_gpus[c] > 0 {
            take_back_fractional_gpu(class, c, models, &mut counts, &mut remaining)?;
            used[c] -= 1;
        }
        counts.fractional.retain(|_, n| *n > 0);
        while used[c] > class.healthy_gpus() {
            let p = (0..class.patterns.len())
                .filter(|&p| counts.patterns[c][p] > 0)
                .min_by(|&a, &b| {
                    let frac = |p: usize| r.n[c][p] - r.n[c][p].floor();
                    frac(a).total_cmp(&frac(b)).then(a.cmp(&b))
                })?;
            take_back_gpu(class, c, p, &mut counts, &mut spare, &mut remaining)?;
            used[c] -= 1;
        }
    }
    counts.slots.retain(|_, n| *n > 0);
    // Where the node-level rules break, take back whole GPUs first, then
    // GPUs of the sharing role (a device-plugin config or HAMi) holding
    // fewest, then MIG GPUs; their replicas go back to the greedy.
    for (c, class) in classes.iter().enumerate() {
        while !node_ok(class, c, &counts, Extra::default()) {
            let g = class.gpus_per_node.max(1);
            let configured: u32 = class
                .patterns
                .iter()
                .enumerate()
                .filter(|(_, p)| p.kind.node_config())
                .map(|(p, _)| counts.patterns[c][p].div_ceil(g))
                .sum::<u32>()
                + counts.fractional_gpus[c].div_ceil(g);
            let whole = counts
                .whole
                .iter()
                .filter(|&(&(cc, _, _), &n)| cc == c && n > 0)
                .max_by_key(|&(&(_, _, k), _)| k)
                .map(|(&key, _)| key);
            if let Some(key) = whole.filter(|_| configured <= class.nodes.len() as u32) {
                *counts.whole.get_mut(&key).expect("found above") -= 1;
                remaining[key.1] += 1;
                used[c] -= key.2;
                continue;
            }
            let role = class
                .patterns
                .iter()
                .enumerate()
                .filter(|&(p, pattern)| pattern.kind.node_config() && counts.patterns[c][p] > 0)
                .map(|(p, _)| (counts.patterns[c][p], Some(p)))
                .chain((counts.fractional_gpus[c] > 0).then_some((counts.fractional_gpus[c], None)))
                .min();
            let p = match role {
                Some((_, Some(p))) => p,
                Some((_, None)) => {
                    take_back_fractional_gpu(class, c, models, &mut counts, &mut remaining)?;
                    used[c] -= 1;
                    continue;
                }
                None => (0..class.patterns.len()).find(|&p| counts.patterns[c][p] > 0)?,
            };
            take_back_gpu(class, c, p, &mut counts, &mut spare, &mut remaining)?;
            used[c] -= 1;
        }
    }
    counts.slots.retain(|_, n| *n > 0);
    counts.fractional.retain(|_, n| *n > 0);
    counts.whole.retain(|_, n| *n > 0);
    complete(classes, models, counts, remaining, used, spare)
}

/// One GPU of pattern `p` of class `c` less; the replicas its slots held
/// (from the slot types holding most) go back to `remaining`. `None` when
/// the counts were inconsistent.
fn take_back_gpu(
    class: &Class,
    c: usize,
    p: usize,
    counts: &mut Counts,
    spare: &mut BTreeMap<(usize, usize), i64>,
    remaining: &mut [u32],
) -> Option<()> {
    counts.patterns[c][p] -= 1;
    for &(t, k) in &class.patterns[p].slots {
        let left = spare.entry((c, t)).or_insert(0);
        *left -= i64::from(k);
        while *left < 0 {
            let (&key, _) = counts
                .slots
                .iter()
                .filter(|&(&(cc, _, tt), &n)| cc == c && tt == t && n > 0)
                .max_by_key(|&(_, &n)| n)?;
            *counts.slots.get_mut(&key).expect("found above") -= 1;
            remaining[key.1] += 1;
            *left += 1;
        }
    }
    Some(())
}

/// One fractional GPU of class `c` less; replicas (of the models with
/// most) go back to `remaining` until the rest fit in aggregate.
fn take_back_fractional_gpu(
    class: &Class,
    c: usize,
    models: &[Model],
    counts: &mut Counts,
    remaining: &mut [u32],
) -> Option<()> {
    counts.fractional_gpus[c] -= 1;
    while !fractional_fits(class, c, models, counts) {
        let (&key, _) = counts
            .fractional
            .iter()
            .filter(|&(&(cc, _), &n)| cc == c && n > 0)
            .max_by_key(|&(_, &n)| n)?;
        *counts.fractional.get_mut(&key).expect("found above") -= 1;
        remaining[key.1] += 1;
    }
    Some(())
}

/// Places the `remaining` replicas greedily on top of `counts` (spare
/// slots, then whole GPUs, then newly configured GPUs; the rest unplaced),
/// drops GPUs left with nothing, and checks the node-level rules.
fn complete(
    classes: &[Class],
    models: &[Model],
    mut counts: Counts,
    mut remaining: Vec<u32>,
    mut used: Vec<u32>,
    mut spare: BTreeMap<(usize, usize), i64>,
) -> Option<Counts> {
    let mut order: Vec<usize> = (0..models.len()).collect();
    order.sort_by(|&a, &b| {
        models[a]
            .priority
            .cmp(&models[b].priority)
            .then(models[b].memory_gib.total_cmp(&models[a].memory_gib))
    });
    for m in order {
        while remaining[m] > 0 {
            // A spare slot that fits, smallest first.
            let slot = spare
                .iter()
                .filter(|&(&(c, t), &n)| {
                    n > 0 && fits_slot(&models[m], &classes[c], &classes[c].slot_types[t])
                })
                .min_by(|a, b| {
                    let ta = &classes[a.0.0].slot_types[a.0.1];
                    let tb = &classes[b.0.0].slot_types[b.0.1];
                    ta.memory_gib.total_cmp(&tb.memory_gib).then(a.0.cmp(b.0))
                })
                .map(|(&key, _)| key);
            if let Some((c, t)) = slot {
                *spare.get_mut(&(c, t)).expect("found above") -= 1;
                *counts.slots.entry((c, m, t)).or_insert(0) += 1;
                remaining[m] -= 1;
                continue;
            }
            // Room on a fractional GPU already counted, cheapest class.
            let room = (0..classes.len())
                .filter(|&c| fits_fractional(&models[m], &classes[c]))
                .filter(|&c| {
                    *counts.fractional.entry((c, m)).or_insert(0) += 1;
                    let fits = fractional_fits(&classes[c], c, models, &counts);
                    *counts.fractional.get_mut(&(c, m)).expect("inserted above") -= 1;
                    fits
                })
                .min_by(|&a, &b| classes[a].price.total_cmp(&classes[b].price));
            if let Some(c) = room {
                *counts.fractional.entry((c, m)).or_insert(0) += 1;
                remaining[m] -= 1;
                continue;
            }
            // Whole GPUs, cheapest.
            let whole = classes
                .iter()
                .enumerate()
                .flat_map(|(c, class)| {
                    whole_degrees(&models[m], class)
                        .into_iter()
                        .map(move |k| (c, k))
                })
                .filter(|&(c, k)| {
                    used[c] + k <= classes[c].healthy_gpus()
                        && node_ok(&classes[c], c, &counts, Extra::whole(k))
                })
                .min_by(|a, b| {
                    (classes[a.0].price * f64::from(a.1))
                        .total_cmp(&(classes[b.0].price * f64::from(b.1)))
                });
            if let Some((c, k)) = whole {
                used[c] += k;
                *counts.whole.entry((c, m, k)).or_insert(0) += 1;
                remaining[m] -= 1;
                continue;
            }
            // A newly configured GPU: the pattern with the most fitting
            // slots (a fractional GPU counts as many as the replica's
            // share of it allows).
            let mut best: Option<(usize, Option<usize>, u32)> = None;
            for (c, class) in classes.iter().enumerate() {
                if used[c] >= class.healthy_gpus() {
                    continue;
                }
                for (p, pattern) in class.patterns.iter().enumerate() {
                    let fitting: u32 = pattern
                        .slots
                        .iter()
                        .filter(|&&(t, _)| fits_slot(&models[m], class, &class.slot_types[t]))
                        .map(|&(_, k)| k)
                        .sum();
                    if fitting > 0
                        && node_ok(class, c, &counts, Extra::pattern(p))
                        && better(classes, best, (c, fitting))
                    {
                        best = Some((c, Some(p), fitting));
                    }
                }
                if let Some(part) = fractional_part(&models[m], class)
                    && let Some(cap) = class.fractional
                    && used[c] + part.gpus <= class.healthy_gpus()
                    && node_ok(class, c, &counts, Extra::fractional(part.gpus))
                {
                    // A tensor-parallel replica opens its `k` GPUs at once.
                    let fitting = (cap.memory_mib / part.mib).min(cap.cores / part.pct).max(1);
                    if better(classes, best, (c, fitting)) {
                        best = Some((c, None, fitting));
                    }
                }
            }
            match best {
                Some((c, Some(p), _)) => {
                    used[c] += 1;
                    counts.patterns[c][p] += 1;
                    for &(t, k) in &classes[c].patterns[p].slots {
                        *spare.entry((c, t)).or_insert(0) += i64::from(k);
                    }
                }
                Some((c, None, _)) => {
                    let k = fractional_part(&models[m], &classes[c]).map_or(1, |p| p.gpus);
                    used[c] += k;
                    counts.fractional_gpus[c] += k;
                }
                None => {
                    counts.unplaced[m] += remaining[m];
                    remaining[m] = 0;
                }
            }
        }
    }
    // Consolidate: take a GPU away when the replicas its slots would hold
    // fit spare slots elsewhere (any class, any slot type they fit); the
    // dearest GPUs first.
    let mut order: Vec<(usize, usize)> = classes
        .iter()
        .enumerate()
        .flat_map(|(c, class)| (0..class.patterns.len()).map(move |p| (c, p)))
        .collect();
    order.sort_by(|a, b| {
        classes[b.0]
            .price
            .total_cmp(&classes[a.0].price)
            .then(a.cmp(b))
    });
    for (c, p) in order {
        while counts.patterns[c][p] > 0 {
            let mut trial_counts = counts.clone();
            let mut trial_spare = spare.clone();
            trial_counts.patterns[c][p] -= 1;
            let mut ok = true;
            for &(t, k) in &classes[c].patterns[p].slots {
                let left = trial_spare.entry((c, t)).or_insert(0);
                *left -= i64::from(k);
                // Move replicas out of type t until its slots suffice.
                while ok && trial_spare[&(c, t)] < 0 {
                    let from = trial_counts
                        .slots
                        .iter()
                        .find(|&(&(cc, _, tt), &n)| cc == c && tt == t && n > 0)
                        .map(|(&key, _)| key);
                    let Some((_, m, _)) = from else {
                        ok = false;
                        break;
                    };
                    let to = trial_spare
                        .iter()
                        .filter(|&(&(c2, t2), &n)| {
                            n > 0
                                && (c2, t2) != (c, t)
                                && fits_slot(&models[m], &classes[c2], &classes[c2].slot_types[t2])
                        })
                        .min_by(|a, b| {
                            let ta = &classes[a.0.0].slot_types[a.0.1];
                            let tb = &classes[b.0.0].slot_types[b.0.1];
                            ta.memory_gib.total_cmp(&tb.memory_gib).then(a.0.cmp(b.0))
                        })
                        .map(|(&key, _)| key);
                    let Some((c2, t2)) = to else {
                        ok = false;
                        break;
                    };
                    *trial_counts.slots.get_mut(&(c, m, t)).expect("found above") -= 1;
                    *trial_counts.slots.entry((c2, m, t2)).or_insert(0) += 1;
                    *trial_spare.get_mut(&(c2, t2)).expect("found above") -= 1;
                    *trial_spare.get_mut(&(c, t)).expect("exists") += 1;
                }
                if !ok {
                    break;
                }
            }
            if !ok {
                break;
            }
            trial_counts.slots.retain(|_, n| *n > 0);
            counts = trial_counts;
            spare = trial_spare;
        }
    }
    // GPUs whose every slot is spare were rounded up for nothing.
    for (c, class) in classes.iter().enumerate() {
        for (p, pattern) in class.patterns.iter().enumerate() {
            while counts.patterns[c][p] > 0
                && pattern
                    .slots
                    .iter()
                    .all(|&(t, k)| spare.get(&(c, t)).copied().unwrap_or(0) >= i64::from(k))
            {
                counts.patterns[c][p] -= 1;
                for &(t, k) in &pattern.slots {
                    *spare.get_mut(&(c, t)).expect("checked above") -= i64::from(k);
                }
            }
        }
    }
    // Fractional GPUs the replicas do not need.
    for (c, class) in classes.iter().enumerate() {
        while counts.fractional_gpus[c] > 0 {
            counts.fractional_gpus[c] -= 1;
            if !fractional_fits(class, c, models, &counts) {
                counts.fractional_gpus[c] += 1;
                break;
            }
        }
    }
    counts.fractional.retain(|_, n| *n > 0);
    // Node-level rules: one device-plugin config per node, no whole GPU
    // there, no MIG on MPS or HAMi nodes.
    for (c, class) in classes.iter().enumerate() {
        let g = class.gpus_per_node.max(1);
        for (p, pattern) in class.patterns.iter().enumerate() {
            if pattern.kind.node_config() {
                let need = counts.patterns[c][p].div_ceil(g);
                if need > 0 {
                    counts.config_nodes.insert((c, p), need);
                }
            }
        }
        if !node_ok(class, c, &counts, Extra::default()) {
            return None;
        }
        for k in 2..=g {
            if g.is_multiple_of(k) {
                continue;
            }
            let groups: u32 = counts
                .whole
                .iter()
                .filter(|((cc, _, kk), _)| *cc == c && *kk == k)
                .map(|(_, &n)| n)
                .sum();
            if groups > class.nodes.len() as u32 * (g / k) {
                return None;
            }
        }
    }
    Some(counts)
}

/// The current placement, trimmed or extended to the demand: replicas
/// beyond the demand leave (from the slot types and groups holding most),
/// missing ones are placed by [`complete`] on top of what runs. Nothing that
/// runs moves; `None` when that cannot keep the node-level rules.
pub fn pinned(classes: &[Class], models: &[Model], demand_: &[u32]) -> Option<Counts> {
    let mut counts = Counts {
        patterns: classes.iter().map(|c| c.current_patterns.clone()).collect(),
        fractional_gpus: classes.iter().map(|c| c.current_fractional_gpus).collect(),
        unplaced: vec![0; models.len()],
        ..Counts::default()
    };
    for (c, class) in classes.iter().enumerate() {
        for (&m, &n) in &class.current_fractional {
            if fits_fractional(&models[m], class) {
                counts.fractional.insert((c, m), n);
            }
        }
        for (&(m, t), &n) in &class.current_slots {
            if fits_slot(&models[m], class, &class.slot_types[t]) {
                counts.slots.insert((c, m, t), n);
            }
        }
        for (&(m, k), &n) in &class.current_whole {
            if whole_degrees(&models[m], class).contains(&k) {
                counts.whole.insert((c, m, k), n);
            }
        }
    }
    let mut remaining = vec![0u32; models.len()];
    for (m, &want) in demand_.iter().enumerate() {
        let mut have: u32 = counts
            .slots
            .iter()
            .filter(|((_, mm, _), _)| *mm == m)
            .map(|(_, &n)| n)
            .sum::<u32>()
            + counts
                .whole
                .iter()
                .filter(|((_, mm, _), _)| *mm == m)
                .map(|(_, &n)| n)
                .sum::<u32>()
            + counts
                .fractional
                .iter()
                .filter(|((_, mm), _)| *mm == m)
                .map(|(_, &n)| n)
                .sum::<u32>();
        while have > want {
            let slot = counts
                .slots
                .iter()
                .filter(|&(&(_, mm, _), &n)| mm == m && n > 0)
                .max_by_key(|&(_, &n)| n)
                .map(|(&key, _)| key);
            let fractional = counts
                .fractional
                .iter()
                .filter(|&(&(_, mm), &n)| mm == m && n > 0)
                .max_by_key(|&(_, &n)| n)
                .map(|(&key, _)| key);
            match (slot, fractional) {
                (Some(key), _) => *counts.slots.get_mut(&key).expect("found above") -= 1,
                (None, Some(key)) => *counts.fractional.get_mut(&key).expect("found above") -= 1,
                (None, None) => {
                    let (&key, _) = counts
                        .whole
                        .iter()
                        .filter(|&(&(_, mm, _), &n)| mm == m && n > 0)
                        .max_by_key(|&(_, &n)| n)?;
                    *counts.whole.get_mut(&key).expect("found above") -= 1;
                }
            }
            have -= 1;
        }
        remaining[m] = want - have;
    }
    counts.slots.retain(|_, n| *n > 0);
    counts.whole.retain(|_, n| *n > 0);
    counts.fractional.retain(|_, n| *n > 0);
    if (0..classes.len()).any(|c| !fractional_fits(&classes[c], c, models, &counts)) {
        return None;
    }
    let mut used = Vec::new();
    let mut spare: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    for (c, class) in classes.iter().enumerate() {
        let whole: u32 = counts
            .whole
            .iter()
            .filter(|((cc, _, _), _)| *cc == c)
            .map(|(&(_, _, k), &n)| k * n)
            .sum();
        used.push(counts.patterns[c].iter().sum::<u32>() + counts.fractional_gpus[c] + whole);
        for (p, pattern) in class.patterns.iter().enumerate() {
            for &(t, k) in &pattern.slots {
                *spare.entry((c, t)).or_insert(0) += i64::from(k * counts.patterns[c][p]);
            }
        }
    }
    for (&(c, _, t), &k) in &counts.slots {
        *spare.entry((c, t)).or_insert(0) -= i64::from(k);
    }
    if spare.values().any(|&v| v < 0) {
        return None;
    }
    complete(classes, models, counts, remaining, used, spare)
}

/// Whether a pinned re-plan's extra cost over the current placement is
/// within the LP relaxation's marginal cost of the same change plus the MIP
/// gap. A heuristic test, not a proof: it assumes the current placement was
/// itself near-optimal (it came from a solve), and it sends consolidation
/// after scale-downs (where keeping everything fragments) to the full solve.
fn change_is_cheap(
    classes: &[Class],
    models: &[Model],
    pinned_counts: &Counts,
    lp_cost: f64,
    options: &PackOptions,
) -> Result<bool, PackError> {
    let mut running = vec![0u32; models.len()];
    for class in classes {
        for (&(m, _), &n) in &class.current_slots {
            running[m] += n;
        }
        for (&(m, _), &n) in &class.current_whole {
            running[m] += n;
        }
        for (&m, &n) in &class.current_fractional {
            running[m] += n;
        }
    }
    let Some(now) = pinned(classes, models, &running) else {
        return Ok(false);
    };
    let (lp_now, _, _) = lp_value(classes, models, &running, cost_expr)?;
    let extra = counts_cost(classes, models, pinned_counts) - counts_cost(classes, models, &now);
    Ok(extra <= (lp_cost - lp_now).max(0.0) + options.mip_rel_gap * lp_cost + 1e-9)
}

/// A new integer `y ≤ min(bound, var)`: how much of `var` stays as it is.
fn kept(
    vars: &mut ProblemVariables,
    links: &mut Vec<Constraint>,
    bound: u32,
    var: Variable,
) -> Variable {
    let y = vars.add(variable().integer().min(0).max(f64::from(bound)));
    let mut e = Expression::with_capacity(2);
    e.add_mul(1.0, y);
    e.add_mul(-1.0, var);
    links.push(e.leq(0.0));
    y
}

/// Objective value (cost plus unplaced penalties) of integer counts.
fn counts_cost(classes: &[Class], models: &[Model], counts: &Counts) -> f64 {
    let max_price = classes.iter().map(|c| c.price).fold(0.0, f64::max);
    let max_gpus = max_group(models);
    let mut cost = 0.0;
    for (c, class) in classes.iter().enumerate() {
        let gpus: u32 = counts.patterns[c].iter().sum::<u32>()
            + counts.fractional_gpus.get(c).copied().unwrap_or(0)
            + counts
                .whole
                .iter()
                .filter(|((cc, _, _), _)| *cc == c)
                .map(|(&(_, _, k), &n)| k * n)
                .sum::<u32>();
        cost += class.price * f64::from(gpus);
    }
    for (m, model) in models.iter().enumerate() {
        cost += penalty(model, max_gpus, max_price) * f64::from(counts.unplaced[m]);
    }
    cost
}

/// What is added to a class's counts before checking the node rules.
#[derive(Debug, Clone, Copy, Default)]
struct Extra {
    whole: u32,
    pattern: Option<usize>,
    fractional: u32,
}

impl Extra {
    fn whole(k: u32) -> Extra {
        Extra {
            whole: k,
            ..Extra::default()
        }
    }
    fn pattern(p: usize) -> Extra {
        Extra {
            pattern: Some(p),
            ..Extra::default()
        }
    }
    fn fractional(gpus: u32) -> Extra {
        Extra {
            fractional: gpus,
            ..Extra::default()
        }
    }
}

/// Whether class `c` keeps the node-level rules with `extra` added: one
/// device-plugin config (time-slicing, MPS) or HAMi per node, whole GPUs
/// only on nodes with neither, MIG and time-sliced GPUs not on MPS or
/// HAMi nodes.
fn node_ok(class: &Class, c: usize, counts: &Counts, extra: Extra) -> bool {
    let g = class.gpus_per_node.max(1);
    let nodes = class.nodes.len() as u32;
    let (mut configured, mut no_mig, mut mig_share) = (0u32, 0u32, 0u32);
    for (p, pattern) in class.patterns.iter().enumerate() {
        let n = counts.patterns[c][p] + u32::from(extra.pattern == Some(p));
        match pattern.kind {
            PatternKind::Mig(_) => mig_share += n,
            PatternKind::Share(_) => {
                configured += n.div_ceil(g);
                mig_share += n;
            }
            PatternKind::Mps(_) => {
                configured += n.div_ceil(g);
                no_mig += n.div_ceil(g);
            }
        }
    }
    let hami = (counts.fractional_gpus.get(c).copied().unwrap_or(0) + extra.fractional).div_ceil(g);
    configured += hami;
    no_mig += hami;
    let whole: u32 = counts
        .whole
        .iter()
        .filter(|((cc, _, _), _)| *cc == c)
        .map(|(&(_, _, k), &n)| k * n)
        .sum::<u32>()
        + extra.whole;
    configured <= nodes
        && whole <= g * (nodes - configured)
        && no_mig <= nodes
        && mig_share + whole <= g * (nodes - no_mig)
}

/// Whether the fractional replicas of class `c` fit its fractional GPUs in
/// aggregate (the ILP's [`fractional`] constraints).
fn fractional_fits(class: &Class, c: usize, models: &[Model], counts: &Counts) -> bool {
    let gpus = counts.fractional_gpus.get(c).copied().unwrap_or(0);
    let Some(cap) = class.fractional else {
        return counts
            .fractional
            .range((c, 0)..(c + 1, 0))
            .all(|(_, &n)| n == 0);
    };
    let (mut mib, mut pct, mut cuts) = (0u64, 0u64, [0.0f64; 6]);
    for (&(_, m), &n) in counts.fractional.range((c, 0)..(c + 1, 0)) {
        let Some(part) = fractional_part(&models[m], class) else {
            return false;
        };
        let items = part.gpus * n;
        mib += u64::from(part.mib) * u64::from(items);
        pct += u64::from(part.pct) * u64::from(items);
        for (sum, w) in cuts.iter_mut().zip(fractional_weights(part.need(), cap)) {
            *sum += w * f64::from(items);
        }
    }
    let bins = f64::from(gpus) * cap.aggregate;
    mib as f64 <= f64::from(cap.memory_mib) * bins + 1e-6
        && pct as f64 <= f64::from(cap.cores) * bins + 1e-6
        && cuts.iter().all(|&w| w <= bins + 1e-9)
}

/// Whether opening a GPU of class `c` with `fitting` places for the replica
/// beats `best`: more places first, then the cheaper GPU.
fn better(
    classes: &[Class],
    best: Option<(usize, Option<usize>, u32)>,
    (c, fitting): (usize, u32),
) -> bool {
    match best {
        None => true,
        Some((bc, _, bf)) => {
            fitting > bf || (fitting == bf && classes[c].price < classes[bc].price)
        }
    }
}

fn read_counts(sol: &impl Solution, v: &Vars) -> Counts {
    let int = |var: Variable| sol.value(var).round().max(0.0) as u32;
    let mut counts = Counts {
        patterns: v
            .n
            .iter()
            .map(|ns| ns.iter().map(|&var| int(var)).collect())
            .collect(),
        fractional_gpus: v.f.iter().map(|f| f.map_or(0, |(f, _)| int(f))).collect(),
        unplaced: v.s.iter().map(|&var| int(var)).collect(),
        ..Counts::default()
    };
    for &(c, m, t, var) in &v.x {
        let k = int(var);
        if k > 0 {
            counts.slots.insert((c, m, t), k);
        }
    }
    for &(c, m, k, var) in &v.w {
        let n = int(var);
        if n > 0 {
            counts.whole.insert((c, m, k), n);
        }
    }
    for &(c, p, var) in &v.u {
        let k = int(var);
        if k > 0 {
            counts.config_nodes.insert((c, p), k);
        }
    }
    for &(c, m, var) in &v.y {
        let k = int(var);
        if k > 0 {
            counts.fractional.insert((c, m), k);
        }
    }
    counts
}

/// Solves the packing: LP bounds, phase 1 (cost), phase 2 (disruption).
pub fn solve(
    classes: &[Class],
    models: &[Model],
    demand_: &[u32],
    options: &PackOptions,
) -> Result<Solved, PackError> {
    let start = Instant::now();
    let (lp_cost, lp_class_gpus, relaxed) = lp_value(classes, models, demand_, cost_expr)?;
    let (_, gpus, _) = lp_value(classes, models, demand_, gpu_count_expr)?;
    let lp_gpus = gpus.iter().sum();
    let warm = round(classes, models, demand_, &relaxed);
    let solved = |counts: Counts, optimal: bool| Solved {
        counts,
        optimal,
        lp_cost,
        lp_gpus,
        lp_class_gpus: lp_class_gpus.clone(),
        solve_ms: start.elapsed().as_secs_f64() * 1e3,
    };

    let has_current = classes.iter().any(|c| {
        c.current_patterns.iter().any(|&n| n > 0)
            || !c.current_slots.is_empty()
            || !c.current_whole.is_empty()
            || c.current_fractional_gpus > 0
    });
    // Re-planning: keep everything that runs and add what is missing on top
    // when that change costs no more than the LP's own marginal cost of it
    // plus the gap — nothing moved, nothing reconfigured.
    let within_gap = |counts: &Counts| {
        counts.unplaced.iter().all(|&u| u == 0)
            && counts_cost(classes, models, counts) <= lp_cost * (1.0 + options.mip_rel_gap) + 1e-9
    };
    if has_current
        && let Some(counts) = pinned(classes, models, demand_)
        && counts.unplaced.iter().all(|&u| u == 0)
        && change_is_cheap(classes, models, &counts, lp_cost, options)?
    {
        return Ok(solved(counts, true));
    }
    // The rounded relaxation is already within the requested gap of the LP
    // bound: that proves it good enough, and no MIP is needed (not when
    // re-planning: phase 2 must weigh disruption).
    if let Some(counts) = &warm
        && !has_current
        && within_gap(counts)
    {
        return Ok(solved(counts.clone(), true));
    }

    // Phase 1: cost.
    let mut vars = ProblemVariables::new();
    let v = build_vars(&mut vars, classes, models, demand_, true);
    let objective = cost_expr(&v, classes, models);
    // No MIP start: HiGHS 1.16 can take a start as optimal in its
    // presolved space when it is not (seen on a 5-GPU instance), so the
    // rounded solution is used only as a fallback below.
    let mut problem = configure(
        vars.minimise(objective.clone()).using(highs),
        options,
        start,
    )?;
    for c in all_constraints(&v, classes, models, demand_) {
        problem.add_constraint(c);
    }
    let sol = match problem.solve() {
        Ok(sol) => sol,
        // No integer solution within the time limit: the rounded
        // relaxation stands, reported as not optimal.
        Err(e) => {
            let counts = warm.ok_or_else(|| PackError::Solver(e.to_string()))?;
            return Ok(solved(counts, false));
        }
    };
    // Optimal, or within the requested MIP gap (HiGHS's own stopping rule).
    let optimal = !matches!(sol.status(), SolutionStatus::TimeLimit);
    let best = objective.eval_with(&sol);
    let phase1 = read_counts(&sol, &v);

    if !has_current {
        return Ok(solved(phase1, optimal));
    }

    // Phase 2: same cost, least disruption (no MIP start, as in phase 1).
    let mut vars = ProblemVariables::new();
    let v = build_vars(&mut vars, classes, models, demand_, true);
    let mut reconfigured = Expression::with_capacity(64);
    let mut moved = Expression::with_capacity(64);
    let mut links: Vec<Constraint> = Vec::new();
    let mut current_replicas = 0.0;
    for (c, class) in classes.iter().enumerate() {
        for (p, &cur) in class.current_patterns.iter().enumerate() {
            reconfigured.add_mul(1.0, v.n[c][p]);
            if cur > 0 {
                let keep = kept(&mut vars, &mut links, cur, v.n[c][p]);
                reconfigured.add_mul(-1.0, keep);
            }
        }
        if let Some((f, _)) = v.f[c] {
            reconfigured.add_mul(1.0, f);
            if class.current_fractional_gpus > 0 {
                let keep = kept(&mut vars, &mut links, class.current_fractional_gpus, f);
                reconfigured.add_mul(-1.0, keep);
            }
        }
        for (&m, &cur) in &class.current_fractional {
            current_replicas += f64::from(cur);
            if let Some(&(_, _, var)) = v.y.iter().find(|y| (y.0, y.1) == (c, m)) {
                let stay = kept(&mut vars, &mut links, cur, var);
                moved.add_mul(-1.0, stay);
            }
        }
        // Replicas that stay: in a slot type, or in a tensor-parallel group.
        let slots = class.current_slots.iter().map(|(&(m, t), &cur)| {
            let var =
                v.x.iter()
                    .find(|x| (x.0, x.1, x.2) == (c, m, t))
                    .map(|x| x.3);
            (cur, var)
        });
        let groups = class.current_whole.iter().map(|(&(m, k), &cur)| {
            let var =
                v.w.iter()
                    .find(|w| (w.0, w.1, w.2) == (c, m, k))
                    .map(|w| w.3);
            (cur, var)
        });
        for (cur, var) in slots.chain(groups).collect::<Vec<_>>() {
            current_replicas += f64::from(cur);
            if let Some(var) = var {
                let stay = kept(&mut vars, &mut links, cur, var);
                moved.add_mul(-1.0, stay);
            }
        }
    }
    let mut objective2 = Expression::with_capacity(128);
    objective2.add_mul(current_replicas + 1.0, reconfigured);
    objective2.add_mul(1.0, moved);
    // Solutions within phase 1's optimality tolerance cost the same: a
    // re-plan never trades a cent inside the solver's own gap for moves.
    let slack = (options.mip_rel_gap * best.abs()).max(1e-6 * best.abs().max(1.0));
    let cost_bound = cost_expr(&v, classes, models).leq(best + slack);
    // Disruption is worth a bounded search: at most `PHASE2_NODES` branch
    // and bound nodes (a count, not a clock, so plans stay deterministic);
    // the best found by then stands, and its cost is phase 1's either way.
    let mut problem = configure(vars.minimise(objective2).using(highs), options, start)?
        .set_option("mip_max_nodes", PHASE2_NODES);
    for c in all_constraints(&v, classes, models, demand_) {
        problem.add_constraint(c);
    }
    problem.add_constraint(cost_bound);
    for c in links {
        problem.add_constraint(c);
    }
    // `optimal` is about cost, which phase 2 keeps within the gap whether
    // or not it proves the least disruption.
    let counts = match problem.solve() {
        Ok(sol) => read_counts(&sol, &v),
        // Out of time before a solution: phase 1 stands.
        Err(_) => phase1,
    };
    Ok(solved(counts, optimal))
}

/// Branch-and-bound nodes phase 2 may use.
const PHASE2_NODES: i32 = 500;

fn configure(
    problem: good_lp::solvers::highs::HighsProblem,
    options: &PackOptions,
    start: Instant,
) -> Result<good_lp::solvers::highs::HighsProblem, PackError> {
    let mut problem = problem;
    problem.set_verbose(options.solver_log);
    let left = options
        .time_limit
        .saturating_sub(start.elapsed())
        .as_secs_f64()
        .max(0.05);
    problem
        .set_time_limit(left)
        .set_mip_rel_gap(options.mip_rel_gap as f32)
        .map_err(|e| PackError::Solver(format!("MIP gap {}: {e}", options.mip_rel_gap)))
}
