//! A lock-free, weighted GCRA token bucket with refunds and runtime rate changes.
//!
//! # Algorithm
//!
//! [`TokenBucket`] implements the Generic Cell Rate Algorithm (GCRA, ITU-T I.371; the "virtual
//! scheduling" form used by governor and redis-cell), but measured in **tokens** instead of time, so that
//! the only state that changes on the hot path is one `AtomicU64`.
//!
//! **The level axis.** The configuration defines a non-decreasing, piecewise-linear function of time,
//! the *level*
//!
//! ```text
//! L(t) = level0 + floor((t - base_ns) * mult / 2^96)      (t >= base_ns; L(t) = level0 for t < base_ns)
//! ```
//!
//! where `mult / 2^96` is the refill rate in tokens per nanosecond as an unsigned fixed-point number with
//! 96 fractional bits (`mult <= 2^96` because the rate is at most 10^9/s = 1/ns). `L(t)` is a
//! tokens-valued clock: it starts at `max(burst, 2^63)` and counts every whole token accrued since. The
//! 2^63 head start keeps `L - burst >= 0` when `set_rate` raises the burst, so `tat` never needs to be
//! negative. `L` saturates at `u64::MAX`, so a bucket grants at least 2^63 tokens over its lifetime
//! (292 years at the maximum rate of 10^9/s) and then stops refilling; and a bucket holds at most
//! `min(burst, L)` tokens, which differs from `burst` only for bursts above 2^63 set at run time.
//!
//! **The state** is `tat` ("theoretical arrival time", in tokens): the level at which every token granted
//! so far would have been paid for:
//!
//! ```text
//! start(t)     = max(tat, L(t) - burst)             // tat, clamped so that the bucket holds <= burst
//! available(t) = L(t) - start(t)                    // 0 if start(t) > L(t)
//! acquire(n) at t succeeds  iff  start(t) + n <= L(t),  and then sets  tat = start(t) + n
//! refund(n)  at t                                   sets  tat = max(start(t) - n, L(t) - burst)
//! ```
//!
//! A new bucket has `level0 = max(burst, 2^63)`, `tat = level0 - burst`, so it starts full. Every quantity is a `u64`
//! bounded by `L(t) <= u64::MAX`, so nothing overflows for any `n` or `now_nanos`.
//!
//! **No drift.** `L(t)` is computed from the fixed origin `base_ns`, never by adding per-call increments,
//! so rounding never accumulates: the number of tokens granted in `[base_ns, t]` by a greedy caller is
//! exactly `burst + floor((t - base_ns) * mult / 2^96)`, and for every integer rate (and decimal rates
//! such as 0.001/s) that is exactly `burst + floor(rate * (t - base_ns))`. The proof, and how `mult` is
//! computed from the `f64` rate without floating-point products, are in `gcra.rs`.
//!
//! **Rate changes** ([`TokenBucket::set_rate`]) at time `T` (read before the configuration's write lock
//! is taken), holding that lock: first raise `tat` to `start_old(T) = max(tat, L_old(T) - burst_old)` (a
//! CAS loop; this changes nothing the old configuration can observe at or after `T`), then start a new
//! linear piece `base_ns = T`, `level0 = L_old(T)` (at the old piece's start instead, if a concurrent
//! change already started one later than `T`), so `L` is continuous and `tat` keeps its units. Then
//! `available_new(T) = min(available_old(T), burst_new)`. The new configuration does not depend on `tat`,
//! and the normalization only ever raises `tat` to a value every later operation of the old configuration
//! also produces, so an acquire that computed with the old configuration and commits its CAS after the
//! change is equivalent to the same acquire ordered just before it: every operation linearizes at its CAS
//! on `tat` (or its load, for refusals and peeks) against the configuration it read. (The one exception
//! is a refund stamped with a time *before* `T` that gives back more than the bucket lacked: it may keep
//! up to `n` of the surplus that a sequential run would have dropped.) The sub-token progress towards the
//! next token is discarded at a rate change (less than one token; the level restarts on an integer).
//!
//! # Memory orderings
//!
//! * `tat` is only ever accessed with `Relaxed` loads and CASes: it is a single-word state machine that
//!   publishes no other memory, and every decision depends on the one value the CAS validates.
//! * The configuration fields are atomics guarded by a seqlock (`version`, odd while being written);
//!   `config.rs` gives the orderings of both sides and why a torn read is always retried.
//!
//! On x86-64 the read side compiles to plain loads; the hot path is one seqlock read, two 64x64
//! multiplications and one CAS, and allocates nothing.
//!
//! # Where each part lives
//!
//! | file | holds |
//! |---|---|
//! | `token_bucket.rs` | [`TokenBucket`]: the public API and the CAS loops on `tat` |
//! | `gcra.rs` | the level arithmetic as pure functions of one configuration (`Gcra`), the checked rate and burst (`Quota`), the fixed-point multiplier, the exact waits, and the no-drift proof |
//! | `config.rs` | the seqlock'd configuration (`Config`): one consistent `Gcra` for readers, serialized writers |
//! | `error.rs` | [`AcquireError`] |
//!
//! # Invariants a change must keep
//!
//! 1. `tat` changes only by compare-and-swap, never by a plain store: a store loses a concurrent acquire
//!    (the loom model `two_threads_race_for_the_last_tokens` fails on it).
//! 2. `L(t)` is evaluated from `base_ns` and `level0` in one product, never accumulated from per-call
//!    increments: accumulation brings back the drift that the no-drift proof rules out.
//! 3. Every configuration field is read and written through `Config` (`load`/`store` of the whole `Gcra`,
//!    inside the seqlock); a field read outside it can pair a new `level0` with an old `base_ns` (the loom
//!    model `set_rate_races_available` fails on it).
//! 4. `set_rate` raises `tat` to the old clamp before it publishes the new configuration; publishing first
//!    lets a larger burst resurrect tokens the old one dropped.
//! 5. No user code runs while the configuration's write side is held: `set_rate` reads the clock before it
//!    locks, so a clock that panics cannot leave the version odd and every reader spinning.
//! 6. The hot path stays integer-only and saturating: every quantity is bounded by `L(t) <= u64::MAX`, and
//!    the `#[inline]` on the seqlock read and the level arithmetic keeps them in the caller's code unit.

mod config;
mod error;
mod gcra;
mod token_bucket;

pub use error::AcquireError;
pub use token_bucket::TokenBucket;
