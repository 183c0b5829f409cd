//! Tenants: per-user (or per-team, per-API-key) limits with a bounded memory footprint.
//!
//! A request names its tenant with [`Request::tenant`](crate::Request::tenant). Each tenant gets its own
//! request rate, token rate, in-flight cap and share of the KV budget — the defaults, or an override
//! for named tenants — checked together with the global limits, all or nothing.
//!
//! # Memory
//! Tenant state is created on a tenant's first request and kept in a sharded map (no global lock: a
//! request of a known tenant takes one shard's read lock). At most `max_tenants` tenants are tracked.
//! When a shard is full, a tenant idle for at least `tenant_idle_timeout` (nothing in flight, no
//! request since) is evicted to make room — found among a bounded sample of the shard's entries, so a flood of
//! new ids costs O(1) per request; if none is idle, the new tenant shares one *overflow* tenant
//! with the default limits until room frees up. The number of distinct ids an attacker can invent
//! therefore never grows memory: it only crowds those ids into the overflow tenant.
//!
//! An evicted tenant starts again with full buckets, so keep the idle timeout at least as long as its
//! buckets take to refill (`burst / rate`); the default is 60 s.

use super::Rejection;
use super::rates::{RateRefusal, Rates};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A tenant's key: a user, a team or an API key, hashed to 64 bits. Cheap to copy.
///
/// # Examples
///
/// ```
/// use kvgate::TenantId;
///
/// assert_eq!(TenantId::from("alice"), TenantId::from("alice"));
/// assert_ne!(TenantId::from("alice"), TenantId::from("bob"));
/// assert_eq!(TenantId::from(42u64).get(), 42);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(u64);

impl TenantId {
    /// The key as a number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl From<u64> for TenantId {
    fn from(id: u64) -> Self {
        Self(id)
    }
}

impl From<&str> for TenantId {
    /// FNV-1a over the bytes: stable across runs and platforms.
    fn from(name: &str) -> Self {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in name.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self(hash)
    }
}

impl From<&String> for TenantId {
    fn from(name: &String) -> Self {
        Self::from(name.as_str())
    }
}

/// Limits for one tenant (or the defaults for all). Every limit is optional.
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, TenantLimits};
///
/// let admission = Admission::builder()
///     .max_in_flight(64)
///     .kv_capacity_tokens(1_000_000)
///     .tenant_defaults(TenantLimits::new().max_in_flight(4).kv_share(0.25).request_rate(2.0, 5))
///     .tenant_limits("batch-jobs", TenantLimits::new().max_in_flight(2).weight(1))
///     .tenant_limits("on-call", TenantLimits::new().max_in_flight(16).weight(4))
///     .build()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct TenantLimits {
    max_in_flight: Option<usize>,
    kv_share: Option<f64>,
    request_rate: Option<(f64, u32)>,
    token_rate: Option<(f64, u64)>,
    weight: u32,
}

impl Default for TenantLimits {
    fn default() -> Self {
        Self::new()
    }
}

impl TenantLimits {
    /// No per-tenant limit, weight 1.
    pub const fn new() -> Self {
        Self { max_in_flight: None, kv_share: None, request_rate: None, token_rate: None, weight: 1 }
    }

    /// At most this many of the tenant's requests in flight at once.
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = Some(max_in_flight);
        self
    }

    /// At most this fraction (0, 1] of the KV budget held by the tenant's requests at once.
    pub fn kv_share(mut self, share: f64) -> Self {
        self.kv_share = Some(share);
        self
    }

    /// The tenant's own request rate (requests/s, burst).
    pub fn request_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.request_rate = Some((per_second, burst));
        self
    }

    /// The tenant's own LLM-token rate (tokens/s, burst).
    pub fn token_rate(mut self, per_second: f64, burst: u64) -> Self {
        self.token_rate = Some((per_second, burst));
        self
    }

    /// The tenant's weight in fair queueing: how many of its waiting requests are granted per turn
    /// (default 1). A tenant with weight 4 gets four times the grants of a tenant with weight 1 while
    /// both have requests waiting.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Checks the values (used by the admission builder).
    pub(crate) fn validate(&self, who: &str) -> Result<(), ConfigError> {
        if self.max_in_flight == Some(0) {
            return Err(ConfigError::Zero { what: "tenant max_in_flight" });
        }
        if let Some(share) = self.kv_share {
            if !(share > 0.0 && share <= 1.0) {
                return Err(ConfigError::OutOfRange {
                    what: "tenant kv_share",
                    reason: format!("{share} for {who}; use a fraction of the KV budget in (0, 1]"),
                });
            }
        }
        if self.weight == 0 {
            return Err(ConfigError::Zero { what: "tenant weight" });
        }
        if matches!(self.request_rate, Some((_, 0))) {
            return Err(ConfigError::Zero { what: "tenant request rate burst" });
        }
        if matches!(self.token_rate, Some((_, 0))) {
            return Err(ConfigError::Zero { what: "tenant token rate burst" });
        }
        Ok(())
    }
}

/// Default number of tenants tracked at once.
pub const DEFAULT_MAX_TENANTS: usize = 10_000;
/// Default idle time after which a tenant may be evicted.
pub const DEFAULT_TENANT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
const SHARDS: usize = 16;
/// Entries examined for an idle victim when a shard is full.
const EVICTION_PROBES: usize = 16;

/// What a permit, a waiter and the dispatcher need from a tenant (clock-independent).
pub(crate) trait TenantHandle: Send + Sync + fmt::Debug {
    fn key(&self) -> u64;
    fn weight(&self) -> u32;
    /// Takes one in-flight slot and `kv` of the tenant's KV share, all or nothing.
    fn try_reserve(&self, kv: u64) -> bool;
    fn release(&self, kv: u64);
    /// Gives back rate charges to the tenant's own buckets.
    fn refund_rates(&self, request: bool, tokens: u64, now: u64);
    fn in_flight(&self) -> u64;
}

/// One tenant's state.
pub(crate) struct TenantState<C: Clock> {
    key: u64,
    weight: u32,
    max_in_flight: u64,
    kv_limit: u64,
    in_flight: AtomicU64,
    kv_used: AtomicU64,
    last_used: AtomicU64,
    rates: Rates<C>,
}

impl<C: Clock> fmt::Debug for TenantState<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantState")
            .field("key", &self.key)
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .field("kv_used", &self.kv_used.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<C: Clock> TenantState<C> {
    fn new(key: u64, limits: &TenantLimits, kv_capacity: u64, clock: &C) -> Result<Self, ConfigError> {
        let kv_limit = match limits.kv_share {
            Some(share) if kv_capacity != u64::MAX => ((kv_capacity as f64) * share).floor().max(1.0) as u64,
            _ => u64::MAX,
        };
        Ok(Self {
            key,
            weight: limits.weight.max(1),
            max_in_flight: limits.max_in_flight.map_or(u64::MAX, |n| n as u64),
            kv_limit,
            in_flight: AtomicU64::new(0),
            kv_used: AtomicU64::new(0),
            last_used: AtomicU64::new(clock.now_nanos()),
            rates: Rates::new(
                limits.request_rate.map(|(rate, burst)| (rate, u64::from(burst))),
                limits.token_rate,
                ("tenant request rate", "tenant token rate"),
                clock,
            )?,
        })
    }

    /// The most KV units one request of this tenant may need (its share), and its token burst.
    pub(crate) fn fits_at_all(&self, kv: u64, tokens: u64) -> Result<(), (super::Limit, u64, u64)> {
        if kv > self.kv_limit {
            return Err((super::Limit::TenantKvShare, kv, self.kv_limit));
        }
        if let Some(burst) = self.rates.token_burst() {
            if tokens > burst {
                return Err((super::Limit::TenantTokenRate, tokens, burst));
            }
        }
        Ok(())
    }

    /// Charges the tenant's rates, all or nothing.
    pub(crate) fn charge_rates(&self, tokens: u64, now: u64) -> Result<(), Rejection> {
        match self.rates.charge(tokens, now) {
            Ok(_) => Ok(()),
            Err(RateRefusal::NotYet(retry_after)) => Err(Rejection::RateLimited { retry_after }),
            Err(RateRefusal::NeverFits { requested, burst }) => {
                Err(Rejection::TooLarge { limit: super::Limit::TenantTokenRate, requested, capacity: burst })
            }
        }
    }

    /// The tenant's own rate buckets at `now`.
    pub(crate) fn rate_status(&self, now: u64) -> super::RateLimitStatus {
        self.rates.status(now)
    }

    fn touch(&self, now: u64) {
        if self.last_used.load(Ordering::Relaxed) < now {
            self.last_used.store(now, Ordering::Relaxed);
        }
    }

    fn idle_since(&self, now: u64, idle: u64) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
            && self.kv_used.load(Ordering::Acquire) == 0
            && now.saturating_sub(self.last_used.load(Ordering::Relaxed)) >= idle
    }
}

impl<C: Clock> TenantHandle for TenantState<C> {
    fn key(&self) -> u64 {
        self.key
    }

    fn weight(&self) -> u32 {
        self.weight
    }

    fn try_reserve(&self, kv: u64) -> bool {
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.max_in_flight).then_some(n + 1))
            .is_ok();
        if !taken {
            return false;
        }
        let kv_taken = self
            .kv_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(kv).filter(|next| *next <= self.kv_limit)
            })
            .is_ok();
        if !kv_taken {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        kv_taken
    }

    fn release(&self, kv: u64) {
        self.kv_used.fetch_sub(kv, Ordering::AcqRel);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn refund_rates(&self, request: bool, tokens: u64, now: u64) {
        self.rates.refund(request, tokens, now);
    }

    fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }
}

/// Tenant configuration as built.
#[derive(Debug, Clone)]
pub(crate) struct TenantConfig {
    pub(crate) defaults: TenantLimits,
    pub(crate) overrides: HashMap<TenantId, TenantLimits>,
    pub(crate) max_tenants: usize,
    pub(crate) idle_timeout: Duration,
}

/// The bounded, sharded map from tenant ids to their state.
pub(crate) struct TenantRegistry<C: Clock> {
    config: TenantConfig,
    shards: Vec<RwLock<HashMap<TenantId, Arc<TenantState<C>>>>>,
    /// Capacity of each shard; they add up to `max_tenants`.
    shard_capacity: Vec<usize>,
    overflow: Arc<TenantState<C>>,
    kv_capacity: u64,
    clock: C,
}

impl<C: Clock> fmt::Debug for TenantRegistry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantRegistry").field("tracked", &self.tracked()).finish_non_exhaustive()
    }
}

/// Key of the shared overflow tenant (never produced by a real id in practice; documented).
const OVERFLOW_KEY: u64 = u64::MAX;

impl<C: Clock> TenantRegistry<C> {
    pub(crate) fn new(config: TenantConfig, kv_capacity: u64, clock: C) -> Result<Self, ConfigError> {
        config.defaults.validate("the tenant defaults")?;
        for (id, limits) in &config.overrides {
            limits.validate(&format!("tenant {}", id.get()))?;
            TenantState::new(id.get(), limits, kv_capacity, &clock)?;
        }
        if config.max_tenants == 0 {
            return Err(ConfigError::Zero { what: "max_tenants" });
        }
        let overflow = Arc::new(TenantState::new(OVERFLOW_KEY, &config.defaults, kv_capacity, &clock)?);
        let (base, extra) = (config.max_tenants / SHARDS, config.max_tenants % SHARDS);
        Ok(Self {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            shard_capacity: (0..SHARDS).map(|i| base + usize::from(i < extra)).collect(),
            overflow,
            kv_capacity,
            clock,
            config,
        })
    }

    /// Tenants tracked now (the overflow tenant not counted).
    pub(crate) fn tracked(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// The state of `id`, created if needed (or the overflow tenant when no room can be made).
    pub(crate) fn get(&self, id: TenantId, now: u64) -> Arc<TenantState<C>> {
        let index = (id.get() ^ (id.get() >> 32)) as usize % SHARDS;
        let shard = &self.shards[index];
        if let Some(state) = shard.read().get(&id) {
            state.touch(now);
            return Arc::clone(state);
        }
        let mut map = shard.write();
        if let Some(state) = map.get(&id) {
            state.touch(now);
            return Arc::clone(state);
        }
        if map.len() >= self.shard_capacity[index] {
            let idle = crate::clock::duration_to_nanos(self.config.idle_timeout);
            // Look at a bounded number of entries, so that a flood of new ids costs O(1) each.
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
        let limits = self.config.overrides.get(&id).unwrap_or(&self.config.defaults);
        // Validated at build time, so construction cannot fail here; fall back to overflow if it did.
        match TenantState::new(id.get(), limits, self.kv_capacity, &self.clock) {
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
        let index = (id.get() ^ (id.get() >> 32)) as usize % SHARDS;
        self.shards[index].read().get(&id).cloned()
    }

    /// What an untracked tenant's rate limits look like: its configured limits, full.
    pub(crate) fn untracked_rate_status(&self, id: TenantId) -> super::RateLimitStatus {
        let limits = self.config.overrides.get(&id).unwrap_or(&self.config.defaults);
        let full = |limit: u64| super::RateStatus { limit, remaining: limit, reset: Duration::ZERO };
        super::RateLimitStatus {
            requests: limits.request_rate.map(|(_, burst)| full(u64::from(burst))),
            tokens: limits.token_rate.map(|(_, burst)| full(burst)),
        }
    }

    /// In-flight counts of the busiest tenants, for metrics.
    pub(crate) fn top_in_flight(&self, n: usize) -> Vec<(TenantId, u64)> {
        let mut all: Vec<(TenantId, u64)> = self
            .shards
            .iter()
            .flat_map(|s| s.read().iter().map(|(id, st)| (*id, st.in_flight())).collect::<Vec<_>>())
            .filter(|(_, n)| *n > 0)
            .collect();
        all.sort_by_key(|entry| std::cmp::Reverse(entry.1));
        all.truncate(n);
        all
    }
}
