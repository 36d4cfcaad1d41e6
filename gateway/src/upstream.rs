//! Keep-alive HTTP/1.1 connections to replicas, one pool per traffic
//! worker, on hyper's low-level client (`hyper::client::conn::http1`).
//!
//! Each worker is a single-threaded event loop, so its pool is touched by
//! one thread only and needs no coordination beyond an uncontended lock.
//! A request takes the most recently used idle connection to its replica
//! (or opens one within the connect timeout), and the connection comes
//! back to the pool when the response's last byte has been passed on
//! ([`Lease::release`]); a response cut short drops its connection, which
//! is how the replica sees a cancelled request. A request that a pooled
//! connection could not even start (the replica had just closed it) is
//! sent again on a fresh connection; one that was sent is never repeated.
//! A connection idle for longer than the idle timeout is closed, not
//! reused, when the pool is next touched.
//!
//! hyper-util's pooled client does the same for any executor and any
//! thread; the gateway uses this one because its per-request overhead (a
//! pool-key hash under a shared lock, a racing connect future, a task
//! spawned per request to return the connection, an absolute URI rebuilt
//! into origin form) was measurable against nginx (`bench/README.md`).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::Authority;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::Endpoint;

type Sender = SendRequest<Full<Bytes>>;

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
    /// The connection failed after the request may have been sent.
    #[error("{0}")]
    Http(#[from] hyper::Error),
}

impl SendError {
    /// Nothing reached the replica.
    pub fn is_connect(&self) -> bool {
        matches!(self, SendError::Connect { .. })
    }
}

/// A pool of connections to replicas; cheap to clone (shared).
#[derive(Clone)]
pub struct Upstream {
    inner: Arc<Inner>,
}

struct Inner {
    idle: Mutex<HashMap<Authority, VecDeque<Idle>>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle_per_replica: usize,
}

struct Idle {
    sender: Sender,
    since: Instant,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Upstream {
    /// A pool whose connects give up after `connect_timeout` and whose idle
    /// connections close after `idle_timeout`.
    pub fn new(connect_timeout: Duration, idle_timeout: Duration) -> Self {
        Upstream {
            inner: Arc::new(Inner {
                idle: Mutex::new(HashMap::new()),
                connect_timeout,
                idle_timeout,
                max_idle_per_replica: 1024,
            }),
        }
    }

    /// Idle connections to `endpoint`.
    pub fn idle(&self, endpoint: &Endpoint) -> usize {
        lock(&self.inner.idle)
            .get(endpoint.uri_authority())
            .map_or(0, VecDeque::len)
    }

    /// Sends `req` (origin-form URI, `Host` set) to `endpoint`. The lease
    /// holds the connection until the response has been read.
    pub async fn send(
        &self,
        endpoint: &Endpoint,
        mut req: Request<Full<Bytes>>,
    ) -> Result<(Response<Incoming>, Lease), SendError> {
        loop {
            let (mut sender, reused) = match self.checkout(endpoint).await {
                Some(s) => (s, true),
                None => (self.connect(endpoint).await?, false),
            };
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    let lease = Lease {
                        pool: self.clone(),
                        endpoint: endpoint.clone(),
                        sender: Some(sender),
                    };
                    return Ok((resp, lease));
                }
                Err(mut e) => match e.take_message() {
                    // Not started on a connection the replica had closed:
                    // again, on a fresh one if need be.
                    Some(r) if reused => req = r,
                    _ => return Err(SendError::Http(e.into_error())),
                },
            }
        }
    }

    /// The most recently used live idle connection, ready for a request.
    async fn checkout(&self, endpoint: &Endpoint) -> Option<Sender> {
        loop {
            let mut sender = {
                let mut idle = lock(&self.inner.idle);
                let queue = idle.get_mut(endpoint.uri_authority())?;
                self.close_expired(queue, Instant::now());
                queue.pop_back()?.sender
            };
            if sender.is_closed() {
                continue;
            }
            // Ready at once unless the connection is still finishing the
            // last response; an error means it closed.
            if sender.ready().await.is_ok() {
                return Some(sender);
            }
        }
    }

    async fn connect(&self, endpoint: &Endpoint) -> Result<Sender, SendError> {
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
        .map_err(|e| fail(e.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| fail(e.to_string()))?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("upstream connection ended: {e}");
            }
        });
        Ok(sender)
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

    fn put_back(&self, endpoint: &Endpoint, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = lock(&self.inner.idle);
        let queue = idle.entry(endpoint.uri_authority().clone()).or_default();
        self.close_expired(queue, now);
        if queue.len() < self.inner.max_idle_per_replica {
            queue.push_back(Idle { sender, since: now });
        }
    }
}

/// A connection in use by one request; [`Lease::release`] hands it back
/// once the response was read to the end, dropping it closes it.
pub struct Lease {
    pool: Upstream,
    endpoint: Endpoint,
    sender: Option<Sender>,
}

impl Lease {
    /// The response was read to its end: the connection can serve another.
    pub fn release(mut self) {
        if let Some(s) = self.sender.take() {
            self.pool.put_back(&self.endpoint, s);
        }
    }
}
