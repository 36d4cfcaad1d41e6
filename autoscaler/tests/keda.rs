//! The KEDA external scaler over real gRPC (tonic client → tonic server on
//! loopback), answering from a stand-in gateway's `/v1/queues` and its
//! push stream.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use gpuscale_autoscaler::keda::Keda;
use gpuscale_autoscaler::keda::pb::external_scaler_client::ExternalScalerClient;
use gpuscale_autoscaler::keda::pb::{GetMetricsRequest, ScaledObjectRef};
use gpuscale_autoscaler::observe::GatewayClient;
use http::Response;
use http_body_util::{Full, StreamBody};
use hyper::body::Frame;

fn queues(waiting: u32, in_flight: u32) -> String {
    serde_json::json!({"uptime_s": 1.0, "models": {"org/chat": {
        "waiting": waiting, "in_flight": in_flight, "replicas": 1,
        "arrival_rate": {"1s": 1.0, "10s": 1.0, "60s": 1.0}}}})
    .to_string()
}

/// A gateway admin API: `/v1/queues` says 5 waiting + 2 in flight; the
/// stream says 0 at first, then 3 waiting after 200 ms.
async fn gateway() -> String {
    gateway_counting().await.0
}

/// Requests the stand-in gateway served: (push streams, `/v1/queues`).
type Counts = Arc<(AtomicUsize, AtomicUsize)>;

/// [`gateway`], counting what it is asked.
async fn gateway_counting() -> (String, Counts) {
    let counts: Counts = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = counts.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            type B = http_body_util::combinators::BoxBody<Bytes, Infallible>;
                            let stream = req.uri().path() == "/v1/queues/stream";
                            if stream {
                                seen.0.fetch_add(1, Ordering::SeqCst);
                            } else {
                                seen.1.fetch_add(1, Ordering::SeqCst);
                            }
                            let body: B = if stream {
                                let events = async_stream_events();
                                http_body_util::BodyExt::boxed(StreamBody::new(events))
                            } else {
                                http_body_util::BodyExt::boxed(Full::new(Bytes::from(queues(5, 2))))
                            };
                            Ok::<_, Infallible>(Response::new(body))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), counts)
}

fn async_stream_events() -> tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        let _ = tx
            .send(Ok(Frame::data(Bytes::from(format!(
                "event: queues\ndata: {}\n\n",
                queues(0, 0)
            )))))
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = tx
            .send(Ok(Frame::data(Bytes::from(format!(
                "event: queues\ndata: {}\n\n",
                queues(3, 0)
            )))))
            .await;
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

fn policy() -> gpuscale_policies::Model {
    let text = "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: chat\nspec:\n  servedName: org/chat\n  resources: {memoryGiB: 10, compute: 0.1, maxConcurrency: 4}\n  scaling: {targetQueueDepth: 4, minReplicas: 0}\n";
    gpuscale_policies::load::load_sources(&[(Path::new("p.yaml"), text)])
        .unwrap()
        .models
        .remove(0)
}

fn object(model: &str) -> ScaledObjectRef {
    ScaledObjectRef {
        name: "chat".into(),
        namespace: "inference".into(),
        scaler_metadata: [("model".to_string(), model.to_string())].into(),
    }
}

/// Serves `keda` over gRPC on a loopback port; its address.
async fn serve(keda: Keda) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(keda.service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

#[tokio::test]
async fn keda_reads_queue_depth_over_grpc() {
    let gw = gateway().await;
    let keda = Keda::new(GatewayClient::new(&gw), vec![policy()]);
    let addr = serve(keda).await;
    let mut client = ExternalScalerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();

    // By policy name: the served name's queue, the policy's target.
    let spec = client
        .get_metric_spec(object("chat"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(spec.metric_specs.len(), 1);
    assert_eq!(spec.metric_specs[0].metric_name, "gpuscale-queue-org-chat");
    assert_eq!(spec.metric_specs[0].target_size_float, 4.0);
    assert_eq!(spec.metric_specs[0].target_size, 4);

    let metrics = client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(object("org/chat")),
            metric_name: "gpuscale-queue-org-chat".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(metrics.metric_values[0].metric_value_float, 7.0);
    assert_eq!(metrics.metric_values[0].metric_value, 7);

    assert!(
        client
            .is_active(object("chat"))
            .await
            .unwrap()
            .into_inner()
            .result
    );

    // The push stream: first the current answer from /v1/queues (7 > 0:
    // active), then every change the gateway pushes (0 → inactive, 3 →
    // active).
    let mut stream = client
        .stream_is_active(object("chat"))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let next = tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("a push")
            .unwrap()
            .unwrap();
        seen.push(next.result);
    }
    assert_eq!(seen, [true, false, true]);

    // Unknown models and missing metadata are clear errors.
    let err = client.is_active(object("nope")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = client
        .get_metric_spec(ScaledObjectRef::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

/// However many streams and calls reach the scaler, the gateway sees one
/// push stream and a handful of `/v1/queues` reads (an attacker once
/// exhausted the gateway's admin connections through it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_and_streams_share_one_gateway_stream() {
    let (gw, counts) = gateway_counting().await;
    let keda = Keda::new(GatewayClient::new(&gw), vec![policy()]);
    let addr = serve(keda).await;
    let client = ExternalScalerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let mut streams = Vec::new();
    for _ in 0..100 {
        let mut c = client.clone();
        streams.push(tokio::spawn(async move {
            let mut s = c
                .stream_is_active(object("chat"))
                .await
                .unwrap()
                .into_inner();
            // Each gets its first answer.
            let first = tokio::time::timeout(Duration::from_secs(10), s.message())
                .await
                .expect("a first answer")
                .unwrap()
                .unwrap();
            (s, first.result)
        }));
    }
    let mut calls = Vec::new();
    for _ in 0..200 {
        let mut c = client.clone();
        calls.push(tokio::spawn(async move {
            c.get_metrics(GetMetricsRequest {
                scaled_object_ref: Some(object("chat")),
                metric_name: "gpuscale-queue-org-chat".into(),
            })
            .await
            .unwrap()
            .into_inner()
            .metric_values[0]
                .metric_value_float
        }));
    }
    let mut open = Vec::new();
    for s in streams {
        open.push(s.await.unwrap().0);
    }
    for c in calls {
        let depth = c.await.unwrap();
        assert!([0.0, 3.0, 7.0].contains(&depth), "{depth}");
    }
    assert_eq!(counts.0.load(Ordering::SeqCst), 1, "one push stream");
    let reads = counts.1.load(Ordering::SeqCst);
    assert!(reads <= 5, "{reads} reads of /v1/queues for 300 callers");
    drop(open);
}

/// When the gateway instances change (discovery), the shared stream
/// follows the new set: open streams keep getting changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_stream_follows_a_change_of_gateway_instances() {
    let (first, _) = gateway_counting().await;
    let (second, seen) = gateway_counting().await;
    let gateway = GatewayClient::new(&first);
    let keda = Keda::new(gateway.clone(), vec![policy()]);
    let addr = serve(keda).await;
    let mut stream = chat_stream(addr).await;
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("a push")
            .unwrap()
            .unwrap()
            .result
    };
    // The first gateway: 7 (active), then its stream's 0 and 3.
    assert_eq!(
        [next().await, next().await, next().await],
        [true, false, true]
    );
    gateway.set_bases(vec![second.clone()]);
    // The second gateway's stream, followed: 0, then 3.
    assert_eq!([next().await, next().await], [false, true]);
    assert_eq!(
        seen.0.load(Ordering::SeqCst),
        1,
        "one stream on the new gateway"
    );
}

/// The scaler's listener serves a bounded number of connections: one past
/// the cap is closed at once, and one that sends nothing is closed at its
/// deadline, which frees its slot for a real client.
#[tokio::test]
async fn idle_connections_cannot_hold_the_scaler() {
    use tokio::io::AsyncReadExt;
    let addr = serve_limited(gpuscale_autoscaler::keda::Limits {
        connections: 2,
        handshake: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let started = std::time::Instant::now();
    let mut quiet = Vec::new();
    for _ in 0..2 {
        quiet.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // The third: closed without a byte.
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(2), third.read(&mut buf))
        .await
        .expect("closed at once, not left open")
        .unwrap_or(0);
    assert_eq!(n, 0, "nothing served past the cap");
    // The quiet two: past the server's own preface (its SETTINGS),
    // closed at their deadline.
    for mut s in quiet {
        let mut seen = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut seen))
            .await
            .expect("a quiet connection is closed");
    }
    assert!(started.elapsed() >= Duration::from_millis(250));
    // Their slots are free: a client is served.
    let mut client = ExternalScalerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let spec = client
        .get_metric_spec(object("chat"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(spec.metric_specs[0].metric_name, "gpuscale-queue-org-chat");
}

/// A live client is never cut for being quiet: the server pings it every
/// `keepalive`, its answers are what the `idle` deadline counts, so a
/// `StreamIsActive` stream with nothing to say outlives the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_live_stream_outlives_the_idle_deadline() {
    let addr = serve_limited(gpuscale_autoscaler::keda::Limits {
        connections: 4,
        handshake: Duration::from_millis(300),
        keepalive: Duration::from_millis(100),
        idle: Duration::from_millis(400),
    })
    .await;
    let mut stream = chat_stream(addr).await;
    // The pushes the stand-in gateway sends, then nothing for 30 s.
    for _ in 0..3 {
        tokio::time::timeout(Duration::from_secs(5), stream.message())
            .await
            .expect("a push")
            .unwrap()
            .unwrap();
    }
    // Three idle deadlines later the stream is still open: no end, no
    // error, only nothing to say.
    let quiet = tokio::time::timeout(Duration::from_millis(1_200), stream.message()).await;
    assert!(quiet.is_err(), "the stream ended: {quiet:?}");
}

/// The scaler as `gpuscale autoscaler --keda` serves it, within `limits`,
/// on a loopback port, for the test's lifetime; its address.
async fn serve_limited(limits: gpuscale_autoscaler::keda::Limits) -> std::net::SocketAddr {
    let gw = gateway().await;
    let keda = Keda::new(GatewayClient::new(&gw), vec![policy()]);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Kept open while the runtime lives: the server stops when it drops.
    std::mem::forget(stop);
    let (addr, _task) = gpuscale_autoscaler::keda::serve_within(
        "127.0.0.1:0".parse().unwrap(),
        keda,
        stopped,
        limits,
    )
    .await
    .unwrap();
    addr
}

/// A client of the scaler at `addr` and its `StreamIsActive` stream of
/// `chat`.
async fn chat_stream(
    addr: std::net::SocketAddr,
) -> tonic::Streaming<gpuscale_autoscaler::keda::pb::IsActiveResponse> {
    let mut client = ExternalScalerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    client
        .stream_is_active(object("chat"))
        .await
        .unwrap()
        .into_inner()
}
