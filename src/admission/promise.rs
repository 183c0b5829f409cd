//! Hints that do not herd: the k-th client refused by one rate is told the moment that rate admits the
//! k-th.
//!
//! An exact `Retry-After` is the earliest moment a request could pass — the same moment for every client
//! refused at once. Clients that honour it exactly (the official OpenAI SDKs sleep `retry-after-ms`
//! without jitter) come back together, one gets the token, and the rest are refused again: a herd that
//! recurs on every retry. A [`Promise`] spaces the hints instead: each refusal is told the moment after
//! the moments already promised, one request's worth of the rate later (`spacing`), so a client that
//! honours its hint finds its token — a hint is a promise, not a lottery.
//!
//! # Invariants
//! 1. A hint is never earlier than the exact wait (the earliest moment the rate could pass the request).
//! 2. Hints are spaced by the rate: `promise(now, exact, spacing)` is `max(now + exact, last + spacing)`,
//!    where `last` is the latest moment promised so far; the promised moment becomes `last`.
//! 3. Hints reach at most [`MAX_AHEAD`] ahead: a refusal that would be promised later is told
//!    `MAX_AHEAD` (or its exact wait, if later) and promised nothing.
//! 4. A promise reserves nothing: a client that does not come back leaves its moment unused (its token
//!    accrues in the bucket for whoever comes, up to the burst), and a newcomer that arrives before a
//!    promised client may take the token; that client is then refused again and promised the next free
//!    moment. Promises in the past are forgotten: the next refusal starts from its exact wait.
//! 5. One compare-and-swap on one word; never a lock.

use crate::sync::{AtomicU64, Ordering};
use std::time::Duration;

/// How far ahead a promised hint may reach: the official OpenAI SDKs honour hints under a minute exactly.
pub(crate) const MAX_AHEAD: Duration = Duration::from_secs(60);

/// The latest moment promised to a refused client of one rate, in clock nanoseconds (0: none).
#[derive(Debug, Default)]
pub(crate) struct Promise {
    last: AtomicU64,
}

impl Promise {
    /// The hint for a request refused at `now` whose exact wait is `exact`, each request's worth of the
    /// rate taking `spacing`: the moment after those already promised (see the module docs).
    pub(crate) fn promise(&self, now: u64, exact: Duration, spacing: Duration) -> Duration {
        let earliest = now.saturating_add(crate::clock::duration_to_nanos(exact));
        let spacing = crate::clock::duration_to_nanos(spacing);
        let horizon = now.saturating_add(crate::clock::duration_to_nanos(MAX_AHEAD));
        let mut last = self.last.load(Ordering::Relaxed);
        loop {
            // 0: nothing promised yet (a promised moment is stored as at least 1); a moment already past is
            // forgotten (its client came or did not; the bucket's state says which).
            let next = if last == 0 || last <= now { 0 } else { last.saturating_add(spacing) };
            let at = earliest.max(next);
            if at > horizon.max(earliest) {
                // Beyond the horizon: told the horizon, promised nothing.
                return exact.max(MAX_AHEAD);
            }
            match self.last.compare_exchange_weak(last, at.max(1), Ordering::Relaxed, Ordering::Relaxed) {
                // At least the exact wait (a clock at its end saturates the moments).
                Ok(_) => return Duration::from_nanos(at - now).max(exact),
                Err(current) => last = current,
            }
        }
    }
}

/// The time `n` units of a rate of `per_second` take to accrue, rounded up to the nanosecond.
pub(crate) fn spacing(n: u64, per_second: f64) -> Duration {
    Duration::from_nanos((n as f64 * 1e9 / per_second).ceil().min(u64::MAX as f64) as u64)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_kth_refused_is_told_the_kth_moment() {
        let promise = Promise::default();
        let spacing = spacing(1, 2.0); // 2 requests/s
        assert_eq!(spacing, Duration::from_millis(500));
        let now = 1_000 * MS;
        let exact = Duration::from_millis(500);
        let hints: Vec<_> = (0..4).map(|_| promise.promise(now, exact, spacing)).collect();
        assert_eq!(hints, [500, 1000, 1500, 2000].map(Duration::from_millis));
        // Later, past every promise: exact again.
        assert_eq!(promise.promise(now + 10_000 * MS, exact, spacing), exact);
    }

    #[test]
    fn never_earlier_than_exact_and_never_beyond_the_horizon() {
        let promise = Promise::default();
        let long = Duration::from_secs(90);
        assert_eq!(promise.promise(0, long, Duration::from_secs(1)), long);
        let promise = Promise::default();
        let spacing = Duration::from_secs(40);
        assert_eq!(promise.promise(0, Duration::from_secs(1), spacing), Duration::from_secs(1));
        assert_eq!(promise.promise(0, Duration::from_secs(1), spacing), Duration::from_secs(41));
        // The next would be 81 s: told the horizon, promised nothing.
        assert_eq!(promise.promise(0, Duration::from_secs(1), spacing), MAX_AHEAD);
        assert_eq!(promise.promise(0, Duration::from_secs(1), spacing), MAX_AHEAD);
        // 2 s later the next moment (81 s) is still 79 s away.
        assert_eq!(promise.promise(2_000 * MS, Duration::from_secs(1), spacing), MAX_AHEAD);
    }

    #[test]
    fn extreme_values_do_not_panic() {
        let promise = Promise::default();
        assert_eq!(promise.promise(u64::MAX, Duration::MAX, Duration::MAX), Duration::MAX);
        assert_eq!(spacing(u64::MAX, 0.001), Duration::from_nanos(u64::MAX));
        let _ = promise.promise(u64::MAX - 1, Duration::ZERO, Duration::from_nanos(1));
    }
}
