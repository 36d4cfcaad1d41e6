//! Aggregation: GPUs into interchangeable classes, the slot types each class
//! offers, the GPU patterns (configurations) that provide those slots, and
//! the current state counted per class.
//!
//! A **class** is a set of nodes with the same GPU model and the same number
//! of healthy GPUs: for inference placement their GPUs are interchangeable,
//! so the ILP decides counts per class and [`crate::decode`] picks concrete
//! GPUs. The ILP's size grows with classes × patterns × models, never with
//! the number of GPUs.
//!
//! **Slot types** of a class: each MIG profile of its GPU model (plain ones;
//! a `+me` instance hosts what its plain twin hosts), and `Share(N)`: one of
//! `N` time-sliced shares of a GPU, which may hold a replica of at most
//! `usable × (1 − headroom) / N` GiB and `compute × cap / N` compute. Equal
//! shares are what make time-slicing safe: the device plugin hands any
//! `nvidia.com/gpu.shared` of a node to any pod, so only a per-share bound
//! keeps the sum of memory on a GPU under its usable memory whatever the
//! assignment. One `N` per node (the device plugin's `replicas`), and no
//! whole GPU on a node that time-slices (the plugin renames every
//! `nvidia.com/gpu` of such a node to `nvidia.com/gpu.shared`). `Mps(N)`
//! is its twin under the device plugin's `sharing.mps`: `N` equal
//! partitions whose memory and compute limits MPS enforces, so it is safe
//! for compute-heavy replicas; a node has one config (time-slicing or MPS),
//! and MPS does not run on MIG GPUs.
//!
//! **Time-sliced MIG slices**: `MigShare(profile, N)` is one of `N` shares
//! of a MIG instance of that profile, under the device plugin's
//! `sharing.timeSlicing` on `nvidia.com/mig-<profile>` (mixed strategy).
//! The same per-share bound applies, within the instance: `usable ×
//! (1 − headroom) / N` GiB and the instance's compute `× cap / N`. The
//! config is per node and applies to every instance of that profile there,
//! so a node time-slicing `(profile, N)` runs only geometries with that
//! profile time-sliced that way (the pattern kind [`PatternKind::MigShare`],
//! one per geometry with the profile): one device-plugin config per node,
//! time-slicing one resource (whole GPUs, or one MIG profile).
//!
//! **Fractional GPUs** (HAMi): any mix of replicas shares such a GPU while
//! their memory (MiB, rounded up, as `nvidia.com/gpumem`) stays within
//! `usable × (1 − headroom)` and their SM percentages (`nvidia.com/gpucores`,
//! rounded up) within the compute cap ([`Fractional`]). Each model that may
//! run there gets a slot type of its own, `Fractional(model)`: one share of
//! such a GPU sized for that model (a tensor-parallel replica takes one on
//! each of `k` GPUs of its node, [`SlotType::parts`]), and a fractional
//! pattern is a mix of those shares that fits one GPU. Mixes are too many
//! to list, so [`crate::ilp::columns`] generates the useful ones (column
//! generation); here come only the mixes running now.
//!
//! **Patterns**: every maximal MIG geometry of the GPU model (38 on an
//! 8-slot GPU, derived from the placement rules), every MIG geometry in use
//! now (so keeping it is an option), `Share(N)` for `N` in `2..=max_share`,
//! the MPS twins, and the fractional mixes running now. Whole GPUs are not
//! patterns: tensor-parallel groups of `k` whole GPUs are counted per model.

use std::collections::BTreeMap;

use gpuscale_policies::mig::{self, Geometry};
use gpuscale_policies::{Cluster, GpuMode, Health, MigSpec, Model, SharingMode};

use crate::PackOptions;

/// What a slot is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SlotKind {
    /// A MIG instance of this (plain) profile.
    Mig(String),
    /// One of `N` time-sliced shares of a GPU.
    Share(u8),
    /// One of `N` MPS partitions of a GPU.
    Mps(u8),
    /// A share of a fractional (HAMi) GPU sized for one replica of this
    /// model (its policy name), or for one of the `k` shares of a
    /// tensor-parallel one.
    Fractional(String),
    /// One of `N` time-sliced shares of a MIG instance of this (plain)
    /// profile.
    MigShare(String, u8),
}

/// One slot type of a class, with what a slot of it offers.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotType {
    /// What it is.
    pub kind: SlotKind,
    /// Memory a replica in it may use, GiB.
    pub memory_gib: f64,
    /// Compute it offers (1.0 = one H100-80GB).
    pub compute: f64,
    /// Slots one replica takes: `k` for a tensor-parallel replica on
    /// fractional GPUs (one on each of `k` GPUs of its node), else 1.
    pub parts: u32,
    /// On a fractional GPU: the MiB and SM percent one slot takes
    /// (HAMi's `gpumem` and `gpucores`).
    pub need: Option<(u32, u32)>,
}

/// A GPU configuration the ILP can choose for GPUs of a class.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    /// What the GPU is configured as.
    pub kind: PatternKind,
    /// Slots it provides: (slot type index, count).
    pub slots: Vec<(usize, u32)>,
}

/// The configuration of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatternKind {
    /// A MIG geometry (a canonical placement of its profile multiset).
    Mig(Geometry),
    /// Time-sliced into `N` shares.
    Share(u8),
    /// Split into `N` MPS partitions.
    Mps(u8),
    /// A fractional (HAMi) GPU holding the mix of shares in the pattern's
    /// slots.
    Fractional,
    /// A MIG geometry (with `profile` in it) on a node whose device-plugin
    /// config time-slices every instance of `profile` into `n` shares.
    MigShare {
        /// The geometry.
        geometry: Geometry,
        /// The time-sliced profile (plain).
        profile: String,
        /// Shares per instance.
        n: u8,
    },
}

/// A node's device-plugin config, as a pattern needs it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeConfig {
    /// Whole GPUs time-sliced into `N`.
    Share(u8),
    /// Whole GPUs in `N` MPS partitions.
    Mps(u8),
    /// Instances of a MIG profile time-sliced into `N`.
    MigShare(String, u8),
}

impl PatternKind {
    /// The device-plugin config its node needs, if any.
    pub fn config(&self) -> Option<NodeConfig> {
        match self {
            PatternKind::Share(n) => Some(NodeConfig::Share(*n)),
            PatternKind::Mps(n) => Some(NodeConfig::Mps(*n)),
            PatternKind::MigShare { profile, n, .. } => {
                Some(NodeConfig::MigShare(profile.clone(), *n))
            }
            PatternKind::Mig(_) | PatternKind::Fractional => None,
        }
    }

    /// Whether it needs its node's device-plugin config.
    pub fn node_config(&self) -> bool {
        self.config().is_some()
    }

    /// The MIG geometry, for a MIG pattern (time-sliced or not).
    pub fn geometry(&self) -> Option<&Geometry> {
        match self {
            PatternKind::Mig(g) | PatternKind::MigShare { geometry: g, .. } => Some(g),
            _ => None,
        }
    }
}

/// What a fractional (HAMi) GPU of a class offers: memory in MiB and SM
/// percent, both after headroom and cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fractional {
    /// MiB replicas may take together: `⌊usable × (1 − headroom) × 1024⌋`.
    pub memory_mib: u32,
    /// SM percent replicas may take together: `⌊cap × 100⌋`.
    pub cores: u32,
    /// Replicas (containers) it may run: HAMi's `deviceSplitCount`.
    pub shares: u32,
}

/// What one replica asks of each of the `gpus` fractional GPUs it runs on
/// (`gpus` > 1: a tensor-parallel replica, one equal share of each GPU,
/// all on one node): `nvidia.com/gpumem` (MiB, rounded up) and
/// `nvidia.com/gpucores` (percent of this GPU's SMs, rounded up), which
/// HAMi applies to every GPU of the container.
pub fn fractional_need(model: &Model, gpu_compute: f64, gpus: u32) -> (u32, u32) {
    let k = f64::from(gpus.max(1));
    let mib = (model.memory_gib * 1024.0 / k - 1e-6).ceil().max(1.0) as u32;
    let cores = (model.compute / k / gpu_compute * 100.0 - 1e-6)
        .ceil()
        .max(1.0) as u32;
    (mib, cores)
}

/// How a replica of a model runs on a class's fractional GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FractionalPart {
    /// GPUs of one node it takes a share of (its tensor-parallel degree).
    pub gpus: u32,
    /// MiB of each.
    pub mib: u32,
    /// SM percent of each.
    pub pct: u32,
}

impl FractionalPart {
    /// `(mib, pct)` of one share.
    pub fn need(&self) -> (u32, u32) {
        (self.mib, self.pct)
    }
}

/// Nodes with the same GPU model and number of healthy GPUs.
#[derive(Debug, Clone)]
pub struct Class {
    /// GPU model name.
    pub gpu_model: String,
    /// Price per GPU-hour.
    pub price: f64,
    /// Usable memory of a whole GPU.
    pub usable_gib: f64,
    /// Relative compute of a whole GPU.
    pub compute: f64,
    /// MIG capability.
    pub mig: Option<MigSpec>,
    /// Healthy GPUs per node.
    pub gpus_per_node: u32,
    /// Sharing mechanisms its nodes allow.
    pub allows: Vec<SharingMode>,
    /// What a fractional GPU offers, when the nodes run HAMi.
    pub fractional: Option<Fractional>,
    /// The nodes (indices into `Cluster::nodes`).
    pub nodes: Vec<usize>,
    /// Slot types.
    pub slot_types: Vec<SlotType>,
    /// Patterns.
    pub patterns: Vec<Pattern>,
    /// GPUs in each pattern now (parallel to `patterns`).
    pub current_patterns: Vec<u32>,
    /// Replicas per (model index, slot type) now.
    pub current_slots: BTreeMap<(usize, usize), u32>,
    /// Tensor-parallel groups per (model index, k) now.
    pub current_whole: BTreeMap<(usize, u32), u32>,
}

impl Class {
    /// Healthy GPUs in the class.
    pub fn healthy_gpus(&self) -> u32 {
        self.gpus_per_node * self.nodes.len() as u32
    }

    /// Index of the slot type of a MIG profile (`+me` maps to its plain twin).
    pub fn mig_slot(&self, profile: &str) -> Option<usize> {
        let plain = profile.trim_end_matches("+me");
        self.slot_types
            .iter()
            .position(|t| t.kind == SlotKind::Mig(plain.to_string()))
    }

    /// Index of the slot type of a replica on an instance of `profile`
    /// (`+me` maps to its plain twin) when the node time-slices `shared`.
    pub fn instance_slot(&self, profile: &str, shared: Option<(&str, u8)>) -> Option<usize> {
        let plain = profile.trim_end_matches("+me");
        match shared {
            Some((p, n)) if p == plain => self.mig_share_slot(p, n),
            _ => self.mig_slot(plain),
        }
    }

    /// Index of the `MigShare(profile, n)` slot type.
    pub fn mig_share_slot(&self, profile: &str, n: u8) -> Option<usize> {
        self.slot_types
            .iter()
            .position(|t| matches!(&t.kind, SlotKind::MigShare(p, k) if p == profile && *k == n))
    }

    /// Index of the `Share(n)` slot type.
    pub fn share_slot(&self, n: u8) -> Option<usize> {
        self.slot_types
            .iter()
            .position(|t| t.kind == SlotKind::Share(n))
    }

    /// Index of a model's fractional slot type.
    pub fn fractional_slot(&self, model: &str) -> Option<usize> {
        self.slot_types
            .iter()
            .position(|t| matches!(&t.kind, SlotKind::Fractional(m) if m == model))
    }

    /// Whether a mix of slots (type, count) fits one fractional GPU.
    pub fn fractional_fits(&self, slots: &[(usize, u32)]) -> bool {
        let Some(cap) = self.fractional else {
            return false;
        };
        let (mut mib, mut pct) = (0u64, 0u64);
        for &(t, k) in slots {
            let Some((m, p)) = self.slot_types[t].need else {
                return false;
            };
            mib += u64::from(m) * u64::from(k);
            pct += u64::from(p) * u64::from(k);
        }
        let tensor_parallel = slots
            .iter()
            .filter(|&&(t, k)| k > 0 && self.slot_types[t].parts > 1)
            .map(|&(_, k)| k)
            .sum::<u32>();
        let shares: u32 = slots.iter().map(|&(_, k)| k).sum();
        mib <= u64::from(cap.memory_mib)
            && pct <= u64::from(cap.cores)
            && shares <= cap.shares
            && tensor_parallel <= 1
    }

    /// The fractional pattern with exactly these slots, if there is one.
    pub fn fractional_pattern(&self, slots: &[(usize, u32)]) -> Option<usize> {
        self.patterns
            .iter()
            .position(|p| p.kind == PatternKind::Fractional && p.slots == slots)
    }

    /// Adds a fractional pattern (slots sorted by type, no zero counts)
    /// unless it is there already; its index.
    pub fn add_fractional_pattern(&mut self, slots: Vec<(usize, u32)>) -> usize {
        if let Some(p) = self.fractional_pattern(&slots) {
            return p;
        }
        self.patterns.push(Pattern {
            kind: PatternKind::Fractional,
            slots,
        });
        self.current_patterns.push(0);
        self.patterns.len() - 1
    }

    /// The pattern a MIG geometry counts as (same profile multiset) on a
    /// node that time-slices `shared` (a profile and `N`) or nothing.
    pub fn mig_pattern_of(&self, geometry: &Geometry, shared: Option<(&str, u8)>) -> Option<usize> {
        let want = plain_counts(geometry);
        let shared = shared.filter(|(p, _)| want.contains_key(*p));
        self.patterns.iter().position(|p| match (&p.kind, shared) {
            (PatternKind::Mig(g), None) => plain_counts(g) == want,
            (
                PatternKind::MigShare {
                    geometry: g,
                    profile,
                    n,
                },
                Some((sp, sn)),
            ) => profile == sp && *n == sn && plain_counts(g) == want,
            _ => false,
        })
    }
}

/// Profile counts with `+me` folded into the plain profile.
pub fn plain_counts(geometry: &Geometry) -> BTreeMap<String, u32> {
    let mut counts = BTreeMap::new();
    for p in geometry.placements() {
        *counts
            .entry(p.profile.trim_end_matches("+me").to_string())
            .or_insert(0) += 1;
    }
    counts
}

/// Whether a model may use a slot type of a class.
pub fn fits_slot(model: &Model, class: &Class, t: &SlotType) -> bool {
    let mode = match &t.kind {
        SlotKind::Mig(_) => SharingMode::Mig,
        SlotKind::Share(_) => SharingMode::Timeslice,
        SlotKind::Mps(_) => SharingMode::Mps,
        SlotKind::MigShare(..) => SharingMode::MigTimeslice,
        // Made for this model alone (only where it fits, tensor-parallel
        // or not).
        SlotKind::Fractional(name) => return *name == model.name,
    };
    model.sharing.contains(&mode)
        && model.tensor_parallel.contains(&1)
        && model.gpu_models.contains(&class.gpu_model)
        && model.memory_gib <= t.memory_gib + 1e-9
        && model.compute <= t.compute + 1e-9
}

/// How a model runs on fractional GPUs of a class, if it may: the smallest
/// tensor-parallel degree it allows whose share of each GPU fits one
/// fractional GPU, on one node (the fewest GPUs, so the least
/// tensor-parallel traffic, as an operator sizing a group by hand would).
/// A share of a tensor-parallel replica must be more than half a GPU's
/// memory or SMs: then no two shares of one replica could ever sit on one
/// GPU, so its `k` shares need `k` distinct GPUs by capacity alone. (Smaller shares would fit fewer GPUs than the policy's
/// degree: such a replica takes whole GPUs.) A fractional GPU holds at most
/// one share of a tensor-parallel replica ([`Class::fractional_fits`]), so
/// a node's shares of each group come in whole groups.
pub fn fractional_part(model: &Model, class: &Class) -> Option<FractionalPart> {
    let f = class.fractional?;
    if !model.sharing.contains(&SharingMode::Fractional)
        || !model.gpu_models.contains(&class.gpu_model)
    {
        return None;
    }
    let mut degrees = model.tensor_parallel.clone();
    degrees.sort_unstable();
    degrees
        .into_iter()
        .filter(|&k| k >= 1 && k <= class.gpus_per_node)
        .find(|&k| {
            let (mib, pct) = fractional_need(model, class.compute, k);
            mib <= f.memory_mib && pct <= f.cores
        })
        .and_then(|k| {
            let (mib, pct) = fractional_need(model, class.compute, k);
            let large = 2 * mib > f.memory_mib || 2 * pct > f.cores;
            (k == 1 || large).then_some(FractionalPart { gpus: k, mib, pct })
        })
}

/// Whether a model may run on fractional GPUs of a class.
pub fn fits_fractional(model: &Model, class: &Class) -> bool {
    fractional_part(model, class).is_some()
}

/// Tensor-parallel degrees a model may use on a class.
pub fn whole_degrees(model: &Model, class: &Class) -> Vec<u32> {
    if !model.sharing.contains(&SharingMode::Whole) || !model.gpu_models.contains(&class.gpu_model)
    {
        return Vec::new();
    }
    model
        .tensor_parallel
        .iter()
        .copied()
        .filter(|&k| {
            k <= class.gpus_per_node
                && f64::from(k) * class.usable_gib + 1e-9 >= model.memory_gib
                && f64::from(k) * class.compute + 1e-9 >= model.compute
        })
        .collect()
}

/// Groups the cluster's nodes into classes and builds slot types, patterns
/// and the current state of each.
pub fn build(cluster: &Cluster, models: &[Model], options: &PackOptions) -> Vec<Class> {
    // (GPU model, healthy GPUs per node, sharing allowed, HAMi's
    // containers per GPU where fractional is allowed, else 0).
    type Key = (String, u32, Vec<SharingMode>, u32);
    let mut groups: BTreeMap<Key, Vec<usize>> = BTreeMap::new();
    for (i, n) in cluster.nodes.iter().enumerate() {
        let healthy = n
            .gpus
            .iter()
            .filter(|g| g.health == Health::Healthy)
            .count() as u32;
        if healthy > 0 && cluster.catalog.get(&n.gpu_model).is_some() {
            let mut allows: Vec<SharingMode> = n
                .sharing
                .iter()
                .copied()
                .filter(|&m| m != SharingMode::Whole)
                .collect();
            allows.sort();
            allows.dedup();
            let split = if allows.contains(&SharingMode::Fractional) {
                options.hami_split_count(n)
            } else {
                0
            };
            groups
                .entry((n.gpu_model.clone(), healthy, allows, split))
                .or_default()
                .push(i);
        }
    }
    let mut classes = Vec::new();
    for ((gpu_model, gpus_per_node, allows, split), nodes) in groups {
        let gpu = cluster.catalog.get(&gpu_model).expect("checked above");
        let fractional = allows
            .contains(&SharingMode::Fractional)
            .then(|| Fractional {
                memory_mib: (gpu.usable_gib * (1.0 - options.fractional_memory_headroom) * 1024.0
                    + 1e-6)
                    .floor() as u32,
                cores: (options.fractional_compute_cap * 100.0 + 1e-6).floor() as u32,
                shares: split,
            });
        let mut class = Class {
            gpu_model: gpu_model.clone(),
            price: gpu.price_per_hour,
            usable_gib: gpu.usable_gib,
            compute: gpu.compute,
            mig: gpu
                .mig
                .clone()
                .filter(|_| allows.contains(&SharingMode::Mig)),
            gpus_per_node,
            allows,
            fractional,
            nodes,
            slot_types: Vec::new(),
            patterns: Vec::new(),
            current_patterns: Vec::new(),
            current_slots: BTreeMap::new(),
            current_whole: BTreeMap::new(),
        };
        add_slot_types(&mut class, models, options);
        add_patterns(&mut class, cluster, models, options);
        count_current(&mut class, cluster, models);
        classes.push(class);
    }
    classes
}

fn add_slot_types(class: &mut Class, models: &[Model], options: &PackOptions) {
    let slot = |kind: SlotKind, memory_gib: f64, compute: f64| SlotType {
        kind,
        memory_gib,
        compute,
        parts: 1,
        need: None,
    };
    if let Some(spec) = &class.mig {
        for p in spec.profiles.iter().filter(|p| !p.media_extensions) {
            class.slot_types.push(slot(
                SlotKind::Mig(p.name.clone()),
                p.usable_gib,
                p.compute(class.compute),
            ));
        }
    }
    if let Some(spec) = class
        .mig
        .as_ref()
        .filter(|_| class.allows.contains(&SharingMode::MigTimeslice))
    {
        for p in spec.profiles.iter().filter(|p| !p.media_extensions) {
            let compute = p.compute(class.compute);
            for n in 2..=options.max_timeslice_replicas {
                class.slot_types.push(slot(
                    SlotKind::MigShare(p.name.clone(), n),
                    p.usable_gib * (1.0 - options.timeslice_memory_headroom) / f64::from(n),
                    compute * options.timeslice_compute_cap / f64::from(n),
                ));
            }
        }
    }
    if class.allows.contains(&SharingMode::Timeslice) {
        for n in 2..=options.max_timeslice_replicas {
            class.slot_types.push(slot(
                SlotKind::Share(n),
                class.usable_gib * (1.0 - options.timeslice_memory_headroom) / f64::from(n),
                class.compute * options.timeslice_compute_cap / f64::from(n),
            ));
        }
    }
    if class.allows.contains(&SharingMode::Mps) {
        for n in 2..=options.max_mps_replicas {
            class.slot_types.push(slot(
                SlotKind::Mps(n),
                class.usable_gib * (1.0 - options.mps_memory_headroom) / f64::from(n),
                class.compute * options.mps_compute_cap / f64::from(n),
            ));
        }
    }
    for model in models {
        if let Some(part) = fractional_part(model, class) {
            class.slot_types.push(SlotType {
                kind: SlotKind::Fractional(model.name.clone()),
                memory_gib: f64::from(part.mib) / 1024.0,
                compute: f64::from(part.pct) / 100.0 * class.compute,
                parts: part.gpus,
                need: Some(part.need()),
            });
        }
    }
}

/// The MIG profile time-sliced on a node now and into how many shares.
pub fn node_shared(node: &gpuscale_policies::Node) -> Option<(&str, u8)> {
    node.mig_timeslice
        .as_ref()
        .map(|t| (t.profile.as_str(), t.replicas))
}

/// The candidates that no other one matches or exceeds in useful slots,
/// type by type (or that are in use now, so keeping them stays possible):
/// the ILP only sees slots demanded models fit. Among equals the first
/// stays.
fn undominated(candidates: Vec<(Pattern, bool)>, useful: &[bool]) -> Vec<Pattern> {
    let useful_slots = |p: &Pattern| -> Vec<u32> {
        let mut v = vec![0; useful.len()];
        for &(t, k) in &p.slots {
            if useful[t] {
                v[t] += k;
            }
        }
        v
    };
    let vectors: Vec<Vec<u32>> = candidates.iter().map(|(p, _)| useful_slots(p)).collect();
    candidates
        .into_iter()
        .enumerate()
        .filter(|(i, (_, is_current))| {
            let dominated = vectors.iter().enumerate().any(|(j, other)| {
                j != *i
                    && other.iter().zip(&vectors[*i]).all(|(a, b)| a >= b)
                    && (other != &vectors[*i] || j < *i)
            });
            *is_current || !dominated
        })
        .map(|(_, (p, _))| p)
        .collect()
}

/// Whether one fractional (HAMi) GPU of the class holds whatever a
/// pattern's slots could hold: every model that fits one of its slots also
/// runs on a fractional GPU alone, and the largest `gpumem` and `gpucores`
/// any of them asks, summed over the slots, stays within the GPU's. When
/// that holds for every geometry of a node config, the config is
/// dominated (its nodes may run HAMi instead, every replica where it was)
/// and the ILP needs only the fractional mixes.
fn fractional_holds(class: &Class, models: &[Model], pattern: &Pattern) -> bool {
    let Some(cap) = class.fractional else {
        return false;
    };
    let (mut mib, mut pct) = (0u64, 0u64);
    for &(t, count) in &pattern.slots {
        let (mut worst_mib, mut worst_pct) = (0u32, 0u32);
        for m in models
            .iter()
            .filter(|m| fits_slot(m, class, &class.slot_types[t]))
        {
            match fractional_part(m, class) {
                Some(part) if part.gpus == 1 => {
                    worst_mib = worst_mib.max(part.mib);
                    worst_pct = worst_pct.max(part.pct);
                }
                _ => return false,
            }
        }
        mib += u64::from(worst_mib) * u64::from(count);
        pct += u64::from(worst_pct) * u64::from(count);
    }
    let shares: u32 = pattern.slots.iter().map(|&(_, k)| k).sum();
    mib <= u64::from(cap.memory_mib) && pct <= u64::from(cap.cores) && shares <= cap.shares
}

fn add_patterns(class: &mut Class, cluster: &Cluster, models: &[Model], options: &PackOptions) {
    let useful: Vec<bool> = class
        .slot_types
        .iter()
        .map(|t| models.iter().any(|m| fits_slot(m, class, t)))
        .collect();
    // (geometry, its profile counts, the time-slicing of a node running it
    // now, if any).
    let mut geometries: Vec<(Geometry, Option<(String, u8)>)> = Vec::new();
    if let Some(spec) = &class.mig {
        geometries.extend(mig::maximal_geometries(spec).into_iter().map(|g| (g, None)));
        for &ni in &class.nodes {
            let node = &cluster.nodes[ni];
            for g in &node.gpus {
                if g.mode == GpuMode::Mig && !g.geometry.is_empty() {
                    let shared = node_shared(node)
                        .filter(|(p, _)| plain_counts(&g.geometry).contains_key(*p))
                        .map(|(p, n)| (p.to_string(), n));
                    geometries.push((g.geometry.clone(), shared));
                }
            }
        }
    }
    // Plain MIG patterns.
    let mut seen = Vec::new();
    let mut candidates: Vec<(Pattern, bool)> = Vec::new();
    for (g, _) in &geometries {
        let counts = plain_counts(g);
        if seen.contains(&counts) {
            continue;
        }
        seen.push(counts.clone());
        let slots: Vec<(usize, u32)> = counts
            .iter()
            .filter_map(|(profile, &c)| class.mig_slot(profile).map(|t| (t, c)))
            .collect();
        let is_current = geometries
            .iter()
            .any(|(h, shared)| shared.is_none() && plain_counts(h) == counts);
        if is_current || slots.iter().any(|&(t, _)| useful[t]) {
            candidates.push((
                Pattern {
                    kind: PatternKind::Mig(g.clone()),
                    slots,
                },
                is_current,
            ));
        }
    }
    class.patterns.extend(undominated(candidates, &useful));
    // Time-sliced MIG: per (profile, N) whose shares some model fits, the
    // geometries with that profile, its instances split into N shares.
    // `(p, N)` is dominated by `(p, N + 1)` when the same models fit a share
    // of either: the same geometries then offer more shares, and a node can
    // switch config with every replica where it is.
    let fitting = |t: usize| -> Vec<bool> {
        models
            .iter()
            .map(|m| fits_slot(m, class, &class.slot_types[t]))
            .collect()
    };
    let configs: Vec<(String, u8)> = class
        .slot_types
        .iter()
        .enumerate()
        .filter_map(|(t, st)| match &st.kind {
            SlotKind::MigShare(p, n) if useful[t] => {
                let finer = class.mig_share_slot(p, n + 1);
                let dominated = finer.is_some_and(|f| fitting(f) == fitting(t));
                (!dominated).then(|| (p.clone(), *n))
            }
            _ => None,
        })
        .chain(geometries.iter().filter_map(|(_, shared)| shared.clone()))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for (profile, n) in configs {
        let Some(share) = class.mig_share_slot(&profile, n) else {
            continue;
        };
        let mut seen = Vec::new();
        let mut candidates: Vec<(Pattern, bool)> = Vec::new();
        for (g, _) in &geometries {
            let counts = plain_counts(g);
            if !counts.contains_key(&profile) || seen.contains(&counts) {
                continue;
            }
            seen.push(counts.clone());
            let mut slots: Vec<(usize, u32)> = counts
                .iter()
                .filter_map(|(p, &c)| {
                    if *p == profile {
                        Some((share, c * u32::from(n)))
                    } else {
                        class.mig_slot(p).map(|t| (t, c))
                    }
                })
                .collect();
            slots.sort_unstable();
            let is_current = geometries.iter().any(|(h, shared)| {
                shared.as_ref() == Some(&(profile.clone(), n)) && plain_counts(h) == counts
            });
            if is_current || slots.iter().any(|&(t, _)| useful[t]) {
                candidates.push((
                    Pattern {
                        kind: PatternKind::MigShare {
                            geometry: g.clone(),
                            profile: profile.clone(),
                            n,
                        },
                        slots,
                    },
                    is_current,
                ));
            }
        }
        // The config is left out when one fractional GPU holds whatever
        // any of its geometries could and none runs now: every node that
        // would time-slice this way can run HAMi instead with each
        // replica where it was (per config, not per geometry: a node runs
        // one config, so a geometry HAMi could not replace keeps the
        // others company).
        let any_current = candidates.iter().any(|(_, current)| *current);
        let kept = undominated(candidates, &useful);
        if any_current || !kept.iter().all(|p| fractional_holds(class, models, p)) {
            class.patterns.extend(kept);
        }
    }
    let shared = (2..=options.max_timeslice_replicas)
        .map(|n| (SlotKind::Share(n), PatternKind::Share(n), n))
        .chain((2..=options.max_mps_replicas).map(|n| (SlotKind::Mps(n), PatternKind::Mps(n), n)));
    for (slot, kind, n) in shared {
        if let Some(t) = class.slot_types.iter().position(|st| st.kind == slot)
            && useful[t]
        {
            class.patterns.push(Pattern {
                kind,
                slots: vec![(t, u32::from(n))],
            });
        }
    }
}

fn count_current(class: &mut Class, cluster: &Cluster, models: &[Model]) {
    class.current_patterns = vec![0; class.patterns.len()];
    let model_index = |name: &str| models.iter().position(|m| m.name == name);
    // Shares per (model, fractional slot type), over the class.
    let mut fractional_parts: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    for ni in class.nodes.clone() {
        let node = &cluster.nodes[ni];
        let mut whole: BTreeMap<usize, u32> = BTreeMap::new();
        for g in node.gpus.iter().filter(|g| g.health == Health::Healthy) {
            match g.mode {
                GpuMode::Mig => {
                    let shared = node_shared(node);
                    if let Some(p) = class.mig_pattern_of(&g.geometry, shared) {
                        class.current_patterns[p] += 1;
                    }
                    for w in &g.workloads {
                        let profile = g
                            .geometry
                            .placements()
                            .iter()
                            .find(|p| Some(p.start) == w.slot)
                            .map(|p| p.profile.clone());
                        if let (Some(m), Some(t)) = (
                            model_index(&w.model),
                            profile.and_then(|p| class.instance_slot(&p, shared)),
                        ) {
                            *class.current_slots.entry((m, t)).or_insert(0) += 1;
                        }
                    }
                }
                GpuMode::Timeslice | GpuMode::Mps => {
                    let (pattern, slot) = if g.mode == GpuMode::Timeslice {
                        let n = node.timeslice_replicas.unwrap_or(0);
                        (PatternKind::Share(n), SlotKind::Share(n))
                    } else {
                        let n = node.mps_replicas.unwrap_or(0);
                        (PatternKind::Mps(n), SlotKind::Mps(n))
                    };
                    if let Some(p) = class.patterns.iter().position(|p| p.kind == pattern) {
                        class.current_patterns[p] += 1;
                    }
                    if let Some(t) = class.slot_types.iter().position(|st| st.kind == slot) {
                        for w in &g.workloads {
                            if let Some(m) = model_index(&w.model) {
                                *class.current_slots.entry((m, t)).or_insert(0) += 1;
                            }
                        }
                    }
                }
                GpuMode::Fractional => {
                    // The mix it runs is a pattern (when it still fits: a
                    // policy may have grown since).
                    let mut mix: BTreeMap<usize, u32> = BTreeMap::new();
                    for w in &g.workloads {
                        let Some(m) = model_index(&w.model) else {
                            continue;
                        };
                        if let Some(t) = class.fractional_slot(&models[m].name) {
                            *mix.entry(t).or_insert(0) += 1;
                            *fractional_parts.entry((m, t)).or_insert(0) += 1;
                        }
                    }
                    let mix: Vec<(usize, u32)> = mix.into_iter().collect();
                    if !mix.is_empty() && class.fractional_fits(&mix) {
                        let p = class.add_fractional_pattern(mix);
                        class.current_patterns[p] += 1;
                    }
                }
                GpuMode::Whole => {
                    for w in &g.workloads {
                        if let Some(m) = model_index(&w.model) {
                            *whole.entry(m).or_insert(0) += 1;
                        }
                    }
                }
                GpuMode::Free => {}
            }
        }
        for (m, gpus) in whole {
            if let Some(&k) = whole_degrees(&models[m], class).first()
                && gpus >= k
            {
                *class.current_whole.entry((m, k)).or_insert(0) += gpus / k;
            }
        }
    }
    // A tensor-parallel replica on fractional GPUs is a workload on each.
    for ((m, t), shares) in fractional_parts {
        let replicas = shares / class.slot_types[t].parts.max(1);
        if replicas > 0 {
            class.current_slots.insert((m, t), replicas);
        }
    }
}
