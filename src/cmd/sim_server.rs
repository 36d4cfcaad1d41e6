//! `gpuscale sim-server`: a simulated OpenAI-compatible model server.

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use anyhow::Context;
use gpuscale_gateway::sim::{self, SimProfile};
use gpuscale_policies::serving::ServiceProfile;

/// Arguments of `sim-server`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Port (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Latency profile: instant, small (8B model on a whole H100) or tiny.
    #[arg(long, default_value = "small", value_parser = clap::builder::PossibleValuesParser::new(SimProfile::NAMES))]
    pub profile: String,
    /// Model name it lists in /v1/models.
    #[arg(long, default_value = "sim")]
    pub model: String,
    /// Share of a GPU it runs on (1 = whole; 0.455 for a 3g MIG slice of
    /// an H100, its 60 of 132 SMs).
    #[arg(long, allow_negative_numbers = true)]
    pub speed: Option<f64>,
    /// Requests running at once (more wait inside).
    #[arg(long)]
    pub max_concurrency: Option<u32>,
    /// Output tokens per second for one request alone (0: no decode time,
    /// as the `instant` profile).
    #[arg(long, allow_negative_numbers = true)]
    pub decode_tps: Option<f64>,
    /// Prompt tokens per second (0: no prefill time).
    #[arg(long, allow_negative_numbers = true)]
    pub prefill_tps: Option<f64>,
    /// Tokens of KV cache for the prefix cache (0: none; `small` holds
    /// 442,368, an 8B model on an H100).
    #[arg(long)]
    pub prefix_cache_tokens: Option<u64>,
    /// A LoRA adapter it serves (repeat for more): requests naming it run
    /// as it and show in `vllm:lora_requests_info`.
    #[arg(long = "lora")]
    pub lora: Vec<String>,
    /// Exit when standard input closes: a parent that starts the server
    /// with a pipe takes it down when it exits, however it exits. Each
    /// line `speed S` read there sets the share of a GPU it runs on from
    /// then on, as `--speed` does at start (the local backend moves a
    /// replica this way); other lines are ignored. SIGINT and SIGTERM are
    /// then left to the parent: a Ctrl-C in the terminal reaches every
    /// process of its group, and the parent drains the server's requests
    /// before it stops it. Run by hand, it stops on end of input (Ctrl-D)
    /// or SIGKILL.
    #[arg(long)]
    pub exit_with_stdin: bool,
}

/// Runs the command until SIGINT/SIGTERM, or with `--exit-with-stdin`
/// until its standard input closes.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut p = SimProfile::named(&args.profile, &args.model).context("unknown profile")?;
    if let Some(s) = args.speed {
        anyhow::ensure!(s > 0.0 && s <= 1.0, "--speed must be in (0, 1], got {s}");
        p.speed = s;
    }
    if let Some(c) = args.max_concurrency {
        anyhow::ensure!(c > 0, "--max-concurrency must be at least 1");
        p.max_concurrency = c;
    }
    if let Some(d) = args.decode_tps {
        anyhow::ensure!(
            d == 0.0 || (d >= ServiceProfile::MIN_TPS && d.is_finite()),
            "--decode-tps must be 0 (no decode time) or at least {}, got {d}",
            ServiceProfile::MIN_TPS
        );
        p.decode_tps = d;
    }
    if let Some(d) = args.prefill_tps {
        anyhow::ensure!(
            d == 0.0 || (d >= ServiceProfile::MIN_TPS && d.is_finite()),
            "--prefill-tps must be 0 (no prefill time) or at least {}, got {d}",
            ServiceProfile::MIN_TPS
        );
        p.prefill_tps = d;
    }
    if let Some(t) = args.prefix_cache_tokens {
        p.prefix_cache_tokens = t;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        // Before it says where it listens: a parent may register it then.
        if args.exit_with_stdin {
            ignore_signals();
        }
        let server = sim::start_with_adapters(p, SocketAddr::new(args.host, args.port), &args.lora)
            .await
            .with_context(|| format!("binding {}:{}", args.host, args.port))?;
        println!("sim-server: listening on http://{}", server.addr);
        let lifeline = async {
            if args.exit_with_stdin {
                use tokio::io::AsyncBufReadExt;
                let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(speed) = parse_speed(&line)
                        && let Err(e) = server.set_speed(speed)
                    {
                        eprintln!("sim-server: {e}");
                    }
                }
            } else {
                std::future::pending::<()>().await;
            }
        };
        if args.exit_with_stdin {
            lifeline.await;
        } else {
            tokio::select! {
                _ = super::shutdown_signal() => {}
                _ = lifeline => {}
            }
        }
        server.stop().await;
        Ok(ExitCode::SUCCESS)
    })
}

/// Takes SIGINT and SIGTERM and does nothing with them (their default is
/// to end the process): the server's parent decides when it stops.
fn ignore_signals() {
    #[cfg(unix)]
    for kind in [
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::terminate(),
    ] {
        if let Ok(mut s) = tokio::signal::unix::signal(kind) {
            tokio::spawn(async move { while s.recv().await.is_some() {} });
        }
    }
}

/// The speed in a `speed S` line of standard input.
fn parse_speed(line: &str) -> Option<f64> {
    let mut words = line.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("speed"), Some(s), None) => s.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::parse_speed;

    #[test]
    fn a_speed_line_names_one_number() {
        assert_eq!(parse_speed("speed 0.4286"), Some(0.4286));
        assert_eq!(parse_speed("  speed   1 "), Some(1.0));
        assert_eq!(parse_speed("speed"), None);
        assert_eq!(parse_speed("speed 0.5 0.6"), None);
        assert_eq!(parse_speed("speed fast"), None);
        assert_eq!(parse_speed("pace 0.5"), None);
    }
}
