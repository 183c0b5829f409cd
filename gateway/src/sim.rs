//! The built-in simulated LLM backend: streams words at a configurable rate, slows down as its batch
//! grows, and keeps score of what it was asked to hold.
//!
//! It is the *engine* behind the gateway, so it keeps its own books, independent of the admission in
//! front of it: sequences running and KV units held (the request's `prompt + max_tokens` priced like the
//! admission prices it, so that a peak can be compared with the budget). It refuses — with a 503 and an
//! `overflows` count, where a real engine would run out of memory or preempt — any sequence that would
//! take it past its batch limit or KV budget. With the gateway in front, `overflows` stays 0 and the
//! recorded peaks stay within the limits; the tests and the demo check exactly that.

use crate::error::ApiError;
use axum::body::Body;
use bytes::Bytes;
use futures::stream::{self, StreamExt};
use kvgate::openai::{CompletionRequest, Endpoint};
use serde_json::{Value, json};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// How the simulated engine behaves.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    /// Tokens per second of one sequence running alone.
    pub tokens_per_sec: f64,
    /// Per extra running sequence, each sequence's token interval grows by this fraction
    /// (0.02: with 33 sequences every token takes 1.64× as long).
    pub slowdown_per_seq: f64,
    /// Sequences the engine can batch (vLLM's `max_num_seqs`).
    pub max_seqs: usize,
    /// KV units it can hold (tokens, or bytes with a KV model); `u64::MAX`: unlimited.
    pub kv_budget: u64,
}

/// What the simulated engine saw (for `/metrics` and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Sequences running now.
    pub running: usize,
    /// KV units held now.
    pub kv_in_use: u64,
    /// Most sequences ever running at once.
    pub peak_running: usize,
    /// Most KV units ever held at once.
    pub peak_kv_in_use: u64,
    /// Sequences refused because they would have exceeded `max_seqs` or `kv_budget`.
    pub overflows: u64,
    /// Sequences started.
    pub started: u64,
    /// Sequences finished (or abandoned by their client).
    pub finished: u64,
    /// Tokens generated.
    pub tokens_generated: u64,
    /// The engine's batch limit.
    pub max_seqs: usize,
    /// The engine's KV budget.
    pub kv_budget: u64,
}

/// The simulated engine. Cheap to share (`Arc`).
#[derive(Debug)]
pub struct SimBackend {
    config: SimConfig,
    running: AtomicUsize,
    kv_in_use: AtomicU64,
    peak_running: AtomicUsize,
    peak_kv: AtomicU64,
    overflows: AtomicU64,
    started: AtomicU64,
    finished: AtomicU64,
    tokens: AtomicU64,
    ids: AtomicU64,
}

/// A running sequence's hold on the engine; dropping it (end of generation, or the client went away and
/// the stream was dropped) frees the slot and the KV.
#[derive(Debug)]
struct Sequence {
    engine: Arc<SimBackend>,
    kv: u64,
}

impl Drop for Sequence {
    fn drop(&mut self) {
        self.engine.kv_in_use.fetch_sub(self.kv, Ordering::AcqRel);
        self.engine.running.fetch_sub(1, Ordering::AcqRel);
        self.engine.finished.fetch_add(1, Ordering::Relaxed);
    }
}

const WORDS: &[&str] = &[
    "the",
    "cache",
    "holds",
    "every",
    "token",
    "of",
    "context",
    "so",
    "admission",
    "waits",
    "until",
    "memory",
    "frees",
    "and",
    "then",
    "a",
    "request",
    "runs",
    "to",
    "its",
    "end",
    "while",
    "others",
    "queue",
    "fairly",
];

impl SimBackend {
    /// A simulated engine behaving as `config` says.
    pub fn new(config: SimConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
            running: AtomicUsize::new(0),
            kv_in_use: AtomicU64::new(0),
            peak_running: AtomicUsize::new(0),
            peak_kv: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
            ids: AtomicU64::new(0),
        })
    }

    /// A copy of the books.
    pub fn stats(&self) -> SimStats {
        SimStats {
            running: self.running.load(Ordering::Acquire),
            kv_in_use: self.kv_in_use.load(Ordering::Acquire),
            peak_running: self.peak_running.load(Ordering::Acquire),
            peak_kv_in_use: self.peak_kv.load(Ordering::Acquire),
            overflows: self.overflows.load(Ordering::Acquire),
            started: self.started.load(Ordering::Acquire),
            finished: self.finished.load(Ordering::Acquire),
            tokens_generated: self.tokens.load(Ordering::Acquire),
            max_seqs: self.config.max_seqs,
            kv_budget: self.config.kv_budget,
        }
    }

    /// Takes a batch slot and `kv` units, or refuses (counting an overflow) if either would go over.
    fn start(self: &Arc<Self>, kv: u64) -> Option<Sequence> {
        let slot = self
            .running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.config.max_seqs).then_some(n + 1));
        let Ok(previous) = slot else {
            self.overflows.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let taken = self.kv_in_use.fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
            used.checked_add(kv).filter(|&total| total <= self.config.kv_budget)
        });
        let Ok(used) = taken else {
            self.running.fetch_sub(1, Ordering::AcqRel);
            self.overflows.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        self.peak_running.fetch_max(previous + 1, Ordering::AcqRel);
        self.peak_kv.fetch_max(used + kv, Ordering::AcqRel);
        self.started.fetch_add(1, Ordering::Relaxed);
        Some(Sequence { engine: Arc::clone(self), kv })
    }

    /// The interval between two tokens of one sequence at the current batch size.
    fn token_interval(&self) -> Duration {
        let batch = self.running.load(Ordering::Relaxed).max(1);
        let factor = 1.0 + self.config.slowdown_per_seq * (batch - 1) as f64;
        Duration::from_secs_f64(factor / self.config.tokens_per_sec)
    }

    /// Generates a completion for an admitted request holding `kv` units: an SSE stream (`stream: true`)
    /// or one JSON body after the whole generation. Answers 503 if the engine is full (an overflow).
    pub async fn complete(
        self: &Arc<Self>,
        request: &CompletionRequest,
        kv: u64,
        served_model: &str,
    ) -> http::Response<Body> {
        let Some(sequence) = self.start(kv) else {
            let message = "simulated engine out of batch slots or KV memory";
            let err = ApiError::new(http::StatusCode::SERVICE_UNAVAILABLE, "engine_overloaded", message);
            return err.to_response().map(Body::from);
        };
        let id = format!("kvgate-sim-{}", self.ids.fetch_add(1, Ordering::Relaxed));
        let model = if request.model.is_empty() { served_model.to_owned() } else { request.model.clone() };
        let created = unix_now();
        // Real models often stop before max_tokens: stop somewhere in its upper half.
        let tokens = (request.max_tokens / 2
            + (request.prompt_tokens.wrapping_mul(2_654_435_761) % (request.max_tokens / 2 + 1)))
            .max(1);
        let finish = if tokens == request.max_tokens { "length" } else { "stop" };
        let endpoint = request.endpoint;
        if !request.stream {
            let mut text = String::new();
            for i in 0..tokens {
                tokio::time::sleep(self.token_interval()).await;
                text.push_str(WORDS[i as usize % WORDS.len()]);
                text.push(' ');
                self.tokens.fetch_add(1, Ordering::Relaxed);
            }
            drop(sequence);
            let body = full_response(endpoint, &id, &model, created, &text, finish, request.prompt_tokens, tokens);
            return json_response(&body);
        }
        // The stream owns the sequence and drops it after its last event, before it ends; if the client
        // goes away, the server drops the stream and with it the sequence.
        struct Gen {
            sequence: Option<Sequence>,
            next: u32,
        }
        let opener = sse(&chunk(endpoint, &id, &model, created, None, None));
        let (include_usage, prompt_tokens) = (request.include_usage, request.prompt_tokens);
        let engine = Arc::clone(self);
        let events = stream::unfold(Gen { sequence: Some(sequence), next: 0 }, move |mut state| {
            let engine = Arc::clone(&engine);
            let (id, model) = (id.clone(), model.clone());
            async move {
                let event = if state.next < tokens {
                    tokio::time::sleep(engine.token_interval()).await;
                    engine.tokens.fetch_add(1, Ordering::Relaxed);
                    let word = format!("{} ", WORDS[state.next as usize % WORDS.len()]);
                    sse(&chunk(endpoint, &id, &model, created, Some(&word), None))
                } else if state.next == tokens {
                    sse(&chunk(endpoint, &id, &model, created, None, Some(finish)))
                } else if state.next == tokens + 1 && include_usage {
                    // `stream_options.include_usage`: one more chunk, with no choices and the usage.
                    let usage = usage(prompt_tokens, tokens);
                    let object = if endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
                    sse(
                        &json!({ "id": id, "object": object, "created": created, "model": model, "choices": [], "usage": usage }),
                    )
                } else if state.next == tokens + 1 || (state.next == tokens + 2 && include_usage) {
                    state.next = tokens + 2;
                    Bytes::from_static(SSE_DONE)
                } else {
                    drop(state.sequence.take());
                    return None;
                };
                state.next += 1;
                Some((Ok::<_, Infallible>(event), state))
            }
        });
        let body = stream::once(async move { Ok::<_, Infallible>(opener) }).chain(events);
        sse_response(Body::from_stream(body))
    }
}

/// `200` with a JSON body.
pub fn json_response(value: &serde_json::Value) -> http::Response<Body> {
    http::Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(value).expect("JSON values serialize")))
        .expect("a valid response")
}

/// `200` with an SSE body.
pub fn sse_response(body: Body) -> http::Response<Body> {
    http::Response::builder()
        .header(http::header::CONTENT_TYPE, "text/event-stream")
        .header(http::header::CACHE_CONTROL, "no-cache")
        .body(body)
        .expect("a valid response")
}

/// Seconds since the Unix epoch, for `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One SSE event carrying `value`.
pub fn sse(value: &Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, value).expect("JSON values serialize");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The SSE stream's end marker.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

/// A streamed chunk with `text` (or the role opener / finish chunk).
pub fn chunk(
    endpoint: Endpoint,
    id: &str,
    model: &str,
    created: u64,
    text: Option<&str>,
    finish: Option<&str>,
) -> Value {
    match endpoint {
        Endpoint::Chat => {
            let delta = match (text, finish) {
                (Some(t), _) => json!({ "content": t }),
                (None, None) => json!({ "role": "assistant", "content": "" }),
                (None, Some(_)) => json!({}),
            };
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
            })
        }
        Endpoint::Completions => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{ "index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish }],
        }),
    }
}

/// A whole (non-streamed) response.
#[allow(clippy::too_many_arguments)]
pub fn full_response(
    endpoint: Endpoint,
    id: &str,
    model: &str,
    created: u64,
    text: &str,
    finish: &str,
    prompt: u32,
    completion: u32,
) -> Value {
    let usage = usage(prompt, completion);
    match endpoint {
        Endpoint::Chat => json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": finish }],
            "usage": usage,
        }),
        Endpoint::Completions => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }],
            "usage": usage,
        }),
    }
}

/// The `usage` object.
fn usage(prompt: u32, completion: u32) -> Value {
    json!({ "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt.saturating_add(completion) })
}
