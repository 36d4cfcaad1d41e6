//! The Kubernetes manifests in `deploy/`: the base and every overlay
//! render with `kubectl kustomize` (Debian's `kubectl`; `.ci/run` installs
//! it), and every rendered object is what the API server and gpuscale
//! accept:
//!
//! - each object deserialises into its k8s-openapi type with no field the
//!   type does not know (k8s-openapi ignores unknown fields, so the check
//!   is a round trip: every key path of the input must come back), the
//!   `ModelPolicy` objects through gpuscale's own loader, KEDA's
//!   `ScaledObject` field by field;
//! - each container is locked down (non-root 65532, read-only root
//!   filesystem, no privilege escalation, no capabilities, seccomp
//!   `RuntimeDefault`), has requests and limits and probes;
//! - no env var carries a secret as a literal; the admin token Secret is
//!   mounted as a file;
//! - each gpuscale container's config, read from the ConfigMaps and Secret
//!   laid out as its volume mounts lay them out, loads with the loader the
//!   binary uses, and its flags are flags the binary has;
//! - the controller runs 2 replicas, the central gateway 2, the sidecar is
//!   a native sidecar, the KEDA trigger reaches gpuscale's scaler.
//! - the NetworkPolicies, evaluated by the API's documented semantics,
//!   let anyone reach the gateways' traffic ports, only the controller and
//!   Prometheus the admin ports and agents, only KEDA the external scaler,
//!   and only the central gateway the model servers.
//!
//! Without `kubectl` on PATH these tests fail, unless
//! `GPUSCALE_SKIP_KUBECTL=1` says to skip them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, Service, ServiceAccount, Volume,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

/// What `kubectl kustomize` renders, relative to `deploy/`.
const TARGETS: &[&str] = &[
    "base",
    "base/gpu-operator",
    "overlays/central",
    "overlays/sidecar",
    "overlays/keda",
];

/// The admin token Secret every gpuscale container mounts (created by hand,
/// never checked in: deploy/README.md).
const ADMIN_SECRET: &str = "gpuscale-admin-token";

/// The read-only token Secret every gateway mounts, for Prometheus.
const READ_SECRET: &str = "gpuscale-read-token";

/// The renderings that run gpuscale (the base and its overlays; not the
/// GPU Operator's one-off ConfigMap).
const DEPLOYABLE: &[&str] = &[
    "base",
    "overlays/central",
    "overlays/sidecar",
    "overlays/keda",
];

/// The user every container runs as (distroless's `nonroot`).
const NONROOT: i64 = 65532;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What to do without kubectl.
const INSTALL_KUBECTL: &str = "The manifests in deploy/ are rendered with `kubectl kustomize`: \
    install kubectl 1.27 or later (kustomize v5 built in; .ci/run checks for the `kubectl` \
    package), or set GPUSCALE_SKIP_KUBECTL=1 to skip these tests.";

/// Every target's rendered objects, rendered once; `None` when kubectl is
/// missing and `GPUSCALE_SKIP_KUBECTL=1` says to skip.
fn rendered() -> Option<&'static BTreeMap<&'static str, Vec<Value>>> {
    static RENDERED: OnceLock<Option<BTreeMap<&'static str, Vec<Value>>>> = OnceLock::new();
    RENDERED
        .get_or_init(|| {
            let skip = std::env::var("GPUSCALE_SKIP_KUBECTL").is_ok_and(|v| v == "1");
            match Command::new("kubectl")
                .args(["version", "--client"])
                .output()
            {
                Ok(out) if out.status.success() => {}
                Ok(out) if skip => {
                    eprintln!(
                        "skipped: `kubectl version --client` failed ({}), GPUSCALE_SKIP_KUBECTL=1",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    return None;
                }
                Err(e) if skip => {
                    eprintln!("skipped: kubectl not found ({e}), GPUSCALE_SKIP_KUBECTL=1");
                    return None;
                }
                Ok(out) => panic!(
                    "`kubectl version --client` failed: {}\n{INSTALL_KUBECTL}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                Err(e) => panic!("kubectl is not on PATH ({e}).\n{INSTALL_KUBECTL}"),
            }
            Some(
                TARGETS
                    .iter()
                    .map(|&t| (t, documents(t, &kustomize(t))))
                    .collect(),
            )
        })
        .as_ref()
}

fn kustomize(target: &str) -> String {
    let dir = root().join("deploy").join(target);
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "`kubectl kustomize deploy/{target}` failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The documents of a multi-document YAML stream, as JSON values.
fn documents(target: &str, text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(doc)
            .unwrap_or_else(|e| panic!("deploy/{target}: document {i}: {e}"));
        if !value.is_null() {
            out.push(value);
        }
    }
    assert!(!out.is_empty(), "deploy/{target} renders nothing");
    out
}

fn kind(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or("")
}

fn name(o: &Value) -> &str {
    o["metadata"]["name"].as_str().unwrap_or("")
}

fn describe(o: &Value) -> String {
    match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{} {ns}/{}", kind(o), name(o)),
        None => format!("{} {}", kind(o), name(o)),
    }
}

fn of_kind<'a>(objects: &'a [Value], k: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    objects.iter().filter(move |o| kind(o) == k)
}

fn find<'a>(objects: &'a [Value], k: &str, n: &str) -> Option<&'a Value> {
    objects.iter().find(|o| kind(o) == k && name(o) == n)
}

fn deployments(objects: &[Value]) -> Vec<Deployment> {
    of_kind(objects, "Deployment")
        .map(|o| serde_json::from_value(o.clone()).expect("a Deployment"))
        .collect()
}

fn pod_spec(d: &Deployment) -> &PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a pod template")
}

fn dname(d: &Deployment) -> &str {
    d.metadata.name.as_deref().unwrap_or("")
}

/// Every container of a pod: init containers (sidecars) first.
fn containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
}

fn runs_gpuscale(c: &Container) -> bool {
    c.image.as_deref().is_some_and(|i| {
        let repo = i.rsplit_once('/').map_or(i, |(_, r)| r);
        repo == "gpuscale" || repo.starts_with("gpuscale:") || repo.starts_with("gpuscale@")
    })
}

// ---------------------------------------------------------------------------
// Types: every object is a kind we know, with no field its type lacks.

/// Every key path of `value` (objects' keys; arrays by index), except keys
/// whose value is null (absent, to the API server).
fn key_paths(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if v.is_null() {
                    continue;
                }
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.push(path.clone());
                key_paths(v, &path, out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                key_paths(v, &format!("{prefix}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    // Paths are built by `key_paths`: `a.b[2].c`; keys may hold dots
    // (`app.kubernetes.io/name`), so walk the value alongside instead of
    // splitting blindly.
    fn walk<'a>(value: &'a Value, rest: &str) -> Option<&'a Value> {
        if rest.is_empty() {
            return Some(value);
        }
        if let Some(r) = rest.strip_prefix('[') {
            let (index, tail) = r.split_once(']')?;
            let v = value.as_array()?.get(index.parse::<usize>().ok()?)?;
            return walk(v, tail.strip_prefix('.').unwrap_or(tail));
        }
        let map = value.as_object()?;
        // The longest key that prefixes `rest` at a boundary.
        let mut best: Option<(&String, &Value)> = None;
        for (k, v) in map {
            if let Some(tail) = rest.strip_prefix(k.as_str())
                && (tail.is_empty() || tail.starts_with('.') || tail.starts_with('['))
                && best.is_none_or(|(b, _)| k.len() > b.len())
            {
                best = Some((k, v));
            }
        }
        let (k, v) = best?;
        let tail = &rest[k.len()..];
        walk(v, tail.strip_prefix('.').unwrap_or(tail))
    }
    walk(value, path)
}

/// Deserialises into `T` and back; `Err` names the first field of the
/// input that did not come back (a field `T` does not have), or the
/// deserialisation error with its path.
fn strict<T>(input: &Value) -> Result<T, String>
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_path_to_error::deserialize(input.clone())
        .map_err(|e| format!("{}: {}", e.path(), e.inner()))?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut paths = Vec::new();
    key_paths(input, "", &mut paths);
    for p in paths {
        if lookup(&back, &p).is_none() {
            return Err(format!("{p}: unknown field"));
        }
    }
    Ok(typed)
}

fn check_type(o: &Value) -> Result<(), String> {
    match kind(o) {
        "Namespace" => strict::<Namespace>(o).map(drop),
        "ServiceAccount" => strict::<ServiceAccount>(o).map(drop),
        "Role" => strict::<Role>(o).map(drop),
        "ClusterRole" => strict::<ClusterRole>(o).map(drop),
        "RoleBinding" => strict::<RoleBinding>(o).map(drop),
        "ClusterRoleBinding" => strict::<ClusterRoleBinding>(o).map(drop),
        "ConfigMap" => strict::<ConfigMap>(o).map(drop),
        "Service" => strict::<Service>(o).map(drop),
        "Deployment" => strict::<Deployment>(o).map(drop),
        "DaemonSet" => strict::<DaemonSet>(o).map(drop),
        "NetworkPolicy" => strict::<NetworkPolicy>(o).map(drop),
        "PodDisruptionBudget" => strict::<PodDisruptionBudget>(o).map(drop),
        "CustomResourceDefinition" => strict::<CustomResourceDefinition>(o).map(drop),
        "ModelPolicy" => model_policy(o).map(drop),
        "ScaledObject" => scaled_object(o),
        other => Err(format!(
            "kind `{other}`: not one this test checks; add its k8s-openapi type"
        )),
    }
}

/// A ModelPolicy object through gpuscale's own loader (the file format is
/// the custom resource's).
fn model_policy(o: &Value) -> Result<gpuscale_policies::Model, String> {
    if o["apiVersion"] != "gpuscale.io/v1alpha1" {
        return Err(format!(
            "apiVersion {}: expected gpuscale.io/v1alpha1",
            o["apiVersion"]
        ));
    }
    let text = serde_yaml_ng::to_string(o).map_err(|e| e.to_string())?;
    let file = format!("{}.yaml", name(o));
    let bundle = gpuscale_policies::load_sources(&[(Path::new(&file), &text)]).map_err(|p| {
        p.0.iter()
            .map(|p| format!("{p}"))
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let [model] = <[gpuscale_policies::Model; 1]>::try_from(bundle.models)
        .map_err(|m| format!("expected one model, loaded {}", m.len()))?;
    Ok(model)
}

/// KEDA's ScaledObject (no k8s-openapi type): the fields KEDA requires and
/// the external trigger gpuscale serves.
fn scaled_object(o: &Value) -> Result<(), String> {
    if o["apiVersion"] != "keda.sh/v1alpha1" {
        return Err(format!(
            "apiVersion {}: expected keda.sh/v1alpha1",
            o["apiVersion"]
        ));
    }
    let allowed_spec = [
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "idleReplicaCount",
        "initialCooldownPeriod",
        "advanced",
        "fallback",
        "triggers",
    ];
    let spec = o["spec"].as_object().ok_or("spec: missing")?;
    if let Some(k) = spec.keys().find(|k| !allowed_spec.contains(&k.as_str())) {
        return Err(format!("spec.{k}: unknown field"));
    }
    o["spec"]["scaleTargetRef"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
        .ok_or("spec.scaleTargetRef.name: missing")?;
    let triggers = o["spec"]["triggers"]
        .as_array()
        .filter(|t| !t.is_empty())
        .ok_or("spec.triggers: missing or empty")?;
    if triggers[0]["type"] != "external" && triggers[0]["type"] != "external-push" {
        return Err(format!(
            "spec.triggers[0].type: {}, expected external or external-push",
            triggers[0]["type"]
        ));
    }
    let meta = triggers[0]["metadata"]
        .as_object()
        .ok_or("spec.triggers[0].metadata: missing")?;
    for (k, v) in meta {
        if !v.is_string() {
            return Err(format!(
                "spec.triggers[0].metadata.{k}: KEDA's metadata values are strings"
            ));
        }
    }
    for key in ["scalerAddress", "model"] {
        meta.get(key)
            .ok_or(format!("spec.triggers[0].metadata.{key}: missing"))?;
    }
    Ok(())
}

#[test]
fn every_rendered_object_has_its_type_and_no_unknown_field() {
    let Some(all) = rendered() else { return };
    let mut problems = Vec::new();
    for (target, objects) in all {
        for o in objects {
            if let Err(e) = check_type(o) {
                problems.push(format!("deploy/{target}: {}: {e}", describe(o)));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_strict_check_finds_an_unknown_field() {
    let mut d = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x", "labels": {"app.kubernetes.io/name": "x"}},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    });
    strict::<Deployment>(&d).unwrap();
    d["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = serde_json::json!({});
    assert_eq!(
        strict::<Deployment>(&d).unwrap_err(),
        "spec.template.spec.containers[0].securityContxt: unknown field"
    );
}

#[test]
fn every_namespaced_object_names_its_namespace() {
    let Some(all) = rendered() else { return };
    let cluster_scoped = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
    ];
    for (target, objects) in all {
        for o in objects {
            let ns = o["metadata"]["namespace"].as_str();
            if cluster_scoped.contains(&kind(o)) {
                assert_eq!(ns, None, "deploy/{target}: {}", describe(o));
            } else if ns == Some("default") {
                // Only the right to record Events about Nodes, which the
                // API server takes only in `default`.
                assert!(
                    matches!(kind(o), "Role" | "RoleBinding") && name(o) == "gpuscale-node-events",
                    "deploy/{target}: {} is in namespace default",
                    describe(o)
                );
            } else {
                assert!(
                    matches!(ns, Some("gpuscale" | "gpu-operator")),
                    "deploy/{target}: {} is in namespace {ns:?}, expected gpuscale or gpu-operator",
                    describe(o)
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Containers.

fn check_container(c: &Container, sidecar: bool) -> Vec<String> {
    let mut p = Vec::new();
    let sc = c.security_context.clone().unwrap_or_default();
    if sc.run_as_non_root != Some(true) {
        p.push("securityContext.runAsNonRoot is not true".to_string());
    }
    if sc.run_as_user != Some(NONROOT) {
        p.push(format!(
            "securityContext.runAsUser is {:?}, not {NONROOT}",
            sc.run_as_user
        ));
    }
    if sc.read_only_root_filesystem != Some(true) {
        p.push("securityContext.readOnlyRootFilesystem is not true".into());
    }
    if sc.allow_privilege_escalation != Some(false) {
        p.push("securityContext.allowPrivilegeEscalation is not false".into());
    }
    if sc.privileged == Some(true) {
        p.push("securityContext.privileged".into());
    }
    let drop = sc
        .capabilities
        .as_ref()
        .and_then(|c| c.drop.clone())
        .unwrap_or_default();
    if drop != ["ALL"] {
        p.push(format!(
            "securityContext.capabilities.drop is {drop:?}, not [ALL]"
        ));
    }
    if sc
        .capabilities
        .as_ref()
        .and_then(|c| c.add.as_ref())
        .is_some()
    {
        p.push("securityContext.capabilities.add".into());
    }
    if sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) != Some("RuntimeDefault") {
        p.push("securityContext.seccompProfile.type is not RuntimeDefault".into());
    }
    let resources = c.resources.clone().unwrap_or_default();
    for (what, map) in [
        ("requests", &resources.requests),
        ("limits", &resources.limits),
    ] {
        for r in ["cpu", "memory"] {
            if !map.as_ref().is_some_and(|m| m.contains_key(r)) {
                p.push(format!("resources.{what}.{r} missing"));
            }
        }
    }
    for (what, probe) in [
        ("livenessProbe", &c.liveness_probe),
        ("readinessProbe", &c.readiness_probe),
    ] {
        if probe.as_ref().and_then(|p| p.http_get.as_ref()).is_none() {
            p.push(format!("{what} (HTTP) missing"));
        }
    }
    if sidecar && c.startup_probe.is_none() {
        p.push("a native sidecar needs a startupProbe (the next container waits on it)".into());
    }
    if runs_gpuscale(c) {
        // gpuscale serves /healthz and /readyz on its admin port.
        let admin = admin_port(c);
        for (what, probe, path) in [
            ("livenessProbe", &c.liveness_probe, "/healthz"),
            ("readinessProbe", &c.readiness_probe, "/readyz"),
            ("startupProbe", &c.startup_probe, "/healthz"),
        ] {
            let Some(get) = probe.as_ref().and_then(|p| p.http_get.as_ref()) else {
                continue;
            };
            if get.path.as_deref() != Some(path) {
                p.push(format!("{what}: path {:?}, expected {path}", get.path));
            }
            if resolve_port(c, &get.port) != admin {
                p.push(format!("{what}: port {:?} is not the admin port", get.port));
            }
        }
    }
    p
}

/// The container's admin port: the one named `admin` or `*-admin` (the
/// node agent's only port, `http`, serves its probes).
fn admin_port(c: &Container) -> Option<i32> {
    if c.args.as_ref().and_then(|a| a.first()).map(String::as_str) == Some("agent") {
        return c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("http"))
            .map(|p| p.container_port);
    }
    c.ports
        .iter()
        .flatten()
        .find(|p| {
            p.name
                .as_deref()
                .is_some_and(|n| n == "admin" || n.ends_with("-admin"))
        })
        .map(|p| p.container_port)
}

fn resolve_port(c: &Container, port: &IntOrString) -> Option<i32> {
    match port {
        IntOrString::Int(n) => Some(*n),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port),
    }
}

#[test]
fn every_container_is_locked_down_with_resources_and_probes() {
    let Some(all) = rendered() else { return };
    let mut problems = Vec::new();
    for (target, objects) in all {
        let mut workloads: Vec<(String, PodSpec)> = deployments(objects)
            .iter()
            .map(|d| (format!("Deployment {}", dname(d)), pod_spec(d).clone()))
            .collect();
        for o in of_kind(objects, "DaemonSet") {
            let ds: DaemonSet = serde_json::from_value(o.clone()).expect("a DaemonSet");
            let spec = ds
                .spec
                .and_then(|s| s.template.spec)
                .expect("a pod template");
            workloads.push((format!("DaemonSet {}", name(o)), spec));
        }
        for (what, spec) in &workloads {
            for c in containers(spec) {
                let sidecar = c.restart_policy.as_deref() == Some("Always");
                for p in check_container(c, sidecar) {
                    problems.push(format!("deploy/{target}: {what} container {}: {p}", c.name));
                }
            }
            // An init container that is not a native sidecar would run to
            // completion before the pod starts: none here is meant to.
            for c in spec.init_containers.iter().flatten() {
                if c.restart_policy.as_deref() != Some("Always") {
                    problems.push(format!(
                        "deploy/{target}: {what} init container {} is not a native sidecar",
                        c.name
                    ));
                }
            }
            let psc = spec.security_context.clone().unwrap_or_default();
            if psc.run_as_non_root != Some(true)
                || psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()) != Some("RuntimeDefault")
            {
                problems.push(format!(
                    "deploy/{target}: {what}: the pod's securityContext must set runAsNonRoot and seccomp RuntimeDefault"
                ));
            }
            if spec.host_network == Some(true)
                || spec.host_pid == Some(true)
                || spec.host_ipc == Some(true)
            {
                problems.push(format!("deploy/{target}: {what} shares a host namespace"));
            }
            if spec.volumes.iter().flatten().any(|v| v.host_path.is_some()) {
                problems.push(format!("deploy/{target}: {what} mounts a hostPath"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// Secrets.

fn secret_like(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    [
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "API_KEY",
        "APIKEY",
        "CREDENTIAL",
    ]
    .iter()
    .any(|s| n.contains(s))
}

/// Volumes holding a Secret (directly or projected), by volume name.
fn secret_volumes(spec: &PodSpec) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = &v.secret {
            out.entry(v.name.clone())
                .or_default()
                .insert(s.secret_name.clone().unwrap_or_default());
        }
        if let Some(p) = &v.projected {
            for src in p.sources.iter().flatten() {
                if let Some(s) = &src.secret {
                    out.entry(v.name.clone())
                        .or_default()
                        .insert(s.name.clone());
                }
            }
        }
    }
    out
}

#[test]
fn no_secret_is_a_literal_and_the_admin_token_is_a_mounted_secret() {
    let Some(all) = rendered() else { return };
    let mut problems = Vec::new();
    for (target, objects) in all {
        assert!(
            find(objects, "Secret", ADMIN_SECRET).is_none()
                && find(objects, "Secret", READ_SECRET).is_none(),
            "deploy/{target}: the admin token Secret must not be checked in"
        );
        for d in deployments(objects) {
            let spec = pod_spec(&d);
            let secrets = secret_volumes(spec);
            for c in containers(spec) {
                for e in c.env.iter().flatten() {
                    // A file path (GPUSCALE_ADMIN_TOKEN_FILE=/…,
                    // HF_TOKEN_PATH=/…) names where a mounted Secret is;
                    // any other value is the secret.
                    let path = (e.name.ends_with("_FILE") || e.name.ends_with("_PATH"))
                        && e.value.as_deref().is_some_and(|v| v.starts_with('/'));
                    if secret_like(&e.name) && e.value.is_some() && !path {
                        problems.push(format!(
                            "deploy/{target}: Deployment {} container {}: env {} is a literal; use a Secret",
                            dname(&d),
                            c.name,
                            e.name
                        ));
                    }
                }
                for e in c.env_from.iter().flatten() {
                    if e.secret_ref.is_some() {
                        problems.push(format!(
                            "deploy/{target}: Deployment {} container {}: a whole Secret as env; mount it",
                            dname(&d),
                            c.name
                        ));
                    }
                }
                if runs_gpuscale(c) {
                    let mounted = c.volume_mounts.iter().flatten().any(|m| {
                        secrets
                            .get(&m.name)
                            .is_some_and(|s| s.contains(ADMIN_SECRET))
                    });
                    if !mounted {
                        problems.push(format!(
                            "deploy/{target}: Deployment {} container {} does not mount Secret {ADMIN_SECRET}",
                            dname(&d),
                            c.name
                        ));
                    }
                    if c.env.iter().flatten().any(|e| {
                        e.value_from
                            .as_ref()
                            .is_some_and(|f| f.secret_key_ref.is_some())
                    }) {
                        problems.push(format!(
                            "deploy/{target}: Deployment {} container {}: gpuscale reads its token from a file, not env",
                            dname(&d),
                            c.name
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// The gpuscale containers' configs, as the containers see them.

/// One gpuscale container, its pod's files laid out under a temporary
/// root as the volume mounts lay them out.
struct Pod {
    dir: tempfile::TempDir,
}

impl Pod {
    fn path(&self, abs: &str) -> PathBuf {
        self.dir.path().join(abs.trim_start_matches('/'))
    }

    /// Writes the files `c` sees through its volume mounts.
    fn lay_out(objects: &[Value], spec: &PodSpec, c: &Container) -> Result<Pod, String> {
        let pod = Pod {
            dir: tempfile::tempdir().map_err(|e| e.to_string())?,
        };
        let volumes: BTreeMap<&str, &Volume> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| (v.name.as_str(), v))
            .collect();
        for m in c.volume_mounts.iter().flatten() {
            let v = volumes
                .get(m.name.as_str())
                .ok_or(format!("volumeMount {}: no such volume", m.name))?;
            let dir = pod.path(&m.mount_path);
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let mut files = Vec::new();
            // The kubelet writes a volume's files with its `defaultMode`
            // (0644 where none is given): the binaries check a token
            // file's mode.
            let mut mode = 0o644;
            if let Some(cm) = &v.config_map {
                files.extend(config_map_files(objects, &cm.name, cm.items.as_deref())?);
                mode = cm.default_mode.unwrap_or(mode);
            }
            if let Some(s) = &v.secret {
                files.extend(secret_files(
                    s.secret_name.as_deref().unwrap_or(""),
                    s.items.as_deref(),
                ));
                mode = s.default_mode.unwrap_or(mode);
            }
            if let Some(p) = &v.projected {
                mode = p.default_mode.unwrap_or(mode);
                for src in p.sources.iter().flatten() {
                    if let Some(cm) = &src.config_map {
                        files.extend(config_map_files(objects, &cm.name, cm.items.as_deref())?);
                    }
                    if let Some(s) = &src.secret {
                        files.extend(secret_files(&s.name, s.items.as_deref()));
                    }
                }
            }
            for (rel, text) in files {
                let f = dir.join(rel);
                std::fs::create_dir_all(f.parent().expect("a parent"))
                    .map_err(|e| e.to_string())?;
                std::fs::write(&f, text).map_err(|e| e.to_string())?;
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    let mode = u32::try_from(mode).map_err(|_| format!("defaultMode {mode}"))?;
                    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(pod)
    }
}

fn config_map_files(
    objects: &[Value],
    cm_name: &str,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
) -> Result<Vec<(String, String)>, String> {
    let cm = find(objects, "ConfigMap", cm_name)
        .ok_or(format!("ConfigMap {cm_name} is not in the manifests"))?;
    let data: BTreeMap<String, String> =
        serde_json::from_value(cm["data"].clone()).unwrap_or_default();
    match items {
        None => Ok(data.into_iter().collect()),
        Some(items) => items
            .iter()
            .map(|i| {
                data.get(&i.key)
                    .map(|t| (i.path.clone(), t.clone()))
                    .ok_or(format!("ConfigMap {cm_name} has no key {}", i.key))
            })
            .collect(),
    }
}

/// A Secret's files: not in the manifests (created by hand), so a made-up
/// token for the admin or the read Secret's `token` key.
fn secret_files(
    secret: &str,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
) -> Vec<(String, String)> {
    let token = match secret {
        ADMIN_SECRET => "0123456789abcdef0123456789abcdef\n",
        READ_SECRET => "fedcba9876543210fedcba9876543210\n",
        _ => panic!(
            "a gpuscale container mounts Secret {secret}; only {ADMIN_SECRET} and {READ_SECRET} are documented"
        ),
    }
    .to_string();
    match items {
        None => vec![("token".into(), token)],
        Some(items) => {
            for i in items {
                assert_eq!(i.key, "token", "Secret {secret} has one key, `token`");
            }
            items
                .iter()
                .map(|i| (i.path.clone(), token.clone()))
                .collect()
        }
    }
}

/// The long flags `gpuscale SUBCOMMAND --help` lists.
fn flags_of(subcommand: &str) -> BTreeSet<String> {
    static HELP: OnceLock<std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>> = OnceLock::new();
    let mut cache = HELP
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    cache
        .entry(subcommand.to_string())
        .or_insert_with(|| {
            let out = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
                .args([subcommand, "--help"])
                .output()
                .expect("running gpuscale");
            assert!(out.status.success(), "gpuscale {subcommand} --help failed");
            String::from_utf8_lossy(&out.stdout)
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .filter(|w| w.starts_with("--") && w.len() > 2)
                .map(str::to_string)
                .collect()
        })
        .clone()
}

/// A container's command line: the subcommand and its `--flag value`s.
fn command_line(c: &Container) -> Result<(String, BTreeMap<String, Option<String>>), String> {
    let mut args = c.command.iter().flatten().chain(c.args.iter().flatten());
    let mut subcommand = None;
    let mut flags = BTreeMap::new();
    let boolean = ["--dry-run"];
    while let Some(a) = args.next() {
        if let Some(flag) = a.strip_prefix("--") {
            let (flag, value) = match flag.split_once('=') {
                Some((f, v)) => (format!("--{f}"), Some(v.to_string())),
                None if boolean.contains(&a.as_str()) => (a.clone(), None),
                None => (a.clone(), args.next().cloned()),
            };
            flags.insert(flag, value);
        } else if subcommand.is_none() {
            subcommand = Some(a.clone());
        } else {
            return Err(format!("unexpected argument `{a}`"));
        }
    }
    let subcommand = subcommand.ok_or("no subcommand")?;
    let known = flags_of(&subcommand);
    for f in flags.keys() {
        if !known.contains(f) {
            return Err(format!("`gpuscale {subcommand}` has no flag {f}"));
        }
    }
    Ok((subcommand, flags))
}

fn flag<'a>(flags: &'a BTreeMap<String, Option<String>>, f: &str) -> Option<&'a str> {
    flags.get(f).and_then(|v| v.as_deref())
}

/// `http://svc.ns.svc:port` → (svc, ns, port).
fn service_url(url: &str) -> Option<(String, String, i32)> {
    let rest = url.strip_prefix("http://")?.trim_end_matches('/');
    let (host, port) = rest.rsplit_once(':')?;
    let mut parts = host.split('.');
    let svc = parts.next()?.to_string();
    let ns = parts.next()?.to_string();
    Some((svc, ns, port.parse().ok()?))
}

/// The Service `svc`'s port numbered `port`, and the container behind it
/// (in the Deployment its selector matches) with the container port.
fn service_backend(
    objects: &[Value],
    svc: &str,
    port: i32,
) -> Result<(String, Deployment, Container, i32), String> {
    let s: Service = find(objects, "Service", svc)
        .map(|o| serde_json::from_value(o.clone()).expect("a Service"))
        .ok_or(format!("no Service {svc}"))?;
    let spec = s.spec.as_ref().ok_or("a Service without spec")?;
    let sp = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.port == port)
        .ok_or(format!("Service {svc} has no port {port}"))?;
    let selector = spec.selector.clone().unwrap_or_default();
    for d in deployments(objects) {
        let labels = d
            .spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default();
        if selector.is_empty() || !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
            continue;
        }
        let target = sp.target_port.clone().unwrap_or(IntOrString::Int(sp.port));
        for c in containers(pod_spec(&d)) {
            if let Some(n) = resolve_port(c, &target)
                && c.ports.iter().flatten().any(|p| p.container_port == n)
            {
                return Ok((sp.name.clone().unwrap_or_default(), d.clone(), c.clone(), n));
            }
        }
    }
    Err(format!(
        "Service {svc} port {port}: no container in the Deployments it selects serves it"
    ))
}

fn port_of(addr: &str) -> Option<i32> {
    addr.rsplit_once(':')?.1.parse().ok()
}

/// What one gpuscale container runs with, checked.
enum Loaded {
    Gateway(Box<gpuscale_gateway::Settings>),
    Autoscaler(Box<gpuscale_autoscaler::config::Settings>),
}

fn load_container(objects: &[Value], d: &Deployment, c: &Container) -> Result<Loaded, String> {
    let spec = pod_spec(d);
    let (subcommand, flags) = command_line(c)?;
    let config = flag(&flags, "--config").ok_or("no --config")?;
    let pod = Pod::lay_out(objects, spec, c)?;
    let file = pod.path(config);
    if !file.is_file() {
        return Err(format!(
            "--config {config}: no such file in the container's mounts"
        ));
    }
    let problems = |p: gpuscale_policies::Problems| {
        p.0.iter()
            .map(|p| format!("{p}").replace(&format!("{}", pod.dir.path().display()), ""))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if let Some(f) = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "GPUSCALE_ADMIN_TOKEN_FILE")
        .and_then(|e| e.value.as_deref())
        .or(flag(&flags, "--admin-token-file"))
        && !pod.path(f).is_file()
    {
        return Err(format!(
            "admin token file {f}: not in the container's mounts"
        ));
    }
    match subcommand.as_str() {
        "gateway" => {
            let mut s = gpuscale_gateway::config::load(&file).map_err(problems)?;
            if let Some(l) = flag(&flags, "--listen") {
                s.spec.listen = l.parse().map_err(|e| format!("--listen: {e}"))?;
            }
            if let Some(a) = flag(&flags, "--admin") {
                s.spec.admin = a.parse().map_err(|e| format!("--admin: {e}"))?;
            }
            if flag(&flags, "--admin-token-file").is_some() && s.admin_token.is_none() {
                return Err("--admin-token-file: checked above, but no token loaded".into());
            }
            s.check_exposure()?;
            if s.admin_token.is_none() {
                return Err("the gateway has no admin token (spec.adminTokenFile)".into());
            }
            // Prometheus scrapes with the read-only token
            // (deploy/prometheus/scrape.yaml), never the admin one.
            if s.read_token.is_none() {
                return Err("the gateway has no read token (spec.readTokenFile)".into());
            }
            let admin = admin_port(c).ok_or("no container port named admin")?;
            if i32::from(s.spec.admin.port()) != admin {
                return Err(format!(
                    "spec.admin {} is not the container's admin port {admin}",
                    s.spec.admin
                ));
            }
            let traffic = i32::from(s.spec.listen.port());
            if !c
                .ports
                .iter()
                .flatten()
                .any(|p| p.container_port == traffic)
            {
                return Err(format!("spec.listen {}: no container port", s.spec.listen));
            }
            if !s.spec.listen.ip().is_unspecified() || !s.spec.admin.ip().is_unspecified() {
                return Err("the gateway must listen on every interface in a pod".into());
            }
            Ok(Loaded::Gateway(Box::new(s)))
        }
        "autoscaler" => {
            if flag(&flags, "--backend") != Some("kube") {
                return Err("--backend must be kube in a cluster".into());
            }
            let mut s = gpuscale_autoscaler::config::load(&file).map_err(problems)?;
            if let Some(a) = flag(&flags, "--admin") {
                s.spec.admin = a.parse().map_err(|e| format!("--admin: {e}"))?;
            }
            if let Some(k) = flag(&flags, "--keda") {
                s.spec.keda = Some(k.parse().map_err(|e| format!("--keda: {e}"))?);
            }
            let token = s
                .spec
                .gateway
                .admin_token_file
                .as_ref()
                .ok_or("spec.gateway.adminTokenFile: not set")?;
            gpuscale_gateway::auth::AdminToken::from_file(token)
                .map_err(|e| format!("spec.gateway.adminTokenFile: {e}"))?;
            if s.spec.gateway.config.is_some() {
                return Err(
                    "spec.gateway.config: the controller watches the gateway Deployment".into(),
                );
            }
            let admin = admin_port(c).ok_or("no container port named admin")?;
            if i32::from(s.spec.admin.port()) != admin || !s.spec.admin.ip().is_unspecified() {
                return Err(format!(
                    "spec.admin {}: expected 0.0.0.0:{admin} (the probes' port)",
                    s.spec.admin
                ));
            }
            if s.spec.kubernetes.namespace != "gpuscale" {
                return Err(format!(
                    "spec.kubernetes.namespace {}: expected gpuscale",
                    s.spec.kubernetes.namespace
                ));
            }
            if let Some(k) = s.spec.keda {
                let named = c
                    .ports
                    .iter()
                    .flatten()
                    .any(|p| p.container_port == i32::from(k.port()));
                if !named {
                    return Err(format!("KEDA's scaler on {k}: no container port"));
                }
            }
            // The gateway it watches is a Service here whose admin port
            // reaches a gpuscale gateway's admin port.
            let url = s.spec.gateway.admin.clone().unwrap_or_default();
            let (svc, ns, port) = service_url(&url).ok_or(format!(
                "spec.gateway.admin {url}: expected http://SERVICE.NAMESPACE.svc:PORT"
            ))?;
            if ns != "gpuscale" {
                return Err(format!(
                    "spec.gateway.admin {url}: not in namespace gpuscale"
                ));
            }
            let (_, gd, gc, n) = service_backend(objects, &svc, port)?;
            let (sub, _) = command_line(&gc)?;
            if sub != "gateway" || admin_port(&gc) != Some(n) {
                return Err(format!(
                    "spec.gateway.admin {url}: reaches {}/{} port {n}, not a gateway's admin port",
                    dname(&gd),
                    gc.name
                ));
            }
            Ok(Loaded::Autoscaler(Box::new(s)))
        }
        other => Err(format!("unexpected subcommand {other}")),
    }
}

/// Every gpuscale container of a target, loaded.
fn loaded(target: &str, objects: &[Value]) -> Vec<(String, String, Loaded)> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    for d in deployments(objects) {
        for c in containers(pod_spec(&d)) {
            if !runs_gpuscale(c) {
                continue;
            }
            match load_container(objects, &d, c) {
                Ok(l) => out.push((dname(&d).to_string(), c.name.clone(), l)),
                Err(e) => problems.push(format!(
                    "deploy/{target}: Deployment {} container {}: {e}",
                    dname(&d),
                    c.name
                )),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    out
}

#[test]
fn every_gpuscale_container_s_config_loads_as_the_binary_loads_it() {
    let Some(all) = rendered() else { return };
    for (target, objects) in all {
        let loaded = loaded(target, objects);
        let has_deployments = of_kind(objects, "Deployment").next().is_some();
        if has_deployments {
            assert!(
                loaded
                    .iter()
                    .any(|(_, _, l)| matches!(l, Loaded::Autoscaler(_))),
                "deploy/{target}: no controller"
            );
            assert!(
                loaded
                    .iter()
                    .any(|(_, _, l)| matches!(l, Loaded::Gateway(_))),
                "deploy/{target}: no gateway"
            );
        }
        // The Service the controller finds the gateways through exists
        // and has the named port (its EndpointSlices list that port).
        for (d, c, l) in &loaded {
            let Loaded::Autoscaler(a) = l else { continue };
            let Some(disc) = &a.spec.gateway.discover else {
                continue;
            };
            let svc = find(objects, "Service", &disc.service).unwrap_or_else(|| {
                panic!(
                    "deploy/{target}: {d}/{c}: gateway.discover.service `{}` is no Service here",
                    disc.service
                )
            });
            let ports = svc["spec"]["ports"].as_array().cloned().unwrap_or_default();
            assert!(
                ports.iter().any(|p| p["name"] == disc.port.as_str()),
                "deploy/{target}: {d}/{c}: Service {} has no port named {}",
                disc.service,
                disc.port
            );
        }
        // Each model the controller manages is one the gateway knows (a
        // replica of an unknown model cannot be registered).
        let models: Vec<gpuscale_policies::Model> = of_kind(objects, "ModelPolicy")
            .map(|o| model_policy(o).unwrap())
            .collect();
        for (d, c, l) in &loaded {
            if let Loaded::Gateway(g) = l {
                let sidecar = g.spec.sidecar.as_ref().map(|s| s.model.clone());
                for m in &models {
                    if sidecar.as_ref().is_none_or(|s| s == &m.served_name) {
                        assert!(
                            g.models.contains_key(&m.served_name),
                            "deploy/{target}: {d}/{c}: the gateway has no model {} (ModelPolicy {}): add it to the gpuscale-policies ConfigMap",
                            m.served_name,
                            m.name
                        );
                    }
                }
                // And no model that nothing here serves: its requests
                // would queue for a replica nothing starts.
                for served in g.models.keys() {
                    assert!(
                        models.iter().any(|m| &m.served_name == served),
                        "deploy/{target}: {d}/{c}: the gateway lists {served}, which no ModelPolicy here serves"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Topology.

#[test]
fn the_controller_runs_two_replicas_with_its_pod_name_as_identity() {
    let Some(all) = rendered() else { return };
    for (target, objects) in all {
        let Some(o) = find(objects, "Deployment", "gpuscale-controller") else {
            assert_eq!(*target, "base/gpu-operator");
            continue;
        };
        let d: Deployment = serde_json::from_value(o.clone()).unwrap();
        assert_eq!(
            d.spec.as_ref().unwrap().replicas,
            Some(2),
            "deploy/{target}"
        );
        let spec = pod_spec(&d);
        assert_eq!(
            spec.service_account_name.as_deref(),
            Some("gpuscale-controller"),
            "deploy/{target}"
        );
        let c = &spec.containers[0];
        let pod_name = c
            .env
            .iter()
            .flatten()
            .find(|e| e.name == "POD_NAME")
            .and_then(|e| e.value_from.as_ref())
            .and_then(|f| f.field_ref.as_ref())
            .map(|f| f.field_path.as_str());
        assert_eq!(pod_name, Some("metadata.name"), "deploy/{target}: POD_NAME");
        // Bound to the Roles.
        let bound: BTreeSet<String> = of_kind(objects, "RoleBinding")
            .chain(of_kind(objects, "ClusterRoleBinding"))
            .filter(|b| {
                b["subjects"].as_array().is_some_and(|s| {
                    s.iter().any(|s| {
                        s["kind"] == "ServiceAccount"
                            && s["name"] == "gpuscale-controller"
                            && s["namespace"] == "gpuscale"
                    })
                })
            })
            .map(|b| b["roleRef"]["name"].as_str().unwrap_or("").to_string())
            .collect();
        // A dry run writes no Event about Nodes (nor anything else); a
        // controller that packs nothing touches no Node and no MIG
        // ConfigMap.
        let dry_run = command_line(c).is_ok_and(|(_, flags)| flags.contains_key("--dry-run"));
        let packs = controller_kube(target, objects).pack;
        let expected: BTreeSet<String> = [
            "gpuscale-controller",
            "gpuscale-mig",
            "gpuscale-node-events",
            "gpuscale-nodes",
        ]
        .into_iter()
        .filter(|r| !(dry_run && *r == "gpuscale-node-events"))
        .filter(|r| packs || *r == "gpuscale-controller")
        .map(String::from)
        .collect();
        assert_eq!(bound, expected, "deploy/{target}");
    }
}

#[test]
fn the_central_gateway_runs_two_replicas() {
    let Some(all) = rendered() else { return };
    let replicas = |target: &str| {
        let o = find(&all[target], "Deployment", "gpuscale-gateway")
            .unwrap_or_else(|| panic!("deploy/{target}: no gateway Deployment"));
        o["spec"]["replicas"].as_i64()
    };
    assert_eq!(replicas("overlays/central"), Some(2));
    assert_eq!(replicas("base"), Some(1));
    assert!(
        find(
            &all["overlays/central"],
            "PodDisruptionBudget",
            "gpuscale-gateway"
        )
        .is_some()
    );
    assert!(find(&all["overlays/sidecar"], "Deployment", "gpuscale-gateway").is_none());
}

/// (role, apiGroup, resource, verb) for every rule of the Roles and
/// ClusterRoles of a rendering.
fn grants(objects: &[Value]) -> BTreeSet<(String, String, String, String)> {
    let mut out = BTreeSet::new();
    for o in of_kind(objects, "Role").chain(of_kind(objects, "ClusterRole")) {
        for r in o["rules"].as_array().into_iter().flatten() {
            for g in r["apiGroups"].as_array().into_iter().flatten() {
                for res in r["resources"].as_array().into_iter().flatten() {
                    for v in r["verbs"].as_array().into_iter().flatten() {
                        out.insert((
                            name(o).to_string(),
                            g.as_str().unwrap_or("").to_string(),
                            res.as_str().unwrap_or("").to_string(),
                            v.as_str().unwrap_or("").to_string(),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// A controller run with `--dry-run` sends only reads (the mock API
/// server test `dry_run_sends_no_write`; in a dry run no Lease is written
/// either), so its roles grant exactly the reads — `get`, `list`, `watch`,
/// the API server's read verbs — that the base grants, and no write. A
/// controller that packs nothing (`pack: false`, sidecar mode) is granted
/// its own Role only: the base's without Pods and evictions (the mock
/// test `a_controller_that_packs_nothing_needs_its_overlays_role_and_no_node`
/// compares that Role with its requests). Every other rendering grants
/// what the base grants.
#[test]
fn a_dry_run_controller_is_granted_the_reads_and_nothing_else() {
    let Some(all) = rendered() else { return };
    let reads = ["get", "list", "watch"];
    let base = grants(&all["base"]);
    // In a dry run no lease is taken (each replica decides on its own),
    // nor read.
    let base_reads: BTreeSet<_> = base
        .iter()
        .filter(|g| reads.contains(&g.3.as_str()) && g.2 != "leases")
        .cloned()
        .collect();
    for (target, objects) in all {
        let Some(o) = find(objects, "Deployment", "gpuscale-controller") else {
            continue;
        };
        let d: Deployment = serde_json::from_value(o.clone()).unwrap();
        let c = &pod_spec(&d).containers[0];
        let (_, flags) = command_line(c).unwrap_or_else(|e| panic!("deploy/{target}: {e}"));
        let granted = grants(objects);
        if flags.contains_key("--dry-run") {
            let writes: Vec<_> = granted
                .iter()
                .filter(|g| !reads.contains(&g.3.as_str()))
                .collect();
            assert!(
                writes.is_empty(),
                "deploy/{target} runs --dry-run and grants writes: {writes:?}"
            );
            assert_eq!(granted, base_reads, "deploy/{target}: the base's reads");
        } else if !controller_kube(target, objects).pack {
            let packless: BTreeSet<_> = base
                .iter()
                .filter(|g| g.0 == "gpuscale-controller" && !g.2.starts_with("pods"))
                .cloned()
                .collect();
            assert!(
                !granted.iter().any(|g| g.2.starts_with("node")),
                "deploy/{target} packs nothing and is granted Nodes"
            );
            assert_eq!(
                granted, packless,
                "deploy/{target}: the base's controller Role without Pods"
            );
        } else {
            assert_eq!(granted, base, "deploy/{target}: the base's roles");
        }
    }
}

#[test]
fn the_rbac_has_one_rule_per_resource_with_sorted_verbs() {
    let Some(all) = rendered() else { return };
    for o in of_kind(&all["base"], "Role").chain(of_kind(&all["base"], "ClusterRole")) {
        let rules = o["rules"].as_array().expect("rules");
        let mut seen = BTreeSet::new();
        for r in rules {
            let groups = r["apiGroups"].as_array().expect("apiGroups");
            let resources = r["resources"].as_array().expect("resources");
            let verbs: Vec<&str> = r["verbs"]
                .as_array()
                .expect("verbs")
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(groups.len(), 1, "{}: one API group per rule", describe(o));
            assert_eq!(resources.len(), 1, "{}: one resource per rule", describe(o));
            let mut sorted = verbs.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(verbs, sorted, "{}: verbs sorted, once each", describe(o));
            assert!(!verbs.contains(&"*"), "{}: no wildcard verb", describe(o));
            assert!(
                seen.insert((groups[0].to_string(), resources[0].to_string())),
                "{}: {}/{} in two rules",
                describe(o),
                groups[0],
                resources[0]
            );
            assert!(r.get("resourceNames").is_none());
        }
    }
}

/// The fields the controller applies to its Deployment for `model` before
/// any plan (`kubernetes::whole_gpu_variant`).
/// The controller's Kubernetes settings in a rendering, as it loads them.
fn controller_kube(target: &str, objects: &[Value]) -> gpuscale_autoscaler::kubernetes::KubeSpec {
    loaded(target, objects)
        .into_iter()
        .find_map(|(_, _, l)| match l {
            Loaded::Autoscaler(s) => Some(s.spec.kubernetes.clone()),
            Loaded::Gateway(_) => None,
        })
        .expect("the controller")
}

fn controller_deployment(
    model: &gpuscale_policies::Model,
    kube: &gpuscale_autoscaler::kubernetes::KubeSpec,
) -> Value {
    let variant = gpuscale_autoscaler::kubernetes::whole_gpu_variant(model, 1);
    serde_json::to_value(gpuscale_autoscaler::kubernetes::deployment(
        model, &variant, kube,
    ))
    .unwrap()
}

/// Every leaf of `applied` is in `live` at the same place (lists of
/// objects with a `name` matched by name): a server-side apply of
/// `applied` over `live` changes nothing. `Err` names the first difference.
fn contains(live: &Value, applied: &Value, path: &str) -> Result<(), String> {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                let p = format!("{path}.{k}");
                match l.get(k) {
                    Some(lv) => contains(lv, av, &p)?,
                    // An empty map or list applied sets nothing.
                    None if av.as_object().is_some_and(|m| m.is_empty()) => {}
                    None => return Err(format!("{p}: missing; the controller sets {av}")),
                }
            }
            Ok(())
        }
        (Value::Array(l), Value::Array(a)) => {
            let named = a.iter().all(|v| v.get("name").is_some());
            for (i, av) in a.iter().enumerate() {
                let lv = if named {
                    l.iter().find(|lv| lv.get("name") == av.get("name"))
                } else {
                    l.get(i)
                };
                let p = format!("{path}[{}]", av.get("name").unwrap_or(&Value::from(i)));
                contains(lv.ok_or(format!("{p}: missing"))?, av, &p)?;
            }
            if !named && l.len() != a.len() {
                return Err(format!("{path}: {live}, the controller sets {applied}"));
            }
            Ok(())
        }
        (l, a) if l == a => Ok(()),
        (l, a) => Err(format!("{path}: {l}, the controller sets {a}")),
    }
}

#[test]
fn the_sidecar_gateway_is_a_native_sidecar_fronting_the_model_server() {
    let Some(all) = rendered() else { return };
    let objects = &all["overlays/sidecar"];
    let loaded = loaded("overlays/sidecar", objects);
    let kube = loaded
        .iter()
        .find_map(|(_, _, l)| match l {
            Loaded::Autoscaler(s) => Some(s.spec.kubernetes.clone()),
            Loaded::Gateway(_) => None,
        })
        .expect("the controller");
    let mut sidecars = 0;
    for d in deployments(objects) {
        let spec = pod_spec(&d);
        let Some(gw) = spec
            .init_containers
            .iter()
            .flatten()
            .find(|c| runs_gpuscale(c))
        else {
            continue;
        };
        sidecars += 1;
        assert_eq!(
            gw.restart_policy.as_deref(),
            Some("Always"),
            "a native sidecar"
        );
        assert!(gw.startup_probe.is_some() && gw.readiness_probe.is_some());
        let settings = loaded
            .iter()
            .find_map(|(dn, cn, l)| match l {
                Loaded::Gateway(g) if dn == dname(&d) && cn == &gw.name => Some(g),
                _ => None,
            })
            .expect("the sidecar's settings");
        let sidecar = settings.spec.sidecar.as_ref().expect("spec.sidecar");
        let upstream = gpuscale_gateway::config::Endpoint::parse(&sidecar.upstream).unwrap();
        let (host, port) = upstream.authority().rsplit_once(':').unwrap();
        assert_eq!(host, "127.0.0.1", "the sidecar fronts its own pod");
        let port: i32 = port.parse().unwrap();
        let server = spec
            .containers
            .iter()
            .find(|c| c.ports.iter().flatten().any(|p| p.container_port == port))
            .expect("a model-server container on the sidecar's upstream port");
        assert!(
            server
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .is_some_and(|l| l.get("nvidia.com/gpu").map(|q| q.0.as_str()) == Some("1")),
            "the model server has one GPU"
        );
        // The ModelPolicy of the served model; the Deployment is the one
        // the controller applies for it, so its apply changes nothing and
        // it scales this Deployment.
        let policy = of_kind(objects, "ModelPolicy")
            .map(|o| model_policy(o).unwrap())
            .find(|m| m.served_name == sidecar.model)
            .expect("a ModelPolicy for the sidecar's model");
        assert_eq!(dname(&d), policy.name);
        assert!(
            d.spec.as_ref().unwrap().replicas.is_none(),
            "replicas are the controller's (/scale)"
        );
        let live = objects
            .iter()
            .find(|o| kind(o) == "Deployment" && name(o) == dname(&d))
            .unwrap();
        contains(live, &controller_deployment(&policy, &kube), "")
            .unwrap_or_else(|e| panic!("Deployment {}: {e}", dname(&d)));
        // The model Service is the controller's (it counts the ready
        // pods through its EndpointSlices); the controller registers
        // nothing with the sidecars and packs nothing, so the Deployment
        // above is the one it scales.
        for s in of_kind(objects, "Service") {
            if s["metadata"]["labels"]["gpuscale.io/model"].is_null() {
                continue;
            }
            let want =
                serde_json::to_value(gpuscale_autoscaler::kubernetes::service(&policy, &kube))
                    .unwrap();
            assert_eq!(name(s), want["metadata"]["name"], "{}", describe(s));
            assert_eq!(s["spec"]["selector"], want["spec"]["selector"]);
            assert_eq!(s["spec"]["ports"], want["spec"]["ports"]);
        }
        let config: Value = serde_yaml_ng::from_str(
            &std::fs::read_to_string(root().join("deploy/overlays/sidecar/autoscaler.yaml"))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(config["spec"]["gateway"]["discover"]["register"], false);
        assert_eq!(config["spec"]["kubernetes"]["pack"], false);
    }
    assert_eq!(sidecars, 1, "the sidecar example");
}

#[test]
fn the_keda_trigger_reaches_gpuscale_s_external_scaler() {
    let Some(all) = rendered() else { return };
    let objects = &all["overlays/keda"];
    let loaded = loaded("overlays/keda", objects);
    let keda = loaded
        .iter()
        .find_map(|(_, _, l)| match l {
            Loaded::Autoscaler(s) => s.spec.keda,
            Loaded::Gateway(_) => None,
        })
        .expect("the controller serves KEDA's scaler (--keda or spec.keda)");
    let mut count = 0;
    for so in of_kind(objects, "ScaledObject") {
        count += 1;
        scaled_object(so).unwrap();
        let trigger = &so["spec"]["triggers"][0]["metadata"];
        let address = trigger["scalerAddress"].as_str().unwrap();
        let (host, port) = address.rsplit_once(':').expect("host:port");
        let svc = host.split('.').next().unwrap();
        let (port_name, d, _, n) = service_backend(objects, svc, port.parse().unwrap())
            .unwrap_or_else(|e| panic!("{}: scalerAddress {address}: {e}", describe(so)));
        assert_eq!(dname(&d), "gpuscale-controller", "{}", describe(so));
        assert_eq!(Some(n), port_of(&keda.to_string()), "the scaler's port");
        assert_eq!(port_name, "keda");
        let target = so["spec"]["scaleTargetRef"]["name"].as_str().unwrap();
        assert!(
            find(objects, "Deployment", target).is_some(),
            "{}: no Deployment {target}",
            describe(so)
        );
        let model = trigger["model"].as_str().unwrap();
        let policy = of_kind(objects, "ModelPolicy")
            .map(|o| model_policy(o).unwrap())
            .find(|m| m.served_name == model || m.name == model)
            .unwrap_or_else(|| panic!("{}: no ModelPolicy for model {model}", describe(so)));
        assert_eq!(
            so["spec"]["minReplicaCount"].as_u64(),
            Some(u64::from(policy.scaling.min_replicas)),
            "{}: the policy's minReplicas",
            describe(so)
        );
        assert_eq!(
            so["spec"]["maxReplicaCount"].as_u64(),
            Some(u64::from(policy.scaling.max_replicas)),
            "{}: the policy's maxReplicas",
            describe(so)
        );
    }
    assert_eq!(count, 1);
}

// ---------------------------------------------------------------------------
// The GPU Operator's configs.

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap()
}

#[test]
fn the_device_plugin_configs_are_the_ones_the_packer_emits() {
    let Some(all) = rendered() else { return };
    let cm = find(&all["base"], "ConfigMap", "gpuscale-device-plugin-config").expect("ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], "gpu-operator");
    let data = cm["data"].as_object().unwrap();
    assert!(data.contains_key("default"));
    for (key, text) in data {
        use gpuscale_packer::emit;
        let n = |prefix: &str| key.strip_prefix(prefix).and_then(|n| n.parse::<u8>().ok());
        let (name, expected) = if let Some(n) = n("mps-") {
            (emit::mps_config_name(n), emit::mps_config(n))
        } else {
            let shares = n("timeslice-");
            (
                emit::device_plugin_config_name(shares),
                emit::device_plugin_config(shares),
            )
        };
        assert_eq!(
            key, &name,
            "device-plugin config {key}: not a name the packer emits"
        );
        assert_eq!(
            yaml(text.as_str().unwrap()),
            expected,
            "device-plugin config {key}"
        );
    }
}

#[test]
fn the_initial_mig_parted_config_is_the_one_the_controller_maintains() {
    let Some(all) = rendered() else { return };
    let objects = &all["base/gpu-operator"];
    let cm = find(
        objects,
        "ConfigMap",
        gpuscale_autoscaler::kubernetes::MIG_CONFIGMAP,
    )
    .expect("the mig-parted ConfigMap");
    assert_eq!(cm["metadata"]["namespace"], "gpu-operator");
    let config = yaml(cm["data"]["config.yaml"].as_str().unwrap());
    assert_eq!(config["version"], "v1");
    assert_eq!(
        config["mig-configs"]["all-disabled"],
        serde_json::json!([{"devices": "all", "mig-enabled": false}])
    );
    // Created once, not applied with the rest: the controller owns it.
    for &target in DEPLOYABLE {
        assert!(
            find(
                &all[target],
                "ConfigMap",
                gpuscale_autoscaler::kubernetes::MIG_CONFIGMAP
            )
            .is_none(),
            "deploy/{target}"
        );
    }
}

/// In KEDA mode the controller writes nothing (`--dry-run`), so the
/// model's headless Service it would apply is in the overlay, and it is
/// the one the controller builds (`kubernetes::service`): the controller
/// finds the ready pods through its EndpointSlices. Elsewhere the
/// controller applies it, and no manifest carries one.
#[test]
fn the_keda_overlay_carries_the_model_services_the_controller_would_apply() {
    let Some(all) = rendered() else { return };
    let objects = &all["overlays/keda"];
    for o in of_kind(objects, "ModelPolicy") {
        let model = model_policy(o).unwrap();
        let spec = gpuscale_autoscaler::kubernetes::KubeSpec {
            namespace: "gpuscale".into(),
            ..Default::default()
        };
        let want =
            serde_json::to_value(gpuscale_autoscaler::kubernetes::service(&model, &spec)).unwrap();
        let n = gpuscale_autoscaler::kubernetes::service_name(&model.name);
        let svc = find(objects, "Service", &n).unwrap_or_else(|| {
            panic!(
                "deploy/overlays/keda: ModelPolicy {} has no Service {n}",
                model.name
            )
        });
        for field in ["selector", "ports", "clusterIP"] {
            assert_eq!(
                svc["spec"][field], want["spec"][field],
                "Service {n}: spec.{field}"
            );
        }
    }
    for target in ["base", "overlays/central"] {
        let policies: Vec<&str> = of_kind(&all[target], "ModelPolicy").map(name).collect();
        for p in policies {
            let n = gpuscale_autoscaler::kubernetes::service_name(p);
            assert!(
                find(&all[target], "Service", &n).is_none(),
                "deploy/{target}: Service {n} is the controller's to apply"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// NetworkPolicies: who may connect to what, evaluated as Kubernetes'
// NetworkPolicy API documents it (networking.k8s.io/v1): a pod no policy
// selects for ingress takes everything; a selected pod takes a connection
// when some selecting policy has a rule whose `from` (absent or empty: any
// source) and `ports` (absent or empty: any port) both match. A peer with
// only `podSelector` means pods of the policy's namespace; with only
// `namespaceSelector`, every pod of the matching namespaces; with both,
// the matching pods of the matching namespaces. A named port is the
// destination pod's container port of that name.

/// A pod as a NetworkPolicy sees it.
#[derive(Debug, Clone)]
struct Peer {
    what: String,
    namespace: String,
    namespace_labels: BTreeMap<String, String>,
    labels: BTreeMap<String, String>,
    /// Container ports (init containers too) by name; unnamed ones under
    /// their number.
    ports: BTreeMap<String, i32>,
}

impl Peer {
    fn outside(what: &str, namespace: &str, extra_ns_labels: &[(&str, &str)]) -> Peer {
        let mut namespace_labels: BTreeMap<String, String> = extra_ns_labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        namespace_labels.insert("kubernetes.io/metadata.name".into(), namespace.into());
        Peer {
            what: what.into(),
            namespace: namespace.into(),
            namespace_labels,
            labels: BTreeMap::from([("app".to_string(), what.to_string())]),
            ports: BTreeMap::new(),
        }
    }
}

fn selects(
    s: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    let by_labels = s
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = s.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => panic!("label selector operator {other}"),
        }
    });
    by_labels && by_expressions
}

/// Whether `dst` takes a TCP connection from `src` on `port`.
fn admits(policies: &[NetworkPolicy], src: &Peer, dst: &Peer, port: i32) -> bool {
    let selecting: Vec<_> = policies
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(dst.namespace.as_str()))
        .filter(|p| {
            let spec = p.spec.as_ref().unwrap();
            // Without policyTypes, a policy is an ingress policy.
            let ingress = spec
                .policy_types
                .as_ref()
                .is_none_or(|t| t.iter().any(|t| t == "Ingress"));
            ingress
                && spec
                    .pod_selector
                    .as_ref()
                    .is_none_or(|s| selects(s, &dst.labels))
        })
        .collect();
    if selecting.is_empty() {
        return true;
    }
    selecting.iter().any(|p| {
        let ns = p.metadata.namespace.as_deref().unwrap();
        p.spec
            .as_ref()
            .unwrap()
            .ingress
            .iter()
            .flatten()
            .any(|rule| {
                let from = rule.from.as_deref().unwrap_or_default();
                let ports = rule.ports.as_deref().unwrap_or_default();
                let from_ok = from.is_empty()
                    || from.iter().any(|peer| {
                        // An ipBlock could match any pod's address: count it
                        // as letting everyone in (the tests below only check
                        // that some sources are kept out).
                        peer.ip_block.is_some()
                            || (match &peer.namespace_selector {
                                Some(s) => selects(s, &src.namespace_labels),
                                None => src.namespace == ns,
                            } && peer
                                .pod_selector
                                .as_ref()
                                .is_none_or(|s| selects(s, &src.labels)))
                    });
                let port_ok = ports.is_empty()
                    || ports.iter().any(|p| {
                        p.protocol.as_deref().unwrap_or("TCP") == "TCP"
                            && match &p.port {
                                None => true,
                                Some(IntOrString::Int(n)) => match p.end_port {
                                    Some(end) => (*n..=end).contains(&port),
                                    None => *n == port,
                                },
                                Some(IntOrString::String(name)) => {
                                    dst.ports.get(name) == Some(&port)
                                }
                            }
                    });
                from_ok && port_ok
            })
    })
}

/// Every pod a target runs in the namespace `gpuscale` (its Deployments
/// and DaemonSets), and the pods the controller's own Deployment would
/// run for each of the target's ModelPolicies.
fn pods_of(target: &str, objects: &[Value]) -> Vec<Peer> {
    let ns_labels = |ns: &str| {
        let mut labels: BTreeMap<String, String> = find(objects, "Namespace", ns)
            .map(|o| serde_json::from_value(o["metadata"]["labels"].clone()).unwrap())
            .unwrap_or_default();
        labels.insert("kubernetes.io/metadata.name".into(), ns.into());
        labels
    };
    let peer = |what: String, ns: &str, template: &Value| {
        let spec: PodSpec = serde_json::from_value(template["spec"].clone()).unwrap();
        Peer {
            what,
            namespace: ns.into(),
            namespace_labels: ns_labels(ns),
            labels: serde_json::from_value(template["metadata"]["labels"].clone())
                .unwrap_or_default(),
            ports: containers(&spec)
                .flat_map(|c| c.ports.iter().flatten())
                .map(|p| {
                    (
                        p.name.clone().unwrap_or(p.container_port.to_string()),
                        p.container_port,
                    )
                })
                .collect(),
        }
    };
    let mut out: Vec<Peer> = objects
        .iter()
        .filter(|o| matches!(kind(o), "Deployment" | "DaemonSet"))
        .filter(|o| o["metadata"]["namespace"] == "gpuscale")
        .map(|o| peer(describe(o), "gpuscale", &o["spec"]["template"]))
        .collect();
    let kube = controller_kube(target, objects);
    for o in of_kind(objects, "ModelPolicy") {
        let model = model_policy(o).unwrap();
        let d = controller_deployment(&model, &kube);
        out.push(peer(
            format!("the controller's Deployment for {}", model.name),
            "gpuscale",
            &d["spec"]["template"],
        ));
    }
    out
}

/// Who may reach a port.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reach {
    /// Any source (the gateways' traffic ports).
    Anyone,
    /// The controller and Prometheus (admin ports, the agents).
    Admin,
    /// KEDA's operator (the external scaler).
    Keda,
    /// The central gateway only (model servers).
    Gateway,
}

/// What a pod is to these policies; labels count only in `gpuscale`.
fn role(p: &Peer) -> &'static str {
    if p.namespace != "gpuscale" {
        return "other";
    }
    match p.labels.get("app.kubernetes.io/name").map(String::as_str) {
        Some("gpuscale-gateway") => "gateway",
        Some("gpuscale-controller") => "controller",
        Some("gpuscale-agent") => "agent",
        _ if p.labels.contains_key("gpuscale.io/model") => "model",
        _ => "other",
    }
}

/// Who may reach `port` (by name) of a pod of `role`: the rule the
/// manifests must implement, from deploy/README.md.
fn reach(role: &str, port: &str) -> Option<Reach> {
    Some(match (role, port) {
        ("gateway", "http") => Reach::Anyone,
        ("gateway", "admin") | ("controller", "admin") | ("agent", "http") => Reach::Admin,
        ("controller", "keda") => Reach::Keda,
        // A sidecar gateway in a model-server pod.
        ("model", "gateway") => Reach::Anyone,
        ("model", "gateway-admin") => Reach::Admin,
        ("model", _) => Reach::Gateway,
        _ => return None,
    })
}

#[test]
fn network_policies_keep_admin_ports_and_model_servers_off_the_rest_of_the_cluster() {
    let Some(all) = rendered() else { return };
    for &target in DEPLOYABLE {
        let objects = &all[target];
        let policies: Vec<NetworkPolicy> = of_kind(objects, "NetworkPolicy")
            .map(|o| serde_json::from_value(o.clone()).unwrap())
            .collect();
        let pods = pods_of(target, objects);
        let mut prometheus = Peer::outside("prometheus", "monitoring", &[]);
        // prometheus-operator's label on the Prometheus pods.
        prometheus
            .labels
            .insert("app.kubernetes.io/name".into(), "prometheus".into());
        // Anything else in Prometheus's namespace stays out.
        let grafana = Peer::outside("grafana", "monitoring", &[]);
        // A namespace's owner can label it and its pods at will: a pod
        // dressed as Prometheus in a namespace wearing every label but
        // the name the API server gives it stays out.
        let mut spoof = Peer::outside("spoof", "evil", &[("gpuscale.io/scrape", "true")]);
        spoof
            .labels
            .insert("app.kubernetes.io/name".into(), "prometheus".into());
        let keda = Peer::outside("keda-operator", "keda", &[]);
        let client = Peer::outside("web", "apps", &[]);
        // Something else a user runs in the namespace, and a pod in a
        // namespace that has the scrape label's key with another value.
        let mut neighbour = Peer::outside("batch", "gpuscale", &[]);
        neighbour.namespace_labels = pods[0].namespace_labels.clone();
        let unlabelled = Peer::outside("grafana", "monitoring-2", &[("gpuscale.io/scrape", "no")]);
        // Pods elsewhere wearing gpuscale's labels: labels prove nothing
        // outside the namespace.
        let impostors = ["gpuscale-gateway", "gpuscale-controller"].map(|n| {
            let mut p = Peer::outside(n, "apps", &[]);
            p.labels.insert("app.kubernetes.io/name".into(), n.into());
            p.labels.insert("gpuscale.io/model".into(), "x".into());
            p
        });
        let mut sources = vec![
            prometheus, grafana, spoof, keda, client, neighbour, unlabelled,
        ];
        sources.extend(impostors);
        sources.extend(pods.iter().cloned());
        let mut checked = 0;
        for dst in &pods {
            for (port_name, &port) in &dst.ports {
                let want = reach(role(dst), port_name).unwrap_or_else(|| {
                    panic!(
                        "deploy/{target}: {} port {port_name} ({port}): no rule says who may reach it; add one to `reach`",
                        dst.what
                    )
                });
                for src in &sources {
                    let expected = match want {
                        Reach::Anyone => true,
                        Reach::Admin => src.what == "prometheus" || role(src) == "controller",
                        Reach::Keda => src.what == "keda-operator",
                        Reach::Gateway => role(src) == "gateway",
                    };
                    assert_eq!(
                        admits(&policies, src, dst, port),
                        expected,
                        "deploy/{target}: {} → {} port {port_name} ({port}): expected {}",
                        src.what,
                        dst.what,
                        if expected { "allowed" } else { "denied" }
                    );
                    checked += 1;
                }
            }
        }
        assert!(
            checked > 50,
            "deploy/{target}: {checked} connections checked"
        );
    }
}

#[test]
fn the_network_policy_check_tells_allowed_from_denied() {
    // The evaluator itself, on policies written from the API's examples.
    let policies: Vec<NetworkPolicy> = serde_json::from_value(serde_json::json!([
        {"metadata": {"name": "deny", "namespace": "a"},
         "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}},
        {"metadata": {"name": "db", "namespace": "a"},
         "spec": {"podSelector": {"matchLabels": {"role": "db"}},
                  "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "api"}},
                                         "namespaceSelector": {"matchLabels": {"team": "x"}}}],
                               "ports": [{"port": "pg"}, {"port": 9000, "endPort": 9002}]}]}},
    ]))
    .unwrap();
    let db = Peer {
        what: "db".into(),
        namespace: "a".into(),
        namespace_labels: BTreeMap::new(),
        labels: BTreeMap::from([("role".into(), "db".into())]),
        ports: BTreeMap::from([("pg".into(), 5432)]),
    };
    let mut api = Peer::outside("api", "b", &[("team", "x")]);
    api.labels = BTreeMap::from([("role".into(), "api".into())]);
    let mut api_elsewhere = Peer::outside("api", "c", &[("team", "y")]);
    api_elsewhere.labels = api.labels.clone();
    let other = Peer::outside("web", "b", &[("team", "x")]);
    assert!(admits(&policies, &api, &db, 5432));
    assert!(admits(&policies, &api, &db, 9001));
    assert!(!admits(&policies, &api, &db, 9003));
    assert!(!admits(&policies, &api_elsewhere, &db, 5432));
    assert!(!admits(&policies, &other, &db, 5432));
    // Another pod of namespace a: only the default deny selects it.
    let mut plain = db.clone();
    plain.labels.clear();
    assert!(!admits(&policies, &api, &plain, 5432));
    // No policy in namespace b: everything is admitted.
    assert!(admits(&policies, &db, &api, 1));
}

/// The gateway's policy files and the ModelPolicy objects stay in step in
/// every rendering: a file without an object (the KEDA overlay once kept
/// e5-mistral-7b's) is a model the gateway lists and queues requests for
/// that nothing ever starts.
#[test]
fn the_gateways_policy_files_are_the_model_policies() {
    let Some(all) = rendered() else { return };
    for (target, objects) in all {
        let Some(cm) =
            of_kind(objects, "ConfigMap").find(|o| name(o).starts_with("gpuscale-policies"))
        else {
            continue;
        };
        let data: BTreeMap<String, String> =
            serde_json::from_value(cm["data"].clone()).unwrap_or_default();
        let files: BTreeSet<String> = data
            .values()
            .flat_map(|text| {
                text.split("\n---")
                    .filter_map(|doc| serde_yaml_ng::from_str::<Value>(doc).ok())
                    .filter(|d| d["kind"] == "ModelPolicy")
                    .map(|d| d["metadata"]["name"].as_str().unwrap_or("").to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        let objects: BTreeSet<String> = of_kind(objects, "ModelPolicy")
            .map(|o| name(o).to_string())
            .collect();
        assert_eq!(
            files, objects,
            "{target}: the gateway's policies and the ModelPolicy objects"
        );
    }
}

// ---------------------------------------------------------------------------
// deploy/prometheus/scrape.yaml: the jobs applied as Prometheus applies them
// to what its Kubernetes discovery (`role: pod`) finds: one target per
// container port (init containers too), with the labels
// `__meta_kubernetes_namespace`, `__meta_kubernetes_pod_label_<name>`
// (the label's name with every character outside [a-zA-Z0-9_] made `_`)
// and `__meta_kubernetes_pod_container_port_name`; `relabel_configs` in
// order, where `keep` keeps a target whose source labels' values, joined
// by `;`, match the regex anchored at both ends (RE2), `drop` the
// opposite, and `replace` (the default action) only sets a label.

/// The shipped scrape jobs.
fn scrape_jobs() -> Vec<serde_yaml_ng::Value> {
    let path = root().join("deploy/prometheus/scrape.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether `job` keeps the target with discovered labels `labels`.
fn job_keeps(job: &serde_yaml_ng::Value, labels: &BTreeMap<String, String>) -> bool {
    for r in job["relabel_configs"].as_sequence().into_iter().flatten() {
        let action = r["action"].as_str().unwrap_or("replace");
        let joined = r["source_labels"]
            .as_sequence()
            .into_iter()
            .flatten()
            .map(|l| labels.get(l.as_str().unwrap()).cloned().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(r["separator"].as_str().unwrap_or(";"));
        let re =
            regex::Regex::new(&format!("^(?:{})$", r["regex"].as_str().unwrap_or("(.*)"))).unwrap();
        match action {
            "keep" if !re.is_match(&joined) => return false,
            "drop" if re.is_match(&joined) => return false,
            "keep" | "drop" | "replace" => {}
            other => panic!("relabel action {other}: not modelled here"),
        }
    }
    true
}

#[test]
fn the_shipped_scrape_jobs_reach_every_metrics_port_and_nothing_else() {
    let Some(all) = rendered() else { return };
    let jobs = scrape_jobs();
    let name_of = |j: &serde_yaml_ng::Value| j["job_name"].as_str().unwrap().to_string();
    for job in &jobs {
        let sd = &job["kubernetes_sd_configs"][0];
        assert_eq!(sd["role"].as_str(), Some("pod"), "{}", name_of(job));
        assert_eq!(
            sd["namespaces"]["names"][0].as_str(),
            Some("gpuscale"),
            "{}",
            name_of(job)
        );
    }
    let sanitize = |k: &str| -> String {
        k.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    let mut reached = BTreeSet::new();
    for &target in DEPLOYABLE {
        let objects = &all[target];
        for pod in pods_of(target, objects) {
            for (port_name, port) in &pod.ports {
                let mut labels: BTreeMap<String, String> = pod
                    .labels
                    .iter()
                    .map(|(k, v)| {
                        (
                            format!("__meta_kubernetes_pod_label_{}", sanitize(k)),
                            v.clone(),
                        )
                    })
                    .collect();
                labels.insert("__meta_kubernetes_namespace".into(), pod.namespace.clone());
                labels.insert("__meta_kubernetes_pod_phase".into(), "Running".into());
                // An unnamed port is listed under its number (`Peer`).
                if port_name.parse::<i32>().is_err() {
                    labels.insert(
                        "__meta_kubernetes_pod_container_port_name".into(),
                        port_name.clone(),
                    );
                }
                let kept: Vec<String> = jobs
                    .iter()
                    .filter(|j| job_keeps(j, &labels))
                    .map(name_of)
                    .collect();
                let want: &[&str] = match (role(&pod), port_name.as_str()) {
                    ("gateway", "admin") => &["gpuscale-gateway"],
                    ("model", "gateway-admin") => &["gpuscale-sidecar-gateway"],
                    ("controller", "admin") => &["gpuscale-controller"],
                    ("agent", "http") => &["gpuscale-agent"],
                    _ => &[],
                };
                assert_eq!(
                    kept, want,
                    "deploy/{target}: {} port {port_name} ({port}) is scraped by {kept:?}",
                    pod.what
                );
                reached.extend(kept);
            }
        }
    }
    let every: BTreeSet<String> = jobs.iter().map(name_of).collect();
    assert_eq!(reached, every, "a job that reaches nothing");
    // A pod that has ended keeps its address (an evicted gateway): no job
    // scrapes it.
    for phase in ["Failed", "Succeeded"] {
        let ended = BTreeMap::from([
            (
                "__meta_kubernetes_pod_label_app_kubernetes_io_name".to_string(),
                "gpuscale-gateway".to_string(),
            ),
            (
                "__meta_kubernetes_pod_container_port_name".to_string(),
                "admin".to_string(),
            ),
            ("__meta_kubernetes_pod_phase".to_string(), phase.to_string()),
        ]);
        assert!(jobs.iter().all(|j| !job_keeps(j, &ended)), "{phase}");
    }
    // The gateways need a token off loopback: the read-only one, which
    // can change nothing; the controller and the agents need none.
    for job in &jobs {
        let file = job["authorization"]["credentials_file"].as_str();
        if name_of(job).contains("gateway") {
            let file = file.unwrap_or_else(|| panic!("{}: no credentials_file", name_of(job)));
            assert!(file.ends_with("/gpuscale-read-token/read-token"), "{file}");
        } else {
            assert_eq!(file, None, "{}", name_of(job));
        }
    }
}

#[test]
fn the_relabel_model_keeps_and_drops_as_prometheus_does() {
    let job: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        "relabel_configs:\n\
         - {source_labels: [a, b], regex: x;y, action: keep}\n\
         - {source_labels: [c], regex: 'z.*', action: drop}\n\
         - {source_labels: [a], target_label: d}\n",
    )
    .unwrap();
    let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(job_keeps(&job, &labels(&[("a", "x"), ("b", "y")])));
    // Anchored at both ends, and an absent label is the empty string.
    assert!(!job_keeps(&job, &labels(&[("a", "xx"), ("b", "y")])));
    assert!(!job_keeps(&job, &labels(&[("a", "x"), ("b", "yy")])));
    assert!(!job_keeps(&job, &labels(&[("a", "x")])));
    assert!(!job_keeps(
        &job,
        &labels(&[("a", "x"), ("b", "y"), ("c", "zq")])
    ));
    assert!(job_keeps(
        &job,
        &labels(&[("a", "x"), ("b", "y"), ("c", "qz")])
    ));
}

/// Every pod that takes a GPU, in every rendering (the manifests' own and
/// the Deployments the controller makes for their ModelPolicies), goes
/// only to nodes gpuscale manages and tolerates the GPU nodes' taint, as
/// the controller's settings say (`spec.kubernetes.nodeSelector`,
/// `spec.kubernetes.tolerations`).
#[test]
fn every_gpu_pod_selects_the_managed_pool_and_tolerates_the_gpu_taint() {
    let Some(all) = rendered() else { return };
    for &target in DEPLOYABLE {
        let objects = &all[target];
        let kube = controller_kube(target, objects);
        assert!(
            !kube.tolerations.is_empty(),
            "deploy/{target}: no toleration"
        );
        let pool = kube.pool_labels().unwrap();
        let mut templates: Vec<(String, Value)> = objects
            .iter()
            .filter(|o| matches!(kind(o), "Deployment" | "DaemonSet"))
            .map(|o| (describe(o), o["spec"]["template"].clone()))
            .collect();
        for o in of_kind(objects, "ModelPolicy") {
            let model = model_policy(o).unwrap();
            let d = controller_deployment(&model, &kube);
            templates.push((
                format!("the controller's Deployment for {}", model.name),
                d["spec"]["template"].clone(),
            ));
        }
        let mut gpu_pods = 0;
        for (what, template) in templates {
            let spec: PodSpec = serde_json::from_value(template["spec"].clone()).unwrap();
            let takes_gpu = containers(&spec).any(|c| {
                c.resources
                    .as_ref()
                    .and_then(|r| r.limits.as_ref())
                    .is_some_and(|l| l.keys().any(|k| k.starts_with("nvidia.com/")))
            });
            if !takes_gpu {
                continue;
            }
            gpu_pods += 1;
            let selector = spec.node_selector.clone().unwrap_or_default();
            for (k, v) in &pool {
                assert_eq!(
                    selector.get(k),
                    Some(v),
                    "deploy/{target}: {what} does not select {k}={v}"
                );
            }
            let tolerations = spec.tolerations.clone().unwrap_or_default();
            for t in &kube.tolerations {
                assert!(
                    tolerations.contains(t),
                    "deploy/{target}: {what} does not tolerate {t:?}"
                );
            }
        }
        assert!(gpu_pods > 0, "deploy/{target}: no pod takes a GPU");
    }
}

/// Whether a node with `labels` matches required node-affinity `terms`
/// (Kubernetes' rules: the terms ORed, a term's expressions ANDed; `In`
/// needs the label with one of the values, `NotIn` matches an absent
/// label too, `DoesNotExist` only an absent one).
fn affinity_matches(terms: &Value, labels: &BTreeMap<&str, &str>) -> bool {
    terms.as_array().unwrap().iter().any(|term| {
        term["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| {
                let value = labels.get(e["key"].as_str().unwrap()).copied();
                let values: Vec<&str> = e["values"]
                    .as_array()
                    .map(|v| v.iter().map(|x| x.as_str().unwrap()).collect())
                    .unwrap_or_default();
                match e["operator"].as_str().unwrap() {
                    "In" => value.is_some_and(|v| values.contains(&v)),
                    "NotIn" => value.is_none_or(|v| !values.contains(&v)),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    op => panic!("operator {op}"),
                }
            })
    })
}

/// The node agent holds NVML open, which can keep a GPU from the reset a
/// MIG mode change needs: it runs on a GPU node unless NVIDIA's MIG
/// manager is changing it (its state label pending or rebooting) or the
/// GPU Operator paused its third-party NVML clients there.
#[test]
fn the_node_agent_leaves_a_node_while_its_mig_mode_changes() {
    let Some(all) = rendered() else { return };
    let objects = &all["base"];
    let agent = find(objects, "DaemonSet", "gpuscale-agent").expect("the agent's DaemonSet");
    let terms = &agent["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let node = |extra: &[(&'static str, &'static str)]| -> BTreeMap<&str, &str> {
        let mut l = BTreeMap::from([
            ("nvidia.com/gpu.present", "true"),
            ("gpuscale.io/managed", "true"),
        ]);
        l.extend(extra.iter().copied());
        l
    };
    let runs = |extra: &[(&'static str, &'static str)]| affinity_matches(terms, &node(extra));
    assert!(runs(&[]), "no MIG manager, an older GPU Operator");
    assert!(runs(&[("nvidia.com/mig.config.state", "success")]));
    assert!(runs(&[("nvidia.com/mig.config.state", "failed")]));
    assert!(runs(&[("nvidia.com/gpu.deploy.client", "true")]));
    assert!(!runs(&[("nvidia.com/mig.config.state", "pending")]));
    assert!(!runs(&[("nvidia.com/mig.config.state", "rebooting")]));
    assert!(!runs(&[(
        "nvidia.com/gpu.deploy.client",
        "paused-for-mig-change"
    )]));
    assert!(!runs(&[
        ("nvidia.com/gpu.deploy.client", "true"),
        ("nvidia.com/mig.config.state", "pending")
    ]));
}
