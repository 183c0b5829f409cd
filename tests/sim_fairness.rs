//! Token-fair queueing judged in the overload lab: two tenants that are never idle, one sending questions
//! and one documents 20 times their size, on one H100 behind kvgate pricing KV bytes. Charged by tokens
//! (`Fairness::Tokens`) they are served tokens in the ratio of their weights; counted by requests
//! (`Fairness::Requests`) the documents' tenant gets about 18 times the tokens.
#![cfg(feature = "sim")]

use kvgate::kv::{GpuPlan, KvDtype, ModelSpec};
use kvgate::sim::{EngineConfig, GateSpec, HeavyUser, Report, Scenario, TenantReport, Workload, jain_index};
use kvgate::{Fairness, TenantLimits};
use std::time::Duration;

/// Questions: 200 tokens in, 20 out; documents: 4,000 in, 400 out — every request 20 times the size of
/// the other tenant's. 256 streams each: far more than the engine holds, so both always have requests
/// waiting.
fn scenario() -> Scenario {
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80").build().unwrap();
    let engine = EngineConfig::for_plan(&plan, KvDtype::Bf16).unwrap();
    let tenants = vec![HeavyUser::fixed(256, 200, 20), HeavyUser::fixed(256, 4000, 400)];
    Scenario::backlogged_tenants(plan, engine, tenants, Duration::from_secs(600)).unwrap()
}

/// Runs `scenario` with `fairness`, the questions' tenant at `weight` (the documents' at 1); returns the
/// report and the tokens served to each tenant, weighted as the policy charges them (prompt 1, output 2).
fn run(scenario: &Scenario, fairness: Fairness, weight: u32) -> (Report, [TenantReport; 2]) {
    let mut s = scenario.clone();
    s.gate = GateSpec::kv_fairness(fairness, 1024, Duration::from_secs(3600));
    if let GateSpec::Admission(spec) = &mut s.gate {
        spec.tenant_limits = vec![(Workload::script_tenant(0), TenantLimits::new().weight(weight))];
    }
    let report = s.run().unwrap();
    assert_eq!(report.arrived, report.completed + report.failed.total() + report.in_system);
    assert_eq!(report.failed.total(), 0, "backlogged scripts wait as long as it takes");
    let tenant = |i| *report.tenants.iter().find(|t| t.tenant == Workload::script_tenant(i)).unwrap();
    let served = [tenant(0), tenant(1)];
    (report, served)
}

/// Weighted served tokens of the two tenants, each over its weight.
fn normalised(served: &[TenantReport; 2], weight: u32) -> [f64; 2] {
    [served[0].served(1, 2) as f64 / f64::from(weight), served[1].served(1, 2) as f64]
}

#[test]
fn token_fairness_serves_backlogged_tenants_tokens_in_the_ratio_of_their_weights() {
    let scenario = scenario();
    // What one request can be charged (a document: 4,000 + 2 x 512 max_tokens) and what both tenants
    // can have in flight, charged but not yet served (at most twice the KV budget in tokens).
    let max_charge = 4000.0 + 2.0 * 512.0;
    let in_flight = 2.0 * scenario.plan.kv_cache_tokens() as f64;
    for weight in [1, 2] {
        let (_, served) = run(&scenario, Fairness::tokens(), weight);
        let [questions, documents] = normalised(&served, weight);
        let ratio = questions / documents;
        // The goal: within 1.1x of the weights (measured: 1.031 at 1:1, 1.013 at 2:1;
        // `cargo run --release --example policies`, section 5).
        assert!((1.0 / 1.1..=1.1).contains(&ratio), "weight {weight}: ratio {ratio:.3} ({served:?})");
        // Jain's index over the served tokens (normalised by weight): measured 1.000 both.
        assert!(jain_index(&[questions, documents]) >= 0.95);
        // The stated bound: one request's charge plus what is in flight (measured: 0.28 M and 0.08 M
        // tokens, the bound 0.87 M) — a constant, so the ratio tends to the weights as the period grows.
        let difference = (questions - documents).abs();
        assert!(difference <= max_charge + in_flight, "weight {weight}: {difference} tokens apart");
        // Both tenants were served all along: thousands of questions, hundreds of documents.
        assert!(served[0].completed > 10_000 && served[1].completed > 500, "{served:?}");
    }
}

#[test]
fn request_fairness_serves_the_larger_requests_twenty_times_the_tokens() {
    let scenario = scenario();
    let (by_requests, served) = run(&scenario, Fairness::Requests, 1);
    let [questions, documents] = normalised(&served, 1);
    // About as many requests each (measured 3,100 and 2,825), so about 20x the tokens (measured 18.2x:
    // 13.56 M against 0.74 M; `cargo run --release --example policies`, section 5).
    let requests = served[0].completed as f64 / served[1].completed as f64;
    assert!((0.8..=1.25).contains(&requests), "{served:?}");
    assert!(documents / questions > 15.0, "{:.1}", documents / questions);
    assert!(jain_index(&[questions, documents]) < 0.6);
    // Token fairness gives the questions' tenant its share back at no cost in total work served.
    let (by_tokens, fair) = run(&scenario, Fairness::tokens(), 1);
    let total = |s: &[TenantReport; 2]| s[0].served(1, 2) + s[1].served(1, 2);
    assert!(total(&fair) as f64 >= 0.95 * total(&served) as f64, "{fair:?} vs {served:?}");
    assert!(by_tokens.completed > 5 * by_requests.completed);
}
