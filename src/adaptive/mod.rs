//! Adaptive concurrency: a controller that moves an [`Admission`](crate::Admission)'s `max_in_flight`
//! between bounds so that the time to first token (TTFT) stays within an SLO — the operator states the
//! latency users were promised, not a concurrency limit guessed for one traffic mix.
//!
//! The controller is optional and runtime-free: the application reports what happens to admitted requests
//! ([`AdaptiveConcurrency::observe`] with an [`Observation`]) and calls [`AdaptiveConcurrency::tick`] with
//! the admission clock's time. It acts only through [`Admission::set_max_in_flight`](crate::Admission::set_max_in_flight).
//!
//! # The signals, and why these
//! - **TTFT from admission, its own prefill discounted** (always). TTFT is what the SLO is about, and it
//!   answers a limit change within one prefill (a second or two), where end-to-end latency answers only
//!   after whole generations. But a raw TTFT mixes two things: the wait behind other work, which the limit
//!   controls, and the request's own prefill, which grows with its prompt and which no limit can shorten.
//!   A controller fed raw TTFTs reads a shift to long documents as congestion and cuts the limit for
//!   nothing. So each sample is normalised per prompt token: the controller fits the prefill time per
//!   prompt token (the slope of TTFT against prompt length over the decision's samples, which a delay
//!   common to all requests does not bias) and measures each request's *queueing delay*
//!   `TTFT − prompt_tokens × per_token`.
//! - **Time per output token** (optional, [`AdaptiveConfig::tpot_slo`]): per token by construction, it
//!   measures decode congestion — a batch so large that every step is slow, or a KV cache so full that
//!   the engine preempts. But it lags (a sample exists only once a generation ends, and averages its whole
//!   decode), and it has a floor that no limit removes: every step that carries a chunk of a long prompt's
//!   prefill is slow for every sequence decoding in it. So it only *stops growth* — it keeps the limit
//!   from growing into a congestion that TTFT shows only later — and never lowers the limit by itself.
//!
//! # The control law (one decision per [`interval`](AdaptiveConfig::interval), given at least
//! [`min_samples`](AdaptiveConfig::min_samples) TTFT samples)
//! ```text
//! load = q(queueing delay) / (target_share × ttft_slo)      tpot_load = q(TPOT) / tpot_slo      q: quantile (p90)
//! load > 1                          → min(limit, in flight) × max(1/load, max_backoff), at least one less;
//!                                     that concurrency becomes the ceiling for ceiling_ttl
//! tolerance ≤ load ≤ 1              → hold (the dead band)
//! tpot_load ≥ tolerance             → hold (decode is slow: do not add to it)
//! otherwise, < 90 % of slots in use → hold (no evidence that more would be used)
//! otherwise                         → limit × min(tolerance/load, max_growth), at least one more, at most
//!                                     the burst budget more; from 0.9 to 1.5 × the ceiling +2 %; not up to
//!                                     the ceiling for ceiling_ttl after the miss (or until five quiet
//!                                     decisions just below it show that the miss was a burst)
//! no first token at all for 10 intervals (and 2 × SLO) while requests were admitted → limit × max_backoff
//! ```
//!
//! The **burst budget** is an LLM-specific bound on increases: a raised limit admits the requests that
//! were refused or queued *at once*, and their prefills queue in the engine ahead of each other. One
//! increase may release at most the requests whose prefills (mean prompt × the fitted time per prompt
//! token) take half the TTFT target, so that growing the limit does not by itself break the target.
//!
//! # Known pitfalls of gradient controllers, and what this one does about them
//! - **A drifting minimum RTT.** Netflix's Gradient2 compares a short-term latency with a long-term one
//!   that follows the short-term one under sustained load, so after a while overload looks normal and the
//!   limit stops falling; Envoy's adaptive concurrency compares with a minimum RTT that must be
//!   re-measured by periodically dropping concurrency to a few requests (a throughput dip every interval),
//!   and that is stale in between. Here the reference is the operator's SLO, which does not drift, and
//!   nothing measured is kept beyond a decision except the smoothed prefill slope (an average of fits, not
//!   a minimum, so it cannot ratchet). No probing dip is needed.
//! - **Oscillation.** Each decision sees only samples of requests admitted *after* the last change (a
//!   request admitted under the old limit describes the old limit), so one overload is not punished
//!   twice; a dead band between `tolerance × target` and the target holds the limit; decreases are in
//!   proportion to the overshoot, not a fixed halving; increases are small (10 % and the burst budget);
//!   and after a miss the limit stays below where it missed for [`ceiling_ttl`](AdaptiveConfig::ceiling_ttl)
//!   (unless five decisions in a row just below it find the load under half the tolerance: the miss was
//!   a burst, such as a cold start, not the knee), approaching it by about 2 % a decision — and re-probes
//!   past it just as slowly afterwards (so that a changed workload is found about once a minute, without
//!   a burst into the knee every few seconds).
//! - **Collapse under a latency floor.** A latency that does not come from concurrency (long prompts,
//!   network time) drives a latency-ratio controller to its minimum, where throughput collapses and the
//!   latency does not improve. The per-token discount removes the floor that LLM traffic has in its TTFT
//!   — the prefill of long prompts; the TPOT, whose floor is the prefills interleaved with decoding, can
//!   only stop growth; decreases start from the concurrency in flight, so lowering a limit that does not
//!   bind (a KV budget binds first) is never mistaken for a remedy; and the limit never goes below
//!   [`min_limit`](AdaptiveConfig::min_limit): set it to the concurrency below which the engine's
//!   throughput falls apart.
//! - **Inflation without evidence.** The limit grows only while at least 90 % of it is in use, so an idle
//!   period, or a KV budget that binds first, cannot inflate it into a burst later.
//! - **Silence is not health.** When requests are admitted but no first token comes back for ten
//!   intervals and twice the SLO, the limit goes down; an [`Observation::Abandoned`] (a request that left
//!   without a first token) counts as a TTFT of at least its wait.
//!
//! # Invariants
//! - The limit stays within the configured bounds; it changes only in [`tick`](AdaptiveConcurrency::tick),
//!   at most once per interval.
//! - Memory is fixed when the controller is built: at most two sample windows of
//!   [`window`](AdaptiveConfig::window) entries and one scratch buffer; `observe` never allocates.
//! - Determinism: the controller reads no clock; the same observations and ticks give the same limits.
//!
//! # Examples
//!
//! A server shares the controller between its handlers behind a mutex and ticks it on every
//! observation:
//!
//! ```
//! use kvgate::adaptive::{AdaptiveConcurrency, AdaptiveConfig, Observation};
//! use kvgate::clock::{Clock, ManualClock};
//! use kvgate::{Admission, Request};
//! use parking_lot::Mutex;
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let clock = ManualClock::new(); // a server uses the default MonotonicClock
//! let admission = Admission::builder().clock(clock.clone()).kv_capacity_tokens(1_000_000).build()?;
//! let controller = Arc::new(Mutex::new(AdaptiveConcurrency::new(
//!     admission.clone(),
//!     AdaptiveConfig { min_limit: 4, max_limit: 512, ..AdaptiveConfig::new(Duration::from_secs(2)) },
//! )?));
//! let now = || Duration::from_nanos(admission.clock().now_nanos());
//!
//! // In a handler:
//! let permit = admission.try_admit(&Request::new(1200, 512)).unwrap();
//! clock.advance(Duration::from_millis(300)); // ... the first token streams out ...
//! let first_token_at = now();
//! {
//!     let mut c = controller.lock();
//!     c.observe(Observation::first_token(&permit, first_token_at));
//!     c.tick(now());
//! }
//! clock.advance(Duration::from_secs(4)); // ... the last token streams out ...
//! controller.lock().observe(Observation::finished(180, first_token_at, now()));
//! permit.complete(180);
//! # Ok::<(), kvgate::ConfigError>(())
//! ```

mod config;
mod controller;
mod decision;
mod law;
mod observation;
mod window;

pub use config::{AdaptiveConfig, MAX_WINDOW};
pub use controller::AdaptiveConcurrency;
pub use decision::{Decision, Reason};
pub use observation::Observation;
