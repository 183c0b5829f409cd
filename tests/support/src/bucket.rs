//! The exact sequential model of a token bucket, and a [`Harness`] that applies every step — advance,
//! acquire (following the hint or not), refund, set-rate, peek — to a real `TokenBucket` on a
//! `ManualClock` and to the model, and compares them. Shared by `tests/bucket_proptest.rs` and the
//! `bucket_ops` fuzz target.
//!
//! # The model
//!
//! A textbook integer token bucket: `tokens` (whole tokens held, `<= burst`) plus `frac`, the progress
//! towards the next token as an exact fraction `frac / 2^96`. Advancing by `d` ns adds `d * rate_per_ns`
//! exactly (rational arithmetic with denominator 2^96, carried across steps), and whole tokens are added
//! capped at `burst`. A rate change discards `frac` (documented). The bucket's lifetime allowance and its
//! capacity `min(burst, level)` (documented; they matter only for bursts near 2^64) are tracked as
//! `level`, which starts at `max(burst, 2^63)` and saturates at `u64::MAX`.
//!
//! The rate is the bucket's **exact effective rate** `mult / 2^96` tokens per ns, read through the
//! doc-hidden `__rate_multiplier()`, so rates span the whole range 0.001..1e9 (arbitrary `f64`s, not just
//! dyadic ones). The model accumulates step by step with carried fractions, whereas the bucket evaluates
//! the level in one product from its base time, so the absence of drift is part of what is compared.

use kvgate::bucket::{AcquireError, TokenBucket};
use kvgate::clock::{Clock, ManualClock};
use std::time::Duration;

const MASK96: u128 = (1 << 96) - 1;

/// Rates worth hitting on purpose: both ends of the accepted range, small integers, a fraction.
pub const EDGE_RATES: [f64; 10] = [0.001, 0.002, 0.1, 1.0, 3.0, 7.0, 1000.0, 123_456.789, 999_999_999.0, 1e9];

/// Whether a bucket accepts `rate` (a finite number in `[0.001, 1e9]`).
pub fn valid_rate(rate: f64) -> bool {
    rate.is_finite() && (0.001..=1e9).contains(&rate)
}

/// `frac + d * mult` split into whole tokens and the new fraction (over 2^96), exactly.
pub fn accrue(mult: u128, frac: u128, d: u64) -> (u128, u128) {
    let d = u128::from(d);
    let p_hi = d * (mult >> 64); // weight 2^64; <= 2^96
    let p_lo = d * (mult & u128::from(u64::MAX)); // weight 1; < 2^128
    let mut whole = (p_hi >> 32) + (p_lo >> 96);
    let f = ((p_hi & 0xffff_ffff) << 64) + (p_lo & MASK96) + frac; // < 3 * 2^96
    whole += f >> 96;
    (whole, f & MASK96)
}

/// What the model says an acquire does.
#[derive(Debug, PartialEq, Eq)]
pub enum Expect {
    /// Granted.
    Ok,
    /// Never fits (more than the burst, or beyond the lifetime allowance).
    NeverFits,
    /// Not yet: `need` more whole tokens must accrue.
    NotYet {
        /// Tokens missing.
        need: u128,
    },
}

/// The sequential model (see the module docs).
#[derive(Debug)]
pub struct Model {
    /// Whole tokens held.
    pub tokens: u128,
    /// Progress towards the next token, over 2^96.
    pub frac: u128,
    /// Initial burst plus every whole token accrued (unsaturated); the bucket's level is min(level, 2^64-1).
    pub level: u128,
    /// The refill rate, `mult / 2^96` tokens per nanosecond.
    pub mult: u128,
    /// The capacity.
    pub burst: u64,
    /// The model's time, in clock nanoseconds.
    pub now: u64,
}

impl Model {
    /// A full bucket of `burst` refilling at `mult / 2^96` tokens per ns, at time `now`.
    pub fn new(burst: u64, mult: u128, now: u64) -> Self {
        Self { tokens: u128::from(burst), frac: 0, level: u128::from(burst.max(1 << 63)), mult, burst, now }
    }

    /// The level, saturated as the bucket's is.
    pub fn eff_level(&self) -> u128 {
        self.level.min(u128::from(u64::MAX))
    }

    /// The most tokens the bucket can hold now: `min(burst, level)`.
    pub fn capacity(&self) -> u128 {
        u128::from(self.burst).min(self.eff_level())
    }

    /// Moves time to `t` (not earlier than now), accruing exactly.
    pub fn advance_to(&mut self, t: u64) {
        assert!(t >= self.now);
        let (whole, frac) = accrue(self.mult, self.frac, t - self.now);
        let before = self.eff_level();
        self.level += whole;
        let gained = self.eff_level() - before;
        self.tokens = (self.tokens + gained).min(self.capacity());
        self.frac = frac;
        self.now = t;
    }

    /// Takes `n` tokens if they are there.
    pub fn acquire(&mut self, n: u64) -> Expect {
        let n128 = u128::from(n);
        if n > self.burst {
            Expect::NeverFits
        } else if n128 <= self.tokens {
            self.tokens -= n128;
            Expect::Ok
        } else if self.eff_level() - self.tokens + n128 > u128::from(u64::MAX) {
            Expect::NeverFits // lifetime limit
        } else {
            Expect::NotYet { need: n128 - self.tokens }
        }
    }

    /// Gives back `n` tokens, capped at the capacity.
    pub fn refund(&mut self, n: u64) {
        self.tokens = (self.tokens + u128::from(n)).min(self.capacity());
    }

    /// A rate change: the fraction towards the next token is dropped, the tokens held are capped at the new
    /// burst, and the level keeps counting from where it is.
    pub fn set_rate(&mut self, mult: u128, burst: u64) {
        self.frac = 0;
        self.level = self.eff_level();
        self.mult = mult;
        self.burst = burst;
        self.tokens = self.tokens.min(self.capacity());
    }
}

/// A real bucket on a manual clock and its model, stepped together. Every step returns `Err` with a
/// description of the first difference.
#[derive(Debug)]
pub struct Harness {
    /// The bucket under test.
    pub bucket: TokenBucket<ManualClock>,
    /// Its clock.
    pub clock: ManualClock,
    /// What the bucket must do.
    pub model: Model,
}

impl Harness {
    /// A bucket of `rate` and `burst` whose clock starts at `start`; `Ok(None)` when the configuration is
    /// invalid and the bucket refused it, as it must.
    ///
    /// # Errors
    ///
    /// A valid configuration refused, or an invalid one accepted.
    pub fn new(rate: f64, burst: u64, start: u64) -> Result<Option<Self>, String> {
        let clock = ManualClock::starting_at(start);
        match TokenBucket::with_clock(rate, burst, clock.clone()) {
            Ok(bucket) if valid_rate(rate) && burst != 0 => {
                let model = Model::new(burst, bucket.__rate_multiplier(), start);
                Ok(Some(Self { bucket, clock, model }))
            }
            Ok(_) => Err(format!("invalid configuration accepted: rate {rate}, burst {burst}")),
            Err(_) if !valid_rate(rate) || burst == 0 => Ok(None),
            Err(e) => Err(format!("valid configuration refused: rate {rate}, burst {burst}: {e}")),
        }
    }

    /// Moves the clock on by `d` ns (saturating at the end of the clock's axis).
    pub fn advance(&mut self, d: u64) {
        self.clock.advance(Duration::from_nanos(d.min(u64::MAX - self.model.now)));
        self.model.advance_to(self.clock.now_nanos());
    }

    /// Acquires `n` now and compares the outcome, the `retry_after` of a refusal included (exactly minimal,
    /// and the bucket agrees at its edge); with `follow_hint`, then moves the clock to that instant and
    /// acquires again, which must succeed.
    ///
    /// # Errors
    ///
    /// The first difference from the model.
    pub fn acquire(&mut self, n: u64, follow_hint: bool) -> Result<(), String> {
        let got = self.bucket.try_acquire(n);
        let expect = self.model.acquire(n);
        if let Some(at) = self.check_acquire(n, got, &expect)? {
            if follow_hint {
                self.clock.set_nanos(at);
                self.model.advance_to(at);
                if self.model.acquire(n) != Expect::Ok {
                    return Err(format!("model refuses {n} at its own retry time {at}: {:?}", self.model));
                }
                if let Err(e) = self.bucket.try_acquire(n) {
                    return Err(format!("acquire of {n} at now + retry_after refused: {e:?}"));
                }
            }
        }
        Ok(())
    }

    /// Checks an acquire's outcome against the model's expectation (the model has already been applied);
    /// for a refusal that can be retried, returns the instant it says the acquire succeeds.
    fn check_acquire(&self, n: u64, got: Result<(), AcquireError>, expect: &Expect) -> Result<Option<u64>, String> {
        let model = &self.model;
        match (expect, got) {
            (Expect::Ok, Ok(())) => Ok(None),
            (Expect::NeverFits, Err(AcquireError::NeverFits { requested, burst })) => {
                if (requested, burst) != (n, model.burst) {
                    return Err(format!("NeverFits {{ requested: {requested}, burst: {burst} }} for {n}; {model:?}"));
                }
                Ok(None)
            }
            (Expect::NotYet { need }, Err(AcquireError::NotYet { retry_after })) => {
                let d = retry_after.as_nanos();
                if d == 0 {
                    return Err("retry_after is zero".into());
                }
                if d > u128::from(u64::MAX) {
                    // Beyond the 2^64 ns clock axis (slow rates, huge requests): it must really be that far.
                    if accrue(model.mult, model.frac, u64::MAX).0 >= *need {
                        return Err(format!("retry_after {retry_after:?} beyond the axis, but {need} accrue on it"));
                    }
                    return Ok(None);
                }
                let d = d as u64;
                // Exactly minimal: the model accrues enough after d ns, not after d - 1.
                if accrue(model.mult, model.frac, d).0 < *need {
                    return Err(format!("not enough at retry_after {d} ns; {model:?}"));
                }
                if accrue(model.mult, model.frac, d - 1).0 >= *need {
                    return Err(format!("retry_after {d} ns not minimal; {model:?}"));
                }
                // The bucket agrees, at the edge (refusals and peeks consume nothing).
                let Some(at) = model.now.checked_add(d) else { return Ok(None) };
                if self.bucket.try_acquire_at(n, at - 1).is_ok() || self.bucket.available_at(at - 1) >= n {
                    return Err(format!("{n} available 1 ns before retry_after"));
                }
                if self.bucket.available_at(at) < n {
                    return Err(format!("{n} not available at retry_after"));
                }
                Ok(Some(at))
            }
            (expect, got) => Err(format!("model {expect:?}, bucket {got:?}; model {model:?}")),
        }
    }

    /// Refunds `n` to both.
    pub fn refund(&mut self, n: u64) {
        self.bucket.refund(n);
        self.model.refund(n);
    }

    /// Changes the rate and burst: a valid change must be taken as given, an invalid one refused with
    /// nothing changed.
    ///
    /// # Errors
    ///
    /// A valid change refused or taken differently, or an invalid one accepted or half applied.
    pub fn set_rate(&mut self, rate: f64, burst: u64) -> Result<(), String> {
        let (old_rate, old_available) = (self.bucket.rate().to_bits(), self.bucket.available());
        match self.bucket.set_rate(rate, burst) {
            Ok(()) if valid_rate(rate) && burst != 0 => {
                self.model.set_rate(self.bucket.__rate_multiplier(), burst);
                if (self.bucket.rate().to_bits(), self.bucket.burst()) != (rate.to_bits(), burst) {
                    return Err(format!(
                        "set_rate({rate}, {burst}) reads back {} {}",
                        self.bucket.rate(),
                        self.bucket.burst()
                    ));
                }
                Ok(())
            }
            Ok(()) => Err(format!("invalid set_rate accepted: {rate} {burst}")),
            Err(e) if valid_rate(rate) && burst != 0 => Err(format!("valid set_rate refused: {rate} {burst}: {e}")),
            Err(_) => {
                if (self.bucket.rate().to_bits(), self.bucket.available()) != (old_rate, old_available) {
                    return Err(format!("a refused set_rate({rate}, {burst}) changed the bucket"));
                }
                Ok(())
            }
        }
    }

    /// A peek `d` ns in the past never shows more than a peek now.
    ///
    /// # Errors
    ///
    /// When it does.
    pub fn peek_past(&self, d: u64) -> Result<(), String> {
        let past = self.model.now.saturating_sub(d);
        let (then, now) = (self.bucket.available_at(past), self.bucket.available());
        if then > now {
            return Err(format!("{then} available {d} ns ago, {now} now"));
        }
        Ok(())
    }

    /// The bucket's `available()` equals the model's tokens.
    ///
    /// # Errors
    ///
    /// When it does not.
    pub fn check_available(&self) -> Result<(), String> {
        let available = self.bucket.available();
        if u128::from(available) != self.model.tokens {
            return Err(format!("available {available}; model {:?}", self.model));
        }
        Ok(())
    }
}
