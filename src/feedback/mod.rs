//! Engine feedback: reads what the inference engine says about its own KV cache — vLLM's or SGLang's
//! Prometheus metrics — and corrects kvgate's KV budget with it.
//!
//! kvgate prices each request in the KV cache it *may* need (`prompt + max_tokens`, or a learned share of
//! `max_tokens`); the engine knows what it *does* hold. The two differ: answers end before `max_tokens`,
//! and prefix caching stores a shared system prompt once for many requests, so the engine's cache can sit
//! half empty while kvgate's budget is full. The other way, a KV model that is wrong for the deployed
//! engine, or other clients of the same engine, make the engine run out first — and a vLLM or SGLang
//! that runs out of KV preempts running requests and recomputes them later, which costs the time to
//! first token of everyone behind them.
//!
//! # The pieces (runtime-free; the periodic fetch belongs to the application)
//! - [`EngineMetrics::parse`] reads one scrape (the body of `GET /metrics`), whichever engine it is; the
//!   [`samples`] under it read any Prometheus text exposition.
//! - [`EngineFeedback::update`] compares it with the admission's reservations and moves the KV budget
//!   with [`Admission::set_kv_capacity`](crate::Admission::set_kv_capacity).
//! - [`fetch_metrics`] is a small blocking HTTP/1.1 GET on the standard library, for programs without an
//!   HTTP client.
//!
//! # What is read
//! | quantity | vLLM | SGLang |
//! |---|---|---|
//! | KV cache in use, 0–1 | `vllm:kv_cache_usage_perc` (formerly `vllm:gpu_cache_usage_perc`) | `sglang:token_usage` |
//! | requests waiting in the engine | `vllm:num_requests_waiting` | `sglang:num_queue_reqs` |
//! | requests running | `vllm:num_requests_running` | `sglang:num_running_reqs` |
//! | preemptions (counter) | `vllm:num_preemptions_total` | `sglang:num_retracted_requests_total` |
//!
//! Sources: vLLM's `vllm/v1/metrics/loggers.py` and <https://docs.vllm.ai/en/stable/usage/metrics/>;
//! SGLang's `python/sglang/srt/metrics/collector.py` and
//! <https://docs.sglang.io/references/production_metrics.html>.
//!
//! # The rules, and why
//! 1. **Preemptions rising → shrink at once** (by [`shrink`](FeedbackConfig::shrink), 0.8), and no
//!    growth for a [`cooldown`](FeedbackConfig::cooldown). A preemption is the one unambiguous sign that
//!    the engine ran out; it is counted by the engine, so no sampling misses it.
//! 2. **Engine fuller than the target → shrink toward it**: at a KV use `e` above
//!    [`target_usage`](FeedbackConfig::target_usage) (0.9), the budget becomes `target / e` of itself.
//! 3. **Cache use far below kvgate's estimate → allow more, within bounds**: when kvgate holds `used` of
//!    its budget and the engine is at `e`, a full budget would put the engine at
//!    `e × budget / used`; the budget moves toward `target × used / e` — up by at most
//!    [`max_growth`](FeedbackConfig::max_growth) (10 %) a scrape, down by at most `shrink`. It grows only
//!    when kvgate uses at least [`min_budget_use`](FeedbackConfig::min_budget_use) of its budget (an
//!    idle gate says nothing about the ratio), nothing waits inside the engine, and no preemption is
//!    recent.
//! 4. **Within bounds**: the budget never leaves [`min_factor`](FeedbackConfig::min_factor)–[`max_factor`](FeedbackConfig::max_factor) × the budget the
//!    admission had when the corrector was built (default 0.5–2×).
//!
//! The engine's use lags kvgate's reservations (a request admitted now holds its KV only once prefilled,
//! and grows while it decodes): growth is slow and capped, shrinking is fast, which is what makes the
//! asymmetry safe.
//!
//! # Examples
//!
//! A gateway's timer, with the gateway's own HTTP client or [`fetch_metrics`]:
//!
//! ```no_run
//! use kvgate::Admission;
//! use kvgate::clock::Clock;
//! use kvgate::feedback::{EngineFeedback, EngineMetrics, FeedbackConfig, fetch_metrics};
//! use std::time::Duration;
//!
//! let admission = Admission::builder().kv_capacity_tokens(400_000).build()?;
//! let mut feedback = EngineFeedback::new(admission.clone(), FeedbackConfig::new())?;
//! loop {
//!     std::thread::sleep(Duration::from_secs(5));
//!     match fetch_metrics("http://127.0.0.1:8000/metrics", Duration::from_secs(2))
//!         .and_then(|text| EngineMetrics::parse(&text))
//!     {
//!         Ok(metrics) => {
//!             let correction = feedback.update(Duration::from_nanos(admission.clock().now_nanos()), &metrics);
//!             if correction.changed() {
//!                 eprintln!("KV budget {} -> {} ({})", correction.from, correction.to, correction.reason.as_str());
//!             }
//!         }
//!         Err(error) => eprintln!("engine feedback: {error}"), // the budget stays as it is
//!     }
//! }
//! # #[allow(unreachable_code)]
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod config;
mod correction;
mod corrector;
mod error;
mod exposition;
mod fetch;
mod metrics;

pub use config::FeedbackConfig;
pub use correction::{Correction, CorrectionReason};
pub use corrector::EngineFeedback;
pub use error::FeedbackError;
pub use exposition::{Sample, samples};
pub use fetch::{MAX_BODY, fetch_metrics};
pub use metrics::{EngineKind, EngineMetrics, Quantity};
