//! A plan's proven LP bound, carried to the next re-plan.
//!
//! The bound a plan reports is the LP relaxation over every pattern (every
//! MIG geometry, share count and fractional mix), a function of the
//! models, the options, the GPU catalogue, the classes with their node
//! counts, and the demand; what runs now adds its fractional mixes as
//! patterns, which hold no more of a model than its demand as long as
//! demand is at least what runs (the one case [`crate::pack_from`] carries
//! a bound in; after a scale-down a running mix could undercut the capped
//! mixes, and the full path is taken). That LP never falls when
//! demand grows or nodes go away. Fewer nodes only remove solutions. For
//! more demand, take an optimal solution of the larger demand `D'` and keep
//! its GPU counts: each model's slots still cover the smaller `D`, also
//! where a fractional mix holds more of a model's shares than `D` allows
//! (mixes are capped at the demand): capped at `D`, a mix keeps at least
//! `D/D'` of them, and `Σ min(c, D)·n ≥ (D/D')·Σ c·n ≥ D`. So it solves
//! the smaller demand at the same cost. The bound proven for one plan thus
//! holds for a later re-plan whose demand is at least as large, model by
//! model, on the same classes or a subset of their nodes, under the same
//! policies and options. The [`Basis`] records exactly those inputs, and
//! [`Basis::admits`] checks them.
//!
//! With an admitted basis, a re-plan that keeps everything running and
//! adds the new replicas on top at an extra cost within the MIP gap of the
//! carried bound skips pattern generation and the solves. The full path
//! keeps what runs under a looser rule (extra cost up to the LP's own rise
//! plus the gap), so the shortcut takes only what that rule allows.
//! Anything else, and any input the basis does not match, takes the full
//! path.
//!
//! The LP's dual prices of the replicas would bound its rise too, but not
//! soundly here: the fractional mixes a solve prices are capped at that
//! solve's demand, so a larger demand brings mixes its duals never priced.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use gpuscale_policies::{Model, SharingMode};
use serde::{Deserialize, Serialize};

use crate::PackOptions;
use crate::classes::Class;
use crate::ilp::Solved;

/// What a plan's LP bound was proven for, and the bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Basis {
    /// Replicas wanted per model.
    pub demand: BTreeMap<String, u32>,
    /// The GPU classes the LP ran over, with their node counts.
    pub classes: Vec<BasisClass>,
    /// Digest of the models' policies and the packing options.
    pub policies: String,
    /// The LP lower bound on cost per hour.
    pub lp_cost: f64,
    /// The LP lower bound on GPUs.
    pub lp_gpus: f64,
    /// The cost of the plan HiGHS proved within `proven_gap` of the best
    /// for this demand (against its branch-and-bound bound, which can be
    /// tighter than `lp_cost`); `None`: not proven so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proven_cost: Option<f64>,
    /// The relative gap of that proof.
    #[serde(default)]
    pub proven_gap: f64,
}

/// One class of the basis: its key, its catalogue facts and its nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BasisClass {
    /// GPU model.
    pub gpu_model: String,
    /// Healthy GPUs per node.
    pub gpus_per_node: u32,
    /// Sharing mechanisms the nodes allow.
    pub sharing: Vec<SharingMode>,
    /// Digest of the GPU model's catalogue entry (price, memory, compute,
    /// MIG profiles).
    pub catalog: String,
    /// Nodes in the class.
    pub nodes: u32,
    /// GPUs of the class in the cost LP's solution.
    pub lp_gpus: f64,
}

impl Basis {
    /// The basis of the bound `solved` proved over `classes` for `demand`.
    pub fn new(
        classes: &[Class],
        models: &[Model],
        demand: &[u32],
        options: &PackOptions,
        solved: &Solved,
    ) -> Basis {
        Basis {
            demand: models
                .iter()
                .zip(demand)
                .map(|(m, &d)| (m.name.clone(), d))
                .collect(),
            classes: classes
                .iter()
                .zip(&solved.lp_class_gpus)
                .map(|(c, &lp)| BasisClass {
                    lp_gpus: lp,
                    ..class_key(c)
                })
                .collect(),
            policies: policies_digest(models, options),
            lp_cost: solved.lp_cost,
            lp_gpus: solved.lp_gpus,
            proven_cost: solved
                .optimal
                .then(|| crate::ilp::counts_cost(classes, models, &solved.counts)),
            proven_gap: options.mip_rel_gap,
        }
    }

    /// Whether a plan of `cost` for `demand` (parallel to `models`) is
    /// as good as the one this basis's solve proved within the gap
    /// `mip_rel_gap` allows: the same demand, no dearer, and proven
    /// within that gap or a tighter one.
    pub fn proves(&self, models: &[Model], demand: &[u32], cost: f64, mip_rel_gap: f64) -> bool {
        let same = self.demand.len() == models.len()
            && models
                .iter()
                .zip(demand)
                .all(|(m, &d)| self.demand.get(&m.name) == Some(&d));
        same && self.proven_gap <= mip_rel_gap && self.proven_cost.is_some_and(|p| cost <= p + 1e-6)
    }

    /// Whether the bound holds for `demand` over `classes`: the same
    /// policies and options, every model's demand at least the basis's,
    /// and every class one of the basis's with at most its nodes. The
    /// basis's per-class LP GPU counts, in the order of `classes`, when
    /// it does.
    pub fn admits(
        &self,
        classes: &[Class],
        models: &[Model],
        demand: &[u32],
        options: &PackOptions,
    ) -> Option<Vec<f64>> {
        if self.policies != policies_digest(models, options)
            || self.demand.len() != models.len()
            || models
                .iter()
                .zip(demand)
                .any(|(m, &d)| self.demand.get(&m.name).is_none_or(|&was| d < was))
        {
            return None;
        }
        classes
            .iter()
            .map(|c| {
                let key = class_key(c);
                self.classes
                    .iter()
                    .find(|b| b.setup() == key.setup() && key.nodes <= b.nodes)
                    .map(|b| b.lp_gpus)
            })
            .collect()
    }

    /// Whether `classes`, `models` and `options` are the set-up this basis
    /// was proven for: the same policies and options, and the same classes
    /// ([`BasisClass::setup`], and node counts). Demand may differ. A plan
    /// made for another set-up (a node added or lost, an option or a
    /// policy changed) is no guide to this one: the re-plan solves in full.
    pub fn same_setup(&self, classes: &[Class], models: &[Model], options: &PackOptions) -> bool {
        let keys: Vec<BasisClass> = classes.iter().map(class_key).collect();
        let mut had: Vec<_> = self.classes.iter().map(|b| (b.setup(), b.nodes)).collect();
        let mut now: Vec<_> = keys.iter().map(|b| (b.setup(), b.nodes)).collect();
        had.sort();
        now.sort();
        self.policies == policies_digest(models, options) && had == now
    }
}

impl BasisClass {
    /// What identifies the class apart from its size: GPU model, GPUs per
    /// node, sharing, and the digest of its catalogue entry and HAMi's
    /// split count.
    fn setup(&self) -> (&str, u32, &[SharingMode], &str) {
        (
            &self.gpu_model,
            self.gpus_per_node,
            &self.sharing,
            &self.catalog,
        )
    }
}

fn class_key(class: &Class) -> BasisClass {
    BasisClass {
        gpu_model: class.gpu_model.clone(),
        gpus_per_node: class.gpus_per_node,
        sharing: class.allows.clone(),
        catalog: digest(&format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}",
            class.price, class.usable_gib, class.compute, class.mig, class.fractional
        )),
        nodes: class.nodes.len() as u32,
        lp_gpus: 0.0,
    }
}

/// The models (every field, in order) and the options that shape the LP
/// (not the clocks, the gap, the log or whether running replicas are
/// kept).
/// The packer's version is in it too: a plan from another build (whose LP
/// may differ) is solved in full.
fn policies_digest(models: &[Model], options: &PackOptions) -> String {
    let shaping = PackOptions {
        time_limit: Default::default(),
        improve_limit: Default::default(),
        mip_rel_gap: 0.0,
        solver_log: false,
        keep_running: false,
        ..options.clone()
    };
    digest(&format!(
        "{}|{models:?}|{shaping:?}",
        env!("CARGO_PKG_VERSION")
    ))
}

/// 64-bit FNV-1a, in hex: stable across runs, builds and platforms (a
/// mismatch only sends a re-plan the full way).
fn digest(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut out = String::with_capacity(16);
    let _ = write!(out, "{h:016x}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_fnv1a() {
        // FNV-1a 64 test vectors (Fowler, Noll, Vo: the reference code's
        // test suite).
        assert_eq!(digest(""), "cbf29ce484222325");
        assert_eq!(digest("a"), "af63dc4c8601ec8c");
        assert_eq!(digest("foobar"), "85944171f73967e8");
    }
}
