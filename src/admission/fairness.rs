//! How waiting requests of different tenants share the server within a priority class.

use super::request::Priority;
use crate::error::ConfigError;
use crate::sync::{AtomicU64, Ordering};

/// Virtual counters advance by `cost × COUNTER_SCALE / weight`, so that weights divide costs in integers.
/// With weights at most [`MAX_WEIGHT`] (= `COUNTER_SCALE`), a grant of cost `c > 0` advances its tenant's
/// counter by at least `c` units: a charge never rounds to zero, and rounding loses less than one unit in
/// `c`.
const COUNTER_SCALE: u64 = 1 << 16;

/// The largest tenant weight ([`TenantLimits::MAX_WEIGHT`](crate::TenantLimits::MAX_WEIGHT)): 65,536.
pub(crate) const MAX_WEIGHT: u32 = 1 << 16;

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
/// Grants that never waited ([`Admission::try_admit`](crate::Admission::try_admit), or `admit` with
/// capacity free) charge the counters too, and raise the class's *service level*: the largest counter at
/// which a request of the class was granted, by either path. A tenant that starts waiting when nobody of
/// its class waits joins at that level (VTC's "lift"), so a newcomer cannot claim the service that others
/// were given directly while it was away.
///
/// **Bound (tokens)**: take two tenants `a` and `b` whose flows are both eligible in one class over a
/// period in which neither counter changes for any other reason (a grant in another class or one that
/// never waited, a completion's refund, a lift on entering another class: counters are per tenant, shared
/// by its classes). Over that period `a`'s counter gets ahead of `b`'s by at most the larger of how far
/// ahead it was at the start and one of `a`'s own charges — `c / w` for a request of weighted cost `c` of a
/// tenant of weight `w`: `a` is served only while its counter is the smallest. So the weighted tokens they
/// are served, `S / w`, differ by at most one request's charge plus their counters' difference at the
/// start (`tests/admission_fairness.rs` and the model-based test, which checks it after every step, with
/// weights from 1 to the maximum). Weights are
/// `1..=`[`TenantLimits::MAX_WEIGHT`](crate::TenantLimits::MAX_WEIGHT), checked when the admission is
/// built.
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

    /// Counter units a tenant of `weight` (`1..=MAX_WEIGHT`) is charged for a weighted cost `cost`: at
    /// least `cost`, so never zero for a non-zero cost.
    #[inline]
    pub(crate) fn counter_units(cost: u64, weight: u32) -> u64 {
        cost.saturating_mul(COUNTER_SCALE) / u64::from(weight.clamp(1, MAX_WEIGHT))
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

/// The service level of each priority class under token fairness: the largest virtual counter at which a
/// request of the class was granted directly (without waiting). Written without a lock by `try_admit`
/// (one `fetch_max`, only under token fairness and for a request of a tenant); read by the waiting room
/// when a flow becomes eligible with no other flow waiting (its counter is lifted to at least this).
#[derive(Debug)]
pub(crate) struct ServiceLevels([AtomicU64; Priority::COUNT]);

impl Default for ServiceLevels {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl ServiceLevels {
    /// A request of `class` was granted directly at counter `served_at` (its tenant's before the charge).
    #[inline]
    pub(crate) fn served(&self, class: usize, served_at: u64) {
        self.0[class].fetch_max(served_at, Ordering::Relaxed);
    }

    /// The level of `class`.
    pub(crate) fn get(&self, class: usize) -> u64 {
        self.0[class].load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_charge_never_rounds_to_zero() {
        for weight in [1, 2, 1000, 1024, 1025, 4096, MAX_WEIGHT] {
            for cost in [1, 2, 3, 999, 1_000_000] {
                let units = Fairness::counter_units(cost, weight);
                assert!(units >= cost, "cost {cost} weight {weight}: {units}");
            }
        }
        // Weights above the maximum are refused at build time; a stray one is treated as the maximum.
        assert_eq!(Fairness::counter_units(1, u32::MAX), 1);
        assert_eq!(Fairness::counter_units(u64::MAX, 1), u64::MAX);
    }
}
