//! loom models of the races the deterministic review tests cannot force: a tenant's release racing the
//! pass that parks its waiter, a permit's hand-over racing a higher-class `try_admit`, and a tenant release
//! racing a global release while the waiter needs both.
//!
//! Run: `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 CARGO_TARGET_DIR=target/loom cargo test --release --test loom_review`
#![cfg(loom)]

use futures::FutureExt;
use kvgate::{Admission, Priority, Request, TenantLimits};
use loom::thread;

fn alice() -> Request {
    Request::new(1, 0).tenant("alice")
}

/// Room invariant 2 (park, then look again): a waiter held back only by its tenant's cap, queued while the
/// tenant's permit is released on another thread, is never left parked with its tenant's room free.
#[test]
fn a_tenant_release_racing_the_park_loses_no_wakeup() {
    loom::model(|| {
        let a = Admission::builder()
            .queue_capacity(2)
            .tenant_defaults(TenantLimits::new().max_in_flight(1))
            .deadline_timer(false)
            .build()
            .unwrap();
        let held = a.try_admit(&alice()).unwrap();
        let releaser = thread::spawn(move || drop(held));
        let mut waiting = a.admit(&alice());
        let first = (&mut waiting).now_or_never();
        releaser.join().unwrap();
        let permit = match first {
            Some(result) => result.unwrap(),
            None => waiting.now_or_never().expect("lost wake-up: alice's room is free, her waiter is parked").unwrap(),
        };
        drop(permit);
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.queued), (0, 0));
    });
}

/// A release hands its slot to the queued `Normal` waiter (the credit never returns to the word) while an
/// `Interactive` `try_admit` races it: the slot goes to exactly one of them, never both.
#[test]
fn a_hand_over_racing_a_higher_class_try_admit_never_overcommits() {
    loom::model(|| {
        let a = Admission::builder().max_in_flight(1).queue_capacity(2).deadline_timer(false).build().unwrap();
        let held = a.try_admit(&Request::new(1, 0)).unwrap();
        let mut waiting = a.admit(&Request::new(1, 0));
        assert!((&mut waiting).now_or_never().is_none());
        let releaser = thread::spawn(move || drop(held));
        let urgent = a.try_admit(&Request::new(1, 0).priority(Priority::Interactive)).ok();
        assert!(a.snapshot().in_flight <= 1);
        releaser.join().unwrap();
        let granted = (&mut waiting).now_or_never();
        assert!(!(urgent.is_some() && matches!(granted, Some(Ok(_)))), "one released slot admitted two requests");
        let waiter_had_it = matches!(granted, Some(Ok(_)));
        drop(granted);
        drop(urgent);
        if !waiter_had_it {
            let permit = waiting.now_or_never().expect("lost wake-up after the urgent permit went").unwrap();
            drop(permit);
        }
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.queued), (0, 0));
    });
}

/// A waiter that needs both its tenant's room and a global slot (parked on the first, with the global slot
/// full too): the two releases race; whichever comes last grants it.
#[test]
fn a_tenant_release_racing_a_global_release_loses_no_wakeup() {
    loom::model(|| {
        let a = Admission::builder()
            .max_in_flight(2)
            .queue_capacity(2)
            .tenant_defaults(TenantLimits::new().max_in_flight(1))
            .deadline_timer(false)
            .build()
            .unwrap();
        let hers = a.try_admit(&alice()).unwrap();
        let his = a.try_admit(&Request::new(1, 0).tenant("bob")).unwrap();
        let mut waiting = a.admit(&alice());
        assert!((&mut waiting).now_or_never().is_none());
        let other = thread::spawn(move || drop(his));
        drop(hers);
        other.join().unwrap();
        let permit = waiting.now_or_never().expect("lost wake-up: both releases done, the waiter still waits").unwrap();
        drop(permit);
        let s = a.snapshot();
        assert_eq!((s.in_flight, s.queued), (0, 0));
    });
}
