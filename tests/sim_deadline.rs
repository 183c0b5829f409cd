//! Deadline-aware shedding judged in the overload lab: chat traffic at 3x what one H100 sustains, every
//! request carrying a 2-s TTFT deadline. kvgate waiting in a queue, with and without shedding; misses
//! counted both ways (admitted but late; shed although a replay of the drain says it would have started
//! in time, see `DeadlineReport`).
#![cfg(feature = "sim")]

use kvgate::WaitPolicy;
use kvgate::kv::{GpuPlan, KvDtype, ModelSpec};
use kvgate::sim::{EngineConfig, GateSpec, Report, Scenario};
use std::time::Duration;

fn scenario() -> Scenario {
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80").build().unwrap();
    let engine = EngineConfig::for_plan(&plan, KvDtype::Bf16).unwrap();
    let mut scenario = Scenario::overloaded(plan, engine, 3.0, Duration::from_secs(600)).unwrap();
    scenario.workload.ttft_deadline = Some(Duration::from_secs(2));
    scenario
}

fn run(scenario: &Scenario, gate: GateSpec) -> Report {
    let mut s = scenario.clone();
    s.gate = gate;
    let report = s.run().unwrap();
    assert_eq!(report.arrived, report.completed + report.failed.total() + report.in_system);
    let d = report.deadlines;
    assert_eq!(d.admitted, d.met + d.missed, "{d:?}");
    assert!(d.shed_in_time <= d.shed && d.lost_in_time <= d.never_admitted, "{d:?}");
    report
}

#[test]
fn shedding_keeps_the_deadline_of_admitted_requests_at_three_times_overload() {
    let scenario = scenario();
    let allowance = Duration::from_millis(250);
    // Deadline shedding in a FIFO waiting room (the shedding's own merits; the default policy below).
    let fifo = |gate: GateSpec| gate.with_wait_policy(WaitPolicy::Fifo, "FIFO");
    let shedding = run(&scenario, fifo(GateSpec::kv_deadlines(256, Duration::from_secs(30), allowance)));
    let d = shedding.deadlines;
    // The goal: at least 95 % of admitted requests meet their deadline (measured: 16,407 of 16,520,
    // 99.3 %; `cargo run --release --example policies`, section 6).
    assert!(d.met_ratio() >= 0.95, "{:.4} {d:?}", d.met_ratio());
    assert!(d.admitted > 5_000, "{d:?}");
    // Misses the other way, counted: tries shed although the replay says they would have started in
    // time (measured: 20,166 of 66,007, 30.6 %, an upper estimate — the prediction errs on the side of
    // refusing), and queued tries that were predicted to start in time and did not (measured: 1,628).
    assert!(d.shed > 10_000 && d.shed_in_time > 0 && d.expired > 0, "{d:?}");
    assert!(d.shed_in_time * 10 <= d.shed * 4, "{d:?}");

    // Without shedding, the same queue with its wait capped at the deadline: requests wait until they
    // can no longer make it, then start late (measured: 21.9 % meet it, 5.92 good/s against 27.34).
    let capped = run(&scenario, fifo(GateSpec::kv_admit(None, 256, Duration::from_secs(2))));
    assert!(capped.deadlines.met_ratio() < 0.5, "{:?}", capped.deadlines);
    assert!(shedding.goodput >= 3.0 * capped.goodput, "{:.2} vs {:.2}", shedding.goodput, capped.goodput);
    assert_eq!(capped.deadlines.shed, 0);

    // With no allowance for the engine's own prefill, admitted requests start in time but some reach
    // their first token late (measured: 83.5 % meet it).
    let tight = run(&scenario, fifo(GateSpec::kv_deadlines(256, Duration::from_secs(30), Duration::ZERO)));
    assert!(tight.deadlines.met_ratio() < d.met_ratio(), "{:?}", tight.deadlines);
}

/// The default waiting room (controlled delay) earns its place at 3x sustained overload with the gateway's
/// old defaults (a queue of 256, a 30-s wait) and no deadline passed to the admission: at least
/// `try_admit`'s good answers per second (measured: 36.45 against 30.48; FIFO with the same queue: 0.18),
/// and admitted requests meet their deadline (measured: 99.3 %).
#[test]
fn the_default_waiting_room_beats_refusing_at_once_at_three_times_overload() {
    let scenario = scenario();
    let refusing = run(&scenario, GateSpec::kv_try_admit());
    let default = run(&scenario, GateSpec::kv_admit(None, 256, Duration::from_secs(30)));
    let fifo = run(
        &scenario,
        GateSpec::kv_admit(None, 256, Duration::from_secs(30)).with_wait_policy(WaitPolicy::Fifo, "FIFO"),
    );
    assert!(default.goodput >= refusing.goodput, "{:.2} vs {:.2}", default.goodput, refusing.goodput);
    assert!(default.deadlines.met_ratio() >= 0.95, "{:?}", default.deadlines);
    assert!(fifo.goodput * 10.0 < refusing.goodput, "{:.2} vs {:.2}", fifo.goodput, refusing.goodput);
}

#[test]
fn a_gate_that_ignores_deadlines_sheds_nothing_and_deadlines_are_checked() {
    let mut scenario = scenario();
    scenario.duration = Duration::from_secs(30);
    let report = run(&scenario, GateSpec::kv_try_admit());
    assert_eq!((report.deadlines.shed, report.deadlines.shed_in_time), (0, 0));
    assert!(report.deadlines.admitted > 0);
    // No deadline, no deadline report.
    scenario.workload.ttft_deadline = None;
    let none = run(&scenario, GateSpec::kv_deadlines(256, Duration::from_secs(30), Duration::ZERO));
    assert_eq!(none.deadlines, Default::default());
    scenario.workload.ttft_deadline = Some(Duration::ZERO);
    assert!(scenario.run().unwrap_err().to_string().contains("TTFT deadline"));
}
