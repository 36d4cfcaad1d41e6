//! # gpuscale-autoscaler
//!
//! Turns per-model signals (queue depth, arrival rate, latency against SLO)
//! into replica counts with HPA/KEDA/Knative semantics, asks the packer where
//! they go, and applies the result to Kubernetes or to the local backend.
//!
//! Status: an empty shell until the autoscaler issue lands; no `gpuscale`
//! subcommand uses it yet.
