//! The listeners: traffic (the gateway's own HTTP/1.1, [`traffic`]) and
//! admin (hyper's), both with keep-alive, header size and header-read-time
//! limits, a connection cap, and graceful shutdown (stop accepting, refuse
//! new requests with 503, let requests in flight finish within the grace
//! period).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;

use crate::client_io::ClientIo;
use crate::config::Settings;
use crate::drain::Drain;
use crate::proxy::{Body, Worker};
use crate::state::{ScaleSignal, Shared};
use crate::timer::CoarseTimer;
use crate::{admin, scrape, traffic};

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

    /// The drain of `spec.drain`: `/readyz` turns 503 and new requests get
    /// 503 with `Retry-After` at once; the listeners keep accepting for
    /// `drain.announce`; then they stop accepting and requests in flight
    /// get up to `drain.timeout` to finish.
    pub async fn shutdown(self) {
        self.shared.shutting_down.store(true, Ordering::Relaxed);
        self.shared.version.send_modify(|v| *v += 1);
        tokio::time::sleep(self.shared.settings.spec.drain.announce).await;
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

/// Fails when anything already listens on `addr`. The workers' sockets
/// share the port with `SO_REUSEPORT`, which would also let a second
/// process (another gateway started by mistake) join the group and take a
/// share of the traffic; a socket bound without it conflicts with any
/// listener on the port, so binding one first tells.
fn ensure_port_free(addr: SocketAddr) -> std::io::Result<()> {
    if addr.port() == 0 {
        return Ok(());
    }
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr).map(drop)
}

fn listen_error(what: &str, addr: SocketAddr, e: std::io::Error) -> std::io::Error {
    let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
        " (another process, perhaps another gateway, listens there)"
    } else {
        ""
    };
    std::io::Error::new(e.kind(), format!("{what} listener {addr}: {e}{hint}"))
}

/// Binds both listeners and serves until [`Running::shutdown`]: the first
/// traffic worker, the admin listener and the metrics scraper on the
/// caller's runtime, every other traffic worker on a thread of its own.
///
/// Fails, before binding anything, on an admin listener off loopback
/// without a token ([`Settings::check_exposure`]), and on a port that is
/// taken.
pub async fn start(mut settings: Settings) -> std::io::Result<Running> {
    settings
        .check_exposure()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let listen = settings.spec.listen;
    ensure_port_free(listen).map_err(|e| listen_error("traffic", listen, e))?;
    let traffic_listener =
        reuseport_listener(listen).map_err(|e| listen_error("traffic", listen, e))?;
    let admin_listener = TcpListener::bind(settings.spec.admin)
        .await
        .map_err(|e| listen_error("admin", settings.spec.admin, e))?;
    let traffic = traffic_listener.local_addr()?;
    let admin = admin_listener.local_addr()?;
    // As bound (a port 0 chosen by the system): registration refuses
    // the gateway's own listeners by these.
    settings.spec.listen = traffic;
    settings.spec.admin = admin;
    // The pod's IP (the downward API's `status.podIP`, as deploy/ sets
    // it) is one of this host's addresses a listener on 0.0.0.0 takes.
    settings.registration.local = std::env::var("POD_IP")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .into_iter()
        .collect();
    let workers = settings.spec.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
    });
    let shared = Shared::new(settings);
    let (shutdown, rx) = watch::channel(false);
    let limits = shared.settings.spec.limits.clone();
    // The caps must hold before the process runs out of descriptors: at
    // the cap a client gets 503; out of descriptors it gets nothing, and
    // a failed connect to a replica would look like the replica's fault.
    let nofile = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(u64::MAX);
    let caps = connection_caps(nofile, limits.max_connections, limits.max_admin_connections);
    if let Some(why) = &caps.lowered {
        tracing::warn!("{why}");
    }
    let traffic_conns = Connections::new(caps.traffic);

    let mut threads = Vec::new();
    for i in 1..workers {
        let (shared, rx, conns) = (shared.clone(), rx.clone(), traffic_conns.clone());
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
                    serve_traffic(listener, worker, conns, rx).await;
                });
            })?;
        ready_rx
            .await
            .map_err(|_| std::io::Error::other("a gateway worker did not start"))??;
        threads.push(thread);
    }

    let worker = Worker::new(shared.clone());
    let upstream = worker.upstream.clone();
    let traffic_task = tokio::spawn(serve_traffic(
        traffic_listener,
        worker,
        traffic_conns,
        rx.clone(),
    ));
    let s = shared.clone();
    let admin_rx = rx.clone();
    let admin_task = tokio::spawn(serve_admin(
        admin_listener,
        shared.clone(),
        Connections::new(caps.admin),
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

/// Descriptors kept for everything but connections (listeners, the
/// runtime, logs, the scrape and stream clients).
pub const RESERVED_DESCRIPTORS: u64 = 64;

/// The connection caps the open-file limit allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caps {
    /// Traffic connections.
    pub traffic: usize,
    /// Admin connections.
    pub admin: usize,
    /// Why the configured caps were lowered, if they were.
    pub lowered: Option<String>,
}

/// The configured caps, lowered to what `nofile` descriptors hold (pure):
/// a traffic connection may take two (the client's and one to a
/// replica), an admin connection one, and [`RESERVED_DESCRIPTORS`] are
/// kept. Admin gets at most a quarter of what is left, traffic the rest.
pub fn connection_caps(nofile: u64, traffic: usize, admin: usize) -> Caps {
    let room = nofile.saturating_sub(RESERVED_DESCRIPTORS);
    let wanted = 2 * traffic as u64 + admin as u64;
    if wanted <= room {
        return Caps {
            traffic,
            admin,
            lowered: None,
        };
    }
    let admin_now = (admin as u64).min(room / 4).max(1);
    let traffic_now = (room.saturating_sub(admin_now) / 2).clamp(1, traffic as u64);
    Caps {
        traffic: traffic_now as usize,
        admin: admin_now as usize,
        lowered: Some(format!(
            "the open-file limit is {nofile} (raised to its hard limit): connection caps lowered from \
             limits.maxConnections {traffic} and limits.maxAdminConnections {admin} to {traffic_now} \
             and {admin_now}, so a client over them gets 503 rather than no answer (raise `ulimit -n` \
             or LimitNOFILE to keep them)"
        )),
    }
}

/// Connections open on one port (all workers), against its cap.
#[derive(Clone)]
struct Connections {
    open: Arc<AtomicUsize>,
    cap: usize,
    /// Refusals at the cap and failed accepts, logged at most once in
    /// [`Throttle::EVERY`] each.
    refused: Arc<Throttle>,
    failed: Arc<Throttle>,
}

/// A warning that may repeat thousands of times a second (a connection
/// flood): said once, then at most once per [`Throttle::EVERY`] with how
/// many were not said in between.
#[derive(Default)]
struct Throttle {
    /// Milliseconds since `start` of the last time it was said.
    last_ms: AtomicU64,
    suppressed: AtomicU64,
    start: std::sync::OnceLock<std::time::Instant>,
}

impl Throttle {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(10);

    fn note(&self, say: impl FnOnce(u64)) {
        let start = self.start.get_or_init(std::time::Instant::now);
        let now = start.elapsed().as_millis() as u64 + 1;
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last) >= Self::EVERY.as_millis() as u64;
        if due
            && self
                .last_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            say(self.suppressed.swap(0, Ordering::Relaxed));
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Connections {
    fn new(cap: usize) -> Self {
        Connections {
            open: Arc::new(AtomicUsize::new(0)),
            cap,
            refused: Arc::default(),
            failed: Arc::default(),
        }
    }

    /// A slot for a new connection, or `None` at the cap.
    fn open(&self) -> Option<ConnectionSlot> {
        let mut n = self.open.load(Ordering::Relaxed);
        loop {
            if n >= self.cap {
                return None;
            }
            match self
                .open
                .compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(ConnectionSlot(self.open.clone())),
                Err(now) => n = now,
            }
        }
    }
}

struct ConnectionSlot(Arc<AtomicUsize>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The answer to a connection over the cap: written at once, then the
/// connection is closed after the client's request has been read (so
/// the close is a FIN the client sees after the answer, not a reset).
const OVER_CAPACITY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 109\r\n\r\n{\"error\":{\"message\":\"the gateway has too many open connections; retry later\",\"type\":\"overloaded\",\"code\":503}}";

/// What a connection over the admin cap is answered when it is a probe:
/// liveness and readiness are the gateway's own, whoever holds the
/// connections (idle or half-sent ones cannot fail the kubelet's probes
/// and get a healthy gateway taken out of its Service or restarted).
fn probe_answer(request: &[u8], shared: &Shared) -> Option<&'static [u8]> {
    let path = request.strip_prefix(b"GET ")?;
    let is = |p: &[u8]| {
        path.strip_prefix(p)
            .is_some_and(|rest| rest.first().is_some_and(|&c| c == b' ' || c == b'?'))
    };
    if is(b"/healthz") {
        Some(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: 3\r\n\r\nok\n")
    } else if is(b"/readyz") {
        Some(if shared.shutting_down.load(Ordering::Relaxed) {
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: 14\r\n\r\nshutting down\n"
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\nconnection: close\r\ncontent-length: 6\r\n\r\nready\n"
        })
    } else {
        None
    }
}

/// Connections over the admin cap served anyway because their first
/// request carries the admin token: the cap is counted before any request
/// is read, so idle connections from anyone who can connect could
/// otherwise keep the autoscaler out.
const TOKEN_CONNECTIONS: usize = 16;

/// The same for the read-only token (`spec.readTokenFile`: Prometheus,
/// dashboards).
const READ_TOKEN_CONNECTIONS: usize = 4;

/// Which token the request head read so far carries in its
/// `Authorization` field, if any.
fn carries_token(request: &[u8], shared: &Shared) -> Option<Holder> {
    let settings = &shared.settings;
    if settings.admin_token.is_none() && settings.read_token.is_none() {
        return None;
    }
    let head = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(request, |end| &request[..end]);
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let (name, value) = line.split_at_checked(14)?;
        if !name.eq_ignore_ascii_case(b"authorization:") {
            return None;
        }
        let value = HeaderValue::from_bytes(value.trim_ascii()).ok()?;
        if settings
            .admin_token
            .as_ref()
            .is_some_and(|t| t.verify(Some(&value)))
        {
            Some(Holder::Admin)
        } else if settings
            .read_token
            .as_ref()
            .is_some_and(|t| t.verify(Some(&value)))
        {
            Some(Holder::Reader)
        } else {
            None
        }
    })
}

/// Whose token a connection over the admin cap carries: each has places
/// of its own ([`TOKEN_CONNECTIONS`], [`READ_TOKEN_CONNECTIONS`]), so
/// idle connections from anyone who can connect keep neither the
/// autoscaler nor the monitoring that scrapes with the read-only token
/// out, and a reader cannot take the autoscaler's places.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    Admin,
    Reader,
}

/// Answers a connection over the cap: 503, or on the admin port a probe's
/// real answer ([`probe_answer`]); on the admin port a request with the
/// admin or the read-only token is handed back with what was read of it
/// and whose token it carries, to be served.
async fn refuse(
    mut stream: tokio::net::TcpStream,
    admin: Option<Arc<Shared>>,
) -> Option<(TcpStream, Bytes, Holder)> {
    use tokio::io::AsyncReadExt;
    // Read what the client sent so far, answer, then close lingering.
    let mut buf = [0u8; 4096];
    let n = tokio::time::timeout(std::time::Duration::from_millis(50), stream.read(&mut buf))
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or(0);
    let answer = match admin.as_deref() {
        Some(s) => match probe_answer(&buf[..n], s) {
            Some(a) => a,
            None => match carries_token(&buf[..n], s) {
                Some(holder) => {
                    return Some((stream, Bytes::copy_from_slice(&buf[..n]), holder));
                }
                None => OVER_CAPACITY,
            },
        },
        None => OVER_CAPACITY,
    };
    answer_and_close(stream, answer).await;
    None
}

/// Writes `answer` (within a second), then closes lingering.
async fn answer_and_close(mut stream: TcpStream, answer: &'static [u8]) {
    use tokio::io::AsyncWriteExt;
    let written =
        tokio::time::timeout(std::time::Duration::from_secs(1), stream.write_all(answer)).await;
    if matches!(written, Ok(Ok(()))) {
        crate::client_io::linger(stream).await;
    }
}

/// Accepts on `listener` until shutdown, within the connection cap, and
/// serves each connection with `connection` on a task of its own (given
/// the listener's drain to watch it with); then waits for the watched
/// connections, up to the drain timeout.
async fn serve<F, Fut>(
    listener: TcpListener,
    shared: Arc<Shared>,
    connections: Connections,
    probes: bool,
    mut shutdown: watch::Receiver<bool>,
    connection: F,
) where
    F: Fn(TcpStream, Bytes, SocketAddr, &Drain) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let drain = Drain::default();
    // Over-cap connections whose request carries the admin or the
    // read-only token (admin port only), with what was read of them and
    // whose token it is.
    let (over_tx, mut over_rx) =
        tokio::sync::mpsc::channel::<(TcpStream, Bytes, SocketAddr, Holder)>(16);
    let reserved = Connections::new(TOKEN_CONNECTIONS);
    let reserved_read = Connections::new(READ_TOKEN_CONNECTIONS);
    loop {
        tokio::select! {
            Some((stream, prefix, peer, holder)) = over_rx.recv() => {
                let places = match holder {
                    Holder::Admin => &reserved,
                    Holder::Reader => &reserved_read,
                };
                match places.open() {
                    Some(slot) => {
                        let conn = connection(stream, prefix, peer, &drain);
                        tokio::spawn(async move {
                            conn.await;
                            drop(slot);
                        });
                    }
                    None => {
                        tokio::spawn(answer_and_close(stream, OVER_CAPACITY));
                    }
                }
            }
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors and the like: back off.
                        connections.failed.note(|suppressed| {
                            tracing::warn!(suppressed, "accept failed: {e}");
                        });
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let Some(slot) = connections.open() else {
                    connections.refused.note(|suppressed| {
                        tracing::warn!(
                            cap = connections.cap,
                            suppressed,
                            "connection cap reached: answering 503"
                        );
                    });
                    let admin = probes.then(|| shared.clone());
                    let tx = over_tx.clone();
                    tokio::spawn(async move {
                        if let Some((stream, prefix, holder)) = refuse(stream, admin).await {
                            let _ = tx.send((stream, prefix, peer, holder)).await;
                        }
                    });
                    continue;
                };
                let conn = connection(stream, Bytes::new(), peer, &drain);
                tokio::spawn(async move {
                    conn.await;
                    drop(slot);
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    let timeout = shared.settings.spec.drain.timeout;
    if tokio::time::timeout(timeout, drain.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain timeout of {timeout:?} passed with connections open");
    }
}

/// The traffic listener of one worker: the gateway's own HTTP/1.1
/// ([`traffic`]).
async fn serve_traffic(
    listener: TcpListener,
    worker: Arc<Worker>,
    connections: Connections,
    shutdown: watch::Receiver<bool>,
) {
    let shared = worker.shared.clone();
    serve(
        listener,
        shared,
        connections,
        false,
        shutdown,
        move |stream, _prefix, peer, drain| {
            let conn = traffic::serve(stream, peer, worker.clone(), drain.clone());
            // The connection sees the drain itself, between requests.
            drain.watch(conn, |_| {})
        },
    )
    .await;
}

/// The admin listener: hyper's HTTP/1.1 with keep-alive, the header size
/// and header-read-time limits.
async fn serve_admin<F, Fut>(
    listener: TcpListener,
    shared: Arc<Shared>,
    connections: Connections,
    shutdown: watch::Receiver<bool>,
    handler: F,
) where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Body>> + Send + 'static,
{
    let limits = shared.settings.spec.limits.clone();
    let timer = CoarseTimer::start();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(timer.clone())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes)
        .keep_alive(true);
    serve(
        listener,
        shared,
        connections,
        true,
        shutdown,
        move |stream, prefix, _peer, drain| {
            let h = handler.clone();
            let service = service_fn(move |req| {
                let h = h.clone();
                async move { Ok::<_, std::convert::Infallible>(h(req).await) }
            });
            let io = ClientIo::new(stream, timer.clone(), limits.write_timeout).with_prefix(prefix);
            let conn = builder.serve_connection(TokioIo::new(io), service);
            let conn = drain.watch(conn, |c| c.graceful_shutdown());
            async move {
                if let Err(e) = conn.await {
                    tracing::debug!("connection ended: {e}");
                }
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_fit_the_open_file_limit() {
        // Room enough: as configured.
        let c = connection_caps(1 << 20, 16_384, 256);
        assert_eq!((c.traffic, c.admin, c.lowered), (16_384, 256, None));
        // The common soft limit of 1,024: 2 per traffic connection, 1 per
        // admin one, 64 kept.
        let c = connection_caps(1024, 16_384, 256);
        assert_eq!((c.traffic, c.admin), (360, 240));
        assert!(2 * c.traffic + c.admin + 64 <= 1024);
        let why = c.lowered.unwrap();
        assert!(
            why.contains("1024") && why.contains("16384") && why.contains("360"),
            "{why}"
        );
        // Absurdly low: never zero.
        let c = connection_caps(10, 100, 10);
        assert_eq!((c.traffic, c.admin), (1, 1));
    }

    #[test]
    fn the_gateways_own_shortages_are_told_apart_from_a_replicas_refusal() {
        use crate::upstream::local_shortage;
        let os = std::io::Error::from_raw_os_error;
        assert_eq!(local_shortage(&os(24)), Some("file descriptors"));
        assert_eq!(local_shortage(&os(23)), Some("file descriptors"));
        // EADDRNOTAVAIL is also an unusable replica address: the replica's.
        assert_eq!(local_shortage(&os(99)), None);
        // ECONNREFUSED, EHOSTUNREACH: the replica's side.
        assert_eq!(local_shortage(&os(111)), None);
        assert_eq!(local_shortage(&os(113)), None);
        assert_eq!(
            local_shortage(&std::io::Error::new(std::io::ErrorKind::TimedOut, "x")),
            None
        );
    }
}
