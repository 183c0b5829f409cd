//! The control law: from the measured load and whether the limit is in use, the next limit.
//!
//! A pure function of its inputs (no clock, no admission), so that its properties are tested directly:
//!
//! - the result stays within the configured bounds, whatever the inputs;
//! - a load above 1 never raises the limit, and lowers it by at least one (unless at the minimum) and to
//!   no less than `max_backoff` of itself;
//! - a load in `[tolerance, 1]` holds the limit; so does slack while the limit is not in use;
//! - slack raises it by at least one (unless at the maximum), by at most `max_growth`, and by at most
//!   `max_step` (the burst budget: the requests whose prefills fit in part of the target, since a raised
//!   limit admits them all at once);
//! - while a recent ceiling (the limit at which the target was last missed) is remembered, the limit
//!   stays below it, and within 10 % of it grows by about 2 % a decision, so that it settles just below
//!   the knee instead of overshooting it again.

use super::config::AdaptiveConfig;
use super::decision::Reason;
use std::time::Duration;

/// The limit at which the target was last missed, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ceiling {
    pub(crate) limit: usize,
    pub(crate) at: Duration,
}

/// The next limit after `limit`, given the `load` (largest quantile over its target; 0 when every sample
/// was instant), whether the limit is in use (`at_limit`) and the largest increase allowed (`max_step`,
/// at least 1). Updates the remembered `ceiling`.
pub(crate) fn next_limit(
    config: &AdaptiveConfig,
    limit: usize,
    load: f64,
    at_limit: bool,
    max_step: usize,
    ceiling: &mut Option<Ceiling>,
    now: Duration,
) -> (usize, Reason) {
    let (min, max) = (config.min_limit, config.max_limit);
    let limit = limit.clamp(min, max);
    if ceiling.is_some_and(|c| config.ceiling_ttl.is_zero() || now.saturating_sub(c.at) >= config.ceiling_ttl) {
        *ceiling = None;
    }
    if load > 1.0 || load.is_nan() {
        let factor = if load.is_nan() { config.max_backoff } else { (1.0 / load).max(config.max_backoff) };
        let down = ((limit as f64 * factor).floor() as usize).min(limit.saturating_sub(1));
        *ceiling = Some(Ceiling { limit, at: now });
        return (down.clamp(min, max), Reason::OverTarget);
    }
    if load >= config.tolerance {
        return (limit, Reason::InBand);
    }
    if !at_limit {
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
        // Stay below where the target was missed until that is forgotten.
        up = up.min(c.limit.saturating_sub(1)).max(limit);
    }
    let up = up.clamp(min, max);
    let held_by_ceiling = up == limit && ceiling.is_some();
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

    #[test]
    fn each_band_does_what_it_says() {
        let c = config();
        let t = Duration::from_secs(10);
        let mut ceiling = None;
        let any = usize::MAX;
        assert_eq!(next_limit(&c, 100, 0.9, true, any, &mut ceiling, t), (100, Reason::InBand));
        assert_eq!(next_limit(&c, 100, 0.1, false, any, &mut ceiling, t), (100, Reason::NotLimited));
        assert_eq!(next_limit(&c, 100, 0.1, true, any, &mut ceiling, t), (125, Reason::Slack));
        assert_eq!(next_limit(&c, 100, 0.7, true, any, &mut ceiling, t).0, 115); // 0.8 / 0.7
        assert_eq!(next_limit(&c, 100, 0.1, true, 7, &mut ceiling, t).0, 107); // the burst budget
        assert_eq!(ceiling, None);
        assert_eq!(next_limit(&c, 100, 2.0, true, any, &mut ceiling, t), (50, Reason::OverTarget));
        assert_eq!(ceiling, Some(Ceiling { limit: 100, at: t }));
        assert_eq!(next_limit(&c, 100, 9.0, true, any, &mut ceiling, t).0, 50); // at most halved
        assert_eq!(next_limit(&c, 100, 1.001, true, any, &mut ceiling, t).0, 99); // at least one less
        // Back at full speed below 90 % of the ceiling, then 2 % a step, never up to the ceiling.
        assert_eq!(next_limit(&c, 50, 0.1, true, any, &mut ceiling, t).0, 63);
        assert_eq!(next_limit(&c, 80, 0.1, true, any, &mut ceiling, t).0, 99);
        assert_eq!(next_limit(&c, 95, 0.1, true, any, &mut ceiling, t).0, 96);
        assert_eq!(next_limit(&c, 99, 0.1, true, any, &mut ceiling, t), (99, Reason::BelowCeiling));
        // The ceiling expires.
        let later = t + Duration::from_secs(61);
        assert_eq!(next_limit(&c, 99, 0.1, true, any, &mut ceiling, later).0, 124);
        assert_eq!(ceiling, None);
    }

    #[test]
    fn bounds_hold_at_the_edges() {
        let c = config();
        let mut ceiling = None;
        let z = Duration::ZERO;
        assert_eq!(next_limit(&c, 2, 5.0, true, 9, &mut ceiling, z).0, 2);
        assert_eq!(next_limit(&c, 1000, 0.0, true, 9, &mut ceiling, z).0, 1000);
        assert_eq!(next_limit(&c, 5000, 0.9, true, 9, &mut ceiling, z).0, 1000);
        assert_eq!(next_limit(&c, 10, f64::NAN, true, 9, &mut ceiling, z), (5, Reason::OverTarget));
        assert_eq!(next_limit(&c, 10, 0.1, true, 0, &mut ceiling, z), (10, Reason::BelowCeiling));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn the_law_keeps_its_promises(
            min in 1usize..50,
            span in 0usize..5000,
            limit in 0usize..6000,
            load in prop_oneof![0.0f64..3.0, 3.0f64..1e6],
            at_limit: bool,
            ceiling_limit in proptest::option::of(1usize..6000),
            age in 0u64..120,
            max_step in 0usize..100,
        ) {
            let c = AdaptiveConfig { min_limit: min, max_limit: min + span, ..AdaptiveConfig::new(Duration::from_secs(1)) };
            let now = Duration::from_secs(1000);
            let mut ceiling = ceiling_limit.map(|limit| Ceiling { limit, at: now - Duration::from_secs(age) });
            let before = ceiling.filter(|c| age < 60 && c.limit > 0);
            let (to, reason) = next_limit(&c, limit, load, at_limit, max_step, &mut ceiling, now);
            let from = limit.clamp(min, min + span);
            prop_assert!((min..=min + span).contains(&to));
            if load > 1.0 {
                prop_assert_eq!(reason, Reason::OverTarget);
                prop_assert!(to < from || from == min);
                prop_assert!(to as f64 >= (from as f64 * c.max_backoff).floor().min(from as f64) || to == min);
            } else if load >= c.tolerance || !at_limit {
                prop_assert_eq!(to, from);
            } else {
                prop_assert!(to >= from);
                prop_assert!(to <= from + max_step.max(1));
                prop_assert!(to as f64 <= (from as f64 * c.max_growth).ceil().max(from as f64 + 1.0));
                if let Some(c) = before {
                    prop_assert!(to < c.limit || to == from || to == min, "{to} reached the ceiling {}", c.limit);
                }
                let held = to == from && ceiling.is_some();
                prop_assert_eq!(reason, if held { Reason::BelowCeiling } else { Reason::Slack });
                if before.is_none() && from < min + span {
                    prop_assert!(to > from);
                }
            }
        }
    }
}
