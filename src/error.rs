//! Configuration errors: found when a limiter or a model is built, never at the first request.
//!
//! Each variant says which setting is wrong and what a valid one looks like. Run-time refusals of a request
//! are not errors of configuration: they are [`Rejection`](crate::Rejection)s.

/// A configuration that kvgate refuses to build, with what to change.
///
/// # Examples
///
/// ```
/// use kvgate::{ConfigError, bucket::TokenBucket};
///
/// let err = TokenBucket::new(f64::NAN, 10).unwrap_err();
/// assert!(matches!(err, ConfigError::InvalidRate { .. }));
/// println!("{err}"); // says which rate, the value given, and the valid range
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A rate is zero, negative, NaN, infinite, or outside the supported range.
    #[error(
        "invalid {what}: {value} per second; use a finite rate between {min} and {max} per second, \
         or leave the limit unset to disable it"
    )]
    InvalidRate {
        /// Which rate (for example `"request rate"`).
        what: &'static str,
        /// The value that was given.
        value: f64,
        /// Smallest accepted rate per second.
        min: f64,
        /// Largest accepted rate per second.
        max: f64,
    },

    /// A capacity that must be positive is zero (a limit that could never admit anything).
    #[error("{what} is 0, so nothing could ever be admitted; use at least 1, or leave the limit unset to disable it")]
    Zero {
        /// Which setting (for example `"max_in_flight"`).
        what: &'static str,
    },

    /// A numeric setting is out of its valid range.
    #[error("invalid {what}: {reason}")]
    OutOfRange {
        /// Which setting.
        what: &'static str,
        /// Why it is invalid and what is accepted.
        reason: String,
    },

    /// Two settings contradict each other.
    #[error("conflicting settings: {0}")]
    Conflict(String),

    /// A model configuration (`config.json`) is not valid JSON or not a JSON object.
    #[error("model config is not a valid JSON object: {0}")]
    InvalidJson(String),

    /// A model configuration lacks a key the KV-cache size depends on.
    #[error(
        "model config (model_type {model_type:?}) is missing required key `{key}`; add it or build the ModelSpec by hand"
    )]
    MissingKey {
        /// The missing key, with its path (for example `text_config.num_key_value_heads`).
        key: String,
        /// The model's `model_type`, or `"unknown"`.
        model_type: String,
    },

    /// A key of a model configuration has a value of the wrong type or range.
    #[error("model config key `{key}` is invalid: {reason}")]
    InvalidKey {
        /// The offending key, with its path.
        key: String,
        /// What is wrong and what is expected.
        reason: String,
    },

    /// A model configuration names an architecture whose KV-cache layout kvgate does not know.
    #[error(
        "unsupported model architecture {model_type:?}: kvgate cannot derive its KV-cache layout; \
         build the ModelSpec by hand with ModelSpec::builder()"
    )]
    UnsupportedArchitecture {
        /// The `model_type` (or `architectures[0]`) found in the file.
        model_type: String,
    },

    /// A name (model preset, GPU preset, dtype) is not known.
    #[error("unknown {what} {name:?}; known: {known}")]
    UnknownName {
        /// What kind of name (for example `"GPU"`).
        what: &'static str,
        /// The name given.
        name: String,
        /// The accepted names, comma-separated.
        known: String,
    },
}
