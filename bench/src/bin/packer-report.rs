//! `packer-report`: the packer benchmark report (see `bench/README.md`).

use std::path::PathBuf;

use clap::Parser;
use gpuscale_bench::packer_report;
use gpuscale_bench::scenario::RuleSet;

fn parse_rule_set(name: &str) -> Result<RuleSet, String> {
    RuleSet::parse(name).ok_or_else(|| {
        format!(
            "unknown rule set `{name}`; one of: {}",
            RuleSet::EVERY.map(RuleSet::name).join(", ")
        )
    })
}
use gpuscale_packer::PackOptions;

/// Packs generated scenarios with gpuscale, FFD and whole-GPU baselines.
#[derive(Parser)]
struct Args {
    /// Cluster sizes in GPUs.
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000,80000")]
    sizes: Vec<u32>,
    /// Models in the zoo mix.
    #[arg(long, default_value_t = 40)]
    models: usize,
    /// Demand as the share of the cluster one replica per whole GPU would take.
    #[arg(long, default_value_t = 0.9)]
    fill: f64,
    /// Runs per size (times are medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Size of the incremental case (0: skip).
    #[arg(long, default_value_t = 1000)]
    incremental: u32,
    /// Relative MIP gap (the packer's `--mip-gap`).
    #[arg(long, default_value_t = 0.005)]
    mip_gap: f64,
    /// Sharing rule sets, each a row per size: `mig-whole` (today's: MIG,
    /// time-sliced whole GPUs, whole GPUs), `mig-timeslice` (+ time-sliced
    /// MIG slices), `fractional` (+ HAMi), `mps` (+ MPS), `all`. The
    /// baselines run with the first.
    #[arg(long, value_delimiter = ',', default_value = "mig-whole,mig-timeslice,fractional,mps,all", value_parser = parse_rule_set)]
    rule_sets: Vec<RuleSet>,
    /// The rule set of the incremental case.
    #[arg(long, default_value = "all", value_parser = parse_rule_set)]
    incremental_rule_set: RuleSet,
    /// Where the scenario files are written.
    #[arg(long, default_value = "target/bench-scenarios")]
    dir: PathBuf,
    /// Also write the rows as JSON to this file (a list of `{gpus,
    /// replicas, rule_set, gpus_used, cost, lp_cost_bound, utilization:
    /// {memory, compute, dominant}, ceiling_memory, pack_ms,
    /// end_to_end_ms}`).
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let setup = packer_report::Setup {
        dir: args.dir.clone(),
        models: args.models,
        fill: args.fill,
        runs: args.runs,
        options: PackOptions {
            mip_rel_gap: args.mip_gap,
            ..PackOptions::default()
        },
        incremental_rules: args.incremental_rule_set,
    };
    let mut rows = Vec::new();
    for &size in &args.sizes {
        for (i, &rules) in args.rule_sets.iter().enumerate() {
            eprintln!("packing {size} GPUs under {}…", rules.name());
            rows.push(packer_report::run_size(&setup, size, rules, i == 0)?);
        }
    }
    let incremental = if args.incremental > 0 {
        eprintln!("incremental +1 on {} GPUs…", args.incremental);
        Some(packer_report::run_incremental(&setup, args.incremental)?)
    } else {
        None
    };
    print!("{}", packer_report::markdown(&rows, incremental.as_ref()));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&packer_report::json_rows(&rows))?;
        std::fs::write(path, text + "\n")
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}
