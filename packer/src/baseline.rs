//! The baselines every packer figure is compared with:
//!
//! - [`whole_gpu`]: what clusters do today — every replica gets whole GPUs
//!   (the fewest of its allowed tensor-parallel degrees that hold it), on the
//!   cheapest allowed GPU model with room, best-fit over nodes;
//! - [`ffd`]: first-fit decreasing, what greedy GPU-sharing schedulers do —
//!   replicas by memory, largest first, each into the first open GPU where it
//!   fits under the same rules (MIG placement rules; equal time-sliced
//!   shares), else onto a newly opened GPU of the cheapest allowed model.
//!   Unlike the ILP it ignores the one-`N`-per-node rule of time-slicing,
//!   which can only flatter it.

use std::collections::BTreeMap;

use gpuscale_policies::mig::{self, Placement};
use gpuscale_policies::{Cluster, GpuModel, Health, Model, SharingMode};

use crate::PackOptions;
use crate::plan::{BaselineFigures, Utilization};

struct Pool<'a> {
    gpu: &'a GpuModel,
    /// Free healthy GPUs per node.
    free: Vec<u32>,
    /// Nodes by free GPUs (index = free count), for best fit.
    buckets: Vec<std::collections::BTreeSet<usize>>,
}

fn pools(cluster: &Cluster) -> Vec<Pool<'_>> {
    let mut by_model: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for n in &cluster.nodes {
        let healthy = n
            .gpus
            .iter()
            .filter(|g| g.health == Health::Healthy)
            .count() as u32;
        by_model.entry(&n.gpu_model).or_default().push(healthy);
    }
    by_model
        .into_iter()
        .filter_map(|(name, free)| {
            cluster.catalog.get(name).map(|gpu| {
                let most = free.iter().copied().max().unwrap_or(0) as usize;
                let mut buckets = vec![std::collections::BTreeSet::new(); most + 1];
                for (i, &f) in free.iter().enumerate() {
                    buckets[f as usize].insert(i);
                }
                Pool { gpu, free, buckets }
            })
        })
        .collect()
}

#[derive(Default)]
struct Tally {
    gpus: u32,
    cost: f64,
    memory: f64,
    usable: f64,
    compute: f64,
    capacity: f64,
    /// Σ over GPUs in use of each one's dominant share.
    dominant: f64,
    unplaced: u32,
}

impl Tally {
    fn open(&mut self, gpu: &GpuModel, count: u32) {
        self.gpus += count;
        self.cost += gpu.price_per_hour * f64::from(count);
        self.usable += gpu.usable_gib * f64::from(count);
        self.capacity += gpu.compute * f64::from(count);
    }

    fn place(&mut self, model: &Model) {
        self.memory += model.memory_gib;
        self.compute += model.compute;
    }

    /// A replica alone on `k` whole GPUs (its share of each, k times).
    fn whole(&mut self, gpu: &GpuModel, k: u32, model: &Model) {
        self.open(gpu, k);
        self.place(model);
        let each = f64::from(k);
        self.dominant +=
            each * crate::dominant_fraction(model.memory_gib / each, model.compute / each, gpu);
    }

    fn figures(&self) -> BaselineFigures {
        BaselineFigures {
            gpus_used: self.gpus,
            cost_per_hour: crate::plan::dollars(self.cost),
            utilization: Utilization {
                memory: if self.usable > 0.0 {
                    self.memory / self.usable
                } else {
                    0.0
                },
                compute: if self.capacity > 0.0 {
                    self.compute / self.capacity
                } else {
                    0.0
                },
                dominant: if self.gpus > 0 {
                    self.dominant / f64::from(self.gpus)
                } else {
                    0.0
                },
            },
            unplaced: self.unplaced,
        }
    }
}

fn replicas<'a>(models: &'a [Model], demand: &BTreeMap<String, u32>) -> Vec<&'a Model> {
    let mut out = Vec::new();
    for m in models {
        for _ in 0..demand.get(&m.name).copied().unwrap_or(0) {
            out.push(m);
        }
    }
    out
}

/// Fewest whole GPUs of `gpu` holding one replica (an allowed degree, or
/// any degree up to 8 when only sharing modes are allowed).
fn whole_degree(model: &Model, gpu: &GpuModel) -> Option<u32> {
    let fits = |k: u32| {
        f64::from(k) * gpu.usable_gib + 1e-9 >= model.memory_gib
            && f64::from(k) * gpu.compute + 1e-9 >= model.compute
    };
    if model.sharing.contains(&SharingMode::Whole) {
        model.tensor_parallel.iter().copied().find(|&k| fits(k))
    } else {
        (1..=8).find(|&k| fits(k))
    }
}

/// Takes `k` GPUs on one node of the pool, best fit; whether it could.
fn take(pool: &mut Pool<'_>, k: u32) -> bool {
    let best = (k as usize..pool.buckets.len()).find_map(|f| pool.buckets[f].first().copied());
    match best {
        Some(i) => {
            let f = pool.free[i] as usize;
            pool.buckets[f].remove(&i);
            pool.free[i] -= k;
            pool.buckets[f - k as usize].insert(i);
            true
        }
        None => false,
    }
}

/// One replica per whole GPU (k for tensor parallelism).
pub fn whole_gpu(
    cluster: &Cluster,
    models: &[Model],
    demand: &BTreeMap<String, u32>,
) -> BaselineFigures {
    let mut pools = pools(cluster);
    let mut tally = Tally::default();
    let mut list = replicas(models, demand);
    list.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.memory_gib.total_cmp(&a.memory_gib))
    });
    for m in list {
        let mut options: Vec<(f64, usize, u32)> = pools
            .iter()
            .enumerate()
            .filter(|(_, p)| m.gpu_models.contains(&p.gpu.name))
            .filter_map(|(i, p)| {
                whole_degree(m, p.gpu).map(|k| (p.gpu.price_per_hour * f64::from(k), i, k))
            })
            .collect();
        options.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let placed = options
            .into_iter()
            .find(|&(_, i, k)| take(&mut pools[i], k));
        match placed {
            Some((_, i, k)) => tally.whole(pools[i].gpu, k, m),
            None => tally.unplaced += 1,
        }
    }
    tally.figures()
}

enum Open {
    Mig(Vec<Placement>),
    Share { n: u8, used: u8 },
}

struct OpenGpu {
    pool: usize,
    kind: Open,
    /// Memory and compute of the replicas on it.
    memory: f64,
    compute: f64,
}

/// The smallest profile that holds the replica and has a free valid start.
fn mig_fit(m: &Model, gpu: &GpuModel, placed: &[Placement]) -> Option<Placement> {
    let spec = gpu.mig.as_ref()?;
    let mut profiles: Vec<_> = spec
        .profiles
        .iter()
        .filter(|p| {
            !p.media_extensions
                && p.usable_gib + 1e-9 >= m.memory_gib
                && p.compute(gpu.compute) + 1e-9 >= m.compute
        })
        .collect();
    profiles.sort_by(|a, b| {
        a.usable_gib
            .total_cmp(&b.usable_gib)
            .then(a.compute_slices.cmp(&b.compute_slices))
    });
    for p in profiles {
        for &s in &p.starts {
            let mut with = placed.to_vec();
            with.push(Placement::new(p.name.clone(), s));
            if mig::validate(spec, &with).is_ok() {
                return Some(Placement::new(p.name.clone(), s));
            }
        }
    }
    None
}

fn share_fits(m: &Model, gpu: &GpuModel, n: u8, options: &PackOptions) -> bool {
    gpu.usable_gib * (1.0 - options.timeslice_memory_headroom) / f64::from(n) + 1e-9 >= m.memory_gib
        && gpu.compute * options.timeslice_compute_cap / f64::from(n) + 1e-9 >= m.compute
}

/// A max segment tree over open GPUs: each leaf holds the most memory a new
/// replica could still get on that GPU, so first fit is a descent, not a
/// scan over every open GPU.
struct Room {
    size: usize,
    tree: Vec<f64>,
}

impl Room {
    fn new(capacity: usize) -> Room {
        let size = capacity.max(1).next_power_of_two();
        Room {
            size,
            tree: vec![0.0; 2 * size],
        }
    }

    fn set(&mut self, i: usize, value: f64) {
        let mut k = i + self.size;
        self.tree[k] = value;
        while k > 1 {
            k /= 2;
            self.tree[k] = self.tree[2 * k].max(self.tree[2 * k + 1]);
        }
    }

    /// The first index `>= from` whose value is at least `need`.
    fn first_at_least(&self, from: usize, need: f64) -> Option<usize> {
        self.descend(1, 0, self.size, from, need)
    }

    fn descend(&self, k: usize, lo: usize, hi: usize, from: usize, need: f64) -> Option<usize> {
        if hi <= from || self.tree[k] + 1e-9 < need {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.descend(2 * k, lo, mid, from, need)
            .or_else(|| self.descend(2 * k + 1, mid, hi, from, need))
    }
}

/// The most memory a new replica could get on an open GPU.
fn room_on(o: &OpenGpu, gpu: &GpuModel, options: &PackOptions) -> f64 {
    match &o.kind {
        Open::Share { n, used } => {
            if used < n {
                gpu.usable_gib * (1.0 - options.timeslice_memory_headroom) / f64::from(*n)
            } else {
                0.0
            }
        }
        Open::Mig(placed) => {
            let Some(spec) = gpu.mig.as_ref() else {
                return 0.0;
            };
            spec.profiles
                .iter()
                .filter(|p| !p.media_extensions)
                .filter(|p| {
                    p.starts.iter().any(|&s| {
                        let mut with = placed.clone();
                        with.push(Placement::new(p.name.clone(), s));
                        mig::validate(spec, &with).is_ok()
                    })
                })
                .map(|p| p.usable_gib)
                .fold(0.0, f64::max)
        }
    }
}

/// First-fit decreasing over the same rules.
pub fn ffd(
    cluster: &Cluster,
    models: &[Model],
    demand: &BTreeMap<String, u32>,
    options: &PackOptions,
) -> BaselineFigures {
    let mut pools = pools(cluster);
    let mut tally = Tally::default();
    let mut open: Vec<OpenGpu> = Vec::new();
    let capacity: usize = pools
        .iter()
        .map(|p| p.free.iter().sum::<u32>() as usize)
        .sum();
    let mut room = Room::new(capacity);
    let mut list = replicas(models, demand);
    list.sort_by(|a, b| {
        b.memory_gib
            .total_cmp(&a.memory_gib)
            .then(a.name.cmp(&b.name))
    });
    for m in list {
        let allowed = |pool: usize| m.gpu_models.contains(&pools[pool].gpu.name);
        let shares = m.tensor_parallel.contains(&1)
            && (m.sharing.contains(&SharingMode::Mig)
                || m.sharing.contains(&SharingMode::Timeslice));
        // First fit into an open GPU with room for the replica's memory.
        let mut done = false;
        let mut from = 0;
        while shares && let Some(i) = room.first_at_least(from, m.memory_gib) {
            from = i + 1;
            let pool = open[i].pool;
            if !allowed(pool) {
                continue;
            }
            let gpu = pools[pool].gpu;
            match &mut open[i].kind {
                Open::Mig(placed) if m.sharing.contains(&SharingMode::Mig) => {
                    if let Some(p) = mig_fit(m, gpu, placed) {
                        placed.push(p);
                        done = true;
                    }
                }
                Open::Share { n, used }
                    if m.sharing.contains(&SharingMode::Timeslice)
                        && *used < *n
                        && share_fits(m, gpu, *n, options) =>
                {
                    *used += 1;
                    done = true;
                }
                _ => {}
            }
            if done {
                room.set(i, room_on(&open[i], gpu, options));
                open[i].memory += m.memory_gib;
                open[i].compute += m.compute;
                tally.place(m);
                break;
            }
        }
        if done {
            continue;
        }
        // Open a GPU of the cheapest allowed model that has one.
        let mut order: Vec<usize> = (0..pools.len()).filter(|&i| allowed(i)).collect();
        order.sort_by(|&a, &b| {
            pools[a]
                .gpu
                .price_per_hour
                .total_cmp(&pools[b].gpu.price_per_hour)
                .then(a.cmp(&b))
        });
        for i in order {
            let gpu = pools[i].gpu;
            let single = m.tensor_parallel.contains(&1);
            let mut opened = None;
            if single
                && m.sharing.contains(&SharingMode::Mig)
                && let Some(p) = mig_fit(m, gpu, &[])
            {
                if take(&mut pools[i], 1) {
                    opened = Some(Open::Mig(vec![p]));
                } else {
                    continue;
                }
            }
            if opened.is_none() && single && m.sharing.contains(&SharingMode::Timeslice) {
                let n = (2..=options.max_timeslice_replicas)
                    .rev()
                    .find(|&n| share_fits(m, gpu, n, options));
                if let Some(n) = n {
                    if take(&mut pools[i], 1) {
                        opened = Some(Open::Share { n, used: 1 });
                    } else {
                        continue;
                    }
                }
            }
            if let Some(kind) = opened {
                let o = OpenGpu {
                    pool: i,
                    kind,
                    memory: m.memory_gib,
                    compute: m.compute,
                };
                room.set(open.len(), room_on(&o, gpu, options));
                open.push(o);
                tally.open(gpu, 1);
                tally.place(m);
                done = true;
                break;
            }
            if m.sharing.contains(&SharingMode::Whole)
                && let Some(k) = whole_degree(m, gpu)
                && take(&mut pools[i], k)
            {
                tally.whole(gpu, k, m);
                done = true;
                break;
            }
        }
        if !done {
            tally.unplaced += 1;
        }
    }
    for o in &open {
        tally.dominant += crate::dominant_fraction(o.memory, o.compute, pools[o.pool].gpu);
    }
    tally.figures()
}
