//! The recommender: observations of one model → a replica count and a
//! sentence saying why. Pure: no clock reads (`now` is passed in, as time
//! since any fixed epoch), no I/O; everything it remembers between calls is
//! in [`State`], which the caller owns.
//!
//! One call, in order:
//! 1. **Missing data** (a failed read): hold; after `fallback_after`
//!    consecutive failures go to the fallback replicas if configured.
//!    Never to zero on missing data.
//! 2. **Demand**: queue depth (waiting + in flight) ÷ the per-replica
//!    target, the depth smoothed over `depthSmoothing` (5 s) while nothing
//!    waits and it stays under `panicThreshold` × the capacity, read as
//!    it is otherwise. With `rateTerms` (off by default) also the arrival
//!    rate's smoothed level (Holt's level, about 20 s) × observed service
//!    time (Little's law) ÷ the same target, and Holt's linear trend on
//!    the arrival rate (smoothed per second, however often it is asked;
//!    the trend over about 50 s) forecast `startupTime` ahead; the
//!    largest. **SLO**: a
//!    p95 (queue wait, time to first token, latency) over its target adds
//!    capacity in proportion (at most ×2); one within 80 % of its target
//!    blocks scale-down. Capacity is added in proportion to the replicas
//!    serving, and only where more replicas help now: for queue wait while
//!    requests wait (a drained queue's breach only holds), for TTFT and
//!    latency while the replicas are loaded (requests waiting, or at least
//!    half the target in flight per replica) — a breach at light load is
//!    the replica's own speed, which more replicas do not change — and
//!    only when measured on the replicas serving now: after the
//!    recommender raised the count (within `startupTime` + 60 s), a TTFT
//!    or latency p95 whose 60 s window reaches back to fewer serving
//!    (more than the tolerance fewer: a cold start's queue, the backlog
//!    the new replicas drained) holds them. A replica back from an
//!    ejection or a move is not growth. **In transit**: replicas of the count not
//!    ready yet, within `startupTime`, hold the count against the queue
//!    they leave behind, unless the smoothed rate outgrows the count,
//!    the raw rate's demand reaches `panic_threshold` × it (a surge), or
//!    panic is on (it follows the queue as it is, as Knative's follows
//!    the concurrency it sees).
//! 3. **Activation** (KEDA): at zero, activate only when the queue is
//!    strictly above `activationQueueDepth`, and then to the size the queue
//!    asks for, not 1; a model with `minReplicas` above 0 found at zero
//!    (nothing running yet) goes to its minimum at once, queue or not.
//!    To zero only when `minReplicas` is 0 and the model
//!    has been idle (at or under the activation threshold) for
//!    `scaleToZeroAfter`.
//! 4. **Panic** (Knative): the queue or the raw 10 s rate's demand ≥
//!    `panic_threshold` × current capacity starts panic: scale up at once
//!    (to the demand above, at least the queue), past the rate limits; no
//!    scale-down until demand has stayed under the threshold for
//!    `stable_window`.
//! 5. **HPA**: tolerance band around the current count, then
//!    stabilisation (scale-up: min over its window; scale-down: max over its
//!    window) and rate policies (Pods / Percent per period, `selectPolicy`
//!    Max / Min / Disabled), then `minReplicas`..`maxReplicas`.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::Duration;

use gpuscale_policies::model::{
    Model, RatePolicyType, RememberedScaleEvent, ResolvedRules, ScalingMemory, SelectPolicy,
    TimedReplicas,
};
use serde::{Deserialize, Serialize};

/// What the gateway reports about one model at one moment.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Requests waiting in the gateway's queue.
    pub waiting: f64,
    /// Requests on replicas.
    pub in_flight: f64,
    /// Arrivals per second over the last 10 s.
    pub arrival_rate: f64,
    /// Mean time a request holds a replica slot, seconds, over the same
    /// window as `arrival_rate` (the gateway's 10 s p50 latency); `None`
    /// until measured.
    pub service_time: Option<f64>,
    /// Replicas taking requests now (the gateway's count); `None` when
    /// the source does not say (Prometheus).
    #[serde(default)]
    pub ready: Option<f64>,
    /// p95 queue wait.
    pub queue_wait_p95: Option<Duration>,
    /// p95 time to first token.
    pub ttft_p95: Option<Duration>,
    /// p95 latency.
    pub latency_p95: Option<Duration>,
    /// Prefill seconds per second, the mean over the replicas that report
    /// it (their metrics, when the gateway scrapes them): 1 is a replica
    /// whose prefill is busy all the time. `None` when not reported.
    #[serde(default)]
    pub prefill_busy: Option<f64>,
}

/// The recommender's own settings (the policy's `scaling` holds the
/// per-model ones).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Tuning {
    /// No change while desired ÷ current stays within 1 ± this (HPA: 0.1).
    pub tolerance: f64,
    /// Demand over this many times current capacity starts panic
    /// (Knative: 2).
    pub panic_threshold: f64,
    /// Panic ends once demand has stayed under the threshold this long
    /// (Knative's stable window: 60 s).
    #[serde(with = "gpuscale_policies::duration")]
    pub stable_window: Duration,
    /// Consecutive failed reads before the fallback applies (KEDA's
    /// `failureThreshold`: 3).
    pub fallback_after: u32,
    /// Replicas after `fallback_after` failures; `None`: hold.
    pub fallback_replicas: Option<u32>,
    /// Holt smoothing of the arrival-rate level (0–1), per second (0.05:
    /// a time constant of about 20 s, longer than the gateway's 10 s
    /// rate window, so that a few seconds' burst is not read as a rate).
    pub forecast_alpha: f64,
    /// Holt smoothing of the trend (0–1), per second (0.02: about 50 s,
    /// so that minute-scale swings of a bursty trace are not a trend).
    pub forecast_beta: f64,
    /// Most that SLO feedback multiplies capacity by in one decision.
    pub slo_max_step: f64,
    /// Prefill utilisation a replica is sized for, where its metrics
    /// report one (0.7, Knative's target utilisation). Prompts are
    /// prefilled at the speed of the replica's GPU share whatever its
    /// concurrency allows, so a model of long prompts on a small share is
    /// bound by prefill before its queue-depth target is reached.
    pub prefill_target: f64,
    /// Time constant of the queue depth's smoothing (5 s; 0s reads it as
    /// it is). Requests in flight under a replica's concurrency are a
    /// utilisation signal, noisy on a bursty trace: sized as read on
    /// every push, each clump above the target added a replica that the
    /// 300 s scale-down window then kept. The depth is read as it is
    /// while requests wait, or once it reaches `panicThreshold` × the
    /// capacity (Knative's stable and panic windows, in the same spirit).
    #[serde(with = "gpuscale_policies::duration")]
    pub depth_smoothing: Duration,
    /// Also size by the arrival rate: its smoothed level × the observed
    /// service time (Little's law), and Holt's forecast `startupTime`
    /// ahead (off by default: on the simulator's azure-conv, fleet-1000
    /// and marketplace scenarios these terms held 14–24 % more GPU-hours
    /// for no attainment; `bench/README.md`). The raw rate still starts
    /// panic either way.
    pub rate_terms: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            tolerance: 0.1,
            panic_threshold: 2.0,
            stable_window: Duration::from_secs(60),
            fallback_after: 3,
            fallback_replicas: None,
            forecast_alpha: 0.05,
            forecast_beta: 0.02,
            slo_max_step: 2.0,
            prefill_target: 0.7,
            depth_smoothing: Duration::from_secs(5),
            rate_terms: false,
        }
    }
}

/// Why the count is what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// HPA rules.
    Normal,
    /// Knative-style panic: up at once, never down.
    Panic,
    /// From zero, sized by the queue.
    Activating,
    /// To zero after the cooldown.
    ScaledToZero,
    /// Staying at zero.
    Idle,
    /// Holding on missing data.
    Holding,
    /// Fallback replicas after repeated missing data.
    Fallback,
}

/// A decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// Replicas wanted.
    pub replicas: u32,
    /// Why, for a model owner.
    pub reason: String,
    /// Which rule set decided.
    pub mode: Mode,
}

/// One scale event: when, how many replicas it added or removed, and
/// whether it has aged past its direction's longest policy period.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ScaleEvent {
    at: Duration,
    change: u32,
    outdated: bool,
}

/// HPA's `storeScaleEvent` for one direction: events older than the
/// direction's longest policy period are marked outdated, and the new
/// event takes the place of the last outdated one (else it is appended).
/// The lists never grow past the events of one longest period plus one.
/// Rate limits sum events by time alone, so an outdated event that is
/// still inside the *other* direction's (longer) period counts there
/// until it is overwritten — HPA's behaviour, kept exact.
fn store_event(events: &mut Vec<ScaleEvent>, longest: Duration, now: Duration, change: u32) {
    if let Some(cutoff) = now.checked_sub(longest) {
        for e in events.iter_mut() {
            if e.at < cutoff {
                e.outdated = true;
            }
        }
    }
    let event = ScaleEvent {
        at: now,
        change,
        outdated: false,
    };
    match events.iter().rposition(|e| e.outdated) {
        Some(i) => events[i] = event,
        None => events.push(event),
    }
}

/// How far back the gateway's p95s reach (its 60 s window).
const P95_WINDOW: Duration = Duration::from_secs(60);

/// Records the replicas serving now and returns the fewest that served
/// at any time in the last p95 window.
fn fewest_serving(state: &mut State, now: Duration, serving: f64) -> f64 {
    if state.serving.back().is_none_or(|&(_, s)| s != serving) {
        state.serving.push_back((now, serving));
    }
    let since = now.saturating_sub(P95_WINDOW);
    // Keep the one in force at the window's start.
    while state.serving.len() > 1 && state.serving[1].0 <= since {
        state.serving.pop_front();
    }
    state
        .serving
        .iter()
        .map(|&(_, s)| s)
        .fold(f64::INFINITY, f64::min)
}

/// What the recommender remembers between calls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    /// Replicas decided last (the "current" count the rules work from).
    pub current: u32,
    /// Recent raw recommendations (time, replicas), for stabilisation.
    history: VecDeque<(Duration, u32)>,
    /// Scale-ups and scale-downs, for the rate policies, kept as HPA's
    /// `storeScaleEvent` keeps them.
    up_events: Vec<ScaleEvent>,
    down_events: Vec<ScaleEvent>,
    /// The longest rate-policy period of each direction (up, down).
    longest: (Duration, Duration),
    /// Panic: since when, and until when it lasts unless renewed.
    panic: Option<(Duration, Duration)>,
    /// Since when the model has been idle.
    idle_since: Option<Duration>,
    /// Consecutive failed reads.
    failures: u32,
    /// Since when fewer replicas than the count have been ready.
    starting_since: Option<Duration>,
    /// The replicas serving (ready) at each change over the last p95
    /// window, and the one in force before it: what the window's p95s
    /// were measured on.
    serving: VecDeque<(Duration, f64)>,
    /// When a decision last raised the count.
    rose_at: Option<Duration>,
    /// Holt's level and trend of the arrival rate, and when last updated.
    forecast: Option<(f64, f64, Duration)>,
    /// The smoothed queue depth and when last updated.
    depth: Option<(f64, Duration)>,
    /// How far back the windows and rate periods reach.
    horizon: Duration,
    /// The count the state started from is recorded as a recommendation
    /// at the first call (HPA's `recordInitialRecommendation`): a
    /// controller that starts, or takes over, at N replicas does not
    /// scale below N before the scale-down window has passed.
    seeded: bool,
}

impl State {
    /// State for a model running `current` replicas.
    pub fn new(current: u32) -> Self {
        State {
            current,
            ..State::default()
        }
    }

    /// Whether panic is on.
    pub fn in_panic(&self) -> bool {
        self.panic.is_some()
    }

    /// What the stabilisation windows and rate limits remember at `now`,
    /// for the ModelPolicy status: the recommendations inside the longest
    /// window or period and the scale events, a run of equal
    /// recommendations kept as its last one (the windows' min and max
    /// over any span ending now are the same with or without the earlier
    /// ones).
    pub fn memory(&self, now: Duration) -> ScalingMemory {
        let since = now.saturating_sub(self.horizon);
        let mut recommendations: Vec<TimedReplicas> = Vec::new();
        let mut last: Option<u32> = None;
        for &(t, r) in self.history.iter().filter(|(t, _)| *t >= since) {
            if last == Some(r) {
                recommendations.pop();
            }
            recommendations.push(TimedReplicas {
                time: rfc3339(t),
                replicas: r,
            });
            last = Some(r);
        }
        // The event lists whole and in their order: HPA overwrites the
        // last outdated entry in place, so which one that is depends on
        // the order (and they never hold more than one longest period's
        // events plus one).
        let events = |events: &[ScaleEvent]| -> Vec<RememberedScaleEvent> {
            events
                .iter()
                .map(|e| RememberedScaleEvent {
                    time: rfc3339(e.at),
                    change: e.change,
                    outdated: e.outdated,
                })
                .collect()
        };
        ScalingMemory {
            recommendations,
            scale_up_events: events(&self.up_events),
            scale_down_events: events(&self.down_events),
        }
    }

    /// State for a model observed running `current` replicas, with the
    /// memory a previous controller left (entries with an unreadable time
    /// are skipped). The first decision still records `current` as a
    /// recommendation, as HPA records its initial one.
    pub fn restored(current: u32, memory: &ScalingMemory) -> Self {
        let at = |s: &str| {
            humantime::parse_rfc3339(s)
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        };
        let events = |list: &[RememberedScaleEvent]| -> Vec<ScaleEvent> {
            list.iter()
                .filter_map(|e| {
                    Some(ScaleEvent {
                        at: at(&e.time)?,
                        change: e.change,
                        outdated: e.outdated,
                    })
                })
                .collect()
        };
        let mut history: Vec<(Duration, u32)> = memory
            .recommendations
            .iter()
            .filter_map(|r| Some((at(&r.time)?, r.replicas)))
            .collect();
        history.sort_by_key(|(t, _)| *t);
        State {
            current,
            // HPA records its initial recommendation only when it has
            // none for the autoscaler: remembered ones take its place.
            seeded: !history.is_empty(),
            history: history.into(),
            up_events: events(&memory.scale_up_events),
            down_events: events(&memory.scale_down_events),
            ..State::default()
        }
    }
}

/// `t` (since the Unix epoch) as RFC 3339 with milliseconds.
fn rfc3339(t: Duration) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + t).to_string()
}

/// `HH:MM:SS` of a time since the Unix epoch (UTC).
pub fn clock(t: Duration) -> String {
    let s = t.as_secs() % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

fn ceil_u32(x: f64) -> u32 {
    if x.is_finite() && x > 0.0 {
        (x - 1e-9).ceil().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// Decides the replica count. `observation` is `None` when the read
/// failed.
pub fn recommend(
    observation: Option<&Observation>,
    policy: &Model,
    tuning: &Tuning,
    state: &mut State,
    now: Duration,
) -> Recommendation {
    let scaling = &policy.scaling;
    let current = state.current;
    let longest = |r: &ResolvedRules| {
        r.policies
            .iter()
            .map(|p| p.period)
            .max()
            .unwrap_or_default()
    };
    state.longest = (longest(&policy.scale_up), longest(&policy.scale_down));
    if !state.seeded {
        state.seeded = true;
        record(state, now, current);
    }
    state.horizon = [&policy.scale_up, &policy.scale_down]
        .iter()
        .flat_map(|r| {
            std::iter::once(r.stabilization_window).chain(r.policies.iter().map(|p| p.period))
        })
        .max()
        .unwrap_or_default()
        .max(Duration::from_secs(1));
    let floor = scaling.min_replicas.max(1);
    let ceiling = scaling.max_replicas.max(floor);
    let Some(obs) = observation else {
        state.failures += 1;
        // An outage is not idle time: the idle spell that scale to zero
        // waits for starts again once data comes back.
        state.idle_since = None;
        return match tuning.fallback_replicas {
            // KEDA's fallback: after `failureThreshold` failed reads, the
            // fallback count, within minReplicas..maxReplicas (and never
            // to zero: missing data is no evidence of idleness), recorded
            // as a scale event like any other change.
            Some(f) if state.failures >= tuning.fallback_after && current > 0 => {
                let replicas = f.clamp(floor, ceiling);
                let why = format!(
                    "{} failed metric reads → fallback {replicas} {}",
                    state.failures,
                    plural(replicas)
                );
                finish(state, now, replicas, Mode::Fallback, why)
            }
            _ => {
                let why = format!(
                    "{} failed metric read(s) → holding {current} {} (never to zero on missing data)",
                    state.failures,
                    plural(current)
                );
                finish(state, now, current, Mode::Holding, why)
            }
        };
    };
    state.failures = 0;
    let target = scaling.target_queue_depth.max(1e-9);
    let depth = obs.waiting + obs.in_flight;
    // Demand in requests (HPA's "total metric"): queue depth, Little's law
    // on the arrival rate, and the forecast; replicas = total ÷ target.
    // The gateway's rate is over 10 s, shorter than many models' service
    // time: a burst of a few seconds reads as a rate that, held for a
    // whole service time, would fill several replicas, and it is over
    // before they start (on the Azure trace, Little's law on the 10 s
    // rate held 40 % more replicas than a fixed count that met every
    // SLO). Sizing reads the smoothed level of the rate (Holt's level,
    // `forecast_alpha` per second); the raw rate still starts panic, and
    // the queue depth, which a real surge fills, is read as it is.
    let concurrency = obs.service_time.map(|w| obs.arrival_rate * w);

    // Nothing arriving, nothing queued: the traffic that the forecast
    // and the latency figures describe is over. The forecast starts
    // afresh (a trend learnt before an idle spell or a scale to zero says
    // nothing about what comes after it).
    let quiet = depth <= 0.0 && obs.arrival_rate <= 0.0;
    if quiet || current == 0 {
        state.forecast = None;
    }
    // Holt's linear trend on the arrival rate.
    let smoothed = update_forecast(state, tuning, obs.arrival_rate, now, scaling.startup_time);
    let level = smoothed.map_or(obs.arrival_rate, |(level, _)| level);
    let forecast_rate = smoothed.map(|(_, ahead)| ahead);
    let by_rate = obs.service_time.map_or(0.0, |w| level.max(0.0) * w);
    let by_forecast = match (obs.service_time, forecast_rate) {
        (Some(w), Some(f)) => f.max(0.0) * w,
        _ => 0.0,
    };
    // Capacity in transit: replicas of the current count not ready yet
    // (moved by a consolidation, replaced, or just added) while the
    // smoothed demand still fits the count. The queue they leave behind
    // is served when they arrive, no later than replicas started now
    // would be: it holds the count and adds nothing (no panic, no SLO
    // step). On fleet-1000 each consolidation's moves otherwise read as a
    // surge: 250 replicas became 450 for the 5-minute window, on fresh
    // GPUs. The raw rate still starts panic, for a surge while they start.
    // Replicas not ready a startup time after the count outran the ready
    // ones are not on their way (failing, or slower than declared): the
    // queue counts again. Nor does a surge wait for them: the raw rate's
    // demand at the panic threshold, or panic already on, reads the queue
    // as it is. (On bursty's 10× step the raw rate started panic 1.6 s
    // into the step, with one replica starting; the hold capped the queue
    // at the count, and panic sized nothing for 8 s, until the smoothed
    // rate passed the count.)
    let starting = obs.ready.map_or(0.0, |r| (f64::from(current) - r).max(0.0));
    if starting > 0.0 {
        state.starting_since.get_or_insert(now);
    } else {
        state.starting_since = None;
    }
    let in_transit = state
        .starting_since
        .is_some_and(|since| now.saturating_sub(since) < scaling.startup_time)
        && by_rate.max(by_forecast) <= f64::from(current) * target
        && state.panic.is_none_or(|(_, until)| now >= until)
        && concurrency.is_none_or(|c| c < tuning.panic_threshold * f64::from(current) * target);
    // The depth as sized: smoothed, unless requests wait or it reaches
    // the panic threshold (a surge is read as it is).
    let smoothed_depth = smooth_depth(state, tuning, depth, now);
    let surge = depth >= tuning.panic_threshold * f64::from(current) * target;
    let sized_depth = if obs.waiting > 0.0 || surge {
        depth
    } else {
        smoothed_depth
    };
    let by_queue = if in_transit {
        sized_depth.min(f64::from(current) * target)
    } else {
        sized_depth
    };
    let rate_demand = by_rate;
    let (by_rate, by_forecast) = if tuning.rate_terms {
        (by_rate, by_forecast)
    } else {
        (0.0, 0.0)
    };
    // The replicas serving now: ready ones of the current count.
    // Prefill: the replicas serving, each at the target utilisation of
    // its prefill (HPA's utilisation rule on the prefill seconds per
    // second its metrics report), in requests like the rest. While
    // replicas start, the lanes of those serving run hot by design: the
    // count holds, as for the queue.
    let serving_now = obs
        .ready
        .map_or(f64::from(current), |r| r.min(f64::from(current)));
    let fewest = fewest_serving(state, now, serving_now);
    // The p95s cover the last minute: measured on fewer replicas than
    // serve now (a cold start's queue, the backlog the new replicas
    // drained), a TTFT or latency breach is not evidence against the
    // replicas serving now. It holds them; the queue and the rate, read
    // as they are, still add. After a 10× burst on bursty's 8B model the
    // TTFT p95 of the cold start took 24 serving replicas to 40 for five
    // minutes.
    // Only growth this recommender decided counts (replicas it added,
    // within their start-up and a window after): a replica back from an
    // outlier ejection or a move is no new capacity, and counting it held
    // the SLO term off after every such return.
    let grown = state
        .rose_at
        .is_some_and(|t| now.saturating_sub(t) < scaling.startup_time + P95_WINDOW)
        && serving_now > fewest * (1.0 + tuning.tolerance)
        && serving_now > fewest;
    let by_prefill = match obs.prefill_busy {
        Some(u) if u > 0.0 && !in_transit && tuning.prefill_target > 0.0 => {
            serving_now * (u / tuning.prefill_target) * target
        }
        _ => 0.0,
    };
    let mut total = by_queue.max(by_rate).max(by_forecast).max(by_prefill);
    let mut why = format!(
        "{} waiting + {} in flight{} over target {}/replica",
        obs.waiting.round(),
        obs.in_flight.round(),
        if (depth - sized_depth).abs() >= 0.5 {
            format!(" ({sized_depth:.1} smoothed)")
        } else {
            String::new()
        },
        trim(target)
    );
    if in_transit && sized_depth > by_queue {
        let _ = write!(
            why,
            "; {starting} starting for a demand of {rate_demand:.1} requests in service (arrival rate × service time): the queue waits for them"
        );
    } else if by_rate > by_queue && by_rate >= by_forecast {
        let _ = write!(
            why,
            "; {level:.1} req/s × {:.2} s = {by_rate:.1} in service",
            obs.service_time.unwrap_or(0.0),
        );
    } else if by_prefill > by_queue.max(by_rate).max(by_forecast) {
        let _ = write!(
            why,
            "; prefill {:.0} % busy over target {:.0} % on {serving_now} {}",
            obs.prefill_busy.unwrap_or(0.0) * 100.0,
            tuning.prefill_target * 100.0,
            plural(serving_now.round() as u32)
        );
    } else if by_forecast > by_queue.max(by_rate) && by_forecast >= 1.0 {
        let _ = write!(
            why,
            "; forecast {:.1} req/s in {}s",
            forecast_rate.unwrap_or(0.0),
            scaling.startup_time.as_secs()
        );
    }

    // SLO feedback.
    let slo = &policy.slo;
    let pairs = [
        ("queue wait", obs.queue_wait_p95, slo.queue_wait_p95),
        ("TTFT", obs.ttft_p95, slo.ttft_p95),
        ("latency", obs.latency_p95, slo.latency_p95),
    ];
    let mut slo_factor: f64 = 1.0;
    let mut near_slo = false;
    // More replicas lower a TTFT or latency p95 only through load:
    // requests waiting, or batches large enough that splitting them speeds
    // each request up. A breach with neither (replicas at under half their
    // target, nothing queued) is the replica's own speed on its GPU share,
    // which no replica count fixes: it is reported and not acted on
    // (acting on it ran every such model to maxReplicas in the
    // simulator). Queue wait is load by nature and always counts.
    let busy = obs.waiting > 0.0
        || depth >= 0.5 * f64::from(current) * target
        || obs
            .prefill_busy
            .is_some_and(|u| u >= tuning.prefill_target && tuning.prefill_target > 0.0);
    let mut unhelped = Vec::new();
    for (name, seen, goal) in pairs {
        // A p95 over the last minute counts only while requests are
        // arriving or waiting: after the traffic stops, an old breach is
        // no reason to add replicas, nor an old near miss to keep them.
        let (Some(seen), Some(goal), false) = (seen, goal, quiet) else {
            continue;
        };
        let ratio = seen.as_secs_f64() / goal.as_secs_f64().max(1e-9);
        let queue = name == "queue wait";
        // Whether more replicas would lower this p95 now: queue wait while
        // requests wait; TTFT and latency while the replicas are busy.
        let helps = !in_transit
            && if queue {
                obs.waiting > 0.0
            } else {
                busy && !grown
            };
        if ratio > 1.0 && helps {
            slo_factor = slo_factor.max(ratio.min(tuning.slo_max_step));
            let _ = write!(
                why,
                "; p95 {name} {}ms over SLO {}ms",
                seen.as_millis(),
                goal.as_millis()
            );
        } else if ratio > 1.0 && queue {
            // The queue has drained: the minute-long p95 remembers it.
            // Hold what drained it; adding more would answer an old queue.
            // Or replicas are starting: hold what is on its way.
            near_slo = true;
            let _ = write!(
                why,
                "; p95 queue wait {}ms over SLO {}ms, {}: holding",
                seen.as_millis(),
                goal.as_millis(),
                if in_transit {
                    "replicas starting"
                } else {
                    "queue empty now"
                }
            );
        } else if ratio > 1.0 && grown && busy {
            near_slo = true;
            let _ = write!(
                why,
                "; p95 {name} {}ms over SLO {}ms, measured on {} serving of {}: holding",
                seen.as_millis(),
                goal.as_millis(),
                fewest.round(),
                serving_now.round()
            );
        } else if ratio > 1.0 {
            unhelped.push(name);
        } else if ratio >= 0.8 && (busy || queue) {
            near_slo = true;
        }
    }
    if !unhelped.is_empty() {
        let _ = write!(
            why,
            "; p95 {} over SLO with replicas lightly loaded: more would not help",
            unhelped.join(", ")
        );
    }
    if slo_factor > 1.0 && current > 0 {
        // In proportion to the replicas serving, not to those decided: the
        // p95 covers the last minute, so while replicas added for a breach
        // start it still reads high, and scaling the decided count again
        // every tick compounded (×2 per second, to maxReplicas, in the
        // simulator).
        total = total.max(serving_now.max(1.0) * target * slo_factor);
    }
    let demand = total / target;

    // Idle tracking for scale to zero.
    let active = depth > scaling.activation_queue_depth;
    if active {
        state.idle_since = None;
    } else if state.idle_since.is_none() {
        state.idle_since = Some(now);
    }

    // From zero: KEDA activation, sized by the queue. The activation is
    // recorded as a recommendation, so the scale-down window right after
    // it holds it as HPA's would.
    if current == 0 {
        // A model with a minimum is brought to it whatever the queue says
        // (a fresh install, a Deployment deleted or scaled to zero by
        // hand): `minReplicas` is a capacity guarantee, not a ceiling on
        // activation.
        if !active && scaling.min_replicas > 0 {
            let replicas = floor.min(ceiling);
            record(state, now, replicas);
            return finish(
                state,
                now,
                replicas,
                Mode::Normal,
                format!(
                    "{why} → {replicas} {} (minReplicas; none running)",
                    plural(replicas)
                ),
            );
        }
        if !active {
            return finish(
                state,
                now,
                0,
                Mode::Idle,
                format!(
                    "{why} → stays at 0 (not above activation {})",
                    trim(scaling.activation_queue_depth)
                ),
            );
        }
        let replicas = ceil_u32(demand).clamp(floor, ceiling);
        record(state, now, replicas);
        return finish(
            state,
            now,
            replicas,
            Mode::Activating,
            format!(
                "{why} → {replicas} {} (activated from zero)",
                plural(replicas)
            ),
        );
    }

    // To zero after the cooldown.
    if scaling.min_replicas == 0
        && let Some(since) = state.idle_since
        && now.saturating_sub(since) >= scaling.scale_to_zero_after
    {
        state.panic = None;
        return finish(
            state,
            now,
            0,
            Mode::ScaledToZero,
            format!(
                "{why} → 0 replicas (idle since {} for {}s)",
                clock(since),
                scaling.scale_to_zero_after.as_secs()
            ),
        );
    }

    let raw = ceil_u32(demand).clamp(floor, ceiling);

    // Panic, on the queue or on the 10 s rate. It sizes by the demand
    // above and the queue as it is now, unsmoothed (Knative sizes panic by
    // the concurrency its 6 s window saw), not by the raw rate's Little's
    // law: a few seconds' burst of short requests is not a service time's
    // worth of them.
    let capacity = f64::from(current) * target;
    let by_queue = if in_transit { by_queue } else { depth };
    if by_queue.max(concurrency.unwrap_or(0.0)) >= tuning.panic_threshold * capacity {
        let since = state.panic.map_or(now, |(s, _)| s);
        state.panic = Some((since, now + tuning.stable_window));
    } else if let Some((_, until)) = state.panic
        && now >= until
    {
        state.panic = None;
    }
    if let Some((since, _)) = state.panic {
        let wanted = ceil_u32(demand).max(ceil_u32(by_queue / target));
        let raw = raw.max(ceil_u32(by_queue / target).clamp(floor, ceiling));
        let replicas = raw.max(current).min(ceiling.max(current));
        record(state, now, replicas);
        // Held at maxReplicas with more wanted: said, as the other paths
        // say which bound held the count.
        let capped = if wanted > replicas && replicas == ceiling {
            format!("{wanted} wanted; maxReplicas; ")
        } else {
            String::new()
        };
        return finish(
            state,
            now,
            replicas,
            Mode::Panic,
            format!(
                "{why} → {replicas} {} ({capped}panic since {})",
                plural(replicas),
                clock(since)
            ),
        );
    }

    // HPA (`reconcileAutoscaler`): a count outside minReplicas..maxReplicas
    // goes straight to the bound; otherwise tolerance, stabilisation,
    // then rate limits with min/max in the direction of the change
    // (`normalizeDesiredReplicasWithBehaviors`).
    if current > ceiling || current < floor {
        let replicas = current.clamp(floor, ceiling);
        let bound = if current > ceiling {
            "maxReplicas"
        } else {
            "minReplicas"
        };
        let why = format!("{why} → {replicas} {} ({bound})", plural(replicas));
        return finish(state, now, replicas, Mode::Normal, why);
    }
    // HPA's arithmetic exactly (`GetExternalPerPodMetricReplicas`: the
    // tolerance test sits on float boundaries): the per-replica metric
    // over the target; outside 1 ± tolerance, the total over the target.
    let usage_ratio = total / (target * f64::from(current));
    let within = (1.0 - tuning.tolerance) <= usage_ratio && usage_ratio <= (1.0 + tuning.tolerance);
    let mut desired = if within {
        current
    } else {
        let proposal = (total / target).ceil();
        if proposal.is_finite() && proposal > 0.0 {
            proposal.min(f64::from(u32::MAX)) as u32
        } else {
            0
        }
    };
    if near_slo && desired < current {
        desired = current;
        why.push_str("; near SLO, no scale-down");
    }
    let stabilized = stabilize(state, now, desired, &policy.scale_up, &policy.scale_down);
    let (limited, limit) = rate_limit(
        state,
        now,
        stabilized,
        floor,
        ceiling,
        &policy.scale_up,
        &policy.scale_down,
    );
    let mut reason = format!("{why} → {limited} {}", plural(limited));
    if limited != desired {
        // Held at minReplicas with less wanted: that is the bound, whatever
        // the window also says.
        // (A model that may go to zero is held at 1 by its idle delay,
        // not by a minReplicas of 1.)
        let what = match limit {
            Some(l) => l.to_string(),
            None if limited == floor && desired < floor && scaling.min_replicas == 0 => format!(
                "to zero once idle for {}s, scaleToZeroAfter",
                scaling.scale_to_zero_after.as_secs()
            ),
            None if limited == floor && desired < floor => "minReplicas".to_string(),
            None => "stabilisation window".to_string(),
        };
        let _ = write!(reason, " ({desired} wanted; {what})");
    }
    finish(state, now, limited, Mode::Normal, reason)
}

/// "replica" or "replicas".
fn plural(n: u32) -> &'static str {
    if n == 1 { "replica" } else { "replicas" }
}

/// Records a recommendation for the stabilisation windows. A run of equal
/// recommendations is kept as its last one: a window's min and max over
/// any span ending now are the same with or without the earlier ones (the
/// run reaches into the window exactly when its last entry does), and the
/// windows then scan one entry per change, not one per decision (ten a
/// second on the push stream).
fn record(state: &mut State, now: Duration, replicas: u32) {
    match state.history.back_mut() {
        Some((t, r)) if *r == replicas && *t <= now => *t = now,
        _ => state.history.push_back((now, replicas)),
    }
}

fn trim(x: f64) -> String {
    if (x - x.round()).abs() < 1e-9 {
        format!("{}", x.round())
    } else {
        format!("{x:.2}")
    }
}

fn finish(
    state: &mut State,
    now: Duration,
    replicas: u32,
    mode: Mode,
    reason: String,
) -> Recommendation {
    let (up, down) = state.longest;
    if replicas > state.current {
        store_event(&mut state.up_events, up, now, replicas - state.current);
        state.rose_at = Some(now);
    } else if replicas < state.current {
        store_event(&mut state.down_events, down, now, state.current - replicas);
    }
    state.current = replicas;
    // Nothing older than an hour matters to any window.
    let horizon = now.saturating_sub(Duration::from_secs(3600));
    while state.history.front().is_some_and(|(t, _)| *t < horizon) {
        state.history.pop_front();
    }
    Recommendation {
        replicas,
        reason,
        mode,
    }
}

/// The queue depth smoothed with time constant `tuning.depth_smoothing`
/// (per second, however often it is asked), updated with `depth`.
fn smooth_depth(state: &mut State, tuning: &Tuning, depth: f64, now: Duration) -> f64 {
    let tau = tuning.depth_smoothing.as_secs_f64();
    let value = match state.depth {
        Some((avg, at)) if tau > 0.0 => {
            let dt = now.saturating_sub(at).as_secs_f64();
            avg + (1.0 - (-dt / tau).exp()) * (depth - avg)
        }
        _ => depth,
    };
    state.depth = Some((value, now));
    value
}

/// Holt's linear trend, updated with this observation; returns the
/// smoothed level of the rate and the rate forecast `ahead` from now
/// (`None` before two observations).
fn update_forecast(
    state: &mut State,
    tuning: &Tuning,
    rate: f64,
    now: Duration,
    ahead: Duration,
) -> Option<(f64, f64)> {
    match state.forecast {
        None => {
            state.forecast = Some((rate, 0.0, now));
            None
        }
        Some((level, trend, at)) => {
            let dt = now.saturating_sub(at).as_secs_f64();
            if dt <= 0.0 {
                return Some((level, level + trend * ahead.as_secs_f64()));
            }
            // The smoothing factors are per second: an update after `dt`
            // seconds weighs the new observation 1 − (1 − α)^dt, so the
            // forecast does not depend on how often it is asked (the
            // controller decides on every push, up to ten times a second,
            // and a 0.1 s step of a noisy rate is no trend).
            let per = |x: f64| 1.0 - (1.0 - x.clamp(0.0, 1.0)).powf(dt);
            let (a, b) = (per(tuning.forecast_alpha), per(tuning.forecast_beta));
            let predicted = level + trend * dt;
            let new_level = a * rate + (1.0 - a) * predicted;
            // Trend per second.
            let new_trend = b * (new_level - level) / dt + (1.0 - b) * trend;
            state.forecast = Some((new_level, new_trend, now));
            Some((new_level, new_level + new_trend * ahead.as_secs_f64()))
        }
    }
}

/// HPA's stabilisation: the recommendation is at least the min of those in
/// the scale-up window and at most the max of those in the scale-down
/// window (both including this one), starting from the current count.
fn stabilize(
    state: &mut State,
    now: Duration,
    desired: u32,
    up: &ResolvedRules,
    down: &ResolvedRules,
) -> u32 {
    let mut up_rec = desired;
    let mut down_rec = desired;
    for &(t, r) in &state.history {
        if now.saturating_sub(t) < up.stabilization_window {
            up_rec = up_rec.min(r);
        }
        if now.saturating_sub(t) < down.stabilization_window {
            down_rec = down_rec.max(r);
        }
    }
    record(state, now, desired);
    let mut rec = state.current;
    if rec < up_rec {
        rec = up_rec;
    }
    if rec > down_rec {
        rec = down_rec;
    }
    rec
}

/// HPA's `convertDesiredReplicasWithBehaviorRate`: the rate policies and
/// min/max in the direction of the change. The limits never reverse it:
/// the scale-up limit is at least the current count, the scale-down limit
/// at most it. Returns the count and what limited it, if anything did.
fn rate_limit(
    state: &State,
    now: Duration,
    desired: u32,
    min: u32,
    max: u32,
    up: &ResolvedRules,
    down: &ResolvedRules,
) -> (u32, Option<&'static str>) {
    let current = state.current;
    // HPA's `getReplicasChangePerPeriod`: events after now − period,
    // outdated or not.
    let within = |period: Duration, sign: i64| -> i64 {
        let events = if sign > 0 {
            &state.up_events
        } else {
            &state.down_events
        };
        events
            .iter()
            .filter(|e| now.saturating_sub(e.at) < period)
            .map(|e| i64::from(e.change))
            .sum()
    };
    let cur = i64::from(current);
    let to_u32 = |x: i64| x.clamp(0, i64::from(u32::MAX)) as u32;
    if desired > current {
        let scale_up_limit = if up.select_policy == SelectPolicy::Disabled {
            current
        } else {
            let limits = up.policies.iter().map(|p| {
                let start = cur - within(p.period, 1) + within(p.period, -1);
                match p.kind {
                    RatePolicyType::Pods => start + i64::from(p.value),
                    RatePolicyType::Percent => {
                        (start as f64 * (1.0 + f64::from(p.value) / 100.0)).ceil() as i64
                    }
                }
            });
            let limit = match up.select_policy {
                SelectPolicy::Min => limits.min(),
                _ => limits.max(),
            };
            // No policy: no limit (HPA's MinInt32/MaxInt32 start).
            to_u32(limit.unwrap_or(i64::from(u32::MAX))).max(current)
        };
        let (allowed, why) = if max > scale_up_limit {
            (scale_up_limit, "rate limit")
        } else {
            (max, "maxReplicas")
        };
        if desired > allowed {
            return (allowed, Some(why));
        }
    } else if desired < current {
        let scale_down_limit = if down.select_policy == SelectPolicy::Disabled {
            current
        } else {
            let limits = down.policies.iter().map(|p| {
                let start = cur + within(p.period, -1) - within(p.period, 1);
                match p.kind {
                    RatePolicyType::Pods => start - i64::from(p.value),
                    RatePolicyType::Percent => {
                        (start as f64 * (1.0 - f64::from(p.value) / 100.0)) as i64
                    }
                }
            });
            let limit = match down.select_policy {
                SelectPolicy::Min => limits.max(),
                _ => limits.min(),
            };
            to_u32(limit.unwrap_or(0)).min(current)
        };
        let (allowed, why) = if min < scale_down_limit {
            (scale_down_limit, "rate limit")
        } else {
            (min, "minReplicas")
        };
        if desired < allowed {
            return (allowed, Some(why));
        }
    }
    (desired, None)
}
