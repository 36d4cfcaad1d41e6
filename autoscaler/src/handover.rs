//! Moves made before they break, for the Kubernetes backend: when a plan
//! moves a model's replicas from one placement variant to another, the
//! variants it scales down keep their replicas (serving) until the
//! variants it scales up have as many more ready, or until a deadline.
//! Pure: the backend reads the counts and the hold's annotations from the
//! Deployments each tick and writes what these functions say.
//!
//! Why a deadline: a new pod may need the GPU an old one holds (a MIG
//! geometry changed, a whole GPU turned into shares), and then it stays
//! Pending until the old one goes; past the deadline the old ones go
//! whatever is ready. The simulator makes the same hand-over with the GPUs
//! in view (`gpuscale-sim`'s engine: a replica moved off a GPU a new slot
//! takes stops first).

use std::collections::BTreeMap;
use std::time::Duration;

/// A hold on a variant the plan scaled down, as its annotations record
/// it: what the plan gave it, and when the hold ends whatever is ready
/// (Unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The count the plan gave the variant.
    pub planned: u32,
    /// The hold ends at this wall-clock time (Unix seconds).
    pub until: u64,
}

/// One variant Deployment of a model, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariantNow {
    /// The Deployment's name.
    pub name: String,
    /// `spec.replicas`.
    pub replicas: u32,
    /// `status.readyReplicas`.
    pub ready: u32,
    /// Its hold, when the plan scaled it down in a move.
    pub held: Option<Held>,
    /// Of its replicas, the spares (`gpuscale_packer::spare`).
    pub spares: u32,
}

/// The count the plan decided for a model: what its variants run, less
/// what holds keep above their plan and less their spares (a restarted
/// or new leader reads the decision, not the hand-over or the spares).
pub fn decided(variants: &[VariantNow]) -> u32 {
    variants
        .iter()
        .map(|v| {
            v.held
                .map_or(v.replicas, |h| h.planned.min(v.replicas))
                .saturating_sub(v.spares)
        })
        .sum()
}

/// How a plan's new counts are written: per variant (every one the model
/// runs now or the plan names) the count to set and the hold to record
/// (`None`: no hold, or a hold to clear). The successors are the
/// replicas the plan gives that are not ready yet, over every variant it
/// names (a ReplicaSet scaled down removes its pods not ready first);
/// the variants it scales down keep, in name order, as many of their
/// ready replicas above the plan's count as there are successors (never
/// for their own pods starting), each held until `deadline` from `at`
/// (or its earlier deadline, when it is held already). A scale-down in
/// the middle of a move so keeps what serves, as the simulator does.
pub fn start(
    now: &[VariantNow],
    planned: &BTreeMap<String, u32>,
    at: Duration,
    deadline: Duration,
) -> BTreeMap<String, (u32, Option<Held>)> {
    let running = |name: &str| now.iter().find(|v| v.name == name);
    let mut successors: u32 = planned
        .iter()
        .map(|(v, &p)| p.saturating_sub(running(v).map_or(0, |r| r.ready)))
        .sum();
    let until = (at + deadline).as_secs();
    let mut out = BTreeMap::new();
    let names: std::collections::BTreeSet<&str> = now
        .iter()
        .map(|v| v.name.as_str())
        .chain(planned.keys().map(String::as_str))
        .collect();
    for name in names {
        let p = planned.get(name).copied().unwrap_or(0);
        let (n, ready) = running(name).map_or((0, 0), |r| (r.replicas, r.ready.min(r.replicas)));
        let keep = n
            .saturating_sub(p)
            .min(ready.saturating_sub(p))
            .min(successors);
        successors -= keep;
        // A hold already running keeps its deadline: plans that follow
        // each other never put it off (a pod waiting for its GPU would
        // wait for ever).
        let until = running(name)
            .and_then(|r| r.held)
            .map_or(until, |h| h.until.min(until));
        let held = (keep > 0).then_some(Held { planned: p, until });
        out.insert(name.to_string(), (p + keep, held));
    }
    out
}

/// One tick of a model's hand-overs: per held variant whose count or hold
/// changes, the count to set and the hold that stays (`None`: the hold
/// ends, its annotations go). Held replicas stay while the other variants
/// have replicas not yet ready, at most one for each, and never past their
/// deadline.
pub fn advance(variants: &[VariantNow], now: Duration) -> Vec<(String, u32, Option<Held>)> {
    let mut waiting: u32 = variants
        .iter()
        .filter(|v| v.held.is_none())
        .map(|v| v.replicas.saturating_sub(v.ready))
        .sum();
    let mut out = Vec::new();
    for v in variants {
        let Some(h) = v.held else {
            continue;
        };
        let extra = v.replicas.saturating_sub(h.planned);
        let keep = if now.as_secs() >= h.until {
            0
        } else {
            // Only ready replicas are held (its pods starting again, say
            // after an eviction, go first when it is scaled down).
            extra.min(v.ready.saturating_sub(h.planned)).min(waiting)
        };
        waiting -= keep;
        let held = (keep > 0).then_some(h);
        if keep != extra || held.is_none() {
            out.push((v.name.clone(), h.planned.min(v.replicas) + keep, held));
        }
    }
    out
}

/// Whether writing `count` (with `held`, as [`start`] gives them) to the
/// variant `name` shrinks what runs or holds it: such writes come after
/// every write that grows a variant, so a failure part-way leaves more
/// replicas, never a hold whose successors were not written (the next
/// [`advance`] would end it, down to the plan's count, with nothing
/// starting in its place).
pub fn shrinks(read: &[VariantNow], name: &str, count: u32, held: Option<Held>) -> bool {
    let now = read
        .iter()
        .find(|r| r.name == name)
        .map_or(0, |r| r.replicas);
    held.is_some() || count < now
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_move_writes_what_grows_before_what_it_holds() {
        // b goes 3 → 1 in a move to a (0 → 2): b is held at 3.
        let read = running(&[("b", 3)]);
        let secs = Duration::from_secs;
        let writes = start(&read, &counts(&[("a", 2), ("b", 1)]), secs(100), secs(120));
        let (a, b) = (writes["a"], writes["b"]);
        assert_eq!(b.0, 3, "held at what runs");
        assert!(!shrinks(&read, "a", a.0, a.1));
        assert!(shrinks(&read, "b", b.0, b.1));
        // A plain scale-down shrinks; an unchanged count does not.
        assert!(shrinks(&read, "b", 2, None));
        assert!(!shrinks(&read, "b", 3, None));
    }

    fn counts(items: &[(&str, u32)]) -> BTreeMap<String, u32> {
        items.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// Variants running, all ready, none held.
    fn running(items: &[(&str, u32)]) -> Vec<VariantNow> {
        items.iter().map(|&(k, n)| v(k, n, n, None)).collect()
    }

    fn v(name: &str, replicas: u32, ready: u32, held: Option<(u32, u64)>) -> VariantNow {
        VariantNow {
            name: name.into(),
            replicas,
            ready,
            held: held.map(|(planned, until)| Held { planned, until }),
            spares: 0,
        }
    }

    #[test]
    fn the_decided_count_leaves_spares_out() {
        let mut a = v("a", 4, 4, None);
        a.spares = 1;
        let mut b = v("b", 3, 3, Some((1, 99)));
        b.spares = 1;
        // a: 4 − 1 spare; b: held at 3 for a plan of 1, of which 1 spare.
        assert_eq!(decided(&[a, b]), 3);
    }

    fn held(planned: u32, until: u64) -> Option<Held> {
        Some(Held { planned, until })
    }

    const NOW: Duration = Duration::from_secs(1_000);
    const WAIT: Duration = Duration::from_secs(120);

    #[test]
    fn a_move_keeps_the_old_replicas_until_the_new_ones_are_ready() {
        // 3 on whole GPUs move to 3 on MIG slices.
        let out = start(
            &running(&[("m-whole", 3)]),
            &counts(&[("m-mig", 3)]),
            NOW,
            WAIT,
        );
        let until = 1_120;
        assert_eq!(out["m-mig"], (3, None));
        assert_eq!(out["m-whole"], (3, held(0, until)));
        let read = [v("m-mig", 3, 0, None), v("m-whole", 3, 3, Some((0, until)))];
        assert_eq!(decided(&read), 3);
        assert!(advance(&read, NOW + Duration::from_secs(10)).is_empty());
        // Two of the new ones are ready: two old ones go.
        let read = [v("m-mig", 3, 2, None), v("m-whole", 3, 3, Some((0, until)))];
        assert_eq!(
            advance(&read, NOW + Duration::from_secs(40)),
            [("m-whole".to_string(), 1, held(0, until))]
        );
        // All ready: the hold ends.
        let read = [v("m-mig", 3, 3, None), v("m-whole", 1, 1, Some((0, until)))];
        assert_eq!(
            advance(&read, NOW + Duration::from_secs(50)),
            [("m-whole".to_string(), 0, None)]
        );
    }

    #[test]
    fn a_scale_down_or_a_scale_up_alone_holds_nothing() {
        let out = start(&running(&[("a", 5)]), &counts(&[("a", 2)]), NOW, WAIT);
        assert_eq!(out["a"], (2, None));
        let out = start(&running(&[("a", 2)]), &counts(&[("a", 5)]), NOW, WAIT);
        assert_eq!(out["a"], (5, None));
    }

    #[test]
    fn no_more_are_held_than_the_plan_adds_elsewhere() {
        // 4 leave `a`, 1 leaves `b`, 2 start on `c`: the model shrinks by
        // 3, so only 2 old replicas (of `a`, first by name) serve on.
        let out = start(
            &running(&[("a", 4), ("b", 1)]),
            &counts(&[("b", 0), ("c", 2)]),
            NOW,
            WAIT,
        );
        assert_eq!(out["a"], (2, held(0, 1_120)));
        assert_eq!(out["b"], (0, None));
        assert_eq!(out["c"], (2, None));
    }

    #[test]
    fn a_new_plan_mid_move_keeps_holding_for_the_successors_still_starting() {
        // 3 move from `a` to `b`; 1 of `b`'s is ready when the autoscaler
        // adds a fourth: `a` keeps 2 for `b`'s 2 still starting and 1 for
        // the new one, not 1 for the new one alone.
        let now = [v("a", 3, 3, Some((0, 1_120))), v("b", 3, 1, None)];
        let out = start(&now, &counts(&[("a", 0), ("b", 4)]), NOW, WAIT);
        assert_eq!(out["b"], (4, None));
        assert_eq!(out["a"], (3, held(0, 1_120)));
    }

    #[test]
    fn a_scale_down_mid_move_keeps_the_replicas_that_serve() {
        // 3 held on `a` for `b`, of whose 3 one is ready; the model goes
        // to 2: `b` keeps 1 ready and 1 starting, so `a` holds 1 (the
        // model serves 2, not 1).
        let now = [v("a", 3, 3, Some((0, 1_100))), v("b", 3, 1, None)];
        let out = start(&now, &counts(&[("a", 0), ("b", 2)]), NOW, WAIT);
        assert_eq!(out["b"], (2, None));
        assert_eq!(out["a"], (1, held(0, 1_100)));
        // A variant never holds for its own pods starting: 6 on `a`, 3 of
        // them ready, all moved to `b`: `a` keeps its 3 ready ones.
        let now = [v("a", 6, 3, None)];
        let out = start(&now, &counts(&[("a", 0), ("b", 6)]), NOW, WAIT);
        assert_eq!(out["a"], (3, held(0, 1_120)));
    }

    #[test]
    fn the_deadline_ends_a_hold_whatever_is_ready() {
        // A new pod that needs the old one's GPU stays Pending: the old
        // one goes at the deadline.
        let read = [v("new", 1, 0, None), v("old", 1, 1, Some((0, 1_120)))];
        assert!(advance(&read, Duration::from_secs(1_119)).is_empty());
        assert_eq!(
            advance(&read, Duration::from_secs(1_120)),
            [("old".to_string(), 0, None)]
        );
    }

    #[test]
    fn the_decided_count_leaves_out_what_is_held() {
        let read = [v("a", 2, 2, Some((1, 1_120))), v("b", 3, 1, None)];
        assert_eq!(decided(&read), 4);
    }
}
