//! One tenant's state: its capacity, its rate buckets and what it has been seen to hold.

use super::{FlowKey, TenantLimits};
use crate::admission::capacity::{Capacity, Share};
use crate::admission::rates::{Charge, RateLimitStatus, RateRefusal, Rates};
use crate::admission::stats::{HoldTime, capacity_hint};
use crate::admission::{Limit, Rejection};
use crate::clock::Clock;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};
use std::fmt;
use std::time::Duration;

/// The clock-independent part of a tenant: what permits, waiters and the dispatcher touch.
///
/// `capacity` counts the tenant's in-flight slots and, when it has a KV share, its KV units; its
/// `HELD_BACK` bits say which classes have *parked* waiters of this tenant (see the tenant module docs).
#[derive(Debug)]
pub(crate) struct TenantCore {
    pub(crate) flow: FlowKey,
    pub(crate) weight: u32,
    pub(crate) capacity: Capacity,
    /// The tenant's share of the global KV budget, if it has one.
    kv_share: Option<Share>,
    pub(crate) hold: HoldTime,
    /// Waiters of this tenant, all classes (written under the waiting room's lock).
    queued: AtomicU64,
    /// Virtual token counter for token fairness (advanced under the waiting room's lock, refunded by
    /// completions).
    virtual_tokens: AtomicU64,
}

impl TenantCore {
    /// KV units the tenant's own capacity counts for a reservation of `kv` (none without a share).
    #[inline]
    pub(crate) fn kv_units(&self, kv: u64) -> u64 {
        if self.kv_share.is_some() { kv } else { 0 }
    }

    /// The tenant's KV limit under the global budget `budget` (its share of the budget in force).
    #[inline]
    pub(crate) fn kv_limit(&self, budget: u64) -> u64 {
        self.kv_share.map_or(u64::MAX, |share| share.of(budget))
    }

    /// Whether a request of `kv` units can ever fit the tenant's share of `budget`.
    pub(crate) fn fits_share(&self, kv: u64, budget: u64) -> Result<(), Rejection> {
        let limit = self.kv_limit(budget);
        if self.kv_units(kv) > limit {
            return Err(Rejection::TooLarge { limit: Limit::TenantKvShare, requested: kv, capacity: limit });
        }
        Ok(())
    }

    /// The retry hint for a request refused because this tenant is at its own in-flight cap or KV share:
    /// from this tenant's hold times, its requests in flight and its waiters.
    pub(crate) fn hint(&self) -> Duration {
        let queued = usize::try_from(self.queued.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
        capacity_hint(self.hold.mean(), self.capacity.slots_used(), queued)
    }

    /// Counts a waiter of this tenant in or out (under the waiting room's lock).
    pub(crate) fn add_queued(&self, delta: i64) {
        if delta >= 0 {
            self.queued.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
        } else {
            self.queued.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// The tenant's virtual token counter.
    pub(crate) fn virtual_tokens(&self) -> u64 {
        self.virtual_tokens.load(Ordering::Relaxed)
    }

    /// Sets the counter (the waiting room, under its lock).
    pub(crate) fn set_virtual_tokens(&self, counter: u64) {
        self.virtual_tokens.store(counter, Ordering::Relaxed);
    }

    /// Charges `units` of scaled cost to the counter (saturating); returns the counter before the charge:
    /// the level the grant was served at.
    pub(crate) fn charge_virtual_tokens(&self, units: u64) -> u64 {
        self.virtual_tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c.saturating_add(units)))
            .unwrap_or_else(|c| c)
    }

    /// Takes back `units` of scaled cost (output a completion did not produce), never below zero.
    pub(crate) fn refund_virtual_tokens(&self, units: u64) {
        let _ =
            self.virtual_tokens.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some(c.saturating_sub(units)));
    }

    /// Whether some of the tenant's requests wait.
    #[inline]
    pub(crate) fn has_waiters(&self) -> bool {
        self.queued.load(Ordering::Relaxed) != 0
    }

    /// Nothing in flight and nothing waiting.
    fn is_idle(&self) -> bool {
        self.capacity.slots_used() == 0 && self.queued.load(Ordering::Relaxed) == 0
    }
}

/// What a permit, a waiter and the dispatcher need from a tenant, without its clock type.
pub(crate) trait TenantHandle: Send + Sync + fmt::Debug {
    fn core(&self) -> &TenantCore;
    /// Gives back exactly `charge` to the tenant's own buckets.
    fn refund(&self, charge: Charge, now: u64);
}

/// One tenant's state.
pub(crate) struct TenantState<C: Clock> {
    core: TenantCore,
    rates: Rates<C>,
    last_used: AtomicU64,
}

impl<C: Clock> fmt::Debug for TenantState<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantState")
            .field("flow", &self.core.flow)
            .field("in_flight", &self.core.capacity.slots_used())
            .field("kv_used", &self.core.capacity.kv_used())
            .finish_non_exhaustive()
    }
}

impl<C: Clock> TenantState<C> {
    pub(crate) fn new(
        flow: FlowKey,
        limits: &TenantLimits,
        expected_hold: Duration,
        clock: &C,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            core: TenantCore {
                flow,
                weight: limits.weight.max(1),
                capacity: Capacity::new(limits.max_in_flight.map_or(u64::MAX, |n| n as u64)),
                kv_share: limits.kv_share.map(Share::new),
                hold: HoldTime::new(expected_hold),
                queued: AtomicU64::new(0),
                virtual_tokens: AtomicU64::new(0),
            },
            last_used: AtomicU64::new(clock.now_nanos()),
            rates: Rates::new(
                limits.request_rate.map(|(rate, burst)| (rate, u64::from(burst))),
                limits.token_rate,
                ("tenant request rate", "tenant token rate"),
                clock,
            )?,
        })
    }

    pub(crate) fn core(&self) -> &TenantCore {
        &self.core
    }

    /// Whether `tokens` can ever pass the tenant's token-rate burst.
    pub(crate) fn fits_burst(&self, tokens: u64) -> Result<(), Rejection> {
        match self.rates.token_burst() {
            Some(burst) if tokens > burst => {
                Err(Rejection::TooLarge { limit: Limit::TenantTokenRate, requested: tokens, capacity: burst })
            }
            _ => Ok(()),
        }
    }

    /// Charges the tenant's rates, all or nothing.
    pub(crate) fn charge(&self, tokens: u64, now: u64) -> Result<Charge, RateRefusal> {
        self.rates.charge(tokens, now)
    }

    /// Whether the tenant has rates at all.
    #[inline]
    pub(crate) fn has_rates(&self) -> bool {
        !self.rates.is_empty()
    }

    /// The hint for a request the tenant's rates refused at `now` (see `promise.rs`).
    pub(crate) fn promise_rate(&self, now: u64, wait: Duration, spacing: Duration) -> Duration {
        self.rates.promise.promise(now, wait, spacing)
    }

    /// The exact time until the tenant's rates would pass a request of `tokens`, without charging.
    pub(crate) fn rate_wait(&self, tokens: u64, now: u64) -> Duration {
        self.rates.wait(tokens, now)
    }

    /// The tenant's own rate buckets at `now`.
    pub(crate) fn rate_status(&self, now: u64) -> RateLimitStatus {
        self.rates.status(now)
    }

    pub(crate) fn touch(&self, now: u64) {
        if self.last_used.load(Ordering::Relaxed) < now {
            self.last_used.store(now, Ordering::Relaxed);
        }
    }

    /// Idle for at least `idle` nanoseconds at `now`: nothing in flight or waiting, no request since.
    pub(crate) fn idle_since(&self, now: u64, idle: u64) -> bool {
        self.core.is_idle() && now.saturating_sub(self.last_used.load(Ordering::Relaxed)) >= idle
    }
}

impl<C: Clock> TenantHandle for TenantState<C> {
    fn core(&self) -> &TenantCore {
        &self.core
    }

    fn refund(&self, charge: Charge, now: u64) {
        self.rates.refund(charge, now);
    }
}
