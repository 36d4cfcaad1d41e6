//! Model-server metrics: each replica's `/metrics` (Prometheus text) read
//! every `scrapeInterval` for models that set `metrics`, and the requests
//! waiting inside the server (vLLM `vllm:num_requests_waiting`, TGI
//! `tgi_queue_size`, SGLang `sglang:num_queue_reqs`, Triton
//! `nv_inference_pending_request_count`) fed to balancing and
//! `/v1/queues`.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, Method};
use http_body_util::{BodyExt, Limited};
use tokio::sync::watch;

use crate::config::MetricsFormat;
use crate::state::Shared;
use crate::upstream::{Outgoing, Upstream};

/// The metric that counts requests waiting inside a model server.
pub fn waiting_metric(format: MetricsFormat) -> Option<&'static str> {
    match format {
        MetricsFormat::None => None,
        MetricsFormat::Vllm => Some("vllm:num_requests_waiting"),
        MetricsFormat::Tgi => Some("tgi_queue_size"),
        MetricsFormat::Sglang => Some("sglang:num_queue_reqs"),
        MetricsFormat::Triton => Some("nv_inference_pending_request_count"),
    }
}

/// Σ of a metric's samples over all label sets in Prometheus text;
/// `None` when absent.
pub fn sum_metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = if let Some(after) = rest.strip_prefix('{') {
            after.rsplit_once('}').map(|(_, v)| v)
        } else if rest.starts_with(' ') {
            Some(rest)
        } else {
            None // a longer name with this prefix
        };
        if let Some(v) = value
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
        {
            *found.get_or_insert(0.0) += v;
        }
    }
    found
}

/// Scrapes until shutdown.
pub async fn run(shared: Arc<Shared>, upstream: Upstream, mut shutdown: watch::Receiver<bool>) {
    let interval = shared.settings.spec.upstream.scrape_interval;
    let scraped: Vec<(String, &'static str)> = shared
        .models
        .values()
        .filter_map(|m| Some((m.settings.name.clone(), waiting_metric(m.settings.metrics)?)))
        .collect();
    if scraped.is_empty() {
        return;
    }
    let (headers, body) = (HeaderMap::new(), Bytes::new());
    let get = Outgoing {
        method: &Method::GET,
        target: "/metrics",
        headers: &headers,
        body: &body,
    };
    loop {
        for (model, metric) in &scraped {
            for r in shared.replicas(model) {
                let Ok(endpoint) = crate::config::Endpoint::parse(&r.endpoint) else {
                    continue;
                };
                let fetched = tokio::time::timeout(interval, async {
                    let resp = upstream.send(&endpoint, get).await.ok()?;
                    let body = Limited::new(resp.into_body(), 4 << 20)
                        .collect()
                        .await
                        .ok()?;
                    String::from_utf8(body.to_bytes().to_vec()).ok()
                })
                .await;
                if let Ok(Some(text)) = fetched
                    && let Some(v) = sum_metric(&text, metric)
                {
                    shared.set_server_waiting(model, &endpoint, v.max(0.0).round() as u32);
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_a_metric_over_label_sets() {
        let text = "# HELP vllm:num_requests_waiting Waiting.\n\
                    # TYPE vllm:num_requests_waiting gauge\n\
                    vllm:num_requests_waiting{model_name=\"a\"} 3.0\n\
                    vllm:num_requests_waiting{model_name=\"b\"} 2\n\
                    vllm:num_requests_waiting_total 99\n\
                    tgi_queue_size 7\n";
        assert_eq!(sum_metric(text, "vllm:num_requests_waiting"), Some(5.0));
        assert_eq!(sum_metric(text, "tgi_queue_size"), Some(7.0));
        assert_eq!(sum_metric(text, "sglang:num_queue_reqs"), None);
    }
}
