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
//!    fit (`TooLarge`) — these consume nothing;
//! 2. waiters of the same or a higher priority: a new request never overtakes them (`NoCapacity`);
//! 3. the in-flight slot and the KV budget (`NoCapacity`);
//! 4. the request rate, then the token rate (`RateLimited`), only after capacity was found, so that a
//!    request refused for capacity does not spend rate tokens. A refusal at step 4 gives back what
//!    steps 3 and 4 took before returning.

mod admit;
mod builder;
mod core;
mod permit;
mod rejection;
mod request;
mod snapshot;
mod timer;
mod waiter;

pub use admit::Admit;
pub use builder::{AdmissionBuilder, DEFAULT_QUEUE_CAPACITY};
pub use permit::Permit;
pub use rejection::{Limit, Rejection};
pub use request::{Priority, Request};
pub use snapshot::{RejectionCounts, Snapshot};

use self::core::Core;
use crate::bucket::{AcquireError, TokenBucket};
use crate::clock::{Clock, MonotonicClock, nanos_to_duration};
use crate::error::ConfigError;
use crate::kv::{KvDtype, ModelSpec};
use crate::sync::Ordering;
use permit::Owner;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

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
    pub(crate) request_rate: Option<TokenBucket<C>>,
    pub(crate) token_rate: Option<TokenBucket<C>>,
    /// Default longest queue wait in clock nanoseconds.
    pub(crate) max_queue_wait: Option<u64>,
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
            self.shared.core.count_rejection(rejection);
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

    /// Requests waiting in one priority class.
    pub fn queued_in(&self, priority: Priority) -> usize {
        self.shared.core.queued_in(priority.index())
    }

    /// The KV units `request` would reserve (tokens, or bytes with a KV model).
    pub fn kv_cost(&self, request: &Request) -> u64 {
        self.shared.kv_cost.units(request.total_tokens())
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
    pub fn set_kv_capacity_tokens(&self, capacity: u64) -> Result<(), ConfigError> {
        if capacity == 0 {
            return Err(ConfigError::Zero { what: "KV capacity" });
        }
        self.shared.core.kv().set_limit(capacity);
        self.shared.core.dispatch_if_waiting();
        Ok(())
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
        let bucket = self.shared.request_rate.as_ref().ok_or_else(|| {
            ConfigError::Conflict("this admission was built without a request rate; set one in the builder".into())
        })?;
        bucket.set_rate(per_second, u64::from(burst))
    }

    /// Changes the token rate at run time, keeping the tokens currently available (capped at the new
    /// burst).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] for an invalid rate or zero burst, and [`ConfigError::Conflict`] if the admission
    /// was built without a token rate.
    pub fn set_token_rate(&self, per_second: f64, burst: u64) -> Result<(), ConfigError> {
        let bucket = self.shared.token_rate.as_ref().ok_or_else(|| {
            ConfigError::Conflict("this admission was built without a token rate; set one in the builder".into())
        })?;
        bucket.set_rate(per_second, burst)
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
        if core.has_waiters_at_or_above(request.priority_class().index()) || !core.try_reserve(kv) {
            return Err(Rejection::NoCapacity { retry_after: core.capacity_hint(core.queued()) });
        }
        let mut now = self.clock.now_nanos();
        let mut charged = self.charge_rates(total, now);
        if matches!(charged, Err(Rejection::RateLimited { .. })) {
            // A thread preempted between reading the clock and charging the bucket arrives with a stale
            // time and would be refused for tokens that have accrued since: look again, once.
            now = self.clock.now_nanos();
            charged = self.charge_rates(total, now);
        }
        match charged {
            Ok(tokens_charged) => Ok(self.grant(this, request, kv, tokens_charged, now)),
            Err(rejection) => {
                core.release(kv);
                Err(rejection)
            }
        }
    }

    /// Counts an admission and builds its permit.
    #[inline]
    fn grant(&self, this: &Arc<dyn Owner>, request: &Request, kv: u64, tokens_charged: u64, now: u64) -> Permit {
        let sequence = self.core.stats.admitted.fetch_add(1, Ordering::Relaxed);
        Permit::new(Arc::clone(this), request, kv, tokens_charged, now, sequence)
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
        let kv = self.kv_cost.units(total);
        let kv_capacity = self.core.kv().limit();
        if kv > kv_capacity {
            return Err(Rejection::TooLarge { limit: Limit::KvBudget, requested: kv, capacity: kv_capacity });
        }
        if let Some(bucket) = &self.token_rate {
            let burst = bucket.burst();
            if total > burst {
                return Err(Rejection::TooLarge { limit: Limit::TokenRate, requested: total, capacity: burst });
            }
        }
        Ok(kv)
    }

    /// Charges one request and `total` tokens to the rate limits, all or nothing. Returns the tokens
    /// charged to the token rate.
    #[inline]
    pub(crate) fn charge_rates(&self, total: u64, now: u64) -> Result<u64, Rejection> {
        if let Some(requests) = &self.request_rate {
            if let Err(err) = requests.try_acquire_at(1, now) {
                let mut wait = err.retry_after().unwrap_or(Duration::ZERO);
                if let Some(tokens) = &self.token_rate {
                    wait = wait.max(time_until_available(tokens, total, now));
                }
                return Err(Rejection::RateLimited { retry_after: wait.max(Duration::from_nanos(1)) });
            }
        }
        if let Some(tokens) = &self.token_rate {
            if let Err(err) = tokens.try_acquire_at(total, now) {
                if let Some(requests) = &self.request_rate {
                    requests.refund_at(1, now);
                }
                return Err(match err {
                    AcquireError::NotYet { retry_after } => Rejection::RateLimited { retry_after },
                    AcquireError::NeverFits { requested, burst } => {
                        Rejection::TooLarge { limit: Limit::TokenRate, requested, capacity: burst }
                    }
                });
            }
            return Ok(total);
        }
        Ok(0)
    }
}

/// Time until `bucket` holds `n` tokens, from its current level and rate (an estimate used only to
/// combine two rate hints).
fn time_until_available<C: Clock>(bucket: &TokenBucket<C>, n: u64, now: u64) -> Duration {
    let available = bucket.available_at(now);
    if available >= n {
        return Duration::ZERO;
    }
    let missing = (n - available) as f64;
    nanos_to_duration((missing / bucket.rate() * 1e9).ceil().min(u64::MAX as f64) as u64)
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

    fn refund_rates(&self, request: bool, tokens: u64) {
        let now = self.clock.now_nanos();
        if request {
            if let Some(bucket) = &self.request_rate {
                bucket.refund_at(1, now);
            }
        }
        if tokens != 0 {
            if let Some(bucket) = &self.token_rate {
                bucket.refund_at(tokens, now);
            }
        }
    }

    fn admit_now(&self, this: &Arc<dyn Owner>, request: &Request) -> Result<Permit, Rejection> {
        Shared::admit_now(self, this, request)
    }

    fn prepare_wait(&self, request: &Request) -> Result<admit::Ticket, Rejection> {
        let kv = self.validate(request)?;
        let now = self.clock.now_nanos();
        let tokens_charged = self.charge_rates(request.total_tokens(), now)?;
        let wait = match (request.max_wait_limit().map(crate::clock::duration_to_nanos), self.max_queue_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline = wait.map_or(u64::MAX, |w| now.saturating_add(w));
        Ok(admit::Ticket { kv, tokens_charged, deadline, now })
    }

    fn permit_for(&self, this: &Arc<dyn Owner>, request: &Request, kv: u64, tokens_charged: u64) -> Permit {
        self.grant(this, request, kv, tokens_charged, self.clock.now_nanos())
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
