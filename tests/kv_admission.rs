//! Admission by KV bytes: requests are priced by what the engine really allocates for them.
#![cfg(not(loom))]

use kvgate::kv::{GpuPlan, KvDtype, ModelSpec};
use kvgate::{Admission, ConfigError, Limit, Rejection, Request};

#[test]
fn sliding_window_model_admits_what_the_plan_says() {
    let gemma = ModelSpec::preset("gemma-3-27b").unwrap();
    let plan = GpuPlan::builder(gemma.clone()).gpu("h100-80").build().unwrap();
    let admission = Admission::builder().gpu_plan(&plan).build().unwrap();
    assert!(admission.kv_in_bytes());
    let request = Request::new(32_768 - 1_024, 1_024);
    let mut held = Vec::new();
    while let Ok(permit) = admission.try_admit(&request) {
        // Priced as vLLM holds it: 3,187,671,040 B at 32k (groups of 10 layers, the last sliding group
        // padded), reserved at the most it holds while it grows (one more sliding block at some lengths).
        assert_eq!(permit.kv_reserved(), plan.max_sequence_bytes(32_768));
        assert_eq!(plan.sequence_bytes(32_768), 3_187_671_040);
        assert!(permit.kv_reserved() >= plan.sequence_bytes(32_768));
        held.push(permit);
    }
    // Exactly the sequences vLLM's block accounting fits on the card, each at its largest.
    assert_eq!(held.len() as u64, plan.kv_budget_bytes() / plan.max_sequence_bytes(32_768));
    assert!(held.len() as u64 <= plan.max_sequences(32_768), "{} vs {}", held.len(), plan.max_sequences(32_768));
    // Counting every layer as full attention would have admitted far fewer.
    let naive = plan.kv_pool_bytes() / gemma.kv_bytes_naive(32_768, KvDtype::Bf16);
    assert!(held.len() as u64 >= 4 * naive.max(1), "{} vs naive {naive}", held.len());
    assert!(matches!(admission.try_admit(&request), Err(Rejection::NoCapacity { .. })));
    drop(held);
    assert_eq!(admission.snapshot().kv_used, 0);
}

#[test]
fn byte_budget_too_small_for_one_request_is_too_large() {
    let spec = ModelSpec::builder("tiny").full(2, 1, 4).build().unwrap();
    // 2 layers x 2 (K, V) x 1 head x 4 dims x 2 bytes = 32 bytes per token; 16-token blocks.
    let admission = Admission::builder().kv_model(spec, KvDtype::Bf16, 16).kv_capacity_bytes(32 * 32).build().unwrap();
    let fits = admission.try_admit(&Request::new(20, 12)).unwrap();
    assert_eq!(fits.kv_reserved(), 32 * 32);
    drop(fits);
    // 33 tokens round up to 3 blocks = 48 tokens of cache.
    assert_eq!(
        admission.try_admit(&Request::new(33, 0)).unwrap_err(),
        Rejection::TooLarge { limit: Limit::KvBudget, requested: 32 * 48, capacity: 32 * 32 }
    );
}

#[test]
fn kv_budget_units_must_match_the_pricing() {
    let spec = ModelSpec::preset("llama-3.1-8b").unwrap();
    assert!(matches!(
        Admission::builder().kv_model(spec.clone(), KvDtype::Fp8, 16).build(),
        Err(ConfigError::Conflict(_))
    ));
    assert!(matches!(
        Admission::builder().kv_model(spec.clone(), KvDtype::Fp8, 16).kv_capacity_tokens(10).build(),
        Err(ConfigError::Conflict(_))
    ));
    assert!(matches!(Admission::builder().kv_capacity_bytes(10).build(), Err(ConfigError::Conflict(_))));
    assert!(matches!(
        Admission::builder().kv_model(spec, KvDtype::Fp8, 16).kv_capacity_bytes(0).build(),
        Err(ConfigError::Zero { .. })
    ));
}
