//! `gpuscale gateway --config FILE`: run the gateway until SIGINT/SIGTERM,
//! then drain requests in flight.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `gateway`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The `kind: Gateway` file (see `examples/gateway.yaml`).
    #[arg(long)]
    pub config: PathBuf,
    /// Traffic listener, overriding the file's `spec.listen`.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Admin listener, overriding the file's `spec.admin`.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// File holding the admin API's bearer token (a mounted Secret),
    /// overriding the file's `spec.adminTokenFile`. Without a token the
    /// replica list cannot be changed over the API, and the admin
    /// listener must be on loopback.
    #[arg(long, env = "GPUSCALE_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
}

/// Runs the command: exit 1 on a bad config, 0 after a clean shutdown.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut settings = match gpuscale_gateway::config::load(&args.config) {
        Ok(s) => s,
        Err(problems) => return Ok(super::report_load_problems(&problems.0)),
    };
    if let Some(l) = args.listen {
        settings.spec.listen = l;
    }
    if let Some(a) = args.admin {
        settings.spec.admin = a;
    }
    if let Err(message) = super::one_port_each(&[
        ("--listen (spec.listen)", settings.spec.listen),
        ("--admin (spec.admin)", settings.spec.admin),
    ]) {
        eprintln!("{message}");
        return Ok(ExitCode::from(2));
    }
    if let Some(f) = &args.admin_token_file {
        match gpuscale_gateway::auth::AdminToken::from_file(f) {
            Ok(t) => settings.admin_token = Some(t),
            Err(e) => {
                // Given by the flag or, without it, by the environment.
                let from = if std::env::args_os().any(|a| {
                    a.to_string_lossy()
                        .split('=')
                        .next()
                        .is_some_and(|f| f == "--admin-token-file")
                }) {
                    "--admin-token-file"
                } else {
                    "GPUSCALE_ADMIN_TOKEN_FILE"
                };
                eprintln!("{from}: {e}");
                return Ok(ExitCode::from(1));
            }
        }
    }
    // Refused here, named by its file, rather than by the server's start.
    if let Err(why) = settings.check_exposure() {
        eprintln!("{}: {why}", args.config.display());
        return Ok(ExitCode::from(2));
    }
    // One event loop per thread: this one runs the first traffic worker,
    // the admin listener and the scraper; the gateway starts the others.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let running = gpuscale_gateway::start(settings).await?;
        println!(
            "gateway: traffic on http://{}, admin on http://{} ({} models)",
            running.traffic,
            running.admin,
            running.shared.models.len()
        );
        super::shutdown_signal().await;
        eprintln!("gateway: shutting down, draining requests in flight");
        running.shutdown().await;
        Ok(ExitCode::SUCCESS)
    })
}
