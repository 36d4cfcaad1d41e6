//! Emptying GPUs: a local search on an integer plan.
//!
//! The MIP over a sample of fractional mixes (and, past its limits, the
//! rounding of its relaxation) leaves GPUs part-used: a fractional GPU
//! holding a few small replicas, a whole L40S for one replica, the last
//! pattern rounded up. Where fractional GPUs have room, those replicas fit
//! there and the GPU they held is not needed. So, as bin-packing local
//! search does: take the GPU that is cheapest to empty, move each of its
//! replicas to the fractional GPU it fits best (memory, SM percent and
//! HAMi's containers per GPU all within the GPU's caps), and keep the
//! change only when every replica found a place. Repeat until no GPU can
//! be emptied or the budget is spent.
//!
//! Only moves that keep every rule hold by construction: replicas go only
//! to fractional GPUs that run already (no node changes role, no new GPU),
//! a GPU taken away only lowers counts the node rules bound from above,
//! and tensor-parallel shares neither move nor leave (their GPUs are not
//! emptied). The result is checked again before it replaces the plan: the
//! slot rows, the replicas per model, every fractional GPU's caps, the
//! node rules and the cost.

use std::collections::BTreeMap;
use std::time::Instant;

use gpuscale_policies::Model;

use super::round::{counts_cost, node_ok};
use super::{Counts, Mix};
use crate::classes::{Class, PatternKind, SlotKind};

/// A fractional GPU in use: its class and the shares it holds.
#[derive(Debug, Clone)]
struct Bin {
    c: usize,
    shares: BTreeMap<usize, u32>,
    mib: u64,
    pct: u64,
    count: u32,
    /// Holds a tensor-parallel share (never emptied).
    locked: bool,
    gone: bool,
}

/// A GPU the search may empty.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Donor {
    /// A fractional GPU ([`Bin`] index).
    Fractional(usize),
    /// One GPU of a non-fractional pattern `(c, p)`.
    Pattern(usize, usize),
    /// A whole GPU running one replica `(c, m)`.
    Whole(usize, usize),
}

/// A share of model `m` moved from fractional GPU `from` (slot type
/// `t_from`) to `to` (`t_to`) to make room for another.
#[derive(Debug, Clone, Copy)]
struct Ejection {
    m: usize,
    from: usize,
    t_from: usize,
    to: usize,
    t_to: usize,
}

/// One step of an attempt to empty a GPU, for undoing it.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A share of slot type `t` placed on fractional GPU `b`.
    Placed(usize, usize),
    Ejected(Ejection),
}

/// Replica `m` leaving slot type `t` of class `c` (`None`: a whole GPU).
type Leaving = (usize, Option<usize>, usize);

struct Search<'a> {
    classes: &'a [Class],
    /// Per class, model → its (single-GPU) fractional slot type.
    homes: Vec<BTreeMap<usize, usize>>,
    /// Per class, the inverse: fractional slot type → its model.
    owners: Vec<BTreeMap<usize, usize>>,
    bins: Vec<Bin>,
    by_class: Vec<Vec<usize>>,
    /// Non-fractional slots offered less those taken, per (class, type).
    spare: BTreeMap<(usize, usize), i64>,
    counts: Counts,
    /// Fit checks left (the search's work bound: large clusters stay
    /// fast, and the result does not depend on the clock).
    checks_left: u64,
    /// Of those, what ejection chains may still spend (on large clusters
    /// they found nothing the plain moves did not).
    ejection_checks_left: u64,
}

/// Empties what GPUs it can within `deadline`; the improved counts, or
/// `None` when no GPU could be emptied (or the result broke a node rule).
fn empty_gpus(
    classes: &[Class],
    models: &[Model],
    counts: &Counts,
    deadline: Instant,
    consolidating: bool,
) -> Option<(Vec<Vec<Mix>>, Counts)> {
    let mut search = Search::new(classes, models, counts)?;
    let mut emptied = 0u32;
    let mut failures = 0u32;
    loop {
        let mut any = false;
        if consolidating && search.consolidate() {
            emptied += 1;
            any = true;
        }
        for donor in search.donors() {
            if Instant::now() >= deadline || failures >= MAX_FAILURES || search.checks_left == 0 {
                break;
            }
            if search.try_empty(donor) {
                emptied += 1;
                any = true;
                failures = 0;
            } else {
                failures += 1;
            }
        }
        if !any || Instant::now() >= deadline || failures >= MAX_FAILURES || search.checks_left == 0
        {
            break;
        }
    }
    if emptied == 0 {
        return None;
    }
    Some(search.finish())
}

/// [`empty_gpus`] applied: the classes with its new mixes added as
/// patterns, its counts, and the mixes added per class; `None` unless
/// the counts keep every node rule and cost less than `counts`.
pub(super) fn improved(
    classes: &[Class],
    models: &[Model],
    counts: &Counts,
    deadline: Instant,
) -> Option<(Vec<Class>, Counts, Vec<Vec<Mix>>)> {
    let mut best: Option<(Vec<Class>, Counts, Vec<Vec<Mix>>)> = None;
    // Both ways, the better kept: which of them empties more GPUs depends
    // on where the plan starts (on the reference scenarios each won some).
    for consolidating in [false, true] {
        let Some((mixes, mut out)) = empty_gpus(classes, models, counts, deadline, consolidating)
        else {
            continue;
        };
        let mut grown = classes.to_vec();
        for ((class, mix), ns) in grown.iter_mut().zip(&mixes).zip(out.patterns.iter_mut()) {
            for m in mix {
                class.add_fractional_pattern(m.clone());
            }
            ns.resize(class.patterns.len(), 0);
        }
        let cost = counts_cost(&grown, models, &out);
        // Every fractional GPU in use within its caps (the search keeps
        // them; checked again as the ILP's rows would).
        let fit = grown.iter().zip(&out.patterns).all(|(class, ns)| {
            class.patterns.iter().zip(ns).all(|(p, &n)| {
                n == 0 || p.kind != PatternKind::Fractional || class.fractional_fits(&p.slots)
            })
        });
        if fit
            && rows_hold(&grown, &out)
            && replicas(&out) == replicas(counts)
            && out.unplaced == counts.unplaced
            && nodes_ok(&grown, &out)
            && cost <= counts_cost(classes, models, counts) - 1e-9
            && best
                .as_ref()
                .is_none_or(|(g, o, _)| cost < counts_cost(g, models, o) - 1e-9)
        {
            best = Some((grown, out, mixes));
        }
    }
    best
}

/// Passes of [`Search::consolidate`] per call.
const CONSOLIDATION_PASSES: u32 = 4;

/// Fit checks per search (on the 10,000-GPU reference scenario, a
/// search that ran to its end made 6 million).
const MAX_CHECKS: u64 = 20_000_000;

/// Fit checks ejection chains may make per search.
const MAX_EJECTION_CHECKS: u64 = 1_000_000;

/// Fractional GPUs, the emptiest, whose shares a consolidation pass
/// moves.
const SOURCES: usize = 64;

/// Failed attempts in a row after which the search stops (the GPUs are
/// tried emptiest first, so later ones rarely empty).
const MAX_FAILURES: u32 = 48;

impl<'a> Search<'a> {
    fn new(classes: &'a [Class], models: &[Model], counts: &Counts) -> Option<Self> {
        let homes: Vec<BTreeMap<usize, usize>> = classes
            .iter()
            .map(|class| {
                class
                    .slot_types
                    .iter()
                    .enumerate()
                    .filter(|(_, st)| st.parts <= 1 && st.need.is_some())
                    .filter_map(|(t, st)| match &st.kind {
                        SlotKind::Fractional(name) => {
                            models.iter().position(|m| &m.name == name).map(|m| (m, t))
                        }
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        if homes.iter().all(BTreeMap::is_empty) {
            return None;
        }
        let owners = homes
            .iter()
            .map(|home| home.iter().map(|(&m, &t)| (t, m)).collect())
            .collect();
        let mut bins = Vec::new();
        let mut by_class = vec![Vec::new(); classes.len()];
        for (c, class) in classes.iter().enumerate() {
            if class.fractional.is_none() {
                continue;
            }
            for (p, pattern) in class.patterns.iter().enumerate() {
                if pattern.kind != PatternKind::Fractional {
                    continue;
                }
                for _ in 0..counts.patterns[c][p] {
                    let mut bin = Bin {
                        c,
                        shares: BTreeMap::new(),
                        mib: 0,
                        pct: 0,
                        count: 0,
                        locked: false,
                        gone: false,
                    };
                    for &(t, k) in &pattern.slots {
                        add(class, &mut bin, t, k);
                    }
                    by_class[c].push(bins.len());
                    bins.push(bin);
                }
            }
        }
        // Shares no replica takes leave their GPUs (the emptiest first):
        // what each fractional GPU holds is then what runs on it.
        let mut spare: BTreeMap<(usize, usize), i64> = BTreeMap::new();
        for (c, class) in classes.iter().enumerate() {
            for (p, pattern) in class.patterns.iter().enumerate() {
                for &(t, k) in &pattern.slots {
                    *spare.entry((c, t)).or_insert(0) +=
                        i64::from(k) * i64::from(counts.patterns[c][p]);
                }
            }
        }
        for (&(c, _, t), &n) in &counts.slots {
            *spare.entry((c, t)).or_insert(0) -=
                i64::from(n) * i64::from(classes[c].slot_types[t].parts.max(1));
        }
        for (&(c, t), left) in spare.iter_mut() {
            let st = &classes[c].slot_types[t];
            if !matches!(st.kind, SlotKind::Fractional(_)) || st.parts > 1 {
                continue;
            }
            while *left > 0 {
                let Some(b) = by_class[c]
                    .iter()
                    .copied()
                    .filter(|&b| bins[b].shares.get(&t).is_some_and(|&k| k > 0))
                    .min_by(|&a, &b| fill(classes, &bins[a]).total_cmp(&fill(classes, &bins[b])))
                else {
                    break;
                };
                remove(&classes[c], &mut bins[b], t, 1);
                *left -= 1;
            }
        }
        for bin in &mut bins {
            let class = &classes[bin.c];
            bin.locked = bin
                .shares
                .iter()
                .any(|(&t, &k)| k > 0 && class.slot_types[t].parts > 1);
        }
        Some(Self {
            classes,
            homes,
            owners,
            bins,
            by_class,
            spare,
            counts: counts.clone(),
            checks_left: MAX_CHECKS,
            ejection_checks_left: MAX_EJECTION_CHECKS,
        })
    }

    /// The GPUs to try, cheapest to empty (least held, per its price)
    /// first.
    fn donors(&self) -> Vec<Donor> {
        let mut out: Vec<(f64, Donor)> = Vec::new();
        for (b, bin) in self.bins.iter().enumerate() {
            if !bin.gone && !bin.locked {
                let price = self.classes[bin.c].price.max(1e-9);
                out.push((fill(self.classes, bin) / price, Donor::Fractional(b)));
            }
        }
        for (c, class) in self.classes.iter().enumerate() {
            let price = class.price.max(1e-9);
            for (p, pattern) in class.patterns.iter().enumerate() {
                if pattern.kind == PatternKind::Fractional || self.counts.patterns[c][p] == 0 {
                    continue;
                }
                let donor = Donor::Pattern(c, p);
                if let Some(size) = self.leaving_size(donor) {
                    out.push((size / price, donor));
                }
            }
        }
        for (&(c, m, k), &n) in &self.counts.whole {
            let donor = Donor::Whole(c, m);
            if k == 1
                && n > 0
                && let Some(size) = self.leaving_size(donor)
            {
                out.push((size / self.classes[c].price.max(1e-9), donor));
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out.into_iter().map(|(_, d)| d).collect()
    }

    /// What must leave a non-fractional donor, as a share of the largest
    /// fractional GPU's memory (how a fractional GPU's fill is measured).
    fn leaving_size(&self, donor: Donor) -> Option<f64> {
        let largest = self
            .classes
            .iter()
            .filter_map(|c| c.fractional.map(|f| f.memory_mib))
            .max()?;
        let leaving = self.leaving(donor)?;
        let mib: u64 = leaving.iter().map(|&(m, _, _)| self.smallest(m)).sum();
        Some(mib as f64 / f64::from(largest.max(1)))
    }

    /// The replicas that must leave for `donor` to be emptied; `None` when
    /// one of them has no fractional home anywhere.
    fn leaving(&self, donor: Donor) -> Option<Vec<Leaving>> {
        let mut out = Vec::new();
        match donor {
            Donor::Fractional(b) => {
                let bin = &self.bins[b];
                for (&t, &k) in &bin.shares {
                    let SlotKind::Fractional(_) = &self.classes[bin.c].slot_types[t].kind else {
                        return None;
                    };
                    let m = *self.owners[bin.c].get(&t)?;
                    out.extend(std::iter::repeat_n((m, Some(t), bin.c), k as usize));
                }
            }
            Donor::Pattern(c, p) => {
                for &(t, k) in &self.classes[c].patterns[p].slots {
                    let spare = self.spare.get(&(c, t)).copied().unwrap_or(0);
                    let mut evict = (i64::from(k) - spare.max(0)).max(0);
                    // The replicas of this slot type, smallest first.
                    let mut on: Vec<(usize, u32)> = self
                        .counts
                        .slots
                        .iter()
                        .filter(|&(&(cc, _, tt), &n)| cc == c && tt == t && n > 0)
                        .map(|(&(_, m, _), &n)| (m, n))
                        .collect();
                    on.sort_by_key(|&(m, _)| self.smallest(m));
                    for (m, n) in on {
                        if evict == 0 {
                            break;
                        }
                        if self.smallest(m) == u64::MAX {
                            continue;
                        }
                        let take = i64::from(n).min(evict);
                        out.extend(std::iter::repeat_n((m, Some(t), c), take as usize));
                        evict -= take;
                    }
                    if evict > 0 {
                        return None;
                    }
                }
            }
            Donor::Whole(c, m) => {
                if self.smallest(m) == u64::MAX {
                    return None;
                }
                out.push((m, None, c));
            }
        }
        Some(out)
    }

    /// The smallest share model `m` takes on any fractional GPU (MiB), or
    /// `u64::MAX` when it has no fractional home.
    fn smallest(&self, m: usize) -> u64 {
        self.homes
            .iter()
            .enumerate()
            .filter_map(|(c, h)| h.get(&m).map(|&t| (c, t)))
            .filter_map(|(c, t)| self.classes[c].slot_types[t].need)
            .map(|(mib, _)| u64::from(mib))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Moves every replica of `donor` to fractional GPUs with room, best
    /// fit, largest first; on failure nothing changes.
    fn try_empty(&mut self, donor: Donor) -> bool {
        let Some(mut leaving) = self.leaving(donor) else {
            return false;
        };
        leaving.sort_by_key(|&(m, _, _)| std::cmp::Reverse(self.smallest(m)));
        let skip = match donor {
            Donor::Fractional(b) => Some(b),
            _ => None,
        };
        let mut placed: Vec<(usize, usize)> = Vec::new();
        let mut ejections: Vec<Ejection> = Vec::new();
        // What was done, in order, to undo it in reverse: an ejection may
        // move a share placed earlier in this same attempt.
        let mut journal: Vec<Step> = Vec::new();
        let mut ok = true;
        for &(m, _, _) in &leaving {
            let mut best: Option<(f64, usize, usize)> = None;
            for (c, home) in self.homes.iter().enumerate() {
                let Some(&t) = home.get(&m) else { continue };
                let class = &self.classes[c];
                let (Some(cap), Some((mib, pct))) = (class.fractional, class.slot_types[t].need)
                else {
                    continue;
                };
                self.checks_left = self
                    .checks_left
                    .saturating_sub(self.by_class[c].len() as u64);
                for &b in &self.by_class[c] {
                    let bin = &self.bins[b];
                    if bin.gone || Some(b) == skip {
                        continue;
                    }
                    let (mib_after, pct_after) =
                        (bin.mib + u64::from(mib), bin.pct + u64::from(pct));
                    if mib_after > u64::from(cap.memory_mib)
                        || pct_after > u64::from(cap.cores)
                        || bin.count + 1 > cap.shares
                    {
                        continue;
                    }
                    let slack = (1.0 - mib_after as f64 / f64::from(cap.memory_mib.max(1)))
                        .min(1.0 - pct_after as f64 / f64::from(cap.cores.max(1)));
                    if best.is_none_or(|(s, _, _)| slack < s) {
                        best = Some((slack, b, t));
                    }
                }
            }
            let (b, t) = match best {
                Some((_, b, t)) => (b, t),
                None => match self.eject(m, skip) {
                    Some((b, t, ejected)) => {
                        ejections.push(ejected);
                        journal.push(Step::Ejected(ejected));
                        (b, t)
                    }
                    None => {
                        ok = false;
                        break;
                    }
                },
            };
            let c = self.bins[b].c;
            add(&self.classes[c], &mut self.bins[b], t, 1);
            placed.push((b, t));
            journal.push(Step::Placed(b, t));
        }
        if !ok {
            for step in journal.into_iter().rev() {
                match step {
                    Step::Placed(b, t) => {
                        let c = self.bins[b].c;
                        remove(&self.classes[c], &mut self.bins[b], t, 1);
                    }
                    Step::Ejected(e) => self.undo_ejection(e),
                }
            }
            return false;
        }
        // Commit: the replicas' slots move, the donor's GPU goes.
        for (&(m, from, c), &(b, t)) in leaving.iter().zip(&placed) {
            if let Some(from) = from {
                let key = (c, m, from);
                if let Some(n) = self.counts.slots.get_mut(&key) {
                    *n -= 1;
                }
                if !matches!(
                    self.classes[c].slot_types[from].kind,
                    SlotKind::Fractional(_)
                ) {
                    *self.spare.entry((c, from)).or_insert(0) += 1;
                }
            }
            *self.counts.slots.entry((self.bins[b].c, m, t)).or_insert(0) += 1;
        }
        // The ejected shares after the placements: a share ejected may be
        // one placed above (its slot counted there first).
        for e in &ejections {
            let (from, to) = (self.bins[e.from].c, self.bins[e.to].c);
            if let Some(n) = self.counts.slots.get_mut(&(from, e.m, e.t_from)) {
                *n -= 1;
            }
            *self.counts.slots.entry((to, e.m, e.t_to)).or_insert(0) += 1;
        }
        match donor {
            Donor::Fractional(b) => self.bins[b].gone = true,
            Donor::Pattern(c, p) => {
                self.counts.patterns[c][p] -= 1;
                for &(t, k) in &self.classes[c].patterns[p].slots {
                    *self.spare.entry((c, t)).or_insert(0) -= i64::from(k);
                }
            }
            Donor::Whole(c, m) => {
                if let Some(n) = self.counts.whole.get_mut(&(c, m, 1)) {
                    *n -= 1;
                }
            }
        }
        self.counts.slots.retain(|_, n| *n > 0);
        self.counts.whole.retain(|_, n| *n > 0);
        true
    }

    /// Shares moved from emptier fractional GPUs to fuller ones where they
    /// fit (each move raises the sum of squared fills, so the passes end):
    /// the GPUs emptied go. Whether any did.
    fn consolidate(&mut self) -> bool {
        let mut emptied = false;
        for _ in 0..CONSOLIDATION_PASSES {
            let mut moved = false;
            let mut by_fill: Vec<usize> = (0..self.bins.len())
                .filter(|&b| !self.bins[b].gone)
                .collect();
            by_fill.sort_by(|&a, &b| {
                fill(self.classes, &self.bins[a]).total_cmp(&fill(self.classes, &self.bins[b]))
            });
            let sources: Vec<usize> = by_fill
                .iter()
                .copied()
                .filter(|&b| !self.bins[b].locked)
                .take(SOURCES)
                .collect();
            for &src in &sources {
                let c = self.bins[src].c;
                let shares: Vec<(usize, u32)> = self.bins[src]
                    .shares
                    .iter()
                    .map(|(&t, &k)| (t, k))
                    .collect();
                for (t, k) in shares {
                    let Some(&m) = self.owners[c].get(&t) else {
                        continue;
                    };
                    for _ in 0..k {
                        if self.checks_left == 0 {
                            return emptied;
                        }
                        let before = fill(self.classes, &self.bins[src]);
                        let mut found: Option<(f64, usize, usize)> = None;
                        self.checks_left = self.checks_left.saturating_sub(by_fill.len() as u64);
                        for &b in &by_fill {
                            if b == src || self.bins[b].gone {
                                continue;
                            }
                            let f = fill(self.classes, &self.bins[b]);
                            if f <= before || found.is_some_and(|(x, _, _)| f <= x) {
                                continue;
                            }
                            if let Some(&tt) = self.homes[self.bins[b].c].get(&m)
                                && self.fits(b, tt)
                            {
                                found = Some((f, b, tt));
                            }
                        }
                        let Some((_, b, tt)) = found else { break };
                        remove(&self.classes[c], &mut self.bins[src], t, 1);
                        let cb = self.bins[b].c;
                        add(&self.classes[cb], &mut self.bins[b], tt, 1);
                        if let Some(n) = self.counts.slots.get_mut(&(c, m, t)) {
                            *n -= 1;
                        }
                        *self.counts.slots.entry((cb, m, tt)).or_insert(0) += 1;
                        moved = true;
                    }
                }
                if self.bins[src].count == 0 {
                    self.bins[src].gone = true;
                    emptied = true;
                }
            }
            self.counts.slots.retain(|_, n| *n > 0);
            if !moved {
                break;
            }
        }
        emptied
    }

    /// Whether a share of slot type `t` fits fractional GPU `b` now.
    fn fits(&self, b: usize, t: usize) -> bool {
        let bin = &self.bins[b];
        let class = &self.classes[bin.c];
        let (Some(cap), Some((mib, pct))) = (class.fractional, class.slot_types[t].need) else {
            return false;
        };
        !bin.gone
            && bin.mib + u64::from(mib) <= u64::from(cap.memory_mib)
            && bin.pct + u64::from(pct) <= u64::from(cap.cores)
            && bin.count < cap.shares
    }

    /// Room for one replica of `m` made by moving one share out of a
    /// fractional GPU to a third (an ejection chain of length two): the
    /// GPU and slot type `m` then takes, with the share moved. Neither GPU
    /// is `skip` (the one being emptied).
    fn eject(&mut self, m: usize, skip: Option<usize>) -> Option<(usize, usize, Ejection)> {
        for c in 0..self.classes.len() {
            let Some(&t) = self.homes[c].get(&m) else {
                continue;
            };
            for i in 0..self.by_class[c].len() {
                let b = self.by_class[c][i];
                if self.checks_left == 0 || self.ejection_checks_left == 0 {
                    return None;
                }
                if self.bins[b].gone || Some(b) == skip || self.bins[b].locked {
                    continue;
                }
                let shares: Vec<usize> = self.bins[b]
                    .shares
                    .iter()
                    .filter(|&(&s, &k)| k > 0 && s != t)
                    .map(|(&s, _)| s)
                    .collect();
                for s in shares {
                    let Some(&other) = self.owners[c].get(&s) else {
                        continue;
                    };
                    let class = &self.classes[c];
                    remove(class, &mut self.bins[b], s, 1);
                    let room = self.fits(b, t);
                    add(class, &mut self.bins[b], s, 1);
                    if !room {
                        continue;
                    }
                    // Where the share goes: the first other GPU it fits.
                    let mut target = None;
                    for (cc, h) in self.homes.iter().enumerate() {
                        let Some(&tt) = h.get(&other) else {
                            continue;
                        };
                        let n = self.by_class[cc].len() as u64;
                        self.checks_left = self.checks_left.saturating_sub(n);
                        self.ejection_checks_left = self.ejection_checks_left.saturating_sub(n);
                        if let Some(x) = self.by_class[cc]
                            .iter()
                            .copied()
                            .find(|&x| x != b && Some(x) != skip && self.fits(x, tt))
                        {
                            target = Some((x, tt));
                            break;
                        }
                    }
                    if let Some((to, t_to)) = target {
                        remove(class, &mut self.bins[b], s, 1);
                        let cto = self.bins[to].c;
                        add(&self.classes[cto], &mut self.bins[to], t_to, 1);
                        let ejected = Ejection {
                            m: other,
                            from: b,
                            t_from: s,
                            to,
                            t_to,
                        };
                        return Some((b, t, ejected));
                    }
                }
            }
        }
        None
    }

    fn undo_ejection(&mut self, e: Ejection) {
        let cto = self.bins[e.to].c;
        remove(&self.classes[cto], &mut self.bins[e.to], e.t_to, 1);
        let cfrom = self.bins[e.from].c;
        add(&self.classes[cfrom], &mut self.bins[e.from], e.t_from, 1);
    }

    /// The counts with the fractional GPUs as they are now: per class,
    /// the mixes that are new (to be added as patterns, in order) and the
    /// counts, whose fractional pattern indices count the new mixes after
    /// the class's patterns.
    fn finish(self) -> (Vec<Vec<Mix>>, Counts) {
        let mut counts = self.counts;
        let mut new_mixes: Vec<Vec<Mix>> = vec![Vec::new(); self.classes.len()];
        for (c, class) in self.classes.iter().enumerate() {
            if self.by_class[c].is_empty() {
                continue;
            }
            for (p, pattern) in class.patterns.iter().enumerate() {
                if pattern.kind == PatternKind::Fractional {
                    counts.patterns[c][p] = 0;
                }
            }
            for &b in &self.by_class[c] {
                let bin = &self.bins[b];
                if bin.gone || bin.count == 0 {
                    continue;
                }
                let mix: Vec<(usize, u32)> = bin
                    .shares
                    .iter()
                    .filter(|&(_, &k)| k > 0)
                    .map(|(&t, &k)| (t, k))
                    .collect();
                let p = match class.fractional_pattern(&mix) {
                    Some(p) => p,
                    None => match new_mixes[c].iter().position(|x| *x == mix) {
                        Some(i) => class.patterns.len() + i,
                        None => {
                            new_mixes[c].push(mix);
                            class.patterns.len() + new_mixes[c].len() - 1
                        }
                    },
                };
                if counts.patterns[c].len() <= p {
                    counts.patterns[c].resize(p + 1, 0);
                }
                counts.patterns[c][p] += 1;
            }
        }
        (new_mixes, counts)
    }
}

/// Whether every slot row holds: per class and slot type, the slots the
/// patterns offer cover the replicas' parts.
fn rows_hold(classes: &[Class], counts: &Counts) -> bool {
    let mut left: BTreeMap<(usize, usize), i64> = BTreeMap::new();
    for (c, class) in classes.iter().enumerate() {
        for (pattern, &n) in class.patterns.iter().zip(&counts.patterns[c]) {
            for &(t, k) in &pattern.slots {
                *left.entry((c, t)).or_insert(0) += i64::from(k) * i64::from(n);
            }
        }
    }
    for (&(c, _, t), &n) in &counts.slots {
        *left.entry((c, t)).or_insert(0) -=
            i64::from(n) * i64::from(classes[c].slot_types[t].parts.max(1));
    }
    left.values().all(|&l| l >= 0)
}

/// Replicas per model (a tensor-parallel group once).
fn replicas(counts: &Counts) -> BTreeMap<usize, u32> {
    let mut out = BTreeMap::new();
    for (&(_, m, _), &n) in &counts.slots {
        *out.entry(m).or_insert(0) += n;
    }
    for (&(_, m, _), &n) in &counts.whole {
        *out.entry(m).or_insert(0) += n;
    }
    out.retain(|_, n| *n > 0);
    out
}

/// Whether the counts keep every node rule of every class.
fn nodes_ok(classes: &[Class], counts: &Counts) -> bool {
    classes
        .iter()
        .enumerate()
        .all(|(c, class)| node_ok(class, c, counts, Default::default()))
}

/// How full a fractional GPU is: the larger of its memory and SM shares.
fn fill(classes: &[Class], bin: &Bin) -> f64 {
    let Some(cap) = classes[bin.c].fractional else {
        return 1.0;
    };
    (bin.mib as f64 / f64::from(cap.memory_mib.max(1)))
        .max(bin.pct as f64 / f64::from(cap.cores.max(1)))
}

fn add(class: &Class, bin: &mut Bin, t: usize, k: u32) {
    let (mib, pct) = class.slot_types[t].need.unwrap_or((0, 0));
    *bin.shares.entry(t).or_insert(0) += k;
    bin.mib += u64::from(mib) * u64::from(k);
    bin.pct += u64::from(pct) * u64::from(k);
    bin.count += k;
}

fn remove(class: &Class, bin: &mut Bin, t: usize, k: u32) {
    let (mib, pct) = class.slot_types[t].need.unwrap_or((0, 0));
    if let Some(n) = bin.shares.get_mut(&t) {
        *n -= k;
    }
    bin.mib -= u64::from(mib) * u64::from(k);
    bin.pct -= u64::from(pct) * u64::from(k);
    bin.count -= k;
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::PackOptions;
    use crate::classes;

    /// One node of two H100s that runs HAMi (`split`: its containers per
    /// GPU), and policies `a` (20 GiB, 0.2 of an H100) and `b` (10 GiB,
    /// `b_compute`), both fractional or whole.
    fn setup(split: u32, b_compute: f64) -> (Vec<Class>, Vec<Model>) {
        bundle(1, 2, split, &[(20.0, 0.2), (10.0, b_compute)])
    }

    /// `nodes` nodes of `gpus` H100s that may run HAMi with `split`
    /// containers per GPU, and one policy per `(GiB, compute)`, named
    /// `m0`, `m1`, …, fractional or whole.
    fn bundle(nodes: u32, gpus: u32, split: u32, specs: &[(f64, f64)]) -> (Vec<Class>, Vec<Model>) {
        let node = format!(
            "gpuModel: H100-80GB, gpuCount: {gpus}, sharing: [fractional, whole], hamiSplitCount: {split}"
        );
        let named: Vec<(String, f64, f64, &str)> = specs
            .iter()
            .enumerate()
            .map(|(i, &(gib, compute))| (format!("m{i}"), gib, compute, "fractional, whole"))
            .collect();
        load(nodes, &node, &named)
    }

    /// `nodes` nodes described by `node` (its fields after the name) and
    /// the policies `(name, GiB, compute, sharing)`, as classes.
    fn load<N: AsRef<str>>(
        nodes: u32,
        node: &str,
        specs: &[(N, f64, f64, &str)],
    ) -> (Vec<Class>, Vec<Model>) {
        let mut text = String::from(
            "apiVersion: gpuscale.io/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  nodes:\n",
        );
        for n in 0..nodes {
            text.push_str(&format!("    - {{name: n{n}, {node}}}\n"));
        }
        for (name, gib, compute, sharing) in specs {
            let name = name.as_ref();
            text.push_str(&format!(
                "---\napiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata: {{name: {name}}}\nspec:\n  resources: {{memoryGiB: {gib}, compute: {compute}, maxConcurrency: 8}}\n  placement: {{sharing: [{sharing}]}}\n"
            ));
        }
        let bundle = gpuscale_policies::load_sources(&[(Path::new("t.yaml"), text.as_str())])
            .unwrap_or_else(|p| panic!("{p}"));
        let cluster = bundle.cluster.expect("a cluster");
        let models = bundle.models;
        let classes = classes::build(&cluster, &models, &PackOptions::default());
        (classes, models)
    }

    /// The fractional slot type of model `m` in class 0.
    fn home(classes: &[Class], models: &[Model], m: usize) -> usize {
        classes[0]
            .slot_types
            .iter()
            .position(|st| st.kind == SlotKind::Fractional(models[m].name.clone()))
            .expect("a fractional slot type")
    }

    /// Counts of class 0 with fractional GPUs holding `mixes` (replicas
    /// per model, by model index) and `whole` whole GPUs of `b`.
    fn counts_of(
        classes: &mut [Class],
        models: &[Model],
        mixes: &[&[(usize, u32)]],
        whole: u32,
    ) -> Counts {
        let mut counts = Counts {
            unplaced: vec![0; models.len()],
            ..Counts::default()
        };
        let mut at = Vec::new();
        for mix in mixes {
            let mut slots: Mix = mix
                .iter()
                .map(|&(m, k)| (home(classes, models, m), k))
                .collect();
            slots.sort_unstable();
            at.push(classes[0].add_fractional_pattern(slots));
            for &(m, k) in *mix {
                *counts
                    .slots
                    .entry((0, m, home(classes, models, m)))
                    .or_insert(0) += k;
            }
        }
        counts.patterns = classes.iter().map(|c| vec![0; c.patterns.len()]).collect();
        for p in at {
            counts.patterns[0][p] += 1;
        }
        if whole > 0 {
            counts.whole.insert((0, 1, 1), whole);
        }
        counts
    }

    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(5)
    }

    /// Every fractional GPU of the counts within its memory, SM and
    /// container caps, and the replicas per model.
    fn check(classes: &[Class], counts: &Counts) -> (u32, BTreeMap<usize, u32>) {
        let class = &classes[0];
        let cap = class.fractional.expect("fractional");
        let mut gpus = 0;
        for (p, &n) in counts.patterns[0].iter().enumerate() {
            if n == 0 {
                continue;
            }
            gpus += n;
            let pattern = &class.patterns[p];
            assert!(class.fractional_fits(&pattern.slots), "{pattern:?}");
            let (mut mib, mut pct, mut shares) = (0, 0, 0);
            for &(t, k) in &pattern.slots {
                let (m, c) = class.slot_types[t].need.expect("a share");
                mib += m * k;
                pct += c * k;
                shares += k;
            }
            assert!(mib <= cap.memory_mib && pct <= cap.cores && shares <= cap.shares);
        }
        let mut replicas = BTreeMap::new();
        for (&(_, m, _), &n) in &counts.slots {
            *replicas.entry(m).or_insert(0) += n;
        }
        for (&(_, m, _), &n) in &counts.whole {
            *replicas.entry(m).or_insert(0) += n;
        }
        (gpus + counts.whole.values().sum::<u32>(), replicas)
    }

    #[test]
    fn a_gpu_holding_little_is_emptied_into_anothers_room() {
        let (mut classes, models) = setup(10, 0.1);
        let counts = counts_of(&mut classes, &models, &[&[(0, 2)], &[(1, 1)]], 0);
        let (grown, better, _) =
            improved(&classes, &models, &counts, deadline()).expect("one GPU emptied");
        let (gpus, replicas) = check(&grown, &better);
        assert_eq!(gpus, 1);
        assert_eq!(replicas, BTreeMap::from([(0, 2), (1, 1)]));
        assert!(counts_cost(&grown, &models, &better) < counts_cost(&classes, &models, &counts));
    }

    #[test]
    fn a_whole_gpu_for_one_small_replica_is_emptied_into_fractional_room() {
        let (mut classes, models) = setup(10, 0.1);
        let counts = counts_of(&mut classes, &models, &[&[(0, 2)]], 1);
        let (grown, better, _) =
            improved(&classes, &models, &counts, deadline()).expect("the whole GPU emptied");
        let (gpus, replicas) = check(&grown, &better);
        assert_eq!(gpus, 1);
        assert!(better.whole.is_empty());
        assert_eq!(replicas, BTreeMap::from([(0, 2), (1, 1)]));
    }

    #[test]
    fn hamis_containers_per_gpu_and_the_sm_cap_bound_the_moves() {
        // Two containers per GPU: the GPU holding two of `a` takes no
        // third, and neither does `b`'s GPU take both of `a`.
        let (mut classes, models) = setup(2, 0.1);
        let counts = counts_of(&mut classes, &models, &[&[(0, 2)], &[(1, 1)]], 0);
        assert!(improved(&classes, &models, &counts, deadline()).is_none());
        // Memory fits (50 of 80 GiB), SMs do not: 0.2 + 0.2 + 0.7 > 1.
        let (mut classes, models) = setup(10, 0.7);
        let counts = counts_of(&mut classes, &models, &[&[(0, 2)], &[(1, 1)]], 0);
        assert!(improved(&classes, &models, &counts, deadline()).is_none());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(96))]

        /// Over random fractional plans (each GPU's mix within its caps)
        /// and whole GPUs: what the search returns places every replica it
        /// was given, keeps every GPU within memory, SMs and HAMi's
        /// containers, and uses fewer GPUs (one price here).
        #[test]
        fn the_search_keeps_every_replica_and_every_cap(
            sizes in proptest::collection::vec((2u32..40, 2u32..50), 2..5),
            split in 2u32..8,
            fills in proptest::collection::vec(proptest::collection::vec(0usize..5, 0..8), 1..7),
            whole in 0u32..3,
        ) {
            let specs: Vec<(f64, f64)> = sizes
                .iter()
                .map(|&(g, c)| (f64::from(g), f64::from(c) / 100.0))
                .collect();
            let (mut classes, models) = bundle(2, 8, split, &specs);
            let mut mixes: Vec<Vec<(usize, u32)>> = Vec::new();
            for picks in &fills {
                let mut mix: BTreeMap<usize, u32> = BTreeMap::new();
                for &p in picks {
                    let m = p % models.len();
                    *mix.entry(m).or_insert(0) += 1;
                    let mut slots: Mix = mix
                        .iter()
                        .map(|(&m, &k)| (home(&classes, &models, m), k))
                        .collect();
                    slots.sort_unstable();
                    if !classes[0].fractional_fits(&slots) {
                        *mix.get_mut(&m).expect("just added") -= 1;
                    }
                }
                let mix: Vec<(usize, u32)> = mix.into_iter().filter(|&(_, k)| k > 0).collect();
                if !mix.is_empty() {
                    mixes.push(mix);
                }
            }
            let refs: Vec<&[(usize, u32)]> = mixes.iter().map(Vec::as_slice).collect();
            let counts = counts_of(&mut classes, &models, &refs, whole);
            let (gpus, replicas) = check(&classes, &counts);
            if let Some((grown, better, _)) = improved(&classes, &models, &counts, deadline()) {
                let (gpus_after, replicas_after) = check(&grown, &better);
                proptest::prop_assert_eq!(replicas_after, replicas);
                proptest::prop_assert!(gpus_after < gpus, "{} → {}", gpus, gpus_after);
                proptest::prop_assert!(better.unplaced.iter().all(|&u| u == 0));
            }
        }
    }

    /// Two nodes of two H100s that allow HAMi and time-slicing, the
    /// policies `(name, GiB, compute, sharing)`, and the counts: one GPU
    /// time-sliced into `n` holding `shared` (model indices), and one
    /// fractional GPU per model of `alone`.
    fn sliced(
        specs: &[(&str, f64, f64, &str)],
        n: u8,
        shared: &[usize],
        alone: &[usize],
    ) -> (Vec<Class>, Vec<Model>, Counts) {
        let (mut classes, models) = load(
            2,
            "gpuModel: H100-80GB, gpuCount: 2, sharing: [fractional, timeslice, whole]",
            specs,
        );
        assert_eq!(classes.len(), 1);
        let class = &mut classes[0];
        let share = class.share_slot(n).expect("a time-sliced slot type");
        let p_share = class
            .patterns
            .iter()
            .position(|p| p.kind == PatternKind::Share(n))
            .expect("a time-sliced pattern");
        let mut counts = Counts {
            unplaced: vec![0; models.len()],
            ..Counts::default()
        };
        let mut alone_patterns = Vec::new();
        for &m in alone {
            let t = class.fractional_slot(&models[m].name).expect("fractional");
            alone_patterns.push(class.add_fractional_pattern(vec![(t, 1)]));
            counts.slots.insert((0, m, t), 1);
        }
        counts.patterns = vec![vec![0; class.patterns.len()]];
        counts.patterns[0][p_share] = 1;
        for p in alone_patterns {
            counts.patterns[0][p] += 1;
        }
        for &m in shared {
            counts.slots.insert((0, m, share), 1);
        }
        assert!(rows_hold(&classes, &counts) && nodes_ok(&classes, &counts));
        (classes, models, counts)
    }

    /// Found by review: emptying a time-sliced GPU, `y` went to `w`'s GPU
    /// (the best fit) and then, for `x`, was ejected to `v`'s; the
    /// ejection was counted before `y`'s placement, so `y` was counted
    /// twice and its slot row came up one short.
    #[test]
    fn a_share_ejected_in_the_same_move_it_was_placed_in_is_counted_once() {
        let (classes, models, counts) = sliced(
            &[
                ("y", 30.0, 0.1, "fractional, timeslice"),
                ("x", 10.0, 0.5, "fractional, timeslice"),
                ("w", 40.0, 0.1, "fractional"),
                ("v", 39.0, 0.6, "fractional"),
            ],
            2,
            &[0, 1],
            &[2, 3],
        );
        let (grown, better, _) =
            improved(&classes, &models, &counts, deadline()).expect("the time-sliced GPU emptied");
        assert!(rows_hold(&grown, &better));
        assert_eq!(replicas(&better), replicas(&counts));
        assert_eq!(check(&grown, &better).0, 2);
    }

    /// Found by review: the same, but the third replica fits nowhere, so
    /// the attempt is undone: the ejection of a share placed in it must be
    /// undone before that placement (undone the other way, a GPU's share
    /// count went below zero).
    #[test]
    fn an_attempt_that_ejected_a_share_it_placed_is_undone_in_reverse() {
        let (classes, models, counts) = sliced(
            &[
                ("y", 17.0, 0.05, "fractional, timeslice"),
                ("x", 16.0, 0.25, "fractional, timeslice"),
                ("z", 15.0, 0.25, "fractional, timeslice"),
                ("w", 55.0, 0.1, "fractional"),
                ("v", 40.0, 0.8, "fractional"),
            ],
            4,
            &[0, 1, 2],
            &[3, 4],
        );
        assert!(improved(&classes, &models, &counts, deadline()).is_none());
    }
}
