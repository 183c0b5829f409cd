//! Token fairness: tenants are charged the tokens they are served, and the service difference between two
//! backlogged tenants is bounded by one request's charge; weights, lifting from idle, completion refunds.
#![cfg(not(loom))]

use kvgate::{Admission, Admit, Fairness, Permit, Request, TenantLimits, WaitPolicy};
use proptest::prelude::*;
use std::task::Poll;
use support::admission::poll_once as poll;

/// One slot; `waiting` holds (tenant index, future). Drops `held` and returns the tenant of the one waiter
/// granted next, with its permit.
fn next_grant(held: &mut Option<Permit>, waiting: &mut Vec<(usize, Admit)>) -> Option<(usize, Permit)> {
    drop(held.take());
    let mut granted = None;
    for (i, (_, fut)) in waiting.iter_mut().enumerate() {
        if let Poll::Ready(result) = poll(fut) {
            assert!(granted.is_none(), "two waiters granted one slot");
            granted = Some((i, result.unwrap()));
        }
    }
    let (i, permit) = granted?;
    Some((waiting.remove(i).0, permit))
}

/// One slot, room for 1,000 waiters, token fairness charging prompt and output alike, every tenant tracked.
fn one_slot_token_fair() -> Admission {
    Admission::builder()
        .wait_policy(WaitPolicy::Fifo)
        .max_in_flight(1)
        .queue_capacity(1_000)
        .fairness(Fairness::Tokens { prompt_weight: 1, output_weight: 1 })
        .tenant_defaults(TenantLimits::new())
        .build()
        .unwrap()
}

/// Serves backlogged tenants one request at a time; checks the bound at every grant while all are
/// backlogged; returns the weighted cost served to each.
fn serve(weights: &[u32], sizes: &[(u32, u32)], per_tenant: usize, grants: usize) -> Vec<u64> {
    let mut builder = Admission::builder()
        .wait_policy(WaitPolicy::Fifo)
        .max_in_flight(1)
        .queue_capacity(10_000)
        .fairness(Fairness::Tokens { prompt_weight: 1, output_weight: 1 });
    for (i, w) in weights.iter().enumerate() {
        builder = builder.tenant_limits(i as u64, TenantLimits::new().weight(*w));
    }
    let admission = builder.build().unwrap();
    let mut held = Some(admission.try_admit(&Request::new(1, 0)).unwrap());
    let mut waiting = Vec::new();
    for _ in 0..per_tenant {
        for (i, (prompt, out)) in sizes.iter().enumerate() {
            let mut fut = admission.admit(&Request::new(*prompt, *out).tenant(i as u64));
            assert!(poll(&mut fut).is_pending());
            waiting.push((i, fut));
        }
    }
    let max_charge = sizes.iter().zip(weights).map(|((p, o), w)| f64::from(p + o) / f64::from(*w)).fold(0.0, f64::max);
    let mut served = vec![0u64; sizes.len()];
    for _ in 0..grants {
        let Some((tenant, permit)) = next_grant(&mut held, &mut waiting) else { break };
        let (p, o) = sizes[tenant];
        served[tenant] += u64::from(p + o);
        held = Some(permit);
        let backlogged: Vec<usize> = (0..sizes.len()).filter(|t| waiting.iter().any(|w| w.0 == *t)).collect();
        if backlogged.len() == sizes.len() {
            let normalised: Vec<f64> = (0..sizes.len()).map(|t| served[t] as f64 / f64::from(weights[t])).collect();
            let spread =
                normalised.iter().fold(f64::MIN, |a, b| a.max(*b)) - normalised.iter().fold(f64::MAX, |a, b| a.min(*b));
            assert!(
                spread <= max_charge + 1e-9,
                "spread {spread} above one request's charge {max_charge} ({served:?})"
            );
        }
    }
    served
}

fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    sum * sum / (x.len() as f64 * x.iter().map(|v| v * v).sum::<f64>())
}

#[test]
fn tenants_with_twenty_times_larger_prompts_get_the_same_tokens() {
    // 8,000-token documents against 400-token questions (20x), equal weights.
    // 420 grants: about 20 documents and 400 questions, both tenants backlogged throughout.
    let served = serve(&[1, 1], &[(8_000, 0), (400, 0)], 800, 420);
    let ratio = served[0] as f64 / served[1] as f64;
    assert!((1.0 / 1.1..=1.1).contains(&ratio), "served-token ratio {ratio} ({served:?})");
    assert!(jain(&[served[0] as f64, served[1] as f64]) >= 0.95);

    // Request fairness, for contrast, serves them ~20x apart.
    let admission = Admission::builder()
        .wait_policy(WaitPolicy::Fifo)
        .max_in_flight(1)
        .queue_capacity(10_000)
        .tenant_defaults(TenantLimits::new())
        .build()
        .unwrap();
    let mut held = Some(admission.try_admit(&Request::new(1, 0)).unwrap());
    let mut waiting = Vec::new();
    for _ in 0..100 {
        for (i, prompt) in [8_000u32, 400].into_iter().enumerate() {
            let mut fut = admission.admit(&Request::new(prompt, 0).tenant(i as u64));
            assert!(poll(&mut fut).is_pending());
            waiting.push((i, fut));
        }
    }
    let mut by_requests = [0u64; 2];
    for _ in 0..100 {
        let (t, p) = next_grant(&mut held, &mut waiting).unwrap();
        by_requests[t] += [8_000, 400][t];
        held = Some(p);
    }
    assert!(by_requests[0] as f64 / by_requests[1] as f64 > 15.0);
}

#[test]
fn weights_divide_the_tokens() {
    let served = serve(&[3, 1], &[(500, 100), (500, 100)], 300, 400);
    let ratio = served[0] as f64 / served[1] as f64;
    assert!((3.0 / 1.1..=3.0 * 1.1).contains(&ratio), "ratio {ratio} ({served:?})");
}

#[test]
fn a_tenant_back_from_idle_cannot_spend_banked_credit() {
    let admission = one_slot_token_fair();
    let mut held = Some(admission.try_admit(&Request::new(1, 0)).unwrap());
    let mut waiting = Vec::new();
    // A and B are served for a long while; C is idle.
    for _ in 0..200 {
        for t in 0..2usize {
            let mut fut = admission.admit(&Request::new(1_000, 0).tenant(t as u64));
            assert!(poll(&mut fut).is_pending());
            waiting.push((t, fut));
        }
    }
    for _ in 0..100 {
        let (_, p) = next_grant(&mut held, &mut waiting).unwrap();
        held = Some(p);
    }
    // C arrives with 50 requests: it is lifted to the others' level, so it alternates with them instead of
    // taking the next 50 grants.
    for _ in 0..50 {
        let mut fut = admission.admit(&Request::new(1_000, 0).tenant(2u64));
        assert!(poll(&mut fut).is_pending());
        waiting.push((2, fut));
    }
    let mut next = Vec::new();
    for _ in 0..30 {
        let (t, p) = next_grant(&mut held, &mut waiting).unwrap();
        next.push(t);
        held = Some(p);
    }
    let c = next.iter().filter(|t| **t == 2).count();
    assert!((8..=12).contains(&c), "C got {c} of 30 grants: {next:?}");
}

#[test]
fn completions_refund_the_output_not_produced() {
    let admission = one_slot_token_fair();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting = Vec::new();
    // Both ask for 900 output tokens; A uses 100 of them, B all. A is charged 200 per request, B 1,000.
    for _ in 0..100 {
        for t in 0..2usize {
            let mut fut = admission.admit(&Request::new(100, 900).tenant(t as u64));
            assert!(poll(&mut fut).is_pending());
            waiting.push((t, fut));
        }
    }
    let mut grants = [0u32; 2];
    let mut current = next_grant(&mut Some(held), &mut waiting).unwrap();
    for _ in 0..60 {
        let (t, permit) = current;
        grants[t] += 1;
        // A completes having produced 100 tokens, B all 900; completing grants the next waiter.
        permit.complete(if t == 0 { 100 } else { 900 });
        current = next_grant(&mut None, &mut waiting).unwrap();
    }
    // A costs a fifth of B per request: it gets about five grants per B grant.
    let ratio = f64::from(grants[0]) / f64::from(grants[1]);
    assert!((4.0..=6.0).contains(&ratio), "{grants:?}");
}

proptest! {
    #![proptest_config(support::proptest_config(48))]

    /// The bound holds for random sizes and weights, three tenants.
    #[test]
    fn the_service_difference_stays_within_one_request(
        weights in prop::collection::vec(1u32..5, 3),
        sizes in prop::collection::vec((1u32..4_000, 0u32..2_000), 3),
    ) {
        serve(&weights, &sizes, 60, 120);
    }
}
