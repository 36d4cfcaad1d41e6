//! Spare replicas: room that GPUs already in use leave idle, filled with
//! extra replicas of the models running.
//!
//! A plan powers on the GPUs its replicas need, and on GPUs whose sharing
//! enforces each replica's compute it leaves room that no one else can
//! use: a fractional (HAMi) GPU below its memory and SM caps (HAMi-core
//! holds each container to its `gpucores`), MPS partitions unused (MPS
//! holds each client to its share of the SMs), MIG instances with nothing
//! on them (not of a profile the node time-slices). That room is powered
//! and paid for either way. [`fill`] puts
//! *spare* replicas of running models there, never on a GPU the plan
//! leaves idle, so a plan with spares uses exactly the GPUs and costs
//! exactly what it did. A spare serves like any replica: it adds compute
//! that would idle, and when a burst comes it is already warm.
//! Time-sliced devices get none: their replicas share the device's time,
//! so an unused share is time the others already get, not room.
//!
//! Spares are not demand: the autoscaler's counts stay as it decided, and
//! the next re-plan packs those counts alone (from the plan before
//! [`fill`]), so a spare never holds a GPU on or keeps a wanted replica
//! from its room. Then the spares are filled again, first where they
//! were ([`fill`]'s `previous`), so a spare whose room is still free keeps
//! running.
//!
//! Which models get them: those with a replica placed (a model scaled to
//! zero stays at zero), critical before standard before sheddable, one
//! spare per model per round while any fits; at most as many spares as
//! the model has replicas placed (one doubling, the step HPA's default
//! scale-up allows per period), and never above its `maxReplicas`; not
//! tensor-parallel replicas (a spare takes one GPU's room). A plan that
//! leaves any wanted replica unplaced gets none: room a wanted replica
//! could not take is not idle.

use std::collections::BTreeMap;

use gpuscale_policies::{Cluster, Model};

use crate::PackOptions;
use crate::classes::{self, Class, SlotKind};
use crate::plan::{GpuPlan, Mode, Plan, ReplicaSlot};

/// Where a spare was: (node, GPU index, MIG start).
type Spot<'a> = (&'a str, u32, Option<u8>);

/// Where a spare can go on one GPU, found by [`room`].
#[derive(Debug, Clone)]
enum Room {
    /// A fractional GPU with `(MiB, SM percent, containers)` left.
    Fractional(u32, u32, u32),
    /// MPS partitions of a GPU left, and the slot type one takes.
    Shares(u32, usize),
    /// Empty MIG instances: (profile, start, spares it may take, slot
    /// type).
    Mig(Vec<(String, u8, u32, usize)>),
}

impl Room {
    /// Whether no spare of any model fits any more.
    fn is_empty(&self) -> bool {
        match self {
            Room::Fractional(_, _, n) | Room::Shares(n, _) => *n == 0,
            Room::Mig(free) => free.is_empty(),
        }
    }
}

/// Spares placed per model.
pub fn count(plan: &Plan) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for g in &plan.gpus {
        for r in g.replicas.iter().filter(|r| r.spare) {
            *out.entry(r.model.clone()).or_insert(0) += 1;
        }
    }
    out
}

/// `plan` (packed on `cluster`, without spares) with spare replicas in
/// the room its GPUs in use leave, first where `previous` had its spares.
/// The GPUs used, their configurations and the cost are unchanged; the
/// spares are marked ([`ReplicaSlot::spare`]) and counted in each
/// model's variants ([`crate::plan::Variant::spares`]).
pub fn fill(
    plan: &Plan,
    cluster: &Cluster,
    models: &[Model],
    options: &PackOptions,
    previous: Option<&Plan>,
) -> Plan {
    let mut out = plan.clone();
    // Room a wanted replica could not be put in is not idle: no spare
    // goes before a replica the plan left unplaced (a search cut short
    // can leave a container slot free beside one).
    if !plan.unplaced.is_empty() {
        return out;
    }
    let classes = classes::build(cluster, models, options);
    let class_of: BTreeMap<&str, usize> = classes
        .iter()
        .enumerate()
        .flat_map(|(c, class)| {
            class
                .nodes
                .iter()
                .map(move |&n| (cluster.nodes[n].name.as_str(), c))
        })
        .collect();
    let shared = plan.mig_timeslices();
    let by_name: BTreeMap<&str, &Model> = models.iter().map(|m| (m.name.as_str(), m)).collect();
    let class_idx: Vec<Option<usize>> = plan
        .gpus
        .iter()
        .map(|g| class_of.get(g.node.as_str()).copied())
        .collect();
    let mut rooms: Vec<Option<Room>> = plan
        .gpus
        .iter()
        .zip(&class_idx)
        .map(|(g, c)| {
            room(
                g,
                &classes[(*c)?],
                &by_name,
                shared.get(g.node.as_str()).copied(),
            )
        })
        .collect();
    // The GPUs with room, and each GPU's place by (node, index).
    let mut open: Vec<usize> = (0..rooms.len()).filter(|&i| rooms[i].is_some()).collect();
    let at: BTreeMap<(&str, u32), usize> = plan
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| ((g.node.as_str(), g.index), i))
        .collect();
    let take_at = |rooms: &[Option<Room>], i: usize, m: &Model, start: Option<u8>| {
        take(rooms[i].as_ref()?, m, &classes[class_idx[i]?], start)
    };

    // Per model: how many spares it may still take, and its next replica
    // number.
    let mut left: BTreeMap<&str, u32> = BTreeMap::new();
    let mut next: BTreeMap<&str, u32> = BTreeMap::new();
    for g in &plan.gpus {
        for r in &g.replicas {
            let n = next.entry(r.model.as_str()).or_insert(0);
            *n = (*n).max(r.replica + 1);
        }
    }
    let mut order: Vec<&Model> = Vec::new();
    for mp in &plan.models {
        let Some(m) = by_name.get(mp.name.as_str()) else {
            continue;
        };
        let may = mp
            .placed
            .min(m.scaling.max_replicas.saturating_sub(mp.placed));
        if mp.placed > 0 && may > 0 {
            left.insert(m.name.as_str(), may);
            order.push(m);
        }
    }
    order.sort_by(|a, b| a.priority.cmp(&b.priority).then(a.name.cmp(&b.name)));

    // Where the previous plan's spares were, per model: (node, index,
    // MIG start).
    let mut before: BTreeMap<&str, Vec<Spot>> = BTreeMap::new();
    if let Some(p) = previous {
        for g in &p.gpus {
            for r in g.replicas.iter().filter(|r| r.spare) {
                before.entry(r.model.as_str()).or_default().push((
                    g.node.as_str(),
                    g.index,
                    r.start,
                ));
            }
        }
    }

    loop {
        let mut added = false;
        for m in &order {
            let Some(l) = left.get_mut(m.name.as_str()).filter(|l| **l > 0) else {
                continue;
            };
            let wished = before.get(m.name.as_str()).cloned().unwrap_or_default();
            let mut spot = None;
            // Where it was first, then the first GPU with room.
            for &(node, index, start) in &wished {
                if let Some(&i) = at.get(&(node, index))
                    && let Some(s) = take_at(&rooms, i, m, start)
                {
                    spot = Some((i, s));
                    break;
                }
            }
            if spot.is_none() {
                spot = open
                    .iter()
                    .find_map(|&i| take_at(&rooms, i, m, None).map(|s| (i, s)));
            }
            let Some((i, (new_room, slot_place))) = spot else {
                *l = 0;
                continue;
            };
            if new_room.is_empty() {
                open.retain(|&j| j != i);
                rooms[i] = None;
            } else {
                rooms[i] = Some(new_room);
            }
            *l -= 1;
            let n = next.entry(m.name.as_str()).or_insert(0);
            let (profile, start) = match slot_place {
                Some((p, s)) => (Some(p), Some(s)),
                None => (None, None),
            };
            out.gpus[i].replicas.push(ReplicaSlot {
                model: m.name.clone(),
                replica: *n,
                profile,
                start,
                group_size: None,
                spare: true,
            });
            if let Some(w) = before.get_mut(m.name.as_str())
                && let Some(k) = w.iter().position(|&(node, index, _)| {
                    node == out.gpus[i].node && index == out.gpus[i].index
                })
            {
                w.remove(k);
            }
            *n += 1;
            added = true;
        }
        if !added {
            break;
        }
    }
    let mig_nodes: BTreeMap<String, (String, u8)> = shared
        .iter()
        .map(|(n, (p, k))| (n.to_string(), (p.to_string(), *k)))
        .collect();
    let mut t = crate::tally(cluster, models, &out.gpus, &mig_nodes, options);
    debug_assert_eq!(t.used, plan.gpus_used);
    out.utilization = t.utilization;
    for mp in &mut out.models {
        mp.variants = t.variants.remove(&mp.name).unwrap_or_default();
    }
    if !out.gangs.is_empty() {
        out.keep_whole_gpus_off_gangs();
    }
    out
}

/// The room on one GPU of the plan, if it is in use and shared.
fn room(
    g: &GpuPlan,
    class: &Class,
    models: &BTreeMap<&str, &Model>,
    shared: Option<(&str, u8)>,
) -> Option<Room> {
    if g.unhealthy || g.gang.is_some() || g.replicas.is_empty() {
        return None;
    }
    match g.mode {
        Mode::Fractional => {
            let cap = class.fractional?;
            let (mut mib, mut pct) = (0u32, 0u32);
            for r in &g.replicas {
                let part = classes::fractional_part(models.get(r.model.as_str())?, class)?;
                mib = mib.saturating_add(part.mib);
                pct = pct.saturating_add(part.pct);
            }
            let n = g.replicas.len() as u32;
            Some(Room::Fractional(
                cap.memory_mib.saturating_sub(mib),
                cap.cores.saturating_sub(pct),
                cap.shares.saturating_sub(n),
            ))
        }
        // Time-slicing enforces no compute limit: its replicas share the
        // device's time, so an unused share is compute the others already
        // get, not room.
        Mode::Timeslice => None,
        Mode::Mps => {
            let n = g.mps_replicas?;
            let t = class
                .slot_types
                .iter()
                .position(|t| t.kind == SlotKind::Mps(n))?;
            let free = u32::from(n).saturating_sub(g.replicas.len() as u32);
            (free > 0).then_some(Room::Shares(free, t))
        }
        Mode::Mig => {
            let mut free = Vec::new();
            for p in &g.geometry {
                // An instance with nothing on it, of a profile the node
                // does not time-slice: a pod of a time-sliced profile asks
                // for any share of any instance of it
                // (`nvidia.com/mig-<profile>.shared`), so a spare meant for
                // an empty instance could share another's time with its
                // replicas.
                if g.replicas.iter().any(|r| r.start == Some(p.start))
                    || shared.is_some_and(|(sp, _)| sp == p.profile.trim_end_matches("+me"))
                {
                    continue;
                }
                let Some(t) = class.instance_slot(&p.profile, shared) else {
                    continue;
                };
                free.push((p.profile.clone(), p.start, 1, t));
            }
            (!free.is_empty()).then_some(Room::Mig(free))
        }
        Mode::Whole | Mode::Idle => None,
    }
}

/// A spare of `m` in `room` (a GPU of `class`), preferring the MIG
/// instance at `start`: the room left after it, and for MIG the
/// instance's (profile, start).
fn take(
    room: &Room,
    m: &Model,
    class: &Class,
    start: Option<u8>,
) -> Option<(Room, Option<(String, u8)>)> {
    match room {
        Room::Fractional(mib, pct, n) => {
            let part = classes::fractional_part(m, class)?;
            (part.gpus == 1 && part.mib <= *mib && part.pct <= *pct && *n >= 1).then(|| {
                (
                    Room::Fractional(mib - part.mib, pct - part.pct, n - 1),
                    None,
                )
            })
        }
        Room::Shares(free, t) => (*free >= 1
            && classes::fits_slot(m, class, &class.slot_types[*t]))
        .then(|| (Room::Shares(free - 1, *t), None)),
        Room::Mig(free) => {
            let mut order: Vec<usize> = (0..free.len()).collect();
            order.sort_by_key(|&i| Some(free[i].1) != start);
            let i = order.into_iter().find(|&i| {
                free[i].2 >= 1 && classes::fits_slot(m, class, &class.slot_types[free[i].3])
            })?;
            let mut rest = free.clone();
            rest[i].2 -= 1;
            let at = (rest[i].0.clone(), rest[i].1);
            rest.retain(|f| f.2 > 0);
            Some((Room::Mig(rest), Some(at)))
        }
    }
}
