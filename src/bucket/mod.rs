//! A lock-free, weighted GCRA token bucket with refunds and runtime rate changes.
//!
//! # Algorithm
//!
//! [`TokenBucket`] implements the Generic Cell Rate Algorithm (GCRA, ITU-T I.371; the "virtual
//! scheduling" form used by governor and redis-cell), but measured in fine-grained **units** of a token
//! instead of time, so that the only state that changes on the hot path is one `AtomicU64`, every rate
//! from 0.001/s to 10^9/s is exact with no drift, and a full bucket banks no progress towards a token it
//! cannot hold.
//!
//! **The unit.** A token is `unit` units, `unit = max(1, min(floor(10^9 / rate), floor(2^61 / burst)))`,
//! computed exactly from the `f64` rate. The first bound makes the level gain at most one unit per
//! nanosecond, and at least `1 - rate / 10^9` of one, so one unit accrues in `u` ns with `1 <= u < 2`:
//! exactly 1 ns whenever `10^9 / rate` is an integer (1/s, 5/s, 1000/s, 10^6/s, 10^9/s, ...), less than
//! `1 / (1 - rate / 10^9)` ns otherwise (a millionth of a ns above 1 ns at 1000/s), and at rates above
//! `5 * 10^8`/s the unit is the token. The second
//! bound keeps a full bucket within `2^61` units: it is the smaller one only for a burst that takes longer
//! than `2^61` units (73 years or more) to refill, whose unit is then `u = 1 / (rate * unit)` s. Bursts above
//! `2^61` tokens have `unit = 1` and hold at most `2^61` tokens (`cap = min(burst, 2^61) * unit` units).
//!
//! **The level axis.** The configuration defines a non-decreasing, piecewise-linear function of time, the
//! *level*, in units:
//!
//! ```text
//! L(t) = min(level0 + floor((t - base_ns) * mult / 2^96), 2^63 - 1)   (t >= base_ns; L(t) = level0 for t < base_ns)
//! ```
//!
//! where `mult / 2^96` is the refill rate in units per nanosecond as an unsigned fixed-point number with 96
//! fractional bits, `mult = ceil(rate * unit * 2^96 / 10^9) <= 2^96` (`= 2^96`, one unit per ns, exactly
//! when `10^9 / rate` is an integer: the hot path then skips the multiplication). A new bucket starts at
//! `level0 = cap`. The level of one configuration saturates at `2^63 - 1`, at least `3 * 2^61 - 1` units
//! after the configuration starts (219 years at one unit per nanosecond, the fastest): the bucket then stops
//! refilling until the next rate change, and an acquire it can no longer serve is refused as
//! [`AcquireError::NeverFits`].
//!
//! **The state** is `tat` ("theoretical arrival time", on the level axis): bit 63 is the configuration's
//! *generation* (see rate changes) and bits 0..63 the level at which every token granted so far would have
//! been paid for. Every level of a configuration carries the same generation bit, so the arithmetic below
//! is plain `u64` arithmetic that never leaves the generation:
//!
//! ```text
//! cost(n)      = n * unit,   cap = min(burst, 2^61) * unit
//! start(t)     = max(tat, L(t) - cap)                    // tat, clamped so that the bucket holds <= cap
//! available(t) = floor((L(t) - start(t)) / unit)         // 0 if start(t) > L(t)
//! acquire(n) at t succeeds  iff  start(t) + cost(n) <= L(t),  and then sets  tat = start(t) + cost(n)
//! refund(n)  at t                                        sets  tat = max(tat - cost(n), L(t) - cap)
//! ```
//!
//! A new bucket has `tat = level0 - cap = 0`, so it starts full. Every quantity is a `u64` bounded by the
//! generation's `2^63 - 1`, so nothing overflows for any `n` or `now_nanos`.
//!
//! # What the bucket guarantees
//!
//! The bucket is exactly a token bucket whose **units** arrive one at a time, at the instants where the
//! real-valued level crosses an integer, which holds at most `cap` units and charges `unit` units a token.
//! (GCRA with its clamp taken in whole units is that bucket: `start` only ever drops the progress towards
//! the next *unit*.) Hence, with `u = 2^96 / mult` ns the time one unit takes to accrue and
//! `rate' = mult / (unit * 2^96)` per ns the rate rounded up to the fixed point (less than `2^-96 / unit`
//! tokens per ns above `rate`, less than `2^-32 / unit` tokens over the whole 2^64 ns clock):
//!
//! * **The GCRA bound.** In every window `[t0, t1]` of one configuration, the tokens granted net of those
//!   given back number at most `burst + rate' * (t1 - t0 + u)` (exactly: at most `cap + ceil((t1 - t0) *
//!   mult / 2^96)` units): governor's "at most `burst + rate * t` in any window of length `t`", up to one
//!   unit, under 2 ns of refill. A full bucket keeps less than one unit of progress, never progress
//!   towards a token it cannot hold: after a burst drains a full bucket at `t`, the next token comes
//!   between `1 / rate' - u` and `1 / rate'` after `t` (exactly `1 / rate` when `u` is 1 ns).
//! * **No drift.** `L(t)` is computed from the fixed origin `base_ns`, never by adding per-call increments,
//!   so rounding never accumulates: a greedy caller is granted exactly
//!   `burst + floor((t - base_ns) * mult / (unit * 2^96))` tokens in `[base_ns, t]`, and for every integer
//!   rate (and decimal rates such as 0.001/s, over years) that is exactly `burst + floor(rate * (t -
//!   base_ns))`. The proof, and how `unit` and `mult` are computed from the `f64` without floating-point
//!   products, are in `gcra.rs`.
//! * **Exact hints.** A refusal's `retry_after` is the exact minimal wait: the acquire fails at `now +
//!   retry_after - 1 ns` and succeeds at `now + retry_after` (absent other callers).
//!
//! `tests/bucket_proptest.rs` checks all three against an exact sequential model in units, and the first
//! directly, in every window of every generated run, at the rate as given.
//!
//! # Rate changes
//!
//! [`TokenBucket::set_rate`] at time `T` (read before the configuration's write lock is taken), holding
//! that lock:
//!
//! 1. builds the next configuration: a new linear piece from `max(T, base_ns)`, in the other generation,
//!    on the level `L_old(T)` if that is at most `2^61` (raised to the new `cap` if below it), else on the
//!    new `cap`;
//! 2. converts `tat` into it with a CAS loop: the units held at `T` become `floor(held / unit_old)` tokens
//!    and the progress towards the next token, both in the new unit (the progress rounded down), capped at
//!    the new `cap`, and `tat = level0_new - held_new`; a debt (a `tat` above the level, left by a time
//!    supplied from the future) stays a debt of the same tokens, rounded up;
//! 3. publishes the configuration.
//!
//! So `available_new(T) = min(available_old(T), burst_new)`, and the progress towards the next token
//! survives the change (less than one new unit of it is lost).
//!
//! **Linearization.** Every operation reads the configuration and `tat` in one seqlock read, so the two
//! belong to the same generation, and commits with a CAS on the whole word. The conversion flips the
//! generation bit, so an acquire or refund that read the old configuration either commits before the
//! conversion (and the conversion carries its effect over) or fails its CAS and starts again from a fresh
//! read (spinning until the new configuration is published): every operation linearizes at its CAS on
//! `tat` (or at its read, for refusals and peeks), the rate change at its conversion. Without the bit,
//! the conversion of an empty bucket leaves `tat`'s value unchanged and a stale refund would commit in the
//! old unit (the loom model `refund_races_set_rate` fails then).
//!
//! The one caveat is the generation's single bit: an operation suspended between its read and its CAS
//! for the whole of **two** rate changes, that then finds `tat` holding exactly the word it read, would
//! commit with the configuration of two changes before. Rate changes are serialized and take the write
//! side of the seqlock, and `tat` is a level value that moves on with time, so this needs a thread paused
//! inside a window of a few instructions while two `set_rate` calls complete and `tat` comes back to the
//! same value. A second bit would halve the level's range, and the lifetime with it.
//!
//! # Memory orderings
//!
//! * `tat` is only ever accessed with `Relaxed` loads and CASes: it is a single-word state machine that
//!   publishes no other memory, and every decision depends on the one value the CAS validates.
//! * The configuration fields are atomics guarded by a seqlock (`version`, odd while being written), and
//!   the read of `tat` that goes with them is taken inside the same read; `config.rs` gives the orderings
//!   of both sides, why a torn read is always retried, and why a conversion of `tat` is seen as one.
//!
//! On x86-64 the read side compiles to plain loads; the hot path is one seqlock read (the version, seven
//! fields and `tat`, in two cache lines), at most two 64x64 multiplications (none when the unit is one
//! nanosecond) and one CAS, it allocates nothing, and everything else (refusals and their hints, `n == 0`,
//! `n > burst`, a rate change in between) is in a cold slow path that starts again from a fresh read.
//!
//! # Where each part lives
//!
//! | file | holds |
//! |---|---|
//! | `token_bucket.rs` | [`TokenBucket`]: the public API and the CAS loops on `tat` |
//! | `gcra.rs` | the level arithmetic as pure functions of one configuration (`Gcra`), the checked rate and burst with their unit and multiplier (`Quota`), the exact waits, the conversion of `tat` at a rate change, and the no-drift proof |
//! | `config.rs` | the seqlock'd configuration (`Config`): one consistent `Gcra` (and `tat`) for readers, serialized writers |
//! | `error.rs` | [`AcquireError`] |
//!
//! # Invariants a change must keep
//!
//! 1. `tat` changes only by compare-and-swap, never by a plain store: a store loses a concurrent acquire
//!    (the loom model `two_threads_race_for_the_last_tokens` fails on it).
//! 2. `L(t)` is evaluated from `base_ns` and `level0` in one product, never accumulated from per-call
//!    increments: accumulation brings back the drift that the no-drift proof rules out.
//! 3. Every configuration field is read and written through `Config` (`read_with`/`store` of the whole
//!    `Gcra`, inside the seqlock), and `tat` is read in the same seqlock read: a field read outside it can
//!    pair a new `level0` with an old `base_ns` (the loom model `set_rate_races_available` fails on it),
//!    and a `tat` read after it can pair an old configuration with a converted `tat` (three models fail).
//! 4. `set_rate` converts `tat`, flipping its generation bit, before it publishes the new configuration,
//!    and an operation whose CAS fails on a word of the other generation starts again from a fresh read,
//!    never with the configuration it holds.
//! 5. No user code runs while the configuration's write side is held: `set_rate` reads the clock before it
//!    locks, so a clock that panics cannot leave the version odd and every reader spinning.
//! 6. The hot path stays integer-only and saturating: every level stays within its generation (at most
//!    `2^63 - 1` in value, and `L - cap` at least the generation's zero because `level0 >= cap`), and the
//!    `#[inline]` on the seqlock read and the level arithmetic keeps them in the caller's code unit.

mod config;
mod error;
mod gcra;
mod token_bucket;

pub use error::AcquireError;
pub use token_bucket::TokenBucket;
