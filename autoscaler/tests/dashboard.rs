//! The dashboard's view over a real plan (MIG instances at the slots and
//! sizes NVIDIA's H100 MIG table gives), SLO judgement from a `/v1/queues`
//! document, the time series' window, and the admin listener serving the
//! page, the view and its server-sent events.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use gpuscale_autoscaler::controller::{DecisionView, ModelDecisions, Report};
use gpuscale_autoscaler::dashboard::{self, HISTORY_SPAN, Live, SAMPLE_EVERY, Sample};
use gpuscale_packer::{PackOptions, pack_from};

mod common;

/// One node of two H100s that allow MIG only, and a 30 GiB model that
/// allows only MIG slices; loaded as the binary loads them.
fn bundle() -> (gpuscale_policies::Cluster, Vec<gpuscale_policies::Model>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cluster.yaml"),
        "apiVersion: gpuscale.io/v1alpha1\nkind: Cluster\nmetadata: {name: one}\nspec:\n  nodes:\n    - {name: n0, gpuModel: H100-80GB, gpuCount: 2, sharing: [mig]}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("policy.yaml"),
        "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata: {name: mid}\nspec:\n  servedName: org/mid\n  resources: {memoryGiB: 30, compute: 0.3, maxConcurrency: 8}\n  placement: {sharing: [mig]}\n  slo: {latencyP95: 1s}\n  scaling: {minReplicas: 2, maxReplicas: 4}\n",
    )
    .unwrap();
    let b = gpuscale_policies::load::load_paths(&[
        dir.path().join("cluster.yaml"),
        dir.path().join("policy.yaml"),
    ])
    .unwrap();
    (b.cluster.unwrap(), b.models)
}

fn decided(desired: u32, ready: u32) -> BTreeMap<String, ModelDecisions> {
    let view = DecisionView {
        desired,
        ready,
        mode: gpuscale_autoscaler::Mode::Normal,
        reason: "because".into(),
        at: "2026-12-03T00:00:00.000Z".into(),
    };
    let d = ModelDecisions {
        latest: Some(view.clone()),
        history: [view].into(),
    };
    BTreeMap::from([("mid".to_string(), d)])
}

/// The view of [`bundle`] with `replicas` of its model packed.
fn planned(replicas: u32, decisions: BTreeMap<String, ModelDecisions>) -> dashboard::View {
    let (cluster, models) = bundle();
    let plan = pack_from(
        &cluster,
        &models,
        &BTreeMap::from([("mid".to_string(), replicas)]),
        &PackOptions::default(),
        None,
    )
    .unwrap();
    let live = Live {
        plan: Some(Arc::new(plan)),
        ..Live::default()
    };
    dashboard::view(0.0, &models, Some(&cluster), &live, &decisions)
}

#[test]
fn the_gpu_map_draws_mig_instances_at_their_slots_with_their_replicas() {
    let v = planned(3, decided(3, 3));
    assert_eq!(v.nodes.len(), 1);
    assert_eq!(v.nodes[0].gpus.len(), 2);
    let parts: Vec<_> = v.nodes[0].gpus.iter().flat_map(|g| &g.parts).collect();
    assert_eq!(parts.len(), 3, "{v:#?}");
    for g in &v.nodes[0].gpus {
        assert_eq!(g.mig_slots, Some(8), "an H100 has 8 memory slots");
        // Instances never overlap and stay inside the 8 slots.
        let mut used = [false; 8];
        for i in &g.instances {
            for s in i.start..i.start + i.slots {
                assert!(!used[s as usize], "{g:#?}");
                used[s as usize] = true;
            }
        }
        for p in &g.parts {
            // 30 GiB needs a 40 GB slice: 3g.40gb or 4g.40gb, four of
            // the eight memory slots (NVIDIA's H100 MIG table), at slot 0
            // or 4 for 3g and 0 for 4g.
            let profile = p.profile.as_deref().unwrap();
            let inst = g
                .instances
                .iter()
                .find(|i| Some(i.start) == p.start)
                .expect("the replica's instance is drawn");
            assert_eq!(inst.profile, profile);
            assert_eq!(inst.slots, 4, "{profile}");
            match profile {
                "3g.40gb" => assert!(matches!(p.start, Some(0 | 4))),
                "4g.40gb" => assert_eq!(p.start, Some(0)),
                other => panic!("unexpected profile {other}"),
            }
            // An H100's 3g instance has 60 of its 132 SMs, its 4g 64
            // (`nvidia-smi mig -lgip`), not 3 or 4 sevenths.
            let sms = if profile == "3g.40gb" { 60.0 } else { 64.0 };
            assert!((p.compute_share - sms / 132.0).abs() < 1e-9, "{p:?}");
            assert!((p.memory_gib - 30.0).abs() < 1e-9);
        }
        let mem: f64 = g.parts.iter().map(|p| p.memory_gib).sum::<f64>() / g.memory_gib;
        assert!((g.memory_used - mem).abs() < 1e-9);
    }
    assert_eq!(v.summary.gpus, 2);
    assert_eq!(v.summary.gpus_used, 2);
    assert_eq!(v.models[0].desired, 3);
    assert_eq!(
        v.models[0].changed_at.as_deref(),
        Some("2026-12-03T00:00:00.000Z")
    );
}

#[test]
fn a_model_is_judged_against_the_slo_it_declares() {
    let (cluster, models) = bundle();
    let queues = |latency_ms: Option<f64>, rate: f64| {
        let mut q = serde_json::json!({"waiting": 3, "server_waiting": 2, "in_flight": 5,
            "arrival_rate": {"10s": rate}});
        if let Some(l) = latency_ms {
            // The SLO counts from arrival: the total is judged; the time
            // after the queue alone (fast here) is not.
            q["latency_total_p95_ms"] = l.into();
            q["latency_p95_ms"] = 100.0.into();
        }
        serde_json::json!({"models": {"org/mid": q}})
    };
    let within = |doc: serde_json::Value| {
        let live = Live {
            queues: Some(doc),
            ..Live::default()
        };
        dashboard::view(0.0, &models, Some(&cluster), &live, &decided(2, 2)).models[0].within_slo
    };
    // latencyP95 1s.
    assert_eq!(within(queues(Some(1500.0), 1.0)), Some(false));
    assert_eq!(within(queues(Some(900.0), 1.0)), Some(true));
    assert_eq!(within(queues(None, 1.0)), None);
    // The sample counts waiting in the gateway and in the servers, and
    // judges only models with traffic.
    let s = dashboard::sample(
        1.0,
        &models,
        Some(&cluster),
        None,
        Some(&queues(Some(1500.0), 2.0)),
        &decided(2, 1),
    );
    assert_eq!(s.waiting, 5.0);
    assert_eq!(s.load, 2.0);
    assert_eq!((s.ready, s.desired), (1, 2));
    assert_eq!(s.within_slo, Some(0.0));
    let idle = dashboard::sample(
        1.0,
        &models,
        Some(&cluster),
        None,
        Some(&queues(Some(1500.0), 0.0)),
        &decided(2, 1),
    );
    assert_eq!(idle.within_slo, None);
}

#[test]
fn the_time_series_keeps_a_sample_every_two_seconds_for_fifteen_minutes() {
    let at = |t: f64| Sample {
        t,
        load: 0.0,
        waiting: 0.0,
        ready: 0,
        desired: 0,
        allocated: 0.0,
        memory: 0.0,
        compute: 0.0,
        within_slo: None,
        models: BTreeMap::new(),
    };
    let mut live = Live::default();
    let every = SAMPLE_EVERY.as_secs_f64();
    live.push(at(0.0));
    live.push(at(every / 2.0)); // too soon: dropped
    assert_eq!(live.history.len(), 1);
    let mut t = 0.0;
    while t < 2.0 * HISTORY_SPAN.as_secs_f64() {
        t += every;
        live.push(at(t));
    }
    let span = live.history.back().unwrap().t - live.history.front().unwrap().t;
    assert!(
        span <= HISTORY_SPAN.as_secs_f64() && span > HISTORY_SPAN.as_secs_f64() - 2.0 * every,
        "{span}"
    );
    assert_eq!(
        live.history.len(),
        (HISTORY_SPAN.as_secs_f64() / every) as usize + 1
    );
}

/// An admin listener over an empty report; it serves while the returned
/// sender lives.
async fn admin() -> (std::net::SocketAddr, tokio::sync::watch::Sender<bool>) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (addr, _task) = gpuscale_autoscaler::admin::serve(
        "127.0.0.1:0".parse().unwrap(),
        Report::default(),
        stopped,
    )
    .await
    .unwrap();
    (addr, stop)
}

#[tokio::test]
async fn the_admin_port_serves_the_page_the_view_and_its_event_stream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, _stop) = admin().await;
    let (status, page) = common::admin_get(addr, "/").await;
    assert_eq!(status, 200);
    assert!(page.contains("<script type=\"module\">") && page.contains("/v1/dashboard/events"));
    // No CDN: the page loads nothing from elsewhere (the one URL in it is
    // the SVG namespace, a name, not a fetch).
    let elsewhere = page.replace("\"http://www.w3.org/2000/svg\"", "");
    for needle in ["http://", "https://", "src=", "<link", "import "] {
        assert!(!elsewhere.contains(needle), "the page has `{needle}`");
    }
    let (status, body) = common::admin_get(addr, "/v1/dashboard").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["nodes"].is_array() && v["models"].is_array() && v["history"].is_array());
    // Read-only: a write is refused whatever the path.
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("{method} /v1/dashboard HTTP/1.1\r\nhost: localhost\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 405"), "{method}: {text}");
        assert!(
            text.to_ascii_lowercase().contains("allow: get, head"),
            "{text}"
        );
    }
    // Two events in a row on one connection.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /v1/dashboard/events HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = String::new();
    let mut buf = [0u8; 4096];
    tokio::time::timeout(Duration::from_secs(5), async {
        while got.matches("data: {").count() < 2 {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed: {got}");
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no two events in 5 s: {got}"));
    assert!(got.contains("content-type: text/event-stream"), "{got}");
}

#[tokio::test]
async fn dashboard_streams_are_capped_so_health_checks_always_get_through() {
    use gpuscale_autoscaler::admin::MAX_EVENT_STREAMS;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, _stop) = admin().await;
    let open = |n: usize| async move {
        let mut held = Vec::new();
        for _ in 0..n {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /v1/dashboard/events HTTP/1.1\r\nhost: localhost\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await.unwrap();
            held.push((s, String::from_utf8_lossy(&buf[..n]).to_string()));
        }
        held
    };
    let held = open(MAX_EVENT_STREAMS).await;
    assert!(
        held.iter()
            .all(|(_, head)| head.starts_with("HTTP/1.1 200"))
    );
    let more = open(1).await;
    assert!(more[0].1.starts_with("HTTP/1.1 503"), "{}", more[0].1);
    let (status, _) = common::admin_get(addr, "/healthz").await;
    assert_eq!(status, 200);
    // Closed streams give their places back.
    drop(held);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let again = open(1).await;
    assert!(again[0].1.starts_with("HTTP/1.1 200"), "{}", again[0].1);
}

/// Connections that fill the whole port (half-sent heads) cannot fail the
/// kubelet's probes: over the cap `/healthz` and `/readyz` get their real
/// answers, anything else 503.
#[tokio::test]
async fn probes_get_through_a_port_full_of_idle_connections() {
    use gpuscale_autoscaler::admin::MAX_CONNECTIONS;
    use tokio::io::AsyncWriteExt;
    let (addr, _stop) = admin().await;
    let mut held = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, body) = common::admin_get(addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _) = common::admin_get(addr, "/v1/decisions").await;
    assert_eq!(status, 503);
    drop(held);
}

#[test]
fn replicas_that_found_no_gpu_are_shown_with_their_model() {
    // Two H100s hold at most four 40 GB slices (two each: NVIDIA's H100
    // table has 8 memory slots, a 40 GB slice takes 4): the fifth
    // replica finds no GPU.
    let v = planned(5, decided(4, 4));
    assert_eq!(v.models[0].unplaced, 1, "{:?}", v.models[0]);
    assert_eq!(v.summary.unplaced, 1);
    let placed: usize = v.nodes[0].gpus.iter().map(|g| g.parts.len()).sum();
    assert_eq!(placed, 4);
}

/// The admin listener on loopback (the dashboard of `gpuscale up`)
/// refuses what a web page's browser sends there: a `Host` of a DNS name
/// rebound to 127.0.0.1 (the page would read the dashboard as its own
/// origin's) and another origin's `Origin`; its own page's requests
/// (same origin) are served.
#[tokio::test]
async fn a_rebound_name_or_another_origin_cannot_read_the_dashboard() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (addr, _stop) = admin().await;
    let port = addr.port();
    let get = |fields: String| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET /v1/dashboard HTTP/1.1\r\n{fields}connection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        text
    };
    let rebound = get(format!("host: attacker.example:{port}\r\n")).await;
    assert!(rebound.starts_with("HTTP/1.1 403"), "{rebound}");
    let cross = get(format!(
        "host: 127.0.0.1:{port}\r\norigin: http://evil.example\r\n"
    ))
    .await;
    assert!(cross.starts_with("HTTP/1.1 403"), "{cross}");
    let own = get(format!(
        "host: 127.0.0.1:{port}\r\norigin: http://127.0.0.1:{port}\r\n"
    ))
    .await;
    assert!(own.starts_with("HTTP/1.1 200"), "{own}");
}
