//! Training job specs (`kind: TrainingJob`): gangs of workers that the
//! packer places all or nothing, topology-aware.

use std::fmt;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::FieldError;
use crate::catalog::Catalog;
use crate::model::Priority;

/// How close the workers of a gang must be.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyLevel {
    /// All GPUs on one node.
    Node,
    /// All nodes in one NVLink domain (e.g. an NVL72 rack).
    NvlinkDomain,
    /// All nodes in one rack.
    Rack,
    /// All nodes in one zone.
    Zone,
    /// Anywhere.
    #[default]
    Any,
}

impl fmt::Display for TopologyLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TopologyLevel::Node => "node",
            TopologyLevel::NvlinkDomain => "nvlink-domain",
            TopologyLevel::Rack => "rack",
            TopologyLevel::Zone => "zone",
            TopologyLevel::Any => "any",
        })
    }
}

/// Whether a topology level must hold or is only preferred.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TopologyMode {
    /// The job waits rather than spread wider.
    #[default]
    Required,
    /// Spread wider when the level cannot hold.
    Preferred,
}

/// The topology requirement of a gang.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Topology {
    /// The level all workers must share.
    #[serde(default)]
    pub level: TopologyLevel,
    /// Required or preferred.
    #[serde(default)]
    pub mode: TopologyMode,
}

/// A training job as written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingJobSpec {
    /// Number of workers (processes), each on one node.
    pub workers: u32,
    /// Whole GPUs each worker takes on its node.
    pub gpus_per_worker: u32,
    /// Allowed GPU models (default: any); all workers use one model.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// How close the workers must be.
    #[serde(default)]
    pub topology: Topology,
    /// Priority against other jobs and models.
    #[serde(default)]
    pub priority: Priority,
    /// Whether higher-priority work may preempt it.
    #[serde(default)]
    pub preemptible: bool,
    /// Expected runtime, if known.
    #[serde(
        default,
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub estimated_runtime: Option<Duration>,
    /// How often the job checkpoints, if it does: a preemption loses at
    /// most this much of its work.
    #[serde(
        default,
        with = "humantime_serde::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub checkpoint_interval: Option<Duration>,
}

/// A validated training job.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingJob {
    /// `metadata.name`.
    pub name: String,
    /// The spec, validated.
    pub spec: TrainingJobSpec,
    /// Allowed GPU models, resolved (never empty).
    pub gpu_models: Vec<String>,
}

impl TrainingJob {
    /// Total GPUs the gang takes.
    pub fn total_gpus(&self) -> u32 {
        self.spec.workers.saturating_mul(self.spec.gpus_per_worker)
    }

    /// GPU-hours a preemption would lose: the GPUs times the checkpoint
    /// interval for a job that checkpoints (the worst case since its last
    /// checkpoint), its estimated runtime for one that does not
    /// (everything may be lost), and a day when neither is known (an
    /// unknown job without checkpoints is the dearest to stop).
    pub fn preemption_cost_gpu_hours(&self) -> f64 {
        let span = self
            .spec
            .checkpoint_interval
            .or(self.spec.estimated_runtime)
            .unwrap_or(Duration::from_secs(24 * 3600));
        f64::from(self.total_gpus()) * span.as_secs_f64() / 3600.0
    }

    /// Validates a spec against the catalogue, reporting every problem.
    pub fn from_spec(
        name: &str,
        spec: &TrainingJobSpec,
        catalog: &Catalog,
    ) -> Result<TrainingJob, Vec<FieldError>> {
        let mut errors = Vec::new();
        if spec.workers == 0 {
            errors.push(FieldError::new("spec.workers", "must be at least 1"));
        }
        if spec.gpus_per_worker == 0 || spec.gpus_per_worker > 16 {
            errors.push(FieldError::new(
                "spec.gpusPerWorker",
                format!("must be between 1 and 16, got {}", spec.gpus_per_worker),
            ));
        }
        let mut gpu_models = Vec::new();
        for (i, g) in spec.gpu_models.iter().enumerate() {
            if catalog.get(g).is_some() {
                gpu_models.push(g.clone());
            } else {
                errors.push(FieldError::new(
                    format!("spec.gpuModels[{i}]"),
                    format!(
                        "unknown GPU model `{g}`; the catalogue has: {}",
                        catalog.names().join(", ")
                    ),
                ));
            }
        }
        if spec.gpu_models.is_empty() {
            gpu_models = catalog.names().into_iter().map(str::to_string).collect();
        }
        if spec.topology.level == TopologyLevel::Node
            && spec.topology.mode == TopologyMode::Required
            && spec.workers > 1
        {
            errors.push(FieldError::new(
                "spec.topology.level",
                format!(
                    "topology `node` (required) puts every worker on one node, but there are {} \
                     workers: use one worker with {} GPUs, or a wider level",
                    spec.workers,
                    spec.workers.saturating_mul(spec.gpus_per_worker)
                ),
            ));
        }
        if errors.is_empty() {
            Ok(TrainingJob {
                name: name.to_string(),
                spec: spec.clone(),
                gpu_models,
            })
        } else {
            Err(errors)
        }
    }
}
