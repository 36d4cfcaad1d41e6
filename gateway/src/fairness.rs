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
//! API keys to tell them apart), except behind a trusted proxy
//! (`priorities.trustedNetworks`) where `priorities.forwardedFor` is on:
//! its `X-Forwarded-For` names the address ([`source`]; `Forwarded`,
//! `X-Real-IP` and the PROXY protocol are not read).

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// Whether `addr` is in one of `nets`, an IPv4-mapped IPv6 address as
/// its IPv4 address (a dual-stack listener sees IPv4 peers so).
pub fn trusts(nets: &[IpNet], addr: &IpAddr) -> bool {
    let canonical = addr.to_canonical();
    nets.iter()
        .any(|n| n.contains(&canonical) || n.contains(addr))
}

/// The address a request counts as from: its peer's, or, where the peer
/// is one of `proxies` (`priorities.trustedNetworks` when
/// `priorities.forwardedFor` is on; empty otherwise), the address its
/// `X-Forwarded-For` names: walking the list from the right (each proxy
/// appends the address it received the request from; header lines in
/// the order received), the first entry not itself a proxy, or the
/// leftmost when all are, as nginx's `real_ip_recursive` reads it. Empty
/// entries are skipped; one that is not an address (`unknown`, garbage)
/// stops the walk at the hop before it: nothing left of it was written
/// by a proxy the gateway trusts. Only a proxy's header is read, so a
/// client connecting directly cannot choose its address; a proxy that
/// passes a client's header on without appending to it (or overwriting
/// it) must not be trusted so.
pub fn source<'a>(
    peer: IpAddr,
    forwarded: impl Iterator<Item = &'a [u8]>,
    proxies: &[IpNet],
) -> IpAddr {
    if proxies.is_empty() || !trusts(proxies, &peer) {
        return peer;
    }
    // Usually one line; no list of entries is built.
    let lines: Vec<&[u8]> = forwarded.collect();
    let mut hop = peer;
    for line in lines.iter().rev() {
        for entry in line.rsplit(|&b| b == b',') {
            let entry = entry.trim_ascii();
            if entry.is_empty() {
                continue;
            }
            let Some(addr) = parse_entry(entry) else {
                return hop;
            };
            if !trusts(proxies, &addr) {
                return addr;
            }
            hop = addr;
        }
    }
    hop
}

/// An `X-Forwarded-For` entry: an address, with a port or not, an IPv6
/// address in brackets or not (`[v6]:p`, `[v6]`).
fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?;
    let bare = text
        .strip_prefix('[')
        .and_then(|t| t.strip_suffix(']'))
        .unwrap_or(text);
    bare.parse::<IpAddr>()
        .ok()
        .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .map(|a| a.to_canonical())
}

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

    fn from(peer: &str, header: &[&str], trusted: &[&str]) -> IpAddr {
        let trusted: Vec<IpNet> = trusted.iter().map(|n| n.parse().unwrap()).collect();
        source(ip(peer), header.iter().map(|h| h.as_bytes()), &trusted)
    }

    #[test]
    fn only_a_trusted_proxys_forwarded_address_counts_read_from_the_right() {
        let proxies = ["10.0.0.0/8"];
        // No trusted network, or an untrusted peer: the header is the
        // client's own word, ignored.
        assert_eq!(
            from("203.0.113.9", &["198.51.100.1"], &[]),
            ip("203.0.113.9")
        );
        assert_eq!(
            from("203.0.113.9", &["198.51.100.1"], &proxies),
            ip("203.0.113.9")
        );
        // A trusted proxy: the address it appended.
        assert_eq!(
            from("10.0.0.5", &["198.51.100.1"], &proxies),
            ip("198.51.100.1")
        );
        // A client's own entries left of it are not believed: the
        // rightmost untrusted entry is the client.
        assert_eq!(
            from("10.0.0.5", &["1.2.3.4, 198.51.100.1"], &proxies),
            ip("198.51.100.1")
        );
        // Two trusted proxies in a row, on two header lines, with a port.
        assert_eq!(
            from(
                "10.0.0.5",
                &["1.2.3.4, 198.51.100.1:5000", "10.0.0.7"],
                &proxies
            ),
            ip("198.51.100.1")
        );
        assert_eq!(
            from("10.0.0.5", &["[2001:db8::1]:443"], &proxies),
            ip("2001:db8::1")
        );
        // All trusted: the leftmost; none: the proxy itself; garbage
        // stops the walk at the last hop a trusted proxy wrote.
        assert_eq!(
            from("10.0.0.5", &["10.1.1.1, 10.0.0.7"], &proxies),
            ip("10.1.1.1")
        );
        assert_eq!(from("10.0.0.5", &[], &proxies), ip("10.0.0.5"));
        assert_eq!(
            from("10.0.0.5", &["198.51.100.1, unknown, 10.0.0.7"], &proxies),
            ip("10.0.0.7")
        );
        // An IPv4-mapped peer or entry is its IPv4 address.
        assert_eq!(
            from("::ffff:10.0.0.5", &["::ffff:198.51.100.1"], &proxies),
            ip("198.51.100.1")
        );
        // Empty entries are skipped (as nginx does), a bare bracketed IPv6
        // address is an address, and a trusted client still reaches the
        // entry left of it.
        assert_eq!(
            from("10.0.0.5", &["198.51.100.1,, 10.0.0.7, "], &proxies),
            ip("198.51.100.1")
        );
        assert_eq!(
            from("10.0.0.5", &["[2001:db8::1]"], &proxies),
            ip("2001:db8::1")
        );
        // A network written in IPv6 form trusts the peer it names.
        assert_eq!(
            from(
                "::ffff:10.0.0.5",
                &["198.51.100.1"],
                &["::ffff:10.0.0.0/104"]
            ),
            ip("198.51.100.1")
        );
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
