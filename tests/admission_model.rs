//! Model-based test of the whole admission: random sequences of try_admit / admit (polled by hand) / poll /
//! cancel / drop / complete / advance (with and without expiry) / resize / close, with tenants (caps, KV
//! shares, tenant-only token rates, weights from 1 to the maximum), request or token fairness, shared
//! prefixes and TTFT deadlines, against the exact sequential model and the specification in
//! `support/src/admission.rs`. After every step every outcome equals the model's, and so do every gauge
//! and bucket, globally and per tenant (conservation), the rejection counts by reason; no hint is earlier
//! than the rates allow (and a rate refusal's is exact); every bucket keeps `burst + rate · t` in every
//! window; two continuously backlogged flows keep the fairness bound. At the end everything is back to zero.
//!
//! `PROPTEST_CASES=20000 cargo test --release --test admission_model` for a longer run
//! (`scripts/proptest.sh` runs it so).
#![cfg(not(loom))]

use kvgate::TenantLimits;
use proptest::prelude::*;
use support::admission::{Config, Harness, Op, Req, TENANTS};

fn req() -> impl Strategy<Value = Req> {
    (
        (0u32..40, 0u32..40, 0usize..3),
        prop::option::of(0u8..TENANTS),
        prop::option::of(0u64..30),
        prop::option::of((0u8..4, 0u32..30)),
        prop::option::weighted(0.3, 0u64..30),
    )
        .prop_map(|((prompt, max_new, class), tenant, max_wait_ms, prefix, ttft_ms)| Req {
            prompt,
            max_new,
            class,
            tenant,
            max_wait_ms,
            prefix,
            ttft_ms,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => req().prop_map(Op::TryAdmit),
        30 => req().prop_map(Op::Admit),
        20 => any::<usize>().prop_map(Op::Poll),
        4 => any::<usize>().prop_map(Op::Cancel),
        12 => any::<usize>().prop_map(Op::DropPermit),
        6 => (any::<usize>(), 0u32..50).prop_map(|(i, out)| Op::Complete(i, out)),
        6 => (0u64..15, any::<bool>()).prop_map(|(ms, expire)| Op::Advance { ms, expire }),
        3 => (1usize..6).prop_map(Op::SetMaxInFlight),
        3 => (20u64..200).prop_map(Op::SetKv),
        1 => Just(Op::Close),
    ]
}

/// A tenant weight: a power of two from 1 to the maximum (so that the model's counters are exact), the
/// ends most often.
fn weight() -> impl Strategy<Value = u32> {
    prop_oneof![3 => Just(1u32), 1 => Just(2u32), 2 => (0u32..=16).prop_map(|e| 1 << e), 2 => Just(TenantLimits::MAX_WEIGHT)]
}

fn config() -> impl Strategy<Value = Config> {
    (
        (1usize..6, 30u64..200, 0usize..8),
        (prop::option::of((1u64..3, 1u64..6)), prop::option::of((5u64..40, 80u64..300))),
        (prop::option::of(1usize..3), prop::option::of(20u8..=100), prop::option::of((5u64..40, 80u64..300))),
        (prop::option::of(0u64..40), prop::option::of(1usize..4)),
        (any::<bool>(), [weight(), weight(), weight()]),
    )
        .prop_map(
            |(
                (max_in_flight, kv_capacity, queue_capacity),
                (request_rate, token_rate),
                tenant,
                (wait, prefix),
                (fairness_tokens, weights),
            )| {
                Config {
                    max_in_flight,
                    kv_capacity,
                    queue_capacity,
                    request_rate,
                    token_rate,
                    tenant_cap: tenant.0,
                    tenant_share_pct: tenant.1,
                    tenant_token_rate: tenant.2,
                    max_queue_wait_ms: wait,
                    prefix_sharing: prefix,
                    fairness_tokens,
                    weights,
                }
            },
        )
}

proptest! {
    // 512 cases (4 under miri), or `PROPTEST_CASES`.
    #![proptest_config(support::proptest_config(512))]

    #[test]
    fn admission_matches_the_sequential_model(cfg in config(), ops in prop::collection::vec(op(), 1..200)) {
        let mut h = Harness::new(&cfg);
        for (step, op) in ops.iter().enumerate() {
            if let Err(diff) = h.apply(op) {
                prop_assert!(false, "step {step} {op:?}: {diff}\nconfig {cfg:?}");
            }
        }
        if let Err(diff) = h.finish() {
            prop_assert!(false, "finish: {diff}\nconfig {cfg:?}");
        }
    }
}
