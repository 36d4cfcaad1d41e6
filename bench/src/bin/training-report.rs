//! `training-report`: the training queue evidence — one seeded stream of
//! jobs under four schedulers, a Markdown table on stdout (and `--json`).

use std::path::PathBuf;

use clap::Parser;
use gpuscale_bench::training::{Scenario, Scheduler, simulate, stream, table};

/// Simulates a stream of training jobs under FIFO without gangs, FIFO with
/// gangs, EASY backfill and gpuscale.
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
    /// Also write the outcomes as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let s = Scenario {
        seed: args.seed,
        jobs: args.jobs,
        mean_gap_s: args.mean_gap,
        sweep_share: args.sweep_share,
        ..Scenario::default()
    };
    let jobs = stream(&s);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
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
    if let Some(path) = args.json {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(
                &serde_json::json!({"scenario": s, "outcomes": outcomes}),
            )?,
        )?;
    }
    Ok(())
}
