//! The artefacts NVIDIA's tools consume, generated from a [`Plan`]: the
//! mig-parted configuration (selected per node by the `nvidia.com/mig.config`
//! label), the device plugin's time-slicing (of whole GPUs or of one MIG
//! profile's instances) and MPS configurations
//! (selected by `nvidia.com/device-plugin.config`), the node labels (HAMi
//! nodes: `gpu: "on"` for HAMi's device plugin, and the GPU Operator's
//! device plugin switched off there), and per-variant resource snippets
//! for pod templates (fractional variants: HAMi's `nvidia.com/gpumem` and
//! `nvidia.com/gpucores`, and its annotations). Pure: it returns text; the
//! caller writes files.
//!
//! mig-parted applies a geometry by profile counts per device; the driver
//! picks start slots. The plan's start slots are valid placements (so the
//! counts are always realisable) but advisory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::plan::{Mode, Plan};

/// A name that is also a valid label value and Deployment name (at most
/// 63 characters): a longer one keeps its first 52 characters and ends in
/// a hash of the whole, so two long names stay apart.
pub fn bounded_name(name: String) -> String {
    if name.len() <= 63 {
        return name;
    }
    let head: String = name.chars().take(52).collect();
    format!(
        "{}-{:010x}",
        head.trim_end_matches('-'),
        fnv(&name) & 0xff_ffff_ffff
    )
}

/// `name` (a valid object name another object also took) made its own
/// with a hash of `identity`, within 63 characters.
pub fn distinct_name(name: &str, identity: &str) -> String {
    let head: String = name.chars().take(52).collect();
    format!(
        "{}-{:010x}",
        head.trim_end_matches('-'),
        fnv(identity) & 0xff_ffff_ffff
    )
}

/// The mig-parted config name that disables MIG on every GPU.
pub const ALL_DISABLED: &str = "all-disabled";

/// mig-parted's config file (`version: v1`, `mig-configs`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigPartedConfig {
    /// Always `v1`.
    pub version: String,
    /// Named configurations.
    #[serde(rename = "mig-configs")]
    pub mig_configs: BTreeMap<String, Vec<MigConfigEntry>>,
}

/// Devices an entry applies to: `all` or a list of indices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Devices {
    /// The literal `all`.
    All(String),
    /// Device indices.
    List(Vec<u32>),
}

/// One entry of a mig-parted configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigConfigEntry {
    /// The devices.
    pub devices: Devices,
    /// Whether MIG mode is on.
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    /// Instances per profile (MIG enabled only).
    #[serde(
        rename = "mig-devices",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub mig_devices: BTreeMap<String, u32>,
}

/// MIG instances per profile of one GPU; `None` = MIG disabled.
type GpuConfig = Option<BTreeMap<String, u32>>;

/// Per node, the configuration of each GPU index.
fn node_layouts(plan: &Plan) -> BTreeMap<&str, Vec<(u32, GpuConfig)>> {
    let mut out: BTreeMap<&str, Vec<(u32, GpuConfig)>> = BTreeMap::new();
    for g in &plan.gpus {
        let counts =
            (matches!(g.mode, Mode::Mig | Mode::Idle) && !g.geometry.is_empty()).then(|| {
                let mut c = BTreeMap::new();
                for p in &g.geometry {
                    *c.entry(p.profile.clone()).or_insert(0) += 1;
                }
                c
            });
        out.entry(g.node.as_str())
            .or_default()
            .push((g.index, counts));
    }
    for v in out.values_mut() {
        v.sort_by_key(|(i, _)| *i);
    }
    out
}

fn entries(layout: &[(u32, GpuConfig)]) -> Vec<MigConfigEntry> {
    // Group devices with the same configuration, in order of first index.
    let mut groups: Vec<(GpuConfig, Vec<u32>)> = Vec::new();
    for (i, cfg) in layout {
        match groups.iter_mut().find(|(c, _)| c == cfg) {
            Some((_, devs)) => devs.push(*i),
            None => groups.push((cfg.clone(), vec![*i])),
        }
    }
    groups
        .into_iter()
        .map(|(cfg, devices)| MigConfigEntry {
            devices: Devices::List(devices),
            mig_enabled: cfg.is_some(),
            mig_devices: cfg.unwrap_or_default(),
        })
        .collect()
}

/// FNV-1a, for stable short config names.
fn fnv(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The mig-parted configuration and, per node, the config name to select.
/// Nodes with the same layout share one named configuration.
pub fn mig_parted(plan: &Plan) -> (MigPartedConfig, BTreeMap<String, String>) {
    let mut configs = BTreeMap::new();
    configs.insert(
        ALL_DISABLED.to_string(),
        vec![MigConfigEntry {
            devices: Devices::All("all".into()),
            mig_enabled: false,
            mig_devices: BTreeMap::new(),
        }],
    );
    let mut names = BTreeMap::new();
    for (node, layout) in node_layouts(plan) {
        let name = if layout.iter().all(|(_, c)| c.is_none()) {
            ALL_DISABLED.to_string()
        } else {
            let e = entries(&layout);
            let text = serde_json::to_string(&e).expect("plain data serialises");
            let name = format!("gpuscale-{:010x}", fnv(&text) & 0xff_ffff_ffff);
            configs.insert(name.clone(), e);
            name
        };
        names.insert(node.to_string(), name);
    }
    (
        MigPartedConfig {
            version: "v1".into(),
            mig_configs: configs,
        },
        names,
    )
}

/// The node label GPU Feature Discovery sets to the GPU's product name.
pub use gpuscale_policies::inventory::PRODUCT_LABEL;

/// The node label that picks the device plugin's config for the node.
pub const DEVICE_PLUGIN_CONFIG_LABEL: &str = "nvidia.com/device-plugin.config";

/// The device plugin's configuration for a node time-slicing into `n`.
pub fn device_plugin_config(n: Option<u8>) -> serde_json::Value {
    let mut config = serde_json::json!({
        "version": "v1",
        "flags": {"migStrategy": "mixed"},
    });
    if let Some(n) = n {
        config["sharing"] = serde_json::json!({
            "timeSlicing": {
                "renameByDefault": true,
                "failRequestsGreaterThanOne": true,
                "resources": [{"name": "nvidia.com/gpu", "replicas": n}],
            }
        });
    }
    config
}

/// The device plugin's configuration for a node time-slicing every MIG
/// instance of one profile into `n` (mixed strategy; the shares are
/// advertised as `nvidia.com/mig-<profile>.shared`).
pub fn mig_timeslice_config(profile: &str, n: u8) -> serde_json::Value {
    serde_json::json!({
        "version": "v1",
        "flags": {"migStrategy": "mixed"},
        "sharing": {
            "timeSlicing": {
                "renameByDefault": true,
                "failRequestsGreaterThanOne": true,
                "resources": [{"name": format!("nvidia.com/mig-{profile}"), "replicas": n}],
            }
        },
    })
}

/// Name of the device-plugin config time-slicing a MIG profile
/// (`mig-<profile>-timeslice-N`).
pub fn mig_timeslice_config_name(profile: &str, n: u8) -> String {
    format!("mig-{profile}-timeslice-{n}")
}

/// Name of the device-plugin config for a node (`default` or `timeslice-N`).
pub fn device_plugin_config_name(n: Option<u8>) -> String {
    n.map_or_else(|| "default".to_string(), |n| format!("timeslice-{n}"))
}

/// The device plugin's configuration for a node sharing its GPUs through
/// MPS into `n` partitions (device plugin v0.15+; MPS does not run on MIG
/// devices, so `migStrategy: none`).
pub fn mps_config(n: u8) -> serde_json::Value {
    serde_json::json!({
        "version": "v1",
        "flags": {"migStrategy": "none"},
        "sharing": {
            "mps": {
                "renameByDefault": true,
                "resources": [{"name": "nvidia.com/gpu", "replicas": n}],
            }
        },
    })
}

/// Name of the MPS device-plugin config (`mps-N`).
pub fn mps_config_name(n: u8) -> String {
    format!("mps-{n}")
}

/// The device-plugin config a node's label names.
pub fn node_config_name(node: &crate::plan::NodePlan) -> String {
    match (node.mps_replicas, &node.mig_timeslice) {
        (Some(n), _) => mps_config_name(n),
        (None, Some(t)) => mig_timeslice_config_name(&t.profile, t.replicas),
        (None, None) => device_plugin_config_name(node.timeslice_replicas),
    }
}

/// HAMi's per-container memory limit resource (MiB).
pub const HAMI_MEMORY: &str = "nvidia.com/gpumem";
/// HAMi's per-container SM percentage resource.
pub const HAMI_CORES: &str = "nvidia.com/gpucores";
/// The node label HAMi's device plugin and scheduler select (`gpu: on`).
pub const HAMI_NODE_LABEL: (&str, &str) = ("gpu", "on");
/// The GPU Operator's label that keeps its device plugin off a node (HAMi's
/// serves the node's GPUs instead).
pub const OPERATOR_DEVICE_PLUGIN_LABEL: &str = "nvidia.com/gpu.deploy.device-plugin";

pub use gpuscale_policies::inventory::{NVLINK_DOMAIN_LABEL, RACK_LABEL};
/// HAMi's annotation restricting a pod to GPUs by UUID (comma-separated).
pub const HAMI_USE_UUID: &str = "nvidia.com/use-gpuuuid";
/// HAMi's annotation keeping a pod off GPUs by UUID (comma-separated).
pub const HAMI_NOUSE_UUID: &str = "nvidia.com/nouse-gpuuuid";
/// The label on everything gpuscale deploys for a model (its policy's
/// name), as the Kubernetes backend's Deployments carry it.
pub const MODEL_LABEL: &str = "gpuscale.io/model";
/// The label naming a model's placement variant (its Deployment).
pub const VARIANT_LABEL: &str = "gpuscale.io/variant";
/// The pod label HAMi's admission webhook skips pods by (its
/// `objectSelector`): pods asking for whole GPUs as `nvidia.com/gpu`,
/// HAMi's resource name too, stay with the default scheduler.
pub const HAMI_WEBHOOK_LABEL: (&str, &str) = ("hami.io/webhook", "ignore");
/// HAMi's annotation choosing how it picks a GPU on a node.
pub const HAMI_GPU_POLICY: &str = "hami.io/gpu-scheduler-policy";

/// The UUID of GPU `index` of `node`, where the inventory knows it.
pub fn gpu_uuid<'a>(
    cluster: &'a gpuscale_policies::Cluster,
    node: &str,
    index: u32,
) -> Option<&'a str> {
    cluster
        .nodes
        .iter()
        .find(|n| n.name == node)
        .and_then(|n| n.gpus.get(index as usize))
        .and_then(|g| g.uuid.as_deref())
}

/// A fractional variant's pod annotations: bin-pack (fill the GPUs in use
/// before opening another, as the plan did) and, when the inventory knows
/// the UUID of every GPU the variant's replicas are on, those GPUs: HAMi
/// then places each pod only there, and its own accounting of `gpumem` and
/// `gpucores` per GPU keeps any assignment within the limits.
pub fn hami_annotations(
    cluster: &gpuscale_policies::Cluster,
    on: &std::collections::BTreeSet<(&str, u32)>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::from([(HAMI_GPU_POLICY.to_string(), "binpack".to_string())]);
    if let Some(uuids) = pinned_uuids(cluster, on) {
        out.insert(HAMI_USE_UUID.to_string(), uuids.join(","));
    }
    out
}

/// The UUIDs of the GPUs a variant on `on` is pinned to, when every one
/// of them has a UUID ([`hami_annotations`] pins it then).
pub fn pinned_uuids<'a>(
    cluster: &'a gpuscale_policies::Cluster,
    on: &std::collections::BTreeSet<(&str, u32)>,
) -> Option<Vec<&'a str>> {
    on.iter()
        .map(|&(node, index)| gpu_uuid(cluster, node, index))
        .collect()
}

/// YAML 1.1's booleans besides `true` and `false` (which serde_yaml_ng
/// quotes already, as YAML 1.2's): Kubernetes reads manifests with
/// sigs.k8s.io/yaml over go-yaml v2, a YAML 1.1 parser, where an unquoted
/// `on` is `true` (HAMi's node label `gpu: on` then selects no node, or is
/// refused as a label value).
const YAML11_BOOLEANS: [&str; 16] = [
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
    "OFF",
];

/// `value` as YAML that YAML 1.1 parsers read the same: serde_yaml_ng's
/// output with every plain key or scalar that YAML 1.1 takes for a
/// boolean (`on`, `off`, `yes`, `no`, `y`, `n` in their cases), a
/// number or a timestamp where YAML 1.2 reads a string ([`yaml11_only`]:
/// `1_000`, `0b101`, `2026-12-06`) double-quoted: a value after `key: `,
/// a key before `:` (a node named `on`), a list item after `- `. Lines of block scalars (multi-line text)
/// get the same treatment: embedded YAML, which its readers parse the same
/// way; text whose line is exactly such a word gains the quotes.
pub fn to_yaml<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, serde_yaml_ng::Error> {
    Ok(quote_yaml11_only(&serde_yaml_ng::to_string(value)?))
}

/// Whether go-yaml v2 (`resolve.go`: sigs.k8s.io/yaml, so kubectl and
/// client-go's YAML) reads the plain scalar `word` as a boolean, number or
/// timestamp where YAML 1.2's core schema, and so serde_yaml_ng, reads a
/// string (serde_yaml_ng quotes those itself, so a plain 1.2 number is a
/// number and stays as it is). A label value `1_000` otherwise reaches
/// the API server as the integer 1000, which it refuses.
///
/// go-yaml v2, for a plain scalar starting with a digit, a sign or a dot:
/// the text without its underscores read by Go's `strconv.ParseInt` or
/// `ParseUint` in base 0 (`0x`, `0o`, `0b`, a leading `0` for octal), or
/// matched by `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$` (a
/// float), or a timestamp (four digits and `-`, read by `time.Parse` as
/// `2006-1-2` with an optional time after it); quoting a few more than
/// it reads is harmless.
pub fn yaml11_only(word: &str) -> bool {
    if YAML11_BOOLEANS.contains(&word) {
        return true;
    }
    if core_number(word) {
        return false;
    }
    let plain: String = word.chars().filter(|&c| c != '_').collect();
    go_number(&plain) || timestamp(word)
}

/// A number as serde_yaml_ng writes one: an integer without leading
/// zeros, a float as `ryu` formats it (`0.5`, `2.0`, `1e21`, `1.5e-7`),
/// `.inf`, `-.inf`, `.nan`. A string that reads as a number it quotes
/// itself, so a plain scalar of this form is a number.
fn core_number(w: &str) -> bool {
    let digits = |s: &str| s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    if matches!(w, ".inf" | "-.inf" | ".nan") {
        return true;
    }
    let u = w.strip_prefix('-').unwrap_or(w);
    let n = digits(u);
    if n == 0 {
        return false;
    }
    let (int, rest) = u.split_at(n);
    match rest.strip_prefix('.') {
        Some(f) if digits(f) > 0 => exponent_or_nothing(&f[digits(f)..]),
        Some(_) => false,
        None if rest.is_empty() => int == "0" || !int.starts_with('0'),
        None => exponent_or_nothing(rest),
    }
}

/// Whether `rest` is empty or an exponent, `[eE][-+]?[0-9]+`.
fn exponent_or_nothing(rest: &str) -> bool {
    match rest.strip_prefix(['e', 'E']) {
        None => rest.is_empty(),
        Some(e) => {
            let e = e.strip_prefix(['-', '+']).unwrap_or(e);
            !e.is_empty() && e.bytes().all(|c| c.is_ascii_digit())
        }
    }
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
fn float_pattern(w: &str) -> bool {
    let digits = |s: &str| s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let s = w.strip_prefix(['-', '+']).unwrap_or(w);
    let rest = if let Some(r) = s.strip_prefix('.') {
        let n = digits(r);
        if n == 0 {
            return false;
        }
        &r[n..]
    } else {
        let n = digits(s);
        if n == 0 {
            return false;
        }
        let r = &s[n..];
        match r.strip_prefix('.') {
            Some(f) => &f[digits(f)..],
            None => r,
        }
    };
    exponent_or_nothing(rest)
}

/// Go's `ParseInt(s, 0, 64)` / `ParseUint` syntax (range aside: a decimal
/// too large for them matches the float pattern anyway), or the float
/// pattern.
fn go_number(s: &str) -> bool {
    let all = |s: &str, f: fn(char) -> bool| !s.is_empty() && s.chars().all(f);
    let u = s.strip_prefix(['-', '+']).unwrap_or(s);
    let prefixed =
        |lower: &str, upper: &str| u.strip_prefix(lower).or_else(|| u.strip_prefix(upper));
    if let Some(r) = prefixed("0x", "0X") {
        return all(r, |c| c.is_ascii_hexdigit());
    }
    if let Some(r) = prefixed("0o", "0O") {
        return all(r, |c| ('0'..='7').contains(&c));
    }
    if let Some(r) = prefixed("0b", "0B") {
        return all(r, |c| c == '0' || c == '1');
    }
    all(u, |c| c.is_ascii_digit()) || float_pattern(s)
}

/// go-yaml v2's `parseTimestamp`: four digits and `-` first, then Go's
/// `2006-1-2` (month and day of one or two digits), alone or followed by
/// `T`, `t` or a space and a time.
fn timestamp(w: &str) -> bool {
    let b = w.as_bytes();
    if b.len() < 8 || !b[..4].iter().all(u8::is_ascii_digit) || b[4] != b'-' {
        return false;
    }
    let mut parts = w[5..].splitn(2, '-');
    let month = parts.next().unwrap_or("");
    let Some(rest) = parts.next() else {
        return false;
    };
    let day_len = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let one_or_two = |n: usize| (1..=2).contains(&n);
    one_or_two(month.len())
        && month.bytes().all(|c| c.is_ascii_digit())
        && one_or_two(day_len)
        && (day_len == rest.len() || matches!(rest.as_bytes()[day_len], b'T' | b't' | b' '))
}

fn quote_yaml11_only(text: &str) -> String {
    let quoted = |word: &str| {
        if yaml11_only(word) {
            format!("\"{word}\"")
        } else {
            word.to_string()
        }
    };
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.split_inclusive('\n') {
        let (body, end) = line.strip_suffix('\n').map_or((line, ""), |b| (b, "\n"));
        // Indentation and list markers (`- `, also nested `- - `), then a
        // scalar, a `key:` or a `key: value`.
        let mut at = body.len() - body.trim_start_matches(' ').len();
        while body[at..].starts_with("- ") {
            at += 2;
        }
        out.push_str(&body[..at]);
        let rest = &body[at..];
        if let Some((key, value)) = rest.split_once(": ") {
            out.push_str(&quoted(key));
            out.push_str(": ");
            out.push_str(&quoted(value));
        } else if let Some(key) = rest.strip_suffix(':') {
            out.push_str(&quoted(key));
            out.push(':');
        } else {
            out.push_str(&quoted(rest));
        }
        out.push_str(end);
    }
    out
}

/// A variant's pod `affinity`: its node-affinity term as the one required
/// term (`None` without one).
pub fn affinity(v: &crate::plan::Variant) -> Option<serde_json::Value> {
    v.node_affinity.as_ref().map(|term| {
        serde_json::json!({"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]},
        }})
    })
}

/// A variant as a strategic-merge patch of its Deployment (no
/// `apiVersion` or `kind`): its name and labels, the replicas, and the pod
/// template's parts the plan decides — the pods' labels (gpuscale's and
/// the variant's own), annotations (HAMi's, which HAMi reads from the pod,
/// not from the Deployment), node selector, required node affinity, and
/// the `model-server` container's resource limits; and the rollout
/// ([`rollout`]).
pub fn variant_patch(model: &str, v: &crate::plan::Variant) -> serde_json::Value {
    let labels = BTreeMap::from([
        (MODEL_LABEL.to_string(), model.to_string()),
        (VARIANT_LABEL.to_string(), v.name.clone()),
    ]);
    let mut pod_labels = labels.clone();
    pod_labels.extend(v.labels.clone());
    let mut pod_metadata = serde_json::json!({"labels": pod_labels});
    if !v.annotations.is_empty() {
        pod_metadata["annotations"] = serde_json::json!(v.annotations);
    }
    let mut pod_spec = serde_json::json!({
        "nodeSelector": v.node_selector,
        "containers": [{"name": "model-server", "resources": {"limits": v.resources}}],
    });
    if let Some(affinity) = affinity(v) {
        pod_spec["affinity"] = affinity;
    }
    serde_json::json!({
        "metadata": {"name": v.name, "labels": labels},
        "spec": {
            "replicas": v.replicas,
            "selector": {"matchLabels": {VARIANT_LABEL: v.name}},
            "strategy": rollout(),
            "template": {"metadata": pod_metadata, "spec": pod_spec},
        },
    })
}

/// A variant's Deployment strategy: a rolling update that takes one old
/// pod out before it starts a new one (`maxSurge: 0`, `maxUnavailable:
/// 1`). The plan makes exactly the MIG instances, shares, HAMi room and
/// whole GPUs its replicas need, and pins whole-GPU and fractional
/// variants to their node or GPUs: a surge pod would wait for a device its
/// own old pods hold, and the default (25 % unavailable, rounded down:
/// none below four replicas) would never finish a template change.
pub fn rollout() -> serde_json::Value {
    serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}})
}

/// Every file `plan --emit DIR` writes: (relative path, contents).
pub fn files(plan: &Plan, namespace: &str) -> Result<Vec<(String, String)>, serde_yaml_ng::Error> {
    let mut out = Vec::new();
    let (mig, _) = mig_parted(plan);
    out.push(("mig-parted-config.yaml".into(), to_yaml(&mig)?));
    // The mig-parted config as the GPU Operator's MIG manager reads it.
    let mig_text = to_yaml(&mig)?;
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpuscale-mig-parted-config", "namespace": namespace},
        "data": {"config.yaml": mig_text},
    });
    out.push(("mig-parted-configmap.yaml".into(), to_yaml(&cm)?));

    let mut shares: Vec<Option<u8>> = vec![None];
    let mut mps: Vec<u8> = Vec::new();
    let mut mig_shared: std::collections::BTreeSet<(&str, u8)> = Default::default();
    for n in &plan.nodes {
        if let Some(t) = &n.mig_timeslice {
            mig_shared.insert((t.profile.as_str(), t.replicas));
        }
        if !shares.contains(&n.timeslice_replicas) {
            shares.push(n.timeslice_replicas);
        }
        if let Some(k) = n.mps_replicas
            && !mps.contains(&k)
        {
            mps.push(k);
        }
    }
    shares.sort();
    mps.sort();
    let mut data = serde_json::Map::new();
    for n in &shares {
        data.insert(
            device_plugin_config_name(*n),
            serde_json::Value::String(to_yaml(&device_plugin_config(*n))?),
        );
    }
    for &n in &mps {
        data.insert(
            mps_config_name(n),
            serde_json::Value::String(to_yaml(&mps_config(n))?),
        );
    }
    for &(profile, n) in &mig_shared {
        data.insert(
            mig_timeslice_config_name(profile, n),
            serde_json::Value::String(to_yaml(&mig_timeslice_config(profile, n))?),
        );
    }
    let dp = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpuscale-device-plugin-config", "namespace": namespace},
        "data": data,
    });
    out.push(("device-plugin-config.yaml".into(), to_yaml(&dp)?));

    // `null` removes a label (as in a JSON merge patch of the node's
    // `metadata.labels`; `kubectl label node N gpu-`): a node that may run
    // HAMi but is not used for it this time loses HAMi's device-plugin
    // label and gets the GPU Operator's device plugin back.
    let labels: BTreeMap<&str, BTreeMap<&str, Option<String>>> = plan
        .nodes
        .iter()
        .map(|n| {
            let mut labels = BTreeMap::from([
                ("nvidia.com/mig.config", Some(n.mig_config.clone())),
                (DEVICE_PLUGIN_CONFIG_LABEL, Some(node_config_name(n))),
            ]);
            if n.hami {
                labels.insert(HAMI_NODE_LABEL.0, Some(HAMI_NODE_LABEL.1.to_string()));
                labels.insert(OPERATOR_DEVICE_PLUGIN_LABEL, Some("false".to_string()));
            } else if n.hami_capable {
                labels.insert(HAMI_NODE_LABEL.0, None);
                labels.insert(OPERATOR_DEVICE_PLUGIN_LABEL, Some("true".to_string()));
            }
            if let Some(rack) = &n.rack {
                labels.insert(RACK_LABEL, Some(rack.clone()));
            }
            if let Some(domain) = &n.nvlink_domain {
                labels.insert(NVLINK_DOMAIN_LABEL, Some(domain.clone()));
            }
            (n.name.as_str(), labels)
        })
        .collect();
    out.push(("node-labels.yaml".into(), to_yaml(&labels)?));

    for m in &plan.models {
        for v in &m.variants {
            out.push((
                format!("variants/{}.yaml", v.name),
                to_yaml(&variant_patch(&m.name, v))?,
            ));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{YAML11_BOOLEANS, to_yaml, yaml11_only};
    use std::collections::BTreeMap;

    /// Every YAML 1.1 boolean word comes out quoted, as a map value and as
    /// a list item, and YAML 1.2's own (`true`, `false`) and other words
    /// stay as serde_yaml_ng writes them; the text reads back the same.
    #[test]
    fn yaml_11_booleans_are_quoted() {
        for word in YAML11_BOOLEANS {
            let map = BTreeMap::from([("gpu", word)]);
            assert_eq!(to_yaml(&map).unwrap(), format!("gpu: \"{word}\"\n"));
            let list = vec![word, "online"];
            assert_eq!(to_yaml(&list).unwrap(), format!("- \"{word}\"\n- online\n"));
        }
        let nested = serde_json::json!({
            "nodeSelector": {"gpu": "on", "nvidia.com/gpu.deploy.device-plugin": "false"},
            "note": "a: on",
            "text": "line one\ngpu: on\n",
            "replicas": 2,
        });
        let keys = BTreeMap::from([
            ("on", BTreeMap::from([("gpu", "on")])),
            ("n1", BTreeMap::new()),
        ]);
        assert_eq!(to_yaml(&keys).unwrap(), "n1: {}\n\"on\":\n  gpu: \"on\"\n");
        assert_eq!(to_yaml(&vec![vec!["yes"]]).unwrap(), "- - \"yes\"\n");
        let text = to_yaml(&nested).unwrap();
        assert!(text.contains("gpu: \"on\""), "{text}");
        assert!(
            text.contains("device-plugin: 'false'") || text.contains("device-plugin: \"false\""),
            "{text}"
        );
        let back: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        let mut want = nested.clone();
        // Inside the block scalar the line is quoted too (its readers are
        // YAML parsers as well).
        want["text"] = serde_json::json!("line one\ngpu: \"on\"\n");
        assert_eq!(back, want);
    }

    /// go-yaml v2's own decode tests (`decode_test.go`, YAML 1.1's
    /// examples) read these as numbers or timestamps; YAML 1.2 reads them
    /// as strings, so they come out quoted. Real numbers stay plain.
    #[test]
    fn yaml_11_numbers_and_timestamps_are_quoted() {
        for word in [
            "685_230",
            "+685_230",
            "685_230.15",
            "0b1010_0111_0100_1010_1110",
            "-0b101",
            "0x_0A_74_AE",
            "0X1F",
            "02472256",
            "0O17",
            "1_000",
            "1_",
            "0_1",
            "+12e03",
            "2015-02-24",
            "2001-12-14t21:59:43.10-05:00",
            "2001-12-15 2:59:43.10",
            "2002-1-7",
        ] {
            assert!(yaml11_only(word), "{word}");
            let map = BTreeMap::from([("v", word)]);
            let text = to_yaml(&map).unwrap();
            assert!(
                text == format!("v: \"{word}\"\n") || text == format!("v: '{word}'\n"),
                "{word}: {text}"
            );
            let back: BTreeMap<String, String> = serde_yaml_ng::from_str(&text).unwrap();
            assert_eq!(back["v"], word);
        }
        for word in [
            "_",
            "1.2.3",
            "v1_000",
            "0x",
            "0b102",
            "1e",
            "2015-02",
            "201-02-24",
            "2015-123-4",
            "2015-02-24x",
            "a-1",
            "10Gi",
            "1-2-3",
        ] {
            assert!(!yaml11_only(word), "{word}");
        }
        let numbers = serde_json::json!({"a": 3, "b": -1, "c": 0.5, "d": 1e21, "e": 2.0});
        let text = to_yaml(&numbers).unwrap();
        assert!(!text.contains('"') && !text.contains('\''), "{text}");
        let back: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
        assert_eq!(back, numbers);
    }
}
