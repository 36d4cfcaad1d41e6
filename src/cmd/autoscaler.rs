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

/// How long start-up waits for the API server to list the ModelPolicies
/// before it gives up (a control-plane blip, not a misconfiguration):
/// within the controller's startup probe (60 s), so the process exits
/// with the error rather than being killed without it.
const STARTUP_RETRY: std::time::Duration = std::time::Duration::from_secs(50);

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
    super::report_load_problems(&problems.0)
}

/// Who this process is in the leader election: the pod's name from the
/// downward API (`POD_NAME`), else the host name with a random suffix
/// (a process id is 1 in every container, so it names no one).
fn identity() -> String {
    // std seeds each RandomState from the operating system's randomness.
    use std::hash::{BuildHasher, Hasher};
    let suffix = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    match std::env::var("POD_NAME") {
        Ok(p) if !p.is_empty() => p,
        _ => {
            let host = std::env::var("HOSTNAME")
                .ok()
                .filter(|h| !h.is_empty())
                .or_else(|| {
                    std::fs::read_to_string("/etc/hostname")
                        .ok()
                        .map(|h| h.trim().to_string())
                })
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "gpuscale".into());
            format!("{host}-{:08x}", suffix as u32)
        }
    }
}

/// The token for the gateway's admin API: the flag (or its variable), the
/// file's, the embedded gateway's own; an embedded gateway with none gets
/// one made up for this run, so its replica list is never open. `Err`
/// holds the message for a token file that cannot be read.
pub(crate) fn admin_secret(
    flag: Option<&std::path::Path>,
    settings: &gpuscale_autoscaler::config::Settings,
    gateway_settings: &mut Option<gpuscale_gateway::Settings>,
) -> anyhow::Result<Result<Option<String>, String>> {
    let token_file = flag
        .map(std::path::Path::to_path_buf)
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
                Err(e) => return Ok(Err(format!("admin token: {e}"))),
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
    Ok(Ok(secret))
}

/// The loop running: the embedded gateway (if any), the controller, its
/// admin listener (with the dashboard) and KEDA's scaler.
pub(crate) struct Loop {
    /// The embedded gateway.
    pub gateway: Option<gpuscale_gateway::Running>,
    /// Where the autoscaler's admin listener (and the dashboard) is.
    pub admin: SocketAddr,
    /// Where KEDA's external scaler is.
    pub keda: Option<SocketAddr>,
    /// What the admin listener shows.
    pub report: gpuscale_autoscaler::controller::Report,
    stop: tokio::sync::watch::Sender<bool>,
    run: tokio::task::JoinHandle<()>,
    admin_task: tokio::task::JoinHandle<()>,
    keda_task: Option<tokio::task::JoinHandle<()>>,
}

impl Loop {
    /// Starts the gateway (when embedded), the backend, the controller and
    /// the listeners.
    pub(crate) async fn start(
        mut settings: gpuscale_autoscaler::config::Settings,
        gateway_settings: Option<gpuscale_gateway::Settings>,
        secret: Option<String>,
        kind: Backend,
        dry_run: bool,
    ) -> anyhow::Result<Loop> {
        let exe = std::env::current_exe().context("locating the gpuscale binary")?;
        let gateway = match gateway_settings {
            Some(g) => Some(
                gpuscale_gateway::start(g)
                    .await
                    .context("starting the gateway")?,
            ),
            None => None,
        };
        let base = match (&gateway, &settings.spec.gateway.admin) {
            (Some(g), _) => format!("http://{}", g.admin),
            (None, Some(url)) => url.clone(),
            (None, None) => unreachable!("the loader requires one of config and admin"),
        };
        let mut bases = vec![base];
        bases.extend(settings.spec.gateway.instances.iter().cloned());
        let client = match &secret {
            Some(s) => GatewayClient::new_many(bases).with_token(s)?,
            None => GatewayClient::new_many(bases),
        };
        // An external gateway that will refuse every registration is a
        // start-up error, not a replica count stuck at 0 behind retries.
        if gateway.is_none() {
            client
                .check_admin_access()
                .await
                .context("the gateway's admin API")?;
        }
        let backend = match kind {
            Backend::Local => {
                anyhow::ensure!(
                    !settings.models.is_empty(),
                    "the local backend needs spec.policies"
                );
                let local = LocalBackend::new(exe, client.clone(), settings.spec.local.clone());
                // The gateway in this process is the only one: at exit
                // its list goes with it, and nothing is deregistered.
                backend::Backend::Local(
                    if gateway.is_some() && settings.spec.gateway.instances.is_empty() {
                        local.with_embedded_gateway()
                    } else {
                        local
                    },
                )
            }
            Backend::Kube => {
                // kube's error says every cause it tried in its own
                // message; its source chain would say them again.
                let kube_client = kube::Client::try_default().await.map_err(|e| {
                    anyhow::anyhow!("connecting to Kubernetes (kubeconfig or in-cluster): {e}")
                })?;
                let identity = identity();
                tracing::info!(%identity, "leader election identity");
                let k = Kube::new(
                    kube_client,
                    settings.spec.kubernetes.clone(),
                    identity,
                    dry_run,
                );
                let from_cluster = settings.models.is_empty();
                if from_cluster {
                    let catalog = gpuscale_policies::Catalog::builtin();
                    // Each object on its own: one that does not decode or
                    // validate is reported and the others go on.
                    // An API server that is briefly unreachable (a
                    // control-plane upgrade while this pod restarts) is
                    // waited for, 50 s at most, rather than exiting
                    // into CrashLoopBackOff's growing delays.
                    let started = std::time::Instant::now();
                    let mut wait = std::time::Duration::from_secs(1);
                    let listed = loop {
                        match k.policies().await {
                            Ok(l) => break l,
                            // Unreachable, or the server's own trouble; a
                            // refusal (RBAC, no CRD), an answer that does
                            // not decode or a bad credential is final at
                            // once, and no wait runs past STARTUP_RETRY.
                            Err(e) if e.transient() && started.elapsed() + wait < STARTUP_RETRY => {
                                tracing::warn!(
                                    retry_in_s = wait.as_secs(),
                                    "listing the ModelPolicies: {e}"
                                );
                                tokio::time::sleep(wait).await;
                                wait = (wait * 2).min(std::time::Duration::from_secs(15));
                            }
                            Err(e) => return Err(e.into()),
                        }
                    };
                    for listed in listed {
                        let p = match listed {
                            Ok(p) => p,
                            Err((name, e)) => {
                                eprintln!("ModelPolicy {name}: {e}");
                                continue;
                            }
                        };
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
                let mut kube_backend = backend::KubeBackend::new(k, client.clone());
                // Without a cluster file the inventory comes from the
                // nodes (GPU Feature Discovery's labels, the node agents'
                // readings); a cluster file overrides it.
                if settings.cluster.is_none() && settings.spec.kubernetes.pack {
                    kube_backend = kube_backend.inventory_from_nodes();
                }
                if let Some(d) = &settings.spec.gateway.discover {
                    kube_backend =
                        kube_backend.discovering_gateways(&d.service, &d.port, d.register);
                }
                // Policies from the cluster are watched: added, changed
                // and removed ones are taken up without a restart.
                backend::Backend::Kube(if from_cluster {
                    kube_backend.watching_policies()
                } else {
                    kube_backend
                })
            }
        };
        anyhow::ensure!(
            kind == Backend::Kube || !dry_run,
            "--dry-run applies to --backend kube"
        );
        let admin_addr = settings.spec.admin;
        let settings_keda = settings.spec.keda;
        let keda_models = settings.models.clone();
        let client_for_keda = client.clone();
        let controller = Controller::new(settings, client, backend);
        let report = controller.report();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let (admin, admin_task) =
            gpuscale_autoscaler::admin::serve(admin_addr, report.clone(), stopped.clone())
                .await
                .with_context(|| format!("binding {admin_addr}"))?;
        let (keda, keda_task) = match settings_keda {
            Some(addr) => {
                let keda = gpuscale_autoscaler::keda::Keda::new(client_for_keda, keda_models);
                let (bound, task) = gpuscale_autoscaler::keda::serve(addr, keda, stopped.clone())
                    .await
                    .with_context(|| format!("binding {addr}"))?;
                (Some(bound), Some(task))
            }
            None => (None, None),
        };
        let run = tokio::spawn(controller.run(stopped));
        Ok(Loop {
            gateway,
            admin,
            keda,
            report,
            stop,
            run,
            admin_task,
            keda_task,
        })
    }

    /// Stops the embedded gateway, then every replica (deregistered from
    /// the gateways still running, if any,
    /// drained) and the listeners. The gateway drains first, while the
    /// replicas still serve: `/readyz` and new requests get 503 (with
    /// `Retry-After`) at once, and what is queued or in flight finishes
    /// on the replicas. Stopped the other way round, requests that came
    /// after the signal queued for replicas already gone and got no
    /// answer at all.
    pub(crate) async fn stop(self) {
        if let Some(g) = self.gateway {
            g.shutdown().await;
        }
        let _ = self.stop.send(true);
        let _ = self.run.await;
        let _ = self.admin_task.await;
        if let Some(t) = self.keda_task {
            let _ = t.await;
        }
    }
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
            return Ok(ExitCode::from(2));
        }
        None => {}
    }
    let mut listeners = vec![("--admin (spec.admin)", settings.spec.admin)];
    if let Some(k) = settings.spec.keda {
        listeners.push(("--keda (spec.keda)", k));
    }
    if let Some(g) = &gateway_settings {
        listeners.push(("--listen (the gateway's spec.listen)", g.spec.listen));
        listeners.push(("--gateway-admin (the gateway's spec.admin)", g.spec.admin));
    }
    if let Err(message) = super::one_port_each(&listeners) {
        eprintln!("{message}");
        return Ok(ExitCode::from(2));
    }
    let secret = match admin_secret(
        args.admin_token_file.as_deref(),
        &settings,
        &mut gateway_settings,
    )? {
        Ok(s) => s,
        Err(message) => {
            eprintln!("{message}");
            return Ok(ExitCode::from(1));
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let models = settings.models.len();
        let running = Loop::start(
            settings,
            gateway_settings,
            secret,
            args.backend,
            args.dry_run,
        )
        .await?;
        if let Some(g) = &running.gateway {
            println!(
                "gateway: traffic on http://{}, admin on http://{}",
                g.traffic, g.admin
            );
        }
        println!(
            "autoscaler: {models} models, {} backend, admin on http://{} (dashboard at /, /v1/decisions, /metrics)",
            match args.backend {
                Backend::Local => "local",
                Backend::Kube if args.dry_run => "kube (dry run)",
                Backend::Kube => "kube",
            },
            running.admin
        );
        if let Some(k) = running.keda {
            println!("autoscaler: KEDA external scaler (gRPC) on {k}");
        }
        super::shutdown_signal().await;
        eprintln!("autoscaler: stopping replicas");
        running.stop().await;
        Ok(ExitCode::SUCCESS)
    })
}
