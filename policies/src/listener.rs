//! What a listener bound to loopback answers, against web pages in a
//! browser on the same machine (the laptop case: `gpuscale up`, the
//! gateway or the autoscaler run locally).
//!
//! Binding to loopback keeps other machines out, not other origins: a
//! page can make the browser send requests to `127.0.0.1`, either
//! directly (a cross-origin "simple" POST, sent without a CORS preflight)
//! or through a name its DNS first resolves elsewhere and then to
//! `127.0.0.1` (DNS rebinding: the page then reads the answers as its
//! own origin's). Both carry tell-tale fields the browser sets and the
//! page cannot: `Host` names the attacker's domain, and `Origin` names
//! the page. [`refusal`] is the rule; command-line clients (curl, the
//! OpenAI SDK, Prometheus) send a loopback `Host` and no `Origin`.
//! Pure.

use std::net::IpAddr;

/// Why a request to a loopback-bound listener is refused, or `None`.
/// `host`: the `Host` field (absent: HTTP/1.0, allowed); `origin`: the
/// `Origin` field. Refused: a `Host` that is not a loopback address or a
/// `localhost` name (RFC 6761: browsers resolve `localhost` and
/// `*.localhost` to loopback themselves, so no page's DNS can rebind
/// them), and an `Origin` other than `null` whose host and port are not
/// the `Host`'s (a request from another origin's page; same-origin pages,
/// served by the listener itself, pass).
pub fn refusal(host: Option<&str>, origin: Option<&str>) -> Option<&'static str> {
    if let Some(host) = host
        && !loopback_host(host)
    {
        return Some(
            "this listener is bound to loopback and answers only loopback host names \
             (Host names another: a DNS-rebinding page, or a proxy that should send the \
             loopback name)",
        );
    }
    if let Some(origin) = origin.map(str::trim)
        && !host.is_some_and(|h| same_origin(origin, h))
    {
        return Some(
            "this listener is bound to loopback and refuses requests from web pages of \
             other origins (the request carries their Origin)",
        );
    }
    None
}

/// Whether a `Host` value (`name[:port]`, `[v6][:port]`) names loopback.
pub fn loopback_host(host: &str) -> bool {
    let name = authority_host(host.trim());
    if name.is_empty() {
        return false;
    }
    let lower = name.to_ascii_lowercase();
    if lower == "localhost" || lower.ends_with(".localhost") {
        return true;
    }
    lower
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// The host part of `name[:port]` or `[v6][:port]`.
fn authority_host(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().map_or("", |v6| v6);
    }
    authority.split(':').next().unwrap_or("")
}

/// Whether an `Origin` (`scheme://host[:port]`) is this plain-HTTP
/// listener's own: scheme `http`, and the host and port of `Host`. The
/// literal `null` (sandboxed frames, `file:` pages) never is.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return false;
    }
    let default_port = "80";
    let with_port = |a: &str| -> String {
        let a = a.trim().trim_end_matches('/').to_ascii_lowercase();
        let has_port = if a.starts_with('[') {
            a.contains("]:")
        } else {
            a.contains(':')
        };
        if has_port {
            a
        } else {
            format!("{a}:{default_port}")
        }
    };
    with_port(authority) == with_port(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_pass_others_do_not() {
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "app.localhost:9",
            "127.0.0.1",
            "127.0.0.1:9090",
            "127.3.4.5",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(loopback_host(ok), "{ok}");
        }
        for bad in [
            "attacker.example:48090",
            "localhost.attacker.example",
            "10.0.0.1:8080",
            "0.0.0.0:8080",
            "[::ffff:10.0.0.1]:80",
            "",
            ":8080",
            "127.0.0.1.nip.io",
        ] {
            assert!(!loopback_host(bad), "{bad}");
        }
    }

    #[test]
    fn a_rebinding_host_or_another_origin_is_refused() {
        assert_eq!(refusal(Some("127.0.0.1:8080"), None), None);
        assert_eq!(refusal(None, None), None, "HTTP/1.0 without Host");
        assert!(refusal(Some("evil.example:8080"), None).is_some());
        assert!(
            refusal(Some("127.0.0.1:8080"), Some("http://evil.example"))
                .unwrap()
                .contains("Origin")
        );
        assert!(refusal(Some("127.0.0.1:8080"), Some("null")).is_some());
        // The listener's own page (the dashboard) is same-origin.
        assert_eq!(
            refusal(Some("127.0.0.1:9091"), Some("http://127.0.0.1:9091")),
            None
        );
        assert_eq!(
            refusal(Some("localhost"), Some("http://localhost:80")),
            None
        );
        assert!(refusal(Some("localhost:9091"), Some("http://localhost:9092")).is_some());
        assert!(refusal(Some("localhost"), Some("https://localhost")).is_some());
    }
}
