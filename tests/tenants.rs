//! Tenants: per-tenant limits together with the global ones, fair queueing across tenants, and the
//! bounded registry.
#![cfg(not(loom))]

use futures::FutureExt;
use kvgate::clock::ManualClock;
use kvgate::{Admission, Admit, ConfigError, Limit, Rejection, Request, TenantId, TenantLimits};
use proptest::prelude::*;
use std::time::Duration;

fn req(tenant: &str) -> Request {
    Request::new(10, 0).tenant(tenant)
}

#[test]
fn tenant_limits_apply_with_global_ones() {
    let admission = Admission::builder()
        .max_in_flight(10)
        .kv_capacity_tokens(1_000)
        .tenant_defaults(TenantLimits::new().max_in_flight(2).kv_share(0.5))
        .tenant_limits("vip", TenantLimits::new().max_in_flight(5))
        .build()
        .unwrap();
    let a1 = admission.try_admit(&req("alice")).unwrap();
    let a2 = admission.try_admit(&req("alice")).unwrap();
    // Alice is at her own cap: 429 (she is too busy), while the server still has room for others.
    let err = admission.try_admit(&req("alice")).unwrap_err();
    assert!(matches!(err, Rejection::RateLimited { .. }), "{err:?}");
    assert_eq!(err.http_status(), 429);
    let vip: Vec<_> = (0..5).map(|_| admission.try_admit(&req("vip")).unwrap()).collect();
    assert!(admission.try_admit(&req("vip")).is_err());
    // A request without a tenant only meets the global limits.
    let anonymous = admission.try_admit(&Request::new(10, 0)).unwrap();
    // KV share: half of 1000 tokens for one tenant, at most.
    assert_eq!(
        admission.try_admit(&Request::new(501, 0).tenant("bob")).unwrap_err(),
        Rejection::TooLarge { limit: Limit::TenantKvShare, requested: 501, capacity: 500 }
    );
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.kv_used), (8, 80));
    assert_eq!(admission.busiest_tenants(1)[0], (TenantId::from("vip"), 5));
    drop((a1, a2, vip, anonymous));
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.kv_used), (0, 0));
    assert!(admission.try_admit(&req("alice")).is_ok());
}

#[test]
fn tenant_rates_limit_one_tenant_only() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .tenant_defaults(TenantLimits::new().request_rate(1.0, 2).token_rate(100.0, 100))
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(admission.try_admit(&req("alice")).is_ok());
    assert!(admission.try_admit(&req("alice")).is_ok());
    assert_eq!(
        admission.try_admit(&req("alice")).unwrap_err(),
        Rejection::RateLimited { retry_after: Duration::from_secs(1) }
    );
    assert!(admission.try_admit(&req("bob")).is_ok(), "bob has his own bucket");
    assert_eq!(
        admission.try_admit(&Request::new(101, 0).tenant("carol")).unwrap_err(),
        Rejection::TooLarge { limit: Limit::TenantTokenRate, requested: 101, capacity: 100 }
    );
    clock.advance(Duration::from_secs(1));
    assert!(admission.try_admit(&req("alice")).is_ok());
    // A refused tenant request spent nothing of the global limits or the other buckets.
    assert_eq!(admission.snapshot().in_flight, 0);
}

#[test]
fn invalid_tenant_limits_are_configuration_errors() {
    let build = |limits: TenantLimits| Admission::builder().tenant_defaults(limits).build();
    assert!(matches!(build(TenantLimits::new().max_in_flight(0)), Err(ConfigError::Zero { .. })));
    assert!(matches!(build(TenantLimits::new().weight(0)), Err(ConfigError::Zero { .. })));
    for share in [0.0, -0.5, 1.5, f64::NAN] {
        assert!(matches!(build(TenantLimits::new().kv_share(share)), Err(ConfigError::OutOfRange { .. })), "{share}");
    }
    assert!(matches!(build(TenantLimits::new().request_rate(f64::NAN, 1)), Err(ConfigError::InvalidRate { .. })));
    assert!(matches!(build(TenantLimits::new().token_rate(1.0, 0)), Err(ConfigError::Zero { .. })));
    assert!(matches!(
        Admission::builder().tenant_limits("x", TenantLimits::new().request_rate(-1.0, 1)).build(),
        Err(ConfigError::InvalidRate { .. })
    ));
    assert!(matches!(Admission::builder().max_tenants(0).build(), Err(ConfigError::Zero { .. })));
}

/// Tenant A floods 500 waiting requests, then tenant B sends 10. With equal weights, grants alternate
/// between the tenants that wait, so B's k-th request is granted by the (2k)-th grant after B arrived:
/// all 10 within the first 20 grants — not after A's 500.
#[test]
fn a_flooding_tenant_does_not_starve_another() {
    let admission = Admission::builder()
        .max_in_flight(1)
        .queue_capacity(1_000)
        .tenant_defaults(TenantLimits::new())
        .deadline_timer(false)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let mut held = Some(admission.try_admit(&Request::new(1, 0)).unwrap());
    let mut waiting: Vec<(char, Admit)> = Vec::new();
    for _ in 0..500 {
        let mut f = admission.admit(&req("A"));
        assert!((&mut f).now_or_never().is_none());
        waiting.push(('A', f));
    }
    for _ in 0..10 {
        let mut f = admission.admit(&req("B"));
        assert!((&mut f).now_or_never().is_none());
        waiting.push(('B', f));
    }
    assert_eq!(admission.snapshot().queued, 510);
    let mut order = Vec::new();
    while !waiting.is_empty() {
        drop(held.take()); // one release: exactly one grant
        let mut granted = None;
        for (i, (tenant, f)) in waiting.iter_mut().enumerate() {
            if let Some(result) = f.now_or_never() {
                granted = Some((i, *tenant, result.unwrap()));
                break;
            }
        }
        let (i, tenant, permit) = granted.expect("a release grants a waiter");
        drop(waiting.remove(i));
        order.push(tenant);
        held = Some(permit);
    }
    let last_b = order.iter().rposition(|t| *t == 'B').unwrap();
    assert!(last_b < 20, "B's last request was grant #{}: {:?}", last_b + 1, &order[..25]);
    // FIFO within a tenant and every request served exactly once.
    assert_eq!(order.iter().filter(|t| **t == 'A').count(), 500);
    drop(held);
    assert_eq!(admission.snapshot().in_flight, 0);
}

#[test]
fn weights_share_grants_proportionally() {
    let admission = Admission::builder()
        .max_in_flight(1)
        .queue_capacity(1_000)
        .tenant_limits("heavy", TenantLimits::new().weight(3))
        .deadline_timer(false)
        .build()
        .unwrap();
    let mut held = Some(admission.try_admit(&Request::new(1, 0)).unwrap());
    let mut waiting: Vec<(&str, Admit)> = Vec::new();
    for tenant in ["light", "heavy"] {
        for _ in 0..40 {
            let mut f = admission.admit(&req(tenant));
            assert!((&mut f).now_or_never().is_none());
            waiting.push((tenant, f));
        }
    }
    let mut first_40 = Vec::new();
    while first_40.len() < 40 {
        drop(held.take()); // one release: exactly one grant
        let (i, permit) = waiting
            .iter_mut()
            .enumerate()
            .find_map(|(i, (_, f))| f.now_or_never().map(|r| (i, r.unwrap())))
            .expect("a release grants a waiter");
        first_40.push(waiting.remove(i).0);
        held = Some(permit);
    }
    let heavy = first_40.iter().filter(|t| **t == "heavy").count();
    assert_eq!(heavy, 30, "weight 3 against 1: three of every four grants ({first_40:?})");
}

#[test]
fn tracked_tenants_stay_bounded() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .max_tenants(64)
        .tenant_idle_timeout(Duration::from_secs(1))
        .tenant_defaults(TenantLimits::new().max_in_flight(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    // More ids than the registry holds, none idle yet: the extra ones share the overflow tenant.
    let held: Vec<_> = (0..200u64).filter_map(|id| admission.try_admit(&Request::new(1, 0).tenant(id)).ok()).collect();
    assert!(admission.tracked_tenants() <= 64);
    assert!(held.len() >= 64, "tracked tenants admit one each; the overflow tenant one more");
    drop(held);
    // Once idle, old tenants are evicted to make room for new ones.
    clock.advance(Duration::from_secs(2));
    for id in 1_000..1_200u64 {
        drop(admission.try_admit(&Request::new(1, 0).tenant(id)).unwrap());
    }
    assert!(admission.tracked_tenants() <= 64);
}

#[derive(Debug, Clone)]
enum Op {
    Admit { tenant: u8, tokens: u32 },
    Drop(usize),
}

proptest! {
    #![proptest_config(support::proptest_config(128))]

    /// Per-tenant and global limits hold together over random sequences; every tenant's usage returns
    /// to zero (conservation per tenant).
    #[test]
    fn tenant_and_global_limits_hold_together(
        global_in_flight in 1usize..8,
        tenant_in_flight in 1usize..4,
        share in 0.2f64..1.0,
        ops in prop::collection::vec(prop_oneof![
            3 => (0u8..4, 1u32..60).prop_map(|(tenant, tokens)| Op::Admit { tenant, tokens }),
            2 => any::<usize>().prop_map(Op::Drop),
        ], 1..100),
    ) {
        let kv_capacity = 200u64;
        let admission = Admission::builder()
            .max_in_flight(global_in_flight)
            .kv_capacity_tokens(kv_capacity)
            .queue_capacity(0)
            .tenant_defaults(TenantLimits::new().max_in_flight(tenant_in_flight).kv_share(share))
            .build()
            .unwrap();
        let tenant_kv = ((kv_capacity as f64) * share).floor().max(1.0) as u64;
        let mut held: Vec<(u8, u64, kvgate::Permit)> = Vec::new();
        for op in ops {
            match op {
                Op::Admit { tenant, tokens } => {
                    let t_in_flight = held.iter().filter(|h| h.0 == tenant).count();
                    let t_kv: u64 = held.iter().filter(|h| h.0 == tenant).map(|h| h.1).sum();
                    let g_kv: u64 = held.iter().map(|h| h.1).sum();
                    let kv = u64::from(tokens);
                    let expected = if kv > tenant_kv {
                        "too_large"
                    } else if held.len() >= global_in_flight || g_kv + kv > kv_capacity {
                        "no_capacity"
                    } else if t_in_flight >= tenant_in_flight || t_kv + kv > tenant_kv {
                        "rate_limited"
                    } else {
                        "ok"
                    };
                    match admission.try_admit(&Request::new(tokens, 0).tenant(u64::from(tenant))) {
                        Ok(p) => { prop_assert_eq!(expected, "ok"); held.push((tenant, kv, p)); }
                        Err(r) => prop_assert_eq!(r.reason(), expected),
                    }
                }
                Op::Drop(i) if !held.is_empty() => { let i = i % held.len(); held.remove(i); }
                Op::Drop(_) => {}
            }
            let s = admission.snapshot();
            prop_assert_eq!(s.in_flight, held.len());
            prop_assert_eq!(s.kv_used, held.iter().map(|h| h.1).sum::<u64>());
            for (id, n) in admission.busiest_tenants(8) {
                prop_assert_eq!(n as usize, held.iter().filter(|h| u64::from(h.0) == id.get()).count());
            }
        }
        held.clear();
        prop_assert!(admission.busiest_tenants(8).is_empty());
        prop_assert_eq!(admission.snapshot().in_flight, 0);
    }
}
