//! One waiting request as the waiting room keeps it, and the slab that stores them without an allocation
//! per waiter.
//!
//! A waiter's state changes only under the waiting room's lock, so it is a plain enum:
//!
//! ```text
//!            the dispatcher reserved capacity for it             its owner stopped waiting
//!  Waiting ──────────────────────────────────────────► Granted     (the entry is removed)
//!     │  deadline passed (poll, expire_waiters, timer)
//!     ├──────────────────────────────────────────────► TimedOut
//!     │  close()
//!     ├──────────────────────────────────────────────► Closed
//!     │  the budget shrank below what it needs
//!     └──────────────────────────────────────────────► TooLarge
//! ```
//!
//! Only the waiter's owner (its `Admit` future or blocking call) removes its entry, so the index it holds
//! stays valid until then; the generation in its [`WaiterKey`] guards the timer's entries, which may
//! outlive the waiter.

use crate::admission::Limit;
use std::task::Waker;

/// How a wait ends, decided under the waiting room's lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitState {
    /// Still waiting.
    Waiting,
    /// Capacity is reserved for it: its owner turns it into a permit or gives it back.
    Granted,
    /// Its deadline passed.
    TimedOut,
    /// The admission was closed.
    Closed,
    /// A resize left it needing more than the whole of `limit`.
    TooLarge { limit: Limit, capacity: u64 },
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

    /// Keeps the task's latest waker (cloning only when it changed).
    pub(crate) fn update(&mut self, new: &Waker) {
        #[cfg_attr(loom, allow(irrefutable_let_patterns))]
        if let Notify::Task(slot) = self {
            match slot {
                Some(old) if old.will_wake(new) => {}
                _ => *slot = Some(new.clone()),
            }
        }
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
    /// KV units it reserves once granted.
    pub(crate) kv: u64,
    /// Its flow in its class's fair queue.
    pub(crate) flow: u32,
    /// Neighbours in its flow's queue (older, newer).
    pub(crate) prev: Option<u32>,
    pub(crate) next: Option<u32>,
    /// Clock reading after which the wait ends (`u64::MAX`: never).
    pub(crate) deadline: u64,
    generation: u32,
    pub(crate) notify: Notify,
}

impl Waiter {
    pub(crate) fn new(class: usize, kv: u64, deadline: u64, notify: Notify) -> Self {
        Self { state: WaitState::Waiting, class, kv, flow: 0, prev: None, next: None, deadline, generation: 0, notify }
    }
}

/// What a waiter's owner holds: the slab index and the generation it was inserted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WaiterKey {
    index: u32,
    generation: u32,
}

impl WaiterKey {
    pub(crate) fn index(self) -> u32 {
        self.index
    }
}

#[derive(Debug)]
enum Entry {
    Occupied(Waiter),
    Vacant { next_free: Option<u32> },
}

/// Waiters by index. Freed entries are reused, so after the peak number of simultaneous waiters has been
/// reached nothing is allocated per waiter.
#[derive(Debug, Default)]
pub(crate) struct Slab {
    entries: Vec<Entry>,
    free: Option<u32>,
    generation: u32,
    len: usize,
}

impl Slab {
    /// Stores `waiter`, returning its key.
    pub(crate) fn insert(&mut self, mut waiter: Waiter) -> WaiterKey {
        self.generation = self.generation.wrapping_add(1);
        waiter.generation = self.generation;
        self.len += 1;
        let key = |index| WaiterKey { index, generation: waiter.generation };
        match self.free {
            Some(index) => {
                let entry = &mut self.entries[index as usize];
                let Entry::Vacant { next_free } = *entry else { unreachable!("free list points at a vacant entry") };
                self.free = next_free;
                let k = key(index);
                *entry = Entry::Occupied(waiter);
                k
            }
            None => {
                let index = u32::try_from(self.entries.len()).expect("fewer than 2^32 waiters");
                let k = key(index);
                self.entries.push(Entry::Occupied(waiter));
                k
            }
        }
    }

    /// The waiter at `index` (which must be occupied: flows and owners only hold live indices).
    pub(crate) fn get(&self, index: u32) -> &Waiter {
        match &self.entries[index as usize] {
            Entry::Occupied(waiter) => waiter,
            Entry::Vacant { .. } => unreachable!("a flow or owner holds a vacant index"),
        }
    }

    pub(crate) fn get_mut(&mut self, index: u32) -> &mut Waiter {
        match &mut self.entries[index as usize] {
            Entry::Occupied(waiter) => waiter,
            Entry::Vacant { .. } => unreachable!("a flow or owner holds a vacant index"),
        }
    }

    /// The waiter `key` names, if it is still stored (timer entries may be stale).
    pub(crate) fn lookup(&self, key: WaiterKey) -> Option<&Waiter> {
        match self.entries.get(key.index as usize) {
            Some(Entry::Occupied(waiter)) if waiter.generation == key.generation => Some(waiter),
            _ => None,
        }
    }

    /// Removes the waiter `key` names and returns it.
    pub(crate) fn remove(&mut self, key: WaiterKey) -> Waiter {
        let entry = std::mem::replace(&mut self.entries[key.index as usize], Entry::Vacant { next_free: self.free });
        let Entry::Occupied(waiter) = entry else { unreachable!("the owner's key names a live waiter") };
        debug_assert_eq!(waiter.generation, key.generation);
        self.free = Some(key.index);
        self.len -= 1;
        waiter
    }

    /// Keys of the waiters still waiting (for a resize scan or close).
    pub(crate) fn waiting_keys(&self) -> Vec<WaiterKey> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| match entry {
                Entry::Occupied(w) if w.state == WaitState::Waiting => {
                    Some(WaiterKey { index: index as u32, generation: w.generation })
                }
                _ => None,
            })
            .collect()
    }
}
