//! `gpuscale crd`: the ModelPolicy CustomResourceDefinition, generated from
//! the same Rust types the loader reads.

use std::process::ExitCode;

use gpuscale_policies::ModelPolicy;
use kube::CustomResourceExt;

/// Arguments of `crd`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output format.
    #[arg(long, value_enum, default_value_t = super::Format::Yaml)]
    pub format: super::Format,
}

/// Prints the CRD.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    super::print_data(&ModelPolicy::crd(), args.format)?;
    Ok(ExitCode::SUCCESS)
}
