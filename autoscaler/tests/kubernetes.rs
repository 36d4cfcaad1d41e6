//! The Kubernetes actuator over kube's client and a `tower_test` mock API
//! server: each test states the exact requests (method, path and query,
//! body) the actuator must send and answers them as an API server would.
//! No API server can run where these tests run; this is the contract with
//! one.

use std::path::Path;
use std::time::Duration;

use gpuscale_autoscaler::kubernetes::{Kube, KubeSpec, LeaseStep, lease_step, ready_endpoints};
use gpuscale_autoscaler::{Mode, Recommendation};
use gpuscale_packer::Variant;
use gpuscale_policies::Model;
use gpuscale_policies::model::{RememberedScaleEvent, ScalingMemory, TimedReplicas};
use http::{Method, Request, Response};
use k8s_openapi::api::coordination::v1::Lease;
use kube::client::Body;
use serde_json::{Value, json};

mod common;

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

fn spec() -> KubeSpec {
    KubeSpec {
        namespace: "inference".into(),
        ..KubeSpec::default()
    }
}

fn kube(dry_run: bool) -> (Kube, Handle) {
    let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "inference");
    (
        Kube::new(client, spec(), "gpuscale-0".into(), dry_run),
        handle,
    )
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
    send.send_response(
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Body::from(serde_json::to_vec(&reply).unwrap()))
            .unwrap(),
    );
    body
}

/// The next request is a patch of node `h100-0`; answers with the node and
/// returns the patch body.
async fn expect_node_patch(handle: &mut Handle) -> Value {
    expect(
        handle,
        Method::PATCH,
        "/api/v1/nodes/h100-0?",
        200,
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "h100-0"}}),
    )
    .await
}

fn model() -> Model {
    let text = "apiVersion: gpuscale.io/v1alpha1\nkind: ModelPolicy\nmetadata:\n  name: llama\nspec:\n  servedName: meta-llama/Llama-3.1-8B-Instruct\n  resources:\n    memoryGiB: 21\n    compute: 0.3\n    maxConcurrency: 32\n";
    gpuscale_policies::load::load_sources(&[(Path::new("m.yaml"), text)])
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

/// A tick of the leader that holds `lease` already: the lease read and
/// renewed, the live count read (`replicas` in the Deployment `llama`),
/// the EndpointSlices answered with `slices`.
async fn leader_tick(handle: &mut Handle, lease: &Value, replicas: u32, slices: Value) {
    expect(
        handle,
        Method::GET,
        "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler",
        200,
        lease.clone(),
    )
    .await;
    expect(
        handle,
        Method::PUT,
        "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler?",
        200,
        lease.clone(),
    )
    .await;
    expect(
        handle,
        Method::GET,
        "/apis/apps/v1/namespaces/inference/deployments?&labelSelector=gpuscale.io%2Fmodel%3Dllama",
        200,
        deployments(&[("llama", replicas)]),
    )
    .await;
    expect(handle, Method::GET,
        "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=gpuscale.io%2Fmodel%3Dllama", 200,
        slices).await;
}

/// A DeploymentList of (name, spec.replicas).
fn deployments(items: &[(&str, u32)]) -> Value {
    let items: Vec<Value> = items
        .iter()
        .map(|(name, n)| {
            json!({"metadata": {"name": name, "labels": {"gpuscale.io/model": "llama"}},
                   "spec": {"replicas": n, "selector": {"matchLabels": {"gpuscale.io/variant": name}},
                            "template": {"metadata": {}}}})
        })
        .collect();
    json!({"apiVersion": "apps/v1", "kind": "DeploymentList", "metadata": {}, "items": items})
}

fn scale_reply(replicas: u32) -> Value {
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
           "metadata": {"name": "llama-h100-80gb-3g-40gb", "namespace": "inference"},
           "spec": {"replicas": replicas}, "status": {"replicas": 1}})
}

#[tokio::test]
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

#[tokio::test]
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
        replicas: 3,
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
            json!({"nvidia.com/mig-3g.40gb": "1"})
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
    });
    assert_eq!(k.apply_deployment(&model(), &variant).await.unwrap(), None);
    server.await.unwrap();
}

/// A replica the packer puts on a time-sliced MIG slice becomes a
/// Deployment asking for a share of that profile
/// (`nvidia.com/mig-1g.10gb.shared`) on nodes whose device-plugin config
/// time-slices it that many ways, and nowhere else.
#[tokio::test]
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
            json!({"nvidia.com/mig-1g.10gb.shared": "1"})
        );
        assert_eq!(
            pod["nodeSelector"],
            json!({
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/device-plugin.config": "mig-1g.10gb-timeslice-3",
            })
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

#[tokio::test]
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
        replicas: 2,
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
        assert!(body["metadata"].get("annotations").is_none());
        assert_eq!(
            template["spec"]["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "21463", "nvidia.com/gpucores": "35"})
        );
        assert_eq!(template["spec"]["nodeSelector"]["gpu"], "on");
    });
    assert_eq!(k.apply_deployment(&model(), &variant).await.unwrap(), None);
    server.await.unwrap();
}

#[tokio::test]
async fn a_mig_change_is_a_node_label_patch() {
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        let body = expect_node_patch(&mut handle).await;
        assert_eq!(
            body,
            json!({"metadata": {"labels": {"nvidia.com/mig.config": "gpuscale-h100-0"}},
                   "__content_type": "application/merge-patch+json"})
        );
    });
    k.label_node("h100-0", "gpuscale-h100-0").await.unwrap();
    server.await.unwrap();
    assert!(gpuscale_autoscaler::kubernetes::may_reconfigure(
        &[0, 1],
        &[2, 3]
    ));
    assert!(!gpuscale_autoscaler::kubernetes::may_reconfigure(
        &[0, 1],
        &[1, 2]
    ));
}

#[tokio::test]
async fn a_decision_creates_an_event_and_patches_the_status() {
    let (k, mut handle) = kube(false);
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move {
        let ev = expect(
            &mut handle,
            Method::POST,
            "/apis/events.k8s.io/v1/namespaces/inference/events?",
            201,
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "llama.1"},
                   "eventTime": "2026-11-29T18:20:01.000000Z"}),
        )
        .await;
        assert_eq!(ev["metadata"]["generateName"], "llama.");
        assert_eq!(ev["regarding"]["kind"], "ModelPolicy");
        assert_eq!(ev["regarding"]["name"], "llama");
        assert_eq!(ev["regarding"]["uid"], "u-1");
        assert_eq!(ev["reason"], "Activating");
        assert_eq!(ev["action"], "Scale");
        assert_eq!(ev["reportingController"], "gpuscale.io/gpuscale");
        assert_eq!(ev["reportingInstance"], "gpuscale-0");
        assert_eq!(ev["eventTime"], "2026-11-29T18:20:01.000000Z");
        assert!(ev["note"].as_str().unwrap().contains("→ 5 replicas"));
        let status = expect(
            &mut handle,
            Method::PATCH,
            "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama/status?",
            200,
            json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy",
                   "metadata": {"name": "llama"}, "spec": {"resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}}),
        )
        .await;
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
    let sent = k
        .record("llama", Some("u-1"), 0, &rec(), now, Some(&memory))
        .await
        .unwrap();
    assert!(sent.is_empty(), "sent, not dry-run");
    server.await.unwrap();
}

#[tokio::test]
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
    let writes = k
        .record("llama", None, 1, &rec(), Duration::from_secs(0), None)
        .await
        .unwrap();
    assert_eq!(writes.len(), 2);
    assert!(k.label_node("n", "c").await.unwrap().is_some());
    // Nothing reached the API server.
    drop(k);
    assert!(handle.next_request().await.is_none());
}

fn lease(holder: &str, renewed: &str, rv: &str) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
           "metadata": {"name": "gpuscale-autoscaler", "namespace": "inference", "resourceVersion": rv},
           "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                    "acquireTime": renewed, "renewTime": renewed, "leaseTransitions": 2}})
}

#[tokio::test]
async fn the_lease_is_created_when_absent() {
    let (k, mut handle) = kube(false);
    let now = Duration::from_secs(1_795_976_401);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler",
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
        )
        .await;
        let body = expect(
            &mut handle,
            Method::POST,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases?",
            201,
            lease("gpuscale-0", "2026-11-29T18:20:01.000000Z", "1"),
        )
        .await;
        assert_eq!(body["spec"]["holderIdentity"], "gpuscale-0");
        assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
        assert_eq!(body["spec"]["leaseTransitions"], 0);
        assert_eq!(body["spec"]["renewTime"], "2026-11-29T18:20:01.000000Z");
    });
    assert!(k.lead(now).await.unwrap());
    server.await.unwrap();
}

#[tokio::test]
async fn a_live_lease_held_by_another_is_followed_and_an_expired_one_taken() {
    let now = Duration::from_secs(1_795_976_401); // 18:20:01
    // Renewed 5 s ago by another: follow, write nothing.
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler",
            200,
            lease("gpuscale-1", "2026-11-29T18:19:56.000000Z", "7"),
        )
        .await;
        handle
    });
    assert!(!k.lead(now).await.unwrap());
    let mut handle = server.await.unwrap();
    drop(k);
    assert!(
        handle.next_request().await.is_none(),
        "no write while following"
    );

    // Renewed 20 s ago (15 s lease): take it over with a PUT carrying the
    // resourceVersion read, one more transition.
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler",
            200,
            lease("gpuscale-1", "2026-11-29T18:19:41.000000Z", "7"),
        )
        .await;
        let body = expect(
            &mut handle,
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler?",
            200,
            lease("gpuscale-0", "2026-11-29T18:20:01.000000Z", "8"),
        )
        .await;
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["spec"]["holderIdentity"], "gpuscale-0");
        assert_eq!(body["spec"]["leaseTransitions"], 3);
    });
    assert!(k.lead(now).await.unwrap());
    server.await.unwrap();

    // A conflict on the PUT (someone renewed in between): not leading.
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler",
            200,
            lease("gpuscale-1", "2026-11-29T18:19:41.000000Z", "7"),
        )
        .await;
        expect(
            &mut handle,
            Method::PUT,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler?",
            409,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
        )
        .await;
    });
    assert!(!k.lead(now).await.unwrap());
    server.await.unwrap();
}

#[test]
fn our_own_lease_is_renewed_keeping_its_acquire_time() {
    let l: Lease =
        serde_json::from_value(lease("gpuscale-0", "2026-11-29T18:19:58.000000Z", "3")).unwrap();
    let now = Duration::from_secs(1_795_976_401);
    match lease_step(Some(&l), "gpuscale-0", &spec(), now) {
        LeaseStep::Replace(n) => {
            let s = n.spec.unwrap();
            assert_eq!(s.lease_transitions, Some(2));
            assert_eq!(s.acquire_time, l.spec.unwrap().acquire_time);
            assert_eq!(s.renew_time.unwrap().0.as_second(), 1_795_976_401);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn endpoint_slices_give_the_ready_replicas() {
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        expect(
            &mut handle,
            Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=gpuscale.io%2Fmodel%3Dllama",
            200,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
                   "items": [{"metadata": {"name": "llama-abc"}, "addressType": "IPv4",
                              "ports": [{"name": "http", "port": 8000}],
                              "endpoints": [
                                  {"addresses": ["10.0.0.7"], "conditions": {"ready": true}},
                                  {"addresses": ["10.0.0.8"], "conditions": {"ready": false}},
                                  {"addresses": ["10.0.0.5"], "conditions": {"ready": true}}]}]}),
        )
        .await;
    });
    assert_eq!(
        k.endpoints("llama").await.unwrap(),
        ["http://10.0.0.5:8000", "http://10.0.0.7:8000"]
    );
    server.await.unwrap();
    assert!(ready_endpoints(&[]).is_empty());
}

#[tokio::test]
async fn the_backend_leads_discovers_and_applies_a_decision() {
    use gpuscale_autoscaler::backend::{Backend, Change, KubeBackend};
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "inference");
    let k = Kube::new(client, spec(), "gpuscale-0".into(), false);
    let (gw, gw_state) = common::stand_in_gateway(common::quiet()).await;
    let mut backend = Backend::Kube(KubeBackend::new(
        k,
        gpuscale_autoscaler::observe::GatewayClient::new(&gw),
    ));
    let m = model();
    let now = Duration::from_secs(1_795_976_401);

    // A tick: take the lease, discover the ready pod, hand it to the gateway.
    let server = tokio::spawn(async move {
        expect(&mut handle, Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler", 404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})).await;
        expect(
            &mut handle,
            Method::POST,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases?",
            201,
            lease("gpuscale-0", "2026-11-29T18:20:01.000000Z", "1"),
        )
        .await;
        // Leading: first the live count, then what the last leader
        // remembered (nothing: no status yet).
        expect(&mut handle, Method::GET,
            "/apis/apps/v1/namespaces/inference/deployments?&labelSelector=gpuscale.io%2Fmodel%3Dllama", 200,
            deployments(&[("llama", 1)])).await;
        expect(&mut handle, Method::GET,
            "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama", 200,
            json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "metadata": {"name": "llama"},
                   "spec": {"resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}})).await;
        expect(&mut handle, Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=gpuscale.io%2Fmodel%3Dllama", 200,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
                   "items": [{"metadata": {"name": "llama-abc"}, "addressType": "IPv4",
                              "ports": [{"port": 8000}],
                              "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": true}}]}]})).await;
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
    assert_eq!(backend.ready(std::slice::from_ref(&m))["llama"], 1);

    // The gateway restarts and forgets the replica: the next tick sees it
    // missing from the gateway's list and registers it again.
    gw_state.replicas.lock().unwrap().clear();
    let server = tokio::spawn(async move {
        let ours = lease("gpuscale-0", "2026-11-29T18:20:01.000000Z", "1");
        leader_tick(&mut handle, &ours, 1, json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {},
                   "items": [{"metadata": {"name": "llama-abc"}, "addressType": "IPv4",
                              "ports": [{"port": 8000}],
                              "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": true}}]}]})).await;
        handle
    });
    let observed = backend
        .tick(std::slice::from_ref(&m), now + Duration::from_secs(1))
        .await;
    let mut handle = server.await.unwrap();
    assert!(!observed.took_over);
    assert_eq!(gw_state.seen.lock().unwrap().len(), 2);
    assert_eq!(
        gw_state.replicas.lock().unwrap()["meta-llama/Llama-3.1-8B-Instruct"].len(),
        1
    );

    // A decision: the model's Deployment applied, scaled, recorded.
    let server = tokio::spawn(async move {
        let d = expect(&mut handle, Method::PATCH,
            "/apis/apps/v1/namespaces/inference/deployments/llama?&force=true&fieldManager=gpuscale", 200,
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama"}})).await;
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpu": "1"})
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
        expect(&mut handle, Method::POST, "/apis/events.k8s.io/v1/namespaces/inference/events?", 201,
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "llama.1"},
                   "eventTime": "2026-11-29T18:20:01.000000Z"})).await;
        let st = expect(&mut handle, Method::PATCH,
            "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama/status?", 200,
            json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "metadata": {"name": "llama"},
                   "spec": {"resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}})).await;
        assert_eq!(st["status"]["desiredReplicas"], 5);
        assert_eq!(st["status"]["currentReplicas"], 1);
        handle
    });
    backend
        .apply(
            &[Change {
                model: m.clone(),
                from: 1,
                rec: rec(),
                memory: None,
            }],
            None,
            None,
            now,
        )
        .await;
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
    let memories = std::collections::BTreeMap::from([("llama".to_string(), memory)]);
    backend
        .remember(&memories, now + Duration::from_secs(10))
        .await;
    assert!(
        tokio::time::timeout(Duration::from_millis(100), handle.next_request())
            .await
            .is_err(),
        "the memory written before 15 s had passed"
    );
    let server = tokio::spawn(async move {
        let st = expect(&mut handle, Method::PATCH,
            "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama/status?", 200,
            json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "metadata": {"name": "llama"},
                   "spec": {"resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}}})).await;
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

#[tokio::test]
async fn the_mig_parted_config_is_applied_as_the_gpu_operators_configmap() {
    let (k, mut handle) = kube(false);
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
        assert!(text.contains("mig-enabled: true"));
    });
    assert_eq!(k.apply_mig_configmap(&plan).await.unwrap(), None);
    server.await.unwrap();
}

#[tokio::test]
async fn draining_a_node_for_a_mig_change_cordons_and_evicts_its_mig_pods() {
    let (k, mut handle) = kube(false);
    let server = tokio::spawn(async move {
        let body = expect_node_patch(&mut handle).await;
        assert_eq!(body["spec"]["unschedulable"], true);
        expect(&mut handle, Method::GET,
            "/api/v1/namespaces/inference/pods?&fieldSelector=spec.nodeName%3Dh100-0&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dgpuscale",
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [
                {"metadata": {"name": "llama-mig-1"}, "spec": {"containers": [{"name": "m",
                    "resources": {"limits": {"nvidia.com/mig-3g.40gb": "1"}}}]}},
                {"metadata": {"name": "whole-1"}, "spec": {"containers": [{"name": "m",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}]})).await;
        let ev = expect(
            &mut handle,
            Method::POST,
            "/api/v1/namespaces/inference/pods/llama-mig-1/eviction?",
            201,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
        )
        .await;
        assert_eq!(ev["metadata"]["name"], "llama-mig-1");
        let body = expect_node_patch(&mut handle).await;
        assert_eq!(body["spec"]["unschedulable"], false);
    });
    k.cordon("h100-0", true).await.unwrap();
    let pods = k.mig_pods_on("h100-0").await.unwrap();
    assert_eq!(pods, ["llama-mig-1"], "only pods holding MIG devices");
    for p in pods {
        k.evict(&p).await.unwrap();
    }
    k.cordon("h100-0", false).await.unwrap();
    server.await.unwrap();
}

/// A controller that takes over (a restart, a leader change) reads the
/// live count before anything else it does as leader, and the memory the
/// last leader left; at 6 replicas in a quiet spell it holds 6 (the
/// scale-down window), where one that started from `minReplicas` would
/// have scaled to 1 at once.
#[tokio::test]
async fn a_controller_taking_over_reads_the_live_count_first_and_holds_it() {
    use gpuscale_autoscaler::backend::{Backend, KubeBackend};
    use gpuscale_autoscaler::controller::Controller;
    let (gw, gw_state) = common::stand_in_gateway(common::quiet()).await;
    let settings = common::settings(
        &gw,
        "  scaling:\n    minReplicas: 1\n    maxReplicas: 10\n    targetQueueDepth: 8\n",
        "  kubernetes: {namespace: inference}\n",
    );
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(mock, "inference");
    let k = Kube::new(client, spec(), "gpuscale-1".into(), false);
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let backend = Backend::Kube(KubeBackend::new(k, gateway.clone()));
    let mut controller = Controller::new(settings, gateway, backend);
    let report = controller.report();
    // The last leader recommended 6 a minute ago.
    let a_minute_ago =
        humantime::format_rfc3339_millis(std::time::SystemTime::now() - Duration::from_secs(60))
            .to_string();

    let server = tokio::spawn(async move {
        expect(&mut handle, Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases/gpuscale-autoscaler", 404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404})).await;
        expect(
            &mut handle,
            Method::POST,
            "/apis/coordination.k8s.io/v1/namespaces/inference/leases?",
            201,
            lease("gpuscale-1", "2026-11-29T18:20:01.000000Z", "1"),
        )
        .await;
        // The first thing done as leader: read the live count.
        expect(&mut handle, Method::GET,
            "/apis/apps/v1/namespaces/inference/deployments?&labelSelector=gpuscale.io%2Fmodel%3Dllama", 200,
            deployments(&[("llama", 6)])).await;
        expect(&mut handle, Method::GET,
            "/apis/gpuscale.io/v1alpha1/namespaces/inference/modelpolicies/llama", 200,
            json!({"apiVersion": "gpuscale.io/v1alpha1", "kind": "ModelPolicy", "metadata": {"name": "llama"},
                   "spec": {"resources": {"memoryGiB": 21, "compute": 0.3, "maxConcurrency": 32}},
                   "status": {"currentReplicas": 6, "desiredReplicas": 6,
                              "scalingMemory": {"recommendations": [{"time": a_minute_ago, "replicas": 6}]}}})).await;
        expect(&mut handle, Method::GET,
            "/apis/discovery.k8s.io/v1/namespaces/inference/endpointslices?&labelSelector=gpuscale.io%2Fmodel%3Dllama", 200,
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {}, "items": []})).await;
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
    assert!(
        tokio::time::timeout(Duration::from_millis(200), handle.next_request())
            .await
            .is_err(),
        "a write while holding"
    );
    assert!(gw_state.seen.lock().unwrap().is_empty());

    // Someone scales the Deployment to 3 by hand: the next tick works
    // from 3 (as HPA reads `/scale` every cycle), and 3 is no change to
    // write back.
    let server = tokio::spawn(async move {
        let renewed = lease("gpuscale-1", "2026-11-29T18:20:01.000000Z", "1");
        leader_tick(&mut handle, &renewed, 3, json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList", "metadata": {}, "items": []})).await;
        handle
    });
    controller.tick().await;
    let mut handle = server.await.unwrap();
    let d = report.decisions();
    assert_eq!(d["llama"].latest.as_ref().unwrap().desired, 3);
    assert!(
        tokio::time::timeout(Duration::from_millis(200), handle.next_request())
            .await
            .is_err(),
        "a write after adopting the live count"
    );
}
