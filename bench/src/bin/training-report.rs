//! `training-report`: the training queue evidence — one seeded stream of
//! jobs under six schedulers, a Markdown table on stdout (and `--json`).

use std::path::PathBuf;

use clap::Parser;
use gpuscale_bench::training::{
    Outcome, Scenario, Scheduler, makespan_bound_h, simulate, stream, summary, table,
};

/// Simulates a stream of training jobs under FIFO without gangs, FIFO with
/// gangs, EASY backfill and gpuscale (with and without its longest-first
/// factor, and in arrival order).
#[derive(Parser)]
struct Args {
    /// Jobs in the stream.
    #[arg(long, default_value_t = 400)]
    jobs: usize,
    /// Seed of the stream.
    #[arg(long, default_value_t = 15)]
    seed: u64,
    /// Mean time between arrivals, seconds.
    #[arg(long, default_value_t = 900.0)]
    mean_gap: f64,
    /// Share of submissions that are sweeps of four jobs in one second.
    #[arg(long, default_value_t = 0.1)]
    sweep_share: f64,
    /// Run this many consecutive seeds from `--seed` and print, after each
    /// seed's table, a summary across them (medians and ranges).
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// GPUs inference wants at its daily peak (its `minReplicas` hold 32;
    /// 32 keeps it flat).
    #[arg(long, default_value_t = 64)]
    inference_peak_gpus: u32,
    /// Also write the outcomes as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.seeds >= 1, "--seeds: at least 1");
    let mut runs: Vec<(Scenario, Vec<Outcome>, f64)> = Vec::new();
    for seed in args.seed..args.seed + args.seeds {
        let s = Scenario {
            seed,
            jobs: args.jobs,
            mean_gap_s: args.mean_gap,
            sweep_share: args.sweep_share,
            inference_peak_gpus: args.inference_peak_gpus,
            ..Scenario::default()
        };
        let jobs = stream(&s);
        let outcomes: Vec<Outcome> = std::thread::scope(|scope| {
            let handles: Vec<_> = Scheduler::ALL
                .iter()
                .map(|&k| {
                    let (s, jobs) = (&s, &jobs);
                    scope.spawn(move || simulate(s, jobs, k))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a simulation thread"))
                .collect()
        });
        print!("{}", table(&s, &jobs, &outcomes));
        println!();
        let bound = makespan_bound_h(&s, &jobs);
        runs.push((s, outcomes, bound));
    }
    if runs.len() > 1 {
        let per_seed: Vec<Vec<Outcome>> = runs.iter().map(|(_, o, _)| o.clone()).collect();
        print!("{}", summary(&per_seed));
    }
    if let Some(path) = args.json {
        let all: Vec<_> = runs
            .iter()
            .map(|(s, o, b)| serde_json::json!({"scenario": s, "outcomes": o, "makespan_bound_h": b}))
            .collect();
        let value = if all.len() == 1 {
            all.into_iter().next().unwrap_or_default()
        } else {
            serde_json::Value::Array(all)
        };
        std::fs::write(&path, serde_json::to_string_pretty(&value)?)
            .map_err(|e| anyhow::anyhow!("--json {}: {e}", path.display()))?;
    }
    Ok(())
}
