#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unsafe_op_in_unsafe_fn, missing_debug_implementations)]

pub mod adaptive;
mod admission;
pub mod bucket;
pub mod clock;
mod error;
pub mod feedback;
pub mod kv;
pub mod queue;
pub mod retry;
pub mod stream;
pub(crate) mod sync;
mod telemetry;

#[cfg(feature = "http-body")]
pub mod http;
#[cfg(feature = "openai")]
#[cfg_attr(docsrs, doc(cfg(feature = "openai")))]
pub mod openai;
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub mod sim;
#[cfg(feature = "tower")]
pub mod tower;

pub use error::ConfigError;

pub use admission::{
    Admission, AdmissionBuilder, Admit, DEFAULT_DELAY_INTERVAL, DEFAULT_DELAY_TARGET, DEFAULT_EXPECTED_HOLD_TIME,
    DEFAULT_MAX_TENANTS, DEFAULT_QUEUE_CAPACITY, DEFAULT_TENANT_IDLE_TIMEOUT, Fairness, Limit, Permit, Prefix,
    PrefixId, Priority, RateLimitStatus, RateStatus, Rejection, RejectionCounts, Request, Reservation, Snapshot,
    TenantId, TenantLimits, WaitPolicy,
};
pub use queue::BoundedQueue;
