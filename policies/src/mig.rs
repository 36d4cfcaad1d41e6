//! MIG geometry: which sets of GPU instances a GPU can be split into.
//!
//! A *geometry* is a set of `(profile, start slot)` placements. It is valid
//! when every start is one the profile allows (`nvidia-smi mig -lgipp`), the
//! memory intervals `[start, start + slots)` do not overlap, the compute
//! slices add up to at most the GPU's, and at most one `+me` profile is used.
//!
//! Everything here is derived from the placement rules in
//! [`crate::catalog::MigSpec`]; no geometry is typed in by hand.
//!
//! Two notions of "maximal", both enumerated:
//! - a **maximal placement** is a geometry to which no further instance can
//!   be added (78 on an 8-slot GPU, 19 without the 1g double-memory profile);
//! - a **maximal geometry** is the distinct multiset of profiles of a maximal
//!   placement, the unit mig-parted configures (`mig-devices: {profile:
//!   count}`): 38 on an 8-slot GPU, 14 without the 1g double-memory profile —
//!   the figures NVIDIA's documentation counts.
//!
//! `+me` profiles are variants of `1g` (and `2g` on A30) that also take the
//! media engines; maximality is judged on the plain profiles, and
//! [`all_geometries`] includes the `+me` variants.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::catalog::{MigProfile, MigSpec};

/// One GPU instance: a profile at a start slot.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// NVIDIA profile name, e.g. `3g.40gb`.
    pub profile: String,
    /// First memory slot.
    pub start: u8,
}

impl Placement {
    /// A placement of `profile` at `start`.
    pub fn new(profile: impl Into<String>, start: u8) -> Placement {
        Placement {
            profile: profile.into(),
            start,
        }
    }
}

/// A set of placements, kept sorted by start slot.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Geometry(Vec<Placement>);

impl Geometry {
    /// Builds a geometry (sorting the placements); validity is checked by
    /// [`validate`].
    pub fn new(mut placements: Vec<Placement>) -> Geometry {
        placements.sort_by(|a, b| (a.start, &a.profile).cmp(&(b.start, &b.profile)));
        Geometry(placements)
    }

    /// The placements, by start slot.
    pub fn placements(&self) -> &[Placement] {
        &self.0
    }

    /// Instances per profile, as mig-parted's `mig-devices` wants them.
    pub fn counts(&self) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for p in &self.0 {
            *counts.entry(p.profile.clone()).or_insert(0) += 1;
        }
        counts
    }

    /// Whether the geometry has no instance.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Geometry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("(empty)");
        }
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|p| format!("{}@{}", p.profile, p.start))
            .collect();
        f.write_str(&parts.join(" + "))
    }
}

/// Why a geometry is not valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GeometryError {
    /// The profile is not one of the GPU model's.
    #[error("unknown MIG profile `{profile}` (this GPU has: {known})")]
    UnknownProfile {
        /// The profile named.
        profile: String,
        /// The profiles the GPU has, comma-separated.
        known: String,
    },
    /// The profile cannot start at that slot.
    #[error("`{profile}` cannot start at slot {start} (allowed starts: {allowed:?})")]
    BadStart {
        /// The profile.
        profile: String,
        /// The start given.
        start: u8,
        /// The starts the profile allows.
        allowed: Vec<u8>,
    },
    /// Two instances share memory slots.
    #[error("`{first}` at slot {first_start} overlaps `{second}` at slot {second_start}")]
    Overlap {
        /// The earlier instance's profile.
        first: String,
        /// Its start.
        first_start: u8,
        /// The later instance's profile.
        second: String,
        /// Its start.
        second_start: u8,
    },
    /// More compute slices than the GPU has.
    #[error("the instances need {used} compute slices; the GPU has {available}")]
    TooMuchCompute {
        /// Slices asked for.
        used: u32,
        /// Slices the GPU has.
        available: u8,
    },
    /// More than one `+me` instance.
    #[error("at most one `+me` instance per GPU; found {0}")]
    TooManyMediaExtensions(usize),
}

fn mask(start: u8, slots: u8) -> u32 {
    ((1u32 << slots) - 1) << start
}

/// Checks a geometry against the GPU's placement rules.
pub fn validate(mig: &MigSpec, placements: &[Placement]) -> Result<(), GeometryError> {
    let mut used: Vec<(u32, &Placement)> = Vec::new();
    let mut compute = 0u32;
    let mut me = 0usize;
    for p in placements {
        let profile = mig
            .profile(&p.profile)
            .ok_or_else(|| GeometryError::UnknownProfile {
                profile: p.profile.clone(),
                known: mig
                    .profiles
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        if !profile.starts.contains(&p.start) {
            return Err(GeometryError::BadStart {
                profile: p.profile.clone(),
                start: p.start,
                allowed: profile.starts.clone(),
            });
        }
        let m = mask(p.start, profile.memory_slots);
        if let Some((_, other)) = used.iter().find(|(om, _)| om & m != 0) {
            let (first, second) = if other.start <= p.start {
                (*other, p)
            } else {
                (p, *other)
            };
            return Err(GeometryError::Overlap {
                first: first.profile.clone(),
                first_start: first.start,
                second: second.profile.clone(),
                second_start: second.start,
            });
        }
        used.push((m, p));
        compute += u32::from(profile.compute_slices);
        me += usize::from(profile.media_extensions);
    }
    if compute > u32::from(mig.compute_slices) {
        return Err(GeometryError::TooMuchCompute {
            used: compute,
            available: mig.compute_slices,
        });
    }
    if me > 1 {
        return Err(GeometryError::TooManyMediaExtensions(me));
    }
    Ok(())
}

/// Every (profile, start) a GPU allows, in catalogue order.
fn candidate_slots(profiles: &[&MigProfile]) -> Vec<(usize, u8, u32, u8, bool)> {
    profiles
        .iter()
        .enumerate()
        .flat_map(|(i, p)| {
            p.starts.iter().map(move |&s| {
                (
                    i,
                    s,
                    mask(s, p.memory_slots),
                    p.compute_slices,
                    p.media_extensions,
                )
            })
        })
        .collect()
}

/// Depth-first enumeration over the candidate slots, each taken or not;
/// depth is bounded by the number of candidate slots (a few dozen).
struct Walker<'a> {
    items: &'a [(usize, u8, u32, u8, bool)],
    limit: u8,
    current: Vec<usize>,
    out: Vec<Vec<usize>>,
}

impl Walker<'_> {
    fn walk(&mut self, i: usize, used: u32, compute: u8, me: bool) {
        if i == self.items.len() {
            self.out.push(self.current.clone());
            return;
        }
        self.walk(i + 1, used, compute, me);
        let (_, _, m, c, is_me) = self.items[i];
        if used & m == 0 && compute + c <= self.limit && !(me && is_me) {
            self.current.push(i);
            self.walk(i + 1, used | m, compute + c, me || is_me);
            self.current.pop();
        }
    }
}

fn enumerate(mig: &MigSpec, with_me: bool) -> Vec<Geometry> {
    let profiles: Vec<&MigProfile> = mig
        .profiles
        .iter()
        .filter(|p| with_me || !p.media_extensions)
        .collect();
    let items = candidate_slots(&profiles);
    let mut walker = Walker {
        items: &items,
        limit: mig.compute_slices,
        current: Vec::new(),
        out: Vec::new(),
    };
    walker.walk(0, 0, 0, false);
    let mut out = Vec::new();
    let raw = walker.out;
    for chosen in raw {
        out.push(Geometry::new(
            chosen
                .iter()
                .map(|&k| Placement::new(profiles[items[k].0].name.clone(), items[k].1))
                .collect(),
        ));
    }
    out.sort();
    out
}

/// Every valid non-empty geometry of the GPU, `+me` variants included.
pub fn all_geometries(mig: &MigSpec) -> Vec<Geometry> {
    enumerate(mig, true)
        .into_iter()
        .filter(|g| !g.is_empty())
        .collect()
}

/// Every placement to which no further (plain) instance can be added.
pub fn maximal_placements(mig: &MigSpec) -> Vec<Geometry> {
    let plain: Vec<&MigProfile> = mig
        .profiles
        .iter()
        .filter(|p| !p.media_extensions)
        .collect();
    let items = candidate_slots(&plain);
    enumerate(mig, false)
        .into_iter()
        .filter(|g| {
            let (used, compute) = g.placements().iter().fold((0u32, 0u8), |(u, c), p| {
                let profile = mig.profile(&p.profile).expect("enumerated from the spec");
                (
                    u | mask(p.start, profile.memory_slots),
                    c + profile.compute_slices,
                )
            });
            !g.is_empty()
                && items
                    .iter()
                    .all(|&(_, _, m, c, _)| used & m != 0 || compute + c > mig.compute_slices)
        })
        .collect()
}

/// One canonical placement per distinct profile multiset of a maximal
/// placement: the configurations mig-parted can ask for (38 on an 8-slot GPU).
pub fn maximal_geometries(mig: &MigSpec) -> Vec<Geometry> {
    let mut seen = BTreeSet::new();
    maximal_placements(mig)
        .into_iter()
        .filter(|g| seen.insert(g.counts()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;

    fn spec(model: &str) -> MigSpec {
        Catalog::builtin().get(model).unwrap().mig.clone().unwrap()
    }

    fn without_double_memory(mut mig: MigSpec) -> MigSpec {
        mig.profiles
            .retain(|p| !(p.compute_slices == 1 && p.memory_slots == 2));
        mig
    }

    fn g(items: &[(&str, u8)]) -> Vec<Placement> {
        items.iter().map(|(p, s)| Placement::new(*p, *s)).collect()
    }

    #[test]
    fn eight_slot_gpus_have_38_maximal_geometries_and_14_without_double_memory() {
        for model in [
            "A100-40GB",
            "A100-80GB",
            "H100-80GB",
            "H100-94GB",
            "H200-141GB",
            "B200",
        ] {
            let mig = spec(model);
            assert_eq!(maximal_geometries(&mig).len(), 38, "{model}");
            assert_eq!(maximal_placements(&mig).len(), 78, "{model}");
            let plain = without_double_memory(mig);
            assert_eq!(maximal_geometries(&plain).len(), 14, "{model}");
            assert_eq!(maximal_placements(&plain).len(), 19, "{model}");
        }
    }

    #[test]
    fn a30_geometries() {
        let mig = spec("A30-24GB");
        let maximal: Vec<String> = maximal_geometries(&mig)
            .iter()
            .map(|g| g.to_string())
            .collect();
        assert_eq!(
            maximal,
            [
                "1g.6gb@0 + 1g.6gb@1 + 1g.6gb@2 + 1g.6gb@3",
                "1g.6gb@0 + 1g.6gb@1 + 2g.12gb@2",
                "2g.12gb@0 + 2g.12gb@2",
                "4g.24gb@0",
            ]
        );
        assert_eq!(maximal_placements(&mig).len(), 5);
        assert!(validate(&mig, &g(&[("4g.24gb", 0)])).is_ok());
        assert!(validate(&mig, &g(&[("2g.12gb", 1)])).is_err());
        assert!(validate(&mig, &g(&[("1g.6gb+me", 0), ("2g.12gb+me", 2)])).is_err());
    }

    #[test]
    fn known_valid_geometries() {
        let mig = spec("H100-80GB");
        assert_eq!(
            validate(&mig, &g(&[("4g.40gb", 0), ("3g.40gb", 4)])),
            Ok(())
        );
        assert_eq!(
            validate(
                &mig,
                &g(&[
                    ("3g.40gb", 4),
                    ("2g.20gb", 0),
                    ("1g.10gb", 2),
                    ("1g.10gb", 3)
                ])
            ),
            Ok(())
        );
        let seven: Vec<(&str, u8)> = (0..7).map(|s| ("1g.10gb", s)).collect();
        assert_eq!(validate(&mig, &g(&seven)), Ok(()));
        assert_eq!(
            validate(&mig, &g(&[("1g.10gb+me", 0), ("1g.10gb", 1)])),
            Ok(())
        );
    }

    #[test]
    fn known_invalid_geometries() {
        let mig = spec("H100-80GB");
        assert!(matches!(
            validate(&mig, &g(&[("2g.20gb", 6)])),
            Err(GeometryError::BadStart { start: 6, .. })
        ));
        assert!(matches!(
            validate(&mig, &g(&[("4g.40gb", 0), ("4g.40gb", 4)])),
            Err(GeometryError::BadStart { .. })
        ));
        assert!(matches!(
            validate(&mig, &g(&[("4g.40gb", 0), ("4g.40gb", 0)])),
            Err(GeometryError::Overlap { .. })
        ));
        assert!(matches!(
            validate(&mig, &g(&[("3g.40gb", 2)])),
            Err(GeometryError::BadStart { .. })
        ));
        assert!(matches!(
            validate(&mig, &g(&[("1g.10gb+me", 0), ("1g.10gb+me", 1)])),
            Err(GeometryError::TooManyMediaExtensions(2))
        ));
        assert!(matches!(
            validate(&mig, &g(&[("1g.10gb", 7)])),
            Err(GeometryError::BadStart { .. })
        ));
        assert!(matches!(
            validate(&mig, &g(&[("5g.50gb", 0)])),
            Err(GeometryError::UnknownProfile { .. })
        ));
    }

    #[test]
    fn every_enumerated_geometry_is_valid_and_distinct() {
        for model in ["H100-80GB", "A30-24GB"] {
            let mig = spec(model);
            let all = all_geometries(&mig);
            let unique: BTreeSet<_> = all.iter().collect();
            assert_eq!(unique.len(), all.len());
            for geometry in &all {
                assert_eq!(validate(&mig, geometry.placements()), Ok(()), "{geometry}");
            }
            assert!(all.iter().all(|g| {
                g.placements()
                    .iter()
                    .filter(|p| p.profile.contains("+me"))
                    .count()
                    <= 1
            }));
            for m in maximal_placements(&mig) {
                assert!(all.contains(&m));
            }
        }
    }
}
