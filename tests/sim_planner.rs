//! The planner (`kvgate::sim::plan`, the `capacity` example's `--users`): how many employees fit is a
//! property of the model, the GPU, the SLO and the limits, not of the number of employees asked about
//! (issue #33: on an L4 it answered 26 when asked about 20 employees and 1 when asked about 300).
#![cfg(feature = "sim")]

use kvgate::ConfigError;
use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
use kvgate::sim::{EngineConfig, PlanRequest, Recommendation, plan};
use std::time::Duration;

/// The example's question (`capacity --model llama-3.1-8b --gpu l4 --users N --ttft-slo 2s`, seed 1),
/// with probes of 2,000 requests instead of 4,000 so that three plans take well under a minute in a
/// debug build (the search and the limits tried are the example's).
fn l4_request(users: u32) -> PlanRequest {
    let gpu_plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("l4").build().unwrap();
    let engine = EngineConfig::for_plan(&gpu_plan, WeightDtype::Bf16).unwrap();
    PlanRequest::new(gpu_plan, engine, users, Duration::from_secs(2))
}

#[test]
fn employees_that_fit_do_not_depend_on_the_number_asked_about() {
    let answers: Vec<Recommendation> = [20, 100, 300].iter().map(|&users| plan(&l4_request(users)).unwrap()).collect();
    let fits: Vec<u32> = answers.iter().map(|r| r.employees_at_slo).collect();
    let (fewest, most) = (*fits.iter().min().unwrap(), *fits.iter().max().unwrap());
    // Before the fix: [26, 26, 1].
    assert!(fewest >= 10, "a one-GPU L4 fits about 20 employees at p99 TTFT <= 2 s, not {fits:?}");
    assert!(f64::from(most) <= 1.25 * f64::from(fewest), "employees that fit differ by more than 25 %: {fits:?}");
    for (a, b) in answers.iter().zip(&answers[1..]) {
        if a.gate == b.gate {
            // The same limits are searched the same way: the number asked about plays no part.
            assert_eq!(a.employees_at_slo, b.employees_at_slo, "{a}\n{b}");
        }
    }
    for answer in &answers {
        assert!(!answer.employees_capped);
        assert_eq!(answer.measured.employees_at_slo, Some(answer.employees_at_slo));
        assert!(answer.measured.requests >= 4000, "{answer}");
        let text = answer.to_string();
        let line = format!(
            "employees that fit at p99 TTFT <= 2 s with these limits ({}): {}",
            answer.gateway_flags, answer.employees_at_slo
        );
        assert!(text.contains(&line), "the output must say which limits the figure is for:\n{text}");
    }
    assert!(answers[0].meets_slo == (20 <= answers[0].employees_at_slo) || answers[0].to_string().contains("note:"));
    assert!(!answers[2].meets_slo, "300 employees do not fit on one L4:\n{}", answers[2]);
}

#[test]
fn a_probe_needs_requests() {
    let mut request = l4_request(20);
    request.samples_per_probe = 0;
    assert_eq!(plan(&request).unwrap_err(), ConfigError::Zero { what: "samples per probe" });
}
