//! Property tests: `TokenBucket` against an exact sequential model, driven by a `ManualClock`.
//!
//! The model and the harness that steps both (`support::bucket`, shared with the `bucket_ops` fuzz target)
//! compare every decision, every `available()`, and every `retry_after`: the acquire fails at
//! `now + retry_after - 1ns` and (optionally) succeeds at `now + retry_after`. The model counts in the
//! bucket's units (`unit` to a token, the documented function of the rate and the burst, which the harness
//! recomputes) and refills at the bucket's exact effective rate `mult / 2^96` units per ns; the harness
//! checks that `mult == ceil(rate * unit * 2^96 / 1e9)` for the `f64` given, in exact integer arithmetic.
//! Together: the bucket's decisions are exactly those of a bucket refilling at `rate` rounded up to 96
//! fractional bits per ns, which keeps less than one unit (under 2 ns of refill) of progress while full.
//!
//! Independently of the model, every grant is checked against GCRA's contract at the rate as given: in
//! every window `[t0, t1]` of the run since the last rate change (`t0` any logged grant or refund), the
//! units handed out net of those given back are at most `cap + 1 + rate * unit * (t1 - t0) / 1e9` plus
//! the multiplier's rounding (less than `2^-32` units), i.e. `burst + rate * (t + u)` tokens with `u` one
//! unit (`support::bucket::window_allowance`). `full_bucket_then_bursts` aims at the defect of issue #32.
//!
//! Case count: 256 by default, `PROPTEST_CASES` overrides.

use kvgate::bucket::TokenBucket;
use proptest::prelude::*;
use support::bucket::{EDGE_RATES, Harness};

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
        prop::sample::select(EDGE_RATES.to_vec()),
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

proptest! {
    #![proptest_config(support::proptest_config(256))]

    #[test]
    fn bucket_matches_exact_model(
        rate in rate(),
        burst in burst(),
        start in start_time(),
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut h = Harness::new(rate, burst, start).map_err(TestCaseError::fail)?.expect("the strategies give valid settings");
        for op in ops {
            match op {
                Op::Advance(d) => h.advance(d),
                Op::Acquire { n, follow_hint } => h.acquire(n, follow_hint).map_err(TestCaseError::fail)?,
                Op::Refund(n) => h.refund(n),
                Op::SetRate(rate, burst) => h.set_rate(rate, burst).map_err(TestCaseError::fail)?,
                Op::Available => {}
            }
            h.check_available().map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn full_bucket_then_bursts(
        rate in rate(),
        burst in 1u64..=16,
        start in start_time(),
        idle in delay(),
        steps in prop::collection::vec((0u64..=3_000_000_000, any::<bool>()), 1..40),
    ) {
        // Full, then the level anywhere between two tokens; then drain greedily in steps shorter and
        // longer than a token: every grant is checked against the model and the window bound.
        let mut h = Harness::new(rate, burst, start).map_err(TestCaseError::fail)?.expect("valid settings");
        h.advance(idle);
        for (step, follow_hint) in steps {
            h.advance(step % (1 + (2e9 / rate) as u64));
            let n = h.bucket.available().max(1);
            h.acquire(n, follow_hint).map_err(TestCaseError::fail)?;
            h.acquire(1, follow_hint).map_err(TestCaseError::fail)?;
            h.check_available().map_err(TestCaseError::fail)?;
        }
    }

    #[test]
    fn multiplier_is_exact_ceiling(rate in prop_oneof![rate(), (0.001f64..1e9)], burst in burst()) {
        let bucket = TokenBucket::new(rate, burst).unwrap();
        let (mult, unit) = (bucket.__rate_multiplier(), u128::from(bucket.__units_per_token()));
        // rate = mantissa * 2^exponent exactly.
        let bits = rate.to_bits();
        let mantissa = u128::from((bits & ((1 << 52) - 1)) | (1 << 52));
        let shift = 1075 - ((bits >> 52) & 0x7ff) as u32; // -exponent, 23..=62
        // unit = max(1, min(floor(1e9 / rate), floor(2^61 / burst))): rate * unit <= 1e9, and either
        // rate * (unit + 1) > 1e9 or the burst bound is the one that holds.
        prop_assert!(unit >= 1 && mantissa * unit <= 1_000_000_000 << shift);
        let by_rate = mantissa * (unit + 1) > 1_000_000_000 << shift;
        let by_burst = unit == u128::from((1u64 << 61) / burst) || (unit == 1 && burst > 1 << 61);
        prop_assert!(by_rate || by_burst, "unit {unit}");
        prop_assert!(unit * u128::from(burst.min(1 << 61)) <= 1 << 61);
        let scaled = (mantissa * unit) << (96 - shift); // rate * unit * 2^96, exact
        // ceil: (mult - 1) * 1e9 < rate * unit * 2^96 <= mult * 1e9
        prop_assert!(mult * 1_000_000_000 >= scaled);
        prop_assert!((mult - 1) * 1_000_000_000 < scaled);
        prop_assert!(mult <= 1 << 96);
    }
}

/// Issue #32, defect 7: a full bucket must not bank progress towards a token it cannot hold. At 5/s with a
/// burst of 5, idle for 1.1 s (the level is half-way to a sixth token), then a burst: five grants, and the
/// sixth token comes exactly 1/rate = 200 ms after the burst, not 100 ms.
#[test]
fn a_full_bucket_banks_no_progress_towards_a_token() {
    use kvgate::bucket::AcquireError;
    use kvgate::clock::ManualClock;
    use std::time::Duration;

    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(5.0, 5, clock.clone()).unwrap();
    clock.advance(Duration::from_millis(1_100));
    for _ in 0..5 {
        assert_eq!(bucket.try_acquire(1), Ok(()));
    }
    let refused = |wait_ns: u64| Err(AcquireError::NotYet { retry_after: Duration::from_nanos(wait_ns) });
    assert_eq!(bucket.try_acquire(1), refused(200_000_000));
    clock.advance(Duration::from_millis(100));
    assert_eq!(bucket.try_acquire(1), refused(100_000_000), "a sixth grant 100 ms after a full burst");
    clock.advance(Duration::from_nanos(99_999_999));
    assert_eq!(bucket.try_acquire(1), refused(1));
    clock.advance(Duration::from_nanos(1));
    assert_eq!(bucket.try_acquire(1), Ok(()));
}
