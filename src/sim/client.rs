//! How clients behave when refused or kept waiting: how long they wait for a first token, and how they
//! retry.
//!
//! A client makes at most [`ClientPolicy::max_tries`] tries of one request, and its user gives up
//! altogether when no first token came within [`ClientPolicy::give_up_after`] of the first try. A try
//! ends badly when the gate or the engine refuses it (429/503, with or without a `Retry-After` hint) or
//! when no first token came within [`ClientPolicy::first_token_timeout`] (the client then cancels it,
//! which frees whatever it held, as vLLM aborts a request whose connection closed). After a bad try, the
//! [`RetryKind`] says how long to wait; a refusal that retrying cannot cure (413, 400) ends the request
//! at once, and so does a wait that would end after the user gave up.

use crate::error::ConfigError;
use crate::retry::{RetryPolicy, SplitMix64};
use std::time::Duration;

/// The gap before an immediate retry: one round trip on a local network.
pub const IMMEDIATE_RETRY_GAP: Duration = Duration::from_millis(1);

/// A retry schedule.
///
/// The last two honour a server's `Retry-After` through [`kvgate::retry`](crate::retry): exponential
/// backoff waits `max(hint, window)`, full jitter `hint + uniform(0, window)`, where
/// `window = min(cap, base · 2^retry)` is [`RetryPolicy::window`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryKind {
    /// Never retry.
    None,
    /// Retry after [`IMMEDIATE_RETRY_GAP`], whatever the server said.
    Immediate,
    /// Retry after a fixed delay, whatever the server said.
    Fixed(Duration),
    /// Exponential backoff without jitter: `max(hint, min(cap, base · 2^retry))`.
    Exponential {
        /// First window.
        base: Duration,
        /// Largest window.
        cap: Duration,
    },
    /// Full jitter from [`kvgate::retry`](crate::retry): `hint + uniform(0, min(cap, base · 2^retry))`.
    FullJitter {
        /// First window.
        base: Duration,
        /// Largest window.
        cap: Duration,
    },
}

impl RetryKind {
    /// A short name for tables and plots.
    pub fn label(&self) -> &'static str {
        match self {
            RetryKind::None => "no retry",
            RetryKind::Immediate => "immediate",
            RetryKind::Fixed(_) => "fixed delay",
            RetryKind::Exponential { .. } => "exponential",
            RetryKind::FullJitter { .. } => "full jitter",
        }
    }
}

/// What every client of a scenario does.
///
/// # Examples
///
/// ```
/// use kvgate::sim::{ClientPolicy, RetryKind};
/// use std::time::Duration;
///
/// let client = ClientPolicy::new(RetryKind::FullJitter {
///     base: Duration::from_millis(250),
///     cap: Duration::from_secs(8),
/// });
/// assert_eq!(client.max_tries, 5);
/// client.validate()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientPolicy {
    /// The retry schedule.
    pub retry: RetryKind,
    /// Tries of one request, the first included (at least 1).
    pub max_tries: u32,
    /// How long a try may go without a first token before the client cancels it.
    pub first_token_timeout: Duration,
    /// How long the user waits for a first token in all, from the first try: no try starts after it,
    /// and a try still without a first token then is cancelled.
    pub give_up_after: Duration,
}

impl ClientPolicy {
    /// `retry`, at most 5 tries, cancelling a try after 30 s without a first token, giving up after
    /// 60 s without one.
    pub fn new(retry: RetryKind) -> Self {
        Self {
            retry,
            max_tries: 5,
            first_token_timeout: Duration::from_secs(30),
            give_up_after: Duration::from_secs(60),
        }
    }

    /// Full jitter with a 250 ms base and an 8 s cap (the default of the scenarios).
    pub fn full_jitter() -> Self {
        Self::new(RetryKind::FullJitter { base: Duration::from_millis(250), cap: Duration::from_secs(8) })
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for zero tries or a zero timeout or patience, [`ConfigError::Conflict`] for a backoff
    /// whose cap is below its base or whose base is zero.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_tries == 0 {
            return Err(ConfigError::Zero { what: "client max_tries" });
        }
        if self.first_token_timeout.is_zero() {
            return Err(ConfigError::Zero { what: "client first-token timeout" });
        }
        if self.give_up_after.is_zero() {
            return Err(ConfigError::Zero { what: "client give_up_after" });
        }
        if let RetryKind::Exponential { base, cap } | RetryKind::FullJitter { base, cap } = self.retry {
            if base.is_zero() || cap < base {
                return Err(ConfigError::Conflict(format!(
                    "backoff base {base:?} and cap {cap:?}: use a base above 0 and a cap at least the base"
                )));
            }
        }
        Ok(())
    }

    /// The wait before the next try, after `tries` tries failed (the last with the server's `hint`), or
    /// `None` to give up.
    pub(crate) fn delay(&self, tries: u32, hint: Option<Duration>, rng: &mut SplitMix64) -> Option<Duration> {
        if tries >= self.max_tries {
            return None;
        }
        let retry = tries.saturating_sub(1);
        match self.retry {
            RetryKind::None => None,
            RetryKind::Immediate => Some(IMMEDIATE_RETRY_GAP),
            RetryKind::Fixed(delay) => Some(delay),
            RetryKind::Exponential { base, cap } => {
                let window = RetryPolicy::new().base(base).cap(cap).window(retry);
                Some(hint.map_or(window, |hint| hint.max(window)))
            }
            RetryKind::FullJitter { base, cap } => {
                RetryPolicy::new().base(base).cap(cap).max_tries(self.max_tries).delay(retry, hint, rng)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_follow_their_definitions() {
        let mut rng = SplitMix64::new(1);
        let ms = Duration::from_millis;
        let mut client = ClientPolicy::new(RetryKind::Exponential { base: ms(100), cap: ms(1000) });
        client.max_tries = 10;
        assert_eq!(client.delay(1, None, &mut rng), Some(ms(100)));
        assert_eq!(client.delay(3, None, &mut rng), Some(ms(400)));
        assert_eq!(client.delay(3, Some(ms(700)), &mut rng), Some(ms(700)));
        assert_eq!(client.delay(9, None, &mut rng), Some(ms(1000)));
        assert_eq!(client.delay(10, None, &mut rng), None);
        client.retry = RetryKind::FullJitter { base: ms(100), cap: ms(1000) };
        for tries in 1..10 {
            let d = client.delay(tries, Some(ms(50)), &mut rng).unwrap();
            assert!(d >= ms(50) && d <= ms(1050));
        }
        assert_eq!(client.delay(10, None, &mut rng), None);
        client.retry = RetryKind::None;
        assert_eq!(client.delay(1, None, &mut rng), None);
        client.retry = RetryKind::Immediate;
        assert_eq!(client.delay(1, Some(ms(900)), &mut rng), Some(IMMEDIATE_RETRY_GAP));
    }

    #[test]
    fn bad_settings_are_refused() {
        let mut client = ClientPolicy::full_jitter();
        client.max_tries = 0;
        assert!(client.validate().is_err());
        let mut client = ClientPolicy::full_jitter();
        client.first_token_timeout = Duration::ZERO;
        assert!(client.validate().is_err());
        let client =
            ClientPolicy::new(RetryKind::FullJitter { base: Duration::from_secs(2), cap: Duration::from_secs(1) });
        assert!(client.validate().is_err());
    }
}
