//! Named [`ModelSpec`]s for models people deploy, built from the values in their published `config.json`.

use super::{ModelSpec, NoKvReason};
use crate::ConfigError;

/// One preset: name, how to build it, and where its numbers come from.
struct Preset {
    name: &'static str,
    build: fn() -> Result<ModelSpec, ConfigError>,
}

/// Presets, in the order [`ModelSpec::preset_names`] lists them.
///
/// Layer counts, KV heads, head sizes and windows are those of each model's Hugging Face `config.json`
/// (head size `hidden_size / num_attention_heads` where the file has no `head_dim`). Parameter counts are
/// those reported on the model cards (safetensors totals), for weight sizing only.
const PRESETS: &[Preset] = &[
    // Llama 3.x: full attention, 8 KV heads.
    Preset {
        name: "llama-3.2-1b",
        build: || {
            b("llama-3.2-1b")
                .full(16, 8, 64)
                .params(1_235_814_400)
                .build()
        },
    },
    Preset {
        name: "llama-3.2-3b",
        build: || {
            b("llama-3.2-3b")
                .full(28, 8, 128)
                .params(3_212_749_824)
                .build()
        },
    },
    Preset {
        name: "llama-3.1-8b",
        build: || {
            b("llama-3.1-8b")
                .full(32, 8, 128)
                .params(8_030_261_248)
                .build()
        },
    },
    Preset {
        name: "llama-3.1-70b",
        build: || {
            b("llama-3.1-70b")
                .full(80, 8, 128)
                .params(70_553_706_496)
                .build()
        },
    },
    Preset {
        name: "llama-3.3-70b",
        build: || {
            b("llama-3.3-70b")
                .full(80, 8, 128)
                .params(70_553_706_496)
                .build()
        },
    },
    // Qwen 2.5 (sliding_window published but use_sliding_window false) and Qwen 3.
    Preset {
        name: "qwen2.5-7b",
        build: || {
            b("qwen2.5-7b")
                .full(28, 4, 128)
                .params(7_615_616_512)
                .build()
        },
    },
    Preset {
        name: "qwen2.5-14b",
        build: || {
            b("qwen2.5-14b")
                .full(48, 8, 128)
                .params(14_770_033_664)
                .build()
        },
    },
    Preset {
        name: "qwen2.5-32b",
        build: || {
            b("qwen2.5-32b")
                .full(64, 8, 128)
                .params(32_763_876_352)
                .build()
        },
    },
    Preset {
        name: "qwen2.5-72b",
        build: || {
            b("qwen2.5-72b")
                .full(80, 8, 128)
                .params(72_706_203_648)
                .build()
        },
    },
    Preset {
        name: "qwen3-8b",
        build: || b("qwen3-8b").full(36, 8, 128).params(8_190_735_360).build(),
    },
    Preset {
        name: "qwen3-32b",
        build: || {
            b("qwen3-32b")
                .full(64, 8, 128)
                .params(32_762_123_264)
                .build()
        },
    },
    Preset {
        name: "qwen3-30b-a3b",
        build: || {
            b("qwen3-30b-a3b")
                .full(48, 4, 128)
                .params(30_532_122_624)
                .build()
        },
    },
    // Qwen3-Next: every 4th layer full attention (2 KV heads of 256), the rest linear attention.
    Preset {
        name: "qwen3-next-80b-a3b",
        build: || {
            b("qwen3-next-80b-a3b")
                .no_kv(36, NoKvReason::LinearAttention)
                .full(12, 2, 256)
                .params(81_324_711_680)
                .build()
        },
    },
    // Gemma 2: alternating sliding (4096) and global layers.
    Preset {
        name: "gemma-2-9b",
        build: || {
            b("gemma-2-9b")
                .sliding(21, 8, 256, 4096)
                .full(21, 8, 256)
                .params(9_241_705_984)
                .build()
        },
    },
    Preset {
        name: "gemma-2-27b",
        build: || {
            b("gemma-2-27b")
                .sliding(23, 16, 128, 4096)
                .full(23, 16, 128)
                .params(27_227_128_320)
                .build()
        },
    },
    // Gemma 3: five sliding (1024) layers per global one; counts include the vision tower.
    Preset {
        name: "gemma-3-4b",
        build: || {
            b("gemma-3-4b")
                .sliding(29, 4, 256, 1024)
                .full(5, 4, 256)
                .params(4_300_079_472)
                .build()
        },
    },
    Preset {
        name: "gemma-3-12b",
        build: || {
            b("gemma-3-12b")
                .sliding(40, 8, 256, 1024)
                .full(8, 8, 256)
                .params(12_187_325_040)
                .build()
        },
    },
    Preset {
        name: "gemma-3-27b",
        build: || {
            b("gemma-3-27b")
                .sliding(52, 16, 128, 1024)
                .full(10, 16, 128)
                .params(27_432_406_640)
                .build()
        },
    },
    // Gemma 4 26B A4B: sliding layers 8 KV heads of 256; global layers 2 KV heads of 512. The parameter
    // count is the nominal 26B of its name (no exact total was checked).
    Preset {
        name: "gemma-4-26b-a4b",
        build: || {
            b("gemma-4-26b-a4b")
                .sliding(25, 8, 256, 1024)
                .full(5, 2, 512)
                .params(26_000_000_000)
                .build()
        },
    },
    // Mistral 7B v0.1: its 4096 window on every layer. Mixtral: no window.
    Preset {
        name: "mistral-7b",
        build: || {
            b("mistral-7b")
                .sliding(32, 8, 128, 4096)
                .params(7_241_732_096)
                .build()
        },
    },
    Preset {
        name: "mixtral-8x7b",
        build: || {
            b("mixtral-8x7b")
                .full(32, 8, 128)
                .params(46_702_792_704)
                .build()
        },
    },
    // DeepSeek-V3: MLA, kv_lora_rank 512 + qk_rope_head_dim 64 per token per layer, 61 layers.
    Preset {
        name: "deepseek-v3",
        build: || {
            b("deepseek-v3")
                .mla(61, 576)
                .params(671_026_419_200)
                .build()
        },
    },
    // gpt-oss: alternating sliding (128) and full layers, 8 KV heads of 64.
    Preset {
        name: "gpt-oss-20b",
        build: || {
            b("gpt-oss-20b")
                .sliding(12, 8, 64, 128)
                .full(12, 8, 64)
                .params(20_914_757_184)
                .build()
        },
    },
    Preset {
        name: "gpt-oss-120b",
        build: || {
            b("gpt-oss-120b")
                .sliding(18, 8, 64, 128)
                .full(18, 8, 64)
                .params(116_829_156_672)
                .build()
        },
    },
    // Phi-3: no grouped-query attention (32 KV heads of 96); the 128k model's window (262144) exceeds its context.
    Preset {
        name: "phi-3-mini-128k",
        build: || {
            b("phi-3-mini-128k")
                .sliding(32, 32, 96, 262_144)
                .params(3_821_079_552)
                .build()
        },
    },
    Preset {
        name: "phi-3-medium-128k",
        build: || {
            b("phi-3-medium-128k")
                .sliding(40, 10, 128, 131_072)
                .params(13_960_238_080)
                .build()
        },
    },
];

fn b(name: &str) -> super::ModelSpecBuilder {
    ModelSpec::builder(name)
}

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
        let preset = PRESETS
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .ok_or_else(|| ConfigError::UnknownName {
                what: "model preset",
                name: name.to_owned(),
                known: Self::preset_names().join(", "),
            })?;
        (preset.build)()
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
        PRESETS.iter().map(|p| p.name).collect()
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
        assert_eq!(
            ModelSpec::preset("Gemma-3-27B").unwrap().name(),
            "gemma-3-27b"
        );
    }
}
