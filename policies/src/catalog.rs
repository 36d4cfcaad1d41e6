//! The GPU catalogue: what each GPU model offers (memory, relative compute,
//! MIG profiles and their placement rules, price).
//!
//! The built-in catalogue ([`Catalog::builtin`]) encodes the NVIDIA MIG User
//! Guide tables from DESIGN.md. A cluster file can override any field of a
//! built-in model or add new models ([`crate::inventory::GpuModelOverride`]).
//!
//! ## Where the numbers come from
//! - **Memory** (`memory_gib`): `nvidia-smi --query-gpu=memory.total` in MiB
//!   ÷ 1024. **Usable** memory of a whole GPU is that minus 0.4 GiB kept by the
//!   driver and CUDA context (an assumption, chosen so that a whole
//!   H100-80GB's usable memory equals its `7g.80gb` instance's 79.25 GiB).
//! - **Relative compute** (`compute`): dense (no sparsity) BF16/FP16
//!   tensor-core TFLOPS from NVIDIA's data sheets divided by the H100-80GB
//!   SXM's 989 TFLOPS, so **1.0 = one H100-80GB**. A model policy's compute
//!   need is expressed in the same unit.
//! - **MIG usable memory** (what `nvidia-smi mig -lgip` prints per GPU
//!   instance profile):
//!   - H100-80GB: measured, from the MIG User Guide's `-lgip` listing
//!     (1g.10gb 9.75, 1g.20gb 19.62, 2g.20gb 19.62, 3g.40gb 39.50, 4g.40gb
//!     39.50, 7g.80gb 79.25 GiB).
//!   - A100-SXM4-40GB: measured, from public `nvidia-smi mig -lgip` output
//!     of that product (1g.5gb 4.75, 1g.10gb and 2g.10gb 9.75, 3g.20gb and
//!     4g.20gb 19.62, 7g.40gb 39.38 GiB).
//!   - H200-141GB: measured on a real NVIDIA H200 (driver 580.159.04,
//!     2026-12-04; the recorded `nvidia-smi mig -lgip`/`-lgipp` output and
//!     `gpuscale agent --once` reading are in `tests/data/nvidia-h200/`):
//!     1g.18gb 16.00, 1g.35gb and 2g.35gb 32.50, 3g.71gb and 4g.71gb
//!     69.75, 7g.141gb 140.00 GiB. The placements and instance counts
//!     match the 8-slot rules below. Its whole-GPU usable memory is
//!     measured too: 143,771 MiB less the 616 MiB the driver reserves
//!     (NVML's `reserved`) with MIG off, 139.79 GiB: under the 140.00
//!     that `-lgip` lists for its 7g instance.
//!   - The other models: H100's usable fraction of the profile's nominal
//!     size, an assumption.
//!
//!   Where the assumption and the hardware may differ, override `usableGiB`
//!   in the cluster file. A replica planned into a slice it does not fit
//!   fails with an out-of-memory error, so round down.
//! - **MIG compute** (`compute_fraction`): the streaming multiprocessors
//!   (SMs) of the instance, from the `SM` column of `nvidia-smi mig -lgip`,
//!   divided by the SMs of the whole GPU with MIG off. A slice is not a
//!   seventh of the GPU: Hopper's 1g instance has 16 of 132 SMs (0.121, not
//!   0.143), its 4g 64 (0.485, not 0.571) and its 3g 60 (0.455, not 0.429);
//!   on Ampere the 7g instance has 98 of the A100's 108 SMs.
//!   - Hopper (H100-80GB, H200-141GB), 132 SMs: 1g 16, 1g with two memory
//!     slots 26, 2g 32, 3g 60, 4g 64, 7g 132. Measured on a real H200 (the
//!     recorded `-lgip` in `tests/data/nvidia-h200/`) and the same in the
//!     MIG User Guide's H100-80GB listing.
//!   - Ampere (A100-40GB, A100-80GB), 108 SMs: 1g 14 (with one or two
//!     memory slots), 2g 28, 3g 42, 4g 56, 7g 98, from public `-lgip`
//!     output of A100s.
//!   - A30-24GB, 56 SMs: 1g 14, 2g 28, 4g 56 (a quarter per slice).
//!   - H100-94GB (H100 NVL, 132 SMs) and B200: Hopper's fractions, an
//!     assumption until measured.
//! - **Price** (`price_per_hour`): an **assumption** — a round, typical 2025
//!   cloud on-demand price per GPU in USD. Every deployment should override it
//!   with its own cost; the packer only compares prices, it never bills.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// Relative compute of the reference GPU (H100-80GB SXM, 989 dense BF16 TFLOPS).
pub const REFERENCE_TFLOPS: f64 = 989.0;

/// Memory kept by the driver and CUDA context on a whole GPU, GiB (assumption).
pub const WHOLE_GPU_RESERVED_GIB: f64 = 0.4;

/// Whole-GPU usable memory measured on real GPUs, GiB: total less what the
/// driver reserves (NVML's `reserved`), rounded down to hundredths. H200:
/// (143,771 − 616) MiB on driver 580.159.04.
const MEASURED_WHOLE_USABLE_GIB: &[(&str, f64)] = &[("H200-141GB", 139.79)];

/// One MIG GPU-instance profile of a GPU model, e.g. `3g.40gb` on H100-80GB.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigProfile {
    /// NVIDIA's name, e.g. `1g.10gb`, `1g.10gb+me`, `7g.80gb`.
    pub name: String,
    /// Compute slices (the `Ng` in the name).
    pub compute_slices: u8,
    /// Memory slots the instance occupies.
    pub memory_slots: u8,
    /// Memory usable by a process in the instance, GiB.
    pub usable_gib: f64,
    /// Allowed start slots (`nvidia-smi mig -lgipp`).
    pub starts: Vec<u8>,
    /// Whether this is a `+me` profile (takes the GPU's media extensions;
    /// at most one per GPU).
    pub media_extensions: bool,
    /// The instance's share of the whole GPU's compute: its SMs over the
    /// GPU's with MIG off (see the module docs), not `compute_slices / 7`.
    pub compute_fraction: f64,
}

impl MigProfile {
    /// The compute of one instance, in the catalogue's unit (1.0 = one
    /// H100-80GB), on a GPU whose whole compute is `gpu_compute`.
    pub fn compute(&self, gpu_compute: f64) -> f64 {
        gpu_compute * self.compute_fraction
    }

    /// The device-plugin resource name in the "mixed" strategy,
    /// e.g. `nvidia.com/mig-3g.40gb`.
    pub fn resource_name(&self) -> String {
        format!("nvidia.com/mig-{}", self.name)
    }
}

/// The MIG capability of a GPU model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MigSpec {
    /// Memory slots of the whole GPU (8 on A100/H100/H200/B200, 4 on A30).
    pub memory_slots: u8,
    /// Compute slices of the whole GPU (7, or 4 on A30).
    pub compute_slices: u8,
    /// The profiles, in catalogue order (smallest first).
    pub profiles: Vec<MigProfile>,
}

impl MigSpec {
    /// Looks a profile up by its NVIDIA name.
    pub fn profile(&self, name: &str) -> Option<&MigProfile> {
        self.profiles.iter().find(|p| p.name == name)
    }
}

/// One GPU model of the catalogue.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GpuModel {
    /// Catalogue name, e.g. `H100-80GB`.
    pub name: String,
    /// Total memory as the driver reports it, GiB.
    pub memory_gib: f64,
    /// Memory usable by one process on the whole GPU, GiB.
    pub usable_gib: f64,
    /// Relative compute, 1.0 = one H100-80GB (see the module docs).
    pub compute: f64,
    /// Default price per GPU-hour, USD (an assumption unless overridden).
    pub price_per_hour: f64,
    /// The `nvidia.com/gpu.product` label value GPU feature discovery sets.
    pub product: String,
    /// MIG capability, `None` for GPUs without MIG.
    pub mig: Option<MigSpec>,
    /// Whether a node's GPUs of this model are joined by NVLink (SXM
    /// boards: NVSwitch or an NVLink mesh), so that a node is an NVLink
    /// domain of its own when it declares none. PCIe cards are not (a
    /// bridge joins two at most).
    pub nvlink: bool,
}

impl GpuModel {
    /// Whether the model can be partitioned with MIG.
    pub fn mig_capable(&self) -> bool {
        self.mig.is_some()
    }
}

/// The GPU catalogue: models by name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Catalog {
    models: BTreeMap<String, GpuModel>,
}

/// Nominal sizes (GB in the profile name) of a MIG GPU for instances of
/// 1, 2, 4 and 8 memory slots, e.g. H100-80GB `[10, 20, 40, 80]`.
struct MigNames {
    one: u32,
    two: u32,
    four: u32,
    eight: u32,
}

/// H100-80GB's measured usable GiB per nominal GB, by memory slots (1, 2, 4, 8).
const H100_USABLE_FRACTION: [(u8, f64); 4] = [
    (1, 9.75 / 10.0),
    (2, 19.62 / 20.0),
    (4, 39.50 / 40.0),
    (8, 79.25 / 80.0),
];

fn usable_for(nominal_gb: u32, slots: u8) -> f64 {
    let fraction = H100_USABLE_FRACTION
        .iter()
        .find(|(s, _)| *s == slots)
        .map(|(_, f)| *f)
        .unwrap_or(1.0);
    // Two decimals, like `nvidia-smi mig -lgip` prints.
    (f64::from(nominal_gb) * fraction * 100.0).round() / 100.0
}

/// SMs of a GPU's MIG instances and of the whole GPU with MIG off (the
/// module docs give the sources).
struct Sms {
    /// SMs of the whole GPU with MIG off.
    gpu: u32,
    /// SMs of an instance, by (compute slices, memory slots).
    instances: &'static [((u8, u8), u32)],
}

impl Sms {
    fn fraction(&self, c: u8, slots: u8) -> f64 {
        let sms = self
            .instances
            .iter()
            .find(|(k, _)| *k == (c, slots))
            .map(|(_, n)| *n)
            .expect("every built-in profile has its SMs");
        f64::from(sms) / f64::from(self.gpu)
    }
}

/// Hopper (H100, H200): 132 SMs.
const HOPPER_SMS: Sms = Sms {
    gpu: 132,
    instances: &[
        ((1, 1), 16),
        ((1, 2), 26),
        ((2, 2), 32),
        ((3, 4), 60),
        ((4, 4), 64),
        ((7, 8), 132),
    ],
};

/// Ampere A100: 108 SMs, 98 of them in MIG's 7g instance.
const A100_SMS: Sms = Sms {
    gpu: 108,
    instances: &[
        ((1, 1), 14),
        ((1, 2), 14),
        ((2, 2), 28),
        ((3, 4), 42),
        ((4, 4), 56),
        ((7, 8), 98),
    ],
};

/// A30: 56 SMs, 14 per slice.
const A30_SMS: Sms = Sms {
    gpu: 56,
    instances: &[((1, 1), 14), ((2, 2), 28), ((4, 4), 56)],
};

fn profile(sms: &Sms, c: u8, slots: u8, nominal: u32, starts: &[u8], me: bool) -> MigProfile {
    MigProfile {
        name: format!("{c}g.{nominal}gb{}", if me { "+me" } else { "" }),
        compute_slices: c,
        memory_slots: slots,
        usable_gib: usable_for(nominal, slots),
        starts: starts.to_vec(),
        media_extensions: me,
        compute_fraction: sms.fraction(c, slots),
    }
}

/// The placement rules of an 8-slot, 7-slice GPU (A100, H100, H200, B200).
fn eight_slot_mig(n: MigNames, sms: &Sms) -> MigSpec {
    let ones: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
    MigSpec {
        memory_slots: 8,
        compute_slices: 7,
        profiles: vec![
            profile(sms, 1, 1, n.one, ones, false),
            profile(sms, 1, 1, n.one, ones, true),
            profile(sms, 1, 2, n.two, &[0, 2, 4, 6], false),
            profile(sms, 2, 2, n.two, &[0, 2, 4], false),
            profile(sms, 3, 4, n.four, &[0, 4], false),
            profile(sms, 4, 4, n.four, &[0], false),
            profile(sms, 7, 8, n.eight, &[0], false),
        ],
    }
}

/// A30-24GB: 4 memory slots and 4 compute slices.
fn a30_mig() -> MigSpec {
    let sms = &A30_SMS;
    MigSpec {
        memory_slots: 4,
        compute_slices: 4,
        profiles: vec![
            profile(sms, 1, 1, 6, &[0, 1, 2, 3], false),
            profile(sms, 1, 1, 6, &[0, 1, 2, 3], true),
            profile(sms, 2, 2, 12, &[0, 2], false),
            profile(sms, 2, 2, 12, &[0, 2], true),
            profile(sms, 4, 4, 24, &[0], false),
        ],
    }
}

struct Row {
    name: &'static str,
    product: &'static str,
    memory_mib: u32,
    tflops: f64,
    price: f64,
    nvlink: bool,
}

fn model(row: Row, mig: Option<MigSpec>) -> GpuModel {
    let memory_gib = (f64::from(row.memory_mib) / 1024.0 * 100.0).round() / 100.0;
    let usable_gib = ((memory_gib - WHOLE_GPU_RESERVED_GIB) * 100.0).round() / 100.0;
    GpuModel {
        name: row.name.to_string(),
        memory_gib,
        usable_gib,
        compute: (row.tflops / REFERENCE_TFLOPS * 1000.0).round() / 1000.0,
        price_per_hour: row.price,
        product: row.product.to_string(),
        mig,
        nvlink: row.nvlink,
    }
}

impl Catalog {
    /// The built-in catalogue (see the module docs for the sources).
    pub fn builtin() -> Catalog {
        let names = |one, two, four, eight| MigNames {
            one,
            two,
            four,
            eight,
        };
        let rows = vec![
            model(
                Row {
                    name: "A100-40GB",
                    product: "NVIDIA-A100-SXM4-40GB",
                    memory_mib: 40960,
                    tflops: 312.0,
                    price: 1.80,
                    nvlink: true,
                },
                Some(eight_slot_mig(names(5, 10, 20, 40), &A100_SMS)),
            ),
            model(
                Row {
                    name: "A100-80GB",
                    product: "NVIDIA-A100-SXM4-80GB",
                    memory_mib: 81920,
                    tflops: 312.0,
                    price: 2.20,
                    nvlink: true,
                },
                Some(eight_slot_mig(names(10, 20, 40, 80), &A100_SMS)),
            ),
            model(
                Row {
                    name: "H100-80GB",
                    product: "NVIDIA-H100-80GB-HBM3",
                    memory_mib: 81559,
                    tflops: 989.0,
                    price: 3.00,
                    nvlink: true,
                },
                Some(eight_slot_mig(names(10, 20, 40, 80), &HOPPER_SMS)),
            ),
            model(
                Row {
                    name: "H100-94GB",
                    product: "NVIDIA-H100-NVL",
                    memory_mib: 95830,
                    tflops: 835.0,
                    price: 3.20,
                    nvlink: false,
                },
                Some(eight_slot_mig(names(12, 24, 47, 94), &HOPPER_SMS)),
            ),
            model(
                Row {
                    name: "H200-141GB",
                    product: "NVIDIA-H200",
                    memory_mib: 143771,
                    tflops: 989.0,
                    price: 3.80,
                    nvlink: true,
                },
                Some(eight_slot_mig(names(18, 35, 71, 141), &HOPPER_SMS)),
            ),
            model(
                Row {
                    name: "B200",
                    product: "NVIDIA-B200",
                    memory_mib: 183359,
                    tflops: 2250.0,
                    price: 5.50,
                    nvlink: true,
                },
                Some(eight_slot_mig(names(23, 45, 90, 180), &HOPPER_SMS)),
            ),
            model(
                Row {
                    name: "A30-24GB",
                    product: "NVIDIA-A30",
                    memory_mib: 24576,
                    tflops: 165.0,
                    price: 0.90,
                    nvlink: false,
                },
                Some(a30_mig()),
            ),
            model(
                Row {
                    name: "L4",
                    product: "NVIDIA-L4",
                    memory_mib: 23034,
                    tflops: 121.0,
                    price: 0.80,
                    nvlink: false,
                },
                None,
            ),
            model(
                Row {
                    name: "L40S",
                    product: "NVIDIA-L40S",
                    memory_mib: 46068,
                    tflops: 362.0,
                    price: 1.40,
                    nvlink: false,
                },
                None,
            ),
            model(
                Row {
                    name: "A10",
                    product: "NVIDIA-A10",
                    memory_mib: 23028,
                    tflops: 125.0,
                    price: 0.90,
                    nvlink: false,
                },
                None,
            ),
            model(
                Row {
                    name: "T4",
                    product: "Tesla-T4",
                    memory_mib: 15360,
                    tflops: 65.0,
                    price: 0.40,
                    nvlink: false,
                },
                None,
            ),
        ];
        let mut catalog = Catalog {
            models: rows.into_iter().map(|m| (m.name.clone(), m)).collect(),
        };
        // Measured or conservative usable memory per memory-slot count
        // (the module docs give the sources).
        let a100_40 = [(1, 4.75), (2, 9.75), (4, 19.62), (8, 39.38)];
        let h200 = [(1, 16.00), (2, 32.50), (4, 69.75), (8, 140.00)];
        for (name, table) in [("A100-40GB", a100_40), ("H200-141GB", h200)] {
            if let Some(mig) = catalog.models.get_mut(name).and_then(|m| m.mig.as_mut()) {
                for p in &mut mig.profiles {
                    if let Some((_, u)) = table.iter().find(|(s, _)| *s == p.memory_slots) {
                        p.usable_gib = *u;
                    }
                }
            }
        }
        // The 7g instance and the whole GPU differ only by the driver's
        // reservation; keep MIG GPUs' whole-GPU usable memory at least the
        // 7g instance's so a full-size instance never fits where the GPU
        // does not.
        for m in catalog.models.values_mut() {
            if MEASURED_WHOLE_USABLE_GIB.iter().any(|(n, _)| *n == m.name) {
                continue;
            }
            if let Some(full) = m.mig.as_ref().and_then(|mig| {
                mig.profiles
                    .iter()
                    .find(|p| p.memory_slots == mig.memory_slots)
            }) {
                m.usable_gib = m.usable_gib.max(full.usable_gib);
            }
        }
        for (name, gib) in MEASURED_WHOLE_USABLE_GIB {
            if let Some(m) = catalog.models.get_mut(*name) {
                m.usable_gib = *gib;
            }
        }
        catalog
    }

    /// Looks a model up by catalogue name.
    pub fn get(&self, name: &str) -> Option<&GpuModel> {
        self.models.get(name)
    }

    /// All models, by name.
    pub fn models(&self) -> impl Iterator<Item = &GpuModel> {
        self.models.values()
    }

    /// All model names, sorted.
    pub fn names(&self) -> Vec<&str> {
        self.models.keys().map(String::as_str).collect()
    }

    /// Adds or replaces a model.
    pub fn insert(&mut self, model: GpuModel) {
        self.models.insert(model.name.clone(), model);
    }
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog::builtin()
    }
}

impl fmt::Display for Catalog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<11} {:>9} {:>9} {:>8} {:>7}  MIG PROFILES (usable GiB, share of the GPU's SMs)",
            "MODEL", "MEM GiB", "USABLE", "COMPUTE", "$/h"
        )?;
        for m in self.models() {
            let mig = match &m.mig {
                None => "-".to_string(),
                Some(mig) => mig
                    .profiles
                    .iter()
                    .map(|p| {
                        format!(
                            "{} ({:.2}, {:.3})",
                            p.name, p.usable_gib, p.compute_fraction
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
            };
            writeln!(
                f,
                "{:<11} {:>9.2} {:>9.2} {:>8.3} {:>7.2}  {}",
                m.name, m.memory_gib, m.usable_gib, m.compute, m.price_per_hour, mig
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h100_usable_memory_matches_the_mig_user_guide() {
        let c = Catalog::builtin();
        let mig = c.get("H100-80GB").unwrap().mig.as_ref().unwrap();
        let usable: Vec<(&str, f64)> = mig
            .profiles
            .iter()
            .map(|p| (p.name.as_str(), p.usable_gib))
            .collect();
        assert_eq!(
            usable,
            vec![
                ("1g.10gb", 9.75),
                ("1g.10gb+me", 9.75),
                ("1g.20gb", 19.62),
                ("2g.20gb", 19.62),
                ("3g.40gb", 39.50),
                ("4g.40gb", 39.50),
                ("7g.80gb", 79.25),
            ]
        );
        assert_eq!(c.get("H100-80GB").unwrap().usable_gib, 79.25);
    }

    #[test]
    fn a100_40gb_usable_memory_is_measured() {
        let c = Catalog::builtin();
        let usable = |gpu: &str| -> Vec<(String, f64)> {
            c.get(gpu)
                .unwrap()
                .mig
                .as_ref()
                .unwrap()
                .profiles
                .iter()
                .filter(|p| !p.media_extensions)
                .map(|p| (p.name.clone(), p.usable_gib))
                .collect()
        };
        // `nvidia-smi mig -lgip` on an A100-SXM4-40GB.
        assert_eq!(
            usable("A100-40GB"),
            [
                ("1g.5gb".to_string(), 4.75),
                ("1g.10gb".to_string(), 9.75),
                ("2g.10gb".to_string(), 9.75),
                ("3g.20gb".to_string(), 19.62),
                ("4g.20gb".to_string(), 19.62),
                ("7g.40gb".to_string(), 39.38),
            ]
        );
    }

    #[test]
    fn a100_instances_have_the_sms_that_nvidia_smi_lists() {
        // `nvidia-smi mig -lgip` on an A100-SXM4-40GB: the SM column, of
        // the 108 SMs the A100 has with MIG off.
        let listed = [
            ("1g.5gb", 14.0),
            ("1g.10gb", 14.0),
            ("2g.10gb", 28.0),
            ("3g.20gb", 42.0),
            ("4g.20gb", 56.0),
            ("7g.40gb", 98.0),
        ];
        let c = Catalog::builtin();
        let mig = c.get("A100-40GB").unwrap().mig.as_ref().unwrap();
        for (name, sms) in listed {
            let p = mig.profile(name).unwrap();
            assert!((p.compute_fraction - sms / 108.0).abs() < 1e-12, "{name}");
        }
        // A 7g instance is not the whole A100: ten SMs stay dark.
        assert!(mig.profile("7g.40gb").unwrap().compute(1.0) < 0.91);
    }

    /// The oracle is the hardware: `nvidia-smi mig -lgip` and `-lgipp` of
    /// a real H200 (driver 580.159.04), recorded in `tests/data/`.
    #[test]
    fn h200_profiles_placements_counts_and_memory_are_a_real_h200s() {
        let lgip =
            crate::devices::parse_lgip(include_str!("../../tests/data/nvidia-h200/lgip.txt"));
        let lgipp =
            crate::devices::parse_lgipp(include_str!("../../tests/data/nvidia-h200/lgipp.txt"));
        assert_eq!(lgip.len(), 7);
        let c = Catalog::builtin();
        let h200 = c.get("H200-141GB").unwrap();
        let mig = h200.mig.as_ref().unwrap();
        let mut names: Vec<&str> = mig.profiles.iter().map(|p| p.name.as_str()).collect();
        let mut real: Vec<&str> = lgip.iter().map(|(_, n, _, _)| n.as_str()).collect();
        names.sort_unstable();
        real.sort_unstable();
        assert_eq!(names, real, "the catalogue's profiles are the GPU's");
        let geometries = crate::mig::all_geometries(mig);
        for (_, name, id, gib) in &lgip {
            let p = mig.profiles.iter().find(|p| p.name == *name).unwrap();
            assert_eq!(p.usable_gib, *gib, "{name}: -lgip's memory");
            let (_, _, starts, size) = lgipp.iter().find(|(_, i, ..)| i == id).unwrap();
            assert_eq!(p.memory_slots, *size, "{name}: -lgipp's size");
            assert_eq!(p.starts, *starts, "{name}: -lgipp's starts");
            let slices: u8 = name.split('g').next().unwrap().parse().unwrap();
            assert_eq!(p.compute_slices, slices, "{name}");
            // -lgip's SM column over the 132 SMs of the whole GPU (the
            // 7g instance holds them all on Hopper).
            let sms: f64 = include_str!("../../tests/data/nvidia-h200/lgip.txt")
                .lines()
                .find(|l| l.split_whitespace().nth(3) == Some(name.as_str()))
                .and_then(|l| l.split_whitespace().nth(8))
                .unwrap()
                .parse()
                .unwrap();
            assert!(
                (p.compute_fraction - sms / 132.0).abs() < 1e-12,
                "{name}: {} against -lgip's {sms} of 132 SMs",
                p.compute_fraction
            );
            // -lgip's Free/Total with nothing created: the most instances
            // of the profile the GPU holds at once.
            let total: usize = include_str!("../../tests/data/nvidia-h200/lgip.txt")
                .lines()
                .find(|l| l.split_whitespace().nth(3) == Some(name.as_str()))
                .and_then(|l| l.split_whitespace().nth(5))
                .and_then(|x| x.split('/').nth(1))
                .unwrap()
                .parse()
                .unwrap();
            let most = geometries
                .iter()
                .map(|g| g.placements().iter().filter(|x| x.profile == *name).count())
                .max()
                .unwrap();
            assert_eq!(most, total, "{name}: instances at once");
        }
        // `nvidia-smi -q`: 143771 MiB total, 616 MiB reserved by the driver.
        assert!((h200.memory_gib - 143771.0 / 1024.0).abs() < 0.005);
        assert!(h200.usable_gib <= (143771.0 - 616.0) / 1024.0);
        assert!(h200.usable_gib > (143771.0 - 616.0) / 1024.0 - 0.01);
    }

    #[test]
    fn profile_names_follow_the_design_table() {
        let c = Catalog::builtin();
        let names = |m: &str| -> Vec<String> {
            c.get(m)
                .unwrap()
                .mig
                .as_ref()
                .unwrap()
                .profiles
                .iter()
                .map(|p| p.name.clone())
                .collect()
        };
        assert_eq!(
            names("A100-40GB"),
            [
                "1g.5gb",
                "1g.5gb+me",
                "1g.10gb",
                "2g.10gb",
                "3g.20gb",
                "4g.20gb",
                "7g.40gb"
            ]
        );
        assert_eq!(
            names("H100-94GB"),
            [
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.47gb",
                "4g.47gb",
                "7g.94gb"
            ]
        );
        assert_eq!(
            names("H200-141GB"),
            [
                "1g.18gb",
                "1g.18gb+me",
                "1g.35gb",
                "2g.35gb",
                "3g.71gb",
                "4g.71gb",
                "7g.141gb"
            ]
        );
        assert_eq!(
            names("B200"),
            [
                "1g.23gb",
                "1g.23gb+me",
                "1g.45gb",
                "2g.45gb",
                "3g.90gb",
                "4g.90gb",
                "7g.180gb"
            ]
        );
        assert_eq!(
            names("A30-24GB"),
            ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]
        );
    }

    #[test]
    fn every_required_model_is_present_and_sane() {
        let c = Catalog::builtin();
        for name in [
            "A100-40GB",
            "A100-80GB",
            "H100-80GB",
            "H100-94GB",
            "H200-141GB",
            "B200",
            "A30-24GB",
            "L4",
            "L40S",
            "A10",
            "T4",
        ] {
            let m = c.get(name).unwrap_or_else(|| panic!("{name} missing"));
            assert!(m.usable_gib <= m.memory_gib + 1e-9, "{name}");
            assert!(m.usable_gib > 0.9 * m.memory_gib, "{name}");
            assert!(m.compute > 0.0 && m.price_per_hour > 0.0, "{name}");
            if let Some(mig) = &m.mig {
                for p in &mig.profiles {
                    // Not ≤ the whole GPU's usable memory: a real H200's
                    // 7g instance holds 140.00 GiB, the whole GPU offers
                    // 139.79 after the driver's reservation.
                    assert!(p.usable_gib <= m.memory_gib, "{name} {}", p.name);
                    for s in &p.starts {
                        assert!(s + p.memory_slots <= mig.memory_slots, "{name} {}", p.name);
                    }
                }
            }
        }
        for non_mig in ["L4", "L40S", "A10", "T4"] {
            assert!(!c.get(non_mig).unwrap().mig_capable());
        }
        assert_eq!(c.get("H100-80GB").unwrap().compute, 1.0);
    }
}
