//! HTTP/1.1 on the replica side, as pure functions over buffers: the
//! request head the gateway writes, the response head it reads (framing
//! per RFC 9112 §6.3, hop-by-hop headers left out per RFC 9110 §7.6.1),
//! and a chunked-body decoder. [`crate::upstream`] drives them over its
//! pooled sockets; nothing here does I/O.
//!
//! Heads are parsed by `httparse` (hyper's parser); header values are
//! slices of the read buffer, not copies.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};

/// Response heads larger than this are refused.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Response heads with more header lines than this are refused.
pub const MAX_HEADERS: usize = 100;
/// Chunk-size lines and trailers larger than this are refused.
const MAX_CHUNK_LINE_BYTES: usize = 4 * 1024;
const MAX_TRAILER_BYTES: usize = 16 * 1024;
/// Chunk extensions over a whole body larger than this are refused (as
/// hyper does).
const MAX_EXTENSION_BYTES: usize = 16 * 1024;

/// What is wrong with a replica's response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum H1Error {
    /// The head does not parse.
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    /// The head is larger than [`MAX_HEAD_BYTES`].
    #[error("response head larger than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
    /// The status is not a valid code.
    #[error("invalid response status {0}")]
    Status(u16),
    /// A header name or value that HTTP does not allow.
    #[error("invalid response header `{0}`")]
    Header(String),
    /// `Content-Length` unparsable, or several that differ.
    #[error("invalid Content-Length")]
    ContentLength,
    /// A protocol switch (`101`), which the gateway does not proxy.
    #[error("the replica switched protocols (101), which the gateway does not proxy")]
    Upgrade,
    /// A transfer coding other than chunked, which the gateway would
    /// relay unlabelled.
    #[error("the replica used the transfer coding `{0}`, which the gateway does not relay")]
    Coding(String),
    /// The chunked body's framing is broken.
    #[error("malformed chunked body: {0}")]
    Chunk(&'static str),
}

/// Hop-by-hop headers, never forwarded (RFC 9110 §7.6.1).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TRANSFER_ENCODING
        || name == header::TE
        || name == header::TRAILER
        || name == header::UPGRADE
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || name.as_str() == "keep-alive"
}

/// The header names a `Connection` header lists (beyond `close` and
/// `keep-alive`): hop-by-hop too.
fn connection_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<HeaderName> {
    values
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.eq_ignore_ascii_case(b"close") && !t.eq_ignore_ascii_case(b"keep-alive"))
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect()
}

/// Appends the request head for `method target` to `out`: `Host` set to
/// `host`, the client's end-to-end headers (not its `Host`,
/// `Content-Length` or `Expect`: the body is sent whole, with its length),
/// and `Content-Length: body_len` when given.
pub fn encode_request(
    out: &mut Vec<u8>,
    method: &Method,
    target: &str,
    host: &HeaderValue,
    headers: &HeaderMap,
    body_len: Option<usize>,
) {
    let named = if headers.contains_key(header::CONNECTION) {
        connection_named(
            headers
                .get_all(header::CONNECTION)
                .iter()
                .map(HeaderValue::as_bytes),
        )
    } else {
        Vec::new()
    };
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(host.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::EXPECT
            || is_hop_by_hop(name)
            || named.contains(name)
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(n) = body_len {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(itoa(n, &mut [0u8; 20]));
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

pub(crate) fn itoa(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

/// How a response body ends (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (`HEAD`, `204`, `304`, or `Content-Length: 0`).
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the replica closes the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    /// Status code.
    pub status: StatusCode,
    /// End-to-end headers (hop-by-hop ones left out).
    pub headers: HeaderMap,
    /// How the body ends.
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
}

/// Where a header's name and value lie in the head's bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Field {
    name: (u32, u32),
    value: (u32, u32),
}

impl Field {
    /// The name's bytes in `head`.
    pub(crate) fn name<'a>(&self, head: &'a [u8]) -> &'a [u8] {
        &head[self.name.0 as usize..(self.name.0 + self.name.1) as usize]
    }

    /// The value's bytes in `head`.
    pub(crate) fn value<'a>(&self, head: &'a [u8]) -> &'a [u8] {
        &head[self.value.0 as usize..(self.value.0 + self.value.1) as usize]
    }
}

/// The fields httparse found, as offsets into `base`.
pub(crate) fn fields_of(base: &[u8], headers: &[httparse::Header<'_>]) -> Vec<Field> {
    let start = base.as_ptr() as usize;
    headers
        .iter()
        .map(|h| Field {
            name: (
                (h.name.as_ptr() as usize - start) as u32,
                h.name.len() as u32,
            ),
            value: (
                (h.value.as_ptr() as usize - start) as u32,
                h.value.len() as u32,
            ),
        })
        .collect()
}

/// Hop-by-hop header names, never forwarded (RFC 9110 §7.6.1), as bytes.
pub(crate) fn is_hop_by_hop_name(name: &[u8]) -> bool {
    [
        &b"connection"[..],
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"keep-alive",
        // Not in RFC 9110, but sent by old clients as Connection's twin
        // and hop-by-hop to every proxy that knows it.
        b"proxy-connection",
    ]
    .iter()
    .any(|h| h.eq_ignore_ascii_case(name))
}

/// The tokens of `Connection` values other than `close` and `keep-alive`:
/// names of more hop-by-hop fields.
pub(crate) fn connection_tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| {
            !t.is_empty()
                && !t.eq_ignore_ascii_case(b"close")
                && !t.eq_ignore_ascii_case(b"keep-alive")
        })
}

/// A `Content-Length` value: digits, or a list of equal ones.
pub(crate) fn content_length(raw: &[u8], length: &mut Option<u64>) -> Result<(), H1Error> {
    for part in raw.split(|&b| b == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return Err(H1Error::ContentLength);
        }
        let n = part.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
        if length.is_some_and(|l| l != n) {
            return Err(H1Error::ContentLength);
        }
        *length = Some(n);
    }
    Ok(())
}

/// A response head kept as the bytes the replica sent: its end-to-end
/// fields are offsets into them, ready to be relayed without building a
/// `HeaderMap` ([`RawResponse::into_head`] builds one).
#[derive(Debug)]
pub struct RawResponse {
    /// Status code.
    pub status: StatusCode,
    head: Bytes,
    /// End-to-end fields (hop-by-hop ones and those `Connection` names
    /// left out; `Content-Length` kept unless `Transfer-Encoding` came
    /// too).
    fields: Vec<Field>,
    /// How the body ends.
    pub framing: Framing,
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
}

impl RawResponse {
    /// The end-to-end fields, in order, as sent.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.fields
            .iter()
            .map(|f| (f.name(&self.head), f.value(&self.head)))
    }

    /// The first value of the field `name` (case-insensitive).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// The same head with its fields in a `HeaderMap`.
    pub fn into_head(self) -> Result<Head, H1Error> {
        let mut headers = HeaderMap::with_capacity(self.fields.len());
        for f in &self.fields {
            let raw_name = f.name(&self.head);
            let name = HeaderName::from_bytes(raw_name)
                .map_err(|_| H1Error::Header(String::from_utf8_lossy(raw_name).into_owned()))?;
            let (v, vl) = f.value;
            let value =
                HeaderValue::from_maybe_shared(self.head.slice(v as usize..(v + vl) as usize))
                    .map_err(|_| H1Error::Header(name.to_string()))?;
            headers.append(name, value);
        }
        Ok(Head {
            status: self.status,
            headers,
            framing: self.framing,
            keep_alive: self.keep_alive,
        })
    }
}

/// Parses a response head off the front of `buf`, skipping interim `1xx`
/// responses. `Ok(None)`: incomplete, read more (what was consumed was
/// only interim responses). `head_request`: the request was `HEAD` (no
/// body whatever the headers say).
pub fn parse_response(buf: &mut BytesMut, head_request: bool) -> Result<Option<Head>, H1Error> {
    parse_raw_response(buf, head_request)?
        .map(RawResponse::into_head)
        .transpose()
}

/// [`parse_response`], keeping the head as bytes.
pub fn parse_raw_response(
    buf: &mut BytesMut,
    head_request: bool,
) -> Result<Option<RawResponse>, H1Error> {
    loop {
        let (len, code, version, fields) = {
            let mut headers =
                [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
            let mut resp = httparse::Response::new(&mut []);
            let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
                &mut resp,
                buf,
                &mut headers,
            );
            let len = match parsed {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => {
                    if buf.len() > MAX_HEAD_BYTES {
                        return Err(H1Error::HeadTooLarge);
                    }
                    return Ok(None);
                }
                Err(e) => return Err(H1Error::Head(e)),
            };
            if len > MAX_HEAD_BYTES {
                return Err(H1Error::HeadTooLarge);
            }
            let code = resp.code.unwrap_or(0);
            let fields = if (100..200).contains(&code) {
                Vec::new()
            } else {
                fields_of(buf, resp.headers)
            };
            (len, code, resp.version.unwrap_or(1), fields)
        };
        if (100..200).contains(&code) {
            if code == 101 {
                return Err(H1Error::Upgrade);
            }
            buf.advance(len);
            continue;
        }
        let status = StatusCode::from_u16(code).map_err(|_| H1Error::Status(code))?;
        let head = buf.split_to(len).freeze();
        return build(head, fields, status, version, head_request).map(Some);
    }
}

fn build(
    head: Bytes,
    mut fields: Vec<Field>,
    status: StatusCode,
    version: u8,
    head_request: bool,
) -> Result<RawResponse, H1Error> {
    let mut length: Option<u64> = None;
    let mut chunked = None;
    let mut close = version == 0;
    let mut named = false;
    for f in &fields {
        let (name, raw) = (f.name(&head), f.value(&head));
        if name.eq_ignore_ascii_case(b"content-length") {
            content_length(raw, &mut length)?;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Only chunked alone: any other coding would reach the client
            // unlabelled once the gateway re-frames the body.
            if chunked.is_some() || !raw.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err(H1Error::Coding(String::from_utf8_lossy(raw).into_owned()));
            }
            chunked = Some(true);
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in raw.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    close &= version != 0;
                }
            }
            named |= connection_tokens(raw).next().is_some();
        }
    }
    let no_body =
        head_request || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
    // Transfer-Encoding overrides Content-Length (RFC 9112 §6.3).
    let drop_length = !no_body && chunked.is_some();
    let named: Vec<&[u8]> = if named {
        fields
            .iter()
            .filter(|f| f.name(&head).eq_ignore_ascii_case(b"connection"))
            .flat_map(|f| connection_tokens(f.value(&head)))
            .collect()
    } else {
        Vec::new()
    };
    fields.retain(|f| {
        let name = f.name(&head);
        !(is_hop_by_hop_name(name)
            || (drop_length && name.eq_ignore_ascii_case(b"content-length"))
            || named.iter().any(|n| n.eq_ignore_ascii_case(name)))
    });
    // A 204 or 304 that announces a body may still send one: that
    // connection cannot carry another response safely.
    let announced = chunked.is_some() || length.is_some_and(|n| n > 0);
    if no_body && !head_request && announced {
        close = true;
    }
    let framing = if no_body {
        Framing::Empty
    } else if chunked.is_some() {
        Framing::Chunked
    } else {
        match length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::Close,
        }
    };
    Ok(RawResponse {
        status,
        head,
        fields,
        framing,
        keep_alive: !close && framing != Framing::Close,
    })
}

/// What [`Chunked::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The buffer holds no more of the body: read more.
    NeedMore,
    /// The body ended (its trailers, if any, consumed and dropped).
    End,
}

/// A chunked-body decoder (RFC 9112 §7.1).
#[derive(Debug, Default)]
pub struct Chunked {
    state: ChunkState,
    trailer_bytes: usize,
    extension_bytes: usize,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataEnd,
    Trailers,
    Done,
}

impl Chunked {
    /// The next piece of body from the front of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, H1Error> {
        loop {
            match self.state {
                ChunkState::Size => match httparse::parse_chunk_size(buf) {
                    Ok(httparse::Status::Complete((used, size))) => {
                        // RFC 9112 §7.1: `1*HEXDIG [ chunk-ext ] CRLF`.
                        // httparse lets through an empty size and bare
                        // line feeds or control bytes in an extension,
                        // which another parser on the path could read
                        // differently.
                        let line = &buf[..used];
                        if !line[0].is_ascii_hexdigit()
                            || !line.ends_with(b"\r\n")
                            || line[..used - 2]
                                .iter()
                                .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
                        {
                            return Err(H1Error::Chunk("invalid chunk size line"));
                        }
                        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
                        self.extension_bytes += used - 2 - digits;
                        if self.extension_bytes > MAX_EXTENSION_BYTES {
                            return Err(H1Error::Chunk("chunk extensions too large"));
                        }
                        buf.advance(used);
                        self.state = if size == 0 {
                            ChunkState::Trailers
                        } else {
                            ChunkState::Data(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if buf.len() <= MAX_CHUNK_LINE_BYTES => {
                        return Ok(Decoded::NeedMore);
                    }
                    _ => return Err(H1Error::Chunk("invalid chunk size line")),
                },
                ChunkState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let n = left.min(buf.len() as u64);
                    let data = buf.split_to(n as usize).freeze();
                    self.state = if n == left {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data(left - n)
                    };
                    return Ok(Decoded::Data(data));
                }
                ChunkState::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(H1Error::Chunk("chunk data not followed by CRLF"));
                    }
                    buf.advance(2);
                    self.state = ChunkState::Size;
                }
                ChunkState::Trailers => match buf.windows(2).position(|w| w == b"\r\n") {
                    Some(0) => {
                        buf.advance(2);
                        self.state = ChunkState::Done;
                    }
                    Some(i) => {
                        self.trailer_bytes += i + 2;
                        if self.trailer_bytes > MAX_TRAILER_BYTES {
                            return Err(H1Error::Chunk("trailers too large"));
                        }
                        buf.advance(i + 2);
                    }
                    None if self.trailer_bytes + buf.len() > MAX_TRAILER_BYTES => {
                        return Err(H1Error::Chunk("trailers too large"));
                    }
                    None => return Ok(Decoded::NeedMore),
                },
                ChunkState::Done => return Ok(Decoded::End),
            }
        }
    }
}

/// The size of a request head as HTTP/1.1 writes it canonically
/// (`METHOD SP target SP HTTP/1.1 CRLF`, then `name: value CRLF` per
/// field, then `CRLF`): what `limits.maxHeaderBytes` is held to, to the
/// byte, whatever hyper's read buffer let through.
pub fn request_head_len(method: &Method, uri: &http::Uri, headers: &HeaderMap) -> usize {
    let target = match (uri.scheme_str(), uri.authority()) {
        (Some(scheme), Some(a)) => scheme.len() + 3 + a.as_str().len(),
        (None, Some(a)) => a.as_str().len(),
        _ => 0,
    } + uri.path_and_query().map_or(0, |p| p.as_str().len());
    let line = method.as_str().len() + 1 + target + 1 + "HTTP/1.1".len() + 2;
    let fields: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + 2 + v.len() + 2)
        .sum();
    line + fields + 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    fn encode(h: &HeaderMap, body: Option<usize>) -> String {
        let mut out = Vec::new();
        let host = HeaderValue::from_static("10.0.0.7:8000");
        encode_request(
            &mut out,
            &Method::POST,
            "/v1/completions?x=1",
            &host,
            h,
            body,
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_request_head_carries_host_length_and_end_to_end_headers_only() {
        let h = headers(&[
            ("host", "gateway:8080"),
            ("content-length", "999"),
            ("connection", "close, x-trace"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("expect", "100-continue"),
            ("x-trace", "1"),
            ("content-type", "application/json"),
            ("authorization", "Bearer t"),
        ]);
        assert_eq!(
            encode(&h, Some(42)),
            "POST /v1/completions?x=1 HTTP/1.1\r\nhost: 10.0.0.7:8000\r\n\
             content-type: application/json\r\nauthorization: Bearer t\r\n\
             content-length: 42\r\n\r\n"
        );
    }

    #[test]
    fn a_request_without_a_body_has_no_length() {
        assert_eq!(
            encode(&headers(&[("accept", "*/*")]), None),
            "POST /v1/completions?x=1 HTTP/1.1\r\nhost: 10.0.0.7:8000\r\naccept: */*\r\n\r\n"
        );
        assert!(encode(&HeaderMap::new(), Some(0)).ends_with("content-length: 0\r\n\r\n"));
    }

    fn parse(raw: &str, head_request: bool) -> (Result<Option<Head>, H1Error>, BytesMut) {
        let mut buf = BytesMut::from(raw.as_bytes());
        let r = parse_response(&mut buf, head_request);
        (r, buf)
    }

    #[test]
    fn a_head_with_a_length_leaves_the_body_in_the_buffer() {
        let (head, rest) = parse(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\ncontent-length: 2\r\n\r\nok",
            false,
        );
        let head = head.unwrap().unwrap();
        assert_eq!(head.status, StatusCode::OK);
        assert_eq!(head.framing, Framing::Length(2));
        assert!(head.keep_alive);
        assert_eq!(head.headers["content-type"], "application/json");
        assert_eq!(head.headers["content-length"], "2");
        assert_eq!(&rest[..], b"ok");
    }

    #[test]
    fn hop_by_hop_response_headers_and_those_connection_names_are_left_out() {
        let (head, _) = parse(
            "HTTP/1.1 200 OK\r\nconnection: keep-alive, x-hop\r\nkeep-alive: timeout=5\r\n\
             transfer-encoding: chunked\r\nx-hop: 1\r\ntrailer: x-sum\r\nupgrade: h2c\r\n\
             x-request-id: 7\r\ncontent-type: text/event-stream\r\n\r\n",
            false,
        );
        let head = head.unwrap().unwrap();
        let mut left: Vec<&str> = head.headers.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-request-id"]);
        assert_eq!(head.framing, Framing::Chunked);
        assert!(head.keep_alive);
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let framing = |raw: &str, head_request| {
            let (h, _) = parse(raw, head_request);
            let h = h.unwrap().unwrap();
            (h.framing, h.keep_alive)
        };
        // Transfer-Encoding wins over Content-Length.
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
                false
            ),
            (Framing::Chunked, true)
        );
        // Any other coding would reach the client unlabelled once the
        // body is re-framed: refused (a 502), not relayed.
        for coding in [
            "gzip",
            "gzip, chunked",
            "chunked\r\ntransfer-encoding: chunked",
        ] {
            let (h, _) = parse(
                &format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {coding}\r\n\r\n"),
                false,
            );
            assert!(matches!(h, Err(H1Error::Coding(_))), "{coding}");
        }
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\n\r\n", false),
            (Framing::Close, false)
        );
        // A 204 that announces a body may send one after all: no body
        // is read, and the connection is not used again.
        assert_eq!(
            framing(
                "HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n",
                false
            ),
            (Framing::Empty, false)
        );
        assert_eq!(
            framing("HTTP/1.1 204 No Content\r\n\r\n", false),
            (Framing::Empty, true)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", true),
            (Framing::Empty, true)
        );
        assert_eq!(
            framing("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", false),
            (Framing::Empty, true)
        );
        assert_eq!(
            framing(
                "HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\nconnection: close\r\n\r\n",
                false
            ),
            (Framing::Length(3), false)
        );
        assert_eq!(
            framing("HTTP/1.0 200 OK\r\ncontent-length: 3\r\n\r\n", false),
            (Framing::Length(3), false)
        );
        assert_eq!(
            framing(
                "HTTP/1.0 200 OK\r\ncontent-length: 3\r\nconnection: keep-alive\r\n\r\n",
                false
            ),
            (Framing::Length(3), true)
        );
    }

    #[test]
    fn bad_heads_are_errors_and_partial_ones_ask_for_more() {
        assert!(matches!(
            parse("HTTP/1.1 200 OK\r\ncontent-le", false).0,
            Ok(None)
        ));
        assert_eq!(
            parse("HTTP/1.1 200 OK\r\ncontent-length: 1, 2\r\n\r\n", false)
                .0
                .unwrap_err(),
            H1Error::ContentLength
        );
        assert_eq!(
            parse("HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", false)
                .0
                .unwrap_err(),
            H1Error::ContentLength
        );
        assert_eq!(
            parse("HTTP/1.1 101 Switching Protocols\r\n\r\n", false)
                .0
                .unwrap_err(),
            H1Error::Upgrade
        );
        assert!(matches!(
            parse("HTTQ/1.1 200 OK\r\n\r\n", false).0,
            Err(H1Error::Head(_))
        ));
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD_BYTES));
        assert_eq!(parse(&huge, false).0.unwrap_err(), H1Error::HeadTooLarge);
    }

    #[test]
    fn interim_responses_are_skipped() {
        let (head, rest) = parse(
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n\
             HTTP/1.1 201 Created\r\ncontent-length: 1\r\n\r\nx",
            false,
        );
        let head = head.unwrap().unwrap();
        assert_eq!(head.status, StatusCode::CREATED);
        assert!(!head.headers.contains_key("link"));
        assert_eq!(&rest[..], b"x");
    }

    /// Decodes `wire` fed in pieces split at `cuts`.
    fn dechunk(wire: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, Vec<u8>), H1Error> {
        let mut d = Chunked::default();
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut fed = 0;
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
        points.push(wire.len());
        points.sort_unstable();
        for p in points {
            buf.extend_from_slice(&wire[fed..p.max(fed)]);
            fed = p.max(fed);
            loop {
                match d.decode(&mut buf)? {
                    Decoded::Data(b) => body.extend_from_slice(&b),
                    Decoded::NeedMore => break,
                    Decoded::End => return Ok((body, buf.to_vec())),
                }
            }
        }
        Err(H1Error::Chunk("unfinished"))
    }

    #[test]
    fn chunked_bodies_decode_with_extensions_and_trailers() {
        let wire = b"5;name=v\r\nhello\r\n1\r\n \r\nA\r\n0123456789\r\n0\r\nx-sum: 1\r\n\r\nNEXT";
        let (body, rest) = dechunk(wire, &[]).unwrap();
        assert_eq!(body, b"hello 0123456789");
        assert_eq!(rest, b"NEXT");
        assert!(dechunk(b"5\r\nhelloXX0\r\n\r\n", &[]).is_err());
        assert!(dechunk(b"zz\r\n", &[]).is_err());
        // RFC 9112 §7.1: at least one hex digit, and no bare LF or control
        // byte in an extension (each read differently by some parser).
        assert!(dechunk(b"5\r\nhello\r\n\r\n\r\n", &[]).is_err());
        assert!(dechunk(b"2;\nXX\r\nab\r\n0\r\n\r\n", &[]).is_err());
        assert!(dechunk(b"2;a\x00b\r\nab\r\n0\r\n\r\n", &[]).is_err());
        // Extensions add up over the body, to 16 KiB.
        let ext = format!("1;{}\r\nx\r\n", "e".repeat(3000));
        let wire = format!("{}0\r\n\r\n", ext.repeat(6));
        assert!(dechunk(wire.as_bytes(), &[]).is_err());
        let wire = format!("{}0\r\n\r\n", ext.repeat(5));
        assert_eq!(dechunk(wire.as_bytes(), &[]).unwrap().0, b"xxxxx");
    }

    proptest! {
        #[test]
        fn chunked_decoding_does_not_depend_on_how_reads_split_the_wire(
            chunks in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..40), 0..8),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let mut wire = Vec::new();
            for c in &chunks {
                wire.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                wire.extend_from_slice(c);
                wire.extend_from_slice(b"\r\n");
            }
            wire.extend_from_slice(b"0\r\n\r\n");
            let (body, rest) = dechunk(&wire, &cuts).unwrap();
            prop_assert_eq!(body, chunks.concat());
            prop_assert!(rest.is_empty());
        }
    }

    #[test]
    fn request_head_len_counts_the_canonical_head() {
        let mut headers = HeaderMap::new();
        headers.insert("host", HeaderValue::from_static("a"));
        headers.insert("x-long", HeaderValue::from_static("0123456789"));
        let uri: http::Uri = "/v1/x?q=1".parse().unwrap();
        let written = "POST /v1/x?q=1 HTTP/1.1\r\nhost: a\r\nx-long: 0123456789\r\n\r\n";
        assert_eq!(
            request_head_len(&Method::POST, &uri, &headers),
            written.len()
        );
        let abs: http::Uri = "http://h:1/p".parse().unwrap();
        assert_eq!(
            request_head_len(&Method::GET, &abs, &HeaderMap::new()),
            "GET http://h:1/p HTTP/1.1\r\n\r\n".len()
        );
    }
}
