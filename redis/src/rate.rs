//! A rate as the Redis scripts compute it: a whole-number ratio of tokens per microsecond and a burst.
//!
//! The scripts run GCRA on Redis' clock in microseconds (the resolution of `TIME`) with integer
//! arithmetic only (`lua/common.lua`, "GCRA"): a bucket refills `a/b` tokens per microsecond, its state
//! is a debt in units of `1/a` microsecond, and taking `n` tokens adds `n*b`. Lua's numbers are doubles,
//! exact below 2^53; [`RateSpec::new`] keeps every quantity a script forms (at most twice the full
//! debt `burst*b`, plus one step) below 2^52, so no rounding ever happens and nothing drifts.
//!
//! The configured rate is rounded to a multiple of 0.001 per second (`a/b = round(rate*1000)/10^9`,
//! reduced): exact for every rate written with at most three decimals, within 0.0005/s otherwise.
//! A refusal's wait is exact at the clock's resolution: the least whole number of microseconds after
//! which the request would pass (if nobody else takes the tokens first), as the local
//! [`TokenBucket`](kvgate::bucket::TokenBucket)'s `retry_after` is exact at the nanosecond.
//!
//! One difference from the local bucket, deliberately: tokens accrue continuously from the bucket's
//! state (time-based GCRA, as in redis-cell and governor), not at fixed instants counted from the
//! bucket's creation. A full bucket is a missing key — which is what lets idle tenants cost no memory —
//! so there is no creation instant to count from. Over any interval the two grant the same number of
//! tokens to within one; a hint can differ from a local bucket's by less than one token's interval.

use kvgate::ConfigError;

/// Smallest accepted rate (per second), as for the local buckets.
const MIN_RATE: f64 = 0.001;
/// Largest accepted rate (per second), as for the local buckets.
const MAX_RATE: f64 = 1e9;
/// Every integer a script forms stays below this.
const EXACT: u64 = 1 << 52;

/// One shared bucket's parameters: `a/b` tokens per microsecond, at most `burst` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct RateSpec {
    pub(crate) a: u64,
    pub(crate) b: u64,
    pub(crate) burst: u64,
}

fn gcd(mut x: u64, mut y: u64) -> u64 {
    while y != 0 {
        (x, y) = (y, x % y);
    }
    x
}

impl RateSpec {
    /// Checks a rate (`per_second`, `burst`) named `what` and converts it.
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidRate`] outside `[0.001, 1e9]` per second (or NaN); [`ConfigError::Zero`]
    /// for a zero burst; [`ConfigError::OutOfRange`] when the burst is so large for the rate's
    /// precision that the scripts could not compute exactly.
    pub(crate) fn new(per_second: f64, burst: u64, what: &'static str) -> Result<Self, ConfigError> {
        if !(MIN_RATE..=MAX_RATE).contains(&per_second) {
            return Err(ConfigError::InvalidRate { what, value: per_second, min: MIN_RATE, max: MAX_RATE });
        }
        if burst == 0 {
            return Err(ConfigError::Zero { what });
        }
        // Thousandths of a token per second, at least one: tokens per microsecond = milli / 10^9.
        let milli = ((per_second * 1000.0).round() as u64).max(1);
        let g = gcd(milli, 1_000_000_000);
        let (a, b) = (milli / g, 1_000_000_000 / g);
        let full = u128::from(burst) * u128::from(b);
        if full * 2 + u128::from(a) >= u128::from(EXACT) {
            return Err(ConfigError::OutOfRange {
                what,
                reason: format!(
                    "a burst of {burst} at {per_second}/s cannot be computed exactly in Redis' Lua (it needs \
                     burst x {b} < 2^51); use a smaller burst or a rate with fewer decimals"
                ),
            });
        }
        Ok(Self { a, b, burst })
    }

    /// The rate in tokens per second, after rounding.
    #[cfg(test)]
    pub(crate) fn per_second(&self) -> f64 {
        self.a as f64 * 1e6 / self.b as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_rates_reduce_to_small_ratios() {
        assert_eq!(RateSpec::new(10.0, 5, "r").unwrap(), RateSpec { a: 1, b: 100_000, burst: 5 });
        assert_eq!(RateSpec::new(1e9, 1, "r").unwrap(), RateSpec { a: 1000, b: 1, burst: 1 });
        assert_eq!(RateSpec::new(0.001, 1, "r").unwrap(), RateSpec { a: 1, b: 1_000_000_000, burst: 1 });
        assert_eq!(RateSpec::new(2.5, 1, "r").unwrap().per_second(), 2.5);
    }

    #[test]
    fn bad_rates_say_what_to_change() {
        assert!(matches!(RateSpec::new(0.0, 1, "r"), Err(ConfigError::InvalidRate { .. })));
        assert!(matches!(RateSpec::new(f64::NAN, 1, "r"), Err(ConfigError::InvalidRate { .. })));
        assert!(matches!(RateSpec::new(1.0, 0, "r"), Err(ConfigError::Zero { .. })));
        let err = RateSpec::new(0.001, 1 << 40, "r").unwrap_err();
        assert!(err.to_string().contains("smaller burst"), "{err}");
    }
}
