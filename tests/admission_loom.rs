//! loom models of the admission core: racing admits and drops never exceed a limit and return
//! everything; a release racing a cancellation loses no wake-up and grants nothing twice; FIFO holds
//! between two waiters and a releaser; a tenant's path (the tenant registry's read-write locks and its
//! global count, which go through the `sync` shim) keeps every tenant limit and bucket whole and never
//! tracks more tenants than `max_tenants`.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 cargo test --release --test admission_loom`
#![cfg(loom)]

use futures::FutureExt;
use kvgate::{Admission, Request};
use loom::thread;
use std::future::Future;

fn req(tokens: u32) -> Request {
    Request::new(tokens, 0)
}

#[test]
fn two_threads_admit_and_drop_within_limits() {
    loom::model(|| {
        let a = Admission::builder().max_in_flight(1).kv_capacity_tokens(10).queue_capacity(0).build().unwrap();
        let a2 = a.clone();
        let t = thread::spawn(move || {
            let p = a2.try_admit(&req(6)).ok();
            let s = a2.snapshot();
            assert!(s.in_flight <= 1 && s.kv_used <= 10);
            drop(p);
        });
        let p = a.try_admit(&req(6)).ok();
        let s = a.snapshot();
        assert!(s.in_flight <= 1 && s.kv_used <= 10);
        drop(p);
        t.join().unwrap();
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.kv_used), (0, 0));
    });
}

#[test]
fn enqueue_racing_a_release_loses_no_wakeup() {
    loom::model(|| {
        let a = Admission::builder().max_in_flight(1).queue_capacity(2).build().unwrap();
        let held = a.try_admit(&req(1)).unwrap();
        let releaser = thread::spawn(move || drop(held));
        let mut waiting = a.admit(&req(1));
        let first = (&mut waiting).now_or_never();
        releaser.join().unwrap();
        // Either it was admitted at once, or the release granted it: it must not be stuck.
        let permit = match first {
            Some(result) => result.unwrap(),
            None => waiting.now_or_never().expect("lost wake-up: capacity free but waiter pending").unwrap(),
        };
        drop(permit);
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.queued), (0, 0));
    });
}

#[test]
fn release_racing_cancellation_leaks_nothing() {
    loom::model(|| {
        let a = Admission::builder().max_in_flight(1).kv_capacity_tokens(4).queue_capacity(2).build().unwrap();
        let held = a.try_admit(&req(2)).unwrap();
        let mut waiting = a.admit(&req(2));
        assert!((&mut waiting).now_or_never().is_none());
        let canceller = thread::spawn(move || drop(waiting));
        drop(held);
        canceller.join().unwrap();
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0));
        assert!(a.try_admit(&req(2)).is_ok());
    });
}

#[test]
fn two_waiters_one_releaser_fifo() {
    loom::model(|| {
        let a = Admission::builder().max_in_flight(1).queue_capacity(2).build().unwrap();
        let held = a.try_admit(&req(1)).unwrap();
        let mut first = a.admit(&req(1));
        let mut second = a.admit(&req(1));
        assert!((&mut first).now_or_never().is_none());
        assert!((&mut second).now_or_never().is_none());
        let releaser = thread::spawn(move || drop(held));
        // Whatever the interleaving, the second waiter is never granted before the first.
        let second_early = (&mut second).now_or_never();
        assert!(second_early.is_none(), "second waiter overtook the first");
        releaser.join().unwrap();
        let p1 = first.now_or_never().expect("first waiter granted").unwrap();
        assert!((&mut second).now_or_never().is_none());
        drop(p1);
        drop(second.now_or_never().expect("second waiter granted next").unwrap());
        assert_eq!(a.snapshot().in_flight, 0);
    });
}

/// Close racing a grant: when `close()` returns, every waiter has resolved — granted before the close, or
/// `Closed` — and nothing is granted afterwards.
#[test]
fn close_racing_a_grant_grants_nothing_after_close() {
    loom::model(|| {
        let a = Admission::builder().max_in_flight(1).queue_capacity(2).build().unwrap();
        let held = a.try_admit(&req(1)).unwrap();
        let mut waiting = a.admit(&req(1));
        assert!((&mut waiting).now_or_never().is_none());
        let releaser = thread::spawn(move || drop(held));
        a.close();
        let outcome = (&mut waiting).now_or_never().expect("a waiter still waiting after close() returned");
        releaser.join().unwrap();
        let granted = outcome.is_ok();
        assert!(granted || outcome.as_ref().unwrap_err() == &kvgate::Rejection::Closed);
        assert_eq!(a.snapshot().in_flight, usize::from(granted), "a grant after close() returned");
        drop(outcome);
        assert_eq!(a.snapshot().in_flight, 0);
    });
}

/// A `try_admit` racing `close` that charges rates (the global request rate, its tenant's token rate)
/// after taking its slot: if it is granted, both charges were visible when `close` returned — an observer
/// that saw the admission closed never sees a token spent afterwards by a grant.
#[test]
fn a_try_admit_charging_rates_racing_close_is_granted_only_on_charges_made_before_close_returned() {
    loom::model(|| {
        let a = Admission::builder()
            .max_in_flight(1)
            .request_rate(0.001, 1)
            .tenant_defaults(kvgate::TenantLimits::new().token_rate(0.001, 10))
            .deadline_timer(false)
            .clock(kvgate::clock::ManualClock::new())
            .build()
            .unwrap();
        let racer = {
            let a = a.clone();
            thread::spawn(move || a.try_admit(&Request::new(0, 4).tenant("alice")).map(drop))
        };
        a.close();
        let rates = a.rate_status(Some("alice".into()));
        let (requests_left, tokens_left) = (rates.requests.unwrap().remaining, rates.tokens.unwrap().remaining);
        let raced = racer.join().unwrap();
        match raced {
            Ok(()) => assert_eq!((requests_left, tokens_left), (0, 6), "granted on charges made after close()"),
            Err(rejection) => assert_eq!(rejection, kvgate::Rejection::Closed),
        }
        // A refused racer gave everything back; a granted one kept its charges.
        let rates = a.rate_status(Some("alice".into()));
        let whole = (rates.requests.unwrap().remaining, rates.tokens.unwrap().remaining);
        assert_eq!(whole, if raced.is_ok() { (0, 6) } else { (1, 10) });
        assert_eq!(a.snapshot().in_flight, 0);
    });
}

/// A `try_admit` racing `close`, watched by an observer that learns the admission is closed through
/// `learns`, then reads the request token: once it saw the admission closed and the token unspent, it never
/// sees the racer granted on that token afterwards (`close` is linearizable for observers of `CLOSED`, not
/// only once it has returned).
fn an_observer_that_saw_closed_never_sees_a_later_grant_when(
    max_in_flight: usize,
    learns: fn(&Admission<kvgate::clock::ManualClock>) -> bool,
) {
    loom::model(move || {
        let a = Admission::builder()
            .max_in_flight(max_in_flight)
            .request_rate(0.001, 1)
            .deadline_timer(false)
            .clock(kvgate::clock::ManualClock::new())
            .build()
            .unwrap();
        let racer = {
            let a = a.clone();
            thread::spawn(move || a.try_admit(&req(1)).map(drop))
        };
        let closer = {
            let a = a.clone();
            thread::spawn(move || a.close())
        };
        let seen = learns(&a).then(|| a.rate_status(None).requests.unwrap().remaining);
        let raced = racer.join().unwrap();
        closer.join().unwrap();
        if seen == Some(1) {
            assert!(raced.is_err(), "saw closed and the token unspent, then a racer was granted on it");
        }
    });
}

#[test]
fn an_observer_that_saw_closed_never_sees_a_later_grant() {
    an_observer_that_saw_closed_never_sees_a_later_grant_when(1, Admission::is_closed);
}

/// The same for an observer whose own request was refused `Closed`.
#[test]
fn a_request_refused_closed_never_sees_a_later_grant() {
    an_observer_that_saw_closed_never_sees_a_later_grant_when(2, |a| {
        a.try_admit(&req(1)).err() == Some(kvgate::Rejection::Closed)
    });
}

/// A waker that panics.
struct Panicking;

impl std::task::Wake for Panicking {
    fn wake(self: std::sync::Arc<Self>) {
        panic!("a waker that panics");
    }
}

/// A panicking waker, woken by a release on another thread, stops nothing: the release returns normally,
/// the waiter keeps its grant, later requests are admitted.
#[test]
fn a_panicking_waker_stops_nothing() {
    loom::model(|| {
        let a = Admission::builder().max_in_flight(1).queue_capacity(2).build().unwrap();
        let held = a.try_admit(&req(1)).unwrap();
        let mut waiting = a.admit(&req(1));
        let waker = std::task::Waker::from(std::sync::Arc::new(Panicking));
        let polled = std::pin::Pin::new(&mut waiting).poll(&mut std::task::Context::from_waker(&waker));
        assert!(polled.is_pending());
        let releaser = thread::spawn(move || drop(held));
        releaser.join().unwrap();
        let permit = waiting.now_or_never().expect("granted").unwrap();
        drop(permit);
        assert!(a.try_admit(&req(1)).is_ok());
        assert_eq!(a.snapshot().in_flight, 0);
    });
}

/// A tenant's waiter cancelled while a release grants it: the slot, the KV and every rate charge — the
/// global request bucket and the tenant's token bucket — come back exactly once.
#[test]
fn cancelling_a_tenant_waiter_racing_a_release_keeps_every_bucket_whole() {
    loom::model(|| {
        let clock = kvgate::clock::ManualClock::new();
        let a = Admission::builder()
            .max_in_flight(1)
            .kv_capacity_tokens(8)
            .queue_capacity(2)
            .request_rate(0.001, 4)
            .tenant_defaults(kvgate::TenantLimits::new().token_rate(0.001, 10).max_in_flight(1))
            .deadline_timer(false)
            .clock(clock)
            .build()
            .unwrap();
        let alice = || Request::new(0, 4).tenant("alice");
        let held = a.try_admit(&alice()).unwrap();
        let mut waiting = a.admit(&alice());
        assert!((&mut waiting).now_or_never().is_none());
        let canceller = thread::spawn(move || drop(waiting));
        held.complete(0);
        canceller.join().unwrap();
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.kv_used, s.queued), (0, 0, 0));
        let rates = a.rate_status(Some("alice".into()));
        // One request was admitted and kept its request charge; everything else came back.
        assert_eq!(rates.requests.unwrap().remaining, 3);
        assert_eq!(rates.tokens.unwrap().remaining, 10);
        assert_eq!(a.busiest_tenants(1), Vec::new());
    });
}

/// Two threads admit the first requests of one new tenant at once: both take the tenant's path through the
/// registry's read-write lock (a miss under the read lock, then the write lock), exactly one state is
/// created, and the tenant's cap of one request holds whichever thread created it. The clock is a
/// `ManualClock`, so its reads are part of the model too.
#[test]
fn two_threads_creating_one_tenant_share_one_state() {
    loom::model(|| {
        let a = Admission::builder()
            .max_in_flight(4)
            .queue_capacity(0)
            .tenant_defaults(kvgate::TenantLimits::new().max_in_flight(1))
            .deadline_timer(false)
            .clock(kvgate::clock::ManualClock::new())
            .build()
            .unwrap();
        let bob = || Request::new(1, 0).tenant("bob");
        let a2 = a.clone();
        let t = thread::spawn(move || a2.try_admit(&bob()).ok());
        let mine = a.try_admit(&bob()).ok();
        let theirs = t.join().unwrap();
        assert_eq!(u8::from(mine.is_some()) + u8::from(theirs.is_some()), 1, "the tenant's cap of 1 was not kept");
        assert_eq!((a.tracked_tenants(), a.snapshot().in_flight), (1, 1));
        drop((mine, theirs));
        assert_eq!(a.snapshot().in_flight, 0);
        assert_eq!(a.busiest_tenants(1), Vec::new());
    });
}

/// Two threads admit the first requests of two new tenants at once while the registry has room for one:
/// the registry's global count (an atomic of the `sync` shim) is raised by exactly one of them, the other
/// tenant is served as the overflow tenant, and neither state is evicted (both are in use). Each thread
/// gets a permit: one charged to its own tenant, one to the overflow tenant's cap of one.
#[test]
fn two_new_tenants_racing_for_the_last_registry_place_track_one() {
    loom::model(|| {
        let a = Admission::builder()
            .max_in_flight(4)
            .queue_capacity(0)
            .max_tenants(1)
            .tenant_defaults(kvgate::TenantLimits::new().max_in_flight(1))
            .deadline_timer(false)
            .clock(kvgate::clock::ManualClock::new())
            .build()
            .unwrap();
        let a2 = a.clone();
        let t = thread::spawn(move || a2.try_admit(&Request::new(1, 0).tenant("bob")).ok());
        let mine = a.try_admit(&Request::new(1, 0).tenant("alice")).ok();
        let theirs = t.join().unwrap();
        assert!(mine.is_some() && theirs.is_some(), "one tenant tracked, the other in the overflow tenant");
        assert_eq!((a.tracked_tenants(), a.snapshot().in_flight), (1, 2));
        drop((mine, theirs));
        assert_eq!(a.snapshot().in_flight, 0);
    });
}
