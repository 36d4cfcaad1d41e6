//! Training queue evidence: a discrete-event simulation of a stream of
//! training jobs on a shared cluster, under six schedulers, reusing the
//! packer's gang placement ([`gpuscale_packer::gang`]) for gpuscale and its
//! reservation fit for the baselines.
//!
//! - **fifo-no-gang**: what pods scheduled one by one do (the default
//!   scheduler without coscheduling): pods in kube-scheduler's queue order
//!   ([`fifo_pods`]: by queue timestamp, refreshed on every failed attempt,
//!   so a pod created later waits behind every pod already waiting; the
//!   pods of a sweep interleave as the Job controller's slow-start batches
//!   create them), each worker placed as soon as a node holds it, on the
//!   node with the most free GPUs (the default `LeastAllocated` score),
//!   and held while the job's other workers wait. A job runs when all its
//!   workers are placed. When nothing runs and no job can complete its
//!   workers, the cluster is deadlocked; the simulation counts it and
//!   deletes the youngest partial job's pods (what an operator or a
//!   scheduling timeout does), which are created again at the back.
//! - **fifo-gang**: all or nothing, strictly in arrival order: the head job
//!   starts when it fits; nothing behind it starts before it.
//! - **easy-backfill**: all or nothing, arrival order; the head job gets a
//!   reservation (the earliest time running jobs' estimates free enough
//!   GPUs), and a later job starts now if it fits and either ends (by its
//!   estimate) before that time or leaves the head's GPUs free (EASY:
//!   Lifka 1995; Slurm's `sched/backfill` with one reservation).
//! - **gpuscale**: [`gang::place`] — all or nothing, topology levels,
//!   multifactor priority with fair share and longest first
//!   (`weights.runtime` at [`RUNTIME_WEIGHT`]), conservative backfill (a
//!   reservation for every waiting job); beside it the same with Slurm's
//!   factors only, and in arrival order (the control for "backfill never
//!   delays the head job").
//!
//! Every scheduler sees estimates only; jobs end at their actual runtime,
//! which users overestimate (estimate = actual × U(1.5, 4), rounded up to
//! 15 minutes and capped at the partition's 24 h). Inference holds its
//! `minReplicas` GPUs (whole nodes) throughout and grows to its daily peak
//! on free GPUs every quarter hour; no scheduler may take its GPUs, it
//! takes none a job holds, and the report gives what it could not get.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use gpuscale_packer::gang::{self, GangOptions, GangStatus, Inventory, queue};
use gpuscale_policies::inventory::{ClusterSpec, NodeSpec};
use gpuscale_policies::training::{
    Account, FairShare, Partition, Topology, TopologyLevel, TopologyMode, TrainingJobSpec,
    TrainingQueueSpec,
};
use gpuscale_policies::{Catalog, Cluster, Priority, TrainingJob};
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use serde::Serialize;

/// Inference's autoscaler acts every quarter hour.
const TICK_S: f64 = 900.0;

/// `weights.runtime` of the gpuscale run: as fair share's weight (5,000),
/// so a day-long job outranks a ten-minute one as far as the least-used
/// team outranks a team that used all the recorded GPU-hours.
pub const RUNTIME_WEIGHT: f64 = 5_000.0;

/// A lower bound on any scheduler's makespan, hours from the first
/// arrival: for every arrival time `a`, the jobs arriving at or after `a`
/// cannot be done before `a` plus their work spread over every GPU
/// inference's `minReplicas` leave, nor before `a` plus the longest of
/// their runtimes. It ignores gangs, topology, estimates and inference's
/// growth, so a real schedule may not reach it; it says how much of a
/// scheduler's makespan any schedule would need (every job run).
pub fn makespan_bound_h(s: &Scenario, jobs: &[JobDef]) -> f64 {
    let Some(t0) = jobs.first().map(|j| j.arrival_s) else {
        return 0.0;
    };
    let cap = f64::from(s.nodes.saturating_sub(s.inference_nodes) * 8).max(1.0);
    let mut work = 0.0;
    let mut longest: f64 = 0.0;
    let mut bound: f64 = 0.0;
    for j in jobs.iter().rev() {
        work += f64::from(j.gpus()) * j.runtime_s;
        longest = longest.max(j.runtime_s);
        bound = bound.max(j.arrival_s + (work / cap).max(longest));
    }
    (bound - t0) / 3600.0
}

/// The scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    /// Seed of the job stream.
    pub seed: u64,
    /// Nodes of 8 GPUs.
    pub nodes: u32,
    /// Nodes per rack.
    pub nodes_per_rack: u32,
    /// Nodes inference always holds (its `minReplicas`, never preempted).
    pub inference_nodes: u32,
    /// GPUs inference wants at its daily peak (it scales between the
    /// nodes above and this, sinusoidally over 24 h, on free GPUs; equal
    /// in priority to training, it takes no GPU a job holds).
    pub inference_peak_gpus: u32,
    /// Jobs in the stream.
    pub jobs: usize,
    /// Mean time between submissions, seconds (Poisson).
    pub mean_gap_s: f64,
    /// Share of submissions that are sweeps: four identical jobs in one
    /// second (hyper-parameter searches).
    pub sweep_share: f64,
}

impl Default for Scenario {
    fn default() -> Self {
        Scenario {
            seed: 15,
            nodes: 32,
            nodes_per_rack: 8,
            inference_nodes: 4,
            inference_peak_gpus: 64,
            jobs: 400,
            mean_gap_s: 900.0,
            sweep_share: 0.1,
        }
    }
}

/// One job of the stream.
#[derive(Debug, Clone, Serialize)]
pub struct JobDef {
    /// Name.
    pub name: String,
    /// Arrival, seconds from the start.
    pub arrival_s: f64,
    /// Workers.
    pub workers: u32,
    /// GPUs per worker.
    pub gpus_per_worker: u32,
    /// Actual runtime, seconds.
    pub runtime_s: f64,
    /// The user's estimate, seconds.
    pub estimate_s: f64,
    /// Team.
    pub account: String,
}

impl JobDef {
    /// GPUs.
    pub fn gpus(&self) -> u32 {
        self.workers * self.gpus_per_worker
    }
}

/// The seeded stream: sizes 1–64 GPUs, heavy-tailed (most jobs small, a
/// few whole racks, as in published cluster traces: Philly, Helios);
/// runtimes log-uniform from 10 minutes to 12 hours; one submission in
/// ten (`sweep_share`) a sweep of four copies in the same second.
pub fn stream(s: &Scenario) -> Vec<JobDef> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(s.seed);
    let sizes = [1u32, 2, 4, 8, 16, 32, 64];
    let weights = [0.30, 0.18, 0.15, 0.15, 0.11, 0.07, 0.04];
    let teams = ["nlp", "vision", "speech", "search"];
    let mut t = 0.0;
    let mut out = Vec::new();
    while out.len() < s.jobs {
        let u: f64 = rng.random::<f64>();
        t += -u.max(1e-12).ln() * s.mean_gap_s;
        let mut pick: f64 = rng.random::<f64>();
        let mut size = sizes[0];
        for (k, w) in sizes.iter().zip(weights) {
            if pick < w {
                size = *k;
                break;
            }
            pick -= w;
            size = *k;
        }
        let (workers, gpw) = if size <= 8 { (1, size) } else { (size / 8, 8) };
        let lo = (600f64).ln();
        let hi = (12.0 * 3600f64).ln();
        let runtime = (lo + rng.random::<f64>() * (hi - lo)).exp();
        let factor = 1.5 + rng.random::<f64>() * 2.5;
        let estimate = ((runtime * factor) / 900.0).ceil() * 900.0;
        let estimate = estimate.min(24.0 * 3600.0).max(runtime);
        let account = teams[rng.random_range(0..teams.len())].to_string();
        // One submission in ten is a sweep: four copies in one second.
        let copies = if rng.random::<f64>() < s.sweep_share {
            4
        } else {
            1
        };
        for _ in 0..copies {
            if out.len() == s.jobs {
                break;
            }
            out.push(JobDef {
                name: format!("job-{:04}", out.len()),
                arrival_s: t,
                workers,
                gpus_per_worker: gpw,
                runtime_s: runtime,
                estimate_s: estimate,
                account: account.clone(),
            });
        }
    }
    out
}

/// The cluster: `nodes` × 8 H100, racks of `nodes_per_rack`, one NVLink
/// domain per node.
pub fn cluster(s: &Scenario) -> Cluster {
    let spec = ClusterSpec {
        catalog: vec![],
        nodes: (0..s.nodes)
            .map(|i| NodeSpec {
                name: format!("n{i:03}"),
                count: None,
                zone: Some("z0".into()),
                rack: Some(format!("r{}", i / s.nodes_per_rack.max(1))),
                nvlink_domain: Some(format!("n{i:03}")),
                labels: BTreeMap::new(),
                gpu_model: "H100-80GB".into(),
                gpu_count: 8,
                timeslice_replicas: None,
                mps_replicas: None,
                mig_timeslice: None,
                sharing: gpuscale_policies::inventory::node_sharing(),
                hami_split_count: None,
                gpus: vec![],
            })
            .collect(),
    };
    Cluster::from_spec("training-sim", &spec, &Catalog::builtin()).expect("a valid cluster")
}

/// The schedulers compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheduler {
    /// Pods one by one, partial holds.
    FifoNoGang,
    /// All or nothing, strict arrival order.
    FifoGang,
    /// All or nothing, EASY backfill.
    EasyBackfill,
    /// gpuscale's gang placement and queue, longest first
    /// (`weights.runtime`) beside fair share.
    Gpuscale,
    /// The same with Slurm's factors only (`weights.runtime` at its
    /// default, 0).
    GpuscaleSlurmFactors,
    /// gpuscale with arrival order for priority (no fair share): the
    /// control for "backfill never delays the head job".
    GpuscaleFifo,
}

impl Scheduler {
    /// Every one, in report order.
    pub const ALL: [Scheduler; 6] = [
        Scheduler::FifoNoGang,
        Scheduler::FifoGang,
        Scheduler::EasyBackfill,
        Scheduler::Gpuscale,
        Scheduler::GpuscaleSlurmFactors,
        Scheduler::GpuscaleFifo,
    ];

    /// Report name.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::FifoNoGang => "FIFO, no gangs (partial holds)",
            Scheduler::FifoGang => "FIFO, gangs, no backfill",
            Scheduler::EasyBackfill => "EASY backfill (gangs)",
            Scheduler::Gpuscale => {
                "gpuscale (gangs, conservative backfill, fair share, longest first)"
            }
            Scheduler::GpuscaleSlurmFactors => "gpuscale, Slurm's factors only (no longest first)",
            Scheduler::GpuscaleFifo => "gpuscale, arrival order (no fair share)",
        }
    }
}

/// What one scheduler achieved.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Scheduler.
    pub scheduler: Scheduler,
    /// The jobs' GPU-hours over the GPU-hours training may use from the
    /// first arrival to the last completion (the same work for every
    /// scheduler, so this is makespan's inverse, in utilisation's units).
    pub utilization: f64,
    /// GPU-hours running over GPU-hours available while jobs arrive (first
    /// arrival to last): what a dashboard shows during the stream; a
    /// scheduler that pushes work past the stream's end looks better on it.
    pub window_utilization: f64,
    /// Mean wait (arrival to start), hours.
    pub mean_wait_h: f64,
    /// 95th percentile wait, hours.
    pub p95_wait_h: f64,
    /// Mean wait of jobs of 32 GPUs or more, hours.
    pub large_wait_h: f64,
    /// Last completion, hours from the first arrival.
    pub makespan_h: f64,
    /// Deadlocks (nothing runs, partial holds block every job).
    pub deadlocks: u32,
    /// GPU-hours held by partial gangs that were not running.
    pub held_idle_gpu_hours: f64,
    /// Jobs that started later than the reservation they held when they
    /// became the head of the queue (gpuscale and EASY).
    pub heads_delayed: u32,
    /// Inference GPUs any training job took (must be 0).
    pub inference_gpus_taken: u32,
    /// GPU-hours inference wanted above its `minReplicas` and could not
    /// get (training held them; equal priority, nothing is preempted).
    pub inference_unmet_gpu_hours: f64,
    /// Jobs that ran.
    pub completed: usize,
    /// Wall-clock of the simulation, seconds.
    pub wall_s: f64,
}

struct Running {
    job: usize,
    gpus: Vec<(usize, u32)>,
    end: f64,
}

/// The pods of jobs created at one instant, in the order kube-scheduler's
/// queue holds them.
///
/// The queue (PrioritySort; every pod here has the same priority) orders
/// pods by their queue timestamp: the time the pod was added, *refreshed*
/// when an attempt fails (`AddUnschedulableIfNotPresent`, "Refresh the
/// timestamp since the pod is re-added"). Pods that fail in one pass are
/// re-added in the order they were tried, so the order among waiting pods
/// never changes and a pod created later queues behind every pod already
/// waiting; backoff (1–10 s) expires long before the next completion.
///
/// Pods created at the same instant (a sweep) are ordered as the Job
/// controller creates them: its workers sync the jobs concurrently, and each
/// creates its pods in slow-start batches of 1, 2, 4, 8… (`ctrl.SlowStartInitialBatchSize`),
/// so the first worker of every job comes first, then the next two of every
/// job, and so on.
pub fn fifo_pods(jobs: &[JobDef], created: &[usize]) -> Vec<usize> {
    let batch = |k: u32| (k + 1).ilog2(); // 0 | 1, 2 | 3..=6 | 7..=14
    let mut pods: Vec<(u32, usize, u32)> = created
        .iter()
        .flat_map(|&j| (0..jobs[j].workers).map(move |k| (batch(k), j, k)))
        .collect();
    pods.sort_unstable();
    pods.into_iter().map(|(_, j, _)| j).collect()
}

/// Runs one scheduler over the stream.
pub fn simulate(s: &Scenario, jobs: &[JobDef], sched: Scheduler) -> Outcome {
    let wall = std::time::Instant::now();
    let c = cluster(s);
    let n = c.nodes.len();
    let inference: BTreeSet<usize> = (0..s.inference_nodes as usize).collect();
    // Free GPUs per node for training.
    let mut free: Vec<BTreeSet<u32>> = (0..n)
        .map(|i| {
            if inference.contains(&i) {
                BTreeSet::new()
            } else {
                (0..8).collect()
            }
        })
        .collect();
    let all_gpus = (n * 8) as f64;
    let base_inference = (inference.len() * 8) as u32;
    // Inference GPUs beyond its own nodes, and what it wanted but could not
    // get (GPU-seconds).
    let mut inf_extra: Vec<(usize, u32)> = Vec::new();
    let mut inf_held_s = 0.0;
    let mut inf_unmet_s = 0.0;
    let want_extra = |t: f64| -> u32 {
        let peak = s.inference_peak_gpus.max(base_inference);
        let phase = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * t / 86_400.0).cos();
        (f64::from(peak - base_inference) * phase).round() as u32
    };
    let mut running: Vec<Running> = Vec::new();
    let mut pending: Vec<usize> = Vec::new();
    // Partial holds (fifo-no-gang): job → GPUs held.
    let mut partial: BTreeMap<usize, Vec<(usize, u32)>> = BTreeMap::new();
    // Pods not yet bound, one entry (its job) per pod, in queue order.
    let mut pod_queue: Vec<usize> = Vec::new();
    let mut start: Vec<Option<f64>> = vec![None; jobs.len()];
    let mut head_reservation: BTreeMap<usize, f64> = BTreeMap::new();
    let mut next_arrival = 0usize;
    let mut now = jobs.first().map_or(0.0, |j| j.arrival_s);
    let t0 = now;
    let horizon = jobs.last().map_or(0.0, |j| j.arrival_s);
    let mut busy_in_window = 0.0;
    let mut held_idle = 0.0;
    let mut deadlocks = 0;
    let mut taken_inference = 0;
    let mut usage: BTreeMap<String, f64> = BTreeMap::new();
    let mut last = now;
    let epoch0 = 1.8e9;
    loop {
        // Account the interval [last, now).
        let dt = now - last;
        if dt > 0.0 {
            let held = f64::from(base_inference) + inf_extra.len() as f64;
            inf_held_s += held * dt;
            inf_unmet_s += (f64::from(want_extra(last)) - inf_extra.len() as f64).max(0.0) * dt;
            let busy: f64 = running.iter().map(|r| r.gpus.len() as f64).sum::<f64>() + held;
            let lo = last.max(t0);
            let hi = now.min(horizon);
            if hi > lo {
                busy_in_window += busy * (hi - lo);
            }
            held_idle += partial.values().map(|g| g.len() as f64).sum::<f64>() * dt / 3600.0;
            for r in &running {
                *usage.entry(jobs[r.job].account.clone()).or_default() +=
                    r.gpus.len() as f64 * dt / 3600.0;
            }
            // Fair-share usage decays with a 7-day half-life.
            let decay = 0.5f64.powf(dt / (7.0 * 86_400.0));
            for u in usage.values_mut() {
                *u *= decay;
            }
        }
        last = now;
        // Completions and arrivals at `now`.
        running.retain(|r| {
            if r.end <= now + 1e-9 {
                for &(node, i) in &r.gpus {
                    free[node].insert(i);
                }
                false
            } else {
                true
            }
        });
        let first_new = next_arrival;
        while next_arrival < jobs.len() && jobs[next_arrival].arrival_s <= now + 1e-9 {
            pending.push(next_arrival);
            next_arrival += 1;
        }
        if sched == Scheduler::FifoNoGang {
            let arrived: Vec<usize> = (first_new..next_arrival).collect();
            pod_queue.extend(fifo_pods(jobs, &arrived));
        }
        // Inference scales first (its autoscaler acts on the tick): it gives
        // back GPUs above what it wants, and takes free ones — on the nodes
        // with the fewest free first, to leave whole nodes to gangs.
        let want = want_extra(now) as usize;
        while inf_extra.len() > want {
            if let Some((node, i)) = inf_extra.pop() {
                free[node].insert(i);
            }
        }
        while inf_extra.len() < want {
            let Some(node) = (0..n)
                .filter(|&k| !free[k].is_empty())
                .min_by_key(|&k| (free[k].len(), k))
            else {
                break;
            };
            if let Some(i) = free[node].pop_first() {
                inf_extra.push((node, i));
            }
        }
        // Schedule.
        let started: Vec<(usize, Vec<(usize, u32)>)> = match sched {
            Scheduler::FifoNoGang => {
                // kube-scheduler's queue, pod by pod, in `pod_queue` order
                // (see `fifo_pods`). Each pod of a job needs the same GPUs,
                // so once one fails the job's others fail too and keep
                // their places.
                let mut failed: BTreeSet<usize> = BTreeSet::new();
                let mut kept = Vec::with_capacity(pod_queue.len());
                for j in std::mem::take(&mut pod_queue) {
                    if failed.contains(&j) {
                        kept.push(j);
                        continue;
                    }
                    let gpw = jobs[j].gpus_per_worker;
                    let Some(node) = (0..n)
                        .filter(|&k| free[k].len() as u32 >= gpw)
                        .max_by_key(|&k| (free[k].len(), std::cmp::Reverse(k)))
                    else {
                        failed.insert(j);
                        kept.push(j);
                        continue;
                    };
                    let pick: Vec<u32> = free[node].iter().take(gpw as usize).copied().collect();
                    let held = partial.entry(j).or_default();
                    for i in pick {
                        free[node].remove(&i);
                        held.push((node, i));
                    }
                }
                pod_queue = kept;
                let mut out = Vec::new();
                for &j in &pending {
                    let job = &jobs[j];
                    let held = partial.get(&j).map_or(0, |g| g.len() as u32) / job.gpus_per_worker;
                    if held == job.workers {
                        out.push((j, partial.remove(&j).unwrap_or_default()));
                    }
                }
                partial.retain(|_, g| !g.is_empty());
                out
            }
            Scheduler::FifoGang | Scheduler::EasyBackfill => {
                let mut out = Vec::new();
                // Head first, in arrival order.
                let mut shadow: Option<(f64, BTreeMap<usize, u32>)> = None;
                for &j in &pending {
                    let job = &jobs[j];
                    let tj = to_job(job, epoch0 + now);
                    let counts: BTreeMap<usize, u32> = (0..n)
                        .map(|k| (k, free[k].len() as u32))
                        .filter(|(_, c)| *c > 0)
                        .collect();
                    let fits = queue::fit_counts(&c, &tj, &counts);
                    match (&shadow, fits) {
                        (None, Some((_, per))) => {
                            out.push((j, take(&mut free, &per)));
                        }
                        (None, None) => {
                            if sched == Scheduler::FifoGang {
                                break;
                            }
                            // The head's reservation: replay estimated ends.
                            let mut avail: Vec<u32> = free.iter().map(|f| f.len() as u32).collect();
                            // Running jobs and those started earlier in
                            // this pass free their GPUs at their estimates.
                            let mut ends: Vec<(f64, &[(usize, u32)])> = running
                                .iter()
                                .map(|r| {
                                    let est = start[r.job].unwrap_or(now) + jobs[r.job].estimate_s;
                                    (est.max(now), r.gpus.as_slice())
                                })
                                .chain(out.iter().map(|(k, g): &(usize, Vec<(usize, u32)>)| {
                                    (now + jobs[*k].estimate_s, g.as_slice())
                                }))
                                .collect();
                            ends.sort_by(|a, b| a.0.total_cmp(&b.0));
                            for (t, gpus) in ends {
                                for &(node, _) in gpus {
                                    avail[node] += 1;
                                }
                                let counts: BTreeMap<usize, u32> = avail
                                    .iter()
                                    .enumerate()
                                    .map(|(k, c)| (k, *c))
                                    .filter(|(_, c)| *c > 0)
                                    .collect();
                                if let Some((_, per)) = queue::fit_counts(&c, &tj, &counts) {
                                    head_reservation.entry(j).or_insert(t);
                                    // GPUs the head needs at t beyond what
                                    // would be free anyway stay reserved.
                                    shadow = Some((t, per));
                                    break;
                                }
                            }
                            if shadow.is_none() {
                                break;
                            }
                        }
                        (Some((t, per)), Some((_, mine))) => {
                            // EASY: start if it ends before the shadow time,
                            // or if it uses no GPU of a node the head needs.
                            let ends_before = now + job.estimate_s <= *t;
                            let disjoint = mine.keys().all(|k| !per.contains_key(k));
                            if ends_before || disjoint {
                                out.push((j, take(&mut free, &mine)));
                            }
                        }
                        (Some(_), None) => {}
                    }
                }
                out
            }
            Scheduler::Gpuscale | Scheduler::GpuscaleSlurmFactors | Scheduler::GpuscaleFifo => {
                let mut jobs_now: Vec<TrainingJob> = Vec::new();
                let mut held: BTreeMap<String, gang::Held> = BTreeMap::new();
                for r in &running {
                    let mut tj = to_job(&jobs[r.job], epoch0 + jobs[r.job].arrival_s);
                    tj.spec.started_at = Some(at(epoch0 + start[r.job].unwrap_or(now)));
                    held.insert(
                        tj.name.clone(),
                        gang::Held {
                            gpus: r.gpus.clone(),
                            intact: true,
                            broken: None,
                        },
                    );
                    jobs_now.push(tj);
                }
                for &j in &pending {
                    jobs_now.push(to_job(&jobs[j], epoch0 + jobs[j].arrival_s));
                }
                let mut inv = Inventory::default();
                for (k, f) in free.iter().enumerate() {
                    if !f.is_empty() {
                        inv.free.insert(k, f.clone());
                    }
                }
                let mut spec = queue_spec(&usage);
                if sched == Scheduler::Gpuscale {
                    spec.weights.runtime = RUNTIME_WEIGHT;
                }
                if sched == Scheduler::GpuscaleFifo {
                    spec.weights.fair_share = 0.0;
                    spec.weights.max_age = Duration::from_secs(365 * 86_400);
                }
                let q = queue::Queue {
                    spec,
                    now: epoch0 + now,
                };
                let placed = gang::place(&c, &jobs_now, &held, &inv, &q, &GangOptions::default());
                let mut out = Vec::new();
                for g in &placed.gangs {
                    let Some(j) = pending.iter().copied().find(|&j| jobs[j].name == g.name) else {
                        continue;
                    };
                    match g.status {
                        GangStatus::Starting => {
                            let mut gpus = Vec::new();
                            for w in &g.workers {
                                let node =
                                    c.nodes.iter().position(|x| x.name == w.node).unwrap_or(0);
                                for &i in &w.gpus {
                                    free[node].remove(&i);
                                    gpus.push((node, i));
                                }
                            }
                            out.push((j, gpus));
                        }
                        GangStatus::Pending => {
                            if let Some(t) = g.start_s {
                                let best = placed
                                    .gangs
                                    .iter()
                                    .filter(|x| x.status == GangStatus::Pending)
                                    .map(|x| x.priority_score)
                                    .fold(f64::MIN, f64::max);
                                if g.priority_score >= best {
                                    head_reservation.entry(j).or_insert(t - epoch0);
                                }
                            }
                        }
                        _ => {}
                    }
                }
                out
            }
        };
        for (j, gpus) in started {
            taken_inference += gpus.iter().filter(|(k, _)| inference.contains(k)).count() as u32;
            start[j] = Some(now);
            pending.retain(|&p| p != j);
            running.push(Running {
                job: j,
                gpus,
                end: now + jobs[j].runtime_s,
            });
        }
        // Deadlock: nothing runs, nothing can finish its workers, partial
        // holds block it all.
        if sched == Scheduler::FifoNoGang && running.is_empty() && !partial.is_empty() {
            let can_progress = pending.iter().any(|&j| {
                let job = &jobs[j];
                let held = partial.get(&j).map_or(0, |g| g.len() as u32) / job.gpus_per_worker;
                let room: u32 = free
                    .iter()
                    .map(|f| f.len() as u32 / job.gpus_per_worker)
                    .sum();
                held + room >= job.workers
            });
            if !can_progress {
                deadlocks += 1;
                if let Some((&youngest, _)) = partial.iter().next_back() {
                    for (node, i) in partial.remove(&youngest).unwrap_or_default() {
                        free[node].insert(i);
                    }
                    // Its pods are deleted and created again: they queue
                    // behind every pod already waiting.
                    pod_queue.retain(|&j| j != youngest);
                    pod_queue.extend(fifo_pods(jobs, &[youngest]));
                }
                continue; // schedule again at the same instant
            }
        }
        // Next event: a completion, an arrival, or inference's next
        // quarter-hour tick while any job is left.
        let next_end = running.iter().map(|r| r.end).fold(f64::INFINITY, f64::min);
        let next_arr = jobs
            .get(next_arrival)
            .map_or(f64::INFINITY, |j| j.arrival_s);
        let next = next_end.min(next_arr);
        // (A job that never fits would wait for ever: stop 30 days on.)
        if (!next.is_finite() && pending.is_empty()) || now > horizon + 30.0 * 86_400.0 {
            break;
        }
        let tick = (now / TICK_S).floor() * TICK_S + TICK_S;
        now = next.min(tick);
    }
    let waits: Vec<f64> = (0..jobs.len())
        .filter_map(|j| start[j].map(|s| (s - jobs[j].arrival_s) / 3600.0))
        .collect();
    let mut sorted = waits.clone();
    sorted.sort_by(f64::total_cmp);
    let large: Vec<f64> = (0..jobs.len())
        .filter(|&j| jobs[j].gpus() >= 32)
        .filter_map(|j| start[j].map(|s| (s - jobs[j].arrival_s) / 3600.0))
        .collect();
    let makespan = (0..jobs.len())
        .filter_map(|j| start[j].map(|s| s + jobs[j].runtime_s))
        .fold(t0, f64::max);
    let heads_delayed = head_reservation
        .iter()
        .filter(|(j, r)| start[**j].is_some_and(|s| s > **r + 1e-6))
        .count() as u32;
    let work: f64 = (0..jobs.len())
        .filter(|&j| start[j].is_some())
        .map(|j| f64::from(jobs[j].gpus()) * jobs[j].runtime_s)
        .sum();
    // Inference's GPU-seconds up to the last completion (the loop may run
    // a tick past it).
    let span = (makespan - t0).max(1.0);
    let inference_s = inf_held_s.min(all_gpus * span);
    Outcome {
        scheduler: sched,
        utilization: (work + inference_s) / (all_gpus * span),
        window_utilization: busy_in_window / (all_gpus * (horizon - t0).max(1.0)),
        inference_unmet_gpu_hours: inf_unmet_s / 3600.0,
        mean_wait_h: mean(&waits),
        p95_wait_h: sorted
            .get(((sorted.len() as f64 * 0.95).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or(0.0),
        large_wait_h: mean(&large),
        makespan_h: (makespan - t0) / 3600.0,
        deadlocks,
        held_idle_gpu_hours: held_idle,
        heads_delayed,
        inference_gpus_taken: taken_inference,
        completed: waits.len(),
        wall_s: wall.elapsed().as_secs_f64(),
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn at(epoch_s: f64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs_f64(epoch_s)
}

fn take(free: &mut [BTreeSet<u32>], per: &BTreeMap<usize, u32>) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    for (&node, &k) in per {
        let pick: Vec<u32> = free[node].iter().take(k as usize).copied().collect();
        for i in pick {
            free[node].remove(&i);
            out.push((node, i));
        }
    }
    out
}

/// The job as gpuscale sees it: rack preferred for multi-node gangs,
/// node required for one worker; the estimate as its runtime.
pub fn to_job(j: &JobDef, submitted_epoch_s: f64) -> TrainingJob {
    let level = if j.workers == 1 {
        TopologyLevel::Node
    } else {
        TopologyLevel::Rack
    };
    let mode = if j.workers == 1 {
        TopologyMode::Required
    } else {
        TopologyMode::Preferred
    };
    let spec = TrainingJobSpec {
        workers: j.workers,
        gpus_per_worker: j.gpus_per_worker,
        gpu_models: vec!["H100-80GB".into()],
        topology: Topology { level, mode },
        priority: Priority::Standard,
        preemptible: false,
        estimated_runtime: Some(Duration::from_secs_f64(j.estimate_s)),
        checkpoint_interval: None,
        partition: None,
        account: Some(j.account.clone()),
        submitted_at: Some(at(submitted_epoch_s)),
        started_at: None,
        template: None,
    };
    TrainingJob::from_spec(&j.name, &spec, &Catalog::builtin()).expect("a valid generated job")
}

fn queue_spec(usage: &BTreeMap<String, f64>) -> TrainingQueueSpec {
    TrainingQueueSpec {
        partitions: vec![Partition {
            max_runtime: Some(Duration::from_secs(24 * 3600)),
            default: true,
            ..Partition::new("training")
        }],
        fair_share: FairShare {
            half_life: Duration::from_secs(7 * 86_400),
            accounts: usage
                .iter()
                .map(|(a, u)| Account {
                    name: a.clone(),
                    shares: 1.0,
                    usage_gpu_hours: *u,
                })
                .collect(),
        },
        ..Default::default()
    }
}

/// The summary across seeds (Markdown): per scheduler, the median
/// utilisation and its gain over FIFO without gangs, the range of that
/// gain, how many seeds reach +20 %, and the deadlocks and delayed heads
/// summed. `per_seed[i]` holds one seed's outcomes in [`Scheduler::ALL`]
/// order; the first is the baseline.
pub fn summary(per_seed: &[Vec<Outcome>]) -> String {
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        match v.len() {
            0 => 0.0,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    };
    let mut out = format!(
        "Across {} seeds:\n\n| scheduler | median utilisation | median vs FIFO no gangs | min | max | seeds ≥ +20 % | deadlocks | heads delayed |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
        per_seed.len()
    );
    let Some(first) = per_seed.first() else {
        return out;
    };
    for (k, o) in first.iter().enumerate() {
        let util: Vec<f64> = per_seed.iter().map(|r| r[k].utilization).collect();
        let gain: Vec<f64> = per_seed
            .iter()
            .map(|r| r[k].utilization / r[0].utilization.max(f64::MIN_POSITIVE) - 1.0)
            .collect();
        let lo = gain.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = gain.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let met = gain.iter().filter(|g| **g >= 0.2 - 1e-9).count();
        out.push_str(&format!(
            "| {} | {:.1} % | {:+.1} % | {:+.1} % | {:+.1} % | {met} of {} | {} | {} |\n",
            o.scheduler.name(),
            100.0 * median(util),
            100.0 * median(gain),
            100.0 * lo,
            100.0 * hi,
            per_seed.len(),
            per_seed.iter().map(|r| r[k].deadlocks).sum::<u32>(),
            per_seed.iter().map(|r| r[k].heads_delayed).sum::<u32>(),
        ));
    }
    out
}

/// The report table (Markdown).
pub fn table(s: &Scenario, jobs: &[JobDef], outcomes: &[Outcome]) -> String {
    let gpu_hours: f64 = jobs
        .iter()
        .map(|j| f64::from(j.gpus()) * j.runtime_s / 3600.0)
        .sum();
    let mut out = format!(
        "{} jobs (seed {}), {} GPUs ({} nodes × 8 H100, racks of {}), inference on {} to {} (daily); {:.0} training GPU-hours offered; no schedule ends before {:.1} h\n\n",
        jobs.len(),
        s.seed,
        s.nodes * 8,
        s.nodes,
        s.nodes_per_rack,
        s.inference_nodes * 8,
        s.inference_peak_gpus,
        gpu_hours,
        makespan_bound_h(s, jobs)
    );
    out.push_str("| scheduler | utilisation | vs FIFO no gangs | utilisation while jobs arrive | mean wait h | p95 wait h | wait of ≥ 32-GPU jobs h | makespan h | deadlocks | GPU-h held idle by partial gangs | heads delayed | inference GPUs taken | inference GPU-h unmet | wall s |\n");
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let base = outcomes
        .iter()
        .find(|o| o.scheduler == Scheduler::FifoNoGang)
        .map_or(1.0, |o| o.utilization);
    for o in outcomes {
        out.push_str(&format!(
            "| {} | {:.1} % | {:+.1} % | {:.1} % | {:.2} | {:.2} | {:.2} | {:.1} | {} | {:.0} | {} | {} | {:.0} | {:.1} |\n",
            o.scheduler.name(),
            o.utilization * 100.0,
            (o.utilization / base - 1.0) * 100.0,
            o.window_utilization * 100.0,
            o.mean_wait_h,
            o.p95_wait_h,
            o.large_wait_h,
            o.makespan_h,
            o.deadlocks,
            o.held_idle_gpu_hours,
            o.heads_delayed,
            o.inference_gpus_taken,
            o.inference_unmet_gpu_hours,
            o.wall_s
        ));
    }
    out
}
