//! Integer solutions without branch and bound: the LP relaxation rounded
//! and completed greedily ([`round`]), and the current placement trimmed or
//! extended to the demand ([`pinned`]). Both keep the node-level rules;
//! [`super::solve`] uses them as shortcuts and fallbacks.
//!
//! Slots are counted in *parts*: a tensor-parallel replica on fractional
//! shares takes one slot on each of `k` GPUs ([`SlotType::parts`]), every
//! other replica one slot.

use std::collections::BTreeMap;

use gpuscale_policies::Model;

use super::{Counts, Relaxed, max_group, penalty};
use crate::classes::{Class, NodeConfig, PatternKind, SlotType, fits_slot, whole_degrees};

/// Spare slots per (class, slot type), in parts.
type Spare = BTreeMap<(usize, usize), i64>;

fn parts(t: &SlotType) -> i64 {
    i64::from(t.parts.max(1))
}

/// GPUs in use per class.
pub(super) fn used_gpus(classes: &[Class], counts: &Counts) -> Vec<u32> {
    (0..classes.len())
        .map(|c| {
            counts.patterns[c].iter().sum::<u32>()
                + counts
                    .whole
                    .iter()
                    .filter(|((cc, _, _), _)| *cc == c)
                    .map(|(&(_, _, k), &n)| k * n)
                    .sum::<u32>()
        })
        .collect()
}

/// Slots the patterns offer less those the replicas take, in parts.
fn spare_slots(classes: &[Class], counts: &Counts) -> Spare {
    let mut spare = Spare::new();
    for (c, class) in classes.iter().enumerate() {
        for (p, pattern) in class.patterns.iter().enumerate() {
            for &(t, k) in &pattern.slots {
                *spare.entry((c, t)).or_insert(0) += i64::from(k * counts.patterns[c][p]);
            }
        }
    }
    for (&(c, _, t), &k) in &counts.slots {
        *spare.entry((c, t)).or_insert(0) -= i64::from(k) * parts(&classes[c].slot_types[t]);
    }
    spare
}

/// Rounds the relaxation into a feasible integer solution: patterns up,
/// replicas down, then the replicas left over placed greedily (spare slots,
/// then whole GPUs, then newly configured GPUs), the rest unplaced.
/// `None` when the rounding breaks a node-level rule.
pub(super) fn round(
    classes: &[Class],
    models: &[Model],
    demand_: &[u32],
    r: &Relaxed,
) -> Option<Counts> {
    let up = |v: f64| (v - 1e-6).ceil().max(0.0) as u32;
    let down = |v: f64| (v + 1e-6).floor().max(0.0) as u32;
    let mut counts = Counts {
        patterns: r
            .n
            .iter()
            .map(|ns| ns.iter().map(|&v| up(v)).collect())
            .collect(),
        unplaced: vec![0; models.len()],
        ..Counts::default()
    };
    let mut remaining: Vec<u32> = demand_.to_vec();
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
    let mut used = used_gpus(classes, &counts);
    let mut spare = spare_slots(classes, &counts);
    // Rounding patterns up can overrun a class: take back the GPUs rounded
    // up least, and the replicas their slots held go back to the greedy.
    for (c, class) in classes.iter().enumerate() {
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
            let fractional: u32 = class
                .patterns
                .iter()
                .enumerate()
                .filter(|(_, p)| p.kind == PatternKind::Fractional)
                .map(|(p, _)| counts.patterns[c][p])
                .sum();
            let configured: u32 = config_gpus(class, c, &counts, Extra::default())
                .values()
                .map(|n| n.div_ceil(g))
                .sum::<u32>()
                + fractional.div_ceil(g);
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
            // The sharing role holding fewest GPUs: a device-plugin config
            // (its pattern) or HAMi (its fractional pattern holding fewest).
            let role = class
                .patterns
                .iter()
                .enumerate()
                .filter(|&(p, pattern)| pattern.kind.node_config() && counts.patterns[c][p] > 0)
                .map(|(p, _)| (counts.patterns[c][p], p))
                .chain(
                    (fractional > 0)
                        .then(|| {
                            class
                                .patterns
                                .iter()
                                .enumerate()
                                .filter(|&(p, pattern)| {
                                    pattern.kind == PatternKind::Fractional
                                        && counts.patterns[c][p] > 0
                                })
                                .min_by_key(|&(p, _)| (counts.patterns[c][p], p))
                                .map(|(p, _)| (fractional, p))
                        })
                        .flatten(),
                )
                .min();
            let p = match role {
                Some((_, p)) => p,
                None => (0..class.patterns.len()).find(|&p| counts.patterns[c][p] > 0)?,
            };
            take_back_gpu(class, c, p, &mut counts, &mut spare, &mut remaining)?;
            used[c] -= 1;
        }
    }
    counts.slots.retain(|_, n| *n > 0);
    counts.whole.retain(|_, n| *n > 0);
    complete(classes, models, counts, remaining, used, spare, false)
}

/// One GPU of pattern `p` of class `c` less; the replicas its slots held
/// (from the slot types holding most) go back to `remaining`. `None` when
/// the counts were inconsistent.
fn take_back_gpu(
    class: &Class,
    c: usize,
    p: usize,
    counts: &mut Counts,
    spare: &mut Spare,
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
            *left += parts(&class.slot_types[t]);
        }
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
    mut spare: Spare,
    whole_first: bool,
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
                    let st = &classes[c].slot_types[t];
                    n >= parts(st) && fits_slot(&models[m], &classes[c], st)
                })
                .min_by(|a, b| {
                    let ta = &classes[a.0.0].slot_types[a.0.1];
                    let tb = &classes[b.0.0].slot_types[b.0.1];
                    ta.memory_gib.total_cmp(&tb.memory_gib).then(a.0.cmp(b.0))
                })
                .map(|(&key, _)| key);
            if let Some((c, t)) = slot {
                *spare.get_mut(&(c, t)).expect("found above") -= parts(&classes[c].slot_types[t]);
                *counts.slots.entry((c, m, t)).or_insert(0) += 1;
                remaining[m] -= 1;
                continue;
            }
            // Whole GPUs, cheapest per replica.
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
                .map(|(c, k)| (c, k, classes[c].price * f64::from(k)))
                .min_by(|a, b| a.2.total_cmp(&b.2));
            // A newly configured GPU: the pattern whose slots cost least per
            // replica they will hold (a tensor-parallel replica on
            // fractional shares opens one GPU at a time until it has `k`);
            // at equal cost, the one that holds most of the model, whose
            // spare slots take its next replicas.
            let mut best: Option<(usize, usize, f64, f64)> = None;
            for (c, class) in classes.iter().enumerate() {
                if used[c] >= class.healthy_gpus() {
                    continue;
                }
                for (p, pattern) in class.patterns.iter().enumerate() {
                    // Replicas its fitting slots hold (a fraction of one
                    // for a share of a tensor-parallel replica).
                    let places: f64 = pattern
                        .slots
                        .iter()
                        .filter(|&&(t, _)| fits_slot(&models[m], class, &class.slot_types[t]))
                        .map(|&(t, k)| f64::from(k) / parts(&class.slot_types[t]) as f64)
                        .sum();
                    if places <= 0.0 {
                        continue;
                    }
                    let price = class.price / places.min(f64::from(remaining[m]));
                    let better = best.is_none_or(|(_, _, b, most)| {
                        price < b - 1e-12 || (price <= b + 1e-12 && places > most + 1e-9)
                    });
                    if better && node_ok(class, c, &counts, Extra::pattern(p)) {
                        best = Some((c, p, price, places));
                    }
                }
            }
            // A whole GPU when it costs less per replica than any new
            // pattern, or as little and no pattern holds more than one.
            if let Some((c, k, price)) = whole
                && (whole_first
                    || best.is_none_or(|(_, _, b, most)| {
                        price < b - 1e-12 || (price <= b + 1e-12 && most <= 1.0 + 1e-9)
                    }))
            {
                used[c] += k;
                *counts.whole.entry((c, m, k)).or_insert(0) += 1;
                remaining[m] -= 1;
                continue;
            }
            match best {
                Some((c, p, _, _)) => {
                    used[c] += 1;
                    counts.patterns[c][p] += 1;
                    for &(t, k) in &classes[c].patterns[p].slots {
                        *spare.entry((c, t)).or_insert(0) += i64::from(k);
                    }
                }
                None => {
                    counts.unplaced[m] += remaining[m];
                    remaining[m] = 0;
                }
            }
        }
    }
    consolidate(classes, models, &mut counts, &mut spare);
    // GPUs whose every slot is spare were opened for nothing.
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
    // Node-level rules: one device-plugin config per node, no whole GPU
    // there, no MIG on MPS or HAMi nodes, groups that fit a node.
    for (c, class) in classes.iter().enumerate() {
        let g = class.gpus_per_node.max(1);
        for (q, gpus) in config_gpus(class, c, &counts, Extra::default()) {
            let need = gpus.div_ceil(g);
            if need > 0 {
                counts.config_nodes.insert((c, q), need);
            }
        }
        if !node_ok(class, c, &counts, Extra::default()) {
            return None;
        }
        let hami = counts.fractional_gpus(classes, c).div_ceil(g);
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
            let shared = counts
                .slots
                .iter()
                .filter(|&(&(cc, _, t), _)| cc == c && class.slot_types[t].parts == k)
                .any(|(_, &n)| n > hami * (g / k));
            if shared {
                return None;
            }
        }
    }
    Some(counts)
}

/// Takes a GPU away, dearest first, while the replicas its slots would
/// hold fit spare slots elsewhere (any class, any slot type they fit).
fn consolidate(classes: &[Class], models: &[Model], counts: &mut Counts, spare: &mut Spare) {
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
                *trial_spare.entry((c, t)).or_insert(0) -= i64::from(k);
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
                            let st = &classes[c2].slot_types[t2];
                            n >= parts(st)
                                && (c2, t2) != (c, t)
                                && fits_slot(&models[m], &classes[c2], st)
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
                    *trial_spare.get_mut(&(c2, t2)).expect("found above") -=
                        parts(&classes[c2].slot_types[t2]);
                    *trial_spare.get_mut(&(c, t)).expect("exists") +=
                        parts(&classes[c].slot_types[t]);
                }
                if !ok {
                    break;
                }
            }
            if !ok {
                break;
            }
            trial_counts.slots.retain(|_, n| *n > 0);
            *counts = trial_counts;
            *spare = trial_spare;
        }
    }
}

/// The current placement, trimmed or extended to the demand: replicas
/// beyond the demand leave (groups on whole GPUs first, dearest, then from
/// the slot types holding most), missing ones are placed by [`complete`] on
/// top of what runs. Nothing that runs moves; `None` when that cannot keep
/// the node-level rules.
pub fn pinned(classes: &[Class], models: &[Model], demand_: &[u32]) -> Option<Counts> {
    pinned_with(classes, models, demand_, false)
}

/// [`pinned`] with the missing replicas that no spare slot takes on
/// whole GPUs wherever a whole GPU holds one, before any new pattern: a
/// new whole GPU
/// takes a free GPU without touching a node's role, and
/// [`crate::decode::decode_refilled`] can empty it into running
/// fractional GPUs' room. The re-plan on top falls back to it when the
/// pattern [`pinned`] opens needs a node's role changed.
pub fn pinned_whole(classes: &[Class], models: &[Model], demand_: &[u32]) -> Option<Counts> {
    pinned_with(classes, models, demand_, true)
}

fn pinned_with(
    classes: &[Class],
    models: &[Model],
    demand_: &[u32],
    whole_first: bool,
) -> Option<Counts> {
    let mut counts = Counts {
        patterns: classes.iter().map(|c| c.current_patterns.clone()).collect(),
        unplaced: vec![0; models.len()],
        ..Counts::default()
    };
    for (c, class) in classes.iter().enumerate() {
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
                .sum::<u32>();
        while have > want {
            // A replica on whole GPUs first, the dearest group: it frees
            // its GPUs now, where one leaving a shared GPU leaves a hole
            // until the GPU's last tenant goes.
            let whole = counts
                .whole
                .iter()
                .filter(|&(&(_, mm, _), &n)| mm == m && n > 0)
                .max_by(|a, b| {
                    let price = |&(c, _, k): &(usize, usize, u32)| classes[c].price * f64::from(k);
                    price(a.0).total_cmp(&price(b.0)).then(b.0.cmp(a.0))
                })
                .map(|(&key, _)| key);
            match whole {
                Some(key) => *counts.whole.get_mut(&key).expect("found above") -= 1,
                None => {
                    let (&key, _) = counts
                        .slots
                        .iter()
                        .filter(|&(&(_, mm, _), &n)| mm == m && n > 0)
                        .max_by_key(|&(_, &n)| n)?;
                    *counts.slots.get_mut(&key).expect("found above") -= 1;
                }
            }
            have -= 1;
        }
        remaining[m] = want - have;
    }
    counts.slots.retain(|_, n| *n > 0);
    counts.whole.retain(|_, n| *n > 0);
    let used = used_gpus(classes, &counts);
    let spare = spare_slots(classes, &counts);
    if spare.values().any(|&v| v < 0) {
        return None;
    }
    complete(classes, models, counts, remaining, used, spare, whole_first)
}

/// Objective value (cost plus unplaced penalties) of integer counts.
pub(crate) fn counts_cost(classes: &[Class], models: &[Model], counts: &Counts) -> f64 {
    let max_price = classes.iter().map(|c| c.price).fold(0.0, f64::max);
    let max_gpus = max_group(models);
    let used = used_gpus(classes, counts);
    let mut cost: f64 = classes
        .iter()
        .zip(&used)
        .map(|(class, &n)| class.price * f64::from(n))
        .sum();
    for (m, model) in models.iter().enumerate() {
        cost += penalty(model, max_gpus, max_price) * f64::from(counts.unplaced[m]);
    }
    cost
}

/// GPUs per device-plugin config of class `c` (with `extra`).
fn config_gpus(
    class: &Class,
    c: usize,
    counts: &Counts,
    extra: Extra,
) -> BTreeMap<NodeConfig, u32> {
    let mut out: BTreeMap<NodeConfig, u32> = BTreeMap::new();
    for (p, pattern) in class.patterns.iter().enumerate() {
        if let Some(q) = pattern.kind.config() {
            *out.entry(q).or_insert(0) +=
                counts.patterns[c][p] + u32::from(extra.pattern == Some(p));
        }
    }
    out
}

/// What is added to a class's counts before checking the node rules.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Extra {
    whole: u32,
    pattern: Option<usize>,
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
}

/// Whether class `c` keeps the node-level rules with `extra` added: one
/// device-plugin config (time-slicing, MPS) or HAMi per node, whole GPUs
/// only on nodes with neither, MIG and time-sliced GPUs not on MPS or
/// HAMi nodes.
pub(super) fn node_ok(class: &Class, c: usize, counts: &Counts, extra: Extra) -> bool {
    let g = class.gpus_per_node.max(1);
    let nodes = class.nodes.len() as u32;
    let (mut configured, mut no_mig, mut mig_share, mut fractional) = (0u32, 0u32, 0u32, 0u32);
    for (p, pattern) in class.patterns.iter().enumerate() {
        let n = counts.patterns[c][p] + u32::from(extra.pattern == Some(p));
        match pattern.kind {
            PatternKind::Mig(_) | PatternKind::Share(_) => mig_share += n,
            PatternKind::Fractional => fractional += n,
            PatternKind::Mps(_) | PatternKind::MigShare { .. } => {}
        }
    }
    for (q, gpus) in config_gpus(class, c, counts, extra) {
        configured += gpus.div_ceil(g);
        if !matches!(q, NodeConfig::Share(_)) {
            no_mig += gpus.div_ceil(g);
        }
    }
    let hami = fractional.div_ceil(g);
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
