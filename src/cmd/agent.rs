//! `gpuscale agent`: the node agent (a DaemonSet on GPU nodes) serving
//! the node's GPUs as JSON and Prometheus metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::agent::{self, Source};

/// Arguments of `agent`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to serve on (read-only: `/v1/gpus`, `/metrics`,
    /// `/healthz`, `/readyz`). In a DaemonSet, `0.0.0.0:9401`.
    #[arg(long, default_value = "127.0.0.1:9401")]
    pub listen: SocketAddr,
    /// The node's name (in Kubernetes, from the downward API).
    #[arg(long, env = "NODE_NAME")]
    pub node: Option<String>,
    /// Serve this declared reading (JSON or YAML, as `/v1/gpus` answers)
    /// instead of reading NVML: for tests and demos.
    #[arg(long)]
    pub fake: Option<PathBuf>,
    /// Print one reading as JSON and exit.
    #[arg(long)]
    pub once: bool,
}

fn node_name(args: &Args) -> String {
    args.node
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Runs the agent until SIGINT/SIGTERM.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let node = node_name(args);
    let source = match &args.fake {
        Some(f) => {
            let text = match std::fs::read_to_string(f) {
                Ok(t) => t,
                // An input that cannot be read, or does not parse, is a
                // located problem: exit 1 (the README's exit codes).
                Err(e) => {
                    eprintln!("{}:1:1: cannot read: {e}", f.display());
                    return Ok(ExitCode::from(1));
                }
            };
            let de = serde_yaml_ng::Deserializer::from_str(&text);
            match serde_path_to_error::deserialize::<_, gpuscale_policies::devices::NodeGpus>(de) {
                // `--node` (or NODE_NAME) names the node the reading is
                // served for; without it, the file's own name stands.
                Ok(mut r) => {
                    if let Some(n) = &args.node {
                        r.node = n.clone();
                    }
                    Source::Fake(r)
                }
                Err(e) => {
                    let at = e
                        .inner()
                        .location()
                        .map(|l| format!(":{}:{}", l.line(), l.column()))
                        .unwrap_or_default();
                    let path = e.path().to_string();
                    let mut message = e.inner().to_string();
                    if let Some(i) = message.rfind(" at line ") {
                        message.truncate(i);
                    }
                    let message = gpuscale_policies::load::plain_words(
                        message
                            .strip_prefix(&format!("{path}: "))
                            .unwrap_or(&message)
                            .to_string(),
                    );
                    eprintln!("{}{at}: {path}: {message}", f.display());
                    return Ok(ExitCode::from(1));
                }
            }
        }
        None => match agent::open() {
            Ok(nvml) => Source::Nvml(std::sync::Arc::new(nvml), node.clone()),
            Err(e) => {
                eprintln!("gpuscale agent: {e}");
                return Ok(ExitCode::from(3));
            }
        },
    };
    if args.once {
        let reading = match &source {
            Source::Fake(r) => r.clone(),
            Source::Nvml(nvml, node) => match agent::read(nvml, node) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("gpuscale agent: {e}");
                    return Ok(ExitCode::from(3));
                }
            },
        };
        super::emit(&format!("{}\n", serde_json::to_string_pretty(&reading)?))?;
        return Ok(ExitCode::SUCCESS);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("gpuscale agent: binding {}: {e}", args.listen);
                return Ok(ExitCode::from(2));
            }
        };
        let serving = match &source {
            Source::Fake(r) => r.node.clone(),
            Source::Nvml(_, n) => n.clone(),
        };
        println!(
            "gpuscale agent: node {serving}, listening on http://{}",
            listener.local_addr()?
        );
        agent::serve(listener, source, super::shutdown_signal()).await;
        Ok(ExitCode::SUCCESS)
    })
}
