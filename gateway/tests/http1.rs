//! The traffic listener's HTTP/1.1, over raw sockets: what RFC 9110 and
//! RFC 9112 ask of a server and an intermediary, checked byte by byte on
//! the wire (pipelining, `100 Continue`, chunked request bodies, HTTP/1.0
//! keep-alive, absolute-form targets, request-smuggling framings, HEAD,
//! `Date`, hop-by-hop fields).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A response read off the wire.
#[derive(Debug)]
struct Wire {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Wire {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// Reads one response (framed by Content-Length, chunked, or the close)
/// from `s`, keeping what follows it in `buf`. `head_request`: no body.
async fn read_response(s: &mut TcpStream, buf: &mut BytesMut, head_request: bool) -> Wire {
    let fill = async |s: &mut TcpStream, buf: &mut BytesMut| -> bool {
        tokio::time::timeout(Duration::from_secs(10), s.read_buf(buf))
            .await
            .expect("the gateway answers within 10 s")
            .map(|n| n > 0)
            .unwrap_or(false)
    };
    let (len, status, headers) = loop {
        let mut hs = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut hs);
        if let httparse::Status::Complete(len) = r.parse(buf).unwrap() {
            let headers: Vec<(String, String)> = r
                .headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8_lossy(h.value).into_owned(),
                    )
                })
                .collect();
            break (len, r.code.unwrap(), headers);
        }
        assert!(fill(s, buf).await, "the connection closed before a head");
    };
    buf.advance(len);
    let mut wire = Wire {
        status,
        headers,
        body: Vec::new(),
    };
    if head_request || status == 100 || status == 204 || status == 304 {
        return wire;
    }
    if let Some(n) = wire.header("content-length") {
        let n: usize = n.parse().unwrap();
        while buf.len() < n {
            assert!(fill(s, buf).await, "the body was cut short");
        }
        wire.body = buf.split_to(n).to_vec();
    } else if wire.header("transfer-encoding") == Some("chunked") {
        loop {
            let line_end = loop {
                if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                    break i;
                }
                assert!(fill(s, buf).await, "a chunk line was cut short");
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&buf[..line_end]).unwrap(), 16).unwrap();
            while buf.len() < line_end + 2 + size + 2 {
                assert!(fill(s, buf).await, "a chunk was cut short");
            }
            buf.advance(line_end + 2);
            wire.body.extend_from_slice(&buf[..size]);
            buf.advance(size + 2);
            if size == 0 {
                break;
            }
        }
    } else {
        while fill(s, buf).await {}
        wire.body = buf.split().to_vec();
    }
    wire
}

/// The connection's end: an end of stream (not a reset) within 5 s.
async fn closes(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut b)).await,
        Ok(Ok(0))
    )
}

async fn setup() -> (Gated, gpuscale_gateway::Running) {
    let up = gated("h1", true).await;
    let gw = gateway(spec(vec![model("m", &[up.addr], 8)])).await;
    (up, gw)
}

fn post(body: &str, extra: &str) -> String {
    format!(
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n{extra}content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

const BODY: &str = r#"{"model":"m","prompt":"hi"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (up, gw) = setup().await;
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    let three = format!(
        "{}{}GET /v1/models HTTP/1.1\r\nhost: localhost\r\n\r\n",
        post(BODY, ""),
        post(r#"{"model":"m","prompt":"a longer one"}"#, "")
    );
    s.write_all(three.as_bytes()).await.unwrap();
    let mut buf = BytesMut::new();
    let a = read_response(&mut s, &mut buf, false).await;
    let b = read_response(&mut s, &mut buf, false).await;
    let c = read_response(&mut s, &mut buf, false).await;
    assert_eq!((a.status, b.status, c.status), (200, 200, 200));
    assert_eq!(a.json()["body_len"], BODY.len());
    assert_eq!(
        b.json()["body_len"],
        r#"{"model":"m","prompt":"a longer one"}"#.len()
    );
    assert_eq!(c.json()["data"][0]["id"], "m");
    assert_eq!(up.received.load(Ordering::SeqCst), 2);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let (_up, gw) = setup().await;
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    let head = post("", "expect: 100-continue\r\n").replace(
        "content-length: 0",
        &format!("content-length: {}", BODY.len()),
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = BytesMut::new();
    // RFC 9110 §10.1.1: the interim response, then the body goes.
    let interim = read_response(&mut s, &mut buf, false).await;
    assert_eq!(interim.status, 100);
    s.write_all(BODY.as_bytes()).await.unwrap();
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], BODY.len());

    // Too large by its length: refused at once, without a 100 and
    // without waiting for the body.
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    let head = "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\nexpect: 100-continue\r\ncontent-length: 999999999\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = BytesMut::new();
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.header("connection"), Some("close"));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_request_body_is_decoded_and_forwarded_with_its_length() {
    let (_up, gw) = setup().await;
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    let (a, b) = BODY.split_at(10);
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x};ext=1\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\nx-trailer: 1\r\n\r\n",
        a.len(),
        b.len()
    );
    // In pieces, split inside the framing.
    for piece in req.as_bytes().chunks(7) {
        s.write_all(piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut buf = BytesMut::new();
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], BODY.len());
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_framings_are_refused_and_the_connection_closed() {
    // RFC 9112 §6.1, §6.3: both Transfer-Encoding and Content-Length; a
    // last coding other than chunked; differing lengths; two Hosts.
    let (up, gw) = setup().await;
    for bad in [
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked\r\ncontent-length: 4\r\n\r\n0\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: chunked, identity\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nhost: a\r\nhost: b\r\ncontent-length: 0\r\n\r\n",
        "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\nbad name: 1\r\n\r\n",
    ] {
        let mut s = TcpStream::connect(gw.traffic).await.unwrap();
        s.write_all(bad.as_bytes()).await.unwrap();
        let mut buf = BytesMut::new();
        let r = read_response(&mut s, &mut buf, false).await;
        assert_eq!(r.status, 400, "{bad:?}");
        assert_eq!(r.header("connection"), Some("close"), "{bad:?}");
        assert_eq!(r.json()["error"]["code"], 400);
        assert!(closes(&mut s).await, "{bad:?}: the connection must close");
    }
    assert_eq!(up.received.load(Ordering::SeqCst), 0);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_1_0_keeps_the_connection_only_when_asked() {
    let (_up, gw) = setup().await;
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    let req = post(BODY, "").replace("HTTP/1.1", "HTTP/1.0");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = BytesMut::new();
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("connection"), Some("close"));
    assert!(closes(&mut s).await);

    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    let req = post(BODY, "connection: keep-alive\r\n").replace("HTTP/1.1", "HTTP/1.0");
    let mut buf = BytesMut::new();
    for _ in 0..2 {
        s.write_all(req.as_bytes()).await.unwrap();
        let r = read_response(&mut s, &mut buf, false).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.header("connection"), Some("keep-alive"));
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_close_an_absolute_target_and_head_are_served_as_http_says() {
    let (_up, gw) = setup().await;
    // Absolute form (RFC 9112 §3.2.2): routed by its path.
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    s.write_all(
        post(BODY, "connection: close\r\n")
            .replace("POST /v1/", "POST http://gw.example/v1/")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = BytesMut::new();
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["path"], "/v1/completions");
    // Asked to close: says so, and closes.
    assert_eq!(r.header("connection"), Some("close"));
    assert!(closes(&mut s).await);
    // Every answer carries Date (RFC 9110 §6.6.1), the relayed one the
    // replica's.
    assert!(httpdate::parse_http_date(r.header("date").unwrap()).is_ok());

    // HEAD (RFC 9110 §9.3.2): GET's head, with GET's length, and no body.
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    s.write_all(
        b"HEAD /v1/models HTTP/1.1\r\nhost: localhost\r\n\r\nGET /v1/models HTTP/1.1\r\nhost: localhost\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = BytesMut::new();
    let head = read_response(&mut s, &mut buf, true).await;
    assert_eq!(head.status, 200);
    assert!(httpdate::parse_http_date(head.header("date").unwrap()).is_ok());
    // The next response starts right after the head: no body was sent.
    let get = read_response(&mut s, &mut buf, false).await;
    assert_eq!(get.status, 200);
    assert_eq!(get.json()["object"], "list");
    assert_eq!(
        head.header("content-length").unwrap(),
        get.body.len().to_string()
    );
    // A 405 names the methods the path takes (RFC 9110 §15.5.6).
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    s.write_all(b"DELETE /v1/models HTTP/1.1\r\nhost: localhost\r\n\r\nGET /v1/completions HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = BytesMut::new();
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_host_and_unsupported_codings_are_refused() {
    let (up, gw) = setup().await;
    // RFC 9112 §3.2: an HTTP/1.1 request without Host is a 400; §6.1: a
    // transfer coding the server does not know, a 501.
    for (raw, status) in [
        (post(BODY, "").replace("host: localhost\r\n", ""), 400),
        (
            "POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n"
                .to_string(),
            501,
        ),
    ] {
        let mut s = TcpStream::connect(gw.traffic).await.unwrap();
        s.write_all(raw.as_bytes()).await.unwrap();
        let mut buf = BytesMut::new();
        let r = read_response(&mut s, &mut buf, false).await;
        assert_eq!(r.status, status, "{raw:?}");
        assert!(closes(&mut s).await);
    }
    // HTTP/1.0 needs no Host.
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    let req = post(BODY, "")
        .replace("HTTP/1.1", "HTTP/1.0")
        .replace("host: localhost\r\n", "");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = BytesMut::new();
    assert_eq!(read_response(&mut s, &mut buf, false).await.status, 200);
    assert_eq!(up.received.load(Ordering::SeqCst), 1);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_that_breaks_before_its_first_byte_is_a_502() {
    // The replica answers with a head and a chunk line no decoder takes.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let replica = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nfffffffffffffffffff\r\n")
                    .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            });
        }
    });
    let mut sp = spec(vec![model("m", &[replica], 8)]);
    sp.upstream.eject_after_failures = 100;
    let gw = gateway(sp).await;
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    s.write_all(post(BODY, "").as_bytes()).await.unwrap();
    let mut buf = BytesMut::new();
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("connection"), Some("close"));
    gw.shutdown().await;
}

/// A replica that records the request head it receives and answers with
/// hop-by-hop fields of its own and a chunked body.
async fn recording_replica() -> (SocketAddr, tokio::sync::mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = BytesMut::new();
                loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
                        let len: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length: "))
                            .map_or(0, |n| n.trim().parse().unwrap());
                        while buf.len() < end + 4 + len {
                            if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                                return;
                            }
                        }
                        buf.advance(end + 4 + len);
                        let _ = tx.send(head).await;
                        let answer = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\
                                      Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\n\
                                      Keep-Alive: timeout=5\r\nX-Request-Id: r1\r\n\
                                      Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
                        if s.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    if s.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                        return;
                    }
                }
            });
        }
    });
    (addr, rx)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_fields_stop_at_the_gateway_both_ways() {
    // RFC 9110 §7.6.1.
    let (replica, mut heads) = recording_replica().await;
    let gw = gateway(spec(vec![model("m", &[replica], 8)])).await;
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    let req = post(
        BODY,
        "Connection: keep-alive, X-Client-Hop\r\nX-Client-Hop: 1\r\nKeep-Alive: timeout=9\r\n\
         TE: trailers\r\nProxy-Authorization: Basic eA==\r\nX-End-To-End: kept\r\n",
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = BytesMut::new();
    let r = read_response(&mut s, &mut buf, false).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello world");
    assert_eq!(r.header("x-request-id"), Some("r1"));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    for hop in ["x-hop", "keep-alive"] {
        assert_eq!(r.header(hop), None, "{hop} must not reach the client");
    }
    // The client is HTTP/1.1 and the length was not given: chunked.
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));

    let forwarded = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(forwarded.starts_with("post /v1/completions http/1.1\r\n"));
    assert!(forwarded.contains(&format!("host: {replica}\r\n")));
    assert!(forwarded.contains("x-end-to-end: kept\r\n"));
    assert!(forwarded.contains(&format!("content-length: {}\r\n", BODY.len())));
    for hop in [
        "x-client-hop",
        "keep-alive:",
        "te:",
        "proxy-authorization",
        "connection:",
        "host: localhost",
    ] {
        assert!(
            !forwarded.contains(hop),
            "{hop} must not reach the replica: {forwarded}"
        );
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_request_behind_a_waiting_one_does_not_cancel_it() {
    // The first request waits for a replica slot; the second arrives on the
    // same connection meanwhile. The gateway keeps it for later and
    // answers both, in order.
    let up = gated("slow", false).await;
    let gw = gateway(spec(vec![model("m", &[up.addr], 1)])).await;
    let mut s = TcpStream::connect(gw.traffic).await.unwrap();
    s.write_all(post(BODY, "").as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(post(BODY, "").as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    up.gate.add_permits(2);
    let mut buf = BytesMut::new();
    assert_eq!(read_response(&mut s, &mut buf, false).await.status, 200);
    assert_eq!(read_response(&mut s, &mut buf, false).await.status, 200);
    assert_eq!(up.received.load(Ordering::SeqCst), 2);
    gw.shutdown().await;
}
