//! The retry budget's implementation. Its semantics and guarantee are documented for users in the
//! [`retry` module docs](super#the-retry-budget); this page says how the code keeps them.
//!
//! # Algorithm
//!
//! Finagle's retry budget, counted exactly. Time is cut into slices of `ttl / 10`; two [`Window`]s count,
//! per slice, the first tries deposited and the retries granted in the last ten slices (bounded memory:
//! ten atomic words each, whatever the traffic). The window at a stamp `s` is slices `s - 9 ..= s`; with
//! `F` first tries and `W` retries counted in it, the balance is `R + p·F - W` (in millionths of a retry,
//! `terms.rs`), and a withdrawal stamped `s` is granted iff `R + p·F - (W + 1) >= 0`, and then recorded.
//!
//! - [`deposit`](RetryBudget::deposit): read the clock, one CAS loop on the current slice's word of the
//!   first-try window. No lock: it runs for every request.
//! - [`try_withdraw`](RetryBudget::try_withdraw): read the clock, take the withdrawal lock, stamp
//!   `max(clock slice, latest stamp)`, sum both windows, compare, record in the retry window, unlock.
//!
//! # Why withdrawals take a lock
//!
//! A withdrawal's decision depends on twenty words, and a CAS can validate only the one it writes: two
//! lock-free withdrawals stamped in different slices (one thread's clock reading a slice behind the
//! other's) would each write a different word and both take the last retry. Withdrawals happen only on
//! retries and hold the lock for twenty relaxed loads and one uncontended CAS, with the clock read
//! before it: no user code, no allocation, nothing that can panic runs under it. Deposits, the hot path,
//! stay lock-free; a deposit racing a withdrawal is either counted by it or not, which can only make the
//! withdrawal stricter than a sequential run, never looser.
//!
//! # Where each part lives
//!
//! | file | holds |
//! |---|---|
//! | `retry_budget.rs` | [`RetryBudget`]: the public API, the withdrawal lock and the stamps |
//! | `terms.rs` | the checked configuration and the exact integer arithmetic of the balance |
//! | `window.rs` | [`Window`]: per-slice counts in tagged atomic words (the word layout and its invariant) |
//!
//! # Invariants a change must keep
//!
//! 1. The retry window is read and recorded only while holding the withdrawal lock, and the decision and
//!    the record happen under the same hold: otherwise two threads can both take the last retry (the
//!    loom model `two_threads_race_for_the_last_retry` fails; the stress test
//!    `threads_racing_for_the_balance_never_overdraw` only sometimes).
//! 2. Withdrawal stamps never go back (`max(clock slice, latest stamp)`): a withdrawal stamped behind the
//!    latest one is checked against a window that leaves out the newest retries.
//! 3. Every word changes only by a CAS of the whole `(lap tag, count)` word (see `window.rs`; with a
//!    `fetch_add` on a matching tag, the loom model `a_stale_deposit_is_never_counted_in_a_newer_slice`
//!    fails).
//! 4. Counts saturate: a first try that does not fit is dropped (stricter), a retry that does not fit is
//!    refused; no arithmetic can overflow (`terms.rs` bounds every term below 2^60 in an `i128`).
//! 5. No floating point after construction: the percentage is converted to integer millionths once, so
//!    the property tests can compare the budget with a model exactly.

mod retry_budget;
mod terms;
mod window;

#[cfg(doc)]
use window::Window;

pub use retry_budget::{DEFAULT_BUDGET_TTL, DEFAULT_MIN_RETRIES_PER_SEC, DEFAULT_PERCENT_CAN_RETRY, RetryBudget};
