//! One deterministic test per defect found where the admission's features meet (tenants × rates × resize ×
//! close × cancellation × user wakers), each stating the guarantee it proves. Each failed on the admission
//! core before its fix.
#![cfg(not(loom))]

use kvgate::clock::{Clock, ManualClock};
use kvgate::{Admission, Admit, Limit, Priority, Rejection, Request, TenantLimits};
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;
use support::admission::poll_once as poll;

fn manual() -> (ManualClock, kvgate::AdmissionBuilder<ManualClock>) {
    let clock = ManualClock::starting_at(1_000_000_000);
    let builder = Admission::builder().deadline_timer(false).clock(clock.clone());
    (clock, builder)
}

/// Polls once with `waker`.
fn poll_with(fut: &mut Admit, waker: &Waker) -> Poll<Result<kvgate::Permit, Rejection>> {
    Pin::new(fut).poll(&mut Context::from_waker(waker))
}

/// Defect 1: a queued tenant request charged only its tenant's token bucket (no global token rate) gets
/// exactly that back when it is cancelled or refused `QueueFull`.
#[test]
fn cancelled_and_queue_full_waiters_refund_their_tenants_tokens() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_in_flight(1)
        .queue_capacity(1)
        .tenant_defaults(TenantLimits::new().token_rate(0.001, 100))
        .build()
        .unwrap();
    let tokens = |a: &Admission<ManualClock>| a.rate_status(Some("alice".into())).tokens.unwrap().remaining;
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting = admission.admit(&Request::new(50, 0).tenant("alice"));
    assert!(poll(&mut waiting).is_pending());
    assert_eq!(tokens(&admission), 50);
    let mut full = admission.admit(&Request::new(30, 0).tenant("alice"));
    assert!(matches!(poll(&mut full), Poll::Ready(Err(Rejection::QueueFull { .. }))));
    assert_eq!(tokens(&admission), 50, "QueueFull kept the tenant's 30 tokens");
    drop(waiting);
    assert_eq!(tokens(&admission), 100, "cancellation kept the tenant's 50 tokens");
    drop(held);
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0));
}

/// Defect 2: shrinking the KV budget below a queued request resolves that waiter `TooLarge` at once; the
/// queue is never wedged.
#[test]
fn shrinking_the_budget_below_a_waiter_resolves_it_too_large() {
    let (_clock, builder) = manual();
    let admission = builder.kv_capacity_tokens(1000).build().unwrap();
    let held = admission.try_admit(&Request::new(600, 0)).unwrap();
    let mut big = admission.admit(&Request::new(800, 0));
    assert!(poll(&mut big).is_pending());
    admission.set_kv_capacity(500).unwrap();
    assert!(matches!(
        poll(&mut big),
        Poll::Ready(Err(Rejection::TooLarge { limit: Limit::KvBudget, requested: 800, capacity: 500 }))
    ));
    drop(held);
    assert!(admission.try_admit(&Request::new(100, 0)).is_ok(), "the queue is wedged");
    assert_eq!(admission.snapshot().queued, 0);
}

/// Defect 3: a waiter held back only by its own tenant's cap blocks nobody else's `try_admit`.
#[test]
fn a_tenant_at_its_own_cap_blocks_nobody_else() {
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(64).tenant_defaults(TenantLimits::new().max_in_flight(1)).build().unwrap();
    let fill: Vec<_> = (0..64).map(|_| admission.try_admit(&Request::new(1, 0)).unwrap()).collect();
    let alice = || Request::new(1, 0).tenant("alice").priority(Priority::Interactive);
    let mut a1 = admission.admit(&alice());
    let mut a2 = admission.admit(&alice());
    assert!(poll(&mut a1).is_pending() && poll(&mut a2).is_pending());
    drop(fill);
    let first = match poll(&mut a1) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("alice's first waiter not granted: {other:?}"),
    };
    assert!(poll(&mut a2).is_pending(), "alice's second waiter passed her own cap");
    // 63 slots are free: bob and an anonymous batch job get them.
    let bob = admission.try_admit(&Request::new(1, 0).tenant("bob").priority(Priority::Interactive));
    assert!(bob.is_ok(), "bob refused while alice waits for her own cap: {bob:?}");
    assert!(admission.try_admit(&Request::new(1, 0).priority(Priority::Batch)).is_ok());
    // Alice's own try_admit does not overtake her waiter.
    assert!(matches!(admission.try_admit(&alice()), Err(Rejection::RateLimited { .. })));
    drop(first);
    assert!(matches!(poll(&mut a2), Poll::Ready(Ok(_))));
}

/// A waker that blocks the thread that wakes it until released, and says when it is blocked.
struct Gate {
    entered: Mutex<Option<mpsc::Sender<()>>>,
    release: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        if let Some(entered) = self.entered.lock().unwrap().take() {
            entered.send(()).unwrap();
            let release = self.release.lock().unwrap().take().unwrap();
            release.recv().unwrap();
        }
    }
}

/// Defect 4: `close()` is linearizable — once it returns, no waiter is granted, even by a dispatch pass
/// that was running on another thread (here held inside a slow waker).
#[test]
fn nothing_is_granted_after_close_returns() {
    let admission = Admission::builder().max_in_flight(1).queue_capacity(1000).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let gate =
        Waker::from(Arc::new(Gate { entered: Mutex::new(Some(entered_tx)), release: Mutex::new(Some(release_rx)) }));
    let mut first = admission.admit(&Request::new(1, 0));
    assert!(poll_with(&mut first, &gate).is_pending());
    let mut rest: Vec<Admit> = (0..200).map(|_| admission.admit(&Request::new(1, 0))).collect();
    for fut in &mut rest {
        assert!(poll(fut).is_pending());
    }
    let grower = {
        let admission = admission.clone();
        thread::spawn(move || admission.set_max_in_flight(10_000).unwrap())
    };
    // The grower's pass granted a batch and is now waking the first waiter, which blocks.
    entered_rx.recv().unwrap();
    admission.close();
    let at_close = admission.snapshot().in_flight;
    release_tx.send(()).unwrap();
    grower.join().unwrap();
    assert_eq!(admission.snapshot().in_flight, at_close, "a waiter was granted after close() returned");
    let mut granted = usize::from(matches!(poll(&mut first), Poll::Ready(Ok(_))));
    for fut in &mut rest {
        match poll(fut) {
            Poll::Ready(Ok(_)) => granted += 1,
            Poll::Ready(Err(Rejection::Closed)) => {}
            other => panic!("a waiter did not resolve after close: {other:?}"),
        }
    }
    assert_eq!(granted + 1, at_close, "the held permit and the grants before close");
    drop(held);
    assert_eq!(admission.snapshot().in_flight, 0);
}

/// A waker that panics.
struct Panicking;

impl Wake for Panicking {
    fn wake(self: Arc<Self>) {
        panic!("a waker that panics");
    }
}

/// Defect 5: a panicking waker neither wedges the dispatcher nor reaches the thread that released capacity.
#[test]
fn a_panicking_waker_stops_nothing() {
    let admission = Admission::builder().max_in_flight(1).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut bad = admission.admit(&Request::new(1, 0));
    assert!(poll_with(&mut bad, &Waker::from(Arc::new(Panicking))).is_pending());
    let mut next = admission.admit(&Request::new(1, 0));
    assert!(poll(&mut next).is_pending());
    // The release wakes the panicking waker: contained, counted, not propagated.
    drop(held);
    assert_eq!(admission.snapshot().waker_panics, 1);
    // The waiter keeps its grant; admission goes on.
    let permit = match poll(&mut bad) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("the waiter lost its grant: {other:?}"),
    };
    drop(permit);
    assert!(matches!(poll(&mut next), Poll::Ready(Ok(_))));
    assert_eq!(admission.snapshot().in_flight, 0);
}

/// Defect 6: `QueueFull` only when the class really holds `queue_capacity` waiters — not because
/// cancelled waiters left entries behind while the dispatcher was busy in a slow waker.
#[test]
fn queue_full_only_when_the_queue_is_full() {
    let admission = Admission::builder().max_in_flight(1).queue_capacity(2).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let gate =
        Waker::from(Arc::new(Gate { entered: Mutex::new(Some(entered_tx)), release: Mutex::new(Some(release_rx)) }));
    let mut slow = admission.admit(&Request::new(1, 0));
    assert!(poll_with(&mut slow, &gate).is_pending());
    let releaser = thread::spawn(move || drop(held));
    entered_rx.recv().unwrap();
    // The releasing thread is stuck in the slow waker. Waiters come and go meanwhile.
    let second = admission.try_admit(&Request::new(1, 0));
    assert!(second.is_err());
    for _ in 0..10 {
        let mut fut = admission.admit(&Request::new(1, 0));
        assert!(poll(&mut fut).is_pending());
        drop(fut);
    }
    assert_eq!(admission.snapshot().queued, 0);
    let mut fut = admission.admit(&Request::new(1, 0));
    assert!(poll(&mut fut).is_pending(), "QueueFull with an empty queue");
    release_tx.send(()).unwrap();
    releaser.join().unwrap();
    drop(slow);
    assert!(matches!(poll(&mut fut), Poll::Ready(Ok(_))));
}

/// Defect 7: a rate refusal's hint is the time at which every rate the request meets would pass — the
/// global one that refused and the tenant's.
#[test]
fn rate_hints_cover_the_tenants_buckets_too() {
    let (clock, builder) = manual();
    let admission =
        builder.request_rate(1.0, 1).tenant_defaults(TenantLimits::new().token_rate(10.0, 100)).build().unwrap();
    // Alice spends her 100 tokens; the global request bucket is empty for 1 s, her tokens for 10 s.
    drop(admission.try_admit(&Request::new(100, 0).tenant("alice")).unwrap());
    let err = admission.try_admit(&Request::new(100, 0).tenant("alice")).unwrap_err();
    assert_eq!(err, Rejection::RateLimited { retry_after: Duration::from_secs(10) });
    // Retrying at the hint passes.
    clock.advance(Duration::from_secs(10));
    assert!(admission.try_admit(&Request::new(100, 0).tenant("alice")).is_ok());
    // The other order: the tenant's bucket refuses while the global one passes.
    let err = admission.try_admit(&Request::new(50, 0).tenant("alice")).unwrap_err();
    assert_eq!(err, Rejection::RateLimited { retry_after: Duration::from_secs(5) });
}

/// Defect 8: a tenant-cap hint comes from that tenant's own hold times.
#[test]
fn tenant_cap_hints_come_from_the_tenants_own_holds() {
    let (clock, builder) = manual();
    let admission = builder.max_in_flight(1000).tenant_defaults(TenantLimits::new().max_in_flight(1)).build().unwrap();
    // Everyone else holds permits for 2 ms; alice holds hers for 1 s.
    for _ in 0..100 {
        let p = admission.try_admit(&Request::new(1, 0)).unwrap();
        clock.advance(Duration::from_millis(2));
        drop(p);
    }
    for _ in 0..8 {
        let p = admission.try_admit(&Request::new(1, 0).tenant("alice")).unwrap();
        clock.advance(Duration::from_secs(1));
        drop(p);
    }
    let _held: Vec<_> = (0..100).map(|_| admission.try_admit(&Request::new(1, 0)).unwrap()).collect();
    let _alice = admission.try_admit(&Request::new(1, 0).tenant("alice")).unwrap();
    match admission.try_admit(&Request::new(1, 0).tenant("alice")) {
        Err(Rejection::RateLimited { retry_after }) => {
            assert!(retry_after >= Duration::from_millis(900), "hint {retry_after:?} for a 1 s hold")
        }
        other => panic!("expected RateLimited, got {other:?}"),
    }
}

/// Defect 9: tenant KV shares follow `set_kv_capacity`, for tenants created before and after the resize.
#[test]
fn tenant_shares_follow_the_budget() {
    let (_clock, builder) = manual();
    let admission =
        builder.kv_capacity_tokens(1000).tenant_defaults(TenantLimits::new().kv_share(0.5)).build().unwrap();
    let too_large = |requested, capacity| Rejection::TooLarge { limit: Limit::TenantKvShare, requested, capacity };
    assert_eq!(admission.try_admit(&Request::new(600, 0).tenant("before")).unwrap_err(), too_large(600, 500));
    admission.set_kv_capacity(2000).unwrap();
    drop(admission.try_admit(&Request::new(1000, 0).tenant("before")).unwrap());
    drop(admission.try_admit(&Request::new(1000, 0).tenant("after")).unwrap());
    admission.set_kv_capacity(400).unwrap();
    assert_eq!(admission.try_admit(&Request::new(300, 0).tenant("after")).unwrap_err(), too_large(300, 200));
}

/// A request of a tenant at its own cap that may wait, waits (in its tenant's flow) instead of a 429.
#[test]
fn a_tenant_request_that_may_wait_waits_for_its_own_capacity() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_queue_wait(Duration::from_secs(10))
        .tenant_defaults(TenantLimits::new().max_in_flight(1).kv_share(0.5))
        .kv_capacity_tokens(100)
        .build()
        .unwrap();
    let first = admission.try_admit(&Request::new(10, 0).tenant("alice")).unwrap();
    let mut second = admission.admit(&Request::new(10, 0).tenant("alice"));
    assert!(poll(&mut second).is_pending(), "refused instead of waiting for its own cap");
    // Over the KV share (half of 100), too.
    let mut third = admission.admit(&Request::new(45, 0).tenant("bob"));
    let third = match poll(&mut third) {
        Poll::Ready(Ok(p)) => p,
        other => panic!("bob's first request: {other:?}"),
    };
    assert!(matches!(admission.try_admit(&Request::new(10, 0).tenant("bob")), Err(Rejection::RateLimited { .. })));
    let mut fourth = admission.admit(&Request::new(10, 0).tenant("bob"));
    assert!(poll(&mut fourth).is_pending(), "refused instead of waiting for its own KV share");
    drop(first);
    assert!(matches!(poll(&mut second), Poll::Ready(Ok(_))));
    assert!(poll(&mut fourth).is_pending());
    drop(third);
    assert!(matches!(poll(&mut fourth), Poll::Ready(Ok(_))));
}

/// Capacity hints right after start-up: the configured prior before any hold, then every hold until the
/// estimate has enough samples.
#[test]
fn capacity_hints_use_the_prior_then_every_early_hold() {
    let (clock, builder) = manual();
    let admission =
        builder.max_in_flight(2).queue_capacity(0).expected_hold_time(Duration::from_secs(4)).build().unwrap();
    let a = admission.try_admit(&Request::new(1, 0)).unwrap();
    let b = admission.try_admit(&Request::new(1, 0)).unwrap();
    // Two in flight, each held 4 s by the prior: one frees every 2 s.
    assert_eq!(
        admission.try_admit(&Request::new(1, 0)).unwrap_err(),
        Rejection::NoCapacity { retry_after: Duration::from_secs(2) }
    );
    clock.advance(Duration::from_millis(2_100));
    drop(a);
    // The very first hold already replaces the prior (no sampling while warming up).
    assert_eq!(admission.snapshot().mean_hold, Duration::from_millis(2_100));
    let _a = admission.try_admit(&Request::new(1, 0)).unwrap();
    assert_eq!(
        admission.try_admit(&Request::new(1, 0)).unwrap_err(),
        Rejection::NoCapacity { retry_after: Duration::from_millis(1_050) }
    );
    drop(b);
}

/// After warm-up, one permit in eight feeds the hold-time estimate, with the `metrics` feature as
/// without it: telemetry (which records every hold) must not change the hints, and with them what clients
/// do (the overload lab gave other results with and without the feature).
#[test]
fn the_hold_estimate_samples_the_same_permits_with_and_without_metrics() {
    let (clock, builder) = manual();
    let admission = builder.max_in_flight(8).queue_capacity(0).build().unwrap();
    // Warm-up: eight permits held 1 s each, every one sampled.
    let first: Vec<_> = (0..8).map(|_| admission.try_admit(&Request::new(1, 0)).unwrap()).collect();
    clock.advance(Duration::from_secs(1));
    drop(first);
    assert_eq!(admission.snapshot().mean_hold, Duration::from_secs(1));
    // Eight more, one after the other, each held 9 s: exactly one of them is sampled, with weight 1/8.
    for _ in 0..8 {
        let permit = admission.try_admit(&Request::new(1, 0)).unwrap();
        clock.advance(Duration::from_secs(9));
        drop(permit);
    }
    assert_eq!(admission.snapshot().mean_hold, Duration::from_secs(2));
}

/// A waiter without a wait limit queues even when the clock stands at its end (`u64::MAX`), with the
/// `metrics` feature (whose queue-time metric reads the clock at enqueue) as without it.
#[test]
fn a_waiter_without_a_wait_limit_queues_at_the_end_of_time() {
    let clock = ManualClock::starting_at(u64::MAX);
    let admission = Admission::builder().clock(clock).max_in_flight(1).queue_capacity(4).build().unwrap();
    let _held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting = admission.admit(&Request::new(1, 0));
    assert!(poll(&mut waiting).is_pending());
    assert_eq!(admission.snapshot().queued, 1);
}

/// A clock that follows a manual clock but tells waiting threads to sleep for an hour, so that only an
/// unpark wakes them.
#[derive(Debug, Clone)]
struct SleepyClock(ManualClock);

impl Clock for SleepyClock {
    fn now_nanos(&self) -> u64 {
        self.0.now_nanos()
    }
    fn real_time_until(&self, _clock_nanos: u64) -> Duration {
        Duration::from_secs(3600)
    }
}

/// `expire_waiters()` ends blocking waiters like async ones (and unparks their threads).
#[test]
fn expire_waiters_ends_blocking_waiters() {
    let clock = ManualClock::starting_at(1_000_000_000);
    let admission =
        Admission::builder().max_in_flight(1).deadline_timer(false).clock(SleepyClock(clock.clone())).build().unwrap();
    let _held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let blocked = {
        let admission = admission.clone();
        thread::spawn(move || admission.admit_blocking(&Request::new(1, 0), Some(Duration::from_secs(1))))
    };
    while admission.snapshot().queued == 0 {
        thread::yield_now();
    }
    clock.advance(Duration::from_secs(2));
    assert_eq!(admission.expire_waiters(), 1);
    assert_eq!(blocked.join().unwrap().unwrap_err(), Rejection::TimedOut);
}

/// Requests without a tenant and requests of `TenantId(0)` are different flows in fair queueing.
#[test]
fn tenant_zero_is_not_the_anonymous_flow() {
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(1).tenant_defaults(TenantLimits::new()).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiters: Vec<(&str, Admit)> = Vec::new();
    for name in ["anon-1", "anon-2", "anon-3"] {
        waiters.push((name, admission.admit(&Request::new(1, 0))));
    }
    waiters.push(("zero", admission.admit(&Request::new(1, 0).tenant(0u64))));
    for (_, fut) in &mut waiters {
        assert!(poll(fut).is_pending());
    }
    drop(held);
    let mut order = Vec::new();
    while !waiters.is_empty() {
        let mut granted = None;
        for (i, (_, fut)) in waiters.iter_mut().enumerate() {
            if let Poll::Ready(result) = poll(fut) {
                assert!(granted.is_none(), "two waiters granted one slot");
                granted = Some((i, result.unwrap()));
            }
        }
        let (i, permit) = granted.expect("a waiter is granted after each release");
        order.push(waiters.remove(i).0);
        drop(permit);
    }
    assert_eq!(order, ["anon-1", "zero", "anon-2", "anon-3"]);
}

/// `Snapshot` serializes (feature `serde`), for health and stats endpoints.
#[cfg(feature = "serde")]
#[test]
fn snapshots_serialize() {
    let admission = Admission::builder().max_in_flight(2).build().unwrap();
    let _p = admission.try_admit(&Request::new(1, 1)).unwrap();
    let json = serde_json::to_value(admission.snapshot()).unwrap();
    assert_eq!(json["in_flight"], 1);
    assert_eq!(json["rejected"]["queue_full"], 0);
}
