//! Training gangs: jobs of `workers × gpusPerWorker` whole GPUs, placed all
//! or nothing, within a topology level, beside inference on one inventory.
//!
//! - [`running`] reads which gangs run now from the cluster's GPU states
//!   (a GPU whose workload names a training job is held by it).
//! - [`place`] is the pure placement: pending jobs in priority order
//!   (critical first, then larger gangs, then by name), each by a small
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
pub mod joint;
pub mod solve;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuscale_policies::model::Priority;
use gpuscale_policies::training::{TopologyLevel, TopologyMode, TrainingJob};
use gpuscale_policies::{Cluster, Health};
use serde::{Deserialize, Serialize};

/// Where a gang stands in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GangStatus {
    /// Runs now and keeps its GPUs.
    Running,
    /// Placed by this plan: its workers start together.
    Starting,
    /// Waits (the reason says for what).
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
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GangPlan {
    /// `metadata.name`.
    pub name: String,
    /// Priority.
    pub priority: Priority,
    /// Running, starting, pending or preempted.
    pub status: GangStatus,
    /// Workers.
    pub workers_wanted: u32,
    /// Whole GPUs each worker takes.
    pub gpus_per_worker: u32,
    /// GPU model of every worker (placed gangs).
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
/// its own (it is not known to share a rack or zone with anything).
pub fn domain(cluster: &Cluster, node: usize, level: TopologyLevel) -> String {
    let n = &cluster.nodes[node];
    let own = || format!("node:{}", n.name);
    match level {
        TopologyLevel::Node => n.name.clone(),
        TopologyLevel::NvlinkDomain => n.nvlink_domain.clone().unwrap_or_else(own),
        TopologyLevel::Rack => n.rack.clone().unwrap_or_else(own),
        TopologyLevel::Zone => n.zone.clone().unwrap_or_else(own),
        TopologyLevel::Any => String::new(),
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
        let ds: BTreeSet<String> = nodes.iter().map(|&n| domain(cluster, n, level)).collect();
        if ds.len() == 1 {
            return (level, ds.into_iter().next());
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
/// them, broken ones release theirs and are placed again whole.
pub fn place(
    cluster: &Cluster,
    jobs: &[TrainingJob],
    held: &BTreeMap<String, Held>,
    inventory: &Inventory,
    options: &GangOptions,
) -> Placed {
    let mut free = inventory.free.clone();
    let mut inference = inventory.inference.clone();
    let mut out: Vec<GangPlan> = Vec::new();
    // Running gangs: (job index, GPUs).
    let mut runs: BTreeMap<usize, Vec<GpuRef>> = BTreeMap::new();
    let mut pending: Vec<(usize, String)> = Vec::new();
    for (ji, job) in jobs.iter().enumerate() {
        match held.get(&job.name) {
            Some(h) if h.intact => {
                runs.insert(ji, h.gpus.clone());
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
    pending.sort_by(|(a, _), (b, _)| {
        let (ja, jb) = (&jobs[*a], &jobs[*b]);
        rank(jb.spec.priority)
            .cmp(&rank(ja.spec.priority))
            .then(jb.total_gpus().cmp(&ja.total_gpus()))
            .then(ja.name.cmp(&jb.name))
    });
    let mut preempted: BTreeMap<usize, String> = BTreeMap::new();
    let mut from_inference = BTreeSet::new();
    let mut started: Vec<GangPlan> = Vec::new();
    for (ji, note) in pending {
        let job = &jobs[ji];
        let r = rank(job.spec.priority);
        // Victims: running, preemptible, strictly less important.
        let victims: Vec<solve::Victim> = runs
            .iter()
            .filter(|(vi, _)| {
                let v = &jobs[**vi];
                v.spec.preemptible && rank(v.spec.priority) < r
            })
            .map(|(vi, gpus)| solve::Victim {
                job: *vi,
                gpus: gpus.clone(),
                lost_gpu_hours: jobs[*vi].preemption_cost_gpu_hours(),
            })
            .collect();
        let takeable: BTreeMap<usize, Vec<u32>> = inference
            .iter()
            .map(|(n, gs)| {
                (
                    *n,
                    gs.iter()
                        .filter(|(_, pr)| *pr < r)
                        .map(|(i, _)| *i)
                        .collect::<Vec<u32>>(),
                )
            })
            .filter(|(_, v)| !v.is_empty())
            .collect();
        let found = solve::best(cluster, job, &free, &takeable, &victims, options);
        match found {
            Some(choice) => {
                // Take the GPUs.
                for v in &choice.victims {
                    let gpus = runs.remove(&v.job).unwrap_or_default();
                    for (n, i) in gpus {
                        free.entry(n).or_default().insert(i);
                    }
                    preempted.insert(
                        v.job,
                        format!(
                            "preempted by `{}` ({} priority, {} GPUs)",
                            job.name,
                            format!("{:?}", job.spec.priority).to_lowercase(),
                            job.total_gpus()
                        ),
                    );
                }
                for &(n, i) in &choice.gpus {
                    let taken_free = free.get_mut(&n).is_some_and(|s| s.remove(&i));
                    if !taken_free {
                        if let Some(gs) = inference.get_mut(&n) {
                            gs.retain(|(g, _)| *g != i);
                        }
                        from_inference.insert((n, i));
                    }
                }
                started.push(starting(cluster, jobs, ji, &choice, &note));
            }
            None => {
                let why = solve::why_waiting(cluster, job, &free, &takeable, &victims);
                let reason = if note.is_empty() {
                    why
                } else {
                    format!("{note}; {why}")
                };
                out.push(pending_plan(job, reason));
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
        gangs.push(GangPlan {
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
        });
    }
    for (ji, why) in preempted {
        let mut p = pending_plan(&jobs[ji], why);
        p.status = GangStatus::Preempted;
        gangs.push(p);
    }
    gangs.extend(started);
    gangs.extend(out);
    Placed {
        gangs,
        from_inference,
    }
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
                "{} priority, preemptible; the set of victims that frees the {} at the least lost GPU-hours",
                format!("{:?}", jobs[v.job].spec.priority).to_lowercase(),
                choice.level
            ),
        })
        .collect();
    preempts.sort_by(|a, b| a.name.cmp(&b.name));
    let mut reason = format!(
        "{} workers × {} {} in one {} ({})",
        job.spec.workers, job.spec.gpus_per_worker, choice.gpu_model, choice.level, choice.why
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
    }
}

fn pending_plan(job: &TrainingJob, reason: String) -> GangPlan {
    GangPlan {
        name: job.name.clone(),
        priority: job.spec.priority,
        status: GangStatus::Pending,
        workers_wanted: job.spec.workers,
        gpus_per_worker: job.spec.gpus_per_worker,
        gpu_model: None,
        workers: Vec::new(),
        topology: job.spec.topology.level,
        topology_mode: job.spec.topology.mode,
        topology_met: None,
        domain: None,
        preempts: Vec::new(),
        reason,
        estimated_runtime_s: job.spec.estimated_runtime.map(|d| d.as_secs()),
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
