//! `gpuscale up`: the whole loop in one process, on the embedded default.
//!
//! From `examples/up/autoscaler.yaml` (the example cluster and policies):
//! the gateway (traffic port), the autoscaler on the local backend with the
//! packer placing every change, one simulated model server per replica
//! slowed to its share of a GPU, and the autoscaler's admin port serving
//! the dashboard. `--load` adds built-in traffic ([`crate::load`]); a
//! compact summary goes to the terminal; `--duration` ends a scripted run,
//! Ctrl-C drains and exits.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpuscale_autoscaler::dashboard::View;
use gpuscale_policies::Model;

use super::autoscaler::{Backend, Loop, admin_secret};
use crate::load::{self, Arrivals, Pattern, Totals};

/// What `up` reads with no `--config`.
pub const DEFAULT_CONFIG: &str = "examples/up/autoscaler.yaml";

/// The most requests per second the built-in load sends (`--rate`).
const MAX_RATE: f64 = 2000.0;

/// Arguments of `up`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The `kind: Autoscaler` file: cluster, policies, embedded gateway.
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Built-in traffic: steady, diurnal (a ten-minute day), burst (30 s
    /// of every two minutes) or trace:FILE (an Azure-format trace in real
    /// time). Without it the gateway waits for your own requests.
    #[arg(long)]
    pub load: Option<Pattern>,
    /// Peak requests per second of the built-in load, over all models
    /// (at most 2,000).
    #[arg(long, default_value_t = 40.0, allow_negative_numbers = true)]
    pub rate: f64,
    /// Seed of the built-in load.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this long (`90s`, `10m`); without it, run until Ctrl-C.
    #[arg(long, value_parser = gpuscale_policies::duration::parse, allow_hyphen_values = true)]
    pub duration: Option<Duration>,
    /// Divide the policies' time constants (start-up times, scale-down
    /// windows, scale-to-zero delays, rate-limit periods) by this, so that
    /// minutes of behaviour show in seconds.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub speedup: f64,
    /// Address every listener binds (loopback unless you choose).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
    /// Traffic port (the OpenAI-compatible API).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Admin port: the dashboard, `/v1/dashboard`, `/v1/decisions`,
    /// `/metrics`.
    #[arg(long, default_value_t = 9091)]
    pub admin_port: u16,
    /// The gateway's admin port (replica registration, with a token made
    /// up for the run; `/v1/queues`, the gateway's `/metrics`).
    #[arg(long, default_value_t = 9090)]
    pub gateway_admin_port: u16,
    /// Time between terminal summaries (`0s`: none while it runs, only the
    /// final one at exit).
    #[arg(long, default_value = "5s", value_parser = gpuscale_policies::duration::parse, allow_hyphen_values = true)]
    pub summary_every: Duration,
}

/// Divides a model's time constants by `k` (at least 1).
fn speed_up(m: &mut Model, k: f64) {
    let k = k.max(1.0);
    let div = |d: &mut Duration| *d = d.div_f64(k);
    div(&mut m.scaling.startup_time);
    div(&mut m.scaling.scale_to_zero_after);
    for rules in [&mut m.scale_up, &mut m.scale_down] {
        div(&mut rules.stabilization_window);
        for p in &mut rules.policies {
            p.period = p.period.div_f64(k).max(Duration::from_secs(1));
        }
    }
}

/// Refuses a port that is taken, naming it and its flag.
fn check_free(addr: SocketAddr, what: &str, flag: &str) -> Result<(), String> {
    if addr.port() == 0 {
        return Ok(());
    }
    match std::net::TcpListener::bind(addr) {
        Ok(_) => Ok(()),
        // The address is no interface of this machine: `--bind` is what
        // to change, not the port.
        Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => Err(format!(
            "gpuscale up: cannot listen on {addr} ({what}): {e}; {} is no address of this machine: choose another with --bind",
            addr.ip()
        )),
        Err(e) => Err(format!(
            "gpuscale up: cannot listen on {addr} ({what}): {e}; choose another with {flag}"
        )),
    }
}

fn ms(x: Option<f64>) -> String {
    match x {
        None => "–".into(),
        Some(v) if v >= 1000.0 => format!("{:.1}s", v / 1000.0),
        Some(v) => format!("{v:.0}ms"),
    }
}

/// The terminal summary: the cluster line, then one line per model.
pub fn summary(v: &View, elapsed: Duration) -> String {
    let mut out = format!(
        "[{:>5.0}s] GPUs {}/{} · memory {:.0} % · compute {:.0} % · ${:.2}/h · {:.1} req/s\n",
        elapsed.as_secs_f64(),
        v.summary.gpus_used,
        v.summary.gpus,
        100.0 * v.summary.memory,
        100.0 * v.summary.compute,
        v.summary.cost_per_hour,
        v.models.iter().map(|m| m.rate).sum::<f64>(),
    );
    out.push_str(&format!(
        "  {:<20} {:>9} {:>6} {:>7}  {:>17}  {:>17}\n",
        "model", "ready/want", "queue", "req/s", "p95 latency / SLO", "p95 TTFT / SLO"
    ));
    for m in &v.models {
        let mut flag = match m.within_slo {
            Some(false) => " over SLO".to_string(),
            _ => String::new(),
        };
        if m.unplaced > 0 {
            flag.push_str(&format!(" ({} more found no GPU)", m.unplaced));
        }
        if m.spares > 0 {
            flag.push_str(&format!(
                " (+{} spare{} in idle room)",
                m.spares,
                if m.spares == 1 { "" } else { "s" }
            ));
        }
        out.push_str(&format!(
            "  {:<20} {:>9} {:>6.0} {:>7.1}  {:>17}  {:>17}{flag}\n",
            m.name,
            format!("{}/{}", m.ready, m.desired),
            m.waiting,
            m.rate,
            // Each figure beside its target, the slashes in one column.
            format!(
                "{:>7} / {:<7}",
                ms(m.latency_p95_ms),
                ms(m.slo.latency_p95_ms)
            ),
            format!("{:>7} / {:<7}", ms(m.ttft_p95_ms), ms(m.slo.ttft_p95_ms)),
        ));
    }
    out
}

/// Runs until `--duration` or SIGINT/SIGTERM, then stops the load, waits
/// for its answers, drains every replica and exits.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut settings = match gpuscale_autoscaler::config::load(&args.config) {
        Ok(s) => s,
        Err(p) => {
            for p in &p.0 {
                eprintln!("{p}");
            }
            if !args.config.exists() && args.config == std::path::Path::new(DEFAULT_CONFIG) {
                eprintln!(
                    "gpuscale up reads {} by default: run it from the repository root, or pass --config",
                    args.config.display()
                );
            }
            return Ok(ExitCode::from(if super::wrong_document(&p.0) {
                2
            } else {
                1
            }));
        }
    };
    let Some(gateway_file) = settings.spec.gateway.config.clone() else {
        eprintln!(
            "{}: spec.gateway.config: gpuscale up runs the gateway itself; give its config file",
            args.config.display()
        );
        return Ok(ExitCode::from(1));
    };
    if !(args.speedup.is_finite() && args.speedup >= 1.0) {
        eprintln!(
            "gpuscale up: error: --speedup must be at least 1, got {}",
            args.speedup
        );
        return Ok(ExitCode::from(2));
    }
    if !(args.rate.is_finite() && args.rate > 0.0) {
        eprintln!(
            "gpuscale up: error: --rate must be above 0, got {}",
            args.rate
        );
        return Ok(ExitCode::from(2));
    }
    if args.rate > MAX_RATE {
        eprintln!(
            "gpuscale up: error: --rate {} is above {MAX_RATE} requests/s: the built-in load runs in this process beside the gateway and every simulated server, and past that it measures the machine, not the autoscaler (send more from a load generator of your own)",
            args.rate
        );
        return Ok(ExitCode::from(2));
    }
    let mut gateway_settings = match gpuscale_gateway::config::load(&gateway_file) {
        Ok(s) => s,
        Err(p) => {
            for p in &p.0 {
                eprintln!("{p}");
            }
            return Ok(ExitCode::from(1));
        }
    };
    let traffic = SocketAddr::new(args.bind, args.port);
    let admin = SocketAddr::new(args.bind, args.admin_port);
    let gateway_admin = SocketAddr::new(args.bind, args.gateway_admin_port);
    let listeners = [
        (traffic, "the traffic port", "--port"),
        (admin, "the admin port and dashboard", "--admin-port"),
        (
            gateway_admin,
            "the gateway's admin port",
            "--gateway-admin-port",
        ),
    ];
    let named: Vec<(&str, SocketAddr)> = listeners.iter().map(|(a, _, f)| (*f, *a)).collect();
    if let Err(message) = super::one_port_each(&named) {
        eprintln!("{message}");
        return Ok(ExitCode::from(2));
    }
    for (addr, what, flag) in listeners {
        if let Err(message) = check_free(addr, what, flag) {
            eprintln!("{message}");
            return Ok(ExitCode::from(2));
        }
    }
    gateway_settings.spec.listen = traffic;
    gateway_settings.spec.admin = gateway_admin;
    settings.spec.admin = admin;
    settings.spec.keda = None;
    for m in &mut settings.models {
        speed_up(m, args.speedup);
    }
    let decode_tps = gpuscale_gateway::sim::SimProfile::named(&settings.spec.local.profile, "")
        .map_or(0.0, |p| p.decode_tps);
    let arrivals = match &args.load {
        Some(p) => match Arrivals::new(
            p.clone(),
            args.rate,
            load::targets(&settings.models, decode_tps),
            args.seed,
        ) {
            Ok(a) => Some(a),
            Err(e) => {
                eprintln!("--load: {e}");
                return Ok(ExitCode::from(1));
            }
        },
        None => None,
    };
    let mut gateway_settings = Some(gateway_settings);
    let secret = match admin_secret(None, &settings, &mut gateway_settings)? {
        Ok(s) => s,
        Err(message) => {
            eprintln!("{message}");
            return Ok(ExitCode::from(1));
        }
    };
    let cluster = settings.cluster.as_ref().map_or_else(
        || "no cluster (replicas unplaced)".to_string(),
        |c| {
            let gpus: usize = c.nodes.iter().map(|n| n.gpus.len()).sum();
            let healthy = c
                .nodes
                .iter()
                .flat_map(|n| &n.gpus)
                .filter(|g| g.health == gpuscale_policies::Health::Healthy)
                .count();
            if healthy == gpus {
                format!("{} ({} nodes, {gpus} GPUs)", c.name, c.nodes.len())
            } else {
                format!(
                    "{} ({} nodes, {gpus} GPUs, {healthy} healthy)",
                    c.name,
                    c.nodes.len()
                )
            }
        },
    );
    let models = settings.models.len();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let running = Loop::start(settings, gateway_settings, secret, Backend::Local, false).await?;
        let traffic = running.gateway.as_ref().map_or(traffic, |g| g.traffic);
        // Standard output gone (`gpuscale up | head -3`): the run stops as
        // on Ctrl-C, drains, and exits 2 (an error writing output).
        let out_gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_printing = Arc::new(tokio::sync::Notify::new());
        let say = {
            let (gone, notify) = (out_gone.clone(), stop_printing.clone());
            move |text: &str| {
                if gone.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                if !super::say(text) {
                    gone.store(true, std::sync::atomic::Ordering::Relaxed);
                    notify.notify_one();
                }
            }
        };
        let mut header = format!(
            "gpuscale up: {models} models on {cluster}\n  dashboard  http://{}/\n  traffic    http://{traffic}/v1/chat/completions (OpenAI API)\n",
            running.admin
        );
        match &args.load {
            Some(p @ Pattern::Trace(_)) => header.push_str(&format!(
                "  load       {} (its own arrivals in real time; --rate does not apply)\n",
                p.name()
            )),
            Some(p) => header.push_str(&format!("  load       {}, peak {} req/s\n", p.name(), args.rate)),
            None => header.push_str(&format!(
                "  load       none: send your own, e.g.\n             curl -s {traffic}/v1/chat/completions -H 'content-type: application/json' -d '{{\"model\":\"meta-llama/Llama-3.1-8B-Instruct\",\"max_tokens\":32,\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}'\n"
            )),
        }
        if !args.bind.is_loopback() {
            header.push_str(&format!(
                "  warning    listening on {}: the traffic port and the read-only dashboard answer anyone who can reach this address (the gateway's admin port takes its token)\n",
                args.bind
            ));
        }
        header.push_str(&format!(
            "  stop       {}\n",
            match args.duration {
                Some(d) => format!("after {}, or Ctrl-C", gpuscale_policies::duration::show(d)),
                None => "Ctrl-C (drains, then exits)".into(),
            }
        ));
        say(&header);
        let started = tokio::time::Instant::now();
        let totals = Arc::new(Mutex::new(Totals::default()));
        let (stop_load, load_stopped) = tokio::sync::watch::channel(false);
        let load_task = arrivals.map(|a| {
            tokio::spawn(load::drive(
                traffic,
                a,
                load_stopped,
                load::GRACE,
                totals.clone(),
            ))
        });
        let report = running.report.clone();
        let every = args.summary_every;
        let summaries = {
            let say = say.clone();
            tokio::spawn(async move {
                if every.is_zero() {
                    return;
                }
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    say(&summary(&report.dashboard(), started.elapsed()));
                }
            })
        };
        let until = async {
            match args.duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let gone = out_gone.load(std::sync::atomic::Ordering::Relaxed);
        if !gone {
            tokio::select! {
                () = until => {}
                () = super::shutdown_signal() => super::note("gpuscale up: stopping"),
                () = stop_printing.notified() => {
                    super::note("gpuscale up: standard output closed; stopping");
                }
            }
        }
        // The summaries go on while the load's last answers arrive (a
        // model scaling from zero can take its start-up time to answer).
        let _ = stop_load.send(true);
        // (Aborted and awaited: a summary being written on another worker
        // does not land after the totals.)
        let summaries = async move {
            summaries.abort();
            let _ = summaries.await;
        };
        if let Some(t) = load_task {
            let _ = t.await;
            let t = totals.lock().unwrap_or_else(|e| e.into_inner()).clone();
            summaries.await;
            say(&format!("{}\n", t.line()));
        } else {
            summaries.await;
        }
        say(&summary(&running.report.dashboard(), started.elapsed()));
        super::note("gpuscale up: draining replicas");
        running.stop().await;
        Ok(if out_gone.load(std::sync::atomic::Ordering::Relaxed) {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        })
    })
}
