//! `gpuscale crd`: the ModelPolicy CustomResourceDefinition, generated from
//! the same Rust types the loader reads.

use std::process::ExitCode;

use gpuscale_policies::ModelPolicy;
use kube::CustomResourceExt;

/// Arguments of `crd`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output format (a manifest: no table).
    #[arg(long, value_enum, default_value_t = CrdFormat::Yaml)]
    pub format: CrdFormat,
}

/// The formats a manifest is printed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CrdFormat {
    /// YAML (`kubectl apply -f -`).
    Yaml,
    /// JSON.
    Json,
}

/// Prints the CRD.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let format = match args.format {
        CrdFormat::Yaml => super::Format::Yaml,
        CrdFormat::Json => super::Format::Json,
    };
    super::print_data(&ModelPolicy::crd(), format)?;
    Ok(ExitCode::SUCCESS)
}
