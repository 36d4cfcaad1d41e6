//! `sim-scenarios`: writes the simulator's generated scenarios
//! (`fleet-1000`, `marketplace`) into `bench/scenarios/`, or with
//! `--check` fails when the files there differ from what it would write.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use gpuscale_bench::scenario::{default_zoo_path, load_zoo};
use gpuscale_bench::sim_scenarios;

/// Generates the fleet-1000 and marketplace scenarios from the model zoo.
#[derive(Parser)]
struct Args {
    /// The scenarios folder.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios"))]
    dir: PathBuf,
    /// Compare instead of writing; exit 1 on a difference.
    #[arg(long)]
    check: bool,
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let zoo = load_zoo(&default_zoo_path())?;
    let mut stale = 0;
    for (name, text) in sim_scenarios::all(&zoo) {
        let path = args.dir.join(&name);
        if args.check {
            let now = std::fs::read_to_string(&path).unwrap_or_default();
            if now != text {
                eprintln!("{} differs from what sim-scenarios writes", path.display());
                stale += 1;
            }
            continue;
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(if stale > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
