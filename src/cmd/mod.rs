//! One module per subcommand; each exposes `Args` (clap) and `run`.

pub mod agent;
pub mod autoscaler;
pub mod catalog;
pub mod crd;
pub mod gateway;
pub mod plan;
pub mod queue;
pub mod sim_server;
pub mod simulate;
pub mod up;
pub mod validate;

/// Output formats shared by the commands that print data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table for people.
    Table,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// Reports located problems on stderr, each on its own line, then their
/// count, and gives the exit code of bad input (1). Stdout stays for the
/// command's data: `plan --format json > plan.json` never writes errors
/// into the plan.
/// Whether a single-document file's load failed only because it is not
/// the document its flag asks for (another `kind`, or not exactly one
/// document): a usage error, exit 2, as `plan --demand` with no `kind:
/// Demand` is, though still printed with its place in the file.
pub fn wrong_document(problems: &[gpuscale_policies::document::Problem]) -> bool {
    !problems.is_empty()
        && problems.iter().all(|p| {
            p.path == "kind" || (p.path.is_empty() && p.message.starts_with("expected one `kind: "))
        })
}

/// [`report_problems`] for a config file's load: exit 2 where the file
/// is not the document asked for ([`wrong_document`]), else 1.
pub fn report_load_problems(
    problems: &[gpuscale_policies::document::Problem],
) -> std::process::ExitCode {
    let code = report_problems(problems);
    if wrong_document(problems) {
        std::process::ExitCode::from(2)
    } else {
        code
    }
}

pub fn report_problems<P: std::fmt::Display>(problems: &[P]) -> std::process::ExitCode {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    for p in problems {
        let _ = writeln!(err, "{p}");
    }
    let _ = writeln!(err, "{} problem(s) found", problems.len());
    std::process::ExitCode::from(1)
}

/// Two listeners given one address (port 0, "any free one", excepted):
/// the clash named by the flags (or fields) that set them, not a bare
/// "address in use" when the second one binds.
pub fn one_port_each(listeners: &[(&str, std::net::SocketAddr)]) -> Result<(), String> {
    for (i, (fa, a)) in listeners.iter().enumerate() {
        for (fb, b) in &listeners[i + 1..] {
            if a == b && a.port() != 0 {
                return Err(format!(
                    "{fa} and {fb} are both {a}: give each its own port"
                ));
            }
        }
    }
    Ok(())
}

/// Writes text to stdout; a reader that went away (`gpuscale … | head`)
/// ends the output quietly instead of panicking.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// A line on stderr that may find it closed (`gpuscale up 2>&1 | head`):
/// `eprintln!` would panic there, mid-run, before the drain.
pub fn note(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Writes text to stdout as a long-running command prints it: `false`
/// when the write failed (the reader went away: `gpuscale up | head`),
/// which that command takes as a reason to stop.
pub fn say(text: &str) -> bool {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

/// Writes a serialisable value as JSON or YAML to stdout.
pub fn print_data<T: serde::Serialize>(value: &T, format: Format) -> anyhow::Result<()> {
    match format {
        Format::Json => emit(&format!("{}\n", serde_json::to_string_pretty(value)?)),
        Format::Yaml | Format::Table => emit(&gpuscale_packer::emit::to_yaml(value)?),
    }
}

/// Resolves on SIGINT or SIGTERM (what Kubernetes sends before killing a
/// pod).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
