//! A coarse timer for the traffic listener's per-connection timeouts
//! (header read, which is also the keep-alive idle timeout), given to
//! hyper through its `rt::Timer` hook.
//!
//! hyper arms the header-read timer for every request head it waits for,
//! and drops it as soon as the head is parsed: the timeout almost never
//! fires. With tokio's timer every arming inserts an entry in the
//! runtime's timer wheel and, for about every second request, wakes the
//! event loop through its eventfd so that `epoll_wait` picks up the
//! earlier deadline: a system call and an extra loop turn per request
//! (measured with `perf` on `bench/gateway-vs-nginx.sh`). Here arming is
//! one allocation and a push on a list that one task per worker sweeps
//! every [`TICK`]: a deadline fires between zero and one tick late, which
//! is what a timeout counted in seconds can afford (nginx's timers are
//! coarse the same way).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::lock;

/// How often deadlines are checked: the most a timeout fires late.
pub const TICK: Duration = Duration::from_millis(100);

/// The timer of one worker (one event loop). Cloning shares it.
#[derive(Clone)]
pub struct CoarseTimer {
    wheel: Arc<Wheel>,
}

#[derive(Default)]
struct Wheel {
    /// Armed sleeps; a dropped sleep leaves a dead entry, removed by the
    /// next sweep.
    armed: Mutex<Vec<Weak<Entry>>>,
}

struct Entry {
    deadline: Instant,
    state: Mutex<EntryState>,
}

#[derive(Default)]
struct EntryState {
    fired: bool,
    waker: Option<Waker>,
}

impl CoarseTimer {
    /// A timer swept by a task on the current tokio runtime; the task ends
    /// once the timer and all its sleeps are dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start() -> Self {
        let wheel = Arc::new(Wheel::default());
        tokio::spawn(sweep(Arc::downgrade(&wheel)));
        CoarseTimer { wheel }
    }

    /// A future that completes at `deadline` (up to one [`TICK`] later).
    pub fn sleep_until(&self, deadline: Instant) -> CoarseSleep {
        CoarseSleep {
            deadline,
            entry: None,
            wheel: self.wheel.clone(),
        }
    }

    /// `fut`'s output, or `None` when `duration` (give or take a tick)
    /// passed first.
    pub async fn timeout<F: Future>(&self, duration: Duration, fut: F) -> Option<F::Output> {
        let sleep = self.sleep_until(Instant::now() + duration);
        tokio::select! {
            biased;
            out = fut => Some(out),
            () = sleep => None,
        }
    }

    /// Armed sleeps, dropped ones not yet swept included.
    pub fn armed(&self) -> usize {
        lock(&self.wheel.armed).len()
    }
}

async fn sweep(wheel: Weak<Wheel>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut due = Vec::new();
    loop {
        tick.tick().await;
        let Some(wheel) = wheel.upgrade() else {
            return;
        };
        let now = Instant::now();
        lock(&wheel.armed).retain(|weak| match weak.upgrade() {
            None => false,
            Some(entry) if entry.deadline <= now => {
                due.push(entry);
                false
            }
            Some(_) => true,
        });
        for entry in due.drain(..) {
            let waker = {
                let mut state = lock(&entry.state);
                state.fired = true;
                state.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

/// A sleep of a [`CoarseTimer`].
pub struct CoarseSleep {
    deadline: Instant,
    // Made and armed on first poll: a sleep created and dropped unpolled
    // (a timeout whose future was ready at once) costs no allocation and
    // the sweeper nothing.
    entry: Option<Arc<Entry>>,
    wheel: Arc<Wheel>,
}

impl Future for CoarseSleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(entry) = &self.entry else {
            let entry = Arc::new(Entry {
                deadline: self.deadline,
                state: Mutex::new(EntryState {
                    fired: false,
                    waker: Some(cx.waker().clone()),
                }),
            });
            lock(&self.wheel.armed).push(Arc::downgrade(&entry));
            self.entry = Some(entry);
            return Poll::Pending;
        };
        let mut state = lock(&entry.state);
        if state.fired {
            return Poll::Ready(());
        }
        match &state.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => state.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

impl hyper::rt::Sleep for CoarseSleep {}

impl hyper::rt::Timer for CoarseTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.sleep_until(Instant::now() + duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(CoarseTimer::sleep_until(self, deadline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fires_late_by_at_most_a_tick_and_never_early() {
        let timer = CoarseTimer::start();
        let start = Instant::now();
        timer.sleep_until(start + Duration::from_millis(150)).await;
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(150), "early: {waited:?}");
        // One tick late at most, plus scheduling slack on a busy machine.
        assert!(
            waited < Duration::from_millis(150) + TICK + Duration::from_millis(400),
            "late: {waited:?}"
        );
    }

    #[tokio::test]
    async fn timeout_returns_the_output_or_none() {
        let timer = CoarseTimer::start();
        assert_eq!(
            timer.timeout(Duration::from_secs(5), async { 7 }).await,
            Some(7)
        );
        let never = std::future::pending::<()>();
        assert_eq!(timer.timeout(Duration::from_millis(50), never).await, None);
    }

    #[tokio::test]
    async fn dropped_sleeps_are_swept_and_never_fire() {
        let timer = CoarseTimer::start();
        let far = Instant::now() + Duration::from_secs(3600);
        for _ in 0..100 {
            let mut s = Box::pin(timer.sleep_until(far));
            // Armed by a poll, then dropped (a head parsed in time).
            assert!(futures_poll_once(s.as_mut()).is_pending());
        }
        assert_eq!(timer.armed(), 100);
        tokio::time::sleep(TICK * 2).await;
        assert_eq!(timer.armed(), 0);
    }

    #[tokio::test]
    async fn an_unpolled_sleep_is_never_armed() {
        let timer = CoarseTimer::start();
        let s = timer.sleep_until(Instant::now());
        assert_eq!(timer.armed(), 0);
        drop(s);
    }

    #[tokio::test]
    async fn the_sweeper_ends_with_the_timer() {
        let timer = CoarseTimer::start();
        let wheel = Arc::downgrade(&timer.wheel);
        drop(timer);
        tokio::time::sleep(TICK * 2).await;
        assert!(wheel.upgrade().is_none());
    }

    fn futures_poll_once<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
        let mut cx = Context::from_waker(Waker::noop());
        f.poll(&mut cx)
    }
}
