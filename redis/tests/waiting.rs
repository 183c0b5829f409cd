//! Waiting for shared capacity: a release on one replica wakes the waiter on another (pub/sub), wait
//! limits, close, cancellation, and the order within a replica.

mod support;

use kvgate::{Priority, Rejection, Request};
use kvgate_redis::SharedLimits;
use std::time::Duration;

fn one_slot(name: &str) -> SharedLimits {
    // A long poll interval: a waiter that gets the slot quickly was woken by the announcement.
    support::limits(name).max_in_flight(1).poll_interval(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_on_one_replica_wakes_the_waiter_on_another() {
    let Some(redis) = support::redis() else { return };
    let a = support::shared(&redis, one_slot("wake")).await;
    let b = support::shared(&redis, one_slot("wake")).await;
    let held = a.try_admit(&Request::new(10, 10)).await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.admit(&Request::new(10, 10)).await })
    };
    assert!(support::eventually(Duration::from_secs(5), async || b.waiting() == 1).await);
    // Let its backoff grow past the test's patience, so only the announcement can wake it in time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(held);
    let permit = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("woken").unwrap().unwrap();
    assert!(permit.is_leased());
    assert_eq!(b.waiting(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gives_up_after_its_wait_limit_and_on_close() {
    let Some(redis) = support::redis() else { return };
    let a = support::shared(&redis, one_slot("limits").max_queue_wait(Duration::from_secs(60))).await;
    let _held = a.try_admit(&Request::new(10, 10)).await.unwrap();
    let short = a.admit(&Request::new(10, 10).max_wait(Duration::from_millis(100))).await;
    assert_eq!(short.unwrap_err(), Rejection::TimedOut);
    assert_eq!(a.waiting(), 0);
    assert_eq!(a.local().snapshot().in_flight, 1, "the timed-out request gave its local slot back");
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.admit(&Request::new(10, 10)).await })
    };
    assert!(support::eventually(Duration::from_secs(5), async || a.waiting() == 1).await);
    a.close();
    let ended = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert_eq!(ended.unwrap_err(), Rejection::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_the_line_and_the_next_one_is_served() {
    let Some(redis) = support::redis() else { return };
    let a = support::shared(&redis, one_slot("cancel")).await;
    let held = a.try_admit(&Request::new(10, 10)).await.unwrap();
    let first = {
        let a = a.clone();
        tokio::spawn(async move { a.admit(&Request::new(10, 10)).await })
    };
    assert!(support::eventually(Duration::from_secs(5), async || a.waiting() == 1).await);
    let second = {
        let a = a.clone();
        tokio::spawn(async move { a.admit(&Request::new(10, 10).priority(Priority::Batch)).await })
    };
    assert!(support::eventually(Duration::from_secs(5), async || a.waiting() == 2).await);
    // A request that may not wait does not pass this replica's waiters.
    assert!(matches!(a.try_admit(&Request::new(10, 10)).await, Err(Rejection::NoCapacity { .. })));
    first.abort();
    assert!(support::eventually(Duration::from_secs(5), async || a.waiting() == 1).await);
    drop(held);
    let permit = tokio::time::timeout(Duration::from_secs(10), second).await.unwrap().unwrap().unwrap();
    drop(permit);
    a.flush().await;
    assert_eq!(a.usage().await.unwrap().slots, 0);
    assert_eq!(a.local().snapshot().in_flight, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_is_bounded_by_the_local_queue_capacity() {
    let Some(redis) = support::redis() else { return };
    let local = kvgate::Admission::builder().queue_capacity(1).build().unwrap();
    let a = kvgate_redis::SharedAdmission::connect(&redis.url(), local, one_slot("bounded")).await.unwrap();
    let _held = a.try_admit(&Request::new(10, 10)).await.unwrap();
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.admit(&Request::new(10, 10)).await })
    };
    assert!(support::eventually(Duration::from_secs(5), async || a.waiting() == 1).await);
    assert!(matches!(a.admit(&Request::new(10, 10)).await, Err(Rejection::QueueFull { .. })));
    waiter.abort();
}
