//! Knative's KPA decision, transcribed for comparison (not as an oracle
//! of gpuscale: gpuscale departs from it on purpose, see the README's
//! "Panic mode" and the tests that use this module).
//!
//! Source read: knative/serving `pkg/autoscaler/scaling/autoscaler.go`,
//! `(*autoscaler).Scale` (commit 00a4a55c in the code index), with the
//! defaults of `config-autoscaler`: stable window 60 s, panic window 10 %
//! of it (6 s), panic threshold 200 %, max scale-up rate 1000, max
//! scale-down rate 2, revision reachable. The metric is concurrency,
//! averaged per window as `TimedFloat64Buckets.WindowAverage` does: over
//! one-second buckets, and over the part of the window since the first
//! sample when that is shorter. Time is in whole seconds, one sample and
//! one `Scale` per second (the autoscaler's tick).

use std::collections::VecDeque;

pub struct Kpa {
    pub target: f64,
    pub stable_window: u64,
    pub panic_window: u64,
    pub panic_threshold: f64,
    pub max_scale_up_rate: f64,
    pub max_scale_down_rate: f64,
    /// (second, concurrency) samples, newest last.
    samples: VecDeque<(u64, f64)>,
    first: Option<u64>,
    /// `a.panicTime` (None is Go's zero time).
    panic_time: Option<u64>,
    /// `a.maxPanicPods`.
    max_panic_pods: i32,
}

impl Kpa {
    pub fn new(target: f64) -> Self {
        Kpa {
            target,
            stable_window: 60,
            panic_window: 6,
            panic_threshold: 2.0,
            max_scale_up_rate: 1000.0,
            max_scale_down_rate: 2.0,
            samples: VecDeque::new(),
            first: None,
            panic_time: None,
            max_panic_pods: 0,
        }
    }

    /// The metric collector's one-second bucket.
    pub fn record(&mut self, now: u64, concurrency: f64) {
        self.first.get_or_insert(now);
        self.samples.push_back((now, concurrency));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now - t >= self.stable_window)
        {
            self.samples.pop_front();
        }
    }

    /// `WindowAverage`: buckets in the last `window` seconds (or since the
    /// first sample), missing ones counting as zero.
    fn window_average(&self, now: u64, window: u64) -> f64 {
        let first = self.first.unwrap_or(now);
        let span = window.min(now - first + 1);
        let sum: f64 = self
            .samples
            .iter()
            .filter(|(t, _)| now - t < span)
            .map(|(_, v)| v)
            .sum();
        sum / span as f64
    }

    /// `Scale`: the desired pod count, given the ready pods.
    pub fn scale(&mut self, now: u64, ready: i32) -> i32 {
        let ready_pods = f64::from(ready).max(1.0);
        let observed_stable = self.window_average(now, self.stable_window);
        let observed_panic = self.window_average(now, self.panic_window);
        let max_scale_up = (self.max_scale_up_rate * ready_pods).ceil();
        let max_scale_down = (ready_pods / self.max_scale_down_rate).floor();
        let dspc = (observed_stable / self.target).ceil();
        let dppc = (observed_panic / self.target).ceil();
        let desired_stable = dspc.max(max_scale_down).min(max_scale_up) as i32;
        let desired_panic = dppc.max(max_scale_down).min(max_scale_up) as i32;
        let over = dppc / ready_pods >= self.panic_threshold;
        // Go's first two branches (begin panicking; extend the panic
        // window) both set `panicTime = now`; they differ only in logging.
        if over {
            self.panic_time = Some(now);
        } else if let Some(p) = self.panic_time
            && !over
            && p + self.stable_window < now
        {
            self.panic_time = None;
            self.max_panic_pods = 0;
        }
        let mut desired = desired_stable;
        if self.panic_time.is_some() {
            if desired < desired_panic {
                desired = desired_panic;
            }
            if desired > self.max_panic_pods {
                self.max_panic_pods = desired;
            }
            desired = self.max_panic_pods;
        }
        desired
    }
}
