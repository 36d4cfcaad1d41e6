//! Requests per minute per client, as token buckets, pure: callers pass
//! `now`, nothing here reads a clock or does I/O.
//!
//! A client ([`crate::fairness::Client`]: its configured API key, else its
//! address) may send `requestsPerMinute` requests a minute, in bursts of
//! up to `burst` (a bucket of `burst` tokens refilled at the rate, one
//! token a request). Past it a request gets 429 with the seconds until a
//! token is back, before it is queued or forwarded, so a client cannot
//! buy capacity (and the autoscaler's replicas) with volume beyond its
//! quota; fairness in the queue ([`crate::admission`]) then shares what is
//! left. A key's own rate (`priorities.apiKeys[].rate`) overrides the
//! default (`limits.clientRate`); `requestsPerMinute: 0` is no limit.
//!
//! Every request routed to a model counts, whatever its answer afterwards
//! (one refused by a full queue too), and the check comes once the request
//! is read and routed: what a client over its rate costs is its upload
//! and its parse. One refused before (400, 404) neither counts nor is
//! limited.
//!
//! The table of buckets is bounded: when a new client finds it full, the
//! buckets refilled to full (the same as none) are dropped, and if that
//! leaves less than an eighth free, those used longest ago go until an
//! eighth is (their clients start again with a full bucket: someone with
//! that many addresses gains no more than their addresses give them). So
//! the pass over the table that costs comes at most once per eighth of it
//! of new clients, not with each: a flood from ever new addresses costs a
//! few steps per request under the lock, amortised.
//!
//! Rates are per gateway process: behind N gateways a client may send N
//! times its rate.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::fairness::Client;

/// A rate: requests per minute, in bursts of up to `burst`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Requests per minute (greater than 0).
    pub per_minute: f64,
    /// Most requests at once after a quiet spell (at least 1).
    pub burst: f64,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
    rate: Rate,
}

impl Bucket {
    fn refilled(&self, now: Instant) -> f64 {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        (self.tokens + dt * self.rate.per_minute / 60.0).min(self.rate.burst)
    }
}

/// The configured rates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    /// Every client's without a rate of its own (`limits.clientRate`).
    pub default: Option<Rate>,
    /// Per configured key (by index): `None` the default, `Some(None)` no
    /// limit, `Some(Some(rate))` its own (`priorities.apiKeys[].rate`).
    pub keys: Vec<Option<Option<Rate>>>,
}

/// The buckets.
#[derive(Debug)]
pub struct Limiter {
    rates: Rates,
    buckets: HashMap<Client, Bucket>,
    max_clients: usize,
}

/// Buckets kept at most by default (about 8 MB).
pub const MAX_CLIENTS: usize = 65_536;

impl Limiter {
    /// A limiter for `rates`; `None` when no client has a limit.
    pub fn new(rates: Rates) -> Option<Limiter> {
        let any = rates.default.is_some() || rates.keys.iter().any(|k| matches!(k, Some(Some(_))));
        any.then(|| Limiter {
            rates,
            buckets: HashMap::new(),
            max_clients: MAX_CLIENTS,
        })
    }

    /// The same with at most `max_clients` buckets (tests).
    pub fn with_max_clients(mut self, max_clients: usize) -> Limiter {
        self.max_clients = max_clients.max(1);
        self
    }

    fn rate(&self, key: Option<usize>) -> Option<Rate> {
        match key.and_then(|k| self.rates.keys.get(k).copied().flatten()) {
            Some(own) => own,
            None => self.rates.default,
        }
    }

    /// Takes a token for a request of `client` (carrying the configured
    /// key `key`, if any) at `now`: `Err` with the time until one is back
    /// when none is left.
    pub fn take(
        &mut self,
        client: Client,
        key: Option<usize>,
        now: Instant,
    ) -> Result<(), Duration> {
        let Some(rate) = self.rate(key) else {
            return Ok(());
        };
        if !self.buckets.contains_key(&client) && self.buckets.len() >= self.max_clients {
            self.make_room(now);
        }
        let b = self.buckets.entry(client).or_insert(Bucket {
            tokens: rate.burst,
            at: now,
            rate,
        });
        let tokens = b.refilled(now);
        b.at = now.max(b.at);
        b.rate = rate;
        if tokens >= 1.0 {
            b.tokens = tokens - 1.0;
            Ok(())
        } else {
            b.tokens = tokens;
            let wait = (1.0 - tokens) * 60.0 / rate.per_minute;
            Err(Duration::try_from_secs_f64(wait).unwrap_or(Duration::MAX))
        }
    }

    /// Drops the full buckets, then, while less than an eighth of the
    /// table is free, those used longest ago until an eighth is.
    fn make_room(&mut self, now: Instant) {
        self.buckets.retain(|_, b| b.refilled(now) < b.rate.burst);
        let keep = self.max_clients - (self.max_clients / 8).max(1);
        if self.buckets.len() > keep {
            let mut used: Vec<Instant> = self.buckets.values().map(|b| b.at).collect();
            let drop = used.len() - keep;
            let (_, &mut cut, _) = used.select_nth_unstable(drop - 1);
            self.buckets.retain(|_, b| b.at > cut);
        }
    }

    /// Buckets held.
    pub fn clients(&self) -> usize {
        self.buckets.len()
    }

    /// Whether `client` has a bucket.
    pub fn holds(&self, client: Client) -> bool {
        self.buckets.contains_key(&client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(n: u8) -> Client {
        Client::of(std::net::IpAddr::from([10, 0, 0, n]), None)
    }

    fn limiter(default: Option<Rate>, keys: Vec<Option<Option<Rate>>>) -> Option<Limiter> {
        Limiter::new(Rates { default, keys })
    }

    fn rate(per_minute: f64, burst: f64) -> Rate {
        Rate { per_minute, burst }
    }

    #[test]
    fn a_client_gets_its_burst_then_the_rate_and_others_their_own() {
        let t0 = Instant::now();
        // 60 a minute (one a second), bursts of 3.
        let mut l = limiter(Some(rate(60.0, 3.0)), vec![]).unwrap();
        for _ in 0..3 {
            assert_eq!(l.take(client(1), None, t0), Ok(()));
        }
        let wait = l.take(client(1), None, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-9, "{wait:?}");
        // Another client is not touched by the first's use.
        assert_eq!(l.take(client(2), None, t0), Ok(()));
        // Half a second later: half a token, half a second to wait.
        let half = t0 + Duration::from_millis(500);
        let wait = l.take(client(1), None, half).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        // A second after that: one request, not two.
        let later = half + Duration::from_secs(1);
        assert_eq!(l.take(client(1), None, later), Ok(()));
        assert!(l.take(client(1), None, later).is_err());
        // A long quiet spell refills to the burst, no more.
        let quiet = later + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(l.take(client(1), None, quiet), Ok(()));
        }
        assert!(l.take(client(1), None, quiet).is_err());
    }

    #[test]
    fn a_keys_own_rate_or_none_overrides_the_default() {
        let t0 = Instant::now();
        let keyed = |k| Client::of(std::net::IpAddr::from([10, 0, 0, 1]), Some(k));
        // Key 0: the default; key 1: its own, 120 a minute in bursts of 5;
        // key 2: no limit.
        let mut l = limiter(
            Some(rate(60.0, 1.0)),
            vec![None, Some(Some(rate(120.0, 5.0))), Some(None)],
        )
        .unwrap();
        assert_eq!(l.take(keyed(0), Some(0), t0), Ok(()));
        assert!(l.take(keyed(0), Some(0), t0).is_err());
        for _ in 0..5 {
            assert_eq!(l.take(keyed(1), Some(1), t0), Ok(()));
        }
        let wait = l.take(keyed(1), Some(1), t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        for _ in 0..1000 {
            assert_eq!(l.take(keyed(2), Some(2), t0), Ok(()));
        }
        // Nothing configured anywhere: no limiter at all; a key's own
        // rate alone makes one that leaves everyone else unlimited.
        assert!(limiter(None, vec![None, Some(None)]).is_none());
        let mut l = limiter(None, vec![Some(Some(rate(60.0, 1.0)))]).unwrap();
        for _ in 0..100 {
            assert_eq!(l.take(client(9), None, t0), Ok(()));
        }
        assert_eq!(l.clients(), 0, "an unlimited client holds no bucket");
    }

    #[test]
    fn a_table_full_of_part_used_buckets_frees_an_eighth_at_once() {
        let t0 = Instant::now();
        let mut l = limiter(Some(rate(1.0, 2.0)), vec![])
            .unwrap()
            .with_max_clients(64);
        let v6 = |n: u16| {
            Client::of(
                std::net::IpAddr::from([0x2001, 0xdb8, n, 0, 0, 0, 0, 1]),
                None,
            )
        };
        for n in 0..64u16 {
            l.take(v6(n), None, t0 + Duration::from_millis(u64::from(n)))
                .unwrap();
        }
        assert_eq!(l.clients(), 64);
        // The 65th: the eight used longest ago go, and the next seven new
        // clients find room without a pass over the table.
        let t1 = t0 + Duration::from_secs(1);
        l.take(v6(64), None, t1).unwrap();
        assert_eq!(l.clients(), 57);
        assert!((0..8).all(|n| !l.holds(v6(n))) && (8..65).all(|n| l.holds(v6(n))));
        for n in 65..72 {
            l.take(v6(n), None, t1).unwrap();
        }
        assert_eq!(l.clients(), 64);
    }

    #[test]
    fn a_rate_too_small_to_wait_for_waits_the_longest_time_there_is() {
        let t0 = Instant::now();
        let mut l = limiter(Some(rate(1e-30, 1.0)), vec![]).unwrap();
        l.take(client(1), None, t0).unwrap();
        assert_eq!(l.take(client(1), None, t0), Err(Duration::MAX));
    }

    #[test]
    fn the_table_of_buckets_stays_bounded_and_keeps_the_part_used() {
        let t0 = Instant::now();
        let mut l = limiter(Some(rate(60.0, 2.0)), vec![])
            .unwrap()
            .with_max_clients(3);
        // Client 1 spends its burst; 2 and 3 one token each.
        l.take(client(1), None, t0).unwrap();
        l.take(client(1), None, t0).unwrap();
        let t1 = t0 + Duration::from_millis(100);
        l.take(client(2), None, t1).unwrap();
        l.take(client(3), None, t1).unwrap();
        // A fourth client: every bucket part-used, the one used longest
        // ago (client 1's) goes.
        let t2 = t0 + Duration::from_millis(200);
        l.take(client(4), None, t2).unwrap();
        assert_eq!(l.clients(), 3);
        assert!(!l.holds(client(1)) && l.holds(client(2)) && l.holds(client(3)));
        // After a second, 2's, 3's and 4's buckets are full again (one
        // token a second), the same as none: they go first.
        let t3 = t0 + Duration::from_secs(2);
        l.take(client(5), None, t3).unwrap();
        assert_eq!(l.clients(), 1);
        // The bound held while client 5 kept its own count.
        l.take(client(5), None, t3).unwrap();
        assert!(l.take(client(5), None, t3).is_err());
    }
}
