//! What a permit and a waiting request need from the admission that issued them, without its clock type.
//!
//! `Permit` and `Admit` carry an `Arc<dyn Owner>`, so they have no type parameter and the modules that
//! define them depend only on this trait, never on the clock-generic admission (which depends on them):
//! this file is what keeps the import graph acyclic.

use super::core::Core;
use super::dispatcher::{Held, Notify, WaiterKey};
use super::permit::Permit;
use super::rates::Charges;
use super::rejection::Rejection;
use super::request::Request;
use super::tenant::TenantHandle;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// How a request that may wait is woken, and the caller's own limit on the wait.
#[derive(Debug)]
pub(crate) struct WaitSpec {
    pub(crate) notify: Notify,
    pub(crate) timeout: Option<Duration>,
}

/// What a queued request holds while it waits: its place, its KV units, the rate charges it made, its
/// tenant and when it queued.
#[derive(Debug)]
pub(crate) struct Ticket {
    pub(crate) key: WaiterKey,
    /// What it holds once granted: its own KV units and its share of a prefix.
    pub(crate) held: Held,
    pub(crate) charges: Charges,
    pub(crate) tenant: Option<Arc<dyn TenantHandle>>,
    pub(crate) deadline: u64,
    /// Whether its deadline became the earliest pending one (the timer thread must look again).
    pub(crate) earliest_deadline: bool,
    pub(crate) queued_at: u64,
}

/// The result of one admission attempt.
#[derive(Debug)]
pub(crate) enum Attempt {
    Granted(Permit),
    Queued(Ticket),
    Refused(Rejection),
}

/// The admission as its permits and waiters see it.
pub(crate) trait Owner: Send + Sync + fmt::Debug + 'static {
    /// The clock-independent state.
    fn core(&self) -> &Core;
    /// The admission clock's reading.
    fn now_nanos(&self) -> u64;
    /// Real time to wait until the admission clock reaches `deadline`.
    #[cfg_attr(loom, allow(dead_code))]
    fn real_time_until(&self, deadline: u64) -> Duration;
    /// Gives back exactly `charges` (global buckets, and the tenant's).
    fn refund(&self, charges: Charges, tenant: Option<&dyn TenantHandle>);
    /// The one admission decision for a request that may wait: grant now, queue, or refuse. A refusal
    /// holds nothing; it is not counted yet.
    fn attempt(&self, this: &Arc<dyn Owner>, request: &Request, wait: WaitSpec) -> Attempt;
    /// A completed request produced `unused_output` fewer tokens than it reserved: token fairness takes
    /// that output back from its tenant's counter.
    fn refund_output(&self, unused_output: u64, tenant: Option<&dyn TenantHandle>);
    /// Feeds a completed request's real output length to the reservation policy.
    fn observe_output(&self, output_tokens: u32, max_new_tokens: u32);
}
