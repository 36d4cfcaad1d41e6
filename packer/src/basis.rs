//! A plan's proven LP bound, carried to the next re-plan.
//!
//! The bound a plan reports is the LP relaxation over every pattern (every
//! MIG geometry, share count and fractional mix), a function of the
//! models, the options, the GPU catalogue, the classes with their node
//! counts, and the demand: not of what runs now. That LP only grows when
//! demand grows (drop the extra replicas from any solution of the larger
//! demand and it solves the smaller one at no more cost) and when nodes go
//! away (fewer nodes only remove solutions). So the bound proven for one
//! plan is still a valid bound for a later re-plan whose demand is at
//! least as large, model by model, on a cluster with the same classes or a
//! subset of their nodes, under the same policies and options. The
//! [`Basis`] records exactly those inputs, and [`Basis::admits`] checks
//! them.
//!
//! With an admitted basis, a re-plan that adds replicas on top of what
//! runs at no extra cost (free slots and shares of GPUs already in use)
//! skips pattern generation and the solves: it is the plan the full
//! re-plan would pick (keeping what runs wins every tie), and its bound
//! is the carried one. Anything else, and any input the basis does not
//! match, takes the full path.

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
    /// What one more replica of each model adds to the cost LP at least,
    /// when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<BasisPrices>,
}

/// The cost LP's demand prices ([`crate::ilp::Prices`]): on the same
/// classes, `LP(D') ≥ base + Σm models[m]·(D'[m] − demand[m])` for any
/// demand `D'`, and `LP(demand) ≤ upper`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BasisPrices {
    /// The dual bound the prices pair with.
    pub base: f64,
    /// The LP over the patterns the solve had: at least the LP's value.
    pub upper: f64,
    /// Per model, its price.
    pub models: BTreeMap<String, f64>,
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
            // A model with no demand has no replica columns in the LP, so
            // its row's dual says nothing: 0 is feasible for it (adding its
            // columns back), and the LP only rises with demand.
            prices: solved.prices.as_ref().map(|p| BasisPrices {
                base: p.base,
                upper: p.upper,
                models: models
                    .iter()
                    .zip(demand)
                    .zip(&p.per_model)
                    .map(|((m, &d), &y)| (m.name.clone(), if d > 0 { y } else { 0.0 }))
                    .collect(),
            }),
        }
    }

    /// A lower bound on the cost LP of `demand` over `classes` from the
    /// prices (`base + Σm price[m]·(demand[m] − basis[m])`), or `None`
    /// without prices or unless the classes are the basis's with all
    /// their nodes (the prices' dual bound is for those capacities).
    pub fn priced_bound(&self, classes: &[Class], models: &[Model], demand: &[u32]) -> Option<f64> {
        let prices = self.prices.as_ref()?;
        let whole = classes.len() == self.classes.len()
            && classes.iter().all(|c| {
                let key = class_key(c);
                self.classes.iter().any(|b| {
                    (
                        &b.gpu_model,
                        b.gpus_per_node,
                        &b.sharing,
                        &b.catalog,
                        b.nodes,
                    ) == (
                        &key.gpu_model,
                        key.gpus_per_node,
                        &key.sharing,
                        &key.catalog,
                        key.nodes,
                    )
                })
            });
        if !whole {
            return None;
        }
        let rise: f64 = models
            .iter()
            .zip(demand)
            .map(|(m, &d)| {
                let was = *self.demand.get(&m.name)?;
                let price = prices.models.get(&m.name).copied().unwrap_or(0.0);
                Some(price * (f64::from(d) - f64::from(was)))
            })
            .sum::<Option<f64>>()?;
        Some(prices.base + rise)
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
                    .find(|b| {
                        (&b.gpu_model, b.gpus_per_node, &b.sharing, &b.catalog)
                            == (
                                &key.gpu_model,
                                key.gpus_per_node,
                                &key.sharing,
                                &key.catalog,
                            )
                            && key.nodes <= b.nodes
                    })
                    .map(|b| b.lp_gpus)
            })
            .collect()
    }
}

fn class_key(class: &Class) -> BasisClass {
    BasisClass {
        gpu_model: class.gpu_model.clone(),
        gpus_per_node: class.gpus_per_node,
        sharing: class.allows.clone(),
        catalog: digest(&format!(
            "{:?}|{:?}|{:?}|{:?}",
            class.price, class.usable_gib, class.compute, class.mig
        )),
        nodes: class.nodes.len() as u32,
        lp_gpus: 0.0,
    }
}

/// The models (every field, in order) and the options that shape the LP
/// (not the clocks, the gap or the log).
fn policies_digest(models: &[Model], options: &PackOptions) -> String {
    let shaping = PackOptions {
        time_limit: Default::default(),
        improve_limit: Default::default(),
        mip_rel_gap: 0.0,
        solver_log: false,
        ..options.clone()
    };
    digest(&format!("{models:?}|{shaping:?}"))
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
