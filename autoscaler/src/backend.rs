//! Where decisions take effect: the local backend (simulated servers on
//! this machine) or Kubernetes (Deployments per placement variant, `/scale`,
//! node MIG labels, status, Events, leader election, EndpointSlice
//! discovery into the gateway's pools).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use gpuscale_packer::{Plan, Variant};
use gpuscale_policies::devices::NodeGpus;
use gpuscale_policies::model::ScalingMemory;
use gpuscale_policies::{Cluster, GpuMode, Model};

use tokio::time::Instant;

use crate::election::{Elector, Step, Timing};
use crate::handover::{self, Held, VariantNow};
use crate::kubernetes::{
    EventBudget, Evict, Evicted, HANDOFF_CONFIG, HANDOFF_LABEL, Handoff, Kube, KubeError,
    MIG_CONFIG_LABEL, MIG_STATE_LABEL, Owned, PolicyWatch, Regarding, Said, changing_gpus,
    event_about, evict_for, handoff_configure_patch, handoff_done_patch, handoff_failed_patch,
    handoff_of, handoff_start_patch, may_reconfigure, merged_mig_parted, mig_state, owned_by_us,
    ownership_patch,
};
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
    /// Spare replicas the plan adds (`gpuscale_packer::spare`): the local
    /// backend runs them beside `rec.replicas`; on Kubernetes they are in
    /// the plan's variants.
    pub spares: u32,
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
    /// The policies changed (Kubernetes, watching ModelPolicies): the
    /// models to run from now on.
    pub policies: Option<Vec<Model>>,
    /// The inventory, rebuilt from the nodes (Kubernetes, without a
    /// cluster file; every [`INVENTORY_EVERY`]).
    pub cluster: Option<Cluster>,
    /// What the reconciliation found different and repaired.
    pub repairs: crate::local::Repairs,
}

/// A hand-over's hold ends this many of the model's `startupTime` after
/// the move, whatever is ready.
pub const HANDOVER_STARTUPS: u32 = 2;

/// How often the leader rebuilds the inventory from the nodes and the
/// node agents.
pub const INVENTORY_EVERY: Duration = Duration::from_secs(30);

/// A model's Service is applied again at its first change this long
/// after the last apply (a Service deleted meanwhile comes back).
pub const SERVICE_RESYNC: Duration = Duration::from_secs(300);

/// The node agents read at once while the inventory is rebuilt.
pub const AGENT_READS: usize = 64;

/// The node agents' readings are waited for this long in the tick that
/// asked for them; later ticks take them up once all are in (or
/// [`AGENTS_DEADLINE`] has passed), so a slow or hung agent never holds
/// up the decisions. Not the first rebuild of a leadership term: that
/// one is waited for (up to the deadline), because without an inventory
/// the leader has no plan to act on and would place every model on
/// whole GPUs.
pub const AGENT_WAIT: Duration = Duration::from_millis(200);

/// Readings not in by this long after the rebuild began are left out (as
/// from agents that do not answer).
pub const AGENTS_DEADLINE: Duration = Duration::from_secs(10);

/// The Service whose EndpointSlices list the node agents (`gpuscale
/// agent`, a DaemonSet), and the path of their readings.
pub const AGENT_SERVICE: &str = "gpuscale-agent";

/// How long a variant Deployment the plan has left stays at zero before
/// it is deleted. Each variant a model ever ran would otherwise stay (one
/// per GPU for pinned fractional variants: hundreds over a week of
/// scaling), listed every tick.
pub const IDLE_VARIANT_TTL: Duration = Duration::from_secs(15 * 60);

/// How often the leader writes the recommender's memory into the
/// ModelPolicy status besides each decision (HPA's default sync period).
pub const REMEMBER_EVERY: Duration = Duration::from_secs(15);

/// The Kubernetes backend: the election, what it read from the cluster
/// last, and what it registered with the gateway.
pub struct KubeBackend {
    kube: Kube,
    gateway: GatewayClient,
    elector: Elector,
    desired: BTreeMap<String, u32>,
    /// Variant Deployments per model, as read from the cluster each tick
    /// and applied since.
    variants: BTreeMap<String, BTreeSet<String>>,
    /// Variant Deployments per model as last read: counts, readiness and
    /// hand-over holds.
    read: BTreeMap<String, Vec<VariantNow>>,
    /// Deployment names known to be gpuscale's (read with its label, or
    /// created by it).
    owned: BTreeSet<String>,
    /// Per Deployment gpuscale owns, as last read: its model, the digest
    /// of the spec it was applied with, and whether its rollout is done
    /// ([`KubeBackend::roll`]).
    templates: BTreeMap<String, (String, Option<String>, bool)>,
    /// Deployments applied since they were last read.
    applied: BTreeSet<String>,
    /// Per model, the variants its last change applied in this leadership
    /// term: what [`KubeBackend::roll`] re-applies.
    last_applied: BTreeMap<String, Vec<Variant>>,
    /// Per model, Deployments the plan names that are not gpuscale's.
    refused: BTreeMap<String, BTreeSet<String>>,
    /// Per model, the variants its last applied change planned (their
    /// counts zero or not); none yet: no variant of it is removed.
    planned: BTreeMap<String, BTreeSet<String>>,
    /// Variant Deployments that are idle and that the last change of
    /// their model did not plan, since when (removed at
    /// [`IDLE_VARIANT_TTL`]).
    idle_since: BTreeMap<String, Duration>,
    /// Nodes whose hand-off was dropped because they left the managed
    /// pool: no new hand-off starts there (the plan may still name them:
    /// a cluster file, or an inventory not rebuilt yet) until an
    /// inventory from the nodes shows them in the pool again.
    left_pool: BTreeSet<String>,
    /// The served names every watched policy claims, valid or not
    /// (`None`: not watching, or a policy does not decode): a name
    /// registered with the gateway and missing here is a deleted
    /// policy's, and its registrations go.
    listed_served: Option<BTreeSet<String>>,
    /// Models whose Service is applied, and when.
    services: BTreeMap<String, Duration>,
    /// Endpoints registered with the gateway, per served name.
    registered: BTreeMap<String, BTreeSet<String>>,
    /// MIG config last handed to per node.
    mig: BTreeMap<String, String>,
    events: EventBudget,
    leading: bool,
    /// When the memory was last written into the policies' status.
    remembered_at: Option<Duration>,
    /// The watched ModelPolicies (when the policies come from the
    /// cluster), and their resourceVersions as last handed on.
    watch: Option<PolicyWatch>,
    versions: BTreeMap<String, String>,
    /// The inventory comes from the nodes (no cluster file), rebuilt at
    /// this period's start last.
    from_nodes: bool,
    inventory_at: Option<Duration>,
    /// A rebuild whose agents are still being read: the nodes and pods as
    /// listed when it began, and the task reading the agents.
    pending_inventory: Option<PendingInventory>,
    /// The pods bound to nodes, watched from the first term that builds
    /// an inventory on (and kept after it, so a later term starts warm).
    pods: Option<crate::kubernetes::PodWatch>,
    /// An inventory was delivered in this leadership term.
    inventory_this_term: bool,
    /// The notes of the last inventory, logged when they change.
    inventory_notes: Vec<(String, String)>,
    /// The gateway instances from a Service: (service, admin port name),
    /// and whether pods are registered with them.
    gateways: Option<(String, String)>,
    registers: bool,
}

/// An inventory rebuild under way ([`KubeBackend::inventory`]).
struct PendingInventory {
    nodes: Vec<k8s_openapi::api::core::v1::Node>,
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
    readings: tokio::task::JoinHandle<BTreeMap<String, NodeGpus>>,
}

/// Every agent's `/v1/gpus` (`http://host:port` each), at most `at_once`
/// in flight, by node name; those that fail, or have not answered by
/// `deadline`, are logged and left out.
pub async fn read_agents(
    agents: Vec<(String, Option<String>)>,
    at_once: usize,
    deadline: Instant,
) -> BTreeMap<String, NodeGpus> {
    let mut readings = BTreeMap::new();
    let mut waiting = agents.into_iter();
    let mut reads = tokio::task::JoinSet::new();
    let read = |(a, on): (String, Option<String>)| async move {
        let got = GatewayClient::new(&a).get_json("/v1/gpus").await;
        (a, on, got)
    };
    for a in waiting.by_ref().take(at_once.max(1)) {
        reads.spawn(read(a));
    }
    loop {
        match tokio::time::timeout_at(deadline, reads.join_next()).await {
            Ok(None) => break,
            Ok(Some(Ok((a, on, got)))) => {
                match got.map(serde_json::from_value::<NodeGpus>) {
                    // An agent speaks for the node its pod runs on (the
                    // EndpointSlice's `nodeName`), never for another: a
                    // reading could otherwise mark another node's GPUs
                    // unhealthy or its MIG geometry changed.
                    Ok(Ok(r)) if on.as_ref().is_some_and(|n| *n != r.node) => {
                        tracing::warn!(agent = %a, runs_on = ?on, claims = %r.node, "a reading for another node than the agent's own: left out");
                    }
                    Ok(Ok(r)) => {
                        readings.insert(r.node.clone(), r);
                    }
                    Ok(Err(e)) => tracing::warn!(agent = %a, "not a reading: {e}"),
                    Err(e) => tracing::warn!(agent = %a, "{e}"),
                }
                if let Some(next) = waiting.next() {
                    reads.spawn(read(next));
                }
            }
            Ok(Some(Err(e))) => {
                tracing::warn!("an agent's read failed: {e}");
                if let Some(next) = waiting.next() {
                    reads.spawn(read(next));
                }
            }
            Err(_) => {
                let left = reads.len() + waiting.len();
                tracing::warn!(
                    agents = left,
                    "node agents that had not answered by the deadline are left out of this inventory"
                );
                reads.abort_all();
                break;
            }
        }
    }
    readings
}

impl KubeBackend {
    /// A backend over `kube`, feeding discovered endpoints to `gateway`.
    pub fn new(kube: Kube, gateway: GatewayClient) -> Self {
        let spec = kube.spec();
        let elector = Elector::new(
            &spec.lease_name,
            &spec.namespace,
            kube.identity(),
            Timing {
                lease_duration: spec.lease_duration,
                renew_deadline: spec.renew_deadline,
                retry_period: spec.retry_period,
            },
        );
        KubeBackend {
            kube,
            gateway,
            elector,
            desired: BTreeMap::new(),
            variants: BTreeMap::new(),
            read: BTreeMap::new(),
            owned: BTreeSet::new(),
            templates: BTreeMap::new(),
            applied: BTreeSet::new(),
            last_applied: BTreeMap::new(),
            refused: BTreeMap::new(),
            planned: BTreeMap::new(),
            idle_since: BTreeMap::new(),
            left_pool: BTreeSet::new(),
            services: BTreeMap::new(),
            listed_served: None,
            registered: BTreeMap::new(),
            mig: BTreeMap::new(),
            events: EventBudget::default(),
            leading: false,
            remembered_at: None,
            watch: None,
            versions: BTreeMap::new(),
            from_nodes: false,
            inventory_at: None,
            pending_inventory: None,
            pods: None,
            inventory_this_term: false,
            inventory_notes: Vec::new(),
            gateways: None,
            registers: true,
        }
    }

    /// Finds the gateway's instances each tick from the ready endpoints of
    /// `service` on its port `port`; `register`: whether the model
    /// servers' pods are registered with them (not with sidecars).
    pub fn discovering_gateways(mut self, service: &str, port: &str, register: bool) -> Self {
        self.gateways = Some((service.to_string(), port.to_string()));
        self.registers = register;
        self
    }

    /// The gateway instances now, from their Service; when the set
    /// changes, every replica is registered again (each instance's share
    /// of its limit changes with the set).
    async fn find_gateways(&mut self) {
        let Some((service, port)) = self.gateways.clone() else {
            return;
        };
        match self.kube.service_port_endpoints(&service, &port).await {
            Ok(found) if found.is_empty() => {
                tracing::warn!(%service, "no ready gateway instance; keeping the last known");
            }
            Ok(found) => {
                if self.gateway.set_bases(found.clone()) {
                    tracing::info!(instances = ?found, "gateway instances changed: registering every replica again");
                    self.registered.clear();
                }
            }
            Err(e) => tracing::warn!(%service, "finding the gateway instances: {e}"),
        }
    }

    /// Builds the packer's inventory from the nodes' labels and the node
    /// agents' readings, instead of from a cluster file.
    pub fn inventory_from_nodes(mut self) -> Self {
        self.from_nodes = true;
        self
    }

    /// As the leader, every [`INVENTORY_EVERY`]: the GPU nodes
    /// (`spec.kubernetes.nodeSelector`) and the readings of the agents
    /// that answer, into a validated cluster. `None` between rebuilds,
    /// while the agents' readings are still coming in (a later tick
    /// returns the cluster), and when the nodes cannot be read (the last
    /// inventory stands).
    ///
    /// The agents are read [`AGENT_READS`] at a time on a task of their
    /// own, within [`AGENTS_DEADLINE`]; the tick waits for them at most
    /// [`AGENT_WAIT`]. Read one after the other inside the tick, a
    /// thousand agents took the decisions' loop seconds every rebuild,
    /// and each hung one up to its 5 s timeout.
    async fn inventory(&mut self, now: Duration) -> Option<Cluster> {
        if !self.from_nodes || !self.leading {
            // A follower builds nothing; a rebuild begun as the leader is
            // dropped (its reading task is aborted), and the next term
            // starts with a rebuild it waits for.
            if let Some(p) = self.pending_inventory.take() {
                p.readings.abort();
            }
            self.inventory_this_term = false;
            self.inventory_at = None;
            return None;
        }
        if self.pending_inventory.is_none() {
            if self
                .inventory_at
                .is_some_and(|t| now.saturating_sub(t) < INVENTORY_EVERY)
            {
                return None;
            }
            if !self.pods_listed().await {
                // Tried again next tick, not in 30 s.
                return None;
            }
            self.inventory_at = Some(now);
            self.pending_inventory = Some(self.begin_inventory().await?);
        }
        let pending = self.pending_inventory.as_mut()?;
        let wait = if self.inventory_this_term {
            AGENT_WAIT
        } else {
            AGENTS_DEADLINE + Duration::from_secs(1)
        };
        let readings = match tokio::time::timeout(wait, &mut pending.readings).await {
            Err(_) => return None,
            Ok(Ok(readings)) => readings,
            Ok(Err(e)) => {
                tracing::warn!("reading the node agents: {e}");
                BTreeMap::new()
            }
        };
        let PendingInventory { nodes, pods, .. } = self.pending_inventory.take()?;
        let held = crate::inventory::holdings(&pods, self.kube.ns());
        let builtin = gpuscale_policies::Catalog::builtin();
        let inv = crate::inventory::from_nodes(&nodes, &readings, &held, &builtin);
        if inv.notes != self.inventory_notes {
            for (node, why) in &inv.notes {
                tracing::warn!(%node, "inventory: {why}");
            }
            self.inventory_notes = inv.notes.clone();
        }
        match Cluster::from_spec("kubernetes", &inv.spec, &builtin) {
            Ok(c) => {
                self.inventory_this_term = true;
                Some(c)
            }
            Err(errors) => {
                for e in errors {
                    tracing::error!("inventory from the nodes: {}: {}", e.path, e.message);
                }
                None
            }
        }
    }

    /// Whether the pod watch has its first list in (started here if need
    /// be). The first inventory of a term waits for it up to
    /// [`AGENTS_DEADLINE`], as for the agents: without it the leader has
    /// no plan; later ones do not wait.
    async fn pods_listed(&mut self) -> bool {
        let watch = match &self.pods {
            Some(w) => w,
            None => self.pods.insert(self.kube.watch_pods()),
        };
        let wait = if self.inventory_this_term {
            Duration::ZERO
        } else {
            AGENTS_DEADLINE
        };
        if watch.listed_within(wait).await {
            return true;
        }
        tracing::info!("the pods bound to nodes are still being listed: no inventory yet");
        false
    }

    /// A rebuild begun: the GPU nodes listed, the pods as watched, the
    /// agents' readings under way. `None` when the nodes cannot be read.
    async fn begin_inventory(&self) -> Option<PendingInventory> {
        let nodes = match self.kube.nodes(&self.kube.spec().node_selector).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("reading the GPU nodes: {e}");
                return None;
            }
        };
        let agents = match self.kube.service_endpoints_by_node(AGENT_SERVICE).await {
            Ok(agents) => agents,
            Err(e) => {
                tracing::warn!("finding the node agents: {e}");
                Vec::new()
            }
        };
        let pods = self.pods.as_ref()?.current()?;
        let readings = tokio::spawn(read_agents(
            agents,
            AGENT_READS,
            Instant::now() + AGENTS_DEADLINE,
        ));
        Some(PendingInventory {
            nodes,
            pods,
            readings,
        })
    }

    /// Takes the models from the namespace's ModelPolicies as they change
    /// (a watch), instead of from the policies it was started with.
    pub fn watching_policies(mut self) -> Self {
        self.watch = Some(self.kube.watch_policies());
        self
    }

    /// The models, when the watched policies changed since last asked:
    /// each policy decoded and validated on its own; one that fails is
    /// reported (log and, as the leader, a Warning Event) and left out.
    async fn changed_policies(&mut self, now: Duration) -> Option<Vec<Model>> {
        let current = self.watch.as_ref()?.current()?;
        let versions: BTreeMap<String, String> = current
            .iter()
            .map(|(n, (rv, _))| (n.clone(), rv.clone()))
            .collect();
        if versions == self.versions {
            return None;
        }
        self.versions = versions;
        // Each policy owns its model's Deployments and Service.
        self.kube.set_owners(
            current
                .iter()
                .filter_map(|(n, (_, p))| {
                    let uid = p.as_ref().ok()?.metadata.uid.clone()?;
                    Some((n.clone(), uid))
                })
                .collect(),
        );
        let catalog = gpuscale_policies::Catalog::builtin();
        let mut claims = Vec::new();
        let mut refused = Vec::new();
        let mut undecodable = false;
        for (name, (_, listed)) in current {
            let why = match listed {
                Ok(p) => {
                    // An invalid policy still holds its names: its clients
                    // must not reach another policy's replicas meanwhile.
                    let served = p.spec.served_name.clone().unwrap_or_else(|| name.clone());
                    let names = std::iter::once(("spec.servedName".to_string(), served))
                        .chain(
                            p.spec
                                .adapters
                                .iter()
                                .enumerate()
                                .map(|(i, a)| (format!("spec.adapters[{i}]"), a.clone())),
                        )
                        .collect();
                    let created = p.metadata.creation_timestamp.clone().map(|t| t.0);
                    let (model, why) = match Model::from_policy(&p, &catalog) {
                        Ok(m) => (Some(m), None),
                        Err(errors) => (
                            None,
                            Some(
                                errors
                                    .iter()
                                    .map(|e| format!("{}: {}", e.path, e.message))
                                    .collect::<Vec<_>>()
                                    .join("; "),
                            ),
                        ),
                    };
                    claims.push(Claim {
                        policy: name.clone(),
                        names,
                        created,
                        model,
                    });
                    match why {
                        Some(why) => why,
                        None => continue,
                    }
                }
                Err((_, e)) => {
                    undecodable = true;
                    e
                }
            };
            refused.push((name, why));
        }
        // Every served name a listed policy claims, valid or not; `None`
        // when a policy does not decode (its name is unknown: nothing is
        // taken off the gateway while it stays so).
        self.listed_served = (!undecodable).then(|| {
            claims
                .iter()
                .filter_map(|c| c.names.first().map(|(_, n)| n.clone()))
                .collect()
        });
        let claimed = claim_served_names(claims);
        refused.extend(claimed.left_out);
        let models = claimed.kept;
        for (name, why) in refused {
            tracing::error!(policy = %name, "invalid ModelPolicy, left out: {why}");
            if self.leading {
                self.tell(
                    &Regarding::policy(&name, &self.kube.spec().namespace),
                    Said {
                        action: "Validate".into(),
                        reason: "InvalidPolicy".into(),
                        note: format!("left out until fixed: {why}"),
                        warning: true,
                    },
                    now,
                )
                .await;
            }
        }
        Some(models)
    }

    /// The variants a model runs as: the plan's, or one whole-GPU variant
    /// named after the model when there is no plan.
    fn variants_of(model: &Model, replicas: u32, plan: Option<&Plan>) -> Vec<Variant> {
        if let Some(mp) = plan.and_then(|p| p.models.iter().find(|m| m.name == model.name)) {
            return mp.variants.clone();
        }
        vec![crate::kubernetes::whole_gpu_variant(model, replicas)]
    }

    /// Whether variant `v`'s Deployment, as last read, carries a digest
    /// other than the one it would be applied with now (`false` where it
    /// carries none, or is not gpuscale's).
    fn template_changed(&self, model: &Model, v: &Variant) -> bool {
        let want = crate::kubernetes::template_of(model, v, self.kube.spec());
        match self.templates.get(&v.name) {
            Some((_, Some(live), _)) => *live != want,
            // Applied by a controller before the digest: rolled like a
            // change (an identical template restarts nothing).
            Some((_, None, _)) => true,
            None => false,
        }
    }

    /// Rolls out pod templates that changed while the counts did not (a
    /// policy's image, arguments or resources, the controller's settings):
    /// every tick, each model's Deployments as last read are compared
    /// with what the model's variants would be applied as now
    /// ([`crate::kubernetes::template_hash`]), and the first that differs
    /// is applied, one Deployment per model at a time: only while every
    /// Deployment of the model has finished its rollout, so a model never
    /// restarts more than one variant's replicas at once. A model whose
    /// Deployments were applied this round (a change) waits for the next
    /// read; a Deployment without the digest (applied before it existed)
    /// is left to its model's next change.
    async fn roll(&mut self, models: &[Model], plan: Option<&Plan>) -> Result<(), KubeError> {
        // Packing with no plan yet: the variants are not known. A dry run
        // writes nothing, so every tick would find the same difference.
        if !self.leading || self.kube.dry_run() || (self.kube.spec().pack && plan.is_none()) {
            return Ok(());
        }
        for model in models {
            let mine: Vec<(&String, bool)> = self
                .templates
                .iter()
                .filter(|(_, (m, _, _))| *m == model.name)
                .map(|(name, (_, _, settled))| (name, *settled))
                .collect();
            if mine.is_empty() || mine.iter().any(|(name, _)| self.applied.contains(*name)) {
                continue;
            }
            // Packing: what the model's last change applied (so a plan
            // re-made for other models does not start variants this one
            // never ran), else the plan's. Not packing: the policy's own
            // whole-GPU variant as it is now (a policy edited since the
            // last change, say to tensor parallelism 2, rolls its new
            // request, not the one last applied). Either way restricted
            // to the Deployments that exist.
            let replicas = self.desired.get(&model.name).copied().unwrap_or(0);
            let variants: Vec<Variant> = match self.last_applied.get(&model.name) {
                Some(v) if plan.is_some() => v.clone(),
                _ => Self::variants_of(model, replicas, plan),
            };
            let changed: Vec<&Variant> = variants
                .iter()
                .filter(|v| self.templates.contains_key(&v.name))
                .filter(|v| self.template_changed(model, v))
                .collect();
            // The one Deployment of the model still rolling, when its
            // template changed again (an image fixed after a bad one),
            // takes the new one at once; otherwise the next changed one
            // waits until none of the model's Deployments is rolling.
            let rolling: Vec<&String> = mine
                .iter()
                .filter(|(_, settled)| !settled)
                .map(|(n, _)| *n)
                .collect();
            let due = changed
                .iter()
                .find(|v| rolling.len() == 1 && *rolling[0] == v.name)
                .or_else(|| {
                    mine.iter()
                        .all(|(_, settled)| *settled)
                        .then(|| changed.first())
                        .flatten()
                })
                .map(|v| (*v).clone());
            let Some(v) = due else {
                continue;
            };
            if !self.still_leading() {
                return Err(lost());
            }
            tracing::info!(
                model = %model.name,
                deployment = %v.name,
                "its pod template changed (the policy or the controller's settings): rolling it out, one Deployment of the model at a time"
            );
            self.kube.apply_deployment(model, &v).await?;
            self.applied.insert(v.name.clone());
        }
        Ok(())
    }

    /// Still the leader now (the renew deadline has not passed since the
    /// last renewal): checked before every write, so that a loop stalled
    /// on slow calls stops writing before another leader can start.
    fn still_leading(&self) -> bool {
        self.kube.dry_run() || self.elector.leading(Instant::now())
    }

    /// Notes a successful write of the lease at `at`: leading, and the
    /// client's writes fenced at the renew deadline.
    fn won(&mut self, written: k8s_openapi::api::coordination::v1::Lease, at: Instant) {
        self.elector.won(written, at);
        self.kube.fence(Some(at + self.kube.spec().renew_deadline));
    }

    /// One round of the election (every retry period; between rounds the
    /// last renewal stands): `true` while this process leads.
    async fn elect(&mut self, wall: Duration) -> bool {
        if self.kube.dry_run() {
            return true;
        }
        let now = Instant::now();
        if !self.elector.due(now) {
            return self.elector.leading(now);
        }
        self.elector.tried(now);
        // The leader renews without reading first.
        if let Some(lease) = self.elector.renewal(wall, now) {
            match self.kube.update_lease(&lease).await {
                Ok(written) => {
                    self.won(written, now);
                    return true;
                }
                Err(e) => {
                    if e.code() == Some(409) {
                        self.elector.conflicted();
                    }
                    tracing::warn!("renewing the lease: {e}; reading it");
                }
            }
        }
        let read = match self.kube.lease().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("reading the lease: {e}");
                return self.elector.leading(Instant::now());
            }
        };
        let written = match self.elector.step(read.as_ref(), wall, now) {
            Step::Follow { holder } => {
                tracing::debug!(%holder, "following");
                self.kube.fence(Some(now));
                return false;
            }
            Step::Create(lease) => self.kube.create_lease(&lease).await,
            Step::Update(lease) => self.kube.update_lease(&lease).await,
        };
        match written {
            Ok(w) => {
                self.won(w, now);
                true
            }
            Err(e) => {
                if e.code() == Some(409) {
                    // Someone wrote it between our read and write.
                    self.elector.conflicted();
                } else {
                    tracing::warn!("writing the lease: {e}");
                }
                self.elector.leading(Instant::now())
            }
        }
    }

    /// Releases the lease (on shutdown), so that a successor leads at once.
    async fn release(&mut self) {
        if self.kube.dry_run() {
            return;
        }
        if let Some(lease) = self.elector.release(wall_now(), Instant::now()) {
            match self.kube.update_lease(&lease).await {
                Ok(_) => tracing::info!("released the lease"),
                Err(e) => tracing::warn!("releasing the lease: {e}"),
            }
            self.elector.step_down();
            self.kube.fence(Some(Instant::now()));
        }
    }

    /// Creates an Event, within the per-object budget; a failure is
    /// logged.
    async fn tell(&mut self, regarding: &Regarding, said: Said, now: Duration) {
        let key = format!("{}/{}", regarding.kind, regarding.name);
        if !self.events.take(&key, now) {
            tracing::info!(object = %key, reason = %said.reason, "event dropped (over the per-object budget): {}", said.note);
            return;
        }
        let ev = event_about(regarding, &said, self.kube.identity(), now);
        if let Err(e) = self.kube.emit(&ev).await {
            tracing::warn!(object = %key, "recording an event: {e}");
        }
    }

    /// Applies one model's change: its Service, its variants'
    /// Deployments and counts, and zero for variants the plan dropped.
    /// Deployments that exist and are not gpuscale's are left alone and
    /// reported.
    async fn scale_model(
        &mut self,
        c: &Change,
        plan: Option<&Plan>,
        now: Duration,
    ) -> Result<(), KubeError> {
        let model = &c.model;
        // The model's Service: applied on its first change in a process
        // and again at the first change past `SERVICE_RESYNC` (a Service
        // deleted meanwhile comes back), each time read first: one
        // gpuscale did not create is never taken over.
        let applied = self.services.get(&model.name).copied();
        if applied.is_none_or(|at| now.saturating_sub(at) >= SERVICE_RESYNC) {
            let name = crate::kubernetes::service_name(&model.name);
            if let Some(svc) = self.kube.service(&name).await?
                && !owned_by_us(&svc.metadata)
            {
                let why = KubeError::NotOurs {
                    kind: "Service",
                    name,
                };
                self.tell(
                    &Regarding::policy(&model.name, &self.kube.spec().namespace),
                    Said {
                        action: "Adopt".into(),
                        reason: "NameInUse".into(),
                        note: format!("{why}; the model is not scaled until then"),
                        warning: true,
                    },
                    now,
                )
                .await;
                return Err(why);
            }
            self.kube.apply_service(model).await?;
            self.services.insert(model.name.clone(), now);
        }
        let variants = Self::variants_of(model, c.rec.replicas, plan);
        self.planned.insert(
            model.name.clone(),
            variants.iter().map(|v| v.name.clone()).collect(),
        );
        self.last_applied
            .insert(model.name.clone(), variants.clone());
        let before = self.variants.get(&model.name).cloned().unwrap_or_default();
        // A move is made before it breaks: what the plan scales down keeps
        // serving until what it scales up is ready (`handover`).
        let read = self.read.get(&model.name).cloned().unwrap_or_default();
        let was_held: BTreeSet<String> = read
            .iter()
            .filter(|v| v.held.is_some())
            .map(|v| v.name.clone())
            .collect();
        let planned: BTreeMap<String, u32> = variants
            .iter()
            .map(|v| (v.name.clone(), v.replicas))
            .chain(before.iter().map(|n| (n.clone(), 0)))
            .fold(BTreeMap::new(), |mut acc, (n, r)| {
                let e = acc.entry(n).or_insert(0);
                *e = (*e).max(r);
                acc
            });
        let counts = handover::start(
            &read,
            &planned,
            now,
            model.scaling.startup_time * HANDOVER_STARTUPS,
        );
        let mut applied = BTreeSet::new();
        let mut rolled = false;
        let mut refused = BTreeSet::new();
        // What grows first, then what shrinks or holds
        // (`handover::shrinks`).
        let mut variants: Vec<_> = variants.iter().collect();
        variants.sort_by_key(|v| {
            let (n, held) = counts.get(&v.name).copied().unwrap_or((v.replicas, None));
            handover::shrinks(&read, &v.name, n, held)
        });
        for v in variants {
            if !self.still_leading() {
                return Err(lost());
            }
            if !self.owned.contains(&v.name) {
                match self.kube.deployment(&v.name).await? {
                    Some(d) if !owned_by_us(&d.metadata) => {
                        refused.insert(v.name.clone());
                        continue;
                    }
                    _ => {}
                }
            }
            // A running variant whose pod template changed rolls at once
            // only if it is the model's first: while another of the
            // model's Deployments rolls, it keeps its pods (and the roll
            // takes it later), so a change never restarts two variants'
            // replicas together.
            let rolls = self.template_changed(model, v)
                && read.iter().any(|r| r.name == v.name && r.replicas > 0);
            // Another of the model's Deployments rolling: not settled when
            // read, or applied since.
            let rolling = self.templates.iter().any(|(name, (m, _, settled))| {
                *m == model.name && *name != v.name && (!settled || self.applied.contains(name))
            }) || rolled;
            // A count that grows keeps the old template too: applying the
            // new one would replace the pods that run, not only add new
            // ones, and two variants would roll together.
            let live = if rolls && rolling {
                self.kube.deployment(&v.name).await?
            } else {
                None
            };
            if let Some(live) = live {
                tracing::info!(model = %model.name, deployment = %v.name, "its pod template changed: kept until the model's other Deployments have rolled");
                self.kube
                    .apply_deployment_keeping_pods(model, v, &live)
                    .await?;
            } else {
                self.kube.apply_deployment(model, v).await?;
                self.applied.insert(v.name.clone());
                rolled |= rolls;
            }
            self.owned.insert(v.name.clone());
            let (n, held) = counts.get(&v.name).copied().unwrap_or((v.replicas, None));
            self.scale_held(
                &model.name,
                &v.name,
                (n, v.spares),
                held,
                was_held.contains(&v.name),
            )
            .await?;
            applied.insert(v.name.clone());
        }
        // Variants the plan no longer uses go to zero (once their
        // successors are ready).
        let mut held_on = BTreeSet::new();
        let dropped: Vec<String> = before.difference(&applied).cloned().collect();
        for gone in &dropped {
            if refused.contains(gone) || !self.owned.contains(gone) {
                continue;
            }
            if !self.still_leading() {
                return Err(lost());
            }
            let (n, held) = counts.get(gone).copied().unwrap_or((0, None));
            // Already at zero, with no hold and no spare: nothing to
            // write. Every variant a model ever ran stays at zero (one
            // per GPU for a pinned fractional one), and a change would
            // otherwise scale each of them again.
            let idle = read
                .iter()
                .any(|v| v.name == *gone && v.replicas == 0 && v.held.is_none() && v.spares == 0);
            if idle && n == 0 && held.is_none() && !was_held.contains(gone) {
                continue;
            }
            self.scale_held(&model.name, gone, (n, 0), held, was_held.contains(gone))
                .await?;
            if n > 0 {
                held_on.insert(gone.clone());
            }
        }
        applied.extend(held_on);
        self.variants.insert(model.name.clone(), applied);
        let was = self.refused.get(&model.name).cloned().unwrap_or_default();
        if refused != was {
            let names: Vec<String> = refused.iter().cloned().collect();
            if !refused.is_empty() {
                tracing::warn!(model = %model.name, deployments = ?names, "not adopting Deployments gpuscale did not create");
                self.tell(
                    &Regarding::policy(&model.name, &self.kube.spec().namespace),
                    Said {
                        action: "Adopt".into(),
                        reason: "NameInUse".into(),
                        note: format!(
                            "Deployment(s) {} exist and were not created by gpuscale; they are \
                             left alone and their planned replicas do not run",
                            names.join(", ")
                        ),
                        warning: true,
                    },
                    now,
                )
                .await;
            }
            if let Err(e) = self
                .kube
                .patch_status_value(&model.name, ownership_patch(&names, now))
                .await
            {
                tracing::warn!(model = %model.name, "recording ownership in the status: {e}");
            }
            self.refused.insert(model.name.clone(), refused);
        }
        Ok(())
    }

    /// Sets a variant's count, with its hand-over hold when it has one or
    /// had one (one write of the Deployment: count and annotations
    /// together), else through `/scale`; and remembers what it wrote, for
    /// decisions before the next tick reads the Deployments again.
    async fn scale_held(
        &mut self,
        model: &str,
        name: &str,
        (count, spares): (u32, u32),
        held: Option<Held>,
        was_held: bool,
    ) -> Result<(), KubeError> {
        if held.is_some() || was_held {
            self.kube.hold(name, count, held).await?;
        } else {
            self.kube.scale(name, count).await?;
        }
        let read = self.read.entry(model.to_string()).or_default();
        match read.iter_mut().find(|v| v.name == name) {
            Some(v) => {
                v.replicas = count;
                v.ready = v.ready.min(count);
                v.held = held;
                v.spares = spares;
            }
            None => read.push(VariantNow {
                name: name.to_string(),
                replicas: count,
                ready: 0,
                held,
                spares,
            }),
        }
        Ok(())
    }

    /// Ends the hand-over holds of `variants` (those held): each goes to
    /// the count the plan gave it.
    async fn end_holds(&mut self, variants: &BTreeSet<String>) -> Result<(), KubeError> {
        let held: Vec<(String, String, (u32, u32))> = self
            .read
            .iter()
            .flat_map(|(m, vs)| vs.iter().map(move |v| (m, v)))
            .filter(|(_, v)| variants.contains(&v.name))
            .filter_map(|(m, v)| {
                v.held.map(|h| {
                    let planned = h.planned.min(v.replicas);
                    (m.clone(), v.name.clone(), (planned, v.spares.min(planned)))
                })
            })
            .collect();
        for (model, name, planned) in held {
            if !self.still_leading() {
                return Err(lost());
            }
            tracing::info!(deployment = %name, "a MIG drain ends the hand-over's hold");
            self.scale_held(&model, &name, planned, None, true).await?;
        }
        Ok(())
    }

    async fn apply(
        &mut self,
        changes: &[Change],
        plan: Option<&Plan>,
        before: Option<&Cluster>,
        now: Duration,
    ) -> BTreeSet<String> {
        let all = || changes.iter().map(|c| c.model.name.clone()).collect();
        if !self.leading {
            tracing::info!(
                "not the leader: {} change(s) left to the leader",
                changes.len()
            );
            return all();
        }
        let mut failed = BTreeSet::new();
        for (i, c) in changes.iter().enumerate() {
            if !self.still_leading() {
                tracing::warn!("the lease was not renewed in time: stopping before the next write");
                self.leading = false;
                failed.extend(changes[i..].iter().map(|c| c.model.name.clone()));
                return failed;
            }
            // Scaling first; a failure stops this model, not the others.
            if let Err(e) = self.scale_model(c, plan, now).await {
                tracing::error!(model = %c.model.name, "scaling: {e}");
                failed.insert(c.model.name.clone());
                continue;
            }
            self.desired.insert(c.model.name.clone(), c.rec.replicas);
            // Then the record (Event, status): bookkeeping, whose failure
            // (a policy given as a file has no object) is logged only.
            self.tell(
                &Regarding::policy(&c.model.name, &self.kube.spec().namespace),
                Said {
                    action: "Scale".into(),
                    reason: format!("{:?}", c.rec.mode),
                    note: c.rec.reason.clone(),
                    warning: false,
                },
                now,
            )
            .await;
            if let Err(e) = self
                .kube
                .status(&c.model.name, c.from, &c.rec, now, c.memory.as_ref())
                .await
            {
                tracing::warn!(model = %c.model.name, "recording the decision in the status: {e}");
            }
        }
        if let (Some(plan), Some(before)) = (plan, before)
            && let Err(e) = self.reconfigure(plan, before, now).await
        {
            tracing::error!("MIG reconfiguration: {e}");
        }
        failed
    }

    /// Starts a MIG hand-off on each node whose geometry the plan changes
    /// (`before`: the cluster as it was when the plan was made): the
    /// mig-parted ConfigMap first (the plan's configs, and those other
    /// nodes still name), then per node a cordon with the hand-off
    /// recorded on it. Nodes whose changing GPUs are idle get their
    /// config at once; the others are drained first
    /// ([`Self::advance_handoffs`]).
    async fn reconfigure(
        &mut self,
        plan: &Plan,
        before: &Cluster,
        now: Duration,
    ) -> Result<(), KubeError> {
        let mut starts = Vec::new();
        for node in &plan.nodes {
            if self.mig.get(&node.name) == Some(&node.mig_config) {
                continue;
            }
            if self.left_pool.contains(&node.name) {
                tracing::warn!(node = %node.name, config = %node.mig_config, "the plan names a node that left the managed pool mid-hand-off: its MIG geometry is not changed until an inventory shows it in the pool again (with a cluster file: until a restart)");
                continue;
            }
            let Some(was) = before.nodes.iter().find(|n| n.name == node.name) else {
                continue;
            };
            let changing = changing_gpus(&plan.gpus, was);
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
            let mut drain = !may_reconfigure(&busy, &changing);
            // A GPU switching into MIG mode may be one a whole-GPU or
            // time-sliced pod holds; a new layout of a MIG GPU concerns
            // MIG pods alone ([`Evict`]).
            let mig_now: Vec<bool> = was.gpus.iter().map(|g| g.mode == GpuMode::Mig).collect();
            let evict = evict_for(&mig_now, &changing);
            if !drain && self.from_nodes {
                // The inventory from the nodes does not say which GPU a
                // pod runs on: any gpuscale pod on the node that the
                // change could concern means a drain.
                drain = !self.kube.gpu_pods_on(&node.name, evict).await?.is_empty();
            }
            starts.push((node.name.clone(), node.mig_config.clone(), drain, evict));
        }
        if starts.is_empty() {
            return Ok(());
        }
        // Nodes in a hand-off already finish it first.
        let in_handoff: BTreeSet<String> = self
            .kube
            .nodes(HANDOFF_LABEL)
            .await?
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        starts.retain(|(n, _, _, _)| !in_handoff.contains(n));
        if starts.is_empty() {
            return Ok(());
        }
        // The config every label will name must exist first, and configs
        // other nodes still name must stay.
        let mut named: BTreeSet<String> = BTreeSet::new();
        for n in self.kube.nodes(MIG_CONFIG_LABEL).await? {
            if let Some(c) = n
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MIG_CONFIG_LABEL))
            {
                named.insert(c.clone());
            }
            if let Some(c) = n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(HANDOFF_CONFIG))
            {
                named.insert(c.clone());
            }
        }
        let existing = self.kube.mig_configmap_text().await?;
        let config = merged_mig_parted(plan, existing.as_deref(), &named);
        if !self.still_leading() {
            return Err(lost());
        }
        self.kube.apply_mig_configmap(&config).await?;
        for (node, cfg, drain, evict) in starts {
            if !self.still_leading() {
                return Err(lost());
            }
            tracing::info!(%node, config = %cfg, drain, "MIG hand-off: cordoning");
            self.kube
                .patch_node(
                    &node,
                    handoff_start_patch(&cfg, drain, evict, &self.kube.spec().handoff_owner()),
                )
                .await?;
            self.mig.insert(node.clone(), cfg);
            self.tell(
                &Regarding::node(&node),
                Said {
                    action: "ReconfigureMIG".into(),
                    reason: if drain { "Draining" } else { "Configuring" }.into(),
                    note: format!(
                        "cordoned to change the MIG geometry{}",
                        match (drain, evict) {
                            (false, _) => "",
                            (true, Evict::Mig) => "; evicting gpuscale's MIG pods first",
                            (true, Evict::Gpus) => {
                                "; evicting gpuscale's GPU pods first (a GPU switches into MIG mode)"
                            }
                        }
                    ),
                    warning: false,
                },
                now,
            )
            .await;
        }
        Ok(())
    }

    /// Moves every recorded MIG hand-off on (read from the nodes, so a
    /// restart or a new leader carries on where the last one stopped):
    /// - draining: evict gpuscale's MIG pods, or all its GPU pods where a
    ///   GPU switches into MIG mode (a pod gone is done; one a
    ///   PodDisruptionBudget holds waits for a later tick); once none is
    ///   left, set the config;
    /// - configuring: wait for the MIG manager; `success` uncordons,
    ///   `failed` keeps the node cordoned with a Warning and the reason.
    ///
    /// Each node on its own: a write one node's hand-off cannot make (a
    /// config its annotation names that is no label value, a node gone)
    /// is logged and tried again next tick, and holds up neither the other
    /// nodes nor the models' scaling.
    async fn advance_handoffs(&mut self, now: Duration) -> Result<(), KubeError> {
        // In the managed pool, every hand-off is moved on (the pool is
        // this controller's; one recorded under an earlier namespace or
        // lease name, or before owners were recorded, is finished too).
        // Outside it, only this controller's own: a node that left the
        // pool mid-hand-off. Another's, or an unowned one outside the
        // pool, is never drained, reconfigured or uncordoned.
        let pool = self.kube.spec().pool_labels().unwrap_or_default();
        let me = self.kube.spec().handoff_owner();
        for node in self.kube.nodes(HANDOFF_LABEL).await? {
            let Some(name) = node.metadata.name.clone() else {
                continue;
            };
            let by = crate::kubernetes::handoff_by(&node);
            let mine = by == Some(me.as_str());
            let inside = crate::kubernetes::in_pool(&node, &pool);
            if !(mine || inside) {
                continue;
            }
            if !self.still_leading() {
                return Err(lost());
            }
            let step = if !inside && matches!(handoff_of(&node), Some(Handoff::Draining { .. })) {
                self.abandon_handoff(&name, now).await
            } else {
                self.advance_handoff(&node, &name, now).await
            };
            if let Err(e) = step {
                if !self.still_leading() {
                    return Err(e);
                }
                tracing::warn!(node = %name, "moving its MIG hand-off on: {e}; tried again next tick");
            }
        }
        Ok(())
    }

    /// A node that left the managed pool while it drained: its geometry
    /// is no longer the plan's to change, so the hand-off is dropped, the
    /// node uncordoned and the record removed. (One already configuring
    /// is left to finish: the MIG manager is at work on it.)
    async fn abandon_handoff(&mut self, name: &str, now: Duration) -> Result<(), KubeError> {
        self.kube.patch_node(name, handoff_done_patch()).await?;
        self.mig.remove(name);
        self.left_pool.insert(name.to_string());
        tracing::warn!(node = %name, "left the managed pool mid-hand-off; hand-off dropped, uncordoned");
        self.tell(
            &Regarding::node(name),
            Said {
                action: "ReconfigureMIG".into(),
                reason: "LeftPool".into(),
                note:
                    "left gpuscale's managed pool while it drained; the MIG hand-off is dropped, \
                       its geometry unchanged, and the node uncordoned"
                        .into(),
                warning: true,
            },
            now,
        )
        .await;
        Ok(())
    }

    /// One node's hand-off ([`Self::advance_handoffs`]).
    async fn advance_handoff(
        &mut self,
        node: &k8s_openapi::api::core::v1::Node,
        name: &str,
        now: Duration,
    ) -> Result<(), KubeError> {
        let name = name.to_string();
        {
            match handoff_of(node) {
                Some(Handoff::Draining { config, evict }) => {
                    let pods = self.kube.gpu_pods_on(&name, evict).await?;
                    if pods.is_empty() {
                        self.kube
                            .patch_node(&name, handoff_configure_patch(&config))
                            .await?;
                        self.mig.insert(name.clone(), config);
                        return Ok(());
                    }
                    // A held variant's pods evicted here would come back
                    // (its count still holds them): its hold ends first.
                    let variants: BTreeSet<String> =
                        pods.iter().filter_map(|(_, v)| v.clone()).collect();
                    self.end_holds(&variants).await?;
                    for (pod, _) in pods {
                        match self.kube.evict(&pod).await {
                            Ok(Evicted::Blocked) => tracing::info!(
                                node = %name, %pod,
                                "a PodDisruptionBudget holds the eviction; retrying next tick"
                            ),
                            Ok(_) => {}
                            Err(e) => tracing::warn!(node = %name, %pod, "evicting: {e}"),
                        }
                    }
                }
                Some(Handoff::Configuring { config }) => {
                    let names_it = node
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(MIG_CONFIG_LABEL))
                        .is_some_and(|c| *c == config);
                    match mig_state(node) {
                        Some("success") if names_it => {
                            self.kube.patch_node(&name, handoff_done_patch()).await?;
                            self.mig.insert(name.clone(), config.clone());
                            self.tell(
                                &Regarding::node(&name),
                                Said {
                                    action: "ReconfigureMIG".into(),
                                    reason: "Reconfigured".into(),
                                    note: format!("the MIG manager applied {config}; uncordoned"),
                                    warning: false,
                                },
                                now,
                            )
                            .await;
                        }
                        Some("failed") => {
                            tracing::error!(node = %name, %config, "the MIG manager failed; the node stays cordoned");
                            self.kube
                                .patch_node(&name, handoff_failed_patch(&config))
                                .await?;
                            self.tell(
                                &Regarding::node(&name),
                                Said {
                                    action: "ReconfigureMIG".into(),
                                    reason: "MIGConfigFailed".into(),
                                    note: format!(
                                        "the MIG manager failed to apply {config} \
                                         ({MIG_STATE_LABEL}=failed); the node stays cordoned \
                                         until an operator uncordons it and removes the label \
                                         {HANDOFF_LABEL}"
                                    ),
                                    warning: true,
                                },
                                now,
                            )
                            .await;
                        }
                        _ => {}
                    }
                }
                Some(Handoff::Failed { .. }) | None => {}
            }
        }
        Ok(())
    }

    /// Every tick: the election; as the leader, the live counts from the
    /// Deployments gpuscale owns (and, on taking over, the memory the last
    /// leader left) and the MIG hand-offs; EndpointSlice discovery into
    /// the gateway.
    async fn tick(&mut self, models: &[Model], now: Duration) -> Result<Observed, KubeError> {
        let was_leading = self.leading;
        self.leading = self.elect(now).await;
        let mut observed = Observed::default();
        if self.leading
            && let Err(e) = self
                .read_cluster(models, was_leading, now, &mut observed)
                .await
        {
            // Not acting on a half-read cluster: the next tick that reads
            // it all takes over afresh.
            self.leading = false;
            return Err(e);
        }
        observed.policies = self.changed_policies(now).await;
        observed.cluster = self.inventory(now).await;
        if let Some(c) = &observed.cluster {
            // Back in the pool: the plan's again.
            self.left_pool
                .retain(|n| !c.nodes.iter().any(|node| node.name == *n));
        }
        let repairs = self.discover(models).await?;
        // One count per repair: every replica of the controller discovers,
        // and only the leader's repairs are reported.
        if self.leading {
            observed.repairs = repairs;
        }
        Ok(observed)
    }

    async fn read_cluster(
        &mut self,
        models: &[Model],
        was_leading: bool,
        now: Duration,
        observed: &mut Observed,
    ) -> Result<(), KubeError> {
        let owned = self.kube.owned().await?;
        self.owned = owned.iter().map(|o| o.name.clone()).collect();
        self.templates = owned
            .iter()
            .map(|o| {
                (
                    o.name.clone(),
                    (o.model.clone(), o.template.clone(), o.settled),
                )
            })
            .collect();
        self.applied.clear();
        // A dry run beside another controller (KEDA mode: KEDA scales the
        // model server's own Deployment): a model with no Deployment of
        // gpuscale's starts from the replicas that Deployment runs, as
        // gpuscale would if it were in charge. Only read, never written.
        let observed_elsewhere = if self.kube.dry_run()
            && models
                .iter()
                .any(|m| !owned.iter().any(|o| o.model == m.name))
        {
            self.kube.observed().await?
        } else {
            BTreeMap::new()
        };
        // What the last term planned, and how long variants were idle
        // then, say nothing about this one: a model this leader has not
        // changed keeps every variant.
        if !was_leading {
            self.planned.clear();
            self.idle_since.clear();
            self.last_applied.clear();
        }
        // Idle variants the plan has left, removed after a while.
        let gone = self.remove_idle_variants(models, &owned, now).await?;
        self.templates.retain(|name, _| !gone.contains(name));
        let owned: Vec<Owned> = owned
            .into_iter()
            .filter(|o| !gone.contains(&o.name))
            .collect();
        for m in models {
            let mine: Vec<&Owned> = owned.iter().filter(|o| o.model == m.name).collect();
            let read: Vec<VariantNow> = mine.iter().map(|&o| VariantNow::from(o)).collect();
            // The decision, not the replicas a hand-over holds above it.
            let n = if mine.is_empty() {
                observed_elsewhere.get(&m.name).copied().unwrap_or(0)
            } else {
                handover::decided(&read)
            };
            // Variants that run now are the ones a later change scales to
            // zero when the plan moves off them.
            self.variants.insert(
                m.name.clone(),
                mine.iter().map(|o| o.name.clone()).collect(),
            );
            self.desired.insert(m.name.clone(), n);
            observed.replicas.insert(m.name.clone(), n);
            if !was_leading && let Some(mem) = self.kube.remembered(&m.name).await? {
                observed.memory.insert(m.name.clone(), mem);
            }
            // Hand-overs move on: held replicas leave as their successors
            // become ready, or at the deadline.
            let mut read = read;
            for (name, count, held) in handover::advance(&read, now) {
                if !self.still_leading() {
                    return Err(lost());
                }
                if held.is_none() {
                    self.kube.hold(&name, count, None).await?;
                } else {
                    self.kube.scale(&name, count).await?;
                }
                if let Some(v) = read.iter_mut().find(|v| v.name == name) {
                    v.replicas = count;
                    v.held = held;
                }
            }
            self.read.insert(m.name.clone(), read);
        }
        if !was_leading {
            self.remembered_at = Some(now);
            observed.took_over = true;
        }
        // A controller that packs nothing (`pack: false`, sidecar mode)
        // changes no MIG geometry, so it has no hand-off to move on and
        // reads no Node (its RBAC grants none: deploy/overlays/sidecar).
        if self.kube.spec().pack {
            self.advance_handoffs(now).await
        } else {
            Ok(())
        }
    }

    /// Deletes the variant Deployments that have been idle
    /// ([`Owned::idle`]) and outside their model's last planned change for
    /// [`IDLE_VARIANT_TTL`]; returns their names. A model with no change
    /// applied in this leadership term yet keeps every variant, and so
    /// does one whose policy is not among `models` (deleted: its owner
    /// reference removes them; invalid: kept as they are).
    async fn remove_idle_variants(
        &mut self,
        models: &[Model],
        owned: &[Owned],
        now: Duration,
    ) -> Result<BTreeSet<String>, KubeError> {
        let stale: BTreeSet<&str> = owned
            .iter()
            .filter(|o| {
                o.idle()
                    && models.iter().any(|m| m.name == o.model)
                    && self
                        .planned
                        .get(&o.model)
                        .is_some_and(|p| !p.contains(&o.name))
            })
            .map(|o| o.name.as_str())
            .collect();
        self.idle_since.retain(|n, _| stale.contains(n.as_str()));
        let mut gone = BTreeSet::new();
        for o in owned.iter().filter(|o| stale.contains(o.name.as_str())) {
            let since = *self.idle_since.entry(o.name.clone()).or_insert(now);
            if now.saturating_sub(since) < IDLE_VARIANT_TTL {
                continue;
            }
            if !self.still_leading() {
                return Err(lost());
            }
            // A delete refused (a webhook, a Role without `delete`) or
            // failed is logged and tried again next tick; it holds up
            // nothing else.
            match self
                .kube
                .delete_deployment(&o.name, o.resource_version.as_deref())
                .await
            {
                Ok(true) => {
                    tracing::info!(model = %o.model, deployment = %o.name, "a variant the plan left, idle for {}: deleted", gpuscale_policies::duration::show(IDLE_VARIANT_TTL));
                    self.idle_since.remove(&o.name);
                    self.owned.remove(&o.name);
                    gone.insert(o.name.clone());
                }
                Ok(false) => {}
                Err(e) if !self.still_leading() => return Err(e),
                Err(e) => {
                    tracing::warn!(model = %o.model, deployment = %o.name, "deleting a variant the plan left: {e}; tried again next tick")
                }
            }
        }
        Ok(gone)
    }

    /// The ready endpoints of each model's Service (one list call for
    /// them all), by model.
    async fn endpoints(
        &self,
        models: &[Model],
    ) -> Result<BTreeMap<String, BTreeSet<String>>, KubeError> {
        let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
        Ok(self
            .kube
            .endpoints_of(&names)
            .await?
            .into_iter()
            .map(|(m, e)| (m, e.into_iter().collect()))
            .collect())
    }

    /// The ready endpoints of each model's Service, registered with the
    /// gateway (and those gone, removed). Returns the repairs: endpoints
    /// the gateway had lost, registered again, and registrations no
    /// ready endpoint and no earlier registration of this process
    /// explains, removed.
    async fn discover(&mut self, models: &[Model]) -> Result<crate::local::Repairs, KubeError> {
        let mut repairs = crate::local::Repairs::default();
        self.find_gateways().await;
        if !self.registers {
            // Sidecar gateways: each fronts its own pod's model server;
            // the ready endpoints are counted, not registered.
            let mut found = self.endpoints(models).await?;
            for m in models {
                let found: BTreeSet<String> = found.remove(&m.name).unwrap_or_default();
                self.registered.insert(m.served_name.clone(), found);
            }
            return Ok(repairs);
        }
        // What the gateway lists now: an endpoint registered before that
        // it no longer lists (it restarted, someone removed it) is
        // registered again below, and one registered through its API that
        // no EndpointSlice shows ready (left by an earlier leader, or by
        // a removal that failed) is removed. Unreadable: trust what was
        // registered.
        let lists = self.gateway.replica_lists().await.ok();
        let listed = lists.as_ref().map(|l| &l.everywhere);
        let mut all_found = self.endpoints(models).await?;
        for m in models {
            let found = all_found.remove(&m.name).unwrap_or_default();
            let known = self.registered.entry(m.served_name.clone()).or_default();
            // Every ready endpoint gone at once may be its Service gone:
            // the model's next change reads and applies it again.
            if found.is_empty() && !known.is_empty() {
                self.services.remove(&m.name);
            }
            // Removed below: what this process registered and is gone,
            // and what the gateway holds as registered and is not found.
            let mut gone: BTreeSet<String> = known.difference(&found).cloned().collect();
            // Of those, the ones no registration of this process explains:
            // removed by the leader only (a follower whose EndpointSlice
            // read lags would remove what the leader just registered).
            let mut stale = BTreeSet::new();
            if let Some(registered) = lists
                .as_ref()
                .filter(|_| self.leading)
                .and_then(|l| l.registered.get(&m.served_name))
            {
                for e in registered.difference(&found) {
                    if !known.contains(e) {
                        stale.insert(e.clone());
                    }
                    gone.insert(e.clone());
                }
            }
            if let Some(listed) = listed {
                let there = listed.get(&m.served_name);
                let lost = known
                    .iter()
                    .filter(|e| there.is_none_or(|l| !l.contains(e)))
                    .count();
                if lost > 0 {
                    tracing::warn!(model = %m.name, lost, "the gateway lost replica(s); registering them again");
                    known.retain(|e| there.is_some_and(|l| l.contains(e)));
                    repairs.reregistered.insert(m.name.clone(), lost as u32);
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
            for e in gone {
                if let Err(err) = self.gateway.replica(false, &m.served_name, &e, None).await {
                    // Kept as registered: removed again next tick.
                    tracing::warn!("{err}");
                    now_known.insert(e);
                } else if stale.contains(&e) {
                    tracing::warn!(model = %m.name, endpoint = %e, "a registration no ready endpoint explains: removed");
                    *repairs.removed.entry(m.name.clone()).or_default() += 1;
                }
            }
            *known = now_known;
        }
        // A deleted policy's served name: its pods go with it (their
        // owner), so what was registered for it goes too.
        let Some(listed_served) = &self.listed_served else {
            return Ok(repairs);
        };
        let serving: BTreeSet<&str> = models.iter().map(|m| m.served_name.as_str()).collect();
        let deleted: Vec<String> = self
            .registered
            .keys()
            .filter(|n| !serving.contains(n.as_str()) && !listed_served.contains(*n))
            .cloned()
            .collect();
        for name in deleted {
            let mut gone = self.registered.remove(&name).unwrap_or_default();
            if let Some(registered) = lists.as_ref().and_then(|l| l.registered.get(&name)) {
                gone.extend(registered.iter().cloned());
            }
            let mut left = BTreeSet::new();
            for e in gone {
                if let Err(err) = self.gateway.replica(false, &name, &e, None).await {
                    tracing::warn!("{err}");
                    left.insert(e);
                }
            }
            if left.is_empty() {
                tracing::info!(served = %name, "ModelPolicy deleted: its replicas taken off the gateway");
            } else {
                self.registered.insert(name, left);
            }
        }
        Ok(repairs)
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
            if !self.still_leading() {
                return Err(lost());
            }
            self.kube.remember(policy, m).await?;
        }
        Ok(())
    }
}

/// The error when the lease was not renewed in time mid-write.
fn lost() -> KubeError {
    KubeError::LostLease
}

fn wall_now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
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
    /// Whether plans wait for an inventory this backend builds (from the
    /// nodes): until the first, a decision would have no plan, and
    /// without one every replica goes to a whole-GPU variant.
    pub fn plans_from_inventory(&self) -> bool {
        matches!(self, Backend::Kube(k) if k.from_nodes)
    }

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
    ) -> BTreeSet<String> {
        match self {
            Backend::Local(l) => {
                for c in changes {
                    l.scale_with_spares(&c.model, c.rec.replicas, c.spares);
                }
                BTreeSet::new()
            }
            Backend::Kube(k) => k.apply(changes, plan, before, now).await,
        }
    }

    /// Kubernetes: rolls out pod templates that changed while the counts
    /// did not, one Deployment per model at a time
    /// ([`KubeBackend::roll`]); a failure is logged and retried next
    /// tick. Local replicas have no template to roll.
    pub async fn roll(&mut self, models: &[Model], plan: Option<&Plan>) {
        if let Backend::Kube(k) = self
            && let Err(e) = k.roll(models, plan).await
        {
            tracing::error!("rolling out a changed pod template: {e}");
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
    /// replaced, replicas the gateway lost registered again, and
    /// registrations no replica owns removed (the local backend repairs
    /// towards its own count, so it reports no live count).
    /// Kubernetes: lease, the live counts and (on taking over) the
    /// memory left in the policies' status, drains, discovery. Both
    /// report what they repaired (`gpuscale_autoscaler_repairs_total`).
    pub async fn tick(&mut self, models: &[Model], now: Duration) -> Observed {
        match self {
            Backend::Local(l) => Observed {
                repairs: l.reconcile(models).await,
                ..Observed::default()
            },
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
    /// stay, and the lease is released for the next leader.
    pub async fn shutdown(self) {
        match self {
            Backend::Local(l) => l.shutdown().await,
            Backend::Kube(mut k) => k.release().await,
        }
    }
}

/// One policy's claim on the names clients reach models by.
#[derive(Debug, Clone)]
pub struct Claim<T> {
    /// The policy's name.
    pub policy: String,
    /// `(field, name)`: its served name first, then its adapters.
    pub names: Vec<(String, String)>,
    /// Its `creationTimestamp`.
    pub created: Option<T>,
    /// The model, where the policy is valid (an invalid one still holds
    /// its names).
    pub model: Option<Model>,
}

/// Gives each served name and LoRA adapter to one policy, since the
/// gateway routes by name and a second policy's replicas would take the
/// first one's requests. A name goes to the policy whose served name it
/// is before one that lists it as an adapter, then to the oldest
/// (`creationTimestamp`, set by the API server), then to the first by
/// name: the same answer whatever the controller saw before, so a restart
/// or a new leader keeps each name where it was. A policy is kept only
/// with all its names; names of a policy left out stay unserved until the
/// clash is fixed.
pub fn claim_served_names<T: Ord>(mut claims: Vec<Claim<T>>) -> Claimed {
    // Each policy claims its Service's name too, which turns `.` and
    // other characters into `-` (`llama.8b` and `llama-8b` both make
    // `gpuscale-llama-8b`): marked by a control character no served name
    // has.
    for c in &mut claims {
        let service = format!(
            "{SERVICE_CLAIM}{}",
            crate::kubernetes::service_name(&c.policy)
        );
        c.names.push(("metadata.name".to_string(), service));
    }
    // Lower wins: a served name before an adapter, then the oldest (a
    // timestamp before none), then the first by name.
    fn rank<'a, T>(c: &'a Claim<T>, field: &str) -> (bool, bool, Option<&'a T>, &'a str) {
        (
            field != "spec.servedName",
            c.created.is_none(),
            c.created.as_ref(),
            c.policy.as_str(),
        )
    }
    let mut owner: BTreeMap<&str, (usize, &str)> = BTreeMap::new();
    for (i, c) in claims.iter().enumerate() {
        for (field, n) in &c.names {
            match owner.get(n.as_str()) {
                Some(&(j, f)) if rank(&claims[j], f) <= rank(c, field) => {}
                _ => {
                    owner.insert(n.as_str(), (i, field.as_str()));
                }
            }
        }
    }
    let mut kept = Vec::new();
    let mut left_out = Vec::new();
    for (i, c) in claims.iter().enumerate() {
        let Some(m) = &c.model else { continue };
        let lost = c.names.iter().find_map(|(field, n)| {
            let (j, _) = owner[n.as_str()];
            (j != i).then(|| (field, n, &claims[j].policy))
        });
        match lost {
            Some((field, n, by)) => left_out.push((
                c.policy.clone(),
                match n.strip_prefix(SERVICE_CLAIM) {
                    Some(service) => format!(
                        "{field}: its Service `{service}` is ModelPolicy `{by}`'s (a Service name \
                         has only letters, digits and `-`); rename one of the two"
                    ),
                    None => format!(
                        "{field}: `{n}` is already served by ModelPolicy `{by}`; the gateway routes by name, so the two would share one model's requests"
                    ),
                },
            )),
            None => kept.push(m.clone()),
        }
    }
    kept.sort_by(|a, b| a.name.cmp(&b.name));
    Claimed { kept, left_out }
}

/// Marks a Service name among the names [`claim_served_names`] weighs
/// (no served name has a control character).
const SERVICE_CLAIM: &str = "\u{1}service:";

/// What [`claim_served_names`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The models kept, by name.
    pub kept: Vec<Model>,
    /// `(policy, why)` for each valid policy left out.
    pub left_out: Vec<(String, String)>,
}
