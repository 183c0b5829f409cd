//! The adaptive concurrency controller against a real `Admission` on a `ManualClock`: each rule of the
//! control law through the public API, the per-token discount, stale samples, stalls, configuration
//! errors, and a proptest that random observation sequences keep the limit within its bounds and
//! change it at most once per interval.

use kvgate::adaptive::{AdaptiveConcurrency, AdaptiveConfig, Decision, MAX_WINDOW, Observation, Reason};
use kvgate::clock::{Clock, ManualClock};
use kvgate::{Admission, ConfigError, Permit, Request};
use proptest::prelude::*;
use std::time::Duration;

const SLO: Duration = Duration::from_secs(2); // target: 1 s of queueing delay

struct Rig {
    clock: ManualClock,
    admission: Admission<ManualClock>,
    controller: AdaptiveConcurrency<ManualClock>,
}

impl Rig {
    fn new(config: AdaptiveConfig) -> Self {
        let clock = ManualClock::new();
        let admission = Admission::builder().clock(clock.clone()).queue_capacity(0).build().unwrap();
        let controller = AdaptiveConcurrency::new(admission.clone(), config).unwrap();
        let mut rig = Self { clock, admission, controller };
        rig.tick(); // starts the first interval
        rig
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.clock.now_nanos())
    }

    fn tick(&mut self) -> Option<Decision> {
        let now = self.now();
        self.controller.tick(now)
    }

    fn admit(&self, prompt: u32) -> Permit {
        self.admission.try_admit(&Request::new(prompt, 256)).expect("below the limit")
    }

    /// Admits `n` requests of `prompt` tokens, lets `ttft` pass, reports their first tokens.
    fn first_tokens(&mut self, n: usize, prompt: u32, ttft: Duration) -> Vec<Permit> {
        let permits: Vec<Permit> = (0..n).map(|_| self.admit(prompt)).collect();
        self.clock.advance(ttft);
        for permit in &permits {
            let now = self.now();
            self.controller.observe(Observation::first_token(permit, now));
        }
        permits
    }

    /// Advances to the end of the interval and decides.
    fn decide(&mut self) -> Decision {
        self.clock.advance(Duration::from_secs(1));
        self.tick().expect("an interval passed with enough samples")
    }
}

fn config(initial: usize) -> AdaptiveConfig {
    AdaptiveConfig { initial_limit: initial, min_samples: 8, max_limit: 1000, ..AdaptiveConfig::new(SLO) }
}

#[test]
fn the_limit_grows_while_in_use_and_latency_is_low() {
    let mut rig = Rig::new(config(20));
    assert_eq!(rig.admission.snapshot().max_in_flight, 20);
    let _held = rig.first_tokens(20, 500, Duration::from_millis(50));
    let d = rig.decide();
    assert_eq!((d.from, d.to, d.reason), (20, 22, Reason::Slack)); // +10 %
    assert_eq!(rig.admission.snapshot().max_in_flight, 22);
    assert_eq!(rig.controller.limit(), 22);
    assert!(d.changed());
}

#[test]
fn the_limit_holds_when_it_is_not_in_use() {
    let mut rig = Rig::new(config(100));
    let _held = rig.first_tokens(20, 500, Duration::from_millis(50));
    let d = rig.decide();
    assert_eq!((d.to, d.reason), (100, Reason::NotLimited));
    assert!(!d.changed());
}

#[test]
fn a_miss_lowers_the_limit_from_the_concurrency_in_flight() {
    let mut rig = Rig::new(config(100));
    let held = rig.first_tokens(20, 500, Duration::from_secs(3));
    let d = rig.decide();
    // 3 s of delay against a 1 s target: from the 20 in flight (the limit of 100 did not bind), halved.
    assert_eq!((d.from, d.to, d.reason), (100, 10, Reason::OverTarget));
    assert!((d.load - 3.0).abs() < 0.01, "{d:?}");
    assert_eq!(rig.controller.ceiling(), Some(20));
    drop(held);
    // Quick first tokens again: back up fast, then held just below the ceiling...
    let mut limits = Vec::new();
    for _ in 0..11 {
        let _held = rig.first_tokens(rig.controller.limit(), 500, Duration::from_millis(20));
        let d = rig.decide();
        limits.push((d.to, d.reason));
    }
    let below = (19, Reason::BelowCeiling);
    assert_eq!(
        limits[..9],
        [
            (11, Reason::Slack),
            (13, Reason::Slack),
            (15, Reason::Slack),
            (17, Reason::Slack),
            (19, Reason::Slack),
            below,
            below,
            below,
            below
        ]
    );
    // ... until five quiet decisions there show the miss was not the knee; then it probes by 2 %.
    assert_eq!(limits[9..], [(20, Reason::Slack), (21, Reason::Slack)]);
}

#[test]
fn the_dead_band_holds() {
    let mut rig = Rig::new(config(10));
    let _held = rig.first_tokens(10, 500, Duration::from_millis(900));
    assert_eq!(rig.decide().reason, Reason::InBand);
}

#[test]
fn a_prompts_own_prefill_is_not_congestion() {
    // TTFT = 100 ms of queueing + 150 µs per prompt token: a 10,000-token prompt takes 1.6 s, but the
    // queueing is only 100 ms. Raw TTFTs would read as a miss (their p90 is above the 1 s target).
    let mut rig = Rig::new(config(20));
    let mut permits = Vec::new();
    for i in 0..20u32 {
        let prompt = 1000 + i * 450;
        let permit = rig.admit(prompt);
        let at = Duration::from_nanos(permit.admitted_at_nanos())
            + Duration::from_millis(100)
            + Duration::from_micros(150) * prompt;
        rig.controller.observe(Observation::FirstToken { prompt_tokens: prompt, admitted_at: Duration::ZERO, at });
        permits.push(permit);
    }
    let d = rig.decide();
    assert_eq!(d.reason, Reason::Slack, "{d:?}");
    let per_token = d.prefill_per_token.unwrap().as_secs_f64();
    assert!((per_token - 150e-6).abs() < 1.5e-6, "{per_token}");
    assert!((d.ttft_delay.unwrap().as_secs_f64() - 0.1).abs() < 0.01, "{d:?}");
}

#[test]
fn a_delay_common_to_all_requests_is_not_discounted() {
    // Every prompt alike and every TTFT 3 s: no slope can be fitted, nothing is discounted.
    let mut rig = Rig::new(config(20));
    let _held = rig.first_tokens(20, 800, Duration::from_secs(3));
    let d = rig.decide();
    assert_eq!(d.reason, Reason::OverTarget);
    assert_eq!(d.ttft_delay, Some(Duration::from_secs(3)));
}

#[test]
fn a_slow_decode_stops_growth_but_never_lowers_the_limit() {
    let tpot = Duration::from_millis(50);
    let mut rig = Rig::new(AdaptiveConfig { tpot_slo: Some(tpot), ..config(20) });
    for slowness in [1, 5] {
        let held = rig.first_tokens(20, 500, Duration::from_millis(20));
        let first = rig.now();
        rig.clock.advance(tpot * 100 * slowness);
        for permit in held {
            let now = rig.now();
            rig.controller.observe(Observation::finished(101, first, now));
            permit.complete(101);
        }
        let d = rig.decide();
        assert_eq!((d.to, d.reason), (20, Reason::DecodeSlow), "{d:?}");
        assert!((d.tpot_load - slowness as f64).abs() < 1e-9);
    }
}

#[test]
fn samples_of_requests_admitted_under_an_older_limit_are_dropped() {
    let mut rig = Rig::new(config(20));
    let old = rig.first_tokens(20, 500, Duration::from_millis(50));
    rig.decide(); // 20 -> 22
    let now = rig.now();
    for permit in &old {
        rig.controller.observe(Observation::abandoned(permit, now));
    }
    assert_eq!(rig.controller.stale_samples(), 20);
    rig.clock.advance(Duration::from_secs(1));
    assert_eq!(rig.tick(), None, "the stale samples do not make a decision");
}

#[test]
fn abandoned_requests_count_as_at_least_their_wait() {
    let mut rig = Rig::new(config(10));
    let held: Vec<Permit> = (0..10).map(|_| rig.admit(500)).collect();
    rig.clock.advance(Duration::from_secs(30));
    for permit in &held {
        let now = rig.now();
        rig.controller.observe(Observation::abandoned(permit, now));
    }
    let d = rig.decide();
    assert_eq!((d.to, d.reason), (5, Reason::OverTarget));
}

#[test]
fn admitted_requests_without_first_tokens_are_a_stall() {
    let mut rig = Rig::new(config(16));
    let _held: Vec<Permit> = (0..16).map(|_| rig.admit(500)).collect();
    for _ in 0..9 {
        rig.clock.advance(Duration::from_secs(1));
        assert_eq!(rig.tick(), None, "silence is waited out for ten intervals");
    }
    let d = rig.decide();
    assert_eq!((d.from, d.to, d.reason), (16, 8, Reason::Stalled));
    assert!(d.load.is_infinite());
}

#[test]
fn decisions_need_an_interval_and_enough_samples() {
    let mut rig = Rig::new(config(20));
    let _a = rig.first_tokens(7, 500, Duration::from_millis(50));
    rig.clock.advance(Duration::from_secs(5));
    assert_eq!(rig.tick(), None, "7 samples are fewer than 8");
    let _b = rig.first_tokens(1, 500, Duration::from_millis(50));
    assert!(rig.tick().is_some());
    let _c = rig.first_tokens(8, 500, Duration::from_millis(50));
    rig.clock.advance(Duration::from_millis(500));
    assert_eq!(rig.tick(), None, "half an interval since the last decision");
    assert_eq!(rig.decide().samples, 8);
    assert_eq!(rig.controller.last_decision().unwrap().at, rig.now());
}

#[test]
fn a_limit_set_elsewhere_is_where_the_next_decision_starts() {
    let mut rig = Rig::new(config(20));
    rig.admission.set_max_in_flight(40).unwrap();
    let held = rig.first_tokens(40, 500, Duration::from_millis(50));
    let d = rig.decide();
    assert_eq!((d.from, d.to), (40, 44));
    drop(held);
    // Outside the bounds, it is brought back within them even when the decision holds.
    rig.admission.set_max_in_flight(5000).unwrap();
    let _held = rig.first_tokens(10, 500, Duration::from_millis(900));
    let d = rig.decide();
    assert_eq!((d.from, d.to, d.reason), (1000, 1000, Reason::InBand));
    assert_eq!(rig.admission.snapshot().max_in_flight, 1000);
}

#[test]
fn bad_configurations_are_errors() {
    let admission = Admission::builder().build().unwrap();
    let bad = |config: AdaptiveConfig| AdaptiveConcurrency::new(admission.clone(), config).unwrap_err();
    let base = AdaptiveConfig::new(SLO);
    assert_eq!(bad(AdaptiveConfig::new(Duration::ZERO)), ConfigError::Zero { what: "adaptive TTFT SLO" });
    assert!(matches!(bad(AdaptiveConfig { tpot_slo: Some(Duration::ZERO), ..base.clone() }), ConfigError::Zero { .. }));
    assert!(matches!(bad(AdaptiveConfig { interval: Duration::ZERO, ..base.clone() }), ConfigError::Zero { .. }));
    assert!(matches!(bad(AdaptiveConfig { min_samples: 0, ..base.clone() }), ConfigError::Zero { .. }));
    for (field, config) in [
        ("target_share", AdaptiveConfig { target_share: 0.0, ..base.clone() }),
        ("target_share", AdaptiveConfig { target_share: 1.5, ..base.clone() }),
        ("quantile", AdaptiveConfig { quantile: f64::NAN, ..base.clone() }),
        ("tolerance", AdaptiveConfig { tolerance: -1.0, ..base.clone() }),
        ("max_growth", AdaptiveConfig { max_growth: 1.0, ..base.clone() }),
        ("max_growth", AdaptiveConfig { max_growth: f64::INFINITY, ..base.clone() }),
        ("max_backoff", AdaptiveConfig { max_backoff: 1.0, ..base.clone() }),
        ("window", AdaptiveConfig { window: 4, ..base.clone() }),
        ("window", AdaptiveConfig { window: MAX_WINDOW + 1, ..base.clone() }),
    ] {
        let error = bad(config).to_string();
        assert!(error.contains(field), "{error}");
    }
    assert!(matches!(bad(AdaptiveConfig { min_limit: 0, ..base.clone() }), ConfigError::Zero { .. }));
    assert!(matches!(bad(AdaptiveConfig { min_limit: 9, max_limit: 8, ..base }), ConfigError::Conflict(_)));
}

/// One step of a random run.
#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    Admit(u32),
    FirstToken { index: usize, millis: u64 },
    Abandon(usize),
    Finish { index: usize, tokens: u32 },
    Tick,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u64..3000).prop_map(Step::Advance),
        (1u32..20_000).prop_map(Step::Admit),
        (any::<usize>(), 0u64..6000).prop_map(|(index, millis)| Step::FirstToken { index, millis }),
        any::<usize>().prop_map(Step::Abandon),
        (any::<usize>(), 1u32..2000).prop_map(|(index, tokens)| Step::Finish { index, tokens }),
        Just(Step::Tick),
    ]
}

/// Runs `steps`, returning every decision; checks the bounds and the pace on the way.
fn run(steps: &[Step], config: &AdaptiveConfig) -> Result<Vec<Decision>, TestCaseError> {
    let clock = ManualClock::new();
    let admission = Admission::builder().clock(clock.clone()).queue_capacity(0).build().unwrap();
    let mut controller = AdaptiveConcurrency::new(admission.clone(), config.clone()).unwrap();
    let mut permits: Vec<Permit> = Vec::new();
    let mut decisions: Vec<Decision> = Vec::new();
    let now = |clock: &ManualClock| Duration::from_nanos(clock.now_nanos());
    for step in steps {
        match *step {
            Step::Advance(ms) => clock.advance(Duration::from_millis(ms)),
            Step::Admit(prompt) => {
                if let Ok(permit) = admission.try_admit(&Request::new(prompt, 64)) {
                    permits.push(permit);
                }
            }
            Step::FirstToken { index, millis } if !permits.is_empty() => {
                let permit = &permits[index % permits.len()];
                let at = Duration::from_nanos(permit.admitted_at_nanos()) + Duration::from_millis(millis);
                controller.observe(Observation::first_token(permit, at));
            }
            Step::Abandon(index) if !permits.is_empty() => {
                let permit = permits.swap_remove(index % permits.len());
                controller.observe(Observation::abandoned(&permit, now(&clock)));
            }
            Step::Finish { index, tokens } if !permits.is_empty() => {
                let permit = permits.swap_remove(index % permits.len());
                let first = Duration::from_nanos(permit.admitted_at_nanos());
                controller.observe(Observation::finished(tokens, first, now(&clock)));
                permit.complete(tokens);
            }
            Step::Tick => {
                if let Some(d) = controller.tick(now(&clock)) {
                    prop_assert!((config.min_limit..=config.max_limit).contains(&d.to), "{d:?}");
                    prop_assert_eq!(admission.snapshot().max_in_flight, d.to);
                    if let Some(last) = decisions.last() {
                        prop_assert!(d.at >= last.at + config.interval, "{:?} then {:?}", last, d);
                    }
                    decisions.push(d);
                }
            }
            _ => {}
        }
        let limit = admission.snapshot().max_in_flight;
        prop_assert!((config.min_limit..=config.max_limit).contains(&limit), "limit {limit}");
    }
    Ok(decisions)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_runs_keep_the_limit_in_bounds_and_the_pace(
        steps in proptest::collection::vec(step(), 1..400),
        min in 1usize..8,
        span in 0usize..64,
        initial in 0usize..100,
        tpot in any::<bool>(),
    ) {
        let config = AdaptiveConfig {
            min_limit: min,
            max_limit: min + span,
            initial_limit: initial,
            min_samples: 4,
            tpot_slo: tpot.then_some(Duration::from_millis(40)),
            ..AdaptiveConfig::new(SLO)
        };
        let first = run(&steps, &config)?;
        let second = run(&steps, &config)?;
        prop_assert_eq!(format!("{first:?}"), format!("{second:?}"), "not deterministic");
    }
}
