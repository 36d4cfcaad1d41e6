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

/// `{model, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Served model name.
    pub model: String,
    /// `queue_full`, `queue_timeout`, `displaced`, `shutting_down`.
    pub reason: String,
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
            "scale_from_zero_signals",
            "Signals sent to the autoscaler for a model with no replica",
            m.scale_signals.clone(),
        );
        (m, r)
    }
}
