//! `Admission::try_admit` + drop with all four limits on, against the cheapest composition a user would
//! otherwise write: governor for requests/s, tokio's `Semaphore::try_acquire_many` for in-flight slots and
//! KV tokens, and a second governor for LLM tokens/s. Uncontended and with 2 threads contending, in the
//! same run. `cargo bench --bench admission`.

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use kvgate::{Admission, Request};
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

const PROMPT: u32 = 512;
const MAX_NEW: u32 = 256;
const TOTAL: u32 = PROMPT + MAX_NEW;

fn kvgate_admission() -> Admission {
    Admission::builder()
        .max_in_flight(1024)
        .kv_capacity_tokens(1 << 40)
        .request_rate(1e9, 1 << 30)
        .token_rate(1e9, 1 << 40)
        .queue_capacity(0)
        .build()
        .unwrap()
}

/// The same four limits, composed from the crates a user would reach for.
struct Composition {
    requests: governor::DefaultDirectRateLimiter,
    tokens: governor::DefaultDirectRateLimiter,
    slots: Semaphore,
    kv: Semaphore,
}

impl Composition {
    fn new() -> Self {
        let quota = |burst: u32| {
            Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()).allow_burst(NonZeroU32::new(burst).unwrap())
        };
        Self {
            requests: RateLimiter::direct(quota(1 << 30)),
            tokens: RateLimiter::direct(quota(u32::MAX)),
            slots: Semaphore::new(1024),
            kv: Semaphore::new(Semaphore::MAX_PERMITS),
        }
    }

    /// All or nothing, like `try_admit`: capacity first, then rates; the permits drop at the end.
    #[inline]
    fn try_admit(&self) -> bool {
        let Ok(slot) = self.slots.try_acquire() else { return false };
        let Ok(kv) = self.kv.try_acquire_many(TOTAL) else { return false };
        if self.requests.check().is_err() {
            return false;
        }
        let ok = self.tokens.check_n(NonZeroU32::new(TOTAL).unwrap()).is_ok_and(|r| r.is_ok());
        drop((slot, kv));
        ok
    }
}

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_uncontended");
    let admission = kvgate_admission();
    let request = Request::new(PROMPT, MAX_NEW);
    group.bench_function("kvgate try_admit+drop", |b| {
        b.iter(|| drop(black_box(admission.try_admit(black_box(&request)))))
    });
    let composition = Composition::new();
    group.bench_function("governor+tokio composition", |b| b.iter(|| black_box(composition.try_admit())));
    group.finish();
}

/// Per-operation time with 2 threads hammering the same limiter (both measured, the mean reported).
fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_contended_2_threads");
    let admission = Arc::new(kvgate_admission());
    group.bench_function("kvgate try_admit+drop", |b| {
        b.iter_custom(|iters| {
            let request = Request::new(PROMPT, MAX_NEW);
            run_pair(iters, {
                let admission = Arc::clone(&admission);
                move || drop(black_box(admission.try_admit(black_box(&request))))
            })
        })
    });
    let composition = Arc::new(Composition::new());
    group.bench_function("governor+tokio composition", |b| {
        b.iter_custom(|iters| {
            run_pair(iters, {
                let composition = Arc::clone(&composition);
                move || {
                    black_box(composition.try_admit());
                }
            })
        })
    });
    group.finish();
}

/// Runs `op` `iters` times on each of two threads started together; returns the mean of their times.
fn run_pair(iters: u64, op: impl Fn() + Send + Clone + 'static) -> Duration {
    support::time_on_two_threads(iters, op).into_iter().sum::<Duration>() / 2
}

/// Per-tenant limits: a request of a tenant already tracked (1,000 tenants in rotation) and of a tenant
/// never seen before, against governor's keyed limiter (`check_key`) on the same keys.
fn tenants(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission_tenant");
    let admission = Admission::builder()
        .max_in_flight(1024)
        .kv_capacity_tokens(1 << 40)
        .queue_capacity(0)
        .tenant_defaults(kvgate::TenantLimits::new().request_rate(1e9, 1 << 30).max_in_flight(64))
        .max_tenants(10_000)
        .build()
        .unwrap();
    let keyed = RateLimiter::keyed(
        Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()).allow_burst(NonZeroU32::new(1 << 30).unwrap()),
    );
    let mut i = 0u64;
    group.bench_function("kvgate try_admit+drop, existing tenant", |b| {
        b.iter(|| {
            i = (i + 1) % 1_000;
            drop(black_box(admission.try_admit(&Request::new(PROMPT, MAX_NEW).tenant(i))))
        })
    });
    let mut i = 0u64;
    group.bench_function("governor check_key, existing key", |b| {
        b.iter(|| {
            i = (i + 1) % 1_000;
            black_box(keyed.check_key(&i))
        })
    });
    let mut fresh = 1u64 << 32;
    group.bench_function("kvgate try_admit+drop, new tenant", |b| {
        b.iter(|| {
            fresh += 1;
            drop(black_box(admission.try_admit(&Request::new(PROMPT, MAX_NEW).tenant(fresh))))
        })
    });
    let mut fresh = 1u64 << 32;
    group.bench_function("governor check_key, new key", |b| {
        b.iter(|| {
            fresh += 1;
            black_box(keyed.check_key(&fresh))
        })
    });
    group.finish();
    println!(
        "after the run: kvgate tracks {} tenants (bounded by max_tenants); governor holds {} keys",
        admission.tracked_tenants(),
        keyed.len()
    );
}

criterion_group!(benches, uncontended, contended, tenants);
criterion_main!(benches);
