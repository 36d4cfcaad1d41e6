//! Builders shared by the packer's integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;

use gpuscale_policies::inventory::{ClusterSpec, NodeSpec};
use gpuscale_policies::model::{
    ModelPolicySpec, PlacementPolicy, ReplicaResources, ScalingPolicy, SloTargets, WorkloadSelector,
};
use gpuscale_policies::{Catalog, Cluster, GpuModel, Model, ModelPolicy, Priority, SharingMode};

pub fn cluster(nodes: &[(&str, &str, u32)]) -> Cluster {
    cluster_allowing(nodes, &gpuscale_policies::inventory::node_sharing())
}

/// A cluster whose nodes all allow `sharing`.
pub fn cluster_allowing(nodes: &[(&str, &str, u32)], sharing: &[SharingMode]) -> Cluster {
    let each: Vec<(&str, &str, u32, &[SharingMode])> = nodes
        .iter()
        .map(|&(name, gpu, count)| (name, gpu, count, sharing))
        .collect();
    cluster_each(&each)
}

/// A cluster whose nodes each allow their own sharing modes.
pub fn cluster_each(nodes: &[(&str, &str, u32, &[SharingMode])]) -> Cluster {
    let spec = ClusterSpec {
        catalog: vec![],
        nodes: nodes
            .iter()
            .map(|&(name, gpu, count, sharing)| NodeSpec {
                name: name.into(),
                count: None,
                zone: None,
                rack: None,
                nvlink_domain: None,
                labels: BTreeMap::new(),
                gpu_model: gpu.into(),
                gpu_count: count,
                timeslice_replicas: None,
                mps_replicas: None,
                mig_timeslice: None,
                sharing: sharing.to_vec(),
                hami_split_count: None,
                gpus: vec![],
            })
            .collect(),
    };
    Cluster::from_spec("test", &spec, &Catalog::builtin()).unwrap()
}

pub fn model(
    name: &str,
    memory: f64,
    compute: f64,
    sharing: &[SharingMode],
    tp: &[u32],
    gpus: &[&str],
) -> Model {
    try_model(name, memory, compute, sharing, tp, gpus).expect("a feasible model")
}

/// A model, or `None` when no GPU of the catalogue can hold it.
pub fn try_model(
    name: &str,
    memory: f64,
    compute: f64,
    sharing: &[SharingMode],
    tp: &[u32],
    gpus: &[&str],
) -> Option<Model> {
    let policy = ModelPolicy::new(
        name,
        ModelPolicySpec {
            served_name: None,
            selector: WorkloadSelector::default(),
            resources: ReplicaResources {
                memory_gib: Some(memory),
                params_b: None,
                dtype: None,
                kv_cache_gib: None,
                overhead_gib: None,
                compute,
                max_concurrency: 8,
                prefill: None,
            },
            placement: PlacementPolicy {
                sharing: sharing.to_vec(),
                gpu_models: gpus.iter().map(|g| g.to_string()).collect(),
                tensor_parallel: tp.to_vec(),
            },
            slo: SloTargets::default(),
            scaling: ScalingPolicy::default(),
            priority: Priority::Standard,
            adapters: Vec::new(),
            server_args: Vec::new(),
        },
    );
    Model::from_policy(&policy, &Catalog::builtin()).ok()
}

pub fn demand(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
    pairs.iter().map(|(m, n)| (m.to_string(), *n)).collect()
}

/// A 9 GiB, 0.1-compute model that runs on MIG slices only.
pub fn small_mig() -> Model {
    model("small", 9.0, 0.1, &[SharingMode::Mig], &[1], &[])
}

/// A 2.5 GiB, 0.02-compute model that runs on MIG slices, whole or
/// time-sliced: three to a share of an H100's 1g.10gb instance.
pub fn slice_sharing_embed() -> Model {
    model(
        "embed",
        2.5,
        0.02,
        &[SharingMode::Mig, SharingMode::MigTimeslice],
        &[1],
        &[],
    )
}

/// Every sharing mode, in the order of [`modes`]'s mask bits.
pub const ALL_MODES: [SharingMode; 6] = [
    SharingMode::Mig,
    SharingMode::Timeslice,
    SharingMode::Mps,
    SharingMode::Fractional,
    SharingMode::Whole,
    SharingMode::MigTimeslice,
];

/// The sharing modes a bit mask selects from [`ALL_MODES`].
pub fn modes(mask: u8) -> Vec<SharingMode> {
    ALL_MODES
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, &m)| m)
        .collect()
}

/// A cluster of nodes `n0`, `n1`, … from (GPU model, GPUs, sharing mask):
/// a node that time-slices MIG instances runs MIG too.
pub fn cluster_of_masks(nodes: &[(&str, u32, u8)]) -> Cluster {
    let named: Vec<(String, &str, u32, Vec<SharingMode>)> = nodes
        .iter()
        .enumerate()
        .map(|(i, &(g, n, mask))| {
            let mut m = modes(mask);
            if m.contains(&SharingMode::MigTimeslice) && !m.contains(&SharingMode::Mig) {
                m.push(SharingMode::Mig);
            }
            (format!("n{i}"), g, n, m)
        })
        .collect();
    let each: Vec<(&str, &str, u32, &[SharingMode])> = named
        .iter()
        .map(|(a, g, n, s)| (a.as_str(), *g, *n, s.as_slice()))
        .collect();
    cluster_each(&each)
}

/// A replica of `m` fits one of `n` MPS partitions of `gpu`: the device
/// plugin gives each MPS client 1/N of the memory (less headroom) and of
/// the SMs (within the cap), and the model allows MPS.
pub fn assert_fits_mps_partition(
    m: &Model,
    gpu: &GpuModel,
    options: &gpuscale_packer::PackOptions,
    n: u8,
) {
    assert!(
        m.sharing.contains(&SharingMode::Mps),
        "{} does not allow MPS",
        m.name
    );
    assert!(
        m.memory_gib <= gpu.usable_gib * (1.0 - options.mps_memory_headroom) / f64::from(n) + 1e-9,
        "{} over an MPS partition's memory",
        m.name
    );
    assert!(
        m.compute <= gpu.compute * options.mps_compute_cap / f64::from(n) + 1e-9,
        "{} over an MPS partition's compute",
        m.name
    );
}
