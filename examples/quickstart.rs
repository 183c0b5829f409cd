//! A burst of requests against one simulated GPU server, gated by kvgate.
//!
//! `cargo run --release --example quickstart`
//!
//! 64 "employees" (threads) each send 4 chat requests at once to a server that batches 8 sequences and
//! has a KV-cache budget of 60k tokens. Each request first passes `try_admit`; when refused for capacity
//! it waits in the bounded queue with `admit_blocking` (up to 2 s). The run prints what the primitives
//! did: admitted, waited, rejected and why, and that every unit of capacity came back.

use kvgate::bucket::TokenBucket;
use kvgate::queue::BoundedQueue;
use kvgate::{Admission, Priority, Rejection, Request};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("kvgate quickstart: the primitives under a burst\n");

    // 1. The bounded MPMC queue: full means "no", never an unbounded backlog.
    let queue = BoundedQueue::new(4);
    let accepted = (0..6).filter(|i| queue.push(*i).is_ok()).count();
    println!("BoundedQueue(capacity 4): accepted {accepted} of 6 pushes, {} waiting", queue.len());

    // 2. The token bucket: a burst passes, then the exact wait until the next token.
    let bucket = TokenBucket::new(10.0, 5)?;
    let passed = (0..8).filter(|_| bucket.try_acquire(1).is_ok()).count();
    let wait = bucket.try_acquire(1).unwrap_err().retry_after();
    println!("TokenBucket(10/s, burst 5): {passed} of 8 passed at once; next token in {wait:?}\n");

    // 3. Admission: every limit at once, a waiting room, RAII permits.
    let admission = Admission::builder()
        .max_in_flight(8)
        .kv_capacity_tokens(60_000)
        .request_rate(1_000.0, 150)
        .token_rate(2_000_000.0, 400_000)
        .queue_capacity(128)
        .max_queue_wait(Duration::from_secs(2))
        .build()?;

    let outcomes: Arc<Mutex<BTreeMap<&'static str, u32>>> = Arc::default();
    let started = Instant::now();
    let employees: Vec<_> = (0..64u32)
        .map(|employee| {
            let (admission, outcomes) = (admission.clone(), Arc::clone(&outcomes));
            std::thread::spawn(move || {
                for turn in 0..4u32 {
                    let prompt = 500 + (employee * 97 + turn * 31) % 3_000;
                    let priority = if employee % 8 == 0 { Priority::Batch } else { Priority::Interactive };
                    let request = Request::new(prompt, 1_000).priority(priority);
                    let result = match admission.try_admit(&request) {
                        Ok(permit) => Ok((permit, "admitted at once")),
                        Err(Rejection::NoCapacity { .. }) => {
                            admission.admit_blocking(&request, None).map(|p| (p, "admitted after waiting"))
                        }
                        Err(other) => Err(other),
                    };
                    let outcome = match result {
                        Ok((permit, how)) => {
                            // "Generate": hold the KV cache for a few milliseconds, then report the
                            // tokens really produced so the unused reservation is refunded.
                            std::thread::sleep(Duration::from_millis(5 + u64::from(prompt % 7)));
                            permit.complete(200 + prompt % 600);
                            how
                        }
                        Err(rejection) => rejection.reason(),
                    };
                    *outcomes.lock().unwrap().entry(outcome).or_default() += 1;
                }
            })
        })
        .collect();
    let mut peak_kv = 0;
    while !employees.iter().all(|e| e.is_finished()) {
        peak_kv = peak_kv.max(admission.snapshot().kv_used);
        std::thread::sleep(Duration::from_micros(200));
    }
    for e in employees {
        e.join().expect("employee thread");
    }
    let elapsed = started.elapsed();

    let snapshot = admission.snapshot();
    println!("256 requests from 64 employees in {elapsed:.2?}:");
    for (outcome, count) in outcomes.lock().unwrap().iter() {
        println!("  {outcome:<24} {count:>4}");
    }
    println!(
        "  peak KV use             {peak_kv:>6} of {} tokens ({:.0}%)",
        snapshot.kv_capacity,
        100.0 * peak_kv as f64 / snapshot.kv_capacity as f64
    );
    println!("  mean permit hold time    {:?}", snapshot.mean_hold);
    println!(
        "\nafter the burst: in_flight={} queued={} kv_used={} (everything returned)",
        snapshot.in_flight, snapshot.queued, snapshot.kv_used
    );
    assert_eq!((snapshot.in_flight, snapshot.queued, snapshot.kv_used), (0, 0, 0));
    Ok(())
}
