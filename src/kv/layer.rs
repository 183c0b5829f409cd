//! [`LayerKind`]: how one layer stores what it remembers of a sequence — a per-token KV cache (full,
//! sliding-window, chunked-local, MLA latent), a fixed-size recurrent state, or nothing of its own.

use std::fmt;

use super::KvDtype;
use crate::ConfigError;

/// Why a layer holds nothing of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NoKvReason {
    /// The layer reads the KV cache of an earlier layer (Gemma's `num_kv_shared_layers`); vLLM gives it no
    /// cache of its own (`kv_sharing_target_layer_name`).
    SharedKv,
}

/// The recurrent-state family of a [`LayerKind::Recurrent`] layer (how its state shape is derived; see
/// [`ModelSpec::from_hf_config`](crate::kv::ModelSpec::from_hf_config) for the formulas).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RecurrentKind {
    /// Mamba (v1) selective state space (Jamba).
    Mamba,
    /// Mamba2 (Falcon-H1).
    Mamba2,
    /// Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5).
    GatedDeltaNet,
}

/// How one layer stores its cache.
///
/// Per token, a full, sliding or chunked-local layer stores `kv_heads × (k_head_dim + v_head_dim)` elements
/// (a K and a V vector per KV head); an MLA layer stores `latent_dim` elements (one compressed latent shared
/// by all heads, no factor of 2). A recurrent layer stores `state_elements` per sequence, whatever its
/// length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LayerKind {
    /// Full (global) attention: holds every token of the sequence.
    Full {
        /// Key/value heads stored per token (after grouped-query sharing).
        kv_heads: u32,
        /// Elements of one key head.
        k_head_dim: u32,
        /// Elements of one value head.
        v_head_dim: u32,
    },
    /// Sliding-window attention: attends to (and needs) the last `window` tokens.
    Sliding {
        /// Key/value heads stored per token.
        kv_heads: u32,
        /// Elements of one key head.
        k_head_dim: u32,
        /// Elements of one value head.
        v_head_dim: u32,
        /// Tokens the layer attends to.
        window: u32,
    },
    /// Chunked local attention (Llama 4's RoPE layers): a token attends only to the earlier tokens of its own
    /// chunk of `chunk` tokens.
    ChunkedLocal {
        /// Key/value heads stored per token.
        kv_heads: u32,
        /// Elements of one key head.
        k_head_dim: u32,
        /// Elements of one value head.
        v_head_dim: u32,
        /// Tokens per attention chunk (`attention_chunk_size`).
        chunk: u32,
    },
    /// Multi-head latent attention (DeepSeek-V2/V3, GLM's MLA models): one latent of `latent_dim` elements per
    /// token, `kv_lora_rank + qk_rope_head_dim`.
    Mla {
        /// Elements stored per token.
        latent_dim: u32,
    },
    /// A recurrent layer (Mamba, Mamba2, Gated DeltaNet): a fixed-size state per sequence, nothing per token.
    Recurrent {
        /// The state's family.
        kind: RecurrentKind,
        /// Elements of one sequence's state (convolution and recurrent state together), for the whole
        /// layer before tensor parallelism.
        state_elements: u32,
    },
    /// A layer with nothing of its own.
    NoKv(NoKvReason),
}

impl LayerKind {
    /// `(kv_heads, k_head_dim, v_head_dim)` of a full, sliding or chunked-local layer; `None` otherwise.
    #[must_use]
    pub const fn attention_dims(&self) -> Option<(u32, u32, u32)> {
        match *self {
            LayerKind::Full { kv_heads, k_head_dim, v_head_dim }
            | LayerKind::Sliding { kv_heads, k_head_dim, v_head_dim, .. }
            | LayerKind::ChunkedLocal { kv_heads, k_head_dim, v_head_dim, .. } => {
                Some((kv_heads, k_head_dim, v_head_dim))
            }
            LayerKind::Mla { .. } | LayerKind::Recurrent { .. } | LayerKind::NoKv(_) => None,
        }
    }

    /// Elements one token occupies in one layer of this kind (0 for recurrent layers and layers without a
    /// cache), saturating at `u64::MAX`.
    #[must_use]
    pub const fn elements_per_token(&self) -> u64 {
        match (self.attention_dims(), *self) {
            (Some((heads, k, v)), _) => (heads as u64).saturating_mul(k as u64 + v as u64),
            (None, LayerKind::Mla { latent_dim }) => latent_dim as u64,
            (None, _) => 0,
        }
    }

    /// Bytes one token occupies in one layer of this kind stored as `dtype`: the K row and the V row each
    /// [`KvDtype::bytes_for`] their elements (whole 32-value blocks for `q8_0`/`q4_0`); the MLA latent one
    /// row. Saturates at `u64::MAX`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{KvDtype, LayerKind};
    /// let layer = LayerKind::Full { kv_heads: 8, k_head_dim: 128, v_head_dim: 128 };
    /// assert_eq!(layer.bytes_per_token(KvDtype::Bf16), 4096);
    /// assert_eq!(layer.bytes_per_token(KvDtype::Q8_0), 2 * 32 * 34); // two rows of 1024 values
    /// ```
    #[must_use]
    pub const fn bytes_per_token(&self, dtype: KvDtype) -> u64 {
        match (self.attention_dims(), *self) {
            (Some((heads, k, v)), _) => {
                let heads = heads as u64;
                dtype
                    .bytes_for(heads.saturating_mul(k as u64))
                    .saturating_add(dtype.bytes_for(heads.saturating_mul(v as u64)))
            }
            (None, LayerKind::Mla { latent_dim }) => dtype.bytes_for(latent_dim as u64),
            (None, _) => 0,
        }
    }

    /// Elements of one sequence's recurrent state (0 for layers without one).
    #[must_use]
    pub const fn state_elements(&self) -> u64 {
        match *self {
            LayerKind::Recurrent { state_elements, .. } => state_elements as u64,
            _ => 0,
        }
    }

    /// Tokens one layer of this kind needs for a sequence of `tokens` tokens: `min(tokens, window)` for a
    /// sliding layer, the tokens of the current chunk for a chunked-local one, `tokens` for full and MLA
    /// layers, 0 for recurrent layers and layers without a cache.
    #[must_use]
    pub const fn tokens_held(&self, tokens: u64) -> u64 {
        match *self {
            LayerKind::Sliding { window, .. } => {
                if tokens < window as u64 {
                    tokens
                } else {
                    window as u64
                }
            }
            LayerKind::ChunkedLocal { chunk, .. } => {
                if tokens == 0 || chunk == 0 {
                    tokens
                } else {
                    (tokens - 1) % chunk as u64 + 1
                }
            }
            LayerKind::Full { .. } | LayerKind::Mla { .. } => tokens,
            LayerKind::Recurrent { .. } | LayerKind::NoKv(_) => 0,
        }
    }

    /// The same layer treated as full attention (what the naive estimate, and vLLM without its hybrid
    /// manager, assume): a sliding or chunked-local layer keeps every token; other kinds are unchanged.
    #[must_use]
    pub const fn as_full(&self) -> LayerKind {
        match *self {
            LayerKind::Sliding { kv_heads, k_head_dim, v_head_dim, .. }
            | LayerKind::ChunkedLocal { kv_heads, k_head_dim, v_head_dim, .. } => {
                LayerKind::Full { kv_heads, k_head_dim, v_head_dim }
            }
            other => other,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let zero = |what| Err(ConfigError::Zero { what });
        if let Some((heads, k, v)) = self.attention_dims() {
            match (heads, k, v) {
                (0, _, _) => return zero("kv_heads"),
                (_, 0, _) => return zero("k_head_dim"),
                (_, _, 0) => return zero("v_head_dim"),
                _ => {}
            }
        }
        match *self {
            LayerKind::Sliding { window: 0, .. } => zero("sliding window"),
            LayerKind::ChunkedLocal { chunk: 0, .. } => zero("attention chunk"),
            LayerKind::Mla { latent_dim: 0 } => zero("MLA latent_dim"),
            LayerKind::Recurrent { state_elements: 0, .. } => zero("recurrent state"),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for LayerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            LayerKind::Full { kv_heads, k_head_dim, v_head_dim } => {
                write!(f, "full attention, {kv_heads} KV heads x (K {k_head_dim} + V {v_head_dim})")
            }
            LayerKind::Sliding { kv_heads, k_head_dim, v_head_dim, window } => {
                write!(f, "sliding window {window}, {kv_heads} KV heads x (K {k_head_dim} + V {v_head_dim})")
            }
            LayerKind::ChunkedLocal { kv_heads, k_head_dim, v_head_dim, chunk } => {
                write!(f, "chunked local {chunk}, {kv_heads} KV heads x (K {k_head_dim} + V {v_head_dim})")
            }
            LayerKind::Mla { latent_dim } => write!(f, "MLA latent, {latent_dim} per token"),
            LayerKind::Recurrent { kind, state_elements } => {
                write!(f, "{kind:?} state, {state_elements} per sequence")
            }
            LayerKind::NoKv(reason) => write!(f, "no cache of its own ({reason:?})"),
        }
    }
}

/// A run of `layers` layers of one [`LayerKind`] (not necessarily adjacent in the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerGroup {
    pub(crate) kind: LayerKind,
    pub(crate) layers: u32,
}

impl LayerGroup {
    /// How these layers store their cache.
    #[must_use]
    pub const fn kind(&self) -> LayerKind {
        self.kind
    }

    /// How many layers of the model are of this kind.
    #[must_use]
    pub const fn layers(&self) -> u32 {
        self.layers
    }
}
