//! The Kubernetes actuator: what the controller's decisions become in a
//! cluster, through `kube`'s client.
//!
//! - per model × placement variant a Deployment (server-side apply, field
//!   manager `gpuscale`) whose pod requests the variant's device resource
//!   (`nvidia.com/mig-3g.40gb: 1`, `nvidia.com/gpu.shared: 1`, …) on nodes
//!   of its GPU model; replica counts through the `/scale` subresource;
//! - MIG reconfiguration by setting `nvidia.com/mig.config` on a node, only
//!   when nothing runs on the GPUs whose geometry changes;
//! - the `ModelPolicy` status subresource (current/desired replicas, the
//!   last decision and its sentence) and an `events.k8s.io/v1` Event per
//!   decision;
//! - leader election through a `coordination.k8s.io/v1` Lease;
//! - EndpointSlice discovery of ready replicas, for the gateway's pools;
//! - dry-run: every write is logged (method, path, body) instead of sent.
//!
//! The request bodies are built by pure functions ([`scale_patch`],
//! [`deployment`], [`mig_label_patch`], [`event`], [`status_patch`],
//! [`lease_step`]); [`Kube`] only sends them. Tested over a `tower_test`
//! mock API server that checks each request's method, path and body (no
//! API server can run where the tests run).

use std::collections::BTreeMap;
use std::time::Duration;

use gpuscale_packer::{Plan, Variant};
use gpuscale_policies::Model;
use gpuscale_policies::model::{Decision, ModelPolicy, ModelPolicyStatus, ScalingMemory};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde::{Deserialize, Serialize};

use crate::recommend::{Recommendation, clock};

/// The field manager and event reporter.
pub const MANAGER: &str = "gpuscale";
/// The node label the GPU Operator's mig-manager applies.
pub const MIG_CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// Label on everything gpuscale creates for a model.
pub const MODEL_LABEL: &str = "gpuscale.io/model";
/// Label naming the placement variant.
pub const VARIANT_LABEL: &str = "gpuscale.io/variant";

/// Settings of the Kubernetes backend (`spec.kubernetes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KubeSpec {
    /// Namespace of the Deployments, ModelPolicies, Events and Lease.
    pub namespace: String,
    /// The model-server image of every Deployment.
    pub image: String,
    /// The container port the model server listens on.
    pub port: u16,
    /// The Lease that elects the active controller.
    pub lease_name: String,
    /// How long a lease lasts without renewal.
    #[serde(with = "humantime_serde")]
    pub lease_duration: Duration,
    /// Namespace of the GPU Operator, where its MIG manager reads the
    /// mig-parted ConfigMap (`gpuscale-mig-parted-config`; point the
    /// ClusterPolicy's `migManager.config.name` at it).
    pub gpu_operator_namespace: String,
}

impl Default for KubeSpec {
    fn default() -> Self {
        KubeSpec {
            namespace: "default".into(),
            image: "vllm/vllm-openai:latest".into(),
            port: 8000,
            lease_name: "gpuscale-autoscaler".into(),
            lease_duration: Duration::from_secs(15),
            gpu_operator_namespace: "gpu-operator".into(),
        }
    }
}

/// Why a call to the API server failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The API server refused or could not be reached.
    #[error("kubernetes: {0}")]
    Api(#[from] kube::Error),
    /// A body could not be built.
    #[error("kubernetes: {0}")]
    Body(#[from] serde_json::Error),
}

fn micro(now: Duration) -> MicroTime {
    MicroTime(Timestamp::from_nanosecond(now.as_nanos() as i128).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// The `/scale` merge patch.
pub fn scale_patch(replicas: u32) -> serde_json::Value {
    serde_json::json!({"spec": {"replicas": replicas}})
}

/// The Deployment of one placement variant (applied server-side; its
/// replica count is left to the `/scale` subresource).
pub fn deployment(model: &Model, variant: &Variant, spec: &KubeSpec) -> Deployment {
    let labels = serde_json::json!({
        "app.kubernetes.io/name": model.name,
        "app.kubernetes.io/managed-by": MANAGER,
        MODEL_LABEL: model.name,
        VARIANT_LABEL: variant.name,
    });
    let limits: BTreeMap<&String, String> = variant
        .resources
        .iter()
        .map(|(k, v)| (k, v.to_string()))
        .collect();
    let mut template_metadata = serde_json::json!({"labels": labels});
    if !variant.annotations.is_empty() {
        // Fractional variants: HAMi's placement annotations.
        template_metadata["annotations"] = serde_json::json!(variant.annotations);
    }
    let value = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": variant.name,
            "namespace": spec.namespace,
            "labels": labels,
        },
        "spec": {
            "selector": {"matchLabels": {VARIANT_LABEL: variant.name}},
            "template": {
                "metadata": template_metadata,
                "spec": {
                    "nodeSelector": variant.node_selector,
                    "containers": [{
                        "name": "model-server",
                        "image": spec.image,
                        "args": ["--model", model.served_name, "--port", spec.port.to_string()],
                        "ports": [{"name": "http", "containerPort": spec.port}],
                        "resources": {"limits": limits},
                        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
                    }],
                },
            },
        },
    });
    serde_json::from_value(value).expect("a well-formed Deployment")
}

/// The name of the mig-parted ConfigMap gpuscale maintains.
pub const MIG_CONFIGMAP: &str = "gpuscale-mig-parted-config";

/// The mig-parted ConfigMap for a plan: every node's config under
/// `config.yaml`, as the GPU Operator's MIG manager reads it.
pub fn mig_configmap(plan: &Plan, namespace: &str) -> Result<ConfigMap, serde_json::Error> {
    let (config, _) = gpuscale_packer::emit::mig_parted(plan);
    let text = serde_yaml_ng::to_string(&config).map_err(serde::ser::Error::custom)?;
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": MIG_CONFIGMAP,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": MANAGER},
        },
        "data": {"config.yaml": text},
    }))
}

/// The node label patch that asks mig-manager for a mig-parted config.
pub fn mig_label_patch(config: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": {MIG_CONFIG_LABEL: config}}})
}

/// A node's MIG config may change now: none of its GPUs whose geometry
/// changes has a replica running (`busy`: GPU indices with replicas now;
/// `changing`: GPU indices the plan reconfigures).
pub fn may_reconfigure(busy: &[u32], changing: &[u32]) -> bool {
    changing.iter().all(|g| !busy.contains(g))
}

/// The Event recording a decision about a policy.
pub fn event(
    policy: &str,
    uid: Option<&str>,
    rec: &Recommendation,
    spec: &KubeSpec,
    identity: &str,
    now: Duration,
) -> Event {
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{policy}.")),
            namespace: Some(spec.namespace.clone()),
            ..ObjectMeta::default()
        },
        event_time: Some(micro(now)),
        action: Some("Scale".into()),
        reason: Some(format!("{:?}", rec.mode)),
        note: Some(rec.reason.chars().take(1024).collect()),
        type_: Some("Normal".into()),
        reporting_controller: Some(format!("gpuscale.io/{MANAGER}")),
        reporting_instance: Some(identity.to_string()),
        regarding: Some(ObjectReference {
            api_version: Some("gpuscale.io/v1alpha1".into()),
            kind: Some("ModelPolicy".into()),
            name: Some(policy.to_string()),
            namespace: Some(spec.namespace.clone()),
            uid: uid.map(str::to_string),
            ..ObjectReference::default()
        }),
        ..Event::default()
    }
}

/// The status merge patch after a decision (with the recommender's
/// memory, when given).
pub fn status_patch(
    current: u32,
    rec: &Recommendation,
    now: Duration,
    memory: Option<&ScalingMemory>,
) -> serde_json::Value {
    let status = ModelPolicyStatus {
        current_replicas: current,
        desired_replicas: rec.replicas,
        last_decision: Some(Decision {
            replicas: rec.replicas,
            reason: rec.reason.clone(),
            time: Timestamp::from_second(now.as_secs() as i64)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| clock(now)),
        }),
        observed_generation: None,
        scaling_memory: memory.cloned(),
    };
    serde_json::json!({"status": status})
}

/// The status merge patch that persists the recommender's memory alone.
pub fn memory_patch(memory: &ScalingMemory) -> serde_json::Value {
    serde_json::json!({"status": {"scalingMemory": memory}})
}

/// A model's replica count as its Deployments declare it: per variant
/// Deployment, its name and `spec.replicas` (what its `/scale`
/// subresource serves as `spec.replicas`; absent means 1, the API
/// server's default).
pub fn declared_replicas(deployments: &[Deployment]) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = deployments
        .iter()
        .filter_map(|d| {
            let name = d.metadata.name.clone()?;
            let n = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            Some((name, n.max(0) as u32))
        })
        .collect();
    out.sort();
    out
}

/// What to do with the Lease.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseStep {
    /// No lease yet: create this one (we lead).
    Create(Lease),
    /// Ours, or expired: replace with this one (we lead).
    Replace(Lease),
    /// Someone else holds it and it has not expired.
    Follow {
        /// The holder.
        holder: String,
    },
}

/// Leader election, pure: given the lease as read (if any), who we are
/// and the time, what to write.
pub fn lease_step(
    existing: Option<&Lease>,
    identity: &str,
    spec: &KubeSpec,
    now: Duration,
) -> LeaseStep {
    let ours = |transitions: i32, acquired: MicroTime| Lease {
        metadata: ObjectMeta {
            name: Some(spec.lease_name.clone()),
            namespace: Some(spec.namespace.clone()),
            resource_version: existing.and_then(|l| l.metadata.resource_version.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(spec.lease_duration.as_secs() as i32),
            acquire_time: Some(acquired),
            renew_time: Some(micro(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    };
    let Some(lease) = existing else {
        return LeaseStep::Create(ours(0, micro(now)));
    };
    let s = lease.spec.clone().unwrap_or_default();
    let transitions = s.lease_transitions.unwrap_or(0);
    match s.holder_identity.as_deref() {
        Some(h) if h == identity => LeaseStep::Replace(ours(
            transitions,
            s.acquire_time.unwrap_or_else(|| micro(now)),
        )),
        Some(h) => {
            let renewed = s
                .renew_time
                .map(|t| Duration::from_nanos(t.0.as_nanosecond().max(0) as u64))
                .unwrap_or_default();
            let ttl = Duration::from_secs(s.lease_duration_seconds.unwrap_or(0).max(0) as u64);
            if now < renewed + ttl {
                LeaseStep::Follow {
                    holder: h.to_string(),
                }
            } else {
                LeaseStep::Replace(ours(transitions + 1, micro(now)))
            }
        }
        None => LeaseStep::Replace(ours(transitions + 1, micro(now))),
    }
}

/// Ready `http://ip:port` endpoints of a model, from its EndpointSlices.
pub fn ready_endpoints(slices: &[EndpointSlice]) -> Vec<String> {
    let mut out = Vec::new();
    for s in slices {
        let port = s
            .ports
            .as_ref()
            .and_then(|p| p.first())
            .and_then(|p| p.port)
            .unwrap_or(80);
        for e in &s.endpoints {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false);
            if ready {
                for a in &e.addresses {
                    out.push(format!("http://{a}:{port}"));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A write the backend makes (what dry-run logs).
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// HTTP method.
    pub method: &'static str,
    /// API path.
    pub path: String,
    /// Body.
    pub body: serde_json::Value,
}

/// The client side: sends what the builders make, or in dry-run mode logs
/// it and returns the writes it would have made.
pub struct Kube {
    client: kube::Client,
    spec: KubeSpec,
    identity: String,
    dry_run: bool,
}

impl Kube {
    /// A backend over `client`.
    pub fn new(client: kube::Client, spec: KubeSpec, identity: String, dry_run: bool) -> Self {
        Kube {
            client,
            spec,
            identity,
            dry_run,
        }
    }

    fn ns(&self) -> &str {
        &self.spec.namespace
    }

    fn dry(&self, w: Write) -> Option<Write> {
        if self.dry_run {
            tracing::info!(method = w.method, path = %w.path, body = %w.body, "dry run: not sent");
            Some(w)
        } else {
            None
        }
    }

    /// The ModelPolicies in the namespace.
    pub async fn policies(&self) -> Result<Vec<ModelPolicy>, KubeError> {
        let api: Api<ModelPolicy> = Api::namespaced(self.client.clone(), self.ns());
        Ok(api.list(&ListParams::default()).await?.items)
    }

    /// A model's variant Deployments and their declared replica counts
    /// (one list call, by the model label): the live count the controller
    /// starts from and compares with every tick.
    pub async fn deployments_of(&self, model: &str) -> Result<Vec<(String, u32)>, KubeError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        let list = api
            .list(&ListParams::default().labels(&format!("{MODEL_LABEL}={model}")))
            .await?;
        Ok(declared_replicas(&list.items))
    }

    /// The recommender's memory a previous controller left in a policy's
    /// status (`None`: no policy object, or nothing remembered).
    pub async fn remembered(&self, policy: &str) -> Result<Option<ScalingMemory>, KubeError> {
        let api: Api<ModelPolicy> = Api::namespaced(self.client.clone(), self.ns());
        Ok(api
            .get_opt(policy)
            .await?
            .and_then(|p| p.status)
            .and_then(|s| s.scaling_memory))
    }

    /// Writes the recommender's memory into a policy's status.
    pub async fn remember(
        &self,
        policy: &str,
        memory: &ScalingMemory,
    ) -> Result<Option<Write>, KubeError> {
        let body = memory_patch(memory);
        if let Some(w) = self.dry(Write {
            method: "PATCH",
            path: format!(
                "/apis/gpuscale.io/v1alpha1/namespaces/{}/modelpolicies/{policy}/status",
                self.ns()
            ),
            body: body.clone(),
        }) {
            return Ok(Some(w));
        }
        let api: Api<ModelPolicy> = Api::namespaced(self.client.clone(), self.ns());
        api.patch_status(policy, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
        Ok(None)
    }

    /// Sets a Deployment's replicas through `/scale`.
    pub async fn scale(&self, name: &str, replicas: u32) -> Result<Option<Write>, KubeError> {
        let body = scale_patch(replicas);
        if let Some(w) = self.dry(Write {
            method: "PATCH",
            path: format!(
                "/apis/apps/v1/namespaces/{}/deployments/{name}/scale",
                self.ns()
            ),
            body: body.clone(),
        }) {
            return Ok(Some(w));
        }
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        api.patch_scale(name, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
        Ok(None)
    }

    /// Applies a variant's Deployment (server-side apply).
    pub async fn apply_deployment(
        &self,
        model: &Model,
        variant: &Variant,
    ) -> Result<Option<Write>, KubeError> {
        let d = deployment(model, variant, &self.spec);
        if let Some(w) = self.dry(Write {
            method: "PATCH",
            path: format!(
                "/apis/apps/v1/namespaces/{}/deployments/{}?fieldManager={MANAGER}&force=true",
                self.ns(),
                variant.name
            ),
            body: serde_json::to_value(&d)?,
        }) {
            return Ok(Some(w));
        }
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        api.patch(
            &variant.name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&d),
        )
        .await?;
        Ok(None)
    }

    /// Applies the mig-parted ConfigMap of a plan (server-side apply).
    pub async fn apply_mig_configmap(&self, plan: &Plan) -> Result<Option<Write>, KubeError> {
        let ns = &self.spec.gpu_operator_namespace;
        let cm = mig_configmap(plan, ns)?;
        if let Some(w) = self.dry(Write {
            method: "PATCH",
            path: format!(
                "/api/v1/namespaces/{ns}/configmaps/{MIG_CONFIGMAP}?fieldManager={MANAGER}&force=true"
            ),
            body: serde_json::to_value(&cm)?,
        }) {
            return Ok(Some(w));
        }
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        api.patch(
            MIG_CONFIGMAP,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await?;
        Ok(None)
    }

    /// A merge patch of a node (or, in dry-run mode, the write it would be).
    async fn patch_node(
        &self,
        node: &str,
        body: serde_json::Value,
    ) -> Result<Option<Write>, KubeError> {
        if let Some(w) = self.dry(Write {
            method: "PATCH",
            path: format!("/api/v1/nodes/{node}"),
            body: body.clone(),
        }) {
            return Ok(Some(w));
        }
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch(node, &PatchParams::default(), &Patch::Merge(&body))
            .await?;
        Ok(None)
    }

    /// Marks a node unschedulable (`cordon = true`) or schedulable again.
    pub async fn cordon(&self, node: &str, cordon: bool) -> Result<Option<Write>, KubeError> {
        self.patch_node(node, serde_json::json!({"spec": {"unschedulable": cordon}}))
            .await
    }

    /// gpuscale's pods on a node that hold MIG devices.
    pub async fn mig_pods_on(&self, node: &str) -> Result<Vec<String>, KubeError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let pods = api
            .list(
                &ListParams::default()
                    .labels(&format!("app.kubernetes.io/managed-by={MANAGER}"))
                    .fields(&format!("spec.nodeName={node}")),
            )
            .await?;
        Ok(pods
            .items
            .into_iter()
            .filter(|p| {
                p.spec.as_ref().is_some_and(|s| {
                    s.containers.iter().any(|c| {
                        c.resources
                            .as_ref()
                            .and_then(|r| r.limits.as_ref())
                            .is_some_and(|l| l.keys().any(|k| k.starts_with("nvidia.com/mig-")))
                    })
                })
            })
            .filter_map(|p| p.metadata.name)
            .collect())
    }

    /// Evicts a pod (the Eviction API: PodDisruptionBudgets hold).
    pub async fn evict(&self, pod: &str) -> Result<Option<Write>, KubeError> {
        if let Some(w) = self.dry(Write {
            method: "POST",
            path: format!("/api/v1/namespaces/{}/pods/{pod}/eviction", self.ns()),
            body: serde_json::json!({"metadata": {"name": pod}}),
        }) {
            return Ok(Some(w));
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        api.evict(pod, &kube::api::EvictParams::default()).await?;
        Ok(None)
    }

    /// Asks mig-manager for a node's new MIG config.
    pub async fn label_node(&self, node: &str, config: &str) -> Result<Option<Write>, KubeError> {
        self.patch_node(node, mig_label_patch(config)).await
    }

    /// Records a decision: an Event and the policy's status.
    pub async fn record(
        &self,
        policy: &str,
        uid: Option<&str>,
        current: u32,
        rec: &Recommendation,
        now: Duration,
        memory: Option<&ScalingMemory>,
    ) -> Result<Vec<Write>, KubeError> {
        let ev = event(policy, uid, rec, &self.spec, &self.identity, now);
        let status = status_patch(current, rec, now, memory);
        let writes = vec![
            Write {
                method: "POST",
                path: format!("/apis/events.k8s.io/v1/namespaces/{}/events", self.ns()),
                body: serde_json::to_value(&ev)?,
            },
            Write {
                method: "PATCH",
                path: format!(
                    "/apis/gpuscale.io/v1alpha1/namespaces/{}/modelpolicies/{policy}/status",
                    self.ns()
                ),
                body: status.clone(),
            },
        ];
        if self.dry_run {
            for w in &writes {
                tracing::info!(method = w.method, path = %w.path, body = %w.body, "dry run: not sent");
            }
            return Ok(writes);
        }
        let events: Api<Event> = Api::namespaced(self.client.clone(), self.ns());
        events.create(&PostParams::default(), &ev).await?;
        let policies: Api<ModelPolicy> = Api::namespaced(self.client.clone(), self.ns());
        policies
            .patch_status(policy, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        Ok(Vec::new())
    }

    /// One leader-election round: `true` when this instance leads.
    pub async fn lead(&self, now: Duration) -> Result<bool, KubeError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), self.ns());
        let existing = api.get_opt(&self.spec.lease_name).await?;
        match lease_step(existing.as_ref(), &self.identity, &self.spec, now) {
            LeaseStep::Follow { holder } => {
                tracing::debug!(%holder, "following");
                Ok(false)
            }
            LeaseStep::Create(lease) => {
                if self.dry_run {
                    return Ok(true);
                }
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => Ok(true),
                    // Someone created it first.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            LeaseStep::Replace(lease) => {
                if self.dry_run {
                    return Ok(true);
                }
                match api
                    .replace(&self.spec.lease_name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(_) => Ok(true),
                    // Someone renewed or took it between our read and write.
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Ready endpoints of a model's pods.
    pub async fn endpoints(&self, model: &str) -> Result<Vec<String>, KubeError> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), self.ns());
        let slices = api
            .list(&ListParams::default().labels(&format!("{MODEL_LABEL}={model}")))
            .await?;
        Ok(ready_endpoints(&slices.items))
    }
}
