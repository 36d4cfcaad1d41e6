//! Each baseline on hand-made step inputs, against the behaviour its
//! upstream documents (Kubernetes' HPA walkthrough and API reference,
//! KEDA's ScaledObject reference, Knative's autoscaler configuration):
//! the expected counts below are worked out from those documents, not
//! from the code under test.

use std::collections::BTreeMap;
use std::time::Duration;

use gpuscale_autoscaler::Observation;
use gpuscale_policies::Model;
use gpuscale_policies::load::load_sources;
use gpuscale_sim::control::{Autoscaler, Hpa, HpaSettings, Keda, KedaSettings, Kpa, KpaSettings};

fn model(min: u32, max: u32, target: f64, concurrency: u32) -> Model {
    let text = format!(
        "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata: {{name: m}}\nspec:\n  servedName: m\n  resources: {{memoryGiB: 10, compute: 0.2, maxConcurrency: {concurrency}}}\n  scaling: {{minReplicas: {min}, maxReplicas: {max}, targetQueueDepth: {target}}}\n"
    );
    let b = load_sources(&[(std::path::Path::new("m.yaml"), text.as_str())]).unwrap();
    b.models[0].clone()
}

/// Steps `a` once per second from `from` to `to` (exclusive) with a load
/// of `load(t)` requests in flight plus waiting, applying its decisions;
/// returns (time, count) after every decision that changed the count.
fn drive(
    a: &mut dyn Autoscaler,
    current: &mut u32,
    from: u64,
    to: u64,
    load: impl Fn(u64) -> f64,
) -> Vec<(u64, u32)> {
    let mut changes = Vec::new();
    for t in from..to {
        let mut obs = BTreeMap::new();
        obs.insert(
            "m".to_string(),
            Observation {
                in_flight: load(t),
                ..Observation::default()
            },
        );
        let cur: BTreeMap<String, u32> = [("m".to_string(), *current)].into();
        if let Some(d) = a.step(Duration::from_secs(t), &obs, &cur, &cur)
            && d["m"] != *current
        {
            *current = d["m"];
            changes.push((t, *current));
        }
    }
    changes
}

#[test]
fn hpa_scales_up_by_the_larger_of_double_and_four_pods_per_period() {
    // Target 10 per replica, 2 replicas, load 300: the metric asks for 30.
    // Default scale-up: max(100 %, 4 pods) per 15 s, no stabilisation —
    // from 2: 6 (2 + 4 > 2 × 2), then 12, then 24, then 30.
    let m = model(1, 100, 10.0, 10);
    let mut hpa = Hpa::new(std::slice::from_ref(&m), HpaSettings::default());
    let mut n = 2;
    let changes = drive(&mut hpa, &mut n, 0, 80, |_| 300.0);
    let counts: Vec<u32> = changes.iter().map(|c| c.1).collect();
    assert_eq!(counts, vec![6, 12, 24, 30], "{changes:?}");
    // Syncs 15 s apart, the first 5 s after the first scrape.
    let times: Vec<u64> = changes.iter().map(|c| c.0).collect();
    assert_eq!(times, vec![5, 20, 35, 50]);
}

#[test]
fn hpa_waits_the_300_second_window_before_scaling_down_and_ignores_ten_percent() {
    let m = model(1, 100, 10.0, 10);
    let mut hpa = Hpa::new(std::slice::from_ref(&m), HpaSettings::default());
    let mut n = 10;
    // At target: nothing. 10 % over (110 for 10 replicas): within the
    // tolerance, nothing.
    assert!(drive(&mut hpa, &mut n, 0, 100, |_| 100.0).is_empty());
    assert!(drive(&mut hpa, &mut n, 100, 200, |_| 109.0).is_empty());
    // The load drops to 20 at 200 s: the last recommendation of 10 (or
    // more) stays in the 300 s window until it ages out.
    let changes = drive(&mut hpa, &mut n, 200, 700, |_| 20.0);
    assert_eq!(changes.len(), 1, "{changes:?}");
    let (t, count) = changes[0];
    assert_eq!(count, 2);
    // The last sync that recommended 10 was at 185 s (scrape at 180 s
    // still saw 109); 300 s later is 485 s, and the first sync after it
    // is at 500 s.
    assert_eq!(t, 500, "{changes:?}");
}

#[test]
fn hpa_records_the_current_count_at_its_first_sync_and_holds_it_for_the_window() {
    // Upstream `recordInitialRecommendation`: the first reconcile of a
    // new HPA stores the target's current replicas as a recommendation,
    // so a warm start of 6 with a load that asks for 2 stays at 6 until
    // that recommendation leaves the 300 s scale-down window. The first
    // sync is at 5 s (the scrape lag); a recommendation stands while its
    // time is after `now - 300 s`, so 5 s no longer counts at 305 s.
    let m = model(1, 100, 10.0, 10);
    let mut hpa = Hpa::new(std::slice::from_ref(&m), HpaSettings::default());
    let mut n = 6;
    let changes = drive(&mut hpa, &mut n, 0, 400, |_| 20.0);
    assert_eq!(changes, vec![(305, 2)]);
}

#[test]
fn kpa_keeps_a_warm_start_until_its_stable_window_holds_a_minute() {
    // The simulation starts with nothing in flight; a KPA that ran
    // before it would average a minute of the load then. 4 replicas at
    // target 7 each: the load ramps from 0 to 28 over 10 s. Without the
    // warm start, the first tick's empty window halved the count (the
    // `max-scale-down-rate` of 2).
    let m = model(1, 100, 5.0, 10);
    let mut kpa = Kpa::new(std::slice::from_ref(&m), KpaSettings::default());
    let mut n = 4;
    let ramp = |t: u64| (t as f64 * 2.8).min(28.0);
    assert!(drive(&mut kpa, &mut n, 0, 120, ramp).is_empty());
    // After the first minute the window decides. The load falls to 7 at
    // 120 s: with k samples of 7 and 60 − k of 28 in the stable window,
    // the count is ⌈(28 (60 − k) + 7 k) / 60 / 7⌉ = ⌈4 − k / 20⌉, which
    // reaches 3 at k = 20 (the 2 s tick at 140 s, k = 21), 2 at k = 40
    // (160 s) and 1 at k = 60 (180 s).
    let changes = drive(&mut kpa, &mut n, 120, 300, |_| 7.0);
    assert_eq!(changes, vec![(140, 3), (160, 2), (180, 1)]);
}

#[test]
fn keda_activates_at_its_poll_and_goes_to_zero_after_the_cooldown() {
    let m = model(0, 10, 5.0, 10);
    let mut keda = Keda::new(
        std::slice::from_ref(&m),
        HpaSettings::default(),
        KedaSettings::default(),
    );
    let mut n = 0;
    // Work arrives at 40 s (load 3 > activation 0); the poll at 60 s sees
    // it in the 45 s scrape and activates to 1. HPA then sizes it: 3 / 5
    // per replica needs 1.
    let changes = drive(
        &mut keda,
        &mut n,
        0,
        100,
        |t| if t >= 40 { 3.0 } else { 0.0 },
    );
    assert_eq!(changes, vec![(60, 1)]);
    // Idle from 100 s: the last poll that saw activity is at 90 s (scrape
    // at 90 s); the cooldown of 300 s ends at 390 s, the next poll.
    let changes = drive(&mut keda, &mut n, 100, 500, |_| 0.0);
    assert_eq!(changes.last(), Some(&(390, 0)), "{changes:?}");
}

#[test]
fn keda_takes_a_model_never_active_to_zero_at_its_first_poll() {
    // `initialCooldownPeriod` defaults to 0: a ScaledObject whose trigger
    // has never been active scales its target to zero at once.
    let m = model(0, 10, 5.0, 10);
    let mut keda = Keda::new(
        std::slice::from_ref(&m),
        HpaSettings::default(),
        KedaSettings::default(),
    );
    let mut n = 2;
    assert_eq!(drive(&mut keda, &mut n, 0, 10, |_| 0.0), vec![(0, 0)]);
}

#[test]
fn kpa_panics_at_twice_its_capacity_and_never_scales_down_in_panic() {
    // Concurrency 10 per replica at 70 %: target 7 per replica.
    let m = model(1, 100, 5.0, 10);
    let mut kpa = Kpa::new(std::slice::from_ref(&m), KpaSettings::default());
    let mut n = 2;
    // 14 in flight on 2 replicas = target: steady.
    assert!(drive(&mut kpa, &mut n, 0, 120, |_| 14.0).is_empty());
    assert!(!kpa.in_panic("m"));
    // A burst to 70 (10 replicas' worth, 5× the ready 2): the 6 s panic
    // window's average crosses 2× the capacity at once — panic, and the
    // count jumps at the next 2 s tick to what the panic window asks.
    let changes = drive(&mut kpa, &mut n, 120, 130, |_| 70.0);
    assert!(kpa.in_panic("m"));
    assert!(!changes.is_empty());
    let (t, first) = changes[0];
    assert!(t <= 122, "{changes:?}");
    assert!(first >= 4, "{changes:?}");
    // The burst ends. While in panic the count never falls; panic ends a
    // stable window (60 s) after the last tick over the threshold, which
    // was at most at 130 s and at least at the onset, 120 s.
    let peak = n;
    let mut ended = None;
    let mut after = Vec::new();
    for t in 130..400 {
        let c = drive(&mut kpa, &mut n, t, t + 1, |_| 7.0);
        if kpa.in_panic("m") {
            assert!(n >= peak, "fell to {n} in panic at {t}");
        } else {
            ended.get_or_insert(t);
            after.extend(c);
        }
    }
    let ended = ended.expect("panic ends");
    assert!((180..=192).contains(&ended), "panic ended at {ended}");
    // Back to the stable window's answer, 1, down at most to
    // floor(ready ÷ 2) per tick (max-scale-down-rate 2).
    assert_eq!(after.last().map(|c| c.1), Some(1), "{after:?}");
    let mut last = peak;
    for &(_, c) in &after {
        assert!(c >= last / 2, "{after:?}");
        last = c;
    }
}
