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
//! exactly `burst + floor((t - base_ns) * mult / 2^96)`. Because costs are integers, comparing integer
//! token counts against the floor of the real-valued level loses nothing: a token exists at time `t`
//! exactly when the real-valued level has passed it. (This is a bucket whose tokens arrive one at a time,
//! at the instants where the real-valued level crosses an integer, and which is capped at `burst`.)
//!
//! **The multiplier.** `mult = ceil(rate * 2^96 / 10^9)`, computed exactly from the `f64`'s integer
//! mantissa and exponent (no floating-point products). Rounding up means the level runs ahead of the exact
//! rate by less than 2^-96 tokens per nanosecond, which is less than one token over the whole 2^64 ns axis;
//! and for rates whose per-nanosecond value has a small denominator (every integer rate, and decimal rates
//! such as 0.001/s over years) `floor` lands on exactly `floor(rate * t)`, even at the instants where
//! `rate * t` is an integer (rounding down would deliver those tokens 1 ns late).
//! `floor(e * mult / 2^96)` is evaluated with two `u64 x u64 -> u128` products, splitting
//! `mult = hi * 2^64 + lo`: `(e*hi + ((e*lo) >> 64)) >> 32`, which is exact (no rounding beyond the
//! final floor).
//!
//! **Rate changes** ([`TokenBucket::set_rate`]) at time `T`, holding the configuration's write lock:
//! first raise `tat` to `start_old(T) = max(tat, L_old(T) - burst_old)` (a CAS loop; this changes nothing
//! the old configuration can observe at or after `T`), then start a new linear piece `base_ns = T`,
//! `level0 = L_old(T)`, so `L` is continuous and `tat` keeps its units. Then
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
//! * The configuration fields are atomics guarded by a seqlock (`version`, odd while being written).
//!   Readers: `version.load(Acquire)` (even), `Relaxed` field loads, `fence(Acquire)`,
//!   `version.load(Relaxed)`, retry if the version changed. Writers (only `set_rate`, rare) serialize by
//!   CASing `version` from even to odd (`Acquire`), issue `fence(Release)`, store the fields `Relaxed`, and
//!   `store(version + 2, Release)`. If a reader observes any field written by a writer, the fence pair
//!   makes the writer's odd version visible to the second load, so a torn read is always retried.
//!
//! On x86-64 the read side compiles to plain loads; the hot path is one seqlock read, two 64x64
//! multiplications and one CAS, and allocates nothing.

use std::fmt;
use std::time::Duration;

use crate::ConfigError;
use crate::clock::{Clock, MonotonicClock};
use crate::sync::{AtomicU64, CachePadded, Ordering, fence};

/// Smallest accepted refill rate, in tokens per second.
const MIN_RATE: f64 = 0.001;
/// Largest accepted refill rate, in tokens per second (one token per nanosecond).
const MAX_RATE: f64 = 1e9;
/// Name of the rate in configuration errors.
const RATE_WHAT: &str = "token bucket rate";
/// Name of the burst in configuration errors.
const BURST_WHAT: &str = "token bucket burst";
const NANOS_PER_SEC: u128 = 1_000_000_000;
/// Where the level axis starts (at least): room for `tat` below `L - burst` when the burst grows.
const LEVEL_HEADROOM: u64 = 1 << 63;

/// A lock-free token bucket (GCRA measured in tokens) with weighted acquisition, refunds and runtime rate
/// changes.
///
/// The bucket holds at most `burst` tokens, starts full, and refills at `rate_per_second`. All methods take
/// `&self`; share it between threads with an `Arc`. The clock is a defaulted type parameter: production
/// code uses [`MonotonicClock`], tests use [`ManualClock`](crate::clock::ManualClock).
///
/// See the [module documentation](self) for the algorithm.
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
    /// The GCRA state, in tokens (see the module docs). Alone on its cache line: it is the only word
    /// written on the hot path.
    tat: CachePadded<AtomicU64>,
    /// The configuration, read-mostly.
    config: CachePadded<Config>,
    clock: C,
}

/// The configuration, guarded by the seqlock `version`.
struct Config {
    /// Even: stable. Odd: a `set_rate` is writing the other fields.
    version: AtomicU64,
    /// Start of the current linear piece of `L`, in clock nanoseconds.
    base_ns: AtomicU64,
    /// `L(base_ns)`.
    level0: AtomicU64,
    /// High 64 bits of the multiplier (`<= 2^32`).
    mult_hi: AtomicU64,
    /// Low 64 bits of the multiplier.
    mult_lo: AtomicU64,
    /// Capacity, in tokens (`>= 1`).
    burst: AtomicU64,
    /// The configured rate per second, as `f64` bits (for [`TokenBucket::rate`]).
    rate_bits: AtomicU64,
}

/// A consistent copy of [`Config`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Snapshot {
    base_ns: u64,
    level0: u64,
    mult_hi: u64,
    mult_lo: u64,
    burst: u64,
    rate_bits: u64,
}

impl Snapshot {
    /// The multiplier as one number (`mult / 2^96` tokens per nanosecond).
    #[inline]
    fn mult(&self) -> u128 {
        (u128::from(self.mult_hi) << 64) | u128::from(self.mult_lo)
    }

    /// `L(now)`: the level at `now`. A `now` before `base_ns` counts as `base_ns` (no time passed).
    #[inline]
    fn level_at(&self, now: u64) -> u64 {
        let elapsed = u128::from(now.saturating_sub(self.base_ns));
        // floor(elapsed * mult / 2^96), exactly: elapsed*hi <= 2^96 and (elapsed*lo) >> 64 < 2^64.
        let accrued = (elapsed * u128::from(self.mult_hi) + ((elapsed * u128::from(self.mult_lo)) >> 64)) >> 32;
        // accrued <= elapsed < 2^64 because mult <= 2^96.
        self.level0.saturating_add(accrued as u64)
    }

    /// `L - burst`: the least value `tat` is treated as having at level `level` (the bucket holds at most
    /// `burst`).
    #[inline]
    fn clamp(&self, level: u64) -> u64 {
        level.saturating_sub(self.burst)
    }
}

impl Config {
    fn new(base_ns: u64, level0: u64, mult: u128, burst: u64, rate: f64) -> Self {
        Self {
            version: AtomicU64::new(0),
            base_ns: AtomicU64::new(base_ns),
            level0: AtomicU64::new(level0),
            mult_hi: AtomicU64::new((mult >> 64) as u64),
            mult_lo: AtomicU64::new(mult as u64),
            burst: AtomicU64::new(burst),
            rate_bits: AtomicU64::new(rate.to_bits()),
        }
    }

    /// Reads a consistent snapshot (seqlock read side; retries while a writer is active).
    #[inline]
    fn read(&self) -> Snapshot {
        loop {
            let v1 = self.version.load(Ordering::Acquire);
            if v1 & 1 == 0 {
                let snapshot = Snapshot {
                    base_ns: self.base_ns.load(Ordering::Relaxed),
                    level0: self.level0.load(Ordering::Relaxed),
                    mult_hi: self.mult_hi.load(Ordering::Relaxed),
                    mult_lo: self.mult_lo.load(Ordering::Relaxed),
                    burst: self.burst.load(Ordering::Relaxed),
                    rate_bits: self.rate_bits.load(Ordering::Relaxed),
                };
                fence(Ordering::Acquire);
                if self.version.load(Ordering::Relaxed) == v1 {
                    return snapshot;
                }
            }
            wait_for_writer();
        }
    }

    /// Seqlock write side, step 1: serializes writers (version even -> odd) and returns the current
    /// configuration and the odd version. Readers spin until [`unlock`](Self::unlock).
    fn lock(&self) -> (Snapshot, u64) {
        let mut version = self.version.load(Ordering::Relaxed);
        loop {
            if version & 1 == 1 {
                wait_for_writer();
                version = self.version.load(Ordering::Relaxed);
                continue;
            }
            match self.version.compare_exchange_weak(version, version + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                Err(current) => version = current,
            }
        }
        fence(Ordering::Release);
        // We hold the write lock: nobody else stores the fields, so Relaxed loads see the latest values.
        let current = Snapshot {
            base_ns: self.base_ns.load(Ordering::Relaxed),
            level0: self.level0.load(Ordering::Relaxed),
            mult_hi: self.mult_hi.load(Ordering::Relaxed),
            mult_lo: self.mult_lo.load(Ordering::Relaxed),
            burst: self.burst.load(Ordering::Relaxed),
            rate_bits: self.rate_bits.load(Ordering::Relaxed),
        };
        (current, version + 1)
    }

    /// Seqlock write side, step 2: stores `next` and releases the lock taken by [`lock`](Self::lock).
    fn unlock(&self, odd_version: u64, next: Snapshot) {
        self.base_ns.store(next.base_ns, Ordering::Relaxed);
        self.level0.store(next.level0, Ordering::Relaxed);
        self.mult_hi.store(next.mult_hi, Ordering::Relaxed);
        self.mult_lo.store(next.mult_lo, Ordering::Relaxed);
        self.burst.store(next.burst, Ordering::Relaxed);
        self.rate_bits.store(next.rate_bits, Ordering::Relaxed);
        self.version.store(odd_version.wrapping_add(1), Ordering::Release);
    }
}

/// Backs off while a `set_rate` is writing the configuration (a few dozen nanoseconds).
#[inline]
fn wait_for_writer() {
    #[cfg(loom)]
    crate::sync::yield_now();
    #[cfg(not(loom))]
    crate::sync::spin_loop();
}

/// Checks a rate and converts it to the fixed-point multiplier `ceil(rate * 2^96 / 10^9)`, exactly.
fn multiplier(rate_per_second: f64) -> Result<u128, ConfigError> {
    // `!(a <= x && x <= b)` is also true for NaN.
    if !(MIN_RATE..=MAX_RATE).contains(&rate_per_second) {
        return Err(ConfigError::InvalidRate { what: RATE_WHAT, value: rate_per_second, min: MIN_RATE, max: MAX_RATE });
    }
    // rate = mantissa * 2^exponent exactly; the rate is positive, finite and normal here.
    let bits = rate_per_second.to_bits();
    let biased = ((bits >> 52) & 0x7ff) as i32;
    let mantissa = u128::from((bits & ((1 << 52) - 1)) | (1 << 52));
    let exponent = biased - 1075;
    // rate >= 0.001 > 2^-10 and mantissa < 2^53 give exponent >= -63, so the shift is >= 33; and
    // rate <= 10^9 < 2^30 gives mantissa << shift < 2^126: the numerator fits a u128 exactly.
    let shift = u32::try_from(exponent + 96).expect("rate range keeps the shift positive");
    let numerator = mantissa << shift;
    Ok(numerator.div_ceil(NANOS_PER_SEC))
}

/// Converts a nanosecond count that may exceed `u64` to a `Duration` (saturating at `Duration::MAX`).
fn duration_from_nanos_u128(nanos: u128) -> Duration {
    match u64::try_from(nanos / NANOS_PER_SEC) {
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
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
        let mult = multiplier(rate_per_second)?;
        if burst == 0 {
            return Err(ConfigError::Zero { what: BURST_WHAT });
        }
        let now = clock.now_nanos();
        let level0 = burst.max(LEVEL_HEADROOM);
        Ok(Self {
            tat: CachePadded(AtomicU64::new(level0 - burst)),
            config: CachePadded(Config::new(now, level0, mult, burst, rate_per_second)),
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
    /// takes them first); [`AcquireError::NeverFits`] if `n` exceeds the burst.
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
        let config = self.config.read();
        if n > config.burst {
            return Err(AcquireError::NeverFits { requested: n, burst: config.burst });
        }
        if n == 0 {
            return Ok(());
        }
        let level = config.level_at(now_nanos);
        let clamp = config.clamp(level);
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let start = tat.max(clamp);
            // start + n <= level, without overflow.
            if start > level || level - start < n {
                return Err(self.not_yet(&config, tat, n, now_nanos));
            }
            match self.tat.compare_exchange_weak(tat, start + n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(current) => tat = current,
            }
        }
    }

    /// The refusal for an acquire of `n` (`0 < n <= burst`) that does not fit at `now` with state `tat`:
    /// the exact wait until `L(now + d) >= tat + n`.
    #[cold]
    #[inline(never)]
    fn not_yet(&self, config: &Snapshot, tat: u64, n: u64, now: u64) -> AcquireError {
        let target = u128::from(tat) + u128::from(n);
        if target > u128::from(u64::MAX) {
            // The level saturates at u64::MAX: the lifetime token count is exhausted.
            return AcquireError::NeverFits { requested: n, burst: config.burst };
        }
        // L(base + e) >= target  iff  floor(e * mult / 2^96) >= k  iff  e >= ceil(k * 2^96 / mult).
        let k = target - u128::from(config.level0); // >= 1: otherwise the acquire would have fitted
        let elapsed = ceil_mul_pow2_96_div(k, config.mult());
        let at = u128::from(config.base_ns) + elapsed;
        let wait = at.saturating_sub(u128::from(now)).max(1);
        debug_assert!(
            at > u128::from(u64::MAX)
                || u128::from(config.level_at(at as u64)) >= target
                    && (at == 0 || u128::from(config.level_at(at as u64 - 1)) < target)
        );
        AcquireError::NotYet { retry_after: duration_from_nanos_u128(wait) }
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
        let config = self.config.read();
        let level = config.level_at(now_nanos);
        let start = self.tat.load(Ordering::Relaxed).max(config.clamp(level));
        level.saturating_sub(start)
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
        let config = self.config.read();
        if n > config.burst {
            return Err(AcquireError::NeverFits { requested: n, burst: config.burst });
        }
        if n == 0 {
            return Ok(Duration::ZERO);
        }
        let level = config.level_at(now_nanos);
        let tat = self.tat.load(Ordering::Relaxed);
        let start = tat.max(config.clamp(level));
        if start <= level && level - start >= n {
            return Ok(Duration::ZERO);
        }
        match self.not_yet(&config, tat, n, now_nanos) {
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
        let config = self.config.read();
        let clamp = config.clamp(config.level_at(now_nanos));
        let mut tat = self.tat.load(Ordering::Relaxed);
        loop {
            let new = tat.saturating_sub(n).max(clamp);
            if new == tat {
                return;
            }
            match self.tat.compare_exchange_weak(tat, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(current) => tat = current,
            }
        }
    }

    /// Changes the refill rate and the burst at run time, keeping the tokens currently available (capped
    /// at the new burst).
    ///
    /// From now on the bucket refills at the new rate; progress towards the next whole token (less than
    /// one token) is discarded. Concurrent acquires and refunds are ordered entirely before or entirely
    /// after the change; concurrent `set_rate` calls are serialized.
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
        let mult = multiplier(rate_per_second)?;
        if burst == 0 {
            return Err(ConfigError::Zero { what: BURST_WHAT });
        }
        let (old, odd_version) = self.config.lock();
        let now = self.clock.now_nanos();
        let level = old.level_at(now);
        // Raise a stale `tat` to the old clamp, so that the new burst cannot resurrect tokens the old one
        // dropped. Invisible to the old configuration at or after `now`.
        let clamp = old.clamp(level);
        let mut tat = self.tat.load(Ordering::Relaxed);
        while tat < clamp {
            match self.tat.compare_exchange_weak(tat, clamp, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(current) => tat = current,
            }
        }
        let next = Snapshot {
            base_ns: now.max(old.base_ns),
            level0: level,
            mult_hi: (mult >> 64) as u64,
            mult_lo: mult as u64,
            burst,
            rate_bits: rate_per_second.to_bits(),
        };
        self.config.unlock(odd_version, next);
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
        f64::from_bits(self.config.read().rate_bits)
    }

    /// The capacity: the most tokens the bucket holds, and the largest `n` that can ever be acquired.
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

    /// The exact refill rate in use, as `mult` with `rate_per_ns = mult / 2^96`
    /// (`mult = ceil(rate * 2^96 / 10^9)`). For tests that model the bucket exactly; not a stable API.
    #[doc(hidden)]
    pub fn __rate_multiplier(&self) -> u128 {
        self.config.read().mult()
    }
}

/// `ceil(k * 2^96 / m)` for `k < 2^65` and `2^56 <= m <= 2^96`, by long division in 32-bit steps
/// (the dividend has up to 161 bits; every intermediate fits a `u128`).
fn ceil_mul_pow2_96_div(k: u128, m: u128) -> u128 {
    // k * 2^96 = (k << 32) * 2^64; k << 32 < 2^97.
    let a = k << 32;
    let mut q = a / m;
    let mut r = a % m;
    for _ in 0..2 {
        // r < m <= 2^96, so r << 32 < 2^128.
        let shifted = r << 32;
        q = (q << 32) + shifted / m;
        r = shifted % m;
    }
    if r == 0 { q } else { q + 1 }
}

impl<C: Clock> fmt::Debug for TokenBucket<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = self.config.read();
        f.debug_struct("TokenBucket")
            .field("rate_per_second", &f64::from_bits(config.rate_bits))
            .field("burst", &config.burst)
            .field("tat", &self.tat.load(Ordering::Relaxed))
            .field("level0", &config.level0)
            .field("base_ns", &config.base_ns)
            .field("clock", &self.clock)
            .finish()
    }
}

/// Why [`TokenBucket::try_acquire`] took nothing.
///
/// # Examples
///
/// ```
/// use kvgate::bucket::{AcquireError, TokenBucket};
///
/// let bucket = TokenBucket::new(1.0, 1)?;
/// bucket.try_acquire(1).unwrap();
/// match bucket.try_acquire(1) {
///     Err(AcquireError::NotYet { retry_after }) => assert!(retry_after.as_nanos() > 0),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// Retry later: exactly this long until the requested tokens are available, if nobody else takes
    /// them first (always > 0).
    #[error("not enough tokens yet; retry after {retry_after:?}")]
    NotYet {
        /// The wait until the acquire would succeed.
        retry_after: Duration,
    },
    /// Never fits: more tokens were requested than the bucket can hold (`requested > burst`), so retrying
    /// cannot help. (Also returned once the bucket's lifetime allowance, at least 2^63 tokens, is spent.)
    #[error("{requested} tokens requested but the bucket holds at most {burst}; split the request or raise the burst")]
    NeverFits {
        /// The number of tokens asked for.
        requested: u64,
        /// The bucket's capacity.
        burst: u64,
    },
}

impl AcquireError {
    /// When retrying can succeed: `Some(wait)` for [`NotYet`](Self::NotYet), `None` for
    /// [`NeverFits`](Self::NeverFits).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::AcquireError;
    /// use std::time::Duration;
    ///
    /// let e = AcquireError::NotYet { retry_after: Duration::from_millis(3) };
    /// assert_eq!(e.retry_after(), Some(Duration::from_millis(3)));
    /// assert_eq!(AcquireError::NeverFits { requested: 9, burst: 8 }.retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::NotYet { retry_after } => Some(*retry_after),
            Self::NeverFits { .. } => None,
        }
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
    fn multiplier_is_the_exact_ceiling() {
        assert_eq!(multiplier(1e9).unwrap(), 1 << 96);
        assert_eq!(multiplier(0.5e9).unwrap(), 1 << 95);
        for rate in [0.001, 0.1, 1.0, 3.0, 7.5, 1e6, 123_456.789, 999_999_999.9] {
            let m = multiplier(rate).unwrap();
            let exact = rate * 2f64.powi(96) / 1e9;
            assert!((m as f64 - exact).abs() <= exact * 1e-15 + 1.0, "{rate}");
        }
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
        let max = bucket(0.001, u64::MAX);
        assert_eq!(max.try_acquire(u64::MAX), Ok(()));
        // Documented limit: at most 2^64 - 1 tokens over the bucket's lifetime, and this one took them all.
        assert_eq!(max.try_acquire(1).unwrap_err().retry_after(), None);
        let half = bucket(1e9, 1 << 63);
        assert_eq!(half.try_acquire(1 << 63), Ok(()));
        assert_eq!(half.try_acquire(1).unwrap_err().retry_after(), Some(Duration::from_nanos(1)));
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

    #[test]
    fn is_send_sync_debug() {
        fn check<T: Send + Sync + fmt::Debug>() {}
        check::<TokenBucket>();
        check::<TokenBucket<ManualClock>>();
        let s = format!("{:?}", bucket(2.0, 3));
        assert!(s.contains("TokenBucket") && s.contains("burst: 3"), "{s}");
    }
}
