//! Admission and balancing for one model, as a pure state machine: which
//! replica a request goes to (among replicas with free capacity and not
//! ejected, by [`crate::affinity::choose`]: the owner of its prefix within
//! bounded loads, else the least outstanding), who waits (a queue per priority class, bounded),
//! who is handed the slot a finished request frees (critical first, then
//! standard, then sheddable; within a class first in first out while the
//! queue keeps up, newest first once its oldest waiter has waited past the
//! model's budget: adaptive LIFO), how clients share a class's places
//! (a full queue takes a place from the client holding the most, and
//! freed slots go round robin among the clients waiting:
//! [`crate::fairness`]), and which replicas are ejected after repeated
//! failures.
//!
//! Why newest first under overload: a waiter past its budget has missed
//! its SLO whatever happens next, and serving it first makes every request
//! behind it miss too. Newest first serves the requests that can still
//! make it while the queue is backed up; the oldest are served when it
//! drains, or answered 503 at the queue timeout. This is Facebook's
//! *adaptive LIFO* (Maurer, "Fail at Scale", ACM Queue 13(8), 2015).
//!
//! No clock reads and no I/O: callers pass `now`; a waiter is any value `W`
//! (the gateway's is the sending half of a oneshot channel), so the rules
//! are tested without a runtime. The async shell is in [`crate::state`].

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::time::{Duration, Instant};

use gpuscale_policies::model::Priority;

use crate::affinity::{self, Balance, Candidate, Hint, Reason};
use crate::config::Endpoint;
use crate::fairness::Client;

/// A replica's identity for the lifetime of the gateway (indices shift when
/// replicas leave; ids do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaId(pub u64);

/// The span a replica's prefill utilisation is measured over.
pub const PREFILL_WINDOW: Duration = Duration::from_secs(10);

/// One replica of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Replica {
    /// Its id.
    pub id: ReplicaId,
    /// Its address.
    pub endpoint: Endpoint,
    /// Requests sent to it and not finished (a stream until its last byte).
    pub in_flight: u32,
    /// Most requests at once.
    pub limit: u32,
    /// Consecutive failures.
    pub failures: u32,
    /// When it last answered a request (a stream's first token, another
    /// response's first chunk of several or its end), noted by the
    /// request's permit without the pool's lock.
    pub answered: Answered,
    /// No traffic until then.
    pub ejected_until: Option<Instant>,
    /// Deregistered: takes no new requests, leaves when idle.
    pub draining: bool,
    /// Requests waiting inside the model server, from its own metrics.
    pub server_waiting: u32,
    /// Its [`affinity::tag`] (the same in every gateway).
    pub tag: u64,
    /// KV-cache utilisation from its metrics, 0–1 (0 when unknown).
    pub kv: f64,
    /// Adapters it has: configured or registered (no expiry), or seen in
    /// its metrics (until the instant given).
    pub adapters: Vec<(u16, Option<Instant>)>,
    /// The pool's pick count when it was last chosen.
    pub last_pick: Option<u64>,
    /// Its metrics' prefill seconds at recent scrapes, and when.
    pub prefill_marks: VecDeque<(f64, Instant)>,
    /// Prefill seconds per second over about [`PREFILL_WINDOW`].
    pub prefill_busy: Option<f64>,
}

impl Replica {
    fn available(&self, now: Instant) -> bool {
        !self.draining && self.in_flight < self.limit && self.ejected_until.is_none_or(|t| t <= now)
    }

    fn has_adapter(&self, adapter: Option<u16>, now: Instant) -> bool {
        adapter.is_some_and(|a| {
            self.adapters
                .iter()
                .any(|&(x, until)| x == a && until.is_none_or(|t| t > now))
        })
    }
}

/// A slot taken on a replica.
#[derive(Debug, Clone, PartialEq)]
pub struct Slot {
    /// The replica.
    pub replica: ReplicaId,
    /// Its address.
    pub endpoint: Endpoint,
    /// Why it was chosen.
    pub reason: Reason,
    /// Whether it was routed as a shared prefix (its key seen before, or
    /// the hint said so): a retry elsewhere is routed the same way.
    pub shared: bool,
    /// Where the replica's last answer is noted.
    pub answered: Answered,
}

/// The instant [`Answered`] counts from.
static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

/// When a replica last answered a request, shared by the replica's entry
/// and the permits of its requests, so a response notes it without the
/// pool's lock (a stream that has not ended has still answered).
#[derive(Debug, Clone)]
pub struct Answered(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Default for Answered {
    /// None yet. The epoch is fixed here, before any request to the
    /// replica is admitted: fixed at the first answer instead, it would
    /// come after that answer's instant, which would then read as 0.
    fn default() -> Self {
        std::sync::LazyLock::force(&EPOCH);
        Answered(std::sync::Arc::default())
    }
}

impl PartialEq for Answered {
    /// The same replica's record.
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Answered {
    /// The replica answered at `at`.
    pub fn note(&self, at: Instant) {
        let n = at.saturating_duration_since(*EPOCH).as_nanos();
        let n = u64::try_from(n).unwrap_or(u64::MAX - 1) + 1;
        self.0.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether an answer came after `t`.
    pub fn after(&self, t: Instant) -> bool {
        let last = self.0.load(std::sync::atomic::Ordering::Relaxed);
        let t = t.saturating_duration_since(*EPOCH).as_nanos();
        last != 0 && u128::from(last - 1) > t
    }
}

/// Replicas in one state, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Group {
    /// Replicas.
    pub replicas: usize,
    /// Requests in flight on them.
    pub in_flight: u32,
    /// Σ their concurrency limits.
    pub capacity: u32,
}

/// The replicas of a model by state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Taking traffic: registered, not draining, not ejected.
    pub ready: Group,
    /// Ejected for failing (they come back when the ejection ends).
    pub ejected: Group,
    /// Deregistered, finishing their requests.
    pub draining: Group,
}

/// Index of a priority class in the queues: critical 0, standard 1,
/// sheddable 2.
pub fn class_index(p: Priority) -> usize {
    match p {
        Priority::Critical => 0,
        Priority::Standard => 1,
        Priority::Sheddable => 2,
    }
}

/// What [`Pool::enqueue`] did.
#[derive(Debug, PartialEq)]
pub enum Enqueued<W> {
    /// The request waits.
    Waiting,
    /// The queue is full of requests at least as important: this one is
    /// refused (429).
    Rejected(W),
    /// The queue was full; a waiter of a lower class gave up its place
    /// (it gets 429) and this one waits: the class's newest, or its oldest
    /// while the class is backed up.
    Displaced(W),
    /// The queue was full and this one's class backed up: its oldest
    /// waiter, already past its budget, gave up its place (it gets 503)
    /// and this one, which newest first serves next, waits. (With several
    /// clients: the oldest of this one's client's, or of a client holding
    /// more.)
    Overdue(W),
    /// The queue was full and another client held more of this one's
    /// class than this one's client would once queued: of the clients
    /// holding the most, the newest waiter (the oldest while the class is
    /// backed up) gave up its place (it gets 429) and this one waits.
    Crowded(W),
}

/// One waiting request.
#[derive(Debug)]
struct Waiter<W> {
    /// The id the caller chose.
    id: u64,
    /// For the choice of its replica.
    hint: Hint,
    /// The caller's value.
    waiter: W,
    /// When it queued.
    at: Instant,
    /// Whose it is.
    client: Client,
}

/// One priority class's waiters, oldest first, and how many each client
/// holds.
#[derive(Debug)]
struct Queue<W> {
    waiters: VecDeque<Waiter<W>>,
    /// Waiters per client; a client with none is not listed.
    holders: BTreeMap<Client, usize>,
    /// The client served last: the round robin goes on after it.
    served: Option<Client>,
}

impl<W> Queue<W> {
    fn new() -> Self {
        Queue {
            waiters: VecDeque::new(),
            holders: BTreeMap::new(),
            served: None,
        }
    }

    fn len(&self) -> usize {
        self.waiters.len()
    }

    fn push(&mut self, w: Waiter<W>) {
        *self.holders.entry(w.client).or_insert(0) += 1;
        self.waiters.push_back(w);
    }

    fn remove(&mut self, i: usize) -> Option<Waiter<W>> {
        let w = self.waiters.remove(i)?;
        if let Some(n) = self.holders.get_mut(&w.client) {
            *n -= 1;
            if *n == 0 {
                self.holders.remove(&w.client);
            }
        }
        Some(w)
    }

    fn held(&self, client: Client) -> usize {
        self.holders.get(&client).copied().unwrap_or(0)
    }

    /// The index of `client`'s oldest waiter, or its newest.
    fn of(&self, client: Client, newest: bool) -> Option<usize> {
        if self.holders.len() == 1 {
            // One client holds them all (the common case): no search.
            return self
                .holders
                .contains_key(&client)
                .then(|| if newest { self.len() - 1 } else { 0 });
        }
        if newest {
            self.waiters.iter().rposition(|w| w.client == client)
        } else {
            self.waiters.iter().position(|w| w.client == client)
        }
    }

    /// The most waiters a client other than `except` holds (0: none).
    fn most(&self, except: Option<Client>) -> usize {
        self.holders
            .iter()
            .filter(|&(&c, _)| Some(c) != except)
            .map(|(_, &n)| n)
            .max()
            .unwrap_or(0)
    }

    /// The index of the class's newest waiter (or oldest) among those of
    /// clients other than `except` holding the most: of clients holding
    /// as many, none is picked for its identity, only for its waiter's
    /// age, as the class's own order would.
    fn heaviest(&self, except: Option<Client>, newest: bool) -> Option<usize> {
        let most = self.most(except);
        if most == 0 {
            return None;
        }
        let heavy = |w: &Waiter<W>| Some(w.client) != except && self.held(w.client) == most;
        if newest {
            self.waiters.iter().rposition(heavy)
        } else {
            self.waiters.iter().position(heavy)
        }
    }

    /// The index of the waiter served next: the oldest (or, `newest`, the
    /// newest) of the client whose turn it is, the next in client order
    /// after the one served last.
    fn next(&self, newest: bool) -> Option<usize> {
        let client = self
            .served
            .and_then(|s| {
                self.holders
                    .range((Bound::Excluded(s), Bound::Unbounded))
                    .next()
            })
            .or_else(|| self.holders.iter().next())
            .map(|(&c, _)| c)?;
        self.of(client, newest)
    }
}

/// A model's replicas and its waiting requests.
#[derive(Debug)]
pub struct Pool<W> {
    replicas: Vec<Replica>,
    /// Per class: the waiters.
    queues: [Queue<W>; 3],
    /// A class is served newest first while its oldest waiter has waited
    /// this long; `None`: always oldest first.
    newest_first_after: Option<Duration>,
    /// Grants handed newest first so far.
    newest_first_grants: u64,
    balance: Balance,
    max_queue: usize,
    default_limit: u32,
    next_id: u64,
    /// Rotates the starting point among equally loaded replicas.
    cursor: usize,
    /// Requests routed so far.
    picks: u64,
    /// Prefix keys routed recently, direct-mapped by the key's low bits:
    /// a key found here counts as shared.
    seen: Box<[u64]>,
}

/// Slots of [`Pool`]'s table of recent prefix keys.
pub const SEEN_SLOTS: usize = 4096;

impl<W> Pool<W> {
    /// An empty pool: at most `max_queue` waiters; replicas serve
    /// `default_limit` requests at once unless registered with another.
    pub fn new(max_queue: usize, default_limit: u32) -> Self {
        Pool {
            replicas: Vec::new(),
            queues: [Queue::new(), Queue::new(), Queue::new()],
            newest_first_after: None,
            newest_first_grants: 0,
            balance: Balance::default(),
            max_queue,
            default_limit: default_limit.max(1),
            next_id: 0,
            cursor: 0,
            picks: 0,
            seen: vec![0; SEEN_SLOTS].into_boxed_slice(),
        }
    }

    /// Sets how requests are spread over the replicas.
    pub fn set_balance(&mut self, balance: Balance) {
        self.balance = balance;
    }

    /// Serves each class newest first while its oldest waiter has waited
    /// at least `after` (adaptive LIFO); `None` serves every class oldest
    /// first, always.
    pub fn set_newest_first_after(&mut self, after: Option<Duration>) {
        self.newest_first_after = after;
    }

    /// Slots handed to the newest waiter of a backed-up class, ahead of
    /// older ones, so far.
    pub fn newest_first_grants(&self) -> u64 {
        self.newest_first_grants
    }

    /// How long the oldest waiter of any class has waited at `now`.
    pub fn oldest_wait(&self, now: Instant) -> Option<Duration> {
        self.queues
            .iter()
            .filter_map(|q| q.waiters.front())
            .map(|f| now.saturating_duration_since(f.at))
            .max()
    }

    /// Whether some class is backed up at `now`: it is served newest first.
    pub fn newest_first(&self, now: Instant) -> bool {
        (0..3).any(|c| self.backed_up(c, now))
    }

    fn backed_up(&self, class: usize, now: Instant) -> bool {
        self.newest_first_after.is_some_and(|after| {
            self.queues[class]
                .waiters
                .front()
                .is_some_and(|f| now.saturating_duration_since(f.at) >= after)
        })
    }

    /// The replicas (draining ones included).
    pub fn replicas(&self) -> &[Replica] {
        &self.replicas
    }

    /// Replicas that take new requests: registered, not draining, not
    /// ejected (an ejection that has run out counts as over once the next
    /// request looked for a slot).
    pub fn ready_replicas(&self) -> usize {
        self.replicas
            .iter()
            .filter(|r| !r.draining && r.ejected_until.is_none())
            .count()
    }

    /// Requests waiting, per class.
    pub fn waiting_by_class(&self) -> [usize; 3] {
        [
            self.queues[0].len(),
            self.queues[1].len(),
            self.queues[2].len(),
        ]
    }

    /// Requests waiting.
    pub fn waiting(&self) -> usize {
        self.queues.iter().map(Queue::len).sum()
    }

    /// Requests in flight on all replicas.
    pub fn in_flight(&self) -> u32 {
        self.replicas.iter().map(|r| r.in_flight).sum()
    }

    /// The replicas by state at `now`: those that take traffic, the
    /// ejected ones and the draining ones, each with its in-flight
    /// requests and capacity.
    pub fn census(&self, now: Instant) -> Census {
        let mut c = Census::default();
        for r in &self.replicas {
            let group = if r.draining {
                &mut c.draining
            } else if r.ejected_until.is_some_and(|t| t > now) {
                &mut c.ejected
            } else {
                &mut c.ready
            };
            group.replicas += 1;
            group.in_flight += r.in_flight;
            group.capacity = group.capacity.saturating_add(r.limit);
        }
        c
    }

    /// Whether `endpoint` is one of the replicas.
    pub fn has_replica(&self, endpoint: &Endpoint) -> bool {
        self.replicas.iter().any(|r| &r.endpoint == endpoint)
    }

    /// Adds a replica (or un-drains one registered again); returns its id.
    pub fn add_replica(&mut self, endpoint: Endpoint, limit: Option<u32>) -> ReplicaId {
        let limit = limit.unwrap_or(self.default_limit).max(1);
        if let Some(r) = self.replicas.iter_mut().find(|r| r.endpoint == endpoint) {
            r.draining = false;
            r.limit = limit;
            return r.id;
        }
        let id = ReplicaId(self.next_id);
        self.next_id += 1;
        self.replicas.push(Replica {
            id,
            in_flight: 0,
            limit,
            failures: 0,
            answered: Answered::default(),
            ejected_until: None,
            draining: false,
            server_waiting: 0,
            prefill_marks: VecDeque::new(),
            prefill_busy: None,
            tag: affinity::tag(endpoint.authority()),
            kv: 0.0,
            adapters: Vec::new(),
            last_pick: None,
            endpoint,
        });
        id
    }

    /// Deregisters a replica: gone at once when idle, else it drains.
    /// Returns whether it was known.
    pub fn remove_replica(&mut self, endpoint: &Endpoint) -> bool {
        let Some(i) = self.replicas.iter().position(|r| &r.endpoint == endpoint) else {
            return false;
        };
        if self.replicas[i].in_flight == 0 {
            self.replicas.remove(i);
        } else {
            self.replicas[i].draining = true;
        }
        true
    }

    /// Takes a slot on the replica the balance chooses for `hint`, if one
    /// is available and nobody is waiting (waiters go first).
    pub fn acquire(&mut self, now: Instant, hint: Hint) -> Option<Slot> {
        if self.waiting() > 0 {
            return None;
        }
        self.take_slot(now, &[], hint, true)
    }

    /// Like [`Pool::acquire`], avoiding some replicas (a retry after a
    /// failed connect), and ignoring waiters (the request already left the
    /// queue). The table of recent prefix keys is neither read nor
    /// written: the request's first slot recorded its key, so `hint`
    /// should carry that slot's [`Slot::shared`].
    pub fn acquire_other(&mut self, now: Instant, avoid: &[ReplicaId], hint: Hint) -> Option<Slot> {
        self.take_slot(now, avoid, hint, false)
    }

    /// With `remember`, a prefix key found in the table of recent keys
    /// counts as shared, and the key is recorded once a slot is granted:
    /// not before, or a request that found every replica busy would find
    /// its own key when a slot frees and count as shared.
    fn take_slot(
        &mut self,
        now: Instant,
        avoid: &[ReplicaId],
        mut hint: Hint,
        remember: bool,
    ) -> Option<Slot> {
        let seen_at = hint
            .key
            .filter(|_| remember)
            .map(|key| ((key as usize) % SEEN_SLOTS, key));
        if let Some((at, key)) = seen_at {
            hint.shared |= self.seen[at] == key;
        }
        let mut index = Vec::with_capacity(self.replicas.len());
        let mut cands = Vec::with_capacity(self.replicas.len());
        for (i, r) in self.replicas.iter_mut().enumerate() {
            if r.ejected_until.is_some_and(|t| t <= now) {
                r.ejected_until = None;
            }
            if r.draining || r.ejected_until.is_some() {
                continue;
            }
            index.push(i);
            cands.push(Candidate {
                tag: r.tag,
                load: u64::from(r.in_flight) + u64::from(r.server_waiting),
                waiting: u64::from(r.server_waiting),
                limit: r.limit,
                kv: r.kv,
                available: r.available(now) && !avoid.contains(&r.id),
                has_adapter: r.has_adapter(hint.adapter, now),
                since: r.last_pick.map_or(u64::MAX, |p| self.picks - p),
            });
        }
        let start = if cands.is_empty() {
            0
        } else {
            self.cursor % cands.len()
        };
        let choice = affinity::choose(&self.balance, &cands, hint, start)?;
        if let Some((at, key)) = seen_at {
            self.seen[at] = key;
        }
        // The rotation among equally loaded replicas moves on only with
        // its own picks: a prefix's owner, chosen by hash, would send it
        // to a random place, after which it picks again among replicas
        // it chose a moment ago.
        if !matches!(choice.reason, Reason::Affinity | Reason::Spill) {
            self.cursor = choice.index + 1;
        }
        self.picks += 1;
        let r = &mut self.replicas[index[choice.index]];
        r.in_flight += 1;
        r.last_pick = Some(self.picks);
        Some(Slot {
            replica: r.id,
            endpoint: r.endpoint.clone(),
            reason: choice.reason,
            shared: hint.shared,
            answered: r.answered.clone(),
        })
    }

    /// Queues a waiter of one population of requests ([`Client`]'s
    /// default): [`Pool::enqueue_from`] without fairness between clients.
    pub fn enqueue(
        &mut self,
        id: u64,
        priority: Priority,
        hint: Hint,
        waiter: W,
        now: Instant,
    ) -> Enqueued<W> {
        self.enqueue_from(Client::default(), id, priority, hint, waiter, now)
    }

    /// Queues `client`'s waiter, arrived at `now`, with an id the caller
    /// chose (to find it again on timeout). `hint` is kept for the choice
    /// of its replica when a slot frees.
    ///
    /// When the queue is full, in order: a lower class gives up a waiter
    /// (its newest, or oldest while backed up, of the clients holding the
    /// most of it); another client holding more of this class than
    /// `client` would once queued gives one up, its newest, or oldest while
    /// backed up (longest queue drop); in a backed-up class, the oldest
    /// waiter past its budget of `client`'s own or of a client holding more
    /// than `client` gives it up; else this one is refused. With one
    /// client this is the queue's own order: the lower class's newest
    /// (oldest while it is backed up), then this class's oldest once past
    /// its budget.
    pub fn enqueue_from(
        &mut self,
        client: Client,
        id: u64,
        priority: Priority,
        hint: Hint,
        waiter: W,
        now: Instant,
    ) -> Enqueued<W> {
        let class = class_index(priority);
        let w = Waiter {
            id,
            hint,
            waiter,
            at: now,
            client,
        };
        if self.waiting() < self.max_queue {
            self.queues[class].push(w);
            return Enqueued::Waiting;
        }
        // Full: a lower class gives up a waiter, its newest, or its oldest
        // while it is backed up (that one has missed its budget already,
        // and the newest is the next the class serves); of its clients,
        // the one holding the most.
        for lower in (class + 1..3).rev() {
            let backed_up = self.backed_up(lower, now);
            let q = &mut self.queues[lower];
            if let Some(i) = q.heaviest(None, !backed_up)
                && let Some(out) = q.remove(i)
            {
                self.queues[class].push(w);
                return Enqueued::Displaced(out.waiter);
            }
        }
        let backed_up = self.backed_up(class, now);
        let q = &mut self.queues[class];
        // Another client holds more of the class than this one would once
        // queued: it gives up its newest (its oldest while backed up).
        let mine = q.held(client);
        if q.most(Some(client)) > mine + 1
            && let Some(i) = q.heaviest(Some(client), !backed_up)
            && let Some(out) = q.remove(i)
        {
            q.push(w);
            return Enqueued::Crowded(out.waiter);
        }
        // Backed up: this client's oldest waiter, or one of a client
        // holding more than this one, past its budget, gives up its place
        // to this one, which newest first serves next (the class's oldest
        // of those; never one of a client holding as many or fewer, whose
        // turn in the round robin would come).
        if backed_up
            && let Some(i) = q
                .waiters
                .iter()
                .position(|o| o.client == client || q.held(o.client) > mine)
            && self
                .newest_first_after
                .is_some_and(|after| now.saturating_duration_since(q.waiters[i].at) >= after)
            && let Some(out) = q.remove(i)
        {
            q.push(w);
            return Enqueued::Overdue(out.waiter);
        }
        Enqueued::Rejected(w.waiter)
    }

    /// Takes a waiter out (its wait ended); `None` when it is no longer
    /// queued (it was granted a slot or displaced).
    pub fn remove_waiter(&mut self, id: u64) -> Option<W> {
        for q in &mut self.queues {
            if let Some(i) = q.waiters.iter().position(|w| w.id == id) {
                return q.remove(i).map(|w| w.waiter);
            }
        }
        None
    }

    /// A request on `replica` finished: frees its slot (and removes the
    /// replica if it was draining and is now idle).
    pub fn release(&mut self, replica: ReplicaId) {
        if let Some(i) = self.replicas.iter().position(|r| r.id == replica) {
            let r = &mut self.replicas[i];
            r.in_flight = r.in_flight.saturating_sub(1);
            if r.draining && r.in_flight == 0 {
                self.replicas.remove(i);
            }
        }
    }

    /// Hands free slots to waiters, most important class first; within a
    /// class round robin among its clients, each client's oldest first, or
    /// its newest while the class is backed up (see
    /// [`Pool::set_newest_first_after`]). The caller delivers each grant; a
    /// waiter that is gone hands its slot back through [`Pool::release`].
    pub fn dispatch(&mut self, now: Instant) -> Vec<(W, Slot)> {
        let mut out = Vec::new();
        while let Some(class) = self.queues.iter().position(|q| q.len() > 0) {
            let newest = self.backed_up(class, now);
            let q = &self.queues[class];
            let Some(i) = q.next(newest) else {
                break;
            };
            let Some(slot) = self.take_slot(now, &[], q.waiters[i].hint, true) else {
                break;
            };
            let q = &mut self.queues[class];
            // Counted where it overtook someone.
            self.newest_first_grants += u64::from(newest && i > 0);
            let Some(w) = q.remove(i) else {
                // Cannot happen (`next` found it); the slot goes back.
                self.release(slot.replica);
                break;
            };
            q.served = Some(w.client);
            out.push((w.waiter, slot));
        }
        out
    }

    /// A request to `replica` failed at the transport level: after
    /// `eject_after` consecutive failures it gets no traffic for
    /// `eject_for`. Returns the replica's endpoint when this ejected it.
    pub fn record_failure(
        &mut self,
        replica: ReplicaId,
        now: Instant,
        eject_after: u32,
        eject_for: Duration,
    ) -> Option<&Endpoint> {
        let r = self.replicas.iter_mut().find(|r| r.id == replica)?;
        r.failures += 1;
        if eject_after > 0 && r.failures >= eject_after {
            r.failures = 0;
            r.ejected_until = Some(now + eject_for);
            return Some(&r.endpoint);
        }
        None
    }

    /// A request to `replica` got a response: its failure count restarts
    /// (the permit notes when, in [`Replica::answered`]).
    pub fn record_success(&mut self, replica: ReplicaId) {
        if let Some(r) = self.replicas.iter_mut().find(|r| r.id == replica) {
            r.failures = 0;
        }
    }

    /// A request sent to `replica` at `sent` had no response head within
    /// the request timeout. That is a failure only if the replica
    /// answered nothing since: one that answered other requests meanwhile
    /// is alive, and the request was long (a client's own long generation
    /// must not eject the replica every other client shares). Returns the
    /// endpoint when this ejected it.
    pub fn record_timeout(
        &mut self,
        replica: ReplicaId,
        sent: Instant,
        now: Instant,
        eject_after: u32,
        eject_for: Duration,
    ) -> Option<&Endpoint> {
        let alive = self
            .replicas
            .iter()
            .find(|r| r.id == replica)
            .is_some_and(|r| r.answered.after(sent));
        if alive {
            return None;
        }
        self.record_failure(replica, now, eject_after, eject_for)
    }

    /// Replicas ejected at `now`.
    pub fn ejected(&self, now: Instant) -> usize {
        self.replicas
            .iter()
            .filter(|r| r.ejected_until.is_some_and(|t| t > now))
            .count()
    }

    /// Sets what a replica's own metrics say: requests waiting inside it,
    /// its KV-cache utilisation (when reported) and the adapters they show
    /// (each counted as loaded until `seen_until`).
    pub fn set_server_state(
        &mut self,
        endpoint: &Endpoint,
        waiting: u32,
        kv: Option<f64>,
        adapters: &[u16],
        seen_until: Instant,
    ) {
        if let Some(r) = self.replicas.iter_mut().find(|r| &r.endpoint == endpoint) {
            r.server_waiting = waiting;
            if let Some(kv) = kv {
                r.kv = kv.clamp(0.0, 1.0);
            }
            for &a in adapters {
                match r.adapters.iter_mut().find(|(x, _)| *x == a) {
                    Some((_, None)) => {}
                    Some((_, until)) => *until = Some(seen_until),
                    None => r.adapters.push((a, Some(seen_until))),
                }
            }
        }
    }

    /// Records a replica's prefill seconds (a counter from its metrics)
    /// read at `at`: the change over the last [`PREFILL_WINDOW`] of
    /// readings, over the time between them, is its prefill utilisation
    /// (a rate over 10 s, as the gateway's arrival rate: one scrape
    /// interval of a few requests is mostly noise). A counter that went
    /// back (the server restarted) starts the measure again.
    pub fn set_prefill_seconds(&mut self, endpoint: &Endpoint, sum: f64, at: Instant) {
        if let Some(r) = self.replicas.iter_mut().find(|r| &r.endpoint == endpoint) {
            if r.prefill_marks
                .back()
                .is_some_and(|&(before, _)| sum < before)
            {
                r.prefill_marks.clear();
                r.prefill_busy = None;
            }
            r.prefill_marks.push_back((sum, at));
            // Keep the newest reading at least a window old, and those
            // after it.
            while r.prefill_marks.len() > 2 && r.prefill_marks[1].1 + PREFILL_WINDOW <= at {
                r.prefill_marks.pop_front();
            }
            if let (Some(&(s0, t0)), Some(&(s1, t1))) =
                (r.prefill_marks.front(), r.prefill_marks.back())
            {
                let dt = t1.saturating_duration_since(t0).as_secs_f64();
                if dt > 0.0 {
                    r.prefill_busy = Some((s1 - s0) / dt);
                }
            }
        }
    }

    /// Mean prefill utilisation of the replicas taking requests that
    /// report one; `None` when none does.
    pub fn prefill_busy(&self, now: Instant) -> Option<f64> {
        let seen: Vec<f64> = self
            .replicas
            .iter()
            .filter(|r| !r.draining && r.ejected_until.is_none_or(|t| t <= now))
            .filter_map(|r| r.prefill_busy)
            .collect();
        (!seen.is_empty()).then(|| seen.iter().sum::<f64>() / seen.len() as f64)
    }

    /// Sets the adapters a replica has for sure (configured, or given when
    /// it registered); those seen only in its metrics stay.
    pub fn set_adapters(&mut self, endpoint: &Endpoint, adapters: &[u16]) {
        if let Some(r) = self.replicas.iter_mut().find(|r| &r.endpoint == endpoint) {
            r.adapters.retain(|(_, until)| until.is_some());
            for &a in adapters {
                r.adapters.retain(|(x, _)| *x != a);
                r.adapters.push((a, None));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(port: u16) -> Endpoint {
        Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap()
    }

    #[test]
    fn least_outstanding_replica_with_room_gets_the_request() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(10, 2);
        let a = p.add_replica(ep(1), None);
        let b = p.add_replica(ep(2), None);
        let first = p.acquire(now, Hint::default()).unwrap().replica;
        let second = p.acquire(now, Hint::default()).unwrap().replica;
        assert_ne!(first, second, "the idle replica goes second");
        let third = p.acquire(now, Hint::default()).unwrap().replica;
        let fourth = p.acquire(now, Hint::default()).unwrap().replica;
        assert_ne!(third, fourth);
        assert_eq!(
            p.acquire(now, Hint::default()),
            None,
            "both at their limit of 2"
        );
        assert_eq!(p.in_flight(), 4);
        p.release(a);
        assert_eq!(p.acquire(now, Hint::default()).unwrap().replica, a);
        let _ = b;
    }

    #[test]
    fn waiters_are_served_by_class_then_arrival() {
        let now = Instant::now();
        let mut p: Pool<&str> = Pool::new(10, 1);
        let a = p.add_replica(ep(1), None);
        p.acquire(now, Hint::default()).unwrap();
        assert_eq!(
            p.enqueue(1, Priority::Sheddable, Hint::default(), "s1", now),
            Enqueued::Waiting
        );
        assert_eq!(
            p.enqueue(2, Priority::Standard, Hint::default(), "n1", now),
            Enqueued::Waiting
        );
        assert_eq!(
            p.enqueue(3, Priority::Critical, Hint::default(), "c1", now),
            Enqueued::Waiting
        );
        assert_eq!(
            p.enqueue(4, Priority::Standard, Hint::default(), "n2", now),
            Enqueued::Waiting
        );
        assert_eq!(p.acquire(now, Hint::default()), None, "waiters go first");
        let mut order = Vec::new();
        for _ in 0..4 {
            p.release(a);
            let granted = p.dispatch(now);
            assert_eq!(granted.len(), 1);
            order.push(granted[0].0);
        }
        assert_eq!(order, ["c1", "n1", "n2", "s1"]);
    }

    #[test]
    fn a_timeout_counts_as_a_failure_only_where_the_replica_answered_nothing_since() {
        let t0 = Instant::now();
        let mut p: Pool<u32> = Pool::new(4, 1);
        let a = p.add_replica(ep(1), Some(4));
        let eject = Duration::from_secs(5);
        // An answer after the request was sent: alive, nothing counted.
        p.replicas[0].answered.note(t0 + Duration::from_secs(1));
        for _ in 0..3 {
            assert!(
                p.record_timeout(a, t0, t0 + Duration::from_secs(2), 2, eject)
                    .is_none()
            );
        }
        assert_eq!(p.ejected(t0 + Duration::from_secs(2)), 0);
        // Requests sent after its last answer, none answered: two in a row
        // eject it.
        let sent = t0 + Duration::from_secs(3);
        let now = t0 + Duration::from_secs(4);
        assert!(p.record_timeout(a, sent, now, 2, eject).is_none());
        assert!(p.record_timeout(a, sent, now, 2, eject).is_some());
        assert_eq!(p.ejected(now), 1);
    }

    #[test]
    fn a_full_queue_rejects_or_displaces_a_lower_class() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(2, 1);
        assert_eq!(
            p.enqueue(1, Priority::Sheddable, Hint::default(), 1, now),
            Enqueued::Waiting
        );
        assert_eq!(
            p.enqueue(2, Priority::Standard, Hint::default(), 2, now),
            Enqueued::Waiting
        );
        assert_eq!(
            p.enqueue(3, Priority::Standard, Hint::default(), 3, now),
            Enqueued::Displaced(1),
            "the sheddable one makes room"
        );
        assert_eq!(
            p.enqueue(4, Priority::Standard, Hint::default(), 4, now),
            Enqueued::Rejected(4)
        );
        assert_eq!(
            p.enqueue(5, Priority::Sheddable, Hint::default(), 5, now),
            Enqueued::Rejected(5)
        );
        assert_eq!(p.waiting(), 2);
        assert_eq!(p.remove_waiter(2), Some(2));
        assert_eq!(p.remove_waiter(2), None);
        assert_eq!(p.waiting(), 1);
    }

    #[test]
    fn failures_eject_for_a_while() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(10, 4);
        let a = p.add_replica(ep(1), None);
        let b = p.add_replica(ep(2), None);
        assert!(
            p.record_failure(a, now, 2, Duration::from_secs(5))
                .is_none()
        );
        assert!(
            p.record_failure(a, now, 2, Duration::from_secs(5))
                .is_some()
        );
        assert_eq!(p.ejected(now), 1);
        for _ in 0..4 {
            assert_eq!(p.acquire(now, Hint::default()).unwrap().replica, b);
        }
        assert_eq!(
            p.acquire(now, Hint::default()),
            None,
            "a is ejected, b is full"
        );
        let later = now + Duration::from_secs(6);
        assert_eq!(
            p.acquire(later, Hint::default()).unwrap().replica,
            a,
            "back after the cool-off"
        );
    }

    #[test]
    fn a_removed_replica_drains_then_leaves() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(10, 4);
        let a = p.add_replica(ep(1), None);
        p.acquire(now, Hint::default()).unwrap();
        assert!(p.remove_replica(&ep(1)));
        assert_eq!(p.ready_replicas(), 0);
        assert_eq!(p.replicas().len(), 1, "draining");
        assert_eq!(
            p.acquire(now, Hint::default()),
            None,
            "no new requests to a draining replica"
        );
        p.release(a);
        assert!(p.replicas().is_empty());
    }

    #[test]
    fn a_backed_up_class_is_served_newest_first_until_its_oldest_waiter_is_young_again() {
        // Adaptive LIFO (Maurer, "Fail at Scale", 2015): oldest first
        // while the queue keeps up, newest first once the oldest waiter
        // has waited past the budget (here 500 ms).
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut p: Pool<&str> = Pool::new(10, 1);
        p.set_newest_first_after(Some(Duration::from_millis(500)));
        let a = p.add_replica(ep(1), None);
        p.acquire(t0, Hint::default()).unwrap();
        for (id, at, w) in [(1, 0, "n1"), (2, 100, "n2"), (3, 200, "n3"), (4, 700, "n4")] {
            assert_eq!(
                p.enqueue(id, Priority::Standard, Hint::default(), w, ms(at)),
                Enqueued::Waiting
            );
        }
        assert!(!p.newest_first(ms(499)), "n1 has waited 499 ms");
        assert!(p.newest_first(ms(500)));
        let mut next = |at: u64| {
            p.release(a);
            let granted = p.dispatch(ms(at));
            assert_eq!(granted.len(), 1);
            granted[0].0
        };
        // n1 has waited 800 ms: the newest (n4) goes first, then n3.
        assert_eq!(next(800), "n4");
        assert_eq!(next(850), "n3");
        // Still backed up (n1 at 900 ms): n2 is now the newest.
        assert_eq!(next(900), "n2");
        assert_eq!(next(950), "n1", "the last one left");
        assert_eq!(
            p.newest_first_grants(),
            3,
            "n1 went last, overtaking nobody"
        );

        // Young again: arrival order.
        let mut p: Pool<&str> = Pool::new(10, 1);
        p.set_newest_first_after(Some(Duration::from_millis(500)));
        let a = p.add_replica(ep(1), None);
        p.acquire(t0, Hint::default()).unwrap();
        for (id, at, w) in [(1, 0, "n1"), (2, 100, "n2"), (3, 600, "n3")] {
            p.enqueue(id, Priority::Standard, Hint::default(), w, ms(at));
        }
        p.release(a);
        assert_eq!(p.dispatch(ms(400)).remove(0).0, "n1", "n1 waited 400 ms");
        p.release(a);
        // n2 has waited 500 ms at 600: backed up, so n3 goes first.
        assert_eq!(p.dispatch(ms(600)).remove(0).0, "n3");
        assert_eq!(p.newest_first_grants(), 1);
    }

    #[test]
    fn newest_first_keeps_the_classes_in_order_and_is_off_without_a_budget() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        for (budget, want) in [
            (Some(Duration::from_secs(1)), ["c2", "c1", "n2", "n1"]),
            (None, ["c1", "c2", "n1", "n2"]),
        ] {
            let mut p: Pool<&str> = Pool::new(10, 1);
            p.set_newest_first_after(budget);
            let a = p.add_replica(ep(1), None);
            p.acquire(t0, Hint::default()).unwrap();
            for (id, prio, at, w) in [
                (1, Priority::Standard, 0, "n1"),
                (2, Priority::Critical, 1, "c1"),
                (3, Priority::Standard, 2, "n2"),
                (4, Priority::Critical, 3, "c2"),
            ] {
                p.enqueue(id, prio, Hint::default(), w, s(at));
            }
            let mut order = Vec::new();
            for _ in 0..4 {
                p.release(a);
                order.push(p.dispatch(s(60)).remove(0).0);
            }
            assert_eq!(order, want, "{budget:?}");
            assert!(!p.newest_first(s(60)), "nobody waits");
        }
    }

    #[test]
    fn a_new_replica_takes_the_waiters() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(10, 2);
        for i in 0..3 {
            assert_eq!(
                p.enqueue(i, Priority::Standard, Hint::default(), i as u32, now),
                Enqueued::Waiting
            );
        }
        assert!(p.dispatch(now).is_empty(), "no replica yet");
        p.add_replica(ep(1), None);
        let granted: Vec<u32> = p.dispatch(now).into_iter().map(|g| g.0).collect();
        assert_eq!(granted, [0, 1], "two slots, first two waiters");
        assert_eq!(p.waiting(), 1);
    }

    #[test]
    fn prefill_utilisation_is_the_counter_rate_over_ten_seconds() {
        let t0 = Instant::now();
        let s = |x: f64| t0 + Duration::from_secs_f64(x);
        let mut p: Pool<u32> = Pool::new(10, 8);
        p.add_replica(ep(1), None);
        p.add_replica(ep(2), None);
        p.add_replica(ep(3), None);
        // One reading is no rate yet.
        p.set_prefill_seconds(&ep(1), 100.0, s(0.0));
        assert_eq!(p.prefill_busy(s(0.0)), None);
        // 0.9 s of prefill in 1 s, and 0.3 s in 1 s: mean 0.6.
        p.set_prefill_seconds(&ep(1), 100.9, s(1.0));
        p.set_prefill_seconds(&ep(2), 5.0, s(0.0));
        p.set_prefill_seconds(&ep(2), 5.3, s(1.0));
        let busy = p.prefill_busy(s(1.0)).unwrap();
        assert!((busy - 0.6).abs() < 1e-9, "{busy}");
        // Replica 1, a second a second from 1 s to 20 s: the rate is over
        // the last 10 s or so, so 1.0 once the first second falls out.
        for k in 2..=20 {
            p.set_prefill_seconds(&ep(1), 100.9 + f64::from(k - 1), s(f64::from(k)));
        }
        let one = p.replicas()[0].prefill_busy.unwrap();
        assert!((one - 1.0).abs() < 1e-9, "{one}");
        assert!(p.replicas()[0].prefill_marks.len() <= 12);
        // A server that restarted (its counter went back) has no rate
        // until the next reading.
        p.set_prefill_seconds(&ep(2), 0.1, s(2.0));
        assert_eq!(p.replicas()[1].prefill_busy, None);
        p.set_prefill_seconds(&ep(2), 0.6, s(3.0));
        let busy = p.prefill_busy(s(3.0)).unwrap();
        assert!((busy - 0.75).abs() < 1e-9, "{busy}");
        // A replica removed no longer counts.
        p.remove_replica(&ep(1));
        let busy = p.prefill_busy(s(3.0)).unwrap();
        assert!((busy - 0.5).abs() < 1e-9, "{busy}");
    }

    #[test]
    fn a_prefix_counts_as_shared_once_a_request_with_it_was_routed_not_before() {
        let now = Instant::now();
        let mut p: Pool<&str> = Pool::new(10, 1);
        let a = p.add_replica(ep(1), None);
        let fresh = Hint {
            key: Some(777),
            shared: false,
            adapter: None,
        };
        // The only replica busy: the keyed request finds no slot, queues,
        // and is tried again while the replica is still busy.
        p.acquire(now, Hint::default()).unwrap();
        assert_eq!(p.acquire(now, fresh), None);
        assert!(matches!(
            p.enqueue(1, Priority::Standard, fresh, "keyed", now),
            Enqueued::Waiting
        ));
        assert!(p.dispatch(now).is_empty());
        p.release(a);
        let granted = p.dispatch(now);
        assert_eq!(granted.len(), 1);
        assert!(
            !granted[0].1.shared,
            "its own attempts without a slot do not make its prefix shared"
        );
        // A second request with the key: its prefix was routed before.
        p.release(a);
        assert!(p.acquire(now, fresh).unwrap().shared);
        // A retry elsewhere is routed as its hint says and records nothing.
        p.release(a);
        let other = Hint {
            key: Some(888),
            ..fresh
        };
        assert!(!p.acquire_other(now, &[], other).unwrap().shared);
        p.release(a);
        assert!(
            !p.acquire(now, other).unwrap().shared,
            "the retry recorded nothing"
        );
    }

    #[test]
    fn adapters_seen_in_metrics_count_until_they_expire() {
        let now = Instant::now();
        let mut p: Pool<u32> = Pool::new(10, 8);
        let a = p.add_replica(ep(1), None);
        let b = p.add_replica(ep(2), None);
        let hint = Hint {
            key: None,
            shared: false,
            adapter: Some(3),
        };
        p.set_server_state(&ep(2), 0, Some(0.2), &[3], now + Duration::from_secs(60));
        for _ in 0..3 {
            let s = p.acquire(now, hint).unwrap();
            assert_eq!((s.replica, s.reason), (b, Reason::Adapter));
        }
        // Past its memory, the adapter no longer counts: least loaded.
        let later = now + Duration::from_secs(61);
        let s = p.acquire(later, hint).unwrap();
        assert_eq!((s.replica, s.reason), (a, Reason::LeastLoaded));
        // A registered adapter does not expire.
        p.set_adapters(&ep(1), &[3]);
        let s = p.acquire(later + Duration::from_secs(3600), hint).unwrap();
        assert_eq!((s.replica, s.reason), (a, Reason::Adapter));
    }

    /// Four replicas of one slot each, all busy at `now`, the first taken
    /// by a keyed request: the pool, the key's hint and a replica other
    /// than the key's owner.
    fn busy_with_a_prefix_owner(
        now: Instant,
        budget: Option<Duration>,
    ) -> (Pool<&'static str>, Hint, ReplicaId) {
        let mut p: Pool<&str> = Pool::new(10, 1);
        p.set_newest_first_after(budget);
        p.set_balance(Balance {
            spill_floor: 1.0,
            ..Balance::default()
        });
        let ids: Vec<ReplicaId> = (1..=4).map(|i| p.add_replica(ep(i), None)).collect();
        let hint = Hint {
            key: Some(12345),
            shared: true,
            adapter: None,
        };
        let owner = p.acquire(now, hint).unwrap().replica;
        for _ in 0..3 {
            p.acquire(now, Hint::default()).unwrap();
        }
        let other = *ids.iter().find(|&&r| r != owner).unwrap();
        (p, hint, other)
    }

    #[test]
    fn a_waiter_keeps_its_prefix_for_the_slot_it_gets() {
        let now = Instant::now();
        // Every replica busy; the keyed waiter queues.
        let (mut p, hint, other) = busy_with_a_prefix_owner(now, None);
        assert_eq!(
            p.enqueue(1, Priority::Standard, hint, "keyed", now),
            Enqueued::Waiting
        );
        // Another replica frees first: the waiter takes it (a spill)
        // rather than wait for its owner.
        p.release(other);
        let granted = p.dispatch(now);
        assert_eq!(granted.len(), 1);
        assert_eq!(granted[0].1.replica, other);
        assert_eq!(granted[0].1.reason, Reason::Spill);
    }

    #[test]
    fn the_newest_waiter_of_a_backed_up_class_is_routed_by_its_own_prefix() {
        let t0 = Instant::now();
        let (mut p, hint, other) = busy_with_a_prefix_owner(t0, Some(Duration::from_secs(1)));
        p.enqueue(1, Priority::Standard, Hint::default(), "plain", t0);
        let later = t0 + Duration::from_secs(2);
        p.enqueue(2, Priority::Standard, hint, "keyed", later);
        p.release(other);
        let granted = p.dispatch(later);
        assert_eq!(granted.len(), 1);
        assert_eq!(granted[0].0, "keyed", "backed up: the newest first");
        // Chosen by its own key: its owner is busy, so a spill (the plain
        // waiter's hint would have made it least-loaded).
        assert_eq!(granted[0].1.reason, Reason::Spill);
    }

    #[test]
    fn a_full_backed_up_queue_gives_up_its_oldest_waiter_not_the_newest() {
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        // A lower class backed up gives up its oldest (it has missed its
        // budget; its newest is the next it serves), not backed up its
        // newest.
        for (at, want) in [(5, Enqueued::Displaced(1)), (0, Enqueued::Displaced(2))] {
            let mut p: Pool<u32> = Pool::new(2, 1);
            p.set_newest_first_after(Some(Duration::from_secs(1)));
            p.enqueue(1, Priority::Sheddable, Hint::default(), 1, s(0));
            p.enqueue(2, Priority::Sheddable, Hint::default(), 2, s(0));
            assert_eq!(
                p.enqueue(3, Priority::Standard, Hint::default(), 3, s(at)),
                want,
                "at {at} s"
            );
        }
        // Its own class: backed up, its oldest waiter makes room for the
        // newcomer (503: overdue); not backed up, the newcomer is refused.
        for (at, want) in [(5, Enqueued::Overdue(1)), (0, Enqueued::Rejected(3))] {
            let mut p: Pool<u32> = Pool::new(2, 1);
            p.set_newest_first_after(Some(Duration::from_secs(1)));
            p.enqueue(1, Priority::Standard, Hint::default(), 1, s(0));
            p.enqueue(2, Priority::Standard, Hint::default(), 2, s(0));
            assert_eq!(
                p.enqueue(3, Priority::Standard, Hint::default(), 3, s(at)),
                want,
                "at {at} s"
            );
            assert_eq!(p.waiting(), 2);
        }
        // Oldest first always: the newcomer is refused however long the
        // others waited, and a lower class gives up its newest.
        let mut p: Pool<u32> = Pool::new(2, 1);
        p.enqueue(1, Priority::Standard, Hint::default(), 1, s(0));
        p.enqueue(2, Priority::Sheddable, Hint::default(), 2, s(0));
        assert_eq!(
            p.enqueue(3, Priority::Standard, Hint::default(), 3, s(60)),
            Enqueued::Displaced(2)
        );
        assert_eq!(
            p.enqueue(4, Priority::Standard, Hint::default(), 4, s(60)),
            Enqueued::Rejected(4)
        );
    }

    #[test]
    fn the_census_keeps_ejected_and_draining_replicas_apart() {
        let now = Instant::now();
        let mut p: Pool<()> = Pool::new(4, 8);
        let a = p.add_replica(ep(1), Some(8));
        let b = p.add_replica(ep(2), Some(8));
        p.add_replica(ep(3), Some(4));
        p.acquire(now, Hint::default()).unwrap();
        p.acquire(now, Hint::default()).unwrap();
        p.acquire(now, Hint::default()).unwrap();
        assert!(
            p.record_failure(b, now, 1, Duration::from_secs(10))
                .is_some()
        );
        p.remove_replica(&ep(1));
        let c = p.census(now);
        assert_eq!(
            c.ready,
            Group {
                replicas: 1,
                in_flight: 1,
                capacity: 4
            }
        );
        assert_eq!(c.ejected.replicas, 1);
        assert_eq!(c.ejected.capacity, 8);
        assert_eq!(c.draining.replicas, 1);
        assert_eq!(c.draining.in_flight, 1);
        // The ejection ends: the replica counts again.
        let later = now + Duration::from_secs(11);
        assert_eq!(p.census(later).ready.replicas, 2);
        assert_eq!(p.census(later).ready.capacity, 12);
        let _ = a;
    }

    fn client(n: u8) -> Client {
        Client::of(std::net::IpAddr::from([10, 0, 0, n]), None)
    }

    #[test]
    fn a_full_queue_takes_a_place_from_the_client_holding_the_most() {
        let now = Instant::now();
        let mut p: Pool<&str> = Pool::new(4, 1);
        let (a, b) = (client(1), client(2));
        let std = Priority::Standard;
        for (i, w) in ["a1", "a2", "a3", "a4"].into_iter().enumerate() {
            assert_eq!(
                p.enqueue_from(a, i as u64, std, Hint::default(), w, now),
                Enqueued::Waiting
            );
        }
        // Alone, a client has the whole queue; its next is refused.
        assert_eq!(
            p.enqueue_from(a, 9, std, Hint::default(), "a5", now),
            Enqueued::Rejected("a5")
        );
        // Another client takes a's newest places while a holds more than
        // it would.
        assert_eq!(
            p.enqueue_from(b, 10, std, Hint::default(), "b1", now),
            Enqueued::Crowded("a4")
        );
        assert_eq!(
            p.enqueue_from(b, 11, std, Hint::default(), "b2", now),
            Enqueued::Crowded("a3")
        );
        // Two each: neither takes the other's.
        assert_eq!(
            p.enqueue_from(b, 12, std, Hint::default(), "b3", now),
            Enqueued::Rejected("b3")
        );
        assert_eq!(
            p.enqueue_from(a, 13, std, Hint::default(), "a6", now),
            Enqueued::Rejected("a6")
        );
        // A more important request still outranks every client's, even
        // from a client holding as many: the lower class gives up the
        // newest waiter of the clients holding the most.
        assert_eq!(
            p.enqueue_from(a, 14, Priority::Critical, Hint::default(), "c", now),
            Enqueued::Displaced("b2")
        );
        assert_eq!(p.waiting_by_class(), [1, 3, 0]);
    }

    #[test]
    fn a_waiter_that_leaves_counts_no_more_for_its_client() {
        let now = Instant::now();
        let mut p: Pool<&str> = Pool::new(3, 1);
        let std = Priority::Standard;
        p.enqueue_from(client(1), 1, std, Hint::default(), "a1", now);
        p.enqueue_from(client(1), 2, std, Hint::default(), "a2", now);
        p.enqueue_from(client(1), 3, std, Hint::default(), "a3", now);
        // a's waiters time out one by one; b fills their places.
        assert_eq!(p.remove_waiter(1), Some("a1"));
        p.enqueue_from(client(2), 4, std, Hint::default(), "b1", now);
        assert_eq!(p.remove_waiter(2), Some("a2"));
        p.enqueue_from(client(2), 5, std, Hint::default(), "b2", now);
        // b holds two, a one: a's next takes b's newest; b's is refused.
        assert_eq!(
            p.enqueue_from(client(2), 6, std, Hint::default(), "b3", now),
            Enqueued::Rejected("b3")
        );
        assert_eq!(
            p.enqueue_from(client(3), 7, std, Hint::default(), "c1", now),
            Enqueued::Crowded("b2")
        );
        assert_eq!(p.waiting(), 3);
    }

    #[test]
    fn a_lower_class_gives_up_a_waiter_of_its_client_holding_the_most() {
        let now = Instant::now();
        let mut p: Pool<&str> = Pool::new(3, 1);
        let shed = Priority::Sheddable;
        p.enqueue_from(client(1), 1, shed, Hint::default(), "a1", now);
        p.enqueue_from(client(1), 2, shed, Hint::default(), "a2", now);
        p.enqueue_from(client(2), 3, shed, Hint::default(), "b1", now);
        // The class's newest is b1, but a holds more.
        assert_eq!(
            p.enqueue_from(client(3), 4, Priority::Standard, Hint::default(), "c1", now),
            Enqueued::Displaced("a2")
        );
    }

    #[test]
    fn freed_slots_go_round_robin_among_the_clients_waiting() {
        let now = Instant::now();
        let mut p: Pool<&str> = Pool::new(10, 1);
        let r = p.add_replica(ep(1), None);
        p.acquire(now, Hint::default()).unwrap();
        let std = Priority::Standard;
        for (i, w) in ["a1", "a2", "a3"].into_iter().enumerate() {
            p.enqueue_from(client(1), i as u64, std, Hint::default(), w, now);
        }
        p.enqueue_from(client(2), 3, std, Hint::default(), "b1", now);
        p.enqueue_from(client(3), 4, std, Hint::default(), "c1", now);
        p.enqueue_from(client(2), 5, std, Hint::default(), "b2", now);
        let mut order = Vec::new();
        for _ in 0..6 {
            p.release(r);
            let granted = p.dispatch(now);
            assert_eq!(granted.len(), 1);
            order.push(granted[0].0);
        }
        // Each client's oldest in turn, not the order of arrival.
        assert_eq!(order, ["a1", "b1", "c1", "a2", "b2", "a3"]);
    }

    #[test]
    fn a_backed_up_class_gives_up_the_overdue_waiter_of_a_client_holding_as_many() {
        let t0 = Instant::now();
        let mut p: Pool<&str> = Pool::new(4, 1);
        p.set_newest_first_after(Some(Duration::from_secs(1)));
        let std = Priority::Standard;
        let half = t0 + Duration::from_millis(500);
        p.enqueue_from(client(2), 1, std, Hint::default(), "b1", t0);
        for (i, w) in ["a1", "a2", "a3"].into_iter().enumerate() {
            p.enqueue_from(client(1), 2 + i as u64, std, Hint::default(), w, half);
        }
        let later = t0 + Duration::from_secs(2);
        assert!(p.newest_first(later), "b1 has waited past the budget");
        // a holds the most: its own oldest gives up its place, not b's
        // only request, which is the class's oldest.
        assert_eq!(
            p.enqueue_from(client(1), 9, std, Hint::default(), "a4", later),
            Enqueued::Overdue("a1")
        );
        // A client holding none takes a's (a holds more than it would), and
        // among clients holding one each the class's oldest overdue waiter
        // gives up its place.
        let mut q: Pool<&str> = Pool::new(2, 1);
        q.set_newest_first_after(Some(Duration::from_secs(1)));
        q.enqueue_from(client(1), 1, std, Hint::default(), "a1", t0);
        q.enqueue_from(client(2), 2, std, Hint::default(), "b1", half);
        assert_eq!(
            q.enqueue_from(client(3), 3, std, Hint::default(), "c1", later),
            Enqueued::Overdue("a1")
        );
        // b1 is overdue too, but c now holds one, as b does: b's turn in
        // the round robin comes, and c's own oldest is not overdue.
        assert_eq!(
            q.enqueue_from(client(3), 4, std, Hint::default(), "c2", later),
            Enqueued::Rejected("c2")
        );
        // A client holding none takes b's (b holds more than it does).
        assert_eq!(
            q.enqueue_from(client(4), 5, std, Hint::default(), "d1", later),
            Enqueued::Overdue("b1")
        );
    }
}
