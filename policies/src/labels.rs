//! Kubernetes label syntax, as the API server validates it
//! (`k8s.io/apimachinery/pkg/util/validation`: `IsQualifiedName` for keys,
//! `IsValidLabelValue` for values), and the label keys gpuscale keeps for
//! itself. A label that breaks these rules is refused where it is written,
//! not by the API server when a Deployment or a node label is applied.

/// Why `key` is not a label key, if it is not: an optional prefix (a
/// DNS-1123 subdomain of at most 253 characters) and `/`, then a name of
/// 1–63 characters, alphanumeric at both ends, with `-`, `_` and `.`
/// between.
pub fn key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("has an empty prefix before `/`".into());
        }
        if !is_subdomain(prefix) {
            return Some(format!(
                "has the prefix `{}`, which is not a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', alphanumeric at both ends, at most 253 characters)",
                crate::model::shown(prefix)
            ));
        }
    }
    if name.is_empty() {
        return Some("has an empty name".into());
    }
    if name.contains('/') {
        return Some("has more than one `/`".into());
    }
    if name.len() > 63 {
        return Some(format!(
            "has a name of {} characters (at most 63)",
            name.len()
        ));
    }
    if !is_label_name(name) {
        return Some(format!(
            "has the name `{}`: letters, digits, '-', '_' and '.', alphanumeric at both ends",
            crate::model::shown(name)
        ));
    }
    None
}

/// Why `value` is not a label value, if it is not: empty, or 1–63
/// characters, alphanumeric at both ends, with `-`, `_` and `.` between.
pub fn value_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return None;
    }
    if value.len() > 63 {
        return Some(format!(
            "`{}` has {} characters: a label value has at most 63",
            crate::model::shown(value),
            value.len()
        ));
    }
    (!is_label_name(value)).then(|| {
        format!(
            "`{}` is not a label value: letters, digits, '-', '_' and '.', alphanumeric at both ends",
            crate::model::shown(value)
        )
    })
}

/// Why gpuscale keeps `key` for itself, if it does: its own labels
/// (`gpuscale.io/…`, which select a variant's pods and tell its
/// Deployments apart), `app.kubernetes.io/managed-by` (which marks the
/// Deployments it owns) and HAMi's webhook opt-out (set by the plan).
pub fn reserved(key: &str) -> Option<&'static str> {
    let prefix = key.split_once('/').map(|(p, _)| p);
    // Prometheus's Kubernetes discovery reads a pod label as
    // `__meta_kubernetes_pod_label_<key>`, every character but letters,
    // digits and `_` made `_`: a key that reads as one of gpuscale's own
    // there (`app_kubernetes_io_name`) would stand in for it in a scrape
    // job's relabelling.
    let prom = |k: &str| -> String {
        k.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect()
    };
    let own = ["app.kubernetes.io/name", "app.kubernetes.io/managed-by"];
    if own.iter().any(|o| *o != key && prom(o) == prom(key))
        || (prom(key).starts_with("gpuscale_io_") && prefix != Some("gpuscale.io"))
    {
        return Some(
            "Prometheus reads it as the same label as one of gpuscale's own (`app.kubernetes.io/name`, `app.kubernetes.io/managed-by`, `gpuscale.io/…`)",
        );
    }
    if prefix.is_some_and(|p| matches!(p, "kueue.x-k8s.io" | "scheduling.x-k8s.io" | "volcano.sh"))
        || key == "scheduling.k8s.io/group-name"
    {
        return Some(
            "a gang scheduler's or Kueue's key would put the model's pods in a training gang or a Kueue workload",
        );
    }
    if prefix.is_some_and(|p| p == "gpuscale.io" || p.ends_with(".gpuscale.io")) {
        Some("gpuscale's own labels (`gpuscale.io/…`) select and tell apart the pods it runs")
    } else if key == "app.kubernetes.io/managed-by" {
        Some("gpuscale sets `app.kubernetes.io/managed-by` on what it owns")
    } else if key == "hami.io/webhook" {
        Some("the plan sets HAMi's webhook opt-out on whole-GPU pods")
    } else {
        None
    }
}

fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn is_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Cases from the API server's rules (apimachinery's
    // `validation_test.go`: TestIsQualifiedName, TestIsValidLabelValue).
    #[test]
    fn keys_as_the_api_server_takes_them() {
        for good in [
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "1234",
            "simple/simple",
            "now-with-dashes/simple",
            "now-with-dashes/now-with-dashes",
            "now.with.dots/simple",
            "now-with.dashes-and.dots/simple",
            "1-num.2-num/3-num",
            "1234/5678",
            "1.2.3.4/5678",
            "Uppercase_Is_OK_123",
            "example.com/Uppercase_Is_OK_123",
            "requests.storage-foo",
            "app.kubernetes.io/name",
        ] {
            assert_eq!(key_problem(good), None, "{good}");
        }
        let long_name = "a".repeat(64);
        let long_prefix = format!("{}/b", "a".repeat(254));
        for bad in [
            "nospecialchars%^=@",
            "cantendwithadash-",
            "-cantstartwithadash-",
            "only/one/slash",
            "Example.com/abc",
            "example_com/abc",
            "example.com/",
            "/simple",
            long_name.as_str(),
            long_prefix.as_str(),
            "",
        ] {
            assert!(key_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn values_as_the_api_server_takes_them() {
        for good in [
            "",
            "simple",
            "now-with-dashes",
            "1-starts-with-num",
            "end-with-num-1",
            "1234",
            "A.B_C-d",
            "a".repeat(63).as_str(),
        ] {
            assert_eq!(value_problem(good), None, "{good}");
        }
        for bad in [
            "nospecialchars%^=@",
            "Tama-nui-te-rā.is.Māori.sun",
            "\\backslashes\\are\\bad",
            "-starts-with-dash",
            "ends-with-dash-",
            ".starts.with.dot",
            "ends.with.dot.",
            "has space",
            "a".repeat(64).as_str(),
        ] {
            assert!(value_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn gpuscales_own_keys_are_reserved() {
        assert!(reserved("gpuscale.io/variant").is_some());
        assert!(reserved("x.gpuscale.io/a").is_some());
        assert!(reserved("app.kubernetes.io/managed-by").is_some());
        assert!(reserved("hami.io/webhook").is_some());
        assert!(reserved("app.kubernetes.io/name").is_none());
        assert!(reserved("notgpuscale.io/a").is_none());
        assert!(reserved("team").is_none());
        // What Prometheus's relabelling reads as gpuscale's own keys.
        assert!(reserved("app_kubernetes_io_name").is_some());
        assert!(reserved("app-kubernetes-io/name").is_some());
        assert!(reserved("app.kubernetes.io/managed_by").is_some());
        assert!(reserved("gpuscale_io/variant").is_some());
        assert!(reserved("app.kubernetes.io/component").is_none());
        // A gang scheduler's or Kueue's keys.
        assert!(reserved("kueue.x-k8s.io/queue-name").is_some());
        assert!(reserved("scheduling.x-k8s.io/pod-group").is_some());
        assert!(reserved("volcano.sh/job-name").is_some());
        assert!(reserved("scheduling.k8s.io/group-name").is_some());
    }
}
