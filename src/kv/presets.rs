//! Named [`ModelSpec`]s for models people deploy, built from the values in their published `config.json`.

use super::{LayerKind, ModelSpec, RecurrentKind};
use crate::ConfigError;

/// One preset: name, parameter count, active parameter count of a mixture-of-experts model (`None`: dense,
/// every parameter is active), and layer groups as `(layers, kind)`.
type Preset = (&'static str, u64, Option<u64>, &'static [(u32, LayerKind)]);

/// Active parameters of the mixture-of-experts presets, derived from each model's `config.json`: the total
/// minus, in every MoE layer, the routed experts a token does not select (`experts − experts_per_token`, each
/// `3 × hidden × expert_intermediate` weights plus biases where the model has them). Where the derivation
/// was checked, the same arithmetic reproduces the preset's total exactly.
mod active {
    /// Mixtral 8x7B: 32 layers of 8 experts (3 × 4096 × 14336 = 176,160,768 each), 2 per token:
    /// 46,702,792,704 − 32 × 6 × 176,160,768 = 12,879,925,248 (Mistral's "12.9B").
    pub const MIXTRAL_8X7B: u64 = 46_702_792_704 - 32 * 6 * 176_160_768;
    /// Qwen3-30B-A3B: 48 layers of 128 experts (3 × 2048 × 768 = 4,718,592), 8 per token:
    /// 30,532,122,624 − 48 × 120 × 4,718,592 = 3,353,032,704 (the card's "3.3B activated").
    pub const QWEN3_30B_A3B: u64 = 30_532_122_624 - 48 * 120 * 4_718_592;
    /// Qwen3-Next-80B-A3B, main model (the multi-token-prediction layer, part of the published total, is
    /// unused without speculative decoding): embeddings 2 × 151,936 × 2048 = 622,329,856; 12 gated
    /// full-attention layers of 27,264,000; 36 Gated DeltaNet layers of 33,718,464; per layer 10 of 512
    /// experts (3 × 2048 × 512 = 3,145,728) + the shared expert (3,145,728) + routers (1,050,624) + norms
    /// (4096) = 35,657,728; final norm 2048. Sum: 3,874,935,552.
    pub const QWEN3_NEXT_80B_A3B: u64 = 622_329_856 + 12 * 27_264_000 + 36 * 33_718_464 + 48 * 35_657_728 + 2048;
    /// Gemma 4 26B A4B: the nominal 4B of its name, like its nominal total (no exact count was derived).
    pub const GEMMA_4_26B_A4B: u64 = 4_000_000_000;
    /// DeepSeek-V3: 58 MoE layers of 256 routed experts (3 × 7168 × 2048 = 44,040,192), 8 per token (the
    /// shared expert always runs): 671,026,419,200 − 58 × 248 × 44,040,192 = 37,552,297,472 ("37B").
    pub const DEEPSEEK_V3: u64 = 671_026_419_200 - 58 * 248 * 44_040_192;
    /// gpt-oss: experts of 2880 → 5760 (+ bias) and 5760/2 → 2880 (+ bias) = 24,891,840 weights, 4 per
    /// token. 20b: 24 layers of 32 experts, 20,914,757,184 − 24 × 28 × 24,891,840 = 4,187,440,704 (3.61B
    /// without the 579,133,440-weight input embedding, the card's figure). 120b: 36 layers of 128,
    /// 116,829,156,672 − 36 × 124 × 24,891,840 = 5,711,982,912 (5.13B without it).
    pub const GPT_OSS_20B: u64 = 20_914_757_184 - 24 * 28 * 24_891_840;
    /// See [`GPT_OSS_20B`].
    pub const GPT_OSS_120B: u64 = 116_829_156_672 - 36 * 124 * 24_891_840;
}

const fn full(kv_heads: u32, head_dim: u32) -> LayerKind {
    LayerKind::Full { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim }
}

const fn sliding(kv_heads: u32, head_dim: u32, window: u32) -> LayerKind {
    LayerKind::Sliding { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim, window }
}

/// Qwen3-Next's Gated DeltaNet state: convolution `(4 − 1) × (2 × 16 × 128 + 32 × 128)` = 24,576 plus
/// recurrent `32 × 128 × 128` = 524,288 elements (`linear_*` keys of its config.json).
const QWEN3_NEXT_GDN: LayerKind = LayerKind::Recurrent { kind: RecurrentKind::GatedDeltaNet, state_elements: 548_864 };

/// Presets, in the order [`ModelSpec::preset_names`] lists them.
///
/// Layer counts, KV heads, head sizes and windows are those of each model's Hugging Face `config.json`
/// (head size `hidden_size / num_attention_heads` where the file has no `head_dim`). Parameter counts are
/// those reported on the model cards (safetensors totals), for weight sizing only.
#[rustfmt::skip]
const PRESETS: &[Preset] = &[
    // Llama 3.x: full attention, 8 KV heads.
    ("llama-3.2-1b", 1_235_814_400, None, &[(16, full(8, 64))]),
    ("llama-3.2-3b", 3_212_749_824, None, &[(28, full(8, 128))]),
    ("llama-3.1-8b", 8_030_261_248, None, &[(32, full(8, 128))]),
    ("llama-3.1-70b", 70_553_706_496, None, &[(80, full(8, 128))]),
    ("llama-3.3-70b", 70_553_706_496, None, &[(80, full(8, 128))]),
    // Qwen 2.5 (publishes sliding_window with use_sliding_window false) and Qwen 3.
    ("qwen2.5-7b", 7_615_616_512, None, &[(28, full(4, 128))]),
    ("qwen2.5-14b", 14_770_033_664, None, &[(48, full(8, 128))]),
    ("qwen2.5-32b", 32_763_876_352, None, &[(64, full(8, 128))]),
    ("qwen2.5-72b", 72_706_203_648, None, &[(80, full(8, 128))]),
    ("qwen3-8b", 8_190_735_360, None, &[(36, full(8, 128))]),
    ("qwen3-32b", 32_762_123_264, None, &[(64, full(8, 128))]),
    ("qwen3-30b-a3b", 30_532_122_624, Some(active::QWEN3_30B_A3B), &[(48, full(4, 128))]),
    // Qwen3-Next: every 4th layer full attention (2 KV heads of 256), the rest linear attention.
    ("qwen3-next-80b-a3b", 81_324_711_680, Some(active::QWEN3_NEXT_80B_A3B), &[(36, QWEN3_NEXT_GDN), (12, full(2, 256))]),
    // Gemma 2: alternating sliding (4096) and global layers.
    ("gemma-2-9b", 9_241_705_984, None, &[(21, sliding(8, 256, 4096)), (21, full(8, 256))]),
    ("gemma-2-27b", 27_227_128_320, None, &[(23, sliding(16, 128, 4096)), (23, full(16, 128))]),
    // Gemma 3: five sliding (1024) layers per global one; parameter counts include the vision tower.
    ("gemma-3-4b", 4_300_079_472, None, &[(29, sliding(4, 256, 1024)), (5, full(4, 256))]),
    ("gemma-3-12b", 12_187_325_040, None, &[(40, sliding(8, 256, 1024)), (8, full(8, 256))]),
    ("gemma-3-27b", 27_432_406_640, None, &[(52, sliding(16, 128, 1024)), (10, full(16, 128))]),
    // Gemma 4 26B A4B: sliding layers 8 KV heads of 256; global layers 2 KV heads of 512. The parameter
    // count is the nominal 26B of its name (no exact total was checked).
    ("gemma-4-26b-a4b", 26_000_000_000, Some(active::GEMMA_4_26B_A4B), &[(25, sliding(8, 256, 1024)), (5, full(2, 512))]),
    // Mistral 7B v0.1: its 4096 window on every layer. Mixtral: no window.
    ("mistral-7b", 7_241_732_096, None, &[(32, sliding(8, 128, 4096))]),
    ("mixtral-8x7b", 46_702_792_704, Some(active::MIXTRAL_8X7B), &[(32, full(8, 128))]),
    // DeepSeek-V3: MLA, kv_lora_rank 512 + qk_rope_head_dim 64 per token per layer, 61 layers.
    ("deepseek-v3", 671_026_419_200, Some(active::DEEPSEEK_V3), &[(61, LayerKind::Mla { latent_dim: 576 })]),
    // gpt-oss: alternating sliding (128) and full layers, 8 KV heads of 64.
    ("gpt-oss-20b", 20_914_757_184, Some(active::GPT_OSS_20B), &[(12, sliding(8, 64, 128)), (12, full(8, 64))]),
    ("gpt-oss-120b", 116_829_156_672, Some(active::GPT_OSS_120B), &[(18, sliding(8, 64, 128)), (18, full(8, 64))]),
    // Phi-3 128k: windows as published (262144 and 131072, at or beyond the context length).
    ("phi-3-mini-128k", 3_821_079_552, None, &[(32, sliding(32, 96, 262_144))]),
    ("phi-3-medium-128k", 13_960_238_080, None, &[(40, sliding(10, 128, 131_072))]),
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
        let &(name, params, active, groups) = PRESETS
            .iter()
            .find(|(preset, ..)| preset.eq_ignore_ascii_case(name))
            .ok_or_else(|| ConfigError::UnknownName {
                what: "model preset",
                name: name.to_owned(),
                known: Self::preset_names().join(", "),
            })?;
        let builder = groups.iter().fold(ModelSpec::builder(name), |b, &(layers, kind)| b.group(layers, kind));
        match active {
            Some(active) => builder.params(params).active_params(active),
            None => builder.params(params),
        }
        .build()
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
        PRESETS.iter().map(|&(name, ..)| name).collect()
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
            assert!(spec.active_params() <= spec.params(), "{name}");
        }
        // The derivations in `active`, checked against the figures the model cards print.
        assert_eq!(active::MIXTRAL_8X7B, 12_879_925_248);
        assert_eq!(active::QWEN3_30B_A3B, 3_353_032_704);
        assert_eq!(active::QWEN3_NEXT_80B_A3B, 3_874_935_552);
        assert_eq!(active::DEEPSEEK_V3, 37_552_297_472);
        assert_eq!(active::GPT_OSS_20B - 201_088 * 2880, 3_608_307_264);
        assert_eq!(active::GPT_OSS_120B - 201_088 * 2880, 5_132_849_472);
        assert_eq!(ModelSpec::preset("Gemma-3-27B").unwrap().name(), "gemma-3-27b");
    }
}
