//! One waiting request as the waiting room keeps it, and the slab that stores them without an allocation
//! per waiter.
//!
//! A waiter's state changes only under the waiting room's lock, so it is a plain enum:
//!
//! ```text
//!            the dispatcher reserved capacity for it: the waiter leaves the slab (granted)
//!  Waiting ──────────────────────────────────────────► (removed; its slot's generation moves on)
//!     │  deadline passed (poll, expire_waiters, timer)
//!     ├──────────────────────────────────────────────► TimedOut
//!     │  close()
//!     ├──────────────────────────────────────────────► Closed
//!     │  the budget shrank below what it needs
//!     ├──────────────────────────────────────────────► TooLarge
//!     │  a full class's longest-queue drop took its place
//!     ├──────────────────────────────────────────────► Displaced
//!     │  controlled delay: it waited `target` in a standing queue, or gave its place in a full one
//!     └──────────────────────────────────────────────► Shed
//! ```
//!
//! A grant removes the waiter from the slab at once (the capacity it reserved is the waiter's now) and
//! bumps its slot's *generation*; every other ending leaves the resolved waiter in its slot until its
//! owner collects it. So an owner learns it was granted by one atomic load, without the lock: if its
//! slot's generation moved on from the one in its [`WaiterKey`], it was granted. That load is the only
//! access to the slab made without the waiting room's lock.
//!
//! # The slab's memory
//! Slots live in chunks of [`CHUNK`] that are allocated when the slab grows and freed only when it is
//! dropped, so a slot never moves: a key can hold a pointer to its slot's generation. The slab is owned by
//! the dispatcher, which every key's owner keeps alive (it holds the admission), so the pointer outlives
//! the key. A slot's `body` is read and written only under the waiting room's lock; its `generation` is
//! written only under the lock (with `Release`) and read by the key's owner (with `Acquire`). Generations
//! are 64-bit, so a slot is never reused often enough to show an old one again.

use crate::admission::Limit;
use crate::sync::{AtomicU64, Ordering, UnsafeCell};
use std::fmt;
use std::ptr::NonNull;
use std::task::Waker;

/// How a wait ends, decided under the waiting room's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitState {
    /// Still waiting.
    Waiting,
    /// Its deadline passed.
    TimedOut,
    /// The admission was closed.
    Closed,
    /// A resize left it needing more than the whole of `limit`.
    TooLarge { limit: Limit, requested: u64, capacity: u64 },
    /// Its class's waiting room was full and it was the newest waiter of the longest flow: a request of a
    /// shorter flow took its place.
    Displaced { retry_after: std::time::Duration },
    /// Controlled delay: it waited `target` in a standing queue (`NoCapacity` with the capacity estimate).
    Shed { retry_after: std::time::Duration },
}

/// How to wake a waiter's owner.
#[derive(Debug)]
pub(crate) enum Notify {
    /// An async task: its latest waker (taken when it is woken).
    Task(Option<Waker>),
    /// A thread blocked in `admit_blocking`.
    #[cfg(not(loom))]
    Thread(std::thread::Thread),
}

impl Notify {
    /// What to wake, taken out so that it can be called after the lock is released.
    pub(crate) fn take(&mut self) -> Option<Wake> {
        match self {
            Notify::Task(waker) => waker.take().map(Wake::Task),
            #[cfg(not(loom))]
            Notify::Thread(thread) => Some(Wake::Thread(thread.clone())),
        }
    }

    /// Keeps the task's latest waker: `new` (cloned by the caller, outside the waiting room's lock)
    /// replaces the one held unless that one wakes the same task. Returns the waker to drop — the old one
    /// or the unused new one — for the caller to drop outside the lock (a waker's clone and drop are user
    /// code).
    pub(crate) fn update(&mut self, new: Waker) -> Option<Waker> {
        #[cfg_attr(loom, allow(irrefutable_let_patterns))]
        if let Notify::Task(slot) = self {
            return match slot {
                Some(old) if old.will_wake(&new) => Some(new),
                _ => slot.replace(new),
            };
        }
        Some(new)
    }
}

/// A wake-up taken out of the waiting room, to run once no lock is held.
#[derive(Debug)]
pub(crate) enum Wake {
    Task(Waker),
    #[cfg(not(loom))]
    Thread(std::thread::Thread),
}

impl Wake {
    /// Runs it: user code (a waker) or an unpark.
    pub(crate) fn wake(self) {
        match self {
            Wake::Task(waker) => waker.wake(),
            #[cfg(not(loom))]
            Wake::Thread(thread) => thread.unpark(),
        }
    }
}

/// A waiting request.
#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) state: WaitState,
    /// Priority class index.
    pub(crate) class: usize,
    /// KV units it reserves once granted (its own: beyond a shared prefix it refers to).
    pub(crate) kv: u64,
    /// The shared prefix whose table entry it refers to.
    pub(crate) prefix: Option<crate::admission::prefix::PrefixId>,
    /// What it does not reserve if it finds that prefix held when granted (`Split::saving`).
    pub(crate) saving: u64,
    /// Its weighted token cost (token fairness).
    pub(crate) cost: u64,
    /// Its deadline is a start deadline: it leaves early once it cannot start in time.
    pub(crate) start_deadline: bool,
    /// Its flow in its class's fair queue.
    pub(crate) flow: u32,
    /// Neighbours in its flow's queue (older, newer).
    pub(crate) prev: Option<u32>,
    pub(crate) next: Option<u32>,
    /// When it queued, in clock nanoseconds (0 when the waiting room reads no clock).
    pub(crate) queued_at: u64,
    /// Its deadline is controlled delay's `target` (it queued while its class stood), not a limit of its
    /// own: reaching it is a shed, not a timeout.
    pub(crate) policy_deadline: bool,
    /// Clock reading after which the wait ends (`u64::MAX`: never).
    pub(crate) deadline: u64,
    pub(crate) notify: Notify,
}

impl Waiter {
    pub(crate) fn new(class: usize, kv: u64, deadline: u64, notify: Notify) -> Self {
        Self {
            state: WaitState::Waiting,
            class,
            kv,
            prefix: None,
            saving: 0,
            cost: 0,
            start_deadline: false,
            flow: 0,
            prev: None,
            next: None,
            deadline,
            queued_at: 0,
            policy_deadline: false,
            notify,
        }
    }
}

/// Slots per chunk of the slab.
pub(crate) const CHUNK: usize = 32;

#[derive(Debug)]
enum Entry {
    Occupied(Waiter),
    Vacant { next_free: Option<u32> },
}

struct Slot {
    /// Bumped whenever the slot's waiter leaves it (see the module docs).
    generation: AtomicU64,
    body: UnsafeCell<Entry>,
}

/// What a waiter's owner holds: its slot, and the slot's generation when the waiter was stored.
pub(crate) struct WaiterKey {
    index: u32,
    generation: u64,
    /// The slot's generation counter (valid as long as the slab: see the module docs).
    counter: NonNull<AtomicU64>,
}

// SAFETY: `counter` points at an atomic in a chunk that outlives the key (the key's owner keeps the slab's
// dispatcher alive) and is only read atomically; the rest of the key is plain data.
unsafe impl Send for WaiterKey {}
// SAFETY: as for `Send`: shared access only reads the atomic.
unsafe impl Sync for WaiterKey {}

impl fmt::Debug for WaiterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaiterKey").field("index", &self.index).field("generation", &self.generation).finish()
    }
}

impl PartialEq for WaiterKey {
    fn eq(&self, other: &Self) -> bool {
        (self.index, self.generation) == (other.index, other.generation)
    }
}
impl Eq for WaiterKey {}
impl PartialOrd for WaiterKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for WaiterKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.index, self.generation).cmp(&(other.index, other.generation))
    }
}

impl Clone for WaiterKey {
    fn clone(&self) -> Self {
        *self
    }
}
impl Copy for WaiterKey {}

impl WaiterKey {
    pub(crate) fn index(self) -> u32 {
        self.index
    }

    /// Whether the waiter was granted (and removed from the slab), read without the lock. `Acquire`: the
    /// grant's bookkeeping, made before the generation moved on, is visible after a `true`.
    #[inline]
    pub(crate) fn granted(&self) -> bool {
        // SAFETY: `counter` is valid for the key's life (module docs) and only accessed atomically.
        unsafe { self.counter.as_ref() }.load(Ordering::Acquire) != self.generation
    }
}

/// Waiters by index, in chunks that never move. Freed slots are reused, so after the peak number of
/// simultaneous waiters has been reached nothing is allocated per waiter.
#[derive(Default)]
pub(crate) struct Slab {
    /// Each points at `CHUNK` slots allocated as a `Box<[Slot]>`, freed in `Drop`.
    chunks: Vec<NonNull<Slot>>,
    free: Option<u32>,
    /// Slots handed out so far (the next never-used index).
    used: u32,
}

// SAFETY: the slab owns its chunks (like a `Vec<Box<[Slot]>>`); `Slot` holds a `Waiter` (`Send`) behind a
// cell that is only accessed under the waiting room's lock, and an atomic.
unsafe impl Send for Slab {}

impl fmt::Debug for Slab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slab").field("chunks", &self.chunks.len()).field("used", &self.used).finish()
    }
}

impl Slab {
    fn slot(&self, index: u32) -> &Slot {
        let (chunk, offset) = (index as usize / CHUNK, index as usize % CHUNK);
        // SAFETY: `index < used`, so its chunk was allocated with `CHUNK` slots and is alive until `Drop`;
        // only shared references to slots are ever made.
        unsafe { &*self.chunks[chunk].as_ptr().add(offset) }
    }

    fn entry(&self, index: u32) -> &Entry {
        // SAFETY: bodies are accessed only under the waiting room's lock, which the caller holds (it has the
        // slab, which lives inside the room); no `&mut` to this body is alive (the borrow of `self` is
        // shared).
        self.slot(index).body.with(|entry| unsafe { &*entry })
    }

    fn entry_mut(&mut self, index: u32) -> &mut Entry {
        // SAFETY: as in `entry`; `&mut self` makes this the only reference into the slab's bodies.
        self.slot(index).body.with_mut(|entry| unsafe { &mut *entry })
    }

    /// Stores `waiter`, returning its key.
    pub(crate) fn insert(&mut self, waiter: Waiter) -> WaiterKey {
        let index = match self.free {
            Some(index) => {
                let Entry::Vacant { next_free } = *self.entry(index) else {
                    unreachable!("the free list holds vacant slots")
                };
                self.free = next_free;
                index
            }
            None => {
                if self.used as usize == self.chunks.len() * CHUNK {
                    let chunk: Box<[Slot]> = (0..CHUNK)
                        .map(|_| Slot {
                            generation: AtomicU64::new(0),
                            body: UnsafeCell::new(Entry::Vacant { next_free: None }),
                        })
                        .collect();
                    let ptr = Box::into_raw(chunk).cast::<Slot>();
                    self.chunks.push(NonNull::new(ptr).expect("Box::into_raw is never null"));
                }
                self.used = self.used.checked_add(1).expect("fewer than 2^32 waiters");
                self.used - 1
            }
        };
        *self.entry_mut(index) = Entry::Occupied(waiter);
        let slot = self.slot(index);
        WaiterKey {
            index,
            generation: slot.generation.load(Ordering::Relaxed),
            counter: NonNull::from(&slot.generation),
        }
    }

    /// The waiter at `index` (which must be occupied: flows and owners only hold live indices).
    pub(crate) fn get(&self, index: u32) -> &Waiter {
        match self.entry(index) {
            Entry::Occupied(waiter) => waiter,
            Entry::Vacant { .. } => unreachable!("a flow or owner holds a vacant index"),
        }
    }

    pub(crate) fn get_mut(&mut self, index: u32) -> &mut Waiter {
        match self.entry_mut(index) {
            Entry::Occupied(waiter) => waiter,
            Entry::Vacant { .. } => unreachable!("a flow or owner holds a vacant index"),
        }
    }

    /// The waiter `key` names, if it is still in its slot (timer entries and granted keys may be stale).
    pub(crate) fn lookup(&self, key: WaiterKey) -> Option<&Waiter> {
        if key.index >= self.used || self.slot(key.index).generation.load(Ordering::Relaxed) != key.generation {
            return None;
        }
        match self.entry(key.index) {
            Entry::Occupied(waiter) => Some(waiter),
            Entry::Vacant { .. } => None,
        }
    }

    /// Takes the waiter out of slot `index` and frees the slot; its generation moves on (`Release`), which
    /// tells an owner polling without the lock that it no longer waits there.
    pub(crate) fn remove(&mut self, index: u32) -> Waiter {
        let next_free = self.free;
        let entry = std::mem::replace(self.entry_mut(index), Entry::Vacant { next_free });
        let Entry::Occupied(waiter) = entry else { unreachable!("removing a live waiter") };
        self.freed(index);
        waiter
    }

    /// Slot `index` was just made vacant: its generation moves on (`Release`) and it heads the free list.
    fn freed(&mut self, index: u32) {
        // Written only under the lock, so a load and a store suffice (no read-modify-write).
        let generation = &self.slot(index).generation;
        generation.store(generation.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
        self.free = Some(index);
    }

    /// Frees slot `index` as [`remove`](Self::remove) does, dropping its waiter in place: for a granted
    /// waiter whose wake-up was taken out already (what is left of it holds no user code).
    pub(crate) fn discard(&mut self, index: u32) {
        let next_free = self.free;
        let entry = self.entry_mut(index);
        debug_assert!(matches!(entry, Entry::Occupied(_)), "discarding a vacant slot");
        *entry = Entry::Vacant { next_free };
        self.freed(index);
    }

    /// Keys of the waiters still waiting (for a resize scan or close).
    pub(crate) fn waiting_keys(&self) -> Vec<WaiterKey> {
        (0..self.used)
            .filter_map(|index| match self.entry(index) {
                Entry::Occupied(w) if w.state == WaitState::Waiting => {
                    let slot = self.slot(index);
                    Some(WaiterKey {
                        index,
                        generation: slot.generation.load(Ordering::Relaxed),
                        counter: NonNull::from(&slot.generation),
                    })
                }
                _ => None,
            })
            .collect()
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        for chunk in self.chunks.drain(..) {
            let slice = std::ptr::slice_from_raw_parts_mut(chunk.as_ptr(), CHUNK);
            // SAFETY: allocated in `insert` as a `Box<[Slot]>` of `CHUNK` slots and freed only here, once.
            drop(unsafe { Box::from_raw(slice) });
        }
    }
}
