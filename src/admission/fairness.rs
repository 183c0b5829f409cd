//! How waiting requests of different tenants share the server within a priority class.

use crate::error::ConfigError;

/// Virtual counters advance by `cost × COUNTER_SCALE / weight`, so that weights divide costs in integers.
const COUNTER_SCALE: u64 = 1024;

/// The fairness policy of the waiting room (set with
/// [`AdmissionBuilder::fairness`](crate::AdmissionBuilder::fairness)).
///
/// - [`Fairness::Requests`] (the default): weighted round-robin by requests. A tenant of weight `w` gets
///   `w` grants per turn, whatever their size — simple and cheap, but a tenant sending 8,000-token
///   documents gets as many grants as one sending 200-token questions, forty times the GPU.
/// - [`Fairness::Tokens`]: a virtual token counter per tenant, in the spirit of the Virtual Token Counter
///   scheduler (Sheng et al., OSDI '24). A granted request charges its tenant
///   `prompt_weight × prompt_tokens + output_weight × max_new_tokens` divided by the tenant's weight;
///   [`Permit::complete`](crate::Permit::complete) refunds the output it did not produce. The waiting
///   flow with the smallest counter is served next, and a tenant that comes back from idle is lifted to
///   the smallest counter of those still waiting (or the class's last served level), so it cannot bank
///   credit while away.
///
/// **Bound (tokens)**: between two tenants that both have requests waiting in a class, the difference of
/// their counters never exceeds the largest charge of one request (its weighted cost over its tenant's
/// weight) — what one grant can add — plus the refunds of completions; so over any period both are
/// backlogged, the tokens served to them follow their weights up to that one-request difference
/// (`tests/admission_fairness.rs` checks it).
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Fairness};
///
/// let admission = Admission::builder().max_in_flight(32).fairness(Fairness::tokens()).build()?;
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fairness {
    /// Weighted round-robin counting requests.
    #[default]
    Requests,
    /// Virtual token counters: tenants are charged the tokens they are served.
    Tokens {
        /// Cost of one prompt token (default 1).
        prompt_weight: u32,
        /// Cost of one output token (default 2: decoding a token costs the GPU more than prefilling one).
        output_weight: u32,
    },
}

impl Fairness {
    /// [`Fairness::Tokens`] with prompt tokens weighing 1 and output tokens 2.
    pub const fn tokens() -> Self {
        Fairness::Tokens { prompt_weight: 1, output_weight: 2 }
    }

    /// The weighted token cost of a request (0 for request-count fairness).
    #[inline]
    pub(crate) fn cost(&self, prompt_tokens: u32, max_new_tokens: u32) -> u64 {
        match *self {
            Fairness::Requests => 0,
            Fairness::Tokens { prompt_weight, output_weight } => u64::from(prompt_weight)
                .saturating_mul(u64::from(prompt_tokens))
                .saturating_add(u64::from(output_weight).saturating_mul(u64::from(max_new_tokens))),
        }
    }

    /// The weighted cost of `unused` output tokens, refunded on completion.
    #[inline]
    pub(crate) fn output_cost(&self, unused: u64) -> u64 {
        match *self {
            Fairness::Requests => 0,
            Fairness::Tokens { output_weight, .. } => u64::from(output_weight).saturating_mul(unused),
        }
    }

    /// Counter units a tenant of `weight` is charged for a weighted cost `cost`.
    #[inline]
    pub(crate) fn counter_units(cost: u64, weight: u32) -> u64 {
        cost.saturating_mul(COUNTER_SCALE) / u64::from(weight.max(1))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if let Fairness::Tokens { prompt_weight, output_weight } = *self {
            if prompt_weight == 0 && output_weight == 0 {
                return Err(ConfigError::Zero { what: "token fairness weights (prompt and output both)" });
            }
        }
        Ok(())
    }
}
