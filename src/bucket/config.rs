//! The bucket's configuration, read-mostly and changeable at run time: the fields of one [`Gcra`] as
//! atomics, guarded by a seqlock so that readers take one consistent copy without a lock.
//!
//! # The seqlock
//!
//! `version` is even while the fields are stable and odd while a writer stores them.
//!
//! * Readers ([`Config::read_with`]): `version.load(Acquire)` (even), `Relaxed` loads of the fields and of
//!   the bucket's `tat`, `fence(Acquire)`, `version.load(Relaxed)`, retry if the version changed. They
//!   never write, so a reader cannot delay a writer or another reader.
//! * Writers ([`Config::lock`], then [`WriteGuard::publish`]; only `set_rate`, rare) serialize by CASing
//!   `version` from even to odd (`Acquire`), issue `fence(Release)`, convert `tat` (CAS, `Relaxed`), store
//!   the fields `Relaxed`, and `store(version + 2, Release)`.
//!
//! If a reader observes any field written by a writer, or the writer's conversion of `tat` or any later
//! CAS on `tat` (every write to `tat` is a read-modify-write, so they all continue the conversion's
//! release sequence), the writer's `fence(Release)` (after its odd version) and the reader's
//! `fence(Acquire)` (before its second version load) synchronize, so the second load sees the odd version
//! or a later one: a torn read is always retried. A reader that sees the final even version with
//! `Acquire` sees every field of that write. So a read that is not retried returns a configuration and a
//! `tat` of the same generation.
//!
//! Between `lock` and `publish` a writer runs only the level arithmetic on copies and the CAS loop on
//! `tat` (no user code, no allocation, nothing that can panic). The version is made even again by the
//! guard's `Drop`, so even a future change that unwinds in between cannot leave readers spinning.

use super::gcra::Gcra;
use crate::sync::{AtomicU64, Ordering, fence, spin_loop};

/// The configuration's fields as atomics, guarded by the seqlock `version`.
#[derive(Debug)]
pub(super) struct Config {
    /// Even: stable. Odd: a writer is storing the other fields.
    version: AtomicU64,
    // The fields the hot path reads, in the version's 64-byte line.
    base_ns: AtomicU64,
    level0: AtomicU64,
    mult_hi: AtomicU64,
    mult_lo: AtomicU64,
    unit: AtomicU64,
    cap: AtomicU64,
    burst: AtomicU64,
    /// The rate as given (`f64` bits): read only by `rate()`, so outside the hot path's line.
    rate_bits: AtomicU64,
}

impl Config {
    /// A configuration holding `gcra` and `rate`, unlocked.
    pub(super) fn new(gcra: Gcra, rate: f64) -> Self {
        Self {
            version: AtomicU64::new(0),
            base_ns: AtomicU64::new(gcra.base_ns),
            level0: AtomicU64::new(gcra.level0),
            mult_hi: AtomicU64::new(gcra.mult_hi),
            mult_lo: AtomicU64::new(gcra.mult_lo),
            unit: AtomicU64::new(gcra.unit),
            cap: AtomicU64::new(gcra.cap),
            burst: AtomicU64::new(gcra.burst),
            rate_bits: AtomicU64::new(rate.to_bits()),
        }
    }

    /// Reads a consistent copy (seqlock read side; retries while a writer is active).
    #[inline]
    pub(super) fn read(&self) -> Gcra {
        self.read_and(|| ()).0
    }

    /// Reads a consistent copy and, inside the same read, the bucket's `tat`: the two belong to the same
    /// generation (see the module docs).
    #[inline]
    pub(super) fn read_with(&self, tat: &AtomicU64) -> (Gcra, u64) {
        self.read_and(|| tat.load(Ordering::Relaxed))
    }

    /// The rate as given, consistent with the configuration it belongs to.
    pub(super) fn rate(&self) -> f64 {
        f64::from_bits(self.read_and(|| self.rate_bits.load(Ordering::Relaxed)).1)
    }

    #[inline]
    fn read_and<T>(&self, also: impl Fn() -> T) -> (Gcra, T) {
        loop {
            let v1 = self.version.load(Ordering::Acquire);
            if v1 & 1 == 0 {
                let gcra = self.load();
                let other = also();
                fence(Ordering::Acquire);
                if self.version.load(Ordering::Relaxed) == v1 {
                    return (gcra, other);
                }
            }
            // A writer is active (a few dozen nanoseconds).
            spin_loop();
        }
    }

    /// Seqlock write side: waits for other writers, then makes the version odd and returns the guard
    /// that holds the current configuration and publishes the next one. Readers spin until then.
    pub(super) fn lock(&self) -> WriteGuard<'_> {
        let mut version = self.version.load(Ordering::Relaxed);
        loop {
            if version & 1 == 1 {
                spin_loop();
                version = self.version.load(Ordering::Relaxed);
                continue;
            }
            match self.version.compare_exchange_weak(version, version + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => break,
                Err(current) => version = current,
            }
        }
        fence(Ordering::Release);
        // We hold the write lock: nobody else stores the fields, so Relaxed loads see the latest values.
        WriteGuard { config: self, odd_version: version + 1, current: self.load() }
    }

    /// The fields, each loaded `Relaxed`: only inside the seqlock (between the version checks, or holding
    /// the write side).
    #[inline]
    fn load(&self) -> Gcra {
        Gcra {
            base_ns: self.base_ns.load(Ordering::Relaxed),
            level0: self.level0.load(Ordering::Relaxed),
            mult_hi: self.mult_hi.load(Ordering::Relaxed),
            mult_lo: self.mult_lo.load(Ordering::Relaxed),
            unit: self.unit.load(Ordering::Relaxed),
            cap: self.cap.load(Ordering::Relaxed),
            burst: self.burst.load(Ordering::Relaxed),
        }
    }

    /// Stores the fields `Relaxed`: only holding the write side.
    fn store(&self, gcra: Gcra, rate: f64) {
        self.base_ns.store(gcra.base_ns, Ordering::Relaxed);
        self.level0.store(gcra.level0, Ordering::Relaxed);
        self.mult_hi.store(gcra.mult_hi, Ordering::Relaxed);
        self.mult_lo.store(gcra.mult_lo, Ordering::Relaxed);
        self.unit.store(gcra.unit, Ordering::Relaxed);
        self.cap.store(gcra.cap, Ordering::Relaxed);
        self.burst.store(gcra.burst, Ordering::Relaxed);
        self.rate_bits.store(rate.to_bits(), Ordering::Relaxed);
    }
}

/// The write side of the seqlock, held from [`Config::lock`] to [`publish`](Self::publish).
pub(super) struct WriteGuard<'a> {
    config: &'a Config,
    odd_version: u64,
    current: Gcra,
}

impl WriteGuard<'_> {
    /// The configuration in force when the lock was taken (no other writer can change it meanwhile).
    pub(super) fn current(&self) -> Gcra {
        self.current
    }

    /// Stores `next` and `rate` and releases the lock (in `Drop`): readers from now on see them.
    pub(super) fn publish(self, next: Gcra, rate: f64) {
        self.config.store(next, rate);
    }
}

impl Drop for WriteGuard<'_> {
    /// Makes the version even again. A guard dropped without `publish` changed no field: readers that
    /// saw the odd version retry and read the same configuration.
    fn drop(&mut self) {
        self.config.version.store(self.odd_version.wrapping_add(1), Ordering::Release);
    }
}
