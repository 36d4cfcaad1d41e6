//! Admin API authentication, pure apart from reading the token file: a
//! bearer token read from a file (as Kubernetes mounts a Secret), kept
//! only as its SHA-256 digest and compared in constant time, and the rule
//! that says which admin endpoint needs it.
//!
//! The rule ([`decide`]):
//! - `/healthz` and `/readyz` are open (probes carry no credentials, and
//!   they reveal nothing);
//! - endpoints that change state (`POST`/`DELETE /v1/replicas`) always
//!   need the token; with no token configured they are refused outright;
//! - read endpoints (`/metrics`, `/v1/queues`, `/v1/replicas`, the stream,
//!   and any unknown path) need it when the admin listener is not on a
//!   loopback address, where the read-only token (`spec.readTokenFile`,
//!   a scraper's) serves as well. The gateway refuses to start with such
//!   a listener and neither token
//!   ([`crate::config::Settings::check_exposure`]).

use std::path::Path;

use http::HeaderValue;
use subtle::ConstantTimeEq;

/// Shortest token accepted: 16 characters (a random token is 32 or more).
pub const MIN_TOKEN_LEN: usize = 16;

/// Fewest different characters an admin token must use.
pub const MIN_TOKEN_SYMBOLS: usize = 8;

/// The admin token, held as its SHA-256 digest.
#[derive(Clone)]
pub struct AdminToken {
    digest: [u8; 32],
    /// The file it was read from, where every user of the machine may
    /// read it ([`AdminToken::readable_by_all`]).
    readable_by_all: Option<std::path::PathBuf>,
}

impl PartialEq for AdminToken {
    fn eq(&self, other: &Self) -> bool {
        bool::from(self.digest.ct_eq(&other.digest))
    }
}

impl Eq for AdminToken {}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminToken(<redacted>)")
    }
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl AdminToken {
    /// A token from its secret text (surrounding whitespace removed).
    pub fn from_secret(secret: &str) -> Result<AdminToken, String> {
        let secret = secret.trim();
        if secret.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "the admin token must be at least {MIN_TOKEN_LEN} characters (found {})",
                secret.len()
            ));
        }
        if !secret.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the admin token must be printable ASCII without spaces (it travels in an HTTP header)"
                    .into(),
            );
        }
        // A long token of few symbols (`aaaaaaaaaaaaaaaa`, `1212…`) is a
        // guess away; random hex has 16.
        let distinct = secret
            .bytes()
            .collect::<std::collections::BTreeSet<u8>>()
            .len();
        if distinct < MIN_TOKEN_SYMBOLS {
            return Err(format!(
                "the admin token uses {distinct} different characters; at least {MIN_TOKEN_SYMBOLS} are needed \
                 (make one with `openssl rand -hex 32`)"
            ));
        }
        Ok(AdminToken {
            digest: sha256(secret.as_bytes()),
            readable_by_all: None,
        })
    }

    /// The file the token was read from, where every user of this machine
    /// may read it (mode `o+r`): a listener off loopback refuses to start
    /// with such a token ([`crate::config::Settings::check_exposure`]),
    /// since any local user could take it and register replicas that
    /// receive prompts.
    pub fn readable_by_all(&self) -> Option<&Path> {
        self.readable_by_all.as_deref()
    }

    /// Reads a token file (a trailing newline is ignored); a file every user
    /// may read is warned about, and remembered
    /// ([`AdminToken::readable_by_all`]).
    pub fn from_file(path: &Path) -> Result<AdminToken, String> {
        // A token is a line; a file far longer (a device such as
        // /dev/zero among them) is refused before it fills memory.
        let text = gpuscale_policies::load::read_limited(path, 64 * 1024)
            .and_then(|b| String::from_utf8(b).map_err(|_| "not UTF-8 text".to_string()))
            .map_err(|e| format!("reading the admin token file {}: {e}", path.display()))?;
        let mut token =
            AdminToken::from_secret(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o004 != 0 {
                tracing::warn!(
                    file = %path.display(),
                    "the token file is readable by every user of this machine (chmod 600, or a Secret volume's defaultMode 0440); an admin listener off loopback refuses it"
                );
                token.readable_by_all = Some(path.to_path_buf());
            }
        }
        Ok(token)
    }

    /// A fresh random token (256 bits, hex) and its secret text: the
    /// embedded mode's, when none is configured.
    pub fn generate() -> Result<(AdminToken, String), String> {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| "the operating system's random source failed".to_string())?;
        let secret: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Ok((AdminToken::from_secret(&secret)?, secret))
    }

    /// Whether an `Authorization` header carries this token as
    /// `Bearer <token>`; constant time in the token's content.
    pub fn verify(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(presented) = authorization.and_then(|v| bearer(v.as_bytes())) else {
            return false;
        };
        bool::from(sha256(presented).ct_eq(&self.digest))
    }
}

/// The credential of an `Authorization: Bearer <credential>` header (the
/// scheme is case-insensitive, RFC 9110 §11.1).
pub fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let rest = rest.trim_ascii();
    (!rest.is_empty()).then_some(rest)
}

/// What an admin endpoint does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Health and readiness probes.
    Open,
    /// Reads state.
    Read,
    /// Changes state.
    Write,
}

/// The class of an admin request.
pub fn classify(method: &http::Method, path: &str) -> Access {
    match (method, path) {
        (_, "/healthz" | "/readyz") => Access::Open,
        (&http::Method::GET | &http::Method::HEAD, _) => Access::Read,
        _ => Access::Write,
    }
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go on.
    Allow,
    /// 401: no token, or the wrong one.
    Unauthorized,
    /// 403: state changes are off because no token is configured.
    NoTokenConfigured,
    /// 403: the read-only token, valid, asked for a change (RFC 9110
    /// §15.5.4: understood and refused; another try with it is no use).
    ReadOnly,
}

/// Whether a request of class `access` may go on. The admin `token`
/// allows everything; the `read` token reads and changes nothing.
pub fn decide(
    access: Access,
    admin_on_loopback: bool,
    token: Option<&AdminToken>,
    read: Option<&AdminToken>,
    authorization: Option<&HeaderValue>,
) -> Verdict {
    let verified = |t: Option<&AdminToken>| t.is_some_and(|t| t.verify(authorization));
    match (access, token) {
        (Access::Open, _) => Verdict::Allow,
        (Access::Write, None) => Verdict::NoTokenConfigured,
        (Access::Write, Some(t)) if verified(Some(t)) => Verdict::Allow,
        (Access::Write, Some(_)) if verified(read) => Verdict::ReadOnly,
        (Access::Write, Some(_)) => Verdict::Unauthorized,
        (Access::Read, _) if admin_on_loopback => Verdict::Allow,
        (Access::Read, _) if verified(token) || verified(read) => Verdict::Allow,
        // Neither token (none configured is not reachable once
        // `check_exposure` passed): refuse rather than serve an exposed
        // listener unauthenticated.
        (Access::Read, _) => Verdict::Unauthorized,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123";

    fn header(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn a_token_matches_only_itself_as_a_bearer_credential() {
        let t = AdminToken::from_secret(&format!("{SECRET}\n")).unwrap();
        assert!(t.verify(Some(&header(&format!("Bearer {SECRET}")))));
        assert!(t.verify(Some(&header(&format!("bearer {SECRET}")))));
        assert!(!t.verify(Some(&header(&format!("Bearer {SECRET}x")))));
        assert!(!t.verify(Some(&header(&format!("Basic {SECRET}")))));
        assert!(!t.verify(Some(&header(SECRET))));
        assert!(!t.verify(Some(&header("Bearer "))));
        assert!(!t.verify(None));
    }

    #[test]
    fn short_or_spaced_tokens_are_refused() {
        assert!(AdminToken::from_secret("short").is_err());
        assert!(AdminToken::from_secret("sixteen chars but spaced").is_err());
        assert!(AdminToken::from_secret("").is_err());
        // Long enough, but a guess away.
        assert!(AdminToken::from_secret("aaaaaaaaaaaaaaaa").is_err());
        assert!(AdminToken::from_secret("1212121212121212").is_err());
        assert!(AdminToken::from_secret("0123456789abcdef").is_ok());
    }

    #[test]
    fn generated_tokens_differ_and_verify() {
        let (a, sa) = AdminToken::generate().unwrap();
        let (b, _) = AdminToken::generate().unwrap();
        assert_ne!(a, b);
        assert!(a.verify(Some(&header(&format!("Bearer {sa}")))));
        assert_eq!(format!("{a:?}"), "AdminToken(<redacted>)");
    }

    #[test]
    fn the_rule_matrix() {
        let t = AdminToken::from_secret(SECRET).unwrap();
        const READER: &str = "fedcba9876543210fedcba";
        let r = AdminToken::from_secret(READER).unwrap();
        let good = header(&format!("Bearer {SECRET}"));
        let reader = header(&format!("Bearer {READER}"));
        let bad = header("Bearer wrong-token-wrong-token");
        use Access::*;
        use Verdict::*;
        for loopback in [true, false] {
            for read in [None, Some(&r)] {
                assert_eq!(decide(Open, loopback, None, read, None), Allow);
                assert_eq!(decide(Open, loopback, Some(&t), read, None), Allow);
                assert_eq!(
                    decide(Write, loopback, None, read, Some(&good)),
                    NoTokenConfigured
                );
                assert_eq!(decide(Write, loopback, Some(&t), read, None), Unauthorized);
                assert_eq!(
                    decide(Write, loopback, Some(&t), read, Some(&bad)),
                    Unauthorized
                );
                assert_eq!(decide(Write, loopback, Some(&t), read, Some(&good)), Allow);
                assert_eq!(decide(Read, loopback, Some(&t), read, Some(&good)), Allow);
                // The read token never changes anything: refused as
                // such (403) where it is one, as no credential where none
                // is configured.
                assert_eq!(
                    decide(Write, loopback, Some(&t), read, Some(&reader)),
                    if read.is_some() {
                        ReadOnly
                    } else {
                        Unauthorized
                    }
                );
                assert_eq!(
                    decide(Write, loopback, None, read, Some(&reader)),
                    NoTokenConfigured
                );
            }
        }
        assert_eq!(decide(Read, true, None, None, None), Allow);
        assert_eq!(decide(Read, true, Some(&t), None, None), Allow);
        assert_eq!(decide(Read, false, Some(&t), None, None), Unauthorized);
        assert_eq!(
            decide(Read, false, Some(&t), None, Some(&bad)),
            Unauthorized
        );
        assert_eq!(decide(Read, false, None, None, None), Unauthorized);
        // Off loopback the read token reads, with or without an admin token.
        assert_eq!(
            decide(Read, false, Some(&t), Some(&r), Some(&reader)),
            Allow
        );
        assert_eq!(decide(Read, false, None, Some(&r), Some(&reader)), Allow);
        assert_eq!(
            decide(Read, false, None, Some(&r), Some(&bad)),
            Unauthorized
        );
        // Without a read token configured, its value is no credential.
        assert_eq!(
            decide(Read, false, Some(&t), None, Some(&reader)),
            Unauthorized
        );
    }

    #[test]
    fn endpoints_are_classified() {
        use http::Method;
        assert_eq!(classify(&Method::GET, "/healthz"), Access::Open);
        assert_eq!(classify(&Method::GET, "/readyz"), Access::Open);
        assert_eq!(classify(&Method::GET, "/v1/replicas"), Access::Read);
        assert_eq!(classify(&Method::GET, "/nope"), Access::Read);
        assert_eq!(classify(&Method::POST, "/v1/replicas"), Access::Write);
        assert_eq!(classify(&Method::DELETE, "/v1/replicas"), Access::Write);
        assert_eq!(classify(&Method::PUT, "/anything"), Access::Write);
    }
}
