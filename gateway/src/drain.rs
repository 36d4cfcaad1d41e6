//! Graceful shutdown for a listener's connections: when the gateway
//! stops, every open connection is told to finish the request it is
//! serving and close, and [`Drain::shutdown`] waits until all have.
//!
//! Each connection registers its task's waker once, when first polled,
//! and checks one atomic flag per wake-up after that. (hyper-util's
//! `GracefulShutdown` polls a watch channel on every wake-up of every
//! connection, a lock each time: 2 % of the gateway's instructions per
//! request against nginx, `bench/README.md`.)

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

use pin_project_lite::pin_project;
use tokio::sync::Notify;

use crate::lock;

/// The connections of one listener; cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Drain(Arc<Inner>);

#[derive(Default)]
struct Inner {
    closing: AtomicBool,
    state: std::sync::Mutex<State>,
    // Signalled when the last connection ends.
    idle: Notify,
}

#[derive(Default)]
struct State {
    next: u64,
    wakers: HashMap<u64, Waker>,
    live: usize,
}

impl Drain {
    /// Watches `conn`: when shutdown starts, `stop` is called on it once
    /// (hyper's `graceful_shutdown`) and it is polled to its end.
    pub fn watch<C: Future>(&self, conn: C, stop: fn(Pin<&mut C>)) -> Watched<C> {
        lock(&self.0.state).live += 1;
        Watched {
            conn,
            stop,
            stopping: false,
            registration: Registration {
                drain: self.clone(),
                key: None,
            },
        }
    }

    /// Connections open now.
    /// The drain has begun: a connection between requests closes.
    pub fn is_closing(&self) -> bool {
        self.0.closing.load(Ordering::Acquire)
    }

    /// Connections watched and not yet ended.
    pub fn live(&self) -> usize {
        lock(&self.0.state).live
    }

    /// Tells every connection to finish and close, and waits until all
    /// have (or, when cancelled, stops waiting).
    pub async fn shutdown(&self) {
        self.0.closing.store(true, Ordering::SeqCst);
        let wakers: Vec<Waker> = lock(&self.0.state).wakers.drain().map(|(_, w)| w).collect();
        for w in wakers {
            w.wake();
        }
        loop {
            let notified = self.0.idle.notified();
            if self.live() == 0 {
                return;
            }
            notified.await;
        }
    }
}

struct Registration {
    drain: Drain,
    key: Option<u64>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut state = lock(&self.drain.0.state);
        if let Some(k) = self.key {
            state.wakers.remove(&k);
        }
        state.live -= 1;
        if state.live == 0 {
            drop(state);
            self.drain.0.idle.notify_one();
        }
    }
}

pin_project! {
    /// A connection under a [`Drain`].
    pub struct Watched<C> {
        #[pin]
        conn: C,
        stop: fn(Pin<&mut C>),
        stopping: bool,
        registration: Registration,
    }
}

impl<C: Future> Future for Watched<C> {
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let mut this = self.project();
        if !*this.stopping {
            let inner = &this.registration.drain.0;
            let mut closing = inner.closing.load(Ordering::Acquire);
            if !closing && this.registration.key.is_none() {
                let mut state = lock(&inner.state);
                // Checked again under the lock: shutdown takes the wakers
                // under it after setting the flag.
                closing = inner.closing.load(Ordering::Acquire);
                if !closing {
                    let key = state.next;
                    state.next += 1;
                    state.wakers.insert(key, cx.waker().clone());
                    this.registration.key = Some(key);
                }
            }
            if closing {
                (this.stop)(this.conn.as_mut());
                *this.stopping = true;
            }
        }
        this.conn.poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// A connection that ends only once stopped.
    struct Conn {
        stopped: Arc<AtomicUsize>,
    }

    impl Future for Conn {
        type Output = ();
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
            if self.stopped.load(Ordering::SeqCst) > 0 {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }
    }

    fn stop(c: Pin<&mut Conn>) {
        c.stopped.fetch_add(1, Ordering::SeqCst);
    }

    #[tokio::test]
    async fn shutdown_stops_each_idle_connection_once_and_waits_for_all() {
        let drain = Drain::default();
        let stopped = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let conn = drain.watch(
                Conn {
                    stopped: stopped.clone(),
                },
                stop,
            );
            tasks.push(tokio::spawn(conn));
        }
        tokio::task::yield_now().await;
        assert_eq!(drain.live(), 3);
        tokio::time::timeout(std::time::Duration::from_secs(5), drain.shutdown())
            .await
            .expect("all connections ended");
        assert_eq!(drain.live(), 0);
        for t in tasks {
            t.await.unwrap();
        }
        // Each shared the counter: stopped once each.
        assert_eq!(stopped.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_connection_watched_after_shutdown_is_stopped_at_once() {
        let drain = Drain::default();
        drain.shutdown().await;
        let stopped = Arc::new(AtomicUsize::new(0));
        let conn = drain.watch(
            Conn {
                stopped: stopped.clone(),
            },
            stop,
        );
        conn.await;
        assert_eq!(stopped.load(Ordering::SeqCst), 1);
        assert_eq!(drain.live(), 0);
    }
}
