//! `ModelSpec::from_hf_config` on every published config in `../shared/fixtures/hf-configs/`, with the
//! expected byte counts derived by hand from each file's values.
//!
//! Notation in the comments: one layer of full or sliding attention stores, per token,
//! `2 (K and V) × kv_heads × head_dim × 2 bytes (bf16)`; `B` below is that product. Token counts are chosen
//! below, at and above each window and off block boundaries.
#![cfg(feature = "hf-config")]

use std::path::{Path, PathBuf};

use kvgate::ConfigError;
use kvgate::kv::{Engine, KvDtype, LayerKind, ModelSpec, RecurrentKind};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures/hf-configs");

/// The fixture folder, or `None` (after saying so) when it is absent outside CI.
fn dir() -> Option<PathBuf> {
    let dir = Path::new(DIR);
    if dir.is_dir() {
        return Some(dir.to_path_buf());
    }
    if std::env::var_os("CI").is_some() {
        panic!("fixture folder {DIR} is missing, and CI is set");
    }
    eprintln!("skipped: fixture folder {DIR} is missing (it is ../shared beside the repository)");
    None
}

fn load(file: &str) -> Option<ModelSpec> {
    let path = dir()?.join(file);
    let json = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(ModelSpec::from_hf_config(&json).unwrap_or_else(|e| panic!("{file}: {e}")))
}

const BF16: KvDtype = KvDtype::Bf16;

/// Asserts `kv_bytes`, `kv_bytes_paged` (block 16) and `kv_bytes_naive` at `tokens`.
#[track_caller]
fn check(spec: &ModelSpec, tokens: u64, real: u64, paged: u64, naive: u64) {
    assert_eq!(spec.kv_bytes(tokens, BF16), real, "kv_bytes({tokens})");
    assert_eq!(spec.kv_bytes_paged(tokens, BF16, 16), paged, "kv_bytes_paged({tokens}, 16)");
    assert_eq!(spec.kv_bytes_naive(tokens, BF16), naive, "kv_bytes_naive({tokens})");
    assert_eq!(spec.kv_bytes(tokens, KvDtype::Fp8) * 2, real, "fp8 is half of bf16");
}

/// Files this test knows; `every_fixture_is_covered` fails when a new one appears.
const KNOWN: &[&str] = &[
    "deepseek-v3.json",
    "gemma-2-9b.json",
    "gemma-3-27b-it.json",
    "gemma-4-26b-a4b-it.json",
    "gpt-oss-20b.json",
    "llama-3.1-8b.json",
    "llama-3.2-1b.json",
    "mistral-7b-v0.1.json",
    "mixtral-8x7b.json",
    "qwen2.5-7b-instruct.json",
    "qwen3-8b.json",
    "qwen3-next-80b-a3b.json",
];

#[test]
fn every_fixture_is_covered() {
    let Some(dir) = dir() else { return };
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".json"))
        .collect();
    found.sort();
    assert_eq!(found, KNOWN, "add expectations for new fixtures to tests/kv_fixtures.rs");
    for file in KNOWN {
        load(file);
    }
}

#[test]
fn llama_3_1_8b_derives_head_dim() {
    let Some(spec) = load("llama-3.1-8b.json") else {
        return;
    };
    // No head_dim: 4096 / 32 = 128. 32 full layers, 8 KV heads. B = 2 × 8 × 128 × 2 = 4096; per token
    // 32 × 4096 = 131_072.
    assert_eq!(spec.groups().len(), 1);
    assert_eq!(spec.full_layers(), 32);
    assert_eq!(spec.bytes_per_token(BF16), 131_072);
    // 1000 tokens → 63 blocks = 1008 slots paged.
    check(&spec, 1000, 1000 * 131_072, 1008 * 131_072, 1000 * 131_072);
    check(&spec, 32_768, 32_768 * 131_072, 32_768 * 131_072, 32_768 * 131_072);
    // 100_001 → 6251 blocks = 100_016 slots.
    check(&spec, 100_001, 100_001 * 131_072, 100_016 * 131_072, 100_001 * 131_072);
    assert_eq!(spec.groups(), ModelSpec::preset("llama-3.1-8b").unwrap().groups());
}

#[test]
fn llama_3_2_1b() {
    let Some(spec) = load("llama-3.2-1b.json") else {
        return;
    };
    // head_dim 64; 16 layers × 8 KV heads: B = 2 × 8 × 64 × 2 = 2048; per token 16 × 2048 = 32_768.
    assert_eq!(spec.bytes_per_token(BF16), 32_768);
    // 17 tokens → 2 blocks = 32 slots.
    check(&spec, 17, 17 * 32_768, 32 * 32_768, 17 * 32_768);
    check(&spec, 131_072, 131_072 * 32_768, 131_072 * 32_768, 131_072 * 32_768);
    assert_eq!(spec.groups(), ModelSpec::preset("llama-3.2-1b").unwrap().groups());
}

#[test]
fn mistral_7b_slides_every_layer() {
    let Some(spec) = load("mistral-7b-v0.1.json") else {
        return;
    };
    // 32 layers, all sliding over 4096 tokens; 4096 / 32 = 128; B = 2 × 8 × 128 × 2 = 4096.
    assert_eq!((spec.sliding_layers(), spec.full_layers()), (32, 0));
    let per_token = 32 * 4096;
    // Below the window: 1000 tokens, paged 1008.
    check(&spec, 1000, 1000 * per_token, 1008 * per_token, 1000 * per_token);
    // At the window: 4096 (a multiple of 16).
    check(&spec, 4096, 4096 * per_token, 4096 * per_token, 4096 * per_token);
    // Above: 5001 tokens hold 4096 per layer; naive counts all 5001.
    check(&spec, 5001, 4096 * per_token, 4096 * per_token, 5001 * per_token);
    // 32k: 8 times less than naive.
    check(&spec, 32_768, 4096 * per_token, 4096 * per_token, 32_768 * per_token);
    assert_eq!(spec.groups(), ModelSpec::preset("mistral-7b").unwrap().groups());
}

#[test]
fn mixtral_null_window_is_full() {
    let Some(spec) = load("mixtral-8x7b.json") else {
        return;
    };
    // sliding_window: null → 32 full layers, 8 × 128: per token 32 × 4096 = 131_072.
    assert_eq!((spec.sliding_layers(), spec.full_layers()), (0, 32));
    check(&spec, 4097, 4097 * 131_072, 4112 * 131_072, 4097 * 131_072);
    assert_eq!(spec.groups(), ModelSpec::preset("mixtral-8x7b").unwrap().groups());
}

#[test]
fn qwen2_5_7b_window_is_disabled() {
    let Some(spec) = load("qwen2.5-7b-instruct.json") else {
        return;
    };
    // sliding_window 131072 but use_sliding_window false → 28 full layers.
    // 3584 / 28 = 128; 4 KV heads: B = 2 × 4 × 128 × 2 = 2048; per token 28 × 2048 = 57_344.
    assert_eq!((spec.sliding_layers(), spec.full_layers()), (0, 28));
    check(&spec, 1000, 1000 * 57_344, 1008 * 57_344, 1000 * 57_344);
    // Past the (disabled) window the cache keeps growing: 131_073 → 8193 blocks = 131_088 slots.
    check(&spec, 131_073, 131_073 * 57_344, 131_088 * 57_344, 131_073 * 57_344);
    assert_eq!(spec.groups(), ModelSpec::preset("qwen2.5-7b").unwrap().groups());
}

#[test]
fn qwen3_8b() {
    let Some(spec) = load("qwen3-8b.json") else {
        return;
    };
    // 36 full layers, 8 KV heads × head_dim 128: per token 36 × 4096 = 147_456.
    assert_eq!(spec.bytes_per_token(BF16), 147_456);
    check(&spec, 40_000, 40_000 * 147_456, 40_000 * 147_456, 40_000 * 147_456);
    check(&spec, 40_001, 40_001 * 147_456, 40_016 * 147_456, 40_001 * 147_456);
    assert_eq!(spec.groups(), ModelSpec::preset("qwen3-8b").unwrap().groups());
}

#[test]
fn gemma_2_9b_alternates() {
    let Some(spec) = load("gemma-2-9b.json") else {
        return;
    };
    // No layer_types: even layers slide (4096), odd are global → 21 + 21. 8 KV heads × 256:
    // B = 2 × 8 × 256 × 2 = 8192.
    assert_eq!((spec.sliding_layers(), spec.full_layers()), (21, 21));
    let b = 8192;
    // Below: 1000 tokens in 42 layers; paged 1008.
    check(&spec, 1000, 42 * 1000 * b, 42 * 1008 * b, 42 * 1000 * b);
    // At the window.
    check(&spec, 4096, 42 * 4096 * b, 42 * 4096 * b, 42 * 4096 * b);
    // Above: 8191 tokens: sliding 21 × 4096, global 21 × 8191 (paged 8192).
    check(&spec, 8191, (21 * 4096 + 21 * 8191) * b, (21 * 4096 + 21 * 8192) * b, 42 * 8191 * b);
    assert_eq!(spec.groups(), ModelSpec::preset("gemma-2-9b").unwrap().groups());
}

#[test]
fn gemma_3_27b_reads_text_config_and_every_6th_global() {
    let Some(spec) = load("gemma-3-27b-it.json") else {
        return;
    };
    // text_config: 62 layers, no layer_types, no sliding_window_pattern → global at (i + 1) % 6 == 0:
    // i = 5, 11, ..., 59 → 10 global, 52 sliding over 1024. (vision_config's 27 layers are ignored.)
    // head_dim 128 (not 5376 / 32 = 168); 16 KV heads: B = 2 × 16 × 128 × 2 = 8192.
    assert_eq!((spec.sliding_layers(), spec.full_layers(), spec.num_layers()), (52, 10, 62));
    assert_eq!(spec.name(), "gemma3");
    let b = 8192;
    // Below: 1000 → all 62 layers hold 1000 (paged 1008).
    check(&spec, 1000, 62 * 1000 * b, 62 * 1008 * b, 62 * 1000 * b);
    // At the window.
    check(&spec, 1024, 62 * 1024 * b, 62 * 1024 * b, 62 * 1024 * b);
    // Just above: sliding stay at 1024; global 1025 (paged 1040).
    check(&spec, 1025, (52 * 1024 + 10 * 1025) * b, (52 * 1024 + 10 * 1040) * b, 62 * 1025 * b);
    // 32k: real (52 × 1024 + 10 × 32768) × 8192 = 3_120_562_176 (3.1 GB);
    //      naive 62 × 32768 × 8192 = 16_642_998_272 (15.5 GiB).
    check(&spec, 32_768, 3_120_562_176, 3_120_562_176, 16_642_998_272);
    // 128k.
    check(&spec, 131_072, (52 * 1024 + 10 * 131_072) * b, (52 * 1024 + 10 * 131_072) * b, 62 * 131_072 * b);
    assert_eq!(spec.groups(), ModelSpec::preset("gemma-3-27b").unwrap().groups());
}

#[test]
fn gemma_4_26b_global_heads_differ() {
    let Some(spec) = load("gemma-4-26b-a4b-it.json") else {
        return;
    };
    // text_config.layer_types: 25 sliding (1024) + 5 full. Sliding: 8 KV heads × head_dim 256,
    // B_s = 2 × 8 × 256 × 2 = 8192. Full: num_global_key_value_heads 2 × global_head_dim 512,
    // B_f = 2 × 2 × 512 × 2 = 4096 (K and V kept apart although attention_k_eq_v is true).
    // num_kv_shared_layers 0 → no shared layers.
    assert_eq!((spec.sliding_layers(), spec.full_layers(), spec.no_kv_layers()), (25, 5, 0));
    assert!(
        spec.groups().iter().any(|g| g.kind() == LayerKind::Full { kv_heads: 2, k_head_dim: 512, v_head_dim: 512 })
    );
    let (bs, bf) = (8192, 4096);
    // Below: 1000 (paged 1008). Naive treats sliding layers as full with their own heads: same below.
    check(&spec, 1000, 1000 * (25 * bs + 5 * bf), 1008 * (25 * bs + 5 * bf), 1000 * (25 * bs + 5 * bf));
    // Above: 5000 (paged 5008 for full layers, 1024 for sliding).
    check(&spec, 5000, 25 * 1024 * bs + 5 * 5000 * bf, 25 * 1024 * bs + 5 * 5008 * bf, 5000 * (25 * bs + 5 * bf));
    assert_eq!(spec.groups(), ModelSpec::preset("gemma-4-26b-a4b").unwrap().groups());
}

#[test]
fn deepseek_v3_caches_the_mla_latent() {
    let Some(spec) = load("deepseek-v3.json") else {
        return;
    };
    // 61 MLA layers × (kv_lora_rank 512 + qk_rope_head_dim 64 = 576) × 2 bytes = 70_272 per token; no factor
    // of 2. num_key_value_heads (128) plays no part: read as K/V heads (K 128 + 64, V 128) it would give
    // 128 × (192 + 128) = 40_960 elements per layer, 71 times the latent.
    assert_eq!(spec.groups()[0].kind(), LayerKind::Mla { latent_dim: 576 });
    assert_eq!(spec.bytes_per_token(BF16), 70_272);
    check(&spec, 1000, 1000 * 70_272, 1008 * 70_272, 1000 * 70_272);
    check(&spec, 163_840, 163_840 * 70_272, 163_840 * 70_272, 163_840 * 70_272);
    assert_eq!(spec.groups(), ModelSpec::preset("deepseek-v3").unwrap().groups());
}

#[test]
fn gpt_oss_20b_layer_types_and_small_window() {
    let Some(spec) = load("gpt-oss-20b.json") else {
        return;
    };
    // layer_types: 12 sliding (window 128) + 12 full; 8 KV heads × head_dim 64: B = 2 × 8 × 64 × 2 = 2048.
    assert_eq!((spec.sliding_layers(), spec.full_layers()), (12, 12));
    let b = 2048;
    // Below: 100 tokens (paged 112).
    check(&spec, 100, 24 * 100 * b, 24 * 112 * b, 24 * 100 * b);
    // At: 128.
    check(&spec, 128, 24 * 128 * b, 24 * 128 * b, 24 * 128 * b);
    // Above: 129 → sliding 128, full 129 (paged 144).
    check(&spec, 129, (12 * 128 + 12 * 129) * b, (12 * 128 + 12 * 144) * b, 24 * 129 * b);
    check(&spec, 32_768, (12 * 128 + 12 * 32_768) * b, (12 * 128 + 12 * 32_768) * b, 24 * 32_768 * b);
    assert_eq!(spec.groups(), ModelSpec::preset("gpt-oss-20b").unwrap().groups());
}

#[test]
fn qwen3_next_linear_layers_hold_nothing() {
    let Some(spec) = load("qwen3-next-80b-a3b.json") else {
        return;
    };
    // full_attention_interval 4 → layers 3, 7, ..., 47 (12) full; 36 linear attention, no KV cache.
    // 2 KV heads × head_dim 256: B = 2 × 2 × 256 × 2 = 2048; per token 12 × 2048 = 24_576.
    assert_eq!((spec.full_layers(), spec.recurrent_layers()), (12, 36));
    // Gated DeltaNet state: (4 − 1) × (2 × 16 × 128 + 32 × 128) + 32 × 128 × 128 = 24,576 + 524,288.
    let gdn = LayerKind::Recurrent { kind: RecurrentKind::GatedDeltaNet, state_elements: 548_864 };
    assert!(spec.groups().iter().any(|g| g.kind() == gdn));
    assert_eq!(spec.bytes_per_token(BF16), 24_576);
    check(&spec, 1000, 1000 * 24_576, 1008 * 24_576, 1000 * 24_576);
    check(&spec, 262_143, 262_143 * 24_576, 262_144 * 24_576, 262_143 * 24_576);
    assert_eq!(spec.groups(), ModelSpec::preset("qwen3-next-80b-a3b").unwrap().groups());
}

// Self-contained configs for rules no fixture shows (written from the facts, not copied).

#[test]
fn gemma_4_shared_kv_layers_and_null_global_heads() {
    let json = r#"{"model_type": "gemma4", "text_config": {"model_type": "gemma4_text",
        "num_hidden_layers": 6, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
        "global_head_dim": 128, "num_global_key_value_heads": null, "sliding_window": 512,
        "num_kv_shared_layers": 2,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                        "sliding_attention", "sliding_attention", "full_attention"]}}"#;
    let spec = ModelSpec::from_hf_config(json).unwrap();
    // Layers 4 and 5 reuse earlier caches: 3 sliding + 1 full (4 heads × 128, null → num_key_value_heads) + 2 shared.
    assert_eq!((spec.sliding_layers(), spec.full_layers(), spec.no_kv_layers()), (3, 1, 2));
    // Per token below the window: 3 × (2 × 4 × 64) + 1 × (2 × 4 × 128) = 1536 + 1024 = 2560 elements.
    assert_eq!(spec.bytes_per_token(KvDtype::Fp8), 2560);
}

#[test]
fn absent_keys_take_the_class_defaults() {
    // DeepseekV3Config: 61 layers, kv_lora_rank 512, qk_rope_head_dim 64.
    let spec = ModelSpec::from_hf_config(r#"{"model_type": "deepseek_v3"}"#).unwrap();
    assert_eq!(spec.groups(), ModelSpec::preset("deepseek-v3").unwrap().groups());
    // LlamaConfig without hidden_size: 4096 / 2 heads = 2048 per head.
    let spec =
        ModelSpec::from_hf_config(r#"{"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 2}"#);
    assert_eq!(spec.unwrap().groups()[0].kind(), LayerKind::Full { kv_heads: 2, k_head_dim: 2048, v_head_dim: 2048 });
    let err = ModelSpec::from_hf_config(r#"{"model_type": "mamba", "num_hidden_layers": 2}"#);
    assert_eq!(err, Err(ConfigError::UnsupportedArchitecture { model_type: "mamba".into() }));
}

// The figures of vLLM's own allocator, from the published files.

#[test]
fn engine_exact_figures_from_the_published_configs() {
    let (Some(gemma), Some(gpt_oss), Some(next)) =
        (load("gemma-3-27b-it.json"), load("gpt-oss-20b.json"), load("qwen3-next-80b-a3b.json"))
    else {
        return;
    };
    // Gemma 3 27B at 32,768 tokens: one page = 16 tokens × 8192 B = 131,072 B; group size 10 (10 full, 52
    // sliding: 52 ≥ 1.5 × 10); 1 full group of 2048 blocks, 6 sliding groups (the last padded with 8 empty
    // layers) of 2048 − (32,768 − 1024) / 16 = 64 blocks each: (2048 + 6 × 64) × 10 × 131,072.
    assert_eq!(gemma.sequence_bytes(32_768, KvDtype::Bf16, 16, Engine::Vllm), 3_187_671_040);
    assert_eq!(gemma.kv_bytes_paged(32_768, KvDtype::Bf16, 16), 3_120_562_176);
    // gpt-oss-20b at 1000 tokens: a sliding layer holds cdiv(1000, 16) − (1000 − 128) / 16 = 63 − 54 = 9 blocks.
    let layout = gpt_oss.kv_layout(KvDtype::Bf16, 16, Engine::Vllm).unwrap();
    assert_eq!(layout.group_size(), 12);
    // 12 full + 12 sliding: one group each; a block id = 12 × 16 × 2048 = 393,216 B; 63 + 9 = 72 ids.
    assert_eq!(layout.sequence_blocks(1000), 63 + 9);
    assert_eq!(layout.sequence_bytes(1000), 72 * 393_216);
    // Qwen3-Next 80B at 1000 tokens: state page 548,864 × 2 = 1,097,728 B raises the attention block to
    // 16 × cdiv(1,097,728, 16 × 2048) = 544 tokens, page 544 × 2048 = 1,114,112 B (the state padded to it);
    // group size 12: 1 attention group of cdiv(1000, 544) = 2 blocks + 3 state groups of 1:
    // 5 × 12 × 1,114,112 = 66,846,720 B (kvgate's per-layer model says 24.8 MB).
    let layout = next.kv_layout(KvDtype::Bf16, 16, Engine::Vllm).unwrap();
    assert_eq!(layout.block_size(), 544);
    assert_eq!(layout.sequence_bytes(1000), 66_846_720);
    assert_eq!(next.kv_bytes_paged(1000, KvDtype::Bf16, 16), 1008 * 24_576);
}
