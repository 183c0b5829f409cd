//! Fault injection: panics while holding a permit, executors that vanish under a waiting future, clocks
//! that jump backwards or stall, `close()` racing admits, and the admission dropped while permits and
//! waiters still live. After each fault: nothing panics inside kvgate, capacity is conserved (the
//! snapshot returns to zero), nothing hangs (watchdogs), and no limit grants more than it should.
//!
//! Only `admission_dropped_while_permits_and_waiters_live` starts `kvgate-timer` threads (it counts them);
//! every other test uses no deadlines or `deadline_timer(false)`.
#![cfg(not(loom))]

use futures::FutureExt;
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use kvgate::clock::ManualClock;
use kvgate::{Admission, Rejection, Request};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use support::admission::assert_idle;
use support::{quiet_panics, within};

const MS: u64 = 1_000_000;

// ---------------------------------------------------------------------------------------------------------
// Panics while holding a permit

#[test]
fn panic_on_a_thread_returns_the_permit() {
    quiet_panics();
    let a = Admission::builder().max_in_flight(2).kv_capacity_tokens(100).queue_capacity(4).build().unwrap();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let a = a.clone();
            std::thread::spawn(move || {
                let _permit = a.admit_blocking(&Request::new(20, 20), None).unwrap();
                panic!("injected: generation crashed");
            })
        })
        .collect();
    for h in handles {
        assert!(h.join().is_err());
    }
    assert_idle(&a);
    assert_eq!(a.snapshot().admitted, 4, "each panic handed the capacity to the next waiter");
}

#[test]
fn panic_inside_a_tokio_task_returns_the_permit() {
    quiet_panics();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let a = Admission::builder().max_in_flight(1).kv_capacity_tokens(10).queue_capacity(8).build().unwrap();
    rt.block_on(async {
        let tasks: Vec<_> = (0..6)
            .map(|i| {
                let a = a.clone();
                tokio::spawn(async move {
                    let permit = a.admit(&Request::new(5, 5)).await.unwrap();
                    tokio::task::yield_now().await;
                    if i % 2 == 0 {
                        panic!("injected: task {i} crashed");
                    }
                    permit.complete(1);
                })
            })
            .collect();
        let mut panicked = 0;
        for t in tasks {
            if let Err(e) = t.await {
                assert!(e.is_panic());
                panicked += 1;
            }
        }
        assert_eq!(panicked, 3);
    });
    assert_idle(&a);
    assert_eq!(a.snapshot().admitted, 6);
}

#[test]
fn panic_inside_catch_unwind_returns_the_permit() {
    quiet_panics();
    let a = Admission::builder().max_in_flight(1).kv_capacity_tokens(10).token_rate(1000.0, 100).build().unwrap();
    let fut = {
        let a = a.clone();
        async move {
            let _permit = a.admit(&Request::new(5, 5)).await.unwrap();
            futures::future::ready(()).await;
            panic!("injected: inside catch_unwind");
        }
    };
    let caught: Result<(), _> = futures::executor::block_on(AssertUnwindSafe(fut).catch_unwind());
    assert!(caught.is_err());
    assert_idle(&a);
    // The waiter queued behind a panicking holder still gets in.
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let mut next = a.admit(&Request::new(1, 1));
    assert!((&mut next).now_or_never().is_none());
    let r = std::panic::catch_unwind(AssertUnwindSafe(move || {
        let _held = held;
        panic!("injected: while another waits");
    }));
    assert!(r.is_err());
    assert!(futures::executor::block_on(next).is_ok());
    assert_idle(&a);
}

// ---------------------------------------------------------------------------------------------------------
// Executors that disappear under a waiting future

#[test]
fn tokio_runtime_shut_down_with_pending_admits() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(16).build().unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let started = Arc::new(AtomicUsize::new(0));
    for _ in 0..8 {
        let a = a.clone();
        let started = Arc::clone(&started);
        rt.spawn(async move {
            started.fetch_add(1, Ordering::SeqCst);
            let _permit = a.admit(&Request::new(1, 1)).await;
            std::future::pending::<()>().await;
        });
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.snapshot().queued < 8 {
        assert!(Instant::now() < deadline, "tasks did not queue: {:?}", a.snapshot());
        std::thread::yield_now();
    }
    // The runtime goes away with 8 queued waiters: every task (and its Admit future) is dropped.
    rt.shutdown_timeout(Duration::from_secs(5));
    assert_eq!(a.snapshot().queued, 0, "waiters of a dead runtime still queued");
    drop(held);
    assert_idle(&a);
    // Their places are free: a new waiter is served at once.
    assert!(a.try_admit(&Request::new(1, 1)).is_ok());
}

#[test]
fn tokio_runtime_dropped_while_a_grant_is_in_flight() {
    // A waiter is granted (capacity reserved for it) but its runtime dies before it is polled again.
    let a = Admission::builder().max_in_flight(1).queue_capacity(4).build().unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let a2 = a.clone();
    let task = rt.spawn(async move { a2.admit(&Request::new(1, 1)).await.map(drop) });
    // Poll the task once: it queues.
    rt.block_on(tokio::task::yield_now());
    assert_eq!(a.snapshot().queued, 1);
    drop(held); // grants the waiter; the current-thread runtime is not running, so nobody polls it
    assert_eq!(a.snapshot().in_flight, 1, "granted to the waiter");
    drop(task);
    drop(rt);
    assert_idle(&a);
}

#[test]
fn local_pool_dropped_with_queued_and_granted_waiters() {
    let a = Admission::builder().max_in_flight(2).kv_capacity_tokens(100).queue_capacity(8).build().unwrap();
    let p1 = a.try_admit(&Request::new(10, 10)).unwrap();
    let p2 = a.try_admit(&Request::new(10, 10)).unwrap();
    let mut pool = LocalPool::new();
    let done = Arc::new(AtomicUsize::new(0));
    for _ in 0..5 {
        let a = a.clone();
        let done = Arc::clone(&done);
        pool.spawner()
            .spawn_local(async move {
                let _permit = a.admit(&Request::new(10, 10)).await.unwrap();
                done.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            })
            .unwrap();
    }
    pool.run_until_stalled();
    assert_eq!(a.snapshot().queued, 5);
    drop(p1); // granted to the head waiter, which is never polled again
    assert_eq!((a.snapshot().in_flight, a.snapshot().queued), (2, 4));
    drop(pool);
    assert_eq!(done.load(Ordering::SeqCst), 0);
    assert_eq!(a.snapshot().in_flight, 1, "only p2 is left");
    drop(p2);
    assert_idle(&a);
}

// ---------------------------------------------------------------------------------------------------------
// Clocks that jump backwards or stall

fn rate_limited(a: &Admission<ManualClock>) -> Duration {
    match a.try_admit(&Request::new(1, 1)) {
        Err(Rejection::RateLimited { retry_after }) => {
            assert!(retry_after > Duration::ZERO);
            retry_after
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
}

#[test]
fn clock_jumping_backwards_grants_nothing_extra_and_recovers() {
    let clock = ManualClock::starting_at(1_000_000 * MS);
    // 10 requests/s, burst 5.
    let a = Admission::builder().request_rate(10.0, 5).clock(clock.clone()).build().unwrap();
    for _ in 0..5 {
        drop(a.try_admit(&Request::new(1, 1)).unwrap());
    }
    let at_start = rate_limited(&a);
    assert_eq!(at_start, Duration::from_millis(100));
    // Back by 10 s: no panic, no tokens, an honest hint (the wait now includes the jump); the second
    // refused request is told the second token's moment (hints do not herd).
    clock.set_nanos(990_000 * MS);
    let hint = rate_limited(&a);
    assert_eq!(hint, Duration::from_millis(10_200));
    // Forward again, but only to just before the old time: still nothing extra was granted.
    clock.set_nanos(1_000_000 * MS + 99 * MS);
    rate_limited(&a);
    // Time moves past where it was: requests pass again, at the configured rate.
    clock.set_nanos(1_000_000 * MS + 100 * MS);
    drop(a.try_admit(&Request::new(1, 1)).unwrap());
    rate_limited(&a);
    clock.advance(Duration::from_secs(10));
    let passed = (0..20).filter(|_| a.try_admit(&Request::new(1, 1)).is_ok()).count();
    assert_eq!(passed, 5, "a full burst, not more");
    assert_idle(&a);
}

#[test]
fn clock_jumping_back_to_zero_and_to_the_end_of_time() {
    let clock = ManualClock::starting_at(u64::MAX / 2);
    let a = Admission::builder()
        .max_in_flight(2)
        .request_rate(1000.0, 3)
        .token_rate(1e6, 10_000)
        .queue_capacity(4)
        .max_queue_wait(Duration::from_secs(1))
        .deadline_timer(false)
        .clock(clock.clone())
        .build()
        .unwrap();
    let p = a.try_admit(&Request::new(100, 100)).unwrap();
    clock.set_nanos(0);
    // Permits admitted "in the future" drop cleanly (hold time saturates at 0).
    drop(p);
    for _ in 0..10 {
        match a.try_admit(&Request::new(1, 1)) {
            Ok(p) => drop(p),
            Err(r) => assert!(r.retry_after().is_some_and(|d| d > Duration::ZERO), "{r:?}"),
        }
    }
    clock.set_nanos(u64::MAX);
    let p = a.try_admit(&Request::new(1, 1)).unwrap();
    let p2 = a.try_admit(&Request::new(1, 1)).unwrap();
    // At the end of the clock a deadline saturates at u64::MAX, which is already "now": the waiter
    // times out at once instead of queueing (no overflow, no panic, nothing held).
    let mut waiter = a.admit(&Request::new(1, 1));
    assert_eq!((&mut waiter).now_or_never().map(|r| r.map(drop)), Some(Err(Rejection::TimedOut)));
    // Then time runs back to almost zero. The rate buckets were charged at the end of the clock, so they
    // refuse until the clock is back there (a backwards jump costs its own length in waiting: nothing
    // extra is granted), and they say so honestly rather than with a zero or wrapped hint.
    clock.set_nanos(5);
    let waiter = a.admit(&Request::new(1, 1));
    match futures::executor::block_on(waiter).unwrap_err() {
        Rejection::RateLimited { retry_after } => assert!(retry_after > Duration::from_secs(500 * 365 * 86_400)),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.expire_waiters(), 0);
    match a.try_admit(&Request::new(1, 1)).unwrap_err() {
        Rejection::NoCapacity { retry_after } => assert!(retry_after > Duration::ZERO),
        other => panic!("{other:?}"),
    }
    drop(p);
    clock.set_nanos(u64::MAX);
    let got = a.try_admit(&Request::new(1, 1));
    assert!(got.is_ok() || matches!(got, Err(Rejection::RateLimited { .. })), "{got:?}");
    drop((got, p2));
    assert_idle(&a);
}

#[test]
fn deadlines_with_a_clock_that_goes_back_then_forward() {
    let clock = ManualClock::starting_at(1_000 * MS);
    let a = Admission::builder()
        .max_in_flight(1)
        .queue_capacity(4)
        .max_queue_wait(Duration::from_millis(50))
        .deadline_timer(false)
        .clock(clock.clone())
        .build()
        .unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let mut waiter = a.admit(&Request::new(1, 1));
    assert!((&mut waiter).now_or_never().is_none());
    // Backwards: nothing expires, the waiter keeps its place.
    clock.set_nanos(500 * MS);
    assert_eq!(a.expire_waiters(), 0);
    assert!((&mut waiter).now_or_never().is_none());
    assert_eq!(a.snapshot().queued, 1);
    // Forward past the deadline (set on the old time axis): it expires, holding nothing.
    clock.set_nanos(1_050 * MS);
    assert_eq!(a.expire_waiters(), 1);
    assert_eq!(futures::executor::block_on(waiter).unwrap_err(), Rejection::TimedOut);
    drop(held);
    assert_idle(&a);
}

#[test]
fn stalled_clock_keeps_hints_positive_and_capacity_flowing() {
    let clock = ManualClock::starting_at(42);
    let a = Admission::builder()
        .max_in_flight(1)
        .request_rate(1.0, 2)
        .queue_capacity(4)
        .deadline_timer(false)
        .clock(clock.clone())
        .build()
        .unwrap();
    let p = a.try_admit(&Request::new(1, 1)).unwrap();
    match a.try_admit(&Request::new(1, 1)).unwrap_err() {
        Rejection::NoCapacity { retry_after } => assert!(retry_after > Duration::ZERO),
        other => panic!("{other:?}"),
    }
    // Capacity does not depend on time: a queued waiter is served on release while the clock stands.
    let mut waiter = a.admit(&Request::new(1, 1));
    assert!((&mut waiter).now_or_never().is_none());
    drop(p);
    let p = futures::executor::block_on(waiter).unwrap();
    drop(p);
    // The rate stays exhausted while the clock stands; each refused request is told the moment the rate
    // admits it, one token after the last one promised (hints do not herd): 1 s, 2 s, ...
    let hints: Vec<_> = (0..5).map(|_| rate_limited(&a)).collect();
    assert_eq!(hints, [1, 2, 3, 4, 5].map(Duration::from_secs), "{hints:?}");
    clock.advance(Duration::from_secs(1));
    drop(a.try_admit(&Request::new(1, 1)).unwrap());
    assert_idle(&a);
}

// ---------------------------------------------------------------------------------------------------------
// close() racing admits

#[test]
fn close_races_admits_from_several_threads() {
    let rounds = if cfg!(miri) { 2 } else { 20 };
    for round in 0..rounds {
        let a = Admission::builder().max_in_flight(3).kv_capacity_tokens(60).queue_capacity(8).build().unwrap();
        let threads = 4;
        let barrier = Arc::new(Barrier::new(threads + 1));
        let closed_seen = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (a, barrier, closed_seen) = (a.clone(), Arc::clone(&barrier), Arc::clone(&closed_seen));
                std::thread::spawn(move || {
                    barrier.wait();
                    let mut after_close = 0;
                    for i in 0..200 {
                        let request = Request::new(5 + (i % 7), 5);
                        let was_closed = a.is_closed();
                        let result = match (t + i as usize) % 3 {
                            0 => a.try_admit(&request),
                            1 => a.admit_blocking(&request, None),
                            _ => futures::executor::block_on(a.admit(&request)),
                        };
                        match result {
                            Ok(permit) => {
                                assert!(!was_closed, "admitted after close() returned");
                                drop(permit);
                            }
                            Err(Rejection::Closed) => {
                                closed_seen.store(true, Ordering::Relaxed);
                                after_close += 1;
                                if after_close > 5 {
                                    break;
                                }
                            }
                            Err(Rejection::NoCapacity { retry_after }) => assert!(retry_after > Duration::ZERO),
                            Err(other) => panic!("unexpected {other:?}"),
                        }
                    }
                })
            })
            .collect();
        let closer = a.clone();
        within(Duration::from_secs(20), "close race", move || {
            barrier.wait();
            for _ in 0..(round * 50) {
                std::hint::spin_loop();
            }
            closer.close();
            for h in handles {
                h.join().unwrap();
            }
        });
        assert!(a.is_closed());
        assert_eq!(a.try_admit(&Request::new(1, 1)).unwrap_err(), Rejection::Closed);
        assert_idle(&a);
    }
}

// ---------------------------------------------------------------------------------------------------------
// The admission dropped while permits and waiters live

fn timer_threads() -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "kvgate-timer")
        .count()
}

#[test]
fn admission_dropped_while_permits_and_waiters_live() {
    within(Duration::from_secs(15), "drop the admission", || {
        // A real clock and deadlines, so a timer thread runs.
        let a = Admission::builder()
            .max_in_flight(1)
            .queue_capacity(4)
            .max_queue_wait(Duration::from_secs(30))
            .build()
            .unwrap();
        let observer = a.clone();
        let held = a.try_admit(&Request::new(1, 1)).unwrap();
        let mut first = a.admit(&Request::new(1, 1));
        let mut second = a.admit(&Request::new(1, 1));
        assert!((&mut first).now_or_never().is_none());
        assert!((&mut second).now_or_never().is_none());
        if cfg!(target_os = "linux") {
            // The thread names itself once it runs.
            let deadline = Instant::now() + Duration::from_secs(5);
            while timer_threads() == 0 {
                assert!(Instant::now() < deadline, "a deadline is pending: the timer thread should run");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        drop(a);
        // Only a snapshot handle is left; drop it too: permits and futures keep the state alive.
        let queued = observer.snapshot().queued;
        assert_eq!(queued, 2);
        drop(observer);
        // The permit still releases, granting the first waiter, which resolves.
        drop(held);
        let p = futures::executor::block_on(first).expect("first waiter is granted");
        // The second waiter is dropped while queued; then the last permit goes.
        drop(second);
        drop(p);
        // Everything is gone: the timer thread exits.
        if cfg!(target_os = "linux") {
            let deadline = Instant::now() + Duration::from_secs(5);
            while timer_threads() > 0 {
                assert!(Instant::now() < deadline, "kvgate-timer thread still alive after the admission was dropped");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
}

#[test]
fn waiters_of_a_dropped_admission_resolve_on_close_or_grant() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(4).build().unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let mut w1 = a.admit(&Request::new(1, 1));
    let mut w2 = a.admit(&Request::new(1, 1));
    assert!((&mut w1).now_or_never().is_none());
    assert!((&mut w2).now_or_never().is_none());
    a.close();
    drop(a);
    // Closed before the drop: both waiters resolve to Closed; the permit still releases.
    assert_eq!(futures::executor::block_on(w1).unwrap_err(), Rejection::Closed);
    assert_eq!(futures::executor::block_on(w2).unwrap_err(), Rejection::Closed);
    drop(held);
    // A never-polled future of a dropped admission: polling it later gives a clean answer.
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let fut = a.admit(&Request::new(1, 1));
    drop(a);
    let p = within(Duration::from_secs(5), "poll after drop", move || futures::executor::block_on(fut).is_ok());
    assert!(p);
}
