//! What an admission's permits and waiters share whatever its clock: the global capacity and KV budget,
//! the waiting room and the statistics.

use super::capacity::{Capacity, Credit, Limit as KvLimit, Refused, Shortage};
use super::dispatcher::{ClockFn, Dispatcher, Held, Resources, Timer};
use super::fairness::ServiceLevels;
use super::rejection::Rejection;
use super::stats::{Stats, capacity_hint};
use super::tenant::TenantHandle;
use super::wait_policy::Delay;
use crate::sync::CachePadded;
use std::time::Duration;

/// The hot words: taken and returned by every admission, on one cache line.
#[derive(Debug)]
struct Hot {
    capacity: Capacity,
    kv_limit: KvLimit,
}

/// Clock-independent admission state.
#[derive(Debug)]
pub(crate) struct Core {
    hot: CachePadded<Hot>,
    pub(crate) stats: Stats,
    pub(crate) dispatcher: Dispatcher,
    pub(crate) timer: Timer,
    /// Each class's service level under token fairness (grants that never waited raise it).
    pub(crate) levels: ServiceLevels,
    /// The admission's clock without its type, for the waiting room's deadline checks.
    now: ClockFn,
}

impl Core {
    #[allow(clippy::too_many_arguments, reason = "one argument per builder setting the core holds")]
    pub(crate) fn new(
        max_in_flight: u64,
        kv_capacity: u64,
        queue_capacity: usize,
        expected_hold: Duration,
        deadline_timer: bool,
        max_prefixes: usize,
        token_fairness: bool,
        delay: Option<Delay>,
        now: ClockFn,
    ) -> Self {
        Self {
            hot: CachePadded(Hot { capacity: Capacity::new(max_in_flight), kv_limit: KvLimit::new(kv_capacity) }),
            stats: Stats::new(expected_hold),
            dispatcher: Dispatcher::new(queue_capacity, max_prefixes, token_fairness, delay),
            timer: Timer::new(deadline_timer),
            levels: ServiceLevels::default(),
            now,
        }
    }

    #[inline]
    pub(crate) fn capacity(&self) -> &Capacity {
        &self.hot.capacity
    }

    /// The KV budget in force.
    #[inline]
    pub(crate) fn kv_limit(&self) -> u64 {
        self.hot.kv_limit.get()
    }

    #[inline]
    pub(crate) fn resources(&self) -> Resources<'_> {
        Resources {
            capacity: &self.hot.capacity,
            kv_limit: &self.hot.kv_limit,
            stats: &self.stats,
            levels: &self.levels,
            now: &self.now,
        }
    }

    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.hot.capacity.is_closed()
    }

    /// Takes a slot and `kv` units for a new request of `class`; a refusal that gave back a slot a waiter
    /// wanted runs the dispatcher before returning.
    #[inline]
    pub(crate) fn try_take(&self, kv: u64, class: usize) -> Result<(), Shortage> {
        self.hot.capacity.try_take(kv, self.kv_limit(), class).map_err(|Refused { shortage, dispatch }| {
            if dispatch {
                self.dispatcher.dispatch(self.resources(), None, Credit::default());
            }
            shortage
        })
    }

    /// Returns what a permit (or a refused request) holds — one slot, its own KV units, its share of a
    /// prefix, its tenant's part — then lets the dispatcher hand it to waiters if any is held back.
    #[inline(always)]
    pub(crate) fn release_held(&self, held: Held, tenant: Option<&dyn TenantHandle>) {
        let Some(prefix) = held.prefix else { return self.release(held.kv, tenant) };
        let mut unpark = None;
        if let Some(tenant) = tenant {
            let core = tenant.core();
            if core.capacity.release(core.kv_units(held.kv)) {
                unpark = Some(tenant);
            }
        }
        self.dispatcher.release_shared(self.resources(), held.kv, prefix, unpark);
    }

    /// Returns one slot and `kv` units (and its tenant's part), then lets the dispatcher hand them to
    /// waiters if any is held back.
    #[inline]
    pub(crate) fn release(&self, kv: u64, tenant: Option<&dyn TenantHandle>) {
        let mut unpark = None;
        if let Some(tenant) = tenant {
            let core = tenant.core();
            if core.capacity.release(core.kv_units(kv)) {
                unpark = Some(tenant);
            }
        }
        let capacity = &self.hot.capacity;
        if capacity.has_held_back() {
            // Somebody waits for global capacity: hand it over under the lock rather than returning it to
            // the words and taking it back (a race with the bits is covered: see `has_held_back`).
            self.dispatcher.dispatch(self.resources(), unpark, Credit { slots: 1, kv });
            return;
        }
        if capacity.release(kv) || unpark.is_some() {
            self.dispatcher.dispatch(self.resources(), unpark, Credit::default());
        }
    }

    /// Changes the in-flight limit; growing it grants waiters at once.
    pub(crate) fn set_max_in_flight(&self, limit: u64) {
        self.hot.capacity.set_slot_limit(limit);
        self.dispatcher.dispatch(self.resources(), None, Credit::default());
    }

    /// Changes the KV budget: waiters that no longer fit end `TooLarge`; growing grants waiters at once.
    pub(crate) fn set_kv_limit(&self, limit: u64) {
        self.hot.kv_limit.set(limit);
        self.dispatcher.resized(self.resources());
    }

    /// Closes the admission (linearizable: no grant after this returns).
    pub(crate) fn close(&self) {
        self.dispatcher.close(self.resources());
    }

    /// Ends the waits whose deadline is at or before `now`; returns how many and the next deadline.
    pub(crate) fn expire_waiters(&self, now: u64) -> (usize, Option<u64>) {
        self.dispatcher.expire(self.resources(), now)
    }

    /// Estimated wait for capacity of a new request with `ahead` waiters before it.
    pub(crate) fn capacity_hint(&self, ahead: usize) -> Duration {
        capacity_hint(self.stats.hold.mean(), self.hot.capacity.slots_used(), ahead)
    }

    /// The `NoCapacity` refusal of a request of `class`.
    pub(crate) fn no_capacity(&self, class: usize) -> Rejection {
        Rejection::NoCapacity { retry_after: self.capacity_hint(self.dispatcher.queued_at_or_above(class)) }
    }

    /// Records one rejection.
    #[inline]
    pub(crate) fn count_rejection(&self, rejection: &Rejection, has_tenant: bool) {
        self.stats.count_rejected(rejection.kind());
        crate::telemetry::rejected(rejection, has_tenant);
    }
}
