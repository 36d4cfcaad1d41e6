//! `gpuscale plan`: pack the wanted replicas onto the cluster and print or
//! emit the plan.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use gpuscale_packer::{Baselines, Mode, PackOptions, Plan, baseline, emit, gang, min_replicas};
use gpuscale_policies::load_paths;

/// Arguments of `plan`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The cluster file (`kind: Cluster`).
    #[arg(long)]
    pub cluster: PathBuf,
    /// Model policies: files or directories.
    #[arg(long, required = true, num_args = 1..)]
    pub policies: Vec<PathBuf>,
    /// Wanted replicas (`kind: Demand`); models it leaves out get their
    /// `minReplicas`. Without it, every model gets `minReplicas`.
    #[arg(long)]
    pub demand: Option<PathBuf>,
    /// An earlier plan (JSON or YAML) to re-plan from: its placement is the current
    /// state (without it, the GPU states in the cluster file are the current state).
    #[arg(long)]
    pub current: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = super::Format::Table)]
    pub format: super::Format,
    /// Write the mig-parted config, device-plugin config, node labels and
    /// per-variant resource snippets into this directory.
    #[arg(long)]
    pub emit: Option<PathBuf>,
    /// Namespace of the emitted ConfigMaps.
    #[arg(long, default_value = "gpu-operator")]
    pub namespace: String,
    /// Also run the baselines (whole GPU per replica; first-fit decreasing).
    #[arg(long)]
    pub compare: bool,
    /// Re-planning, keep every running replica where it is and add what is
    /// missing on top (re-solve only when that cannot place them all), as
    /// the autoscaler does between consolidations. Without it a re-plan
    /// moves replicas whenever that saves more than the MIP gap.
    #[arg(long)]
    pub keep_running: bool,
    /// Fill the room the plan's GPUs leave idle (fractional GPUs below
    /// their caps, MPS partitions unused, empty MIG instances) with spare
    /// replicas of the models placed, as the controller does
    /// (`spec.packer.spares`): never a GPU more. Marked `+` in the table,
    /// `"spare": true` in JSON.
    #[arg(long)]
    pub spares: bool,
    /// Solver time limit.
    #[arg(long, default_value = "30s", value_parser = gpuscale_policies::duration::parse, allow_hyphen_values = true)]
    pub time_limit: Duration,
    /// How long the whole MIP may improve on the heuristic plan (rounding,
    /// diving, the small MIP over what the dive left, part-used GPUs
    /// emptied), and, re-planning, how long the whole-cluster search for
    /// less disruption may take; within the time limit (0: node counts
    /// only).
    #[arg(long, default_value = "1s", value_parser = gpuscale_policies::duration::parse, allow_hyphen_values = true)]
    pub improve_limit: Duration,
    /// Relative MIP gap at which the solver stops (0.005 = within 0.5 % of
    /// the optimal cost; 1e-4 for a tight plan, slower).
    #[arg(long, default_value_t = 0.005, allow_negative_numbers = true)]
    pub mip_gap: f64,
    /// Most time-sliced shares per GPU.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(2..=16))]
    pub max_shares: u8,
    /// Fraction of a time-sliced GPU's memory kept free.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub timeslice_headroom: f64,
    /// Most MPS partitions per GPU.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(2..=48))]
    pub max_mps: u8,
    /// Fraction of an MPS or fractional (HAMi) GPU's memory kept free.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub isolated_headroom: f64,
    /// Most replicas on one fractional (HAMi) GPU: HAMi's
    /// `devicePlugin.deviceSplitCount` (its default is 10), for the nodes
    /// whose `hamiSplitCount` the cluster file does not state.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub hami_split_count: u32,
    /// Let HiGHS print its log on stderr (stdout keeps the plan), to diagnose slow solves.
    #[arg(long)]
    pub solver_log: bool,
    /// Namespace of the training jobs' PodGroups and worker pods (a job's
    /// own `metadata.namespace` comes first).
    #[arg(long, default_value = "default")]
    pub training_namespace: String,
    /// The time the training queue is planned at (RFC 3339, e.g.
    /// `2026-12-03T09:00:00Z`; default: now): running jobs free their GPUs
    /// at their start + runtime, and reservations are given from it.
    #[arg(long, value_parser = gpuscale_policies::rfc3339::parse)]
    pub now: Option<std::time::SystemTime>,
    /// Which gang scheduler's PodGroup `--emit` writes for training jobs.
    #[arg(long, value_enum, default_value_t = GangSchedulerArg::Coscheduling)]
    pub gang_scheduler: GangSchedulerArg,
    /// The training workers' `schedulerName` (default:
    /// `scheduler-plugins-scheduler`, scheduler-plugins' second scheduler,
    /// with coscheduling; `volcano` with Volcano). `default-scheduler`
    /// where coscheduling runs in the default scheduler's profile.
    #[arg(long)]
    pub scheduler_name: Option<String>,
}

/// The gang scheduler a cluster runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GangSchedulerArg {
    /// scheduler-plugins' coscheduling (`scheduling.x-k8s.io` PodGroup).
    Coscheduling,
    /// Volcano (`scheduling.volcano.sh` PodGroup).
    Volcano,
}

impl Args {
    /// The arguments `gpuscale queue` plans with: these inputs, every
    /// other setting at its default.
    pub fn for_inputs(
        cluster: PathBuf,
        policies: Vec<PathBuf>,
        demand: Option<PathBuf>,
        current: Option<PathBuf>,
        now: Option<std::time::SystemTime>,
    ) -> Args {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Wrap {
            #[command(flatten)]
            args: Args,
        }
        let mut args = Wrap::parse_from(["plan", "--cluster", "-", "--policies", "-"]).args;
        args.cluster = cluster;
        args.policies = policies;
        args.demand = demand;
        args.current = current;
        args.now = now;
        args
    }
}

/// Runs the command.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut plan = match make(args)? {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    finish(args, &mut plan)
}

/// Loads the inputs and plans inference and training; `Err(code)` when
/// the inputs had problems (printed).
pub fn make(args: &Args) -> anyhow::Result<Result<Plan, ExitCode>> {
    if !(0.0..1.0).contains(&args.timeslice_headroom) {
        bail!("--timeslice-headroom must be in [0, 1)");
    }
    if !(0.0..1.0).contains(&args.isolated_headroom) {
        bail!("--isolated-headroom must be in [0, 1)");
    }
    // (`contains` is false for NaN.)
    if !(0.0..1.0).contains(&args.mip_gap) {
        bail!("--mip-gap must be in [0, 1) (0.005 = within 0.5 % of the optimal cost)");
    }
    // A Kubernetes namespace: a DNS-1123 label.
    if let Some(why) = gpuscale_policies::load::namespace_problem(&args.training_namespace) {
        bail!("--training-namespace: {why}");
    }
    if let Some(why) = gpuscale_policies::load::namespace_problem(&args.namespace) {
        bail!("--namespace: {why}");
    }
    // A pod's schedulerName is a DNS-1123 subdomain, as the API server
    // validates it.
    if let Some(name) = &args.scheduler_name
        && let Some(why) = gpuscale_policies::load::name_problem(name)
    {
        bail!("--scheduler-name: {why}");
    }
    // One file: a folder would bring every document in it (policies,
    // demand, training jobs) into the plan unasked.
    if args.cluster.is_dir() {
        bail!(
            "--cluster {}: a folder; give the file that holds the `kind: Cluster` document (policies and training jobs go after --policies, the demand after --demand)",
            args.cluster.display()
        );
    }
    let mut paths = vec![args.cluster.clone()];
    paths.extend(args.policies.iter().cloned());
    paths.extend(args.demand.iter().cloned());
    let mut bundle = match load_paths(&paths) {
        Ok(b) => b,
        Err(problems) => return Ok(Err(super::report_problems(&problems.0))),
    };
    let Some(mut cluster) = bundle.cluster else {
        bail!(
            "--cluster {}: no `kind: Cluster` document",
            args.cluster.display()
        );
    };
    // Nothing to plan is a mistake, not an empty plan: every replica the
    // cluster runs would be dropped without a word.
    if bundle.models.is_empty() && bundle.jobs.is_empty() {
        let named: Vec<String> = args
            .policies
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        bail!(
            "--policies {}: no `kind: ModelPolicy` or `kind: TrainingJob` document",
            named.join(" ")
        );
    }
    if let Some(file) = &args.demand
        && bundle.demand.is_none()
    {
        bail!("--demand {}: no `kind: Demand` document", file.display());
    }
    let mut basis = None;
    if args.demand.is_none() && bundle.demand.is_some() {
        let named: Vec<String> = args
            .policies
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        eprintln!(
            "note: planning with the `kind: Demand` document found in --cluster {} or among --policies {} (give --demand FILE to say which)",
            args.cluster.display(),
            named.join(" ")
        );
    }
    if let Some(path) = &args.current {
        // An unreadable file is a located problem (exit 1), as every
        // input's is.
        let text = match gpuscale_policies::load::read(path) {
            Ok(t) => t,
            Err(p) => return Ok(Err(super::report_problems(&[p]))),
        };
        // JSON (`--format json`) or YAML (`--format yaml`): the same plan.
        let earlier: Plan = match read_plan(path, &text) {
            Ok(plan) => plan,
            Err(p) => return Ok(Err(super::report_problems(&[*p]))),
        };
        // Replicas on nodes the cluster no longer has are planned again
        // (a node drained and deleted); a plan that shares no node with
        // the cluster was made for another one.
        let gone: BTreeSet<&str> = earlier
            .gpus
            .iter()
            .filter(|g| !g.replicas.is_empty())
            .map(|g| g.node.as_str())
            .filter(|n| !cluster.nodes.iter().any(|c| c.name == *n))
            .collect();
        let known = earlier
            .gpus
            .iter()
            .any(|g| cluster.nodes.iter().any(|c| c.name == g.node));
        if !earlier.gpus.is_empty() && !known {
            bail!(
                "--current {}: a plan for another cluster (none of its nodes is in {})",
                path.display(),
                args.cluster.display()
            );
        }
        if !gone.is_empty() {
            let gone: Vec<&str> = gone.into_iter().collect();
            tracing::warn!(
                nodes = gone.join(", "),
                "--current places replicas on nodes the cluster no longer has: they are planned again"
            );
        }
        let names: Vec<&str> = bundle.models.iter().map(|m| m.name.as_str()).collect();
        let jobs: Vec<&str> = bundle.jobs.iter().map(|j| j.name.as_str()).collect();
        let problems = earlier.problems_against(&cluster, &names, &jobs);
        if !problems.is_empty() {
            let located: Vec<gpuscale_policies::Problem> = problems
                .into_iter()
                .map(|(field, message)| gpuscale_policies::Problem {
                    file: path.clone(),
                    position: gpuscale_policies::document::Position { line: 1, column: 1 },
                    path: field,
                    message,
                })
                .collect();
            return Ok(Err(super::report_problems(&located)));
        }
        cluster = earlier.apply_to(&cluster);
        // Gangs that ran (or started) in the earlier plan started then,
        // unless their file says they started later: a gang the earlier
        // plan restarted (broken, or preempted and placed again) started
        // at the restart, not at the `startedAt` its file kept.
        for job in &mut bundle.jobs {
            if let Some(g) = earlier
                .gangs
                .iter()
                .find(|g| g.name == job.name && g.holds())
                && let Some(t) = g.start_s
                && let Ok(d) = std::time::Duration::try_from_secs_f64(t)
                && let Some(planned) = std::time::SystemTime::UNIX_EPOCH.checked_add(d)
                && job.spec.started_at.is_none_or(|filed| filed < planned)
            {
                job.spec.started_at = Some(planned);
            }
        }
        basis = earlier.basis;
    }
    let mut demand: BTreeMap<String, u32> = min_replicas(&bundle.models);
    if let Some(d) = &bundle.demand {
        demand.extend(d.clone());
    }
    let options = PackOptions {
        time_limit: args.time_limit,
        improve_limit: args.improve_limit,
        mip_rel_gap: args.mip_gap,
        max_timeslice_replicas: args.max_shares,
        timeslice_memory_headroom: args.timeslice_headroom,
        max_mps_replicas: args.max_mps,
        mps_memory_headroom: args.isolated_headroom,
        fractional_memory_headroom: args.isolated_headroom,
        fractional_max_shares: args.hami_split_count,
        solver_log: args.solver_log,
        keep_running: args.keep_running,
        ..PackOptions::default()
    };
    tracing::info!(
        gpus = cluster.gpu_count(),
        models = bundle.models.len(),
        "packing"
    );
    let now = args.now.unwrap_or_else(std::time::SystemTime::now);
    // A job that runs (a GPU's workloads name it) is running whatever its
    // timestamps say: its GPUs are busy. One started after `now` counts
    // as started now.
    let runs = |name: &str| {
        cluster
            .nodes
            .iter()
            .flat_map(|n| &n.gpus)
            .flat_map(|g| &g.workloads)
            .any(|w| w.model == name)
    };
    for j in &mut bundle.jobs {
        if let Some(t) = j.spec.started_at
            && t > now
        {
            tracing::warn!(
                job = %j.name,
                started_at = %humantime::format_rfc3339_seconds(t),
                "startedAt is after --now: taken as started at --now"
            );
            j.spec.started_at = Some(now);
        }
        // What runs is what the GPUs run, not what a file says.
        if j.spec.started_at.is_some() && !runs(&j.name) {
            tracing::warn!(
                job = %j.name,
                "startedAt is given, but no GPU runs the job (the cluster file's workloads, or the plan given to --current): planned as waiting, its startedAt not used"
            );
        }
    }
    // A job submitted after `now` that does not run is not in the queue
    // yet (a scheduler cannot know of it): it is left out, and said so.
    bundle.jobs.retain(|j| match j.spec.submitted_at {
        Some(t) if t > now && runs(&j.name) => {
            tracing::warn!(
                job = %j.name,
                submitted_at = %humantime::format_rfc3339_seconds(t),
                "submitted after --now, but its GPUs run it: kept as running"
            );
            true
        }
        Some(t) if t > now => {
            tracing::warn!(
                job = %j.name,
                submitted_at = %humantime::format_rfc3339_seconds(t),
                "submitted after --now: not in the queue yet, left out of the plan"
            );
            false
        }
        _ => true,
    });
    tracing::info!(jobs = bundle.jobs.len(), "training jobs");
    let queue = gang::queue::Queue::new(bundle.queue.clone().unwrap_or_default(), now);
    let mut plan = gang::joint::plan(
        &cluster,
        &bundle.models,
        gang::joint::Training {
            jobs: &bundle.jobs,
            queue: &queue,
            options: &gang::GangOptions::default(),
        },
        &demand,
        &options,
        basis.as_ref(),
    )?;
    if args.spares {
        plan = gpuscale_packer::spare::fill(&plan, &cluster, &bundle.models, &options, None);
        if gpuscale_packer::spare::count(&plan).is_empty() {
            tracing::warn!(
                "--spares: no spare replica fits: no GPU in use has idle room where its sharing holds each replica to its share (HAMi, MPS, an empty MIG instance), or a wanted replica is unplaced"
            );
        }
    }
    if args.compare {
        plan.baselines = Some(Baselines {
            whole_gpu: baseline::whole_gpu(&cluster, &bundle.models, &demand),
            ffd: baseline::ffd(&cluster, &bundle.models, &demand, &options),
        });
    }
    Ok(Ok(plan))
}

/// The list of files the last `--emit` wrote, in its directory.
const EMITTED: &str = ".gpuscale-emitted";

/// Files an earlier emit wrote that this one does not: `earlier` is the
/// earlier list (one relative path a line), `now` this emit's paths.
/// Only plain relative paths below the directory are ever named, so a
/// hand-edited list cannot point a removal outside it.
fn stale(earlier: &str, now: &BTreeSet<&str>) -> Vec<String> {
    earlier
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !now.contains(l))
        .filter(|l| {
            Path::new(l)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        })
        .map(str::to_string)
        .collect()
}

/// Writes the artefacts into `dir` and removes those an earlier emit
/// there wrote and this plan no longer has (a variant or gang gone would
/// otherwise stay, and `kubectl apply -f variants/` deploy it). Files it
/// did not write are never touched: what it wrote is listed in
/// `dir/.gpuscale-emitted`.
fn write_emitted(dir: &Path, files: &[(String, String)]) -> anyhow::Result<()> {
    let list = dir.join(EMITTED);
    let earlier = match std::fs::read_to_string(&list) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", list.display())),
    };
    // A folder of the output that is a link would take the files wherever
    // it points: refused before anything is written.
    for (rel, _) in files {
        if let Some(link) = linked_folder(dir, rel) {
            anyhow::bail!(
                "--emit: {} is a symbolic link; the artefacts are written only into real folders under {}",
                link.display(),
                dir.display()
            );
        }
    }
    for (rel, text) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        replace_file(&path, text)?;
    }
    let now: BTreeSet<&str> = files.iter().map(|(rel, _)| rel.as_str()).collect();
    for rel in stale(&earlier, &now) {
        // Nor is anything removed through a linked folder.
        if let Some(link) = linked_folder(dir, &rel) {
            tracing::warn!(file = %rel, link = %link.display(), "not removed: its folder is a symbolic link");
            continue;
        }
        let path = dir.join(&rel);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                tracing::info!(file = %path.display(), "removed: an earlier emit wrote it, this plan has no such artefact");
                // Its folder too, once empty (`gangs/` with no gang left).
                if let Some(parent) = path.parent()
                    && parent != dir
                {
                    let _ = std::fs::remove_dir(parent);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Not a file any more (a folder, say): left alone, and no
            // longer listed, so a later emit does not stop on it.
            Err(e) => {
                tracing::warn!(file = %path.display(), "not removed: {e}");
            }
        }
    }
    let mut listed: Vec<&str> = now.into_iter().collect();
    listed.sort_unstable();
    replace_file(&list, &format!("{}\n", listed.join("\n")))?;
    Ok(())
}

/// The first folder between `dir` and the file `rel` under it that is a
/// symbolic link, if one is.
fn linked_folder(dir: &Path, rel: &str) -> Option<std::path::PathBuf> {
    let mut at = dir.to_path_buf();
    let parent = Path::new(rel).parent()?;
    for part in parent.components() {
        at.push(part);
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink()) {
            return Some(at);
        }
    }
    None
}

/// Writes `text` to a new file beside `path` and renames it over `path`:
/// a reader never sees half a file, and a link at `path` is replaced, not
/// followed (an earlier `--emit` folder another user could write into
/// must not redirect the write). The new file gets the mode a plain
/// write would leave: the one `path` had, or the umask's.
fn replace_file(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let parent = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map_or_else(|| "artefact".into(), |n| n.to_string_lossy().into_owned());
    let (tmp, mut file) = (0..100u32)
        .find_map(|k| {
            let tmp = parent.join(format!(".{name}.{}.{k}.tmp", std::process::id()));
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .ok()
                .map(|f| (tmp, f))
        })
        .with_context(|| format!("writing {}: no temporary file beside it", path.display()))?;
    let written = (|| -> std::io::Result<()> {
        file.write_all(text.as_bytes())?;
        if let Ok(m) = std::fs::symlink_metadata(path)
            && m.file_type().is_file()
        {
            file.set_permissions(m.permissions())?;
        }
        drop(file);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", path.display()));
    }
    Ok(())
}

/// Emits the artefacts and prints the plan.
fn finish(args: &Args, plan: &mut Plan) -> anyhow::Result<ExitCode> {
    let plan = &*plan;
    if let Some(dir) = &args.emit {
        let scheduler = match args.gang_scheduler {
            GangSchedulerArg::Coscheduling => gang::artefacts::GangScheduler::Coscheduling,
            GangSchedulerArg::Volcano => gang::artefacts::GangScheduler::Volcano,
        };
        let mut files = emit::files(plan, &args.namespace)?;
        files.extend(gang::artefacts::files_named(
            &plan.gangs,
            &args.training_namespace,
            scheduler,
            args.scheduler_name.as_deref(),
        )?);
        write_emitted(dir, &files)?;
        tracing::info!(dir = %dir.display(), "emitted NVIDIA configuration");
    }
    match args.format {
        super::Format::Table => super::emit(&table(plan, args.mip_gap))?,
        other => super::print_data(plan, other)?,
    }
    Ok(ExitCode::SUCCESS)
}

fn table(plan: &Plan, mip_gap: f64) -> String {
    let mut rows: Vec<[String; 6]> = vec![[
        "NODE".into(),
        "GPU".into(),
        "MODEL".into(),
        "MODE".into(),
        "CONFIGURATION".into(),
        "REPLICAS".into(),
    ]];
    let (mut idle, mut unhealthy) = (0, 0);
    for g in &plan.gpus {
        if g.mode == Mode::Idle {
            if g.unhealthy {
                unhealthy += 1;
            } else {
                idle += 1;
            }
            continue;
        }
        let node = plan.nodes.iter().find(|n| n.name == g.node);
        let shared = node.and_then(|n| n.mig_timeslice.as_ref());
        let config = match g.mode {
            Mode::Mig => g
                .geometry
                .iter()
                .map(|p| match shared {
                    Some(t) if t.profile == p.profile => {
                        format!("{}@{}×{}", p.profile, p.start, t.replicas)
                    }
                    _ => format!("{}@{}", p.profile, p.start),
                })
                .collect::<Vec<_>>()
                .join(" + "),
            Mode::Timeslice => format!("{} shares", g.timeslice_replicas.unwrap_or(0)),
            Mode::Mps => format!("{} MPS partitions", g.mps_replicas.unwrap_or(0)),
            Mode::Fractional => match node.and_then(|n| n.hami_split_count) {
                Some(k) => format!("fractional (HAMi, ≤ {k})"),
                None => "fractional (HAMi)".to_string(),
            },
            _ if g.gang.is_some() => "whole (training)".to_string(),
            _ => "whole".to_string(),
        };
        let gang = g
            .gang
            .as_ref()
            .map(|s| format!("{} worker {}", s.job, s.worker));
        let replicas: Vec<String> = gang
            .into_iter()
            .chain(g.replicas.iter().map(|r| {
                let spare = if r.spare { "+" } else { "" };
                match (&r.profile, r.group_size) {
                    (Some(p), _) => format!("{spare}{}#{} ({p})", r.model, r.replica),
                    (None, Some(k)) if k > 1 => {
                        format!("{spare}{}#{} (tp{k})", r.model, r.replica)
                    }
                    _ => format!("{spare}{}#{}", r.model, r.replica),
                }
            }))
            .collect();
        rows.push([
            g.node.clone(),
            g.index.to_string(),
            g.gpu_model.clone(),
            format!("{:?}", g.mode).to_lowercase(),
            config,
            replicas.join(", "),
        ]);
    }
    // Each column as wide as its widest cell (in characters: `×`, `≤`).
    let width = |c: usize| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..5).map(width).collect();
    let pad = |text: &str, w: usize, right: bool| {
        let fill = " ".repeat(w.saturating_sub(text.chars().count()));
        if right {
            format!("{fill}{text}")
        } else {
            format!("{text}{fill}")
        }
    };
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = (0..5).map(|c| pad(&r[c], widths[c], c == 1)).collect();
        out.push_str(format!("{}  {}\n", cells.join("  "), r[5]).trim_end());
        out.push('\n');
    }
    if unhealthy > 0 {
        // A broken gang's old pods keep their GPUs out of the plan too.
        let why = if plan.gangs.iter().any(|g| {
            g.preempts
                .iter()
                .any(|p| p.name == g.name && p.reason.starts_with("its own pods"))
        }) {
            "unhealthy or held by a broken gang's old pods"
        } else {
            "unhealthy"
        };
        out.push_str(&format!(
            "({idle} GPUs idle, {unhealthy} {why}: never placed on)\n\n"
        ));
    } else {
        out.push_str(&format!("({idle} GPUs idle)\n\n"));
    }
    let unplaced: u32 = plan.unplaced.iter().map(|u| u.replicas).sum();
    if plan.lp_bound_known && unplaced > 0 {
        // The LP's bound is for placing the whole demand: a plan that
        // leaves replicas out can cost less, so it bounds nothing here.
        out.push_str(&format!(
            "GPUs used {}, cost ${:.2}/h, {unplaced} replica{} unplaced; the LP bound ({} GPUs, ${:.2}/h) is for the whole demand, so no gap is claimed\n",
            plan.gpus_used,
            plan.cost_per_hour,
            if unplaced == 1 { "" } else { "s" },
            plan.lp_bound_gpus,
            plan.lp_bound_cost,
        ));
    } else if let (true, Some(gap)) = (plan.lp_bound_known, plan.optimality_gap) {
        out.push_str(&format!(
            "GPUs used {} (LP bound {}), cost ${:.2}/h (LP bound ${:.2}, gap {:.1} %), {}\n",
            plan.gpus_used,
            plan.lp_bound_gpus,
            plan.cost_per_hour,
            plan.lp_bound_cost,
            gap * 100.0,
            match (plan.optimal, gap <= mip_gap + 1e-9) {
                (true, true) => "optimal within --mip-gap".to_string(),
                // The solver's own bound (after its cuts and branching) is
                // tighter than the LP's: it proved the gap, the LP cannot show it.
                (true, false) => format!(
                    "optimal within --mip-gap ({:.1} %) by the solver's own bound; the LP bound is looser",
                    mip_gap * 100.0
                ),
                (false, _) => "best found within limits".to_string(),
            }
        ));
    } else {
        out.push_str(&format!(
            "GPUs used {}, cost ${:.2}/h; no LP bound: every running replica kept (--keep-running), and no prior plan's bound holds for this input (--current PLAN.json carries one)\n",
            plan.gpus_used, plan.cost_per_hour
        ));
    }
    let pools: Vec<String> = plan
        .pools
        .iter()
        .filter(|p| p.gpus_used > 0 || p.lp_gpus > 1e-6)
        .map(|p| {
            if plan.lp_bound_known {
                format!("{} {} (LP {:.1})", p.gpu_model, p.gpus_used, p.lp_gpus)
            } else {
                format!("{} {}", p.gpu_model, p.gpus_used)
            }
        })
        .collect();
    out.push_str(&format!("GPUs used per pool: {}\n", pools.join(", ")));
    out.push_str(&format!(
        "utilisation of GPUs in use: memory {:.1} %, compute {:.1} %, dominant {:.1} %\n",
        plan.utilization.memory * 100.0,
        plan.utilization.compute * 100.0,
        plan.utilization.dominant * 100.0
    ));
    out.push_str(&format!(
        "replicas moved {}, GPUs reconfigured {}, solved in {:.0} ms\n",
        plan.moves, plan.reconfigured_gpus, plan.solve_ms
    ));
    let spares = gpuscale_packer::spare::count(plan);
    if !spares.is_empty() {
        let each: Vec<String> = spares.iter().map(|(m, n)| format!("{m} {n}")).collect();
        out.push_str(&format!(
            "spare replicas (+) in room the GPUs in use leave idle: {}\n",
            each.join(", ")
        ));
    }
    for m in &plan.models {
        let variants: Vec<String> = m
            .variants
            .iter()
            .map(|v| {
                let res: Vec<String> = v
                    .resources
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect();
                format!("{}×[{}]", v.replicas, res.join(", "))
            })
            .collect();
        let spares: u32 = m.variants.iter().map(|v| v.spares).sum();
        out.push_str(&format!(
            "  {:<18} {}/{} placed{}  {}\n",
            m.name,
            m.placed,
            m.wanted,
            if spares > 0 {
                format!(" +{spares} spare")
            } else {
                String::new()
            },
            variants.join(" ")
        ));
    }
    for u in &plan.unplaced {
        out.push_str(&format!(
            "unplaced: {} × {}: {}\n",
            u.replicas, u.model, u.reason
        ));
    }
    out.push_str(&gangs_table(plan));
    if let Some(b) = &plan.baselines {
        // A baseline that could not place every replica used fewer GPUs
        // for less work: say so beside its figures.
        let unplaced = |n: u32| {
            if n == 0 {
                String::new()
            } else {
                format!(
                    ", {n} {} unplaced: not like for like",
                    if n == 1 { "replica" } else { "replicas" }
                )
            }
        };
        out.push_str(&format!(
            "baselines: whole-GPU {} GPUs (${:.2}/h, memory {:.1} %, compute {:.1} %, dominant {:.1} %{}), first-fit decreasing {} GPUs (${:.2}/h, memory {:.1} %, compute {:.1} %, dominant {:.1} %{})\n",
            b.whole_gpu.gpus_used,
            b.whole_gpu.cost_per_hour,
            b.whole_gpu.utilization.memory * 100.0,
            b.whole_gpu.utilization.compute * 100.0,
            b.whole_gpu.utilization.dominant * 100.0,
            unplaced(b.whole_gpu.unplaced),
            b.ffd.gpus_used,
            b.ffd.cost_per_hour,
            b.ffd.utilization.memory * 100.0,
            b.ffd.utilization.compute * 100.0,
            b.ffd.utilization.dominant * 100.0,
            unplaced(b.ffd.unplaced),
        ));
    }
    out
}

/// An earlier plan (`--current`), JSON (`--format json`) or YAML
/// (`--format yaml`): a text that opens with `{` is read as JSON, any
/// other as YAML. A problem is located at its line, column and field, as
/// every input's is.
fn read_plan(path: &std::path::Path, text: &str) -> Result<Plan, Box<gpuscale_policies::Problem>> {
    let located = |line: usize, column: usize, field: String, message: String| {
        Box::new(gpuscale_policies::Problem {
            file: path.to_path_buf(),
            position: gpuscale_policies::document::Position {
                line: line.max(1),
                column: column.max(1),
            },
            path: field,
            message: format!("not a plan: {message}"),
        })
    };
    // serde's message without its own " at line L column C".
    let bare = |m: String| match m.rfind(" at line ") {
        Some(i) => m[..i].to_string(),
        None => m,
    };
    let field = |p: &serde_path_to_error::Path| {
        let p = p.to_string();
        if p == "." { String::new() } else { p }
    };
    if text.trim_start().starts_with('{') {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let (line, column) = (e.inner().line(), e.inner().column());
            located(line, column, field(e.path()), bare(e.inner().to_string()))
        })
    } else {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let (line, column) = e
                .inner()
                .location()
                .map_or((1, 1), |l| (l.line(), l.column()));
            let message = bare(e.inner().to_string());
            let path = field(e.path());
            let message = message
                .strip_prefix(&format!("{path}: "))
                .unwrap_or(&message)
                .to_string();
            located(line, column, path, message)
        })
    }
}

/// The training gangs section of the table.
fn gangs_table(plan: &Plan) -> String {
    if plan.gangs.is_empty() {
        return String::new();
    }
    let mut out = String::from("training gangs (all workers or none):\n");
    for g in &plan.gangs {
        let placement: Vec<String> = g
            .workers
            .iter()
            .map(|w| {
                let idx: Vec<String> = w.gpus.iter().map(ToString::to_string).collect();
                format!("{}[{}]", w.node, idx.join(","))
            })
            .collect();
        let met = match (&g.topology_met, &g.domain) {
            (Some(l), Some(d)) => format!(", met: {l} {d}"),
            (Some(l), None) => format!(", met: {l}"),
            _ => String::new(),
        };
        out.push_str(&format!(
            "  {:<20} {:<9} {:<9} {}×{} {}  topology {} ({}{met})\n",
            g.name,
            format!("{:?}", g.status).to_lowercase(),
            format!("{:?}", g.priority).to_lowercase(),
            g.workers_wanted,
            g.gpus_per_worker,
            g.gpu_model.as_deref().unwrap_or("GPUs"),
            g.topology,
            format!("{:?}", g.topology_mode).to_lowercase(),
        ));
        if !placement.is_empty() {
            out.push_str(&format!("    on {}\n", placement.join(" ")));
        }
        out.push_str(&format!("    {}\n", g.reason));
        for p in &g.preempts {
            let what = match p.kind {
                gang::VictimKind::Job => format!(
                    "job `{}` ({} GPUs, {:.1} GPU-hours lost)",
                    p.name, p.count, p.lost_gpu_hours
                ),
                gang::VictimKind::Replicas => {
                    format!("{} replicas of `{}`", p.count, p.name)
                }
            };
            out.push_str(&format!("    preempts {what}: {}\n", p.reason));
        }
    }
    if let Some(t) = &plan.training {
        out.push_str(&format!(
            "training holds {} GPUs; free for training {} ({} whole node{}, at most {} on one node), fragmentation {:.0} %\n",
            t.gpus,
            t.free_gpus,
            t.free_whole_nodes,
            if t.free_whole_nodes == 1 { "" } else { "s" },
            t.largest_free_node,
            t.fragmentation * 100.0
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_an_earlier_emit_listed_and_this_one_lacks_are_stale() {
        let now: BTreeSet<&str> = ["a.yaml", "variants/x.yaml"].into_iter().collect();
        let earlier = "a.yaml\nvariants/x.yaml\nvariants/gone.yaml\ngangs/j.yaml\n\n";
        assert_eq!(
            stale(earlier, &now),
            vec!["variants/gone.yaml".to_string(), "gangs/j.yaml".to_string()]
        );
        // Nothing outside the folder, however the list was edited.
        let edited = "../etc/passwd\n/etc/passwd\nvariants/../../x\nok.yaml";
        assert_eq!(stale(edited, &now), vec!["ok.yaml".to_string()]);
        assert!(stale("", &now).is_empty());
    }
}
