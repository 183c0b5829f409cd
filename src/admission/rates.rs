//! A request rate and an LLM-token rate, charged together all or nothing — the admission's global pair
//! and each tenant's own.

use crate::bucket::{AcquireError, TokenBucket};
use crate::clock::{Clock, nanos_to_duration};
use crate::error::ConfigError;
use std::time::Duration;

/// Why a charge was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateRefusal {
    /// Not now: the earliest time both rates would let the request through.
    NotYet(Duration),
    /// Never: more tokens than the token rate's burst.
    NeverFits { requested: u64, burst: u64 },
}

/// Optional request-rate and token-rate buckets.
#[derive(Debug)]
pub(crate) struct Rates<C: Clock> {
    pub(crate) requests: Option<TokenBucket<C>>,
    pub(crate) tokens: Option<TokenBucket<C>>,
}

impl<C: Clock> Rates<C> {
    /// Builds the buckets; errors name the settings (`names`: request rate, token rate).
    pub(crate) fn new(
        requests: Option<(f64, u64)>,
        tokens: Option<(f64, u64)>,
        names: (&'static str, &'static str),
        clock: &C,
    ) -> Result<Self, ConfigError> {
        let bucket = |setting: Option<(f64, u64)>, what: &'static str| {
            setting
                .map(|(rate, burst)| {
                    TokenBucket::with_clock(rate, burst, clock.clone()).map_err(|e| rename_rate(e, what))
                })
                .transpose()
        };
        Ok(Self { requests: bucket(requests, names.0)?, tokens: bucket(tokens, names.1)? })
    }

    /// The token rate's burst, if there is a token rate.
    #[inline]
    pub(crate) fn token_burst(&self) -> Option<u64> {
        self.tokens.as_ref().map(TokenBucket::burst)
    }

    /// Charges one request and `total` tokens at `now`, all or nothing. Returns the tokens charged to
    /// the token rate (0 without one).
    #[inline]
    pub(crate) fn charge(&self, total: u64, now: u64) -> Result<u64, RateRefusal> {
        if let Some(requests) = &self.requests {
            if let Err(err) = requests.try_acquire_at(1, now) {
                let mut wait = err.retry_after().unwrap_or(Duration::ZERO);
                if let Some(tokens) = &self.tokens {
                    wait = wait.max(time_until_available(tokens, total, now));
                }
                return Err(RateRefusal::NotYet(wait.max(Duration::from_nanos(1))));
            }
        }
        let Some(tokens) = &self.tokens else { return Ok(0) };
        match tokens.try_acquire_at(total, now) {
            Ok(()) => Ok(total),
            Err(err) => {
                if let Some(requests) = &self.requests {
                    requests.refund_at(1, now);
                }
                Err(match err {
                    AcquireError::NotYet { retry_after } => RateRefusal::NotYet(retry_after),
                    AcquireError::NeverFits { requested, burst } => RateRefusal::NeverFits { requested, burst },
                })
            }
        }
    }

    /// Gives back one request (if `request`) and `tokens` tokens.
    pub(crate) fn refund(&self, request: bool, tokens: u64, now: u64) {
        if request {
            if let Some(bucket) = &self.requests {
                bucket.refund_at(1, now);
            }
        }
        if tokens != 0 {
            if let Some(bucket) = &self.tokens {
                bucket.refund_at(tokens, now);
            }
        }
    }
}

/// One rate limit's state, as OpenAI's `x-ratelimit-limit-*`, `x-ratelimit-remaining-*` and
/// `x-ratelimit-reset-*` response headers report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct RateStatus {
    /// The most the bucket holds (its burst).
    pub limit: u64,
    /// What could be taken now.
    pub remaining: u64,
    /// Time until the bucket is full again, if nothing more is taken.
    pub reset: Duration,
}

/// The request-rate and token-rate limits that apply to a request, each the more constraining of the
/// global bucket and the tenant's own (`None` where no such rate is configured). See
/// [`Admission::rate_status`](crate::Admission::rate_status).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct RateLimitStatus {
    /// Requests per second.
    pub requests: Option<RateStatus>,
    /// LLM tokens per second.
    pub tokens: Option<RateStatus>,
}

impl<C: Clock> Rates<C> {
    /// The state of both buckets at `now`.
    pub(crate) fn status(&self, now: u64) -> RateLimitStatus {
        RateLimitStatus {
            requests: self.requests.as_ref().map(|b| status(b, now)),
            tokens: self.tokens.as_ref().map(|b| status(b, now)),
        }
    }
}

impl RateLimitStatus {
    /// Combines two views, keeping for each rate the one with less remaining.
    pub(crate) fn tighter(self, other: RateLimitStatus) -> RateLimitStatus {
        let pick = |a: Option<RateStatus>, b: Option<RateStatus>| match (a, b) {
            (Some(a), Some(b)) => Some(if b.remaining < a.remaining { b } else { a }),
            (a, b) => a.or(b),
        };
        RateLimitStatus { requests: pick(self.requests, other.requests), tokens: pick(self.tokens, other.tokens) }
    }
}

fn status<C: Clock>(bucket: &TokenBucket<C>, now: u64) -> RateStatus {
    let limit = bucket.burst();
    RateStatus {
        limit,
        remaining: bucket.available_at(now),
        reset: bucket.time_until_available_at(limit, now).unwrap_or(Duration::ZERO),
    }
}

/// Names the setting in a bucket's rate error.
pub(crate) fn rename_rate(error: ConfigError, what: &'static str) -> ConfigError {
    match error {
        ConfigError::InvalidRate { value, min, max, .. } => ConfigError::InvalidRate { what, value, min, max },
        other => other,
    }
}

/// Time until `bucket` holds `n` tokens, from its current level and rate (an estimate used only to
/// combine two rate hints).
fn time_until_available<C: Clock>(bucket: &TokenBucket<C>, n: u64, now: u64) -> Duration {
    let available = bucket.available_at(now);
    if available >= n {
        return Duration::ZERO;
    }
    let missing = (n - available) as f64;
    nanos_to_duration((missing / bucket.rate() * 1e9).ceil().min(u64::MAX as f64) as u64)
}
