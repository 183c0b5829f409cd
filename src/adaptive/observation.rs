//! What the application reports about each admitted request: when its first token left, when its last
//! token left, or that it left before its first token.

use crate::Permit;
use std::time::Duration;

/// One event in the life of an admitted request, reported to
/// [`AdaptiveConcurrency::observe`](super::AdaptiveConcurrency::observe).
///
/// Every time is a reading of the admission's clock, as a [`Duration`] since the clock's origin (what
/// [`Permit::admitted_at_nanos`] and `Duration::from_nanos(admission.clock().now_nanos())` give).
///
/// # Examples
///
/// ```
/// use kvgate::adaptive::Observation;
/// use kvgate::clock::{Clock, ManualClock};
/// use kvgate::{Admission, Request};
/// use std::time::Duration;
///
/// let clock = ManualClock::new();
/// let admission = Admission::builder().clock(clock.clone()).build()?;
/// let permit = admission.try_admit(&Request::new(800, 256)).unwrap();
/// clock.advance(Duration::from_millis(120));
/// let now = Duration::from_nanos(clock.now_nanos());
/// let first = Observation::first_token(&permit, now);
/// assert_eq!(first, Observation::FirstToken { prompt_tokens: 800, admitted_at: Duration::ZERO, at: now });
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observation {
    /// The request's first token was sent: its time to first token (from admission) is
    /// `at − admitted_at`.
    FirstToken {
        /// The request's prompt tokens.
        prompt_tokens: u32,
        /// When it was admitted.
        admitted_at: Duration,
        /// When its first token was sent.
        at: Duration,
    },
    /// The request's last token was sent: its time per output token is
    /// `(at − first_token_at) / (output_tokens − 1)`.
    Finished {
        /// Tokens it generated.
        output_tokens: u32,
        /// When its first token was sent.
        first_token_at: Duration,
        /// When its last token was sent.
        at: Duration,
    },
    /// The request ended before its first token (the client went away or timed out, the engine
    /// failed): its time to first token is *at least* `at − admitted_at`, and counts as that.
    Abandoned {
        /// The request's prompt tokens.
        prompt_tokens: u32,
        /// When it was admitted.
        admitted_at: Duration,
        /// When it ended.
        at: Duration,
    },
}

impl Observation {
    /// The first token of the request holding `permit` was sent at `at`.
    pub fn first_token(permit: &Permit, at: Duration) -> Self {
        Observation::FirstToken {
            prompt_tokens: permit.prompt_tokens(),
            admitted_at: Duration::from_nanos(permit.admitted_at_nanos()),
            at,
        }
    }

    /// The request whose first token was sent at `first_token_at` sent its last at `at`, having generated
    /// `output_tokens`.
    pub fn finished(output_tokens: u32, first_token_at: Duration, at: Duration) -> Self {
        Observation::Finished { output_tokens, first_token_at, at }
    }

    /// The request holding `permit` ended at `at` without a first token.
    pub fn abandoned(permit: &Permit, at: Duration) -> Self {
        Observation::Abandoned {
            prompt_tokens: permit.prompt_tokens(),
            admitted_at: Duration::from_nanos(permit.admitted_at_nanos()),
            at,
        }
    }
}
