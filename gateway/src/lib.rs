//! # gpuscale-gateway
//!
//! The HTTP reverse proxy in front of model servers: per-model routing, a
//! bounded admission queue, balancing, and the queue-depth measurements the
//! autoscaler acts on.
//!
//! Status: an empty shell until the gateway issue lands; no `gpuscale`
//! subcommand uses it yet.
//!
//! What it will never do: talk to Kubernetes (it never imports `kube`).
