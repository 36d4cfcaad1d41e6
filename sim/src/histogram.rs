//! A log-bucketed histogram of durations: constant memory however many
//! requests a run serves, quantiles within 1 % (each bucket is 1 % wider
//! than the last, from 0.1 ms to 10⁵ s; below and above are clamped).

/// Ratio between consecutive bucket bounds.
const GROWTH: f64 = 1.01;
/// The first bucket's upper bound, seconds.
const FIRST: f64 = 1e-4;
/// Number of buckets (up to ~10⁵ s).
const BUCKETS: usize = 2085;

/// Counts of durations by bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            sum: 0.0,
        }
    }
}

fn bucket(x: f64) -> usize {
    if x.is_nan() || x <= FIRST {
        return 0;
    }
    ((x / FIRST).ln() / GROWTH.ln())
        .ceil()
        .min((BUCKETS - 1) as f64) as usize
}

/// The largest duration the histogram tells apart, seconds (about 10⁵):
/// longer ones are counted in its last bucket, and a quantile there reads
/// as this bound.
pub fn top() -> f64 {
    upper(BUCKETS - 1)
}

/// Upper bound of bucket `i`, seconds.
fn upper(i: usize) -> f64 {
    FIRST * GROWTH.powi(i as i32)
}

impl Histogram {
    /// Adds a duration in seconds.
    pub fn record(&mut self, x: f64) {
        self.counts[bucket(x)] += 1;
        self.total += 1;
        self.sum += x;
    }

    /// Number of durations.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// Mean, seconds.
    pub fn mean(&self) -> Option<f64> {
        (self.total > 0).then(|| self.sum / self.total as f64)
    }

    /// The `q` quantile (nearest rank), as its bucket's upper bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(upper(i));
            }
        }
        Some(upper(BUCKETS - 1))
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.total += other.total;
        self.sum += other.sum;
    }

    /// The cumulative distribution at `points` bucket bounds: (seconds,
    /// fraction at or below), over the buckets that hold anything.
    pub fn cdf(&self, points: usize) -> Vec<(f64, f64)> {
        if self.total == 0 {
            return Vec::new();
        }
        let first = self.counts.iter().position(|&c| c > 0).unwrap_or(0);
        let last = self.counts.iter().rposition(|&c| c > 0).unwrap_or(0);
        let step = ((last - first) / points.max(1)).max(1);
        let mut out = Vec::new();
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate().take(last + 1) {
            seen += c;
            if i >= first && ((i - first) % step == 0 || i == last) {
                out.push((upper(i), seen as f64 / self.total as f64));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_one_percent() {
        let mut h = Histogram::default();
        for i in 1..=10_000 {
            h.record(f64::from(i) * 1e-3);
        }
        for (q, want) in [(0.5, 5.0), (0.95, 9.5), (0.99, 9.9)] {
            let got = h.quantile(q).unwrap();
            assert!(got >= want * 0.999 && got <= want * 1.011, "{q}: {got}");
        }
        assert_eq!(h.count(), 10_000);
        let cdf = h.cdf(50);
        assert!((cdf.last().unwrap().1 - 1.0).abs() < 1e-12);
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 <= w[1].1));
        assert_eq!(Histogram::default().quantile(0.5), None);
    }
}
