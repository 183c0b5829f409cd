//! The families `ModelSpec::from_hf_config` knows, and for each the defaults of its Hugging Face
//! `transformers` config class for every key the KV cache depends on.
//!
//! # Invariants
//!
//! - [`FAMILIES`] is the one list: the parser looks families and defaults up here, and
//!   [`hf_config_defaults_table`] renders the same entries for the docs (a test checks the README's copy).
//! - A key absent from a published `config.json` takes the value its config class would give it; a key
//!   present but `null` is read as the class would read it too (`sliding_window: null` disables the window).
//! - Defaults were read from the config classes of `transformers` (main, 2026; `configuration_*.py`);
//!   where a class derives a value (`head_dim = hidden_size // num_attention_heads`, `mamba_d_head =
//!   mamba_d_ssm // mamba_n_heads`) the entry says so with [`ClassDefault::Derived`].

/// The families whose KV layout the parser knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Llama,
    Mixtral,
    Mistral,
    Phi3,
    Qwen2,
    Qwen2Moe,
    Qwen3,
    Qwen3Moe,
    Qwen3Next,
    Qwen3_5,
    Qwen3_5Moe,
    Gemma,
    Gemma2,
    Gemma3,
    Gemma4,
    DeepSeekV2,
    DeepSeekV3,
    GptOss,
    Jamba,
    Llama4,
    SmolLm3,
    FalconH1,
    Glm4Moe,
    Glm4MoeLite,
}

/// A key's default in a config class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClassDefault {
    /// An integer.
    Int(u32),
    /// A boolean.
    Bool(bool),
    /// `None`: the feature is off unless the file sets the key.
    Null,
    /// Derived by the class from other keys (the text says how); the parser derives it the same way.
    Derived(&'static str),
}

/// One family: its `model_type` values (the root's or `text_config`'s; a `_text` suffix is accepted
/// too), its config class, and the defaults of the keys its KV cache depends on.
pub(crate) struct FamilyInfo {
    pub(crate) family: Family,
    pub(crate) model_types: &'static [&'static str],
    pub(crate) class: &'static str,
    pub(crate) defaults: &'static [(&'static str, ClassDefault)],
}

use ClassDefault::{Bool, Derived, Int, Null};

const HEAD_DIM: (&str, ClassDefault) = ("head_dim", Derived("hidden_size / num_attention_heads"));
const KV_HEADS_MHA: (&str, ClassDefault) = ("num_key_value_heads", Derived("num_attention_heads"));
const QWEN_WINDOW: [(&str, ClassDefault); 3] =
    [("use_sliding_window", Bool(false)), ("sliding_window", Int(4096)), ("max_window_layers", Int(28))];
const GDN: [(&str, ClassDefault); 5] = [
    ("linear_conv_kernel_dim", Int(4)),
    ("linear_key_head_dim", Int(128)),
    ("linear_value_head_dim", Int(128)),
    ("linear_num_key_heads", Int(16)),
    ("linear_num_value_heads", Int(32)),
];

/// Every family, in the order of the docs table.
pub(crate) const FAMILIES: &[FamilyInfo] = &[
    FamilyInfo {
        family: Family::Llama,
        model_types: &["llama"],
        class: "LlamaConfig",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(32)),
            KV_HEADS_MHA,
            ("hidden_size", Int(4096)),
            HEAD_DIM,
        ],
    },
    FamilyInfo {
        family: Family::Mixtral,
        model_types: &["mixtral"],
        class: "MixtralConfig",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(32)),
            ("num_key_value_heads", Int(8)),
            ("hidden_size", Int(4096)),
            HEAD_DIM,
            ("sliding_window", Null),
        ],
    },
    FamilyInfo {
        family: Family::Mistral,
        model_types: &["mistral"],
        class: "MistralConfig",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(32)),
            ("num_key_value_heads", Int(8)),
            ("hidden_size", Int(4096)),
            HEAD_DIM,
            ("sliding_window", Int(4096)),
        ],
    },
    FamilyInfo {
        family: Family::Phi3,
        model_types: &["phi3"],
        class: "Phi3Config",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(32)),
            KV_HEADS_MHA,
            ("hidden_size", Int(3072)),
            HEAD_DIM,
            ("sliding_window", Null),
        ],
    },
    FamilyInfo {
        family: Family::Qwen2,
        model_types: &["qwen2"],
        class: "Qwen2Config",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(32)),
            ("num_key_value_heads", Int(32)),
            ("hidden_size", Int(4096)),
            HEAD_DIM,
            QWEN_WINDOW[0],
            QWEN_WINDOW[1],
            QWEN_WINDOW[2],
        ],
    },
    FamilyInfo {
        family: Family::Qwen2Moe,
        model_types: &["qwen2_moe"],
        class: "Qwen2MoeConfig",
        defaults: &[
            ("num_hidden_layers", Int(24)),
            ("num_attention_heads", Int(16)),
            ("num_key_value_heads", Int(16)),
            ("hidden_size", Int(2048)),
            HEAD_DIM,
            QWEN_WINDOW[0],
            QWEN_WINDOW[1],
            QWEN_WINDOW[2],
        ],
    },
    FamilyInfo {
        family: Family::Qwen3,
        model_types: &["qwen3"],
        class: "Qwen3Config",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(32)),
            ("num_key_value_heads", Int(32)),
            ("hidden_size", Int(4096)),
            ("head_dim", Int(128)),
            QWEN_WINDOW[0],
            QWEN_WINDOW[1],
            QWEN_WINDOW[2],
        ],
    },
    FamilyInfo {
        family: Family::Qwen3Moe,
        model_types: &["qwen3_moe"],
        class: "Qwen3MoeConfig",
        defaults: &[
            ("num_hidden_layers", Int(24)),
            ("num_attention_heads", Int(32)),
            ("num_key_value_heads", Int(4)),
            ("hidden_size", Int(2048)),
            HEAD_DIM,
            QWEN_WINDOW[0],
            QWEN_WINDOW[1],
            QWEN_WINDOW[2],
        ],
    },
    FamilyInfo {
        family: Family::Qwen3Next,
        model_types: &["qwen3_next"],
        class: "Qwen3NextConfig",
        defaults: &[
            ("num_hidden_layers", Int(48)),
            ("num_attention_heads", Int(16)),
            ("num_key_value_heads", Int(2)),
            ("hidden_size", Int(2048)),
            ("head_dim", Int(256)),
            ("full_attention_interval", Int(4)),
            GDN[0],
            GDN[1],
            GDN[2],
            GDN[3],
            GDN[4],
        ],
    },
    FamilyInfo {
        family: Family::Qwen3_5,
        model_types: &["qwen3_5"],
        class: "Qwen3_5TextConfig",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(16)),
            ("num_key_value_heads", Int(4)),
            ("hidden_size", Int(4096)),
            ("head_dim", Int(256)),
            ("full_attention_interval", Int(4)),
            GDN[0],
            GDN[1],
            GDN[2],
            GDN[3],
            GDN[4],
        ],
    },
    FamilyInfo {
        family: Family::Qwen3_5Moe,
        model_types: &["qwen3_5_moe"],
        class: "Qwen3_5MoeTextConfig",
        defaults: &[
            ("num_hidden_layers", Int(40)),
            ("num_attention_heads", Int(16)),
            ("num_key_value_heads", Int(2)),
            ("hidden_size", Int(2048)),
            ("head_dim", Int(256)),
            ("full_attention_interval", Int(4)),
            GDN[0],
            GDN[1],
            GDN[2],
            GDN[3],
            GDN[4],
        ],
    },
    FamilyInfo {
        family: Family::Gemma,
        model_types: &["gemma"],
        class: "GemmaConfig",
        defaults: &[
            ("num_hidden_layers", Int(28)),
            ("num_attention_heads", Int(16)),
            ("num_key_value_heads", Int(16)),
            ("hidden_size", Int(3072)),
            ("head_dim", Int(256)),
        ],
    },
    FamilyInfo {
        family: Family::Gemma2,
        model_types: &["gemma2"],
        class: "Gemma2Config",
        defaults: &[
            ("num_hidden_layers", Int(26)),
            ("num_attention_heads", Int(8)),
            ("num_key_value_heads", Int(4)),
            ("hidden_size", Int(2304)),
            ("head_dim", Int(256)),
            ("sliding_window", Int(4096)),
        ],
    },
    FamilyInfo {
        family: Family::Gemma3,
        model_types: &["gemma3"],
        class: "Gemma3TextConfig",
        defaults: &[
            ("num_hidden_layers", Int(26)),
            ("num_attention_heads", Int(8)),
            ("num_key_value_heads", Int(4)),
            ("hidden_size", Int(2304)),
            ("head_dim", Int(256)),
            ("sliding_window", Int(4096)),
            ("sliding_window_pattern", Int(6)),
        ],
    },
    FamilyInfo {
        family: Family::Gemma4,
        model_types: &["gemma4"],
        class: "Gemma4TextConfig",
        defaults: &[
            ("num_hidden_layers", Int(30)),
            ("num_attention_heads", Int(8)),
            ("num_key_value_heads", Int(4)),
            ("hidden_size", Int(2304)),
            ("head_dim", Int(256)),
            ("sliding_window", Int(512)),
            ("global_head_dim", Int(512)),
            ("num_global_key_value_heads", Derived("num_key_value_heads")),
            ("num_kv_shared_layers", Int(0)),
            ("layer_types", Derived("every 6th layer and the last full, the rest sliding")),
        ],
    },
    FamilyInfo {
        family: Family::DeepSeekV2,
        model_types: &["deepseek_v2"],
        class: "DeepseekV2Config",
        defaults: &[("num_hidden_layers", Int(30)), ("kv_lora_rank", Int(512)), ("qk_rope_head_dim", Int(64))],
    },
    FamilyInfo {
        family: Family::DeepSeekV3,
        model_types: &["deepseek_v3"],
        class: "DeepseekV3Config",
        defaults: &[("num_hidden_layers", Int(61)), ("kv_lora_rank", Int(512)), ("qk_rope_head_dim", Int(64))],
    },
    FamilyInfo {
        family: Family::GptOss,
        model_types: &["gpt_oss"],
        class: "GptOssConfig",
        defaults: &[
            ("num_hidden_layers", Int(36)),
            ("num_attention_heads", Int(64)),
            ("num_key_value_heads", Int(8)),
            ("hidden_size", Int(2880)),
            ("head_dim", Int(64)),
            ("sliding_window", Int(128)),
            ("layer_types", Derived("even layers sliding, odd layers full")),
        ],
    },
    FamilyInfo {
        family: Family::Jamba,
        model_types: &["jamba"],
        class: "JambaConfig",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(32)),
            ("num_key_value_heads", Int(8)),
            ("hidden_size", Int(4096)),
            HEAD_DIM,
            ("attn_layer_period", Int(8)),
            ("attn_layer_offset", Int(4)),
            ("mamba_d_state", Int(16)),
            ("mamba_d_conv", Int(4)),
            ("mamba_expand", Int(2)),
        ],
    },
    FamilyInfo {
        family: Family::Llama4,
        model_types: &["llama4"],
        class: "Llama4TextConfig",
        defaults: &[
            ("num_hidden_layers", Int(48)),
            ("num_attention_heads", Int(40)),
            ("num_key_value_heads", Int(8)),
            ("hidden_size", Int(5120)),
            ("head_dim", Int(128)),
            ("attention_chunk_size", Int(8192)),
            ("no_rope_layers", Derived("1 (RoPE, chunked) except every no_rope_layer_interval-th layer")),
            ("no_rope_layer_interval", Int(4)),
        ],
    },
    FamilyInfo {
        family: Family::SmolLm3,
        model_types: &["smollm3"],
        class: "SmolLM3Config",
        defaults: &[
            ("num_hidden_layers", Int(36)),
            ("num_attention_heads", Int(16)),
            ("num_key_value_heads", Int(4)),
            ("hidden_size", Int(2048)),
            HEAD_DIM,
            ("use_sliding_window", Bool(false)),
            ("sliding_window", Null),
            ("no_rope_layer_interval", Int(4)),
        ],
    },
    FamilyInfo {
        family: Family::FalconH1,
        model_types: &["falcon_h1"],
        class: "FalconH1Config",
        defaults: &[
            ("num_hidden_layers", Int(32)),
            ("num_attention_heads", Int(32)),
            ("num_key_value_heads", Int(8)),
            ("hidden_size", Int(4096)),
            HEAD_DIM,
            ("mamba_d_ssm", Int(1024)),
            ("mamba_n_heads", Int(128)),
            ("mamba_d_head", Derived("mamba_d_ssm / mamba_n_heads")),
            ("mamba_n_groups", Int(1)),
            ("mamba_d_state", Int(256)),
            ("mamba_d_conv", Int(4)),
            ("mamba_expand", Int(2)),
        ],
    },
    FamilyInfo {
        family: Family::Glm4Moe,
        model_types: &["glm4_moe"],
        class: "Glm4MoeConfig",
        defaults: &[
            ("num_hidden_layers", Int(46)),
            ("num_attention_heads", Int(96)),
            ("num_key_value_heads", Int(8)),
            ("hidden_size", Int(4096)),
            HEAD_DIM,
        ],
    },
    FamilyInfo {
        family: Family::Glm4MoeLite,
        model_types: &["glm4_moe_lite"],
        class: "Glm4MoeLiteConfig",
        defaults: &[("num_hidden_layers", Int(47)), ("kv_lora_rank", Int(512)), ("qk_rope_head_dim", Int(64))],
    },
];

impl FamilyInfo {
    /// The family of a `model_type` (a `_text` suffix is accepted).
    pub(crate) fn of(model_type: &str) -> Option<&'static FamilyInfo> {
        let base = model_type.strip_suffix("_text").unwrap_or(model_type);
        FAMILIES.iter().find(|f| f.model_types.contains(&base))
    }

    /// The class default of `key`, when this family's table lists it.
    pub(crate) fn default(&self, key: &str) -> Option<ClassDefault> {
        self.defaults.iter().find(|(k, _)| *k == key).map(|&(_, d)| d)
    }
}

/// The defaults `ModelSpec::from_hf_config` applies when a `config.json` leaves a key out, as a Markdown
/// table: one row per family with its `model_type`s, its `transformers` config class and the default of each
/// key the KV cache depends on.
///
/// # Examples
///
/// ```
/// let table = kvgate::kv::hf_config_defaults_table();
/// assert!(table.contains("| `gemma3`, `gemma3_text` | `Gemma3TextConfig` |"));
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "hf-config")))]
#[must_use]
pub fn hf_config_defaults_table() -> String {
    let mut out = String::from("| `model_type` | config class | defaults used |\n|---|---|---|\n");
    for f in FAMILIES {
        let types: Vec<String> = f.model_types.iter().flat_map(|t| [format!("`{t}`"), format!("`{t}_text`")]).collect();
        let types = match f.family {
            // Only the multimodal families publish a `_text` model_type; list it there.
            Family::Gemma3 | Family::Gemma4 | Family::Llama4 | Family::Qwen3_5 | Family::Qwen3_5Moe => types,
            _ => types.into_iter().step_by(2).collect(),
        };
        let defaults: Vec<String> = f
            .defaults
            .iter()
            .map(|(key, d)| match d {
                Int(n) => format!("`{key}` {n}"),
                Bool(b) => format!("`{key}` {b}"),
                Null => format!("`{key}` none"),
                Derived(how) => format!("`{key}` = {how}"),
            })
            .collect();
        out.push_str(&format!("| {} | `{}` | {} |\n", types.join(", "), f.class, defaults.join(", ")));
    }
    out
}
