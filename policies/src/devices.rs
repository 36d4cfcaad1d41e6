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
    /// Framebuffer memory the driver reserves, MiB (NVML's
    /// `nvmlMemory_v2_t.reserved`: 616 MiB on an H200 with driver 580).
    /// What a whole GPU offers its pods is total minus this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_reserved_mib: Option<u64>,
    /// The GPU instance profiles the GPU offers (NVML answers whether MIG
    /// is on or off): the measured counterpart of the catalogue's MIG
    /// table. Empty on GPUs without MIG.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_profiles: Vec<ProfileReading>,
}

/// One GPU instance profile as the GPU itself reports it: NVML's
/// `nvmlDeviceGetGpuInstanceProfileInfo` (id, slices, memory, instances,
/// multiprocessors), named and placed by `nvidia-smi mig -lgip` and
/// `-lgipp` (NVML's safe bindings give neither the name nor, correctly,
/// the placements).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileReading {
    /// NVML's profile id (`-lgip`'s ID column), e.g. 19 for `1g.*`.
    pub id: u32,
    /// NVIDIA's name, e.g. `1g.18gb`, `1g.18gb+me` (`None`: `nvidia-smi`
    /// was not there to name it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Compute slices.
    pub compute_slices: u32,
    /// Most instances of this profile the GPU holds at once.
    pub instances: u32,
    /// Memory of one instance, MiB (what `-lgip` prints in GiB).
    pub memory_mib: u64,
    /// Streaming multiprocessors of one instance.
    #[serde(default)]
    pub multiprocessors: u32,
    /// Memory slots an instance occupies (from `-lgipp`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_slots: Option<u8>,
    /// The memory slots an instance may start at (from `-lgipp`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub starts: Vec<u8>,
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

    /// Memory a whole GPU offers its pods, MiB: total less what the driver
    /// reserves (`None` when the reading has no reservation).
    pub fn memory_usable_mib(&self) -> Option<u64> {
        self.memory_reserved_mib
            .map(|r| self.memory_total_mib.saturating_sub(r))
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

/// The GPU instance profiles in `nvidia-smi mig -lgip` output: (GPU
/// index, name, profile id, memory GiB as printed).
pub fn parse_lgip(text: &str) -> Vec<(u32, String, u32, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let cols: Vec<&str> = line
            .trim_matches(|c: char| c == '|' || c.is_whitespace())
            .split_whitespace()
            .collect();
        // `0  MIG 1g.18gb  19  7/7  16.00  No  16  1  0`
        if cols.len() < 6 || cols[1] != "MIG" || !cols[4].contains('/') {
            continue;
        }
        let (Ok(gpu), Ok(id), Ok(gib)) = (
            cols[0].parse::<u32>(),
            cols[3].parse::<u32>(),
            cols[5].parse::<f64>(),
        ) else {
            continue;
        };
        out.push((gpu, cols[2].to_string(), id, gib));
    }
    out
}

/// The possible placements in `nvidia-smi mig -lgipp` output: (GPU index,
/// profile id, start slots, memory slots per instance), from lines like
/// `GPU  0 Profile ID 15 Placements: {0,2,4,6}:2`.
pub fn parse_lgipp(text: &str) -> Vec<(u32, u32, Vec<u8>, u8)> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("GPU") else {
            continue;
        };
        let words: Vec<&str> = rest.split_whitespace().collect();
        let Some(gpu) = words.first().and_then(|w| w.parse::<u32>().ok()) else {
            continue;
        };
        let Some(id) = words
            .windows(3)
            .find(|w| w[0] == "Profile" && w[1] == "ID")
            .and_then(|w| w[2].parse::<u32>().ok())
        else {
            continue;
        };
        let (Some(open), Some(close)) = (rest.find('{'), rest.find('}')) else {
            continue;
        };
        if close < open {
            continue;
        }
        let starts: Result<Vec<u8>, _> = rest[open + 1..close]
            .split(',')
            .map(|x| x.trim().parse::<u8>())
            .collect();
        let size = rest[close + 1..]
            .trim()
            .strip_prefix(':')
            .and_then(|x| x.trim().parse::<u8>().ok());
        if let (Ok(starts), Some(size)) = (starts, size) {
            out.push((gpu, id, starts, size));
        }
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

    /// `nvidia-smi mig -lgip` and `-lgipp` as a real H200 printed them.
    #[test]
    fn profiles_and_placements_come_from_a_real_h200s_lgip_and_lgipp() {
        let lgip = parse_lgip(include_str!("../../tests/data/nvidia-h200/lgip.txt"));
        let row = |n: &str, id: u32, gib: f64| (0, n.to_string(), id, gib);
        assert_eq!(
            lgip,
            [
                row("1g.18gb", 19, 16.0),
                row("1g.18gb+me", 20, 16.0),
                row("1g.35gb", 15, 32.5),
                row("2g.35gb", 14, 32.5),
                row("3g.71gb", 9, 69.75),
                row("4g.71gb", 5, 69.75),
                row("7g.141gb", 0, 140.0),
            ]
        );
        let lgipp = parse_lgipp(include_str!("../../tests/data/nvidia-h200/lgipp.txt"));
        assert_eq!(
            lgipp,
            [
                (0, 19, vec![0, 1, 2, 3, 4, 5, 6], 1),
                (0, 20, vec![0, 1, 2, 3, 4, 5, 6], 1),
                (0, 15, vec![0, 2, 4, 6], 2),
                (0, 14, vec![0, 2, 4], 2),
                (0, 9, vec![0, 4], 4),
                (0, 5, vec![0], 4),
                (0, 0, vec![0], 8),
            ]
        );
        // -lgi's table is not -lgip's, and neither is -lgipp's.
        assert!(parse_lgip(include_str!("../../tests/data/nvidia-h200/lgipp.txt")).is_empty());
        assert!(parse_lgi(include_str!("../../tests/data/nvidia-h200/lgip.txt")).is_empty());
        assert!(parse_lgipp("GPU 0 Profile ID 9 Placements: {0,x}:4\nGPU zero").is_empty());
    }

    /// The agent's reading of that H200: its profiles match -lgip's, and
    /// the whole GPU offers total less the reservation.
    #[test]
    fn a_real_h200_reading_decodes() {
        let r: NodeGpus =
            serde_json::from_str(include_str!("../../tests/data/nvidia-h200/reading.json"))
                .unwrap();
        let g = &r.gpus[0];
        assert_eq!(g.name, "NVIDIA H200");
        assert_eq!(g.mig_enabled, Some(false));
        assert_eq!(g.memory_usable_mib(), Some(143771 - 616));
        let lgip = parse_lgip(include_str!("../../tests/data/nvidia-h200/lgip.txt"));
        assert_eq!(g.mig_profiles.len(), lgip.len());
        for p in &g.mig_profiles {
            let (_, name, _, gib) = lgip.iter().find(|(_, _, id, _)| *id == p.id).unwrap();
            assert_eq!(p.name.as_deref(), Some(name.as_str()));
            assert_eq!(p.memory_mib as f64 / 1024.0, *gib);
        }
    }
}
