//! What the operator sets: a time-to-first-token SLO (and optionally a time per output token), the bounds
//! the limit moves between, and the controller's pace. Every value is checked by
//! [`AdaptiveConfig::validate`], which [`AdaptiveConcurrency::new`](super::AdaptiveConcurrency::new) calls.

use crate::error::ConfigError;
use std::time::Duration;

/// The settings of an [`AdaptiveConcurrency`](super::AdaptiveConcurrency) controller.
///
/// Only the SLO is required; the defaults suit a server whose requests reach their first token within a
/// second or two. The controller aims the `quantile` of the queueing part of the time to first token
/// (measured from admission, the request's own prefill discounted) at `target_share × ttft_slo`, leaving
/// the rest of the SLO to the wait in kvgate's queue and to a client's retry.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`ttft_slo`](Self::new) | — | the time to first token promised to users |
/// | [`target_share`](Self::target_share) | 0.5 | share of the SLO the engine-side queueing may use |
/// | [`tpot_slo`](Self::tpot_slo) | none | a time per output token to keep too (decode congestion) |
/// | [`quantile`](Self::quantile) | 0.9 | which quantile of the samples must meet the targets |
/// | [`limits`](Self::limits) | 1 ..= 4096 | the bounds of `max_in_flight` |
/// | [`initial_limit`](Self::initial_limit) | 16 (clamped to the bounds) | the limit set when the controller starts |
/// | [`interval`](Self::interval) | 1 s | shortest time between two decisions |
/// | [`min_samples`](Self::min_samples) | 16 | samples a decision needs |
/// | [`tolerance`](Self::tolerance) | 0.8 | below `tolerance × target` the limit may grow; between it and the target it holds |
/// | [`max_growth`](Self::max_growth) | 1.25 | largest factor of one increase |
/// | [`max_backoff`](Self::max_backoff) | 0.5 | smallest factor of one decrease |
/// | [`ceiling_ttl`](Self::ceiling_ttl) | 60 s | how long the limit at the last violation slows growth near it |
/// | [`window`](Self::window) | 2048 | samples kept per decision (older ones are overwritten) |
///
/// # Examples
///
/// ```
/// use kvgate::adaptive::AdaptiveConfig;
/// use std::time::Duration;
///
/// let config = AdaptiveConfig::new(Duration::from_secs(2))
///     .tpot_slo(Duration::from_millis(60))
///     .limits(4, 512)
///     .initial_limit(64);
/// config.validate()?;
/// assert_eq!(config.ttft_target(), Duration::from_secs(1)); // half of the SLO by default
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveConfig {
    pub(super) ttft_slo: Duration,
    pub(super) target_share: f64,
    pub(super) tpot_slo: Option<Duration>,
    pub(super) quantile: f64,
    pub(super) min_limit: usize,
    pub(super) max_limit: usize,
    pub(super) initial_limit: usize,
    pub(super) interval: Duration,
    pub(super) min_samples: usize,
    pub(super) tolerance: f64,
    pub(super) max_growth: f64,
    pub(super) max_backoff: f64,
    pub(super) ceiling_ttl: Duration,
    pub(super) window: usize,
}

/// Largest accepted [`AdaptiveConfig::window`]: the memory of the sample windows stays bounded.
pub const MAX_WINDOW: usize = 1 << 16;

impl AdaptiveConfig {
    /// A controller that keeps the time to first token within `ttft_slo`, with the defaults listed on
    /// [`AdaptiveConfig`].
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
            max_growth: 1.25,
            max_backoff: 0.5,
            ceiling_ttl: Duration::from_secs(60),
            window: 2048,
        }
    }

    /// The share of the TTFT SLO that queueing in the engine may take, in `(0, 1]`: the controller's TTFT
    /// target is `share × ttft_slo`.
    pub fn target_share(mut self, share: f64) -> Self {
        self.target_share = share;
        self
    }

    /// Also keep the time per output token (between the first and the last token) within `tpot`.
    pub fn tpot_slo(mut self, tpot: Duration) -> Self {
        self.tpot_slo = Some(tpot);
        self
    }

    /// The quantile of the samples that must meet the targets, in `(0, 1]` (1.0: the worst sample).
    pub fn quantile(mut self, quantile: f64) -> Self {
        self.quantile = quantile;
        self
    }

    /// The bounds of `max_in_flight`: `min ≥ 1`, `min ≤ max`.
    pub fn limits(mut self, min: usize, max: usize) -> Self {
        self.min_limit = min;
        self.max_limit = max;
        self
    }

    /// The limit set when the controller starts (clamped to the bounds).
    pub fn initial_limit(mut self, limit: usize) -> Self {
        self.initial_limit = limit;
        self
    }

    /// The shortest time between two decisions (above 0).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// The samples a decision needs (at least 1).
    pub fn min_samples(mut self, samples: usize) -> Self {
        self.min_samples = samples;
        self
    }

    /// The lower edge of the band in which the limit holds, as a share of the target, in `(0, 1]`.
    pub fn tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = tolerance;
        self
    }

    /// The largest factor of one increase, above 1.
    pub fn max_growth(mut self, factor: f64) -> Self {
        self.max_growth = factor;
        self
    }

    /// The smallest factor of one decrease, in `(0, 1)`.
    pub fn max_backoff(mut self, factor: f64) -> Self {
        self.max_backoff = factor;
        self
    }

    /// How long the limit at which the target was last missed slows the growth near it (zero: never).
    pub fn ceiling_ttl(mut self, ttl: Duration) -> Self {
        self.ceiling_ttl = ttl;
        self
    }

    /// Samples kept per decision, per signal (at least `min_samples`, at most [`MAX_WINDOW`]).
    pub fn window(mut self, samples: usize) -> Self {
        self.window = samples;
        self
    }

    /// The TTFT SLO.
    pub fn ttft_slo(&self) -> Duration {
        self.ttft_slo
    }

    /// What the queueing part of the TTFT is aimed at: `target_share × ttft_slo`.
    pub fn ttft_target(&self) -> Duration {
        self.ttft_slo.mul_f64(self.target_share)
    }

    /// The bounds of the limit, `(min, max)`.
    pub fn bounds(&self) -> (usize, usize) {
        (self.min_limit, self.max_limit)
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
