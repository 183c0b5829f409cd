//! Behaviour of `Admission::try_admit`: each limit, all-or-nothing, honest retry hints, bad input,
//! runtime resizing, counters.
#![cfg(not(loom))]

use kvgate::clock::ManualClock;
use kvgate::{Admission, ConfigError, Limit, Priority, Rejection, Request};
use std::time::Duration;

fn manual() -> ManualClock {
    ManualClock::new()
}

#[test]
fn in_flight_limit_and_release_on_drop() {
    let a = Admission::builder().max_in_flight(2).build().unwrap();
    let p1 = a.try_admit(&Request::new(1, 1)).unwrap();
    let p2 = a.try_admit(&Request::new(1, 1)).unwrap();
    let err = a.try_admit(&Request::new(1, 1)).unwrap_err();
    assert!(matches!(err, Rejection::NoCapacity { retry_after } if retry_after > Duration::ZERO));
    assert_eq!(a.snapshot().in_flight, 2);
    drop(p1);
    assert_eq!(a.snapshot().in_flight, 1);
    let p3 = a.try_admit(&Request::new(1, 1)).unwrap();
    drop((p2, p3));
    let s = a.snapshot();
    assert_eq!((s.in_flight, s.admitted, s.rejected.no_capacity), (0, 3, 1));
}

#[test]
fn kv_budget_counts_prompt_plus_max_new() {
    let a = Admission::builder().kv_capacity_tokens(1000).build().unwrap();
    let p = a.try_admit(&Request::new(300, 300)).unwrap();
    assert_eq!(p.kv_reserved(), 600);
    assert!(matches!(a.try_admit(&Request::new(300, 101)), Err(Rejection::NoCapacity { .. })));
    let q = a.try_admit(&Request::new(300, 100)).unwrap();
    assert_eq!(a.snapshot().kv_used, 1000);
    drop(p);
    drop(q);
    assert_eq!(a.snapshot().kv_used, 0);
}

#[test]
fn too_large_is_not_retryable() {
    let a = Admission::builder().kv_capacity_tokens(1000).token_rate(100.0, 500).build().unwrap();
    let kv = a.try_admit(&Request::new(1000, 1)).unwrap_err();
    assert_eq!(kv, Rejection::TooLarge { limit: Limit::KvBudget, requested: 1001, capacity: 1000 });
    assert_eq!(kv.retry_after(), None);
    assert_eq!(kv.http_status(), 413);
    let rate = a.try_admit(&Request::new(400, 101)).unwrap_err();
    assert_eq!(rate, Rejection::TooLarge { limit: Limit::TokenRate, requested: 501, capacity: 500 });
    assert_eq!(a.snapshot().kv_used, 0);
}

#[test]
fn zero_and_huge_requests_do_not_panic_or_wrap() {
    let a = Admission::builder().kv_capacity_tokens(u64::MAX - 1).token_rate(1e9, u64::MAX).build().unwrap();
    let zero = a.try_admit(&Request::new(0, 0)).unwrap_err();
    assert!(matches!(zero, Rejection::Invalid { .. }));
    assert_eq!(zero.http_status(), 400);
    let huge = Request::new(u32::MAX, u32::MAX);
    assert_eq!(huge.total_tokens(), 2 * u64::from(u32::MAX));
    let p = a.try_admit(&huge).unwrap();
    assert_eq!(p.kv_reserved(), 2 * u64::from(u32::MAX));
    let q = a.try_admit(&huge).unwrap();
    assert_eq!(a.snapshot().kv_used, 4 * u64::from(u32::MAX));
    drop((p, q));
    assert_eq!(a.snapshot().kv_used, 0);
    // A KV budget smaller than one huge request: TooLarge, not an overflow.
    let small = Admission::builder().kv_capacity_tokens(10).build().unwrap();
    assert!(matches!(small.try_admit(&huge), Err(Rejection::TooLarge { .. })));
}

#[test]
fn request_rate_retry_after_is_exact() {
    let clock = manual();
    let a = Admission::builder().request_rate(2.0, 1).clock(clock.clone()).build().unwrap();
    drop(a.try_admit(&Request::new(1, 1)).unwrap());
    let err = a.try_admit(&Request::new(1, 1)).unwrap_err();
    assert_eq!(err.http_status(), 429);
    let Rejection::RateLimited { retry_after } = err else { panic!("{err:?}") };
    assert_eq!(retry_after, Duration::from_millis(500));
    clock.advance(retry_after - Duration::from_nanos(1));
    assert!(matches!(a.try_admit(&Request::new(1, 1)), Err(Rejection::RateLimited { .. })));
    clock.advance(Duration::from_nanos(1));
    assert!(a.try_admit(&Request::new(1, 1)).is_ok());
}

#[test]
fn token_rate_charges_total_and_complete_refunds_unused() {
    let clock = manual();
    let a = Admission::builder().token_rate(100.0, 1000).clock(clock.clone()).build().unwrap();
    let p = a.try_admit(&Request::new(200, 800)).unwrap();
    assert_eq!(p.tokens_charged(), 1000);
    assert!(matches!(a.try_admit(&Request::new(1, 0)), Err(Rejection::RateLimited { .. })));
    p.complete(300); // 500 of the 800 output tokens were never generated
    let q = a.try_admit(&Request::new(250, 250)).unwrap();
    assert!(matches!(a.try_admit(&Request::new(1, 0)), Err(Rejection::RateLimited { .. })));
    drop(q); // a plain drop refunds nothing
    assert!(matches!(a.try_admit(&Request::new(1, 0)), Err(Rejection::RateLimited { .. })));
    clock.advance(Duration::from_millis(10));
    assert!(a.try_admit(&Request::new(1, 0)).is_ok());
}

#[test]
fn refusal_for_capacity_spends_no_rate_tokens() {
    let clock = manual();
    let a = Admission::builder().max_in_flight(1).request_rate(1.0, 1).clock(clock).build().unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    for _ in 0..5 {
        assert!(matches!(a.try_admit(&Request::new(1, 1)), Err(Rejection::NoCapacity { .. })));
    }
    drop(held);
    // The only rate token was spent by `held`; the refused attempts spent none, so the rate refusal
    // reports a full 1 s wait.
    assert_eq!(
        a.try_admit(&Request::new(1, 1)).unwrap_err(),
        Rejection::RateLimited { retry_after: Duration::from_secs(1) }
    );
}

#[test]
fn refusal_for_rate_returns_capacity_and_request_token() {
    let clock = manual();
    let a = Admission::builder()
        .max_in_flight(4)
        .kv_capacity_tokens(100)
        .request_rate(10.0, 2)
        .token_rate(10.0, 50)
        .clock(clock.clone())
        .build()
        .unwrap();
    let p = a.try_admit(&Request::new(40, 0)).unwrap();
    // Token rate refuses: 40 + 20 > 50 available... slot, KV and the request token all come back.
    assert!(matches!(a.try_admit(&Request::new(20, 0)), Err(Rejection::RateLimited { .. })));
    let s = a.snapshot();
    assert_eq!((s.in_flight, s.kv_used), (1, 40));
    // The request token was refunded: one more request passes the request rate (burst 2).
    assert!(a.try_admit(&Request::new(10, 0)).is_ok());
    drop(p);
}

#[test]
fn rejection_statuses_and_hints() {
    let d = Duration::from_secs(1);
    assert_eq!(Rejection::NoCapacity { retry_after: d }.http_status(), 503);
    assert_eq!(Rejection::QueueFull { retry_after: d }.http_status(), 503);
    assert_eq!(Rejection::RateLimited { retry_after: d }.http_status(), 429);
    assert_eq!(Rejection::TimedOut.http_status(), 503);
    assert_eq!(Rejection::Closed.http_status(), 503);
    assert_eq!(Rejection::Closed.retry_after(), None);
    assert_eq!(Rejection::QueueFull { retry_after: d }.retry_after(), Some(d));
    assert!(Rejection::NoCapacity { retry_after: d }.to_string().contains("retry"));
}

#[test]
fn configuration_that_can_never_admit_is_an_error() {
    assert_eq!(Admission::builder().max_in_flight(0).build().unwrap_err(), ConfigError::Zero { what: "max_in_flight" });
    assert!(matches!(Admission::builder().kv_capacity_tokens(0).build(), Err(ConfigError::Zero { .. })));
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e12] {
        assert!(
            matches!(Admission::builder().request_rate(rate, 1).build(), Err(ConfigError::InvalidRate { .. })),
            "{rate}"
        );
        assert!(
            matches!(Admission::builder().token_rate(rate, 1).build(), Err(ConfigError::InvalidRate { .. })),
            "{rate}"
        );
    }
    assert!(matches!(Admission::builder().request_rate(1.0, 0).build(), Err(ConfigError::Zero { .. })));
    assert!(matches!(Admission::builder().token_rate(1.0, 0).build(), Err(ConfigError::Zero { .. })));
    assert!(matches!(Admission::builder().queue_capacity(usize::MAX).build(), Err(ConfigError::OutOfRange { .. })));
    assert!(Admission::builder().queue_capacity(0).build().is_ok());
    assert!(Admission::builder().build().is_ok(), "no limit at all is valid");
    let msg = Admission::builder().request_rate(f64::NAN, 1).build().unwrap_err().to_string();
    assert!(msg.contains("request rate"), "{msg}");
}

#[test]
fn resizing_revokes_nothing_and_grows_at_once() {
    let a = Admission::builder().max_in_flight(3).kv_capacity_tokens(300).build().unwrap();
    let held: Vec<_> = (0..3).map(|_| a.try_admit(&Request::new(50, 50)).unwrap()).collect();
    a.set_max_in_flight(1).unwrap();
    assert_eq!(a.snapshot().in_flight, 3, "nothing revoked");
    let mut held = held;
    held.pop();
    held.pop();
    assert!(matches!(a.try_admit(&Request::new(1, 1)), Err(Rejection::NoCapacity { .. })), "1 in flight = limit");
    held.pop();
    let p = a.try_admit(&Request::new(1, 1)).unwrap();
    a.set_max_in_flight(2).unwrap();
    let q = a.try_admit(&Request::new(1, 1)).unwrap();
    a.set_kv_capacity(3).unwrap();
    assert!(matches!(
        a.try_admit(&Request::new(1, 0)),
        Err(Rejection::NoCapacity { .. }) | Err(Rejection::TooLarge { .. })
    ));
    assert_eq!(a.snapshot().kv_capacity, 3);
    assert!(a.set_max_in_flight(0).is_err());
    assert!(a.set_kv_capacity(0).is_err());
    assert!(matches!(a.set_request_rate(1.0, 1), Err(ConfigError::Conflict(_))));
    drop((p, q));
    assert_eq!(a.snapshot().in_flight, 0);
}

#[test]
fn rates_can_change_at_runtime() {
    let clock = manual();
    let a = Admission::builder().request_rate(1.0, 1).clock(clock.clone()).build().unwrap();
    assert!(a.try_admit(&Request::new(1, 1)).is_ok());
    assert!(a.try_admit(&Request::new(1, 1)).is_err());
    a.set_request_rate(1000.0, 10).unwrap();
    clock.advance(Duration::from_millis(5));
    for _ in 0..5 {
        assert!(a.try_admit(&Request::new(1, 1)).is_ok());
    }
    assert!(a.set_request_rate(f64::NAN, 1).is_err());
}

#[test]
fn try_admit_does_not_overtake_waiters_of_same_or_higher_priority() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(4).build().unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let mut waiting = Box::pin(a.admit(&Request::new(1, 1).priority(Priority::Normal)));
    assert!(futures::FutureExt::now_or_never(&mut waiting).is_none());
    drop(held); // granted to the waiter, not to whoever calls try_admit next
    assert!(matches!(
        a.try_admit(&Request::new(1, 1).priority(Priority::Interactive)),
        Err(Rejection::NoCapacity { .. })
    ));
    let permit = futures::executor::block_on(waiting).unwrap();
    drop(permit);
    assert!(a.try_admit(&Request::new(1, 1)).is_ok());
}

#[test]
fn permit_is_send_sync_static_and_admission_clone_send_sync() {
    fn assert_send_sync_static<T: Send + Sync + 'static>() {}
    assert_send_sync_static::<kvgate::Permit>();
    assert_send_sync_static::<kvgate::Admission>();
    assert_send_sync_static::<kvgate::Admission<ManualClock>>();
    assert_send_sync_static::<kvgate::Rejection>();
    assert_send_sync_static::<kvgate::Snapshot>();
    fn assert_send_static<T: Send + 'static>() {}
    assert_send_static::<kvgate::Admit>();
    let a = Admission::builder().max_in_flight(1).build().unwrap();
    let b = a.clone();
    let p = a.try_admit(&Request::new(1, 1)).unwrap();
    assert_eq!(b.snapshot().in_flight, 1, "clones share state");
    std::thread::spawn(move || drop(p)).join().unwrap();
    assert_eq!(b.snapshot().in_flight, 0);
}

#[test]
fn panicking_task_returns_its_permit() {
    let a = Admission::builder().max_in_flight(1).kv_capacity_tokens(10).build().unwrap();
    let a2 = a.clone();
    let result = std::thread::spawn(move || {
        let _permit = a2.try_admit(&Request::new(5, 5)).unwrap();
        panic!("generation crashed");
    })
    .join();
    assert!(result.is_err());
    let s = a.snapshot();
    assert_eq!((s.in_flight, s.kv_used), (0, 0));
}
