//! A KEDA external scaler (gRPC, KEDA's `externalscaler.proto`), so a KEDA
//! user can keep KEDA and feed it gpuscale's per-model queue depth. The
//! ScaledObject's trigger names the model:
//!
//! ```yaml
//! triggers:
//!   - type: external-push        # or `external`
//!     metadata:
//!       scalerAddress: gpuscale-autoscaler.gpuscale:9092
//!       model: meta-llama/Llama-3.1-8B-Instruct   # served name or policy name
//!       targetQueueDepth: "8"                      # optional: else the policy's
//!       activationQueueDepth: "0"                  # optional: else the policy's
//! ```
//!
//! `GetMetrics` answers waiting + in flight from the gateway's
//! `/v1/queues`; `GetMetricSpec` the per-replica target; `IsActive` whether
//! the depth is strictly above the activation threshold (KEDA's 0↔1);
//! `StreamIsActive` pushes that answer on every change the gateway pushes.

use std::collections::HashMap;
use std::pin::Pin;

use gpuscale_policies::Model;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::observe::{Event, GatewayClient, observations};

/// The generated gRPC types and services.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("externalscaler");
}

use pb::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use pb::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec,
    MetricValue, ScaledObjectRef,
};

/// The scaler: answers from a gateway, with the policies' targets.
///
/// However many calls and streams KEDA (or anyone who reaches the port)
/// opens, the gateway sees one push stream and at most one `/v1/queues`
/// read at a time: every `StreamIsActive` follows one shared stream, and
/// the depth calls read a view at most [`FRESH`] old, fetched by one
/// caller while the others wait for it. Streams are capped at
/// [`MAX_STREAMS`] (one more is refused `RESOURCE_EXHAUSTED`).
#[derive(Clone)]
pub struct Keda {
    gateway: GatewayClient,
    models: Vec<Model>,
    shared: std::sync::Arc<Shared>,
}

/// How old a `/v1/queues` view the depth calls may answer from.
pub const FRESH: std::time::Duration = std::time::Duration::from_millis(500);

/// Most `StreamIsActive` streams open at once (KEDA opens one per
/// ScaledObject trigger).
pub const MAX_STREAMS: usize = 1024;

struct Shared {
    /// The one gateway stream, started by the first `StreamIsActive`.
    feed: std::sync::Mutex<Option<tokio::sync::broadcast::Sender<Event>>>,
    /// The last `/v1/queues` view and when it was read.
    view: tokio::sync::Mutex<Option<(std::time::Instant, serde_json::Value)>>,
    streams: std::sync::Arc<tokio::sync::Semaphore>,
}

/// What one ScaledObject asks about.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    served: String,
    metric: String,
    target: f64,
    activation: f64,
}

impl Keda {
    /// A scaler reading `gateway`, defaulting targets from `models`.
    pub fn new(gateway: GatewayClient, models: Vec<Model>) -> Self {
        Keda {
            gateway,
            models,
            shared: std::sync::Arc::new(Shared {
                feed: std::sync::Mutex::new(None),
                view: tokio::sync::Mutex::new(None),
                streams: std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
            }),
        }
    }

    /// A receiver of the one shared gateway stream (started on first use;
    /// each view it delivers also refreshes the depth calls' view).
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Event> {
        let mut feed = self.shared.feed.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = feed.as_ref() {
            return tx.subscribe();
        }
        let (tx, rx) = tokio::sync::broadcast::channel(64);
        let sender = tx.clone();
        let gateway = self.gateway.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            loop {
                // When the set of gateway instances changes (discovery),
                // follow the new set: checked each second, and whenever
                // the client's stream ends.
                let bases = gateway.bases();
                let mut events = gateway.stream();
                let mut check = tokio::time::interval(std::time::Duration::from_secs(1));
                loop {
                    let e = tokio::select! {
                        e = events.recv() => e,
                        _ = check.tick() => {
                            if gateway.bases() != bases {
                                break;
                            }
                            continue;
                        }
                    };
                    let Some(e) = e else { break };
                    if let Event::Queues(v) = &e {
                        *shared.view.lock().await = Some((std::time::Instant::now(), v.clone()));
                    }
                    // No receiver now is fine: the next stream subscribes.
                    let _ = sender.send(e);
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
        *feed = Some(tx);
        rx
    }

    /// The tonic service.
    pub fn service(self) -> ExternalScalerServer<Keda> {
        ExternalScalerServer::new(self)
    }

    fn target(&self, r: &ScaledObjectRef) -> Result<Target, Status> {
        target_of(&r.scaler_metadata, &self.models)
    }

    async fn depth(&self, served: &str) -> Result<f64, Status> {
        let view = {
            // One caller reads the gateway; the others wait and share it.
            let mut cached = self.shared.view.lock().await;
            match cached.as_ref() {
                Some((at, v)) if at.elapsed() <= FRESH => v.clone(),
                _ => {
                    let v = self
                        .gateway
                        .queues()
                        .await
                        .map_err(|e| Status::unavailable(e.to_string()))?;
                    *cached = Some((std::time::Instant::now(), v.clone()));
                    v
                }
            }
        };
        let obs = observations(&view);
        let o = obs
            .get(served)
            .ok_or_else(|| Status::not_found(format!("the gateway has no model `{served}`")))?;
        Ok(o.waiting + o.in_flight)
    }
}

/// The target a ScaledObject's metadata describes (pure).
fn target_of(meta: &HashMap<String, String>, models: &[Model]) -> Result<Target, Status> {
    let name = meta
        .get("model")
        .ok_or_else(|| Status::invalid_argument("trigger metadata needs `model`"))?;
    let policy = models
        .iter()
        .find(|m| &m.served_name == name || &m.name == name);
    let number = |key: &str, default: f64| -> Result<f64, Status> {
        match meta.get(key) {
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && (0.0..=1e6).contains(x))
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "`{key}`: `{v}` is not a queue depth from 0 to 1000000"
                    ))
                }),
            None => Ok(default),
        }
    };
    let target = number(
        "targetQueueDepth",
        policy.map_or(8.0, |p| p.scaling.target_queue_depth),
    )?;
    let activation = number(
        "activationQueueDepth",
        policy.map_or(0.0, |p| p.scaling.activation_queue_depth),
    )?;
    let served = policy.map_or_else(|| name.clone(), |p| p.served_name.clone());
    let metric = format!(
        "gpuscale-queue-{}",
        served
            .to_lowercase()
            .replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    );
    Ok(Target {
        served,
        metric,
        target: target.max(1e-9),
        activation,
    })
}

type ActiveStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalScaler for Keda {
    async fn is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<IsActiveResponse>, Status> {
        let t = self.target(request.get_ref())?;
        let depth = self.depth(&t.served).await?;
        Ok(Response::new(IsActiveResponse {
            result: depth > t.activation,
        }))
    }

    type StreamIsActiveStream = ActiveStream;

    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<ActiveStream>, Status> {
        let t = self.target(request.get_ref())?;
        let Ok(slot) = self.shared.streams.clone().try_acquire_owned() else {
            return Err(Status::resource_exhausted(format!(
                "{MAX_STREAMS} streams are open already"
            )));
        };
        let first = self.depth(&t.served).await? > t.activation;
        let mut events = self.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            let _slot = slot;
            if tx
                .send(Ok(IsActiveResponse { result: first }))
                .await
                .is_err()
            {
                return;
            }
            let mut last = first;
            loop {
                // KEDA going away is noticed at once, not at the next
                // change to send: the gateway stream ends with it.
                let e = tokio::select! {
                    e = events.recv() => e,
                    () = tx.closed() => return,
                };
                let e = match e {
                    Ok(e) => e,
                    // Behind by more views than the channel holds: the
                    // next one is as good.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let active = match e {
                    Event::Queues(v) => observations(&v)
                        .get(&t.served)
                        .map(|o| o.waiting + o.in_flight > t.activation),
                    Event::ScaleFromZero { model } if model == t.served => Some(true),
                    Event::ScaleFromZero { .. } => None,
                };
                if let Some(a) = active
                    && a != last
                {
                    last = a;
                    if tx.send(Ok(IsActiveResponse { result: a })).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let t = self.target(request.get_ref())?;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: t.metric,
                target_size: t.target.ceil() as i64,
                target_size_float: t.target,
            }],
        }))
    }

    async fn get_metrics(
        &self,
        request: Request<GetMetricsRequest>,
    ) -> Result<Response<GetMetricsResponse>, Status> {
        let r = request.into_inner();
        let object = r
            .scaled_object_ref
            .ok_or_else(|| Status::invalid_argument("scaledObjectRef is missing"))?;
        let t = self.target(&object)?;
        let depth = self.depth(&t.served).await?;
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name: t.metric,
                metric_value: depth.round() as i64,
                metric_value_float: depth,
            }],
        }))
    }
}

/// What the scaler's listener allows its clients.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections served at once: KEDA's operator keeps one per scaler
    /// address (a few with several operators); past this, a new
    /// connection is closed at once, so sockets opened and left idle
    /// cannot take the process's file descriptors (the gateway's
    /// listeners share them). Default 256.
    pub connections: usize,
    /// A connection that sends nothing (not even its HTTP/2 preface) for
    /// this long is closed. Default 10 s.
    pub handshake: std::time::Duration,
    /// The server pings each connection this often; a live client
    /// answers. Default 30 s.
    pub keepalive: std::time::Duration,
    /// After its first bytes, a connection that sends nothing (no call,
    /// no answer to the pings) for this long is closed. Default 90 s.
    pub idle: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 256,
            handshake: std::time::Duration::from_secs(10),
            keepalive: std::time::Duration::from_secs(30),
            idle: std::time::Duration::from_secs(90),
        }
    }
}

/// One accepted connection: it holds its slot until it closes, and reads
/// fail once nothing has come in for its deadline ([`Limits::handshake`],
/// then [`Limits::idle`]).
struct Conn {
    inner: tokio::net::TcpStream,
    _slot: tokio::sync::OwnedSemaphorePermit,
    quiet: Pin<Box<tokio::time::Sleep>>,
    idle: std::time::Duration,
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::future::Future;
        use std::task::Poll;
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    let next = tokio::time::Instant::now() + self.idle;
                    self.quiet.as_mut().reset(next);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match self.quiet.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the KEDA scaler's client sent nothing in time",
                ))),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Serves the scaler on `addr` until `shutdown` turns true, within the
/// default [`Limits`]; returns the bound address and the serving task.
pub async fn serve(
    addr: std::net::SocketAddr,
    keda: Keda,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_within(addr, keda, shutdown, Limits::default()).await
}

/// [`serve`] within `limits`.
pub async fn serve_within(
    addr: std::net::SocketAddr,
    keda: Keda,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    limits: Limits,
) -> std::io::Result<(std::net::SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let (send, receive) = tokio::sync::mpsc::channel::<std::io::Result<Conn>>(16);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.connections));
    let accepting = tokio::spawn(async move {
        let (mut refused, mut failed) = (0u64, 0u64);
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off
                    // rather than spin on the error; said once per power
                    // of two.
                    failed += 1;
                    if failed.is_power_of_two() {
                        tracing::warn!(errors = failed, "KEDA scaler accept failed: {e}");
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                // Said once per power of two, not per connection.
                refused += 1;
                if refused.is_power_of_two() {
                    tracing::warn!(
                        refused,
                        "KEDA scaler: {} connections open; new ones are closed",
                        limits.connections
                    );
                }
                continue;
            };
            let _ = stream.set_nodelay(true);
            let conn = Conn {
                inner: stream,
                _slot: slot,
                quiet: Box::pin(tokio::time::sleep(limits.handshake)),
                idle: limits.idle,
            };
            if send.send(Ok(conn)).await.is_err() {
                return;
            }
        }
    });
    let task = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::ReceiverStream::new(receive);
        let stop = async move {
            let _ = shutdown.changed().await;
        };
        if let Err(e) = tonic::transport::Server::builder()
            // Calls in flight per connection (HTTP/2 multiplexes many).
            .concurrency_limit_per_connection(64)
            // A live client answers these; the quiet deadline closes one
            // that does not.
            .http2_keepalive_interval(Some(limits.keepalive))
            .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
            .add_service(keda.service())
            .serve_with_incoming_shutdown(incoming, stop)
            .await
        {
            tracing::error!("KEDA external scaler: {e}");
        }
        accepting.abort();
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_names_the_model_and_may_override_targets() {
        let meta: HashMap<String, String> =
            [("model".to_string(), "org/Model-7B".to_string())].into();
        let t = target_of(&meta, &[]).unwrap();
        assert_eq!(t.served, "org/Model-7B");
        assert_eq!(t.metric, "gpuscale-queue-org-model-7b");
        assert_eq!((t.target, t.activation), (8.0, 0.0));
        let mut meta = meta;
        meta.insert("targetQueueDepth".into(), "12".into());
        assert_eq!(target_of(&meta, &[]).unwrap().target, 12.0);
        meta.insert("targetQueueDepth".into(), "1e300".into());
        assert_eq!(
            target_of(&meta, &[]).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        meta.insert("targetQueueDepth".into(), "12".into());
        meta.insert("activationQueueDepth".into(), "x".into());
        assert_eq!(
            target_of(&meta, &[]).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            target_of(&HashMap::new(), &[]).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
