//! `gpuscale autoscaler --config FILE`: the controller with the local
//! backend; with `spec.gateway.config` the gateway runs in the same process
//! (the embedded default).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use gpuscale_autoscaler::backend;
use gpuscale_autoscaler::controller::Controller;
use gpuscale_autoscaler::kubernetes::Kube;
use gpuscale_autoscaler::local::LocalBackend;
use gpuscale_autoscaler::observe::GatewayClient;
use gpuscale_gateway::auth::AdminToken;

/// Arguments of `autoscaler`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The `kind: Autoscaler` file (see `examples/local/autoscaler.yaml`).
    #[arg(long)]
    pub config: PathBuf,
    /// Where replicas run: `local` (simulated model servers on this
    /// machine) or `kube` (the cluster of the current kubeconfig or
    /// in-cluster service account).
    #[arg(long, value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,
    /// Kubernetes backend: log every write instead of sending it.
    #[arg(long)]
    pub dry_run: bool,
    /// Admin listener, overriding the file's `spec.admin`.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// KEDA external scaler (gRPC) listener, overriding `spec.keda`.
    #[arg(long)]
    pub keda: Option<SocketAddr>,
    /// The embedded gateway's traffic listener, overriding its
    /// `spec.listen`.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// The embedded gateway's admin listener, overriding its `spec.admin`.
    #[arg(long)]
    pub gateway_admin: Option<SocketAddr>,
    /// File holding the gateway's admin token, overriding
    /// `spec.gateway.adminTokenFile` (and, for the embedded gateway, its
    /// own `spec.adminTokenFile`).
    #[arg(long, env = "GPUSCALE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
}

/// Backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Simulated model servers as local processes, registered with the
    /// gateway.
    Local,
    /// Deployments per placement variant, `/scale`, MIG node labels,
    /// status, Events, a Lease; EndpointSlices feed the gateway.
    Kube,
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
    let mut gateway_settings = match &settings.spec.gateway.config {
        Some(file) => match gpuscale_gateway::config::load(file) {
            Ok(s) => Some(s),
            Err(p) => return Ok(print_problems(&p)),
        },
        None => None,
    };
    if let Some(k) = args.keda {
        settings.spec.keda = Some(k);
    }
    match gateway_settings.as_mut() {
        Some(g) => {
            if let Some(l) = args.listen {
                g.spec.listen = l;
            }
            if let Some(a) = args.gateway_admin {
                g.spec.admin = a;
            }
        }
        None if args.listen.is_some() || args.gateway_admin.is_some() => {
            eprintln!(
                "--listen and --gateway-admin apply to the embedded gateway (spec.gateway.config)"
            );
            return Ok(ExitCode::from(1));
        }
        None => {}
    }
    // The admin token: the flag (or its variable), the file's, the
    // embedded gateway's own; an embedded gateway with none gets one made
    // up for this run, so its replica list is never open.
    let token_file = args
        .admin_token_file
        .clone()
        .or_else(|| settings.spec.gateway.admin_token_file.clone())
        .or_else(|| {
            gateway_settings
                .as_ref()
                .and_then(|g| g.spec.admin_token_file.clone())
        });
    let mut secret = match &token_file {
        Some(f) => {
            let token = match AdminToken::from_file(f) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("admin token: {e}");
                    return Ok(ExitCode::from(1));
                }
            };
            if let Some(g) = gateway_settings.as_mut() {
                g.admin_token = Some(token);
            }
            Some(std::fs::read_to_string(f)?.trim().to_string())
        }
        None => None,
    };
    if let (Some(g), None) = (gateway_settings.as_mut(), &secret) {
        let (token, s) = AdminToken::generate().map_err(anyhow::Error::msg)?;
        g.admin_token = Some(token);
        secret = Some(s);
    }
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
        let client = match &secret {
            Some(s) => GatewayClient::new(&base).with_token(s)?,
            None => GatewayClient::new(&base),
        };
        let backend = match args.backend {
            Backend::Local => {
                anyhow::ensure!(
                    !settings.models.is_empty(),
                    "the local backend needs spec.policies"
                );
                backend::Backend::Local(LocalBackend::new(
                    exe,
                    client.clone(),
                    settings.spec.local.clone(),
                ))
            }
            Backend::Kube => {
                let kube_client = kube::Client::try_default()
                    .await
                    .context("connecting to Kubernetes (kubeconfig or in-cluster)")?;
                let identity = std::env::var("POD_NAME")
                    .unwrap_or_else(|_| format!("gpuscale-{}", std::process::id()));
                let k = Kube::new(
                    kube_client,
                    settings.spec.kubernetes.clone(),
                    identity,
                    args.dry_run,
                );
                if settings.models.is_empty() {
                    let catalog = gpuscale_policies::Catalog::builtin();
                    for p in k.policies().await? {
                        match gpuscale_policies::Model::from_policy(&p, &catalog) {
                            Ok(m) => settings.models.push(m),
                            Err(errors) => {
                                for e in errors {
                                    eprintln!(
                                        "ModelPolicy {}: {}: {}",
                                        p.metadata.name.clone().unwrap_or_default(),
                                        e.path,
                                        e.message
                                    );
                                }
                            }
                        }
                    }
                    anyhow::ensure!(
                        !settings.models.is_empty(),
                        "no valid ModelPolicy in namespace {}",
                        settings.spec.kubernetes.namespace
                    );
                }
                backend::Backend::Kube(backend::KubeBackend::new(k, client.clone()))
            }
        };
        let admin_addr = settings.spec.admin;
        let models = settings.models.len();
        let settings_keda = settings.spec.keda;
        let keda_models = settings.models.clone();
        let client_for_keda = client.clone();
        anyhow::ensure!(
            args.backend == Backend::Kube || !args.dry_run,
            "--dry-run applies to --backend kube"
        );
        let controller = Controller::new(settings, client, backend);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (admin, admin_task) =
            gpuscale_autoscaler::admin::serve(admin_addr, controller.report(), stopped.clone())
                .await
                .with_context(|| format!("binding {admin_addr}"))?;
        println!(
            "autoscaler: {models} models, {} backend, admin on http://{admin} (/v1/decisions, /metrics)",
            match args.backend {
                Backend::Local => "local",
                Backend::Kube if args.dry_run => "kube (dry run)",
                Backend::Kube => "kube",
            }
        );
        let keda_task = match settings_keda {
            Some(addr) => {
                let keda = gpuscale_autoscaler::keda::Keda::new(client_for_keda, keda_models);
                let (bound, task) = gpuscale_autoscaler::keda::serve(addr, keda, stopped.clone())
                    .await
                    .with_context(|| format!("binding {addr}"))?;
                println!("autoscaler: KEDA external scaler (gRPC) on {bound}");
                Some(task)
            }
            None => None,
        };
        let run = tokio::spawn(controller.run(stopped));
        super::shutdown_signal().await;
        eprintln!("autoscaler: stopping replicas");
        let _ = stop.send(true);
        let _ = run.await;
        let _ = admin_task.await;
        if let Some(t) = keda_task {
            let _ = t.await;
        }
        if let Some(g) = gateway {
            g.shutdown().await;
        }
        Ok(ExitCode::SUCCESS)
    })
}
