//! Requests counted against the SLO targets their model's policy declares
//! (`gpuscale_slo_requests_total`): from arrival at the gateway, the queue
//! wait included, and a refused request missing every target.

mod common;

use std::time::Duration;

use common::*;
use gpuscale_gateway::config::Settings;

/// A policy with p95 targets of 100 ms queue wait and 200 ms latency.
fn policy() -> gpuscale_policies::Model {
    let spec: gpuscale_policies::ModelPolicySpec = serde_json::from_value(serde_json::json!({
        "servedName": "m",
        "resources": {"memoryGiB": 10, "compute": 0.1, "maxConcurrency": 1},
        "slo": {"queueWaitP95": "100ms", "latencyP95": "200ms"},
    }))
    .unwrap();
    gpuscale_policies::Model::from_policy(
        &gpuscale_policies::ModelPolicy::new("m", spec),
        &gpuscale_policies::Catalog::builtin(),
    )
    .unwrap()
}

/// `gpuscale_slo_requests_total` of model `m` for one target and result.
fn slo_count(text: &str, slo: &str, result: &str) -> Option<f64> {
    sample(
        text,
        &format!("gpuscale_slo_requests_total{{model=\"m\",slo=\"{slo}\",result=\"{result}\"}}"),
    )
}

#[tokio::test]
async fn each_request_meets_or_misses_each_declared_target() {
    let up = gated("a", false).await;
    let mut s = spec(vec![model("m", &[up.addr], 1)]);
    s.queue.max_queue = 1;
    let mut settings = Settings::from_spec("t", s, &[policy()]).unwrap();
    settings.admin_token = Some(gpuscale_gateway::auth::AdminToken::from_secret(TOKEN).unwrap());
    let gw = gpuscale_gateway::start(settings).await.unwrap();
    let traffic = gw.traffic;
    let body = || serde_json::json!({"model": "m", "prompt": "x"}).to_string();

    // Quick: both targets met.
    up.gate.add_permits(1);
    assert_eq!(
        post_model(traffic, "/v1/completions", "m").await.status,
        200
    );

    // A holds the one slot for 300 ms (latency missed, no queue wait);
    // B waits behind it (queue wait and latency missed); C finds the
    // queue full and is refused (both missed).
    let a =
        tokio::spawn(async move { send(traffic, "POST", "/v1/completions", &[], body()).await });
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 1).await;
    let b =
        tokio::spawn(async move { send(traffic, "POST", "/v1/completions", &[], body()).await });
    wait_queue(gw.admin, "m", |q| q["waiting"] == 1).await;
    let c = send(traffic, "POST", "/v1/completions", &[], body()).await;
    assert_eq!(c.status, 429);
    tokio::time::sleep(Duration::from_millis(300)).await;
    up.gate.add_permits(2);
    assert_eq!(a.await.unwrap().status, 200);
    assert_eq!(b.await.unwrap().status, 200);

    let text = metrics(gw.admin).await;
    let count = |slo: &str, result: &str| slo_count(&text, slo, result);
    assert_eq!(count("queue_wait", "met"), Some(2.0), "{text}");
    assert_eq!(count("queue_wait", "missed"), Some(2.0), "{text}");
    assert_eq!(count("latency", "met"), Some(1.0), "{text}");
    assert_eq!(count("latency", "missed"), Some(3.0), "{text}");
    // No TTFT target, no TTFT series.
    assert!(!text.contains("slo=\"ttft\""), "{text}");
    assert!(
        text.contains("gpuscale_queue_limit{model=\"m\"} 1"),
        "{text}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_request_the_replica_fails_misses_its_latency_target() {
    // The only replica's port is closed: the gateway answers 502, and the
    // request (admitted, its queue wait met) misses the latency target.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = closed.local_addr().unwrap();
    drop(closed);
    let s = spec(vec![model("m", &[dead], 1)]);
    let mut settings = Settings::from_spec("t", s, &[policy()]).unwrap();
    settings.admin_token = Some(gpuscale_gateway::auth::AdminToken::from_secret(TOKEN).unwrap());
    let gw = gpuscale_gateway::start(settings).await.unwrap();
    let answer = post_model(gw.traffic, "/v1/completions", "m").await;
    assert_eq!(answer.status, 502);
    let text = metrics(gw.admin).await;
    let count = |slo: &str, result: &str| slo_count(&text, slo, result);
    assert_eq!(count("latency", "missed"), Some(1.0), "{text}");
    assert_eq!(count("latency", "met").unwrap_or(0.0), 0.0, "{text}");
    gw.shutdown().await;
}
