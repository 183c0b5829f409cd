//! A gate whose limits move while the lab runs: an [`AdmissionGate`] with an adaptive concurrency
//! controller and/or engine feedback, fed exactly as a gateway would feed them.
//!
//! - The controller ([`AdaptiveConcurrency`]) gets an [`Observation`] for every first token, last token
//!   and abandoned request of the requests the gate let through, and a `tick` at every control event.
//! - Engine feedback ([`EngineFeedback`]) scrapes the engine every [`FeedbackSetup::every`]: the lab's
//!   engine renders its counters as vLLM's Prometheus text
//!   ([`EngineStatus::prometheus_text`]), which goes through
//!   [`EngineMetrics::parse`] like a real scrape.

use super::engine::EngineStatus;
use super::gate::{AdmissionGate, Entry, Gate};
use crate::adaptive::{AdaptiveConcurrency, Observation};
use crate::clock::ManualClock;
use crate::feedback::{EngineFeedback, EngineMetrics, FeedbackConfig};
use crate::{Admission, Request};
use std::time::Duration;

/// Engine feedback in the lab: the corrector's settings and how often the engine is scraped.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedbackSetup {
    /// The corrector's settings.
    pub config: FeedbackConfig,
    /// Time between two scrapes.
    pub every: Duration,
}

impl FeedbackSetup {
    /// `config`, scraped every 5 s.
    pub fn new(config: FeedbackConfig) -> Self {
        Self { config, every: Duration::from_secs(5) }
    }
}

/// How often the lab calls a policy gate: often enough that a decision due at its interval is taken
/// within a quarter of it.
const CONTROL_DIVISOR: u32 = 4;

/// An [`AdmissionGate`] whose `max_in_flight` an [`AdaptiveConcurrency`] moves and/or whose KV budget an
/// [`EngineFeedback`] corrects. Built by [`GateSpec::build`](super::GateSpec::build) when its
/// [`AdmissionSpec`](super::AdmissionSpec) has `adaptive` or `feedback`.
#[derive(Debug)]
pub struct PolicyGate {
    gate: AdmissionGate,
    adaptive: Option<AdaptiveConcurrency<ManualClock>>,
    feedback: Option<(EngineFeedback<ManualClock>, Duration)>,
    next_scrape: Duration,
    model: String,
}

impl PolicyGate {
    /// `gate`, with a controller of its admission's limit and/or feedback on its KV budget scraped at the
    /// given interval (both built on `gate`'s admission).
    pub fn new(
        gate: AdmissionGate,
        adaptive: Option<AdaptiveConcurrency<ManualClock>>,
        feedback: Option<(EngineFeedback<ManualClock>, Duration)>,
    ) -> Self {
        Self { gate, adaptive, feedback, next_scrape: Duration::ZERO, model: String::from("sim") }
    }
}

impl Gate for PolicyGate {
    fn name(&self) -> &str {
        self.gate.name()
    }

    fn enter(&mut self, request: &Request) -> Entry {
        self.gate.enter(request)
    }

    fn max_wait(&self) -> Option<Duration> {
        self.gate.max_wait()
    }

    fn queued(&self) -> usize {
        self.gate.queued()
    }

    fn served(&mut self, observation: &Observation) {
        if let Some(controller) = &mut self.adaptive {
            controller.observe(*observation);
        }
    }

    fn control_interval(&self) -> Option<Duration> {
        let adaptive = self.adaptive.as_ref().map(|c| c.config().interval);
        let feedback = self.feedback.as_ref().map(|(_, every)| *every);
        let own = [adaptive, feedback]
            .into_iter()
            .flatten()
            .min()
            .map(|d| (d / CONTROL_DIVISOR).max(Duration::from_millis(1)));
        [own, self.gate.control_interval()].into_iter().flatten().min()
    }

    fn control(&mut self, now: Duration, engine: &EngineStatus) {
        self.gate.control(now, engine);
        if let Some(controller) = &mut self.adaptive {
            controller.tick(now);
        }
        if let Some((feedback, every)) = &mut self.feedback {
            if now >= self.next_scrape {
                self.next_scrape = now + *every;
                // The lab's own text cannot be malformed; a parse error would leave the budget alone, as
                // a failed scrape does in a gateway.
                if let Ok(metrics) = EngineMetrics::parse(&engine.prometheus_text(&self.model)) {
                    feedback.update(now, &metrics);
                }
            }
        }
    }

    fn max_in_flight(&self) -> Option<usize> {
        self.gate.max_in_flight()
    }

    fn kv_budget(&self) -> Option<u64> {
        self.gate.kv_budget()
    }

    fn admission(&self) -> Option<&Admission<ManualClock>> {
        self.gate.admission()
    }

    fn deadline_shedding(&self) -> Option<Duration> {
        self.gate.deadline_shedding()
    }
}
