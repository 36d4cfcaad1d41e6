//! What the discovery API (`POST /v1/replicas`) may register, pure: an
//! endpoint is `http://IP:PORT` with an IP literal inside the configured
//! networks (loopback by default; in Kubernetes, the pod network that
//! EndpointSlices list), never link-local (cloud metadata services live
//! at 169.254.169.254) or another known metadata address (Alibaba's
//! 100.100.100.200, AWS's `fd00:ec2::254`, …), nor any of these behind
//! NAT64, 6to4, Teredo or a deprecated IPv4-compatible address,
//! unspecified, multicast or broadcast, never with
//! user information, a path, a query or another scheme, never one of the
//! gateway's own listeners at its bound address, or on loopback or the
//! pod's IP (`POD_IP`) where it listens on every address (a request sent
//! to itself would wait out the queue timeout; a Service address in front
//! of it is not recognised); and a model holds at most `maxReplicasPerModel`
//! replicas. An IPv4-mapped IPv6 address is stored as its IPv4 address,
//! so that one server is one replica however it is spelt.
//!
//! Replicas written in the gateway's own file are the operator's word and
//! are not held to these rules (they may use host names).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::IpNet;

use crate::config::Endpoint;

/// Why an endpoint may not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// Not `http://IP:PORT`.
    #[error("{0}")]
    Malformed(String),
    /// An address no replica may have.
    #[error("{0} is a {1} address; replicas cannot be registered there")]
    Forbidden(IpAddr, &'static str),
    /// Outside `registration.allowedNetworks`.
    #[error("{0} is outside the gateway's registration.allowedNetworks")]
    OutsideNetworks(IpAddr),
    /// One of the gateway's own listeners.
    #[error("{0} is the gateway's own {1} listener")]
    Own(SocketAddr, &'static str),
}

/// The registration rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    /// Networks replicas may be in.
    pub allowed: Vec<IpNet>,
    /// Most replicas one model may have.
    pub max_replicas_per_model: usize,
    /// This host's own addresses besides loopback, where known (the pod's
    /// IP, from `POD_IP`): a listener on every address takes them too.
    pub local: Vec<IpAddr>,
}

/// Cloud metadata and platform services outside the link-local range:
/// Alibaba Cloud's metadata service, Oracle Cloud's classic one, Azure's
/// WireServer.
const METADATA_V4: [Ipv4Addr; 3] = [
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(192, 0, 0, 192),
    Ipv4Addr::new(168, 63, 129, 16),
];

/// The same over IPv6: AWS's instance metadata service (IMDS) on Nitro
/// instances.
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)];

/// The IPv4 addresses an IPv6 address carries to an IPv4 host, where it
/// is one of the translation or tunnel forms: NAT64's well-known prefix
/// `64:ff9b::/96` (RFC 6052) and local-use `64:ff9b:1::/48` (RFC 8215,
/// whose operator picks a prefix of 48 to 96 bits: every layout of RFC
/// 6052 §2.2 from /48 on is read), 6to4's `2002::/16` (RFC 3056),
/// Teredo's `2001::/32` (RFC 4380: its server, and its client with the
/// bits inverted), and ISATAP's interface identifier `0:5efe:a.b.c.d`
/// (RFC 5214, either u/l bit) under any prefix.
fn embedded_ipv4(v6: Ipv6Addr) -> Vec<Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    let v4 = |hi: u16, lo: u16| Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    let mut out = Vec::new();
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        out.push(v4(s[6], s[7]));
    }
    if s[0] == 0x64 && s[1] == 0xff9b && s[2] == 1 {
        // RFC 6052 §2.2: the IPv4 bits around the reserved octet 8.
        out.push(Ipv4Addr::new(o[6], o[7], o[9], o[10])); // /48
        out.push(Ipv4Addr::new(o[7], o[9], o[10], o[11])); // /56
        out.push(Ipv4Addr::new(o[9], o[10], o[11], o[12])); // /64
        out.push(Ipv4Addr::new(o[12], o[13], o[14], o[15])); // /96
    }
    if s[0] == 0x2002 {
        out.push(v4(s[1], s[2]));
    }
    if s[0] == 0x2001 && s[1] == 0 {
        out.push(v4(s[2], s[3]));
        out.push(v4(!s[6], !s[7]));
    }
    if (s[4] == 0 || s[4] == 0x0200) && s[5] == 0x5efe {
        out.push(v4(s[6], s[7]));
    }
    out
}

/// Why an address can never be a replica's, if it cannot (cloud
/// metadata, link-local, unspecified, multicast, broadcast, and those
/// reached through IPv6 translations of them): the same for a
/// registration and a replica listed in the config file.
pub fn forbidden_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            if METADATA_V4.contains(&v4) {
                Some("cloud metadata")
            } else if v4.is_link_local() {
                Some("link-local")
            } else if v4.is_unspecified() {
                Some("unspecified")
            } else if v4.is_multicast() {
                Some("multicast")
            } else if v4.is_broadcast() {
                Some("broadcast")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_kind(IpAddr::V4(v4));
            }
            // A forbidden IPv4 host reached through a translator or a
            // tunnel is still that host.
            if let Some(kind) = embedded_ipv4(v6)
                .into_iter()
                .find_map(|v4| forbidden_kind(IpAddr::V4(v4)))
            {
                return Some(kind);
            }
            if METADATA_V6.contains(&v6) {
                Some("cloud metadata")
            } else if v6.to_ipv4().is_some() && !v6.is_loopback() && !v6.is_unspecified() {
                // `::a.b.c.d`, deprecated by RFC 4291 §2.5.5.1: no host
                // has one, and a stack that routes it reaches the IPv4
                // host behind every rule here.
                Some("deprecated IPv4-compatible")
            } else if v6.is_unicast_link_local() {
                Some("link-local")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_multicast() {
                Some("multicast")
            } else {
                None
            }
        }
    }
}

impl Rules {
    /// Checks an endpoint a client asked to register; `own` are the
    /// gateway's listeners (traffic, admin) as bound.
    pub fn check(
        &self,
        endpoint: &str,
        own: &[(SocketAddr, &'static str)],
    ) -> Result<Endpoint, Refused> {
        let malformed = |why: &str| Refused::Malformed(format!("`{endpoint}`: {why}"));
        let rest = endpoint
            .strip_prefix("http://")
            .ok_or_else(|| malformed("expected http://IP:PORT"))?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['@', '/', '?', '#', '\\', '%']) || authority.is_empty() {
            return Err(malformed(
                "expected http://IP:PORT (no user information, path, query or fragment)",
            ));
        }
        let addr: std::net::SocketAddr = authority
            .parse()
            .map_err(|_| malformed("the host must be an IP address with a port"))?;
        if addr.port() == 0 {
            return Err(malformed("port 0"));
        }
        let ip = match addr.ip() {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        if let Some(kind) = forbidden_kind(ip) {
            return Err(Refused::Forbidden(ip, kind));
        }
        if !self.allowed.iter().any(|n| n.contains(&ip)) {
            return Err(Refused::OutsideNetworks(ip));
        }
        let canonical = SocketAddr::new(ip, addr.port());
        // A listener on an unspecified address (0.0.0.0, ::) takes every
        // local address; of those, loopback is the one always local.
        if let Some(&(l, which)) = own.iter().find(|(l, _)| {
            l.port() == canonical.port()
                && (l.ip() == ip
                    || (l.ip().is_unspecified() && (ip.is_loopback() || self.local.contains(&ip))))
        }) {
            return Err(Refused::Own(l, which));
        }
        Endpoint::parse(&format!("http://{canonical}")).map_err(Refused::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(nets: &[&str]) -> Rules {
        Rules {
            allowed: nets.iter().map(|n| n.parse().unwrap()).collect(),
            max_replicas_per_model: 4,
            local: vec!["10.0.0.9".parse().unwrap()],
        }
    }

    #[test]
    fn loopback_and_pod_networks_pass() {
        let r = rules(&["127.0.0.0/8", "::1/128", "10.0.0.0/8"]);
        for ok in [
            "http://127.0.0.1:8000",
            "http://127.0.0.1:8000/",
            "http://10.1.2.3:80",
            "http://[::1]:9000",
        ] {
            assert!(r.check(ok, &[]).is_ok(), "{ok}");
        }
        assert_eq!(
            r.check("http://10.1.2.3:80", &[]).unwrap().url(),
            "http://10.1.2.3:80"
        );
    }

    #[test]
    fn dangerous_and_malformed_endpoints_are_refused() {
        // Everything allowed by the networks: the fixed rules still hold.
        let r = rules(&["0.0.0.0/0", "::/0"]);
        for bad in [
            "http://169.254.169.254:80",
            "http://[fe80::1]:80",
            "http://0.0.0.0:80",
            "http://[::]:80",
            "http://224.0.0.1:80",
            "http://255.255.255.255:80",
            "http://[::ffff:169.254.169.254]:80",
            // Metadata services outside link-local, and forbidden IPv4
            // hosts behind NAT64, 6to4, Teredo and IPv4-compatible forms.
            "http://100.100.100.200:80",
            "http://192.0.0.192:80",
            "http://168.63.129.16:80",
            "http://[fd00:ec2::254]:80",
            "http://[64:ff9b::a9fe:a9fe]:80",
            "http://[64:ff9b::6464:64c8]:80",
            "http://[64:ff9b:1::a9fe:a9fe]:80",
            "http://[2002:a9fe:a9fe::1]:80",
            "http://[2001:0:a9fe:a9fe::1]:80",
            "http://[2001:0:4136:e378:8000:63bf:5601:5601]:80",
            "http://[::127.0.0.1]:80",
            "http://[::a9fe:a9fe]:80",
            "http://[64:ff9b:1:a9fe:a9:fe00::]:80",
            "http://[64:ff9b:1:0:a9:fea9:fe00:0]:80",
            "http://[fd00:1::5efe:a9fe:a9fe]:80",
            "http://[fd00:1::200:5efe:a9fe:a9fe]:80",
            "http://user:pw@127.0.0.1:80",
            "http://127.0.0.1@evil:80",
            "https://127.0.0.1:80",
            "ftp://127.0.0.1:80",
            "127.0.0.1:80",
            "http://127.0.0.1",
            "http://127.0.0.1:0",
            "http://127.0.0.1:80/v1",
            "http://127.0.0.1:80?x=1",
            "http://127.0.0.1:80#f",
            "http://localhost:80",
            "http://metadata.google.internal:80",
            "http://",
            "http://127.0.0.1:99999",
            "http://127.0.0.1%2f:80",
        ] {
            assert!(r.check(bad, &[]).is_err(), "{bad} was accepted");
        }
        // Translated and tunnelled addresses of ordinary hosts pass.
        for ok in [
            "http://[64:ff9b::a00:1]:80",
            "http://[2002:a00:1::1]:80",
            "http://[fd00:ec2::1]:80",
        ] {
            assert!(r.check(ok, &[]).is_ok(), "{ok} was refused");
        }
    }

    #[test]
    fn a_mapped_address_is_stored_as_ipv4_and_own_listeners_are_refused() {
        let r = rules(&["127.0.0.0/8", "::1/128", "10.0.0.0/8"]);
        assert_eq!(
            r.check("http://[::ffff:127.0.0.1]:8000", &[]).unwrap(),
            r.check("http://127.0.0.1:8000", &[]).unwrap()
        );
        let bound: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:9090".parse().unwrap();
        let own = [(bound, "traffic"), (any, "admin")];
        assert_eq!(
            r.check("http://127.0.0.1:8080", &own),
            Err(Refused::Own(bound, "traffic"))
        );
        assert_eq!(
            r.check("http://[::ffff:127.0.0.1]:8080", &own),
            Err(Refused::Own(bound, "traffic"))
        );
        // Bound to every address: loopback reaches it.
        assert_eq!(
            r.check("http://127.0.0.1:9090", &own),
            Err(Refused::Own(any, "admin"))
        );
        assert_eq!(
            r.check("http://[::1]:9090", &own),
            Err(Refused::Own(any, "admin"))
        );
        // The pod's own IP, where the listener takes every address.
        assert_eq!(
            r.check("http://10.0.0.9:9090", &own),
            Err(Refused::Own(any, "admin"))
        );
        // Another port, or another address of a loopback-bound listener.
        assert!(r.check("http://127.0.0.1:8081", &own).is_ok());
        assert!(r.check("http://10.0.0.9:8080", &own).is_ok());
        assert!(r.check("http://10.0.0.5:8080", &own).is_ok());
    }

    #[test]
    fn outside_the_networks_is_refused() {
        let r = rules(&["127.0.0.0/8"]);
        assert_eq!(
            r.check("http://10.0.0.5:8000", &[]),
            Err(Refused::OutsideNetworks("10.0.0.5".parse().unwrap()))
        );
        assert!(r.check("http://[::1]:80", &[]).is_err());
    }
}
