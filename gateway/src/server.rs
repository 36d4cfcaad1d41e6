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
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::config::Settings;
use crate::drain::Drain;
use crate::proxy::{self, Body, Worker};
use crate::state::{ScaleSignal, Shared};
use crate::timer::CoarseTimer;
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
    threads: Vec<std::thread::JoinHandle<()>>,
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
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// A listener on `addr` that shares its port with the other workers'.
fn reuseport_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    socket.set_reuseport(true)?;
    socket.set_nodelay(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Binds both listeners and serves until [`Running::shutdown`]: the first
/// traffic worker, the admin listener and the metrics scraper on the
/// caller's runtime, every other traffic worker on a thread of its own.
pub async fn start(settings: Settings) -> std::io::Result<Running> {
    let traffic_listener = reuseport_listener(settings.spec.listen)?;
    let admin_listener = TcpListener::bind(settings.spec.admin).await?;
    let traffic = traffic_listener.local_addr()?;
    let admin = admin_listener.local_addr()?;
    let workers = settings.spec.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
    });
    let shared = Shared::new(settings);
    let (shutdown, rx) = watch::channel(false);

    let mut threads = Vec::new();
    for i in 1..workers {
        let (shared, rx) = (shared.clone(), rx.clone());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("gateway-worker-{i}"))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match reuseport_listener(traffic) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = ready_tx.send(Ok(()));
                    let worker = Worker::new(shared.clone());
                    serve(listener, shared, rx, move |req| {
                        proxy::handle(worker.clone(), req)
                    })
                    .await;
                });
            })?;
        ready_rx
            .await
            .map_err(|_| std::io::Error::other("a gateway worker did not start"))??;
        threads.push(thread);
    }

    let worker = Worker::new(shared.clone());
    let upstream = worker.upstream.clone();
    let traffic_task = tokio::spawn(serve(
        traffic_listener,
        shared.clone(),
        rx.clone(),
        move |req| proxy::handle(worker.clone(), req),
    ));
    let s = shared.clone();
    let admin_rx = rx.clone();
    let admin_task = tokio::spawn(serve(
        admin_listener,
        shared.clone(),
        rx.clone(),
        move |req| admin::handle(s.clone(), admin_rx.clone(), req),
    ));
    let scrape_task = tokio::spawn(scrape::run(shared.clone(), upstream, rx));
    tracing::info!(%traffic, %admin, workers, models = shared.models.len(), "gateway listening");
    Ok(Running {
        traffic,
        admin,
        shared,
        shutdown,
        tasks: vec![traffic_task, admin_task, scrape_task],
        threads,
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
        .timer(CoarseTimer::start())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .keep_alive(true);
    let drain = Drain::default();
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
                let conn = drain.watch(conn, |c| c.graceful_shutdown());
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
    if tokio::time::timeout(limits.shutdown_grace, drain.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "shutdown grace of {:?} passed with connections open",
            limits.shutdown_grace
        );
    }
}
