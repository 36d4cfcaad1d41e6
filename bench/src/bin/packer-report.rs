//! `packer-report`: the packer benchmark report (see `bench/README.md`).

use std::path::PathBuf;

use clap::Parser;
use gpuscale_bench::packer_report;
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
    /// Where the scenario files are written.
    #[arg(long, default_value = "target/bench-scenarios")]
    dir: PathBuf,
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
    };
    let mut rows = Vec::new();
    for &size in &args.sizes {
        eprintln!("packing {size} GPUs…");
        rows.push(packer_report::run_size(&setup, size)?);
    }
    let incremental = if args.incremental > 0 {
        eprintln!("incremental +1 on {} GPUs…", args.incremental);
        Some(packer_report::run_incremental(&setup, args.incremental)?)
    } else {
        None
    };
    print!("{}", packer_report::markdown(&rows, incremental.as_ref()));
    Ok(())
}
