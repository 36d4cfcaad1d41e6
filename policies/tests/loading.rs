//! Loading real files: every example is valid, and broken inputs give
//! located problems naming the field.

use std::path::Path;

use gpuscale_policies::{Problem, load_paths, load_sources};

fn problems(name: &str, text: &str) -> Vec<Problem> {
    load_sources(&[(Path::new(name), text)]).unwrap_err().0
}

/// Each problem's line and field path.
fn located(p: &[Problem]) -> Vec<(usize, &str)> {
    p.iter()
        .map(|p| (p.position.line, p.path.as_str()))
        .collect()
}

const POLICY: &str = "\
apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata:
  name: m
spec:
  resources:
    memoryGiB: 12
    compute: 0.2
    maxConcurrency: 8
";

#[test]
fn the_examples_are_valid() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let bundle = load_paths(&[root]).unwrap_or_else(|p| panic!("{p}"));
    assert!(bundle.models.len() >= 10);
    assert_eq!(bundle.jobs.len(), 3);
    assert_eq!(bundle.queue.as_ref().unwrap().partitions.len(), 2);
    let cluster = bundle.cluster.unwrap();
    assert_eq!(cluster.gpu_count(), 4 * 8 + 2 * 8 + 8 + 2 * 4);
    assert_eq!(
        bundle.catalog.get("H100-80GB").unwrap().price_per_hour,
        2.49
    );
    let llama = bundle
        .models
        .iter()
        .find(|m| m.name == "llama-3-1-8b")
        .unwrap();
    assert!((llama.memory_gib - 20.957).abs() < 1e-3);
    assert_eq!(llama.served_name, "meta-llama/Llama-3.1-8B-Instruct");
}

#[test]
fn a_valid_minimal_policy_loads_with_defaults() {
    let b = load_sources(&[(Path::new("p.yaml"), POLICY)]).unwrap();
    let m = &b.models[0];
    assert_eq!(m.memory_gib, 12.0);
    assert_eq!(m.scaling.min_replicas, 1);
    assert_eq!(m.tensor_parallel, [1]);
}

#[test]
fn unknown_field_is_located_and_named() {
    let text = POLICY.replace("    compute: 0.2\n", "    compute: 0.2\n    gpuMemory: 3\n");
    let p = problems("p.yaml", &text);
    assert_eq!(p.len(), 1);
    assert_eq!((p[0].position.line, p[0].position.column), (9, 5));
    assert_eq!(p[0].path, "spec.resources.gpuMemory");
    assert!(
        p[0].message.starts_with("unknown field `gpuMemory`"),
        "{}",
        p[0]
    );
    assert_eq!(
        p[0].to_string().split(": ").next().unwrap(),
        "p.yaml:9:5",
        "{}",
        p[0]
    );
}

#[test]
fn wrong_type_is_located_and_named() {
    let text = POLICY.replace("maxConcurrency: 8", "maxConcurrency: eight");
    let p = problems("p.yaml", &text);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].path, "spec.resources.maxConcurrency");
    assert_eq!(p[0].position.line, 9);
    assert!(p[0].message.contains("`eight` is not a number"), "{}", p[0]);
}

#[test]
fn impossible_memory_says_so() {
    let text = POLICY.replace("memoryGiB: 12", "memoryGiB: 900").replace(
        "spec:\n",
        "spec:\n  placement:\n    gpuModels: [H100-80GB]\n    tensorParallel: [1, 2]\n",
    );
    let p = problems("p.yaml", &text);
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].path, "spec.resources");
    assert!(p[0].message.contains("needs 900.00 GiB"), "{}", p[0]);
    assert!(
        p[0].message.contains("2×H100-80GB gives 158.50 GiB"),
        "{}",
        p[0]
    );
}

#[test]
fn every_problem_of_every_document_is_reported() {
    let second = POLICY
        .replace("name: m", "name: n")
        .replace("compute: 0.2", "compute: -1")
        .replace("maxConcurrency: 8", "maxConcurrency: 0");
    let third = POLICY.replace("kind: ModelPolicy", "kind: ModelPolcy");
    let text = format!("{POLICY}---\n{second}---\n{third}---\n{POLICY}");
    let p = problems("many.yaml", &text);
    let summary = located(&p);
    assert_eq!(
        summary,
        [
            (18, "spec.resources.compute"),
            (19, "spec.resources.maxConcurrency"),
            (22, "kind"),
            (34, "metadata.name"),
        ],
        "{p:#?}"
    );
    assert!(p[3].message.contains("defined twice"));
}

#[test]
fn json_problems_are_located_too() {
    let text = "{\n  \"apiVersion\": \"gpuscale.io/v1alpha1\",\n  \"kind\": \"TrainingJob\",\n  \"metadata\": {\"name\": \"j\"},\n  \"spec\": {\"workers\": 2, \"gpusPerWorker\": \"8\"}\n}\n";
    let p = problems("job.json", text);
    assert_eq!(p[0].path, "spec.gpusPerWorker");
    assert_eq!(p[0].position.line, 5);
}

#[test]
fn cluster_and_cross_document_checks() {
    let cluster = "\
apiVersion: gpuscale.io/v1alpha1
kind: Cluster
metadata: {name: small}
spec:
  nodes:
    - name: a
      gpuModel: L4
      gpuCount: 2
      gpus:
        - {index: 0, mode: whole, workloads: [{model: ghost}]}
";
    let big = POLICY.replace("memoryGiB: 12", "memoryGiB: 60").replace(
        "spec:\n",
        "spec:\n  placement:\n    tensorParallel: [4]\n    sharing: [whole]\n    gpuModels: [L4]\n",
    );
    let job = "\
apiVersion: gpuscale.io/v1alpha1
kind: TrainingJob
metadata: {name: j}
spec: {workers: 4, gpusPerWorker: 2, gpuModels: [L4]}
";
    let p = load_sources(&[
        (Path::new("c.yaml"), cluster),
        (Path::new("p.yaml"), big.as_str()),
        (Path::new("j.yaml"), job),
    ])
    .unwrap_err()
    .0;
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert_eq!(p.len(), 3, "{text:#?}");
    assert!(
        text[0].starts_with("c.yaml:10:48: spec.nodes[0].gpus[0].workloads[0].model:")
            && text[0].contains("ghost"),
        "{}",
        text[0]
    );
    assert!(
        text[1].starts_with("j.yaml:4:") && text[1].contains("cannot hold"),
        "{}",
        text[1]
    );
    assert!(
        text[2].starts_with("p.yaml:6:") && text[2].contains("4×L4 on one node"),
        "{}",
        text[2]
    );
}

#[test]
fn syntax_errors_and_bad_documents() {
    let p = problems(
        "bad.yaml",
        "apiVersion: gpuscale.io/v1alpha1\nkind: [unclosed\n",
    );
    assert!(p[0].message.contains("YAML syntax error"));
    assert_eq!(p[0].position.line, 3);
    let p = problems("bad.yaml", "- just\n- a list\n");
    assert!(p[0].message.contains("expected a mapping"), "{}", p[0]);
    let p = problems("bad.yaml", "apiVersion: v1\nkind: ModelPolicy\n");
    assert_eq!(p[0].path, "apiVersion");
    let text = POLICY.replace("name: m", "name: Not_Valid");
    let p = problems("bad.yaml", &text);
    assert_eq!(p[0].path, "metadata.name");
}

#[test]
fn one_mistake_is_said_once_and_plainly() {
    // An unknown GPU model on a node with a MIG GPU: the model, not a
    // second "does not support MIG" at the GPU's mode.
    let text = cluster_file(
        "
    - name: a
      gpuModel: H100-80G
      gpuCount: 8
      gpus:
        - index: 0
          mode: mig
          geometry: [{profile: 7g.80gb, start: 0}]
",
    );
    let p = problems("c.yaml", &text);
    assert_eq!(located(&p), vec![(8, "spec.nodes[0].gpuModel")], "{p:#?}");
    // A JSON syntax error says its place once, in the problem's place.
    let p = problems("j.json", "{\n  \"kind\": \n");
    assert!(p[0].message.starts_with("JSON syntax error"), "{}", p[0]);
    assert!(!p[0].message.contains(" at line "), "{}", p[0]);
    // No sharing mode: every mode is offered.
    let text = format!("{POLICY}  placement: {{sharing: []}}\n");
    let p = problems("p.yaml", &text);
    let m = &p
        .iter()
        .find(|p| p.path == "spec.placement.sharing")
        .unwrap()
        .message;
    for mode in [
        "mig",
        "timeslice",
        "whole",
        "mps",
        "fractional",
        "mig-timeslice",
    ] {
        assert!(m.contains(mode), "{m}");
    }
    // A negative duration is named as signed, not as a parser's position.
    let text = format!("{POLICY}  scaling: {{startupTime: -45s}}\n");
    let p = problems("p.yaml", &text);
    assert!(p[0].message.contains("has no sign"), "{}", p[0]);
}

/// A `kind: Cluster` file named `c` with these `spec.nodes` entries,
/// given from a first line break (the first entry lands on line 7).
fn cluster_file(nodes: &str) -> String {
    let nodes = nodes.strip_prefix('\n').unwrap_or(nodes);
    format!(
        "apiVersion: gpuscale.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\nspec:\n  nodes:\n{nodes}"
    )
}

#[test]
fn a_mig_timeslice_profile_the_gpu_lacks_is_located() {
    let text = cluster_file(
        "
    - name: a
      gpuModel: A100-40GB
      gpuCount: 8
      sharing: [mig, mig-timeslice]
      migTimeslice: {profile: 1g.20gb, replicas: 3}
",
    );
    let p = problems("cluster.yaml", &text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path, "spec.nodes[0].migTimeslice.profile");
    assert_eq!(p[0].position.line, 11);
    assert!(p[0].message.contains("1g.5gb"), "{}", p[0].message);
    let fixed = text.replace("1g.20gb", "1g.5gb");
    let b = load_sources(&[(Path::new("cluster.yaml"), fixed.as_str())]).unwrap();
    let t = b.cluster.unwrap().nodes[0].mig_timeslice.clone().unwrap();
    assert_eq!((t.profile.as_str(), t.replicas), ("1g.5gb", 3));
}

#[test]
fn a_hami_split_count_is_located_and_needs_fractional() {
    let text = cluster_file(
        "
    - name: a
      gpuModel: H100-80GB
      gpuCount: 8
      sharing: [fractional]
      hamiSplitCount: 0
    - name: b
      gpuModel: H100-80GB
      gpuCount: 8
      hamiSplitCount: 4
",
    );
    let p = problems("cluster.yaml", &text);
    assert_eq!(
        located(&p),
        [
            (11, "spec.nodes[0].hamiSplitCount"),
            (15, "spec.nodes[1].hamiSplitCount")
        ],
        "{p:?}"
    );
    assert!(
        p[0].message.contains("between 1 and 1000"),
        "{}",
        p[0].message
    );
    assert!(p[1].message.contains("`fractional`"), "{}", p[1].message);
    let huge = text.replace("hamiSplitCount: 0", "hamiSplitCount: 1000000");
    let p = problems("cluster.yaml", &huge);
    assert_eq!(p[0].path, "spec.nodes[0].hamiSplitCount");
    assert!(p[0].message.contains("got 1000000"), "{}", p[0].message);
    let fixed = text
        .replace("hamiSplitCount: 0", "hamiSplitCount: 5")
        .replace("      hamiSplitCount: 4\n", "");
    let b = load_sources(&[(Path::new("cluster.yaml"), fixed.as_str())]).unwrap();
    let nodes = b.cluster.unwrap().nodes;
    assert_eq!(
        (nodes[0].hami_split_count, nodes[1].hami_split_count),
        (Some(5), None)
    );
}

#[test]
fn training_queue_problems_are_located() {
    let queue = "\
apiVersion: gpuscale.io/v1alpha1
kind: TrainingQueue
metadata: {name: q}
spec:
  partitions:
    - {name: dev, default: true, maxRuntime: 4h, defaultRuntime: 5h, gpuModels: [H100-80GB]}
    - {name: dev, default: true, gpuModels: [Z9000]}
  fairShare:
    accounts:
      - {name: nlp, shares: 0}
  weights: {qos: 1e308, age: 4294967295, runtime: -1}
";
    let p = load_sources(&[(Path::new("q.yaml"), queue)]).unwrap_err().0;
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    // A weight past Slurm's 32-bit range made every job's priority
    // infinite (a tie); the largest 32-bit weight is still one.
    assert!(
        text.iter().any(|t| t.starts_with("q.yaml:11:")
            && t.contains("spec.weights.qos: must be 0 to 4294967295 (Slurm's range), got 1e308")),
        "{text:#?}"
    );
    assert!(
        !text.iter().any(|t| t.contains("spec.weights.age")),
        "{text:#?}"
    );
    assert!(
        text.iter().any(|t| t.starts_with("q.yaml:11:")
            && t.contains("spec.weights.runtime: must be 0 to 4294967295")),
        "{text:#?}"
    );
    for want in [
        "spec.partitions[1].name: partition `dev` is defined twice",
        "spec.partitions[1].default: only one partition may be the default",
        "spec.partitions[1].gpuModels[0]: unknown GPU model `Z9000`",
        "spec.fairShare.accounts[0].shares: must be a positive number",
        "spec.partitions[0].defaultRuntime: 5h is over the partition's maxRuntime of 4h",
    ] {
        assert!(
            text.iter()
                .any(|t| t.starts_with("q.yaml:") && t.contains(want)),
            "{want} not in {text:#?}"
        );
    }

    // A job over its partition's limits, checked against a valid queue.
    let good = queue
        .replace(
            "- {name: dev, default: true, gpuModels: [Z9000]}",
            "- {name: prod}",
        )
        .replace("defaultRuntime: 5h", "defaultRuntime: 2h")
        .replace("shares: 0", "shares: 1")
        .replace("qos: 1e308", "qos: 1")
        .replace("runtime: -1", "runtime: 1");
    let job = "\
apiVersion: gpuscale.io/v1alpha1
kind: TrainingJob
metadata: {name: j}
spec:
  workers: 1
  gpusPerWorker: 2
  gpuModels: [A100-40GB]
  estimatedRuntime: 10h
  submittedAt: 2026-12-01T08:00:00Z
";
    let p = load_sources(&[
        (Path::new("q.yaml"), good.as_str()),
        (Path::new("j.yaml"), job),
    ])
    .unwrap_err()
    .0;
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert!(
        text.iter()
            .any(|t| t.starts_with("j.yaml:8:") && t.contains("over partition `dev`'s maxRuntime")),
        "{text:#?}"
    );
    assert!(
        text.iter().any(|t| t.starts_with("j.yaml:7:")
            && t.contains("not allowed in partition `dev`")
            || t.starts_with("j.yaml:7:") && t.contains("none of [A100-40GB]")),
        "{text:#?}"
    );
    // A job naming a partition beside a queue with problems of its own:
    // the queue's problems, not also "no TrainingQueue was given".
    let named = job.replace("  workers: 1", "  workers: 1\n  partition: dev");
    let p = load_sources(&[
        (Path::new("q.yaml"), queue),
        (Path::new("j.yaml"), named.as_str()),
    ])
    .unwrap_err()
    .0;
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert!(text.iter().any(|t| t.starts_with("q.yaml:")), "{text:#?}");
    assert!(
        !text.iter().any(|t| t.contains("no TrainingQueue")),
        "{text:#?}"
    );
    // Without any queue, naming a partition is the job's problem.
    let p = load_sources(&[(Path::new("j.yaml"), named.as_str())])
        .unwrap_err()
        .0;
    assert!(
        p.iter().any(|t| t
            .to_string()
            .contains("no TrainingQueue document was given")),
        "{p:#?}"
    );
    // An account or partition name is a single Slurm token: the `sbatch`
    // script writes it into a directive line, where a newline would end
    // the directives and run the rest as a command.
    let injected = job.replace(
        "estimatedRuntime: 10h",
        "estimatedRuntime: 1h\n  account: \"nlp\\necho INJECTED\"",
    );
    let p = load_sources(&[(Path::new("j.yaml"), injected.as_str())])
        .unwrap_err()
        .0;
    assert!(
        p.iter().any(|p| p.path == "spec.account"
            && p.to_string().starts_with("j.yaml:9:")
            && p.message
                .contains("`nlp\\necho INJECTED` is not a Slurm name")),
        "{p:#?}"
    );
    let spaced = good.replace("- {name: prod}", "- {name: \"Dev Partition!\"}");
    let p = load_sources(&[(Path::new("q.yaml"), spaced.as_str())])
        .unwrap_err()
        .0;
    assert!(
        p.iter()
            .any(|p| p.path == "spec.partitions[1].name" && p.message.contains("not a Slurm name")),
        "{p:#?}"
    );
    let p = load_sources(&[(
        Path::new("q.yaml"),
        good.replace("{name: nlp, shares: 1}", "{name: \"team a\", shares: 1}")
            .as_str(),
    )])
    .unwrap_err()
    .0;
    assert!(
        p.iter()
            .any(|p| p.path == "spec.fairShare.accounts[0].name"),
        "{p:#?}"
    );
    // Zero durations and empty names are errors, not silent zeros.
    let zero = job.replace(
        "estimatedRuntime: 10h",
        "estimatedRuntime: 0s\n  checkpointInterval: 0s\n  account: \"\"",
    );
    let p = load_sources(&[(Path::new("j.yaml"), zero.as_str())])
        .unwrap_err()
        .0;
    let paths: Vec<&str> = p.iter().map(|p| p.path.as_str()).collect();
    for want in [
        "spec.estimatedRuntime",
        "spec.checkpointInterval",
        "spec.account",
    ] {
        assert!(paths.contains(&want), "{want} not in {paths:?}");
    }
    // A bad timestamp is a located parse error.
    let bad_time = job.replace("2026-12-01T08:00:00Z", "yesterday");
    let p = load_sources(&[(Path::new("j.yaml"), bad_time.as_str())])
        .unwrap_err()
        .0;
    assert!(p[0].to_string().starts_with("j.yaml:9:"), "{p:?}");
    assert!(p[0].path.contains("submittedAt"), "{p:?}");
    // RFC 3339 with an offset is the same instant as in UTC; without a
    // zone it names no instant and is refused.
    let submitted = |text: &str| {
        let b = load_sources(&[(Path::new("j.yaml"), text)]).unwrap();
        b.jobs[0].spec.submitted_at.unwrap()
    };
    assert_eq!(
        submitted(&job.replace("2026-12-01T08:00:00Z", "2026-12-01T09:30:00+01:30")),
        submitted(job)
    );
    let zoneless = job.replace("2026-12-01T08:00:00Z", "2026-12-01T08:00:00");
    let p = load_sources(&[(Path::new("j.yaml"), zoneless.as_str())])
        .unwrap_err()
        .0;
    assert!(
        p[0].to_string().starts_with("j.yaml:9:")
            && p[0].message.contains("not an RFC 3339 time with a zone"),
        "{p:?}"
    );
}

#[test]
fn server_args_load_and_flags_gpuscale_sets_are_refused_where_written() {
    let ok = POLICY.replace(
        "spec:\n",
        "spec:\n  serverArgs: [\"--max-model-len\", \"8192\"]\n",
    );
    let b = load_sources(&[(Path::new("p.yaml"), ok.as_str())]).unwrap();
    assert_eq!(b.models[0].server_args, ["--max-model-len", "8192"]);
    let bad = POLICY.replace(
        "spec:\n",
        "spec:\n  serverArgs:\n    - --max-model-len=8192\n    - --gpu-memory-utilization=0.5\n    - \"\"\n    - -tp\n",
    );
    let p = problems("p.yaml", &bad);
    let summary = located(&p);
    assert_eq!(
        summary,
        [
            (8, "spec.serverArgs[1]"),
            (9, "spec.serverArgs[2]"),
            (10, "spec.serverArgs[3]"),
        ],
        "{p:#?}"
    );
    assert!(
        p[0].message
            .contains("`--gpu-memory-utilization` is set by gpuscale"),
        "{}",
        p[0]
    );
    assert!(p[1].message.contains("must not be empty"), "{}", p[1]);
    // The spellings the server's parser also reads (vLLM: `_` for `-`;
    // argparse: a unique prefix, a short flag glued to its value).
    for sneaky in [
        "--gpu_memory_utilization=0.95",
        "--gpu-memory-util",
        "--tensor_parallel_size",
        "-tp8",
        "--mod",
    ] {
        let bad = POLICY.replace(
            "spec:\n",
            &format!("spec:\n  serverArgs: [\"{sneaky}\", \"1\"]\n"),
        );
        let p = problems("p.yaml", &bad);
        assert_eq!(p.len(), 1, "{sneaky}: {p:#?}");
        assert_eq!(p[0].path, "spec.serverArgs[0]", "{sneaky}");
    }
    // Flags that merely begin like a reserved one are the server's own.
    for fine in [
        "--model-loader-extra-config",
        "--max-num-seqs",
        "--port-range",
    ] {
        let ok = POLICY.replace(
            "spec:\n",
            &format!("spec:\n  serverArgs: [\"{fine}\", \"1\"]\n"),
        );
        assert!(
            load_sources(&[(Path::new("p.yaml"), ok.as_str())]).is_ok(),
            "{fine}"
        );
    }
}

#[test]
fn a_demand_outside_the_policys_bounds_is_located() {
    let policy = format!("{POLICY}  scaling: {{minReplicas: 2, maxReplicas: 5}}\n");
    let demand = |n: u32| {
        format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: Demand\nmetadata: {{name: d}}\nspec:\n  replicas:\n    m: {n}\n"
        )
    };
    for (n, want) in [
        (6, "6 is above the ModelPolicy's maxReplicas 5"),
        (1, "1 is below the ModelPolicy's minReplicas 2"),
    ] {
        let d = demand(n);
        let p = load_sources(&[
            (Path::new("m.yaml"), policy.as_str()),
            (Path::new("d.yaml"), d.as_str()),
        ])
        .unwrap_err()
        .0;
        assert_eq!(located(&p), vec![(6, "spec.replicas.m")], "{p:#?}");
        assert!(p[0].to_string().contains(want), "{}", p[0]);
    }
    for n in [2, 5] {
        let d = demand(n);
        let b = load_sources(&[
            (Path::new("m.yaml"), policy.as_str()),
            (Path::new("d.yaml"), d.as_str()),
        ])
        .unwrap();
        assert_eq!(b.demand.unwrap()["m"], n);
    }
}

#[test]
fn a_demand_given_without_its_policies_says_to_give_them() {
    let demand = "apiVersion: gpuscale.io/v1alpha1\nkind: Demand\nmetadata: {name: d}\nspec:\n  replicas:\n    m: 1\n    other: 1\n";
    let p = load_sources(&[(Path::new("d.yaml"), demand)])
        .unwrap_err()
        .0;
    assert_eq!(located(&p).len(), 2, "{p:#?}");
    assert!(
        p[0].to_string().contains("none was given with this Demand")
            && p[0].to_string().contains("gpuscale validate examples/"),
        "{}",
        p[0]
    );
    // With policies given, a name none of them has is only that.
    let p = load_sources(&[(Path::new("m.yaml"), POLICY), (Path::new("d.yaml"), demand)])
        .unwrap_err()
        .0;
    assert_eq!(located(&p), vec![(7, "spec.replicas.other")], "{p:#?}");
    assert!(
        p[0].to_string()
            .contains("no ModelPolicy named `other` among the policies given"),
        "{}",
        p[0]
    );
}

#[test]
fn an_absurd_node_template_is_located() {
    let text = cluster_file(
        "
    - name: t
      count: 20001
      gpuModel: H100-80GB
      gpuCount: 8
",
    );
    let p = problems("cluster.yaml", &text);
    assert_eq!(located(&p), vec![(8, "spec.nodes[0].count")], "{p:#?}");
    let fine = text.replace("count: 20001", "count: 20000");
    assert!(load_sources(&[(Path::new("cluster.yaml"), fine.as_str())]).is_ok());
}

#[test]
fn a_zero_slo_target_is_located() {
    let policy = format!("{POLICY}  slo: {{ttftP95: 0s, latencyP95: 2s}}\n");
    let p = problems("m.yaml", &policy);
    assert_eq!(located(&p), vec![(10, "spec.slo.ttftP95")], "{p:#?}");
    assert!(p[0].message.contains("more than 0"), "{}", p[0].message);
}

/// The problems of `cluster` loaded with the policy `m` and a 1 × 2-GPU
/// training job `tj` (which the cluster's GPUs are expected to misuse).
fn with_a_two_gpu_job(cluster: &str) -> Vec<Problem> {
    let job = "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: tj}\nspec: {workers: 1, gpusPerWorker: 2}\n";
    match load_sources(&[
        (Path::new("c.yaml"), cluster),
        (Path::new("m.yaml"), POLICY),
        (Path::new("j.yaml"), job),
    ]) {
        Ok(_) => panic!("a gang's GPU shared or sliced passed"),
        Err(p) => p.0,
    }
}

#[test]
fn a_training_job_on_a_shared_gpu_is_located() {
    // A time-sliced GPU running a training job's worker and a model's
    // replica: a gang's GPUs are whole, so the file is wrong.
    let cluster = cluster_file(
        "
    - name: h
      gpuModel: H100-80GB
      gpuCount: 2
      gpus:
        - {index: 0, mode: timeslice, workloads: [{model: tj}, {model: m}]}
        - {index: 1, mode: whole, workloads: [{model: tj}]}
",
    );
    let p = with_a_two_gpu_job(&cluster);
    assert!(
        p.iter()
            .any(|p| p.path == "spec.nodes[0].gpus[0].workloads[0].model"
                && p.message.contains("never shared")),
        "{p:#?}"
    );
}

#[test]
fn a_gang_no_domain_or_partition_can_ever_hold_is_located() {
    // Two 8-GPU H100 nodes, each its own NVLink domain, one rack.
    let cluster = cluster_file(
        "
    - {name: a, gpuModel: H100-80GB, gpuCount: 8, rack: r0, nvlinkDomain: d0}
    - {name: b, gpuModel: H100-80GB, gpuCount: 8, rack: r0, nvlinkDomain: d1}
",
    );
    let job = |spec: &str| {
        format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {{name: j}}\nspec:\n  workers: 2\n  gpusPerWorker: 8\n{spec}"
        )
    };
    let queue = "\
apiVersion: gpuscale.io/v1alpha1
kind: TrainingQueue
metadata: {name: q}
spec:
  partitions:
    - {name: small, nodes: [a]}
    - {name: all, default: true}
";
    let run = |job: &str| -> Vec<String> {
        match load_sources(&[
            (Path::new("c.yaml"), cluster.as_str()),
            (Path::new("q.yaml"), queue),
            (Path::new("j.yaml"), job),
        ]) {
            Ok(_) => Vec::new(),
            Err(p) => p.0.iter().map(|p| p.to_string()).collect(),
        }
    };
    // Required NVLink domain: each holds one 8-GPU worker.
    let p = run(&job("  topology: {level: nvlink-domain, mode: required}\n"));
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with("j.yaml:7:14: spec.topology.level:")
            && p[0].contains("holds 1 such worker"),
        "{}",
        p[0]
    );
    // Preferred, or a rack (both nodes): it can run.
    assert!(
        run(&job(
            "  topology: {level: nvlink-domain, mode: preferred}\n"
        ))
        .is_empty()
    );
    assert!(run(&job("  topology: {level: rack, mode: required}\n")).is_empty());
    // A partition of one node never holds two workers.
    let p = run(&job("  partition: small\n"));
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with("j.yaml:7:")
            && p[0].contains("spec.partition")
            && p[0].contains("`small`"),
        "{}",
        p[0]
    );
    assert!(run(&job("  partition: all\n")).is_empty());
    // Several workers on one node, required: Kueue's
    // `podset-required-topology: kubernetes.io/hostname` puts every pod on
    // one node, which holds 2 × 4 GPUs here (it used to be refused for
    // having more than one worker).
    let small = |spec: &str| {
        format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {{name: j}}\nspec:\n  workers: 2\n  gpusPerWorker: 4\n{spec}"
        )
    };
    assert!(run(&small("  topology: {level: node, mode: required}\n")).is_empty());
    let p = run(&job("  topology: {level: node, mode: required}\n"));
    assert!(
        p.len() == 1
            && p[0].contains("spec.topology.level")
            && p[0].contains("holds 1 such worker"),
        "{p:#?}"
    );
    // A GPU model the cluster lacks is named as such, and a worker wider
    // than any node is told so.
    let p = run(&job("  gpuModels: [B200]\n"));
    assert!(
        p.len() == 1
            && p[0].contains("spec.gpuModels")
            && p[0].contains("has no node of GPU model B200"),
        "{p:#?}"
    );
    let wide = "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: j}\nspec:\n  workers: 1\n  gpusPerWorker: 16\n";
    let p = run(wide);
    assert!(
        p.len() == 1 && p[0].contains("spec.gpusPerWorker") && p[0].contains("has 8"),
        "{p:#?}"
    );
}

#[test]
fn a_training_job_name_too_long_for_a_label_is_located() {
    let name = "j".repeat(64);
    let text = format!(
        "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata:\n  name: {name}\nspec: {{workers: 1, gpusPerWorker: 1}}\n"
    );
    let p = problems("j.yaml", &text);
    assert_eq!(located(&p), [(4, "metadata.name")], "{p:#?}");
    assert!(p[0].message.contains("63"), "{}", p[0].message);
    let ok = text.replace(&name, &"j".repeat(63));
    assert!(load_sources(&[(Path::new("j.yaml"), ok.as_str())]).is_ok());
}

/// Figures beyond any model or GPU (an exponent typed by mistake, a
/// unit in bytes) are located as such, not carried into plans as
/// 300-digit numbers or an infinite memory.
#[test]
fn figures_beyond_any_model_or_gpu_are_located() {
    let text = POLICY
        .replace("memoryGiB: 12", "paramsB: 1e300\n    overheadGiB: 2e6")
        .replace("compute: 0.2", "compute: 1e9");
    let p = problems("p.yaml", &text);
    assert_eq!(
        located(&p),
        [
            (7, "spec.resources.paramsB"),
            (8, "spec.resources.overheadGiB"),
            (9, "spec.resources.compute"),
        ],
        "{p:?}"
    );
    for problem in &p {
        assert!(problem.message.contains("check the unit"), "{problem}");
        assert!(!problem.message.contains("inf"), "{problem}");
        assert!(problem.message.len() < 200, "{problem}");
    }
    // At the bounds, the policy loads (and then fits no GPU: a located
    // problem that names the need in figures, not 300 digits).
    let p = problems(
        "p.yaml",
        &POLICY.replace("memoryGiB: 12", "memoryGiB: 1048576"),
    );
    assert_eq!(located(&p), [(6, "spec.resources")], "{p:?}");
    assert!(p[0].message.contains("needs 1048576.00 GiB"), "{}", p[0]);

    let text = format!(
        "{}  catalog:\n    - name: H100-80GB\n      pricePerHour: 1e300\n    - name: X\n      memoryGiB: 8e12\n      compute: 1\n      pricePerHour: 2\n",
        cluster_file("\n    - name: a\n      gpuModel: H100-80GB\n      gpuCount: 8\n")
    );
    let p = problems("cluster.yaml", &text);
    assert_eq!(
        located(&p),
        [
            (12, "spec.catalog[0].pricePerHour"),
            (14, "spec.catalog[1].memoryGiB"),
        ],
        "{p:?}"
    );
}

#[test]
fn two_policies_may_not_answer_to_one_name() {
    // `b` takes `a`'s served name, `c` lists it as a LoRA adapter, `d` is
    // named after `a`'s served name and does not set its own (the served
    // name defaults to the policy's): the gateway routes by name, so each
    // would take `a`'s requests. Each problem is on the second claim, at
    // the field that makes it, and names the first.
    let a = POLICY.replace("name: m", "name: a") + "  servedName: org/model\n";
    let b = POLICY.replace("name: m", "name: b") + "  servedName: org/model\n";
    let c = POLICY.replace("name: m", "name: c") + "  adapters: [org/model]\n";
    let d = POLICY.replace("name: m", "name: d") + "  servedName: d-own\n";
    let e = POLICY.replace("name: m", "name: d-own");
    let p = load_sources(&[
        (Path::new("a.yaml"), a.as_str()),
        (Path::new("b.yaml"), b.as_str()),
        (Path::new("c.yaml"), c.as_str()),
        (Path::new("d.yaml"), d.as_str()),
        (Path::new("e.yaml"), e.as_str()),
    ])
    .unwrap_err()
    .0;
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    for want in ["b.yaml:10:", "c.yaml:10:"] {
        assert!(
            text.iter().any(|t| t.starts_with(want)
                && t.contains("`org/model` is already served by ModelPolicy `a` (a.yaml:10)")),
            "{want} not in {text:#?}"
        );
    }
    assert!(
        text.iter()
            .any(|t| t.starts_with("b.yaml:10:") && t.contains("spec.servedName"))
    );
    assert!(
        text.iter()
            .any(|t| t.starts_with("c.yaml:10:") && t.contains("spec.adapters[0]"))
    );
    assert!(
        text.iter().any(|t| t.starts_with("e.yaml:")
            && t.contains("`d-own` is already served by ModelPolicy `d` (d.yaml:10)")),
        "{text:#?}"
    );
    assert_eq!(p.len(), 3, "{text:#?}");
    // Distinct names load.
    let c_ok = POLICY.replace("name: m", "name: c") + "  adapters: [org/model-sql]\n";
    load_sources(&[
        (Path::new("a.yaml"), a.as_str()),
        (Path::new("c.yaml"), c_ok.as_str()),
    ])
    .unwrap_or_else(|p| panic!("{p}"));
}

#[test]
fn gpuscale_s_own_names_are_reserved() {
    // A policy's pods and Services carry `app.kubernetes.io/name:
    // <policy>`, the label the gateway's Service and the network policies
    // select gpuscale's own pods by.
    for name in [
        "gpuscale-gateway",
        "gpuscale-controller",
        "gpuscale-x",
        "gpuscale",
    ] {
        let text = POLICY.replace("name: m", &format!("name: {name}"));
        let p = problems("p.yaml", &text);
        assert_eq!(located(&p), [(4, "metadata.name")], "{name}: {p:#?}");
        assert!(
            p[0].message
                .contains("reserved for gpuscale's own components")
        );
    }
    for name in ["my-gpuscale-gateway", "gpuscalex"] {
        let text = POLICY.replace("name: m", &format!("name: {name}"));
        load_sources(&[(Path::new("p.yaml"), text.as_str())]).unwrap_or_else(|p| panic!("{p}"));
    }
}

#[test]
fn max_concurrency_is_bounded() {
    // Above any server's batch; the gateway sums it over a model's
    // replicas in a u32.
    let text = POLICY.replace("maxConcurrency: 8", "maxConcurrency: 4294967295");
    let p = problems("p.yaml", &text);
    assert_eq!(
        located(&p),
        [(9, "spec.resources.maxConcurrency")],
        "{p:#?}"
    );
    assert!(
        p[0].message.contains("must be 1 to 65536"),
        "{}",
        p[0].message
    );
}

#[test]
fn a_name_the_kserve_route_could_not_carry_is_refused() {
    let text = POLICY.to_owned() + "  servedName: org/../admin\n  adapters: [ok, \"a#b\"]\n";
    let p = problems("p.yaml", &text);
    let at: Vec<&str> = p.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(at, ["spec.servedName", "spec.adapters[1]"], "{p:#?}");
}

#[test]
fn an_empty_padded_multi_line_or_endless_served_name_is_refused_and_shown_short() {
    // Each was accepted: the gateway then had a model no client can name
    // (an empty or padded `model`, a header with a newline) and echoed a
    // 100,000-character name into every message about it.
    let long = "m".repeat(100_000);
    for (served, says) in [
        ("\"\"", "is empty"),
        ("\"   \"", "is empty"),
        ("\" org/model\"", "white space"),
        ("\"org/mo\\ndel\"", "control character"),
        (long.as_str(), "longer than 256 bytes"),
    ] {
        let p = problems("p.yaml", &format!("{POLICY}  servedName: {served}\n"));
        assert_eq!(
            located(&p),
            [(10, "spec.servedName")],
            "{served:.20}: {p:#?}"
        );
        assert!(p[0].message.contains(says), "{}", p[0].message);
        assert!(p[0].message.len() < 300, "{}", p[0].message.len());
        assert!(!p[0].message.contains('\n'), "{}", p[0].message);
    }
    // And a name of 256 bytes is still one.
    let fine = "o".repeat(256);
    let text = format!("{POLICY}  servedName: {fine}\n");
    assert!(load_sources(&[(Path::new("p.yaml"), text.as_str())]).is_ok());
}

#[test]
fn a_start_up_time_or_idle_period_past_any_real_one_is_located() {
    // `gpuscale up` once added such a startupTime to a clock and panicked.
    // Past a year no duration reads (and the document's checks of its
    // values wait for it); within a year each field has its own bound.
    let policy =
        format!("{POLICY}  scaling:\n    startupTime: 500000000000y\n    scaleToZeroAfter: 31d\n");
    let p = problems("m.yaml", &policy);
    assert_eq!(
        located(&p),
        vec![(11, "spec.scaling.startupTime")],
        "{p:#?}"
    );
    assert!(
        p[0].to_string()
            .contains("`500000000000y` is longer than the longest duration"),
        "{}",
        p[0]
    );
    let policy = format!("{POLICY}  scaling:\n    startupTime: 25h\n    scaleToZeroAfter: 31d\n");
    let p = problems("m.yaml", &policy);
    assert_eq!(
        located(&p),
        vec![
            (11, "spec.scaling.startupTime"),
            (12, "spec.scaling.scaleToZeroAfter")
        ],
        "{p:#?}"
    );
    assert!(
        p[0].to_string().contains("at most 24h, got 1d 1h"),
        "{}",
        p[0]
    );
    assert!(
        p[1].to_string().contains("at most 30d, got 31d"),
        "{}",
        p[1]
    );
    let fine = format!("{POLICY}  scaling:\n    startupTime: 24h\n    scaleToZeroAfter: 30d\n");
    assert!(load_sources(&[(Path::new("m.yaml"), fine.as_str())]).is_ok());
}

#[test]
fn every_unknown_field_of_a_document_is_named_at_its_line_then_the_next_problem() {
    // serde stops at the first unknown field, in its map's order (sorted
    // keys, not the file's): each is reported at its own line.
    let text = POLICY.replace("spec:\n", "spec:\n  zzz: 1\n").replace(
        "    compute: 0.2\n",
        "    compute: 0.2\n    aaa: 2\n    maxConcurency: 3\n",
    );
    let p = problems("m.yaml", &text);
    assert_eq!(
        located(&p),
        vec![
            (6, "spec.zzz"),
            (10, "spec.resources.aaa"),
            (11, "spec.resources.maxConcurency"),
        ],
        "{p:#?}"
    );
    assert!(
        p[2].message.contains("unknown field `maxConcurency`"),
        "{p:#?}"
    );
    // Then the first problem of another kind: reading stops there.
    let p = problems(
        "m.yaml",
        &text.replace("memoryGiB: 12", "memoryGiB: twelve"),
    );
    let at = located(&p);
    assert!(at.contains(&(10, "spec.resources.aaa")), "{p:#?}");
    assert!(at.contains(&(8, "spec.resources.memoryGiB")), "{p:#?}");
}

#[test]
fn every_value_that_does_not_read_is_named_not_only_the_first() {
    // serde stops at the first; each is taken out and the rest read
    // again. A required one taken out ends the search without being
    // called missing as well.
    let text = format!(
        "{}  scaling:\n    startupTime: soon\n    scaleToZeroAfter: 30\n    maxReplicas: many\n",
        POLICY.replace(
            "maxConcurrency: 8",
            "maxConcurrency: 8\n    kvCacheGiB: \"2\""
        )
    );
    let p = problems("m.yaml", &text);
    assert_eq!(
        located(&p),
        vec![
            (10, "spec.resources.kvCacheGiB"),
            (12, "spec.scaling.startupTime"),
            (13, "spec.scaling.scaleToZeroAfter"),
            (14, "spec.scaling.maxReplicas"),
        ],
        "{p:#?}"
    );
    assert!(p[1].message.contains("`soon` is not a duration"), "{p:#?}");
    assert!(p[2].message.contains("`30` has no unit"), "{p:#?}");
    assert!(p[3].message.contains("`many` is not a number"), "{p:#?}");
    let p = problems(
        "m.yaml",
        &POLICY.replace("memoryGiB: 12", "memoryGiB: [12]"),
    );
    assert_eq!(located(&p), vec![(7, "spec.resources.memoryGiB")], "{p:#?}");
    assert!(!p[0].message.contains("missing"), "{p:#?}");
}

#[test]
fn a_missing_field_is_named_in_the_path() {
    let policy = POLICY.replace("    maxConcurrency: 8\n", "");
    let p = problems("m.yaml", &policy);
    assert_eq!(
        located(&p),
        vec![(6, "spec.resources.maxConcurrency")],
        "{p:#?}"
    );
    let p = problems("m.yaml", &POLICY.replace("metadata:\n  name: m\n", ""));
    assert_eq!(p[0].path, "metadata", "{p:#?}");
}

/// A count too large for any integer (read as a float), a fraction and
/// a negative count where a whole number of a range belongs: each said in
/// those terms, with the range, at its field.
#[test]
fn a_count_out_of_range_names_the_range() {
    for (from, to, line, path, said) in [
        (
            "maxConcurrency: 8",
            "maxConcurrency: 99999999999999999999",
            9,
            "spec.resources.maxConcurrency",
            "`1e+20` is out of range: expected a whole number from 0 to 4294967295",
        ),
        (
            "maxConcurrency: 8",
            "maxConcurrency: 2.5",
            9,
            "spec.resources.maxConcurrency",
            "`2.5` is not a whole number: expected a whole number from 0 to 4294967295",
        ),
        (
            "maxConcurrency: 8",
            "maxConcurrency: 8.0",
            9,
            "spec.resources.maxConcurrency",
            "`8.0` is not written as a whole number: expected a whole number from 0 to 4294967295",
        ),
        (
            "maxConcurrency: 8",
            "maxConcurrency: -1",
            9,
            "spec.resources.maxConcurrency",
            "`-1` is out of range: expected a whole number from 0 to 4294967295",
        ),
        (
            "maxConcurrency: 8",
            "maxConcurrency: true",
            9,
            "spec.resources.maxConcurrency",
            "`true` is not a number: expected a whole number from 0 to 4294967295",
        ),
        (
            "maxConcurrency: 8",
            "maxConcurrency:",
            9,
            "spec.resources.maxConcurrency",
            "no value given: expected a whole number from 0 to 4294967295",
        ),
        (
            "compute: 0.2",
            "compute: lots",
            8,
            "spec.resources.compute",
            "`lots` is not a number: expected a number",
        ),
    ] {
        assert_eq!(POLICY.matches(from).count(), 1);
        let p = problems("m.yaml", &POLICY.replace(from, to));
        assert_eq!(located(&p), vec![(line, path)], "{p:#?}");
        assert!(p[0].message.contains(said), "{}", p[0]);
    }
}

#[test]
fn a_number_that_is_not_finite_is_called_so() {
    for (text, shown) in [
        (".nan", ".nan"),
        (".inf", ".inf"),
        ("-.inf", "-.inf"),
        ("1e400", "1e400"),
    ] {
        let policy = POLICY.replace("compute: 0.2", &format!("compute: {text}"));
        let p = problems("m.yaml", &policy);
        assert_eq!(located(&p), vec![(8, "spec.resources.compute")], "{p:#?}");
        assert!(
            p[0].message
                .contains(&format!("`{shown}` is not a finite number")),
            "{}",
            p[0]
        );
    }
    // A quoted number is still a string where a number belongs.
    let p = problems(
        "m.yaml",
        &POLICY.replace("compute: 0.2", "compute: \"0.2\""),
    );
    assert!(
        p[0].message
            .contains("`\"0.2\"` is quoted text: expected a number, written without quotes"),
        "{}",
        p[0]
    );
}

#[test]
fn selector_labels_follow_the_api_servers_rules_and_keep_off_gpuscales_own() {
    // `spec.selector.matchLabels` go on every pod gpuscale runs for the
    // model: a key or value the API server refuses, one of gpuscale's
    // own keys (which select and tell apart the pods it runs), or a name
    // label other than the policy's, is refused at its line.
    let text = POLICY.to_owned()
        + "  selector:\n    matchLabels:\n      app.kubernetes.io/name: gpuscale-controller\n      team: \"a b\"\n      gpuscale.io/variant: other\n      Example.com/x: y\n";
    let p = problems("p.yaml", &text);
    assert_eq!(
        located(&p),
        [
            (12, "spec.selector.matchLabels.app.kubernetes.io/name"),
            (13, "spec.selector.matchLabels.team"),
            (14, "spec.selector.matchLabels.gpuscale.io/variant"),
            (15, "spec.selector.matchLabels.Example.com/x"),
        ],
        "{p:#?}"
    );
    // `app.kubernetes.io/name` is the policy's name or nothing: gpuscale's
    // network policies let `gpuscale-controller` pods in.
    assert!(
        p[0].message.contains("policy's name, `m`"),
        "{}",
        p[0].message
    );
    assert!(
        p[1].message.contains("not a label value"),
        "{}",
        p[1].message
    );
    assert!(
        p[2].message.contains("kept by gpuscale"),
        "{}",
        p[2].message
    );
    assert!(p[3].message.contains("DNS-1123"), "{}", p[3].message);
    // The valid one alone loads, and the model carries it.
    let fine =
        POLICY.to_owned() + "  selector:\n    matchLabels:\n      app.kubernetes.io/name: m\n";
    let b = load_sources(&[(Path::new("p.yaml"), fine.as_str())]).unwrap();
    assert_eq!(
        b.models[0]
            .pod_labels
            .get("app.kubernetes.io/name")
            .map(String::as_str),
        Some("m")
    );
}

#[test]
fn node_topology_values_and_labels_are_label_values() {
    // The rack and NVLink domain become node label values in
    // `node-labels.yaml`, the zone is one: each is refused at its line
    // when the API server would refuse it.
    let text = cluster_file(
        "
    - name: a
      gpuModel: H100-80GB
      gpuCount: 8
      rack: \"rack 1\"
      nvlinkDomain: \"\"
      zone: eu-west-1a
      labels: {pool: \"-gpu\", ok: fine}
",
    );
    let p = problems("cluster.yaml", &text);
    assert_eq!(
        located(&p),
        [
            (10, "spec.nodes[0].rack"),
            (11, "spec.nodes[0].nvlinkDomain"),
            (13, "spec.nodes[0].labels.pool"),
        ],
        "{p:?}"
    );
    let fixed = text
        .replace("\"rack 1\"", "rack-1")
        .replace("      nvlinkDomain: \"\"\n", "")
        .replace("\"-gpu\"", "gpu");
    assert!(load_sources(&[(Path::new("c.yaml"), fixed.as_str())]).is_ok());
}

#[test]
fn a_job_with_no_partition_needs_a_default_one_and_its_spans_are_bounded() {
    // Slurm refuses a job that names no partition where none is the
    // default; and no span of a job or a queue is longer than a year
    // (`100000years` became a Slurm `--time` of 876,600,000 hours).
    let cluster = cluster_file("\n    - {name: a, gpuModel: H100-80GB, gpuCount: 8}\n");
    let queue = |default: bool| {
        format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingQueue\nmetadata: {{name: q}}\nspec:\n  partitions:\n    - {{name: pa, nodes: [a], default: {default}}}\n  weights: {{maxAge: 2years}}\n"
        )
    };
    let job = "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {name: j, namespace: Team_ML}\nspec:\n  workers: 1\n  gpusPerWorker: 8\n  estimatedRuntime: 100000years\n  checkpointInterval: 1h\n";
    let q = queue(false);
    let p = problems_of(&[("c.yaml", &cluster), ("q.yaml", &q), ("j.yaml", job)]);
    assert_eq!(
        p,
        [
            "j.yaml:7 spec.estimatedRuntime",
            "q.yaml:7 spec.weights.maxAge"
        ],
    );
    let job = job.replace("100000years", "1h");
    let p = problems_of(&[("c.yaml", &cluster), ("q.yaml", &q), ("j.yaml", &job)]);
    assert_eq!(
        p,
        [
            "j.yaml:3 metadata.namespace",
            "q.yaml:7 spec.weights.maxAge"
        ]
    );
    let fixed_job = job.replace("Team_ML", "team-ml");
    let q = q.replace("2years", "7d");
    let p = problems_of(&[("c.yaml", &cluster), ("q.yaml", &q), ("j.yaml", &fixed_job)]);
    assert_eq!(p, ["j.yaml:4 spec.partition"]);
    let q = queue(true).replace("2years", "7d");
    let b = load_sources(&[
        (Path::new("c.yaml"), cluster.as_str()),
        (Path::new("q.yaml"), q.as_str()),
        (Path::new("j.yaml"), fixed_job.as_str()),
    ])
    .unwrap();
    assert_eq!(b.jobs[0].namespace.as_deref(), Some("team-ml"));
}

#[test]
fn a_worker_templates_node_rules_name_labels_the_cluster_knows_and_some_node_meets() {
    let cluster = cluster_file(
        "\n    - {name: a, gpuModel: H100-80GB, gpuCount: 8, zone: z1, labels: {pool: train}}\n    - {name: b, gpuModel: A100-80GB, gpuCount: 8, zone: z2}\n",
    );
    let job = |rules: &str| {
        format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {{name: j}}\nspec:\n  workers: 1\n  gpusPerWorker: 8\n  gpuModels: [H100-80GB]\n  template:\n    spec:\n      containers: [{{name: w, image: i}}]\n{rules}"
        )
    };
    let run = |rules: &str| problems_of(&[("c.yaml", &cluster), ("j.yaml", &job(rules))]);
    // A label no node has: gpuscale could not place by it.
    assert_eq!(
        run("      nodeSelector: {team: nlp}\n"),
        ["j.yaml:11 spec.template.spec.nodeSelector.team"]
    );
    // Known labels that no H100 node meets (the zone is `b`'s, an A100).
    assert_eq!(
        run("      nodeSelector: {topology.kubernetes.io/zone: z2}\n"),
        ["j.yaml:11 spec.template.spec.nodeSelector.topology.kubernetes.io/zone"]
    );
    // Met by `a`; a label every node carries is not the cluster's to list.
    assert!(run("      nodeSelector: {pool: train, kubernetes.io/arch: amd64}\n").is_empty());
    // But GPU nodes run Linux and carry GPU Feature Discovery's mark.
    assert_eq!(
        run("      nodeSelector: {kubernetes.io/os: windows}\n"),
        ["j.yaml:11 spec.template.spec.nodeSelector.kubernetes.io/os"]
    );
}

#[test]
fn a_misspelt_field_in_a_worker_template_is_located_not_dropped() {
    let cluster = cluster_file("\n    - {name: a, gpuModel: H100-80GB, gpuCount: 8}\n");
    let job = |container: &str| {
        format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {{name: j}}\nspec:\n  workers: 1\n  gpusPerWorker: 8\n  gpuModels: [H100-80GB]\n  template:\n    metadata: {{labels: {{app: t}}, creationTimestamp: null}}\n    spec:\n      containers:\n      - name: w\n        image: i\n{container}"
        )
    };
    let run = |container: &str| problems_of(&[("c.yaml", &cluster), ("j.yaml", &job(container))]);
    // Known fields, nulls and empty lists pass.
    assert!(run("        env: []\n        resources: {limits: {memory: 1Gi}}\n").is_empty());
    // A misspelt key, at its own line.
    assert_eq!(
        run("        resouces: {limits: {memory: 1Gi}}\n"),
        ["j.yaml:14 spec.template.spec.containers[0].resouces"]
    );
    // Deeper down too.
    assert_eq!(
        run("        resources: {limts: {memory: 1Gi}}\n"),
        ["j.yaml:14 spec.template.spec.containers[0].resources.limts"]
    );
    let text = job("        resouces: {}\n");
    let e = load_sources(&[
        (Path::new("c.yaml"), cluster.as_str()),
        (Path::new("j.yaml"), text.as_str()),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("unknown field `resouces`"), "{e}");
}

/// Each problem as `file:line field.path`, in order.
fn problems_of(files: &[(&str, &str)]) -> Vec<String> {
    let sources: Vec<(&Path, &str)> = files.iter().map(|(n, t)| (Path::new(*n), *t)).collect();
    match load_sources(&sources) {
        Ok(_) => Vec::new(),
        Err(p) => {
            p.0.iter()
                .map(|p| {
                    let name = files
                        .iter()
                        .map(|(n, _)| *n)
                        .find(|n| p.file.ends_with(n))
                        .unwrap_or("?");
                    format!("{name}:{} {}", p.position.line, p.path)
                })
                .collect()
        }
    }
}

#[test]
fn a_yaml_tag_means_what_the_core_schema_says() {
    // `!!str 12` is text, so a number field refuses it (it was read as
    // the number 12); a tag that does not fit its value, or one outside
    // YAML's core schema, is refused at its line.
    let text = POLICY.replace("maxConcurrency: 8", "maxConcurrency: !!str 8");
    assert_eq!(
        located(&problems("p.yaml", &text)),
        [(9, "spec.resources.maxConcurrency")]
    );
    let text = POLICY.replace("maxConcurrency: 8", "maxConcurrency: !!int eight");
    let p = problems("p.yaml", &text);
    assert_eq!(p[0].position.line, 9, "{p:?}");
    assert!(
        p[0].message.contains("not what its tag `!!int` says"),
        "{}",
        p[0].message
    );
    let text = POLICY.replace("maxConcurrency: 8", "maxConcurrency: !custom 8");
    let p = problems("p.yaml", &text);
    assert!(p[0].message.contains("`!custom`"), "{}", p[0].message);
    // Tags that agree with their values read as before.
    for fine in ["!!int 8", "!!float 8"] {
        let text = POLICY.replace("maxConcurrency: 8", &format!("maxConcurrency: {fine}"));
        assert!(
            load_sources(&[(Path::new("p.yaml"), text.as_str())]).is_ok(),
            "{fine}"
        );
    }
    let text = POLICY.to_owned() + "  servedName: !!str 12\n";
    let b = load_sources(&[(Path::new("p.yaml"), text.as_str())]).unwrap();
    assert_eq!(b.models[0].served_name, "12");
    // The non-specific `!` and the verbatim core tag are text too.
    for tagged in ["! 12", "!<tag:yaml.org,2002:str> 12"] {
        let text = format!("{POLICY}  servedName: {tagged}\n");
        let b = load_sources(&[(Path::new("p.yaml"), text.as_str())]).unwrap();
        assert_eq!(b.models[0].served_name, "12", "{tagged}");
    }
    // A collection's tag is its own kind or none.
    let text = POLICY.to_owned() + "  adapters: !!str [a, b]\n";
    let p = problems("p.yaml", &text);
    assert!(
        p[0].message.contains("`!!str` does not fit a sequence"),
        "{}",
        p[0].message
    );
    let text = POLICY.to_owned() + "  adapters: !!seq [a, b]\n";
    assert!(load_sources(&[(Path::new("p.yaml"), text.as_str())]).is_ok());
}

#[test]
fn a_model_policy_name_is_at_most_a_label_value_long() {
    // It labels every pod of the model (`gpuscale.io/model`).
    let name = "m".repeat(64);
    let text = POLICY.replace("name: m", &format!("name: {name}"));
    assert_eq!(located(&problems("p.yaml", &text)), [(4, "metadata.name")]);
    let text = POLICY.replace("name: m", &format!("name: {}", &name[..63]));
    assert!(load_sources(&[(Path::new("p.yaml"), text.as_str())]).is_ok());
}

#[test]
fn a_gang_that_must_share_nvlink_cannot_use_pcie_cards() {
    // L40S are PCIe cards: a node of them declares no NVLink domain and
    // is in none, so a gang that requires one has nowhere to run.
    let cluster = cluster_file("\n    - {name: l, gpuModel: L40S, gpuCount: 4}\n");
    let job = |mode: &str| {
        format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {{name: j}}\nspec:\n  workers: 1\n  gpusPerWorker: 4\n  gpuModels: [L40S]\n  topology: {{level: nvlink-domain, mode: {mode}}}\n"
        )
    };
    let p = problems_of(&[("c.yaml", &cluster), ("j.yaml", &job("required"))]);
    assert_eq!(p, ["j.yaml:8 spec.topology.level"]);
    assert!(problems_of(&[("c.yaml", &cluster), ("j.yaml", &job("preferred"))]).is_empty());
    // Declared (an NVLink bridge the operator knows of), it is one.
    let bridged = cluster.replace("gpuCount: 4}", "gpuCount: 4, nvlinkDomain: b0}");
    assert!(problems_of(&[("c.yaml", &bridged), ("j.yaml", &job("required"))]).is_empty());
}

#[test]
fn a_nodes_labels_leave_what_its_fields_say_to_them() {
    // The zone, rack, NVLink domain, name and GPU product are the node's
    // fields; a label of its own for one of them would disagree with
    // what placement reads.
    let text = cluster_file(
        "\n    - {name: a, gpuModel: H100-80GB, gpuCount: 8, labels: {gpuscale.io/rack: r1, topology.kubernetes.io/zone: z9, team: nlp}}\n",
    );
    let p = problems_of(&[("c.yaml", &text)]);
    assert_eq!(
        p,
        [
            "c.yaml:7 spec.nodes[0].labels.gpuscale.io/rack",
            "c.yaml:7 spec.nodes[0].labels.topology.kubernetes.io/zone"
        ]
    );
}

#[test]
fn a_partition_gpu_model_the_catalogue_lacks_is_said_once() {
    let cluster = cluster_file("\n    - {name: a, gpuModel: H100-80GB, gpuCount: 8}\n");
    let queue = "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingQueue\nmetadata: {name: q}\nspec:\n  partitions:\n    - {name: p, default: true, gpuModels: [A100-40G, A100-40GB]}\n";
    let p = load_sources(&[
        (Path::new("c.yaml"), cluster.as_str()),
        (Path::new("q.yaml"), queue),
    ])
    .unwrap_err()
    .0;
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    // The typo is unknown to the catalogue (once, not also "the cluster
    // has none"); a known model the cluster lacks is said as that.
    assert_eq!(text.len(), 2, "{text:#?}");
    assert!(
        text.iter()
            .any(|t| t.contains("spec.partitions[0].gpuModels[0]: unknown GPU model `A100-40G`")),
        "{text:#?}"
    );
    assert!(
        text.iter().any(|t| t.contains(
            "spec.partitions[0].gpuModels[1]: cluster `c` has no node of GPU model A100-40GB"
        )),
        "{text:#?}"
    );
}

#[test]
fn a_name_is_a_dns_subdomain_part_by_part() {
    // Kubernetes' IsDNS1123Subdomain: each dot-separated label starts and
    // ends with a letter or digit; the API server refuses `a..b`, `a.-b`.
    for name in ["a..b", "a.-b", "a-.b", "a.b-"] {
        let text = POLICY.replace("name: m", &format!("name: \"{name}\""));
        let p = problems("p.yaml", &text);
        assert_eq!(located(&p), [(4, "metadata.name")], "{name}: {p:#?}");
        assert!(p[0].message.contains("not a valid name"), "{p:#?}");
    }
    for name in ["a.b", "a-1.b2", "m"] {
        let text = POLICY.replace("name: m", &format!("name: \"{name}\""));
        load_sources(&[(Path::new("p.yaml"), text.as_str())])
            .unwrap_or_else(|p| panic!("{name}: {p}"));
    }
}

#[test]
fn a_training_job_alone_on_a_mig_gpu_is_located() {
    // Alone on its GPU, but the GPU is in MIG mode: a gang's GPUs are
    // whole, and a plan keeping the job would also disable MIG under it.
    let cluster = cluster_file(
        "
    - name: h
      gpuModel: H100-80GB
      gpuCount: 2
      gpus:
        - {index: 0, mode: mig, geometry: [{profile: 7g.80gb, start: 0}], workloads: [{model: tj, slot: 0}]}
        - {index: 1, mode: whole, workloads: [{model: tj}]}
",
    );
    let p = with_a_two_gpu_job(&cluster);
    assert_eq!(
        p.iter()
            .filter(|p| p.path.starts_with("spec.nodes[0].gpus"))
            .map(|p| p.path.as_str())
            .collect::<Vec<_>>(),
        ["spec.nodes[0].gpus[0].workloads[0].model"],
        "{p:#?}"
    );
    assert!(
        p.iter().any(|p| p.message.contains("mode is `mig`")),
        "{p:#?}"
    );
}

#[test]
fn a_path_that_cannot_be_read_is_the_one_problem_not_its_follow_ons() {
    // The policies' folder is mistyped: the demand's names are unknown
    // because of it, and saying so for each would bury the one mistake.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let demand = root.join("demand.yaml");
    let cluster = root.join("cluster.yaml");
    let missing = root.join("no-such-policies");
    let p = load_paths(&[missing.as_path(), demand.as_path(), cluster.as_path()])
        .unwrap_err()
        .0;
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(p[0].file, missing);
    assert!(p[0].message.starts_with("cannot read"), "{p:#?}");
    // With every file read, an unknown name is a problem again.
    let p = load_paths(&[demand.as_path(), cluster.as_path()])
        .unwrap_err()
        .0;
    assert!(
        p.iter()
            .any(|p| p.message.starts_with("no ModelPolicy named")),
        "{p:#?}"
    );
}

/// Kubernetes' quantity grammar (apimachinery `resource.Quantity`: a
/// signed decimal number, then a binary suffix `Ki`…`Ei`, a decimal one
/// `m`, `k`, `M`…`E` or an exponent), with pods' rule that resources are
/// not negative.
#[test]
fn quantities_follow_kubernetes_grammar() {
    use gpuscale_policies::load::quantity_problem;
    for good in [
        "1",
        "0",
        "-0",
        "500m",
        "12Gi",
        "1.5",
        ".5",
        "5.",
        "1e3",
        "1E-3",
        "+1",
        "129e6",
        "128974848",
        "64Mi",
        "2k",
        "1Ei",
        "0.1",
        "500n",
        "1u",
        "1e0001",
        "1e1000",
    ] {
        assert_eq!(quantity_problem(good), None, "{good}");
    }
    for bad in [
        "12XB", "", "Gi", "1.2.3", "1 Gi", "1g", "1ki", "1K", "1e", "e3", ".", "-", "1Gi ", "1.5e",
        "0x10",
    ] {
        let why = quantity_problem(bad).unwrap_or_else(|| panic!("{bad:?} passed"));
        assert!(why.contains("not a Kubernetes quantity"), "{bad:?}: {why}");
    }
    assert!(quantity_problem("-1Gi").unwrap().contains("negative"));
    use gpuscale_policies::load::quantity_value;
    for (q, v) in [
        ("2", 2.0),
        ("2.0", 2.0),
        ("2000m", 2.0),
        ("2e0", 2.0),
        ("1Ki", 1024.0),
        ("1.5Gi", 1.5 * 1024.0 * 1024.0 * 1024.0),
        ("500n", 5e-7),
        ("1E-3", 1e-3),
    ] {
        let got = quantity_value(q).unwrap();
        assert!((got - v).abs() <= 1e-12 * v.abs().max(1.0), "{q}: {got}");
    }
    assert_eq!(quantity_value("12XB"), None);
}

/// A worker's GPU count is read by value: `2.0` and `2000m` are the
/// plan's 2; `1.5` is no whole count; `3` disagrees.
#[test]
fn a_workers_gpu_count_is_compared_by_value() {
    let job = |q: &str| {
        format!(
            "apiVersion: gpuscale.io/v1alpha1\nkind: TrainingJob\nmetadata: {{name: j}}\nspec:\n  workers: 1\n  gpusPerWorker: 2\n  template:\n    spec:\n      containers:\n        - name: worker\n          image: example/train:1\n          resources:\n            limits: {{nvidia.com/gpu: '{q}'}}\n"
        )
    };
    for same in ["2", "2.0", "2000m", "2e0"] {
        load_sources(&[(Path::new("j.yaml"), job(same).as_str())])
            .unwrap_or_else(|e| panic!("{same}: {:#?}", e.0));
    }
    for (q, says) in [
        ("1.5", "counted whole"),
        ("3", "disagrees"),
        ("1u", "counted whole"),
        ("12XB", "not a Kubernetes quantity"),
    ] {
        let p = problems("j.yaml", &job(q));
        assert_eq!(p.len(), 1, "{q}: {p:#?}");
        assert!(p[0].message.contains(says), "{q}: {}", p[0].message);
    }
}

/// A worker template's quantity the API server would refuse is refused
/// here, at its line, before any pod is written.
#[test]
fn a_template_quantity_kubernetes_refuses_is_located() {
    let job = "\
apiVersion: gpuscale.io/v1alpha1
kind: TrainingJob
metadata: {name: j}
spec:
  workers: 1
  gpusPerWorker: 2
  template:
    spec:
      containers:
        - name: worker
          image: example/train:1
          resources:
            limits: {memory: 12XB, cpu: '8'}
";
    let p = problems("j.yaml", job);
    assert_eq!(
        located(&p),
        [(
            13,
            "spec.template.spec.containers[0].resources.limits.memory"
        )],
        "{p:?}"
    );
    assert!(p[0].message.contains("`12XB`"), "{}", p[0].message);
}

/// A policy refused for its own problem is said once: a Demand naming it
/// is not also said to name no policy, whether it was refused when read
/// (an unknown field) or when validated (a negative compute).
#[test]
fn a_refused_policy_is_not_said_missing_again() {
    for (policy, line) in [
        (POLICY.replace("compute: 0.2", "compute: -1"), "m.yaml:8:"),
        (
            POLICY.replace("compute: 0.2", "compute: 0.2\n    colour: blue"),
            "m.yaml:9:",
        ),
    ] {
        refused_policy_said_once(&policy, line);
    }
}

fn refused_policy_said_once(policy: &str, line: &str) {
    let demand = "apiVersion: gpuscale.io/v1alpha1\nkind: Demand\nmetadata: {name: d}\nspec:\n  replicas: {m: 2, other: 1}\n";
    let p = load_sources(&[(Path::new("m.yaml"), policy), (Path::new("d.yaml"), demand)])
        .unwrap_err()
        .0;
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert_eq!(p.len(), 2, "{text:#?}");
    assert!(
        text.iter()
            .any(|t| t.starts_with(line) && t.contains("spec.resources")),
        "{text:#?}"
    );
    // A name no document gives is still said.
    assert!(
        text.iter().any(|t| t.starts_with("d.yaml:")
            && t.contains("no ModelPolicy named `other` among the policies given")),
        "{text:#?}"
    );
}

/// A cluster file whose GPUs run what they could not hold is refused at
/// the first workload past it: more replicas than a time-sliced GPU's
/// shares, a replica over its MIG instance's memory, replicas over a
/// HAMi GPU's memory together. What fits passes.
#[test]
fn a_cluster_state_no_gpu_could_hold_is_refused_where_it_overflows() {
    let policies = "\
apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata: {name: small}
spec:
  resources: {memoryGiB: 8, compute: 0.1, maxConcurrency: 8}
  placement: {sharing: [mig, timeslice, fractional, whole]}
---
apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata: {name: big}
spec:
  resources: {memoryGiB: 30, compute: 0.3, maxConcurrency: 8}
  placement: {sharing: [mig, timeslice, fractional, whole]}
";
    let cluster = |ts: usize, mig_model: &str, hami: usize| {
        let workloads = |n: usize, m: &str| vec![format!("{{model: {m}}}"); n].join(", ");
        format!(
            "\
apiVersion: gpuscale.io/v1alpha1
kind: Cluster
metadata: {{name: c}}
spec:
  nodes:
    - name: a
      gpuModel: H100-80GB
      gpuCount: 2
      sharing: [mig, timeslice]
      timesliceReplicas: 2
      gpus:
        - index: 0
          mode: timeslice
          workloads: [{}]
        - index: 1
          mode: mig
          geometry: [{{profile: 1g.10gb, start: 0}}]
          workloads: [{{model: {mig_model}, slot: 0}}]
    - name: b
      gpuModel: H100-80GB
      gpuCount: 1
      sharing: [fractional]
      gpus:
        - index: 0
          mode: fractional
          workloads: [{}]
",
            workloads(ts, "small"),
            workloads(hami, "big")
        )
    };
    let p = fits_but(policies, &cluster(2, "small", 2), &cluster(3, "big", 3));
    let text: Vec<String> = p.iter().map(|p| p.to_string()).collect();
    assert_eq!(
        located(&p),
        [
            (14, "spec.nodes[0].gpus[0].workloads[2].model"),
            (18, "spec.nodes[0].gpus[1].workloads[0].model"),
            (26, "spec.nodes[1].gpus[0].workloads[2].model"),
        ],
        "{text:#?}"
    );
    assert!(text[0].contains("2 time-sliced shares"), "{text:#?}");
    assert!(text[1].contains("`big` needs 30.0 GiB"), "{text:#?}");
    assert!(text[2].contains("need 90.0 GiB together"), "{text:#?}");
}

/// A time-sliced `+me` instance is served, and shared, as its plain
/// profile: two replicas on a 2-share `1g.10gb+me` fit. A HAMi GPU takes
/// at most `hamiSplitCount` replicas.
#[test]
fn shared_instances_and_hami_split_counts_hold_what_they_allow() {
    let policy = "\
apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata: {name: small}
spec:
  resources: {memoryGiB: 4, compute: 0.05, maxConcurrency: 8}
  placement: {sharing: [mig, mig-timeslice, fractional, whole]}
";
    let cluster = |hami: usize| {
        format!(
            "\
apiVersion: gpuscale.io/v1alpha1
kind: Cluster
metadata: {{name: c}}
spec:
  nodes:
    - name: a
      gpuModel: H100-80GB
      gpuCount: 1
      sharing: [mig, mig-timeslice]
      migTimeslice: {{profile: 1g.10gb, replicas: 2}}
      gpus:
        - index: 0
          mode: mig
          geometry: [{{profile: 1g.10gb+me, start: 0}}]
          workloads: [{{model: small, slot: 0}}, {{model: small, slot: 0}}]
    - name: b
      gpuModel: H100-80GB
      gpuCount: 1
      sharing: [fractional]
      hamiSplitCount: 2
      gpus:
        - index: 0
          mode: fractional
          workloads: [{}]
",
            vec!["{model: small}"; hami].join(", ")
        )
    };
    let p = fits_but(policy, &cluster(2), &cluster(3));
    assert_eq!(
        located(&p),
        [(24, "spec.nodes[1].gpus[0].workloads[2].model")],
        "{p:#?}"
    );
    assert!(p[0].message.contains("hamiSplitCount"), "{}", p[0].message);
}

/// Loads `policies` with the cluster `good` (which must pass) and with
/// `bad`, whose problems it returns.
fn fits_but(policies: &str, good: &str, bad: &str) -> Vec<Problem> {
    let with = |cluster: &str| {
        load_sources(&[
            (Path::new("p.yaml"), policies),
            (Path::new("c.yaml"), cluster),
        ])
    };
    with(good).unwrap_or_else(|e| panic!("{:#?}", e.0));
    with(bad).unwrap_err().0
}

/// A byte that is not UTF-8 is located at its own line and column (in
/// characters: the text before it on the line is valid), not at 1:1.
#[test]
fn a_byte_that_is_not_utf8_is_located_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    // A valid é on line 4, then on line 9 (`    maxConcurrency: 8`) a
    // Latin-1 byte after its 4 spaces.
    let text = POLICY.replace("name: m", "name: mé");
    let line9 = text.lines().take(8).map(|l| l.len() + 1).sum::<usize>();
    let mut bytes = text.into_bytes();
    bytes.insert(line9 + 4, 0xe9);
    std::fs::write(&file, bytes).unwrap();
    let p = load_paths(&[&file]).unwrap_err().0;
    assert_eq!(p.len(), 1, "{p:#?}");
    assert_eq!(
        (p[0].position.line, p[0].position.column),
        (9, 5),
        "{}",
        p[0]
    );
    assert!(p[0].message.contains("0xe9"), "{}", p[0].message);
}
