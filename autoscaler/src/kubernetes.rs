//! The Kubernetes actuator: what the controller's decisions become in a
//! cluster, through `kube`'s client.
//!
//! - per model × placement variant a Deployment (server-side apply, field
//!   manager `gpuscale`) whose pod requests the variant's device resource
//!   (`nvidia.com/mig-3g.40gb: 1`, `nvidia.com/gpu.shared: 1`, …) on nodes
//!   of its GPU model; replica counts through the `/scale` subresource; an
//!   object of the same name that gpuscale did not create is never
//!   adopted ([`owned_by_us`]);
//! - per model a headless Service whose EndpointSlices list the ready
//!   replicas, for the gateway's pools ([`service`], [`ready_endpoints`]);
//! - MIG reconfiguration as a hand-off recorded on the node ([`Handoff`]):
//!   cordon with the reason in annotations, evict gpuscale's GPU pods,
//!   set `nvidia.com/mig.config`, wait for the MIG manager's
//!   `nvidia.com/mig.config.state`, uncordon;
//! - the `ModelPolicy` status subresource (current/desired replicas, the
//!   last decision and its sentence) and an `events.k8s.io/v1` Event per
//!   decision, rate-limited per object ([`EventBudget`]);
//! - leader election through a `coordination.k8s.io/v1` Lease (the rules
//!   are in [`crate::election`]);
//! - dry-run: every write is logged (method, path, body) instead of sent.
//!
//! Every call has a deadline (`spec.kubernetes.requestTimeout`), so that
//! a call the client retries (429, 5xx) cannot stall the loop past the
//! lease. The request bodies are built by pure functions; [`Kube`] only
//! sends them. Tested over a `tower_test` mock API server that checks
//! each request's method, path and body (no API server can run where the
//! tests run).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use gpuscale_packer::{Plan, Variant};
use gpuscale_policies::Model;
use gpuscale_policies::model::{
    Decision, ModelPolicy, ModelPolicyStatus, PolicyCondition, ScalingMemory,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference, Pod, Service, Toleration};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
    Preconditions,
};
use serde::{Deserialize, Serialize};

use crate::handover::Held;
use crate::recommend::{Recommendation, clock};

/// The field manager and event reporter.
pub const MANAGER: &str = "gpuscale";
/// The node label the GPU Operator's mig-manager applies.
pub const MIG_CONFIG_LABEL: &str = "nvidia.com/mig.config";
/// Label on everything gpuscale creates for a model.
pub const MODEL_LABEL: &str = gpuscale_packer::emit::MODEL_LABEL;

/// Objects per page when the controller lists nodes, or the pods bound to
/// nodes for its watch (kubectl's default chunk size).
pub const PODS_PAGE: u32 = 500;

/// The pods the inventory reads: bound to a node and not finished.
pub const POD_FIELDS: &str = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// A node without its managed fields, the images it has pulled and the
/// volumes attached to it: on a GPU node the images alone (each CUDA and
/// model-server image under every tag it was pulled by) are often most of
/// the object, and nothing gpuscale decides reads them.
pub fn without_bulk(mut node: Node) -> Node {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
    node
}
/// Label naming the placement variant.
pub const VARIANT_LABEL: &str = gpuscale_packer::emit::VARIANT_LABEL;

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
    #[serde(with = "gpuscale_policies::duration")]
    pub lease_duration: Duration,
    /// How long the leader goes on acting after its last renewal of the
    /// lease (shorter than `leaseDuration`, client-go's `RenewDeadline`).
    #[serde(with = "gpuscale_policies::duration")]
    pub renew_deadline: Duration,
    /// How often the lease is renewed or tried (client-go's
    /// `RetryPeriod`).
    #[serde(with = "gpuscale_policies::duration")]
    pub retry_period: Duration,
    /// The deadline of every API call, retries included.
    #[serde(with = "gpuscale_policies::duration")]
    pub request_timeout: Duration,
    /// Namespace of the GPU Operator, where its MIG manager reads the
    /// mig-parted ConfigMap (`gpuscale-mig-parted-config`; point the
    /// ClusterPolicy's `migManager.config.name` at it).
    pub gpu_operator_namespace: String,
    /// Pack replicas with the packer (one Deployment per placement
    /// variant, MIG geometries set on nodes). `false`: one Deployment per
    /// model, named after its policy (applied with the fields gpuscale
    /// manages, scaled through `/scale`), no MIG change and no Node read
    /// (sidecar mode: the Deployment you write, with its sidecar).
    pub pack: bool,
    /// A Secret whose key `token` holds a Hugging Face token, for gated
    /// models: mounted read-only as a file and named by `HF_TOKEN_PATH`
    /// (never an environment literal).
    pub hf_token_secret: Option<String>,
    /// A PersistentVolumeClaim (ReadWriteMany, to be shared) for the
    /// model servers' Hugging Face cache, so a new replica loads weights
    /// another has downloaded instead of downloading them again.
    pub model_cache_claim: Option<String>,
    /// Size of the memory-backed `/dev/shm` (tensor-parallel workers talk
    /// through it; a container's default is 64 MiB).
    pub shm_size: String,
    /// How long a model server may take to download and load before
    /// Kubernetes restarts it (its startup probe: `/health` every 10 s).
    #[serde(with = "gpuscale_policies::duration")]
    pub startup_timeout: Duration,
    /// The model server's user and group (non-root; vLLM runs as any
    /// user given a writable `HOME`, which the pod gives it under
    /// `/cache`).
    pub run_as_user: i64,
    /// The GPU nodes gpuscale manages, as equality terms
    /// `key=value[,key=value…]`: the label selector the inventory lists
    /// nodes by, and labels every model-server pod it creates selects.
    /// A node outside it is never planned on, cordoned or reconfigured.
    /// The default, `nvidia.com/gpu.present=true,gpuscale.io/managed=true`,
    /// hands a GPU node over only once it is labelled
    /// `gpuscale.io/managed=true`.
    pub node_selector: String,
    /// Host CPU and memory of a model-server pod.
    pub server_resources: ServerResources,
    /// Taints of the GPU nodes every model-server pod tolerates. GPU node
    /// pools are commonly tainted `nvidia.com/gpu:NoSchedule` (GKE taints
    /// them so; many operators do) to keep other pods off, and not every
    /// API server runs the `ExtendedResourceToleration` admission plugin
    /// that would add the toleration to pods asking for `nvidia.com/gpu`.
    /// The default tolerates that taint; `[]` tolerates none.
    pub tolerations: Vec<Toleration>,
}

/// The default [`KubeSpec::tolerations`]: the `nvidia.com/gpu` taint, any
/// value, effect `NoSchedule` (the toleration the GPU Operator's own
/// DaemonSets carry).
pub fn gpu_tolerations() -> Vec<Toleration> {
    vec![Toleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }]
}

/// What is wrong with a toleration, as the API server's validation says
/// it (`validateTolerations`): `Exists` takes no value; an empty key
/// needs `Exists`; a `tolerationSeconds` only with `NoExecute`. `Err`:
/// (field, message).
pub fn check_toleration(t: &Toleration) -> Result<(), (&'static str, String)> {
    let operator = t.operator.as_deref().unwrap_or("Equal");
    if !matches!(operator, "Exists" | "Equal") {
        return Err(("operator", format!("`{operator}`: must be Exists or Equal")));
    }
    let effect = t.effect.as_deref().unwrap_or("");
    if !matches!(effect, "" | "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err((
            "effect",
            format!(
                "`{effect}`: must be NoSchedule, PreferNoSchedule or NoExecute (or empty: all)"
            ),
        ));
    }
    let key = t.key.as_deref().unwrap_or("");
    if key.is_empty() && operator != "Exists" {
        return Err((
            "operator",
            "an empty key matches every taint only with Exists".into(),
        ));
    }
    if operator == "Exists" && !t.value.as_deref().unwrap_or("").is_empty() {
        return Err(("value", "must be empty when operator is Exists".into()));
    }
    if t.toleration_seconds.is_some() && effect != "NoExecute" {
        return Err(("tolerationSeconds", "only with effect NoExecute".into()));
    }
    Ok(())
}

/// Host CPU and memory of a model-server pod, per GPU it holds (a MIG
/// slice or a share counts as one; a tensor-parallel replica over `k`
/// GPUs gets `k` times as much), as requests and limits: vLLM holds tens
/// of GiB of host memory while it loads, and a pod without requests is
/// BestEffort, the first evicted under memory pressure and refused
/// where a compute ResourceQuota applies. No CPU limit unless set above
/// the request (the default limit is twice it).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServerResources {
    /// CPU cores requested per GPU.
    pub cpu: f64,
    /// CPU cores at most per GPU.
    pub cpu_limit: f64,
    /// Memory requested per GPU, GiB.
    pub memory_gib: f64,
    /// Memory at most per GPU, GiB.
    pub memory_limit_gib: f64,
}

impl Default for ServerResources {
    fn default() -> Self {
        ServerResources {
            cpu: 4.0,
            cpu_limit: 8.0,
            memory_gib: 16.0,
            memory_limit_gib: 32.0,
        }
    }
}

impl ServerResources {
    /// `(requests, limits)` for a pod holding `gpus` GPUs, as Kubernetes
    /// quantities (`4`, `2500m`; `16Gi`, `12288Mi`).
    pub fn quantities(&self, gpus: u32) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
        let k = f64::from(gpus.max(1));
        let cpu = |c: f64| {
            let m = (c * k * 1000.0).round() as u64;
            if m.is_multiple_of(1000) {
                (m / 1000).to_string()
            } else {
                format!("{m}m")
            }
        };
        let memory = |g: f64| {
            let mib = (g * k * 1024.0).round() as u64;
            if mib.is_multiple_of(1024) {
                format!("{}Gi", mib / 1024)
            } else {
                format!("{mib}Mi")
            }
        };
        (
            BTreeMap::from([
                ("cpu".to_string(), cpu(self.cpu)),
                ("memory".to_string(), memory(self.memory_gib)),
            ]),
            BTreeMap::from([
                ("cpu".to_string(), cpu(self.cpu_limit)),
                ("memory".to_string(), memory(self.memory_limit_gib)),
            ]),
        )
    }
}

/// The default [`KubeSpec::node_selector`].
pub const MANAGED_NODES: &str = "nvidia.com/gpu.present=true,gpuscale.io/managed=true";

impl KubeSpec {
    /// This controller's name on the hand-offs it starts
    /// ([`HANDOFF_BY`]): its namespace and lease.
    pub fn handoff_owner(&self) -> String {
        format!("{}/{}", self.namespace, self.lease_name)
    }

    /// [`KubeSpec::node_selector`]'s terms as labels; `Err` names the
    /// first term that is not `key=value` (set-based and `!=` terms
    /// cannot be a pod's node selector).
    pub fn pool_labels(&self) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        for term in self.node_selector.split(',').map(str::trim) {
            let ok = term
                .split_once('=')
                .filter(|(k, v)| {
                    !k.is_empty() && !k.ends_with('!') && !v.starts_with('=') && !v.contains('=')
                })
                .filter(|(k, v)| {
                    !k.contains(char::is_whitespace) && !v.contains(char::is_whitespace)
                });
            match ok {
                Some((k, v)) => {
                    out.insert(k.to_string(), v.to_string());
                }
                None => return Err(format!("`{term}` is not `key=value`")),
            }
        }
        Ok(out)
    }
}

impl Default for KubeSpec {
    fn default() -> Self {
        KubeSpec {
            namespace: "default".into(),
            image: "vllm/vllm-openai:latest".into(),
            port: 8000,
            lease_name: "gpuscale-autoscaler".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            request_timeout: Duration::from_secs(4),
            gpu_operator_namespace: "gpu-operator".into(),
            pack: true,
            hf_token_secret: None,
            model_cache_claim: None,
            shm_size: "2Gi".into(),
            startup_timeout: Duration::from_secs(15 * 60),
            run_as_user: 65532,
            node_selector: MANAGED_NODES.into(),
            server_resources: ServerResources::default(),
            tolerations: gpu_tolerations(),
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
    /// The lease was not renewed within the renew deadline: this process
    /// stopped writing, as another may lead by now.
    #[error("kubernetes: the lease was not renewed in time; no longer the leader")]
    LostLease,
    /// An object of the name gpuscale would write exists and was not
    /// created by gpuscale: it is left alone.
    #[error(
        "kubernetes: {kind} `{name}` exists and was not created by gpuscale; it is left alone (rename it or the ModelPolicy)"
    )]
    NotOurs {
        /// Its kind.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The call did not finish within `spec.kubernetes.requestTimeout`.
    #[error("kubernetes: {what}: no answer within {after:?}")]
    Timeout {
        /// The call.
        what: String,
        /// The deadline.
        after: Duration,
    },
}

impl KubeError {
    /// The API server's status code, when it answered with one.
    pub fn code(&self) -> Option<u16> {
        match self {
            KubeError::Api(kube::Error::Api(e)) => Some(e.code),
            _ => None,
        }
    }

    /// Whether waiting may help: the API server could not be reached or
    /// did not answer in time, or answered 5xx or 429. A refusal (401,
    /// 403, 404: RBAC, no CRD), a body that does not decode, a bad
    /// kubeconfig or a lost lease is final, and retrying it only hides it.
    pub fn transient(&self) -> bool {
        match self {
            KubeError::Api(kube::Error::Api(e)) => e.code >= 500 || e.code == 429,
            KubeError::Api(
                kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_),
            ) => true,
            KubeError::Timeout { .. } => true,
            _ => false,
        }
    }
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
    // The plan's pod labels (HAMi's webhook opt-out) beside gpuscale's.
    let mut pod_labels = labels.clone();
    for (k, v) in &variant.labels {
        pod_labels[k] = serde_json::json!(v);
    }
    let mut template_metadata = serde_json::json!({"labels": pod_labels});
    if !variant.annotations.is_empty() {
        // Fractional variants: HAMi's placement annotations.
        template_metadata["annotations"] = serde_json::json!(variant.annotations);
    }
    let mut metadata = serde_json::json!({
        "name": variant.name,
        "namespace": spec.namespace,
        "labels": labels,
    });
    if variant.spares > 0 {
        // Of its replicas, how many are spares: the live count read back
        // leaves them out ([`Owned::spares`]). Applied without it, the
        // annotation goes (server-side apply drops a field its manager
        // no longer sends).
        metadata["annotations"] = serde_json::json!({SPARES: variant.spares.to_string()});
    }
    let mut value = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": {VARIANT_LABEL: variant.name}},
            // Past the startup probe's budget, and five minutes more: a
            // rollout is stalled only once a pod could no longer be
            // starting (Kubernetes' default, 10 minutes, is less than the
            // 15 a large model may take to load, and a healthy slow start
            // would read as stalled, releasing the next variant's roll).
            "progressDeadlineSeconds": spec.startup_timeout.as_secs() + 300,
            "template": {
                "metadata": template_metadata,
                "spec": pod_spec(model, variant, spec),
            },
        },
    });
    // One old pod out before a new one starts where the packer sized the
    // devices exactly (`emit::rollout`); without packing (sidecar mode)
    // the default rolling update may surge onto any free GPU.
    if spec.pack {
        value["spec"]["strategy"] = gpuscale_packer::emit::rollout();
    }
    let mut d: Deployment = serde_json::from_value(value).expect("a well-formed Deployment");
    let digest = template_hash(&serde_json::to_value(&d.spec).unwrap_or_default());
    d.metadata
        .annotations
        .get_or_insert_default()
        .insert(TEMPLATE.to_string(), digest);
    d
}

/// The digest variant `variant`'s Deployment is applied with now
/// ([`template_hash`] of [`deployment`]'s spec).
pub fn template_of(model: &Model, variant: &Variant, spec: &KubeSpec) -> String {
    let d = deployment(model, variant, spec);
    d.metadata
        .annotations
        .and_then(|mut a| a.remove(TEMPLATE))
        .unwrap_or_default()
}

/// Annotation on a variant Deployment: [`template_hash`] of the spec it
/// was applied with. The controller compares it with what it would apply
/// now, every tick, and rolls a changed one out ([`Owned::template`]).
pub const TEMPLATE: &str = "gpuscale.io/template";

/// A digest of a Deployment's spec (xxh3 of its JSON, in hex) without its
/// pods' annotations: those are HAMi's placement hints, read when a pod is
/// scheduled, and a re-plan for another model can change them (the GPUs
/// pinned beside a variant's); they reach the pods at the model's next
/// change, never by a restart of their own. Everything else (image,
/// arguments, resources, selectors, strategy) comes from the policy, the
/// controller's settings and the variant's name.
pub fn template_hash(spec: &serde_json::Value) -> String {
    let mut spec = spec.clone();
    if let Some(m) = spec
        .get_mut("template")
        .and_then(|t| t.get_mut("metadata"))
        .and_then(serde_json::Value::as_object_mut)
    {
        m.remove("annotations");
    }
    format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(spec.to_string().as_bytes())
    )
}

/// Where the Hugging Face token file is mounted.
pub const HF_TOKEN_DIR: &str = "/var/run/secrets/huggingface";
/// The model server's writable home: every cache (Hugging Face, vLLM,
/// Triton, torch) under it, on a read-only root filesystem.
pub const CACHE_DIR: &str = "/cache";
/// Where the Hugging Face cache lives (`HF_HOME`), and where
/// `modelCacheClaim` is mounted.
pub const HF_HOME: &str = "/cache/huggingface";
/// The startup probe's period.
const STARTUP_PERIOD_S: u64 = 10;

/// The model server's arguments: the model and port, and what the plan
/// says of its device ([`Variant::tensor_parallel`],
/// [`Variant::memory_fraction`]) in vLLM's flags.
pub fn server_args(model: &Model, variant: &Variant, spec: &KubeSpec) -> Vec<String> {
    let mut args = vec![
        "--model".to_string(),
        model.served_name.clone(),
        "--port".to_string(),
        spec.port.to_string(),
    ];
    if variant.tensor_parallel > 1 {
        args.push("--tensor-parallel-size".into());
        args.push(variant.tensor_parallel.to_string());
    }
    if let Some(f) = variant.memory_fraction {
        args.push("--gpu-memory-utilization".into());
        args.push(format!("{f:.3}"));
    }
    args.extend(model.server_args.iter().cloned());
    args
}

/// The model server's pod, as `deploy/overlays` writes one by hand:
/// non-root (`runAsUser`) on a read-only root filesystem with its caches
/// under `/cache` and scratch in `/tmp`, no privilege escalation, every
/// capability dropped, the runtime's seccomp profile, no service-account
/// token and no service links; a memory-backed `/dev/shm` (`shmSize`);
/// probes on `/health` (a startup probe allowing `startupTimeout` to
/// download and load, then liveness and readiness); a 20 s `preStop` so
/// endpoints are removed before the server stops; the Hugging Face token
/// as a file (`hfTokenSecret`) and a shared cache (`modelCacheClaim`)
/// when configured.
fn pod_spec(model: &Model, variant: &Variant, spec: &KubeSpec) -> serde_json::Value {
    // The device the plan gave it, and host CPU and memory per GPU held.
    let (requests, mut limits) = spec.server_resources.quantities(variant.tensor_parallel);
    limits.extend(
        variant
            .resources
            .iter()
            .map(|(k, v)| (k.clone(), v.to_string())),
    );
    let uid = spec.run_as_user;
    let startup_failures = spec
        .startup_timeout
        .as_secs()
        .div_ceil(STARTUP_PERIOD_S)
        .max(1);
    let health = serde_json::json!({"path": "/health", "port": "http"});
    // Room for the weights' download (the Hugging Face cache, unless a
    // claim holds it) and vLLM's, Triton's and torch's caches.
    let cache_gib = (model.memory_gib * 1.25).ceil().max(40.0) as u64;
    let mut volumes = vec![
        serde_json::json!({"name": "cache", "emptyDir": {"sizeLimit": format!("{cache_gib}Gi")}}),
        serde_json::json!({"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}}),
    ];
    let mut mounts = vec![
        serde_json::json!({"name": "cache", "mountPath": CACHE_DIR}),
        serde_json::json!({"name": "tmp", "mountPath": "/tmp"}),
    ];
    // Under MPS the device plugin mounts the MPS daemon's `/dev/shm`,
    // which a volume of the pod's own would hide; an MPS replica is never
    // tensor-parallel, so it needs no larger one.
    let mps = variant
        .node_selector
        .get(gpuscale_packer::emit::DEVICE_PLUGIN_CONFIG_LABEL)
        .is_some_and(|c| c.starts_with("mps-"));
    if !mps {
        volumes.push(serde_json::json!({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.shm_size}}));
        mounts.push(serde_json::json!({"name": "shm", "mountPath": "/dev/shm"}));
    }
    let mut env = vec![
        serde_json::json!({"name": "HOME", "value": CACHE_DIR}),
        serde_json::json!({"name": "USER", "value": "vllm"}),
        serde_json::json!({"name": "HF_HOME", "value": HF_HOME}),
        serde_json::json!({"name": "VLLM_NO_USAGE_STATS", "value": "1"}),
    ];
    if let Some(secret) = &spec.hf_token_secret {
        volumes.push(serde_json::json!({
            "name": "hf-token",
            "secret": {"secretName": secret, "items": [{"key": "token", "path": "token"}]},
        }));
        mounts.push(
            serde_json::json!({"name": "hf-token", "mountPath": HF_TOKEN_DIR, "readOnly": true}),
        );
        env.push(
            serde_json::json!({"name": "HF_TOKEN_PATH", "value": format!("{HF_TOKEN_DIR}/token")}),
        );
    }
    if let Some(claim) = &spec.model_cache_claim {
        volumes.push(serde_json::json!({
            "name": "model-cache",
            "persistentVolumeClaim": {"claimName": claim},
        }));
        mounts.push(serde_json::json!({"name": "model-cache", "mountPath": HF_HOME}));
    }
    // The managed pool's labels beside the variant's own (product,
    // device-plugin config): a replica never lands on a GPU node
    // gpuscale does not manage.
    let mut node_selector = spec.pool_labels().unwrap_or_default();
    node_selector.extend(variant.node_selector.clone());
    let mut pod = serde_json::json!({
        "nodeSelector": node_selector,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": 90,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            // A shared cache claim's files keep their owner; only a root
            // that is not the group's is changed, not every file at
            // every start.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": "model-server",
            "image": spec.image,
            "imagePullPolicy": "IfNotPresent",
            "args": server_args(model, variant, spec),
            "env": env,
            "ports": [{"name": "http", "containerPort": spec.port}],
            "startupProbe": {"httpGet": health, "periodSeconds": STARTUP_PERIOD_S, "failureThreshold": startup_failures},
            "livenessProbe": {"httpGet": health, "periodSeconds": 10, "timeoutSeconds": 5, "failureThreshold": 3},
            "readinessProbe": {"httpGet": health},
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "20"]}}},
            "resources": {"requests": requests, "limits": limits},
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": uid,
                "runAsGroup": uid,
                "readOnlyRootFilesystem": true,
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
    });
    if let Some(affinity) = gpuscale_packer::emit::affinity(variant) {
        pod["affinity"] = affinity;
    }
    if !spec.tolerations.is_empty() {
        pod["tolerations"] = serde_json::json!(spec.tolerations);
    }
    pod
}

/// The variant a model runs as before any plan: whole GPUs (its first
/// tensor-parallel size) of the first GPU model it allows, on nodes of
/// that product, named after the model. Without a plan there is no
/// cluster file, so the built-in catalogue is the one in effect.
pub fn whole_gpu_variant(model: &Model, replicas: u32) -> Variant {
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
    Variant {
        name: model.name.clone(),
        gpu_model,
        resources: [(
            "nvidia.com/gpu".to_string(),
            model.tensor_parallel.first().copied().unwrap_or(1),
        )]
        .into(),
        node_selector,
        annotations: BTreeMap::new(),
        labels: BTreeMap::new(),
        node_affinity: None,
        replicas,
        spares: 0,
        tensor_parallel: model.tensor_parallel.first().copied().unwrap_or(1),
        memory_fraction: None,
    }
}

/// The name of the mig-parted ConfigMap gpuscale maintains.
pub const MIG_CONFIGMAP: &str = "gpuscale-mig-parted-config";

/// The mig-parted ConfigMap: every config under `config.yaml`, as the GPU
/// Operator's MIG manager reads it.
pub fn mig_configmap(
    config: &gpuscale_packer::emit::MigPartedConfig,
    namespace: &str,
) -> Result<ConfigMap, serde_json::Error> {
    let text = gpuscale_packer::emit::to_yaml(&config).map_err(serde::ser::Error::custom)?;
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

/// A node's MIG config may change now: none of its GPUs whose geometry
/// changes has a replica running (`busy`: GPU indices with replicas now;
/// `changing`: GPU indices the plan reconfigures).
pub fn may_reconfigure(busy: &[u32], changing: &[u32]) -> bool {
    changing.iter().all(|g| !busy.contains(g))
}

/// The GPUs of `was` (a node as it is) that a plan's `gpus` reconfigure: those
/// whose MIG geometry it changes (into MIG mode, or a new layout), and
/// those in MIG mode now that it uses otherwise (whole, shared or
/// fractional: MIG must be turned off under them first). An idle GPU left
/// in MIG mode is not worth a cordon.
pub fn changing_gpus(gpus: &[gpuscale_packer::GpuPlan], was: &gpuscale_policies::Node) -> Vec<u32> {
    use gpuscale_packer::Mode;
    use gpuscale_policies::GpuMode;
    gpus.iter()
        .filter(|g| g.node == was.name)
        .filter(|g| {
            let old = was.gpus.get(g.index as usize);
            match g.mode {
                Mode::Mig => old.is_none_or(|old| {
                    old.mode != GpuMode::Mig || old.geometry.placements() != g.geometry.as_slice()
                }),
                Mode::Idle => false,
                _ => old.is_some_and(|old| old.mode == GpuMode::Mig),
            }
        })
        .map(|g| g.index)
        .collect()
}

/// Which pods a drain of a node evicts ([`Evict`]): all of gpuscale's GPU
/// pods when one of the `changing` GPUs is not in MIG mode now (`mig_now`:
/// whether each GPU index is; an index it does not reach is not), its MIG
/// pods alone otherwise.
pub fn evict_for(mig_now: &[bool], changing: &[u32]) -> Evict {
    if changing
        .iter()
        .any(|&i| !mig_now.get(i as usize).copied().unwrap_or(false))
    {
        Evict::Gpus
    } else {
        Evict::Mig
    }
}

/// An Event's note: at most 1,024 bytes (the API's limit is in bytes;
/// reasons hold `→` and `×`), cut at a character boundary.
pub fn note(text: &str) -> String {
    let mut end = text.len().min(1024);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// What an Event is about.
#[derive(Debug, Clone, PartialEq)]
pub struct Regarding {
    /// `apiVersion` of the object.
    pub api_version: String,
    /// Its kind.
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its namespace (`None`: cluster-scoped, such as a Node).
    pub namespace: Option<String>,
}

impl Regarding {
    /// A ModelPolicy in `namespace`.
    pub fn policy(name: &str, namespace: &str) -> Self {
        Regarding {
            api_version: "gpuscale.io/v1alpha1".into(),
            kind: "ModelPolicy".into(),
            name: name.into(),
            namespace: Some(namespace.into()),
        }
    }

    /// A Node.
    pub fn node(name: &str) -> Self {
        Regarding {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.into(),
            namespace: None,
        }
    }
}

/// What an Event says: its action, reason and note, and whether it
/// reports a failure (`Warning`) or not (`Normal`).
#[derive(Debug, Clone, PartialEq)]
pub struct Said {
    /// What was done or tried (`Scale`, `Adopt`, `ReconfigureMIG`).
    pub action: String,
    /// Why, in one word.
    pub reason: String,
    /// In words (cut to 1,024 bytes).
    pub note: String,
    /// A failure.
    pub warning: bool,
}

/// An Event about `regarding`, reported by `identity`.
pub fn event_about(regarding: &Regarding, said: &Said, identity: &str, now: Duration) -> Event {
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", regarding.name)),
            // The API server takes Events about cluster-scoped objects
            // (Nodes) only in `default`.
            namespace: Some(
                regarding
                    .namespace
                    .clone()
                    .unwrap_or_else(|| "default".into()),
            ),
            ..ObjectMeta::default()
        },
        event_time: Some(micro(now)),
        action: Some(said.action.clone()),
        reason: Some(said.reason.clone()),
        note: Some(note(&said.note)),
        type_: Some(if said.warning { "Warning" } else { "Normal" }.into()),
        reporting_controller: Some(format!("gpuscale.io/{MANAGER}")),
        reporting_instance: Some(identity.to_string()),
        regarding: Some(ObjectReference {
            api_version: Some(regarding.api_version.clone()),
            kind: Some(regarding.kind.clone()),
            name: Some(regarding.name.clone()),
            namespace: regarding.namespace.clone(),
            ..ObjectReference::default()
        }),
        ..Event::default()
    }
}

/// The Event recording a decision about a policy.
pub fn event(
    policy: &str,
    rec: &Recommendation,
    spec: &KubeSpec,
    identity: &str,
    now: Duration,
) -> Event {
    event_about(
        &Regarding::policy(policy, &spec.namespace),
        &Said {
            action: "Scale".into(),
            reason: format!("{:?}", rec.mode),
            note: rec.reason.clone(),
            warning: false,
        },
        identity,
        now,
    )
}

/// Events per object, as client-go's recorder limits them
/// (`EventSourceObjectSpamFilter`): a bucket of 25 that refills one
/// Event every 5 minutes.
#[derive(Debug, Default, Clone)]
pub struct EventBudget {
    buckets: BTreeMap<String, (f64, Duration)>,
}

impl EventBudget {
    /// The burst per object.
    pub const BURST: f64 = 25.0;
    /// One token back per this long.
    pub const REFILL: Duration = Duration::from_secs(300);

    /// Takes a token for `object` at `now`: `false` when its bucket is
    /// empty (the Event is dropped, and logged instead).
    pub fn take(&mut self, object: &str, now: Duration) -> bool {
        let (tokens, at) = self
            .buckets
            .entry(object.to_string())
            .or_insert((Self::BURST, now));
        let refilled = now.saturating_sub(*at).as_secs_f64() / Self::REFILL.as_secs_f64();
        *tokens = (*tokens + refilled).min(Self::BURST);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
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
        conditions: Vec::new(),
    };
    serde_json::json!({"status": status})
}

/// The status merge patch of the `DeploymentsOwned` condition: `refused`
/// names the Deployments the plan wants that exist and are not
/// gpuscale's (empty: the condition is `True`).
pub fn ownership_patch(refused: &[String], now: Duration) -> serde_json::Value {
    let time = Timestamp::from_second(now.as_secs() as i64)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| clock(now));
    let condition = if refused.is_empty() {
        PolicyCondition {
            type_: "DeploymentsOwned".into(),
            status: "True".into(),
            reason: "Owned".into(),
            message: "every Deployment of the plan is gpuscale's".into(),
            last_transition_time: time,
        }
    } else {
        PolicyCondition {
            type_: "DeploymentsOwned".into(),
            status: "False".into(),
            reason: "NameInUse".into(),
            message: format!(
                "Deployment(s) {} exist and were not created by gpuscale (no \
                 app.kubernetes.io/managed-by=gpuscale label, no ModelPolicy owner): gpuscale \
                 leaves them alone and runs none of their replicas; rename the policy or remove \
                 them",
                refused.join(", ")
            ),
            last_transition_time: time,
        }
    };
    serde_json::json!({"status": {"conditions": [condition]}})
}

/// The status merge patch that persists the recommender's memory alone.
pub fn memory_patch(memory: &ScalingMemory) -> serde_json::Value {
    serde_json::json!({"status": {"scalingMemory": memory}})
}

/// One Deployment gpuscale runs for a model, as read.
#[derive(Debug, Clone, PartialEq)]
pub struct Owned {
    /// Its name (the variant's).
    pub name: String,
    /// The model (policy name) it serves, from its label.
    pub model: String,
    /// `spec.replicas` (what `/scale` serves; absent means 1, the API
    /// server's default).
    pub replicas: u32,
    /// `status.readyReplicas`.
    pub ready: u32,
    /// A hand-over's hold ([`HANDOVER_PLANNED`], [`HANDOVER_UNTIL`]): the
    /// plan scaled it down in a move and its replicas serve until their
    /// successors are ready.
    pub held: Option<Held>,
    /// Of `replicas`, the spares ([`SPARES`]; 0 without it).
    pub spares: u32,
    /// `metadata.resourceVersion`: a removal is refused if it changed.
    pub resource_version: Option<String>,
    /// [`TEMPLATE`]: the digest of the spec it was applied with (`None`:
    /// applied by a controller before this annotation, or by hand).
    pub template: Option<String>,
    /// Its rollout is done: the Deployment controller has seen its latest
    /// spec, and every replica asked for runs it and is ready.
    pub settled: bool,
}

/// Whether a Deployment's rollout is over: done (as `kubectl rollout
/// status` judges it: the latest generation observed, and
/// `updatedReplicas`, `readyReplicas` and `replicas` all at
/// `spec.replicas`), or stalled past its progress deadline (condition
/// `Progressing` false, `ProgressDeadlineExceeded`: a replica that cannot
/// be placed or cannot start holds nobody else's rollout up for ever).
pub fn settled(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(s) = d.status.as_ref() else {
        return want == 0;
    };
    let observed = match (s.observed_generation, d.metadata.generation) {
        (Some(o), Some(g)) => o >= g,
        (_, None) => true,
        (None, Some(_)) => false,
    };
    // Stalled on the latest spec only: a condition read before the
    // Deployment controller saw a new apply is the old rollout's.
    let stalled = s.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    if stalled && observed {
        return true;
    }
    observed
        && s.updated_replicas.unwrap_or(0) >= want
        && s.ready_replicas.unwrap_or(0) >= want
        && s.replicas.unwrap_or(0) <= want
}

impl Owned {
    /// Runs nothing and holds nothing: no replica asked for or ready, no
    /// hand-over hold, no spare.
    pub fn idle(&self) -> bool {
        self.replicas == 0 && self.ready == 0 && self.held.is_none() && self.spares == 0
    }
}

impl From<&Owned> for crate::handover::VariantNow {
    fn from(o: &Owned) -> Self {
        crate::handover::VariantNow {
            name: o.name.clone(),
            replicas: o.replicas,
            ready: o.ready,
            held: o.held,
            spares: o.spares,
        }
    }
}

/// Annotation on a variant Deployment: how many of its replicas are
/// spares (`gpuscale_packer::spare`), which the count the controller
/// reads back leaves out.
pub const SPARES: &str = "gpuscale.io/spares";

/// Annotation on a variant Deployment the plan scaled down in a move: the
/// count the plan gave it (its replicas above that serve until the
/// successors are ready; [`crate::handover`]).
pub const HANDOVER_PLANNED: &str = "gpuscale.io/handover-planned";
/// Annotation beside [`HANDOVER_PLANNED`]: when the hold ends whatever is
/// ready (Unix seconds).
pub const HANDOVER_UNTIL: &str = "gpuscale.io/handover-until";

/// The merge patch that sets a Deployment's replicas and records a
/// hand-over's hold on it, or (`None`) removes the hold: one write, so a
/// leader never reads a count without the hold that explains it.
pub fn hold_patch(replicas: u32, held: Option<Held>) -> serde_json::Value {
    let annotations = match held {
        Some(h) => serde_json::json!({
            HANDOVER_PLANNED: h.planned.to_string(),
            HANDOVER_UNTIL: h.until.to_string(),
        }),
        None => serde_json::json!({HANDOVER_PLANNED: null, HANDOVER_UNTIL: null}),
    };
    serde_json::json!({"metadata": {"annotations": annotations}, "spec": {"replicas": replicas}})
}

/// The hold recorded on a Deployment, when both annotations read.
fn held_of(meta: &ObjectMeta) -> Option<Held> {
    let a = meta.annotations.as_ref()?;
    Some(Held {
        planned: a.get(HANDOVER_PLANNED)?.parse().ok()?,
        until: a.get(HANDOVER_UNTIL)?.parse().ok()?,
    })
}

/// An object gpuscale created: it carries `app.kubernetes.io/managed-by:
/// gpuscale` (every object gpuscale applies does), or an owner reference
/// to a ModelPolicy. Anything else of the same name is a user's, and is
/// never adopted.
pub fn owned_by_us(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get("app.kubernetes.io/managed-by"))
        .is_some_and(|v| v == MANAGER)
        || meta
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "ModelPolicy" && o.api_version.starts_with("gpuscale.io/"))
}

/// The Deployments of a list that gpuscale owns, with their model and
/// declared replicas, by name.
pub fn owned_deployments(deployments: &[Deployment]) -> Vec<Owned> {
    let mut out: Vec<Owned> = deployments
        .iter()
        .filter(|d| owned_by_us(&d.metadata))
        .filter_map(|d| {
            Some(Owned {
                name: d.metadata.name.clone()?,
                model: d.metadata.labels.as_ref()?.get(MODEL_LABEL)?.clone(),
                replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0) as u32,
                ready: d
                    .status
                    .as_ref()
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0)
                    .max(0) as u32,
                held: held_of(&d.metadata),
                spares: d
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(SPARES))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
                resource_version: d.metadata.resource_version.clone(),
                template: d
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(TEMPLATE))
                    .cloned(),
                settled: settled(d),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Replicas per model of the Deployments in a list that another
/// controller owns but that serve a gpuscale model (labelled
/// `gpuscale.io/model`, not gpuscale's): in KEDA mode, the model server's
/// Deployment that KEDA scales. `spec.replicas` summed per model (absent
/// means 1, the API server's default).
pub fn observed_deployments(deployments: &[Deployment]) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for d in deployments.iter().filter(|d| !owned_by_us(&d.metadata)) {
        let Some(model) = d.metadata.labels.as_ref().and_then(|l| l.get(MODEL_LABEL)) else {
            continue;
        };
        let n = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0) as u32;
        *out.entry(model.clone()).or_insert(0) += n;
    }
    out
}

/// The label the EndpointSlice controller puts on every slice, naming
/// its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Most Services whose EndpointSlices one list call selects (the
/// selector's length grows with them; 50 names of up to 63 characters
/// stay within the 8 KiB that proxies in front of API servers commonly
/// take as a request line).
pub const SLICE_LIST_SERVICES: usize = 50;

/// The name of a model's headless Service (a DNS-1035 label: `gpuscale-`
/// and the policy name, other characters as `-`, at most 63).
pub fn service_name(model: &str) -> String {
    let mut s: String = format!("gpuscale-{model}")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    while s.ends_with('-') {
        s.pop();
    }
    s
}

/// A model's headless Service: its EndpointSlices list the model's pods
/// (every variant) with their readiness, which is what the gateway's
/// pool is built from.
pub fn service(model: &Model, spec: &KubeSpec) -> Service {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(&model.name),
            "namespace": spec.namespace,
            "labels": {
                "app.kubernetes.io/name": model.name,
                "app.kubernetes.io/managed-by": MANAGER,
                MODEL_LABEL: model.name,
            },
        },
        "spec": {
            "clusterIP": "None",
            "selector": {MODEL_LABEL: model.name},
            "ports": [{"name": "http", "port": spec.port, "targetPort": "http"}],
        },
    }))
    .expect("a well-formed Service")
}

/// Ready `http://ip:port` endpoints from a Service's EndpointSlices.
/// - the port named `http` (else the first);
/// - an endpoint with no `ready` condition counts as ready, as the API
///   documents ("consumers should interpret this unknown state as
///   ready");
/// - IPv6 addresses are bracketed.
pub fn ready_endpoints(slices: &[EndpointSlice]) -> Vec<String> {
    ready_endpoints_on(slices, "http", true)
}

/// As [`ready_endpoints`], on the port named `port` (else, with
/// `or_first`, the slice's first port; without, the slice is skipped).
pub fn ready_endpoints_on(slices: &[EndpointSlice], port: &str, or_first: bool) -> Vec<String> {
    let mut out = Vec::new();
    for s in slices {
        let ports = s.ports.as_deref().unwrap_or_default();
        let named = ports.iter().find(|p| p.name.as_deref() == Some(port));
        let chosen = if or_first {
            named.or_else(|| ports.first())
        } else {
            named
        };
        let Some(port) = chosen
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for e in &s.endpoints {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            if ready {
                for a in &e.addresses {
                    // As the gateway writes it (its registration rules):
                    // an IPv4-mapped IPv6 address as IPv4, and IPv6 in its
                    // canonical form, so its list and the slices compare
                    // equal however a slice spells the address.
                    let ip = match a.parse::<std::net::IpAddr>() {
                        Ok(std::net::IpAddr::V6(v6)) => v6
                            .to_ipv4_mapped()
                            .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
                        Ok(v4) => v4,
                        Err(_) if a.contains(':') => {
                            out.push(format!("http://[{a}]:{port}"));
                            continue;
                        }
                        Err(_) => {
                            out.push(format!("http://{a}:{port}"));
                            continue;
                        }
                    };
                    out.push(format!("http://{}", std::net::SocketAddr::new(ip, port)));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The node label the GPU Operator's MIG manager sets when it has applied
/// (`success`) or failed to apply (`failed`) the config the node names.
pub const MIG_STATE_LABEL: &str = "nvidia.com/mig.config.state";
/// The node label recording gpuscale's MIG hand-off in progress on a node
/// (`draining`, `configuring` or `failed`), so that a restarted or new
/// leader finds it.
pub const HANDOFF_LABEL: &str = "gpuscale.io/mig-handoff";
/// The node annotation holding the mig-parted config being handed to.
pub const HANDOFF_CONFIG: &str = "gpuscale.io/mig-handoff-config";
/// The node annotation saying, in words, why gpuscale cordoned the node.
pub const HANDOFF_REASON: &str = "gpuscale.io/mig-handoff-reason";
/// The node annotation naming the controller that started the hand-off
/// (`namespace/lease`, [`KubeSpec::handoff_owner`]): a node that has left
/// its managed pool mid-hand-off is still that controller's to undo, and
/// no other's.
pub const HANDOFF_BY: &str = "gpuscale.io/mig-handoff-by";
/// The node annotation saying which of gpuscale's pods a drain evicts:
/// `gpus` (every pod holding a GPU device) where a GPU switches into MIG
/// mode, `mig` for MIG pods alone ([`Evict`]); absent (a hand-off an
/// older release recorded) read as `gpus`.
pub const HANDOFF_EVICT: &str = "gpuscale.io/mig-handoff-evict";

/// Which of gpuscale's pods on a node a MIG drain evicts. The API does
/// not say which GPU a pod holds. A GPU already in MIG mode is never
/// handed out whole or shared (mixed strategy), so a new layout of MIG
/// GPUs concerns the MIG pods alone; a GPU switching into MIG mode may be
/// the one a whole-GPU or time-sliced pod holds, and mig-parted cannot
/// change a GPU a process runs on (the MIG manager then reports `failed`
/// and the node stays cordoned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evict {
    /// Pods holding MIG devices.
    Mig,
    /// Pods holding MIG devices, whole GPUs (`nvidia.com/gpu`) or shares
    /// (`nvidia.com/gpu.shared`).
    Gpus,
}

/// Who started a node's hand-off ([`HANDOFF_BY`]), if recorded.
pub fn handoff_by(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HANDOFF_BY))
        .map(String::as_str)
}

/// Whether a node carries every label of the managed pool (`pool`, from
/// [`KubeSpec::pool_labels`]; empty: every node).
pub fn in_pool(node: &Node, pool: &BTreeMap<String, String>) -> bool {
    let labels = node.metadata.labels.as_ref();
    pool.iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)).is_some_and(|x| x == v))
}

/// A MIG hand-off in progress on a node, as recorded on it.
#[derive(Debug, Clone, PartialEq)]
pub enum Handoff {
    /// Cordoned; gpuscale's MIG pods (or all its GPU pods: `evict`) are
    /// being evicted.
    Draining {
        /// The config to hand to.
        config: String,
        /// Which pods go.
        evict: Evict,
    },
    /// `nvidia.com/mig.config` set; waiting for the MIG manager.
    Configuring {
        /// The config.
        config: String,
    },
    /// The MIG manager reported `failed`: the node stays cordoned until
    /// an operator looks (the reason annotation says so).
    Failed {
        /// The config it failed to apply.
        config: String,
    },
}

/// The hand-off a node records, if any.
pub fn handoff_of(node: &Node) -> Option<Handoff> {
    let m = &node.metadata;
    let state = m.labels.as_ref()?.get(HANDOFF_LABEL)?;
    let config = m
        .annotations
        .as_ref()
        .and_then(|a| a.get(HANDOFF_CONFIG))
        .cloned()
        .or_else(|| m.labels.as_ref()?.get(MIG_CONFIG_LABEL).cloned())
        .unwrap_or_default();
    match state.as_str() {
        "draining" => Some(Handoff::Draining {
            config,
            // Unrecorded (a hand-off started by an older release, one of
            // which evicted every GPU pod): every GPU pod, the safe side.
            evict: match m.annotations.as_ref().and_then(|a| a.get(HANDOFF_EVICT)) {
                Some(v) if v == "mig" => Evict::Mig,
                _ => Evict::Gpus,
            },
        }),
        "configuring" => Some(Handoff::Configuring { config }),
        "failed" => Some(Handoff::Failed { config }),
        _ => None,
    }
}

/// The MIG manager's state label on a node (`success`, `failed`,
/// `pending`, `rebooting`), if set.
pub fn mig_state(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get(MIG_STATE_LABEL)
        .map(String::as_str)
}

/// The node patch that starts a hand-off to `config`: cordon, with the
/// hand-off and its reason recorded on the node in the same write (so a
/// node is never cordoned by gpuscale without a recorded reason). `drain`:
/// replicas run on GPUs that change, so gpuscale's pods `evict` names are
/// evicted first; otherwise the config is set at once.
pub fn handoff_start_patch(config: &str, drain: bool, evict: Evict, by: &str) -> serde_json::Value {
    let reason = format!(
        "cordoned by gpuscale to change the MIG geometry to {config}; uncordoned when \
         {MIG_STATE_LABEL}=success"
    );
    let mut labels =
        serde_json::json!({HANDOFF_LABEL: if drain { "draining" } else { "configuring" }});
    if !drain {
        labels[MIG_CONFIG_LABEL] = config.into();
    }
    serde_json::json!({
        "metadata": {
            "labels": labels,
            "annotations": {
                HANDOFF_CONFIG: config,
                HANDOFF_REASON: reason,
                HANDOFF_BY: by,
                HANDOFF_EVICT: match evict {
                    Evict::Mig => "mig",
                    Evict::Gpus => "gpus",
                },
            },
        },
        "spec": {"unschedulable": true},
    })
}

/// The node patch once drained: the config set for the MIG manager.
pub fn handoff_configure_patch(config: &str) -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": {MIG_CONFIG_LABEL: config, HANDOFF_LABEL: "configuring"}}})
}

/// The node patch once the MIG manager succeeded: uncordoned, the record
/// removed.
pub fn handoff_done_patch() -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "labels": {HANDOFF_LABEL: null},
            "annotations": {HANDOFF_CONFIG: null, HANDOFF_REASON: null, HANDOFF_BY: null, HANDOFF_EVICT: null},
        },
        "spec": {"unschedulable": false},
    })
}

/// The node patch when the MIG manager failed: still cordoned, the
/// reason says what to do.
pub fn handoff_failed_patch(config: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "labels": {HANDOFF_LABEL: "failed"},
            "annotations": {HANDOFF_REASON: format!(
                "the MIG manager failed to apply {config} ({MIG_STATE_LABEL}=failed); gpuscale keeps \
                 the node cordoned: fix it, then uncordon it and remove the label {HANDOFF_LABEL}"
            )},
        },
    })
}

/// The mig-parted document to apply: the plan's configs, and every config
/// of the one in the cluster (`existing`) that a node still names
/// (`named`: the nodes' `nvidia.com/mig.config` labels and hand-offs), so
/// that a node the plan did not touch never names a config that is gone.
/// Config names are hashes of their content, so a name means the same
/// layout in both.
pub fn merged_mig_parted(
    plan: &Plan,
    existing: Option<&str>,
    named: &BTreeSet<String>,
) -> gpuscale_packer::emit::MigPartedConfig {
    let (mut config, _) = gpuscale_packer::emit::mig_parted(plan);
    let old: Option<gpuscale_packer::emit::MigPartedConfig> =
        existing.and_then(|t| serde_yaml_ng::from_str(t).ok());
    if let Some(old) = old {
        for (name, entries) in old.mig_configs {
            if named.contains(&name) {
                config.mig_configs.entry(name).or_insert(entries);
            }
        }
    }
    config
}

/// What an eviction came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Evicted {
    /// Accepted (the pod terminates).
    Yes,
    /// The pod was gone already (404): done.
    Gone,
    /// A PodDisruptionBudget holds it (429): retried on a later tick.
    Blocked,
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

/// A ModelPolicy as listed: decoded, or why it could not be (each
/// object is decoded on its own, so one bad object does not fail the
/// others).
pub type Listed = Result<ModelPolicy, (String, String)>;

/// Decodes one listed or watched ModelPolicy on its own.
fn decode(o: &DynamicObject) -> Listed {
    let name = o.metadata.name.clone().unwrap_or_default();
    serde_json::to_value(o)
        .and_then(serde_json::from_value::<ModelPolicy>)
        .map_err(|e| (name, e.to_string()))
}

/// Objects as a kube-runtime reflector keeps them: a list, then a watch,
/// re-listed after a gap, with kube's default backoff. Stops when
/// dropped.
struct Reflected<K: kube::Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store: kube::runtime::reflector::Store<K>,
    ready: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl<K: kube::Resource + Clone + 'static> Drop for Reflected<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<K: kube::Resource + Clone + 'static> Reflected<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    /// The objects now; `None` until the first list has arrived (an
    /// empty store before it is nothing known, not nothing there).
    fn current(&self) -> Option<Vec<std::sync::Arc<K>>> {
        self.ready
            .load(std::sync::atomic::Ordering::Acquire)
            .then(|| self.store.state())
    }
}

/// Starts a reflector of `api`'s objects into `writer`'s store, each
/// changed by `modify` as it arrives; `what` names them in warnings.
fn reflect<K>(
    api: Api<K>,
    writer: kube::runtime::reflector::store::Writer<K>,
    config: kube::runtime::watcher::Config,
    what: &'static str,
    modify: impl FnMut(&mut K) + Send + 'static,
) -> Reflected<K>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Send + Sync,
{
    use kube::runtime::{WatchStreamExt, watcher};
    let store = writer.as_reader();
    let ready = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ready.clone();
    let task = tokio::spawn(async move {
        use tokio_stream::StreamExt;
        let stream = watcher(api, config)
            .modify(modify)
            .default_backoff()
            .reflect(writer);
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    flag.store(true, std::sync::atomic::Ordering::Release);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("watching {what}: {e}"),
            }
        }
    });
    Reflected { store, ready, task }
}

/// The namespace's ModelPolicies as a reflector keeps them.
pub struct PolicyWatch {
    reflected: Reflected<DynamicObject>,
}

/// The pods bound to nodes, cluster-wide, as a reflector keeps them
/// ([`Kube::watch_pods`]).
pub struct PodWatch {
    reflected: Reflected<Pod>,
}

impl PodWatch {
    /// Whether the first list has arrived, waiting up to `within` for it.
    pub async fn listed_within(&self, within: Duration) -> bool {
        let until = tokio::time::Instant::now() + within;
        loop {
            if self
                .reflected
                .ready
                .load(std::sync::atomic::Ordering::Acquire)
            {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// The pods now (slim); `None` until the first list has arrived.
    pub fn current(&self) -> Option<Vec<Pod>> {
        self.reflected
            .current()
            .map(|pods| pods.iter().map(|p| (**p).clone()).collect())
    }
}

impl PolicyWatch {
    /// The policies now, each with its `resourceVersion` and decoded on
    /// its own, by name; `None` until the first list has arrived (an
    /// empty store then is no policy, not a deleted one).
    pub fn current(&self) -> Option<BTreeMap<String, (String, Listed)>> {
        Some(
            self.reflected
                .current()?
                .iter()
                .map(|o| {
                    (
                        o.metadata.name.clone().unwrap_or_default(),
                        (
                            o.metadata.resource_version.clone().unwrap_or_default(),
                            decode(o),
                        ),
                    )
                })
                .collect(),
        )
    }
}

/// The client side: sends what the builders make, each call within the
/// request deadline, or in dry-run mode logs the writes and returns them.
pub struct Kube {
    client: kube::Client,
    spec: KubeSpec,
    identity: String,
    dry_run: bool,
    /// Writes (other than the Lease's) are refused from this instant on:
    /// the end of the leader's renew deadline. `None`: unfenced.
    fence: std::sync::Mutex<Option<tokio::time::Instant>>,
    /// The UID of each watched ModelPolicy, by name: the owner of the
    /// model's Deployments and Service, so Kubernetes' garbage collector
    /// removes them with the policy.
    owners: std::sync::Mutex<BTreeMap<String, String>>,
}

impl Kube {
    /// A backend over `client`.
    pub fn new(client: kube::Client, spec: KubeSpec, identity: String, dry_run: bool) -> Self {
        Kube {
            client,
            spec,
            identity,
            dry_run,
            fence: std::sync::Mutex::new(None),
            owners: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// The watched ModelPolicies' UIDs, by name (see `owners`).
    pub fn set_owners(&self, owners: BTreeMap<String, String>) {
        *self.owners.lock().unwrap_or_else(|e| e.into_inner()) = owners;
    }

    /// The owner reference to `policy`'s ModelPolicy, when its UID is
    /// known (policies read from files have none).
    fn owner_of(&self, policy: &str) -> Option<Vec<OwnerReference>> {
        let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        let uid = owners.get(policy)?;
        Some(vec![OwnerReference {
            api_version: "gpuscale.io/v1alpha1".into(),
            kind: "ModelPolicy".into(),
            name: policy.to_string(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }])
    }

    /// Refuses every write but the Lease's from `until` on (the leader's
    /// renew deadline; the backend moves it on with each renewal).
    pub fn fence(&self, until: Option<tokio::time::Instant>) {
        *self.fence.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }

    /// A write may go out now.
    fn fenced(&self) -> Result<(), KubeError> {
        let until = *self.fence.lock().unwrap_or_else(|e| e.into_inner());
        match until {
            Some(t) if tokio::time::Instant::now() >= t => Err(KubeError::LostLease),
            _ => Ok(()),
        }
    }

    /// The settings.
    pub fn spec(&self) -> &KubeSpec {
        &self.spec
    }

    /// Who this process is (the Lease holder and Events' reporter).
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Writes are logged, not sent.
    pub fn dry_run(&self) -> bool {
        self.dry_run
    }

    /// The namespace it manages.
    pub fn ns(&self) -> &str {
        &self.spec.namespace
    }

    /// Runs one call within the request deadline.
    async fn call<T, E: Into<KubeError>>(
        &self,
        what: impl FnOnce() -> String,
        fut: impl Future<Output = Result<T, E>>,
    ) -> Result<T, KubeError> {
        match tokio::time::timeout(self.spec.request_timeout, fut).await {
            Ok(r) => r.map_err(Into::into),
            Err(_) => Err(KubeError::Timeout {
                what: what(),
                after: self.spec.request_timeout,
            }),
        }
    }

    fn dry(&self, w: Write) -> Option<Write> {
        if self.dry_run {
            tracing::info!(method = w.method, path = %w.path, body = %w.body, "dry run: not sent");
            Some(w)
        } else {
            None
        }
    }

    /// The ModelPolicies in the namespace, each decoded on its own.
    pub async fn policies(&self) -> Result<Vec<Listed>, KubeError> {
        let ar = ApiResource::erase::<ModelPolicy>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), self.ns(), &ar);
        let list = self
            .call(
                || "list modelpolicies".into(),
                api.list(&ListParams::default()),
            )
            .await?;
        Ok(list.items.iter().map(decode).collect())
    }

    /// Starts watching the namespace's ModelPolicies.
    pub fn watch_policies(&self) -> PolicyWatch {
        let ar = ApiResource::erase::<ModelPolicy>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), self.ns(), &ar);
        let writer = kube::runtime::reflector::store::Writer::new(ar);
        let reflected = reflect(
            api,
            writer,
            kube::runtime::watcher::Config::default(),
            "ModelPolicies",
            |_| {},
        );
        PolicyWatch { reflected }
    }

    /// Starts watching every pod bound to a node and not finished, in
    /// every namespace, each kept cut down to what the inventory reads
    /// ([`crate::inventory::slim`]): gpuscale's say where its replicas
    /// run, and any other pod that holds GPUs (training workers, other
    /// teams' servers) keeps those GPUs out of the plans
    /// ([`crate::inventory::holdings`]). One list ([`PODS_PAGE`] a page,
    /// re-listed only after a gap), then changes as they happen: on a
    /// cluster of a hundred thousand pods, listing them all every
    /// inventory (every 30 s) was the API server's largest load from
    /// gpuscale, and now only what changes crosses the wire.
    pub fn watch_pods(&self) -> PodWatch {
        let api: Api<Pod> = Api::all(self.client.clone());
        let config = kube::runtime::watcher::Config::default()
            .fields(POD_FIELDS)
            .page_size(PODS_PAGE);
        let reflected = reflect(
            api,
            kube::runtime::reflector::store::Writer::default(),
            config,
            "pods",
            |pod: &mut Pod| *pod = crate::inventory::slim(std::mem::take(pod)),
        );
        PodWatch { reflected }
    }

    /// The Deployments gpuscale owns in the namespace (one list call, by
    /// the `managed-by` label; each checked again by [`owned_by_us`]):
    /// the live counts the controller starts from and compares with
    /// every tick.
    pub async fn owned(&self) -> Result<Vec<Owned>, KubeError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        let list = self
            .call(
                || "list deployments".into(),
                api.list(
                    &ListParams::default()
                        .labels(&format!("app.kubernetes.io/managed-by={MANAGER}")),
                ),
            )
            .await?;
        Ok(owned_deployments(&list.items))
    }

    /// What runs per model in Deployments gpuscale does not own but that
    /// carry its model label ([`observed_deployments`]; one list call).
    /// Read only in a dry run, where another controller (KEDA) scales the
    /// model server: the decisions then start from what runs, not from 0.
    /// Never written to.
    pub async fn observed(&self) -> Result<BTreeMap<String, u32>, KubeError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        let list = self
            .call(
                || "list deployments".into(),
                api.list(&ListParams::default().labels(&format!(
                    "{MODEL_LABEL},app.kubernetes.io/managed-by!={MANAGER}"
                ))),
            )
            .await?;
        Ok(observed_deployments(&list.items))
    }

    /// A Service by name, if there is one.
    pub async fn service(&self, name: &str) -> Result<Option<Service>, KubeError> {
        let api: Api<Service> = Api::namespaced(self.client.clone(), self.ns());
        self.call(|| format!("get service {name}"), api.get_opt(name))
            .await
    }

    /// A Deployment by name, if there is one.
    pub async fn deployment(&self, name: &str) -> Result<Option<Deployment>, KubeError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        self.call(|| format!("get deployment {name}"), api.get_opt(name))
            .await
    }

    /// The recommender's memory a previous controller left in a policy's
    /// status (`None`: no policy object, or nothing remembered).
    pub async fn remembered(&self, policy: &str) -> Result<Option<ScalingMemory>, KubeError> {
        let api: Api<ModelPolicy> = Api::namespaced(self.client.clone(), self.ns());
        Ok(self
            .call(|| format!("get modelpolicy {policy}"), api.get_opt(policy))
            .await?
            .and_then(|p| p.status)
            .and_then(|s| s.scaling_memory))
    }

    /// A merge patch of a policy's status.
    pub async fn patch_status_value(
        &self,
        policy: &str,
        body: serde_json::Value,
    ) -> Result<Option<Write>, KubeError> {
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
        self.fenced()?;
        let api: Api<ModelPolicy> = Api::namespaced(self.client.clone(), self.ns());
        self.call(
            || format!("patch modelpolicy {policy} status"),
            api.patch_status(policy, &PatchParams::default(), &Patch::Merge(&body)),
        )
        .await?;
        Ok(None)
    }

    /// Writes the recommender's memory into a policy's status.
    pub async fn remember(
        &self,
        policy: &str,
        memory: &ScalingMemory,
    ) -> Result<Option<Write>, KubeError> {
        self.patch_status_value(policy, memory_patch(memory)).await
    }

    /// Writes a decision into a policy's status.
    pub async fn status(
        &self,
        policy: &str,
        current: u32,
        rec: &Recommendation,
        now: Duration,
        memory: Option<&ScalingMemory>,
    ) -> Result<Option<Write>, KubeError> {
        self.patch_status_value(policy, status_patch(current, rec, now, memory))
            .await
    }

    /// Creates an Event.
    pub async fn emit(&self, ev: &Event) -> Result<Option<Write>, KubeError> {
        let ns = ev
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| self.ns().to_string());
        if let Some(w) = self.dry(Write {
            method: "POST",
            path: format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
            body: serde_json::to_value(ev)?,
        }) {
            return Ok(Some(w));
        }
        self.fenced()?;
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        self.call(
            || "create event".into(),
            api.create(&PostParams::default(), ev),
        )
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
        self.fenced()?;
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        self.call(
            || format!("scale deployment {name}"),
            api.patch_scale(name, &PatchParams::default(), &Patch::Merge(&body)),
        )
        .await?;
        Ok(None)
    }

    /// Deletes a Deployment of gpuscale's, provided it has not changed
    /// since it was read at `resource_version` (the API server refuses
    /// with 409 otherwise). Gone already or changed: `Ok`, nothing done
    /// (`false`).
    pub async fn delete_deployment(
        &self,
        name: &str,
        resource_version: Option<&str>,
    ) -> Result<bool, KubeError> {
        if self
            .dry(Write {
                method: "DELETE",
                path: format!("/apis/apps/v1/namespaces/{}/deployments/{name}", self.ns()),
                body: serde_json::json!({"preconditions": {"resourceVersion": resource_version}}),
            })
            .is_some()
        {
            return Ok(false);
        }
        self.fenced()?;
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: resource_version.map(str::to_string),
                uid: None,
            }),
            ..DeleteParams::background()
        };
        match self
            .call(
                || format!("delete deployment {name}"),
                api.delete(name, &params),
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(KubeError::Api(kube::Error::Api(e))) if e.code == 404 || e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sets a Deployment's replicas with a hand-over's hold, or with the
    /// hold removed, in one merge patch of the Deployment.
    pub async fn hold(
        &self,
        name: &str,
        replicas: u32,
        held: Option<Held>,
    ) -> Result<Option<Write>, KubeError> {
        let body = hold_patch(replicas, held);
        if let Some(w) = self.dry(Write {
            method: "PATCH",
            path: format!("/apis/apps/v1/namespaces/{}/deployments/{name}", self.ns()),
            body: body.clone(),
        }) {
            return Ok(Some(w));
        }
        self.fenced()?;
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        self.call(
            || format!("record the hand-over on deployment {name}"),
            api.patch(name, &PatchParams::default(), &Patch::Merge(&body)),
        )
        .await?;
        Ok(None)
    }

    /// Applies a variant's Deployment (server-side apply).
    pub async fn apply_deployment(
        &self,
        model: &Model,
        variant: &Variant,
    ) -> Result<Option<Write>, KubeError> {
        self.apply_built(model, variant, deployment(model, variant, &self.spec))
            .await
    }

    /// Applies a variant's Deployment with the pod template (and its
    /// digest) it runs now, `live`'s: its count, spares and strategy
    /// change, its pods do not (a changed template waits for
    /// [`crate::backend::KubeBackend`]'s one-at-a-time roll).
    pub async fn apply_deployment_keeping_pods(
        &self,
        model: &Model,
        variant: &Variant,
        live: &Deployment,
    ) -> Result<Option<Write>, KubeError> {
        let mut d = deployment(model, variant, &self.spec);
        let (Some(spec), Some(live_spec)) = (d.spec.as_mut(), live.spec.as_ref()) else {
            return self.apply_built(model, variant, d).await;
        };
        spec.template = live_spec.template.clone();
        let annotations = d.metadata.annotations.get_or_insert_default();
        match live
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TEMPLATE))
        {
            Some(t) => annotations.insert(TEMPLATE.to_string(), t.clone()),
            None => annotations.remove(TEMPLATE),
        };
        self.apply_built(model, variant, d).await
    }

    async fn apply_built(
        &self,
        model: &Model,
        variant: &Variant,
        mut d: Deployment,
    ) -> Result<Option<Write>, KubeError> {
        d.metadata.owner_references = self.owner_of(&model.name);
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
        self.fenced()?;
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), self.ns());
        self.call(
            || format!("apply deployment {}", variant.name),
            api.patch(
                &variant.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&d),
            ),
        )
        .await?;
        Ok(None)
    }

    /// Applies a model's headless Service (server-side apply).
    pub async fn apply_service(&self, model: &Model) -> Result<Option<Write>, KubeError> {
        let mut s = service(model, &self.spec);
        s.metadata.owner_references = self.owner_of(&model.name);
        let name = service_name(&model.name);
        if let Some(w) = self.dry(Write {
            method: "PATCH",
            path: format!(
                "/api/v1/namespaces/{}/services/{name}?fieldManager={MANAGER}&force=true",
                self.ns()
            ),
            body: serde_json::to_value(&s)?,
        }) {
            return Ok(Some(w));
        }
        self.fenced()?;
        let api: Api<Service> = Api::namespaced(self.client.clone(), self.ns());
        self.call(
            || format!("apply service {name}"),
            api.patch(
                &name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&s),
            ),
        )
        .await?;
        Ok(None)
    }

    /// The mig-parted document in the GPU Operator's ConfigMap now.
    pub async fn mig_configmap_text(&self) -> Result<Option<String>, KubeError> {
        let ns = &self.spec.gpu_operator_namespace;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        Ok(self
            .call(
                || format!("get configmap {ns}/{MIG_CONFIGMAP}"),
                api.get_opt(MIG_CONFIGMAP),
            )
            .await?
            .and_then(|c| c.data)
            .and_then(|mut d| d.remove("config.yaml")))
    }

    /// Applies the mig-parted ConfigMap (server-side apply).
    pub async fn apply_mig_configmap(
        &self,
        config: &gpuscale_packer::emit::MigPartedConfig,
    ) -> Result<Option<Write>, KubeError> {
        let ns = &self.spec.gpu_operator_namespace;
        let cm = mig_configmap(config, ns)?;
        if let Some(w) = self.dry(Write {
            method: "PATCH",
            path: format!(
                "/api/v1/namespaces/{ns}/configmaps/{MIG_CONFIGMAP}?fieldManager={MANAGER}&force=true"
            ),
            body: serde_json::to_value(&cm)?,
        }) {
            return Ok(Some(w));
        }
        self.fenced()?;
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
        self.call(
            || format!("apply configmap {ns}/{MIG_CONFIGMAP}"),
            api.patch(
                MIG_CONFIGMAP,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&cm),
            ),
        )
        .await?;
        Ok(None)
    }

    /// Nodes matching a label selector, [`PODS_PAGE`] a page, each without
    /// what no caller reads and most of a node's size: its managed fields,
    /// the images it has pulled and the volumes attached
    /// ([`without_bulk`]).
    pub async fn nodes(&self, selector: &str) -> Result<Vec<Node>, KubeError> {
        let api: Api<Node> = Api::all(self.client.clone());
        self.paged(
            &api,
            ListParams::default().labels(selector),
            &format!("list nodes {selector}"),
            without_bulk,
        )
        .await
    }

    /// A merge patch of a node (or, in dry-run mode, the write it would be).
    pub async fn patch_node(
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
        self.fenced()?;
        let api: Api<Node> = Api::all(self.client.clone());
        self.call(
            || format!("patch node {node}"),
            api.patch(node, &PatchParams::default(), &Patch::Merge(&body)),
        )
        .await?;
        Ok(None)
    }

    /// Every object `params` selects, [`PODS_PAGE`] a page, each mapped by
    /// `keep` as its page arrives. A continue token that expired mid-list
    /// (410 Gone: etcd compacted past it) starts the list again from the
    /// beginning, once, as client-go's pager does.
    async fn paged<K>(
        &self,
        api: &Api<K>,
        params: ListParams,
        what: &str,
        keep: impl Fn(K) -> K,
    ) -> Result<Vec<K>, KubeError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let mut restarted = false;
        'list: loop {
            let mut out = Vec::new();
            let mut token: Option<String> = None;
            loop {
                let mut page_params = params.clone().limit(PODS_PAGE);
                if let Some(t) = &token {
                    page_params = page_params.continue_token(t);
                }
                let page = match self.call(|| what.to_string(), api.list(&page_params)).await {
                    Ok(page) => page,
                    Err(e) if token.is_some() && !restarted && e.code() == Some(410) => {
                        tracing::info!("{what}: the continue token expired; listing again");
                        restarted = true;
                        continue 'list;
                    }
                    Err(e) => return Err(e),
                };
                out.extend(page.items.into_iter().map(&keep));
                token = page.metadata.continue_.filter(|t| !t.is_empty());
                if token.is_none() {
                    return Ok(out);
                }
            }
        }
    }

    /// gpuscale's pods on a node that a MIG drain evicts ([`Evict`]): those
    /// holding MIG devices, and with [`Evict::Gpus`] those holding whole
    /// GPUs (`nvidia.com/gpu`) or shares of them (`nvidia.com/gpu.shared`)
    /// too.
    pub async fn gpu_pods_on(
        &self,
        node: &str,
        evict: Evict,
    ) -> Result<Vec<(String, Option<String>)>, KubeError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        let pods = self
            .call(
                || format!("list pods on {node}"),
                api.list(
                    &ListParams::default()
                        .labels(&format!("app.kubernetes.io/managed-by={MANAGER}"))
                        .fields(&format!("spec.nodeName={node}")),
                ),
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
                            .is_some_and(|l| {
                                l.keys().any(|k| {
                                    k.starts_with("nvidia.com/mig-")
                                        || (evict == Evict::Gpus
                                            && (k == "nvidia.com/gpu"
                                                || k == "nvidia.com/gpu.shared"))
                                })
                            })
                    })
                })
            })
            .filter_map(|p| {
                let variant = p
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(VARIANT_LABEL))
                    .cloned();
                Some((p.metadata.name?, variant))
            })
            .collect())
    }

    /// Evicts a pod (the Eviction API: PodDisruptionBudgets hold). A pod
    /// already gone is done; one a budget holds is for a later tick.
    pub async fn evict(&self, pod: &str) -> Result<Evicted, KubeError> {
        if self
            .dry(Write {
                method: "POST",
                path: format!("/api/v1/namespaces/{}/pods/{pod}/eviction", self.ns()),
                body: serde_json::json!({"metadata": {"name": pod}}),
            })
            .is_some()
        {
            return Ok(Evicted::Yes);
        }
        self.fenced()?;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        match self
            .call(
                || format!("evict pod {pod}"),
                api.evict(pod, &kube::api::EvictParams::default()),
            )
            .await
        {
            Ok(_) => Ok(Evicted::Yes),
            Err(e) if e.code() == Some(404) => Ok(Evicted::Gone),
            Err(e) if e.code() == Some(429) => Ok(Evicted::Blocked),
            Err(e) => Err(e),
        }
    }

    /// The Lease, if there is one.
    pub async fn lease(&self) -> Result<Option<Lease>, KubeError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), self.ns());
        self.call(|| "get lease".into(), api.get_opt(&self.spec.lease_name))
            .await
    }

    /// Creates the Lease; the API server's answer.
    pub async fn create_lease(&self, lease: &Lease) -> Result<Lease, KubeError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), self.ns());
        self.call(
            || "create lease".into(),
            api.create(&PostParams::default(), lease),
        )
        .await
    }

    /// Replaces the Lease (its `resourceVersion` makes a concurrent write
    /// fail with 409); the API server's answer.
    pub async fn update_lease(&self, lease: &Lease) -> Result<Lease, KubeError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), self.ns());
        self.call(
            || "update lease".into(),
            api.replace(&self.spec.lease_name, &PostParams::default(), lease),
        )
        .await
    }

    /// Ready endpoints of a model's pods, from its Service's
    /// EndpointSlices ([`Kube::endpoints_of`] for one model).
    pub async fn endpoints(&self, model: &str) -> Result<Vec<String>, KubeError> {
        let mut of = self.endpoints_of(&[model]).await?;
        Ok(of.remove(model).unwrap_or_default())
    }

    /// Ready endpoints of each model's pods, from the EndpointSlices of
    /// the models' Services: one list call per [`SLICE_LIST_SERVICES`]
    /// models (a set-based selector, `kubernetes.io/service-name in
    /// (…)`), not one per model, every tick; each slice goes to its
    /// Service by the same label. Every model asked for has an entry.
    pub async fn endpoints_of(
        &self,
        models: &[&str],
    ) -> Result<BTreeMap<String, Vec<String>>, KubeError> {
        // (Two policy names could make one Service name: both read it.)
        let mut services: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for &m in models {
            services.entry(service_name(m)).or_default().push(m);
        }
        let names: Vec<&String> = services.keys().collect();
        let mut slices: BTreeMap<&str, Vec<EndpointSlice>> = BTreeMap::new();
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), self.ns());
        for chunk in names.chunks(SLICE_LIST_SERVICES) {
            let set = chunk
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(",");
            let list = self
                .call(
                    || format!("list endpointslices of {set}"),
                    api.list(
                        &ListParams::default().labels(&format!("{SERVICE_NAME_LABEL} in ({set})")),
                    ),
                )
                .await?;
            for slice in list.items {
                let service = slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL));
                for &model in service.and_then(|s| services.get(s)).into_iter().flatten() {
                    slices.entry(model).or_default().push(slice.clone());
                }
            }
        }
        Ok(models
            .iter()
            .map(|&m| {
                let ready = slices.get(m).map_or_else(Vec::new, |s| ready_endpoints(s));
                (m.to_string(), ready)
            })
            .collect())
    }

    /// Ready endpoints of a Service (port `http`, else its first), each
    /// with the node its pod runs on (the slice's `nodeName`, when the
    /// EndpointSlice controller set it).
    pub async fn service_endpoints_by_node(
        &self,
        service: &str,
    ) -> Result<Vec<(String, Option<String>)>, KubeError> {
        let slices = self.slices_of(service).await?;
        let mut out = Vec::new();
        for s in &slices {
            // One slice at a time, so each endpoint keeps its node.
            for e in &s.endpoints {
                let one = EndpointSlice {
                    endpoints: vec![e.clone()],
                    ..s.clone()
                };
                for url in ready_endpoints(std::slice::from_ref(&one)) {
                    out.push((url, e.node_name.clone()));
                }
            }
        }
        Ok(out)
    }

    /// Ready endpoints of a Service on its port named `port`.
    pub async fn service_port_endpoints(
        &self,
        service: &str,
        port: &str,
    ) -> Result<Vec<String>, KubeError> {
        Ok(ready_endpoints_on(
            &self.slices_of(service).await?,
            port,
            false,
        ))
    }

    async fn slices_of(&self, service: &str) -> Result<Vec<EndpointSlice>, KubeError> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), self.ns());
        let slices = self
            .call(
                || format!("list endpointslices of {service}"),
                api.list(&ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={service}"))),
            )
            .await?;
        Ok(slices.items)
    }
}
