//! Why a request was not admitted, and when (if ever) trying again can succeed.
//!
//! The reasons are listed once, in [`with_rejection_reasons`]: the `Reason` enum, the per-reason counters,
//! [`RejectionCounts`](crate::RejectionCounts)' fields, [`Rejection::reason`] and the metrics labels are
//! all generated from that list, so a new reason cannot be counted in one place and forgotten in another.

use std::time::Duration;

/// Calls `$callback!` with the one list of rejection reasons, one `Variant, field, "label";` per reason,
/// in counter order. `Variant` is the [`Rejection`] variant, `field` its [`RejectionCounts`] field and
/// `"label"` its name in [`Rejection::reason`] and in metrics.
///
/// [`RejectionCounts`]: crate::RejectionCounts
macro_rules! with_rejection_reasons {
    ($callback:ident) => {
        $callback! {
            NoCapacity, no_capacity, "no_capacity";
            RateLimited, rate_limited, "rate_limited";
            TooLarge, too_large, "too_large";
            QueueFull, queue_full, "queue_full";
            TimedOut, timed_out, "timed_out";
            Closed, closed, "closed";
            Invalid, invalid, "invalid";
        }
    };
}
pub(crate) use with_rejection_reasons;

macro_rules! define_reason {
    ($($variant:ident, $field:ident, $label:literal;)*) => {
        /// Why a request was refused, without the details: the index of every per-reason list.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub(crate) enum Reason {
            $($variant,)*
        }

        impl Reason {
            /// Every reason, in counter order.
            pub(crate) const ALL: [Reason; [$(Reason::$variant),*].len()] = [$(Reason::$variant),*];
            /// Number of reasons.
            pub(crate) const COUNT: usize = Reason::ALL.len();

            /// Dense index, for per-reason counters.
            #[inline]
            pub(crate) const fn index(self) -> usize {
                self as usize
            }

            /// The snake_case name used in metrics and JSON.
            pub(crate) const fn name(self) -> &'static str {
                match self {
                    $(Reason::$variant => $label,)*
                }
            }
        }
    };
}
with_rejection_reasons!(define_reason);

/// The limit a [`Rejection::TooLarge`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// The KV-cache budget (tokens, or bytes with a KV model).
    KvBudget,
    /// The token-rate bucket's burst.
    TokenRate,
    /// The tenant's share of the KV budget.
    TenantKvShare,
    /// The tenant's token-rate burst.
    TenantTokenRate,
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limit::KvBudget => "KV-cache budget",
            Limit::TokenRate => "token-rate burst",
            Limit::TenantKvShare => "tenant's share of the KV-cache budget",
            Limit::TenantTokenRate => "tenant's token-rate burst",
        })
    }
}

/// A refused request: the reason, and for reasons that pass with time, the earliest useful retry.
///
/// [`retry_after`](Rejection::retry_after) is `None` exactly when retrying the same request cannot succeed
/// under the current configuration. [`http_status`](Rejection::http_status) maps each reason to the status
/// an HTTP service should answer with.
///
/// A rejected request holds nothing and has spent nothing: every limit it touched was given back before
/// the rejection was returned.
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Request, Rejection};
///
/// let admission = Admission::builder().max_in_flight(1).build().unwrap();
/// let _first = admission.try_admit(&Request::new(10, 10)).unwrap();
/// let err = admission.try_admit(&Request::new(10, 10)).unwrap_err();
/// assert!(matches!(err, Rejection::NoCapacity { .. }));
/// assert_eq!(err.http_status(), 503);
/// assert!(err.retry_after().is_some());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// Every in-flight slot or the KV budget is in use right now (or others are already waiting for it).
    /// `retry_after` is an estimate from observed permit hold times, never zero.
    #[error("no capacity: the server is at its concurrency or KV-cache limit; retry in {retry_after:?}")]
    NoCapacity {
        /// Estimated time until capacity frees up.
        retry_after: Duration,
    },

    /// The request rate or token rate is exceeded. `retry_after` is when this request would pass the rate
    /// limits: the exact time for the first refused, and for the k-th refused meanwhile the moment the rates
    /// admit the k-th (hints that do not herd; never earlier than exact, at most a minute ahead).
    #[error("rate limited: retry in {retry_after:?}")]
    RateLimited {
        /// Time until the rate limits would let this request through.
        retry_after: Duration,
    },

    /// The request can never be admitted: it needs more of a limit than the whole limit.
    #[error("request too large: needs {requested} of the {limit}, which holds {capacity} in total")]
    TooLarge {
        /// The limit that is too small.
        limit: Limit,
        /// What the request needs of it.
        requested: u64,
        /// The limit's whole capacity.
        capacity: u64,
    },

    /// The waiting room is full: the request's class holds `queue_capacity` waiters, or a waiting request
    /// gave its place to a request of a tenant with fewer waiters (see
    /// [`AdmissionBuilder::queue_capacity`](crate::AdmissionBuilder::queue_capacity)). `retry_after`
    /// estimates when a place frees up.
    #[error("queue full: too many requests are already waiting; retry in {retry_after:?}")]
    QueueFull {
        /// Estimated time until the queue has room.
        retry_after: Duration,
    },

    /// The request waited for its whole allowed wait (its own `max_wait` or the admission's
    /// `max_queue_wait`) without being admitted.
    #[error("timed out waiting for capacity")]
    TimedOut,

    /// The admission was closed: it admits nothing more.
    #[error("admission closed: the server is shutting down")]
    Closed,

    /// The request itself is malformed (for example it asks for zero tokens).
    #[error("invalid request: {reason}")]
    Invalid {
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl Rejection {
    /// When trying again can succeed; `None` when retrying the same request cannot help
    /// ([`TooLarge`](Rejection::TooLarge), [`Closed`](Rejection::Closed), [`Invalid`](Rejection::Invalid)),
    /// and for [`TimedOut`](Rejection::TimedOut), where the caller already chose how long to wait.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::Rejection;
    /// use std::time::Duration;
    ///
    /// let r = Rejection::RateLimited { retry_after: Duration::from_millis(250) };
    /// assert_eq!(r.retry_after(), Some(Duration::from_millis(250)));
    /// assert_eq!(Rejection::Closed.retry_after(), None);
    /// ```
    pub const fn retry_after(&self) -> Option<Duration> {
        match self {
            Rejection::NoCapacity { retry_after }
            | Rejection::RateLimited { retry_after }
            | Rejection::QueueFull { retry_after } => Some(*retry_after),
            Rejection::TooLarge { .. } | Rejection::TimedOut | Rejection::Closed | Rejection::Invalid { .. } => None,
        }
    }

    /// This rejection with its retry hint raised to at least `wait` (a rejection without a hint is kept).
    pub(crate) fn at_least(self, wait: Duration) -> Self {
        match self {
            Rejection::NoCapacity { retry_after } => Rejection::NoCapacity { retry_after: retry_after.max(wait) },
            Rejection::RateLimited { retry_after } => Rejection::RateLimited { retry_after: retry_after.max(wait) },
            Rejection::QueueFull { retry_after } => Rejection::QueueFull { retry_after: retry_after.max(wait) },
            other => other,
        }
    }

    /// The HTTP status an API server should answer with.
    ///
    /// - `429 Too Many Requests` for [`RateLimited`](Rejection::RateLimited): the *client* sends too fast;
    ///   RFC 6585 defines 429 for exactly this, and clients back off on it.
    /// - `503 Service Unavailable` for [`NoCapacity`](Rejection::NoCapacity),
    ///   [`QueueFull`](Rejection::QueueFull), [`TimedOut`](Rejection::TimedOut) and
    ///   [`Closed`](Rejection::Closed): the *server* is saturated or going away, whoever asks; 503 with
    ///   `Retry-After` is what load balancers and autoscalers understand as "temporarily overloaded".
    /// - `413 Content Too Large` for [`TooLarge`](Rejection::TooLarge): this request can never fit, so
    ///   retrying it unchanged is pointless (a 4xx tells clients not to retry).
    /// - `400 Bad Request` for [`Invalid`](Rejection::Invalid).
    ///
    /// Clients that only retry on 429 can be served by mapping every retryable rejection to 429 in the
    /// HTTP adapter.
    pub const fn http_status(&self) -> u16 {
        match self {
            Rejection::RateLimited { .. } => 429,
            Rejection::NoCapacity { .. } | Rejection::QueueFull { .. } | Rejection::TimedOut | Rejection::Closed => 503,
            Rejection::TooLarge { .. } => 413,
            Rejection::Invalid { .. } => 400,
        }
    }

    /// A short machine-readable reason, as used in metrics labels and JSON error bodies.
    pub const fn reason(&self) -> &'static str {
        self.kind().name()
    }

    /// The reason as an enum, the key of every per-reason list.
    pub(crate) const fn kind(&self) -> Reason {
        macro_rules! kind_of {
            ($($variant:ident, $field:ident, $label:literal;)*) => {
                match self {
                    $(Rejection::$variant { .. } => Reason::$variant,)*
                }
            };
        }
        with_rejection_reasons!(kind_of)
    }
}
