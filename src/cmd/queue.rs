//! `gpuscale queue`: the training queue as `squeue --start` shows Slurm's —
//! running and pending jobs in priority order, when each starts (or is
//! reserved to), on which nodes, and why a job waits. It plans exactly as
//! `gpuscale plan` does (inference and training on one inventory) and
//! prints only the queue.

use std::path::PathBuf;
use std::process::ExitCode;

use gpuscale_packer::gang::{GangPlan, GangStatus, queue::rfc3339};

/// Arguments of `queue`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cluster file (`kind: Cluster`): running jobs are the GPUs whose
    /// workloads name them.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Model policies, training jobs and the `TrainingQueue`: files or
    /// directories.
    #[arg(long, required = true, num_args = 1..)]
    pub policies: Vec<PathBuf>,
    /// Wanted inference replicas (`kind: Demand`; default `minReplicas`).
    #[arg(long)]
    pub demand: Option<PathBuf>,
    /// An earlier plan (JSON or YAML) as the current state.
    #[arg(long)]
    pub current: Option<PathBuf>,
    /// The time to plan at (RFC 3339; default: now).
    #[arg(long, value_parser = humantime::parse_rfc3339_weak)]
    pub now: Option<std::time::SystemTime>,
    /// Output format (`json`/`yaml`: the plan's `gangs`).
    #[arg(long, value_enum, default_value_t = super::Format::Table)]
    pub format: super::Format,
}

/// Runs the command.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let plan_args = super::plan::Args::for_inputs(
        args.cluster.clone(),
        args.policies.clone(),
        args.demand.clone(),
        args.current.clone(),
        args.now,
    );
    let plan = match super::plan::make(&plan_args)? {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let mut gangs: Vec<&GangPlan> = plan.gangs.iter().collect();
    // Running first, then by priority, as squeue sorts by state and
    // priority.
    gangs.sort_by(|a, b| {
        let order = |g: &GangPlan| match g.status {
            GangStatus::Running => 0,
            GangStatus::Starting => 1,
            GangStatus::Preempted => 2,
            GangStatus::Pending => 3,
        };
        order(a)
            .cmp(&order(b))
            .then(b.priority_score.total_cmp(&a.priority_score))
            .then(a.name.cmp(&b.name))
    });
    match args.format {
        super::Format::Table => super::emit(&table(&gangs))?,
        other => super::print_data(&gangs, other)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn table(gangs: &[&GangPlan]) -> String {
    let mut out = format!(
        "{:<22} {:<10} {:<10} {:>8} {:<9} {:>4}  {:<20} {:<20} {:<24} REASON\n",
        "JOB", "PARTITION", "ACCOUNT", "PRIORITY", "STATE", "GPUS", "START", "END", "NODES"
    );
    for g in gangs {
        let mut nodes: Vec<String> = if g.workers.is_empty() {
            g.reserved.iter().map(|r| r.node.clone()).collect()
        } else {
            g.workers.iter().map(|w| w.node.clone()).collect()
        };
        nodes.dedup();
        let time = |t: Option<f64>| t.map_or("-".to_string(), rfc3339);
        out.push_str(&format!(
            "{:<22} {:<10} {:<10} {:>8.0} {:<9} {:>4}  {:<20} {:<20} {:<24} {}\n",
            g.name,
            g.partition,
            g.account.as_deref().unwrap_or("-"),
            g.priority_score,
            format!("{:?}", g.status).to_lowercase(),
            g.workers_wanted * g.gpus_per_worker,
            time(g.start_s),
            time(g.end_s),
            if nodes.is_empty() {
                "-".to_string()
            } else {
                nodes.join(",")
            },
            g.reason
        ));
    }
    if gangs.is_empty() {
        out.push_str("(no training jobs)\n");
    }
    out
}
