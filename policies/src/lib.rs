//! # gpuscale-policies
//!
//! The shared vocabulary of gpuscale, pure and without network access:
//!
//! - [`catalog`]: the GPU catalogue (memory, relative compute, MIG profiles
//!   with their placement rules, prices), built in and overridable;
//! - [`mig`]: MIG geometries — validation and enumeration derived from the
//!   placement rules;
//! - [`model`]: the model SLO policy model owners write (also the
//!   `ModelPolicy` custom resource, `gpuscale.io/v1alpha1`);
//! - [`serving`]: the latency model of a replica (prefill, decode, batch
//!   slowdown, the GPU share's speed);
//! - [`training`]: training job specs for gang placement;
//! - [`inventory`]: the cluster inventory (nodes, topology labels, GPUs and
//!   their current state);
//! - [`labels`]: Kubernetes label syntax, and the keys gpuscale keeps;
//! - [`devices`]: what the node agent reads of a node's GPUs through NVML;
//! - [`listener`]: what a listener bound to loopback answers (the rule
//!   against DNS rebinding and cross-origin pages, shared by the gateway
//!   and the autoscaler);
//! - [`duration`]: durations as written in files and flags, bounded;
//! - [`rfc3339`]: timestamps with their zone, as Kubernetes writes them;
//! - [`document`] and [`load`]: reading YAML and JSON into validated types,
//!   with every problem reported at its file, line, column and field path.
//!
//! What it does not do: talk to a network, a Kubernetes API server or a GPU
//! (the only I/O is reading the files it is asked to load), decide
//! placements (that is `gpuscale-packer`) or replica counts (that is
//! `gpuscale-autoscaler`).

pub mod catalog;
pub mod devices;
pub mod document;
pub mod duration;
pub mod exposition;
pub mod inventory;
pub mod labels;
pub mod listener;
pub mod load;
pub mod mig;
pub mod model;
pub mod rfc3339;
pub mod serving;
pub mod training;

pub use catalog::{Catalog, GpuModel, MigProfile, MigSpec};
pub use document::{Position, Problem};
pub use inventory::{Cluster, ClusterSpec, Gpu, GpuMode, Health, MigTimeslice, Node};
pub use load::{Bundle, Problems, load_paths, load_sources};
pub use mig::{Geometry, Placement};
pub use model::{Model, ModelPolicy, ModelPolicySpec, Priority, SharingMode};
pub use training::{TrainingJob, TrainingJobSpec, TrainingQueueSpec};

/// A validation problem at a field path of a document, before it is located
/// in a file (the loader adds file, line and column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Field path, e.g. `spec.resources.memoryGiB`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    /// A problem at `path`.
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }
}
