//! The packer report: for each cluster size, load the scenario's YAML
//! files, pack with gpuscale, run both baselines on the same input, and
//! compare with the LP bound; then the incremental case (+1 replica on a
//! packed cluster). Times are medians over `runs` runs in the same process.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use gpuscale_packer::{Mode, PackOptions, baseline, pack, pack_from};
use gpuscale_policies::load_paths;

use crate::scenario::{self, RuleSet};

/// One size's results under one rule set.
#[derive(Debug, Clone)]
pub struct Row {
    /// The sharing rules.
    pub rule_set: RuleSet,
    /// GPUs in the cluster.
    pub gpus: usize,
    /// Replicas demanded.
    pub replicas: u32,
    /// GPUs gpuscale uses.
    pub gpuscale_gpus: u32,
    /// ⌈LP bound⌉ on GPUs.
    pub lp_gpus: u32,
    /// Whether the baselines ran for this row (they follow today's rules,
    /// so they run once per size).
    pub baselines: bool,
    /// FFD's GPUs.
    pub ffd_gpus: u32,
    /// Whole-GPU baseline's GPUs.
    pub whole_gpus: u32,
    /// Memory utilisation: gpuscale, FFD, whole.
    pub memory: [f64; 3],
    /// gpuscale's compute and dominant utilisation (the dominant share:
    /// per GPU in use, the larger of its memory and compute fractions,
    /// averaged).
    pub compute_dominant: (f64, f64),
    /// The most memory utilisation any plan under the same rules can reach:
    /// Σ replica memory ÷ the LP bound on usable memory in use.
    pub memory_ceiling: f64,
    /// Pools (GPU models) whose GPUs used equal ⌈GPUs in the cost LP⌉, and
    /// pools in all.
    pub pools_at_lp: (usize, usize),
    /// GPUs used above ⌈LP⌉, summed over the pools.
    pub pool_excess: u32,
    /// Cost per hour: gpuscale, LP bound, FFD, whole.
    pub cost: [f64; 4],
    /// Replicas unplaced: gpuscale, FFD, whole.
    pub unplaced: [u32; 3],
    /// Whether HiGHS proved optimality.
    pub optimal: bool,
    /// Median ms: load, pack, end to end, FFD.
    pub ms: [f64; 4],
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Writes a scenario into `dir` and returns its paths.
pub fn write_scenario(
    dir: &Path,
    gpus: u32,
    models: usize,
    fill: f64,
    rules: RuleSet,
) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let zoo = scenario::load_zoo(&scenario::default_zoo_path())?;
    let ms = scenario::models(&zoo, models);
    let d = scenario::demand(&ms, gpus, fill);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut paths = Vec::new();
    for (name, text) in scenario::files(gpus, &ms, &d, rules) {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        paths.push(p);
    }
    Ok(paths)
}

/// What every run of the report shares.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Where scenario files are written.
    pub dir: std::path::PathBuf,
    /// Models in the zoo mix.
    pub models: usize,
    /// Demand as the share of the cluster the whole-GPU baseline would take.
    pub fill: f64,
    /// Runs per measurement (times are medians).
    pub runs: usize,
    /// Packer options.
    pub options: PackOptions,
    /// The rule set of the incremental case.
    pub incremental_rules: RuleSet,
}

impl Setup {
    /// Writes the scenario of `gpus` GPUs under `dir/name`.
    fn scenario(
        &self,
        name: &str,
        gpus: u32,
        rules: RuleSet,
    ) -> anyhow::Result<Vec<std::path::PathBuf>> {
        write_scenario(&self.dir.join(name), gpus, self.models, self.fill, rules)
    }
}

/// Runs one size under one rule set; the baselines only when asked (they
/// follow today's rules whatever the rule set).
pub fn run_size(setup: &Setup, gpus: u32, rules: RuleSet, baselines: bool) -> anyhow::Result<Row> {
    let (runs, options) = (setup.runs, &setup.options);
    let paths = setup.scenario(&format!("gpus-{gpus}-{}", rules.name()), gpus, rules)?;
    let (mut load, mut solve, mut total, mut ffd_ms) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..runs.max(1) {
        let t0 = Instant::now();
        let bundle = load_paths(&paths).map_err(|p| anyhow::anyhow!("{p}"))?;
        let t1 = Instant::now();
        let cluster = bundle.cluster.clone().context("scenario has a cluster")?;
        let demand = bundle.demand.clone().unwrap_or_default();
        let plan = pack(&cluster, &bundle.models, &demand, options)?;
        let t2 = Instant::now();
        let ffd = baselines.then(|| baseline::ffd(&cluster, &bundle.models, &demand, options));
        let t3 = Instant::now();
        load.push((t1 - t0).as_secs_f64() * 1e3);
        solve.push((t2 - t1).as_secs_f64() * 1e3);
        total.push((t2 - t0).as_secs_f64() * 1e3);
        ffd_ms.push((t3 - t2).as_secs_f64() * 1e3);
        last = Some((bundle, cluster, demand, plan, ffd));
    }
    let (bundle, cluster, demand, plan, ffd) = last.expect("at least one run");
    let whole = baselines.then(|| baseline::whole_gpu(&cluster, &bundle.models, &demand));
    let none = gpuscale_packer::plan::BaselineFigures {
        gpus_used: 0,
        cost_per_hour: 0.0,
        utilization: Default::default(),
        unplaced: 0,
    };
    let (ffd, whole) = (ffd.unwrap_or_else(|| none.clone()), whole.unwrap_or(none));
    let memory_ceiling = memory_ceiling(&cluster, &bundle.models, &demand)?;
    let pools: Vec<_> = plan.pools.iter().filter(|p| p.gpus > 0).collect();
    let ceil = |x: f64| (x - 1e-6).ceil().max(0.0) as u32;
    Ok(Row {
        rule_set: rules,
        baselines,
        memory_ceiling,
        pools_at_lp: (
            pools
                .iter()
                .filter(|p| p.gpus_used == ceil(p.lp_gpus))
                .count(),
            pools.len(),
        ),
        pool_excess: pools
            .iter()
            .map(|p| p.gpus_used.saturating_sub(ceil(p.lp_gpus)))
            .sum(),
        gpus: cluster.gpu_count(),
        replicas: demand.values().sum(),
        gpuscale_gpus: plan.gpus_used,
        lp_gpus: plan.lp_bound_gpus,
        ffd_gpus: ffd.gpus_used,
        whole_gpus: whole.gpus_used,
        memory: [
            plan.utilization.memory,
            ffd.utilization.memory,
            whole.utilization.memory,
        ],
        compute_dominant: (plan.utilization.compute, plan.utilization.dominant),
        cost: [
            plan.cost_per_hour,
            plan.lp_bound_cost,
            ffd.cost_per_hour,
            whole.cost_per_hour,
        ],
        unplaced: [
            plan.unplaced.iter().map(|u| u.replicas).sum(),
            ffd.unplaced,
            whole.unplaced,
        ],
        optimal: plan.optimal,
        ms: [median(load), median(solve), median(total), median(ffd_ms)],
    })
}

/// The ceiling on memory utilisation under the packer's rules: price every
/// GPU at its usable memory, so the cost LP bound becomes the least usable
/// memory any plan placing the whole demand keeps in use.
fn memory_ceiling(
    cluster: &gpuscale_policies::Cluster,
    models: &[gpuscale_policies::Model],
    demand: &BTreeMap<String, u32>,
) -> anyhow::Result<f64> {
    let mut by_memory = cluster.clone();
    let repriced: Vec<_> = by_memory
        .catalog
        .models()
        .map(|gpu| gpuscale_policies::catalog::GpuModel {
            price_per_hour: gpu.usable_gib,
            ..gpu.clone()
        })
        .collect();
    for gpu in repriced {
        by_memory.catalog.insert(gpu);
    }
    // Only the LP bound is read: any gap will do.
    let options = PackOptions {
        mip_rel_gap: 1.0,
        ..PackOptions::default()
    };
    let plan = pack(&by_memory, models, demand, &options)?;
    let wanted: f64 = models
        .iter()
        .map(|m| m.memory_gib * f64::from(demand.get(&m.name).copied().unwrap_or(0)))
        .sum();
    Ok(if plan.lp_bound_cost > 0.0 {
        wanted / plan.lp_bound_cost
    } else {
        0.0
    })
}

/// The incremental case: pack, apply, add one replica of the most popular
/// single-GPU model, re-plan.
#[derive(Debug, Clone)]
pub struct Incremental {
    /// GPUs in the cluster.
    pub gpus: usize,
    /// Median re-plan ms, carrying the first plan's bound (as the
    /// autoscaler and `plan --current` do).
    pub ms: f64,
    /// Median re-plan ms without it (the bound proven again).
    pub ms_fresh: f64,
    /// The carried bound was used (nothing generated or solved).
    pub carried: bool,
    /// Cost per hour and LP cost bound: carried re-plan, fresh re-plan,
    /// the first plan.
    pub cost_bound: [f64; 6],
    /// Replicas moved.
    pub moves: u32,
    /// GPUs reconfigured.
    pub reconfigured: u32,
    /// The model that got one more replica.
    pub model: String,
}

/// Runs the incremental case.
pub fn run_incremental(setup: &Setup, gpus: u32) -> anyhow::Result<Incremental> {
    let (runs, options) = (setup.runs, &setup.options);
    let paths = setup.scenario(
        &format!("incremental-{gpus}-{}", setup.incremental_rules.name()),
        gpus,
        setup.incremental_rules,
    )?;
    let bundle = load_paths(&paths).map_err(|p| anyhow::anyhow!("{p}"))?;
    let cluster = bundle.cluster.clone().context("scenario has a cluster")?;
    let demand = bundle.demand.clone().unwrap_or_default();
    let first = pack(&cluster, &bundle.models, &demand, options)?;
    let now = first.apply_to(&cluster);
    let model = bundle
        .models
        .iter()
        .filter(|m| m.tensor_parallel.contains(&1))
        .max_by_key(|m| demand.get(&m.name).copied().unwrap_or(0))
        .context("a single-GPU model")?
        .name
        .clone();
    let mut more: BTreeMap<String, u32> = demand.clone();
    *more.entry(model.clone()).or_insert(0) += 1;
    let (mut times, mut fresh) = (Vec::new(), Vec::new());
    let mut last = None;
    let mut fresh_plan = None;
    for _ in 0..runs.max(1) {
        let t = Instant::now();
        let plan = pack_from(&now, &bundle.models, &more, options, first.basis.as_ref())?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let again = pack(&now, &bundle.models, &more, options)?;
        fresh.push(t.elapsed().as_secs_f64() * 1e3);
        last = Some(plan);
        fresh_plan = Some(again);
    }
    let plan = last.expect("at least one run");
    let carried = plan.basis == first.basis && first.basis.is_some();
    let again = fresh_plan.expect("at least one run");
    debug_assert!(
        plan.gpus
            .iter()
            .all(|g| g.mode != Mode::Idle || g.replicas.is_empty())
    );
    Ok(Incremental {
        gpus: cluster.gpu_count(),
        ms: median(times),
        ms_fresh: median(fresh),
        carried,
        cost_bound: [
            plan.cost_per_hour,
            plan.lp_bound_cost,
            again.cost_per_hour,
            again.lp_bound_cost,
            first.cost_per_hour,
            first.lp_bound_cost,
        ],
        moves: plan.moves,
        reconfigured: plan.reconfigured_gpus,
        model,
    })
}

/// The report as Markdown.
pub fn markdown(rows: &[Row], incremental: Option<&Incremental>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| GPUs | rule set | replicas | gpuscale GPUs | ⌈LP⌉ | FFD | whole-GPU | gpuscale ÷ FFD | gpuscale ÷ whole | memory util (gpuscale / FFD / whole) | gpuscale compute / dominant util | memory ceiling (LP) | pools at ⌈LP⌉ (excess GPUs) | $/h gpuscale / LP / FFD / whole | cost ÷ LP bound | unplaced (gpuscale / FFD / whole) | optimal | load ms | pack ms | end-to-end ms | FFD ms |"
    );
    let _ = writeln!(
        out,
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---|---:|---|---|---:|---:|---:|---:|"
    );
    for r in rows {
        let b = |text: String| if r.baselines { text } else { "—".to_string() };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} % / {} | {:.1} % / {:.1} % | {:.1} % | {} of {} ({}) | {:.0} / {:.0} / {} | {:.4} | {} / {} | {} | {:.0} | {:.0} | {:.0} | {} |",
            r.gpus,
            r.rule_set.name(),
            r.replicas,
            r.gpuscale_gpus,
            r.lp_gpus,
            b(r.ffd_gpus.to_string()),
            b(r.whole_gpus.to_string()),
            b(format!(
                "{:.2}",
                f64::from(r.gpuscale_gpus) / f64::from(r.ffd_gpus.max(1))
            )),
            b(format!(
                "{:.2}",
                f64::from(r.gpuscale_gpus) / f64::from(r.whole_gpus.max(1))
            )),
            r.memory[0] * 100.0,
            b(format!(
                "{:.1} % / {:.1} %",
                r.memory[1] * 100.0,
                r.memory[2] * 100.0
            )),
            r.compute_dominant.0 * 100.0,
            r.compute_dominant.1 * 100.0,
            r.memory_ceiling * 100.0,
            r.pools_at_lp.0,
            r.pools_at_lp.1,
            r.pool_excess,
            r.cost[0],
            r.cost[1],
            b(format!("{:.0} / {:.0}", r.cost[2], r.cost[3])),
            if r.cost[1] > 0.0 {
                r.cost[0] / r.cost[1]
            } else {
                1.0
            },
            r.unplaced[0],
            b(format!("{} / {}", r.unplaced[1], r.unplaced[2])),
            if r.optimal { "yes" } else { "limit" },
            r.ms[0],
            r.ms[1],
            r.ms[2],
            b(format!("{:.0}", r.ms[3])),
        );
    }
    if let Some(i) = incremental {
        let _ = writeln!(
            out,
            "\nIncremental: +1 replica of `{}` on the packed {}-GPU cluster: re-plan {:.1} ms (median) carrying the first plan's bound ({}), {:.0} ms proving it again; {} replicas moved, {} GPUs reconfigured.",
            i.model,
            i.gpus,
            i.ms,
            if i.carried {
                "added on top, nothing solved"
            } else {
                "not admitted: solved in full"
            },
            i.ms_fresh,
            i.moves,
            i.reconfigured
        );
        let _ = writeln!(
            out,
            "Cost over its LP bound: ${:.2}/h over ${:.2}/h carried, ${:.2}/h over ${:.2}/h proven again (the first plan: ${:.2}/h over ${:.2}/h).",
            i.cost_bound[0],
            i.cost_bound[1],
            i.cost_bound[2],
            i.cost_bound[3],
            i.cost_bound[4],
            i.cost_bound[5]
        );
    }
    out
}

/// One row of `packer-report --json`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JsonRow {
    /// GPUs in the cluster.
    pub gpus: usize,
    /// Replicas demanded.
    pub replicas: u32,
    /// The sharing rules (`mig-whole`, `fractional`, `mps`, `all`).
    pub rule_set: &'static str,
    /// GPUs gpuscale uses.
    pub gpus_used: u32,
    /// Cost per hour of gpuscale's plan.
    pub cost: f64,
    /// The LP bound on cost per hour.
    pub lp_cost_bound: f64,
    /// gpuscale's utilisation of the GPUs in use.
    pub utilization: JsonUtilization,
    /// The LP bound on memory utilisation under the same rules.
    pub ceiling_memory: f64,
    /// Median pack time, ms.
    pub pack_ms: f64,
    /// Median load + pack, ms.
    pub end_to_end_ms: f64,
}

/// Memory, compute and dominant utilisation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct JsonUtilization {
    /// Σ replica memory ÷ Σ usable memory.
    pub memory: f64,
    /// Σ replica compute ÷ Σ compute.
    pub compute: f64,
    /// Mean over GPUs in use of the larger of the two fractions.
    pub dominant: f64,
}

/// The rows as `packer-report --json` writes them.
pub fn json_rows(rows: &[Row]) -> Vec<JsonRow> {
    rows.iter()
        .map(|r| JsonRow {
            gpus: r.gpus,
            replicas: r.replicas,
            rule_set: r.rule_set.name(),
            gpus_used: r.gpuscale_gpus,
            cost: r.cost[0],
            lp_cost_bound: r.cost[1],
            utilization: JsonUtilization {
                memory: r.memory[0],
                compute: r.compute_dominant.0,
                dominant: r.compute_dominant.1,
            },
            ceiling_memory: r.memory_ceiling,
            pack_ms: r.ms[1],
            end_to_end_ms: r.ms[2],
        })
        .collect()
}

#[cfg(test)]
mod json_tests {
    use super::*;

    #[test]
    fn json_rows_carry_the_documented_fields() {
        let row = Row {
            rule_set: RuleSet::MigWhole,
            baselines: true,
            gpus: 108,
            replicas: 100,
            gpuscale_gpus: 39,
            lp_gpus: 32,
            ffd_gpus: 62,
            whole_gpus: 108,
            memory: [0.66, 0.47, 0.21],
            compute_dominant: (0.64, 0.83),
            memory_ceiling: 0.70,
            pools_at_lp: (2, 6),
            pool_excess: 3,
            cost: [85.8, 84.5, 120.0, 271.0],
            unplaced: [0, 0, 9],
            optimal: true,
            ms: [39.0, 12.0, 51.0, 3.0],
        };
        let v = serde_json::to_value(json_rows(&[row])).unwrap();
        assert_eq!(
            v,
            serde_json::json!([{
                "gpus": 108, "replicas": 100, "rule_set": "mig-whole", "gpus_used": 39,
                "cost": 85.8, "lp_cost_bound": 84.5,
                "utilization": {"memory": 0.66, "compute": 0.64, "dominant": 0.83},
                "ceiling_memory": 0.70, "pack_ms": 12.0, "end_to_end_ms": 51.0
            }])
        );
    }
}
