//! The record of one update of the engine feedback.

use std::time::Duration;

/// Why the feedback moved the KV budget, or left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CorrectionReason {
    /// The engine preempted since the last scrape: the budget shrank by the configured factor.
    Preempted,
    /// The engine's KV use is above the target: the budget shrank toward where the target is met.
    EngineFull,
    /// The engine uses less KV than kvgate reserves (outputs shorter than `max_tokens`, prefix caching):
    /// the budget grew toward where a full budget meets the target.
    CacheBelowEstimate,
    /// The engine's use matches kvgate's estimate within the tolerance: no change.
    InBand,
    /// Requests wait inside the engine: no growth.
    EngineQueueing,
    /// kvgate uses too little of its budget for the comparison to say anything: no change.
    BudgetUnused,
    /// A preemption happened less than the cooldown ago: no growth.
    Cooldown,
    /// The engine did not report its KV use: no change (preemptions still shrink).
    NoUsage,
}

impl CorrectionReason {
    /// A short name for logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            CorrectionReason::Preempted => "preempted",
            CorrectionReason::EngineFull => "engine_full",
            CorrectionReason::CacheBelowEstimate => "cache_below_estimate",
            CorrectionReason::InBand => "in_band",
            CorrectionReason::EngineQueueing => "engine_queueing",
            CorrectionReason::BudgetUnused => "budget_unused",
            CorrectionReason::Cooldown => "cooldown",
            CorrectionReason::NoUsage => "no_usage",
        }
    }
}

/// One update of an [`EngineFeedback`](super::EngineFeedback).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Correction {
    /// When (the `now` given to `update`).
    pub at: Duration,
    /// The KV budget before, in the admission's unit.
    pub from: u64,
    /// The KV budget after.
    pub to: u64,
    /// Why.
    pub reason: CorrectionReason,
    /// The engine's KV use, 0–1.
    pub engine_usage: Option<f64>,
    /// kvgate's use of its budget, 0–1.
    pub budget_usage: f64,
    /// Preemptions since the previous update.
    pub preemptions: u64,
}

impl Correction {
    /// Whether the budget changed.
    pub fn changed(&self) -> bool {
        self.from != self.to
    }
}
