//! The KEDA external scaler over real gRPC (tonic client → tonic server on
//! loopback), answering from a stand-in gateway's `/v1/queues` and its
//! push stream.

use std::convert::Infallible;
use std::path::Path;
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(
                    |req: http::Request<hyper::body::Incoming>| async move {
                        type B = http_body_util::combinators::BoxBody<Bytes, Infallible>;
                        let body: B = if req.uri().path() == "/v1/queues/stream" {
                            let events = async_stream_events();
                            http_body_util::BodyExt::boxed(StreamBody::new(events))
                        } else {
                            http_body_util::BodyExt::boxed(Full::new(Bytes::from(queues(5, 2))))
                        };
                        Ok::<_, Infallible>(Response::new(body))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
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

#[tokio::test]
async fn keda_reads_queue_depth_over_grpc() {
    let gw = gateway().await;
    let keda = Keda::new(GatewayClient::new(&gw), vec![policy()]);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(keda.service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
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
