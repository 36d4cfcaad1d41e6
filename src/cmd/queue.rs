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
                hostlist(&nodes)
            },
            g.reason
        ));
    }
    if gangs.is_empty() {
        out.push_str("(no training jobs)\n");
    }
    out
}

/// Node names in Slurm's hostlist form, as `squeue`'s NODELIST shows
/// them: names that differ only in a trailing number share their prefix,
/// their numbers sorted and runs written as ranges (`h100-[0-3,7]`), so a
/// 64-GPU gang's eight nodes take one short field. A number written with
/// leading zeros keeps its width (`node[01-03]`) and is grouped apart
/// from unpadded ones; names without a trailing number are kept as they
/// are. Groups appear in the order of their first node.
fn hostlist(nodes: &[String]) -> String {
    enum Entry<'a> {
        /// Prefix, width of zero-padded numbers (0: unpadded), numbers.
        Numbered(&'a str, usize, Vec<u64>),
        Plain(&'a str),
    }
    let mut entries: Vec<Entry> = Vec::new();
    for name in nodes {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let (prefix, number) = name.split_at(name.len() - digits);
        // A number too long for u64 makes no range: kept as a name.
        match number.parse::<u64>() {
            Ok(n) => {
                let width = if digits > 1 && number.starts_with('0') {
                    digits
                } else {
                    0
                };
                let group = entries.iter_mut().find_map(|e| match e {
                    Entry::Numbered(p, w, ns) if *p == prefix && *w == width => Some(ns),
                    _ => None,
                });
                match group {
                    Some(ns) => ns.push(n),
                    None => entries.push(Entry::Numbered(prefix, width, vec![n])),
                }
            }
            Err(_) => {
                if !entries
                    .iter()
                    .any(|e| matches!(e, Entry::Plain(p) if p == name))
                {
                    entries.push(Entry::Plain(name));
                }
            }
        }
    }
    let text = |e: Entry| match e {
        Entry::Plain(name) => name.to_string(),
        Entry::Numbered(prefix, width, mut ns) => {
            ns.sort_unstable();
            ns.dedup();
            let num = |n: u64| format!("{n:0width$}");
            let mut ranges: Vec<String> = Vec::new();
            let mut k = 0;
            while k < ns.len() {
                let mut j = k;
                while j + 1 < ns.len() && ns[j + 1] == ns[j] + 1 {
                    j += 1;
                }
                ranges.push(if j == k {
                    num(ns[k])
                } else {
                    format!("{}-{}", num(ns[k]), num(ns[j]))
                });
                k = j + 1;
            }
            if ns.len() == 1 {
                format!("{prefix}{}", ranges[0])
            } else {
                format!("{prefix}[{}]", ranges.join(","))
            }
        }
    };
    entries.into_iter().map(text).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::hostlist;

    fn list(names: &[&str]) -> String {
        hostlist(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
    }

    // Expected strings in the form of Slurm's `scontrol show hostlist`
    // (slurm/src/common/hostlist.c): a prefix, then `[` ranges `]`.
    #[test]
    fn runs_of_numbered_nodes_are_ranges() {
        assert_eq!(list(&["h100-2", "h100-3"]), "h100-[2-3]");
        assert_eq!(
            list(&["h100-7", "h100-0", "h100-1", "h100-2", "h100-3", "h100-10"]),
            "h100-[0-3,7,10]"
        );
        assert_eq!(list(&["a100-0"]), "a100-0");
        assert_eq!(list(&["a100-0", "a100-0"]), "a100-0");
    }

    #[test]
    fn prefixes_padding_and_plain_names_are_kept_apart_in_order() {
        assert_eq!(
            list(&["node01", "node02", "node03", "gpu-9", "node10"]),
            "node[01-03],gpu-9,node10"
        );
        assert_eq!(
            list(&["login", "h100-1", "h100-2", "login"]),
            "login,h100-[1-2]"
        );
        assert_eq!(
            list(&["x99999999999999999999999"]),
            "x99999999999999999999999"
        );
    }
}
