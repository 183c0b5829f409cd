//! `Terms`: a budget's configuration, checked once and turned into the integers every call uses.
//!
//! Balances are counted in *units* of a millionth of a retry ([`UNITS_PER_RETRY`]), so that the floor,
//! the percentage and the comparison are exact integer arithmetic:
//!
//! ```text
//! slice_nanos   = floor(ttl_nanos / SLICES)                          >= 10^8 (ttl >= 1 s)
//! reserve_units = min_retries_per_sec * floor(SLICES * slice_nanos / 1000)   (the floor over the window:
//!                 retries/s * microseconds = millionths of a retry)         <= 2^32 * 6 * 10^7 < 2^58
//! deposit_units = round(percent_can_retry * 10^6)                     <= 10^7 (percent <= 10)
//! balance_units(F, W) = reserve_units + deposit_units * F - UNITS_PER_RETRY * W
//! ```
//!
//! With `F, W <= SLICES * u32::MAX < 2^36` (ten counters of 32 bits), every term is below 2^60, so an
//! `i128` holds the balance of any window with room to spare and nothing can overflow.

use crate::ConfigError;
use std::time::Duration;

/// Slices per window: the window at time `t` is the slice holding `t` and the `SLICES - 1` before it.
pub(super) const SLICES: u64 = 10;

/// Units per retry: balances are counted in millionths of a retry.
pub(super) const UNITS_PER_RETRY: u64 = 1_000_000;

/// The shortest window a budget accepts.
const MIN_TTL: Duration = Duration::from_secs(1);

/// The longest window a budget accepts.
const MAX_TTL: Duration = Duration::from_secs(60);

/// The largest share of first tries that may be retried: 10, that is 1000 %.
const MAX_PERCENT_CAN_RETRY: f64 = 10.0;

/// A budget's configuration: the values given (for the getters) and the integers derived from them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Terms {
    /// The window, as given.
    pub(super) ttl: Duration,
    /// The floor, as given.
    pub(super) min_retries_per_sec: u32,
    /// Length of one slice of the window, in the clock's nanoseconds (at least 10^8).
    pub(super) slice_nanos: u64,
    /// The floor over a whole window, in units.
    reserve_units: u64,
    /// What one first try adds, in units: `percent_can_retry` rounded to the nearest millionth.
    pub(super) deposit_units: u64,
}

impl Terms {
    /// Checks the configuration.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming the setting: `ttl` outside 1 s..=60 s, or `percent_can_retry`
    /// NaN, negative or above 10.
    pub(super) fn new(ttl: Duration, min_retries_per_sec: u32, percent_can_retry: f64) -> Result<Self, ConfigError> {
        if !(MIN_TTL..=MAX_TTL).contains(&ttl) {
            return Err(ConfigError::OutOfRange {
                what: "retry budget ttl",
                reason: format!(
                    "{ttl:?}; use a window from 1 s to 60 s (how long a first try keeps paying for retries)"
                ),
            });
        }
        // `contains` is false for NaN.
        if !(0.0..=MAX_PERCENT_CAN_RETRY).contains(&percent_can_retry) {
            return Err(ConfigError::OutOfRange {
                what: "retry budget percent_can_retry",
                reason: format!(
                    "{percent_can_retry}; use a fraction of first tries from 0.0 to 10.0 (0.2 lets 20 % of \
                     first tries be retried; 10.0 is 1000 %)"
                ),
            });
        }
        Ok(Self::from_valid(ttl, min_retries_per_sec, percent_can_retry))
    }

    /// The terms of a configuration already known to be valid (checked by [`Terms::new`], or the defaults).
    pub(super) fn from_valid(ttl: Duration, min_retries_per_sec: u32, percent_can_retry: f64) -> Self {
        // ttl <= 60 s, so its nanoseconds fit a u64 with room to spare.
        let ttl_nanos = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        let slice_nanos = (ttl_nanos / SLICES).max(1);
        let window_micros = slice_nanos.saturating_mul(SLICES) / 1_000;
        // percent is in 0..=10, so the product is in 0..=10^7 and the cast is exact.
        let deposit_units = (percent_can_retry * UNITS_PER_RETRY as f64).round() as u64;
        Self {
            ttl,
            min_retries_per_sec,
            slice_nanos,
            reserve_units: u64::from(min_retries_per_sec).saturating_mul(window_micros),
            deposit_units,
        }
    }

    /// The slice that `now_nanos` falls in.
    #[inline]
    pub(super) fn slice(&self, now_nanos: u64) -> u64 {
        now_nanos / self.slice_nanos
    }

    /// The balance of a window holding `first_tries` and `retries`, in units (negative when first tries
    /// that paid for retries have expired before those retries).
    #[inline]
    pub(super) fn balance_units(&self, first_tries: u64, retries: u64) -> i128 {
        i128::from(self.reserve_units) + i128::from(self.deposit_units) * i128::from(first_tries)
            - i128::from(UNITS_PER_RETRY) * i128::from(retries)
    }

    /// The whole retries a window holding `first_tries` and `retries` can still pay for.
    #[inline]
    pub(super) fn whole_retries(&self, first_tries: u64, retries: u64) -> u64 {
        let whole = self.balance_units(first_tries, retries).max(0) / i128::from(UNITS_PER_RETRY);
        u64::try_from(whole).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_percentages_and_whole_second_windows_are_exact() {
        let t = Terms::new(Duration::from_secs(10), 10, 0.2).unwrap();
        assert_eq!((t.slice_nanos, t.reserve_units, t.deposit_units), (1_000_000_000, 100_000_000, 200_000));
        for (percent, units) in
            [(0.07, 70_000), (0.29, 290_000), (0.000_000_4, 0), (0.000_000_6, 1), (10.0, 10_000_000)]
        {
            assert_eq!(Terms::new(Duration::from_secs(1), 0, percent).unwrap().deposit_units, units, "{percent}");
        }
        // 1.5 s: 15 slices' worth of floor at 10/s; a ttl that 10 does not divide loses under 10 ns.
        assert_eq!(Terms::new(Duration::from_millis(1_500), 10, 0.0).unwrap().reserve_units, 15_000_000);
        let odd = Terms::new(Duration::from_nanos(1_000_000_009), 1, 0.0).unwrap();
        assert_eq!((odd.slice_nanos, odd.reserve_units), (100_000_000, 1_000_000));
    }

    #[test]
    fn the_extremes_do_not_overflow() {
        let t = Terms::new(MAX_TTL, u32::MAX, MAX_PERCENT_CAN_RETRY).unwrap();
        let most = SLICES * u64::from(u32::MAX);
        assert_eq!(t.whole_retries(0, 0), u64::from(u32::MAX) * 60);
        assert!(t.balance_units(most, 0) > 0);
        // The floor alone outweighs the most retries ten counters can hold.
        assert_eq!(t.whole_retries(0, most), u64::from(u32::MAX) * 60 - most);
        let no_floor = Terms::new(MAX_TTL, 0, MAX_PERCENT_CAN_RETRY).unwrap();
        assert_eq!(no_floor.whole_retries(most, most), most * 9);
        assert!(no_floor.balance_units(0, most) < 0);
        assert_eq!(no_floor.whole_retries(0, most), 0);
    }
}
