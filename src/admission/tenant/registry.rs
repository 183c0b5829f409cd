//! The bounded, sharded map from tenant ids to their state (see the module docs for the memory bound).
//!
//! # Invariants
//! - Every configured tenant (an override) is in its shard from the start and is never evicted; it is
//!   not counted in `max_tenants`.
//! - `tracked` counts the other entries of all shards; it never exceeds `max_tenants`. A slot is
//!   *reserved* (the count raised) or *inherited* from an evicted entry before an entry is inserted,
//!   and released when an inserted entry is removed or an insertion loses a race, so the count is exact
//!   once no insertion is under way.
//! - At most one shard lock is held at a time, and a tenant's state is built before any lock is taken.

use super::{FlowKey, TenantConfig, TenantId, TenantState};
use crate::admission::rates::{RateLimitStatus, RateStatus};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::sync::{self, AtomicUsize, Ordering, RwLock};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Shards of the map; a known tenant's request takes one shard's read lock.
const SHARDS: usize = 16;
/// Entries examined for an idle victim in each shard searched.
const EVICTION_PROBES: usize = 16;
/// Shards searched for an idle victim when the registry is full: the new tenant's own, then the next
/// ones in turn, so that a flood of new ids costs O(1) each.
const EVICTION_SHARDS: usize = 4;

type Shard<C> = RwLock<HashMap<TenantId, Arc<TenantState<C>>>>;

/// The bounded, sharded map from tenant ids to their state.
pub(crate) struct TenantRegistry<C: Clock> {
    config: TenantConfig,
    shards: Vec<Shard<C>>,
    /// Entries of tenants without an override, in all shards (at most `config.max_tenants`).
    tracked: AtomicUsize,
    overflow: Arc<TenantState<C>>,
    expected_hold: Duration,
    clock: C,
}

impl<C: Clock> fmt::Debug for TenantRegistry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantRegistry").field("tracked", &self.tracked()).finish_non_exhaustive()
    }
}

impl<C: Clock> TenantRegistry<C> {
    /// Checks the configuration and builds the registry, with every configured tenant in it.
    pub(crate) fn new(config: TenantConfig, expected_hold: Duration, clock: C) -> Result<Self, ConfigError> {
        config.validate()?;
        let shards: Vec<Shard<C>> = (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect();
        for (id, (_, limits)) in &config.overrides {
            // Builds the buckets now, so that an invalid rate is reported at build time.
            let state = Arc::new(TenantState::new(FlowKey::Tenant(*id), limits, expected_hold, &clock)?);
            sync::write(&shards[shard_index(*id)]).insert(*id, state);
        }
        let overflow = Arc::new(TenantState::new(FlowKey::Overflow, &config.defaults, expected_hold, &clock)?);
        Ok(Self { shards, tracked: AtomicUsize::new(0), overflow, expected_hold, clock, config })
    }

    /// Tenants tracked now: the configured ones and the others (the overflow tenant not counted).
    pub(crate) fn tracked(&self) -> usize {
        self.shards.iter().map(|s| sync::read(s).len()).sum()
    }

    /// The state of `id`, created if needed (or the overflow tenant when no room can be made). A known
    /// tenant costs one shard read lock and no allocation; a new one one allocation and a write lock.
    pub(crate) fn get(&self, id: TenantId, now: u64) -> Arc<TenantState<C>> {
        let index = shard_index(id);
        if let Some(state) = sync::read(&self.shards[index]).get(&id) {
            state.touch(now);
            return Arc::clone(state);
        }
        if !self.reserve() && !self.evict_idle(index, now) {
            self.overflow.touch(now);
            return Arc::clone(&self.overflow);
        }
        // A slot is ours now. The state is built outside every lock; limits were validated at build time.
        let state = match TenantState::new(FlowKey::Tenant(id), &self.config.defaults, self.expected_hold, &self.clock)
        {
            Ok(state) => Arc::new(state),
            Err(_) => {
                self.release();
                return Arc::clone(&self.overflow);
            }
        };
        let mut map = sync::write(&self.shards[index]);
        if let Some(existing) = map.get(&id) {
            // Another request of the same new tenant inserted it meanwhile.
            let existing = Arc::clone(existing);
            drop(map);
            self.release();
            existing.touch(now);
            return existing;
        }
        map.insert(id, Arc::clone(&state));
        state
    }

    /// Raises the tracked count if it is below `max_tenants`.
    fn reserve(&self) -> bool {
        self.tracked
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.config.max_tenants).then_some(n + 1))
            .is_ok()
    }

    fn release(&self) {
        self.tracked.fetch_sub(1, Ordering::AcqRel);
    }

    /// Removes one idle tenant (nothing in flight or waiting, no request for `idle_timeout`, referenced
    /// nowhere else), looking at a bounded sample of `EVICTION_SHARDS` shards starting at `first`. Its
    /// slot passes to the caller: the tracked count is unchanged.
    fn evict_idle(&self, first: usize, now: u64) -> bool {
        let idle = crate::clock::duration_to_nanos(self.config.idle_timeout);
        (0..EVICTION_SHARDS).any(|k| {
            let mut map = sync::write(&self.shards[(first + k) % SHARDS]);
            let victim = map
                .iter()
                .filter(|(id, _)| !self.config.overrides.contains_key(id))
                .take(EVICTION_PROBES)
                .find(|(_, s)| s.idle_since(now, idle) && Arc::strong_count(s) == 1)
                .map(|(id, _)| *id);
            victim.is_some_and(|id| map.remove(&id).is_some())
        })
    }

    /// Whether a new tenant would be crowded into the overflow tenant now (the registry is full; idle
    /// tenants that could be evicted are not looked for).
    fn is_full(&self) -> bool {
        self.tracked.load(Ordering::Acquire) >= self.config.max_tenants
    }

    /// The state of `id`, if it is tracked, without creating it.
    pub(crate) fn peek(&self, id: TenantId) -> Option<Arc<TenantState<C>>> {
        sync::read(&self.shards[shard_index(id)]).get(&id).cloned()
    }

    /// What an untracked tenant's rate limits look like: the default limits, full — or, while the
    /// registry is full, the overflow tenant's buckets, which its next request would be charged to.
    pub(crate) fn untracked_rate_status(&self, id: TenantId, now: u64) -> RateLimitStatus {
        if self.is_full() {
            return self.overflow.rate_status(now);
        }
        let (limits, _) = self.config.limits_of(id);
        let full = |limit: u64| RateStatus { limit, remaining: limit, reset: Duration::ZERO };
        RateLimitStatus {
            requests: limits.request_rate.map(|(_, burst)| full(u64::from(burst))),
            tokens: limits.token_rate.map(|(_, burst)| full(burst)),
        }
    }

    /// The configured name of `id`, if it has one.
    pub(crate) fn name_of(&self, id: TenantId) -> Option<Arc<str>> {
        self.config.limits_of(id).1.cloned()
    }

    /// In-flight counts of the busiest tenants, busiest first, for metrics.
    pub(crate) fn top_in_flight(&self, n: usize) -> Vec<(TenantId, u64)> {
        let mut all: Vec<(TenantId, u64)> = self
            .shards
            .iter()
            .flat_map(|s| {
                sync::read(s).iter().map(|(id, st)| (*id, st.core().capacity.slots_used())).collect::<Vec<_>>()
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        all.sort_by_key(|entry| std::cmp::Reverse(entry.1));
        all.truncate(n);
        all
    }
}

/// The shard of `id`.
fn shard_index(id: TenantId) -> usize {
    (id.get() ^ (id.get() >> 32)) as usize % SHARDS
}
