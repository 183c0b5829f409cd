//! Property tests: `TokenBucket` against an exact sequential model, driven by a `ManualClock`.
//!
//! The model and the harness that steps both (`support::bucket`, shared with the `bucket_ops` fuzz target)
//! compare every decision, every `available()`, and every `retry_after`: the acquire fails at
//! `now + retry_after - 1ns` and (optionally) succeeds at `now + retry_after`. The model's rate is the
//! bucket's exact effective rate `mult / 2^96` tokens per ns; the separate property
//! `multiplier_is_exact_ceiling` proves, in exact integer arithmetic, that `mult == ceil(rate * 2^96 / 1e9)`
//! for the `f64` given. Together: the bucket's decisions are exactly those of a bucket refilling at `rate`
//! rounded up to 96 fractional bits per ns.
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
