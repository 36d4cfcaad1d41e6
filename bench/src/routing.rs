//! The routing benchmark's workloads and figures, pure (the driver,
//! `routing-bench`, runs them against real gateways and simulated
//! replicas).
//!
//! Sizes come from the Azure LLM inference trace (conversation service,
//! `bench/data/traces/azure_llm_2023_conv.csv`): each request's prompt
//! and output token counts are a trace row's `ContextTokens` and
//! `GeneratedTokens`, outputs capped (the figure measured is time to first
//! token; the cap keeps the 2-core machine's chunk rate in bounds).
//!
//! - **Workload A, prefix-heavy** (chat with shared system prompts and
//!   multi-turn growth). A session has 2–5 turns (uniform). Its first turn
//!   takes a random trace row; each later turn takes the unused row with
//!   the smallest context at least the previous turn's prompt, plus its
//!   answer, plus a new user message of 16 to 256 tokens (uniform): every
//!   request's prompt size is a trace row's, and a conversation grows as
//!   chat does, by an answer and a question at a time. It opens with one
//!   of 8 shared system prompts, chosen Zipf-like (prompt `j` with weight
//!   `1 / (j + 1)`), of 256 to 2,048 tokens, cut to at most half the
//!   first turn's context (a cut system prompt is a prefix of the whole
//!   one, so sessions still share it). Turn `t` sends every earlier
//!   message, the earlier answers (as the client kept them), and a new
//!   user message that brings the prompt to the turn's size. Sessions
//!   start as a Poisson process; a turn follows the previous answer after
//!   an exponential think time.
//! - **Workload B, no shared prefix**: single requests of the same sizes,
//!   each a fresh random text, arriving as a Poisson process.
//!
//! Text is 4 bytes a token (three letters and a space), as the simulated
//! server counts tokens.

use std::path::Path;

use anyhow::Context;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};

/// One trace row's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    /// Prompt tokens.
    pub context: u32,
    /// Output tokens.
    pub generated: u32,
}

/// Reads the Azure trace (`TIMESTAMP,ContextTokens,GeneratedTokens`).
pub fn read_trace(path: &Path) -> anyhow::Result<Vec<Row>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut rows = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let mut f = line.split(',');
        let (_, c, g) = (f.next(), f.next(), f.next());
        let parse = |v: Option<&str>, field: &str| {
            v.and_then(|v| v.trim().parse::<u32>().ok())
                .with_context(|| {
                    format!(
                        "{}:{}: {field} is not a whole number",
                        path.display(),
                        i + 1
                    )
                })
        };
        rows.push(Row {
            context: parse(c, "ContextTokens")?,
            generated: parse(g, "GeneratedTokens")?,
        });
    }
    anyhow::ensure!(!rows.is_empty(), "{} has no rows", path.display());
    Ok(rows)
}

/// Which workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// A: shared system prompts, multi-turn sessions.
    PrefixHeavy,
    /// B: no shared prefix.
    NoPrefix,
}

impl Workload {
    /// Its name in the report.
    pub fn name(self) -> &'static str {
        match self {
            Workload::PrefixHeavy => "A prefix-heavy",
            Workload::NoPrefix => "B no shared prefix",
        }
    }
}

/// The knobs of a workload.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Params {
    /// Requests per second, on average.
    pub rate: f64,
    /// Seconds during which sessions start.
    pub seconds: f64,
    /// Seed.
    pub seed: u64,
    /// Most output tokens a request asks for.
    pub max_tokens: u32,
    /// Mean think time between a session's turns, seconds.
    pub think_s: f64,
}

/// One request of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    /// The chat-completions body (streaming).
    pub body: String,
    /// Its prompt tokens.
    pub prompt_tokens: u32,
}

/// A session: turns sent one after another.
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// Its index.
    pub id: usize,
    /// When its first turn is sent, seconds from the start.
    pub start: f64,
    /// Think time before each turn after the first, seconds.
    pub think: Vec<f64>,
    /// Its turns.
    pub turns: Vec<Turn>,
}

/// Lengths of the 8 shared system prompts, tokens.
pub const SYSTEM_PROMPTS: [u32; 8] = [256, 384, 512, 768, 1024, 1280, 1536, 2048];

/// `tokens` tokens of text from `rng`: three letters and a space each.
pub fn text(rng: &mut Xoshiro256PlusPlus, tokens: u32) -> String {
    let mut s = String::with_capacity(tokens as usize * 4);
    for _ in 0..tokens {
        for _ in 0..3 {
            s.push(char::from(b'a' + rng.random_range(0..26u8)));
        }
        s.push(' ');
    }
    s
}

fn exp(rng: &mut Xoshiro256PlusPlus, mean: f64) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -mean * u.ln()
}

fn body(messages: &[(&str, &str)], max_tokens: u32) -> String {
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
        .collect();
    serde_json::json!({
        "model": "m", "stream": true, "max_tokens": max_tokens, "messages": messages
    })
    .to_string()
}

/// The sessions of a workload, deterministic in the seed.
pub fn sessions(workload: Workload, rows: &[Row], p: &Params) -> Vec<Session> {
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(p.seed);
    let mean_turns = match workload {
        Workload::PrefixHeavy => 3.5,
        Workload::NoPrefix => 1.0,
    };
    let session_rate = p.rate / mean_turns;
    let systems: Vec<String> = (0..SYSTEM_PROMPTS.len())
        .map(|j| {
            let mut r = Xoshiro256PlusPlus::seed_from_u64(1000 + j as u64);
            text(&mut r, SYSTEM_PROMPTS[j])
        })
        .collect();
    let weights: Vec<f64> = (0..SYSTEM_PROMPTS.len())
        .map(|j| 1.0 / (j as f64 + 1.0))
        .collect();
    let total: f64 = weights.iter().sum();
    // Unused rows by context size (refilled when used up).
    let mut pool: std::collections::BTreeMap<u32, Vec<Row>> = Default::default();
    let refill = |pool: &mut std::collections::BTreeMap<u32, Vec<Row>>| {
        for r in rows {
            pool.entry(r.context).or_default().push(*r);
        }
    };
    let take_at_least = |pool: &mut std::collections::BTreeMap<u32, Vec<Row>>, size: u32| {
        let (&k, _) = pool.range(size..).next()?;
        let v = pool.get_mut(&k).expect("present");
        let row = v.pop().expect("non-empty");
        if v.is_empty() {
            pool.remove(&k);
        }
        Some(row)
    };
    let mut out = Vec::new();
    let mut t = exp(&mut rng, 1.0 / session_rate);
    while t < p.seconds {
        let id = out.len();
        let turns = match workload {
            Workload::NoPrefix => {
                let row = rows[rng.random_range(0..rows.len())];
                let prompt = row.context.max(1);
                let user = text(&mut rng, prompt);
                vec![Turn {
                    body: body(&[("user", &user)], row.generated.clamp(1, p.max_tokens)),
                    prompt_tokens: prompt,
                }]
            }
            Workload::PrefixHeavy => {
                let k = rng.random_range(2..=5usize);
                let mut picked = vec![rows[rng.random_range(0..rows.len())]];
                while picked.len() < k {
                    let prev = picked.last().expect("one");
                    let want = prev.context.max(64)
                        + prev.generated.clamp(1, p.max_tokens)
                        + rng.random_range(16..=256u32);
                    let row = take_at_least(&mut pool, want).or_else(|| {
                        refill(&mut pool);
                        take_at_least(&mut pool, want)
                    });
                    match row {
                        Some(r) => picked.push(r),
                        None => break, // nothing in the trace is that long
                    }
                }
                let mut pick = rng.random_range(0.0..total);
                let mut j = 0;
                while pick >= weights[j] && j + 1 < weights.len() {
                    pick -= weights[j];
                    j += 1;
                }
                let first = picked[0].context.max(64);
                let sys_tokens = SYSTEM_PROMPTS[j].min(first / 2);
                let system = systems[j][..sys_tokens as usize * 4].to_string();
                let mut messages: Vec<(&'static str, String)> = vec![("system", system)];
                let mut so_far = sys_tokens;
                let mut turns = Vec::new();
                let mut prev_answer = None;
                for (i, row) in picked.iter().enumerate() {
                    if let Some(answer) = prev_answer.take() {
                        messages.push(("assistant", answer));
                    }
                    let floor = if i == 0 { 64 } else { so_far + 16 };
                    let size = row.context.max(floor);
                    let user_tokens = size - so_far;
                    messages.push(("user", text(&mut rng, user_tokens)));
                    so_far = size;
                    let max_tokens = row.generated.clamp(1, p.max_tokens);
                    let refs: Vec<(&str, &str)> =
                        messages.iter().map(|(r, c)| (*r, c.as_str())).collect();
                    turns.push(Turn {
                        body: body(&refs, max_tokens),
                        prompt_tokens: size,
                    });
                    prev_answer = Some(text(&mut rng, max_tokens));
                    so_far += max_tokens;
                }
                turns
            }
        };
        let think = (1..turns.len()).map(|_| exp(&mut rng, p.think_s)).collect();
        out.push(Session {
            id,
            start: t,
            think,
            turns,
        });
        t += exp(&mut rng, 1.0 / session_rate);
    }
    out
}

/// The `q` quantile (0–1) of `v` (nearest rank); 0 for none.
pub fn quantile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Row> {
        (0..200)
            .map(|i| Row {
                context: 200 + (i * 37 % 1800),
                generated: 20 + i % 300,
            })
            .collect()
    }

    fn p() -> Params {
        Params {
            rate: 20.0,
            seconds: 30.0,
            seed: 7,
            max_tokens: 32,
            think_s: 2.0,
        }
    }

    fn messages(body: &str) -> Vec<(String, String)> {
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["role"].as_str().unwrap().to_string(),
                    m["content"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn prefix_heavy_sessions_grow_and_share_system_prompts() {
        let s = sessions(Workload::PrefixHeavy, &rows(), &p());
        assert_eq!(s, sessions(Workload::PrefixHeavy, &rows(), &p()), "seeded");
        let requests: usize = s.iter().map(|x| x.turns.len()).sum();
        // About rate × seconds requests.
        assert!((400..800).contains(&requests), "{requests}");
        let mut systems = std::collections::BTreeMap::new();
        for session in &s {
            assert!((1..=5).contains(&session.turns.len()));
            for w in session.turns.windows(2) {
                let (a, b) = (messages(&w[0].body), messages(&w[1].body));
                assert_eq!(&b[..a.len()], &a[..], "a turn repeats the one before");
                assert!(w[1].prompt_tokens > w[0].prompt_tokens);
            }
            for t in &session.turns {
                let chars: usize = messages(&t.body).iter().map(|(_, c)| c.len()).sum();
                assert_eq!(chars, t.prompt_tokens as usize * 4, "4 bytes a token");
            }
            let sys = messages(&session.turns[0].body)[0].1.clone();
            *systems
                .entry(sys[..64.min(sys.len())].to_string())
                .or_insert(0) += 1;
        }
        assert!(systems.len() <= 8);
        assert!(
            systems.values().any(|&n| n > 10),
            "system prompts are shared"
        );
    }

    #[test]
    fn no_prefix_requests_are_single_and_unique() {
        let s = sessions(Workload::NoPrefix, &rows(), &p());
        let firsts: std::collections::BTreeSet<String> = s
            .iter()
            .map(|x| {
                assert_eq!(x.turns.len(), 1);
                messages(&x.turns[0].body)[0].1[..32].to_string()
            })
            .collect();
        assert_eq!(firsts.len(), s.len());
    }

    #[test]
    fn quantiles_by_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.5), 50.0);
        assert_eq!(quantile(&mut v, 0.99), 99.0);
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }
}
