//! Gates: what stands between the clients and the engine. A gate is a strategy over the real
//! [`Admission`]; the lab asks it about every try and holds what it grants.
//!
//! [`NoGate`] lets everything through (the engine queues it); an [`AdmissionGate`] is one real
//! [`Admission`], refusing at once or waiting. The built-in configurations are data
//! ([`GateSpec`](super::GateSpec)); a new admission policy (token-fair queueing, deadline shedding) is
//! judged by implementing [`Gate`] and running it with
//! [`Scenario::run_with_gate`](super::Scenario::run_with_gate).

use super::engine::{Engine, EngineStatus};
use crate::adaptive::Observation;
use crate::clock::ManualClock;
use crate::{Admission, Admit, Permit, Rejection, Request};
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

    /// Called at every sample of the time series with the engine's state.
    fn observe(&mut self, _now: Duration, _engine: &EngineStatus) {}

    /// What happened to a request the gate let through: its first token, its last token, or its end
    /// without a first token (the client gave up). Times are the lab clock's; `admitted_at` is when the
    /// request entered the engine. Where an adaptive policy learns.
    fn served(&mut self, _observation: &Observation) {}

    /// How often the lab calls [`control`](Gate::control); `None`: never.
    fn control_interval(&self) -> Option<Duration> {
        None
    }

    /// Called every [`control_interval`](Gate::control_interval) with the engine's state (its
    /// metrics, as a gateway would scrape them): where an adaptive policy adjusts its limits
    /// (`Admission::set_max_in_flight`, `Admission::set_kv_capacity`).
    fn control(&mut self, _now: Duration, _engine: &EngineStatus) {}

    /// The gate's in-flight limit now, if it has one (for the time series).
    fn max_in_flight(&self) -> Option<usize> {
        None
    }

    /// The gate's KV budget now, in bytes over the tensor-parallel group, if it has one (for the time
    /// series).
    fn kv_budget(&self) -> Option<u64> {
        None
    }

    /// The admission behind the gate, if it has one: the lab reads its counters and prices requests with
    /// it (for the deadline report).
    fn admission(&self) -> Option<&Admission<ManualClock>> {
        None
    }

    /// The allowance with which the gate passes requests' TTFT deadlines on as start deadlines (see
    /// [`AdmissionSpec::deadline_shedding`](super::AdmissionSpec::deadline_shedding)); `None` when it
    /// ignores them. The lab replays shed tries against this start deadline.
    fn deadline_shedding(&self) -> Option<Duration> {
        None
    }
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
    deadline_shedding: Option<Duration>,
}

/// How often a gate that sheds by deadline lets waiters whose deadline became unreachable leave
/// ([`Admission::expire_waiters`]), as the admission's deadline timer does in a server.
pub(crate) const EXPIRE_EVERY: Duration = Duration::from_millis(100);

impl AdmissionGate {
    /// A gate over `admission` (built with the lab's clock and `deadline_timer(false)`); `wait` chooses
    /// `admit` over `try_admit`; `max_wait` is the admission's `max_queue_wait`, if any.
    pub fn new(
        name: impl Into<String>,
        admission: Admission<ManualClock>,
        wait: bool,
        max_wait: Option<Duration>,
    ) -> Self {
        Self { name: name.into(), admission, wait, max_wait, deadline_shedding: None }
    }

    /// Passes each request's TTFT deadline on to the admission less `allowance` (deadline-aware
    /// shedding; see [`AdmissionSpec::deadline_shedding`](super::AdmissionSpec::deadline_shedding)), or
    /// with `None`, strips it (the default: the gate ignores deadlines).
    #[must_use]
    pub fn with_deadline_shedding(mut self, allowance: Option<Duration>) -> Self {
        self.deadline_shedding = allowance;
        self
    }
}

impl Gate for AdmissionGate {
    fn name(&self) -> &str {
        &self.name
    }

    fn enter(&mut self, request: &Request) -> Entry {
        let mut request = *request;
        request.ttft_deadline = match self.deadline_shedding {
            Some(allowance) => request.ttft_deadline.map(|d| d.saturating_sub(allowance)),
            None => None,
        };
        if self.wait {
            Entry::Wait(self.admission.admit(&request))
        } else {
            match self.admission.try_admit(&request) {
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

    fn control_interval(&self) -> Option<Duration> {
        // As the deadline timer of a server: waits that ended early (deadline shedding, a standing queue's
        // over-age waiters) leave between releases too.
        self.wait.then_some(EXPIRE_EVERY)
    }

    fn control(&mut self, _now: Duration, _engine: &EngineStatus) {
        if self.wait {
            self.admission.expire_waiters();
        }
    }

    fn max_in_flight(&self) -> Option<usize> {
        Some(self.admission.snapshot().max_in_flight).filter(|&n| n != usize::MAX)
    }

    fn admission(&self) -> Option<&Admission<ManualClock>> {
        Some(&self.admission)
    }

    fn deadline_shedding(&self) -> Option<Duration> {
        self.deadline_shedding
    }

    fn kv_budget(&self) -> Option<u64> {
        let snapshot = self.admission.snapshot();
        (self.admission.kv_in_bytes() && snapshot.kv_capacity != u64::MAX).then_some(snapshot.kv_capacity)
    }
}
