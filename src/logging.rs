//! Logging through `tracing`: `RUST_LOG` picks levels, `--log-format json`
//! writes one JSON object per line for machines.

use std::io::IsTerminal;

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber, writing to stderr.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        // Decisions (what the autoscaler did and why) are news: info by
        // default; everything else only when it is a warning. The `highs`
        // crate warns whenever HiGHS stops at a limit the packer set (phase
        // 2's node limit), which is the plan working as meant.
        .unwrap_or_else(|_| {
            EnvFilter::new("warn,gpuscale_autoscaler::controller=info,highs=error")
        });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only for a terminal, never in files or pipes.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
