//! The bounded, sharded map from tenant ids to their state (see the module docs for the memory bound).

use super::{FlowKey, TenantConfig, TenantId, TenantState};
use crate::admission::rates::{RateLimitStatus, RateStatus};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::sync::{self, RwLock};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Shards of the map; a known tenant's request takes one shard's read lock.
const SHARDS: usize = 16;
/// Entries examined for an idle victim when a shard is full.
const EVICTION_PROBES: usize = 16;

type Shard<C> = RwLock<HashMap<TenantId, Arc<TenantState<C>>>>;

/// The bounded, sharded map from tenant ids to their state.
pub(crate) struct TenantRegistry<C: Clock> {
    config: TenantConfig,
    shards: Vec<Shard<C>>,
    /// Capacity of each shard; they add up to `max_tenants`.
    shard_capacity: Vec<usize>,
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
    /// Checks the configuration and builds the registry.
    pub(crate) fn new(config: TenantConfig, expected_hold: Duration, clock: C) -> Result<Self, ConfigError> {
        config.validate()?;
        for (id, (_, limits)) in &config.overrides {
            // Builds the buckets once, so that an invalid rate is reported now, naming the tenant.
            TenantState::new(FlowKey::Tenant(*id), limits, expected_hold, &clock)?;
        }
        let overflow = Arc::new(TenantState::new(FlowKey::Overflow, &config.defaults, expected_hold, &clock)?);
        let (base, extra) = (config.max_tenants / SHARDS, config.max_tenants % SHARDS);
        Ok(Self {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            shard_capacity: (0..SHARDS).map(|i| base + usize::from(i < extra)).collect(),
            overflow,
            expected_hold,
            clock,
            config,
        })
    }

    fn shard(&self, id: TenantId) -> (usize, &Shard<C>) {
        let index = (id.get() ^ (id.get() >> 32)) as usize % SHARDS;
        (index, &self.shards[index])
    }

    /// Tenants tracked now (the overflow tenant not counted).
    pub(crate) fn tracked(&self) -> usize {
        self.shards.iter().map(|s| sync::read(s).len()).sum()
    }

    /// The state of `id`, created if needed (or the overflow tenant when no room can be made). A known
    /// tenant costs one shard read lock and no allocation; a new one a write lock and one allocation.
    pub(crate) fn get(&self, id: TenantId, now: u64) -> Arc<TenantState<C>> {
        let (index, shard) = self.shard(id);
        if let Some(state) = sync::read(shard).get(&id) {
            state.touch(now);
            return Arc::clone(state);
        }
        let mut map = sync::write(shard);
        if let Some(state) = map.get(&id) {
            state.touch(now);
            return Arc::clone(state);
        }
        if map.len() >= self.shard_capacity[index] {
            let idle = crate::clock::duration_to_nanos(self.config.idle_timeout);
            // Look at a bounded number of entries, so that a flood of new ids costs O(1) each. A tenant
            // referenced elsewhere (a permit, a waiter) is never evicted.
            let victim = map
                .iter()
                .take(EVICTION_PROBES)
                .find(|(_, s)| s.idle_since(now, idle) && Arc::strong_count(s) == 1)
                .map(|(k, _)| *k);
            match victim {
                Some(key) => {
                    map.remove(&key);
                }
                None => {
                    self.overflow.touch(now);
                    return Arc::clone(&self.overflow);
                }
            }
        }
        let (limits, _) = self.config.limits_of(id);
        // Validated at build time, so construction cannot fail here; fall back to overflow if it did.
        match TenantState::new(FlowKey::Tenant(id), limits, self.expected_hold, &self.clock) {
            Ok(state) => {
                let state = Arc::new(state);
                map.insert(id, Arc::clone(&state));
                state
            }
            Err(_) => Arc::clone(&self.overflow),
        }
    }

    /// The state of `id`, if it is tracked, without creating it.
    pub(crate) fn peek(&self, id: TenantId) -> Option<Arc<TenantState<C>>> {
        sync::read(self.shard(id).1).get(&id).cloned()
    }

    /// What an untracked tenant's rate limits look like: its configured limits, full.
    pub(crate) fn untracked_rate_status(&self, id: TenantId) -> RateLimitStatus {
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
