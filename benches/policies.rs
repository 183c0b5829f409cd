//! What token-fair queueing and deadline-aware shedding add to `try_admit`: the same admission as
//! `benches/admission.rs` (all four limits on), with each policy off and on, in one run.
//!
//! - **Deadlines**: a request carrying a TTFT deadline when there is room (admitted at once: the
//!   prediction is not needed), and when there is none (the prediction refuses it), next to the same
//!   refusal without a deadline.
//! - **Token fairness**: a tenant's `try_admit` + drop under request-count fairness and under token
//!   fairness (which charges the tenant's virtual counter on the grant), and `Permit::complete` with half
//!   the output unused (which refunds it).
//!
//! `cargo bench --bench policies`.

use criterion::{Criterion, criterion_group, criterion_main};
use kvgate::{Admission, Fairness, Permit, Request, TenantLimits};
use std::hint::black_box;
use std::time::Duration;

const PROMPT: u32 = 512;
const MAX_NEW: u32 = 256;
/// A deadline no prediction comes near with room to spare.
const DEADLINE: Duration = Duration::from_secs(2);

/// The admission of `benches/admission.rs`: every limit on and far from binding, refused at once.
fn admission(max_in_flight: usize, fairness: Fairness, tenants: bool) -> Admission {
    let mut builder = Admission::builder()
        .max_in_flight(max_in_flight)
        .kv_capacity_tokens(1 << 40)
        .request_rate(1e9, 1 << 30)
        .token_rate(1e9, 1 << 40)
        .queue_capacity(0)
        .expected_hold_time(Duration::from_secs(10))
        .fairness(fairness);
    if tenants {
        builder = builder.tenant_defaults(TenantLimits::new());
    }
    builder.build().unwrap()
}

fn deadlines(c: &mut Criterion) {
    let mut group = c.benchmark_group("policies_deadline");
    let open = admission(1024, Fairness::Requests, false);
    let plain = Request::new(PROMPT, MAX_NEW);
    let carrying = plain.ttft_deadline(DEADLINE);
    group.bench_function("try_admit+drop, no deadline (policy off)", |b| {
        b.iter(|| drop(black_box(open.try_admit(black_box(&plain)))))
    });
    group.bench_function("try_admit+drop, deadline carried, room", |b| {
        b.iter(|| drop(black_box(open.try_admit(black_box(&carrying)))))
    });
    // One slot, held: every try is refused; with a deadline, because the predicted start (the slot
    // returns in about the 10-s expected hold) is past it.
    let full = admission(1, Fairness::Requests, false);
    let _held = full.try_admit(&plain).unwrap();
    group.bench_function("try_admit refused, no deadline", |b| {
        b.iter(|| black_box(full.try_admit(black_box(&plain))).is_err())
    });
    assert!(full.try_admit(&carrying).is_err());
    group.bench_function("try_admit refused, deadline predicted missed", |b| {
        b.iter(|| black_box(full.try_admit(black_box(&carrying))).is_err())
    });
    group.finish();
}

fn fairness(c: &mut Criterion) {
    let mut group = c.benchmark_group("policies_fairness");
    let request = Request::new(PROMPT, MAX_NEW).tenant(7u64);
    for (name, fairness) in [("requests", Fairness::Requests), ("tokens", Fairness::tokens())] {
        let admission = admission(1024, fairness, true);
        group.bench_function(format!("try_admit+drop, a tenant, {name} fairness"), |b| {
            b.iter(|| drop(black_box(admission.try_admit(black_box(&request)))))
        });
        group.bench_function(format!("try_admit+complete, a tenant, {name} fairness"), |b| {
            b.iter(|| {
                let permit: Permit = admission.try_admit(black_box(&request)).unwrap();
                permit.complete(black_box(MAX_NEW / 2));
            })
        });
    }
    group.finish();
}

criterion_group!(benches, deadlines, fairness);
criterion_main!(benches);
