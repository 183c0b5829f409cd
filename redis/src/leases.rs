//! The leases one replica holds: what the renewal renews, and how a permit learns that its lease was lost.
//!
//! # States
//! A lease id (`<replica>:<sequence>`, never reused) is entered *before* the call that takes it, so that
//! a call cut short (timeout, cancellation) can always be undone by id:
//!
//! ```text
//!   Acquiring ──granted──► Held ──renewal: gone, does not fit──► Lost ──renewal: fits again──► Held
//!       │                   │                                      │
//!       └──refused/cut──────┴──────────── permit dropped ──────────┴──► removed, release sent
//!   Unleased (fail-open permit) ──renewal: fits──► Held
//! ```
//!
//! Invariants:
//! 1. An id leaves the table exactly once (the permit's drop, or the undo of a failed take), and the
//!    release for it is queued after it left; so the renewal, which reads the table, never includes an id
//!    whose release is queued, and a release is never followed by a renewal of the same id (both calls
//!    run on the one background task, in order).
//! 2. The renewal skips `Acquiring` ids: their take is in flight and decides.
//! 3. `Lost` and `Unleased` ids are offered to Redis at each renewal through the budget check only, so a
//!    replica that comes back from a partition can never push the total over the budget.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::sync::Notify;

/// Where a lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseState {
    /// Its take is in flight.
    Acquiring,
    /// Held in Redis.
    Held,
    /// Held until a renewal found it gone and it did not fit again.
    Lost,
    /// Granted by the fail-open policy: never held in Redis yet.
    Unleased,
}

/// Tells a permit that its lease was lost (and, after that, whether it is held again).
#[derive(Debug, Default)]
pub(crate) struct LeaseSignal {
    lost: AtomicBool,
    notify: Notify,
}

impl LeaseSignal {
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    fn set_lost(&self, lost: bool) {
        if !self.lost.swap(lost, Ordering::AcqRel) && lost {
            self.notify.notify_waiters();
        }
    }

    /// Resolves once the lease was lost (at once if it is already).
    pub(crate) async fn lost(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_lost() {
                return;
            }
            notified.await;
        }
    }
}

#[derive(Debug)]
struct Entry {
    slots: u64,
    kv: u64,
    state: LeaseState,
    signal: Arc<LeaseSignal>,
}

/// The table of one replica's leases.
#[derive(Debug)]
pub(crate) struct LeaseTable {
    replica: String,
    next: AtomicU64,
    entries: Mutex<HashMap<u64, Entry>>,
}

/// What the renewal sends for one lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RenewItem {
    pub(crate) seq: u64,
    pub(crate) id: String,
    pub(crate) slots: u64,
    pub(crate) kv: u64,
    pub(crate) state: LeaseState,
}

impl LeaseTable {
    pub(crate) fn new(replica: String) -> Self {
        Self { replica, next: AtomicU64::new(1), entries: Mutex::new(HashMap::new()) }
    }

    /// This replica's id (the owner part of every lease id).
    pub(crate) fn replica(&self) -> &str {
        &self.replica
    }

    /// The id of lease `seq`.
    pub(crate) fn id(&self, seq: u64) -> String {
        format!("{}:{seq}", self.replica)
    }

    /// Enters a new lease in `state` (`Acquiring` or `Unleased`); returns its sequence number and signal.
    pub(crate) fn insert(&self, slots: u64, kv: u64, state: LeaseState) -> (u64, Arc<LeaseSignal>) {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let signal = Arc::new(LeaseSignal::default());
        self.entries.lock().insert(seq, Entry { slots, kv, state, signal: Arc::clone(&signal) });
        (seq, signal)
    }

    /// Marks a lease held (its take succeeded).
    pub(crate) fn set_held(&self, seq: u64) {
        if let Some(entry) = self.entries.lock().get_mut(&seq) {
            entry.state = LeaseState::Held;
        }
    }

    /// Removes a lease; returns whether it was there (then the caller queues its release).
    pub(crate) fn remove(&self, seq: u64) -> bool {
        self.entries.lock().remove(&seq).is_some()
    }

    /// The state of a lease, if it is in the table.
    pub(crate) fn state(&self, seq: u64) -> Option<LeaseState> {
        self.entries.lock().get(&seq).map(|e| e.state)
    }

    /// Everything the renewal sends: held, lost and unleased leases (not those being taken).
    pub(crate) fn to_renew(&self) -> Vec<RenewItem> {
        let entries = self.entries.lock();
        entries
            .iter()
            .filter(|(_, e)| e.state != LeaseState::Acquiring)
            .map(|(&seq, e)| RenewItem { seq, id: self.id(seq), slots: e.slots, kv: e.kv, state: e.state })
            .collect()
    }

    /// Records what the renewal found for `seq`: held (renewed or registered) or not.
    /// Returns the state before, or `None` if the lease left the table meanwhile.
    pub(crate) fn renewed(&self, seq: u64, held: bool) -> Option<LeaseState> {
        let mut entries = self.entries.lock();
        let entry = entries.get_mut(&seq)?;
        let before = entry.state;
        if before == LeaseState::Acquiring {
            return Some(before);
        }
        if held {
            entry.state = LeaseState::Held;
            entry.signal.set_lost(false);
        } else if before == LeaseState::Held {
            entry.state = LeaseState::Lost;
            entry.signal.set_lost(true);
        }
        Some(before)
    }

    /// Leases in the table, by state: (held, lost or unleased) slots and KV units.
    pub(crate) fn held_units(&self) -> (u64, u64) {
        let entries = self.entries.lock();
        entries.values().filter(|e| e.state == LeaseState::Held).fold((0, 0), |(s, k), e| (s + e.slots, k + e.kv))
    }

    /// Number of leases in the table.
    #[cfg(feature = "metrics")]
    pub(crate) fn len(&self) -> usize {
        self.entries.lock().len()
    }
}
