//! The Kubernetes actuator over kube's client and a `tower_test` mock API
//! server: each test states the exact requests (method, path and query,
//! body) the actuator must send and answers them as an API server would.
//! No API server can run where these tests run; this is the contract with
//! one.
//!
//! Every request the scenarios make is recorded, and the last test
//! derives from them the (API group, resource, verb) set the controller
//! needs, which must equal what `deploy/base/rbac.yaml` grants: no more,
//! no less.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuscale_autoscaler::backend::{Backend, Change, KubeBackend};
use gpuscale_autoscaler::kubernetes::{Kube, KubeSpec, ready_endpoints};
use gpuscale_autoscaler::{Mode, Recommendation};
use gpuscale_packer::Variant;
use gpuscale_policies::Model;
use gpuscale_policies::model::{RememberedScaleEvent, ScalingMemory, TimedReplicas};
use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

mod common;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

/// Every request a scenario sent: (method, path with query, content type).
static SENT: Mutex<Vec<(String, String, String)>> = Mutex::new(Vec::new());

fn spec() -> KubeSpec {
    KubeSpec {
        namespace: "inference".into(),
        ..KubeSpec::default()
    }
}

fn kube(dry_run: bool) -> (Kube, Handle) {
    kube_with(spec(), "gpuscale-0", dry_run)
}

fn kube_with(spec: KubeSpec, identity: &str, dry_run: bool) -> (Kube, Handle) {
    let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "inference");
    (Kube::new(client, spec, identity.into(), dry_run), handle)
}

/// The mock API server split in two by path: the pods' list and watch
/// (a reflector beside the ticks, [`Kube::watch_pods`]) go to a handle
/// of their own, so that every other request still comes in the order a
/// scenario states.
#[derive(Clone)]
struct ByPath {
    main: tower_test::mock::Mock<Request<Body>, Response<Body>>,
    pods: tower_test::mock::Mock<Request<Body>, Response<Body>>,
}

impl tower_service::Service<Request<Body>> for ByPath {
    type Response = Response<Body>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = tower_test::mock::future::ResponseFuture<Response<Body>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        match self.main.poll_ready(cx) {
            std::task::Poll::Ready(Ok(())) => self.pods.poll_ready(cx),
            other => other,
        }
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if req.uri().path() == "/api/v1/pods" {
            self.pods.call(req)
        } else {
            self.main.call(req)
        }
    }
}

/// [`kube_with`], with the pods' requests on a second handle.
fn kube_with_pods(spec: KubeSpec, identity: &str) -> (Kube, Handle, Handle) {
    let (main, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (pods, pods_handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(ByPath { main, pods }, "inference");
    (
        Kube::new(client, spec, identity.into(), false),
        handle,
        pods_handle,
    )
}

/// The pods' side of the API server: every list answered with `items`
/// (one page), every watch held open with nothing to say.
fn pods_api(handle: Handle, items: Value) -> tokio::task::JoinHandle<()> {
    pods_api_with(handle, items, Vec::new())
}

/// [`pods_api`], the first watch answered with `events` (watch events,
/// one JSON object a line) before it ends; later watches held open.
fn pods_api_with(
    mut handle: Handle,
    items: Value,
    events: Vec<Value>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut held = Vec::new();
        let mut events = Some(events).filter(|e| !e.is_empty());
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path_and_query().unwrap().to_string();
            SENT.lock()
                .unwrap()
                .push(("GET".into(), path.clone(), String::new()));
            assert!(
                path.contains(&format!("fieldSelector={PODS_FIELDS}")),
                "{path}"
            );
            if path.contains("watch=true") {
                if let Some(events) = events.take() {
                    let lines: String = events.iter().map(|e| format!("{e}\n")).collect();
                    send.send_response(
                        Response::builder()
                            .status(200)
                            .header("content-type", "application/json")
                            .body(Body::from(lines.into_bytes()))
                            .unwrap(),
                    );
                } else {
                    held.push(send);
                }
                continue;
            }
            assert!(path.contains("limit=500"), "{path}");
            answer(
                send,
                200,
                &json!({"apiVersion": "v1", "kind": "PodList",
                        "metadata": {"resourceVersion": "5"}, "items": items}),
            );
        }
    })
}

/// The pods' field selector, as sent: bound to a node, not finished.
const PODS_FIELDS: &str =
    "spec.nodeName%21%3D%2Cstatus.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed";

/// A Kubernetes backend over the mock, in front of a stand-in gateway.
async fn backend_with(spec: KubeSpec, identity: &str) -> (Backend, Handle, common::StandIn) {
    let (k, handle) = kube_with(spec, identity, false);
    let (gw, gw_state) = common::stand_in_gateway(common::quiet()).await;
    let backend = Backend::Kube(KubeBackend::new(
        k,
        gpuscale_autoscaler::observe::GatewayClient::new(&gw),
    ));
    (backend, handle, gw_state)
}

fn status_reply(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code, "message": reason})
}

/// Takes the next request, checks method and path (with query), returns
/// its JSON body (Null when empty) and answers `status` with `reply`.
async fn expect(
    handle: &mut Handle,
    method: Method,
    path: &str,
    status: u16,
    reply: Value,
) -> Value {
    expect_after(handle, method, path, status, reply, Duration::ZERO).await
}

/// As [`expect`], answering after `delay` (a slow API server).
async fn expect_after(
    handle: &mut Handle,
    method: Method,
    path: &str,
    status: u16,
    reply: Value,
    delay: Duration,
) -> Value {
    let (req, send) = handle.next_request().await.expect("a request");
    assert_eq!(req.method(), method, "{}", req.uri());
    assert_eq!(
        req.uri().path_and_query().map(|p| p.as_str()),
        Some(path),
        "{method} path"
    );
    let content_type = req
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string());
    SENT.lock().unwrap().push((
        method.to_string(),
        path.to_string(),
        content_type.clone().unwrap_or_default(),
    ));
    let bytes = req.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        let mut v: Value = serde_json::from_slice(&bytes).unwrap();
        if let Some(ct) = content_type {
            v["__content_type"] = ct.into();
        }
        v
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap(),
    );
    body
}

/// No request reaches the mock within `ms`.
async fn silent(handle: &mut Handle, ms: u64, why: &str) {
    if let Ok(Some((req, _))) =
        tokio::time::timeout(Duration::from_millis(ms), handle.next_request()).await
    {
        panic!("{why}: {} {}", req.method(), req.uri());
    }
}

fn model() -> Model {
    model_named("llama", "meta-llama/Llama-3.1-8B-Instruct")
}

fn model_named(name: &str, served: &str) -> Model {
    let text = format!(
        "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: {name}\nspec:\n  servedName: {served}\n  resources:\n    memoryGiB: 21\n    compute: 0.3\n    maxConcurrency: 32\n"
    );
    gpuscale_policies::load::load_sources(&[(Path::new("m.yaml"), text.as_str())])
        .unwrap()
        .models
        .remove(0)
}

fn rec() -> Recommendation {
    Recommendation {
        replicas: 5,
        reason: "40 waiting + 0 in flight over target 8/replica → 5 replicas (activated from zero)"
            .into(),
        mode: Mode::Activating,
    }
}

fn change(m: &Model, from: u32) -> Change {
    Change {
        model: m.clone(),
        from,
        rec: rec(),
        memory: None,
        spares: 0,
    }
}

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler";
const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/inference/leases?";
const OWNED: &str = "/apis/apps/v1/namespaces/inference/deployments?&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dgpuscale";
/// The nodes with a MIG hand-off (in the managed pool or not: one that
/// left it mid-hand-off is still the controller's to undo).
const HANDOFFS: &str = "/api/v1/nodes?&labelSelector=gpuscale.io%2Fmig-handoff&limit=500";
/// The EndpointSlices of the models' Services, one list call for them all
/// (`kubernetes.io/service-name in (gpuscale-llama)`).
const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=kubernetes.io%2Fservice-name+in+%28gpuscale-llama%29";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/inference/events?";
/// Events about Nodes: the API server takes them only in `default`.
const NODE_EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/default/events?";
const STATUS: &str = "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama/status?";
const SERVICE: &str =
    "/api/v1/namespaces/inference/services/gpuscale-llama?&force=true&fieldManager=gpuscale";

/// The read of a model's Service that comes before its first apply in a
/// process (absent here): one gpuscale did not create is left alone.
async fn service_absent(handle: &mut Handle, model: &str) {
    expect(
        handle,
        Method::GET,
        &format!("/api/v1/namespaces/inference/services/gpuscale-{model}"),
        404,
        status_reply(404, "NotFound"),
    )
    .await;
}

fn lease(holder: &str, renewed: &str, rv: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": "gpuscale-autoscaler", "namespace": "inference", "resourceVersion": rv},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                    "acquireTime": renewed, "renewTime": renewed, "leaseTransitions": 2}})
}

/// No lease yet: read (404), then created, naming `identity`.
async fn lease_created(handle: &mut Handle, identity: &str) -> Value {
    expect(
        handle,
        Method::GET,
        LEASE,
        404,
        status_reply(404, "NotFound"),
    )
    .await;
    let body = expect(
        handle,
        Method::POST,
        LEASES,
        201,
        lease(identity, "2026-11-29T18:20:01.000000Z", "1"),
    )
    .await;
    assert_eq!(body["spec"]["holderIdentity"], identity);
    body
}

/// A DeploymentList of (name, spec.replicas) for model `llama`, made by
/// gpuscale.
fn deployments(items: &[(&str, u32)]) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|(name, n)| {
            json!({"metadata": {"name": name, "labels": {"gpuscale.io/model": "llama", "app.kubernetes.io/managed-by": "gpuscale"}},
                   "spec": {"replicas": n, "selector": {"matchLabels": {"gpuscale.io/variant": name}},
                            "template": {"metadata": {}}}})
        })
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {}, "items": items})
}

fn no_nodes() -> Value {
    json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": []})
}

fn slices(addresses: &[&str]) -> Value {
    let endpoints: Vec<Value> = addresses
        .iter()
        .map(|a| json!({"addresses": [a], "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
           "items": [{"metadata": {"name": "gpuscale-llama-abc", "labels": {"kubernetes.io/service-name": "gpuscale-llama"}}, "addressType": "IPv4",
                      "ports": [{"name": "http", "port": 8000}], "endpoints": endpoints}]})
}

/// The reads of a leader's tick after the election: the Deployments it
/// owns (`replicas` in `llama`), the MIG hand-offs (none), the
/// EndpointSlices (`addresses`).
async fn leader_reads(handle: &mut Handle, replicas: u32, addresses: &[&str]) {
    expect(
        handle,
        Method::GET,
        OWNED,
        200,
        deployments(&[("llama", replicas)]),
    )
    .await;
    expect(handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
    expect(handle, Method::GET, SLICES, 200, slices(addresses)).await;
}

fn scale_reply(replicas: u32) -> Value {
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
           "metadata": {"name": "llama-h100-80gb-3g-40gb", "namespace": "inference"},
           "spec": {"replicas": replicas}, "status": {"replicas": 1}})
}

/// A first tick as the leader: the lease taken, `llama`'s one replica
/// read, its policy's memory (none), no hand-off, the EndpointSlices
/// (`addresses`).
async fn taking_over(handle: &mut Handle, addresses: &[&str]) {
    lease_created(handle, "gpuscale-0").await;
    expect(
        handle,
        Method::GET,
        OWNED,
        200,
        deployments(&[("llama", 1)]),
    )
    .await;
    policy_read(handle).await;
    expect(handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
    expect(handle, Method::GET, SLICES, 200, slices(addresses)).await;
}

/// The read of the policy's status (the memory a last leader left; none
/// here) that a controller makes on becoming leader.
async fn policy_read(handle: &mut Handle) {
    expect(
        handle,
        Method::GET,
        "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama",
        200,
        policy_reply(),
    )
    .await;
}

fn policy_reply() -> Value {
    json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "metadata": {"name": "llama"},
           "spec": {"resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}})
}

fn event_reply() -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "llama.1"},
           "eventTime": "2026-11-29T18:20:01.000000Z"})
}

async fn scale_is_a_merge_patch_of_the_scale_subresource() {
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        let body = expect(
            &mut handle,
            Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/llama-h100-80gb-3g-40gb/scale?",
            200,
            scale_reply(5),
        )
        .await;
        assert_eq!(
            body,
            json!({"spec": {"replicas": 5}, "__content_type": "application/merge-patch+json"})
        );
    });
    assert_eq!(k.scale("llama-h100-80gb-3g-40gb", 5).await.unwrap(), None);
    server.await.unwrap();
}

async fn a_variant_is_a_server_side_applied_deployment_requesting_its_device() {
    let (k, mut handle) = kube(false);
    let variant = Variant {
        name: "llama-h100-80gb-3g-40gb".into(),
        gpu_model: "H100-80GB".into(),
        resources: [("nvidia.com/mig-3g.40gb".to_string(), 1)].into(),
        node_selector: [(
            "nvidia.com/gpu.product".to_string(),
            "NVIDIA-H100-80GB-HBM3".to_string(),
        )]
        .into(),
        annotations: Default::default(),
        labels: Default::default(),
        node_affinity: None,
        replicas: 3,
        spares: 0,
        tensor_parallel: 1,
        memory_fraction: None,
    };
    let server = tokio::spawn(async move {
        let body = expect(
            &mut handle,
            Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/llama-h100-80gb-3g-40gb?&force=true&fieldManager=gpuscale",
            200,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama-h100-80gb-3g-40gb"}}),
        )
        .await;
        assert_eq!(body["__content_type"], "application/apply-patch+yaml");
        assert_eq!(body["kind"], "Deployment");
        assert_eq!(body["metadata"]["labels"]["gpuscale.io/model"], "llama");
        let pod = &body["spec"]["template"]["spec"];
        assert_eq!(
            pod["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/mig-3g.40gb": "1", "cpu": "8", "memory": "32Gi"})
        );
        assert_eq!(
            pod["containers"][0]["args"],
            json!([
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--port",
                "8000"
            ])
        );
        assert_eq!(
            pod["nodeSelector"]["nvidia.com/gpu.product"],
            "NVIDIA-H100-80GB-HBM3"
        );
        assert!(
            body["spec"].get("replicas").is_none(),
            "replicas are /scale's"
        );
        // The Pod Security Standards' restricted profile: non-root, no
        // escalation, no capabilities, the runtime's seccomp profile; and
        // a read-only root filesystem, no API token, no service links.
        let c = &pod["containers"][0];
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        assert_eq!(pod["securityContext"]["runAsUser"], 65532);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(pod["enableServiceLinks"], false);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
        // Writable caches and scratch, and a memory-backed /dev/shm for the
        // workers' shared memory.
        assert_eq!(
            pod["volumes"],
            json!([
                {"name": "cache", "emptyDir": {"sizeLimit": "40Gi"}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}},
            ])
        );
        assert_eq!(
            c["volumeMounts"],
            json!([
                {"name": "cache", "mountPath": "/cache"},
                {"name": "tmp", "mountPath": "/tmp"},
                {"name": "shm", "mountPath": "/dev/shm"},
            ])
        );
        assert_eq!(c["env"][0], json!({"name": "HOME", "value": "/cache"}));
        assert_eq!(
            c["env"][2],
            json!({"name": "HF_HOME", "value": "/cache/huggingface"})
        );
        assert_eq!(c["env"].as_array().unwrap().len(), 4, "no token configured");
        // 15 minutes to download and load (90 × 10 s), then live and
        // ready on /health.
        assert_eq!(
            c["startupProbe"],
            json!({"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 90})
        );
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/health");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/health");
        assert_eq!(
            c["lifecycle"]["preStop"]["exec"]["command"],
            json!(["sleep", "20"])
        );
    });
    assert_eq!(k.apply_deployment(&model(), &variant).await.unwrap(), None);
    server.await.unwrap();
}

/// A tensor-parallel replica on whole GPUs is told its GPU count; the
/// Hugging Face token is a file from its Secret, the cache a shared
/// claim, and the user the configured one.
async fn a_tensor_parallel_variant_gets_its_size_and_its_token_and_cache_as_files() {
    let spec = KubeSpec {
        hf_token_secret: Some("hf-token".into()),
        model_cache_claim: Some("hf-cache".into()),
        run_as_user: 1000,
        startup_timeout: Duration::from_secs(45 * 60),
        ..spec()
    };
    let (k, mut handle) = kube_with(spec, "gpuscale-0", false);
    let variant = Variant {
        name: "llama-h100-80gb-tp2".into(),
        gpu_model: "H100-80GB".into(),
        resources: [("nvidia.com/gpu".to_string(), 2)].into(),
        node_selector: Default::default(),
        annotations: Default::default(),
        // The plan's opt-out of HAMi's webhook and its node affinity (off
        // HAMi's nodes and a gang's node) reach the pod template.
        labels: [("hami.io/webhook".to_string(), "ignore".to_string())].into(),
        node_affinity: Some(
            serde_json::from_value(json!({
                "matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["on"]}],
                "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}],
            }))
            .unwrap(),
        ),
        replicas: 1,
        spares: 0,
        tensor_parallel: 2,
        memory_fraction: None,
    };
    let server = tokio::spawn(async move {
        let body = expect(
            &mut handle,
            Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/llama-h100-80gb-tp2?&force=true&fieldManager=gpuscale",
            200,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama-h100-80gb-tp2"}}),
        )
        .await;
        let pod = &body["spec"]["template"]["spec"];
        // The plan sized the devices exactly: one old pod out first.
        assert_eq!(
            body["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
        );
        let labels = &body["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["hami.io/webhook"], "ignore");
        assert_eq!(labels["gpuscale.io/variant"], "llama-h100-80gb-tp2");
        assert_eq!(
            body["spec"]["selector"],
            json!({"matchLabels": {"gpuscale.io/variant": "llama-h100-80gb-tp2"}})
        );
        assert_eq!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!({"nodeSelectorTerms": [{
                "matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["on"]}],
                "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}],
            }]})
        );
        let c = &pod["containers"][0];
        assert_eq!(
            c["args"],
            json!([
                "--model",
                "meta-llama/Llama-3.1-8B-Instruct",
                "--port",
                "8000",
                "--tensor-parallel-size",
                "2"
            ])
        );
        // Host CPU and memory per GPU held: twice the defaults for two.
        assert_eq!(
            c["resources"],
            json!({
                "requests": {"cpu": "8", "memory": "32Gi"},
                "limits": {"nvidia.com/gpu": "2", "cpu": "16", "memory": "64Gi"},
            })
        );
        let volumes = pod["volumes"].as_array().unwrap();
        assert_eq!(
            volumes[3..],
            [
                json!({"name": "hf-token", "secret": {"secretName": "hf-token", "items": [{"key": "token", "path": "token"}]}}),
                json!({"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}),
            ]
        );
        let mounts = c["volumeMounts"].as_array().unwrap();
        assert_eq!(
            mounts[3..],
            [
                json!({"name": "hf-token", "mountPath": "/var/run/secrets/huggingface", "readOnly": true}),
                json!({"name": "model-cache", "mountPath": "/cache/huggingface"}),
            ]
        );
        // The token is a file the Hugging Face client reads, never a value
        // in the manifest.
        assert_eq!(
            c["env"][4],
            json!({"name": "HF_TOKEN_PATH", "value": "/var/run/secrets/huggingface/token"})
        );
        assert_eq!(pod["securityContext"]["runAsUser"], 1000);
        assert_eq!(c["securityContext"]["runAsUser"], 1000);
        assert_eq!(c["startupProbe"]["failureThreshold"], 270);
    });
    assert_eq!(k.apply_deployment(&model(), &variant).await.unwrap(), None);
    server.await.unwrap();
}

/// A replica the packer puts on a time-sliced MIG slice becomes a
/// Deployment asking for a share of that profile
/// (`nvidia.com/mig-1g.10gb.shared`) on nodes whose device-plugin config
/// time-slices it that many ways, and nowhere else.
async fn a_time_sliced_mig_variant_asks_for_a_share_on_nodes_sliced_that_way() {
    let text = "\
apiVersion: gpuscale.io/v1alpha1
kind: Cluster
metadata:
  name: c
spec:
  nodes:
    - {name: h100-0, gpuModel: H100-80GB, gpuCount: 2, sharing: [mig, mig-timeslice]}
---
apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata:
  name: embed
spec:
  resources: {memoryGiB: 2.5, compute: 0.02, maxConcurrency: 64}
  placement: {sharing: [mig, mig-timeslice]}
";
    let bundle = gpuscale_policies::load::load_sources(&[(Path::new("c.yaml"), text)]).unwrap();
    // 21 fit one GPU only as seven 1g.10gb instances three ways each.
    let demand = [("embed".to_string(), 21)].into();
    let plan = gpuscale_packer::pack(
        bundle.cluster.as_ref().unwrap(),
        &bundle.models,
        &demand,
        &gpuscale_packer::PackOptions::default(),
    )
    .unwrap();
    assert_eq!(plan.gpus_used, 1);
    let variant = plan.models[0].variants[0].clone();
    assert_eq!(plan.models[0].variants.len(), 1);
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        let body = expect(
            &mut handle,
            Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/embed-h100-80gb-mig-1g-10gb-timeslice-3?&force=true&fieldManager=gpuscale",
            200,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "embed-h100-80gb-mig-1g-10gb-timeslice-3"}}),
        )
        .await;
        let pod = &body["spec"]["template"]["spec"];
        assert_eq!(
            pod["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/mig-1g.10gb.shared": "1", "cpu": "8", "memory": "32Gi"})
        );
        // The variant's selectors and the managed pool's labels
        // (`nodeSelector`): a replica never lands on a GPU node gpuscale
        // was not given.
        assert_eq!(
            pod["nodeSelector"],
            json!({
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/device-plugin.config": "mig-1g.10gb-timeslice-3",
                "nvidia.com/gpu.present": "true",
                "gpuscale.io/managed": "true",
            })
        );
        // GPU nodes tainted `nvidia.com/gpu:NoSchedule` take it.
        assert_eq!(
            pod["tolerations"],
            json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
        );
        // Time-slicing isolates no memory, and vLLM would take 90 % of
        // the slice: each of the 3 takes (1 − 0.1 headroom) / 3 of it
        // (vLLM's `--gpu-memory-utilization` is per instance).
        assert_eq!(
            pod["containers"][0]["args"],
            json!([
                "--model",
                "embed",
                "--port",
                "8000",
                "--gpu-memory-utilization",
                "0.300"
            ])
        );
    });
    assert_eq!(
        k.apply_deployment(&bundle.models[0], &variant)
            .await
            .unwrap(),
        None
    );
    server.await.unwrap();
}

async fn a_fractional_variant_requests_hamis_resources_and_carries_its_annotations() {
    let (k, mut handle) = kube(false);
    let variant = Variant {
        name: "llama-h100-80gb-fractional".into(),
        gpu_model: "H100-80GB".into(),
        resources: [
            ("nvidia.com/gpu".to_string(), 1),
            ("nvidia.com/gpumem".to_string(), 21_463),
            ("nvidia.com/gpucores".to_string(), 35),
        ]
        .into(),
        node_selector: [
            (
                "nvidia.com/gpu.product".to_string(),
                "NVIDIA-H100-80GB-HBM3".to_string(),
            ),
            ("gpu".to_string(), "on".to_string()),
        ]
        .into(),
        annotations: [
            (
                "hami.io/gpu-scheduler-policy".to_string(),
                "binpack".to_string(),
            ),
            (
                "nvidia.com/use-gpuuuid".to_string(),
                "GPU-aaaa,GPU-bbbb".to_string(),
            ),
        ]
        .into(),
        labels: Default::default(),
        node_affinity: None,
        replicas: 2,
        spares: 0,
        tensor_parallel: 1,
        memory_fraction: None,
    };
    let server = tokio::spawn(async move {
        let body = expect(
            &mut handle,
            Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/llama-h100-80gb-fractional?&force=true&fieldManager=gpuscale",
            200,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama-h100-80gb-fractional"}}),
        )
        .await;
        let template = &body["spec"]["template"];
        // HAMi reads its annotations from the pod, so they are on the
        // template, not on the Deployment.
        assert_eq!(
            template["metadata"]["annotations"],
            json!({"hami.io/gpu-scheduler-policy": "binpack", "nvidia.com/use-gpuuuid": "GPU-aaaa,GPU-bbbb"})
        );
        // On the Deployment, only the digest of what it was applied with.
        let annotations = body["metadata"]["annotations"].as_object().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["gpuscale.io/template"]
        );
        assert_eq!(
            template["spec"]["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "21463", "nvidia.com/gpucores": "35", "cpu": "8", "memory": "32Gi"})
        );
        assert_eq!(template["spec"]["nodeSelector"]["gpu"], "on");
        // Pinned to its GPUs: a surge pod would wait for a GPU the old
        // pods hold, so one old pod goes first (as for every variant).
        assert_eq!(
            body["spec"]["strategy"],
            json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
        );
    });
    assert_eq!(k.apply_deployment(&model(), &variant).await.unwrap(), None);
    server.await.unwrap();
}
async fn a_decision_event_and_the_status_patch() {
    let (k, mut handle) = kube(false);
    let now = Duration::from_secs(1_795_976_401);
    let memory = ScalingMemory {
        recommendations: vec![TimedReplicas {
            time: "2026-11-29T18:20:01.000Z".into(),
            replicas: 5,
        }],
        scale_up_events: vec![RememberedScaleEvent {
            time: "2026-11-29T18:20:01.000Z".into(),
            change: 5,
            outdated: false,
        }],
        scale_down_events: vec![],
    };
    let server = tokio::spawn(async move {
        let ev = expect(&mut handle, Method::POST, EVENTS, 201, event_reply()).await;
        assert_eq!(ev["metadata"]["generateName"], "llama.");
        assert_eq!(ev["regarding"]["kind"], "ModelPolicy");
        assert_eq!(ev["regarding"]["name"], "llama");
        assert_eq!(ev["reason"], "Activating");
        assert_eq!(ev["action"], "Scale");
        assert_eq!(ev["type"], "Normal");
        assert_eq!(ev["reportingController"], "gpuscale.io/gpuscale");
        assert_eq!(ev["reportingInstance"], "gpuscale-0");
        assert_eq!(ev["eventTime"], "2026-11-29T18:20:01.000000Z");
        assert!(ev["note"].as_str().unwrap().contains("→ 5 replicas"));
        let status = expect(&mut handle, Method::PATCH, STATUS, 200, policy_reply()).await;
        assert_eq!(status["status"]["currentReplicas"], 0);
        assert_eq!(status["status"]["desiredReplicas"], 5);
        assert_eq!(status["status"]["lastDecision"]["replicas"], 5);
        assert_eq!(
            status["status"]["lastDecision"]["time"],
            "2026-11-29T18:20:01Z"
        );
        assert_eq!(status["__content_type"], "application/merge-patch+json");
        // The recommender's memory rides along, for the next leader.
        assert_eq!(
            status["status"]["scalingMemory"]["recommendations"],
            json!([{"time": "2026-11-29T18:20:01.000Z", "replicas": 5}])
        );
        assert_eq!(
            status["status"]["scalingMemory"]["scaleUpEvents"],
            json!([{"time": "2026-11-29T18:20:01.000Z", "change": 5, "outdated": false}])
        );
    });
    let ev = gpuscale_autoscaler::kubernetes::event("llama", &rec(), &spec(), "gpuscale-0", now);
    assert_eq!(k.emit(&ev).await.unwrap(), None);
    assert_eq!(
        k.status("llama", 0, &rec(), now, Some(&memory))
            .await
            .unwrap(),
        None
    );
    server.await.unwrap();
}

/// The API limits a note to 1,024 bytes; reasons hold `→` (3 bytes) and
/// `×` (2 bytes), so a cut by characters overflows.
/// A variant's spare replicas are annotated on its Deployment, and the
/// count read back from the Deployments leaves them out: a restarted
/// controller starts from the decision, not from decision + spares.
#[test]
fn a_variants_spares_are_annotated_and_left_out_of_the_count_read_back() {
    use gpuscale_autoscaler::handover::{VariantNow, decided};
    use gpuscale_autoscaler::kubernetes::{SPARES, deployment, owned_deployments};
    let variant = |spares: u32| Variant {
        name: "llama-h100-80gb-fractional".into(),
        gpu_model: "H100-80GB".into(),
        resources: [("nvidia.com/gpu".to_string(), 1)].into(),
        node_selector: Default::default(),
        annotations: Default::default(),
        labels: Default::default(),
        node_affinity: None,
        replicas: 3,
        spares,
        tensor_parallel: 1,
        memory_fraction: None,
    };
    let d = deployment(&model(), &variant(1), &spec());
    let annotations = d.metadata.annotations.clone().unwrap();
    assert_eq!(annotations.get(SPARES).map(String::as_str), Some("1"));
    // Without spares, no annotation (an apply without it removes it).
    assert!(
        !deployment(&model(), &variant(0), &spec())
            .metadata
            .annotations
            .unwrap()
            .contains_key(SPARES)
    );

    // Read back at its three replicas: two decided, one spare.
    let mut live = d;
    live.spec.as_mut().unwrap().replicas = Some(3);
    let owned = owned_deployments(&[live]);
    assert_eq!((owned[0].replicas, owned[0].spares), (3, 1));
    let now: Vec<VariantNow> = owned.iter().map(VariantNow::from).collect();
    assert_eq!(decided(&now), 2);
}

#[test]
fn a_policys_selector_labels_every_pod_of_its_variants_and_selects_nothing() {
    // `spec.selector.matchLabels`, through a real plan: the pods carry
    // them; the Deployment's own labels and its selector stay gpuscale's.
    use gpuscale_autoscaler::kubernetes::deployment;
    let files = [
        (
            Path::new("m.yaml"),
            "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: llama\nspec:\n  selector:\n    matchLabels: {team: chat, app.kubernetes.io/name: llama}\n  resources:\n    memoryGiB: 21\n    compute: 0.3\n    maxConcurrency: 32\n",
        ),
        (
            Path::new("c.yaml"),
            "apiVersion: gpuscale.io/v1alpha1\nkind: Cluster\nmetadata:\n  name: c\nspec:\n  nodes:\n    - {name: n0, gpuModel: H100-80GB, gpuCount: 2}\n",
        ),
    ];
    let bundle = gpuscale_policies::load::load_sources(&files).unwrap();
    let plan = gpuscale_packer::pack(
        bundle.cluster.as_ref().unwrap(),
        &bundle.models,
        &[("llama".to_string(), 2)].into(),
        &Default::default(),
    )
    .unwrap();
    let variants = &plan.models[0].variants;
    assert!(!variants.is_empty());
    for v in variants {
        let d = deployment(&bundle.models[0], v, &spec());
        let body = serde_json::to_value(&d).unwrap();
        let pod = &body["spec"]["template"]["metadata"]["labels"];
        assert_eq!(pod["team"], "chat", "{pod}");
        assert_eq!(pod["app.kubernetes.io/name"], "llama", "{pod}");
        assert_eq!(pod["gpuscale.io/model"], "llama", "{pod}");
        assert_eq!(pod["gpuscale.io/variant"], v.name.as_str(), "{pod}");
        assert_eq!(
            body["spec"]["selector"],
            json!({"matchLabels": {"gpuscale.io/variant": v.name}})
        );
        assert!(body["metadata"]["labels"].get("team").is_none());
    }
}

#[test]
fn an_event_note_is_cut_at_1024_bytes_on_a_character_boundary() {
    use gpuscale_autoscaler::kubernetes::note;
    let long = "a → b × ".repeat(200);
    let n = note(&long);
    assert!(n.len() <= 1024, "{} bytes", n.len());
    assert!(n.len() >= 1021);
    assert!(long.starts_with(&n));
    assert_eq!(note("short → ok"), "short → ok");
}

/// Events per object are rate-limited as client-go's recorder does it:
/// 25 at once, then one per 5 minutes.
#[test]
fn events_per_object_are_rate_limited_like_client_go() {
    use gpuscale_autoscaler::kubernetes::EventBudget;
    let mut b = EventBudget::default();
    let t = Duration::from_secs(1_000);
    let sent = (0..40).filter(|_| b.take("ModelPolicy/llama", t)).count();
    assert_eq!(sent, 25);
    assert!(b.take("ModelPolicy/other", t), "each object has its own");
    assert!(!b.take("ModelPolicy/llama", t + Duration::from_secs(299)));
    assert!(b.take("ModelPolicy/llama", t + Duration::from_secs(600)));
}

async fn dry_run_sends_no_write() {
    let (k, mut handle) = kube(true);
    let w = k
        .scale("d", 3)
        .await
        .unwrap()
        .expect("the write it would make");
    assert_eq!(w.method, "PATCH");
    assert_eq!(
        w.path,
        "/apis/apps/v1/namespaces/inference/deployments/d/scale"
    );
    assert_eq!(w.body, json!({"spec": {"replicas": 3}}));
    assert!(
        k.status("llama", 1, &rec(), Duration::ZERO, None)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        k.patch_node("n", json!({"spec": {"unschedulable": true}}))
            .await
            .unwrap()
            .is_some()
    );
    assert!(k.apply_service(&model()).await.unwrap().is_some());
    // Nothing reached the API server.
    drop(k);
    assert!(handle.next_request().await.is_none());
}

/// The EndpointSlices of the model's Service (selected by
/// `kubernetes.io/service-name`, as the API documents): the `http` port
/// whatever its position, an endpoint without a `ready` condition counted
/// ready (the API says to read unknown as ready), IPv6 bracketed.
async fn endpoint_slices_give_the_ready_replicas() {
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            SLICES,
            200,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
                   "items": [{"metadata": {"name": "a", "labels": {"kubernetes.io/service-name": "gpuscale-llama"}}, "addressType": "IPv4",
                              "ports": [{"name": "metrics", "port": 9400}, {"name": "http", "port": 8000}],
                              "endpoints": [
                                  {"addresses": ["10.0.0.7"], "conditions": {"ready": true}},
                                  {"addresses": ["10.0.0.8"], "conditions": {"ready": false}},
                                  {"addresses": ["10.0.0.9"]},
                                  {"addresses": ["10.0.0.5"], "conditions": {"ready": true}}]},
                             {"metadata": {"name": "b", "labels": {"kubernetes.io/service-name": "gpuscale-llama"}}, "addressType": "IPv6",
                              "ports": [{"name": "http", "port": 8000}],
                              "endpoints": [{"addresses": ["fd00::7"], "conditions": {"ready": true}},
                                            {"addresses": ["FD00:0:0::8"], "conditions": {"ready": true}},
                                            {"addresses": ["::ffff:10.0.0.6"], "conditions": {"ready": true}}]}]}),
        )
        .await;
    });
    assert_eq!(
        k.endpoints("llama").await.unwrap(),
        // Spelt as the gateway writes them: IPv6 canonical, IPv4-mapped
        // as IPv4.
        [
            "http://10.0.0.5:8000",
            "http://10.0.0.6:8000",
            "http://10.0.0.7:8000",
            "http://10.0.0.9:8000",
            "http://[fd00::7]:8000",
            "http://[fd00::8]:8000"
        ]
    );
    server.await.unwrap();
    assert!(ready_endpoints(&[]).is_empty());
}

/// The EndpointSlices of many models' Services: one list call per 50
/// Services (a set-based selector), each slice given to its Service by
/// its `kubernetes.io/service-name` label; a slice of another Service in
/// the answer is no model's; a model with no slice has no endpoint.
async fn many_models_endpoints_take_one_list_per_fifty_services() {
    let (k, mut handle) = kube(false);
    let models: Vec<String> = (0..51).map(|i| format!("m{i:02}")).collect();
    let slice = |service: &str, address: &str| {
        json!({"metadata": {"name": format!("{service}-x"), "labels": {"kubernetes.io/service-name": service}},
               "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}],
               "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]})
    };
    let first: Vec<String> = models[..50]
        .iter()
        .map(|m| format!("gpuscale-{m}"))
        .collect();
    let first_path = format!(
        "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=kubernetes.io%2Fservice-name+in+%28{}%29",
        first.join("%2C")
    );
    let items = json!([
        slice("gpuscale-m00", "10.0.0.1"),
        slice("gpuscale-m07", "10.0.0.7"),
        slice("gpuscale-m07", "10.0.0.8"),
        slice("someone-else", "10.9.9.9")
    ]);
    let server = tokio::spawn(async move {
        expect(&mut handle, Method::GET, &first_path, 200,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {}, "items": items})).await;
        expect(&mut handle, Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=kubernetes.io%2Fservice-name+in+%28gpuscale-m50%29",
            200,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
                   "items": [slice("gpuscale-m50", "10.0.5.0")]})).await;
        handle
    });
    let names: Vec<&str> = models.iter().map(String::as_str).collect();
    let found = k.endpoints_of(&names).await.unwrap();
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "a third list").await;
    assert_eq!(found.len(), 51);
    assert_eq!(found["m00"], ["http://10.0.0.1:8000"]);
    assert_eq!(
        found["m07"],
        ["http://10.0.0.7:8000", "http://10.0.0.8:8000"]
    );
    assert_eq!(found["m50"], ["http://10.0.5.0:8000"]);
    assert!(found["m01"].is_empty());
    assert!(!found.values().flatten().any(|e| e.contains("10.9.9.9")));
}

/// Start-up waits only for what waiting can mend: a 503 or a 429 is
/// transient, a refusal (403: RBAC; 404: no CRD) or a list that is not
/// JSON is final at once.
async fn only_the_servers_own_trouble_is_worth_waiting_for() {
    let path = "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies?";
    for (code, reply, transient) in [
        (503, status_reply(503, "ServiceUnavailable"), true),
        (429, status_reply(429, "TooManyRequests"), true),
        (500, status_reply(500, "InternalError"), true),
        (403, status_reply(403, "Forbidden"), false),
        (404, status_reply(404, "NotFound"), false),
        (401, status_reply(401, "Unauthorized"), false),
        (200, json!("not a list"), false),
    ] {
        let (k, mut handle) = kube(false);
        let server =
            tokio::spawn(async move { expect(&mut handle, Method::GET, path, code, reply).await });
        let err = k.policies().await.expect_err("an error");
        server.await.unwrap();
        assert_eq!(err.transient(), transient, "{code}: {err}");
    }
}

/// Policies are decoded one by one: one that does not decode is reported
/// by name, and the others are still read.
async fn a_policy_that_does_not_decode_does_not_fail_the_list() {
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies?",
            200,
            json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicyList", "metadata": {},
                   "items": [
                       {"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "metadata": {"name": "good"},
                        "spec": {"resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}},
                       {"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "metadata": {"name": "bad"},
                        "spec": {"resources": {"memoryGiB": "lots"}}}]}),
        )
        .await;
    });
    let listed = k.policies().await.unwrap();
    server.await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        listed[0].as_ref().unwrap().metadata.name.as_deref(),
        Some("good")
    );
    let (name, why) = listed[1].as_ref().unwrap_err();
    assert_eq!(name, "bad");
    assert!(
        why.contains("memoryGiB") || why.contains("invalid type"),
        "{why}"
    );
}

/// A controller that starts finds the gateway holding a registration no
/// EndpointSlice shows ready (its pod went while no controller ran, so
/// nothing in memory says it was registered): it is removed, and the
/// ready pod registered.
async fn a_registration_no_slice_shows_is_removed_after_a_restart() {
    let (mut backend, mut handle, gw_state) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    gw_state.replicas.lock().unwrap().insert(
        m.served_name.clone(),
        ["http://10.0.0.9:8000".to_string()].into(),
    );
    let server = tokio::spawn(async move {
        taking_over(&mut handle, &["10.0.0.7"]).await;
        handle
    });
    let observed = backend.tick(std::slice::from_ref(&m), now).await;
    server.await.unwrap();
    assert!(observed.took_over);
    assert_eq!(
        gw_state.seen.lock().unwrap().as_slice(),
        [
            r#"POST {"endpoint":"http://10.0.0.7:8000","maxConcurrency":32,"model":"meta-llama/Llama-3.1-8B-Instruct"}"#,
            r#"DELETE {"endpoint":"http://10.0.0.9:8000","model":"meta-llama/Llama-3.1-8B-Instruct"}"#,
        ]
    );
    assert_eq!(
        gw_state.replicas.lock().unwrap()[&m.served_name],
        ["http://10.0.0.7:8000".to_string()].into()
    );
    // Reported as a repair; the first registration of a ready pod is not.
    assert_eq!(observed.repairs.removed, [("llama".to_string(), 1)].into());
    assert!(observed.repairs.reregistered.is_empty());
    assert!(observed.repairs.replaced.is_empty());
}

/// A tick: take the lease, read the live count, discover the ready pod
/// and hand it to the gateway; the gateway restarts and the next tick
/// registers the pod again; a decision applies the model's Service and
/// Deployment, scales it, and records it.
async fn the_backend_leads_discovers_and_applies_a_decision() {
    let (mut backend, mut handle, gw_state) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);

    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        // Leading: first the live count, then what the last leader
        // remembered (nothing: no status yet).
        expect(
            &mut handle,
            Method::GET,
            OWNED,
            200,
            deployments(&[("llama", 1)]),
        )
        .await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&["10.0.0.7"])).await;
        handle
    });
    let observed = backend.tick(std::slice::from_ref(&m), now).await;
    let mut handle = server.await.unwrap();
    assert!(observed.took_over);
    assert_eq!(observed.replicas["llama"], 1);
    assert!(observed.memory.is_empty());
    assert_eq!(
        gw_state.seen.lock().unwrap().as_slice(),
        [
            r#"POST {"endpoint":"http://10.0.0.7:8000","maxConcurrency":32,"model":"meta-llama/Llama-3.1-8B-Instruct"}"#
        ]
    );
    // Registering a pod that became ready is the normal course, not a
    // repair.
    assert_eq!(observed.repairs, Default::default());
    assert_eq!(backend.ready(std::slice::from_ref(&m))["llama"], 1);

    // The gateway restarts and forgets the replica: the next tick (within
    // the retry period: no lease call) sees it missing from the gateway's
    // list and registers it again.
    gw_state.replicas.lock().unwrap().clear();
    let server = tokio::spawn(async move {
        leader_reads(&mut handle, 1, &["10.0.0.7"]).await;
        handle
    });
    let observed = backend
        .tick(std::slice::from_ref(&m), now + Duration::from_secs(1))
        .await;
    let mut handle = server.await.unwrap();
    assert!(!observed.took_over);
    assert_eq!(gw_state.seen.lock().unwrap().len(), 2);
    assert_eq!(
        observed.repairs.reregistered,
        [("llama".to_string(), 1)].into()
    );
    assert!(observed.repairs.removed.is_empty());
    assert_eq!(
        gw_state.replicas.lock().unwrap()["meta-llama/Llama-3.1-8B-Instruct"].len(),
        1
    );

    // A decision: the model's Service and Deployment applied (the
    // Deployment was listed as gpuscale's: not read again), scaled, then
    // recorded.
    let server = tokio::spawn(async move {
        service_absent(&mut handle, "llama").await;
        let svc = expect(
            &mut handle,
            Method::PATCH,
            SERVICE,
            200,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpuscale-llama"}}),
        )
        .await;
        assert_eq!(svc["spec"]["clusterIP"], "None");
        assert_eq!(
            svc["spec"]["selector"],
            json!({"gpuscale.io/model": "llama"})
        );
        assert_eq!(svc["spec"]["ports"][0]["name"], "http");
        assert_eq!(svc["__content_type"], "application/apply-patch+yaml");
        let d = expect(&mut handle, Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/llama?&force=true&fieldManager=gpuscale", 200,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"}})).await;
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpu": "1", "cpu": "8", "memory": "32Gi"})
        );
        let s = expect(
            &mut handle,
            Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/llama/scale?",
            200,
            scale_reply(5),
        )
        .await;
        assert_eq!(s["spec"]["replicas"], 5);
        expect(&mut handle, Method::POST, EVENTS, 201, event_reply()).await;
        let st = expect(&mut handle, Method::PATCH, STATUS, 200, policy_reply()).await;
        assert_eq!(st["status"]["desiredReplicas"], 5);
        assert_eq!(st["status"]["currentReplicas"], 1);
        handle
    });
    backend.apply(&[change(&m, 1)], None, None, now).await;
    let mut handle = server.await.unwrap();
    assert_eq!(backend.desired()["llama"], 5);

    // The memory goes into the status every 15 s (from the takeover on),
    // not every tick.
    let memory = ScalingMemory {
        recommendations: vec![TimedReplicas {
            time: "2026-11-29T18:20:10.000Z".into(),
            replicas: 5,
        }],
        ..ScalingMemory::default()
    };
    let memories = BTreeMap::from([("llama".to_string(), memory)]);
    backend
        .remember(&memories, now + Duration::from_secs(10))
        .await;
    silent(
        &mut handle,
        100,
        "the memory written before 15 s had passed",
    )
    .await;
    let server = tokio::spawn(async move {
        let st = expect(&mut handle, Method::PATCH, STATUS, 200, policy_reply()).await;
        assert_eq!(
            st["status"]["scalingMemory"]["recommendations"],
            json!([{"time": "2026-11-29T18:20:10.000Z", "replicas": 5}])
        );
        assert_eq!(st["__content_type"], "application/merge-patch+json");
    });
    backend
        .remember(&memories, now + Duration::from_secs(15))
        .await;
    server.await.unwrap();
}

/// With policies given as files there is no ModelPolicy object: every
/// status write is a 404. Scaling does not depend on it: both models are
/// scaled, each after its own failed record.
async fn a_failed_status_write_stops_no_scaling() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let a = model();
    let b = model_named("mistral", "mistralai/Mistral-7B-Instruct-v0.3");
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(&mut handle, Method::GET, OWNED, 200, deployments(&[])).await;
        for p in ["llama", "mistral"] {
            expect(
                &mut handle,
                Method::GET,
                &format!("/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/{p}"),
                404,
                status_reply(404, "NotFound"),
            )
            .await;
        }
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        // One list for both models' Services.
        expect(
            &mut handle,
            Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=kubernetes.io%2Fservice-name+in+%28gpuscale-llama%2Cgpuscale-mistral%29",
            200,
            slices(&[]),
        )
        .await;
        for p in ["llama", "mistral"] {
            service_absent(&mut handle, p).await;
            expect(
                &mut handle,
                Method::PATCH,
                &format!("/api/v1/namespaces/inference/services/gpuscale-{p}?&force=true&fieldManager=gpuscale"),
                200,
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("gpuscale-{p}")}}),
            )
            .await;
            // Not listed as gpuscale's: read first (absent).
            expect(
                &mut handle,
                Method::GET,
                &format!("/apis/apps/v1/namespaces/inference/deployments/{p}"),
                404,
                status_reply(404, "NotFound"),
            )
            .await;
            expect(
                &mut handle,
                Method::PATCH,
                &format!("/apis/apps/v1/namespaces/inference/deployments/{p}?&force=true&fieldManager=gpuscale"),
                201,
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": p}}),
            )
            .await;
            let s = expect(
                &mut handle,
                Method::PATCH,
                &format!("/apis/apps/v1/namespaces/inference/deployments/{p}/scale?"),
                200,
                scale_reply(5),
            )
            .await;
            assert_eq!(s["spec"]["replicas"], 5);
            expect(&mut handle, Method::POST, EVENTS, 201, event_reply()).await;
            expect(
                &mut handle,
                Method::PATCH,
                &format!(
                    "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/{p}/status?"
                ),
                404,
                status_reply(404, "NotFound"),
            )
            .await;
        }
    });
    let models = [a.clone(), b.clone()];
    backend.tick(&models, now).await;
    let failed = backend
        .apply(&[change(&a, 0), change(&b, 0)], None, None, now)
        .await;
    server.await.unwrap();
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(backend.desired()["llama"], 5);
    assert_eq!(backend.desired()["mistral"], 5);
}

/// A Service of the model's Service name that gpuscale did not create
/// (no `managed-by: gpuscale` label) is never applied over: the change
/// fails, nothing is written, and it is tried again next round.
async fn a_service_gpuscale_did_not_create_is_not_taken_over() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let server = tokio::spawn(async move {
        taking_over(&mut handle, &[]).await;
        expect(
            &mut handle,
            Method::GET,
            "/api/v1/namespaces/inference/services/gpuscale-llama",
            200,
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": "gpuscale-llama", "labels": {"app": "someone-else"}},
                   "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}}),
        )
        .await;
        // Said on the policy, as a Deployment of its name would be.
        let ev = expect(&mut handle, Method::POST, EVENTS, 201, event_reply()).await;
        assert_eq!(ev["reason"], "NameInUse");
        assert_eq!(ev["type"], "Warning");
        handle
    });
    refused_change(&mut backend, server, "a write over someone else's Service").await;
}

/// A change whose write fails is reported back, so the controller writes
/// it again next round (its spares too, which move no count), and the
/// count the backend holds stays the one running.
async fn a_change_whose_write_fails_is_reported_for_the_next_round() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let server = tokio::spawn(async move {
        taking_over(&mut handle, &[]).await;
        service_absent(&mut handle, "llama").await;
        expect(
            &mut handle,
            Method::PATCH,
            SERVICE,
            500,
            status_reply(500, "InternalError"),
        )
        .await;
        handle
    });
    refused_change(&mut backend, server, "a write after the failed one").await;
}

/// A first tick, then a change of `llama` to 5 that the mock's side
/// (`server`) refuses: the backend reports it failed, keeps the count
/// that runs, and sends nothing more (`what` would be the stray).
async fn refused_change(
    backend: &mut Backend,
    server: tokio::task::JoinHandle<Handle>,
    what: &str,
) {
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    backend.tick(std::slice::from_ref(&m), now).await;
    let failed = backend.apply(&[change(&m, 1)], None, None, now).await;
    let mut handle = server.await.unwrap();
    assert_eq!(failed, ["llama".to_string()].into());
    assert_eq!(backend.desired()["llama"], 1);
    silent(&mut handle, 100, what).await;
}

/// A Deployment of the variant's name that gpuscale did not create (no
/// `managed-by: gpuscale` label, no ModelPolicy owner) is never applied
/// to or scaled: a Warning Event and a `DeploymentsOwned=False` condition
/// say why.
async fn a_deployment_gpuscale_did_not_create_is_not_adopted() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(&mut handle, Method::GET, OWNED, 200, deployments(&[])).await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        service_absent(&mut handle, "llama").await;
        expect(
            &mut handle,
            Method::PATCH,
            SERVICE,
            200,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpuscale-llama"}}),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            "/apis/apps/v1/namespaces/inference/deployments/llama",
            200,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "llama", "labels": {"app": "llama", "team": "search"}},
                   "spec": {"selector": {"matchLabels": {"app": "llama"}}, "template": {"metadata": {}}}}),
        )
        .await;
        let ev = expect(&mut handle, Method::POST, EVENTS, 201, event_reply()).await;
        assert_eq!(ev["type"], "Warning");
        assert_eq!(ev["reason"], "NameInUse");
        assert!(ev["note"].as_str().unwrap().contains("llama"));
        let st = expect(&mut handle, Method::PATCH, STATUS, 200, policy_reply()).await;
        let c = &st["status"]["conditions"][0];
        assert_eq!(c["type"], "DeploymentsOwned");
        assert_eq!(c["status"], "False");
        assert_eq!(c["reason"], "NameInUse");
        // The decision itself is still recorded.
        expect(&mut handle, Method::POST, EVENTS, 201, event_reply()).await;
        expect(&mut handle, Method::PATCH, STATUS, 200, policy_reply()).await;
        handle
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    backend.apply(&[change(&m, 0)], None, None, now).await;
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "a write to the user's Deployment").await;
}

/// A candidate beside a live leader reads the lease and writes nothing;
/// it acts on nothing; a failed read of the lease is no leadership.
async fn a_follower_writes_nothing() {
    let (mut backend, mut handle, gw) = backend_with(spec(), "gpuscale-1").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    // A registration no slice this follower reads shows (the leader may
    // have just registered it from a newer read): left to the leader.
    gw.replicas.lock().unwrap().insert(
        m.served_name.clone(),
        ["http://10.0.0.9:8000".to_string()].into(),
    );
    let server = tokio::spawn(async move {
        // The holder's renewTime looks an hour old by our clock (its
        // clock is behind ours): still live, judged by what we observe.
        expect(
            &mut handle,
            Method::GET,
            LEASE,
            200,
            lease("gpuscale-0", "2026-11-29T17:20:01.000000Z", "7"),
        )
        .await;
        // Followers feed the gateway too (any replica may be asked).
        expect(&mut handle, Method::GET, SLICES, 200, slices(&["10.0.0.7"])).await;
        handle
    });
    let observed = backend.tick(std::slice::from_ref(&m), now).await;
    let mut handle = server.await.unwrap();
    assert!(!observed.took_over);
    assert!(observed.replicas.is_empty());
    assert_eq!(observed.repairs, Default::default());
    backend.apply(&[change(&m, 0)], None, None, now).await;
    silent(&mut handle, 100, "a follower wrote").await;
    assert_eq!(gw.seen.lock().unwrap().len(), 1);
    assert!(gw.seen.lock().unwrap()[0].starts_with("POST"));
    assert!(gw.replicas.lock().unwrap()[&m.served_name].contains("http://10.0.0.9:8000"));
}

fn fast() -> KubeSpec {
    KubeSpec {
        namespace: "inference".into(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(200),
        request_timeout: Duration::from_millis(400),
        ..KubeSpec::default()
    }
}

/// The leader renews every retry period (not every tick) without
/// reading first; when the API server is slow and no renewal lands
/// within the renew deadline, it stops writing, before any candidate
/// could take over.
async fn a_leader_that_cannot_renew_in_time_stops_writing() {
    let (mut backend, mut handle, _gw) = backend_with(fast(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        leader_after_lease(&mut handle).await;
        handle
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    let mut handle = server.await.unwrap();
    // A tick at once: no lease call.
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            OWNED,
            200,
            deployments(&[("llama", 1)]),
        )
        .await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    let mut handle = server.await.unwrap();
    // After the retry period: the renewal is an update of the lease as
    // last written, no read first.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let server = tokio::spawn(async move {
        let renewed = expect(
            &mut handle,
            Method::PUT,
            &format!("{LEASE}?"),
            200,
            lease("gpuscale-0", "2026-11-29T18:20:02.000000Z", "2"),
        )
        .await;
        assert_eq!(renewed["metadata"]["resourceVersion"], "1");
        assert_eq!(renewed["spec"]["holderIdentity"], "gpuscale-0");
        leader_after_lease(&mut handle).await;
        // A decision against a slow API server: each call answered after
        // 350 ms. The Service and the Deployment go out within the 600 ms
        // renew deadline; the scale would not, and is not sent.
        service_absent(&mut handle, "llama").await;
        expect_after(
            &mut handle,
            Method::PATCH,
            SERVICE,
            200,
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpuscale-llama"}}),
            Duration::from_millis(350),
        )
        .await;
        expect_after(
            &mut handle,
            Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/llama?&force=true&fieldManager=gpuscale",
            200,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"}}),
            Duration::from_millis(350),
        )
        .await;
        handle
    });
    backend
        .tick(std::slice::from_ref(&m), now + Duration::from_secs(1))
        .await;
    backend
        .apply(&[change(&m, 1), change(&m, 1)], None, None, now)
        .await;
    let mut handle = server.await.unwrap();
    silent(&mut handle, 300, "a write after the renew deadline").await;
}

/// The reads of a leader's tick that has just written the lease (not a
/// takeover memory read: the test's policy has no object).
async fn leader_after_lease(handle: &mut Handle) {
    leader_after_lease_with(handle, true).await;
}

/// As [`leader_after_lease`]; `slices`: with the EndpointSlices read that
/// ends a tick.
async fn leader_after_lease_with(handle: &mut Handle, with_slices: bool) {
    expect(
        handle,
        Method::GET,
        OWNED,
        200,
        deployments(&[("llama", 1)]),
    )
    .await;
    // Taking over (first time only) reads the memory; answered "none".
    let (req, send) = handle.next_request().await.expect("a request");
    let path = req.uri().path_and_query().unwrap().to_string();
    SENT.lock()
        .unwrap()
        .push((req.method().to_string(), path.clone(), String::new()));
    let reply = if path == "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama" {
        send.send_response(
            Response::builder()
                .status(404)
                .header("content-type", "application/json")
                .body(Body::from(
                    serde_json::to_vec(&status_reply(404, "NotFound")).unwrap(),
                ))
                .unwrap(),
        );
        None
    } else {
        assert_eq!(path, HANDOFFS);
        Some(send)
    };
    match reply {
        None => {
            expect(handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        }
        Some(send) => send.send_response(
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&no_nodes()).unwrap()))
                .unwrap(),
        ),
    }
    if with_slices {
        expect(handle, Method::GET, SLICES, 200, slices(&[])).await;
    }
}

/// On shutdown the leader releases the lease: no holder, 1 s, so the
/// next leader takes over at once instead of after 15 s.
async fn the_leader_releases_the_lease_on_shutdown() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        leader_after_lease(&mut handle).await;
        let released = expect(
            &mut handle,
            Method::PUT,
            &format!("{LEASE}?"),
            200,
            lease("", "2026-11-29T18:20:02.000000Z", "2"),
        )
        .await;
        assert_eq!(released["spec"]["holderIdentity"], "");
        assert_eq!(released["spec"]["leaseDurationSeconds"], 1);
        assert_eq!(released["metadata"]["resourceVersion"], "1");
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    backend.shutdown().await;
    server.await.unwrap();
}

/// A cordoned node of the managed pool (its labels besides `labels`).
fn node(name: &str, labels: Value, annotations: Value) -> Value {
    let mut labels = labels;
    labels["nvidia.com/gpu.present"] = "true".into();
    labels["gpuscale.io/managed"] = "true".into();
    node_outside(name, labels, annotations)
}

/// A cordoned node with these labels only (outside the managed pool
/// unless they say otherwise).
fn node_outside(name: &str, labels: Value, annotations: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels, "annotations": annotations},
           "spec": {"unschedulable": true}})
}

fn nodes(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items})
}

const PODS_ON: &str = "/api/v1/namespaces/inference/pods?&fieldSelector=spec.nodeName%3Dh100-0&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dgpuscale";
const PODS_ON_1: &str = "/api/v1/namespaces/inference/pods?&fieldSelector=spec.nodeName%3Dh100-1&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dgpuscale";

fn mig_pods(names: &[&str]) -> Value {
    let items: Vec<Value> = names
        .iter()
        .map(|n| {
            json!({"metadata": {"name": n}, "spec": {"containers": [{"name": "m",
                "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]}})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
}

/// The reads that open a leader's tick within the retry period: the
/// Deployments it owns (`llama` at 1), then the nodes with a MIG
/// hand-off (`handoffs`).
async fn next_tick(handle: &mut Handle, handoffs: Value) {
    expect(
        handle,
        Method::GET,
        OWNED,
        200,
        deployments(&[("llama", 1)]),
    )
    .await;
    expect(handle, Method::GET, HANDOFFS, 200, handoffs).await;
}

/// The patch that gives a drained node its new MIG config
/// (`gpuscale-new`), answered; its body.
async fn drained_gets_its_config(handle: &mut Handle, node: &str) -> Value {
    let p = expect(
        handle,
        Method::PATCH,
        &format!("/api/v1/nodes/{node}?"),
        200,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}}),
    )
    .await;
    assert_eq!(
        p["metadata"]["labels"]["nvidia.com/mig.config"],
        "gpuscale-new"
    );
    p
}

/// A node whose hand-off write the API server refuses (here a config
/// annotation that is no label value: 422) is logged and tried again next
/// tick: the next node's hand-off moves on, and the controller stays the
/// leader (no second takeover, no policy memory read again).
async fn a_refused_handoff_write_holds_up_neither_other_nodes_nor_the_leader() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let drained = |name: &str, config: &str| {
        node(
            name,
            json!({"gpuscale.io/mig-handoff": "draining", "nvidia.com/mig.config": "gpuscale-old"}),
            json!({"gpuscale.io/mig-handoff-config": config}),
        )
    };
    let bad = drained("h100-0", "not a label value!");
    let good = drained("h100-1", "gpuscale-new");
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(
            &mut handle,
            Method::GET,
            OWNED,
            200,
            deployments(&[("llama", 1)]),
        )
        .await;
        policy_read(&mut handle).await;
        for tick in 0..2 {
            if tick > 0 {
                expect(
                    &mut handle,
                    Method::GET,
                    OWNED,
                    200,
                    deployments(&[("llama", 1)]),
                )
                .await;
            }
            let both = nodes(vec![bad.clone(), good.clone()]);
            expect(&mut handle, Method::GET, HANDOFFS, 200, both).await;
            expect(&mut handle, Method::GET, PODS_ON, 200, mig_pods(&[])).await;
            expect(
                &mut handle,
                Method::PATCH,
                "/api/v1/nodes/h100-0?",
                422,
                status_reply(422, "Invalid"),
            )
            .await;
            expect(&mut handle, Method::GET, PODS_ON_1, 200, mig_pods(&[])).await;
            drained_gets_its_config(&mut handle, "h100-1").await;
            expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        }
        handle
    });
    let models = std::slice::from_ref(&m);
    let first = backend.tick(models, now).await;
    assert!(first.took_over);
    let second = backend.tick(models, now + Duration::from_secs(1)).await;
    assert!(
        !second.took_over,
        "still the leader after the refused write"
    );
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "another request").await;
}

/// A MIG hand-off is recorded on the node and carried on from there,
/// tick by tick (so a restarted leader carries on too): evictions that a
/// PodDisruptionBudget refuses (429) are retried, a pod already gone
/// (404) is done; once drained the config is set, and only the MIG
/// manager's `success` uncordons the node; `failed` keeps it cordoned
/// with a Warning.
async fn a_mig_handoff_drains_waits_for_the_mig_manager_and_uncordons() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let draining = node(
        "h100-0",
        json!({"gpuscale.io/mig-handoff": "draining", "nvidia.com/mig.config": "gpuscale-old"}),
        json!({"gpuscale.io/mig-handoff-config": "gpuscale-new", "gpuscale.io/mig-handoff-reason": "…"}),
    );
    let configuring = |state: &str| {
        node(
            "h100-0",
            json!({"gpuscale.io/mig-handoff": "configuring", "nvidia.com/mig.config": "gpuscale-new",
                   "nvidia.com/mig.config.state": state}),
            json!({"gpuscale.io/mig-handoff-config": "gpuscale-new"}),
        )
    };
    let node_reply = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "h100-0"}});
    let server = tokio::spawn(async move {
        // Tick 1: two pods to evict; a budget holds one, one is gone.
        lease_created(&mut handle, "gpuscale-0").await;
        expect(
            &mut handle,
            Method::GET,
            OWNED,
            200,
            deployments(&[("llama", 1)]),
        )
        .await;
        policy_read(&mut handle).await;
        expect(
            &mut handle,
            Method::GET,
            HANDOFFS,
            200,
            nodes(vec![draining.clone()]),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            PODS_ON,
            200,
            mig_pods(&["a", "b"]),
        )
        .await;
        expect(
            &mut handle,
            Method::POST,
            "/api/v1/namespaces/inference/pods/a/eviction?",
            429,
            status_reply(429, "TooManyRequests"),
        )
        .await;
        expect(
            &mut handle,
            Method::POST,
            "/api/v1/namespaces/inference/pods/b/eviction?",
            404,
            status_reply(404, "NotFound"),
        )
        .await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // Tick 2: the held pod again, now let go.
        next_tick(&mut handle, nodes(vec![draining.clone()])).await;
        expect(&mut handle, Method::GET, PODS_ON, 200, mig_pods(&["a"])).await;
        let ev = expect(
            &mut handle,
            Method::POST,
            "/api/v1/namespaces/inference/pods/a/eviction?",
            201,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
        )
        .await;
        assert_eq!(ev["metadata"]["name"], "a");
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // Tick 3: drained: the config is set, still cordoned.
        next_tick(&mut handle, nodes(vec![draining.clone()])).await;
        expect(&mut handle, Method::GET, PODS_ON, 200, mig_pods(&[])).await;
        let p = drained_gets_its_config(&mut handle, "h100-0").await;
        assert_eq!(
            p["metadata"]["labels"]["gpuscale.io/mig-handoff"],
            "configuring"
        );
        assert!(p.get("spec").is_none(), "not uncordoned yet: {p}");
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // Tick 4: the MIG manager is at work (pending): nothing written.
        next_tick(&mut handle, nodes(vec![configuring("pending")])).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // Tick 5: success: uncordoned, the record removed, an Event.
        next_tick(&mut handle, nodes(vec![configuring("success")])).await;
        let p = expect(
            &mut handle,
            Method::PATCH,
            "/api/v1/nodes/h100-0?",
            200,
            node_reply.clone(),
        )
        .await;
        assert_eq!(p["spec"]["unschedulable"], false);
        assert_eq!(
            p["metadata"]["labels"]["gpuscale.io/mig-handoff"],
            Value::Null
        );
        assert!(
            p["metadata"]["annotations"]
                .as_object()
                .unwrap()
                .contains_key("gpuscale.io/mig-handoff-reason")
        );
        let ev = expect(&mut handle, Method::POST, NODE_EVENTS, 201, event_reply()).await;
        assert_eq!(ev["regarding"]["kind"], "Node");
        assert_eq!(ev["type"], "Normal");
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // Tick 6 (another node's story): failed: kept cordoned, a Warning.
        next_tick(&mut handle, nodes(vec![configuring("failed")])).await;
        let p = expect(
            &mut handle,
            Method::PATCH,
            "/api/v1/nodes/h100-0?",
            200,
            node_reply.clone(),
        )
        .await;
        assert_eq!(p["metadata"]["labels"]["gpuscale.io/mig-handoff"], "failed");
        assert!(p.get("spec").is_none(), "a failed node stays cordoned: {p}");
        assert!(
            p["metadata"]["annotations"]["gpuscale.io/mig-handoff-reason"]
                .as_str()
                .unwrap()
                .contains("failed")
        );
        let ev = expect(&mut handle, Method::POST, NODE_EVENTS, 201, event_reply()).await;
        assert_eq!(ev["type"], "Warning");
        assert_eq!(ev["reason"], "MIGConfigFailed");
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
    });
    for i in 0..6 {
        backend
            .tick(
                std::slice::from_ref(&m),
                now + Duration::from_millis(i * 10),
            )
            .await;
    }
    server.await.unwrap();
}

/// A node that leaves the managed pool while this controller drains it
/// is uncordoned and its hand-off record removed (it stayed cordoned:
/// hand-offs were listed in the pool only); outside the pool, a hand-off
/// another controller started, or one with no owner recorded, is left
/// alone; inside it, one recorded under an earlier name is carried on.
async fn a_node_that_left_the_pool_mid_drain_is_uncordoned_and_others_handoffs_are_left_alone() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let draining =
        json!({"gpuscale.io/mig-handoff": "draining", "nvidia.com/mig.config": "gpuscale-old"});
    let by = |who: &str| json!({"gpuscale.io/mig-handoff-config": "gpuscale-new", "gpuscale.io/mig-handoff-by": who});
    let left = node_outside(
        "h100-0",
        draining.clone(),
        by("inference/gpuscale-autoscaler"),
    );
    let others_outside = node_outside(
        "h100-1",
        draining.clone(),
        by("research/gpuscale-autoscaler"),
    );
    // In the pool, recorded under an earlier namespace: carried on.
    let earlier_inside = node("h100-2", draining.clone(), by("old/gpuscale-autoscaler"));
    let unowned_outside = node_outside(
        "h100-3",
        draining,
        json!({"gpuscale.io/mig-handoff-config": "gpuscale-new"}),
    );
    let node_reply = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "h100-0"}});
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(
            &mut handle,
            Method::GET,
            OWNED,
            200,
            deployments(&[("llama", 1)]),
        )
        .await;
        policy_read(&mut handle).await;
        let all = nodes(vec![
            left,
            others_outside.clone(),
            earlier_inside,
            unowned_outside.clone(),
        ]);
        expect(&mut handle, Method::GET, HANDOFFS, 200, all).await;
        let p = expect(
            &mut handle,
            Method::PATCH,
            "/api/v1/nodes/h100-0?",
            200,
            node_reply,
        )
        .await;
        assert_eq!(p["spec"]["unschedulable"], false);
        assert_eq!(
            p["metadata"]["labels"]["gpuscale.io/mig-handoff"],
            Value::Null
        );
        assert!(
            p["metadata"]["labels"]
                .get("nvidia.com/mig.config")
                .is_none(),
            "its geometry is left as it is: {p}"
        );
        for key in [
            "gpuscale.io/mig-handoff-by",
            "gpuscale.io/mig-handoff-config",
        ] {
            assert_eq!(p["metadata"]["annotations"][key], Value::Null, "{key}");
            assert!(
                p["metadata"]["annotations"]
                    .as_object()
                    .unwrap()
                    .contains_key(key)
            );
        }
        let ev = expect(&mut handle, Method::POST, NODE_EVENTS, 201, event_reply()).await;
        assert_eq!(ev["type"], "Warning");
        assert_eq!(ev["reason"], "LeftPool");
        let pods_on_2 = PODS_ON.replace("h100-0", "h100-2");
        expect(&mut handle, Method::GET, &pods_on_2, 200, mig_pods(&[])).await;
        let p = drained_gets_its_config(&mut handle, "h100-2").await;
        assert_eq!(
            p["metadata"]["labels"]["gpuscale.io/mig-handoff"],
            "configuring"
        );
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // The next tick: the others are still there, and still not ours.
        next_tick(&mut handle, nodes(vec![others_outside, unowned_outside])).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    for i in 0..2 {
        backend
            .tick(
                std::slice::from_ref(&m),
                now + Duration::from_millis(i * 10),
            )
            .await;
    }
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "a write to another's hand-off").await;
}

/// A node whose hand-off was dropped because it left the pool gets no
/// new one from a plan that still names it (a cluster file, or an
/// inventory not rebuilt yet): it would be cordoned and uncordoned again
/// every tick.
async fn a_node_that_left_the_pool_gets_no_new_handoff_from_a_plan_that_still_names_it() {
    let b = {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        gpuscale_policies::load_paths(&[
            root.join("cluster.yaml"),
            root.join("policies"),
            root.join("demand.yaml"),
        ])
        .unwrap()
    };
    let cluster = b.cluster.as_ref().unwrap();
    let plan = gpuscale_packer::pack(
        cluster,
        &b.models,
        b.demand.as_ref().unwrap(),
        &gpuscale_packer::PackOptions::default(),
    )
    .unwrap();
    // Every node as the plan leaves it but one, whose MIG geometry the
    // plan changes.
    let mut before = plan.apply_to(cluster);
    // A node with a GPU the plan gives a MIG geometry it does not have.
    let changes = |g: &gpuscale_packer::GpuPlan| {
        g.mode == gpuscale_packer::Mode::Mig
            && cluster
                .nodes
                .iter()
                .find(|n| n.name == g.node)
                .and_then(|n| n.gpus.get(g.index as usize))
                .is_none_or(|old| {
                    old.mode != gpuscale_policies::GpuMode::Mig
                        || old.geometry.placements() != g.geometry.as_slice()
                })
    };
    let changed = plan
        .gpus
        .iter()
        .find(|g| changes(g))
        .expect("a GPU the plan reconfigures")
        .node
        .clone();
    let k = before.nodes.iter().position(|n| n.name == changed).unwrap();
    let name = before.nodes[k].name.clone();
    before.nodes[k] = cluster
        .nodes
        .iter()
        .find(|c| c.name == name)
        .unwrap()
        .clone();

    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let left = node_outside(
        &name,
        json!({"gpuscale.io/mig-handoff": "draining"}),
        json!({"gpuscale.io/mig-handoff-config": "gpuscale-new",
               "gpuscale.io/mig-handoff-by": "inference/gpuscale-autoscaler"}),
    );
    let patched = format!("/api/v1/nodes/{name}?");
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(
            &mut handle,
            Method::GET,
            OWNED,
            200,
            deployments(&[("llama", 1)]),
        )
        .await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, nodes(vec![left])).await;
        let reply = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n"}});
        let p = expect(&mut handle, Method::PATCH, &patched, 200, reply).await;
        assert_eq!(p["spec"]["unschedulable"], false);
        expect(&mut handle, Method::POST, NODE_EVENTS, 201, event_reply()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    let mut handle = server.await.unwrap();
    // A request here would wait for an answer that never comes: bounded,
    // and then the request is named.
    let applied = tokio::time::timeout(
        Duration::from_secs(2),
        backend.apply(&[], Some(&plan), Some(&before), now),
    )
    .await;
    silent(
        &mut handle,
        200,
        "a new hand-off on the node that left the pool",
    )
    .await;
    assert!(applied.is_ok(), "the apply waited on a request");
}

/// The patch that starts a hand-off cordons and records why in the same
/// write; without a drain it names the config at once.
#[test]
fn a_handoff_starts_with_a_cordon_and_its_reason_in_one_patch() {
    use gpuscale_autoscaler::kubernetes::{Evict, handoff_start_patch};
    let p = handoff_start_patch(
        "gpuscale-00ab",
        true,
        Evict::Mig,
        "inference/gpuscale-autoscaler",
    );
    // MIG pods alone, recorded as such.
    assert_eq!(
        p["metadata"]["annotations"]["gpuscale.io/mig-handoff-evict"],
        "mig"
    );
    let gpus = handoff_start_patch(
        "gpuscale-00ab",
        true,
        Evict::Gpus,
        "inference/gpuscale-autoscaler",
    );
    assert_eq!(
        gpus["metadata"]["annotations"]["gpuscale.io/mig-handoff-evict"],
        "gpus"
    );
    assert_eq!(p["spec"]["unschedulable"], true);
    assert_eq!(
        p["metadata"]["annotations"]["gpuscale.io/mig-handoff-by"],
        "inference/gpuscale-autoscaler"
    );
    assert_eq!(
        p["metadata"]["labels"]["gpuscale.io/mig-handoff"],
        "draining"
    );
    assert!(
        p["metadata"]["labels"]
            .get("nvidia.com/mig.config")
            .is_none()
    );
    assert_eq!(
        p["metadata"]["annotations"]["gpuscale.io/mig-handoff-config"],
        "gpuscale-00ab"
    );
    assert!(
        p["metadata"]["annotations"]["gpuscale.io/mig-handoff-reason"]
            .as_str()
            .unwrap()
            .contains("cordoned by gpuscale")
    );
    let p = handoff_start_patch(
        "gpuscale-00ab",
        false,
        Evict::Gpus,
        "inference/gpuscale-autoscaler",
    );
    assert_eq!(
        p["metadata"]["labels"]["nvidia.com/mig.config"],
        "gpuscale-00ab"
    );
    assert_eq!(
        p["metadata"]["labels"]["gpuscale.io/mig-handoff"],
        "configuring"
    );
    assert!(gpuscale_autoscaler::kubernetes::may_reconfigure(
        &[0, 1],
        &[2, 3]
    ));
    // GPUs 0 and 1 in MIG mode, 2 whole: a new layout of 0 or 1 concerns
    // MIG pods alone; GPU 2 (or one the list does not reach) switching
    // into MIG mode concerns every GPU pod.
    use gpuscale_autoscaler::kubernetes::evict_for;
    let mig_now = [true, true, false];
    assert_eq!(evict_for(&mig_now, &[0, 1]), Evict::Mig);
    assert_eq!(evict_for(&mig_now, &[1, 2]), Evict::Gpus);
    assert_eq!(evict_for(&mig_now, &[3]), Evict::Gpus);
}

/// A node's GPUs a plan reconfigures: a new MIG layout, a GPU into MIG
/// mode, and a GPU taken out of MIG mode for whole or shared use (which
/// once went unnoticed: the config was recorded as applied and its label
/// never written, so the GPU stayed in MIG mode under its new replicas);
/// not an idle GPU left in MIG mode, nor one whose layout stays.
#[test]
fn the_gpus_a_plan_reconfigures_include_those_it_takes_out_of_mig_mode() {
    use gpuscale_autoscaler::kubernetes::changing_gpus;
    let text = "\
apiVersion: gpuscale.io/v1alpha1
kind: Cluster
metadata: {name: c}
spec:
  nodes:
    - name: n
      gpuModel: H100-80GB
      gpuCount: 5
      gpus:
        - {index: 0, mode: mig, geometry: [{profile: 7g.80gb, start: 0}]}
        - {index: 1, mode: mig, geometry: [{profile: 7g.80gb, start: 0}]}
        - {index: 2, mode: whole}
        - {index: 3, mode: mig, geometry: [{profile: 7g.80gb, start: 0}]}
        - {index: 4, mode: mig, geometry: [{profile: 7g.80gb, start: 0}]}
";
    let bundle = gpuscale_policies::load::load_sources(&[(Path::new("c.yaml"), text)]).unwrap();
    let was = &bundle.cluster.as_ref().unwrap().nodes[0];
    let gpu = |index: u32, mode: &str, geometry: Value| {
        json!({"node": "n", "index": index, "gpu_model": "H100-80GB", "mode": mode,
               "geometry": geometry, "replicas": []})
    };
    let seven = json!([{"profile": "7g.80gb", "start": 0}]);
    let halves = json!([{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]);
    let gpus: Vec<gpuscale_packer::GpuPlan> = serde_json::from_value(json!([
        gpu(0, "mig", seven),          // the same layout: stays
        gpu(1, "mig", halves.clone()), // a new layout
        gpu(2, "mig", halves),         // into MIG mode
        gpu(3, "whole", json!([])),    // out of MIG mode, used whole
        gpu(4, "idle", json!([])),     // idle, left in MIG mode
    ]))
    .unwrap();
    assert_eq!(changing_gpus(&gpus, was), vec![1, 2, 3]);
    assert!(!gpuscale_autoscaler::kubernetes::may_reconfigure(
        &[0, 1],
        &[1, 2]
    ));
}

/// The mig-parted ConfigMap keeps the configs that nodes still name,
/// read from the one in the cluster, beside the plan's: a node the plan
/// does not touch never points at a config that is gone.
async fn the_mig_parted_configmap_keeps_configs_other_nodes_name() {
    use gpuscale_autoscaler::kubernetes::merged_mig_parted;
    let b = {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
        gpuscale_policies::load_paths(&[
            root.join("cluster.yaml"),
            root.join("policies"),
            root.join("demand.yaml"),
        ])
        .unwrap()
    };
    let plan = gpuscale_packer::pack(
        b.cluster.as_ref().unwrap(),
        &b.models,
        b.demand.as_ref().unwrap(),
        &gpuscale_packer::PackOptions::default(),
    )
    .unwrap();
    let existing = "version: v1\nmig-configs:\n  gpuscale-00000000aa:\n    - devices: all\n      mig-enabled: true\n      mig-devices: {\"7g.80gb\": 1}\n  gpuscale-00000000bb:\n    - devices: all\n      mig-enabled: false\n";
    let named = BTreeSet::from(["gpuscale-00000000aa".to_string()]);
    let config = merged_mig_parted(&plan, Some(existing), &named);
    let (planned, _) = gpuscale_packer::emit::mig_parted(&plan);
    for name in planned.mig_configs.keys() {
        assert!(config.mig_configs.contains_key(name), "{name}");
    }
    assert!(
        config.mig_configs.contains_key("gpuscale-00000000aa"),
        "still named"
    );
    assert!(
        !config.mig_configs.contains_key("gpuscale-00000000bb"),
        "named by no node"
    );

    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        let body = expect(
            &mut handle,
            Method::PATCH,
            "/api/v1/namespaces/gpu-operator/configmaps/gpuscale-mig-parted-config?&force=true&fieldManager=gpuscale",
            200,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpuscale-mig-parted-config"}}),
        )
        .await;
        assert_eq!(body["__content_type"], "application/apply-patch+yaml");
        let text = body["data"]["config.yaml"].as_str().unwrap();
        assert!(text.starts_with("version: v1\nmig-configs:\n"), "{text}");
        assert!(text.contains("gpuscale-00000000aa"));
        expect(
            &mut handle,
            Method::GET,
            "/api/v1/namespaces/gpu-operator/configmaps/gpuscale-mig-parted-config",
            200,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpuscale-mig-parted-config"},
                   "data": {"config.yaml": "version: v1\n"}}),
        )
        .await;
    });
    assert_eq!(k.apply_mig_configmap(&config).await.unwrap(), None);
    assert_eq!(
        k.mig_configmap_text().await.unwrap().as_deref(),
        Some("version: v1\n")
    );
    server.await.unwrap();
}

/// A controller of model `llama` (1 to 10 replicas, 8 in flight each) on
/// the Kubernetes backend over the mock, in front of a quiet stand-in
/// gateway: the controller, its report, the mock's handle, the gateway.
async fn quiet_controller(
    identity: &str,
    dry_run: bool,
) -> (
    gpuscale_autoscaler::controller::Controller,
    gpuscale_autoscaler::controller::Report,
    Handle,
    common::StandIn,
) {
    use gpuscale_autoscaler::controller::Controller;
    let (gw, gw_state) = common::stand_in_gateway(common::quiet()).await;
    let settings = common::settings(
        &gw,
        "  scaling:\n    minReplicas: 1\n    maxReplicas: 10\n    targetQueueDepth: 8\n",
        "  kubernetes: {namespace: inference}\n",
    );
    let (k, handle) = kube_with(spec(), identity, dry_run);
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let backend = Backend::Kube(KubeBackend::new(k, gateway.clone()));
    let controller = Controller::new(settings, gateway, backend);
    let report = controller.report();
    (controller, report, handle, gw_state)
}

/// A controller that takes over (a restart, a leader change) reads the
/// live count before anything else it does as leader, and the memory the
/// last leader left; at 6 replicas in a quiet spell it holds 6 (the
/// scale-down window), where one that started from `minReplicas` would
/// have scaled to 1 at once.
async fn a_controller_taking_over_reads_the_live_count_first_and_holds_it() {
    let (mut controller, report, mut handle, gw_state) =
        quiet_controller("gpuscale-1", false).await;
    // The last leader recommended 6 a minute ago.
    let a_minute_ago =
        humantime::format_rfc3339_millis(std::time::SystemTime::now() - Duration::from_secs(60))
            .to_string();

    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-1").await;
        // The first thing done as leader: read the live count.
        expect(
            &mut handle,
            Method::GET,
            OWNED,
            200,
            deployments(&[("llama", 6)]),
        )
        .await;
        expect(&mut handle, Method::GET,
            "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama", 200,
            json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "metadata": {"name": "llama"},
                   "spec": {"resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}},
                   "status": {"currentReplicas": 6, "desiredReplicas": 6,
                              "scalingMemory": {"recommendations": [{"time": a_minute_ago, "replicas": 6}]}}})).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    controller.tick().await;
    let mut handle = server.await.unwrap();
    let d = report.decisions();
    let latest = d["llama"].latest.as_ref().unwrap();
    assert_eq!(latest.desired, 6, "{}", latest.reason);
    assert!(
        latest.reason.contains("stabilisation window"),
        "{}",
        latest.reason
    );
    // Holding is no change: nothing written to the cluster, nothing told
    // to the gateway.
    silent(&mut handle, 200, "a write while holding").await;
    assert!(gw_state.seen.lock().unwrap().is_empty());

    // Someone scales the Deployment to 3 by hand: the next tick works
    // from 3 (as HPA reads `/scale` every cycle), and 3 is no change to
    // write back.
    let server = tokio::spawn(async move {
        leader_reads(&mut handle, 3, &[]).await;
        handle
    });
    controller.tick().await;
    let mut handle = server.await.unwrap();
    let d = report.decisions();
    assert_eq!(d["llama"].latest.as_ref().unwrap().desired, 3);
    silent(&mut handle, 200, "a write after adopting the live count").await;
}

/// Deployments of the model server that another controller owns (KEDA
/// mode: the user's Deployment, labelled with the model, that KEDA
/// scales): the list that finds them.
const OBSERVED: &str = "/apis/apps/v1/namespaces/inference/deployments?&labelSelector=gpuscale.io%2Fmodel%2Capp.kubernetes.io%2Fmanaged-by%21%3Dgpuscale";

/// A dry run beside KEDA: gpuscale owns no Deployment of the model, and
/// KEDA runs 4 replicas of the user's. The decisions start from those 4
/// (quiet load: held by the scale-down window), not from 0 (which would
/// read as a model just created, sent to its minimum), and nothing is
/// written to the cluster or told to the gateway.
async fn a_dry_run_beside_keda_starts_from_the_replicas_keda_runs() {
    let (mut controller, report, mut handle, gw_state) = quiet_controller("gpuscale-0", true).await;
    let keda_runs = |n: u32| {
        json!({"apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {}, "items": [
            {"metadata": {"name": "llama", "labels": {"gpuscale.io/model": "llama", "app.kubernetes.io/name": "llama"}},
             "spec": {"replicas": n, "selector": {"matchLabels": {"app.kubernetes.io/name": "llama"}},
                      "template": {"metadata": {}}}}]})
    };
    let server = tokio::spawn(async move {
        // No lease in a dry run: it reads, and leads its own decisions.
        expect(&mut handle, Method::GET, OWNED, 200, deployments(&[])).await;
        expect(&mut handle, Method::GET, OBSERVED, 200, keda_runs(4)).await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    controller.tick().await;
    let mut handle = server.await.unwrap();
    let d = report.decisions();
    let latest = d["llama"].latest.as_ref().unwrap();
    assert_eq!(latest.desired, 4, "{}", latest.reason);
    assert_eq!(latest.mode, Mode::Normal, "{}", latest.reason);
    silent(&mut handle, 200, "a write in a dry run").await;

    // KEDA scales to 2: the next tick works from 2.
    let server = tokio::spawn(async move {
        expect(&mut handle, Method::GET, OWNED, 200, deployments(&[])).await;
        expect(&mut handle, Method::GET, OBSERVED, 200, keda_runs(2)).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    controller.tick().await;
    let mut handle = server.await.unwrap();
    let d = report.decisions();
    assert_eq!(d["llama"].latest.as_ref().unwrap().desired, 2);
    silent(&mut handle, 200, "a write in a dry run").await;
    assert!(gw_state.seen.lock().unwrap().is_empty());
}

/// A request of the mock as the RBAC check reads it (method, path with
/// query, content type), recorded in [`SENT`].
fn recorded(req: &Request<Body>) -> (String, String, String) {
    let entry = (
        req.method().to_string(),
        req.uri().path_and_query().unwrap().to_string(),
        req.headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default(),
    );
    SENT.lock().unwrap().push(entry.clone());
    entry
}

/// Answers a request of the mock with `status` and a JSON `reply`.
fn answer(send: tower_test::mock::SendResponse<Response<Body>>, status: u16, reply: &Value) {
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(reply).unwrap()))
            .unwrap(),
    );
}

/// Ticks until the backend hands over the watched policies (their first
/// list in), for at most a second.
async fn first_policies(
    backend: &mut Backend,
    models: &[Model],
    now: Duration,
) -> Option<Vec<Model>> {
    for _ in 0..50 {
        if let Some(p) = backend.tick(models, now).await.policies {
            return Some(p);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Policies from the cluster are watched (a kube-runtime reflector: a
/// list, then a watch): the backend hands the controller the models once
/// the first list is in, and again only when a policy changes. A policy
/// that does not decode is left out and reported on its own (a Warning
/// Event), and the others run.
async fn watched_policies_reach_the_controller_each_on_its_own() {
    let (k, mut handle) = kube_with(spec(), "gpuscale-0", false);
    let (gw, _) = common::stand_in_gateway(common::quiet()).await;
    let mut backend = Backend::Kube(
        KubeBackend::new(k, gpuscale_autoscaler::observe::GatewayClient::new(&gw))
            .watching_policies(),
    );
    let policies = json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicyList",
        "metadata": {"resourceVersion": "10"},
        "items": [
            {"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy",
             "metadata": {"name": "llama", "namespace": "inference", "resourceVersion": "8",
                          "creationTimestamp": "2026-11-01T00:00:00Z"},
             "spec": {"servedName": "meta-llama/Llama-3.1-8B-Instruct",
                      "resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}},
            // A later policy claiming llama's served name (named to sort
            // first): left out, or its replicas would take llama's requests.
            {"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy",
             "metadata": {"name": "a-intruder", "namespace": "inference", "resourceVersion": "11",
                          "creationTimestamp": "2026-11-20T00:00:00Z"},
             "spec": {"servedName": "meta-llama/Llama-3.1-8B-Instruct",
                      "resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}},
            {"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy",
             "metadata": {"name": "broken", "namespace": "inference", "resourceVersion": "9"},
             "spec": {"resources": {"memoryGiB": "lots"}}}]});
    let warnings = std::sync::Arc::new(Mutex::new(Vec::<Value>::new()));
    let seen_warnings = warnings.clone();
    // The watch runs beside the ticks: answered by path, not in order.
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (method, path, _) = recorded(&req);
            let body = req.into_body().collect_bytes().await.unwrap();
            let (status, reply) = if path
                .starts_with("/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies?")
            {
                if path.contains("watch=true") {
                    // An open watch with nothing to say yet.
                    held.push(send);
                    continue;
                }
                (200, policies.clone())
            } else if path == LEASE {
                (404, status_reply(404, "NotFound"))
            } else if path == LEASES {
                (201, lease("gpuscale-0", "2026-11-29T18:20:01.000000Z", "1"))
            } else if path == OWNED {
                (200, deployments(&[]))
            } else if path == HANDOFFS {
                (200, no_nodes())
            } else if path.starts_with("/apis/discovery.k8s.io/") {
                (200, slices(&[]))
            } else if path == EVENTS {
                seen_warnings
                    .lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap());
                (201, event_reply())
            } else if path
                .starts_with("/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/")
            {
                (404, status_reply(404, "NotFound"))
            } else {
                panic!("unexpected {method} {path}");
            };
            answer(send, status, &reply);
        }
    });
    let now = Duration::from_secs(1_795_976_401);
    let mut models = vec![model()];
    let handed = first_policies(&mut backend, &models, now).await;
    let handed = handed.expect("the watched policies, once listed");
    let names: Vec<&str> = handed.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["llama"]);
    models = handed.clone();
    let w = warnings.lock().unwrap().clone();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(
        w.iter()
            .all(|w| w["type"] == "Warning" && w["reason"] == "InvalidPolicy")
    );
    let about: BTreeSet<&str> = w
        .iter()
        .map(|w| w["regarding"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(about, BTreeSet::from(["a-intruder", "broken"]));
    assert!(
        w.iter().any(|w| w["regarding"]["name"] == "a-intruder"
            && w["note"]
                .as_str()
                .unwrap()
                .contains("is already served by ModelPolicy `llama`")),
        "{w:?}"
    );
    // Nothing changed since: nothing handed again.
    assert!(backend.tick(&models, now).await.policies.is_none());
    drop(backend);
    server.abort();
}

/// A deleted policy's pods go with it (they are its dependents): once the
/// watch shows it gone, what the controller registered for its served
/// name leaves the gateway, and the other model's stays.
async fn a_deleted_policys_replicas_leave_the_gateway() {
    let (k, mut handle) = kube_with(spec(), "gpuscale-0", false);
    let (gw, gw_state) = common::stand_in_gateway(common::quiet()).await;
    let mut backend = Backend::Kube(
        KubeBackend::new(k, gpuscale_autoscaler::observe::GatewayClient::new(&gw))
            .watching_policies(),
    );
    let policy = |name: &str, served: &str, rv: &str| {
        json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy",
               "metadata": {"name": name, "namespace": "inference", "resourceVersion": rv},
               "spec": {"servedName": served,
                        "resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}})
    };
    const MISTRAL: &str = "mistralai/Mistral-7B-Instruct-v0.3";
    let policies = json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicyList",
        "metadata": {"resourceVersion": "10"},
        "items": [policy("llama", "meta-llama/Llama-3.1-8B-Instruct", "8"),
                  policy("mistral", MISTRAL, "9")]});
    let deleted = json!({"type": "DELETED", "object": policy("mistral", MISTRAL, "11")});
    let slice = |service: &str, address: &str| {
        json!({"metadata": {"name": format!("{service}-abc"),
                            "labels": {"kubernetes.io/service-name": service}},
               "addressType": "IPv4", "ports": [{"name": "http", "port": 8000}],
               "endpoints": [{"addresses": [address], "conditions": {"ready": true}}]})
    };
    let both = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
        "metadata": {}, "items": [slice("gpuscale-llama", "10.0.0.7"),
                                  slice("gpuscale-mistral", "10.0.0.8")]});
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        let mut first_watch = true;
        while let Some((req, send)) = handle.next_request().await {
            let (method, path, _) = recorded(&req);
            let (status, reply) = if path
                .starts_with("/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies?")
            {
                if path.contains("watch=true") {
                    if std::mem::take(&mut first_watch) {
                        // The policy is deleted a little later.
                        let line = format!("{deleted}\n");
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(300)).await;
                            send.send_response(
                                Response::builder()
                                    .status(200)
                                    .header("content-type", "application/json")
                                    .body(Body::from(line.into_bytes()))
                                    .unwrap(),
                            );
                        });
                    } else {
                        held.push(send);
                    }
                    continue;
                }
                (200, policies.clone())
            } else if path == LEASE {
                (404, status_reply(404, "NotFound"))
            } else if path == LEASES {
                (201, lease("gpuscale-0", "2026-11-29T18:20:01.000000Z", "1"))
            } else if path.starts_with("/apis/apps/v1/namespaces/inference/deployments?") {
                (200, deployments(&[]))
            } else if path == HANDOFFS {
                (200, no_nodes())
            } else if path.starts_with("/apis/discovery.k8s.io/") {
                (200, both.clone())
            } else if path == EVENTS {
                (201, event_reply())
            } else if path
                .starts_with("/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/")
            {
                (404, status_reply(404, "NotFound"))
            } else {
                panic!("unexpected {method} {path}");
            };
            answer(send, status, &reply);
        }
    });
    let now = Duration::from_secs(1_795_976_401);
    let models = first_policies(&mut backend, &[model()], now)
        .await
        .expect("the watched policies, once listed");
    assert_eq!(models.len(), 2);
    // Both models' replicas registered.
    backend.tick(&models, now).await;
    let registered = |served: &str| {
        gw_state
            .replicas
            .lock()
            .unwrap()
            .get(served)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(
        registered(MISTRAL),
        ["http://10.0.0.8:8000".to_string()].into()
    );
    // The deletion arrives; the controller runs the models it is handed.
    let mut models = models;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Some(p) = backend.tick(&models, now).await.policies {
            models = p;
            break;
        }
    }
    assert_eq!(models.len(), 1, "mistral deleted");
    backend.tick(&models, now).await;
    assert!(registered(MISTRAL).is_empty(), "{:?}", registered(MISTRAL));
    assert_eq!(
        registered("meta-llama/Llama-3.1-8B-Instruct"),
        ["http://10.0.0.7:8000".to_string()].into()
    );
    drop(backend);
    server.abort();
}

/// A tiny stand-in node agent serving `reading` at `/v1/gpus`; its port.
async fn stand_in_agent(reading: Value) -> u16 {
    slow_agent(reading, Duration::ZERO).await
}

/// [`stand_in_agent`] answering after `delay`.
async fn slow_agent(reading: Value, delay: Duration) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let reading = reading.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let body = if req.uri().path() == "/v1/gpus" {
                        reading.to_string()
                    } else {
                        "{}".to_string()
                    };
                    async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(body),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    port
}

/// Without a cluster file the leader builds the packer's inventory from
/// the GPU nodes' labels and the node agents' readings (found through the
/// `gpuscale-agent` Service's EndpointSlices), every 30 s.
async fn the_inventory_comes_from_the_nodes_and_the_agents() {
    let (k, mut handle, pods) = kube_with_pods(spec(), "gpuscale-0");
    // What the pods bound to nodes hold (a watch beside the ticks):
    // gpuscale's MIG instance on GPU 0.
    let _pods = pods_api(
        pods,
        json!([{"metadata": {"name": "llama-x", "namespace": "inference",
                             "labels": {"gpuscale.io/model": "llama",
                                        "app.kubernetes.io/managed-by": "gpuscale"}},
                "spec": {"nodeName": "gpu-a", "containers": [{"name": "model-server",
                    "resources": {"limits": {"nvidia.com/mig-7g.80gb": "1"}}}]},
                "status": {"phase": "Running"}}]),
    );
    let (gw, _) = common::stand_in_gateway(common::quiet()).await;
    let mut backend = Backend::Kube(
        KubeBackend::new(k, gpuscale_autoscaler::observe::GatewayClient::new(&gw))
            .inventory_from_nodes(),
    );
    let port = stand_in_agent(json!({"node": "gpu-a", "gpus": [
        {"index": 0, "uuid": "GPU-a0", "name": "NVIDIA H100 80GB HBM3", "memoryTotalMib": 81559,
         "memoryUsedMib": 0, "migEnabled": true,
         "instances": [{"profile": "7g.80gb", "start": 0}]},
        {"index": 1, "uuid": "GPU-a1", "name": "NVIDIA H100 80GB HBM3", "memoryTotalMib": 81559,
         "memoryUsedMib": 0, "migEnabled": false, "eccUncorrectedVolatile": 3}]}))
    .await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        leader_after_lease_with(&mut handle, false).await;
        // The GPU nodes in pages of 500: a first page whose continue
        // token then expires (410 Gone: the list starts again, once), an
        // empty first page, then the node.
        let first = "/api/v1/nodes?&labelSelector=nvidia.com%2Fgpu.present%3Dtrue%2Cgpuscale.io%2Fmanaged%3Dtrue&limit=500";
        expect(
            &mut handle,
            Method::GET,
            first,
            200,
            json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"continue": "stale"},
                   "items": []}),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            &format!("{first}&continue=stale"),
            410,
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                   "message": "The provided continue parameter is too old", "reason": "Expired",
                   "code": 410}),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            first,
            200,
            json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {"continue": "page-2"},
                   "items": []}),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            &format!("{first}&continue=page-2"),
            200,
            nodes(vec![json!({"metadata": {"name": "gpu-a", "labels": {
                "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/mig.config": "gpuscale-0000000001"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}})]),
        )
        .await;
        agents_found(&mut handle, port).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // The next tick, within 30 s: no rebuild.
        expect(&mut handle, Method::GET, OWNED, 200, deployments(&[])).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
    });
    let observed = backend.tick(std::slice::from_ref(&m), now).await;
    let cluster = observed.cluster.expect("an inventory from the nodes");
    assert_eq!(cluster.nodes.len(), 1);
    let n = &cluster.nodes[0];
    assert_eq!(n.gpu_model, "H100-80GB");
    assert_eq!(n.gpus.len(), 2);
    assert_eq!(n.gpus[0].mode, gpuscale_policies::GpuMode::Mig);
    assert_eq!(n.gpus[0].uuid.as_deref(), Some("GPU-a0"));
    assert_eq!(n.gpus[0].workloads[0].model, "llama");
    assert_eq!(n.gpus[0].workloads[0].slot, Some(0));
    assert_eq!(n.gpus[1].health, gpuscale_policies::Health::Unhealthy);
    let observed = backend
        .tick(std::slice::from_ref(&m), now + Duration::from_secs(1))
        .await;
    assert!(observed.cluster.is_none());
    server.await.unwrap();
}

/// The `gpuscale-agent` Service's EndpointSlices: one agent on loopback
/// at `port`.
async fn agents_found(handle: &mut Handle, port: u16) {
    expect(
        handle,
        Method::GET,
        "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=kubernetes.io%2Fservice-name%3Dgpuscale-agent",
        200,
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
               "items": [{"metadata": {"name": "gpuscale-agent-x"}, "addressType": "IPv4",
                          "ports": [{"name": "http", "port": port}],
                          "endpoints": [{"addresses": ["127.0.0.1"]}]}]}),
    )
    .await;
}

/// A node agent that accepts connections and never answers (NVML hung
/// on a GPU that fell off the bus); its port.
async fn hung_agent() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    port
}

/// The API side of a leader's first tick and then one tick per further
/// port, each rebuilding the inventory of node `gpu-a` (one H100) with
/// the agent on that port.
async fn serve_rebuilds(handle: &mut Handle, ports: &[u16]) {
    lease_created(handle, "gpuscale-0").await;
    leader_after_lease_with(handle, false).await;
    for (i, &port) in ports.iter().enumerate() {
        if i > 0 {
            // A leader's later tick.
            expect(handle, Method::GET, OWNED, 200, deployments(&[])).await;
            expect(handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        }
        expect(
            handle,
            Method::GET,
            "/api/v1/nodes?&labelSelector=nvidia.com%2Fgpu.present%3Dtrue%2Cgpuscale.io%2Fmanaged%3Dtrue&limit=500",
            200,
            nodes(vec![json!({"metadata": {"name": "gpu-a", "labels": {
                "nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "1",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]}})]),
        )
        .await;
        agents_found(handle, port).await;
        expect(handle, Method::GET, SLICES, 200, slices(&[])).await;
    }
}

/// A hung node agent does not hold up a later tick that rebuilds the
/// inventory: the tick returns within the agents' wait (the cluster comes
/// in a later tick, once every agent answered or the deadline passed).
/// The first rebuild of a leadership term is waited for: without it the
/// new leader would act with no plan. Read inside the tick, a hung agent
/// took its 5 s request timeout every rebuild.
async fn a_hung_agent_does_not_hold_up_the_tick() {
    let (k, mut handle, pods) = kube_with_pods(spec(), "gpuscale-0");
    let _pods = pods_api(pods, json!([]));
    let (gw, _) = common::stand_in_gateway(common::quiet()).await;
    let mut backend = Backend::Kube(
        KubeBackend::new(k, gpuscale_autoscaler::observe::GatewayClient::new(&gw))
            .inventory_from_nodes(),
    );
    // Slower than the later rebuilds' 200 ms wait.
    let good = slow_agent(
        json!({"node": "gpu-a", "gpus": []}),
        Duration::from_millis(600),
    )
    .await;
    let hung = hung_agent().await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move { serve_rebuilds(&mut handle, &[good, hung]).await });
    // The term's first rebuild: waited for, slow agent and all.
    let observed = backend.tick(std::slice::from_ref(&m), now).await;
    assert!(
        observed.cluster.is_some(),
        "the first inventory of the term"
    );
    // A later one whose agent hangs: the tick does not wait for it.
    let began = std::time::Instant::now();
    let observed = backend
        .tick(std::slice::from_ref(&m), now + Duration::from_secs(31))
        .await;
    let took = began.elapsed();
    assert!(
        observed.cluster.is_none(),
        "the hung agent's reading is not in yet"
    );
    // The agents' wait is 200 ms; the hung agent's own timeout is 5 s.
    assert!(took < Duration::from_secs(3), "the tick took {took:?}");
    server.await.unwrap();
}

/// A rebuild whose agent answers after the tick's 200 ms wait is taken up
/// by a later tick, with no second list of nodes or pods.
async fn a_later_tick_takes_up_a_rebuild_its_agents_finished() {
    let (k, mut handle, pods) = kube_with_pods(spec(), "gpuscale-0");
    let _pods = pods_api(pods, json!([]));
    let (gw, _) = common::stand_in_gateway(common::quiet()).await;
    let mut backend = Backend::Kube(
        KubeBackend::new(k, gpuscale_autoscaler::observe::GatewayClient::new(&gw))
            .inventory_from_nodes(),
    );
    let reading = json!({"node": "gpu-a", "gpus": []});
    let quick = stand_in_agent(reading.clone()).await;
    let slow = slow_agent(reading, Duration::from_millis(600)).await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move {
        serve_rebuilds(&mut handle, &[quick, slow]).await;
        // The tick that takes the finished rebuild up lists nothing more.
        expect(&mut handle, Method::GET, OWNED, 200, deployments(&[])).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
    });
    assert!(
        backend
            .tick(std::slice::from_ref(&m), now)
            .await
            .cluster
            .is_some()
    );
    let later = now + Duration::from_secs(31);
    assert!(
        backend
            .tick(std::slice::from_ref(&m), later)
            .await
            .cluster
            .is_none(),
        "the slow agent has not answered within the tick's wait"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let observed = backend
        .tick(std::slice::from_ref(&m), later + Duration::from_secs(1))
        .await;
    assert_eq!(observed.cluster.expect("taken up").nodes.len(), 1);
    server.await.unwrap();
}

/// A pod that starts after the first list reaches the next inventory
/// through the watch, with no list of the pods again: a training worker
/// that takes GPU 0 of `gpu-a` between two rebuilds keeps that GPU out
/// of the second one.
async fn a_pod_started_after_the_list_reaches_the_next_inventory() {
    let (k, mut handle, pods) = kube_with_pods(spec(), "gpuscale-0");
    let worker = json!({"metadata": {"name": "trainer-0", "namespace": "training",
                                     "resourceVersion": "6"},
                        "spec": {"nodeName": "gpu-a", "containers": [{"name": "worker",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                        "status": {"phase": "Running"}});
    let _pods = pods_api_with(
        pods,
        json!([]),
        vec![json!({"type": "ADDED", "object": worker})],
    );
    let (gw, _) = common::stand_in_gateway(common::quiet()).await;
    let mut backend = Backend::Kube(
        KubeBackend::new(k, gpuscale_autoscaler::observe::GatewayClient::new(&gw))
            .inventory_from_nodes(),
    );
    let agent = stand_in_agent(json!({"node": "gpu-a", "gpus": []})).await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move { serve_rebuilds(&mut handle, &[agent, agent]).await });
    let first = backend.tick(std::slice::from_ref(&m), now).await;
    let gpu = |c: &gpuscale_policies::Cluster| c.nodes[0].gpus[0].health;
    // The watch's event may come before or after the first rebuild read
    // the store; by the second it is in.
    let _ = first.cluster.expect("the first inventory");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = backend
        .tick(std::slice::from_ref(&m), now + Duration::from_secs(31))
        .await
        .cluster
        .expect("the second inventory");
    assert_eq!(gpu(&second), gpuscale_policies::Health::Unhealthy);
    server.await.unwrap();
}

/// The agents are read at most `at_once` at a time, all of them, and one
/// that has not answered by the deadline is left out rather than waited
/// for; one that refuses connections or sends no reading is left out too.
#[tokio::test]
async fn agents_are_read_a_bounded_number_at_a_time_within_a_deadline() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut agents = Vec::new();
    for i in 0..12 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (in_flight, most) = (in_flight.clone(), most.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (in_flight, most) = (in_flight.clone(), most.clone());
                tokio::spawn(async move {
                    let svc =
                        hyper::service::service_fn(move |_req: Request<hyper::body::Incoming>| {
                            let (in_flight, most) = (in_flight.clone(), most.clone());
                            async move {
                                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                in_flight.fetch_sub(1, Ordering::SeqCst);
                                let body =
                                    json!({"node": format!("gpu-{i}"), "gpus": []}).to_string();
                                Ok::<_, std::convert::Infallible>(Response::new(
                                    http_body_util::Full::new(bytes::Bytes::from(body)),
                                ))
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        agents.push(format!("http://127.0.0.1:{port}"));
    }
    // Not a reading, and a port nothing listens on.
    let odd = stand_in_agent(json!({"hello": 1})).await;
    agents.push(format!("http://127.0.0.1:{odd}"));
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    agents.push(format!("http://127.0.0.1:{closed}"));
    agents.push(format!("http://127.0.0.1:{}", hung_agent().await));
    // An agent on node `elsewhere` that speaks for gpu-0 after gpu-0's own
    // agent has: left out, so gpu-0's reading stays its own agent's.
    let impostor = slow_agent(
        json!({"node": "gpu-0", "driverVersion": "impostor", "gpus": []}),
        Duration::from_millis(400),
    )
    .await;
    let mut agents: Vec<(String, Option<String>)> = agents
        .into_iter()
        .enumerate()
        .map(|(i, a)| (a, (i < 12).then(|| format!("gpu-{i}"))))
        .collect();
    agents.insert(
        0,
        (
            format!("http://127.0.0.1:{impostor}"),
            Some("elsewhere".into()),
        ),
    );
    let began = std::time::Instant::now();
    let readings = gpuscale_autoscaler::backend::read_agents(
        agents,
        4,
        tokio::time::Instant::now() + Duration::from_millis(1500),
    )
    .await;
    let took = began.elapsed();
    let nodes: Vec<&str> = readings.keys().map(String::as_str).collect();
    let mut want: Vec<String> = (0..12).map(|i| format!("gpu-{i}")).collect();
    want.sort();
    assert_eq!(nodes, want);
    assert_eq!(
        readings["gpu-0"].driver_version, None,
        "the impostor's reading"
    );
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 4, "{most} reads at once");
    assert!(most >= 2, "the reads overlap ({most} at once at most)");
    // Left at the deadline, not at the hung agent's 5 s timeout.
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

/// The gateway's instances come from its Service's EndpointSlices (the
/// port named `admin`): each replica is registered with every instance,
/// each taking half of the replica's limit of 32.
async fn replicas_are_registered_with_every_gateway_instance_found() {
    let (k, mut handle) = kube_with(spec(), "gpuscale-0", false);
    let (gw_a, seen_a) = common::stand_in_gateway(common::quiet()).await;
    let (gw_b, seen_b) = common::stand_in_gateway(common::quiet()).await;
    let port = |u: &str| u.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let (pa, pb) = (port(&gw_a), port(&gw_b));
    let mut backend = Backend::Kube(
        KubeBackend::new(
            k,
            gpuscale_autoscaler::observe::GatewayClient::new("http://127.0.0.1:9"),
        )
        .discovering_gateways("gpuscale-gateway", "admin", true),
    );
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let gateway_slices = |port: u16| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
               "items": [{"metadata": {"name": format!("gpuscale-gateway-{port}")}, "addressType": "IPv4",
                          "ports": [{"name": "http", "port": 8080}, {"name": "admin", "port": port}],
                          "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}]}]})
    };
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        leader_after_lease_with(&mut handle, false).await;
        let both = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
            "items": [gateway_slices(pa)["items"][0].clone(), gateway_slices(pb)["items"][0].clone()]});
        expect(
            &mut handle,
            Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=kubernetes.io%2Fservice-name%3Dgpuscale-gateway",
            200,
            both,
        )
        .await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&["10.0.0.7"])).await;
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    server.await.unwrap();
    for seen in [&seen_a, &seen_b] {
        assert_eq!(
            seen.seen.lock().unwrap().as_slice(),
            [
                r#"POST {"endpoint":"http://10.0.0.7:8000","maxConcurrency":16,"model":"meta-llama/Llama-3.1-8B-Instruct"}"#
            ]
        );
    }
}

/// Sidecar gateways front their own pod's server: the controller finds
/// them and reads them, and registers nothing with them.
async fn sidecar_gateways_are_read_not_registered_with() {
    let (k, mut handle) = kube_with(spec(), "gpuscale-0", false);
    let (gw, seen) = common::stand_in_gateway(common::quiet()).await;
    let port: u16 = gw.rsplit(':').next().unwrap().parse().unwrap();
    let mut backend = Backend::Kube(
        KubeBackend::new(k, gpuscale_autoscaler::observe::GatewayClient::new(&gw))
            .discovering_gateways("qwen-gateway", "gateway-admin", false),
    );
    let m = model();
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        leader_after_lease_with(&mut handle, false).await;
        expect(
            &mut handle,
            Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=kubernetes.io%2Fservice-name%3Dqwen-gateway",
            200,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
                   "items": [{"metadata": {"name": "q"}, "addressType": "IPv4",
                              "ports": [{"name": "gateway", "port": 8080}, {"name": "gateway-admin", "port": port}],
                              "endpoints": [{"addresses": ["127.0.0.1"]}]}]}),
        )
        .await;
        expect(
            &mut handle,
            Method::GET,
            SLICES,
            200,
            slices(&["10.0.0.7", "10.0.0.8"]),
        )
        .await;
    });
    backend
        .tick(std::slice::from_ref(&m), Duration::from_secs(1_795_976_401))
        .await;
    server.await.unwrap();
    assert!(seen.seen.lock().unwrap().is_empty(), "nothing registered");
    assert_eq!(backend.ready(std::slice::from_ref(&m))["llama"], 2);
}

/// A variant as listed: (name, spec.replicas, status.readyReplicas,
/// hand-over annotations: planned, until).
type Listed<'a> = (&'a str, u32, u32, Option<(&'a str, &'a str)>);

/// A DeploymentList of model `llama`'s variants.
fn variants_list(items: &[Listed<'_>]) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|(name, n, ready, held)| {
            let mut meta = json!({"name": name, "resourceVersion": format!("rv-{name}"),
                                  "labels": {"gpuscale.io/model": "llama", "app.kubernetes.io/managed-by": "gpuscale"}});
            if let Some((planned, until)) = held {
                meta["annotations"] = json!({"gpuscale.io/handover-planned": planned, "gpuscale.io/handover-until": until});
            }
            json!({"metadata": meta,
                   "spec": {"replicas": n, "selector": {"matchLabels": {"gpuscale.io/variant": name}},
                            "template": {"metadata": {}}},
                   "status": {"replicas": n, "readyReplicas": ready}})
        })
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {}, "items": items})
}

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/inference/deployments";

/// A `/scale` patch of Deployment `name`: the count it set.
async fn scaled(handle: &mut Handle, name: &str) -> Value {
    let path = format!("{DEPLOYMENTS}/{name}/scale?");
    expect(handle, Method::PATCH, &path, 200, scale_reply(0)).await["spec"]["replicas"].clone()
}

/// One merge patch of Deployment `name`: its replicas and its hand-over
/// annotations (planned, until; `Null` when removed), written together.
async fn hold_written(handle: &mut Handle, name: &str) -> (Value, Value, Value) {
    let path = format!("{DEPLOYMENTS}/{name}?");
    let reply = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}});
    let h = expect(handle, Method::PATCH, &path, 200, reply).await;
    assert_eq!(h["__content_type"], "application/merge-patch+json");
    let a = &h["metadata"]["annotations"];
    (
        h["spec"]["replicas"].clone(),
        a["gpuscale.io/handover-planned"].clone(),
        a["gpuscale.io/handover-until"].clone(),
    )
}

/// The variant a move leaves.
const OLD: &str = "llama-h100-80gb-3g-40gb";

/// The first tick and the move of the scenarios below: three replicas of
/// `llama` run as variant [`OLD`]; the decision (5 on whole GPUs, variant
/// `llama`) applies the new variant first, then keeps the old one's 3 and
/// records its hold (the plan's 0, until `until`) in one write.
async fn a_move_of_three(handle: &mut Handle, until: &str) {
    lease_created(handle, "gpuscale-0").await;
    let owned = variants_list(&[(OLD, 3, 3, None)]);
    expect(handle, Method::GET, OWNED, 200, owned).await;
    let policy = "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama";
    expect(handle, Method::GET, policy, 200, policy_reply()).await;
    expect(handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
    expect(handle, Method::GET, SLICES, 200, slices(&[])).await;
    let service =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpuscale-llama"}});
    service_absent(handle, "llama").await;
    expect(handle, Method::PATCH, SERVICE, 200, service).await;
    let missing = status_reply(404, "NotFound");
    expect(
        handle,
        Method::GET,
        &format!("{DEPLOYMENTS}/llama"),
        404,
        missing,
    )
    .await;
    new_variant_applied(handle).await;
    assert_eq!(scaled(handle, "llama").await, 5);
    let written = hold_written(handle, OLD).await;
    assert_eq!(
        written,
        (json!(3), json!("0"), json!(until)),
        "held at 3 with the plan's 0, not scaled to 0"
    );
    expect(handle, Method::POST, EVENTS, 201, event_reply()).await;
    expect(handle, Method::PATCH, STATUS, 200, policy_reply()).await;
}

/// The server-side apply of variant `llama`'s Deployment.
async fn new_variant_applied(handle: &mut Handle) {
    let applied =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"}});
    let apply = format!("{DEPLOYMENTS}/llama?&force=true&fieldManager=gpuscale");
    expect(handle, Method::PATCH, &apply, 200, applied).await;
}

/// A plan that moves a model's replicas to another variant is made before
/// it breaks: the old variant keeps its replicas, with the count the plan
/// gave it and a deadline recorded on it, and loses one for each new
/// replica ready; the hold's annotations go when it is done. The count the
/// controller reads back is the decision, not the held replicas.
async fn a_move_keeps_the_old_variant_serving_until_the_new_one_is_ready() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    // The default startupTime is 1m: the hold ends 2 minutes on.
    let until = (1_795_976_401u64 + 120).to_string();
    let server = tokio::spawn(async move {
        let held =
            |n: u32, ready: u32| -> Listed<'_> { (OLD, n, ready, Some(("0", until.as_str()))) };
        a_move_of_three(&mut handle, &until).await;
        // 1 of the 5 new replicas ready, 4 not: the 3 old ones serve on,
        // nothing is written. Then 4 ready: one old one serves on. Then
        // all 5: the last old one goes, then its hold.
        for (ready, old, to) in [(1, 3, None), (4, 3, Some(1)), (5, 1, Some(0))] {
            let list = variants_list(&[("llama", 5, ready, None), held(old, old)]);
            expect(&mut handle, Method::GET, OWNED, 200, list).await;
            match to {
                Some(0) => {
                    let gone = hold_written(&mut handle, OLD).await;
                    assert_eq!(gone, (json!(0), Value::Null, Value::Null));
                }
                Some(to) => assert_eq!(scaled(&mut handle, OLD).await, to),
                None => {}
            }
            expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
            expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        }
        handle
    });
    let models = std::slice::from_ref(&m);
    let observed = backend.tick(models, now).await;
    assert_eq!(observed.replicas["llama"], 3);
    backend.apply(&[change(&m, 3)], None, None, now).await;
    for s in 1..=3 {
        let observed = backend.tick(models, now + Duration::from_secs(s)).await;
        assert_eq!(
            observed.replicas["llama"], 5,
            "the decision, not those held"
        );
    }
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "a write once the hand-over is done").await;
}

/// Decisions come between ticks too (on the gateway's pushes): one that
/// follows a move before the Deployments are read again sees the hold the
/// move wrote. Here the model goes to zero: the held variant's count and
/// its hold go together in one write.
async fn a_decision_before_the_next_tick_sees_the_hold_it_wrote() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let until = (1_795_976_401u64 + 120).to_string();
    let server = tokio::spawn(async move {
        a_move_of_three(&mut handle, &until).await;
        // To zero before any read: the new variant scaled, then the held
        // one's count and hold removed together.
        new_variant_applied(&mut handle).await;
        assert_eq!(scaled(&mut handle, "llama").await, 0);
        let gone = hold_written(&mut handle, OLD).await;
        assert_eq!(gone, (json!(0), Value::Null, Value::Null));
        expect(&mut handle, Method::POST, EVENTS, 201, event_reply()).await;
        expect(&mut handle, Method::PATCH, STATUS, 200, policy_reply()).await;
        handle
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    backend.apply(&[change(&m, 3)], None, None, now).await;
    let to_zero = Change {
        rec: Recommendation {
            replicas: 0,
            reason: "idle for 5m → 0 replicas".into(),
            mode: Mode::ScaledToZero,
        },
        ..change(&m, 5)
    };
    backend.apply(&[to_zero], None, None, now).await;
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "another write").await;
}

/// The first change of the scenarios below: `llama`'s Service read
/// (absent) and applied, its variant applied and scaled to 5, the
/// decision recorded (Event, status).
async fn first_change_to_five(handle: &mut Handle) {
    let service =
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpuscale-llama"}});
    service_absent(handle, "llama").await;
    expect(handle, Method::PATCH, SERVICE, 200, service).await;
    new_variant_applied(handle).await;
    assert_eq!(scaled(handle, "llama").await, 5);
    expect(handle, Method::POST, EVENTS, 201, event_reply()).await;
    expect(handle, Method::PATCH, STATUS, 200, policy_reply()).await;
}

/// A leader's tick within the retry period that writes nothing: the
/// Deployments listed (`owned`), no hand-off, no endpoint.
async fn quiet_tick(handle: &mut Handle, owned: Value) {
    expect(handle, Method::GET, OWNED, 200, owned).await;
    expect(handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
    expect(handle, Method::GET, SLICES, 200, slices(&[])).await;
}

/// A variant the plan has left and that stays idle is deleted after
/// `IDLE_VARIANT_TTL`, on the condition that it has not changed since it
/// was listed; the variant the plan runs, and every variant of a model
/// this leader has not changed yet, are kept. A change writes nothing to
/// a variant already at zero (each variant a model ever ran stayed, and
/// every change scaled them all to zero again).
async fn an_idle_variant_the_plan_left_is_deleted_after_a_while() {
    let long_lease = KubeSpec {
        lease_duration: Duration::from_secs(6 * 3600),
        renew_deadline: Duration::from_secs(4 * 3600),
        retry_period: Duration::from_secs(3 * 3600),
        ..spec()
    };
    let (mut backend, mut handle, _gw) = backend_with(long_lease, "gpuscale-0").await;
    let m = model();
    let t0 = Duration::from_secs(1_795_976_401);
    let ttl = gpuscale_autoscaler::backend::IDLE_VARIANT_TTL;
    let server = tokio::spawn(async move {
        let both = |n: u32| variants_list(&[("llama", n, n, None), (OLD, 0, 0, None)]);
        lease_created(&mut handle, "gpuscale-0").await;
        // A new leader, no change applied yet: the idle variant stays,
        // however long it waits.
        expect(&mut handle, Method::GET, OWNED, 200, both(2)).await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        expect(&mut handle, Method::GET, OWNED, 200, both(2)).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // A change: the plan runs `llama`, and OLD, at zero, is not
        // written to.
        first_change_to_five(&mut handle).await;
        // Idle and left by the plan from the next tick on; kept until
        // the TTL has passed.
        for _ in 0..2 {
            quiet_tick(&mut handle, both(5)).await;
        }
        // Then deleted, provided it is still the version listed. Refused
        // first (a webhook, a Role without delete): logged, the tick goes
        // on, and the next one tries again.
        expect(&mut handle, Method::GET, OWNED, 200, both(5)).await;
        expect(
            &mut handle,
            Method::DELETE,
            &format!("{DEPLOYMENTS}/{OLD}?"),
            403,
            status_reply(403, "Forbidden"),
        )
        .await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        expect(&mut handle, Method::GET, OWNED, 200, both(5)).await;
        let reply =
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": OLD}});
        let deleted = expect(
            &mut handle,
            Method::DELETE,
            &format!("{DEPLOYMENTS}/{OLD}?"),
            200,
            reply,
        )
        .await;
        assert_eq!(
            deleted["preconditions"]["resourceVersion"],
            format!("rv-{OLD}")
        );
        assert_eq!(deleted["propagationPolicy"], "Background");
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // Gone from the list: nothing more.
        let one = variants_list(&[("llama", 5, 5, None)]);
        expect(&mut handle, Method::GET, OWNED, 200, one).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    let models = std::slice::from_ref(&m);
    backend.tick(models, t0).await;
    let t1 = t0 + ttl * 2;
    backend.tick(models, t1).await;
    backend.apply(&[change(&m, 2)], None, None, t1).await;
    let t2 = t1 + Duration::from_secs(1);
    backend.tick(models, t2).await;
    backend
        .tick(models, t2 + ttl - Duration::from_secs(1))
        .await;
    backend.tick(models, t2 + ttl).await;
    backend
        .tick(models, t2 + ttl + Duration::from_secs(1))
        .await;
    backend
        .tick(models, t2 + ttl + Duration::from_secs(2))
        .await;
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "another write").await;
}

/// What a leader planned and how long it saw a variant idle say nothing
/// about its next term: it loses the lease (another controller took it),
/// gets it back 20 minutes of cluster time later, and deletes nothing on
/// the first ticks of the new term, though the variant was idle and
/// unplanned past the TTL by the old term's bookkeeping.
async fn a_new_leadership_term_forgets_what_the_last_planned_and_saw_idle() {
    // Renewals every second: the ticks before the first are well inside
    // it, even on a slow machine.
    let timing = KubeSpec {
        lease_duration: Duration::from_secs(5),
        renew_deadline: Duration::from_secs(3),
        retry_period: Duration::from_secs(1),
        request_timeout: Duration::from_secs(1),
        ..spec()
    };
    let (mut backend, mut handle, _gw) = backend_with(timing, "gpuscale-0").await;
    let m = model();
    let t0 = Duration::from_secs(1_795_976_401);
    let both = |n: u32| variants_list(&[("llama", n, n, None), (OLD, 0, 0, None)]);
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(&mut handle, Method::GET, OWNED, 200, both(2)).await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // A change: `llama` planned, OLD not.
        first_change_to_five(&mut handle).await;
        // OLD seen idle and unplanned.
        quiet_tick(&mut handle, both(5)).await;
        // The renewal is refused: another controller holds the lease (for
        // one second, so that it can be taken back soon).
        expect(
            &mut handle,
            Method::PUT,
            &format!("{LEASE}?"),
            409,
            status_reply(409, "Conflict"),
        )
        .await;
        let mut theirs = lease("gpuscale-1", "2026-11-29T18:30:01.000000Z", "9");
        theirs["spec"]["leaseDurationSeconds"] = 1.into();
        expect(&mut handle, Method::GET, LEASE, 200, theirs.clone()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // Unchanged for over a second: taken back, a new term.
        expect(&mut handle, Method::GET, LEASE, 200, theirs).await;
        let ours = expect(
            &mut handle,
            Method::PUT,
            &format!("{LEASE}?"),
            200,
            lease("gpuscale-0", "2026-11-29T18:50:01.000000Z", "10"),
        )
        .await;
        assert_eq!(ours["spec"]["holderIdentity"], "gpuscale-0");
        // Its first reads: nothing deleted (the old term's bookkeeping
        // would have OLD idle for 20 minutes), nor on the next tick.
        expect(&mut handle, Method::GET, OWNED, 200, both(5)).await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        quiet_tick(&mut handle, both(5)).await;
        handle
    });
    let models = std::slice::from_ref(&m);
    backend.tick(models, t0).await;
    backend.apply(&[change(&m, 2)], None, None, t0).await;
    backend.tick(models, t0 + Duration::from_secs(1)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let observed = backend.tick(models, t0 + Duration::from_secs(2)).await;
    assert!(observed.replicas.is_empty(), "following");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let later = t0 + Duration::from_secs(20 * 60);
    let observed = backend.tick(models, later).await;
    assert!(observed.took_over);
    backend.tick(models, later + Duration::from_secs(1)).await;
    let mut handle = server.await.unwrap();
    silent(
        &mut handle,
        100,
        "a delete from the last term's bookkeeping",
    )
    .await;
}

/// A MIG drain evicting a held variant's pods would see them created
/// again (its count still holds them): the drain ends the hold first, in
/// one write of the count the plan gave it, then evicts.
async fn a_mig_drain_ends_the_hold_of_the_variant_it_evicts() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let draining = node(
        "h100-0",
        json!({"gpuscale.io/mig-handoff": "draining", "nvidia.com/mig.config": "gpuscale-old"}),
        json!({"gpuscale.io/mig-handoff-config": "gpuscale-new", "gpuscale.io/mig-handoff-reason": "…"}),
    );
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        // Three held on the old variant for three new ones not ready yet:
        // the hold stands (nothing written) until the drain.
        let until = "1795999999";
        let list = variants_list(&[("llama", 3, 0, None), (OLD, 3, 3, Some(("0", until)))]);
        expect(&mut handle, Method::GET, OWNED, 200, list).await;
        let policy = "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama";
        expect(&mut handle, Method::GET, policy, 200, policy_reply()).await;
        expect(
            &mut handle,
            Method::GET,
            HANDOFFS,
            200,
            nodes(vec![draining]),
        )
        .await;
        let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
            {"metadata": {"name": "old-1", "labels": {"gpuscale.io/variant": OLD}},
             "spec": {"containers": [{"name": "m",
                "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]}}]});
        expect(&mut handle, Method::GET, PODS_ON, 200, pods).await;
        let ended = hold_written(&mut handle, OLD).await;
        assert_eq!(ended, (json!(0), Value::Null, Value::Null));
        let evicted =
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201});
        let eviction = "/api/v1/namespaces/inference/pods/old-1/eviction?";
        expect(&mut handle, Method::POST, eviction, 201, evicted).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    let observed = backend.tick(std::slice::from_ref(&m), now).await;
    assert_eq!(observed.replicas["llama"], 3);
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "another write").await;
}

/// The API does not say which GPU a pod holds, and mig-parted cannot
/// change a GPU a process runs on: where a GPU switches into MIG mode
/// (`mig-handoff-evict: gpus` on the node) a drain evicts gpuscale's
/// pods that hold a whole GPU or a share of one as well as its MIG pods;
/// a new layout of MIG GPUs (`mig`) evicts the MIG pods alone, as a GPU
/// in MIG mode is never handed out whole. A hand-off recorded without the
/// note (an older release's) evicts every GPU pod, the safe side. A pod
/// of gpuscale's that holds no GPU is left alone every time.
async fn a_mig_drain_evicts_whole_and_shared_gpu_pods_too() {
    let (mut backend, mut handle, _gw) = backend_with(spec(), "gpuscale-0").await;
    let m = model();
    let now = Duration::from_secs(1_795_976_401);
    let draining = |evict: Option<&str>| {
        let mut annotations = json!({"gpuscale.io/mig-handoff-config": "gpuscale-new",
                                     "gpuscale.io/mig-handoff-reason": "…"});
        if let Some(e) = evict {
            annotations["gpuscale.io/mig-handoff-evict"] = e.into();
        }
        node(
            "h100-0",
            json!({"gpuscale.io/mig-handoff": "draining", "nvidia.com/mig.config": "gpuscale-old"}),
            annotations,
        )
    };
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(
            &mut handle,
            Method::GET,
            OWNED,
            200,
            deployments(&[("llama", 1)]),
        )
        .await;
        policy_read(&mut handle).await;
        expect(
            &mut handle,
            Method::GET,
            HANDOFFS,
            200,
            nodes(vec![draining(Some("gpus"))]),
        )
        .await;
        let pod = |name: &str, limits: Value| {
            json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "m",
                "resources": {"limits": limits}}]}})
        };
        let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
            pod("whole", json!({"nvidia.com/gpu": "2", "cpu": "8"})),
            pod("shared", json!({"nvidia.com/gpu.shared": "1"})),
            pod("slice", json!({"nvidia.com/mig-3g.40gb": "1"})),
            pod("cpu-only", json!({"cpu": "1", "memory": "1Gi"})),
        ]});
        expect(&mut handle, Method::GET, PODS_ON, 200, pods.clone()).await;
        let evicted =
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201});
        for name in ["whole", "shared", "slice"] {
            let eviction = format!("/api/v1/namespaces/inference/pods/{name}/eviction?");
            expect(&mut handle, Method::POST, &eviction, 201, evicted.clone()).await;
        }
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // A new layout of MIG GPUs only: the MIG pod alone goes.
        next_tick(&mut handle, nodes(vec![draining(Some("mig"))])).await;
        expect(&mut handle, Method::GET, PODS_ON, 200, pods.clone()).await;
        let eviction = "/api/v1/namespaces/inference/pods/slice/eviction?";
        expect(&mut handle, Method::POST, eviction, 201, evicted.clone()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        // Unrecorded: every GPU pod.
        next_tick(&mut handle, nodes(vec![draining(None)])).await;
        expect(&mut handle, Method::GET, PODS_ON, 200, pods).await;
        for name in ["whole", "shared", "slice"] {
            let eviction = format!("/api/v1/namespaces/inference/pods/{name}/eviction?");
            expect(&mut handle, Method::POST, &eviction, 201, evicted.clone()).await;
        }
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        handle
    });
    for i in 0..3 {
        backend
            .tick(
                std::slice::from_ref(&m),
                now + Duration::from_millis(i * 10),
            )
            .await;
    }
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "another write").await;
}

/// Sidecar mode's controller (`pack: false`): a whole term — elected,
/// policies listed and watched, a model's first Deployment applied and
/// scaled, the decision recorded, the lease released — reads no Node and
/// no Pod (no MIG hand-off to move on, no inventory), and the rules its
/// requests need are exactly the Role of `deploy/overlays/sidecar/rbac.yaml`.
async fn a_controller_that_packs_nothing_needs_its_overlays_role_and_no_node() {
    let packless = KubeSpec {
        pack: false,
        ..spec()
    };
    let (k, mut handle) = kube_with(packless, "gpuscale-0", false);
    let (gw, _) = common::stand_in_gateway(common::quiet()).await;
    let mut backend = Backend::Kube(
        KubeBackend::new(k, gpuscale_autoscaler::observe::GatewayClient::new(&gw))
            .watching_policies(),
    );
    let policies = json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicyList",
        "metadata": {"resourceVersion": "10"},
        "items": [{"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy",
             "metadata": {"name": "llama", "namespace": "inference", "resourceVersion": "8",
                          "uid": "5d3c0c8e-0000-4000-8000-00000000aaaa",
                          "creationTimestamp": "2026-11-01T00:00:00Z"},
             "spec": {"servedName": "meta-llama/Llama-3.1-8B-Instruct",
                      "resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}}]});
    let sent = Arc::new(Mutex::new(Vec::<(String, String, String)>::new()));
    let unexpected = Arc::new(Mutex::new(Vec::<String>::new()));
    // The applied objects' bodies, by path.
    let applied = Arc::new(Mutex::new(BTreeMap::<String, Value>::new()));
    // gpuscale's Deployments as listed: none, until the test says.
    let owned = Arc::new(Mutex::new(deployments(&[])));
    let (record, strays, bodies) = (sent.clone(), unexpected.clone(), applied.clone());
    let listed = owned.clone();
    // The watch runs beside the ticks: answered by path, not in order.
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let entry = recorded(&req);
            let (method, path) = (req.method().clone(), entry.1.clone());
            record.lock().unwrap().push(entry);
            let bytes = req.into_body().collect_bytes().await.unwrap();
            if method == Method::PATCH
                && let Ok(v) = serde_json::from_slice::<Value>(&bytes)
            {
                bodies.lock().unwrap().insert(path.clone(), v);
            }
            let deployment = "/apis/apps/v1/namespaces/inference/deployments/llama";
            let named = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"}});
            let (status, reply) = match (&method, path.as_str()) {
                (_, p)
                    if p.starts_with(
                        "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies?",
                    ) =>
                {
                    if p.contains("watch=true") {
                        held.push(send);
                        continue;
                    }
                    (200, policies.clone())
                }
                (&Method::GET, LEASE) => (404, status_reply(404, "NotFound")),
                (&Method::POST, LEASES) => {
                    (201, lease("gpuscale-0", "2026-11-29T18:20:01.000000Z", "1"))
                }
                (&Method::PUT, p) if p == format!("{LEASE}?") => {
                    (200, lease("", "2026-11-29T18:20:02.000000Z", "2"))
                }
                (&Method::GET, OWNED) => (200, listed.lock().unwrap().clone()),
                // Not listed as gpuscale's: read before it is applied.
                (&Method::GET, p) if p == deployment => (404, status_reply(404, "NotFound")),
                (&Method::PATCH, p) if p == format!("{deployment}/scale?") => (200, scale_reply(5)),
                (&Method::PATCH, p) if p.starts_with(deployment) => (200, named),
                (&Method::GET, "/api/v1/namespaces/inference/services/gpuscale-llama") => {
                    (404, status_reply(404, "NotFound"))
                }
                (&Method::PATCH, SERVICE) => (
                    200,
                    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpuscale-llama"}}),
                ),
                (&Method::GET, SLICES) => (200, slices(&["10.0.0.7"])),
                (&Method::POST, EVENTS) => (201, event_reply()),
                (&Method::PATCH, STATUS) => (200, policy_reply()),
                (
                    &Method::GET,
                    "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama",
                ) => (404, status_reply(404, "NotFound")),
                _ => {
                    strays.lock().unwrap().push(format!("{method} {path}"));
                    (403, status_reply(403, "Forbidden"))
                }
            };
            answer(send, status, &reply);
        }
    });
    let now = Duration::from_secs(1_795_976_401);
    let mut models = vec![model()];
    let handed = first_policies(&mut backend, &models, now).await;
    models = handed.unwrap_or_else(|| {
        panic!(
            "the watched policies, once listed (requests outside sidecar mode's role: {:?})",
            unexpected.lock().unwrap()
        )
    });
    assert_eq!(models.len(), 1);
    backend
        .apply(&[change(&models[0], 0)], None, None, now)
        .await;
    assert_eq!(
        backend.desired()["llama"],
        5,
        "{:#?} {:?}",
        sent.lock().unwrap(),
        unexpected.lock().unwrap()
    );
    backend.tick(&models, now + Duration::from_secs(1)).await;
    // The policy edited to two GPUs a replica, its count unchanged: the
    // roll applies its Deployment with the policy's request as it is now,
    // not the one the last change applied.
    let first = applied
        .lock()
        .unwrap()
        .iter()
        .find(|(p, _)| p.contains("/deployments/llama?"))
        .map(|(_, b)| b["metadata"]["annotations"]["gpuscale.io/template"].clone())
        .expect("the first apply");
    *owned.lock().unwrap() = templated(&[("llama", first.as_str().unwrap(), 1, 1)]);
    applied
        .lock()
        .unwrap()
        .retain(|p, _| !p.contains("/deployments/llama?"));
    let mut edited = models.clone();
    edited[0].tensor_parallel = vec![2];
    backend.tick(&edited, now + Duration::from_secs(2)).await;
    backend.roll(&edited, None).await;
    let rolled = applied
        .lock()
        .unwrap()
        .iter()
        .find(|(p, _)| p.contains("/deployments/llama?"))
        .map(|(_, b)| b.clone())
        .expect("the edited policy rolled");
    assert_eq!(
        rolled["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        json!("2"),
        "{rolled:#}"
    );
    backend.shutdown().await;
    server.abort();
    let strays = unexpected.lock().unwrap().clone();
    assert!(
        strays.is_empty(),
        "requests outside sidecar mode's role: {strays:?}"
    );
    let sent = sent.lock().unwrap().clone();
    // The policy owns its Deployment and Service: Kubernetes' garbage
    // collector removes them with it.
    let applied = applied.lock().unwrap().clone();
    for object in ["/deployments/llama?", "/services/gpuscale-llama?"] {
        let body = applied
            .iter()
            .find(|(p, _)| p.contains(object))
            .map(|(_, b)| b)
            .unwrap_or_else(|| panic!("{object} applied: {:#?}", applied.keys()));
        assert_eq!(
            body["metadata"]["ownerReferences"],
            json!([{"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "name": "llama",
                    "uid": "5d3c0c8e-0000-4000-8000-00000000aaaa", "controller": true}]),
            "{object}"
        );
    }
    for write in [
        "/deployments/llama/scale?",
        "/deployments/llama?",
        "/status?",
    ] {
        assert!(
            sent.iter()
                .any(|(m, p, _)| m == "PATCH" && p.contains(write)),
            "no PATCH of {write} in {sent:#?}"
        );
    }
    assert_eq!(
        rbac::needed_by(&sent),
        rbac::granted_by("deploy/overlays/sidecar/rbac.yaml"),
        "deploy/overlays/sidecar/rbac.yaml differs from what a controller that packs nothing needs"
    );
}

/// `llama`'s variants on two nodes' whole GPUs, as a plan names them.
fn two_node_plan(m: &Model) -> gpuscale_packer::Plan {
    let text = "apiVersion: gpuscale.io/v1alpha1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  nodes:\n    - {name: a, gpuModel: H100-80GB, gpuCount: 1, sharing: []}\n    - {name: b, gpuModel: H100-80GB, gpuCount: 1, sharing: []}\n";
    let cluster = gpuscale_policies::load::load_sources(&[(Path::new("c.yaml"), text)])
        .unwrap()
        .cluster
        .unwrap();
    let wanted = BTreeMap::from([("llama".to_string(), 2)]);
    let plan = gpuscale_packer::pack(
        &cluster,
        std::slice::from_ref(m),
        &wanted,
        &Default::default(),
    )
    .unwrap();
    let names: Vec<&str> = plan.models[0]
        .variants
        .iter()
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(names, ["llama-h100-80gb-tp1-a", "llama-h100-80gb-tp1-b"]);
    plan
}

/// A DeploymentList of `llama`'s variants: (name, the digest it was
/// applied with, its generation, the generation its controller observed),
/// one replica each, updated and ready.
fn templated(items: &[(&str, &str, i64, i64)]) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|(name, digest, generation, observed)| {
            // An empty digest: none (applied before the annotation).
            let annotations = if digest.is_empty() {
                json!({})
            } else {
                json!({"gpuscale.io/template": digest})
            };
            json!({"metadata": {"name": name, "generation": generation,
                                "labels": {"gpuscale.io/model": "llama", "app.kubernetes.io/managed-by": "gpuscale"},
                                "annotations": annotations},
                   "spec": {"replicas": 1, "selector": {"matchLabels": {"gpuscale.io/variant": name}},
                            "template": {"metadata": {}}},
                   "status": {"observedGeneration": observed, "replicas": 1, "updatedReplicas": 1, "readyReplicas": 1}})
        })
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {}, "items": items})
}

/// A pod template that changed while the counts did not (a new image in
/// the controller's settings) is rolled out with no decision: one
/// Deployment of the model at a time, the next only once the first has
/// rolled, so the model never loses more than one variant's replicas.
async fn a_changed_pod_template_rolls_one_deployment_of_a_model_at_a_time() {
    let spec = KubeSpec {
        image: "vllm/vllm-openai:v0.11.0".into(),
        ..spec()
    };
    let (mut backend, mut handle, _gw) = backend_with(spec.clone(), "gpuscale-0").await;
    let m = model();
    let plan = two_node_plan(&m);
    let digest = |v: &Variant| {
        gpuscale_autoscaler::kubernetes::deployment(&m, v, &spec)
            .metadata
            .annotations
            .unwrap()[gpuscale_autoscaler::kubernetes::TEMPLATE]
            .clone()
    };
    let (a, b) = (
        plan.models[0].variants[0].clone(),
        plan.models[0].variants[1].clone(),
    );
    let (new_a, new_b) = (digest(&a), digest(&b));
    let now = Duration::from_secs(1_795_976_401);
    let apply = |name: &str| format!("{DEPLOYMENTS}/{name}?&force=true&fieldManager=gpuscale");
    let reply = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}});

    // Both run the old image, rolled out: the first is applied, and only
    // it.
    let old = "0123456789abcdef";
    let owned = templated(&[(&a.name, old, 1, 1), (&b.name, old, 1, 1)]);
    let (apply_a, reply_a) = (apply(&a.name), reply.clone());
    let want_a = new_a.clone();
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(&mut handle, Method::GET, OWNED, 200, owned).await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        let body = expect(&mut handle, Method::PATCH, &apply_a, 200, reply_a).await;
        assert_eq!(
            body["metadata"]["annotations"]["gpuscale.io/template"],
            json!(want_a)
        );
        assert_eq!(
            body["spec"]["template"]["spec"]["containers"][0]["image"],
            "vllm/vllm-openai:v0.11.0"
        );
        handle
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    backend.roll(std::slice::from_ref(&m), Some(&plan)).await;
    let mut handle = server.await.unwrap();
    // Until it is read again, the model waits.
    backend.roll(std::slice::from_ref(&m), Some(&plan)).await;
    silent(
        &mut handle,
        100,
        "a second Deployment before the first was read again",
    )
    .await;

    let m1 = std::slice::from_ref(&m);
    // Read mid-rollout (its new generation not yet observed): still one.
    let owned = templated(&[(&a.name, &new_a, 2, 1), (&b.name, old, 1, 1)]);
    let mut handle = roll_round(&mut backend, handle, m1, &plan, owned, 1, None).await;
    silent(
        &mut handle,
        100,
        "a second Deployment while the first rolls",
    )
    .await;

    // Rolled: the second goes, with its own digest.
    let owned = templated(&[(&a.name, &new_a, 2, 2), (&b.name, old, 1, 1)]);
    let applies = Some((b.name.clone(), new_b.clone()));
    let handle = roll_round(&mut backend, handle, m1, &plan, owned, 2, applies).await;

    // Both current: nothing to roll.
    let owned = templated(&[(&a.name, &new_a, 2, 2), (&b.name, &new_b, 2, 2)]);
    let mut handle = roll_round(&mut backend, handle, m1, &plan, owned, 3, None).await;
    silent(
        &mut handle,
        100,
        "a Deployment applied with nothing changed",
    )
    .await;

    // A bad template stuck mid-rollout (an image that cannot be pulled),
    // then the settings fixed: the stuck one takes the fix at once, not
    // waiting for its own rollout, which would never end.
    let owned = templated(&[(&a.name, "badbadbadbadbad0", 3, 2), (&b.name, &new_b, 2, 2)]);
    let applies = Some((a.name.clone(), new_a.clone()));
    let handle = roll_round(&mut backend, handle, m1, &plan, owned, 4, applies).await;

    // One applied before the digest existed is rolled like a change.
    let owned = templated(&[(&a.name, &new_a, 4, 4), (&b.name, "", 1, 1)]);
    let applies = Some((b.name.clone(), new_b.clone()));
    let mut handle = roll_round(&mut backend, handle, m1, &plan, owned, 5, applies).await;
    silent(&mut handle, 100, "more than one").await;
}

/// One later tick (`at` seconds after the scenarios' start) that reads
/// `owned`, then a roll that applies `applies` (the Deployment and the
/// digest its apply carries) or nothing.
async fn roll_round(
    backend: &mut Backend,
    mut handle: Handle,
    models: &[Model],
    plan: &gpuscale_packer::Plan,
    owned: Value,
    at: u64,
    applies: Option<(String, String)>,
) -> Handle {
    let server = tokio::spawn(async move {
        quiet_tick(&mut handle, owned).await;
        if let Some((name, digest)) = applies {
            let path = format!("{DEPLOYMENTS}/{name}?&force=true&fieldManager=gpuscale");
            let reply =
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}});
            let body = expect(&mut handle, Method::PATCH, &path, 200, reply).await;
            assert_eq!(
                body["metadata"]["annotations"]["gpuscale.io/template"],
                json!(digest)
            );
        }
        handle
    });
    let now = Duration::from_secs(1_795_976_401 + at);
    backend.tick(models, now).await;
    backend.roll(models, Some(plan)).await;
    server.await.unwrap()
}

/// A rollout is over when it is done, or stalled past its progress
/// deadline (a replica that cannot be placed holds nobody's rollout up for
/// ever); one in progress is not.
#[test]
fn a_rollout_is_over_when_done_or_past_its_deadline() {
    use gpuscale_autoscaler::kubernetes::settled;
    let d = |generation: i64, status: Value| -> k8s_openapi::api::apps::v1::Deployment {
        serde_json::from_value(json!({"metadata": {"name": "d", "generation": generation},
            "spec": {"replicas": 2, "selector": {}, "template": {}}, "status": status}))
        .unwrap()
    };
    let done =
        json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2});
    assert!(settled(&d(2, done.clone())));
    assert!(!settled(&d(3, done)), "a newer spec not yet observed");
    let pending =
        json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 1});
    assert!(!settled(&d(2, pending)));
    let stalled = json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "readyReplicas": 1,
        "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]});
    assert!(settled(&d(2, stalled.clone())));
    assert!(
        !settled(&d(3, stalled)),
        "the last rollout's stall, before a new apply was observed"
    );
    // The deadline is past the startup probe's budget: a slow but
    // healthy start (15 minutes by default) is not read as stalled.
    let spec = spec();
    let v = gpuscale_autoscaler::kubernetes::whole_gpu_variant(&model(), 1);
    let built = gpuscale_autoscaler::kubernetes::deployment(&model(), &v, &spec);
    let deadline = built.spec.unwrap().progress_deadline_seconds.unwrap();
    assert!(
        i64::from(deadline) > spec.startup_timeout.as_secs() as i64,
        "{deadline}"
    );
    let surplus =
        json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 2, "readyReplicas": 3});
    assert!(!settled(&d(2, surplus)), "old pods still going");
}

/// A decision that meets two running variants of one model whose pod
/// template changed rolls the first only: the second is applied with the
/// pods it runs (its count and spares change, its template and digest do
/// not), for the roll to take later.
async fn a_change_rolls_one_changed_variant_and_keeps_the_others_pods() {
    let spec = KubeSpec {
        image: "vllm/vllm-openai:v0.11.0".into(),
        ..spec()
    };
    let (mut backend, mut handle, _gw) = backend_with(spec.clone(), "gpuscale-0").await;
    let m = model();
    let plan = two_node_plan(&m);
    let (a, b) = (
        plan.models[0].variants[0].clone(),
        plan.models[0].variants[1].clone(),
    );
    let new_a = gpuscale_autoscaler::kubernetes::deployment(&m, &a, &spec)
        .metadata
        .annotations
        .unwrap()[gpuscale_autoscaler::kubernetes::TEMPLATE]
        .clone();
    let now = Duration::from_secs(1_795_976_401);
    let old = "0123456789abcdef";
    let owned = templated(&[(&a.name, old, 1, 1), (&b.name, old, 1, 1)]);
    let (name_a, name_b) = (a.name.clone(), b.name.clone());
    let server = tokio::spawn(async move {
        lease_created(&mut handle, "gpuscale-0").await;
        expect(&mut handle, Method::GET, OWNED, 200, owned).await;
        policy_read(&mut handle).await;
        expect(&mut handle, Method::GET, HANDOFFS, 200, no_nodes()).await;
        expect(&mut handle, Method::GET, SLICES, 200, slices(&[])).await;
        service_absent(&mut handle, "llama").await;
        let service =
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gpuscale-llama"}});
        expect(&mut handle, Method::PATCH, SERVICE, 200, service).await;
        let reply =
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}});
        let apply = |name: &str| format!("{DEPLOYMENTS}/{name}?&force=true&fieldManager=gpuscale");
        // The first: its new template.
        let body = expect(
            &mut handle,
            Method::PATCH,
            &apply(&name_a),
            200,
            reply.clone(),
        )
        .await;
        assert_eq!(
            body["metadata"]["annotations"]["gpuscale.io/template"],
            json!(new_a)
        );
        assert_eq!(
            body["spec"]["template"]["spec"]["containers"][0]["image"],
            "vllm/vllm-openai:v0.11.0"
        );
        scaled(&mut handle, &name_a).await;
        // The second: read, and applied with the template it runs.
        let live_template = json!({"metadata": {"labels": {"gpuscale.io/variant": name_b}},
            "spec": {"containers": [{"name": "server", "image": "vllm/vllm-openai:v0.10.0"}]}});
        let live = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name_b, "annotations": {"gpuscale.io/template": old}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"gpuscale.io/variant": name_b}},
                     "template": live_template}});
        expect(
            &mut handle,
            Method::GET,
            &format!("{DEPLOYMENTS}/{name_b}"),
            200,
            live,
        )
        .await;
        let body = expect(&mut handle, Method::PATCH, &apply(&name_b), 200, reply).await;
        assert_eq!(body["metadata"]["annotations"]["gpuscale.io/template"], old);
        assert_eq!(body["spec"]["template"], live_template);
        scaled(&mut handle, &name_b).await;
        expect(&mut handle, Method::POST, EVENTS, 201, event_reply()).await;
        expect(&mut handle, Method::PATCH, STATUS, 200, policy_reply()).await;
        handle
    });
    backend.tick(std::slice::from_ref(&m), now).await;
    backend
        .apply(&[change(&m, 2)], Some(&plan), None, now)
        .await;
    let mut handle = server.await.unwrap();
    silent(&mut handle, 100, "more than the change").await;
}

/// Runs each scenario as its own test, and all of them in one test that
/// then derives the RBAC rules the requests need.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod scenario {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name().await
                }
            )*
        }

        /// Every scenario, then: the (group, resource, verb) set their
        /// requests need is exactly what `deploy/base/rbac.yaml` grants.
        #[tokio::test]
        async fn the_roles_grant_exactly_what_the_requests_need() {
            $( $name().await; )*
            rbac::check();
        }
    };
}

scenarios!(
    scale_is_a_merge_patch_of_the_scale_subresource,
    a_variant_is_a_server_side_applied_deployment_requesting_its_device,
    a_time_sliced_mig_variant_asks_for_a_share_on_nodes_sliced_that_way,
    a_tensor_parallel_variant_gets_its_size_and_its_token_and_cache_as_files,
    a_fractional_variant_requests_hamis_resources_and_carries_its_annotations,
    a_decision_event_and_the_status_patch,
    dry_run_sends_no_write,
    endpoint_slices_give_the_ready_replicas,
    many_models_endpoints_take_one_list_per_fifty_services,
    a_policy_that_does_not_decode_does_not_fail_the_list,
    only_the_servers_own_trouble_is_worth_waiting_for,
    the_backend_leads_discovers_and_applies_a_decision,
    a_registration_no_slice_shows_is_removed_after_a_restart,
    a_failed_status_write_stops_no_scaling,
    a_change_whose_write_fails_is_reported_for_the_next_round,
    a_service_gpuscale_did_not_create_is_not_taken_over,
    a_deployment_gpuscale_did_not_create_is_not_adopted,
    a_follower_writes_nothing,
    a_leader_that_cannot_renew_in_time_stops_writing,
    the_leader_releases_the_lease_on_shutdown,
    a_mig_handoff_drains_waits_for_the_mig_manager_and_uncordons,
    a_node_that_left_the_pool_mid_drain_is_uncordoned_and_others_handoffs_are_left_alone,
    a_node_that_left_the_pool_gets_no_new_handoff_from_a_plan_that_still_names_it,
    a_refused_handoff_write_holds_up_neither_other_nodes_nor_the_leader,
    the_mig_parted_configmap_keeps_configs_other_nodes_name,
    a_controller_taking_over_reads_the_live_count_first_and_holds_it,
    a_dry_run_beside_keda_starts_from_the_replicas_keda_runs,
    watched_policies_reach_the_controller_each_on_its_own,
    a_deleted_policys_replicas_leave_the_gateway,
    the_inventory_comes_from_the_nodes_and_the_agents,
    a_hung_agent_does_not_hold_up_the_tick,
    a_later_tick_takes_up_a_rebuild_its_agents_finished,
    a_pod_started_after_the_list_reaches_the_next_inventory,
    replicas_are_registered_with_every_gateway_instance_found,
    sidecar_gateways_are_read_not_registered_with,
    a_move_keeps_the_old_variant_serving_until_the_new_one_is_ready,
    a_decision_before_the_next_tick_sees_the_hold_it_wrote,
    an_idle_variant_the_plan_left_is_deleted_after_a_while,
    a_new_leadership_term_forgets_what_the_last_planned_and_saw_idle,
    a_mig_drain_ends_the_hold_of_the_variant_it_evicts,
    a_mig_drain_evicts_whole_and_shared_gpu_pods_too,
    a_controller_that_packs_nothing_needs_its_overlays_role_and_no_node,
    a_changed_pod_template_rolls_one_deployment_of_a_model_at_a_time,
    a_change_rolls_one_changed_variant_and_keeps_the_others_pods,
);

/// RBAC from the recorded requests, as the API server authorises them
/// (`k8s.io/apiserver` request info): the verb from the method (GET of a
/// name: `get`; of a collection: `list`, or `watch` with `watch=true`;
/// POST: `create`; PUT: `update`; PATCH: `patch`, and a server-side apply
/// that may create the object also needs `create`, and of a Deployment or
/// Service `delete`: its owner reference), the resource with its
/// subresource, and where: the controller's namespace (`inference` in the
/// scenarios), the GPU Operator's, `default` (Events about Nodes), or
/// cluster-wide.
mod rbac {
    use super::*;

    /// (scope, apiGroup, resource, verb); scope is `namespace`, `default`,
    /// `gpu-operator` or `cluster`.
    pub type Rule = (String, String, String, String);

    pub fn needed() -> BTreeSet<Rule> {
        needed_by(&super::SENT.lock().unwrap())
    }

    /// The rules `sent` (method, path with query, content type) needs.
    pub fn needed_by(sent: &[(String, String, String)]) -> BTreeSet<Rule> {
        let mut out = BTreeSet::new();
        for (method, path, content_type) in sent {
            let (path, query) = path.split_once('?').unwrap_or((path, ""));
            let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
            let (group, rest) = match parts[0] {
                "api" => (String::new(), &parts[2..]),
                "apis" => (parts[1].to_string(), &parts[3..]),
                other => panic!("not an API path: {other}"),
            };
            let (scope, rest) = if rest[0] == "namespaces" && rest.len() > 2 {
                let scope = match rest[1] {
                    "gpu-operator" => "gpu-operator",
                    "default" => "default",
                    other => {
                        assert_eq!(other, "inference", "{path}");
                        "namespace"
                    }
                };
                (scope, &rest[2..])
            } else {
                ("cluster", rest)
            };
            let resource = match rest {
                [r] | [r, _] => r.to_string(),
                [r, _, sub] => format!("{r}/{sub}"),
                _ => panic!("{path}"),
            };
            let named = rest.len() >= 2;
            let mut verbs = vec![];
            match method.as_str() {
                "GET" if named => verbs.push("get"),
                "GET" if query.split('&').any(|q| q == "watch=true") => verbs.push("watch"),
                "GET" => verbs.push("list"),
                "POST" => verbs.push("create"),
                "PUT" => verbs.push("update"),
                "PATCH" => {
                    verbs.push("patch");
                    if content_type == "application/apply-patch+yaml" {
                        verbs.push("create");
                        // The apply may set `ownerReferences` (the model's
                        // policy), which OwnerReferencesPermissionEnforcement
                        // (on by default in OpenShift) lets only a caller
                        // that may delete the object change.
                        if ["deployments", "services"].contains(&resource.as_str()) {
                            verbs.push("delete");
                        }
                    }
                }
                "DELETE" => verbs.push("delete"),
                m => panic!("{m}"),
            }
            for v in verbs {
                out.insert((scope.into(), group.clone(), resource.clone(), v.into()));
            }
        }
        out
    }

    pub fn granted() -> BTreeSet<Rule> {
        granted_by("deploy/base/rbac.yaml")
    }

    /// The rules the Roles and ClusterRoles in `file` (from the
    /// repository's root) grant.
    pub fn granted_by(file: &str) -> BTreeSet<Rule> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(file);
        let text = std::fs::read_to_string(&path).expect(file);
        let mut out = BTreeSet::new();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc).unwrap();
            let kind = v["kind"].as_str().unwrap_or_default();
            let scope = match kind {
                "ClusterRole" => "cluster".to_string(),
                "Role" if v["metadata"]["namespace"] == "gpu-operator" => "gpu-operator".into(),
                "Role" if v["metadata"]["namespace"] == "default" => "default".into(),
                "Role" => "namespace".into(),
                _ => continue,
            };
            for rule in v["rules"].as_array().unwrap() {
                for g in rule["apiGroups"].as_array().unwrap() {
                    for r in rule["resources"].as_array().unwrap() {
                        for verb in rule["verbs"].as_array().unwrap() {
                            out.insert((
                                scope.clone(),
                                g.as_str().unwrap().into(),
                                r.as_str().unwrap().into(),
                                verb.as_str().unwrap().into(),
                            ));
                        }
                    }
                }
            }
        }
        out
    }

    pub fn check() {
        let needed = needed();
        let granted = granted();
        let missing: Vec<&Rule> = needed.difference(&granted).collect();
        let extra: Vec<&Rule> = granted.difference(&needed).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "deploy/base/rbac.yaml differs from what the controller's requests need\n\
             missing (scope, group, resource, verb): {missing:#?}\n\
             granted but never used: {extra:#?}"
        );
    }
}

/// An MPS share gets its fraction and no `/dev/shm` of its own (the
/// device plugin mounts the MPS daemon's there); the policy's
/// `serverArgs` come after gpuscale's; a model too large for the default
/// cache volume gets one its size.
#[test]
fn an_mps_share_keeps_the_daemons_shm_and_the_policys_server_args_follow() {
    let text = "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: big\nspec:\n  serverArgs: [--max-model-len, \"8192\"]\n  resources:\n    memoryGiB: 60\n    compute: 0.3\n    maxConcurrency: 32\n";
    let model = gpuscale_policies::load::load_sources(&[(Path::new("m.yaml"), text)])
        .unwrap()
        .models
        .remove(0);
    let variant = Variant {
        name: "big-h100-80gb-mps-2".into(),
        gpu_model: "H100-80GB".into(),
        resources: [("nvidia.com/gpu.shared".to_string(), 1)].into(),
        node_selector: [(
            "nvidia.com/device-plugin.config".to_string(),
            "mps-2".to_string(),
        )]
        .into(),
        annotations: Default::default(),
        labels: Default::default(),
        node_affinity: None,
        replicas: 2,
        spares: 0,
        tensor_parallel: 1,
        memory_fraction: Some(0.475),
    };
    let d = serde_json::to_value(gpuscale_autoscaler::kubernetes::deployment(
        &model,
        &variant,
        &spec(),
    ))
    .unwrap();
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        c["args"],
        json!([
            "--model",
            "big",
            "--port",
            "8000",
            "--gpu-memory-utilization",
            "0.475",
            "--max-model-len",
            "8192"
        ])
    );
    let names: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["cache", "tmp"], "no shm volume under MPS");
    assert!(
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["mountPath"] != "/dev/shm")
    );
    // 60 GiB of weights and cache: 75Gi, above the 40Gi floor.
    assert_eq!(pod["volumes"][0]["emptyDir"]["sizeLimit"], "75Gi");
}

#[test]
fn each_served_name_goes_to_one_policy_the_same_whatever_came_before() {
    use gpuscale_autoscaler::backend::{Claim, claim_served_names};
    let claim = |m: Model, created: Option<u32>| Claim {
        policy: m.name.clone(),
        names: m
            .served_names()
            .into_iter()
            .map(|(f, n)| (f, n.to_string()))
            .collect(),
        created,
        model: Some(m),
    };
    let with_adapter = |name: &str, served: &str, adapter: &str| {
        let mut m = model_named(name, served);
        m.adapters = vec![adapter.to_string()];
        m
    };
    let kept = |c: &gpuscale_autoscaler::backend::Claimed| -> Vec<String> {
        c.kept.iter().map(|m| m.name.clone()).collect()
    };
    // The older of two claims on a served name keeps it, whatever the
    // names sort as; the other is left out, saying why.
    let c = claim_served_names(vec![
        claim(model_named("team-a", "org/chat"), Some(2)),
        claim(model_named("aaa-intruder", "org/chat"), Some(5)),
        claim(with_adapter("team-c", "org/code", "org/code-sql"), Some(1)),
    ]);
    assert_eq!(kept(&c), ["team-a", "team-c"]);
    assert_eq!(c.left_out.len(), 1);
    assert_eq!(c.left_out[0].0, "aaa-intruder");
    assert!(
        c.left_out[0]
            .1
            .contains("spec.servedName: `org/chat` is already served by ModelPolicy `team-a`"),
        "{}",
        c.left_out[0].1
    );
    // An older policy that adds another's served name as an adapter does
    // not take it: a served name goes to its policy before an adapter.
    let c = claim_served_names(vec![
        claim(with_adapter("old", "org/a", "org/b"), Some(1)),
        claim(model_named("new", "org/b"), Some(9)),
    ]);
    assert_eq!(kept(&c), ["new"]);
    assert!(
        c.left_out[0].1.starts_with("spec.adapters[0]: `org/b`"),
        "{:?}",
        c.left_out
    );
    // An invalid policy (no model) still holds its names: a newer one
    // claiming them stays out until the clash is fixed.
    let c = claim_served_names(vec![
        Claim {
            policy: "typo".into(),
            names: vec![("spec.servedName".into(), "org/chat".into())],
            created: Some(1),
            model: None,
        },
        claim(model_named("late", "org/chat"), Some(3)),
    ]);
    assert!(c.kept.is_empty());
    assert_eq!(c.left_out[0].0, "late");
    // Without timestamps, the first by name.
    let c = claim_served_names::<u32>(vec![
        claim(model_named("b", "x"), None),
        claim(model_named("a", "x"), None),
    ]);
    assert_eq!(kept(&c), ["a"]);
    // Two policy names that make one Service name (`.` becomes `-`): the
    // older keeps it, whatever they serve.
    let c = claim_served_names(vec![
        claim(model_named("llama-8b", "org/one"), Some(4)),
        claim(model_named("llama.8b", "org/two"), Some(2)),
    ]);
    assert_eq!(kept(&c), ["llama.8b"]);
    assert_eq!(c.left_out[0].0, "llama-8b");
    assert!(
        c.left_out[0].1.starts_with(
            "metadata.name: its Service `gpuscale-llama-8b` is ModelPolicy `llama.8b`'s"
        ),
        "{}",
        c.left_out[0].1
    );
}

#[test]
fn the_managed_pool_is_equality_terms_only() {
    let spec = |s: &str| KubeSpec {
        node_selector: s.into(),
        ..KubeSpec::default()
    };
    // The default hands a GPU node over only once it is labelled.
    assert_eq!(
        KubeSpec::default().pool_labels().unwrap(),
        BTreeMap::from([
            ("nvidia.com/gpu.present".to_string(), "true".to_string()),
            ("gpuscale.io/managed".to_string(), "true".to_string()),
        ])
    );
    assert_eq!(
        spec("pool=inference, nvidia.com/gpu.present=true")
            .pool_labels()
            .unwrap()
            .len(),
        2
    );
    // What a pod's nodeSelector cannot say is refused, naming the term.
    for bad in [
        "pool!=a",
        "pool in (a,b)",
        "pool",
        "=a",
        "pool==a",
        "a=b=c",
        "",
    ] {
        let e = spec(bad).pool_labels().unwrap_err();
        assert!(e.contains('`'), "{bad}: {e}");
    }
}

#[test]
fn tolerations_are_checked_as_the_api_server_checks_them() {
    use gpuscale_autoscaler::kubernetes::check_toleration;
    use k8s_openapi::api::core::v1::Toleration;
    let t = |key: &str, operator: &str, value: &str, effect: &str, seconds: Option<i64>| {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
        Toleration {
            key: some(key),
            operator: some(operator),
            value: some(value),
            effect: some(effect),
            toleration_seconds: seconds,
        }
    };
    // From the API's rules (core/v1 validation, validateTolerations).
    assert!(check_toleration(&t("nvidia.com/gpu", "Exists", "", "NoSchedule", None)).is_ok());
    assert!(
        check_toleration(&t("pool", "", "gpu", "", None)).is_ok(),
        "Equal is the default"
    );
    assert!(
        check_toleration(&t("", "Exists", "", "", None)).is_ok(),
        "every taint"
    );
    assert!(check_toleration(&t("k", "NoExecute", "", "NoExecute", Some(30))).is_err());
    assert_eq!(
        check_toleration(&t("", "Equal", "v", "", None))
            .unwrap_err()
            .0,
        "operator"
    );
    assert_eq!(
        check_toleration(&t("k", "Exists", "v", "", None))
            .unwrap_err()
            .0,
        "value"
    );
    assert_eq!(
        check_toleration(&t("k", "Exists", "", "Never", None))
            .unwrap_err()
            .0,
        "effect"
    );
    assert_eq!(
        check_toleration(&t("k", "Exists", "", "NoSchedule", Some(5)))
            .unwrap_err()
            .0,
        "tolerationSeconds"
    );
    assert!(check_toleration(&t("k", "Exists", "", "NoExecute", Some(5))).is_ok());
}

#[test]
fn host_resources_scale_with_the_gpus_a_replica_holds() {
    use gpuscale_autoscaler::kubernetes::ServerResources;
    let r = ServerResources {
        cpu: 2.5,
        cpu_limit: 4.0,
        memory_gib: 12.5,
        memory_limit_gib: 16.0,
    };
    let (requests, limits) = r.quantities(1);
    assert_eq!(requests["cpu"], "2500m");
    assert_eq!(requests["memory"], "12800Mi");
    assert_eq!(limits["cpu"], "4");
    assert_eq!(limits["memory"], "16Gi");
    let (requests, limits) = r.quantities(4);
    assert_eq!(requests["cpu"], "10");
    assert_eq!(requests["memory"], "50Gi");
    assert_eq!(
        (limits["cpu"].as_str(), limits["memory"].as_str()),
        ("16", "64Gi")
    );
}
