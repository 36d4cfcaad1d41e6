//! The gateway's Prometheus metrics (prefix `gpuscale_`, label `model`),
//! registered with `prometheus-client` and served as OpenMetrics text on
//! the admin listener's `/metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `{model}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    /// Served model name.
    pub model: String,
}

/// `{model, code}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    /// Served model name (`unknown` before routing).
    pub model: String,
    /// HTTP status code.
    pub code: u16,
}

/// `{model, slo, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SloLabels {
    /// Served model name.
    pub model: String,
    /// `queue_wait`, `latency` or `ttft`.
    pub slo: String,
    /// `met` or `missed`.
    pub result: String,
}

/// `{model, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Served model name.
    pub model: String,
    /// Rejections: `queue_full`, `queue_timeout`, `displaced`,
    /// `shutting_down`; route decisions: `affinity`, `spill`,
    /// `least-loaded`, `adapter`, `round-robin`.
    pub reason: String,
}

/// The classic Prometheus text format from OpenMetrics text
/// ([`gpuscale_policies::exposition`], where both listeners negotiate it).
pub use gpuscale_policies::exposition::classic_text;

/// The metric families in an OpenMetrics exposition (from its `# TYPE`
/// lines), e.g. `gpuscale_queue_depth`. Dashboards and alert rules are
/// checked against the names the registries really export.
pub fn families(openmetrics: &str) -> Vec<(String, String)> {
    openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.trim().to_string()))
        .collect()
}

/// Every family the gateway exports, one placeholder series each
/// (`model="example"`), as OpenMetrics text: what dashboards and rules
/// are checked against. The destructuring has no `..`: a family added to
/// [`Metrics`] does not compile until it is listed here.
pub fn exposition() -> String {
    let (m, registry) = Metrics::new();
    let Metrics {
        requests,
        queue_depth,
        in_flight,
        replicas,
        queue_wait,
        latency,
        ttft,
        rejections,
        upstream_errors,
        scale_signals,
        newest_first,
        queue_limit,
        slo,
        route_decisions,
    } = &m;
    let model = ModelLabel {
        model: "example".into(),
    };
    let _ = requests.get_or_create(&CodeLabels {
        model: "example".into(),
        code: 200,
    });
    for g in [queue_depth, in_flight, replicas, queue_limit] {
        let _ = g.get_or_create(&model);
    }
    for h in [queue_wait, latency, ttft] {
        let _ = h.get_or_create(&model);
    }
    for c in [upstream_errors, scale_signals, newest_first] {
        let _ = c.get_or_create(&model);
    }
    let _ = rejections.get_or_create(&ReasonLabels {
        model: "example".into(),
        reason: "queue_full".into(),
    });
    let _ = route_decisions.get_or_create(&ReasonLabels {
        model: "example".into(),
        reason: "affinity".into(),
    });
    let _ = slo.get_or_create(&SloLabels {
        model: "example".into(),
        slo: "latency".into(),
        result: "met".into(),
    });
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

type Hist = Family<ModelLabel, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 1 ms … ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric the gateway exports.
#[derive(Clone)]
pub struct Metrics {
    /// `gpuscale_requests_total{model,code}`.
    pub requests: Family<CodeLabels, Counter>,
    /// `gpuscale_queue_depth{model}`: requests waiting.
    pub queue_depth: Family<ModelLabel, Gauge>,
    /// `gpuscale_in_flight{model}`.
    pub in_flight: Family<ModelLabel, Gauge>,
    /// `gpuscale_replicas{model}`: ready replicas.
    pub replicas: Family<ModelLabel, Gauge>,
    /// `gpuscale_queue_wait_seconds{model}`.
    pub queue_wait: Hist,
    /// `gpuscale_upstream_latency_seconds{model}`: leaving the queue to the
    /// last byte.
    pub latency: Hist,
    /// `gpuscale_time_to_first_token_seconds{model}`: streams only.
    pub ttft: Hist,
    /// `gpuscale_rejections_total{model,reason}`.
    pub rejections: Family<ReasonLabels, Counter>,
    /// `gpuscale_upstream_errors_total{model}`.
    pub upstream_errors: Family<ModelLabel, Counter>,
    /// `gpuscale_scale_from_zero_signals_total{model}`.
    pub scale_signals: Family<ModelLabel, Counter>,
    /// `gpuscale_queue_newest_first_total{model}`: slots handed to the
    /// newest waiter of a backed-up class, ahead of older ones (adaptive
    /// LIFO).
    pub newest_first: Family<ModelLabel, Counter>,
    /// `gpuscale_queue_limit{model}`: the admission queue's bound.
    pub queue_limit: Family<ModelLabel, Gauge>,
    /// `gpuscale_slo_requests_total{model,slo,result}`: requests against
    /// the policy's targets (the good and bad events of an SLO).
    pub slo: Family<SloLabels, Counter>,
    /// `gpuscale_route_decisions_total{model,reason}`: why each request's
    /// replica was chosen.
    pub route_decisions: Family<ReasonLabels, Counter>,
}

impl Metrics {
    /// The metrics and the registry that serves them.
    pub fn new() -> (Metrics, Registry) {
        let m = Metrics {
            requests: Family::default(),
            queue_depth: Family::default(),
            in_flight: Family::default(),
            replicas: Family::default(),
            queue_wait: Family::new_with_constructor(seconds_histogram),
            latency: Family::new_with_constructor(seconds_histogram),
            ttft: Family::new_with_constructor(seconds_histogram),
            rejections: Family::default(),
            upstream_errors: Family::default(),
            scale_signals: Family::default(),
            newest_first: Family::default(),
            queue_limit: Family::default(),
            slo: Family::default(),
            route_decisions: Family::default(),
        };
        let mut r = Registry::with_prefix("gpuscale");
        r.register(
            "requests",
            "Requests answered, by model and HTTP status code",
            m.requests.clone(),
        );
        r.register(
            "queue_depth",
            "Requests waiting in the gateway's admission queue",
            m.queue_depth.clone(),
        );
        r.register(
            "in_flight",
            "Requests sent to replicas and not finished",
            m.in_flight.clone(),
        );
        r.register(
            "replicas",
            "Replicas registered and taking requests",
            m.replicas.clone(),
        );
        r.register(
            "queue_wait_seconds",
            "Time requests waited in the admission queue",
            m.queue_wait.clone(),
        );
        r.register(
            "upstream_latency_seconds",
            "Time from leaving the queue to the last byte of the response",
            m.latency.clone(),
        );
        r.register(
            "time_to_first_token_seconds",
            "Time from leaving the queue to the first chunk of a streamed response",
            m.ttft.clone(),
        );
        r.register(
            "rejections",
            "Requests refused, by reason",
            m.rejections.clone(),
        );
        r.register(
            "upstream_errors",
            "Transport failures talking to replicas",
            m.upstream_errors.clone(),
        );
        r.register(
            "queue_limit",
            "Requests the admission queue holds at most",
            m.queue_limit.clone(),
        );
        r.register(
            "slo_requests",
            "Requests measured against the model's SLO targets from their arrival at the gateway, queue wait included; a refused request misses every target (slo: queue_wait, latency, ttft; result: met, missed)",
            m.slo.clone(),
        );
        r.register(
            "route_decisions",
            "Requests sent to a replica, by why it was chosen (reason: affinity, the owner of the prompt's prefix; spill, the next in the prefix's order when the owner was at its load bound; least-loaded; adapter, the least loaded replica holding the request's LoRA adapter; round-robin)",
            m.route_decisions.clone(),
        );
        r.register(
            "scale_from_zero_signals",
            "Signals sent to the autoscaler for a model with no replica",
            m.scale_signals.clone(),
        );
        r.register(
            "queue_newest_first",
            "Waiters served ahead of older ones because their priority class was backed up past the model's budget (adaptive LIFO: queue.order)",
            m.newest_first.clone(),
        );
        (m, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classic_text_names_counters_by_their_total_series() {
        let (m, registry) = Metrics::new();
        m.requests
            .get_or_create(&CodeLabels {
                model: "a".into(),
                code: 200,
            })
            .inc();
        m.queue_depth
            .get_or_create(&ModelLabel { model: "a".into() })
            .set(3);
        let mut om = String::new();
        prometheus_client::encoding::text::encode(&mut om, &registry).unwrap();
        assert!(om.contains("# TYPE gpuscale_requests counter\n"));
        assert!(om.ends_with("# EOF\n"));
        let classic = classic_text(&om);
        assert!(classic.contains("# TYPE gpuscale_requests_total counter\n"));
        assert!(classic.contains("# HELP gpuscale_requests_total "));
        assert!(classic.contains("gpuscale_requests_total{model=\"a\",code=\"200\"} 1\n"));
        assert!(classic.contains("# TYPE gpuscale_queue_depth gauge\n"));
        assert!(!classic.contains("# EOF"));
    }
}
