//! Admission: one decision that combines every limit before a request may start generating.
//!
//! [`Admission::try_admit`] checks, all or nothing, an in-flight slot, the KV-cache budget, the request
//! rate and the LLM-token rate. It returns an RAII [`Permit`] that gives the capacity back when dropped,
//! or a [`Rejection`] that says why and, when waiting helps, for how long. [`Admission::admit`] and
//! [`Admission::admit_blocking`] wait for capacity in a bounded, FIFO, priority-aware waiting room instead
//! of being refused while the server is busy.
//!
//! # Order of checks
//! 1. the request itself (`Invalid`), whether the admission is closed, and whether the request could ever
//!    fit (`TooLarge`: more KV than the budget or the tenant's share, more tokens than a burst) — these
//!    consume nothing;
//! 2. waiters of the same or a higher priority: a new request never overtakes them (`NoCapacity`);
//! 3. the in-flight slot and the KV budget (`NoCapacity`), then the tenant's own in-flight cap and KV
//!    share (`RateLimited`: the client is over its share, not the server out of room);
//! 4. the request rate and the token rate, global then the tenant's (`RateLimited`), only after capacity
//!    was found, so that a request refused for capacity does not spend rate tokens. A refusal at any
//!    step gives back what the earlier steps took before returning.
//!
//! # Submodules
//! `core` (gauges, waiting count, dispatcher), `fair` (per-tenant round-robin inside a class), `waiter`
//! (one waiting request's state word), `admit` (the future and the blocking wait), `timer` (deadlines),
//! `tenant` (per-tenant limits and the bounded registry), `permit`, `rejection`, `request`, `snapshot`,
//! `builder`.

mod admit;
mod builder;
mod core;
mod fair;
mod permit;
mod rates;
mod rejection;
mod request;
mod snapshot;
mod tenant;
mod timer;
mod waiter;

pub use admit::Admit;
pub use builder::{AdmissionBuilder, DEFAULT_QUEUE_CAPACITY};
pub use permit::Permit;
pub use rates::{RateLimitStatus, RateStatus};
pub use rejection::{Limit, Rejection};
pub use request::{Priority, Request};
pub use snapshot::{RejectionCounts, Snapshot};
pub use tenant::{DEFAULT_MAX_TENANTS, DEFAULT_TENANT_IDLE_TIMEOUT, TenantId, TenantLimits};

use self::core::Core;
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::kv::{KvDtype, ModelSpec};
use crate::sync::Ordering;
use permit::Owner;
use rates::{RateRefusal, Rates};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tenant::{TenantHandle, TenantRegistry};

/// How much of a request's `max_new_tokens` its KV reservation covers.
///
/// - [`Reservation::Full`] (the default) reserves `prompt + max_new_tokens`: the engine can never need
///   more KV than the budget, so it never has to preempt, but most requests stop long before
///   `max_new_tokens` and their unused reservation keeps other users waiting.
/// - [`Reservation::Learned`] reserves `prompt + ceil(max_new_tokens × ratio)`, where `ratio` is learned
///   from completed permits ([`Permit::complete`] reports the tokens really generated): an exponentially
///   weighted mean of `output / max_new_tokens`, multiplied by `headroom` and kept within
///   `[floor, 1]`. More users fit on the same GPU; the price is that a request generating more than
///   its estimate holds KV the budget did not count, and the engine may have to preempt (vLLM and
///   SGLang recompute or swap a sequence out when the cache runs full). SGLang schedules with a similar
///   decaying `new_token_ratio`. The current ratio is [`Admission::output_estimate`].
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Request, Reservation};
///
/// let admission = Admission::builder()
///     .kv_capacity_tokens(100_000)
///     .reservation(Reservation::learned())
///     .build()?;
/// for _ in 0..64 {
///     // Clients ask for 4096 output tokens but stop after about 400.
///     admission.try_admit(&Request::new(1_000, 4_096)).unwrap().complete(400);
/// }
/// let permit = admission.try_admit(&Request::new(1_000, 4_096)).unwrap();
/// assert!(permit.kv_reserved() < 1_000 + 4_096 / 2);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reservation {
    /// Reserve `prompt + max_new_tokens`.
    Full,
    /// Reserve `prompt + ceil(max_new_tokens × ratio)` with a learned ratio.
    Learned {
        /// Ratio used before any permit completed, in `(0, 1]`.
        initial: f64,
        /// Lowest ratio ever used, in `(0, 1]`.
        floor: f64,
        /// Factor (≥ 1) applied to the observed mean, a margin against longer-than-usual outputs.
        headroom: f64,
    },
}

impl Reservation {
    /// [`Reservation::Learned`] with `initial` 1.0 (start safe), `floor` 0.05 and `headroom` 1.25.
    pub const fn learned() -> Self {
        Reservation::Learned { initial: 1.0, floor: 0.05, headroom: 1.25 }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Reservation::Learned { initial, floor, headroom } = *self {
            let fraction = |v: f64| v > 0.0 && v <= 1.0;
            if !(fraction(initial) && fraction(floor) && headroom >= 1.0 && headroom.is_finite()) {
                return Err(ConfigError::OutOfRange {
                    what: "learned reservation",
                    reason: format!(
                        "initial {initial} and floor {floor} must be in (0, 1], headroom {headroom} at least 1"
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The reservation policy and what it has learned.
#[derive(Debug)]
pub(crate) struct ReservationState {
    policy: Reservation,
    /// Mean observed `output / max_new`, as `f64` bits.
    mean_ratio: crate::sync::AtomicU64,
}

impl ReservationState {
    pub(crate) fn new(policy: Reservation) -> Self {
        let initial = match policy {
            Reservation::Full => 1.0,
            Reservation::Learned { initial, .. } => initial,
        };
        Self { policy, mean_ratio: crate::sync::AtomicU64::new(f64::to_bits(initial)) }
    }

    /// The fraction of `max_new_tokens` reserved now.
    pub(crate) fn ratio(&self) -> f64 {
        match self.policy {
            Reservation::Full => 1.0,
            Reservation::Learned { floor, headroom, .. } => {
                let mean = f64::from_bits(self.mean_ratio.load(Ordering::Relaxed));
                (mean * headroom).clamp(floor, 1.0)
            }
        }
    }

    /// Tokens a request reserves: its prompt and the reserved part of its output.
    #[inline]
    pub(crate) fn tokens(&self, request: &Request) -> u64 {
        match self.policy {
            Reservation::Full => request.total_tokens(),
            Reservation::Learned { .. } => {
                let output = (f64::from(request.max_new_tokens) * self.ratio()).ceil() as u64;
                u64::from(request.prompt_tokens) + output.min(u64::from(request.max_new_tokens))
            }
        }
    }

    /// Feeds one completed request into the mean (weight 1/16; a racing update may be lost, which only
    /// slows learning).
    pub(crate) fn observe(&self, output: u32, max_new: u32) {
        if matches!(self.policy, Reservation::Full) || max_new == 0 {
            return;
        }
        let sample = (f64::from(output) / f64::from(max_new)).min(1.0);
        let mean = f64::from_bits(self.mean_ratio.load(Ordering::Relaxed));
        let next = mean + (sample - mean) / 16.0;
        self.mean_ratio.store(next.to_bits(), Ordering::Relaxed);
    }
}

/// How a request's KV reservation is computed.
#[derive(Debug, Clone)]
pub(crate) enum KvCost {
    /// `prompt_tokens + max_new_tokens` tokens.
    Tokens,
    /// The bytes a sequence of `prompt_tokens + max_new_tokens` tokens holds in a paged KV cache.
    Bytes { spec: Arc<ModelSpec>, dtype: KvDtype, block_size: u32 },
}

impl KvCost {
    #[inline]
    fn units(&self, total_tokens: u64) -> u64 {
        match self {
            KvCost::Tokens => total_tokens,
            KvCost::Bytes { spec, dtype, block_size } => spec.kv_bytes_paged(total_tokens, *dtype, *block_size),
        }
    }
}

/// Admission control for one inference server: concurrency, KV-cache budget, request rate and token
/// rate, checked together.
///
/// Clones share one state (it is an `Arc` inside), so hand a clone to every handler. `C` is the clock;
/// the default reads `std::time::Instant`, tests use [`ManualClock`](crate::clock::ManualClock).
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
    shared: Arc<Shared<C>>,
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

/// Everything one admission owns.
#[derive(Debug)]
pub(crate) struct Shared<C: Clock> {
    pub(crate) core: Core,
    pub(crate) clock: C,
    pub(crate) kv_cost: KvCost,
    pub(crate) reservation: ReservationState,
    pub(crate) rates: Rates<C>,
    /// Default longest queue wait in clock nanoseconds.
    pub(crate) max_queue_wait: Option<u64>,
    pub(crate) tenants: Option<TenantRegistry<C>>,
}

impl Admission<MonotonicClock> {
    /// Starts configuring an admission. See [`AdmissionBuilder`].
    pub fn builder() -> AdmissionBuilder<MonotonicClock> {
        AdmissionBuilder::default()
    }
}

impl<C: Clock> Admission<C> {
    /// Admits `request` now, or says why not. Never blocks, never allocates.
    ///
    /// Requests already waiting in [`admit`](Admission::admit) of the same or a higher priority are never
    /// overtaken: while they wait, this returns [`Rejection::NoCapacity`].
    ///
    /// # Errors
    ///
    /// A [`Rejection`]: `NoCapacity` (slots or KV budget in use, or others waiting), `RateLimited`,
    /// `TooLarge` (can never fit), `Closed`, or `Invalid` (a request for zero tokens). Whatever the
    /// reason, the request holds nothing afterwards.
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
        let result = self.shared.admit_now(&self.owner(), request);
        if let Err(rejection) = &result {
            self.shared.core.count_rejection(rejection, request.tenant.is_some());
        }
        result
    }

    /// Waits for admission: resolves at once when capacity is free and nobody of the same or a higher
    /// priority waits; otherwise queues the request in its priority class and resolves when it is its turn.
    ///
    /// Rate limits do not wait: a request over a rate resolves at once to
    /// [`Rejection::RateLimited`]. A full waiting room resolves at once to [`Rejection::QueueFull`]. A
    /// request that waits longer than its limit ([`Request::max_wait`], or the admission's
    /// [`max_queue_wait`](AdmissionBuilder::max_queue_wait)) resolves to [`Rejection::TimedOut`].
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
        admit::admit_blocking(self.owner(), *request, timeout)
    }

    /// Stops admitting: every waiter and every later request is rejected with [`Rejection::Closed`].
    /// Permits already granted stay valid until dropped. Idempotent.
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
        let stats = &core.stats;
        let rejected = |i: usize| stats.rejected[i].load(Ordering::Relaxed);
        Snapshot {
            in_flight: usize::try_from(core.slots().used()).unwrap_or(usize::MAX),
            max_in_flight: usize::try_from(core.slots().limit()).unwrap_or(usize::MAX),
            queued: core.queued(),
            queue_capacity: core.queue_capacity(),
            kv_used: core.kv().used(),
            kv_capacity: core.kv().limit(),
            admitted: stats.admitted.load(Ordering::Relaxed),
            rejected: RejectionCounts {
                no_capacity: rejected(0),
                rate_limited: rejected(1),
                too_large: rejected(2),
                queue_full: rejected(3),
                timed_out: rejected(4),
                closed: rejected(5),
                invalid: rejected(6),
            },
            closed: core.is_closed(),
            mean_hold: core.mean_hold(),
        }
    }

    /// Sets the gauges listed under *Metrics for operators* in the crate documentation (running,
    /// waiting, KV use, tracked tenants, the ten busiest tenants) through the `metrics` facade. Call it
    /// periodically or when the exporter is scraped; counters and histograms need no call.
    #[cfg(feature = "metrics")]
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn publish_metrics(&self) {
        let unit = if self.kv_in_bytes() { "bytes" } else { "tokens" };
        crate::telemetry::publish(&self.snapshot(), unit, self.tracked_tenants(), &self.busiest_tenants(10));
    }

    /// Tenants whose state is tracked now (0 without tenants). Never above
    /// [`max_tenants`](AdmissionBuilder::max_tenants).
    pub fn tracked_tenants(&self) -> usize {
        self.shared.tenants.as_ref().map_or(0, TenantRegistry::tracked)
    }

    /// The `n` tracked tenants with the most requests in flight, busiest first (for metrics).
    pub fn busiest_tenants(&self, n: usize) -> Vec<(TenantId, u64)> {
        self.shared.tenants.as_ref().map_or_else(Vec::new, |t| t.top_in_flight(n))
    }

    /// Requests waiting in one priority class.
    pub fn queued_in(&self, priority: Priority) -> usize {
        self.shared.core.queued_in(priority.index())
    }

    /// The KV units `request` would reserve (tokens, or bytes with a KV model).
    pub fn kv_cost(&self, request: &Request) -> u64 {
        self.shared.kv_cost.units(self.shared.reservation.tokens(request))
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
        self.shared.core.slots().set_limit(max_in_flight as u64);
        self.shared.core.dispatch_if_waiting();
        Ok(())
    }

    /// Changes the KV budget in the admission's KV unit — tokens, or bytes when the admission was built
    /// with [`kv_model`](AdmissionBuilder::kv_model) — with the same semantics as
    /// [`set_max_in_flight`](Admission::set_max_in_flight).
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for 0.
    pub fn set_kv_capacity(&self, capacity: u64) -> Result<(), ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::Zero { what: "KV capacity" });
        }
        self.shared.core.kv().set_limit(capacity);
        self.shared.core.dispatch_if_waiting();
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
        self.shared.core.capacity_hint(self.shared.core.queued())
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
                None => global.tighter(registry.untracked_rate_status(id)),
            },
            _ => global,
        }
    }

    /// The fraction of `max_new_tokens` a request's KV reservation covers now: 1.0 with
    /// [`Reservation::Full`], the learned estimate with [`Reservation::Learned`].
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
    pub fn expire_waiters(&self) -> usize {
        self.shared.core.expire_waiters(self.shared.clock.now_nanos())
    }

    fn owner(&self) -> Arc<dyn Owner> {
        self.shared.clone()
    }
}

impl<C: Clock> Shared<C> {
    /// The whole `try_admit` decision, without counting a rejection.
    #[inline]
    pub(crate) fn admit_now(&self, this: &Arc<dyn Owner>, request: &Request) -> Result<Permit, Rejection> {
        let total = request.total_tokens();
        let kv = self.validate(request)?;
        let core = &self.core;
        if let (Some(registry), Some(id)) = (&self.tenants, request.tenant) {
            return self.admit_tenant(this, request, kv, registry, id);
        }
        if core.has_waiters_at_or_above(request.priority.index()) || !core.try_reserve(kv) {
            return Err(Rejection::NoCapacity { retry_after: core.capacity_hint(core.queued()) });
        }
        match self.charge_rates_fresh(total) {
            Ok((tokens_charged, now)) => Ok(self.grant(this, request, kv, tokens_charged, None, now)),
            Err(rejection) => {
                core.release(kv);
                Err(rejection)
            }
        }
    }

    /// `admit_now` for a request of a tenant: the global limits and the tenant's, all or nothing.
    fn admit_tenant(
        &self,
        this: &Arc<dyn Owner>,
        request: &Request,
        kv: u64,
        registry: &TenantRegistry<C>,
        id: TenantId,
    ) -> Result<Permit, Rejection> {
        let core = &self.core;
        let total = request.total_tokens();
        let tenant = registry.get(id, self.clock.now_nanos());
        if let Err((limit, requested, capacity)) = tenant.fits_at_all(kv, total) {
            return Err(Rejection::TooLarge { limit, requested, capacity });
        }
        if core.has_waiters_at_or_above(request.priority.index()) || !core.try_reserve(kv) {
            return Err(Rejection::NoCapacity { retry_after: core.capacity_hint(core.queued()) });
        }
        if !tenant.try_reserve(kv) {
            core.release(kv);
            // The tenant is at its own concurrency or KV share: the client, not the server, is too busy.
            return Err(Rejection::RateLimited { retry_after: core.capacity_hint(0) });
        }
        let (tokens_charged, now) = match self.charge_rates_fresh(total) {
            Ok(charged) => charged,
            Err(rejection) => {
                tenant.release(kv);
                core.release(kv);
                return Err(rejection);
            }
        };
        if let Err(rejection) = tenant.charge_rates(total, now) {
            self.refund_global(true, tokens_charged, now);
            tenant.release(kv);
            core.release(kv);
            return Err(rejection);
        }
        Ok(self.grant(this, request, kv, tokens_charged, Some(tenant), now))
    }

    /// Charges the global rates at the current time, looking at the clock again once if refused: a
    /// thread preempted between reading the clock and charging the bucket arrives with a stale time and
    /// would be refused for tokens that have accrued since. Returns the tokens charged and the time.
    #[inline]
    fn charge_rates_fresh(&self, total: u64) -> Result<(u64, u64), Rejection> {
        let now = self.clock.now_nanos();
        match self.charge_rates(total, now) {
            Err(Rejection::RateLimited { .. }) => {
                let now = self.clock.now_nanos();
                self.charge_rates(total, now).map(|tokens| (tokens, now))
            }
            other => other.map(|tokens| (tokens, now)),
        }
    }

    /// Counts an admission and builds its permit.
    #[inline]
    fn grant(
        &self,
        this: &Arc<dyn Owner>,
        request: &Request,
        kv: u64,
        tokens_charged: u64,
        tenant: Option<Arc<dyn TenantHandle>>,
        now: u64,
    ) -> Permit {
        let sequence = self.core.stats.admitted.fetch_add(1, Ordering::Relaxed);
        crate::telemetry::admitted(request.priority);
        Permit::new(Arc::clone(this), request, kv, tokens_charged, tenant, now, sequence)
    }

    /// Gives back global rate charges.
    fn refund_global(&self, request: bool, tokens: u64, now: u64) {
        self.rates.refund(request, tokens, now);
    }

    /// Checks what never changes by waiting: a valid request, an open admission, and that it can fit at
    /// all. Returns the request's KV units.
    #[inline]
    pub(crate) fn validate(&self, request: &Request) -> Result<u64, Rejection> {
        let total = request.total_tokens();
        if total == 0 {
            return Err(Rejection::Invalid { reason: "the request asks for zero tokens (prompt and output both 0)" });
        }
        if self.core.is_closed() {
            return Err(Rejection::Closed);
        }
        let kv = self.kv_cost.units(self.reservation.tokens(request));
        let kv_capacity = self.core.kv().limit();
        if kv > kv_capacity {
            return Err(Rejection::TooLarge { limit: Limit::KvBudget, requested: kv, capacity: kv_capacity });
        }
        if let Some(burst) = self.rates.token_burst() {
            if total > burst {
                return Err(Rejection::TooLarge { limit: Limit::TokenRate, requested: total, capacity: burst });
            }
        }
        Ok(kv)
    }

    /// Charges one request and `total` tokens to the global rates, all or nothing. Returns the tokens
    /// charged to the token rate.
    #[inline]
    pub(crate) fn charge_rates(&self, total: u64, now: u64) -> Result<u64, Rejection> {
        self.rates.charge(total, now).map_err(|refusal| match refusal {
            RateRefusal::NotYet(retry_after) => Rejection::RateLimited { retry_after },
            RateRefusal::NeverFits { requested, burst } => {
                Rejection::TooLarge { limit: Limit::TokenRate, requested, capacity: burst }
            }
        })
    }
}

impl<C: Clock> Owner for Shared<C> {
    #[inline]
    fn core(&self) -> &Core {
        &self.core
    }

    #[inline]
    fn now_nanos(&self) -> u64 {
        self.clock.now_nanos()
    }

    fn refund_rates(&self, request: bool, tokens: u64, tenant: Option<&dyn TenantHandle>) {
        let now = self.clock.now_nanos();
        self.refund_global(request, tokens, now);
        if let Some(tenant) = tenant {
            tenant.refund_rates(request, tokens, now);
        }
    }

    fn admit_now(&self, this: &Arc<dyn Owner>, request: &Request) -> Result<Permit, Rejection> {
        Shared::admit_now(self, this, request)
    }

    fn prepare_wait(&self, request: &Request) -> Result<admit::Ticket, Rejection> {
        let kv = self.validate(request)?;
        let total = request.total_tokens();
        let tenant = match (&self.tenants, request.tenant) {
            (Some(registry), Some(id)) => {
                let tenant = registry.get(id, self.clock.now_nanos());
                if let Err((limit, requested, capacity)) = tenant.fits_at_all(kv, total) {
                    return Err(Rejection::TooLarge { limit, requested, capacity });
                }
                Some(tenant)
            }
            _ => None,
        };
        let (tokens_charged, now) = self.charge_rates_fresh(total)?;
        if let Some(tenant) = &tenant {
            if let Err(rejection) = tenant.charge_rates(total, now) {
                self.refund_global(true, tokens_charged, now);
                return Err(rejection);
            }
        }
        let tenant: Option<Arc<dyn TenantHandle>> = tenant.map(|t| t as Arc<dyn TenantHandle>);
        let wait = match (request.max_wait.map(crate::clock::duration_to_nanos), self.max_queue_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline = wait.map_or(u64::MAX, |w| now.saturating_add(w));
        Ok(admit::Ticket { kv, tokens_charged, tenant, deadline, now })
    }

    fn permit_for(&self, this: &Arc<dyn Owner>, request: &Request, ticket: &admit::Ticket) -> Permit {
        self.grant(this, request, ticket.kv, ticket.tokens_charged, ticket.tenant.clone(), self.clock.now_nanos())
    }

    fn observe_output(&self, output_tokens: u32, max_new_tokens: u32) {
        self.reservation.observe(output_tokens, max_new_tokens);
    }

    fn real_time_until(&self, deadline: u64) -> Duration {
        self.clock.real_time_until(deadline.saturating_sub(self.clock.now_nanos()))
    }
}

impl<C: Clock> Drop for Shared<C> {
    fn drop(&mut self) {
        self.core.timer().shutdown();
    }
}
