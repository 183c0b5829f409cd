//! What the operator sets: a time-to-first-token SLO (and optionally a time per output token), the bounds
//! the limit moves between, and the controller's pace. Every value is checked by
//! [`AdaptiveConfig::validate`], which [`AdaptiveConcurrency::new`](super::AdaptiveConcurrency::new) calls.

use crate::error::ConfigError;
use std::time::Duration;

/// The settings of an [`AdaptiveConcurrency`](super::AdaptiveConcurrency) controller.
///
/// Only the SLO is required ([`AdaptiveConfig::new`]); the other fields have defaults that suit a server
/// whose requests reach their first token within a second or two. The controller aims the `quantile` of
/// the queueing part of the time to first token (measured from admission, the request's own prefill
/// discounted) at `target_share × ttft_slo`, leaving the rest of the SLO to the wait in kvgate's queue
/// and to a client's retry. [`validate`](Self::validate) checks every field.
///
/// # Examples
///
/// ```
/// use kvgate::adaptive::AdaptiveConfig;
/// use std::time::Duration;
///
/// let config = AdaptiveConfig {
///     tpot_slo: Some(Duration::from_millis(60)),
///     min_limit: 4,
///     max_limit: 512,
///     initial_limit: 64,
///     ..AdaptiveConfig::new(Duration::from_secs(2))
/// };
/// config.validate()?;
/// assert_eq!(config.ttft_target(), Duration::from_secs(1)); // half of the SLO by default
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    /// The time to first token promised to users (above 0).
    pub ttft_slo: Duration,
    /// The share of the SLO that queueing in the engine may take, in `(0, 1]` (default 0.5): the TTFT
    /// target is `target_share × ttft_slo`.
    pub target_share: f64,
    /// A time per output token to keep too (decode congestion); default none.
    pub tpot_slo: Option<Duration>,
    /// The quantile of the samples that must meet the targets, in `(0, 1]` (default 0.9).
    pub quantile: f64,
    /// The lowest limit, at least 1 (default 1): set it to the concurrency below which the engine's
    /// throughput falls apart.
    pub min_limit: usize,
    /// The highest limit, at least `min_limit` (default 4096).
    pub max_limit: usize,
    /// The limit set when the controller starts, clamped to the bounds (default 16).
    pub initial_limit: usize,
    /// The shortest time between two decisions, above 0 (default 1 s).
    pub interval: Duration,
    /// The TTFT samples a decision needs, at least 1 (default 16).
    pub min_samples: usize,
    /// The lower edge of the band in which the limit holds, as a share of the target, in `(0, 1]`
    /// (default 0.8): below it the limit may grow, between it and the target it holds.
    pub tolerance: f64,
    /// The largest factor of one increase, above 1 (default 1.1).
    pub max_growth: f64,
    /// The smallest factor of one decrease, in `(0, 1)` (default 0.5).
    pub max_backoff: f64,
    /// How long the limit at which the target was last missed slows the growth near it (default 60 s;
    /// zero: never).
    pub ceiling_ttl: Duration,
    /// Samples kept per decision and signal, from `min_samples` to [`MAX_WINDOW`] (default 2048; older
    /// samples are overwritten).
    pub window: usize,
}

/// Largest accepted [`AdaptiveConfig::window`]: the memory of the sample windows stays bounded.
pub const MAX_WINDOW: usize = 1 << 16;

impl AdaptiveConfig {
    /// A controller that keeps the time to first token within `ttft_slo`, every other field at its
    /// default.
    pub fn new(ttft_slo: Duration) -> Self {
        Self {
            ttft_slo,
            target_share: 0.5,
            tpot_slo: None,
            quantile: 0.9,
            min_limit: 1,
            max_limit: 4096,
            initial_limit: 16,
            interval: Duration::from_secs(1),
            min_samples: 16,
            tolerance: 0.8,
            max_growth: 1.1,
            max_backoff: 0.5,
            ceiling_ttl: Duration::from_secs(60),
            window: 2048,
        }
    }

    /// What the queueing part of the TTFT is aimed at: `target_share × ttft_slo`.
    pub fn ttft_target(&self) -> Duration {
        self.ttft_slo.mul_f64(self.target_share)
    }

    /// Checks every setting.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming the setting: a zero SLO, interval or sample count; a share, quantile or
    /// tolerance outside `(0, 1]`; a growth factor not above 1 or a backoff factor outside `(0, 1)`;
    /// bounds with `min` 0 or above `max`; a window below `min_samples` or above [`MAX_WINDOW`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.ttft_slo.is_zero() {
            return Err(ConfigError::Zero { what: "adaptive TTFT SLO" });
        }
        if self.tpot_slo.is_some_and(|t| t.is_zero()) {
            return Err(ConfigError::Zero { what: "adaptive TPOT SLO (leave it unset to ignore decode time)" });
        }
        if self.interval.is_zero() {
            return Err(ConfigError::Zero { what: "adaptive decision interval" });
        }
        if self.min_samples == 0 {
            return Err(ConfigError::Zero { what: "adaptive min_samples" });
        }
        for (what, value) in [
            ("adaptive target_share", self.target_share),
            ("adaptive quantile", self.quantile),
            ("adaptive tolerance", self.tolerance),
        ] {
            if !(value > 0.0 && value <= 1.0) {
                return Err(ConfigError::OutOfRange { what, reason: format!("{value}; use a share in (0, 1]") });
            }
        }
        if !(self.max_growth > 1.0 && self.max_growth.is_finite()) {
            return Err(ConfigError::OutOfRange {
                what: "adaptive max_growth",
                reason: format!("{}; use a finite factor above 1, e.g. 1.25", self.max_growth),
            });
        }
        if !(self.max_backoff > 0.0 && self.max_backoff < 1.0) {
            return Err(ConfigError::OutOfRange {
                what: "adaptive max_backoff",
                reason: format!("{}; use a factor in (0, 1), e.g. 0.5", self.max_backoff),
            });
        }
        if self.min_limit == 0 {
            return Err(ConfigError::Zero { what: "adaptive minimum limit" });
        }
        if self.min_limit > self.max_limit {
            return Err(ConfigError::Conflict(format!(
                "adaptive limits: the minimum {} is above the maximum {}",
                self.min_limit, self.max_limit
            )));
        }
        if self.window < self.min_samples || self.window > MAX_WINDOW {
            return Err(ConfigError::OutOfRange {
                what: "adaptive window",
                reason: format!(
                    "{} samples; use between min_samples ({}) and {MAX_WINDOW}",
                    self.window, self.min_samples
                ),
            });
        }
        Ok(())
    }
}
