//! The simulator's generated scenarios (`bench/scenarios/fleet-1000*` and
//! `marketplace*`): too many models to write by hand, so they are derived
//! here from the model zoo, the same way every time, and checked in; a
//! test fails when the checked-in files differ from what this writes
//! (`cargo run -p gpuscale-bench --bin sim-scenarios` rewrites them).
//!
//! Each model's serving speed on one H100 follows from its size: decode
//! reads every weight once per token (3.35 TB/s of HBM at 60 %
//! efficiency), prefill does two FLOPs per parameter per token (989
//! TFLOP/s of dense bf16 at 40 %). That gives 120–125 output tokens/s and
//! about 25,000 prompt tokens/s for an 8B model in bf16 and 14 and 2,800
//! for a 70B one, as the hand-written scenarios use. A replica runs at the
//! compute of its share ([`crate::scenario::variant`]'s `compute`, the
//! least the packer gives it), so each SLO is set at twice the time a
//! request of the trace's 95th-percentile size takes at that compute in a
//! full batch: what a model owner who sized the replica would declare.
//! What one replica carries at its target is the fewer of what its batch
//! carries at `targetQueueDepth` and what its prefill lane (one prompt at
//! a time) carries at the autoscaler's prefill target of 70 %: the lane
//! binds for embedding and speech models, whose requests are mostly
//! prompt, and sizes their load and `maxReplicas`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::scenario::{ModelSpec, RuleSet, VARIANTS, ZooEntry, demand, models, node_mix, variant};

/// H100 SXM HBM bandwidth, bytes per second.
const HBM: f64 = 3.35e12;
/// H100 SXM dense bf16, FLOP per second.
const FLOPS: f64 = 989e12;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
/// Requests a replica holds at its target (`targetQueueDepth`).
const TARGET: u32 = 8;
/// Most requests a replica runs at once.
const MAX_CONCURRENCY: u32 = 16;
/// Per-token slowdown per other request in the batch.
const BATCH_SLOWDOWN: f64 = 0.01;
/// Share of its time a replica's prefill lane is busy at the
/// autoscaler's target (`tuning.prefillTarget`'s default).
const PREFILL_TARGET: f64 = 0.7;
/// The Azure conversation trace's mean and 95th-percentile prompt and
/// output tokens (19,366 rows: 1,155 and 211 mean; 4,083 and 451 p95).
const TRACE_MEAN: (f64, f64) = (1155.0, 211.0);
const TRACE_P95: (f64, f64) = (4083.0, 451.0);
/// The trace, relative to `bench/scenarios/`.
const TRACE: &str = "../data/traces/azure_llm_2023_conv.csv";

/// One replica's speed on one H100.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Speed {
    /// Prompt tokens per second (0: instant).
    pub prefill_tps: f64,
    /// Output tokens per second alone.
    pub decode_tps: f64,
}

/// The speed of a model on one H100, from its size.
pub fn speed(m: &ModelSpec) -> Speed {
    let prefill = 0.4 * FLOPS / (2.0 * m.params_b * 1e9);
    let decode = 0.6 * HBM / (m.weights_gib * GIB);
    match m.kind.as_str() {
        // The text encoder's 77 tokens take next to nothing; then 30
        // denoising steps, about 10 a second on an H100 for SDXL.
        "image" => Speed {
            prefill_tps: 100_000.0,
            decode_tps: 10.0,
        },
        "embedding" => Speed {
            prefill_tps: prefill,
            decode_tps: 1.0,
        },
        _ => Speed {
            prefill_tps: prefill,
            decode_tps: decode,
        },
    }
}

/// Request sizes by kind: (mean prompt, mean output), (p95 prompt, p95
/// output), and the `tokens:` setting. Embedding requests carry a batch
/// of 64 passages of 512 tokens (as an indexing job sends them), speech
/// requests five minutes of audio (ten 30-second windows of 1,500
/// encoder positions, 100 tokens of text each), image requests 30
/// denoising steps; chat requests come from the Azure trace.
fn sizes(kind: &str) -> ((f64, f64), (f64, f64), String) {
    match kind {
        "embedding" => (
            (32768.0, 0.0),
            (32768.0, 0.0),
            "{prompt: 32768, output: 0}".into(),
        ),
        "speech" => (
            (15000.0, 1000.0),
            (15000.0, 1000.0),
            "{prompt: 15000, output: 1000}".into(),
        ),
        "image" => (
            (77.0, 30.0),
            (77.0, 30.0),
            "{prompt: 77, output: 30}".into(),
        ),
        _ => (TRACE_MEAN, TRACE_P95, format!("{{trace: {TRACE}}}")),
    }
}

/// Seconds to serve `(prompt, output)` at `compute` (H100s) in a batch of
/// `batch`: the latency model of `policies::serving`, written out.
fn service(s: Speed, compute: f64, (prompt, output): (f64, f64), batch: u32) -> (f64, f64) {
    let prefill = if s.prefill_tps > 0.0 {
        prompt / (s.prefill_tps * compute)
    } else {
        0.0
    };
    let per = (1.0 + BATCH_SLOWDOWN * f64::from(batch - 1)) / (s.decode_tps * compute);
    let first = if output > 0.0 { prefill + per } else { prefill };
    (prefill + per * output, first)
}

fn round_up(x: f64, step: f64) -> f64 {
    (x / step - 1e-9).ceil() * step
}

fn secs(x: f64) -> String {
    if x.fract().abs() < 1e-9 {
        format!("{}s", x as u64)
    } else {
        format!("{}ms", (x * 1000.0).round() as u64)
    }
}

/// A model as the simulator needs it: the policy's figures plus its
/// service and its demand.
struct SimModel {
    spec: ModelSpec,
    speed: Speed,
    ttft: Option<f64>,
    latency: f64,
    startup: f64,
    tokens: String,
    /// Requests per second one replica carries at its target, at its
    /// declared compute, mean-sized requests: the fewer of what its batch
    /// carries at `targetQueueDepth` and what its prefill lane (one prompt
    /// at a time, as vLLM's chunked prefill shares one forward pass)
    /// carries at the autoscaler's prefill target. The lane binds for
    /// embedding models, whose requests are all prompt.
    per_replica: f64,
}

fn sim_model(spec: ModelSpec) -> SimModel {
    let speed = speed(&spec);
    let (mean, p95, tokens) = sizes(&spec.kind);
    let c = spec.compute;
    let (long, first) = service(speed, c, p95, TARGET);
    let (typical, _) = service(speed, c, mean, TARGET);
    let (prefill, _) = service(speed, c, (mean.0, 0.0), 1);
    let by_batch = f64::from(TARGET) / typical;
    let by_lane = if prefill > 0.0 {
        PREFILL_TARGET / prefill
    } else {
        f64::INFINITY
    };
    let llm = spec.kind.starts_with("llm");
    SimModel {
        ttft: llm.then(|| round_up((2.0 * first).max(1.0), 0.5)),
        latency: round_up((2.0 * long).max(1.0), 5.0),
        // The cold start of `ColdStartSpec`'s defaults: 20 s of image
        // pull and 2 GiB/s of weights.
        startup: (20.0 + spec.memory_gib / 2.0).ceil(),
        per_replica: by_batch.min(by_lane),
        speed,
        tokens,
        spec,
    }
}

/// One policy document.
fn policy(
    m: &SimModel,
    rules: RuleSet,
    min: u32,
    max: u32,
    cold_start_allowance: Option<&str>,
    note: &str,
) -> String {
    // A model that may go to zero after `MARKET_IDLE` idle: its owner
    // accepts a cold start (the allowance), so it need not idle for the
    // default 5 minutes first.
    let idle = if cold_start_allowance.is_some() {
        format!(", scaleToZeroAfter: {MARKET_IDLE}")
    } else {
        String::new()
    };
    let mut slo = String::new();
    if let Some(t) = m.ttft {
        let _ = write!(slo, "ttftP95: {}, ", secs(t));
    }
    let _ = write!(slo, "latencyP95: {}", secs(m.latency));
    if let Some(a) = cold_start_allowance {
        let _ = write!(slo, ", coldStartAllowance: {a}");
    }
    format!(
        "---\n# {}; {note}\napiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: {}\nspec:\n  resources: {{memoryGiB: {}, compute: {}, maxConcurrency: {MAX_CONCURRENCY}}}\n  placement:\n    sharing: {}\n    tensorParallel: {}\n  slo: {{{slo}}}\n  scaling: {{minReplicas: {min}, maxReplicas: {max}, targetQueueDepth: {TARGET}, startupTime: {}{idle}}}\n",
        m.spec.note,
        m.spec.name,
        m.spec.memory_gib,
        m.spec.compute,
        rules.model_sharing(&m.spec),
        m.spec.tensor_parallel,
        secs(m.startup),
    )
}

fn workload(m: &SimModel, arrivals: &str) -> String {
    let s = m.speed;
    format!(
        "    - model: {}\n      arrivals: {arrivals}\n      tokens: {}\n      service: {{prefillTps: {}, decodeTps: {}, batchSlowdown: {BATCH_SLOWDOWN}}}\n",
        m.spec.name,
        m.tokens,
        s.prefill_tps.round(),
        (s.decode_tps * 10.0).round() / 10.0,
    )
}

fn cluster(name: &str, nodes: &[(&str, &str, u32, u32)], rules: RuleSet, comment: &str) -> String {
    let mut out = format!(
        "# Generated by `cargo run -p gpuscale-bench --bin sim-scenarios`: {comment}\napiVersion: gpuscale.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: {name}\nspec:\n  nodes:\n"
    );
    for (prefix, model, per, count) in nodes {
        let _ = writeln!(
            out,
            "    - {{name: {prefix}, count: {count}, gpuModel: {model}, gpuCount: {per}, zone: z1{}}}",
            rules.node_sharing()
        );
    }
    out
}

/// GPUs in the fleet.
pub const FLEET_GPUS: u32 = 1000;
/// Models in the fleet.
pub const FLEET_MODELS: usize = 40;
/// Share of the fleet one replica per whole GPU would take if every
/// model peaked at once.
const FLEET_FILL: f64 = 0.8;
/// Diurnal swing of every model (trough 40 %, peak 160 % of the mean).
const FLEET_AMPLITUDE: f64 = 0.6;
/// Load at each model's peak over what its replicas carry at target.
const FLEET_LOAD: f64 = 0.7;

/// `fleet-1000`: 40 models of the zoo (as the packer benchmark's 1,000-GPU
/// case: bf16, fp8 and int4 variants with their KV caches) on about 1,000
/// GPUs of six kinds, every sharing mechanism allowed, for a day. Each
/// model peaks at its own hour between 10:00 and 18:00; at its peak it
/// wants the replicas of the packer benchmark's demand at 80 % fill (what
/// one replica per whole GPU would take of the cluster if all peaked at
/// once) at 70 % of their target load. Files, relative to
/// `bench/scenarios/`.
pub fn fleet(zoo: &[ZooEntry]) -> Vec<(String, String)> {
    let rules = RuleSet::All;
    let specs = models(zoo, FLEET_MODELS);
    let wanted = demand(&specs, FLEET_GPUS, FLEET_FILL);
    let sims: Vec<SimModel> = specs.into_iter().map(sim_model).collect();
    let mut policies = String::new();
    let mut workloads = String::new();
    let mut total = 0.0;
    for (i, m) in sims.iter().enumerate() {
        let peak_replicas = f64::from(wanted[&m.spec.name]);
        let peak = FLEET_LOAD * peak_replicas * m.per_replica;
        let mean = peak / (1.0 + FLEET_AMPLITUDE);
        total += mean;
        let max = (4.0 * peak_replicas).ceil() as u32 + 4;
        let note = format!(
            "peak {:.2} requests/s: {peak_replicas} replicas × {:.3}/s each at target × {FLEET_LOAD}",
            peak, m.per_replica
        );
        policies += &policy(m, rules, 1, max, None, &note);
        let hour = 10 + (i * 5) % 9;
        workloads += &workload(
            m,
            &format!(
                "{{poisson: {{rate: {}}}, diurnal: {{amplitude: {FLEET_AMPLITUDE}, peakAt: {hour}h}}}}",
                round4(mean)
            ),
        );
    }
    let nodes = node_mix(FLEET_GPUS);
    let gpus: u32 = nodes.iter().map(|n| n.2 * n.3).sum();
    let scenario = format!(
        "# Generated by `cargo run -p gpuscale-bench --bin sim-scenarios`\n# (bench/src/sim_scenarios.rs): {FLEET_MODELS} models of the zoo on {gpus}\n# GPUs of six kinds (H100, A100 80 and 40 GB, H200, L40S, L4), every\n# sharing mechanism allowed (MIG, time-sliced MIG, time-slicing, MPS,\n# HAMi), for a day. Each model follows a diurnal cycle (trough 40 %,\n# peak 160 % of its mean) peaking at its own hour between 10:00 and\n# 18:00; {:.0} requests/s in all on average. Chat models draw sizes from\n# the Azure trace. Speeds per H100 from each model's size (decode reads\n# the weights once per token at 60 % of 3.35 TB/s, prefill at 40 % of\n# 989 TFLOP/s); SLOs at twice a p95-sized request at the replica's\n# declared compute in a full batch. The gateway scrapes each replica's\n# vLLM metrics (prefill seconds, waiting prompts), as a deployment with\n# `metrics: vllm` does: without them the one-prompt-at-a-time prefill\n# lane of the embedding models stays invisible to the autoscaler.\napiVersion: gpuscale.io/v1alpha1\nkind: Scenario\nmetadata: {{name: fleet-1000}}\nspec:\n  seed: 1000\n  duration: 24h\n  cluster: fleet-1000/cluster.yaml\n  policies: [fleet-1000/policies.yaml]\n  compare: [gpuscale, static-peak]\n  consolidateEvery: 10m\n  decideOnPush: false\n  gateway: {{scrapeServerMetrics: true}}\n  workloads:\n{workloads}",
        total
    );
    vec![
        ("fleet-1000.yaml".into(), scenario),
        (
            "fleet-1000/cluster.yaml".into(),
            cluster(
                "fleet-1000",
                &nodes,
                rules,
                "the packer benchmark's 1,000-GPU mix, every sharing mechanism allowed.",
            ),
        ),
        (
            "fleet-1000/policies.yaml".into(),
            format!(
                "# Generated by `cargo run -p gpuscale-bench --bin sim-scenarios`: the\n# fleet's {FLEET_MODELS} models (bench/src/sim_scenarios.rs).\n{policies}"
            ),
        ),
    ]
}

fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// Models in the marketplace.
pub const MARKET_MODELS: usize = 100;
/// Zipf exponent of popularity: the 94 least popular models get about
/// 1.5 % of the requests, as reported for a production model
/// marketplace (94.1 % of models, 1.35 % of requests: Aegaeon, SOSP'25).
pub const MARKET_ZIPF: f64 = 2.8;
/// The hot models: the most popular, with no cold-start allowance.
pub const MARKET_HOT: usize = 6;
/// H100s of compute the marketplace's mean load keeps busy at the
/// replicas' declared compute (the load's scale).
const MARKET_BUSY_GPUS: f64 = 16.0;
/// What a cold model's owner allows on a request that finds it at zero.
const MARKET_ALLOWANCE: &str = "3m";
/// How long a cold model idles before it goes to zero (the default is
/// 5 minutes; Knative's is about a minute, KEDA's cooldown 5).
const MARKET_IDLE: &str = "1m";

/// The marketplace's popularity weights in rank order (sum 1).
pub fn zipf(n: usize, s: f64) -> Vec<f64> {
    let w: Vec<f64> = (1..=n).map(|r| (r as f64).powf(-s)).collect();
    let sum: f64 = w.iter().sum();
    w.into_iter().map(|x| x / sum).collect()
}

/// `marketplace`: 100 fine-tunes of the zoo's LLMs (7–72B; each base in
/// bf16, fp8 and int4 with an 8,192-token KV cache) on 208 GPUs (20 × 8
/// H100, 6 × 8 H200), every sharing mechanism allowed, for a day at a
/// diurnal swing. Popularity is Zipf (s = 2.8) over a fixed shuffle of
/// the models: the six hottest take about 98.5 % of the requests. Cold
/// models may go to zero and declare a 3-minute cold-start allowance; the
/// gateway holds a request up to 3 minutes (the largest cold start is
/// about 110 s).
pub fn marketplace(zoo: &[ZooEntry]) -> Vec<(String, String)> {
    let rules = RuleSet::All;
    let bases: Vec<&ZooEntry> = zoo.iter().filter(|z| z.kind.starts_with("llm")).collect();
    let tokens = 8192.0;
    // A fixed shuffle (a multiplicative LCG) gives each model its rank.
    let mut order: Vec<usize> = (0..MARKET_MODELS).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in (1..order.len()).rev() {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        order.swap(i, ((x >> 33) % (i as u64 + 1)) as usize);
    }
    let popularity = zipf(MARKET_MODELS, MARKET_ZIPF);
    let sims: Vec<SimModel> = (0..MARKET_MODELS)
        .map(|i| {
            let z = bases[i % bases.len()];
            let (dtype, bytes, _) = VARIANTS[(i / bases.len()) % VARIANTS.len()];
            let name = format!(
                "{}-{dtype}-ft{i:02}",
                z.name.to_lowercase().replace(['.', '_'], "-")
            );
            sim_model(variant(z, name, dtype, bytes, tokens))
        })
        .collect();
    // Rank r's share of requests; the scale so that the mean load keeps
    // MARKET_BUSY_GPUS H100s of declared compute busy at target.
    let rank_of: BTreeMap<usize, usize> = order.iter().enumerate().map(|(r, &m)| (m, r)).collect();
    let busy_per_request: f64 = sims
        .iter()
        .enumerate()
        .map(|(i, m)| popularity[rank_of[&i]] * m.spec.compute / m.per_replica)
        .sum();
    let total = MARKET_BUSY_GPUS / busy_per_request;
    let amplitude = 0.5;
    let mut policies = String::new();
    let mut workloads = String::new();
    for (i, m) in sims.iter().enumerate() {
        let rank = rank_of[&i];
        let rate = total * popularity[rank];
        let hot = rank < MARKET_HOT;
        let peak_replicas = (rate * (1.0 + amplitude) / m.per_replica).ceil().max(1.0);
        let max = (4.0 * peak_replicas) as u32 + 2;
        let note = format!(
            "popularity rank {} of {MARKET_MODELS} ({:.4} % of requests, {} requests/s mean){}",
            rank + 1,
            popularity[rank] * 100.0,
            round_sig(rate),
            if hot {
                "; hot"
            } else {
                "; cold: may go to zero"
            }
        );
        policies += &policy(
            m,
            rules,
            u32::from(hot),
            max,
            (!hot).then_some(MARKET_ALLOWANCE),
            &note,
        );
        workloads += &workload(
            m,
            &format!(
                "{{poisson: {{rate: {}}}, diurnal: {{amplitude: {amplitude}, peakAt: 15h}}}}",
                round_sig(rate)
            ),
        );
    }
    let nodes = [("h100", "H100-80GB", 8, 20), ("h200", "H200-141GB", 8, 6)];
    let gpus: u32 = nodes.iter().map(|n| n.2 * n.3).sum();
    let cold: f64 = popularity[MARKET_HOT..].iter().sum();
    let scenario = format!(
        "# Generated by `cargo run -p gpuscale-bench --bin sim-scenarios`\n# (bench/src/sim_scenarios.rs): a model marketplace. {MARKET_MODELS} fine-tunes of the\n# zoo's LLMs (7–72B in bf16, fp8 and int4) on {gpus} GPUs, every sharing\n# mechanism allowed, for a day (diurnal, peak 15:00 at 150 % of the\n# mean). Popularity is Zipf (s = {MARKET_ZIPF}) over a fixed shuffle: the\n# {} least popular models get {:.2} % of the {:.1} requests/s. The {MARKET_HOT}\n# hot models keep a replica; the cold ones go to zero after {MARKET_IDLE}\n# idle and declare a {MARKET_ALLOWANCE} cold-start allowance, and the gateway holds a request\n# up to 3 minutes; gpuscale decides on its 1 s tick (a second is
# nothing beside a cold start, and a hundred models deciding ten times a
# second take most of the simulation). The baseline named by the issue, one reserved\n# whole-GPU replica per model, is hpa/whole-gpu (HPA never goes below\n# one replica).\napiVersion: gpuscale.io/v1alpha1\nkind: Scenario\nmetadata: {{name: marketplace}}\nspec:\n  seed: 94\n  duration: 24h\n  cluster: marketplace/cluster.yaml\n  policies: [marketplace/policies.yaml]\n  gateway: {{maxQueue: 256, queueTimeout: 3m}}\n  decideOnPush: false\n  consolidateEvery: 30m\n  workloads:\n{workloads}",
        MARKET_MODELS - MARKET_HOT,
        cold * 100.0,
        total
    );
    vec![
        ("marketplace.yaml".into(), scenario),
        (
            "marketplace/cluster.yaml".into(),
            cluster("marketplace", &nodes, rules, "the marketplace's 208 GPUs."),
        ),
        (
            "marketplace/policies.yaml".into(),
            format!(
                "# Generated by `cargo run -p gpuscale-bench --bin sim-scenarios`: the\n# marketplace's {MARKET_MODELS} models (bench/src/sim_scenarios.rs).\n{policies}"
            ),
        ),
    ]
}

/// Four significant digits.
fn round_sig(x: f64) -> f64 {
    if x == 0.0 {
        return 0.0;
    }
    let digits = 4 - 1 - x.abs().log10().floor() as i32;
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

/// Every generated scenario's files, relative to `bench/scenarios/`.
pub fn all(zoo: &[ZooEntry]) -> Vec<(String, String)> {
    let mut out = fleet(zoo);
    out.extend(marketplace(zoo));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{default_zoo_path, load_zoo};

    #[test]
    fn speeds_follow_the_hand_written_scenarios() {
        // azure-conv's 8B: 30,000 and 120 per H100; 70B: 3,500 and 15.
        let zoo = load_zoo(&default_zoo_path()).unwrap();
        let z8 = zoo.iter().find(|z| z.name == "Llama-3.1-8B").unwrap();
        let s = speed(&variant(z8, "a".into(), "bf16", 2.0, 8192.0));
        assert!((100.0..140.0).contains(&s.decode_tps), "{s:?}");
        assert!((20_000.0..32_000.0).contains(&s.prefill_tps), "{s:?}");
        let z70 = zoo.iter().find(|z| z.name == "Llama-3.1-70B").unwrap();
        let s = speed(&variant(z70, "b".into(), "bf16", 2.0, 8192.0));
        assert!((12.0..17.0).contains(&s.decode_tps), "{s:?}");
        assert!((2_500.0..3_600.0).contains(&s.prefill_tps), "{s:?}");
    }

    #[test]
    fn the_marketplace_popularity_is_as_reported() {
        // About 94 % of the models receive under 2 % of the requests.
        let p = zipf(MARKET_MODELS, MARKET_ZIPF);
        let cold: f64 = p[MARKET_HOT..].iter().sum();
        assert!(cold < 0.02 && cold > 0.01, "{cold}");
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        assert!(p.windows(2).all(|w| w[0] > w[1]));
    }
}
