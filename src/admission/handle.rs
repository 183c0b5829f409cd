//! The public handle: [`Admission`] and everything a service calls on it.

use super::admit::Admit;
use super::builder::AdmissionBuilder;
use super::capacity::MAX_SLOTS;
use super::cost::KvCost;
use super::decision::{NoWait, Shared};
use super::owner::Owner;
use super::permit::Permit;
use super::rates::{self, RateLimitStatus};
use super::rejection::Rejection;
use super::request::{Priority, Request};
use super::snapshot::{RejectionCounts, Snapshot};
use super::tenant::{TenantId, TenantRegistry};
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Admission control for one inference server: concurrency, KV-cache budget, request rate and token
/// rate, checked together.
///
/// Clones share one state (it is an `Arc` inside), so hand a clone to every handler. `C` is the clock;
/// the default is [`MonotonicClock`] (the CPU's time-stamp counter through `quanta`, or
/// `std::time::Instant` without that feature); tests and simulations use
/// [`ManualClock`](crate::clock::ManualClock).
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Request, Rejection};
///
/// let admission = Admission::builder()
///     .max_in_flight(8)
///     .kv_capacity_tokens(64_000)
///     .token_rate(5_000.0, 64_000)
///     .build()?;
///
/// match admission.try_admit(&Request::new(2_000, 1_000)) {
///     Ok(permit) => {
///         // ... generate; keep `permit` alive until the last token is sent ...
///         permit.complete(640);
///     }
///     Err(rejection) => {
///         // e.g. answer `rejection.http_status()` with `Retry-After: rejection.retry_after()`
///         let _ = (rejection.http_status(), rejection.retry_after());
///     }
/// }
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
pub struct Admission<C: Clock = MonotonicClock> {
    pub(crate) shared: Arc<Shared<C>>,
}

impl<C: Clock> Clone for Admission<C> {
    fn clone(&self) -> Self {
        Self { shared: Arc::clone(&self.shared) }
    }
}

impl<C: Clock> fmt::Debug for Admission<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission").field("snapshot", &self.snapshot()).finish_non_exhaustive()
    }
}

impl Admission<MonotonicClock> {
    /// Starts configuring an admission. See [`AdmissionBuilder`].
    pub fn builder() -> AdmissionBuilder<MonotonicClock> {
        AdmissionBuilder::default()
    }
}

impl<C: Clock> Admission<C> {
    /// Admits `request` now, or says why not. Never waits for capacity.
    ///
    /// Requests already waiting in [`admit`](Admission::admit) of the same or a higher priority that the
    /// server's capacity holds back are never overtaken: while they wait, this returns
    /// [`Rejection::NoCapacity`]. Waiters held back only by their own tenant's limits block nobody else
    /// (but their own tenant's requests, which get [`Rejection::RateLimited`]).
    ///
    /// Cost: a few compare-and-swaps on the capacity words and the rate buckets, one clock read, no
    /// lock and no allocation — for a request without a tenant, or of a tenant already tracked (which takes
    /// one shard's read lock of the tenant registry). Exceptions, stated exactly:
    /// - a tenant seen for the first time is created (one allocation, then one shard's write lock; when
    ///   the registry is full, up to four shards are scanned one lock at a time for an idle tenant to
    ///   evict, else the tenant shares the overflow state);
    /// - a request that took capacity and must give it back (a later limit refused it) while a waiter was
    ///   held back by that capacity runs the dispatcher, which takes the waiting room's lock for a pass;
    /// - a granted request of a tenant that has waiters runs a pass (its waiting heads that no longer fit
    ///   the tenant's own limits are parked);
    /// - a request naming a shared prefix (with prefix sharing on) takes the waiting room's lock, where
    ///   the prefix table lives.
    ///
    /// A pass is bookkeeping only: no user code runs under the lock.
    ///
    /// # Errors
    ///
    /// A [`Rejection`]: `NoCapacity` (slots or KV budget in use, or others waiting), `RateLimited` (a rate,
    /// or the tenant's own cap or share), `TooLarge` (can never fit), `Closed`, or `Invalid` (a request for
    /// zero tokens). Whatever the reason, the request holds nothing afterwards.
    ///
    /// A rate refusal's `retry_after` is never earlier than the instant every rate the request meets would
    /// pass, and does not herd: the k-th request refused by one rate is told the moment it admits the k-th
    /// (exact for the first; at most a minute ahead); a capacity refusal's is an estimate from recent hold
    /// times, never earlier than the request's rates would allow.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{Admission, Request, Rejection};
    ///
    /// let admission = Admission::builder().kv_capacity_tokens(1000).build().unwrap();
    /// assert!(matches!(
    ///     admission.try_admit(&Request::new(900, 200)),
    ///     Err(Rejection::TooLarge { requested: 1100, capacity: 1000, .. })
    /// ));
    /// ```
    #[inline]
    pub fn try_admit(&self, request: &Request) -> Result<Permit, Rejection> {
        let owner = || Arc::clone(&self.shared) as Arc<dyn Owner>;
        self.shared.decide(&owner, request, NoWait)
    }

    /// Waits for admission: resolves at once when capacity is free and nobody of the same or a higher
    /// priority waits; otherwise queues the request in its priority class and resolves when it is its turn.
    ///
    /// A request of a tenant at its own in-flight cap or KV share waits too, in its tenant's fair queue,
    /// for that tenant's capacity (without holding anybody else back). Rate limits do not wait: a request
    /// over a rate resolves at once to [`Rejection::RateLimited`]. A full waiting room resolves at once to
    /// [`Rejection::QueueFull`]. A request that waits longer than its limit ([`Request::max_wait`], or the
    /// admission's [`max_queue_wait`](AdmissionBuilder::max_queue_wait)) resolves to
    /// [`Rejection::TimedOut`]; one that no longer fits after the KV budget shrank, to
    /// [`Rejection::TooLarge`]; every waiter resolves to [`Rejection::Closed`] on [`close`](Admission::close).
    ///
    /// The future owns what it needs (`Send + 'static`), works on any executor, and does nothing until
    /// polled. See [`Admit`] for cancel safety.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{Admission, Request};
    ///
    /// let admission = Admission::builder().max_in_flight(1).build().unwrap();
    /// let first = futures::executor::block_on(admission.admit(&Request::new(10, 10))).unwrap();
    /// let mut second = admission.admit(&Request::new(10, 10));
    /// // `second` waits until `first` is dropped.
    /// assert!(futures::FutureExt::now_or_never(&mut second).is_none());
    /// drop(first);
    /// assert!(futures::executor::block_on(second).is_ok());
    /// ```
    pub fn admit(&self, request: &Request) -> Admit {
        Admit::new(self.owner(), *request)
    }

    /// Like [`admit`](Admission::admit), for thread-per-request servers: blocks the calling thread
    /// (parked, no spinning) until admitted, rejected, or `timeout` (combined with the request's and the
    /// admission's wait limits; the shortest wins) has passed.
    ///
    /// # Errors
    ///
    /// The same [`Rejection`]s as [`admit`](Admission::admit); `TimedOut` when the wait limit passes.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{Admission, Request, Rejection};
    /// use std::time::Duration;
    ///
    /// let admission = Admission::builder().max_in_flight(1).build().unwrap();
    /// let _held = admission.try_admit(&Request::new(1, 1)).unwrap();
    /// let waited = admission.admit_blocking(&Request::new(1, 1), Some(Duration::from_millis(20)));
    /// assert_eq!(waited.unwrap_err(), Rejection::TimedOut);
    /// ```
    #[cfg(not(loom))]
    pub fn admit_blocking(&self, request: &Request, timeout: Option<Duration>) -> Result<Permit, Rejection> {
        super::admit::admit_blocking(self.owner(), *request, timeout)
    }

    /// Stops admitting: every waiter and every later request is rejected with [`Rejection::Closed`].
    /// Permits already granted stay valid until dropped. Idempotent.
    ///
    /// Linearizable: once `close` returns, nothing more is granted — not to a waiter, not by a dispatch pass
    /// running on another thread, not by a `try_admit` racing it.
    pub fn close(&self) {
        self.shared.core.close();
    }

    /// Whether [`close`](Admission::close) was called.
    pub fn is_closed(&self) -> bool {
        self.shared.core.is_closed()
    }

    /// Current state and counters. See [`Snapshot`].
    pub fn snapshot(&self) -> Snapshot {
        let core = &self.shared.core;
        let capacity = core.capacity();
        let to_usize = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let slot_limit = capacity.slot_limit();
        let prefixes = if self.shared.prefix_sharing { core.dispatcher.prefixes() } else { 0 };
        Snapshot {
            in_flight: to_usize(capacity.slots_used()),
            max_in_flight: if slot_limit >= MAX_SLOTS { usize::MAX } else { to_usize(slot_limit) },
            queued: core.dispatcher.queued(),
            queue_capacity: core.dispatcher.queue_capacity(),
            kv_used: capacity.kv_used(),
            kv_capacity: core.kv_limit(),
            admitted: core.stats.admitted(),
            rejected: RejectionCounts::from_counters(&core.stats.rejected()),
            closed: core.is_closed(),
            mean_hold: core.stats.hold.mean(),
            waker_panics: core.stats.waker_panics(),
            shed: core.stats.shed(),
            prefixes,
            kv_saved_by_prefixes: core.stats.prefix_saved(),
        }
    }

    /// Sets the gauges listed under *Metrics for operators* in the crate documentation (running,
    /// waiting, KV use, tracked tenants, the ten busiest tenants) through the `metrics` facade. Call it
    /// periodically or when the exporter is scraped; counters and histograms need no call.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn publish_metrics(&self) {
        let unit = if self.kv_in_bytes() { "bytes" } else { "tokens" };
        let busiest: Vec<(String, u64)> = self
            .busiest_tenants(10)
            .into_iter()
            .map(|(id, n)| (self.tenant_name(id).map_or_else(|| id.to_string(), |name| name.to_string()), n))
            .collect();
        crate::telemetry::publish(&self.snapshot(), unit, self.tracked_tenants(), &busiest);
    }

    /// Tenants whose state is tracked now (0 without tenants): the configured ones and at most
    /// [`max_tenants`](AdmissionBuilder::max_tenants) others.
    pub fn tracked_tenants(&self) -> usize {
        self.shared.tenants.as_ref().map_or(0, TenantRegistry::tracked)
    }

    /// The `n` tracked tenants with the most requests in flight, busiest first (for metrics).
    pub fn busiest_tenants(&self, n: usize) -> Vec<(TenantId, u64)> {
        self.shared.tenants.as_ref().map_or_else(Vec::new, |t| t.top_in_flight(n))
    }

    /// The name a tenant was configured with
    /// ([`tenant_limits`](AdmissionBuilder::tenant_limits)), or `None` for a tenant that only has the
    /// defaults (label it with its id's `Display`, `tenant-` and 16 hex digits).
    pub fn tenant_name(&self, tenant: TenantId) -> Option<Arc<str>> {
        self.shared.tenants.as_ref().and_then(|t| t.name_of(tenant))
    }

    /// Requests waiting in one priority class.
    pub fn queued_in(&self, priority: Priority) -> usize {
        self.shared.core.dispatcher.queued_in(priority.index())
    }

    /// The KV units `request` would reserve (tokens, or bytes with a KV model).
    pub fn kv_cost(&self, request: &Request) -> u64 {
        self.shared.kv_cost(request)
    }

    /// The admission's clock.
    pub fn clock(&self) -> &C {
        &self.shared.clock
    }

    /// Changes the in-flight limit. Growing it admits waiters at once; shrinking it below current use
    /// revokes nothing, it only admits nothing new until use drops below the new limit.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for 0.
    pub fn set_max_in_flight(&self, max_in_flight: usize) -> Result<(), ConfigError> {
        if max_in_flight == 0 {
            return Err(ConfigError::Zero { what: "max_in_flight" });
        }
        self.shared.core.set_max_in_flight(max_in_flight as u64);
        Ok(())
    }

    /// Changes the KV budget in the admission's KV unit — tokens, or bytes when the admission was built
    /// with [`kv_model`](AdmissionBuilder::kv_model). Growing it admits waiters at once; shrinking it
    /// revokes no permit, but a waiting request that no longer fits the new budget (or its tenant's
    /// share of it) resolves at once to [`Rejection::TooLarge`] instead of blocking the queue. Tenant
    /// shares ([`TenantLimits::kv_share`](crate::TenantLimits::kv_share)) follow the new budget.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for 0.
    pub fn set_kv_capacity(&self, capacity: u64) -> Result<(), ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::Zero { what: "KV capacity" });
        }
        self.shared.core.set_kv_limit(capacity);
        Ok(())
    }

    /// The former name of [`set_kv_capacity`](Admission::set_kv_capacity), which takes tokens or bytes.
    ///
    /// # Errors
    ///
    /// As [`set_kv_capacity`](Admission::set_kv_capacity).
    #[deprecated(since = "0.2.0", note = "use `set_kv_capacity`: the unit is the admission's KV unit, tokens or bytes")]
    pub fn set_kv_capacity_tokens(&self, capacity: u64) -> Result<(), ConfigError> {
        self.set_kv_capacity(capacity)
    }

    /// The current estimate of how long a request that joined the queue now would wait for capacity:
    /// the hint [`Rejection::NoCapacity`] and [`Rejection::QueueFull`] carry. HTTP adapters use it as the
    /// `Retry-After` of a [`Rejection::TimedOut`] answer.
    pub fn capacity_retry_after(&self) -> Duration {
        self.shared.core.capacity_hint(self.shared.core.dispatcher.queued())
    }

    /// The rate limits a request of `tenant` (or without a tenant) meets now: for the request rate and the
    /// token rate, the more constraining of the global bucket and the tenant's own. For OpenAI's
    /// `x-ratelimit-*` response headers. Does not create state for an unknown tenant (its limits are then
    /// the defaults, full).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{Admission, Request};
    ///
    /// let admission = Admission::builder().request_rate(10.0, 20).build()?;
    /// admission.try_admit(&Request::new(10, 10)).unwrap();
    /// let status = admission.rate_status(None).requests.unwrap();
    /// assert_eq!((status.limit, status.remaining), (20, 19));
    /// assert!(admission.rate_status(None).tokens.is_none());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn rate_status(&self, tenant: Option<TenantId>) -> RateLimitStatus {
        let now = self.shared.clock.now_nanos();
        let global = self.shared.rates.status(now);
        match (&self.shared.tenants, tenant) {
            (Some(registry), Some(id)) => match registry.peek(id) {
                Some(state) => global.tighter(state.rate_status(now)),
                None => global.tighter(registry.untracked_rate_status(id, now)),
            },
            _ => global,
        }
    }

    /// The fraction of `max_new_tokens` a request's KV reservation covers now: 1.0 with
    /// [`Reservation::Full`](crate::Reservation::Full), the learned estimate with [`Reservation::Learned`](crate::Reservation::Learned).
    pub fn output_estimate(&self) -> f64 {
        self.shared.reservation.ratio()
    }

    /// Whether the KV budget is counted in bytes (the admission has a KV model) rather than tokens.
    pub fn kv_in_bytes(&self) -> bool {
        matches!(self.shared.kv_cost, KvCost::Bytes { .. })
    }

    /// Changes the request rate at run time, keeping the tokens currently available (capped at the new
    /// burst).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an invalid rate or zero burst, and [`ConfigError::Conflict`] if the admission
    /// was built without a request rate.
    pub fn set_request_rate(&self, per_second: f64, burst: u32) -> Result<(), ConfigError> {
        let bucket = self.shared.rates.requests.as_ref().ok_or_else(|| {
            ConfigError::Conflict("this admission was built without a request rate; set one in the builder".into())
        })?;
        if burst == 0 {
            return Err(ConfigError::Zero { what: "request rate burst" });
        }
        bucket.set_rate(per_second, u64::from(burst)).map_err(|e| rates::rename_rate(e, "request rate"))
    }

    /// Changes the token rate at run time, keeping the tokens currently available (capped at the new
    /// burst).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an invalid rate or zero burst, and [`ConfigError::Conflict`] if the admission
    /// was built without a token rate.
    pub fn set_token_rate(&self, per_second: f64, burst: u64) -> Result<(), ConfigError> {
        let bucket = self.shared.rates.tokens.as_ref().ok_or_else(|| {
            ConfigError::Conflict("this admission was built without a token rate; set one in the builder".into())
        })?;
        if burst == 0 {
            return Err(ConfigError::Zero { what: "token rate burst" });
        }
        bucket.set_rate(per_second, burst).map_err(|e| rates::rename_rate(e, "token rate"))
    }

    /// Ends the waits whose deadline has passed on the admission's clock, and returns how many. A timer
    /// thread does this on its own for real clocks; with a [`ManualClock`](crate::clock::ManualClock),
    /// call it after advancing time to make expiry deterministic.
    ///
    /// Blocking waiters ([`admit_blocking`](Admission::admit_blocking)) are ended and unparked the same way
    /// as async ones.
    pub fn expire_waiters(&self) -> usize {
        self.shared.core.expire_waiters(self.shared.clock.now_nanos()).0
    }

    /// Holds the waiting room's lock until the returned guard is dropped. For tests that prove which
    /// operations take no lock (an operation that finishes while it is held took none); not a stable API.
    #[doc(hidden)]
    #[cfg(not(loom))]
    pub fn __hold_waiting_room(&self) -> impl Sized + '_ {
        self.shared.core.dispatcher.hold_room()
    }

    fn owner(&self) -> Arc<dyn Owner> {
        self.shared.clone()
    }
}
