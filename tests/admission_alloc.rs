//! `try_admit` and dropping its permit allocate nothing after warm-up, with every limit on, on both the
//! admitted and the rejected paths. A counting global allocator proves it.
#![cfg(not(loom))]

use kvgate::{Admission, Request};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; we only count.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
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
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn try_admit_and_drop_allocate_nothing() {
    let admission = Admission::builder()
        .max_in_flight(4)
        .kv_capacity_tokens(1 << 20)
        .request_rate(1e9, 1_000_000)
        .token_rate(1e9, 1 << 40)
        .build()
        .unwrap();
    let request = Request::new(512, 256);
    // Warm-up: first use of thread-locals, lazy statics, the clock.
    for _ in 0..100 {
        drop(admission.try_admit(&request).unwrap());
    }
    let mut held = Vec::with_capacity(8);
    COUNTING.store(true, Ordering::SeqCst);
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
    COUNTING.store(false, Ordering::SeqCst);
    assert_eq!(ALLOCATIONS.load(Ordering::SeqCst), 0, "the admission hot path allocated");
    assert_eq!(admission.snapshot().in_flight, 0);
}
