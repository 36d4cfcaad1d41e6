//! The loaders take arbitrary bytes and arbitrary YAML without panicking,
//! and every problem they report is located inside the input.

use std::path::Path;

use gpuscale_policies::load_sources;
use proptest::prelude::*;

/// Field names the real schema uses, so random documents reach deep into
/// typed deserialisation and validation rather than stopping at the top.
const KEYS: &[&str] = &[
    "apiVersion",
    "kind",
    "metadata",
    "name",
    "namespace",
    "spec",
    "resources",
    "memoryGiB",
    "paramsB",
    "dtype",
    "kvCacheGiB",
    "overheadGiB",
    "compute",
    "maxConcurrency",
    "placement",
    "sharing",
    "gpuModels",
    "tensorParallel",
    "slo",
    "ttftP95",
    "scaling",
    "minReplicas",
    "maxReplicas",
    "targetQueueDepth",
    "behavior",
    "scaleUp",
    "scaleDown",
    "policies",
    "type",
    "value",
    "period",
    "nodes",
    "gpuModel",
    "gpuCount",
    "gpus",
    "index",
    "mode",
    "geometry",
    "profile",
    "start",
    "workloads",
    "model",
    "slot",
    "workers",
    "gpusPerWorker",
    "topology",
    "level",
    "count",
    "catalog",
    "migUsableGiB",
    "migComputeFraction",
    "priority",
    "bogus",
];
const SCALARS: &[&str] = &[
    "gpuscale.io/v1alpha1",
    "ModelPolicy",
    "Cluster",
    "TrainingJob",
    "H100-80GB",
    "A30-24GB",
    "mig",
    "whole",
    "timeslice",
    "bf16",
    "3g.40gb",
    "2g.20gb",
    "1g.10gb+me",
    "Pods",
    "Percent",
    "15s",
    "5m",
    "-1",
    "0",
    "1",
    "7",
    "8",
    "1e400",
    "0.5",
    "-0.0",
    ".nan",
    ".inf",
    "~",
    "true",
    "x",
    "\"quoted\"",
    "node",
    "rack",
    "critical",
    "nope",
];

fn yaml_value() -> impl Strategy<Value = String> {
    let leaf = prop::sample::select(SCALARS).prop_map(str::to_string);
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec((prop::sample::select(KEYS), inner.clone()), 0..6).prop_map(
                |entries| {
                    let body: Vec<String> =
                        entries.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                    format!("{{{}}}", body.join(", "))
                }
            ),
            prop::collection::vec(inner, 0..5).prop_map(|items| format!("[{}]", items.join(", "))),
        ]
    })
}

fn check(name: &str, text: &str) {
    // YAML breaks lines at \n, \r and \r\n; count each as a break (an upper bound).
    let lines = text.split(['\n', '\r']).count();
    if let Err(problems) = load_sources(&[(Path::new(name), text)]) {
        assert!(!problems.0.is_empty());
        for p in &problems.0 {
            assert!(
                p.position.line >= 1 && p.position.line <= lines + 1,
                "{p} (lines: {lines})"
            );
            assert!(p.position.column >= 1);
            assert!(!p.message.is_empty());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let text = String::from_utf8_lossy(&bytes);
        check("fuzz.yaml", &text);
        check("fuzz.json", &text);
    }

    #[test]
    fn arbitrary_yaml_never_panics(docs in prop::collection::vec(yaml_value(), 1..4)) {
        let text = docs.join("\n---\n");
        check("fuzz.yaml", &text);
    }

    #[test]
    fn mutated_examples_never_panic(
        which in 0usize..3,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        let file = ["cluster.yaml", "policies/qwen2-5.yaml", "training/jobs.yaml"][which];
        let mut bytes = std::fs::read(root.join(file)).unwrap();
        for (at, byte) in edits {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        check("mutated.yaml", &String::from_utf8_lossy(&bytes));
    }
}
