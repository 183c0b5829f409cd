//! Admission: one decision that combines every limit before a request may start generating.
//!
//! [`Admission::try_admit`] checks, all or nothing, an in-flight slot, the KV-cache budget, the request
//! rate and the LLM-token rate — and, for a request of a tenant, that tenant's own limits. It returns an
//! RAII [`Permit`] that gives the capacity back when dropped, or a [`Rejection`] that says why and, when
//! waiting helps, for how long. [`Admission::admit`] and [`Admission::admit_blocking`] wait for capacity
//! in a bounded, FIFO, priority-aware, tenant-fair waiting room instead of being refused while the server
//! is busy.
//!
//! # Where each rule lives
//! | file | what it owns |
//! |---|---|
//! | `handle.rs` | [`Admission`], the public handle |
//! | `builder.rs` | [`AdmissionBuilder`]: every limit, every configuration error found at `build()` |
//! | `decision.rs` | the one admit path, the order of checks (all or nothing), rate hints |
//! | `capacity.rs` | the capacity words: slots and KV with held-back and closed bits (no lost wake-up) |
//! | `dispatcher/` | the waiting room: fair queues, waiter states, wake-ups after the lock, deadlines |
//! | `fairness.rs` | the fairness policy: requests (weighted round-robin) or tokens (virtual counters) |
//! | `wait_policy.rs` | how waits are ordered and bounded: FIFO, or controlled delay (adaptive LIFO while a queue stands) |
//! | `tenant/` | tenant ids, limits, state and the bounded registry |
//! | `reservation.rs`, `cost.rs` | how much KV a request reserves, in tokens or bytes |
//! | `prefix.rs` | shared prompt prefixes charged once while held, in a bounded table |
//! | `hasher.rs` | the one-multiply hasher of the waiting room's maps |
//! | `rates.rs` | request and token buckets charged together, and what each was charged |
//! | `promise.rs` | hints that do not herd: the k-th refused request is told when the rate admits the k-th |
//! | `owner.rs` | the type-erased admission that permits and waiters hold (breaks the import cycle) |
//! | `permit.rs`, `admit.rs` | the RAII grant; the waiting future and the blocking wait |
//! | `rejection.rs`, `snapshot.rs`, `stats.rs` | why a request was refused (one list of reasons), counters, hints |
//!
//! # Guarantees (each proven by the tests named in the README's guarantees table)
//! 1. **Conservation**: every slot, KV unit and rate token taken — global and per tenant — is returned
//!    exactly once: on drop, `complete`, cancellation at any point, timeout, `QueueFull`, close, resize
//!    and panic.
//! 2. **All or nothing**: a refused request holds nothing and has spent nothing.
//! 3. **No overtaking**: within a priority class, a new request never passes a waiter that the same
//!    capacity holds back — `try_admit` included; a waiter held back only by its own tenant's limits
//!    blocks nobody else.
//! 4. **Honest hints that do not herd**: capacity hints come from observed hold times (a tenant's own for a
//!    tenant's limit); a rate hint is never earlier than the time at which every rate the request meets
//!    would pass, and the k-th request refused by one rate is told the moment it admits the k-th
//!    (`promise.rs`).
//! 5. **Linearizable close**, and no user code (a waker) ever runs while the waiting room's lock is held.

mod admit;
mod builder;
mod capacity;
mod core;
mod cost;
mod decision;
mod dispatcher;
mod fairness;
mod handle;
mod hasher;
mod owner;
mod permit;
mod prefix;
mod promise;
mod rates;
mod rejection;
mod request;
mod reservation;
mod snapshot;
mod stats;
mod tenant;
mod wait_policy;

pub use admit::Admit;
pub use builder::{AdmissionBuilder, DEFAULT_EXPECTED_HOLD_TIME, DEFAULT_QUEUE_CAPACITY};
pub use fairness::Fairness;
pub use handle::Admission;
pub use permit::Permit;
pub use prefix::{Prefix, PrefixId};
pub use rates::{RateLimitStatus, RateStatus};
pub use rejection::{Limit, Rejection};
pub use request::{Priority, Request};
pub use reservation::Reservation;
pub use snapshot::{RejectionCounts, Snapshot};
pub use tenant::{DEFAULT_MAX_TENANTS, DEFAULT_TENANT_IDLE_TIMEOUT, TenantId, TenantLimits};
pub use wait_policy::{DEFAULT_DELAY_INTERVAL, DEFAULT_DELAY_TARGET, WaitPolicy};

#[cfg(feature = "metrics")]
pub(crate) use rejection::with_rejection_reasons;
