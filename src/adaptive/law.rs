//! The control law: from what a decision measured, the next limit.
//!
//! A pure function of its inputs (no clock, no admission), so that its properties are tested directly:
//!
//! - the result stays within the configured bounds, whatever the inputs;
//! - a TTFT load above 1 lowers the limit — from the concurrency actually in flight when that is below
//!   the limit (lowering a limit that does not bind changes nothing) — by at least one (unless at the
//!   minimum) and to no less than `max_backoff` of it;
//! - a TTFT load in `[tolerance, 1]` holds the limit; so does a TPOT load of at least `tolerance` (the
//!   time per output token lags, and has a floor set by prefills interleaved with decoding that no limit
//!   removes, so it may stop growth but never causes a decrease), and so does slack while the limit is
//!   not in use;
//! - slack raises it by at least one (unless at the maximum), by at most `max_growth`, and by at most
//!   `max_step` (the burst budget: the requests whose prefills fit in part of the target, since a raised
//!   limit admits them all at once);
//! - for `ceiling_ttl` after a miss, the limit stays below the ceiling (the concurrency at which the
//!   target was missed) — unless five decisions in a row just below it find both loads under half the
//!   tolerance (the miss was a burst, not the knee); from 90 % of the ceiling up to 1.5 × it, it grows by
//!   about 2 % a decision — also afterwards, so that re-probing the knee is as careful as approaching it.

use super::config::AdaptiveConfig;
use super::decision::Reason;
use std::time::Duration;

/// The concurrency at which the target was last missed, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ceiling {
    pub(crate) limit: usize,
    pub(crate) at: Duration,
    /// Decisions in a row held just below it with both loads under half the tolerance: the miss was a
    /// transient (a burst), not the knee. At [`QUIET_DECISIONS`] it stops binding.
    pub(crate) quiet: u32,
}

/// Quiet decisions just below a ceiling after which it stops binding before its time to live.
pub(crate) const QUIET_DECISIONS: u32 = 5;

/// What one decision measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Inputs {
    /// The TTFT quantile over its target (0 when every sample was instant; NaN or infinite: treat as
    /// far over).
    pub(crate) load: f64,
    /// The TPOT quantile over its target (0 without one).
    pub(crate) tpot_load: f64,
    /// Requests in flight.
    pub(crate) in_flight: usize,
    /// The largest increase allowed (the burst budget), at least 1.
    pub(crate) max_step: usize,
}

/// The next limit after `limit`, given what the decision measured. Updates the remembered `ceiling`.
pub(crate) fn next_limit(
    config: &AdaptiveConfig,
    limit: usize,
    inputs: Inputs,
    ceiling: &mut Option<Ceiling>,
    now: Duration,
) -> (usize, Reason) {
    let (min, max) = (config.min_limit, config.max_limit);
    let limit = limit.clamp(min, max);
    let Inputs { load, tpot_load, in_flight, max_step } = inputs;
    if load > 1.0 || load.is_nan() {
        let base = limit.min(in_flight).max(min);
        let factor = if load.is_nan() { config.max_backoff } else { (1.0 / load).max(config.max_backoff) };
        let down = ((base as f64 * factor).floor() as usize).min(base.saturating_sub(1));
        *ceiling = Some(Ceiling { limit: base, at: now, quiet: 0 });
        return (down.clamp(min, max), Reason::OverTarget);
    }
    // A ceiling binds for its time to live; after it, it only slows growth near it, until the limit
    // has grown well past it (the knee moved).
    if ceiling.is_some_and(|c| limit >= c.limit.saturating_add(c.limit / 2)) {
        *ceiling = None;
    }
    let quiet = load < config.tolerance / 2.0 && tpot_load < config.tolerance;
    if let Some(c) = ceiling.as_mut() {
        let near = limit.saturating_mul(20) >= c.limit.saturating_mul(19);
        c.quiet = if quiet && near { c.quiet.saturating_add(1) } else { 0 };
    }
    let binding = ceiling.is_some_and(|c| now.saturating_sub(c.at) < config.ceiling_ttl && c.quiet < QUIET_DECISIONS);
    if load >= config.tolerance {
        return (limit, Reason::InBand);
    }
    if tpot_load >= config.tolerance {
        return (limit, Reason::DecodeSlow);
    }
    if in_flight.saturating_mul(10) < limit.saturating_mul(9) {
        return (limit, Reason::NotLimited);
    }
    let factor = if load > 0.0 { (config.tolerance / load).min(config.max_growth) } else { config.max_growth };
    let step = max_step.max(1);
    let mut up = ((limit as f64 * factor).ceil() as usize).max(limit + 1).min(limit.saturating_add(step));
    if let Some(c) = *ceiling {
        if limit.saturating_mul(10) >= c.limit.saturating_mul(9) {
            // Probe carefully around the knee.
            up = up.min(limit + (limit / 50).max(1));
        }
        if binding {
            // Stay below where the target was missed.
            up = up.min(c.limit.saturating_sub(1)).max(limit);
        }
    }
    let up = up.clamp(min, max);
    let held_by_ceiling = up == limit && binding;
    (up, if held_by_ceiling { Reason::BelowCeiling } else { Reason::Slack })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config() -> AdaptiveConfig {
        AdaptiveConfig {
            min_limit: 2,
            max_limit: 1000,
            max_growth: 1.25,
            ..AdaptiveConfig::new(Duration::from_secs(2))
        }
    }

    /// A measurement with the limit in use.
    fn busy(load: f64, in_flight: usize) -> Inputs {
        Inputs { load, tpot_load: 0.0, in_flight, max_step: usize::MAX }
    }

    #[test]
    fn each_band_does_what_it_says() {
        let c = config();
        let t = Duration::from_secs(10);
        let mut ceiling = None;
        let next = |limit, inputs, ceiling: &mut Option<Ceiling>, now| next_limit(&c, limit, inputs, ceiling, now);
        assert_eq!(next(100, busy(0.9, 100), &mut ceiling, t), (100, Reason::InBand));
        assert_eq!(next(100, busy(0.1, 80), &mut ceiling, t), (100, Reason::NotLimited));
        assert_eq!(next(100, Inputs { tpot_load: 0.9, ..busy(0.1, 100) }, &mut ceiling, t), (100, Reason::DecodeSlow));
        assert_eq!(next(100, Inputs { tpot_load: 5.0, ..busy(0.1, 100) }, &mut ceiling, t).0, 100); // never down
        assert_eq!(next(100, busy(0.1, 100), &mut ceiling, t), (125, Reason::Slack));
        assert_eq!(next(100, busy(0.7, 100), &mut ceiling, t).0, 115); // 0.8 / 0.7
        assert_eq!(next(100, Inputs { max_step: 7, ..busy(0.1, 100) }, &mut ceiling, t).0, 107); // burst budget
        assert_eq!(ceiling, None);
        assert_eq!(next(100, busy(2.0, 100), &mut ceiling, t), (50, Reason::OverTarget));
        assert_eq!(ceiling, Some(Ceiling { limit: 100, at: t, quiet: 0 }));
        assert_eq!(next(100, busy(9.0, 100), &mut ceiling, t).0, 50); // at most halved
        assert_eq!(next(100, busy(1.001, 100), &mut ceiling, t).0, 99); // at least one less
        // A limit that does not bind is lowered from the concurrency in flight.
        assert_eq!(next(300, busy(1.25, 60), &mut ceiling, t), (48, Reason::OverTarget));
        assert_eq!(ceiling, Some(Ceiling { limit: 60, at: t, quiet: 0 }));
        assert_eq!(next(100, busy(2.0, 100), &mut ceiling, t).0, 50);
        // Back at full speed below 90 % of the ceiling, then 2 % a step, never up to the ceiling.
        assert_eq!(next(50, busy(0.1, 50), &mut ceiling, t).0, 63);
        assert_eq!(next(80, busy(0.1, 80), &mut ceiling, t).0, 99);
        assert_eq!(next(95, busy(0.1, 95), &mut ceiling, t).0, 96);
        assert_eq!(next(99, busy(0.5, 99), &mut ceiling, t), (99, Reason::BelowCeiling));
        // Quiet decisions just below it: the miss was a burst, and the ceiling stops binding.
        for _ in 0..QUIET_DECISIONS - 1 {
            assert_eq!(next(99, busy(0.1, 99), &mut ceiling, t), (99, Reason::BelowCeiling));
        }
        assert_eq!(next(99, busy(0.1, 99), &mut ceiling, t), (100, Reason::Slack));
        assert_eq!(next(100, busy(2.0, 100), &mut ceiling, t).0, 50);
        // After its time to live the ceiling stops binding, but growth near it stays careful.
        let later = t + Duration::from_secs(61);
        assert_eq!(next(99, busy(0.1, 99), &mut ceiling, later).0, 100);
        assert_eq!(next(140, busy(0.1, 140), &mut ceiling, later).0, 142);
        // Well past it, it is forgotten.
        assert_eq!(next(150, busy(0.1, 150), &mut ceiling, later).0, 188);
        assert_eq!(ceiling, None);
    }

    #[test]
    fn bounds_hold_at_the_edges() {
        let c = config();
        let mut ceiling = None;
        let z = Duration::ZERO;
        assert_eq!(next_limit(&c, 2, busy(5.0, 2), &mut ceiling, z).0, 2);
        assert_eq!(next_limit(&c, 1000, busy(0.0, 1000), &mut ceiling, z).0, 1000);
        assert_eq!(next_limit(&c, 5000, busy(0.9, 5000), &mut ceiling, z).0, 1000);
        assert_eq!(next_limit(&c, 10, busy(f64::NAN, 10), &mut ceiling, z), (5, Reason::OverTarget));
        assert_eq!(next_limit(&c, 10, busy(3.0, 0), &mut ceiling, z).0, 2); // nothing in flight: the minimum
        let mut ceiling = Some(Ceiling { limit: 11, at: z, quiet: 0 });
        assert_eq!(next_limit(&c, 10, busy(0.1, 10), &mut ceiling, z), (10, Reason::BelowCeiling));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn the_law_keeps_its_promises(
            min in 1usize..50,
            span in 0usize..5000,
            limit in 0usize..6000,
            in_flight in 0usize..6000,
            load in prop_oneof![0.0f64..3.0, 3.0f64..1e6],
            tpot_load in 0.0f64..3.0,
            ceiling_limit in proptest::option::of(1usize..6000),
            age in 0u64..120,
            max_step in 0usize..100,
            quiet_before in 0u32..QUIET_DECISIONS,
        ) {
            let c = AdaptiveConfig { min_limit: min, max_limit: min + span, ..AdaptiveConfig::new(Duration::from_secs(1)) };
            let now = Duration::from_secs(1000);
            let mut ceiling =
                ceiling_limit.map(|limit| Ceiling { limit, at: now - Duration::from_secs(age), quiet: quiet_before });
            let from = limit.clamp(min, min + span);
            let quiet_now = load < c.tolerance / 2.0 && tpot_load < c.tolerance;
            let binding = ceiling.filter(|ceiling| {
                let near = from * 20 >= ceiling.limit * 19;
                let quiet = if quiet_now && near { ceiling.quiet + 1 } else { 0 };
                age < 60 && from < ceiling.limit.saturating_add(ceiling.limit / 2) && quiet < QUIET_DECISIONS
            });
            let inputs = Inputs { load, tpot_load, in_flight, max_step };
            let (to, reason) = next_limit(&c, limit, inputs, &mut ceiling, now);
            prop_assert!((min..=min + span).contains(&to));
            if load > 1.0 {
                prop_assert_eq!(reason, Reason::OverTarget);
                let base = from.min(in_flight).max(min);
                prop_assert!(to < base || to == min);
                prop_assert!(to as f64 >= (base as f64 * c.max_backoff).floor() || to == min);
            } else if load >= c.tolerance || tpot_load >= c.tolerance || in_flight * 10 < from * 9 {
                prop_assert_eq!(to, from);
            } else {
                prop_assert!(to >= from);
                prop_assert!(to <= from + max_step.max(1));
                prop_assert!(to as f64 <= (from as f64 * c.max_growth).ceil().max(from as f64 + 1.0));
                if let Some(c) = binding {
                    prop_assert!(to < c.limit || to == from || to == min, "{to} reached the ceiling {}", c.limit);
                }
                let held = to == from && binding.is_some();
                prop_assert_eq!(reason, if held { Reason::BelowCeiling } else { Reason::Slack });
                if ceiling_limit.is_none() && from < min + span {
                    prop_assert!(to > from);
                }
            }
        }
    }
}
