//! Training gangs: all or nothing, topology, preemption, and training
//! beside inference on one inventory.
//!
//! The expectations are the issue's rules (Volcano's and coscheduling's
//! all-or-nothing, Kueue's level-by-level relaxation, priority-ordered
//! preemption at the least lost work), worked out by hand per case.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuscale_packer::gang::{
    self, GangOptions, GangPlan, GangStatus, Inventory, Preemption, VictimKind, artefacts, joint,
    queue,
};
use gpuscale_packer::{Mode, PackOptions};
use gpuscale_policies::inventory::{ClusterSpec, GpuState, NodeSpec, Workload};
use gpuscale_policies::training::{Topology, TopologyLevel, TopologyMode, TrainingJobSpec};
use gpuscale_policies::{Catalog, Cluster, Priority, SharingMode, TrainingJob};
use proptest::prelude::*;
use serde::Deserialize;

/// (name, GPU model, GPUs, rack, zone, NVLink domain, running: (GPU, job)).
type NodeDef<'a> = (
    &'a str,
    &'a str,
    u32,
    &'a str,
    &'a str,
    Option<&'a str>,
    Vec<(u32, &'a str)>,
);

fn topo_cluster(nodes: Vec<NodeDef<'_>>) -> Cluster {
    let spec = ClusterSpec {
        catalog: vec![],
        nodes: nodes
            .into_iter()
            .map(|(name, gpu, count, rack, zone, nvl, running)| NodeSpec {
                name: name.into(),
                count: None,
                zone: Some(zone.into()),
                rack: Some(rack.into()),
                nvlink_domain: nvl.map(str::to_string),
                labels: BTreeMap::new(),
                gpu_model: gpu.into(),
                gpu_count: count,
                timeslice_replicas: None,
                mps_replicas: None,
                mig_timeslice: None,
                sharing: gpuscale_policies::inventory::node_sharing(),
                hami_split_count: None,
                gpus: running
                    .into_iter()
                    .map(|(index, job)| GpuState {
                        index,
                        health: Default::default(),
                        mode: gpuscale_policies::GpuMode::Whole,
                        geometry: vec![],
                        workloads: vec![Workload {
                            model: job.into(),
                            slot: None,
                        }],
                        uuid: None,
                    })
                    .collect(),
            })
            .collect(),
    };
    Cluster::from_spec("t", &spec, &Catalog::builtin()).expect("valid cluster")
}

struct J {
    workers: u32,
    gpw: u32,
    level: TopologyLevel,
    mode: TopologyMode,
    priority: Priority,
    preemptible: bool,
    checkpoint: Option<u64>,
}

fn job(name: &str, j: J) -> TrainingJob {
    let spec = TrainingJobSpec {
        workers: j.workers,
        gpus_per_worker: j.gpw,
        gpu_models: vec!["H100-80GB".into()],
        topology: Topology {
            level: j.level,
            mode: j.mode,
        },
        priority: j.priority,
        preemptible: j.preemptible,
        estimated_runtime: Some(Duration::from_secs(3600 * 10)),
        checkpoint_interval: j.checkpoint.map(|h| Duration::from_secs(h * 3600)),
        partition: None,
        account: None,
        submitted_at: None,
        started_at: None,
        template: None,
    };
    TrainingJob::from_spec(name, &spec, &Catalog::builtin()).expect("valid job")
}

/// `j` at another priority.
fn ranked(priority: Priority, j: J) -> J {
    J { priority, ..j }
}

fn simple(workers: u32, gpw: u32, level: TopologyLevel) -> J {
    J {
        workers,
        gpw,
        level,
        mode: TopologyMode::Required,
        priority: Priority::Standard,
        preemptible: true,
        checkpoint: Some(1),
    }
}

/// Every healthy GPU that no job holds is free.
fn all_free(c: &Cluster) -> Inventory {
    let mut inv = Inventory::default();
    for (n, node) in c.nodes.iter().enumerate() {
        for g in &node.gpus {
            if g.workloads.is_empty() {
                inv.free.entry(n).or_default().insert(g.index);
            }
        }
    }
    inv
}

/// `joint::plan` at [`q0`] with [`quick`] options, from the cluster's
/// state.
fn joint_plan(
    c: &Cluster,
    models: &[gpuscale_policies::Model],
    jobs: &[TrainingJob],
    demand: &[(&str, u32)],
) -> gpuscale_packer::Plan {
    joint::plan(
        c,
        models,
        training(jobs),
        &common::demand(demand),
        &quick(),
        None,
    )
    .unwrap()
}

/// The training side of a joint plan at [`q0`].
fn training(jobs: &[TrainingJob]) -> joint::Training<'_> {
    static OPTIONS: std::sync::OnceLock<GangOptions> = std::sync::OnceLock::new();
    static QUEUE: std::sync::OnceLock<queue::Queue> = std::sync::OnceLock::new();
    joint::Training {
        jobs,
        queue: QUEUE.get_or_init(q0),
        options: OPTIONS.get_or_init(GangOptions::default),
    }
}

/// The default queue at a fixed instant.
fn q0() -> queue::Queue {
    queue::Queue {
        spec: Default::default(),
        now: 1.8e9,
    }
}

fn place(c: &Cluster, jobs: &[TrainingJob]) -> Vec<GangPlan> {
    let held = gang::running(c, jobs);
    gang::place(c, jobs, &held, &all_free(c), &q0(), &GangOptions::default()).gangs
}

fn by_name<'a>(gangs: &'a [GangPlan], name: &str) -> &'a GangPlan {
    gangs
        .iter()
        .find(|g| g.name == name)
        .expect("every job has a plan")
}

fn gpus_of(g: &GangPlan) -> BTreeSet<(String, u32)> {
    g.workers
        .iter()
        .flat_map(|w| w.gpus.iter().map(move |&i| (w.node.clone(), i)))
        .collect()
}

#[test]
fn two_interleaved_gangs_restart_as_one_whole_gang_and_one_that_waits() {
    // The deadlock Volcano and coscheduling users report: 8 GPUs, two
    // gangs of 2 × 4 that each fit alone, each holding half of its GPUs
    // on both nodes. Neither can start as it is; all or nothing starts
    // exactly one (the other holds nothing while it waits).
    let c = topo_cluster(vec![
        (
            "n0",
            "H100-80GB",
            4,
            "r0",
            "z0",
            None,
            vec![(0, "a"), (1, "a"), (2, "b"), (3, "b")],
        ),
        (
            "n1",
            "H100-80GB",
            4,
            "r0",
            "z0",
            None,
            vec![(0, "a"), (1, "a"), (2, "b"), (3, "b")],
        ),
    ]);
    let jobs = vec![
        job("a", simple(2, 4, TopologyLevel::Any)),
        job("b", simple(2, 4, TopologyLevel::Any)),
    ];
    let held = gang::running(&c, &jobs);
    assert!(held.values().all(|h| !h.intact), "{held:?}");
    // Their GPUs are released: the inventory holds all eight.
    let mut inv = Inventory::default();
    for n in 0..2 {
        inv.free.insert(n, (0..4).collect());
    }
    let gangs = gang::place(&c, &jobs, &held, &inv, &q0(), &GangOptions::default()).gangs;
    let starting: Vec<&GangPlan> = gangs
        .iter()
        .filter(|g| g.status == GangStatus::Starting)
        .collect();
    assert_eq!(starting.len(), 1, "{gangs:#?}");
    assert_eq!(gpus_of(starting[0]).len(), 8);
    let waiting = gangs
        .iter()
        .find(|g| g.status == GangStatus::Pending)
        .expect("the other waits");
    assert!(waiting.workers.is_empty());
    assert!(
        waiting.reason.contains("restarts as a whole gang"),
        "{}",
        waiting.reason
    );
    // The pods of both still hold their GPUs until deleted: the gang that
    // starts names each, four GPUs of its own old pods and four of the
    // other's, so the operator deletes them first.
    let named: Vec<(&str, u32)> = starting[0]
        .preempts
        .iter()
        .map(|p| (p.name.as_str(), p.count))
        .collect();
    assert_eq!(named, [("a", 4), ("b", 4)], "{:#?}", starting[0].preempts);
    assert!(
        starting[0].preempts.iter().all(|p| p
            .reason
            .contains("kubectl delete pods -l gpuscale.io/training-job=")),
        "{:#?}",
        starting[0].preempts
    );
}

#[test]
fn two_gangs_that_together_overfill_the_cluster_start_one_and_hold_nothing_for_the_other() {
    let c = topo_cluster(vec![
        ("n0", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("n1", "H100-80GB", 8, "r0", "z0", None, vec![]),
    ]);
    let jobs = vec![
        job("a", simple(3, 4, TopologyLevel::Any)),
        job("b", simple(3, 4, TopologyLevel::Any)),
    ];
    let gangs = place(&c, &jobs);
    let s: Vec<_> = gangs.iter().filter(|g| g.holds()).collect();
    assert_eq!(s.len(), 1);
    assert_eq!(gpus_of(s[0]).len(), 12);
    let p = gangs.iter().find(|g| !g.holds()).unwrap();
    assert_eq!(p.status, GangStatus::Pending);
    assert!(p.workers.is_empty());
    // It holds nothing, but has a reservation: when the first ends (its
    // 10 h estimate).
    assert!(
        p.reason.starts_with("waits for resources: reserved"),
        "{}",
        p.reason
    );
    assert_eq!(p.start_s, Some(q0().now + 36_000.0));
}

#[test]
fn a_required_rack_waits_when_no_rack_holds_it_and_a_preferred_one_spreads_a_level_wider() {
    // One free node per rack: a 2 × 8 gang fits in the zone but no rack.
    let c = topo_cluster(vec![
        ("a0", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("b0", "H100-80GB", 8, "r1", "z0", None, vec![]),
    ]);
    let required = job("req", simple(2, 8, TopologyLevel::Rack));
    let gangs = place(&c, &[required]);
    assert_eq!(gangs[0].status, GangStatus::Pending);
    assert!(
        gangs[0].reason.contains("any one rack"),
        "{}",
        gangs[0].reason
    );

    let preferred = job(
        "pref",
        J {
            mode: TopologyMode::Preferred,
            ..simple(2, 8, TopologyLevel::Rack)
        },
    );
    let gangs = place(&c, &[preferred]);
    assert_eq!(gangs[0].status, GangStatus::Starting);
    // Relaxed to the next level that holds: the zone, not `any`.
    assert_eq!(gangs[0].topology_met, Some(TopologyLevel::Zone));
    assert_eq!(gangs[0].domain.as_deref(), Some("z0"));
}

#[test]
fn a_gang_fills_a_partly_used_node_and_leaves_whole_nodes_free() {
    // n0 has 4 GPUs free (4 run a job), n1 and n2 are whole and free: a
    // 1 × 4 job goes on n0, so two whole nodes remain for large gangs.
    let c = topo_cluster(vec![
        ("n1", "H100-80GB", 8, "r0", "z0", None, vec![]),
        (
            "n0",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..4).map(|i| (i, "big")).collect(),
        ),
        ("n2", "H100-80GB", 8, "r0", "z0", None, vec![]),
    ]);
    let jobs = vec![
        job("big", simple(1, 4, TopologyLevel::Node)),
        job("small", simple(1, 4, TopologyLevel::Node)),
    ];
    let gangs = place(&c, &jobs);
    let s = by_name(&gangs, "small");
    assert_eq!(s.status, GangStatus::Starting);
    assert_eq!(s.workers[0].node, "n0");
    assert_eq!(s.workers[0].gpus, vec![4, 5, 6, 7]);
    assert_eq!(by_name(&gangs, "big").status, GangStatus::Running);
}

#[test]
fn a_gang_over_several_nodes_uses_the_fewest_and_keeps_an_nvlink_domain_whole() {
    // Two NVLink domains of two 4-GPU nodes; domain d0 already runs a job
    // on one GPU. A 2 × 3 gang fits in either; it takes d0's free GPUs
    // and leaves d1 whole.
    let c = topo_cluster(vec![
        ("d1a", "H100-80GB", 4, "r0", "z0", Some("d1"), vec![]),
        ("d1b", "H100-80GB", 4, "r0", "z0", Some("d1"), vec![]),
        (
            "d0a",
            "H100-80GB",
            4,
            "r0",
            "z0",
            Some("d0"),
            vec![(0, "x")],
        ),
        ("d0b", "H100-80GB", 4, "r0", "z0", Some("d0"), vec![]),
    ]);
    let jobs = vec![
        job("x", simple(1, 1, TopologyLevel::Node)),
        job("g", simple(2, 3, TopologyLevel::NvlinkDomain)),
    ];
    let gangs = place(&c, &jobs);
    let g = by_name(&gangs, "g");
    assert_eq!(g.status, GangStatus::Starting);
    assert_eq!(g.domain.as_deref(), Some("d0"), "{g:#?}");
    assert_eq!(g.workers.len(), 2);
}

#[test]
fn preemption_frees_the_topology_at_the_least_lost_gpu_hours() {
    // A critical 1 × 8 job, all 16 GPUs busy with sheddable jobs:
    //   n0: `one` on 8 GPUs, checkpoints hourly:      8 GPU-h lost;
    //   n1: `two` (4 GPUs, every 10 h) + `three` (4 GPUs, hourly): 44.
    // The cheapest victims that free a whole node are {one}.
    let c = topo_cluster(vec![
        (
            "n0",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..8).map(|i| (i, "one")).collect(),
        ),
        (
            "n1",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..8)
                .map(|i| (i, if i < 4 { "two" } else { "three" }))
                .collect(),
        ),
    ]);
    let shed = |gpw, ckpt| J {
        priority: Priority::Sheddable,
        checkpoint: Some(ckpt),
        ..simple(1, gpw, TopologyLevel::Node)
    };
    let jobs = vec![
        job("one", shed(8, 1)),
        job("two", shed(4, 10)),
        job("three", shed(4, 1)),
        job(
            "urgent",
            ranked(Priority::Critical, simple(1, 8, TopologyLevel::Node)),
        ),
    ];
    let gangs = place(&c, &jobs);
    let u = by_name(&gangs, "urgent");
    assert_eq!(u.status, GangStatus::Starting, "{gangs:#?}");
    assert_eq!(u.workers[0].node, "n0");
    assert_eq!(u.preempts.len(), 1);
    assert_eq!(u.preempts[0].name, "one");
    assert_eq!(u.preempts[0].kind, VictimKind::Job);
    assert!((u.preempts[0].lost_gpu_hours - 8.0).abs() < 1e-9);
    assert_eq!(by_name(&gangs, "one").status, GangStatus::Preempted);
    assert!(by_name(&gangs, "one").reason.contains("urgent"));
    // The Slurm script names the victim (Slurm preempts by its own rules).
    let script = artefacts::sbatch(u).unwrap();
    assert!(
        script.contains("# gpuscale plan: preempts job `one` (8 GPUs)"),
        "{script}"
    );
    assert_eq!(by_name(&gangs, "two").status, GangStatus::Running);
    assert_eq!(by_name(&gangs, "three").status, GangStatus::Running);

    // Make `one` dearer (no checkpoints, 10 h estimate: 80 GPU-h): now
    // {two, three} (44) is the cheaper way to free a node.
    let mut jobs2 = jobs.clone();
    jobs2[0] = job(
        "one",
        J {
            checkpoint: None,
            ..shed(8, 1)
        },
    );
    let gangs = place(&c, &jobs2);
    let u = by_name(&gangs, "urgent");
    assert_eq!(u.workers[0].node, "n1");
    let names: Vec<&str> = u.preempts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, vec!["three", "two"]);

    // With start times the work actually lost counts. `one` (8 GPUs, no
    // checkpoints) started 10 minutes ago: 8 × 1/6 = 1.33 GPU-h. `two`
    // and `three` (4 GPUs each) started 9 h 50 min ago, checkpointing
    // every 10 h and every hour: 4 × 9 5/6 + 4 × 5/6 = 42.67. `one` again.
    let ago = |minutes: f64| {
        Some(std::time::UNIX_EPOCH + Duration::from_secs_f64(q0().now - minutes * 60.0))
    };
    let mut jobs3 = jobs2.clone();
    jobs3[0].spec.started_at = ago(10.0);
    jobs3[1].spec.started_at = ago(590.0);
    jobs3[2].spec.started_at = ago(590.0);
    let gangs = place(&c, &jobs3);
    let u = by_name(&gangs, "urgent");
    assert_eq!(u.workers[0].node, "n0", "{gangs:#?}");
    assert_eq!(u.preempts.len(), 1);
    assert_eq!(u.preempts[0].name, "one");
    assert!(
        (u.preempts[0].lost_gpu_hours - 8.0 / 6.0).abs() < 1e-6,
        "{:?}",
        u.preempts
    );
    assert!(
        u.preempts[0].reason.contains("frees the node"),
        "{}",
        u.preempts[0].reason
    );
}

#[test]
fn a_preempted_job_is_requeued_at_its_priority_ahead_of_lower_jobs() {
    // n0's 8 GPUs run `victim` (standard). `urgent` (critical) preempts it;
    // `low` (sheddable) waits too. Requeued as Slurm's PreemptMode=REQUEUE
    // does, `victim` is reserved the GPUs when `urgent` ends, and `low`
    // only after `victim` — never the other way round.
    let c = topo_cluster(vec![(
        "n0",
        "H100-80GB",
        8,
        "r0",
        "z0",
        None,
        (0..8).map(|i| (i, "victim")).collect(),
    )]);
    let jobs = vec![
        job("victim", simple(1, 8, TopologyLevel::Node)),
        job(
            "urgent",
            ranked(Priority::Critical, simple(1, 8, TopologyLevel::Node)),
        ),
        job(
            "low",
            ranked(Priority::Sheddable, simple(1, 8, TopologyLevel::Node)),
        ),
    ];
    let gangs = place(&c, &jobs);
    let (u, v, l) = (
        by_name(&gangs, "urgent"),
        by_name(&gangs, "victim"),
        by_name(&gangs, "low"),
    );
    assert_eq!(u.status, GangStatus::Starting, "{gangs:#?}");
    assert_eq!(v.status, GangStatus::Preempted);
    assert!(v.reason.contains("preempted by `urgent`"), "{}", v.reason);
    assert_eq!(
        v.start_s, u.end_s,
        "reserved when `urgent` ends: {gangs:#?}"
    );
    assert_eq!(l.status, GangStatus::Pending);
    assert_eq!(l.start_s, v.end_s, "`low` after `victim`: {gangs:#?}");
    // A re-plan with `urgent` running keeps the order.
    let c2 = topo_cluster(vec![(
        "n0",
        "H100-80GB",
        8,
        "r0",
        "z0",
        None,
        (0..8).map(|i| (i, "urgent")).collect(),
    )]);
    let replan = place(&c2, &jobs);
    assert_eq!(by_name(&replan, "urgent").status, GangStatus::Running);
    assert_eq!(
        by_name(&replan, "victim").start_s,
        by_name(&replan, "urgent").end_s
    );
    assert_eq!(
        by_name(&replan, "low").start_s,
        by_name(&replan, "victim").end_s
    );
}

#[test]
fn equal_priority_and_non_preemptible_work_is_never_preempted() {
    let c = topo_cluster(vec![(
        "n0",
        "H100-80GB",
        8,
        "r0",
        "z0",
        None,
        (0..8)
            .map(|i| (i, if i < 4 { "same" } else { "kept" }))
            .collect(),
    )]);
    let jobs = vec![
        job("same", simple(1, 4, TopologyLevel::Node)),
        job(
            "kept",
            J {
                priority: Priority::Sheddable,
                preemptible: false,
                ..simple(1, 4, TopologyLevel::Node)
            },
        ),
        job("new", simple(1, 8, TopologyLevel::Node)),
    ];
    let gangs = place(&c, &jobs);
    assert_eq!(by_name(&gangs, "new").status, GangStatus::Pending);
    assert_eq!(by_name(&gangs, "same").status, GangStatus::Running);
    assert_eq!(by_name(&gangs, "kept").status, GangStatus::Running);
}

fn whole_model(name: &str, priority: Priority, min: u32) -> gpuscale_policies::Model {
    let mut m = common::model(name, 60.0, 0.5, &[SharingMode::Whole], &[1], &["H100-80GB"]);
    m.priority = priority;
    m.scaling.min_replicas = min;
    m
}

fn quick() -> PackOptions {
    PackOptions {
        time_limit: Duration::from_secs(10),
        ..PackOptions::default()
    }
}

fn assert_never_shared(plan: &gpuscale_packer::Plan) {
    let mut held = BTreeSet::new();
    for g in plan.gangs.iter().filter(|g| g.holds()) {
        for gpu in gpus_of(g) {
            assert!(held.insert(gpu.clone()), "{gpu:?} held by two gangs");
        }
    }
    let mut seen = BTreeSet::new();
    for g in &plan.gpus {
        assert!(seen.insert((g.node.clone(), g.index)), "GPU listed twice");
        if g.gang.is_some() {
            assert!(g.replicas.is_empty(), "training and inference share {g:?}");
            assert_eq!(g.mode, Mode::Whole);
            let node = plan.nodes.iter().find(|n| n.name == g.node).unwrap();
            assert!(
                node.timeslice_replicas.is_none() && node.mps_replicas.is_none() && !node.hami,
                "node {} shares GPUs beside a gang",
                node.name
            );
        }
    }
}

#[test]
fn lower_priority_replicas_above_their_minimum_yield_to_a_gang_and_the_minimum_never_does() {
    // 16 whole GPUs; a sheddable model wants 12 replicas (minimum 2). A
    // critical 1 × 8 gang takes a node: the model keeps 8, loses 4.
    let c = common::cluster(&[("n0", "H100-80GB", 8), ("n1", "H100-80GB", 8)]);
    let models = vec![whole_model("m", Priority::Sheddable, 2)];
    let critical = job(
        "train",
        ranked(Priority::Critical, simple(1, 8, TopologyLevel::Node)),
    );
    let plan = joint_plan(&c, &models, std::slice::from_ref(&critical), &[("m", 12)]);
    assert_never_shared(&plan);
    let g = by_name(&plan.gangs, "train");
    assert_eq!(g.status, GangStatus::Starting);
    assert_eq!(plan.models[0].placed, 8);
    assert_eq!(g.preempts.len(), 1);
    assert_eq!(g.preempts[0].kind, VictimKind::Replicas);
    assert_eq!(g.preempts[0].count, 4);
    assert!(
        plan.unplaced[0].reason.contains("train"),
        "{:?}",
        plan.unplaced
    );
    assert_eq!(plan.training.as_ref().unwrap().gpus, 8);

    // A gang of 16 would leave no GPU for the model's minimum of 2: it
    // waits, and the model keeps all 12.
    let huge = job(
        "huge",
        ranked(Priority::Critical, simple(2, 8, TopologyLevel::Any)),
    );
    let plan = joint_plan(&c, &models, &[huge], &[("m", 12)]);
    assert_eq!(plan.gangs[0].status, GangStatus::Pending);
    assert_eq!(plan.models[0].placed, 12);
    assert!(plan.gpus.iter().all(|g| g.gang.is_none()));
}

#[test]
fn whole_gpu_replicas_cannot_take_a_gangs_gpus() {
    // A 1 × 4 gang and 10 whole-GPU replicas on 16 GPUs: a node holds the
    // gang and some replicas. The device plugin hands out any free GPU
    // of a node, so every whole-GPU variant is pinned to the node the plan
    // chose, with exactly the count planned there: the gang's GPUs are
    // never free to them.
    let c = common::cluster(&[("n0", "H100-80GB", 8), ("n1", "H100-80GB", 8)]);
    let models = vec![whole_model("m", Priority::Standard, 1)];
    let plan = joint_plan(
        &c,
        &models,
        &[job("train", simple(1, 4, TopologyLevel::Node))],
        &[("m", 10)],
    );
    assert_never_shared(&plan);
    let g = by_name(&plan.gangs, "train");
    assert_eq!(g.status, GangStatus::Starting);
    let gang_node = g.workers[0].node.clone();
    // Replicas per node as placed.
    let mut per_node: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for gpu in plan.gpus.iter().filter(|g| g.gang.is_none()) {
        for r in &gpu.replicas {
            per_node
                .entry(gpu.node.clone())
                .or_default()
                .insert(r.replica);
        }
    }
    let beside = per_node.get(&gang_node).map_or(0, |r| r.len() as u32);
    assert!(beside > 0, "no replica beside the gang: {:#?}", plan.gpus);
    let variants = &plan.models[0].variants;
    assert_eq!(variants.iter().map(|v| v.replicas).sum::<u32>(), 10);
    let names = |v: &gpuscale_packer::Variant, op: &str| -> Vec<String> {
        v.node_affinity
            .iter()
            .flat_map(|t| t.match_fields.iter().flatten())
            .filter(|r| r.key == "metadata.name" && r.operator == op)
            .flat_map(|r| {
                // The API server takes one value per node-field requirement.
                assert_eq!(r.values.as_ref().map(Vec::len), Some(1));
                r.values.clone().unwrap()
            })
            .collect()
    };
    let pinned: Vec<_> = variants
        .iter()
        .filter(|v| names(v, "In") == vec![gang_node.clone()])
        .collect();
    assert_eq!(pinned.len(), 1, "{variants:#?}");
    assert_eq!(pinned[0].replicas, beside);
    assert!(pinned[0].name.ends_with(&format!("-{gang_node}")));
    // Every other variant is pinned to another node, with its count there.
    for v in variants.iter().filter(|v| v.name != pinned[0].name) {
        let on = names(v, "In");
        assert_eq!(on.len(), 1, "{v:#?}");
        assert_ne!(on[0], gang_node, "{}", v.name);
        assert_eq!(
            v.replicas,
            per_node.get(&on[0]).map_or(0, |r| r.len() as u32),
            "{}",
            v.name
        );
    }
    // Without a gang: the same, a variant per node, each pinned there.
    let plan = joint_plan(&c, &models, &[], &[("m", 10)]);
    for v in &plan.models[0].variants {
        assert_eq!(names(v, "In").len(), 1, "{v:#?}");
        assert!(names(v, "NotIn").is_empty(), "{v:#?}");
    }
    assert_eq!(
        plan.models[0]
            .variants
            .iter()
            .map(|v| v.replicas)
            .sum::<u32>(),
        10
    );
}

#[test]
fn equal_priority_inference_keeps_its_replicas_and_a_gang_waits() {
    let c = common::cluster(&[("n0", "H100-80GB", 8), ("n1", "H100-80GB", 8)]);
    let models = vec![whole_model("m", Priority::Standard, 2)];
    let plan = joint_plan(
        &c,
        &models,
        &[job("train", simple(1, 8, TopologyLevel::Node))],
        &[("m", 12)],
    );
    assert_eq!(plan.gangs[0].status, GangStatus::Pending);
    assert_eq!(plan.models[0].placed, 12);
}

#[test]
fn a_preferred_rack_is_met_by_moving_inference_before_it_is_relaxed() {
    // Three racks, each with one free node; inference (2 replicas each)
    // on the other node of racks r0 and r1. A 2 × 8 gang that prefers a
    // rack, then one that requires it. On free GPUs alone no rack holds
    // either: the first would span racks and the second would never get
    // a reservation (inference, assumed to stay, keeps every rack short
    // of two nodes). Inference packed again around them: the first meets
    // its rack by moving two replicas, and the second starts or is
    // reserved.
    let with_m = |gpus: u32| -> Vec<(u32, &str)> { (0..gpus).map(|i| (i, "m")).collect() };
    let c = topo_cluster(vec![
        ("n0", "H100-80GB", 8, "r0", "z0", None, with_m(2)),
        ("n1", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("n2", "H100-80GB", 8, "r1", "z0", None, with_m(2)),
        ("n3", "H100-80GB", 8, "r1", "z0", None, vec![]),
        ("n4", "H100-80GB", 8, "r2", "z0", None, vec![]),
    ]);
    let models = vec![whole_model("m", Priority::Standard, 1)];
    let mut pre = job(
        "pre",
        J {
            mode: TopologyMode::Preferred,
            ..simple(2, 8, TopologyLevel::Rack)
        },
    );
    pre.spec.submitted_at = Some(at(&q0(), -7200.0));
    let mut req = job("req", simple(2, 8, TopologyLevel::Rack));
    req.spec.submitted_at = Some(at(&q0(), -3600.0));
    let plan = joint_plan(&c, &models, &[pre, req], &[("m", 4)]);
    assert_never_shared(&plan);
    assert_eq!(plan.models[0].placed, 4, "{:#?}", plan.unplaced);
    let p = by_name(&plan.gangs, "pre");
    assert_eq!(p.status, GangStatus::Starting, "{}", p.reason);
    assert_eq!(p.topology_met, Some(TopologyLevel::Rack), "{}", p.reason);
    let r = by_name(&plan.gangs, "req");
    assert!(
        r.status == GangStatus::Starting || r.start_s.is_some(),
        "{:?}: {}",
        r.status,
        r.reason
    );
}

#[test]
fn a_preferred_rack_never_stops_replicas_that_could_not_move() {
    // Rack r0: n0 runs 8 replicas of a standard model (minimum 0), n1 is
    // free; rack r1: n2 is free. A critical 2 × 8 gang prefers a rack; a
    // standard 1 × 8 gang waits behind it. Meeting the rack would take
    // n0, and its replicas would have nowhere to go: they would stop for
    // a preference. The critical gang spreads over the racks on free
    // GPUs instead, and every replica stays.
    let c = topo_cluster(vec![
        (
            "n0",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..8).map(|i| (i, "m")).collect(),
        ),
        ("n1", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("n2", "H100-80GB", 8, "r1", "z0", None, vec![]),
    ]);
    let models = vec![whole_model("m", Priority::Standard, 0)];
    let mut pre = job(
        "pre",
        ranked(
            Priority::Critical,
            J {
                mode: TopologyMode::Preferred,
                ..simple(2, 8, TopologyLevel::Rack)
            },
        ),
    );
    pre.spec.submitted_at = Some(at(&q0(), -7200.0));
    let mut w = job("w", simple(1, 8, TopologyLevel::Node));
    w.spec.submitted_at = Some(at(&q0(), -3600.0));
    let plan = joint_plan(&c, &models, &[pre, w], &[("m", 8)]);
    assert_never_shared(&plan);
    assert_eq!(plan.models[0].placed, 8, "{:#?}", plan.unplaced);
    let p = by_name(&plan.gangs, "pre");
    assert_eq!(p.status, GangStatus::Starting, "{}", p.reason);
    assert_eq!(p.topology_met, Some(TopologyLevel::Zone), "{}", p.reason);
    assert_eq!(by_name(&plan.gangs, "w").status, GangStatus::Pending);
}

#[test]
fn inference_spread_over_every_node_is_packed_again_to_free_one_for_a_gang() {
    // 6 replicas on 16 GPUs: however inference alone spreads them, moving
    // some frees a whole node for an equal-priority 1 × 8 gang, and no
    // replica is lost.
    let c = topo_cluster(vec![
        (
            "n0",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..3).map(|i| (i, "m")).collect(),
        ),
        (
            "n1",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..3).map(|i| (i, "m")).collect(),
        ),
    ]);
    let models = vec![whole_model("m", Priority::Standard, 1)];
    let plan = joint_plan(
        &c,
        &models,
        &[job("train", simple(1, 8, TopologyLevel::Node))],
        &[("m", 6)],
    );
    assert_never_shared(&plan);
    assert_eq!(
        plan.gangs[0].status,
        GangStatus::Starting,
        "{:#?}",
        plan.gangs
    );
    assert_eq!(plan.models[0].placed, 6);
    assert!(plan.gangs[0].preempts.is_empty());
}

#[test]
fn of_two_gangs_that_cannot_both_move_inference_the_first_starts_and_the_second_reserves() {
    // Two 8-GPU nodes; a sheddable model at its minimum of 3 runs on both
    // (2 + 1). Two critical 1 × 8 gangs: together they would leave the
    // model no GPU, so one starts (the model's replica on its node moves)
    // and the other waits with a reservation at the first one's end.
    // Before, neither started nor reserved anything.
    let c = topo_cluster(vec![
        (
            "n0",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            vec![(0, "m"), (1, "m")],
        ),
        ("n1", "H100-80GB", 8, "r0", "z0", None, vec![(0, "m")]),
    ]);
    let models = vec![whole_model("m", Priority::Sheddable, 3)];
    let jobs = [
        job(
            "a",
            ranked(Priority::Critical, simple(1, 8, TopologyLevel::Node)),
        ),
        job(
            "b",
            ranked(Priority::Critical, simple(1, 8, TopologyLevel::Node)),
        ),
    ];
    for running in [true, false] {
        let cluster = if running {
            c.clone()
        } else {
            common::cluster(&[("n0", "H100-80GB", 8), ("n1", "H100-80GB", 8)])
        };
        let plan = joint_plan(&cluster, &models, &jobs, &[("m", 3)]);
        assert_never_shared(&plan);
        assert_eq!(plan.models[0].placed, 3, "the minimum is kept");
        let starting: Vec<&GangPlan> = plan
            .gangs
            .iter()
            .filter(|g| g.status == GangStatus::Starting)
            .collect();
        assert_eq!(starting.len(), 1, "running {running}: {:#?}", plan.gangs);
        let waiting = plan
            .gangs
            .iter()
            .find(|g| g.status == GangStatus::Pending)
            .expect("the other gang waits");
        assert!(
            waiting.start_s.is_some() && !waiting.reserved.is_empty(),
            "running {running}: the waiting gang has a reservation: {waiting:#?}"
        );
    }
}

#[test]
fn a_running_gang_keeps_its_gpus_and_a_replan_from_the_plan_changes_nothing() {
    let c = common::cluster(&[("n0", "H100-80GB", 8), ("n1", "H100-80GB", 8)]);
    let models = vec![whole_model("m", Priority::Standard, 1)];
    let jobs = vec![job("train", simple(1, 8, TopologyLevel::Node))];
    let demand = common::demand(&[("m", 4)]);
    let first = joint::plan(&c, &models, training(&jobs), &demand, &quick(), None).unwrap();
    assert_eq!(first.gangs[0].status, GangStatus::Starting);
    let again = joint::plan(
        &first.apply_to(&c),
        &models,
        training(&jobs),
        &demand,
        &quick(),
        None,
    )
    .unwrap();
    assert_eq!(again.gangs[0].status, GangStatus::Running);
    assert_eq!(gpus_of(&again.gangs[0]), gpus_of(&first.gangs[0]));
    assert_eq!(again.moves, 0);
}

#[test]
fn a_gang_over_more_nodes_than_a_kueue_workload_has_podsets_takes_eight_pod_shapes() {
    // Thirteen 4-GPU workers on thirteen half-free nodes.
    let names: Vec<String> = (0..13).map(|i| format!("n{i:02}")).collect();
    let c = topo_cluster(
        names
            .iter()
            .map(|n| (n.as_str(), "H100-80GB", 8, "r0", "z0", None, vec![]))
            .collect(),
    );
    let mut free = all_free(&c);
    for gpus in free.free.values_mut() {
        gpus.retain(|&g| g >= 4);
    }
    let jobs = [job("wide", simple(13, 4, TopologyLevel::Zone))];
    let held = gang::running(&c, &jobs);
    let g = gang::place(&c, &jobs, &held, &free, &q0(), &GangOptions::default())
        .gangs
        .remove(0);
    assert_eq!(g.status, GangStatus::Starting, "{g:#?}");
    let planned: BTreeSet<&str> = g.workers.iter().map(|w| w.node.as_str()).collect();
    assert_eq!(planned.len(), 13, "one worker per node: {g:#?}");
    let docs = artefacts::kubernetes(&g, "ml", artefacts::GangScheduler::Coscheduling);
    // Kueue's role hash: labels other than its own, and the spec.
    let mut shapes: BTreeMap<String, Vec<Vec<String>>> = BTreeMap::new();
    for (d, w) in docs[1..].iter().zip(&g.workers) {
        let template = &d["template"];
        let nodes: Vec<String> = template["spec"]["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchFields"][0]["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert!(
            nodes.contains(&w.node),
            "worker {} may start where planned",
            w.worker
        );
        assert_eq!(
            template["metadata"]["annotations"]
                .get("gpuscale.io/gpus")
                .is_some(),
            nodes.len() == 1,
            "only a worker pinned to one node names its GPU indices"
        );
        let mut labels = template["metadata"]["labels"].clone();
        labels
            .as_object_mut()
            .unwrap()
            .retain(|k, _| !k.starts_with("kueue.x-k8s.io/"));
        let shape = format!("{labels}{}", template["spec"]);
        shapes.entry(shape).or_default().push(nodes);
    }
    assert_eq!(shapes.len(), artefacts::KUEUE_MAX_PODSETS);
    // The groups split the nodes, two or one each, and each holds as many
    // workers as it has nodes (one planned per node).
    let mut covered = BTreeSet::new();
    for workers in shapes.values() {
        let group = &workers[0];
        assert!(workers.iter().all(|n| n == group));
        assert!((1..=2).contains(&group.len()), "{group:?}");
        assert_eq!(workers.len(), group.len());
        for n in group {
            assert!(covered.insert(n.clone()), "{n} in two groups");
        }
    }
    assert_eq!(covered.len(), 13);
}

#[test]
fn artefacts_name_the_group_the_nodes_and_the_slurm_equivalent() {
    let c = topo_cluster(vec![
        ("a0", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("a1", "H100-80GB", 8, "r0", "z0", None, vec![]),
    ]);
    let gangs = place(&c, &[job("g", simple(2, 8, TopologyLevel::Rack))]);
    let docs = artefacts::kubernetes(&gangs[0], "ml", artefacts::GangScheduler::Coscheduling);
    assert_eq!(docs[0]["kind"], "PodGroup");
    assert_eq!(docs[0]["apiVersion"], "scheduling.x-k8s.io/v1alpha1");
    assert_eq!(docs[0]["spec"]["minMember"], 2);
    assert_eq!(docs.len(), 3);
    // Without a worker template, each worker's placement is a PodTemplate.
    assert!(docs[1..].iter().all(|d| d["kind"] == "PodTemplate"));
    let nodes: BTreeSet<&str> = docs[1..]
        .iter()
        .map(|d| {
            d["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(nodes, BTreeSet::from(["a0", "a1"]));
    assert_eq!(
        docs[1]["template"]["metadata"]["annotations"]["kueue.x-k8s.io/podset-required-topology"],
        "gpuscale.io/rack"
    );
    // Nodes with no rack are racks of their own to gpuscale and in no
    // rack to Kueue, which places by the label: no annotation there (the
    // pinned workers meet the level anyway).
    let mut bare = c.clone();
    for n in &mut bare.nodes {
        n.rack = None;
    }
    let alone = place(&bare, &[job("g", simple(1, 8, TopologyLevel::Rack))]);
    let lone = artefacts::kubernetes(&alone[0], "ml", artefacts::GangScheduler::Coscheduling);
    assert_eq!(lone.len(), 2);
    let annotations = &lone[1]["template"]["metadata"]["annotations"];
    assert!(
        annotations
            .get("kueue.x-k8s.io/podset-required-topology")
            .is_none(),
        "{annotations}"
    );
    assert_eq!(
        docs[1]["template"]["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"],
        "g"
    );
    // Kueue's plain-Pod group: its name and size, on every worker.
    for d in &docs[1..] {
        assert_eq!(
            d["template"]["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"],
            "g"
        );
        assert_eq!(
            d["template"]["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"],
            "2"
        );
    }
    let volcano = artefacts::kubernetes(&gangs[0], "ml", artefacts::GangScheduler::Volcano);
    assert_eq!(volcano[0]["apiVersion"], "scheduling.volcano.sh/v1beta1");
    assert_eq!(volcano[0]["spec"]["minResources"]["nvidia.com/gpu"], "16");
    // A gang still waiting: its PodGroup alone, reserving nothing in
    // Volcano's queue (an Inqueue group holds its minResources).
    let mut waiting = gangs[0].clone();
    waiting.status = GangStatus::Pending;
    let pending = artefacts::kubernetes(&waiting, "ml", artefacts::GangScheduler::Volcano);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["spec"]["minMember"], 2);
    assert!(
        pending[0]["spec"].get("minResources").is_none(),
        "{}",
        pending[0]
    );
    assert_eq!(volcano[1]["template"]["spec"]["schedulerName"], "volcano");
    let s = artefacts::sbatch(&gangs[0]).unwrap();
    for line in [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks=2",
        "#SBATCH --gres=gpu:8",
        "#SBATCH --nodelist=a0,a1",
        "#SBATCH --wait-all-nodes=1",
        "#SBATCH --time=10:00:00",
    ] {
        assert!(s.contains(line), "{line} missing from\n{s}");
    }
    // No queue: no partition; no account given: none.
    assert!(
        !s.contains("--partition") && !s.contains("--account"),
        "{s}"
    );
    let mut g = gangs[0].clone();
    g.slurm_partition = Some("training".into());
    g.account = Some("nlp".into());
    let s = artefacts::sbatch(&g).unwrap();
    assert!(s.contains("#SBATCH --partition=training\n"), "{s}");
    assert!(s.contains("#SBATCH --account=nlp\n"), "{s}");
}

/// A job with a worker template, as a user writes it: its own node
/// affinity term (a zone), a sidecar, GPUs asked for on the second
/// container, labels of its own.
const TEMPLATED: &str = r#"
workers: 2
gpusPerWorker: 8
gpuModels: [H100-80GB]
topology: {level: rack, mode: required}
template:
  metadata:
    labels: {app: trainer}
  spec:
    affinity:
      nodeAffinity:
        requiredDuringSchedulingIgnoredDuringExecution:
          nodeSelectorTerms:
          - matchExpressions:
            - {key: topology.kubernetes.io/zone, operator: In, values: [z0]}
    containers:
    - name: log-shipper
      image: fluent-bit:3
    - name: trainer
      image: registry.example/trainer:1.2
      command: [torchrun, train.py]
      resources:
        limits: {nvidia.com/gpu: 8, memory: 200Gi}
"#;

#[test]
fn a_job_with_a_worker_template_gets_one_complete_pod_per_worker() {
    use k8s_openapi::api::core::v1::{Pod, PodTemplate};
    let c = topo_cluster(vec![
        ("a0", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("a1", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("b0", "H100-80GB", 8, "r1", "z1", None, vec![]),
    ]);
    let spec: TrainingJobSpec = serde_yaml_ng::from_str(TEMPLATED).unwrap();
    let j = TrainingJob::from_spec("t", &spec, &Catalog::builtin()).expect("valid job");
    let gangs = place(&c, &[j, job("bare", simple(1, 8, TopologyLevel::Node))]);
    let t = by_name(&gangs, "t");
    let files = artefacts::files(&gangs, "ml", artefacts::GangScheduler::Coscheduling).unwrap();
    let text = &files.iter().find(|(p, _)| p == "gangs/t.yaml").unwrap().1;
    // The file kubectl applies: the PodGroup, then two Pods, each a
    // valid core/v1 Pod.
    let docs: Vec<serde_json::Value> = serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde_json::Value::deserialize(d).unwrap())
        .collect();
    assert_eq!(docs.len(), 3);
    assert_eq!(docs[0]["kind"], "PodGroup");
    let mut nodes = BTreeSet::new();
    for (i, d) in docs[1..].iter().enumerate() {
        let pod: Pod = serde_json::from_value(d.clone()).expect("a core/v1 Pod");
        assert_eq!(d["apiVersion"], "v1");
        assert_eq!(d["kind"], "Pod");
        let meta = &pod.metadata;
        assert_eq!(meta.name.as_deref(), Some(format!("t-worker-{i}").as_str()));
        assert_eq!(meta.namespace.as_deref(), Some("ml"));
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels["app"], "trainer", "the template's labels stay");
        // The worker's number is an annotation: Kueue makes one PodSet
        // per distinct pod shape, labels included (at most 8).
        assert!(!labels.contains_key("gpuscale.io/worker"));
        assert_eq!(
            meta.annotations.as_ref().unwrap()["gpuscale.io/worker"],
            i.to_string()
        );
        assert_eq!(labels["scheduling.x-k8s.io/pod-group"], "t");
        let spec = pod.spec.unwrap();
        assert_eq!(
            spec.scheduler_name.as_deref(),
            Some("scheduler-plugins-scheduler")
        );
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        // The template's zone term and the planned node (by its name, a
        // field), ANDed in one term.
        let terms = spec
            .affinity
            .unwrap()
            .node_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        let exprs = terms[0].match_expressions.as_ref().unwrap();
        assert_eq!(exprs.len(), 1);
        assert_eq!(exprs[0].key, "topology.kubernetes.io/zone");
        let fields = terms[0].match_fields.as_ref().unwrap();
        assert_eq!(fields.len(), 1);
        assert_eq!(fields[0].key, "metadata.name");
        let node = fields[0].values.as_ref().unwrap()[0].clone();
        assert_eq!(node, t.workers[i].node);
        nodes.insert(node);
        // GPUs on the container that asked for them; the sidecar has none.
        assert_eq!(spec.containers.len(), 2);
        assert!(spec.containers[0].resources.is_none());
        let limits = spec.containers[1]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap();
        assert_eq!(limits["nvidia.com/gpu"].0, "8");
        assert_eq!(limits["memory"].0, "200Gi");
        assert_eq!(
            spec.containers[1].image.as_deref(),
            Some("registry.example/trainer:1.2")
        );
    }
    assert_eq!(nodes, BTreeSet::from(["a0".to_string(), "a1".to_string()]));
    // A job without a template: PodTemplates, valid core/v1 objects too.
    let bare = artefacts::kubernetes(
        by_name(&gangs, "bare"),
        "ml",
        artefacts::GangScheduler::Volcano,
    );
    assert_eq!(bare.len(), 2);
    let pt: PodTemplate = serde_json::from_value(bare[1].clone()).expect("a core/v1 PodTemplate");
    let tspec = pt.template.unwrap().spec.unwrap();
    assert_eq!(tspec.scheduler_name.as_deref(), Some("volcano"));
    // Stored as it is written: the API server would default a template's
    // policy to `Always`, and a bare worker must not train again.
    assert_eq!(tspec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        tspec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["nvidia.com/gpu"]
            .0,
        "8"
    );
}

#[test]
fn worker_templates_that_fight_the_placement_are_refused() {
    let with = |template: &str| {
        let y = format!("workers: 1\ngpusPerWorker: 4\ntemplate:\n{template}");
        let spec: TrainingJobSpec = serde_yaml_ng::from_str(&y).unwrap();
        match TrainingJob::from_spec("j", &spec, &Catalog::builtin()) {
            Ok(_) => Vec::new(),
            Err(e) => e.into_iter().map(|e| e.path).collect::<Vec<_>>(),
        }
    };
    assert_eq!(with("  metadata: {labels: {a: b}}"), ["spec.template.spec"]);
    assert_eq!(
        with("  spec: {containers: []}"),
        ["spec.template.spec.containers"]
    );
    assert_eq!(
        with("  spec: {containers: [{name: w}]}"),
        ["spec.template.spec.containers[0].image"]
    );
    assert_eq!(
        with("  spec: {nodeName: n1, containers: [{name: w, image: i}]}"),
        ["spec.template.spec.nodeName"]
    );
    assert_eq!(
        with("  spec: {restartPolicy: Always, containers: [{name: w, image: i}]}"),
        ["spec.template.spec.restartPolicy"]
    );
    assert_eq!(
        with(
            "  spec: {containers: [{name: w, image: i, resources: {limits: {nvidia.com/gpu: 8}}}]}"
        ),
        ["spec.template.spec.containers[0].resources.limits.nvidia.com/gpu"]
    );
    assert_eq!(
        with(
            "  spec: {containers: [{name: a, image: i, resources: {limits: {nvidia.com/gpu: 4}}}, \
             {name: b, image: i, resources: {requests: {nvidia.com/gpu: 4}}}]}"
        ),
        ["spec.template.spec.containers[1].resources"]
    );
    assert!(
        with(
            "  spec: {containers: [{name: w, image: i, resources: {limits: {nvidia.com/gpu: 4}}}]}"
        )
        .is_empty()
    );
    // What the API server refuses (a restart policy it does not know,
    // container names that are not DNS-1123 labels or are taken twice, a
    // label key with a space), a device the plan did not count (a MIG
    // slice, GPUs on an init container), the keys the placement sets (a
    // stale group would put the worker in another gang), and required
    // rules about other pods that the pinned workers could not meet.
    assert_eq!(
        with("  spec: {restartPolicy: Sometimes, containers: [{name: w, image: i}]}"),
        ["spec.template.spec.restartPolicy"]
    );
    assert_eq!(
        with(
            "  spec: {containers: [{name: Bad_Name, image: i}, {name: c, image: i}, {name: c, image: i}]}"
        ),
        [
            "spec.template.spec.containers[0].name",
            "spec.template.spec.containers[2].name"
        ]
    );
    assert_eq!(
        with(
            "  metadata: {labels: {\"bad key\": x, gpuscale.io/worker: \"7\"}, annotations: {scheduling.k8s.io/group-name: other}}\n  spec: {containers: [{name: w, image: i}]}"
        ),
        [
            "spec.template.metadata.labels.bad key",
            "spec.template.metadata.labels.gpuscale.io/worker",
            "spec.template.metadata.annotations.scheduling.k8s.io/group-name"
        ]
    );
    assert_eq!(
        with(
            "  spec: {initContainers: [{name: i, image: i, resources: {limits: {nvidia.com/gpu: 1}}}], \
             containers: [{name: w, image: i, resources: {limits: {nvidia.com/mig-1g.10gb: 1}}}]}"
        ),
        [
            "spec.template.spec.initContainers[0].resources.limits.nvidia.com/gpu",
            "spec.template.spec.containers[0].resources.limits.nvidia.com/mig-1g.10gb"
        ]
    );
    let anti = "  spec:\n    containers: [{name: w, image: i}]\n    affinity: {podAntiAffinity: {requiredDuringSchedulingIgnoredDuringExecution: [{topologyKey: kubernetes.io/hostname, labelSelector: {matchLabels: {app: t}}}]}}\n    topologySpreadConstraints: [{maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule}]";
    assert_eq!(
        with(anti),
        [
            "spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution",
            "spec.template.spec.topologySpreadConstraints[0].whenUnsatisfiable"
        ]
    );
    // Node rules as the API server validates them: an empty term (it
    // matches no node, and used to be read as any), operators with the
    // values they take, fields only `metadata.name` In/NotIn one value.
    let terms = |t: &str| {
        format!(
            "  spec:\n    containers: [{{name: w, image: i}}]\n    affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: {{nodeSelectorTerms: {t}}}}}}}"
        )
    };
    let base = "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
    assert_eq!(with(&terms("[]")), [base.to_string()]);
    assert_eq!(
        with(&terms(
            "[{}, {matchExpressions: [{key: pool, operator: In, values: [a]}]}]"
        )),
        [format!("{base}[0]")]
    );
    assert_eq!(
        with(&terms(
            "[{matchExpressions: [{key: a, operator: Exists, values: [x]}, {key: b, operator: Gt, values: ['7', '8']}, {key: c, operator: In, values: []}, {key: d, operator: Foo}], matchFields: [{key: metadata.name, operator: In, values: [x, y]}, {key: spec.unschedulable, operator: In, values: ['true']}]}]"
        )),
        [
            format!("{base}[0].matchExpressions[0].operator"),
            format!("{base}[0].matchExpressions[1].operator"),
            format!("{base}[0].matchExpressions[2].operator"),
            format!("{base}[0].matchExpressions[3].operator"),
            format!("{base}[0].matchFields[0].operator"),
            format!("{base}[0].matchFields[1].key"),
        ]
    );
    // The job's own namespace says where its pods go; Kueue's role hash
    // would regroup them; an empty nodeName is no node (the API server
    // reads it as unset).
    assert_eq!(
        with(
            "  metadata: {namespace: other, annotations: {kueue.x-k8s.io/role-hash: x}}\n  spec: {nodeName: \"\", containers: [{name: w, image: i}]}"
        ),
        [
            "spec.template.metadata.namespace",
            "spec.template.metadata.annotations.kueue.x-k8s.io/role-hash"
        ]
    );
    // Two workers may share a node, where a host port lets one start.
    let ported = |workers: u32| {
        let y = format!(
            "workers: {workers}\ngpusPerWorker: 4\ntemplate:\n  spec: {{containers: [{{name: w, image: i, ports: [{{containerPort: 29500, hostPort: 29500}}]}}]}}"
        );
        let spec: TrainingJobSpec = serde_yaml_ng::from_str(&y).unwrap();
        TrainingJob::from_spec("j", &spec, &Catalog::builtin())
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.path)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ported(2),
        ["spec.template.spec.containers[0].ports[0].hostPort"]
    );
    assert!(ported(1).is_empty());
    // Preferred rules only score nodes: kept.
    assert!(
        with(&anti
            .replace("requiredDuringSchedulingIgnoredDuringExecution: [{", "preferredDuringSchedulingIgnoredDuringExecution: [{weight: 1, podAffinityTerm: {")
            .replace("{app: t}}}]}}", "{app: t}}}}]}}")
            .replace("DoNotSchedule", "ScheduleAnyway"))
        .is_empty()
    );
}

#[test]
fn a_templates_node_rules_choose_among_the_nodes_gpuscale_knows() {
    // kube-scheduler's rules on the labels the cluster gives: the
    // nodeSelector (all of it) and the required node affinity (any term),
    // evaluated on each node's labels, name, zone, rack and GPU product;
    // a label every node carries and gpuscale does not track is met.
    let mut c = topo_cluster(vec![
        ("a0", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("a1", "H100-80GB", 8, "r1", "z0", None, vec![]),
        ("b0", "H100-80GB", 8, "r2", "z1", None, vec![]),
        ("b1", "H100-80GB", 8, "r3", "z1", None, vec![]),
    ]);
    for n in &mut c.nodes {
        if n.name != "a0" {
            n.labels.insert("pool".into(), "train".into());
        }
    }
    let with = |template: &str| {
        let y = format!(
            "workers: 1\ngpusPerWorker: 8\ngpuModels: [H100-80GB]\ntemplate:\n  spec:\n    containers: [{{name: w, image: i}}]\n{template}"
        );
        let spec: TrainingJobSpec = serde_yaml_ng::from_str(&y).unwrap();
        let j = TrainingJob::from_spec("j", &spec, &Catalog::builtin()).expect("valid job");
        q0().allowed_nodes(&c, &j)
            .into_iter()
            .map(|n| c.nodes[n].name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        with("    nodeSelector: {pool: train, kubernetes.io/os: linux}"),
        ["a1", "b0", "b1"]
    );
    let terms = |t: &str| {
        format!(
            "    affinity: {{nodeAffinity: {{requiredDuringSchedulingIgnoredDuringExecution: {{nodeSelectorTerms: {t}}}}}}}"
        )
    };
    // Terms are ORed, a term's expressions ANDed.
    assert_eq!(
        with(&terms(
            "[{matchExpressions: [{key: topology.kubernetes.io/zone, operator: In, values: [z1]}, {key: gpuscale.io/rack, operator: NotIn, values: [r2]}]}, {matchFields: [{key: metadata.name, operator: In, values: [a0]}]}]"
        )),
        ["a0", "b1"]
    );
    assert_eq!(
        with(&terms(
            "[{matchExpressions: [{key: pool, operator: DoesNotExist}, {key: nvidia.com/gpu.product, operator: In, values: [NVIDIA-H100-80GB-HBM3]}]}]"
        )),
        ["a0"]
    );
    // And the job waits where no node meets them, placed nowhere else.
    let y = "workers: 1\ngpusPerWorker: 8\ngpuModels: [H100-80GB]\ntemplate:\n  spec:\n    containers: [{name: w, image: i}]\n    nodeSelector: {pool: train}\n";
    let spec: TrainingJobSpec = serde_yaml_ng::from_str(y).unwrap();
    let j = TrainingJob::from_spec("j", &spec, &Catalog::builtin()).unwrap();
    let gangs = place(&c, &[j]);
    assert!(
        gangs[0].workers.iter().all(|w| w.node != "a0"),
        "{gangs:#?}"
    );
}

#[test]
fn a_jobs_namespace_is_where_its_objects_go() {
    let c = topo_cluster(vec![("a0", "H100-80GB", 8, "r0", "z0", None, vec![])]);
    let mut j = job("t", simple(1, 8, TopologyLevel::Node));
    j.namespace = Some("team-ml".into());
    let gangs = place(&c, &[j, job("u", simple(1, 8, TopologyLevel::Node))]);
    for (name, ns) in [("t", "team-ml"), ("u", "ml")] {
        for d in artefacts::kubernetes(
            by_name(&gangs, name),
            "ml",
            artefacts::GangScheduler::Coscheduling,
        ) {
            assert_eq!(d["metadata"]["namespace"], ns, "{d}");
        }
    }
}

#[test]
fn slurm_gets_the_planned_hosts_of_an_uneven_gang_and_never_an_unlimited_time() {
    let mut g = GangPlan {
        name: "w3".into(),
        workers_wanted: 3,
        gpus_per_worker: 3,
        status: GangStatus::Starting,
        estimated_runtime_s: Some(0),
        ..GangPlan::default()
    };
    for (w, node) in ["a-0", "a-0", "a-1"].into_iter().enumerate() {
        g.workers.push(gang::Worker {
            worker: w as u32,
            node: node.into(),
            gpus: vec![0, 1, 2],
        });
    }
    let s = artefacts::sbatch(&g).unwrap();
    // Two workers on a-0 and one on a-1: a heterogeneous job of two
    // components, each with its nodes and its tasks per node, and no
    // host file (sbatch ignores SLURM_HOSTFILE beside --nodelist).
    let components: Vec<&str> = s.split("#SBATCH hetjob\n").collect();
    assert_eq!(components.len(), 2, "{s}");
    for (component, lines) in components.iter().zip([
        [
            "#SBATCH --nodes=1\n",
            "#SBATCH --ntasks=2\n",
            "#SBATCH --ntasks-per-node=2\n",
            "#SBATCH --gres=gpu:6\n",
            "#SBATCH --nodelist=a-0\n",
        ],
        [
            "#SBATCH --nodes=1\n",
            "#SBATCH --ntasks=1\n",
            "#SBATCH --ntasks-per-node=1\n",
            "#SBATCH --gres=gpu:3\n",
            "#SBATCH --nodelist=a-1\n",
        ],
    ]) {
        for line in lines {
            assert!(component.contains(line), "{line} missing from\n{component}");
        }
        assert!(
            component.contains("#SBATCH --gpus-per-task=3\n"),
            "{component}"
        );
        // `--time=0` is no limit to Slurm: a sub-minute estimate is a minute.
        assert!(
            component.contains("#SBATCH --time=0:01:00\n"),
            "{component}"
        );
    }
    assert!(s.contains("srun --het-group=0-1"), "{s}");
    assert!(
        !s.contains("arbitrary") && !s.contains("SLURM_HOSTFILE"),
        "{s}"
    );
    // Equal workers per node: one component.
    let mut even = g.clone();
    even.workers[2].node = "a-1".into();
    even.workers.push(gang::Worker {
        worker: 3,
        node: "a-1".into(),
        gpus: vec![3, 4, 5],
    });
    let s = artefacts::sbatch(&even).unwrap();
    assert!(!s.contains("hetjob"), "{s}");
    assert!(
        s.contains("#SBATCH --ntasks-per-node=2\n") && s.contains("#SBATCH --nodelist=a-0,a-1\n"),
        "{s}"
    );
}

/// A node that may run HAMi and now holds a gang's worker gets HAMi's
/// labels taken off in node-labels.yaml, like any HAMi-capable node the
/// plan does not use for it (an earlier plan may have set them).
#[test]
fn a_gangs_node_that_may_run_hami_has_hamis_labels_removed() {
    let c = common::cluster_allowing(
        &[("a", "H100-80GB", 8), ("b", "H100-80GB", 8)],
        &[SharingMode::Whole, SharingMode::Fractional],
    );
    let jobs = vec![job("train", simple(1, 8, TopologyLevel::Node))];
    let plan = joint_plan(&c, &[], &jobs, &[]);
    let g = by_name(&plan.gangs, "train");
    assert_eq!(g.status, GangStatus::Starting);
    let files = gpuscale_packer::emit::files(&plan, "gpu-operator").unwrap();
    let text = &files
        .iter()
        .find(|(p, _)| p == "node-labels.yaml")
        .unwrap()
        .1;
    let labels: BTreeMap<String, BTreeMap<String, Option<String>>> =
        serde_yaml_ng::from_str(text).unwrap();
    for node in ["a", "b"] {
        assert_eq!(labels[node].get("gpu"), Some(&None), "{node}: {text}");
        assert_eq!(
            labels[node].get("nvidia.com/gpu.deploy.device-plugin"),
            Some(&Some("true".to_string())),
            "{node}: {text}"
        );
    }
}

// Random clusters and jobs: what every placement must hold.
fn arb_case() -> impl Strategy<Value = (Cluster, Vec<TrainingJob>, Inventory)> {
    let node = (
        prop_oneof![Just(2u32), Just(4), Just(8)],
        0..2usize,
        0..2usize,
        prop::collection::vec(any::<bool>(), 8),
        any::<bool>(),
    );
    let jobdef = (
        1..4u32,
        prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
        0..5usize,
        any::<bool>(),
        0..3usize,
        any::<bool>(),
    );
    (
        prop::collection::vec(node, 1..7),
        prop::collection::vec(jobdef, 1..5),
    )
        .prop_map(|(nodes, jobdefs)| {
            let racks = ["r0", "r1"];
            let zones = ["z0", "z1"];
            let names: Vec<String> = (0..nodes.len()).map(|i| format!("n{i}")).collect();
            let defs: Vec<NodeDef<'_>> = nodes
                .iter()
                .enumerate()
                .map(|(i, (count, r, z, _, a100))| {
                    (
                        names[i].as_str(),
                        if *a100 { "A100-40GB" } else { "H100-80GB" },
                        *count,
                        racks[*r],
                        zones[*z],
                        None,
                        vec![],
                    )
                })
                .collect();
            let c = topo_cluster(defs);
            let mut inv = Inventory::default();
            for (i, (count, _, _, free, _)) in nodes.iter().enumerate() {
                let set: BTreeSet<u32> = (0..*count).filter(|&g| free[g as usize]).collect();
                inv.free.insert(i, set);
            }
            let levels = [
                TopologyLevel::Node,
                TopologyLevel::NvlinkDomain,
                TopologyLevel::Rack,
                TopologyLevel::Zone,
                TopologyLevel::Any,
            ];
            let prios = [Priority::Critical, Priority::Standard, Priority::Sheddable];
            let jobs = jobdefs
                .iter()
                .enumerate()
                .map(|(k, &(w, gpw, l, pref, p, any_model))| {
                    let level = levels[l];
                    let workers = if level == TopologyLevel::Node && !pref {
                        1
                    } else {
                        w
                    };
                    let mut j = job(
                        &format!("j{k}"),
                        J {
                            mode: if pref {
                                TopologyMode::Preferred
                            } else {
                                TopologyMode::Required
                            },
                            priority: prios[p],
                            ..simple(workers, gpw, level)
                        },
                    );
                    if any_model {
                        j.gpu_models = vec!["H100-80GB".into(), "A100-40GB".into()];
                    }
                    j
                })
                .collect();
            (c, jobs, inv)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn gangs_are_all_or_nothing_within_their_topology_on_free_gpus_never_shared(
        (c, jobs, inv) in arb_case()
    ) {
        let held = gang::running(&c, &jobs);
        let gangs = gang::place(&c, &jobs, &held, &inv, &q0(), &GangOptions::default()).gangs;
        prop_assert_eq!(gangs.len(), jobs.len());
        let mut used = BTreeSet::new();
        for g in &gangs {
            let j = jobs.iter().find(|j| j.name == g.name).unwrap();
            if !g.holds() {
                prop_assert!(g.workers.is_empty());
                continue;
            }
            // All or nothing: every worker, each its GPUs on one node.
            prop_assert_eq!(g.workers.len() as u32, j.spec.workers);
            for w in &g.workers {
                prop_assert_eq!(w.gpus.len() as u32, j.spec.gpus_per_worker);
                let n = c.nodes.iter().position(|n| n.name == w.node).unwrap();
                prop_assert!(j.gpu_models.contains(&c.nodes[n].gpu_model));
                for &i in &w.gpus {
                    prop_assert!(inv.free[&n].contains(&i), "GPU {}/{} was not free", w.node, i);
                    prop_assert!(used.insert((n, i)), "GPU {}/{} given twice", w.node, i);
                }
            }
            let models: BTreeSet<&str> = g
                .workers
                .iter()
                .map(|w| c.nodes.iter().find(|n| n.name == w.node).unwrap().gpu_model.as_str())
                .collect();
            prop_assert_eq!(models.len(), 1);
            // A required level holds.
            if j.spec.topology.mode == TopologyMode::Required {
                let nodes: BTreeSet<usize> = g
                    .workers
                    .iter()
                    .map(|w| c.nodes.iter().position(|n| n.name == w.node).unwrap())
                    .collect();
                let (met, _) = gang::met(&c, &nodes);
                prop_assert!(met <= j.spec.topology.level, "{:?} met {:?}", j.spec.topology.level, met);
            }
        }
    }

    #[test]
    fn a_lone_gang_with_room_anywhere_is_placed((c, jobs, inv) in arb_case()) {
        // One job, any topology: it starts exactly when the free GPUs of
        // some GPU model it allows hold its workers whole.
        let mut j = jobs[0].clone();
        j.spec.topology = Topology { level: TopologyLevel::Any, mode: TopologyMode::Required };
        let gpw = j.spec.gpus_per_worker;
        let room = j.gpu_models.iter().any(|m| {
            c.nodes
                .iter()
                .enumerate()
                .filter(|(_, n)| &n.gpu_model == m)
                .map(|(i, _)| inv.free.get(&i).map_or(0, |s| s.len() as u32) / gpw)
                .sum::<u32>()
                >= j.spec.workers
        });
        let gangs = gang::place(&c, std::slice::from_ref(&j), &BTreeMap::new(), &inv, &q0(), &GangOptions::default()).gangs;
        prop_assert_eq!(gangs[0].holds(), room, "{:?}", gangs[0]);
    }
}

fn at(q: &queue::Queue, offset_s: f64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + Duration::from_secs_f64(q.now + offset_s)
}

#[test]
fn backfill_starts_a_short_job_in_the_gap_and_never_delays_the_head_jobs_reservation() {
    // n0 runs `r` until now + 2 h; n1 is free. The head job `head` needs
    // both nodes for 5 h: reserved from now + 2 h. `short` (1 × 4, 1 h)
    // ends before that: it backfills on n1 now. `long` (1 × 4, 4 h) would
    // still hold n1 at now + 2 h: it waits, reserved after `head` ends
    // (now + 7 h), not before.
    let q = q0();
    let c = topo_cluster(vec![
        (
            "n0",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..8).map(|i| (i, "r")).collect(),
        ),
        ("n1", "H100-80GB", 8, "r0", "z0", None, vec![]),
    ]);
    let mut r = job("r", simple(1, 8, TopologyLevel::Node));
    r.spec.estimated_runtime = Some(Duration::from_secs(3 * 3600));
    r.spec.started_at = Some(at(&q, -3600.0));
    let mut head = job("head", simple(2, 8, TopologyLevel::Any));
    head.spec.estimated_runtime = Some(Duration::from_secs(5 * 3600));
    head.spec.submitted_at = Some(at(&q, -2.0 * 86_400.0));
    let mut short = job("short", simple(1, 4, TopologyLevel::Node));
    short.spec.estimated_runtime = Some(Duration::from_secs(3600));
    short.spec.submitted_at = Some(at(&q, -86_400.0));
    let mut long = job("long", simple(1, 4, TopologyLevel::Node));
    long.spec.estimated_runtime = Some(Duration::from_secs(4 * 3600));
    long.spec.submitted_at = Some(at(&q, -43_200.0));
    let jobs = vec![r, head, short, long];
    let gangs = place(&c, &jobs);

    let h = by_name(&gangs, "head");
    assert_eq!(h.status, GangStatus::Pending);
    assert_eq!(h.start_s, Some(q.now + 2.0 * 3600.0), "{}", h.reason);
    let nodes: Vec<(&str, u32)> = h
        .reserved
        .iter()
        .map(|r| (r.node.as_str(), r.gpus))
        .collect();
    assert_eq!(nodes, vec![("n0", 8), ("n1", 8)]);
    // A pending gang names the GPU model of its reservation.
    assert_eq!(h.gpu_model.as_deref(), Some("H100-80GB"));
    let s = by_name(&gangs, "short");
    assert_eq!(s.status, GangStatus::Starting, "{}", s.reason);
    assert_eq!(s.workers[0].node, "n1");
    assert!(s.reason.contains("backfilled"), "{}", s.reason);
    assert!(s.end_s.unwrap() <= h.start_s.unwrap());
    let l = by_name(&gangs, "long");
    assert_eq!(l.status, GangStatus::Pending);
    assert_eq!(l.start_s, Some(q.now + 7.0 * 3600.0), "{}", l.reason);
    // Priority order: age decides among equals here.
    assert!(h.priority_score > s.priority_score && s.priority_score > l.priority_score);
}

#[test]
fn a_partition_at_its_gpu_limit_makes_its_next_job_wait_and_keeps_to_its_nodes() {
    use gpuscale_policies::training::{Partition, TrainingQueueSpec};
    let c = topo_cluster(vec![
        ("n0", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("n1", "H100-80GB", 8, "r0", "z0", None, vec![]),
        ("n2", "H100-80GB", 8, "r0", "z0", None, vec![]),
    ]);
    let spec = TrainingQueueSpec {
        partitions: vec![Partition {
            name: "dev".into(),
            max_gpus: Some(8),
            max_runtime: Some(Duration::from_secs(4 * 3600)),
            default_runtime: None,
            gpu_models: vec![],
            nodes: vec!["n2".into(), "n1".into()],
            priority_tier: 0,
            default: true,
        }],
        ..Default::default()
    };
    let q = queue::Queue { spec, now: 1.8e9 };
    let jobs = vec![
        job("a", simple(1, 8, TopologyLevel::Node)),
        job("b", simple(1, 8, TopologyLevel::Node)),
    ];
    let held = gang::running(&c, &jobs);
    let gangs = gang::place(&c, &jobs, &held, &all_free(&c), &q, &GangOptions::default()).gangs;
    let started: Vec<&GangPlan> = gangs.iter().filter(|g| g.holds()).collect();
    assert_eq!(started.len(), 1);
    assert_ne!(
        started[0].workers[0].node, "n0",
        "n0 is not in the partition"
    );
    // Its runtime is capped by the partition's limit (10 h asked, 4 h
    // allowed; the loader rejects such a job file, see the policies tests).
    assert_eq!(started[0].end_s, Some(q.now + 4.0 * 3600.0));
    let w = gangs.iter().find(|g| !g.holds()).unwrap();
    assert!(
        w.reason.contains("partition `dev` GPU limit"),
        "{}",
        w.reason
    );
    assert_eq!(w.partition, "dev");
    // Slurm gets the partition and the runtime the queue planned with.
    let s = artefacts::sbatch(started[0]).unwrap();
    assert!(
        s.contains("#SBATCH --partition=dev\n") && s.contains("#SBATCH --time=4:00:00\n"),
        "{s}"
    );
    // A name that is not a single Slurm token (the loader refuses one; a
    // plan read back could carry one) is never written into a line.
    let mut forged = started[0].clone();
    forged.account = Some("nlp\necho INJECTED".into());
    forged.slurm_partition = Some("dev\n#SBATCH --exclusive".into());
    let s = artefacts::sbatch(&forged).unwrap();
    assert!(
        !s.contains("INJECTED") && !s.contains("--exclusive") && !s.contains("--account"),
        "{s}"
    );
    // A job without an estimate runs for its partition's defaultRuntime
    // (Slurm's DefaultTime) where it has one, not its maxRuntime.
    let mut spec = q.spec.clone();
    spec.partitions[0].default_runtime = Some(Duration::from_secs(2 * 3600));
    let dq = queue::Queue { spec, now: q.now };
    let mut lone = vec![job("a", simple(1, 8, TopologyLevel::Node))];
    lone[0].spec.estimated_runtime = None;
    let gangs = gang::place(
        &c,
        &lone,
        &held,
        &all_free(&c),
        &dq,
        &GangOptions::default(),
    )
    .gangs;
    assert_eq!(gangs[0].end_s, Some(q.now + 2.0 * 3600.0));
    let s = artefacts::sbatch(&gangs[0]).unwrap();
    assert!(s.contains("#SBATCH --time=2:00:00\n"), "{s}");
    // A partition called `default` is a partition like any other, and a
    // job without an estimate in a partition without a limit runs for
    // the queue's defaultRuntime (a day) as far as Slurm is told.
    let mut spec = q.spec.clone();
    spec.partitions[0].name = "default".into();
    spec.partitions[0].max_runtime = None;
    let q = queue::Queue { spec, now: q.now };
    let mut jobs = jobs;
    for j in &mut jobs {
        j.spec.estimated_runtime = None;
    }
    let gangs = gang::place(&c, &jobs, &held, &all_free(&c), &q, &GangOptions::default()).gangs;
    let g = gangs.iter().find(|g| g.holds()).unwrap();
    let s = artefacts::sbatch(g).unwrap();
    assert!(
        s.contains("#SBATCH --partition=default\n") && s.contains("#SBATCH --time=24:00:00\n"),
        "{s}"
    );
}

#[test]
fn fair_share_is_slurms_two_to_the_minus_usage_over_shares() {
    use gpuscale_policies::training::{Account, FairShare, TrainingQueueSpec};
    let spec = TrainingQueueSpec {
        fair_share: FairShare {
            accounts: vec![
                Account {
                    name: "nlp".into(),
                    shares: 1.0,
                    usage_gpu_hours: 300.0,
                },
                Account {
                    name: "vision".into(),
                    shares: 1.0,
                    usage_gpu_hours: 100.0,
                },
            ],
            ..Default::default()
        },
        ..Default::default()
    };
    // nlp: U = 0.75, S = 0.5 → 2^-1.5; vision: U = 0.25 → 2^-0.5; a team
    // not listed has no usage → 1.
    let f = |a| queue::fair_share(&spec, Some(a));
    assert!((f("nlp") - 2f64.powf(-1.5)).abs() < 1e-12);
    assert!((f("vision") - 2f64.powf(-0.5)).abs() < 1e-12);
    assert!((f("new-team") - 1.0).abs() < 1e-12);

    // With room for one of two equal jobs, vision's goes first.
    let q = queue::Queue { spec, now: 1.8e9 };
    let c = topo_cluster(vec![("n0", "H100-80GB", 8, "r0", "z0", None, vec![])]);
    let mut a = job("a-nlp", simple(1, 8, TopologyLevel::Node));
    a.spec.account = Some("nlp".into());
    let mut b = job("b-vision", simple(1, 8, TopologyLevel::Node));
    b.spec.account = Some("vision".into());
    let gangs = place_on_free(&c, &[a, b], &q);
    assert_eq!(by_name(&gangs, "b-vision").status, GangStatus::Starting);
    assert_eq!(by_name(&gangs, "a-nlp").status, GangStatus::Pending);
}

#[test]
fn the_runtime_weight_puts_the_longest_job_first_and_is_off_by_default() {
    use gpuscale_policies::training::{Partition, TrainingQueueSpec};
    // One 8-GPU node, two 8-GPU jobs: a 2-hour one submitted first and a
    // 12-hour one an hour later. By default the older job starts (age);
    // with `weights.runtime` the longer one does. The factor (README,
    // *Priority*) is the estimate over one scale for the queue, the
    // longest partition limit (a partition without one counting as the
    // queue's defaultRuntime), capped at 1; 0 without an estimate.
    let c = topo_cluster(vec![("n0", "H100-80GB", 8, "r0", "z0", None, vec![])]);
    let now = 1.8e9;
    let at = |s: f64| std::time::UNIX_EPOCH + Duration::from_secs_f64(s);
    let mut short = job("short", simple(1, 8, TopologyLevel::Node));
    short.spec.estimated_runtime = Some(Duration::from_secs(2 * 3600));
    short.spec.submitted_at = Some(at(now - 2.0 * 3600.0));
    let mut long = job("long", simple(1, 8, TopologyLevel::Node));
    long.spec.estimated_runtime = Some(Duration::from_secs(12 * 3600));
    long.spec.submitted_at = Some(at(now - 3600.0));
    let jobs = vec![short.clone(), long.clone()];
    let mut spec = TrainingQueueSpec {
        partitions: vec![Partition {
            max_runtime: Some(Duration::from_secs(24 * 3600)),
            default: true,
            ..Partition::new("training")
        }],
        ..Default::default()
    };
    assert_eq!(spec.weights.runtime, 0.0);
    let first = |spec: &TrainingQueueSpec| {
        let q = queue::Queue {
            spec: spec.clone(),
            now,
        };
        let starting: Vec<String> = place_on_free(&c, &jobs, &q)
            .iter()
            .filter(|g| g.status == GangStatus::Starting)
            .map(|g| g.name.clone())
            .collect();
        starting
    };
    assert_eq!(first(&spec), ["short"]);
    spec.weights.runtime = 1000.0;
    assert_eq!(first(&spec), ["long"]);
    let q = queue::Queue {
        spec: spec.clone(),
        now,
    };
    let p = |j: &TrainingJob| queue::priority(&q, j);
    let age = |hours: f64| 1000.0 * hours * 3600.0 / (7.0 * 86_400.0);
    assert!((p(&long) - (50_000.0 + 5_000.0 + age(1.0) + 1000.0 * 12.0 / 24.0)).abs() < 1e-6);
    assert!((p(&short) - (50_000.0 + 5_000.0 + age(2.0) + 1000.0 * 2.0 / 24.0)).abs() < 1e-6);
    // The scale is one for the whole queue: the longest partition limit.
    // With a 48-hour partition beside a 4-hour one, a 3-hour job in the
    // short partition ranks below a 12-hour job in the long one: 3/48
    // against 12/48 (a scale per partition would give the short job 3/4).
    spec.partitions[0].max_runtime = Some(Duration::from_secs(48 * 3600));
    let mut dev = spec.partitions[0].clone();
    dev.name = "dev".into();
    dev.default = false;
    dev.max_runtime = Some(Duration::from_secs(4 * 3600));
    dev.default_runtime = Some(Duration::from_secs(3600));
    spec.partitions.push(dev);
    assert_eq!(spec.runtime_scale(), Duration::from_secs(48 * 3600));
    assert!((spec.runtime_factor(&long) - 12.0 / 48.0).abs() < 1e-12);
    let mut in_dev = short.clone();
    in_dev.spec.partition = Some("dev".into());
    in_dev.spec.estimated_runtime = Some(Duration::from_secs(3 * 3600));
    assert!((spec.runtime_factor(&in_dev) - 3.0 / 48.0).abs() < 1e-12);
    // An estimate over its partition's limit counts at the limit (as the
    // queue schedules it): 6 h in dev is 4/48.
    let mut over = in_dev.clone();
    over.spec.estimated_runtime = Some(Duration::from_secs(6 * 3600));
    assert!((spec.runtime_factor(&over) - 4.0 / 48.0).abs() < 1e-12);
    // A job with no estimate scores 0, wherever its runtime for
    // scheduling comes from (dev's defaultRuntime, the long partition's
    // maxRuntime).
    let mut unknown = in_dev.clone();
    unknown.spec.estimated_runtime = None;
    assert_eq!(spec.runtime_of(&unknown), Duration::from_secs(3600));
    assert_eq!(spec.runtime_factor(&unknown), 0.0);
    let mut unknown_long = long.clone();
    unknown_long.spec.estimated_runtime = None;
    assert_eq!(spec.runtime_factor(&unknown_long), 0.0);
    // Every partition limited below the queue's defaultRuntime (24 h):
    // the scale is the longest limit, not the unreachable default, and
    // a partition's defaultRuntime does not count.
    spec.partitions[0].max_runtime = Some(Duration::from_secs(8 * 3600));
    spec.partitions[0].default_runtime = Some(Duration::from_secs(2 * 3600));
    assert_eq!(spec.runtime_scale(), Duration::from_secs(8 * 3600));
    assert!((spec.runtime_factor(&in_dev) - 3.0 / 8.0).abs() < 1e-12);
    // A partition without a limit counts as the queue's defaultRuntime
    // (here 30 h), the factor capped at 1 for a longer estimate.
    spec.partitions[0].max_runtime = None;
    spec.default_runtime = Duration::from_secs(30 * 3600);
    assert_eq!(spec.runtime_scale(), Duration::from_secs(30 * 3600));
    assert!((spec.runtime_factor(&long) - 12.0 / 30.0).abs() < 1e-12);
    let mut longer = long.clone();
    longer.spec.estimated_runtime = Some(Duration::from_secs(40 * 3600));
    assert!((spec.runtime_factor(&longer) - 1.0).abs() < 1e-12);
    // No partitions: over the queue's defaultRuntime (here 10 h), capped
    // at 1.
    spec.partitions.clear();
    spec.default_runtime = Duration::from_secs(10 * 3600);
    assert!((spec.runtime_factor(&short) - 0.2).abs() < 1e-12);
    assert!((spec.runtime_factor(&long) - 1.0).abs() < 1e-12);
}

/// The plan of `jobs` on a cluster with nothing running.
fn place_on_free(c: &Cluster, jobs: &[TrainingJob], q: &queue::Queue) -> Vec<GangPlan> {
    gang::place(
        c,
        jobs,
        &BTreeMap::new(),
        &all_free(c),
        q,
        &GangOptions::default(),
    )
    .gangs
}

fn arb_queue() -> impl Strategy<Value = (Cluster, Vec<TrainingJob>)> {
    // Nodes of 8 GPUs; running 1-node jobs filling some of them; pending
    // jobs of any shape, runtimes 1–10 h, submitted at random.
    let running = prop::collection::vec(
        (
            0..5usize,
            prop_oneof![Just(2u32), Just(4), Just(8)],
            1..10u64,
            0..5u64,
        ),
        0..6,
    );
    let pending = prop::collection::vec(
        (
            1..4u32,
            prop_oneof![Just(1u32), Just(2), Just(4), Just(8)],
            any::<bool>(),
            1..10u64,
            0..100u64,
            any::<bool>(),
        ),
        1..6,
    );
    (2..6usize, running, pending).prop_map(|(nodes, running, pending)| {
        let q = q0();
        let mut free: Vec<u32> = vec![8; nodes];
        let mut placed: Vec<(usize, u32, u64, u64)> = Vec::new();
        for (n, k, est, ago) in running {
            let n = n % nodes;
            if free[n] >= k {
                placed.push((n, k, est, ago));
                free[n] -= k;
            }
        }
        let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
        let run_names: Vec<String> = (0..placed.len()).map(|i| format!("run{i}")).collect();
        let mut next = vec![0u32; nodes];
        let mut on_node: Vec<Vec<(u32, &str)>> = vec![Vec::new(); nodes];
        for (i, &(n, k, _, _)) in placed.iter().enumerate() {
            for _ in 0..k {
                on_node[n].push((next[n], run_names[i].as_str()));
                next[n] += 1;
            }
        }
        let defs: Vec<NodeDef<'_>> = (0..nodes)
            .map(|i| {
                (
                    names[i].as_str(),
                    "H100-80GB",
                    8,
                    "r0",
                    "z0",
                    None,
                    on_node[i].clone(),
                )
            })
            .collect();
        let c = topo_cluster(defs);
        let mut jobs = Vec::new();
        for (i, &(_, k, est, ago)) in placed.iter().enumerate() {
            let mut j = job(&run_names[i], simple(1, k, TopologyLevel::Node));
            j.spec.estimated_runtime = Some(Duration::from_secs(est * 3600));
            j.spec.started_at = Some(at(&q, -((ago * 1800) as f64)));
            jobs.push(j);
        }
        for (i, &(w, gpw, node_level, est, age, critical)) in pending.iter().enumerate() {
            // Critical jobs may preempt the running (standard,
            // preemptible) ones.
            let level = if node_level {
                TopologyLevel::Node
            } else {
                TopologyLevel::Any
            };
            let mut j = job(
                &format!("p{i}"),
                J {
                    priority: if critical {
                        Priority::Critical
                    } else {
                        Priority::Standard
                    },
                    ..simple(if node_level { 1 } else { w }, gpw, level)
                },
            );
            j.spec.estimated_runtime = Some(Duration::from_secs(est * 3600));
            j.spec.submitted_at = Some(at(&q, -((age * 3600) as f64)));
            jobs.push(j);
        }
        (c, jobs)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn backfill_never_overcommits_a_node_at_any_time_and_never_delays_the_head_job((c, jobs) in arb_queue()) {
        let q = q0();
        let gangs = place(&c, &jobs);
        // Every commitment on a node over time: running jobs until their
        // end, starting ones from now, reservations from their start.
        let mut events: BTreeMap<String, Vec<(f64, i64)>> = BTreeMap::new();
        for g in &gangs {
            let (from, to) = match g.status {
                GangStatus::Running => (q.now, g.end_s.unwrap()),
                GangStatus::Starting => (g.start_s.unwrap(), g.end_s.unwrap()),
                _ => match (g.start_s, g.end_s) {
                    (Some(a), Some(b)) => (a, b),
                    _ => continue,
                },
            };
            let per: Vec<(String, i64)> = if g.holds() {
                g.workers.iter().map(|w| (w.node.clone(), w.gpus.len() as i64)).collect()
            } else {
                g.reserved.iter().map(|r| (r.node.clone(), i64::from(r.gpus))).collect()
            };
            for (n, k) in per {
                let e = events.entry(n).or_default();
                e.push((from, k));
                e.push((to, -k));
            }
        }
        for (node, mut e) in events {
            // Releases before takes at the same instant.
            e.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut used = 0;
            for (t, k) in e {
                used += k;
                prop_assert!(used <= 8, "node {} holds {} GPUs at {}", node, used, t - q.now);
            }
        }
        // The head of the queue (the most important job that waits) gets
        // the same reservation with or without the jobs below it.
        let head = gangs
            .iter()
            .filter(|g| g.status == GangStatus::Pending)
            .max_by(|a, b| a.priority_score.total_cmp(&b.priority_score));
        if let Some(h) = head {
            let above: Vec<TrainingJob> = jobs
                .iter()
                .filter(|j| {
                    j.spec.started_at.is_some()
                        || gangs.iter().any(|g| g.name == j.name && g.priority_score >= h.priority_score)
                })
                .cloned()
                .collect();
            let alone = place(&c, &above);
            prop_assert_eq!(by_name(&alone, &h.name).start_s, h.start_s);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn training_and_inference_never_share_a_gpu_and_minimums_hold(
        nodes in 1..4usize,
        wanted in 0..20u32,
        min in 0..4u32,
        prio in 0..3usize,
        jobs in prop::collection::vec((1..3u32, prop_oneof![Just(1u32), Just(4), Just(8)], 0..3usize), 1..4),
    ) {
        let prios = [Priority::Critical, Priority::Standard, Priority::Sheddable];
        let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
        let defs: Vec<(&str, &str, u32)> = names.iter().map(|n| (n.as_str(), "H100-80GB", 8)).collect();
        let c = common::cluster(&defs);
        let models = vec![whole_model("m", prios[prio], min)];
        let jobs: Vec<TrainingJob> = jobs
            .iter()
            .enumerate()
            .map(|(k, &(w, gpw, p))| {
                job(&format!("j{k}"), J { priority: prios[p], ..simple(w, gpw, TopologyLevel::Any) })
            })
            .collect();
        let demand = common::demand(&[("m", wanted.max(min))]);
        let alone = gpuscale_packer::pack(&c, &models, &demand, &quick()).unwrap();
        let plan = joint::plan(&c, &models, training(&jobs), &demand, &quick(), None).unwrap();
        assert_never_shared(&plan);
        // Inference keeps its minimum (as far as it fit alone), and loses
        // replicas only to a gang more important than the model.
        let before = alone.models[0].placed;
        let after = plan.models[0].placed;
        prop_assert!(after >= before.min(min), "{} < min({}, {})", after, before, min);
        if after < before {
            prop_assert!(plan.gangs.iter().any(|g| g.holds()
                && gang::rank(g.priority) > gang::rank(prios[prio])));
        }
        // Gangs hold whole workers only.
        for g in plan.gangs.iter().filter(|g| g.holds()) {
            prop_assert_eq!(g.gpus_held(), g.workers_wanted * g.gpus_per_worker);
        }
    }
}

#[test]
fn replicas_a_gang_displaces_are_counted_as_moves_and_a_cluster_without_models_plans() {
    // `m` runs 4 + 4 replicas on two nodes; a critical 1 × 8 gang takes a
    // node, and its 4 replicas move to the other's free GPUs.
    let c = topo_cluster(vec![
        (
            "n0",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..4).map(|i| (i, "m")).collect(),
        ),
        (
            "n1",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..4).map(|i| (i, "m")).collect(),
        ),
    ]);
    let models = vec![whole_model("m", Priority::Standard, 1)];
    let urgent = job(
        "urgent",
        ranked(Priority::Critical, simple(1, 8, TopologyLevel::Node)),
    );
    let plan = joint_plan(&c, &models, std::slice::from_ref(&urgent), &[("m", 8)]);
    assert_eq!(plan.gangs[0].status, GangStatus::Starting);
    assert_eq!(plan.models[0].placed, 8);
    assert_eq!(plan.moves, 4, "{:?}", plan.gangs[0].reason);

    // Training jobs alone: no model policy at all.
    let plan = joint::plan(
        &c,
        &[],
        training(std::slice::from_ref(&urgent)),
        &BTreeMap::new(),
        &quick(),
        None,
    )
    .unwrap();
    assert_eq!(plan.gangs[0].status, GangStatus::Starting);
    assert_eq!(plan.gpus_used, 0);
}

#[test]
fn a_job_below_a_reservation_never_preempts_its_way_onto_the_reserved_gpus() {
    // Node a runs `v` (standard, preemptible), node b runs `w` (not
    // preemptible); both end in an hour. `head` (critical, 2 × 8) cannot
    // start — it could preempt `v` but not `w` — so it is reserved a and b
    // from now + 1 h. `low` (critical too, younger, 10 h) could preempt `v`
    // and hold node a for 10 h, over `head`'s reservation: it must not.
    let q = q0();
    let c = topo_cluster(vec![
        (
            "a",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..8).map(|i| (i, "v")).collect(),
        ),
        (
            "b",
            "H100-80GB",
            8,
            "r0",
            "z0",
            None,
            (0..8).map(|i| (i, "w")).collect(),
        ),
    ]);
    let mut v = job("v", simple(1, 8, TopologyLevel::Node));
    v.spec.estimated_runtime = Some(Duration::from_secs(3600));
    v.spec.started_at = Some(at(&q, 0.0));
    let mut w = job(
        "w",
        J {
            preemptible: false,
            ..simple(1, 8, TopologyLevel::Node)
        },
    );
    w.spec.estimated_runtime = Some(Duration::from_secs(3600));
    w.spec.started_at = Some(at(&q, 0.0));
    let mut head = job(
        "head",
        ranked(Priority::Critical, simple(2, 8, TopologyLevel::Any)),
    );
    head.spec.submitted_at = Some(at(&q, -86_400.0));
    let mut low = job(
        "low",
        ranked(Priority::Critical, simple(1, 8, TopologyLevel::Node)),
    );
    low.spec.submitted_at = Some(at(&q, -3600.0));
    let gangs = place(&c, &[v, w, head, low]);
    assert_eq!(by_name(&gangs, "head").start_s, Some(q.now + 3600.0));
    assert_eq!(
        by_name(&gangs, "v").status,
        GangStatus::Running,
        "{gangs:#?}"
    );
    assert_eq!(by_name(&gangs, "low").status, GangStatus::Pending);
}

#[test]
fn a_gang_that_may_not_take_inference_gpus_after_all_leaves_no_gpu_held_twice() {
    // `p` (critical, 1 × 8) could preempt `v` (2 × 2 on a and b) and take
    // node a's 6 sheddable inference GPUs — but the model's minReplicas
    // are all it has, and the 2 GPUs `v` frees on b cannot hold them, so
    // the guard sends `p` back to wait. `v` runs on, and nothing else may
    // have been given `v`'s GPUs meanwhile.
    let q = q0();
    let run = |i: u32, j: &'static str| (i, j);
    let c = topo_cluster(vec![
        (
            "a",
            "H100-80GB",
            8,
            "r1",
            "z1",
            None,
            (0..2).map(|i| run(i, "v")).collect(),
        ),
        (
            "b",
            "H100-80GB",
            8,
            "r1",
            "z1",
            None,
            (0..8)
                .map(|i| run(i, if i < 2 { "v" } else { "w" }))
                .collect(),
        ),
        (
            "c",
            "H100-80GB",
            8,
            "r1",
            "z1",
            None,
            (0..8).map(|i| run(i, "w2")).collect(),
        ),
    ]);
    let started = |mut j: TrainingJob| {
        j.spec.started_at = Some(at(&q, -3600.0));
        j
    };
    let jobs = vec![
        started(job("v", simple(2, 2, TopologyLevel::Rack))),
        started(job(
            "w",
            J {
                preemptible: false,
                ..simple(1, 6, TopologyLevel::Node)
            },
        )),
        started(job(
            "w2",
            J {
                preemptible: false,
                ..simple(1, 8, TopologyLevel::Node)
            },
        )),
        job(
            "p",
            ranked(Priority::Critical, simple(1, 8, TopologyLevel::Node)),
        ),
        job("l", simple(1, 4, TopologyLevel::Node)),
    ];
    let models = vec![whole_model("inf", Priority::Sheddable, 6)];
    let plan = joint_plan(&c, &models, &jobs, &[("inf", 6)]);
    assert_never_shared(&plan);
    assert_eq!(plan.models[0].placed, 6);
    assert_eq!(
        by_name(&plan.gangs, "v").status,
        GangStatus::Running,
        "{:#?}",
        plan.gangs
    );
    assert_eq!(by_name(&plan.gangs, "p").status, GangStatus::Pending);
}

#[test]
fn pcie_gpus_are_in_no_nvlink_domain_unless_the_cluster_declares_one() {
    // An SXM node that declares no NVLink domain is one of its own (its
    // GPUs share NVSwitch); PCIe cards (L40S) are in none: a gang that
    // must share an NVLink domain cannot use them, and a preferred one is
    // met a level wider.
    let c = topo_cluster(vec![
        ("l0", "L40S", 4, "r0", "z0", None, vec![]),
        ("l1", "L40S", 4, "r0", "z0", Some("bridged"), vec![]),
        ("h0", "H100-80GB", 8, "r1", "z0", None, vec![]),
    ]);
    let l40s = |name: &str, mode: &str| {
        let y = format!(
            "workers: 1\ngpusPerWorker: 4\ngpuModels: [L40S]\ntopology: {{level: nvlink-domain, mode: {mode}}}\n"
        );
        let spec: TrainingJobSpec = serde_yaml_ng::from_str(&y).unwrap();
        TrainingJob::from_spec(name, &spec, &Catalog::builtin()).unwrap()
    };
    // Required: only the node whose cluster entry declares a domain.
    let gangs = place(&c, &[l40s("req", "required")]);
    let g = by_name(&gangs, "req");
    assert_eq!(g.workers.len(), 1, "{g:#?}");
    assert_eq!(g.workers[0].node, "l1");
    // With that node busy, it waits rather than take l0.
    let gangs = place(&c, &[l40s("first", "required"), l40s("second", "required")]);
    let second = by_name(&gangs, "second");
    assert!(second.workers.is_empty(), "{second:#?}");
    // Preferred: l0 meets it a level wider (one node, no NVLink).
    let gangs = place(&c, &[l40s("first", "required"), l40s("pref", "preferred")]);
    let pref = by_name(&gangs, "pref");
    assert_eq!(pref.workers[0].node, "l0", "{pref:#?}");
    assert_ne!(pref.topology_met, Some(TopologyLevel::NvlinkDomain));
    // An H100 node with no declared domain is its own.
    let h100 = place(&c, &[job("h", simple(1, 8, TopologyLevel::NvlinkDomain))]);
    assert_eq!(by_name(&h100, "h").workers[0].node, "h0");
    assert_eq!(by_name(&h100, "h").topology_met, Some(TopologyLevel::Node));
}

#[test]
fn inference_stays_off_a_broken_gangs_gpus_while_its_pods_hold_them() {
    // `jr` runs on a0's four GPUs and one failed: it restarts whole, its
    // pods hold the other three until deleted. Inference is planned on
    // a1, not on GPUs its pods would wait for with nothing saying why.
    let mut c = topo_cluster(vec![
        (
            "a0",
            "H100-80GB",
            4,
            "r0",
            "z0",
            None,
            vec![(0, "jr"), (1, "jr"), (2, "jr"), (3, "jr")],
        ),
        ("a1", "H100-80GB", 4, "r0", "z0", None, vec![]),
    ]);
    c.nodes[0].gpus[2].health = gpuscale_policies::Health::Unhealthy;
    let jobs = [job("jr", simple(1, 4, TopologyLevel::Node))];
    let models = [whole_model("m", Priority::Standard, 0)];
    let plan = joint_plan(&c, &models, &jobs, &[("m", 3)]);
    for g in plan.gpus.iter().filter(|g| g.node == "a0") {
        assert!(g.replicas.is_empty(), "{g:?}");
    }
    let placed: usize = plan
        .gpus
        .iter()
        .filter(|g| g.node == "a1")
        .map(|g| g.replicas.len())
        .sum();
    assert_eq!(placed, 3);
    let jr = by_name(&plan.gangs, "jr");
    assert_eq!(jr.status, GangStatus::Pending);
    // No gang starts there, so the broken one says which GPUs its old
    // pods hold and how to free them (the unhealthy GPU 2 is held too).
    let own: Vec<&Preemption> = jr.preempts.iter().filter(|p| p.name == "jr").collect();
    assert_eq!(own.len(), 1, "{:?}", jr.preempts);
    assert_eq!(own[0].count, 4);
    assert!(
        own[0].reason.contains("a0[0,1,2,3]")
            && own[0]
                .reason
                .contains("kubectl delete pods -l gpuscale.io/training-job=jr"),
        "{}",
        own[0].reason
    );
}

#[test]
fn a_broken_gang_restarting_on_some_of_its_gpus_names_its_old_pods_once() {
    // `jr` (one worker × 2 GPUs, one node) ran on a0's GPU 0 and a1's GPU
    // 0; a1's GPU 1 is unhealthy, so it restarts on a0 (over its own old
    // pod there). Its old pods are one entry: both GPUs, and the advice to
    // delete them before the new pods are applied.
    let mut c = topo_cluster(vec![
        ("a0", "H100-80GB", 2, "r0", "z0", None, vec![(0, "jr")]),
        ("a1", "H100-80GB", 2, "r0", "z0", None, vec![(0, "jr")]),
    ]);
    c.nodes[1].gpus[1].health = gpuscale_policies::Health::Unhealthy;
    let jobs = [job("jr", simple(1, 2, TopologyLevel::Node))];
    let models = [whole_model("m", Priority::Standard, 0)];
    let plan = joint_plan(&c, &models, &jobs, &[("m", 0)]);
    let jr = by_name(&plan.gangs, "jr");
    assert_eq!(jr.status, GangStatus::Starting, "{}", jr.reason);
    assert_eq!(jr.workers[0].node, "a0");
    let own: Vec<&Preemption> = jr.preempts.iter().filter(|p| p.name == "jr").collect();
    assert_eq!(own.len(), 1, "{:?}", jr.preempts);
    assert_eq!(own[0].count, 2);
    assert!(own[0].reason.contains("a1[0]"), "{}", own[0].reason);
    assert!(
        own[0]
            .reason
            .contains("delete them before `jr`'s new pods are applied"),
        "{}",
        own[0].reason
    );
}
