//! A point-in-time view of an admission's state and counters, for metrics, health checks and tests.

use super::rejection::{Reason, with_rejection_reasons};
use std::time::Duration;

macro_rules! define_counts {
    ($($variant:ident, $field:ident, $label:literal;)*) => {
        /// Rejections since the admission was built, by reason (one field per [`Rejection`] variant).
        ///
        /// [`Rejection`]: crate::Rejection
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        #[non_exhaustive]
        pub struct RejectionCounts {
            $(
                #[doc = concat!("[`Rejection::", stringify!($variant), "`](crate::Rejection::", stringify!($variant), ").")]
                pub $field: u64,
            )*
        }

        impl RejectionCounts {
            /// The counts from per-reason counters indexed like `Reason`.
            pub(crate) fn from_counters(counters: &[u64; Reason::COUNT]) -> Self {
                Self { $($field: counters[Reason::$variant.index()],)* }
            }

            /// All rejections.
            pub fn total(&self) -> u64 {
                0 $(+ self.$field)*
            }

            /// `(reason, count)` pairs, reasons as in [`Rejection::reason`](crate::Rejection::reason).
            pub fn by_reason(&self) -> [(&'static str, u64); Reason::COUNT] {
                [$(($label, self.$field)),*]
            }
        }
    };
}
with_rejection_reasons!(define_counts);

/// The state of an [`Admission`](crate::Admission) at one moment.
///
/// Each field is read atomically, but not all at the same instant: under load the fields may disagree by
/// the requests admitted or released while the snapshot was taken. At quiescence every field is exact.
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Request};
///
/// let admission = Admission::builder().max_in_flight(2).kv_capacity_tokens(4096).build().unwrap();
/// let _permit = admission.try_admit(&Request::new(1000, 24)).unwrap();
/// let s = admission.snapshot();
/// assert_eq!((s.in_flight, s.kv_used, s.kv_capacity), (1, 1024, 4096));
/// assert_eq!(s.admitted, 1);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Snapshot {
    /// Permits alive now (running sequences).
    pub in_flight: usize,
    /// The in-flight limit (`usize::MAX` when unlimited).
    pub max_in_flight: usize,
    /// Requests waiting for capacity, all priority classes.
    pub queued: usize,
    /// Waiting-room size per priority class (0: requests never wait).
    pub queue_capacity: usize,
    /// KV units held by permits: tokens, or bytes with a KV model.
    pub kv_used: u64,
    /// The KV budget in the same unit (`u64::MAX` when unlimited).
    pub kv_capacity: u64,
    /// Requests admitted since the admission was built.
    pub admitted: u64,
    /// Requests rejected since the admission was built, by reason.
    pub rejected: RejectionCounts,
    /// Whether [`close`](crate::Admission::close) was called.
    pub closed: bool,
    /// Estimated time a permit is held (the builder's
    /// [`expected_hold_time`](crate::AdmissionBuilder::expected_hold_time) until permits have been
    /// observed), used for capacity retry hints.
    pub mean_hold: Duration,
    /// Shared prompt prefixes tracked now (0 without
    /// [`prefix_sharing`](crate::AdmissionBuilder::prefix_sharing)).
    pub prefixes: usize,
    /// KV units requests did not have to reserve because their prefix was already held, since the
    /// admission was built (in the KV unit: tokens or bytes): for each request that found its prefix held,
    /// its cost without a prefix less its suffix. The request that brings a prefix in pays the prefix and
    /// its suffix counted apart, which with sliding-window layers is more than its cost without a prefix;
    /// that difference is not taken off.
    pub kv_saved_by_prefixes: u64,
    /// Requests refused, or ended while waiting, because they were predicted to miss their start deadline
    /// ([`Request::ttft_deadline`](crate::Request::ttft_deadline)), and waiters that controlled delay shed
    /// ([`WaitPolicy`](crate::WaitPolicy): over-age in a standing queue, or giving their place in a full
    /// one; each also counted under its `Rejection` reason).
    pub shed: u64,
    /// Wakers that panicked when the dispatcher woke them. The panic is contained: the waiter keeps its
    /// grant and admission goes on.
    pub waker_panics: u64,
}

impl Snapshot {
    /// Fraction of the KV budget in use, 0.0..=1.0 (0.0 when the budget is unlimited).
    pub fn kv_usage(&self) -> f64 {
        if self.kv_capacity == u64::MAX || self.kv_capacity == 0 {
            0.0
        } else {
            (self.kv_used as f64 / self.kv_capacity as f64).min(1.0)
        }
    }
}
