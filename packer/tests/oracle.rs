//! The packer against a brute-force oracle on tiny instances (one node of at
//! most 3 GPUs, at most 6 replicas): every configuration of every GPU is
//! tried and replicas are assigned by backtracking, under the same rules.
//! The packer must place as many replicas and pay no more.
//!
//! The rules, from NVIDIA's and HAMi's documentation rather than the
//! packer's code: a MIG instance holds one replica within its profile's
//! memory and compute; the device plugin's time-slicing and MPS configs
//! give `N` equal shares per GPU, one config per node, and a node so
//! configured serves no whole GPU (`nvidia.com/gpu` is renamed); MPS does
//! not run on MIG GPUs; a HAMi node runs HAMi's device plugin instead of
//! NVIDIA's (no MIG, no time-slicing, no whole GPU there), and a GPU there
//! holds any replicas whose `nvidia.com/gpumem` (MiB, rounded up) and
//! `nvidia.com/gpucores` (percent, rounded up) sum within its memory less
//! headroom and 100 % × the cap; a container of `k` GPUs gets those limits
//! on each, so a tensor-parallel replica takes `memory / k` and `compute /
//! k` of `k` distinct GPUs of its node (the smallest degree its policy
//! allows whose share fits one GPU, and only if that share is over half a
//! GPU's memory or SMs), and, gpuscale's own rule, at most one share of a
//! tensor-parallel replica per GPU. A node's device-plugin config may
//! time-slice the instances of one MIG profile (`nvidia.com/mig-<profile>`
//! with `replicas: N`, mixed strategy): each instance of that profile on
//! the node is `N` shares of its memory less headroom and its compute ×
//! the cap, split equally; gpuscale's own rule, such a node runs only MIG
//! geometries holding that profile.

mod common;

use std::collections::BTreeMap;

use gpuscale_packer::{Mode, PackOptions, pack};
use gpuscale_policies::mig::{self, Geometry};
use gpuscale_policies::{Catalog, Cluster, GpuModel, Model, SharingMode};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Config {
    Idle,
    Whole,
    Mig(Geometry),
    Share(u8),
    Mps(u8),
    Fractional,
    /// A geometry whose instances of a profile are time-sliced into `N`.
    MigShare(Geometry, String, u8),
}

/// What a replica can occupy on a configured GPU.
#[derive(Debug, Clone, Copy)]
struct Slot {
    gpu: usize,
    memory: f64,
    compute: f64,
    mode: SharingMode,
}

fn configs(gpu: &GpuModel, options: &PackOptions) -> Vec<Config> {
    let mut out = vec![Config::Idle, Config::Whole];
    if let Some(spec) = &gpu.mig {
        out.extend(mig::maximal_geometries(spec).into_iter().map(Config::Mig));
    }
    out.extend((2..=options.max_timeslice_replicas).map(Config::Share));
    out.extend((2..=options.max_mps_replicas).map(Config::Mps));
    out.push(Config::Fractional);
    out
}

/// The configurations of a node that time-slices MIG instances of one
/// profile into `n`: idle, or a maximal geometry holding that profile.
fn mig_share_configs(gpu: &GpuModel, profile: &str, n: u8) -> Vec<Config> {
    let mut out = vec![Config::Idle];
    if let Some(spec) = &gpu.mig {
        for g in mig::maximal_geometries(spec) {
            if g.placements().iter().any(|p| p.profile == profile) {
                out.push(Config::MigShare(g, profile.to_string(), n));
            }
        }
    }
    out
}

/// Every node-wide choice: the plain configurations, then per time-sliced
/// MIG profile and `N` its own.
fn node_choices(gpu: &GpuModel, options: &PackOptions) -> Vec<Vec<Config>> {
    let mut out = vec![configs(gpu, options)];
    if let Some(spec) = &gpu.mig {
        for p in spec.profiles.iter().filter(|p| !p.media_extensions) {
            for n in 2..=options.max_timeslice_replicas {
                out.push(mig_share_configs(gpu, &p.name, n));
            }
        }
    }
    out
}

/// Whether a node's GPU configurations keep the node-level rules.
fn node_ok(cfg: &[&Config]) -> bool {
    let any = |f: &dyn Fn(&Config) -> bool| cfg.iter().any(|c| f(c));
    let shared: Vec<String> = cfg
        .iter()
        .filter_map(|c| match c {
            Config::Share(n) => Some(format!("ts{n}")),
            Config::Mps(n) => Some(format!("mps{n}")),
            _ => None,
        })
        .collect();
    let one_config = shared.windows(2).all(|w| w[0] == w[1]);
    let whole = any(&|c| matches!(c, Config::Whole));
    let mig = any(&|c| matches!(c, Config::Mig(_)));
    let mps = any(&|c| matches!(c, Config::Mps(_)));
    let hami = any(&|c| matches!(c, Config::Fractional));
    one_config
        && (shared.is_empty() || !whole)
        && (!mps || !mig)
        && (!hami || (shared.is_empty() && !whole && !mig))
}

/// Most replicas placeable (then least cost) for one node of `gpus`.
fn oracle(
    gpu: &GpuModel,
    count: usize,
    models: &[Model],
    replicas: &[usize],
    options: &PackOptions,
) -> (usize, f64) {
    let mut best: Option<(usize, f64)> = None;
    for all in node_choices(gpu, options) {
        search_node(gpu, count, models, replicas, options, &all, &mut best);
    }
    best.expect("the all-idle configuration is always tried")
}

/// Tries every multiset of `all` over the node's GPUs.
fn search_node(
    gpu: &GpuModel,
    count: usize,
    models: &[Model],
    replicas: &[usize],
    options: &PackOptions,
    all: &[Config],
    best: &mut Option<(usize, f64)>,
) {
    // Multisets of configurations (GPUs of a node are interchangeable).
    let mut choice = vec![0usize; count];
    loop {
        let cfg: Vec<&Config> = choice.iter().map(|&i| &all[i]).collect();
        if node_ok(&cfg) {
            let mut slots = Vec::new();
            let mut whole_gpus = Vec::new();
            let mut fractional = Vec::new();
            for (g, c) in cfg.iter().enumerate() {
                match c {
                    Config::Idle => {}
                    Config::Whole => whole_gpus.push(g),
                    Config::Fractional => fractional.push(Bin {
                        gpu: g,
                        mib: (gpu.usable_gib * (1.0 - options.fractional_memory_headroom) * 1024.0)
                            .floor() as i64,
                        pct: (options.fractional_compute_cap * 100.0).floor() as i64,
                        tasks: i64::from(options.fractional_max_shares),
                        grouped: false,
                    }),
                    Config::Mps(n) => {
                        for _ in 0..*n {
                            slots.push(Slot {
                                gpu: g,
                                memory: gpu.usable_gib * (1.0 - options.mps_memory_headroom)
                                    / f64::from(*n),
                                compute: gpu.compute * options.mps_compute_cap / f64::from(*n),
                                mode: SharingMode::Mps,
                            });
                        }
                    }
                    Config::Mig(geometry) => {
                        let spec = gpu.mig.as_ref().unwrap();
                        for p in geometry.placements() {
                            let prof = spec.profile(&p.profile).unwrap();
                            slots.push(Slot {
                                gpu: g,
                                memory: prof.usable_gib,
                                compute: prof.compute(gpu.compute),
                                mode: SharingMode::Mig,
                            });
                        }
                    }
                    Config::MigShare(geometry, shared, n) => {
                        let spec = gpu.mig.as_ref().unwrap();
                        for p in geometry.placements() {
                            let prof = spec.profile(&p.profile).unwrap();
                            let compute = prof.compute(gpu.compute);
                            if p.profile == *shared {
                                for _ in 0..*n {
                                    slots.push(Slot {
                                        gpu: g,
                                        memory: prof.usable_gib
                                            * (1.0 - options.timeslice_memory_headroom)
                                            / f64::from(*n),
                                        compute: compute * options.timeslice_compute_cap
                                            / f64::from(*n),
                                        mode: SharingMode::MigTimeslice,
                                    });
                                }
                            } else {
                                slots.push(Slot {
                                    gpu: g,
                                    memory: prof.usable_gib,
                                    compute,
                                    mode: SharingMode::Mig,
                                });
                            }
                        }
                    }
                    Config::Share(n) => {
                        for _ in 0..*n {
                            slots.push(Slot {
                                gpu: g,
                                memory: gpu.usable_gib * (1.0 - options.timeslice_memory_headroom)
                                    / f64::from(*n),
                                compute: gpu.compute * options.timeslice_compute_cap
                                    / f64::from(*n),
                                mode: SharingMode::Timeslice,
                            });
                        }
                    }
                }
            }
            let (placed, gpus_used) = Search {
                gpu,
                options,
                count,
                models,
                replicas,
                slots: &slots,
                whole: &whole_gpus,
                bins: fractional,
                used_slots: vec![false; slots.len()],
                used_whole: vec![false; whole_gpus.len()],
                used_gpu: vec![false; count],
            }
            .assign(0);
            let cost = gpus_used as f64 * gpu.price_per_hour;
            let improves =
                best.is_none_or(|(bp, bc)| placed > bp || (placed == bp && cost < bc - 1e-9));
            if improves {
                *best = Some((placed, cost));
            }
        }
        // Next non-decreasing choice vector.
        let mut i = count;
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            if choice[i] + 1 < all.len() {
                choice[i] += 1;
                for j in i + 1..count {
                    choice[j] = choice[i];
                }
                break;
            }
        }
    }
}

/// A fractional GPU's room left.
#[derive(Debug, Clone, Copy)]
struct Bin {
    gpu: usize,
    mib: i64,
    pct: i64,
    /// Containers it may still take: HAMi serves at most
    /// `deviceSplitCount` per GPU (HAMi's docs: "Maximum tasks assigned to
    /// a simple GPU device", default 10).
    tasks: i64,
    /// Holds a share of a tensor-parallel replica.
    grouped: bool,
}

/// Backtracking over one configuration of the node: the most replicas
/// placed, and with that the fewest GPUs hosting something.
struct Search<'a> {
    gpu: &'a GpuModel,
    options: &'a PackOptions,
    count: usize,
    models: &'a [Model],
    replicas: &'a [usize],
    slots: &'a [Slot],
    whole: &'a [usize],
    bins: Vec<Bin>,
    used_slots: Vec<bool>,
    used_whole: Vec<bool>,
    used_gpu: Vec<bool>,
}

impl Search<'_> {
    /// Places replica `r` and the rest; marks are restored on return.
    fn assign(&mut self, r: usize) -> (usize, usize) {
        if r == self.replicas.len() {
            return (0, self.used_gpu.iter().filter(|&&u| u).count());
        }
        let m = &self.models[self.replicas[r]];
        // Leave this replica out.
        let mut best = self.assign(r + 1);
        let mut consider = |cand: (usize, usize)| {
            if cand.0 + 1 > best.0 || (cand.0 + 1 == best.0 && cand.1 < best.1) {
                best = (cand.0 + 1, cand.1);
            }
        };
        let allowed = m.gpu_models.contains(&self.gpu.name);
        if allowed && m.tensor_parallel.contains(&1) {
            for s in 0..self.slots.len() {
                let slot = self.slots[s];
                // Symmetry: of a GPU's free slots alike (size, compute,
                // mode), only the first is tried; the others lead to the
                // same placements with the indices swapped. (Without it one
                // drawn instance ran for over ten minutes.)
                let alike = |o: &Slot| {
                    o.gpu == slot.gpu
                        && o.memory == slot.memory
                        && o.compute == slot.compute
                        && o.mode == slot.mode
                };
                if (0..s).any(|e| !self.used_slots[e] && alike(&self.slots[e])) {
                    continue;
                }
                if self.used_slots[s]
                    || !m.sharing.contains(&slot.mode)
                    || m.memory_gib > slot.memory + 1e-9
                    || m.compute > slot.compute + 1e-9
                {
                    continue;
                }
                self.used_slots[s] = true;
                let was = self.used_gpu[slot.gpu];
                self.used_gpu[slot.gpu] = true;
                consider(self.assign(r + 1));
                self.used_gpu[slot.gpu] = was;
                self.used_slots[s] = false;
            }
        }
        if allowed && m.sharing.contains(&SharingMode::Fractional) {
            // HAMi: a container of `k` GPUs gets `gpumem` and `gpucores` on
            // each, so a replica takes `memory / k` and `compute / k` (each
            // rounded up) of `k` distinct fractional GPUs of its node. The
            // degree is the smallest the policy allows whose share fits an
            // empty fractional GPU (gpuscale's documented rule).
            let cap_mib =
                (self.gpu.usable_gib * (1.0 - self.options.fractional_memory_headroom) * 1024.0)
                    .floor() as i64;
            let cap_pct = (self.options.fractional_compute_cap * 100.0).floor() as i64;
            let share = |k: u32| {
                let k = f64::from(k);
                (
                    (m.memory_gib * 1024.0 / k - 1e-6).ceil() as i64,
                    (m.compute / k / self.gpu.compute * 100.0 - 1e-6).ceil() as i64,
                )
            };
            let mut degrees = m.tensor_parallel.clone();
            degrees.sort_unstable();
            let degree = degrees.into_iter().find(|&k| {
                let (mib, pct) = share(k);
                k as usize <= self.count && mib <= cap_mib && pct <= cap_pct
            });
            // A tensor-parallel share must be over half a GPU's memory or
            // SMs (gpuscale's rule; smaller shares take whole GPUs).
            let large = |k: u32| {
                let (mib, pct) = share(k);
                k == 1 || 2 * mib > cap_mib || 2 * pct > cap_pct
            };
            if let Some(k) = degree.filter(|&k| large(k)) {
                let (mib, pct) = share(k);
                let n = self.bins.len();
                // Every set of `k` distinct bins (as a bit mask).
                for set in 0u32..(1 << n) {
                    if set.count_ones() != k
                        || (0..n).any(|b| {
                            set & (1 << b) != 0
                                && (self.bins[b].mib < mib
                                    || self.bins[b].pct < pct
                                    || self.bins[b].tasks < 1
                                    || (k > 1 && self.bins[b].grouped))
                        })
                    {
                        continue;
                    }
                    let chosen: Vec<usize> = (0..n).filter(|b| set & (1 << b) != 0).collect();
                    let was: Vec<bool> = chosen
                        .iter()
                        .map(|&b| self.used_gpu[self.bins[b].gpu])
                        .collect();
                    for &b in &chosen {
                        self.bins[b].mib -= mib;
                        self.bins[b].pct -= pct;
                        self.bins[b].tasks -= 1;
                        self.bins[b].grouped |= k > 1;
                        self.used_gpu[self.bins[b].gpu] = true;
                    }
                    consider(self.assign(r + 1));
                    for (&b, &w) in chosen.iter().zip(&was) {
                        self.bins[b].mib += mib;
                        self.bins[b].pct += pct;
                        self.bins[b].tasks += 1;
                        if k > 1 {
                            self.bins[b].grouped = false;
                        }
                        self.used_gpu[self.bins[b].gpu] = w;
                    }
                }
            }
        }
        if allowed && m.sharing.contains(&SharingMode::Whole) {
            for &k in &m.tensor_parallel {
                let fits = f64::from(k) * self.gpu.usable_gib + 1e-9 >= m.memory_gib
                    && f64::from(k) * self.gpu.compute + 1e-9 >= m.compute;
                let free: Vec<usize> = (0..self.whole.len())
                    .filter(|&i| !self.used_whole[i])
                    .collect();
                if !fits || free.len() < k as usize {
                    continue;
                }
                let take = &free[..k as usize];
                self.mark_whole(take, true);
                consider(self.assign(r + 1));
                self.mark_whole(take, false);
            }
        }
        best
    }

    fn mark_whole(&mut self, take: &[usize], on: bool) {
        for &i in take {
            self.used_whole[i] = on;
            self.used_gpu[self.whole[i]] = on;
        }
    }
}

fn arb_instance() -> impl Strategy<Value = (String, usize, Vec<Model>, Vec<u32>)> {
    let gpu = prop::sample::select(vec!["A30-24GB", "H100-80GB", "L4"]);
    let count = 1usize..=3;
    let model = (
        prop::sample::select(vec![
            1.5, 2.5, 4.0, 5.0, 7.0, 9.0, 11.0, 18.0, 30.0, 45.0, 100.0,
        ]),
        prop::sample::select(vec![0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.3]),
        prop::sample::subsequence(
            vec![
                SharingMode::Mig,
                SharingMode::Timeslice,
                SharingMode::Whole,
                SharingMode::Mps,
                SharingMode::Fractional,
                SharingMode::MigTimeslice,
            ],
            1..=6,
        ),
        prop::sample::select(vec![vec![1u32], vec![1, 2], vec![2]]),
    );
    (
        gpu,
        count,
        prop::collection::vec(model, 1..=3),
        prop::collection::vec(0u32..=3, 3),
    )
        .prop_map(|(gpu, count, specs, wants)| {
            let models: Vec<Model> = specs
                .into_iter()
                .enumerate()
                .filter_map(|(i, (mem, compute, sharing, tp))| {
                    let mut sharing = sharing;
                    if tp.iter().any(|&k| k > 1) && !sharing.contains(&SharingMode::Whole) {
                        sharing.push(SharingMode::Whole);
                    }
                    // Only models some option of the catalogue can hold.
                    common::try_model(&format!("m{i}"), mem, compute, &sharing, &tp, &[])
                })
                .collect();
            let wants = wants[..models.len()].to_vec();
            (gpu.to_string(), count, models, wants)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn packer_matches_the_brute_force_optimum((gpu, count, models, wants) in arb_instance()) {
        let total: u32 = wants.iter().sum();
        prop_assume!(total <= 6 && !models.is_empty());
        let cluster: Cluster = common::cluster_allowing(
            &[("n", &gpu, count as u32)],
            &[SharingMode::Mig, SharingMode::Timeslice, SharingMode::Mps, SharingMode::Fractional, SharingMode::MigTimeslice],
        );
        let options = PackOptions { mip_rel_gap: 0.0, ..PackOptions::default() };
        let demand: BTreeMap<String, u32> = models.iter().zip(&wants).map(|(m, &w)| (m.name.clone(), w)).collect();
        let plan = pack(&cluster, &models, &demand, &options).unwrap();
        let replicas: Vec<usize> = wants.iter().enumerate().flat_map(|(m, &w)| std::iter::repeat_n(m, w as usize)).collect();
        let catalog = Catalog::builtin();
        let (placed, cost) = oracle(catalog.get(&gpu).unwrap(), count, &models, &replicas, &options);
        let plan_placed: u32 = plan.models.iter().map(|m| m.placed).sum();
        prop_assert_eq!(plan_placed as usize, placed, "placed: {:#?}", plan);
        prop_assert!((plan.cost_per_hour - cost).abs() < 1e-6, "cost {} vs oracle {}: {:#?}", plan.cost_per_hour, cost, plan);
        for g in &plan.gpus {
            if g.mode == Mode::Idle { prop_assert!(g.replicas.is_empty()); }
        }
    }
}
