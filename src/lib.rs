//! # kvgate
//!
//! In-process admission control for one GPU inference server.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unsafe_op_in_unsafe_fn, missing_debug_implementations)]

pub mod clock;
mod error;
pub mod queue;
pub(crate) mod sync;

pub use error::ConfigError;
pub use queue::BoundedQueue;
