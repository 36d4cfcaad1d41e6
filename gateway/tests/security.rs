//! The gateway as an attacker would try it, over real sockets: the admin
//! API's authentication matrix, what registration accepts, who may set a
//! priority, the port nobody else may join, and what error bodies reveal.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use gpuscale_gateway::Settings;
use gpuscale_gateway::auth::AdminToken;
use http::StatusCode;

const WRONG: (&str, &str) = ("authorization", "Bearer not-the-admin-token-at-all");

/// The hex SHA-256 of an API key, as `priorities.apiKeys[].sha256` holds it.
fn key_sha256(key: &str) -> String {
    gpuscale_gateway::priority::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `gpuscale_rejections_total` of a model for one reason.
async fn rejections(admin: SocketAddr, model: &str, reason: &str) -> Option<f64> {
    let text = metrics(admin).await;
    sample(
        &text,
        &format!(r#"gpuscale_rejections_total{{model="{model}",reason="{reason}"}}"#),
    )
}

fn replica_body(model: &str, endpoint: &str) -> String {
    serde_json::json!({"model": model, "endpoint": endpoint}).to_string()
}

async fn start_with(
    spec: gpuscale_gateway::GatewaySpec,
    token: Option<&str>,
) -> gpuscale_gateway::Running {
    let mut settings = Settings::from_spec("test", spec, &[]).unwrap();
    settings.admin_token = token.map(|t| AdminToken::from_secret(t).unwrap());
    gpuscale_gateway::start(settings).await.unwrap()
}

/// The admin address to send to (a listener on 0.0.0.0 is reached on
/// loopback).
fn reach(addr: SocketAddr) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], addr.port()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_authentication_matrix() {
    let up = gated("real", true).await;
    let reads = ["/metrics", "/v1/queues", "/v1/replicas", "/nope"];
    for (admin, token) in [
        ("127.0.0.1:0", Some(TOKEN)),
        ("127.0.0.1:0", None),
        ("0.0.0.0:0", Some(TOKEN)),
    ] {
        let mut sp = spec(vec![model("m", &[up.addr], 4)]);
        sp.admin = admin.parse().unwrap();
        let loopback = sp.admin.ip().is_loopback();
        let gw = start_with(sp, token).await;
        let a = reach(gw.admin);
        let case = format!("admin {admin}, token {}", token.is_some());
        // Probes are always open.
        for path in ["/healthz", "/readyz"] {
            let r = send(a, "GET", path, &[], Bytes::new()).await;
            assert_eq!(r.status, StatusCode::OK, "{case} {path}");
        }
        for path in reads {
            let expect_open = |s: StatusCode| s == StatusCode::OK || s == StatusCode::NOT_FOUND;
            let none = send(a, "GET", path, &[], Bytes::new()).await.status;
            let wrong = send(a, "GET", path, &[WRONG], Bytes::new()).await.status;
            let right = send(a, "GET", path, &[AUTH], Bytes::new()).await.status;
            if loopback {
                assert!(
                    expect_open(none) && expect_open(wrong),
                    "{case} {path}: {none} {wrong}"
                );
            } else {
                assert_eq!(none, StatusCode::UNAUTHORIZED, "{case} {path}");
                assert_eq!(wrong, StatusCode::UNAUTHORIZED, "{case} {path}");
            }
            assert!(expect_open(right), "{case} {path}: {right}");
        }
        // Changes: never without the token; refused outright with none
        // configured.
        let other = gated("other", true).await;
        let body = replica_body("m", &format!("http://{}", other.addr));
        for method in ["POST", "DELETE"] {
            for headers in [&[][..], &[WRONG][..]] {
                let r = send(a, method, "/v1/replicas", headers, body.clone()).await;
                let expected = if token.is_some() {
                    StatusCode::UNAUTHORIZED
                } else {
                    StatusCode::FORBIDDEN
                };
                assert_eq!(r.status, expected, "{case} {method}");
                if r.status == StatusCode::UNAUTHORIZED {
                    assert!(r.headers.contains_key("www-authenticate"));
                }
            }
        }
        let r = send(a, "POST", "/v1/replicas", &[AUTH], body.clone()).await;
        if token.is_some() {
            assert_eq!(r.status, StatusCode::OK, "{case}");
            let r = send(a, "DELETE", "/v1/replicas", &[AUTH], body).await;
            assert_eq!(r.status, StatusCode::OK, "{case}");
        } else {
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{case}");
        }
        gw.shutdown().await;
    }
}

/// A scraper's read-only token on an exposed admin listener: it reads
/// `/metrics` and the queues, and registers nothing, whether or not an
/// admin token is configured beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_token_reads_and_changes_nothing() {
    const READER: &str = "fedcba9876543210-read-only";
    let reader = ("authorization", "Bearer fedcba9876543210-read-only");
    let up = gated("real", true).await;
    for admin_token in [Some(TOKEN), None] {
        let mut sp = spec(vec![model("m", &[up.addr], 4)]);
        sp.admin = "0.0.0.0:0".parse().unwrap();
        let mut settings = Settings::from_spec("test", sp, &[]).unwrap();
        settings.admin_token = admin_token.map(|t| AdminToken::from_secret(t).unwrap());
        settings.read_token = Some(AdminToken::from_secret(READER).unwrap());
        let gw = gpuscale_gateway::start(settings).await.unwrap();
        let a = reach(gw.admin);
        let case = format!("admin token {}", admin_token.is_some());
        for path in ["/metrics", "/v1/queues"] {
            let r = send(a, "GET", path, &[reader], Bytes::new()).await;
            assert_eq!(r.status, StatusCode::OK, "{case} {path}");
            let r = send(a, "GET", path, &[], Bytes::new()).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{case} {path}");
        }
        let other = gated("other", true).await;
        let body = replica_body("m", &format!("http://{}", other.addr));
        let r = send(a, "POST", "/v1/replicas", &[reader], body).await;
        // Understood and refused (403), not "who are you" (401): with an
        // admin token configured the read token is not enough; without
        // one, changes are off.
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{case}");
        gw.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposed_admin_listener_without_a_token_does_not_start() {
    let mut sp = spec(vec![model("m", &[], 4)]);
    sp.admin = "0.0.0.0:0".parse().unwrap();
    let settings = Settings::from_spec("test", sp, &[]).unwrap();
    let err = match gpuscale_gateway::start(settings).await {
        Ok(_) => panic!("started without a token on 0.0.0.0"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("spec.admin"), "{err}");
    assert!(err.contains("--admin-token-file"), "{err}");
}

/// A token from a file every user of the machine may read does not guard
/// an admin listener off loopback: any local user could take it and
/// register replicas that receive prompts. On loopback it is warned
/// about; `chmod 600` (a Secret volume's `defaultMode: 0440`) passes.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposed_admin_listener_refuses_a_token_file_every_user_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("gpuscale-token-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("admin-token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let settings = |admin: &str, mode: u32, read: bool| {
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut sp = spec(vec![model("m", &[], 4)]);
        sp.admin = admin.parse().unwrap();
        let mut s = Settings::from_spec("test", sp, &[]).unwrap();
        let token = AdminToken::from_file(&file).unwrap();
        if read {
            s.admin_token = Some(AdminToken::from_secret("0123456789abcdef-admin").unwrap());
            s.read_token = Some(token);
        } else {
            s.admin_token = Some(token);
        }
        s
    };
    for read in [false, true] {
        let err = settings("0.0.0.0:0", 0o644, read)
            .check_exposure()
            .unwrap_err();
        assert!(
            err.contains("spec.admin") && err.contains("readable"),
            "{err}"
        );
        assert!(err.contains(&file.display().to_string()), "{err}");
        assert!(settings("0.0.0.0:0", 0o600, read).check_exposure().is_ok());
        assert!(settings("0.0.0.0:0", 0o440, read).check_exposure().is_ok());
        assert!(
            settings("127.0.0.1:0", 0o644, read)
                .check_exposure()
                .is_ok()
        );
    }
    // The server's start refuses it too.
    let err = match gpuscale_gateway::start(settings("0.0.0.0:0", 0o644, false)).await {
        Ok(_) => panic!("started with a world-readable token on 0.0.0.0"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("readable"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capture_server_cannot_join_or_push_out_the_real_replicas() {
    let real = gated("real", true).await;
    let capture = gated("capture", true).await;
    let gw = gateway(spec(vec![model("m", &[real.addr], 4)])).await;
    let body = replica_body("m", &format!("http://{}", capture.addr));
    let r = send(gw.admin, "POST", "/v1/replicas", &[], body).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let real_body = replica_body("m", &format!("http://{}", real.addr));
    let r = send(gw.admin, "DELETE", "/v1/replicas", &[], real_body).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    for _ in 0..20 {
        let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
        assert_eq!(r.json()["server"], "real");
    }
    assert_eq!(
        capture.received.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_refuses_metadata_userinfo_foreign_networks_its_own_listeners_bad_concurrency_and_too_many()
 {
    let mut sp = spec(vec![model("m", &[], 4)]);
    sp.registration.max_replicas_per_model = 2;
    let gw = gateway(sp).await;
    for endpoint in [
        "http://169.254.169.254:80",
        "http://[fe80::1]:80",
        "http://user:pw@127.0.0.1:8000",
        "https://127.0.0.1:8000",
        "http://10.0.0.7:8000",
        "http://localhost:8000",
        "http://0.0.0.0:8000",
    ] {
        let r = send(
            gw.admin,
            "POST",
            "/v1/replicas",
            &[AUTH],
            replica_body("m", endpoint),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{endpoint}");
    }
    // The gateway's own listeners: a request sent there would come back
    // to the gateway and wait out the queue timeout.
    for own in [gw.traffic, gw.admin] {
        let r = send(
            gw.admin,
            "POST",
            "/v1/replicas",
            &[AUTH],
            replica_body("m", &format!("http://{own}")),
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{own}");
        assert!(
            String::from_utf8_lossy(&r.body).contains("the gateway's own"),
            "{own}: {:?}",
            r.body
        );
    }
    // No concurrency, or more than any server batches (a model's sum of
    // them would overflow).
    for n in [0u64, 65_537, 4_294_967_295] {
        let body = serde_json::json!({"model": "m", "endpoint": "http://127.0.0.1:18001", "maxConcurrency": n});
        let r = send(gw.admin, "POST", "/v1/replicas", &[AUTH], body.to_string()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{n}");
    }
    for port in [18001, 18002] {
        let body = replica_body("m", &format!("http://127.0.0.1:{port}"));
        let r = send(gw.admin, "POST", "/v1/replicas", &[AUTH], body).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    // The same one again is not a new replica; a third is.
    let again = replica_body("m", "http://127.0.0.1:18002");
    assert_eq!(
        send(gw.admin, "POST", "/v1/replicas", &[AUTH], again)
            .await
            .status,
        StatusCode::OK
    );
    // Nor is it spelt as an IPv4-mapped IPv6 address.
    let mapped = replica_body("m", "http://[::ffff:127.0.0.1]:18002");
    assert_eq!(
        send(gw.admin, "POST", "/v1/replicas", &[AUTH], mapped)
            .await
            .status,
        StatusCode::OK
    );
    let third = replica_body("m", "http://127.0.0.1:18003");
    assert_eq!(
        send(gw.admin, "POST", "/v1/replicas", &[AUTH], third)
            .await
            .status,
        StatusCode::CONFLICT
    );
    let list = send(gw.admin, "GET", "/v1/replicas", &[], Bytes::new())
        .await
        .json();
    assert_eq!(list["m"].as_array().unwrap().len(), 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_header_does_not_raise_its_own_priority_by_default() {
    let up = gated("a", false).await;
    let mut m = model("m", &[up.addr], 1);
    m.max_queue = Some(4);
    let gw = gateway(spec(vec![m])).await;
    let traffic = gw.traffic;
    let mut standard = Vec::new();
    for _ in 0..5 {
        standard.push(tokio::spawn(post_model(
            traffic,
            "/v1/chat/completions",
            "m",
        )));
    }
    wait_queue(gw.admin, "m", |q| q["waiting"] == 4 && q["in_flight"] == 1).await;
    let body = serde_json::json!({"model": "m", "prompt": "x"}).to_string();
    let r = send(
        traffic,
        "POST",
        "/v1/completions",
        &[("x-gpuscale-priority", "critical")],
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue is full"),
        "refused as an ordinary request: {}",
        r.json()
    );
    up.gate.add_permits(100);
    for t in standard {
        assert_eq!(
            t.await.unwrap().status,
            StatusCode::OK,
            "no standard request was displaced"
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_key_sets_its_class_and_may_be_allowed_the_header() {
    let up = gated("a", false).await;
    let mut m = model("m", &[up.addr], 1);
    m.max_queue = Some(2);
    let mut sp = spec(vec![m]);
    let sha = key_sha256;
    sp.priorities = serde_json::from_value(serde_json::json!({
        "apiKeys": [
            {"name": "gold", "sha256": sha("gold-key"), "priority": "critical"},
            {"name": "ops", "sha256": sha("ops-key"), "allowHeader": true},
        ],
        "routes": [{"pathPrefix": "/v1/embeddings", "priority": "sheddable"}],
    }))
    .unwrap();
    let gw = gateway(sp).await;
    let traffic = gw.traffic;
    let busy = tokio::spawn(post_model(traffic, "/v1/chat/completions", "m"));
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 1).await;
    let queued = |headers: Vec<(&'static str, &'static str)>, path: &'static str| {
        tokio::spawn(async move {
            let body = serde_json::json!({"model": "m", "input": "x"}).to_string();
            send(traffic, "POST", path, &headers, body).await
        })
    };
    let gold = queued(
        vec![("authorization", "Bearer gold-key")],
        "/v1/completions",
    );
    let ops = queued(
        vec![
            ("authorization", "Bearer ops-key"),
            ("x-gpuscale-priority", "critical"),
        ],
        "/v1/completions",
    );
    let q = wait_queue(gw.admin, "m", |q| q["waiting"] == 2).await;
    assert_eq!(q["waiting_by_priority"]["critical"], 2, "{q}");
    // A route's class: sheddable, refused when the queue is full of
    // critical requests.
    let emb = queued(vec![], "/v1/embeddings").await.unwrap();
    assert_eq!(emb.status, StatusCode::TOO_MANY_REQUESTS);
    up.gate.add_permits(100);
    for t in [busy, gold, ops] {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    gw.shutdown().await;
}

/// `POST /v1/completions` naming `model`, sent from the loopback
/// address `from` (another client than 127.0.0.1), with `headers`.
async fn post_from(
    from: [u8; 4],
    traffic: SocketAddr,
    model: &str,
    headers: &[(&str, &str)],
) -> Answer {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_local_address(Some(std::net::IpAddr::from(from)));
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector);
    let mut b = http::Request::builder()
        .method("POST")
        .uri(format!("http://{traffic}/v1/completions"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let body = serde_json::json!({"model": model, "prompt": "hello"}).to_string();
    let resp = client
        .request(
            b.body(http_body_util::Full::new(Bytes::from(body)))
                .unwrap(),
        )
        .await
        .expect("request");
    let (parts, body) = resp.into_parts();
    use http_body_util::BodyExt;
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// One client filling a model's queue keeps it only while nobody else
/// waits: other clients' requests (another address, a configured API key
/// from the flooder's own address) take the flooder's newest places (429
/// `fair_share` to the flooder) and are served in turn, not behind the
/// flooder's backlog; a bearer token nobody configured gains the flooder
/// no second share (it counts as its address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_flooding_a_queue_leaves_others_a_place_and_a_turn() {
    let up = gated("a", false).await;
    let mut m = model("m", &[up.addr], 1);
    m.max_queue = Some(4);
    let mut sp = spec(vec![m]);
    let sha = key_sha256("team-b-key");
    // A key with no class of its own: the rules are read, nothing else
    // changes.
    sp.priorities = serde_json::from_value(serde_json::json!({
        "apiKeys": [{"name": "team-b", "sha256": sha}],
    }))
    .unwrap();
    let gw = gateway(sp).await;
    let traffic = gw.traffic;
    let from = |addr: [u8; 4], token: Option<&'static str>| {
        tokio::spawn(async move {
            let auth;
            let headers: Vec<(&str, &str)> = match token {
                Some(t) => {
                    auth = format!("Bearer {t}");
                    vec![("authorization", auth.as_str())]
                }
                None => vec![],
            };
            post_from(addr, traffic, "m", &headers).await
        })
    };
    let body = |a: &Answer| String::from_utf8_lossy(&a.body).into_owned();
    // The flooder: one in flight, then four waiting, in order.
    let busy = from([127, 0, 0, 1], None);
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 1).await;
    let mut waiting = Vec::new();
    for n in 1..=4 {
        waiting.push(from([127, 0, 0, 1], None));
        wait_queue(gw.admin, "m", |q| q["waiting"] == n).await;
    }
    // Full, and a token nobody configured is still the same client:
    // refused, nobody displaced.
    let refused = from([127, 0, 0, 1], Some("a-fresh-token-every-time-1"))
        .await
        .unwrap();
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        body(&refused).contains("queue is full; retry later"),
        "{}",
        body(&refused)
    );
    // A configured key, from the flooder's own address, is another client,
    // and so is another address: each takes the flooder's newest place.
    let keyed = from([127, 0, 0, 1], Some("team-b-key"));
    let crowded = waiting.pop().unwrap().await.unwrap();
    assert_eq!(crowded.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        body(&crowded).contains("held more of it than another"),
        "{}",
        body(&crowded)
    );
    let other = from([127, 0, 0, 2], None);
    let crowded = waiting.pop().unwrap().await.unwrap();
    assert_eq!(crowded.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(rejections(gw.admin, "m", "fair_share").await, Some(2.0));
    assert_eq!(queue(gw.admin, "m").await["waiting"], 4);
    // Slots go round robin among the three clients: the request in
    // flight, then the flooder's oldest, the other address's, the key's,
    // and only then the flooder's second.
    up.gate.add_permits(4);
    for t in [other, keyed] {
        tokio::time::timeout(Duration::from_secs(5), t)
            .await
            .expect("served in turn, ahead of the flooder's backlog")
            .unwrap()
            .assert_served_by("a");
    }
    let q = wait_queue(gw.admin, "m", |q| q["in_flight"] == 1).await;
    assert_eq!(
        q["waiting"], 0,
        "the flooder's second is the one in flight: {q}"
    );
    up.gate.add_permits(100);
    for t in std::iter::once(busy).chain(waiting) {
        t.await.unwrap().assert_served_by("a");
    }
    gw.shutdown().await;
}

/// A client past its rate gets 429 with the seconds until its next
/// request, before anything is queued or forwarded, counted as
/// `rate_limited`; other addresses and keys have buckets of their own, a
/// key's own rate (here none) overrides the default, and a token nobody
/// configured counts as its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_its_rate_is_refused_and_others_are_not() {
    let up = gated("a", true).await;
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    // One a minute in bursts of two: no token comes back while the test
    // runs, however slow the machine.
    sp.limits.client_rate = Some(
        serde_json::from_value(serde_json::json!({"requestsPerMinute": 1, "burst": 2})).unwrap(),
    );
    let sha = key_sha256("batch-team-key");
    sp.priorities = serde_json::from_value(serde_json::json!({
        "apiKeys": [{"name": "batch", "sha256": sha, "rate": {"requestsPerMinute": 0}}],
    }))
    .unwrap();
    let gw = gateway(sp).await;
    let traffic = gw.traffic;
    for _ in 0..2 {
        post_from([127, 0, 0, 1], traffic, "m", &[])
            .await
            .assert_served_by("a");
    }
    for headers in [
        vec![],
        vec![("authorization", "Bearer nobody-configured-this")],
    ] {
        let refused = post_from([127, 0, 0, 1], traffic, "m", &headers).await;
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        // One a minute: a minute until the next (less the moments the
        // requests took).
        let after: u64 = refused.headers["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((30..=60).contains(&after), "{after}");
        assert_eq!(
            refused.json()["error"]["type"],
            "rate_limit_exceeded",
            "told apart from the queue's 429s"
        );
        assert!(
            String::from_utf8_lossy(&refused.body).contains("rate's worth"),
            "{}",
            String::from_utf8_lossy(&refused.body)
        );
    }
    post_from([127, 0, 0, 2], traffic, "m", &[])
        .await
        .assert_served_by("a");
    for _ in 0..5 {
        post_from(
            [127, 0, 0, 1],
            traffic,
            "m",
            &[("authorization", "Bearer batch-team-key")],
        )
        .await
        .assert_served_by("a");
    }
    assert_eq!(
        up.received.load(std::sync::atomic::Ordering::SeqCst),
        8,
        "nothing refused reached the replica"
    );
    assert_eq!(rejections(gw.admin, "m", "rate_limited").await, Some(2.0));
    assert_eq!(queue(gw.admin, "m").await["waiting"], 0);
    gw.shutdown().await;
}

/// Behind a trusted proxy each client is the address the proxy put in
/// `X-Forwarded-For`, not the proxy's (which would make everyone behind
/// it one client, one bucket); a peer not trusted cannot choose its
/// address with the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_forwarded_address_is_the_client_and_no_one_elses() {
    let up = gated("a", true).await;
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.limits.client_rate = Some(
        serde_json::from_value(serde_json::json!({"requestsPerMinute": 1, "burst": 1})).unwrap(),
    );
    sp.priorities = serde_json::from_value(serde_json::json!({
        "trustedNetworks": ["127.0.0.1/32"],
        "forwardedFor": true,
    }))
    .unwrap();
    let gw = gateway(sp).await;
    let traffic = gw.traffic;
    let via = |from: [u8; 4], xff: &'static str| async move {
        post_from(from, traffic, "m", &[("x-forwarded-for", xff)]).await
    };
    // Through the proxy (127.0.0.1): one bucket per forwarded address.
    via([127, 0, 0, 1], "203.0.113.7")
        .await
        .assert_served_by("a");
    assert_eq!(
        via([127, 0, 0, 1], "203.0.113.7").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    via([127, 0, 0, 1], "198.51.100.1, 203.0.113.8")
        .await
        .assert_served_by("a");
    // A client's own entry left of the proxy's is not believed.
    assert_eq!(
        via([127, 0, 0, 1], "203.0.113.99, 203.0.113.8")
            .await
            .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Straight from an untrusted peer: the header is ignored.
    via([127, 0, 0, 2], "203.0.113.9")
        .await
        .assert_served_by("a");
    assert_eq!(
        via([127, 0, 0, 2], "203.0.113.10").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Two header lines (the proxy's added last), through the gateway's own
    // parser: the last line's entry is the client.
    let two = |first: &'static str| async move {
        post_from(
            [127, 0, 0, 1],
            traffic,
            "m",
            &[
                ("x-forwarded-for", first),
                ("x-forwarded-for", "203.0.113.51"),
            ],
        )
        .await
    };
    two("203.0.113.50").await.assert_served_by("a");
    assert_eq!(
        two("203.0.113.52").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // No header from the proxy: the proxy's own bucket.
    post_from([127, 0, 0, 1], traffic, "m", &[])
        .await
        .assert_served_by("a");
    assert_eq!(
        post_from([127, 0, 0, 1], traffic, "m", &[]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(rejections(gw.admin, "m", "rate_limited").await, Some(5.0));
    gw.shutdown().await;

    // `forwardedFor` off (the default): a trusted peer's priority header
    // counts, its X-Forwarded-For does not.
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.limits.client_rate = Some(
        serde_json::from_value(serde_json::json!({"requestsPerMinute": 1, "burst": 1})).unwrap(),
    );
    sp.priorities = serde_json::from_value(serde_json::json!({
        "trustedNetworks": ["127.0.0.1/32"],
    }))
    .unwrap();
    let gw = gateway(sp).await;
    let traffic = gw.traffic;
    post_from(
        [127, 0, 0, 1],
        traffic,
        "m",
        &[("x-forwarded-for", "203.0.113.7")],
    )
    .await
    .assert_served_by("a");
    assert_eq!(
        post_from(
            [127, 0, 0, 1],
            traffic,
            "m",
            &[("x-forwarded-for", "203.0.113.8")]
        )
        .await
        .status,
        StatusCode::TOO_MANY_REQUESTS
    );
    gw.shutdown().await;
}

/// Route classes follow the model a request resolved to: neither a
/// percent-encoded name nor a model header naming another model moves a
/// request out of its route's class or into another route's (a header
/// naming another served model than the path is refused outright).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_class_follows_the_model_not_the_bytes_of_the_path() {
    let up = gated("a", false).await;
    let mut m = model("m", &[up.addr], 1);
    m.max_queue = Some(4);
    let mut sp = spec(vec![m, model("vip", &[up.addr], 1)]);
    sp.priorities = serde_json::from_value(serde_json::json!({
        "routes": [
            {"pathPrefix": "/v2/models/m/", "priority": "sheddable"},
            {"pathPrefix": "/v2/models/vip/", "priority": "critical"},
        ],
    }))
    .unwrap();
    let gw = gateway(sp).await;
    let traffic = gw.traffic;
    let busy = tokio::spawn(post_model(traffic, "/v1/chat/completions", "m"));
    wait_queue(gw.admin, "m", |q| q["in_flight"] == 1).await;
    let queued = |headers: Vec<(&'static str, &'static str)>, path: &'static str| {
        tokio::spawn(async move { send(traffic, "POST", path, &headers, String::from("{}")).await })
    };
    // `%6D` is `m`: still m's route, sheddable.
    let encoded = queued(vec![], "/v2/models/%6D/infer");
    // vip's path, but the header names m: two served models, refused.
    let borrowed = queued(vec![("x-gpuscale-model", "m")], "/v2/models/vip/infer");
    assert_eq!(borrowed.await.unwrap().status, StatusCode::BAD_REQUEST);
    let q = wait_queue(gw.admin, "m", |q| q["waiting"] == 1).await;
    assert_eq!(q["waiting_by_priority"]["sheddable"], 1, "{q}");
    assert_eq!(
        q["waiting_by_priority"]["critical"].as_u64().unwrap_or(0),
        0,
        "{q}"
    );
    up.gate.add_permits(100);
    for t in [busy, encoded] {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_cannot_join_the_traffic_port() {
    let up = gated("first", true).await;
    let first = gateway(spec(vec![model("m", &[up.addr], 4)])).await;
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.listen = first.traffic;
    let mut settings = Settings::from_spec("second", sp, &[]).unwrap();
    settings.admin_token = Some(AdminToken::from_secret(TOKEN).unwrap());
    match gpuscale_gateway::start(settings).await {
        Ok(_) => panic!("a second gateway bound the same traffic port"),
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse);
            assert!(e.to_string().contains(&first.traffic.to_string()), "{e}");
        }
    }
    // The first still serves everything.
    for _ in 0..10 {
        assert_eq!(
            post_model(first.traffic, "/v1/chat/completions", "m")
                .await
                .status,
            StatusCode::OK
        );
    }
    first.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_bodies_never_name_a_replica() {
    // A replica that refuses connections: 502s that say nothing of it.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let gw = gateway(spec(vec![model("m", &[dead], 4)])).await;
    let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert!(!text.contains(&dead.port().to_string()), "{text}");
    assert!(!text.contains("127.0.0.1"), "{text}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    gw.shutdown().await;
}

/// `n` requests for `m` at `traffic`, each answered 200 by the upstream
/// named "real".
async fn served_by_real(traffic: SocketAddr, n: usize) {
    for _ in 0..n {
        post_model(traffic, "/v1/chat/completions", "m")
            .await
            .assert_served_by("real");
    }
}

/// A TCP forwarder to whatever `target` holds (a Service or an L4 proxy in
/// front of the gateway, as a replica address may lead): the connections
/// it accepted, and the first bytes of each.
struct Forwarder {
    addr: SocketAddr,
    target: std::sync::Arc<std::sync::OnceLock<SocketAddr>>,
    heads: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

async fn forwarder() -> Forwarder {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let target = std::sync::Arc::new(std::sync::OnceLock::<SocketAddr>::new());
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (t, h) = (target.clone(), heads.clone());
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let (t, h) = (t.clone(), h.clone());
            tokio::spawn(async move {
                let mut first = vec![0u8; 4096];
                let Ok(n) = client.read(&mut first).await else {
                    return;
                };
                h.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&first[..n]).into_owned());
                let Some(&to) = t.get() else { return };
                let Ok(mut server) = tokio::net::TcpStream::connect(to).await else {
                    return;
                };
                if server.write_all(&first[..n]).await.is_ok() {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    Forwarder {
        addr,
        target,
        heads,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_address_that_leads_back_to_the_gateway_ends_in_one_hop() {
    // The registration check refuses the gateway's own listeners, but not
    // an address in front of them. Each forwarded request carries the
    // gateway's Via entry; one that comes back is refused with 508 before
    // any queue, and the hop that sent it counts that replica failed and
    // tries another.
    let up = gated("real", true).await;
    let front = forwarder().await;
    let gw = gateway(spec(vec![model("m", &[front.addr, up.addr], 64)])).await;
    front.target.set(gw.traffic).unwrap();
    let started = std::time::Instant::now();
    served_by_real(gw.traffic, 20).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    {
        let heads = front.heads.lock().unwrap();
        // One hop per request that reached the forwarder, and not a loop:
        // ejected after 3 failures (connections are pooled, so a
        // connection may carry several).
        assert!(!heads.is_empty() && heads.len() <= 4, "{heads:?}");
        let via = heads[0]
            .lines()
            .find_map(|l| l.strip_prefix("via: "))
            .unwrap_or_else(|| panic!("no Via: {}", heads[0]));
        let pseudonym = via.trim().strip_prefix("1.1 gpuscale-").unwrap();
        assert_eq!(pseudonym.len(), 16, "{via}");
        assert!(pseudonym.bytes().all(|b| b.is_ascii_hexdigit()), "{via}");
    }
    let text = metrics(gw.admin).await;
    let looped = sample(&text, "gpuscale_requests_total{model=\"\",code=\"508\"}");
    assert!(
        looped.is_some_and(|n| (1.0..=4.0).contains(&n)),
        "{looped:?}"
    );
    gw.shutdown().await;

    // Only such a replica: the client's answer is a prompt 502, after
    // the retries, not a chain of hops until a queue or a timeout ends it.
    let front = forwarder().await;
    let gw = gateway(spec(vec![model("m", &[front.addr], 64)])).await;
    front.target.set(gw.traffic).unwrap();
    let started = std::time::Instant::now();
    let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    let text = String::from_utf8_lossy(&r.body).to_string();
    assert!(!text.contains("gpuscale-"), "{text}");
    assert!(text.contains("request loop"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(front.heads.lock().unwrap().len() <= 3);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_gateways_via_entry_passes() {
    // A chain of two gateways (an edge gateway in front of a model
    // gateway) is not a loop: each sees only the other's entry.
    let up = gated("real", true).await;
    let inner = gateway(spec(vec![model("m", &[up.addr], 8)])).await;
    let edge = gateway(spec(vec![model("m", &[inner.traffic], 8)])).await;
    let r = send(
        edge.traffic,
        "POST",
        "/v1/chat/completions",
        &[
            ("content-type", "application/json"),
            ("via", "1.1 gpuscale-0123456789abcdef"),
        ],
        serde_json::json!({"model": "m", "messages": []}).to_string(),
    )
    .await;
    r.assert_served_by("real");
    edge.shutdown().await;
    inner.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_through_an_edge_gateway_is_retried_by_the_gateway_whose_replica_leads_back() {
    // client → edge → model gateway → (a replica address that leads back
    // to the edge). The edge refuses the looped request with 508; the
    // model gateway sees on it the Via of a gateway its request came
    // through, counts that replica failed and serves from the real one.
    let up = gated("real", true).await;
    let front = forwarder().await;
    let model_gw = gateway(spec(vec![model("m", &[front.addr, up.addr], 64)])).await;
    let edge = gateway(spec(vec![model("m", &[model_gw.traffic], 64)])).await;
    front.target.set(edge.traffic).unwrap();
    served_by_real(edge.traffic, 20).await;
    assert!(front.heads.lock().unwrap().len() <= 4);
    // The model gateway counted no 508 as an answer of its model.
    let text = metrics(model_gw.admin).await;
    assert_eq!(
        sample(&text, "gpuscale_requests_total{model=\"m\",code=\"508\"}"),
        None
    );
    edge.shutdown().await;
    model_gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_received_as_http_1_0_is_forwarded_with_via_1_0() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let front = forwarder().await;
    let up = gated("real", true).await;
    front.target.set(up.addr).unwrap();
    let gw = gateway(spec(vec![model("m", &[front.addr], 8)])).await;
    let body = serde_json::json!({"model": "m", "messages": []}).to_string();
    let mut s = tokio::net::TcpStream::connect(gw.traffic).await.unwrap();
    s.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
        "{answer}"
    );
    let heads = front.heads.lock().unwrap().clone();
    assert!(heads[0].contains("\r\nvia: 1.0 gpuscale-"), "{}", heads[0]);
    gw.shutdown().await;
}

/// Reads what has arrived on `tcp` within `ms` (empty: nothing).
async fn answer_within(tcp: &mut tokio::net::TcpStream, ms: u64) -> String {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 4096];
    match tokio::time::timeout(Duration::from_millis(ms), tcp.read(&mut buf)).await {
        Ok(Ok(n)) => String::from_utf8_lossy(&buf[..n]).to_string(),
        _ => String::new(),
    }
}

/// A connection that sent a request head announcing `length` body bytes
/// (or a chunked body) and `sent` bytes of it, and holds there.
async fn holding(traffic: SocketAddr, length: Option<usize>, sent: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut tcp = tokio::net::TcpStream::connect(traffic).await.unwrap();
    let framing = match length {
        Some(n) => format!("content-length: {n}"),
        None => "transfer-encoding: chunked".to_string(),
    };
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n{framing}\r\n\r\n"
    )
    .into_bytes();
    match length {
        Some(_) => req.extend(std::iter::repeat_n(b' ', sent)),
        None if sent > 0 => {
            req.extend(format!("{sent:x}\r\n").into_bytes());
            req.extend(std::iter::repeat_n(b' ', sent));
            req.extend(b"\r\n");
        }
        None => {}
    }
    tcp.write_all(&req).await.unwrap();
    tcp
}

/// A gateway taking bodies of up to 1 MiB with a budget of 2.5 MiB, in
/// front of an open upstream (kept alive with it).
async fn budgeted() -> (Gated, gpuscale_gateway::Running) {
    let up = gated("real", true).await;
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.limits.max_body_bytes = 1 << 20;
    sp.limits.max_buffered_bytes = (5 << 20) / 2;
    sp.limits.body_read_timeout = Duration::from_secs(20);
    let gw = start_with(sp, Some(TOKEN)).await;
    (up, gw)
}

/// Bodies held by slow clients count against one budget across
/// connections (`limits.maxBufferedBytes`): past it a request gets 503
/// with `Retry-After` (before its body is sent, where the bytes held
/// leave its announced length no room), whether its length is announced
/// or its chunks arrive, and the budget comes back when a holder goes
/// away. (The attack: a few hundred connections each sending 4 MiB − 1
/// of a 4 MiB body took the gateway to 1.4 GB; in a container with a
/// 1 GiB limit, an OOM kill and every queued request lost.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_large_bodies_cannot_take_the_gateways_memory() {
    let (_up, gw) = budgeted().await;
    // Two holders send all but 100 bytes of a megabyte each: 2 MiB of
    // the 2.5.
    let mut a = holding(gw.traffic, Some(1 << 20), (1 << 20) - 100).await;
    let mut b = holding(gw.traffic, Some(1 << 20), (1 << 20) - 100).await;
    assert_eq!(
        answer_within(&mut a, 200).await,
        "",
        "the first two wait for their bodies"
    );
    assert_eq!(answer_within(&mut b, 50).await, "");
    // A third announced megabyte: answered at once, its body unread.
    let mut c = holding(gw.traffic, Some(1 << 20), 0).await;
    let refused = answer_within(&mut c, 2000).await.to_ascii_lowercase();
    assert!(refused.starts_with("http/1.1 503"), "{refused}");
    assert!(refused.contains("retry-after: 1"), "{refused}");
    assert!(refused.contains("maxbufferedbytes"), "{refused}");
    // A chunked body grows into the half megabyte left, then past it.
    let mut d = holding(gw.traffic, None, 400 << 10).await;
    assert_eq!(
        answer_within(&mut d, 300).await,
        "",
        "400 KiB fit in what is left"
    );
    {
        use tokio::io::AsyncWriteExt;
        let chunk = 200 << 10;
        let mut more = format!("{chunk:x}\r\n").into_bytes();
        more.extend(std::iter::repeat_n(b' ', chunk));
        more.extend(b"\r\n");
        d.write_all(&more).await.unwrap();
    }
    let refused = answer_within(&mut d, 2000).await.to_ascii_lowercase();
    assert!(refused.starts_with("http/1.1 503"), "{refused}");
    // Requests within the budget are served meanwhile.
    let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
    assert_eq!(r.status, StatusCode::OK);
    // A holder goes away: its megabyte comes back.
    drop(a);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut e = holding(gw.traffic, Some(1 << 20), 10).await;
    assert_eq!(
        answer_within(&mut e, 300).await,
        "",
        "taken from what a left"
    );
    drop((b, c, d, e));
    gw.shutdown().await;
}

/// A length announced holds nothing of the budget until its bytes
/// arrive: connections that announce large bodies and send none cannot
/// take it from everyone else. (The attack: 66 connections sending
/// `Content-Length: 4194304` and one byte each held the default 256 MiB,
/// and every request with a body, for every model, got 503.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_lengths_alone_hold_nothing_of_the_budget() {
    let (_up, gw) = budgeted().await;
    // Eight megabytes announced, 800 bytes sent.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(holding(gw.traffic, Some(1 << 20), 100).await);
    }
    for c in &mut idle {
        assert_eq!(answer_within(c, 50).await, "", "waiting for its body");
    }
    // Requests with bodies are served...
    for _ in 0..3 {
        let r = post_model(gw.traffic, "/v1/chat/completions", "m").await;
        assert_eq!(r.status, StatusCode::OK);
    }
    // ...and two that send their megabytes are not refused: the bytes
    // that arrived are what the budget holds.
    let mut a = holding(gw.traffic, Some(1 << 20), (1 << 20) - 100).await;
    let mut b = holding(gw.traffic, Some(1 << 20), (1 << 20) - 100).await;
    assert_eq!(answer_within(&mut a, 300).await, "");
    assert_eq!(answer_within(&mut b, 50).await, "");
    // The budget still binds what arrives: the first idle announcer
    // sends the rest of its megabyte, and the bytes past the 2.5 MiB are
    // refused.
    {
        use tokio::io::AsyncWriteExt;
        idle[0]
            .write_all(&vec![b' '; (1 << 20) - 100])
            .await
            .unwrap();
    }
    let refused = answer_within(&mut idle[0], 2000).await.to_ascii_lowercase();
    assert!(refused.starts_with("http/1.1 503"), "{refused}");
    assert!(refused.contains("maxbufferedbytes"), "{refused}");
    drop((idle, a, b));
    gw.shutdown().await;
}

#[test]
fn a_budget_below_one_request_of_the_largest_size_is_refused() {
    let mut sp = spec(vec![]);
    sp.limits.max_buffered_bytes = sp.limits.max_body_bytes - 1;
    let e = Settings::from_spec("test", sp, &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("spec.limits.maxBufferedBytes"), "{e}");
}

/// A request head that grows past its first 16 KiB takes the buffer it
/// fills from the same budget while it arrives: with the budget held by a
/// slow body, it gets 503 rather than growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_head_takes_from_the_same_budget() {
    use tokio::io::AsyncWriteExt;
    let up = gated("real", true).await;
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.limits.max_body_bytes = 1 << 20;
    sp.limits.max_buffered_bytes = (1 << 20) + (32 << 10);
    let gw = start_with(sp, Some(TOKEN)).await;
    // A head of 40 KiB fits while the budget is free...
    let partial = format!(
        "GET /v1/models HTTP/1.1\r\nhost: localhost\r\nx-pad: {}",
        "p".repeat(40 << 10)
    );
    let mut free = tokio::net::TcpStream::connect(gw.traffic).await.unwrap();
    free.write_all(partial.as_bytes()).await.unwrap();
    assert_eq!(answer_within(&mut free, 300).await, "");
    free.write_all(b"\r\n\r\n").await.unwrap();
    let ok = answer_within(&mut free, 2000).await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    // ...and not while a slow body holds it (all but 10 bytes sent).
    let body = holding(gw.traffic, Some(1 << 20), (1 << 20) - 10).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut late = tokio::net::TcpStream::connect(gw.traffic).await.unwrap();
    late.write_all(partial.as_bytes()).await.unwrap();
    let refused = answer_within(&mut late, 2000).await;
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    drop((body, late));
    gw.shutdown().await;
}

/// Listeners bound to loopback answer only what command-line clients
/// send there: a web page in a browser on the same machine can reach
/// `127.0.0.1` too, through a DNS name rebound to it (its `Host` names
/// the page's domain) or with a cross-origin POST that needs no CORS
/// preflight (`text/plain`; its `Origin` names the page). Both are
/// refused with 403 before routing (nothing forwarded, no scale-up),
/// and a listener bound off loopback does not look (Services and proxies
/// reach it under any name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_page_cannot_use_the_loopback_listeners() {
    let up = gated("real", true).await;
    let gw = start_with(spec(vec![model("m", &[up.addr], 4)]), Some(TOKEN)).await;
    let body = r#"{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}"#;
    let rebound = [("host", "attacker.example:8080")];
    let cross = [
        ("origin", "http://evil.example"),
        ("content-type", "text/plain"),
    ];
    for headers in [&rebound[..], &cross[..]] {
        let r = send(gw.traffic, "POST", "/v1/chat/completions", headers, body).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{headers:?}");
        let text = String::from_utf8_lossy(&r.body).to_string();
        assert!(text.contains("loopback"), "{text}");
        let r = send(gw.admin, "GET", "/v1/replicas", headers, Bytes::new()).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "admin {headers:?}");
    }
    assert_eq!(up.received.load(std::sync::atomic::Ordering::SeqCst), 0);
    // curl and the SDKs: a loopback Host, no Origin.
    for host in ["localhost:8080", "127.0.0.1", "[::1]:9"] {
        let r = send(
            gw.traffic,
            "POST",
            "/v1/chat/completions",
            &[("host", host)],
            body,
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{host}");
    }
    gw.shutdown().await;
    // Bound off loopback, any name is served.
    let mut sp = spec(vec![model("m", &[up.addr], 4)]);
    sp.listen = "0.0.0.0:0".parse().unwrap();
    let gw = start_with(sp, Some(TOKEN)).await;
    let r = send(
        reach(gw.traffic),
        "POST",
        "/v1/chat/completions",
        &rebound,
        body,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    gw.shutdown().await;
}
