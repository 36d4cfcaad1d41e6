//! Where a request's priority class comes from, pure: configuration, not
//! the client's word. In order:
//! 1. the priority header, only from a trusted source: a peer inside
//!    `priorities.trustedNetworks` (a proxy that sets the header itself),
//!    or a request whose API key is configured with `allowHeader`;
//! 2. the priority of the request's API key (`Authorization: Bearer`,
//!    matched by its SHA-256 digest, so the file holds no secret);
//! 3. the first route whose `pathPrefix` the request path starts with;
//! 4. the model's own priority.
//!
//! By default there is no trusted source, so the header is ignored.

use std::net::IpAddr;

use gpuscale_policies::model::Priority;
use ipnet::IpNet;
use subtle::ConstantTimeEq;

/// One configured API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRule {
    /// SHA-256 of the key.
    pub digest: [u8; 32],
    /// Its requests' class, if it sets one.
    pub priority: Option<Priority>,
    /// Whether its requests may set the class by header.
    pub allow_header: bool,
}

/// The configured rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// Peers whose priority header is honoured.
    pub trusted_networks: Vec<IpNet>,
    /// API keys.
    pub keys: Vec<KeyRule>,
    /// Path prefixes and their classes, first match wins.
    pub routes: Vec<(String, Priority)>,
    /// Whether a trusted peer's `X-Forwarded-For` names the client
    /// ([`crate::fairness::source`]).
    pub forwarded_for: bool,
}

/// What decided a request's class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The header, from a trusted source.
    Header,
    /// The API key's configured class.
    Key,
    /// A route's configured class.
    Route,
    /// The model's class.
    Model,
}

/// The request's facts the decision reads.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The TCP peer.
    pub peer: IpAddr,
    /// `Authorization` header value.
    pub authorization: Option<&'a [u8]>,
    /// Request path.
    pub path: &'a str,
    /// The priority header's value.
    pub header: Option<&'a [u8]>,
}

/// Parses a priority header value.
pub fn parse(value: &[u8]) -> Option<Priority> {
    let v = value.trim_ascii();
    if v.eq_ignore_ascii_case(b"critical") {
        Some(Priority::Critical)
    } else if v.eq_ignore_ascii_case(b"standard") {
        Some(Priority::Standard)
    } else if v.eq_ignore_ascii_case(b"sheddable") {
        Some(Priority::Sheddable)
    } else {
        None
    }
}

/// SHA-256 of an API key.
pub fn digest(key: &[u8]) -> [u8; 32] {
    crate::auth::sha256(key)
}

impl Rules {
    /// Whether any rule is configured (the hot path skips all work when
    /// none is).
    pub fn is_empty(&self) -> bool {
        self.trusted_networks.is_empty() && self.keys.is_empty() && self.routes.is_empty()
    }

    fn key(&self, authorization: Option<&[u8]>) -> Option<(usize, &KeyRule)> {
        if self.keys.is_empty() {
            return None;
        }
        let d = digest(crate::auth::bearer(authorization?)?);
        // Every digest is compared, in constant time each.
        let mut found = None;
        for (i, k) in self.keys.iter().enumerate() {
            if bool::from(k.digest.ct_eq(&d)) && found.is_none() {
                found = Some((i, k));
            }
        }
        found
    }

    /// The request's class and what decided it.
    pub fn decide(&self, req: Request<'_>, model: Priority) -> (Priority, Source) {
        let (p, s, _) = self.decide_keyed(req, model);
        (p, s)
    }

    /// [`Rules::decide`], and the index of the configured key the request
    /// carries, if any (its client for fairness: [`crate::fairness`]).
    pub fn decide_keyed(
        &self,
        req: Request<'_>,
        model: Priority,
    ) -> (Priority, Source, Option<usize>) {
        if self.is_empty() {
            return (model, Source::Model, None);
        }
        let found = self.key(req.authorization);
        let index = found.map(|(i, _)| i);
        let key = found.map(|(_, k)| k);
        let trusted = key.is_some_and(|k| k.allow_header)
            || crate::fairness::trusts(&self.trusted_networks, &req.peer);
        if trusted && let Some(p) = req.header.and_then(parse) {
            return (p, Source::Header, index);
        }
        if let Some(p) = key.and_then(|k| k.priority) {
            return (p, Source::Key, index);
        }
        // A path is the client's to choose (`/v1/embeddings` naming a chat
        // model reaches it too), so a route only ever lowers a request
        // below its model's class, never raises it: raising takes a key
        // or a trusted header.
        if let Some((_, p)) = self
            .routes
            .iter()
            .find(|(prefix, _)| req.path.starts_with(prefix.as_str()))
            && *p > model
        {
            return (*p, Source::Route, index);
        }
        (model, Source::Model, index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req<'a>(peer: &str, auth: Option<&'a str>, header: Option<&'a str>) -> Request<'a> {
        Request {
            peer: peer.parse().unwrap(),
            authorization: auth.map(str::as_bytes),
            path: "/v1/chat/completions",
            header: header.map(str::as_bytes),
        }
    }

    #[test]
    fn the_key_a_request_carries_is_named_by_its_index_and_an_unknown_one_is_none() {
        let r = Rules {
            keys: vec![
                KeyRule {
                    digest: digest(b"team-a-key"),
                    priority: None,
                    allow_header: false,
                },
                KeyRule {
                    digest: digest(b"team-b-key"),
                    priority: Some(Priority::Sheddable),
                    allow_header: false,
                },
            ],
            ..Rules::default()
        };
        let m = Priority::Standard;
        assert_eq!(
            r.decide_keyed(req("10.0.0.1", Some("Bearer team-b-key"), None), m),
            (Priority::Sheddable, Source::Key, Some(1))
        );
        assert_eq!(
            r.decide_keyed(req("10.0.0.1", Some("Bearer team-a-key"), None), m),
            (m, Source::Model, Some(0))
        );
        assert_eq!(
            r.decide_keyed(req("10.0.0.1", Some("Bearer minted-1"), None), m),
            (m, Source::Model, None)
        );
    }

    #[test]
    fn by_default_the_header_is_ignored() {
        let r = Rules::default();
        assert_eq!(
            r.decide(req("10.0.0.1", None, Some("critical")), Priority::Standard),
            (Priority::Standard, Source::Model)
        );
    }

    #[test]
    fn trusted_networks_and_keys_may_set_the_header() {
        let r = Rules {
            trusted_networks: vec!["10.9.0.0/16".parse().unwrap()],
            keys: vec![
                KeyRule {
                    digest: digest(b"gold-key"),
                    priority: Some(Priority::Critical),
                    allow_header: false,
                },
                KeyRule {
                    digest: digest(b"ops-key"),
                    priority: None,
                    allow_header: true,
                },
            ],
            routes: vec![("/v1/embeddings".into(), Priority::Sheddable)],
            forwarded_for: false,
        };
        let m = Priority::Standard;
        // A trusted proxy's header wins, the proxy seen by a dual-stack
        // listener as an IPv4-mapped address too.
        assert_eq!(
            r.decide(req("10.9.1.1", None, Some("Sheddable")), m),
            (Priority::Sheddable, Source::Header)
        );
        assert_eq!(
            r.decide(req("::ffff:10.9.1.1", None, Some("Sheddable")), m),
            (Priority::Sheddable, Source::Header)
        );
        // Untrusted peer: header ignored.
        assert_eq!(
            r.decide(req("10.8.1.1", None, Some("critical")), m),
            (m, Source::Model)
        );
        // A key's own class; its header is not honoured.
        assert_eq!(
            r.decide(
                req("10.8.1.1", Some("Bearer gold-key"), Some("sheddable")),
                m
            ),
            (Priority::Critical, Source::Key)
        );
        // A key that allows the header.
        assert_eq!(
            r.decide(req("10.8.1.1", Some("Bearer ops-key"), Some("critical")), m),
            (Priority::Critical, Source::Header)
        );
        // Unknown key, a garbage header: the model's class.
        assert_eq!(
            r.decide(req("10.8.1.1", Some("Bearer nope"), Some("urgent")), m),
            (m, Source::Model)
        );
        // A route.
        let mut e = req("10.8.1.1", None, None);
        e.path = "/v1/embeddings";
        assert_eq!(r.decide(e, m), (Priority::Sheddable, Source::Route));
        // A route never raises a request above its model's class: the
        // path is the client's choice.
        assert_eq!(
            r.decide(e, Priority::Sheddable),
            (Priority::Sheddable, Source::Model)
        );
        let raising = Rules {
            routes: vec![("/v1/embeddings".into(), Priority::Critical)],
            ..Rules::default()
        };
        assert_eq!(
            raising.decide(e, Priority::Standard),
            (Priority::Standard, Source::Model)
        );
    }

    #[test]
    fn header_values_parse() {
        assert_eq!(parse(b" CRITICAL "), Some(Priority::Critical));
        assert_eq!(parse(b"standard"), Some(Priority::Standard));
        assert_eq!(parse(b"sheddable"), Some(Priority::Sheddable));
        assert_eq!(parse(b"high"), None);
    }
}
