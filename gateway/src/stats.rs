//! Sliding-window statistics per model, pure (callers pass `now`): arrival
//! rate over the last 1, 10 and 60 seconds from per-second buckets, and
//! p50/p95 of queue wait, latency and time to first token over the last
//! 60 seconds from a bounded sample window.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back the windows reach.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Most samples kept per series (the oldest go first).
pub const MAX_SAMPLES: usize = 4096;

/// Arrivals per second over the last 60 s.
#[derive(Debug, Clone)]
pub struct Rate {
    origin: Instant,
    /// Second (since `origin`) of `buckets[0]`'s slot index 0 … ring.
    buckets: [u32; 60],
    last_second: u64,
}

impl Rate {
    /// An empty counter.
    pub fn new(origin: Instant) -> Self {
        Rate {
            origin,
            buckets: [0; 60],
            last_second: 0,
        }
    }

    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.origin).as_secs()
    }

    fn advance(&mut self, now: Instant) {
        let s = self.second(now);
        if s <= self.last_second {
            return;
        }
        let gap = (s - self.last_second).min(60);
        for k in 1..=gap {
            self.buckets[((self.last_second + k) % 60) as usize] = 0;
        }
        self.last_second = s;
    }

    /// Counts one arrival.
    pub fn record(&mut self, now: Instant) {
        self.advance(now);
        let s = self.second(now).max(self.last_second);
        self.buckets[(s % 60) as usize] += 1;
    }

    /// Arrivals per second over the last `seconds` complete seconds plus
    /// the current partial one, divided by `seconds`.
    pub fn per_second(&mut self, now: Instant, seconds: u64) -> f64 {
        self.advance(now);
        let seconds = seconds.clamp(1, 60);
        let sum: u64 = (0..seconds)
            .map(|k| {
                let s = self.last_second.wrapping_sub(k);
                if k > self.last_second {
                    0
                } else {
                    u64::from(self.buckets[(s % 60) as usize])
                }
            })
            .sum();
        sum as f64 / seconds as f64
    }
}

/// Recent samples of one quantity (seconds).
#[derive(Debug, Clone, Default)]
pub struct Samples {
    samples: VecDeque<(Instant, f64)>,
    /// The window's values, reused between quantiles (a decision reads
    /// six per model, each over up to [`MAX_SAMPLES`]).
    scratch: Vec<f64>,
}

impl Samples {
    /// Adds a sample.
    pub fn record(&mut self, now: Instant, value: f64) {
        if self.samples.len() == MAX_SAMPLES {
            self.samples.pop_front();
        }
        // Kept in time order (a caller that read its clock before another
        // but records after it is stamped with the later time, at most
        // the lock's wait later): the windows bisect on it.
        let now = self.samples.back().map_or(now, |&(t, _)| now.max(t));
        self.samples.push_back((now, value));
    }

    /// The `q` quantile (0–1, nearest rank) of the samples of the last
    /// [`WINDOW`]; `None` without samples.
    pub fn quantile(&mut self, now: Instant, q: f64) -> Option<f64> {
        self.quantile_within(now, q, WINDOW)
    }

    /// The `q` quantile of the samples of the last `window` (at most
    /// [`WINDOW`]); `None` without samples in it.
    pub fn quantile_within(&mut self, now: Instant, q: f64, window: Duration) -> Option<f64> {
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.saturating_duration_since(*t) > WINDOW)
        {
            self.samples.pop_front();
        }
        // Samples are recorded in time order: the window is a suffix,
        // found by bisection rather than by a clock subtraction per sample
        // (which was a sixth of a 1,000-GPU simulation's time).
        let start = self
            .samples
            .partition_point(|(t, _)| now.saturating_duration_since(*t) > window);
        let v = &mut self.scratch;
        v.clear();
        v.extend(self.samples.range(start..).map(|(_, x)| *x));
        if v.is_empty() {
            return None;
        }
        // The rank-th smallest, found in linear time (no full sort).
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        let (_, x, _) = v.select_nth_unstable_by(rank - 1, f64::total_cmp);
        Some(*x)
    }
}

/// Everything `/v1/queues` reports about a model's recent past.
#[derive(Debug, Clone)]
pub struct ModelStats {
    /// Arrivals.
    pub arrivals: Rate,
    /// Time in the queue (0 for requests that did not wait).
    pub queue_wait: Samples,
    /// Time from leaving the queue to the response's last byte.
    pub latency: Samples,
    /// Time from leaving the queue to the first body chunk of a stream.
    pub ttft: Samples,
    /// Time from arrival at the gateway to the response's last byte, the
    /// queue wait included: what the latency SLO counts.
    pub latency_total: Samples,
    /// Time from arrival to a stream's first body chunk: what the TTFT
    /// SLO counts.
    pub ttft_total: Samples,
}

impl ModelStats {
    /// Empty statistics.
    pub fn new(origin: Instant) -> Self {
        ModelStats {
            arrivals: Rate::new(origin),
            queue_wait: Samples::default(),
            latency: Samples::default(),
            ttft: Samples::default(),
            latency_total: Samples::default(),
            ttft_total: Samples::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_over_windows() {
        let t0 = Instant::now();
        let mut r = Rate::new(t0);
        for i in 0..100 {
            // 10 per second for 10 seconds.
            r.record(t0 + Duration::from_millis(i * 100));
        }
        let now = t0 + Duration::from_millis(9_950);
        assert_eq!(r.per_second(now, 10), 10.0);
        assert_eq!(r.per_second(now, 1), 10.0);
        assert!((r.per_second(now, 60) - 100.0 / 60.0).abs() < 1e-9);
        // Twenty seconds of silence later: the 10 s window is empty.
        let later = t0 + Duration::from_secs(30);
        assert_eq!(r.per_second(later, 10), 0.0);
        // Over a minute later everything is gone.
        assert_eq!(r.per_second(t0 + Duration::from_secs(200), 60), 0.0);
    }

    #[test]
    fn quantiles_of_recent_samples() {
        let t0 = Instant::now();
        let mut s = Samples::default();
        assert_eq!(s.quantile(t0, 0.5), None);
        for i in 1..=100 {
            s.record(t0, f64::from(i));
        }
        assert_eq!(s.quantile(t0, 0.5), Some(50.0));
        assert_eq!(s.quantile(t0, 0.95), Some(95.0));
        assert_eq!(s.quantile(t0 + Duration::from_secs(61), 0.5), None);
    }

    #[test]
    fn a_quantile_over_a_shorter_window_sees_only_its_samples() {
        let t0 = Instant::now();
        let mut s = Samples::default();
        for i in 0..50 {
            s.record(t0 + Duration::from_secs(i), 3.0);
        }
        for i in 50..55 {
            s.record(t0 + Duration::from_secs(i), 0.1);
        }
        let now = t0 + Duration::from_secs(55);
        assert_eq!(s.quantile(now, 0.5), Some(3.0));
        assert_eq!(
            s.quantile_within(now, 0.5, Duration::from_secs(10)),
            Some(0.1)
        );
        assert_eq!(
            s.quantile_within(now + Duration::from_secs(30), 0.5, Duration::from_secs(10)),
            None
        );
    }
}
