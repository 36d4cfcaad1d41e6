//! One decision round over every model, pure: the recommender for each
//! model (a backend's replica cap taken as its `maxReplicas`), then the
//! packer's answer taken back (a model whose replicas did not all fit gets
//! what was placed, and says why). The controller and the trace-driven
//! simulator (`gpuscale-sim`) run their rounds through these two functions,
//! so the simulator measures the code that runs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use gpuscale_packer::Plan;
use gpuscale_policies::Model;

use crate::recommend::{Observation, Recommendation, State, Tuning, recommend};

/// Recommendations for every model, by policy name. `observations` is
/// keyed by served model name and is `None` when the read failed; `cap`
/// is the most replicas the backend runs per model.
pub fn recommend_all(
    models: &[Model],
    observations: Option<&BTreeMap<String, Observation>>,
    tuning: &Tuning,
    states: &mut BTreeMap<String, State>,
    cap: Option<u32>,
    now: Duration,
) -> BTreeMap<String, Recommendation> {
    let mut recs = BTreeMap::new();
    for m in models {
        let o = observations.and_then(|o| o.get(&m.served_name));
        let state = states.entry(m.name.clone()).or_default();
        // A backend limit below the policy's maxReplicas is the
        // recommender's maxReplicas: the count it decides (and works from
        // next time, and records in its scale events) is the one that runs.
        let rec = match cap {
            Some(cap) if cap < m.scaling.max_replicas => {
                // Below minReplicas too: the cap is what can run.
                let mut bounded = m.clone();
                bounded.scaling.max_replicas = cap;
                bounded.scaling.min_replicas = bounded.scaling.min_replicas.min(cap);
                // What it would be without the cap (on a copy of the
                // memory), to say when the cap is what decided.
                let unbounded = recommend(o, m, tuning, &mut state.clone(), now);
                let mut rec = recommend(o, &bounded, tuning, state, now);
                if unbounded.replicas > cap {
                    let _ = write!(rec.reason, "; capped at {cap} by local.maxReplicasPerModel");
                }
                rec
            }
            _ => recommend(o, m, tuning, state, now),
        };
        recs.insert(m.name.clone(), rec);
    }
    recs
}

/// Takes a plan's placement back into the round: a model with fewer
/// replicas placed than wanted gets the placed count (in `desired`, its
/// recommendation with the packer's reason, and the state the recommender
/// works from next time).
pub fn take_placement(
    plan: &Plan,
    desired: &mut BTreeMap<String, u32>,
    recs: &mut BTreeMap<String, Recommendation>,
    states: &mut BTreeMap<String, State>,
) {
    for mp in &plan.models {
        if mp.placed < mp.wanted {
            let why = plan
                .unplaced
                .iter()
                .find(|u| u.model == mp.name)
                .map(|u| u.reason.clone())
                .unwrap_or_default();
            desired.insert(mp.name.clone(), mp.placed);
            if let Some(r) = recs.get_mut(&mp.name) {
                r.replicas = mp.placed;
                r.reason = format!("{}; only {} placed: {why}", r.reason, mp.placed);
            }
            if let Some(s) = states.get_mut(&mp.name) {
                s.current = mp.placed;
            }
        }
    }
}
