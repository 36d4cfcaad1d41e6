//! A whole simulation: the scenario's arrivals once, then every
//! autoscaler with every placement over them, into a [`Report`].

use std::collections::BTreeMap;

use gpuscale_packer::PackOptions;

use crate::arrivals::generate;
use crate::control::{
    Autoscaler, Gpuscale, Hpa, HpaSettings, Keda, KedaSettings, Kpa, KpaSettings, Static,
};
use crate::engine::{Onset, Setup, run};
use crate::placement::{PackerPlacer, Placer, WholeGpuPlacer};
use crate::report::{Curves, Figures, Report};
use crate::scenario::{PlacementKind, PolicyKind, Scenario};

/// The runs a simulation makes, in order: (autoscaler, placement).
pub fn runs(scenario: &Scenario) -> Vec<(PolicyKind, PlacementKind)> {
    let mut out = Vec::new();
    for &p in &scenario.spec.compare {
        for &pl in &scenario.spec.placements {
            if !out.contains(&(p, pl)) {
                out.push((p, pl));
            }
        }
    }
    out
}

/// Replicas per model to carry the arrivals of `[from, to)` seconds at
/// their busiest minute (or their mean rate over a shorter span): the
/// arrival rate times the mean service time at `speed(model)` (Little's
/// law), over the policy's per-replica target, within its bounds (at
/// least one).
pub fn counts_for(
    scenario: &Scenario,
    arrivals: &[crate::arrivals::Arrival],
    from: f64,
    to: f64,
    speed: &dyn Fn(&gpuscale_policies::Model) -> f64,
) -> BTreeMap<String, u32> {
    let models = &scenario.models;
    // Each workload's service profile at its model's speed, worked out
    // once (not per arrival: a day of the fleet has 42 million).
    let profiles: Vec<_> = {
        let speeds: Vec<f64> = models.iter().map(|m| speed(m).max(1e-6)).collect();
        scenario
            .services
            .iter()
            .zip(&scenario.workload_models)
            .map(|(service, &mi)| {
                let mut profile = service.clone();
                profile.speed = speeds[mi];
                profile
            })
            .collect()
    };
    let targets: Vec<u32> = models
        .iter()
        .map(|m| m.scaling.target_queue_depth.max(1.0).ceil() as u32)
        .collect();
    let mut per_minute: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); models.len()];
    let mut work = vec![0.0; models.len()];
    let mut n = vec![0u64; models.len()];
    // Arrivals are in time order: the span is one slice of them.
    let first = arrivals.partition_point(|a| a.at < from);
    let last = arrivals.partition_point(|a| a.at < to);
    for a in &arrivals[first..last.max(first)] {
        let w = a.workload as usize;
        let mi = scenario.workload_models[w];
        *per_minute[mi]
            .entry(((a.at - from) / 60.0) as u64)
            .or_default() += 1;
        work[mi] += profiles[w]
            .service(a.prompt, a.output, targets[mi])
            .0
            .as_secs_f64();
        n[mi] += 1;
    }
    let window = (to - from).clamp(1.0, 60.0);
    models
        .iter()
        .enumerate()
        .map(|(mi, m)| {
            let rate = per_minute[mi].values().copied().max().unwrap_or(0) as f64 / window;
            let mean = if n[mi] > 0 {
                work[mi] / n[mi] as f64
            } else {
                0.0
            };
            let want = (rate * mean / m.scaling.target_queue_depth - 1e-9)
                .ceil()
                .max(0.0) as u32;
            let lo = m.scaling.min_replicas.max(1);
            (
                m.name.clone(),
                want.clamp(lo, m.scaling.max_replicas.max(lo)),
            )
        })
        .collect()
}

/// The speed a model's replicas run at under a placement, for sizing:
/// with whole GPUs, the first GPU model and degree that hold it (as
/// [`crate::placement::WholeGpuPlacer`] picks); with the packer, its
/// declared compute (the least share the packer gives it).
pub fn sizing_speed(
    scenario: &Scenario,
    placement: PlacementKind,
    m: &gpuscale_policies::Model,
) -> f64 {
    match placement {
        PlacementKind::Packer => m.compute,
        PlacementKind::WholeGpu => {
            crate::placement::WholeGpuPlacer::new(&scenario.cluster, std::slice::from_ref(m))
                .speed_of(&m.name)
                .unwrap_or(1.0)
        }
    }
}

/// The mean queue wait (seconds) of the scenario's first autoscaler and
/// placement: for checks against queueing theory.
pub fn mean_queue_wait(scenario: &Scenario) -> f64 {
    let mut only = scenario.clone();
    let first = runs(scenario)[0];
    only.spec.compare = vec![first.0];
    only.spec.placements = vec![first.1];
    let mut wait = 0.0;
    simulate_with(&only, 1, &mut |_, _, _| {}, &mut |o| {
        wait = o.queue_wait.mean().unwrap_or(0.0)
    });
    wait
}

/// Runs the scenario, its runs on as many threads as the machine has
/// cores. `progress` is told after each run: (done, of, run name).
pub fn simulate(scenario: &Scenario, progress: &mut dyn FnMut(usize, usize, &str)) -> Report {
    simulate_on(scenario, default_jobs(), progress)
}

/// The machine's cores (1 when unknown).
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// [`simulate`] on `jobs` threads (the report is the same for any count).
pub fn simulate_on(
    scenario: &Scenario,
    jobs: usize,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Report {
    simulate_with(scenario, jobs, progress, &mut |_| {})
}

fn simulate_with(
    scenario: &Scenario,
    jobs: usize,
    progress: &mut dyn FnMut(usize, usize, &str),
    each: &mut dyn FnMut(&crate::engine::Outcome),
) -> Report {
    let spec = &scenario.spec;
    let duration = spec.duration.as_secs_f64();
    let arrivals = generate(&scenario.workloads, duration, spec.seed);
    let onsets: Vec<Onset> = scenario
        .workloads
        .iter()
        .enumerate()
        .flat_map(|(w, wl)| {
            let m = scenario.workload_models[w];
            let arrivals = &arrivals;
            wl.shape
                .steps
                .iter()
                .filter(|s| s.factor > 1.0)
                .filter_map(move |s| {
                    // Arrivals are sorted by time: the first of this
                    // workload at or after the step, within the step.
                    let from = arrivals.partition_point(|a| a.at < s.at);
                    let first = arrivals[from..]
                        .iter()
                        .find(|a| a.workload as usize == w)?
                        .at;
                    (first < s.at + s.length).then_some(Onset {
                        model: m,
                        step: s.at,
                        first_request: first,
                    })
                })
        })
        .collect();
    let end = duration.max(1.0);
    let sized = |placement: PlacementKind, to: f64| {
        counts_for(scenario, &arrivals, 0.0, to, &|m| {
            sizing_speed(scenario, placement, m)
        })
    };
    let peaks: BTreeMap<PlacementKind, BTreeMap<String, u32>> = spec
        .placements
        .iter()
        .map(|&p| (p, sized(p, end)))
        .collect();
    let models = &scenario.models;
    let series_step = (duration / 720.0).max(1.0).round();
    let options = PackOptions {
        time_limit: spec.pack_time_limit,
        improve_limit: spec.pack_improve_limit,
        ..PackOptions::default()
    };
    let hpa = HpaSettings::default();
    let keda = KedaSettings::default();
    let kpa = KpaSettings::default();
    let plan = runs(scenario);
    // One run: its autoscaler and placer over the shared arrivals.
    let one = |policy: PolicyKind, placement: PlacementKind| -> crate::engine::Outcome {
        // Every autoscaler starts warm, with what the first minute's
        // arrivals need: the comparison is of how each follows the load,
        // not of a cold start they would all share.
        let start = sized(placement, end.min(60.0));
        let initial: BTreeMap<String, u32> = models
            .iter()
            .map(|m| {
                let n = match policy {
                    PolicyKind::StaticPeak => peaks[&placement][&m.name],
                    _ => start[&m.name].max(m.scaling.min_replicas),
                };
                (m.name.clone(), n)
            })
            .collect();
        let mut autoscaler: Box<dyn Autoscaler> = match policy {
            PolicyKind::Gpuscale => {
                Box::new(Gpuscale::new(models, spec.tick, &initial).on_pushes(spec.decide_on_push))
            }
            PolicyKind::Hpa => Box::new(Hpa::new(models, hpa.clone())),
            PolicyKind::Keda => Box::new(Keda::new(models, hpa.clone(), keda.clone())),
            PolicyKind::Knative => Box::new(Kpa::new(models, kpa.clone())),
            PolicyKind::StaticPeak => Box::new(Static::new(peaks[&placement].clone())),
        };
        let mut placer: Box<dyn Placer> = match placement {
            PlacementKind::Packer => Box::new(
                PackerPlacer::new(
                    scenario.cluster.clone(),
                    models.clone(),
                    options.clone(),
                    spec.consolidate_every,
                )
                .with_spares(spec.spares),
            ),
            PlacementKind::WholeGpu => Box::new(WholeGpuPlacer::new(&scenario.cluster, models)),
        };
        let setup = Setup {
            models,
            workload_models: &scenario.workload_models,
            services: &scenario.services,
            priorities: &scenario.priorities,
            arrivals: &arrivals,
            duration,
            max_queue: spec.gateway.max_queue,
            queue_timeout: spec.gateway.queue_timeout.as_secs_f64(),
            queue_order: spec.gateway.order,
            newest_first_after: spec.gateway.newest_first_after,
            scrape: spec.gateway.scrape_server_metrics,
            cold_start: &spec.cold_start,
            onsets: &onsets,
            series_step,
            initial: &initial,
        };
        run(&setup, autoscaler.as_mut(), placer.as_mut())
    };
    // Runs are independent: `jobs` threads take them in order; each
    // run's outcome depends on its inputs alone, so the report does not
    // depend on the number of threads.
    let mut outcomes: Vec<Option<crate::engine::Outcome>> = plan.iter().map(|_| None).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..jobs.clamp(1, plan.len().max(1)) {
            let tx = tx.clone();
            let (next, plan, one) = (&next, &plan, &one);
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&(policy, placement)) = plan.get(i) else {
                        break;
                    };
                    if tx.send((i, one(policy, placement))).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for (done, (i, outcome)) in rx.iter().enumerate() {
            let (policy, placement) = plan[i];
            progress(
                done + 1,
                plan.len(),
                &format!("{}/{}", policy.name(), placement.name()),
            );
            outcomes[i] = Some(outcome);
        }
    });
    let mut figures = Vec::new();
    let mut curves = Vec::new();
    for (&(policy, placement), outcome) in plan.iter().zip(outcomes) {
        let Some(outcome) = outcome else {
            continue;
        };
        each(&outcome);
        let name = format!("{}/{}", policy.name(), placement.name());
        figures.push(Figures::of(policy.name(), placement.name(), &outcome));
        curves.push(Curves {
            run: name,
            series: outcome.series.clone(),
            latency_cdf: outcome.latency.cdf(60),
        });
    }
    let mut policies = BTreeMap::new();
    for &p in &spec.compare {
        let preferred = if p == PolicyKind::Gpuscale {
            PlacementKind::Packer
        } else {
            PlacementKind::WholeGpu
        };
        let pick = figures
            .iter()
            .find(|f| f.policy == p.name() && f.placement == preferred.name())
            .or_else(|| figures.iter().find(|f| f.policy == p.name()));
        if let Some(f) = pick {
            policies.insert(p.name().to_string(), f.clone());
        }
    }
    let mut settings = BTreeMap::new();
    settings.insert(
        "gpuscale".into(),
        format!("recommend() per model every {}{} with the default tuning; the packer re-plans on every change (time limit {}, improvement {}), {}{}", show(spec.tick), if spec.decide_on_push { " and on the gateway's pushes (every arrival, at most every 100 ms)" } else { " (not on the gateway's pushes: decideOnPush false)" }, show(spec.pack_time_limit), show(spec.pack_improve_limit), if spec.consolidate_every.is_zero() { "free to move running replicas at every re-plan (consolidateEvery 0s)".to_string() } else { format!("moving running replicas at most once per {} (consolidateEvery) and keeping them in place otherwise", show(spec.consolidate_every)) }, if spec.spares { "; spare replicas in the room its GPUs in use leave idle (fractional, MPS, empty MIG instances), for every autoscaler on the packer" } else { "; no spare replicas (spares: false)" }),
    );
    settings.insert(
        "hpa".into(),
        format!(
            "External metric, AverageValue = targetQueueDepth (gateway in flight + waiting per replica); sync {}, tolerance {}, scrape every {} read {} later; up: max({} %, {} pods) per {}, window {}; down: {} % per {}, window {}; minReplicas ≥ 1",
            show(hpa.sync), hpa.tolerance, show(hpa.scrape), show(hpa.lag), hpa.up_percent, hpa.up_pods, show(hpa.up_period), show(hpa.up_window), hpa.down_percent, show(hpa.down_period), show(hpa.down_window)
        ),
    );
    settings.insert(
        "keda".into(),
        format!(
            "the HPA above; pollingInterval {}, activation above activationQueueDepth, cooldownPeriod {}, to zero where minReplicas is 0",
            show(keda.polling), show(keda.cooldown)
        ),
    );
    settings.insert(
        "knative".into(),
        format!(
            "KPA: stable window {}, panic window {}, panic threshold {} %, target {} × maxConcurrency per replica, scale-up rate ≤ {}×, down ≤ {}× per {} tick, to zero after {} grace; the activator wakes a model at zero on its first request",
            show(kpa.stable_window), show(kpa.panic_window), kpa.panic_threshold * 100.0, kpa.target_utilization, kpa.max_scale_up_rate, kpa.max_scale_down_rate, show(kpa.tick), show(kpa.scale_to_zero_grace)
        ),
    );
    settings.insert(
        "static-peak".into(),
        format!(
            "fixed replicas per model: the busiest minute's arrival rate × mean service time ÷ targetQueueDepth, at the speed of the model's whole GPU (whole-gpu) or of its declared compute (packer): {}",
            peaks
                .iter()
                .map(|(p, c)| format!(
                    "{}: {}",
                    p.name(),
                    c.iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    );
    settings.insert(
        "start".into(),
        "every autoscaler starts warm with the replicas the first minute's arrivals need (Little's law at the placement's sizing speed, within each policy's bounds)".into(),
    );
    settings.insert(
        "gateway".into(),
        format!(
            "queue ≤ {} per model (429 beyond, lower priority displaced first), 503 after {:?} waiting; {}; {}",
            spec.gateway.max_queue,
            spec.gateway.queue_timeout,
            match spec.gateway.order {
                gpuscale_gateway::config::QueueOrder::Adaptive => format!(
                    "each priority class served oldest first, newest first while its oldest waiter is past the model's queueWaitP95, else its ttftP95, else {:?} (adaptive LIFO)",
                    spec.gateway.newest_first_after
                ),
                gpuscale_gateway::config::QueueOrder::Fifo => "each priority class served oldest first".into(),
            },
            if spec.gateway.scrape_server_metrics {
                "replicas' vLLM metrics scraped every tick (prefill waiting and prefill seconds)"
            } else {
                "replicas' metrics not scraped"
            }
        ),
    );
    settings.insert(
        "cold start".into(),
        format!(
            "image pull {:?} {} + replica memory at {} GiB/s",
            spec.cold_start.image_pull,
            if spec.cold_start.image_cache {
                "once per node (the kubelet keeps it)"
            } else {
                "at every start"
            },
            spec.cold_start.load_gib_per_second
        ),
    );
    Report {
        scenario: scenario.name.clone(),
        seed: spec.seed,
        duration_s: duration,
        requests: arrivals.len() as u64,
        cluster_gpus: scenario.cluster.gpu_count(),
        settings,
        policies,
        runs: figures,
        curves,
    }
}

/// A setting's duration as people write it (`0s`, not `0ns`).
fn show(d: std::time::Duration) -> String {
    if d.is_zero() {
        "0s".into()
    } else {
        format!("{d:?}")
    }
}
