//! The recommender against a specification written from the upstream
//! sources (property test: HPA through a transcription of its Go code in
//! `hpa/mod.rs`, KEDA's activation, cooldown and fallback, Knative's
//! panic), and in simulated-time scenarios: a burst, a noisy steady queue,
//! scale to zero, a metric outage (not idle time), activation from zero, a
//! takeover with and without the last leader's memory; the memory round
//! trip (property test); panic side by side with a transcription of
//! Knative's KPA (`kpa/mod.rs`), where gpuscale departs from it.

use std::path::Path;
use std::time::Duration;

use gpuscale_autoscaler::{Mode, Observation, State, Tuning, recommend};
use gpuscale_policies::Model;
use gpuscale_policies::model::{RatePolicy, RatePolicyType, ResolvedRules, SelectPolicy};
use proptest::prelude::*;

mod hpa;
mod kpa;

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

/// The oracle's form of a direction's rules.
fn oracle_rules(r: &ResolvedRules) -> hpa::Rules {
    hpa::Rules {
        stabilization_window_secs: r.stabilization_window.as_secs_f64(),
        select: match r.select_policy {
            SelectPolicy::Max => hpa::Select::Max,
            SelectPolicy::Min => hpa::Select::Min,
            SelectPolicy::Disabled => hpa::Select::Disabled,
        },
        policies: r
            .policies
            .iter()
            .map(|p| hpa::ScalingPolicy {
                kind: match p.kind {
                    RatePolicyType::Pods => hpa::PolicyKind::Pods,
                    RatePolicyType::Percent => hpa::PolicyKind::Percent,
                },
                value: p.value as i32,
                period_secs: p.period.as_secs_f64(),
            })
            .collect(),
    }
}

/// The settings one property case runs with.
#[derive(Debug, Clone)]
struct Case {
    min: u32,
    max: u32,
    target: u32,
    activation: u32,
    to_zero_after: u64,
    fallback: Option<u32>,
    fallback_after: u32,
    stable_window: u64,
}

/// What gpuscale is specified to do, written from the upstream sources
/// rather than from `recommend`:
/// - failed reads: KEDA's `fallback` (after `failureThreshold` failures,
///   the fallback count, within min/max; here also never to zero), else
///   hold;
/// - at zero: KEDA's activation (strictly above the activation threshold),
///   sized by the queue (`ceil(queue / target)` within min/max: gpuscale's
///   documented departure from KEDA's 0 → 1); not active, a `minReplicas`
///   above 0 sets the count to it (KEDA's executor with
///   `minReplicaCount` > 0 and no idle count);
/// - to zero: KEDA's cooldown (`minReplicas` 0, idle — at or under the
///   threshold — for `scaleToZeroAfter`), the idle spell counted from the
///   first read after an outage (gpuscale's departure from KEDA, whose
///   `lastActiveTime` stays put through scaler errors, so that the first
///   read after an outage can scale to zero at once);
/// - Knative's panic: demand ≥ 2 × current capacity starts it, it lasts a
///   stable window past the last such observation, and while it lasts the
///   count never goes down;
/// - otherwise HPA, through the transcription of its Go source in
///   `hpa/mod.rs`: the external per-pod metric, then
///   `reconcileAutoscaler`'s behaviour path.
///
/// Every change is recorded as a scale event and every activation and
/// panic count as a recommendation, so HPA's windows and rate limits see
/// them (one controller decides all paths).
struct Spec {
    case: Case,
    behavior: hpa::Behavior,
    hpa: hpa::Hpa,
    current: i32,
    failures: u32,
    idle_since: Option<f64>,
    panic_until: Option<f64>,
}

impl Spec {
    fn change(&mut self, now: f64, to: i32) -> i32 {
        if to != self.current {
            self.hpa
                .store_scale_event(Some(&self.behavior), self.current, to, now);
        }
        self.current = to;
        to
    }

    fn step(&mut self, now: f64, depth: Option<u32>) -> i32 {
        let c = self.case.clone();
        let floor = c.min.max(1) as i32;
        let ceiling = (c.max as i32).max(floor);
        self.hpa.record_initial_recommendation(self.current, now);
        let Some(depth) = depth else {
            self.failures += 1;
            self.idle_since = None;
            return match c.fallback {
                Some(f) if self.failures >= c.fallback_after && self.current > 0 => {
                    self.change(now, (f as i32).clamp(floor, ceiling))
                }
                _ => self.current,
            };
        };
        self.failures = 0;
        let active = depth > c.activation;
        if active {
            self.idle_since = None;
        } else if self.idle_since.is_none() {
            self.idle_since = Some(now);
        }
        let by_queue = (f64::from(depth) / f64::from(c.target)).ceil() as i32;
        if self.current == 0 {
            if !active && c.min == 0 {
                return 0;
            }
            // KEDA's executor (`scale_scaledobjects.go`): no active
            // trigger and fewer replicas than `minReplicaCount` (no idle
            // count) sets the target to the minimum.
            let to = if active {
                by_queue.clamp(floor, ceiling)
            } else {
                floor.min(ceiling)
            };
            self.hpa.recommendations.push(hpa::Recommendation {
                time: now,
                replicas: to,
            });
            return self.change(now, to);
        }
        if c.min == 0
            && let Some(since) = self.idle_since
            && now - since >= c.to_zero_after as f64
        {
            self.panic_until = None;
            return self.change(now, 0);
        }
        if f64::from(depth) >= 2.0 * f64::from(self.current) * f64::from(c.target) {
            self.panic_until = Some(now + c.stable_window as f64);
        } else if self.panic_until.is_some_and(|until| now >= until) {
            self.panic_until = None;
        }
        if self.panic_until.is_some() {
            let to = by_queue
                .clamp(floor, ceiling)
                .max(self.current)
                .min(ceiling.max(self.current));
            self.hpa.recommendations.push(hpa::Recommendation {
                time: now,
                replicas: to,
            });
            return self.change(now, to);
        }
        let proposal = hpa::external_per_pod_replicas(
            self.current,
            f64::from(depth),
            f64::from(c.target),
            0.1,
        );
        let (to, _) = self
            .hpa
            .step(now, self.current, proposal, floor, ceiling, &self.behavior);
        self.current = to;
        to
    }
}

fn arb_case() -> impl Strategy<Value = Case> {
    (
        0u32..4,
        1u32..30,
        1u32..16,
        0u32..6,
        0u64..200,
        prop::option::of(0u32..40),
        1u32..4,
        5u64..90,
    )
        .prop_map(
            |(
                min,
                span,
                target,
                activation,
                to_zero_after,
                fallback,
                fallback_after,
                stable_window,
            )| Case {
                min,
                max: min.max(1) + span,
                target,
                activation,
                to_zero_after,
                fallback,
                fallback_after,
                stable_window,
            },
        )
}

/// Queue depths (or a failed read), biased so every path is taken: idle
/// stretches (scale to zero), failures (fallback), bursts (panic).
fn arb_steps() -> impl Strategy<Value = Vec<(u64, Option<u32>)>> {
    let depth = prop_oneof![
        3 => (0u32..400).prop_map(Some),
        2 => Just(Some(0)),
        1 => (400u32..2000).prop_map(Some),
        1 => Just(None),
    ];
    prop::collection::vec((1u64..40, depth), 1..80)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(300)
    ))]

    /// Step for step the same count as the specification on every path:
    /// HPA (through the Go transcription), KEDA activation, cooldown to
    /// zero and fallback, Knative panic; starting at any count, zero
    /// included.
    #[test]
    fn matches_hpa_keda_and_knative_on_every_path(
        up in arb_rules(true),
        down in arb_rules(false),
        case in arb_case(),
        start in 0u32..40,
        steps in arb_steps(),
    ) {
        let to_zero = format!("{}s", case.to_zero_after);
        let mut m = model(&format!(
            "    minReplicas: {}\n    maxReplicas: {}\n    targetQueueDepth: {}\n    activationQueueDepth: {}\n    scaleToZeroAfter: {to_zero}\n",
            case.min, case.max, case.target, case.activation
        ));
        m.scale_up = up.clone();
        m.scale_down = down.clone();
        // The specification sizes on the depth as read: the rules are
        // what is compared here, the depth's smoothing (gpuscale's own
        // conditioning of the signal, tested on its own) is off.
        let tuning = Tuning {
            fallback_replicas: case.fallback,
            fallback_after: case.fallback_after,
            stable_window: Duration::from_secs(case.stable_window),
            depth_smoothing: Duration::ZERO,
            ..Tuning::default()
        };
        let mut state = State::new(start);
        let mut spec = Spec {
            case: case.clone(),
            behavior: hpa::Behavior { up: oracle_rules(&up), down: oracle_rules(&down) },
            hpa: hpa::Hpa::new(),
            current: start as i32,
            failures: 0,
            idle_since: None,
            panic_until: None,
        };
        let mut now = 1000u64;
        for (dt, depth) in steps {
            now += dt;
            let obs = depth.map(|d| queue(f64::from(d)));
            let ours = recommend(obs.as_ref(), &m, &tuning, &mut state, Duration::from_secs(now));
            let theirs = spec.step(now as f64, depth);
            prop_assert_eq!(
                i64::from(ours.replicas), i64::from(theirs),
                "at t={} depth {:?}: {} ({:?})", now, depth, ours.reason, ours.mode
            );
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
fn a_panic_held_at_max_replicas_says_so() {
    // 40 waiting at 4 per replica want 10; maxReplicas 6 holds the count.
    let m = model("    minReplicas: 1\n    maxReplicas: 6\n    targetQueueDepth: 4\n");
    let tuning = Tuning::default();
    let mut state = State::new(1);
    let r = recommend(Some(&queue(40.0)), &m, &tuning, &mut state, secs(1.0));
    assert_eq!((r.replicas, r.mode), (6, Mode::Panic), "{}", r.reason);
    assert!(
        r.reason.contains("(10 wanted; maxReplicas; panic since"),
        "{}",
        r.reason
    );
    // Under the bound nothing is said of it.
    let m = model("    minReplicas: 1\n    maxReplicas: 20\n    targetQueueDepth: 4\n");
    let mut state = State::new(1);
    let r = recommend(Some(&queue(40.0)), &m, &tuning, &mut state, secs(1.0));
    assert_eq!(r.replicas, 10, "{}", r.reason);
    assert!(!r.reason.contains("maxReplicas"), "{}", r.reason);
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
fn one_replica_held_for_the_idle_delay_says_so() {
    // minReplicas 0: what holds the last replica is scaleToZeroAfter, and
    // the decision says that, not "minReplicas".
    let m = model(
        "    minReplicas: 0\n    maxReplicas: 10\n    targetQueueDepth: 8\n    scaleToZeroAfter: 30s\n",
    );
    let mut state = State::new(1);
    let r = recommend(
        Some(&queue(0.0)),
        &m,
        &Tuning::default(),
        &mut state,
        Duration::from_secs(1),
    );
    assert_eq!(r.replicas, 1, "{}", r.reason);
    assert!(r.reason.contains("scaleToZeroAfter"), "{}", r.reason);
    assert!(!r.reason.contains("minReplicas"), "{}", r.reason);
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
fn a_model_with_a_minimum_found_at_zero_goes_to_it_without_traffic() {
    // A fresh install (no Deployment yet), or a Deployment scaled to zero
    // by hand: minReplicas is a guarantee, so the first decision restores
    // it with nothing queued, and the count then holds.
    let m = model("    minReplicas: 2\n    maxReplicas: 10\n    targetQueueDepth: 8\n");
    let mut state = State::new(0);
    let tuning = Tuning::default();
    for t in [0, 1, 30, 600] {
        let r = recommend(
            Some(&queue(0.0)),
            &m,
            &tuning,
            &mut state,
            Duration::from_secs(t),
        );
        assert_eq!(r.replicas, 2, "at {t} s: {}", r.reason);
        assert_ne!(r.mode, Mode::Idle);
        if t == 0 {
            assert!(r.reason.contains("minReplicas"), "{}", r.reason);
        }
    }
    // With traffic already queued it sizes by the queue, as from zero.
    let mut state = State::new(0);
    let r = recommend(Some(&queue(40.0)), &m, &tuning, &mut state, Duration::ZERO);
    assert_eq!((r.replicas, r.mode), (5, Mode::Activating));
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
fn a_latency_breach_at_light_load_adds_no_replicas() {
    let mut m = model("    minReplicas: 1\n    maxReplicas: 50\n    targetQueueDepth: 8\n");
    m.slo.ttft_p95 = Some(Duration::from_millis(500));
    let tuning = Tuning::default();
    // 10 replicas with 12 in flight (15 % of the target) and TTFT 2× the
    // SLO: each request is slow on its own; more replicas would not help.
    let mut state = State::new(10);
    let light = Observation {
        in_flight: 12.0,
        ttft_p95: Some(Duration::from_millis(1000)),
        ..Observation::default()
    };
    let r = recommend(
        Some(&light),
        &m,
        &tuning,
        &mut state,
        Duration::from_secs(100),
    );
    assert_eq!(r.replicas, 10, "{}", r.reason);
    assert!(
        r.reason
            .contains("p95 TTFT over SLO with replicas lightly loaded"),
        "{}",
        r.reason
    );
    // The same breach with the replicas busy (60 in flight, 75 % of the
    // target): capacity in proportion, 2× at most.
    let mut state = State::new(10);
    let busy = Observation {
        in_flight: 60.0,
        ..light
    };
    let r = recommend(
        Some(&busy),
        &m,
        &tuning,
        &mut state,
        Duration::from_secs(100),
    );
    assert_eq!(r.replicas, 20, "{}", r.reason);
}

#[test]
fn slo_feedback_scales_the_replicas_serving_and_does_not_compound() {
    let mut m = model("    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n");
    m.slo.queue_wait_p95 = Some(Duration::from_millis(200));
    let tuning = Tuning::default();
    // 4 replicas serve, queue wait at 2× its SLO: 8 wanted.
    let mut state = State::new(4);
    let breach = Observation {
        waiting: 4.0,
        in_flight: 28.0,
        ready: Some(4.0),
        queue_wait_p95: Some(Duration::from_millis(400)),
        ..Observation::default()
    };
    let r = recommend(
        Some(&breach),
        &m,
        &tuning,
        &mut state,
        Duration::from_secs(10),
    );
    assert_eq!(r.replicas, 8, "{}", r.reason);
    // The minute-long p95 still reads 2× while the new 4 start: the count
    // stays at 8 (2× the 4 serving), second after second.
    for s in 11..40 {
        let r = recommend(
            Some(&breach),
            &m,
            &tuning,
            &mut state,
            Duration::from_secs(s),
        );
        assert_eq!(r.replicas, 8, "at {s}s: {}", r.reason);
    }
    // Once they serve and the breach persists, it doubles again.
    let serving = Observation {
        ready: Some(8.0),
        in_flight: 60.0,
        ..breach
    };
    let r = recommend(
        Some(&serving),
        &m,
        &tuning,
        &mut state,
        Duration::from_secs(41),
    );
    assert_eq!(r.replicas, 16, "{}", r.reason);
    // The queue drains; the minute's p95 still reads 2×: hold, add nothing.
    let drained = Observation {
        waiting: 0.0,
        in_flight: 20.0,
        ready: Some(16.0),
        ..breach
    };
    for s in 42..60 {
        let r = recommend(
            Some(&drained),
            &m,
            &tuning,
            &mut state,
            Duration::from_secs(s),
        );
        assert_eq!(r.replicas, 16, "at {s}s: {}", r.reason);
        assert!(
            r.reason.contains("queue empty now: holding"),
            "{}",
            r.reason
        );
    }
}

/// `in_flight` requests on replicas, `rate` arriving per second, each
/// holding its slot 2 s.
fn two_second_requests(in_flight: f64, rate: f64) -> Observation {
    Observation {
        in_flight,
        arrival_rate: rate,
        service_time: Some(2.0),
        ..Observation::default()
    }
}

#[test]
fn the_forecast_scales_ahead_of_a_rising_rate() {
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 60s\n",
    );
    // Arrivals rise by 1 req/s every second; each request holds a slot 2 s.
    // The rate terms are opt-in (`rateTerms`).
    let tuning = Tuning {
        panic_threshold: f64::INFINITY,
        rate_terms: true,
        ..Tuning::default()
    };
    let mut state = State::new(1);
    let mut last = None;
    for s in 0..120u64 {
        let rate = s as f64;
        let now_needed = (rate * 2.0 / 8.0).ceil() as u32;
        let r = recommend(
            Some(&two_second_requests(rate * 2.0, rate)),
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

/// The most replicas recommended over 300 s of Poisson arrivals at a
/// flat 20 req/s, read as the gateway reads them (arrivals in the last
/// 10 s ÷ 10, stepping 0.1 with every arrival and every departure from
/// the window), deciding every `step_ms`.
fn worst_on_a_flat_noisy_rate(step_ms: u64) -> u32 {
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 30s\n",
    );
    let tuning = no_panic();
    let mut state = State::new(5);
    // Exponential gaps from a fixed LCG (Knuth's MMIX constants).
    let mut x: u64 = 42;
    let mut uniform = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    // The window full from the start: arrivals since −10 s.
    let mut arrivals = std::collections::VecDeque::new();
    let mut next = -10.0;
    let mut worst = 0;
    for i in 0..300_000 / step_ms {
        let now = (i * step_ms) as f64 / 1000.0;
        while next <= now {
            arrivals.push_back(next);
            next += -uniform().ln() / 20.0;
        }
        while arrivals.front().is_some_and(|&t| t <= now - 10.0) {
            arrivals.pop_front();
        }
        let rate = arrivals.len() as f64 / 10.0;
        let r = recommend(
            Some(&two_second_requests(40.0, rate)),
            &m,
            &tuning,
            &mut state,
            Duration::from_millis(i * step_ms),
        );
        worst = worst.max(r.replicas);
    }
    worst
}

#[test]
fn a_forecast_asked_ten_times_a_second_reads_no_more_trend_than_once() {
    // The controller decides on every push, up to ten times a second.
    // Holt's smoothing per observation would read each 0.1 step of the
    // rate in 0.1 s as a trend of 1 req/s² (30 req/s 30 s ahead): 14
    // replicas where deciding once a second asks for 8. Per second, how
    // often it is asked does not matter.
    let once = worst_on_a_flat_noisy_rate(1000);
    let often = worst_on_a_flat_noisy_rate(100);
    assert!(once <= 8, "{once} replicas for 20 req/s × 2 s ÷ 8");
    assert!(
        often <= once + 1,
        "{often} deciding every 100 ms, {once} every second"
    );
}

/// A model on a simulated clock that advances a second per decision.
struct Clock<'a> {
    model: &'a Model,
    tuning: Tuning,
    state: State,
    t: u64,
}

impl<'a> Clock<'a> {
    /// `model` at `replicas`, at time 0.
    fn new(model: &'a Model, tuning: Tuning, replicas: u32) -> Self {
        Clock {
            model,
            tuning,
            state: State::new(replicas),
            t: 0,
        }
    }

    /// `n` decisions, the i-th on `obs(i)`; the last one.
    fn run(
        &mut self,
        n: u64,
        obs: impl Fn(u64) -> Observation,
    ) -> gpuscale_autoscaler::Recommendation {
        let mut last = None;
        for i in 0..n {
            last = Some(recommend(
                Some(&obs(i)),
                self.model,
                &self.tuning,
                &mut self.state,
                Duration::from_secs(self.t),
            ));
            self.t += 1;
        }
        last.expect("at least one decision")
    }
}

fn no_panic() -> Tuning {
    Tuning {
        panic_threshold: f64::INFINITY,
        ..Tuning::default()
    }
}

#[test]
fn a_forecast_does_not_outlive_an_idle_spell() {
    // A rising rate teaches the forecast a steep trend; then the traffic
    // stops and the model idles; then 16 requests queue at once. The
    // queue alone sizes that decision: 16 / target 8 = 2 replicas.
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 30s\n",
    );
    let mut c = Clock::new(&m, no_panic(), 1);
    c.run(60, |i| Observation {
        in_flight: i as f64,
        arrival_rate: i as f64 * 2.0,
        service_time: Some(0.5),
        ..Observation::default()
    });
    // Ten quiet minutes (the scale-down window passes too).
    c.run(600, |_| queue(0.0));
    let r = c.run(1, |_| Observation {
        waiting: 16.0,
        arrival_rate: 1.6,
        ..Observation::default()
    });
    assert_eq!(r.replicas, 2, "{}", r.reason);
    assert!(!r.reason.contains("forecast"), "{}", r.reason);
}

#[test]
fn a_forecast_starts_afresh_after_scale_to_zero() {
    let m = model(
        "    minReplicas: 0\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 30s\n    scaleToZeroAfter: 60s\n",
    );
    let mut c = Clock::new(&m, no_panic(), 4);
    c.run(30, |i| Observation {
        in_flight: 8.0,
        arrival_rate: i as f64 * 3.0,
        service_time: Some(0.2),
        ..Observation::default()
    });
    assert_eq!(c.run(400, |_| queue(0.0)).replicas, 0);
    // One request wakes it: one replica, not a forecast's worth.
    let r = c.run(1, |_| Observation {
        waiting: 1.0,
        arrival_rate: 0.1,
        ..Observation::default()
    });
    assert_eq!(r.replicas, 1, "{}", r.reason);
    let r = c.run(1, |_| Observation {
        in_flight: 1.0,
        arrival_rate: 0.1,
        ..Observation::default()
    });
    assert_eq!(r.replicas, 1, "{}", r.reason);
}

#[test]
fn an_old_slo_breach_adds_nothing_once_the_traffic_has_stopped() {
    let text = "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: m\nspec:\n  resources:\n    memoryGiB: 10\n    compute: 0.1\n    maxConcurrency: 8\n  slo:\n    queueWaitP95: 200ms\n  scaling:\n    minReplicas: 1\n    maxReplicas: 20\n    targetQueueDepth: 8\n";
    let with_slo = gpuscale_policies::load::load_sources(&[(Path::new("m.yaml"), text)])
        .unwrap_or_else(|p| panic!("{p}"))
        .models
        .remove(0);
    let tuning = Tuning::default();
    let mut state = State::new(4);
    // The p95 of the last minute is far over the SLO, but nothing arrives
    // and nothing waits.
    let stale = Observation {
        queue_wait_p95: Some(Duration::from_secs(2)),
        ..Observation::default()
    };
    let r = recommend(
        Some(&stale),
        &with_slo,
        &tuning,
        &mut state,
        Duration::from_secs(1000),
    );
    assert!(r.replicas <= 4, "{}", r.reason);
    assert!(!r.reason.contains("over SLO"), "{}", r.reason);
    // With traffic, the same p95 counts.
    let live = Observation {
        in_flight: 30.0,
        arrival_rate: 10.0,
        queue_wait_p95: Some(Duration::from_secs(2)),
        ..Observation::default()
    };
    let r = recommend(
        Some(&live),
        &with_slo,
        &tuning,
        &mut state,
        Duration::from_secs(1001),
    );
    assert!(r.reason.contains("over SLO"), "{}", r.reason);
}

#[test]
fn an_outage_is_not_idle_time() {
    let m = model(
        "    minReplicas: 0\n    maxReplicas: 10\n    targetQueueDepth: 8\n    scaleToZeroAfter: 30s\n",
    );
    let tuning = Tuning::default();
    let mut state = State::new(2);
    // Idle for 20 s, then the gateway is unreachable for 5 minutes.
    for s in 0..20u64 {
        recommend(Some(&queue(0.0)), &m, &tuning, &mut state, secs(s as f64));
    }
    for s in 20..320u64 {
        let r = recommend(None, &m, &tuning, &mut state, secs(s as f64));
        assert_eq!(r.mode, Mode::Holding, "{}", r.reason);
    }
    // Back, still idle: the cooldown counts from now, not from before the
    // outage.
    for s in 320..350u64 {
        let r = recommend(Some(&queue(0.0)), &m, &tuning, &mut state, secs(s as f64));
        assert!(
            r.replicas > 0,
            "to zero {} s after the outage: {}",
            s - 320,
            r.reason
        );
    }
    let r = recommend(Some(&queue(0.0)), &m, &tuning, &mut state, secs(350.0));
    assert_eq!(
        (r.replicas, r.mode),
        (0, Mode::ScaledToZero),
        "{}",
        r.reason
    );
}

#[test]
fn a_controller_taking_over_at_six_holds_six_until_the_scale_down_window_passes() {
    // HPA's default scale-down window (300 s); minReplicas 1.
    let m = model("    minReplicas: 1\n    maxReplicas: 10\n    targetQueueDepth: 8\n");
    let tuning = Tuning::default();
    let t0 = 10_000.0;
    // What the last leader left: it recommended 6 a minute ago.
    let mut old = State::new(6);
    recommend(Some(&queue(48.0)), &m, &tuning, &mut old, secs(t0 - 60.0));
    let memory = old.memory(secs(t0 - 60.0));
    // With the memory the window closes 300 s after the last leader's 6;
    // without one, 300 s after the takeover (HPA's initial
    // recommendation).
    for (label, mut state, closes) in [
        ("with the memory", State::restored(6, &memory), t0 + 240.0),
        (
            "without one",
            State::restored(6, &Default::default()),
            t0 + 300.0,
        ),
    ] {
        // Quiet from the takeover on.
        let mut t = t0;
        while t < closes {
            let r = recommend(Some(&queue(0.0)), &m, &tuning, &mut state, secs(t));
            assert_eq!(
                r.replicas,
                6,
                "{label}, {} s after taking over: {}",
                t - t0,
                r.reason
            );
            t += 1.0;
        }
        let r = recommend(Some(&queue(0.0)), &m, &tuning, &mut state, secs(closes));
        assert_eq!(r.replicas, 1, "{label}: {}", r.reason);
    }
}

#[test]
fn a_remembered_scale_up_still_limits_the_next_one() {
    // Scale-up: at most +4 pods per 60 s.
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 40\n    targetQueueDepth: 1\n    behavior:\n      scaleUp:\n        selectPolicy: Max\n        policies: [{type: Pods, value: 4, period: 60s}]\n",
    );
    let tuning = no_panic();
    let mut old = State::new(4);
    let r = recommend(Some(&queue(8.0)), &m, &tuning, &mut old, secs(1000.0));
    assert_eq!(r.replicas, 8, "{}", r.reason);
    let memory = old.memory(secs(1000.0));
    assert_eq!(memory.scale_up_events.len(), 1, "{memory:?}");
    // A new leader 10 s later, at 8, with twice the demand: the +4 of
    // 10 s ago still counts, so no more yet.
    let mut restored = State::restored(8, &memory);
    let r = recommend(Some(&queue(16.0)), &m, &tuning, &mut restored, secs(1010.0));
    assert_eq!(r.replicas, 8, "{}", r.reason);
    assert!(r.reason.contains("rate limit"), "{}", r.reason);
    // Without the memory it would have added 4 more at once.
    let mut forgetful = State::new(8);
    let r = recommend(
        Some(&queue(16.0)),
        &m,
        &tuning,
        &mut forgetful,
        secs(1010.0),
    );
    assert_eq!(r.replicas, 12, "{}", r.reason);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(200)
    ))]

    /// The memory written to the ModelPolicy status is all the
    /// stabilisation windows and rate limits need: a state restored from
    /// it decides step for step as the one it was saved from (panic,
    /// which lasts one stable window, and scale to zero, which restarts
    /// its cooldown, are left out).
    #[test]
    fn a_restored_state_decides_as_the_one_it_was_saved_from(
        up in arb_rules(true),
        down in arb_rules(false),
        start in 1u32..30,
        before in prop::collection::vec((1u64..40, 0u32..300), 1..40),
        after in prop::collection::vec((1u64..40, 0u32..300), 1..40),
    ) {
        let mut m = model("    minReplicas: 1\n    maxReplicas: 40\n    targetQueueDepth: 8\n");
        m.scale_up = up;
        m.scale_down = down;
        // The smoothed depth (a 5 s time constant) is not remembered: a
        // controller that restarts reads the depth as it is at its first
        // call. The windows and rate limits are, and are compared here.
        let tuning = Tuning {
            depth_smoothing: Duration::ZERO,
            ..no_panic()
        };
        let mut state = State::new(start);
        let mut now = 1000u64;
        for (dt, depth) in before {
            now += dt;
            recommend(Some(&queue(f64::from(depth))), &m, &tuning, &mut state, secs(now as f64));
        }
        let mut restored = State::restored(state.current, &state.memory(secs(now as f64)));
        for (dt, depth) in after {
            now += dt;
            let o = queue(f64::from(depth));
            let a = recommend(Some(&o), &m, &tuning, &mut state, secs(now as f64));
            let b = recommend(Some(&o), &m, &tuning, &mut restored, secs(now as f64));
            prop_assert_eq!(a.replicas, b.replicas, "at t={}: {} / {}", now, a.reason, b.reason);
        }
    }
}

/// Concurrency (in flight, target 8 per replica) per second: a minute at
/// 8, then `after` for two minutes. Both autoscalers decide once a second
/// on the same figure, with every decided replica ready at once (the
/// same for both). Returns (gpuscale's counts, KPA's counts) from the
/// change on.
fn against_kpa(after: impl Fn(u64) -> f64) -> (Vec<u32>, Vec<i32>) {
    let m = model("    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n");
    let tuning = Tuning::default();
    let mut state = State::new(1);
    let mut kpa = kpa::Kpa::new(8.0);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut ready = 1;
    for t in 0..180u64 {
        let c = if t < 60 { 8.0 } else { after(t - 60) };
        let r = recommend(Some(&queue(c)), &m, &tuning, &mut state, secs(t as f64));
        kpa.record(t, c);
        ready = kpa.scale(t, ready);
        if t >= 60 {
            ours.push(r.replicas);
            theirs.push(ready);
        }
    }
    (ours, theirs)
}

/// gpuscale's panic reads the gateway's queue as it is now against the
/// replicas decided; KPA averages per-pod concurrency samples over 6 s
/// against ready pods. On a sustained five-fold surge gpuscale has the
/// whole count at the first decision; KPA climbs for five seconds as its
/// window fills.
#[test]
fn on_a_sustained_surge_panic_sizes_at_once_where_kpa_takes_its_window() {
    let (ours, theirs) = against_kpa(|_| 40.0);
    assert_eq!(ours[0], 5, "{ours:?}");
    assert!(ours.iter().all(|&n| n == 5), "{ours:?}");
    let first = |v: &[i32]| v.iter().position(|&n| n >= 5);
    assert_eq!(theirs[..6], [2, 3, 3, 4, 5, 5], "{theirs:?}");
    assert_eq!(first(&theirs), Some(4));
}

/// The price of reading the queue as it is: a one-second spike (a queue
/// that empties within the second) is sized in full, held through panic
/// and then through HPA's scale-down window (300 s by default, from the
/// spike), where KPA's average sees a fifth of it and holds that for its
/// stable window only. For model servers a queue of 40 cannot empty in a
/// second (a request takes seconds), so the gateway's queue is already
/// smoothed by service time; the README's "Panic mode" says so.
#[test]
fn a_one_second_spike_costs_more_than_under_kpa() {
    let (ours, theirs) = against_kpa(|s| if s == 0 { 40.0 } else { 8.0 });
    assert!(ours.iter().all(|&n| n == 5), "{ours:?}");
    assert_eq!(theirs[0], 2, "{theirs:?}");
    assert!(theirs[..61].iter().all(|&n| n == 2), "{theirs:?}");
    assert!(theirs[62..].iter().all(|&n| n == 1), "{theirs:?}");
}

#[test]
fn a_burst_of_seconds_in_the_rate_window_is_sized_by_the_smoothed_rate_not_its_peak() {
    // 6 req/s of requests that hold a slot 10 s: 60 in service, 4
    // replicas at 16 each. Then for 10 s the gateway's 10 s rate reads
    // 16 req/s (a burst of short requests: the in-flight count barely
    // moves). Little's law on that raw rate would ask for
    // 16 × 10 ÷ 16 = 10 replicas for a burst that is over before they
    // start (and the forecast, reading the rise as a trend, more); the
    // rate's level (about 20 s of smoothing) reads it as at most ~10
    // req/s → 7, and the trend learnt in 10 s adds at most one. Held for
    // minutes, the same rate is sized in full.
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 16\n    startupTime: 30s\n",
    );
    let mut c = Clock::new(&m, Tuning::default(), 4);
    let at = |rate: f64, in_flight: f64| Observation {
        in_flight,
        arrival_rate: rate,
        service_time: Some(10.0),
        ..Observation::default()
    };
    assert_eq!(c.run(120, |_| at(6.0, 60.0)).replicas, 4);
    let mut most = 0;
    for _ in 0..10 {
        most = most.max(c.run(1, |_| at(16.0, 70.0)).replicas);
    }
    for _ in 0..60 {
        most = most.max(c.run(1, |_| at(6.0, 60.0)).replicas);
    }
    assert!(most <= 8, "{most} replicas for a 10 s burst");
    assert!(most >= 5, "{most}: the burst still counts in part");
    let r = c.run(180, |_| at(16.0, 160.0));
    assert!(r.replicas >= 10, "{}", r.reason);
}

#[test]
fn a_clump_in_flight_is_smoothed_and_a_sustained_rise_or_a_wait_is_not() {
    // 2 replicas at target 8, 16 in flight. A one-second clump to 24 in
    // flight (nothing waits, under the panic threshold of 32): smoothed
    // over 5 s it reads 16 + (1 − e^(−1/5)) × 8 ≈ 17.5, within the 10 %
    // tolerance of 16, so the count holds; read as it is (0 s) it asks
    // for 3, which the 300 s scale-down window then keeps.
    let m = model("    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n");
    let flight = |n: f64| Observation {
        in_flight: n,
        ..Observation::default()
    };
    for (smoothing, after_clump) in [(Duration::from_secs(5), 2), (Duration::ZERO, 3)] {
        let tuning = Tuning {
            depth_smoothing: smoothing,
            ..Tuning::default()
        };
        let mut c = Clock::new(&m, tuning, 2);
        assert_eq!(c.run(60, |_| flight(16.0)).replicas, 2);
        c.run(1, |_| flight(24.0));
        let r = c.run(60, |_| flight(16.0));
        assert_eq!(r.replicas, after_clump, "{smoothing:?}: {}", r.reason);
    }
    // Held at 24 the smoothed depth follows within seconds: 3 replicas.
    let mut c = Clock::new(&m, Tuning::default(), 2);
    c.run(60, |_| flight(16.0));
    let r = c.run(20, |_| flight(24.0));
    assert_eq!(r.replicas, 3, "{}", r.reason);
    // Requests waiting are read as they are, at once.
    let mut c = Clock::new(&m, Tuning::default(), 2);
    c.run(60, |_| flight(16.0));
    let r = c.run(1, |_| Observation {
        waiting: 8.0,
        ..flight(16.0)
    });
    assert_eq!(r.replicas, 3, "{}", r.reason);
}

#[test]
fn a_queue_left_by_replicas_still_starting_holds_the_count_and_a_surge_still_panics() {
    // 2 req/s of requests that hold a slot 10 s: 20 in service, 3
    // replicas at target 8. Then all three are moved (a consolidation):
    // none is ready for 29 s (their startup time is 30 s) and the queue
    // grows by 2 a second. Replicas
    // started now would be ready no sooner than the moved ones, so the
    // count holds. The same queue with every replica ready is a surge
    // (70 waiting, 2.9 × the capacity of 24): panic. And a surge in the
    // rate while the moved replicas start still panics.
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 30s\n",
    );
    let at = |waiting: f64, rate: f64, ready: f64| Observation {
        waiting,
        in_flight: 0.0,
        arrival_rate: rate,
        service_time: Some(10.0),
        ready: Some(ready),
        ..Observation::default()
    };
    let steady = |_| Observation {
        in_flight: 20.0,
        ..at(0.0, 2.0, 3.0)
    };
    let mut moved = Clock::new(&m, Tuning::default(), 3);
    assert_eq!(moved.run(120, steady).replicas, 3);
    let mut most = 0;
    for i in 1..=29 {
        let r = moved.run(1, |_| at(2.0 * i as f64, 2.0, 0.0));
        assert!(!moved.state.in_panic(), "{i} s: {}", r.reason);
        most = most.max(r.replicas);
    }
    assert_eq!(most, 3);

    let mut ready = Clock::new(&m, Tuning::default(), 3);
    ready.run(120, steady);
    let r = ready.run(1, |_| at(70.0, 2.0, 3.0));
    assert!(ready.state.in_panic() && r.replicas >= 9, "{}", r.reason);

    // Panic then follows the queue as it is (20 more waiting a second):
    // 60 waiting two seconds on is 8 replicas' worth.
    let mut surge = Clock::new(&m, Tuning::default(), 3);
    surge.run(120, steady);
    surge.run(10, |i| at(2.0 * i as f64, 2.0, 0.0));
    let r = surge.run(3, |i| at(20.0 + 20.0 * i as f64, 20.0, 0.0));
    assert!(surge.state.in_panic() && r.replicas >= 8, "{}", r.reason);
}

#[test]
fn replicas_not_ready_a_startup_time_on_no_longer_hold_the_queue() {
    // Three replicas decided, none ready (failing, or slower than the
    // declared 30 s startup), 40 queued, nothing arriving: held while they
    // may still be starting, then the queue sizes the count again.
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 30s\n",
    );
    let stuck = |_| Observation {
        waiting: 40.0,
        ready: Some(0.0),
        service_time: Some(10.0),
        ..Observation::default()
    };
    let mut c = Clock::new(&m, Tuning::default(), 3);
    assert_eq!(c.run(29, stuck).replicas, 3);
    let r = c.run(2, stuck);
    assert!(r.replicas >= 5, "{}", r.reason);
}

/// HPA's utilisation rule on the servers' prefill seconds per second:
/// ready × utilisation ÷ target, hand-checked; held while replicas start;
/// a lane at its target makes a TTFT breach count as load; absent, it
/// changes nothing.
#[test]
fn prefill_utilisation_sizes_a_model_whose_prompts_bind_before_its_queue() {
    let mut m = model("    minReplicas: 1\n    maxReplicas: 50\n    targetQueueDepth: 32\n");
    m.slo.ttft_p95 = Some(Duration::from_millis(500));
    let tuning = Tuning::default();
    // 3 replicas, 6 in flight (6 % of the target), prefill 90 % busy:
    // 3 × 0.9 ÷ 0.7 = 3.86 → 4.
    let hot = Observation {
        in_flight: 6.0,
        ready: Some(3.0),
        prefill_busy: Some(0.9),
        ..Observation::default()
    };
    let r = recommend(Some(&hot), &m, &tuning, &mut State::new(3), secs(100.0));
    assert_eq!(r.replicas, 4, "{}", r.reason);
    assert!(
        r.reason.contains("prefill 90 % busy over target 70 %"),
        "{}",
        r.reason
    );
    // 1.0 busy: 3 ÷ 0.7 = 4.29 → 5.
    let hotter = Observation {
        prefill_busy: Some(1.0),
        ..hot.clone()
    };
    let r = recommend(Some(&hotter), &m, &tuning, &mut State::new(3), secs(100.0));
    assert_eq!(r.replicas, 5, "{}", r.reason);
    // Without the figure: the queue alone, 6 ÷ 32 → the 3 held by the
    // scale-down window of a fresh state (it starts from 3).
    let plain = Observation {
        prefill_busy: None,
        ..hot.clone()
    };
    let r = recommend(Some(&plain), &m, &tuning, &mut State::new(3), secs(100.0));
    assert_eq!(r.replicas, 3, "{}", r.reason);
    // Replicas starting (4 decided, 3 ready, within startupTime): the hot
    // lanes of those serving are expected; the count holds.
    let mut state = State::new(4);
    let r = recommend(Some(&hot), &m, &tuning, &mut state, secs(100.0));
    assert_eq!(r.replicas, 4, "{}", r.reason);
    // A TTFT breach at 2× with few in flight: load when the lanes are at
    // their target (2× the 3 serving = 6), not when they idle.
    let breach = Observation {
        ttft_p95: Some(Duration::from_millis(1000)),
        prefill_busy: Some(0.7),
        ..hot.clone()
    };
    let r = recommend(Some(&breach), &m, &tuning, &mut State::new(3), secs(100.0));
    assert_eq!(r.replicas, 6, "{}", r.reason);
    let idle = Observation {
        prefill_busy: Some(0.2),
        ..breach
    };
    let r = recommend(Some(&idle), &m, &tuning, &mut State::new(3), secs(100.0));
    assert_eq!(r.replicas, 3, "{}", r.reason);
    assert!(r.reason.contains("lightly loaded"), "{}", r.reason);
}

#[test]
fn a_latency_breach_measured_on_fewer_replicas_holds_those_serving_now() {
    // The gateway's p95s cover the last 60 s. 4 replicas, busy (32 in
    // flight, the target), TTFT at 2× its SLO: 8 wanted. While the 4 new
    // ones start, the count holds. Once all 8 serve, the minute's p95
    // was measured on 4: it holds the 8 and adds nothing, for as long as
    // the window still reaches back to 4 serving (60 s); a breach that
    // persists after that was measured on the 8, and doubles them.
    let mut m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 30s\n",
    );
    m.slo.ttft_p95 = Some(Duration::from_millis(500));
    let at = |in_flight: f64, ready: f64| Observation {
        in_flight,
        ready: Some(ready),
        ttft_p95: Some(Duration::from_millis(1000)),
        ..Observation::default()
    };
    let mut c = Clock::new(&m, Tuning::default(), 4);
    let r = c.run(1, |_| at(32.0, 4.0));
    assert_eq!(r.replicas, 8, "{}", r.reason);
    for s in 1..30 {
        let r = c.run(1, |_| at(32.0, 4.0));
        assert_eq!(r.replicas, 8, "at {s}s: {}", r.reason);
    }
    // From t = 30 s the 8 serve, busy (64 in flight), the p95 unchanged.
    for s in 30..90 {
        let r = c.run(1, |_| at(64.0, 8.0));
        assert_eq!(r.replicas, 8, "at {s}s: {}", r.reason);
        assert!(
            r.reason.contains("measured on 4 serving of 8: holding"),
            "at {s}s: {}",
            r.reason
        );
    }
    let r = c.run(1, |_| at(64.0, 8.0));
    assert_eq!(r.replicas, 16, "at 90s: {}", r.reason);
}

#[test]
fn a_replica_back_from_an_ejection_is_not_growth() {
    // 8 replicas for minutes, no decision raising them; one is ejected
    // (7 ready) for 10 s and comes back. The TTFT breach that follows,
    // busy, is the 8's: ×2 at once, no hold.
    let mut m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 8\n    startupTime: 30s\n",
    );
    m.slo.ttft_p95 = Some(Duration::from_millis(500));
    let at = |ready: f64, ttft: u64| Observation {
        in_flight: 64.0,
        ready: Some(ready),
        ttft_p95: Some(Duration::from_millis(ttft)),
        ..Observation::default()
    };
    let mut c = Clock::new(&m, Tuning::default(), 8);
    assert_eq!(c.run(300, |_| at(8.0, 400)).replicas, 8);
    c.run(10, |_| at(7.0, 400));
    let r = c.run(1, |_| at(8.0, 1000));
    assert_eq!(r.replicas, 16, "{}", r.reason);
}

#[test]
fn a_surge_while_replicas_start_is_sized_by_the_queue() {
    // 5 replicas decided at target 16, 4 ready (one starting, within its
    // 30 s), after two minutes of 3 req/s at 3.5 s each. The queue holds
    // 350 (222 waiting, 128 in flight): with the raw 10 s rate at 30 req/s
    // (105 in service, under twice the count's 80) the queue is read as
    // left for the starting replica, and the count holds. With the raw
    // rate at 50 req/s (175 in service, twice the 80 and more) the surge
    // is real: panic, sized by the queue, ⌈350 ÷ 16⌉ = 22 (it sized
    // nothing while the starting replica capped the queue at the count).
    let m = model(
        "    minReplicas: 1\n    maxReplicas: 100\n    targetQueueDepth: 16\n    startupTime: 30s\n",
    );
    let obs = |waiting: f64, in_flight: f64, rate: f64, ready: f64| Observation {
        waiting,
        in_flight,
        arrival_rate: rate,
        service_time: Some(3.5),
        ready: Some(ready),
        ..Observation::default()
    };
    let steady = |_| obs(0.0, 10.0, 3.0, 5.0);
    let mut held = Clock::new(&m, Tuning::default(), 5);
    held.run(120, steady);
    held.run(3, |_| obs(0.0, 10.0, 3.0, 4.0));
    let r = held.run(1, |_| obs(222.0, 128.0, 30.0, 4.0));
    assert_eq!(r.replicas, 5, "{}", r.reason);
    assert!(!held.state.in_panic(), "{}", r.reason);

    let mut surge = Clock::new(&m, Tuning::default(), 5);
    surge.run(120, steady);
    surge.run(3, |_| obs(0.0, 10.0, 3.0, 4.0));
    let r = surge.run(1, |_| obs(222.0, 128.0, 50.0, 4.0));
    assert!(surge.state.in_panic(), "{}", r.reason);
    assert_eq!(r.replicas, 22, "{}", r.reason);

    // Panic started by the queue with every replica ready (164 on 4 × 16:
    // ⌈164 ÷ 16⌉ = 11) goes on reading the queue as it is while the 7
    // added ones start: 250 a second later asks for 16, as Knative's
    // panic follows the concurrency it sees (before, the count's 11 held
    // the queue at 176 and panic added nothing until they were ready).
    let mut queued = Clock::new(&m, Tuning::default(), 4);
    queued.run(120, |_| obs(0.0, 10.0, 3.0, 4.0));
    let r = queued.run(1, |_| obs(100.0, 64.0, 3.0, 4.0));
    assert!(queued.state.in_panic(), "{}", r.reason);
    assert_eq!(r.replicas, 11, "{}", r.reason);
    let r = queued.run(1, |_| obs(186.0, 64.0, 3.0, 4.0));
    assert_eq!(r.replicas, 16, "{}", r.reason);
}
