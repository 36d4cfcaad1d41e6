//! What a `/metrics` listener answers: OpenMetrics text to scrapers that
//! ask for it (Prometheus does, in its `Accept`), the classic Prometheus
//! text format (0.0.4) to everything else (`curl`, `promtool check
//! metrics`, older agents). `prometheus-client` encodes OpenMetrics only;
//! the gateway's and the autoscaler's listeners both answer through
//! [`negotiate`]. Pure.

/// OpenMetrics' content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The classic text format's content type.
pub const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The body and content type for a request whose `Accept` fields are
/// `accept`, from the OpenMetrics text `openmetrics`.
pub fn negotiate<'a>(
    accept: impl IntoIterator<Item = &'a str>,
    openmetrics: String,
) -> (String, &'static str) {
    if accept
        .into_iter()
        .any(|v| v.contains("application/openmetrics-text"))
    {
        (openmetrics, OPENMETRICS)
    } else {
        (classic_text(&openmetrics), CLASSIC)
    }
}

/// The classic Prometheus text format (0.0.4) from OpenMetrics text: a
/// counter's `# HELP`/`# TYPE` name the `_total` series, and there is no
/// `# EOF`.
pub fn classic_text(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, "counter")) = rest.split_once(' ')
        {
            counters.insert(name.to_string());
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OM: &str = "# HELP gpuscale_requests Requests.\n# TYPE gpuscale_requests counter\ngpuscale_requests_total{model=\"a\",code=\"200\"} 1\n# HELP gpuscale_queue_depth Waiting.\n# TYPE gpuscale_queue_depth gauge\ngpuscale_queue_depth{model=\"a\"} 3\n# EOF\n";

    #[test]
    fn classic_text_names_counters_by_their_total_series() {
        let classic = classic_text(OM);
        assert!(classic.contains("# TYPE gpuscale_requests_total counter\n"));
        assert!(classic.contains("# HELP gpuscale_requests_total "));
        assert!(classic.contains("gpuscale_requests_total{model=\"a\",code=\"200\"} 1\n"));
        assert!(classic.contains("# TYPE gpuscale_queue_depth gauge\n"));
        assert!(!classic.contains("# EOF"));
    }

    #[test]
    fn openmetrics_only_to_whoever_asks_for_it() {
        let prometheus =
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        assert_eq!(
            negotiate([prometheus], OM.into()),
            (OM.to_string(), OPENMETRICS)
        );
        let (body, kind) = negotiate(["*/*"], OM.into());
        assert_eq!(kind, CLASSIC);
        assert!(!body.contains("# EOF"));
        assert_eq!(negotiate([], OM.into()).1, CLASSIC);
    }
}
