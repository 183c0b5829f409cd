//! How far and how fast engine feedback may move the KV budget.

use crate::error::ConfigError;
use std::time::Duration;

/// The settings of an [`EngineFeedback`](super::EngineFeedback) corrector; [`validate`](Self::validate)
/// checks every field.
///
/// # Examples
///
/// ```
/// use kvgate::feedback::FeedbackConfig;
///
/// let config = FeedbackConfig { min_factor: 0.75, max_factor: 1.5, target_usage: 0.85, ..FeedbackConfig::new() };
/// config.validate()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FeedbackConfig {
    /// The lowest budget, as a multiple of the budget the admission had when the corrector was built, in
    /// `(0, 1]` (default 0.5).
    pub min_factor: f64,
    /// The highest budget, as a multiple of that budget, in `[1, 1000]` (default 2.0).
    pub max_factor: f64,
    /// The engine KV use, in `(0, 1]`, that a full kvgate budget should correspond to (default 0.9).
    pub target_usage: f64,
    /// The factor, in `(0, 1)`, applied to the budget when the engine preempted since the last scrape;
    /// also the largest single decrease (default 0.8).
    pub shrink: f64,
    /// The largest factor, above 1, of one increase (default 1.1).
    pub max_growth: f64,
    /// How long after a preemption the budget may not grow (default 60 s).
    pub cooldown: Duration,
    /// The share of its budget, in `(0, 1]`, kvgate must use before the engine's use says anything about
    /// how much more fits (default 0.7).
    pub min_budget_use: f64,
    /// Changes smaller than this share of the budget, in `[0, 1)`, are not made (default 0.05).
    pub tolerance: f64,
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl FeedbackConfig {
    /// The defaults listed on the fields.
    pub const fn new() -> Self {
        Self {
            min_factor: 0.5,
            max_factor: 2.0,
            target_usage: 0.9,
            shrink: 0.8,
            max_growth: 1.1,
            cooldown: Duration::from_secs(60),
            min_budget_use: 0.7,
            tolerance: 0.05,
        }
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] naming the setting and its valid range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let check = |what: &'static str, ok: bool, value: f64, range: &str| {
            if ok { Ok(()) } else { Err(ConfigError::OutOfRange { what, reason: format!("{value}; use {range}") }) }
        };
        check(
            "feedback minimum bound",
            self.min_factor > 0.0 && self.min_factor <= 1.0,
            self.min_factor,
            "a factor in (0, 1]",
        )?;
        check(
            "feedback maximum bound",
            self.max_factor >= 1.0 && self.max_factor <= 1000.0,
            self.max_factor,
            "a factor in [1, 1000]",
        )?;
        check(
            "feedback target_usage",
            self.target_usage > 0.0 && self.target_usage <= 1.0,
            self.target_usage,
            "a share in (0, 1]",
        )?;
        check("feedback shrink", self.shrink > 0.0 && self.shrink < 1.0, self.shrink, "a factor in (0, 1)")?;
        check(
            "feedback max_growth",
            self.max_growth > 1.0 && self.max_growth.is_finite(),
            self.max_growth,
            "a finite factor above 1",
        )?;
        check(
            "feedback min_budget_use",
            self.min_budget_use > 0.0 && self.min_budget_use <= 1.0,
            self.min_budget_use,
            "a share in (0, 1]",
        )?;
        check("feedback tolerance", (0.0..1.0).contains(&self.tolerance), self.tolerance, "a share in [0, 1)")
    }
}
