//! Prefix-affinity routing through real gateways on loopback: two
//! gateways that share nothing send each conversation to the same replica,
//! a request without a prompt is balanced by least-outstanding, and an
//! adapter request goes to the replica that has the adapter.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::*;

fn conversation(i: usize, turns: usize) -> String {
    let system = "You are a careful assistant for the gpuscale team. ".repeat(12);
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": system}),
        serde_json::json!({"role": "user", "content": format!("Question {i}: how do I pack replica {i}?")}),
    ];
    for t in 1..turns {
        messages.push(serde_json::json!({"role": "assistant", "content": format!("Answer {t}.")}));
        messages.push(serde_json::json!({"role": "user", "content": format!("Follow-up {t}.")}));
    }
    serde_json::json!({"model": "m", "messages": messages}).to_string()
}

async fn chat(addr: std::net::SocketAddr, body: String) -> Answer {
    send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body,
    )
    .await
}

fn route_header(a: &Answer) -> String {
    a.headers
        .get("x-gpuscale-route")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gateway_sends_a_conversation_to_the_same_replica() {
    let ups = [
        gated("a", true).await,
        gated("b", true).await,
        gated("c", true).await,
        gated("d", true).await,
    ];
    let addrs: Vec<_> = ups.iter().map(|u| u.addr).collect();
    let mut reversed = addrs.clone();
    reversed.reverse();
    // The second gateway lists the replicas in another order.
    let mut s1 = spec(vec![model("m", &addrs, 8)]);
    s1.routing.explain = true;
    let mut s2 = spec(vec![model("m", &reversed, 8)]);
    s2.routing.explain = true;
    let (g1, g2) = (gateway(s1).await, gateway(s2).await);
    let mut used = BTreeSet::new();
    for i in 0..24 {
        let first = chat(g1.traffic, conversation(i, 1)).await;
        assert_eq!(first.status, 200);
        let server = first.json()["server"].as_str().unwrap().to_string();
        let header = route_header(&first);
        assert!(header.starts_with("affinity; replica="), "{header}");
        assert!(!header.contains("127.0.0.1"), "no address in the header");
        for turns in 2..4 {
            for g in [&g1, &g2] {
                let later = chat(g.traffic, conversation(i, turns)).await;
                assert_eq!(
                    later.json()["server"],
                    server.as_str(),
                    "conversation {i}, turn {turns}"
                );
                assert_eq!(route_header(&later), header);
            }
        }
        used.insert(server);
    }
    assert!(
        used.len() >= 3,
        "24 conversations spread over the replicas: {used:?}"
    );
    let text = metrics(g1.admin).await;
    assert_eq!(
        sample(
            &text,
            r#"gpuscale_route_decisions_total{model="m",reason="affinity"}"#
        ),
        Some(24.0 * 3.0)
    );
    g1.shutdown().await;
    g2.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_prompt_requests_go_to_the_least_outstanding_replica() {
    let (a, b) = (gated("a", false).await, gated("b", false).await);
    let mut s = spec(vec![model("m", &[a.addr, b.addr], 8)]);
    s.routing.explain = true;
    let g = gateway(s).await;
    // A prompt shorter than a block and an embeddings input: no key.
    let bodies = [
        (
            "/v1/completions",
            r#"{"model":"m","prompt":"hello"}"#.to_string(),
        ),
        (
            "/v1/embeddings",
            format!(r#"{{"model":"m","input":"{}"}}"#, "long ".repeat(200)),
        ),
    ];
    let mut tasks = Vec::new();
    for (path, body) in bodies {
        let addr = g.traffic;
        tasks.push(tokio::spawn(async move {
            send(
                addr,
                "POST",
                path,
                &[("content-type", "application/json")],
                body,
            )
            .await
        }));
        // One at a time, so the second sees the first in flight.
        tokio::time::timeout(Duration::from_secs(5), async {
            while a.received.load(Ordering::SeqCst) + b.received.load(Ordering::SeqCst)
                < tasks.len() as u64
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
    }
    assert_eq!(
        (
            a.received.load(Ordering::SeqCst),
            b.received.load(Ordering::SeqCst)
        ),
        (1, 1),
        "the second request went to the idle replica"
    );
    a.gate.add_permits(10);
    b.gate.add_permits(10);
    for t in tasks {
        let answer = t.await.unwrap();
        assert_eq!(answer.status, 200);
        assert!(route_header(&answer).starts_with("least-loaded; "));
    }
    g.shutdown().await;
}

/// Registers `replica` as a replica of `base` with one adapter loaded.
async fn register_with_adapter(
    admin: std::net::SocketAddr,
    replica: std::net::SocketAddr,
    adapter: &str,
) -> Answer {
    let body = serde_json::json!({
        "model": "base", "endpoint": format!("http://{replica}"), "adapters": [adapter]
    });
    send(
        admin,
        "POST",
        "/v1/replicas",
        &[AUTH, ("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_request_prefers_the_replica_that_has_it() {
    let (a, b) = (gated("a", true).await, gated("b", true).await);
    let mut m = model("base", &[a.addr, b.addr], 8);
    m.adapters = vec!["sql-lora".into()];
    let mut s = spec(vec![m]);
    s.routing.explain = true;
    let g = gateway(s).await;
    // Before any replica says it has the adapter: least-loaded over all.
    let before = post_model(g.traffic, "/v1/chat/completions", "sql-lora").await;
    assert_eq!(before.status, 200);
    assert!(route_header(&before).starts_with("least-loaded; "));
    // b registers again, with the adapter loaded.
    let r = register_with_adapter(g.admin, b.addr, "sql-lora").await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    for _ in 0..6 {
        let answer = post_model(g.traffic, "/v1/chat/completions", "sql-lora").await;
        assert_eq!(answer.json()["server"], "b");
        assert!(route_header(&answer).starts_with("adapter; "));
    }
    // The base model is balanced as before; the adapter counts in its
    // queue, and an adapter the model does not serve is refused.
    let base = post_model(g.traffic, "/v1/chat/completions", "base").await;
    assert!(route_header(&base).starts_with("least-loaded; "));
    let r = register_with_adapter(g.admin, a.addr, "nope").await;
    assert_eq!(r.status, 400);
    assert!(String::from_utf8_lossy(&r.body).contains("`nope` is not an adapter of `base`"));
    let text = metrics(g.admin).await;
    assert_eq!(
        sample(
            &text,
            r#"gpuscale_route_decisions_total{model="base",reason="adapter"}"#
        ),
        Some(6.0)
    );
    assert_eq!(
        sample(&text, r#"gpuscale_requests_total{model="base",code="200"}"#),
        Some(8.0),
        "adapter requests count against the base model"
    );
    let listed = send(g.traffic, "GET", "/v1/models", &[], Bytes::new()).await;
    assert_eq!(listed.status, 200);
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_server_counts_prefix_cache_hits_in_tokens() {
    use gpuscale_gateway::sim::{self, SimProfile};
    let profile = SimProfile {
        prefix_cache_tokens: 16 * 1024,
        ..SimProfile::named("instant", "m").unwrap()
    };
    let server = sim::start(profile, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let system = "abcd".repeat(160); // 640 bytes, 160 tokens
    let user = "efgh".repeat(16); // 64 bytes, 16 tokens
    let turn1 = serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]});
    let turn2 = serde_json::json!({"model": "m", "max_tokens": 1, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user},
        {"role": "assistant", "content": "ijkl".repeat(4)}, {"role": "user", "content": "mnop".repeat(4)}]});
    for body in [&turn1, &turn2] {
        let a = chat(server.addr, body.to_string()).await;
        assert_eq!(a.status, 200);
    }
    let text = send(server.addr, "GET", "/metrics", &[], Bytes::new()).await;
    let text = String::from_utf8(text.body.to_vec()).unwrap();
    // Turn 1 as the server reads it: "system", 0x1f, 640 bytes, 0x1e,
    // "user", 0x1f, 64 bytes, 0x1e = 718 bytes, 11 full blocks of 64
    // bytes. Turn 2 starts with the same bytes: its first 11 blocks hit,
    // 11 × 16 = 176 tokens. Queries are both prompts' tokens: 176, and
    // 176 + 4 + 4 = 184.
    assert_eq!(
        sample(&text, r#"vllm:prefix_cache_hits_total{model_name="m"}"#),
        Some(176.0)
    );
    assert_eq!(
        sample(&text, r#"vllm:prefix_cache_queries_total{model_name="m"}"#),
        Some(176.0 + 184.0)
    );
    server.stop().await;
}
