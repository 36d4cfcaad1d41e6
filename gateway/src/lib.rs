//! # gpuscale-gateway
//!
//! The HTTP reverse proxy in front of model servers, where gpuscale sees
//! demand: per-model routing (OpenAI-compatible body `model` field, a
//! header override, KServe v2 paths), a bounded admission queue per model
//! by priority class, least-outstanding balancing over replicas with free
//! capacity, scale-from-zero hold and signal, and the queue-depth
//! measurements the autoscaler acts on (`/v1/queues`, its push stream, and
//! Prometheus metrics on a separate admin port). Also a simulated
//! OpenAI-compatible model server ([`sim`]) for tests, benchmarks and the
//! embedded default.
//!
//! Layout: pure decisions in [`route`] (which model), [`admission`] (which
//! replica, who waits, who is refused), [`fairness`] (who a request
//! counts as when clients share a queue), [`ratelimit`] (requests per
//! minute per client) and [`stats`] (windows and quantiles); the async shell in [`state`] (waiters, permits, gauges),
//! [`proxy`] (route, admit, forward), [`traffic`] (the traffic listener's
//! connections: the gateway's own HTTP/1.1 server over the pure request
//! parsing and response-head encoding in [`h1_server`], heads relayed as
//! bytes), [`admin`] (hyper), [`scrape`] and [`server`] (listeners) with
//! [`drain`] (graceful shutdown), [`upstream`] (per-worker connection pools
//! to replicas and the HTTP/1.1 client on them, over the pure head
//! encoding, parsing and chunked decoding in [`h1`]), [`timer`] (the coarse
//! per-connection timer), [`budget`] (the request bytes held across
//! connections); configuration in [`config`].
//!
//! Built on tokio, httparse, and hyper 1 for the admin listener; never
//! imports `kube`.

pub mod admin;
pub mod admission;
pub mod affinity;
pub mod auth;
pub mod budget;
pub mod client_io;
pub mod config;
pub mod drain;
pub mod fairness;
pub mod h1;
pub mod h1_server;
pub mod metrics;
pub mod priority;
pub mod proxy;
pub mod ratelimit;
pub mod registration;
pub mod route;
pub mod scrape;
pub mod server;
pub mod sim;
pub mod state;
pub mod stats;
pub mod timer;
pub mod traffic;
pub mod upstream;

pub use config::{Endpoint, GatewaySpec, Settings};
pub use server::{Running, start};
pub use state::{ScaleSignal, Shared};

/// Locks a mutex, taking over a poisoned one: every critical section in
/// the crate leaves its data consistent before anything can panic.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
