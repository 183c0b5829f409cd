//! [`RetryPolicy`]: the backoff schedule — base, cap, tries, the longest hint worth waiting for.
//!
//! The per-operation state that walks through the schedule, and the constructors that make it
//! ([`RetryPolicy::backoff`], [`RetryPolicy::backoff_with_budget`]), are in `backoff.rs`.

use super::rng::SplitMix64;
use std::time::Duration;

/// How a client retries: base delay, cap, maximum number of tries, and optionally a fixed seed.
///
/// Defaults: base 100 ms, cap 10 s, 5 tries, give up on server hints over [`DEFAULT_MAX_RETRY_AFTER`],
/// fresh randomness per [`Backoff`](super::Backoff).
/// See the [module docs](super) for the schedule.
///
/// # Examples
///
/// ```
/// use kvgate::retry::RetryPolicy;
/// use std::time::Duration;
///
/// let policy = RetryPolicy::new().base(Duration::from_millis(100)).cap(Duration::from_secs(5)).max_tries(3).seed(1);
/// let mut backoff = policy.backoff();
/// let first = backoff.next_delay(None).unwrap();
/// assert!(first <= Duration::from_millis(100));
/// let second = backoff.next_delay(Some(Duration::from_secs(1))).unwrap();
/// assert!(second >= Duration::from_secs(1));
/// assert_eq!(backoff.next_delay(None), None); // three tries made: give up
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    base: Duration,
    cap: Duration,
    max_tries: u32,
    max_retry_after: Duration,
    seed: Option<u64>,
}

/// The longest server hint a [`RetryPolicy`] waits for unless told otherwise
/// ([`max_retry_after`](RetryPolicy::max_retry_after)): five minutes.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The default policy: base 100 ms, cap 10 s, 5 tries, hints up to [`DEFAULT_MAX_RETRY_AFTER`].
    pub const fn new() -> Self {
        Self {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(10),
            max_tries: 5,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            seed: None,
        }
    }

    /// The window of the first retry; each later retry doubles it (up to the cap).
    #[must_use]
    pub const fn base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// The largest backoff window. A server hint may still ask for a longer wait; see
    /// [`max_retry_after`](RetryPolicy::max_retry_after).
    #[must_use]
    pub const fn cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// Total tries, the first included (`1`: never retry; `0` behaves as `1`).
    #[must_use]
    pub const fn max_tries(mut self, max_tries: u32) -> Self {
        self.max_tries = max_tries;
        self
    }

    /// Gives up instead of waiting when a server asks to wait longer than `limit` (default
    /// [`DEFAULT_MAX_RETRY_AFTER`]; `Duration::MAX` waits for any hint).
    #[must_use]
    pub const fn max_retry_after(mut self, limit: Duration) -> Self {
        self.max_retry_after = limit;
        self
    }

    /// Fixes the random seed, so every [`Backoff`](super::Backoff) of this policy draws the same delays (for tests and
    /// simulations; in production leave it unset, or clients seeded alike would move in lockstep).
    #[must_use]
    pub const fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// The configured number of tries (at least 1).
    pub const fn tries(&self) -> u32 {
        if self.max_tries == 0 { 1 } else { self.max_tries }
    }

    /// The jitter window of retry number `attempt` (0 for the first retry): `min(cap, base · 2^attempt)`.
    pub fn window(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt).unwrap_or(0);
        if factor == 0 {
            return self.cap;
        }
        self.base.checked_mul(factor).map_or(self.cap, |w| w.min(self.cap))
    }

    /// The delay before retrying after try number `attempt` (0-based) failed, drawing randomness from
    /// `rng`; `None` when the client should give up (`attempt + 1` tries were already made and that
    /// reaches [`max_tries`](RetryPolicy::max_tries), or the hint exceeds
    /// [`max_retry_after`](RetryPolicy::max_retry_after)).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::retry::{RetryPolicy, SplitMix64};
    /// use std::time::Duration;
    ///
    /// let policy = RetryPolicy::new().base(Duration::from_millis(10)).max_tries(2);
    /// let mut rng = SplitMix64::new(3);
    /// assert!(policy.delay(0, None, &mut rng).unwrap() <= Duration::from_millis(10));
    /// assert_eq!(policy.delay(1, None, &mut rng), None);
    /// ```
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>, rng: &mut SplitMix64) -> Option<Duration> {
        if attempt.saturating_add(1) >= self.tries() {
            return None;
        }
        if retry_after.is_some_and(|hint| hint > self.max_retry_after) {
            return None;
        }
        let jitter = rng.duration_up_to(self.window(attempt));
        Some(retry_after.map_or(jitter, |hint| hint.saturating_add(jitter)))
    }

    /// A generator for one [`Backoff`](super::Backoff): seeded with [`seed`](RetryPolicy::seed) if set, else fresh.
    pub(super) fn rng(&self) -> SplitMix64 {
        self.seed.map_or_else(SplitMix64::from_entropy, SplitMix64::new)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::retry::parse_retry_after;

    const MS: Duration = Duration::from_millis(1);

    /// The policy the unit tests of `retry` share: base 100 ms, cap 3 s, 10 tries.
    pub(in crate::retry) fn policy() -> RetryPolicy {
        RetryPolicy::new().base(100 * MS).cap(3_000 * MS).max_tries(10)
    }

    #[test]
    fn window_doubles_up_to_the_cap() {
        let p = policy();
        let windows: Vec<_> = (0..8).map(|n| p.window(n).as_millis()).collect();
        assert_eq!(windows, [100, 200, 400, 800, 1600, 3000, 3000, 3000]);
        assert_eq!(p.window(40), 3_000 * MS);
        assert_eq!(p.window(u32::MAX), 3_000 * MS);
        assert_eq!(RetryPolicy::new().base(Duration::MAX).cap(Duration::MAX).window(3), Duration::MAX);
    }

    #[test]
    fn every_delay_is_within_its_window_over_many_seeds() {
        let p = policy();
        for seed in 0..2_000 {
            let mut rng = SplitMix64::new(seed);
            for attempt in 0..9 {
                let d = p.delay(attempt, None, &mut rng).unwrap();
                let window = (p.base * 2u32.pow(attempt)).min(p.cap);
                assert!(d <= window, "seed {seed} attempt {attempt}: {d:?} > {window:?}");
                assert!(d <= p.cap);
            }
        }
    }

    #[test]
    fn delays_use_the_whole_window() {
        let p = policy();
        let mut rng = SplitMix64::new(1);
        let draws: Vec<_> = (0..10_000).map(|_| p.delay(2, None, &mut rng).unwrap()).collect();
        assert!(draws.iter().any(|d| *d < 20 * MS));
        assert!(draws.iter().any(|d| *d > 380 * MS));
    }

    #[test]
    fn a_hint_is_never_undercut() {
        let p = policy();
        for seed in 0..1_000 {
            let mut rng = SplitMix64::new(seed);
            for attempt in 0..9 {
                let hint = Duration::from_millis(seed % 7 * 500);
                let d = p.delay(attempt, Some(hint), &mut rng).unwrap();
                assert!(d >= hint, "seed {seed}: {d:?} < hint {hint:?}");
                assert!(d <= hint + p.window(attempt));
            }
        }
        // A hint beyond the cap is still honoured: the cap bounds only the jitter.
        let d = p.delay(0, Some(Duration::from_secs(60)), &mut SplitMix64::new(0)).unwrap();
        assert!(d >= Duration::from_secs(60));
    }

    #[test]
    fn hints_over_the_limit_give_up() {
        let p = policy().max_retry_after(Duration::from_secs(5));
        let mut rng = SplitMix64::new(0);
        assert!(p.delay(0, Some(Duration::from_secs(5)), &mut rng).is_some());
        assert_eq!(p.delay(0, Some(Duration::from_secs(6)), &mut rng), None);
    }

    #[test]
    fn a_hostile_hint_does_not_park_a_client_by_default() {
        let hostile = parse_retry_after("99999999999999").unwrap();
        let mut rng = SplitMix64::new(0);
        assert_eq!(RetryPolicy::new().delay(0, Some(hostile), &mut rng), None);
        assert!(RetryPolicy::new().delay(0, Some(DEFAULT_MAX_RETRY_AFTER), &mut rng).is_some());
        let patient = RetryPolicy::new().max_retry_after(Duration::MAX);
        assert!(patient.delay(0, Some(hostile), &mut rng).unwrap() >= hostile);
    }

    /// 1,000 clients rejected at the same instant, each with its own seed: their first retries cover the
    /// window evenly, no 10% slice of it taking more than 20% of them. Fixed seeds: cannot flake.
    #[test]
    fn a_herd_rejected_together_spreads_out() {
        let p = policy();
        for hint in [None, Some(Duration::from_secs(1))] {
            let mut buckets = [0u32; 10];
            for client in 0..1_000u64 {
                let mut rng = SplitMix64::new(client.wrapping_mul(0x2545_F491_4F6C_DD1D));
                let d = p.delay(3, hint, &mut rng).unwrap() - hint.unwrap_or_default();
                let slot = (d.as_nanos() * 10 / (p.window(3).as_nanos() + 1)) as usize;
                buckets[slot] += 1;
            }
            assert!(buckets.iter().all(|&n| n <= 200), "{hint:?}: {buckets:?}");
            assert!(buckets.iter().all(|&n| n >= 50), "{hint:?}: {buckets:?}");
        }
    }
}
