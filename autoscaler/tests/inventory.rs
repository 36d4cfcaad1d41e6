//! The packer's inventory from node objects as GPU Feature Discovery
//! labels them (the label names and values as NVIDIA's GFD documents
//! them: `nvidia.com/gpu.product` with spaces as dashes, `-MIG-<profile>`
//! under the single strategy, `-SHARED` under sharing) and from the node
//! agent's readings; the result is validated as a cluster file would be.

use std::collections::BTreeMap;

use gpuscale_autoscaler::inventory::{FromNodes, from_nodes, holdings, model_of_product};
use gpuscale_policies::devices::{GpuReading, InstanceReading, NodeGpus};
use gpuscale_policies::{Catalog, Cluster, GpuMode, Health, SharingMode};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

fn node(name: &str, labels: serde_json::Value, ready: bool) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "capacity": {"nvidia.com/gpu": "8"},
        }
    }))
    .unwrap()
}

fn h100(name: &str, extra: serde_json::Value) -> Node {
    let mut labels = json!({
        "kubernetes.io/hostname": name,
        "topology.kubernetes.io/zone": "eu-west-1a",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.config": "all-disabled",
        "nvidia.com/mig.config.state": "success",
        "feature.node.kubernetes.io/pci-10de.present": "true",
    });
    for (k, v) in extra.as_object().unwrap() {
        labels[k] = v.clone();
    }
    node(name, labels, true)
}

fn cluster(spec: &gpuscale_policies::ClusterSpec) -> Cluster {
    Cluster::from_spec("from-nodes", spec, &Catalog::builtin()).unwrap_or_else(|e| panic!("{e:?}"))
}

#[test]
fn gfd_labels_give_the_node_its_gpus_model_and_topology() {
    let nodes = [
        h100(
            "gpu-a",
            json!({"nvidia.com/gpu.clique": "7b2c.1", "gpuscale.io/rack": "r12"}),
        ),
        // gpuscale's own NVLink-domain label (what `plan --emit` writes)
        // is read before GFD's clique.
        h100(
            "gpu-b",
            json!({"nvidia.com/gpu.clique": "7b2c.1", "gpuscale.io/nvlink-domain": "hgx-b"}),
        ),
        // Not a GPU node: left out without a word.
        node("cpu-0", json!({"kubernetes.io/hostname": "cpu-0"}), true),
    ];
    let inv = from_nodes(&nodes, &BTreeMap::new(), &[], &Catalog::builtin());
    assert!(inv.notes.is_empty(), "{:?}", inv.notes);
    assert_eq!(inv.spec.nodes.len(), 2);
    assert_eq!(inv.spec.nodes[1].nvlink_domain.as_deref(), Some("hgx-b"));
    let n = &inv.spec.nodes[0];
    assert_eq!(n.gpu_model, "H100-80GB");
    assert_eq!(n.gpu_count, 8);
    assert_eq!(n.zone.as_deref(), Some("eu-west-1a"));
    assert_eq!(n.rack.as_deref(), Some("r12"));
    assert_eq!(n.nvlink_domain.as_deref(), Some("7b2c.1"));
    assert!(n.gpus.is_empty(), "all free and healthy: {:?}", n.gpus);
    let c = cluster(&inv.spec);
    assert_eq!(c.gpu_count(), 16);
    assert!(
        c.nodes[0]
            .gpus
            .iter()
            .all(|g| g.mode == GpuMode::Free && g.health == Health::Healthy)
    );
}

#[test]
fn product_suffixes_of_the_single_strategy_and_of_sharing_are_dropped() {
    let c = Catalog::builtin();
    assert_eq!(
        model_of_product(&c, "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"),
        Some("H100-80GB")
    );
    assert_eq!(
        model_of_product(&c, "NVIDIA-A100-SXM4-80GB-SHARED"),
        Some("A100-80GB")
    );
    assert_eq!(model_of_product(&c, "NVIDIA-L4"), Some("L4"));
    assert_eq!(model_of_product(&c, "NVIDIA-RTX-9000"), None);
}

#[test]
fn mig_instances_from_the_agent_become_the_gpus_geometry() {
    let nodes = [h100(
        "gpu-b",
        json!({"nvidia.com/mig.config": "gpuscale-00a1b2c3d4"}),
    )];
    let instance = |profile: &str, start: u8| InstanceReading {
        profile: profile.into(),
        start: Some(start),
        gpu_instance_id: None,
        uuid: String::new(),
        memory_total_mib: 0,
        memory_used_mib: 0,
    };
    let readings = BTreeMap::from([(
        "gpu-b".to_string(),
        NodeGpus {
            node: "gpu-b".into(),
            driver_version: Some("570.124.06".into()),
            gpus: (0..8)
                .map(|i| GpuReading {
                    index: i,
                    uuid: format!("GPU-0000000{i}"),
                    name: "NVIDIA H100 80GB HBM3".into(),
                    memory_total_mib: 81559,
                    memory_used_mib: 0,
                    mig_enabled: Some(i == 0),
                    instances: if i == 0 {
                        vec![
                            instance("3g.40gb", 4),
                            instance("1g.10gb", 0),
                            instance("2g.20gb", 2),
                        ]
                    } else {
                        vec![]
                    },
                    ecc_uncorrected_volatile: Some(if i == 7 { 2 } else { 0 }),
                    ..GpuReading::default()
                })
                .collect(),
        },
    )]);
    let inv = from_nodes(&nodes, &readings, &[], &Catalog::builtin());
    let n = &inv.spec.nodes[0];
    let g0 = n.gpus.iter().find(|g| g.index == 0).unwrap();
    assert_eq!(g0.mode, GpuMode::Mig);
    let slots: Vec<(String, u8)> = g0
        .geometry
        .iter()
        .map(|p| (p.profile.clone(), p.start))
        .collect();
    assert_eq!(
        slots,
        [
            ("1g.10gb".to_string(), 0),
            ("2g.20gb".to_string(), 2),
            ("3g.40gb".to_string(), 4)
        ]
    );
    assert_eq!(g0.uuid.as_deref(), Some("GPU-00000000"));
    // Uncorrectable ECC errors: not placed on, and said.
    let g7 = n.gpus.iter().find(|g| g.index == 7).unwrap();
    assert_eq!(g7.health, Health::Unhealthy);
    assert!(
        inv.notes.iter().any(|(_, w)| w.contains("ECC")),
        "{:?}",
        inv.notes
    );
    // The geometry is one NVIDIA allows: the cluster validates.
    let c = cluster(&inv.spec);
    assert_eq!(c.nodes[0].gpus[0].geometry.placements().len(), 3);
}

#[test]
fn a_gpu_whose_set_up_cannot_be_known_is_not_placed_on() {
    // MIG configured, no agent reading.
    let nodes = [h100(
        "gpu-c",
        json!({"nvidia.com/mig.config": "all-1g.10gb"}),
    )];
    let inv = from_nodes(&nodes, &BTreeMap::new(), &[], &Catalog::builtin());
    let n = &inv.spec.nodes[0];
    assert_eq!(n.gpus.len(), 8);
    assert!(n.gpus.iter().all(|g| g.health == Health::Unhealthy));
    assert!(inv.notes.iter().all(|(node, _)| node == "gpu-c"));
    assert!(
        inv.notes[0].1.contains("no agent reading"),
        "{:?}",
        inv.notes
    );
    cluster(&inv.spec);
}

#[test]
fn a_node_not_ready_has_no_usable_gpu() {
    let mut n = h100("gpu-d", json!({}));
    n.status.as_mut().unwrap().conditions.as_mut().unwrap()[1].status = "Unknown".into();
    let inv = from_nodes(&[n], &BTreeMap::new(), &[], &Catalog::builtin());
    assert!(
        inv.spec.nodes[0]
            .gpus
            .iter()
            .all(|g| g.health == Health::Unhealthy)
    );
    assert_eq!(inv.spec.nodes[0].gpus.len(), 8);
    assert!(inv.notes[0].1.contains("not Ready"));
}

#[test]
fn unknown_products_and_bad_annotations_leave_the_node_out_with_the_reason() {
    let mut shared = h100("gpu-e", json!({}));
    shared.metadata.annotations = Some(
        [(
            "gpuscale.io/sharing".to_string(),
            "mig, mig-timeslice, whole".to_string(),
        )]
        .into(),
    );
    let mut bad = h100("gpu-f", json!({}));
    bad.metadata.annotations =
        Some([("gpuscale.io/sharing".to_string(), "mig, magic".to_string())].into());
    let odd = h100(
        "gpu-g",
        json!({"nvidia.com/gpu.product": "NVIDIA-RTX-9000"}),
    );
    let inv = from_nodes(
        &[shared, bad, odd],
        &BTreeMap::new(),
        &[],
        &Catalog::builtin(),
    );
    let names: Vec<&str> = inv.spec.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["gpu-e"]);
    assert_eq!(
        inv.spec.nodes[0].sharing,
        [
            SharingMode::Mig,
            SharingMode::MigTimeslice,
            SharingMode::Whole
        ]
    );
    let notes: BTreeMap<&str, &str> = inv
        .notes
        .iter()
        .map(|(n, w)| (n.as_str(), w.as_str()))
        .collect();
    assert!(notes["gpu-f"].contains("`magic`"), "{notes:?}");
    assert!(notes["gpu-g"].contains("NVIDIA-RTX-9000"), "{notes:?}");
    cluster(&inv.spec);
}

/// The example reading (`tests/data/agent-h100-node.yaml`, what
/// `gpuscale agent --fake` serves) and its node, MIG-configured.
fn example() -> ([Node; 1], NodeGpus) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/agent-h100-node.yaml");
    let reading: NodeGpus =
        serde_yaml_ng::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let nodes = [h100(
        "gpu-a",
        json!({"nvidia.com/mig.config": "gpuscale-00c0ffee00"}),
    )];
    (nodes, reading)
}

/// The example node and its reading, with what `held` holds on it.
fn example_holding(held: &[gpuscale_autoscaler::inventory::Holding]) -> FromNodes {
    let (nodes, reading) = example();
    from_nodes(
        &nodes,
        &BTreeMap::from([("gpu-a".to_string(), reading)]),
        held,
        &Catalog::builtin(),
    )
}

/// The reading `gpuscale agent --fake` serves in the repository's
/// example (`tests/data/agent-h100-node.yaml`) beside its node: GPU 0's
/// three MIG instances are its geometry, GPU 7's ECC errors keep the
/// packer off it.
#[test]
fn the_example_agent_reading_maps_onto_its_node() {
    let (nodes, reading) = example();
    let inv = from_nodes(
        &nodes,
        &BTreeMap::from([("gpu-a".to_string(), reading.clone())]),
        &[],
        &Catalog::builtin(),
    );
    let c = cluster(&inv.spec);
    let gpus = &c.nodes[0].gpus;
    assert_eq!(gpus[0].mode, GpuMode::Mig);
    assert_eq!(gpus[0].geometry.placements().len(), 3);
    assert_eq!(gpus[7].health, Health::Unhealthy);
    assert!(gpus[1..7].iter().all(|g| g.health == Health::Healthy));
    assert_eq!(
        gpus[3].uuid.as_deref(),
        Some("GPU-5fd4bd05-0000-4d5b-9c5e-000000000003")
    );
}

fn pod(name: &str, model: &str, node: &str, limits: serde_json::Value, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"gpuscale.io/model": model,
                                               "app.kubernetes.io/managed-by": "gpuscale"}},
        "spec": {"nodeName": node, "containers": [{"name": "model-server",
                 "resources": {"limits": limits}}]},
        "status": {"phase": phase}
    }))
    .unwrap()
}

/// gpuscale's pods say what runs where: one holding a `3g.40gb` instance
/// runs on GPU 0's instance at slot 4; one holding two whole GPUs takes
/// two free ones; a finished pod holds nothing.
#[test]
fn running_pods_are_the_gpus_workloads() {
    let pods = [
        pod(
            "a",
            "llama-8b",
            "gpu-a",
            json!({"nvidia.com/mig-3g.40gb": "1"}),
            "Running",
        ),
        pod(
            "b",
            "llama-70b",
            "gpu-a",
            json!({"nvidia.com/gpu": "2"}),
            "Running",
        ),
        pod(
            "c",
            "old",
            "gpu-a",
            json!({"nvidia.com/gpu": "1"}),
            "Succeeded",
        ),
        pod(
            "d",
            "elsewhere",
            "gpu-z",
            json!({"nvidia.com/gpu": "1"}),
            "Running",
        ),
    ];
    let held = holdings(&pods, "inference");
    assert_eq!(held.len(), 3, "the finished pod holds nothing");
    let inv = example_holding(&held);
    let c = cluster(&inv.spec);
    let gpus = &c.nodes[0].gpus;
    assert_eq!(gpus[0].workloads.len(), 1);
    assert_eq!(gpus[0].workloads[0].model, "llama-8b");
    assert_eq!(gpus[0].workloads[0].slot, Some(4));
    // GPU 1 is the first free healthy one; GPU 7 (ECC errors) is never
    // taken.
    let whole: Vec<u32> = gpus
        .iter()
        .filter(|g| g.mode == GpuMode::Whole)
        .map(|g| g.index)
        .collect();
    assert_eq!(whole, [1, 2]);
    assert!(gpus[1].workloads.iter().all(|w| w.model == "llama-70b"));
}

/// An agent without the MIG monitor capability reads the instances but
/// not their start slots: the first valid layout of the same instances
/// stands for them, and the note says so.
#[test]
fn mig_instances_without_start_slots_take_the_first_valid_layout() {
    let nodes = [h100(
        "gpu-h",
        json!({"nvidia.com/mig.config": "gpuscale-00a1b2c3d4"}),
    )];
    let instance = |profile: &str| InstanceReading {
        profile: profile.into(),
        start: None,
        gpu_instance_id: None,
        uuid: String::new(),
        memory_total_mib: 0,
        memory_used_mib: 0,
    };
    let reading = NodeGpus {
        node: "gpu-h".into(),
        driver_version: None,
        gpus: vec![GpuReading {
            index: 0,
            uuid: "GPU-h0".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_total_mib: 81559,
            memory_used_mib: 0,
            mig_enabled: Some(true),
            instances: vec![instance("3g.40gb"), instance("3g.40gb")],
            ..GpuReading::default()
        }],
    };
    let inv = from_nodes(
        &nodes,
        &BTreeMap::from([("gpu-h".to_string(), reading)]),
        &[],
        &Catalog::builtin(),
    );
    let c = cluster(&inv.spec);
    let g0 = &c.nodes[0].gpus[0];
    assert_eq!(g0.mode, GpuMode::Mig);
    assert_eq!(g0.health, Health::Healthy);
    assert_eq!(g0.geometry.counts()["3g.40gb"], 2);
    assert!(
        inv.notes
            .iter()
            .any(|(_, w)| w.contains("first valid layout")),
        "{:?}",
        inv.notes
    );
    // The node's sharing, without an annotation: what the controller sets
    // up itself.
    assert_eq!(
        inv.spec.nodes[0].sharing,
        [SharingMode::Mig, SharingMode::Whole]
    );
}

/// A real H200's reading (`tests/data/nvidia-h200/`, driver 580.159.04)
/// on a node GFD labels `NVIDIA-H200`.
fn real_h200() -> ([Node; 1], NodeGpus) {
    let nodes = [h100(
        "h200-test",
        json!({
            "nvidia.com/gpu.product": "NVIDIA-H200",
            "nvidia.com/gpu.count": "1",
            "nvidia.com/gpu.memory": "143771",
        }),
    )];
    let reading: NodeGpus =
        serde_json::from_str(include_str!("../../tests/data/nvidia-h200/reading.json")).unwrap();
    (nodes, reading)
}

/// The built-in H200 is the measured one: a real H200's reading lowers
/// nothing.
#[test]
fn a_real_h200_reading_agrees_with_the_builtin_catalogue() {
    let (nodes, reading) = real_h200();
    let inv = from_nodes(
        &nodes,
        &BTreeMap::from([("h200-test".to_string(), reading.clone())]),
        &[],
        &Catalog::builtin(),
    );
    assert!(inv.spec.catalog.is_empty(), "{:?}", inv.spec.catalog);
    assert!(inv.notes.is_empty(), "{:?}", inv.notes);
    let n = &inv.spec.nodes[0];
    assert_eq!(n.gpu_model, "H200-141GB");
    assert_eq!(
        n.gpus[0].uuid.as_deref(),
        Some(reading.gpus[0].uuid.as_str())
    );
    cluster(&inv.spec);
}

/// A catalogue more optimistic than the hardware (the H200 table before
/// it was measured: 2g.35gb and 1g.35gb at 32.75 GiB, the whole GPU at
/// 140.00) is lowered to what the GPU reports, with a note each; a profile
/// the catalogue under-states is left alone.
#[test]
fn a_reading_under_the_catalogue_lowers_it_and_says_so() {
    let (nodes, reading) = real_h200();
    let optimistic = Cluster::from_spec(
        "optimistic",
        &serde_json::from_value(json!({
            "catalog": [{
                "name": "H200-141GB",
                "usableGiB": 140.0,
                "migUsableGiB": {"1g.35gb": 32.75, "2g.35gb": 32.75, "3g.71gb": 68.5},
            }],
        }))
        .unwrap(),
        &Catalog::builtin(),
    )
    .unwrap()
    .catalog;
    let inv = from_nodes(
        &nodes,
        &BTreeMap::from([("h200-test".to_string(), reading)]),
        &[],
        &optimistic,
    );
    assert_eq!(inv.spec.catalog.len(), 1);
    let o = &inv.spec.catalog[0];
    assert_eq!(o.name, "H200-141GB");
    // 143,771 MiB less the 616 MiB reserved: 139.79 GiB.
    assert_eq!(o.usable_gib, Some(139.79));
    assert_eq!(
        o.mig_usable_gib,
        BTreeMap::from([("1g.35gb".to_string(), 32.5), ("2g.35gb".to_string(), 32.5)])
    );
    assert_eq!(inv.notes.len(), 3, "{:?}", inv.notes);
    assert!(
        inv.notes
            .iter()
            .any(|(n, why)| n == "h200-test" && why.contains("MIG 2g.35gb holds 32.50 GiB")),
        "{:?}",
        inv.notes
    );
    let c = Cluster::from_spec("lowered", &inv.spec, &optimistic).unwrap();
    let h200 = c.catalog.get("H200-141GB").unwrap();
    assert_eq!(h200.usable_gib, 139.79);
    let two = h200.mig.as_ref().unwrap();
    let usable = |n: &str| {
        two.profiles
            .iter()
            .find(|p| p.name == n)
            .unwrap()
            .usable_gib
    };
    assert_eq!(usable("2g.35gb"), 32.5);
    assert_eq!(usable("3g.71gb"), 68.5);
}

fn annotated(mut node: Node, key: &str, value: &str) -> Node {
    node.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
    node
}

/// `node` with the sharing gpuscale may set it up for (the annotation
/// `gpuscale.io/sharing`).
fn allowing(node: Node, sharing: &str) -> Node {
    annotated(node, "gpuscale.io/sharing", sharing)
}

fn running(name: &str, model: &str, limits: serde_json::Value) -> Pod {
    pod(name, model, "gpu-a", limits, "Running")
}

fn with_annotation(mut pod: Pod, key: &str, value: &str) -> Pod {
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
    pod
}

fn counts(c: &Cluster, mode: GpuMode) -> Vec<(u32, usize)> {
    c.nodes[0]
        .gpus
        .iter()
        .filter(|g| g.mode == mode)
        .map(|g| (g.index, g.workloads.len()))
        .collect()
}

fn shares(n: usize, model: &str, resource: &str) -> Vec<Pod> {
    (0..n)
        .map(|i| running(&format!("p{i}"), model, json!({ resource: "1" })))
        .collect()
}

/// Pods holding `nvidia.com/gpu.shared` on a node whose device-plugin
/// config is `timeslice-4` (the name gpuscale writes) are shares, not
/// whole GPUs, spread as NVIDIA's device plugin hands out replicas (its
/// `distributedAlloc`: the device with the fewest replicas in use): ten
/// shares on eight GPUs are one on each and a second on GPUs 0 and 1. The
/// node keeps its config. Before, they were not counted at all (the GPUs
/// looked free).
#[test]
fn time_sliced_shares_spread_as_the_device_plugin_hands_them_out() {
    let nodes = [allowing(
        h100(
            "gpu-a",
            json!({"nvidia.com/device-plugin.config": "timeslice-4"}),
        ),
        "timeslice, whole",
    )];
    let pods = shares(10, "embed", "nvidia.com/gpu.shared");
    let inv = from_nodes(
        &nodes,
        &BTreeMap::new(),
        &holdings(&pods, "inference"),
        &Catalog::builtin(),
    );
    assert!(inv.notes.is_empty(), "{:?}", inv.notes);
    let c = cluster(&inv.spec);
    assert_eq!(c.nodes[0].timeslice_replicas, Some(4));
    let mut want: Vec<(u32, usize)> = (0..8).map(|i| (i, 1)).collect();
    want[0].1 = 2;
    want[1].1 = 2;
    assert_eq!(counts(&c, GpuMode::Timeslice), want);
    assert!(counts(&c, GpuMode::Whole).is_empty());
}

/// The same under MPS (`mps-2`): at most two clients per GPU, so
/// eighteen shares on eight GPUs leave two with no room (noted).
#[test]
fn mps_shares_fill_at_most_their_partitions() {
    let nodes = [allowing(
        h100("gpu-a", json!({"nvidia.com/device-plugin.config": "mps-2"})),
        "mps, whole",
    )];
    let pods = shares(18, "chat", "nvidia.com/gpu.shared");
    let inv = from_nodes(
        &nodes,
        &BTreeMap::new(),
        &holdings(&pods, "inference"),
        &Catalog::builtin(),
    );
    assert_eq!(inv.notes.len(), 2, "{:?}", inv.notes);
    assert!(inv.notes.iter().all(|(_, n)| n.contains("no room")));
    let c = cluster(&inv.spec);
    assert_eq!(c.nodes[0].mps_replicas, Some(2));
    assert_eq!(
        counts(&c, GpuMode::Mps),
        (0..8).map(|i| (i, 2)).collect::<Vec<_>>()
    );
}

/// A node time-slicing its `1g.10gb` instances three ways
/// (`mig-1g.10gb-timeslice-3`): three pods holding
/// `nvidia.com/mig-1g.10gb.shared` share GPU 0's one `1g.10gb` instance
/// (slot 0), and a fourth has no room, which is noted.
#[test]
fn time_sliced_mig_shares_share_one_instance() {
    let (_, reading) = example();
    let nodes = [allowing(
        h100(
            "gpu-a",
            json!({"nvidia.com/mig.config": "gpuscale-00c0ffee00",
                   "nvidia.com/device-plugin.config": "mig-1g.10gb-timeslice-3"}),
        ),
        "mig, mig-timeslice, whole",
    )];
    let pods = shares(4, "embed", "nvidia.com/mig-1g.10gb.shared");
    let inv = from_nodes(
        &nodes,
        &BTreeMap::from([("gpu-a".to_string(), reading)]),
        &holdings(&pods, "inference"),
        &Catalog::builtin(),
    );
    // The reading's GPU 7 has ECC errors (noted), and the fourth share:
    assert_eq!(inv.notes.len(), 2, "{:?}", inv.notes);
    assert!(inv.notes[1].1.contains("no room"), "{:?}", inv.notes);
    let c = cluster(&inv.spec);
    let ts = c.nodes[0]
        .mig_timeslice
        .as_ref()
        .expect("the node's config");
    assert_eq!((ts.profile.as_str(), ts.replicas), ("1g.10gb", 3));
    let g0 = &c.nodes[0].gpus[0];
    assert_eq!(g0.workloads.len(), 3);
    assert!(g0.workloads.iter().all(|w| w.slot == Some(0)));
}

/// A node labelled with a time-sliced MIG config whose `sharing`
/// annotation is the default (`mig, whole`) and no pods: the config is
/// what the node runs, so the inventory allows it (noted) and stays valid
/// — a spec with the config and without the mode would fail validation,
/// and the controller would keep its last inventory of every node.
#[test]
fn a_config_label_the_annotation_leaves_out_is_allowed_and_noted() {
    let (_, reading) = example();
    let nodes = [h100(
        "gpu-a",
        json!({"nvidia.com/mig.config": "gpuscale-00c0ffee00",
               "nvidia.com/device-plugin.config": "mig-1g.10gb-timeslice-2"}),
    )];
    let inv = from_nodes(
        &nodes,
        &BTreeMap::from([("gpu-a".to_string(), reading)]),
        &[],
        &Catalog::builtin(),
    );
    assert!(
        inv.notes
            .iter()
            .any(|(_, n)| n.contains("`mig-timeslice` allowed for what runs")),
        "{:?}",
        inv.notes
    );
    let c = cluster(&inv.spec);
    assert!(c.nodes[0].sharing.contains(&SharingMode::MigTimeslice));
}

const UUID: &str = "GPU-5fd4bd05-0000-4d5b-9c5e-00000000000";

/// `node` as HAMi's device plugin registers it: `gpus` GPUs of HAMi's
/// default 10 containers each, in its older `UUID,count,…:` form.
fn hami_registered(node: Node, gpus: u32) -> Node {
    let record: String = (0..gpus)
        .map(|i| format!("{UUID}{i},10,81559,100,NVIDIA-NVIDIA H100 80GB HBM3,0,true:"))
        .collect();
    annotated(node, "hami.io/node-nvidia-register", &record)
}

fn hami(mib: &str, cores: Option<&str>, gpus: &str) -> serde_json::Value {
    let mut limits = json!({"nvidia.com/gpu": gpus, "nvidia.com/gpumem": mib});
    if let Some(c) = cores {
        limits["nvidia.com/gpucores"] = json!(c);
    }
    limits
}

/// HAMi's pods (`nvidia.com/gpu` with `nvidia.com/gpumem`,
/// `nvidia.com/gpucores`) are fractional shares, not whole GPUs, placed as
/// HAMi documents them:
/// - `a`: HAMi recorded its GPU (`hami.io/vgpu-devices-allocated`,
///   `UUID,NVIDIA,MiB,cores:;`): GPU 3;
/// - `b`: may only use GPU 0 (`nvidia.com/use-gpuuuid`), and the
///   whole-GPU pod `w` listed before it does not take that GPU;
/// - `c`: binpack, the fullest fractional GPU with room: GPU 0 (30,000 +
///   30,000 MiB of 81,920; the lower index of two equally full);
/// - `d`, two GPUs of 40,000 MiB: GPU 3 (30,000 + 40,000) and a free one,
///   GPU 1;
/// - `e`, 50 % of the memory (`nvidia.com/gpumem-percentage`) and no
///   `gpucores` (HAMi's default 0): GPU 1 (40,000 + 40,960);
/// - `w`, a whole GPU: the first free one left, GPU 2.
#[test]
fn hami_shares_go_where_hami_recorded_or_would_put_them() {
    let (_, mut reading) = example();
    reading.gpus[0].mig_enabled = Some(false);
    reading.gpus[0].instances.clear();
    let nodes = [hami_registered(
        allowing(h100("gpu-a", json!({"gpu": "on"})), "fractional, whole"),
        8,
    )];
    let pods = [
        running("w", "llama-70b", json!({"nvidia.com/gpu": "1"})),
        with_annotation(
            running("b", "qwen-7b", hami("30000", Some("30"), "1")),
            "nvidia.com/use-gpuuuid",
            &format!("{UUID}0"),
        ),
        with_annotation(
            running("a", "llama-8b", hami("30000", Some("30"), "1")),
            "hami.io/vgpu-devices-allocated",
            &format!("{UUID}3,NVIDIA,30000,30:;"),
        ),
        running("c", "qwen-7b", hami("30000", Some("30"), "1")),
        running("d", "mixtral", hami("40000", Some("50"), "2")),
        running(
            "e",
            "embed",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
        ),
    ];
    let inv = from_nodes(
        &nodes,
        &BTreeMap::from([("gpu-a".to_string(), reading)]),
        &holdings(&pods, "inference"),
        &Catalog::builtin(),
    );
    // Only the reading's GPU 7 (ECC errors) is noted.
    assert_eq!(inv.notes.len(), 1, "{:?}", inv.notes);
    let c = cluster(&inv.spec);
    let on = |i: usize| -> Vec<&str> {
        c.nodes[0].gpus[i]
            .workloads
            .iter()
            .map(|w| w.model.as_str())
            .collect()
    };
    assert_eq!(on(0), ["qwen-7b", "qwen-7b"]);
    assert_eq!(on(1), ["mixtral", "embed"]);
    assert_eq!(on(2), ["llama-70b"]);
    assert_eq!(on(3), ["llama-8b", "mixtral"]);
    assert_eq!(counts(&c, GpuMode::Whole), [(2, 1)]);
    assert_eq!(counts(&c, GpuMode::Fractional), [(0, 2), (1, 2), (3, 2)]);
}

/// A replay of binpack in list order can fail where HAMi did not: on a
/// node of two H100s, 30,000, 30,000, 50,000 and 50,000 MiB in that order
/// fill GPU 0 with the first two, and the last finds no room. It is
/// counted on the GPU with the most memory left, with a note, never left
/// looking free.
#[test]
fn a_hami_share_the_replay_cannot_fit_is_still_counted() {
    let mut node = allowing(h100("gpu-a", json!({})), "fractional");
    node.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("nvidia.com/gpu.count".into(), "2".into());
    let node = hami_registered(node, 2);
    let pods = [
        running("a", "m", hami("30000", None, "1")),
        running("b", "m", hami("30000", None, "1")),
        running("c", "m", hami("50000", None, "1")),
        running("d", "m", hami("50000", None, "1")),
    ];
    let inv = from_nodes(
        &[node],
        &BTreeMap::new(),
        &holdings(&pods, "inference"),
        &Catalog::builtin(),
    );
    assert_eq!(inv.notes.len(), 1, "{:?}", inv.notes);
    assert!(
        inv.notes[0].1.contains("counted on GPU 1"),
        "{:?}",
        inv.notes
    );
    let c = cluster(&inv.spec);
    assert_eq!(counts(&c, GpuMode::Fractional), [(0, 2), (1, 2)]);
}

/// HAMi's device plugin registers each node's GPUs in the annotation
/// `hami.io/node-nvidia-register`, with HAMi's `deviceSplitCount` as each
/// GPU's `count` (HAMi's protocol document: `UUID,count,MiB,cores,type,
/// numa,health:` per GPU; newer releases a JSON list of devices with a
/// `count` field). The node's split count is the fewest; it binds the
/// binpack replay of unrecorded HAMi pods too: with a count of 2, the
/// third 10,000 MiB pod goes to another GPU although GPU 0 has room. A
/// node that may not be `fractional` keeps no count (HAMi is not
/// gpuscale's there) and gets no note; a record that does not read, a
/// `fractional` node HAMi has not registered and a count above 1000
/// (clamped, rather than fail the whole inventory) are noted. A JSON
/// device without `count` (HAMi's `omitempty` for 0) is passed over.
#[test]
fn hamis_split_count_comes_from_its_node_registration() {
    let two_gpus = |mut node: Node| {
        node.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("nvidia.com/gpu.count".into(), "2".into());
        node
    };
    let legacy = format!(
        "{UUID}0,2,81559,100,NVIDIA-NVIDIA H100 80GB HBM3,0,true:\
         {UUID}1,3,81559,100,NVIDIA-NVIDIA H100 80GB HBM3,0,true:"
    );
    let modern = format!(
        r#"[{{"id":"{UUID}0","count":6,"devmem":81559,"devcore":100,"type":"NVIDIA-NVIDIA H100 80GB HBM3","health":true}},{{"id":"{UUID}1","index":1,"count":4,"devmem":81559,"devcore":100,"type":"NVIDIA-NVIDIA H100 80GB HBM3","mode":"hami-core","health":true}}]"#
    );
    let hami_node = |name: &str, sharing: &str, record: &str| {
        annotated(
            allowing(two_gpus(h100(name, json!({}))), sharing),
            "hami.io/node-nvidia-register",
            record,
        )
    };
    let huge = format!(r#"[{{"id":"{UUID}0"}},{{"id":"{UUID}1","count":5000}}]"#);
    let nodes = [
        hami_node("gpu-a", "fractional", &legacy),
        hami_node("gpu-b", "fractional, whole", &modern),
        hami_node("gpu-c", "mig, whole", &legacy),
        hami_node("gpu-d", "fractional", "not a device list"),
        hami_node("gpu-e", "fractional", &huge),
        allowing(two_gpus(h100("gpu-f", json!({}))), "fractional"),
    ];
    let pods = [
        running("p0", "m", hami("10000", Some("10"), "1")),
        running("p1", "m", hami("10000", Some("10"), "1")),
        running("p2", "m", hami("10000", Some("10"), "1")),
    ];
    let inv = from_nodes(
        &nodes,
        &BTreeMap::new(),
        &holdings(&pods, "inference"),
        &Catalog::builtin(),
    );
    let noted: Vec<&str> = inv.notes.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(noted, ["gpu-d", "gpu-e", "gpu-f"], "{:?}", inv.notes);
    assert!(inv.notes[0].1.contains("does not read"), "{:?}", inv.notes);
    assert!(
        inv.notes[1].1.contains("planned as 1000"),
        "{:?}",
        inv.notes
    );
    assert!(
        inv.notes[2].1.contains("has not registered"),
        "{:?}",
        inv.notes
    );
    let c = cluster(&inv.spec);
    let split: Vec<Option<u32>> = c.nodes.iter().map(|n| n.hami_split_count).collect();
    assert_eq!(split, [Some(2), Some(4), None, None, Some(1000), None]);
    assert_eq!(counts(&c, GpuMode::Fractional), [(0, 2), (1, 1)]);
}

/// What runs wins over what the annotations say, with a note each: a
/// HAMi share on a node whose `sharing` leaves out `fractional` makes the
/// node allow it for what runs; a share on a node without a device-plugin
/// config gpuscale can read counts as a whole GPU, never as a free one.
#[test]
fn shares_the_annotations_do_not_explain_are_kept_and_noted() {
    let nodes = [h100(
        "gpu-a",
        json!({"nvidia.com/device-plugin.config": "team-custom"}),
    )];
    let pods = [
        running("a", "chat", hami("20000", None, "1")),
        running("b", "embed", json!({"nvidia.com/gpu.shared": "1"})),
    ];
    let inv = from_nodes(
        &nodes,
        &BTreeMap::new(),
        &holdings(&pods, "inference"),
        &Catalog::builtin(),
    );
    let notes: Vec<&str> = inv.notes.iter().map(|(_, n)| n.as_str()).collect();
    assert_eq!(notes.len(), 3, "{notes:?}");
    assert!(notes[0].contains("team-custom is not a config gpuscale writes"));
    assert!(notes[1].contains("counted as a whole GPU"));
    assert!(notes[2].contains("`fractional` allowed for what runs"));
    let c = cluster(&inv.spec);
    assert!(c.nodes[0].sharing.contains(&SharingMode::Fractional));
    assert_eq!(counts(&c, GpuMode::Whole), [(0, 1)]);
    assert_eq!(counts(&c, GpuMode::Fractional), [(1, 1)]);
}

/// Limits are the pod's own text: absurd counts and sizes are bounded
/// (64 devices of a kind per container; a share's memory at most the
/// GPU's, its cores at most 100 %), quantities with suffixes read as
/// Kubernetes writes them, and nothing panics or exhausts memory.
#[test]
fn hostile_limits_are_bounded() {
    let nodes = [allowing(
        h100(
            "gpu-a",
            json!({"nvidia.com/device-plugin.config": "timeslice-2"}),
        ),
        "timeslice, fractional, whole",
    )];
    let pods = [
        running("a", "m", json!({"nvidia.com/gpu.shared": "1000000000000"})),
        running(
            "b",
            "m",
            json!({"nvidia.com/gpu": "4294967297",
                   "nvidia.com/gpumem": "18446744073709551615",
                   "nvidia.com/gpucores": "4294967295"}),
        ),
        running(
            "c",
            "m",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30k"}),
        ),
    ];
    let held = holdings(&pods, "inference");
    assert_eq!(held[0].held.len(), 64);
    let gpuscale_autoscaler::inventory::Held::Fractional(b) = &held[1].held[0] else {
        panic!("{:?}", held[1]);
    };
    assert_eq!((b.gpus, b.cores), (64, 100));
    let gpuscale_autoscaler::inventory::Held::Fractional(c) = &held[2].held[0] else {
        panic!("{:?}", held[2]);
    };
    assert_eq!(c.mib, Some(30_000));
    let inv = from_nodes(&nodes, &BTreeMap::new(), &held, &Catalog::builtin());
    // The 64 shares fill the node's 16, and b takes what is left; every
    // GPU is accounted for and the spec still validates.
    assert!(inv.notes.iter().any(|(_, n)| n.contains("no room")));
    cluster(&inv.spec);
}

/// Pods gpuscale does not manage (a training worker in another namespace,
/// another team's MIG server) keep the GPUs they hold out of every plan;
/// a pod without GPUs, or finished, holds nothing.
#[test]
fn gpus_held_by_pods_gpuscale_does_not_manage_are_kept_out() {
    let foreign = |name: &str, limits: serde_json::Value, phase: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml",
                         "labels": {"volcano.sh/job-name": "train"}},
            "spec": {"nodeName": "gpu-a", "containers": [{"name": "worker",
                     "resources": {"limits": limits}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    };
    let pods = [
        pod(
            "a",
            "llama-8b",
            "gpu-a",
            json!({"nvidia.com/mig-3g.40gb": "1"}),
            "Running",
        ),
        foreign("trainer-0", json!({"nvidia.com/gpu": "2"}), "Running"),
        foreign(
            "other-mig",
            json!({"nvidia.com/mig-1g.10gb": "1"}),
            "Running",
        ),
        foreign("web", json!({"cpu": "2"}), "Running"),
        // gpuscale's labels in another namespace prove nothing.
        serde_json::from_value(json!({
            "metadata": {"name": "spoof", "namespace": "tenant",
                         "labels": {"gpuscale.io/model": "llama-8b",
                                    "app.kubernetes.io/managed-by": "gpuscale"}},
            "spec": {"nodeName": "gpu-a", "containers": [{"name": "x",
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap(),
        foreign("done", json!({"nvidia.com/gpu": "4"}), "Succeeded"),
    ];
    let held = holdings(&pods, "inference");
    assert_eq!(held.len(), 4, "{held:#?}");
    assert_eq!(held[1].foreign.as_deref(), Some("ml/trainer-0"));
    assert_eq!(held[3].foreign.as_deref(), Some("tenant/spoof"));
    let inv = example_holding(&held);
    let c = cluster(&inv.spec);
    let gpus = &c.nodes[0].gpus;
    let unhealthy: Vec<u32> = gpus
        .iter()
        .filter(|g| g.health == Health::Unhealthy)
        .map(|g| g.index)
        .collect();
    // GPU 0 (the only one with a 1g.10gb instance), two free GPUs for the
    // trainer, one for the spoofing pod, and GPU 7 (ECC errors, as
    // before).
    assert_eq!(unhealthy, [0, 1, 2, 3, 7], "{:#?}", inv.notes);
    for pod in ["ml/trainer-0", "ml/other-mig"] {
        assert!(
            inv.notes.iter().any(|(_, n)| n.contains(pod)),
            "{pod} named: {:#?}",
            inv.notes
        );
    }
    // Without them, only GPU 7.
    let inv = example_holding(&holdings(&pods[..1], "inference"));
    let c = cluster(&inv.spec);
    let n = c.nodes[0]
        .gpus
        .iter()
        .filter(|g| g.health == Health::Unhealthy)
        .count();
    assert_eq!(n, 1);
}

/// The controller keeps only what `holdings` reads of each listed pod:
/// the holdings of the cut-down pods are those of the full ones, for
/// gpuscale's replicas, HAMi's shares, device-plugin shares and foreign
/// pods alike, and the rest of a pod (env, volumes, managed fields,
/// other labels and annotations, status beyond the phase) is gone.
#[test]
fn a_pod_cut_down_holds_what_the_full_pod_holds() {
    use gpuscale_autoscaler::inventory::slim;
    let heavy = |mut p: Pod| -> Pod {
        let mut v = serde_json::to_value(&p).unwrap();
        v["metadata"]["managedFields"] = json!([{"manager": "kubectl", "operation": "Apply",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:containers": {}}}}]);
        v["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
            json!("x".repeat(4096));
        v["metadata"]["labels"]["app"] = json!("big");
        v["spec"]["volumes"] = json!([{"name": "cache", "emptyDir": {}}]);
        v["spec"]["containers"][0]["env"] = json!([{"name": "A", "value": "y".repeat(2048)}]);
        v["spec"]["containers"][0]["image"] = json!("vllm/vllm-openai:v0.10.0");
        v["status"]["conditions"] = json!([{"type": "Ready", "status": "True"}]);
        p = serde_json::from_value(v).unwrap();
        p
    };
    let mut pods: Vec<Pod> = vec![
        pod(
            "a",
            "llama-8b",
            "gpu-a",
            json!({"nvidia.com/mig-3g.40gb": "1"}),
            "Running",
        ),
        pod(
            "b",
            "llama-8b",
            "gpu-a",
            json!({"nvidia.com/gpu": "1"}),
            "Pending",
        ),
        pod(
            "c",
            "llama-8b",
            "gpu-a",
            json!({"nvidia.com/gpu": "1"}),
            "Succeeded",
        ),
    ];
    pods.extend(shares(3, "bge", "nvidia.com/gpu.shared"));
    pods.push(with_annotation(
        running("h", "bge", hami("4096", Some("30"), "1")),
        gpuscale_autoscaler::inventory::HAMI_ALLOCATED,
        "GPU-a1,NVIDIA,4096,30:;",
    ));
    pods.push(with_annotation(
        running("u", "bge", hami("2048", None, "1")),
        gpuscale_packer::emit::HAMI_USE_UUID,
        "GPU-a2",
    ));
    pods.push(
        serde_json::from_value(json!({
            "metadata": {"name": "trainer-0", "namespace": "ml",
                         "labels": {"gpuscale.io/model": "llama-8b"}},
            "spec": {"nodeName": "gpu-a", "containers": [{"name": "w",
                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
            "status": {"phase": "Running"}
        }))
        .unwrap(),
    );
    let full: Vec<Pod> = pods.into_iter().map(heavy).collect();
    let cut: Vec<Pod> = full.iter().cloned().map(slim).collect();
    let want = holdings(&full, "inference");
    assert!(want.len() >= 8, "{want:#?}");
    assert_eq!(holdings(&cut, "inference"), want);
    for (f, c) in full.iter().zip(&cut) {
        let (f, c) = (
            serde_json::to_string(f).unwrap(),
            serde_json::to_string(c).unwrap(),
        );
        assert!(c.len() * 10 < f.len(), "{c}");
        for gone in [
            "managedFields",
            "last-applied",
            "volumes",
            "env",
            "image",
            "conditions",
            "\"app\"",
        ] {
            assert!(!c.contains(gone), "{gone} kept: {c}");
        }
    }
}

/// A node listed without its bulk (managed fields, pulled images,
/// attached volumes) gives the same inventory as the whole node.
#[test]
fn a_node_without_its_bulk_gives_the_same_inventory() {
    use gpuscale_autoscaler::kubernetes::without_bulk;
    let (nodes, reading) = example();
    let mut v = serde_json::to_value(&nodes[0]).unwrap();
    v["metadata"]["managedFields"] = json!([{"manager": "kubelet", "operation": "Update"}]);
    v["metadata"]["annotations"]["gpuscale.io/sharing"] = json!("mig,whole,fractional");
    v["status"]["images"] = json!([{"names": ["vllm/vllm-openai@sha256:00", "vllm/vllm-openai:v0.10.0"],
                                    "sizeBytes": 9_000_000_000u64}]);
    v["status"]["volumesInUse"] = json!(["kubernetes.io/csi/x^vol-1"]);
    let full: Node = serde_json::from_value(v).unwrap();
    let cut = without_bulk(full.clone());
    assert!(cut.status.as_ref().unwrap().images.is_none());
    assert!(cut.metadata.managed_fields.is_none());
    let readings = BTreeMap::from([("gpu-a".to_string(), reading)]);
    let inv = |n: Node| {
        let i = from_nodes(&[n], &readings, &[], &Catalog::builtin());
        (serde_json::to_value(&i.spec).unwrap(), i.notes)
    };
    assert_eq!(inv(cut), inv(full));
}
