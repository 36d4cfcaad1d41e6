//! The Grafana dashboard and the Prometheus rules in `deploy/` name only
//! metrics the binary exports (read from the gateway's and the
//! autoscaler's real registries), series the rules record, or DCGM
//! exporter metrics listed here as external. `promtool check rules` and
//! `promtool test rules` run in `.ci/run`.

use std::collections::BTreeSet;
use std::path::PathBuf;

/// DCGM exporter metrics the dashboard may use (NVIDIA's names).
const EXTERNAL: [&str; 2] = ["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"];

/// Series Prometheus itself records per scrape target.
const PROMETHEUS: [&str; 1] = ["up"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Series names the registries export: a counter family `x` as
/// `x_total`, a histogram as `x_bucket`, `x_count`, `x_sum`, a gauge as
/// `x`.
fn exported() -> BTreeSet<String> {
    let gateway = gpuscale_gateway::metrics::exposition();
    let autoscaler = gpuscale_autoscaler::controller::exposition();
    let mut out = BTreeSet::new();
    for text in [gateway, autoscaler] {
        for (name, kind) in gpuscale_gateway::metrics::families(&text) {
            match kind.as_str() {
                "counter" => {
                    out.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for s in ["bucket", "count", "sum"] {
                        out.insert(format!("{name}_{s}"));
                    }
                }
                _ => {
                    out.insert(name);
                }
            }
        }
    }
    out
}

/// Removes every `open … close` span (not nested across kinds).
fn strip(s: &str, open: char, close: char) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in s.chars() {
        if c == open {
            depth += 1;
        } else if c == close && depth > 0 {
            depth -= 1;
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}

/// The metric names a PromQL expression reads: identifiers outside
/// strings, label matchers, ranges and grouping lists, that are not
/// functions, aggregations or keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Strings first (they may hold braces), then matchers and ranges.
    let mut no_strings = String::new();
    let mut in_string = false;
    for c in expr.chars() {
        if c == '"' {
            in_string = !in_string;
        } else if !in_string {
            no_strings.push(c);
        }
    }
    let s = strip(&strip(&no_strings, '{', '}'), '[', ']');
    // Aggregation operators may put their grouping before the
    // parenthesis (`sum by (model) (…)`): never metric names.
    let aggregations = [
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    let keywords = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
    ];
    let chars: Vec<char> = s.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let call = j < chars.len() && chars[j] == '(';
            if keywords.contains(&word.as_str()) {
                // A grouping list follows some of them: skip it.
                if call {
                    while i < chars.len() && chars[i] != ')' {
                        i += 1;
                    }
                }
            } else {
                let macro_name = start > 0 && chars[start - 1] == '$';
                if !(call || macro_name || aggregations.contains(&word.as_str())) {
                    names.insert(word);
                }
            }
        } else if c.is_ascii_digit() || c == '.' {
            // A number (with an exponent or a unit such as 5m): skip it
            // whole.
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn promql_names_are_read_as_prometheus_reads_them() {
    let n = metric_names(
        "histogram_quantile(0.95, sum by (model, le) (rate(gpuscale_upstream_latency_seconds_bucket{model=~\"a|b\"}[$__rate_interval]))) > 1e3 and on (model) x:y:z",
    );
    assert_eq!(
        n,
        BTreeSet::from([
            "gpuscale_upstream_latency_seconds_bucket".to_string(),
            "x:y:z".to_string()
        ])
    );
}

fn expressions_of_dashboard() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("deploy/grafana/gpuscale.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for p in v["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for a in v["annotations"]["list"].as_array().unwrap() {
        out.push(a["expr"].as_str().unwrap().to_string());
    }
    out
}

fn rules() -> (Vec<String>, BTreeSet<String>) {
    let text = std::fs::read_to_string(root().join("deploy/prometheus/rules.yaml")).unwrap();
    let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let (mut exprs, mut recorded) = (Vec::new(), BTreeSet::new());
    for g in v["groups"].as_sequence().unwrap() {
        for r in g["rules"].as_sequence().unwrap() {
            exprs.push(r["expr"].as_str().unwrap().to_string());
            if let Some(name) = r["record"].as_str() {
                recorded.insert(name.to_string());
            }
        }
    }
    (exprs, recorded)
}

#[test]
fn the_dashboard_and_the_rules_name_only_metrics_that_exist() {
    let exported = exported();
    // The registries hold what the dashboard is about.
    for name in [
        "gpuscale_queue_depth",
        "gpuscale_slo_requests_total",
        "gpuscale_autoscaler_desired_replicas",
        "gpuscale_autoscaler_pool_gpus_used",
        "gpuscale_upstream_latency_seconds_bucket",
    ] {
        assert!(exported.contains(name), "{name} not exported: {exported:?}");
    }
    let (rule_exprs, recorded) = rules();
    let known = |n: &String| {
        exported.contains(n)
            || recorded.contains(n)
            || EXTERNAL.contains(&n.as_str())
            || PROMETHEUS.contains(&n.as_str())
    };
    let dashboard = expressions_of_dashboard();
    assert!(dashboard.len() >= 15, "{dashboard:?}");
    let mut used = BTreeSet::new();
    for e in dashboard.iter().chain(&rule_exprs) {
        let names = metric_names(e);
        assert!(!names.is_empty(), "no metric in `{e}`");
        for n in &names {
            assert!(
                known(n),
                "`{n}` in `{e}` is neither exported, recorded nor listed as external"
            );
        }
        used.extend(names);
    }
    // DCGM's own names for GPU utilisation and memory are on the
    // dashboard, and every recording rule is used by something.
    for n in EXTERNAL {
        assert!(used.contains(n), "{n} not on the dashboard");
    }
    for r in &recorded {
        assert!(
            dashboard
                .iter()
                .chain(&rule_exprs)
                .any(|e| metric_names(e).contains(r)),
            "recording rule {r} is used nowhere"
        );
    }
}

/// The liveness alerts name scrape jobs that `deploy/prometheus/scrape.yaml`
/// defines, and together cover every one of them (a job renamed on one
/// side would leave its processes' outages unalerted).
#[test]
fn the_liveness_alerts_cover_every_scrape_job() {
    let text = std::fs::read_to_string(root().join("deploy/prometheus/scrape.yaml")).unwrap();
    let jobs: BTreeSet<String> = serde_yaml_ng::from_str::<serde_yaml_ng::Value>(&text)
        .unwrap()
        .as_sequence()
        .unwrap()
        .iter()
        .map(|j| j["job_name"].as_str().unwrap().to_string())
        .collect();
    assert!(jobs.len() >= 4, "{jobs:?}");
    let (exprs, _) = rules();
    let mut named = BTreeSet::new();
    for e in exprs.iter().filter(|e| e.contains("up{")) {
        // `job="a"` or `job=~"a|b"`.
        let at = e.find("job=").expect("a job matcher");
        let rest = &e[at..];
        let open = rest.find('"').unwrap() + 1;
        let close = open + rest[open..].find('"').unwrap();
        for job in rest[open..close].split('|') {
            assert!(
                jobs.contains(job),
                "`{job}` in `{e}` is no scrape job: {jobs:?}"
            );
            named.insert(job.to_string());
        }
    }
    assert_eq!(named, jobs, "every scrape job has a liveness alert");
}
