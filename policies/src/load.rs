//! Loading files and directories into a validated [`Bundle`].
//!
//! Each document has the Kubernetes shape `apiVersion: gpuscale.io/v1alpha1`,
//! `kind` (`ModelPolicy`, `TrainingJob`, `Cluster` or `Demand`), `metadata` and
//! `spec`. Directories are read recursively (`*.yaml`, `*.yml`, `*.json`, in
//! name order). Loading reports every problem of every file at once, each
//! with file, line, column and field path; it never panics on any input.
//!
//! Validation happens in three steps: syntax and types per document, each
//! document against the catalogue (with the cluster's overrides), then
//! across documents (duplicate names, workloads naming unknown policies,
//! tensor-parallel degrees or gangs larger than any node of the cluster).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::FieldError;
use crate::catalog::Catalog;
use crate::document::{self, Document, Problem};
use crate::inventory::{Cluster, ClusterSpec};
use crate::model::{Model, ModelPolicy, ModelPolicySpec, PlacementOption};
use crate::training::{
    TopologyLevel, TopologyMode, TrainingJob, TrainingJobSpec, TrainingQueueSpec,
};

/// The API version of every gpuscale document.
pub const API_VERSION: &str = "gpuscale.io/v1alpha1";

/// Largest input file read, bytes.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

/// `metadata` of a document.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metadata {
    /// Name (a DNS-1123 subdomain, as Kubernetes requires).
    pub name: String,
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Envelope<S> {
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(rename = "kind")]
    _kind: String,
    metadata: Metadata,
    spec: S,
}

/// Everything the files held, validated.
#[derive(Debug, Clone)]
pub struct Bundle {
    /// The catalogue, with the cluster's overrides when a cluster was given.
    pub catalog: Catalog,
    /// The cluster, if a `Cluster` document was given.
    pub cluster: Option<Cluster>,
    /// The model policies as written (the custom-resource form).
    pub policies: Vec<ModelPolicy>,
    /// The validated models, in the order of `policies`.
    pub models: Vec<Model>,
    /// The validated training jobs.
    pub jobs: Vec<TrainingJob>,
    /// The training queue (partitions, fair share), if a `TrainingQueue`
    /// document was given.
    pub queue: Option<TrainingQueueSpec>,
    /// Wanted replicas per model policy name, if a `Demand` document was given.
    pub demand: Option<BTreeMap<String, u32>>,
    /// Files holding a `kind: Gateway` document: read and checked by the
    /// gateway's own loader, not here.
    pub gateways: Vec<PathBuf>,
    /// Files holding a `kind: Autoscaler` document (the autoscaler's
    /// loader checks them).
    pub autoscalers: Vec<PathBuf>,
    /// Files holding a `kind: Scenario` document (the simulator's loader
    /// checks them).
    pub scenarios: Vec<PathBuf>,
}

/// A `kind: Demand` spec: the replica count wanted per model policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DemandSpec {
    /// Model policy name → replicas.
    pub replicas: BTreeMap<String, u32>,
}

/// Every problem found, sorted by file and position.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct Problems(pub Vec<Problem>);

/// Lists the files a path names: the file itself, or the YAML and JSON files
/// under a directory, recursively, in name order.
pub fn files_under(path: &Path) -> Result<Vec<PathBuf>, Problem> {
    let io = |e: std::io::Error, p: &Path| Problem {
        file: p.to_path_buf(),
        position: document::Position { line: 1, column: 1 },
        path: String::new(),
        message: format!("cannot read: {e}"),
    };
    let meta = std::fs::metadata(path).map_err(|e| io(e, path))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    // Each directory once, however many links lead to it: two links to
    // `.` in a directory made the walk double at every level.
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    walk(path, &mut seen, &mut out).map_err(|(e, p)| io(e, &p))?;
    Ok(out)
}

/// The files of [`files_under`] below `dir`, each directory (by its
/// canonical path) walked once.
fn walk(
    dir: &Path,
    seen: &mut std::collections::BTreeSet<PathBuf>,
    out: &mut Vec<PathBuf>,
) -> Result<(), (std::io::Error, PathBuf)> {
    let canonical = std::fs::canonicalize(dir).map_err(|e| (e, dir.to_path_buf()))?;
    if !seen.insert(canonical) {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| (e, dir.to_path_buf()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, seen, out)?;
        } else if matches!(
            p.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            out.push(p);
        }
    }
    Ok(())
}

/// Reads at most `limit` bytes of `file`: a regular file or a pipe; a
/// device (`/dev/zero`, `/dev/urandom`: endless) or a directory is refused,
/// and a file that turns out longer than `limit` while it is read (a
/// pipe, or one still growing) is refused when the limit is passed, not
/// after it has filled memory. The error is the message only.
pub fn read_limited(file: &Path, limit: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(file).map_err(|e| format!("cannot read: {e}"))?;
    let meta = f.metadata().map_err(|e| format!("cannot read: {e}"))?;
    #[cfg(unix)]
    let pipe = std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type());
    #[cfg(not(unix))]
    let pipe = false;
    if !meta.is_file() && !pipe {
        return Err("cannot read: not a regular file".into());
    }
    if meta.len() > limit {
        return Err(format!(
            "file is {} bytes; the limit is {limit}",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!("file is more than {limit} bytes, the limit"));
    }
    Ok(bytes)
}

/// Reads a text file (at most [`MAX_FILE_BYTES`], UTF-8), errors located at
/// line 1 of the file (a byte that is not UTF-8 at its own line and
/// column).
pub fn read(file: &Path) -> Result<String, Problem> {
    let problem = |message: String| Problem {
        file: file.to_path_buf(),
        position: document::Position { line: 1, column: 1 },
        path: String::new(),
        message,
    };
    let bytes = read_limited(file, MAX_FILE_BYTES).map_err(problem)?;
    String::from_utf8(bytes).map_err(|e| {
        // Located at the bad byte: its line, and its column in
        // characters (the text before it on that line is valid).
        let at = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..at];
        let line_start = before
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |i| i + 1);
        let column = String::from_utf8_lossy(&before[line_start..])
            .chars()
            .count()
            + 1;
        Problem {
            position: document::Position {
                line: before.iter().filter(|&&b| b == b'\n').count() + 1,
                column,
            },
            ..problem(format!(
                "not UTF-8 text (invalid byte 0x{:02x} at offset {at})",
                e.as_bytes()[at]
            ))
        }
    })
}

/// Deserialises a document's value into `T`, locating every error serde
/// can name: serde stops at the first, so each unknown field, and each
/// field whose value does not read, is taken out and the rest read again
/// (a field taken out that the type requires ends the search).
pub fn typed<T: DeserializeOwned>(doc: &Document) -> Result<T, Problems> {
    let mut value = doc.value.clone();
    let mut problems: Vec<Problem> = Vec::new();
    // Paths of the fields taken out for their values.
    let mut taken: Vec<String> = Vec::new();
    // At most this many problems are listed; a document of nothing but
    // mistakes needs no more to be rewritten.
    for _ in 0..64 {
        let e = match serde_path_to_error::deserialize::<_, T>(&value) {
            Ok(t) if problems.is_empty() => return Ok(t),
            Ok(_) => break,
            Err(e) => e,
        };
        let problem = one_problem(doc, &e);
        let message = e.inner().to_string();
        let unknown = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split('`').next().map(str::to_string));
        let parent = |p: &Problem| p.path.rsplit_once('.').map_or("", |(a, _)| a).to_string();
        // A field missing beside one taken out as unknown is most often
        // that one misspelt (`maxConcurency`): said once, as unknown.
        if message.starts_with("missing field `")
            && problems
                .iter()
                .any(|p| p.message.starts_with("unknown field `") && parent(p) == parent(&problem))
        {
            break;
        }
        // A required field taken out for its value is missing now: said
        // already.
        if message.starts_with("missing field `") && taken.contains(&problem.path) {
            break;
        }
        let path = problem.path.clone();
        problems.push(problem);
        if message.starts_with("missing field `") {
            break;
        }
        // Take the key out where serde found it, and read again.
        let field = match unknown {
            Some(field) => field,
            None => match e.path().iter().next_back() {
                Some(serde_path_to_error::Segment::Map { key }) => {
                    taken.push(path);
                    key.clone()
                }
                _ => break,
            },
        };
        let mut at = Some(&mut value);
        // (serde_path_to_error's path may end at the field itself.)
        let mut segments: Vec<&serde_path_to_error::Segment> = e.path().iter().collect();
        if matches!(segments.last(), Some(serde_path_to_error::Segment::Map { key }) if *key == field)
        {
            segments.pop();
        }
        for segment in segments {
            at = at.and_then(|v| match segment {
                serde_path_to_error::Segment::Map { key } => v.get_mut(key.as_str()),
                serde_path_to_error::Segment::Seq { index } => v.get_mut(*index),
                _ => None,
            });
        }
        let removed = at
            .and_then(|v| v.as_object_mut())
            .and_then(|o| o.remove(&field))
            .is_some();
        if !removed {
            break;
        }
    }
    Err(Problems(problems))
}

/// serde's error at its place in `doc`.
fn one_problem(doc: &Document, e: &serde_path_to_error::Error<serde_json::Error>) -> Problem {
    let mut path = e.path().to_string();
    if path == "." {
        path.clear();
    }
    let message = plain_words(e.inner().to_string());
    // serde reports an unknown or a missing field at its parent; name
    // the field (a missing one is then located at its parent).
    if let Some(rest) = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("missing field `"))
        && let Some(field) = rest.split('`').next()
        && !path.ends_with(field)
    {
        path = if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
    }
    doc.problem(path, message)
}

impl From<Problem> for Problems {
    fn from(p: Problem) -> Self {
        Problems(vec![p])
    }
}

/// serde's message about a value said in the field's terms: numbers
/// that are not finite, and counts out of range, fractional or not
/// numbers at all, with the range the field takes.
pub fn plain_words(message: String) -> String {
    whole_number(not_finite(message))
}

/// `.nan`, `.inf` and `1e400` reach the typed layer as text (JSON has
/// no such numbers), so serde calls them strings; say what they are.
fn not_finite(message: String) -> String {
    let text = message
        .strip_prefix("invalid type: string \"")
        .and_then(|rest| rest.split_once('"'))
        .map(|(text, _)| text);
    match text {
        Some(text)
            if matches!(yaml_rust2::Yaml::from_str(text), yaml_rust2::Yaml::Real(_))
                && !text.parse::<f64>().is_ok_and(f64::is_finite) =>
        {
            format!("`{text}` is not a finite number")
        }
        _ => message,
    }
}

/// serde's words for a number where a whole number of a range belongs
/// (`invalid type: floating point `1e+20`, expected u32`: a count too
/// large for 64-bit integers reaches the typed layer as a float), said in
/// the field's terms.
fn whole_number(message: String) -> String {
    let range = |ty: &str| -> Option<(i128, i128)> {
        Some(match ty {
            "u8" => (0, u8::MAX.into()),
            "u16" => (0, u16::MAX.into()),
            "u32" => (0, u32::MAX.into()),
            "u64" => (0, u64::MAX.into()),
            "usize" => (0, usize::MAX as i128),
            "i32" => (i32::MIN.into(), i32::MAX.into()),
            "i64" => (i64::MIN.into(), i64::MAX.into()),
            _ => return None,
        })
    };
    let parsed = message
        .strip_prefix("invalid type: floating point `")
        .map(|rest| (rest, true))
        .or_else(|| {
            message
                .strip_prefix("invalid value: integer `")
                .map(|rest| (rest, false))
        })
        .and_then(|(rest, float)| {
            let (number, rest) = rest.split_once('`')?;
            let ty = rest.strip_prefix(", expected ")?;
            Some((number, float, range(ty)?))
        });
    let Some((number, float, (min, max))) = parsed else {
        // Text or a boolean where a count belongs (`workers: two`).
        let text = message
            .strip_prefix("invalid type: string \"")
            .and_then(|rest| rest.rsplit_once("\", expected "))
            .or_else(|| {
                message
                    .strip_prefix("invalid type: boolean `")
                    .and_then(|rest| rest.rsplit_once("`, expected "))
            });
        let expected = |ty: &str| match (range(ty), ty) {
            (Some((min, max)), _) => Some(format!("expected a whole number from {min} to {max}")),
            (None, "f32" | "f64") => Some("expected a number".to_string()),
            _ => None,
        };
        if let Some((text, ty)) = text
            && let Some(expected) = expected(ty)
        {
            // A number in quotes (`"0.2"`) is text to YAML and JSON.
            if message.starts_with("invalid type: string") && text.trim().parse::<f64>().is_ok() {
                return format!(
                    "`\"{}\"` is quoted text: {expected}, written without quotes",
                    crate::model::shown(text)
                );
            }
            return format!(
                "`{}` is not a number: {expected}",
                crate::model::shown(text)
            );
        }
        // A key left without a value (`workers:`).
        if let Some(expected) = message
            .strip_prefix("invalid type: null, expected ")
            .and_then(expected)
        {
            return format!("no value given: {expected}");
        }
        return message;
    };
    let value = number.parse::<f64>().ok().filter(|n| n.is_finite());
    let what = match value {
        // Whole but past what the field holds (`1e+20`: past 64 bits, so
        // read as a float), or a negative count.
        Some(n) if n.fract() == 0.0 && (n < min as f64 || n > max as f64) => "is out of range",
        // Whole and in range, but a float in the document (`8.0`).
        Some(n) if float && n.fract() == 0.0 => "is not written as a whole number",
        _ if float => "is not a whole number",
        _ => "is out of range",
    };
    format!("`{number}` {what}: expected a whole number from {min} to {max}")
}

/// Why `ns` is not a Kubernetes namespace, if it is not: a DNS-1123
/// label (lowercase letters, digits and '-', alphanumeric at both ends,
/// at most 63 characters).
pub fn namespace_problem(ns: &str) -> Option<String> {
    let b = ns.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
    (!ok).then(|| {
        format!(
            "`{}` is not a namespace: lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters",
            crate::model::shown(ns)
        )
    })
}

/// Why `q` is not a Kubernetes resource quantity the API server takes for
/// a container's limits or requests, if it is not: the grammar of
/// apimachinery's `resource.Quantity` (a number with an optional sign,
/// then a binary suffix `Ki`…`Ei`, a decimal one `n`, `u`, `m`, `k`,
/// `M`…`E`, or an exponent `e`/`E` with a signed integer), and not
/// negative, as pod validation requires of resources. (A sign or a point
/// alone, which the parser reads as 0, is refused: no one means that.)
pub fn quantity_problem(q: &str) -> Option<String> {
    let bad = || {
        Some(format!(
            "`{}` is not a Kubernetes quantity (a number with a suffix such as `500m`, `12Gi`, `1e3`)",
            crate::model::shown(q)
        ))
    };
    let b = q.as_bytes();
    let mut i = 0;
    let negative = b.first() == Some(&b'-');
    if matches!(b.first(), Some(b'+' | b'-')) {
        i = 1;
    }
    let int = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    i += int;
    let mut frac = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        frac = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
        i += frac;
    }
    if int + frac == 0 {
        return bad();
    }
    let suffix = &q[i..];
    let ok = match suffix {
        "" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E" => true,
        "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" => true,
        _ => {
            let rest = suffix.strip_prefix(['e', 'E']);
            rest.is_some_and(|r| {
                let r = r.strip_prefix(['+', '-']).unwrap_or(r);
                !r.is_empty() && r.bytes().all(|c| c.is_ascii_digit())
            })
        }
    };
    if !ok {
        return bad();
    }
    let zero = b[..i]
        .iter()
        .all(|c| matches!(c, b'0' | b'.' | b'+' | b'-'));
    if negative && !zero {
        return Some(format!(
            "`{}` is negative; a resource quantity is at least 0",
            crate::model::shown(q)
        ));
    }
    None
}

/// The value of a quantity [`quantity_problem`] accepts (`2000m` is 2,
/// `1Ki` 1,024, `2e0` 2), as a float; `None` for one it refuses.
pub fn quantity_value(q: &str) -> Option<f64> {
    if quantity_problem(q).is_some() {
        return None;
    }
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '+' | '-' | '.')))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number: f64 = match number {
        "" | "+" | "-" | "." => 0.0,
        n => n.parse().ok()?,
    };
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e => 10f64.powf(e[1..].parse::<f64>().ok()?),
    };
    Some(number * scale)
}

/// Why `name` is not a Kubernetes object name (a DNS-1123 subdomain), if
/// it is not.
pub fn name_problem(name: &str) -> Option<String> {
    check_name(name)
}

/// Kubernetes names: a DNS-1123 subdomain.
pub(crate) fn check_name(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        // A DNS-1123 subdomain: each dot-separated label starts and ends
        // with a letter or digit (`a..b` and `a.-b` are refused by the API
        // server, and so would every object emitted under such a name).
        && name.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty() && b[0].is_ascii_alphanumeric() && b[b.len() - 1].is_ascii_alphanumeric()
        });
    (!ok).then(|| {
        format!(
            "`{name}` is not a valid name: lowercase letters, digits, '-' and '.', \
             each part between dots starting and ending with a letter or digit, \
             at most 253 characters"
        )
    })
}

/// The path of the first key of `raw` that `kept` (the same value after
/// a typed round trip) lacks, in document order; keys set to `null` are
/// no field, as the API server reads them.
fn first_dropped(raw: &Value, kept: &Value, path: String) -> Option<String> {
    match (raw, kept) {
        (Value::Object(r), Value::Object(k)) => r.iter().find_map(|(key, v)| {
            let at = format!("{path}.{key}");
            match k.get(key) {
                None if !v.is_null() => Some(at),
                None => None,
                Some(kv) => first_dropped(v, kv, at),
            }
        }),
        (Value::Array(r), Value::Array(k)) => r
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(i, (v, kv))| first_dropped(v, kv, format!("{path}[{i}]"))),
        _ => None,
    }
}

enum Parsed {
    Policy(Box<ModelPolicy>),
    /// A training job: its name, namespace and spec.
    Job(String, Option<String>, TrainingJobSpec),
    Cluster(String, ClusterSpec),
    Demand(DemandSpec),
    Queue(TrainingQueueSpec),
    /// A kind another command reads (`Gateway`, `Autoscaler`,
    /// `Scenario`): its file is listed in the bundle for that command's own
    /// validation.
    Gateway,
    Autoscaler,
    Scenario,
}

fn parse_document(doc: &Document) -> Result<Parsed, Problems> {
    let api = doc.value.get("apiVersion");
    match api.and_then(|v| v.as_str()) {
        Some(API_VERSION) => {}
        Some(other) => {
            return Err(Problems::from(doc.problem(
                "apiVersion",
                format!("unsupported apiVersion `{other}`; expected `{API_VERSION}`"),
            )));
        }
        None if doc.value.is_object() => {
            return Err(Problems::from(doc.problem(
                "apiVersion",
                format!("missing field `apiVersion` (expected `{API_VERSION}`)"),
            )));
        }
        None => {
            return Err(Problems::from(doc.problem(
                "",
                "expected a mapping with apiVersion, kind, metadata and spec",
            )));
        }
    }
    let named = |m: &Metadata| match check_name(&m.name) {
        Some(msg) => Err(doc.problem("metadata.name", msg)),
        None => match m.namespace.as_deref().and_then(namespace_problem) {
            Some(msg) => Err(doc.problem("metadata.namespace", msg)),
            None => Ok(()),
        },
    };
    // A name that labels pods is a label value: at most 63 characters.
    let labels_pods = |m: &Metadata, what: &str| {
        if m.name.len() > 63 {
            Err(doc.problem(
                "metadata.name",
                format!(
                    "{what}, and a label value has at most 63 characters; this one has {}",
                    m.name.len()
                ),
            ))
        } else {
            Ok(())
        }
    };
    match doc.kind() {
        Some("ModelPolicy") => {
            let env: Envelope<ModelPolicySpec> = typed(doc)?;
            named(&env.metadata)?;
            // The name labels every pod of the model (`gpuscale.io/model`,
            // `app.kubernetes.io/name`).
            labels_pods(&env.metadata, "a ModelPolicy's name labels its pods")?;
            let mut p = ModelPolicy::new(&env.metadata.name, env.spec);
            p.metadata.namespace = env.metadata.namespace;
            p.metadata.labels = (!env.metadata.labels.is_empty()).then_some(env.metadata.labels);
            p.metadata.annotations =
                (!env.metadata.annotations.is_empty()).then_some(env.metadata.annotations);
            Ok(Parsed::Policy(Box::new(p)))
        }
        Some("TrainingJob") => {
            let env: Envelope<TrainingJobSpec> = typed(doc)?;
            named(&env.metadata)?;
            // Kubernetes' types (k8s-openapi) skip fields they do not
            // know, so a misspelt key in the worker template would vanish
            // from the emitted pods; kubectl's strict field validation
            // refuses it by name, and so does this.
            if let (Some(raw), Some(t)) = (doc.value.pointer("/spec/template"), &env.spec.template)
                && let Ok(kept) = serde_json::to_value(t)
                && let Some(path) = first_dropped(raw, &kept, "spec.template".into())
            {
                let key = path.rsplit('.').next().unwrap_or(&path).to_string();
                return Err(Problems::from(doc.problem(
                    path,
                    format!(
                        "unknown field `{key}`: Kubernetes' PodTemplateSpec (API 1.33) has no such \
                         field here, and kubectl's strict field validation would refuse it"
                    ),
                )));
            }
            // The name is a label value on every worker
            // (`gpuscale.io/training-job`, the PodGroup's label).
            labels_pods(&env.metadata, "a TrainingJob's name labels its worker pods")?;
            Ok(Parsed::Job(
                env.metadata.name,
                env.metadata.namespace,
                env.spec,
            ))
        }
        Some("Cluster") => {
            let env: Envelope<ClusterSpec> = typed(doc)?;
            named(&env.metadata)?;
            Ok(Parsed::Cluster(env.metadata.name, env.spec))
        }
        Some("Demand") => {
            let env: Envelope<DemandSpec> = typed(doc)?;
            named(&env.metadata)?;
            Ok(Parsed::Demand(env.spec))
        }
        Some("TrainingQueue") => {
            let env: Envelope<TrainingQueueSpec> = typed(doc)?;
            named(&env.metadata)?;
            Ok(Parsed::Queue(env.spec))
        }
        Some("Gateway") => Ok(Parsed::Gateway),
        Some("Autoscaler") => Ok(Parsed::Autoscaler),
        Some("Scenario") => Ok(Parsed::Scenario),
        Some(other) => Err(Problems::from(doc.problem(
            "kind",
            format!(
                "unknown kind `{other}`; expected ModelPolicy, TrainingJob, TrainingQueue, Cluster, Demand, Gateway, Autoscaler or Scenario"
            ),
        ))),
        None => Err(Problems::from(doc.problem(
            "kind",
            "missing field `kind` (ModelPolicy, TrainingJob, TrainingQueue, Cluster, Demand, Gateway, Autoscaler or Scenario)",
        ))),
    }
}

fn located(doc: &Document, errors: Vec<FieldError>) -> impl Iterator<Item = Problem> + '_ {
    errors.into_iter().map(|e| doc.problem(e.path, e.message))
}

/// Loads and validates files and directories.
pub fn load_paths<P: AsRef<Path>>(paths: &[P]) -> Result<Bundle, Problems> {
    let mut problems = Vec::new();
    let mut sources = Vec::new();
    // A file named twice (directly and through its directory) is read once:
    // whether it holds a document, by its canonical path.
    let mut seen: BTreeMap<PathBuf, bool> = BTreeMap::new();
    for p in paths {
        let p = p.as_ref();
        let mut documents = false;
        let mut unread = false;
        match files_under(p) {
            Ok(files) => {
                for f in files {
                    let canonical = std::fs::canonicalize(&f).unwrap_or_else(|_| f.clone());
                    if let Some(&held) = seen.get(&canonical) {
                        documents |= held;
                        continue;
                    }
                    match read(&f) {
                        Ok(text) => {
                            // An empty file, or one of comments and `---`
                            // alone (a syntax error is reported below).
                            let held = !document::parse(&f, &text).is_ok_and(|d| d.is_empty());
                            seen.insert(canonical, held);
                            documents |= held;
                            sources.push((f, text));
                        }
                        Err(e) => {
                            seen.insert(canonical, true);
                            unread = true;
                            problems.push(e);
                        }
                    }
                }
            }
            Err(e) => {
                unread = true;
                problems.push(e);
            }
        }
        // A path given that holds nothing is a mistake (a wrong folder, a
        // file truncated), not an empty set of jobs or policies.
        if !documents && !unread {
            problems.push(Problem {
                file: p.to_path_buf(),
                position: document::Position { line: 1, column: 1 },
                path: "apiVersion".into(),
                message: format!(
                    "no gpuscale document (apiVersion {API_VERSION}) {}",
                    if p.is_dir() {
                        "in any YAML or JSON file under this directory"
                    } else {
                        "in this file"
                    }
                ),
            });
        }
    }
    let refs: Vec<(&Path, &str)> = sources
        .iter()
        .map(|(f, t)| (f.as_path(), t.as_str()))
        .collect();
    // A file that could not be read may hold the policies the others name:
    // names unknown then are its follow-ons, not problems of their own.
    let complete = problems.is_empty();
    match load(&refs, complete) {
        Ok(bundle) if problems.is_empty() => Ok(bundle),
        Ok(_) => Err(Problems(problems)),
        Err(Problems(more)) => {
            problems.extend(more);
            problems.sort();
            Err(Problems(problems))
        }
    }
}

/// Loads and validates in-memory sources (file name, text).
pub fn load_sources(sources: &[(&Path, &str)]) -> Result<Bundle, Problems> {
    load(sources, true)
}

/// [`load_sources`]; `complete`: every file given was read, so a name
/// none of them defines is a problem (otherwise it may be in the unread
/// one, whose own problem says why).
fn load(sources: &[(&Path, &str)], complete: bool) -> Result<Bundle, Problems> {
    let mut problems = Vec::new();
    let mut parsed: Vec<(Document, Parsed)> = Vec::new();
    // A TrainingQueue given, even one with problems of its own (reported
    // there): jobs naming its partitions are not told that none was given.
    let mut queue_given = false;
    // Policies given whose own problems are said already (here, or when
    // validated below): a Demand naming one is not said to name no
    // policy, nor that none was given.
    let mut refused: BTreeSet<String> = BTreeSet::new();
    let mut policy_refused = false;
    for (file, text) in sources {
        match document::parse(file, text) {
            Ok(docs) => {
                for doc in docs {
                    queue_given |= doc.value["kind"].as_str() == Some("TrainingQueue");
                    match parse_document(&doc) {
                        Ok(p) => parsed.push((doc, p)),
                        Err(e) => {
                            if doc.value["kind"].as_str() == Some("ModelPolicy") {
                                policy_refused = true;
                                if let Some(name) = doc.value["metadata"]["name"].as_str() {
                                    refused.insert(name.to_string());
                                }
                            }
                            problems.extend(e.0);
                        }
                    }
                }
            }
            Err(e) => problems.push(e),
        }
    }

    // The cluster first: its catalogue overrides apply to everything else.
    let builtin = Catalog::builtin();
    let mut cluster: Option<(Document, Cluster)> = None;
    for (doc, p) in &parsed {
        if let Parsed::Cluster(name, spec) = p {
            if let Some((first, _)) = &cluster {
                problems.push(doc.problem(
                    "kind",
                    format!(
                        "a second Cluster; the first is in {}:{} (the files given are one set, \
                         with one Cluster: check each cluster's files on their own)",
                        first.file.display(),
                        first.start.line
                    ),
                ));
                continue;
            }
            match Cluster::from_spec(name, spec, &builtin) {
                Ok(c) => cluster = Some((doc.clone(), c)),
                Err(errors) => problems.extend(located(doc, errors)),
            }
        }
    }
    let catalog = cluster
        .as_ref()
        .map(|(_, c)| c.catalog.clone())
        .unwrap_or(builtin);

    // The training queue: at most one.
    let mut queue: Option<TrainingQueueSpec> = None;
    for (doc, p) in &parsed {
        let Parsed::Queue(spec) = p else { continue };
        if queue.is_some() {
            problems.push(doc.problem("kind", "a second TrainingQueue document; give one"));
            continue;
        }
        let mut errors = spec.validate(&catalog);
        if let Some((_, c)) = &cluster {
            for (i, part) in spec.partitions.iter().enumerate() {
                for (k, node) in part.nodes.iter().enumerate() {
                    if !c.nodes.iter().any(|n| &n.name == node) {
                        errors.push(FieldError::new(
                            format!("spec.partitions[{i}].nodes[{k}]"),
                            format!("cluster `{}` has no node `{node}`", c.name),
                        ));
                    }
                }
                for (k, model) in part.gpu_models.iter().enumerate() {
                    // (A model the catalogue does not know is that problem
                    // alone, said by `validate` above.)
                    if catalog.get(model).is_some()
                        && !c.nodes.iter().any(|n| &n.gpu_model == model)
                    {
                        errors.push(FieldError::new(
                            format!("spec.partitions[{i}].gpuModels[{k}]"),
                            format!("cluster `{}` has no node of GPU model {model}", c.name),
                        ));
                    }
                }
            }
        }
        if errors.is_empty() {
            queue = Some(spec.clone());
        } else {
            problems.extend(located(doc, errors));
        }
    }

    let mut policies = Vec::new();
    let mut models = Vec::new();
    let mut jobs = Vec::new();
    let mut names: BTreeMap<String, (PathBuf, usize)> = BTreeMap::new();
    // Served names and adapters: policy, file, line of the first claim.
    let mut served: BTreeMap<String, (String, PathBuf, usize)> = BTreeMap::new();
    for (doc, p) in &parsed {
        let name = match p {
            Parsed::Policy(mp) => mp.metadata.name.clone().unwrap_or_default(),
            Parsed::Job(n, _, _) => n.clone(),
            Parsed::Cluster(..)
            | Parsed::Demand(..)
            | Parsed::Queue(..)
            | Parsed::Gateway
            | Parsed::Autoscaler
            | Parsed::Scenario => {
                continue;
            }
        };
        if let Some((file, line)) = names.get(&name) {
            problems.push(doc.problem(
                "metadata.name",
                format!(
                    "`{name}` is defined twice; the first is in {}:{line}",
                    file.display()
                ),
            ));
            continue;
        }
        names.insert(
            name.clone(),
            (doc.file.clone(), doc.position_of("metadata.name").line),
        );
        match p {
            Parsed::Policy(mp) => match Model::from_policy(mp, &catalog) {
                Ok(m) => {
                    if let Some((_, c)) = &cluster {
                        problems.extend(check_model_fits_cluster(doc, &m, &catalog, c));
                    }
                    for (field, n) in m.served_names() {
                        if let Some((other, file, line)) = served.get(n) {
                            problems.push(doc.problem(
                                field.as_str(),
                                format!(
                                    "`{n}` is already served by ModelPolicy `{other}` ({}:{line}): the gateway routes by name, so two policies would share one model's requests",
                                    file.display()
                                ),
                            ));
                        } else {
                            served.insert(
                                n.to_string(),
                                (
                                    m.name.clone(),
                                    doc.file.clone(),
                                    doc.position_of(&field).line,
                                ),
                            );
                        }
                    }
                    policies.push((**mp).clone());
                    models.push(m);
                }
                Err(errors) => {
                    policy_refused = true;
                    refused.insert(name.clone());
                    problems.extend(located(doc, errors));
                }
            },
            Parsed::Job(name, namespace, spec) => {
                match TrainingJob::from_spec(name, spec, &catalog) {
                    Ok(mut j) => {
                        j.namespace = namespace.clone();
                        if let Some((_, c)) = &cluster {
                            problems.extend(check_node_rules(doc, &j, c));
                            problems.extend(check_job_fits_cluster(doc, &j, c, queue.as_ref()));
                        }
                        if let Some(q) = &queue {
                            problems.extend(located(doc, q.check_job(&j)));
                        } else if let Some(name) = &j.spec.partition
                            && !queue_given
                        {
                            problems.push(doc.problem(
                            "spec.partition",
                            format!("partition `{name}` named, but no TrainingQueue document was given"),
                        ));
                        }
                        jobs.push(j);
                    }
                    Err(errors) => problems.extend(located(doc, errors)),
                }
            }
            Parsed::Cluster(..)
            | Parsed::Demand(..)
            | Parsed::Queue(..)
            | Parsed::Gateway
            | Parsed::Autoscaler
            | Parsed::Scenario => {}
        }
    }

    let mut gateways: Vec<PathBuf> = parsed
        .iter()
        .filter(|(_, p)| matches!(p, Parsed::Gateway))
        .map(|(doc, _)| doc.file.clone())
        .collect();
    gateways.dedup();
    let mut autoscalers: Vec<PathBuf> = parsed
        .iter()
        .filter(|(_, p)| matches!(p, Parsed::Autoscaler))
        .map(|(doc, _)| doc.file.clone())
        .collect();
    autoscalers.dedup();
    let mut scenarios: Vec<PathBuf> = parsed
        .iter()
        .filter(|(_, p)| matches!(p, Parsed::Scenario))
        .map(|(doc, _)| doc.file.clone())
        .collect();
    scenarios.dedup();

    // Demand: at most one document; every name a loaded model policy.
    let mut demand: Option<BTreeMap<String, u32>> = None;
    for (doc, p) in &parsed {
        let Parsed::Demand(spec) = p else { continue };
        if demand.is_some() {
            problems.push(doc.problem("kind", "a second Demand document; give one"));
            continue;
        }
        for (name, &count) in &spec.replicas {
            let Some(m) = models.iter().find(|m| &m.name == name) else {
                if !complete || refused.contains(name) {
                    continue;
                }
                problems.push(doc.problem(
                    format!("spec.replicas.{name}"),
                    if models.is_empty() && !policy_refused {
                        format!(
                            "no ModelPolicy named `{name}`: none was given with this Demand \
                             (give the policies' files or folder too, e.g. `gpuscale validate \
                             examples/`)"
                        )
                    } else {
                        format!("no ModelPolicy named `{name}` among the policies given")
                    },
                ));
                continue;
            };
            // The autoscaler never asks outside the policy's bounds; a
            // hand-written count outside them is a mistake, not a plan.
            let (min, max) = (m.scaling.min_replicas, m.scaling.max_replicas);
            if count > max {
                problems.push(doc.problem(
                    format!("spec.replicas.{name}"),
                    format!("{count} is above the ModelPolicy's maxReplicas {max}"),
                ));
            } else if count < min {
                problems.push(doc.problem(
                    format!("spec.replicas.{name}"),
                    format!("{count} is below the ModelPolicy's minReplicas {min}"),
                ));
            }
        }
        demand = Some(spec.replicas.clone());
    }

    // Workloads must name a loaded policy or job — when any were loaded
    // (a cluster file alone is checked on its own).
    if let Some((doc, _)) = &cluster
        && !names.is_empty()
    {
        if complete {
            problems.extend(unknown_workloads(doc, &names, &refused));
        }
        let job_names: BTreeSet<&str> = parsed
            .iter()
            .filter_map(|(_, p)| match p {
                Parsed::Job(n, _, _) => Some(n.as_str()),
                _ => None,
            })
            .collect();
        problems.extend(shared_job_gpus(doc, &job_names));
    }
    // What runs must fit where it runs: the file states what the GPUs
    // hold now, and a state no GPU could hold (more replicas than shares,
    // a replica larger than its MIG instance or its HAMi GPU) is a
    // mistake in the file, not something to plan from.
    if let Some((doc, c)) = &cluster {
        problems.extend(overfull_gpus(doc, c, &models));
    }

    if problems.is_empty() {
        Ok(Bundle {
            catalog,
            cluster: cluster.map(|(_, c)| c),
            policies,
            models,
            jobs,
            queue,
            demand,
            gateways,
            autoscalers,
            scenarios,
        })
    } else {
        problems.sort();
        problems.dedup();
        Err(Problems(problems))
    }
}

/// One workload as the cluster document writes it: where (node, GPU and
/// workload indices), on which GPU, the node's name, the name it runs,
/// and how many workloads its GPU runs.
struct WrittenWorkload {
    at: String,
    gpu: serde_json::Value,
    node: String,
    name: String,
    on_gpu: usize,
    /// The GPU's `mode` as written (none: the default, `free`).
    mode: Option<String>,
    /// The MIG instance's start slot, as written.
    slot: Option<u64>,
}

/// Every workload of the cluster document, in order, located at its
/// `model` field.
fn written_workloads(doc: &Document) -> Vec<WrittenWorkload> {
    let mut out = Vec::new();
    let nodes = doc.value["spec"]["nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for (i, node) in nodes.iter().enumerate() {
        let gpus = node["gpus"].as_array().cloned().unwrap_or_default();
        for (j, gpu) in gpus.iter().enumerate() {
            let workloads = gpu["workloads"].as_array().cloned().unwrap_or_default();
            for (k, w) in workloads.iter().enumerate() {
                out.push(WrittenWorkload {
                    at: format!("spec.nodes[{i}].gpus[{j}].workloads[{k}].model"),
                    gpu: gpu["index"].clone(),
                    node: node["name"].as_str().unwrap_or_default().to_string(),
                    name: w["model"].as_str().unwrap_or_default().to_string(),
                    on_gpu: workloads.len(),
                    mode: gpu["mode"].as_str().map(str::to_string),
                    slot: w["slot"].as_u64(),
                });
            }
        }
    }
    out
}

/// Workloads in the cluster document that name no loaded policy or job,
/// located at their `model` field (not those of a policy refused for its
/// own problem, said already).
fn unknown_workloads(
    doc: &Document,
    known: &BTreeMap<String, (PathBuf, usize)>,
    refused: &BTreeSet<String>,
) -> Vec<Problem> {
    written_workloads(doc)
        .into_iter()
        .filter(|w| !known.contains_key(&w.name) && !refused.contains(&w.name))
        .map(|w| {
            doc.problem(
                w.at,
                format!(
                    "GPU {} of node `{}` runs `{}`, which no ModelPolicy or TrainingJob defines",
                    w.gpu, w.node, w.name
                ),
            )
        })
        .collect()
}

/// GPUs where a training job runs beside another workload, or on a GPU
/// configured for sharing (MIG, time-slicing, MPS, HAMi), located at the
/// job's `model` field: a gang's GPUs are whole, never shared with
/// inference or another job (a time-sliced GPU would hand out shares of
/// one), and a plan that kept the job would also wipe its MIG GPU.
fn shared_job_gpus(doc: &Document, jobs: &BTreeSet<&str>) -> Vec<Problem> {
    let workloads = written_workloads(doc);
    let shared_modes = workloads
        .iter()
        .filter(|w| w.on_gpu == 1 && jobs.contains(w.name.as_str()))
        .filter_map(|w| {
            let mode = w.mode.as_deref()?;
            (!matches!(mode, "whole" | "free")).then(|| {
                doc.problem(
                    w.at.clone(),
                    format!(
                        "GPU {} of node `{}` runs training job `{}` but its mode is `{mode}`; a gang's GPUs are whole (`mode: whole`), never MIG slices or shares",
                        w.gpu, w.node, w.name
                    ),
                )
            })
        })
        .collect::<Vec<_>>();
    let mut beside: Vec<Problem> = workloads
        .into_iter()
        .filter(|w| w.on_gpu > 1 && jobs.contains(w.name.as_str()))
        .map(|w| {
            let others = w.on_gpu - 1;
            doc.problem(
                w.at,
                format!(
                    "GPU {} of node `{}` runs training job `{}` beside {others} other workload{}; a gang's GPUs are whole, never shared",
                    w.gpu,
                    w.node,
                    w.name,
                    if others == 1 { "" } else { "s" }
                ),
            )
        })
        .collect();
    beside.extend(shared_modes);
    beside
}

/// Workloads of the cluster document their GPU could not hold, located
/// at the first workload past what it holds: beyond a time-sliced or MPS
/// GPU's shares, a replica over its MIG instance's usable memory (or a
/// time-sliced instance's shares), or replicas whose memory together is
/// over a fractional (HAMi) GPU's usable memory. Only models loaded and
/// without tensor parallelism are weighed (a sharded replica's memory per
/// GPU is the packer's to divide).
fn overfull_gpus(doc: &Document, c: &Cluster, models: &[Model]) -> Vec<Problem> {
    use crate::GpuMode;
    let mut out = Vec::new();
    let mut on_gpu: BTreeMap<(String, String), (usize, f64)> = BTreeMap::new();
    let mut on_slot: BTreeMap<(String, String, u8), usize> = BTreeMap::new();
    for w in written_workloads(doc) {
        let Some(node) = c.nodes.iter().find(|n| n.name == w.node) else {
            continue;
        };
        let Some(gpu) = w
            .gpu
            .as_u64()
            .and_then(|i| node.gpus.iter().find(|g| u64::from(g.index) == i))
        else {
            continue;
        };
        let Some(m) = models
            .iter()
            .find(|m| m.name == w.name && m.tensor_parallel.iter().all(|&k| k <= 1))
        else {
            continue;
        };
        let key = (w.node.clone(), w.gpu.to_string());
        let (count, memory) = on_gpu.entry(key).or_insert((0, 0.0));
        *count += 1;
        *memory += m.memory_gib;
        let spec = c.catalog.get(&node.gpu_model);
        let problem = match gpu.mode {
            GpuMode::Timeslice | GpuMode::Mps => {
                let (shares, what) = if gpu.mode == GpuMode::Timeslice {
                    (node.timeslice_replicas, "time-sliced shares (timesliceReplicas)")
                } else {
                    (node.mps_replicas, "MPS partitions (mpsReplicas)")
                };
                shares
                    .filter(|&n| *count > usize::from(n))
                    .map(|n| format!("GPU {} of node `{}` has {n} {what}; this is replica {count} on it", w.gpu, w.node))
            }
            GpuMode::Fractional
                if node
                    .hami_split_count
                    .is_some_and(|k| *count > usize::try_from(k).unwrap_or(usize::MAX)) =>
            {
                Some(format!(
                    "GPU {} of node `{}` takes at most {} replicas (hamiSplitCount); this is replica {count} on it",
                    w.gpu,
                    w.node,
                    node.hami_split_count.unwrap_or_default()
                ))
            }
            GpuMode::Fractional => spec.filter(|s| *memory > s.usable_gib + 1e-9).map(|s| {
                format!(
                    "the replicas on GPU {} of node `{}` need {memory:.1} GiB together with this one, over the {:.1} GiB a {} has",
                    w.gpu, w.node, s.usable_gib, node.gpu_model
                )
            }),
            GpuMode::Mig => {
                let profile = w.slot.and_then(|s| {
                    gpu.geometry
                        .placements()
                        .iter()
                        .find(|p| u64::from(p.start) == s)
                });
                match (profile, spec.and_then(|s| s.mig.as_ref())) {
                    (Some(p), Some(mig)) => {
                        let shares = match &node.mig_timeslice {
                            // (A `+me` instance is served, and time-sliced,
                            // as its plain profile.)
                            Some(t)
                                if crate::inventory::plain(&t.profile)
                                    == crate::inventory::plain(&p.profile) =>
                            {
                                usize::from(t.replicas)
                            }
                            _ => 1,
                        };
                        let n = on_slot
                            .entry((w.node.clone(), w.gpu.to_string(), p.start))
                            .or_insert(0);
                        *n += 1;
                        mig.profile(&p.profile).and_then(|prof| {
                            if m.memory_gib > prof.usable_gib + 1e-9 {
                                Some(format!(
                                    "`{}` needs {:.1} GiB, over the {:.2} GiB a {} instance has",
                                    m.name, m.memory_gib, prof.usable_gib, p.profile
                                ))
                            } else if *n > shares {
                                Some(format!(
                                    "the {} instance at slot {} of GPU {} of node `{}` has {shares} share{}; this is replica {n} on it",
                                    p.profile,
                                    p.start,
                                    w.gpu,
                                    w.node,
                                    if shares == 1 { "" } else { "s" }
                                ))
                            } else {
                                None
                            }
                        })
                    }
                    _ => None,
                }
            }
            GpuMode::Whole | GpuMode::Free => None,
        };
        if let Some(why) = problem {
            out.push(doc.problem(w.at, why));
        }
    }
    out
}

fn check_model_fits_cluster(
    doc: &Document,
    m: &Model,
    catalog: &Catalog,
    c: &Cluster,
) -> Option<Problem> {
    let options = m.options(catalog);
    let possible = options.iter().any(|o| match o {
        PlacementOption::Whole { gpus, .. } | PlacementOption::Fractional { gpus, .. } => {
            c.largest_node_allowing(o.gpu(), o.mode()) >= *gpus
        }
        _ => c.gpus_allowing(o.gpu(), o.mode()) > 0,
    });
    (!possible).then(|| {
        let described: Vec<String> = options.iter().map(PlacementOption::describe).collect();
        doc.problem(
            "spec.placement",
            format!(
                "`{}` can run on {}, but cluster `{}` has no such GPU or node (or no node allows that sharing: `spec.nodes[].sharing`)",
                m.name,
                described.join(", or "),
                c.name
            ),
        )
    })
}

/// Whether the job could ever run on the cluster, were it empty: enough
/// nodes of one of its GPU models, within its partition's nodes and GPU
/// models, within one domain of its required topology level. The first
/// of these that fails is the problem, at the field that causes it.
/// A worker template's node rules (`nodeSelector`, required node
/// affinity) name labels gpuscale knows on some node of the cluster (or
/// one every node carries): it places the workers by them, and by a label
/// it knows on no node it could not.
fn check_node_rules(doc: &Document, j: &TrainingJob, c: &Cluster) -> Vec<Problem> {
    let Some(t) = &j.spec.template else {
        return Vec::new();
    };
    let labels: Vec<BTreeMap<String, String>> =
        c.nodes.iter().map(|n| n.known_labels(&c.catalog)).collect();
    let known: BTreeSet<String> = labels.iter().flat_map(|l| l.keys().cloned()).collect();
    let rules = crate::training::NodeRules::of(t);
    let mut problems: Vec<Problem> = rules
        .all()
        .filter(|r| {
            r.key != "metadata.name"
                && !known.contains(&r.key)
                && !crate::training::EVERY_NODE_LABELS.contains(&r.key.as_str())
        })
        .map(|r| {
            doc.problem(
                &r.path,
                format!(
                    "no node of the cluster has the label `{}`: gpuscale places each worker on a node it knows to meet the template's node rules (the Cluster's node `labels`, zone, rack, nvlinkDomain, name and GPU product)",
                    crate::model::shown(&r.key)
                ),
            )
        })
        .collect();
    if problems.is_empty()
        && let Some(first) = rules.all().next()
        && !c
            .nodes
            .iter()
            .zip(&labels)
            .any(|(n, l)| j.gpu_models.contains(&n.gpu_model) && rules.admit(l, &n.name, &known))
    {
        problems.push(doc.problem(
            &first.path,
            format!(
                "no node of cluster `{}` with GPUs of [{}] meets the template's node rules (nodeSelector and required node affinity)",
                c.name,
                j.gpu_models.join(", ")
            ),
        ));
    }
    problems
}

fn check_job_fits_cluster(
    doc: &Document,
    j: &TrainingJob,
    c: &Cluster,
    queue: Option<&TrainingQueueSpec>,
) -> Option<Problem> {
    let per_worker = j.spec.gpus_per_worker.max(1);
    let partition = queue.and_then(|q| q.partition_of(j));
    // The most workers one domain holds, for each GPU model: nodes grouped
    // by their label at `level` (a node without one is a domain alone).
    let most = |level: TopologyLevel, in_partition: bool| -> u32 {
        let mut best = 0;
        for g in &j.gpu_models {
            let mut per: BTreeMap<String, u32> = BTreeMap::new();
            for n in c.nodes.iter().filter(|n| &n.gpu_model == g) {
                if in_partition
                    && let Some(p) = partition
                    && !((p.nodes.is_empty() || p.nodes.contains(&n.name))
                        && (p.gpu_models.is_empty() || p.gpu_models.contains(g)))
                {
                    continue;
                }
                let own = || format!("node:{}", n.name);
                // As gang placement groups nodes: PCIe GPUs with no
                // declared NVLink domain are in none.
                let key = match level {
                    TopologyLevel::Node => n.name.clone(),
                    TopologyLevel::NvlinkDomain => match &n.nvlink_domain {
                        Some(d) => d.clone(),
                        None if c.catalog.get(g).is_some_and(|m| m.nvlink) => own(),
                        None => continue,
                    },
                    TopologyLevel::Rack => n.rack.clone().unwrap_or_else(own),
                    TopologyLevel::Zone => n.zone.clone().unwrap_or_else(own),
                    TopologyLevel::Any => String::new(),
                };
                *per.entry(key).or_default() += n.gpus.len() as u32 / per_worker;
            }
            best = best.max(per.into_values().max().unwrap_or(0));
        }
        best
    };
    let needs = format!(
        "`{}` needs {} worker{} × {} GPUs of {}",
        j.name,
        j.spec.workers,
        if j.spec.workers == 1 { "" } else { "s" },
        per_worker,
        if j.spec.gpu_models.is_empty() {
            "one model".to_string()
        } else {
            format!("[{}]", j.gpu_models.join(", "))
        }
    );
    let workers = j.spec.workers;
    let nodes: Vec<_> = c
        .nodes
        .iter()
        .filter(|n| j.gpu_models.contains(&n.gpu_model))
        .collect();
    if nodes.is_empty() {
        return Some(doc.problem(
            if j.spec.gpu_models.is_empty() {
                "spec.workers"
            } else {
                "spec.gpuModels"
            },
            format!(
                "{needs}; cluster `{}` has no node of {}",
                c.name,
                if j.gpu_models.len() == 1 {
                    format!("GPU model {}", j.gpu_models[0])
                } else {
                    format!("GPU models [{}]", j.gpu_models.join(", "))
                }
            ),
        ));
    }
    let largest = nodes.iter().map(|n| n.gpus.len() as u32).max().unwrap_or(0);
    if largest < per_worker {
        return Some(doc.problem(
            "spec.gpusPerWorker",
            format!(
                "{needs}; a worker's GPUs are on one node, and the largest node of cluster `{}` with them has {largest}",
                c.name
            ),
        ));
    }
    if most(TopologyLevel::Any, false) < workers {
        return Some(doc.problem(
            "spec.workers",
            format!(
                "{needs}; cluster `{}` cannot hold that many even when empty",
                c.name
            ),
        ));
    }
    if let Some(p) = partition {
        let fit = most(TopologyLevel::Any, true);
        if fit < workers {
            return Some(doc.problem(
                if j.spec.partition.is_some() {
                    "spec.partition"
                } else {
                    "spec.workers"
                },
                format!(
                    "{needs}; partition `{}` (its nodes and GPU models) holds at most {fit} such worker{} even when empty",
                    p.name,
                    if fit == 1 { "" } else { "s" },
                ),
            ));
        }
    }
    let level = j.spec.topology.level;
    if j.spec.topology.mode == TopologyMode::Required && level != TopologyLevel::Any {
        let fit = most(level, true);
        if fit < workers {
            return Some(doc.problem(
                "spec.topology.level",
                format!(
                    "{needs} in one {level} (required); the largest {level} of cluster `{}`{} holds {fit} such worker{} even when empty: use a wider level, or `mode: preferred`",
                    c.name,
                    partition.map_or(String::new(), |p| format!(" in partition `{}`", p.name)),
                    if fit == 1 { "" } else { "s" },
                ),
            ));
        }
    }
    None
}
