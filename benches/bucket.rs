//! `TokenBucket` against governor's direct rate limiter, in the same run.
//!
//! Both limiters use a very high rate and a huge burst so that every acquisition succeeds: this measures
//! the success path (the common one in admission control). `cargo bench --bench bucket`.
//!
//! At 10^9/s, as at every rate whose `10^9 / rate` is a whole number (1/s, 5/s, 1000/s, 10^6/s, ...), the
//! bucket's unit is exactly one nanosecond and its hot path skips the fixed-point multiplication; the row
//! "999999937/s" measures the general path, with the multiplication, at the same scale.

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use kvgate::bucket::TokenBucket;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

const BURST: u32 = u32::MAX;

fn kv_bucket() -> TokenBucket {
    TokenBucket::new(1e9, u64::from(BURST)).unwrap()
}

/// A rate whose unit is not one nanosecond (10^9 / rate is not a whole number).
const GENERAL_RATE: f64 = 999_999_937.0;

/// `std::time::Instant` behind kvgate's `Clock` trait: what the default clock costs without the
/// `quanta` feature (the default `MonotonicClock` reads the TSC through quanta, like governor).
#[derive(Debug, Clone)]
struct StdClock {
    origin: Instant,
}

impl kvgate::clock::Clock for StdClock {
    #[inline]
    fn now_nanos(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

fn kv_std_clock() -> TokenBucket<StdClock> {
    TokenBucket::with_clock(1e9, u64::from(BURST), StdClock { origin: Instant::now() }).unwrap()
}

fn gov() -> governor::DefaultDirectRateLimiter {
    let burst = NonZeroU32::new(BURST).unwrap();
    RateLimiter::direct(Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()).allow_burst(burst))
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("bucket");
    let kv = kv_bucket();
    group.bench_function("kvgate try_acquire(1)", |b| b.iter(|| black_box(kv.try_acquire(black_box(1)))));
    let kv = kv_std_clock();
    group.bench_function("kvgate try_acquire(1) std Instant clock", |b| {
        b.iter(|| black_box(kv.try_acquire(black_box(1))))
    });
    let kv = kv_bucket();
    let mut now = 0u64;
    group.bench_function("kvgate try_acquire_at(1) time supplied", |b| {
        b.iter(|| {
            now += 1;
            black_box(kv.try_acquire_at(black_box(1), now))
        })
    });
    let g = gov();
    group.bench_function("governor check()", |b| b.iter(|| black_box(g.check())));
    let kv = TokenBucket::new(GENERAL_RATE, u64::from(BURST)).unwrap();
    group.bench_function("kvgate try_acquire(1) 999999937/s", |b| b.iter(|| black_box(kv.try_acquire(black_box(1)))));
    let kv = kv_std_clock();
    group.bench_function("kvgate try_acquire(10) std Instant clock", |b| {
        b.iter(|| black_box(kv.try_acquire(black_box(10))))
    });
    let kv = kv_bucket();
    group.bench_function("kvgate try_acquire(10)", |b| b.iter(|| black_box(kv.try_acquire(black_box(10)))));
    let g = gov();
    let ten = NonZeroU32::new(10).unwrap();
    group.bench_function("governor check_n(10)", |b| b.iter(|| black_box(g.check_n(black_box(ten)))));
    group.finish();
}

/// Time per operation with two threads acquiring from the same limiter at once: the slower thread's time
/// for its own iterations (both run `iters`).
fn contended(iters: u64, op: impl Fn() + Send + Clone + 'static) -> Duration {
    support::time_on_two_threads(iters, op).into_iter().max().unwrap_or_default()
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("bucket 2 threads contended");
    let kv = Arc::new(kv_bucket());
    group.bench_function("kvgate try_acquire(1)", |b| {
        b.iter_custom(|iters| {
            let kv = Arc::clone(&kv);
            contended(iters, move || {
                let _ = black_box(kv.try_acquire(1));
            })
        })
    });
    let kv = Arc::new(kv_std_clock());
    group.bench_function("kvgate try_acquire(1) std Instant clock", |b| {
        b.iter_custom(|iters| {
            let kv = Arc::clone(&kv);
            contended(iters, move || {
                let _ = black_box(kv.try_acquire(1));
            })
        })
    });
    let g = Arc::new(gov());
    group.bench_function("governor check()", |b| {
        b.iter_custom(|iters| {
            let g = Arc::clone(&g);
            contended(iters, move || {
                let _ = black_box(g.check());
            })
        })
    });
    group.finish();
}

criterion_group!(benches, single_thread, two_threads);
criterion_main!(benches);
