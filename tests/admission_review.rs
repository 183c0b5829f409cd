//! Adversarial review of the admission core: one deterministic test per guarantee, where features meet
//! (tenants × rates × resize × close × cancellation × user wakers × deadlines × the tenant registry).
//!
//! Each test states the guarantee it checks, quoting the documentation that makes it. Futures are polled by
//! hand with custom wakers; races are forced with a clock that stops a chosen thread at a chosen reading;
//! a watchdog (`within`) turns a deadlock into a failure instead of a hung test run.
#![cfg(not(loom))]

use kvgate::clock::{Clock, ManualClock};
use kvgate::{
    Admission, AdmissionBuilder, Admit, Limit, Permit, Priority, Rejection, Request, TenantId, TenantLimits, WaitPolicy,
};
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Wake, Waker};
use std::thread::{self, ThreadId};
use std::time::Duration;
use support::admission::poll_once as poll;
use support::{quiet_panics, within};

const SECOND: u64 = 1_000_000_000;

fn manual() -> (ManualClock, AdmissionBuilder<ManualClock>) {
    let clock = ManualClock::starting_at(1_000 * SECOND);
    // FIFO: the review's cases are about the FIFO guarantees (controlled delay has its own tests).
    let builder = Admission::builder().wait_policy(WaitPolicy::Fifo).deadline_timer(false).clock(clock.clone());
    (clock, builder)
}

/// An admission of 1000 KV tokens that gives each tenant half of them, with alice holding 400 of her 500.
fn alice_at_400_of_her_500() -> (Admission<ManualClock>, Permit) {
    let (_clock, builder) = manual();
    let admission =
        builder.kv_capacity_tokens(1000).tenant_defaults(TenantLimits::new().kv_share(0.5)).build().unwrap();
    let held = admission.try_admit(&Request::new(400, 0).tenant("alice")).unwrap();
    (admission, held)
}

fn poll_with(fut: &mut Admit, waker: &Waker) -> Poll<Result<Permit, Rejection>> {
    Pin::new(fut).poll(&mut Context::from_waker(waker))
}

/// A waker whose last reference, when dropped, drops a permit it owns (a task's state released with its
/// waker: user code that re-enters the admission).
struct OwnsAPermit(Mutex<Option<Permit>>);

impl Wake for OwnsAPermit {
    fn wake(self: Arc<Self>) {}
}

impl Drop for OwnsAPermit {
    fn drop(&mut self) {
        drop(self.0.lock().unwrap().take());
    }
}

/// A waker whose drop panics.
struct PanicsOnDrop;

impl Wake for PanicsOnDrop {
    fn wake(self: Arc<Self>) {}
}

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("injected: a waker that panics when dropped");
    }
}

// ---------------------------------------------------------------------------------------------------------
// User code under the waiting room's lock
//
// ARCHITECTURE.md invariant 8 / `admission/mod.rs` guarantee 5: "no user code (a waker) ever runs while the
// waiting room's lock is held"; `wake_list.rs`: "A waker is user code: it may be slow, take locks of its
// own, re-enter kvgate or panic. The dispatcher therefore never calls one while it holds the lock."

/// An admission of two slots, both taken: one permit for the caller to hold, the other owned by the
/// returned waker, so that the waker's last drop releases it (user code that re-enters the admission).
fn full_with_a_reentrant_waker() -> (Admission<ManualClock>, Permit, Waker) {
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(2).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 1)).unwrap();
    let owned = admission.try_admit(&Request::new(1, 1)).unwrap();
    let waker = Waker::from(Arc::new(OwnsAPermit(Mutex::new(Some(owned)))));
    (admission, held, waker)
}

/// Cancelling a queued `Admit` drops the waker it registered while the room's lock is held
/// (`Dispatcher::cancel`: `let _ = room.leave(..)` drops the returned wake-up inside the critical
/// section). A waker whose drop re-enters the admission — here it releases a permit, whose drop runs a
/// dispatch pass — deadlocks on the room's mutex.
#[test]
fn cancelling_a_waiter_drops_its_waker_outside_the_lock() {
    // The whole scenario runs on the watchdog's thread: on a deadlock only that thread is stuck (the test
    // thread must not drop the admission's permits, which would block on the same lock).
    within(Duration::from_secs(20), "dropping a queued Admit whose waker re-enters", || {
        let (admission, _held, waker) = full_with_a_reentrant_waker();
        let mut first = admission.admit(&Request::new(1, 1));
        assert!(poll_with(&mut first, &waker).is_pending());
        drop(waker); // the room's copy is now the last reference
        let mut second = admission.admit(&Request::new(1, 1));
        assert!(poll(&mut second).is_pending());
        drop(first);
        // The released permit's slot went to the next waiter.
        assert!(matches!(poll(&mut second), Poll::Ready(Ok(_))));
    });
}

/// Polling a queued `Admit` with a new waker drops the old one while the room's lock is held
/// (`Notify::update`: `*slot = Some(new.clone())`). Same re-entrant waker, same deadlock.
#[test]
fn repolling_with_a_new_waker_drops_the_old_one_outside_the_lock() {
    within(Duration::from_secs(20), "re-polling with another waker", || {
        let (admission, _held, waker) = full_with_a_reentrant_waker();
        let mut waiting = admission.admit(&Request::new(1, 1));
        assert!(poll_with(&mut waiting, &waker).is_pending());
        drop(waker);
        let _ = poll(&mut waiting);
        assert!(matches!(poll(&mut waiting), Poll::Ready(Ok(_))), "the released slot was not handed over");
    });
}

/// A waker's `clone` is user code too (a `RawWakerVTable` function); `Notify::update` calls it under the
/// room's lock when a waiter is polled with a waker that will not wake the same task.
#[test]
fn a_waiters_new_waker_is_cloned_outside_the_lock() {
    within(Duration::from_secs(20), "polling with a waker whose clone re-enters", || {
        let (_clock, builder) = manual();
        let admission = builder.max_in_flight(1).build().unwrap();
        let _held = admission.try_admit(&Request::new(1, 1)).unwrap();
        let mut waiting = admission.admit(&Request::new(1, 1));
        assert!(poll(&mut waiting).is_pending());
        let reentrant = admission.clone();
        // The clone hook calls a public method that takes the room's lock.
        let hook = CloneHook::waker(move || {
            reentrant.expire_waiters();
        });
        assert!(poll_with(&mut waiting, &hook).is_pending());
    });
}

/// A waker with a user-defined `clone`.
struct CloneHook {
    on_clone: Box<dyn Fn() + Send + Sync>,
}

impl CloneHook {
    fn waker(on_clone: impl Fn() + Send + Sync + 'static) -> Waker {
        let data = Arc::into_raw(Arc::new(CloneHook { on_clone: Box::new(on_clone) })).cast::<()>();
        // SAFETY: `data` comes from `Arc::into_raw` of a `CloneHook`, as every function of the vtable expects.
        unsafe { Waker::from_raw(RawWaker::new(data, &CLONE_HOOK_VTABLE)) }
    }
}

static CLONE_HOOK_VTABLE: RawWakerVTable =
    RawWakerVTable::new(clone_hook_clone, clone_hook_noop, clone_hook_noop, clone_hook_drop);

unsafe fn clone_hook_clone(data: *const ()) -> RawWaker {
    // SAFETY: `data` is an `Arc<CloneHook>` pointer (see `CloneHook::waker`); the count is bumped first.
    let hook = unsafe {
        Arc::increment_strong_count(data.cast::<CloneHook>());
        Arc::from_raw(data.cast::<CloneHook>())
    };
    (hook.on_clone)();
    RawWaker::new(Arc::into_raw(hook).cast::<()>(), &CLONE_HOOK_VTABLE)
}

unsafe fn clone_hook_noop(_: *const ()) {}

unsafe fn clone_hook_drop(data: *const ()) {
    // SAFETY: `data` is an `Arc<CloneHook>` pointer owned by the waker being dropped.
    drop(unsafe { Arc::from_raw(data.cast::<CloneHook>()) });
}

/// A waker whose drop panics, dropped by the cancellation of its queued `Admit`, unwinds out of
/// `Dispatcher::cancel` half-way: the waiter's rate charges are never refunded (conservation) and the pass
/// that should let the next waiter move up never runs ("a panicking waker cannot stop admission").
#[test]
fn a_waker_that_panics_on_drop_leaks_nothing_and_stops_nothing() {
    quiet_panics();
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(4).kv_capacity_tokens(1000).request_rate(0.001, 10).build().unwrap();
    let requests_left = |a: &Admission<ManualClock>| a.rate_status(None).requests.unwrap().remaining;
    let _held = admission.try_admit(&Request::new(500, 0)).unwrap();
    // The head needs 600 of the 500 free units; the one behind it needs 100 and waits behind it (FIFO).
    let mut head = admission.admit(&Request::new(600, 0));
    let waker = Waker::from(Arc::new(PanicsOnDrop));
    assert!(poll_with(&mut head, &waker).is_pending());
    drop(waker); // not the last reference: the room's copy is, and its drop is the one that panics
    let mut behind = admission.admit(&Request::new(100, 0));
    assert!(poll(&mut behind).is_pending());
    assert_eq!(requests_left(&admission), 7);
    let unwound = catch_unwind(AssertUnwindSafe(move || drop(head))).is_err();
    let refunded = requests_left(&admission) == 8;
    let moved_up = matches!(poll(&mut behind), Poll::Ready(Ok(_)));
    assert!(
        refunded && moved_up,
        "dropping the Admit unwound: {unwound}; its request-rate charge refunded: {refunded}; the waiter \
         behind it moved up: {moved_up}; {:?}",
        admission.snapshot()
    );
}

// ---------------------------------------------------------------------------------------------------------
// Runtime limits × tenants

/// README "Runtime limits": "Growing admits waiters at once"; `set_kv_capacity`: "Growing it admits
/// waiters at once ... Tenant shares follow the new budget." A waiter parked on its tenant's KV share stays
/// parked after the budget (and so the share) grew: `resized` runs a pass over the rings only, and parked
/// flows come back only when their tenant releases something.
#[test]
fn growing_the_kv_budget_admits_waiters_parked_on_their_share() {
    let (admission, _held) = alice_at_400_of_her_500();
    let mut waiting = admission.admit(&Request::new(200, 0).tenant("alice"));
    assert!(poll(&mut waiting).is_pending(), "400 + 200 is over alice's share of 500");
    admission.set_kv_capacity(2000).unwrap(); // alice's share is 1000 now
    assert!(
        matches!(poll(&mut waiting), Poll::Ready(Ok(_))),
        "still waiting after the budget doubled: {:?}",
        admission.snapshot()
    );
}

// ---------------------------------------------------------------------------------------------------------
// Priorities × tenants

/// `Priority`: "Waiting requests of a higher class are always served before any request of a lower class
/// (strict priority)"; tenant module: "Within a tenant nobody overtakes a parked waiter — not even the
/// tenant's own `try_admit`". A tenant's `Interactive` waiter parked on its KV share is overtaken by the same
/// tenant's `Normal` `admit` for the same limit: the new waiter starts a new flow in its own class, whose
/// ring is not empty, and the pass takes the tenant's capacity for it (takes for waiters ignore the parked
/// bits). The same request through `try_admit` is refused, as documented.
#[test]
fn a_tenants_lower_class_admit_does_not_overtake_its_parked_higher_class_waiter() {
    let (admission, _held) = alice_at_400_of_her_500();
    let mut urgent = admission.admit(&Request::new(200, 0).tenant("alice").priority(Priority::Interactive));
    assert!(poll(&mut urgent).is_pending());
    let small = Request::new(50, 0).tenant("alice").priority(Priority::Normal);
    assert!(
        matches!(admission.try_admit(&small), Err(Rejection::RateLimited { .. })),
        "try_admit respects the parked Interactive waiter"
    );
    let mut later = admission.admit(&small);
    let overtook = matches!(poll(&mut later), Poll::Ready(Ok(_)));
    assert!(!overtook, "a Normal admit of alice took her share while her Interactive waiter waits for it");
}

// ---------------------------------------------------------------------------------------------------------
// Honest hints
//
// ARCHITECTURE.md invariant 5: "`retry_after` is `None` exactly when retrying cannot succeed, and otherwise
// no earlier than the time every limit involved would allow."

/// A request refused for capacity gets a hint from hold times alone, even when a rate it must also pass
/// will not let it through for far longer: retrying at the hint is refused again.
#[test]
fn a_capacity_hint_is_no_earlier_than_the_rates_allow() {
    let (clock, builder) = manual();
    // One request per 1000 s; the one in flight took the only token.
    let admission = builder.max_in_flight(1).request_rate(0.001, 1).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 1)).unwrap();
    let rejection = admission.try_admit(&Request::new(1, 1)).unwrap_err();
    let Rejection::NoCapacity { retry_after } = rejection else { panic!("{rejection:?}") };
    // Retry when told to, with the slot free by then.
    clock.advance(retry_after);
    drop(held);
    let retried = admission.try_admit(&Request::new(1, 1));
    assert!(
        retried.is_ok(),
        "told to retry after {retry_after:?}, the retry was refused again: {:?}",
        retried.unwrap_err()
    );
}

/// `TooLarge` has no hint ("can never fit"), but a configured tenant crowded into the overflow tenant is
/// measured against the *default* limits: `TooLarge { TenantKvShare }` with `retry_after() == None`, and the
/// same request succeeds once the registry has room again.
#[test]
fn too_large_is_only_for_requests_that_can_never_fit() {
    let (clock, builder) = manual();
    let vip = TenantId::from("vip");
    // A tenant id in the same registry shard as "vip" (the shard is `(id ^ id >> 32) % 16`).
    let neighbour = TenantId::from((vip.get() ^ (vip.get() >> 32)) % 16);
    let admission = builder
        .kv_capacity_tokens(1000)
        .tenant_defaults(TenantLimits::new().kv_share(0.1))
        .tenant_limits("vip", TenantLimits::new())
        .max_tenants(1) // the neighbour fills the registry
        .tenant_idle_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let busy = admission.try_admit(&Request::new(10, 0).tenant(neighbour)).unwrap();
    let first = admission.try_admit(&Request::new(500, 0).tenant("vip"));
    drop(busy);
    clock.advance(Duration::from_secs(2));
    let second = admission.try_admit(&Request::new(500, 0).tenant("vip"));
    assert!(second.is_ok(), "{second:?}");
    // Configured tenants are always tracked: "vip" is measured against its own limits from the start.
    assert!(first.is_ok(), "vip was refused by limits that are not its own: {first:?}");
}

// ---------------------------------------------------------------------------------------------------------
// Deadlines

/// `Admission::admit`: "A request that waits longer than its limit (`Request::max_wait` ...) resolves to
/// `Rejection::TimedOut`". A pass grants waiters without looking at their deadlines: capacity released
/// after a waiter's deadline goes to that waiter (which then resolves `Ok`) instead of the next one in time.
#[test]
fn a_waiter_past_its_deadline_is_not_granted() {
    let (clock, builder) = manual();
    let admission = builder.max_in_flight(1).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 1)).unwrap();
    let mut impatient = admission.admit(&Request::new(1, 1).max_wait(Duration::from_secs(1)));
    assert!(poll(&mut impatient).is_pending());
    let mut patient = admission.admit(&Request::new(1, 1));
    assert!(poll(&mut patient).is_pending());
    clock.advance(Duration::from_secs(5));
    drop(held); // 5 s after it queued, 4 s after its deadline
    assert!(
        matches!(poll(&mut impatient), Poll::Ready(Err(Rejection::TimedOut))),
        "a request with max_wait 1 s was admitted after waiting 5 s"
    );
    assert!(matches!(poll(&mut patient), Poll::Ready(Ok(_))));
}

// ---------------------------------------------------------------------------------------------------------
// The tenant registry

/// `max_tenants`: "Most tenants tracked at once ...; beyond it, new tenants share one overflow tenant";
/// README: "when no room can be made, new tenants share one overflow tenant". The bound is split evenly over
/// 16 shards, so with `max_tenants(4)` twelve shards hold nothing: two new tenants with an empty registry
/// already share the overflow tenant's limits, and one refuses the other.
#[test]
fn new_tenants_get_their_own_limits_while_the_registry_has_room() {
    let (_clock, builder) = manual();
    let admission = builder.max_tenants(4).tenant_defaults(TenantLimits::new().max_in_flight(1)).build().unwrap();
    let _first = admission.try_admit(&Request::new(1, 1).tenant(TenantId::from(5))).unwrap();
    let second = admission.try_admit(&Request::new(1, 1).tenant(TenantId::from(6)));
    assert!(
        second.is_ok(),
        "tenant 6 has nothing in flight, {} of at most 4 tenants are tracked, yet: {:?}",
        admission.tracked_tenants(),
        second.unwrap_err()
    );
}

// ---------------------------------------------------------------------------------------------------------
// Fair sharing

/// README "Fair sharing": "A tenant with 500 queued requests delays another tenant's request by its weight
/// per round, not by 500." The waiting room's bound is per class, shared by every tenant: a tenant whose
/// waiters fill it makes every other tenant's `admit` fail with `QueueFull` instead of waiting one turn.
#[test]
fn one_tenant_cannot_take_every_place_in_the_waiting_room() {
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(1).queue_capacity(4).tenant_defaults(TenantLimits::new()).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 1)).unwrap();
    let mut flood: Vec<Admit> = (0..4).map(|_| admission.admit(&Request::new(1, 1).tenant("flood"))).collect();
    for waiting in &mut flood {
        assert!(poll(waiting).is_pending());
    }
    let mut other = admission.admit(&Request::new(1, 1).tenant("bob"));
    let outcome = poll(&mut other);
    assert!(outcome.is_pending(), "bob was refused instead of waiting one turn: {outcome:?}");
    drop(held);
    let _flood_first = flood.remove(0);
    assert!(matches!(poll(&mut other), Poll::Pending | Poll::Ready(Ok(_))));
}

// ---------------------------------------------------------------------------------------------------------
// Configuration

/// STYLE.md: "Configuration mistakes are found when the value is built"; brief: bad input gets a clear
/// error. A tenant KV share without a KV budget is accepted and limits nothing (a share of "unlimited").
#[test]
fn a_kv_share_without_a_kv_budget_is_a_configuration_error() {
    let built = Admission::builder().tenant_defaults(TenantLimits::new().kv_share(0.1)).build();
    let Ok(admission) = built else { return };
    let huge = admission.try_admit(&Request::new(u32::MAX, u32::MAX).tenant("alice"));
    panic!("kv_share(0.1) without a KV budget was accepted; alice then took {:?}", huge.map(|p| p.kv_reserved()));
}

// ---------------------------------------------------------------------------------------------------------
// Linearizable close

/// A clock that stops one chosen thread at its next reading until released, so that a race can be forced
/// at an exact point of `try_admit`.
#[derive(Debug, Clone)]
struct GateClock {
    time: ManualClock,
    gate: Arc<Gate>,
}

#[derive(Debug, Default)]
struct Gate {
    armed: Mutex<Option<ThreadId>>,
    reached: Mutex<Option<mpsc::Sender<()>>>,
    release: Mutex<Option<mpsc::Receiver<()>>>,
    stopped: AtomicUsize,
}

impl Clock for GateClock {
    fn now_nanos(&self) -> u64 {
        let me = thread::current().id();
        let stop = {
            let mut armed = self.gate.armed.lock().unwrap();
            let stop = *armed == Some(me);
            if stop {
                *armed = None;
            }
            stop
        };
        if stop {
            self.gate.stopped.fetch_add(1, Ordering::SeqCst);
            let reached = self.gate.reached.lock().unwrap().take().unwrap();
            let release = self.gate.release.lock().unwrap().take().unwrap();
            reached.send(()).unwrap();
            release.recv().unwrap();
        }
        self.time.now_nanos()
    }
}

/// `Admission::close`: "Linearizable: once `close` returns, nothing more is granted — not to a waiter, not
/// by a dispatch pass running on another thread, not by a `try_admit` racing it." A `try_admit` that took
/// its slot before `close` charges its rate after `close` returned: an observer that saw the admission
/// closed and the token unspent then sees a permit granted on that token. (Re-checking `CLOSED` after the
/// last charge, and rolling back, would make the permit's effects all precede `close`.)
#[test]
fn a_try_admit_racing_close_takes_nothing_after_close_returns() {
    let clock = GateClock { time: ManualClock::starting_at(SECOND), gate: Arc::default() };
    let admission = Admission::builder()
        .deadline_timer(false)
        .clock(clock.clone())
        .max_in_flight(1)
        .request_rate(0.001, 1)
        .build()
        .unwrap();
    let (reached_tx, reached_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *clock.gate.reached.lock().unwrap() = Some(reached_tx);
    *clock.gate.release.lock().unwrap() = Some(release_rx);
    let racer = {
        let admission = admission.clone();
        let gate = Arc::clone(&clock.gate);
        thread::spawn(move || {
            *gate.armed.lock().unwrap() = Some(thread::current().id());
            admission.try_admit(&Request::new(1, 1)).map(|permit| permit.kv_reserved())
        })
    };
    reached_rx.recv().unwrap(); // the racer holds its slot and is about to read the clock and charge
    admission.close();
    let tokens_after_close = admission.rate_status(None).requests.unwrap().remaining;
    release_tx.send(()).unwrap();
    let raced = racer.join().unwrap();
    let tokens_at_end = admission.rate_status(None).requests.unwrap().remaining;
    assert_eq!(clock.gate.stopped.load(Ordering::SeqCst), 1);
    assert!(
        raced.is_err() || tokens_after_close == tokens_at_end,
        "close() returned, then the request token was still unspent ({tokens_after_close} left), then a \
         try_admit racing close was granted on it ({tokens_at_end} left)"
    );
}

// ---------------------------------------------------------------------------------------------------------
// Checks that hold (kept as regression tests)

/// Conservation across a grant cancelled before collection, with tenant caps, shares and rates on both
/// levels: the grant is handed to the next waiter (global and tenant), every bucket comes back whole.
#[test]
fn a_cancelled_grant_hands_over_every_unit_and_refunds_every_bucket() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_in_flight(1)
        .kv_capacity_tokens(1000)
        .request_rate(0.001, 10)
        .token_rate(0.001, 10_000)
        .tenant_defaults(
            TenantLimits::new().max_in_flight(1).kv_share(0.5).request_rate(0.001, 10).token_rate(0.001, 10_000),
        )
        .build()
        .unwrap();
    let left = |a: &Admission<ManualClock>, t: Option<&str>| {
        let s = a.rate_status(t.map(TenantId::from));
        (s.requests.unwrap().remaining, s.tokens.unwrap().remaining)
    };
    let held = admission.try_admit(&Request::new(100, 0).tenant("alice")).unwrap();
    let mut granted_then_dropped = admission.admit(&Request::new(200, 0).tenant("alice"));
    assert!(poll(&mut granted_then_dropped).is_pending());
    let mut next = admission.admit(&Request::new(300, 0).tenant("alice"));
    assert!(poll(&mut next).is_pending());
    drop(held);
    drop(granted_then_dropped); // granted by the release, never collected
    let permit = match poll(&mut next) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("{other:?}"),
    };
    assert_eq!(admission.snapshot().kv_used, 300);
    drop(permit);
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0));
    // Spent: held (1 request, 100 tokens) and next (1, 300); the dropped grant's charge came back.
    assert_eq!(left(&admission, None), (8, 9_600));
    assert_eq!(left(&admission, Some("alice")), (8, 9_600));
}

/// Close × parked tenant flows × a grant not yet collected: close resolves every waiter, keeps the grant
/// made before it, clears every held-back bit (later requests after a reopen are impossible, so check that
/// nothing is left counted).
#[test]
fn close_with_parked_and_granted_waiters_returns_everything() {
    let (_clock, builder) = manual();
    let admission = builder
        .max_in_flight(2)
        .kv_capacity_tokens(1000)
        .tenant_defaults(TenantLimits::new().max_in_flight(1))
        .build()
        .unwrap();
    let alice = admission.try_admit(&Request::new(1, 1).tenant("alice")).unwrap();
    let bob = admission.try_admit(&Request::new(1, 1).tenant("bob")).unwrap();
    let mut parked = admission.admit(&Request::new(1, 1).tenant("alice"));
    assert!(poll(&mut parked).is_pending());
    let mut global = admission.admit(&Request::new(1, 1));
    assert!(poll(&mut global).is_pending());
    drop(bob); // grants `global`
    admission.close();
    assert!(matches!(poll(&mut parked), Poll::Ready(Err(Rejection::Closed))));
    let granted = match poll(&mut global) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("a grant made before close was lost: {other:?}"),
    };
    drop((granted, alice));
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0));
    assert!(matches!(admission.try_admit(&Request::new(1, 1)), Err(Rejection::Closed)));
}

/// A waker that re-enters from `wake` (outside the lock): it drops its own permit, polls another future
/// and calls `try_admit`. Nothing deadlocks, nobody is overtaken, everything comes back.
#[test]
fn a_waker_that_reenters_from_wake_is_served() {
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(1).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 1)).unwrap();
    let mut first = admission.admit(&Request::new(1, 1));
    let second = Arc::new(Mutex::new(admission.admit(&Request::new(1, 1))));
    struct Reenter {
        admission: Admission<ManualClock>,
        second: Arc<Mutex<Admit>>,
        seen: Mutex<Vec<String>>,
    }
    impl Wake for Reenter {
        fn wake(self: Arc<Self>) {
            let refused = self.admission.try_admit(&Request::new(1, 1));
            let polled = poll(&mut self.second.lock().unwrap());
            self.seen.lock().unwrap().push(format!("{:?} {:?}", refused.err(), polled.is_pending()));
        }
    }
    let reenter =
        Arc::new(Reenter { admission: admission.clone(), second: Arc::clone(&second), seen: Mutex::default() });
    assert!(poll_with(&mut first, &Waker::from(Arc::clone(&reenter))).is_pending());
    assert!(poll(&mut second.lock().unwrap()).is_pending());
    within(Duration::from_secs(20), "a re-entrant wake", move || drop(held));
    assert_eq!(reenter.seen.lock().unwrap().len(), 1);
    assert!(reenter.seen.lock().unwrap()[0].starts_with("Some(NoCapacity"), "{:?}", reenter.seen);
    let permit = match poll(&mut first) {
        Poll::Ready(Ok(permit)) => permit,
        other => panic!("{other:?}"),
    };
    drop(permit);
    assert!(matches!(poll(&mut second.lock().unwrap()), Poll::Ready(Ok(_))));
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0));
}

/// Shrinking a tenant's share (through the budget) below a parked waiter ends it `TooLarge` and clears the
/// tenant's parked bit: the tenant's later requests are not held back by a waiter that is gone.
#[test]
fn a_parked_waiter_ended_by_a_resize_holds_nobody_back() {
    let (admission, held) = alice_at_400_of_her_500();
    let mut parked = admission.admit(&Request::new(300, 0).tenant("alice"));
    assert!(poll(&mut parked).is_pending());
    admission.set_kv_capacity(500).unwrap(); // share 250 < 300
    assert!(matches!(
        poll(&mut parked),
        Poll::Ready(Err(Rejection::TooLarge { limit: Limit::TenantKvShare, requested: 300, capacity: 250 }))
    ));
    drop(held);
    assert!(admission.try_admit(&Request::new(200, 0).tenant("alice")).is_ok());
}

/// The waiting room's slab across chunks (more than 32 waiters), with slots reused through the free list
/// and grants made on other threads while the owners read their slot's generation without the lock:
/// every waiter is served once, in order, and everything comes back. Small enough for miri
/// (`cargo +nightly miri test --test admission_review slab`).
#[test]
fn the_slab_serves_every_waiter_once_across_chunks_and_threads() {
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(1).queue_capacity(100).build().unwrap();
    let mut held = Some(admission.try_admit(&Request::new(1, 1)).unwrap());
    for round in 0..2 {
        let mut waiting: Vec<Admit> = (0..40).map(|_| admission.admit(&Request::new(1, 1))).collect();
        for w in &mut waiting {
            assert!(poll(w).is_pending());
        }
        // Give up every third place (slots go back to the free list; the next round reuses them).
        let mut kept = Vec::new();
        for (i, w) in waiting.into_iter().enumerate() {
            if i % 3 == 1 {
                drop(w);
            } else {
                kept.push(w);
            }
        }
        assert_eq!(admission.snapshot().queued, kept.len(), "round {round}");
        for mut w in kept {
            let previous = held.take().unwrap();
            thread::spawn(move || drop(previous)).join().unwrap();
            match poll(&mut w) {
                Poll::Ready(Ok(permit)) => held = Some(permit),
                other => panic!("round {round}: {other:?}"),
            }
        }
    }
    drop(held);
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0));
}

/// `Admission::rate_status`: "The rate limits a request of `tenant` ... meets now". A tenant crowded into
/// the overflow tenant is charged to the overflow tenant's buckets, but its status is reported as an
/// untracked tenant's: full. The `x-ratelimit-remaining-*` headers then say "10 left" to a client whose
/// next request is refused.
#[test]
fn rate_status_reports_the_buckets_a_tenant_is_charged_to() {
    let (_clock, builder) = manual();
    let admission = builder.max_tenants(4).tenant_defaults(TenantLimits::new().token_rate(0.001, 10)).build().unwrap();
    let crowded = TenantId::from(5); // a shard with no room (see `new_tenants_get_their_own_limits...`)
    drop(admission.try_admit(&Request::new(10, 0).tenant(crowded)).unwrap());
    let status = admission.rate_status(Some(crowded)).tokens.unwrap();
    let next = admission.try_admit(&Request::new(1, 0).tenant(crowded));
    assert!(
        next.is_ok() || status.remaining == 0,
        "rate_status said {} tokens remain, the next 1-token request got {:?}",
        status.remaining,
        next.unwrap_err()
    );
}

/// `Credit` (capacity.rs): "a hand-over never admits what a release followed by a take would refuse (after a
/// limit shrank below the use, nothing is handed over until the use is below the limit again)". Both limits.
#[test]
fn a_hand_over_after_a_shrink_admits_only_what_fits_the_new_limits() {
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(3).kv_capacity_tokens(1000).build().unwrap();
    let big = admission.try_admit(&Request::new(600, 0)).unwrap();
    let small = admission.try_admit(&Request::new(300, 0)).unwrap();
    let mut waiting = admission.admit(&Request::new(200, 0));
    assert!(poll(&mut waiting).is_pending());
    admission.set_kv_capacity(500).unwrap();
    drop(small); // 600 in use > 500: nothing may be handed over
    assert!(poll(&mut waiting).is_pending());
    assert_eq!(admission.snapshot().kv_used, 600);
    drop(big);
    assert!(matches!(poll(&mut waiting), Poll::Ready(Ok(_))));

    let admission = manual().1.max_in_flight(2).build().unwrap();
    let first = admission.try_admit(&Request::new(1, 0)).unwrap();
    let second = admission.try_admit(&Request::new(1, 0)).unwrap();
    let mut waiting = admission.admit(&Request::new(1, 0));
    assert!(poll(&mut waiting).is_pending());
    admission.set_max_in_flight(1).unwrap();
    drop(first); // 1 in flight, limit 1
    assert!(poll(&mut waiting).is_pending());
    assert_eq!(admission.snapshot().in_flight, 1);
    drop(second);
    assert!(matches!(poll(&mut waiting), Poll::Ready(Ok(_))));
    assert_eq!(admission.snapshot().in_flight, 0);
}

/// `admit_blocking` × `close`: a thread parked without a deadline is woken by `close` and returns `Closed`;
/// its place is given back.
#[test]
fn close_wakes_a_blocked_thread() {
    let (_clock, builder) = manual();
    let admission = builder.max_in_flight(1).build().unwrap();
    let held = admission.try_admit(&Request::new(1, 1)).unwrap();
    let blocked = {
        let admission = admission.clone();
        thread::spawn(move || admission.admit_blocking(&Request::new(1, 1), None).map(|_| ()))
    };
    while admission.snapshot().queued == 0 {
        thread::yield_now();
    }
    admission.close();
    let outcome = within(Duration::from_secs(20), "a blocked thread after close", move || blocked.join().unwrap());
    assert_eq!(outcome, Err(Rejection::Closed));
    drop(held);
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0));
}

/// Conservation where everything meets, on threads: tenants (caps, shares, rates), global rates, waiters
/// polled by hand and cancelled at random (queued, granted-but-uncollected), priorities, deadlines ended by
/// `expire_waiters`, and a thread resizing both limits, then `close`. At quiescence every slot, KV unit and
/// rate token — global and per tenant — is back, except exactly the charges of the permits granted.
#[test]
fn conservation_where_everything_meets() {
    const BURST: u64 = 1 << 41;
    const TENANT_REQUESTS: u32 = u32::MAX / 2;
    const TENANT_TOKENS: u64 = 1 << 40;
    let (clock, builder) = manual();
    let admission = builder
        .max_in_flight(8)
        .kv_capacity_tokens(4_000)
        .queue_capacity(16)
        .request_rate(0.001, u32::MAX)
        .token_rate(0.001, BURST)
        .tenant_defaults(
            // Smaller bursts than the global ones, so that `rate_status` (the tighter of the global bucket and
            // the tenant's) shows the tenant's.
            TenantLimits::new()
                .max_in_flight(3)
                .kv_share(0.5)
                .request_rate(0.001, TENANT_REQUESTS)
                .token_rate(0.001, TENANT_TOKENS),
        )
        .tenant_limits("heavy", TenantLimits::new().max_in_flight(6).weight(3))
        .build()
        .unwrap();
    let tenants = ["alice", "bob", "heavy"];
    let granted = Arc::new(Mutex::new(std::collections::HashMap::<Option<&'static str>, (u64, u64)>::new()));
    let ops = if cfg!(miri) { 100 } else { 3_000 };
    let workers: Vec<_> = (0..3u64)
        .map(|seed| {
            let admission = admission.clone();
            let granted = Arc::clone(&granted);
            thread::spawn(move || {
                let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (seed + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
                let mut next = move || {
                    rng ^= rng >> 12;
                    rng ^= rng << 25;
                    rng ^= rng >> 27;
                    rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
                };
                let mut held: Vec<Permit> = Vec::new();
                let mut waiting: Vec<(Admit, Option<&'static str>, u64)> = Vec::new();
                let count = |tenant: Option<&'static str>, tokens: u64| {
                    let mut g = granted.lock().unwrap();
                    let e = g.entry(tenant).or_default();
                    e.0 += 1;
                    e.1 += tokens;
                };
                for _ in 0..ops {
                    let r = next();
                    let tenant = match r % 4 {
                        0 => None,
                        n => Some(tenants[(n - 1) as usize]),
                    };
                    let tokens = 50 + (r >> 8) % 700;
                    let priority = [Priority::Batch, Priority::Normal, Priority::Interactive][((r >> 20) % 3) as usize];
                    let mut request = Request::new(tokens as u32, 0).priority(priority);
                    if let Some(t) = tenant {
                        request = request.tenant(t);
                    }
                    if (r >> 30) % 5 == 0 {
                        request = request.max_wait(Duration::from_secs(1));
                    }
                    match (r >> 24) % 6 {
                        0 | 1 => {
                            if let Ok(p) = admission.try_admit(&request) {
                                count(tenant, tokens);
                                held.push(p);
                            }
                        }
                        2 | 3 => {
                            let mut fut = admission.admit(&request);
                            match poll(&mut fut) {
                                Poll::Ready(Ok(p)) => {
                                    count(tenant, tokens);
                                    held.push(p);
                                }
                                Poll::Ready(Err(_)) => {}
                                Poll::Pending => waiting.push((fut, tenant, tokens)),
                            }
                        }
                        4 => {
                            // Generations end: half of this worker's permits go back.
                            let keep = held.len() / 2;
                            held.truncate(keep);
                        }
                        _ => {
                            if !waiting.is_empty() && (r >> 50) % 3 == 0 {
                                // Cancelled: queued, or granted and never collected.
                                let i = (r >> 40) as usize % waiting.len();
                                drop(waiting.swap_remove(i));
                            }
                            // An executor's turn: every waiter is polled, grants are collected.
                            for (mut fut, tenant, tokens) in std::mem::take(&mut waiting) {
                                match poll(&mut fut) {
                                    Poll::Ready(Ok(p)) => {
                                        count(tenant, tokens);
                                        held.push(p);
                                    }
                                    Poll::Ready(Err(_)) => {}
                                    Poll::Pending => waiting.push((fut, tenant, tokens)),
                                }
                            }
                        }
                    }
                    let s = admission.snapshot();
                    assert!(s.kv_used <= 4_000 + 2_000, "{s:?}");
                    for (id, n) in admission.busiest_tenants(4) {
                        let cap = if id == TenantId::from("heavy") { 6 } else { 3 };
                        assert!(n <= cap, "{id} holds {n} > {cap}");
                    }
                }
                drop(held); // a finished worker holds nothing that would starve the others
                waiting
            })
        })
        .collect();
    let resizer = {
        let admission = admission.clone();
        let clock = clock.clone();
        thread::spawn(move || {
            for i in 0..if cfg!(miri) { 20 } else { 500 } {
                admission.set_kv_capacity([4_000, 2_500, 6_000][i % 3]).unwrap();
                admission.set_max_in_flight([8, 3, 12][i % 3]).unwrap();
                if i % 50 == 0 {
                    clock.advance(Duration::from_millis(300));
                    admission.expire_waiters();
                }
                thread::yield_now();
            }
            admission.set_kv_capacity(4_000).unwrap();
            admission.set_max_in_flight(8).unwrap();
        })
    };
    let mut left = Vec::new();
    for w in workers {
        left.push(w.join().unwrap());
    }
    resizer.join().unwrap();
    admission.close();
    for waiting in left {
        for (mut fut, tenant, tokens) in waiting {
            match poll(&mut fut) {
                Poll::Ready(Ok(p)) => {
                    let mut g = granted.lock().unwrap();
                    let e = g.entry(tenant).or_default();
                    e.0 += 1;
                    e.1 += tokens;
                    drop(p);
                }
                Poll::Ready(Err(_)) => {}
                Poll::Pending => panic!("a waiter still waits after close"),
            }
        }
    }
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0), "{s:?}");
    assert_eq!(admission.busiest_tenants(8), Vec::new());
    let granted = granted.lock().unwrap();
    let total = granted.values().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert!(total.0 >= 20, "the workload admitted too little to prove anything: {total:?} {:?}", admission.snapshot());
    let global = admission.rate_status(None);
    assert_eq!(
        (global.requests.unwrap().remaining, global.tokens.unwrap().remaining),
        (u64::from(u32::MAX) - total.0, BURST - total.1),
        "global buckets"
    );
    for t in ["alice", "bob"] {
        let (n, tokens) = granted.get(&Some(t)).copied().unwrap_or_default();
        let status = admission.rate_status(Some(TenantId::from(t)));
        assert_eq!(
            (status.requests.unwrap().remaining, status.tokens.unwrap().remaining),
            (u64::from(TENANT_REQUESTS) - n, TENANT_TOKENS - tokens),
            "{t}'s buckets"
        );
    }
}

/// `Admission::try_admit`: "Cost: a few compare-and-swaps ..., no lock and no allocation — for a request
/// without a tenant, or of a tenant already tracked ... Exceptions, stated exactly: ... a granted request
/// of a tenant that has waiters runs a pass". The instrument holds the waiting room's lock for real
/// (`__hold_waiting_room`); an operation that finishes while it is held took no lock. The documented
/// exception is the control that shows the instrument can fail: a `try_admit` of a tenant with a waiter
/// must *not* finish while the lock is held, and does once it is released.
#[test]
fn try_admit_of_a_known_tenant_takes_no_lock() {
    let (admission, _hers) = alice_at_400_of_her_500();
    let mut parked = admission.admit(&Request::new(200, 0).tenant("alice").priority(Priority::Batch));
    assert!(poll(&mut parked).is_pending(), "400 + 200 is over alice's share of 500");
    let mut big = admission.admit(&Request::new(700, 0)); // waits for global KV
    assert!(poll(&mut big).is_pending());
    // bob is tracked, and has no waiter.
    drop(admission.try_admit(&Request::new(10, 0).tenant("bob").priority(Priority::Interactive)).unwrap());
    let try_admit_on_a_thread = |request: Request| {
        let admission = admission.clone();
        let (tx, rx) = mpsc::channel();
        // The permit is sent back, not dropped: its drop would run a pass (others wait) and take the lock.
        let thread = thread::spawn(move || tx.send(admission.try_admit(&request)).unwrap());
        (thread, rx)
    };
    let guard = admission.__hold_waiting_room();
    let (t1, anonymous) = try_admit_on_a_thread(Request::new(10, 0).priority(Priority::Interactive));
    let (t2, bob) = try_admit_on_a_thread(Request::new(20, 0).tenant("bob").priority(Priority::Interactive));
    let (t3, alice) = try_admit_on_a_thread(Request::new(50, 0).tenant("alice").priority(Priority::Interactive));
    let anonymous = anonymous.recv_timeout(Duration::from_secs(10));
    let bob = bob.recv_timeout(Duration::from_secs(10));
    // The control: alice has a waiter, so her granted request runs a pass and waits for the lock.
    let alice_while_held = alice.recv_timeout(Duration::from_millis(200));
    drop(guard);
    let alice = alice_while_held.map_err(|_| alice.recv().unwrap());
    for t in [t1, t2, t3] {
        t.join().unwrap();
    }
    assert_eq!(anonymous.as_ref().map(|r| r.as_ref().map(Permit::kv_reserved)), Ok(Ok(10)), "anonymous: took a lock");
    assert_eq!(bob.as_ref().map(|r| r.as_ref().map(Permit::kv_reserved)), Ok(Ok(20)), "bob: took a lock");
    let Err(alice) = alice else {
        panic!("the instrument does not hold the lock: alice's try_admit (documented to run a pass) finished")
    };
    assert_eq!(alice.as_ref().map(Permit::kv_reserved), Ok(50));
}
