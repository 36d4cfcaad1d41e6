//! A client connection as the listeners serve it: the TCP stream with a
//! write-progress timeout and a lingering close.
//!
//! - **Write-progress timeout.** A client that stops reading a response
//!   (a full socket buffer, so writes stay pending) for longer than
//!   `limits.writeTimeout` gets its connection closed, which drops the
//!   response body and frees the replica slot it held. Without it, one
//!   slow reader holds a replica's slot for as long as it likes. The
//!   clock is armed only when a write is pending (the coarse timer, no
//!   clock read on the fast path) and disarmed by any write that goes
//!   through.
//! - **Lingering close.** When the gateway closes a connection the client
//!   has not closed (the header-read timeout, which is also the
//!   keep-alive idle timeout, or the drain), closing a socket with unread
//!   bytes in its receive buffer makes the kernel send a reset, which
//!   destroys anything still in flight to the client and shows a request
//!   the client just sent as a reset instead of a clean end of stream.
//!   So the write side is shut first (a FIN), and what the client still
//!   sends is read and dropped for up to [`LINGER`] before the socket
//!   closes — nginx's `lingering_close`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::timer::{CoarseSleep, CoarseTimer};

/// Longest a closing connection reads what the client still sends.
pub const LINGER: Duration = Duration::from_secs(2);

/// A served client connection.
pub struct ClientIo {
    // `None` only once dropped.
    stream: Option<TcpStream>,
    timer: CoarseTimer,
    limit: Duration,
    stalled: Option<Pin<Box<CoarseSleep>>>,
    // The client closed its side: nothing left to linger for.
    read_closed: bool,
    // Bytes the client sent that were read before the connection was
    // handed here (the over-cap check of the admin port), read first.
    prefix: bytes::Bytes,
}

impl ClientIo {
    /// Wraps an accepted stream with a write-progress timeout of `limit`.
    pub fn new(stream: TcpStream, timer: CoarseTimer, limit: Duration) -> Self {
        ClientIo {
            stream: Some(stream),
            timer,
            limit,
            stalled: None,
            read_closed: false,
            prefix: bytes::Bytes::new(),
        }
    }

    /// The same, reading `prefix` (already taken from the stream) first.
    pub fn with_prefix(mut self, prefix: bytes::Bytes) -> Self {
        self.prefix = prefix;
        self
    }

    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.stream.as_mut().expect("present until dropped"))
    }
}

impl Drop for ClientIo {
    fn drop(&mut self) {
        let Some(stream) = self.stream.take() else {
            return;
        };
        if self.read_closed {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(linger(stream));
        }
    }
}

/// Shuts the write side, then reads and drops what the client sends until
/// it closes, for at most [`LINGER`].
pub async fn linger(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(LINGER, async move {
        if stream.shutdown().await.is_err() {
            return;
        }
        let mut buf = [0u8; 4096];
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// A pending write: arms the clock on the first one, and turns into an
/// error once it has run out.
fn pending<R>(
    stalled: &mut Option<Pin<Box<CoarseSleep>>>,
    timer: &CoarseTimer,
    limit: Duration,
    cx: &mut Context<'_>,
) -> Poll<io::Result<R>> {
    let sleep = stalled.get_or_insert_with(|| Box::pin(timer.sleep_until(Instant::now() + limit)));
    match sleep.as_mut().poll(cx) {
        Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client read nothing within the write timeout",
        ))),
        Poll::Pending => Poll::Pending,
    }
}

use std::future::Future;

impl ClientIo {
    /// A write's outcome: progress disarms the clock, a pending write
    /// arms it.
    fn progress<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match polled {
            Poll::Pending => pending(&mut self.stalled, &self.timer, self.limit, cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = this.stream().poll_write(cx, buf);
        this.progress(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = this.stream().poll_write_vectored(cx, bufs);
        this.progress(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(|s| s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = this.stream().poll_flush(cx);
        this.progress(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().stream().poll_shutdown(cx)
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            buf.put_slice(&this.prefix.split_to(n));
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = this.stream().poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled
            && buf.filled().len() == before
            && buf.remaining() > 0
        {
            this.read_closed = true;
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A connected pair on loopback: (the served side, the client side).
    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (served, _) = l.accept().await.unwrap();
        (served, client)
    }

    #[tokio::test]
    async fn a_prefix_is_read_before_the_stream() {
        let (served, mut client) = pair().await;
        client.write_all(b" world").await.unwrap();
        drop(client);
        let mut r = ClientIo::new(served, CoarseTimer::start(), Duration::from_secs(1))
            .with_prefix(bytes::Bytes::from_static(b"hello"));
        let mut small = [0u8; 3];
        r.read_exact(&mut small).await.unwrap();
        assert_eq!(&small, b"hel");
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"lo world");
    }

    #[tokio::test]
    async fn a_client_that_stops_reading_times_the_writer_out() {
        let (served, _client) = pair().await;
        let mut w = ClientIo::new(served, CoarseTimer::start(), Duration::from_millis(200));
        let start = Instant::now();
        let chunk = vec![7u8; 64 * 1024];
        let err = loop {
            if let Err(e) = w.write_all(&chunk).await {
                break e;
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(200));
    }

    #[tokio::test]
    async fn a_slow_but_steady_reader_is_not_timed_out() {
        let (served, mut client) = pair().await;
        let mut w = ClientIo::new(served, CoarseTimer::start(), Duration::from_millis(400));
        const TOTAL: usize = 24 << 20;
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = vec![0u8; 1 << 20];
            while got < TOTAL {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let mut this_turn = 0;
                while this_turn < (2 << 20) && got < TOTAL {
                    let n = client.read(&mut buf).await.unwrap();
                    this_turn += n;
                    got += n;
                }
            }
            got
        });
        // More than the socket buffers hold, read in bursts 50 ms apart:
        // writes stall often, never for 400 ms.
        let chunk = vec![1u8; 1 << 20];
        for _ in 0..24 {
            w.write_all(&chunk).await.unwrap();
        }
        assert_eq!(reader.await.unwrap(), TOTAL);
    }

    #[tokio::test]
    async fn closing_with_unread_bytes_is_a_clean_end_of_stream_not_a_reset() {
        let (served, mut client) = pair().await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The gateway gives up on the connection without reading.
        drop(ClientIo::new(
            served,
            CoarseTimer::start(),
            Duration::from_secs(1),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut buf = [0u8; 16];
        let n = client
            .read(&mut buf)
            .await
            .expect("an end of stream, not a reset");
        assert_eq!(n, 0);
    }
}
