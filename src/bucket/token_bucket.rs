//! [`TokenBucket`]: the public API and the compare-and-swap loops on `tat` (the module docs of
//! [`bucket`](super) give the algorithm and the invariants these loops keep).

use std::fmt;
use std::time::Duration;

use super::AcquireError;
use super::config::Config;
use super::gcra::{Gcra, Quota};
use crate::ConfigError;
use crate::clock::{Clock, MonotonicClock};
use crate::sync::{AtomicU64, CachePadded, Ordering};

/// A lock-free token bucket (GCRA measured in tokens) with weighted acquisition, refunds and runtime rate
/// changes.
///
/// The bucket holds at most `burst` tokens, starts full, and refills at `rate_per_second`. All methods take
/// `&self`; share it between threads with an `Arc`. The clock is a defaulted type parameter: production
/// code uses [`MonotonicClock`], tests use [`ManualClock`](crate::clock::ManualClock).
///
/// See the [module documentation](super) for the algorithm.
///
/// # Examples
///
/// ```
/// use kvgate::bucket::{AcquireError, TokenBucket};
/// use kvgate::clock::ManualClock;
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let bucket = TokenBucket::with_clock(10.0, 5, clock.clone())?; // 10 tokens/s, bursts of 5
/// assert!(bucket.try_acquire(5).is_ok());
/// let err = bucket.try_acquire(1).unwrap_err();
/// assert_eq!(err, AcquireError::NotYet { retry_after: Duration::from_millis(100) });
/// clock.advance(Duration::from_millis(100));
/// assert!(bucket.try_acquire(1).is_ok());
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
pub struct TokenBucket<C: Clock = MonotonicClock> {
    /// The GCRA state: the generation bit and a level, in units (see the module docs). Alone on its cache
    /// line: it is the only word written on the hot path.
    tat: CachePadded<AtomicU64>,
    /// The configuration, read-mostly.
    config: CachePadded<Config>,
    clock: C,
}

impl TokenBucket<MonotonicClock> {
    /// A bucket that refills at `rate_per_second` up to `burst` tokens, on the system's monotonic clock.
    ///
    /// The bucket starts full.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] if `rate_per_second` is not a finite number in `[0.001, 1e9]`;
    /// [`ConfigError::Zero`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    ///
    /// let bucket = TokenBucket::new(100.0, 10)?;
    /// assert_eq!(bucket.available(), 10);
    /// assert!(TokenBucket::new(0.0, 10).is_err());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn new(rate_per_second: f64, burst: u64) -> Result<Self, ConfigError> {
        Self::with_clock(rate_per_second, burst, MonotonicClock::new())
    }
}

impl<C: Clock> TokenBucket<C> {
    /// A bucket that refills at `rate_per_second` up to `burst` tokens, reading time from `clock`.
    ///
    /// The bucket starts full; the clock is read once, here, to fix the start of the refill axis.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] if `rate_per_second` is not a finite number in `[0.001, 1e9]`;
    /// [`ConfigError::Zero`] if `burst` is 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    /// use kvgate::clock::ManualClock;
    ///
    /// let bucket = TokenBucket::with_clock(1.0, 3, ManualClock::new())?;
    /// assert_eq!(bucket.burst(), 3);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn with_clock(rate_per_second: f64, burst: u64, clock: C) -> Result<Self, ConfigError> {
        let quota = Quota::new(rate_per_second, burst)?;
        let gcra = Gcra::starting(quota, clock.now_nanos());
        Ok(Self {
            tat: CachePadded(AtomicU64::new(gcra.full_tat())),
            config: CachePadded(Config::new(gcra, quota.rate())),
            clock,
        })
    }

    /// Takes `n` tokens now, or takes nothing and says why.
    ///
    /// Reads the clock once. `try_acquire(0)` always succeeds.
    ///
    /// # Errors
    ///
    /// [`AcquireError::NotYet`] with the exact time until `n` tokens will be available (if nobody else
    /// takes them first); [`AcquireError::NeverFits`] if `n` exceeds the burst (or the 2^61 tokens a bucket
    /// holds at most, or what is left of the configuration's lifetime allowance).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::{AcquireError, TokenBucket};
    ///
    /// let bucket = TokenBucket::new(1.0, 2)?;
    /// assert!(bucket.try_acquire(2).is_ok());
    /// assert!(matches!(bucket.try_acquire(3), Err(AcquireError::NeverFits { requested: 3, burst: 2 })));
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self, n: u64) -> Result<(), AcquireError> {
        self.try_acquire_at(n, self.clock.now_nanos())
    }

    /// Takes `n` tokens at the caller-supplied time `now_nanos` (on this bucket's clock axis), or takes
    /// nothing and says why.
    ///
    /// Lets a caller read the clock once for several buckets. A `now_nanos` earlier than one already used
    /// never panics and never yields extra tokens: at worst tokens that accrued between the two readings are
    /// not counted for this call.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](Self::try_acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    /// use kvgate::clock::{Clock, ManualClock};
    ///
    /// let bucket = TokenBucket::with_clock(1.0, 1, ManualClock::new())?;
    /// let now = bucket.clock().now_nanos();
    /// assert!(bucket.try_acquire_at(1, now).is_ok());
    /// assert!(bucket.try_acquire_at(1, now + 999_999_999).is_err());
    /// assert!(bucket.try_acquire_at(1, now + 1_000_000_000).is_ok());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[inline]
    pub fn try_acquire_at(&self, n: u64, now_nanos: u64) -> Result<(), AcquireError> {
        // The common case, lean enough to inline: 1 <= n <= burst (`n - 1` wraps for 0), a grant, and a
        // CAS that fails only to a concurrent grant or refund. Everything else (n == 0, n > burst, a
        // refusal and its hint, a rate change in between) goes to the slow path, which starts again.
        let (config, mut tat) = self.config.read_with(&self.tat);
        if n.wrapping_sub(1) < config.burst {
            // n <= burst, and burst * unit <= 2^61 whenever unit > 1: no overflow.
            let cost = n * config.unit;
            let level = config.level_at(now_nanos);
            let clamp = config.clamp(level);
            loop {
                let start = tat.max(clamp);
                // start + cost <= level, without overflow.
                if start > level || level - start < cost {
                    break;
                }
                match self.tat.compare_exchange_weak(tat, start + cost, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Ok(()),
                    Err(current) if config.owns(current) => tat = current,
                    Err(_) => break,
                }
            }
        }
        self.try_acquire_slow(n, now_nanos)
    }

    /// [`try_acquire_at`](Self::try_acquire_at) in full: the same CAS loop, from a fresh read, with the
    /// refusals, and again from a fresh read after a rate change converted `tat`.
    #[cold]
    #[inline(never)]
    fn try_acquire_slow(&self, n: u64, now_nanos: u64) -> Result<(), AcquireError> {
        loop {
            let (config, mut tat) = self.config.read_with(&self.tat);
            if n > config.burst {
                return Err(AcquireError::NeverFits { requested: n, burst: config.burst });
            }
            if n == 0 {
                return Ok(());
            }
            let cost = n * config.unit;
            let level = config.level_at(now_nanos);
            let clamp = config.clamp(level);
            loop {
                let start = tat.max(clamp);
                if start > level || level - start < cost {
                    return Err(Self::refusal(&config, tat, n, now_nanos));
                }
                match self.tat.compare_exchange_weak(tat, start + cost, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return Ok(()),
                    Err(current) if config.owns(current) => tat = current,
                    // A rate change converted `tat`: start again with the new configuration.
                    Err(_) => break,
                }
            }
        }
    }

    /// The refusal for an acquire of `n` (`0 < n <= burst`) that does not fit at `now` with state `tat`:
    /// the exact wait until `L(now + d) >= tat + n * unit`, or `NeverFits` when that level is never reached
    /// (more than `2^61` tokens asked of a larger burst, or the configuration's lifetime allowance spent).
    fn refusal(config: &Gcra, tat: u64, n: u64, now: u64) -> AcquireError {
        let cost = n * config.unit;
        let never = AcquireError::NeverFits { requested: n, burst: config.burst };
        if cost > config.cap {
            return never;
        }
        config
            .wait_until(u128::from(tat) + u128::from(cost), now)
            .map_or(never, |retry_after| AcquireError::NotYet { retry_after })
    }

    /// Tokens that could be taken now, without taking them.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    ///
    /// let bucket = TokenBucket::new(1.0, 4)?;
    /// bucket.try_acquire(3).unwrap();
    /// assert_eq!(bucket.available(), 1);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[inline]
    pub fn available(&self) -> u64 {
        self.available_at(self.clock.now_nanos())
    }

    /// Tokens that could be taken at `now_nanos`, without taking them.
    ///
    /// `try_acquire_at(n, now_nanos)` succeeds exactly when `n <= available_at(now_nanos)` (absent
    /// concurrent changes).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    /// use kvgate::clock::ManualClock;
    ///
    /// let bucket = TokenBucket::with_clock(2.0, 10, ManualClock::new())?;
    /// bucket.try_acquire_at(10, 0).unwrap();
    /// assert_eq!(bucket.available_at(1_500_000_000), 3);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[inline]
    pub fn available_at(&self, now_nanos: u64) -> u64 {
        let (config, tat) = self.config.read_with(&self.tat);
        let level = config.level_at(now_nanos);
        let start = tat.max(config.clamp(level));
        level.saturating_sub(start) / config.unit
    }

    /// How long until `n` tokens could be taken at `now_nanos` (zero if they could be taken now), without
    /// taking anything. Exact, like the `retry_after` of a refusal.
    ///
    /// # Errors
    ///
    /// [`AcquireError::NeverFits`] when `n` exceeds the burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    /// use kvgate::clock::ManualClock;
    /// use std::time::Duration;
    ///
    /// let bucket = TokenBucket::with_clock(2.0, 10, ManualClock::new())?;
    /// bucket.try_acquire_at(10, 0).unwrap();
    /// assert_eq!(bucket.time_until_available_at(3, 0).unwrap(), Duration::from_millis(1500));
    /// assert_eq!(bucket.time_until_available_at(3, 1_500_000_000).unwrap(), Duration::ZERO);
    /// assert!(bucket.time_until_available_at(11, 0).is_err());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn time_until_available_at(&self, n: u64, now_nanos: u64) -> Result<Duration, AcquireError> {
        let (config, tat) = self.config.read_with(&self.tat);
        if n > config.burst {
            return Err(AcquireError::NeverFits { requested: n, burst: config.burst });
        }
        if n == 0 {
            return Ok(Duration::ZERO);
        }
        let level = config.level_at(now_nanos);
        let start = tat.max(config.clamp(level));
        if start <= level && level - start >= n * config.unit {
            return Ok(Duration::ZERO);
        }
        match Self::refusal(&config, tat, n, now_nanos) {
            AcquireError::NotYet { retry_after } => Ok(retry_after),
            never => Err(never),
        }
    }

    /// Gives back `n` tokens now (for example, work that was reserved but not done).
    ///
    /// The bucket never holds more than `burst` tokens: the excess of a refund is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    ///
    /// let bucket = TokenBucket::new(0.001, 5)?;
    /// bucket.try_acquire(4).unwrap();
    /// bucket.refund(10);
    /// assert_eq!(bucket.available(), 5);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[inline]
    pub fn refund(&self, n: u64) {
        self.refund_at(n, self.clock.now_nanos());
    }

    /// Gives back `n` tokens at the caller-supplied time `now_nanos`, capped so the bucket never holds more
    /// than `burst`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    /// use kvgate::clock::ManualClock;
    ///
    /// let bucket = TokenBucket::with_clock(1.0, 5, ManualClock::new())?;
    /// bucket.try_acquire_at(3, 0).unwrap();
    /// bucket.refund_at(2, 0);
    /// assert_eq!(bucket.available_at(0), 4);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn refund_at(&self, n: u64, now_nanos: u64) {
        if n == 0 {
            return;
        }
        loop {
            let (config, mut tat) = self.config.read_with(&self.tat);
            let clamp = config.clamp(config.level_at(now_nanos));
            let back = n.saturating_mul(config.unit);
            loop {
                // The clamp keeps the result in the generation (`clamp >= level0 - cap`, whose value is >= 0).
                let new = tat.saturating_sub(back).max(clamp);
                if new == tat {
                    return;
                }
                match self.tat.compare_exchange_weak(tat, new, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => return,
                    Err(current) if config.owns(current) => tat = current,
                    Err(_) => break,
                }
            }
        }
    }

    /// Changes the refill rate and the burst at run time, keeping the tokens currently available (capped
    /// at the new burst).
    ///
    /// From now on the bucket refills at the new rate. The tokens held and the progress towards the next
    /// one are kept, the progress rounded down to the new configuration's unit (under 2 ns of refill at the
    /// new rate, see the [module documentation](super)), all capped at the new burst. Concurrent acquires
    /// and refunds are ordered entirely before or entirely after the change; concurrent `set_rate` calls
    /// are serialized.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] or [`ConfigError::Zero`] as for [`new`](TokenBucket::new); the bucket
    /// is then unchanged.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    ///
    /// let bucket = TokenBucket::new(1.0, 10)?;
    /// bucket.try_acquire(4).unwrap();
    /// bucket.set_rate(1000.0, 3)?; // 6 tokens were available: capped at the new burst
    /// assert_eq!(bucket.rate(), 1000.0);
    /// assert_eq!(bucket.available(), 3);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn set_rate(&self, rate_per_second: f64, burst: u64) -> Result<(), ConfigError> {
        let quota = Quota::new(rate_per_second, burst)?;
        // The clock is user code: read it before taking the write side, so that a clock that panics cannot
        // leave readers spinning. A writer that locks after a later `set_rate` with an earlier `now` starts
        // its piece where that one did (`Gcra::continued`).
        let now = self.clock.now_nanos();
        let guard = self.config.lock();
        let old = guard.current();
        let next = old.continued(quota, now);
        // Convert `tat` into the next generation: the linearization point of the change. An acquire or
        // refund that read the old configuration commits before this CAS, or its own CAS fails on the
        // flipped generation bit and it starts again with `next`.
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let converted = old.convert(tat, now, &next);
            match self.tat.compare_exchange_weak(tat, converted, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(current) => tat = current,
            }
        }
        guard.publish(next, quota.rate());
        Ok(())
    }

    /// The refill rate, in tokens per second, as configured.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    ///
    /// assert_eq!(TokenBucket::new(2.5, 1)?.rate(), 2.5);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn rate(&self) -> f64 {
        self.config.rate()
    }

    /// The capacity: the most tokens the bucket holds, and the largest `n` that can ever be acquired (as
    /// configured; a bucket holds at most 2^61 tokens whatever its burst).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    ///
    /// assert_eq!(TokenBucket::new(2.5, 7)?.burst(), 7);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn burst(&self) -> u64 {
        self.config.read().burst
    }

    /// The clock this bucket reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::TokenBucket;
    /// use kvgate::clock::{Clock, ManualClock};
    ///
    /// let bucket = TokenBucket::with_clock(1.0, 1, ManualClock::starting_at(42))?;
    /// assert_eq!(bucket.clock().now_nanos(), 42);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The exact refill rate in use, in units per nanosecond: `mult / 2^96`, with
    /// `mult = ceil(rate * unit * 2^96 / 10^9)` ([`__units_per_token`](Self::__units_per_token) is `unit`).
    /// For tests that model the bucket exactly; not a stable API.
    #[doc(hidden)]
    pub fn __rate_multiplier(&self) -> u128 {
        self.config.read().mult()
    }

    /// The unit in use: units per token, `max(1, min(floor(10^9 / rate), floor(2^61 / burst)))`. For tests
    /// that model the bucket exactly; not a stable API.
    #[doc(hidden)]
    pub fn __units_per_token(&self) -> u64 {
        self.config.read().unit
    }
}

impl<C: Clock> fmt::Debug for TokenBucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (config, tat) = self.config.read_with(&self.tat);
        f.debug_struct("TokenBucket")
            .field("rate_per_second", &self.config.rate())
            .field("burst", &config.burst)
            .field("units_per_token", &config.unit)
            .field("tat", &tat)
            .field("level0", &config.level0)
            .field("base_ns", &config.base_ns)
            .field("clock", &self.clock)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const SEC: u64 = 1_000_000_000;

    fn bucket(rate: f64, burst: u64) -> TokenBucket<ManualClock> {
        TokenBucket::with_clock(rate, burst, ManualClock::new()).unwrap()
    }

    #[test]
    fn invalid_rates_are_errors_with_useful_messages() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e10, 1e-4, -0.0, f64::MIN_POSITIVE] {
            let err = TokenBucket::new(rate, 10).unwrap_err();
            match &err {
                ConfigError::InvalidRate { what, value, min, max } => {
                    assert_eq!(*what, "token bucket rate");
                    assert!(value.to_bits() == rate.to_bits());
                    assert_eq!((*min, *max), (0.001, 1e9));
                }
                other => panic!("{rate}: {other:?}"),
            }
            let msg = err.to_string();
            assert!(msg.contains("token bucket rate") && msg.contains("0.001") && msg.contains("1000000000"), "{msg}");
            assert!(bucket(1.0, 1).set_rate(rate, 1).is_err());
        }
        let err = TokenBucket::new(1.0, 0).unwrap_err();
        assert_eq!(err, ConfigError::Zero { what: "token bucket burst" });
        assert!(err.to_string().contains("token bucket burst is 0"), "{err}");
        let b = bucket(1.0, 5);
        assert!(b.set_rate(1.0, 0).is_err());
        assert_eq!((b.rate(), b.burst()), (1.0, 5), "a refused set_rate changes nothing");
        // The extremes of the range are accepted.
        assert!(TokenBucket::new(0.001, 1).is_ok());
        assert!(TokenBucket::new(1e9, u64::MAX).is_ok());
    }

    #[test]
    fn starts_full_and_zero_is_free() {
        let b = bucket(1.0, 3);
        assert_eq!(b.available(), 3);
        assert_eq!(b.try_acquire(0), Ok(()));
        assert_eq!(b.try_acquire(3), Ok(()));
        assert_eq!(b.try_acquire(0), Ok(()));
        assert_eq!(b.available(), 0);
        assert_eq!(b.try_acquire(1), Err(AcquireError::NotYet { retry_after: Duration::from_secs(1) }));
        assert_eq!(b.try_acquire(3), Err(AcquireError::NotYet { retry_after: Duration::from_secs(3) }));
    }

    #[test]
    fn huge_n_never_fits() {
        let b = bucket(1e9, 1_000);
        let err = b.try_acquire(u64::MAX).unwrap_err();
        assert_eq!(err, AcquireError::NeverFits { requested: u64::MAX, burst: 1_000 });
        assert_eq!(err.retry_after(), None);
        assert!(err.to_string().contains("raise the burst"));
        assert_eq!(b.try_acquire(1_001).unwrap_err().retry_after(), None);
        assert_eq!(b.available(), 1_000, "a refusal takes nothing");
        b.refund(u64::MAX);
        assert_eq!(b.available(), 1_000);
        // Documented limit: a bucket holds at most 2^61 tokens, whatever its burst.
        let max = bucket(0.001, u64::MAX);
        assert_eq!(max.available(), 1 << 61);
        assert_eq!(max.try_acquire(u64::MAX), Err(AcquireError::NeverFits { requested: u64::MAX, burst: u64::MAX }));
        assert_eq!(max.try_acquire((1 << 61) + 1).unwrap_err().retry_after(), None);
        assert_eq!(max.try_acquire(1 << 61), Ok(()));
        assert_eq!(max.try_acquire(1).unwrap_err().retry_after(), Some(Duration::from_secs(1_000)));
        let most = bucket(1e9, 1 << 61);
        assert_eq!(most.try_acquire(1 << 61), Ok(()));
        assert_eq!(most.try_acquire(1).unwrap_err().retry_after(), Some(Duration::from_nanos(1)));
        // The level of one configuration saturates 2^63 - 1 - 2^61 units after it starts (at one unit per
        // nanosecond here, 219 years): the allowance is spent, and it says so instead of naming a wait.
        let clock = ManualClock::new();
        let life = TokenBucket::with_clock(1e9, 1 << 61, clock.clone()).unwrap();
        clock.set_nanos(u64::MAX);
        assert_eq!(life.try_acquire(1 << 61), Ok(()));
        assert_eq!(life.try_acquire(1).unwrap_err().retry_after(), None);
        assert_eq!(life.available(), 0);
    }

    #[test]
    fn extreme_times_and_backwards_clocks_do_not_panic_or_add_tokens() {
        for (rate, burst) in [(1e9, 1), (1e9, u64::MAX), (0.001, 1), (0.001, u64::MAX), (3.0, 1 << 63)] {
            for start in [0, 1, u64::MAX - 1, u64::MAX] {
                let clock = ManualClock::starting_at(start);
                let b = TokenBucket::with_clock(rate, burst, clock.clone()).unwrap();
                for now in [0, 1, start, u64::MAX / 2, u64::MAX - 1, u64::MAX, 0] {
                    clock.set_nanos(now);
                    for n in [0, 1, 2, burst / 2, burst, burst.saturating_add(1), u64::MAX] {
                        let before = b.available_at(now);
                        let result = b.try_acquire_at(n, now);
                        assert_eq!(result.is_ok(), n <= before, "{rate} {burst} {start} {now} {n}");
                        if let Err(AcquireError::NotYet { retry_after }) = result {
                            assert!(retry_after > Duration::ZERO);
                        }
                        let _ = b.available();
                        b.refund_at(n / 3, now);
                        assert!(b.available_at(now) <= burst);
                    }
                }
                b.set_rate(rate, burst).unwrap();
                let _ = b.try_acquire(1);
            }
        }
        // Going backwards never yields more than before.
        let clock = ManualClock::starting_at(10 * SEC);
        let b = TokenBucket::with_clock(1.0, 5, clock.clone()).unwrap();
        b.try_acquire(5).unwrap();
        clock.advance(Duration::from_secs(3));
        assert_eq!(b.available(), 3);
        b.try_acquire(1).unwrap();
        for back in [12 * SEC, 10 * SEC, 0] {
            clock.set_nanos(back);
            assert!(b.available() <= 2);
            assert!(b.try_acquire(3).is_err());
        }
        clock.set_nanos(13 * SEC);
        assert_eq!(b.available(), 2);
    }

    /// Greedy consumption at many instants up to `horizon` grants exactly `floor(rate * t) + burst` by `t`.
    fn assert_no_drift(rate_num: u128, rate_den: u128, burst: u64, step: u64, horizon: u64) {
        let rate = rate_num as f64 / rate_den as f64;
        let b = bucket(rate, burst);
        let mut granted: u128 = 0;
        let mut t = 0;
        loop {
            let avail = b.available_at(t);
            b.try_acquire_at(avail, t).unwrap();
            granted += u128::from(avail);
            let expected = u128::from(t) * rate_num / (rate_den * u128::from(SEC)) + u128::from(burst);
            assert_eq!(granted, expected, "rate {rate} at t={t}");
            assert!(b.try_acquire_at(1, t).is_err());
            if t == horizon {
                break;
            }
            t = (t + step).min(horizon);
        }
    }

    #[test]
    fn no_drift_3_per_second_for_10_days() {
        // Steps that are not multiples of the token period, ending exactly on a token boundary.
        assert_no_drift(3, 1, 7, 777_777_777, 10 * 86_400 * SEC);
    }

    #[test]
    fn no_drift_1e9_per_second_for_an_hour() {
        assert_no_drift(1_000_000_000, 1, 2_000_000_000, 1_234_567_891, 3_600 * SEC);
    }

    #[test]
    fn no_drift_0_001_per_second_for_a_year() {
        assert_no_drift(1, 1_000, 100, 86_400 * SEC + 1, 365 * 86_400 * SEC);
        assert_no_drift(1, 1_000, 2, 1_000 * SEC, 365 * 86_400 * SEC);
    }

    #[test]
    fn set_rate_keeps_available_tokens() {
        let clock = ManualClock::new();
        let b = TokenBucket::with_clock(10.0, 10, clock.clone()).unwrap();
        b.try_acquire(7).unwrap();
        b.set_rate(1.0, 100).unwrap();
        assert_eq!(b.available(), 3, "a larger burst does not add tokens");
        clock.advance(Duration::from_secs(2));
        assert_eq!(b.available(), 5, "refills at the new rate");
        b.set_rate(1000.0, 4).unwrap();
        assert_eq!(b.available(), 4, "capped at the new burst");
        assert_eq!((b.rate(), b.burst()), (1000.0, 4));
        b.try_acquire(4).unwrap();
        assert_eq!(b.try_acquire(1), Err(AcquireError::NotYet { retry_after: Duration::from_millis(1) }));
        // A bucket that has been full for a long time keeps only `burst` when the burst grows.
        clock.advance(Duration::from_secs(3_600));
        b.set_rate(1.0, 1_000_000).unwrap();
        assert_eq!(b.available(), 4);
        clock.advance(Duration::from_secs(10));
        assert_eq!(b.available(), 14); // After a burst increase, refunds fill up to the new burst.
        b.refund(u64::MAX);
        assert_eq!(b.available(), 1_000_000);
    }

    #[test]
    fn retry_after_is_exact() {
        let clock = ManualClock::new();
        let b = TokenBucket::with_clock(3.0, 2, clock.clone()).unwrap();
        b.try_acquire(2).unwrap();
        let wait = b.try_acquire(2).unwrap_err().retry_after().unwrap();
        assert_eq!(wait, Duration::from_nanos(666_666_667));
        clock.advance(wait - Duration::from_nanos(1));
        assert!(b.try_acquire(2).is_err());
        assert_eq!(b.try_acquire(2).unwrap_err().retry_after(), Some(Duration::from_nanos(1)));
        clock.advance(Duration::from_nanos(1));
        assert_eq!(b.try_acquire(2), Ok(()));
    }

    #[test]
    fn refund_is_capped_at_burst() {
        let b = bucket(1.0, 10);
        b.try_acquire_at(6, 0).unwrap();
        b.refund_at(2, 0);
        assert_eq!(b.available_at(0), 6);
        b.refund_at(100, 0);
        assert_eq!(b.available_at(0), 10);
        b.refund_at(0, 0);
        assert_eq!(b.available_at(5 * SEC), 10);
    }

    /// A clock that panics on demand.
    #[derive(Debug, Clone)]
    struct Faulty {
        clock: ManualClock,
        fail: std::sync::Arc<std::sync::atomic::AtomicBool>,
    }

    impl Clock for Faulty {
        fn now_nanos(&self) -> u64 {
            assert!(!self.fail.load(std::sync::atomic::Ordering::Relaxed), "injected clock failure");
            self.clock.now_nanos()
        }
    }

    #[test]
    fn a_clock_that_panics_in_set_rate_changes_nothing_and_blocks_nobody() {
        let fail = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let b = TokenBucket::with_clock(1.0, 5, Faulty { clock: ManualClock::new(), fail: fail.clone() }).unwrap();
        b.try_acquire(2).unwrap();
        fail.store(true, std::sync::atomic::Ordering::Relaxed);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| b.set_rate(10.0, 1)));
        assert!(caught.is_err());
        // Readers are not left spinning on a half-written configuration (on a watchdog, so that a
        // regression fails instead of hanging), and the configuration is the old one.
        let (tx, rx) = std::sync::mpsc::channel();
        let b = std::sync::Arc::new(b);
        let reader = std::sync::Arc::clone(&b);
        std::thread::spawn(move || tx.send((reader.available_at(0), reader.burst(), reader.rate())));
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok((3, 5, 1.0)));
        fail.store(false, std::sync::atomic::Ordering::Relaxed);
        b.set_rate(10.0, 1).unwrap();
        assert_eq!((b.available(), b.burst()), (1, 1));
    }

    #[test]
    fn is_send_sync_debug() {
        fn check<T: Send + Sync + fmt::Debug>() {}
        check::<TokenBucket>();
        check::<TokenBucket<ManualClock>>();
        let s = format!("{:?}", bucket(2.0, 3));
        assert!(s.contains("TokenBucket") && s.contains("burst: 3"), "{s}");
    }
}
