//! The gateway on real loopback sockets: routing, passthrough, queueing,
//! overflow, scale from zero, cancellation, retries, ejection, limits.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use gpuscale_gateway::sim::{self, SimProfile};
use http::StatusCode;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_by_body_header_and_path() {
    let a = gated("a", true).await;
    let b = gated("b", true).await;
    let gw = gateway(spec(vec![
        model("m-a", &[a.addr], 4),
        model("m-b", &[b.addr], 4),
    ]))
    .await;

    let r = post_model(gw.traffic, "/v1/chat/completions", "m-a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["server"], "a");
    assert_eq!(r.json()["path"], "/v1/chat/completions");

    // The header routes a request whose body names a model the gateway
    // does not serve (a name only the model server knows)...
    let traffic = gw.traffic;
    let with_header = |path: &'static str, body_model: Option<&str>| {
        let body = body_model.map_or("{}".to_string(), |m| {
            serde_json::json!({"model": m, "prompt": "x"}).to_string()
        });
        async move { send(traffic, "POST", path, &[("x-gpuscale-model", "m-b")], body).await }
    };
    let r = with_header("/v1/completions", Some("b-alias")).await;
    assert_eq!(r.json()["server"], "b");
    // ...but not one whose body or path names another served model: it
    // would wait in m-b's queue, at m-b's priority and concurrency, for
    // a replica that runs m-a (on a server hosting both). Refused, and
    // nothing forwarded.
    let r = with_header("/v1/completions", Some("m-a")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("`m-b`") && message.contains("`m-a`"),
        "{message}"
    );
    let r = with_header("/v2/models/m-a/infer", None).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    // The same model both ways is no conflict.
    let r = with_header("/v1/completions", Some("m-b")).await;
    assert_eq!(r.json()["server"], "b");

    // KServe v2 by path.
    let r = send(gw.traffic, "POST", "/v2/models/m-b/infer", &[], "{}").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["server"], "b");
    assert_eq!(r.json()["path"], "/v2/models/m-b/infer");

    // /v1/models lists the configured models.
    let r = send(gw.traffic, "GET", "/v1/models", &[], Bytes::new()).await;
    let ids: Vec<String> = r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, ["m-a", "m-b"]);

    // Unknown model: 404 with an OpenAI-style error.
    let r = post_model(gw.traffic, "/v1/chat/completions", "nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`nope` does not exist")
    );
    // No model at all: 400.
    let r = send(
        gw.traffic,
        "POST",
        "/v1/embeddings",
        &[],
        r#"{"input":"x"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(a.received.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(b.received.load(std::sync::atomic::Ordering::SeqCst), 3);
    gw.shutdown().await;
}

/// Posts `body` to `/v1/completions` on a connection of its own: the
/// first bytes of the answer, and the connection (kept open).
async fn first_bytes(traffic: std::net::SocketAddr, body: &str) -> (String, tokio::net::TcpStream) {
    let mut tcp = tokio::net::TcpStream::connect(traffic).await.unwrap();
    tcp.write_all(
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tcp.read(&mut buf).await.unwrap();
    (String::from_utf8_lossy(&buf[..n]).to_string(), tcp)
}

/// A simulated server of model `m` at 20 tokens per second (50 ms per
/// token), on loopback.
async fn slow_server() -> sim::SimServer {
    let profile = SimProfile {
        decode_tps: 20.0,
        ..SimProfile::named("instant", "m").unwrap()
    };
    sim::start(profile, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_pass_through_byte_for_byte_and_unbuffered() {
    let server = slow_server().await;
    let gw = gateway(spec(vec![model("m", &[server.addr], 4)])).await;
    let body = serde_json::json!({"model": "m", "stream": true, "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.traffic))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(Bytes::from(body)))
        .unwrap();
    let t0 = Instant::now();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    let mut chunks = Vec::new();
    let mut first_at = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        if let Ok(data) = frame.into_data() {
            first_at.get_or_insert(t0.elapsed());
            chunks.extend_from_slice(&data);
        }
    }
    let total = t0.elapsed();
    // Ten tokens take ~450 ms; the first arrives long before the end.
    assert!(
        first_at.unwrap() < total / 2,
        "first chunk at {first_at:?} of {total:?}: buffered"
    );
    // Byte for byte what the server sends: its chunks are deterministic but
    // for the id and timestamp, which the gateway must not touch.
    let text = String::from_utf8(chunks).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 12, "10 tokens + the end chunk + [DONE]");
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let content: String = events[..10]
        .iter()
        .map(|e| {
            let v: serde_json::Value =
                serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap();
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let expected: String = (0..10).map(sim::token).collect();
    assert_eq!(content, expected);
    // TTFT is measured for streams.
    let q = wait_queue(gw.admin, "m", |q| q["in_flight"] == 0).await;
    assert!(q["ttft_p95_ms"].as_f64().is_some(), "{q}");
    gw.shutdown().await;
    server.stop().await;
}

/// `/v1/queues` gives the latency after the queue (the service time the
/// autoscaler reads) and the latency from arrival (what the SLO counts,
/// and what `gpuscale up`'s summary and the dashboard judge): a request
/// that waited for the only slot has the second well above the first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latency_from_arrival_counts_the_queue_wait() {
    let server = slow_server().await;
    let gw = gateway(spec(vec![model("m", &[server.addr], 1)])).await;
    let body = serde_json::json!({"model": "m", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let mut calls = Vec::new();
    for _ in 0..2 {
        let req = http::Request::post(format!("http://{}/v1/chat/completions", gw.traffic))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from(body.clone())))
            .unwrap();
        calls.push(tokio::spawn(async move {
            let resp = client().request(req).await.unwrap();
            let status = resp.status();
            resp.into_body().collect().await.unwrap();
            status
        }));
    }
    for c in calls {
        assert_eq!(c.await.unwrap(), StatusCode::OK);
    }
    let q = wait_queue(gw.admin, "m", |q| q["in_flight"] == 0 && q["waiting"] == 0).await;
    let after_queue = q["latency_p95_ms"].as_f64().unwrap();
    let from_arrival = q["latency_total_p95_ms"].as_f64().unwrap();
    // Each takes ~450 ms on the replica; the second waited as long first.
    assert!(after_queue < 800.0, "{q}");
    assert!(from_arrival > after_queue + 300.0, "{q}");
    gw.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturation_queues_with_exact_counts_then_overflows_with_429() {
    let up = gated("a", false).await;
    let mut m = model("m", &[up.addr], 2);
    m.max_queue = Some(3);
    let mut sp = spec(vec![m]);
    // The test client is a trusted proxy: its priority header counts.
    sp.priorities.trusted_networks = vec!["127.0.0.0/8".parse().unwrap()];
    let gw = gateway(sp).await;
    let traffic = gw.traffic;
    let mut tasks = Vec::new();
    for _ in 0..5 {
        tasks.push(tokio::spawn(post_model(
            traffic,
            "/v1/chat/completions",
            "m",
        )));
    }
    let q = wait_queue(gw.admin, "m", |q| q["waiting"] == 3 && q["in_flight"] == 2).await;
    assert_eq!(q["replicas"], 1);
    assert_eq!(q["capacity"], 2);
    assert_eq!(q["waiting_by_priority"]["standard"], 3);
    let text = metrics(gw.admin).await;
    assert_eq!(
        sample(&text, "gpuscale_queue_depth{model=\"m\"}"),
        Some(3.0)
    );
    assert_eq!(sample(&text, "gpuscale_in_flight{model=\"m\"}"), Some(2.0));
    assert_eq!(sample(&text, "gpuscale_replicas{model=\"m\"}"), Some(1.0));

    // The queue is full: the sixth is refused with Retry-After.
    let r = post_model(traffic, "/v1/chat/completions", "m").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers.contains_key("retry-after"));
    // A critical request displaces a standard one.
    let body = serde_json::json!({"model": "m", "prompt": "x"}).to_string();
    let critical = tokio::spawn(async move {
        send(
            traffic,
            "POST",
            "/v1/completions",
            &[("x-gpuscale-priority", "critical")],
            body,
        )
        .await
    });
    wait_queue(gw.admin, "m", |q| q["waiting_by_priority"]["critical"] == 1).await;

    up.gate.add_permits(100);
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap().status.as_u16());
    }
    codes.sort();
    assert_eq!(
        codes,
        [200, 200, 200, 200, 429],
        "one standard waiter displaced"
    );
    assert_eq!(critical.await.unwrap().status, StatusCode::OK);
    let q = wait_queue(gw.admin, "m", |q| q["in_flight"] == 0).await;
    assert_eq!(q["waiting"], 0);
    let text = metrics(gw.admin).await;
    assert_eq!(
        sample(&text, "gpuscale_requests_total{model=\"m\",code=\"200\"}"),
        Some(5.0)
    );
    assert_eq!(
        sample(&text, "gpuscale_requests_total{model=\"m\",code=\"429\"}"),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "gpuscale_rejections_total{model=\"m\",reason=\"queue_full\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            "gpuscale_rejections_total{model=\"m\",reason=\"displaced\"}"
        ),
        Some(1.0)
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_past_the_queue_timeout_gets_503_with_retry_after() {
    let up = gated("a", false).await;
    let mut m = model("m", &[up.addr], 1);
    m.queue_timeout = Some(Duration::from_millis(200));
    let gw = gateway(spec(vec![m])).await;
    let traffic = gw.traffic;
    let first = tokio::spawn(post_model(traffic, "/v1/chat/completions", "m"));
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 1).await;
    let r = post_model(traffic, "/v1/chat/completions", "m").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(queue(gw.admin, "m").await["waiting"], 0);
    up.gate.add_permits(1);
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    gw.shutdown().await;
}

/// `GET /v1/replicas` tells the replicas written in the gateway's file
/// from those registered through the API, so a controller cleaning up
/// what it registered leaves the operator's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replica_list_says_which_replicas_the_file_configured() {
    let written = gated("written", true).await;
    let gw = gateway(spec(vec![model("m", &[written.addr], 4)])).await;
    let joined = gated("joined", true).await;
    let body = serde_json::json!({"model": "m", "endpoint": format!("http://{}", joined.addr)});
    let r = send(gw.admin, "POST", "/v1/replicas", &[AUTH], body.to_string()).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = send(gw.admin, "GET", "/v1/replicas", &[AUTH], String::new()).await;
    let listed: Vec<(String, bool)> = r.json()["m"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["endpoint"].as_str().unwrap().to_string(),
                e["configured"].as_bool().unwrap(),
            )
        })
        .collect();
    let mut want = vec![
        (format!("http://{}", written.addr), true),
        (format!("http://{}", joined.addr), false),
    ];
    want.sort();
    let mut listed = listed;
    listed.sort();
    assert_eq!(listed, want);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_no_replica_holds_requests_and_signals_until_one_registers() {
    let gw = gateway(spec(vec![model("m", &[], 4)])).await;
    let mut signals = gw.signals();
    let traffic = gw.traffic;
    let held = tokio::spawn(post_model(traffic, "/v1/chat/completions", "m"));
    let signal = tokio::time::timeout(Duration::from_secs(5), signals.recv())
        .await
        .expect("a scale-from-zero signal")
        .unwrap();
    assert_eq!(signal.model, "m");
    assert_eq!(signal.waiting, 1);
    wait_queue(gw.admin, "m", |q| q["waiting"] == 1 && q["replicas"] == 0).await;

    let up = gated("late", true).await;
    let body = serde_json::json!({"model": "m", "endpoint": format!("http://{}", up.addr)});
    let r = send(gw.admin, "POST", "/v1/replicas", &[AUTH], body.to_string()).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let answer = held.await.unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["server"], "late");
    let q = queue(gw.admin, "m").await;
    assert_eq!(q["replicas"], 1);
    assert_eq!(q["waiting"], 0);

    // Deregistering takes it out of the pool.
    let r = send(
        gw.admin,
        "DELETE",
        "/v1/replicas",
        &[AUTH],
        body.to_string(),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(queue(gw.admin, "m").await["replicas"], 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_cancels_the_upstream_request() {
    let server = slow_server().await;
    let gw = gateway(spec(vec![model("m", &[server.addr], 4)])).await;
    let mut tcp = tokio::net::TcpStream::connect(gw.traffic).await.unwrap();
    let body = r#"{"model":"m","stream":true,"max_tokens":200,"prompt":"hi"}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tcp.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 1).await;
    drop(tcp);
    let deadline = Instant::now() + Duration::from_secs(3);
    while server
        .counters
        .cancelled
        .load(std::sync::atomic::Ordering::SeqCst)
        == 0
    {
        assert!(
            Instant::now() < deadline,
            "the upstream never saw the cancel"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // And the slot is free again.
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 0).await;
    gw.shutdown().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_retry_elsewhere_and_eject_the_replica() {
    // A port with nothing listening.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let up = gated("live", true).await;
    let mut s = spec(vec![model("m", &[dead, up.addr], 1)]);
    s.upstream.eject_after_failures = 2;
    s.upstream.eject_for = Duration::from_secs(60);
    let gw = gateway(s).await;
    for _ in 0..6 {
        let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
        assert_eq!(r.status, StatusCode::OK, "retried on the live replica");
        assert_eq!(r.json()["server"], "live");
    }
    let q = queue(gw.admin, "m").await;
    assert_eq!(q["ejected_replicas"], 1, "{q}");
    let text = metrics(gw.admin).await;
    let errors = sample(&text, "gpuscale_upstream_errors_total{model=\"m\"}").unwrap();
    assert_eq!(errors, 2.0, "ejected after two failures: no more tries");
    gw.shutdown().await;
}

/// A request with no answer within `limits.requestTimeout` gets 504; it
/// counts towards ejecting its replica only where the replica answered
/// nothing meanwhile. One that served other requests is alive, and the
/// request was long: a client's own long generations must not eject the
/// replica every other client shares (a reviewer's three 8,192-token
/// requests ejected it for 10 s, and a short request behind them waited
/// 9.4 s). A replica that answers nothing is still ejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_requests_that_time_out_eject_only_a_replica_that_answers_nothing() {
    let server = slow_server().await;
    let mut s = spec(vec![model("m", &[server.addr], 8)]);
    s.limits.request_timeout = Duration::from_secs(1);
    s.upstream.eject_after_failures = 3;
    s.upstream.eject_for = Duration::from_secs(60);
    let gw = gateway(s).await;
    // A completion of `tokens` tokens (4,000 take 200 s; one, 50 ms).
    let completion = |traffic, tokens: u32| async move {
        let body = format!(r#"{{"model":"m","max_tokens":{tokens},"prompt":"hi"}}"#);
        send(
            traffic,
            "POST",
            "/v1/completions",
            &[("content-type", "application/json")],
            body,
        )
        .await
    };
    let long = move |traffic| completion(traffic, 4000);
    let short = move |traffic| completion(traffic, 1);
    // Three long ones, and short ones answered while they run.
    let longs: Vec<_> = (0..3).map(|_| tokio::spawn(long(gw.traffic))).collect();
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 3).await;
    for _ in 0..3 {
        assert_eq!(short(gw.traffic).await.status, StatusCode::OK);
    }
    for l in longs {
        assert_eq!(l.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    }
    let q = queue(gw.admin, "m").await;
    assert_eq!(q["ejected_replicas"], 0, "it answered others: {q}");
    assert_eq!(short(gw.traffic).await.status, StatusCode::OK);
    // Three long ones, and a stream that started answering after them and
    // has not ended when they time out: the replica answered.
    let longs: Vec<_> = (0..3).map(|_| tokio::spawn(long(gw.traffic))).collect();
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 3).await;
    let (head, stream) = first_bytes(
        gw.traffic,
        r#"{"model":"m","stream":true,"max_tokens":4000,"prompt":"a stream"}"#,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    for l in longs {
        assert_eq!(l.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    }
    let q = queue(gw.admin, "m").await;
    assert_eq!(q["ejected_replicas"], 0, "a stream is an answer: {q}");
    drop(stream);
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 0).await;
    // Three long ones and nothing else: the replica answered nothing for
    // a whole request timeout, and is ejected.
    let longs: Vec<_> = (0..3).map(|_| tokio::spawn(long(gw.traffic))).collect();
    for l in longs {
        assert_eq!(l.await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    }
    let q = queue(gw.admin, "m").await;
    assert_eq!(q["ejected_replicas"], 1, "it answered nothing: {q}");
    gw.shutdown().await;
    server.stop().await;
}

/// A response of several chunks that is not server-sent events (a large
/// JSON body, a stream of another type) answers from its first chunk: a
/// replica sending one to a client is alive while other requests to it
/// time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_response_still_arriving_is_an_answer() {
    // An upstream that never answers a request whose body says `long`,
    // and starts a chunked JSON response to any other, then holds it.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(1).any(|w| w == b"}") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                if !String::from_utf8_lossy(&got).contains("long") {
                    let _ = conn
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n1\r\n[\r\n",
                        )
                        .await;
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    let mut s = spec(vec![model("m", &[addr], 8)]);
    s.limits.request_timeout = Duration::from_secs(1);
    s.upstream.eject_after_failures = 3;
    s.upstream.eject_for = Duration::from_secs(60);
    let gw = gateway(s).await;
    let post = |traffic, prompt: &'static str| async move {
        first_bytes(traffic, &format!(r#"{{"model":"m","prompt":"{prompt}"}}"#)).await
    };
    let longs: Vec<_> = (0..3)
        .map(|_| tokio::spawn(post(gw.traffic, "long")))
        .collect();
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 3).await;
    let (head, held) = post(gw.traffic, "chunked").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    for l in longs {
        let (answer, _) = l.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    }
    let q = queue(gw.admin, "m").await;
    assert_eq!(
        q["ejected_replicas"], 0,
        "its chunked response is an answer: {q}"
    );
    drop(held);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn body_and_header_limits() {
    let up = gated("a", true).await;
    let mut s = spec(vec![model("m", &[up.addr], 4)]);
    s.limits.max_body_bytes = 1024;
    s.limits.max_header_bytes = 8192;
    let gw = gateway(s).await;
    let big = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(2000));
    let r = send(gw.traffic, "POST", "/v1/completions", &[], big).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let huge = "y".repeat(20_000);
    let mut tcp = tokio::net::TcpStream::connect(gw.traffic).await.unwrap();
    let req = format!("GET /v1/models HTTP/1.1\r\nhost: localhost\r\nx-big: {huge}\r\n\r\n");
    let _ = tcp.write_all(req.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tcp.read_to_end(&mut buf).await;
    assert!(
        String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&buf)
    );
    assert_eq!(up.received.load(std::sync::atomic::Ordering::SeqCst), 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_stream_pushes_changes_promptly() {
    let up = gated("a", false).await;
    let gw = gateway(spec(vec![model("m", &[up.addr], 1)])).await;
    let req = http::Request::get(format!("http://{}/v1/queues/stream", gw.admin))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let mut body = resp.into_body();
    // The first event is the current state.
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"event: queues\ndata: "));
    let traffic = gw.traffic;
    let t0 = Instant::now();
    let pending = tokio::spawn(post_model(traffic, "/v1/chat/completions", "m"));
    loop {
        let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
        let text = String::from_utf8_lossy(&data).to_string();
        let json = text
            .strip_prefix("event: queues\ndata: ")
            .map(|j| serde_json::from_str::<serde_json::Value>(j.trim()).unwrap());
        if let Some(j) = json
            && j["models"]["m"]["in_flight"] == 1
        {
            break;
        }
    }
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "pushed after {:?}",
        t0.elapsed()
    );
    up.gate.add_permits(1);
    assert_eq!(pending.await.unwrap().status, StatusCode::OK);
    drop(body);
    gw.shutdown().await;
}

/// The simulated server lists its LoRA adapters in `/v1/models` beside
/// its base model, as vLLM does (each with the base model as parent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_server_lists_its_adapters_as_vllm_does() {
    let server = sim::start_with_adapters(
        SimProfile::named("instant", "base").unwrap(),
        "127.0.0.1:0".parse().unwrap(),
        &["sql".to_string()],
    )
    .await
    .unwrap();
    let req = http::Request::get(format!("http://{}/v1/models", server.addr))
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["base", "sql"]);
    assert_eq!(v["data"][1]["parent"], "base");
    // It serves those two and no other name, as vLLM answers a model it
    // does not have: 404, `NotFoundError`.
    for (model, status) in [
        ("base", StatusCode::OK),
        ("sql", StatusCode::OK),
        ("other", StatusCode::NOT_FOUND),
    ] {
        let body = serde_json::json!({"model": model, "prompt": "hi", "max_tokens": 1});
        let a = send(
            server.addr,
            "POST",
            "/v1/completions",
            &[("content-type", "application/json")],
            body.to_string(),
        )
        .await;
        assert_eq!(a.status, status, "{model}");
        if status == StatusCode::NOT_FOUND {
            assert_eq!(a.json()["error"]["type"], "NotFoundError");
        }
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kserve_v2_inference_reaches_the_simulated_server_through_the_gateway() {
    // The Open Inference Protocol's REST form, as KServe documents it.
    let name = "org/resnet-50";
    let server = sim::start(
        SimProfile::named("instant", name).unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let gw = gateway(spec(vec![model(name, &[server.addr], 4)])).await;
    let request = serde_json::json!({
        "id": "req-7",
        "inputs": [{"name": "input0", "shape": [2, 3], "datatype": "FP32",
                    "data": [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]}]
    })
    .to_string();
    let json = [("content-type", "application/json")];
    for (path, version) in [
        ("/v2/models/org/resnet-50/infer", None),
        ("/v2/models/org%2Fresnet-50/infer", None),
        ("/v2/models/org/resnet-50/versions/3/infer", Some("3")),
    ] {
        let r = send(gw.traffic, "POST", path, &json, request.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        assert_eq!(v["model_name"], name, "{path}");
        assert_eq!(v["id"], "req-7", "{path}");
        assert_eq!(v["model_version"].as_str(), version, "{path}");
        let out = &v["outputs"][0];
        assert_eq!(out["datatype"], "FP32");
        assert_eq!(out["shape"], serde_json::json!([1, 8]));
        assert_eq!(out["data"].as_array().map(Vec::len), Some(8));
    }
    // A tensor whose data does not fill its shape, an unknown datatype, no
    // inputs: 400 with the protocol's error object, from the server.
    for (body, says) in [
        (
            r#"{"inputs":[{"name":"x","shape":[2,2],"datatype":"INT32","data":[1,2,3]}]}"#,
            "holds 4 elements, data has 3",
        ),
        (
            r#"{"inputs":[{"name":"x","shape":[1],"datatype":"FLOAT","data":[1]}]}"#,
            "unknown datatype 'FLOAT'",
        ),
        (r#"{"inputs":[]}"#, "no inputs"),
        (
            r#"{"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[]}]}"#,
            "invalid",
        ),
    ] {
        let r = send(
            gw.traffic,
            "POST",
            "/v2/models/org/resnet-50/infer",
            &json,
            body,
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}");
        let error = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(error.contains(says), "{body}: {error}");
    }
    // Health, readiness and metadata on the server itself.
    let direct = |path: &'static str| send(server.addr, "GET", path, &[], "");
    assert_eq!(direct("/v2/health/live").await.json()["live"], true);
    assert_eq!(direct("/v2/health/ready").await.json()["ready"], true);
    assert_eq!(
        direct("/v2/models/org/resnet-50/ready").await.json()["ready"],
        true
    );
    let meta = direct("/v2/models/org/resnet-50/versions/3").await.json();
    assert_eq!(meta["name"], name);
    assert_eq!(meta["versions"], serde_json::json!(["3"]));
    let missing = send(
        server.addr,
        "POST",
        "/v2/models/other/infer",
        &json,
        request,
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(missing.json()["error"].as_str().unwrap().contains("other"));
    // The three inferences served, the refused ones not.
    assert_eq!(
        server
            .counters
            .completed
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    gw.shutdown().await;
    server.stop().await;
}

/// The simulated server answers OpenAI's `stream_options.include_usage`
/// as vLLM does: one more chunk before `[DONE]`, with no choices and the
/// request's usage; without it, no such chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sim_server_streams_usage_when_asked() {
    let profile = SimProfile::named("instant", "m").unwrap();
    let server = sim::start(profile, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    for include in [true, false] {
        let body = serde_json::json!({"model": "m", "stream": true, "max_tokens": 3,
            "stream_options": {"include_usage": include},
            "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
        let req = http::Request::post(format!("http://{}/v1/chat/completions", server.addr))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(Bytes::from(body)))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(*events.last().unwrap(), "data: [DONE]");
        let last: serde_json::Value =
            serde_json::from_str(events[events.len() - 2].strip_prefix("data: ").unwrap()).unwrap();
        if include {
            assert_eq!(events.len(), 6, "3 tokens, the end, the usage, [DONE]");
            assert_eq!(last["choices"], serde_json::json!([]));
            assert_eq!(last["usage"]["completion_tokens"], 3);
            assert_eq!(
                last["usage"]["total_tokens"],
                last["usage"]["prompt_tokens"].as_u64().unwrap() + 3
            );
        } else {
            assert_eq!(events.len(), 5, "3 tokens, the end, [DONE]");
            assert!(last.get("usage").is_none(), "{last}");
        }
    }
}
