//! Where decisions take effect: the local backend (simulated servers on
//! this machine) or Kubernetes (Deployments per placement variant, `/scale`,
//! node MIG labels, status, Events, leader election, EndpointSlice
//! discovery into the gateway's pools).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuscale_packer::{Mode, Plan, Variant};
use gpuscale_policies::model::ScalingMemory;
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
    /// The recommender's memory after it (persisted with the decision
    /// where the backend persists anything).
    pub memory: Option<ScalingMemory>,
}

/// What a reconciliation observed, per policy name.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Observed {
    /// Replicas running as declared by what runs them (the Deployments'
    /// `spec.replicas`), where the backend reads one; the count the
    /// recommender works from, as HPA reads `/scale` every cycle.
    pub replicas: BTreeMap<String, u32>,
    /// Memory a previous controller left (read when this one starts
    /// acting: at start and on each leader change).
    pub memory: BTreeMap<String, ScalingMemory>,
    /// This tick is the first this instance acts in (it has just become
    /// the leader).
    pub took_over: bool,
}

/// How often the leader writes the recommender's memory into the
/// ModelPolicy status besides each decision (HPA's default sync period).
pub const REMEMBER_EVERY: Duration = Duration::from_secs(15);

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
    /// When the memory was last written into the policies' status.
    remembered_at: Option<Duration>,
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
            remembered_at: None,
        }
    }

    /// The variants a model runs as: the plan's, or one whole-GPU variant
    /// named after the model when there is no plan.
    fn variants_of(model: &Model, replicas: u32, plan: Option<&Plan>) -> Vec<Variant> {
        if let Some(mp) = plan.and_then(|p| p.models.iter().find(|m| m.name == model.name)) {
            return mp.variants.clone();
        }
        // No plan means no cluster file, so the built-in catalogue is the
        // one in effect.
        let gpu_model = model.gpu_models.first().cloned().unwrap_or_default();
        let node_selector = gpuscale_policies::Catalog::builtin()
            .get(&gpu_model)
            .map(|g| {
                BTreeMap::from([(
                    gpuscale_packer::emit::PRODUCT_LABEL.to_string(),
                    g.product.clone(),
                )])
            })
            .unwrap_or_default();
        vec![Variant {
            name: model.name.clone(),
            gpu_model,
            resources: [(
                "nvidia.com/gpu".to_string(),
                model.tensor_parallel.first().copied().unwrap_or(1),
            )]
            .into(),
            node_selector,
            annotations: BTreeMap::new(),
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
                .record(&c.model.name, None, c.from, &c.rec, now, c.memory.as_ref())
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

    /// Every tick: leader election; as the leader, the live counts (and,
    /// on taking over, the memory the last leader left); MIG drains to
    /// finish; EndpointSlice discovery into the gateway.
    async fn tick(&mut self, models: &[Model], now: Duration) -> Result<Observed, KubeError> {
        let r = self.reconcile(models, now).await;
        if r.is_err() {
            // Not acting on a half-read cluster: the next tick that reads
            // it all takes over afresh.
            self.leading = false;
        }
        r
    }

    async fn reconcile(&mut self, models: &[Model], now: Duration) -> Result<Observed, KubeError> {
        let was_leading = self.leading;
        self.leading = self.kube.lead(now).await?;
        let mut observed = Observed::default();
        if self.leading {
            for m in models {
                let declared = self.kube.deployments_of(&m.name).await?;
                let n = declared.iter().map(|(_, n)| n).sum();
                // Variants that run now are the ones a later change
                // scales to zero when the plan moves off them.
                self.variants
                    .entry(m.name.clone())
                    .or_default()
                    .extend(declared.into_iter().map(|(v, _)| v));
                self.desired.insert(m.name.clone(), n);
                observed.replicas.insert(m.name.clone(), n);
                if !was_leading && let Some(mem) = self.kube.remembered(&m.name).await? {
                    observed.memory.insert(m.name.clone(), mem);
                }
            }
            if !was_leading {
                self.remembered_at = Some(now);
                observed.took_over = true;
            }
            self.finish_drains().await?;
        }
        // What the gateway lists now: an endpoint registered before that
        // it no longer lists (it restarted, someone removed it) is
        // registered again below. Unreadable: trust what was registered.
        let listed = self.gateway.replica_list().await.ok();
        for m in models {
            let found: BTreeSet<String> = self.kube.endpoints(&m.name).await?.into_iter().collect();
            let known = self.registered.entry(m.served_name.clone()).or_default();
            if let Some(listed) = &listed {
                let there = listed.get(&m.served_name);
                let lost = known
                    .iter()
                    .filter(|e| there.is_none_or(|l| !l.contains(e)))
                    .count();
                if lost > 0 {
                    tracing::warn!(model = %m.name, lost, "the gateway lost replica(s); registering them again");
                    known.retain(|e| there.is_some_and(|l| l.contains(e)));
                }
            }
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
        Ok(observed)
    }

    /// As the leader, writes each model's memory into its status every
    /// [`REMEMBER_EVERY`].
    async fn remember(
        &mut self,
        memory: &BTreeMap<String, ScalingMemory>,
        now: Duration,
    ) -> Result<(), KubeError> {
        if !self.leading
            || self
                .remembered_at
                .is_some_and(|t| now.saturating_sub(t) < REMEMBER_EVERY)
        {
            return Ok(());
        }
        self.remembered_at = Some(now);
        for (policy, m) in memory {
            self.kube.remember(policy, m).await?;
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

    /// Takes the speeds of the plan's replicas (per model, in replica
    /// order): the local backend starts its simulated servers at them;
    /// Kubernetes runs real servers and ignores them.
    pub fn placed(&mut self, speeds: &BTreeMap<String, Vec<f64>>) {
        if let Backend::Local(l) = self {
            l.set_speeds(speeds.clone());
        }
    }

    /// The most replicas the backend runs per model, if it has a limit
    /// of its own (the local backend's `maxReplicasPerModel`).
    pub fn cap(&self) -> Option<u32> {
        match self {
            Backend::Local(l) => Some(l.cap()),
            Backend::Kube(_) => None,
        }
    }

    /// One reconciliation, every tick. Local: dead replica processes
    /// replaced, replicas the gateway lost registered again (the local
    /// backend repairs towards its own count, so it reports none).
    /// Kubernetes: lease, the live counts and (on taking over) the
    /// memory left in the policies' status, drains, discovery.
    pub async fn tick(&mut self, models: &[Model], now: Duration) -> Observed {
        match self {
            Backend::Local(l) => {
                l.reconcile(models).await;
                Observed::default()
            }
            Backend::Kube(k) => match k.tick(models, now).await {
                Ok(o) => o,
                Err(e) => {
                    tracing::error!("{e}");
                    Observed::default()
                }
            },
        }
    }

    /// Persists the recommender's memory where the backend keeps it
    /// (Kubernetes: the ModelPolicy status, every [`REMEMBER_EVERY`]).
    pub async fn remember(&mut self, memory: &BTreeMap<String, ScalingMemory>, now: Duration) {
        if let Backend::Kube(k) = self
            && let Err(e) = k.remember(memory, now).await
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
