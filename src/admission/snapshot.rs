//! A point-in-time view of an admission's state and counters, for metrics, health checks and tests.

use std::time::Duration;

/// Rejections since the admission was built, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RejectionCounts {
    /// [`Rejection::NoCapacity`](crate::Rejection::NoCapacity).
    pub no_capacity: u64,
    /// [`Rejection::RateLimited`](crate::Rejection::RateLimited).
    pub rate_limited: u64,
    /// [`Rejection::TooLarge`](crate::Rejection::TooLarge).
    pub too_large: u64,
    /// [`Rejection::QueueFull`](crate::Rejection::QueueFull).
    pub queue_full: u64,
    /// [`Rejection::TimedOut`](crate::Rejection::TimedOut).
    pub timed_out: u64,
    /// [`Rejection::Closed`](crate::Rejection::Closed).
    pub closed: u64,
    /// [`Rejection::Invalid`](crate::Rejection::Invalid).
    pub invalid: u64,
}

impl RejectionCounts {
    /// All rejections.
    pub fn total(&self) -> u64 {
        self.no_capacity
            + self.rate_limited
            + self.too_large
            + self.queue_full
            + self.timed_out
            + self.closed
            + self.invalid
    }

    /// `(reason, count)` pairs, reasons as in [`Rejection::reason`](crate::Rejection::reason).
    pub fn by_reason(&self) -> [(&'static str, u64); 7] {
        [
            ("no_capacity", self.no_capacity),
            ("rate_limited", self.rate_limited),
            ("too_large", self.too_large),
            ("queue_full", self.queue_full),
            ("timed_out", self.timed_out),
            ("closed", self.closed),
            ("invalid", self.invalid),
        ]
    }
}

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
    /// Observed mean time a permit is held (1 s until observed), used for capacity retry hints.
    pub mean_hold: Duration,
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
