//! The built-in traffic of `gpuscale up --load`: OpenAI chat requests to
//! the gateway's traffic port, spread over the models, on a pattern.
//!
//! - [`Pattern`]: `steady`, `diurnal` (a ten-minute "day"), `burst` (a
//!   30 s burst every two minutes) or `trace:FILE` (an Azure-format trace
//!   replayed in real time). [`Pattern::multiplier`] and [`Arrivals`] are
//!   pure and seeded: the same seed gives the same requests.
//! - [`weights`]: each model's share is what its `minReplicas` serve at
//!   their target queue depth, so at the peak every model is asked for
//!   about the same multiple of its minimum.
//! - [`drive`]: the async shell; every request is counted once, by the
//!   status it got or by why it got none.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use gpuscale_policies::Model;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use tokio::sync::watch;

/// Length of the `diurnal` pattern's day.
pub const DAY: Duration = Duration::from_secs(600);

/// Period of the `burst` pattern, and its burst within it.
pub const BURST_PERIOD: Duration = Duration::from_secs(120);
/// The burst: from this second of each period…
pub const BURST_FROM_S: f64 = 10.0;
/// …to this one.
pub const BURST_TO_S: f64 = 40.0;

/// Longest a request may take before it counts as unanswered.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How long, once the load stops, its requests in flight get to finish
/// (the gateway's queue timeout is 30 s in the example).
pub const GRACE: Duration = Duration::from_secs(60);

/// Most requests in flight at once from the generator; a request beyond
/// it is not sent and is counted as such.
pub const MAX_IN_FLIGHT: usize = 4096;

/// Output tokens a generated request asks for.
pub const MAX_TOKENS: u32 = 256;

/// The shape of the load over time.
#[derive(Debug, Clone, PartialEq)]
pub enum Pattern {
    /// A constant 60 % of the peak.
    Steady,
    /// 10 % to 100 % of the peak and back over a [`DAY`].
    Diurnal,
    /// 15 % of the peak, and the whole peak for 30 s of every two
    /// minutes (from second 10 to 40).
    Burst,
    /// A trace file's arrivals in real time, with its token counts.
    Trace(PathBuf),
}

impl FromStr for Pattern {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "steady" => Ok(Pattern::Steady),
            "diurnal" => Ok(Pattern::Diurnal),
            "burst" => Ok(Pattern::Burst),
            _ => match s.strip_prefix("trace:") {
                Some(f) if !f.is_empty() => Ok(Pattern::Trace(PathBuf::from(f))),
                _ => Err(format!(
                    "unknown load `{s}`: expected steady, diurnal, burst or trace:FILE"
                )),
            },
        }
    }
}

impl Pattern {
    /// The share of the peak rate at `t` seconds from the start (a trace
    /// has its own arrivals: 1).
    pub fn multiplier(&self, t: f64) -> f64 {
        match self {
            Pattern::Steady => 0.6,
            Pattern::Diurnal => {
                let day = DAY.as_secs_f64();
                0.1 + 0.9 * (0.5 - 0.5 * (2.0 * std::f64::consts::PI * t / day).cos())
            }
            Pattern::Burst => {
                let p = t.rem_euclid(BURST_PERIOD.as_secs_f64());
                if (BURST_FROM_S..BURST_TO_S).contains(&p) {
                    1.0
                } else {
                    0.15
                }
            }
            Pattern::Trace(_) => 1.0,
        }
    }

    /// Its name, as given.
    pub fn name(&self) -> String {
        match self {
            Pattern::Steady => "steady".into(),
            Pattern::Diurnal => "diurnal".into(),
            Pattern::Burst => "burst".into(),
            Pattern::Trace(f) => format!("trace:{}", f.display()),
        }
    }
}

/// A model the load drives.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// Served name.
    pub model: String,
    /// Share of the requests (the targets' shares sum to 1).
    pub weight: f64,
    /// `max_tokens` of its requests.
    pub max_tokens: u32,
}

/// The models to drive: each one's share proportional to
/// `targetQueueDepth × max(minReplicas, 1)`, and its requests sized so one
/// takes at most half its p95 latency SLO at `decode_tps` (the simulated
/// server's speed on a whole share; at most [`MAX_TOKENS`]): an embedding
/// model with a 150 ms target gets short requests, a chat model long ones.
pub fn targets(models: &[Model], decode_tps: f64) -> Vec<Target> {
    let raw: Vec<(String, f64, u32)> = models
        .iter()
        .map(|m| {
            let tokens = match m.slo.latency_p95 {
                Some(slo) if decode_tps > 0.0 => {
                    ((slo.as_secs_f64() * decode_tps * 0.5).floor() as u32).clamp(1, MAX_TOKENS)
                }
                _ => MAX_TOKENS,
            };
            (
                m.served_name.clone(),
                m.scaling.target_queue_depth.max(1.0) * f64::from(m.scaling.min_replicas.max(1)),
                tokens,
            )
        })
        .collect();
    let total: f64 = raw
        .iter()
        .map(|(_, w, _)| w)
        .sum::<f64>()
        .max(f64::MIN_POSITIVE);
    raw.into_iter()
        .map(|(model, w, max_tokens)| Target {
            model,
            weight: w / total,
            max_tokens,
        })
        .collect()
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// Seconds from the start.
    pub at: f64,
    /// Served model name.
    pub model: String,
    /// Prompt tokens (sent as about four characters each).
    pub prompt_tokens: u32,
    /// `max_tokens`.
    pub max_tokens: u32,
    /// Streamed (server-sent events): half of them, so time to first
    /// token is measured too.
    pub stream: bool,
}

/// The arrivals of a pattern, in time order, seeded: a non-homogeneous
/// Poisson process at `peak` × [`Pattern::multiplier`] (thinning), or a
/// trace's rows.
pub struct Arrivals {
    pattern: Pattern,
    peak: f64,
    targets: Vec<Target>,
    rng: Xoshiro256PlusPlus,
    t: f64,
    trace: Option<std::vec::IntoIter<gpuscale_sim::trace::TraceRow>>,
}

impl Arrivals {
    /// Arrivals of `pattern` at `peak` requests per second over the
    /// `targets`; a trace pattern reads its file (the error names the
    /// file, line and column).
    pub fn new(
        pattern: Pattern,
        peak: f64,
        targets: Vec<Target>,
        seed: u64,
    ) -> Result<Arrivals, String> {
        let trace = match &pattern {
            Pattern::Trace(f) => Some(
                gpuscale_sim::trace::Trace::read(f)
                    .map_err(|e| e.to_string())?
                    .rows
                    .into_iter(),
            ),
            _ => None,
        };
        Ok(Arrivals {
            pattern,
            peak,
            targets,
            rng: Xoshiro256PlusPlus::seed_from_u64(seed),
            t: 0.0,
            trace,
        })
    }

    fn target(&mut self) -> Option<Target> {
        let mut u: f64 = self.rng.random::<f64>();
        for t in &self.targets {
            if u < t.weight {
                return Some(t.clone());
            }
            u -= t.weight;
        }
        self.targets.last().cloned()
    }
}

impl Iterator for Arrivals {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        if self.targets.is_empty() {
            return None;
        }
        if let Some(rows) = &mut self.trace {
            let row = rows.next()?;
            let target = self.target()?;
            return Some(Arrival {
                at: row.at,
                model: target.model,
                prompt_tokens: row.prompt.min(2048),
                // The trace's size, within what the model's SLO allows.
                max_tokens: row.output.clamp(1, target.max_tokens),
                stream: self.rng.random::<bool>(),
            });
        }
        if self.peak <= 0.0 || !self.peak.is_finite() {
            return None;
        }
        loop {
            let u: f64 = self.rng.random::<f64>();
            self.t += -(1.0 - u).ln() / self.peak;
            let keep: f64 = self.rng.random::<f64>();
            if keep < self.pattern.multiplier(self.t) {
                let target = self.target()?;
                return Some(Arrival {
                    at: self.t,
                    model: target.model,
                    prompt_tokens: 64 + self.rng.random_range(0..192u32),
                    max_tokens: target.max_tokens,
                    stream: self.rng.random::<bool>(),
                });
            }
        }
    }
}

/// What happened to the requests sent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    /// Requests sent.
    pub sent: u64,
    /// Answered, by HTTP status.
    pub answered: BTreeMap<u16, u64>,
    /// No answer: the connection failed or broke.
    pub failed: u64,
    /// No answer within [`REQUEST_TIMEOUT`].
    pub timed_out: u64,
    /// Still waiting when the generator gave up waiting at the end.
    pub abandoned: u64,
    /// Not sent: [`MAX_IN_FLIGHT`] were already in flight.
    pub not_sent: u64,
}

impl Totals {
    /// Requests that got an HTTP answer.
    pub fn answered_total(&self) -> u64 {
        self.answered.values().sum()
    }

    /// One line for people.
    pub fn line(&self) -> String {
        let by: Vec<String> = self
            .answered
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        format!(
            "load: {} requests sent, {} answered ({}), {} failed, {} timed out, {} abandoned, {} not sent",
            self.sent,
            self.answered_total(),
            by.join(", "),
            self.failed,
            self.timed_out,
            self.abandoned,
            self.not_sent
        )
    }
}

fn body(a: &Arrival) -> Bytes {
    let words = (a.prompt_tokens as usize).max(1);
    let prompt = "word ".repeat(words);
    Bytes::from(
        serde_json::json!({
            "model": a.model,
            "max_tokens": a.max_tokens,
            "stream": a.stream,
            "messages": [{"role": "user", "content": prompt}],
        })
        .to_string(),
    )
}

/// Sends `arrivals` to `target` until they end or `stop` turns true, then
/// waits up to `grace` for the requests in flight. Live counts are in
/// `totals` as it goes.
pub async fn drive(
    target: SocketAddr,
    arrivals: Arrivals,
    mut stop: watch::Receiver<bool>,
    grace: Duration,
    totals: Arc<Mutex<Totals>>,
) {
    let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(MAX_IN_FLIGHT)
        .build(connector);
    let uri = format!("http://{target}/v1/chat/completions");
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    let start = tokio::time::Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for a in arrivals {
        tokio::select! {
            _ = tokio::time::sleep_until(start + Duration::from_secs_f64(a.at.max(0.0))) => {}
            _ = stop.changed() => break,
        }
        if *stop.borrow() {
            break;
        }
        while tasks.try_join_next().is_some() {}
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            totals.lock().unwrap_or_else(|e| e.into_inner()).not_sent += 1;
            continue;
        };
        totals.lock().unwrap_or_else(|e| e.into_inner()).sent += 1;
        let request = http::Request::post(&uri)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body(&a)));
        let client = client.clone();
        let totals = totals.clone();
        tasks.spawn(async move {
            let _slot = slot;
            let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
                let response = client.request(request.ok()?).await.ok()?;
                let status = response.status().as_u16();
                response.into_body().collect().await.ok()?;
                Some(status)
            })
            .await;
            let mut t = totals.lock().unwrap_or_else(|e| e.into_inner());
            match outcome {
                Ok(Some(status)) => *t.answered.entry(status).or_default() += 1,
                Ok(None) => t.failed += 1,
                Err(_) => t.timed_out += 1,
            }
        });
    }
    while tasks.try_join_next().is_some() {}
    if !tasks.is_empty() {
        // Said, so a run past its `--duration` is not a mystery: models
        // started from zero answer after their cold start.
        crate::cmd::note(&format!(
            "load: stopped; waiting up to {} for the answers to the {} requests in flight",
            gpuscale_policies::duration::show(grace),
            tasks.len()
        ));
    }
    let waited =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if waited.is_err() {
        let left = tasks.len() as u64;
        tasks.abort_all();
        totals.lock().unwrap_or_else(|e| e.into_inner()).abandoned += left;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_and_shape_the_rate() {
        assert_eq!("burst".parse::<Pattern>(), Ok(Pattern::Burst));
        assert_eq!(
            "trace:t.csv".parse::<Pattern>(),
            Ok(Pattern::Trace(PathBuf::from("t.csv")))
        );
        assert!("trace:".parse::<Pattern>().is_err());
        assert!(
            "spiky"
                .parse::<Pattern>()
                .unwrap_err()
                .contains("steady, diurnal, burst")
        );
        // Burst: quiet, then the peak from second 10 to 40 of each two
        // minutes.
        assert_eq!(Pattern::Burst.multiplier(5.0), 0.15);
        assert_eq!(Pattern::Burst.multiplier(10.0), 1.0);
        assert_eq!(Pattern::Burst.multiplier(39.9), 1.0);
        assert_eq!(Pattern::Burst.multiplier(40.0), 0.15);
        assert_eq!(Pattern::Burst.multiplier(130.0), 1.0);
        // Diurnal: night at 0, noon at half a day.
        assert!((Pattern::Diurnal.multiplier(0.0) - 0.1).abs() < 1e-9);
        assert!((Pattern::Diurnal.multiplier(300.0) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn arrivals_follow_the_pattern_and_the_weights() {
        let t = |m: &str, weight: f64| Target {
            model: m.into(),
            weight,
            max_tokens: 16,
        };
        let weights = vec![t("a", 0.75), t("b", 0.25)];
        let all: Vec<Arrival> = Arrivals::new(Pattern::Burst, 50.0, weights.clone(), 7)
            .unwrap()
            .take_while(|a| a.at < 120.0)
            .collect();
        let during = all.iter().filter(|a| (10.0..40.0).contains(&a.at)).count() as f64;
        let quiet = all.len() as f64 - during;
        // 30 s at 50/s and 90 s at 7.5/s: about 1500 and 675.
        assert!((1300.0..1700.0).contains(&during), "{during}");
        assert!((550.0..800.0).contains(&quiet), "{quiet}");
        let a = all.iter().filter(|x| x.model == "a").count() as f64 / all.len() as f64;
        assert!((0.70..0.80).contains(&a), "{a}");
        assert!(all.windows(2).all(|w| w[0].at <= w[1].at));
        // Seeded: the same again.
        let again: Vec<Arrival> = Arrivals::new(Pattern::Burst, 50.0, weights, 7)
            .unwrap()
            .take(all.len())
            .collect();
        assert_eq!(all, again);
    }

    #[test]
    fn a_bad_trace_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.csv");
        std::fs::write(&f, "TIMESTAMP,ContextTokens,GeneratedTokens\n0,10,x\n").unwrap();
        let target = Target {
            model: "a".into(),
            weight: 1.0,
            max_tokens: 16,
        };
        let e = Arrivals::new(Pattern::Trace(f.clone()), 1.0, vec![target], 1)
            .err()
            .unwrap();
        assert!(e.contains("t.csv:2:"), "{e}");
    }
}
