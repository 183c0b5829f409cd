//! Deadlines of waiting requests, enforced without an async runtime.
//!
//! Deadlines live in a min-heap inside the waiting room (under its lock), keyed by [`WaiterKey`]; an
//! entry whose waiter was granted or gave up is skipped when it reaches the top, and the heap is compacted
//! whenever it has doubled, so its size stays proportional to the live waiters.
//!
//! Expired waits end in three places: when their owner polls (or its blocking caller wakes), on
//! [`Admission::expire_waiters`](crate::Admission::expire_waiters), and — unless the admission was built
//! with `deadline_timer(false)` — on a background thread per admission (named `kvgate-timer`, started on
//! the first deadline, gone when none is pending). The thread holds only a weak reference to the
//! admission, so it never keeps one alive; it sleeps on its own condition variable, so it holds no lock of
//! the admission while it sleeps. Time is the admission's [`Clock`](crate::clock::Clock): the thread turns
//! "clock nanoseconds until the deadline" into a real sleep with `Clock::real_time_until` (a manual clock
//! is re-read every millisecond).
//!
//! # No deadline is slept through
//! An enqueue pushes its deadline into the heap (room lock), then bumps the timer's `generation` (timer
//! lock). The thread reads `generation`, then looks at the heap; before it sleeps or exits it checks, under
//! the timer lock, that `generation` has not moved. Either it sees the new deadline in the heap, or the
//! generation changed and it looks again, or it already marked itself stopped and the enqueue starts a
//! new thread.

use super::waiter::WaiterKey;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Pending deadlines, earliest first.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    heap: BinaryHeap<Reverse<(u64, WaiterKey)>>,
    /// Heap length after the last compaction; the next one runs when the heap has doubled.
    compacted_len: usize,
}

impl Deadlines {
    /// Adds a deadline; returns true if it is now the earliest.
    pub(crate) fn push(&mut self, deadline: u64, key: WaiterKey) -> bool {
        let earliest = self.next().is_none_or(|e| deadline < e);
        self.heap.push(Reverse((deadline, key)));
        earliest
    }

    /// The earliest pending deadline, if any (possibly of a waiter that is gone).
    pub(crate) fn next(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((deadline, _))| *deadline)
    }

    /// Takes out one entry whose deadline is at or before `now`.
    pub(crate) fn pop_expired(&mut self, now: u64) -> Option<WaiterKey> {
        match self.heap.peek() {
            Some(Reverse((deadline, _))) if *deadline <= now => self.heap.pop().map(|Reverse((_, key))| key),
            _ => None,
        }
    }

    /// Drops entries of waiters that no longer wait, once the heap has doubled since the last time.
    pub(crate) fn compact_if_grown(&mut self, waiting: impl Fn(WaiterKey) -> bool) {
        if self.heap.len() >= 64 && self.heap.len() >= self.compacted_len.saturating_mul(2) {
            self.heap.retain(|Reverse((_, key))| waiting(*key));
            self.compacted_len = self.heap.len();
        }
    }
}

#[cfg(not(loom))]
pub(crate) use thread::Timer;

#[cfg(loom)]
pub(crate) use model::Timer;

#[cfg(not(loom))]
mod thread {
    use crate::admission::owner::Owner;
    use crate::sync::{Condvar, ThreadMutex as Mutex};
    use std::sync::{Arc, Weak};
    use std::time::Duration;

    #[derive(Debug, Default)]
    struct State {
        running: bool,
        shutdown: bool,
        /// Bumped by every new deadline, so that a thread about to sleep or exit looks again.
        generation: u64,
    }

    #[derive(Debug, Default)]
    struct Inner {
        state: Mutex<State>,
        changed: Condvar,
    }

    /// The deadline thread of one admission.
    #[derive(Debug)]
    pub(crate) struct Timer {
        inner: Arc<Inner>,
        /// Whether a thread enforces deadlines (`deadline_timer(true)`).
        enabled: bool,
    }

    impl Timer {
        pub(crate) fn new(enabled: bool) -> Self {
            Self { inner: Arc::default(), enabled }
        }

        /// A deadline was added (after it is in the heap): make sure a thread enforces it, and wake the
        /// sleeping one if the deadline is the earliest.
        pub(crate) fn deadline_added(&self, owner: &Arc<dyn Owner>, earliest: bool) {
            if !self.enabled {
                return;
            }
            let mut state = self.inner.state.lock();
            if state.shutdown {
                return;
            }
            state.generation = state.generation.wrapping_add(1);
            if !state.running {
                let inner = Arc::clone(&self.inner);
                let owner = Arc::downgrade(owner);
                let spawned =
                    std::thread::Builder::new().name("kvgate-timer".into()).spawn(move || run(&inner, &owner));
                // If no thread can be spawned, deadlines are still enforced whenever the waiter is polled
                // and by `expire_waiters`.
                state.running = spawned.is_ok();
            } else if earliest {
                self.inner.changed.notify_one();
            }
        }

        /// Stops the thread (the admission is gone).
        pub(crate) fn shutdown(&self) {
            let mut state = self.inner.state.lock();
            state.shutdown = true;
            self.inner.changed.notify_all();
        }
    }

    /// The thread: expire what is due, sleep until the next deadline, exit when none is pending or the
    /// admission is gone.
    fn run(inner: &Inner, owner: &Weak<dyn Owner>) {
        loop {
            let generation = inner.state.lock().generation;
            let Some(admission) = owner.upgrade() else { break };
            let now = admission.now_nanos();
            let next = admission.core().expire_waiters(now).1;
            let sleep = next.map(|deadline| admission.real_time_until(deadline));
            drop(admission);
            let mut state = inner.state.lock();
            if state.shutdown {
                break;
            }
            if state.generation != generation {
                continue;
            }
            match sleep {
                None => {
                    state.running = false;
                    return;
                }
                Some(sleep) => {
                    let sleep = sleep.max(Duration::from_micros(50));
                    let _ =
                        inner.changed.wait_while_for(&mut state, |s| s.generation == generation && !s.shutdown, sleep);
                }
            }
        }
        inner.state.lock().running = false;
    }
}

#[cfg(loom)]
mod model {
    use crate::admission::owner::Owner;
    use std::sync::Arc;

    /// Under loom there is no timer thread: deadlines end on polls and `expire_waiters`.
    #[derive(Debug)]
    pub(crate) struct Timer;

    impl Timer {
        pub(crate) fn new(_enabled: bool) -> Self {
            Timer
        }

        pub(crate) fn deadline_added(&self, _owner: &Arc<dyn Owner>, _earliest: bool) {}
        pub(crate) fn shutdown(&self) {}
    }
}
