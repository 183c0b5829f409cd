//! One deterministic test per defect found where the admission's features meet (tenants × rates × resize ×
//! close × cancellation × user wakers), each stating the guarantee it proves. Each failed on the admission
//! core before its fix.
#![cfg(not(loom))]

use kvgate::clock::{Clock, ManualClock};
use kvgate::{Admission, Admit, Fairness, Limit, Priority, Rejection, Request, TenantLimits};
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

// Admission core v3: seven defects found where features meet, each with the guarantee it breaks.

/// v3 defect 1: a request shed for its TTFT deadline is told a moment no earlier than its rates allow —
/// the rule every other refusal follows.
#[test]
fn a_deadline_shed_hint_is_no_earlier_than_the_rates() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_in_flight(1)
        .queue_capacity(8)
        .request_rate(0.1, 1)
        .expected_hold_time(Duration::from_secs(1))
        .build()
        .unwrap();
    let _held = admission.try_admit(&Request::new(1, 1)).unwrap(); // the slot and the one request token
    let mut late = admission.admit(&Request::new(1, 1).ttft_deadline(Duration::from_millis(100)));
    let Poll::Ready(Err(Rejection::NoCapacity { retry_after })) = poll(&mut late) else {
        panic!("predicted to wait a second for a 100-ms deadline: shed")
    };
    // The slot is predicted free in 0.9 s past the deadline, but the request rate passes it in 10 s.
    assert_eq!(retry_after, Duration::from_secs(10), "the shed hint ignored the request rate");
    assert_eq!(admission.snapshot().shed, 1);
}

/// v3 defect 1 (tenant rates): the tenant's own rate counts too.
#[test]
fn a_deadline_shed_hint_covers_the_tenants_rate() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_in_flight(1)
        .queue_capacity(8)
        .tenant_defaults(TenantLimits::new().token_rate(1.0, 10))
        .expected_hold_time(Duration::from_secs(1))
        .build()
        .unwrap();
    let _held = admission.try_admit(&Request::new(5, 5).tenant("alice")).unwrap();
    let mut late = admission.admit(&Request::new(5, 5).tenant("alice").ttft_deadline(Duration::from_millis(100)));
    let Poll::Ready(Err(rejection)) = poll(&mut late) else { panic!("shed") };
    // alice's 10-token bucket is empty: 10 tokens at 1/s.
    assert_eq!(rejection.retry_after(), Some(Duration::from_secs(10)), "{rejection:?}");
}

/// v3 defect 2: under token fairness, a tenant that starts waiting after others were served directly
/// (through `try_admit`) joins at the class's service level; it is not owed what the others were served.
#[test]
fn a_newcomer_joins_at_the_level_others_were_served_directly() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_in_flight(1)
        .queue_capacity(256)
        .fairness(Fairness::tokens())
        .tenant_defaults(TenantLimits::new())
        .build()
        .unwrap();
    let request = |t: &'static str| Request::new(500, 250).tenant(t); // cost 1,000
    // alice and bob are served directly, one at a time, 40 times each.
    for _ in 0..40 {
        for t in ["alice", "bob"] {
            admission.try_admit(&request(t)).unwrap().complete(250);
        }
    }
    // The slot is held; carol starts waiting first (nobody else waits), then all three are backlogged.
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting: Vec<(&str, Admit)> = Vec::new();
    for _ in 0..40 {
        for t in ["carol", "alice", "bob"] {
            let mut fut = admission.admit(&request(t));
            assert!(poll(&mut fut).is_pending());
            waiting.push((t, fut));
        }
    }
    drop(held);
    // Serve 30 grants one at a time, while all three stay backlogged (40 each queued).
    let mut served = std::collections::HashMap::<&str, u32>::new();
    for _ in 0..30 {
        let i = waiting
            .iter_mut()
            .position(|(_, fut)| matches!(poll(fut), Poll::Ready(Ok(_))))
            .expect("one waiter is granted per release");
        let (t, _) = waiting.remove(i);
        *served.entry(t).or_default() += 1;
    }
    // Equal weights and costs: each gets a third, within one request of the others.
    for t in ["alice", "bob", "carol"] {
        let n = served.get(t).copied().unwrap_or(0);
        assert!((9..=11).contains(&n), "{t} got {n} of 30 grants: {served:?}");
    }
}

/// v3 defect 3: a weight far above a request's cost still charges its tenant (a charge never rounds to
/// zero), so the heavy tenant gets its weighted share and no more; weights above the maximum are refused.
#[test]
fn heavy_weights_still_pay_and_the_range_is_checked() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_in_flight(1)
        .queue_capacity(256)
        .fairness(Fairness::tokens())
        .tenant_limits("heavy", TenantLimits::new().weight(TenantLimits::MAX_WEIGHT))
        .tenant_limits("light", TenantLimits::new().weight(TenantLimits::MAX_WEIGHT / 2))
        .build()
        .unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting: Vec<(&str, Admit)> = Vec::new();
    for _ in 0..40 {
        for t in ["heavy", "light"] {
            let mut fut = admission.admit(&Request::new(5, 0).tenant(t)); // cost 5, far below the weights
            assert!(poll(&mut fut).is_pending());
            waiting.push((t, fut));
        }
    }
    drop(held);
    let mut served = std::collections::HashMap::<&str, u32>::new();
    for _ in 0..30 {
        let i = waiting.iter_mut().position(|(_, fut)| matches!(poll(fut), Poll::Ready(Ok(_)))).unwrap();
        *served.entry(waiting.remove(i).0).or_default() += 1;
    }
    // Weights 2:1 — 20 and 10 of 30, within one request.
    let heavy = served.get("heavy").copied().unwrap_or(0);
    assert!((19..=21).contains(&heavy), "{served:?}");
    let too_heavy =
        Admission::builder().tenant_defaults(TenantLimits::new().weight(TenantLimits::MAX_WEIGHT + 1)).build();
    let err = too_heavy.unwrap_err().to_string();
    assert!(err.contains("tenant weight") && err.contains("65536"), "{err}");
}

/// v3 defect 4: a request whose shared prefix is resident is predicted to need only its suffix, exactly
/// what admission would take; it is not shed for KV it would never be charged.
#[test]
fn a_resident_prefix_is_not_priced_twice_by_the_deadline_prediction() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_in_flight(10)
        .kv_capacity_tokens(1000)
        .prefix_sharing(8)
        .queue_capacity(8)
        .expected_hold_time(Duration::from_secs(1))
        .build()
        .unwrap();
    let sharer = || Request::new(600, 0).prefix(7u64, 500); // 500 shared + 100 own
    let _a = admission.try_admit(&sharer()).unwrap(); // brings the prefix in: 600 used
    let c = admission.try_admit(&Request::new(300, 0)).unwrap(); // 900 used
    let mut w = admission.admit(&Request::new(150, 0)); // waits for KV
    assert!(poll(&mut w).is_pending());
    // Behind w: 150 + its own 100 against 100 free; 150 units short at 900 units/s is ~0.17 s, within its
    // 0.5-s deadline (priced with the prefix again, 650 short, it would be 0.72 s and shed).
    let mut b = admission.admit(&sharer().ttft_deadline(Duration::from_millis(500)));
    assert!(poll(&mut b).is_pending(), "shed for a prefix that is already held");
    assert_eq!(admission.snapshot().shed, 0);
    drop(c);
    assert!(matches!(poll(&mut w), Poll::Ready(Ok(_))));
    let Poll::Ready(Ok(permit)) = poll(&mut b) else { panic!("b fits once c left") };
    assert_eq!(permit.kv_reserved(), 100);
}

/// v3 defect 5: a waiter that ended in the queue (timed out, closed) and whose future is then dropped
/// without being polled is counted once, by its reason.
#[test]
fn an_ended_waiter_dropped_unpolled_is_counted_once() {
    let (clock, builder) = manual();
    let admission = builder.max_in_flight(1).queue_capacity(8).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut timed = admission.admit(&Request::new(1, 0).max_wait(Duration::from_millis(10)));
    assert!(poll(&mut timed).is_pending());
    let mut polled = admission.admit(&Request::new(1, 0).max_wait(Duration::from_millis(10)));
    assert!(poll(&mut polled).is_pending());
    clock.advance(Duration::from_millis(20));
    assert_eq!(admission.expire_waiters(), 2);
    drop(timed); // ended TimedOut, never polled again
    assert!(matches!(poll(&mut polled), Poll::Ready(Err(Rejection::TimedOut))));
    drop(polled);
    assert_eq!(admission.snapshot().rejected.timed_out, 2, "{:?}", admission.snapshot().rejected);
    let mut closed = admission.admit(&Request::new(1, 0));
    assert!(poll(&mut closed).is_pending());
    admission.close();
    drop(closed);
    let counts = admission.snapshot().rejected;
    assert_eq!((counts.timed_out, counts.closed, counts.total()), (2, 1, 3), "{counts:?}");
    drop(held);
}

/// v3 defect 5 (blocking): the same for `admit_blocking`, whose thread sees every ending: counted once.
#[test]
fn a_blocking_waiter_that_times_out_is_counted_once() {
    let admission = Admission::builder().max_in_flight(1).queue_capacity(8).build().unwrap();
    let _held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let outcome = admission.admit_blocking(&Request::new(1, 0), Some(Duration::from_millis(5)));
    assert_eq!(outcome.unwrap_err(), Rejection::TimedOut);
    assert_eq!(admission.snapshot().rejected.total(), 1);
}

/// v3 defect 7: a full bucket banks no progress towards a token it cannot hold — global and per tenant:
/// after a long idle, a burst passes `burst` requests and the next is told one whole interval (200 ms at
/// 5/s), never the rest of a token that accrued while the bucket was full.
#[test]
fn a_full_bucket_banks_no_part_of_a_token_globally_or_per_tenant() {
    let (clock, builder) = manual();
    let admission =
        builder.request_rate(5.0, 5).tenant_defaults(TenantLimits::new().request_rate(5.0, 5)).build().unwrap();
    for tenant in [None, Some("alice")] {
        let request = || match tenant {
            Some(t) => Request::new(1, 0).tenant(t),
            None => Request::new(1, 0),
        };
        clock.advance(Duration::from_millis(1_100)); // idle: full, and 0.5 of a token of progress
        for _ in 0..5 {
            drop(admission.try_admit(&request()).unwrap());
        }
        let Err(Rejection::RateLimited { retry_after }) = admission.try_admit(&request()) else {
            panic!("a sixth request within the burst's instant")
        };
        assert_eq!(retry_after, Duration::from_millis(200), "{tenant:?}: the full bucket banked progress");
        clock.advance(Duration::from_millis(199));
        assert!(admission.try_admit(&request()).is_err(), "{tenant:?}: a sixth within 199 ms");
        clock.advance(Duration::from_secs(10));
    }
}
