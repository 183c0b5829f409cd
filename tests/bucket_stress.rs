//! Threaded stress: 4 threads hammer `try_acquire` while another thread advances a shared `ManualClock`.
//! Whatever the interleaving, the total granted never exceeds `burst` plus the tokens accrued over the
//! time the clock was advanced (an exact bound: at 10^6 tokens/s one token accrues per 1000 ns exactly).
#![cfg(not(loom))]

use kvgate::bucket::TokenBucket;
use kvgate::clock::{Clock, ManualClock};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

/// Clock advances, and acquire attempts per worker (fixed counts: no test waits on the scheduler).
const STEPS: u64 = if cfg!(miri) { 50 } else { 20_000 };
const TRIES: u64 = if cfg!(miri) { 50 } else { 50_000 };

fn stress(burst: u64, n: u64, step_ns: u64) {
    let clock = ManualClock::starting_at(123_456_789);
    let start = clock.now_nanos();
    let bucket = Arc::new(TokenBucket::with_clock(1e6, burst, clock.clone()).unwrap());
    let granted = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (bucket, granted) = (Arc::clone(&bucket), Arc::clone(&granted));
            thread::spawn(move || {
                let mut mine = 0;
                for _ in 0..TRIES {
                    if bucket.try_acquire(n).is_ok() {
                        mine += n;
                    }
                }
                granted.fetch_add(mine, Ordering::Relaxed);
            })
        })
        .collect();
    for _ in 0..STEPS {
        clock.advance(Duration::from_nanos(step_ns));
    }
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = clock.now_nanos() - start;
    let accrued = elapsed / 1_000; // exact: 10^6 tokens/s
    let granted = granted.load(Ordering::Relaxed);
    let left = bucket.available();
    assert!(granted <= burst + accrued, "granted {granted} > burst {burst} + accrued {accrued}");
    assert!(granted + left <= burst + accrued, "granted {granted} + left {left} > {burst} + {accrued}");
    assert_eq!(granted % n, 0);
}

#[test]
fn four_threads_single_tokens() {
    stress(10, 1, 700);
}

#[test]
fn four_threads_weighted() {
    stress(1_000, 7, 3_300);
}

#[test]
fn four_threads_with_refunds_and_rate_changes_stay_bounded() {
    // Refunds and set_rate interleaved with acquires. The rate alternates between 2e6/s (500 units a
    // token) and 1e6/s (1000 units), so every change converts `tat` while the workers CAS it. No panic,
    // `available` never exceeds the burst, and the tokens handed out net of refunds are at most the burst
    // plus what the faster rate accrues over the run (a rate change keeps what is held and the progress,
    // rounded down: it never adds).
    let clock = ManualClock::new();
    let bucket = Arc::new(TokenBucket::with_clock(1e6, 64, clock.clone()).unwrap());
    let net = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4u64)
        .map(|i| {
            let (bucket, net) = (Arc::clone(&bucket), Arc::clone(&net));
            thread::spawn(move || {
                let mut mine = 0;
                for _ in 0..TRIES / 10 {
                    if bucket.try_acquire(i + 1).is_ok() {
                        if i % 2 == 0 {
                            bucket.refund(i + 1);
                        } else {
                            mine += i + 1;
                        }
                    }
                    assert!(bucket.available() <= 64);
                }
                net.fetch_add(mine, Ordering::Relaxed);
            })
        })
        .collect();
    for step in 0..STEPS / 10 {
        clock.advance(Duration::from_nanos(900));
        if step % 100 == 0 {
            let rate = if step % 200 == 0 { 2e6 } else { 1e6 };
            bucket.set_rate(rate, 64).unwrap();
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    let elapsed = clock.now_nanos();
    let net = net.load(Ordering::Relaxed);
    assert!(bucket.available() <= 64);
    assert!(net <= 64 + elapsed / 500, "{net} handed out net in {elapsed} ns");
}
