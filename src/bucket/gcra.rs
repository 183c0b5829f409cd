//! The GCRA level arithmetic: the level `L(t)` of one configuration, the clamp, the exact wait until a
//! level is reached, and the fixed-point multiplier. Pure functions of a [`Gcra`] copy: no atomics, no
//! clock, nothing shared (the module docs of [`bucket`](super) define `L`, `tat` and the operations).
//!
//! # No drift (proof)
//!
//! `L(t)` is computed from the fixed origin `base_ns`, never by adding per-call increments, so rounding
//! never accumulates: the number of tokens granted in `[base_ns, t]` by a greedy caller is exactly
//! `burst + floor((t - base_ns) * mult / 2^96)`. Because costs are integers, comparing integer token counts
//! against the floor of the real-valued level loses nothing: a token exists at time `t` exactly when the
//! real-valued level has passed it. (This is a bucket whose tokens arrive one at a time, at the instants
//! where the real-valued level crosses an integer, and which is capped at `burst`.)
//!
//! # The multiplier
//!
//! `mult = ceil(rate * 2^96 / 10^9)`, computed exactly from the `f64`'s integer mantissa and exponent (no
//! floating-point products). Rounding up means the level runs ahead of the exact rate by less than 2^-96
//! tokens per nanosecond, which is less than one token over the whole 2^64 ns axis; and for rates whose
//! per-nanosecond value has a small denominator (every integer rate, and decimal rates such as 0.001/s
//! over years) `floor` lands on exactly `floor(rate * t)`, even at the instants where `rate * t` is an
//! integer (rounding down would deliver those tokens 1 ns late). `floor(e * mult / 2^96)` is evaluated
//! with two `u64 x u64 -> u128` products, splitting `mult = hi * 2^64 + lo`:
//! `(e*hi + ((e*lo) >> 64)) >> 32`, which is exact (no rounding beyond the final floor).
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
/// Where the level axis starts (at least): room for `tat` below `L - burst` when the burst grows.
const LEVEL_HEADROOM: u64 = 1 << 63;

/// A checked refill rate and burst, with the rate as its fixed-point multiplier: what a configuration is
/// built from, validated before the bucket is touched.
#[derive(Debug, Clone, Copy)]
pub(super) struct Quota {
    /// `ceil(rate * 2^96 / 10^9)` (`<= 2^96`).
    mult: u128,
    /// Capacity, in tokens (`>= 1`).
    burst: u64,
    /// The rate as given, as `f64` bits.
    rate_bits: u64,
}

impl Quota {
    /// Checks a rate and a burst.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] if `rate_per_second` is not a finite number in `[0.001, 1e9]` (checked
    /// first); [`ConfigError::Zero`] if `burst` is 0.
    pub(super) fn new(rate_per_second: f64, burst: u64) -> Result<Self, ConfigError> {
        let mult = multiplier(rate_per_second)?;
        if burst == 0 {
            return Err(ConfigError::Zero { what: BURST_WHAT });
        }
        Ok(Self { mult, burst, rate_bits: rate_per_second.to_bits() })
    }
}

/// One linear piece of the level axis and the burst: everything the algorithm needs besides `tat`, as one
/// consistent copy (what the seqlock'd `Config` stores and hands out).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Gcra {
    /// Start of the current linear piece of `L`, in clock nanoseconds.
    pub(super) base_ns: u64,
    /// `L(base_ns)`.
    pub(super) level0: u64,
    /// High 64 bits of the multiplier (`<= 2^32`).
    pub(super) mult_hi: u64,
    /// Low 64 bits of the multiplier.
    pub(super) mult_lo: u64,
    /// Capacity, in tokens (`>= 1`).
    pub(super) burst: u64,
    /// The configured rate per second, as `f64` bits.
    pub(super) rate_bits: u64,
}

impl Gcra {
    /// The first piece of a new bucket: starts at `now`, at level `max(burst, 2^63)`.
    pub(super) fn starting(quota: Quota, now: u64) -> Self {
        Self::piece(quota, now, quota.burst.max(LEVEL_HEADROOM))
    }

    /// The `tat` of a full bucket on this piece's first instant: `level0 - burst`.
    pub(super) fn full_tat(&self) -> u64 {
        self.level0 - self.burst
    }

    /// The piece that continues this one at `now` with a new quota: it starts at `max(now, base_ns)` on
    /// the level this one reached there, so `L` stays continuous (and never moves back for a clock that
    /// steps backwards).
    pub(super) fn continued(&self, quota: Quota, now: u64) -> Self {
        Self::piece(quota, now.max(self.base_ns), self.level_at(now))
    }

    fn piece(quota: Quota, base_ns: u64, level0: u64) -> Self {
        Self {
            base_ns,
            level0,
            mult_hi: (quota.mult >> 64) as u64,
            mult_lo: quota.mult as u64,
            burst: quota.burst,
            rate_bits: quota.rate_bits,
        }
    }

    /// The multiplier as one number (`mult / 2^96` tokens per nanosecond).
    #[inline]
    pub(super) fn mult(&self) -> u128 {
        (u128::from(self.mult_hi) << 64) | u128::from(self.mult_lo)
    }

    /// The refill rate, in tokens per second, as configured.
    #[inline]
    pub(super) fn rate(&self) -> f64 {
        f64::from_bits(self.rate_bits)
    }

    /// `L(now)`: the level at `now`. A `now` before `base_ns` counts as `base_ns` (no time passed).
    #[inline]
    pub(super) fn level_at(&self, now: u64) -> u64 {
        let elapsed = u128::from(now.saturating_sub(self.base_ns));
        // floor(elapsed * mult / 2^96), exactly: elapsed*hi <= 2^96 and (elapsed*lo) >> 64 < 2^64.
        let accrued = (elapsed * u128::from(self.mult_hi) + ((elapsed * u128::from(self.mult_lo)) >> 64)) >> 32;
        // accrued <= elapsed < 2^64 because mult <= 2^96.
        self.level0.saturating_add(accrued as u64)
    }

    /// `L - burst`: the least value `tat` is treated as having at level `level` (the bucket holds at most
    /// `burst`).
    #[inline]
    pub(super) fn clamp(&self, level: u64) -> u64 {
        level.saturating_sub(self.burst)
    }

    /// The exact wait from `now` until `L >= target` (at least 1 ns), for a `target` above the level at
    /// `now`; `None` when `target` exceeds `u64::MAX`, where the saturating level never arrives (the
    /// bucket's lifetime allowance is spent).
    pub(super) fn wait_until(&self, target: u128, now: u64) -> Option<Duration> {
        if target > u128::from(u64::MAX) {
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
    fn a_quota_checks_the_rate_before_the_burst() {
        assert!(matches!(Quota::new(f64::NAN, 0), Err(ConfigError::InvalidRate { .. })));
        assert_eq!(Quota::new(1.0, 0).unwrap_err(), ConfigError::Zero { what: BURST_WHAT });
    }

    #[test]
    fn a_continued_piece_keeps_the_level_continuous_and_never_moves_back() {
        let first = Gcra::starting(Quota::new(2.0, 10).unwrap(), 1_000);
        assert_eq!((first.level0, first.full_tat()), (LEVEL_HEADROOM, LEVEL_HEADROOM - 10));
        let next = first.continued(Quota::new(1e9, 3).unwrap(), 1_000 + 1_500_000_000);
        assert_eq!((next.base_ns, next.level0), (1_000 + 1_500_000_000, LEVEL_HEADROOM + 3));
        assert_eq!((next.burst, next.rate()), (3, 1e9));
        // A clock that stepped back: the piece starts where the last one did, on the same level.
        let back = next.continued(Quota::new(1.0, 1).unwrap(), 0);
        assert_eq!((back.base_ns, back.level0), (next.base_ns, next.level0));
    }

    #[test]
    fn waits_are_exact_and_minimal() {
        let gcra = Gcra::starting(Quota::new(3.0, 2).unwrap(), 0);
        let target = u128::from(gcra.level0) + 2;
        assert_eq!(gcra.wait_until(target, 0), Some(Duration::from_nanos(666_666_667)));
        assert_eq!(gcra.wait_until(target, 666_666_666), Some(Duration::from_nanos(1)));
        assert_eq!(gcra.wait_until(u128::from(u64::MAX) + 1, 0), None);
    }
}
