//! Wake-ups collected under the waiting room's lock and run after it is released.
//!
//! A waker is user code: it may be slow, take locks of its own, re-enter kvgate or panic. The dispatcher
//! therefore never calls one while it holds the lock. It decides grants, moves each granted waiter's
//! wake-up into a `WakeList` of bounded size, releases the lock, and only then wakes them (when the list
//! fills mid-pass, it releases the lock, wakes the batch and takes the lock again). Each wake runs under
//! `catch_unwind`: a panicking waker is counted, reported by the panic hook as usual, and does not stop the
//! remaining wake-ups nor reach the thread that happened to release capacity (which may be unwinding
//! already, where a second panic would abort the process). The waiter it belonged to keeps its grant.

use super::waiter::Wake;
use std::fmt;
use std::mem::MaybeUninit;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Wake-ups held at once; a pass that grants more releases the lock to run them in batches.
const CAPACITY: usize = 32;

/// A bounded list of wake-ups to run outside the lock; it lives on the stack (no allocation) and costs
/// nothing to create: its slots stay uninitialized until used.
///
/// Invariant: `items[..len]` are initialized and owned by the list; `items[len..]` are not.
pub(crate) struct WakeList {
    items: [MaybeUninit<Wake>; CAPACITY],
    len: usize,
}

impl fmt::Debug for WakeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WakeList").field("len", &self.len).finish()
    }
}

impl WakeList {
    pub(crate) fn new() -> Self {
        Self { items: [const { MaybeUninit::uninit() }; CAPACITY], len: 0 }
    }

    pub(crate) fn push(&mut self, wake: Wake) {
        assert!(self.len < CAPACITY, "a pass checks `is_full` before granting");
        self.items[self.len].write(wake);
        self.len += 1;
    }

    /// Whether no more wake-ups fit: run them before granting more.
    pub(crate) fn is_full(&self) -> bool {
        self.len >= CAPACITY
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Runs every wake-up; returns how many panicked. Call with no lock held.
    pub(crate) fn wake_all(&mut self) -> u64 {
        let mut panicked = 0;
        // Take the items out of the list first, so that a wake-up that unwinds out of `catch_unwind`
        // (it cannot, but a drop of the `Wake` could) never leaves an item owned twice.
        let len = std::mem::replace(&mut self.len, 0);
        for slot in &mut self.items[..len] {
            // SAFETY: `slot` is in `items[..len]`, initialized by `push` (invariant); `len` was reset to 0
            // above, so the list no longer owns it and it is read exactly once.
            let wake = unsafe { slot.assume_init_read() };
            if catch_unwind(AssertUnwindSafe(|| wake.wake())).is_err() {
                panicked += 1;
            }
        }
        panicked
    }
}

impl Drop for WakeList {
    /// Wake-ups still held when the list is dropped (an unwinding pass) are run, so nobody sleeps through
    /// a grant.
    fn drop(&mut self) {
        if self.len != 0 {
            self.wake_all();
        }
    }
}
