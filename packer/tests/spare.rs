//! Spare replicas (`gpuscale_packer::spare`): room that GPUs in use leave
//! idle, filled with replicas of running models, checked against the
//! limits HAMi, MPS and MIG enforce (not against the packer's own room
//! accounting), and never a GPU, a configuration or a dollar more.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use gpuscale_packer::plan::{Mode, Plan};
use gpuscale_packer::{PackOptions, pack, pack_from, spare};
use gpuscale_policies::{Cluster, Model, SharingMode};
use proptest::prelude::*;

/// Everything a plan with spares must keep of the plan without them, and
/// every limit the sharing mechanisms enforce.
fn check(base: &Plan, filled: &Plan, cluster: &Cluster, models: &[Model], options: &PackOptions) {
    let by_name: BTreeMap<&str, &Model> = models.iter().map(|m| (m.name.as_str(), m)).collect();
    // The same GPUs, cost, configurations and replicas wanted.
    assert_eq!(filled.gpus_used, base.gpus_used);
    assert_eq!(filled.cost_per_hour, base.cost_per_hour);
    assert_eq!(filled.nodes, base.nodes);
    assert_eq!(filled.gpus.len(), base.gpus.len());
    for (a, b) in base.gpus.iter().zip(&filled.gpus) {
        assert_eq!(
            (
                &a.node,
                a.index,
                a.mode,
                &a.geometry,
                a.timeslice_replicas,
                a.mps_replicas
            ),
            (
                &b.node,
                b.index,
                b.mode,
                &b.geometry,
                b.timeslice_replicas,
                b.mps_replicas
            )
        );
        // What ran still runs, where it ran; spares come after.
        assert_eq!(&b.replicas[..a.replicas.len()], a.replicas.as_slice());
        let spares = &b.replicas[a.replicas.len()..];
        assert!(spares.iter().all(|r| r.spare), "{}:{}", b.node, b.index);
        if spares.is_empty() {
            continue;
        }
        // Only on a GPU already in use, and only where the sharing
        // enforces each replica's compute: never time-sliced, whole or
        // idle.
        assert!(
            !a.replicas.is_empty(),
            "a spare powered on {}:{}",
            a.node,
            a.index
        );
        let gpu = cluster.catalog.get(&b.gpu_model).unwrap();
        let node = cluster.nodes.iter().find(|n| n.name == b.node).unwrap();
        match b.mode {
            Mode::Fractional => {
                // HAMi: `gpumem` (MiB) and `gpucores` (%) of each container,
                // summed, within the device's memory less headroom and the
                // core cap; at most deviceSplitCount containers.
                let (mut mib, mut pct) = (0u64, 0u64);
                for r in &b.replicas {
                    let m = by_name[r.model.as_str()];
                    let k = f64::from(r.group_size.unwrap_or(1));
                    mib += (m.memory_gib * 1024.0 / k - 1e-6).ceil() as u64;
                    pct += (m.compute / k / gpu.compute * 100.0 - 1e-6).ceil() as u64;
                }
                let memory = gpu.usable_gib * (1.0 - options.fractional_memory_headroom) * 1024.0;
                assert!(
                    mib as f64 <= memory + 1e-6,
                    "{mib} MiB on {}:{}",
                    b.node,
                    b.index
                );
                assert!(pct as f64 <= options.fractional_compute_cap * 100.0 + 1e-6);
                assert!(b.replicas.len() as u32 <= options.hami_split_count(node));
            }
            Mode::Mps => {
                // N partitions, each replica within one's memory and
                // compute.
                let n = b.mps_replicas.unwrap();
                assert!(b.replicas.len() <= usize::from(n));
                for r in spares {
                    common::assert_fits_mps_partition(by_name[r.model.as_str()], gpu, options, n);
                }
            }
            Mode::Mig => {
                // One spare per instance, on an instance nothing else used,
                // of a profile the model fits.
                let spec = gpu.mig.as_ref().unwrap();
                let used: BTreeSet<Option<u8>> = a.replicas.iter().map(|r| r.start).collect();
                let mut taken = BTreeSet::new();
                for r in spares {
                    assert!(!used.contains(&r.start), "a spare on a used instance");
                    assert!(taken.insert(r.start), "two spares on one instance");
                    let at = b
                        .geometry
                        .iter()
                        .find(|p| Some(p.start) == r.start)
                        .expect("an instance of the geometry");
                    assert_eq!(r.profile.as_deref(), Some(at.profile.as_str()));
                    // Not an instance of a profile its node time-slices:
                    // its pod would ask for any share of any instance.
                    let sliced = base
                        .nodes
                        .iter()
                        .find(|n| n.name == b.node)
                        .and_then(|n| n.mig_timeslice.as_ref());
                    assert!(
                        sliced.is_none_or(|t| t.profile != at.profile.trim_end_matches("+me")),
                        "a spare on a time-sliced {} instance",
                        at.profile
                    );
                    let p = spec.profile(&at.profile).unwrap();
                    let m = by_name[r.model.as_str()];
                    assert!(
                        m.memory_gib <= p.usable_gib + 1e-9,
                        "{} in {}",
                        m.name,
                        p.name
                    );
                    assert!(m.compute <= gpu.compute * p.compute_fraction + 1e-9);
                }
            }
            other => panic!("a spare on a {other:?} GPU"),
        }
    }
    // Per model: the same replicas placed, at most as many spares as
    // placed and never past maxReplicas; its variants count them. None at
    // all beside a wanted replica left unplaced.
    let spares = spare::count(filled);
    if !base.unplaced.is_empty() {
        assert!(
            spares.is_empty(),
            "spares {spares:?} beside {:?}",
            base.unplaced
        );
    }
    for (mp, was) in filled.models.iter().zip(&base.models) {
        assert_eq!((mp.wanted, mp.placed), (was.wanted, was.placed));
        let s = spares.get(&mp.name).copied().unwrap_or(0);
        let m = by_name[mp.name.as_str()];
        assert!(
            s <= mp.placed,
            "{}: {s} spares for {} placed",
            mp.name,
            mp.placed
        );
        assert!(mp.placed + s <= m.scaling.max_replicas.max(mp.placed));
        let replicas: u32 = mp.variants.iter().map(|v| v.replicas).sum();
        let in_variants: u32 = mp.variants.iter().map(|v| v.spares).sum();
        let before: u32 = was.variants.iter().map(|v| v.replicas).sum();
        assert_eq!((replicas, in_variants), (before + s, s), "{}", mp.name);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random clusters, models and demand: spares keep every limit and
    /// change nothing the plan without them decided; filled again from
    /// themselves they stay where they are.
    #[test]
    fn spares_keep_every_limit_and_cost_nothing(
        nodes in prop::collection::vec(
            (prop::sample::select(vec!["H100-80GB", "A100-40GB", "L4", "H200-141GB"]), 1u32..=4, 0u8..64),
            1..=4,
        ),
        specs in prop::collection::vec((0.5f64..40.0, 0.01f64..0.6, 1u8..64, 0u32..=5, 1u32..=8), 1..=5),
    ) {
        let cluster = common::cluster_of_masks(&nodes);
        let mut models = Vec::new();
        let mut demand = BTreeMap::new();
        for (i, &(memory, compute, mask, want, most)) in specs.iter().enumerate() {
            let name = format!("m{i}");
            if let Some(mut m) = common::try_model(&name, memory, compute, &common::modes(mask), &[1], &[]) {
                m.scaling.max_replicas = most;
                demand.insert(name, want.min(most));
                models.push(m);
            }
        }
        prop_assume!(!models.is_empty());
        let options = PackOptions::default();
        let base = pack(&cluster, &models, &demand, &options).unwrap();
        let filled = spare::fill(&base, &cluster, &models, &options, None);
        check(&base, &filled, &cluster, &models, &options);
        // From where they were, the same spares in the same places.
        let again = spare::fill(&base, &cluster, &models, &options, Some(&filled));
        prop_assert_eq!(&again.gpus, &filled.gpus);
    }
}

/// One HAMi node, a 10 GiB model at 0.3 of an H100 (HAMi: 10,240 MiB and
/// 30 % each): two wanted replicas fill 60 % of one GPU's cores, and the
/// third that fits them (90 %) is a spare; a fourth would pass 100 %
/// (memory would hold seven).
#[test]
fn a_fractional_gpu_takes_spares_up_to_its_cores() {
    let cluster = common::cluster_allowing(&[("h", "H100-80GB", 2)], &[SharingMode::Fractional]);
    let m = [common::model(
        "chat",
        10.0,
        0.3,
        &[SharingMode::Fractional],
        &[1],
        &[],
    )];
    let options = PackOptions::default();
    let base = pack(&cluster, &m, &common::demand(&[("chat", 2)]), &options).unwrap();
    assert_eq!(base.gpus_used, 1);
    let filled = spare::fill(&base, &cluster, &m, &options, None);
    check(&base, &filled, &cluster, &m, &options);
    assert_eq!(
        spare::count(&filled),
        BTreeMap::from([("chat".to_string(), 1)])
    );
    let g = filled.gpus.iter().find(|g| !g.replicas.is_empty()).unwrap();
    assert_eq!(g.replicas.len(), 3);
    // The spare runs in its pod like the others: the variant's count.
    let v = &filled.models[0].variants;
    assert_eq!(
        v.iter().map(|v| (v.replicas, v.spares)).collect::<Vec<_>>(),
        [(3, 1)]
    );

    // Demand grows to three: the packer places the third where the spare
    // was (the room it sees free), and no spare fits any more.
    let replanned = pack_from(
        &base.apply_to(&cluster),
        &m,
        &common::demand(&[("chat", 3)]),
        &PackOptions {
            keep_running: true,
            ..options.clone()
        },
        None,
    )
    .unwrap();
    assert_eq!(replanned.gpus_used, 1);
    let refilled = spare::fill(&replanned, &cluster, &m, &options, Some(&filled));
    assert!(spare::count(&refilled).is_empty());
}

/// A model scaled to zero gets no spare, nor one at its maxReplicas; a
/// time-sliced GPU's unused shares are not room.
#[test]
fn no_spare_for_a_model_at_zero_or_at_its_most_nor_on_time_sliced_gpus() {
    let cluster = common::cluster_allowing(&[("h", "H100-80GB", 1)], &[SharingMode::Fractional]);
    let mut a = common::model("a", 10.0, 0.1, &[SharingMode::Fractional], &[1], &[]);
    let b = common::model("b", 10.0, 0.1, &[SharingMode::Fractional], &[1], &[]);
    a.scaling.max_replicas = 1;
    let options = PackOptions::default();
    let models = [a, b];
    let base = pack(
        &cluster,
        &models,
        &common::demand(&[("a", 1), ("b", 0)]),
        &options,
    )
    .unwrap();
    let filled = spare::fill(&base, &cluster, &models, &options, None);
    assert!(
        spare::count(&filled).is_empty(),
        "{:?}",
        spare::count(&filled)
    );

    let cluster = common::cluster_allowing(&[("t", "H100-80GB", 1)], &[SharingMode::Timeslice]);
    let c = [common::model(
        "c",
        10.0,
        0.1,
        &[SharingMode::Timeslice],
        &[1],
        &[],
    )];
    let base = pack(&cluster, &c, &common::demand(&[("c", 1)]), &options).unwrap();
    let filled = spare::fill(&base, &cluster, &c, &options, None);
    assert!(spare::count(&filled).is_empty());
}
