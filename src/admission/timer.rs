//! Deadlines of waiting requests, enforced without an async runtime.
//!
//! A waiter with a deadline registers it here. One background thread per admission (named
//! `kvgate-timer`, started on the first deadline, gone when no deadline is pending) sleeps until the
//! earliest deadline, ends the expired waits with `TimedOut` and wakes their owners. A waiter whose
//! deadline passes therefore resolves even if no capacity is ever released and nobody polls it in the
//! meantime. The thread holds only weak references: it never keeps an admission or a waiter alive.
//!
//! Time is the admission's [`Clock`](crate::clock::Clock): the thread converts "clock nanoseconds until
//! the deadline" into a real sleep with `Clock::real_time_until`, so a manual clock is re-read every
//! millisecond, and [`Admission::expire_waiters`](crate::Admission::expire_waiters) expires
//! deterministically after a manual advance.
//!
//! Memory stays proportional to the live waiters: entries of waiters that were granted or cancelled are
//! dropped when they reach the top of the heap, or earlier by a compaction whenever the heap has doubled.

#[cfg(not(loom))]
pub(crate) use real::Timer;

#[cfg(loom)]
pub(crate) use model::Timer;

#[cfg(not(loom))]
mod real {
    use super::super::core::Core;
    use super::super::permit::Owner;
    use super::super::waiter::{TIMED_OUT, WAITING, Waiter};
    use parking_lot::{Condvar, Mutex};
    use std::cmp::Ordering as CmpOrdering;
    use std::collections::BinaryHeap;
    use std::sync::{Arc, Weak};

    /// A pending deadline; ordered so that `BinaryHeap` pops the earliest first.
    #[derive(Debug)]
    struct Entry {
        deadline: u64,
        waiter: Weak<Waiter>,
    }

    impl PartialEq for Entry {
        fn eq(&self, other: &Self) -> bool {
            self.deadline == other.deadline
        }
    }
    impl Eq for Entry {}
    impl PartialOrd for Entry {
        fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Entry {
        fn cmp(&self, other: &Self) -> CmpOrdering {
            other.deadline.cmp(&self.deadline)
        }
    }

    #[derive(Debug, Default)]
    struct State {
        heap: BinaryHeap<Entry>,
        /// Heap length after the last compaction; the next one runs when the heap has doubled.
        compacted_len: usize,
        thread_running: bool,
        shutdown: bool,
        /// Bumped when an earlier deadline arrives, so a thread about to sleep re-plans.
        generation: u64,
    }

    #[derive(Debug, Default)]
    struct Inner {
        state: Mutex<State>,
        changed: Condvar,
    }

    /// The deadline registry of one admission.
    #[derive(Debug, Default)]
    pub(crate) struct Timer {
        inner: Arc<Inner>,
    }

    impl Timer {
        /// Registers `waiter`'s deadline and makes sure a thread will enforce it.
        pub(crate) fn watch(&self, owner: &Arc<dyn Owner>, waiter: &Arc<Waiter>) {
            let mut state = self.inner.state.lock();
            if state.shutdown {
                return;
            }
            let earliest = state.heap.peek().map(|e| e.deadline);
            push_entry(&mut state, waiter);
            if !state.thread_running {
                let inner = Arc::clone(&self.inner);
                let owner = Arc::downgrade(owner);
                let spawned =
                    std::thread::Builder::new().name("kvgate-timer".into()).spawn(move || run(&inner, &owner));
                // If no thread can be spawned, deadlines are still enforced whenever the waiter is
                // polled, on every release, and by `expire_waiters`.
                state.thread_running = spawned.is_ok();
            } else if earliest.is_none_or(|e| waiter.deadline < e) {
                state.generation = state.generation.wrapping_add(1);
                self.inner.changed.notify_one();
            }
        }

        /// Ends every wait whose deadline is at or before `now`; returns how many ended here.
        pub(crate) fn expire(&self, core: &Core, now: u64) -> usize {
            let expired = pop_expired(&mut self.inner.state.lock(), now);
            end_waits(core, expired)
        }

        /// Registers a deadline without starting a thread (deadlines then end on `expire`).
        pub(crate) fn register(&self, waiter: &Arc<Waiter>) {
            let mut state = self.inner.state.lock();
            if !state.shutdown {
                push_entry(&mut state, waiter);
            }
        }

        /// Stops the thread (the admission is gone).
        pub(crate) fn shutdown(&self) {
            let mut state = self.inner.state.lock();
            state.shutdown = true;
            state.heap.clear();
            self.inner.changed.notify_all();
        }
    }

    /// Adds a deadline; drops entries of finished waits whenever the heap has doubled since the last
    /// time, so its size stays proportional to the live waiters.
    fn push_entry(state: &mut State, waiter: &Arc<Waiter>) {
        state.heap.push(Entry { deadline: waiter.deadline, waiter: Arc::downgrade(waiter) });
        if state.heap.len() >= 64 && state.heap.len() >= state.compacted_len.saturating_mul(2) {
            state.heap.retain(|e| e.waiter.upgrade().is_some_and(|w| w.state() == WAITING));
            state.compacted_len = state.heap.len();
        }
    }

    fn pop_expired(state: &mut State, now: u64) -> Vec<Arc<Waiter>> {
        let mut expired = Vec::new();
        while state.heap.peek().is_some_and(|e| e.deadline <= now) {
            if let Some(waiter) = state.heap.pop().and_then(|e| e.waiter.upgrade()) {
                expired.push(waiter);
            }
        }
        expired
    }

    /// Ends every expired wait first, then runs the dispatcher once, so that no expired waiter is
    /// granted in between.
    fn end_waits(core: &Core, expired: Vec<Arc<Waiter>>) -> usize {
        let mut ended = 0;
        for waiter in &expired {
            if core.leave(waiter, TIMED_OUT) {
                waiter.wake();
                ended += 1;
            }
        }
        if ended != 0 {
            core.dispatch();
        }
        ended
    }

    /// The timer thread: sleep until the earliest deadline, expire, repeat; exit when nothing is pending
    /// or the admission is gone.
    fn run(inner: &Inner, owner: &Weak<dyn Owner>) {
        loop {
            let Some(admission) = owner.upgrade() else {
                inner.state.lock().thread_running = false;
                return;
            };
            let now = admission.now_nanos();
            let (expired, next) = {
                let mut state = inner.state.lock();
                let expired = pop_expired(&mut state, now);
                let next = state.heap.peek().map(|e| e.deadline);
                if next.is_none() && expired.is_empty() || state.shutdown {
                    state.thread_running = false;
                    return;
                }
                (expired, next)
            };
            end_waits(admission.core(), expired);
            let Some(next) = next else { continue };
            let sleep = admission.real_time_until(next);
            drop(admission);
            let mut state = inner.state.lock();
            let generation = state.generation;
            if !state.shutdown && state.heap.peek().is_some_and(|e| e.deadline >= next) {
                let _ = inner.changed.wait_while_for(&mut state, |s| s.generation == generation && !s.shutdown, sleep);
            }
        }
    }
}

#[cfg(loom)]
mod model {
    use super::super::core::Core;
    use super::super::permit::Owner;
    use super::super::waiter::Waiter;
    use std::sync::Arc;

    /// Under loom there is no timer thread: deadlines are enforced by polls only.
    #[derive(Debug, Default)]
    pub(crate) struct Timer;

    impl Timer {
        pub(crate) fn watch(&self, _owner: &Arc<dyn Owner>, _waiter: &Arc<Waiter>) {}
        pub(crate) fn expire(&self, _core: &Core, _now: u64) -> usize {
            0
        }
        pub(crate) fn register(&self, _waiter: &Arc<Waiter>) {}
        pub(crate) fn shutdown(&self) {}
    }
}
