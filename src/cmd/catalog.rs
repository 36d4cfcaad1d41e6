//! `gpuscale catalog [--mig MODEL]`: the GPU catalogue and MIG geometries.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use gpuscale_policies::{Catalog, load_paths, mig};
use serde::Serialize;

/// Arguments of `catalog`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// List the valid MIG geometries of this GPU model.
    #[arg(long, value_name = "MODEL")]
    pub mig: Option<String>,
    /// With --mig: only the maximal geometries (one per profile multiset).
    #[arg(long, requires = "mig")]
    pub maximal: bool,
    /// A cluster file whose catalogue overrides apply.
    #[arg(long)]
    pub cluster: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = super::Format::Table)]
    pub format: super::Format,
}

#[derive(Serialize)]
struct GeometryRow {
    placements: Vec<gpuscale_policies::Placement>,
    maximal: bool,
}

/// Prints the catalogue or the geometries.
pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let catalog = match &args.cluster {
        // A file with problems: each located, exit 1, as `plan` and
        // `validate` report them.
        Some(path) => match load_paths(std::slice::from_ref(path)) {
            Ok(b) if b.cluster.is_some() => b.catalog,
            Ok(_) => bail!("--cluster {}: no `kind: Cluster` document", path.display()),
            Err(problems) => return Ok(super::report_problems(&problems.0)),
        },
        None => Catalog::builtin(),
    };
    let Some(name) = &args.mig else {
        if args.format == super::Format::Table {
            super::emit(&format!(
                "{catalog}\ncompute: dense BF16 TFLOPS ÷ 989 (1.0 = one H100-80GB); $/h: assumed \
                 on-demand price per GPU, override in the cluster file\n"
            ))?;
        } else {
            let models: Vec<_> = catalog.models().collect();
            super::print_data(&models, args.format)?;
        }
        return Ok(ExitCode::SUCCESS);
    };
    let Some(model) = catalog.get(name) else {
        bail!(
            "unknown GPU model `{name}`; the catalogue has: {}",
            catalog.names().join(", ")
        );
    };
    let Some(spec) = &model.mig else {
        bail!("{name} does not support MIG");
    };
    let maximal: BTreeSet<_> = mig::maximal_placements(spec).into_iter().collect();
    let geometries = if args.maximal {
        mig::maximal_geometries(spec)
    } else {
        mig::all_geometries(spec)
    };
    if args.format == super::Format::Table {
        let mut text = format!(
            "{name}: {} memory slots, {} compute slices; {} maximal geometries ({} maximal placements); {} valid geometries in all\n",
            spec.memory_slots,
            spec.compute_slices,
            mig::maximal_geometries(spec).len(),
            maximal.len(),
            mig::all_geometries(spec).len()
        );
        for g in &geometries {
            let mark = if maximal.contains(g) { "*" } else { " " };
            text.push_str(&format!("{mark} {g}\n"));
        }
        if !args.maximal {
            text.push_str("(* maximal: no further instance fits)\n");
        }
        super::emit(&text)?;
    } else {
        let rows: Vec<GeometryRow> = geometries
            .iter()
            .map(|g| GeometryRow {
                placements: g.placements().to_vec(),
                maximal: maximal.contains(g),
            })
            .collect();
        super::print_data(&rows, args.format)?;
    }
    Ok(ExitCode::SUCCESS)
}
