//! What a placed gang becomes for Kubernetes and for Slurm.
//!
//! - A `PodGroup` so the scheduler starts all workers or none: the
//!   scheduler-plugins coscheduling plugin's
//!   (`scheduling.x-k8s.io/v1alpha1`, pods labelled
//!   `scheduling.x-k8s.io/pod-group`) or Volcano's
//!   (`scheduling.volcano.sh/v1beta1`, pods annotated
//!   `scheduling.k8s.io/group-name`, `schedulerName: volcano`), both with
//!   `minMember` = workers.
//! - Per worker, its placement: `nvidia.com/gpu` limits, a required node
//!   affinity on the node's name to the planned node (for a gang over
//!   more than 8 nodes, to its group of nodes: [`KUEUE_MAX_PODSETS`]),
//!   the gang scheduler's `schedulerName` (`scheduler-plugins-scheduler`,
//!   the name scheduler-plugins installs its second scheduler under, or
//!   `volcano`), and, pinned to one node, the planned GPU indices as the
//!   annotation `gpuscale.io/gpus`.
//!   A job with a worker template (`spec.template`) gets one complete
//!   `v1/Pod` per worker, the template with the placement added; a job
//!   without one gets a `v1/PodTemplate` per worker holding the placement
//!   (the API server keeps it; a container image is optional in a
//!   template), to merge into the job's own launcher. Either way the file
//!   is a list of real objects that `kubectl apply -f gangs/` accepts.
//! - Kueue's topology-aware scheduling annotations on the pod template:
//!   `kueue.x-k8s.io/podset-required-topology` (or `-preferred-`) with the
//!   node label of the level ([`level_label`]), and its plain-Pod group:
//!   the label `kueue.x-k8s.io/pod-group-name` and the annotation
//!   `kueue.x-k8s.io/pod-group-total-count` (the workers), so that Kueue
//!   admits the workers as one Workload once the cluster adds its
//!   `kueue.x-k8s.io/queue-name` label.
//! - The `sbatch` directives of the same placement.

use gpuscale_policies::training::{GPU_RESOURCE, TopologyLevel, TopologyMode, slurm_name_problem};
use serde_json::{Map, Value, json};

use super::{GangPlan, GangStatus};

/// Which gang scheduler's `PodGroup` to emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GangScheduler {
    /// scheduler-plugins' coscheduling plugin.
    #[default]
    Coscheduling,
    /// Volcano.
    Volcano,
}

/// The node label Kueue reads for a topology level: the hostname, the
/// NVLink domain gpuscale labels (`gpuscale.io/nvlink-domain`, from the
/// cluster's `nvlinkDomain`), a rack label (`gpuscale.io/rack`: there is
/// no standard one), and the well-known zone label.
pub fn level_label(level: TopologyLevel) -> Option<&'static str> {
    match level {
        TopologyLevel::Node => Some("kubernetes.io/hostname"),
        TopologyLevel::NvlinkDomain => Some(crate::emit::NVLINK_DOMAIN_LABEL),
        TopologyLevel::Rack => Some(crate::emit::RACK_LABEL),
        TopologyLevel::Zone => Some("topology.kubernetes.io/zone"),
        TopologyLevel::Any => None,
    }
}

/// The gang's Kubernetes objects: the PodGroup, then one `Pod` (or
/// `PodTemplate`) per worker (placed gangs only; a waiting gang gets its PodGroup alone, so
/// the scheduler holds its pods). In the job's own namespace, else in
/// `namespace`.
pub fn kubernetes(
    g: &GangPlan,
    namespace: &str,
    scheduler: GangScheduler,
) -> Vec<serde_json::Value> {
    kubernetes_named(g, namespace, scheduler, None)
}

/// [`kubernetes`], with the workers' `schedulerName` given (where the
/// gang scheduler runs under another name: coscheduling in the default
/// scheduler's profile is `default-scheduler`).
pub fn kubernetes_named(
    g: &GangPlan,
    namespace: &str,
    scheduler: GangScheduler,
    scheduler_name: Option<&str>,
) -> Vec<serde_json::Value> {
    let namespace = g.namespace.as_deref().unwrap_or(namespace);
    let mut out = Vec::new();
    let total = g.workers_wanted * g.gpus_per_worker;
    let placed = matches!(g.status, GangStatus::Running | GangStatus::Starting);
    let pod_group = match scheduler {
        GangScheduler::Coscheduling => json!({
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": g.name, "namespace": namespace},
            "spec": {"minMember": g.workers_wanted, "scheduleTimeoutSeconds": 300},
        }),
        GangScheduler::Volcano => {
            let mut spec = json!({"minMember": g.workers_wanted});
            // Volcano's enqueue moves a PodGroup to `Inqueue` once its
            // `minResources` fit, and an Inqueue group holds that much of
            // its queue until its pods run (volcano-sh/volcano#5006): for
            // a gang the plan has not placed, whose pods do not exist,
            // that would keep GPUs from the jobs the plan runs. Placed
            // gangs name their GPUs, so Volcano admits them whole.
            if placed {
                spec["minResources"] = json!({"nvidia.com/gpu": total.to_string()});
            }
            json!({
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "PodGroup",
                "metadata": {"name": g.name, "namespace": namespace},
                "spec": spec,
            })
        }
    };
    out.push(pod_group);
    if !placed {
        return out;
    }
    let mut annotations = serde_json::Map::new();
    // Kueue's topology-aware scheduling places by the level's node label:
    // only where every node of the gang carries it (a node with no rack
    // is a rack of its own to gpuscale, and to Kueue in none at all; the
    // pinned workers meet the level either way).
    if let Some(label) = level_label(g.topology)
        && g.topology_labelled
    {
        let key = match g.topology_mode {
            TopologyMode::Required => "kueue.x-k8s.io/podset-required-topology",
            TopologyMode::Preferred => "kueue.x-k8s.io/podset-preferred-topology",
        };
        annotations.insert(key.into(), json!(label));
    }
    // Kueue's plain-Pod integration admits the workers as one Workload
    // only when they name their group and its size (with a
    // `kueue.x-k8s.io/queue-name` label the cluster adds).
    annotations.insert(
        "kueue.x-k8s.io/pod-group-total-count".into(),
        json!(g.workers_wanted.to_string()),
    );
    let mut labels = serde_json::Map::new();
    labels.insert("gpuscale.io/training-job".into(), json!(g.name));
    labels.insert("kueue.x-k8s.io/pod-group-name".into(), json!(g.name));
    let default_name = match scheduler {
        GangScheduler::Coscheduling => {
            labels.insert("scheduling.x-k8s.io/pod-group".into(), json!(g.name));
            "scheduler-plugins-scheduler"
        }
        GangScheduler::Volcano => {
            annotations.insert("scheduling.k8s.io/group-name".into(), json!(g.name));
            "volcano"
        }
    };
    let scheduler_name = scheduler_name.unwrap_or(default_name);
    let groups = node_groups(g);
    for w in &g.workers {
        // The worker's number is an annotation, not a label: Kueue's pod
        // groups make one PodSet per distinct pod shape (labels and spec;
        // at most 8 per Workload), and workers on one node then share one.
        let mut annotations = annotations.clone();
        annotations.insert("gpuscale.io/worker".into(), json!(w.worker.to_string()));
        let nodes = groups
            .iter()
            .find(|group| group.contains(&w.node.as_str()))
            .expect("every worker's node is in a group");
        // The planned GPUs, where the worker is pinned to its node alone.
        if nodes.len() == 1 {
            let gpus: Vec<String> = w.gpus.iter().map(ToString::to_string).collect();
            annotations.insert("gpuscale.io/gpus".into(), json!(gpus.join(",")));
        }
        let name = format!("{}-worker-{}", g.name, w.worker);
        let placement = Placement {
            nodes,
            gpus: w.gpus.len(),
            scheduler_name,
        };
        out.push(match &g.template {
            Some(t) => worker_pod(t, &name, namespace, &labels, &annotations, &placement),
            None => json!({
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": name, "namespace": namespace, "labels": labels},
                "template": {
                    "metadata": {"labels": labels, "annotations": annotations},
                    // A bare worker pod must not restart (it would train
                // again): the API server defaults a template's policy to
                // `Always`.
                "spec": placement.onto(json!({
                    "restartPolicy": "Never",
                    "containers": [{"name": "worker"}],
                })),
                },
            }),
        });
    }
    out
}

/// Most PodSets in a Kueue Workload: Kueue's plain-Pod groups make one
/// per distinct pod shape (its labels and scheduling-relevant spec, the
/// node affinity among them), and refuse a group of more (KEP-976,
/// *Groups of Pods created beforehand*).
pub const KUEUE_MAX_PODSETS: usize = 8;

/// The gang's nodes, in the order its workers name them, as the groups
/// its workers are pinned to: one node each, or, where the gang spans
/// more than [`KUEUE_MAX_PODSETS`] nodes, that many runs of consecutive
/// nodes (their sizes differing by one at most), so that its workers
/// take at most as many pod shapes. A worker pinned to a group may start
/// on any of its nodes; the group holds exactly its workers, since every
/// worker asks for as many GPUs and each node has at least its planned
/// workers' GPUs free, so the workers fit however the scheduler deals
/// them out.
fn node_groups(g: &GangPlan) -> Vec<Vec<&str>> {
    let nodes: Vec<&str> = planned_nodes(g).into_iter().map(|(n, _)| n).collect();
    if nodes.len() <= KUEUE_MAX_PODSETS {
        return nodes.into_iter().map(|n| vec![n]).collect();
    }
    let (per, extra) = (
        nodes.len() / KUEUE_MAX_PODSETS,
        nodes.len() % KUEUE_MAX_PODSETS,
    );
    let mut rest = nodes.as_slice();
    (0..KUEUE_MAX_PODSETS)
        .map(|i| {
            let (group, tail) = rest.split_at(per + usize::from(i < extra));
            rest = tail;
            group.to_vec()
        })
        .collect()
}

/// The gang's nodes in the order its workers name them, each with its
/// number of workers.
fn planned_nodes(g: &GangPlan) -> Vec<(&str, usize)> {
    let mut nodes: Vec<(&str, usize)> = Vec::new();
    for w in &g.workers {
        match nodes.iter_mut().find(|(n, _)| *n == w.node) {
            Some((_, count)) => *count += 1,
            None => nodes.push((&w.node, 1)),
        }
    }
    nodes
}

/// Where one worker runs, as the pod spec says it.
struct Placement<'a> {
    /// The node it was planned on, or the group of nodes it may start on
    /// ([`node_groups`]).
    nodes: &'a [&'a str],
    gpus: usize,
    scheduler_name: &'a str,
}

impl Placement<'_> {
    /// `spec` with the placement added: the gang scheduler, the node (or
    /// the group of nodes) as a required node affinity (ANDed into every term the spec already has,
    /// since terms are ORed), and the GPUs on the container that asks for
    /// them (the first if none does; the job's check allows one at most).
    fn onto(&self, mut spec: Value) -> Value {
        spec["schedulerName"] = json!(self.scheduler_name);
        // The node by its name (a field, as the inference variants pin
        // theirs): its `kubernetes.io/hostname` label may differ
        // (`--hostname-override`).
        let on_node = json!({
            "key": "metadata.name",
            "operator": "In",
            "values": self.nodes,
        });
        let required =
            &mut spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
        match required["nodeSelectorTerms"].as_array_mut() {
            Some(terms) if !terms.is_empty() => {
                for term in terms {
                    match term["matchFields"].as_array_mut() {
                        Some(f) => f.push(on_node.clone()),
                        None => term["matchFields"] = json!([on_node.clone()]),
                    }
                }
            }
            _ => required["nodeSelectorTerms"] = json!([{"matchFields": [on_node]}]),
        }
        if let Some(containers) = spec["containers"].as_array_mut()
            && !containers.is_empty()
        {
            let asks = |c: &Value| {
                ["limits", "requests"]
                    .iter()
                    .any(|k| c["resources"][k].get(GPU_RESOURCE).is_some())
            };
            let i = containers.iter().position(asks).unwrap_or(0);
            let resources = &mut containers[i]["resources"];
            resources["limits"][GPU_RESOURCE] = json!(self.gpus);
            if resources["requests"].get(GPU_RESOURCE).is_some() {
                resources["requests"][GPU_RESOURCE] = json!(self.gpus);
            }
        }
        spec
    }
}

/// A worker's complete `Pod`: the job's template with the placement
/// added, its name and namespace set, and the gang's labels and
/// annotations over the template's. A template without a restart policy
/// gets `Never` (a bare pod's default, `Always`, would run a finished
/// worker's training again).
fn worker_pod(
    template: &Value,
    name: &str,
    namespace: &str,
    labels: &Map<String, Value>,
    annotations: &Map<String, Value>,
    placement: &Placement<'_>,
) -> Value {
    let mut metadata = match template.get("metadata") {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    metadata.remove("generateName");
    metadata.insert("name".into(), json!(name));
    metadata.insert("namespace".into(), json!(namespace));
    for (key, ours) in [("labels", labels), ("annotations", annotations)] {
        let mut merged = match metadata.get(key) {
            Some(Value::Object(m)) => m.clone(),
            _ => Map::new(),
        };
        merged.extend(ours.clone());
        metadata.insert(key.into(), Value::Object(merged));
    }
    let mut spec = placement.onto(template.get("spec").cloned().unwrap_or_else(|| json!({})));
    if spec.get("restartPolicy").is_none() {
        spec["restartPolicy"] = json!("Never");
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// `sbatch` directives for the same placement (placed gangs): one task
/// per worker, its GPUs per task, the planned nodes, and every node up
/// before the job starts (`--wait-all-nodes=1`). Where the nodes run
/// unequal numbers of workers, a heterogeneous job (`#SBATCH hetjob`
/// between components, Slurm 17.11 and later): one component per count
/// of workers on a node, each with its nodes, tasks per node and GPUs,
/// all started together. (`--distribution=arbitrary` with a host file
/// does not do it: sbatch reads `SLURM_HOSTFILE` only without
/// `--nodelist`, and on an allocation the distribution chooses nodes,
/// not how many tasks each runs.)
pub fn sbatch(g: &GangPlan) -> Option<String> {
    if g.workers.is_empty() {
        return None;
    }
    // One component per workers-per-node count, in order of first use.
    let mut components: Vec<(usize, Vec<&str>)> = Vec::new();
    for (node, count) in planned_nodes(g) {
        match components.iter_mut().find(|(c, _)| *c == count) {
            Some((_, ns)) => ns.push(node),
            None => components.push((count, vec![node])),
        }
    }
    let mut s = String::from("#!/bin/bash\n");
    s.push_str(&format!("#SBATCH --job-name={}\n", g.name));
    if components.len() > 1 {
        s.push_str(&format!(
            "# unequal workers per node: a heterogeneous job of {} components, one per count of \
             workers on a node, started together; run every component's tasks with \
             `srun --het-group=0-{}`\n",
            components.len(),
            components.len() - 1
        ));
    }
    let time = g.time_limit_s.or(g.estimated_runtime_s);
    for (i, (per_node, component)) in components.iter().enumerate() {
        if i > 0 {
            s.push_str("#SBATCH hetjob\n");
        }
        // The queue's partition and the fair-share account, so Slurm's
        // own limits and fair share apply as gpuscale's did (each
        // component names them: a component's partition is its own).
        // (Names the loader checked are single tokens; anything else, from
        // a plan read back, is left out rather than written into a line.)
        if let Some(p) = g
            .slurm_partition
            .as_deref()
            .filter(|p| slurm_name_problem(p).is_none())
        {
            s.push_str(&format!("#SBATCH --partition={p}\n"));
        }
        if let Some(a) = g
            .account
            .as_deref()
            .filter(|a| slurm_name_problem(a).is_none())
        {
            s.push_str(&format!("#SBATCH --account={a}\n"));
        }
        s.push_str(&format!("#SBATCH --nodes={}\n", component.len()));
        s.push_str(&format!(
            "#SBATCH --ntasks={}\n",
            per_node * component.len()
        ));
        s.push_str(&format!("#SBATCH --ntasks-per-node={per_node}\n"));
        s.push_str(&format!(
            "#SBATCH --gres=gpu:{}\n",
            *per_node as u32 * g.gpus_per_worker
        ));
        s.push_str(&format!("#SBATCH --gpus-per-task={}\n", g.gpus_per_worker));
        s.push_str(&format!("#SBATCH --nodelist={}\n", component.join(",")));
        s.push_str("#SBATCH --wait-all-nodes=1\n");
        if let Some(secs) = time {
            // At least a minute: Slurm reads `--time=0` as no limit.
            let m = secs.div_ceil(60).max(1);
            s.push_str(&format!("#SBATCH --time={}:{:02}:00\n", m / 60, m % 60));
        }
    }
    if time.is_some() {
        // Slurm's `--time` is a limit; gpuscale's queue keeps a job past
        // its estimate running (Kubernetes ends nothing at an estimate).
        s.push_str(
            "# --time is the runtime gpuscale's queue planned with (the job's estimatedRuntime \
             within its partition's maxRuntime, else the partition's defaultRuntime, else its \
             maxRuntime, else the queue's defaultRuntime): Slurm ends the job there, while \
             gpuscale's queue expects an overdue job to end any moment\n",
        );
    }
    // What the plan stops for it: Slurm preempts by its own rules
    // (PreemptType, QOS), so the plan's choice is written down, not done.
    for p in &g.preempts {
        let what = match p.kind {
            super::VictimKind::Job => format!("job `{}` ({} GPUs)", p.name, p.count),
            super::VictimKind::Replicas => format!("{} replicas of `{}`", p.count, p.name),
        };
        s.push_str(&format!("# gpuscale plan: preempts {what}: {}\n", p.reason));
    }
    s.push_str("# the job's own command follows, e.g.: srun ./train.sh\n");
    Some(s)
}

/// Files for `gpuscale plan --emit DIR`: `gangs/<job>.yaml` (the
/// PodGroup and the workers' objects) and, for a gang this plan starts,
/// `gangs/<job>.sbatch`.
pub fn files(
    gangs: &[GangPlan],
    namespace: &str,
    scheduler: GangScheduler,
) -> Result<Vec<(String, String)>, serde_yaml_ng::Error> {
    files_named(gangs, namespace, scheduler, None)
}

/// [`files`], with the workers' `schedulerName` given
/// ([`kubernetes_named`]).
pub fn files_named(
    gangs: &[GangPlan],
    namespace: &str,
    scheduler: GangScheduler,
    scheduler_name: Option<&str>,
) -> Result<Vec<(String, String)>, serde_yaml_ng::Error> {
    let mut out = Vec::new();
    for g in gangs {
        let docs = kubernetes_named(g, namespace, scheduler, scheduler_name);
        let mut text = String::new();
        for d in &docs {
            text.push_str("---\n");
            text.push_str(&crate::emit::to_yaml(d)?);
        }
        out.push((format!("gangs/{}.yaml", g.name), text));
        // Only for a gang this plan starts: `sbatch` submits, it does not
        // reconcile, so a script for a gang already running (kept from
        // `--current` or the cluster file) would start a second copy.
        if g.status != GangStatus::Starting {
            continue;
        }
        if let Some(s) = sbatch(g) {
            out.push((format!("gangs/{}.sbatch", g.name), s));
        }
    }
    Ok(out)
}
