//! The autoscalers compared, each a state machine stepped once per
//! simulated second with what the gateway reports (the same
//! [`Observation`]s the controller reads):
//!
//! - **gpuscale**: the real decision round
//!   ([`gpuscale_autoscaler::decide::recommend_all`]: `recommend()` per
//!   model) every tick and on the gateway's pushes (as the controller
//!   does on `/v1/queues/stream`, at most every
//!   [`MIN_EVENT_GAP`](gpuscale_autoscaler::controller::MIN_EVENT_GAP)),
//!   and the packer's answer taken back
//!   ([`gpuscale_autoscaler::decide::take_placement`]).
//! - **HPA v2** ([`Hpa`]), as `pkg/controller/podautoscaler` documents and
//!   implements it: an External metric with an `AverageValue` target (the
//!   gateway's requests in flight plus waiting, per replica, against the
//!   policy's `targetQueueDepth`), synced every 15 s, tolerance 0.1, the
//!   documented default `behavior` written out in the HPA (up: the larger
//!   of 100 % and 4 pods per 15 s, no stabilisation; down: 300 s
//!   stabilisation, 100 % per 15 s; an HPA with no `behavior` at all runs
//!   the older `normalizeDesiredReplicas`, up to max(2×, 4)), at least
//!   one replica; the metric as Prometheus last scraped it (every 15 s,
//!   the sync running 5 s after a scrape).
//! - **KEDA** ([`Keda`]): that HPA, plus KEDA's operator polling every
//!   30 s to activate from zero (metric above the policy's
//!   `activationQueueDepth`) and to go to zero after a 300 s cooldown.
//! - **Knative KPA** ([`Kpa`]), as `pkg/autoscaler/scaling/autoscaler.go`:
//!   concurrency averaged over a 60 s stable and a 6 s panic window,
//!   target `0.7 × maxConcurrency` per replica, panic when the panic
//!   window asks for at least 2× the ready replicas (never scaling down
//!   while in panic, which ends a stable window after the last
//!   over-threshold tick), scale-up rate ≤ 1000×, scale-down ≤ 2× per 2 s
//!   tick, to zero after 30 s grace with no concurrency, and from zero at
//!   once when a request arrives (the activator).
//! - **static-peak** ([`Static`]): a fixed count per model.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use gpuscale_autoscaler::controller::MIN_EVENT_GAP;
use gpuscale_autoscaler::decide::{recommend_all, take_placement};
use gpuscale_autoscaler::{Observation, State, Tuning};
use gpuscale_packer::Plan;
use gpuscale_policies::Model;

/// One autoscaler, stepped every simulated second.
pub trait Autoscaler {
    /// Observes at `now` (seconds since the start) and, when it decides,
    /// returns the replicas wanted per model policy. `current` holds the
    /// counts it set last (what the Deployments' `spec.replicas` say),
    /// `ready` the replicas serving.
    fn step(
        &mut self,
        now: Duration,
        observations: &BTreeMap<String, Observation>,
        current: &BTreeMap<String, u32>,
        ready: &BTreeMap<String, u32>,
    ) -> Option<BTreeMap<String, u32>>;

    /// Whether it also decides on the gateway's pushes, and at most how
    /// often: `None` for the autoscalers that only poll.
    fn pushed(&self) -> Option<Duration> {
        None
    }

    /// A decision on a push (only called when [`Autoscaler::pushed`] says
    /// so); the periodic schedule of [`Autoscaler::step`] is unchanged.
    fn push(
        &mut self,
        _now: Duration,
        _observations: &BTreeMap<String, Observation>,
    ) -> Option<BTreeMap<String, u32>> {
        None
    }

    /// What was placed of the last decision (the packer's plan when it
    /// was the packer). gpuscale takes it back; the others, like HPA, keep
    /// their count (the pods that did not fit stay pending).
    fn placed(&mut self, _plan: Option<&Plan>, _desired: &mut BTreeMap<String, u32>) {}
}

/// gpuscale's controller round.
pub struct Gpuscale {
    models: Vec<Model>,
    tuning: Tuning,
    states: BTreeMap<String, State>,
    tick: Duration,
    next: Duration,
    recs: BTreeMap<String, gpuscale_autoscaler::Recommendation>,
    pushes: bool,
}

impl Gpuscale {
    /// Whether it also decides on the gateway's pushes (the default), or
    /// on its tick alone.
    pub fn on_pushes(mut self, pushes: bool) -> Self {
        self.pushes = pushes;
        self
    }

    /// gpuscale with the default tuning, deciding every `tick`, starting
    /// from `start` replicas per model.
    pub fn new(models: &[Model], tick: Duration, start: &BTreeMap<String, u32>) -> Self {
        Gpuscale {
            states: models
                .iter()
                .map(|m| {
                    (
                        m.name.clone(),
                        State::new(start.get(&m.name).copied().unwrap_or(0)),
                    )
                })
                .collect(),
            models: models.to_vec(),
            tuning: Tuning::default(),
            tick,
            next: Duration::ZERO,
            recs: BTreeMap::new(),
            pushes: true,
        }
    }
}

impl Autoscaler for Gpuscale {
    fn step(
        &mut self,
        now: Duration,
        observations: &BTreeMap<String, Observation>,
        _current: &BTreeMap<String, u32>,
        _ready: &BTreeMap<String, u32>,
    ) -> Option<BTreeMap<String, u32>> {
        if now < self.next {
            return None;
        }
        self.next = now + self.tick;
        self.push(now, observations)
    }

    fn pushed(&self) -> Option<Duration> {
        self.pushes.then_some(MIN_EVENT_GAP)
    }

    fn push(
        &mut self,
        now: Duration,
        observations: &BTreeMap<String, Observation>,
    ) -> Option<BTreeMap<String, u32>> {
        let before = std::mem::take(&mut self.recs);
        self.recs = recommend_all(
            &self.models,
            Some(observations),
            &self.tuning,
            &mut self.states,
            None,
            now,
        );
        for (model, rec) in &self.recs {
            if before.get(model).is_none_or(|b| b.replicas != rec.replicas) {
                tracing::debug!(
                    t = now.as_secs_f64(),
                    model = model.as_str(),
                    replicas = rec.replicas,
                    "{}",
                    rec.reason
                );
            }
        }
        Some(
            self.recs
                .iter()
                .map(|(k, r)| (k.clone(), r.replicas))
                .collect(),
        )
    }

    fn placed(&mut self, plan: Option<&Plan>, desired: &mut BTreeMap<String, u32>) {
        if let Some(plan) = plan {
            take_placement(plan, desired, &mut self.recs, &mut self.states);
        }
    }
}

/// HPA's defaults and the metric pipeline's timing.
#[derive(Debug, Clone, PartialEq)]
pub struct HpaSettings {
    /// `--horizontal-pod-autoscaler-sync-period` (15 s).
    pub sync: Duration,
    /// `--horizontal-pod-autoscaler-tolerance` (0.1).
    pub tolerance: f64,
    /// Prometheus scrape interval (15 s).
    pub scrape: Duration,
    /// Sync offset after a scrape (5 s).
    pub lag: Duration,
    /// Scale-up stabilisation window (0 s).
    pub up_window: Duration,
    /// Scale-down stabilisation window (300 s).
    pub down_window: Duration,
    /// Scale-up policies: (percent, pods) per period (100 %, 4, 15 s),
    /// `selectPolicy: Max`.
    pub up_percent: u32,
    /// See `up_percent`.
    pub up_pods: u32,
    /// Scale-up policy period.
    pub up_period: Duration,
    /// Scale-down: percent per period (100 %, 15 s).
    pub down_percent: u32,
    /// Scale-down policy period.
    pub down_period: Duration,
}

impl Default for HpaSettings {
    fn default() -> Self {
        HpaSettings {
            sync: Duration::from_secs(15),
            tolerance: 0.1,
            scrape: Duration::from_secs(15),
            lag: Duration::from_secs(5),
            up_window: Duration::ZERO,
            down_window: Duration::from_secs(300),
            up_percent: 100,
            up_pods: 4,
            up_period: Duration::from_secs(15),
            down_percent: 100,
            down_period: Duration::from_secs(15),
        }
    }
}

/// One model's HPA memory.
#[derive(Debug, Clone, Default)]
struct HpaModel {
    /// Unstabilised recommendations (time, replicas).
    recommendations: Vec<(Duration, u32)>,
    /// (time, replicas added) and (time, replicas removed).
    up_events: Vec<(Duration, u32)>,
    down_events: Vec<(Duration, u32)>,
    /// The metric as last scraped: requests in flight plus waiting.
    scraped: Option<f64>,
}

/// Kubernetes HPA v2 on the gateway's per-model load.
pub struct Hpa {
    settings: HpaSettings,
    models: Vec<Model>,
    state: BTreeMap<String, HpaModel>,
    next_scrape: Duration,
    next_sync: Duration,
}

impl Hpa {
    /// An HPA per model.
    pub fn new(models: &[Model], settings: HpaSettings) -> Self {
        Hpa {
            next_sync: settings.lag,
            settings,
            models: models.to_vec(),
            state: BTreeMap::new(),
            next_scrape: Duration::ZERO,
        }
    }

    fn scrape(&mut self, now: Duration, observations: &BTreeMap<String, Observation>) {
        if now >= self.next_scrape {
            self.next_scrape = now + self.settings.scrape;
            for m in &self.models {
                let o = observations
                    .get(&m.served_name)
                    .cloned()
                    .unwrap_or_default();
                self.state.entry(m.name.clone()).or_default().scraped =
                    Some(o.waiting + o.in_flight);
            }
        }
    }

    /// One model's sync: the replica count HPA sets.
    fn sync_model(&mut self, m: &Model, now: Duration, current: u32, min: u32) -> u32 {
        let s = &self.settings;
        let st = self.state.entry(m.name.clone()).or_default();
        // `recordInitialRecommendation`: the first reconcile records the
        // current count, so the scale-down window holds it for 300 s (an
        // HPA created with the simulation does not shrink a warm start on
        // its first, empty scrape).
        if st.recommendations.is_empty() {
            st.recommendations.push((now, current));
        }
        // `GetExternalPerPodMetricReplicas`: ratio to the target per pod.
        let Some(usage) = st.scraped else {
            return current;
        };
        if current == 0 {
            // HPA does not act on a target scaled to zero.
            return current;
        }
        let target = m.scaling.target_queue_depth;
        let ratio = usage / (target * f64::from(current));
        let proposed = if (ratio - 1.0).abs() <= s.tolerance {
            current
        } else {
            ceil(usage / target)
        };
        // `stabilizeRecommendationWithBehaviors`.
        let mut up = proposed;
        let mut down = proposed;
        let mut old: Option<usize> = None;
        for (i, &(t, r)) in st.recommendations.iter().enumerate() {
            let after_up = t + s.up_window > now;
            let after_down = t + s.down_window > now;
            if after_up {
                up = up.min(r);
            }
            if after_down {
                down = down.max(r);
            }
            if !after_up && !after_down {
                old = Some(i);
            }
        }
        let mut stabilised = current.max(up);
        stabilised = stabilised.min(down);
        match old {
            Some(i) => st.recommendations[i] = (now, proposed),
            None => st.recommendations.push((now, proposed)),
        }
        // `convertDesiredReplicasWithBehaviorRate`.
        let changed = |events: &[(Duration, u32)], period: Duration| -> u32 {
            events
                .iter()
                .filter(|(t, _)| *t + period > now)
                .map(|(_, c)| c)
                .sum()
        };
        let max = m.scaling.max_replicas.max(min);
        let desired = if stabilised > current {
            let start = i64::from(current) - i64::from(changed(&st.up_events, s.up_period))
                + i64::from(changed(&st.down_events, s.up_period));
            let by_percent = (start as f64 * (1.0 + f64::from(s.up_percent) / 100.0)).ceil() as i64;
            let by_pods = start + i64::from(s.up_pods);
            let limit = by_percent.max(by_pods).max(i64::from(current));
            let allowed = i64::from(max).min(limit);
            (i64::from(stabilised).min(allowed)) as u32
        } else if stabilised < current {
            let start = i64::from(current) - i64::from(changed(&st.up_events, s.down_period))
                + i64::from(changed(&st.down_events, s.down_period));
            let limit = ((start as f64) * (1.0 - f64::from(s.down_percent) / 100.0)) as i64;
            let limit = limit.min(i64::from(current));
            let allowed = i64::from(min).max(limit);
            (i64::from(stabilised).max(allowed)) as u32
        } else {
            stabilised
        };
        let desired = desired.clamp(min, max);
        if desired > current {
            st.up_events.push((now, desired - current));
        } else if desired < current {
            st.down_events.push((now, current - desired));
        }
        let horizon = s.up_period.max(s.down_period);
        st.up_events.retain(|(t, _)| *t + horizon > now);
        st.down_events.retain(|(t, _)| *t + horizon > now);
        desired
    }
}

fn ceil(x: f64) -> u32 {
    if x.is_finite() && x > 0.0 {
        (x - 1e-9).ceil().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

impl Autoscaler for Hpa {
    fn step(
        &mut self,
        now: Duration,
        observations: &BTreeMap<String, Observation>,
        current: &BTreeMap<String, u32>,
        _ready: &BTreeMap<String, u32>,
    ) -> Option<BTreeMap<String, u32>> {
        self.scrape(now, observations);
        if now < self.next_sync {
            return None;
        }
        self.next_sync = now + self.settings.sync;
        let models = self.models.clone();
        Some(
            models
                .iter()
                .map(|m| {
                    let c = current.get(&m.name).copied().unwrap_or(0);
                    let min = m.scaling.min_replicas.max(1);
                    (m.name.clone(), self.sync_model(m, now, c, min))
                })
                .collect(),
        )
    }
}

/// KEDA's operator settings.
#[derive(Debug, Clone, PartialEq)]
pub struct KedaSettings {
    /// `pollingInterval` (30 s).
    pub polling: Duration,
    /// `cooldownPeriod` (300 s).
    pub cooldown: Duration,
}

impl Default for KedaSettings {
    fn default() -> Self {
        KedaSettings {
            polling: Duration::from_secs(30),
            cooldown: Duration::from_secs(300),
        }
    }
}

/// KEDA: activation and scale to zero by its operator, HPA above one.
pub struct Keda {
    hpa: Hpa,
    settings: KedaSettings,
    models: Vec<Model>,
    next_poll: Duration,
    last_active: BTreeMap<String, Duration>,
}

impl Keda {
    /// A ScaledObject per model.
    pub fn new(models: &[Model], hpa: HpaSettings, settings: KedaSettings) -> Self {
        Keda {
            hpa: Hpa::new(models, hpa),
            settings,
            models: models.to_vec(),
            next_poll: Duration::ZERO,
            last_active: BTreeMap::new(),
        }
    }
}

impl Autoscaler for Keda {
    fn step(
        &mut self,
        now: Duration,
        observations: &BTreeMap<String, Observation>,
        current: &BTreeMap<String, u32>,
        ready: &BTreeMap<String, u32>,
    ) -> Option<BTreeMap<String, u32>> {
        let mut out = self.hpa.step(now, observations, current, ready);
        if now >= self.next_poll {
            self.next_poll = now + self.settings.polling;
            let mut counts = out.clone().unwrap_or_else(|| current.clone());
            for m in &self.models {
                // The scaler's metric (the Prometheus query, as scraped).
                let value = self
                    .hpa
                    .state
                    .get(&m.name)
                    .and_then(|s| s.scraped)
                    .unwrap_or(0.0);
                let active = value > m.scaling.activation_queue_depth;
                let c = counts.get(&m.name).copied().unwrap_or(0);
                if active {
                    self.last_active.insert(m.name.clone(), now);
                    if c == 0 {
                        counts.insert(m.name.clone(), m.scaling.min_replicas.max(1));
                    }
                } else if m.scaling.min_replicas == 0 && c > 0 {
                    // Never active: KEDA scales to zero at once (its
                    // `initialCooldownPeriod` defaults to 0).
                    let cooled = self
                        .last_active
                        .get(&m.name)
                        .is_none_or(|&since| now >= since + self.settings.cooldown);
                    if cooled {
                        counts.insert(m.name.clone(), 0);
                    }
                }
            }
            out = Some(counts);
        }
        out
    }
}

/// Knative KPA settings (the `config-autoscaler` defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct KpaSettings {
    /// `stable-window` (60 s).
    pub stable_window: Duration,
    /// `panic-window-percentage` (10 %: 6 s).
    pub panic_window: Duration,
    /// `panic-threshold-percentage` (200 %).
    pub panic_threshold: f64,
    /// `container-concurrency-target-percentage` (70 %).
    pub target_utilization: f64,
    /// `max-scale-up-rate` (1000).
    pub max_scale_up_rate: f64,
    /// `max-scale-down-rate` (2).
    pub max_scale_down_rate: f64,
    /// `scale-to-zero-grace-period` (30 s).
    pub scale_to_zero_grace: Duration,
    /// The autoscaler's tick (2 s).
    pub tick: Duration,
}

impl Default for KpaSettings {
    fn default() -> Self {
        KpaSettings {
            stable_window: Duration::from_secs(60),
            panic_window: Duration::from_secs(6),
            panic_threshold: 2.0,
            target_utilization: 0.7,
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
            scale_to_zero_grace: Duration::from_secs(30),
            tick: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct KpaModel {
    /// Per-second concurrency samples (time, value).
    samples: VecDeque<(Duration, f64)>,
    panic_since: Option<Duration>,
    max_panic_pods: u32,
    /// Since when the stable window has seen no concurrency.
    idle_since: Option<Duration>,
}

/// Knative's KPA.
pub struct Kpa {
    settings: KpaSettings,
    models: Vec<Model>,
    state: BTreeMap<String, KpaModel>,
    next_tick: Duration,
}

impl Kpa {
    /// A KPA per model.
    pub fn new(models: &[Model], settings: KpaSettings) -> Self {
        Kpa {
            settings,
            models: models.to_vec(),
            state: BTreeMap::new(),
            next_tick: Duration::ZERO,
        }
    }

    /// Whether a model's KPA is panicking.
    pub fn in_panic(&self, model: &str) -> bool {
        self.state
            .get(model)
            .is_some_and(|s| s.panic_since.is_some())
    }

    fn scale(&mut self, m: &Model, now: Duration, current: u32, ready: u32) -> u32 {
        let s = self.settings.clone();
        let st = self.state.entry(m.name.clone()).or_default();
        let avg = |window: Duration| -> f64 {
            let v: Vec<f64> = st
                .samples
                .iter()
                .filter(|(t, _)| *t + window > now)
                .map(|(_, x)| *x)
                .collect();
            if v.is_empty() {
                0.0
            } else {
                v.iter().sum::<f64>() / v.len() as f64
            }
        };
        let stable = avg(s.stable_window);
        let panic = avg(s.panic_window);
        let target = (f64::from(m.max_concurrency) * s.target_utilization).max(0.01);
        let ready_pods = f64::from(ready.max(1));
        let max_up = (s.max_scale_up_rate * ready_pods).ceil();
        let max_down = (ready_pods / s.max_scale_down_rate).floor();
        let dspc = (stable / target).ceil();
        let dppc = (panic / target).ceil();
        let desired_stable = dspc.max(max_down).min(max_up) as u32;
        let desired_panic = dppc.max(max_down).min(max_up) as u32;
        let over = dppc / ready_pods >= s.panic_threshold;
        if over {
            st.panic_since = Some(now);
        } else if let Some(p) = st.panic_since
            && p + s.stable_window < now
        {
            st.panic_since = None;
            st.max_panic_pods = 0;
        }
        // The simulation starts empty, while a KPA that ran before it
        // would hold a stable window of the load then: no scale-down
        // until the window holds the simulation's own full minute (the
        // same warm start gpuscale's and HPA's windows get).
        let warming = now < s.stable_window;
        let desired_stable = if warming {
            desired_stable.max(current)
        } else {
            desired_stable
        };
        let mut desired = desired_stable;
        if st.panic_since.is_some() {
            desired = desired.max(desired_panic);
            if desired > st.max_panic_pods {
                st.max_panic_pods = desired;
            } else {
                desired = st.max_panic_pods;
            }
        }
        // Scale to zero only after the grace period with nothing in the
        // stable window.
        if stable > 0.0 {
            st.idle_since = None;
        } else if st.idle_since.is_none() {
            st.idle_since = Some(now);
        }
        if desired == 0 && current > 0 {
            let idle_long = st
                .idle_since
                .is_some_and(|t| t + s.scale_to_zero_grace <= now);
            if !idle_long || m.scaling.min_replicas > 0 {
                desired = 1;
            }
        }
        desired.clamp(
            m.scaling.min_replicas,
            m.scaling.max_replicas.max(m.scaling.min_replicas),
        )
    }
}

impl Autoscaler for Kpa {
    fn step(
        &mut self,
        now: Duration,
        observations: &BTreeMap<String, Observation>,
        current: &BTreeMap<String, u32>,
        ready: &BTreeMap<String, u32>,
    ) -> Option<BTreeMap<String, u32>> {
        let window = self.settings.stable_window;
        let mut activate = Vec::new();
        for m in &self.models {
            let o = observations
                .get(&m.served_name)
                .cloned()
                .unwrap_or_default();
            let st = self.state.entry(m.name.clone()).or_default();
            st.samples.push_back((now, o.waiting + o.in_flight));
            while st.samples.front().is_some_and(|(t, _)| *t + window <= now) {
                st.samples.pop_front();
            }
            // The activator holds the request and pokes the autoscaler.
            if current.get(&m.name).copied().unwrap_or(0) == 0 && o.waiting > 0.0 {
                activate.push(m.name.clone());
            }
        }
        let tick = now >= self.next_tick;
        if !tick && activate.is_empty() {
            return None;
        }
        if tick {
            self.next_tick = now + self.settings.tick;
        }
        let models = self.models.clone();
        Some(
            models
                .iter()
                .map(|m| {
                    let c = current.get(&m.name).copied().unwrap_or(0);
                    let woken = activate.contains(&m.name);
                    // Between ticks only a model the activator wakes is
                    // scaled (to one); the others keep their count.
                    if !tick && !woken {
                        return (m.name.clone(), c);
                    }
                    let r = ready.get(&m.name).copied().unwrap_or(0);
                    let mut d = if tick { self.scale(m, now, c, r) } else { c };
                    if woken {
                        d = d.max(1);
                    }
                    (m.name.clone(), d)
                })
                .collect(),
        )
    }
}

/// A fixed count per model.
pub struct Static {
    counts: BTreeMap<String, u32>,
    done: bool,
}

impl Static {
    /// Always `counts`.
    pub fn new(counts: BTreeMap<String, u32>) -> Self {
        Static {
            counts,
            done: false,
        }
    }
}

impl Autoscaler for Static {
    fn step(
        &mut self,
        _now: Duration,
        _observations: &BTreeMap<String, Observation>,
        _current: &BTreeMap<String, u32>,
        _ready: &BTreeMap<String, u32>,
    ) -> Option<BTreeMap<String, u32>> {
        if self.done {
            return None;
        }
        self.done = true;
        Some(self.counts.clone())
    }
}
