//! `routing-bench`: round robin, least-outstanding and gpuscale's prefix
//! affinity, each behind 1 and 3 gateway processes in front of the same
//! simulated replicas, on a prefix-heavy and a no-prefix workload
//! ([`gpuscale_bench::routing`]), in one run. Every configuration starts
//! from fresh replicas (cold caches) and the same requests.
//!
//! Prints a table and the three summary lines `bench/routing.sh` ends
//! with. Loopback only; every process it starts is killed when it exits.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use gpuscale_bench::routing::{self, Params, Session, Workload, quantile};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

#[derive(Debug, Parser)]
#[command(about = "Routing policies against each other on simulated replicas with prefix caches")]
struct Args {
    /// The gpuscale binary (release build).
    #[arg(long, default_value = "target/release/gpuscale")]
    gpuscale: PathBuf,
    /// The Azure conversation trace.
    #[arg(long, default_value = "bench/data/traces/azure_llm_2023_conv.csv")]
    trace: PathBuf,
    /// Seconds during which sessions start, per configuration.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Requests per second offered by workload A (prefix-heavy): a peak
    /// for least-outstanding (its replicas' prefill busy about 85 % of
    /// the time).
    #[arg(long, default_value_t = 70.0)]
    rate_a: f64,
    /// Requests per second offered by workload B (no shared prefix, so
    /// every prompt is prefilled whole: the same load as A's at a lower
    /// rate).
    #[arg(long, default_value_t = 40.0)]
    rate_b: f64,
    /// Simulated replicas.
    #[arg(long, default_value_t = 8)]
    replicas: usize,
    /// Requests a replica runs at once.
    #[arg(long, default_value_t = 16)]
    concurrency: u32,
    /// Most output tokens per request.
    #[arg(long, default_value_t = 32)]
    max_tokens: u32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The prefix policy's `routing.loadFactor`.
    #[arg(long, default_value_t = 1.5)]
    load_factor: f64,
    /// The prefix policy's `routing.spillFloor`.
    #[arg(long, default_value_t = 0.75)]
    spill_floor: f64,
    /// The prefix policy's `routing.freshSlack`.
    #[arg(long, default_value_t = 0)]
    fresh_slack: u32,
    /// Only configurations whose name contains one of these (repeatable).
    #[arg(long)]
    only: Vec<String>,
    /// Runs of each configuration, with seeds `seed`, `seed + 1`, …; the
    /// table gives each figure's median over the runs (the kill run runs
    /// once).
    #[arg(long, default_value_t = 1)]
    repeat: u64,
    /// Write every configuration's figures here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Children killed on drop.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A loopback port free now, below Linux's default ephemeral range
/// (32768–60999): the thousands of client connections a run opens take
/// their ports from that range, and one of them could take a port between
/// this check and the child process's bind.
fn free_port() -> anyhow::Result<u16> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(nanos ^ u64::from(std::process::id()));
    for _ in 0..1000 {
        let port = rng.random_range(20_000..32_000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[derive(Debug, Clone, Default)]
struct Record {
    session: usize,
    gateway: usize,
    sent: f64,
    ttft: Option<f64>,
    e2e: f64,
    status: u16,
    reason: String,
    replica: String,
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    hits: f64,
    queries: f64,
    requests: f64,
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn scrape(client: &HttpClient, sims: &[SocketAddr]) -> Vec<Counters> {
    let mut out = Vec::new();
    for a in sims {
        let req = http::Request::get(format!("http://{a}/metrics"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let text = match client.request(req).await {
            Ok(r) => r
                .into_body()
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).to_string())
                .unwrap_or_default(),
            Err(_) => String::new(),
        };
        out.push(Counters {
            hits: sample(&text, "vllm:prefix_cache_hits_total"),
            queries: sample(&text, "vllm:prefix_cache_queries_total"),
            requests: sample(&text, "sim_requests_total"),
        });
    }
    out
}

fn hit_rate(before: &[Counters], after: &[Counters]) -> f64 {
    let h: f64 = after.iter().zip(before).map(|(a, b)| a.hits - b.hits).sum();
    let q: f64 = after
        .iter()
        .zip(before)
        .map(|(a, b)| a.queries - b.queries)
        .sum();
    if q > 0.0 { h / q } else { 0.0 }
}

/// Sends one streaming request; times the first chunk and the last.
async fn one(client: &HttpClient, gateway: SocketAddr, body: &str, origin: Instant) -> Record {
    let sent = origin.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let req = http::Request::post(format!("http://{gateway}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let mut rec = Record {
        sent,
        ..Record::default()
    };
    let resp = match client.request(req).await {
        Ok(r) => r,
        Err(_) => {
            rec.e2e = t0.elapsed().as_secs_f64();
            return rec;
        }
    };
    rec.status = resp.status().as_u16();
    if let Some(v) = resp
        .headers()
        .get("x-gpuscale-route")
        .and_then(|v| v.to_str().ok())
    {
        let (reason, replica) = v.split_once("; replica=").unwrap_or((v, ""));
        rec.reason = reason.to_string();
        rec.replica = replica.to_string();
    }
    let mut body = resp.into_body();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if rec.ttft.is_none() && f.data_ref().is_some_and(|d| !d.is_empty()) {
                    rec.ttft = Some(t0.elapsed().as_secs_f64());
                }
            }
            Err(_) => {
                rec.status = 0;
                break;
            }
        }
    }
    rec.e2e = t0.elapsed().as_secs_f64();
    rec
}

#[derive(Debug, Clone, serde::Serialize)]
struct Figures {
    workload: String,
    policy: String,
    gateways: usize,
    requests: usize,
    failed: usize,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    e2e_p99_ms: f64,
    hit_rate: f64,
    per_replica_max_over_mean: f64,
    throughput_rps: f64,
    /// The kill run: hit rates in the 10 s before and after, and the
    /// sessions whose affinity replica changed on surviving gateways.
    kill: Option<KillFigures>,
}

#[derive(Debug, Clone, serde::Serialize)]
struct KillFigures {
    hit_rate_10s_before: f64,
    hit_rate_10s_after: f64,
    sessions_compared: usize,
    owners_changed: usize,
}

/// Each figure's median over runs of one configuration (the upper median
/// for an even count), the most failed requests of any run, and the kill
/// figures of the first run.
fn median_figures(runs: &[Figures]) -> Figures {
    fn med(runs: &[Figures], f: impl Fn(&Figures) -> f64) -> f64 {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
    let first = &runs[0];
    Figures {
        workload: first.workload.clone(),
        policy: first.policy.clone(),
        gateways: first.gateways,
        requests: med(runs, |f| f.requests as f64) as usize,
        failed: runs.iter().map(|f| f.failed).max().unwrap_or(0),
        ttft_p50_ms: med(runs, |f| f.ttft_p50_ms),
        ttft_p99_ms: med(runs, |f| f.ttft_p99_ms),
        e2e_p99_ms: med(runs, |f| f.e2e_p99_ms),
        hit_rate: med(runs, |f| f.hit_rate),
        per_replica_max_over_mean: med(runs, |f| f.per_replica_max_over_mean),
        throughput_rps: med(runs, |f| f.throughput_rps),
        kill: first.kill.clone(),
    }
}

struct Config {
    workload: Workload,
    policy: &'static str,
    gateways: usize,
    kill: bool,
}

impl Config {
    fn name(&self) -> String {
        format!(
            "{} / {} / {} gateway{}{}",
            self.workload.name(),
            self.policy,
            self.gateways,
            if self.gateways == 1 { "" } else { "s" },
            if self.kill { " / one killed" } else { "" }
        )
    }
}

async fn wait_ready(client: &HttpClient, addr: SocketAddr, path: &str) -> anyhow::Result<()> {
    for _ in 0..200 {
        let req = http::Request::get(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        if let Ok(r) = client.request(req).await
            && r.status().is_success()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("{addr}{path} never answered")
}

async fn run(
    args: &Args,
    dir: &std::path::Path,
    cfg: &Config,
    sessions: Arc<Vec<Session>>,
    seed: u64,
) -> anyhow::Result<Figures> {
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(512)
        .build(HttpConnector::new());
    let mut procs = Procs(Vec::new());
    let mut sims = Vec::new();
    for _ in 0..args.replicas {
        let port = free_port()?;
        let child = Command::new(&args.gpuscale)
            .args(["sim-server", "--profile", "small", "--model", "m"])
            .args(["--port", &port.to_string()])
            .args(["--max-concurrency", &args.concurrency.to_string()])
            .arg("--exit-with-stdin")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot run {}", args.gpuscale.display()))?;
        procs.0.push(child);
        sims.push(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    let token = dir.join("admin-token");
    std::fs::write(&token, "routing-bench-admin-token-0123456789\n")?;
    let replicas: Vec<String> = sims.iter().map(|a| format!("\"http://{a}\"")).collect();
    // Each gateway gets its share of every replica's concurrency, as the
    // autoscaler registers replicas with several gateways.
    let share = args.concurrency.div_ceil(cfg.gateways as u32);
    let mut gateways = Vec::new();
    let mut gateway_procs = Vec::new();
    for g in 0..cfg.gateways {
        let (listen, admin) = (free_port()?, free_port()?);
        let conf = dir.join(format!("gateway-{g}.yaml"));
        std::fs::write(
            &conf,
            format!(
                "apiVersion: gpuscale.io/v1alpha1\nkind: Gateway\nmetadata:\n  name: bench-{g}\nspec:\n  \
                 listen: 127.0.0.1:{listen}\n  admin: 127.0.0.1:{admin}\n  adminTokenFile: {}\n  workers: 1\n  \
                 routing:\n    policy: {}\n    explain: true\n    loadFactor: {}\n    spillFloor: {}\n    freshSlack: {}\n  queue:\n    maxQueue: 4096\n    queueTimeout: 120s\n  \
                 models:\n    - name: m\n      maxConcurrency: {share}\n      metrics: vllm\n      replicas: [{}]\n",
                token.display(),
                cfg.policy,
                args.load_factor,
                args.spill_floor,
                args.fresh_slack,
                replicas.join(", ")
            ),
        )?;
        let child = Command::new(&args.gpuscale)
            .args(["gateway", "--config"])
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        gateway_procs.push(child);
        gateways.push((
            SocketAddr::from(([127, 0, 0, 1], listen)),
            SocketAddr::from(([127, 0, 0, 1], admin)),
        ));
    }
    for s in &sims {
        wait_ready(&client, *s, "/health").await?;
    }
    for (_, admin) in &gateways {
        wait_ready(&client, *admin, "/healthz").await?;
    }
    let gateway_procs = Arc::new(Mutex::new(gateway_procs));
    let alive: Arc<Vec<AtomicBool>> =
        Arc::new((0..cfg.gateways).map(|_| AtomicBool::new(true)).collect());
    let records = Arc::new(Mutex::new(Vec::<Record>::new()));
    let origin = Instant::now();
    let start_counters = scrape(&client, &sims).await;
    let mut tasks = Vec::new();
    for s in sessions.iter().cloned() {
        let (client, records, alive, gateways) = (
            client.clone(),
            records.clone(),
            alive.clone(),
            gateways.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut rng = Xoshiro256PlusPlus::seed_from_u64(seed ^ (s.id as u64) << 16);
            tokio::time::sleep_until((origin + Duration::from_secs_f64(s.start)).into()).await;
            for (t, turn) in s.turns.iter().enumerate() {
                if t > 0 {
                    tokio::time::sleep(Duration::from_secs_f64(s.think[t - 1])).await;
                }
                // Each request to any gateway, as a load balancer in
                // front of them would spread it; a dead one is retried on
                // another, as a client would.
                let mut g = rng.random_range(0..gateways.len());
                let mut rec = Record::default();
                for _ in 0..gateways.len() * 2 {
                    if alive[g].load(Ordering::Relaxed) {
                        rec = one(&client, gateways[g].0, &turn.body, origin).await;
                        if rec.status != 0 {
                            break;
                        }
                    }
                    g = (g + 1) % gateways.len();
                }
                rec.session = s.id;
                rec.gateway = g;
                records.lock().expect("records").push(rec);
            }
        }));
    }
    // The kill: gateway 2 at the midpoint; hit rates 10 s either side.
    let kill = if cfg.kill {
        let at = origin + Duration::from_secs_f64(args.seconds / 2.0);
        tokio::time::sleep_until((at - Duration::from_secs(10)).into()).await;
        let before = scrape(&client, &sims).await;
        tokio::time::sleep_until(at.into()).await;
        let at_kill = scrape(&client, &sims).await;
        alive[2].store(false, Ordering::Relaxed);
        let _ = gateway_procs.lock().expect("procs")[2].kill();
        let killed_at = origin.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(10)).await;
        let after = scrape(&client, &sims).await;
        Some((
            killed_at,
            hit_rate(&before, &at_kill),
            hit_rate(&at_kill, &after),
        ))
    } else {
        None
    };
    for t in tasks {
        let _ = t.await;
    }
    let wall = origin.elapsed().as_secs_f64();
    let end_counters = scrape(&client, &sims).await;
    for c in gateway_procs.lock().expect("procs").iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
    drop(procs);
    let records = std::mem::take(&mut *records.lock().expect("records"));
    let ok: Vec<&Record> = records.iter().filter(|r| r.status == 200).collect();
    let mut ttft: Vec<f64> = ok.iter().filter_map(|r| r.ttft).collect();
    let mut e2e: Vec<f64> = ok.iter().map(|r| r.e2e).collect();
    let per: Vec<f64> = end_counters
        .iter()
        .zip(&start_counters)
        .map(|(a, b)| a.requests - b.requests)
        .collect();
    let mean = per.iter().sum::<f64>() / per.len().max(1) as f64;
    let max = per.iter().copied().fold(0.0, f64::max);
    let last_sent = records.iter().map(|r| r.sent + r.e2e).fold(0.0, f64::max);
    let kill = kill.map(|(killed_at, before, after)| {
        // Per session, the replica its affinity decisions named on the
        // surviving gateways, before and after the kill.
        let mut owners: std::collections::BTreeMap<usize, (Option<String>, Option<String>)> =
            Default::default();
        for r in records
            .iter()
            .filter(|r| r.reason == "affinity" && r.gateway != 2)
        {
            let e = owners.entry(r.session).or_default();
            let slot = if r.sent < killed_at {
                &mut e.0
            } else {
                &mut e.1
            };
            *slot = Some(r.replica.clone());
        }
        let compared: Vec<_> = owners
            .values()
            .filter_map(|(a, b)| Some((a.as_ref()?, b.as_ref()?)))
            .collect();
        KillFigures {
            hit_rate_10s_before: before,
            hit_rate_10s_after: after,
            sessions_compared: compared.len(),
            owners_changed: compared.iter().filter(|(a, b)| a != b).count(),
        }
    });
    Ok(Figures {
        workload: cfg.workload.name().to_string(),
        policy: cfg.policy.to_string(),
        gateways: cfg.gateways,
        requests: records.len(),
        failed: records.len() - ok.len(),
        ttft_p50_ms: quantile(&mut ttft, 0.5) * 1e3,
        ttft_p99_ms: quantile(&mut ttft, 0.99) * 1e3,
        e2e_p99_ms: quantile(&mut e2e, 0.99) * 1e3,
        hit_rate: hit_rate(&start_counters, &end_counters),
        per_replica_max_over_mean: if mean > 0.0 { max / mean } else { 0.0 },
        throughput_rps: ok.len() as f64 / wall.min(last_sent.max(1.0)),
        kill,
    })
}

fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    anyhow::ensure!(
        args.gpuscale.exists(),
        "{} not found: build it with `cargo build --release`",
        args.gpuscale.display()
    );
    let rows = routing::read_trace(&args.trace)?;
    let params = Params {
        rate: args.rate_a,
        seconds: args.seconds,
        seed: args.seed,
        max_tokens: args.max_tokens,
        think_s: 2.0,
    };
    let dir = std::env::temp_dir().join(format!("gpuscale-routing-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut configs = Vec::new();
    for workload in [Workload::PrefixHeavy, Workload::NoPrefix] {
        for policy in ["round-robin", "least-outstanding", "prefix"] {
            for gateways in [1, 3] {
                configs.push(Config {
                    workload,
                    policy,
                    gateways,
                    kill: false,
                });
            }
        }
    }
    configs.push(Config {
        workload: Workload::PrefixHeavy,
        policy: "prefix",
        gateways: 3,
        kill: true,
    });
    configs.retain(|cfg| {
        args.only.is_empty() || args.only.iter().any(|o| cfg.name().contains(o.as_str()))
    });
    let mut runs: Vec<Vec<Figures>> = vec![Vec::new(); configs.len()];
    for r in 0..args.repeat.max(1) {
        for (cfg, out) in configs.iter().zip(runs.iter_mut()) {
            if cfg.kill && r > 0 {
                continue;
            }
            let p = Params {
                rate: match cfg.workload {
                    Workload::PrefixHeavy => args.rate_a,
                    Workload::NoPrefix => args.rate_b,
                },
                seed: args.seed + r,
                ..params
            };
            let sessions = Arc::new(routing::sessions(cfg.workload, &rows, &p));
            eprintln!("running {} (seed {})", cfg.name(), p.seed);
            // A process that could not start (its port taken after all)
            // gets the configuration run again, twice at most.
            let mut attempt = 1;
            let f = loop {
                match runtime.block_on(run(&args, &dir, cfg, sessions.clone(), p.seed)) {
                    Ok(f) => break f,
                    Err(e) if attempt < 3 => {
                        eprintln!("  attempt {attempt} failed ({e}); again");
                        attempt += 1;
                    }
                    Err(e) => return Err(e),
                }
            };
            eprintln!("  {f:?}");
            out.push(f);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&runs)?)?;
    }
    let results: Vec<Figures> = runs.iter().map(|r| median_figures(r)).collect();
    println!(
        "{} simulated replicas (profile small: 8,000 prompt tokens/s one prompt at a time, 60 tokens/s decode, \
         {} requests at once, prefix cache of 442,368 tokens); sessions start for {} s at {} requests/s (A) and \
         {} requests/s (B); outputs capped at {} tokens; prefix policy: loadFactor {}, spillFloor {}, freshSlack {}; \
         {} run(s) per configuration, each figure the median over runs\n",
        args.replicas,
        args.concurrency,
        args.seconds,
        args.rate_a,
        args.rate_b,
        args.max_tokens,
        args.load_factor,
        args.spill_floor,
        args.fresh_slack,
        args.repeat.max(1)
    );
    println!(
        "| workload | policy | gateways | requests | failed | TTFT p50 ms | TTFT p99 ms | end-to-end p99 ms | cache hit rate | requests per replica, max/mean | throughput req/s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for f in results.iter().filter(|f| f.kill.is_none()) {
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.1} % | {:.2} | {:.1} |",
            f.workload,
            f.policy,
            f.gateways,
            f.requests,
            f.failed,
            f.ttft_p50_ms,
            f.ttft_p99_ms,
            f.e2e_p99_ms,
            f.hit_rate * 100.0,
            f.per_replica_max_over_mean,
            f.throughput_rps
        );
    }
    for f in &results {
        if let Some(k) = &f.kill {
            println!(
                "\nOne of 3 gateways killed at the midpoint ({}): cache hit rate {:.1} % in the 10 s before, {:.1} % in the 10 s after; \
                 sessions whose affinity replica changed on the surviving gateways: {} of {}; failed requests {} of {}",
                f.policy,
                k.hit_rate_10s_before * 100.0,
                k.hit_rate_10s_after * 100.0,
                k.owners_changed,
                k.sessions_compared,
                f.failed,
                f.requests
            );
        }
    }
    let find = |w: Workload, p: &str, g: usize| {
        results.iter().find(|f| {
            f.workload == w.name() && f.policy == p && f.gateways == g && f.kill.is_none()
        })
    };
    println!();
    let ratios: Vec<f64> = [1, 3]
        .iter()
        .filter_map(|&g| {
            let (a, b) = (
                find(Workload::PrefixHeavy, "prefix", g)?,
                find(Workload::PrefixHeavy, "least-outstanding", g)?,
            );
            Some(a.ttft_p99_ms / b.ttft_p99_ms)
        })
        .collect();
    if !ratios.is_empty() {
        println!(
            "p99 TTFT ratio (gpuscale/least-outstanding, prefix-heavy): {:.2}",
            ratios.iter().copied().fold(0.0, f64::max)
        );
    }
    if let (Some(one), Some(three)) = (
        find(Workload::PrefixHeavy, "prefix", 1),
        find(Workload::PrefixHeavy, "prefix", 3),
    ) {
        println!(
            "hit-rate gap (1 vs 3 gateways): {:.1} points",
            (one.hit_rate - three.hit_rate).abs() * 100.0
        );
    }
    let worst: Vec<f64> = [1, 3]
        .iter()
        .filter_map(|&g| {
            let (a, b) = (
                find(Workload::NoPrefix, "prefix", g)?,
                find(Workload::NoPrefix, "least-outstanding", g)?,
            );
            Some(
                [
                    a.ttft_p50_ms / b.ttft_p50_ms,
                    a.ttft_p99_ms / b.ttft_p99_ms,
                    a.e2e_p99_ms / b.e2e_p99_ms,
                    b.throughput_rps / a.throughput_rps,
                ]
                .into_iter()
                .fold(0.0, f64::max),
            )
        })
        .collect();
    if !worst.is_empty() {
        println!(
            "worst ratio on no-prefix (gpuscale/least-outstanding): {:.2}",
            worst.iter().copied().fold(0.0, f64::max)
        );
    }
    Ok(ExitCode::SUCCESS)
}
