//! `gpuscale`: the one binary. A thin shell over the library crates: it
//! parses the command line, sets up logging, and calls one command module.

mod agent;
mod cmd;
mod load;
mod logging;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

// The gateway allocates per request (headers, bodies, futures); mimalloc's
// thread-local free lists beat glibc malloc under that load.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Inference autoscaler and GPU packer for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "gpuscale", version, about, long_about = None)]
struct Cli {
    /// Log format on stderr (levels from RUST_LOG; default `warn`, with the
    /// autoscaler's decisions at `info`).
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text)]
    log_format: logging::LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The whole loop in one process on the embedded default: gateway,
    /// autoscaler, packer, simulated model servers and the dashboard
    /// (`examples/up/`; `--load burst` for built-in traffic).
    Up(Box<cmd::up::Args>),
    /// Pack model replicas onto MIG slices, time-sliced or MPS shares,
    /// fractional (HAMi) GPUs and whole GPUs (ILP), and training gangs
    /// beside them; print the plan, emit the NVIDIA and HAMi configuration.
    Plan(Box<cmd::plan::Args>),
    /// Show the training queue like `squeue --start`: running and pending
    /// jobs by priority, reserved starts, and why each job waits.
    Queue(cmd::queue::Args),
    /// Check cluster, model-policy, training-job and demand files; print every problem
    /// as `file:line:column: field: message`.
    Validate(cmd::validate::Args),
    /// Print the ModelPolicy CustomResourceDefinition (apply it with kubectl).
    Crd(cmd::crd::Args),
    /// Print the GPU catalogue, or with --mig MODEL every valid MIG geometry.
    Catalog(cmd::catalog::Args),
    /// Run the gateway: per-model routing, admission queue, queue-depth
    /// metrics (`--config FILE`, see examples/gateway.yaml).
    Gateway(cmd::gateway::Args),
    /// Run the autoscaler: queue- and SLO-driven replica counts, applied on
    /// the local backend (`--config FILE`, see examples/local/autoscaler.yaml).
    Autoscaler(cmd::autoscaler::Args),
    /// Run a simulated OpenAI-compatible model server (for trying the
    /// gateway, tests and benchmarks).
    SimServer(cmd::sim_server::Args),
    /// The node agent: this node's GPUs through NVML (model, memory, MIG
    /// instances and placements, utilisation, temperature, power, ECC) as
    /// JSON (`/v1/gpus`) and Prometheus metrics with DCGM's names
    /// (`/metrics`); `--fake FILE` serves a declared reading.
    Agent(cmd::agent::Args),
    /// Replay a scenario (a trace or generated load) through gpuscale, HPA,
    /// KEDA, Knative and static provisioning in simulated time; write
    /// report.json, report.md and its plots (SVG and PNG).
    Simulate(cmd::simulate::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let result = match cli.command {
        Command::Up(args) => cmd::up::run(&args),
        Command::Plan(args) => cmd::plan::run(&args),
        Command::Queue(args) => cmd::queue::run(&args),
        Command::Validate(args) => cmd::validate::run(&args),
        Command::Crd(args) => cmd::crd::run(&args),
        Command::Catalog(args) => cmd::catalog::run(&args),
        Command::Gateway(args) => cmd::gateway::run(&args),
        Command::SimServer(args) => cmd::sim_server::run(&args),
        Command::Autoscaler(args) => cmd::autoscaler::run(&args),
        Command::Simulate(args) => cmd::simulate::run(&args),
        Command::Agent(args) => cmd::agent::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpuscale: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
