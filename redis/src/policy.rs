//! What a shared admission does when Redis does not answer in time.

use std::time::Duration;

/// The choice between refusing and admitting on local limits while Redis is unreachable or slow.
///
/// Either way, Redis is asked again after [`SharedLimits::retry_interval`](crate::SharedLimits::retry_interval)
/// (a background probe, and the first request after it), so the admission recovers by itself when Redis
/// is back; each decision made by the policy is counted ([`SharedStats`](crate::SharedStats)) and, with the
/// `metrics` feature, recorded as `kvgate_redis_fallbacks_total{policy}`.
///
/// # Examples
///
/// ```
/// use kvgate_redis::FailPolicy;
/// use std::time::Duration;
///
/// // Safe for the engine: nothing is admitted on shared capacity Redis cannot vouch for.
/// let closed = FailPolicy::Closed { retry_after: Duration::from_secs(1) };
/// // Available: each of 3 replicas admits up to a third of every shared limit on its own.
/// let open = FailPolicy::Open { replicas: 3 };
/// assert_ne!(closed, open);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPolicy {
    /// Refuse every request that needs a shared limit with
    /// [`Rejection::NoCapacity`](kvgate::Rejection::NoCapacity) (503) and this `Retry-After`. The
    /// engine is never overcommitted; the service is down while Redis is.
    Closed {
        /// The hint given to refused clients.
        retry_after: Duration,
    },
    /// Admit on local limits: every shared limit divided by `replicas` (rounded down, at least 1 slot,
    /// one request or token of burst), kept by an in-process admission. With `replicas` at least the
    /// number of replicas running, the engine's budget holds while Redis is down; fewer and it is
    /// overcommitted by that factor. Permits taken this way hold no lease; when Redis is back, the
    /// background renewal registers them through the budget check (see
    /// [`SharedPermit::is_leased`](crate::SharedPermit::is_leased)).
    Open {
        /// The number of replicas sharing the limits.
        replicas: u32,
    },
}

impl Default for FailPolicy {
    /// `Closed` with a one-second hint.
    fn default() -> Self {
        FailPolicy::Closed { retry_after: Duration::from_secs(1) }
    }
}

impl FailPolicy {
    /// The label of this policy in metrics: `closed` or `open`.
    pub const fn as_str(&self) -> &'static str {
        match self {
            FailPolicy::Closed { .. } => "closed",
            FailPolicy::Open { .. } => "open",
        }
    }
}
