//! The training queue, with Slurm's semantics where Slurm has them.
//!
//! - **Priority** ([`priority`]): Slurm's multifactor plugin, four factors
//!   in [0, 1] with the queue's weights — the job's priority class as QOS
//!   (critical 1, standard ½, sheddable 0), its partition's tier over the
//!   highest, its account's fair-share factor `2^(−U/S)` (U the account's
//!   share of recent, decayed usage, S its share of the shares: Slurm's
//!   classic formula), and its age over `maxAge` — and a fifth that is not
//!   Slurm's, off unless weighted: the job's estimated runtime
//!   (`TrainingQueueSpec::runtime_factor`), longest first.
//! - **Conservative backfill** ([`Timeline`]): jobs in priority order;
//!   each starts now if the GPUs it would hold are free for its whole
//!   runtime in the availability profile, else it gets a *reservation* at
//!   the earliest time they are, and the reservation is subtracted from the
//!   profile. A job lower in the queue therefore starts now only where it
//!   delays no reservation of any job above it — Slurm's
//!   `sched/backfill` with reservations for every job (conservative), not
//!   EASY backfill (a reservation for the head job only). Runtimes are the
//!   jobs' estimates capped by their partition's `maxRuntime` (Slurm's time
//!   limit); running jobs free their GPUs at start + runtime.
//! - **Partitions**: a job uses only its partition's nodes and GPU models,
//!   and waits (`partition GPU limit`) while its partition's jobs hold
//!   `maxGpus`.
//!
//! Times are seconds since the Unix epoch (`f64`), given by the caller:
//! nothing here reads a clock.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use gpuscale_policies::training::{NodeRules, TopologyLevel, TrainingJob, TrainingQueueSpec};
use gpuscale_policies::{Cluster, Health, Priority};

use super::domain;

/// The queue's settings and the time of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Queue {
    /// Partitions, fair share, weights (the default: one partition, no
    /// limits, equal shares).
    pub spec: TrainingQueueSpec,
    /// Now, seconds since the Unix epoch.
    pub now: f64,
}

impl Queue {
    /// A queue at `now`.
    pub fn new(spec: TrainingQueueSpec, now: SystemTime) -> Queue {
        Queue {
            spec,
            now: epoch(now),
        }
    }

    /// A job's runtime for scheduling, seconds.
    pub fn runtime_s(&self, job: &TrainingJob) -> f64 {
        self.spec.runtime_of(job).as_secs_f64()
    }

    /// When a running job frees its GPUs: its start (or now, when not
    /// known) plus its runtime. One past its estimate is expected to end
    /// any moment: a minute from now (so what waits for it gets a
    /// reservation).
    pub fn end_s(&self, job: &TrainingJob) -> f64 {
        let start = job.spec.started_at.map_or(self.now, epoch);
        (start + self.runtime_s(job)).max(self.now + OVERDUE_S)
    }

    /// The nodes a job may use (its partition's), by index.
    pub fn allowed_nodes(&self, cluster: &Cluster, job: &TrainingJob) -> BTreeSet<usize> {
        let p = self.spec.partition_of(job);
        // The template's node rules, on the labels gpuscale knows (those
        // no node carries are the ones every node does: the job's check
        // refuses others).
        let rules = job
            .spec
            .template
            .as_deref()
            .map(NodeRules::of)
            .unwrap_or_default();
        let labels: Vec<_> = cluster
            .nodes
            .iter()
            .map(|n| n.known_labels(&cluster.catalog))
            .collect();
        let evaluated: BTreeSet<String> = labels.iter().flat_map(|l| l.keys().cloned()).collect();
        cluster
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| job.gpu_models.contains(&n.gpu_model))
            .filter(|(i, n)| rules.admit(&labels[*i], &n.name, &evaluated))
            .filter(|(_, n)| {
                p.is_none_or(|p| {
                    (p.nodes.is_empty() || p.nodes.contains(&n.name))
                        && (p.gpu_models.is_empty() || p.gpu_models.contains(&n.gpu_model))
                })
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// The partition's name (the default partition's, or `default`).
    pub fn partition_name(&self, job: &TrainingJob) -> String {
        self.spec
            .partition_of(job)
            .map_or("default".to_string(), |p| p.name.clone())
    }

    /// The partition's GPU limit, if any.
    pub fn partition_limit(&self, job: &TrainingJob) -> Option<u32> {
        self.spec.partition_of(job).and_then(|p| p.max_gpus)
    }
}

/// How soon a running job past its estimated end is expected to end.
pub const OVERDUE_S: f64 = 60.0;

/// Seconds since the Unix epoch.
pub fn epoch(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

/// RFC 3339 (seconds) of epoch seconds; `after 9999` past what RFC 3339
/// can write.
pub fn rfc3339(t: f64) -> String {
    // 9999-12-31T23:59:59Z.
    const LAST: f64 = 253_402_300_799.0;
    if t.is_nan() || t > LAST {
        return "after 9999".to_string();
    }
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs_f64(t.max(0.0));
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The account's fair-share factor `2^(−U/S)` (1 for an account with no
/// usage; ½ for one that used exactly its share).
pub fn fair_share(spec: &TrainingQueueSpec, account: Option<&str>) -> f64 {
    let accounts = &spec.fair_share.accounts;
    let listed = account.and_then(|a| accounts.iter().find(|x| x.name == a));
    let extra_share = if listed.is_none() { 1.0 } else { 0.0 };
    let total_shares: f64 = accounts.iter().map(|a| a.shares).sum::<f64>() + extra_share;
    let total_usage: f64 = accounts.iter().map(|a| a.usage_gpu_hours).sum();
    let (shares, usage) = listed.map_or((1.0, 0.0), |a| (a.shares, a.usage_gpu_hours));
    let s = shares / total_shares.max(f64::MIN_POSITIVE);
    let u = if total_usage > 0.0 {
        usage / total_usage
    } else {
        0.0
    };
    2f64.powf(-u / s.max(f64::MIN_POSITIVE))
}

/// The job's multifactor priority (higher first).
pub fn priority(q: &Queue, job: &TrainingJob) -> f64 {
    let w = &q.spec.weights;
    let qos = match job.spec.priority {
        Priority::Critical => 1.0,
        Priority::Standard => 0.5,
        Priority::Sheddable => 0.0,
    };
    let max_tier = q
        .spec
        .partitions
        .iter()
        .map(|p| p.priority_tier)
        .max()
        .unwrap_or(0);
    let tier = q.spec.partition_of(job).map_or(0, |p| p.priority_tier);
    let partition = if max_tier == 0 {
        0.0
    } else {
        f64::from(tier) / f64::from(max_tier)
    };
    let age = job
        .spec
        .submitted_at
        .map_or(0.0, |t| (q.now - epoch(t)).max(0.0));
    let age = (age / w.max_age.as_secs_f64().max(1.0)).min(1.0);
    w.qos * qos
        + w.partition * partition
        + w.fair_share * fair_share(&q.spec, job.spec.account.as_deref())
        + w.age * age
        + w.runtime * q.spec.runtime_factor(job)
}

/// Free GPUs per node over time (counts): the profile conservative
/// backfill schedules against.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    base: BTreeMap<usize, i64>,
    events: BTreeMap<usize, Vec<(f64, i64)>>,
}

impl Timeline {
    /// Free now, per node.
    pub fn new(free_now: &BTreeMap<usize, BTreeSet<u32>>) -> Timeline {
        Timeline {
            base: free_now.iter().map(|(n, s)| (*n, s.len() as i64)).collect(),
            events: BTreeMap::new(),
        }
    }

    /// `delta` GPUs on node `n` from `from` until `to` (`f64::INFINITY`:
    /// for good).
    pub fn add(&mut self, n: usize, from: f64, to: f64, delta: i64) {
        let e = self.events.entry(n).or_default();
        e.push((from, delta));
        if to.is_finite() {
            e.push((to, -delta));
        }
        e.sort_by(|a, b| a.0.total_cmp(&b.0));
    }

    /// The fewest free GPUs on node `n` over `[from, to)`.
    pub fn min_free(&self, n: usize, from: f64, to: f64) -> i64 {
        let mut v = self.base.get(&n).copied().unwrap_or(0);
        let events = self.events.get(&n).map_or(&[][..], Vec::as_slice);
        let mut i = 0;
        while i < events.len() && events[i].0 <= from {
            v += events[i].1;
            i += 1;
        }
        let mut low = v;
        while i < events.len() && events[i].0 < to {
            // Several events at one instant apply together.
            let t = events[i].0;
            while i < events.len() && events[i].0 == t {
                v += events[i].1;
                i += 1;
            }
            low = low.min(v);
        }
        low
    }

    /// Every instant after `after` at which some node's count changes.
    pub fn times_after(&self, after: f64) -> Vec<f64> {
        let mut ts: Vec<f64> = self
            .events
            .values()
            .flatten()
            .map(|e| e.0)
            .filter(|t| *t > after && t.is_finite())
            .collect();
        ts.sort_by(f64::total_cmp);
        ts.dedup();
        ts
    }
}

/// Where a job would fit given free GPU counts per node (a reservation's
/// estimate): for each allowed level, narrowest first, the domain that
/// holds it with the least to spare, its nodes with the most room first.
/// Returns the level and GPUs per node.
pub fn fit_counts(
    cluster: &Cluster,
    job: &TrainingJob,
    counts: &BTreeMap<usize, u32>,
) -> Option<(TopologyLevel, BTreeMap<usize, u32>)> {
    let gpw = job.spec.gpus_per_worker.max(1);
    let workers = job.spec.workers;
    for level in super::levels(job) {
        let mut best: Option<(u32, String, String)> = None;
        for m in &job.gpu_models {
            let mut per: BTreeMap<String, u32> = BTreeMap::new();
            for (&n, &c) in counts {
                if &cluster.nodes[n].gpu_model != m {
                    continue;
                }
                let Some(d) = domain(cluster, n, level) else {
                    continue;
                };
                *per.entry(d).or_default() += c / gpw;
            }
            for (d, cap) in per {
                if cap >= workers && best.as_ref().is_none_or(|b| cap < b.0) {
                    best = Some((cap, d, m.clone()));
                }
            }
        }
        let Some((_, d, m)) = best else { continue };
        let mut nodes: Vec<(usize, u32)> = counts
            .iter()
            .filter(|(n, _)| {
                cluster.nodes[**n].gpu_model == m
                    && domain(cluster, **n, level).as_ref() == Some(&d)
            })
            .map(|(n, c)| (*n, c / gpw))
            .filter(|(_, w)| *w > 0)
            .collect();
        nodes.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut left = workers;
        let mut out = BTreeMap::new();
        for (n, w) in nodes {
            if left == 0 {
                break;
            }
            let take = w.min(left);
            out.insert(n, take * gpw);
            left -= take;
        }
        return Some((level, out));
    }
    None
}

/// Healthy GPUs on a node.
pub fn healthy(cluster: &Cluster, n: usize) -> u32 {
    cluster.nodes[n]
        .gpus
        .iter()
        .filter(|g| g.health == Health::Healthy)
        .count() as u32
}
