//! Threads hammer one admission with random requests, drops and completions. While running, no
//! observed snapshot exceeds a limit; at the end everything taken was returned.
#![cfg(not(loom))]

use kvgate::retry::SplitMix64;
use kvgate::{Admission, Priority, Rejection, Request};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn conservation_under_threads() {
    let threads = 4;
    let ops: u64 = if cfg!(miri) { 200 } else { 100_000 };
    let kv_capacity = 4_000;
    let max_in_flight = 16;
    let admission = Admission::builder()
        .max_in_flight(max_in_flight)
        .kv_capacity_tokens(kv_capacity)
        .request_rate(1e9, 1_000_000)
        .token_rate(1e9, 1 << 40)
        .queue_capacity(64)
        .build()
        .unwrap();
    let running = Arc::new(AtomicBool::new(true));
    let watcher = {
        let (a, running) = (admission.clone(), Arc::clone(&running));
        std::thread::spawn(move || {
            let mut seen = 0u64;
            while running.load(Ordering::Relaxed) {
                let s = a.snapshot();
                assert!(s.kv_used <= s.kv_capacity, "{s:?}");
                assert!(s.in_flight <= max_in_flight, "{s:?}");
                seen += 1;
            }
            seen
        })
    };
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let a = admission.clone();
            std::thread::spawn(move || {
                let mut rng = SplitMix64::new(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1)); // deterministic, one per thread
                let mut held = Vec::new();
                let mut admitted = 0u64;
                for _ in 0..ops {
                    let r = rng.next_u64();
                    match r % 8 {
                        0..=3 => {
                            let request = Request::new((r >> 8) as u32 % 700, (r >> 20) as u32 % 300)
                                .priority(if r & 1 == 0 { Priority::Normal } else { Priority::Batch });
                            match a.try_admit(&request) {
                                Ok(p) => {
                                    admitted += 1;
                                    held.push(p)
                                }
                                // Rate limits are far above what 4 threads can reach, but a thread preempted
                                // between its clock read and its charge can still be refused: legitimate.
                                Err(
                                    Rejection::NoCapacity { .. }
                                    | Rejection::Invalid { .. }
                                    | Rejection::RateLimited { .. },
                                ) => {}
                                Err(other) => panic!("unexpected {other:?}"),
                            }
                        }
                        4 | 5 if !held.is_empty() => {
                            let i = (r >> 32) as usize % held.len();
                            drop(held.swap_remove(i));
                        }
                        6 if !held.is_empty() => {
                            let i = (r >> 32) as usize % held.len();
                            held.swap_remove(i).complete((r >> 40) as u32 % 400);
                        }
                        _ => {
                            // A waiting admission that gives up at once half of the time.
                            let mut fut = a.admit(&Request::new(1 + (r >> 8) as u32 % 100, 0));
                            match futures::FutureExt::now_or_never(&mut fut) {
                                Some(Ok(p)) => {
                                    admitted += 1;
                                    held.push(p);
                                    continue;
                                }
                                Some(Err(_)) => continue,
                                None => {}
                            }
                            if r & 2 == 0 {
                                drop(fut);
                            } else if let Ok(p) = {
                                // Never block while holding permits: others may be waiting for them.
                                held.clear();
                                futures::executor::block_on(fut)
                            } {
                                admitted += 1;
                                held.push(p);
                            }
                        }
                    }
                    if held.len() > 3 {
                        held.clear();
                    }
                }
                admitted
            })
        })
        .collect();
    let admitted: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
    running.store(false, Ordering::Relaxed);
    let snapshots = watcher.join().unwrap();
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0), "{s:?}");
    assert_eq!(s.admitted, admitted);
    assert!(admitted > 0 && snapshots > 0);
}
