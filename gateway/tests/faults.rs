//! Faults and limits, each reproduced on real loopback sockets: capacity
//! with an ejected replica, KServe names with `/`, the header limit to the
//! byte, a JSON array body, the SIGTERM drain, counters present at zero,
//! the connection and subscriber caps, a client that stops reading, and
//! overload at 10× with every request accounted for.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use gpuscale_gateway::sim::{self, SimProfile};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Writes `raw` on a new connection and returns the status code of the
/// answer (0 when the connection ended without one).
async fn raw_status(addr: SocketAddr, raw: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(raw).await.unwrap();
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 12 {
        match s.read(&mut buf[got..]).await {
            Ok(0) | Err(_) => return 0,
            Ok(n) => got += n,
        }
    }
    std::str::from_utf8(&buf[9..12]).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_counts_only_replicas_that_take_traffic() {
    let up = gated("live", true).await;
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut sp = spec(vec![model("m", &[up.addr, dead], 32)]);
    sp.upstream.eject_after_failures = 1;
    sp.upstream.eject_for = Duration::from_secs(60);
    let gw = gateway(sp).await;
    let q = queue(gw.admin, "m").await;
    assert_eq!(
        (q["replicas"].as_u64(), q["capacity"].as_u64()),
        (Some(2), Some(64))
    );
    // Requests reach the dead replica once; it is ejected, the request is
    // retried on the live one.
    for _ in 0..4 {
        let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let q = queue(gw.admin, "m").await;
    assert_eq!(q["replicas"], 1, "{q}");
    assert_eq!(q["capacity"], 32, "{q}");
    assert_eq!(q["ejected_replicas"], 1, "{q}");
    assert_eq!(q["ejected"]["replicas"], 1, "{q}");
    assert_eq!(q["ejected"]["capacity"], 32, "{q}");
    let text = metrics(gw.admin).await;
    assert_eq!(sample(&text, "gpuscale_replicas{model=\"m\"}"), Some(1.0));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kserve_reaches_names_with_slashes_plain_or_percent_encoded() {
    let up = gated("kserve", true).await;
    let name = "meta-llama/Llama-3.1-8B-Instruct";
    let gw = gateway(spec(vec![
        model(name, &[up.addr], 4),
        model("meta-llama", &[], 4),
    ]))
    .await;
    for path in [
        "/v2/models/meta-llama/Llama-3.1-8B-Instruct/infer",
        "/v2/models/meta-llama%2FLlama-3.1-8B-Instruct/infer",
        "/v2/models/meta-llama/Llama-3.1-8B-Instruct/versions/2/infer",
    ] {
        let r = send(gw.traffic, "POST", path, &[], "{}").await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        assert_eq!(r.json()["path"], path, "forwarded as sent");
    }
    let r = send(gw.traffic, "POST", "/v2/models/nope/x/infer", &[], "{}").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_header_limit_holds_to_the_byte() {
    let up = gated("h", true).await;
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.limits.max_header_bytes = 8192;
    let gw = gateway(sp).await;
    let body = r#"{"model":"m"}"#;
    let head = |pad: usize| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\nx-pad: {}\r\n\r\n",
            body.len(),
            "a".repeat(pad)
        )
    };
    let base = head(0).len();
    let exact = head(8192 - base);
    assert_eq!(exact.len(), 8192);
    assert_eq!(
        raw_status(gw.traffic, format!("{exact}{body}").as_bytes()).await,
        200
    );
    let over = head(8193 - base);
    assert_eq!(
        raw_status(gw.traffic, format!("{over}{body}").as_bytes()).await,
        431
    );
    // Far over, in one write: still refused (hyper's read buffer alone
    // let 1.75× through).
    let huge = head(14_000 - base);
    assert_eq!(
        raw_status(gw.traffic, format!("{huge}{body}").as_bytes()).await,
        431
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_array_body_is_a_bad_request() {
    let up = gated("arr", true).await;
    let gw = gateway(spec(vec![model("m", &[up.addr], 4)])).await;
    let r = send(
        gw.traffic,
        "POST",
        "/v1/chat/completions",
        &[],
        r#"["m", []]"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(up.received.load(Ordering::SeqCst), 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_ready_503_then_refuse_then_finish() {
    let up = gated("slow", false).await;
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.drain.announce = Duration::from_millis(800);
    sp.drain.timeout = Duration::from_secs(10);
    let gw = gateway(sp).await;
    let (traffic, admin) = (gw.traffic, gw.admin);
    let in_flight = tokio::spawn(post_model(traffic, "/v1/chat/completions", "m"));
    wait_queue(admin, "m", |q| q["in_flight"] == 1).await;
    let started = Instant::now();
    let shutdown = tokio::spawn(gw.shutdown());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // During the announcement: not ready, new requests answered 503.
    let ready = send(admin, "GET", "/readyz", &[], Bytes::new()).await;
    assert_eq!(ready.status, StatusCode::SERVICE_UNAVAILABLE);
    let r = post_model(traffic, "/v1/chat/completions", "m").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(
        r.headers.get("connection").map(|v| v.as_bytes()),
        Some(&b"close"[..])
    );
    // After it: no longer accepting.
    tokio::time::sleep(Duration::from_millis(1000).saturating_sub(started.elapsed())).await;
    assert!(
        TcpStream::connect(traffic).await.is_err(),
        "still accepting after drain.announce"
    );
    // The request in flight finishes.
    up.gate.add_permits(1);
    assert_eq!(in_flight.await.unwrap().status, StatusCode::OK);
    tokio::time::timeout(Duration::from_secs(5), shutdown)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_and_signal_counters_exist_at_zero() {
    let gw = gateway(spec(vec![model("m", &[], 4)])).await;
    let text = metrics(gw.admin).await;
    assert_eq!(
        sample(&text, "gpuscale_upstream_errors_total{model=\"m\"}"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "gpuscale_scale_from_zero_signals_total{model=\"m\"}"),
        Some(0.0),
        "{text}"
    );
    // Refusals too, for every reason and the codes the gateway answers a
    // model's requests with itself: an increase() over the first wave of
    // 429s needs the series before it.
    for reason in ["queue_full", "displaced", "queue_timeout", "shutting_down"] {
        let name = format!("gpuscale_rejections_total{{model=\"m\",reason=\"{reason}\"}}");
        assert_eq!(sample(&text, &name), Some(0.0), "{name}: {text}");
    }
    for code in [429, 502, 503, 504] {
        let name = format!("gpuscale_requests_total{{model=\"m\",code=\"{code}\"}}");
        assert_eq!(sample(&text, &name), Some(0.0), "{name}: {text}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_get_503_and_the_rest_are_served() {
    let up = gated("c", true).await;
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.limits.max_connections = 2;
    let gw = gateway(sp).await;
    // Two idle connections hold both slots.
    let a = TcpStream::connect(gw.traffic).await.unwrap();
    let b = TcpStream::connect(gw.traffic).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let req = b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-length: 13\r\n\r\n{\"model\":\"m\"}";
    assert_eq!(raw_status(gw.traffic, req).await, 503);
    drop((a, b));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(raw_status(gw.traffic, req).await, 200);
    gw.shutdown().await;
}

/// `n` connections to `addr` that sent half a request head and hold.
async fn half_sent(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    held
}

/// Idle or half-sent connections that fill the admin port's cap cannot
/// fail the kubelet's probes, nor keep the admin token's holder out: over
/// the cap, `/healthz` and `/readyz` get their real answers and a request
/// with the token is served; anything else gets 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_over_the_admin_cap_get_their_real_answer() {
    let mut sp = spec(vec![model("m", &[], 4)]);
    sp.limits.max_admin_connections = 2;
    let gw = gateway(sp).await;
    let held = half_sent(gw.admin, 2).await;
    let get = |path: &str| format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").into_bytes();
    assert_eq!(raw_status(gw.admin, &get("/healthz")).await, 200);
    assert_eq!(raw_status(gw.admin, &get("/readyz")).await, 200);
    assert_eq!(raw_status(gw.admin, &get("/v1/queues")).await, 503);
    assert_eq!(raw_status(gw.admin, &get("/healthzz")).await, 503);
    // The admin token's holder (the autoscaler) is served over the cap:
    // a read, and a registration with its body.
    let with = |path: &str, token: &str| {
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nAuthorization: Bearer {token}\r\n\r\n")
            .into_bytes()
    };
    assert_eq!(raw_status(gw.admin, &with("/v1/queues", TOKEN)).await, 200);
    assert_eq!(
        raw_status(gw.admin, &with("/v1/queues", "not-the-admin-token-at-all")).await,
        503
    );
    let body = r#"{"model":"m","endpoint":"http://127.0.0.1:18001"}"#;
    let post = format!(
        "POST /v1/replicas HTTP/1.1\r\nhost: localhost\r\nauthorization: bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    assert_eq!(raw_status(gw.admin, post.as_bytes()).await, 200);
    drop(held);
    gw.shutdown().await;
}

/// The read-only token (Prometheus's scrape) has places of its own over
/// the admin cap: idle connections cannot blind monitoring, a reader
/// cannot take the autoscaler's places, and a reader served over the cap
/// still changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_token_has_places_of_its_own_over_the_admin_cap() {
    use gpuscale_gateway::auth::AdminToken;
    use gpuscale_gateway::config::Settings;
    const READER: &str = "fedcba9876543210-read-only";
    let mut sp = spec(vec![model("m", &[], 4)]);
    sp.limits.max_admin_connections = 2;
    let mut settings = Settings::from_spec("test", sp, &[]).unwrap();
    settings.admin_token = Some(AdminToken::from_secret(TOKEN).unwrap());
    settings.read_token = Some(AdminToken::from_secret(READER).unwrap());
    let gw = gpuscale_gateway::start(settings).await.unwrap();
    let mut held = half_sent(gw.admin, 2).await;
    let with = |method: &str, path: &str, token: &str| {
        format!(
            "{method} {path} HTTP/1.1\r\nhost: localhost\r\nAuthorization: Bearer {token}\r\ncontent-length: 0\r\n\r\n"
        )
        .into_bytes()
    };
    assert_eq!(
        raw_status(gw.admin, &with("GET", "/metrics", READER)).await,
        200
    );
    assert_eq!(
        raw_status(gw.admin, &with("GET", "/v1/queues", READER)).await,
        200
    );
    let write = raw_status(gw.admin, &with("POST", "/v1/replicas", READER)).await;
    assert!(matches!(write, 401 | 403), "{write}");
    // Readers that hold all four of their places leave the admin token's
    // sixteen alone. Six try (one whose head missed the 50 ms in which an
    // over-cap connection is read is answered 503 and leaves its place to
    // another): four hold, the rest are answered.
    let mut readers = Vec::new();
    for _ in 0..6 {
        let mut s = TcpStream::connect(gw.admin).await.unwrap();
        s.write_all(
            format!("GET /metrics HTTP/1.1\r\nAuthorization: Bearer {READER}\r\n").as_bytes(),
        )
        .await
        .unwrap();
        readers.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut holding = 0;
    for s in &mut readers {
        let mut b = [0u8; 16];
        match tokio::time::timeout(Duration::from_millis(100), s.read(&mut b)).await {
            Err(_) => holding += 1,
            Ok(Ok(n)) => assert!(n == 0 || b[..n].starts_with(b"HTTP/1.1 503")),
            Ok(Err(_)) => {}
        }
    }
    assert_eq!(holding, 4, "the read-only token's places");
    held.extend(readers);
    assert_eq!(
        raw_status(gw.admin, &with("GET", "/metrics", READER)).await,
        503
    );
    assert_eq!(
        raw_status(gw.admin, &with("GET", "/v1/queues", TOKEN)).await,
        200
    );
    drop(held);
    gw.shutdown().await;
}

/// HEAD on the admin port's reads answers as GET does, without a body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_on_an_admin_read_is_its_get_without_a_body() {
    let gw = gateway(spec(vec![model("m", &[], 4)])).await;
    for path in ["/healthz", "/v1/queues", "/metrics"] {
        let mut s = TcpStream::connect(gw.admin).await.unwrap();
        s.write_all(
            format!("HEAD {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).await.unwrap();
        assert!(text.starts_with("HTTP/1.1 200"), "{path}: {text}");
        assert!(text.ends_with("\r\n\r\n"), "{path}: no body: {text}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_subscribers_are_capped_and_a_gone_one_frees_its_place_at_once() {
    let mut sp = spec(vec![model("m", &[], 4)]);
    sp.limits.max_stream_subscribers = 1;
    let gw = gateway(sp).await;
    let open = |admin: SocketAddr| async move {
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(b"GET /v1/queues/stream HTTP/1.1\r\nhost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.unwrap();
        let status: u16 = std::str::from_utf8(&buf[9..12]).unwrap().parse().unwrap();
        assert!(n >= 12);
        (status, s)
    };
    let (first, held) = open(gw.admin).await;
    assert_eq!(first, 200);
    let (second, _) = open(gw.admin).await;
    assert_eq!(second, 503);
    drop(held);
    // Within a few hundred milliseconds (not at the next event).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (third, _held) = open(gw.admin).await;
    assert_eq!(third, 200);
    // The place is taken by a reader without the token: the token's
    // holder (the autoscaler) still gets one of its own, and a wrong
    // token does not.
    let with = |admin: SocketAddr, token: &'static str| async move {
        let mut s = TcpStream::connect(admin).await.unwrap();
        s.write_all(
            format!(
                "GET /v1/queues/stream HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer {token}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.unwrap();
        assert!(n >= 12);
        let status: u16 = std::str::from_utf8(&buf[9..12]).unwrap().parse().unwrap();
        (status, s)
    };
    let (wrong, _) = with(gw.admin, "not-the-admin-token-at-all").await;
    assert_eq!(wrong, 503);
    let (holder, _kept) = with(gw.admin, common::TOKEN).await;
    assert_eq!(holder, 200);
    gw.shutdown().await;
}

/// An upstream whose every answer is `size` bytes.
async fn big_upstream(size: usize) -> SocketAddr {
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let body = Bytes::from(vec![b'x'; size]);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(body)))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_frees_its_replica_slot() {
    let up = big_upstream(64 << 20).await;
    let mut sp = spec(vec![model("m", &[up], 1)]);
    sp.limits.write_timeout = Duration::from_millis(500);
    let gw = gateway(sp).await;
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    s.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-length: 13\r\n\r\n{\"model\":\"m\"}",
    )
    .await
    .unwrap();
    // The client reads nothing; the slot comes back after the timeout.
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 1).await;
    let q = wait_queue(gw.admin, "m", |q| q["in_flight"] == 0).await;
    assert_eq!(q["in_flight"], 0);
    // And the next client is served.
    let r = post_model(gw.traffic, "/v1/completions", "m").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body.len(), 64 << 20);
    drop(s);
    gw.shutdown().await;
}

/// Outcomes seen by the clients of one overload run.
#[derive(Debug, Default)]
struct Outcomes {
    sent: AtomicU64,
    ok: AtomicU64,
    too_many: AtomicU64,
    unavailable: AtomicU64,
    other_status: AtomicU64,
    no_answer: AtomicU64,
}

/// One client: its own keep-alive connection, requests one after the
/// other until `budget` runs out; a connection that breaks is replaced.
async fn overload_client(traffic: SocketAddr, budget: Arc<AtomicU64>, out: Arc<Outcomes>) {
    use http_body_util::{BodyExt, Full};
    let body = Bytes::from_static(
        br#"{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    let mut conn: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> = None;
    loop {
        if budget
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1))
            .is_err()
        {
            return;
        }
        out.sent.fetch_add(1, Ordering::SeqCst);
        if conn.as_ref().is_none_or(|c| c.is_closed()) {
            let Ok(stream) = TcpStream::connect(traffic).await else {
                out.no_answer.fetch_add(1, Ordering::SeqCst);
                continue;
            };
            let Ok((send, c)) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
            else {
                out.no_answer.fetch_add(1, Ordering::SeqCst);
                continue;
            };
            tokio::spawn(c);
            conn = Some(send);
        }
        let send = conn.as_mut().unwrap();
        let req = http::Request::post("/v1/chat/completions")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))
            .unwrap();
        let answer = match send.send_request(req).await {
            Ok(resp) => {
                let status = resp.status();
                match resp.into_body().collect().await {
                    Ok(_) => Some(status),
                    Err(_) => None,
                }
            }
            Err(_) => None,
        };
        let counter = match answer {
            Some(StatusCode::OK) => &out.ok,
            Some(StatusCode::TOO_MANY_REQUESTS) => &out.too_many,
            Some(StatusCode::SERVICE_UNAVAILABLE) => &out.unavailable,
            Some(_) => &out.other_status,
            None => {
                conn = None;
                &out.no_answer
            }
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_at_ten_times_capacity_answers_every_request_run_after_run() {
    // The reported scenario: 640 concurrent clients against capacity 64
    // (two replicas × 32), a queue of 256, thousands of requests; every
    // request sent must come back 200, 429 or 503, and the gateway must
    // have counted each one.
    let profile = SimProfile {
        decode_tps: 300.0,
        max_concurrency: 64,
        ..SimProfile::named("instant", "m").unwrap()
    };
    let a = sim::start(profile.clone(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let b = sim::start(profile, "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let mut m = model("m", &[a.addr, b.addr], 32);
    m.max_queue = Some(256);
    m.queue_timeout = Some(Duration::from_secs(2));
    let gw = gateway(spec(vec![m])).await;
    let runs: u64 = std::env::var("GPUSCALE_OVERLOAD_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let mut total = 0;
    for run in 0..runs {
        let out = Arc::new(Outcomes::default());
        let budget = Arc::new(AtomicU64::new(3000));
        let clients: Vec<_> = (0..640)
            .map(|_| tokio::spawn(overload_client(gw.traffic, budget.clone(), out.clone())))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        for c in clients {
            tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), c)
                .await
                .expect("the run ends in bounded time")
                .unwrap();
        }
        let sent = out.sent.load(Ordering::SeqCst);
        let answered = out.ok.load(Ordering::SeqCst)
            + out.too_many.load(Ordering::SeqCst)
            + out.unavailable.load(Ordering::SeqCst);
        assert_eq!(sent, 3000);
        assert_eq!(
            out.no_answer.load(Ordering::SeqCst),
            0,
            "run {run}: {out:?}"
        );
        assert_eq!(
            out.other_status.load(Ordering::SeqCst),
            0,
            "run {run}: {out:?}"
        );
        assert_eq!(answered, sent, "run {run}: {out:?}");
        assert!(
            out.ok.load(Ordering::SeqCst) > 0 && out.too_many.load(Ordering::SeqCst) > 0,
            "{out:?}"
        );
        total += sent;
        // The gateway counted every one of them.
        let text = metrics(gw.admin).await;
        let counted: f64 = [200, 429, 503]
            .iter()
            .filter_map(|c| {
                sample(
                    &text,
                    &format!("gpuscale_requests_total{{model=\"m\",code=\"{c}\"}}"),
                )
            })
            .sum();
        assert_eq!(
            counted as u64, total,
            "run {run}: gateway counted {counted}, clients sent {total}"
        );
    }
    gw.shutdown().await;
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_while_every_replica_is_ejected_is_served_when_the_ejection_ends() {
    // The only replica refuses connections: one 502, and it is ejected
    // for a second. It then comes up at the same address. A request that
    // arrived during the ejection waited in the queue; it is handed the
    // replica when the ejection ends, not left to its queue timeout
    // (20 s here; before, nothing woke it and it got 503 then).
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let mut sp = spec(vec![model("m", &[addr], 1)]);
    sp.upstream.eject_after_failures = 1;
    sp.upstream.eject_for = Duration::from_secs(1);
    sp.queue.queue_timeout = Duration::from_secs(20);
    let gw = gateway(sp).await;
    let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = br#"{"server":"late"}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.write_all(body).await;
            });
        }
    });
    let started = Instant::now();
    post_model(gw.traffic, "/v1/chat/completions", "m")
        .await
        .assert_served_by("late");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    gw.shutdown().await;
}
