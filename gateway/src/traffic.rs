//! The traffic listener's connections, served by the gateway's own
//! HTTP/1.1 codec ([`h1_server`]): read a request head (within the
//! header-read timeout, which is also the keep-alive idle timeout) and its
//! body (bounded, within the body-read timeout, `100 Continue` when the
//! client waits for it), hand both to [`proxy::handle`] while watching
//! the client's socket (a client that goes away cancels its request,
//! wherever it is: queued, or waiting for the replica), then write the
//! reply: the gateway's own JSON answers, or the replica's response head
//! relayed field by field and its body passed on as it arrives (with its
//! length, or chunked; a server-sent event stream is never buffered).
//! Requests a client pipelines are served in order.
//!
//! The replica's slot is held until the body's last byte has been passed
//! on; a relay that fails (the replica stalls past the stream idle
//! timeout, breaks off, or the client stops reading past the write
//! timeout) frees it at once and closes the client's connection without
//! the body's end, so the client sees the response was cut short.
//!
//! Why not hyper's server: it builds a `HeaderMap` for every request and
//! wants one for every response, and runs its dispatcher over both
//! directions; relaying heads as bytes, as nginx does, is what brings the
//! gateway's CPU per request below nginx's (`bench/README.md`). hyper
//! still serves the admin listener.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode};
use http_body::Body as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::budget::{Budget, HEAD_ALLOWANCE, Held};
use crate::client_io::ClientIo;
use crate::drain::Drain;
use crate::h1::{Chunked, Decoded, Framing};
use crate::h1_server::{self, BodyLength, RequestHead, push_field};
use crate::proxy::{self, Local, ROUTE_HEADER, Relayed, Reply, Worker, local_error};
use crate::timer::CoarseSleep;

/// The smallest free space a read is given.
const READ_SPACE: usize = 4 * 1024;

/// The most a connection's read buffer keeps between requests (it starts
/// at 8 KiB).
const IDLE_CAPACITY: usize = 16 * 1024;

/// The answer to a request whose bytes would take the budget past
/// `limits.maxBufferedBytes` (given before the rest of them are read, so
/// the connection closes after it).
fn over_budget(budget: &Budget) -> Local {
    let mut answer = local_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "overloaded",
        &format!(
            "the gateway already holds its limit of request bytes ({} bytes, \
             limits.maxBufferedBytes); retry later",
            budget.limit()
        ),
    );
    answer.retry_after = Some(1);
    answer.close = true;
    answer
}

/// Serves one client connection until it closes, times out, fails, or
/// the drain (`closing`) finds it between requests.
pub async fn serve(stream: TcpStream, peer: SocketAddr, worker: Arc<Worker>, closing: Drain) {
    let limits = &worker.shared.settings.spec.limits;
    let io = ClientIo::new(stream, worker.timer.clone(), limits.write_timeout);
    let mut conn = Connection {
        io,
        buf: BytesMut::with_capacity(8 * 1024),
        out: Vec::with_capacity(1024),
        closing,
        worker,
        peer,
    };
    conn.run().await;
}

struct Connection {
    io: ClientIo,
    /// Read from the client and not yet used.
    buf: BytesMut,
    /// The response head being written.
    out: Vec<u8>,
    closing: Drain,
    worker: Arc<Worker>,
    peer: SocketAddr,
}

/// How reading more from the client ended, when it did not read.
enum Stop {
    /// End of stream, or a failed read.
    Closed,
    /// The deadline passed.
    Timeout,
}

impl Connection {
    async fn run(&mut self) {
        let limits = self.worker.shared.settings.spec.limits.clone();
        loop {
            let head = match self.read_head(&limits).await {
                Ok(Some(head)) => head,
                Ok(None) => return,
                Err(answer) => {
                    proxy::count_unrouted(&self.worker.shared, answer.status.as_u16());
                    self.write_local(&answer, false, false, false).await;
                    return;
                }
            };
            // The body's bytes stay counted in the budget until the
            // request has its answer (a queued request holds them).
            let (body, held) = match self.read_body(&head, &limits).await {
                Ok(read) => read,
                Err(Some(answer)) => {
                    proxy::count_unrouted(&self.worker.shared, answer.status.as_u16());
                    self.write_local(&answer, head.http10, false, false).await;
                    return;
                }
                Err(None) => return,
            };
            // Bytes this request took in the read buffer's allocation.
            let took = head.len() + body.len();
            // Only a POST's body means anything to a route; others are
            // read (to keep the connection usable) and dropped.
            let body = if head.method == Method::POST {
                body
            } else {
                Bytes::new()
            };
            let reply = {
                let handled = proxy::handle(&self.worker, self.peer, &head, body);
                let gone = client_gone(&mut self.io, &mut self.buf, limits.max_header_bytes);
                tokio::select! {
                    biased;
                    reply = handled => reply,
                    // Dropping the request cancels it: out of the queue,
                    // or its replica connection closed.
                    () = gone => return,
                }
            };
            drop(held);
            let keep_alive = head.keep_alive && !self.closing.is_closing();
            let head_request = head.method == Method::HEAD;
            let kept = match reply {
                Reply::Local(answer) => {
                    let keep_alive = keep_alive && !answer.close;
                    self.write_local(&answer, head.http10, keep_alive, head_request)
                        .await
                        && keep_alive
                }
                Reply::Relayed(relayed) => {
                    self.relay(relayed, head.http10, keep_alive, &limits).await
                }
            };
            if !kept {
                return;
            }
            // A large body or head left its buffer's allocation behind (a
            // body split off the buffer shares it, and the rest of the
            // buffer keeps it alive; `reserve` later takes it back whole):
            // given back between requests, or an idle keep-alive
            // connection would hold megabytes the budget no longer counts.
            give_back(&mut self.buf, took);
        }
    }

    /// Reads until a whole head is in the buffer. `Ok(None)`: the client
    /// closed, the header-read timeout passed, or the drain began.
    /// `Err`: the answer to give, and close (a head that does not parse,
    /// or one that outgrows the budget).
    async fn read_head(
        &mut self,
        limits: &crate::config::Limits,
    ) -> Result<Option<RequestHead>, Local> {
        let mut deadline: Option<CoarseSleep> = None;
        let mut parse = true;
        // A head past its first bytes takes the buffer it fills from the
        // budget while it arrives.
        let mut held = Held::none(&self.worker.shared.buffered);
        loop {
            if parse
                && !self.buf.is_empty()
                && let Some(head) = h1_server::parse_request(&mut self.buf, limits.max_header_bytes)
                    .map_err(|e| {
                        let mut answer =
                            local_error(e.status(), "invalid_request_error", &e.to_string());
                        answer.close = true;
                        answer
                    })?
            {
                return Ok(Some(head));
            }
            if self.closing.is_closing() {
                return Ok(None);
            }
            let sleep = deadline.get_or_insert_with(|| {
                self.worker
                    .timer
                    .sleep_until(Instant::now() + limits.header_read_timeout)
            });
            let closing = &self.closing;
            let drained = poll_fn(|_| {
                if closing.is_closing() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            });
            grow_for_head(&mut self.buf, limits.max_header_bytes);
            if self.buf.len() >= HEAD_ALLOWANCE && !held.grow_to(self.buf.capacity()) {
                return Err(over_budget(&self.worker.shared.buffered));
            }
            let before = self.buf.len();
            tokio::select! {
                biased;
                read = self.io.read_buf(&mut self.buf) => match read {
                    Ok(0) | Err(_) => return Ok(None),
                    Ok(_) => {}
                },
                () = sleep => return Ok(None),
                () = drained => return Ok(None),
            }
            // A head ends with a line feed: bytes without one cannot
            // complete it, so a head sent a few bytes at a time is not
            // parsed again from its start for every read.
            parse = self.buf[before..].contains(&b'\n') || self.buf.len() > limits.max_header_bytes;
        }
    }

    /// Reads more of the body into the buffer before `deadline`.
    async fn read_more(&mut self, deadline: &mut CoarseSleep, want: usize) -> Result<(), Stop> {
        let space = want.clamp(READ_SPACE, 64 * 1024);
        if self.buf.capacity() - self.buf.len() < space {
            self.buf.reserve(space);
        }
        tokio::select! {
            biased;
            read = self.io.read_buf(&mut self.buf) => match read {
                Ok(0) | Err(_) => Err(Stop::Closed),
                Ok(_) => Ok(()),
            },
            () = deadline => Err(Stop::Timeout),
        }
    }

    /// The whole body, and its bytes taken from the budget as they
    /// arrive (`Err(Some)` with a 503 when they would go past it: before
    /// the body is sent where the bytes held leave it no room).
    /// `Err(Some)`: the answer to give, and close; `Err(None)`: the
    /// connection failed.
    async fn read_body(
        &mut self,
        head: &RequestHead,
        limits: &crate::config::Limits,
    ) -> Result<(Bytes, Held), Option<Local>> {
        let max = limits.max_body_bytes;
        let budget = self.worker.shared.buffered.clone();
        let mut held = Held::none(&budget);
        let too_large = || {
            let mut answer = local_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                &format!("the request body is larger than {max} bytes"),
            );
            answer.close = true;
            Some(answer)
        };
        let stopped = |stop: Stop| match stop {
            Stop::Closed => None,
            Stop::Timeout => {
                let mut answer = local_error(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    "the request body did not arrive in time",
                );
                answer.close = true;
                Some(answer)
            }
        };
        let mut deadline = None;
        match head.body {
            BodyLength::None => Ok((Bytes::new(), held)),
            BodyLength::Length(n) => {
                if n > max as u64 {
                    return Err(too_large());
                }
                let n = n as usize;
                // The bytes count as they arrive, not as announced: a head
                // that announces megabytes and sends none would hold them
                // for nothing (66 such connections, 100 bytes each, took
                // the default budget and every request with a body got
                // 503). A body the bytes held already leave no room for
                // is refused before it is sent.
                if budget.used().saturating_add(n) > budget.limit()
                    || !held.grow_to(self.buf.len().min(n))
                {
                    return Err(Some(over_budget(&budget)));
                }
                if self.buf.len() < n && head.expect_continue && self.buf.is_empty() {
                    self.continue_100().await?;
                }
                while self.buf.len() < n {
                    let sleep = deadline.get_or_insert_with(|| {
                        self.worker
                            .timer
                            .sleep_until(Instant::now() + limits.body_read_timeout)
                    });
                    let want = n - self.buf.len();
                    self.read_more(sleep, want).await.map_err(stopped)?;
                    if !held.grow_to(self.buf.len().min(n)) {
                        return Err(Some(over_budget(&budget)));
                    }
                }
                Ok((self.buf.split_to(n).freeze(), held))
            }
            BodyLength::Chunked => {
                if head.expect_continue && self.buf.is_empty() {
                    self.continue_100().await?;
                }
                let mut decoder = Chunked::default();
                let mut body = BytesMut::new();
                loop {
                    match decoder.decode(&mut self.buf) {
                        Ok(Decoded::Data(data)) => {
                            if body.len() + data.len() > max {
                                return Err(too_large());
                            }
                            if !append_held(&mut body, &data, &mut held, max) {
                                return Err(Some(over_budget(&budget)));
                            }
                        }
                        Ok(Decoded::End) => return Ok((body.freeze(), held)),
                        Ok(Decoded::NeedMore) => {
                            let sleep = deadline.get_or_insert_with(|| {
                                self.worker
                                    .timer
                                    .sleep_until(Instant::now() + limits.body_read_timeout)
                            });
                            self.read_more(sleep, READ_SPACE).await.map_err(stopped)?;
                        }
                        Err(e) => {
                            let mut answer = local_error(
                                StatusCode::BAD_REQUEST,
                                "invalid_request_error",
                                &format!("the request body could not be read: {e}"),
                            );
                            answer.close = true;
                            return Err(Some(answer));
                        }
                    }
                }
            }
        }
    }

    /// `100 Continue` (RFC 9110 §10.1.1): the client waits for it before
    /// it sends the body.
    async fn continue_100(&mut self) -> Result<(), Option<Local>> {
        self.io
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .map_err(|_| None)
    }

    /// Writes one of the gateway's own answers; to a HEAD request, its
    /// head alone, with the length the body has (RFC 9110 §9.3.2).
    /// `false`: the write failed.
    async fn write_local(
        &mut self,
        answer: &Local,
        http10: bool,
        keep_alive: bool,
        head_request: bool,
    ) -> bool {
        let out = &mut self.out;
        out.clear();
        h1_server::push_status(out, answer.status);
        h1_server::push_date(out);
        push_field(out, b"content-type", b"application/json");
        if let Some(secs) = answer.retry_after {
            push_field(
                out,
                b"retry-after",
                crate::h1::itoa(secs as usize, &mut [0u8; 20]),
            );
        }
        if let Some(allow) = answer.allow {
            push_field(out, b"allow", allow.as_bytes());
        }
        if answer.via {
            push_field(out, b"via", self.worker.shared.via.as_bytes());
        }
        connection_field(out, http10, keep_alive && !answer.close);
        h1_server::push_length(out, answer.body.len() as u64);
        out.extend_from_slice(b"\r\n");
        if !head_request {
            out.extend_from_slice(&answer.body);
        }
        self.io.write_all(&self.out).await.is_ok()
    }

    /// Relays the replica's response. `true`: it was passed on whole and
    /// the connection may serve another request.
    async fn relay(
        &mut self,
        relayed: Relayed,
        http10: bool,
        mut keep_alive: bool,
        limits: &crate::config::Limits,
    ) -> bool {
        let idle = limits.stream_idle_timeout;
        let Relayed {
            head,
            mut body,
            permit,
            explain,
            streaming,
        } = relayed;
        let mut permit = Some(permit);
        let out = &mut self.out;
        out.clear();
        h1_server::push_status(out, head.status);
        let mut dated = false;
        let mut length = None;
        for (name, value) in head.fields() {
            if name.eq_ignore_ascii_case(b"content-length") {
                length = Some(value);
                continue;
            }
            dated |= name.eq_ignore_ascii_case(b"date");
            push_field(out, name, value);
        }
        if !dated {
            h1_server::push_date(out);
        }
        if let Some(v) = &explain {
            push_field(out, ROUTE_HEADER.as_str().as_bytes(), v.as_bytes());
        }
        let bodiless = head.status == StatusCode::NO_CONTENT
            || head.status == StatusCode::NOT_MODIFIED
            || head.status.is_informational();
        let chunked = match head.framing {
            Framing::Empty => {
                // A HEAD response's length, or zero.
                if let Some(v) = length
                    && !bodiless
                {
                    push_field(out, b"content-length", v);
                }
                false
            }
            Framing::Length(n) => {
                h1_server::push_length(out, n);
                false
            }
            // A length the replica did not give: chunked to an HTTP/1.1
            // client, until the close to an HTTP/1.0 one.
            Framing::Chunked | Framing::Close if http10 => {
                keep_alive = false;
                false
            }
            Framing::Chunked | Framing::Close => {
                push_field(out, b"transfer-encoding", b"chunked");
                true
            }
        };
        connection_field(out, http10, keep_alive);
        out.extend_from_slice(b"\r\n");

        let mut head_sent = false;
        let mut first = true;
        loop {
            // What the replica's connection already holds needs no wait:
            // the head goes out with it in one write.
            let polled = poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await;
            let frame = match polled {
                Poll::Ready(frame) => frame,
                Poll::Pending => {
                    if !head_sent {
                        if self.io.write_all(&self.out).await.is_err() {
                            return false;
                        }
                        head_sent = true;
                    }
                    let next = self
                        .worker
                        .timer
                        .timeout(idle, poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)));
                    let gone = client_gone(&mut self.io, &mut self.buf, limits.max_header_bytes);
                    tokio::select! {
                        biased;
                        frame = next => match frame {
                            Some(frame) => frame,
                            // The replica stalled past the idle timeout.
                            None => return false,
                        },
                        () = gone => return false,
                    }
                }
            };
            let data = match frame {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
                // Broken off: the client's connection closes without
                // the body's end. The slot is freed with the permit.
                Some(Err(e)) => {
                    tracing::debug!("relaying a response: {e}");
                    if !head_sent {
                        // Nothing reached the client yet: it gets a 502,
                        // not a connection closed without a word (and the
                        // request misses its latency and TTFT targets).
                        if let Some(p) = permit.take() {
                            p.model().missed_after_admission();
                        }
                        let mut answer = local_error(
                            StatusCode::BAD_GATEWAY,
                            "upstream_error",
                            "the replica failed",
                        );
                        answer.close = true;
                        self.write_local(&answer, http10, false, false).await;
                    }
                    return false;
                }
                None => Bytes::new(),
            };
            let ended = data.is_empty() || body.is_end_stream();
            if first && !data.is_empty() {
                first = false;
                if let Some(p) = permit.as_ref() {
                    if streaming {
                        p.record_ttft(p.admitted.elapsed().as_secs_f64());
                    } else if !ended {
                        p.answering();
                    }
                }
            }
            if ended && let Some(p) = permit.take() {
                p.record_latency(Instant::now(), !head.status.is_server_error());
            }
            let mut line = [0u8; 18];
            let mut parts: [&[u8]; 5] = [&[]; 5];
            let mut n = 0;
            if !head_sent {
                parts[n] = &self.out;
                n += 1;
            }
            if !data.is_empty() {
                if chunked {
                    parts[n] = h1_server::chunk_line(data.len(), &mut line);
                    parts[n + 1] = &data;
                    parts[n + 2] = b"\r\n";
                    n += 3;
                } else {
                    parts[n] = &data;
                    n += 1;
                }
            }
            if ended && chunked {
                parts[n] = b"0\r\n\r\n";
                n += 1;
            }
            if n > 0 && write_all_vectored(&mut self.io, &parts[..n]).await.is_err() {
                return false;
            }
            head_sent = true;
            if ended {
                // A body until the replica's close has ended the
                // connection for an HTTP/1.0 client too.
                return keep_alive;
            }
        }
    }
}

/// `connection: close` when the connection ends after this response,
/// `connection: keep-alive` to an HTTP/1.0 client whose connection stays.
fn connection_field(out: &mut Vec<u8>, http10: bool, keep_alive: bool) {
    if !keep_alive {
        push_field(out, b"connection", b"close");
    } else if http10 {
        push_field(out, b"connection", b"keep-alive");
    }
}

/// Room for the next read of a head: at least [`READ_SPACE`], but never
/// more than the head limit allows, allocated exactly once the head is
/// large (growing by doubling would let a slow client make the buffer
/// twice the limit).
fn grow_for_head(buf: &mut BytesMut, limit: usize) {
    if buf.capacity() - buf.len() >= READ_SPACE {
        return;
    }
    let want = (buf.len() + 4 * READ_SPACE)
        .min(limit + 1)
        .max(buf.len() + 1);
    if want <= 4 * READ_SPACE {
        buf.reserve(2 * READ_SPACE);
    } else if want > buf.capacity() {
        let mut grown = BytesMut::with_capacity(want);
        grown.extend_from_slice(buf);
        *buf = grown;
    }
}

/// After a request that took `took` bytes of `buf`: a buffer whose
/// allocation outgrew [`IDLE_CAPACITY`] is swapped for a small one with
/// what it still holds (a pipelined request), so the large allocation is
/// freed with the request's body.
fn give_back(buf: &mut BytesMut, took: usize) {
    if took > IDLE_CAPACITY || buf.capacity() > IDLE_CAPACITY {
        let mut fresh = BytesMut::with_capacity(IDLE_CAPACITY.max(buf.len()));
        fresh.extend_from_slice(buf);
        *buf = fresh;
    }
}

/// Returns when the client closes its side or the connection fails.
/// What it sends meanwhile (a pipelined request) is kept in `buf`, up to
/// `cap` bytes; past that, it is no longer watched.
async fn client_gone(io: &mut ClientIo, buf: &mut BytesMut, cap: usize) {
    loop {
        if buf.len() >= cap {
            std::future::pending::<()>().await;
        }
        if buf.capacity() - buf.len() < READ_SPACE {
            buf.reserve(READ_SPACE);
        }
        match io.read_buf(buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// Writes every part, in one system call when the socket takes them all.
async fn write_all_vectored(io: &mut ClientIo, parts: &[&[u8]]) -> io::Result<()> {
    let mut slices: [IoSlice<'_>; 5] = [IoSlice::new(&[]); 5];
    let n = parts.len().min(5);
    for (s, p) in slices.iter_mut().zip(parts) {
        *s = IoSlice::new(p);
    }
    let mut bufs = &mut slices[..n];
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        let written = io.write_vectored(bufs).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut bufs, written);
    }
    Ok(())
}

/// Appends a chunk's data to a body being collected, the budget holding
/// what the body's buffer has allocated, not only what it has filled: it
/// grows by doubling (within `max`, the largest body), so counting its
/// length alone let a chunked body hold up to twice its count. `false`:
/// the budget has no room.
fn append_held(body: &mut BytesMut, data: &[u8], held: &mut Held, max: usize) -> bool {
    let need = body.len() + data.len();
    if need > body.capacity() {
        let cap = need
            .max(body.capacity().saturating_mul(2))
            .min(max.max(need));
        if !held.grow_to(cap) {
            return false;
        }
        body.reserve(cap - body.len());
    }
    if !held.grow_to(body.capacity()) {
        return false;
    }
    body.extend_from_slice(data);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunked_body_s_allocation_is_what_the_budget_holds() {
        let budget = crate::budget::Budget::new(4 << 20);
        let mut held = Held::none(&budget);
        let mut body = BytesMut::new();
        let max = 3 << 20;
        let mut filled = 0;
        // Chunks of uneven sizes, as reads deliver them.
        for i in 0..400usize {
            let data = vec![b'x'; 1000 + (i * 7919) % 9000];
            if filled + data.len() > max {
                break;
            }
            assert!(append_held(&mut body, &data, &mut held, max));
            filled += data.len();
            assert_eq!(body.len(), filled);
            assert!(
                held.bytes() >= body.capacity(),
                "held {} of an allocation of {}",
                held.bytes(),
                body.capacity()
            );
            assert!(body.capacity() <= max, "{}", body.capacity());
        }
        assert!(filled > 2 << 20, "{filled}");
        assert_eq!(budget.used(), held.bytes());
        // No room for the next doubling: refused, nothing appended.
        let tight = crate::budget::Budget::new(100 << 10);
        let mut held = Held::none(&tight);
        let mut body = BytesMut::new();
        assert!(append_held(&mut body, &[b'x'; 60 << 10], &mut held, max));
        assert!(!append_held(&mut body, &[b'x'; 10 << 10], &mut held, max));
        assert_eq!(body.len(), 60 << 10);
        assert!(tight.used() <= 100 << 10);
    }

    #[test]
    fn a_large_request_s_allocation_is_given_back_and_what_follows_kept() {
        // A megabyte's body read into the buffer and split off, then
        // dropped with its request, and a pipelined request behind it.
        let mut buf = BytesMut::with_capacity(8 * 1024);
        buf.extend_from_slice(&vec![b'x'; 1 << 20]);
        buf.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let body = buf.split_to(1 << 20).freeze();
        drop(body);
        // The rest of the buffer still points into the megabyte's
        // allocation, which it keeps alive: a new one takes its place.
        let inside = buf.as_ptr();
        give_back(&mut buf, 1 << 20);
        assert_ne!(buf.as_ptr(), inside);
        assert_eq!(&buf[..], b"GET / HTTP/1.1\r\n");
        assert!(buf.capacity() <= IDLE_CAPACITY, "{}", buf.capacity());
        buf.reserve(2 * READ_SPACE);
        assert!(buf.capacity() <= 2 * IDLE_CAPACITY, "{}", buf.capacity());
        // A small request's buffer is left alone.
        let mut small = BytesMut::with_capacity(8 * 1024);
        small.extend_from_slice(b"abc");
        let before = small.as_ptr();
        give_back(&mut small, 100);
        assert_eq!(small.as_ptr(), before);
    }
}
