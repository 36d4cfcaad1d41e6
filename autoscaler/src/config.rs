//! The autoscaler's configuration file (`kind: Autoscaler`), loaded with
//! every error located at file, line, column and field.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpuscale_policies::document::{self, Problem};
use gpuscale_policies::load::{self, Problems};
use gpuscale_policies::{Cluster, Model};
use serde::{Deserialize, Serialize};

use crate::recommend::Tuning;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AutoscalerDoc {
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    metadata: load::Metadata,
    spec: AutoscalerSpec,
}

/// `spec` of a `kind: Autoscaler` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AutoscalerSpec {
    /// Model policy files or directories (relative to this file). Empty
    /// with the Kubernetes backend: the `ModelPolicy` objects of the
    /// namespace are read from the API server.
    #[serde(default)]
    pub policies: Vec<PathBuf>,
    /// The cluster file (relative to this file): with it, every change is
    /// packed (incrementally) and replicas that fit no GPU are not started.
    #[serde(default)]
    pub cluster: Option<PathBuf>,
    /// Where the signals come from.
    pub gateway: GatewayRef,
    /// Decision interval when nothing pushes an event.
    #[serde(default = "one_second", with = "gpuscale_policies::duration")]
    pub interval: Duration,
    /// How often a re-plan may move running replicas to save GPUs (a move
    /// is a cold start); between, re-plans keep every running replica
    /// where it is and add or remove on top. 0s (the default): every
    /// re-plan may move — on the Azure trace that costs fewer GPU-hours
    /// and fewer cold starts than keeping for 10 minutes (`bench/README.md`,
    /// Simulator).
    #[serde(default = "consolidate_every", with = "gpuscale_policies::duration")]
    pub consolidate_every: Duration,
    /// Admin listener: `/metrics`, `/healthz`, `/v1/decisions`.
    #[serde(default = "default_admin")]
    pub admin: SocketAddr,
    /// Recommender tuning (HPA tolerance, panic, fallback, forecast).
    #[serde(default)]
    pub tuning: Tuning,
    /// Local backend settings.
    #[serde(default)]
    pub local: LocalSpec,
    /// Kubernetes backend settings.
    #[serde(default)]
    pub kubernetes: crate::kubernetes::KubeSpec,
    /// Serve KEDA's external scaler (gRPC) on this address.
    #[serde(default)]
    pub keda: Option<SocketAddr>,
    /// Read queue depth from Prometheus instead of the gateway's
    /// `/v1/queues` (the push stream still triggers decisions).
    #[serde(default)]
    pub prometheus: Option<crate::observe::PrometheusSpec>,
    /// How the controller packs (with `cluster`, or the Kubernetes
    /// backend's inventory): the options of `gpuscale plan` that shape a
    /// plan, with the same defaults.
    #[serde(default)]
    pub packer: PackerSpec,
}

/// The packer's options the controller plans with: `gpuscale plan`'s
/// flags of the same names, with the same defaults. The solve's clocks are
/// the controller's own (a budget per decision), not settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PackerSpec {
    /// Relative MIP gap at which a solve stops (`--mip-gap`).
    pub mip_gap: f64,
    /// Most time-sliced shares per GPU considered (`--max-shares`, 2–16).
    pub max_shares: u8,
    /// Fraction of a time-sliced GPU's memory kept free
    /// (`--timeslice-headroom`).
    pub timeslice_headroom: f64,
    /// Most MPS partitions per GPU considered (`--max-mps`, 2–48).
    pub max_mps: u8,
    /// Fraction of an MPS or fractional (HAMi) GPU's memory kept free
    /// (`--isolated-headroom`).
    pub isolated_headroom: f64,
    /// HAMi's containers per GPU on nodes that do not say
    /// (`--hami-split-count`; a node's `hami.io/node-nvidia-register` or
    /// a cluster file's `hamiSplitCount` wins).
    pub hami_split_count: u32,
    /// Spare replicas in the room GPUs in use leave idle (fractional,
    /// MPS, empty MIG instances; `gpuscale_packer::spare`): up to one per
    /// replica placed, never a GPU more (default on). The local backend
    /// runs them beside the wanted ones; on Kubernetes they are in the
    /// variants' Deployments, each annotated with its count
    /// (`gpuscale.io/spares`) so the live count read back leaves them out.
    pub spares: bool,
}

impl Default for PackerSpec {
    fn default() -> Self {
        let o = gpuscale_packer::PackOptions::default();
        PackerSpec {
            mip_gap: o.mip_rel_gap,
            max_shares: o.max_timeslice_replicas,
            timeslice_headroom: o.timeslice_memory_headroom,
            max_mps: o.max_mps_replicas,
            isolated_headroom: o.mps_memory_headroom,
            hami_split_count: o.fractional_max_shares,
            spares: true,
        }
    }
}

impl PackerSpec {
    /// The packer's options with these settings (and its defaults for
    /// the rest).
    pub fn options(&self) -> gpuscale_packer::PackOptions {
        gpuscale_packer::PackOptions {
            mip_rel_gap: self.mip_gap,
            max_timeslice_replicas: self.max_shares,
            timeslice_memory_headroom: self.timeslice_headroom,
            max_mps_replicas: self.max_mps,
            mps_memory_headroom: self.isolated_headroom,
            fractional_memory_headroom: self.isolated_headroom,
            fractional_max_shares: self.hami_split_count,
            ..gpuscale_packer::PackOptions::default()
        }
    }
}

fn one_second() -> Duration {
    Duration::from_secs(1)
}

/// The default `consolidateEvery`: 0s, every re-plan may move.
pub const DEFAULT_CONSOLIDATE_EVERY: Duration = Duration::ZERO;

fn consolidate_every() -> Duration {
    DEFAULT_CONSOLIDATE_EVERY
}

fn default_admin() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 9091))
}

/// The gateway the autoscaler watches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayRef {
    /// A gateway config file (relative to this file): the gateway runs in
    /// the same process (the embedded default).
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// The admin URL of a gateway running elsewhere
    /// (`http://host:port`).
    #[serde(default)]
    pub admin: Option<String>,
    /// A file holding that gateway's admin token (relative to this file;
    /// a mounted Secret in Kubernetes), sent as a bearer token. The
    /// embedded gateway uses its own `spec.adminTokenFile`, or a token
    /// made up at start when it has none.
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    /// The admin URLs of further instances of the same gateway (2 or more
    /// replicas for availability): queues are summed over every instance,
    /// and each replica is registered with each, with an equal share of
    /// its `maxConcurrency`.
    #[serde(default)]
    pub instances: Vec<String>,
    /// Kubernetes: find the instances from a Service's EndpointSlices
    /// instead (each tick; the shares follow membership).
    #[serde(default)]
    pub discover: Option<GatewayDiscovery>,
}

/// The gateway instances as a Kubernetes Service's ready endpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayDiscovery {
    /// The Service (in `spec.kubernetes.namespace`).
    pub service: String,
    /// The name of its admin port.
    #[serde(default = "admin_port_name")]
    pub port: String,
    /// Whether the controller registers the model servers' pods with the
    /// instances (central gateways). Sidecar gateways front their own
    /// pod's server: `false`, and the instances are only read.
    #[serde(default = "yes")]
    pub register: bool,
}

fn admin_port_name() -> String {
    "admin".into()
}

fn yes() -> bool {
    true
}

/// How the local backend runs replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalSpec {
    /// Simulated server profile (`instant`, `small`, `tiny`).
    pub profile: String,
    /// Start-up delay of a replica; default: the policy's `startupTime`.
    #[serde(with = "gpuscale_policies::duration::option")]
    pub startup_time: Option<Duration>,
    /// The longest a removed replica gets to finish its requests (it
    /// stops as soon as they are done; default 5m, as long as the
    /// gateway's default request timeout).
    #[serde(with = "gpuscale_policies::duration")]
    pub drain_time: Duration,
    /// How often each serving replica's `GET /health` is asked (2 s to
    /// answer); after three failures in a row it is stopped and replaced
    /// (a server that hangs still accepts connections). `0s`: never.
    #[serde(with = "gpuscale_policies::duration")]
    pub health_check_every: Duration,
    /// Most replicas of one model the local machine runs.
    pub max_replicas_per_model: u32,
    /// The replicas the backend starts with (each model's `minReplicas`)
    /// skip their start-up delay, as on a cluster that was already
    /// serving; replicas added later pay it. Off by default.
    pub warm_start: bool,
}

impl Default for LocalSpec {
    fn default() -> Self {
        LocalSpec {
            profile: "small".into(),
            startup_time: None,
            drain_time: Duration::from_secs(300),
            health_check_every: Duration::from_secs(5),
            max_replicas_per_model: 16,
            warm_start: false,
        }
    }
}

/// Everything the autoscaler runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `metadata.name`.
    pub name: String,
    /// The spec, with paths resolved against the file's folder.
    pub spec: AutoscalerSpec,
    /// The validated models.
    pub models: Vec<Model>,
    /// The cluster, when given.
    pub cluster: Option<Cluster>,
}

fn problem_at_start(path: &Path, message: String) -> Problems {
    Problems(vec![Problem {
        file: path.to_path_buf(),
        position: document::Position { line: 1, column: 1 },
        path: String::new(),
        message,
    }])
}

/// Loads a `kind: Autoscaler` file, the policies and the cluster it names.
pub fn load(path: &Path) -> Result<Settings, Problems> {
    let text = load::read(path).map_err(|p| Problems(vec![p]))?;
    let docs = document::parse(path, &text).map_err(|p| Problems(vec![p]))?;
    let [doc] = docs.as_slice() else {
        return Err(problem_at_start(
            path,
            format!(
                "expected one `kind: Autoscaler` document, found {}",
                docs.len()
            ),
        ));
    };
    if doc.kind() != Some("Autoscaler") {
        return Err(Problems(vec![doc.problem("kind", "expected `Autoscaler`")]));
    }
    let parsed: AutoscalerDoc = load::typed(doc)?;
    let mut spec = parsed.spec;
    let dir = path.parent().unwrap_or(Path::new("."));
    match (&spec.gateway.config, &spec.gateway.admin) {
        (Some(_), Some(_)) | (None, None) => {
            return Err(Problems(vec![doc.problem(
                "spec.gateway",
                "give exactly one of `config` (run the gateway here) and `admin` (watch a gateway elsewhere)",
            )]));
        }
        _ => {}
    }
    let problems = check_settings(&spec);
    if !problems.is_empty() {
        return Err(Problems(
            problems
                .into_iter()
                .map(|(field, message)| doc.problem(&field, message))
                .collect(),
        ));
    }
    if !known_profile(&spec.local.profile) {
        return Err(Problems(vec![doc.problem(
            "spec.local.profile",
            format!(
                "unknown profile `{}`; expected instant, small or tiny",
                spec.local.profile
            ),
        )]));
    }
    spec.policies = spec.policies.iter().map(|p| dir.join(p)).collect();
    spec.cluster = spec.cluster.as_ref().map(|p| dir.join(p));
    spec.gateway.config = spec.gateway.config.as_ref().map(|p| dir.join(p));
    spec.gateway.admin_token_file = spec.gateway.admin_token_file.as_ref().map(|p| dir.join(p));
    let mut named: Vec<(String, &Path)> =
        document::Document::each("spec.policies", &spec.policies).collect();
    named.extend(
        spec.cluster
            .iter()
            .map(|p| ("spec.cluster".into(), p.as_path())),
    );
    named.extend(
        spec.gateway
            .config
            .iter()
            .map(|p| ("spec.gateway.config".into(), p.as_path())),
    );
    // (Not the admin token file: `--admin-token-file` may replace it
    // where the controller runs, and reading it says what is wrong.)
    let missing = doc.missing(named);
    if !missing.is_empty() {
        return Err(Problems(missing));
    }
    let mut paths = spec.policies.clone();
    paths.extend(spec.cluster.iter().cloned());
    let bundle = if paths.is_empty() {
        None
    } else {
        Some(load::load_paths(&paths)?)
    };
    if !spec.policies.is_empty() && bundle.as_ref().is_none_or(|b| b.models.is_empty()) {
        return Err(Problems(vec![
            doc.problem("spec.policies", "no model policy found there"),
        ]));
    }
    // A cluster file that holds no Cluster (policies only, say): without
    // this the controller ran with nothing to pack on and said nothing.
    if spec.cluster.is_some() && bundle.as_ref().is_none_or(|b| b.cluster.is_none()) {
        return Err(Problems(vec![doc.problem(
            "spec.cluster",
            "no `kind: Cluster` document found there",
        )]));
    }
    let (models, cluster) = bundle.map_or((Vec::new(), None), |b| (b.models, b.cluster));
    Ok(Settings {
        name: parsed.metadata.name,
        spec,
        models,
        cluster,
    })
}

/// Every setting's bounds, as `(field path, message)`: all problems, not
/// only the first.
pub fn check_settings(spec: &AutoscalerSpec) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut bad = |field: &str, message: &str| out.push((field.to_string(), message.to_string()));
    if spec.interval < Duration::from_millis(10) {
        bad("spec.interval", "must be at least 10ms");
    }
    if spec.interval > Duration::from_secs(3600) {
        bad("spec.interval", "must be at most 1h");
    }
    if spec
        .local
        .startup_time
        .is_some_and(|t| t > Duration::from_secs(24 * 3600))
    {
        bad("spec.local.startupTime", "must be at most 24h");
    }
    if spec.local.max_replicas_per_model == 0 {
        bad("spec.local.maxReplicasPerModel", "must be at least 1");
    }
    let t = &spec.tuning;
    if !(t.tolerance.is_finite() && (0.0..1.0).contains(&t.tolerance)) {
        bad("spec.tuning.tolerance", "must be at least 0 and below 1");
    }
    if !(t.panic_threshold.is_finite() && t.panic_threshold > 1.0) {
        bad("spec.tuning.panicThreshold", "must be above 1");
    }
    if t.stable_window.is_zero() {
        bad("spec.tuning.stableWindow", "must be longer than 0s");
    }
    if t.fallback_after == 0 {
        bad("spec.tuning.fallbackAfter", "must be at least 1");
    }
    for (field, v) in [
        ("spec.tuning.forecastAlpha", t.forecast_alpha),
        ("spec.tuning.forecastBeta", t.forecast_beta),
    ] {
        if !(v.is_finite() && v > 0.0 && v <= 1.0) {
            bad(field, "must be above 0 and at most 1");
        }
    }
    if !(t.slo_max_step.is_finite() && t.slo_max_step >= 1.0) {
        bad("spec.tuning.sloMaxStep", "must be at least 1");
    }
    if !(t.prefill_target.is_finite() && t.prefill_target > 0.0) {
        bad("spec.tuning.prefillTarget", "must be above 0");
    }
    if t.depth_smoothing > Duration::from_secs(600) {
        bad(
            "spec.tuning.depthSmoothing",
            "must be at most 10m (a longer smoothing hides the load for minutes)",
        );
    }
    let p = &spec.packer;
    if !(p.mip_gap.is_finite() && (0.0..1.0).contains(&p.mip_gap)) {
        bad("spec.packer.mipGap", "must be at least 0 and below 1");
    }
    if !(2..=16).contains(&p.max_shares) {
        bad("spec.packer.maxShares", "must be between 2 and 16");
    }
    if !(2..=48).contains(&p.max_mps) {
        bad("spec.packer.maxMps", "must be between 2 and 48");
    }
    for (field, v) in [
        ("spec.packer.timesliceHeadroom", p.timeslice_headroom),
        ("spec.packer.isolatedHeadroom", p.isolated_headroom),
    ] {
        if !(v.is_finite() && (0.0..1.0).contains(&v)) {
            bad(field, "must be at least 0 and below 1");
        }
    }
    if !(1..=1000).contains(&p.hami_split_count) {
        bad("spec.packer.hamiSplitCount", "must be between 1 and 1000");
    }
    let k = &spec.kubernetes;
    let r = &k.server_resources;
    for (field, request, limit) in [
        ("cpu", r.cpu, r.cpu_limit),
        ("memoryGib", r.memory_gib, r.memory_limit_gib),
    ] {
        if !(request.is_finite() && request > 0.0 && limit.is_finite() && limit >= request) {
            bad(
                &format!("spec.kubernetes.serverResources.{field}"),
                "must be above 0, and its limit at least it",
            );
        }
    }
    for (i, t) in k.tolerations.iter().enumerate() {
        if let Err((field, message)) = crate::kubernetes::check_toleration(t) {
            bad(
                &format!("spec.kubernetes.tolerations[{i}].{field}"),
                &message,
            );
        }
    }
    if let Err(e) = k.pool_labels() {
        bad(
            "spec.kubernetes.nodeSelector",
            &format!("{e}: equality terms only, `key=value[,key=value…]`"),
        );
    }
    if k.lease_duration < Duration::from_secs(2) {
        bad("spec.kubernetes.leaseDuration", "must be at least 2s");
    }
    // client-go's rules: the leader stops acting (renewDeadline) before
    // a candidate may take over (leaseDuration), with room for one call
    // in flight; it tries more than once per deadline.
    if k.renew_deadline + k.request_timeout > k.lease_duration {
        bad(
            "spec.kubernetes.renewDeadline",
            "renewDeadline + requestTimeout must not exceed leaseDuration",
        );
    }
    if k.retry_period.is_zero() || k.retry_period * 2 > k.renew_deadline {
        bad(
            "spec.kubernetes.retryPeriod",
            "must be above 0s and at most half of renewDeadline",
        );
    }
    if !k.pack && spec.cluster.is_some() {
        bad(
            "spec.kubernetes.pack",
            "false runs one Deployment per model and packs nothing: remove spec.cluster, or pack",
        );
    }
    if k.request_timeout.is_zero() {
        bad("spec.kubernetes.requestTimeout", "must be longer than 0s");
    }
    if !is_quantity(&k.shm_size) {
        bad(
            "spec.kubernetes.shmSize",
            "expected a Kubernetes quantity such as 2Gi or 512Mi",
        );
    }
    if k.run_as_user < 1 {
        bad(
            "spec.kubernetes.runAsUser",
            "must be a non-root user id (1 or more)",
        );
    }
    if k.startup_timeout < Duration::from_secs(10) {
        bad(
            "spec.kubernetes.startupTimeout",
            "must be at least 10s (one startup probe period)",
        );
    }
    if let Some(url) = &spec.gateway.admin
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        bad("spec.gateway.admin", "expected an http:// URL");
    }
    for (i, url) in spec.gateway.instances.iter().enumerate() {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bad(
                &format!("spec.gateway.instances[{i}]"),
                "expected an http:// URL",
            );
        }
    }
    if !spec.gateway.instances.is_empty() && spec.gateway.config.is_some() {
        bad(
            "spec.gateway.instances",
            "the embedded gateway (spec.gateway.config) is one instance; list instances of a gateway running elsewhere (spec.gateway.admin)",
        );
    }
    if let Some(p) = &spec.prometheus
        && !(p.url.starts_with("http://") || p.url.starts_with("https://"))
    {
        bad("spec.prometheus.url", "expected an http:// URL");
    }
    out
}

/// A size as Kubernetes writes one: a decimal number and an optional
/// binary (`Ki`…`Ei`) or decimal (`k`, `M`…`E`) suffix.
fn is_quantity(q: &str) -> bool {
    const SUFFIXES: [&str; 13] = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E",
    ];
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &q[digits.len()..];
    let mut parts = digits.splitn(2, '.');
    let whole = parts.next().unwrap_or_default();
    let frac = parts.next();
    !whole.is_empty()
        && whole.bytes().all(|b| b.is_ascii_digit())
        && frac.is_none_or(|f| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit()))
        && SUFFIXES.contains(&suffix)
}

/// The profiles the simulated server knows (kept in step with
/// `gpuscale sim-server --profile`).
fn known_profile(p: &str) -> bool {
    matches!(p, "instant" | "small" | "tiny")
}

#[cfg(test)]
mod tests {
    use super::{AutoscalerSpec, check_settings, is_quantity};

    #[test]
    fn a_cluster_file_without_a_cluster_is_located() {
        let dir = tempfile::tempdir().unwrap();
        let policies = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/local/policies.yaml"
        ))
        .unwrap();
        std::fs::write(dir.path().join("policies.yaml"), &policies).unwrap();
        let file = dir.path().join("autoscaler.yaml");
        let write = |cluster: &str| {
            std::fs::write(
                &file,
                format!(
                    "apiVersion: gpuscale.io/v1alpha1\nkind: Autoscaler\nmetadata: {{name: a}}\n\
                     spec:\n  policies: [policies.yaml]\n  cluster: {cluster}\n  \
                     gateway: {{admin: 'http://127.0.0.1:9090'}}\n"
                ),
            )
            .unwrap();
        };
        // The policies file named as the cluster: it loaded, and the
        // controller ran with nothing to pack on.
        write("policies.yaml");
        let e = super::load(&file).unwrap_err().0;
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(e[0].path, "spec.cluster");
        assert_eq!(e[0].position.line, 6);
        assert!(
            e[0].message.contains("no `kind: Cluster`"),
            "{}",
            e[0].message
        );
        std::fs::write(
            dir.path().join("cluster.yaml"),
            "apiVersion: gpuscale.io/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n  \
             nodes:\n    - {name: n0, gpuModel: H100-80GB, gpuCount: 8}\n",
        )
        .unwrap();
        write("cluster.yaml");
        let s = super::load(&file).unwrap();
        assert!(s.cluster.is_some());
    }

    #[test]
    fn tuning_out_of_bounds_is_named_by_field() {
        let spec: AutoscalerSpec = serde_yaml_ng::from_str(
            "policies: [p]\n\
             gateway: {config: g.yaml}\n\
             tuning: {sloMaxStep: 0.5, prefillTarget: 0, forecastAlpha: 2}\n",
        )
        .unwrap();
        let fields: Vec<String> = check_settings(&spec).into_iter().map(|(f, _)| f).collect();
        for f in [
            "spec.tuning.sloMaxStep",
            "spec.tuning.prefillTarget",
            "spec.tuning.forecastAlpha",
        ] {
            assert!(fields.iter().any(|x| x == f), "{f} in {fields:?}");
        }
        let ok: AutoscalerSpec = serde_yaml_ng::from_str(
            "policies: [p]\ngateway: {config: g.yaml}\ntuning: {prefillTarget: 0.8}\n",
        )
        .unwrap();
        assert_eq!(ok.tuning.prefill_target, 0.8);
        assert!(check_settings(&ok).is_empty(), "{:?}", check_settings(&ok));
    }

    #[test]
    fn packer_settings_are_gpuscale_plans_and_bounded_by_field() {
        let spec: AutoscalerSpec =
            serde_yaml_ng::from_str("policies: [p]\ngateway: {config: g.yaml}\n").unwrap();
        // Unset, the controller packs exactly as before (the packer's
        // defaults).
        assert_eq!(
            spec.packer.options(),
            gpuscale_packer::PackOptions::default()
        );
        let spec: AutoscalerSpec = serde_yaml_ng::from_str(
            "policies: [p]\n\
             gateway: {config: g.yaml}\n\
             packer: {mipGap: 0.01, hamiSplitCount: 4, isolatedHeadroom: 0.1, maxShares: 8}\n",
        )
        .unwrap();
        assert!(
            check_settings(&spec).is_empty(),
            "{:?}",
            check_settings(&spec)
        );
        let o = spec.packer.options();
        assert_eq!(
            (
                o.mip_rel_gap,
                o.fractional_max_shares,
                o.fractional_memory_headroom,
                o.mps_memory_headroom,
                o.max_timeslice_replicas,
                o.timeslice_memory_headroom,
            ),
            (0.01, 4, 0.1, 0.1, 8, 0.1)
        );
        let bad: AutoscalerSpec = serde_yaml_ng::from_str(
            "policies: [p]\n\
             gateway: {config: g.yaml}\n\
             packer: {mipGap: -0.1, hamiSplitCount: 0, timesliceHeadroom: 1, maxShares: 1, maxMps: 64, isolatedHeadroom: .nan}\n",
        )
        .unwrap();
        let fields: Vec<String> = check_settings(&bad).into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            fields,
            [
                "spec.packer.mipGap",
                "spec.packer.maxShares",
                "spec.packer.maxMps",
                "spec.packer.timesliceHeadroom",
                "spec.packer.isolatedHeadroom",
                "spec.packer.hamiSplitCount",
            ]
        );
        assert!(
            serde_yaml_ng::from_str::<AutoscalerSpec>(
                "gateway: {config: g.yaml}\npacker: {splitCount: 3}\n"
            )
            .is_err()
        );
    }

    #[test]
    fn a_local_start_up_time_past_a_day_is_refused() {
        let spec = |t: &str| -> AutoscalerSpec {
            serde_yaml_ng::from_str(&format!(
                "gateway: {{config: g.yaml}}\nlocal: {{startupTime: {t}}}\n"
            ))
            .unwrap()
        };
        let fields = |s: &AutoscalerSpec| -> Vec<String> {
            check_settings(s).into_iter().map(|(f, _)| f).collect()
        };
        assert_eq!(fields(&spec("2days")), ["spec.local.startupTime"]);
        assert!(fields(&spec("24h")).is_empty());
        // Past a year it does not even read (`gpuscale_policies::duration`).
        assert!(
            serde_yaml_ng::from_str::<AutoscalerSpec>(
                "gateway: {config: g.yaml}\nlocal: {startupTime: 500000000000y}\n"
            )
            .is_err()
        );
    }

    #[test]
    fn tolerations_default_to_the_gpu_taint_and_bad_ones_are_located() {
        let spec = |k: &str| -> AutoscalerSpec {
            serde_yaml_ng::from_str(&format!("gateway: {{config: g.yaml}}\nkubernetes: {k}\n"))
                .unwrap()
        };
        let fields = |s: &AutoscalerSpec| -> Vec<String> {
            check_settings(s).into_iter().map(|(f, _)| f).collect()
        };
        let default = spec("{}");
        assert_eq!(
            serde_json::to_value(&default.kubernetes.tolerations).unwrap(),
            serde_json::json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
        );
        assert!(spec("{tolerations: []}").kubernetes.tolerations.is_empty());
        let bad = spec(
            "{tolerations: [{key: a, operator: Exists}, {key: b, operator: Exists, value: x}, \
             {key: c, effect: Sometimes}]}",
        );
        assert_eq!(
            fields(&bad),
            [
                "spec.kubernetes.tolerations[1].value",
                "spec.kubernetes.tolerations[2].effect"
            ]
        );
    }

    #[test]
    fn quantities_as_kubernetes_writes_them() {
        for ok in ["2Gi", "512Mi", "1.5Gi", "100", "2G", "64k"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "2GB", "Gi", "-1Gi", "2 Gi", "1.Gi", "two"] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}
