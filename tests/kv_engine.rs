//! Bytes per sequence under each engine's allocator, each expectation derived by hand (the arithmetic is
//! in the comments) from vLLM's and llama.cpp's rules — at token counts below, at and above every window
//! and chunk, and off block boundaries.
//!
//! Notation: `u` = bytes one token occupies in one layer; `page` = `block × u`; a vLLM block id costs
//! `group_size × page` (or a page of every layer when all layers form one group).

use kvgate::kv::{Engine, GpuPlan, GroupPolicy, KvDtype, ModelSpec, RecurrentKind, WeightDtype};

const BF16: KvDtype = KvDtype::Bf16;

fn bytes(spec: &ModelSpec, tokens: u64, engine: Engine) -> u64 {
    spec.sequence_bytes(tokens, BF16, 16, engine)
}

#[test]
fn uniform_model() {
    // 2 full layers, 8 KV heads of 128: u = 2 × 8 × 128 × 2 = 4096; one group of both layers, a block id
    // costs 2 × 16 × 4096 = 131,072 B.
    let spec = ModelSpec::builder("uniform").full(2, 8, 128).build().unwrap();
    let layout = spec.kv_layout(BF16, 16, Engine::Vllm).unwrap();
    assert_eq!((layout.group_size(), layout.block_bytes()), (2, 131_072));
    assert_eq!(bytes(&spec, 0, Engine::Vllm), 0);
    assert_eq!(bytes(&spec, 1, Engine::Vllm), 131_072); // 1 block
    assert_eq!(bytes(&spec, 16, Engine::Vllm), 131_072); // exactly 1 block
    assert_eq!(bytes(&spec, 17, Engine::Vllm), 2 * 131_072);
    assert_eq!(bytes(&spec, 1000, Engine::Vllm), 63 * 131_072); // cdiv(1000, 16) = 63
    // Nothing to switch off: the uniform engine agrees, and so does the per-layer paged count.
    assert_eq!(bytes(&spec, 1000, Engine::VllmUniform), 63 * 131_072);
    assert_eq!(spec.kv_bytes_paged(1000, BF16, 16), 63 * 131_072);
}

/// 5 sliding layers (window 100) and 2 full layers, 1 KV head of 64: u = 2 × 64 × 2 = 256, page = 4096.
/// Group size 2 (5 ≥ 1.5 × 2): one full group and cdiv(5, 2) = 3 sliding groups, the last padded with one
/// empty layer; a block id costs 2 × 4096 = 8192 B.
fn sliding_hybrid() -> ModelSpec {
    ModelSpec::builder("sliding").sliding(5, 1, 64, 100).full(2, 1, 64).build().unwrap()
}

#[test]
fn sliding_hybrid_with_a_padded_group() {
    let spec = sliding_hybrid();
    let layout = spec.kv_layout(BF16, 16, Engine::Vllm).unwrap();
    assert_eq!((layout.group_size(), layout.block_bytes()), (2, 8192));
    let groups: Vec<_> = layout.groups().iter().map(|g| (g.policy(), g.groups(), g.layers())).collect();
    assert_eq!(groups, [(GroupPolicy::Sliding { window: 100 }, 3, 5), (GroupPolicy::Full, 1, 2)]);
    // Below the window, 50 tokens: every group cdiv(50, 16) = 4 blocks; 4 + 3 × 4 = 16 ids.
    assert_eq!(bytes(&spec, 50, Engine::Vllm), 16 * 8192);
    // The padding costs: 8 layers' worth of pages against 7 real layers.
    assert_eq!(spec.kv_bytes_paged(50, BF16, 16), 7 * 64 * 256);
    // At the window, 100 tokens: 7 blocks everywhere (nothing skipped yet); 7 + 21 = 28.
    assert_eq!(bytes(&spec, 100, Engine::Vllm), 28 * 8192);
    // Above, 150: full cdiv(150, 16) = 10; sliding 10 − (150 − 100) / 16 = 7; 10 + 21 = 31.
    assert_eq!(bytes(&spec, 150, Engine::Vllm), 31 * 8192);
    // 1003: full 63; sliding 63 − 903 / 16 = 63 − 56 = 7; 63 + 21 = 84.
    assert_eq!(bytes(&spec, 1003, Engine::Vllm), 84 * 8192);
    // The uniform engine keeps every token in all 7 layers: cdiv(1003, 16) = 63 blocks × 7 pages.
    assert_eq!(bytes(&spec, 1003, Engine::VllmUniform), 63 * 7 * 4096);
}

#[test]
fn the_extra_sliding_block() {
    let spec = sliding_hybrid();
    // ceil(100 / 16) = 7 blocks cover a window, but the window rarely starts on a block boundary.
    // 113 tokens: cdiv(113, 16) = 8, skipped (113 − 100) / 16 = 0 → 8 blocks per sliding group.
    // Full: 8. Total 8 + 3 × 8 = 32.
    assert_eq!(bytes(&spec, 113, Engine::Vllm), 32 * 8192);
    // 116: still 8 sliding blocks (16 / 16 = 1 skipped only from 116: cdiv = 8, 16 / 16 = 1 → 7).
    assert_eq!(bytes(&spec, 116, Engine::Vllm), (8 + 3 * 7) * 8192);
    // 117: cdiv = 8, skipped 17 / 16 = 1 → 7; 118 … 128 the same; 129: cdiv 9 − 29 / 16 = 9 − 1 = 8 again.
    assert_eq!(bytes(&spec, 129, Engine::Vllm), (9 + 3 * 8) * 8192);
    // The peak over a request's life counts the extra block once it has been reachable: max over 1..=200
    // of each group: sliding cdiv(min(200, 100 + 15), 16) = 8, full cdiv(200, 16) = 13.
    let layout = spec.kv_layout(BF16, 16, Engine::Vllm).unwrap();
    assert_eq!(layout.max_sequence_bytes(200), (13 + 3 * 8) * 8192);
    assert_eq!(layout.sequence_bytes(200), (13 + 3 * 7) * 8192); // 13 − 100 / 16 = 7 at 200 itself
}

#[test]
fn mamba_hybrid_raises_the_attention_block() {
    // Jamba-like: 4 attention layers (8 KV heads of 128, u = 4096) and 28 Mamba layers whose state is
    // (d_conv − 1 + d_state) × expand × hidden = (3 + 16) × 2 × 4096 = 155,648 elements = 311,296 B (bf16).
    // Attention block: 16 × cdiv(311,296, 16 × 4096) = 16 × 5 = 80 tokens; page 80 × 4096 = 327,680 B,
    // the state padded to it. Group size 4 (28 ≥ 1.5 × 4): 1 attention group, 7 Mamba groups; a block id
    // costs 4 × 327,680 = 1,310,720 B.
    let spec =
        ModelSpec::builder("jamba").full(4, 8, 128).recurrent(28, RecurrentKind::Mamba, 155_648).build().unwrap();
    let layout = spec.kv_layout(BF16, 16, Engine::Vllm).unwrap();
    assert_eq!((layout.block_size(), layout.group_size(), layout.block_bytes()), (80, 4, 1_310_720));
    // 79 and 80 tokens: 1 attention block + 7 state blocks = 8.
    assert_eq!(bytes(&spec, 79, Engine::Vllm), 8 * 1_310_720);
    assert_eq!(bytes(&spec, 80, Engine::Vllm), 8 * 1_310_720);
    // 81: 2 + 7.
    assert_eq!(bytes(&spec, 81, Engine::Vllm), 9 * 1_310_720);
    // 1000: cdiv(1000, 80) = 13 + 7 = 20.
    assert_eq!(bytes(&spec, 1000, Engine::Vllm), 20 * 1_310_720);
    // The per-layer model sees only 4 layers × 1000 tokens × 4096 (the state is not a per-token cache).
    assert_eq!(spec.kv_bytes(1000, BF16), 4 * 1000 * 4096);
    // A larger block asked for is kept (and the state page padded to it): 128 tokens, page 524,288 B.
    let big = spec.kv_layout(BF16, 128, Engine::Vllm).unwrap();
    assert_eq!((big.block_size(), big.block_bytes()), (128, 4 * 524_288));
}

#[test]
fn gated_deltanet_hybrid() {
    // Qwen3-Next 80B: 12 attention layers (2 KV heads of 256, u = 2048) and 36 Gated DeltaNet layers with
    // 548,864-element states (1,097,728 B). Block 16 × cdiv(1,097,728, 32,768) = 16 × 34 = 544; page
    // 544 × 2048 = 1,114,112 B; group size 12; 1 attention group + 3 state groups; a block id costs
    // 12 × 1,114,112 = 13,369,344 B.
    let spec = ModelSpec::preset("qwen3-next-80b-a3b").unwrap();
    let layout = spec.kv_layout(BF16, 16, Engine::Vllm).unwrap();
    assert_eq!((layout.block_size(), layout.block_bytes()), (544, 13_369_344));
    for (tokens, attention_blocks) in [(100, 1), (544, 1), (545, 2), (1000, 2), (32_768, 61)] {
        // cdiv(tokens, 544) attention blocks + 3 state blocks.
        assert_eq!(bytes(&spec, tokens, Engine::Vllm), (attention_blocks + 3) * 13_369_344, "{tokens}");
    }
    // fp8 halves the attention page, so the block doubles: 16 × cdiv(1,097,728, 16 × 1024) = 1072; the
    // state (kept in bf16) does not shrink.
    assert_eq!(spec.kv_layout(KvDtype::Fp8, 16, Engine::Vllm).unwrap().block_size(), 1072);
}

#[test]
fn chunked_local_attention() {
    // Llama 4 style: 3 chunked layers (chunk 64) and 1 full layer, 1 KV head of 64: u = 256, page 4096.
    // Group size 1 (3 ≥ 1.5 × 1): 3 chunked groups and 1 full group; a block id costs 4096 B.
    let spec = ModelSpec::builder("llama4ish").chunked_local(3, 1, 64, 64).full(1, 1, 64).build().unwrap();
    // Below the chunk, 40 tokens: every layer cdiv(40, 16) = 3 blocks; 4 × 3 = 12.
    assert_eq!(bytes(&spec, 40, Engine::Vllm), 12 * 4096);
    // At the chunk, 64: 4 blocks everywhere (computed 63 → nothing skipped yet); 16.
    assert_eq!(bytes(&spec, 64, Engine::Vllm), 16 * 4096);
    // 65: a new chunk starts, its first 64 tokens (4 blocks) are freed: chunked 5 − 4 = 1; full 5; 5 + 3 = 8.
    assert_eq!(bytes(&spec, 65, Engine::Vllm), 8 * 4096);
    // 100: full 7; chunked 7 − 4 = 3; 7 + 9 = 16.
    assert_eq!(bytes(&spec, 100, Engine::Vllm), 16 * 4096);
    // The peak of a chunked group is a whole chunk: cdiv(64, 16) = 4 blocks.
    let layout = spec.kv_layout(BF16, 16, Engine::Vllm).unwrap();
    assert_eq!(layout.max_sequence_bytes(100), (7 + 3 * 4) * 4096);
    // Without the hybrid manager every layer keeps every token: 7 blocks × 4 pages.
    assert_eq!(bytes(&spec, 100, Engine::VllmUniform), 7 * 4 * 4096);
}

#[test]
fn mla_in_blocks_of_64() {
    // DeepSeek-V3: 61 MLA layers of 576 latent elements, u = 1152 B. One group; with FlashMLA's 64-token
    // blocks a block id costs 61 × 64 × 1152 = 4,497,408 B.
    let spec = ModelSpec::preset("deepseek-v3").unwrap();
    let layout = spec.kv_layout(BF16, 64, Engine::Vllm).unwrap();
    assert_eq!(layout.block_bytes(), 4_497_408);
    assert_eq!(layout.sequence_bytes(63), 4_497_408);
    assert_eq!(layout.sequence_bytes(64), 4_497_408);
    assert_eq!(layout.sequence_bytes(65), 2 * 4_497_408);
    // 1000 tokens: cdiv(1000, 64) = 16 blocks = 1024 slots (blocks of 16 would hold 1008).
    assert_eq!(layout.sequence_bytes(1000), 16 * 4_497_408);
    assert_eq!(spec.sequence_bytes(1000, BF16, 16, Engine::Vllm), 63 * 61 * 16 * 1152);
    // A plan on Hopper picks the 64-token block itself; on Ampere FlashMLA is unavailable and 16 stays.
    let plan = |gpu: &str, tp: u32| {
        GpuPlan::builder(spec.clone()).gpu(gpu).tensor_parallel(tp).weight_dtype(WeightDtype::Fp8).build().unwrap()
    };
    assert_eq!(plan("h200-141", 8).block_size(), 64);
    assert_eq!(plan("h200-141", 8).sequence_bytes_per_gpu(1000), 16 * 4_497_408);
    assert_eq!(plan("mi300x", 8).block_size(), 16);
}

#[test]
fn q8_0_and_q4_0_caches() {
    // Llama 3.1 8B: per layer and token a K row and a V row of 8 × 128 = 1024 values.
    // q8_0: 1024 / 32 = 32 blocks × 34 B = 1088 per row, 2176 per layer, × 32 layers = 69,632 B per token.
    // q4_0: 32 blocks × 18 B = 576 per row, 1152 per layer, 36,864 B per token. bf16: 131,072.
    let llama = ModelSpec::preset("llama-3.1-8b").unwrap();
    assert_eq!(llama.bytes_per_token(KvDtype::Q8_0), 69_632);
    assert_eq!(llama.bytes_per_token(KvDtype::Q4_0), 36_864);
    // llama.cpp -c 32768 -np 4: 4 slots of 8192 tokens, allocated up front whatever the request.
    let engine = Engine::llama_cpp(32_768, 4).unwrap();
    for tokens in [1, 1000, 8192] {
        assert_eq!(llama.sequence_bytes(tokens, KvDtype::Q8_0, 16, engine), 8192 * 69_632);
        assert_eq!(llama.sequence_bytes(tokens, KvDtype::Q4_0, 16, engine), 8192 * 36_864);
    }
    // Gemma 3 27B (rows of 16 × 128 = 2048 values: q8_0 64 × 34 = 2176 per row, 4352 per layer and token)
    // below, at and above its 1024-token window, per layer (no blocks): sliding layers keep min(t, 1024).
    let gemma = ModelSpec::preset("gemma-3-27b").unwrap();
    assert_eq!(gemma.kv_bytes(1000, KvDtype::Q8_0), 62 * 1000 * 4352);
    assert_eq!(gemma.kv_bytes(1024, KvDtype::Q8_0), 62 * 1024 * 4352);
    assert_eq!(gemma.kv_bytes(5001, KvDtype::Q8_0), (52 * 1024 + 10 * 5001) * 4352);
    assert_eq!(gemma.kv_bytes(5001, KvDtype::Q4_0), (52 * 1024 + 10 * 5001) * 2 * 64 * 18);
    // llama.cpp gives sliding layers pad256(min(slot, window + n_ubatch 512)) = 1536 cells per slot:
    // per slot (10 × 8192 + 52 × 1536) cells × 4352 B.
    assert_eq!(gemma.sequence_bytes(500, KvDtype::Q8_0, 16, engine), (10 * 8192 + 52 * 1536) * 4352);
}

#[test]
fn gpu_plan_follows_the_engine() {
    let gemma = ModelSpec::preset("gemma-3-27b").unwrap();
    let plan = GpuPlan::builder(gemma.clone()).gpu("h100-80").build().unwrap();
    assert_eq!(plan.engine(), Engine::Vllm);
    // A block id costs 10 pages (one group of 10 layers): 10 × 16 × 8192 = 1,310,720 B.
    assert_eq!(plan.block_bytes_per_gpu(), 1_310_720);
    assert_eq!(plan.num_blocks(), plan.kv_pool_bytes_per_gpu() / 1_310_720);
    // The log line: blocks // 7 groups × 16 tokens. The per-layer estimate (pool over 62 layers' pages)
    // says 62 / 70 more — about 13% off.
    let logged = plan.kv_cache_tokens();
    assert_eq!(logged, plan.num_blocks() / 7 * 16);
    let per_layer = plan.kv_pool_bytes_per_gpu() / (62 * 8192);
    assert!((per_layer as f64 / logged as f64 - 70.0 / 62.0).abs() < 0.01, "{per_layer} vs {logged}");
    // Sequences at 32k: (blocks − the null block) / (2048 + 6 × 64) ids.
    assert_eq!(plan.max_sequences(32_768), (plan.num_blocks() - 1) / 2432);
    assert_eq!(plan.sequence_bytes(32_768), 3_187_671_040);
    assert_eq!(plan.kv_budget_bytes(), (plan.num_blocks() - 1) * 1_310_720);
    // Prefill peak of gpt-oss-20b: a 10,000-token prompt in chunks of 8192 briefly holds, per sliding group,
    // cdiv(128 − 1 + 8192, 16) + 1 = 521 blocks (steady decode at 10,000: 625 − 9872 / 16 = 8); full groups
    // cdiv(10,000, 16) = 625.
    let gpt = GpuPlan::builder(ModelSpec::preset("gpt-oss-20b").unwrap())
        .gpu("h100-80")
        .weight_bytes(13_800_000_000)
        .build()
        .unwrap();
    assert_eq!(gpt.prefill_peak_bytes(10_000, 8192), (625 + 521) * 393_216);
    assert_eq!(gpt.sequence_bytes(10_000), (625 + 8) * 393_216);
}

#[test]
fn shared_prefix_is_charged_once() {
    // Llama 3.1 8B, 16-token blocks: a 4000-token system prompt is 250 whole blocks, shared by every request
    // using it; a request of 5000 tokens holds 313 blocks, 63 of them its own.
    let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80").build().unwrap();
    let block = plan.block_bytes_per_gpu(); // 2 MiB
    assert_eq!(plan.prefix_bytes(4000), 250 * block);
    assert_eq!(plan.max_suffix_bytes(5000, 4000), 63 * block);
    assert_eq!(plan.prefix_bytes(4000) + plan.max_suffix_bytes(5000, 4000), plan.max_sequence_bytes(5000));
    // A 4001-token prefix shares only its 250 whole blocks: the 251st is each request's own.
    assert_eq!(plan.prefix_bytes(4001), 250 * block);
    // 100 such requests fit in one prefix and 100 suffixes.
    let total = plan.prefix_bytes(4000) + 100 * plan.max_suffix_bytes(5000, 4000);
    assert!(total < 100 * plan.max_sequence_bytes(5000) / 4);
    // llama.cpp shares nothing between slots.
    let slots = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap())
        .gpu("l4")
        .engine(Engine::llama_cpp(16_384, 4).unwrap())
        .kv_dtype(KvDtype::Q8_0)
        .weight_dtype(WeightDtype::Q4_0)
        .build()
        .unwrap();
    assert_eq!(slots.prefix_bytes(2000), 0);
    assert_eq!(slots.max_suffix_bytes(4000, 2000), 4096 * 69_632);
    // Longer than a slot: never fits.
    assert_eq!(slots.max_sequence_bytes(4097), u64::MAX);
    assert_eq!((slots.max_sequences(4096), slots.max_sequences(4097)), (4, 0));
    assert_eq!(slots.kv_cache_tokens(), 16_384);
}

#[test]
fn engine_combinations_vllm_refuses_are_refused() {
    let next = ModelSpec::preset("qwen3-next-80b-a3b").unwrap();
    let plan = |engine, dtype| {
        GpuPlan::builder(next.clone()).gpu("h200-141").engine(engine).kv_dtype(dtype).tensor_parallel(2).build()
    };
    assert!(plan(Engine::VllmUniform, BF16).is_err()); // recurrent layers need the hybrid manager
    assert!(plan(Engine::Vllm, KvDtype::Q8_0).is_err()); // no q8_0 cache in vLLM
    assert!(plan(Engine::Vllm, BF16).is_ok());
    // llama.cpp slots that do not fit the pool are refused at build time.
    let llama = ModelSpec::preset("llama-3.1-8b").unwrap();
    let err = GpuPlan::builder(llama).gpu("l4").engine(Engine::llama_cpp(1_048_576, 8).unwrap()).build();
    let msg = err.unwrap_err().to_string();
    assert!(msg.contains("allocates its 8 slots up front"), "{msg}");
}

#[test]
fn a_cache_hit_is_whole_blocks_of_every_group() {
    // Gemma 4 26B A4B: sliding blocks of 16 tokens, full-attention blocks of 32. A later request takes
    // 1,024 tokens of a 1,040-token prefix from the cache (a multiple of both) and computes sliding block
    // 64 again into a block of its own: it is not part of the shared charge.
    let layout = ModelSpec::preset("gemma-4-26b-a4b").unwrap().kv_layout(KvDtype::Bf16, 16, Engine::Vllm).unwrap();
    let blocks: Vec<_> = layout.groups().iter().map(|g| (g.policy(), g.block_tokens(), g.groups())).collect();
    assert_eq!(blocks, [(GroupPolicy::Sliding { window: 1024 }, 16, 5), (GroupPolicy::Full, 32, 1)]);
    assert_eq!(layout.cache_hit_tokens(1_040), 1_024);
    assert_eq!(layout.prefix_bytes(1_040), layout.prefix_bytes(1_024));
    let (p, prompt, t) = (1_040, 1_100, 1_200);
    let held = support::vllm_blocks::held_together(&layout, p, prompt, &[t; 100]);
    assert!(held <= layout.prefix_bytes(p) + 100 * layout.max_suffix_bytes(t, p));
    // One group: a hit is whole blocks of it.
    let llama = ModelSpec::preset("llama-3.1-8b").unwrap().kv_layout(KvDtype::Bf16, 16, Engine::Vllm).unwrap();
    assert_eq!(llama.cache_hit_tokens(1_040), 1_040);
    assert_eq!(llama.cache_hit_tokens(1_047), 1_040);
}

#[test]
fn shared_prefixes_of_the_presets_cover_what_vllm_holds() {
    for name in ["llama-3.1-8b", "gemma-4-26b-a4b", "gemma-3-27b", "gpt-oss-20b", "qwen3-next-80b-a3b"] {
        let layout = ModelSpec::preset(name).unwrap().kv_layout(KvDtype::Bf16, 16, Engine::Vllm).unwrap();
        for (p, prompt) in [(1_024, 1_060), (1_040, 1_100), (4_096, 4_097), (4_095, 4_096), (3_000, 3_001)] {
            for t in [prompt, prompt + 100, prompt + 1_000, prompt + 5_000] {
                let held = support::vllm_blocks::held_together(&layout, p, prompt, &[t; 10]);
                let charged = layout.prefix_bytes(p) + 10 * layout.max_suffix_bytes(t, p);
                assert!(held <= charged, "{name}: p {p} prompt {prompt} t {t}: held {held} > charged {charged}");
            }
        }
    }
}

#[test]
fn chunked_layers_with_large_blocks_peak_within_the_sequence() {
    // Page unification gives the chunked layer (4 bytes a token) blocks of 131,072 tokens: its peak is
    // bounded by the blocks the sequence has, so the suffix with no prefix is the whole sequence's peak.
    let spec = ModelSpec::builder("m").full(1, 64, 128).chunked_local(1, 1, 1, 3).build().unwrap();
    let layout = spec.kv_layout(KvDtype::Bf16, 16, Engine::Vllm).unwrap();
    let groups: Vec<_> = layout.groups().iter().map(|g| (g.policy(), g.block_tokens())).collect();
    assert_eq!(groups, [(GroupPolicy::Full, 16), (GroupPolicy::Chunked { chunk: 3 }, 131_072)]);
    let t = 20_000;
    let most = (1..=t).map(|n| layout.sequence_bytes(n)).max().unwrap();
    assert_eq!((layout.max_suffix_bytes(t, 0), layout.max_sequence_bytes(t)), (most, most));
}
