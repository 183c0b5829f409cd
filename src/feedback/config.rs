//! How far and how fast engine feedback may move the KV budget.

use crate::error::ConfigError;
use std::time::Duration;

/// The settings of an [`EngineFeedback`](super::EngineFeedback) corrector.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`bounds`](Self::bounds) | 0.5 ..= 2.0 | the budget stays within these multiples of the budget the admission had when the corrector was built |
/// | [`target_usage`](Self::target_usage) | 0.9 | the engine's KV use the budget is sized for, 0–1 |
/// | [`shrink`](Self::shrink) | 0.8 | factor applied when the engine preempted since the last scrape |
/// | [`max_growth`](Self::max_growth) | 1.1 | largest factor of one increase |
/// | [`cooldown`](Self::cooldown) | 60 s | no increase for this long after a preemption |
/// | [`min_budget_use`](Self::min_budget_use) | 0.7 | kvgate must use this share of its budget before the engine's use is compared with it |
/// | [`tolerance`](Self::tolerance) | 0.05 | changes smaller than this share of the budget are not made |
///
/// # Examples
///
/// ```
/// use kvgate::feedback::FeedbackConfig;
///
/// let config = FeedbackConfig::new().bounds(0.75, 1.5).target_usage(0.85);
/// config.validate()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct FeedbackConfig {
    pub(super) min_factor: f64,
    pub(super) max_factor: f64,
    pub(super) target_usage: f64,
    pub(super) shrink: f64,
    pub(super) max_growth: f64,
    pub(super) cooldown: Duration,
    pub(super) min_budget_use: f64,
    pub(super) tolerance: f64,
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl FeedbackConfig {
    /// The defaults listed on [`FeedbackConfig`].
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

    /// The budget stays within `[min × initial, max × initial]`, where `initial` is the admission's KV
    /// budget when the corrector is built (`0 < min ≤ 1 ≤ max`).
    pub const fn bounds(mut self, min: f64, max: f64) -> Self {
        self.min_factor = min;
        self.max_factor = max;
        self
    }

    /// The engine KV use, 0–1, that a full kvgate budget should correspond to.
    pub const fn target_usage(mut self, usage: f64) -> Self {
        self.target_usage = usage;
        self
    }

    /// The factor, in `(0, 1)`, applied to the budget when the engine preempted since the last scrape.
    pub const fn shrink(mut self, factor: f64) -> Self {
        self.shrink = factor;
        self
    }

    /// The largest factor, above 1, of one increase.
    pub const fn max_growth(mut self, factor: f64) -> Self {
        self.max_growth = factor;
        self
    }

    /// How long after a preemption the budget may not grow.
    pub const fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The share of its budget, in `(0, 1]`, kvgate must use before the engine's use says anything about
    /// how much more fits.
    pub const fn min_budget_use(mut self, share: f64) -> Self {
        self.min_budget_use = share;
        self
    }

    /// Changes smaller than this share of the budget, in `[0, 1)`, are not made.
    pub const fn tolerance(mut self, share: f64) -> Self {
        self.tolerance = share;
        self
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
