//! The built-in gates as data: what a scenario compares and a sweep varies.
//!
//! None at all (the engine queues everything), a count limit (an [`Admission`] that counts requests, as
//! a proxy or the engine's own `max_num_seqs` does), and kvgate pricing each request in the KV bytes the
//! engine will allocate — refusing at once (`try_admit`), waiting in a bounded queue with a deadline
//! (`admit`), with per-tenant limits and fair queueing, with an adaptive in-flight limit
//! ([`AdaptiveConcurrency`]), and with engine feedback on the KV budget ([`EngineFeedback`]).

use super::gate::{AdmissionGate, Gate, GateContext, NoGate};
use super::policy_gate::{FeedbackSetup, PolicyGate};
use crate::adaptive::{AdaptiveConcurrency, AdaptiveConfig};
use crate::error::ConfigError;
use crate::feedback::EngineFeedback;
use crate::{Admission, Fairness, Reservation, TenantLimits, WaitPolicy};
use std::time::Duration;

/// What an [`Admission`] gate counts against its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pricing {
    /// Requests only: `max_in_flight` slots, no KV budget.
    Count,
    /// The KV bytes the engine allocates (`prompt + max_tokens`, paged, from the model), against the
    /// engine's pool, besides `max_in_flight`.
    KvBytes,
}

/// The settings of an [`AdmissionGate`]: what a gateway operator would configure.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionSpec {
    /// Name in tables and plots.
    pub label: String,
    /// Requests or KV bytes.
    pub pricing: Pricing,
    /// Whether a try waits (`admit`) rather than being refused at once (`try_admit`).
    pub wait: bool,
    /// Requests in flight at once; `None`: the engine's `max_num_seqs`.
    pub max_in_flight: Option<usize>,
    /// Waiting room per priority class (with `wait`).
    pub queue_capacity: usize,
    /// Longest wait in the queue.
    pub max_wait: Option<Duration>,
    /// Global request rate (per second, burst).
    pub request_rate: Option<(f64, u32)>,
    /// Limits of each tenant (every employee and the heavy user are tenants); `None`: tenants off.
    pub tenants: Option<TenantLimits>,
    /// How much of `max_tokens` a KV reservation covers.
    pub reservation: Reservation,
    /// The KV budget as a multiple of the engine's pool (with [`Pricing::KvBytes`]): 1.0 is the pool; a
    /// larger one overcommits it (a wrong guess of the pool, or a bet on short answers).
    pub kv_budget_factor: f64,
    /// An [`AdaptiveConcurrency`] controller moving `max_in_flight` from the configuration's initial
    /// limit (`max_in_flight` above is then ignored); `None`: the limit is static.
    pub adaptive: Option<AdaptiveConfig>,
    /// [`EngineFeedback`] correcting the KV budget from the engine's metrics (with [`Pricing::KvBytes`]);
    /// `None`: the budget is static.
    pub feedback: Option<FeedbackSetup>,
    /// How waiting tenants share the server ([`Fairness::Requests`] by default; [`Fairness::Tokens`]
    /// charges them the tokens they are served). Matters with `wait` and `tenants`.
    pub fairness: Fairness,
    /// Limits of named tenants instead of `tenants` (a weight, say), by the lab's tenant number:
    /// employees are `0..count`, scripted users [`Workload::script_tenant`](super::Workload::script_tenant).
    /// Turns tenants on (with default limits for the others) if `tenants` is `None`.
    pub tenant_limits: Vec<(u64, TenantLimits)>,
    /// Deadline-aware shedding: the gate passes each request's TTFT deadline
    /// ([`Workload::ttft_deadline`](super::Workload::ttft_deadline)) on to the admission as its start
    /// deadline ([`Request::ttft_deadline`](crate::Request::ttft_deadline)), less this allowance for the
    /// engine's own time to the first token (its prefill); a request predicted to miss it is refused at
    /// once, a waiter leaves once it can no longer make it. `None`: the gate ignores deadlines.
    pub deadline_shedding: Option<Duration>,
    /// How the waiting room orders and bounds waits (with `wait`): the admission's default, controlled
    /// delay, or [`WaitPolicy::Fifo`].
    pub wait_policy: WaitPolicy,
}

impl AdmissionSpec {
    /// `pricing` and `max_in_flight`, refused at once (`queue` `None`) or waiting in a queue of the given
    /// size for at most the given time; every other limit off, full reservations, the engine's pool as the
    /// budget, no adaptive policy.
    fn basic(
        label: impl Into<String>,
        pricing: Pricing,
        max_in_flight: Option<usize>,
        queue: Option<(usize, Duration)>,
    ) -> Self {
        Self {
            label: label.into(),
            pricing,
            wait: queue.is_some(),
            max_in_flight,
            queue_capacity: queue.map_or(0, |(capacity, _)| capacity),
            max_wait: queue.map(|(_, wait)| wait),
            request_rate: None,
            tenants: None,
            reservation: Reservation::Full,
            kv_budget_factor: 1.0,
            adaptive: None,
            feedback: None,
            fairness: Fairness::Requests,
            tenant_limits: Vec::new(),
            deadline_shedding: None,
            // A static setting's queue is first-in first-out, as a proxy's is; `kv_admit` and what builds on
            // it take the admission's default.
            wait_policy: WaitPolicy::Fifo,
        }
    }

    /// The flags of the gateway example (`examples/gateway`) that configure the same limits, for a
    /// model and GPU preset given by name.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::sim::GateSpec;
    /// use std::time::Duration;
    ///
    /// let GateSpec::Admission(spec) = GateSpec::kv_admit(Some(48), 256, Duration::from_millis(1500)) else {
    ///     unreachable!()
    /// };
    /// assert_eq!(
    ///     spec.gateway_flags("llama-3.1-8b", "l4"),
    ///     "--model llama-3.1-8b --gpu l4 --max-in-flight 48 --queue 256 --max-queue-wait 1500ms"
    /// );
    /// ```
    pub fn gateway_flags(&self, model: &str, gpu: &str) -> String {
        let mut flags = String::new();
        if self.pricing == Pricing::KvBytes {
            flags.push_str(&format!("--model {model} --gpu {gpu} "));
        }
        if let Some(n) = self.max_in_flight.filter(|_| self.adaptive.is_none()) {
            flags.push_str(&format!("--max-in-flight {n} "));
        }
        flags.push_str(&format!("--queue {}", if self.wait { self.queue_capacity } else { 0 }));
        if let (true, Some(wait)) = (self.wait, self.max_wait) {
            flags.push_str(&format!(" --max-queue-wait {}ms", wait.as_millis()));
        }
        if let Some((rate, burst)) = self.request_rate {
            flags.push_str(&format!(" --rate {rate} --rate-burst {burst}"));
        }
        flags
    }
}

/// A built-in gate, as data: what a scenario compares.
///
/// # Examples
///
/// ```
/// use kvgate::sim::GateSpec;
/// use std::time::Duration;
///
/// let gates = [
///     GateSpec::None,
///     GateSpec::count_limit(64, 256, Duration::from_secs(2)),
///     GateSpec::kv_try_admit(),
///     GateSpec::kv_admit(None, 256, Duration::from_secs(2)),
/// ];
/// assert_eq!(gates[3].label(), "kvgate admit");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum GateSpec {
    /// [`NoGate`].
    None,
    /// An [`AdmissionGate`].
    Admission(Box<AdmissionSpec>),
}

impl GateSpec {
    /// A count limit: `max_in_flight` requests, a queue of `queue` waiting at most `max_wait`, no KV
    /// model — a request-counting proxy in front of the engine.
    pub fn count_limit(max_in_flight: usize, queue: usize, max_wait: Duration) -> Self {
        GateSpec::Admission(Box::new(AdmissionSpec::basic(
            "count limit",
            Pricing::Count,
            Some(max_in_flight),
            Some((queue, max_wait)),
        )))
    }

    /// kvgate `try_admit` pricing KV bytes against the engine's pool: refused at once when full.
    pub fn kv_try_admit() -> Self {
        GateSpec::Admission(Box::new(AdmissionSpec::basic("kvgate try_admit", Pricing::KvBytes, None, None)))
    }

    /// kvgate `admit` pricing KV bytes, with a queue of `queue` waiting at most `max_wait`, under the
    /// admission's default [`WaitPolicy`] (controlled delay).
    pub fn kv_admit(max_in_flight: Option<usize>, queue: usize, max_wait: Duration) -> Self {
        GateSpec::Admission(Box::new(AdmissionSpec {
            wait_policy: WaitPolicy::default(),
            ..AdmissionSpec::basic("kvgate admit", Pricing::KvBytes, max_in_flight, Some((queue, max_wait)))
        }))
    }

    /// This gate with its waiting room under `policy`, labelled `label` (no change for
    /// [`GateSpec::None`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::WaitPolicy;
    /// use kvgate::sim::GateSpec;
    /// use std::time::Duration;
    ///
    /// let fifo = GateSpec::kv_admit(None, 64, Duration::from_secs(1)).with_wait_policy(WaitPolicy::Fifo, "kvgate admit, FIFO");
    /// assert_eq!(fifo.label(), "kvgate admit, FIFO");
    /// ```
    #[must_use]
    pub fn with_wait_policy(self, policy: WaitPolicy, label: impl Into<String>) -> Self {
        match self {
            GateSpec::None => GateSpec::None,
            GateSpec::Admission(spec) => {
                GateSpec::Admission(Box::new(AdmissionSpec { wait_policy: policy, label: label.into(), ..*spec }))
            }
        }
    }

    /// [`kv_admit`](Self::kv_admit) with every employee (and the heavy user) a tenant under `limits`.
    pub fn kv_tenants(queue: usize, max_wait: Duration, limits: TenantLimits) -> Self {
        GateSpec::Admission(Box::new(AdmissionSpec {
            label: "kvgate + tenants".into(),
            tenants: Some(limits),
            ..match Self::kv_admit(None, queue, max_wait) {
                GateSpec::Admission(spec) => *spec,
                GateSpec::None => unreachable!("kv_admit builds an admission spec"),
            }
        }))
    }

    /// [`kv_tenants`](Self::kv_tenants) with default tenant limits and waiting tenants served by
    /// `fairness`: by requests (weighted round-robin) or by the tokens they are served.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::Fairness;
    /// use kvgate::sim::GateSpec;
    /// use std::time::Duration;
    ///
    /// let gate = GateSpec::kv_fairness(Fairness::tokens(), 1024, Duration::from_secs(60));
    /// assert_eq!(gate.label(), "KV + token fairness");
    /// ```
    ///
    /// Its waiting room is FIFO: backlogged tenants wait as long as it takes, so that what each is served
    /// shows the fairness policy alone (controlled delay keeps the order between tenants the same).
    pub fn kv_fairness(fairness: Fairness, queue: usize, max_wait: Duration) -> Self {
        let GateSpec::Admission(spec) = Self::kv_tenants(queue, max_wait, TenantLimits::new()) else {
            unreachable!("kv_tenants builds an admission spec")
        };
        let label = match fairness {
            Fairness::Requests => "KV + request fairness",
            Fairness::Tokens { .. } => "KV + token fairness",
        };
        GateSpec::Admission(Box::new(AdmissionSpec {
            label: label.into(),
            fairness,
            wait_policy: WaitPolicy::Fifo,
            ..*spec
        }))
    }

    /// [`kv_admit`](Self::kv_admit) with deadline-aware shedding: each request's TTFT deadline, less
    /// `allowance` for the engine's prefill, is its start deadline in the admission (see
    /// [`AdmissionSpec::deadline_shedding`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::sim::GateSpec;
    /// use std::time::Duration;
    ///
    /// let gate = GateSpec::kv_deadlines(256, Duration::from_secs(2), Duration::from_millis(250));
    /// assert_eq!(gate.label(), "kvgate admit + deadline shedding");
    /// ```
    pub fn kv_deadlines(queue: usize, max_wait: Duration, allowance: Duration) -> Self {
        let GateSpec::Admission(spec) = Self::kv_admit(None, queue, max_wait) else {
            unreachable!("kv_admit builds an admission spec")
        };
        GateSpec::Admission(Box::new(AdmissionSpec {
            label: "kvgate admit + deadline shedding".into(),
            deadline_shedding: Some(allowance),
            ..*spec
        }))
    }

    /// A static setting, as a sweep tries them: `pricing`, at most `max_in_flight` requests (`None`: the
    /// engine's `max_num_seqs`), refused at once (`try_admit`) when `queue` is 0, else waiting in a queue
    /// of `queue` for at most `max_wait` (`admit`). Labelled with its numbers, e.g. `count 256, queue 16`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::sim::{GateSpec, Pricing};
    /// use std::time::Duration;
    ///
    /// let gate = GateSpec::fixed(Pricing::Count, Some(256), 0, Duration::ZERO);
    /// assert_eq!(gate.label(), "count 256, try_admit");
    /// ```
    pub fn fixed(pricing: Pricing, max_in_flight: Option<usize>, queue: usize, max_wait: Duration) -> Self {
        let limit = max_in_flight.map_or_else(|| "max_num_seqs".to_owned(), |n| n.to_string());
        let kind = match pricing {
            Pricing::Count => "count",
            Pricing::KvBytes => "KV",
        };
        let waiting = if queue == 0 { "try_admit".to_owned() } else { format!("queue {queue}") };
        let label = format!("{kind} {limit}, {waiting}");
        let queue = (queue > 0).then_some((queue, max_wait));
        GateSpec::Admission(Box::new(AdmissionSpec::basic(label, pricing, max_in_flight, queue)))
    }

    /// The static settings a comparison sweeps for `pricing`: `max_in_flight` of 32, 64, 128, 192, 256,
    /// 320, 384, 512 and the engine's `max_num_seqs`, each refused at once (`try_admit`) or waiting in a
    /// queue of 16 or 64 for at most 1 s — 27 settings.
    pub fn sweep(pricing: Pricing) -> Vec<GateSpec> {
        let limits = [Some(32), Some(64), Some(128), Some(192), Some(256), Some(320), Some(384), Some(512), None];
        let wait = Duration::from_secs(1);
        limits.into_iter().flat_map(|limit| [0, 16, 64].map(|queue| Self::fixed(pricing, limit, queue, wait))).collect()
    }

    /// `pricing`, refused at once (`try_admit`), with `max_in_flight` moved by an
    /// [`AdaptiveConcurrency`] controller configured by `config`.
    pub fn adaptive(pricing: Pricing, config: AdaptiveConfig) -> Self {
        let GateSpec::Admission(mut spec) = Self::fixed(pricing, None, 0, Duration::ZERO) else {
            unreachable!("fixed builds an admission spec")
        };
        spec.label = match pricing {
            Pricing::Count => "adaptive (count)".into(),
            Pricing::KvBytes => "adaptive (KV)".into(),
        };
        spec.adaptive = Some(config);
        GateSpec::Admission(spec)
    }

    /// KV pricing, refused at once (`try_admit`), with the KV budget corrected by [`EngineFeedback`]
    /// from the engine's metrics.
    pub fn kv_feedback(setup: FeedbackSetup) -> Self {
        let GateSpec::Admission(mut spec) = Self::fixed(Pricing::KvBytes, None, 0, Duration::ZERO) else {
            unreachable!("fixed builds an admission spec")
        };
        spec.label = "KV + engine feedback".into();
        spec.feedback = Some(setup);
        GateSpec::Admission(spec)
    }

    /// The name in tables and plots.
    pub fn label(&self) -> &str {
        match self {
            GateSpec::None => "no gate",
            GateSpec::Admission(spec) => &spec.label,
        }
    }

    /// Builds the gate for the lab.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] of the admission builder (a zero limit, a bad rate, a bad tenant limit).
    pub fn build(&self, context: &GateContext<'_>) -> Result<Box<dyn Gate>, ConfigError> {
        let spec = match self {
            GateSpec::None => return Ok(Box::new(NoGate)),
            GateSpec::Admission(spec) => spec,
        };
        let engine = context.engine;
        let max_in_flight = spec.max_in_flight.unwrap_or(engine.config().max_num_seqs as usize);
        let mut builder = Admission::builder()
            .clock(context.clock.clone())
            .deadline_timer(false)
            .max_in_flight(max_in_flight)
            .queue_capacity(if spec.wait { spec.queue_capacity } else { 0 });
        if spec.pricing == Pricing::KvBytes {
            let plan = engine.plan();
            // The engine's pool counted over the whole tensor-parallel group, in the model's full bytes.
            let pool = engine.pool_bytes().saturating_mul(u64::from(plan.tensor_parallel()));
            if !(spec.kv_budget_factor > 0.0 && spec.kv_budget_factor <= 1000.0) {
                return Err(ConfigError::OutOfRange {
                    what: "KV budget factor",
                    reason: format!("{}; use a multiple of the engine's pool in (0, 1000]", spec.kv_budget_factor),
                });
            }
            let budget = ((pool as f64 * spec.kv_budget_factor) as u64).max(1);
            builder =
                builder.kv_model(plan.model().clone(), plan.kv_dtype(), plan.block_size()).kv_capacity_bytes(budget);
        }
        if let (true, Some(wait)) = (spec.wait, spec.max_wait) {
            builder = builder.max_queue_wait(wait);
        }
        if let Some((rate, burst)) = spec.request_rate {
            builder = builder.request_rate(rate, burst);
        }
        builder = builder.reservation(spec.reservation).fairness(spec.fairness).wait_policy(spec.wait_policy);
        if let Some(limits) = &spec.tenants {
            builder = builder.tenant_defaults(limits.clone());
        }
        for (tenant, limits) in &spec.tenant_limits {
            builder = builder.tenant_limits(*tenant, limits.clone());
        }
        let max_wait = if spec.wait { spec.max_wait } else { None };
        let admission = builder.build()?;
        let adaptive = match &spec.adaptive {
            Some(config) => Some(AdaptiveConcurrency::new(admission.clone(), config.clone())?),
            None => None,
        };
        let feedback = match &spec.feedback {
            Some(setup) => Some((EngineFeedback::new(admission.clone(), setup.config.clone())?, setup.every)),
            None => None,
        };
        let gate = AdmissionGate::new(spec.label.clone(), admission, spec.wait, max_wait)
            .with_deadline_shedding(spec.deadline_shedding);
        if adaptive.is_none() && feedback.is_none() {
            return Ok(Box::new(gate));
        }
        Ok(Box::new(PolicyGate::new(gate, adaptive, feedback)))
    }
}
