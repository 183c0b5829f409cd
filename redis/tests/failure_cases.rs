//! The adversarial review's failure cases, one test each: a partitioned replica that comes back,
//! Redis losing its state, a renewal racing a release, a double release, a take cut short, and the
//! replicas' clocks. Lease deadlines run on a `ManualClock` sent with each call where time matters.

mod support;

use kvgate::clock::{Clock, ManualClock};
use kvgate::{Admission, Rejection, Request};
use kvgate_redis::{FailPolicy, SharedAdmission, SharedLimits};
use std::time::Duration;

const LEASE: Duration = Duration::from_secs(60);

fn capacity(name: &str, slots: u64) -> SharedLimits {
    support::limits(name).max_in_flight(slots).kv_capacity(1_000_000).lease_time(LEASE)
}

#[tokio::test]
async fn partitioned_replica_cannot_push_the_total_over_the_budget() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let a = support::manual(&redis, capacity("partition", 4), &clock).await;
    let b = support::manual(&redis, capacity("partition", 4), &clock).await;
    let a1 = a.try_admit(&Request::new(10, 10)).await.unwrap();
    let a2 = a.try_admit(&Request::new(10, 10)).await.unwrap();
    // `a` is cut off for longer than the lease: it renews nothing.
    clock.advance(LEASE + Duration::from_secs(1));
    // Meanwhile `b` finds the capacity free (a's leases expired) and fills it.
    let mut b_permits = Vec::new();
    for _ in 0..4 {
        b_permits.push(b.try_admit(&Request::new(10, 10)).await.unwrap());
    }
    // `a` comes back: its leases are gone and do not fit: lost, not re-added.
    a.renew_now().await;
    let usage = a.usage().await.unwrap();
    assert_eq!(usage.slots, 4, "the total stays at the budget: {usage:?}");
    assert!(usage.consistent);
    assert!(!a1.is_leased() && !a2.is_leased());
    tokio::time::timeout(Duration::from_secs(1), a1.lease_lost()).await.expect("the permit learns it lost its lease");
    assert_eq!(a.stats().leases_lost, 2);
    assert!(matches!(a.try_admit(&Request::new(10, 10)).await, Err(Rejection::NoCapacity { .. })));
    // Room again: the next renewal registers what `a` still runs, through the budget check.
    b_permits.truncate(1);
    b.flush().await;
    a.renew_now().await;
    assert!(a1.is_leased() && a2.is_leased());
    assert_eq!(a.stats().leases_registered, 2);
    assert_eq!(a.usage().await.unwrap().slots, 3);
    drop((a1, a2, b_permits));
    a.flush().await;
    b.flush().await;
    assert_eq!(a.usage().await.unwrap().slots, 0);
}

#[tokio::test]
async fn redis_restart_losing_state_recovers_the_leases() {
    let Some(mut redis) = support::redis() else { return };
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let window = Duration::from_secs(5);
    let limits = capacity("restart", 4).recovery_window(window);
    let a = support::manual(&redis, limits.clone(), &clock).await;
    let b = support::manual(&redis, limits, &clock).await;
    let held: Vec<_> = futures_join(&a, 3).await;
    drop(b.try_admit(&Request::new(10, 10)).await.unwrap()); // b knows the generation too
    b.flush().await;
    redis.start_again().unwrap(); // every key gone
    // b is first after the restart (its first call may meet the dead connection and reconnect): it
    // notices the new generation, and new leases wait for the recovery window.
    b.renew_now().await;
    b.renew_now().await;
    assert_eq!(b.stats().state_losses, 1);
    let closed_before = b.stats().fail_closed_rejections;
    match b.try_admit(&Request::new(10, 10)).await {
        Err(Rejection::NoCapacity { retry_after }) => assert!(retry_after <= window && !retry_after.is_zero()),
        other => panic!("a new lease during the recovery window: {other:?}"),
    }
    assert_eq!(b.stats().fail_closed_rejections, closed_before, "refused by the window, not by the policy");
    // a registers what it holds (the renewal would do it on its own within one interval).
    a.renew_now().await;
    assert!(held.iter().all(|p| p.is_leased()));
    assert_eq!(a.usage().await.unwrap().slots, 3);
    clock.advance(window);
    let one = b.try_admit(&Request::new(10, 10)).await.unwrap();
    assert!(matches!(b.try_admit(&Request::new(10, 10)).await, Err(Rejection::NoCapacity { .. })), "budget of 4 holds");
    assert_eq!(a.stats().state_losses + b.stats().state_losses, 2);
    assert_eq!(a.stats().leases_registered, 3);
    drop((held, one));
    a.flush().await;
    b.flush().await;
    let usage = a.usage().await.unwrap();
    assert_eq!((usage.slots, usage.leases), (0, 0));
}

async fn futures_join(admission: &SharedAdmission<ManualClock>, n: usize) -> Vec<kvgate_redis::SharedPermit> {
    let mut permits = Vec::new();
    for _ in 0..n {
        permits.push(admission.try_admit(&Request::new(10, 10)).await.unwrap());
    }
    permits
}

#[tokio::test]
async fn renewal_never_brings_back_a_released_lease() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let a = support::manual(&redis, capacity("race", 1), &clock).await;
    for expire_first in [false, true] {
        let permit = a.try_admit(&Request::new(10, 10)).await.unwrap();
        if expire_first {
            // The lease expired: a renewal would have to register it again.
            clock.advance(LEASE + Duration::from_secs(1));
        }
        // The release and the renewal race: whatever order the caller sees, the background task runs
        // the release first, and the renewal no longer lists the lease.
        let renew = a.renew_now();
        drop(permit);
        renew.await;
        a.renew_now().await;
        a.flush().await;
        let usage = a.usage().await.unwrap();
        assert_eq!((usage.slots, usage.leases), (0, 0), "expired first: {expire_first}, {usage:?}");
    }
    assert_eq!(a.stats().leases_registered, 0);
}

#[tokio::test]
async fn double_release_frees_once() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let a = support::manual(&redis, capacity("double", 1), &clock).await;
    let b = support::manual(&redis, capacity("double", 1), &clock).await;
    let stale = a.try_admit(&Request::new(10, 10)).await.unwrap();
    clock.advance(LEASE + Duration::from_secs(1));
    // The expiry frees the slot once (the next script removes the lease) ...
    let fresh = b.try_admit(&Request::new(10, 10)).await.unwrap();
    // ... and the stale permit's own release must not free b's slot a second time.
    drop(stale);
    a.flush().await;
    let usage = b.usage().await.unwrap();
    assert_eq!((usage.slots, usage.leases), (1, 1), "{usage:?}");
    assert!(matches!(a.try_admit(&Request::new(10, 10)).await, Err(Rejection::NoCapacity { .. })));
    drop(fresh);
    b.flush().await;
    assert_eq!(b.usage().await.unwrap().slots, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_take_leaks_nothing() {
    let Some(redis) = support::redis() else { return };
    let limits = capacity("cancel", 2)
        .call_timeout(Duration::from_millis(50))
        .retry_interval(Duration::from_millis(50))
        .fail_policy(FailPolicy::Closed { retry_after: Duration::from_secs(1) });
    let a = support::shared(&redis, limits).await;
    drop(a.try_admit(&Request::new(10, 10)).await.unwrap());
    let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let sleeper = std::thread::spawn(move || {
        let _: () = redis::cmd("DEBUG").arg("SLEEP").arg("0.5").query(&mut conn).unwrap();
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // One take times out (its script runs when Redis wakes up); another is dropped mid-call.
    assert!(matches!(a.try_admit(&Request::new(10, 10)).await, Err(Rejection::NoCapacity { .. })));
    let cut = tokio::time::timeout(Duration::from_millis(5), a.try_admit(&Request::new(10, 10))).await;
    assert!(cut.is_err() || cut.unwrap().is_err());
    tokio::task::spawn_blocking(move || sleeper.join().unwrap()).await.unwrap();
    let clean = support::eventually(Duration::from_secs(5), async || {
        a.flush().await;
        a.usage().await.is_ok_and(|u| u.slots == 0 && u.leases == 0)
    })
    .await;
    assert!(clean, "the takes whose answers were lost were given back: {:?}", a.usage().await);
    let both = (a.try_admit(&Request::new(10, 10)).await, a.try_admit(&Request::new(10, 10)).await);
    assert!(both.0.is_ok() && both.1.is_ok(), "the whole budget is usable again");
}

#[tokio::test]
async fn replica_clocks_do_not_matter() {
    let Some(redis) = support::redis() else { return };
    // Two replicas whose own clocks are years apart; the shared rate reads Redis' clock only.
    let limits = support::limits("clocks").request_rate(10.0, 4);
    let mut replicas = Vec::new();
    for start in [0, 300 * 365 * 24 * 3_600 * 1_000_000_000u64] {
        let local = Admission::builder().clock(ManualClock::starting_at(start)).build().unwrap();
        replicas.push(SharedAdmission::connect(&redis.url(), local, limits.clone()).await.unwrap());
    }
    let mut admitted = 0;
    for i in 0..8 {
        if replicas[i % 2].try_admit(&Request::new(1, 1)).await.is_ok() {
            admitted += 1;
        }
    }
    // The burst of 4 plus at most what accrued in the few milliseconds this took.
    assert!((4..=5).contains(&admitted), "admitted {admitted}");
    let hint = replicas[1].try_admit(&Request::new(1, 1)).await.unwrap_err().retry_after().unwrap();
    assert!(hint > Duration::ZERO && hint <= Duration::from_millis(100), "{hint:?}");
    assert_eq!(replicas[0].local().clock().now_nanos(), 0, "the local clocks were never needed");
}

#[tokio::test]
async fn on_a_manual_clock_the_recovery_window_ends_with_the_manual_clock_only() {
    let Some(redis) = support::redis() else { return };
    let clock = ManualClock::starting_at(1_000_000_000_000);
    let limits = support::limits("window")
        .max_in_flight(4)
        .kv_capacity(1_000_000)
        .lease_time(Duration::from_secs(60))
        .recovery_window(Duration::from_millis(200));
    let replica = support::manual(&redis, limits, &clock).await;
    drop(replica.try_admit(&Request::new(10, 10)).await.unwrap()); // the replica knows the generation
    replica.flush().await;
    let _: () = support::cmd(&redis, &["FLUSHALL"]).await; // Redis loses its state
    replica.renew_now().await;
    assert_eq!(replica.stats().state_losses, 1);
    assert!(matches!(replica.try_admit(&Request::new(10, 10)).await, Err(Rejection::NoCapacity { .. })));
    // Real time passing (a slow step of a test) ends nothing: the manual clock has not moved.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got = replica.try_admit(&Request::new(10, 10)).await;
    assert!(matches!(got, Err(Rejection::NoCapacity { .. })), "still inside the window: {got:?}");
    clock.advance(Duration::from_millis(200));
    assert!(replica.try_admit(&Request::new(10, 10)).await.is_ok(), "the window ends on the manual clock");
}
