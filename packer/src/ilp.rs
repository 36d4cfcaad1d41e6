//! The configuration ILP: build, solve (HiGHS through good_lp), read back.
//!
//! Indices: `c` class, `p` pattern of `c`, `t` slot type of `c`, `m` model,
//! `k` tensor-parallel degree, `N` time-slicing replica count.
//!
//! Variables (non-negative integers; continuous for the LP bound):
//! - `n[c,p]` GPUs of class `c` configured as pattern `p`;
//! - `x[c,m,t]` replicas of `m` on slots of type `t` in `c`;
//! - `w[c,m,k]` tensor-parallel groups of `k` whole GPUs for `m` in `c`;
//! - `u[c,N]` nodes of `c` whose device plugin time-slices into `N`;
//! - `s[m]` replicas of `m` left unplaced.
//!
//! Constraints, one function each:
//! - [`capacity`]: `Σp n[c,p] + Σm,k k·w[c,m,k] ≤ healthy GPUs of c`;
//! - [`slots`]: `Σm x[c,m,t] ≤ Σp slots(p,t)·n[c,p]`;
//! - [`demand`]: `Σc,t x[c,m,t] + Σc,k w[c,m,k] + s[m] = D[m]`;
//! - [`timeslice_nodes`]: `Σ_N u[c,N] ≤ nodes(c)`, `n[c,Share N] ≤ G·u[c,N]`
//!   and `Σ k·w[c,m,k] ≤ G·(nodes(c) − Σ_N u[c,N])` (one replica count per
//!   node; no whole GPU on a time-slicing node);
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
    WithInitialSolution, variable,
};
use gpuscale_policies::{Model, Priority};

use crate::classes::{Class, PatternKind, fits_slot, whole_degrees};
use crate::{PackError, PackOptions};

/// The variables of one formulation.
struct Vars {
    n: Vec<Vec<Variable>>,
    x: Vec<(usize, usize, usize, Variable)>,
    w: Vec<(usize, usize, u32, Variable)>,
    u: Vec<(usize, u8, Variable)>,
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
    /// Time-slicing nodes per (class, N).
    pub share_nodes: BTreeMap<(usize, u8), u32>,
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
    /// Solver wall time, ms.
    pub solve_ms: f64,
}

fn penalty(model: &Model, max_price: f64) -> f64 {
    let weight = match model.priority {
        Priority::Critical => 100.0,
        Priority::Standard => 10.0,
        Priority::Sheddable => 1.0,
    };
    // More than every GPU a replica could take (16 GPUs at the highest
    // price), so placing a replica always beats leaving it out.
    weight * (16.0 * max_price + 1.0) * 10.0
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
        for p in &class.patterns {
            if let PatternKind::Share(n) = p.kind {
                let var = vars.add(int(variable().min(0).max(class.nodes.len() as f64)));
                v.u.push((c, n, var));
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
            e.eq(f64::from(d))
        })
        .collect()
}

/// One replica count per node, and no whole GPU on a time-slicing node.
fn timeslice_nodes(v: &Vars, classes: &[Class]) -> Vec<Constraint> {
    let mut out = Vec::new();
    for (c, class) in classes.iter().enumerate() {
        let g = f64::from(class.gpus_per_node);
        let nodes = class.nodes.len() as f64;
        let mut all_u = Expression::with_capacity(8);
        for &(cc, n, u) in &v.u {
            if cc != c {
                continue;
            }
            all_u.add_mul(1.0, u);
            let p = class
                .patterns
                .iter()
                .position(|p| p.kind == PatternKind::Share(n))
                .expect("u exists only for share patterns");
            let mut e = Expression::with_capacity(2);
            e.add_mul(1.0, v.n[c][p]);
            e.add_mul(-g, u);
            out.push(e.leq(0.0));
        }
        let mut whole = Expression::with_capacity(8);
        for &(cc, _, k, var) in &v.w {
            if cc == c {
                whole.add_mul(f64::from(k), var);
            }
        }
        let mut whole_room = whole;
        whole_room.add_mul(g, all_u.clone());
        out.push(whole_room.leq(g * nodes));
        out.push(all_u.leq(nodes));
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

fn cost_expr(v: &Vars, classes: &[Class], models: &[Model]) -> Expression {
    let max_price = classes.iter().map(|c| c.price).fold(0.0, f64::max);
    let mut e = Expression::with_capacity(64);
    for (c, class) in classes.iter().enumerate() {
        e.add_mul(class.price, gpus_expr(v, c));
    }
    for (m, model) in models.iter().enumerate() {
        e.add_mul(penalty(model, max_price), v.s[m]);
    }
    e
}

fn gpu_count_expr(v: &Vars, classes: &[Class], models: &[Model]) -> Expression {
    let mut e = Expression::with_capacity(64);
    for c in 0..classes.len() {
        e.add_mul(1.0, gpus_expr(v, c));
    }
    for (m, model) in models.iter().enumerate() {
        e.add_mul(penalty(model, 1.0), v.s[m]);
    }
    e
}

fn all_constraints(v: &Vars, classes: &[Class], demand_: &[u32]) -> Vec<Constraint> {
    let mut out = capacity(v, classes);
    out.extend(slots(v, classes));
    out.extend(demand(v, demand_));
    out.extend(timeslice_nodes(v, classes));
    out.extend(tensor_parallel_fit(v, classes));
    out
}

fn lp_value(
    classes: &[Class],
    models: &[Model],
    demand_: &[u32],
    objective: fn(&Vars, &[Class], &[Model]) -> Expression,
) -> Result<(f64, f64), PackError> {
    let mut vars = ProblemVariables::new();
    let v = build_vars(&mut vars, classes, models, demand_, false);
    let obj = objective(&v, classes, models);
    let mut problem = vars.minimise(obj).using(highs);
    for c in all_constraints(&v, classes, demand_) {
        problem.add_constraint(c);
    }
    let sol = problem
        .solve()
        .map_err(|e| PackError::Solver(e.to_string()))?;
    let cost: f64 = classes
        .iter()
        .enumerate()
        .map(|(c, class)| class.price * gpus_expr(&v, c).eval_with(&sol))
        .sum();
    let gpus: f64 = (0..classes.len())
        .map(|c| gpus_expr(&v, c).eval_with(&sol))
        .sum();
    Ok((cost, gpus))
}

fn read_counts(sol: &impl Solution, v: &Vars, classes: &[Class], models: usize) -> Counts {
    let int = |var: Variable| sol.value(var).round().max(0.0) as u32;
    let mut counts = Counts {
        patterns: v
            .n
            .iter()
            .map(|ns| ns.iter().map(|&var| int(var)).collect())
            .collect(),
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
    for &(c, n, var) in &v.u {
        let k = int(var);
        if k > 0 {
            counts.share_nodes.insert((c, n), k);
        }
    }
    debug_assert_eq!(counts.unplaced.len(), models);
    let _ = classes;
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
    let (lp_cost, _) = lp_value(classes, models, demand_, cost_expr)?;
    let (_, lp_gpus) = lp_value(classes, models, demand_, gpu_count_expr)?;

    // Phase 1: cost.
    let mut vars = ProblemVariables::new();
    let v = build_vars(&mut vars, classes, models, demand_, true);
    let objective = cost_expr(&v, classes, models);
    let mut problem = configure(
        vars.minimise(objective.clone()).using(highs),
        options,
        start,
    )?;
    for c in all_constraints(&v, classes, demand_) {
        problem.add_constraint(c);
    }
    let sol = problem
        .solve()
        .map_err(|e| PackError::Solver(e.to_string()))?;
    // Optimal, or within the requested MIP gap (HiGHS's own stopping rule).
    let mut optimal = !matches!(sol.status(), SolutionStatus::TimeLimit);
    let best = objective.eval_with(&sol);
    let phase1 = read_counts(&sol, &v, classes, models.len());

    let has_current = classes.iter().any(|c| {
        c.current_patterns.iter().any(|&n| n > 0)
            || !c.current_slots.is_empty()
            || !c.current_whole.is_empty()
    });
    if !has_current {
        return Ok(Solved {
            counts: phase1,
            optimal,
            lp_cost,
            lp_gpus,
            solve_ms: start.elapsed().as_secs_f64() * 1e3,
        });
    }

    // Phase 2: same cost, least disruption; warm-started from phase 1.
    let mut vars = ProblemVariables::new();
    let v = build_vars(&mut vars, classes, models, demand_, true);
    let mut initial: Vec<(Variable, f64)> = Vec::new();
    let mut reconfigured = Expression::with_capacity(64);
    let mut moved = Expression::with_capacity(64);
    let mut links: Vec<Constraint> = Vec::new();
    let mut current_replicas = 0.0;
    for (c, class) in classes.iter().enumerate() {
        for (p, &cur) in class.current_patterns.iter().enumerate() {
            reconfigured.add_mul(1.0, v.n[c][p]);
            initial.push((v.n[c][p], f64::from(phase1.patterns[c][p])));
            if cur > 0 {
                let keep = vars.add(variable().integer().min(0).max(f64::from(cur)));
                reconfigured.add_mul(-1.0, keep);
                let mut e = Expression::with_capacity(2);
                e.add_mul(1.0, keep);
                e.add_mul(-1.0, v.n[c][p]);
                links.push(e.leq(0.0));
                initial.push((keep, f64::from(cur.min(phase1.patterns[c][p]))));
            }
        }
        for (&(m, t), &cur) in &class.current_slots {
            current_replicas += f64::from(cur);
            moved.add_mul(f64::from(cur), Expression::from_other_affine(1.0));
            if let Some(&(_, _, _, x)) =
                v.x.iter()
                    .find(|&&(cc, mm, tt, _)| (cc, mm, tt) == (c, m, t))
            {
                let stay = vars.add(variable().integer().min(0).max(f64::from(cur)));
                moved.add_mul(-1.0, stay);
                let mut e = Expression::with_capacity(2);
                e.add_mul(1.0, stay);
                e.add_mul(-1.0, x);
                links.push(e.leq(0.0));
                let got = phase1.slots.get(&(c, m, t)).copied().unwrap_or(0);
                initial.push((stay, f64::from(cur.min(got))));
            }
        }
        for (&(m, k), &cur) in &class.current_whole {
            current_replicas += f64::from(cur);
            moved.add_mul(f64::from(cur), Expression::from_other_affine(1.0));
            if let Some(&(_, _, _, w)) =
                v.w.iter()
                    .find(|&&(cc, mm, kk, _)| (cc, mm, kk) == (c, m, k))
            {
                let stay = vars.add(variable().integer().min(0).max(f64::from(cur)));
                moved.add_mul(-1.0, stay);
                let mut e = Expression::with_capacity(2);
                e.add_mul(1.0, stay);
                e.add_mul(-1.0, w);
                links.push(e.leq(0.0));
                let got = phase1.whole.get(&(c, m, k)).copied().unwrap_or(0);
                initial.push((stay, f64::from(cur.min(got))));
            }
        }
    }
    for &(c, m, t, var) in &v.x {
        initial.push((
            var,
            f64::from(phase1.slots.get(&(c, m, t)).copied().unwrap_or(0)),
        ));
    }
    for &(c, m, k, var) in &v.w {
        initial.push((
            var,
            f64::from(phase1.whole.get(&(c, m, k)).copied().unwrap_or(0)),
        ));
    }
    for &(c, n, var) in &v.u {
        initial.push((
            var,
            f64::from(phase1.share_nodes.get(&(c, n)).copied().unwrap_or(0)),
        ));
    }
    for (m, &var) in v.s.iter().enumerate() {
        initial.push((var, f64::from(phase1.unplaced[m])));
    }
    let mut objective2 = Expression::with_capacity(128);
    objective2.add_mul(current_replicas + 1.0, reconfigured);
    objective2.add_mul(1.0, moved);
    // Solutions within phase 1's optimality tolerance cost the same: a
    // re-plan never trades a cent inside the solver's own gap for moves.
    let slack = (options.mip_rel_gap * best.abs()).max(1e-6 * best.abs().max(1.0));
    let cost_bound = cost_expr(&v, classes, models).leq(best + slack);
    let mut problem = configure(
        vars.minimise(objective2)
            .using(highs)
            .with_initial_solution(initial),
        options,
        start,
    )?;
    for c in all_constraints(&v, classes, demand_) {
        problem.add_constraint(c);
    }
    problem.add_constraint(cost_bound);
    for c in links {
        problem.add_constraint(c);
    }
    let counts = match problem.solve() {
        Ok(sol) => {
            optimal &= !matches!(sol.status(), SolutionStatus::TimeLimit);
            read_counts(&sol, &v, classes, models.len())
        }
        // Out of time before improving on phase 1: phase 1 stands.
        Err(_) => {
            optimal = false;
            phase1
        }
    };
    Ok(Solved {
        counts,
        optimal,
        lp_cost,
        lp_gpus,
        solve_ms: start.elapsed().as_secs_f64() * 1e3,
    })
}

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
