//! Gates: what stands between the clients and the engine. A gate is a strategy over the real
//! [`Admission`]; the lab asks it about every try and holds what it grants.
//!
//! The built-in gates ([`GateSpec`]) are the ones the comparison needs: none at all (the engine queues
//! everything), a count limit (an [`Admission`] that counts requests, as a proxy or the engine's own
//! `max_num_seqs` does), and kvgate pricing each request in the KV bytes the engine will allocate —
//! refusing at once (`try_admit`), waiting in a bounded queue with a deadline (`admit`), and with
//! per-tenant limits and fair queueing. A new admission policy (token-fair queueing, deadline shedding,
//! adaptive limits) is judged by implementing [`Gate`] and running it with
//! [`Scenario::run_with_gate`](super::Scenario::run_with_gate).

use super::engine::{Engine, EngineStatus};
use crate::clock::ManualClock;
use crate::error::ConfigError;
use crate::{Admission, Admit, Permit, Rejection, Request, Reservation, TenantLimits};
use std::fmt;
use std::time::Duration;

/// The gate's answer to one try.
#[derive(Debug)]
pub enum Entry {
    /// Go to the engine now, holding this permit (if the gate issues any) until the request leaves it.
    Pass(Option<Permit>),
    /// Wait: the lab polls the future until it resolves.
    Wait(Admit),
    /// Refused.
    Refuse(Rejection),
}

/// What a gate is built from: the lab's clock and the engine it guards.
#[derive(Debug)]
pub struct GateContext<'a> {
    /// The virtual clock; build every [`Admission`] with it (`Admission::builder().clock(...)`).
    pub clock: &'a ManualClock,
    /// The engine behind the gate (its pool, its `max_num_seqs`, its model).
    pub engine: &'a Engine,
}

/// A pluggable admission strategy over the real [`Admission`].
///
/// # The contract
/// - [`Gate::enter`] answers at once: pass (optionally with a [`Permit`] the lab holds until the request
///   leaves the engine), wait (an [`Admit`] future the lab polls with its own waker, and polls again when
///   woken or at the gate's [`max_wait`](Gate::max_wait)), or refuse (a [`Rejection`], whose hint the
///   client's retry policy honours).
/// - The lab calls [`Permit::complete`] with the real output length when the request finishes, and
///   drops the permit or the future when the client gives up: the admission gets everything back.
/// - Time comes from the [`ManualClock`] in the [`GateContext`], which the lab sets to every event's
///   time before calling the gate; a gate must not read any other clock.
pub trait Gate: fmt::Debug {
    /// A short name for tables and plots.
    fn name(&self) -> &str;

    /// Decides about one try of `request` (its tenant set to the employee's).
    fn enter(&mut self, request: &Request) -> Entry;

    /// The longest a try may wait in [`Entry::Wait`]; the lab polls the future again at that time so that
    /// the deadline is kept without a timer thread. `None`: waits end only by a grant or the client.
    fn max_wait(&self) -> Option<Duration> {
        None
    }

    /// Requests waiting in the gate (for the time series).
    fn queued(&self) -> usize {
        0
    }

    /// Called at every sample of the time series with the engine's state: where an adaptive policy
    /// adjusts its limits (`Admission::set_max_in_flight`, ...).
    fn observe(&mut self, _now: Duration, _engine: &EngineStatus) {}
}

/// No gate: every try goes straight to the engine, which queues it (or refuses it with a 503 if its
/// own queue is capped).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoGate;

impl Gate for NoGate {
    fn name(&self) -> &str {
        "no gate"
    }

    fn enter(&mut self, _request: &Request) -> Entry {
        Entry::Pass(None)
    }
}

/// A gate made of one real [`Admission`], refusing at once ([`Admission::try_admit`]) or waiting
/// ([`Admission::admit`]).
#[derive(Debug)]
pub struct AdmissionGate {
    name: String,
    admission: Admission<ManualClock>,
    wait: bool,
    max_wait: Option<Duration>,
}

impl AdmissionGate {
    /// A gate over `admission` (built with the lab's clock and `deadline_timer(false)`); `wait` chooses
    /// `admit` over `try_admit`; `max_wait` is the admission's `max_queue_wait`, if any.
    pub fn new(
        name: impl Into<String>,
        admission: Admission<ManualClock>,
        wait: bool,
        max_wait: Option<Duration>,
    ) -> Self {
        Self { name: name.into(), admission, wait, max_wait }
    }

    /// The admission behind the gate.
    pub fn admission(&self) -> &Admission<ManualClock> {
        &self.admission
    }
}

impl Gate for AdmissionGate {
    fn name(&self) -> &str {
        &self.name
    }

    fn enter(&mut self, request: &Request) -> Entry {
        if self.wait {
            Entry::Wait(self.admission.admit(request))
        } else {
            match self.admission.try_admit(request) {
                Ok(permit) => Entry::Pass(Some(permit)),
                Err(rejection) => Entry::Refuse(rejection),
            }
        }
    }

    fn max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    fn queued(&self) -> usize {
        self.admission.snapshot().queued
    }
}

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
}

impl AdmissionSpec {
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
        if let Some(n) = self.max_in_flight {
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
        GateSpec::Admission(Box::new(AdmissionSpec {
            label: "count limit".into(),
            pricing: Pricing::Count,
            wait: true,
            max_in_flight: Some(max_in_flight),
            queue_capacity: queue,
            max_wait: Some(max_wait),
            request_rate: None,
            tenants: None,
            reservation: Reservation::Full,
        }))
    }

    /// kvgate `try_admit` pricing KV bytes against the engine's pool: refused at once when full.
    pub fn kv_try_admit() -> Self {
        GateSpec::Admission(Box::new(AdmissionSpec {
            label: "kvgate try_admit".into(),
            pricing: Pricing::KvBytes,
            wait: false,
            max_in_flight: None,
            queue_capacity: 0,
            max_wait: None,
            request_rate: None,
            tenants: None,
            reservation: Reservation::Full,
        }))
    }

    /// kvgate `admit` pricing KV bytes, with a queue of `queue` waiting at most `max_wait`.
    pub fn kv_admit(max_in_flight: Option<usize>, queue: usize, max_wait: Duration) -> Self {
        GateSpec::Admission(Box::new(AdmissionSpec {
            label: "kvgate admit".into(),
            pricing: Pricing::KvBytes,
            wait: true,
            max_in_flight,
            queue_capacity: queue,
            max_wait: Some(max_wait),
            request_rate: None,
            tenants: None,
            reservation: Reservation::Full,
        }))
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
            builder =
                builder.kv_model(plan.model().clone(), plan.kv_dtype(), plan.block_size()).kv_capacity_bytes(pool);
        }
        if let (true, Some(wait)) = (spec.wait, spec.max_wait) {
            builder = builder.max_queue_wait(wait);
        }
        if let Some((rate, burst)) = spec.request_rate {
            builder = builder.request_rate(rate, burst);
        }
        builder = builder.reservation(spec.reservation);
        if let Some(limits) = &spec.tenants {
            builder = builder.tenant_defaults(limits.clone());
        }
        let max_wait = if spec.wait { spec.max_wait } else { None };
        Ok(Box::new(AdmissionGate::new(spec.label.clone(), builder.build()?, spec.wait, max_wait)))
    }
}
