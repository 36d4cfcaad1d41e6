//! Overload, failures mid-stream, graceful shutdown and sidecar mode, on
//! real loopback sockets.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use gpuscale_gateway::config::{QueueOrder, SidecarSpec};
use gpuscale_gateway::fairness::Client;
use gpuscale_gateway::sim::{self, SimProfile};
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_every_request_and_the_counts_add_up() {
    // Capacity 4 at once, ~50 ms each; 40 clients (10×) for a bounded time.
    let profile = SimProfile {
        decode_tps: 100.0,
        max_concurrency: 4,
        default_max_tokens: 5,
        ..SimProfile::named("instant", "m").unwrap()
    };
    let server = sim::start(profile, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut m = model("m", &[server.addr], 4);
    m.max_queue = Some(8);
    m.queue_timeout = Some(Duration::from_millis(150));
    let gw = gateway(spec(vec![m])).await;
    let traffic = gw.traffic;
    let until = Instant::now() + Duration::from_millis(1500);
    let mut clients = Vec::new();
    for _ in 0..40 {
        clients.push(tokio::spawn(async move {
            let mut codes = Vec::new();
            while Instant::now() < until {
                codes.push(
                    post_model(traffic, "/v1/chat/completions", "m")
                        .await
                        .status,
                );
            }
            codes
        }));
    }
    let mut ok = 0u64;
    let mut refused = 0u64;
    let mut sent = 0u64;
    for c in clients {
        for code in c.await.unwrap() {
            sent += 1;
            match code {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => refused += 1,
                other => panic!("unexpected {other}"),
            }
        }
    }
    assert_eq!(ok + refused, sent);
    assert!(ok > 0 && refused > 0, "ok {ok}, refused {refused}");
    let q = wait_queue(gw.admin, "m", |q| q["in_flight"] == 0 && q["waiting"] == 0).await;
    assert_eq!(q["replicas"], 1);
    // The gateway's counts match what the clients saw and what the server
    // served.
    let text = metrics(gw.admin).await;
    let count = |code: u16| {
        sample(
            &text,
            &format!("gpuscale_requests_total{{model=\"m\",code=\"{code}\"}}"),
        )
        .unwrap_or(0.0) as u64
    };
    assert_eq!(count(200), ok);
    assert_eq!(count(429) + count(503), refused);
    assert_eq!(server.counters.completed.load(Ordering::SeqCst), ok);
    let rejections: f64 = ["queue_full", "queue_timeout", "displaced"]
        .iter()
        .filter_map(|r| {
            sample(
                &text,
                &format!("gpuscale_rejections_total{{model=\"m\",reason=\"{r}\"}}"),
            )
        })
        .sum();
    assert_eq!(rejections as u64, refused);
    gw.shutdown().await;
    server.stop().await;
}

/// An upstream that starts a chunked response, sends one chunk, and dies.
async fn dies_mid_stream() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let _ = s.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(b"c\r\ndata: hello\n\r\n").await;
                tokio::time::sleep(Duration::from_millis(100)).await;
                // Dropped without the last chunk.
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_mid_stream_ends_the_client_stream_with_an_error() {
    let addr = dies_mid_stream().await;
    let gw = gateway(spec(vec![model("m", &[addr], 4)])).await;
    let req = http::Request::post(format!("http://{}/v1/completions", gw.traffic))
        .body(http_body_util::Full::new(Bytes::from(
            r#"{"model":"m","prompt":"x","stream":true}"#,
        )))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(&first[..], b"data: hello\n");
    let end = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the stream ends promptly");
    assert!(
        matches!(end, Some(Err(_))),
        "an error, not a clean end: {end:?}"
    );
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 0).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_requests_in_flight_and_refuses_new_ones() {
    let up = gated("a", false).await;
    let gw = gateway(spec(vec![model("m", &[up.addr], 4)])).await;
    let (traffic, admin) = (gw.traffic, gw.admin);
    let in_flight = tokio::spawn(post_model(traffic, "/v1/chat/completions", "m"));
    wait_queue(admin, "m", |q| q["in_flight"] == 1).await;
    let shared = gw.shared.clone();
    let stopping = tokio::spawn(gw.shutdown());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !shared
        .shutting_down
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // New connections are refused (the listener is closed) or answered 503.
    match tokio::net::TcpStream::connect(traffic).await {
        Err(_) => {}
        Ok(mut tcp) => {
            let body = r#"{"model":"m","prompt":"x"}"#;
            let req = format!(
                "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = tcp.write_all(req.as_bytes()).await;
            let mut buf = vec![0u8; 1024];
            let n = tcp.read(&mut buf).await.unwrap_or(0);
            let text = String::from_utf8_lossy(&buf[..n]);
            assert!(n == 0 || text.starts_with("HTTP/1.1 503"), "{text}");
        }
    }
    assert!(!stopping.is_finished(), "shutdown waits for the request");
    up.gate.add_permits(1);
    assert_eq!(in_flight.await.unwrap().status, StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(5), stopping)
        .await
        .expect("shutdown finishes once drained")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_mode_serves_one_model_from_one_local_upstream() {
    let up = gated("local", true).await;
    let mut s = spec(vec![model("other", &[], 4)]);
    s.sidecar = Some(SidecarSpec {
        model: "m".into(),
        upstream: format!("http://{}", up.addr),
    });
    let gw = gateway(s).await;
    let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["server"], "local");
    let all = send(gw.admin, "GET", "/v1/queues", &[], Bytes::new()).await;
    let models: Vec<String> = all.json()["models"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(models, ["m"], "only the sidecar's model");
    assert_eq!(up.received.load(Ordering::SeqCst), 1);
    gw.shutdown().await;
}

/// A slot granted to a waiter in the instant its client goes away is given
/// back, not lost: the replica keeps its whole capacity.
#[tokio::test]
async fn a_slot_granted_to_a_client_that_just_left_goes_back() {
    use gpuscale_gateway::affinity::Hint;
    use gpuscale_gateway::config::Settings;
    use gpuscale_gateway::state::Shared;
    use gpuscale_policies::Priority;
    let replica: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let settings = Settings::from_spec("t", spec(vec![model("m", &[replica], 1)]), &[]).unwrap();
    let shared = Shared::new(settings);
    let (m, _) = shared.model_for("m").unwrap();
    let m = m.clone();
    let hint = Hint::default();
    let first = shared
        .admit(&m, Priority::Standard, hint, Client::default())
        .await
        .unwrap();
    // A second request waits in the queue…
    let mut waiting = Box::pin(shared.admit(&m, Priority::Standard, hint, Client::default()));
    assert!(
        tokio::time::timeout(Duration::from_millis(20), &mut waiting)
            .await
            .is_err()
    );
    assert_eq!(shared.queues().models["m"].waiting, 1);
    // …is granted the slot the first frees, and its client is gone
    // before it ever sees it.
    drop(first);
    drop(waiting);
    let q = shared.queues().models["m"].clone();
    assert_eq!((q.waiting, q.in_flight), (0, 0), "{q:?}");
    // The replica's one slot is free: a new request gets it at once.
    let again = tokio::time::timeout(
        Duration::from_millis(100),
        shared.admit(&m, Priority::Standard, hint, Client::default()),
    )
    .await;
    assert!(matches!(again, Ok(Ok(_))), "the slot was lost");
}

/// Sends a chat request whose body is `pad` bytes longer than the bare
/// one: the gated upstream echoes the length, which tells the requests
/// apart.
async fn padded(addr: std::net::SocketAddr, pad: usize) -> Answer {
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(pad)}]});
    send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.to_string(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backed_up_queue_serves_its_newest_waiter_first_and_counts_it() {
    // One slot. A takes it; B queues, waits past the 200 ms budget, C
    // queues behind it. When A finishes, adaptive LIFO hands the slot to
    // C (B has missed its budget whatever happens next); under `order:
    // fifo`, to B.
    for (order, first, second) in [(None, 2, 1), (Some(QueueOrder::Fifo), 1, 2)] {
        let up = gated("one", false).await;
        let mut m = model("m", &[up.addr], 1);
        m.order = order;
        let mut s = spec(vec![m]);
        s.queue.newest_first_after = Duration::from_millis(200);
        let gw = gateway(s).await;
        let (traffic, admin) = (gw.traffic, gw.admin);
        let a = tokio::spawn(padded(traffic, 0));
        while up.received.load(Ordering::SeqCst) < 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let b = tokio::spawn(padded(traffic, 1000));
        wait_queue(admin, "m", |q| q["waiting"] == 1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let c = tokio::spawn(padded(traffic, 2000));
        let q = wait_queue(admin, "m", |q| q["waiting"] == 2).await;
        assert!(q["oldest_wait_ms"].as_f64().unwrap() >= 300.0, "{q}");
        assert_eq!(q["newest_first"], order.is_none(), "{order:?}: {q}");
        let len = |a: &Answer| a.json()["body_len"].as_u64().unwrap();
        up.gate.add_permits(1);
        let base = len(&a.await.unwrap());
        // The next one to reach the upstream finishes next.
        up.gate.add_permits(1);
        let (mut b, mut c) = (b, c);
        let (done, b_done) = tokio::select! {
            r = &mut b => (r.unwrap(), true),
            r = &mut c => (r.unwrap(), false),
        };
        assert_eq!(done.status, StatusCode::OK);
        assert_eq!(len(&done) - base, [1000, 2000][first - 1], "{order:?}");
        up.gate.add_permits(1);
        let last = if b_done { c.await } else { b.await }.unwrap();
        assert_eq!(len(&last) - base, [1000, 2000][second - 1]);
        let overtook = sample(
            &metrics(admin).await,
            r#"gpuscale_queue_newest_first_total{model="m"}"#,
        );
        assert_eq!(
            overtook,
            Some(if order.is_none() { 1.0 } else { 0.0 }),
            "{order:?}"
        );
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_ends_refused_counts_in_the_queue_wait_figures() {
    // Served newest first, the longest waits are those that time out: a
    // p95 of the served alone would read a healthy queue while requests
    // are refused.
    let up = gated("busy", false).await;
    let mut m = model("m", &[up.addr], 1);
    m.queue_timeout = Some(Duration::from_millis(400));
    let gw = gateway(spec(vec![m])).await;
    let (traffic, admin) = (gw.traffic, gw.admin);
    let first = tokio::spawn(padded(traffic, 0));
    while up.received.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = padded(traffic, 0).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    let q = queue(admin, "m").await;
    let p95 = q["queue_wait_p95_ms"].as_f64().unwrap();
    assert!(p95 >= 400.0, "the refused wait counts: {q}");
    let text = metrics(admin).await;
    assert_eq!(
        sample(&text, r#"gpuscale_queue_wait_seconds_count{model="m"}"#),
        Some(2.0),
        "the first request, at once, and the refused one: {text}"
    );
    up.gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    gw.shutdown().await;
}
