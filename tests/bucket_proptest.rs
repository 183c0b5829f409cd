//! Property tests: `TokenBucket` against an exact sequential model, driven by a `ManualClock`.
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
//! doc-hidden `__rate_multiplier()`. This choice lets rates span the whole range 0.001..1e9 (arbitrary
//! `f64`s, not just dyadic ones), and the separate property `multiplier_is_exact_ceiling` proves, in exact
//! integer arithmetic, that `mult == ceil(rate * 2^96 / 1e9)` for the `f64` given. Together: the bucket's
//! decisions are exactly those of a bucket refilling at `rate` rounded up to 96 fractional bits per ns.
//!
//! The model accumulates step by step with carried fractions, whereas the bucket evaluates the level in
//! one product from its base time, so the absence of drift is part of what is compared.
//!
//! Every decision, every `available()`, and every `retry_after` is compared; for `retry_after` the test
//! checks that the acquire fails at `now + retry_after - 1ns` and (optionally) succeeds at
//! `now + retry_after`. Case count: 256 by default, `PROPTEST_CASES` overrides.

use kvgate::bucket::{AcquireError, TokenBucket};
use kvgate::clock::{Clock, ManualClock};
use proptest::prelude::*;
use std::time::Duration;

#[path = "support/bucket_model.rs"]
mod bucket_model;
use bucket_model::{Expect, Model, accrue};

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    Acquire { n: u64, follow_hint: bool },
    Refund(u64),
    SetRate(f64, u64),
    Available,
}

fn rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        // log-uniform over the whole accepted range
        (-3.0f64..9.0).prop_map(|e| 10f64.powf(e).clamp(0.001, 1e9)),
        prop::sample::select(vec![0.001, 0.002, 0.1, 1.0, 3.0, 7.0, 1000.0, 123_456.789, 999_999_999.0, 1e9]),
        (1u64..=1_000_000_000).prop_map(|r| r as f64),
    ]
}

fn burst() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1u64..=16,
        4 => 1u64..=1_000_000,
        1 => prop::sample::select(vec![1u64 << 32, 1 << 63, u64::MAX - 1, u64::MAX]),
        1 => any::<u64>().prop_map(|b| b.max(1)),
    ]
}

fn amount() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..=4,
        4 => 0u64..=2_000_000,
        1 => prop::sample::select(vec![1u64 << 32, 1 << 63, u64::MAX - 1, u64::MAX]),
        1 => any::<u64>(),
    ]
}

fn delay() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=1_000,
        3 => 0u64..=2_000_000_000,
        2 => 0u64..=10_000_000_000_000,
        1 => 0u64..=u64::MAX / 8,
        1 => any::<u64>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => delay().prop_map(Op::Advance),
        6 => (amount(), any::<bool>()).prop_map(|(n, follow_hint)| Op::Acquire { n, follow_hint }),
        2 => amount().prop_map(Op::Refund),
        1 => (rate(), burst()).prop_map(|(r, b)| Op::SetRate(r, b)),
        2 => Just(Op::Available),
    ]
}

fn start_time() -> impl Strategy<Value = u64> {
    prop_oneof![4 => 0u64..=1_000_000_000_000, 1 => prop::sample::select(vec![u64::MAX / 2, u64::MAX - 1_000_000_000, u64::MAX])]
}

/// Checks an acquire's outcome against the model's expectation (the model has already been applied).
fn check_acquire(
    bucket: &TokenBucket<ManualClock>,
    model: &Model,
    n: u64,
    got: Result<(), AcquireError>,
    expect: &Expect,
) -> Result<Option<u64>, TestCaseError> {
    match (expect, got) {
        (Expect::Ok, Ok(())) => Ok(None),
        (Expect::NeverFits, Err(AcquireError::NeverFits { requested, burst })) => {
            prop_assert_eq!(requested, n);
            prop_assert_eq!(burst, model.burst);
            Ok(None)
        }
        (Expect::NotYet { need }, Err(AcquireError::NotYet { retry_after })) => {
            let d = retry_after.as_nanos();
            prop_assert!(d >= 1);
            if d > u128::from(u64::MAX) {
                // Beyond the 2^64 ns clock axis (slow rates, huge requests): it must really be that far.
                prop_assert!(accrue(model.mult, model.frac, u64::MAX).0 < *need);
                return Ok(None);
            }
            let d = d as u64;
            // Exactly minimal: the model accrues enough after d ns, not after d - 1.
            prop_assert!(accrue(model.mult, model.frac, d).0 >= *need, "not enough at retry_after");
            prop_assert!(accrue(model.mult, model.frac, d - 1).0 < *need, "retry_after not minimal");
            // The bucket agrees, at the edge (refusals and peeks consume nothing).
            if let Some(at) = model.now.checked_add(d) {
                prop_assert!(bucket.try_acquire_at(n, at - 1).is_err());
                prop_assert!(bucket.available_at(at - 1) < n);
                prop_assert!(bucket.available_at(at) >= n);
                Ok(Some(at))
            } else {
                Ok(None)
            }
        }
        (expect, got) => Err(TestCaseError::fail(format!("model {expect:?}, bucket {got:?}; model {model:?}"))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn bucket_matches_exact_model(
        rate in rate(),
        burst in burst(),
        start in start_time(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let clock = ManualClock::starting_at(start);
        let bucket = TokenBucket::with_clock(rate, burst, clock.clone()).unwrap();
        let mut model = Model {
            tokens: u128::from(burst),
            frac: 0,
            level: u128::from(burst.max(1 << 63)),
            mult: bucket.__rate_multiplier(),
            burst,
            now: start,
        };
        for op in ops {
            match op {
                Op::Advance(d) => {
                    clock.advance(Duration::from_nanos(d));
                    model.advance_to(clock.now_nanos());
                }
                Op::Acquire { n, follow_hint } => {
                    let got = bucket.try_acquire(n);
                    let expect = model.acquire(n);
                    if let Some(at) = check_acquire(&bucket, &model, n, got, &expect)? {
                        if follow_hint {
                            // Acquiring exactly at now + retry_after succeeds.
                            clock.set_nanos(at);
                            model.advance_to(at);
                            prop_assert_eq!(model.acquire(n), Expect::Ok);
                            prop_assert_eq!(bucket.try_acquire(n), Ok(()));
                        }
                    }
                }
                Op::Refund(n) => {
                    bucket.refund(n);
                    model.tokens = (model.tokens + u128::from(n)).min(model.capacity());
                }
                Op::SetRate(rate, burst) => {
                    bucket.set_rate(rate, burst).unwrap();
                    model.frac = 0;
                    model.level = model.eff_level();
                    model.mult = bucket.__rate_multiplier();
                    model.burst = burst;
                    model.tokens = model.tokens.min(model.capacity());
                    prop_assert_eq!(bucket.rate().to_bits(), rate.to_bits());
                    prop_assert_eq!(bucket.burst(), burst);
                }
                Op::Available => {}
            }
            prop_assert_eq!(u128::from(bucket.available()), model.tokens, "available; model {:?}", model);
        }
    }

    #[test]
    fn multiplier_is_exact_ceiling(rate in prop_oneof![rate(), (0.001f64..1e9)]) {
        let bucket = TokenBucket::new(rate, 1).unwrap();
        let mult = bucket.__rate_multiplier();
        // rate = mantissa * 2^exponent exactly.
        let bits = rate.to_bits();
        let mantissa = u128::from((bits & ((1 << 52) - 1)) | (1 << 52));
        let exponent = ((bits >> 52) & 0x7ff) as i32 - 1075;
        let scaled = mantissa << (exponent + 96); // rate * 2^96, exact
        // ceil: (mult - 1) * 1e9 < rate * 2^96 <= mult * 1e9
        prop_assert!(mult * 1_000_000_000 >= scaled);
        prop_assert!((mult - 1) * 1_000_000_000 < scaled);
        prop_assert!(mult <= 1 << 96);
    }
}
