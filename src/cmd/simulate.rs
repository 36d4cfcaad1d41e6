//! `gpuscale simulate --scenario FILE --report DIR`: a scenario through
//! gpuscale and the baselines in simulated time; `report.json` and
//! `report.md` (with its plots, SVG and PNG) in `DIR`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gpuscale_sim::Scenario;
use gpuscale_sim::simulate::simulate_on;

/// Arguments of `simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The scenario file (`kind: Scenario`; see bench/scenarios/).
    #[arg(long)]
    pub scenario: PathBuf,
    /// Folder for report.json and report.md (created if missing).
    #[arg(long)]
    pub report: PathBuf,
    /// Runs simulated at once, one per thread (default: the machine's
    /// cores). The report is the same for any number.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
}

/// Runs the command: exit 1 on a bad scenario, with every problem located.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let scenario = match Scenario::load(&args.scenario) {
        Ok(s) => s,
        Err(problems) => return Ok(super::report_load_problems(&problems.0)),
    };
    std::fs::create_dir_all(&args.report)
        .with_context(|| format!("cannot create {}", args.report.display()))?;
    let bar = if std::io::stderr().is_terminal() {
        let n = gpuscale_sim::simulate::runs(&scenario).len() as u64;
        let bar = indicatif::ProgressBar::new(n);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!("simulating {}", scenario.name));
        bar.enable_steady_tick(std::time::Duration::from_millis(200));
        Some(bar)
    } else {
        None
    };
    let jobs = args
        .jobs
        .map_or_else(gpuscale_sim::simulate::default_jobs, |j| j as usize);
    let report = simulate_on(&scenario, jobs, &mut |done, of, name| {
        if let Some(bar) = &bar {
            bar.set_position(done as u64);
            bar.set_message(format!("{name} done"));
        } else {
            tracing::info!(run = name, done, of, "simulated");
        }
    });
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let json = args.report.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)? + "\n")
        .with_context(|| format!("cannot write {}", json.display()))?;
    let plots = gpuscale_sim::plot::write(&report, &args.report)
        .map_err(|e| anyhow::anyhow!("cannot draw the plots in {}: {e}", args.report.display()))?;
    let md = args.report.join("report.md");
    std::fs::write(&md, report.markdown(&plots))
        .with_context(|| format!("cannot write {}", md.display()))?;
    super::emit(&report.markdown(&[]))?;
    Ok(ExitCode::SUCCESS)
}
