//! `TokenBucket` on a `ManualClock` against the exact sequential model of `tests/bucket_proptest.rs`
//! (whole tokens plus an exact 2^-96 fraction, capped at the burst; lifetime allowance tracked as `level`):
//! every decision, every `available()`, and every `retry_after` (exactly minimal) is compared. Invalid
//! `set_rate` arguments must be refused and change nothing; a peek at an earlier time never shows more.
#![no_main]

use kvgate::bucket::{AcquireError, TokenBucket};
use kvgate::clock::{Clock, ManualClock};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

#[path = "../../tests/support/bucket_model.rs"]
mod bucket_model;
use bucket_model::{Expect, Model, accrue};

/// A rate in the accepted range, log-uniform from 32 bits, or one of the edge values.
#[derive(Debug, Arbitrary)]
enum Rate {
    LogUniform(u32),
    Integer(u32),
    Edge(u8),
    /// Any `f64` bit pattern: usually invalid, must then be refused.
    Raw(u64),
}

impl Rate {
    fn value(&self) -> f64 {
        match *self {
            Rate::LogUniform(x) => 10f64.powf(-3.0 + 12.0 * f64::from(x) / f64::from(u32::MAX)).clamp(0.001, 1e9),
            Rate::Integer(x) => f64::from(x.clamp(1, 1_000_000_000)),
            Rate::Edge(i) => {
                [0.001, 0.002, 0.1, 1.0, 3.0, 7.0, 1000.0, 123_456.789, 999_999_999.0, 1e9][usize::from(i % 10)]
            }
            Rate::Raw(bits) => f64::from_bits(bits),
        }
    }
}

fn valid_rate(r: f64) -> bool {
    r.is_finite() && (0.001..=1e9).contains(&r)
}

#[derive(Debug, Arbitrary)]
enum Op {
    Advance(u64),
    AdvanceSmall(u16),
    Acquire {
        n: u64,
        follow_hint: bool,
    },
    AcquireSmall {
        n: u8,
        follow_hint: bool,
    },
    Refund(u64),
    RefundSmall(u8),
    SetRate(Rate, u64),
    /// A peek at an earlier time never shows more than a peek now.
    PeekPast(u64),
}

#[derive(Debug, Arbitrary)]
struct Input {
    rate: Rate,
    burst: u64,
    start: u64,
    ops: Vec<Op>,
}

fn check_acquire(
    bucket: &TokenBucket<ManualClock>,
    model: &Model,
    n: u64,
    got: Result<(), AcquireError>,
    expect: &Expect,
) -> Option<u64> {
    match (expect, got) {
        (Expect::Ok, Ok(())) => None,
        (Expect::NeverFits, Err(AcquireError::NeverFits { requested, burst })) => {
            assert_eq!(requested, n);
            assert_eq!(burst, model.burst);
            None
        }
        (Expect::NotYet { need }, Err(AcquireError::NotYet { retry_after })) => {
            let d = retry_after.as_nanos();
            assert!(d >= 1, "retry_after is zero");
            if d > u128::from(u64::MAX) {
                assert!(accrue(model.mult, model.frac, u64::MAX).0 < *need);
                return None;
            }
            let d = d as u64;
            assert!(accrue(model.mult, model.frac, d).0 >= *need, "not enough at retry_after");
            assert!(accrue(model.mult, model.frac, d - 1).0 < *need, "retry_after not minimal");
            let at = model.now.checked_add(d)?;
            assert!(bucket.try_acquire_at(n, at - 1).is_err());
            assert!(bucket.available_at(at - 1) < n);
            assert!(bucket.available_at(at) >= n);
            Some(at)
        }
        (expect, got) => panic!("model {expect:?}, bucket {got:?}; model {model:?}"),
    }
}

fn advance(clock: &ManualClock, model: &mut Model, d: u64) {
    clock.advance(Duration::from_nanos(d.min(u64::MAX - model.now)));
    model.advance_to(clock.now_nanos());
}

fn acquire(bucket: &TokenBucket<ManualClock>, clock: &ManualClock, model: &mut Model, n: u64, follow_hint: bool) {
    let got = bucket.try_acquire(n);
    let expect = model.acquire(n);
    if let Some(at) = check_acquire(bucket, model, n, got, &expect) {
        if follow_hint {
            // Acquiring exactly at now + retry_after succeeds.
            clock.set_nanos(at);
            model.advance_to(at);
            assert_eq!(model.acquire(n), Expect::Ok);
            assert_eq!(bucket.try_acquire(n), Ok(()));
        }
    }
}

fn refund(bucket: &TokenBucket<ManualClock>, model: &mut Model, n: u64) {
    bucket.refund(n);
    model.tokens = (model.tokens + u128::from(n)).min(model.capacity());
}

fuzz_target!(|input: Input| {
    let rate = input.rate.value();
    let burst = input.burst;
    let clock = ManualClock::starting_at(input.start);
    let bucket = match TokenBucket::with_clock(rate, burst, clock.clone()) {
        Ok(b) => {
            assert!(valid_rate(rate) && burst != 0);
            b
        }
        Err(_) => {
            assert!(!valid_rate(rate) || burst == 0, "valid config refused: {rate} {burst}");
            return;
        }
    };
    let mut model = Model {
        tokens: u128::from(burst),
        frac: 0,
        level: u128::from(burst.max(1 << 63)),
        mult: bucket.__rate_multiplier(),
        burst,
        now: input.start,
    };
    for op in input.ops.iter().take(256) {
        match *op {
            Op::Advance(d) => advance(&clock, &mut model, d),
            Op::AdvanceSmall(d) => advance(&clock, &mut model, u64::from(d) * 1000),
            Op::Acquire { n, follow_hint } => acquire(&bucket, &clock, &mut model, n, follow_hint),
            Op::AcquireSmall { n, follow_hint } => acquire(&bucket, &clock, &mut model, u64::from(n), follow_hint),
            Op::Refund(n) => refund(&bucket, &mut model, n),
            Op::RefundSmall(n) => refund(&bucket, &mut model, u64::from(n)),
            Op::SetRate(ref r, new_burst) => {
                let rate = r.value();
                let (old_rate, old_available) = (bucket.rate().to_bits(), bucket.available());
                match bucket.set_rate(rate, new_burst) {
                    Ok(()) => {
                        assert!(valid_rate(rate) && new_burst != 0);
                        model.frac = 0;
                        model.level = model.eff_level();
                        model.mult = bucket.__rate_multiplier();
                        model.burst = new_burst;
                        model.tokens = model.tokens.min(model.capacity());
                        assert_eq!(bucket.rate().to_bits(), rate.to_bits());
                        assert_eq!(bucket.burst(), new_burst);
                    }
                    Err(_) => {
                        assert!(!valid_rate(rate) || new_burst == 0, "valid set_rate refused: {rate} {new_burst}");
                        assert_eq!(bucket.rate().to_bits(), old_rate);
                        assert_eq!(bucket.available(), old_available);
                    }
                }
            }
            Op::PeekPast(d) => {
                let past = model.now.saturating_sub(d);
                assert!(bucket.available_at(past) <= bucket.available());
            }
        }
        assert_eq!(u128::from(bucket.available()), model.tokens, "available; model {model:?}");
    }
});
