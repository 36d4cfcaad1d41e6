//! The latency model of one model-server replica, in one place: the
//! simulated server (`gpuscale sim-server`) and the trace-driven simulator
//! (`gpuscale simulate`) both serve requests by it.
//!
//! Prefill runs at `prefill_tps` prompt tokens per second, then one output
//! token every `1 / decode_tps` seconds, both scaled by `speed` (the share
//! of a GPU the replica runs on: 3/7 of an H100's compute for a 3g MIG
//! slice, 1/N of a GPU time-sliced N ways). Each token slows by
//! `batch_slowdown` per other request in the batch: throughput grows with
//! the batch, per-request speed falls (as in vLLM's continuous batching).
//! Prefill is compute-bound: one replica prefills one prompt at a time, in
//! the order its requests start ([`PrefillLane`]), so concurrent prompts
//! share one prefill rate (vLLM's scheduler gives prefill chunks one token
//! budget per step) and a long prompt delays the first token of the
//! requests behind it. Pure: no clock, no I/O.

use std::time::Duration;

/// `x` seconds as a duration, within [0, 10⁹ s] (about 31 years): the
/// callers' checks keep real values far inside, and an extreme one
/// saturates rather than panics.
fn secs(x: f64) -> Duration {
    Duration::from_secs_f64(if x.is_nan() { 0.0 } else { x.clamp(0.0, 1e9) })
}

/// How fast one replica serves, on a whole GPU or a share of one.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceProfile {
    /// The model name it serves (any name is accepted; this one is listed).
    pub model: String,
    /// Prompt tokens per second (0: instant).
    pub prefill_tps: f64,
    /// Output tokens per second for one request alone (0: instant).
    pub decode_tps: f64,
    /// Requests running at once; more wait inside.
    pub max_concurrency: u32,
    /// Per-token slowdown per other running request (0.02 = 2 %).
    pub batch_slowdown: f64,
    /// Share of a GPU (1 = whole; 3/7 for a 3g MIG slice).
    pub speed: f64,
    /// Output tokens when the request does not say (`max_tokens`).
    pub default_max_tokens: u32,
    /// Tokens of KV cache the prefix cache can hold (0: no prefix cache).
    /// `small`: Llama-3.1-8B in bf16 on an H100-80GB under vLLM's default
    /// `gpu_memory_utilization` 0.9: 72 GiB, less 15 GiB of weights and
    /// about 3 GiB of activations and CUDA graphs, leaves 54 GiB; at
    /// 2 × 32 layers × 8 KV heads × 128 dims × 2 bytes = 128 KiB per token
    /// that is 442,368 tokens.
    pub prefix_cache_tokens: u64,
}

/// A replica's prefill, one prompt at a time: times are seconds from any
/// origin the caller keeps. It also knows how many booked prefills have
/// not begun: the requests a vLLM server counts in
/// `vllm:num_requests_waiting` (its scheduler's waiting queue, which
/// holds a request until its prefill is scheduled).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefillLane {
    free_at: f64,
    /// Seconds of prefill booked in all.
    booked: f64,
    /// When each booked prefill that had to wait begins, in order.
    begins: std::collections::VecDeque<f64>,
}

impl PrefillLane {
    /// Books a prefill taking `seconds` for a request that starts at
    /// `now`: it begins when the prefills booked before it end. Returns
    /// when it ends.
    pub fn book(&mut self, now: f64, seconds: f64) -> f64 {
        self.forget_begun(now);
        let begin = self.free_at.max(now);
        if begin > now {
            self.begins.push_back(begin);
        }
        self.free_at = begin + seconds.max(0.0);
        self.booked += seconds.max(0.0);
        self.free_at
    }

    /// Seconds the lane has spent prefilling up to `now` (vLLM's
    /// `vllm:request_prefill_time_seconds` sum, for one prompt at a time):
    /// what was booked, less the part still ahead. Its rate of change is
    /// the lane's utilisation.
    pub fn busy_seconds(&self, now: f64) -> f64 {
        (self.booked - (self.free_at - now).max(0.0)).max(0.0)
    }

    /// Booked prefills that have not begun at `now`.
    pub fn waiting(&mut self, now: f64) -> u32 {
        self.forget_begun(now);
        u32::try_from(self.begins.len()).unwrap_or(u32::MAX)
    }

    fn forget_begun(&mut self, now: f64) {
        while self.begins.front().is_some_and(|&b| b <= now) {
            self.begins.pop_front();
        }
    }
}

/// Tokens per KV-cache block (vLLM's default block size).
pub const BLOCK_TOKENS: u32 = 16;

impl ServiceProfile {
    /// A named profile: `instant` (no delays: a fast upstream for proxy
    /// benchmarks), `small` (an 8B model on a whole H100: 8,000 prompt
    /// tokens/s, 60 tokens/s decode, 32 at once) or `tiny` (a fast model
    /// for tests: 200 tokens/s decode, 4 at once).
    pub fn named(name: &str, model: &str) -> Option<ServiceProfile> {
        let base = ServiceProfile {
            model: model.to_string(),
            prefill_tps: 0.0,
            decode_tps: 0.0,
            max_concurrency: 1024,
            batch_slowdown: 0.0,
            speed: 1.0,
            default_max_tokens: 16,
            prefix_cache_tokens: 0,
        };
        match name {
            "instant" => Some(base),
            "small" => Some(ServiceProfile {
                prefill_tps: 8000.0,
                decode_tps: 60.0,
                max_concurrency: 32,
                batch_slowdown: 0.02,
                prefix_cache_tokens: 54 * (1 << 30) / (128 * 1024),
                ..base
            }),
            "tiny" => Some(ServiceProfile {
                prefill_tps: 20000.0,
                decode_tps: 200.0,
                max_concurrency: 4,
                batch_slowdown: 0.05,
                ..base
            }),
            _ => None,
        }
    }

    /// The slowest speeds the latency model takes (tokens per second; 0
    /// is "no time"): below them a single token would take longer than
    /// anything gpuscale measures.
    pub const MIN_TPS: f64 = 0.01;

    /// The largest per-request slowdown it takes (10: each other request
    /// in the batch makes every token 11 times slower).
    pub const MAX_BATCH_SLOWDOWN: f64 = 10.0;

    /// Profile names [`ServiceProfile::named`] knows.
    pub const NAMES: [&'static str; 3] = ["instant", "small", "tiny"];

    /// Prefill time for a prompt.
    pub fn prefill(&self, prompt_tokens: u32) -> Duration {
        if self.prefill_tps <= 0.0 {
            return Duration::ZERO;
        }
        secs(f64::from(prompt_tokens) / (self.prefill_tps * self.speed))
    }

    /// Time per output token with `running` requests in the batch.
    pub fn per_token(&self, running: u32) -> Duration {
        if self.decode_tps <= 0.0 {
            return Duration::ZERO;
        }
        let slow = 1.0 + self.batch_slowdown * f64::from(running.saturating_sub(1));
        secs(slow / (self.decode_tps * self.speed))
    }

    /// Service time of one request once its prefill ran: prefill of `prompt_tokens`, then
    /// `output_tokens` at the per-token pace of a batch of `running`
    /// (itself included), and the time to its first token (prefill plus
    /// one token).
    pub fn service(
        &self,
        prompt_tokens: u32,
        output_tokens: u32,
        running: u32,
    ) -> (Duration, Duration) {
        let prefill = self.prefill(prompt_tokens);
        let per = self.per_token(running);
        let first = if output_tokens == 0 {
            prefill
        } else {
            prefill + per
        };
        (prefill + per * output_tokens, first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefills_queue_one_at_a_time_in_start_order() {
        let mut lane = PrefillLane::default();
        // Two prompts of 0.5 s start together: the second waits for the
        // first (first come, first served, one server).
        assert_eq!(lane.book(10.0, 0.5), 10.5);
        assert_eq!(lane.book(10.0, 0.5), 11.0);
        // One that starts after the lane emptied does not wait.
        assert_eq!(lane.book(12.0, 0.25), 12.25);
        // One that starts while busy waits only for the rest.
        assert_eq!(lane.book(12.1, 0.1), 12.35);
    }

    #[test]
    fn a_lane_counts_the_prefills_that_have_not_begun() {
        let mut lane = PrefillLane::default();
        lane.book(0.0, 1.0); // begins at once: running, not waiting
        lane.book(0.0, 1.0); // begins at 1
        lane.book(0.5, 1.0); // begins at 2
        assert_eq!(lane.waiting(0.5), 2);
        assert_eq!(lane.waiting(1.0), 1, "the second began at 1.0");
        assert_eq!(lane.waiting(1.5), 1);
        assert_eq!(lane.waiting(2.0), 0);
        // Idle again: a new prompt begins at once.
        lane.book(3.5, 1.0);
        assert_eq!(lane.waiting(3.5), 0);
    }

    #[test]
    fn a_lane_is_busy_for_what_it_has_prefilled_so_far() {
        let mut lane = PrefillLane::default();
        assert_eq!(lane.busy_seconds(5.0), 0.0);
        lane.book(0.0, 1.0);
        lane.book(0.0, 1.0); // 1.0 to 2.0
        assert_eq!(lane.busy_seconds(0.5), 0.5);
        assert_eq!(lane.busy_seconds(1.5), 1.5);
        assert_eq!(lane.busy_seconds(2.0), 2.0);
        // Idle from 2 to 4: busy stays at 2.
        assert_eq!(lane.busy_seconds(4.0), 2.0);
        lane.book(4.0, 0.5);
        assert_eq!(lane.busy_seconds(4.25), 2.25);
        assert_eq!(lane.busy_seconds(10.0), 2.5);
    }
}
