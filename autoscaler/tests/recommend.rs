//! The recommender against a transcription of HPA's documented algorithm
//! (property test), and in simulated-time scenarios: a burst, a noisy
//! steady queue, scale to zero, a metric outage, activation from zero.

use std::path::Path;
use std::time::Duration;

use gpuscale_autoscaler::{Mode, Observation, State, Tuning, recommend};
use gpuscale_policies::Model;
use gpuscale_policies::model::{RatePolicy, RatePolicyType, ResolvedRules, SelectPolicy};
use proptest::prelude::*;

fn model(scaling: &str) -> Model {
    let text = format!(
        "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: m\nspec:\n  resources:\n    memoryGiB: 10\n    compute: 0.1\n    maxConcurrency: 8\n  scaling:\n{scaling}"
    );
    let bundle = gpuscale_policies::load::load_sources(&[(Path::new("m.yaml"), &text)])
        .unwrap_or_else(|p| panic!("{p}"));
    bundle.models.into_iter().next().unwrap()
}

fn queue(depth: f64) -> Observation {
    Observation {
        waiting: (depth - depth.min(8.0)).max(0.0),
        in_flight: depth.min(8.0),
        ..Observation::default()
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// HPA's algorithm as documented (and as `pkg/controller/podautoscaler`
/// implements it), written out literally: usage ratio with tolerance,
/// stabilisation over recorded recommendations, rate policies over
/// recorded scale events, min/max.
struct Hpa {
    current: i64,
    recommendations: Vec<(f64, i64)>,
    up_events: Vec<(f64, i64)>,
    down_events: Vec<(f64, i64)>,
}

impl Hpa {
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        now: f64,
        total: f64,
        target: f64,
        min: i64,
        max: i64,
        tolerance: f64,
        up: &ResolvedRules,
        down: &ResolvedRules,
    ) -> i64 {
        // computeReplicasForMetric: average per pod over the target.
        let usage_ratio = (total / self.current as f64) / target;
        let proposal = if (1.0 - usage_ratio).abs() <= tolerance {
            self.current
        } else {
            (usage_ratio * self.current as f64).ceil() as i64
        };
        // stabilizeRecommendationWithBehaviors.
        let up_cutoff = now - up.stabilization_window.as_secs_f64();
        let down_cutoff = now - down.stabilization_window.as_secs_f64();
        let mut up_rec = proposal;
        let mut down_rec = proposal;
        for &(t, r) in &self.recommendations {
            if t > up_cutoff {
                up_rec = up_rec.min(r);
            }
            if t > down_cutoff {
                down_rec = down_rec.max(r);
            }
        }
        self.recommendations.push((now, proposal));
        let mut rec = self.current;
        if rec < up_rec {
            rec = up_rec;
        }
        if rec > down_rec {
            rec = down_rec;
        }
        // convertDesiredReplicasWithBehaviorRate.
        let changed = |events: &[(f64, i64)], period: f64| -> i64 {
            events
                .iter()
                .filter(|(t, _)| *t > now - period)
                .map(|(_, c)| c)
                .sum()
        };
        let mut desired = rec;
        if desired > self.current {
            let mut maximum_allowed = max;
            if up.select_policy == SelectPolicy::Disabled {
                maximum_allowed = self.current;
            } else {
                let mut limit = if up.select_policy == SelectPolicy::Min {
                    i64::MAX
                } else {
                    i64::MIN
                };
                for p in &up.policies {
                    let period = p.period.as_secs_f64();
                    let start = self.current - changed(&self.up_events, period)
                        + changed(&self.down_events, period);
                    let proposed = match p.kind {
                        RatePolicyType::Pods => start + i64::from(p.value),
                        RatePolicyType::Percent => {
                            (start as f64 * (1.0 + f64::from(p.value) / 100.0)).ceil() as i64
                        }
                    };
                    limit = if up.select_policy == SelectPolicy::Min {
                        limit.min(proposed)
                    } else {
                        limit.max(proposed)
                    };
                }
                if maximum_allowed > limit {
                    maximum_allowed = limit;
                }
            }
            if desired > maximum_allowed {
                desired = maximum_allowed;
            }
        } else if desired < self.current {
            let mut minimum_allowed = min;
            if down.select_policy == SelectPolicy::Disabled {
                minimum_allowed = self.current;
            } else {
                let mut limit = if down.select_policy == SelectPolicy::Min {
                    i64::MIN
                } else {
                    i64::MAX
                };
                for p in &down.policies {
                    let period = p.period.as_secs_f64();
                    let start = self.current - changed(&self.up_events, period)
                        + changed(&self.down_events, period);
                    let proposed = match p.kind {
                        RatePolicyType::Pods => start - i64::from(p.value),
                        RatePolicyType::Percent => {
                            (start as f64 * (1.0 - f64::from(p.value) / 100.0)) as i64
                        }
                    };
                    limit = if down.select_policy == SelectPolicy::Min {
                        limit.max(proposed)
                    } else {
                        limit.min(proposed)
                    };
                }
                if minimum_allowed < limit {
                    minimum_allowed = limit;
                }
            }
            if desired < minimum_allowed {
                desired = minimum_allowed;
            }
        }
        desired = desired.clamp(min, max);
        if desired > self.current {
            self.up_events.push((now, desired - self.current));
        } else if desired < self.current {
            self.down_events.push((now, self.current - desired));
        }
        self.current = desired;
        desired
    }
}

fn arb_rules(up: bool) -> impl Strategy<Value = ResolvedRules> {
    let policy = (
        prop_oneof![Just(RatePolicyType::Pods), Just(RatePolicyType::Percent)],
        1u32..200,
        5u64..120,
    )
        .prop_map(|(kind, value, period)| RatePolicy {
            kind,
            value,
            period: Duration::from_secs(period),
        });
    (
        0u64..400,
        prop_oneof![
            4 => Just(SelectPolicy::Max),
            2 => Just(SelectPolicy::Min),
            1 => Just(SelectPolicy::Disabled)
        ],
        prop::collection::vec(policy, 1..3),
    )
        .prop_map(move |(window, select_policy, policies)| ResolvedRules {
            stabilization_window: Duration::from_secs(if up { window / 4 } else { window }),
            select_policy,
            policies,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// With panic, forecasting and SLO feedback out of the way, the
    /// recommender is HPA: same count at every step.
    #[test]
    fn matches_hpa(
        up in arb_rules(true),
        down in arb_rules(false),
        min in 1u32..4,
        span in 1u32..30,
        target in 1u32..16,
        start in 1u32..20,
        steps in prop::collection::vec((1u64..40, 0u32..400), 1..60),
    ) {
        let max = min + span;
        let mut m = model(&format!("    minReplicas: {min}\n    maxReplicas: {max}\n    targetQueueDepth: {target}\n"));
        m.scale_up = up.clone();
        m.scale_down = down.clone();
        let tuning = Tuning { panic_threshold: f64::INFINITY, ..Tuning::default() };
        let start = start.clamp(min, max);
        let mut state = State::new(start);
        let mut hpa = Hpa {
            current: i64::from(start),
            recommendations: Vec::new(),
            up_events: Vec::new(),
            down_events: Vec::new(),
        };
        let mut now = 1000u64;
        for (dt, depth) in steps {
            now += dt;
            let ours = recommend(Some(&queue(f64::from(depth))), &m, &tuning, &mut state, Duration::from_secs(now));
            let theirs = hpa.step(now as f64, f64::from(depth), f64::from(target), i64::from(min), i64::from(max), 0.1, &up, &down);
            prop_assert_eq!(i64::from(ours.replicas), theirs, "at t={} depth {}: {}", now, depth, ours.reason);
            prop_assert_eq!(ours.mode, Mode::Normal);
        }
    }
}

#[test]
fn a_ten_fold_burst_is_acted_on_within_a_second() {
    let m = model("    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n");
    let tuning = Tuning::default();
    let mut state = State::new(4);
    // Steady at 4 replicas × 8, observed every 100 ms (the push stream).
    let mut t = 0.0;
    while t < 600.0 {
        let r = recommend(Some(&queue(32.0)), &m, &tuning, &mut state, secs(t));
        assert_eq!(r.replicas, 4, "{}", r.reason);
        t += 0.1;
    }
    let burst = t;
    let mut acted = None;
    while t < burst + 5.0 {
        let r = recommend(Some(&queue(320.0)), &m, &tuning, &mut state, secs(t));
        if r.replicas > 4 && acted.is_none() {
            acted = Some((t - burst, r));
        }
        t += 0.1;
    }
    let (after, r) = acted.expect("scaled up");
    assert!(after < 1.0, "acted after {after:.1} s");
    assert_eq!(r.replicas, 40, "sized by the burst: {}", r.reason);
    assert_eq!(r.mode, Mode::Panic);
    assert!(r.reason.contains("panic since"), "{}", r.reason);
    // The burst ends: no scale-down while panic lasts (a stable window).
    let end = t;
    while t < end + 50.0 {
        let r = recommend(Some(&queue(40.0)), &m, &tuning, &mut state, secs(t));
        assert_eq!(r.replicas, 40, "at +{:.1} s: {}", t - end, r.reason);
        t += 0.1;
    }
}

#[test]
fn a_noisy_steady_queue_changes_at_most_once_per_ten_minutes() {
    let m = model("    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n");
    let tuning = Tuning::default();
    let mut state = State::new(10);
    // ±5 % around 80 (10 replicas' worth), deterministic noise, every second
    // for an hour.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut changes = Vec::new();
    let mut last = 10;
    for s in 0..3600u64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let noise = (seed % 1001) as f64 / 1000.0 * 0.1 - 0.05;
        let r = recommend(
            Some(&queue(80.0 * (1.0 + noise))),
            &m,
            &tuning,
            &mut state,
            Duration::from_secs(s),
        );
        if r.replicas != last {
            changes.push(s);
            last = r.replicas;
        }
    }
    for w in changes.windows(2) {
        assert!(w[1] - w[0] >= 600, "changes at {changes:?}");
    }
    assert!(changes.len() <= 6, "{changes:?}");
}

#[test]
fn scale_to_zero_waits_for_the_cooldown() {
    let m = model(
        "    minReplicas: 0\n    maxReplicas: 10\n    targetQueueDepth: 8\n    scaleToZeroAfter: 5m\n",
    );
    let tuning = Tuning::default();
    let mut state = State::new(2);
    for s in 0..100u64 {
        recommend(
            Some(&queue(16.0)),
            &m,
            &tuning,
            &mut state,
            Duration::from_secs(s),
        );
    }
    let idle = 100u64;
    for s in idle..idle + 300 {
        let r = recommend(
            Some(&queue(0.0)),
            &m,
            &tuning,
            &mut state,
            Duration::from_secs(s),
        );
        assert!(r.replicas >= 1, "to zero at +{} s: {}", s - idle, r.reason);
    }
    let r = recommend(
        Some(&queue(0.0)),
        &m,
        &tuning,
        &mut state,
        Duration::from_secs(idle + 300),
    );
    assert_eq!(r.replicas, 0, "{}", r.reason);
    assert_eq!(r.mode, Mode::ScaledToZero);
    // And back from zero on the next request.
    let r = recommend(
        Some(&queue(1.0)),
        &m,
        &tuning,
        &mut state,
        Duration::from_secs(idle + 301),
    );
    assert_eq!((r.replicas, r.mode), (1, Mode::Activating), "{}", r.reason);
}

#[test]
fn a_metric_outage_never_scales_to_zero() {
    let m = model(
        "    minReplicas: 0\n    maxReplicas: 10\n    targetQueueDepth: 8\n    scaleToZeroAfter: 30s\n",
    );
    let tuning = Tuning::default();
    let mut state = State::new(3);
    recommend(Some(&queue(24.0)), &m, &tuning, &mut state, Duration::ZERO);
    for s in 1..3600u64 {
        let r = recommend(None, &m, &tuning, &mut state, Duration::from_secs(s));
        assert_eq!(r.replicas, 3, "{}", r.reason);
        assert_eq!(r.mode, Mode::Holding);
    }
    // With a fallback configured, it goes there after the threshold.
    let fallback = Tuning {
        fallback_replicas: Some(5),
        ..Tuning::default()
    };
    let mut state = State::new(3);
    let modes: Vec<(u32, Mode)> = (0..4)
        .map(|s| {
            let r = recommend(None, &m, &fallback, &mut state, Duration::from_secs(s));
            (r.replicas, r.mode)
        })
        .collect();
    assert_eq!(
        modes,
        [
            (3, Mode::Holding),
            (3, Mode::Holding),
            (5, Mode::Fallback),
            (5, Mode::Fallback)
        ]
    );
}

#[test]
fn from_zero_the_queue_sizes_the_first_decision() {
    let m = model("    minReplicas: 0\n    maxReplicas: 10\n    targetQueueDepth: 8\n");
    let mut state = State::new(0);
    let r = recommend(
        Some(&Observation {
            waiting: 40.0,
            ..Observation::default()
        }),
        &m,
        &Tuning::default(),
        &mut state,
        Duration::from_secs(45_784),
    );
    assert_eq!(r.replicas, 5, "{}", r.reason);
    assert_eq!(r.mode, Mode::Activating);
    assert_eq!(
        r.reason,
        "40 waiting + 0 in flight over target 8/replica → 5 replicas (activated from zero)"
    );
    // At or under the activation threshold it stays at zero.
    let m = model(
        "    minReplicas: 0\n    maxReplicas: 10\n    targetQueueDepth: 8\n    activationQueueDepth: 2\n",
    );
    let mut state = State::new(0);
    let r = recommend(
        Some(&queue(2.0)),
        &m,
        &Tuning::default(),
        &mut state,
        Duration::ZERO,
    );
    assert_eq!((r.replicas, r.mode), (0, Mode::Idle));
}

#[test]
fn slo_misses_add_capacity_and_near_misses_block_scale_down() {
    let mut m = model("    minReplicas: 1\n    maxReplicas: 50\n    targetQueueDepth: 8\n");
    m.slo.queue_wait_p95 = Some(Duration::from_millis(200));
    let tuning = Tuning::default();
    let mut state = State::new(10);
    // The queue says 10 replicas are right, but queue wait is 1.5× the SLO.
    let r = recommend(
        Some(&Observation {
            waiting: 20.0,
            in_flight: 60.0,
            queue_wait_p95: Some(Duration::from_millis(300)),
            ..Observation::default()
        }),
        &m,
        &tuning,
        &mut state,
        Duration::from_secs(100),
    );
    assert_eq!(r.replicas, 15, "{}", r.reason);
    assert!(r.reason.contains("p95 queue wait 300ms over SLO 200ms"));
    // Demand halves but queue wait is at 90 % of the SLO: hold.
    let r = recommend(
        Some(&Observation {
            waiting: 0.0,
            in_flight: 40.0,
            queue_wait_p95: Some(Duration::from_millis(180)),
            ..Observation::default()
        }),
        &m,
        &tuning,
        &mut state,
        Duration::from_secs(1000),
    );
    assert_eq!(r.replicas, 15, "{}", r.reason);
}

#[test]
fn the_forecast_scales_ahead_of_a_rising_rate() {
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 60s\n",
    );
    // Arrivals rise by 1 req/s every second; each request holds a slot 2 s.
    let tuning = Tuning {
        panic_threshold: f64::INFINITY,
        ..Tuning::default()
    };
    let mut state = State::new(1);
    let mut last = None;
    for s in 0..120u64 {
        let rate = s as f64;
        let now_needed = (rate * 2.0 / 8.0).ceil() as u32;
        let r = recommend(
            Some(&Observation {
                in_flight: rate * 2.0,
                arrival_rate: rate,
                service_time: Some(2.0),
                ..Observation::default()
            }),
            &m,
            &tuning,
            &mut state,
            Duration::from_secs(s),
        );
        last = Some((now_needed, r));
    }
    let (now_needed, r) = last.unwrap();
    assert!(
        r.replicas > now_needed + 5,
        "{} replicas vs {now_needed} needed now: {}",
        r.replicas,
        r.reason
    );
}
