//! What `gpuscale agent` reports about one node's GPUs, as NVML reads
//! them: model, memory, MIG mode and the GPU instances with their
//! placements, utilisation, temperature, power and ECC errors. The agent
//! serves it as JSON (`/v1/gpus`) and the controller builds the packer's
//! inventory from it and the nodes' labels.

use serde::{Deserialize, Serialize};

/// One node's GPUs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGpus {
    /// The node (`NODE_NAME` from the downward API, else the host name).
    pub node: String,
    /// The driver version NVML reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Every GPU, by index.
    #[serde(default)]
    pub gpus: Vec<GpuReading>,
}

/// One GPU as NVML reads it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuReading {
    /// NVML index (`nvidia-smi` order).
    pub index: u32,
    /// `GPU-…`.
    pub uuid: String,
    /// NVML's product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Framebuffer memory, MiB.
    pub memory_total_mib: u64,
    /// Used, MiB.
    pub memory_used_mib: u64,
    /// MIG mode now (`None`: the GPU does not support MIG).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_enabled: Option<bool>,
    /// MIG mode after the next reset, when it differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_pending: Option<bool>,
    /// The GPU instances (MIG devices) now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<InstanceReading>,
    /// Utilisation of the last sample period, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_percent: Option<u32>,
    /// Core temperature, °C.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<u32>,
    /// Power draw, watts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_watts: Option<f64>,
    /// Uncorrectable (double-bit) ECC errors since the driver loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_uncorrected_volatile: Option<u64>,
}

/// One MIG device (a GPU instance with its compute instance).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceReading {
    /// The MIG profile, e.g. `3g.40gb` (from the MIG device's name).
    pub profile: String,
    /// First memory slot (from `nvidia-smi mig -lgi`; NVML's safe
    /// bindings do not read it). `None`: not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u8>,
    /// The GPU instance's id, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_instance_id: Option<u32>,
    /// `MIG-…`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    /// Memory, MiB.
    #[serde(default)]
    pub memory_total_mib: u64,
    /// Used, MiB.
    #[serde(default)]
    pub memory_used_mib: u64,
}

impl GpuReading {
    /// Not to be placed on: uncorrectable ECC errors since the driver
    /// loaded (NVIDIA's guidance: drain and reset the GPU).
    pub fn unhealthy(&self) -> bool {
        self.ecc_uncorrected_volatile.is_some_and(|n| n > 0)
    }
}

/// The MIG profile in a MIG device's NVML name (`NVIDIA H100 80GB HBM3
/// MIG 3g.40gb` → `3g.40gb`; `… MIG 1g.10gb+me` → `1g.10gb+me`).
pub fn profile_of_name(name: &str) -> Option<&str> {
    let (_, rest) = name.rsplit_once("MIG ")?;
    let p = rest.trim();
    (p.contains('g') && p.contains('.')).then_some(p)
}

/// The GPU instances in `nvidia-smi mig -lgi` output, per GPU index:
/// (profile, instance id, start slot).
pub fn parse_lgi(text: &str) -> Vec<(u32, String, u32, u8)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let cols: Vec<&str> = line
            .trim_matches(|c: char| c == '|' || c.is_whitespace())
            .split_whitespace()
            .collect();
        // `0  MIG 3g.40gb  9  2  4:4`
        if cols.len() < 6 || cols[1] != "MIG" {
            continue;
        }
        let (Ok(gpu), Ok(id)) = (cols[0].parse::<u32>(), cols[4].parse::<u32>()) else {
            continue;
        };
        let Some((start, _)) = cols[5].split_once(':') else {
            continue;
        };
        let Ok(start) = start.parse::<u8>() else {
            continue;
        };
        out.push((gpu, cols[2].to_string(), id, start));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles_come_from_the_device_name() {
        assert_eq!(
            profile_of_name("NVIDIA H100 80GB HBM3 MIG 3g.40gb"),
            Some("3g.40gb")
        );
        assert_eq!(
            profile_of_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me"),
            Some("1g.5gb+me")
        );
        assert_eq!(profile_of_name("NVIDIA H100 80GB HBM3"), None);
    }

    /// The table as NVIDIA's MIG user guide shows `nvidia-smi mig -lgi`.
    #[test]
    fn placements_come_from_nvidia_smi_mig_lgi() {
        let text = "\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 1g.10gb          19        9          2:1    |
+-------------------------------------------------------+
|   0  MIG 3g.40gb           9        2          4:4    |
+-------------------------------------------------------+
|   1  MIG 7g.80gb           0        0          0:8    |
+-------------------------------------------------------+
";
        assert_eq!(
            parse_lgi(text),
            [
                (0, "1g.10gb".to_string(), 9, 2),
                (0, "3g.40gb".to_string(), 2, 4),
                (1, "7g.80gb".to_string(), 0, 0)
            ]
        );
        assert!(parse_lgi("No MIG-enabled devices found.").is_empty());
    }
}
