//! Leader election over a `coordination.k8s.io/v1` Lease, with client-go's
//! semantics (`tools/leaderelection`), pure: the shell in
//! [`crate::backend`] reads and writes the Lease and tells the [`Elector`]
//! what it saw and when.
//!
//! - **Expiry is judged on the local clock.** Another holder's lease is
//!   valid until `leaseDurationSeconds` after *this* process last saw the
//!   record change, never by comparing the holder's `renewTime` with the
//!   local clock: the two machines' clocks may differ. A candidate that
//!   starts beside a live leader therefore waits a full lease duration
//!   before it may take over (as client-go's candidates do).
//! - **Renew deadline.** The leader leads only while its last successful
//!   renewal is younger than `renewDeadline` (shorter than the lease): a
//!   renewal that fails, or a loop that stalls on a slow API call, steps
//!   it down before any candidate can see the lease expire. Every write
//!   the leader makes checks [`Elector::leading`] first.
//! - **Renew period.** The lease is renewed every `retryPeriod`, not every
//!   controller tick.
//! - **Release.** On shutdown the leader writes the lease with no holder
//!   and a 1 s duration, so a successor takes over at once.
//!
//! The times the Elector keeps are [`tokio::time::Instant`]s (monotonic,
//! local); the times written into the Lease are wall-clock, for people
//! reading it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// The election's timing (client-go's `LeaderElectionConfig`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// How long a lease lasts unrenewed, as candidates judge it.
    pub lease_duration: Duration,
    /// How long the leader goes on leading after its last renewal.
    pub renew_deadline: Duration,
    /// How often the lease is tried (renewed, or acquired).
    pub retry_period: Duration,
}

/// The lease as last read or written, and when this process saw it change.
#[derive(Debug, Clone)]
struct Seen {
    lease: Lease,
    at: Instant,
}

/// One process's view of the election.
#[derive(Debug, Clone)]
pub struct Elector {
    name: String,
    namespace: String,
    identity: String,
    timing: Timing,
    seen: Option<Seen>,
    renewed: Option<Instant>,
    tried: Option<Instant>,
}

/// What to write after reading the lease.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// No lease: create this one.
    Create(Lease),
    /// Ours (renew), or free or expired (take over): replace it with this
    /// one (its `resourceVersion` is the one read, so a concurrent writer
    /// makes the write fail with 409).
    Update(Lease),
    /// Someone else holds it and it has not expired.
    Follow {
        /// The holder.
        holder: String,
    },
}

fn micro(wall: Duration) -> MicroTime {
    MicroTime(Timestamp::from_nanosecond(wall.as_nanos() as i128).unwrap_or(Timestamp::UNIX_EPOCH))
}

fn holder(l: &Lease) -> &str {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .unwrap_or("")
}

fn duration_of(l: &Lease) -> Duration {
    Duration::from_secs(
        l.spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .unwrap_or(0)
            .max(0) as u64,
    )
}

/// The part of a lease that says who holds it and since when (the
/// resourceVersion and managed fields change on every write and are not
/// a change of the record).
fn record(l: &Lease) -> Option<LeaseSpec> {
    l.spec.clone()
}

impl Elector {
    /// An elector for the lease `namespace/name`, as `identity`.
    pub fn new(name: &str, namespace: &str, identity: &str, timing: Timing) -> Self {
        Elector {
            name: name.to_string(),
            namespace: namespace.to_string(),
            identity: identity.to_string(),
            timing,
            seen: None,
            renewed: None,
            tried: None,
        }
    }

    /// Who this process is.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The last lease seen names this process as its holder.
    fn holds(&self) -> bool {
        self.seen
            .as_ref()
            .is_some_and(|s| holder(&s.lease) == self.identity)
    }

    /// This process leads at `now`: it holds the lease and renewed it
    /// less than the renew deadline ago.
    pub fn leading(&self, now: Instant) -> bool {
        self.holds()
            && self
                .renewed
                .is_some_and(|t| now.saturating_duration_since(t) < self.timing.renew_deadline)
    }

    /// It is time to try the lease again (every retry period).
    pub fn due(&self, now: Instant) -> bool {
        self.tried
            .is_none_or(|t| now.saturating_duration_since(t) >= self.timing.retry_period)
    }

    /// Notes an attempt (renewal or acquisition) at `now`.
    pub fn tried(&mut self, now: Instant) {
        self.tried = Some(now);
    }

    /// The last lease seen is still valid at `now`, judged by when this
    /// process saw it change.
    fn valid(&self, now: Instant) -> bool {
        self.seen
            .as_ref()
            .is_some_and(|s| now < s.at + duration_of(&s.lease))
    }

    /// The lease this process would write: held by it, renewed at `wall`.
    fn ours(&self, acquired: MicroTime, transitions: i32, wall: Duration) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                resource_version: self
                    .seen
                    .as_ref()
                    .and_then(|s| s.lease.metadata.resource_version.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.identity.clone()),
                lease_duration_seconds: Some(self.timing.lease_duration.as_secs() as i32),
                acquire_time: Some(acquired),
                renew_time: Some(micro(wall)),
                lease_transitions: Some(transitions),
                ..LeaseSpec::default()
            }),
        }
    }

    /// The leader's renewal without reading first (client-go's fast path):
    /// the lease last seen, renewed at `wall`. `None` when this process
    /// does not lead at `now`.
    pub fn renewal(&self, wall: Duration, now: Instant) -> Option<Lease> {
        if !(self.holds() && self.valid(now)) {
            return None;
        }
        let s = self.seen.as_ref()?.lease.spec.clone().unwrap_or_default();
        Some(self.ours(
            s.acquire_time.unwrap_or_else(|| micro(wall)),
            s.lease_transitions.unwrap_or(0),
            wall,
        ))
    }

    /// Takes in the lease as read at `now` (`None`: there is none) and
    /// says what to write.
    pub fn step(&mut self, read: Option<&Lease>, wall: Duration, now: Instant) -> Step {
        let Some(read) = read else {
            self.seen = None;
            return Step::Create(self.ours(micro(wall), 0, wall));
        };
        let changed = self
            .seen
            .as_ref()
            .is_none_or(|s| record(&s.lease) != record(read));
        if changed {
            self.seen = Some(Seen {
                lease: read.clone(),
                at: now,
            });
        } else if let Some(s) = &mut self.seen {
            // Same record: keep when it was first seen, take the new
            // resourceVersion.
            s.lease.metadata = read.metadata.clone();
        }
        let h = holder(read);
        if !h.is_empty() && h != self.identity && self.valid(now) {
            self.renewed = None;
            return Step::Follow {
                holder: h.to_string(),
            };
        }
        let s = read.spec.clone().unwrap_or_default();
        let transitions = s.lease_transitions.unwrap_or(0);
        if h == self.identity {
            Step::Update(self.ours(
                s.acquire_time.unwrap_or_else(|| micro(wall)),
                transitions,
                wall,
            ))
        } else {
            Step::Update(self.ours(micro(wall), transitions + 1, wall))
        }
    }

    /// The write of `lease` (a create, an update or a renewal) succeeded
    /// at `now`, and the API server answered with `written`.
    pub fn won(&mut self, written: Lease, now: Instant) {
        self.seen = Some(Seen {
            lease: written,
            at: now,
        });
        self.renewed = Some(now);
    }

    /// A write of the lease was refused with a conflict: someone else
    /// wrote it since it was read; the next try reads it again.
    pub fn conflicted(&mut self) {
        if let Some(s) = &mut self.seen {
            // Forget the resourceVersion so that the fast path is not
            // taken again with it.
            s.lease.metadata.resource_version = None;
        }
        if !self.holds() {
            self.renewed = None;
        }
    }

    /// The release written on shutdown: the lease last seen with no
    /// holder and a 1 s duration (client-go's `release`). `None` when
    /// this process does not lead.
    pub fn release(&self, wall: Duration, now: Instant) -> Option<Lease> {
        if !self.leading(now) {
            return None;
        }
        let mut l = self.ours(micro(wall), 0, wall);
        let s = self.seen.as_ref()?.lease.spec.clone().unwrap_or_default();
        if let Some(spec) = &mut l.spec {
            spec.holder_identity = Some(String::new());
            spec.lease_duration_seconds = Some(1);
            spec.lease_transitions = s.lease_transitions;
        }
        Some(l)
    }

    /// Steps down at once (the lease was released or lost).
    pub fn step_down(&mut self) {
        self.renewed = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn lease(holder: &str, renewed_s: i64, rv: &str) -> Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l", "namespace": "ns", "resourceVersion": rv},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                     "acquireTime": Timestamp::from_second(renewed_s).unwrap().to_string(),
                     "renewTime": Timestamp::from_second(renewed_s).unwrap().to_string(),
                     "leaseTransitions": 2}
        }))
        .unwrap()
    }

    const WALL: Duration = Duration::from_secs(1_795_976_401);

    /// The other holder's `renewTime` is an hour in the past by our wall
    /// clock (its clock is behind): judged locally, the lease is live
    /// until 15 s pass with no change seen.
    #[test]
    fn expiry_is_judged_by_the_local_time_since_the_record_last_changed() {
        let t0 = Instant::now();
        let mut e = Elector::new("l", "ns", "me", timing());
        let stale_looking = lease("other", WALL.as_secs() as i64 - 3600, "7");
        assert_eq!(
            e.step(Some(&stale_looking), WALL, t0),
            Step::Follow {
                holder: "other".into()
            }
        );
        assert_eq!(
            e.step(Some(&stale_looking), WALL, t0 + Duration::from_secs(14)),
            Step::Follow {
                holder: "other".into()
            }
        );
        // Renewed in between: the 15 s start again.
        let renewed = lease("other", WALL.as_secs() as i64 - 3590, "8");
        assert!(matches!(
            e.step(Some(&renewed), WALL, t0 + Duration::from_secs(16)),
            Step::Follow { .. }
        ));
        match e.step(Some(&renewed), WALL, t0 + Duration::from_secs(31)) {
            Step::Update(l) => {
                assert_eq!(l.metadata.resource_version.as_deref(), Some("8"));
                let s = l.spec.unwrap();
                assert_eq!(s.holder_identity.as_deref(), Some("me"));
                assert_eq!(s.lease_transitions, Some(3));
                assert_eq!(s.renew_time.unwrap().0.as_second(), WALL.as_secs() as i64);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_leader_steps_down_when_it_cannot_renew_within_the_deadline() {
        let t0 = Instant::now();
        let mut e = Elector::new("l", "ns", "me", timing());
        let Step::Create(l) = e.step(None, WALL, t0) else {
            panic!()
        };
        assert!(!e.leading(t0), "not before the write succeeds");
        e.tried(t0);
        e.won(l, t0);
        assert!(e.leading(t0 + Duration::from_millis(9_999)));
        assert!(!e.due(t0 + Duration::from_secs(1)), "renewed every 2 s");
        assert!(e.due(t0 + Duration::from_secs(2)));
        // No renewal succeeded for 10 s: no longer leading, though the
        // lease has 5 s left for candidates.
        assert!(!e.leading(t0 + Duration::from_secs(10)));
        // The fast path keeps acquire time and transitions.
        let r = e.renewal(WALL, t0 + Duration::from_secs(2)).unwrap();
        assert_eq!(r.spec.as_ref().unwrap().lease_transitions, Some(0));
        e.won(r, t0 + Duration::from_secs(2));
        assert!(e.leading(t0 + Duration::from_secs(11)));
    }

    #[test]
    fn a_conflict_or_another_holder_ends_leadership() {
        let t0 = Instant::now();
        let mut e = Elector::new("l", "ns", "me", timing());
        e.won(lease("me", WALL.as_secs() as i64, "3"), t0);
        assert!(e.leading(t0));
        // Someone else holds it now (read after a failed renewal).
        assert!(matches!(
            e.step(
                Some(&lease("other", 0, "4")),
                WALL,
                t0 + Duration::from_secs(2)
            ),
            Step::Follow { .. }
        ));
        assert!(!e.leading(t0 + Duration::from_secs(2)));
    }

    #[test]
    fn release_empties_the_holder() {
        let t0 = Instant::now();
        let mut e = Elector::new("l", "ns", "me", timing());
        assert!(e.release(WALL, t0).is_none(), "nothing to release");
        e.won(lease("me", WALL.as_secs() as i64, "3"), t0);
        let r = e.release(WALL, t0).unwrap();
        let s = r.spec.unwrap();
        assert_eq!(s.holder_identity.as_deref(), Some(""));
        assert_eq!(s.lease_duration_seconds, Some(1));
        assert_eq!(s.lease_transitions, Some(2));
        assert_eq!(r.metadata.resource_version.as_deref(), Some("3"));
        // A released lease is free: a candidate takes it at once.
        let mut c = Elector::new("l", "ns", "next", timing());
        let released: Lease = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "l", "resourceVersion": "4"},
            "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 2}
        }))
        .unwrap();
        assert!(matches!(c.step(Some(&released), WALL, t0), Step::Update(_)));
    }
}
