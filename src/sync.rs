//! The one place where kvgate chooses between `std` and [loom] synchronisation primitives.
//!
//! Every concurrent module imports its atomics, cells, mutexes, read-write locks, condition variables and
//! spin hints from here, never from `std` or `parking_lot` directly. Under `RUSTFLAGS="--cfg loom"` the same code is compiled against loom's instrumented types so
//! the loom models in `tests/loom_*.rs` explore every interleaving of the real implementation.
//!
//! `Arc` stays `std`'s everywhere: reference counts are not what the models check, and loom's `Arc`
//! cannot be coerced to a trait object, which permits and waiting futures rely on.
//!
//! This module contains no logic beyond adapting the two APIs to one shape: `std`'s `UnsafeCell` is
//! wrapped so that it offers loom's closure-based `with` / `with_mut` accessors.
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

#[cfg(not(loom))]
pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

/// Locks a mutex the same way under loom and `std` (loom's `lock()` returns a `LockResult`).
#[cfg(loom)]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Locks a mutex the same way under loom and `std` (loom's `lock()` returns a `LockResult`).
#[cfg(not(loom))]
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock()
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
