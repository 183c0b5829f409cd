//! One waiting request's handle: the state word that decides, exactly once, how its wait ends, and how
//! to wake whoever waits on it (an async task or a parked thread).
//!
//! State machine (every transition leaves `WAITING` by a compare-and-swap, so exactly one party wins it):
//!
//! ```text
//!            dispatcher reserved capacity for it          the waiter dropped its future / gave up
//!  WAITING ─────────────────────────────────► GRANTED    WAITING ─► CANCELLED
//!     │  deadline passed (poll or timer)                 close()
//!     └──────────────────────────────────────► TIMED_OUT WAITING ─► CLOSED
//! ```
//!
//! The winner of the transition out of `WAITING` also decrements the class's waiting count, so the
//! count is exact. `GRANTED` means capacity for the waiter's request is already reserved: whoever
//! observes `GRANTED` owns that reservation and must turn it into a `Permit` or give it back.

use super::tenant::TenantHandle;
use crate::sync::{AtomicU8, Ordering};
use futures::task::AtomicWaker;
use std::sync::Arc;
use std::task::Waker;

pub(crate) const WAITING: u8 = 0;
pub(crate) const GRANTED: u8 = 1;
pub(crate) const CANCELLED: u8 = 2;
pub(crate) const TIMED_OUT: u8 = 3;
pub(crate) const CLOSED: u8 = 4;

/// How to wake the owner of a waiter.
#[derive(Debug)]
pub(crate) enum Notify {
    /// An async task; its latest waker is registered here.
    Task(AtomicWaker),
    /// A thread blocked in `admit_blocking`.
    #[cfg(not(loom))]
    Thread(std::thread::Thread),
}

/// A waiting request: what it needs, where it queues, when it gives up, and how to wake it.
#[derive(Debug)]
pub(crate) struct Waiter {
    state: AtomicU8,
    /// KV units the request reserves once granted.
    pub(crate) kv: u64,
    /// Priority class index.
    pub(crate) class: usize,
    /// Clock reading after which the wait ends, or `u64::MAX` for no deadline.
    pub(crate) deadline: u64,
    /// The tenant whose limits the grant must also respect.
    pub(crate) tenant: Option<Arc<dyn TenantHandle>>,
    /// Fair-queueing key (the tenant's; 0 for requests without a tenant) and weight.
    pub(crate) tenant_key: u64,
    pub(crate) weight: u32,
    notify: Notify,
}

impl Waiter {
    pub(crate) fn new(
        kv: u64,
        class: usize,
        deadline: u64,
        tenant: Option<Arc<dyn TenantHandle>>,
        notify: Notify,
    ) -> Self {
        let (tenant_key, weight) = tenant.as_ref().map_or((0, 1), |t| (t.key(), t.weight()));
        Self { state: AtomicU8::new(WAITING), kv, class, deadline, tenant, tenant_key, weight, notify }
    }

    /// The current state (`Acquire`: a `GRANTED` read sees the reservation made before it).
    #[inline]
    pub(crate) fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    /// Moves `WAITING → to`; true if this call won the transition.
    #[inline]
    pub(crate) fn leave_waiting(&self, to: u8) -> bool {
        self.state.compare_exchange(WAITING, to, Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    /// Registers the task to wake (no-op for thread waiters).
    pub(crate) fn register(&self, waker: &Waker) {
        #[cfg_attr(loom, allow(irrefutable_let_patterns))]
        if let Notify::Task(slot) = &self.notify {
            slot.register(waker);
        }
    }

    /// Wakes the owner: O(1), exactly one task or thread.
    pub(crate) fn wake(&self) {
        match &self.notify {
            Notify::Task(slot) => slot.wake(),
            #[cfg(not(loom))]
            Notify::Thread(thread) => thread.unpark(),
        }
    }
}
