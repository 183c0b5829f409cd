//! The engine model against hand arithmetic: roofline step times and paged-KV block accounting.
#![cfg(feature = "sim")]

use kvgate::kv::{Gpu, GpuPlan, ModelSpec, WeightDtype};
use kvgate::retry::SplitMix64;
use kvgate::sim::{Engine, EngineConfig, EngineEvent, Hardware, Roofline};
use std::collections::BTreeMap;
use std::time::Duration;

fn h100() -> Hardware {
    Hardware::from_gpu(&Gpu::preset("h100-80").unwrap(), WeightDtype::Bf16).unwrap()
}

fn llama8b_h100() -> GpuPlan {
    GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80").build().unwrap()
}

#[test]
fn decode_at_batch_one_reads_the_weights_once() {
    let plan = llama8b_h100();
    // 8,030,261,248 parameters x 2 bytes = 16.06 GB of bf16 weights, read at 3.35 TB/s: 4.794 ms.
    assert_eq!(plan.weight_bytes(), 16_060_522_496);
    let roofline = Roofline::new(plan.weight_bytes(), 8_030_261_248, h100()).unwrap();
    let step = roofline.step_time(0, 1);
    assert_eq!(step, Duration::from_nanos(4_794_186));
    assert!((step.as_secs_f64() - 16.06e9 / 3.35e12).abs() < 2e-6);
}

#[test]
fn decode_at_batch_64_adds_the_kv_it_reads() {
    let plan = llama8b_h100();
    let roofline = Roofline::new(plan.weight_bytes(), 8_030_261_248, h100()).unwrap();
    // 64 sequences of 2,048 tokens: 64 x 2048 x 131,072 bytes (32 layers x 2 x 8 heads x 128 x 2 B) = 17.18 GB.
    let kv = 64 * plan.sequence_bytes_per_gpu(2048);
    assert_eq!(kv, 64 * 2048 * 131_072);
    let expected = (16_060_522_496.0 + kv as f64) / 3.35e12;
    assert!((roofline.step_time(kv, 64).as_secs_f64() - expected).abs() < 1e-6);
    // 64 decode tokens cost 2 x 8.03e9 x 64 = 1.03 TFLOP: 2.1 ms at half of 989.4 TFLOP/s, below the memory time.
    assert!(roofline.compute_time(64) < roofline.memory_time(16_060_522_496 + kv));
}

#[test]
fn prefill_is_compute_bound() {
    let roofline = Roofline::new(16_060_522_496, 8_030_261_248, h100()).unwrap();
    // 2 x 8.03e9 x 8192 tokens / (989.4e12 x 0.5) = 266 ms, far above the 4.8 ms of reading the weights.
    let expected = 2.0 * 8_030_261_248.0 * 8192.0 / (989.4e12 * 0.5);
    let step = roofline.step_time(0, 8192).as_secs_f64();
    assert!((step - expected).abs() < 1e-6, "{step} vs {expected}");
    let efficient = roofline.compute_efficiency(1.0).unwrap().step_time(0, 8192).as_secs_f64();
    assert!((efficient - expected / 2.0).abs() < 1e-6);
    let with_overhead = roofline.step_overhead(Duration::from_millis(3)).step_time(0, 1);
    assert_eq!(with_overhead, Duration::from_nanos(4_794_186 + 3_000_000));
}

#[test]
fn mixture_of_experts_prefills_with_its_active_parameters() {
    let plan = GpuPlan::builder(ModelSpec::preset("qwen3-30b-a3b").unwrap()).gpu("h100-80").build().unwrap();
    let engine = Engine::new(&plan, EngineConfig::for_plan(&plan, WeightDtype::Bf16).unwrap()).unwrap();
    let active = plan.model().active_params().unwrap();
    assert!(active < plan.model().params().unwrap() / 5);
    let expected = 2.0 * active as f64 * 4096.0 / (989.4e12 * 0.5);
    assert!((engine.roofline().compute_time(4096).as_secs_f64() - expected).abs() < 1e-6);
}

/// A small GPU: llama-3.1-8b with a pool of exactly 64 blocks of 16 tokens (1024 tokens), 256 tokens a
/// step.
fn tiny_engine(max_num_seqs: u32) -> Engine {
    tiny_engine_with_budget(max_num_seqs, 256)
}

fn tiny_engine_with_budget(max_num_seqs: u32, budget: u32) -> Engine {
    let spec = ModelSpec::preset("llama-3.1-8b").unwrap();
    let block = 2 * 1024 * 1024; // 16 tokens x 131,072 bytes
    let plan = GpuPlan::builder(spec)
        .gpu_memory_bytes(20 << 30)
        .memory_utilization(1.0)
        .weight_bytes((20u64 << 30) - (2 << 30) - 64 * block)
        .build()
        .unwrap();
    assert_eq!(plan.num_blocks(), 64);
    let mut config = EngineConfig::new(h100());
    config.max_num_seqs = max_num_seqs;
    config.max_num_batched_tokens = budget;
    Engine::new(&plan, config).unwrap()
}

#[test]
fn max_model_len_defaults_to_what_one_sequence_can_hold() {
    let engine = tiny_engine(8);
    assert_eq!(engine.pool_bytes(), 64 * 2 * 1024 * 1024);
    assert_eq!(engine.max_model_len(), 1024);
    let mut too_long = EngineConfig::new(h100());
    too_long.max_model_len = Some(1025);
    assert!(Engine::new(engine.plan(), too_long).is_err());
}

#[test]
fn blocks_never_exceed_the_pool_and_preempted_sequences_free_theirs() {
    let mut engine = tiny_engine(16);
    // Eight sequences of 100 prompt tokens that each generate 200: 300 tokens = 19 blocks each at the end,
    // 152 blocks in all against a pool of 64: the engine must preempt.
    for tag in 0..8 {
        engine.submit(tag, 100, 200, 200).unwrap();
    }
    let mut finished = BTreeMap::new();
    let mut first_tokens = 0;
    let mut events = Vec::new();
    let mut steps = 0;
    while let Some(step) = engine.schedule() {
        assert!(step > Duration::ZERO);
        let status = engine.status();
        assert!(status.kv_used_bytes <= status.kv_pool_bytes, "over the pool: {status:?}");
        // Whole blocks only.
        assert_eq!(status.kv_used_bytes % (2 * 1024 * 1024), 0);
        engine.complete_step(&mut events);
        for event in events.drain(..) {
            match event {
                EngineEvent::FirstToken { .. } => first_tokens += 1,
                EngineEvent::Finished { tag, output_tokens } => {
                    assert!(finished.insert(tag, output_tokens).is_none(), "finished twice");
                }
            }
        }
        steps += 1;
        assert!(steps < 100_000, "no progress");
    }
    let status = engine.status();
    assert!(status.preemptions > 0, "the pool was meant to run out: {status:?}");
    assert_eq!(finished.len(), 8);
    assert!(finished.values().all(|&out| out == 200));
    assert_eq!(first_tokens, 8, "a preempted sequence does not produce a second first token");
    assert_eq!((status.kv_used_bytes, status.running, status.waiting), (0, 0, 0));
    assert_eq!(status.peak_kv_bytes, status.kv_pool_bytes);
    assert_eq!(status.tokens_generated, 8 * 200);
}

#[test]
fn a_preempted_sequence_gives_its_blocks_back_at_once() {
    let mut engine = tiny_engine_with_budget(4, 2048);
    // Two sequences whose prompts fill 32 blocks each: the pool is full after the first step.
    engine.submit(1, 512, 64, 64).unwrap();
    engine.submit(2, 512, 64, 64).unwrap();
    let mut events = Vec::new();
    engine.schedule().unwrap();
    assert_eq!(engine.status().kv_used_bytes, engine.pool_bytes());
    engine.complete_step(&mut events);
    // The next decode of sequence 1 needs a 33rd block: sequence 2 (the newest) is preempted and holds
    // nothing afterwards, so exactly sequence 1's 33 blocks are in use.
    engine.schedule().unwrap();
    let status = engine.status();
    assert_eq!(status.preemptions, 1);
    assert_eq!((status.running, status.waiting), (1, 1));
    assert_eq!(status.kv_used_bytes, 33 * 2 * 1024 * 1024);
}

#[test]
fn aborted_sequences_free_their_blocks_and_stale_ids_are_ignored() {
    let mut engine = tiny_engine(4);
    let a = engine.submit(1, 300, 10, 10).unwrap();
    let b = engine.submit(2, 300, 10, 10).unwrap();
    engine.schedule().unwrap();
    assert!(engine.status().kv_used_bytes > 0);
    assert!(engine.abort(a));
    assert!(!engine.abort(a), "a second abort is a no-op");
    let mut events = Vec::new();
    engine.complete_step(&mut events);
    assert!(events.iter().all(|e| !matches!(e, EngineEvent::FirstToken { tag: 1 })));
    assert!(engine.abort(b));
    assert_eq!(engine.status(), kvgate::sim::EngineStatus { steps: 1, ..engine.status() });
    assert_eq!((engine.status().kv_used_bytes, engine.status().running), (0, 0));
    assert!(engine.schedule().is_none());
}

#[test]
fn the_engine_refuses_what_it_cannot_hold() {
    let mut engine = tiny_engine(4);
    assert!(matches!(engine.submit(1, 1000, 100, 10), Err(kvgate::sim::EngineRefusal::TooLong { .. })));
    assert!(engine.submit(1, 0, 10, 10).is_err());
    let mut config = engine.config().clone();
    config.max_queued = Some(1);
    let mut capped = Engine::new(engine.plan(), config).unwrap();
    capped.submit(1, 10, 10, 10).unwrap();
    let refusal = capped.submit(2, 10, 10, 10).unwrap_err();
    assert_eq!(refusal.http_status(), 503);
}

#[test]
fn random_traffic_keeps_the_pool_invariant() {
    for seed in 0..20 {
        let mut rng = SplitMix64::new(seed);
        let mut engine = tiny_engine(1 + (rng.next_u64() % 12) as u32);
        let mut live = Vec::new();
        let mut done = 0;
        let mut submitted = 0;
        let mut events = Vec::new();
        for round in 0..400 {
            if rng.next_u64() % 3 == 0 && round < 300 {
                let prompt = 1 + (rng.next_u64() % 600) as u32;
                let max_new = 1 + (rng.next_u64() % 300) as u32;
                let output = 1 + (rng.next_u64() % u64::from(max_new)) as u32;
                if let Ok(id) = engine.submit(round, prompt, max_new, output) {
                    live.push(id);
                    submitted += 1;
                }
            }
            if rng.next_u64() % 17 == 0 && !live.is_empty() {
                let id = live.swap_remove((rng.next_u64() % live.len() as u64) as usize);
                if engine.abort(id) {
                    done += 1;
                }
            }
            if engine.schedule().is_some() {
                let status = engine.status();
                assert!(status.kv_used_bytes <= status.kv_pool_bytes);
                engine.complete_step(&mut events);
                done += events.iter().filter(|e| matches!(e, EngineEvent::Finished { .. })).count();
                events.clear();
            }
        }
        while engine.schedule().is_some() {
            engine.complete_step(&mut events);
            done += events.iter().filter(|e| matches!(e, EngineEvent::Finished { .. })).count();
            events.clear();
        }
        assert_eq!(done, submitted, "seed {seed}");
        assert_eq!(engine.status().kv_used_bytes, 0);
    }
}

#[test]
fn capacity_estimate_is_in_the_range_the_simulation_finds() {
    let plan = llama8b_h100();
    let engine = Engine::new(&plan, EngineConfig::for_plan(&plan, WeightDtype::Bf16).unwrap()).unwrap();
    let rate = engine.capacity_estimate(990.0, 320.0);
    assert!((15.0..25.0).contains(&rate), "{rate}");
    assert!(engine.capacity_estimate(990.0, 320.0) > engine.capacity_estimate(4000.0, 320.0));
}

#[test]
fn bad_engine_settings_are_errors() {
    let plan = llama8b_h100();
    let base = EngineConfig::new(h100());
    for config in [
        EngineConfig { max_num_seqs: 0, ..base.clone() },
        EngineConfig { max_num_batched_tokens: 0, ..base.clone() },
        EngineConfig { prefix_cache_hit: 1.0, ..base.clone() },
        EngineConfig { prefix_cache_hit: -0.1, ..base.clone() },
        EngineConfig { compute_efficiency: 0.0, ..base.clone() },
        EngineConfig { max_queued: Some(0), ..base.clone() },
        EngineConfig { max_model_len: Some(0), ..base.clone() },
        EngineConfig { chunked_prefill: false, ..base.clone() },
    ] {
        assert!(Engine::new(&plan, config).is_err());
    }
    assert!(Hardware::new(-3.35e12, 1e15).is_err());
    let custom =
        GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu_memory_bytes(80 << 30).build().unwrap();
    assert!(EngineConfig::for_plan(&custom, WeightDtype::Bf16).is_err());
    assert!(
        EngineConfig::for_plan(
            &GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("a100-80").build().unwrap(),
            WeightDtype::Fp8
        )
        .is_err()
    );
}
