//! Arrivals: when requests come, for which model, and how large they are.
//! Generators (Poisson; renewal with Gamma inter-arrivals of a chosen
//! coefficient of variation), a diurnal rate and step bursts shaping them,
//! and trace replay (time-scaled, thinned to a share, multiplied). Seeded:
//! the same seed gives the same arrivals.
//!
//! A shaped generator runs in operational time: unit-mean gaps are drawn
//! and the cumulative rate `Λ(t) = rate × ∫ m(s) ds` is inverted, with the
//! multiplier `m` (diurnal × steps) constant over each second. For a
//! Poisson process that is exactly the non-homogeneous Poisson process of
//! rate `rate × m(t)`; for Gamma gaps it keeps their CV in operational
//! time.

use std::sync::Arc;

use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Exp1, Gamma};

use crate::trace::Trace;

/// One request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Arrival {
    /// Seconds since the scenario started.
    pub at: f64,
    /// Index of the workload it belongs to.
    pub workload: u32,
    /// Prompt tokens.
    pub prompt: u32,
    /// Output tokens.
    pub output: u32,
}

/// The arrival process of a workload.
#[derive(Debug, Clone)]
pub enum Process {
    /// Exponential gaps at `rate` per second.
    Poisson {
        /// Mean arrivals per second.
        rate: f64,
    },
    /// Gamma gaps of mean `1 / rate` and coefficient of variation `cv`
    /// (shape `1 / cv²`): bursty for `cv > 1`.
    Gamma {
        /// Mean arrivals per second.
        rate: f64,
        /// Coefficient of variation of the gaps.
        cv: f64,
    },
    /// A trace replayed from its start, looped to fill the duration.
    Trace {
        /// The trace.
        trace: Arc<Trace>,
        /// Time compression: 2 replays twice as fast.
        speedup: f64,
        /// Each row is kept with this probability (a split across models).
        share: f64,
        /// Each kept row comes this many times (copies after the first are
        /// jittered by up to one second).
        copies: u32,
    },
}

/// A rate multiplier over time: diurnal and steps, multiplied.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Shape {
    /// `1 + amplitude × cos(2π (t − peak) / period)`.
    pub diurnal: Option<Diurnal>,
    /// Rate multiplied by `factor` during `[at, at + length)`.
    pub steps: Vec<Step>,
}

/// A diurnal cycle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Diurnal {
    /// 0–1: the trough is `1 − amplitude` of the mean.
    pub amplitude: f64,
    /// Seconds per cycle.
    pub period: f64,
    /// Seconds into the cycle of the peak.
    pub peak: f64,
}

/// A step burst.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step {
    /// Start, seconds.
    pub at: f64,
    /// Length, seconds.
    pub length: f64,
    /// Rate multiplier.
    pub factor: f64,
}

impl Shape {
    /// The multiplier at `t`.
    pub fn at(&self, t: f64) -> f64 {
        let mut m = 1.0;
        if let Some(d) = self.diurnal {
            m *= 1.0 + d.amplitude * (std::f64::consts::TAU * (t - d.peak) / d.period).cos();
        }
        for s in &self.steps {
            if t >= s.at && t < s.at + s.length {
                m *= s.factor;
            }
        }
        m.max(0.0)
    }
}

/// Request sizes.
#[derive(Debug, Clone)]
pub enum Tokens {
    /// Every request the same.
    Fixed {
        /// Prompt tokens.
        prompt: u32,
        /// Output tokens.
        output: u32,
    },
    /// Drawn from a trace's rows, uniformly.
    Sampled(Arc<Trace>),
}

/// One workload: a model's arrivals.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Arrival process.
    pub process: Process,
    /// Rate shape (generators only).
    pub shape: Shape,
    /// Request sizes (generators; a trace brings its own).
    pub tokens: Tokens,
}

/// All arrivals of the workloads over `duration` seconds, in time order
/// (ties by workload, then by generation order).
pub fn generate(workloads: &[Workload], duration: f64, seed: u64) -> Vec<Arrival> {
    let mut all = Vec::new();
    for (i, w) in workloads.iter().enumerate() {
        // Each workload its own stream: adding one leaves the others as
        // they were.
        let mut rng = Xoshiro256PlusPlus::seed_from_u64(
            seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let i = i as u32;
        match &w.process {
            Process::Poisson { rate } => {
                // Memoryless: the time to the first arrival is a gap.
                shaped(
                    &mut rng,
                    *rate,
                    &w.shape,
                    duration,
                    (&|r| Exp1.sample(r), &|r| Exp1.sample(r)),
                    &mut |rng, at| all.push(sized(&w.tokens, rng, at, i)),
                );
            }
            Process::Gamma { rate, cv } => {
                let k = 1.0 / (cv * cv);
                let gamma = Gamma::new(k, 1.0 / k).expect("shape and scale are positive");
                // The process observed from time 0 is in its steady state:
                // the gap that spans 0 is length-biased (Gamma of shape
                // k + 1 for unit-mean Gamma(k) gaps) and 0 falls uniformly
                // inside it. Starting on an arrival instead put about
                // (cv² − 1) / 2 extra arrivals at the start: a clump of
                // 500,000 at cv = 1,000.
                let spanning = Gamma::new(k + 1.0, 1.0 / k).expect("shape and scale are positive");
                shaped(
                    &mut rng,
                    *rate,
                    &w.shape,
                    duration,
                    (&|r| r.random::<f64>() * spanning.sample(r), &|r| {
                        gamma.sample(r)
                    }),
                    &mut |rng, at| all.push(sized(&w.tokens, rng, at, i)),
                );
            }
            Process::Trace {
                trace,
                speedup,
                share,
                copies,
            } => {
                let span = trace.span() / speedup;
                // Looped: the next pass starts one mean gap after the last
                // request.
                let period = span + span / trace.rows.len().max(1) as f64;
                let mut offset = 0.0;
                'passes: while offset < duration {
                    for row in &trace.rows {
                        let at = offset + row.at / speedup;
                        if at >= duration {
                            break 'passes;
                        }
                        if *share < 1.0 && rng.random::<f64>() >= *share {
                            continue;
                        }
                        for c in 0..*copies {
                            let at = if c == 0 { at } else { at + rng.random::<f64>() };
                            if at < duration {
                                all.push(Arrival {
                                    at,
                                    workload: i,
                                    prompt: row.prompt,
                                    output: row.output,
                                });
                            }
                        }
                    }
                    if period <= 0.0 {
                        break;
                    }
                    offset += period;
                }
            }
        }
    }
    all.sort_by(|a, b| a.at.total_cmp(&b.at).then(a.workload.cmp(&b.workload)));
    all
}

/// An arrival at `at` of workload `i`, sized by `tokens`.
fn sized(tokens: &Tokens, rng: &mut Xoshiro256PlusPlus, at: f64, i: u32) -> Arrival {
    let (prompt, output) = size(tokens, rng);
    Arrival {
        at,
        workload: i,
        prompt,
        output,
    }
}

fn size(tokens: &Tokens, rng: &mut Xoshiro256PlusPlus) -> (u32, u32) {
    match tokens {
        Tokens::Fixed { prompt, output } => (*prompt, *output),
        Tokens::Sampled(trace) => {
            let r = trace.rows[rng.random_range(0..trace.rows.len())];
            (r.prompt, r.output)
        }
    }
}

/// A sampler of unit-mean operational time.
type Sampler<'a> = &'a dyn Fn(&mut Xoshiro256PlusPlus) -> f64;

/// Runs a renewal process in operational time — `first` the time to the
/// first arrival, then unit-mean gaps `gap` — and calls `emit` at each
/// arrival in real time.
fn shaped(
    rng: &mut Xoshiro256PlusPlus,
    rate: f64,
    shape: &Shape,
    duration: f64,
    (first, gap): (Sampler<'_>, Sampler<'_>),
    emit: &mut dyn FnMut(&mut Xoshiro256PlusPlus, f64),
) {
    if rate <= 0.0 {
        return;
    }
    // Operational time still to cover before the next arrival.
    let mut need: f64 = first(rng);
    let mut second = 0.0_f64;
    while second < duration {
        let end = (second + 1.0).min(duration);
        let lambda = rate * shape.at(second + 0.5 * (end - second));
        let mut t = second;
        // Arrivals inside this second, at constant rate `lambda`.
        while lambda > 0.0 && t + need / lambda < end {
            t += need / lambda;
            emit(rng, t);
            need = gap(rng);
        }
        if lambda > 0.0 {
            need -= (end - t) * lambda;
        }
        second = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed() -> Tokens {
        Tokens::Fixed {
            prompt: 100,
            output: 10,
        }
    }

    fn gaps_cv(a: &[Arrival]) -> (f64, f64) {
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1].at - w[0].at).collect();
        let n = gaps.len() as f64;
        let mean = gaps.iter().sum::<f64>() / n;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn poisson_and_gamma_have_their_rate_and_cv() {
        let w = |process| Workload {
            process,
            shape: Shape::default(),
            tokens: fixed(),
        };
        let p = generate(&[w(Process::Poisson { rate: 20.0 })], 5_000.0, 3);
        let (mean, cv) = gaps_cv(&p);
        assert!((mean - 0.05).abs() < 0.002, "mean gap {mean}");
        assert!((cv - 1.0).abs() < 0.03, "cv {cv}");
        let g = generate(&[w(Process::Gamma { rate: 5.0, cv: 4.0 })], 100_000.0, 3);
        let (mean, cv) = gaps_cv(&g);
        assert!((mean - 0.2).abs() < 0.02, "mean gap {mean}");
        assert!((cv - 4.0).abs() < 0.4, "cv {cv}");
    }

    #[test]
    fn a_very_bursty_gamma_keeps_its_rate_from_the_start() {
        // Started on an arrival, gaps of shape 1/cv² put about (cv² − 1)/2
        // extra arrivals at time 0: 200 at cv = 20 in a stream that
        // should bring 600 in two minutes. Started in its steady state,
        // the mean count over seeds is the rate × the time.
        let w = Workload {
            process: Process::Gamma {
                rate: 5.0,
                cv: 20.0,
            },
            shape: Shape::default(),
            tokens: fixed(),
        };
        let seeds = 400;
        let total: usize = (0..seeds)
            .map(|seed| generate(std::slice::from_ref(&w), 120.0, seed).len())
            .sum();
        let mean = total as f64 / seeds as f64;
        // A stream's count varies by about √(rate × t × cv²) ≈ 490, so the
        // mean of 400 streams by about 25: 600 ± 80, where the old start
        // gave about 800.
        assert!((520.0..680.0).contains(&mean), "mean count {mean}");
    }

    #[test]
    fn a_step_multiplies_the_rate_and_the_seed_fixes_everything() {
        let w = Workload {
            process: Process::Poisson { rate: 10.0 },
            shape: Shape {
                diurnal: None,
                steps: vec![Step {
                    at: 100.0,
                    length: 100.0,
                    factor: 10.0,
                }],
            },
            tokens: fixed(),
        };
        let a = generate(std::slice::from_ref(&w), 300.0, 9);
        let inside = a.iter().filter(|r| (100.0..200.0).contains(&r.at)).count() as f64;
        let before = a.iter().filter(|r| r.at < 100.0).count() as f64;
        assert!((inside / 10_000.0 - 1.0).abs() < 0.05, "{inside}");
        assert!((before / 1_000.0 - 1.0).abs() < 0.12, "{before}");
        assert_eq!(a, generate(std::slice::from_ref(&w), 300.0, 9));
        assert_ne!(a, generate(&[w], 300.0, 10));
    }

    #[test]
    fn diurnal_peaks_where_it_says() {
        let shape = Shape {
            diurnal: Some(Diurnal {
                amplitude: 0.8,
                period: 1000.0,
                peak: 250.0,
            }),
            steps: vec![],
        };
        assert!((shape.at(250.0) - 1.8).abs() < 1e-9);
        assert!((shape.at(750.0) - 0.2).abs() < 1e-9);
        let a = generate(
            &[Workload {
                process: Process::Poisson { rate: 10.0 },
                shape,
                tokens: fixed(),
            }],
            1000.0,
            1,
        );
        let near = |c: f64| a.iter().filter(|r| (r.at - c).abs() < 50.0).count();
        assert!(
            near(250.0) > 5 * near(750.0),
            "{} {}",
            near(250.0),
            near(750.0)
        );
    }

    #[test]
    fn a_trace_is_replayed_scaled_split_and_multiplied() {
        let trace = Arc::new(
            Trace::parse(
                std::path::Path::new("t.csv"),
                "TIMESTAMP,ContextTokens,GeneratedTokens\n0,1,2\n10,3,4\n20,5,6\n",
            )
            .unwrap(),
        );
        let w = |speedup, share, copies| Workload {
            process: Process::Trace {
                trace: trace.clone(),
                speedup,
                share,
                copies,
            },
            shape: Shape::default(),
            tokens: fixed(),
        };
        let a = generate(&[w(2.0, 1.0, 1)], 25.0, 1);
        let at: Vec<f64> = a.iter().map(|r| r.at).collect();
        // Span 10 s at 2×, looped after one mean gap (10/3 s).
        assert_eq!(at.len(), 6);
        assert_eq!(&at[..3], &[0.0, 5.0, 10.0]);
        assert!((at[3] - 40.0 / 3.0).abs() < 1e-9);
        assert_eq!((a[1].prompt, a[1].output), (3, 4));
        let doubled = generate(&[w(1.0, 1.0, 2)], 21.0, 1);
        assert_eq!(doubled.len(), 6);
        // 1,000 passes of 3 rows, each kept with probability ½.
        let half = generate(&[w(1.0, 0.5, 1)], 1000.0 * 80.0 / 3.0 - 1.0, 1).len() as f64;
        assert!((half / 1500.0 - 1.0).abs() < 0.1, "{half}");
    }
}
