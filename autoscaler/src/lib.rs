//! # gpuscale-autoscaler
//!
//! Turns per-model signals (queue depth, arrival rate, latency against SLO)
//! into replica counts with HPA/KEDA/Knative semantics, asks the packer where
//! they go, and applies the result to Kubernetes or to the local backend.
//!
//! Today: the recommender ([`recommend`]), a pure function with its state
//! passed in, property-tested against a transcription of HPA's algorithm
//! and scenario-tested in simulated time. The controller, the actuators
//! (Kubernetes, local) and the KEDA external scaler come with the rest of
//! the autoscaler issue; no `gpuscale` subcommand uses this crate yet.
//!
//! What it never does in [`recommend`]: read a clock or do I/O.

pub mod admin;
pub mod backend;
pub mod config;
pub mod controller;
pub mod keda;
pub mod kubernetes;
pub mod local;
pub mod observe;
pub mod recommend;

pub use recommend::{Mode, Observation, Recommendation, State, Tuning, recommend};
