//! The discrete-event loop: arrivals, the gateway's admission (the real
//! [`Pool`]: least outstanding, a bounded queue per priority class,
//! displacement, 429 when full, 503 after the queue timeout), replicas
//! serving at their share's speed (the [`ServiceProfile`] shared with
//! `gpuscale sim-server`), cold starts, and the autoscaler stepped every
//! simulated second (and, for gpuscale, on the gateway's pushes) with the
//! gateway's view (built by the gateway's own
//! [`QueueView`] and statistics, read by the autoscaler's own
//! [`observations`]). Deterministic: no clock, no thread, ties broken by
//! event order.
//!
//! A request's service time is fixed when it starts, from the batch it
//! joins (`running` then, itself included); a request that joins later
//! does not slow one already running. GPU-hours, cost and utilisation are
//! integrated exactly between events over `[0, duration]`; requests still
//! queued or running at the end are served to completion (the autoscaler
//! keeps running) so that every request is counted once.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::time::{Duration, Instant};

use gpuscale_autoscaler::Observation;
use gpuscale_autoscaler::observe::observations;
use gpuscale_gateway::admission::{self, Enqueued, Pool, ReplicaId};
use gpuscale_gateway::affinity::Hint;
use gpuscale_gateway::config::{Endpoint, QueueOrder, SloSeconds, newest_first_after};
use gpuscale_gateway::state::QueueView;
use gpuscale_gateway::stats::ModelStats;
use gpuscale_policies::serving::{PrefillLane, ServiceProfile};
use gpuscale_policies::{Model, Priority};

use crate::arrivals::Arrival;
use crate::control::Autoscaler;
use crate::histogram::Histogram;
use crate::placement::{Placer, Slot};
use crate::scenario::ColdStartSpec;

/// A step burst of one model, for the reaction figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Onset {
    /// Model index.
    pub model: usize,
    /// The step's scheduled start (seconds).
    pub step: f64,
    /// The first request of the model at or after it: where the burst is
    /// first observable (as the live reaction bench times from the first
    /// request of its burst). Bursty arrivals (a Gamma CV of 4) may leave
    /// seconds between the two.
    pub first_request: f64,
}

/// What a run needs besides the autoscaler and the placer.
pub struct Setup<'a> {
    /// The model policies.
    pub models: &'a [Model],
    /// Per workload: its model's index.
    pub workload_models: &'a [usize],
    /// Per workload: the service profile at speed 1.
    pub services: &'a [ServiceProfile],
    /// Per workload: its requests' priority.
    pub priorities: &'a [Priority],
    /// Arrivals in time order.
    pub arrivals: &'a [Arrival],
    /// Seconds of arrivals and of accounting.
    pub duration: f64,
    /// Gateway queue bound per model.
    pub max_queue: usize,
    /// Longest wait in the queue.
    pub queue_timeout: f64,
    /// The order of each class's waiters (the gateway's `queue.order`).
    pub queue_order: QueueOrder,
    /// The gateway's `queue.newestFirstAfter`.
    pub newest_first_after: Duration,
    /// The gateway scrapes the replicas' metrics every tick.
    pub scrape: bool,
    /// Cold starts.
    pub cold_start: &'a ColdStartSpec,
    /// Burst onsets, for the reaction figures.
    pub onsets: &'a [Onset],
    /// Seconds between points of the time series.
    pub series_step: f64,
    /// Replicas per model already serving at the start (no cold start).
    pub initial: &'a BTreeMap<String, u32>,
}

/// One point of a run's time series.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Point {
    /// Seconds since the start.
    pub t: f64,
    /// Arrivals per second over the last step.
    pub load: f64,
    /// Replicas the autoscaler wants, all models.
    pub replicas: u32,
    /// Replicas serving.
    pub ready: u32,
    /// GPUs holding a replica.
    pub gpus: u32,
    /// Memory utilisation of those GPUs now.
    pub utilization_memory: f64,
    /// Compute utilisation of those GPUs now.
    pub utilization_compute: f64,
    /// Requests that arrived over the last step and missed an SLO target
    /// of their model or were turned away (429, 503): where a run's
    /// misses were.
    pub missed: u64,
}

/// Per-model figures of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelOutcome {
    /// Requests that arrived.
    pub requests: u64,
    /// Served within every SLO target.
    pub within_slo: u64,
    /// Answered 429 or 503.
    pub rejected: u64,
    /// End-to-end latencies of served requests.
    pub latency: Histogram,
    /// Its SLO declares a cold-start allowance.
    pub allowance: bool,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Requests that arrived.
    pub requests: u64,
    /// Served.
    pub completed: u64,
    /// Refused at admission: queue full, or displaced (429).
    pub rejected_full: u64,
    /// Timed out in the queue (503).
    pub timed_out: u64,
    /// Served within every SLO target of their model.
    pub within_slo: u64,
    /// End-to-end latency (arrival to last token) of served requests.
    pub latency: Histogram,
    /// Arrival to first token.
    pub ttft: Histogram,
    /// Time in the gateway's queue.
    pub queue_wait: Histogram,
    /// GPU-hours over the duration.
    pub gpu_hours: f64,
    /// Cost over the duration.
    pub cost: f64,
    /// ∫ allocated memory ÷ ∫ usable memory of GPUs holding a replica.
    pub utilization_memory: f64,
    /// ∫ busy compute ÷ ∫ compute of GPUs holding a replica.
    pub utilization_compute: f64,
    /// Decisions that changed a model's count.
    pub scale_events: u64,
    /// Replicas started.
    pub replica_starts: u64,
    /// Replicas stopped by a re-plan and started elsewhere (beyond what
    /// their model's scale-down stopped).
    pub replica_moves: u64,
    /// ∫ memory allocated beyond GPUs' usable memory ÷ ∫ allocated: 0, as
    /// replicas wait for their memory (a check for tests).
    pub memory_overcommit: f64,
    /// Per burst onset: seconds from the burst's first request to the
    /// first scale-up decision.
    pub reaction_decision: Vec<f64>,
    /// Per burst onset: seconds from the step's scheduled start to that
    /// decision (the first request may come later: bursty arrivals).
    pub reaction_decision_step: Vec<f64>,
    /// Per burst onset: seconds from the first moment the burst overloads
    /// its model (requests in flight and waiting above `targetQueueDepth`
    /// per serving replica) to that decision: the control loop's own
    /// delay.
    pub reaction_decision_overload: Vec<f64>,
    /// Per burst onset: seconds from the burst's first request until the
    /// replicas of that decision serve.
    pub reaction_ready: Vec<f64>,
    /// Decisions whose counts the cluster could not hold: the placement
    /// placed fewer replicas of some model than the autoscaler asked.
    pub capacity_shortfalls: u64,
    /// The most replicas (over all models) one such decision was short.
    pub capacity_short_most: u32,
    /// Per model policy name.
    pub models: BTreeMap<String, ModelOutcome>,
    /// The time series.
    pub series: Vec<Point>,
    /// Requests that missed an SLO target or were turned away, all.
    pub missed: u64,
    /// Of those, the ones that arrived in the first [`STEP_WINDOW_S`]
    /// seconds of a step burst (`None`: the scenario has no steps). A
    /// reactive autoscaler's misses there are its reaction plus a cold
    /// start, whatever it does after.
    pub missed_in_steps: Option<u64>,
    /// Misses per series step, by arrival (index `ceil(arrival / step)`,
    /// the point whose step the arrival falls in).
    missed_by_step: Vec<u64>,
    /// Simulated seconds until the last request was answered.
    pub end: f64,
}

/// How long after a step burst's scheduled start its misses are counted
/// as the burst's (`Outcome::missed_in_steps`): a minute, longer than
/// the scenarios' cold starts plus a reaction.
pub const STEP_WINDOW_S: f64 = 60.0;

impl Outcome {
    /// A request that arrived at `arrival` missed (an SLO target, or it
    /// was turned away).
    fn miss(&mut self, arrival: f64, setup: &Setup<'_>) {
        self.missed += 1;
        let b = (arrival / setup.series_step.max(1e-9)).ceil().max(0.0) as usize;
        if self.missed_by_step.len() <= b {
            self.missed_by_step.resize(b + 1, 0);
        }
        self.missed_by_step[b] += 1;
        if let Some(n) = self.missed_in_steps.as_mut()
            && setup
                .onsets
                .iter()
                .any(|o| arrival >= o.step && arrival < o.step + STEP_WINDOW_S)
        {
            *n += 1;
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A request finishes on a replica.
    Complete { rep: usize, req: u64 },
    /// A replica's cold start ends.
    Ready { rep: usize },
    /// A queued request's wait runs out.
    Timeout { model: usize, req: u64 },
    /// The autoscaler's step.
    Tick,
    /// The gateway's push to an autoscaler that listens for them.
    Decide,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RepState {
    Starting,
    Ready,
    /// Moved by a re-plan, still serving until a new replica of its model
    /// is ready (make before break); not in its model's `live`.
    Outgoing,
    Draining,
    Gone,
    /// Placed where a replica that has left its pool still holds memory
    /// (draining its last requests): like a pod pending until the one it
    /// replaces on that GPU has terminated, it starts (its cold start
    /// begins) once its memory fits. Counted as starting.
    Waiting,
}

struct Rep {
    model: usize,
    slot: Slot,
    state: RepState,
    running: u32,
    id: Option<ReplicaId>,
    endpoint: Endpoint,
    /// Its prefills, one at a time.
    lane: PrefillLane,
}

struct Pending {
    arrival: f64,
    workload: usize,
    prompt: u32,
    output: u32,
    /// When it left the queue, and the time to its first token from then.
    started: f64,
    first: f64,
    /// Compute it keeps busy while it runs (its share of its replica's).
    busy: f64,
    /// It arrived while its model had no replica serving (its SLO then
    /// has the model's cold-start allowance added).
    cold: bool,
}

struct ModelRt {
    pool: Pool<u64>,
    stats: ModelStats,
    live: BTreeMap<String, usize>,
    /// Replicas a re-plan moved that serve until their successors are
    /// ready, oldest first.
    outgoing: Vec<usize>,
    /// Replicas waiting for memory on their GPUs ([`RepState::Waiting`]).
    waiting: Vec<usize>,
    /// Pool replica id → index in the run's replicas.
    by_id: HashMap<ReplicaId, usize>,
}

/// Time as ordered integer nanoseconds.
fn ns(t: f64) -> u64 {
    (t * 1e9).round().max(0.0) as u64
}

/// Running sums of what is integrated over time.
#[derive(Default)]
struct Gauges {
    gpus: HashMap<(String, u32), u32>,
    on: u32,
    price: f64,
    usable: f64,
    compute: f64,
    allocated: f64,
    busy: f64,
    /// Memory allocated per GPU, and how far it exceeds the GPU's usable
    /// memory in total (a check: a replica waits for its memory, so it
    /// stays 0).
    per_gpu: HashMap<(String, u32), f64>,
    excess: f64,
    excess_seconds: f64,
    // Integrals.
    gpu_seconds: f64,
    cost_seconds: f64,
    usable_seconds: f64,
    allocated_seconds: f64,
    compute_seconds: f64,
    busy_seconds: f64,
    last: f64,
    /// When the serving image is (or will be) on each node: pulled once
    /// per node, as the kubelet keeps images (`IfNotPresent`, the
    /// Kubernetes backend's pull policy); a second replica started during
    /// the pull waits for the same pull.
    images: HashMap<String, f64>,
}

impl Gauges {
    fn advance(&mut self, to: f64, until: f64) {
        let to_c = to.min(until);
        if to_c > self.last {
            let dt = to_c - self.last;
            self.gpu_seconds += f64::from(self.on) * dt;
            self.cost_seconds += self.price * dt;
            self.usable_seconds += self.usable * dt;
            self.allocated_seconds += self.allocated * dt;
            self.excess_seconds += self.excess * dt;
            self.compute_seconds += self.compute * dt;
            self.busy_seconds += self.busy * dt;
        }
        self.last = self.last.max(to_c);
    }

    /// Whether a slot's memory fits beside what its GPUs hold now.
    fn fits(&self, slot: &Slot, placer: &dyn Placer) -> bool {
        slot.gpus.iter().all(|(node, i)| {
            let (usable, _, _) = placer.gpu(node);
            let held = self
                .per_gpu
                .get(&(node.clone(), *i))
                .copied()
                .unwrap_or(0.0);
            held + slot.memory_per_gpu <= usable + 1e-6
        })
    }

    fn occupy(&mut self, slot: &Slot, placer: &dyn Placer, sign: f64) {
        for (node, i) in &slot.gpus {
            let (usable, compute, price) = placer.gpu(node);
            let c = self.gpus.entry((node.clone(), *i)).or_default();
            if sign > 0.0 {
                if *c == 0 {
                    self.on += 1;
                    self.price += price;
                    self.usable += usable;
                    self.compute += compute;
                }
                *c += 1;
            } else {
                *c = c.saturating_sub(1);
                if *c == 0 {
                    self.on -= 1;
                    self.price -= price;
                    self.usable -= usable;
                    self.compute -= compute;
                }
            }
            self.allocated += sign * slot.memory_per_gpu;
            let a = self.per_gpu.entry((node.clone(), *i)).or_default();
            let before = (*a - usable).max(0.0);
            *a += sign * slot.memory_per_gpu;
            self.excess += (*a - usable).max(0.0) - before;
        }
    }
}

/// Runs one autoscaler with one placer over the arrivals.
pub fn run(setup: &Setup<'_>, autoscaler: &mut dyn Autoscaler, placer: &mut dyn Placer) -> Outcome {
    let base = Instant::now();
    let at = |t: f64| base + Duration::from_secs_f64(t.max(0.0));
    let models = setup.models;
    let mut rt: Vec<ModelRt> = models
        .iter()
        .map(|m| ModelRt {
            pool: {
                // The gateway's rule, from one place.
                let mut pool = Pool::new(setup.max_queue, m.max_concurrency);
                pool.set_newest_first_after(newest_first_after(
                    setup.queue_order,
                    &SloSeconds::of(&m.slo),
                    setup.newest_first_after,
                ));
                pool
            },
            stats: ModelStats::new(base),
            live: BTreeMap::new(),
            outgoing: Vec::new(),
            waiting: Vec::new(),
            by_id: HashMap::new(),
        })
        .collect();
    let mut reps: Vec<Rep> = Vec::new();
    let mut pending: HashMap<u64, Pending> = HashMap::new();
    let mut heap: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |heap: &mut BinaryHeap<Reverse<(u64, u64, Event)>>, t: f64, e: Event| {
        seq += 1;
        heap.push(Reverse((ns(t), seq, e)));
    };
    let mut out = Outcome {
        missed_in_steps: (!setup.onsets.is_empty()).then_some(0),
        ..Outcome::default()
    };
    for m in models {
        out.models.insert(
            m.name.clone(),
            ModelOutcome {
                allowance: m.slo.cold_start_allowance.is_some(),
                ..ModelOutcome::default()
            },
        );
    }
    let mut g = Gauges::default();
    let mut current: BTreeMap<String, u32> = models.iter().map(|m| (m.name.clone(), 0)).collect();
    let mut next_arrival = 0usize;
    let mut next_id = 0u64;
    // Reaction tracking: per onset, (decided at, count decided).
    let mut reaction: Vec<Option<(f64, u32)>> = vec![None; setup.onsets.len()];
    let mut reaction_ready: Vec<Option<f64>> = vec![None; setup.onsets.len()];
    // Per onset: when the burst first overloads its model (requests in
    // flight and waiting above the target per serving replica).
    let mut overload: Vec<Option<f64>> = vec![None; setup.onsets.len()];
    let mut series_next = 0.0;
    let mut series_arrivals = 0u64;
    if setup.initial.values().any(|&n| n > 0) {
        let mut desired = setup.initial.clone();
        let slots = placer.place(&desired, 0.0);
        short_of(&desired, &slots, &mut out);
        autoscaler.placed(placer.plan(), &mut desired);
        let claimed = claimed_gpus(models, &slots, &rt);
        for (i, m) in models.iter().enumerate() {
            let empty = Vec::new();
            let want = slots.get(&m.name).unwrap_or(&empty);
            apply(
                i,
                want,
                &claimed,
                0.0,
                true,
                setup,
                &mut reps,
                &mut rt,
                &mut g,
                placer,
                &mut out,
                &mut |t, e| push(&mut heap, t, e),
            );
        }
        out.replica_starts = 0;
        current = desired;
    }
    push(&mut heap, 0.0, Event::Tick);
    // Pushed decisions: the gateway pushes its queues 10 ms after a change
    // (coalesced); the controller decides at most every `gap`. Pushed
    // here on every arrival (completions only lower the load: the next
    // tick sees them).
    let gap = autoscaler.pushed().map(|d| d.as_secs_f64());
    let mut last_decision = f64::NEG_INFINITY;
    let mut push_due = false;
    let limit = setup.duration + setup.queue_timeout + 3600.0;

    // Starts a request on a replica.
    #[allow(clippy::too_many_arguments)]
    fn start(
        setup: &Setup<'_>,
        reps: &mut [Rep],
        rt: &mut [ModelRt],
        pending: &mut HashMap<u64, Pending>,
        g: &mut Gauges,
        out: &mut Outcome,
        now: f64,
        base: Instant,
        m: usize,
        req: u64,
        id: ReplicaId,
    ) -> Option<(f64, Event)> {
        let p = pending.get_mut(&req)?;
        let r = *rt[m].by_id.get(&id)?;
        let rep = &mut reps[r];
        rep.running += 1;
        let mut profile = setup.services[p.workload].clone();
        profile.speed = rep.slot.speed.max(1e-6);
        let (service, first) = profile.service(p.prompt, p.output, rep.running);
        // The prefill waits for those booked before it on this replica.
        let prefill = profile.prefill(p.prompt).as_secs_f64();
        let behind = rep.lane.book(now, prefill) - now - prefill;
        let service = service.as_secs_f64() + behind;
        p.started = now;
        p.first = first.as_secs_f64() + behind;
        let wait = now - p.arrival;
        let stamp = base + Duration::from_secs_f64(now);
        rt[m].stats.queue_wait.record(stamp, wait);
        out.queue_wait.record(wait);
        p.busy = rep.slot.speed / f64::from(setup.models[m].max_concurrency.max(1));
        g.busy += p.busy;
        Some((now + service, Event::Complete { rep: r, req }))
    }

    // Hands a model's free slots to its waiters and starts them.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        setup: &Setup<'_>,
        reps: &mut [Rep],
        rt: &mut [ModelRt],
        pending: &mut HashMap<u64, Pending>,
        g: &mut Gauges,
        out: &mut Outcome,
        now: f64,
        base: Instant,
        m: usize,
    ) -> Vec<(f64, Event)> {
        let grants = rt[m]
            .pool
            .dispatch(base + Duration::from_secs_f64(now.max(0.0)));
        grants
            .into_iter()
            .filter_map(|(req, slot)| {
                start(
                    setup,
                    reps,
                    rt,
                    pending,
                    g,
                    out,
                    now,
                    base,
                    m,
                    req,
                    slot.replica,
                )
            })
            .collect()
    }

    loop {
        let next_event = heap.peek().map(|Reverse((t, _, _))| *t);
        let arrival = setup.arrivals.get(next_arrival);
        let take_arrival = match (arrival, next_event) {
            (Some(a), Some(t)) => ns(a.at) <= t,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if take_arrival {
            let a = *arrival.expect("checked");
            next_arrival += 1;
            let now = a.at;
            g.advance(now, setup.duration);
            let w = a.workload as usize;
            let m = setup.workload_models[w];
            let id = next_id;
            next_id += 1;
            out.requests += 1;
            series_arrivals += 1;
            if let Some(mo) = out.models.get_mut(&models[m].name) {
                mo.requests += 1;
            }
            rt[m].stats.arrivals.record(at(now));
            pending.insert(
                id,
                Pending {
                    arrival: now,
                    workload: w,
                    prompt: a.prompt,
                    output: a.output,
                    started: now,
                    first: 0.0,
                    busy: 0.0,
                    cold: rt[m].pool.ready_replicas() == 0,
                },
            );
            if let Some(gap) = gap
                && !push_due
            {
                push_due = true;
                push(
                    &mut heap,
                    (now + 0.010).max(last_decision + gap),
                    Event::Decide,
                );
            }
            // The trace has token counts, not prompts: no prefix key, so
            // the gateway's choice is least-outstanding.
            match rt[m].pool.acquire(at(now), Hint::default()) {
                Some(admission::Slot { replica: rid, .. }) => {
                    if let Some((t, e)) = start(
                        setup,
                        &mut reps,
                        &mut rt,
                        &mut pending,
                        &mut g,
                        &mut out,
                        now,
                        base,
                        m,
                        id,
                        rid,
                    ) {
                        push(&mut heap, t, e);
                    }
                }
                None => {
                    match rt[m]
                        .pool
                        .enqueue(id, setup.priorities[w], Hint::default(), id, at(now))
                    {
                        Enqueued::Waiting => push(
                            &mut heap,
                            now + setup.queue_timeout,
                            Event::Timeout { model: m, req: id },
                        ),
                        Enqueued::Rejected(r) => {
                            reject(&mut pending, &mut out, setup, m, r, false);
                        }
                        // Another waiter gave up its place: 429 when
                        // displaced by a more important one (or by another
                        // client's, which one population never is), 503
                        // when overdue.
                        given_up @ (Enqueued::Displaced(r)
                        | Enqueued::Overdue(r)
                        | Enqueued::Crowded(r)) => {
                            push(
                                &mut heap,
                                now + setup.queue_timeout,
                                Event::Timeout { model: m, req: id },
                            );
                            waited(&pending, &mut rt, &mut out, m, r, now, at(now));
                            let overdue = matches!(given_up, Enqueued::Overdue(_));
                            reject(&mut pending, &mut out, setup, m, r, overdue);
                        }
                    }
                }
            }
            for (k, o) in setup.onsets.iter().enumerate() {
                if o.model == m && overload[k].is_none() && now >= o.first_request {
                    let pool = &rt[m].pool;
                    let load = f64::from(pool.in_flight()) + pool.waiting() as f64;
                    let ready = f64::from(ready_count(&reps, &rt[m]));
                    if load > models[m].scaling.target_queue_depth * ready {
                        overload[k] = Some(now);
                    }
                }
            }
            continue;
        }
        let Some(Reverse((t, _, event))) = heap.pop() else {
            break;
        };
        let now = t as f64 / 1e9;
        g.advance(now, setup.duration);
        match event {
            Event::Complete { rep, req } => {
                let Some(p) = pending.remove(&req) else {
                    continue;
                };
                let r = &mut reps[rep];
                let m = r.model;
                r.running -= 1;
                g.busy -= p.busy;
                let latency = now - p.arrival;
                let model = &models[m];
                let ttft = p.started + p.first - p.arrival;
                let stamp = at(now);
                rt[m].stats.latency.record(stamp, now - p.started);
                rt[m].stats.ttft.record(stamp, p.first);
                out.completed += 1;
                out.latency.record(latency);
                out.ttft.record(ttft);
                let wait = p.started - p.arrival;
                let allowed = match model.slo.cold_start_allowance {
                    Some(a) if p.cold => a.as_secs_f64(),
                    _ => 0.0,
                };
                let within = |x: f64, target: Option<Duration>| {
                    target.is_none_or(|d| x <= d.as_secs_f64() + allowed + 1e-9)
                };
                let ok = within(latency, model.slo.latency_p95)
                    && within(ttft, model.slo.ttft_p95)
                    && within(wait, model.slo.queue_wait_p95);
                if let Some(mo) = out.models.get_mut(&model.name) {
                    mo.latency.record(latency);
                    if ok {
                        mo.within_slo += 1;
                    }
                }
                if ok {
                    out.within_slo += 1;
                } else {
                    out.miss(p.arrival, setup);
                }
                let id = r.id;
                let draining_idle = r.state == RepState::Draining && r.running == 0;
                if let Some(id) = id {
                    rt[m].pool.release(id);
                    if draining_idle {
                        rt[m].by_id.remove(&id);
                    }
                }
                if draining_idle {
                    reps[rep].state = RepState::Gone;
                    let slot = reps[rep].slot.clone();
                    g.occupy(&slot, placer, -1.0);
                    start_waiting(
                        now,
                        setup,
                        &mut reps,
                        &mut rt,
                        &mut g,
                        placer,
                        &mut |t, e| push(&mut heap, t, e),
                    );
                }
                for (t, e) in dispatch(
                    setup,
                    &mut reps,
                    &mut rt,
                    &mut pending,
                    &mut g,
                    &mut out,
                    now,
                    base,
                    m,
                ) {
                    push(&mut heap, t, e);
                }
            }
            Event::Ready { rep } => {
                if reps[rep].state != RepState::Starting {
                    continue;
                }
                let m = reps[rep].model;
                reps[rep].state = RepState::Ready;
                let id = rt[m]
                    .pool
                    .add_replica(reps[rep].endpoint.clone(), Some(models[m].max_concurrency));
                reps[rep].id = Some(id);
                rt[m].by_id.insert(id, rep);
                successor_ready(m, &mut reps, &mut rt, &mut g, placer);
                start_waiting(
                    now,
                    setup,
                    &mut reps,
                    &mut rt,
                    &mut g,
                    placer,
                    &mut |t, e| push(&mut heap, t, e),
                );
                for (t, e) in dispatch(
                    setup,
                    &mut reps,
                    &mut rt,
                    &mut pending,
                    &mut g,
                    &mut out,
                    now,
                    base,
                    m,
                ) {
                    push(&mut heap, t, e);
                }
                // Capacity-ready reaction: the decided count serves.
                for (k, o) in setup.onsets.iter().enumerate() {
                    if o.model == m
                        && reaction_ready[k].is_none()
                        && let Some((_, want)) = reaction[k]
                    {
                        let serving = ready_count(&reps, &rt[m]);
                        if serving >= want {
                            reaction_ready[k] = Some(now - o.first_request);
                        }
                    }
                }
            }
            Event::Timeout { model, req } => {
                if rt[model].pool.remove_waiter(req).is_some() {
                    waited(&pending, &mut rt, &mut out, model, req, now, at(now));
                    reject(&mut pending, &mut out, setup, model, req, true);
                }
            }
            Event::Tick | Event::Decide => {
                let pushed = event == Event::Decide;
                if pushed {
                    push_due = false;
                }
                let stamp = at(now);
                if !pushed && setup.scrape {
                    // The gateway's scrape of each replica's vLLM metrics,
                    // as `gpuscale sim-server` reports its lane: prompts
                    // waiting for it, and seconds spent prefilling.
                    for rep in reps.iter_mut() {
                        if rep.id.is_some() && rep.state != RepState::Gone {
                            let waiting = rep.lane.waiting(now);
                            let pool = &mut rt[rep.model].pool;
                            pool.set_server_state(&rep.endpoint, waiting, None, &[], stamp);
                            pool.set_prefill_seconds(
                                &rep.endpoint,
                                rep.lane.busy_seconds(now),
                                stamp,
                            );
                        }
                    }
                }
                let mut view = serde_json::Map::new();
                for (i, m) in models.iter().enumerate() {
                    let q = QueueView::of_pool(&rt[i].pool, stamp);
                    let q = rt[i].stats.add_to(q, stamp);
                    view.insert(
                        m.served_name.clone(),
                        serde_json::to_value(q).unwrap_or_default(),
                    );
                }
                let obs: BTreeMap<String, Observation> =
                    observations(&serde_json::json!({ "models": view }));
                let ready: BTreeMap<String, u32> = models
                    .iter()
                    .enumerate()
                    .map(|(i, m)| (m.name.clone(), ready_count(&reps, &rt[i])))
                    .collect();
                let since = Duration::from_secs_f64(now);
                let decided = if pushed {
                    autoscaler.push(since, &obs)
                } else {
                    autoscaler.step(since, &obs, &current, &ready)
                };
                if decided.is_some() {
                    last_decision = now;
                }
                if let Some(mut desired) = decided {
                    for m in models {
                        desired.entry(m.name.clone()).or_insert(0);
                    }
                    if desired != current {
                        let slots = placer.place(&desired, now);
                        short_of(&desired, &slots, &mut out);
                        autoscaler.placed(placer.plan(), &mut desired);
                        let claimed = claimed_gpus(models, &slots, &rt);
                        for (i, m) in models.iter().enumerate() {
                            let before = current.get(&m.name).copied().unwrap_or(0);
                            let after = desired.get(&m.name).copied().unwrap_or(0);
                            if after != before {
                                out.scale_events += 1;
                            }
                            for (k, o) in setup.onsets.iter().enumerate() {
                                if o.model == i
                                    && now >= o.first_request
                                    && reaction[k].is_none()
                                    && after > before
                                {
                                    reaction[k] = Some((now - o.first_request, after));
                                    out.reaction_decision_step.push(now - o.step);
                                    // A decision ahead of the overload
                                    // (on the rate) counts as no delay.
                                    out.reaction_decision_overload
                                        .push(overload[k].map_or(0.0, |t| (now - t).max(0.0)));
                                }
                            }
                            let empty = Vec::new();
                            let want = slots.get(&m.name).unwrap_or(&empty);
                            apply(
                                i,
                                want,
                                &claimed,
                                now,
                                false,
                                setup,
                                &mut reps,
                                &mut rt,
                                &mut g,
                                placer,
                                &mut out,
                                &mut |t, e| push(&mut heap, t, e),
                            );
                        }
                        current = desired;
                    }
                }
                if pushed {
                    continue;
                }
                if now + 1e-9 >= series_next && now <= setup.duration {
                    let step = setup.series_step;
                    out.series.push(Point {
                        t: now,
                        load: series_arrivals as f64 / step,
                        replicas: current.values().sum(),
                        ready: ready.values().sum(),
                        gpus: g.on,
                        utilization_memory: ratio(g.allocated, g.usable),
                        utilization_compute: ratio(g.busy, g.compute),
                        missed: 0,
                    });
                    series_arrivals = 0;
                    series_next += step;
                }
                let more = now < setup.duration || !pending.is_empty();
                if more && now < limit {
                    push(&mut heap, now + 1.0, Event::Tick);
                }
            }
        }
        if heap.is_empty() && next_arrival >= setup.arrivals.len() {
            break;
        }
    }
    g.advance(setup.duration, setup.duration);
    out.end = g.last.max(setup.duration);
    out.gpu_hours = g.gpu_seconds / 3600.0;
    out.cost = g.cost_seconds / 3600.0;
    out.utilization_memory = ratio(g.allocated_seconds, g.usable_seconds);
    out.memory_overcommit = ratio(g.excess_seconds, g.allocated_seconds);
    tracing::debug!(
        overcommit = out.memory_overcommit,
        "memory beyond usable, of allocated"
    );
    out.utilization_compute = ratio(g.busy_seconds, g.compute_seconds);
    out.reaction_decision = reaction.iter().flatten().map(|(d, _)| *d).collect();
    out.reaction_ready = reaction_ready.iter().flatten().copied().collect();
    // Anything still pending (the run hit its limit) is answered 503.
    let left: Vec<u64> = pending.keys().copied().collect();
    for req in left {
        let m = setup.workload_models[pending[&req].workload];
        reject(&mut pending, &mut out, setup, m, req, true);
    }
    // Each point's misses: those of the requests that arrived over its
    // step (points fall on whole steps).
    let step = setup.series_step.max(1e-9);
    for point in &mut out.series {
        let b = (point.t / step).round() as usize;
        point.missed = out.missed_by_step.get(b).copied().unwrap_or(0);
    }
    out
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Replicas of a model serving: those it holds (`live`: starting or
/// ready; draining ones have left it) that are ready.
fn ready_count(reps: &[Rep], rt: &ModelRt) -> u32 {
    rt.live
        .values()
        .filter(|&&r| reps[r].state == RepState::Ready)
        .count() as u32
}

/// A waiter refused after waiting: its wait counts in the gateway's
/// figures (which the recommender reads) and the report's, as the
/// gateway records it.
fn waited(
    pending: &HashMap<u64, Pending>,
    rt: &mut [ModelRt],
    out: &mut Outcome,
    m: usize,
    req: u64,
    now: f64,
    stamp: Instant,
) {
    if let Some(p) = pending.get(&req) {
        let wait = (now - p.arrival).max(0.0);
        rt[m].stats.queue_wait.record(stamp, wait);
        out.queue_wait.record(wait);
    }
}

fn reject(
    pending: &mut HashMap<u64, Pending>,
    out: &mut Outcome,
    setup: &Setup<'_>,
    m: usize,
    req: u64,
    timeout: bool,
) {
    let Some(p) = pending.remove(&req) else {
        return;
    };
    out.miss(p.arrival, setup);
    let models = setup.models;
    if timeout {
        out.timed_out += 1;
    } else {
        out.rejected_full += 1;
    }
    if let Some(mo) = out.models.get_mut(&models[m].name) {
        mo.rejected += 1;
    }
}

/// GPUs the slots of a re-plan start on (slots no replica holds yet):
/// a replica moved off one of them must stop before its successor
/// starts; elsewhere it serves until its successor is ready.
fn claimed_gpus(
    models: &[Model],
    slots: &BTreeMap<String, Vec<Slot>>,
    rt: &[ModelRt],
) -> HashSet<(String, u32)> {
    let mut claimed = HashSet::new();
    for (i, m) in models.iter().enumerate() {
        for s in slots.get(&m.name).into_iter().flatten() {
            if !rt[i].live.contains_key(&s.key) {
                claimed.extend(s.gpus.iter().cloned());
            }
        }
    }
    claimed
}

/// Takes a replica out of its model's pool: it finishes what it runs,
/// then its slot frees.
fn retire(r: usize, reps: &mut [Rep], rt: &mut [ModelRt], g: &mut Gauges, placer: &dyn Placer) {
    let m = reps[r].model;
    rt[m].pool.remove_replica(&reps[r].endpoint);
    if reps[r].running == 0 {
        if let Some(id) = reps[r].id {
            rt[m].by_id.remove(&id);
        }
        reps[r].state = RepState::Gone;
        let slot = reps[r].slot.clone();
        g.occupy(&slot, placer, -1.0);
    } else {
        reps[r].state = RepState::Draining;
    }
}

/// A new replica of model `m` is ready: the oldest replica a re-plan moved
/// away, still serving, now leaves (make before break).
fn successor_ready(
    m: usize,
    reps: &mut [Rep],
    rt: &mut [ModelRt],
    g: &mut Gauges,
    placer: &dyn Placer,
) {
    if !rt[m].outgoing.is_empty() {
        let r = rt[m].outgoing.remove(0);
        retire(r, reps, rt, g, placer);
    }
}

/// Brings a model's replicas to `want`: kept slots keep running, new slots
/// cold-start, gone slots stop. A replica the re-plan moved (as many of
/// the gone as new replicas start) keeps serving until a new one is ready,
/// as the backends hand over (make before break), unless a new slot
/// starts on one of its GPUs (`claimed`): it stops first then, and so
/// does one still serving from an earlier re-plan. The rest stop at once:
/// a starting one is dropped, a ready one leaves the pool and drains.
#[allow(clippy::too_many_arguments)]
fn apply(
    m: usize,
    want: &[Slot],
    claimed: &HashSet<(String, u32)>,
    now: f64,
    warm: bool,
    setup: &Setup<'_>,
    reps: &mut Vec<Rep>,
    rt: &mut [ModelRt],
    g: &mut Gauges,
    placer: &dyn Placer,
    out: &mut Outcome,
    push: &mut dyn FnMut(f64, Event),
) {
    let on_claimed = |rep: &Rep| rep.slot.gpus.iter().any(|gpu| claimed.contains(gpu));
    let keep: std::collections::BTreeSet<&str> = want.iter().map(|s| s.key.as_str()).collect();
    let gone: Vec<(String, usize)> = rt[m]
        .live
        .iter()
        .filter(|(k, _)| !keep.contains(k.as_str()))
        .map(|(k, &r)| (k.clone(), r))
        .collect();
    let shrink = rt[m].live.len().saturating_sub(want.len());
    out.replica_moves += gone.len().saturating_sub(shrink) as u64;
    let earlier = std::mem::take(&mut rt[m].outgoing);
    for r in earlier {
        if on_claimed(&reps[r]) {
            retire(r, reps, rt, g, placer);
        } else {
            rt[m].outgoing.push(r);
        }
    }
    for (key, _) in &gone {
        rt[m].live.remove(key);
    }
    for s in want {
        if let Some(&r) = rt[m].live.get(&s.key) {
            // Kept: same GPUs; its speed follows its co-tenants (requests
            // already running keep theirs).
            reps[r].slot.speed = s.speed;
            continue;
        }
        let r = reps.len();
        let n = r as u32 + 1;
        let endpoint = Endpoint::parse(&format!(
            "http://10.{}.{}.{}:8000",
            (n >> 16) & 255,
            (n >> 8) & 255,
            n & 255
        ))
        .expect("a well-formed address");
        reps.push(Rep {
            model: m,
            slot: s.clone(),
            state: RepState::Waiting,
            running: 0,
            id: None,
            endpoint,
            lane: PrefillLane::default(),
        });
        rt[m].live.insert(s.key.clone(), r);
        out.replica_starts += 1;
        if g.fits(s, placer) {
            let cold = if warm {
                for (node, _) in &s.gpus {
                    g.images.insert(node.clone(), now);
                }
                0.0
            } else {
                cold_start(setup, m, &s.gpus, now, g)
            };
            begin(r, reps, g, placer);
            push(now + cold, Event::Ready { rep: r });
        } else {
            rt[m].waiting.push(r);
        }
    }
    let starting = rt[m]
        .live
        .values()
        .filter(|&&r| matches!(reps[r].state, RepState::Starting | RepState::Waiting))
        .count();
    for (_, r) in gone {
        match reps[r].state {
            RepState::Starting => {
                reps[r].state = RepState::Gone;
                let slot = reps[r].slot.clone();
                g.occupy(&slot, placer, -1.0);
            }
            RepState::Waiting => {
                reps[r].state = RepState::Gone;
                rt[m].waiting.retain(|&w| w != r);
            }
            RepState::Ready if rt[m].outgoing.len() < starting && !on_claimed(&reps[r]) => {
                reps[r].state = RepState::Outgoing;
                rt[m].outgoing.push(r);
            }
            RepState::Ready => retire(r, reps, rt, g, placer),
            RepState::Outgoing | RepState::Draining | RepState::Gone => {}
        }
    }
    // Replicas that stopped at once freed memory another may wait for.
    start_waiting(now, setup, reps, rt, g, placer, push);
    // No more held than successors starting (a later re-plan may have
    // dropped some): the oldest leave.
    while rt[m].outgoing.len() > starting {
        let r = rt[m].outgoing.remove(0);
        retire(r, reps, rt, g, placer);
    }
}

/// Counts a decision the placement could not hold in full.
fn short_of(
    desired: &BTreeMap<String, u32>,
    slots: &BTreeMap<String, Vec<crate::placement::Slot>>,
    out: &mut Outcome,
) {
    let short: u32 = desired
        .iter()
        .map(|(m, &n)| n.saturating_sub(slots.get(m).map_or(0, |s| s.len() as u32)))
        .sum();
    if short > 0 {
        out.capacity_shortfalls += 1;
        out.capacity_short_most = out.capacity_short_most.max(short);
    }
}

/// A replica's cold start on `gpus` at `now` (the image pull, where a
/// node lacks the image, then the weight load), seconds. Without the
/// per-node cache (`imageCache: false`) every start pulls.
fn cold_start(
    setup: &Setup<'_>,
    m: usize,
    gpus: &[(String, u32)],
    now: f64,
    g: &mut Gauges,
) -> f64 {
    let spec = setup.cold_start;
    let load = spec.load(setup.models[m].memory_gib).as_secs_f64();
    let pull = spec.image_pull.as_secs_f64();
    if !spec.image_cache || gpus.is_empty() {
        return pull + load;
    }
    let mut image = now;
    for (node, _) in gpus {
        let at = *g.images.entry(node.clone()).or_insert(now + pull);
        image = image.max(at);
    }
    image - now + load
}

/// A waiting (or new) replica takes its memory and starts.
fn begin(r: usize, reps: &mut [Rep], g: &mut Gauges, placer: &dyn Placer) {
    reps[r].state = RepState::Starting;
    let slot = reps[r].slot.clone();
    g.occupy(&slot, placer, 1.0);
}

/// Starts the replicas waiting for memory whose memory now fits, in the
/// order they were placed.
fn start_waiting(
    now: f64,
    setup: &Setup<'_>,
    reps: &mut [Rep],
    rt: &mut [ModelRt],
    g: &mut Gauges,
    placer: &dyn Placer,
    push: &mut dyn FnMut(f64, Event),
) {
    for (m, model) in rt.iter_mut().enumerate() {
        if model.waiting.is_empty() {
            continue;
        }
        for r in std::mem::take(&mut model.waiting) {
            if reps[r].state != RepState::Waiting {
                continue;
            }
            if g.fits(&reps[r].slot, placer) {
                let cold = cold_start(setup, m, &reps[r].slot.gpus, now, g);
                begin(r, reps, g, placer);
                push(now + cold, Event::Ready { rep: r });
            } else {
                model.waiting.push(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Moves made before they break, with a scripted autoscaler and placer.

    use super::*;

    /// One replica until 60 s, two from then on.
    struct Script;

    impl Autoscaler for Script {
        fn step(
            &mut self,
            now: Duration,
            _: &BTreeMap<String, Observation>,
            _: &BTreeMap<String, u32>,
            _: &BTreeMap<String, u32>,
        ) -> Option<BTreeMap<String, u32>> {
            let n = if now.as_secs_f64() < 60.0 { 1 } else { 2 };
            Some(BTreeMap::from([("m".to_string(), n)]))
        }
    }

    /// Slot `a` on GPU 0; at the second replica, both replicas on new
    /// slots: on GPUs 1 and 2, or (`same_gpu`) on GPU 0, which `a` holds,
    /// and GPU 1.
    struct Moves {
        same_gpu: bool,
        memory: f64,
    }

    impl Moves {
        fn slot(&self, key: &str, gpu: u32) -> Slot {
            Slot {
                key: key.into(),
                gpus: vec![("n0".into(), gpu)],
                speed: 1.0,
                memory_per_gpu: self.memory,
            }
        }
    }

    impl Placer for Moves {
        fn place(
            &mut self,
            desired: &BTreeMap<String, u32>,
            _: f64,
        ) -> BTreeMap<String, Vec<Slot>> {
            let slots = if desired["m"] == 1 {
                vec![self.slot("a", 0)]
            } else if self.same_gpu {
                vec![self.slot("b", 0), self.slot("c", 1)]
            } else {
                vec![self.slot("b", 1), self.slot("c", 2)]
            };
            BTreeMap::from([("m".to_string(), slots)])
        }

        fn gpu(&self, _: &str) -> (f64, f64, f64) {
            (79.0, 1.0, 2.0)
        }
    }

    /// Two requests a second for 3 minutes, 30 s cold starts, a 5 s
    /// queue timeout: requests that find no replica serving for the 30 s
    /// of a cold start are answered 503.
    fn run_moves(same_gpu: bool) -> Outcome {
        run_moves_with(same_gpu, 20.0, 10)
    }

    /// [`run_moves`] with each replica holding `memory` GiB of its GPU's 79
    /// and requests of `output` tokens (100 a second).
    fn run_moves_with(same_gpu: bool, memory: f64, output: u32) -> Outcome {
        run_moves_onsets(same_gpu, memory, output, &[], false)
    }

    /// [`run_moves_with`] with step bursts at `onsets` (for the misses
    /// counted in a step's first minute; the script ignores them).
    /// `image_cache`: the node keeps the image the first replica pulled
    /// (every start after it loads weights only, here at once).
    fn run_moves_onsets(
        same_gpu: bool,
        memory: f64,
        output: u32,
        onsets: &[Onset],
        image_cache: bool,
    ) -> Outcome {
        let text = format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata: {{name: m}}\nspec:\n  resources: {{memoryGiB: {memory}, compute: 1, maxConcurrency: 8}}\n"
        );
        let models =
            gpuscale_policies::load::load_sources(&[(std::path::Path::new("m.yaml"), &text)])
                .unwrap()
                .models;
        let arrivals: Vec<Arrival> = (0..360)
            .map(|i| Arrival {
                at: f64::from(i) * 0.5,
                workload: 0,
                prompt: 10,
                output,
            })
            .collect();
        let services = [ServiceProfile {
            model: "m".into(),
            prefill_tps: 0.0,
            decode_tps: 100.0,
            max_concurrency: 8,
            batch_slowdown: 0.0,
            speed: 1.0,
            default_max_tokens: 10,
            prefix_cache_tokens: 0,
        }];
        let cold = ColdStartSpec {
            image_pull: Duration::from_secs(30),
            image_cache,
            load_gib_per_second: 1e9,
        };
        let setup = Setup {
            models: &models,
            workload_models: &[0],
            services: &services,
            priorities: &[Priority::Standard],
            arrivals: &arrivals,
            duration: 180.0,
            max_queue: 256,
            queue_timeout: 5.0,
            queue_order: QueueOrder::Adaptive,
            newest_first_after: Duration::from_secs(1),
            scrape: false,
            cold_start: &cold,
            onsets,
            series_step: 60.0,
            initial: &BTreeMap::from([("m".to_string(), 1)]),
        };
        run(&setup, &mut Script, &mut Moves { same_gpu, memory })
    }

    #[test]
    fn misses_are_counted_by_arrival_in_the_series_and_in_a_steps_first_minute() {
        // Nothing serves from 60 s to 90 s (the move of the test below):
        // requests that arrive then and wait past the 5 s timeout are the
        // run's only misses (the model declares no SLO target).
        let onset = Onset {
            model: 0,
            step: 60.0,
            first_request: 60.0,
        };
        let out = run_moves_onsets(true, 20.0, 10, &[onset], false);
        assert!(out.missed >= 40, "{}", out.missed);
        assert_eq!(out.missed, out.requests - out.within_slo);
        assert_eq!(out.missed, out.timed_out + out.rejected_full);
        // Points every 60 s, each holding the arrivals of the step before
        // it: every miss arrived in (60, 120].
        let by_t: Vec<(f64, u64)> = out.series.iter().map(|p| (p.t, p.missed)).collect();
        assert_eq!(
            by_t,
            vec![(0.0, 0), (60.0, 0), (120.0, out.missed), (180.0, 0)]
        );
        assert_eq!(out.missed_in_steps, Some(out.missed));
        // A step that starts after them holds none of them; with no step
        // the figure is not there at all.
        let later = Onset {
            step: 120.0,
            ..onset
        };
        let out = run_moves_onsets(true, 20.0, 10, &[later], false);
        assert_eq!(out.missed_in_steps, Some(0));
        assert_eq!(run_moves(true).missed_in_steps, None);
    }

    #[test]
    fn a_node_pulls_the_image_once() {
        // The replica that starts warm left the image on n0: the moved
        // replicas load only their weights there (at once here), so
        // nothing goes without a replica and nothing times out — where
        // every start pulling leaves 30 s with none (the test below).
        let out = run_moves_onsets(true, 20.0, 10, &[], true);
        assert_eq!(out.replica_moves, 1);
        assert_eq!(out.timed_out, 0);
        assert_eq!(out.completed, 360);
        let pulling = run_moves_onsets(true, 20.0, 10, &[], false);
        assert!(pulling.timed_out >= 40, "{}", pulling.timed_out);
    }

    #[test]
    fn a_replica_started_during_a_pull_waits_for_that_pull() {
        let models = gpuscale_policies::load::load_sources(&[(
            std::path::Path::new("m.yaml"),
            "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata: {name: m}\nspec:\n  resources: {memoryGiB: 20, compute: 1, maxConcurrency: 8}\n",
        )])
        .unwrap()
        .models;
        let cold = ColdStartSpec {
            image_pull: Duration::from_secs(20),
            image_cache: true,
            load_gib_per_second: 2.0,
        };
        let setup = Setup {
            models: &models,
            workload_models: &[],
            services: &[],
            priorities: &[],
            arrivals: &[],
            duration: 1.0,
            max_queue: 1,
            queue_timeout: 1.0,
            queue_order: QueueOrder::Adaptive,
            newest_first_after: Duration::from_secs(1),
            scrape: false,
            cold_start: &cold,
            onsets: &[],
            series_step: 1.0,
            initial: &BTreeMap::new(),
        };
        let mut g = Gauges::default();
        let on = |node: &str| vec![(node.to_string(), 0)];
        // The first on n0 pulls (20 s) and loads 20 GiB at 2 GiB/s (10 s).
        assert_eq!(cold_start(&setup, 0, &on("n0"), 100.0, &mut g), 30.0);
        // 5 s later on n0: the rest of the same pull, then its own load.
        assert_eq!(cold_start(&setup, 0, &on("n0"), 105.0, &mut g), 25.0);
        // After the pull: the load only. Another node pulls.
        assert_eq!(cold_start(&setup, 0, &on("n0"), 200.0, &mut g), 10.0);
        assert_eq!(cold_start(&setup, 0, &on("n1"), 200.0, &mut g), 30.0);
        // Across two nodes: the later of their images.
        let both = vec![("n0".to_string(), 1), ("n2".to_string(), 0)];
        assert_eq!(cold_start(&setup, 0, &both, 210.0, &mut g), 30.0);
        // Without the cache every start pulls.
        let pulls = ColdStartSpec {
            image_cache: false,
            ..cold.clone()
        };
        let setup = Setup {
            cold_start: &pulls,
            ..setup
        };
        assert_eq!(cold_start(&setup, 0, &on("n0"), 300.0, &mut g), 30.0);
    }

    #[test]
    fn a_moved_replica_serves_until_its_successor_is_ready() {
        let out = run_moves(false);
        assert_eq!(out.replica_moves, 1);
        assert_eq!(out.completed, 360, "{} timed out", out.timed_out);
        assert_eq!(out.timed_out, 0);
    }

    #[test]
    fn a_replica_moved_off_a_gpu_a_new_slot_takes_stops_first() {
        let out = run_moves(true);
        assert_eq!(out.replica_moves, 1);
        // Nothing serves from 60 s to 90 s: what arrives before 85 s waits
        // past the 5 s timeout.
        assert!(out.timed_out >= 40, "{} timed out", out.timed_out);
        assert_eq!(out.completed + out.timed_out, 360);
        assert_eq!(out.memory_overcommit, 0.0);
    }

    #[test]
    fn a_new_replica_waits_for_the_memory_a_draining_one_holds() {
        // 50 GiB replicas, two of which do not fit one GPU's 79. At 60 s
        // `a` (GPU 0) stops for `b` there, with up to eight 5-second
        // requests still running: `b` starts once they are done, as a pod
        // pending until the pod it replaces has terminated, so no GPU
        // ever holds more than its memory.
        let out = run_moves_with(true, 50.0, 500);
        assert_eq!(out.replica_moves, 1);
        assert_eq!(out.memory_overcommit, 0.0);
        assert_eq!(out.completed + out.timed_out, 360);
        // `b`'s cold start begins up to 5 s late, and `c` serves from 90 s
        // on GPU 1 meanwhile: requests wait no longer than without the
        // draining (the 503s are those of the 30 s with nothing serving).
        let fits = run_moves_with(true, 20.0, 500);
        assert_eq!(fits.memory_overcommit, 0.0);
        assert!(
            out.gpu_hours <= fits.gpu_hours + 1e-9,
            "{} > {}",
            out.gpu_hours,
            fits.gpu_hours
        );
    }
}
