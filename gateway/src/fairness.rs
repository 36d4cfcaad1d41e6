//! Who a request counts as when clients share a model's queue, pure.
//!
//! A full queue is shared by *longest queue drop*: a client whose request
//! finds the queue full gets a place of the client holding the most of
//! the request's class, when that one holds more than the newcomer's
//! client would once queued; and slots that free are handed round robin
//! among the clients waiting ([`crate::admission::Pool::enqueue_from`]). So one client sending far more than its
//! share fills the queue only while nobody else waits, and the others'
//! requests neither bounce off a full queue nor wait behind its backlog.
//!
//! A client is the configured API key its request carries (`priorities.
//! apiKeys`, matched by digest), else the address it connects from, an
//! IPv6 peer by its /64 (the prefix of one host's interface, so it
//! cannot take a new address per request; a subscriber given a /56 or a
//! /48 can still count as many clients). Never anything a client can
//! mint: an unknown bearer token, a header or a source port counts as
//! its address, so sending a new token with every request gains no second
//! share. Clients behind one proxy or NAT share its address (give them
//! API keys to tell them apart).

use std::net::IpAddr;

/// A client, for fairness between clients. `Client::default()` is one
/// population of requests (the simulator's, and tests').
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Client(u128);

const KEY: u128 = 3 << 126;
const V4: u128 = 1 << 126;
const V6: u128 = 2 << 126;

impl Client {
    /// The client of a request from `peer` carrying the configured API key
    /// at index `key` (if any).
    pub fn of(peer: IpAddr, key: Option<usize>) -> Client {
        if let Some(k) = key {
            return Client(KEY | k as u128);
        }
        match peer.to_canonical() {
            IpAddr::V4(a) => Client(V4 | u128::from(u32::from(a))),
            IpAddr::V6(a) => Client(V6 | (u128::from(a) >> 64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_key_outranks_the_address_and_an_ipv6_host_is_its_64() {
        // Two addresses, two clients; the same key from both, one.
        assert_ne!(
            Client::of(ip("10.0.0.1"), None),
            Client::of(ip("10.0.0.2"), None)
        );
        assert_eq!(
            Client::of(ip("10.0.0.1"), Some(2)),
            Client::of(ip("10.0.0.2"), Some(2))
        );
        assert_ne!(
            Client::of(ip("10.0.0.1"), Some(2)),
            Client::of(ip("10.0.0.1"), Some(3))
        );
        // Every address of one /64 is one client; the next /64 another.
        assert_eq!(
            Client::of(ip("2001:db8:1:2::1"), None),
            Client::of(ip("2001:db8:1:2:ffff:1234:5678:9abc"), None)
        );
        assert_ne!(
            Client::of(ip("2001:db8:1:2::1"), None),
            Client::of(ip("2001:db8:1:3::1"), None)
        );
        // An IPv4 peer on a dual-stack listener is its IPv4 address, and
        // no address or key is mistaken for another kind.
        assert_eq!(
            Client::of(ip("::ffff:10.0.0.1"), None),
            Client::of(ip("10.0.0.1"), None)
        );
        assert_ne!(Client::of(ip("0.0.0.0"), None), Client::of(ip("::"), None));
        assert_ne!(
            Client::of(ip("0.0.0.0"), None),
            Client::of(ip("::"), Some(0))
        );
        assert_ne!(Client::of(ip("0.0.0.0"), None), Client::default());
    }
}
