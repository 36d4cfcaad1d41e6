//! Keep-alive HTTP/1.1 connections to replicas, one pool per traffic
//! worker, and the client that drives them: the request is written in one
//! system call (head and body together), the response head is parsed off
//! the connection's read buffer, and the body is read from the socket by
//! the request's own task as the client's side asks for it ([`h1`] holds
//! the pure encoding and parsing).
//!
//! Each worker is a single-threaded event loop, so its pool is touched by
//! one thread only and needs no coordination beyond an uncontended lock.
//! A request takes the most recently used idle connection to its replica
//! (or opens one within the connect timeout); the connection comes back
//! to the pool when the response body has been read to its end
//! ([`UpstreamBody`]), and a body dropped before that drops its
//! connection, which is how the replica sees a cancelled request. A pooled
//! connection the replica closed is noticed when it is taken (its socket
//! turned readable while idle) or when the request cannot be written to
//! it, and the request goes on a fresh connection; a request that was
//! written is never repeated. Idle connections expire after the idle
//! timeout; a sweep closes expired ones and ones the replica closed even
//! when no traffic comes.
//!
//! Why not hyper's client: hyper-util's pooled client hashes a pool key
//! under a shared lock, races a connect future and spawns a task per
//! request to return the connection; hyper's low-level connection runs in
//! a task of its own, fed through channels, so every request crosses
//! tasks twice. Against nginx that was 40 % of the gateway's instructions
//! per request (`bench/README.md`).

use std::collections::{HashMap, VecDeque};
use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Response};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::Endpoint;
use crate::h1::{self, Chunked, Decoded, Framing, H1Error, RawResponse};
use crate::lock;

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// No connection could be opened: nothing was sent, another replica
    /// may be tried.
    #[error("connect to {endpoint}: {reason}")]
    Connect {
        /// `host:port`.
        endpoint: String,
        /// What went wrong.
        reason: String,
    },
    /// No connection could be opened for want of the gateway's own
    /// resources (descriptors, ephemeral ports, memory): not the
    /// replica's fault, and no other replica would fare better.
    #[error("the gateway is out of {0}")]
    Local(&'static str),
    /// The connection failed after the request may have been sent.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The replica closed the connection without a response.
    #[error("the replica closed the connection before responding")]
    Closed,
    /// The replica's response is not valid HTTP/1.1.
    #[error("{0}")]
    Protocol(#[from] H1Error),
}

/// What the gateway itself ran out of, when a connect failed for that
/// (Linux's errno values): descriptors (`EMFILE`, `ENFILE`), buffers or
/// memory (`ENOBUFS`, `ENOMEM`). `EADDRNOTAVAIL` is left to the replica:
/// it also means an address that cannot be reached from here.
pub fn local_shortage(e: &io::Error) -> Option<&'static str> {
    if !cfg!(target_os = "linux") {
        return None;
    }
    match e.raw_os_error()? {
        23 | 24 => Some("file descriptors"),
        12 | 105 => Some("memory"),
        _ => None,
    }
}

impl SendError {
    /// Nothing reached the replica.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect { .. })
    }
}

/// A request to forward: its method, origin-form target, the client's
/// headers (hop-by-hop ones, `Host`, `Content-Length` and `Expect` are
/// left out when sent) and its whole body.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Method.
    pub method: &'a Method,
    /// Path and query.
    pub target: &'a str,
    /// The client's headers.
    pub headers: &'a HeaderMap,
    /// The body, read whole; sent with its length when the method is one
    /// that carries a body or it is not empty.
    pub body: &'a Bytes,
}

/// A pool of connections to replicas; cheap to clone (shared).
#[derive(Clone)]
pub struct Upstream {
    inner: Arc<Inner>,
}

struct Inner {
    // Keyed by replica; foldhash, not SipHash: the keys come from the
    // configuration and the admin API, not from clients.
    idle: Mutex<HashMap<Endpoint, VecDeque<Idle>, foldhash::fast::RandomState>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle_per_replica: usize,
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// One keep-alive connection and what was read from it but not yet used.
struct Conn {
    stream: TcpStream,
    buf: BytesMut,
}

const READ_CHUNK: usize = 16 * 1024;

impl Conn {
    /// Reads what the socket has into the buffer; `Ok(0)` at its end.
    /// (Through tokio's `poll_read`, which takes a read that did not fill
    /// the buffer as proof the socket is drained: no second read to see
    /// `EAGAIN`, and no system call in [`Conn::reusable`] after it.)
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 4 {
            self.buf.reserve(READ_CHUNK);
        }
        std::pin::pin!(self.stream.read_buf(&mut self.buf)).poll(cx)
    }

    /// Still open, with nothing unasked-for to read: checked without a
    /// system call unless the socket became readable while idle.
    fn reusable(&self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(Waker::noop());
        match self.stream.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            Poll::Ready(Ok(())) => matches!(
                self.stream.try_read(&mut [0u8; 1]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock
            ),
        }
    }

    /// Writes the head and the body, in one system call when the socket
    /// takes it all.
    async fn write(&mut self, head: &[u8], body: &[u8]) -> io::Result<()> {
        let total = head.len() + body.len();
        let mut done = 0;
        while done < total {
            let n = if done < head.len() {
                let bufs = [IoSlice::new(&head[done..]), IoSlice::new(body)];
                self.stream.write_vectored(&bufs).await?
            } else {
                self.stream.write(&body[done - head.len()..]).await?
            };
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            done += n;
        }
        Ok(())
    }
}

impl Upstream {
    /// A pool whose connects give up after `connect_timeout` and whose idle
    /// connections close after `idle_timeout`. Must be called on a tokio
    /// runtime: a task there closes idle connections that expired or that
    /// the replica closed, so none lingers half-closed after traffic stops.
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> Self {
        let inner = Arc::new(Inner {
            idle: Mutex::new(HashMap::default()),
            connect_timeout,
            idle_timeout,
            max_idle_per_replica: 1024,
        });
        let weak = Arc::downgrade(&inner);
        let period = idle_timeout.clamp(Duration::from_millis(10), Duration::from_secs(1));
        tokio::spawn(sweep(weak, period));
        Upstream { inner }
    }

    /// Idle connections to `endpoint`.
    pub fn idle(&self, endpoint: &Endpoint) -> usize {
        lock(&self.inner.idle)
            .get(endpoint)
            .map_or(0, VecDeque::len)
    }

    /// Sends `req` to `endpoint` and reads the response head. The body
    /// streams from the connection; the connection returns to the pool
    /// when the body has been read to its end, and closes when the body is
    /// dropped before that.
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        req: Outgoing<'_>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        let mut head = Vec::with_capacity(256);
        let with_length = matches!(*req.method, Method::POST | Method::PUT | Method::PATCH)
            || !req.body.is_empty();
        h1::encode_request(
            &mut head,
            req.method,
            req.target,
            endpoint.host_header(),
            req.headers,
            with_length.then_some(req.body.len()),
        );
        let (raw, body) = self
            .send_head(endpoint, &head, req.body, *req.method == Method::HEAD)
            .await?;
        let head = raw.into_head()?;
        let mut resp = Response::new(body);
        *resp.status_mut() = head.status;
        *resp.headers_mut() = head.headers;
        Ok(resp)
    }

    /// Sends a request whose head the caller encoded (with `endpoint`'s
    /// `Host`) and its body, and reads the response head, kept as bytes
    /// to be relayed. `head_request`: the method is `HEAD`. The body
    /// behaves as [`Upstream::send`]'s.
    pub async fn send_head(
        &self,
        endpoint: &Endpoint,
        head: &[u8],
        body: &[u8],
        head_request: bool,
    ) -> Result<(RawResponse, UpstreamBody), SendError> {
        let mut conn = loop {
            match self.checkout(endpoint) {
                Some(mut conn) => match conn.write(head, body).await {
                    Ok(()) => break conn,
                    // Closed by the replica as it was taken: nothing was
                    // received, try the next one.
                    Err(e) => tracing::debug!("pooled connection to {endpoint} failed: {e}"),
                },
                None => {
                    let mut conn = self.connect(endpoint).await?;
                    conn.write(head, body).await?;
                    break conn;
                }
            }
        };
        let head = loop {
            if !conn.buf.is_empty()
                && let Some(head) = h1::parse_raw_response(&mut conn.buf, head_request)?
            {
                break head;
            }
            if poll_fn(|cx| conn.poll_fill(cx)).await? == 0 {
                return Err(SendError::Closed);
            }
        };
        let framing = match head.framing {
            Framing::Empty => BodyFraming::Done,
            Framing::Length(n) => BodyFraming::Length(n),
            Framing::Chunked => BodyFraming::Chunked(Chunked::default()),
            Framing::Close => BodyFraming::Close,
        };
        let mut body = UpstreamBody {
            conn: Some(conn),
            framing,
            keep_alive: head.keep_alive,
            pool: self.clone(),
            endpoint: endpoint.clone(),
        };
        if matches!(body.framing, BodyFraming::Done) {
            body.finish();
        }
        Ok((head, body))
    }

    /// The most recently used idle connection that is still open.
    fn checkout(&self, endpoint: &Endpoint) -> Option<Conn> {
        let mut idle = lock(&self.inner.idle);
        let queue = idle.get_mut(endpoint)?;
        self.close_expired(queue, Instant::now());
        while let Some(i) = queue.pop_back() {
            if i.conn.reusable() {
                return Some(i.conn);
            }
        }
        None
    }

    async fn connect(&self, endpoint: &Endpoint) -> Result<Conn, SendError> {
        let fail = |reason: String| SendError::Connect {
            endpoint: endpoint.authority().to_string(),
            reason,
        };
        let stream = tokio::time::timeout(
            self.inner.connect_timeout,
            TcpStream::connect(endpoint.authority()),
        )
        .await
        .map_err(|_| fail(format!("timed out after {:?}", self.inner.connect_timeout)))?
        .map_err(|e| match local_shortage(&e) {
            Some(what) => SendError::Local(what),
            None => fail(e.to_string()),
        })?;
        let _ = stream.set_nodelay(true);
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
        })
    }

    /// Closes what sat idle too long (oldest first).
    fn close_expired(&self, queue: &mut VecDeque<Idle>, now: Instant) {
        while queue
            .front()
            .is_some_and(|i| now.duration_since(i.since) >= self.inner.idle_timeout)
        {
            queue.pop_front();
        }
    }

    fn put_back(&self, endpoint: &Endpoint, conn: Conn) {
        if !conn.buf.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut idle = lock(&self.inner.idle);
        if let Some(queue) = idle.get_mut(endpoint) {
            self.close_expired(queue, now);
            if queue.len() < self.inner.max_idle_per_replica {
                queue.push_back(Idle { conn, since: now });
            }
        } else {
            idle.insert(
                endpoint.clone(),
                VecDeque::from([Idle { conn, since: now }]),
            );
        }
    }
}

/// Every `period` until the pool is gone: closes idle connections that
/// expired or that their replica closed, and forgets empty queues.
async fn sweep(pool: Weak<Inner>, period: Duration) {
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = pool.upgrade() else { return };
        let now = Instant::now();
        lock(&inner.idle).retain(|_, queue| {
            queue.retain(|i| now.duration_since(i.since) < inner.idle_timeout && i.conn.reusable());
            !queue.is_empty()
        });
    }
}

#[derive(Debug)]
enum BodyFraming {
    Length(u64),
    Chunked(Chunked),
    Close,
    Done,
}

/// A response body read from a pooled connection, chunk by chunk as it
/// arrives. Read to its end, it hands the connection back to the pool (if
/// the replica keeps it alive); dropped before that, it closes it, which
/// is how the replica sees a cancelled request.
pub struct UpstreamBody {
    conn: Option<Conn>,
    framing: BodyFraming,
    keep_alive: bool,
    pool: Upstream,
    endpoint: Endpoint,
}

impl std::fmt::Debug for UpstreamBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamBody")
            .field("framing", &self.framing)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// How a response body failed.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The connection failed.
    #[error("reading the replica's response: {0}")]
    Io(#[from] io::Error),
    /// The replica closed the connection before the body's end.
    #[error("the replica closed the connection before the end of the response")]
    Truncated,
    /// Broken chunked framing.
    #[error("{0}")]
    Protocol(#[from] H1Error),
}

impl UpstreamBody {
    fn finish(&mut self) {
        self.framing = BodyFraming::Done;
        if let Some(conn) = self.conn.take()
            && self.keep_alive
        {
            self.pool.put_back(&self.endpoint, conn);
        }
    }

    fn fail(&mut self, e: BodyError) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        self.framing = BodyFraming::Done;
        self.conn = None;
        Poll::Ready(Some(Err(e)))
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = self.get_mut();
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            // What the buffer already holds.
            let (data, ended) = match &mut this.framing {
                BodyFraming::Done => return Poll::Ready(None),
                BodyFraming::Length(left) if !conn.buf.is_empty() => {
                    let n = (*left).min(conn.buf.len() as u64);
                    *left -= n;
                    (Some(conn.buf.split_to(n as usize).freeze()), *left == 0)
                }
                BodyFraming::Chunked(decoder) => match decoder.decode(&mut conn.buf) {
                    Ok(Decoded::Data(data)) => (Some(data), false),
                    Ok(Decoded::End) => (None, true),
                    Ok(Decoded::NeedMore) => (None, false),
                    Err(e) => return this.fail(e.into()),
                },
                BodyFraming::Close if !conn.buf.is_empty() => {
                    (Some(conn.buf.split().freeze()), false)
                }
                BodyFraming::Length(_) | BodyFraming::Close => (None, false),
            };
            if ended {
                this.finish();
            }
            if let Some(data) = data {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if ended {
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match ready!(conn.poll_fill(cx)) {
                Ok(0) if matches!(this.framing, BodyFraming::Close) => {
                    this.framing = BodyFraming::Done;
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(0) => return this.fail(BodyError::Truncated),
                Ok(_) => {}
                Err(e) => return this.fail(e.into()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.framing, BodyFraming::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            BodyFraming::Length(n) => SizeHint::with_exact(n),
            BodyFraming::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}
