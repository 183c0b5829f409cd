//! Limits shared by every replica of a kvgate gateway through Redis (or Valkey, same protocol).
//!
//! Two replicas in front of one GPU each believe they own its whole KV budget: every in-process limit
//! multiplies by the number of replicas. [`SharedAdmission`] keeps the in-process
//! [`kvgate::Admission`] (its limits and its waiting room, unchanged) and adds the limits that must hold
//! across replicas, kept in Redis:
//!
//! - **shared rates**: the request rate and token rate, global and per tenant, as GCRA state in Redis —
//!   one atomic Lua script per decision (`EVALSHA`, one round trip), Redis' `TIME` as the clock so the
//!   replicas' clocks do not matter, the exact `retry_after` of the local bucket (at the microsecond),
//!   refunds on [`SharedPermit::complete`];
//! - **shared capacity**: in-flight slots and the KV budget of one engine as **leases** — a reservation
//!   with an owner (`<replica>:<n>`) and an expiry, renewed while held: a killed replica's capacity comes
//!   back within the lease time, and a replica that was cut off and comes back registers its permits
//!   again only through the budget check;
//! - a **local allowance** of prefetched rate tokens, so most admissions are decided without Redis;
//! - a **fail policy** for when Redis does not answer within the per-call timeout: fail-closed (503 with
//!   `Retry-After`) or fail-open to the shared limits divided by the replica count.
//!
//! Refusals are [`kvgate::Rejection`]s (429/503/413 with honest hints), so HTTP mapping
//! ([`kvgate::http::rejection_response`](https://docs.rs/kvgate)) works unchanged.
//!
//! # Example
//!
//! ```no_run
//! use kvgate::{Admission, Request};
//! use kvgate_redis::{FailPolicy, SharedAdmission, SharedLimits};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let local = Admission::builder().queue_capacity(1000).build()?; // in-process: the waiting room
//! let limits = SharedLimits::new("llama-8b")        // the engine all replicas front
//!     .max_in_flight(64)
//!     .kv_capacity(400_000)
//!     .token_rate(20_000.0, 200_000)
//!     .fail_policy(FailPolicy::Open { replicas: 3 });
//! let admission = SharedAdmission::connect("redis://redis:6379", local, limits).await?;
//! let permit = admission.admit(&Request::new(1_200, 800).tenant("alice")).await?;
//! // ... generate, holding `permit` ...
//! permit.complete(312);
//! # Ok(()) }
//! ```
//!
//! # One decision
//! `admit` and `try_admit` ask the local admission first, then Redis once: `lua/admit.lua` removes
//! expired leases, checks that one more slot and the request's KV units fit the budget, then every
//! rate (global, then the tenant's), and commits all of it or nothing. A request refused for capacity
//! spends no rate token; a rate refusal carries the time at which every rate involved would pass.
//!
//! # Leases
//! Each permit holds one lease (id, slots, KV units, expiry = Redis time + lease time). The replica's
//! background task renews all of its leases every renewal interval in one call, and gives leases back
//! in batches when permits are dropped (drop cannot wait: it queues the id). Invariants:
//! 1. Redis' totals are the sum over unexpired leases (each script updates both atomically;
//!    [`SharedUsage::consistent`] checks it), and a lease is added only if it fits.
//! 2. Release is by id and idempotent: a double release, or the release of a lease that expired, frees
//!    nothing.
//! 3. Renewal extends only leases that exist; a lease that is gone is added again only through the
//!    budget check, so no replica can push the total over the budget — whatever it believes it holds.
//! 4. Every release of an id reaches Redis after any renewal that listed it (one background task runs
//!    both, and a permit leaves the lease table before its release is queued).
//!
//! # Failures, and what each does
//! | failure | what happens | test |
//! |---|---|---|
//! | a replica is killed (`kill -9`) | its leases are not renewed and expire within the lease time; the next script removes them | `tests/crash.rs` |
//! | a replica is cut off from Redis longer than the lease time, then comes back | its leases expired (others may have used the capacity); its renewal registers them again only if they fit, otherwise they are *lost*: counted, and [`SharedPermit::lease_lost`] resolves so the application can stop the generation | `tests/failure_cases.rs::partitioned_replica_cannot_push_the_total_over_the_budget` |
//! | Redis restarts without persistence (or fails over to a replica that missed writes) | the generation key (a random number) is gone: the first script writes a new one, and the first replica that knew the old one opens the recovery window, during which new leases wait and live replicas register what they hold (through the budget check; a fleet starting fresh opens none); rate buckets restart full (at most one extra burst) | `tests/failure_cases.rs::redis_restart_losing_state_recovers_the_leases`, `tests/outage.rs` |
//! | Redis is slow (`DEBUG SLEEP`) or down | calls time out after the call timeout; the fail policy decides for a retry interval, then Redis is tried again; releases wait in the background task and are sent when Redis answers | `tests/outage.rs` |
//! | Redis' clock vs the replicas' | only Redis' `TIME` is read (inside the scripts): replicas with any clocks agree; a Redis clock stepping back stalls refills (no extra tokens), stepping forward refills at most a burst and expires leases early (they are then registered again through the budget check) | `tests/failure_cases.rs::replica_clocks_do_not_matter`, `tests/rates.rs` |
//! | a renewal racing a release | the release always reaches Redis after the renewal (invariant 4); a renewal never brings back a released lease | `tests/failure_cases.rs::renewal_never_brings_back_a_released_lease` |
//! | a double release | idempotent by id (invariant 2) | `tests/failure_cases.rs::double_release_frees_once` |
//! | a take cut short (timeout, cancelled future) | the lease id is given back in the background (a no-op if the take never ran); at worst it expires | `tests/failure_cases.rs::cancelled_take_leaks_nothing` |
//! | invented tenant ids | a tenant's bucket is a key only while it is not full, with a matching expiry: Redis' memory returns to its baseline | `tests/tenant_memory.rs` |
//!
//! # Waiting and fairness
//! [`SharedAdmission::admit`] waits in the local waiting room first (local limits, priorities, tenant
//! fairness), then in this replica's line for shared capacity: FIFO within a priority class, higher
//! classes first. Only the head calls Redis: when a release is announced on the `freed` pub/sub channel
//! (every script that frees a lease publishes), or after a backoff (2 ms doubling up to the poll
//! interval) that covers lost announcements and expired leases. Across replicas there is no common
//! queue: after a release, the heads of all replicas race and the first script to run wins. So each
//! replica with waiters gets capacity at roughly the rate its head reaches Redis — per-replica fairness,
//! not per-request FIFO — and a large request at one replica's head can be passed by smaller requests of
//! other replicas (bounded by its wait limit). A `try_admit` never passes a waiter of its own replica.
//!
//! # Local allowance and its overshoot
//! With [`Allowance`], a replica prefetches batches of the global rates' tokens; see [`Allowance`] for the
//! bound (`replicas x batch` in any window) and `BENCHMARKS.md` for the measured overshoot and latency.
//!
//! # Redis keys and memory
//! Every key is under `kvgate:{name}:` (one Redis Cluster slot). Rate buckets exist only while not
//! full; lease keys expire twice the lease time after their last write; the generation a day after its
//! last use. Nothing grows with the number of tenant ids.
//!
//! # Metrics (feature `metrics`)
//! The counters of [`SharedStats`] as `kvgate_redis_*` counters (table in the `stats` module source),
//! and `kvgate_redis_up`, `kvgate_redis_leases_held`, `kvgate_redis_requests_waiting` gauges set by
//! [`SharedAdmission::publish_metrics`].

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unsafe_op_in_unsafe_fn, missing_debug_implementations)]

mod admission;
mod allowance;
mod core;
mod decision;
mod error;
mod fallback;
mod keys;
mod leases;
mod limits;
mod line;
mod notify;
mod permit;
mod policy;
mod rate;
mod scripts;
mod stats;
mod store;
mod worker;

#[cfg(feature = "local-server")]
pub mod server;

pub use admission::SharedAdmission;
pub use error::{SetupError, StoreError};
pub use limits::{Allowance, DEFAULT_CALL_TIMEOUT, DEFAULT_LEASE_TIME, SharedLimits, TenantRates, TimeSource};
pub use permit::SharedPermit;
pub use policy::FailPolicy;
pub use stats::SharedStats;
pub use store::SharedUsage;
