//! The exact sequential model of a token bucket, and a [`Harness`] that applies every step — advance,
//! acquire (following the hint or not), refund, set-rate, peek — to a real `TokenBucket` on a
//! `ManualClock` and to the model, and compares them. Shared by `tests/bucket_proptest.rs` and the
//! `bucket_ops` fuzz target.
//!
//! # The model
//!
//! A textbook integer token bucket counted in **units**, `unit` units to a token (the bucket's documented
//! `max(1, min(floor(10^9 / rate), floor(2^61 / burst)))`, which the harness recomputes from the rate and
//! the burst and checks): `units` held (at most `cap = min(burst, 2^61) * unit`) plus `frac`, the progress
//! towards the next **unit** as an exact fraction `frac / 2^96`. Advancing by `d` ns adds
//! `d * mult / 2^96` units exactly (rational arithmetic with denominator 2^96, carried across steps), and
//! whole units are added capped at `cap`. So a full bucket keeps less than one unit of progress — under
//! 2 ns of refill — and never progress towards a token it cannot hold: this is GCRA (governor's "at most
//! `burst + rate * t` in any window of length `t`") up to that one unit. The model does not build that in
//! from the bucket's own formulas: [`Harness`] also checks the bound itself, in every window of the run,
//! at the `f64` rate as given (see [`window_allowance`]).
//!
//! A rate change keeps the whole tokens held and the progress towards the next token, the progress
//! rounded down to the new unit, capped at the new capacity, and restarts the progress towards the next
//! unit at zero (documented). The level of one configuration (the units it has accrued, from its starting
//! level) saturates at `2^63 - 1` (documented; the lifetime allowance): tracked as `level`, which starts
//! at `cap` and, at a rate change, keeps its value if that is at most `2^61` (raised to the new `cap` if
//! below it) and starts again at the new `cap` otherwise.
//!
//! The rate is the bucket's **exact effective rate** `mult / 2^96` units per ns, read through the
//! doc-hidden `__rate_multiplier()` and checked to be `ceil(rate * unit * 2^96 / 10^9)` for the `f64`
//! given ([`expected_multiplier`]), so rates span the whole range 0.001..1e9 (arbitrary `f64`s, not just
//! dyadic ones). The model accumulates step by step with carried fractions, whereas the bucket evaluates
//! the level in one product from its base time, so the absence of drift is part of what is compared.

use kvgate::bucket::{AcquireError, TokenBucket};
use kvgate::clock::{Clock, ManualClock};
use std::time::Duration;

const MASK96: u128 = (1 << 96) - 1;
const NANOS_PER_SEC: u128 = 1_000_000_000;
/// Where a configuration's level saturates: `2^63 - 1` units.
pub const LEVEL_MAX: u128 = (1 << 63) - 1;
/// The most units a bucket holds, and the highest level a rate change keeps.
pub const CAP_MAX: u64 = 1 << 61;

/// Rates worth hitting on purpose: both ends of the accepted range, small integers, a fraction.
pub const EDGE_RATES: [f64; 10] = [0.001, 0.002, 0.1, 1.0, 3.0, 7.0, 1000.0, 123_456.789, 999_999_999.0, 1e9];

/// Whether a bucket accepts `rate` (a finite number in `[0.001, 1e9]`).
pub fn valid_rate(rate: f64) -> bool {
    rate.is_finite() && (0.001..=1e9).contains(&rate)
}

/// A valid rate as the exact rational `mantissa / 2^shift`.
fn exact(rate: f64) -> (u128, u32) {
    let bits = rate.to_bits();
    let mantissa = u128::from((bits & ((1 << 52) - 1)) | (1 << 52));
    let shift = 1075 - ((bits >> 52) & 0x7ff) as u32;
    (mantissa, shift)
}

/// The documented unit for a valid rate and a non-zero burst:
/// `max(1, min(floor(10^9 / rate), floor(2^61 / burst)))`, exactly.
pub fn expected_unit(rate: f64, burst: u64) -> u64 {
    let (mantissa, shift) = exact(rate);
    let per_token = u64::try_from((NANOS_PER_SEC << shift) / mantissa).unwrap();
    per_token.min(CAP_MAX / burst).max(1)
}

/// The documented multiplier: `ceil(rate * unit * 2^96 / 10^9)`, exactly.
pub fn expected_multiplier(rate: f64, unit: u64) -> u128 {
    let (mantissa, shift) = exact(rate);
    ((mantissa * u128::from(unit)) << (96 - shift)).div_ceil(NANOS_PER_SEC)
}

/// `frac + d * mult` split into whole units and the new fraction (over 2^96), exactly.
pub fn accrue(mult: u128, frac: u128, d: u64) -> (u128, u128) {
    let d = u128::from(d);
    let p_hi = d * (mult >> 64); // weight 2^64; <= 2^96
    let p_lo = d * (mult & u128::from(u64::MAX)); // weight 1; < 2^128
    let mut whole = (p_hi >> 32) + (p_lo >> 96);
    let f = ((p_hi & 0xffff_ffff) << 64) + (p_lo & MASK96) + frac; // < 3 * 2^96
    whole += f >> 96;
    (whole, f & MASK96)
}

/// `floor(a * t / b)` and the remainder, for `a, b < 2^94`, exactly (in 32-bit halves of `t`).
fn mul_div(a: u128, t: u64, b: u128) -> (u128, u128) {
    let (hi, lo) = (u128::from(t >> 32), u128::from(t & 0xffff_ffff));
    let (q1, r1) = ((a * hi) / b, (a * hi) % b);
    let rest = (r1 << 32) + a * lo; // < 2^126 + 2^126
    (q1 * (1 << 32) + rest / b, rest % b)
}

/// The most units a bucket of `rate` (the `f64` as given, exactly), `unit` and capacity `cap` may hand
/// out, net of what was given back, in a window of `t` ns: `floor(cap + 1 + rate * unit * t / 10^9 +
/// t / 2^96)`. That is the documented bound, `burst + rate * (t + u)` tokens with `u` one unit's refill
/// time at the exact rate (`unit` units are a token, so one unit is `1 / unit` of a token), plus the
/// multiplier's rounding up (less than 2^-96 units per ns, so less than 2^-32 units over the axis).
pub fn window_allowance(rate: f64, unit: u64, cap: u64, t: u64) -> u128 {
    let (mantissa, shift) = exact(rate);
    let (a, b) = (mantissa * u128::from(unit), NANOS_PER_SEC << shift);
    let (q, r) = mul_div(a, t, b);
    // The fraction r / b plus t / 2^96 reaches 1 iff t * b / 2^96 >= b - r (b - r an integer).
    let (t_hi, t_lo) = (u128::from(t >> 32), u128::from(t & 0xffff_ffff));
    let t_b_96 = (t_hi * b + ((t_lo * b) >> 32)) >> 64;
    u128::from(cap) + 1 + q + u128::from(t_b_96 >= b - r)
}

/// What the model says an acquire does.
#[derive(Debug, PartialEq, Eq)]
pub enum Expect {
    /// Granted.
    Ok,
    /// Never fits (more than the burst, more than 2^61 tokens, or beyond the lifetime allowance).
    NeverFits,
    /// Not yet: `need` more whole units must accrue.
    NotYet {
        /// Units missing.
        need: u128,
    },
}

/// The sequential model (see the module docs).
#[derive(Debug)]
pub struct Model {
    /// Whole units held (`<= cap`).
    pub units: u128,
    /// Progress towards the next unit, over 2^96.
    pub frac: u128,
    /// The configuration's starting level plus every whole unit accrued since (unsaturated); the bucket's
    /// level is `min(level, 2^63 - 1)`.
    pub level: u128,
    /// The refill rate, `mult / 2^96` units per nanosecond.
    pub mult: u128,
    /// Units per token.
    pub unit: u64,
    /// The most units held: `min(burst, 2^61) * unit`.
    pub cap: u64,
    /// The burst, as configured.
    pub burst: u64,
    /// The model's time, in clock nanoseconds.
    pub now: u64,
}

impl Model {
    /// A full bucket of `burst` (`unit` units a token) refilling at `mult / 2^96` units per ns, at `now`.
    pub fn new(burst: u64, unit: u64, mult: u128, now: u64) -> Self {
        let cap = burst.min(CAP_MAX) * unit;
        Self { units: u128::from(cap), frac: 0, level: u128::from(cap), mult, unit, cap, burst, now }
    }

    /// The level, saturated as the bucket's is.
    pub fn eff_level(&self) -> u128 {
        self.level.min(LEVEL_MAX)
    }

    /// Whole tokens held.
    pub fn tokens(&self) -> u128 {
        self.units / u128::from(self.unit)
    }

    /// Moves time to `t` (not earlier than now), accruing exactly.
    pub fn advance_to(&mut self, t: u64) {
        assert!(t >= self.now);
        let (whole, frac) = accrue(self.mult, self.frac, t - self.now);
        let before = self.eff_level();
        self.level += whole;
        let gained = self.eff_level() - before;
        self.units = (self.units + gained).min(u128::from(self.cap));
        self.frac = frac;
        self.now = t;
    }

    /// Takes `n` tokens if they are there.
    pub fn acquire(&mut self, n: u64) -> Expect {
        let cost = u128::from(n) * u128::from(self.unit);
        if n > self.burst || cost > u128::from(self.cap) {
            Expect::NeverFits
        } else if cost <= self.units {
            self.units -= cost;
            Expect::Ok
        } else if self.eff_level() - self.units + cost > LEVEL_MAX {
            Expect::NeverFits // lifetime limit
        } else {
            Expect::NotYet { need: cost - self.units }
        }
    }

    /// Gives back `n` tokens, capped at the capacity; returns the units actually given back.
    pub fn refund(&mut self, n: u64) -> u128 {
        let before = self.units;
        self.units = (self.units + u128::from(n) * u128::from(self.unit)).min(u128::from(self.cap));
        self.units - before
    }

    /// A rate change: the whole tokens held and the progress towards the next one are kept in the new
    /// unit (the progress rounded down), capped at the new capacity; the progress towards the next unit
    /// restarts at zero; the level keeps its value if at most 2^61 (raised to the new capacity), else
    /// starts again at the new capacity.
    pub fn set_rate(&mut self, mult: u128, unit: u64, burst: u64) {
        let (old, new) = (u128::from(self.unit), u128::from(unit));
        let cap = burst.min(CAP_MAX) * unit;
        let kept = self.units / old * new + self.units % old * new / old;
        let level = self.eff_level();
        self.level = if level <= u128::from(CAP_MAX) { level.max(u128::from(cap)) } else { u128::from(cap) };
        self.units = kept.min(u128::from(cap));
        (self.frac, self.mult, self.unit, self.cap, self.burst) = (0, mult, unit, cap, burst);
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
    /// The rate as configured (for the window bound).
    pub rate: f64,
    /// The documented unit for that rate and burst (for the window bound; the bucket's must equal it).
    pub unit: u64,
    /// Since the last rate change: (time, units granted, or given back as a negative number), in the
    /// documented unit and in the model's.
    pub log: Vec<(u64, i128, i128)>,
}

impl Harness {
    /// A bucket of `rate` and `burst` whose clock starts at `start`; `Ok(None)` when the configuration is
    /// invalid and the bucket refused it, as it must.
    ///
    /// # Errors
    ///
    /// A valid configuration refused, an invalid one accepted, or a unit or multiplier that is not the
    /// documented one.
    pub fn new(rate: f64, burst: u64, start: u64) -> Result<Option<Self>, String> {
        let clock = ManualClock::starting_at(start);
        match TokenBucket::with_clock(rate, burst, clock.clone()) {
            Ok(bucket) if valid_rate(rate) && burst != 0 => {
                let (unit, mult) = checked_rate(&bucket, rate, burst)?;
                let model = Model::new(burst, unit, mult, start);
                let unit = expected_unit(rate, burst);
                Ok(Some(Self { bucket, clock, model, rate, unit, log: Vec::new() }))
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
    /// acquires again, which must succeed. Every grant is checked against the window bound.
    ///
    /// # Errors
    ///
    /// The first difference from the model, or a window that handed out too much.
    pub fn acquire(&mut self, n: u64, follow_hint: bool) -> Result<(), String> {
        let got = self.bucket.try_acquire(n);
        let expect = self.model.acquire(n);
        if got.is_ok() {
            self.granted(n)?;
        }
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
                self.granted(n)?;
            }
        }
        Ok(())
    }

    /// Logs a grant of `n` tokens now and checks every window that ends with it: the units handed out,
    /// net of the units given back, are at most what the rate as given allows with the documented
    /// tolerance ([`window_allowance`], in the documented unit: it does not take the bucket's word for
    /// the unit), and at most the implementation's own bound, `cap + ceil(t * mult / 2^96)`.
    fn granted(&mut self, n: u64) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let m = &self.model;
        self.log.push((m.now, i128::from(n) * i128::from(self.unit), i128::from(n) * i128::from(m.unit)));
        let cap = self.model.burst.min(CAP_MAX) * self.unit;
        let (mut net, mut own_net) = (0i128, 0i128);
        for &(t0, units, own_units) in self.log.iter().rev() {
            (net, own_net) = (net + units, own_net + own_units);
            let t = m.now - t0;
            let allowed = window_allowance(self.rate, self.unit, cap, t);
            let (whole, frac) = accrue(m.mult, 0, t);
            let own = u128::from(m.cap) + whole + u128::from(frac != 0);
            if net > 0 && net as u128 > allowed || own_net > 0 && own_net as u128 > own {
                return Err(format!(
                    "{net} units net in a window of {t} ns, over {allowed} (rate {}, unit {}); own bound: {own_net} \
                     over {own}; {m:?}",
                    self.rate, self.unit
                ));
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
        let back = i128::try_from(self.model.refund(n)).expect("at most 2^61 units");
        if back != 0 {
            // In the documented unit, rounded down (exact whenever the bucket's unit is the documented one).
            let documented = back * i128::from(self.unit) / i128::from(self.model.unit);
            self.log.push((self.model.now, -documented, -back));
        }
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
                let (unit, mult) = checked_rate(&self.bucket, rate, burst)?;
                self.model.set_rate(mult, unit, burst);
                (self.rate, self.unit, self.log) = (rate, expected_unit(rate, burst), Vec::new());
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

    /// The bucket's `available()` equals the model's whole tokens.
    ///
    /// # Errors
    ///
    /// When it does not.
    pub fn check_available(&self) -> Result<(), String> {
        let available = self.bucket.available();
        if u128::from(available) != self.model.tokens() {
            return Err(format!("available {available}; model {:?}", self.model));
        }
        Ok(())
    }
}

/// The bucket's unit and multiplier, checked to be the documented functions of `rate` and `burst`.
fn checked_rate(bucket: &TokenBucket<ManualClock>, rate: f64, burst: u64) -> Result<(u64, u128), String> {
    let (unit, mult) = (bucket.__units_per_token(), bucket.__rate_multiplier());
    let expected = expected_unit(rate, burst);
    if (unit, mult) != (expected, expected_multiplier(rate, expected)) || mult > 1 << 96 {
        return Err(format!("rate {rate}, burst {burst}: unit {unit}, multiplier {mult}, expected unit {expected}"));
    }
    Ok((unit, mult))
}
