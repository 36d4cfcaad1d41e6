//! `gpuscale autoscaler --config FILE`: the controller with the local
//! backend; with `spec.gateway.config` the gateway runs in the same process
//! (the embedded default).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gpuscale_autoscaler::controller::Controller;
use gpuscale_autoscaler::local::LocalBackend;
use gpuscale_autoscaler::observe::GatewayClient;

/// Arguments of `autoscaler`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The `kind: Autoscaler` file (see `examples/local/autoscaler.yaml`).
    #[arg(long)]
    pub config: PathBuf,
    /// Where replicas run: `local` (simulated model servers on this
    /// machine).
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// Admin listener, overriding the file's `spec.admin`.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
}

/// Backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Simulated model servers as local processes, registered with the
    /// gateway.
    Local,
}

fn print_problems(problems: &gpuscale_policies::load::Problems) -> ExitCode {
    for p in &problems.0 {
        eprintln!("{p}");
    }
    eprintln!("{} problem(s) found", problems.0.len());
    ExitCode::from(1)
}

/// Runs until SIGINT/SIGTERM; stops every replica on the way out.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut settings = match gpuscale_autoscaler::config::load(&args.config) {
        Ok(s) => s,
        Err(p) => return Ok(print_problems(&p)),
    };
    if let Some(a) = args.admin {
        settings.spec.admin = a;
    }
    let gateway_settings = match &settings.spec.gateway.config {
        Some(file) => match gpuscale_gateway::config::load(file) {
            Ok(s) => Some(s),
            Err(p) => return Ok(print_problems(&p)),
        },
        None => None,
    };
    let exe = std::env::current_exe().context("locating the gpuscale binary")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let gateway = match gateway_settings {
            Some(g) => Some(gpuscale_gateway::start(g).await.context("starting the gateway")?),
            None => None,
        };
        let base = match (&gateway, &settings.spec.gateway.admin) {
            (Some(g), _) => format!("http://{}", g.admin),
            (None, Some(url)) => url.clone(),
            (None, None) => unreachable!("the loader requires one of config and admin"),
        };
        if let Some(g) = &gateway {
            println!(
                "gateway: traffic on http://{}, admin on http://{}",
                g.traffic, g.admin
            );
        }
        let client = GatewayClient::new(&base);
        let backend = LocalBackend::new(exe, client.clone(), settings.spec.local.clone());
        let admin_addr = settings.spec.admin;
        let models = settings.models.len();
        let controller = Controller::new(settings, client, backend);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (admin, admin_task) =
            gpuscale_autoscaler::admin::serve(admin_addr, controller.report(), stopped.clone())
                .await
                .with_context(|| format!("binding {admin_addr}"))?;
        println!("autoscaler: {models} models, local backend, admin on http://{admin} (/v1/decisions, /metrics)");
        let run = tokio::spawn(controller.run(stopped));
        super::shutdown_signal().await;
        eprintln!("autoscaler: stopping replicas");
        let _ = stop.send(true);
        let _ = run.await;
        let _ = admin_task.await;
        if let Some(g) = gateway {
            g.shutdown().await;
        }
        Ok(ExitCode::SUCCESS)
    })
}
