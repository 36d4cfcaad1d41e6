//! Step (5) of decoding: a class's fractional GPUs (the ILP's counts of
//! each mix) onto concrete GPUs of its HAMi nodes.
//!
//! 1. A GPU already running exactly a wanted mix keeps it.
//! 2. The shares of each tensor-parallel model are grouped `k` at a time
//!    on one node: groups running now first (completed on their node where
//!    they lost a GPU), then new groups in blocks of `k` GPUs on the node
//!    with the fewest free GPUs that hold them (a node with nothing on it
//!    turned HAMi if none does).
//! 3. The other GPUs: a GPU running a mix now takes the wanted mix that
//!    keeps most of it, the rest go on free GPUs, fractional ones first.
//!
//! The replicas are filled into the single shares by step (6) of
//! [`super::decode_class`]; the shares of tensor-parallel replicas are
//! filled here, with their groups.

use std::collections::BTreeMap;

use gpuscale_policies::{Cluster, Geometry, GpuMode, Health};

use super::{Assigned, Decoded, Role, Slot};
use crate::classes::{Class, PatternKind};
use crate::ilp::Counts;
use crate::plan::Mode;

/// What step (5) reads.
pub(super) struct Context<'a> {
    pub cluster: &'a Cluster,
    pub class: &'a Class,
    pub c: usize,
    pub counts: &'a Counts,
}

/// Overlap scans above this many (GPU, mix) pairs are skipped (then the
/// GPUs are taken in order).
const OVERLAP_PAIRS: usize = 1_000_000;

impl Context<'_> {
    /// The mix a GPU runs now, as sorted (slot type, count).
    fn mix_now(&self, ni: usize, i: u32) -> Vec<(usize, u32)> {
        let gpu = &self.cluster.nodes[ni].gpus[i as usize];
        if gpu.mode != GpuMode::Fractional {
            return Vec::new();
        }
        let mut mix: BTreeMap<usize, u32> = BTreeMap::new();
        for w in &gpu.workloads {
            if let Some(t) = self.class.fractional_slot(&w.model) {
                *mix.entry(t).or_insert(0) += 1;
            }
        }
        mix.into_iter().collect()
    }

    /// Free healthy GPUs of a node: fractional ones now first, then those
    /// running nothing.
    fn free_on(&self, ni: usize, assigned: &BTreeMap<(usize, u32), Assigned>) -> Vec<u32> {
        let node = &self.cluster.nodes[ni];
        let mut free: Vec<u32> = node
            .gpus
            .iter()
            .filter(|x| x.health == Health::Healthy && !assigned.contains_key(&(ni, x.index)))
            .map(|x| x.index)
            .collect();
        free.sort_by_key(|&i| {
            let g = &node.gpus[i as usize];
            (g.mode != GpuMode::Fractional, !g.workloads.is_empty(), i)
        });
        free
    }

    fn gpu(&self, p: usize) -> Assigned {
        let slots = self.class.patterns[p]
            .slots
            .iter()
            .flat_map(|&(t, k)| {
                std::iter::repeat_n(self.class.slot_types[t].kind.clone(), k as usize)
            })
            .map(Slot::empty)
            .collect();
        Assigned {
            mode: Mode::Fractional,
            geometry: Geometry::default(),
            share: None,
            slots,
            whole: None,
            mig_share: None,
        }
    }

    /// A node of the class with nothing assigned and no role, made a HAMi
    /// node.
    fn spare_node(
        &self,
        designated: &mut BTreeMap<usize, Role>,
        assigned: &BTreeMap<(usize, u32), Assigned>,
    ) -> Option<usize> {
        let ni = self.class.nodes.iter().copied().find(|&ni| {
            !designated.contains_key(&ni)
                && !self.cluster.nodes[ni]
                    .gpus
                    .iter()
                    .any(|x| assigned.contains_key(&(ni, x.index)))
        })?;
        designated.insert(ni, Role::Hami);
        Some(ni)
    }
}

/// Places the class's fractional GPUs and its tensor-parallel replicas'
/// shares (see the module's steps).
pub(super) fn place(
    cx: &Context,
    designated: &mut BTreeMap<usize, Role>,
    assigned: &mut BTreeMap<(usize, u32), Assigned>,
    out: &mut Decoded,
) {
    let (class, c) = (cx.class, cx.c);
    let mut need: BTreeMap<usize, u32> = class
        .patterns
        .iter()
        .enumerate()
        .filter(|(p, pattern)| {
            pattern.kind == PatternKind::Fractional && cx.counts.patterns[c][*p] > 0
        })
        .map(|(p, _)| (p, cx.counts.patterns[c][p]))
        .collect();
    if need.is_empty() {
        return;
    }
    let mut hami: Vec<usize> = designated
        .iter()
        .filter(|&(_, r)| *r == Role::Hami)
        .map(|(&ni, _)| ni)
        .collect();

    // (1) GPUs running a wanted mix keep it.
    for &ni in &hami {
        for i in cx.free_on(ni, assigned) {
            let mix = cx.mix_now(ni, i);
            if let Some(p) = class.fractional_pattern(&mix)
                && let Some(left) = need.get_mut(&p)
                && *left > 0
            {
                *left -= 1;
                assigned.insert((ni, i), cx.gpu(p));
            }
        }
    }

    // (2) Tensor-parallel shares in groups of `k` on one node.
    let grouped: Vec<(usize, usize, u32)> = cx
        .counts
        .slots
        .iter()
        .filter(|&(&(cc, _, t), &n)| cc == c && n > 0 && class.slot_types[t].parts > 1)
        .map(|(&(_, m, t), &n)| (m, t, n))
        .collect();
    for (m, t, wanted) in grouped {
        let k = class.slot_types[t].parts;
        let kind = &class.slot_types[t].kind;
        let mut left = wanted;
        let holds_t = |p: usize| class.patterns[p].slots.iter().any(|&(tt, _)| tt == t);
        // Next mix holding a share of `t` still wanted (the most wanted).
        let take_mix = |need: &mut BTreeMap<usize, u32>| {
            let p = need
                .iter()
                .filter(|&(&p, &n)| n > 0 && holds_t(p))
                .max_by_key(|&(&p, &n)| (n, std::cmp::Reverse(p)))
                .map(|(&p, _)| p)?;
            *need.get_mut(&p).expect("found above") -= 1;
            Some(p)
        };
        let fill = |assigned: &mut BTreeMap<(usize, u32), Assigned>,
                    gpus: &[(usize, u32)],
                    out: &mut Decoded| {
            out.next_group += 1;
            for key in gpus {
                let a = assigned.get_mut(key).expect("assigned above");
                let slot = a
                    .slots
                    .iter_mut()
                    .find(|s| s.kind == *kind && s.model.is_none())
                    .expect("the mix holds the share");
                slot.model = Some(m);
                slot.group = Some((k, out.next_group));
            }
        };
        // Groups on the GPUs step 1 kept, completed on their node.
        for &ni in &hami {
            if left == 0 {
                break;
            }
            let mut with: Vec<(usize, u32)> = cx.cluster.nodes[ni]
                .gpus
                .iter()
                .map(|g| (ni, g.index))
                .filter(|key| {
                    assigned.get(key).is_some_and(|a| {
                        a.mode == Mode::Fractional
                            && a.slots.iter().any(|s| s.kind == *kind && s.model.is_none())
                    })
                })
                .collect();
            if with.is_empty() {
                continue;
            }
            let mut free = cx.free_on(ni, assigned).into_iter();
            while !with.len().is_multiple_of(k as usize) && with.len() < (left * k) as usize {
                let Some(i) = free.next() else { break };
                let Some(p) = take_mix(&mut need) else { break };
                assigned.insert((ni, i), cx.gpu(p));
                with.push((ni, i));
            }
            for group in with.chunks_exact(k as usize) {
                if left == 0 {
                    break;
                }
                fill(assigned, group, out);
                left -= 1;
            }
        }
        // New groups: `k` mixes on the node with the fewest free GPUs that
        // hold them.
        while left > 0 {
            let available: u32 = need
                .iter()
                .filter(|&(&p, _)| holds_t(p))
                .map(|(_, &n)| n)
                .sum();
            if available < k {
                break;
            }
            let fits = hami
                .iter()
                .copied()
                .map(|ni| (cx.free_on(ni, assigned).len(), ni))
                .filter(|&(free, _)| free >= k as usize)
                .min();
            let ni = match fits {
                Some((_, ni)) => ni,
                None => match cx.spare_node(designated, assigned) {
                    Some(ni) => {
                        hami.push(ni);
                        ni
                    }
                    None => break,
                },
            };
            let gpus: Vec<(usize, u32)> = cx
                .free_on(ni, assigned)
                .into_iter()
                .take(k as usize)
                .map(|i| (ni, i))
                .collect();
            if gpus.len() < k as usize {
                break;
            }
            for &key in &gpus {
                let p = take_mix(&mut need).expect("counted above");
                assigned.insert(key, cx.gpu(p));
            }
            fill(assigned, &gpus, out);
            left -= 1;
        }
        out.failed[m] += left;
    }

    // (3) The other GPUs: a GPU running a mix takes the wanted mix keeping
    // most of it, then free GPUs in order.
    let running: Vec<(usize, u32)> = hami
        .iter()
        .flat_map(|&ni| cx.free_on(ni, assigned).into_iter().map(move |i| (ni, i)))
        .filter(|&(ni, i)| !cx.mix_now(ni, i).is_empty())
        .collect();
    if running.len() * need.len() <= OVERLAP_PAIRS {
        for (ni, i) in running {
            let mix = cx.mix_now(ni, i);
            let overlap = |p: usize| -> u32 {
                class.patterns[p]
                    .slots
                    .iter()
                    .map(|&(t, k)| {
                        mix.iter()
                            .find(|&&(tt, _)| tt == t)
                            .map_or(0, |&(_, n)| n.min(k))
                    })
                    .sum()
            };
            let best = need
                .iter()
                .filter(|&(_, &n)| n > 0)
                .map(|(&p, _)| (overlap(p), std::cmp::Reverse(p)))
                .max()
                .filter(|&(o, _)| o > 0)
                .map(|(_, std::cmp::Reverse(p))| p);
            if let Some(p) = best {
                *need.get_mut(&p).expect("found above") -= 1;
                assigned.insert((ni, i), cx.gpu(p));
            }
        }
    }
    let mut cursor = 0;
    for (p, n) in need {
        for _ in 0..n {
            let key = loop {
                if cursor < hami.len() {
                    match cx.free_on(hami[cursor], assigned).first() {
                        Some(&i) => break Some((hami[cursor], i)),
                        None => {
                            cursor += 1;
                            continue;
                        }
                    }
                }
                match cx.spare_node(designated, assigned) {
                    Some(ni) => hami.push(ni),
                    None => break None,
                }
            };
            // With no GPU left, its replicas find no slot in step (6) and
            // are reported there.
            if let Some(key) = key {
                assigned.insert(key, cx.gpu(p));
            }
        }
    }
}
