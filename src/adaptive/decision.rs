//! The record of one decision: what the controller measured and what it did to the limit.

use std::time::Duration;

/// Why the controller moved the limit, or left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The TTFT quantile was above its target: the limit went down in proportion from the concurrency
    /// in flight (at most to [`max_backoff`](super::AdaptiveConfig::max_backoff) of it), and that
    /// concurrency became the ceiling that later growth stays below for
    /// [`ceiling_ttl`](super::AdaptiveConfig::ceiling_ttl).
    OverTarget,
    /// Requests were admitted but none reached its first token for a long time (at least ten
    /// intervals and twice the SLO): the limit went down by [`max_backoff`](super::AdaptiveConfig::max_backoff).
    Stalled,
    /// Both quantiles were below `tolerance × target` and the limit was in use: it went up (unless at
    /// the maximum).
    Slack,
    /// As [`Slack`](Reason::Slack), but the limit is just below the ceiling (where the target was last
    /// missed) and holds there until the ceiling is forgotten.
    BelowCeiling,
    /// The TTFT quantile was between `tolerance × target` and the target: the limit held.
    InBand,
    /// The TPOT quantile was at least `tolerance × tpot_slo`: the limit held. (The time per output token
    /// lags, and has a floor set by prefills interleaved with decoding that no limit removes, so it stops
    /// growth but never lowers the limit by itself.)
    DecodeSlow,
    /// The quantiles left room, but fewer requests were in flight than 90 % of the limit (another limit,
    /// such as the KV budget, or the demand, bounds the concurrency): the limit held, so that it cannot
    /// inflate without evidence.
    NotLimited,
}

impl Reason {
    /// A short name for logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::OverTarget => "over_target",
            Reason::Stalled => "stalled",
            Reason::Slack => "slack",
            Reason::BelowCeiling => "below_ceiling",
            Reason::InBand => "in_band",
            Reason::DecodeSlow => "decode_slow",
            Reason::NotLimited => "not_limited",
        }
    }
}

/// One decision of an [`AdaptiveConcurrency`](super::AdaptiveConcurrency) controller.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Decision {
    /// When it was taken (the `now` given to `tick`).
    pub at: Duration,
    /// The limit before.
    pub from: usize,
    /// The limit after (equal to `from` when it held).
    pub to: usize,
    /// Why.
    pub reason: Reason,
    /// The measured load: the TTFT quantile (queueing delay) over its target (1.0: exactly on target;
    /// infinite for a stall).
    pub load: f64,
    /// The TPOT quantile over the TPOT SLO (0 without one, or without enough finished requests).
    pub tpot_load: f64,
    /// The quantile of the queueing part of the time to first token (the request's own prefill
    /// discounted), over the samples of this decision.
    pub ttft_delay: Option<Duration>,
    /// The quantile of the time per output token, when a TPOT SLO is set and enough requests finished.
    pub tpot: Option<Duration>,
    /// The prefill time per prompt token discounted from each TTFT (the slope of TTFT against prompt
    /// length, smoothed over decisions).
    pub prefill_per_token: Option<Duration>,
    /// TTFT samples the decision used.
    pub samples: usize,
}

impl Decision {
    /// Whether the limit changed.
    pub fn changed(&self) -> bool {
        self.from != self.to
    }
}
