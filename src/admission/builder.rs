//! Configuring an [`Admission`]: every limit optional, every mistake reported by `build()`.

use super::core::Core;
use super::cost::KvCost;
use super::decision::Shared;
use super::fairness::Fairness;
use super::handle::Admission;
use super::rates::Rates;
use super::reservation::{Reservation, ReservationState};
use super::tenant::{TenantConfig, TenantId, TenantLimits, TenantRegistry};
use super::wait_policy::WaitPolicy;
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use crate::kv::{GpuPlan, KvDtype, ModelSpec};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Default waiting-room size per priority class.
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;

/// Largest accepted `queue_capacity` (per class).
const MAX_QUEUE_CAPACITY: usize = 1 << 20;

/// Default hold time assumed before any permit has been observed (see
/// [`AdmissionBuilder::expected_hold_time`]).
pub const DEFAULT_EXPECTED_HOLD_TIME: Duration = Duration::from_secs(5);

/// Builds an [`Admission`]. Every limit is optional; an unset limit does not limit.
///
/// # Examples
///
/// ```
/// use kvgate::Admission;
/// use std::time::Duration;
///
/// let admission = Admission::builder()
///     .max_in_flight(64)                 // concurrent sequences the engine batches well
///     .kv_capacity_tokens(400_000)       // KV-cache budget in tokens
///     .request_rate(50.0, 100)           // 50 requests/s, bursts of 100
///     .token_rate(20_000.0, 200_000)     // 20k LLM tokens/s
///     .queue_capacity(1000)              // waiting room per priority class
///     .max_queue_wait(Duration::from_secs(30))
///     .build()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until build() is called"]
pub struct AdmissionBuilder<C: Clock = MonotonicClock> {
    max_in_flight: Option<usize>,
    queue_capacity: usize,
    kv_capacity: Option<u64>,
    kv_capacity_bytes: Option<u64>,
    kv_cost: Result<KvCost, ConfigError>,
    reservation: Reservation,
    request_rate: Option<(f64, u32)>,
    token_rate: Option<(f64, u64)>,
    max_queue_wait: Option<Duration>,
    deadline_timer: bool,
    expected_hold: Duration,
    max_prefixes: Option<usize>,
    fairness: Fairness,
    wait_policy: WaitPolicy,
    tenants: Option<TenantConfig>,
    clock: C,
}

impl Default for AdmissionBuilder<MonotonicClock> {
    fn default() -> Self {
        Self {
            max_in_flight: None,
            queue_capacity: DEFAULT_QUEUE_CAPACITY,
            kv_capacity: None,
            kv_capacity_bytes: None,
            kv_cost: Ok(KvCost::Tokens),
            reservation: Reservation::Full,
            request_rate: None,
            token_rate: None,
            max_queue_wait: None,
            deadline_timer: true,
            expected_hold: DEFAULT_EXPECTED_HOLD_TIME,
            max_prefixes: None,
            fairness: Fairness::Requests,
            wait_policy: WaitPolicy::controlled_delay(),
            tenants: None,
            clock: MonotonicClock::new(),
        }
    }
}

impl<C: Clock> AdmissionBuilder<C> {
    /// Maximum concurrent sequences (permits alive at once). Must be at least 1.
    pub fn max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = Some(max_in_flight);
        self
    }

    /// Waiting room per priority class for [`Admission::admit`] and [`Admission::admit_blocking`]:
    /// at most this many requests of one class wait at once. `0` means never wait. Default
    /// [`DEFAULT_QUEUE_CAPACITY`]. At most 2^20.
    ///
    /// When a class is full, a new request is refused at once with
    /// [`Rejection::QueueFull`](crate::Rejection::QueueFull) unless its flow (its tenant, or the requests
    /// without a tenant) has at least two fewer waiters than the class's longest flow: then the newest
    /// waiter of that longest flow resolves `QueueFull` and gives its place (*longest queue drop*; of
    /// equally long flows, the requests without a tenant give first, then tenants by id). One tenant can
    /// thus never hold every place of the waiting room.
    pub fn queue_capacity(mut self, queue_capacity: usize) -> Self {
        self.queue_capacity = queue_capacity;
        self
    }

    /// KV-cache budget counted in tokens: a request reserves `prompt_tokens + max_new_tokens` of it.
    /// Must be at least 1.
    pub fn kv_capacity_tokens(mut self, tokens: u64) -> Self {
        self.kv_capacity = Some(tokens);
        self
    }

    /// Request rate: `per_second` requests per second on average, up to `burst` at once. `per_second`
    /// must be finite and in `0.001..=1e9`; `burst` at least 1.
    pub fn request_rate(mut self, per_second: f64, burst: u32) -> Self {
        self.request_rate = Some((per_second, burst));
        self
    }

    /// LLM-token rate: `per_second` tokens per second, up to `burst` at once. A request costs
    /// `prompt_tokens + max_new_tokens`; [`Permit::complete`](crate::Permit::complete) refunds what it
    /// did not generate. A request costing more than `burst` is
    /// [`TooLarge`](crate::Rejection::TooLarge).
    pub fn token_rate(mut self, per_second: f64, burst: u64) -> Self {
        self.token_rate = Some((per_second, burst));
        self
    }

    /// Longest time any request waits in the queue before it is rejected with
    /// [`Rejection::TimedOut`](crate::Rejection::TimedOut). A request may ask for a shorter wait with
    /// [`Request::max_wait`](crate::Request::max_wait). Default: no limit (a waiter waits until it is
    /// admitted, its future is dropped, or the admission is closed).
    pub fn max_queue_wait(mut self, max_wait: Duration) -> Self {
        self.max_queue_wait = Some(max_wait);
        self
    }

    /// Whether a background thread (`kvgate-timer`, one per admission, alive only while deadlines are
    /// pending) ends expired waits on its own. Default `true`. With `false`, an expired wait ends when its
    /// future is polled or its blocking caller wakes, and on
    /// [`Admission::expire_waiters`](crate::Admission::expire_waiters) — for simulations that drive time
    /// themselves and want every state change on their own thread.
    pub fn deadline_timer(mut self, enabled: bool) -> Self {
        self.deadline_timer = enabled;
        self
    }

    /// How long a permit is assumed to be held before any has been observed (default
    /// [`DEFAULT_EXPECTED_HOLD_TIME`], 5 s: a typical chat answer). Capacity retry hints
    /// ([`Rejection::NoCapacity`](crate::Rejection::NoCapacity), `QueueFull`, a tenant's cap) are derived
    /// from hold times; until the first permits are dropped this prior stands in, then every hold is used
    /// until the estimate has enough samples, then one in eight. Set it near your typical generation time
    /// so that the first burst is not told to come back too early.
    pub fn expected_hold_time(mut self, hold: Duration) -> Self {
        self.expected_hold = hold;
        self
    }

    /// Charges a shared prompt prefix once: a request that names its prefix
    /// ([`Request::prefix`](crate::Request::prefix)) reserves only what it adds beyond the prefix while
    /// another permit holds the same prefix, as an engine with prefix caching (vLLM, SGLang) stores it once.
    /// The prefix's reservation is returned with the last permit holding it. At most `max_prefixes`
    /// prefixes are tracked at once (a request whose prefix finds the table full is charged what it costs
    /// without one), so invented ids cannot grow memory; which requests share a prefix is said at
    /// [`Request::prefix`](crate::Request::prefix). A tenant's KV share counts what its requests hold beyond shared
    /// prefixes. Off by default; a request naming a prefix then takes the waiting room's lock (the table
    /// lives there).
    pub fn prefix_sharing(mut self, max_prefixes: usize) -> Self {
        self.max_prefixes = Some(max_prefixes);
        self
    }

    /// How waiting requests of different tenants share the server within a priority class (default
    /// [`Fairness::Requests`], weighted round-robin by requests). See [`Fairness`].
    pub fn fairness(mut self, fairness: Fairness) -> Self {
        self.fairness = fairness;
        self
    }

    /// How the waiting room orders and bounds waits (default [`WaitPolicy::controlled_delay`]: FIFO while
    /// the queue drains; newest first and at most 500 ms of waiting once it has not been empty for a
    /// second). [`WaitPolicy::Fifo`] keeps first-in first-out with the full wait under any load. See
    /// [`WaitPolicy`].
    pub fn wait_policy(mut self, policy: WaitPolicy) -> Self {
        self.wait_policy = policy;
        self
    }

    fn tenant_config(&mut self) -> &mut TenantConfig {
        self.tenants.get_or_insert_with(TenantConfig::new)
    }

    /// Limits every tenant gets unless overridden with
    /// [`tenant_limits`](AdmissionBuilder::tenant_limits). Setting any tenant option turns tenants on:
    /// requests naming a tenant ([`Request::tenant`](crate::Request::tenant)) then meet their tenant's
    /// limits too, and waiting requests are served fairly across tenants. See [`TenantLimits`].
    pub fn tenant_defaults(mut self, limits: TenantLimits) -> Self {
        self.tenant_config().defaults = limits;
        self
    }

    /// Limits for one named tenant, instead of the defaults (for example less for a batch-jobs key,
    /// more and a higher weight for the on-call team). The tenant's `Display` (its name for a `&str`)
    /// labels it in metrics ([`Admission::tenant_name`]).
    pub fn tenant_limits<T: Into<TenantId> + fmt::Display>(mut self, tenant: T, limits: TenantLimits) -> Self {
        let name: Arc<str> = Arc::from(tenant.to_string());
        self.tenant_config().overrides.insert(tenant.into(), (name, limits));
        self
    }

    /// Most tenants tracked at once besides the configured ones (default
    /// [`DEFAULT_MAX_TENANTS`](crate::DEFAULT_MAX_TENANTS)); beyond it, new tenants share one overflow
    /// tenant with the default limits until idle tenants are evicted. Configured tenants
    /// ([`tenant_limits`](Self::tenant_limits)) are always tracked and never evicted.
    pub fn max_tenants(mut self, max_tenants: usize) -> Self {
        self.tenant_config().max_tenants = max_tenants;
        self
    }

    /// How long a tenant must be idle (nothing in flight, no request) before its state may be evicted to
    /// make room (default [`DEFAULT_TENANT_IDLE_TIMEOUT`](crate::DEFAULT_TENANT_IDLE_TIMEOUT)). Keep it at least as long as the tenant's
    /// buckets take to refill.
    pub fn tenant_idle_timeout(mut self, idle: Duration) -> Self {
        self.tenant_config().idle_timeout = idle;
        self
    }

    /// Uses `clock` for every time-dependent limit (rates, deadlines, hold times).
    pub fn clock<C2: Clock>(self, clock: C2) -> AdmissionBuilder<C2> {
        AdmissionBuilder {
            max_in_flight: self.max_in_flight,
            queue_capacity: self.queue_capacity,
            kv_capacity: self.kv_capacity,
            kv_capacity_bytes: self.kv_capacity_bytes,
            kv_cost: self.kv_cost,
            reservation: self.reservation,
            request_rate: self.request_rate,
            token_rate: self.token_rate,
            max_queue_wait: self.max_queue_wait,
            deadline_timer: self.deadline_timer,
            expected_hold: self.expected_hold,
            max_prefixes: self.max_prefixes,
            fairness: self.fairness,
            wait_policy: self.wait_policy,
            tenants: self.tenants,
            clock,
        }
    }

    /// Prices every request in KV-cache bytes instead of tokens: a request reserves the most bytes a
    /// sequence of `prompt_tokens + max_new_tokens` tokens holds in vLLM's KV cache while it grows
    /// ([`KvLayout::max_sequence_bytes`](crate::kv::KvLayout::max_sequence_bytes) under
    /// [`Engine::Vllm`](crate::kv::Engine::Vllm): layer groups, padding, sliding windows, recurrent state —
    /// exactly what the engine allocates). Needs a byte budget:
    /// [`kv_capacity_bytes`](AdmissionBuilder::kv_capacity_bytes), or use
    /// [`gpu_plan`](AdmissionBuilder::gpu_plan) / [`kv_layout`](AdmissionBuilder::kv_layout) for another
    /// engine.
    ///
    /// This is what lets a sliding-window model (Gemma 2/3, gpt-oss) admit several times more
    /// concurrent long conversations than counting every token in every layer would.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{Engine, KvDtype, ModelSpec};
    /// use kvgate::{Admission, Request};
    ///
    /// let gemma = ModelSpec::preset("gemma-3-27b")?;
    /// let admission = Admission::builder()
    ///     .kv_model(gemma.clone(), KvDtype::Bf16, 16)
    ///     .kv_capacity_bytes(20_000_000_000) // 20 GB of KV pool
    ///     .build()?;
    /// let permit = admission.try_admit(&Request::new(30_000, 2_768)).unwrap();
    /// assert_eq!(permit.kv_reserved(), gemma.max_sequence_bytes(32_768, KvDtype::Bf16, 16, Engine::Vllm));
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn kv_model(self, spec: ModelSpec, dtype: KvDtype, block_size: u32) -> Self {
        match spec.kv_layout(dtype, block_size.max(1), crate::kv::Engine::Vllm) {
            Ok(layout) => self.kv_layout(layout),
            Err(error) => Self { kv_cost: Err(error), ..self },
        }
    }

    /// Prices every request in bytes under an explicit engine layout (vLLM with or without its hybrid
    /// manager, llama.cpp slots): see [`ModelSpec::kv_layout`]. Needs a byte budget, as
    /// [`kv_model`](AdmissionBuilder::kv_model) does.
    pub fn kv_layout(mut self, layout: crate::kv::KvLayout) -> Self {
        self.kv_cost = Ok(KvCost::Bytes { layout: Arc::new(layout), gpus: 1 });
        self
    }

    /// How much of `max_new_tokens` a request reserves in the KV budget (default
    /// [`Reservation::Full`]). See [`Reservation`] for the trade-off.
    pub fn reservation(mut self, reservation: Reservation) -> Self {
        self.reservation = reservation;
        self
    }

    /// KV-cache budget in bytes, for an admission with a [`kv_model`](AdmissionBuilder::kv_model).
    pub fn kv_capacity_bytes(mut self, bytes: u64) -> Self {
        self.kv_capacity_bytes = Some(bytes);
        self
    }

    /// Takes the KV pricing and the byte budget from a GPU capacity plan: each request is priced by the
    /// plan's engine layout ([`GpuPlan::max_sequence_bytes`]), and the budget is what that engine can
    /// hand out ([`GpuPlan::kv_budget_bytes`]: usable blocks × block bytes, across the tensor-parallel
    /// group), so the admission admits exactly the sequences the engine can hold.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{GpuPlan, ModelSpec};
    /// use kvgate::{Admission, Request};
    ///
    /// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("h100-80").build()?;
    /// let admission = Admission::builder().gpu_plan(&plan).max_in_flight(256).build()?;
    /// assert_eq!(admission.snapshot().kv_capacity, plan.kv_budget_bytes());
    /// assert_eq!(admission.kv_cost(&Request::new(30_000, 2_768)), plan.max_sequence_bytes(32_768));
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn gpu_plan(mut self, plan: &GpuPlan) -> Self {
        self.kv_cost =
            Ok(KvCost::Bytes { layout: Arc::new(plan.layout().clone()), gpus: u64::from(plan.tensor_parallel()) });
        self.kv_capacity_bytes(plan.kv_budget_bytes())
    }

    /// Checks the configuration and builds the admission.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when a setting could never admit anything or is not a valid number:
    /// `max_in_flight(0)`, `kv_capacity_tokens(0)`, a rate that is zero, negative, NaN, infinite or out of
    /// range, a zero burst, a queue capacity above 2^20, a KV budget set twice or in the wrong unit, or a
    /// tenant [`kv_share`](crate::TenantLimits::kv_share) without a KV budget.
    pub fn build(self) -> Result<Admission<C>, ConfigError> {
        let max_in_flight = match self.max_in_flight {
            Some(0) => return Err(ConfigError::Zero { what: "max_in_flight" }),
            Some(n) => n as u64,
            None => u64::MAX,
        };
        let kv_cost = self.kv_cost?;
        let kv_capacity = match (&kv_cost, self.kv_capacity, self.kv_capacity_bytes) {
            (KvCost::Tokens, Some(_), Some(_)) | (KvCost::Bytes { .. }, Some(_), _) => {
                return Err(ConfigError::Conflict(
                    "the KV budget is set both in tokens and in bytes; with a KV model use kv_capacity_bytes \
                     (or gpu_plan), without one kv_capacity_tokens"
                        .into(),
                ));
            }
            (KvCost::Tokens, None, Some(_)) => {
                return Err(ConfigError::Conflict(
                    "kv_capacity_bytes needs a KV model to price requests in bytes; add kv_model(...) or gpu_plan(...)"
                        .into(),
                ));
            }
            (KvCost::Bytes { .. }, None, None) => {
                return Err(ConfigError::Conflict(
                    "kv_model prices requests in bytes but no byte budget is set; add kv_capacity_bytes(...) or \
                     gpu_plan(...)"
                        .into(),
                ));
            }
            (_, Some(0), _) | (_, _, Some(0)) => return Err(ConfigError::Zero { what: "KV capacity" }),
            (_, Some(n), None) | (_, None, Some(n)) => n,
            (KvCost::Tokens, None, None) => u64::MAX,
        };
        if self.queue_capacity > MAX_QUEUE_CAPACITY {
            return Err(ConfigError::OutOfRange {
                what: "queue_capacity",
                reason: format!(
                    "{} waiters per class requested; at most {MAX_QUEUE_CAPACITY} are supported",
                    self.queue_capacity
                ),
            });
        }
        if matches!(self.request_rate, Some((_, 0))) {
            return Err(ConfigError::Zero { what: "request rate burst" });
        }
        if matches!(self.token_rate, Some((_, 0))) {
            return Err(ConfigError::Zero { what: "token rate burst" });
        }
        let rates = Rates::new(
            self.request_rate.map(|(rate, burst)| (rate, u64::from(burst))),
            self.token_rate,
            ("request rate", "token rate"),
            &self.clock,
        )?;
        self.reservation.validate()?;
        if self.expected_hold.is_zero() {
            return Err(ConfigError::Zero { what: "expected_hold_time" });
        }
        self.fairness.validate()?;
        self.wait_policy.validate()?;
        if self.max_prefixes == Some(0) {
            return Err(ConfigError::Zero { what: "prefix_sharing's max_prefixes" });
        }
        if let Some(config) = &self.tenants {
            config.validate()?;
        }
        if let Some(who) =
            self.tenants.as_ref().and_then(TenantConfig::kv_share_holder).filter(|_| kv_capacity == u64::MAX)
        {
            return Err(ConfigError::Conflict(format!(
                "{who} has a kv_share but the admission has no KV budget to share; add kv_capacity_tokens(...), \
                 kv_capacity_bytes(...) or gpu_plan(...), or drop the share"
            )));
        }
        let tenants = match self.tenants {
            Some(config) => Some(TenantRegistry::new(config, self.expected_hold, self.clock.clone())?),
            None => None,
        };
        Ok(Admission {
            shared: Arc::new(Shared {
                core: Core::new(
                    max_in_flight,
                    kv_capacity,
                    self.queue_capacity,
                    self.expected_hold,
                    self.deadline_timer,
                    self.max_prefixes.unwrap_or(0),
                    matches!(self.fairness, Fairness::Tokens { .. }),
                    self.wait_policy.delay(),
                    {
                        let clock = self.clock.clone();
                        super::dispatcher::ClockFn(Box::new(move || clock.now_nanos()))
                    },
                ),
                clock: self.clock,
                kv_cost,
                reservation: ReservationState::new(self.reservation),
                rates,
                max_queue_wait: self.max_queue_wait.map(crate::clock::duration_to_nanos),
                prefix_sharing: self.max_prefixes.is_some(),
                fairness: self.fairness,
                tenants,
            }),
        })
    }
}
