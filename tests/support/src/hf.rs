//! The Hugging Face `config.json` vocabulary kvgate's parser reads — keys, `model_type` values and layer
//! type names — for tests and fuzz targets that build configs from it, so that random configs reach deep
//! into the parser. A key the parser starts to read belongs here (and then in every generator at once).

/// Keys the parser reads, and a few it must ignore (`vision_config`, `architectures`, `torch_dtype`).
pub const CONFIG_KEYS: &[&str] = &[
    "model_type",
    "num_hidden_layers",
    "num_key_value_heads",
    "num_attention_heads",
    "head_dim",
    "hidden_size",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "layer_types",
    "sliding_window_pattern",
    "full_attention_interval",
    "attn_layer_period",
    "attn_layer_offset",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "global_head_dim",
    "num_global_key_value_heads",
    "num_kv_shared_layers",
    "attention_chunk_size",
    "no_rope_layers",
    "no_rope_layer_interval",
    "linear_conv_kernel_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "mamba_d_ssm",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "layers_block_type",
    "text_config",
    "vision_config",
    "architectures",
    "torch_dtype",
];

/// `model_type` values: every family the parser knows, and a few it must refuse (`llava`, `bert`, empty,
/// a bare suffix, the wrong case).
pub const MODEL_TYPES: &[&str] = &[
    "llama",
    "mixtral",
    "mistral",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "gemma4",
    "gemma4_text",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "jamba",
    "llama4",
    "llama4_text",
    "smollm3",
    "falcon_h1",
    "glm4_moe",
    "glm4_moe_lite",
    "qwen3_5_text",
    "llava",
    "bert",
    "",
    "_text",
    "LLAMA",
];

/// Entries of `layer_types` / `layers_block_type`: every one the parser knows, and a few it must refuse.
pub const LAYER_TYPES: &[&str] = &[
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
    "mamba",
    "hybrid",
    "attention",
    "conv",
    "",
];

/// Every word of the vocabulary: keys, model types and layer types (for generators that put any of them
/// anywhere, as a key or as a string value).
pub fn words() -> Vec<&'static str> {
    CONFIG_KEYS.iter().chain(MODEL_TYPES).chain(LAYER_TYPES).copied().collect()
}
