//! One test per family: a config holding only the KV keys its smallest published variant carries (written
//! from the facts of that model's `config.json`, named in each case; the keys the published file leaves to
//! its `transformers` config class are left out here too) parses to the same spec as the same config with
//! every KV key spelled out at the class default — and to the layout the model really has.
#![cfg(feature = "hf-config")]

use kvgate::kv::{LayerKind, ModelSpec, RecurrentKind};
use serde_json::{Value, json};

/// Parses `stripped` and `stripped` + `explicit` (merged into `text_config` when there is one) and checks
/// they agree.
#[track_caller]
fn same(stripped: Value, explicit: Value) -> ModelSpec {
    let mut full = stripped.clone();
    let target = match full.get_mut("text_config") {
        Some(Value::Object(obj)) => obj,
        _ => full.as_object_mut().unwrap(),
    };
    for (key, value) in explicit.as_object().unwrap() {
        assert!(!target.contains_key(key), "{key} is in the stripped config already");
        target.insert(key.clone(), value.clone());
    }
    let a = ModelSpec::from_hf_config(&stripped.to_string()).unwrap_or_else(|e| panic!("stripped: {e}"));
    let b = ModelSpec::from_hf_config(&full.to_string()).unwrap_or_else(|e| panic!("explicit: {e}"));
    assert_eq!(a, b);
    a
}

fn full(kv_heads: u32, head_dim: u32) -> LayerKind {
    LayerKind::Full { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim }
}

#[test]
fn llama_3_1_8b_leaves_head_dim_out() {
    // meta-llama/Llama-3.2-1B carries every key; Llama-3.1-8B leaves head_dim to hidden / heads.
    let spec = same(
        json!({"model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096}),
        json!({"head_dim": 128}),
    );
    assert_eq!(spec.groups(), ModelSpec::preset("llama-3.1-8b").unwrap().groups());
}

#[test]
fn mistral_and_mixtral_leave_head_dim_out() {
    let spec = same(
        json!({"model_type": "mistral", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096, "sliding_window": 4096}),
        json!({"head_dim": 128}),
    );
    assert_eq!(spec.groups(), ModelSpec::preset("mistral-7b").unwrap().groups());
    let spec = same(
        json!({"model_type": "mixtral", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096, "sliding_window": null}),
        json!({"head_dim": 128}),
    );
    assert_eq!(spec.groups(), ModelSpec::preset("mixtral-8x7b").unwrap().groups());
}

#[test]
fn phi3_mini() {
    // microsoft/Phi-3-mini-4k-instruct: 32 layers, 32 heads of 96 (3072 / 32), window 2047.
    let spec = same(
        json!({"model_type": "phi3", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
               "hidden_size": 3072, "sliding_window": 2047}),
        json!({"head_dim": 96}),
    );
    assert_eq!(spec.sliding_layers(), 32);
}

#[test]
fn qwen2_5_0_5b() {
    // Qwen/Qwen2.5-0.5B-Instruct: 24 layers, 14 heads, 2 KV heads, hidden 896 (head 64), window switched off.
    let spec = same(
        json!({"model_type": "qwen2", "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
               "hidden_size": 896, "sliding_window": 32768, "use_sliding_window": false, "max_window_layers": 21}),
        json!({"head_dim": 64}),
    );
    assert_eq!(spec.groups()[0].kind(), full(2, 64));
}

#[test]
fn qwen3_0_6b_and_moe() {
    // Qwen/Qwen3-0.6B carries head_dim 128; a Qwen3 config without it takes Qwen3Config's 128.
    let spec = same(
        json!({"model_type": "qwen3", "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
               "hidden_size": 1024}),
        json!({"head_dim": 128, "use_sliding_window": false}),
    );
    assert_eq!(spec.groups()[0].kind(), full(8, 128));
    // Qwen3MoeConfig has no head_dim default: hidden / heads.
    let spec = same(
        json!({"model_type": "qwen3_moe", "num_hidden_layers": 48, "num_attention_heads": 32,
               "num_key_value_heads": 4, "hidden_size": 2048, "head_dim": 128}),
        json!({"use_sliding_window": false, "max_window_layers": 28}),
    );
    assert_eq!(spec.groups(), ModelSpec::preset("qwen3-30b-a3b").unwrap().groups());
}

#[test]
fn qwen3_next_and_qwen3_5() {
    // Qwen3-Next 80B publishes the linear_* keys; Qwen3.5's text_config leaves full_attention_interval out
    // and lists layer_types — here the class defaults must give the same every-4th pattern.
    let spec = same(
        json!({"model_type": "qwen3_next", "num_hidden_layers": 48, "num_attention_heads": 16,
               "num_key_value_heads": 2, "head_dim": 256, "hidden_size": 2048}),
        json!({"full_attention_interval": 4, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
               "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32}),
    );
    assert_eq!(spec.groups(), ModelSpec::preset("qwen3-next-80b-a3b").unwrap().groups());
    let spec = same(
        json!({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 24,
               "hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2}}),
        json!({"head_dim": 256, "full_attention_interval": 4, "linear_num_value_heads": 32}),
    );
    assert_eq!((spec.full_layers(), spec.recurrent_layers()), (6, 18));
}

#[test]
fn gemma_1_and_2() {
    // google/gemma-2b: 18 layers, 8 heads, 1 KV head of 256.
    let spec = same(
        json!({"model_type": "gemma", "num_hidden_layers": 18, "num_attention_heads": 8, "num_key_value_heads": 1,
               "hidden_size": 2048, "head_dim": 256}),
        json!({}),
    );
    assert_eq!(spec.groups()[0].kind(), full(1, 256));
    // google/gemma-2-2b: 26 layers alternating, 4 KV heads of 256, window 4096 (no layer_types).
    let spec = same(
        json!({"model_type": "gemma2", "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
               "hidden_size": 2304, "head_dim": 256}),
        json!({"sliding_window": 4096}),
    );
    assert_eq!((spec.sliding_layers(), spec.full_layers()), (13, 13));
}

#[test]
fn gemma_3_4b_text_config_without_heads() {
    // google/gemma-3-4b-it's text_config: model_type, hidden_size 2560, 34 layers, window 1024 — no heads,
    // KV heads or head size: Gemma3TextConfig's 8, 4 and 256.
    let spec = same(
        json!({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "hidden_size": 2560,
               "num_hidden_layers": 34, "sliding_window": 1024}, "vision_config": {"num_hidden_layers": 27}}),
        json!({"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window_pattern": 6}),
    );
    assert_eq!(spec.groups(), ModelSpec::preset("gemma-3-4b").unwrap().groups());
}

#[test]
fn gemma_4() {
    // A Gemma 4 text_config without layer_types or global-attention keys: every 6th and the last layer
    // global, with 512-wide global heads and num_global_key_value_heads = num_key_value_heads.
    let spec = same(
        json!({"model_type": "gemma4", "text_config": {"model_type": "gemma4_text", "num_hidden_layers": 8,
               "num_key_value_heads": 2, "head_dim": 256, "sliding_window": 512}}),
        json!({"global_head_dim": 512, "num_kv_shared_layers": 0,
               "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "sliding_attention",
                               "sliding_attention", "full_attention", "sliding_attention", "full_attention"]}),
    );
    assert_eq!((spec.sliding_layers(), spec.full_layers()), (6, 2));
    assert!(spec.groups().iter().any(|g| g.kind() == full(2, 512)));
}

#[test]
fn mla_families() {
    // deepseek-ai/DeepSeek-V2-Lite: 27 layers, kv_lora_rank 512, qk_rope_head_dim 64.
    let spec = same(
        json!({"model_type": "deepseek_v2", "num_hidden_layers": 27}),
        json!({"kv_lora_rank": 512,
                    "qk_rope_head_dim": 64}),
    );
    assert_eq!(spec.groups()[0].kind(), LayerKind::Mla { latent_dim: 576 });
    let spec = same(
        json!({"model_type": "deepseek_v3", "num_hidden_layers": 61, "kv_lora_rank": 512}),
        json!({"qk_rope_head_dim": 64}),
    );
    assert_eq!(spec.groups(), ModelSpec::preset("deepseek-v3").unwrap().groups());
    // zai-org/GLM-4.7-Flash (glm4_moe_lite): 47 MLA layers of 512 + 64.
    let spec = same(
        json!({"model_type": "glm4_moe_lite", "num_hidden_layers": 47}),
        json!({"kv_lora_rank": 512, "qk_rope_head_dim": 64}),
    );
    assert_eq!((spec.mla_layers(), spec.bytes_per_token(kvgate::kv::KvDtype::Bf16)), (47, 47 * 576 * 2));
}

#[test]
fn glm_4_5_air() {
    // zai-org/GLM-4.5-Air: 46 layers, 96 heads, 8 KV heads of 128 (head_dim published: 4096 / 96 is not whole).
    let spec = same(
        json!({"model_type": "glm4_moe", "num_hidden_layers": 46, "num_attention_heads": 96, "hidden_size": 4096,
               "head_dim": 128}),
        json!({"num_key_value_heads": 8}),
    );
    assert_eq!(spec.groups(), [ModelSpec::builder("x").full(46, 8, 128).build().unwrap().groups()[0]]);
}

#[test]
fn gpt_oss_20b() {
    let spec = same(
        json!({"model_type": "gpt_oss", "num_hidden_layers": 24, "num_attention_heads": 64,
               "num_key_value_heads": 8, "head_dim": 64, "hidden_size": 2880}),
        json!({"sliding_window": 128}),
    );
    assert_eq!(spec.groups(), ModelSpec::preset("gpt-oss-20b").unwrap().groups());
}

#[test]
fn jamba() {
    // ai21labs/AI21-Jamba-Mini-1.5 style: 32 layers, attention every 8th from 4, Mamba d_state 16, d_conv 4,
    // expand 2, hidden 4096 → state (3 + 16) × 8192 = 155,648.
    let spec = same(
        json!({"model_type": "jamba", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "hidden_size": 4096, "attn_layer_period": 8, "attn_layer_offset": 4}),
        json!({"mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2}),
    );
    let mamba = LayerKind::Recurrent { kind: RecurrentKind::Mamba, state_elements: 155_648 };
    assert_eq!(spec.groups().iter().find(|g| g.kind() == mamba).map(|g| g.layers()), Some(28));
}

#[test]
fn llama_4_scout() {
    // meta-llama/Llama-4-Scout-17B-16E: text_config with 48 layers, 40 heads, 8 KV heads of 128,
    // attention_chunk_size 8192; no_rope_layers left empty, so every 4th layer is a NoPE global layer.
    let spec = same(
        json!({"model_type": "llama4", "text_config": {"model_type": "llama4_text", "num_hidden_layers": 48,
               "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "hidden_size": 5120,
               "attention_chunk_size": 8192, "no_rope_layers": []}}),
        json!({"no_rope_layer_interval": 4}),
    );
    assert_eq!((spec.chunked_layers(), spec.full_layers()), (36, 12));
    // Without a chunk size, every layer is global.
    let none = json!({"model_type": "llama4_text", "attention_chunk_size": null}).to_string();
    assert_eq!(ModelSpec::from_hf_config(&none).unwrap().full_layers(), 48);
}

#[test]
fn smollm3_3b() {
    // HuggingFaceTB/SmolLM3-3B: 36 layers, 16 heads, 4 KV heads, hidden 2048 (head 128), no window.
    let spec = same(
        json!({"model_type": "smollm3", "num_hidden_layers": 36, "num_attention_heads": 16,
               "num_key_value_heads": 4, "hidden_size": 2048}),
        json!({"use_sliding_window": false, "sliding_window": null, "no_rope_layer_interval": 4}),
    );
    assert_eq!(spec.groups()[0].kind(), full(4, 128));
    assert_eq!(spec.full_layers(), 36);
}

#[test]
fn falcon_h1_0_5b() {
    // tiiuae/Falcon-H1-0.5B: 36 layers each with attention (2 KV heads of 64) and Mamba2 (d_ssm 1536, 24
    // heads of 64, 1 group, d_state 128, d_conv 4): state 3 × (1536 + 2 × 128) + 24 × 64 × 128 = 5376 +
    // 196,608 = 201,984 elements.
    let spec = same(
        json!({"model_type": "falcon_h1", "num_hidden_layers": 36, "num_attention_heads": 8,
               "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 1024, "mamba_d_ssm": 1536,
               "mamba_n_heads": 24, "mamba_d_head": 64, "mamba_d_state": 128}),
        json!({"mamba_n_groups": 1, "mamba_d_conv": 4}),
    );
    let mamba2 = LayerKind::Recurrent { kind: RecurrentKind::Mamba2, state_elements: 201_984 };
    assert_eq!((spec.full_layers(), spec.recurrent_layers()), (36, 36));
    assert!(spec.groups().iter().any(|g| g.kind() == mamba2));
    // mamba_d_head "auto" is d_ssm / heads.
    let auto = json!({"model_type": "falcon_h1", "num_hidden_layers": 36, "num_attention_heads": 8,
                      "num_key_value_heads": 2, "head_dim": 64, "mamba_d_ssm": 1536, "mamba_n_heads": 24,
                      "mamba_d_head": "auto", "mamba_d_state": 128});
    assert_eq!(ModelSpec::from_hf_config(&auto.to_string()).unwrap(), spec);
}

#[test]
fn the_defaults_table_in_the_readme_is_the_one_the_parser_uses() {
    let readme = include_str!("../README.md");
    let table = kvgate::kv::hf_config_defaults_table();
    assert!(readme.contains(&table), "README's defaults table differs; paste:\n{table}");
}
