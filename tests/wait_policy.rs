//! The waiting room's policies, deterministic (a `ManualClock`, the deadline timer off, futures polled by
//! hand): controlled delay is FIFO while a class's queue drains; once the queue has not been empty for
//! `interval` it serves the newest first within a flow, gives new arrivals at most `target` of waiting,
//! sheds older waiters at expiry with a `Retry-After`, lets a full queue's oldest waiter give its place to a
//! newcomer, and lets a smaller waiter pass a head that does not fit; it is FIFO again once the queue
//! drained. Every test ends with everything returned.
#![cfg(not(loom))]

use kvgate::clock::ManualClock;
use kvgate::{Admission, Admit, Permit, Priority, Rejection, Request, TenantLimits, WaitPolicy};
use std::task::Poll;
use std::time::Duration;
use support::admission::{assert_idle, poll_once as poll};

const TARGET: Duration = Duration::from_millis(500);
const INTERVAL: Duration = Duration::from_secs(1);

fn builder(clock: &ManualClock) -> kvgate::AdmissionBuilder<ManualClock> {
    Admission::builder()
        .wait_policy(WaitPolicy::ControlledDelay { target: TARGET, interval: INTERVAL })
        .deadline_timer(false)
        .clock(clock.clone())
}

/// Polls every waiter once; returns the index of the one granted (at most one may be) and its permit.
fn granted(waiting: &mut [Admit]) -> Option<(usize, Permit)> {
    let mut found = None;
    for (i, fut) in waiting.iter_mut().enumerate() {
        if let Poll::Ready(result) = poll(fut) {
            let permit = result.unwrap_or_else(|r| panic!("waiter {i} refused: {r:?}"));
            assert!(found.is_none(), "two waiters granted one slot");
            found = Some((i, permit));
        }
    }
    found
}

fn queue(admission: &Admission<ManualClock>, n: usize, request: Request) -> Vec<Admit> {
    (0..n)
        .map(|_| {
            let mut fut = admission.admit(&request);
            assert!(poll(&mut fut).is_pending());
            fut
        })
        .collect()
}

#[test]
fn fifo_while_the_queue_drains_then_newest_first_once_it_stands() {
    let clock = ManualClock::new();
    let admission = builder(&clock).max_in_flight(1).queue_capacity(16).build().unwrap();
    let mut held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting = queue(&admission, 3, Request::new(1, 0));
    // Not standing yet (non-empty for less than the interval): the oldest first.
    clock.advance(Duration::from_millis(100));
    drop(held);
    let (first, permit) = granted(&mut waiting).unwrap();
    assert_eq!(first, 0, "FIFO while the queue has not stood for the interval");
    held = permit;
    drop(waiting.remove(first));
    // The queue has held a waiter for the interval: it stands; a newcomer is served before the older ones.
    clock.advance(INTERVAL);
    waiting.extend(queue(&admission, 1, Request::new(1, 0)));
    drop(held);
    let (newest, permit) = granted(&mut waiting).unwrap();
    assert_eq!(newest, waiting.len() - 1, "the newest first while the queue stands");
    drop(waiting.remove(newest));
    drop(permit);
    // The two left were granted in turn (capacity freed by each permit's drop).
    while let Some((i, permit)) = granted(&mut waiting) {
        drop(waiting.remove(i));
        drop(permit);
    }
    assert!(waiting.is_empty());
    assert_idle(&admission);
}

#[test]
fn a_standing_queue_sheds_waiters_older_than_the_target_with_a_hint_and_counts_them() {
    let clock = ManualClock::new();
    let admission = builder(&clock).max_in_flight(1).queue_capacity(16).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut old = queue(&admission, 2, Request::new(1, 0));
    clock.advance(INTERVAL);
    // Standing: a new arrival waits at most the target.
    let mut young = queue(&admission, 1, Request::new(1, 0));
    assert_eq!(admission.expire_waiters(), 2, "the two waiters older than the target leave");
    for fut in &mut old {
        match poll(fut) {
            Poll::Ready(Err(Rejection::NoCapacity { retry_after })) => assert!(retry_after > Duration::ZERO),
            other => panic!("expected a shed with a hint: {other:?}"),
        }
    }
    let s = admission.snapshot();
    assert_eq!((s.shed, s.rejected.no_capacity, s.queued), (2, 2, 1), "{s:?}");
    // The young one reaches its short wait (the target), not the full one: shed too, counted once.
    clock.advance(TARGET);
    assert_eq!(admission.expire_waiters(), 1);
    assert!(matches!(poll(&mut young[0]), Poll::Ready(Err(Rejection::NoCapacity { .. }))));
    drop(young);
    let s = admission.snapshot();
    assert_eq!((s.shed, s.rejected.no_capacity, s.rejected.total()), (3, 3, 3), "{s:?}");
    drop(held);
    assert_idle(&admission);
}

#[test]
fn the_queue_drains_and_is_fifo_with_the_full_wait_again() {
    let clock = ManualClock::new();
    let admission =
        builder(&clock).max_in_flight(1).queue_capacity(16).max_queue_wait(Duration::from_secs(30)).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting = queue(&admission, 1, Request::new(1, 0));
    clock.advance(INTERVAL);
    drop(held);
    let (_, permit) = granted(&mut waiting).unwrap(); // the queue is empty: it drained
    // A new queue: FIFO, and its waiters keep their full wait (30 s), not the target.
    let mut again = queue(&admission, 2, Request::new(1, 0));
    clock.advance(Duration::from_millis(900));
    assert_eq!(admission.expire_waiters(), 0, "0.9 s old, not standing yet: nobody is shed");
    drop(permit);
    let (first, permit) = granted(&mut again).unwrap();
    assert_eq!(first, 0, "FIFO again once the queue drained");
    drop(again.remove(first));
    // The other one has now waited past the interval in a queue that stood: shed at the next expiry.
    clock.advance(Duration::from_millis(200));
    assert_eq!(admission.expire_waiters(), 1);
    assert!(matches!(poll(&mut again[0]), Poll::Ready(Err(Rejection::NoCapacity { .. }))));
    drop((again, permit));
    assert_idle(&admission);
}

#[test]
fn a_full_standing_queue_gives_the_oldest_place_to_a_newcomer_whatever_its_tenant() {
    let clock = ManualClock::new();
    let admission =
        builder(&clock).max_in_flight(1).queue_capacity(3).tenant_defaults(TenantLimits::new()).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    // Three tenants, one waiter each; tenant 9 queued first, tenant 0 last.
    let mut waiting: Vec<Admit> = [9u64, 5, 0]
        .into_iter()
        .map(|t| {
            let mut fut = admission.admit(&Request::new(1, 0).tenant(t));
            assert!(poll(&mut fut).is_pending());
            clock.advance(Duration::from_millis(1));
            fut
        })
        .collect();
    clock.advance(INTERVAL);
    let mut newcomer = admission.admit(&Request::new(1, 0).tenant(7u64));
    assert!(poll(&mut newcomer).is_pending(), "a full standing queue takes the newcomer");
    // The oldest waiter (tenant 9's), not the smallest tenant id, gave its place.
    assert!(matches!(poll(&mut waiting[0]), Poll::Ready(Err(Rejection::NoCapacity { .. }))));
    assert!(poll(&mut waiting[1]).is_pending() && poll(&mut waiting[2]).is_pending());
    assert_eq!(admission.snapshot().queued, 3);
    drop((waiting, newcomer, held));
    assert_idle(&admission);
}

#[test]
fn a_standing_queue_lets_a_smaller_waiter_pass_a_head_that_does_not_fit() {
    let clock = ManualClock::new();
    let admission = builder(&clock).kv_capacity_tokens(100).queue_capacity(16).build().unwrap();
    let big_holder = admission.try_admit(&Request::new(60, 0)).unwrap();
    let small_holder = admission.try_admit(&Request::new(30, 0)).unwrap();
    let mut small = queue(&admission, 1, Request::new(20, 0));
    clock.advance(INTERVAL);
    let mut big = queue(&admission, 1, Request::new(80, 0)); // the newest: served first if it fits
    drop(small_holder); // 70 free: the newest (80) does not fit, the smaller (20) does
    assert!(matches!(poll(&mut small[0]), Poll::Ready(Ok(_))), "the smaller waiter passes");
    assert!(poll(&mut big[0]).is_pending());
    drop((small, big, big_holder));
    assert_idle(&admission);
}

#[test]
fn try_admit_does_not_overtake_a_standing_queue_and_priorities_keep_their_order() {
    let clock = ManualClock::new();
    let admission = builder(&clock).max_in_flight(1).queue_capacity(16).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut batch = queue(&admission, 1, Request::new(1, 0).priority(Priority::Batch));
    let mut normal = queue(&admission, 2, Request::new(1, 0));
    clock.advance(INTERVAL);
    drop(held);
    // The normal class (higher) is served first, its newest first; try_admit does not pass the waiters.
    let (i, permit) = granted(&mut normal).unwrap();
    assert_eq!(i, 1);
    assert!(matches!(admission.try_admit(&Request::new(1, 0)), Err(Rejection::NoCapacity { .. })));
    assert!(poll(&mut batch[0]).is_pending());
    drop(permit);
    drop((batch, normal));
    assert_idle(&admission);
}

#[test]
fn close_ends_a_standing_queue_and_nothing_is_granted_after() {
    let clock = ManualClock::new();
    let admission = builder(&clock).max_in_flight(1).queue_capacity(16).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting = queue(&admission, 3, Request::new(1, 0));
    clock.advance(INTERVAL);
    admission.close();
    drop(held);
    for fut in &mut waiting {
        assert!(matches!(poll(fut), Poll::Ready(Err(Rejection::Closed))));
    }
    assert_eq!(admission.snapshot().rejected.closed, 3);
    assert_idle(&admission);
}

#[test]
fn fifo_mode_never_reorders_or_sheds() {
    let clock = ManualClock::new();
    let admission = Admission::builder()
        .wait_policy(WaitPolicy::Fifo)
        .deadline_timer(false)
        .clock(clock.clone())
        .max_in_flight(1)
        .queue_capacity(16)
        .build()
        .unwrap();
    let mut held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting = queue(&admission, 4, Request::new(1, 0));
    clock.advance(Duration::from_secs(3600));
    assert_eq!(admission.expire_waiters(), 0);
    for expected in 0..4 {
        drop(held);
        let (i, permit) = granted(&mut waiting).unwrap();
        assert_eq!(i, 0, "grant {expected}: FIFO");
        drop(waiting.remove(0));
        held = permit;
    }
    drop(held);
    assert_eq!(admission.snapshot().shed, 0);
    assert_idle(&admission);
}

#[test]
fn bad_policies_are_configuration_errors() {
    for policy in [
        WaitPolicy::ControlledDelay { target: Duration::ZERO, interval: INTERVAL },
        WaitPolicy::ControlledDelay { target: TARGET, interval: Duration::ZERO },
        WaitPolicy::ControlledDelay { target: Duration::from_secs(7200), interval: INTERVAL },
    ] {
        let err = Admission::builder().wait_policy(policy).build().unwrap_err().to_string();
        assert!(err.contains("wait policy"), "{err}");
    }
    assert_eq!(WaitPolicy::default(), WaitPolicy::controlled_delay());
}
