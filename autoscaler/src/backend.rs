//! Where decisions take effect: the local backend (simulated servers on
//! this machine) or Kubernetes (Deployments per placement variant, `/scale`,
//! node MIG labels, status, Events, leader election, EndpointSlice
//! discovery into the gateway's pools).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuscale_packer::{Mode, Plan, Variant};
use gpuscale_policies::{Cluster, GpuMode, Model};

use crate::kubernetes::{Kube, KubeError, may_reconfigure};
use crate::local::LocalBackend;
use crate::observe::GatewayClient;
use crate::recommend::Recommendation;

/// One model's new count, with the decision behind it.
#[derive(Debug, Clone)]
pub struct Change {
    /// The model.
    pub model: Model,
    /// Replicas before.
    pub from: u32,
    /// The decision.
    pub rec: Recommendation,
}

/// The Kubernetes backend's memory.
pub struct KubeBackend {
    kube: Kube,
    gateway: GatewayClient,
    desired: BTreeMap<String, u32>,
    /// Variant Deployments applied per model.
    variants: BTreeMap<String, BTreeSet<String>>,
    /// Endpoints registered with the gateway, per served name.
    registered: BTreeMap<String, BTreeSet<String>>,
    /// MIG config last set per node.
    mig: BTreeMap<String, String>,
    /// Nodes cordoned and drained for a MIG change, with the config (and
    /// the plan whose ConfigMap holds it) to apply once they are empty.
    draining: BTreeMap<String, (String, Plan)>,
    leading: bool,
}

impl KubeBackend {
    /// A backend over `kube`, feeding discovered endpoints to `gateway`.
    pub fn new(kube: Kube, gateway: GatewayClient) -> Self {
        KubeBackend {
            kube,
            gateway,
            desired: BTreeMap::new(),
            variants: BTreeMap::new(),
            registered: BTreeMap::new(),
            mig: BTreeMap::new(),
            draining: BTreeMap::new(),
            leading: false,
        }
    }

    /// The variants a model runs as: the plan's, or one whole-GPU variant
    /// named after the model when there is no plan.
    fn variants_of(model: &Model, replicas: u32, plan: Option<&Plan>) -> Vec<Variant> {
        if let Some(mp) = plan.and_then(|p| p.models.iter().find(|m| m.name == model.name)) {
            return mp.variants.clone();
        }
        vec![Variant {
            name: model.name.clone(),
            gpu_model: model.gpu_models.first().cloned().unwrap_or_default(),
            resources: [(
                "nvidia.com/gpu".to_string(),
                model.tensor_parallel.first().copied().unwrap_or(1),
            )]
            .into(),
            replicas,
        }]
    }

    async fn apply(
        &mut self,
        changes: &[Change],
        plan: Option<&Plan>,
        before: Option<&Cluster>,
        now: Duration,
    ) -> Result<(), KubeError> {
        if !self.leading {
            tracing::info!(
                "not the leader: {} change(s) left to the leader",
                changes.len()
            );
            return Ok(());
        }
        for c in changes {
            let variants = Self::variants_of(&c.model, c.rec.replicas, plan);
            let before = self.variants.remove(&c.model.name).unwrap_or_default();
            let mut now_applied = BTreeSet::new();
            for v in &variants {
                self.kube.apply_deployment(&c.model, v).await?;
                self.kube.scale(&v.name, v.replicas).await?;
                now_applied.insert(v.name.clone());
            }
            // Variants the plan no longer uses go to zero.
            for gone in before.difference(&now_applied) {
                self.kube.scale(gone, 0).await?;
            }
            self.variants.insert(c.model.name.clone(), now_applied);
            self.kube
                .record(&c.model.name, None, c.from, &c.rec, now)
                .await?;
            self.desired.insert(c.model.name.clone(), c.rec.replicas);
        }
        if let (Some(plan), Some(before)) = (plan, before) {
            self.reconfigure(plan, before).await?;
        }
        Ok(())
    }

    /// Sets `nvidia.com/mig.config` on nodes whose MIG geometry changes,
    /// only when none of the GPUs that change has a replica now (`before`:
    /// the cluster as it was when the plan was made).
    async fn reconfigure(&mut self, plan: &Plan, before: &Cluster) -> Result<(), KubeError> {
        let mut configmap_applied = false;
        for node in &plan.nodes {
            if self.mig.get(&node.name) == Some(&node.mig_config) {
                continue;
            }
            let Some(was) = before.nodes.iter().find(|n| n.name == node.name) else {
                continue;
            };
            let changing: Vec<u32> = plan
                .gpus
                .iter()
                .filter(|g| g.node == node.name && g.mode == Mode::Mig)
                .filter(|g| {
                    was.gpus.get(g.index as usize).is_none_or(|old| {
                        old.mode != GpuMode::Mig
                            || old.geometry.placements() != g.geometry.as_slice()
                    })
                })
                .map(|g| g.index)
                .collect();
            if changing.is_empty() {
                self.mig.insert(node.name.clone(), node.mig_config.clone());
                continue;
            }
            let busy: Vec<u32> = was
                .gpus
                .iter()
                .filter(|g| !g.workloads.is_empty())
                .map(|g| g.index)
                .collect();
            if may_reconfigure(&busy, &changing) {
                // The config the label names must exist first.
                if !configmap_applied {
                    self.kube.apply_mig_configmap(plan).await?;
                    configmap_applied = true;
                }
                self.kube.label_node(&node.name, &node.mig_config).await?;
                self.mig.insert(node.name.clone(), node.mig_config.clone());
            } else {
                // Drain: no new pods on the node, gpuscale's MIG pods
                // evicted (their Deployments recreate them where the plan
                // put them); the label follows once they are gone.
                tracing::info!(node = %node.name, "draining for a MIG change");
                self.kube.cordon(&node.name, true).await?;
                for pod in self.kube.mig_pods_on(&node.name).await? {
                    self.kube.evict(&pod).await?;
                }
                self.draining
                    .insert(node.name.clone(), (node.mig_config.clone(), plan.clone()));
            }
        }
        Ok(())
    }

    /// Finishes MIG changes whose nodes have drained: ConfigMap, label,
    /// uncordon.
    async fn finish_drains(&mut self) -> Result<(), KubeError> {
        let nodes: Vec<String> = self.draining.keys().cloned().collect();
        for node in nodes {
            if !self.kube.mig_pods_on(&node).await?.is_empty() {
                continue;
            }
            let Some((config, plan)) = self.draining.remove(&node) else {
                continue;
            };
            self.kube.apply_mig_configmap(&plan).await?;
            self.kube.label_node(&node, &config).await?;
            self.kube.cordon(&node, false).await?;
            self.mig.insert(node, config);
        }
        Ok(())
    }

    /// Leader election and EndpointSlice discovery, every tick.
    async fn tick(&mut self, models: &[Model], now: Duration) -> Result<(), KubeError> {
        self.leading = self.kube.lead(now).await?;
        if self.leading {
            self.finish_drains().await?;
        }
        for m in models {
            let found: BTreeSet<String> = self.kube.endpoints(&m.name).await?.into_iter().collect();
            let known = self.registered.entry(m.served_name.clone()).or_default();
            // Registered only once the gateway has taken it; a failure is
            // retried next tick.
            let mut now_known = BTreeSet::new();
            for e in &found {
                if known.contains(e) {
                    now_known.insert(e.clone());
                    continue;
                }
                match self
                    .gateway
                    .replica(true, &m.served_name, e, Some(m.max_concurrency))
                    .await
                {
                    Ok(()) => {
                        now_known.insert(e.clone());
                    }
                    Err(err) => tracing::warn!("{err}"),
                }
            }
            for e in known.difference(&found) {
                if let Err(err) = self.gateway.replica(false, &m.served_name, e, None).await {
                    tracing::warn!("{err}");
                }
            }
            *known = now_known;
        }
        Ok(())
    }
}

/// The backend the controller acts through (one per process, so the
/// variants' sizes do not matter).
#[allow(clippy::large_enum_variant)]
pub enum Backend {
    /// Simulated servers here.
    Local(LocalBackend),
    /// A Kubernetes cluster.
    Kube(KubeBackend),
}

impl Backend {
    /// Replicas asked for, per policy name.
    pub fn desired(&self) -> BTreeMap<String, u32> {
        match self {
            Backend::Local(l) => l.desired(),
            Backend::Kube(k) => k.desired.clone(),
        }
    }

    /// Replicas serving, per policy name (Kubernetes: endpoints ready).
    pub fn ready(&self, models: &[Model]) -> BTreeMap<String, u32> {
        match self {
            Backend::Local(l) => l.ready(),
            Backend::Kube(k) => models
                .iter()
                .map(|m| {
                    (
                        m.name.clone(),
                        k.registered
                            .get(&m.served_name)
                            .map_or(0, |s| s.len() as u32),
                    )
                })
                .collect(),
        }
    }

    /// Applies the changes (and, on Kubernetes, the plan's MIG configs;
    /// `before` is the cluster the plan was made from).
    pub async fn apply(
        &mut self,
        changes: &[Change],
        plan: Option<&Plan>,
        before: Option<&Cluster>,
        now: Duration,
    ) {
        match self {
            Backend::Local(l) => {
                for c in changes {
                    l.scale(&c.model, c.rec.replicas);
                }
            }
            Backend::Kube(k) => {
                if let Err(e) = k.apply(changes, plan, before, now).await {
                    tracing::error!("{e}");
                }
            }
        }
    }

    /// Per-tick housekeeping (Kubernetes: lease, discovery).
    pub async fn tick(&mut self, models: &[Model], now: Duration) {
        if let Backend::Kube(k) = self
            && let Err(e) = k.tick(models, now).await
        {
            tracing::error!("{e}");
        }
    }

    /// Stops what this process runs (local replicas); Kubernetes objects
    /// stay.
    pub async fn shutdown(self) {
        if let Backend::Local(l) = self {
            l.shutdown().await;
        }
    }
}
