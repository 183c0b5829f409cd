//! The replica's line for shared capacity: who of this replica's waiting requests asks Redis next.
//!
//! Only the head of the line calls Redis, so a replica with 500 waiting requests sends one try per
//! announced release (or poll), not 500. Order: priority class first (higher first), then arrival — the
//! same order as the local waiting room's. A request that may not wait ([`SharedAdmission::try_admit`])
//! does not pass a waiter of the same or a higher class of its own replica.
//!
//! Across replicas there is no line: the heads of every replica's line race for each release, and the
//! first to reach Redis gets it (see the crate docs, "Fairness").
//!
//! [`SharedAdmission::try_admit`]: crate::SharedAdmission::try_admit

use kvgate::Priority;
use parking_lot::Mutex;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::Notify;

type Key = (Reverse<usize>, u64);

#[derive(Debug, Default)]
struct LineState {
    next: u64,
    waiting: BTreeMap<Key, Arc<Notify>>,
}

/// One replica's line.
#[derive(Debug, Default)]
pub(crate) struct WaitLine {
    state: Mutex<LineState>,
}

/// A place in the line; leaving it (drop) wakes the next head.
#[derive(Debug)]
pub(crate) struct Place {
    line: Arc<WaitLine>,
    key: Key,
    notify: Arc<Notify>,
}

impl WaitLine {
    /// Joins the line at the back of `priority`'s class.
    pub(crate) fn join(self: &Arc<Self>, priority: Priority) -> Place {
        let notify = Arc::new(Notify::new());
        let mut state = self.state.lock();
        let key = (Reverse(priority.index()), state.next);
        state.next += 1;
        state.waiting.insert(key, Arc::clone(&notify));
        Place { line: Arc::clone(self), key, notify }
    }

    /// Whether a request of `priority` that may not wait must leave capacity to a waiter.
    pub(crate) fn holds_back(&self, priority: Priority) -> bool {
        self.state.lock().waiting.keys().next().is_some_and(|(Reverse(class), _)| *class >= priority.index())
    }

    /// Wakes the head (capacity was announced free). A head that is not waiting yet finds the wake-up
    /// stored.
    pub(crate) fn wake_head(&self) {
        let head = self.state.lock().waiting.values().next().cloned();
        if let Some(notify) = head {
            notify.notify_one();
        }
    }

    /// Wakes every waiter (the admission was closed: each sees it and leaves).
    pub(crate) fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = self.state.lock().waiting.values().cloned().collect();
        for notify in all {
            notify.notify_one();
        }
    }

    /// Requests in the line.
    pub(crate) fn len(&self) -> usize {
        self.state.lock().waiting.len()
    }
}

impl Place {
    /// Whether this place is the head of the line.
    pub(crate) fn is_head(&self) -> bool {
        self.line.state.lock().waiting.keys().next() == Some(&self.key)
    }

    /// Waits until woken (this place became the head, or capacity was announced while it was).
    pub(crate) async fn woken(&self) {
        self.notify.notified().await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let next = {
            let mut state = self.line.state.lock();
            let was_head = state.waiting.keys().next() == Some(&self.key);
            state.waiting.remove(&self.key);
            if was_head { state.waiting.values().next().cloned() } else { None }
        };
        // After the lock: a wake-up never runs under it.
        if let Some(notify) = next {
            notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priority_then_arrival() {
        let line = Arc::new(WaitLine::default());
        let batch = line.join(Priority::Batch);
        assert!(batch.is_head());
        let normal = line.join(Priority::Normal);
        let second_normal = line.join(Priority::Normal);
        assert!(normal.is_head() && !batch.is_head());
        assert!(line.holds_back(Priority::Normal) && !line.holds_back(Priority::Interactive));
        drop(normal);
        assert!(second_normal.is_head());
        drop(second_normal);
        assert!(batch.is_head());
        assert!(line.holds_back(Priority::Batch) && !line.holds_back(Priority::Normal));
        drop(batch);
        assert_eq!(line.len(), 0);
    }

    #[tokio::test]
    async fn leaving_head_wakes_the_next() {
        let line = Arc::new(WaitLine::default());
        let first = line.join(Priority::Normal);
        let second = line.join(Priority::Normal);
        drop(first);
        // The wake-up is stored: `woken` completes at once.
        second.woken().await;
    }
}
