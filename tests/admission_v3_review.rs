//! Adversarial review of the admission's third round of changes: controlled delay (`WaitPolicy`), the
//! class service level of token fairness, staggered rate hints (`promise.rs`), the deadline-shed hint and
//! the expiry paths around them. One deterministic test per defect (a `ManualClock`, `deadline_timer(false)`
//! unless the timer itself is the subject, futures polled by hand); each fails on the code it was written
//! against, for the reason its doc comment states, and passes once the defect is fixed.
#![cfg(not(loom))]

use kvgate::clock::ManualClock;
use kvgate::{Admission, Admit, Permit, Rejection, Request, TenantLimits, WaitPolicy};
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;
use support::admission::poll_once as poll;

const MS: Duration = Duration::from_millis(1);

fn manual() -> (ManualClock, kvgate::AdmissionBuilder<ManualClock>) {
    let clock = ManualClock::starting_at(1_000_000_000);
    let builder = Admission::builder().deadline_timer(false).clock(clock.clone());
    (clock, builder)
}

/// Polls once with `waker`.
fn poll_with(fut: &mut Admit, waker: &Waker) -> Poll<Result<Permit, Rejection>> {
    Pin::new(fut).poll(&mut Context::from_waker(waker))
}

/// A waker whose first wake blocks the waking thread (and says so) until released; later wakes do nothing.
struct Gate {
    entered: Mutex<Option<mpsc::Sender<()>>>,
    release: Mutex<Option<mpsc::Receiver<()>>>,
}

impl Wake for Gate {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let entered = self.entered.lock().unwrap().take();
        if let Some(entered) = entered {
            entered.send(()).unwrap();
            let release = self.release.lock().unwrap().take().unwrap();
            release.recv().unwrap();
        }
    }
}

fn gate() -> (Waker, mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let waker =
        Waker::from(Arc::new(Gate { entered: Mutex::new(Some(entered_tx)), release: Mutex::new(Some(release_rx)) }));
    (waker, entered_rx, release_tx)
}

/// `room.rs`, `Dispatcher::expire`, the early leave of start-deadline waiters: when its wake list fills it
/// releases the lock to wake the batch, then re-checks only the waiter it was at; the waiters after it are
/// ended without looking at their state again. Another thread that ends them meanwhile (here `close()`,
/// equally a concurrent expiry, a resize or the timer thread) makes the expiry `leave` a waiter that has
/// left already: a `debug_assert` panic in tests, and in a release build a flow unlinked twice and the
/// waiting counts decremented twice (the timer thread, which runs this, dies with `running` still set, so no
/// deadline is enforced by a timer again). Invariant 3 of the room and "a panicking waker cannot stop
/// admission" (ARCHITECTURE 8) are at stake.
#[test]
fn an_expiry_that_wakes_a_batch_never_ends_a_waiter_twice() {
    let (clock, builder) = manual();
    let admission = builder
        .max_in_flight(1)
        .expected_hold_time(MS) // the start predictions at enqueue are a few ms: every waiter queues
        .wait_policy(WaitPolicy::Fifo)
        .build()
        .unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let (gate, entered, release) = gate();
    let mut waiters: Vec<Admit> =
        (0..100).map(|_| admission.admit(&Request::new(1, 0).ttft_deadline(Duration::from_secs(10)))).collect();
    for w in &mut waiters {
        assert!(poll_with(w, &gate).is_pending());
    }
    // Half a millisecond before their start deadline, with a predicted wait of 1 ms, all 100 must leave
    // early: several wake lists (32 each) of them.
    clock.advance(Duration::from_secs(10) - Duration::from_micros(500));
    let expirer = {
        let admission = admission.clone();
        thread::spawn(move || admission.expire_waiters())
    };
    // The expiry is waking its first batch (the lock is free): another thread ends the rest.
    entered.recv().unwrap();
    admission.close();
    release.send(()).unwrap();
    let expired = expirer.join();
    assert!(expired.is_ok(), "expire_waiters panicked: it ended a waiter that close() had ended already");
    for w in &mut waiters {
        assert!(poll(w).is_ready());
    }
    drop(held);
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0), "{s:?}");
}

/// `wait_policy.rs` and README ("a waiter held back only by its own tenant blocks nobody else"; "a tenant
/// over its own limit gets 429 ... with a Retry-After from that tenant's own hold times"): a flow parked on
/// its tenant's own cap keeps its class "not empty", so the class stands, and its waiter is shed by
/// controlled delay as `NoCapacity` — a 503 "the server is saturated" with the server's estimate — while 7
/// of the server's 8 slots are free. The queue that stands is the tenant's, not the server's.
#[test]
fn a_waiter_parked_on_its_own_tenant_cap_is_not_shed_as_server_overload() {
    let (clock, builder) = manual();
    let admission = builder.max_in_flight(8).tenant_defaults(TenantLimits::new().max_in_flight(1)).build().unwrap();
    let alice = admission.try_admit(&Request::new(1, 0).tenant("alice")).unwrap();
    let mut parked = admission.admit(&Request::new(1, 0).tenant("alice"));
    assert!(poll(&mut parked).is_pending(), "alice waits for her own slot");
    clock.advance(Duration::from_secs(2));
    admission.expire_waiters();
    let s = admission.snapshot();
    assert_eq!(s.in_flight, 1, "the server is nearly idle");
    let outcome = poll(&mut parked);
    assert!(
        !matches!(outcome, Poll::Ready(Err(Rejection::NoCapacity { .. }))),
        "alice's waiter, held back only by her own cap, was shed as server overload (503, shed = {}): {outcome:?}",
        s.shed
    );
    drop(alice);
}

/// The other side of the same defect: a flow parked on its tenant's own cap changes how *other* flows of
/// its class are served. Behind a full server, an anonymous request that has waited 600 ms — its queue
/// formed 600 ms ago, less than the 1-s interval — is shed at the 500-ms target when alice's parked waiter
/// has sat in the class for two seconds, and keeps waiting when it has not. "A waiter held back only by its
/// own tenant's limits blocks nobody else" (mod.rs guarantee 3, README).
#[test]
fn a_tenant_parked_on_its_own_cap_does_not_make_the_server_queue_stand() {
    fn anonymous_waiter_after_600_ms(with_alice: bool) -> Poll<Result<Permit, Rejection>> {
        let (clock, builder) = manual();
        let admission = builder.max_in_flight(2).tenant_defaults(TenantLimits::new().max_in_flight(1)).build().unwrap();
        let mut held = Vec::new();
        let mut parked = None;
        if with_alice {
            held.push(admission.try_admit(&Request::new(1, 0).tenant("alice")).unwrap());
            let mut waiter = admission.admit(&Request::new(1, 0).tenant("alice"));
            assert!(poll(&mut waiter).is_pending());
            parked = Some(waiter);
        }
        clock.advance(Duration::from_secs(2));
        while let Ok(permit) = admission.try_admit(&Request::new(1, 0)) {
            held.push(permit);
        }
        assert_eq!(admission.snapshot().in_flight, 2, "the server is full");
        let mut anonymous = admission.admit(&Request::new(1, 0));
        assert!(poll(&mut anonymous).is_pending());
        clock.advance(Duration::from_millis(600));
        admission.expire_waiters();
        let outcome = poll(&mut anonymous);
        drop(parked);
        outcome
    }
    assert!(anonymous_waiter_after_600_ms(false).is_pending(), "control: the server's queue formed 600 ms ago");
    let with_alice = anonymous_waiter_after_600_ms(true);
    assert!(
        with_alice.is_pending(),
        "alice's parked waiter (held back only by her own cap) made the class stand for everyone: {with_alice:?}"
    );
}

/// `promise.rs`, invariant 4: "Promises in the past are forgotten: the next refusal starts from its exact
/// wait." They are not: the next refusal is spaced from the last promised moment however long ago it was.
/// A 10,000-token refusal is promised t+10 s; a millisecond after that moment (its client did not come back,
/// and its tokens went to someone else) a 9,001-token request lacks one token — its exact wait is 1 ms — and
/// is told 9 s.
#[test]
fn a_promise_in_the_past_is_forgotten() {
    let (clock, builder) = manual();
    let admission = builder.token_rate(1_000.0, 10_000).build().unwrap();
    let _all = admission.try_admit(&Request::new(10_000, 0)).unwrap();
    match admission.try_admit(&Request::new(10_000, 0)) {
        Err(Rejection::RateLimited { retry_after }) => assert_eq!(retry_after, Duration::from_secs(10)),
        other => panic!("{other:?}"),
    }
    clock.advance(Duration::from_millis(10_001)); // past the promised moment; the bucket is full again
    let _most = admission.try_admit(&Request::new(1_000, 0)).unwrap(); // 9,000 tokens left
    let hint = match admission.try_admit(&Request::new(9_001, 0)) {
        Err(Rejection::RateLimited { retry_after }) => retry_after,
        other => panic!("{other:?}"),
    };
    assert!(
        hint <= 2 * MS,
        "the first refusal after every promise has passed is told {hint:?}, not its exact wait (1 ms)"
    );
}

/// `promise.rs`: "each refusal is told the moment after the moments already promised, one request's worth
/// of the rate later (`spacing`), so a client that honours its hint finds its token — a hint is a promise,
/// not a lottery" (the exceptions of invariant 4: a client that does not come back, a newcomer). When the
/// token rate refuses and the request rate passes, the spacing is the token rate's alone, though the request
/// bucket holds only one request: b and c are promised 1 ms and 2 ms, b comes back and is admitted, c comes
/// back at its moment, no newcomer in between, and the request rate refuses it (it admits the second at
/// 10 ms).
#[test]
fn a_promised_client_finds_every_rate_open() {
    let (clock, builder) = manual();
    let admission = builder.request_rate(100.0, 2).token_rate(1_000.0, 1_000).build().unwrap();
    let _a = admission.try_admit(&Request::new(1_000, 0)).unwrap(); // 1 request left, no token
    let hint = |admission: &Admission<ManualClock>| match admission.try_admit(&Request::new(1, 0)) {
        Err(Rejection::RateLimited { retry_after }) => retry_after,
        other => panic!("{other:?}"),
    };
    let b = hint(&admission);
    let c = hint(&admission);
    assert!(c > b);
    clock.advance(b);
    let _b = admission.try_admit(&Request::new(1, 0)).expect("b honoured its hint");
    clock.advance(c - b);
    let c_back = admission.try_admit(&Request::new(1, 0));
    assert!(c_back.is_ok(), "c came back at its promised moment ({c:?}), nobody came in between: {c_back:?}");
}

/// `decision.rs`, deadline-aware shedding (README: refused at once when "predicted to miss it — from the
/// work queued ahead of it"): the prediction counts every waiter of the class as ahead, but in a standing
/// queue the newest waiter of a flow is served first. A request that must start within 2 s is shed
/// ("predicted 11 s") while the same request without a deadline, arriving at the same moment, is the very
/// next one granted — at the first release, expected in 1 s.
#[test]
fn a_standing_queue_does_not_shed_the_request_it_would_serve_next() {
    let (clock, builder) = manual();
    let admission = builder.max_in_flight(1).expected_hold_time(Duration::from_secs(1)).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut old: Vec<Admit> = (0..10).map(|_| admission.admit(&Request::new(1, 0))).collect();
    for w in &mut old {
        assert!(poll(w).is_pending());
    }
    clock.advance(Duration::from_millis(1_100)); // the class stands: newest first
    let mut urgent = admission.admit(&Request::new(1, 0).ttft_deadline(Duration::from_secs(2)));
    let urgent_now = poll(&mut urgent);
    drop(urgent);
    let mut same = admission.admit(&Request::new(1, 0));
    assert!(poll(&mut same).is_pending());
    drop(held); // the first release
    assert!(matches!(poll(&mut same), Poll::Ready(Ok(_))), "the newest waiter is served first");
    assert!(
        !matches!(urgent_now, Poll::Ready(Err(Rejection::NoCapacity { .. }))),
        "the urgent request was shed as unable to start within 2 s, though it would have been granted at the \
         first release: {urgent_now:?}"
    );
}

/// `room.rs`, `enqueue`: "a full standing queue gives the place of its oldest waiter to a newcomer" — but
/// the place is given before the enqueue's own pass, which in a standing queue serves the newest first: a
/// small newcomer that fits at once is granted on the spot, and the oldest waiter was shed (`NoCapacity`,
/// counted in `shed`) for a place nobody took. The queue is left with a free place and a 503 it did not
/// need to send.
#[test]
fn a_full_standing_queue_sheds_nobody_for_a_newcomer_that_does_not_wait() {
    let (clock, builder) = manual();
    let admission = builder.kv_capacity_tokens(100).queue_capacity(2).build().unwrap();
    let holder = admission.try_admit(&Request::new(60, 0)).unwrap(); // 40 free
    let mut w1 = admission.admit(&Request::new(50, 0));
    let mut w2 = admission.admit(&Request::new(50, 0));
    assert!(poll(&mut w1).is_pending() && poll(&mut w2).is_pending());
    clock.advance(Duration::from_millis(1_100)); // the class stands, and its queue is full
    let mut newcomer = admission.admit(&Request::new(10, 0)); // fits the 40 free units
    assert!(matches!(poll(&mut newcomer), Poll::Ready(Ok(_))), "the newcomer is served at once");
    let s = admission.snapshot();
    assert!(
        poll(&mut w1).is_pending(),
        "the oldest waiter was shed to make room for a newcomer that never waited (queued {} of 2, shed {})",
        s.queued,
        s.shed
    );
    drop((w1, w2, holder));
}

// A second review of the same round.

/// `fair.rs`, `longest_oldest`, and `room.rs`, `enqueue`: "a full standing queue gives the place of its
/// oldest waiter (of the longest flows, by age)" — the scan covers parked flows too, so the place is taken
/// from a waiter parked on its own tenant's cap: it resolves `NoCapacity` (a 503, "the server is
/// saturated", with the server's estimate) and is counted in `Snapshot::shed`. `wait_policy.rs`:
/// "Parked waiters are never shed by the policy"; the first review fixed the expiry path
/// (`a_waiter_parked_on_its_own_tenant_cap_is_not_shed_as_server_overload`), not this one.
#[test]
fn a_full_standing_queue_does_not_shed_a_waiter_parked_on_its_own_tenant() {
    let (clock, builder) = manual();
    let admission = builder
        .max_in_flight(2)
        .queue_capacity(4)
        .tenant_defaults(TenantLimits::new().max_in_flight(1))
        .build()
        .unwrap();
    let alice = admission.try_admit(&Request::new(1, 0).tenant("alice")).unwrap();
    let anonymous = admission.try_admit(&Request::new(1, 0)).unwrap(); // the server is full
    let mut parked: Vec<Admit> = (0..3).map(|_| admission.admit(&Request::new(1, 0).tenant("alice"))).collect();
    for w in &mut parked {
        assert!(poll(w).is_pending(), "alice's waiters park on her own cap");
    }
    let mut old = admission.admit(&Request::new(1, 0));
    assert!(poll(&mut old).is_pending());
    clock.advance(Duration::from_millis(1_100)); // the anonymous queue stands, and the class is full (4 of 4)
    let mut newcomer = admission.admit(&Request::new(1, 0));
    assert!(poll(&mut newcomer).is_pending());
    let shed = admission.snapshot().shed;
    let outcomes: Vec<_> = parked.iter_mut().map(poll).collect();
    assert!(
        outcomes.iter().all(Poll::is_pending),
        "a waiter parked on alice's own cap was shed as server overload (shed = {shed}): {outcomes:?}"
    );
    drop((parked, old, newcomer, alice, anonymous));
}

/// `room.rs`, `enqueue`: the first review's fix (a class holding only parked waiters is not standing) is
/// undone by a tenant's *second* parked waiter. Its enqueue joins a flow that is parked already: no pass
/// runs, and `nonempty_since` — cleared when the first waiter parked — is set again, although the ring is
/// still empty. From then on the class "stands" on parked waiters alone: two seconds later an anonymous
/// request that finds the server full is given controlled delay's 500-ms target instead of its full wait,
/// and is shed (`NoCapacity`) 600 ms after it queued — its own queue formed 600 ms ago, less than the 1-s
/// interval. With one parked waiter (the first review's test) it keeps waiting. "A waiter held back only
/// by its own tenant's limits blocks nobody else" (README, mod.rs guarantee 3); `wait_policy.rs`: the
/// queue is FIFO with the full wait while it "holds only waiters parked on their own tenant's limits".
#[test]
fn a_second_parked_waiter_does_not_make_the_server_queue_stand() {
    fn anonymous_waiter_after_600_ms(alice_waiters: usize) -> Poll<Result<Permit, Rejection>> {
        let (clock, builder) = manual();
        let admission = builder.max_in_flight(2).tenant_defaults(TenantLimits::new().max_in_flight(1)).build().unwrap();
        let mut held = vec![admission.try_admit(&Request::new(1, 0).tenant("alice")).unwrap()];
        let mut parked: Vec<Admit> =
            (0..alice_waiters).map(|_| admission.admit(&Request::new(1, 0).tenant("alice"))).collect();
        for w in &mut parked {
            assert!(poll(w).is_pending(), "parked on alice's own cap");
        }
        clock.advance(Duration::from_secs(2));
        while let Ok(permit) = admission.try_admit(&Request::new(1, 0)) {
            held.push(permit);
        }
        assert_eq!(admission.snapshot().in_flight, 2, "the server is full");
        let mut anonymous = admission.admit(&Request::new(1, 0));
        assert!(poll(&mut anonymous).is_pending());
        clock.advance(Duration::from_millis(600));
        admission.expire_waiters();
        let outcome = poll(&mut anonymous);
        drop(parked);
        outcome
    }
    assert!(anonymous_waiter_after_600_ms(1).is_pending(), "control: one parked waiter (the first review's fix)");
    let two = anonymous_waiter_after_600_ms(2);
    assert!(two.is_pending(), "alice's second parked waiter made the class stand for everyone: {two:?}");
}

/// `rates.rs`, `Rates::charge`: a request bucket that can never pass again (`AcquireError::NeverFits`: the
/// configuration's lifetime allowance is spent, `bucket/mod.rs`) is read as `retry_after().unwrap_or(ZERO)`
/// and becomes a `RateLimited` refusal with a hint of 1 ns — and 1 ns later, and forever. ARCHITECTURE 5:
/// "`retry_after` is `None` exactly when retrying cannot succeed, otherwise never earlier than every limit
/// involved allows". The bucket is refused `NeverFits` once one configuration has run for 2^63 ns (a
/// `ManualClock` moved to its end; a monotonic clock after 219 years).
#[test]
fn a_request_rate_that_can_never_pass_again_is_not_a_1_ns_hint() {
    let clock = ManualClock::new();
    let admission =
        Admission::builder().deadline_timer(false).clock(clock.clone()).request_rate(1_000.0, 1).build().unwrap();
    clock.set_nanos(u64::MAX);
    let _first = admission.try_admit(&Request::new(1, 0)).unwrap();
    let refused = admission.try_admit(&Request::new(1, 0));
    clock.advance(Duration::from_secs(1)); // (a ManualClock at its end stays there)
    let again = admission.try_admit(&Request::new(1, 0));
    assert!(
        !matches!(refused, Err(Rejection::RateLimited { retry_after }) if retry_after < Duration::from_millis(1)),
        "the request rate can never pass again, yet the refusal is {refused:?}; one second later: {again:?}"
    );
}
