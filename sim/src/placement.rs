//! Where the simulated replicas run: the packer's plan (`pack_from`, as
//! the controller calls it, re-planned from the last plan) or one replica
//! per whole GPU (first fit, what most clusters run today). Either way a
//! replica exists only on GPUs of the cluster, and runs at the speed of
//! its share: the compute it gets, in H100-80GB units, summed over its
//! GPUs (a 3g MIG slice of an H100 3/7; a GPU time-sliced or split by MPS
//! `N` ways `1/N` of it, the worst case when every share is busy; a HAMi
//! share its `gpucores` percentage). With spares on, the packer's plan
//! also runs spare replicas in the room its GPUs in use leave idle
//! ([`gpuscale_packer::spare`]), as the controller does; the next re-plan
//! starts from the plan without them.

use std::collections::BTreeMap;

use gpuscale_packer::plan::Plan;
use gpuscale_packer::{PackOptions, pack_from};
use gpuscale_policies::inventory::Health;
use gpuscale_policies::{Cluster, Model};

/// One replica's place.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    /// Identity across re-plans: the same key is the same running replica
    /// (a replica whose key changes is a new one, with a cold start). It
    /// holds the GPUs, the sharing mode and, for MIG, the GPU's geometry
    /// (a GPU reconfigured is wiped); not the number of time-sliced or MPS
    /// co-tenants, which changes the replica's speed, not the replica.
    pub key: String,
    /// Its GPUs as (node, index).
    pub gpus: Vec<(String, u32)>,
    /// Compute it runs with, H100-80GB units.
    pub speed: f64,
    /// GPU memory it takes on each of its GPUs, GiB.
    pub memory_per_gpu: f64,
}

/// Replicas wanted → slots per model.
pub trait Placer {
    /// Places `desired` (replicas per model policy) at `now` (seconds). A
    /// model may get fewer slots than it asked for when the cluster is
    /// full.
    fn place(&mut self, desired: &BTreeMap<String, u32>, now: f64) -> BTreeMap<String, Vec<Slot>>;
    /// The packer's last plan, when there is one.
    fn plan(&self) -> Option<&Plan> {
        None
    }
    /// Usable memory (GiB), compute (H100 units) and price per hour of a
    /// GPU of the cluster.
    fn gpu(&self, node: &str) -> (f64, f64, f64);
}

fn gpu_figures(cluster: &Cluster) -> BTreeMap<String, (f64, f64, f64)> {
    cluster
        .nodes
        .iter()
        .filter_map(|n| {
            let g = cluster.catalog.get(&n.gpu_model)?;
            Some((n.name.clone(), (g.usable_gib, g.compute, g.price_per_hour)))
        })
        .collect()
}

/// Keys made unique: the `k`-th identical key gets `#k`.
fn keyed(raw: Vec<(String, Slot)>) -> BTreeMap<String, Vec<Slot>> {
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let mut out: BTreeMap<String, Vec<Slot>> = BTreeMap::new();
    for (model, mut slot) in raw {
        let n = seen.entry(slot.key.clone()).or_default();
        slot.key = format!("{}#{n}", slot.key);
        *n += 1;
        out.entry(model).or_default().push(slot);
    }
    out
}

/// A way to run a model on whole GPUs.
#[derive(Debug, Clone)]
struct Shape {
    gpu_model: String,
    degree: u32,
    price: f64,
    compute: f64,
    memory_per_gpu: f64,
}

/// The packer, re-planning from its last plan.
pub struct PackerPlacer {
    cluster: Cluster,
    models: Vec<Model>,
    options: PackOptions,
    plan: Option<Plan>,
    /// The last plan with its spares ([`gpuscale_packer::spare`]), when
    /// they are on.
    filled: Option<Plan>,
    spares: bool,
    figures: BTreeMap<String, (f64, f64, f64)>,
    last: BTreeMap<String, Vec<Slot>>,
    /// Solves that failed (the previous placement stays).
    pub failures: u32,
    /// Milliseconds spent packing.
    pub solve_ms: f64,
    /// Seconds between re-plans that may move running replicas.
    consolidate_every: f64,
    last_consolidation: Option<f64>,
}

impl PackerPlacer {
    /// A packer over `cluster` as it is now, which moves running replicas
    /// at most once per `consolidate_every` (the controller's rule).
    pub fn new(
        cluster: Cluster,
        models: Vec<Model>,
        options: PackOptions,
        consolidate_every: std::time::Duration,
    ) -> Self {
        let figures = gpu_figures(&cluster);
        PackerPlacer {
            cluster,
            models,
            options,
            plan: None,
            filled: None,
            spares: false,
            figures,
            last: BTreeMap::new(),
            failures: 0,
            solve_ms: 0.0,
            consolidate_every: consolidate_every.as_secs_f64(),
            last_consolidation: None,
        }
    }

    /// With spare replicas in the room the plan's GPUs leave idle
    /// ([`gpuscale_packer::spare`]), or without.
    pub fn with_spares(mut self, spares: bool) -> Self {
        self.spares = spares;
        self
    }

    fn slots(&self, plan: &Plan) -> BTreeMap<String, Vec<Slot>> {
        let raw = plan
            .replica_parts(&self.cluster, &self.models)
            .into_iter()
            .map(|((model, _), on)| {
                let key = format!(
                    "{model}@{}",
                    on.iter()
                        .map(|p| format!("{}/{}/{}", p.node, p.index, p.what))
                        .collect::<Vec<_>>()
                        .join("+")
                );
                let slot = Slot {
                    key,
                    gpus: on.iter().map(|p| (p.node.clone(), p.index)).collect(),
                    speed: on.iter().map(|p| p.speed).sum(),
                    memory_per_gpu: on.first().map_or(0.0, |p| p.memory_gib),
                };
                (model, slot)
            })
            .collect();
        keyed(raw)
    }
}

impl Placer for PackerPlacer {
    fn place(&mut self, desired: &BTreeMap<String, u32>, now: f64) -> BTreeMap<String, Vec<Slot>> {
        let keep = self
            .last_consolidation
            .is_some_and(|t| now - t < self.consolidate_every);
        if !keep {
            self.last_consolidation = Some(now);
        }
        let options = PackOptions {
            keep_running: keep,
            ..self.options.clone()
        };
        let current = match &self.plan {
            Some(p) => p.apply_to(&self.cluster),
            None => self.cluster.clone(),
        };
        let basis = self.plan.as_ref().and_then(|p| p.basis.as_ref());
        match pack_from(&current, &self.models, desired, &options, basis) {
            Ok(plan) => {
                tracing::debug!(
                    t = now,
                    may_move = !keep,
                    replicas = desired.values().sum::<u32>(),
                    gpus = plan.gpus_used,
                    lp_bound_gpus = plan.lp_bound_gpus,
                    memory = plan.utilization.memory,
                    moves = plan.moves,
                    reconfigured = plan.reconfigured_gpus,
                    ms = plan.solve_ms,
                    "re-plan"
                );
                self.solve_ms += plan.solve_ms;
                if self.spares {
                    let filled = gpuscale_packer::spare::fill(
                        &plan,
                        &self.cluster,
                        &self.models,
                        &options,
                        self.filled.as_ref(),
                    );
                    self.last = self.slots(&filled);
                    self.filled = Some(filled);
                } else {
                    self.last = self.slots(&plan);
                }
                self.plan = Some(plan);
            }
            Err(_) => self.failures += 1,
        }
        self.last.clone()
    }

    fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref()
    }

    fn gpu(&self, node: &str) -> (f64, f64, f64) {
        self.figures.get(node).copied().unwrap_or((1.0, 1.0, 0.0))
    }
}

/// One replica per whole GPU (or per tensor-parallel group on one node):
/// for each model the cheapest allowed GPU model and smallest degree that
/// hold it, first fit over the nodes; the others when those are full.
pub struct WholeGpuPlacer {
    figures: BTreeMap<String, (f64, f64, f64)>,
    /// Free healthy GPU indices per node, and the node's GPU model.
    free: Vec<(String, String, Vec<u32>)>,
    /// Per model, its options: (GPU model, degree), cheapest first.
    shapes: BTreeMap<String, Vec<Shape>>,
    held: BTreeMap<String, Vec<Slot>>,
    serial: u64,
}

impl WholeGpuPlacer {
    /// Over `cluster`, all of it free.
    pub fn new(cluster: &Cluster, models: &[Model]) -> Self {
        let free = cluster
            .nodes
            .iter()
            .map(|n| {
                let gpus = n
                    .gpus
                    .iter()
                    .filter(|g| g.health == Health::Healthy)
                    .map(|g| g.index)
                    .collect();
                (n.name.clone(), n.gpu_model.clone(), gpus)
            })
            .collect();
        let mut shapes = BTreeMap::new();
        for m in models {
            let mut options: Vec<Shape> = Vec::new();
            // Whole GPUs are what everyone has: used even where the
            // policy lists only sharing modes, so every model can run.
            for gm in &m.gpu_models {
                let Some(g) = cluster.catalog.get(gm) else {
                    continue;
                };
                let most = cluster.max_gpus_per_node(gm);
                if let Some(&k) = m.tensor_parallel.iter().find(|&&k| {
                    k <= most
                        && f64::from(k) * g.usable_gib + 1e-9 >= m.memory_gib
                        && f64::from(k) * g.compute + 1e-9 >= m.compute
                }) {
                    options.push(Shape {
                        gpu_model: gm.clone(),
                        degree: k,
                        price: f64::from(k) * g.price_per_hour,
                        compute: g.compute,
                        memory_per_gpu: m.memory_gib / f64::from(k),
                    });
                }
            }
            options.sort_by(|a, b| a.price.total_cmp(&b.price).then(a.degree.cmp(&b.degree)));
            shapes.insert(m.name.clone(), options);
        }
        WholeGpuPlacer {
            figures: gpu_figures(cluster),
            free,
            shapes,
            held: BTreeMap::new(),
            serial: 0,
        }
    }
}

impl WholeGpuPlacer {
    /// The speed of a model's first choice (GPU model and degree), if any
    /// GPU of the cluster holds it.
    pub fn speed_of(&self, model: &str) -> Option<f64> {
        let s = self.shapes.get(model)?.first()?;
        Some(s.compute * f64::from(s.degree))
    }
}

impl Placer for WholeGpuPlacer {
    fn place(&mut self, desired: &BTreeMap<String, u32>, _now: f64) -> BTreeMap<String, Vec<Slot>> {
        // Releases first, so a model shrinking frees GPUs for one growing.
        for (model, held) in &mut self.held {
            let want = desired.get(model).copied().unwrap_or(0) as usize;
            while held.len() > want {
                let s = held.pop().expect("longer than want");
                for (node, i) in s.gpus {
                    if let Some(n) = self.free.iter_mut().find(|n| n.0 == node) {
                        n.2.push(i);
                        n.2.sort_unstable();
                    }
                }
            }
        }
        for (model, &want) in desired {
            let shapes = self.shapes.get(model).cloned().unwrap_or_default();
            let held = self.held.entry(model.clone()).or_default();
            'more: while held.len() < want as usize {
                for shape in &shapes {
                    let k = shape.degree as usize;
                    if let Some(n) = self
                        .free
                        .iter_mut()
                        .find(|n| n.1 == shape.gpu_model && n.2.len() >= k)
                    {
                        let gpus: Vec<(String, u32)> =
                            n.2.drain(..k).map(|i| (n.0.clone(), i)).collect();
                        self.serial += 1;
                        held.push(Slot {
                            key: format!("{model}@whole#{}", self.serial),
                            gpus,
                            speed: shape.compute * f64::from(shape.degree),
                            memory_per_gpu: shape.memory_per_gpu,
                        });
                        continue 'more;
                    }
                }
                break;
            }
        }
        self.held.clone()
    }

    fn gpu(&self, node: &str) -> (f64, f64, f64) {
        self.figures.get(node).copied().unwrap_or((1.0, 1.0, 0.0))
    }
}
