//! The one place where kvgate chooses between `std` and [loom] synchronisation primitives.
//!
//! Every concurrent module imports its atomics, cells, mutexes, read-write locks, condition variables and
//! spin hints from here, never from `std` or `parking_lot` directly. Under `RUSTFLAGS="--cfg loom"` the
//! same code is compiled against loom's instrumented types, so the loom models in `tests/*_loom.rs`
//! explore every interleaving of the real implementation: the queue's stamps and counters, the token
//! bucket's `tat` and seqlock, the admission's gauges, waiters and waiting room, the tenant registry's
//! read-write locks and tenant count, and [`ManualClock`](crate::clock::ManualClock)'s time.
//!
//! This module contains no logic beyond adapting the two APIs to one shape: `std`'s `UnsafeCell` is
//! wrapped so that it offers loom's closure-based `with` / `with_mut` accessors, and [`lock`], [`read`]
//! and [`write`] take a lock the same way whether it returns a guard (`parking_lot`) or a `LockResult`
//! (`std`, loom).
//!
//! # Outside loom's view, on purpose
//!
//! - `Arc` stays `std`'s everywhere: reference counts are not what the models check, and loom's `Arc`
//!   cannot be coerced to a trait object, which permits and waiting futures rely on.
//! - Two process-wide counters are `static`s, which need a `const` constructor that loom's atomics lack:
//!   the one that seeds [`SplitMix64::from_entropy`](crate::retry::SplitMix64::from_entropy) and the one
//!   that numbers threads for the admission's striped counters (`admission/stats.rs`, compiled out under
//!   loom). Each is a single `fetch_add` whose value is only a seed or a stripe index: every value it can
//!   return is correct, so no interleaving can make it wrong.
//! - The deadline thread's `Condvar` (`admission/dispatcher/timer.rs`) is compiled out under loom, where
//!   deadlines end on polls and `expire_waiters`; the thread is covered by the waiting tests instead
//!   (`tests/waiting.rs`, `tests/fault_injection.rs`).
//! - [`MonotonicClock`](crate::clock::MonotonicClock) holds no shared state of ours (it reads the TSC or
//!   `Instant`).
//! - The simulation lab (`sim`, a feature) drives everything from one thread; the `parking_lot::Mutex`
//!   around its list of woken waiters exists only because a `Waker` must be `Send + Sync`, and there is no
//!   second thread for loom to interleave. Its determinism is checked by the lab's own tests (same seed,
//!   same report).
//!
//! A new structure either imports from here or is added to this list with the reason and the tests that
//! prove it instead.
//!
//! [loom]: https://docs.rs/loom

#[cfg(loom)]
pub(crate) use loom::{
    cell::UnsafeCell,
    hint::spin_loop,
    sync::{
        Mutex, MutexGuard, RwLock,
        atomic::{AtomicU64, AtomicUsize, Ordering, fence},
    },
    thread::yield_now,
};

#[cfg(not(loom))]
pub(crate) use std::{
    hint::spin_loop,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence},
    thread::yield_now,
};

/// The waiting room's lock is `std`'s: under contention it spins in user space before it sleeps, where
/// `parking_lot`'s yields to the scheduler and parks early; in the waiting drain bench (two worker threads
/// passing the lock back and forth) that took the kernel's share of the run from 26 % to 15 % (`perf
/// record`). The read-write locks stay `parking_lot`'s.
#[cfg(not(loom))]
pub(crate) use parking_lot::RwLock;
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// The deadline thread's lock and condition variable, outside loom's view (see the module docs).
#[cfg(not(loom))]
pub(crate) use parking_lot::{Condvar, Mutex as ThreadMutex};

/// Locks a mutex the same way under loom and `std`. A poisoned lock is taken as it is, as a `parking_lot`
/// lock (which has no poisoning) would be: no user code runs while the waiting room's lock is held.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes a read lock the same way under loom and `std`.
#[cfg(loom)]
pub(crate) fn read<T>(lock: &RwLock<T>) -> loom::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes a write lock the same way under loom and `std`.
#[cfg(loom)]
pub(crate) fn write<T>(lock: &RwLock<T>) -> loom::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes a read lock the same way under loom and `std`.
#[cfg(not(loom))]
#[inline]
pub(crate) fn read<T>(lock: &RwLock<T>) -> parking_lot::RwLockReadGuard<'_, T> {
    lock.read()
}

/// Takes a write lock the same way under loom and `std`.
#[cfg(not(loom))]
#[inline]
pub(crate) fn write<T>(lock: &RwLock<T>) -> parking_lot::RwLockWriteGuard<'_, T> {
    lock.write()
}

/// `std::cell::UnsafeCell` with loom's closure-based access API, so that code written once runs under both.
#[cfg(not(loom))]
#[derive(Debug, Default)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T: ?Sized>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    #[inline]
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }
}

#[cfg(not(loom))]
impl<T: ?Sized> UnsafeCell<T> {
    /// Calls `f` with a shared raw pointer to the contents.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a unique raw pointer to the contents.
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Pads and aligns a value to 128 bytes so that two hot atomics never share a cache line
/// (x86-64's adjacent-line prefetcher pairs 64-byte lines, hence 128).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}
