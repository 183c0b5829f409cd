//! Waiting admission (`admit().await`, `admit_blocking`): the same behavioural suite on tokio's
#![cfg(not(loom))]
//! multi-threaded runtime, on smol, and on `futures::executor`, proving the core needs no runtime.

use futures::FutureExt;
use kvgate::clock::ManualClock;
use kvgate::{Admission, Priority, Rejection, Request, WaitPolicy};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

fn req() -> Request {
    Request::new(10, 10)
}

/// Polls a future once with a no-op waker; true if it is still pending.
fn pending<F: std::future::Future + Unpin>(f: &mut F) -> bool {
    f.now_or_never().is_none()
}

async fn grants_in_arrival_order() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(16).build().unwrap();
    let held = a.try_admit(&req()).unwrap();
    let mut waiters: Vec<_> = (0..5).map(|_| a.admit(&req())).collect();
    for w in &mut waiters {
        assert!(pending(w));
    }
    assert_eq!(a.snapshot().queued, 5);
    drop(held);
    for i in 0..5 {
        // Only waiter i holds the grant; the later ones are still pending.
        for later in waiters.iter_mut().skip(1) {
            assert!(pending(later), "waiter after {i} overtook");
        }
        let permit = (&mut waiters[0]).await.unwrap();
        drop(waiters.remove(0));
        drop(permit);
    }
    assert_eq!(a.snapshot().queued, 0);
    assert_eq!(a.snapshot().in_flight, 0);
}

async fn higher_priority_is_served_first() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(4).build().unwrap();
    let held = a.try_admit(&req()).unwrap();
    let mut batch = a.admit(&req().priority(Priority::Batch));
    let mut normal = a.admit(&req());
    let mut chat = a.admit(&req().priority(Priority::Interactive));
    assert!(pending(&mut batch) && pending(&mut normal) && pending(&mut chat));
    assert_eq!(a.queued_in(Priority::Batch), 1);
    drop(held);
    assert!(pending(&mut batch) && pending(&mut normal));
    drop(chat.await.unwrap());
    assert!(pending(&mut batch));
    drop(normal.await.unwrap());
    drop(batch.await.unwrap());
}

async fn full_queue_rejects_at_once_with_a_hint() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(2).build().unwrap();
    let _held = a.try_admit(&req()).unwrap();
    let mut w1 = a.admit(&req());
    let mut w2 = a.admit(&req());
    assert!(pending(&mut w1) && pending(&mut w2));
    let err = a.admit(&req()).await.unwrap_err();
    let Rejection::QueueFull { retry_after } = err else { panic!("{err:?}") };
    assert!(retry_after > Duration::ZERO);
    // Another class has its own queue.
    let mut other = a.admit(&req().priority(Priority::Batch));
    assert!(pending(&mut other));
    assert_eq!(a.snapshot().rejected.queue_full, 1);
}

async fn zero_queue_never_waits() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(0).build().unwrap();
    let _held = a.try_admit(&req()).unwrap();
    assert!(matches!(a.admit(&req()).await, Err(Rejection::NoCapacity { .. })));
}

async fn deadline_expires_without_any_release() {
    let a = Admission::builder().max_in_flight(1).max_queue_wait(Duration::from_secs(3600)).build().unwrap();
    let _held = a.try_admit(&req()).unwrap();
    // The request's own limit is shorter than the admission's and wins.
    let started = std::time::Instant::now();
    let err = a.admit(&req().max_wait(Duration::from_millis(30))).await.unwrap_err();
    assert_eq!(err, Rejection::TimedOut);
    assert!(started.elapsed() >= Duration::from_millis(30));
    let s = a.snapshot();
    assert_eq!((s.queued, s.in_flight, s.rejected.timed_out), (0, 1, 1));
}

async fn cancelled_waiter_gives_its_place_up() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(1).build().unwrap();
    let held = a.try_admit(&req()).unwrap();
    let mut w1 = a.admit(&req());
    assert!(pending(&mut w1));
    drop(w1);
    assert_eq!(a.snapshot().queued, 0);
    // Its place is free again (the queue holds one).
    let mut w2 = a.admit(&req());
    assert!(pending(&mut w2));
    drop(held);
    drop(w2.await.unwrap());
    assert_eq!(a.snapshot().in_flight, 0);
}

async fn grant_to_a_dropped_future_passes_to_the_next() {
    let a = Admission::builder().max_in_flight(1).kv_capacity_tokens(100).queue_capacity(4).build().unwrap();
    let held = a.try_admit(&req()).unwrap();
    let mut w1 = a.admit(&req());
    let mut w2 = a.admit(&req());
    assert!(pending(&mut w1) && pending(&mut w2));
    drop(held); // granted to w1, which is never polled again
    assert_eq!(a.snapshot().in_flight, 1);
    drop(w1); // ... and goes away: the grant moves to w2
    let p2 = w2.await.unwrap();
    assert_eq!(a.snapshot().in_flight, 1);
    drop(p2);
    let s = a.snapshot();
    assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0));
}

async fn close_rejects_waiters_and_newcomers_but_keeps_permits() {
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let held = a.try_admit(&req()).unwrap();
    let mut w = a.admit(&req());
    assert!(pending(&mut w));
    a.close();
    assert_eq!(w.await.unwrap_err(), Rejection::Closed);
    assert_eq!(a.admit(&req()).await.unwrap_err(), Rejection::Closed);
    assert_eq!(a.try_admit(&req()).unwrap_err(), Rejection::Closed);
    assert_eq!(a.snapshot().in_flight, 1, "granted permits stay valid");
    drop(held);
    assert_eq!(a.snapshot().in_flight, 0);
    assert_eq!(a.snapshot().queued, 0);
}

async fn rate_limits_reject_instead_of_waiting() {
    let clock = ManualClock::new();
    let a = Admission::builder().request_rate(1.0, 1).clock(clock).build().unwrap();
    let _p = a.admit(&req()).await.unwrap();
    assert!(matches!(a.admit(&req()).await, Err(Rejection::RateLimited { .. })));
}

async fn head_of_line_large_request_is_not_starved() {
    let a = Admission::builder().kv_capacity_tokens(100).queue_capacity(8).build().unwrap();
    let small = a.try_admit(&Request::new(30, 0)).unwrap();
    let mut large = a.admit(&Request::new(100, 0));
    assert!(pending(&mut large));
    // 70 tokens are free, but a small request would overtake the large head: it waits behind it.
    let mut small2 = a.admit(&Request::new(10, 0));
    assert!(pending(&mut small2));
    drop(small);
    let l = large.await.unwrap();
    assert!(pending(&mut small2));
    drop(l);
    drop(small2.await.unwrap());
}

macro_rules! suite {
    ($($name:ident),* $(,)?) => {
        mod on_tokio {
            $(#[test] fn $name() {
                let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
                rt.block_on(super::$name());
            })*
        }
        mod on_smol {
            $(#[test] fn $name() { smol::block_on(super::$name()); })*
        }
        mod on_futures_executor {
            $(#[test] fn $name() { futures::executor::block_on(super::$name()); })*
        }
    };
}

suite!(
    grants_in_arrival_order,
    higher_priority_is_served_first,
    full_queue_rejects_at_once_with_a_hint,
    zero_queue_never_waits,
    deadline_expires_without_any_release,
    cancelled_waiter_gives_its_place_up,
    grant_to_a_dropped_future_passes_to_the_next,
    close_rejects_waiters_and_newcomers_but_keeps_permits,
    rate_limits_reject_instead_of_waiting,
    head_of_line_large_request_is_not_starved,
);

/// A waker that counts its wake-ups.
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn one_release_wakes_exactly_one_waiter() {
    let a = Admission::builder().max_in_flight(4).queue_capacity(128).build().unwrap();
    let mut held: Vec<_> = (0..4).map(|_| a.try_admit(&req()).unwrap()).collect();
    let counters: Vec<_> = (0..100).map(|_| Arc::new(CountingWaker(AtomicUsize::new(0)))).collect();
    let mut futures: Vec<_> = (0..100).map(|_| Box::pin(a.admit(&req()))).collect();
    for (f, c) in futures.iter_mut().zip(&counters) {
        let waker = Waker::from(Arc::clone(c));
        assert!(f.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
    }
    let total = || counters.iter().map(|c| c.0.load(Ordering::SeqCst)).sum::<usize>();
    assert_eq!(total(), 0);
    for released in 1..=4 {
        held.pop();
        assert_eq!(total(), released, "one release, one wake-up");
    }
    for (i, c) in counters.iter().enumerate() {
        assert_eq!(c.0.load(Ordering::SeqCst), usize::from(i < 4), "waiter {i}");
    }
    let waker = Waker::from(Arc::clone(&counters[0]));
    let first = futures[0].as_mut().poll(&mut Context::from_waker(&waker));
    assert!(matches!(first, Poll::Ready(Ok(_))));
}

#[test]
fn blocking_admission_waits_and_times_out() {
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let held = a.try_admit(&req()).unwrap();
    let waiter = {
        let a = a.clone();
        std::thread::spawn(move || a.admit_blocking(&req(), None).map(drop))
    };
    while a.snapshot().queued == 0 {
        std::thread::yield_now();
    }
    drop(held);
    waiter.join().unwrap().unwrap();
    let _held = a.try_admit(&req()).unwrap();
    assert_eq!(a.admit_blocking(&req(), Some(Duration::from_millis(20))).unwrap_err(), Rejection::TimedOut);
    assert_eq!(a.snapshot().queued, 0);
}

#[test]
fn manual_clock_expiry_is_deterministic() {
    let clock = ManualClock::new();
    let a = Admission::builder()
        .wait_policy(WaitPolicy::Fifo)
        .max_in_flight(1)
        .max_queue_wait(Duration::from_secs(10))
        .clock(clock.clone())
        .build()
        .unwrap();
    let _held = a.try_admit(&req()).unwrap();
    let mut w = a.admit(&req());
    assert!(pending(&mut w));
    clock.advance(Duration::from_secs(9));
    assert_eq!(a.expire_waiters(), 0);
    assert!(pending(&mut w));
    clock.advance(Duration::from_secs(1));
    a.expire_waiters();
    assert!(matches!(w.now_or_never(), Some(Err(Rejection::TimedOut))));
    assert_eq!(a.snapshot().queued, 0);
}

/// 10,000 tasks on tokio contend for 8 slots with random cancellation and timeouts; every task gets
/// exactly one outcome and everything is returned at the end.
#[test]
fn stress_ten_thousand_tasks_eight_slots() {
    let tasks: usize = if cfg!(miri) { 50 } else { 10_000 };
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let a = Admission::builder()
        .max_in_flight(8)
        .kv_capacity_tokens(8 * 64)
        .queue_capacity(4096)
        .max_queue_wait(Duration::from_millis(200))
        .build()
        .unwrap();
    let outcomes = Arc::new([(); 5].map(|_| AtomicUsize::new(0)));
    rt.block_on(async {
        let mut handles = Vec::with_capacity(tasks);
        for i in 0..tasks {
            let a = a.clone();
            let outcomes = Arc::clone(&outcomes);
            handles.push(tokio::spawn(async move {
                let seed = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
                let request = Request::new(1 + (seed % 32) as u32, (seed % 32) as u32).priority(if seed % 5 == 0 {
                    Priority::Batch
                } else {
                    Priority::Normal
                });
                let fut = a.admit(&request);
                let slot = match seed % 4 {
                    // Cancelled by the caller after a short random time.
                    0 => match tokio::time::timeout(Duration::from_micros(seed % 2000), fut).await {
                        Ok(Ok(permit)) => {
                            tokio::task::yield_now().await;
                            drop(permit);
                            0
                        }
                        Ok(Err(Rejection::TimedOut)) => 1,
                        Ok(Err(_)) => 2,
                        Err(_elapsed) => 3,
                    },
                    _ => match fut.await {
                        Ok(permit) => {
                            if seed % 3 == 0 {
                                tokio::task::yield_now().await;
                            }
                            permit.complete((seed % 7) as u32);
                            0
                        }
                        Err(Rejection::TimedOut) => 1,
                        Err(_) => 2,
                    },
                };
                outcomes[slot].fetch_add(1, Ordering::SeqCst);
                let s = a.snapshot();
                assert!(s.in_flight <= 8 && s.kv_used <= 8 * 64, "{s:?}");
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
    });
    let total: usize = outcomes.iter().map(|o| o.load(Ordering::SeqCst)).sum();
    assert_eq!(total, tasks, "every task exactly one outcome");
    assert!(outcomes[0].load(Ordering::SeqCst) > 0);
    // Timer-driven expiries may still be finishing their bookkeeping for an instant.
    let s = a.snapshot();
    assert_eq!((s.in_flight, s.queued, s.kv_used), (0, 0, 0), "{s:?}");
}
