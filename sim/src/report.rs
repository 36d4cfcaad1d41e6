//! What a simulation reports: the figures of every run (autoscaler ×
//! placement) in `report.json`, and `report.md` tying them together.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::engine::{Outcome, Point};

/// One model's figures in a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelFigures {
    /// Requests that arrived.
    pub requests: u64,
    /// Share served within every SLO target (rejections count as misses);
    /// `None` (null) for a model no request reached.
    pub slo_attainment: Option<f64>,
    /// Answered 429 or 503.
    pub rejected: u64,
    /// End-to-end p95, seconds.
    pub p95_latency_s: Option<f64>,
}

/// One run's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    /// The autoscaler.
    pub policy: String,
    /// The placement.
    pub placement: String,
    /// Requests that arrived.
    pub requests: u64,
    /// Served.
    pub completed: u64,
    /// Answered 429 (queue full) or 503 (queue timeout).
    pub rejected: u64,
    /// Of those, 429.
    pub rejected_429: u64,
    /// Of those, 503.
    pub timed_out_503: u64,
    /// Share of requests served within every SLO target of their model
    /// (`null` when none arrived).
    pub slo_attainment: Option<f64>,
    /// The same over the models whose SLO declares no cold-start
    /// allowance (the hot ones, when some declare one).
    pub slo_attainment_hot: Option<f64>,
    /// The same over the models that declare a cold-start allowance
    /// (their requests that found no replica serving are judged with it
    /// added); none when no model declares one.
    pub slo_attainment_cold: Option<f64>,
    /// End-to-end latency (arrival to last token) quantiles, seconds.
    pub p50_latency_s: Option<f64>,
    /// p95.
    pub p95_latency_s: Option<f64>,
    /// p99.
    pub p99_latency_s: Option<f64>,
    /// Time to first token (from arrival) quantiles, seconds.
    pub p50_ttft_s: Option<f64>,
    /// p95.
    pub p95_ttft_s: Option<f64>,
    /// p99.
    pub p99_ttft_s: Option<f64>,
    /// Gateway queue wait p95, seconds.
    pub p95_queue_wait_s: Option<f64>,
    /// GPU-hours of GPUs holding a replica (starting, serving or draining).
    pub gpu_hours: f64,
    /// Their cost at the catalogue's prices.
    pub cost: f64,
    /// Time-weighted memory allocated ÷ usable memory of those GPUs.
    pub utilization_memory: f64,
    /// Time-weighted compute busy ÷ compute of those GPUs (a replica's
    /// share counts busy in proportion to its batch slots in use).
    pub utilization_compute: f64,
    /// Decisions that changed a model's replica count.
    pub scale_events: u64,
    /// Replicas started (cold starts, moves included).
    pub replica_starts: u64,
    /// Of those, replicas a re-plan moved (stopped where they ran and
    /// started elsewhere, beyond their model's scale-downs).
    pub replica_moves: u64,
    /// Median seconds from a burst's onset (its first request) to the
    /// first scale-up decision.
    pub reaction_s: Option<f64>,
    /// Median seconds from a burst step's scheduled start to that decision
    /// (`reaction_s` plus the wait for the burst's first request).
    pub reaction_from_step_s: Option<f64>,
    /// Median seconds from the burst's first overload of its model
    /// (requests above `targetQueueDepth` per serving replica) to that
    /// decision: the control loop's own delay, apart from how long the
    /// arrivals take to exceed the capacity there is.
    pub reaction_from_overload_s: Option<f64>,
    /// Median seconds from a burst's onset (its first request) until that
    /// decision's replicas serve.
    pub reaction_ready_s: Option<f64>,
    /// Decisions whose counts the cluster could not hold (the placement
    /// placed fewer replicas than the autoscaler asked), and the most
    /// replicas one was short: misses then are the cluster's, not the
    /// autoscaler's.
    pub capacity_shortfalls: u64,
    /// The most replicas one such decision was short.
    pub capacity_short_most: u32,
    /// Requests that missed an SLO target of their model or were turned
    /// away (429, 503).
    pub slo_missed: u64,
    /// Of those, the ones that arrived in the first 60 s of a step burst
    /// (`null` when the scenario has no steps).
    pub slo_missed_in_steps: Option<u64>,
    /// Per model policy.
    pub models: BTreeMap<String, ModelFigures>,
}

fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    Some(v[(v.len() - 1) / 2])
}

fn share(a: u64, b: u64) -> f64 {
    if b == 0 { 1.0 } else { a as f64 / b as f64 }
}

/// Rounded to 6 significant decimals, so reports diff cleanly.
fn r6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Attainment over the models that do (`allowance`) or do not declare a
/// cold-start allowance; none when there are no such models.
fn attainment(o: &Outcome, allowance: bool) -> Option<f64> {
    let (within, requests) = o
        .models
        .values()
        .filter(|m| m.allowance == allowance)
        .fold((0, 0), |(w, n), m| (w + m.within_slo, n + m.requests));
    let any = o.models.values().any(|m| m.allowance == allowance);
    any.then(|| r6(share(within, requests)))
}

impl Figures {
    /// The figures of an outcome.
    pub fn of(policy: &str, placement: &str, o: &Outcome) -> Figures {
        let q = |h: &crate::histogram::Histogram, p: f64| h.quantile(p).map(r6);
        Figures {
            policy: policy.to_string(),
            placement: placement.to_string(),
            requests: o.requests,
            completed: o.completed,
            rejected: o.rejected_full + o.timed_out,
            rejected_429: o.rejected_full,
            timed_out_503: o.timed_out,
            slo_attainment: (o.requests > 0).then(|| r6(share(o.within_slo, o.requests))),
            slo_attainment_hot: attainment(o, false),
            slo_attainment_cold: attainment(o, true),
            p50_latency_s: q(&o.latency, 0.5),
            p95_latency_s: q(&o.latency, 0.95),
            p99_latency_s: q(&o.latency, 0.99),
            p50_ttft_s: q(&o.ttft, 0.5),
            p95_ttft_s: q(&o.ttft, 0.95),
            p99_ttft_s: q(&o.ttft, 0.99),
            p95_queue_wait_s: q(&o.queue_wait, 0.95),
            gpu_hours: r6(o.gpu_hours),
            cost: r6(o.cost),
            utilization_memory: r6(o.utilization_memory),
            utilization_compute: r6(o.utilization_compute),
            scale_events: o.scale_events,
            replica_starts: o.replica_starts,
            replica_moves: o.replica_moves,
            reaction_s: median(&o.reaction_decision).map(r6),
            reaction_from_step_s: median(&o.reaction_decision_step).map(r6),
            reaction_from_overload_s: median(&o.reaction_decision_overload).map(r6),
            reaction_ready_s: median(&o.reaction_ready).map(r6),
            capacity_shortfalls: o.capacity_shortfalls,
            capacity_short_most: o.capacity_short_most,
            slo_missed: o.missed,
            slo_missed_in_steps: o.missed_in_steps,
            models: o
                .models
                .iter()
                .map(|(k, m)| {
                    (
                        k.clone(),
                        ModelFigures {
                            requests: m.requests,
                            slo_attainment: (m.requests > 0)
                                .then(|| r6(share(m.within_slo, m.requests))),
                            rejected: m.rejected,
                            p95_latency_s: m.latency.quantile(0.95).map(r6),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// One run's curves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Curves {
    /// `<policy>/<placement>`.
    pub run: String,
    /// The time series.
    pub series: Vec<Point>,
    /// End-to-end latency CDF: (seconds, fraction at or below).
    pub latency_cdf: Vec<(f64, f64)>,
}

/// The whole report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Seed.
    pub seed: u64,
    /// Simulated seconds.
    pub duration_s: f64,
    /// Requests in the scenario.
    pub requests: u64,
    /// GPUs in the cluster.
    pub cluster_gpus: usize,
    /// The settings each autoscaler ran with, in words.
    pub settings: BTreeMap<String, String>,
    /// Each autoscaler's headline run: gpuscale with its packer, the
    /// others with whole GPUs (what they run with today) when simulated.
    pub policies: BTreeMap<String, Figures>,
    /// Every run.
    pub runs: Vec<Figures>,
    /// Curves of every run.
    pub curves: Vec<Curves>,
}

fn opt(x: Option<f64>) -> String {
    match x {
        None => "–".to_string(),
        // The histogram's last bucket holds everything longer.
        Some(v) if v >= crate::histogram::top() * (1.0 - 1e-9) => format!("≥ {v:.0}"),
        Some(v) => format!("{v:.2}"),
    }
}

/// Seconds as written: whole seconds without decimals, others with up to
/// three.
fn seconds(x: f64) -> String {
    let r = (x * 1000.0).round() / 1000.0;
    if r.fract() == 0.0 {
        format!("{r:.0}")
    } else {
        format!("{r}")
    }
}

impl Report {
    /// `report.md`: the figures in a table, the settings, and the plots
    /// (`plots` lists the image files written beside it).
    pub fn markdown(&self, plots: &[(String, String)]) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# Simulation: {}\n", self.scenario);
        let _ = writeln!(
            s,
            "{} requests over {} s on {} GPUs, seed {}.\n",
            self.requests,
            seconds(self.duration_s),
            self.cluster_gpus,
            self.seed
        );
        let _ = writeln!(
            s,
            "| autoscaler | placement | SLO attainment | GPU-hours | cost | mem. util. | compute util. | p95 latency s | p95 TTFT s | rejected | scale events | replica starts (moved) | reaction s (decision / ready; decision from the step / from the overload) |"
        );
        let _ = writeln!(
            s,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        for f in &self.runs {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.2} | ${:.2} | {:.1} % | {:.1} % | {} | {} | {} | {} | {} ({}) | {} / {}; {} / {} |",
                f.policy,
                f.placement,
                f.slo_attainment
                    .map_or("– (no requests)".to_string(), |a| format!(
                        "{:.2} %",
                        a * 100.0
                    )),
                f.gpu_hours,
                f.cost,
                f.utilization_memory * 100.0,
                f.utilization_compute * 100.0,
                opt(f.p95_latency_s),
                opt(f.p95_ttft_s),
                f.rejected,
                f.scale_events,
                f.replica_starts,
                f.replica_moves,
                opt(f.reaction_s),
                opt(f.reaction_ready_s),
                opt(f.reaction_from_step_s),
                opt(f.reaction_from_overload_s),
            );
        }
        if self.runs.iter().any(|f| f.slo_attainment_cold.is_some()) {
            let _ = writeln!(
                s,
                "\nSLO attainment of the models with no cold-start allowance (hot) and of those that declare one (cold, judged with it on requests that found no replica serving):\n"
            );
            let _ = writeln!(
                s,
                "| autoscaler | placement | hot | cold |\n|---|---|---:|---:|"
            );
            let pct = |x: Option<f64>| x.map_or("–".into(), |v| format!("{:.2} %", v * 100.0));
            for f in &self.runs {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} |",
                    f.policy,
                    f.placement,
                    pct(f.slo_attainment_hot),
                    pct(f.slo_attainment_cold)
                );
            }
        }
        let short: Vec<&Figures> = self
            .runs
            .iter()
            .filter(|f| f.capacity_shortfalls > 0)
            .collect();
        if !short.is_empty() {
            let _ = writeln!(
                s,
                "\n**The cluster could not hold every count asked for** (its misses are partly the cluster's, not the autoscaler's):\n"
            );
            for f in short {
                let _ = writeln!(
                    s,
                    "- {}/{}: {} decision{} placed fewer replicas than asked, at most {} short",
                    f.policy,
                    f.placement,
                    f.capacity_shortfalls,
                    if f.capacity_shortfalls == 1 { "" } else { "s" },
                    f.capacity_short_most
                );
            }
        }
        if self.runs.iter().any(|f| f.slo_missed_in_steps.is_some()) {
            let _ = writeln!(
                s,
                "\n**Where the misses were**: requests that missed an SLO target or were turned away, and of them those that arrived in the first {} s of a step burst (a reactive autoscaler's reaction and a cold start; the plot *SLO misses over time* shows the rest):\n",
                seconds(crate::engine::STEP_WINDOW_S)
            );
            for f in &self.runs {
                let inside = f.slo_missed_in_steps.unwrap_or(0);
                let _ = writeln!(
                    s,
                    "- {}/{}: {} missed, {} of them ({:.1} %) in a step's first {} s",
                    f.policy,
                    f.placement,
                    f.slo_missed,
                    inside,
                    if f.slo_missed == 0 {
                        0.0
                    } else {
                        inside as f64 / f.slo_missed as f64 * 100.0
                    },
                    seconds(crate::engine::STEP_WINDOW_S)
                );
            }
        }
        let _ = writeln!(s, "\n## Settings\n");
        for (k, v) in &self.settings {
            let _ = writeln!(s, "- **{k}**: {v}");
        }
        if !plots.is_empty() {
            let _ = writeln!(s, "\n## Plots\n");
            for (title, file) in plots {
                let _ = writeln!(s, "### {title}\n\n![{title}]({file})\n");
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clamped_quantile_and_a_fractional_duration_read_as_they_are() {
        // A latency past the histogram's last bucket is "at least" it,
        // not a value; 1.5 s is not "2 s".
        let mut h = crate::histogram::Histogram::default();
        h.record(1e9);
        let p = h.quantile(0.5);
        assert!(opt(p).starts_with("≥ "), "{}", opt(p));
        assert_eq!(opt(Some(1.234)), "1.23");
        assert_eq!(seconds(1.5), "1.5");
        assert_eq!(seconds(3600.0), "3600");
    }
}
