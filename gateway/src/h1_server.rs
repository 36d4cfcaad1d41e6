//! HTTP/1.1 on the client side of the traffic listener, as pure functions
//! over buffers: the request head parsed into offsets of the bytes read
//! (RFC 9112 §2–3, body framing per §6.1–6.3), the head forwarded to the
//! replica with the hop-by-hop fields cut out (RFC 9110 §7.6.1), and the
//! pieces of the response heads the gateway writes. [`crate::traffic`]
//! drives them over the client's socket; nothing here does I/O.
//!
//! Heads are never turned into a `HeaderMap`: the request head is
//! forwarded from its own bytes and the replica's response head
//! ([`crate::h1::RawResponse`]) is relayed from its bytes, as nginx
//! relays them. Parsing is `httparse`'s (hyper's parser), which refuses
//! what is not a token in a name and control characters in a value, so
//! what is relayed cannot split a head.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::time::SystemTime;

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode};

use crate::h1::{self, Field};

/// Requests with more header fields than this get 431: one fewer than
/// the 100 of hyper (vLLM's servers) and of this gateway's own replica
/// side, since the forwarded head gains a `Via` field.
pub const MAX_REQUEST_HEADERS: usize = 99;

/// How the request body is framed (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// No body.
    None,
    /// Exactly this many bytes (more than zero).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// Why a request head is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// Larger than `limits.maxHeaderBytes`: 431.
    #[error("the request head is larger than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// More than [`MAX_REQUEST_HEADERS`] fields: 431.
    #[error("the request head has more than {MAX_REQUEST_HEADERS} header fields")]
    TooManyFields,
    /// Not HTTP/1.x: 400.
    #[error("malformed request head: {0}")]
    Syntax(httparse::Error),
    /// Parses, but is not a request to serve: 400.
    #[error("invalid request: {0}")]
    Invalid(&'static str),
    /// A transfer coding other than chunked: 501 (RFC 9112 §6.1).
    #[error("the transfer coding `{0}` is not supported; send the body chunked or with a length")]
    Coding(String),
}

impl RequestError {
    /// The status it is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            RequestError::TooLarge { .. } | RequestError::TooManyFields => {
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            }
            RequestError::Syntax(_) | RequestError::Invalid(_) => StatusCode::BAD_REQUEST,
            RequestError::Coding(_) => StatusCode::NOT_IMPLEMENTED,
        }
    }
}

/// A request head, kept as the bytes the client sent.
#[derive(Debug)]
pub struct RequestHead {
    raw: Bytes,
    /// The method.
    pub method: Method,
    /// The path and query (origin form) in `raw`; `None`: `/` (an
    /// absolute-form target with no path).
    target: Option<(u32, u32)>,
    /// Of the target, the path's length (before `?`).
    path_len: u32,
    /// `HTTP/1.0` (not 1.1).
    pub http10: bool,
    fields: Vec<Field>,
    /// Bit `i`: field `i` is not forwarded.
    cut: u128,
    /// How the body is framed.
    pub body: BodyLength,
    /// The client may send another request on this connection.
    pub keep_alive: bool,
    /// `Expect: 100-continue`.
    pub expect_continue: bool,
}

/// Which framing-relevant field a name is, by a length check first.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Host,
    ContentLength,
    TransferEncoding,
    Connection,
    Expect,
    HopByHop,
    Other,
}

fn kind(name: &[u8]) -> Kind {
    let is = |n: &[u8]| name.eq_ignore_ascii_case(n);
    match name.len() {
        4 if is(b"host") => Kind::Host,
        14 if is(b"content-length") => Kind::ContentLength,
        17 if is(b"transfer-encoding") => Kind::TransferEncoding,
        10 if is(b"connection") => Kind::Connection,
        6 if is(b"expect") => Kind::Expect,
        2 | 7 | 10 | 16 | 18 | 19 if h1::is_hop_by_hop_name(name) => Kind::HopByHop,
        _ => Kind::Other,
    }
}

/// Parses a request head off the front of `buf`. `Ok(None)`: incomplete,
/// read more. `limit`: the largest head accepted, in bytes as received
/// (`limits.maxHeaderBytes`); a partial head already past it is refused
/// without waiting for the rest.
pub fn parse_request(
    buf: &mut BytesMut,
    limit: usize,
) -> Result<Option<RequestHead>, RequestError> {
    let (len, method, target, path_len, http10, fields) = {
        let mut headers =
            [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_REQUEST_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
            &mut req,
            buf,
            &mut headers,
        );
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) if buf.len() > limit => {
                return Err(RequestError::TooLarge { limit });
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TooManyFields),
            Err(e) => return Err(RequestError::Syntax(e)),
        };
        if len > limit {
            return Err(RequestError::TooLarge { limit });
        }
        let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
            .map_err(|_| RequestError::Invalid("the method is not a token"))?;
        let raw_target = req.path.unwrap_or_default();
        let base = buf.as_ptr() as usize;
        let start = raw_target.as_ptr() as usize - base;
        let path_and_query = if raw_target.starts_with('/') || raw_target == "*" {
            Some((start, raw_target))
        } else if let Some(rest) = strip_scheme(raw_target) {
            // Absolute form (RFC 9112 §3.2.2): the authority is dropped,
            // the replica gets the origin form.
            match rest.find(['/', '?']) {
                Some(i) if rest.as_bytes()[i] == b'/' => {
                    let at = raw_target.len() - rest.len() + i;
                    Some((start + at, &raw_target[at..]))
                }
                Some(_) => return Err(RequestError::Invalid("an absolute target with no path")),
                None => None,
            }
        } else {
            return Err(RequestError::Invalid(
                "the target is neither origin nor absolute form",
            ));
        };
        let (target, path_len) = match path_and_query {
            Some((at, t)) => (
                Some((at as u32, t.len() as u32)),
                t.find('?').unwrap_or(t.len()) as u32,
            ),
            None => (None, 1),
        };
        let http10 = req.version == Some(0);
        (
            len,
            method,
            target,
            path_len,
            http10,
            h1::fields_of(buf, req.headers),
        )
    };
    let raw = buf.split_to(len).freeze();
    classify(raw, method, target, path_len, http10, fields).map(Some)
}

fn strip_scheme(target: &str) -> Option<&str> {
    let lower = |n: usize| target.get(..n).map(str::to_ascii_lowercase);
    if lower(7).as_deref() == Some("http://") {
        Some(&target[7..])
    } else if lower(8).as_deref() == Some("https://") {
        Some(&target[8..])
    } else {
        None
    }
}

fn classify(
    raw: Bytes,
    method: Method,
    target: Option<(u32, u32)>,
    path_len: u32,
    http10: bool,
    fields: Vec<Field>,
) -> Result<RequestHead, RequestError> {
    let mut cut = 0u128;
    let mut hosts = 0;
    let mut length = None;
    let mut chunked = None;
    let (mut close, mut keep_alive_token, mut named) = (false, false, false);
    let mut expect_continue = false;
    for (i, f) in fields.iter().enumerate() {
        let (name, value) = (f.name(&raw), f.value(&raw));
        let k = kind(name);
        match k {
            Kind::Host => hosts += 1,
            Kind::ContentLength => h1::content_length(value, &mut length)
                .map_err(|_| RequestError::Invalid("Content-Length is not a length"))?,
            Kind::TransferEncoding => {
                // Only chunked alone: a coding the gateway would have to
                // undo (gzip, say) must not reach the replica unlabelled.
                // One that does not end in chunked is a 400 below.
                let last = value.rsplit(|&b| b == b',').next().unwrap_or_default();
                let last_chunked = last.trim_ascii().eq_ignore_ascii_case(b"chunked");
                if last_chunked && chunked.is_none() && value.contains(&b',') {
                    return Err(RequestError::Coding(
                        String::from_utf8_lossy(value.trim_ascii()).into_owned(),
                    ));
                }
                chunked = Some(last_chunked && chunked.is_none());
            }
            Kind::Connection => {
                for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    close |= token.eq_ignore_ascii_case(b"close");
                    keep_alive_token |= token.eq_ignore_ascii_case(b"keep-alive");
                }
                named |= h1::connection_tokens(value).next().is_some();
            }
            Kind::Expect => {
                expect_continue |= value.trim_ascii().eq_ignore_ascii_case(b"100-continue")
            }
            Kind::HopByHop | Kind::Other => {}
        }
        if k != Kind::Other {
            cut |= 1 << i;
        }
    }
    // RFC 9112 §3.2: exactly one Host in HTTP/1.1.
    if hosts > 1 {
        return Err(RequestError::Invalid("more than one Host field"));
    }
    if hosts == 0 && !http10 {
        return Err(RequestError::Invalid("an HTTP/1.1 request without Host"));
    }
    if named {
        let tokens: Vec<&[u8]> = fields
            .iter()
            .filter(|f| kind(f.name(&raw)) == Kind::Connection)
            .flat_map(|f| h1::connection_tokens(f.value(&raw)))
            .collect();
        for (i, f) in fields.iter().enumerate() {
            if tokens.iter().any(|t| t.eq_ignore_ascii_case(f.name(&raw))) {
                cut |= 1 << i;
            }
        }
    }
    // RFC 9112 §6.1 and §6.3: a request with both is a smuggling attempt
    // or a broken client; one whose last coding is not chunked has no
    // determinable length; HTTP/1.0 has no transfer codings.
    let body = match (chunked, length) {
        (Some(_), Some(_)) => {
            return Err(RequestError::Invalid(
                "both Transfer-Encoding and Content-Length",
            ));
        }
        (Some(_), None) if http10 => {
            return Err(RequestError::Invalid("Transfer-Encoding in HTTP/1.0"));
        }
        (Some(false), None) => {
            return Err(RequestError::Invalid(
                "Transfer-Encoding that does not end in chunked",
            ));
        }
        (Some(true), None) => BodyLength::Chunked,
        (None, Some(n)) if n > 0 => BodyLength::Length(n),
        (None, _) => BodyLength::None,
    };
    Ok(RequestHead {
        raw,
        method,
        target,
        path_len,
        http10,
        fields,
        cut,
        body,
        keep_alive: !close && (!http10 || keep_alive_token),
        expect_continue: expect_continue && body != BodyLength::None && !http10,
    })
}

impl RequestHead {
    /// The path and query, in origin form.
    pub fn target(&self) -> &str {
        match self.target {
            // The bytes came from a `&str` httparse checked.
            Some((at, len)) => {
                std::str::from_utf8(&self.raw[at as usize..(at + len) as usize]).unwrap_or("/")
            }
            None => "/",
        }
    }

    /// The path (the target before `?`).
    pub fn path(&self) -> &str {
        let t = self.target();
        t.get(..self.path_len as usize).unwrap_or(t)
    }

    /// The first value of the field `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| f.name(&self.raw).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value(&self.raw))
    }

    /// Every value of the field `name` (case-insensitive), in order.
    pub fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.fields
            .iter()
            .filter(move |f| f.name(&self.raw).eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| f.value(&self.raw))
    }

    /// The head's size in bytes, as received.
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Never: a head has at least its request line.
    pub fn is_empty(&self) -> bool {
        self.raw.is_empty()
    }

    /// Appends the head to forward to a replica: the method, the origin-
    /// form target, `Host: host`, the client's end-to-end fields as it
    /// sent them (not its `Host`, `Content-Length`, `Expect`, hop-by-hop
    /// fields or those its `Connection` names), `Via: via` (after any the
    /// client sent: RFC 9110 §7.6.3) and `Content-Length: body_len` when
    /// given (the body goes whole).
    pub fn encode_forward(
        &self,
        out: &mut Vec<u8>,
        host: &[u8],
        via: &[u8],
        body_len: Option<usize>,
    ) {
        out.extend_from_slice(self.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target().as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
        out.extend_from_slice(host);
        out.extend_from_slice(b"\r\n");
        for (i, f) in self.fields.iter().enumerate() {
            if self.cut & (1 << i) != 0 {
                continue;
            }
            push_field(out, f.name(&self.raw), f.value(&self.raw));
        }
        push_field(out, b"via", via);
        if let Some(n) = body_len {
            push_field(out, b"content-length", h1::itoa(n, &mut [0u8; 20]));
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// Whether the `Via` field value `value` (a list of `protocol
/// received-by [comment]` entries, RFC 9110 §7.6.3) has an entry received
/// by `pseudonym` (case-insensitive, as host names are).
pub fn via_names(value: &[u8], pseudonym: &str) -> bool {
    via_received_by(value).any(|by| by.eq_ignore_ascii_case(pseudonym.as_bytes()))
}

/// The received-by of each entry of a `Via` field value.
pub fn via_received_by(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').filter_map(|entry| {
        let mut words = entry
            .split(|b| b.is_ascii_whitespace())
            .filter(|w| !w.is_empty());
        words.next();
        words.next()
    })
}

/// Appends `HTTP/1.1 <code> <reason>\r\n`.
pub fn push_status(out: &mut Vec<u8>, status: StatusCode) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Appends `name: value\r\n`.
pub fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// Appends `content-length: n\r\n`.
pub fn push_length(out: &mut Vec<u8>, n: u64) {
    push_field(
        out,
        b"content-length",
        h1::itoa(usize::try_from(n).unwrap_or(usize::MAX), &mut [0u8; 20]),
    );
}

thread_local! {
    // (second since the epoch, its IMF-fixdate): formatted once a second
    // per worker, as hyper and nginx cache theirs.
    static DATE: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

/// Appends `date: <now>\r\n` (RFC 9110 §6.6.1; an origin server with a
/// clock sends it, so the gateway does on the answers it makes itself,
/// and on relayed ones that lack it).
pub fn push_date(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(at, text)| {
        if *at != secs {
            *at = secs;
            *text = httpdate::fmt_http_date(now);
        }
        push_field(out, b"date", text.as_bytes());
    });
}

/// The line that opens a chunk of `n` bytes: its size in hex and CRLF.
pub fn chunk_line(n: usize, buf: &mut [u8; 18]) -> &[u8] {
    let digits = if n == 0 {
        1
    } else {
        (usize::BITS - n.leading_zeros()).div_ceil(4) as usize
    };
    for (i, b) in buf.iter_mut().take(digits).enumerate() {
        let nibble = (n >> (4 * (digits - 1 - i))) & 0xf;
        *b = b"0123456789abcdef"[nibble];
    }
    buf[digits] = b'\r';
    buf[digits + 1] = b'\n';
    &buf[..digits + 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<Option<RequestHead>, RequestError> {
        parse_request(&mut BytesMut::from(raw.as_bytes()), 8192)
    }

    fn forwarded(raw: &str, body: Option<usize>) -> String {
        let head = parse(raw).unwrap().unwrap();
        let mut out = Vec::new();
        head.encode_forward(&mut out, b"10.0.0.7:8000", b"1.1 gpuscale-0a1b", body);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_forwarded_head_keeps_end_to_end_fields_as_sent_and_cuts_hop_by_hop_ones() {
        // RFC 9110 §7.6.1: Connection, the fields it names, Keep-Alive,
        // TE, Trailer, Transfer-Encoding, Upgrade, Proxy-* are hop-by-hop;
        // Host is the replica's; the body goes with its own length.
        let raw = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: gateway:8080\r\n\
                   Connection: keep-alive, X-Trace\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\n\
                   Expect: 100-continue\r\nX-Trace: 1\r\nContent-Type: application/json\r\n\
                   Authorization: Bearer t\r\nUpgrade: h2c\r\nProxy-Authorization: x\r\n\
                   Proxy-Connection: keep-alive\r\nContent-Length: 42\r\n\r\n";
        assert_eq!(
            forwarded(raw, Some(42)),
            "POST /v1/completions?x=1 HTTP/1.1\r\nhost: 10.0.0.7:8000\r\n\
             Content-Type: application/json\r\nAuthorization: Bearer t\r\n\
             via: 1.1 gpuscale-0a1b\r\ncontent-length: 42\r\n\r\n"
        );
        let head = parse(raw).unwrap().unwrap();
        assert_eq!(head.body, BodyLength::Length(42));
        assert!(head.keep_alive && head.expect_continue);
        assert_eq!(head.path(), "/v1/completions");
        assert_eq!(head.get("authorization"), Some(&b"Bearer t"[..]));
        assert_eq!(head.len(), raw.len());
    }

    #[test]
    fn the_gateways_via_entry_follows_those_the_client_sent() {
        // RFC 9110 §7.6.3: each proxy appends its entry; several field
        // lines are one list.
        let raw = "GET /v1/models HTTP/1.1\r\nHost: gw\r\nVia: 1.0 fred, 1.1 p.example (Apache/1.1)\r\n\r\n";
        let f = forwarded(raw, None);
        assert!(
            f.ends_with(
                "Via: 1.0 fred, 1.1 p.example (Apache/1.1)\r\nvia: 1.1 gpuscale-0a1b\r\n\r\n"
            ),
            "{f}"
        );
        let head = parse(raw).unwrap().unwrap();
        assert_eq!(
            head.values("via").collect::<Vec<_>>(),
            [&b"1.0 fred, 1.1 p.example (Apache/1.1)"[..]]
        );
    }

    #[test]
    fn via_names_matches_the_received_by_of_any_entry_and_nothing_else() {
        // RFC 9110 §7.6.3's example field, and ours at each place.
        let me = "gpuscale-0a1b";
        assert!(!via_names(b"1.0 fred, 1.1 p.example (Apache/1.1)", me));
        assert!(via_names(b"1.1 gpuscale-0a1b", me));
        assert!(via_names(b"1.0 fred,1.1   GPUSCALE-0A1B ", me));
        assert!(via_names(
            b"1.0 fred, HTTP/1.1 gpuscale-0a1b (gpuscale), 1.1 p",
            me
        ));
        // Another gateway's entry, a comment naming ours, a prefix, the
        // pseudonym as a protocol: not ours.
        assert!(!via_names(b"1.1 gpuscale-0a1c", me));
        assert!(!via_names(b"1.1 p.example (gpuscale-0a1b)", me));
        assert!(!via_names(b"1.1 gpuscale-0a1bc", me));
        assert!(!via_names(b"gpuscale-0a1b", me));
        assert!(!via_names(b"", me));
    }

    #[test]
    fn an_absolute_target_is_forwarded_in_origin_form() {
        // RFC 9112 §3.2.2.
        let f = forwarded(
            "GET http://gw.example/v1/models?a=b HTTP/1.1\r\nhost: gw.example\r\n\r\n",
            None,
        );
        assert!(f.starts_with("GET /v1/models?a=b HTTP/1.1\r\n"), "{f}");
        let f = forwarded(
            "GET HTTPS://gw.example HTTP/1.1\r\nhost: gw.example\r\n\r\n",
            None,
        );
        assert!(f.starts_with("GET / HTTP/1.1\r\n"), "{f}");
        assert!(matches!(
            parse("GET gw.example:80 HTTP/1.1\r\nhost: gw.example\r\n\r\n"),
            Err(RequestError::Invalid(_))
        ));
    }

    #[test]
    fn body_framing_follows_rfc_9112_section_6() {
        // Every request here has one Host (RFC 9112 §3.2) unless it is the
        // point.
        let with_host = |raw: &str| {
            if raw.contains("host:") || raw.contains("HTTP/1.0") {
                raw.to_string()
            } else {
                raw.replacen("\r\n", "\r\nhost: gw\r\n", 1)
            }
        };
        let body = |raw: &str| parse(&with_host(raw)).map(|h| h.unwrap().body);
        assert_eq!(
            body("POST / HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n"),
            Ok(BodyLength::Chunked)
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\ncontent-length: 7, 7\r\n\r\n"),
            Ok(BodyLength::Length(7))
        );
        assert_eq!(
            body("POST / HTTP/1.1\r\ncontent-length: 0\r\n\r\n"),
            Ok(BodyLength::None)
        );
        assert_eq!(body("GET / HTTP/1.1\r\n\r\n"), Ok(BodyLength::None));
        // A coding the gateway would have to undo: 501 (§6.1).
        assert_eq!(
            body("POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n"),
            Err(RequestError::Coding("gzip, chunked".into()))
        );
        assert_eq!(
            RequestError::Coding(String::new()).status(),
            StatusCode::NOT_IMPLEMENTED
        );
        for bad in [
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 5, 6\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: -5\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n",
            "GET / HTTP/1.1\r\nhost: a\r\nhost: b\r\n\r\n",
        ] {
            assert!(
                matches!(parse(&with_host(bad)), Err(RequestError::Invalid(_))),
                "{bad:?} must be refused"
            );
        }
        // No Host in HTTP/1.1: 400; HTTP/1.0 needs none.
        assert!(matches!(
            parse("GET / HTTP/1.1\r\n\r\n"),
            Err(RequestError::Invalid(_))
        ));
        assert!(parse("GET / HTTP/1.0\r\n\r\n").unwrap().is_some());
    }

    #[test]
    fn keep_alive_is_the_default_in_1_1_and_asked_for_in_1_0() {
        let ka = |raw: &str| parse(raw).unwrap().unwrap().keep_alive;
        assert!(ka("GET / HTTP/1.1\r\nhost: gw\r\n\r\n"));
        assert!(!ka(
            "GET / HTTP/1.1\r\nhost: gw\r\nconnection: close\r\n\r\n"
        ));
        assert!(!ka("GET / HTTP/1.0\r\n\r\n"));
        assert!(ka("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
    }

    #[test]
    fn heads_over_the_limit_or_malformed_are_refused_and_partial_ones_ask_for_more() {
        assert!(matches!(
            parse("POST /v1/completions HTTP/1.1\r\nhost"),
            Ok(None)
        ));
        let long = format!(
            "GET / HTTP/1.1\r\nhost: gw\r\nx-pad: {}\r\n\r\n",
            "a".repeat(9000)
        );
        assert_eq!(
            parse(&long).unwrap_err(),
            RequestError::TooLarge { limit: 8192 }
        );
        // Refused before the head ends, once it is past the limit.
        assert_eq!(
            parse(&long[..8500]).unwrap_err(),
            RequestError::TooLarge { limit: 8192 }
        );
        // 99 fields at most: the forwarded head gains a Via, and the
        // replica (hyper) allows 100.
        let many: String = (0..100).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert_eq!(
            parse(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            RequestError::TooManyFields
        );
        let most: String = (0..98).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert!(parse(&format!("GET / HTTP/1.1\r\nhost: g\r\n{most}\r\n")).is_ok());
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nbad header: x\r\n\r\n"),
            Err(RequestError::Syntax(_))
        ));
        assert!(matches!(
            parse("GET / HTTP/1.1\r\nx: a\rb\r\n\r\n"),
            Err(RequestError::Syntax(_))
        ));
    }

    #[test]
    fn the_head_is_split_off_and_the_body_left_in_the_buffer() {
        let mut buf =
            BytesMut::from(&b"POST /a HTTP/1.1\r\nhost: gw\r\ncontent-length: 2\r\n\r\nokGET"[..]);
        let head = parse_request(&mut buf, 8192).unwrap().unwrap();
        assert_eq!(head.target(), "/a");
        assert_eq!(&buf[..], b"okGET");
    }

    #[test]
    fn chunk_lines_are_lowercase_hex() {
        let line = |n| String::from_utf8(chunk_line(n, &mut [0; 18]).to_vec()).unwrap();
        assert_eq!(line(0), "0\r\n");
        assert_eq!(line(10), "a\r\n");
        assert_eq!(line(255), "ff\r\n");
        assert_eq!(line(4096), "1000\r\n");
        assert_eq!(line(usize::MAX), format!("{:x}\r\n", usize::MAX));
    }

    #[test]
    fn statuses_and_dates_are_written_as_http_1_1_says() {
        let mut out = Vec::new();
        push_status(&mut out, StatusCode::TOO_MANY_REQUESTS);
        push_date(&mut out);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 429 Too Many Requests\r\ndate: "));
        let date = text.lines().nth(1).unwrap().trim_start_matches("date: ");
        // IMF-fixdate (RFC 9110 §5.6.7), e.g. "Sun, 06 Nov 1994 08:49:37 GMT".
        assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
        assert_eq!(date.len(), 29);
    }
}
