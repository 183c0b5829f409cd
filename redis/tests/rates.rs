//! Shared rates against an exact model of GCRA: the same decisions and the same hints (at Redis'
//! microsecond), refunds, tenants, and a clock that steps back. Time is a `ManualClock` sent
//! with every call, so nothing here depends on timing.

mod support;

use kvgate::clock::{Clock, ManualClock};
use kvgate::{Limit, Rejection, Request};
use kvgate_redis::TenantRates;
use proptest::prelude::*;
use std::time::Duration;

#[tokio::test]
async fn refusals_carry_the_exact_wait_of_every_rate() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let limits = support::limits("exact").request_rate(3.0, 2).token_rate(1000.0, 1000);
    let admission = support::manual(&redis, limits, &clock).await;
    let a = admission.try_admit(&Request::new(300, 300)).await.unwrap();
    let b = admission.try_admit(&Request::new(100, 100)).await.unwrap();
    // Request rate empty: one request in 1/3 s (333,334 µs rounded up); tokens: 200 short of 500 at
    // 1000/s: 300 ms. The hint is the later of the two.
    let refused = admission.try_admit(&Request::new(250, 250)).await.unwrap_err();
    assert_eq!(refused, Rejection::RateLimited { retry_after: Duration::from_micros(333_334) });
    clock.advance(Duration::from_micros(333_333));
    assert!(admission.try_admit(&Request::new(250, 250)).await.is_err(), "one microsecond early");
    clock.advance(Duration::from_micros(1));
    let c = admission.try_admit(&Request::new(250, 250)).await.unwrap();
    drop((a, b, c));
}

#[tokio::test]
async fn too_large_for_a_burst_never_fits() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::new();
    let limits = support::limits("large")
        .token_rate(100.0, 1000)
        .kv_capacity(5000)
        .tenant_defaults(TenantRates::new().token_rate(10.0, 100));
    let admission = support::manual(&redis, limits, &clock).await;
    assert_eq!(
        admission.try_admit(&Request::new(1000, 1)).await.unwrap_err(),
        Rejection::TooLarge { limit: Limit::TokenRate, requested: 1001, capacity: 1000 }
    );
    assert_eq!(
        admission.try_admit(&Request::new(100, 1).tenant("t")).await.unwrap_err(),
        Rejection::TooLarge { limit: Limit::TenantTokenRate, requested: 101, capacity: 100 }
    );
    assert!(admission.try_admit(&Request::new(99, 1).tenant("t")).await.is_ok());
}

#[tokio::test]
async fn complete_refunds_unused_tokens_to_every_token_bucket() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::new();
    let limits =
        support::limits("refund").token_rate(0.001, 1000).tenant_defaults(TenantRates::new().token_rate(0.001, 600));
    let admission = support::manual(&redis, limits, &clock).await;
    let permit = admission.try_admit(&Request::new(100, 500).tenant("t")).await.unwrap();
    assert!(admission.try_admit(&Request::new(1, 0).tenant("t")).await.is_err(), "the tenant's bucket is empty");
    permit.complete(100); // 400 unused come back to both buckets (in the background)
    admission.flush().await;
    assert!(admission.try_admit(&Request::new(100, 301).tenant("t")).await.is_err(), "only 400 came back");
    let permit = admission.try_admit(&Request::new(100, 300).tenant("t")).await.unwrap();
    // The global bucket got its 400 back too: 1000 - 600 + 400 - 400 = 400 left.
    drop(permit);
    assert!(admission.try_admit(&Request::new(1, 0)).await.is_ok());
}

#[tokio::test]
async fn tenants_have_their_own_buckets_and_the_global_one_too() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::new();
    let limits = support::limits("tenants")
        .request_rate(1.0, 3)
        .tenant_defaults(TenantRates::new().request_rate(1.0, 1))
        .tenant_rates("vip", TenantRates::new().request_rate(1.0, 2));
    let admission = support::manual(&redis, limits, &clock).await;
    let _a = admission.try_admit(&Request::new(1, 1).tenant("alice")).await.unwrap();
    assert_eq!(
        admission.try_admit(&Request::new(1, 1).tenant("alice")).await.unwrap_err(),
        Rejection::RateLimited { retry_after: Duration::from_secs(1) }
    );
    let _v1 = admission.try_admit(&Request::new(1, 1).tenant("vip")).await.unwrap();
    let _v2 = admission.try_admit(&Request::new(1, 1).tenant("vip")).await.unwrap();
    // Global bucket now empty: bob's own bucket is full, the global one says when.
    assert_eq!(
        admission.try_admit(&Request::new(1, 1).tenant("bob")).await.unwrap_err(),
        Rejection::RateLimited { retry_after: Duration::from_secs(1) }
    );
}

#[tokio::test]
async fn a_clock_stepping_back_grants_nothing_extra() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::starting_at(50_000_000_000);
    let admission = support::manual(&redis, support::limits("back").request_rate(10.0, 2), &clock).await;
    let _a = admission.try_admit(&Request::new(1, 1)).await.unwrap();
    let _b = admission.try_admit(&Request::new(1, 1)).await.unwrap();
    clock.set_nanos(40_000_000_000); // Redis' clock jumps 10 s back
    let refused = admission.try_admit(&Request::new(1, 1)).await.unwrap_err();
    // Stalled: the wait is measured from the earlier time, never negative, never an extra token.
    assert!(refused.retry_after().unwrap() >= Duration::from_millis(100));
    clock.set_nanos(50_000_000_000);
    assert!(admission.try_admit(&Request::new(1, 1)).await.is_err());
    clock.advance(Duration::from_millis(100));
    assert!(admission.try_admit(&Request::new(1, 1)).await.is_ok());
}

#[tokio::test]
async fn on_a_manual_clock_a_bucket_does_not_refill_with_redis_time() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let admission = support::manual(&redis, support::limits("slow").token_rate(12_345.678, 12), &clock).await;
    let _taken = admission.try_admit(&Request::new(1, 9)).await.unwrap();
    // The debt (10 tokens: 811 µs) is paid off on the manual clock only: real time passing, as on a slow
    // machine between two steps of a test, refills nothing.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        admission.try_admit(&Request::new(1, 10)).await.unwrap_err(),
        Rejection::RateLimited { retry_after: Duration::from_micros(730) }
    );
}

#[derive(Debug, Clone)]
enum Op {
    Take(u64),
    Refund(u64),
    Wait(u64),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => (2u64..=12).prop_map(Op::Take),
            1 => (1u64..=12).prop_map(Op::Refund),
            3 => (0u64..400_000).prop_map(Op::Wait),
        ],
        1..40,
    )
}

/// An exact model of time-based GCRA in rationals: `tat` in units of 1/a µs.
struct Model {
    a: u128,
    b: u128,
    burst: u128,
    tat: u128,
}

impl Model {
    fn new(rate: f64, burst: u64) -> Self {
        let milli = (rate * 1000.0).round() as u128;
        let g = gcd(milli, 1_000_000_000);
        Self { a: milli / g, b: 1_000_000_000 / g, burst: u128::from(burst), tat: 0 }
    }

    fn take(&mut self, n: u64, now_us: u64) -> Result<(), Duration> {
        let now = u128::from(now_us) * self.a;
        let start = self.tat.max(now);
        let need = start - now + u128::from(n) * self.b;
        if need <= self.burst * self.b {
            self.tat = start + u128::from(n) * self.b;
            return Ok(());
        }
        Err(Duration::from_micros((need - self.burst * self.b).div_ceil(self.a) as u64))
    }

    fn refund(&mut self, n: u64, now_us: u64) {
        let now = u128::from(now_us) * self.a;
        if self.tat > now {
            self.tat = self.tat.saturating_sub(u128::from(n) * self.b).max(now);
        }
    }
}

fn gcd(mut x: u128, mut y: u128) -> u128 {
    while y != 0 {
        (x, y) = (y, x % y);
    }
    x
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// The shared token rate decides exactly as an exact rational model of GCRA on the same clock, with
    /// exact hints, through takes, refunds and waits.
    #[test]
    fn shared_bucket_decides_as_exact_gcra(
        rate in prop_oneof![Just(1.0), Just(3.0), Just(7.5), Just(250.0), Just(12_345.678), Just(0.001)],
        burst in 12u64..40,
        ops in ops(),
    ) {
        let Some(redis) = support::redis() else { return Ok(()) };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
            let mut model = Model::new(rate, burst);
            let admission = support::manual(&redis, support::limits("model").token_rate(rate, burst), &clock).await;
            let mut held = std::collections::VecDeque::new();
            for op in ops {
                let now_us = clock.now_nanos() / 1000;
                match op {
                    Op::Take(n) => {
                        let expected = model.take(n, now_us);
                        let got = admission.try_admit(&Request::new(1, n as u32 - 1)).await;
                        match (expected, got) {
                            (Ok(()), Ok(permit)) => held.push_back((permit, n - 1)),
                            (Err(wait), Err(Rejection::RateLimited { retry_after })) => {
                                assert_eq!(retry_after, wait, "hint for {n} at {now_us} µs");
                            }
                            (expected, got) => panic!("model {expected:?}, shared {got:?} for {n} at {now_us} µs"),
                        }
                    }
                    Op::Refund(k) => {
                        // The oldest permit completes with `k` of its output tokens unused.
                        if let Some((permit, max_new)) = held.pop_front() {
                            let k = k.min(max_new);
                            model.refund(k, now_us);
                            permit.complete((max_new - k) as u32);
                            admission.flush().await;
                        }
                    }
                    Op::Wait(micros) => clock.advance(Duration::from_micros(micros)),
                }
            }
        });
    }
}
