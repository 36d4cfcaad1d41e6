//! Fractional GPUs by column generation (Gilmore and Gomory).
//!
//! On a HAMi node any mix of replicas shares a GPU while their `gpumem`
//! and `gpucores` fit it, so a fractional pattern is a mix: how many shares
//! of each model one GPU holds. Mixes of 40 models of many sizes are far
//! too many to list, and counting fractional capacity in aggregate (the
//! first design) is a relaxation that packing then misses by 2–11 %. So
//! the patterns are generated:
//!
//! 1. Start from one pattern per model (as many of its shares as one GPU
//!    holds) and the mixes running now.
//! 2. Solve the LP relaxation over the patterns at hand. Its duals price
//!    a share of each model (`−dual` of its slot row) and a GPU of each
//!    class (its price less the duals of the class's capacity and HAMi
//!    rows).
//! 3. Pricing, per class: the mix of greatest dual value that fits one
//!    GPU, a two-dimensional bounded knapsack (MiB and SM percent) solved
//!    exactly by branch and bound ([`best_mixes`]). A mix worth more than
//!    its GPU (negative reduced cost) joins the patterns; back to 2.
//! 4. When no mix is worth more, the LP over the patterns is the LP over
//!    all mixes: its value is the bound. When the budget runs out first,
//!    the bound is Lagrangian: `LP + Σc GPUs(c) · min(0, reduced cost)`,
//!    still valid.
//!
//! The integer solve then uses the generated patterns (price and branch:
//! not a proof of optimality, but its gap is measured against the bound of
//! step 4, which is). Small instances, where every maximal mix can be
//! listed ([`ENUMERATE_UP_TO`]), get all of them instead, so the integer
//! solve is exact there. Both are done for the two objectives: cost, and
//! GPU count (its own bound).
//!
//! Rule kept by pricing and by [`Class::fractional_fits`]: at most one
//! share of a tensor-parallel replica per GPU, so a node's shares of each
//! group can always be grouped.

use std::collections::BTreeSet;
use std::time::Instant;

use good_lp::solvers::highs::highs;
use good_lp::{DualValues, Solution};
use good_lp::{ProblemVariables, SolutionWithDual, SolverModel};
use gpuscale_policies::Model;

use super::{GpuPrice, Start, all_constraints, build_vars, by_count, by_price, objective_expr};
use crate::classes::{Class, SlotKind};
use crate::{PackError, PackOptions};

/// Proven lower bounds of the LP over every fractional mix, when the
/// patterns were generated (`None`: listed in full or not needed, so the
/// LP over the classes' patterns is the bound).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Bounds {
    /// Cost per hour.
    pub cost: Option<f64>,
    /// GPUs.
    pub gpus: Option<f64>,
    /// LP solves spent on pricing.
    pub rounds: u32,
    /// Patterns generated (beyond the starting ones).
    pub generated: u32,
}

/// Most maximal mixes per class listed in full; above, generated.
pub const ENUMERATE_UP_TO: usize = 400;

/// Most pricing rounds per objective.
const MAX_ROUNDS: u32 = 200;

/// Mixes added per class and round (the most valuable first): more per
/// round means fewer LP solves.
const COLUMNS_PER_ROUND: usize = 12;

/// Generation stops once the bound is this close (relative) to the LP
/// over the patterns at hand.
const CLOSE_ENOUGH: f64 = 1e-3;

/// Branch-and-bound nodes per pricing knapsack (past it the root's bound
/// stands in for the bound).
const KNAPSACK_NODES: u64 = 200_000;

/// Nodes per knapsack in the rounds that only look for good mixes; a
/// round that finds none prices again with [`KNAPSACK_NODES`].
const QUICK_NODES: u64 = 1_500;

/// Models forced into a mix per pricing (the most valuable per share).
const FORCED: usize = 6;

/// One model's share as a knapsack item.
#[derive(Debug, Clone, Copy)]
struct Item {
    t: usize,
    value: f64,
    mib: u32,
    pct: u32,
    bound: u32,
    tensor_parallel: bool,
}

/// The fractional slot types of a class some demanded model uses, as
/// knapsack items of value 0.
fn items_of(class: &Class, models: &[Model], demand: &[u32]) -> Vec<Item> {
    let Some(cap) = class.fractional else {
        return Vec::new();
    };
    class
        .slot_types
        .iter()
        .enumerate()
        .filter_map(|(t, st)| {
            let SlotKind::Fractional(name) = &st.kind else {
                return None;
            };
            let m = models.iter().position(|m| &m.name == name)?;
            let (mib, pct) = st.need?;
            if demand[m] == 0 || mib == 0 || pct == 0 {
                return None;
            }
            let fit = (cap.memory_mib / mib).min(cap.cores / pct);
            let tensor_parallel = st.parts > 1;
            let bound = if tensor_parallel {
                1
            } else {
                fit.min(demand[m]).min(cap.shares)
            };
            (bound > 0).then_some(Item {
                t,
                value: 0.0,
                mib,
                pct,
                bound,
                tensor_parallel,
            })
        })
        .collect()
}

/// Adds fractional patterns to the classes: all maximal mixes where they
/// are few, else the starting ones and those column generation prices
/// in, for the cost and for the GPU-count objective.
pub fn generate(
    classes: &mut [Class],
    models: &[Model],
    demand: &[u32],
    options: &PackOptions,
    start: Instant,
) -> Result<Bounds, PackError> {
    let mut generate = Vec::new();
    for (c, class) in classes.iter_mut().enumerate() {
        let items = items_of(class, models, demand);
        if items.is_empty() {
            continue;
        }
        let cap = class.fractional.expect("items only where fractional");
        match all_mixes(
            &items,
            cap.memory_mib,
            cap.cores,
            cap.shares,
            ENUMERATE_UP_TO,
        ) {
            Some(mixes) => {
                for mix in mixes {
                    class.add_fractional_pattern(mix);
                }
            }
            None => {
                for item in &items {
                    class.add_fractional_pattern(vec![(item.t, item.bound)]);
                }
                generate.push(c);
            }
        }
    }
    let mut bounds = Bounds::default();
    if generate.is_empty() {
        return Ok(bounds);
    }
    // A quarter of the time limit at most: the integer solve needs the rest.
    let budget = options.time_limit.mul_f64(0.25);
    let deadline = start + budget.saturating_sub(start.elapsed()).max(budget / 4);
    let before: usize = classes.iter().map(|c| c.patterns.len()).sum();
    let starting: Vec<usize> = classes.iter().map(|c| c.patterns.len()).collect();
    let mut used = BTreeSet::new();
    // Each LP starts from the last one's solution (its basis), the GPU
    // count's first from the cost's last: only the new patterns have to
    // price in, not the whole LP again.
    let mut warm = None;
    bounds.cost = price_in(
        classes,
        models,
        demand,
        &generate,
        by_price,
        deadline,
        &mut bounds,
        &mut used,
        &mut warm,
    )?;
    bounds.gpus = price_in(
        classes,
        models,
        demand,
        &generate,
        by_count,
        deadline,
        &mut bounds,
        &mut used,
        &mut warm,
    )?;
    let after: usize = classes.iter().map(|c| c.patterns.len()).sum();
    bounds.generated = (after - before) as u32;
    // The integer solve gets the starting patterns and the generated ones
    // either final LP uses (or that priced in last): a MIP over every
    // column ever generated is many times slower and rarely better.
    for (c, class) in classes.iter_mut().enumerate() {
        let keep: Vec<bool> = (0..class.patterns.len())
            .map(|p| p < starting[c] || used.contains(&(c, p)))
            .collect();
        let mut at = 0;
        class.patterns.retain(|_| {
            at += 1;
            keep[at - 1]
        });
        let mut at = 0;
        class.current_patterns.retain(|_| {
            at += 1;
            keep[at - 1]
        });
    }
    Ok(bounds)
}

/// Column generation for one objective over the classes `generate`;
/// the proven bound on its GPU part (price × GPUs, without penalties).
#[allow(clippy::too_many_arguments)]
fn price_in(
    classes: &mut [Class],
    models: &[Model],
    demand: &[u32],
    generate: &[usize],
    price: GpuPrice,
    deadline: Instant,
    bounds: &mut Bounds,
    used: &mut BTreeSet<(usize, usize)>,
    warm: &mut Option<Start>,
) -> Result<Option<f64>, PackError> {
    let mut best_bound = f64::NEG_INFINITY;
    let mut penalties = 0.0;
    for round in 0..MAX_ROUNDS {
        bounds.rounds += 1;
        let mut vars = ProblemVariables::new();
        let v = build_vars(&mut vars, classes, models, demand, false);
        let objective = objective_expr(&v, classes, models, price);
        let built = all_constraints(&v, classes, demand);
        let mut problem = vars.minimise(objective.clone()).using(highs);
        if let Some(warm) = warm.as_ref() {
            problem = warm.apply(problem, &v);
        }
        let refs: Vec<_> = built
            .constraints
            .into_iter()
            .map(|c| problem.add_constraint(c))
            .collect();
        let mut sol = problem
            .solve()
            .map_err(|e| PackError::Solver(e.to_string()))?;
        let value = objective.eval_with(&sol);
        *warm = Some(Start::read(&sol, &v));
        // The penalty part (replicas the LP leaves out) is not GPUs.
        let gpus_part: f64 = (0..classes.len())
            .map(|c| price(&classes[c]) * super::gpus_expr(&v, c).eval_with(&sol))
            .sum();
        penalties = (value - gpus_part).max(0.0);
        let in_use: Vec<(usize, usize)> = generate
            .iter()
            .flat_map(|&c| (0..v.n[c].len()).map(move |p| (c, p)))
            .filter(|&(c, p)| sol.value(v.n[c][p]) > 1e-9)
            .collect();
        let duals = sol.compute_dual();
        // Lagrangian: value + Σc (most GPUs c's mixes could take) · min(0,
        // reduced cost). Farley: every cost is ≥ 0, so the duals scaled by
        // 1/θ, θ = max(1, max over mixes of their dual value ÷ price), are
        // feasible for every column, and value/θ is a bound.
        // Quick pricing first; where it finds nothing, exact pricing (so
        // the bound below is the exact one).
        let (mut lagrangian, mut theta, mut fresh_any) = (0.0, 1.0f64, false);
        let mut last = Vec::new();
        for nodes in [QUICK_NODES, KNAPSACK_NODES] {
            (lagrangian, theta) = (0.0, 1.0f64);
            // Each class's knapsack, from this LP's duals: read here, then
            // solved on every core (the knapsacks are independent), then
            // their mixes added in class order, so the result does not
            // depend on the cores.
            let knapsacks: Vec<Pricing> = generate
                .iter()
                .map(|&c| {
                    let class = &classes[c];
                    let mut items = items_of(class, models, demand);
                    let most: u32 = items.iter().map(|i| i.bound.max(1)).sum::<u32>();
                    for item in &mut items {
                        item.value = built
                            .slots
                            .get(&(c, item.t))
                            .map_or(0.0, |&row| (-duals.dual(refs[row].clone())).max(0.0));
                    }
                    items.retain(|i| i.value > 1e-12);
                    let gpu_dual = duals.dual(refs[built.capacity[c]].clone())
                        + built
                            .hami
                            .get(&c)
                            .map_or(0.0, |&row| duals.dual(refs[row].clone()));
                    Pricing {
                        c,
                        items,
                        most,
                        worth: price(class) - gpu_dual,
                        cap: class.fractional.expect("generated only where fractional"),
                    }
                })
                .collect();
            let priced = super::cores::map(&knapsacks, |k| {
                best_mixes(&k.items, k.cap.memory_mib, k.cap.cores, k.cap.shares, nodes)
            });
            for (k, (upper, mixes)) in knapsacks.iter().zip(priced) {
                let (c, worth) = (k.c, k.worth);
                let class = &classes[c];
                let reduced = worth - upper;
                // A class's fractional GPUs hold at least one share each.
                let gpus = class
                    .healthy_gpus()
                    .min(demand_parts(class, models, demand).max(k.most));
                lagrangian += f64::from(gpus) * reduced.min(0.0);
                if price(class) > 0.0 {
                    theta = theta.max(1.0 - reduced / price(class));
                }
                let tolerance = 1e-9 * worth.abs().max(1.0);
                let mut fresh: Vec<(f64, Vec<(usize, u32)>)> = mixes
                    .into_iter()
                    .filter(|(v, mix)| {
                        worth - v < -tolerance && class.fractional_pattern(mix).is_none()
                    })
                    .collect();
                fresh.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                fresh.dedup_by(|a, b| a.1 == b.1);
                fresh.truncate(COLUMNS_PER_ROUND);
                let class = &mut classes[c];
                for (_, mix) in fresh {
                    let p = class.add_fractional_pattern(mix);
                    last.push((c, p));
                    fresh_any = true;
                }
            }
            if fresh_any {
                break;
            }
        }
        best_bound = best_bound.max((value + lagrangian).max(value / theta));
        if !fresh_any {
            // Nothing prices in: the LP over these patterns is the LP over
            // all of them (where every knapsack was solved to the end, the
            // bound is that LP's value).
            used.extend(in_use);
            return Ok(Some((best_bound - penalties).max(0.0).min(gpus_part)));
        }
        // Close enough: the bound is within a tenth of a per cent of the LP
        // at hand, so the rest of the tail would move neither by more.
        if round + 1 == MAX_ROUNDS
            || value - best_bound <= CLOSE_ENOUGH * best_bound.abs()
            || Instant::now() >= deadline
        {
            // What this LP uses, and what priced in after it.
            used.extend(in_use);
            used.extend(last);
            break;
        }
    }
    Ok(Some((best_bound - penalties).max(0.0)))
}

/// One class's pricing problem in a round.
struct Pricing {
    c: usize,
    /// Its demanded models' shares, valued at their duals.
    items: Vec<Item>,
    /// Shares its mixes could hold at most, summed over the items.
    most: u32,
    /// What a GPU of the class is worth: its price less its rows' duals.
    worth: f64,
    cap: crate::classes::Fractional,
}

/// Shares a class's demanded models could put on its fractional GPUs.
fn demand_parts(class: &Class, models: &[Model], demand: &[u32]) -> u32 {
    class
        .slot_types
        .iter()
        .filter_map(|st| match &st.kind {
            SlotKind::Fractional(name) => models
                .iter()
                .position(|m| &m.name == name)
                .map(|m| demand[m] * st.parts),
            _ => None,
        })
        .sum()
}

/// The mixes of greatest value that fit one GPU of `cap_mib` MiB and
/// `cap_pct` SM percent, with at most one tensor-parallel share: for each
/// choice of that share (none, or one of them) the best completion, by
/// branch and bound. Returns an upper bound on the best value (the best
/// itself unless a search hit its node limit) and the mixes found, best
/// first, as sorted (slot type, count) lists.
fn best_mixes(
    items: &[Item],
    cap_mib: u32,
    cap_pct: u32,
    cap_shares: u32,
    nodes: u64,
) -> (f64, Vec<(f64, Mix)>) {
    let singles: Vec<Item> = items
        .iter()
        .copied()
        .filter(|i| !i.tensor_parallel)
        .collect();
    let mut choices: Vec<Option<Item>> = vec![None];
    choices.extend(
        items
            .iter()
            .filter(|i| i.tensor_parallel && i.mib <= cap_mib && i.pct <= cap_pct)
            .map(|&i| Some(i)),
    );
    let mut upper = 0.0f64;
    let mut out = Vec::new();
    // More columns per round: the best mix holding at least one share of
    // each of the most valuable models (no tensor-parallel share), beside
    // the best overall.
    let mut valuable: Vec<usize> = (0..singles.len())
        .filter(|&i| singles[i].mib <= cap_mib && singles[i].pct <= cap_pct)
        .collect();
    let share = |i: &Item| {
        (f64::from(i.mib) / f64::from(cap_mib.max(1)))
            .max(f64::from(i.pct) / f64::from(cap_pct.max(1)))
    };
    valuable.sort_by(|&a, &b| {
        (singles[b].value / share(&singles[b]))
            .total_cmp(&(singles[a].value / share(&singles[a])))
            .then(a.cmp(&b))
    });
    valuable.truncate(FORCED);
    for at in valuable {
        let forced = singles[at];
        let mut rest = singles.clone();
        rest[at].bound -= 1;
        let search = Knapsack::new(
            &rest,
            cap_mib - forced.mib,
            cap_pct - forced.pct,
            cap_shares.saturating_sub(1),
        );
        let (value, counts, _) = search.solve(nodes);
        let mut mix: Vec<(usize, u32)> = rest
            .iter()
            .zip(&counts)
            .map(|(i, &n)| (i.t, n + u32::from(i.t == forced.t)))
            .filter(|&(_, n)| n > 0)
            .collect();
        mix.sort_unstable();
        out.push((forced.value + value, mix));
    }
    for choice in choices {
        let (mib, pct, base) = choice.map_or((cap_mib, cap_pct, 0.0), |i| {
            (cap_mib - i.mib, cap_pct - i.pct, i.value)
        });
        let shares = cap_shares.saturating_sub(u32::from(choice.is_some()));
        let search = Knapsack::new(&singles, mib, pct, shares);
        let (value, counts, bound) = search.solve(nodes);
        upper = upper.max(base + bound);
        let mut mix: Vec<(usize, u32)> = singles
            .iter()
            .zip(&counts)
            .filter(|&(_, &n)| n > 0)
            .map(|(i, &n)| (i.t, n))
            .collect();
        if let Some(i) = choice {
            mix.push((i.t, 1));
        }
        mix.sort_unstable();
        if !mix.is_empty() {
            out.push((base + value, mix));
        }
    }
    out.sort_by(|a, b| b.0.total_cmp(&a.0));
    (upper, out)
}

/// A bounded two-dimensional knapsack, exact by depth-first branch and
/// bound. The bound at each node is a surrogate relaxation: the two
/// capacities combined with weights `α` and `1 − α` into one, and the
/// one-dimensional fractional knapsack over the items left (valid for any
/// `α`). Three weightings are kept: memory alone, SMs alone, and the `α`
/// that makes the root's bound smallest (which is the LP bound of the
/// two-dimensional knapsack, found by ternary search on a convex function).
struct Knapsack<'a> {
    /// (index among the caller's items, the item), in search order.
    items: Vec<(usize, &'a Item)>,
    given: usize,
    /// Per weighting: `α`, and the items (search positions, with their
    /// combined size) by value per combined size.
    surrogates: Vec<(f64, Vec<(usize, f64)>)>,
    cap_mib: u32,
    cap_pct: u32,
    /// Items it may hold (HAMi's containers per GPU).
    cap_shares: u32,
    /// Search positions by value, highest first (the count bound).
    by_value: Vec<usize>,
}

impl<'a> Knapsack<'a> {
    fn new(items: &'a [Item], cap_mib: u32, cap_pct: u32, cap_shares: u32) -> Self {
        let mut order: Vec<(usize, &Item)> = items
            .iter()
            .enumerate()
            .filter(|(_, i)| {
                i.mib > 0 && i.pct > 0 && i.mib <= cap_mib && i.pct <= cap_pct && i.bound > 0
            })
            .collect();
        let mut k = Knapsack {
            items: Vec::new(),
            given: items.len(),
            surrogates: Vec::new(),
            cap_mib: cap_mib.max(1),
            cap_pct: cap_pct.max(1),
            cap_shares,
            by_value: Vec::new(),
        };
        // Search order: value per combined size at the root's best `α`.
        let alpha = k.best_alpha(&order);
        order.sort_by(|a, b| {
            (b.1.value / k.size(b.1, alpha))
                .total_cmp(&(a.1.value / k.size(a.1, alpha)))
                .then(a.0.cmp(&b.0))
        });
        k.items = order;
        for a in [alpha, 0.0, 1.0] {
            let mut o: Vec<usize> = (0..k.items.len()).collect();
            o.sort_by(|&x, &y| {
                let (ix, iy) = (k.items[x].1, k.items[y].1);
                (iy.value / k.size(iy, a)).total_cmp(&(ix.value / k.size(ix, a)))
            });
            let sized = o
                .into_iter()
                .map(|j| (j, k.size(k.items[j].1, a)))
                .collect();
            k.surrogates.push((a, sized));
        }
        let mut by_value: Vec<usize> = (0..k.items.len()).collect();
        by_value.sort_by(|&x, &y| k.items[y].1.value.total_cmp(&k.items[x].1.value));
        k.by_value = by_value;
        k
    }

    /// An item's size in the surrogate constraint of weight `a` (the GPU
    /// is 1).
    fn size(&self, i: &Item, a: f64) -> f64 {
        a * f64::from(i.mib) / f64::from(self.cap_mib)
            + (1.0 - a) * f64::from(i.pct) / f64::from(self.cap_pct)
    }

    /// The fractional knapsack over `items` in the surrogate of weight `a`
    /// with room `room`.
    fn surrogate(&self, items: &[(usize, &Item)], a: f64, room: f64) -> f64 {
        // (size, value per size) computed once per item, not per comparison.
        let mut sorted: Vec<(f64, f64, &Item)> = items
            .iter()
            .map(|&(_, i)| {
                let size = self.size(i, a);
                (size, i.value / size, i)
            })
            .collect();
        sorted.sort_by(|x, y| y.1.total_cmp(&x.1));
        let mut room = room;
        let mut total = 0.0;
        for (size, _, i) in sorted {
            let take = (f64::from(i.bound) * size).min(room);
            total += take / size * i.value;
            room -= take;
            if room <= 0.0 {
                break;
            }
        }
        total
    }

    /// The weight whose surrogate bound at the root is smallest.
    fn best_alpha(&self, items: &[(usize, &Item)]) -> f64 {
        let f = |a: f64| self.surrogate(items, a, 1.0);
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        for _ in 0..40 {
            let (m1, m2) = (lo + (hi - lo) / 3.0, hi - (hi - lo) / 3.0);
            if f(m1) <= f(m2) {
                hi = m2;
            } else {
                lo = m1;
            }
        }
        (lo + hi) / 2.0
    }

    /// (best value, counts parallel to the items given to [`Knapsack::new`],
    /// an upper bound on the best value).
    fn solve(&self, limit: u64) -> (f64, Vec<u32>, f64) {
        let n = self.items.len();
        let mut state = Search {
            counts: vec![0; n],
            best: 0.0,
            best_counts: vec![0; n],
            nodes: 0,
            limit,
        };
        let root = self.upper(0, self.cap_mib, self.cap_pct, self.cap_shares, |_| false);
        self.dfs(
            0,
            self.cap_mib,
            self.cap_pct,
            self.cap_shares,
            0.0,
            &mut state,
        );
        let complete = state.nodes < limit;
        let mut counts = vec![0; self.given];
        for (&(at, _), &k) in self.items.iter().zip(&state.best_counts) {
            counts[at] = k;
        }
        (state.best, counts, if complete { state.best } else { root })
    }

    fn dfs(&self, i: usize, mib: u32, pct: u32, shares: u32, value: f64, s: &mut Search) {
        s.nodes += 1;
        if value > s.best + 1e-12 {
            s.best = value;
            s.best_counts.clone_from(&s.counts);
        }
        if i == self.items.len() || s.nodes >= s.limit {
            return;
        }
        let prune = |upper: f64| value + upper <= s.best + 1e-12;
        if prune(self.upper(i, mib, pct, shares, prune)) {
            return;
        }
        let item = self.items[i].1;
        let most = item
            .bound
            .min(mib / item.mib)
            .min(pct / item.pct)
            .min(shares);
        for k in (0..=most).rev() {
            s.counts[i] = k;
            self.dfs(
                i + 1,
                mib - k * item.mib,
                pct - k * item.pct,
                shares - k,
                value + f64::from(k) * item.value,
                s,
            );
        }
        s.counts[i] = 0;
    }

    /// The smallest of the surrogate bounds over items `i..` (search
    /// positions) with `mib` and `pct` left, and of the count bound: the
    /// `shares` most valuable items that still fit. Returns as soon as one
    /// of them is small enough to `prune` (the node is cut whichever is
    /// the smallest), so a pruned node seldom computes them all.
    fn upper(&self, i: usize, mib: u32, pct: u32, shares: u32, prune: impl Fn(f64) -> bool) -> f64 {
        let mut best = f64::INFINITY;
        for (a, order) in &self.surrogates {
            let mut room = a * f64::from(mib) / f64::from(self.cap_mib)
                + (1.0 - a) * f64::from(pct) / f64::from(self.cap_pct);
            let mut total = 0.0;
            for &(j, size) in order {
                if j < i {
                    continue;
                }
                let item = self.items[j].1;
                // An item that no longer fits either capacity adds nothing.
                if item.mib > mib || item.pct > pct {
                    continue;
                }
                let take = (f64::from(item.bound) * size).min(room);
                total += take / size * item.value;
                room -= take;
                if room <= 0.0 {
                    break;
                }
            }
            best = best.min(total);
            if prune(best) {
                return best;
            }
        }
        let mut left = shares;
        let mut count = 0.0;
        for &j in &self.by_value {
            if left == 0 {
                break;
            }
            let item = self.items[j].1;
            if item.value <= 0.0 {
                break;
            }
            if j < i || item.mib > mib || item.pct > pct {
                continue;
            }
            let take = item.bound.min(left);
            count += f64::from(take) * item.value;
            left -= take;
        }
        best.min(count)
    }
}

struct Search {
    counts: Vec<u32>,
    best: f64,
    best_counts: Vec<u32>,
    nodes: u64,
    limit: u64,
}

/// A mix: (slot type, count), sorted by slot type.
type Mix = Vec<(usize, u32)>;

/// Every maximal mix (no further share fits), when there are at most
/// `limit` of them.
fn all_mixes(
    items: &[Item],
    cap_mib: u32,
    cap_pct: u32,
    cap_shares: u32,
    limit: usize,
) -> Option<Vec<Mix>> {
    struct Walk<'a> {
        items: &'a [Item],
        mix: Mix,
        out: Vec<Mix>,
        limit: usize,
    }
    impl Walk<'_> {
        /// Mixes from item `i` on with `mib` and `pct` left; false once
        /// past the limit.
        fn walk(
            &mut self,
            i: usize,
            mib: u32,
            pct: u32,
            shares: u32,
            tensor_parallel: bool,
        ) -> bool {
            if i == self.items.len() {
                let room = shares > 0
                    && self.items.iter().any(|it| {
                        let have = self
                            .mix
                            .iter()
                            .find(|&&(t, _)| t == it.t)
                            .map_or(0, |&(_, k)| k);
                        have < it.bound
                            && it.mib <= mib
                            && it.pct <= pct
                            && !(it.tensor_parallel && tensor_parallel)
                    });
                if !room && !self.mix.is_empty() {
                    let mut sorted = self.mix.clone();
                    sorted.sort_unstable();
                    self.out.push(sorted);
                }
                return self.out.len() <= self.limit;
            }
            let it = self.items[i];
            let mut most = it.bound.min(mib / it.mib).min(pct / it.pct).min(shares);
            if it.tensor_parallel && tensor_parallel {
                most = 0;
            }
            for k in (0..=most).rev() {
                if k > 0 {
                    self.mix.push((it.t, k));
                }
                let ok = self.walk(
                    i + 1,
                    mib - k * it.mib,
                    pct - k * it.pct,
                    shares - k,
                    tensor_parallel || (it.tensor_parallel && k > 0),
                );
                if k > 0 {
                    self.mix.pop();
                }
                if !ok {
                    return false;
                }
            }
            true
        }
    }
    let mut w = Walk {
        items,
        mix: Vec::new(),
        out: Vec::new(),
        limit,
    };
    w.walk(0, cap_mib, cap_pct, cap_shares, false)
        .then_some(w.out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(t: usize, value: f64, mib: u32, pct: u32, bound: u32) -> Item {
        Item {
            t,
            value,
            mib,
            pct,
            bound,
            tensor_parallel: false,
        }
    }

    /// Brute force over every count vector of at most `shares` items.
    fn brute(items: &[Item], mib: u32, pct: u32, shares: u32) -> f64 {
        fn go(items: &[Item], i: usize, mib: u32, pct: u32, shares: u32) -> f64 {
            if i == items.len() {
                return 0.0;
            }
            let it = items[i];
            let most = it.bound.min(mib / it.mib).min(pct / it.pct).min(shares);
            (0..=most)
                .map(|k| {
                    f64::from(k) * it.value
                        + go(items, i + 1, mib - k * it.mib, pct - k * it.pct, shares - k)
                })
                .fold(0.0, f64::max)
        }
        go(items, 0, mib, pct, shares)
    }

    #[test]
    fn knapsack_matches_brute_force() {
        let mut seed = 7u64;
        let mut next = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..300 {
            let n = 1 + next(6) as usize;
            let items: Vec<Item> = (0..n)
                .map(|t| {
                    item(
                        t,
                        (1 + next(50)) as f64 / 7.0,
                        1 + next(60) as u32,
                        1 + next(60) as u32,
                        1 + next(5) as u32,
                    )
                })
                .collect();
            let (mib, pct) = (50 + next(100) as u32, 50 + next(100) as u32);
            // HAMi's containers per GPU: often binding, sometimes not.
            let shares = 1 + next(12) as u32;
            let (value, counts, bound) =
                Knapsack::new(&items, mib, pct, shares).solve(KNAPSACK_NODES);
            assert!((value - brute(&items, mib, pct, shares)).abs() < 1e-9);
            assert!((bound - value).abs() < 1e-9);
            assert!(counts.iter().sum::<u32>() <= shares);
            let used: (u32, u32) = items
                .iter()
                .zip(&counts)
                .fold((0, 0), |(a, b), (i, &k)| (a + k * i.mib, b + k * i.pct));
            assert!(used.0 <= mib && used.1 <= pct);
            let got: f64 = items
                .iter()
                .zip(&counts)
                .map(|(i, &k)| f64::from(k) * i.value)
                .sum();
            assert!((got - value).abs() < 1e-9);
        }
    }

    #[test]
    fn mixes_hold_one_tensor_parallel_share_at_most() {
        let mut a = item(0, 5.0, 60, 20, 1);
        a.tensor_parallel = true;
        let mut b = item(1, 5.0, 10, 60, 1);
        b.tensor_parallel = true;
        let c = item(2, 1.0, 10, 10, 4);
        let (best, mixes) = best_mixes(&[a, b, c], 100, 100, 10, KNAPSACK_NODES);
        // a and b fit together by size (worth 10 with one c), but not by
        // the rule: either of them with four c is best.
        assert!((best - 9.0).abs() < 1e-9, "{best}");
        assert!(
            mixes
                .iter()
                .all(|(_, m)| m.iter().filter(|(t, _)| *t < 2).count() <= 1)
        );
        let all = all_mixes(&[a, b, c], 100, 100, 10, 100).unwrap();
        assert!(
            all.iter()
                .all(|m| m.iter().filter(|(t, _)| *t < 2).count() <= 1)
        );
        assert!(all.contains(&vec![(0, 1), (2, 4)]), "{all:?}");
        assert!(all.contains(&vec![(1, 1), (2, 4)]), "{all:?}");
    }

    #[test]
    fn listing_stops_past_its_limit() {
        let items: Vec<Item> = (0..8).map(|t| item(t, 1.0, 7, 3, 10)).collect();
        assert!(all_mixes(&items, 100, 100, 10, 10).is_none());
        let few = all_mixes(&items[..2], 21, 100, 10, 10).unwrap();
        assert_eq!(few.len(), 4, "{few:?}");
    }

    /// HAMi serves at most `deviceSplitCount` containers per GPU (default
    /// 10): twenty tiny shares that fit by memory and SMs make mixes of
    /// ten, priced and listed alike, and a mix is maximal once it holds
    /// ten.
    #[test]
    fn a_mix_holds_at_most_the_gpus_share_count() {
        let items: Vec<Item> = (0..4).map(|t| item(t, 1.0 + t as f64, 2, 2, 5)).collect();
        let (best, mixes) = best_mixes(&items, 100, 100, 10, KNAPSACK_NODES);
        // The ten most valuable: five of 4.0 and five of 3.0.
        assert!((best - 35.0).abs() < 1e-9, "{best}");
        assert!(
            mixes
                .iter()
                .all(|(_, m)| m.iter().map(|&(_, k)| k).sum::<u32>() <= 10)
        );
        let all = all_mixes(&items, 100, 100, 10, 1000).unwrap();
        assert!(
            all.iter()
                .all(|m| m.iter().map(|&(_, k)| k).sum::<u32>() == 10),
            "{all:?}"
        );
    }
}
