//! Model-server metrics: each replica's `/metrics` (Prometheus text) read
//! every `scrapeInterval` for models that set `metrics`, and fed to
//! balancing and `/v1/queues`:
//!
//! - the requests waiting inside the server (vLLM
//!   `vllm:num_requests_waiting`, TGI `tgi_queue_size`, SGLang
//!   `sglang:num_queue_reqs`, Triton `nv_inference_pending_request_count`);
//! - KV-cache utilisation, 0–1 (vLLM `vllm:kv_cache_usage_perc`, before
//!   v0.10 `vllm:gpu_cache_usage_perc`; SGLang `sglang:token_usage`), the
//!   largest sample when a server reports several;
//! - seconds spent prefilling (vLLM `vllm:request_prefill_time_seconds`,
//!   its `_sum`), whose rate is the prefill utilisation the autoscaler
//!   reads (see `admission::Replica::prefill_busy`);
//! - the LoRA adapters in use (vLLM `vllm:lora_requests_info`, its
//!   `running_lora_adapters` and `waiting_lora_adapters` labels, each a
//!   comma-separated list).

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

/// The KV-cache utilisation metrics of a format, first found wins.
pub fn kv_metrics(format: MetricsFormat) -> &'static [&'static str] {
    match format {
        MetricsFormat::Vllm => &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        MetricsFormat::Sglang => &["sglang:token_usage"],
        _ => &[],
    }
}

/// What one scrape of a replica says.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServerState {
    /// Requests waiting inside.
    pub waiting: Option<f64>,
    /// KV-cache utilisation, 0–1.
    pub kv: Option<f64>,
    /// Adapters running or waiting.
    pub adapters: Vec<String>,
    /// Seconds spent prefilling since the server started (a counter).
    pub prefill_seconds: Option<f64>,
}

/// Reads a scrape in a format.
pub fn server_state(text: &str, format: MetricsFormat) -> ServerState {
    let waiting = waiting_metric(format).and_then(|m| sum_metric(text, m));
    let kv = kv_metrics(format)
        .iter()
        .find_map(|m| fold_metric(text, m, f64::max));
    let mut adapters = Vec::new();
    if format == MetricsFormat::Vllm {
        for label in ["running_lora_adapters", "waiting_lora_adapters"] {
            for list in label_values(text, "vllm:lora_requests_info", label) {
                for a in list.split(',').map(str::trim).filter(|a| !a.is_empty()) {
                    if !adapters.iter().any(|x| x == a) {
                        adapters.push(a.to_string());
                    }
                }
            }
        }
    }
    let prefill_seconds = match format {
        MetricsFormat::Vllm => sum_metric(text, "vllm:request_prefill_time_seconds_sum"),
        _ => None,
    };
    ServerState {
        waiting,
        kv,
        adapters,
        prefill_seconds,
    }
}

/// The values of `label` on a metric's samples.
pub fn label_values(text: &str, name: &str, label: &str) -> Vec<String> {
    let mut out = Vec::new();
    let needle = format!("{label}=\"");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name).and_then(|r| r.strip_prefix('{')) else {
            continue;
        };
        let labels = rest.rsplit_once('}').map_or(rest, |(l, _)| l);
        // At the start or after a comma: not the tail of a longer name.
        let at = labels
            .match_indices(&needle)
            .map(|(i, _)| i)
            .find(|&i| i == 0 || labels[..i].ends_with(','));
        if let Some(i) = at {
            let value = &labels[i + needle.len()..];
            let mut v = String::new();
            let mut chars = value.chars();
            while let Some(c) = chars.next() {
                match c {
                    '"' => break,
                    '\\' => match chars.next() {
                        Some('n') => v.push('\n'),
                        Some(other) => v.push(other),
                        None => break,
                    },
                    c => v.push(c),
                }
            }
            out.push(v);
        }
    }
    out
}

/// Σ of a metric's samples over all label sets in Prometheus text;
/// `None` when absent.
pub fn sum_metric(text: &str, name: &str) -> Option<f64> {
    fold_metric(text, name, |a, b| a + b)
}

/// A metric's samples over all label sets folded with `f`; `None` when
/// absent.
fn fold_metric(text: &str, name: &str, f: impl Fn(f64, f64) -> f64) -> Option<f64> {
    let mut found: Option<f64> = None;
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
            found = Some(found.map_or(v, |a| f(a, v)));
        }
    }
    found
}

/// Scrapes until shutdown.
pub async fn run(shared: Arc<Shared>, upstream: Upstream, mut shutdown: watch::Receiver<bool>) {
    let interval = shared.settings.spec.upstream.scrape_interval;
    let scraped: Vec<(String, MetricsFormat)> = shared
        .models
        .values()
        .filter(|m| m.settings.metrics != MetricsFormat::None)
        .map(|m| (m.settings.name.clone(), m.settings.metrics))
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
        for (model, format) in &scraped {
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
                if let Ok(Some(text)) = fetched {
                    let state = server_state(&text, *format);
                    let adapters: Vec<&str> = state.adapters.iter().map(String::as_str).collect();
                    shared.set_server_state(
                        model,
                        &endpoint,
                        state.waiting.unwrap_or(0.0).max(0.0).round() as u32,
                        state.kv,
                        &adapters,
                    );
                    if let Some(sum) = state.prefill_seconds {
                        shared.set_prefill_seconds(model, &endpoint, sum);
                    }
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

    #[test]
    fn reads_prefill_seconds_from_vllm_histogram_sum_only() {
        // vLLM's histogram (buckets, sum, count), two engines summed.
        let text = "# TYPE vllm:request_prefill_time_seconds histogram\n\
                    vllm:request_prefill_time_seconds_bucket{engine=\"0\",le=\"+Inf\"} 40\n\
                    vllm:request_prefill_time_seconds_sum{engine=\"0\"} 12.5\n\
                    vllm:request_prefill_time_seconds_count{engine=\"0\"} 40\n\
                    vllm:request_prefill_time_seconds_sum{engine=\"1\"} 2.5\n";
        assert_eq!(
            server_state(text, MetricsFormat::Vllm).prefill_seconds,
            Some(15.0)
        );
        assert_eq!(
            server_state(text, MetricsFormat::Sglang).prefill_seconds,
            None
        );
        assert_eq!(server_state("", MetricsFormat::Vllm).prefill_seconds, None);
    }

    #[test]
    fn reads_kv_usage_and_lora_adapters_from_vllm() {
        let text = "# TYPE vllm:kv_cache_usage_perc gauge\n\
                    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n\
                    vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.5\n\
                    vllm:num_requests_waiting{model_name=\"m\"} 2\n\
                    vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"sql,chat\",waiting_lora_adapters=\"chat,legal\"} 1.7e9\n";
        let s = server_state(text, MetricsFormat::Vllm);
        assert_eq!(s.waiting, Some(2.0));
        assert_eq!(s.kv, Some(0.5), "the fullest engine");
        assert_eq!(s.adapters, ["sql", "chat", "legal"]);
        let old = "vllm:gpu_cache_usage_perc 0.75\n";
        assert_eq!(server_state(old, MetricsFormat::Vllm).kv, Some(0.75));
        assert_eq!(
            server_state(text, MetricsFormat::Tgi),
            ServerState::default()
        );
    }
}
