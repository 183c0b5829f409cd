//! The GCRA level arithmetic: the level `L(t)` of one configuration, the clamp, the exact wait until a
//! level is reached, the conversion of `tat` at a rate change, and the fixed-point multiplier. Pure
//! functions of a [`Gcra`] copy: no atomics, no clock, nothing shared (the module docs of
//! [`bucket`](super) define the unit, `L`, `tat` and the operations).
//!
//! # The unit
//!
//! A token is `unit` units, `unit = max(1, min(floor(10^9 / rate), floor(2^61 / burst)))`, computed
//! exactly from the `f64`. The first bound keeps `rate * unit <= 10^9`: the level gains at most one unit
//! per nanosecond, so the multiplier fits 96 bits and one configuration's level lasts at least
//! `3 * 2^61 - 1` units, that many nanoseconds or more. Short of it, `rate * unit > 10^9 - rate`, so one unit accrues in less than
//! `1 / (1 - rate / 10^9)` ns: exactly 1 ns when `10^9 / rate` is an integer (1/s, 5/s, 1000/s, 10^9/s,
//! ...), and always less than 2 ns (at rates above `5 * 10^8`/s the unit is the token); the hot path skips
//! the multiplication when it is exactly 1 ns. The second bound keeps a full bucket's `burst * unit` within
//! `2^61` units; it is the smaller one only when the burst takes longer than `2^61` units (at least 73
//! years) to refill, and then one unit is `1 / unit` of a token. Bursts above `2^61` tokens have
//! `unit = 1` and hold at most `2^61` tokens.
//!
//! # No drift (proof)
//!
//! `L(t)` is computed from the fixed origin `base_ns`, never by adding per-call increments, so rounding
//! never accumulates: the number of tokens granted in `[base_ns, t]` by a greedy caller (one that never
//! lets the bucket fill up) is exactly `burst + floor(floor((t - base_ns) * mult / 2^96) / unit) =
//! burst + floor((t - base_ns) * mult / (unit * 2^96))` (for bursts up to `2^61`). Because costs are whole multiples of the unit, comparing integer unit counts against
//! the floor of the real-valued level loses nothing: a unit exists at time `t` exactly when the
//! real-valued level has passed it. (This is a bucket whose units arrive one at a time, at the instants
//! where the real-valued level crosses an integer, and which is capped at `burst * unit`.)
//!
//! # The multiplier
//!
//! `mult = ceil(rate * unit * 2^96 / 10^9)` (units per nanosecond, 96 fractional bits), computed exactly
//! from the `f64`'s integer mantissa and exponent (no floating-point products). Rounding up means the
//! level runs ahead of the exact rate by less than 2^-96 units per nanosecond, which is less than one unit
//! over the whole 2^64 ns axis, or `2^-32 / unit` tokens; and for rates whose per-nanosecond value has a
//! small denominator (every integer rate, and decimal rates such as 0.001/s over years) the token count
//! `floor` lands on exactly `floor(rate * t)`, even at the instants where `rate * t` is an integer
//! (rounding down would deliver those tokens 1 ns late). `floor(e * mult / 2^96)` is evaluated with two
//! `u64 x u64 -> u128` products, splitting `mult = hi * 2^64 + lo`: `(e*hi + ((e*lo) >> 64)) >> 32`, which
//! is exact (no rounding beyond the final floor).
//!
//! # The wait
//!
//! `L(base + e) >= target` iff `floor(e * mult / 2^96) >= k` iff `e >= ceil(k * 2^96 / mult)`, with
//! `k = target - level0`: one long division gives the exact, minimal wait, which
//! [`Gcra::wait_until`] checks against `level_at` in debug builds.

use std::time::Duration;

use crate::ConfigError;

/// Smallest accepted refill rate, in tokens per second.
const MIN_RATE: f64 = 0.001;
/// Largest accepted refill rate, in tokens per second (one token per nanosecond).
const MAX_RATE: f64 = 1e9;
/// Name of the rate in configuration errors.
const RATE_WHAT: &str = "token bucket rate";
/// Name of the burst in configuration errors.
const BURST_WHAT: &str = "token bucket burst";
const NANOS_PER_SEC: u128 = 1_000_000_000;
/// The generation bit of `tat` and of every level of one configuration (the module docs of
/// [`bucket`](super) say why a rate change flips it).
const GENERATION: u64 = 1 << 63;
/// The largest level value, without the generation bit: where a configuration's level saturates.
const LEVEL_MAX: u64 = GENERATION - 1;
/// The most units a bucket holds; also the highest level at which a rate change keeps the level where it
/// is (above it, the new configuration's level starts again at its capacity).
const CAP_MAX: u64 = 1 << 61;
/// `mult_hi` of `mult = 2^96`, one unit per nanosecond (the largest multiplier: `mult_lo` is then 0).
const ONE_PER_NS_HI: u64 = 1 << 32;

/// A checked refill rate and burst, with the unit and the fixed-point multiplier that follow from them:
/// what a configuration is built from, validated before the bucket is touched.
#[derive(Debug, Clone, Copy)]
pub(super) struct Quota {
    /// `ceil(rate * unit * 2^96 / 10^9)` (`<= 2^96`).
    mult: u128,
    /// Units per token (`>= 1`).
    unit: u64,
    /// The most units the bucket holds: `min(burst, 2^61) * unit <= 2^61`.
    cap: u64,
    /// Capacity, in tokens, as configured (`>= 1`).
    burst: u64,
    /// The rate as given.
    rate: f64,
}

impl Quota {
    /// Checks a rate and a burst, and derives the unit and the multiplier.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] if `rate_per_second` is not a finite number in `[0.001, 1e9]` (checked
    /// first); [`ConfigError::Zero`] if `burst` is 0.
    pub(super) fn new(rate_per_second: f64, burst: u64) -> Result<Self, ConfigError> {
        let rate = ExactRate::new(rate_per_second)?;
        if burst == 0 {
            return Err(ConfigError::Zero { what: BURST_WHAT });
        }
        let unit = rate.units_per_token().min(CAP_MAX / burst).max(1);
        // unit > 1 only if unit <= 2^61 / burst; unit == 1 caps the burst at 2^61 instead.
        let cap = burst.min(CAP_MAX) * unit;
        Ok(Self { mult: rate.multiplier(unit), unit, cap, burst, rate: rate_per_second })
    }

    /// The rate as given.
    pub(super) fn rate(&self) -> f64 {
        self.rate
    }
}

/// One linear piece of the level axis, the unit and the burst: everything the algorithm needs besides
/// `tat`, as one consistent copy (what the seqlock'd `Config` stores and hands out; the rate as given,
/// which only `rate()` reads, is stored beside it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Gcra {
    /// Start of the current linear piece of `L`, in clock nanoseconds.
    pub(super) base_ns: u64,
    /// `L(base_ns)`, with this configuration's generation bit; its value is in `[cap, 2^61]`.
    pub(super) level0: u64,
    /// High 64 bits of the multiplier (`<= 2^32`).
    pub(super) mult_hi: u64,
    /// Low 64 bits of the multiplier.
    pub(super) mult_lo: u64,
    /// Units per token (`>= 1`).
    pub(super) unit: u64,
    /// The most units the bucket holds (`<= 2^61`).
    pub(super) cap: u64,
    /// Capacity, in tokens, as configured (`>= 1`).
    pub(super) burst: u64,
}

impl Gcra {
    /// The first piece of a new bucket: generation 0, starts at `now` at level `cap`.
    pub(super) fn starting(quota: Quota, now: u64) -> Self {
        Self::piece(quota, now, quota.cap)
    }

    /// The `tat` of a full bucket on this piece's first instant: `level0 - cap`.
    pub(super) fn full_tat(&self) -> u64 {
        self.level0 - self.cap
    }

    /// The piece that follows this one after a rate change at `now`, in the other generation: it starts at
    /// `max(now, base_ns)` (a clock that steps back never moves it back), on the level this one reached
    /// there if that is at most `2^61` (raised to the new capacity if below it), else on the new capacity.
    pub(super) fn continued(&self, quota: Quota, now: u64) -> Self {
        let level = self.level_at(now) & LEVEL_MAX;
        let level0 = if level <= CAP_MAX { level.max(quota.cap) } else { quota.cap };
        Self::piece(quota, now.max(self.base_ns), (!self.level0 & GENERATION) | level0)
    }

    fn piece(quota: Quota, base_ns: u64, level0: u64) -> Self {
        Self {
            base_ns,
            level0,
            mult_hi: (quota.mult >> 64) as u64,
            mult_lo: quota.mult as u64,
            unit: quota.unit,
            cap: quota.cap,
            burst: quota.burst,
        }
    }

    /// The multiplier as one number (`mult / 2^96` units per nanosecond).
    #[inline]
    pub(super) fn mult(&self) -> u128 {
        (u128::from(self.mult_hi) << 64) | u128::from(self.mult_lo)
    }

    /// Whether `word` (a `tat`) belongs to this configuration's generation.
    #[inline]
    pub(super) fn owns(&self, word: u64) -> bool {
        (word ^ self.level0) & GENERATION == 0
    }

    /// The highest level of this piece, with its generation bit: where `L` saturates.
    #[inline]
    fn top(&self) -> u64 {
        self.level0 | LEVEL_MAX
    }

    /// `L(now)`: the level at `now`, with the generation bit. A `now` before `base_ns` counts as `base_ns`
    /// (no time passed).
    #[inline]
    pub(super) fn level_at(&self, now: u64) -> u64 {
        let elapsed = now.saturating_sub(self.base_ns);
        let accrued = if self.mult_hi == ONE_PER_NS_HI {
            // mult = 2^96 (then mult_lo = 0): one unit per nanosecond, whenever 10^9 / rate is an integer.
            elapsed
        } else {
            let elapsed = u128::from(elapsed);
            // floor(elapsed * mult / 2^96), exactly: elapsed*hi <= 2^96 and (elapsed*lo) >> 64 < 2^64;
            // the result is at most elapsed because mult <= 2^96.
            ((elapsed * u128::from(self.mult_hi) + ((elapsed * u128::from(self.mult_lo)) >> 64)) >> 32) as u64
        };
        // Saturates within the generation (`top - level0` is independent of the clock: off the critical path).
        self.level0 + accrued.min(self.top() - self.level0)
    }

    /// `L - cap`: the least value `tat` is treated as having at level `level` (the bucket holds at most
    /// `cap` units). Never below the generation's zero: `level >= level0 >= cap`.
    #[inline]
    pub(super) fn clamp(&self, level: u64) -> u64 {
        level - self.cap
    }

    /// The exact wait from `now` until `L >= target` (at least 1 ns), for a `target` above the level at
    /// `now`; `None` when `target` is above the level's saturation, which never arrives (this
    /// configuration's lifetime allowance is spent).
    pub(super) fn wait_until(&self, target: u128, now: u64) -> Option<Duration> {
        if target > u128::from(self.top()) {
            return None;
        }
        // L(base + e) >= target  iff  floor(e * mult / 2^96) >= k  iff  e >= ceil(k * 2^96 / mult).
        let k = target - u128::from(self.level0); // >= 1: the target is above the level at `now`
        let elapsed = ceil_mul_pow2_96_div(k, self.mult());
        let at = u128::from(self.base_ns) + elapsed;
        let wait = at.saturating_sub(u128::from(now)).max(1);
        debug_assert!(
            at > u128::from(u64::MAX)
                || u128::from(self.level_at(at as u64)) >= target
                    && (at == 0 || u128::from(self.level_at(at as u64 - 1)) < target)
        );
        Some(duration_from_nanos_u128(wait))
    }

    /// `tat` (this generation's `word`) as `next` (the following piece, from [`continued`](Self::continued)
    /// at the same `now`) must see it: the units held at `now` become `floor(units / unit)` whole tokens
    /// and the progress towards the next one, both in `next`'s units (the progress rounded down), capped at
    /// `next`'s capacity; a debt (a `tat` above the level, left by a time supplied from the future) stays
    /// a debt of the same tokens, rounded up.
    pub(super) fn convert(&self, word: u64, now: u64, next: &Gcra) -> u64 {
        debug_assert!(self.owns(word) && !next.owns(word));
        let level = self.level_at(now);
        let (unit, next_unit) = (u128::from(self.unit), u128::from(next.unit));
        if word <= level {
            let held = u128::from((level - word).min(self.cap));
            // held / unit <= 2^61 and next_unit <= 10^12: no overflow.
            let kept = (held / unit * next_unit + held % unit * next_unit / unit).min(u128::from(next.cap));
            next.level0 - kept as u64
        } else {
            let owed = (u128::from(word - level) * next_unit).div_ceil(unit);
            (u128::from(next.level0) + owed).min(u128::from(next.top())) as u64
        }
    }
}

/// A rate as the exact rational `mantissa * 2^-shift` (the `f64`'s value, no rounding).
struct ExactRate {
    mantissa: u128,
    /// `-exponent`: 23..=62 over the accepted range.
    shift: u32,
}

impl ExactRate {
    /// Checks a rate and splits it.
    fn new(rate_per_second: f64) -> Result<Self, ConfigError> {
        // `!(a <= x && x <= b)` is also true for NaN.
        if !(MIN_RATE..=MAX_RATE).contains(&rate_per_second) {
            return Err(ConfigError::InvalidRate {
                what: RATE_WHAT,
                value: rate_per_second,
                min: MIN_RATE,
                max: MAX_RATE,
            });
        }
        // rate = mantissa * 2^exponent exactly; the rate is positive, finite and normal here.
        let bits = rate_per_second.to_bits();
        let biased = ((bits >> 52) & 0x7ff) as i32;
        let mantissa = u128::from((bits & ((1 << 52) - 1)) | (1 << 52));
        // 2^-10 < rate < 2^30 and 2^52 <= mantissa < 2^53 give -62 <= exponent <= -23.
        let shift = u32::try_from(1075 - biased).expect("rate range keeps the exponent negative");
        Ok(Self { mantissa, shift })
    }

    /// `floor(10^9 / rate)`, exactly: `10^9 * 2^shift < 2^93`.
    fn units_per_token(&self) -> u64 {
        let per_token = (NANOS_PER_SEC << self.shift) / self.mantissa;
        // rate >= 0.001: at most 10^12.
        u64::try_from(per_token).expect("rate range bounds the unit")
    }

    /// `ceil(rate * unit * 2^96 / 10^9)`, exactly, for `unit <= floor(10^9 / rate)`.
    fn multiplier(&self, unit: u64) -> u128 {
        // mantissa * unit < 2^53 * 2^40; rate * unit <= 10^9 < 2^30 makes the shifted value < 2^126.
        let numerator = (self.mantissa * u128::from(unit)) << (96 - self.shift);
        numerator.div_ceil(NANOS_PER_SEC)
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

/// Converts a nanosecond count that may exceed `u64` to a `Duration` (saturating at `Duration::MAX`).
fn duration_from_nanos_u128(nanos: u128) -> Duration {
    match u64::try_from(nanos / NANOS_PER_SEC) {
        Ok(secs) => Duration::new(secs, (nanos % NANOS_PER_SEC) as u32),
        Err(_) => Duration::MAX,
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn quota(rate: f64, burst: u64) -> Quota {
        Quota::new(rate, burst).unwrap()
    }

    #[test]
    fn the_unit_and_the_multiplier_are_exact() {
        // 10^9 / rate an integer: one unit per nanosecond exactly.
        for (rate, unit) in [(1e9, 1), (5e8, 2), (5.0, 200_000_000), (1.0, 1_000_000_000), (1000.0, 1_000_000)] {
            let q = quota(rate, 1);
            assert_eq!((q.unit, q.mult), (unit, 1 << 96), "{rate}");
        }
        // The f64 0.001 is slightly above 1/1000: 10^9 / rate is just below 10^12.
        assert_eq!(quota(0.001, 1).unit, 999_999_999_999);
        assert_eq!(quota(3.0, 1).unit, 333_333_333);
        assert_eq!(quota(7e8, 1).unit, 1);
        for rate in [0.001, 0.1, 1.0, 3.0, 7.5, 1e6, 123_456.789, 999_999_999.9, 7e8] {
            let q = quota(rate, 1);
            let exact = rate * q.unit as f64 * 2f64.powi(96) / 1e9;
            assert!(q.mult <= 1 << 96 && q.mult > 1 << 95, "{rate}");
            assert!((q.mult as f64 - exact).abs() <= exact * 1e-15 + 1.0, "{rate}");
        }
    }

    #[test]
    fn a_burst_that_refills_in_more_than_2_61_units_gets_a_coarser_unit() {
        let q = quota(0.001, 1 << 40);
        assert_eq!((q.unit, q.cap), (1 << 21, 1 << 61));
        let q = quota(1.0, u64::MAX);
        assert_eq!((q.unit, q.cap, q.burst), (1, 1 << 61, u64::MAX));
        let q = quota(1e9, 1 << 61);
        assert_eq!((q.unit, q.cap), (1, 1 << 61));
    }

    #[test]
    fn a_quota_checks_the_rate_before_the_burst() {
        assert!(matches!(Quota::new(f64::NAN, 0), Err(ConfigError::InvalidRate { .. })));
        assert_eq!(Quota::new(1.0, 0).unwrap_err(), ConfigError::Zero { what: BURST_WHAT });
    }

    #[test]
    fn a_continued_piece_flips_the_generation_and_keeps_the_level_continuous() {
        let first = Gcra::starting(quota(2.0, 10), 1_000);
        assert_eq!((first.level0, first.full_tat()), (5_000_000_000, 0));
        let next = first.continued(quota(1e9, 3), 1_000 + 1_500_000_000);
        assert_eq!((next.base_ns, next.level0), (1_000 + 1_500_000_000, GENERATION | 6_500_000_000));
        assert_eq!((next.burst, next.unit), (3, 1));
        // A clock that stepped back: the piece starts where the last one did, on the same level.
        let back = next.continued(quota(1.0, 1), 0);
        assert_eq!((back.base_ns, back.level0), (next.base_ns, 6_500_000_000));
        // A level below the new capacity is raised to it; one above 2^61 starts again at the capacity.
        let small = Gcra::starting(quota(1e9, 1), 0);
        assert_eq!(small.continued(quota(1.0, 4), 0).level0, GENERATION | 4_000_000_000);
        let late = small.continued(quota(1e9, 1), 1 << 62);
        assert_eq!(late.level0, GENERATION | 1);
        assert_eq!(late.level_at(u64::MAX), u64::MAX, "saturates within its generation");
    }

    #[test]
    fn a_conversion_keeps_tokens_and_progress_in_the_new_unit() {
        let old = Gcra::starting(quota(2.0, 10), 0); // unit 5e8
        let next = old.continued(quota(5.0, 10), 0); // unit 2e8
        let at = |held: u64| old.convert(old.level0 - held, 0, &next);
        assert_eq!(next.level0 - at(0), 0);
        assert_eq!(next.level0 - at(3 * 500_000_000 + 250_000_000), 3 * 200_000_000 + 100_000_000);
        assert_eq!(next.level0 - at(5_000_000_000), 2_000_000_000, "full");
        let small = old.continued(quota(5.0, 2), 0);
        assert_eq!(small.level0 - old.convert(old.full_tat(), 0, &small), 400_000_000, "capped at the new burst");
        // A debt of 1.5 tokens stays 1.5 tokens.
        assert_eq!(old.convert(old.level0 + 750_000_000, 0, &next), next.level0 + 300_000_000);
    }

    #[test]
    fn waits_are_exact_and_minimal() {
        let gcra = Gcra::starting(quota(3.0, 2), 0);
        let target = u128::from(gcra.level0) + 2 * u128::from(gcra.unit);
        assert_eq!(gcra.wait_until(target, 0), Some(Duration::from_nanos(666_666_667)));
        assert_eq!(gcra.wait_until(target, 666_666_666), Some(Duration::from_nanos(1)));
        assert_eq!(gcra.wait_until(u128::from(LEVEL_MAX) + 1, 0), None);
    }
}
