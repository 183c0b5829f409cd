//! A request rate and an LLM-token rate, charged together all or nothing — the admission's global pair
//! and each tenant's own — and the record of what was charged, so that every refund returns exactly that.

use super::promise::{Promise, spacing};
use crate::bucket::{AcquireError, TokenBucket};
use crate::clock::Clock;
use crate::error::ConfigError;
use std::time::Duration;

/// Why a charge was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateRefusal {
    /// Not now: the earliest time both rates would let the request through, and one request's worth of
    /// the rate that refused it (what a [`Promise`] spaces hints by).
    NotYet { wait: Duration, spacing: Duration },
    /// Never: more tokens than the token rate's burst.
    NeverFits { requested: u64, burst: u64 },
}

/// What one pair of buckets was charged for one request: one request (if it has a request rate) and the
/// tokens taken from its token rate (0 without one). Refunds return exactly this, never more.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Charge {
    pub(crate) request: bool,
    pub(crate) tokens: u64,
}

/// What a request was charged: the global buckets and its tenant's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Charges {
    pub(crate) global: Charge,
    pub(crate) tenant: Charge,
}

impl Charge {
    /// The part of the token charge that `unused` unused output tokens give back (never more than was
    /// charged).
    #[inline]
    pub(crate) fn unused_tokens(self, unused: u64) -> Charge {
        Charge { request: false, tokens: self.tokens.min(unused) }
    }
}

/// Optional request-rate and token-rate buckets, and the hints promised to the requests they refused.
#[derive(Debug)]
pub(crate) struct Rates<C: Clock> {
    pub(crate) requests: Option<TokenBucket<C>>,
    pub(crate) tokens: Option<TokenBucket<C>>,
    /// Staggers the hints of refusals (see `promise.rs`).
    pub(crate) promise: Promise,
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
        Ok(Self { requests: bucket(requests, names.0)?, tokens: bucket(tokens, names.1)?, promise: Promise::default() })
    }

    /// Whether any rate is configured.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none()
    }

    /// The token rate's burst, if there is a token rate.
    #[inline]
    pub(crate) fn token_burst(&self) -> Option<u64> {
        self.tokens.as_ref().map(TokenBucket::burst)
    }

    /// Charges one request and `total` tokens at `now`, all or nothing, and says what was charged.
    #[inline(always)]
    pub(crate) fn charge(&self, total: u64, now: u64) -> Result<Charge, RateRefusal> {
        if let Some(requests) = &self.requests {
            if let Err(err) = requests.try_acquire_at(1, now) {
                // The lifetime allowance is spent: it can never pass again (no hint).
                if let AcquireError::NeverFits { requested, burst } = err {
                    return Err(RateRefusal::NeverFits { requested, burst });
                }
                let token_wait = self.token_wait(total, now);
                let wait = err.retry_after().unwrap_or(Duration::ZERO).max(token_wait);
                let mut spacing = spacing(1, requests.rate());
                if let (false, Some(tokens)) = (token_wait.is_zero(), &self.tokens) {
                    spacing = spacing.max(self::spacing(total, tokens.rate()));
                }
                return Err(RateRefusal::NotYet { wait: wait.max(Duration::from_nanos(1)), spacing });
            }
        }
        let request = self.requests.is_some();
        let Some(tokens) = &self.tokens else { return Ok(Charge { request, tokens: 0 }) };
        match tokens.try_acquire_at(total, now) {
            Ok(()) => Ok(Charge { request, tokens: total }),
            Err(err) => {
                if let Some(requests) = &self.requests {
                    requests.refund_at(1, now);
                }
                Err(match err {
                    AcquireError::NotYet { retry_after } => {
                        // Each promised client also needs a request token: spaced by both rates.
                        let per_request = self.requests.as_ref().map_or(Duration::ZERO, |r| spacing(1, r.rate()));
                        RateRefusal::NotYet {
                            wait: retry_after,
                            spacing: spacing(total, tokens.rate()).max(per_request),
                        }
                    }
                    AcquireError::NeverFits { requested, burst } => RateRefusal::NeverFits { requested, burst },
                })
            }
        }
    }

    /// The exact time until both buckets would let one request of `total` tokens through, without charging
    /// (zero if now; `Duration::MAX` if it can never fit).
    pub(crate) fn wait(&self, total: u64, now: u64) -> Duration {
        let requests = self.requests.as_ref().map_or(Ok(Duration::ZERO), |b| b.time_until_available_at(1, now));
        requests.unwrap_or(Duration::MAX).max(self.token_wait(total, now))
    }

    fn token_wait(&self, total: u64, now: u64) -> Duration {
        self.tokens.as_ref().map_or(Duration::ZERO, |b| b.time_until_available_at(total, now).unwrap_or(Duration::MAX))
    }

    /// Gives back exactly `charge`.
    pub(crate) fn refund(&self, charge: Charge, now: u64) {
        if charge.request {
            if let Some(bucket) = &self.requests {
                bucket.refund_at(1, now);
            }
        }
        if charge.tokens != 0 {
            if let Some(bucket) = &self.tokens {
                bucket.refund_at(charge.tokens, now);
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
