//! How the waiting room orders and bounds its waits: first-in first-out, or controlled delay.
//!
//! A queue is good when it absorbs a burst and drains, and bad when it *stands*: every request then waits
//! about as long as the queue is deep, and under sustained overload that is until its user has given up,
//! while the engine works on answers nobody reads. [`WaitPolicy::ControlledDelay`] tells the two apart the
//! way Facebook's controlled-delay queues do (a CoDel variant, RFC 8289's idea of judging a queue by the
//! time spent in it rather than by its length): a priority class's queue *stands* once it has not been
//! empty for `interval`. While it stands:
//! - the newest waiter of a flow is served first (adaptive LIFO): its user is still there;
//! - waits are short: a new arrival's longest wait is `target`, and the deadline timer's expiry ends
//!   the waiters that have waited `target` or longer, and a full queue's oldest waiter gives its place to
//!   a newcomer that still waits after the enqueue's pass: each leaves [`Rejection::NoCapacity`] with a
//!   `Retry-After` of the time to the next release (a standing queue serves the newest first, so a client
//!   that comes back then is served before the older waiters), counted in `Snapshot::shed`. While a class
//!   stands and the timer runs (some waiter has a deadline — every arrival in a standing class has one),
//!   it looks every `target / 2` at most (with a `ManualClock`, [`Admission::expire_waiters`] does it). A
//!   waiter queued before its class stood, without a deadline of its own, leaves at the next expiry;
//! - a start prediction (`Request::ttft_deadline`) counts only the waiters of higher classes as ahead of
//!   a request whose class stands (it would be served first);
//! - a waiter of a flow without a tenant that fits may pass a newer one of its flow that does not fit the
//!   global capacity (the queue is out of arrival order already; at most 8 are tried per pass);
//! - the order *between* flows (tenants) and classes is the fair queue's, as in FIFO mode.
//!
//! The moment the class's queue is empty — or holds only waiters parked on their own tenant's limits,
//! which wait for their tenant, not for the server — it is back to FIFO with the full wait. Parked
//! waiters are never shed by the policy.
//!
//! [`Rejection::NoCapacity`]: crate::Rejection::NoCapacity
//!
//! # Invariants
//! 1. The policy changes only *which* waiter of the chosen flow a pass grants and how long waits last;
//!    what is taken and returned (conservation), the priority order, the fair order between flows, the
//!    no-overtaking rule for new requests (`try_admit` included) and linearizable close are the same in
//!    both modes.
//! 2. In [`WaitPolicy::Fifo`] mode, and in controlled-delay mode while no class stands, waiters of a flow
//!    are granted in arrival order (every FIFO guarantee of the README holds there).
//! 3. Work stays bounded: an expiry ends the over-age waiters from the oldest end of each flow of a
//!    standing class (O(1) per waiter ended, O(flows) per standing class); a pass does no more work than
//!    in FIFO mode (the newest waiter of a flow is as near as its oldest).
//!
//! [`Admission::expire_waiters`]: crate::Admission::expire_waiters

use crate::error::ConfigError;
use std::time::Duration;

/// Default `target` of [`WaitPolicy::ControlledDelay`]: the longest wait while a queue stands.
pub const DEFAULT_DELAY_TARGET: Duration = Duration::from_millis(500);
/// Default `interval` of [`WaitPolicy::ControlledDelay`]: how long a queue stays non-empty before it counts
/// as standing.
pub const DEFAULT_DELAY_INTERVAL: Duration = Duration::from_secs(1);

/// How the waiting room orders and bounds its waits (set with
/// [`AdmissionBuilder::wait_policy`](crate::AdmissionBuilder::wait_policy)).
///
/// A queue is good when it absorbs a burst and drains, and bad when it *stands*: every request then waits
/// about as long as the queue is deep — under sustained overload, until its user has given up. With
/// [`WaitPolicy::ControlledDelay`] a priority class's queue stands once it has not been empty for
/// `interval` (waiters parked on their own tenant's limits do not count; they are never shed). While it
/// stands, in that class:
/// - the newest waiter of a flow is served first (adaptive LIFO); the order between tenants and between
///   classes is the fair queue's, as in FIFO mode;
/// - a new arrival waits at most `target`; older waiters leave at the next expiry, and a full queue's
///   oldest waiter (of the longest flows, by age) gives its place to a newcomer that still waits after the
///   enqueue's pass: each resolves [`Rejection::NoCapacity`](crate::Rejection::NoCapacity) with the time to
///   the next release as its hint, counted in [`Snapshot::shed`](crate::Snapshot::shed);
/// - a waiter of a flow without a tenant that fits may pass a newer one that does not fit the global
///   capacity (at most 8 are tried per pass);
/// - a start prediction counts only the higher classes as ahead of a new request.
///
/// Once the class's queue is empty (or holds only parked waiters) it is FIFO with the full wait again.
/// [`WaitPolicy::Fifo`] keeps FIFO under any load.
///
/// The default is [`WaitPolicy::controlled_delay`]: a 500-ms target and a 1-s interval. The overload lab
/// (`cargo run --release --example overload`) chose them: an LLM request holds its slot for seconds, so a
/// queue that a burst fills drains within a second or two when the engine keeps up, and one that has not
/// been empty for a second while the engine is full is the standing queue of sustained overload. Half a
/// second of waiting leaves a request most of a 2-s time-to-first-token target for its prefill.
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, WaitPolicy};
/// use std::time::Duration;
///
/// // The default: controlled delay.
/// let admission = Admission::builder().max_in_flight(8).queue_capacity(64).build()?;
/// // First-in first-out with the full wait, whatever the load.
/// let fifo = Admission::builder().max_in_flight(8).wait_policy(WaitPolicy::Fifo).build()?;
/// // A tighter target.
/// let tight = Admission::builder()
///     .max_in_flight(8)
///     .wait_policy(WaitPolicy::ControlledDelay {
///         target: Duration::from_millis(200),
///         interval: Duration::from_millis(500),
///     })
///     .build()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPolicy {
    /// First-in first-out within each flow, every wait up to its full limit.
    Fifo,
    /// FIFO while the queue drains; adaptive LIFO and at most `target` of waiting once it has not been empty
    /// for `interval`.
    ControlledDelay {
        /// The longest wait while the queue stands (`> 0`, at most an hour).
        target: Duration,
        /// How long the queue must stay non-empty to count as standing (`> 0`, at most an hour).
        interval: Duration,
    },
}

impl Default for WaitPolicy {
    fn default() -> Self {
        Self::controlled_delay()
    }
}

impl WaitPolicy {
    /// [`WaitPolicy::ControlledDelay`] with the default target (500 ms) and interval (1 s).
    pub const fn controlled_delay() -> Self {
        WaitPolicy::ControlledDelay { target: DEFAULT_DELAY_TARGET, interval: DEFAULT_DELAY_INTERVAL }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        const MAX: Duration = Duration::from_secs(3600);
        if let WaitPolicy::ControlledDelay { target, interval } = *self {
            for (what, value) in [("wait policy target", target), ("wait policy interval", interval)] {
                if value.is_zero() {
                    return Err(ConfigError::Zero { what });
                }
                if value > MAX {
                    return Err(ConfigError::OutOfRange {
                        what,
                        reason: format!("{value:?}; use at most an hour (controlled delay judges a queue in seconds)"),
                    });
                }
            }
        }
        Ok(())
    }

    /// The controlled-delay parameters in clock nanoseconds (`None` for FIFO).
    pub(crate) fn delay(&self) -> Option<Delay> {
        match *self {
            WaitPolicy::Fifo => None,
            WaitPolicy::ControlledDelay { target, interval } => Some(Delay {
                target: crate::clock::duration_to_nanos(target),
                interval: crate::clock::duration_to_nanos(interval),
            }),
        }
    }
}

/// [`WaitPolicy::ControlledDelay`] in clock nanoseconds, as the waiting room uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delay {
    pub(crate) target: u64,
    pub(crate) interval: u64,
}

impl Delay {
    /// Whether a queue non-empty since `since` stands at `now`.
    #[inline]
    pub(crate) fn stands(&self, since: Option<u64>, now: u64) -> bool {
        since.is_some_and(|since| now.saturating_sub(since) >= self.interval)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn bad_parameters_are_configuration_errors() {
        let at = |target, interval| WaitPolicy::ControlledDelay { target, interval }.validate();
        assert_eq!(at(Duration::ZERO, Duration::from_secs(1)), Err(ConfigError::Zero { what: "wait policy target" }));
        assert_eq!(at(Duration::from_secs(1), Duration::ZERO), Err(ConfigError::Zero { what: "wait policy interval" }));
        assert!(matches!(at(Duration::from_secs(1), Duration::MAX), Err(ConfigError::OutOfRange { .. })));
        assert_eq!(WaitPolicy::default().validate(), Ok(()));
        assert_eq!(WaitPolicy::Fifo.delay(), None);
    }

    #[test]
    fn a_queue_stands_once_it_was_not_empty_for_the_interval() {
        let delay = WaitPolicy::controlled_delay().delay().unwrap();
        assert!(!delay.stands(None, u64::MAX));
        assert!(!delay.stands(Some(10), 10 + delay.interval - 1));
        assert!(delay.stands(Some(10), 10 + delay.interval));
        // A clock that stepped back does not make a queue stand.
        assert!(!delay.stands(Some(10), 0));
    }
}
