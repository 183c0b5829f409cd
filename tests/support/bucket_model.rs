//! The exact sequential model of a token bucket, shared by `tests/bucket_proptest.rs` and the
//! `bucket_ops` fuzz target: whole tokens plus an exact 2^-96 fraction, capped at the burst, with the
//! lifetime allowance tracked as `level`.
#![allow(dead_code)]

pub const MASK96: u128 = (1 << 96) - 1;

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

#[derive(Debug)]
pub struct Model {
    pub tokens: u128,
    pub frac: u128,
    /// Initial burst plus every whole token accrued (unsaturated); the bucket's level is min(level, 2^64-1).
    pub level: u128,
    pub mult: u128,
    pub burst: u64,
    pub now: u64,
}

impl Model {
    pub fn eff_level(&self) -> u128 {
        self.level.min(u128::from(u64::MAX))
    }

    pub fn capacity(&self) -> u128 {
        u128::from(self.burst).min(self.eff_level())
    }

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
}

#[derive(Debug, PartialEq)]
pub enum Expect {
    Ok,
    NeverFits,
    NotYet { need: u128 },
}
