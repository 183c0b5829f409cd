//! [`AcquireError`]: why an acquire took nothing, and whether retrying can help.

use std::time::Duration;

/// Why [`TokenBucket::try_acquire`](super::TokenBucket::try_acquire) took nothing.
///
/// # Examples
///
/// ```
/// use kvgate::bucket::{AcquireError, TokenBucket};
///
/// let bucket = TokenBucket::new(1.0, 1)?;
/// bucket.try_acquire(1).unwrap();
/// match bucket.try_acquire(1) {
///     Err(AcquireError::NotYet { retry_after }) => assert!(retry_after.as_nanos() > 0),
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AcquireError {
    /// Retry later: exactly this long until the requested tokens are available, if nobody else takes
    /// them first (always > 0).
    #[error("not enough tokens yet; retry after {retry_after:?}")]
    NotYet {
        /// The wait until the acquire would succeed.
        retry_after: Duration,
    },
    /// Never fits: more tokens were requested than the bucket can hold (`requested > burst`), so retrying
    /// cannot help. (Also returned for more than 2^61 tokens, which no bucket holds whatever its burst, and
    /// once a configuration's lifetime allowance is spent: its level saturates at least 219 years after
    /// the bucket is built or its rate last changed; see the [module documentation](super).)
    #[error("{requested} tokens requested but the bucket holds at most {burst}; split the request or raise the burst")]
    NeverFits {
        /// The number of tokens asked for.
        requested: u64,
        /// The bucket's capacity.
        burst: u64,
    },
}

impl AcquireError {
    /// When retrying can succeed: `Some(wait)` for [`NotYet`](Self::NotYet), `None` for
    /// [`NeverFits`](Self::NeverFits).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::bucket::AcquireError;
    /// use std::time::Duration;
    ///
    /// let e = AcquireError::NotYet { retry_after: Duration::from_millis(3) };
    /// assert_eq!(e.retry_after(), Some(Duration::from_millis(3)));
    /// assert_eq!(AcquireError::NeverFits { requested: 9, burst: 8 }.retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::NotYet { retry_after } => Some(*retry_after),
            Self::NeverFits { .. } => None,
        }
    }
}
