//! The listeners: traffic and admin, HTTP/1.1 with keep-alive, header
//! size and header-read-time limits, graceful shutdown (stop accepting,
//! refuse new requests with 503, let requests in flight finish within the
//! grace period).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::config::Settings;
use crate::proxy::{self, Body};
use crate::state::{ScaleSignal, Shared};
use crate::{admin, scrape};

/// A running gateway.
pub struct Running {
    /// The traffic listener's address.
    pub traffic: SocketAddr,
    /// The admin listener's address.
    pub admin: SocketAddr,
    /// Shared state (for the embedded autoscaler: register replicas, read
    /// queues).
    pub shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// Scale-from-zero signals (the in-process channel of the embedded
    /// mode).
    pub fn signals(&self) -> broadcast::Receiver<ScaleSignal> {
        self.shared.signals.subscribe()
    }

    /// Stops accepting, answers new requests with 503, and waits (up to
    /// the grace period) for requests in flight to finish.
    pub async fn shutdown(self) {
        self.shared.shutting_down.store(true, Ordering::Relaxed);
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Binds both listeners and serves until [`Running::shutdown`].
pub async fn start(settings: Settings) -> std::io::Result<Running> {
    let traffic_listener = TcpListener::bind(settings.spec.listen).await?;
    let admin_listener = TcpListener::bind(settings.spec.admin).await?;
    let traffic = traffic_listener.local_addr()?;
    let admin = admin_listener.local_addr()?;
    let shared = Shared::new(settings);
    let (shutdown, rx) = watch::channel(false);
    let client = proxy::client(shared.settings.spec.upstream.connect_timeout);

    let s = shared.clone();
    let c = client.clone();
    let traffic_task = tokio::spawn(serve(
        traffic_listener,
        shared.clone(),
        rx.clone(),
        move |req| proxy::handle(s.clone(), c.clone(), req),
    ));
    let s = shared.clone();
    let admin_rx = rx.clone();
    let admin_task = tokio::spawn(serve(
        admin_listener,
        shared.clone(),
        rx.clone(),
        move |req| admin::handle(s.clone(), admin_rx.clone(), req),
    ));
    let scrape_task = tokio::spawn(scrape::run(shared.clone(), client, rx));
    tracing::info!(%traffic, %admin, models = shared.models.len(), "gateway listening");
    Ok(Running {
        traffic,
        admin,
        shared,
        shutdown,
        tasks: vec![traffic_task, admin_task, scrape_task],
    })
}

async fn serve<F, Fut>(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let limits = shared.settings.spec.limits.clone();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .keep_alive(true);
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let h = handler.clone();
                let service = service_fn(move |req| {
                    let h = h.clone();
                    async move { Ok::<_, std::convert::Infallible>(h(req).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!("connection ended: {e}");
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(limits.shutdown_grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "shutdown grace of {:?} passed with connections open",
            limits.shutdown_grace
        );
    }
}
