//! Counted capacity — in-flight slots and KV units — and the flag bits that make a release notice a waiter.
//!
//! One [`Capacity`] holds the admission's global limits; each tenant has its own. Both words are plain
//! counters changed by compare-and-swap, so taking and returning capacity never locks.
//!
//! # The slot word
//!
//! ```text
//!  63        44 43      42 .. 40        39 ........................ 0
//! [  unused   | CLOSED | HELD_BACK[c] |  slots in use (COUNT_BITS)   ]
//! ```
//!
//! - `HELD_BACK[c]` (one bit per priority class): some waiter of class `c` is held back by *this*
//!   capacity. On the global capacity it means "class `c` has waiters that only global room can
//!   release" (its fair queue's ring is not empty); on a tenant's it means "the tenant's waiters of
//!   class `c` are parked until this tenant frees room". The bits are set and cleared only under the
//!   waiting room's lock.
//! - `CLOSED` (global only): set once by `close()`; every later take fails.
//!
//! # Invariants
//! 1. **Conservation**: `slots` and `kv` equal the sums over the live reservations; every successful take
//!    is matched by exactly one [`release`](Capacity::release).
//! 2. **No overtaking**: a take for a *new* request of class `c` fails while a `HELD_BACK` bit of class
//!    `c` or higher is set, so a new request never passes a waiter the same capacity holds back. Takes
//!    for a waiter (made by the dispatcher, under the waiting room's lock) ignore the bits.
//! 3. **No lost wake-up**: a release subtracts KV first, then the slot, and reads the flags in the same
//!    read-modify-write as the slot. The waiting room sets a `HELD_BACK` bit (an RMW on the slot word)
//!    *before* it tries to take capacity for that waiter. Both sides are RMWs on one location, so one of
//!    them comes first in its modification order: either the release sees the bit (and runs the
//!    dispatcher), or the bit-setter's RMW reads the release's result — with `AcqRel`, the KV returned
//!    before it is visible too, and the take that follows sees the room. No `SeqCst` and no fence are
//!    needed, so the loom models check exactly this code.
//! 4. **Linearizable close**: `CLOSED` lives in the word every take compares, so no take can succeed
//!    after the RMW that sets it.

use crate::Priority;
use crate::sync::{AtomicU64, Ordering};

/// Bits of the slot word that count slots in use.
const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
/// The most slots one capacity can count; larger limits behave as this one.
pub(crate) const MAX_SLOTS: u64 = COUNT_MASK;
const HELD_BACK_SHIFT: u32 = COUNT_BITS;
const HELD_BACK_ALL: u64 = ((1 << Priority::COUNT) - 1) << HELD_BACK_SHIFT;
const CLOSED: u64 = 1 << (COUNT_BITS + Priority::COUNT as u32);

/// The `HELD_BACK` bit of one class.
#[inline]
const fn held_back_bit(class: usize) -> u64 {
    1 << (HELD_BACK_SHIFT + class as u32)
}

/// `HELD_BACK` bits of `class` and every higher class.
#[inline]
const fn held_back_at_or_above(class: usize) -> u64 {
    HELD_BACK_ALL & !(held_back_bit(class) - 1)
}

/// Why a take failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shortage {
    /// Not enough free slots or KV units now.
    Full,
    /// A waiter of the same or a higher class is held back by this capacity: queue behind it.
    HeldBack,
    /// The admission is closed.
    Closed,
}

/// A failed take: why, and whether the slot it had to give back was wanted by a held-back waiter (then
/// the caller must let the dispatcher run, exactly as after a release).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) shortage: Shortage,
    pub(crate) dispatch: bool,
}

impl From<Shortage> for Refused {
    fn from(shortage: Shortage) -> Self {
        Refused { shortage, dispatch: false }
    }
}

/// Capacity a releasing permit hands straight to waiters, under the waiting room's lock, instead of
/// returning it to the words and taking it back: the slot and KV units stay counted as used while they
/// change owner. Whatever is left is returned with [`Capacity::return_credit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Credit {
    pub(crate) slots: u64,
    pub(crate) kv: u64,
}

/// In-flight slots and KV units with their limits. See the module docs for the word layout.
#[derive(Debug)]
pub(crate) struct Capacity {
    slots: AtomicU64,
    slot_limit: AtomicU64,
    kv: AtomicU64,
}

impl Capacity {
    pub(crate) fn new(slot_limit: u64) -> Self {
        Self { slots: AtomicU64::new(0), slot_limit: AtomicU64::new(slot_limit.min(MAX_SLOTS)), kv: AtomicU64::new(0) }
    }

    /// Takes one slot and `kv` units (within `kv_limit`) for a new request of `class`, all or nothing.
    #[inline]
    pub(crate) fn try_take(&self, kv: u64, kv_limit: u64, class: usize) -> Result<(), Refused> {
        self.take(kv, kv_limit, CLOSED | held_back_at_or_above(class))
    }

    /// Takes one slot and `kv` units for a waiter of `class` (the dispatcher's take): passes the class's
    /// own held-back bit and the lower ones, refused while a waiter of a *higher* class is held back —
    /// for a tenant's capacity, nobody overtakes a parked waiter within its tenant, not even its
    /// lower-class waiters.
    #[inline]
    pub(crate) fn try_take_for_waiter_of(&self, kv: u64, kv_limit: u64, class: usize) -> Result<(), Refused> {
        let above = if class + 1 < Priority::COUNT { held_back_at_or_above(class + 1) } else { 0 };
        self.take(kv, kv_limit, CLOSED | above)
    }

    /// Like [`try_take_for_waiter_of`](Self::try_take_for_waiter_of) without a class (every held-back bit
    /// passed: the global take of a waiter the pass chose), drawing on `credit` first (under the
    /// waiting room's lock). The limits are checked against the use *without* the credit — as if it had
    /// been returned — so a hand-over never admits what a release followed by a take would refuse (after a
    /// limit shrank below the use, nothing is handed over until the use is below the limit again). Other
    /// threads' takes see the credit as used, so they never take it from under the hand-over.
    pub(crate) fn try_take_for_waiter_with(&self, kv: u64, kv_limit: u64, credit: &mut Credit) -> Result<(), Refused> {
        let slot_from_credit = credit.slots != 0;
        if slot_from_credit {
            let word = self.slots.load(Ordering::Acquire);
            if word & CLOSED != 0 {
                return Err(Shortage::Closed.into());
            }
            if (word & COUNT_MASK) - credit.slots >= self.slot_limit.load(Ordering::Relaxed) {
                return Err(Shortage::Full.into());
            }
        } else {
            self.take_slot(CLOSED)?;
        }
        let from_credit = credit.kv.min(kv);
        let rest = kv - from_credit;
        let fits = if rest == 0 {
            // The credit is part of `used`, so `used >= credit.kv`.
            self.kv.load(Ordering::Acquire) - credit.kv + kv <= kv_limit
        } else {
            self.kv
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                    used.checked_add(rest).filter(|n| *n <= kv_limit)
                })
                .is_ok()
        };
        if !fits {
            if !slot_from_credit {
                // Under the lock, as the dispatcher: the pass stops here anyway.
                let _ = self.give_back_slot();
            }
            return Err(Shortage::Full.into());
        }
        if slot_from_credit {
            credit.slots -= 1;
        }
        credit.kv -= from_credit;
        Ok(())
    }

    /// Returns what is left of a credit; true if a waiter is held back (the caller is the dispatcher, under
    /// the lock, and has just looked at every head).
    pub(crate) fn return_credit(&self, credit: Credit) -> bool {
        if credit.kv != 0 {
            self.kv.fetch_sub(credit.kv, Ordering::Release);
        }
        if credit.slots != 0 {
            return self.slots.fetch_sub(credit.slots, Ordering::AcqRel) & HELD_BACK_ALL != 0;
        }
        false
    }

    /// Whether some class is held back by this capacity (a plain load: a hint for choosing the hand-over;
    /// the release's own read-modify-write is what guarantees no lost wake-up).
    #[inline]
    pub(crate) fn has_held_back(&self) -> bool {
        self.slots.load(Ordering::Relaxed) & HELD_BACK_ALL != 0
    }

    #[inline]
    fn take(&self, kv: u64, kv_limit: u64, refuse: u64) -> Result<(), Refused> {
        self.take_slot(refuse)?;
        let taken = if kv == 0 {
            // Nothing to add, but nothing new is admitted while the use is above a shrunk budget either.
            self.kv.load(Ordering::Acquire) <= kv_limit
        } else {
            self.kv
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                    used.checked_add(kv).filter(|n| *n <= kv_limit)
                })
                .is_ok()
        };
        if taken {
            Ok(())
        } else {
            // A waiter may have been held back by the slot meanwhile: the caller runs the dispatcher.
            Err(Refused { shortage: Shortage::Full, dispatch: self.give_back_slot() })
        }
    }

    /// Takes one slot, unless a bit of `refuse` is set or the slots are full.
    #[inline]
    fn take_slot(&self, refuse: u64) -> Result<(), Refused> {
        let limit = self.slot_limit.load(Ordering::Relaxed);
        let mut word = self.slots.load(Ordering::Relaxed);
        loop {
            if word & refuse != 0 {
                return Err(if word & CLOSED != 0 { Shortage::Closed } else { Shortage::HeldBack }.into());
            }
            if word & COUNT_MASK >= limit {
                return Err(Shortage::Full.into());
            }
            match self.slots.compare_exchange_weak(word, word + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => word = actual,
            }
        }
    }

    /// Returns one slot; true if a waiter is held back (run a pass).
    #[inline]
    #[must_use]
    fn give_back_slot(&self) -> bool {
        let old = self.slots.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(old & COUNT_MASK != 0, "slot returned twice");
        old & HELD_BACK_ALL != 0
    }

    /// Returns one slot and `kv` units; true if a waiter is held back by this capacity (the caller must
    /// let the dispatcher run). KV goes back first, then the slot, whose RMW also reads the flags (see
    /// invariant 3).
    #[inline]
    #[must_use]
    pub(crate) fn release(&self, kv: u64) -> bool {
        if kv != 0 {
            let before = self.kv.fetch_sub(kv, Ordering::Release);
            debug_assert!(before >= kv, "KV returned twice");
        }
        self.give_back_slot()
    }

    /// Marks `class` as held back by this capacity (under the waiting room's lock). Returns whether the
    /// bit was newly set.
    pub(crate) fn hold_back(&self, class: usize) -> bool {
        self.slots.fetch_or(held_back_bit(class), Ordering::AcqRel) & held_back_bit(class) == 0
    }

    /// Clears `class`'s held-back bit (under the waiting room's lock).
    pub(crate) fn clear_held_back(&self, class: usize) {
        self.slots.fetch_and(!held_back_bit(class), Ordering::AcqRel);
    }

    /// Whether `class`'s held-back bit is set.
    pub(crate) fn is_held_back(&self, class: usize) -> bool {
        self.slots.load(Ordering::Acquire) & held_back_bit(class) != 0
    }

    /// Sets `CLOSED`: no take succeeds after this returns.
    pub(crate) fn close(&self) {
        self.slots.fetch_or(CLOSED, Ordering::AcqRel);
    }

    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.slots.load(Ordering::Acquire) & CLOSED != 0
    }

    /// Whether `CLOSED` is set, read by a read-modify-write, so that it is ordered against `close`: if
    /// this sees the word before `close` wrote it, everything the caller did before (charging a bucket)
    /// is visible to whoever reads `CLOSED` afterwards — `close` itself, `is_closed`, a request refused
    /// `Closed`; otherwise this sees `CLOSED`. A fence and a plain load are not enough: a `Release` no-op
    /// on every bucket made by `close` orders a late charge after `close` returns, but not after an
    /// observer that saw `CLOSED` before those no-ops ran (the loom models
    /// `an_observer_that_saw_closed_never_sees_a_later_grant` and
    /// `a_request_refused_closed_never_sees_a_later_grant` fail on it).
    pub(crate) fn is_closed_ordered(&self) -> bool {
        self.slots.fetch_or(0, Ordering::AcqRel) & CLOSED != 0
    }

    /// Slots in use.
    pub(crate) fn slots_used(&self) -> u64 {
        self.slots.load(Ordering::Acquire) & COUNT_MASK
    }

    /// KV units in use.
    pub(crate) fn kv_used(&self) -> u64 {
        self.kv.load(Ordering::Acquire)
    }

    /// The slot limit (`MAX_SLOTS` when unlimited).
    pub(crate) fn slot_limit(&self) -> u64 {
        self.slot_limit.load(Ordering::Acquire)
    }

    /// Changes the slot limit; revokes nothing.
    pub(crate) fn set_slot_limit(&self, limit: u64) {
        self.slot_limit.store(limit.min(MAX_SLOTS), Ordering::Release);
    }
}

/// A limit that can change at run time (the global KV budget).
#[derive(Debug)]
pub(crate) struct Limit(AtomicU64);

impl Limit {
    pub(crate) fn new(value: u64) -> Self {
        Self(AtomicU64::new(value))
    }

    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, value: u64) {
        self.0.store(value, Ordering::Release);
    }
}

/// A fraction of the global KV budget, applied to the budget in force at each check so that shares
/// follow [`set_kv_capacity`](crate::Admission::set_kv_capacity).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Share(f64);

impl Share {
    /// `fraction` in `(0, 1]` (validated by the caller).
    pub(crate) fn new(fraction: f64) -> Self {
        Share(fraction.clamp(f64::MIN_POSITIVE, 1.0))
    }

    /// This share of `budget`, rounded down, at least 1 (`u64::MAX` stays unlimited).
    #[inline]
    pub(crate) fn of(self, budget: u64) -> u64 {
        if budget == u64::MAX || self.0 >= 1.0 {
            return budget;
        }
        ((budget as f64) * self.0).floor().max(1.0) as u64
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn takes_are_all_or_nothing_and_release_reports_waiters() {
        let c = Capacity::new(2);
        assert_eq!(c.try_take(5, 10, 1), Ok(()));
        assert_eq!(c.try_take(6, 10, 1), Err(Shortage::Full.into()));
        assert_eq!((c.slots_used(), c.kv_used()), (1, 5));
        assert!(c.hold_back(1));
        assert_eq!(c.try_take(1, 10, 0), Err(Shortage::HeldBack.into()));
        assert_eq!(c.try_take(6, 10, 2), Err(Refused { shortage: Shortage::Full, dispatch: true }));
        assert_eq!(c.try_take(1, 10, 2), Ok(()));
        assert_eq!(c.try_take_for_waiter_of(1, 10, 1), Err(Shortage::Full.into()));
        assert!(c.release(1));
        assert_eq!(c.try_take_for_waiter_of(1, 10, 0), Err(Shortage::HeldBack.into()), "a higher class is held back");
        assert_eq!(c.try_take_for_waiter_of(1, 10, 1), Ok(()), "its own class's bit is passed");
        assert!(c.release(1), "class 1 is still held back");
        c.clear_held_back(1);
        assert!(!c.release(5));
        assert_eq!((c.slots_used(), c.kv_used()), (0, 0));
        c.close();
        assert_eq!(c.try_take_for_waiter_of(0, 10, 0), Err(Shortage::Closed.into()));
    }

    #[test]
    fn shares_follow_the_budget() {
        let half = Share::new(0.5);
        assert_eq!(half.of(1000), 500);
        assert_eq!(half.of(501), 250);
        assert_eq!(half.of(1), 1);
        assert_eq!(half.of(u64::MAX), u64::MAX);
        assert_eq!(Share::new(1.0).of(7), 7);
        assert_eq!(Share::new(0.1).of(1_000_000_000_000), 100_000_000_000);
    }
}
