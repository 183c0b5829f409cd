//! [`RetryHint`]: what a retry loop needs to know about an error.

use crate::Rejection;
use std::time::Duration;

/// What a retry loop needs to know about an error: may it be retried, and did the server say when.
///
/// # Examples
///
/// ```
/// use kvgate::retry::RetryHint;
/// use std::time::Duration;
///
/// enum ApiError { Overloaded(Duration), BadInput }
///
/// impl RetryHint for ApiError {
///     fn is_retryable(&self) -> bool {
///         matches!(self, ApiError::Overloaded(_))
///     }
///     fn retry_after(&self) -> Option<Duration> {
///         match self {
///             ApiError::Overloaded(after) => Some(*after),
///             ApiError::BadInput => None,
///         }
///     }
/// }
/// assert!(!ApiError::BadInput.is_retryable());
/// ```
pub trait RetryHint {
    /// Whether trying the same operation again can succeed. A loop stops at once on `false`.
    fn is_retryable(&self) -> bool;

    /// The earliest time a retry can succeed, if the error says (a server's `Retry-After`). A retryable
    /// error without a hint is retried on the plain backoff schedule.
    fn retry_after(&self) -> Option<Duration> {
        None
    }
}

/// `NoCapacity`, `RateLimited` and `QueueFull` are retryable with their hint; `TimedOut` is retryable
/// without one (the wait limit passed, the capacity may free up later); `TooLarge`, `Closed` and
/// `Invalid` are not retryable.
impl RetryHint for Rejection {
    fn is_retryable(&self) -> bool {
        self.retry_after().is_some() || matches!(self, Rejection::TimedOut)
    }

    fn retry_after(&self) -> Option<Duration> {
        Rejection::retry_after(self)
    }
}

impl<T: RetryHint + ?Sized> RetryHint for &T {
    fn is_retryable(&self) -> bool {
        (**self).is_retryable()
    }

    fn retry_after(&self) -> Option<Duration> {
        (**self).retry_after()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn rejections_are_classified() {
        let hinted = Rejection::NoCapacity { retry_after: 20 * MS };
        assert!(hinted.is_retryable());
        assert_eq!(RetryHint::retry_after(&hinted), Some(20 * MS));
        assert!(Rejection::TimedOut.is_retryable());
        assert_eq!(RetryHint::retry_after(&Rejection::TimedOut), None);
        for fatal in [
            Rejection::Closed,
            Rejection::Invalid { reason: "x" },
            Rejection::TooLarge { limit: crate::Limit::KvBudget, requested: 2, capacity: 1 },
        ] {
            assert!(!fatal.is_retryable(), "{fatal:?}");
        }
    }
}
