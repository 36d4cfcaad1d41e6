//! The bytes of requests the traffic listener holds at once, across all
//! its connections: request bodies as their bytes arrive, until the
//! request has its answer (waiting in a queue included), and the buffers
//! of request heads that grow past [`HEAD_ALLOWANCE`] while they arrive.
//! Bytes are counted when they arrive, never as announced: a
//! `Content-Length` alone holds nothing, so idle connections cannot take
//! the budget from everyone else.
//!
//! Per-request limits (`maxBodyBytes`, `maxHeaderBytes`) bound one
//! request; `maxConnections` bounds how many there are, but their product
//! (4 MiB × 16,384 by default) is far beyond any container's memory, so a
//! few hundred clients each sending a large body slowly could exhaust it
//! and take every queued request down with the process. The budget
//! (`limits.maxBufferedBytes`) caps the sum: a request that would go past
//! it is answered 503 with `Retry-After` at once (before its body is
//! sent, when the bytes held already leave its announced length no room).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What a connection may buffer of a request head without taking from
/// the budget (its first reads).
pub const HEAD_ALLOWANCE: usize = 16 * 1024;

/// The shared budget.
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The budget's size.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Takes `n` bytes, or nothing when fewer are left.
    pub fn take(self: &Arc<Self>, n: usize) -> Option<Held> {
        let mut held = Held {
            budget: self.clone(),
            bytes: 0,
        };
        held.grow(n).then_some(held)
    }

    fn try_add(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }
}

/// Bytes taken from the [`Budget`], given back when dropped.
#[derive(Debug)]
pub struct Held {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Held {
    /// Nothing held yet, from `budget`.
    pub fn none(budget: &Arc<Budget>) -> Held {
        Held {
            budget: budget.clone(),
            bytes: 0,
        }
    }

    /// Takes `n` more bytes; `false` (and nothing taken) when the budget
    /// has fewer left.
    pub fn grow(&mut self, n: usize) -> bool {
        if n == 0 {
            return true;
        }
        let ok = self.budget.try_add(n);
        if ok {
            self.bytes += n;
        }
        ok
    }

    /// Holds at least `total` bytes: takes the difference.
    pub fn grow_to(&mut self, total: usize) -> bool {
        total <= self.bytes || self.grow(total - self.bytes)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_up_to_the_limit_and_gives_back_on_drop() {
        let b = Budget::new(100);
        let a = b.take(60).expect("60 of 100");
        assert!(b.take(41).is_none(), "41 more would pass 100");
        let mut c = b.take(40).expect("exactly to the limit");
        assert_eq!(b.used(), 100);
        assert!(!c.grow(1));
        assert_eq!(c.bytes(), 40, "a failed grow takes nothing");
        drop(a);
        assert_eq!(b.used(), 40);
        assert!(c.grow_to(90));
        assert!(c.grow_to(10), "already holds more");
        assert_eq!((c.bytes(), b.used()), (90, 90));
        drop(c);
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn threads_never_take_more_than_the_limit_together() {
        let b = Budget::new(1000);
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mut kept = Vec::new();
                    for _ in 0..1000 {
                        if let Some(h) = b.take(7) {
                            assert!(b.used() <= 1000);
                            kept.push(h);
                        }
                        if kept.len() > 10 {
                            kept.remove(0);
                        }
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(b.used(), 0);
    }
}
