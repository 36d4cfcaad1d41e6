//! `gpuscale validate PATH...`: load and validate, print every problem.

use std::path::PathBuf;
use std::process::ExitCode;

use gpuscale_policies::SharingMode;
use gpuscale_policies::model::PlacementOption;
use gpuscale_policies::{Bundle, load_paths};

/// Arguments of `validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Files or directories (YAML, JSON; directories are read recursively).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Print nothing on success.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Runs the command: exit 0 when everything is valid, 1 otherwise.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    match load_paths(&args.paths) {
        Ok(bundle) => {
            // (A path that holds no document is a located problem of
            // `load_paths`: a wrong folder or an empty file is no pass.)
            // Gateway files are checked by the gateway's own loader (which
            // also reads the policies they name).
            let mut gateways = Vec::new();
            let mut problems = Vec::new();
            for file in &bundle.gateways {
                match gpuscale_gateway::config::load(file) {
                    Ok(settings) => {
                        // A token may still come from the command line or
                        // the environment where it runs: said, not failed.
                        if let Err(why) = settings.check_exposure() {
                            eprintln!(
                                "warning: {}: {why}; `gpuscale gateway` refuses to start with this file alone",
                                file.display()
                            );
                        }
                        gateways.push(settings);
                    }
                    Err(p) => problems.extend(p.0),
                }
            }
            let mut autoscalers = Vec::new();
            for file in &bundle.autoscalers {
                match gpuscale_autoscaler::config::load(file) {
                    Ok(settings) => autoscalers.push(settings),
                    Err(p) => problems.extend(p.0),
                }
            }
            for file in &bundle.scenarios {
                if let Err(p) = gpuscale_sim::Scenario::load(file) {
                    problems.extend(p.0);
                }
            }
            if !problems.is_empty() {
                return Ok(super::report_problems(&problems));
            }
            // A GPU model a policy lists that none of its sharing modes
            // can use (MIG alone, on a GPU without MIG) is a slip: said,
            // not failed, since another listed model fits (with none, the
            // policy is refused). A listed model too small for a replica
            // is left alone: its memory or compute may be meant to shrink.
            for warning in unplaceable_gpu_models(&bundle) {
                eprintln!("warning: {warning}");
            }
            // A setting that lets users raise their own jobs' priority is
            // said even with --quiet.
            if let Some(q) = bundle.queue.as_ref().filter(|q| q.weights.runtime > 0.0) {
                eprintln!(
                    "warning: training queue: longest first is on (weights.runtime {}): a job's own estimatedRuntime raises its priority",
                    gpuscale_policies::training::number(q.weights.runtime)
                );
            }
            tracing::info!(
                models = bundle.models.len(),
                jobs = bundle.jobs.len(),
                "validated"
            );
            if !args.quiet {
                super::emit(&summary(&bundle, &gateways, &autoscalers))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(problems) => Ok(super::report_problems(&problems.0)),
    }
}

/// Per model policy whose sharing modes all need MIG (`mig`,
/// `mig-timeslice`), each GPU model its `placement.gpuModels` lists (as
/// written: the default, every catalogue model, lists none) that has no
/// MIG, once.
fn unplaceable_gpu_models(bundle: &Bundle) -> Vec<String> {
    let mut out = Vec::new();
    for (p, m) in bundle.policies.iter().zip(&bundle.models) {
        let needs_mig = |s: &SharingMode| matches!(s, SharingMode::Mig | SharingMode::MigTimeslice);
        if !m.sharing.iter().all(needs_mig) {
            continue;
        }
        let sharing: Vec<String> = m.sharing.iter().map(|s| s.to_string()).collect();
        let listed: std::collections::BTreeSet<&String> =
            p.spec.placement.gpu_models.iter().collect();
        for name in listed {
            if bundle.catalog.get(name).is_some_and(|g| g.mig.is_none()) {
                out.push(format!(
                    "model `{}`: placement.gpuModels lists {name}, which has no MIG, and placement.sharing [{}] needs MIG: no replica is ever placed on it",
                    m.name,
                    sharing.join(", ")
                ));
            }
        }
    }
    out
}

fn summary(
    bundle: &Bundle,
    gateways: &[gpuscale_gateway::Settings],
    autoscalers: &[gpuscale_autoscaler::config::Settings],
) -> String {
    let mut out = String::new();
    match &bundle.cluster {
        Some(c) => out.push_str(&format!(
            "cluster `{}`: {} nodes, {} GPUs\n",
            c.name,
            c.nodes.len(),
            c.gpu_count()
        )),
        None => out.push_str("no cluster file: checked against the built-in catalogue\n"),
    }
    if !bundle.models.is_empty() {
        out.push_str(&format!("{} model policies:\n", bundle.models.len()));
    }
    for m in &bundle.models {
        let options = m.options(&bundle.catalog);
        let smallest: Vec<String> = options
            .iter()
            .map(|o| match o {
                PlacementOption::Mig { gpu, profile } => format!("{gpu}:{profile}"),
                PlacementOption::MigTimeslice { gpu, profile } => {
                    format!("{gpu}:{profile}:shared")
                }
                PlacementOption::Timeslice { gpu } => format!("{gpu}:shared"),
                PlacementOption::Mps { gpu } => format!("{gpu}:mps"),
                PlacementOption::Fractional { gpu, gpus: 1 } => format!("{gpu}:fractional"),
                PlacementOption::Fractional { gpu, gpus } => format!("{gpus}×{gpu}:fractional"),
                PlacementOption::Whole { gpu, gpus } => format!("{gpus}×{gpu}"),
            })
            .take(4)
            .collect();
        let more = options.len().saturating_sub(smallest.len());
        out.push_str(&format!(
            "  {:<18} {:>7.2} GiB  compute {:>4.2}  fits: {}{}\n",
            m.name,
            m.memory_gib,
            m.compute,
            smallest.join(", "),
            if more > 0 {
                format!(" (+{more} more)")
            } else {
                String::new()
            }
        ));
    }
    if !bundle.jobs.is_empty() {
        out.push_str(&format!("{} training jobs:\n", bundle.jobs.len()));
    }
    for j in &bundle.jobs {
        out.push_str(&format!(
            "  {:<18} {} × {} GPUs of [{}], topology {} ({})\n",
            j.name,
            j.spec.workers,
            j.spec.gpus_per_worker,
            j.gpu_models.join(", "),
            j.spec.topology.level,
            // As written in the file (`required`, `preferred`).
            format!("{:?}", j.spec.topology.mode).to_lowercase()
        ));
    }
    if let Some(q) = &bundle.queue {
        let names: Vec<&str> = q.partitions.iter().map(|p| p.name.as_str()).collect();
        out.push_str(&format!(
            "training queue: {} partition(s) [{}], {} fair-share account(s), usage half-life {}\n",
            q.partitions.len().max(1),
            if names.is_empty() {
                "default".to_string()
            } else {
                names.join(", ")
            },
            q.fair_share.accounts.len(),
            gpuscale_policies::duration::show(q.fair_share.half_life)
        ));
    }
    for g in gateways {
        out.push_str(&format!(
            "gateway `{}`: traffic {}, admin {}, {} models\n",
            g.name,
            g.spec.listen,
            g.spec.admin,
            g.models.len()
        ));
    }
    for a in autoscalers {
        out.push_str(&format!(
            "autoscaler `{}`: {} models, admin {}\n",
            a.name,
            a.models.len(),
            a.spec.admin
        ));
    }
    if let Some(d) = &bundle.demand {
        out.push_str(&format!(
            "demand: {} replicas of {} models\n",
            d.values().sum::<u32>(),
            d.len()
        ));
    }
    for s in &bundle.scenarios {
        out.push_str(&format!(
            "scenario {}: its cluster, policies and traces load\n",
            s.display()
        ));
    }
    out.push_str("ok\n");
    out
}
