//! What can go wrong when a shared admission is set up, and when Redis is asked something.
//!
//! A refused request is never an error here: it is a [`kvgate::Rejection`], as for the in-process
//! admission. Redis failures during admission are not errors either: the fail policy turns them into a
//! rejection or a local decision ([`FailPolicy`](crate::FailPolicy)).

use std::time::Duration;

/// A shared admission that cannot be set up, with what to change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A limit or a timing setting is invalid.
    #[error(transparent)]
    Config(#[from] kvgate::ConfigError),
    /// The Redis URL cannot be parsed.
    #[error("invalid Redis URL {url:?}: {reason}; use redis://[user:password@]host[:port][/db] or rediss://...")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What the client library said about it.
        reason: String,
    },
    /// No Tokio runtime is running: the shared admission renews its leases and listens for freed
    /// capacity on background tasks.
    #[error("no Tokio runtime: call SharedAdmission::connect from inside a Tokio runtime")]
    NoRuntime,
}

/// A call to Redis that did not give an answer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No answer within the per-call timeout.
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
    /// The connection failed or Redis answered with an error.
    #[error("Redis error: {0}")]
    Redis(String),
    /// Redis answered something the scripts never return (another program writes the same keys?).
    #[error("unexpected reply from Redis: {0}")]
    Reply(String),
}

impl From<redis::RedisError> for StoreError {
    fn from(error: redis::RedisError) -> Self {
        StoreError::Redis(error.to_string())
    }
}
