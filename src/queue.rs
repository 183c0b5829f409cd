//! TEMPORARY stand-in until the queue branch lands.
#![allow(missing_docs)]
pub type BoundedQueue<T> = crossbeam_queue::ArrayQueue<T>;
