//! Redis slow (`DEBUG SLEEP` past the call timeout) or gone (killed, restarted empty): the configured
//! fail policy applies, nothing panics, nothing leaks, the admission recovers by itself, and the
//! counters agree with what the callers saw.

mod support;

use kvgate::{Rejection, Request};
use kvgate_redis::{FailPolicy, SharedLimits};
use std::time::Duration;

fn limits(policy: FailPolicy) -> SharedLimits {
    support::limits("outage")
        .max_in_flight(4)
        .kv_capacity(100_000)
        .request_rate(1000.0, 1000)
        .call_timeout(Duration::from_millis(50))
        .retry_interval(Duration::from_millis(100))
        .fail_policy(policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_answers_503_while_redis_sleeps_then_recovers() {
    let Some(redis) = support::redis() else { return };
    let closed = FailPolicy::Closed { retry_after: Duration::from_secs(2) };
    let admission = support::shared(&redis, limits(closed)).await;
    let held = admission.try_admit(&Request::new(10, 10)).await.unwrap();
    let mut conn = redis::Client::open(redis.url()).unwrap().get_connection().unwrap();
    let sleeper = std::thread::spawn(move || {
        let _: () = redis::cmd("DEBUG").arg("SLEEP").arg("1.5").query(&mut conn).unwrap();
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = 0;
    for _ in 0..20 {
        match admission.try_admit(&Request::new(10, 10)).await {
            Err(rejection) => {
                assert_eq!(rejection, Rejection::NoCapacity { retry_after: Duration::from_secs(2) });
                assert_eq!(rejection.http_status(), 503);
                refused += 1;
            }
            Ok(_) => panic!("fail-closed admitted while Redis was asleep"),
        }
    }
    drop(held); // its release waits in the background until Redis answers
    assert!(!admission.redis_up());
    tokio::task::spawn_blocking(move || sleeper.join().unwrap()).await.unwrap();
    let recovered = support::eventually(Duration::from_secs(5), async || {
        match admission.try_admit(&Request::new(10, 10)).await {
            Ok(_) => true,
            Err(rejection) => {
                // Still refused by the policy until the retry interval passed and Redis answered.
                assert_eq!(rejection, Rejection::NoCapacity { retry_after: Duration::from_secs(2) });
                refused += 1;
                false
            }
        }
    })
    .await;
    assert!(recovered, "admits again once Redis answers");
    admission.flush().await;
    let usage = admission.usage().await.unwrap();
    assert_eq!((usage.slots, usage.leases), (0, 0), "nothing leaked: {usage:?}");
    let stats = admission.stats();
    assert_eq!(stats.fail_closed_rejections, refused);
    assert!(stats.redis_timeouts >= 1);
    assert_eq!(stats.fallback_admissions, 0);
    assert!(admission.redis_up());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_admits_a_share_then_registers_it_when_redis_is_back() {
    let Some(mut redis) = support::redis() else { return };
    let window = Duration::from_millis(300);
    let admission = support::shared(&redis, limits(FailPolicy::Open { replicas: 2 }).recovery_window(window)).await;
    drop(admission.try_admit(&Request::new(10, 10)).await.unwrap());
    admission.flush().await;
    redis.kill();
    // 4 shared slots / 2 replicas: this replica admits 2 on its own.
    let a = admission.try_admit(&Request::new(10, 10)).await.unwrap();
    let b = admission.try_admit(&Request::new(10, 10)).await.unwrap();
    assert!(a.is_fallback() && b.is_fallback() && !a.is_leased());
    assert!(matches!(admission.try_admit(&Request::new(10, 10)).await, Err(Rejection::NoCapacity { .. })));
    assert_eq!(admission.held_fallback(), (2, 40));
    redis.start_again().unwrap(); // empty: no persistence
    let registered = support::eventually(Duration::from_secs(5), async || {
        admission.renew_now().await;
        a.is_leased() && b.is_leased()
    })
    .await;
    assert!(registered, "the fail-open permits are leased once Redis is back");
    let usage = admission.usage().await.unwrap();
    assert_eq!((usage.slots, usage.kv), (2, 40));
    assert!(usage.consistent);
    let stats = admission.stats();
    assert_eq!(stats.fallback_admissions, 2);
    assert_eq!(stats.leases_registered, 2);
    assert_eq!(stats.leases_lost, 0);
    drop((a, b));
    admission.flush().await;
    assert_eq!(admission.usage().await.unwrap().slots, 0);
    assert_eq!(admission.held_fallback(), (0, 0));
    assert_eq!(admission.local().snapshot().in_flight, 0);
    // Redis lost its state: new leases waited for the recovery window while this replica registered
    // what it held; after it, admission is back to normal.
    assert_eq!(admission.stats().state_losses, 1);
    let back =
        support::eventually(Duration::from_secs(5), async || match admission.try_admit(&Request::new(10, 10)).await {
            Ok(permit) => permit.is_leased(),
            Err(Rejection::NoCapacity { retry_after }) => {
                assert!(retry_after <= window);
                false
            }
            Err(other) => panic!("{other:?}"),
        })
        .await;
    assert!(back);
}
