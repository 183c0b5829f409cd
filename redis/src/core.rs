//! What the shared admission, its permits and its background tasks share (runtime state without the
//! local admission, so that it needs no clock parameter).

use crate::allowance::AllowancePool;
use crate::leases::LeaseTable;
use crate::limits::Limits;
use crate::line::WaitLine;
use crate::stats::Stats;
use crate::store::{Charge, Store};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Notify;

/// What the background task is asked to do by a permit or a failed take.
#[derive(Debug)]
pub(crate) enum Work {
    /// Give back a lease (by id; it already left the table) and refund tokens.
    Release { lease: Option<String>, refunds: Vec<Charge> },
    /// Answer once everything queued before has reached Redis (or Redis did not answer).
    Flush(tokio::sync::oneshot::Sender<()>),
    /// Renew now (after everything queued before), then answer.
    Renew(tokio::sync::oneshot::Sender<()>),
}

/// The shared runtime state.
#[derive(Debug)]
pub(crate) struct Core {
    pub(crate) store: Store,
    pub(crate) limits: Limits,
    pub(crate) leases: LeaseTable,
    pub(crate) line: Arc<WaitLine>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) allowance: Option<AllowancePool>,
    /// The last generation seen (0: none yet).
    generation: AtomicU64,
    /// Asks the background task for a renewal now (Redis was found to have lost its state).
    pub(crate) renew_now: Notify,
}

impl Core {
    pub(crate) fn new(
        store: Store,
        limits: Limits,
        leases: LeaseTable,
        stats: Arc<Stats>,
        allowance: Option<AllowancePool>,
    ) -> Self {
        Self {
            store,
            limits,
            leases,
            line: Arc::new(WaitLine::default()),
            stats,
            allowance,
            generation: AtomicU64::new(0),
            renew_now: Notify::new(),
        }
    }

    /// The last generation seen (0: none yet).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Records the generation a script reported; a change means Redis lost its state, and every lease
    /// this replica holds must be registered again at once.
    pub(crate) fn saw_generation(&self, generation: u64) {
        let before = self.generation.swap(generation, Ordering::AcqRel);
        if before != 0 && before != generation {
            self.stats.state_lost();
            self.renew_now.notify_one();
        }
    }
}
