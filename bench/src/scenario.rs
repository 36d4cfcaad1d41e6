//! Scenario generator: clusters of mixed GPU models at any size, a model
//! zoo from real model sizes (`bench/data/model_zoo.csv`), and demand
//! sized so that one replica per whole GPU would fill a set share of the
//! cluster. Scenarios are written as
//! the same YAML files users write, so benchmarks time loading too and the
//! CLI can replay them (`gpuscale plan --cluster DIR/cluster.yaml …`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, bail};

/// One row of the model zoo.
#[derive(Debug, Clone, PartialEq)]
pub struct ZooEntry {
    /// Model name.
    pub name: String,
    /// Parameters, billions.
    pub params_b: f64,
    /// Layers (LLMs).
    pub layers: Option<u32>,
    /// KV heads (LLMs).
    pub kv_heads: Option<u32>,
    /// Head dimension (LLMs).
    pub head_dim: Option<u32>,
    /// `llm`, `llm-moe`, `embedding`, `speech`, `image`.
    pub kind: String,
}

/// Reads the zoo CSV (`model,params_billion,layers,kv_heads,head_dim,kind,source`).
pub fn load_zoo(path: &Path) -> anyhow::Result<Vec<ZooEntry>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() < 6 {
            bail!("{}:{}: expected at least 6 fields", path.display(), i + 1);
        }
        let num = |s: &str| -> Option<u32> { s.trim().parse().ok() };
        out.push(ZooEntry {
            name: f[0].trim().to_string(),
            params_b: f[1]
                .trim()
                .parse()
                .with_context(|| format!("{}:{}: params_billion", path.display(), i + 1))?,
            layers: num(f[2]),
            kv_heads: num(f[3]),
            head_dim: num(f[4]),
            kind: f[5].trim().to_string(),
        });
    }
    Ok(out)
}

/// The zoo CSV shipped in the repository (`bench/data/`, its source in
/// the README beside it).
pub fn default_zoo_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/model_zoo.csv")
}

/// A generated model policy: name, memory, compute, sharing, tensor-parallel
/// degrees.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// Policy name.
    pub name: String,
    /// Memory per replica, GiB.
    pub memory_gib: f64,
    /// Compute per replica (fraction of one H100).
    pub compute: f64,
    /// Allowed sharing modes.
    pub sharing: &'static str,
    /// Allowed tensor-parallel degrees.
    pub tensor_parallel: &'static str,
    /// The arithmetic, for the YAML comment.
    pub note: String,
    /// Parameters, billions (of the zoo entry).
    pub params_b: f64,
    /// Weights, GiB (at this variant's precision).
    pub weights_gib: f64,
    /// The zoo entry's kind (`llm`, `llm-moe`, `embedding`, `speech`,
    /// `image`).
    pub kind: String,
    /// Popularity weight.
    pub weight: f64,
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// `count` model policies from the zoo: each entry in bf16 with a short
/// context, then fp8 with a longer one, then int4 with the longest.
pub fn models(zoo: &[ZooEntry], count: usize) -> Vec<ModelSpec> {
    (0..count)
        .map(|i| {
            let z = &zoo[i % zoo.len()];
            let round = i / zoo.len();
            let (dtype, bytes, tokens) = VARIANTS[round % VARIANTS.len()];
            // Past the three variants, longer contexts.
            let longer = round / VARIANTS.len();
            let tokens = tokens * f64::from(1u32 << longer.min(4));
            let suffix = if longer > 0 {
                format!("-ctx{longer}")
            } else {
                String::new()
            };
            let name = format!(
                "{}-{dtype}{suffix}",
                z.name.to_lowercase().replace(['.', '_'], "-")
            );
            let (mut m, memory) = variant_with_memory(z, name, dtype, bytes, tokens);
            // Popular small models, rarer big ones.
            m.weight = 1.0 / (1.0 + (i % 7) as f64) / memory.sqrt();
            m
        })
        .collect()
}

/// The precisions a zoo entry is served in: (name, bytes per parameter,
/// tokens of KV cache).
pub const VARIANTS: [(&str, f64, f64); 3] = [
    ("bf16", 2.0, 8192.0),
    ("fp8", 1.0, 32768.0),
    ("int4", 0.5, 65536.0),
];

/// A zoo entry served at `bytes` per parameter with `tokens` of KV
/// cache: its memory (weights + KV + overhead), its compute, and what
/// sharing and tensor-parallel degrees its size allows (weight 1).
pub fn variant(z: &ZooEntry, name: String, dtype: &str, bytes: f64, tokens: f64) -> ModelSpec {
    variant_with_memory(z, name, dtype, bytes, tokens).0
}

fn variant_with_memory(
    z: &ZooEntry,
    name: String,
    dtype: &str,
    bytes: f64,
    tokens: f64,
) -> (ModelSpec, f64) {
    let weights = z.params_b * 1e9 * bytes / GIB;
    let kv = match (z.layers, z.kv_heads, z.head_dim) {
        (Some(l), Some(h), Some(d)) => {
            2.0 * f64::from(l) * f64::from(h) * f64::from(d) * 2.0 * tokens / GIB
        }
        _ => 0.0,
    };
    let overhead = if z.kind == "image" { 6.0 } else { 2.0 };
    let memory = weights + kv + overhead;
    let compute = match z.kind.as_str() {
        "image" => 0.3,
        "embedding" => 0.03 + 0.01 * z.params_b,
        "speech" => 0.08,
        _ => (0.02 + weights / 180.0).min(4.0),
    };
    let (sharing, tensor_parallel) = if memory > 70.0 {
        ("[whole]", "[2, 4, 8]")
    } else if memory > 40.0 {
        ("[mig, whole]", "[1, 2]")
    } else {
        ("[mig, timeslice, whole]", "[1]")
    };
    let spec = ModelSpec {
        name,
        memory_gib: (memory * 100.0).round() / 100.0,
        compute: (compute * 1000.0).round() / 1000.0,
        sharing,
        tensor_parallel,
        note: format!(
            "{} {dtype}: weights {:.2} GiB + KV {:.2} GiB ({} tokens) + overhead {:.1} GiB",
            z.name, weights, kv, tokens, overhead
        ),
        params_b: z.params_b,
        weights_gib: weights,
        kind: z.kind.clone(),
        weight: 1.0,
    };
    (spec, memory)
}

/// Node templates of a cluster of about `gpus` GPUs: (prefix, GPU model,
/// GPUs per node, nodes).
pub fn node_mix(gpus: u32) -> Vec<(&'static str, &'static str, u32, u32)> {
    let mix: [(&str, &str, u32, f64); 6] = [
        ("h100", "H100-80GB", 8, 0.40),
        ("a100x80", "A100-80GB", 8, 0.20),
        ("h200", "H200-141GB", 8, 0.15),
        ("a100x40", "A100-40GB", 8, 0.10),
        ("l40s", "L40S", 4, 0.10),
        ("l4", "L4", 8, 0.05),
    ];
    mix.iter()
        .map(|&(prefix, model, per_node, share)| {
            let nodes = ((f64::from(gpus) * share / f64::from(per_node)).round() as u32).max(1);
            (prefix, model, per_node, nodes)
        })
        .collect()
}

/// Whole GPUs one replica takes on the best GPU of the mix when it gets
/// whole GPUs (today's default): its footprint in the whole-GPU baseline.
pub fn whole_footprint(m: &ModelSpec, gpus: u32) -> u32 {
    let catalog = gpuscale_policies::Catalog::builtin();
    let degrees: &[u32] = if m.tensor_parallel == "[2, 4, 8]" {
        &[2, 4, 8]
    } else {
        &[1, 2, 4, 8]
    };
    node_mix(gpus)
        .iter()
        .filter_map(|&(_, model, per, _)| {
            let g = catalog.get(model)?;
            degrees.iter().copied().find(|&k| {
                k <= per
                    && f64::from(k) * g.usable_gib >= m.memory_gib
                    && f64::from(k) * g.compute >= m.compute
            })
        })
        .min()
        .unwrap_or(8)
}

/// Replicas per model, split by popularity, so that giving every replica
/// whole GPUs (the baseline users have today) would take `fill` of the
/// cluster: the demand every baseline can place.
pub fn demand(models: &[ModelSpec], gpus: u32, fill: f64) -> BTreeMap<String, u32> {
    let total: u32 = node_mix(gpus)
        .iter()
        .map(|&(_, _, per, nodes)| per * nodes)
        .sum();
    let footprint: f64 = models
        .iter()
        .map(|m| m.weight * f64::from(whole_footprint(m, gpus)))
        .sum();
    let scale = fill * f64::from(total) / footprint;
    models
        .iter()
        .map(|m| (m.name.clone(), (m.weight * scale).round().max(1.0) as u32))
        .collect()
}

/// Which sharing mechanisms the scenario's policies and nodes allow. The
/// models, their memory and compute, and the demand are the same under
/// every rule set; only the `sharing` lists change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RuleSet {
    /// Today's rules: MIG slices, time-sliced whole GPUs, whole GPUs.
    MigWhole,
    /// Plus time-sliced MIG slices (every node may time-slice one MIG
    /// profile).
    MigTimeslice,
    /// Plus fractional GPUs (every node runs HAMi if the plan wants it).
    Fractional,
    /// Plus MPS partitions (every node's device plugin may run MPS).
    Mps,
    /// Every mechanism.
    All,
}

impl RuleSet {
    /// Every rule set, in report order.
    pub const EVERY: [RuleSet; 5] = [
        RuleSet::MigWhole,
        RuleSet::MigTimeslice,
        RuleSet::Fractional,
        RuleSet::Mps,
        RuleSet::All,
    ];

    /// The name in reports (`mig-whole`, `mig-timeslice`, `fractional`,
    /// `mps`, `all`).
    pub fn name(self) -> &'static str {
        match self {
            RuleSet::MigWhole => "mig-whole",
            RuleSet::MigTimeslice => "mig-timeslice",
            RuleSet::Fractional => "fractional",
            RuleSet::Mps => "mps",
            RuleSet::All => "all",
        }
    }

    /// The rule set of a name.
    pub fn parse(name: &str) -> Option<RuleSet> {
        RuleSet::EVERY.into_iter().find(|r| r.name() == name)
    }

    /// Modes added to today's, for nodes and for the models that may share
    /// a GPU (those of at most 70 GiB; larger ones get `fractional` only).
    fn extra(self) -> &'static [&'static str] {
        match self {
            RuleSet::MigWhole => &[],
            RuleSet::MigTimeslice => &["mig-timeslice"],
            RuleSet::Fractional => &["fractional"],
            RuleSet::Mps => &["mps"],
            RuleSet::All => &["mig-timeslice", "mps", "fractional"],
        }
    }
}

impl RuleSet {
    /// A model's `sharing` list under these rules.
    pub fn model_sharing(self, m: &ModelSpec) -> String {
        let extra = self.extra();
        // Tensor-parallel models (over 70 GiB) may take fractional shares
        // of their GPUs where HAMi runs (HAMi gives each GPU of a
        // multi-GPU container its `gpumem`); MPS partitions, handed out
        // one per request unit, could put two of a replica's shares on
        // one GPU, so not MPS.
        if m.sharing == "[whole]" {
            if extra.contains(&"fractional") {
                "[whole, fractional]".to_string()
            } else {
                m.sharing.to_string()
            }
        } else if extra.is_empty() {
            m.sharing.to_string()
        } else {
            format!("{}, {}]", m.sharing.trim_end_matches(']'), extra.join(", "))
        }
    }

    /// A node's `sharing` setting under these rules (empty: the default).
    pub fn node_sharing(self) -> String {
        let extra = self.extra();
        if extra.is_empty() {
            String::new()
        } else {
            format!(", sharing: [mig, timeslice, {}]", extra.join(", "))
        }
    }
}

/// The scenario's files: `cluster.yaml`, `policies.yaml`, `demand.yaml`.
pub fn files(
    gpus: u32,
    models: &[ModelSpec],
    demand: &BTreeMap<String, u32>,
    rules: RuleSet,
) -> Vec<(String, String)> {
    let node_sharing = rules.node_sharing();
    let mut cluster = format!(
        "# Generated: about {gpus} GPUs of mixed models.\napiVersion: gpuscale.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: bench-{gpus}\nspec:\n  nodes:\n"
    );
    for (prefix, model, per, nodes) in node_mix(gpus) {
        let _ = writeln!(
            cluster,
            "    - {{name: {prefix}, count: {nodes}, gpuModel: {model}, gpuCount: {per}, zone: z1{node_sharing}}}"
        );
    }
    let mut policies = String::new();
    for m in models {
        let sharing = rules.model_sharing(m);
        // The demand must be one the policy allows (`maxReplicas` bounds a
        // Demand; the packer itself never reads it).
        let most = demand.get(&m.name).copied().unwrap_or(0).max(10);
        let _ = write!(
            policies,
            "---\n# {}\napiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: {}\nspec:\n  resources:\n    memoryGiB: {}\n    compute: {}\n    maxConcurrency: 16\n  placement:\n    sharing: {}\n    tensorParallel: {}\n  scaling:\n    maxReplicas: {most}\n",
            m.note, m.name, m.memory_gib, m.compute, sharing, m.tensor_parallel
        );
    }
    let mut d = String::from(
        "apiVersion: gpuscale.io/v1alpha1\nkind: Demand\nmetadata:\n  name: bench\nspec:\n  replicas:\n",
    );
    for (name, n) in demand {
        let _ = writeln!(d, "    {name}: {n}");
    }
    vec![
        ("cluster.yaml".into(), cluster),
        ("policies.yaml".into(), policies),
        ("demand.yaml".into(), d),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zoo() -> Vec<ZooEntry> {
        load_zoo(&default_zoo_path()).unwrap()
    }

    #[test]
    fn the_zoo_reads() {
        let z = zoo();
        assert!(z.len() >= 10);
        let llama = z.iter().find(|e| e.name == "Llama-3.1-8B").unwrap();
        assert_eq!(
            (llama.layers, llama.kv_heads, llama.head_dim),
            (Some(32), Some(8), Some(128))
        );
    }

    #[test]
    fn generated_scenarios_load_and_are_valid() {
        let ms = models(&zoo(), 40);
        assert_eq!(ms.len(), 40);
        let names: std::collections::BTreeSet<_> = ms.iter().map(|m| &m.name).collect();
        assert_eq!(names.len(), 40, "names are unique");
        let d = demand(&ms, 1000, 0.9);
        let dir = std::env::temp_dir().join(format!("gpuscale-scenario-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files(1000, &ms, &d, RuleSet::All) {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let bundle = gpuscale_policies::load_paths(&[&dir]).unwrap_or_else(|p| panic!("{p}"));
        let cluster = bundle.cluster.unwrap();
        assert!(
            (950..=1050).contains(&cluster.gpu_count()),
            "{}",
            cluster.gpu_count()
        );
        assert_eq!(bundle.models.len(), 40);
        // Under `all`, every node allows MPS and fractional GPUs, and every
        // model allows fractional shares (the tensor-parallel ones across
        // their GPUs); MPS only those that may share one GPU.
        use gpuscale_policies::SharingMode;
        assert!(cluster.nodes.iter().all(|n| {
            n.sharing.contains(&SharingMode::Fractional)
                && n.sharing.contains(&SharingMode::Mps)
                && n.sharing.contains(&SharingMode::MigTimeslice)
        }));
        for m in &bundle.models {
            let shares = m.sharing.contains(&SharingMode::Mig);
            assert!(m.sharing.contains(&SharingMode::Fractional), "{}", m.name);
            assert_eq!(m.sharing.contains(&SharingMode::Mps), shares, "{}", m.name);
            assert_eq!(
                m.sharing.contains(&SharingMode::MigTimeslice),
                shares,
                "{}",
                m.name
            );
            assert_eq!(m.tensor_parallel.contains(&1), shares, "{}", m.name);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
