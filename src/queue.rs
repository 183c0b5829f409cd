//! A lock-free, bounded, multi-producer multi-consumer FIFO queue.
//!
//! [`BoundedQueue`] implements Dmitry Vyukov's bounded MPMC queue ("Bounded MPMC queue", 1024cores.net):
//! a fixed ring of slots, each carrying a *stamp*, plus two cache-padded counters, `head` (next position to
//! pop) and `tail` (next position to push). Its API mirrors `crossbeam_queue::ArrayQueue`, so code can
//! switch between the two by changing the type name.
//!
//! # Invariant
//!
//! Write positions as `(lap, index)` and order them lap first. At every instant:
//!
//! 1. `head <= tail <= head + capacity` (in positions), and each counter only moves forward.
//! 2. A slot's stamp says who may touch its value next:
//!    - `stamp == (lap, index)`: the slot is **empty**; only the push that claims tail position
//!      `(lap, index)` may write it.
//!    - `stamp == (lap, index) + 1`: the slot is **full**, holding the value pushed at `(lap, index)`; only
//!      the operation that claims head position `(lap, index)` may read it.
//! 3. A thread touches a slot's value only between winning the compare-and-swap that moves `head` or
//!    `tail` past that slot's position and publishing the slot's next stamp. Claiming is exclusive (one CAS
//!    wins per position), so no two threads ever access one value at the same time.
//!
//! The slots at positions `head..tail` are full or being written; all others are empty or being read.
//!
//! # Encoding of positions and stamps
//!
//! `one_lap` is the smallest power of two strictly greater than the capacity. A position, and a stamp, is
//! one `usize`: the low `log2(one_lap)` bits hold the **index** (`0..capacity`, or `capacity` in a full
//! slot's stamp `(lap, capacity - 1) + 1`), the remaining high bits hold the **lap** (how many times the
//! counter has wrapped around the ring, modulo `2^(usize::BITS - log2(one_lap))`). Advancing a position
//! adds 1 to the index, or, from the last index, clears the index and adds `one_lap` (one lap) with wrapping
//! arithmetic. This avoids a division on the hot path while keeping positions of consecutive laps distinct.
//! The capacity is limited (see [`BoundedQueue::new`]) so that at least four laps fit: the algorithm compares
//! positions that are at most one lap apart, so they never alias.
//!
//! Slot `i` starts with stamp `(0, i)`. A push at `(lap, i)` stores `(lap, i) + 1`; the pop at `(lap, i)`
//! stores `(lap + 1, i)`, which is exactly what the push one lap later expects.
//!
//! # Memory orderings
//!
//! - **Stamps** are stored with `Release` after the value is written (or read) and loaded with `Acquire`
//!   before claiming the slot. This is the only data hand-off: the push's write of a value happens-before
//!   the pop's read, and the pop's read happens-before the next lap's write.
//! - **`head`/`tail` CAS** succeed with `SeqCst` and fail with `Relaxed`: the CAS only arbitrates which
//!   thread owns a position; the value itself is published by the stamp.
//! - **Full/empty checks**: when a push finds its slot still full from the previous lap (or a pop finds
//!   its slot still empty), it issues a `SeqCst` fence before reading the opposite counter. Together with
//!   the `SeqCst` CAS operations this keeps the read from returning a counter value older than any CAS that
//!   precedes the fence in the single total order of `SeqCst` operations, so `push` does not report
//!   "full" (nor `pop` "empty") on the strength of a counter that another thread had already moved on.
//! - **`force_push` on a full queue** claims the oldest item with a `SeqCst` CAS on `head`, exactly like a
//!   pop; being a read-modify-write, it always sees the latest `head`, so no fence is needed. It then stores
//!   `tail` (no other thread can move `tail` while that slot is claimed) and publishes the slot's new value
//!   with a `Release` stamp, as a push does.
//! - Initial loads of a counter are `Relaxed`: a stale value is caught by the stamp check or the CAS.
//!
//! # Progress
//!
//! As in Vyukov's design, a pop that reaches a slot whose push has claimed the position but not yet stored
//! the value waits (spinning, then yielding) for that push to finish; the same holds for a push behind a
//! slow pop. No operation allocates.
//!
//! # Changing this file
//!
//! - `push` and `force_push` share one claim loop (`push_or_else`) and differ only in what they do with a
//!   slot still full from the previous lap: `push` refuses if the queue is full, `force_push` displaces the
//!   oldest item. A change to claiming is a change to both; the loom models in `tests/queue_loom.rs` drive
//!   both against `pop`.
//! - A thread touches a slot's value only inside a claim (invariant 3), and every `unsafe` block says which
//!   claim makes it sound; an access outside a claim is a data race that loom reports.
//! - Every ordering above has its reason next to it; weaken one only with a loom model that shows why the
//!   weaker one still suffices.
//! - Spinning goes through `SpinWait`, which spins once (a loom yield) under `cfg(loom)` so that the models
//!   stay small.

use std::fmt;
use std::iter::FusedIterator;
use std::mem::MaybeUninit;
use std::ops::ControlFlow;
use std::panic::{RefUnwindSafe, UnwindSafe};

use crate::sync::{AtomicUsize, CachePadded, Ordering, UnsafeCell, fence, spin_loop, yield_now};

/// The largest capacity [`BoundedQueue::new`] accepts: `one_lap` may use at most `usize::BITS - 2` bits, so
/// that at least four laps are distinguishable.
const MAX_CAPACITY: usize = (1 << (usize::BITS - 2)) - 1;

/// One cell of the ring: a stamp (see the module docs) and storage for one value.
struct Slot<T> {
    /// `(lap, index)` when empty for the push at that position, `(lap, index) + 1` when full.
    stamp: AtomicUsize,
    /// Initialised exactly when the stamp says "full" (or while the owner of a claim is moving the value).
    value: UnsafeCell<MaybeUninit<T>>,
}

/// A lock-free, bounded, multi-producer multi-consumer FIFO queue (Vyukov's algorithm).
///
/// The capacity is fixed at construction and all storage is allocated once; `push` and `pop` never
/// allocate. Every method takes `&self`, so the queue can be shared through an `Arc` or a reference.
/// See the [module documentation](self) for the algorithm and its invariant.
///
/// # Examples
///
/// ```
/// use kvgate::queue::BoundedQueue;
///
/// let q = BoundedQueue::new(2);
/// assert_eq!(q.push('a'), Ok(()));
/// assert_eq!(q.push('b'), Ok(()));
/// assert_eq!(q.push('c'), Err('c'));
/// assert_eq!(q.pop(), Some('a'));
/// ```
pub struct BoundedQueue<T> {
    /// Next position to pop, as `(lap, index)`.
    head: CachePadded<AtomicUsize>,
    /// Next position to push, as `(lap, index)`.
    tail: CachePadded<AtomicUsize>,
    /// The ring; its length is the capacity.
    slots: Box<[Slot<T>]>,
    /// Smallest power of two greater than the capacity: adding it to a position moves it one lap on.
    one_lap: usize,
}

// SAFETY: the queue owns its `T`s and only moves them between threads (a value pushed on one thread may be
// popped or dropped on another), which `T: Send` allows. It never hands out references to a stored `T`.
unsafe impl<T: Send> Send for BoundedQueue<T> {}

// SAFETY: shared access (`&self`) only moves whole values in and out of slots, and invariant 3 of the
// module docs guarantees each slot's value is accessed by at most one thread at a time, with a
// Release/Acquire stamp hand-off in between. No `&T` is ever shared, so `T: Sync` is not needed.
unsafe impl<T: Send> Sync for BoundedQueue<T> {}

// A panic can never leave the queue half-updated: no operation runs user code while it holds a claim, so
// the only concern is the stored values themselves, which a `&BoundedQueue<T>` can move out by value.
impl<T: UnwindSafe> UnwindSafe for BoundedQueue<T> {}
impl<T: UnwindSafe> RefUnwindSafe for BoundedQueue<T> {}

impl<T> BoundedQueue<T> {
    /// Creates an empty queue that holds at most `cap` items.
    ///
    /// # Panics
    ///
    /// Panics if `cap` is 0, or if `cap` exceeds `2^(usize::BITS - 2) - 1` (the position encoding needs
    /// two bits for laps). Like any allocation, also panics if the ring does not fit in `isize::MAX` bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// let q = BoundedQueue::<u32>::new(100);
    /// assert_eq!(q.capacity(), 100);
    /// assert!(q.is_empty());
    /// ```
    pub fn new(cap: usize) -> Self {
        assert!(cap > 0, "BoundedQueue capacity must be at least 1");
        assert!(cap <= MAX_CAPACITY, "BoundedQueue capacity {cap} is too large (at most {MAX_CAPACITY})");
        // Cannot overflow: cap + 1 <= 2^(BITS - 2), already a power of two at the limit.
        let one_lap = (cap + 1).next_power_of_two();
        let slots = (0..cap)
            .map(|i| Slot { stamp: AtomicUsize::new(i), value: UnsafeCell::new(MaybeUninit::uninit()) })
            .collect();
        Self { head: CachePadded(AtomicUsize::new(0)), tail: CachePadded(AtomicUsize::new(0)), slots, one_lap }
    }

    /// Appends `value` at the back, or gives it back in `Err` if the queue is full.
    ///
    /// # Errors
    ///
    /// Returns `Err(value)` if the queue was full at some instant during the call.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// let q = BoundedQueue::new(1);
    /// assert_eq!(q.push(10), Ok(()));
    /// assert_eq!(q.push(20), Err(20));
    /// ```
    pub fn push(&self, value: T) -> Result<(), T> {
        self.push_or_else(value, Ok(()), |value, tail, _| {
            // The slot still holds the value pushed one lap ago: full, unless a pop of that value is in
            // progress or `tail` is stale. The fence keeps the `head` read from being older than any
            // counter CAS before it (see the module docs).
            fence(Ordering::SeqCst);
            let head = self.head.load(Ordering::Relaxed);
            if head.wrapping_add(self.one_lap) == tail {
                ControlFlow::Break(Err(value))
            } else {
                ControlFlow::Continue(value)
            }
        })
    }

    /// Appends `value` at the back; if the queue is full, first removes the front (oldest) item and returns
    /// it.
    ///
    /// The removal and the append form one step: a concurrent `pop` either takes the oldest item before it
    /// is displaced, or never sees it. Every item therefore leaves the queue exactly once, through `pop`,
    /// through `force_push`'s return value, or when the queue is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// let q = BoundedQueue::new(2);
    /// assert_eq!(q.force_push(1), None);
    /// assert_eq!(q.force_push(2), None);
    /// assert_eq!(q.force_push(3), Some(1));
    /// assert_eq!(q.pop(), Some(2));
    /// assert_eq!(q.pop(), Some(3));
    /// ```
    pub fn force_push(&self, value: T) -> Option<T> {
        self.push_or_else(value, None, |value, tail, slot| {
            // No fence needed here: the CAS below reads the latest `head` whatever the ordering.
            let head = tail.wrapping_sub(self.one_lap);
            // If `head` is still one lap behind `tail`, the queue is full and this slot holds its oldest
            // item. Claim that item the way a pop would: by moving `head` past it. Exactly one of us and
            // the concurrent pops can win this CAS.
            if self.head.compare_exchange_weak(head, self.advance(head), Ordering::SeqCst, Ordering::Relaxed).is_err() {
                // Not full after all (a pop moved `head`), or `tail` is stale: retry.
                return ControlFlow::Continue(value);
            }
            // Nobody else can move `tail` now: a push needs this slot's stamp to equal `tail`, which only
            // happens after the value we just claimed is consumed, and we own that consumption.
            self.tail.store(self.advance(tail), Ordering::SeqCst);
            // SAFETY: the won `head` CAS claimed head position `head`, whose slot is full (its stamp is
            // `head + 1`, checked by the claim loop with Acquire, so the value's write happened-before this
            // read); by invariant 3 the value is ours until we publish a new stamp. We replace it in place
            // and republish the slot as full for position `tail`.
            let old = slot.value.with_mut(|p| unsafe { p.replace(MaybeUninit::new(value)) });
            slot.stamp.store(tail.wrapping_add(1), Ordering::Release);
            // SAFETY: the slot was full (stamp `head + 1`), so `old` was initialised.
            ControlFlow::Break(Some(unsafe { old.assume_init() }))
        })
    }

    /// The claim loop of [`push`](Self::push) and [`force_push`](Self::force_push): claims the next tail
    /// position whose slot is empty for this lap and fills it, returning `pushed`; or, when that slot still
    /// holds the value pushed one lap earlier, lets `when_full` decide. `when_full` gets the value back, the
    /// tail position and its slot, and either ends the push with its own result (`Break`) or hands the
    /// value back to retry from a fresh `tail` (`Continue`). The two callers differ only there: `push`
    /// refuses when the queue really is full, `force_push` displaces the oldest item.
    #[inline(always)]
    fn push_or_else<R>(
        &self,
        mut value: T,
        pushed: R,
        when_full: impl Fn(T, usize, &Slot<T>) -> ControlFlow<R, T>,
    ) -> R {
        let mut spin = SpinWait::new();
        let mut tail = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(tail);
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == tail {
                // The slot is empty for this lap: try to claim the position.
                match self.tail.compare_exchange_weak(tail, self.advance(tail), Ordering::SeqCst, Ordering::Relaxed) {
                    Ok(_) => {
                        // SAFETY: winning the CAS claimed tail position `tail`, whose slot's stamp is `tail`
                        // (empty): by invariant 3 no other thread touches the value until we store the new
                        // stamp, and the slot holds no initialised value that could be overwritten.
                        unsafe { self.fill(slot, tail, value) };
                        return pushed;
                    }
                    Err(current) => {
                        tail = current;
                        spin.spin();
                    }
                }
            } else if stamp.wrapping_add(self.one_lap) == tail.wrapping_add(1) {
                // The slot still holds the value pushed one lap ago.
                match when_full(value, tail, slot) {
                    ControlFlow::Break(result) => return result,
                    ControlFlow::Continue(back) => value = back,
                }
                spin.snooze();
                tail = self.tail.load(Ordering::Relaxed);
            } else {
                // `tail` is stale: another push already used this position.
                spin.snooze();
                tail = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Removes and returns the front (oldest) item, or `None` if the queue is empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// let q = BoundedQueue::new(4);
    /// q.push("x").unwrap();
    /// assert_eq!(q.pop(), Some("x"));
    /// assert_eq!(q.pop(), None);
    /// ```
    pub fn pop(&self) -> Option<T> {
        let mut spin = SpinWait::new();
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            let slot = self.slot(head);
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == head.wrapping_add(1) {
                // The slot is full for this lap: try to claim the position.
                match self.head.compare_exchange_weak(head, self.advance(head), Ordering::SeqCst, Ordering::Relaxed) {
                    Ok(_) => {
                        // SAFETY: winning the CAS claimed head position `head`, whose slot's stamp is
                        // `head + 1` (full, loaded with Acquire so the value's write happened-before); by
                        // invariant 3 the value is ours to move out until we store the next stamp.
                        let value = slot.value.with(|p| unsafe { p.read().assume_init() });
                        slot.stamp.store(head.wrapping_add(self.one_lap), Ordering::Release);
                        return Some(value);
                    }
                    Err(current) => {
                        head = current;
                        spin.spin();
                    }
                }
            } else if stamp == head {
                // The slot has not been written for this lap yet.
                fence(Ordering::SeqCst);
                let tail = self.tail.load(Ordering::Relaxed);
                if tail == head {
                    return None;
                }
                // A push has claimed the slot but not stored its value yet, or `head` is stale.
                spin.snooze();
                head = self.head.load(Ordering::Relaxed);
            } else {
                // `head` is stale: another pop already used this position.
                spin.snooze();
                head = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// The maximum number of items the queue holds.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// assert_eq!(BoundedQueue::<()>::new(7).capacity(), 7);
    /// ```
    #[inline]
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The number of items in the queue: a snapshot that concurrent operations may already have changed.
    ///
    /// Items whose push or pop is in progress are counted as present.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// let q = BoundedQueue::new(3);
    /// q.push(1).unwrap();
    /// q.push(2).unwrap();
    /// assert_eq!(q.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        loop {
            let tail = self.tail.load(Ordering::SeqCst);
            let head = self.head.load(Ordering::SeqCst);
            // Only trust a pair of counters that were consistent at one instant: `tail` unchanged around
            // the read of `head`.
            if self.tail.load(Ordering::SeqCst) != tail {
                continue;
            }
            let mask = self.one_lap - 1;
            let (h, t) = (head & mask, tail & mask);
            return if h < t {
                t - h
            } else if h > t {
                self.capacity() - h + t
            } else if head == tail {
                0
            } else {
                self.capacity()
            };
        }
    }

    /// Whether the queue holds no items (a snapshot, like [`len`](Self::len)).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// let q = BoundedQueue::new(1);
    /// assert!(q.is_empty());
    /// q.push(()).unwrap();
    /// assert!(!q.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        let head = self.head.load(Ordering::SeqCst);
        let tail = self.tail.load(Ordering::SeqCst);
        head == tail
    }

    /// Whether the queue holds [`capacity`](Self::capacity) items (a snapshot, like [`len`](Self::len)).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// let q = BoundedQueue::new(1);
    /// assert!(!q.is_full());
    /// q.push(()).unwrap();
    /// assert!(q.is_full());
    /// ```
    pub fn is_full(&self) -> bool {
        let tail = self.tail.load(Ordering::SeqCst);
        let head = self.head.load(Ordering::SeqCst);
        head.wrapping_add(self.one_lap) == tail
    }

    /// The slot that position `pos` maps to.
    ///
    /// `pos` must be a value read from `head` or `tail` (or derived from one with [`advance`](Self::advance)).
    #[inline]
    fn slot(&self, pos: usize) -> &Slot<T> {
        let index = pos & (self.one_lap - 1);
        debug_assert!(index < self.slots.len());
        // SAFETY: positions start at index 0 and only `advance` moves them, which never produces an index
        // of `capacity` or more (it wraps to the next lap instead), so `index < capacity == slots.len()`.
        unsafe { self.slots.get_unchecked(index) }
    }

    /// The position after `pos`: next index, or index 0 of the next lap.
    #[inline]
    fn advance(&self, pos: usize) -> usize {
        let index = pos & (self.one_lap - 1);
        if index + 1 < self.slots.len() { pos + 1 } else { (pos & !(self.one_lap - 1)).wrapping_add(self.one_lap) }
    }

    /// Writes `value` into `slot` and publishes it as full for position `tail`.
    ///
    /// # Safety
    ///
    /// The caller must have claimed tail position `tail` (won the CAS moving `tail` past it) and observed
    /// the slot's stamp equal to `tail`, so the slot is empty and exclusively the caller's.
    #[inline]
    unsafe fn fill(&self, slot: &Slot<T>, tail: usize, value: T) {
        // SAFETY: the caller's claim makes this the only access to the value; the slot holds no initialised
        // value, so nothing is leaked by overwriting it.
        slot.value.with_mut(|p| unsafe { p.write(MaybeUninit::new(value)) });
        slot.stamp.store(tail.wrapping_add(1), Ordering::Release);
    }
}

impl<T> Drop for BoundedQueue<T> {
    fn drop(&mut self) {
        if !std::mem::needs_drop::<T>() {
            return;
        }
        /// Drops what is left if one item's destructor panics, as `Vec` does.
        struct DropRest<'a, T>(&'a BoundedQueue<T>);
        impl<T> Drop for DropRest<'_, T> {
            fn drop(&mut self) {
                while self.0.pop().is_some() {}
            }
        }
        let rest = DropRest(self);
        // `&mut self`: no operation is in flight, so every slot in `head..tail` is full and `pop` never waits.
        while let Some(item) = rest.0.pop() {
            drop(item);
        }
    }
}

impl<T> fmt::Debug for BoundedQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedQueue")
            .field("capacity", &self.capacity())
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

impl<T> IntoIterator for BoundedQueue<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;

    /// Consumes the queue, yielding the remaining items front to back.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::queue::BoundedQueue;
    ///
    /// let q = BoundedQueue::new(3);
    /// q.push(1).unwrap();
    /// q.push(2).unwrap();
    /// assert_eq!(q.into_iter().collect::<Vec<_>>(), [1, 2]);
    /// ```
    fn into_iter(self) -> IntoIter<T> {
        IntoIter { queue: self }
    }
}

/// An owning iterator over the items of a [`BoundedQueue`], front to back.
///
/// Items not consumed are dropped with the iterator.
///
/// # Examples
///
/// ```
/// use kvgate::queue::BoundedQueue;
///
/// let q = BoundedQueue::new(2);
/// q.push("a").unwrap();
/// let mut it = q.into_iter();
/// assert_eq!(it.len(), 1);
/// assert_eq!(it.next(), Some("a"));
/// assert_eq!(it.next(), None);
/// ```
pub struct IntoIter<T> {
    queue: BoundedQueue<T>,
}

impl<T> Iterator for IntoIter<T> {
    type Item = T;

    fn next(&mut self) -> Option<T> {
        // The iterator owns the queue, so `pop` runs uncontended and never waits.
        self.queue.pop()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let len = self.queue.len();
        (len, Some(len))
    }
}

impl<T> ExactSizeIterator for IntoIter<T> {}

impl<T> FusedIterator for IntoIter<T> {}

impl<T> fmt::Debug for IntoIter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IntoIter").field("remaining", &self.queue.len()).finish()
    }
}

/// Waiting strategy for contended or in-progress slots: spin with growing pauses, then yield the thread.
struct SpinWait {
    step: u32,
}

impl SpinWait {
    /// After this many doublings of the pause, yield to the scheduler instead of spinning.
    const YIELD_AFTER: u32 = 6;

    #[inline]
    fn new() -> Self {
        Self { step: 0 }
    }

    /// Brief pause after a lost CAS: another thread made progress, so retry soon.
    #[inline]
    fn spin(&mut self) {
        #[cfg(not(loom))]
        for _ in 0..1u32 << self.step.min(Self::YIELD_AFTER) {
            spin_loop();
        }
        #[cfg(loom)]
        spin_loop();
        self.step = (self.step + 1).min(Self::YIELD_AFTER);
    }

    /// Pause while waiting for another thread to finish its step; yields once spinning stops paying off.
    #[inline]
    fn snooze(&mut self) {
        if cfg!(loom) || self.step >= Self::YIELD_AFTER {
            yield_now();
        } else {
            for _ in 0..1u32 << self.step {
                spin_loop();
            }
            self.step += 1;
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn encoding_wraps_laps() {
        let q = BoundedQueue::new(3);
        assert_eq!(q.one_lap, 4);
        for round in 0..20 {
            for i in 0..3 {
                q.push(round * 3 + i).unwrap();
            }
            assert!(q.is_full());
            assert_eq!(q.len(), 3);
            for i in 0..3 {
                assert_eq!(q.pop(), Some(round * 3 + i));
            }
            assert!(q.is_empty());
        }
    }

    #[test]
    fn advance_skips_unused_indices() {
        let q = BoundedQueue::<()>::new(5);
        assert_eq!(q.one_lap, 8);
        assert_eq!(q.advance(3), 4);
        assert_eq!(q.advance(4), 8);
        assert_eq!(q.advance(8 + 4), 16);
        assert_eq!(q.advance((usize::MAX & !7) | 4), 0, "laps wrap around");
    }

    #[test]
    fn len_counts_across_lap_boundary() {
        let q = BoundedQueue::new(4);
        for i in 0..3 {
            q.push(i).unwrap();
        }
        q.pop();
        q.pop();
        q.push(3).unwrap();
        q.push(4).unwrap();
        q.push(5).unwrap();
        assert_eq!(q.len(), 4);
        assert!(q.is_full());
        assert_eq!(q.force_push(6), Some(2));
        assert_eq!(q.into_iter().collect::<Vec<_>>(), [3, 4, 5, 6]);
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn zero_capacity_panics() {
        let _ = BoundedQueue::<u8>::new(0);
    }

    #[test]
    #[should_panic(expected = "too large")]
    fn absurd_capacity_panics() {
        let _ = BoundedQueue::<u8>::new(MAX_CAPACITY + 1);
    }

    #[test]
    fn debug_shows_capacity_and_len_only() {
        let q = BoundedQueue::new(2);
        q.push(String::from("secret")).unwrap();
        let s = format!("{q:?}");
        assert_eq!(s, "BoundedQueue { capacity: 2, len: 1, .. }");
        assert_eq!(format!("{:?}", q.into_iter()), "IntoIter { remaining: 1 }");
    }

    #[test]
    fn auto_traits() {
        fn send_sync<X: Send + Sync>() {}
        fn unwind<X: UnwindSafe + RefUnwindSafe>() {}
        send_sync::<BoundedQueue<std::cell::Cell<u8>>>();
        send_sync::<IntoIter<std::cell::Cell<u8>>>();
        unwind::<BoundedQueue<String>>();
    }
}
