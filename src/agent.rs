//! The node agent (`gpuscale agent`): one node's GPUs read through NVML
//! (nvml-wrapper, `libnvidia-ml.so.1` loaded at run time), served as JSON
//! (`/v1/gpus`, [`gpuscale_policies::devices::NodeGpus`]) for the
//! controller's inventory and as Prometheus metrics (`/metrics`) with
//! DCGM exporter's names where one exists.
//!
//! - [`read`] is the NVML shell: every call it makes, and nothing else;
//!   MIG placements come from `nvidia-smi mig -lgi` when it is there
//!   (NVML's safe bindings do not read them);
//! - [`metrics`] renders a reading, pure (tested on recorded readings);
//! - [`serve`] answers HTTP, reading NVML on the blocking pool with a
//!   deadline, at most once a second.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpuscale_policies::devices::{self, GpuReading, InstanceReading, NodeGpus};
use nvml_wrapper::Nvml;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Opens NVML: `libnvidia-ml.so.1` (what the NVIDIA container toolkit
/// mounts), else `libnvidia-ml.so`. The error says what is missing.
pub fn open() -> Result<Nvml, String> {
    let mut tried = Vec::new();
    for lib in ["libnvidia-ml.so.1", "libnvidia-ml.so"] {
        match Nvml::builder().lib_path(std::ffi::OsStr::new(lib)).init() {
            Ok(n) => return Ok(n),
            Err(e) => tried.push(format!("{lib}: {e}")),
        }
    }
    Err(format!(
        "NVML could not be loaded ({}): gpuscale agent reads GPUs through the NVIDIA driver's \
         libnvidia-ml.so.1; run it on a GPU node (in Kubernetes with the NVIDIA container \
         runtime), or give --fake FILE to serve a declared reading",
        tried.join("; ")
    ))
}

fn mib(bytes: u64) -> u64 {
    bytes / (1024 * 1024)
}

/// Reads every GPU of the node through `nvml`. A field a GPU does not
/// support is left out; a GPU that cannot be read at all is an error.
pub fn read(nvml: &Nvml, node: &str) -> Result<NodeGpus, String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("device count: {e}"))?;
    let lgi = nvidia_smi(&["mig", "-lgi"])
        .map(|t| devices::parse_lgi(&t))
        .unwrap_or_default();
    let mut gpus = Vec::new();
    for index in 0..count {
        let d = nvml
            .device_by_index(index)
            .map_err(|e| format!("GPU {index}: {e}"))?;
        let mem = d
            .memory_info()
            .map_err(|e| format!("GPU {index}: memory: {e}"))?;
        let mig = d.mig_mode().ok();
        let uuid = d.uuid().map_err(|e| format!("GPU {index}: uuid: {e}"))?;
        let mig_profiles = match &mig {
            Some(m) => profiles(&d, index, &uuid, m.current),
            None => Vec::new(),
        };
        let mut instances = Vec::new();
        if mig.as_ref().is_some_and(|m| m.current == 1) {
            let n = d.mig_device_count().unwrap_or(0);
            let mut placed: Vec<&(u32, String, u32, u8)> =
                lgi.iter().filter(|(g, ..)| *g == index).collect();
            for i in 0..n {
                let Ok(m) = d.mig_device_by_index(i) else {
                    continue;
                };
                let name = m.name().unwrap_or_default();
                let Some(profile) = devices::profile_of_name(&name) else {
                    continue;
                };
                let mem = m.memory_info().ok();
                // The placement of an instance of this profile not yet
                // matched (MIG devices and `-lgi` rows list instances in
                // the same order of profiles only by chance, so they are
                // matched by profile, one each).
                let at = placed.iter().position(|(_, p, _, _)| p == profile);
                let (start, id) = match at {
                    Some(k) => {
                        let (_, _, id, start) = placed.remove(k);
                        (Some(*start), Some(*id))
                    }
                    None => (None, None),
                };
                instances.push(InstanceReading {
                    profile: profile.to_string(),
                    start,
                    gpu_instance_id: id,
                    uuid: m.uuid().unwrap_or_default(),
                    memory_total_mib: mem.as_ref().map_or(0, |x| mib(x.total)),
                    memory_used_mib: mem.as_ref().map_or(0, |x| mib(x.used)),
                });
            }
        }
        gpus.push(GpuReading {
            index,
            uuid,
            name: d.name().unwrap_or_default(),
            memory_total_mib: mib(mem.total),
            memory_used_mib: mib(mem.used),
            mig_enabled: mig.as_ref().map(|m| m.current == 1),
            mig_pending: mig
                .as_ref()
                .filter(|m| m.pending != m.current)
                .map(|m| m.pending == 1),
            instances,
            utilization_percent: d.utilization_rates().ok().map(|u| u.gpu),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            power_watts: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            ecc_uncorrected_volatile: d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
            // Rounded up, as `nvidia-smi -q` prints it (615.06 → 616).
            memory_reserved_mib: Some(mem.reserved.div_ceil(1024 * 1024)),
            mig_profiles,
        });
    }
    Ok(NodeGpus {
        node: node.to_string(),
        driver_version: nvml.sys_driver_version().ok(),
        gpus,
    })
}

/// `nvidia-smi ARGS`'s output, when it is there and succeeds.
fn nvidia_smi(args: &[&str]) -> Option<String> {
    std::process::Command::new("nvidia-smi")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// NVML's profile ids are small integers (`NVML_GPU_INSTANCE_PROFILE_*`:
/// 0–16 in driver 580); ids past the last one answer an error.
const PROFILE_IDS: u32 = 32;

/// The profiles read so far, complete, by GPU UUID and MIG mode (NVML:
/// "immutable throughout the lifetime of a MIG mode"), so `nvidia-smi`
/// runs once per GPU and mode, not once a second.
static PROFILES: Mutex<Vec<ProfilesOf>> = Mutex::new(Vec::new());

/// (GPU UUID, MIG mode) and its profiles.
type ProfilesOf = ((String, u32), Vec<devices::ProfileReading>);

/// The GPU instance profiles of GPU `index`: NVML's profile info joined by
/// id with `nvidia-smi mig -lgip` (names) and `-lgipp` (placements).
/// nvml-wrapper's `possible_placements` returns an empty list (it reads a
/// vector whose length it never sets), so placements come from `-lgipp`.
fn profiles(
    d: &nvml_wrapper::Device,
    index: u32,
    uuid: &str,
    mode: u32,
) -> Vec<devices::ProfileReading> {
    let key = (uuid.to_string(), mode);
    let mut cache = PROFILES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = cache.iter().find(|(k, _)| *k == key) {
        return p.clone();
    }
    let mut out: Vec<devices::ProfileReading> = (0..PROFILE_IDS)
        .filter_map(|p| d.profile_info(p).ok())
        .filter(|i| i.slice_count > 0)
        .map(|i| devices::ProfileReading {
            id: i.id,
            name: None,
            compute_slices: i.slice_count,
            instances: i.instance_count,
            memory_mib: i.memory_size_mb,
            multiprocessors: i.multiprocessor_count,
            memory_slots: None,
            starts: Vec::new(),
        })
        .collect();
    if !out.is_empty() {
        let names = nvidia_smi(&["mig", "-lgip", "-i", &index.to_string()])
            .map(|t| devices::parse_lgip(&t))
            .unwrap_or_default();
        let places = nvidia_smi(&["mig", "-lgipp", "-i", &index.to_string()])
            .map(|t| devices::parse_lgipp(&t))
            .unwrap_or_default();
        for p in &mut out {
            p.name = names
                .iter()
                .find(|(g, _, id, _)| *g == index && *id == p.id)
                .map(|(_, n, _, _)| n.clone());
            if let Some((_, _, starts, size)) =
                places.iter().find(|(g, id, ..)| *g == index && *id == p.id)
            {
                p.starts = starts.clone();
                p.memory_slots = Some(*size);
            }
        }
        out.sort_by_key(|p| (p.compute_slices, p.memory_mib, p.id));
    }
    // Kept only when complete: a read whose `nvidia-smi` failed is tried
    // again next time rather than left unnamed until a restart.
    if out
        .iter()
        .all(|p| p.name.is_some() && p.memory_slots.is_some())
    {
        cache.push((key, out.clone()));
    }
    out
}

type Labels = Vec<(String, String)>;

fn gauge(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>> {
    let f = Family::<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    registry.register(name, help, f.clone());
    f
}

/// A reading as Prometheus metrics (OpenMetrics text), with DCGM
/// exporter's names and labels (`gpu`, `UUID`, `device`, `modelName`,
/// `Hostname`; MIG instances add `GPU_I_PROFILE` and `GPU_I_ID`) where
/// DCGM has the field, and `gpuscale_` names where it has not.
pub fn metrics(r: &NodeGpus) -> String {
    let mut registry = Registry::default();
    let util = gauge(
        &mut registry,
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %)",
    );
    let used = gauge(
        &mut registry,
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB)",
    );
    let free = gauge(
        &mut registry,
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB)",
    );
    let total = gauge(
        &mut registry,
        "DCGM_FI_DEV_FB_TOTAL",
        "Framebuffer memory total (in MiB)",
    );
    let reserved = gauge(
        &mut registry,
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB)",
    );
    let temp = gauge(
        &mut registry,
        "DCGM_FI_DEV_GPU_TEMP",
        "GPU temperature (in C)",
    );
    let power = gauge(
        &mut registry,
        "DCGM_FI_DEV_POWER_USAGE",
        "Power draw (in W)",
    );
    let dbe = gauge(
        &mut registry,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors",
    );
    let mig = gauge(
        &mut registry,
        "gpuscale_gpu_mig_enabled",
        "MIG mode now (1 enabled, 0 disabled); absent when the GPU has no MIG",
    );
    let instances = gauge(
        &mut registry,
        "gpuscale_gpu_mig_instances",
        "GPU instances (MIG devices) on the GPU now",
    );
    for g in &r.gpus {
        let labels: Labels = vec![
            ("gpu".into(), g.index.to_string()),
            ("UUID".into(), g.uuid.clone()),
            ("device".into(), format!("nvidia{}", g.index)),
            ("modelName".into(), g.name.clone()),
            ("Hostname".into(), r.node.clone()),
        ];
        let set =
            |f: &Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>, l: &Labels, v: f64| {
                f.get_or_create(l).set(v);
            };
        set(&used, &labels, g.memory_used_mib as f64);
        // DCGM's free excludes what the driver reserves.
        set(
            &free,
            &labels,
            g.memory_total_mib
                .saturating_sub(g.memory_used_mib)
                .saturating_sub(g.memory_reserved_mib.unwrap_or(0)) as f64,
        );
        set(&total, &labels, g.memory_total_mib as f64);
        if let Some(r) = g.memory_reserved_mib {
            set(&reserved, &labels, r as f64);
        }
        if let Some(u) = g.utilization_percent {
            set(&util, &labels, f64::from(u));
        }
        if let Some(t) = g.temperature_c {
            set(&temp, &labels, f64::from(t));
        }
        if let Some(p) = g.power_watts {
            set(&power, &labels, p);
        }
        if let Some(e) = g.ecc_uncorrected_volatile {
            set(&dbe, &labels, e as f64);
        }
        if let Some(m) = g.mig_enabled {
            set(&mig, &labels, f64::from(u8::from(m)));
            set(&instances, &labels, g.instances.len() as f64);
        }
        for i in &g.instances {
            let mut l = labels.clone();
            l.push(("GPU_I_PROFILE".into(), i.profile.clone()));
            l.push((
                "GPU_I_ID".into(),
                i.gpu_instance_id.map(|x| x.to_string()).unwrap_or_default(),
            ));
            set(&used, &l, i.memory_used_mib as f64);
            set(
                &free,
                &l,
                i.memory_total_mib.saturating_sub(i.memory_used_mib) as f64,
            );
            set(&total, &l, i.memory_total_mib as f64);
        }
    }
    let mut out = String::new();
    encode(&mut out, &registry).expect("writing to a String");
    out
}

/// Where readings come from.
pub enum Source {
    /// NVML on this node.
    Nvml(Arc<Nvml>, String),
    /// A declared reading (`--fake FILE`), for tests and demos.
    Fake(NodeGpus),
}

/// How long a reading is served before NVML is read again.
pub const FRESH: Duration = Duration::from_secs(1);
/// The most a reading of NVML may take (a GPU that fell off the bus can
/// hang calls).
pub const READ_BUDGET: Duration = Duration::from_secs(5);

struct Cache {
    source: Source,
    last: Mutex<Option<(Instant, Arc<NodeGpus>)>>,
}

impl Cache {
    async fn reading(self: &Arc<Self>) -> Result<Arc<NodeGpus>, String> {
        if let Some((at, r)) = &*self.last.lock().unwrap_or_else(|e| e.into_inner())
            && at.elapsed() < FRESH
        {
            return Ok(r.clone());
        }
        let r = match &self.source {
            Source::Fake(r) => Arc::new(r.clone()),
            Source::Nvml(nvml, node) => {
                let (nvml, node) = (nvml.clone(), node.clone());
                let task = tokio::task::spawn_blocking(move || read(&nvml, &node));
                match tokio::time::timeout(READ_BUDGET, task).await {
                    Ok(Ok(Ok(r))) => Arc::new(r),
                    Ok(Ok(Err(e))) => return Err(e),
                    Ok(Err(e)) => return Err(format!("the NVML reading failed: {e}")),
                    Err(_) => return Err(format!("NVML did not answer within {READ_BUDGET:?}")),
                }
            }
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), r.clone()));
        Ok(r)
    }
}

/// Answers a connection over [`AGENT_MAX_CONNECTIONS`]: `GET /healthz`
/// and `GET /readyz` as always, anything else 503.
async fn over_cap(stream: tokio::net::TcpStream, cache: Arc<Cache>) {
    use gpuscale_autoscaler::admin::{Probe, answer_over_cap};
    answer_over_cap(stream, AGENT_MAX_CONNECTIONS, |probe| async move {
        match probe {
            Probe::Live => Ok("ok\n".to_string()),
            Probe::Ready => cache.reading().await.map(|_| "ok\n".to_string()),
        }
    })
    .await;
}

/// Most connections the agent serves at once (its readers are Prometheus
/// and the controller); one more is closed at once.
pub const AGENT_MAX_CONNECTIONS: usize = 64;

/// Serves `/v1/gpus`, `/metrics`, `/healthz` and `/readyz` (NVML can be
/// read) on `listener` until
/// `stop` resolves. Read-only: nothing it serves changes state.
pub async fn serve(
    listener: tokio::net::TcpListener,
    source: Source,
    stop: impl std::future::Future<Output = ()>,
) {
    use http_body_util::Full;
    use hyper::{Method, Response, StatusCode};
    let cache = Arc::new(Cache {
        source,
        last: Mutex::new(None),
    });
    let mut stop = std::pin::pin!(stop);
    let slots = Arc::new(tokio::sync::Semaphore::new(AGENT_MAX_CONNECTIONS));
    // Bound to loopback: what a browser page sends there (a rebound DNS
    // name, another origin) is refused (`gpuscale_policies::listener`).
    let loopback = listener.local_addr().is_ok_and(|a| a.ip().is_loopback());
    let mut failed: Option<(std::time::Instant, u64)> = None;
    loop {
        let (stream, _): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    // Out of file descriptors, say: the error repeats at
                    // once, so wait a little and log once in a while.
                    match &mut failed {
                        Some((since, n)) if since.elapsed() < Duration::from_secs(10) => *n += 1,
                        _ => {
                            let before = failed.map_or(0, |(_, n)| n);
                            tracing::warn!(suppressed = before, "accept: {e}");
                            failed = Some((std::time::Instant::now(), 0));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => return,
        };
        // Its readers are a scraper and the controller: a handful of
        // connections. Beyond the cap a probe still gets its real answer
        // (held connections must not fail the kubelet's probes and get
        // the agent restarted); anything else 503, then the close.
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(over_cap(stream, cache.clone()));
            continue;
        };
        let cache = cache.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let cache = cache.clone();
                    async move {
                        let field = |name| {
                            req.headers()
                                .get(name)
                                .map(|v: &hyper::header::HeaderValue| {
                                    v.to_str().unwrap_or("\u{fffd}")
                                })
                        };
                        let refused = loopback
                            .then(|| {
                                gpuscale_policies::listener::refusal(
                                    field(hyper::header::HOST),
                                    field(hyper::header::ORIGIN),
                                )
                            })
                            .flatten();
                        let (status, ctype, body) = match (req.method(), req.uri().path()) {
                            _ if refused.is_some() => (
                                StatusCode::FORBIDDEN,
                                "text/plain",
                                format!("{}\n", refused.unwrap_or_default()),
                            ),
                            (&Method::GET, "/healthz") => {
                                (StatusCode::OK, "text/plain", "ok\n".to_string())
                            }
                            (&Method::GET, "/readyz") => match cache.reading().await {
                                Ok(_) => (StatusCode::OK, "text/plain", "ok\n".to_string()),
                                Err(e) => (
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    "text/plain",
                                    format!("{e}\n"),
                                ),
                            },
                            (&Method::GET, "/v1/gpus") => match cache.reading().await {
                                Ok(r) => (
                                    StatusCode::OK,
                                    "application/json",
                                    serde_json::to_string(&*r).unwrap_or_default(),
                                ),
                                Err(e) => (
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    "text/plain",
                                    format!("{e}\n"),
                                ),
                            },
                            (&Method::GET, "/metrics") => match cache.reading().await {
                                Ok(r) => {
                                    let (body, kind) = gpuscale_policies::exposition::negotiate(
                                        req.headers()
                                            .get_all(hyper::header::ACCEPT)
                                            .iter()
                                            .filter_map(|v| v.to_str().ok()),
                                        metrics(&r),
                                    );
                                    (StatusCode::OK, kind, body)
                                }
                                Err(e) => (
                                    StatusCode::SERVICE_UNAVAILABLE,
                                    "text/plain",
                                    format!("{e}\n"),
                                ),
                            },
                            (_, "/healthz" | "/readyz" | "/v1/gpus" | "/metrics") => (
                                StatusCode::METHOD_NOT_ALLOWED,
                                "text/plain",
                                "read-only: GET only\n".into(),
                            ),
                            _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
                        };
                        Response::builder()
                            .status(status)
                            .header("content-type", ctype)
                            .body(Full::new(bytes::Bytes::from(body)))
                    }
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .header_read_timeout(Duration::from_secs(10))
                .timer(hyper_util::rt::TokioTimer::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reading as NVML gives it on an H100 node with GPU 0 in MIG mode.
    fn recorded() -> NodeGpus {
        serde_json::from_value(serde_json::json!({
            "node": "gpu-a", "driverVersion": "570.124.06",
            "gpus": [
                {"index": 0, "uuid": "GPU-5fd4bd05-aaaa", "name": "NVIDIA H100 80GB HBM3",
                 "memoryTotalMib": 81559, "memoryUsedMib": 20480, "migEnabled": true,
                 "instances": [
                    {"profile": "3g.40gb", "start": 4, "gpuInstanceId": 2, "uuid": "MIG-1",
                     "memoryTotalMib": 40192, "memoryUsedMib": 20000},
                    {"profile": "1g.10gb", "start": 0, "gpuInstanceId": 9, "uuid": "MIG-2",
                     "memoryTotalMib": 9856, "memoryUsedMib": 480}],
                 "utilizationPercent": 71, "temperatureC": 54, "powerWatts": 312.5,
                 "eccUncorrectedVolatile": 0},
                {"index": 1, "uuid": "GPU-5fd4bd05-bbbb", "name": "NVIDIA H100 80GB HBM3",
                 "memoryTotalMib": 81559, "memoryUsedMib": 0, "migEnabled": false,
                 "utilizationPercent": 0, "temperatureC": 31, "powerWatts": 71.0,
                 "eccUncorrectedVolatile": 2, "memoryReservedMib": 512}]
        }))
        .unwrap()
    }

    /// The value of `name` on the line with every label of `with` (a
    /// GPU's own line has no MIG instance labels, unless asked for).
    fn sample(text: &str, name: &str, with: &[&str]) -> f64 {
        let instance = with.iter().any(|w| w.starts_with("GPU_I_"));
        let line = text
            .lines()
            .find(|l| {
                l.starts_with(&format!("{name}{{"))
                    && with.iter().all(|w| l.contains(w))
                    && (instance || !l.contains("GPU_I_PROFILE"))
            })
            .unwrap_or_else(|| panic!("no {name} with {with:?} in\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn metrics_use_dcgm_exporter_names_and_labels() {
        let text = metrics(&recorded());
        assert_eq!(sample(&text, "DCGM_FI_DEV_GPU_UTIL", &["gpu=\"0\""]), 71.0);
        assert_eq!(
            sample(
                &text,
                "DCGM_FI_DEV_FB_USED",
                &["gpu=\"0\"", "UUID=\"GPU-5fd4bd05-aaaa\""]
            ),
            20480.0
        );
        assert_eq!(
            sample(
                &text,
                "DCGM_FI_DEV_FB_FREE",
                &["gpu=\"1\"", "modelName=\"NVIDIA H100 80GB HBM3\""]
            ),
            // DCGM's free leaves out the driver's reservation.
            81559.0 - 512.0
        );
        assert_eq!(
            sample(&text, "DCGM_FI_DEV_FB_RESERVED", &["gpu=\"1\""]),
            512.0
        );
        assert!(!text.contains("DCGM_FI_DEV_FB_RESERVED{gpu=\"0\""));
        assert_eq!(sample(&text, "DCGM_FI_DEV_GPU_TEMP", &["gpu=\"1\""]), 31.0);
        assert_eq!(
            sample(&text, "DCGM_FI_DEV_POWER_USAGE", &["gpu=\"0\""]),
            312.5
        );
        assert_eq!(
            sample(&text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", &["gpu=\"1\""]),
            2.0
        );
        assert_eq!(
            sample(
                &text,
                "DCGM_FI_DEV_FB_USED",
                &["GPU_I_PROFILE=\"3g.40gb\"", "GPU_I_ID=\"2\""]
            ),
            20000.0
        );
        assert_eq!(
            sample(&text, "gpuscale_gpu_mig_enabled", &["gpu=\"0\""]),
            1.0
        );
        assert_eq!(
            sample(&text, "gpuscale_gpu_mig_instances", &["gpu=\"0\""]),
            2.0
        );
        assert!(text.contains("Hostname=\"gpu-a\""));
        assert!(text.contains("device=\"nvidia1\""));
        assert!(text.ends_with("# EOF\n"));
    }
}
