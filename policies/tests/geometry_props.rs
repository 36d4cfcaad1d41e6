//! Property tests of MIG geometry validation and enumeration against a
//! brute-force oracle written from the placement rules directly.

use std::collections::BTreeSet;

use gpuscale_policies::mig::{self, Placement};
use gpuscale_policies::{Catalog, MigSpec};
use proptest::prelude::*;

fn spec(model: &str) -> MigSpec {
    Catalog::builtin().get(model).unwrap().mig.clone().unwrap()
}

/// The oracle: the rules as written in DESIGN.md, slot by slot.
fn oracle_valid(mig: &MigSpec, placements: &[Placement]) -> bool {
    let mut slot_used = vec![false; usize::from(mig.memory_slots)];
    let mut compute = 0u32;
    let mut me = 0;
    for p in placements {
        let Some(profile) = mig.profiles.iter().find(|x| x.name == p.profile) else {
            return false;
        };
        if !profile.starts.contains(&p.start) {
            return false;
        }
        for s in p.start..p.start + profile.memory_slots {
            let s = usize::from(s);
            if s >= slot_used.len() || slot_used[s] {
                return false;
            }
            slot_used[s] = true;
        }
        compute += u32::from(profile.compute_slices);
        if profile.media_extensions {
            me += 1;
        }
    }
    compute <= u32::from(mig.compute_slices) && me <= 1
}

fn arb_placements(mig: MigSpec) -> impl Strategy<Value = Vec<Placement>> {
    let names: Vec<String> = mig.profiles.iter().map(|p| p.name.clone()).collect();
    prop::collection::vec(
        (prop::sample::select(names), 0u8..mig.memory_slots + 1)
            .prop_map(|(profile, start)| Placement { profile, start }),
        0..8,
    )
}

proptest! {
    #[test]
    fn validate_agrees_with_the_oracle_on_h100(ps in arb_placements(spec("H100-80GB"))) {
        let mig = spec("H100-80GB");
        prop_assert_eq!(mig::validate(&mig, &ps).is_ok(), oracle_valid(&mig, &ps));
    }

    #[test]
    fn validate_agrees_with_the_oracle_on_a30(ps in arb_placements(spec("A30-24GB"))) {
        let mig = spec("A30-24GB");
        prop_assert_eq!(mig::validate(&mig, &ps).is_ok(), oracle_valid(&mig, &ps));
    }

    #[test]
    fn every_valid_set_is_enumerated(ps in arb_placements(spec("H100-80GB"))) {
        let mig = spec("H100-80GB");
        let unique: BTreeSet<&Placement> = ps.iter().collect();
        if oracle_valid(&mig, &ps) && !ps.is_empty() && unique.len() == ps.len() {
            let all = mig::all_geometries(&mig);
            prop_assert!(all.contains(&mig::Geometry::new(ps.clone())));
        }
    }
}

#[test]
fn maximal_placements_admit_no_further_instance() {
    for model in ["H100-80GB", "A30-24GB", "B200"] {
        let mig = spec(model);
        for g in mig::maximal_placements(&mig) {
            for p in mig.profiles.iter().filter(|p| !p.media_extensions) {
                for &s in &p.starts {
                    let mut more = g.placements().to_vec();
                    more.push(Placement::new(p.name.clone(), s));
                    assert!(
                        !oracle_valid(&mig, &more),
                        "{model}: {g} + {}@{s} is still valid",
                        p.name
                    );
                }
            }
        }
    }
}

#[test]
fn enumeration_count_matches_brute_force_over_all_subsets() {
    // Every subset of the candidate (profile, start) pairs, checked by the
    // oracle: A30 has few enough candidates to try all of them.
    let mig = spec("A30-24GB");
    let candidates: Vec<Placement> = mig
        .profiles
        .iter()
        .flat_map(|p| p.starts.iter().map(|&s| Placement::new(p.name.clone(), s)))
        .collect();
    let mut valid = 0;
    for bits in 1u32..(1 << candidates.len()) {
        let set: Vec<Placement> = (0..candidates.len())
            .filter(|i| bits & (1 << i) != 0)
            .map(|i| candidates[i].clone())
            .collect();
        if oracle_valid(&mig, &set) {
            valid += 1;
        }
    }
    assert_eq!(mig::all_geometries(&mig).len(), valid);
}
