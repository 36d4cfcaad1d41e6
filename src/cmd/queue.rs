//! `gpuscale queue`: the training queue as `squeue --start` shows Slurm's —
//! running and pending jobs in priority order, when each starts (or is
//! reserved to), on which nodes, and why a job waits. It plans exactly as
//! `gpuscale plan` does (inference and training on one inventory) and
//! prints only the queue.

use std::path::PathBuf;
use std::process::ExitCode;

use gpuscale_packer::gang::{GangPlan, GangStatus, hostlist::hostlist, queue::rfc3339};

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
    #[arg(long, value_parser = gpuscale_policies::rfc3339::parse)]
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
    const HEAD: [&str; 10] = [
        "JOB",
        "PARTITION",
        "ACCOUNT",
        "PRIORITY",
        "STATE",
        "GPUS",
        "START",
        "END",
        "NODES",
        "REASON",
    ];
    // Each column at least as wide as it always was, wider where a cell
    // needs it (a long job name, a gang's hostlist), so REASON stays in
    // line; PRIORITY and GPUS right-aligned, two spaces before START.
    let mut widths = [22, 10, 10, 8, 9, 4, 20, 20, 24, 0];
    let time = |t: Option<f64>| t.map_or("-".to_string(), rfc3339);
    let rows: Vec<[String; 10]> = gangs
        .iter()
        .map(|g| {
            let mut nodes: Vec<&str> = if g.workers.is_empty() {
                g.reserved.iter().map(|r| r.node.as_str()).collect()
            } else {
                g.workers.iter().map(|w| w.node.as_str()).collect()
            };
            nodes.dedup();
            [
                g.name.clone(),
                g.partition.clone(),
                g.account.clone().unwrap_or_else(|| "-".into()),
                format!("{:.0}", g.priority_score),
                format!("{:?}", g.status).to_lowercase(),
                (g.workers_wanted * g.gpus_per_worker).to_string(),
                time(g.start_s),
                time(g.end_s),
                if nodes.is_empty() {
                    "-".to_string()
                } else {
                    hostlist(&nodes)
                },
                g.reason.clone(),
            ]
        })
        .collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row).take(9) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 10]| {
        let mut l = String::new();
        for (k, cell) in cells.iter().enumerate() {
            let pad = widths[k].saturating_sub(cell.chars().count());
            match k {
                9 => l.push_str(cell),
                3 | 5 => {
                    l.push_str(&" ".repeat(pad));
                    l.push_str(cell);
                }
                _ => {
                    l.push_str(cell);
                    l.push_str(&" ".repeat(pad));
                }
            }
            if k < 9 {
                l.push_str(if k == 5 { "  " } else { " " });
            }
        }
        l.push('\n');
        l
    };
    let mut out = line(HEAD);
    for row in &rows {
        out.push_str(&line(std::array::from_fn(|k| row[k].as_str())));
    }
    if gangs.is_empty() {
        out.push_str("(no training jobs)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::table;
    use gpuscale_packer::gang::{GangPlan, GangStatus, Worker};

    #[test]
    fn a_wide_gang_keeps_reason_in_line_and_its_nodes_in_hostlist_form() {
        let wide = GangPlan {
            name: "a-job-name-longer-than-twenty-two".into(),
            status: GangStatus::Starting,
            workers_wanted: 12,
            gpus_per_worker: 8,
            partition: "training".into(),
            workers: (0..12)
                .map(|i| Worker {
                    worker: i,
                    node: format!("gpu-node-{:02}", i + 1),
                    gpus: (0..8).collect(),
                })
                .collect(),
            reason: "wide".into(),
            ..Default::default()
        };
        let small = GangPlan {
            name: "small".into(),
            workers_wanted: 1,
            gpus_per_worker: 1,
            partition: "dev".into(),
            reason: "narrow".into(),
            ..Default::default()
        };
        let text = table(&[&wide, &small]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let at = |l: &str, what: &str| l.find(what).unwrap();
        let reason = at(lines[0], "REASON");
        assert_eq!(at(lines[1], "wide"), reason, "{text}");
        assert_eq!(at(lines[2], "narrow"), reason, "{text}");
        assert_eq!(
            at(lines[1], "training"),
            at(lines[0], "PARTITION"),
            "{text}"
        );
        assert!(lines[1].contains(" gpu-node-[01-12] "), "{text}");
        assert!(lines[1].contains("   96  "), "{text}");
    }
}
