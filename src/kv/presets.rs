//! Named [`ModelSpec`]s for models people deploy, built from the values in their published `config.json`.

use super::{LayerKind, ModelSpec, NoKvReason};
use crate::ConfigError;

/// One preset: name, parameter count, and layer groups as `(layers, kind)`.
type Preset = (&'static str, u64, &'static [(u32, LayerKind)]);

const fn full(kv_heads: u32, head_dim: u32) -> LayerKind {
    LayerKind::Full { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim }
}

const fn sliding(kv_heads: u32, head_dim: u32, window: u32) -> LayerKind {
    LayerKind::Sliding { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim, window }
}

const LINEAR: LayerKind = LayerKind::NoKv(NoKvReason::LinearAttention);

/// Presets, in the order [`ModelSpec::preset_names`] lists them.
///
/// Layer counts, KV heads, head sizes and windows are those of each model's Hugging Face `config.json`
/// (head size `hidden_size / num_attention_heads` where the file has no `head_dim`). Parameter counts are
/// those reported on the model cards (safetensors totals), for weight sizing only.
#[rustfmt::skip]
const PRESETS: &[Preset] = &[
    // Llama 3.x: full attention, 8 KV heads.
    ("llama-3.2-1b", 1_235_814_400, &[(16, full(8, 64))]),
    ("llama-3.2-3b", 3_212_749_824, &[(28, full(8, 128))]),
    ("llama-3.1-8b", 8_030_261_248, &[(32, full(8, 128))]),
    ("llama-3.1-70b", 70_553_706_496, &[(80, full(8, 128))]),
    ("llama-3.3-70b", 70_553_706_496, &[(80, full(8, 128))]),
    // Qwen 2.5 (publishes sliding_window with use_sliding_window false) and Qwen 3.
    ("qwen2.5-7b", 7_615_616_512, &[(28, full(4, 128))]),
    ("qwen2.5-14b", 14_770_033_664, &[(48, full(8, 128))]),
    ("qwen2.5-32b", 32_763_876_352, &[(64, full(8, 128))]),
    ("qwen2.5-72b", 72_706_203_648, &[(80, full(8, 128))]),
    ("qwen3-8b", 8_190_735_360, &[(36, full(8, 128))]),
    ("qwen3-32b", 32_762_123_264, &[(64, full(8, 128))]),
    ("qwen3-30b-a3b", 30_532_122_624, &[(48, full(4, 128))]),
    // Qwen3-Next: every 4th layer full attention (2 KV heads of 256), the rest linear attention.
    ("qwen3-next-80b-a3b", 81_324_711_680, &[(36, LINEAR), (12, full(2, 256))]),
    // Gemma 2: alternating sliding (4096) and global layers.
    ("gemma-2-9b", 9_241_705_984, &[(21, sliding(8, 256, 4096)), (21, full(8, 256))]),
    ("gemma-2-27b", 27_227_128_320, &[(23, sliding(16, 128, 4096)), (23, full(16, 128))]),
    // Gemma 3: five sliding (1024) layers per global one; parameter counts include the vision tower.
    ("gemma-3-4b", 4_300_079_472, &[(29, sliding(4, 256, 1024)), (5, full(4, 256))]),
    ("gemma-3-12b", 12_187_325_040, &[(40, sliding(8, 256, 1024)), (8, full(8, 256))]),
    ("gemma-3-27b", 27_432_406_640, &[(52, sliding(16, 128, 1024)), (10, full(16, 128))]),
    // Gemma 4 26B A4B: sliding layers 8 KV heads of 256; global layers 2 KV heads of 512. The parameter
    // count is the nominal 26B of its name (no exact total was checked).
    ("gemma-4-26b-a4b", 26_000_000_000, &[(25, sliding(8, 256, 1024)), (5, full(2, 512))]),
    // Mistral 7B v0.1: its 4096 window on every layer. Mixtral: no window.
    ("mistral-7b", 7_241_732_096, &[(32, sliding(8, 128, 4096))]),
    ("mixtral-8x7b", 46_702_792_704, &[(32, full(8, 128))]),
    // DeepSeek-V3: MLA, kv_lora_rank 512 + qk_rope_head_dim 64 per token per layer, 61 layers.
    ("deepseek-v3", 671_026_419_200, &[(61, LayerKind::Mla { latent_dim: 576 })]),
    // gpt-oss: alternating sliding (128) and full layers, 8 KV heads of 64.
    ("gpt-oss-20b", 20_914_757_184, &[(12, sliding(8, 64, 128)), (12, full(8, 64))]),
    ("gpt-oss-120b", 116_829_156_672, &[(18, sliding(8, 64, 128)), (18, full(8, 64))]),
    // Phi-3 128k: windows as published (262144 and 131072, at or beyond the context length).
    ("phi-3-mini-128k", 3_821_079_552, &[(32, sliding(32, 96, 262_144))]),
    ("phi-3-medium-128k", 13_960_238_080, &[(40, sliding(10, 128, 131_072))]),
];

impl ModelSpec {
    /// The preset called `name` (ASCII case-insensitive); see [`ModelSpec::preset_names`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownName`] listing the known names.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::ModelSpec;
    /// let spec = ModelSpec::preset("gemma-3-27b")?;
    /// assert_eq!((spec.sliding_layers(), spec.full_layers()), (52, 10));
    /// assert!(ModelSpec::preset("gpt-5").is_err());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn preset(name: &str) -> Result<ModelSpec, ConfigError> {
        let &(name, params, groups) = PRESETS
            .iter()
            .find(|(preset, _, _)| preset.eq_ignore_ascii_case(name))
            .ok_or_else(|| ConfigError::UnknownName {
                what: "model preset",
                name: name.to_owned(),
                known: Self::preset_names().join(", "),
            })?;
        groups.iter().fold(ModelSpec::builder(name), |b, &(layers, kind)| b.group(layers, kind)).params(params).build()
    }

    /// The names [`ModelSpec::preset`] accepts.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(kvgate::kv::ModelSpec::preset_names().contains(&"llama-3.1-8b"));
    /// ```
    #[must_use]
    pub fn preset_names() -> Vec<&'static str> {
        PRESETS.iter().map(|&(name, _, _)| name).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_builds_with_params() {
        for name in ModelSpec::preset_names() {
            let spec = ModelSpec::preset(name).unwrap();
            assert_eq!(spec.name(), name);
            assert!(spec.params().is_some(), "{name}");
        }
        assert_eq!(ModelSpec::preset("Gemma-3-27B").unwrap().name(), "gemma-3-27b");
    }
}
