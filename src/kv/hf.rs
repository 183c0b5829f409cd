//! Reading a Hugging Face `config.json` into a [`ModelSpec`] (feature `hf-config`).
//!
//! The rules applied to each family are documented on [`ModelSpec::from_hf_config`]; the class defaults
//! live in [`super::hf_defaults`].

use serde_json::{Map, Value};

use super::hf_defaults::{ClassDefault, Family, FamilyInfo};
use super::{LayerKind, ModelSpec, NoKvReason, RecurrentKind};
use crate::ConfigError;

/// One section of the config (the root or `text_config`), with the path prefix used in error messages and
/// the family whose class defaults fill absent keys.
struct Section<'a> {
    obj: &'a Map<String, Value>,
    prefix: &'static str,
    model_type: &'a str,
    info: &'static FamilyInfo,
}

impl Section<'_> {
    fn path(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The value of `key`, `None` when absent or null.
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn is_null(&self, key: &str) -> bool {
        self.obj.get(key).is_some_and(Value::is_null)
    }

    fn invalid(&self, key: &str, reason: String) -> ConfigError {
        ConfigError::InvalidKey { key: self.path(key), reason }
    }

    /// The file's value of `key` (`None` when absent or null).
    fn u32_in_file(&self, key: &str) -> Result<Option<u32>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| self.invalid(key, format!("expected a non-negative integer up to {}, found {v}", u32::MAX)))
    }

    /// The file's value of `key`, else (only when the key is absent, not null) the class default.
    fn u32_opt(&self, key: &str) -> Result<Option<u32>, ConfigError> {
        match self.u32_in_file(key)? {
            Some(n) => Ok(Some(n)),
            None if self.is_null(key) => Ok(None),
            None => Ok(match self.info.default(key) {
                Some(ClassDefault::Int(n)) => Some(n),
                _ => None,
            }),
        }
    }

    fn u32_req(&self, key: &str) -> Result<u32, ConfigError> {
        self.u32_opt(key)?.ok_or_else(|| self.missing(key))
    }

    fn nonzero_req(&self, key: &str) -> Result<u32, ConfigError> {
        let value = self.u32_req(key)?;
        self.nonzero(key, value)
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            Some(v) => {
                v.as_bool().map(Some).ok_or_else(|| self.invalid(key, format!("expected true or false, found {v}")))
            }
            None => Ok(match self.info.default(key) {
                Some(ClassDefault::Bool(b)) => Some(b),
                _ => None,
            }),
        }
    }

    fn missing(&self, key: &str) -> ConfigError {
        ConfigError::MissingKey { key: self.path(key), model_type: self.model_type.to_owned() }
    }

    fn nonzero(&self, key: &str, value: u32) -> Result<u32, ConfigError> {
        if value == 0 {
            return Err(self.invalid(key, "must be at least 1".into()));
        }
        Ok(value)
    }

    /// `num_key_value_heads`, or (class default) `num_attention_heads`.
    fn kv_heads(&self) -> Result<u32, ConfigError> {
        match self.u32_opt("num_key_value_heads")? {
            Some(n) => self.nonzero("num_key_value_heads", n),
            None => self.nonzero_req("num_attention_heads"),
        }
    }

    /// `head_dim`, or (class default) `hidden_size / num_attention_heads`, which must divide.
    fn head_dim(&self) -> Result<u32, ConfigError> {
        if let Some(d) = self.u32_opt("head_dim")? {
            return self.nonzero("head_dim", d);
        }
        let hidden = self.u32_req("hidden_size")?;
        let heads = self.nonzero_req("num_attention_heads")?;
        if hidden % heads != 0 || hidden == 0 {
            return Err(self.invalid(
                "hidden_size",
                format!(
                    "head_dim is absent and hidden_size {hidden} is not a positive multiple of num_attention_heads {heads}"
                ),
            ));
        }
        Ok(hidden / heads)
    }

    /// Elements of a state, checked to fit the `u32` a layer stores.
    fn state(&self, key: &str, elements: Option<u64>) -> Result<u32, ConfigError> {
        elements.and_then(|n| u32::try_from(n).ok()).filter(|&n| n > 0).ok_or_else(|| {
            self.invalid(key, "the recurrent state this gives is empty or larger than 2^32 elements".into())
        })
    }
}

/// What one decoder layer stores, before head sizes are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Full,
    Sliding,
    Chunked,
    /// Gated DeltaNet linear attention.
    Linear,
    /// Mamba (v1).
    Mamba,
    /// Falcon-H1: attention and Mamba2 side by side.
    Hybrid,
}

/// Most layers a config may declare. The deepest published models have a few hundred; the parser works
/// per layer, so an absurd count in a hostile file must be refused rather than iterated.
const MAX_LAYERS: u32 = 65_536;

impl ModelSpec {
    /// Reads the KV-cache layout from a Hugging Face `config.json` as published.
    ///
    /// The spec is named after the file's `model_type`; it has no parameter count.
    ///
    /// The parser reads the keys the KV cache depends on. Where a published file leaves a key out, it uses
    /// the default of the family's `transformers` config class, as `transformers` and vLLM would (the table
    /// [`hf_config_defaults_table`](crate::kv::hf_config_defaults_table) lists them); it refuses everything
    /// else with a [`ConfigError`] naming the key. Rules (`i` is the 0-based layer index):
    ///
    /// - **Text model**: when the file has a `text_config` object (multimodal Gemma 3/4, Llama 4, Qwen3.5),
    ///   that object is the model; `vision_config` / `audio_config` are ignored. The family is the root's
    ///   `model_type`, or else `text_config.model_type` (a `_text` suffix is accepted).
    /// - **Head size**: `head_dim`, else the class default (Gemma's 256, Qwen3's 128, ...), else
    ///   `hidden_size / num_attention_heads` (which must divide). **KV heads**: `num_key_value_heads`, else
    ///   the class default, else `num_attention_heads`.
    /// - **Layer types**: `layer_types` when present (`full_attention`/`attention`, `sliding_attention`,
    ///   `chunked_attention`, `linear_attention`, `mamba`, `hybrid`); otherwise Gemma 2 and gpt-oss alternate
    ///   (even `i` sliding), Gemma 3 makes every `sliding_window_pattern`-th layer global (`(i + 1) % 6 ==
    ///   0`), Gemma 4 too with the last layer always global, Qwen3-Next / Qwen3.5 make every
    ///   `full_attention_interval`-th layer full attention and the rest Gated DeltaNet, Jamba puts attention
    ///   at `i % attn_layer_period == attn_layer_offset` and Mamba elsewhere, Qwen2/Qwen3 with
    ///   `use_sliding_window: true` slide from layer `max_window_layers` on, Mistral / Mixtral / Phi-3 / Llama
    ///   apply `sliding_window` (when set) to every layer, Llama 4 uses chunked local attention on its RoPE
    ///   layers (`no_rope_layers[i] == 1`; by default all but every `no_rope_layer_interval`-th) when
    ///   `attention_chunk_size` is set, SmolLM3 slides on its NoPE layers only with `use_sliding_window` and
    ///   a window, and every Falcon-H1 layer holds attention and Mamba2 side by side (so the spec has twice
    ///   `num_hidden_layers` layers).
    /// - **Sliding disabled**: `use_sliding_window: false` turns every would-be sliding layer into full
    ///   attention (Qwen2.5 publishes `sliding_window: 131072` with it switched off); `sliding_window: null`
    ///   means no window.
    /// - **Gemma 4**: full-attention layers use `global_head_dim` and `num_global_key_value_heads` (absent
    ///   or null: `num_key_value_heads`); the last `num_kv_shared_layers` layers reuse earlier layers' caches
    ///   and get none of their own. K and V are stored separately even with `attention_k_eq_v`, as vLLM does.
    /// - **MLA** (DeepSeek V2/V3, GLM-4.7-Flash's `glm4_moe_lite`): every layer caches `kv_lora_rank +
    ///   qk_rope_head_dim` elements per token; `num_key_value_heads` is ignored. Multi-token-prediction
    ///   layers (`num_nextn_predict_layers`) are not counted: vLLM allocates them only with speculative
    ///   decoding.
    /// - **Recurrent state** per layer and sequence (vLLM's `MambaStateShapeCalculator`,
    ///   `model_executor/layers/mamba/mamba_utils.py`): Gated DeltaNet `(linear_conv_kernel_dim − 1) × (2 ×
    ///   linear_num_key_heads × linear_key_head_dim + linear_num_value_heads × linear_value_head_dim) +
    ///   linear_num_value_heads × linear_key_head_dim × linear_value_head_dim`; Jamba's Mamba `(mamba_d_conv
    ///   − 1) × I + I × mamba_d_state` with `I = mamba_expand × hidden_size`; Falcon-H1's Mamba2
    ///   `(mamba_d_conv − 1) × (D + 2 × mamba_n_groups × mamba_d_state) + mamba_n_heads × mamba_d_head ×
    ///   mamba_d_state` with `D = mamba_d_ssm` (or `mamba_expand × hidden_size`).
    ///
    /// Every integer must be a non-negative JSON integer that fits in a `u32`; sizes that would overflow are
    /// refused by [`ModelSpecBuilder::build`](crate::kv::ModelSpecBuilder::build). The parser never panics.
    ///
    /// # Errors
    ///
    /// - [`ConfigError::InvalidJson`] when `json` is not a JSON object;
    /// - [`ConfigError::UnsupportedArchitecture`] for a `model_type` whose layout is not known;
    /// - [`ConfigError::MissingKey`] naming a missing key that has no class default (with its path, e.g.
    ///   `text_config.sliding_window` for a layer typed sliding with no window);
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
    ///
    /// // Gemma 3 4B publishes a text_config without heads or head size: Gemma3TextConfig's defaults
    /// // (8 heads, 4 KV heads of 256) fill them in.
    /// let gemma = r#"{ "model_type": "gemma3", "text_config": { "model_type": "gemma3_text",
    ///                  "hidden_size": 2560, "num_hidden_layers": 34, "sliding_window": 1024 } }"#;
    /// assert_eq!(ModelSpec::from_hf_config(gemma)?.groups(), ModelSpec::preset("gemma-3-4b")?.groups());
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
        let (obj, prefix) = match root.get("text_config") {
            Some(Value::Object(obj)) => (obj, "text_config."),
            Some(Value::Null) | None => (root, ""),
            Some(other) => {
                return Err(ConfigError::InvalidKey {
                    key: "text_config".into(),
                    reason: format!("expected an object, found {other}"),
                });
            }
        };
        // The root's model_type decides; a wrapper the parser does not know (a vision-language model) may
        // still nest a known text model, named by `text_config.model_type`.
        let inner_type = obj.get("model_type").and_then(Value::as_str);
        let info = [Some(top_type), inner_type]
            .into_iter()
            .flatten()
            .find_map(FamilyInfo::of)
            .ok_or_else(|| ConfigError::UnsupportedArchitecture { model_type: top_type.to_owned() })?;
        parse(&Section { obj, prefix, model_type: top_type, info })
    }
}

fn parse(sec: &Section<'_>) -> Result<ModelSpec, ConfigError> {
    let family = sec.info.family;
    let layers = sec.nonzero_req("num_hidden_layers")?;
    if layers > MAX_LAYERS {
        return Err(sec.invalid("num_hidden_layers", format!("{layers} layers; at most {MAX_LAYERS} are supported")));
    }
    let builder = ModelSpec::builder(sec.model_type);

    if matches!(family, Family::DeepSeekV2 | Family::DeepSeekV3 | Family::Glm4MoeLite) {
        let rank = sec.u32_req("kv_lora_rank")?;
        let rope = sec.u32_req("qk_rope_head_dim")?;
        let latent = rank
            .checked_add(rope)
            .ok_or_else(|| sec.invalid("kv_lora_rank", "kv_lora_rank + qk_rope_head_dim overflows".into()))?;
        return builder.mla(layers, latent).build();
    }

    let kv_heads = sec.kv_heads()?;
    let head_dim = sec.head_dim()?;
    let window = match sec.u32_opt("sliding_window")? {
        Some(w) => Some(sec.nonzero("sliding_window", w)?),
        None => None,
    };
    let sliding_enabled = sec.bool_opt("use_sliding_window")?.unwrap_or(true);
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
        return Err(sec.invalid("num_kv_shared_layers", format!("{shared} shared-KV layers but only {layers} layers")));
    }
    let chunk = if family == Family::Llama4 {
        match sec.u32_opt("attention_chunk_size")? {
            Some(c) => Some(sec.nonzero("attention_chunk_size", c)?),
            None => None,
        }
    } else {
        None
    };

    let full = LayerKind::Full { kv_heads: global_heads, k_head_dim: global_dim, v_head_dim: global_dim };
    let mut state: Option<LayerKind> = None;
    let mut b = builder;
    for (i, slot) in slots.into_iter().enumerate() {
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
                Slot::Chunked => match chunk {
                    Some(chunk) => {
                        LayerKind::ChunkedLocal { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim, chunk }
                    }
                    None => full,
                },
                Slot::Linear | Slot::Mamba | Slot::Hybrid => {
                    let kind = match state {
                        Some(kind) => kind,
                        None => *state.insert(recurrent(sec, slot)?),
                    };
                    if slot == Slot::Hybrid {
                        b = b.group(1, full);
                    }
                    kind
                }
            }
        };
        b = b.group(1, kind);
    }
    b.build()
}

/// The recurrent layer of a family, its state sized from the config (formulas on `from_hf_config`).
fn recurrent(sec: &Section<'_>, slot: Slot) -> Result<LayerKind, ConfigError> {
    let get = |key: &str| sec.u32_req(key).map(u64::from);
    let (kind, key, elements) = match slot {
        Slot::Linear => {
            let conv = get("linear_conv_kernel_dim")?;
            let (dk, dv) = (get("linear_key_head_dim")?, get("linear_value_head_dim")?);
            let (hk, hv) = (get("linear_num_key_heads")?, get("linear_num_value_heads")?);
            let elements = (2 * hk * dk + hv * dv)
                .checked_mul(conv.saturating_sub(1))
                .and_then(|c| hv.checked_mul(dk).and_then(|s| s.checked_mul(dv)).and_then(|s| s.checked_add(c)));
            (RecurrentKind::GatedDeltaNet, "linear_num_value_heads", elements)
        }
        Slot::Mamba => {
            let intermediate = get("mamba_expand")? * get("hidden_size")?;
            let elements = (get("mamba_d_conv")?.saturating_sub(1) + get("mamba_d_state")?).checked_mul(intermediate);
            (RecurrentKind::Mamba, "mamba_d_state", elements)
        }
        _ => {
            let d_ssm = match sec.u32_in_file("mamba_d_ssm")? {
                Some(d) => u64::from(d),
                None if sec.obj.contains_key("mamba_d_ssm") => get("mamba_expand")? * get("hidden_size")?,
                None => get("mamba_d_ssm")?,
            };
            let heads = u64::from(sec.nonzero_req("mamba_n_heads")?);
            let head = match sec.get("mamba_d_head") {
                Some(Value::String(s)) if s == "auto" => d_ssm / heads,
                _ => match sec.u32_in_file("mamba_d_head")? {
                    Some(d) => u64::from(d),
                    None => d_ssm / heads,
                },
            };
            let (groups, d_state, conv) = (get("mamba_n_groups")?, get("mamba_d_state")?, get("mamba_d_conv")?);
            let elements = (d_ssm + 2 * groups * d_state).checked_mul(conv.saturating_sub(1)).and_then(|c| {
                heads.checked_mul(head).and_then(|s| s.checked_mul(d_state)).and_then(|s| s.checked_add(c))
            });
            (RecurrentKind::Mamba2, "mamba_d_state", elements)
        }
    };
    Ok(LayerKind::Recurrent { kind, state_elements: sec.state(key, elements)? })
}

/// What each decoder layer stores, in order.
fn layer_slots(sec: &Section<'_>, family: Family, layers: u32, sliding: bool) -> Result<Vec<Slot>, ConfigError> {
    let n = layers as usize;
    if let Some(types) = sec.get("layer_types").or_else(|| sec.get("layers_block_type")) {
        let key = if sec.get("layer_types").is_some() { "layer_types" } else { "layers_block_type" };
        let list =
            types.as_array().ok_or_else(|| sec.invalid(key, format!("expected a list of strings, found {types}")))?;
        if list.len() != n {
            return Err(sec.invalid(key, format!("has {} entries but num_hidden_layers is {layers}", list.len())));
        }
        return list
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention" | "attention") => Ok(Slot::Full),
                Some("sliding_attention") => Ok(Slot::Sliding),
                Some("chunked_attention") => Ok(Slot::Chunked),
                Some("linear_attention") => Ok(Slot::Linear),
                Some("mamba") if family == Family::FalconH1 => Ok(Slot::Hybrid),
                Some("mamba") => Ok(Slot::Mamba),
                Some("hybrid") => Ok(Slot::Hybrid),
                _ => Err(sec.invalid(
                    key,
                    format!(
                        "unsupported layer type {t}; known: full_attention, sliding_attention, chunked_attention, \
                         linear_attention, mamba, hybrid"
                    ),
                )),
            })
            .collect();
    }
    let uniform = if sliding { Slot::Sliding } else { Slot::Full };
    let each = |f: &dyn Fn(u32) -> Slot| (0..layers).map(f).collect::<Vec<_>>();
    Ok(match family {
        Family::Gemma2 | Family::GptOss => each(&|i| if i % 2 == 0 { uniform } else { Slot::Full }),
        Family::Gemma3 => {
            let pattern = sec.nonzero_req("sliding_window_pattern")?;
            each(&|i| if (i + 1) % pattern == 0 { Slot::Full } else { uniform })
        }
        Family::Gemma4 => each(&|i| if (i + 1) % 6 == 0 || i + 1 == layers { Slot::Full } else { uniform }),
        Family::Qwen3Next | Family::Qwen3_5 | Family::Qwen3_5Moe => {
            let every = sec.nonzero_req("full_attention_interval")?;
            each(&|i| if (i + 1) % every == 0 { Slot::Full } else { Slot::Linear })
        }
        Family::Jamba => {
            let period = sec.nonzero_req("attn_layer_period")?;
            let offset = sec.u32_req("attn_layer_offset")?;
            if offset >= period {
                return Err(
                    sec.invalid("attn_layer_offset", format!("{offset} is not below attn_layer_period {period}"))
                );
            }
            each(&|i| if i % period == offset { uniform } else { Slot::Mamba })
        }
        Family::Qwen2 | Family::Qwen2Moe | Family::Qwen3 | Family::Qwen3Moe => {
            let from = sec.u32_opt("max_window_layers")?.unwrap_or(0);
            each(&|i| if i >= from { uniform } else { Slot::Full })
        }
        Family::Llama4 | Family::SmolLm3 => {
            // no_rope_layers[i] == 1: the layer uses RoPE; 0: NoPE.
            let rope = match sec.get("no_rope_layers") {
                Some(Value::Array(list)) if !list.is_empty() => {
                    if list.len() < n {
                        return Err(sec.invalid(
                            "no_rope_layers",
                            format!("has {} entries but num_hidden_layers is {layers}", list.len()),
                        ));
                    }
                    list.iter()
                        .take(n)
                        .map(|v| match v.as_u64() {
                            Some(0) => Ok(false),
                            Some(1) => Ok(true),
                            _ => Err(sec.invalid("no_rope_layers", format!("expected 0 or 1, found {v}"))),
                        })
                        .collect::<Result<Vec<_>, _>>()?
                }
                Some(Value::Array(_)) | None => {
                    let interval = sec.nonzero_req("no_rope_layer_interval")?;
                    (0..layers).map(|i| (i + 1) % interval != 0).collect()
                }
                Some(other) => {
                    return Err(sec.invalid("no_rope_layers", format!("expected a list of 0 and 1, found {other}")));
                }
            };
            rope.into_iter()
                .map(|rope| match (family, rope) {
                    (Family::Llama4, true) => Slot::Chunked,
                    (Family::SmolLm3, false) => uniform,
                    _ => Slot::Full,
                })
                .collect()
        }
        Family::FalconH1 => each(&|_| Slot::Hybrid),
        Family::Mistral | Family::Mixtral | Family::Phi3 | Family::Llama => each(&|_| uniform),
        Family::Gemma | Family::Glm4Moe | Family::DeepSeekV2 | Family::DeepSeekV3 | Family::Glm4MoeLite => {
            each(&|_| Slot::Full)
        }
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
        assert!(matches!(
            err(r#"{"model_type":"gemma3","text_config":{"num_hidden_layers":"x"}}"#),
            ConfigError::InvalidKey { key, .. } if key == "text_config.num_hidden_layers"
        ));
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
        // A layer typed sliding in a family without a default window.
        assert_eq!(
            err(r#"{"model_type":"llama","num_hidden_layers":1,"layer_types":["sliding_attention"]}"#),
            ConfigError::MissingKey { key: "sliding_window".into(), model_type: "llama".into() }
        );
    }

    #[test]
    fn unknown_wrapper_around_a_known_text_model() {
        let json = r#"{"model_type":"llava","text_config":{"model_type":"llama","num_hidden_layers":2,
                       "num_attention_heads":4,"num_key_value_heads":2,"hidden_size":256}}"#;
        let spec = ModelSpec::from_hf_config(json).unwrap();
        assert_eq!((spec.full_layers(), spec.name()), (2, "llava"));
    }

    #[test]
    fn jamba_period_offset_and_mamba_state() {
        let json = r#"{"model_type":"jamba","num_hidden_layers":32,"num_attention_heads":32,"num_key_value_heads":8,
                       "hidden_size":4096,"attn_layer_period":8,"attn_layer_offset":4}"#;
        let spec = ModelSpec::from_hf_config(json).unwrap();
        assert_eq!((spec.full_layers(), spec.recurrent_layers()), (4, 28));
        // Mamba state: I = 2 x 4096 = 8192; (4 − 1) x 8192 + 8192 x 16 = 155,648 elements.
        let state = spec.groups().iter().map(|g| g.kind().state_elements()).max();
        assert_eq!(state, Some(155_648));
    }

    #[test]
    fn qwen2_sliding_from_max_window_layers() {
        let json = r#"{"model_type":"qwen2","num_hidden_layers":28,"num_attention_heads":28,"num_key_value_heads":4,
                       "hidden_size":3584,"sliding_window":4096,"use_sliding_window":true,"max_window_layers":21}"#;
        let spec = ModelSpec::from_hf_config(json).unwrap();
        assert_eq!((spec.full_layers(), spec.sliding_layers()), (21, 7));
    }

    #[test]
    fn every_family_parses_from_its_model_type_alone() {
        // With nothing but model_type, the class defaults describe a whole model.
        for info in super::super::hf_defaults::FAMILIES {
            if info.family == Family::Glm4Moe {
                // Glm4MoeConfig's defaults (hidden 4096, 96 heads) give no whole head size; every published GLM
                // config carries head_dim, and without it the parser says so.
                let err = ModelSpec::from_hf_config(r#"{"model_type":"glm4_moe"}"#).unwrap_err();
                assert!(matches!(err, ConfigError::InvalidKey { key, .. } if key == "hidden_size"));
                continue;
            }
            for model_type in info.model_types {
                let spec = ModelSpec::from_hf_config(&format!(r#"{{"model_type":"{model_type}"}}"#))
                    .unwrap_or_else(|e| panic!("{model_type}: {e}"));
                assert!(spec.num_layers() > 0, "{model_type}");
            }
        }
    }
}
