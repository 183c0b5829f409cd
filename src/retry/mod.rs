//! Client-side retries: exponential backoff with full jitter that honours a server's `Retry-After`, and
//! a retry budget that keeps retries to a share of first tries.
//!
//! # The schedule
//!
//! After the try numbered `attempt` (0 for the first) fails with a retryable error, the client waits
//!
//! - without a hint: `uniform(0, window(attempt))`, where `window(n) = min(cap, base · 2^n)` — *full
//!   jitter*;
//! - with a server hint `h` (a [`Rejection`](crate::Rejection)'s `retry_after`, an HTTP `Retry-After` header):
//!   `h + uniform(0, window(attempt))`. The retry never comes earlier than the hint, and clients given the
//!   same hint still spread out over the same window they would have used without one. A hint longer
//!   than [`max_retry_after`](RetryPolicy::max_retry_after) (five minutes unless set) makes the client
//!   give up instead: a hostile or broken server cannot park a client for longer than that.
//!
//! and gives up once [`max_tries`](RetryPolicy::max_tries) tries were made, or at once on an error that
//! is not [retryable](RetryHint::is_retryable).
//!
//! # Why full jitter
//!
//! When a server is saturated it rejects many clients at (nearly) the same instant. With plain
//! exponential backoff they all wait `base · 2^n` and come back together, in synchronised waves that hit
//! the server exactly when it is still busy — the thundering herd — and each wave is rejected together
//! again. Full jitter draws each client's delay uniformly from the whole window, so clients rejected
//! together return spread evenly over it: the server sees a steady trickle it can admit instead of a
//! spike. (Marc Brooker, "Exponential Backoff And Jitter", AWS Architecture Blog, 2015, measured full
//! jitter to need the fewest calls and the least total time among the common variants.) For the same
//! reason a server hint is not used as an exact deadline: everyone told "1 s" would return at 1 s sharp.
//!
//! # The retry budget
//!
//! Backoff decides *when* a client retries, not *how much*: under persistent overload every request
//! that fails comes back up to `max_tries - 1` more times, so a client that allows five tries can send
//! five times its usual traffic to a server that is already refusing it — and when each layer of a call
//! chain retries, the factors multiply. Full jitter makes it worse in one respect: spread-out retries
//! arrive at random moments, and each one that takes a slot the server just freed takes it from a new
//! request that arrived at the same moment, so the server spends its scarce capacity on retries while
//! fresh work is turned away.
//!
//! A [`RetryBudget`], shared by all the operations a client sends to one service, bounds the retries
//! themselves: over a sliding window (`ttl`, 10 s by default), retries may be at most a share of the
//! first tries (`percent_can_retry`, 20 % by default) plus a small floor (`min_retries_per_sec`, 10 by
//! default, so that a client with little traffic can still retry a few times). While few requests fail
//! the budget is never felt; when most do, the client sends at most `1 + percent_can_retry` times the
//! traffic it would send without retries, plus the floor, however many tries its policy allows. Give
//! a [`Backoff`] the budget with [`RetryPolicy::backoff_with_budget`], or use [`retry_with_budget`]:
//! the first try is deposited, each retry withdrawn, and a refusal is "give up".
//!
//! The design is Finagle's: its `RetryBudget` (Twitter's RPC library) takes the same three settings
//! with the same defaults and counts first tries in a token bucket whose deposits expire after the
//! ttl; tower's `retry::budget` follows it. gRPC's retry throttling solves the same problem
//! differently: a per-server token count, configured by `maxTokens` and `tokenRatio`, that each failed
//! call lowers by one and each successful call raises by `tokenRatio`, with retries allowed only while
//! the count is above half of `maxTokens`.
//!
//! **The exact rule.** Time is cut into slices of `q = ttl / 10` (in whole nanoseconds); the window at
//! time `t` is the slice holding `t` and the nine before it (at least the last `9q`, at most the last
//! `10q`, which is the ttl to within 10 ns). In a window
//! holding `F` first tries and `W` retries the budget holds `R + p·F - W` retries, where
//! `R = min_retries_per_sec · ttl` and `p = percent_can_retry`;
//! [`try_withdraw`](RetryBudget::try_withdraw) grants a retry (and counts it) iff that is at least 1,
//! and [`balance`](RetryBudget::balance) is it rounded down. Everything is exact integer arithmetic in
//! millionths of a retry: `p` is rounded to the nearest millionth (0.2 is exact), and `ttl` is
//! truncated to whole microseconds in `R` (10 s and 10/s give exactly 100).
//!
//! **The guarantee.** Whenever `try_withdraw` returns `true` at time `t`, the retries granted in the
//! window at `t`, this one included, are at most `R + p ·` the first tries deposited in that window.
//! In real time: *the retries granted in the last `9q` (9 s by default) never exceed `R` plus `p` times
//! the first tries deposited in the last `10q`*. It follows that in any `n` consecutive slices the
//! retries are at most `ceil(n / 10) · R + p ·` the first tries of those slices and the nine before
//! them: in any stretch of time up to `9q` long, at most `R + p ·` the first tries of the stretch and
//! the `ttl` before it; and over a long run, at most `min_retries_per_sec` retries a second plus `p`
//! times the first tries. This holds with any number of threads (two threads never take the same last
//! retry) and for any clock: retries are stamped no earlier than the latest retry, and a first try
//! stamped in the past is counted in its own slice or lost, never counted in a later one.
//!
//! Not promised: "in *every* window, retries ≤ `R + p ·` first tries of the same window". A window that
//! opens just after a burst of first tries holds the retries they paid for but not the first tries;
//! every budget that lets a retry spend earlier first tries — the point of a window — breaks that
//! form. Nor is the floor a rate: as in Finagle, `R` is a reserve for the whole window, so an idle
//! client may spend it at once and then wait for those retries to expire.
//!
//! # Final answers
//!
//! A retry is pointless when the server says so: [`retry_after_for_status`] reads a kvgate server's
//! answer (status, `Retry-After`, `retry-after-ms`) and returns a hint only for a `429` or `503` that
//! carries one; anything else is final. The contract needs no header of its own: a kvgate server sends
//! a hint with every refusal that a later try can overcome, and none when retrying cannot help —
//! `kvgate::http::rejection_response` leaves it out for `Closed`, `TooLarge` and `Invalid`, and an
//! answer to a request whose own deadline has passed must leave it out too — so a client that stops on
//! a missing hint never retries for an answer nobody waits for any more.
//!
//! # Runtime neutrality and determinism
//!
//! Nothing here sleeps on its own: [`retry`] takes the caller's sleep function (`tokio::time::sleep`,
//! `smol::Timer::after`, a fake that records delays in tests). Randomness comes from a small
//! [`SplitMix64`] generator; a policy with a [`seed`](RetryPolicy::seed) produces the same schedule every
//! time, one without draws a fresh seed for every [`Backoff`].
//!
//! # Examples
//!
//! ```
//! use kvgate::retry::{retry, RetryPolicy};
//! use kvgate::{Admission, Request};
//! use std::time::Duration;
//!
//! let admission = Admission::builder().max_in_flight(1).queue_capacity(0).build().unwrap();
//! let policy = RetryPolicy::new().base(Duration::from_millis(50)).cap(Duration::from_secs(2)).max_tries(4);
//! let permit = futures::executor::block_on(retry(
//!     &policy,
//!     || async { admission.try_admit(&Request::new(100, 100)) },
//!     |delay| async move { let _ = delay; /* tokio::time::sleep(delay).await */ },
//! ));
//! assert!(permit.is_ok());
//! ```
//!
//! # Where each part lives
//!
//! | file | holds |
//! |---|---|
//! | `policy.rs` | [`RetryPolicy`]: the schedule (base, cap, tries, the longest hint) and [`DEFAULT_MAX_RETRY_AFTER`] |
//! | `backoff.rs` | [`Backoff`], one operation's state, and the `RetryPolicy` methods that start one, with or without a budget |
//! | `run.rs` | [`retry`] and [`retry_with_budget`], the runtime-neutral loop |
//! | `hint.rs` | [`RetryHint`]: may an error be retried, and after how long |
//! | `header.rs` | `Retry-After` / `retry-after-ms` parsing, and [`retry_after_for_status`] |
//! | `rng.rs` | [`SplitMix64`] |
//! | `budget/` | [`RetryBudget`]: windows of tagged atomic counters, exact integer terms, the withdrawal lock |

mod backoff;
mod budget;
mod header;
mod hint;
mod policy;
mod rng;
mod run;

pub use backoff::Backoff;
pub use budget::{DEFAULT_BUDGET_TTL, DEFAULT_MIN_RETRIES_PER_SEC, DEFAULT_PERCENT_CAN_RETRY, RetryBudget};
pub use header::{
    ParseRetryAfterError, parse_retry_after, parse_retry_after_at, parse_retry_after_ms, retry_after_for_status,
    retry_after_from_headers,
};
pub use hint::RetryHint;
pub use policy::{DEFAULT_MAX_RETRY_AFTER, RetryPolicy};
pub use rng::SplitMix64;
pub use run::{retry, retry_with_budget};
