//! The platform team's view of the loop: what runs where and why.
//!
//! [`view`] builds, from the cluster, the packer's last plan, the
//! gateway's last `/v1/queues` document and the controller's decisions,
//! one JSON-ready [`View`]: every node and GPU (MIG instances at their real
//! start slots and sizes, shares and whole GPUs, training gangs), each
//! model's queue, replicas, latencies against its SLO and last decision,
//! and the [`Sample`]s of the last [`HISTORY_SPAN`]. [`sample`] takes one
//! sample. Both are pure; the admin listener ([`crate::admin`]) serves the
//! view at `/v1/dashboard`, pushes it every second at
//! `/v1/dashboard/events` (server-sent events), and serves the page that
//! draws it at `/` ([`PAGE`], embedded in the binary: no CDN, no build
//! step).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use gpuscale_packer::plan::{GangSlot, Mode as GpuMode, Plan};
use gpuscale_policies::inventory::Health;
use gpuscale_policies::{Cluster, Model};
use serde::Serialize;

use crate::controller::ModelDecisions;

/// The page: HTML, CSS and one JavaScript module, no framework.
pub const PAGE: &str = include_str!("dashboard/index.html");

/// How far back the time series go.
pub const HISTORY_SPAN: Duration = Duration::from_secs(15 * 60);

/// The time series' resolution.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// What the controller keeps for the view, updated as it works.
#[derive(Debug, Default)]
pub struct Live {
    /// The packer's last plan.
    pub plan: Option<Arc<Plan>>,
    /// The gateway's last `/v1/queues` document.
    pub queues: Option<serde_json::Value>,
    /// Samples, oldest first, spanning at most [`HISTORY_SPAN`].
    pub history: VecDeque<Sample>,
}

impl Live {
    /// Adds `s` unless the last sample is younger than [`SAMPLE_EVERY`];
    /// drops samples older than [`HISTORY_SPAN`] before it.
    pub fn push(&mut self, s: Sample) {
        if self
            .history
            .back()
            .is_some_and(|last| s.t - last.t < SAMPLE_EVERY.as_secs_f64() - 1e-3)
        {
            return;
        }
        let oldest = s.t - HISTORY_SPAN.as_secs_f64();
        while self.history.front().is_some_and(|f| f.t < oldest) {
            self.history.pop_front();
        }
        self.history.push_back(s);
    }
}

/// One model at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSample {
    /// Arrivals per second (the gateway's last 10 s).
    pub rate: f64,
    /// Requests waiting (in the gateway and inside the servers).
    pub waiting: f64,
    /// Replicas serving.
    pub ready: u32,
    /// Replicas wanted.
    pub desired: u32,
}

/// The cluster at one instant.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the Unix epoch.
    pub t: f64,
    /// Arrivals per second, all models.
    pub load: f64,
    /// Requests waiting, all models.
    pub waiting: f64,
    /// Replicas serving, all models.
    pub ready: u32,
    /// Replicas wanted, all models.
    pub desired: u32,
    /// GPUs with a replica over healthy GPUs.
    pub allocated: f64,
    /// Memory utilisation of the GPUs in use (the plan's).
    pub memory: f64,
    /// Compute utilisation of the GPUs in use (the plan's).
    pub compute: f64,
    /// Share of the models with traffic and an SLO whose p95s meet it;
    /// `None` when no such model has traffic.
    pub within_slo: Option<f64>,
    /// Per model policy name.
    pub models: BTreeMap<String, ModelSample>,
}

/// One MIG instance of a GPU's geometry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceView {
    /// MIG profile.
    pub profile: String,
    /// First memory slot.
    pub start: u8,
    /// Memory slots it spans.
    pub slots: u8,
}

/// A replica's part on a GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartView {
    /// Model policy name.
    pub model: String,
    /// Replica number.
    pub replica: u32,
    /// MIG profile, on a MIG GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The instance's start slot, on a MIG GPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<u8>,
    /// GPUs of its tensor-parallel group, when more than one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u32>,
    /// Memory it takes on this GPU, GiB.
    pub memory_gib: f64,
    /// Share of this GPU's compute it runs with.
    pub compute_share: f64,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuView {
    /// Index on the node.
    pub index: u32,
    /// `mig`, `timeslice`, `mps`, `fractional`, `whole` or `idle`.
    pub mode: GpuMode,
    /// Healthy (an unhealthy GPU holds nothing).
    pub healthy: bool,
    /// Usable memory, GiB.
    pub memory_gib: f64,
    /// Memory slots of its MIG geometry (8 on an H100), when it has MIG.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig_slots: Option<u8>,
    /// Its MIG instances, mode `mig`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceView>,
    /// Shares, mode `timeslice` or `mps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shares: Option<u8>,
    /// Replicas on it.
    pub parts: Vec<PartView>,
    /// The training gang's worker that holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gang: Option<GangSlot>,
    /// Memory its replicas take over its usable memory.
    pub memory_used: f64,
    /// Compute its replicas run with over its compute.
    pub compute_used: f64,
}

/// One node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeView {
    /// Node name.
    pub name: String,
    /// GPU model.
    pub gpu_model: String,
    /// Its GPUs.
    pub gpus: Vec<GpuView>,
}

/// A model's SLO targets, ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SloView {
    /// p95 queue wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_wait_p95_ms: Option<f64>,
    /// p95 time to first token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_p95_ms: Option<f64>,
    /// p95 latency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_p95_ms: Option<f64>,
}

/// One model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelView {
    /// Policy name.
    pub name: String,
    /// Served name (what clients ask for).
    pub served: String,
    /// `minReplicas`.
    pub min: u32,
    /// `maxReplicas`.
    pub max: u32,
    /// Replicas wanted (the last decision).
    pub desired: u32,
    /// Replicas serving.
    pub ready: u32,
    /// Replicas the last plan could not place (the decision's count is
    /// what was placed).
    pub unplaced: u32,
    /// Spare replicas the last plan runs beside the wanted ones, in room
    /// its GPUs leave idle (`gpuscale_packer::spare`).
    pub spares: u32,
    /// Requests waiting (gateway and servers).
    pub waiting: f64,
    /// Requests on replicas.
    pub in_flight: f64,
    /// Arrivals per second (10 s).
    pub rate: f64,
    /// p95 queue wait, ms (60 s).
    pub queue_wait_p95_ms: Option<f64>,
    /// p95 time to first token, ms, from arrival at the gateway (the
    /// queue wait included, as its SLO counts it).
    pub ttft_p95_ms: Option<f64>,
    /// p95 latency, ms, from arrival at the gateway (the queue wait
    /// included, as its SLO counts it).
    pub latency_p95_ms: Option<f64>,
    /// Its targets.
    pub slo: SloView,
    /// Whether its p95s meet every target it has (`None`: no target, or
    /// no figure yet).
    pub within_slo: Option<bool>,
    /// The rule set of the last decision (`normal`, `panic`, …).
    pub mode: Option<String>,
    /// The last decision's sentence.
    pub reason: Option<String>,
    /// When the count last changed (RFC 3339).
    pub changed_at: Option<String>,
}

/// Cluster-wide figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Healthy GPUs.
    pub gpus: u32,
    /// GPUs with a replica or a gang's worker.
    pub gpus_used: u32,
    /// Memory utilisation of the GPUs in use.
    pub memory: f64,
    /// Compute utilisation of the GPUs in use.
    pub compute: f64,
    /// Dominant-resource utilisation of the GPUs in use.
    pub dominant: f64,
    /// Cost per hour of the GPUs in use.
    pub cost_per_hour: f64,
    /// Replicas the plan could not place.
    pub unplaced: u32,
}

/// What the page draws.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct View {
    /// The cluster's name.
    pub cluster: String,
    /// Seconds since the Unix epoch.
    pub t: f64,
    /// Cluster-wide figures.
    pub summary: Summary,
    /// Every node.
    pub nodes: Vec<NodeView>,
    /// Every model.
    pub models: Vec<ModelView>,
    /// The last [`HISTORY_SPAN`], oldest first.
    pub history: Vec<Sample>,
}

fn ms(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64() * 1e3)
}

/// A model's line in a `/v1/queues` document.
fn queue_of<'a>(queues: Option<&'a serde_json::Value>, m: &Model) -> Option<&'a serde_json::Value> {
    queues?.get("models")?.get(&m.served_name)
}

fn num(q: Option<&serde_json::Value>, key: &str) -> Option<f64> {
    q?.get(key)?.as_f64()
}

fn rate(q: Option<&serde_json::Value>) -> f64 {
    q.and_then(|q| q.get("arrival_rate"))
        .and_then(|r| r.get("10s"))
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(0.0)
}

/// Whether the model's p95s meet its targets: `None` without targets or
/// without any figure to judge.
fn within(m: &Model, q: Option<&serde_json::Value>) -> Option<bool> {
    let pairs = [
        (ms(m.slo.queue_wait_p95), num(q, "queue_wait_p95_ms")),
        (ms(m.slo.ttft_p95), num(q, "ttft_total_p95_ms")),
        (ms(m.slo.latency_p95), num(q, "latency_total_p95_ms")),
    ];
    let mut judged = false;
    for (target, seen) in pairs {
        if let (Some(t), Some(s)) = (target, seen) {
            judged = true;
            if s > t {
                return Some(false);
            }
        }
    }
    judged.then_some(true)
}

fn healthy_gpus(cluster: Option<&Cluster>) -> u32 {
    cluster.map_or(0, |c| {
        c.nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .filter(|g| g.health == Health::Healthy)
            .count() as u32
    })
}

/// One sample at `t` (seconds since the Unix epoch).
pub fn sample(
    t: f64,
    models: &[Model],
    cluster: Option<&Cluster>,
    plan: Option<&Plan>,
    queues: Option<&serde_json::Value>,
    decisions: &BTreeMap<String, ModelDecisions>,
) -> Sample {
    let mut per = BTreeMap::new();
    let (mut judged, mut met) = (0u32, 0u32);
    for m in models {
        let q = queue_of(queues, m);
        let d = decisions.get(&m.name).and_then(|d| d.latest.as_ref());
        let s = ModelSample {
            rate: rate(q),
            waiting: num(q, "waiting").unwrap_or(0.0) + num(q, "server_waiting").unwrap_or(0.0),
            ready: d.map_or(0, |d| d.ready),
            desired: d.map_or(0, |d| d.desired),
        };
        if s.rate > 0.0
            && let Some(ok) = within(m, q)
        {
            judged += 1;
            met += u32::from(ok);
        }
        per.insert(m.name.clone(), s);
    }
    let gpus = healthy_gpus(cluster);
    Sample {
        t,
        load: per.values().map(|s| s.rate).sum(),
        waiting: per.values().map(|s| s.waiting).sum(),
        ready: per.values().map(|s| s.ready).sum(),
        desired: per.values().map(|s| s.desired).sum(),
        allocated: match (plan, gpus) {
            (Some(p), g) if g > 0 => f64::from(p.gpus_used) / f64::from(g),
            _ => 0.0,
        },
        memory: plan.map_or(0.0, |p| p.utilization.memory),
        compute: plan.map_or(0.0, |p| p.utilization.compute),
        within_slo: (judged > 0).then(|| f64::from(met) / f64::from(judged)),
        models: per,
    }
}

/// The nodes and GPUs: the plan's picture of each GPU where it has one,
/// the cluster's (idle) otherwise.
fn nodes(cluster: &Cluster, models: &[Model], plan: Option<&Plan>) -> Vec<NodeView> {
    let planned: BTreeMap<(&str, u32), &gpuscale_packer::plan::GpuPlan> = plan
        .map(|p| {
            p.gpus
                .iter()
                .map(|g| ((g.node.as_str(), g.index), g))
                .collect()
        })
        .unwrap_or_default();
    let replica_parts = plan
        .map(|p| p.replica_parts(cluster, models))
        .unwrap_or_default();
    cluster
        .nodes
        .iter()
        .map(|n| {
            let gm = cluster.catalog.get(&n.gpu_model);
            let usable = gm.map_or(0.0, |g| g.usable_gib);
            let compute = gm.map_or(1.0, |g| g.compute).max(f64::MIN_POSITIVE);
            let mig = gm.and_then(|g| g.mig.as_ref());
            let gpus = n
                .gpus
                .iter()
                .map(|g| {
                    let key = (n.name.as_str(), g.index);
                    let gp = planned.get(&key);
                    let parts: Vec<PartView> = gp
                        .map(|gp| {
                            gp.replicas
                                .iter()
                                .map(|r| {
                                    let (memory, speed) = replica_parts
                                        .get(&(r.model.clone(), r.replica))
                                        .and_then(|ps| {
                                            ps.iter()
                                                .find(|p| p.node == n.name && p.index == g.index)
                                        })
                                        .map_or((0.0, 0.0), |p| (p.memory_gib, p.speed));
                                    PartView {
                                        model: r.model.clone(),
                                        replica: r.replica,
                                        profile: r.profile.clone(),
                                        start: r.start,
                                        group_size: r.group_size.filter(|k| *k > 1),
                                        memory_gib: memory,
                                        compute_share: speed / compute,
                                    }
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    let instances = gp
                        .map(|gp| {
                            gp.geometry
                                .iter()
                                .map(|p| InstanceView {
                                    profile: p.profile.clone(),
                                    start: p.start,
                                    slots: mig
                                        .and_then(|m| m.profile(&p.profile))
                                        .map_or(1, |x| x.memory_slots),
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    // (`+ 0.0`: an empty float sum is −0.0, which JSON shows.)
                    let memory_used: f64 = (parts.iter().map(|p| p.memory_gib).sum::<f64>() + 0.0)
                        / usable.max(f64::MIN_POSITIVE);
                    let compute_used: f64 =
                        parts.iter().map(|p| p.compute_share).sum::<f64>() + 0.0;
                    let gang = gp.and_then(|gp| gp.gang.clone());
                    GpuView {
                        index: g.index,
                        mode: gp.map_or(GpuMode::Idle, |gp| gp.mode),
                        healthy: g.health == Health::Healthy,
                        memory_gib: usable,
                        mig_slots: mig.map(|m| m.memory_slots),
                        instances,
                        shares: gp.and_then(|gp| gp.timeslice_replicas.or(gp.mps_replicas)),
                        parts,
                        memory_used: if gang.is_some() { 1.0 } else { memory_used },
                        compute_used: if gang.is_some() { 1.0 } else { compute_used },
                        gang,
                    }
                })
                .collect();
            NodeView {
                name: n.name.clone(),
                gpu_model: n.gpu_model.clone(),
                gpus,
            }
        })
        .collect()
}

/// The whole view at `t`.
pub fn view(
    t: f64,
    models: &[Model],
    cluster: Option<&Cluster>,
    live: &Live,
    decisions: &BTreeMap<String, ModelDecisions>,
) -> View {
    let plan = live.plan.as_deref();
    let queues = live.queues.as_ref();
    let models_view = models
        .iter()
        .map(|m| {
            let q = queue_of(queues, m);
            let d = decisions.get(&m.name);
            let latest = d.and_then(|d| d.latest.as_ref());
            ModelView {
                name: m.name.clone(),
                served: m.served_name.clone(),
                min: m.scaling.min_replicas,
                max: m.scaling.max_replicas,
                desired: latest.map_or(0, |d| d.desired),
                ready: latest.map_or(0, |d| d.ready),
                unplaced: plan.map_or(0, |p| {
                    p.unplaced
                        .iter()
                        .filter(|u| u.model == m.name)
                        .map(|u| u.replicas)
                        .sum()
                }),
                spares: plan.map_or(0, |p| {
                    p.models
                        .iter()
                        .filter(|x| x.name == m.name)
                        .flat_map(|x| &x.variants)
                        .map(|v| v.spares)
                        .sum()
                }),
                waiting: num(q, "waiting").unwrap_or(0.0) + num(q, "server_waiting").unwrap_or(0.0),
                in_flight: num(q, "in_flight").unwrap_or(0.0),
                rate: rate(q),
                queue_wait_p95_ms: num(q, "queue_wait_p95_ms"),
                ttft_p95_ms: num(q, "ttft_total_p95_ms"),
                latency_p95_ms: num(q, "latency_total_p95_ms"),
                slo: SloView {
                    queue_wait_p95_ms: ms(m.slo.queue_wait_p95),
                    ttft_p95_ms: ms(m.slo.ttft_p95),
                    latency_p95_ms: ms(m.slo.latency_p95),
                },
                within_slo: within(m, q),
                mode: latest.map(|d| {
                    serde_json::to_value(d.mode)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                }),
                reason: latest.map(|d| d.reason.clone()),
                changed_at: d.and_then(|d| d.history.back()).map(|h| h.at.clone()),
            }
        })
        .collect();
    let summary = Summary {
        gpus: healthy_gpus(cluster),
        gpus_used: plan.map_or(0, |p| {
            p.gpus_used + p.gpus.iter().filter(|g| g.gang.is_some()).count() as u32
        }),
        memory: plan.map_or(0.0, |p| p.utilization.memory),
        compute: plan.map_or(0.0, |p| p.utilization.compute),
        dominant: plan.map_or(0.0, |p| p.utilization.dominant),
        cost_per_hour: plan.map_or(0.0, |p| p.cost_per_hour),
        unplaced: plan.map_or(0, |p| p.unplaced.iter().map(|u| u.replicas).sum()),
    };
    View {
        cluster: cluster.map(|c| c.name.clone()).unwrap_or_default(),
        t,
        summary,
        nodes: cluster.map(|c| nodes(c, models, plan)).unwrap_or_default(),
        models: models_view,
        history: live.history.iter().cloned().collect(),
    }
}
