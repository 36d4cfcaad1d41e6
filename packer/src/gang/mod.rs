//! Training gangs: jobs of `workers × gpusPerWorker` whole GPUs, placed all
//! or nothing, within a topology level, beside inference on one inventory.
//!
//! - [`running`] reads which gangs run now from the cluster's GPU states
//!   (a GPU whose workload names a training job is held by it).
//! - [`place`] is the pure placement: pending jobs in queue order (the
//!   partition's tier, then the multifactor priority of [`queue`], then
//!   larger gangs, then by name), each by a small
//!   ILP over the nodes of one GPU model ([`solve`]): all workers or
//!   none, one domain of the topology level, the fewest nodes, whole
//!   nodes and NVLink domains kept free where it can, and, only when free
//!   GPUs cannot hold it, GPUs taken from lower-priority work at the least
//!   lost GPU-hours.
//! - [`joint`] plans training and inference together: gangs that run keep
//!   their GPUs, inference is packed on the rest, pending gangs take what
//!   inference leaves (or what lower-priority inference yields), and
//!   inference is packed again around them.
//! - [`artefacts`]: PodGroups (coscheduling or Volcano), per-worker node
//!   affinity, Kueue topology annotations and the equivalent `sbatch`
//!   directives.
//!
//! Training and inference never share a GPU: a gang's GPUs are removed
//! from the inventory inference is packed on, and a node that holds a
//! worker is not time-sliced, MPS-shared or HAMi-managed (its device
//! plugin would otherwise hand out shares of the gang's GPUs).

pub mod artefacts;
pub mod hostlist;
pub mod joint;
pub mod queue;
pub mod solve;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuscale_policies::model::Priority;
use gpuscale_policies::training::{TopologyLevel, TopologyMode, TrainingJob};
use gpuscale_policies::{Cluster, Health};
use serde::{Deserialize, Serialize};

/// Where a gang stands in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GangStatus {
    /// Runs now and keeps its GPUs.
    Running,
    /// Placed by this plan: its workers start together.
    Starting,
    /// Waits (the reason says for what).
    #[default]
    Pending,
    /// Ran, and yields its GPUs to higher-priority work in this plan.
    Preempted,
}

/// One worker of a gang: a node and the GPU indices it takes there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Worker {
    /// Worker number (0-based).
    pub worker: u32,
    /// Node name.
    pub node: String,
    /// GPU indices on the node.
    pub gpus: Vec<u32>,
}

/// What a victim of a preemption is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VictimKind {
    /// A running training job (all of its workers stop).
    Job,
    /// Inference replicas above their model's `minReplicas`.
    Replicas,
}

/// GPUs reserved on one node for a pending job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserved {
    /// Node name.
    pub node: String,
    /// GPUs.
    pub gpus: u32,
}

/// Work a gang stops to start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    /// Job or replicas.
    pub kind: VictimKind,
    /// Job name or model policy name.
    pub name: String,
    /// GPUs it frees (a job) or replicas it loses (a model).
    pub count: u32,
    /// GPU-hours of work lost (jobs: since their last checkpoint).
    pub lost_gpu_hours: f64,
    /// Why it was chosen.
    pub reason: String,
}

/// One training job in the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct GangPlan {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, if the job gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Priority.
    pub priority: Priority,
    /// Running, starting, pending or preempted.
    pub status: GangStatus,
    /// Workers.
    pub workers_wanted: u32,
    /// Whole GPUs each worker takes.
    pub gpus_per_worker: u32,
    /// GPU model of every worker: where placed, or, for a pending gang,
    /// of the GPUs reserved for it, else the one model it allows (none
    /// when it allows several and has no reservation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// Where each worker runs (empty unless running or starting).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<Worker>,
    /// The topology level asked for.
    pub topology: TopologyLevel,
    /// Required or preferred.
    pub topology_mode: TopologyMode,
    /// The narrowest level all workers share (placed gangs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_met: Option<TopologyLevel>,
    /// The domain at `topology_met` (a node, NVLink domain, rack or zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// What this gang stops to start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preempts: Vec<Preemption>,
    /// Why it is where it is, or what it waits for.
    pub reason: String,
    /// Expected runtime (for Slurm's `--time`), seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_runtime_s: Option<u64>,
    /// Partition.
    #[serde(default)]
    pub partition: String,
    /// Fair-share account.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// Multifactor priority (higher goes first).
    #[serde(default)]
    pub priority_score: f64,
    /// Start: when it started (running), starts (starting), or its
    /// reserved start (pending), seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_s: Option<f64>,
    /// When it is expected to free its GPUs (start + runtime).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_s: Option<f64>,
    /// A pending job's reservation: GPUs per node from `start_s` to
    /// `end_s`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved: Vec<Reserved>,
    /// The job's worker pod template (`spec.template`, as JSON), for
    /// `--emit`; not part of the plan's JSON.
    #[serde(skip)]
    pub template: Option<serde_json::Value>,
    /// Whether every node it runs on carries the node label of its
    /// topology level (for Kueue's annotation); not part of the plan's
    /// JSON.
    #[serde(skip)]
    pub topology_labelled: bool,
    /// The partition the job names, or the queue's default partition it
    /// falls in (for Slurm's `--partition`; `None`: no partition
    /// applies, and `partition` reads `default`); not part of the plan's
    /// JSON.
    #[serde(skip)]
    pub slurm_partition: Option<String>,
    /// The runtime the queue planned with, seconds (for Slurm's
    /// `--time`: the estimate within the partition's `maxRuntime`, else
    /// that maximum, else the queue's `defaultRuntime`); not part of the
    /// plan's JSON.
    #[serde(skip)]
    pub time_limit_s: Option<u64>,
}

impl GangPlan {
    /// GPUs the gang holds in this plan.
    pub fn gpus_held(&self) -> u32 {
        self.workers.iter().map(|w| w.gpus.len() as u32).sum()
    }

    /// Whether it holds GPUs in this plan.
    pub fn holds(&self) -> bool {
        matches!(self.status, GangStatus::Running | GangStatus::Starting)
    }
}

/// Training's share of the plan, and how fragmented the rest is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GangSummary {
    /// GPUs training gangs hold.
    pub gpus: u32,
    /// GPUs free for training after the plan (healthy, idle, on nodes
    /// whose device plugin does not share them).
    pub free_gpus: u32,
    /// Nodes all of whose GPUs are free.
    pub free_whole_nodes: u32,
    /// Most free GPUs on one node: the largest one-node worker that could
    /// start now.
    pub largest_free_node: u32,
    /// Fraction of the free GPUs that sit on partly used nodes (0: every
    /// free GPU is on a whole free node; 1: none is).
    pub fragmentation: f64,
}

/// Options of gang placement.
#[derive(Debug, Clone, PartialEq)]
pub struct GangOptions {
    /// Wall-clock limit of each job's small ILP.
    pub time_limit: Duration,
}

impl Default for GangOptions {
    fn default() -> Self {
        GangOptions {
            time_limit: Duration::from_secs(2),
        }
    }
}

/// A GPU: node index in the cluster, GPU index on the node.
pub type GpuRef = (usize, u32);

/// Importance, higher first (critical 2, standard 1, sheddable 0).
pub fn rank(p: Priority) -> u8 {
    match p {
        Priority::Critical => 2,
        Priority::Standard => 1,
        Priority::Sheddable => 0,
    }
}

/// The levels a job may be placed at, narrowest first: its own only when
/// required; its own, then each wider one, when preferred.
pub fn levels(job: &TrainingJob) -> Vec<TopologyLevel> {
    const ALL: [TopologyLevel; 5] = [
        TopologyLevel::Node,
        TopologyLevel::NvlinkDomain,
        TopologyLevel::Rack,
        TopologyLevel::Zone,
        TopologyLevel::Any,
    ];
    let wanted = job.spec.topology.level;
    match job.spec.topology.mode {
        TopologyMode::Required => vec![wanted],
        TopologyMode::Preferred => ALL.into_iter().filter(|l| *l >= wanted).collect(),
    }
}

/// A node's domain at a level. A node without the label is a domain of
/// its own (it is not known to share a rack or zone with anything), but
/// for NVLink: a node that declares no NVLink domain is one of its own
/// only when its GPUs are joined by NVLink (the catalogue's `nvlink`, SXM
/// boards); PCIe cards are in none (`None`), and a gang that must share
/// an NVLink domain cannot use them.
pub fn domain(cluster: &Cluster, node: usize, level: TopologyLevel) -> Option<String> {
    let n = &cluster.nodes[node];
    let own = || format!("node:{}", n.name);
    Some(match level {
        TopologyLevel::Node => n.name.clone(),
        TopologyLevel::NvlinkDomain => match &n.nvlink_domain {
            Some(d) => d.clone(),
            None if cluster.catalog.get(&n.gpu_model).is_some_and(|g| g.nvlink) => own(),
            None => return None,
        },
        TopologyLevel::Rack => n.rack.clone().unwrap_or_else(own),
        TopologyLevel::Zone => n.zone.clone().unwrap_or_else(own),
        TopologyLevel::Any => String::new(),
    })
}

/// "on one node", "in one rack", … "anywhere".
pub fn within(level: TopologyLevel) -> String {
    match level {
        TopologyLevel::Node => "on one node".to_string(),
        TopologyLevel::NvlinkDomain => "in one NVLink domain".to_string(),
        TopologyLevel::Any => "anywhere".to_string(),
        l => format!("in one {l}"),
    }
}

/// The narrowest level (and its domain) that every node in `nodes` shares.
pub fn met(cluster: &Cluster, nodes: &BTreeSet<usize>) -> (TopologyLevel, Option<String>) {
    for level in [
        TopologyLevel::Node,
        TopologyLevel::NvlinkDomain,
        TopologyLevel::Rack,
        TopologyLevel::Zone,
    ] {
        let ds: BTreeSet<Option<String>> =
            nodes.iter().map(|&n| domain(cluster, n, level)).collect();
        if ds.len() == 1
            && let Some(Some(d)) = ds.into_iter().next()
        {
            return (level, Some(d));
        }
    }
    (TopologyLevel::Any, None)
}

/// A gang found running in the cluster's GPU states.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The job's GPUs.
    pub gpus: Vec<GpuRef>,
    /// Whether it holds exactly its gang on healthy GPUs in whole workers;
    /// a gang that does not restarts whole (all or nothing).
    pub intact: bool,
    /// Why it is not intact.
    pub broken: Option<String>,
}

/// The gangs that run now: per job name, the GPUs whose workloads name it.
pub fn running(cluster: &Cluster, jobs: &[TrainingJob]) -> BTreeMap<String, Held> {
    let mut out: BTreeMap<String, Held> = BTreeMap::new();
    for (ni, node) in cluster.nodes.iter().enumerate() {
        for gpu in &node.gpus {
            for w in &gpu.workloads {
                if jobs.iter().any(|j| j.name == w.model) {
                    out.entry(w.model.clone())
                        .or_insert_with(|| Held {
                            gpus: Vec::new(),
                            intact: true,
                            broken: None,
                        })
                        .gpus
                        .push((ni, gpu.index));
                }
            }
        }
    }
    for (name, held) in &mut out {
        let job = jobs
            .iter()
            .find(|j| &j.name == name)
            .expect("filtered above");
        let gpw = job.spec.gpus_per_worker.max(1) as usize;
        let mut per_node: BTreeMap<usize, usize> = BTreeMap::new();
        for &(n, _) in &held.gpus {
            *per_node.entry(n).or_default() += 1;
        }
        let unhealthy: Vec<String> = held
            .gpus
            .iter()
            .filter(|&&(n, i)| {
                cluster.nodes[n]
                    .gpus
                    .iter()
                    .any(|g| g.index == i && g.health == Health::Unhealthy)
            })
            .map(|&(n, i)| format!("{}/{i}", cluster.nodes[n].name))
            .collect();
        let wrong_model: Vec<&str> = per_node
            .keys()
            .filter(|&&n| !job.gpu_models.contains(&cluster.nodes[n].gpu_model))
            .map(|&n| cluster.nodes[n].name.as_str())
            .collect();
        held.broken = if !unhealthy.is_empty() {
            Some(format!("GPU {} is unhealthy", unhealthy.join(", ")))
        } else if held.gpus.len() != job.total_gpus() as usize {
            Some(format!(
                "it holds {} of its {} GPUs",
                held.gpus.len(),
                job.total_gpus()
            ))
        } else if let Some((&n, c)) = per_node.iter().find(|(_, c)| **c % gpw != 0) {
            Some(format!(
                "node {} holds {c} of its GPUs, not whole workers of {gpw}",
                cluster.nodes[n].name
            ))
        } else if !wrong_model.is_empty() {
            Some(format!(
                "node {} is not one of its GPU models",
                wrong_model.join(", ")
            ))
        } else {
            None
        };
        held.intact = held.broken.is_none();
        held.gpus.sort();
    }
    out
}

/// Splits a node-sorted GPU list into workers of `gpw` GPUs each.
pub fn workers_of(cluster: &Cluster, gpus: &[GpuRef], gpw: u32, first: u32) -> Vec<Worker> {
    let mut out = Vec::new();
    let mut by_node: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for &(n, i) in gpus {
        by_node.entry(n).or_default().push(i);
    }
    let mut next = first;
    for (n, mut idx) in by_node {
        idx.sort_unstable();
        for chunk in idx.chunks(gpw.max(1) as usize) {
            out.push(Worker {
                worker: next,
                node: cluster.nodes[n].name.clone(),
                gpus: chunk.to_vec(),
            });
            next += 1;
        }
    }
    out
}

/// The input of [`place`]: free GPUs per node and what inference uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// Free GPUs per node index (healthy, idle, training may take them).
    pub free: BTreeMap<usize, BTreeSet<u32>>,
    /// What inference uses, per node: (GPU index, the priority rank of
    /// the most important replica on it). Empty when gangs may not take
    /// inference GPUs.
    pub inference: BTreeMap<usize, Vec<(u32, u8)>>,
    /// Whether any job may take inference GPUs whatever their priority
    /// (their replicas move; the caller packs inference again and checks
    /// that none is lost that may not yield). Otherwise only GPUs whose
    /// replicas are all less important than the job.
    pub inference_movable: bool,
    /// Try free and inference GPUs together level by level (a preferred
    /// level met by moving inference before it is relaxed), rather than
    /// free GPUs at every level first ([`solve::best`]).
    pub level_first: bool,
    /// Jobs that may take no inference GPU in this pass, whatever their
    /// priority: the caller's way to let only the more important of
    /// several gangs move inference when all of them together would push
    /// a model below what it must keep.
    pub free_only: BTreeSet<String>,
}

/// GPU-hours a preemption at `now_s` loses: the work since the job's last
/// checkpoint when it started at a known time (its checkpoints every
/// `checkpointInterval` from its start; without checkpoints, everything
/// since its start); otherwise the worst case of
/// [`TrainingJob::preemption_cost_gpu_hours`].
pub fn lost_gpu_hours(job: &TrainingJob, now_s: f64) -> f64 {
    let Some(started) = job.spec.started_at else {
        return job.preemption_cost_gpu_hours();
    };
    let elapsed = (now_s - queue::epoch(started)).max(0.0);
    let since = match job.spec.checkpoint_interval {
        Some(c) if c.as_secs_f64() > 0.0 => elapsed % c.as_secs_f64(),
        _ => elapsed,
    };
    f64::from(job.total_gpus()) * since / 3600.0
}

/// The outcome of [`place`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placed {
    /// Every job, in the order placed.
    pub gangs: Vec<GangPlan>,
    /// Inference GPUs gangs took (inference is packed again without them).
    pub from_inference: BTreeSet<GpuRef>,
}

/// Places gangs. `held` are the gangs that run now (from [`running`]);
/// intact ones keep their GPUs unless a higher-priority gang preempts
/// them, broken ones release theirs and are placed again whole. Pending
/// jobs go in the queue's priority order with conservative backfill
/// ([`queue`]): a job starts now only on GPUs no job above it has
/// reserved for the span of its runtime; one that cannot start gets a
/// reservation.
pub fn place(
    cluster: &Cluster,
    jobs: &[TrainingJob],
    held: &BTreeMap<String, Held>,
    inventory: &Inventory,
    q: &queue::Queue,
    options: &GangOptions,
) -> Placed {
    let now = q.now;
    let free = inventory.free.clone();
    let mut inference = inventory.inference.clone();
    let mut timeline = queue::Timeline::new(&free);
    let mut free = free;
    // Running gangs: (job index, GPUs), and when each frees them.
    let mut runs: BTreeMap<usize, Vec<GpuRef>> = BTreeMap::new();
    let mut pending: Vec<(usize, String)> = Vec::new();
    for (ji, job) in jobs.iter().enumerate() {
        match held.get(&job.name) {
            Some(h) if h.intact => {
                runs.insert(ji, h.gpus.clone());
                let end = q.end_s(job);
                let mut per: BTreeMap<usize, i64> = BTreeMap::new();
                for &(n, _) in &h.gpus {
                    *per.entry(n).or_default() += 1;
                }
                for (n, c) in per {
                    timeline.add(n, end, f64::INFINITY, c);
                }
            }
            Some(h) => {
                // A broken gang restarts whole; its healthy GPUs are in the
                // inventory (the caller counts them free or inference's).
                pending.push((
                    ji,
                    format!(
                        "restarts as a whole gang: {}",
                        h.broken.clone().unwrap_or_default()
                    ),
                ));
            }
            None => pending.push((ji, String::new())),
        }
    }
    let score: Vec<f64> = jobs.iter().map(|j| queue::priority(q, j)).collect();
    // Slurm's PriorityTier is strict: a higher tier's jobs go first, then
    // the multifactor score.
    let tier = |j: &TrainingJob| q.spec.partition_of(j).map_or(0, |p| p.priority_tier);
    let order = |a: usize, b: usize| {
        tier(&jobs[b])
            .cmp(&tier(&jobs[a]))
            .then(score[b].total_cmp(&score[a]))
            .then(jobs[b].total_gpus().cmp(&jobs[a].total_gpus()))
            .then(jobs[a].name.cmp(&jobs[b].name))
    };
    pending.sort_by(|(a, _), (b, _)| order(*a, *b));
    // GPUs each partition's jobs hold.
    let mut in_partition: BTreeMap<String, u32> = BTreeMap::new();
    for (ji, gpus) in &runs {
        *in_partition
            .entry(q.partition_name(&jobs[*ji]))
            .or_default() += gpus.len() as u32;
    }
    // Jobs preempted in this pass: requeued at their own priority, as
    // Slurm's `PreemptMode=REQUEUE` does, so they get a reservation (or
    // start elsewhere) in turn.
    let mut preempted: BTreeSet<usize> = BTreeSet::new();
    let mut from_inference = BTreeSet::new();
    let mut started: Vec<GangPlan> = Vec::new();
    let mut waiting: Vec<GangPlan> = Vec::new();
    // Jobs above the current one that hold a reservation.
    let mut reserved_above: Vec<(String, f64)> = Vec::new();
    let mut next = 0;
    while next < pending.len() {
        let (ji, note) = pending[next].clone();
        next += 1;
        let mut job = jobs[ji].clone();
        let allowed = q.allowed_nodes(cluster, &job);
        if let Some(p) = q.spec.partition_of(&job)
            && !p.gpu_models.is_empty()
        {
            job.gpu_models.retain(|g| p.gpu_models.contains(g));
        }
        let r = rank(job.spec.priority);
        let d = q.runtime_s(&job);
        let partition = q.partition_name(&job);
        let mut plan_note = note.clone();
        if let Some(limit) = q.partition_limit(&job) {
            let used = in_partition.get(&partition).copied().unwrap_or(0);
            if used + job.total_gpus() > limit {
                let mut p = pending_plan(
                    &job,
                    with_note(
                        &note,
                        format!(
                            "waits: partition `{partition}` GPU limit of {limit}: {used} held when its turn came (by jobs running or ahead of it), it needs {}; no reservation while over a limit, as in Slurm",
                            job.total_gpus()
                        ),
                    ),
                );
                if preempted.contains(&ji) {
                    p.status = GangStatus::Preempted;
                }
                decorate(&mut p, q, &job, score[ji]);
                waiting.push(p);
                continue;
            }
        }
        // What it may use now: free GPUs that stay free for its runtime
        // (reservations of jobs above it are in the timeline).
        let usable: BTreeMap<usize, BTreeSet<u32>> = free
            .iter()
            .filter(|(n, _)| allowed.contains(n))
            .map(|(n, set)| {
                let k = timeline
                    .min_free(*n, now, now + d)
                    .clamp(0, set.len() as i64) as usize;
                (*n, set.iter().take(k).copied().collect::<BTreeSet<u32>>())
            })
            .filter(|(_, s)| !s.is_empty())
            .collect();
        // Victims: running, preemptible, strictly less important — and
        // only while no job above this one holds a reservation (the GPUs
        // a victim frees are not checked against reservations, so
        // preempting past one could delay it).
        let may_preempt = reserved_above.is_empty();
        let victims: Vec<solve::Victim> = runs
            .iter()
            .filter(|(vi, _)| {
                let v = &jobs[**vi];
                may_preempt && v.spec.preemptible && rank(v.spec.priority) < r
            })
            .map(|(vi, gpus)| solve::Victim {
                job: *vi,
                gpus: gpus
                    .iter()
                    .filter(|g| allowed.contains(&g.0))
                    .copied()
                    .collect(),
                lost_gpu_hours: lost_gpu_hours(&jobs[*vi], q.now),
            })
            .filter(|v| !v.gpus.is_empty())
            .collect();
        let free_only = inventory.free_only.contains(&job.name);
        let takeable: BTreeMap<usize, Vec<u32>> = inference
            .iter()
            .filter(|(n, _)| !free_only && allowed.contains(n))
            .map(|(n, gs)| {
                (
                    *n,
                    gs.iter()
                        .filter(|(_, pr)| inventory.inference_movable || *pr < r)
                        .map(|(i, _)| *i)
                        .collect::<Vec<u32>>(),
                )
            })
            .filter(|(_, v)| !v.is_empty())
            .collect();
        match solve::best(
            cluster,
            &job,
            &usable,
            &takeable,
            &victims,
            options,
            inventory.level_first,
        ) {
            Some(choice) => {
                for v in &choice.victims {
                    let gpus = runs.remove(&v.job).unwrap_or_default();
                    let end = q.end_s(&jobs[v.job]);
                    let mut per: BTreeMap<usize, i64> = BTreeMap::new();
                    for &(n, i) in &gpus {
                        free.entry(n).or_default().insert(i);
                        *per.entry(n).or_default() += 1;
                    }
                    for (n, c) in per {
                        timeline.add(n, now, end, c);
                    }
                    if let Some(u) = in_partition.get_mut(&q.partition_name(&jobs[v.job])) {
                        *u = u.saturating_sub(gpus.len() as u32);
                    }
                    preempted.insert(v.job);
                    let why = format!(
                        "preempted by `{}` ({} priority, {} GPUs)",
                        job.name,
                        format!("{:?}", job.spec.priority).to_lowercase(),
                        job.total_gpus()
                    );
                    // Back in the queue among the jobs not yet placed.
                    let at = pending[next..]
                        .iter()
                        .position(|(o, _)| order(v.job, *o).is_lt())
                        .map_or(pending.len(), |i| next + i);
                    pending.insert(at, (v.job, why));
                }
                let mut per: BTreeMap<usize, i64> = BTreeMap::new();
                let mut from_inf: BTreeMap<usize, i64> = BTreeMap::new();
                for &(n, i) in &choice.gpus {
                    let taken_free = free.get_mut(&n).is_some_and(|s| s.remove(&i));
                    if taken_free {
                        *per.entry(n).or_default() += 1;
                    } else {
                        if let Some(gs) = inference.get_mut(&n) {
                            gs.retain(|(g, _)| *g != i);
                        }
                        from_inference.insert((n, i));
                        *from_inf.entry(n).or_default() += 1;
                    }
                }
                for (n, c) in per {
                    timeline.add(n, now, now + d, -c);
                }
                // GPUs it took from inference are training's when it ends.
                for (n, c) in from_inf {
                    timeline.add(n, now + d, f64::INFINITY, c);
                }
                *in_partition.entry(partition.clone()).or_default() += job.total_gpus();
                if let Some((above, at)) = reserved_above.first() {
                    plan_note = with_note(
                        &plan_note,
                        format!(
                            "backfilled: leaves the GPUs reserved for `{above}` (from {}) alone",
                            queue::rfc3339(*at)
                        ),
                    );
                }
                let mut g = starting(cluster, jobs, ji, &choice, &plan_note);
                decorate(&mut g, q, &job, score[ji]);
                g.start_s = Some(now);
                g.end_s = Some(now + d);
                started.push(g);
            }
            None => {
                let why = solve::why_waiting(cluster, &job, &usable, &takeable, &victims);
                let mut p = pending_plan(&job, with_note(&note, why));
                if preempted.contains(&ji) {
                    p.status = GangStatus::Preempted;
                }
                decorate(&mut p, q, &job, score[ji]);
                // The earliest start the profile allows: a reservation.
                for t in timeline.times_after(now) {
                    let counts: BTreeMap<usize, u32> = allowed
                        .iter()
                        .map(|&n| (n, timeline.min_free(n, t, t + d).max(0) as u32))
                        .filter(|(_, c)| *c > 0)
                        .collect();
                    if let Some((_, per)) = queue::fit_counts(cluster, &job, &counts) {
                        for (&n, &c) in &per {
                            timeline.add(n, t, t + d, -i64::from(c));
                        }
                        p.start_s = Some(t);
                        p.end_s = Some(t + d);
                        if let Some(&n) = per.keys().next() {
                            p.gpu_model = Some(cluster.nodes[n].gpu_model.clone());
                        }
                        p.reserved = per
                            .iter()
                            .map(|(&n, &g)| Reserved {
                                node: cluster.nodes[n].name.clone(),
                                gpus: g,
                            })
                            .collect();
                        let names: Vec<&str> = p.reserved.iter().map(|r| r.node.as_str()).collect();
                        p.reason = with_note(
                            &note,
                            format!(
                                "waits for resources: reserved to start {} on {}",
                                queue::rfc3339(t),
                                hostlist::hostlist(&names)
                            ),
                        );
                        reserved_above.push((job.name.clone(), t));
                        break;
                    }
                }
                waiting.push(p);
            }
        }
    }
    // Running gangs that keep their GPUs, and those preempted.
    let mut gangs: Vec<GangPlan> = Vec::new();
    for (ji, gpus) in &runs {
        let job = &jobs[*ji];
        let nodes: BTreeSet<usize> = gpus.iter().map(|&(n, _)| n).collect();
        let (level, dom) = met(cluster, &nodes);
        let holds_level = level <= job.spec.topology.level;
        let mut g = GangPlan {
            name: job.name.clone(),
            priority: job.spec.priority,
            status: GangStatus::Running,
            workers_wanted: job.spec.workers,
            gpus_per_worker: job.spec.gpus_per_worker,
            gpu_model: nodes.first().map(|&n| cluster.nodes[n].gpu_model.clone()),
            workers: workers_of(cluster, gpus, job.spec.gpus_per_worker, 0),
            topology: job.spec.topology.level,
            topology_mode: job.spec.topology.mode,
            topology_met: Some(level),
            domain: dom,
            preempts: Vec::new(),
            reason: if holds_level {
                "runs; keeps its GPUs".to_string()
            } else {
                format!(
                    "runs; keeps its GPUs (spread wider than its {})",
                    job.spec.topology.level
                )
            },
            estimated_runtime_s: job.spec.estimated_runtime.map(|d| d.as_secs()),
            ..GangPlan::default()
        };
        decorate(&mut g, q, job, score[*ji]);
        g.start_s = job.spec.started_at.map(queue::epoch);
        g.end_s = Some(q.end_s(job));
        gangs.push(g);
    }
    gangs.extend(started);
    gangs.extend(waiting);
    name_broken_holders(cluster, held, &mut gangs);
    for g in &mut gangs {
        g.topology_labelled = g.workers.iter().all(|w| {
            cluster
                .nodes
                .iter()
                .find(|n| n.name == w.node)
                .is_some_and(|n| match g.topology {
                    TopologyLevel::Node | TopologyLevel::Any => true,
                    TopologyLevel::NvlinkDomain => n.nvlink_domain.is_some(),
                    TopologyLevel::Rack => n.rack.is_some(),
                    TopologyLevel::Zone => n.zone.is_some(),
                })
        });
    }
    Placed {
        gangs,
        from_inference,
    }
}

/// A broken gang's pods hold its GPUs until they are deleted (the plan
/// counts them free, so that it restarts whole): a gang started on any of
/// them names it among what it stops, and so does the broken gang itself
/// when it starts again where its old pods are.
fn name_broken_holders(cluster: &Cluster, held: &BTreeMap<String, Held>, gangs: &mut [GangPlan]) {
    for g in gangs
        .iter_mut()
        .filter(|g| g.status == GangStatus::Starting)
    {
        let on: BTreeSet<(&str, u32)> = g
            .workers
            .iter()
            .flat_map(|w| w.gpus.iter().map(|&i| (w.node.as_str(), i)))
            .collect();
        let mut found = Vec::new();
        for (name, h) in held.iter().filter(|(_, h)| !h.intact) {
            let count = h
                .gpus
                .iter()
                .filter(|&&(n, i)| on.contains(&(cluster.nodes[n].name.as_str(), i)))
                .count() as u32;
            if count > 0 {
                found.push(Preemption {
                    kind: VictimKind::Job,
                    name: name.clone(),
                    count,
                    lost_gpu_hours: 0.0,
                    reason: format!(
                        "{}: its pods hold these GPUs until they are deleted; delete them before `{name}`'s new pods are applied (kubectl delete pods -l gpuscale.io/training-job={name}, which would match those too)",
                        if *name == g.name {
                            "its own pods from before it broke"
                        } else {
                            "a broken gang, which restarts whole"
                        }
                    ),
                });
            }
        }
        g.preempts.extend(found);
    }
    // Where no gang starts on them, the broken gang says so itself: its
    // old pods keep those GPUs from everything (inference stays off
    // them) until someone deletes them.
    let starting: BTreeSet<(String, u32)> = gangs
        .iter()
        .filter(|g| g.status == GangStatus::Starting)
        .flat_map(|g| {
            g.workers
                .iter()
                .flat_map(|w| w.gpus.iter().map(|&i| (w.node.clone(), i)))
        })
        .collect();
    for (name, h) in held.iter().filter(|(_, h)| !h.intact) {
        let mut left: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for &(n, i) in &h.gpus {
            let node = cluster.nodes[n].name.as_str();
            if !starting.contains(&(node.to_string(), i)) {
                left.entry(node).or_default().push(i);
            }
        }
        let count: usize = left.values().map(Vec::len).sum();
        let Some(g) = gangs.iter_mut().find(|g| &g.name == name) else {
            continue;
        };
        if count == 0 {
            continue;
        }
        let on: Vec<String> = left
            .iter()
            .map(|(node, idx)| {
                let idx: Vec<String> = idx.iter().map(ToString::to_string).collect();
                format!("{node}[{}]", idx.join(","))
            })
            .collect();
        let also = format!(
            "they also hold {}, where nothing is placed until they are deleted",
            on.join(" ")
        );
        // One entry for its own pods: where it restarts on some of them,
        // the rest join that one.
        if let Some(own) = g.preempts.iter_mut().find(|p| &p.name == name) {
            own.count += count as u32;
            own.reason = format!("{}; {also}", own.reason);
            continue;
        }
        g.preempts.push(Preemption {
            kind: VictimKind::Job,
            name: name.clone(),
            count: count as u32,
            lost_gpu_hours: 0.0,
            reason: format!(
                "its own pods from before it broke hold {} until they are deleted; delete them before its new pods are applied (kubectl delete pods -l gpuscale.io/training-job={name}, which would match those too); nothing is placed there until then",
                on.join(" ")
            ),
        });
    }
}

fn with_note(note: &str, text: String) -> String {
    if note.is_empty() {
        text
    } else {
        format!("{note}; {text}")
    }
}

pub(crate) fn decorate(g: &mut GangPlan, q: &queue::Queue, job: &TrainingJob, score: f64) {
    g.namespace = job.namespace.clone();
    g.partition = q.partition_name(job);
    g.slurm_partition = q.spec.partition_of(job).map(|p| p.name.clone());
    g.time_limit_s = Some(q.spec.runtime_of(job).as_secs());
    g.account = job.spec.account.clone();
    g.priority_score = score;
    g.template = job
        .spec
        .template
        .as_ref()
        .and_then(|t| serde_json::to_value(t).ok());
}

/// The plan of a gang that starts on `choice`.
pub fn starting(
    cluster: &Cluster,
    jobs: &[TrainingJob],
    ji: usize,
    choice: &solve::Choice,
    note: &str,
) -> GangPlan {
    let job = &jobs[ji];
    let nodes: BTreeSet<usize> = choice.gpus.iter().map(|&(n, _)| n).collect();
    let (level, dom) = met(cluster, &nodes);
    let mut preempts: Vec<Preemption> = choice
        .victims
        .iter()
        .map(|v| Preemption {
            kind: VictimKind::Job,
            name: jobs[v.job].name.clone(),
            count: v.gpus.len() as u32,
            lost_gpu_hours: v.lost_gpu_hours,
            reason: format!(
                "{} priority, preemptible; the set of victims that frees {} at the least lost GPU-hours",
                format!("{:?}", jobs[v.job].spec.priority).to_lowercase(),
                match choice.level {
                    TopologyLevel::Any => "the GPUs".to_string(),
                    level => format!("the {level}"),
                }
            ),
        })
        .collect();
    preempts.sort_by(|a, b| a.name.cmp(&b.name));
    let mut reason = format!(
        "{} worker{} × {} {} {} ({})",
        job.spec.workers,
        if job.spec.workers == 1 { "" } else { "s" },
        job.spec.gpus_per_worker,
        choice.gpu_model,
        within(level),
        choice.why
    );
    if !note.is_empty() {
        reason = format!("{note}; {reason}");
    }
    let mut sorted = choice.gpus.clone();
    sorted.sort();
    GangPlan {
        name: job.name.clone(),
        priority: job.spec.priority,
        status: GangStatus::Starting,
        workers_wanted: job.spec.workers,
        gpus_per_worker: job.spec.gpus_per_worker,
        gpu_model: Some(choice.gpu_model.clone()),
        workers: workers_of(cluster, &sorted, job.spec.gpus_per_worker, 0),
        topology: job.spec.topology.level,
        topology_mode: job.spec.topology.mode,
        topology_met: Some(level),
        domain: dom,
        preempts,
        reason,
        estimated_runtime_s: job.spec.estimated_runtime.map(|d| d.as_secs()),
        ..GangPlan::default()
    }
}

fn pending_plan(job: &TrainingJob, reason: String) -> GangPlan {
    GangPlan {
        name: job.name.clone(),
        priority: job.spec.priority,
        status: GangStatus::Pending,
        workers_wanted: job.spec.workers,
        gpus_per_worker: job.spec.gpus_per_worker,
        gpu_model: match job.gpu_models.as_slice() {
            [only] => Some(only.clone()),
            _ => None,
        },
        workers: Vec::new(),
        topology: job.spec.topology.level,
        topology_mode: job.spec.topology.mode,
        topology_met: None,
        domain: None,
        preempts: Vec::new(),
        reason,
        estimated_runtime_s: job.spec.estimated_runtime.map(|d| d.as_secs()),
        ..GangPlan::default()
    }
}

/// Fragmentation of the GPUs free for training.
pub fn summary(
    cluster: &Cluster,
    gangs: &[GangPlan],
    free: &BTreeMap<usize, BTreeSet<u32>>,
) -> GangSummary {
    let gpus = gangs
        .iter()
        .filter(|g| g.holds())
        .map(GangPlan::gpus_held)
        .sum();
    let mut free_gpus = 0;
    let mut whole = 0;
    let mut on_whole = 0;
    let mut largest = 0;
    for (&n, set) in free {
        let f = set.len() as u32;
        free_gpus += f;
        largest = largest.max(f);
        let healthy = cluster.nodes[n]
            .gpus
            .iter()
            .filter(|g| g.health == Health::Healthy)
            .count() as u32;
        if f > 0 && f == healthy {
            whole += 1;
            on_whole += f;
        }
    }
    GangSummary {
        gpus,
        free_gpus,
        free_whole_nodes: whole,
        largest_free_node: largest,
        fragmentation: if free_gpus == 0 {
            0.0
        } else {
            1.0 - f64::from(on_whole) / f64::from(free_gpus)
        },
    }
}
