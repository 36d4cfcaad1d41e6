//! Prefix-cache affinity and load-aware choice of a replica, pure.
//!
//! A model server with prefix caching (vLLM's automatic prefix caching,
//! SGLang's radix cache) skips the prefill of every leading block of a
//! prompt it has seen recently. Sending requests that share a prefix to the
//! same replica therefore saves prefill time, as long as that replica is
//! not overloaded. This module decides, from the request alone and the
//! replicas' loads, where a request goes:
//!
//! - [`canonical`]: the prompt as bytes, the way every gateway and every
//!   sidecar reads it: chat messages in order (role, then content), or the
//!   completion `prompt`. [`block_hashes`] cuts those bytes into fixed-size
//!   blocks and hashes them chained, as a model server's prefix cache does.
//! - [`key`]: the affinity key, a hash of the prompt's leading blocks (at
//!   most `affinityBlocks` × `blockBytes`), and for chat no further than
//!   the end of the first user message: the conversation's root, which
//!   every later turn repeats, so all turns of a conversation share the key
//!   while conversations that share only a system prompt do not. A prompt
//!   shorter than one block has no key (nothing worth caching).
//! - [`choose`]: rendezvous (highest-random-weight) hashing of the key over
//!   the replicas' stable tags ([`tag`], a hash of the address), with
//!   bounded loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing
//!   with Bounded Loads", 2018): a replica takes the request only while its
//!   load stays within `loadFactor` × its share of all load, otherwise the
//!   next replica in the key's order does (a spill). The order depends on
//!   the key and the replica set only, so every gateway picks the same
//!   owner for the same prefix with no shared state, and a replica added or
//!   removed moves only the keys it wins or held. With no key the choice is
//!   least-outstanding.
//!
//! Hashes are XXH3-64 (a published, fixed algorithm) with fixed seeds: the
//! same prompt gets the same key in every process, on every version.

use serde::Deserialize;
use serde_json::value::RawValue;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The seed of the affinity key (any fixed value; changing it moves every
/// key).
const KEY_SEED: u64 = 0x6770_7573_6361_6c65; // "gpuscale"

/// Separates a message's role from its content in [`canonical`] bytes.
const ROLE_END: u8 = 0x1f;
/// Ends a message in [`canonical`] bytes.
const MESSAGE_END: u8 = 0x1e;

/// How requests are spread over a model's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Prefix affinity with bounded loads; least-outstanding without a
    /// prefix.
    #[default]
    Prefix,
    /// The replica with the fewest requests outstanding (in flight here
    /// plus waiting inside the server).
    LeastOutstanding,
    /// Each replica in turn.
    RoundRobin,
}

/// The knobs of the choice.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Balance {
    /// The policy.
    pub policy: Policy,
    /// Bytes per block of the prompt.
    pub block_bytes: usize,
    /// Leading blocks the key covers.
    pub affinity_blocks: usize,
    /// `c = 1 + ε` of bounded loads: a replica takes a request only while
    /// its load stays within `c` × its share of the total (≥ 1).
    pub load_factor: f64,
    /// The bound is never below this share (0–1) of the replica's
    /// concurrency limit: a replica that far from saturation takes its own
    /// prefixes whatever the others hold, since continuous batching makes
    /// a few requests more nearly free while a spill costs a cache miss.
    pub spill_floor: f64,
    /// A replica whose KV cache is at least this full (0–1, from its
    /// metrics) is passed over, as one at its bound is.
    pub kv_spill: f64,
    /// A prefix not known to be shared ([`Hint::shared`]) goes to its
    /// owner only when the owner holds no more than the least loaded
    /// replica, or at most this many requests more with nothing waiting
    /// inside it.
    pub fresh_slack: u32,
}

impl Default for Balance {
    fn default() -> Self {
        Balance {
            policy: Policy::Prefix,
            block_bytes: 256,
            affinity_blocks: 16,
            load_factor: 1.5,
            spill_floor: 0.75,
            kv_spill: 0.9,
            fresh_slack: 0,
        }
    }
}

/// Why a replica was chosen (the `reason` label of
/// `gpuscale_gateway_route_decisions_total` and the explain header).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// The owner of the request's prefix.
    Affinity,
    /// The owner was at its load bound (or its KV cache full): the next
    /// replica in the prefix's order.
    Spill,
    /// No prefix (or every replica at its bound): the least loaded.
    LeastLoaded,
    /// The least loaded of the replicas that have the request's adapter.
    Adapter,
    /// Round robin.
    RoundRobin,
}

impl Reason {
    /// Every reason, in label order.
    pub const ALL: [Reason; 5] = [
        Reason::Affinity,
        Reason::Spill,
        Reason::LeastLoaded,
        Reason::Adapter,
        Reason::RoundRobin,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Reason::Affinity => "affinity",
            Reason::Spill => "spill",
            Reason::LeastLoaded => "least-loaded",
            Reason::Adapter => "adapter",
            Reason::RoundRobin => "round-robin",
        }
    }

    /// Index in [`Reason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The prompt fields of a request body, borrowed and not yet parsed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Prompt<'a> {
    /// `messages` (chat completions).
    pub messages: Option<&'a RawValue>,
    /// `prompt` (completions).
    pub prompt: Option<&'a RawValue>,
}

impl Prompt<'_> {
    /// Whether the body has a prompt at all.
    pub fn is_empty(&self) -> bool {
        self.messages.is_none() && self.prompt.is_none()
    }
}

/// What a request asks of the choice: its prefix key and its adapter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hint {
    /// The affinity key ([`key`]).
    pub key: Option<u64>,
    /// Whether the prefix was seen before: the request continues a
    /// conversation (it carries an earlier answer), or this gateway routed
    /// the key recently. A prefix not known to be shared goes to its owner
    /// only when the owner is about as free as the least loaded replica,
    /// so traffic without shared prefixes is balanced as least-outstanding
    /// balances it.
    pub shared: bool,
    /// The LoRA adapter (an index into the model's adapter list).
    pub adapter: Option<u16>,
}

/// A request's affinity key, and whether the request continues a
/// conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// The key.
    pub hash: u64,
    /// A chat request that carries an earlier answer (an `assistant` or
    /// `tool` message after a user message).
    pub continued: bool,
}

/// A prompt as bytes ([`canonical`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    /// The bytes: for chat, per message its role, `0x1f`, its text and
    /// `0x1e`; for completions the prompt.
    pub bytes: Vec<u8>,
    /// Where the conversation's root ends: after the first user message
    /// (chat), else the end.
    pub root_end: usize,
    /// Whether a chat carries an earlier answer (an `assistant` or `tool`
    /// message after the first user message).
    pub continued: bool,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    role: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

/// Appends the text of a message's `content`: a string, or an array of
/// parts (each part's `text`, or for other parts the part itself, so two
/// different images differ).
fn push_content(out: &mut Vec<u8>, content: &RawValue) {
    if let Ok(s) = serde_json::from_str::<std::borrow::Cow<str>>(content.get()) {
        out.extend_from_slice(s.as_bytes());
        return;
    }
    if let Ok(parts) = serde_json::from_str::<Vec<&RawValue>>(content.get()) {
        for part in parts {
            #[derive(Deserialize)]
            struct Part<'a> {
                #[serde(default, borrow)]
                text: Option<std::borrow::Cow<'a, str>>,
            }
            match serde_json::from_str::<Part>(part.get()) {
                Ok(Part { text: Some(t) }) => out.extend_from_slice(t.as_bytes()),
                _ => out.extend_from_slice(part.get().as_bytes()),
            }
        }
        return;
    }
    out.extend_from_slice(content.get().as_bytes());
}

/// The prompt as bytes, the same in every process; `None` when the body
/// has no prompt this can read.
pub fn canonical(p: &Prompt) -> Option<Canonical> {
    if let Some(messages) = p.messages {
        let messages: Vec<Message> = serde_json::from_str(messages.get()).ok()?;
        let mut bytes = Vec::with_capacity(messages.len() * 64);
        let mut root_end = None;
        let mut continued = false;
        for m in &messages {
            if root_end.is_some() && matches!(m.role.as_deref(), Some("assistant" | "tool")) {
                continued = true;
            }
            if let Some(role) = &m.role {
                bytes.extend_from_slice(role.as_bytes());
            }
            bytes.push(ROLE_END);
            if let Some(c) = m.content {
                push_content(&mut bytes, c);
            }
            bytes.push(MESSAGE_END);
            if root_end.is_none() && m.role.as_deref() == Some("user") {
                root_end = Some(bytes.len());
            }
        }
        let root_end = root_end.unwrap_or(bytes.len());
        return Some(Canonical {
            bytes,
            root_end,
            continued,
        });
    }
    let prompt = p.prompt?;
    let text = prompt.get();
    let bytes = if let Ok(s) = serde_json::from_str::<std::borrow::Cow<str>>(text) {
        s.as_bytes().to_vec()
    } else if let Ok(tokens) = serde_json::from_str::<Vec<u32>>(text) {
        tokens.iter().flat_map(|t| t.to_le_bytes()).collect()
    } else if let Ok(batch) = serde_json::from_str::<Vec<&RawValue>>(text) {
        // A batch of prompts: the first one decides.
        return canonical(&Prompt {
            messages: None,
            prompt: Some(batch.first()?),
        });
    } else {
        return None;
    };
    let root_end = bytes.len();
    Some(Canonical {
        bytes,
        root_end,
        continued: false,
    })
}

/// The affinity key of a prompt: XXH3 of its leading bytes up to the end
/// of the conversation's root and at most `affinity_blocks` ×
/// `block_bytes`. `None` when the whole prompt is shorter than one block.
pub fn key(p: &Prompt, block_bytes: usize, affinity_blocks: usize) -> Option<Key> {
    let c = canonical(p)?;
    Some(Key {
        hash: key_of(&c, block_bytes, affinity_blocks)?,
        continued: c.continued,
    })
}

/// [`key`] of a prompt already in canonical form.
pub fn key_of(c: &Canonical, block_bytes: usize, affinity_blocks: usize) -> Option<u64> {
    if c.bytes.len() < block_bytes.max(1) {
        return None;
    }
    let end = c
        .root_end
        .min(block_bytes.saturating_mul(affinity_blocks))
        .min(c.bytes.len());
    Some(xxh3_64_with_seed(&c.bytes[..end], KEY_SEED))
}

/// Chained hashes of the full `block`-byte blocks of `bytes`: block `i`'s
/// hash covers every byte before its end, as a prefix cache's block hash
/// does (a partial last block is not cached, and not hashed).
pub fn block_hashes(bytes: &[u8], block: usize) -> Vec<u64> {
    let block = block.max(1);
    let mut out = Vec::with_capacity(bytes.len() / block);
    let mut prev = KEY_SEED;
    for chunk in bytes.chunks_exact(block) {
        prev = xxh3_64_with_seed(chunk, prev);
        out.push(prev);
    }
    out
}

/// A replica's stable tag: the hash of its address (`host:port`), the same
/// in every gateway.
pub fn tag(authority: &str) -> u64 {
    xxh3_64(authority.as_bytes())
}

/// A replica's rendezvous weight for a key.
pub fn score(key: u64, tag: u64) -> u64 {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&key.to_le_bytes());
    b[8..].copy_from_slice(&tag.to_le_bytes());
    xxh3_64(&b)
}

/// What [`choose`] sees of one replica that takes traffic (registered,
/// not draining, not ejected).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Its [`tag`].
    pub tag: u64,
    /// Requests outstanding: in flight from this gateway plus waiting
    /// inside the server.
    pub load: u64,
    /// Of those, waiting inside the server (from its metrics).
    pub waiting: u64,
    /// Its concurrency limit (its weight in the load shares).
    pub limit: u32,
    /// KV-cache utilisation, 0–1, from its metrics (0 when unknown).
    pub kv: f64,
    /// Whether it can take a request now (below its limit, not excluded).
    pub available: bool,
    /// Whether it has the request's adapter loaded.
    pub has_adapter: bool,
    /// Requests this gateway routed to the pool since it last chose this
    /// replica (`u64::MAX` if never): a replica chosen a moment ago may
    /// still be prefilling that prompt, which its load does not show.
    pub since: u64,
}

/// The choice: an index into the candidates and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Index of the chosen candidate.
    pub index: usize,
    /// Why.
    pub reason: Reason,
}

/// The load bound of a replica with `limit` when the replicas in scope
/// hold `total` (this request not counted) and their limits sum to
/// `limits`: `⌈c · (total + 1) · limit / limits⌉`, at least
/// `⌈floor · limit⌉`.
pub fn bound(b: &Balance, total: u64, limit: u32, limits: u64) -> u64 {
    let share = f64::from(limit.max(1)) / limits.max(1) as f64;
    let mirrokni = (b.load_factor.max(1.0) * (total + 1) as f64 * share).ceil() as u64;
    let floor = (b.spill_floor.clamp(0.0, 1.0) * f64::from(limit)).ceil() as u64;
    mirrokni.max(floor)
}

/// Chooses a replica. `start` rotates the starting point among equally
/// loaded replicas (least-loaded) and is the turn (round robin).
pub fn choose(b: &Balance, cands: &[Candidate], hint: Hint, start: usize) -> Option<Choice> {
    let n = cands.len();
    if n == 0 {
        return None;
    }
    if b.policy == Policy::RoundRobin {
        return (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| cands[i].available)
            .map(|index| Choice {
                index,
                reason: Reason::RoundRobin,
            });
    }
    let in_scope_all = |_: &Candidate| true;
    let adapter_scope = |c: &Candidate| c.has_adapter;
    // Bounds are shares of the whole pool's load, whatever the scope.
    let (total, limits) = totals(cands);
    // The adapter narrows the scope when a replica that has it can take
    // the request within its bound.
    let by_adapter = hint.adapter.is_some()
        && cands
            .iter()
            .any(|c| c.has_adapter && c.available && c.load < bound(b, total, c.limit, limits));
    let scope: &dyn Fn(&Candidate) -> bool = if by_adapter {
        &adapter_scope
    } else {
        &in_scope_all
    };
    if b.policy == Policy::Prefix
        && let Some(key) = hint.key
    {
        let chosen = if hint.shared {
            by_affinity(b, cands, key, scope)
        } else {
            fresh(b, cands, key, scope)
        };
        if let Some(c) = chosen {
            return Some(c);
        }
    }
    least_loaded(cands, scope, start).map(|index| Choice {
        index,
        reason: if by_adapter {
            Reason::Adapter
        } else {
            Reason::LeastLoaded
        },
    })
}

/// Σ load and Σ limits of every candidate.
fn totals(cands: &[Candidate]) -> (u64, u64) {
    cands
        .iter()
        .fold((0, 0), |(t, l), c| (t + c.load, l + u64::from(c.limit)))
}

fn by_affinity(
    b: &Balance,
    cands: &[Candidate],
    key: u64,
    scope: &dyn Fn(&Candidate) -> bool,
) -> Option<Choice> {
    let (total, limits) = totals(cands);
    let fits = |c: &Candidate| {
        c.available && c.load < bound(b, total, c.limit, limits) && c.kv < b.kv_spill
    };
    let mut order: Vec<(u64, usize)> = cands
        .iter()
        .enumerate()
        .filter(|(_, c)| scope(c))
        .map(|(i, c)| (score(key, c.tag), i))
        .collect();
    // Highest weight first; ties (equal tags) by index, so the order is
    // total.
    order.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    order
        .iter()
        .position(|&(_, i)| fits(&cands[i]))
        .map(|rank| Choice {
            index: order[rank].1,
            reason: if rank == 0 {
                Reason::Affinity
            } else {
                Reason::Spill
            },
        })
}

/// A prefix not known to be shared: its owner if the owner is as free as
/// the least loaded replica, or within `fresh_slack` of it with nothing
/// waiting inside, and either holds nothing of this gateway's or was not
/// chosen among its last n − 1 requests to the pool (n candidates); else
/// nothing (the caller takes the least loaded, rotating among ties).
///
/// The last condition is what keeps a workload with no shared prefix as
/// fast as least-outstanding: in-flight counts tie often, and among tied
/// replicas least-outstanding's rotation picks one not chosen lately,
/// whose last prompt has likely finished prefilling (with all tied it
/// cycles through them, so its pick was last chosen n − 1 requests ago);
/// the owner, a random one among them, may have taken a prompt a moment
/// ago.
fn fresh(
    b: &Balance,
    cands: &[Candidate],
    key: u64,
    scope: &dyn Fn(&Candidate) -> bool,
) -> Option<Choice> {
    let min = cands
        .iter()
        .filter(|c| c.available && scope(c))
        .map(|c| c.load)
        .min()?;
    let (index, owner) = cands
        .iter()
        .enumerate()
        .filter(|(_, c)| scope(c))
        .max_by_key(|(i, c)| (score(key, c.tag), std::cmp::Reverse(*i)))?;
    // As free as the least loaded, or within the slack of it with
    // nothing waiting inside.
    let free =
        owner.load <= min || (owner.waiting == 0 && owner.load <= min + u64::from(b.fresh_slack));
    // Nothing of this gateway's in flight there (and nothing waiting):
    // no prompt of ours to finish first.
    let settled = owner.load == 0 || owner.since >= cands.len().saturating_sub(1) as u64;
    (owner.available && free && settled && owner.kv < b.kv_spill).then_some(Choice {
        index,
        reason: Reason::Affinity,
    })
}

fn least_loaded(
    cands: &[Candidate],
    scope: &dyn Fn(&Candidate) -> bool,
    start: usize,
) -> Option<usize> {
    let n = cands.len();
    let mut best: Option<usize> = None;
    for k in 0..n {
        let i = (start + k) % n;
        let c = &cands[i];
        if !c.available || !scope(c) {
            continue;
        }
        if best.is_none_or(|j| c.load < cands[j].load) {
            best = Some(i);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).unwrap()
    }

    fn chat(json: &str) -> Canonical {
        let r = raw(json);
        canonical(&Prompt {
            messages: Some(&r),
            prompt: None,
        })
        .unwrap()
    }

    #[test]
    fn chat_turns_share_the_root_and_conversations_do_not() {
        let sys = "You are a helpful assistant. ".repeat(20);
        let turn1 = chat(&format!(
            r#"[{{"role":"system","content":"{sys}"}},{{"role":"user","content":"Plan a trip to Lisbon."}}]"#
        ));
        let turn2 = chat(&format!(
            r#"[{{"role":"system","content":"{sys}"}},{{"role":"user","content":"Plan a trip to Lisbon."}},
                {{"role":"assistant","content":"Day one: Alfama."}},{{"role":"user","content":"And day two?"}}]"#
        ));
        let other = chat(&format!(
            r#"[{{"role":"system","content":"{sys}"}},{{"role":"user","content":"Plan a trip to Porto."}}]"#
        ));
        let k = |c: &Canonical| key_of(c, 64, 64).unwrap();
        assert_eq!(k(&turn1), k(&turn2), "a conversation keeps its key");
        assert_ne!(k(&turn1), k(&other), "another conversation differs");
        assert_eq!(
            &turn2.bytes[..turn1.bytes.len()],
            &turn1.bytes[..],
            "a later turn extends the bytes of an earlier one"
        );
        // Capped at the leading blocks: with 2 blocks of 64 bytes the key
        // covers the system prompt only, shared by both conversations.
        assert_eq!(key_of(&turn1, 64, 2), key_of(&other, 64, 2));
    }

    #[test]
    fn content_parts_and_escapes_read_as_text() {
        let plain = chat(r#"[{"role":"user","content":"line one\nline two"}]"#);
        let parts = chat(
            r#"[{"role":"user","content":[{"type":"text","text":"line one\n"},{"type":"text","text":"line two"}]}]"#,
        );
        assert_eq!(plain.bytes, parts.bytes);
        assert_eq!(plain.bytes, b"user\x1fline one\nline two\x1e");
        let image = chat(
            r#"[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/1.png"}}]}]"#,
        );
        assert!(
            String::from_utf8_lossy(&image.bytes).contains("1.png"),
            "a non-text part counts as itself"
        );
    }

    #[test]
    fn completions_prompts_strings_tokens_and_batches() {
        let p = |json: &str| {
            let r = raw(json);
            canonical(&Prompt {
                messages: None,
                prompt: Some(&r),
            })
        };
        assert_eq!(p(r#""abc""#).unwrap().bytes, b"abc");
        assert_eq!(p(r#"[1, 2]"#).unwrap().bytes, [1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(p(r#"["first", "second"]"#).unwrap().bytes, b"first");
        assert_eq!(p(r#"{"x": 1}"#), None);
        let short = p(r#""hello""#).unwrap();
        assert_eq!(key_of(&short, 256, 16), None, "shorter than a block");
    }

    #[test]
    fn block_hashes_are_chained_over_full_blocks() {
        let a = block_hashes(b"aaaabbbbcc", 4);
        assert_eq!(a.len(), 2, "the partial block is not hashed");
        let b = block_hashes(b"xaaabbbb", 4);
        assert_ne!(a[1], b[1], "a block's hash covers the blocks before it");
        assert_eq!(block_hashes(b"aaaabbbbzz", 4), a);
    }

    fn cand(tag: u64, load: u64) -> Candidate {
        Candidate {
            tag,
            load,
            waiting: 0,
            limit: 32,
            kv: 0.0,
            available: true,
            has_adapter: false,
            since: u64::MAX,
        }
    }

    #[test]
    fn the_owner_is_the_highest_weight_and_spills_at_its_bound() {
        let b = Balance {
            load_factor: 1.25,
            spill_floor: 0.0,
            ..Balance::default()
        };
        let mut cands: Vec<Candidate> = (0..4).map(|t| cand(t, 10)).collect();
        let hint = Hint {
            key: Some(42),
            shared: true,
            adapter: None,
        };
        let owner = (0..4).max_by_key(|&t| score(42, t)).unwrap() as usize;
        assert_eq!(
            choose(&b, &cands, hint, 0),
            Some(Choice {
                index: owner,
                reason: Reason::Affinity
            })
        );
        // The others hold 30: with the owner at L the bound is
        // ⌈1.25 · (31 + L) / 4⌉, 15 at L = 14 (it fits) and at L = 15 (it
        // is full).
        cands[owner].load = 14;
        assert_eq!(choose(&b, &cands, hint, 0).unwrap().index, owner);
        cands[owner].load = 15;
        let c = choose(&b, &cands, hint, 0).unwrap();
        assert_eq!(c.reason, Reason::Spill);
        let second = (0..4)
            .filter(|&t| t as usize != owner)
            .max_by_key(|&t| score(42, t))
            .unwrap() as usize;
        assert_eq!(c.index, second, "the next in the key's order");
        // A full KV cache spills too.
        cands[owner].load = 10;
        cands[owner].kv = 0.95;
        assert_eq!(choose(&b, &cands, hint, 0).unwrap().reason, Reason::Spill);
    }

    #[test]
    fn a_fresh_prefix_skips_an_owner_chosen_among_the_last_n_minus_one_picks() {
        let b = Balance::default();
        let mut cands = fleet();
        let key = 7;
        let owner = (0..8).max_by_key(|&i| score(key, cands[i].tag)).unwrap();
        let fresh = Hint {
            key: Some(key),
            shared: false,
            adapter: None,
        };
        // All tied with a request each: the owner, unless this gateway
        // chose it among its last 7 requests (8 replicas).
        for c in &mut cands {
            c.load = 1;
        }
        for since in [0, 6] {
            cands[owner].since = since;
            let next = (owner + 1) % 8;
            let c = choose(&b, &cands, fresh, next).unwrap();
            assert_eq!(
                c,
                Choice {
                    index: next,
                    reason: Reason::LeastLoaded
                },
                "since {since}"
            );
        }
        cands[owner].since = 7;
        assert_eq!(
            choose(&b, &cands, fresh, 0).unwrap(),
            Choice {
                index: owner,
                reason: Reason::Affinity
            }
        );
        // Idle, it takes it however lately it was chosen.
        for c in &mut cands {
            c.load = 0;
        }
        cands[owner].since = 0;
        assert_eq!(choose(&b, &cands, fresh, 0).unwrap().index, owner);
        // A shared prefix stays with its owner however lately it was chosen.
        cands[owner].load = 1;
        let shared = Hint {
            shared: true,
            ..fresh
        };
        assert_eq!(choose(&b, &cands, shared, 0).unwrap().index, owner);
    }

    #[test]
    fn a_fresh_prefix_goes_to_its_owner_only_when_it_is_about_as_free() {
        let b = Balance {
            fresh_slack: 1,
            ..Balance::default()
        };
        let mut cands = fleet();
        let key = 99;
        let owner = (0..8).max_by_key(|&i| score(key, cands[i].tag)).unwrap();
        for c in &mut cands {
            c.load = 5;
        }
        let fresh = Hint {
            key: Some(key),
            shared: false,
            adapter: None,
        };
        let shared = Hint {
            shared: true,
            ..fresh
        };
        assert_eq!(choose(&b, &cands, fresh, 0).unwrap().index, owner);
        // One more than the least loaded: still within the slack of 1.
        cands[owner].load = 6;
        assert_eq!(
            choose(&b, &cands, fresh, 0).unwrap().reason,
            Reason::Affinity
        );
        // Not with a request waiting inside it.
        cands[owner].waiting = 1;
        assert_eq!(
            choose(&b, &cands, fresh, 0).unwrap().reason,
            Reason::LeastLoaded
        );
        cands[owner].waiting = 0;
        // Two more: a fresh prefix goes to the least loaded, a shared one
        // stays (far within its bound).
        cands[owner].load = 7;
        let c = choose(&b, &cands, fresh, 0).unwrap();
        assert_eq!(c.reason, Reason::LeastLoaded);
        assert_ne!(c.index, owner);
        assert_eq!(
            choose(&b, &cands, shared, 0),
            Some(Choice {
                index: owner,
                reason: Reason::Affinity
            })
        );
    }

    #[test]
    fn a_chat_that_carries_an_answer_continues_a_conversation() {
        let first = r#"[{"role":"system","content":"s"},{"role":"user","content":"q"}]"#;
        let second = r#"[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"},{"role":"user","content":"q2"}]"#;
        assert!(!chat(first).continued);
        assert!(chat(second).continued);
    }

    #[test]
    fn no_key_is_least_outstanding_and_round_robin_turns() {
        let b = Balance::default();
        let cands = [cand(1, 5), cand(2, 3), cand(3, 3)];
        let c = choose(&b, &cands, Hint::default(), 0).unwrap();
        assert_eq!((c.index, c.reason), (1, Reason::LeastLoaded));
        assert_eq!(choose(&b, &cands, Hint::default(), 2).unwrap().index, 2);
        let rr = Balance {
            policy: Policy::RoundRobin,
            ..b
        };
        let picks: Vec<usize> = (0..4)
            .map(|s| choose(&rr, &cands, Hint::default(), s).unwrap().index)
            .collect();
        assert_eq!(picks, [0, 1, 2, 0]);
        let lo = Balance {
            policy: Policy::LeastOutstanding,
            ..b
        };
        let keyed = Hint {
            key: Some(7),
            shared: true,
            adapter: None,
        };
        assert_eq!(
            choose(&lo, &cands, keyed, 0).unwrap().reason,
            Reason::LeastLoaded,
            "least-outstanding ignores the key"
        );
    }

    /// Eight replicas as every gateway would see them.
    fn fleet() -> Vec<Candidate> {
        (1..=8)
            .map(|i| cand(tag(&format!("10.0.0.{i}:8000")), 0))
            .collect()
    }

    #[test]
    fn hashing_is_xxh3_as_published_and_choices_are_pinned() {
        // XXH3-64 of the empty input, from the xxHash specification's test
        // vectors: any other value means another algorithm.
        assert_eq!(xxh3_64(b""), 0x2D06_8005_38D3_94C2);
        let b = Balance::default();
        let cands = fleet();
        let owners: Vec<usize> = (0..12)
            .map(|i| {
                let prompt = format!(r#""{}""#, format!("conversation {i} ").repeat(40));
                let r = raw(&prompt);
                let key = key(
                    &Prompt {
                        messages: None,
                        prompt: Some(&r),
                    },
                    b.block_bytes,
                    b.affinity_blocks,
                );
                let hint = Hint {
                    key: key.map(|k| k.hash),
                    shared: true,
                    adapter: None,
                };
                let c = choose(&b, &cands, hint, 0).unwrap();
                assert_eq!(c.reason, Reason::Affinity);
                c.index
            })
            .collect();
        // Pinned: the same prompts go to the same replicas in every process
        // and after every restart; a change here moves every cache.
        assert_eq!(owners, PINNED_OWNERS);
    }

    const PINNED_OWNERS: [usize; 12] = [0, 3, 1, 3, 6, 2, 3, 7, 1, 7, 5, 5];

    #[test]
    fn bounded_loads_hold_for_a_hot_prefix() {
        let b = Balance {
            spill_floor: 0.0,
            ..Balance::default()
        };
        let mut cands = fleet();
        let n = cands.len() as f64;
        // One hot key (half the requests) and a long tail; nothing
        // finishes.
        for m in 1..=4000u64 {
            let key = if m % 2 == 0 { 7 } else { m % 97 };
            let hint = Hint {
                key: Some(key),
                shared: true,
                adapter: None,
            };
            let c = choose(&b, &cands, hint, 0).unwrap();
            cands[c.index].load += 1;
            let max = cands.iter().map(|c| c.load).max().unwrap();
            let limit = (b.load_factor * m as f64 / n).ceil() as u64;
            assert!(
                max <= limit,
                "after {m} requests a replica holds {max} > ⌈{} · {m} / 8⌉ = {limit}",
                b.load_factor
            );
        }
    }

    #[test]
    fn a_replica_added_or_removed_moves_only_its_share() {
        let b = Balance::default();
        let owner = |cands: &[Candidate], key: u64| {
            cands[choose(
                &b,
                cands,
                Hint {
                    key: Some(key),
                    shared: true,
                    adapter: None,
                },
                0,
            )
            .unwrap()
            .index]
                .tag
        };
        let all = fleet();
        let fewer: Vec<Candidate> = all[..7].to_vec();
        let gone = all[7].tag;
        let mut moved = 0;
        for key in 0..2000u64 {
            let (before, after) = (owner(&all, key), owner(&fewer, key));
            if before == gone {
                moved += 1;
            } else {
                assert_eq!(before, after, "key {key} moved without cause");
            }
            // Adding the eighth back: a key moves only to it.
            let again = owner(&all, key);
            assert!(again == after || again == gone);
        }
        // About an eighth of the keys were on the removed replica.
        assert!((150..350).contains(&moved), "{moved} of 2000");
    }

    #[test]
    fn an_adapter_narrows_the_choice_while_its_replicas_have_room() {
        let b = Balance {
            load_factor: 1.25,
            spill_floor: 0.1,
            ..Balance::default()
        };
        // Σ load 15 over three limits of 32: each bound is
        // max(⌈1.25 · 16 / 3⌉, ⌈0.1 · 32⌉) = 7.
        let mut cands = [cand(1, 4), cand(2, 6), cand(3, 5)];
        cands[2].has_adapter = true;
        let hint = Hint {
            key: None,
            shared: false,
            adapter: Some(0),
        };
        assert_eq!(
            choose(&b, &cands, hint, 0),
            Some(Choice {
                index: 2,
                reason: Reason::Adapter
            })
        );
        // At its bound (Σ 18: ⌈1.25 · 19 / 3⌉ = 8): anywhere, least
        // loaded.
        cands[2].load = 8;
        assert_eq!(
            choose(&b, &cands, hint, 0),
            Some(Choice {
                index: 0,
                reason: Reason::LeastLoaded
            })
        );
    }
}
