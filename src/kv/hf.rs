//! Reading a Hugging Face `config.json` into a [`ModelSpec`] (feature `hf-config`).
//!
//! The rules applied to each family are documented on [`ModelSpec::from_hf_config`].

use serde_json::{Map, Value};

use super::{LayerKind, ModelSpec, NoKvReason};
use crate::ConfigError;

/// The families whose KV layout the parser knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Llama,
    Mistral,
    Phi3,
    Qwen2,
    Qwen3Next,
    Gemma,
    Gemma2,
    Gemma3,
    Gemma4,
    DeepSeek,
    GptOss,
    Jamba,
}

/// `model_type` values accepted, with their family (a `_text` suffix is accepted too).
const MODEL_TYPES: &[(&str, Family)] = &[
    ("llama", Family::Llama),
    ("mixtral", Family::Llama),
    ("mistral", Family::Mistral),
    ("phi3", Family::Phi3),
    ("qwen2", Family::Qwen2),
    ("qwen2_moe", Family::Qwen2),
    ("qwen3", Family::Qwen2),
    ("qwen3_moe", Family::Qwen2),
    ("qwen3_next", Family::Qwen3Next),
    ("qwen3_5", Family::Qwen3Next),
    ("qwen3_5_moe", Family::Qwen3Next),
    ("gemma", Family::Gemma),
    ("gemma2", Family::Gemma2),
    ("gemma3", Family::Gemma3),
    ("gemma4", Family::Gemma4),
    ("deepseek_v2", Family::DeepSeek),
    ("deepseek_v3", Family::DeepSeek),
    ("gpt_oss", Family::GptOss),
    ("jamba", Family::Jamba),
];

/// One section of the config (the root or `text_config`), with the path prefix used in error messages.
struct Section<'a> {
    obj: &'a Map<String, Value>,
    prefix: &'static str,
    model_type: &'a str,
}

impl Section<'_> {
    fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The value of `key`, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn u32_opt(&self, key: &str) -> Result<Option<u32>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_u64().and_then(|n| u32::try_from(n).ok()).map(Some).ok_or_else(|| ConfigError::InvalidKey {
            key: self.path(key),
            reason: format!("expected a non-negative integer up to {}, found {v}", u32::MAX),
        })
    }

    fn u32_req(&self, key: &str) -> Result<u32, ConfigError> {
        self.u32_opt(key)?.ok_or_else(|| self.missing(key))
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_bool().map(Some).ok_or_else(|| ConfigError::InvalidKey {
            key: self.path(key),
            reason: format!("expected true or false, found {v}"),
        })
    }

    fn missing(&self, key: &str) -> ConfigError {
        ConfigError::MissingKey { key: self.path(key), model_type: self.model_type.to_owned() }
    }

    fn nonzero(&self, key: &str, value: u32) -> Result<u32, ConfigError> {
        if value == 0 {
            return Err(ConfigError::InvalidKey { key: self.path(key), reason: "must be at least 1".into() });
        }
        Ok(value)
    }
}

/// The attention type of one layer before head sizes are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Full,
    Sliding,
    NoKv(NoKvReason),
}

impl ModelSpec {
    /// Reads the KV-cache layout from a Hugging Face `config.json` as published.
    ///
    /// The spec is named after the file's `model_type`; it has no parameter count.
    ///
    /// The parser reads the keys the KV cache depends on, with the defaults of each family's Hugging Face
    /// config class where a published file leaves a key out, and refuses everything else with a
    /// [`ConfigError`] naming the key. Rules, per family (`i` is the 0-based layer index):
    ///
    /// - **Text model**: when the file has a `text_config` object (multimodal Gemma 3/4, Qwen3.5), that
    ///   object is the model; `vision_config` / `audio_config` are ignored. The family is the root's
    ///   `model_type`, or else `text_config.model_type` (a `_text` suffix is accepted).
    /// - **Head size**: `head_dim` when present and not null; otherwise 256 for Gemma 1/2/3 (their config
    ///   classes' default); otherwise `hidden_size / num_attention_heads` (which must divide).
    /// - **KV heads**: `num_key_value_heads`; when absent, `num_attention_heads` (multi-head attention, the
    ///   documented fallback of the Llama-style config classes). Required for Gemma.
    /// - **Layer types**: `layer_types` when present (`full_attention`, `sliding_attention`,
    ///   `linear_attention`, `mamba`); otherwise Gemma 2 alternates (even `i` sliding), Gemma 3 makes every
    ///   `sliding_window_pattern`-th layer global (default 6: `(i + 1) % 6 == 0`), gpt-oss alternates like
    ///   Gemma 2, Qwen3-Next / Qwen3.5 make every `full_attention_interval`-th layer full attention (default 4)
    ///   and the rest linear attention, Jamba puts attention at `i % attn_layer_period == attn_layer_offset`
    ///   (defaults 8 and 4) and Mamba elsewhere, Qwen2/Qwen3 with `use_sliding_window: true` slide from layer
    ///   `max_window_layers` on, and Mistral / Phi-3 apply `sliding_window` (when not null) to every layer.
    /// - **Sliding disabled**: `use_sliding_window: false` turns every would-be sliding layer into full
    ///   attention (Qwen2.5 publishes `sliding_window: 131072` with it switched off).
    /// - **Window defaults** (key absent, not null): 4096 for Gemma 2, Gemma 3 and Mistral, 128 for gpt-oss.
    /// - **Gemma 4**: full-attention layers use `global_head_dim` (default `head_dim`) and
    ///   `num_global_key_value_heads` (absent or null: `num_key_value_heads`); `layer_types` is required;
    ///   the last `num_kv_shared_layers` layers reuse earlier layers' caches and get none of their own. K and
    ///   V are stored separately even with `attention_k_eq_v`, as vLLM does.
    /// - **DeepSeek V2/V3 (MLA)**: every layer caches `kv_lora_rank + qk_rope_head_dim` elements per token;
    ///   `num_key_value_heads` is ignored. The multi-token-prediction layer (`num_nextn_predict_layers`) is not
    ///   counted: vLLM only allocates it with speculative decoding.
    ///
    /// Every integer must be a non-negative JSON integer that fits in a `u32`; sizes that would overflow are
    /// refused by [`ModelSpecBuilder::build`](crate::kv::ModelSpecBuilder::build). The parser never panics.
    ///
    /// # Errors
    ///
    /// - [`ConfigError::InvalidJson`] when `json` is not a JSON object;
    /// - [`ConfigError::UnsupportedArchitecture`] for a `model_type` whose layout is not known;
    /// - [`ConfigError::MissingKey`] naming the missing key (with its path, e.g. `text_config.num_hidden_layers`);
    /// - [`ConfigError::InvalidKey`] for a value of the wrong type or range (e.g. a `layer_types` list whose
    ///   length differs from `num_hidden_layers`);
    /// - the errors of [`ModelSpecBuilder::build`](crate::kv::ModelSpecBuilder::build) for absurd sizes.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{KvDtype, ModelSpec};
    ///
    /// let json = r#"{ "model_type": "mistral", "hidden_size": 4096, "num_attention_heads": 32,
    ///                 "num_hidden_layers": 32, "num_key_value_heads": 8, "sliding_window": 4096 }"#;
    /// let spec = ModelSpec::from_hf_config(json)?;
    /// assert_eq!(spec.sliding_layers(), 32);
    /// // Past the window a sequence holds 4096 tokens per layer: 32 layers x 4096 x 2 x 8 x 128 x 2 bytes.
    /// assert_eq!(spec.kv_bytes(10_000, KvDtype::Bf16), 32 * 4096 * 4096);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "hf-config")))]
    pub fn from_hf_config(json: &str) -> Result<ModelSpec, ConfigError> {
        let root: Value = serde_json::from_str(json).map_err(|e| ConfigError::InvalidJson(e.to_string()))?;
        let Some(root) = root.as_object() else {
            return Err(ConfigError::InvalidJson("the top level is not an object".into()));
        };
        let top_type = match root.get("model_type") {
            Some(Value::String(s)) => s.as_str(),
            Some(other) => {
                return Err(ConfigError::InvalidKey {
                    key: "model_type".into(),
                    reason: format!("expected a string, found {other}"),
                });
            }
            None => {
                return Err(ConfigError::MissingKey { key: "model_type".into(), model_type: "unknown".into() });
            }
        };
        let sec = match root.get("text_config") {
            Some(Value::Object(obj)) => Section { obj, prefix: "text_config.", model_type: top_type },
            Some(Value::Null) | None => Section { obj: root, prefix: "", model_type: top_type },
            Some(other) => {
                return Err(ConfigError::InvalidKey {
                    key: "text_config".into(),
                    reason: format!("expected an object, found {other}"),
                });
            }
        };
        // The root's model_type decides; a wrapper the parser does not know (a vision-language model) may
        // still nest a known text model, named by `text_config.model_type`.
        let inner_type = sec.obj.get("model_type").and_then(Value::as_str);
        let family = [Some(top_type), inner_type]
            .into_iter()
            .flatten()
            .find_map(family_of)
            .ok_or_else(|| ConfigError::UnsupportedArchitecture { model_type: top_type.to_owned() })?;
        parse(&sec, family)
    }
}

fn family_of(model_type: &str) -> Option<Family> {
    let base = model_type.strip_suffix("_text").unwrap_or(model_type);
    MODEL_TYPES.iter().find(|(name, _)| *name == base).map(|&(_, f)| f)
}

/// Most layers a config may declare. The deepest published models have a few hundred; the parser works
/// per layer, so an absurd count in a hostile file must be refused rather than iterated.
const MAX_LAYERS: u32 = 65_536;

fn parse(sec: &Section<'_>, family: Family) -> Result<ModelSpec, ConfigError> {
    let layers = sec.nonzero("num_hidden_layers", sec.u32_req("num_hidden_layers")?)?;
    if layers > MAX_LAYERS {
        return Err(ConfigError::InvalidKey {
            key: sec.path("num_hidden_layers"),
            reason: format!("{layers} layers; at most {MAX_LAYERS} are supported"),
        });
    }
    let builder = ModelSpec::builder(sec.model_type);

    if family == Family::DeepSeek {
        let rank = sec.u32_req("kv_lora_rank")?;
        let rope = sec.u32_req("qk_rope_head_dim")?;
        let latent = rank.checked_add(rope).ok_or_else(|| ConfigError::InvalidKey {
            key: sec.path("kv_lora_rank"),
            reason: "kv_lora_rank + qk_rope_head_dim overflows".into(),
        })?;
        return builder.mla(layers, latent).build();
    }

    let kv_heads = match (sec.u32_opt("num_key_value_heads")?, family) {
        (Some(n), _) => sec.nonzero("num_key_value_heads", n)?,
        (None, Family::Gemma | Family::Gemma2 | Family::Gemma3 | Family::Gemma4) => {
            return Err(sec.missing("num_key_value_heads"));
        }
        (None, _) => sec.nonzero("num_attention_heads", sec.u32_req("num_attention_heads")?)?,
    };
    let head_dim = match (sec.u32_opt("head_dim")?, family) {
        (Some(d), _) => sec.nonzero("head_dim", d)?,
        (None, Family::Gemma | Family::Gemma2 | Family::Gemma3) => 256,
        (None, _) => derived_head_dim(sec)?,
    };

    let window = match (sec.get("sliding_window"), family) {
        (Some(_), _) => Some(sec.nonzero("sliding_window", sec.u32_req("sliding_window")?)?),
        // Key present but null: no window.
        (None, _) if sec.obj.contains_key("sliding_window") => None,
        (None, Family::Gemma2 | Family::Gemma3 | Family::Mistral) => Some(4096),
        (None, Family::GptOss) => Some(128),
        (None, _) => None,
    };
    let sliding_enabled = sec.bool_opt("use_sliding_window")?.unwrap_or(!matches!(family, Family::Qwen2));

    let slots = layer_slots(sec, family, layers, window.is_some() && sliding_enabled)?;

    let (global_heads, global_dim) = if family == Family::Gemma4 {
        let heads = match sec.u32_opt("num_global_key_value_heads")? {
            Some(n) => sec.nonzero("num_global_key_value_heads", n)?,
            None => kv_heads,
        };
        let dim = match sec.u32_opt("global_head_dim")? {
            Some(d) => sec.nonzero("global_head_dim", d)?,
            None => head_dim,
        };
        (heads, dim)
    } else {
        (kv_heads, head_dim)
    };
    let shared = if family == Family::Gemma4 { sec.u32_opt("num_kv_shared_layers")?.unwrap_or(0) } else { 0 };
    if shared > layers {
        return Err(ConfigError::InvalidKey {
            key: sec.path("num_kv_shared_layers"),
            reason: format!("{shared} shared-KV layers but only {layers} layers"),
        });
    }

    let full = LayerKind::Full { kv_heads: global_heads, k_head_dim: global_dim, v_head_dim: global_dim };
    let mut b = builder;
    for (i, slot) in slots.enumerate() {
        let slot = slot?;
        let kind = if i >= (layers - shared) as usize {
            LayerKind::NoKv(NoKvReason::SharedKv)
        } else {
            match slot {
                Slot::Full => full,
                Slot::Sliding if !sliding_enabled => full,
                Slot::Sliding => match window {
                    Some(window) => LayerKind::Sliding { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim, window },
                    None => return Err(sec.missing("sliding_window")),
                },
                Slot::NoKv(reason) => LayerKind::NoKv(reason),
            }
        };
        b = b.group(1, kind);
    }
    b.build()
}

fn derived_head_dim(sec: &Section<'_>) -> Result<u32, ConfigError> {
    let hidden = sec.u32_req("hidden_size")?;
    let heads = sec.nonzero("num_attention_heads", sec.u32_req("num_attention_heads")?)?;
    if hidden % heads != 0 || hidden == 0 {
        return Err(ConfigError::InvalidKey {
            key: sec.path("hidden_size"),
            reason: format!(
                "head_dim is absent and hidden_size {hidden} is not a positive multiple of num_attention_heads {heads}"
            ),
        });
    }
    Ok(hidden / heads)
}

/// The attention type of each layer, in order; an unknown entry of `layer_types` is an error item.
fn layer_slots<'a>(
    sec: &'a Section<'a>,
    family: Family,
    layers: u32,
    sliding: bool,
) -> Result<Box<dyn Iterator<Item = Result<Slot, ConfigError>> + 'a>, ConfigError> {
    if let Some(types) = sec.get("layer_types") {
        let list = types.as_array().ok_or_else(|| ConfigError::InvalidKey {
            key: sec.path("layer_types"),
            reason: format!("expected a list of strings, found {types}"),
        })?;
        if list.len() != layers as usize {
            return Err(ConfigError::InvalidKey {
                key: sec.path("layer_types"),
                reason: format!("has {} entries but num_hidden_layers is {layers}", list.len()),
            });
        }
        return Ok(Box::new(list.iter().map(move |t| match t.as_str() {
            Some("full_attention" | "attention") => Ok(Slot::Full),
            Some("sliding_attention") => Ok(Slot::Sliding),
            Some("linear_attention") => Ok(Slot::NoKv(NoKvReason::LinearAttention)),
            Some("mamba") => Ok(Slot::NoKv(NoKvReason::Mamba)),
            _ => Err(ConfigError::InvalidKey {
                key: sec.path("layer_types"),
                reason: format!(
                    "unsupported layer type {t}; known: full_attention, sliding_attention, linear_attention, mamba"
                ),
            }),
        })));
    }
    let all = move |slot: Slot| -> Box<dyn Iterator<Item = _>> { Box::new((0..layers).map(move |_| Ok(slot))) };
    let uniform = if sliding { Slot::Sliding } else { Slot::Full };
    Ok(match family {
        Family::Gemma2 | Family::GptOss => {
            Box::new((0..layers).map(move |i| Ok(if i % 2 == 0 { uniform } else { Slot::Full })))
        }
        Family::Gemma3 => {
            let pattern = sec.nonzero("sliding_window_pattern", sec.u32_opt("sliding_window_pattern")?.unwrap_or(6))?;
            Box::new((0..layers).map(move |i| Ok(if (i + 1) % pattern == 0 { Slot::Full } else { uniform })))
        }
        Family::Qwen3Next => {
            let every = sec.nonzero("full_attention_interval", sec.u32_opt("full_attention_interval")?.unwrap_or(4))?;
            Box::new((0..layers).map(move |i| {
                Ok(if (i + 1) % every == 0 { Slot::Full } else { Slot::NoKv(NoKvReason::LinearAttention) })
            }))
        }
        Family::Jamba => {
            let period = sec.nonzero("attn_layer_period", sec.u32_opt("attn_layer_period")?.unwrap_or(8))?;
            let offset = sec.u32_opt("attn_layer_offset")?.unwrap_or(4);
            if offset >= period {
                return Err(ConfigError::InvalidKey {
                    key: sec.path("attn_layer_offset"),
                    reason: format!("{offset} is not below attn_layer_period {period}"),
                });
            }
            Box::new(
                (0..layers)
                    .map(move |i| Ok(if i % period == offset { uniform } else { Slot::NoKv(NoKvReason::Mamba) })),
            )
        }
        Family::Qwen2 => {
            let from = sec.u32_opt("max_window_layers")?.unwrap_or(0);
            Box::new((0..layers).map(move |i| Ok(if i >= from { uniform } else { Slot::Full })))
        }
        Family::Mistral | Family::Phi3 | Family::Llama => all(uniform),
        // Gemma 4's layout is only trusted from its published `layer_types`.
        Family::Gemma4 => return Err(sec.missing("layer_types")),
        Family::Gemma | Family::DeepSeek => all(Slot::Full),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(json: &str) -> ConfigError {
        ModelSpec::from_hf_config(json).unwrap_err()
    }

    #[test]
    fn errors_name_the_key() {
        assert!(matches!(err("[]"), ConfigError::InvalidJson(_)));
        assert!(matches!(err("{"), ConfigError::InvalidJson(_)));
        assert_eq!(err("{}"), ConfigError::MissingKey { key: "model_type".into(), model_type: "unknown".into() });
        assert!(matches!(err(r#"{"model_type":"bert"}"#), ConfigError::UnsupportedArchitecture { .. }));
        assert_eq!(
            err(r#"{"model_type":"gemma3","text_config":{"num_key_value_heads":8}}"#),
            ConfigError::MissingKey { key: "text_config.num_hidden_layers".into(), model_type: "gemma3".into() }
        );
        assert!(matches!(
            err(r#"{"model_type":"llama","num_hidden_layers":2,"num_attention_heads":3,"hidden_size":100}"#),
            ConfigError::InvalidKey { key, .. } if key == "hidden_size"
        ));
        assert!(matches!(
            err(r#"{"model_type":"llama","num_hidden_layers":-2}"#),
            ConfigError::InvalidKey { key, .. } if key == "num_hidden_layers"
        ));
        assert!(matches!(
            err(r#"{"model_type":"gpt_oss","num_hidden_layers":2,"num_key_value_heads":1,"head_dim":4,"layer_types":["full_attention"]}"#),
            ConfigError::InvalidKey { key, .. } if key == "layer_types"
        ));
    }

    #[test]
    fn unknown_wrapper_around_a_known_text_model() {
        let json = r#"{"model_type":"llava","text_config":{"model_type":"llama","num_hidden_layers":2,
                       "num_attention_heads":4,"num_key_value_heads":2,"hidden_size":256}}"#;
        let spec = ModelSpec::from_hf_config(json).unwrap();
        assert_eq!((spec.full_layers(), spec.name()), (2, "llava"));
    }

    #[test]
    fn jamba_period_and_offset() {
        let json = r#"{"model_type":"jamba","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
                       "hidden_size":4096,"attn_layer_period":8,"attn_layer_offset":4}"#;
        let spec = ModelSpec::from_hf_config(json).unwrap();
        assert_eq!((spec.full_layers(), spec.no_kv_layers()), (4, 28));
    }

    #[test]
    fn qwen2_sliding_from_max_window_layers() {
        let json = r#"{"model_type":"qwen2","num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,
                       "hidden_size":3584,"sliding_window":4096,"use_sliding_window":true,"max_window_layers":21}"#;
        let spec = ModelSpec::from_hf_config(json).unwrap();
        assert_eq!((spec.full_layers(), spec.sliding_layers()), (21, 7));
    }
}
