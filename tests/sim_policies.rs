//! Adaptive concurrency and engine feedback judged in the overload lab, as inequalities: goodput against
//! the best static setting of a sweep, on a steady 2× overload and when the prompt mix shifts midway; the
//! controller's stability on a steady load; engine feedback with a KV budget that does not match the
//! engine. (`cargo run --release --example policies` sweeps all 27 static settings of
//! `GateSpec::sweep` and prints the tables of POLICIES.md; these tests sweep the neighbourhood of the
//! best one — `max_in_flight` 192 to 384, refused at once or waiting in a queue of 16 — to stay fast
//! in debug builds.)
#![cfg(feature = "sim")]

use kvgate::Reservation;
use kvgate::feedback::FeedbackConfig;
use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
use kvgate::sim::{AdmissionSpec, EngineConfig, FeedbackSetup, GateSpec, Pricing, Report, Scenario};
use std::time::Duration;

fn setup(gpu: &str) -> (GpuPlan, EngineConfig) {
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu(gpu).build().unwrap();
    let engine = EngineConfig::for_plan(&plan, WeightDtype::Bf16).unwrap();
    (plan, engine)
}

fn run(scenario: &Scenario, gate: GateSpec) -> Report {
    let mut s = scenario.clone();
    s.gate = gate;
    let report = s.run().unwrap();
    assert_eq!(report.arrived, report.completed + report.failed.total() + report.in_system);
    report
}

/// The best goodput of the static settings around the optimum, and its gate.
fn best_static(scenario: &Scenario, pricing: Pricing) -> (f64, String) {
    let wait = Duration::from_secs(1);
    let mut best = (0.0, String::new());
    for limit in [192, 256, 320, 384] {
        for queue in [0, 16] {
            let report = run(scenario, GateSpec::fixed(pricing, Some(limit), queue, wait));
            if report.goodput > best.0 {
                best = (report.goodput, report.gate);
            }
        }
    }
    best
}

#[test]
fn adaptive_concurrency_against_the_best_static_settings() {
    let (plan, engine) = setup("h100-80");
    let steady = Scenario::overloaded(plan.clone(), engine.clone(), 2.0, Duration::from_secs(600)).unwrap();
    let shift = Scenario::chats_then_documents(plan, engine, 2.0, Duration::from_secs(1200)).unwrap();

    // Steady 2x chat traffic, requests counted: the controller, told only the SLOs, comes within 3 % of
    // the best limit a sweep finds (measured: 0.99x).
    let (best, gate) = best_static(&steady, Pricing::Count);
    let adaptive = run(&steady, GateSpec::adaptive(Pricing::Count, steady.adaptive_config()));
    assert!(adaptive.goodput >= 0.97 * best, "adaptive {:.2} vs {gate} {best:.2} good/s", adaptive.goodput);

    // Chats, then long documents: every static count limit is wrong for one half (one tuned for the
    // chats preempts and collapses on the documents); the controller follows the shift (measured: 1.122x;
    // an oracle switching from the best chat limit to the best document limit at the shift: 1.120x).
    let (best, gate) = best_static(&shift, Pricing::Count);
    let adaptive = run(&shift, GateSpec::adaptive(Pricing::Count, shift.adaptive_config()));
    assert!(adaptive.goodput >= 1.05 * best, "adaptive {:.2} vs {gate} {best:.2} good/s", adaptive.goodput);
    assert!(
        adaptive.preemptions * 2
            < run(&shift, GateSpec::fixed(Pricing::Count, Some(320), 0, Duration::ZERO)).preemptions
    );

    // Pricing KV bytes already follows the shift (each document reserves its size): it beats the best
    // static count limit by far more than 1.2x, and the controller on top of it costs little.
    let kv = run(&shift, GateSpec::fixed(Pricing::KvBytes, None, 0, Duration::ZERO));
    assert!(kv.goodput >= 1.2 * best, "KV pricing {:.2} vs {gate} {best:.2} good/s", kv.goodput);
    let kv_adaptive = run(&shift, GateSpec::adaptive(Pricing::KvBytes, shift.adaptive_config()));
    assert!(kv_adaptive.goodput >= 0.94 * kv.goodput, "{:.2} vs {:.2}", kv_adaptive.goodput, kv.goodput);
    assert_eq!(kv_adaptive.preemptions, 0);
}

#[test]
fn the_controller_is_stable_on_a_steady_load() {
    let (plan, engine) = setup("h100-80");
    let scenario = Scenario::overloaded(plan, engine, 2.0, Duration::from_secs(1800)).unwrap();
    let report = run(&scenario, GateSpec::adaptive(Pricing::Count, scenario.adaptive_config()));
    let series = &report.series;
    // After 5 minutes of warm-up, until the arrivals stop.
    let limits: Vec<f64> = series
        .t
        .iter()
        .zip(&series.max_in_flight)
        .filter(|&(&t, _)| (300.0..=1800.0).contains(&t))
        .map(|(_, &limit)| limit)
        .collect();
    let mut sorted = limits.clone();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| sorted[(q * sorted.len() as f64) as usize];
    let (p5, median, p95) = (at(0.05), at(0.5), at(0.95));
    // The stated band: 90 % of the time within -25 % .. +10 % of the median (measured: -15 % .. +4 %).
    assert!(p5 >= 0.75 * median && p95 <= 1.10 * median, "p5 {p5} median {median} p95 {p95}");
    // No sawtooth: the direction of change reverses at most 3 times a minute (measured: 1.12).
    let mut reversals = 0;
    let mut direction = 0.0;
    for pair in limits.windows(2) {
        let d = (pair[1] - pair[0]).signum();
        if d != 0.0 {
            reversals += usize::from(direction != 0.0 && d != direction);
            direction = d;
        }
    }
    assert!(reversals <= 3 * 25, "{reversals} reversals in 25 minutes");
    // And it sits where the sweep finds the best static limit (320), not far below it.
    assert!((250.0..=400.0).contains(&median), "{median}");
}

/// KV pricing refused at once, with a budget of `factor` × the engine's pool, with or without feedback.
fn kv_gate(factor: f64, reservation: Reservation, feedback: bool) -> GateSpec {
    let GateSpec::Admission(spec) = GateSpec::fixed(Pricing::KvBytes, None, 0, Duration::ZERO) else {
        unreachable!("fixed builds an admission spec")
    };
    GateSpec::Admission(Box::new(AdmissionSpec {
        kv_budget_factor: factor,
        reservation,
        feedback: feedback.then(|| FeedbackSetup::new(FeedbackConfig::new())),
        ..*spec
    }))
}

#[test]
fn engine_feedback_repairs_a_budget_that_does_not_match_the_engine() {
    // A budget 1.5x the pool with learned reservations: the engine runs out of KV, preempts, and
    // goodput collapses (measured: 0.81 good/s, 1,778 preemptions). Feedback shrinks the budget on
    // the first preemptions (measured: 28.7 good/s, 4 preemptions).
    let (plan, engine) = setup("h100-80");
    let scenario = Scenario::overloaded(plan, engine, 2.0, Duration::from_secs(600)).unwrap();
    let wrong = run(&scenario, kv_gate(1.5, Reservation::learned(), false));
    let corrected = run(&scenario, kv_gate(1.5, Reservation::learned(), true));
    assert!(corrected.goodput >= 10.0 * wrong.goodput, "{:.2} vs {:.2}", corrected.goodput, wrong.goodput);
    assert!(corrected.preemptions * 100 <= wrong.preemptions, "{} vs {}", corrected.preemptions, wrong.preemptions);
    let budget = corrected.series.kv_budget_percent.iter().copied().rfind(|b| b.is_finite()).unwrap();
    assert!((90.0..=120.0).contains(&budget), "the budget settles near the pool: {budget} %");

    // A memory-bound L4 with full max_tokens reservations: the cache stays 60 % full; feedback grows
    // the budget to what the engine holds (measured: 0.40 -> 0.69 good/s).
    let (plan, engine) = setup("l4");
    let scenario = Scenario::overloaded(plan, engine, 2.0, Duration::from_secs(600)).unwrap();
    let reserved = run(&scenario, kv_gate(1.0, Reservation::Full, false));
    let corrected = run(&scenario, kv_gate(1.0, Reservation::Full, true));
    assert!(corrected.goodput >= 1.4 * reserved.goodput, "{:.2} vs {:.2}", corrected.goodput, reserved.goodput);
    assert!(corrected.peak_kv_percent > reserved.peak_kv_percent);
}

#[test]
fn policy_gates_are_deterministic_and_their_series_are_recorded() {
    let (plan, engine) = setup("h100-80");
    let mut scenario = Scenario::chats_then_documents(plan, engine, 2.0, Duration::from_secs(120)).unwrap();
    scenario.gate = GateSpec::adaptive(Pricing::KvBytes, scenario.adaptive_config());
    if let GateSpec::Admission(spec) = &mut scenario.gate {
        spec.feedback = Some(FeedbackSetup::new(FeedbackConfig::new()));
    }
    let first = scenario.run().unwrap();
    assert_eq!(format!("{first:?}"), format!("{:?}", scenario.run().unwrap()));
    let series = &first.series;
    assert_eq!(series.goodput.len(), series.t.len());
    assert!(series.max_in_flight.iter().all(|l| l.is_finite()));
    assert!(series.kv_budget_percent.iter().all(|b| b.is_finite() && *b > 0.0));
    let good: f64 = series.goodput.iter().sum::<f64>() * series.interval.as_secs_f64();
    assert!((good - first.good as f64).abs() < 1.0, "{good} vs {}", first.good);
    // A static gate has a static limit and budget; no gate has neither.
    scenario.gate = GateSpec::None;
    let none = scenario.run().unwrap();
    assert!(none.series.max_in_flight.iter().all(|l| l.is_nan()));
    assert!(none.series.kv_budget_percent.iter().all(|b| b.is_nan()));
}

#[test]
fn bad_policy_settings_are_errors() {
    let (plan, engine) = setup("h100-80");
    let mut scenario = Scenario::overloaded(plan.clone(), engine.clone(), 2.0, Duration::from_secs(10)).unwrap();
    let mut config = scenario.adaptive_config();
    config.min_limit = 0;
    scenario.gate = GateSpec::adaptive(Pricing::Count, config);
    assert!(scenario.run().is_err());
    scenario.gate = kv_gate(0.0, Reservation::Full, false);
    assert!(scenario.run().unwrap_err().to_string().contains("KV budget factor"));
    // Feedback needs a KV budget to correct.
    let GateSpec::Admission(spec) = GateSpec::fixed(Pricing::Count, Some(8), 0, Duration::ZERO) else { unreachable!() };
    scenario.gate = GateSpec::Admission(Box::new(AdmissionSpec {
        feedback: Some(FeedbackSetup::new(FeedbackConfig::new())),
        ..*spec
    }));
    assert!(scenario.run().is_err());
    assert!(Scenario::overloaded(plan, engine, f64::NAN, Duration::from_secs(10)).is_err());
}
