//! The Prometheus source over HTTP: the PromQL query is sent URL-encoded
//! to `/api/v1/query`, and the result vector becomes observations.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use gpuscale_autoscaler::observe::{PrometheusSource, PrometheusSpec};
use http::Response;
use http_body_util::Full;

#[tokio::test]
async fn queries_prometheus_like_kedas_scaler() {
    let seen = Arc::new(Mutex::new(String::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = seen.clone();
    tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
            *s.lock().unwrap() = req.uri().to_string();
            async move {
                let body = r#"{"status":"success","data":{"resultType":"vector","result":[
                    {"metric":{"model":"org/chat"},"value":[1795976401.1,"9"]}]}}"#;
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
            .await;
    });
    let source = PrometheusSource::new(&PrometheusSpec {
        url: format!("http://{addr}/"),
        query: r#"sum by (model) (gpuscale_queue_depth{model!=""})"#.into(),
        model_label: "model".into(),
    });
    let obs = source.observations().await.unwrap();
    assert_eq!(obs["org/chat"].waiting, 9.0);
    assert_eq!(
        *seen.lock().unwrap(),
        "/api/v1/query?query=sum%20by%20%28model%29%20%28gpuscale_queue_depth%7Bmodel%21%3D%22%22%7D%29"
    );
}
