//! The corrector: compares the engine's own KV use and preemptions with kvgate's reservations and moves
//! the admission's KV budget through its public API.

use super::config::FeedbackConfig;
use super::correction::{Correction, CorrectionReason};
use super::metrics::EngineMetrics;
use crate::Admission;
use crate::clock::{Clock, MonotonicClock};
use crate::error::ConfigError;
use std::time::Duration;

/// Corrects an [`Admission`]'s KV budget from what the engine reports about itself. See the
/// [module documentation](super) for the rules and their reasons.
///
/// Feed it every scrape of the engine's metrics with [`update`](Self::update); it changes the budget
/// with [`Admission::set_kv_capacity`] and returns what it did. It reads no clock and holds no thread:
/// the gateway's timer does the fetching.
///
/// # Examples
///
/// ```
/// use kvgate::feedback::{CorrectionReason, EngineFeedback, EngineMetrics, FeedbackConfig};
/// use kvgate::{Admission, Request};
/// use std::time::Duration;
///
/// let admission = Admission::builder().kv_capacity_tokens(100_000).build()?;
/// let mut feedback = EngineFeedback::new(admission.clone(), FeedbackConfig::new())?;
/// let _held: Vec<_> = (0..8).map(|_| admission.try_admit(&Request::new(1000, 10_000)).unwrap()).collect();
///
/// // kvgate reserves 88 % of its budget, but the engine's cache is only 40 % full: outputs are shorter
/// // than max_tokens. The budget grows, by at most 10 % a scrape.
/// let text = "vllm:kv_cache_usage_perc 0.40\nvllm:num_requests_waiting 0\nvllm:num_preemptions_total 0\n";
/// let correction = feedback.update(Duration::from_secs(5), &EngineMetrics::parse(text)?);
/// assert_eq!(correction.reason, CorrectionReason::CacheBelowEstimate);
/// assert_eq!(admission.snapshot().kv_capacity, 110_000);
///
/// // Then the engine preempts: the budget shrinks at once.
/// let text = "vllm:kv_cache_usage_perc 0.97\nvllm:num_requests_waiting 3\nvllm:num_preemptions_total 2\n";
/// let correction = feedback.update(Duration::from_secs(10), &EngineMetrics::parse(text)?);
/// assert_eq!((correction.reason, correction.preemptions), (CorrectionReason::Preempted, 2));
/// assert_eq!(admission.snapshot().kv_capacity, 88_000);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct EngineFeedback<C: Clock = MonotonicClock> {
    admission: Admission<C>,
    config: FeedbackConfig,
    min: u64,
    max: u64,
    /// The engine's preemption counter at the previous update.
    preemptions: Option<f64>,
    /// No growth before this time (after a preemption).
    cooldown_until: Option<Duration>,
    last: Option<Correction>,
}

impl<C: Clock> EngineFeedback<C> {
    /// A corrector of `admission`'s KV budget, which stays within the configured multiples of the
    /// budget it has now.
    ///
    /// # Errors
    ///
    /// The [`ConfigError`] of [`FeedbackConfig::validate`]; [`ConfigError::Conflict`] when the admission
    /// has no KV budget.
    pub fn new(admission: Admission<C>, config: FeedbackConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let initial = admission.snapshot().kv_capacity;
        if initial == u64::MAX {
            return Err(ConfigError::Conflict(
                "engine feedback corrects the KV budget, but the admission has none: set kv_capacity_tokens, or \
                 kv_model with kv_capacity_bytes or gpu_plan"
                    .into(),
            ));
        }
        let scale = |factor: f64| ((initial as f64 * factor).round() as u64).clamp(1, u64::MAX - 1);
        Ok(Self {
            min: scale(config.min_factor),
            max: scale(config.max_factor),
            admission,
            config,
            preemptions: None,
            cooldown_until: None,
            last: None,
        })
    }

    /// Compares one scrape of the engine's metrics with kvgate's reservations, corrects the budget, and
    /// returns what it did. `now` is any monotonic time (the admission clock's, in the lab).
    ///
    /// In order: preemptions since the previous update shrink the budget by
    /// [`shrink`](FeedbackConfig::shrink) and start the cooldown (the first update only records the
    /// counter; a counter that went down — the engine restarted — is recorded again). Otherwise, with the
    /// engine's KV use `e` and kvgate's reservations `used`, the budget at which a full budget would meet
    /// the target is `target × used / e` (or `target / e` of the budget when the engine is above the
    /// target already): below the budget, the budget shrinks toward it (at most by `shrink`); above, it
    /// grows toward it (at most by `max_growth`) unless the cooldown runs, requests wait inside the
    /// engine, or kvgate uses less than [`min_budget_use`](FeedbackConfig::min_budget_use) of its budget.
    /// The result stays within the bounds; changes under the tolerance are not made.
    pub fn update(&mut self, now: Duration, metrics: &EngineMetrics) -> Correction {
        let snapshot = self.admission.snapshot();
        let from = snapshot.kv_capacity;
        let budget = from as f64;
        let used = snapshot.kv_used as f64;
        let budget_usage = if from == 0 { 0.0 } else { used / budget };
        let preempted = match (metrics.preemptions, self.preemptions) {
            (Some(count), Some(before)) if count > before => (count - before).round() as u64,
            _ => 0,
        };
        if metrics.preemptions.is_some() {
            self.preemptions = metrics.preemptions;
        }
        let config = &self.config;
        let usage = metrics.kv_cache_usage.map(|e| e.clamp(0.0, 1.0));
        let cooling = self.cooldown_until.is_some_and(|until| now < until);
        let waiting = metrics.requests_waiting.is_some_and(|w| w >= 1.0);
        let (target, reason) = if preempted > 0 {
            self.cooldown_until = Some(now.saturating_add(config.cooldown));
            (budget * config.shrink, CorrectionReason::Preempted)
        } else {
            match usage {
                None => (budget, CorrectionReason::NoUsage),
                Some(e) if e > config.target_usage => {
                    ((budget * config.target_usage / e).max(budget * config.shrink), CorrectionReason::EngineFull)
                }
                Some(_) if budget_usage < config.min_budget_use => (budget, CorrectionReason::BudgetUnused),
                Some(e) => {
                    let desired = if e > 0.0 { config.target_usage * used / e } else { f64::INFINITY };
                    if desired < budget {
                        (desired.max(budget * config.shrink), CorrectionReason::EngineFull)
                    } else if cooling {
                        (budget, CorrectionReason::Cooldown)
                    } else if waiting {
                        (budget, CorrectionReason::EngineQueueing)
                    } else {
                        (desired.min(budget * config.max_growth), CorrectionReason::CacheBelowEstimate)
                    }
                }
            }
        };
        let mut to = (target.round() as u64).clamp(self.min, self.max);
        let mut reason = reason;
        let small = (to as f64 - budget).abs() < config.tolerance * budget;
        if small && reason != CorrectionReason::Preempted {
            to = from;
            if matches!(reason, CorrectionReason::EngineFull | CorrectionReason::CacheBelowEstimate) {
                reason = CorrectionReason::InBand;
            }
        }
        if to != from && self.admission.set_kv_capacity(to).is_err() {
            to = from; // unreachable: the bounds are at least 1
        }
        let correction = Correction {
            at: now,
            from,
            to,
            reason,
            engine_usage: usage,
            budget_usage: budget_usage.min(1.0),
            preemptions: preempted,
        };
        self.last = Some(correction);
        correction
    }

    /// The bounds of the budget, `(min, max)`, in the admission's KV unit.
    pub fn bounds(&self) -> (u64, u64) {
        (self.min, self.max)
    }

    /// The last update, if any.
    pub fn last_correction(&self) -> Option<&Correction> {
        self.last.as_ref()
    }

    /// The configuration.
    pub fn config(&self) -> &FeedbackConfig {
        &self.config
    }

    /// The admission whose budget this corrector moves.
    pub fn admission(&self) -> &Admission<C> {
        &self.admission
    }
}
