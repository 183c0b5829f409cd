//! `try_admit` and dropping its permit allocate nothing after warm-up, with every limit on, on both the
//! admitted and the rejected paths. A counting global allocator proves it.
#![cfg(not(loom))]

use kvgate::{Admission, Request};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

thread_local! {
    /// Counting is per thread: allocations of the test harness's other threads are not ours.
    static COUNTING: Cell<bool> = const { Cell::new(false) };
}

fn counting() -> bool {
    COUNTING.try_with(Cell::get).unwrap_or(false)
}
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; we only count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if counting() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if counting() {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counter is shared: the tests that count take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Four slots, a KV budget and both global rates, all far from their limits.
fn four_slots_every_limit() -> kvgate::AdmissionBuilder {
    Admission::builder()
        .max_in_flight(4)
        .kv_capacity_tokens(1 << 20)
        .request_rate(1e9, 1_000_000)
        .token_rate(1e9, 1 << 40)
}

#[test]
fn try_admit_and_drop_allocate_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let admission = four_slots_every_limit().build().unwrap();
    let request = Request::new(512, 256);
    // Warm-up: first use of thread-locals, lazy statics, the clock.
    for _ in 0..100 {
        drop(admission.try_admit(&request).unwrap());
    }
    let mut held = Vec::with_capacity(8);
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.with(|c| c.set(true));
    for _ in 0..10_000 {
        let permit = admission.try_admit(&request).unwrap();
        drop(permit);
        // Fill the slots and collect rejections too.
        for _ in 0..5 {
            match admission.try_admit(&request) {
                Ok(p) => held.push(p),
                Err(e) => assert!(e.retry_after().is_some()),
            }
        }
        held.clear();
        let p = admission.try_admit(&Request::new(100, 100)).unwrap();
        p.complete(10);
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0, "the admission hot path allocated");
    assert_eq!(admission.snapshot().in_flight, 0);
}

/// The same with tenants already tracked and requests waiting: `try_admit` of a known tenant, refusals
/// because others wait, permits whose drop grants a waiter, waiters that come and go — none of it allocates
/// once the waiting room has held that many waiters before.
#[test]
fn known_tenants_and_waiters_allocate_nothing() {
    use futures::task::noop_waker_ref;
    use kvgate::{Priority, TenantLimits};
    use std::future::Future;
    use std::pin::Pin;
    use std::task::Context;

    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let admission = four_slots_every_limit()
        .queue_capacity(64)
        .tenant_defaults(TenantLimits::new().max_in_flight(2).kv_share(0.5).token_rate(1e9, 1 << 40))
        .build()
        .unwrap();
    let tenants = ["alice", "bob", "carol"];
    let mut cx = Context::from_waker(noop_waker_ref());
    let mut held = Vec::with_capacity(16);
    let mut waiters = Vec::with_capacity(16);
    let mut round = |admission: &Admission| {
        // Fill the server with tenants' permits (each tenant at most 2).
        for t in tenants {
            for _ in 0..2 {
                if let Ok(p) = admission.try_admit(&Request::new(64, 64).tenant(t)) {
                    held.push(p);
                }
            }
        }
        // Batch waiters of every tenant and anonymous ones.
        for t in tenants {
            let mut fut = admission.admit(&Request::new(32, 32).tenant(t).priority(Priority::Batch));
            let _ = Pin::new(&mut fut).poll(&mut cx);
            waiters.push(fut);
        }
        let mut anon = admission.admit(&Request::new(32, 32).priority(Priority::Batch));
        let _ = Pin::new(&mut anon).poll(&mut cx);
        waiters.push(anon);
        // Refused because others wait (same class), and a tenant at its own cap.
        assert!(admission.try_admit(&Request::new(8, 8).priority(Priority::Batch)).is_err());
        assert!(admission.try_admit(&Request::new(8, 8).tenant("alice")).is_err());
        // Releases grant waiters; waiters are polled, some cancelled.
        held.clear();
        for fut in &mut waiters {
            if let std::task::Poll::Ready(Ok(p)) = Pin::new(fut).poll(&mut cx) {
                held.push(p);
            }
        }
        waiters.clear();
        for p in held.drain(..) {
            p.complete(8);
        }
    };
    for _ in 0..50 {
        round(&admission);
    }
    ALLOCATIONS.store(0, Ordering::SeqCst);
    COUNTING.with(|c| c.set(true));
    for _ in 0..2_000 {
        round(&admission);
    }
    COUNTING.with(|c| c.set(false));
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0, "tenants or waiters allocated on the hot path");
    let s = admission.snapshot();
    assert_eq!((s.in_flight, s.queued), (0, 0));
}
