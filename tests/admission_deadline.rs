//! Deadline-aware shedding: a request with a start deadline is refused at once when it is predicted to
//! miss it, never waits past it, and leaves early once it can no longer make it.
#![cfg(not(loom))]

use kvgate::clock::ManualClock;
use kvgate::{Admission, Admit, Rejection, Request, WaitPolicy};
use std::task::Poll;
use std::time::Duration;
use support::admission::poll_once as poll;

/// The rejection a poll resolved to (`None` while pending).
fn refused(fut: &mut Admit) -> Option<Rejection> {
    match poll(fut) {
        Poll::Ready(Err(r)) => Some(r),
        Poll::Ready(Ok(p)) => panic!("granted: {p:?}"),
        Poll::Pending => None,
    }
}

/// FIFO: these tests are about start deadlines alone (controlled delay ends long waits on its own).
fn admission(clock: &ManualClock, slots: usize) -> Admission<ManualClock> {
    Admission::builder()
        .wait_policy(WaitPolicy::Fifo)
        .max_in_flight(slots)
        .expected_hold_time(Duration::from_secs(10))
        .deadline_timer(false)
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn a_request_predicted_to_miss_its_deadline_is_refused_at_once() {
    let clock = ManualClock::new();
    let a = admission(&clock, 1);
    let _busy = a.try_admit(&Request::new(10, 10)).unwrap();
    // One slot, held about 10 s: a 2-s deadline cannot be met; the hint says how much sooner it must drain.
    let mut late = a.admit(&Request::new(10, 10).ttft_deadline(Duration::from_secs(2)));
    assert_eq!(refused(&mut late), Some(Rejection::NoCapacity { retry_after: Duration::from_secs(8) }));
    assert_eq!(a.snapshot().shed, 1);
    assert_eq!(a.snapshot().queued, 0);
    // A 20-s deadline can be met: it waits.
    let mut patient = a.admit(&Request::new(10, 10).ttft_deadline(Duration::from_secs(20)));
    assert!(poll(&mut patient).is_pending());
    assert_eq!(a.snapshot().queued, 1);
}

#[test]
fn a_waiter_never_waits_past_its_deadline() {
    let clock = ManualClock::new();
    let a = admission(&clock, 1);
    let _busy = a.try_admit(&Request::new(10, 10)).unwrap();
    let mut w = a.admit(&Request::new(10, 10).ttft_deadline(Duration::from_secs(20)).max_wait(Duration::from_secs(60)));
    assert!(poll(&mut w).is_pending());
    clock.advance(Duration::from_secs(20));
    assert_eq!(refused(&mut w), Some(Rejection::TimedOut));
}

#[test]
fn a_waiter_that_can_no_longer_make_it_leaves_early() {
    let clock = ManualClock::new();
    let a = admission(&clock, 1);
    let _busy = a.try_admit(&Request::new(10, 10)).unwrap();
    let mut w = a.admit(&Request::new(10, 10).ttft_deadline(Duration::from_secs(20)));
    assert!(poll(&mut w).is_pending());
    // 5 s later it still has 15 s and the slot frees in about 10: it stays.
    clock.advance(Duration::from_secs(5));
    assert_eq!(a.expire_waiters(), 0);
    assert!(poll(&mut w).is_pending());
    // 15 s later it has 5 s left and the slot is still predicted 10 s away: it leaves now, not in 5 s.
    clock.advance(Duration::from_secs(10));
    assert_eq!(a.expire_waiters(), 1);
    assert_eq!(refused(&mut w), Some(Rejection::TimedOut));
    assert_eq!(a.snapshot().shed, 1);
}

#[test]
fn without_a_deadline_nothing_is_shed() {
    let clock = ManualClock::new();
    let a = admission(&clock, 1);
    let _busy = a.try_admit(&Request::new(10, 10)).unwrap();
    let mut w = a.admit(&Request::new(10, 10));
    assert!(poll(&mut w).is_pending());
    clock.advance(Duration::from_secs(3600));
    assert_eq!(a.expire_waiters(), 0);
    assert!(poll(&mut w).is_pending());
    assert_eq!(a.snapshot().shed, 0);
}

#[test]
fn with_the_real_clock_a_waiter_leaves_once_its_start_is_predicted_late_not_at_its_deadline() {
    // One slot held, a 1-s hold-time prior: a request with a 4-s start deadline is predicted to start in
    // about 1 s and waits; once 3 s have gone by without a release, starting in 1 s more misses the
    // deadline, and the deadline timer ends it then — counted as shed — rather than at 4 s (where it would
    // end as an ordinary timeout, not shed). Nobody calls `expire_waiters` here: the timer thread does.
    let admission = Admission::builder()
        .wait_policy(WaitPolicy::Fifo)
        .max_in_flight(1)
        .expected_hold_time(Duration::from_secs(1))
        .max_queue_wait(Duration::from_secs(60))
        .build()
        .unwrap();
    let held = admission.try_admit(&Request::new(10, 10)).unwrap();
    let waiter = admission.admit_blocking(&Request::new(10, 10).ttft_deadline(Duration::from_secs(4)), None);
    assert_eq!(waiter.unwrap_err(), Rejection::TimedOut);
    assert_eq!(admission.snapshot().shed, 1, "it left early, as predicted late: {:?}", admission.snapshot());
    drop(held);
}
