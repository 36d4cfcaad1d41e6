//! Several instances of the gateway in front of the same replicas (2 or
//! more central replicas for availability): three real gateways in this
//! process in front of two simulated model servers, driven through the
//! autoscaler's `GatewayClient` as the controller drives them.
//!
//! - Each gateway takes an equal share of a replica's `maxConcurrency`, so
//!   under load spread over all three no replica ever holds more than its
//!   limit (the simulated servers count what they hold at once); the same
//!   load with the full limit registered at each gateway overshoots it.
//! - The queue the autoscaler observes is the sum over the gateways, and
//!   a gateway that cannot be read fails the read.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use gpuscale_autoscaler::observe::{GatewayClient, observations};
use gpuscale_gateway::auth::AdminToken;
use gpuscale_gateway::config::GatewaySpec;
use gpuscale_gateway::sim::{self, SimProfile, SimServer};
use gpuscale_gateway::{Running, Settings};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const TOKEN: &str = "three-gateways-test-token-0123456789";
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
const IDLE: &str = "idle-model";
/// The replicas' limit (the policy's `maxConcurrency`).
const LIMIT: u32 = 6;

async fn gateway() -> Running {
    let spec: GatewaySpec = serde_json::from_value(serde_json::json!({
        "listen": "127.0.0.1:0",
        "admin": "127.0.0.1:0",
        "drain": {"announce": "0s", "timeout": "5s"},
        "queue": {"maxQueue": 1024, "queueTimeout": "60s"},
        "models": [
            {"name": MODEL, "maxConcurrency": LIMIT},
            {"name": IDLE, "maxConcurrency": LIMIT},
        ],
    }))
    .unwrap();
    let mut settings = Settings::from_spec("test", spec, &[]).unwrap();
    settings.admin_token = Some(AdminToken::from_secret(TOKEN).unwrap());
    gpuscale_gateway::start(settings).await.unwrap()
}

async fn server() -> SimServer {
    let mut p = SimProfile::named("small", MODEL).unwrap();
    // The server itself holds many at once: the gateways' limit is what
    // is under test.
    p.max_concurrency = 256;
    sim::start(p, "127.0.0.1:0".parse().unwrap()).await.unwrap()
}

/// Sends `n` chat requests for `model` to each traffic address at once;
/// the status of every answer.
async fn load(traffic: &[SocketAddr], model: &str, n: usize) -> Vec<u16> {
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut set = tokio::task::JoinSet::new();
    for (i, addr) in traffic.iter().cycle().take(n * traffic.len()).enumerate() {
        let client = client.clone();
        let body = serde_json::json!({"model": model, "max_tokens": 12 + (i % 5) as u32,
            "messages": [{"role": "user", "content": "tell me about GPUs"}]})
        .to_string();
        let uri = format!("http://{addr}/v1/chat/completions");
        set.spawn(async move {
            let req = http::Request::post(uri)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let resp = client.request(req).await.unwrap();
            let status = resp.status().as_u16();
            let _ = resp.into_body().collect().await;
            status
        });
    }
    let mut out = Vec::new();
    while let Some(s) = set.join_next().await {
        out.push(s.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_gateways_share_each_replicas_limit_and_their_queues_add_up() {
    let gateways = [gateway().await, gateway().await, gateway().await];
    let admins: Vec<String> = gateways
        .iter()
        .map(|g| format!("http://{}", g.admin))
        .collect();
    let traffic: Vec<SocketAddr> = gateways.iter().map(|g| g.traffic).collect();
    let client = GatewayClient::new_many(admins.clone())
        .with_token(TOKEN)
        .unwrap();

    // Shared: each gateway takes 6 / 3 = 2 of each replica.
    let servers = [server().await, server().await];
    for s in &servers {
        client
            .replica(true, MODEL, &format!("http://{}", s.addr), Some(LIMIT))
            .await
            .unwrap();
    }
    let listed = client.replica_list().await.unwrap();
    assert_eq!(listed[MODEL].len(), 2, "both replicas at every gateway");
    let statuses = load(&traffic, MODEL, 40).await;
    assert_eq!(statuses.len(), 120);
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    for s in &servers {
        let peak = s.counters.peak_in_flight.load(Ordering::Relaxed);
        assert!(peak >= 2, "the load reached the replica: {peak}");
        assert!(
            peak <= u64::from(LIMIT),
            "a replica held {peak} requests at once; its limit is {LIMIT}"
        );
    }

    // The control: the full limit registered at each gateway, as three
    // unaware gateways would take it, overshoots it under the same load.
    let unaware = [server().await, server().await];
    for s in &unaware {
        for admin in &admins {
            GatewayClient::new(admin)
                .with_token(TOKEN)
                .unwrap()
                .replica(true, MODEL, &format!("http://{}", s.addr), Some(LIMIT))
                .await
                .unwrap();
        }
    }
    for s in &servers {
        client
            .replica(false, MODEL, &format!("http://{}", s.addr), None)
            .await
            .unwrap();
    }
    let statuses = load(&traffic, MODEL, 40).await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let overshoot = unaware
        .iter()
        .map(|s| s.counters.peak_in_flight.load(Ordering::Relaxed))
        .max()
        .unwrap();
    assert!(
        overshoot > u64::from(LIMIT),
        "three gateways each allowed {LIMIT}: the replica should have held more, held {overshoot}"
    );

    // Queues add up: 2, 3 and 4 requests wait at the three gateways for a
    // model with no replica; the autoscaler observes 9.
    let mut waiting = tokio::task::JoinSet::new();
    for (i, addr) in traffic.iter().enumerate() {
        let addr = *addr;
        waiting.spawn(async move { load(&[addr], IDLE, i + 2).await });
    }
    let mut seen = 0.0;
    for _ in 0..100 {
        let doc = client.queues().await.unwrap();
        seen = observations(&doc)[IDLE].waiting;
        if seen >= 9.0 {
            assert_eq!(doc["gateways"], 3);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(seen, 9.0, "the sum over the three gateways");
    for (i, admin) in admins.iter().enumerate() {
        let one = GatewayClient::new(admin).queues().await.unwrap();
        assert_eq!(
            observations(&one)[IDLE].waiting,
            (i + 2) as f64,
            "gateway {i} alone"
        );
    }

    // A gateway that cannot be read fails the read: not an empty queue.
    let mut gateways = Vec::from(gateways);
    gateways.pop().unwrap().shutdown().await;
    assert!(client.queues().await.is_err());
    waiting.abort_all();
    for g in gateways {
        g.shutdown().await;
    }
}

#[tokio::test]
async fn a_token_the_gateway_refuses_is_found_before_any_registration() {
    let g = gateway().await;
    let base = format!("http://{}", g.admin);
    // The right token: accepted (the probe changes nothing).
    let right = GatewayClient::new(&base).with_token(TOKEN).unwrap();
    right.check_admin_access().await.unwrap();
    let listed = right.replica_list().await.unwrap();
    assert!(
        listed.values().all(|r| r.is_empty()),
        "the probe registered nothing: {listed:?}"
    );
    // A wrong token, and none: refused, with the reason.
    let wrong = GatewayClient::new(&base)
        .with_token("a-wrong-token-of-enough-length")
        .unwrap();
    let e = wrong.check_admin_access().await.unwrap_err().to_string();
    assert!(e.contains("refuses the admin token (401)"), "{e}");
    let e = GatewayClient::new(&base)
        .check_admin_access()
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("401"), "{e}");
    g.shutdown().await;
    // A gateway that does not answer (yet): no error.
    right.check_admin_access().await.unwrap();
}
