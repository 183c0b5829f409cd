//! Tenants: per-user (or per-team, per-API-key) limits with a bounded memory footprint.
//!
//! A request names its tenant with [`Request::tenant`](crate::Request::tenant). Each tenant gets its own
//! request rate, token rate, in-flight cap and share of the KV budget — the defaults, or an override
//! for named tenants — checked together with the global limits, all or nothing.
//!
//! - [`TenantId`] (`id.rs`): the 64-bit key, and the fair-queue key that keeps "no tenant", a tenant and
//!   the shared overflow tenant apart;
//! - [`TenantLimits`] (`limits.rs`): what a tenant may use, validated when the admission is built;
//! - `state.rs`: one tenant's counters — its [`Capacity`](super::capacity::Capacity) (in-flight slots and KV
//!   units with the *parked* bits of its waiting requests), its rate buckets, its hold-time estimate;
//! - `registry.rs`: the bounded, sharded map from ids to state.
//!
//! # A tenant at its own limit
//! A request over its tenant's in-flight cap or KV share is refused by `try_admit` with `RateLimited` (the
//! client, not the server, is too busy), with a retry hint from that tenant's own hold times. A request
//! that may wait (`admit`) waits in its tenant's fair queue instead; while it is held back only by its own
//! tenant, it is *parked*: out of its class's service ring, blocking nobody else, and woken when that
//! tenant returns capacity. Within a tenant nobody overtakes a parked waiter — not even the tenant's own
//! `try_admit`.
//!
//! # Memory
//! Tenant state is created on a tenant's first request and kept in a sharded map (no global lock: a
//! request of a known tenant takes one shard's read lock). Every configured tenant
//! ([`tenant_limits`](crate::AdmissionBuilder::tenant_limits)) is tracked from the start and never
//! evicted; besides them, at most `max_tenants` tenants are tracked. When that many are, a tenant idle for
//! at least `tenant_idle_timeout` (nothing in flight, nothing waiting, no request since) is evicted to make
//! room — found among a bounded sample of entries in a few shards, so a flood of new ids costs O(1) per
//! request; if none is found, the new tenant shares one *overflow* tenant with the default limits until
//! room frees up (and [`rate_status`](crate::Admission::rate_status) reports the overflow tenant's buckets
//! for it meanwhile). The number of distinct ids an attacker can invent therefore never grows memory: it
//! only crowds those ids into the overflow tenant.
//!
//! An evicted tenant starts again with full buckets, so keep the idle timeout at least as long as its
//! buckets take to refill (`burst / rate`); the default is 60 s.

mod id;
mod limits;
mod registry;
mod state;

pub use id::TenantId;
pub use limits::{DEFAULT_MAX_TENANTS, DEFAULT_TENANT_IDLE_TIMEOUT, TenantLimits};

pub(crate) use id::FlowKey;
pub(crate) use limits::TenantConfig;
pub(crate) use registry::TenantRegistry;
pub(crate) use state::{TenantHandle, TenantState};
