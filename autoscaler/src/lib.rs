//! # gpuscale-autoscaler
//!
//! Turns per-model signals (queue depth, arrival rate, latency against SLO)
//! into replica counts with HPA/KEDA/Knative semantics, asks the packer where
//! they go, and applies the result to Kubernetes or to the local backend.
//!
//! - the decision, [`recommend()`] in [`mod@recommend`], a pure function with its state passed in
//!   (property-tested against a transcription of HPA's algorithm,
//!   scenario-tested in simulated time);
//! - one round over every model, [`decide`]: the recommendations and the
//!   packer's answer taken back, pure, shared by the controller and the
//!   trace-driven simulator;
//! - signals, [`observe`]: the gateway's `/v1/queues` and push stream, or
//!   a Prometheus query;
//! - the thin async shell, [`controller`] (ticks and pushed events →
//!   decisions → packer → backend), with [`admin`] for its metrics;
//! - where decisions take effect, [`backend`]: [`local`] (simulated model
//!   servers as child processes) or [`kubernetes`] (Deployments per
//!   placement variant, `/scale`, MIG labels with drains, status, Events,
//!   Lease, EndpointSlices), with the leader election's rules in
//!   [`election`] and moves made before they break in [`handover`];
//! - the packer's inventory from the nodes' labels and the node agent's
//!   NVML readings, [`inventory`];
//! - KEDA's external scaler over gRPC, [`keda`];
//! - the `kind: Autoscaler` file, [`config`].
//!
//! What it never does: read a clock or do I/O in [`recommend()`]; import
//! the gateway crate (it talks to any gateway over HTTP); scale a model to
//! zero on missing data.

pub mod admin;
pub mod backend;
pub mod config;
pub mod controller;
pub mod dashboard;
pub mod decide;
pub mod election;
pub mod handover;
pub mod inventory;
pub mod keda;
pub mod kubernetes;
pub mod local;
pub mod observe;
pub mod recommend;

pub use recommend::{Mode, Observation, Recommendation, State, Tuning, recommend};
