//! [`ModelSpec`]: the KV-relevant shape of a model, and the byte counts derived from it.

use std::fmt;

use super::KvDtype;
use crate::ConfigError;

/// Why a layer holds no KV cache of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NoKvReason {
    /// Linear attention (Qwen3-Next's Gated DeltaNet): a fixed-size recurrent state, no per-token cache.
    LinearAttention,
    /// A Mamba / state-space layer (Jamba): a fixed-size state, no per-token cache.
    Mamba,
    /// The layer reads the KV cache of an earlier layer (Gemma's `num_kv_shared_layers`); vLLM gives it
    /// no cache of its own.
    SharedKv,
}

/// How one layer stores its KV cache.
///
/// Per token, a full or sliding layer stores `kv_heads * (k_head_dim + v_head_dim)` elements (a K and a V
/// vector per KV head); an MLA layer stores `latent_dim` elements (one compressed latent shared by all heads,
/// no factor of 2).
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
    /// Sliding-window attention: holds at most the last `window` tokens.
    Sliding {
        /// Key/value heads stored per token.
        kv_heads: u32,
        /// Elements of one key head.
        k_head_dim: u32,
        /// Elements of one value head.
        v_head_dim: u32,
        /// Tokens the layer attends to (and keeps).
        window: u32,
    },
    /// Multi-head latent attention (DeepSeek-V2/V3): one latent of `latent_dim` elements per token,
    /// `kv_lora_rank + qk_rope_head_dim`.
    Mla {
        /// Elements stored per token.
        latent_dim: u32,
    },
    /// A layer with no KV cache of its own.
    NoKv(NoKvReason),
}

impl LayerKind {
    /// `(kv_heads, k_head_dim, v_head_dim)` of a full or sliding layer; `None` for MLA and no-cache layers.
    #[must_use]
    pub const fn attention_dims(&self) -> Option<(u32, u32, u32)> {
        match *self {
            LayerKind::Full { kv_heads, k_head_dim, v_head_dim }
            | LayerKind::Sliding { kv_heads, k_head_dim, v_head_dim, .. } => Some((kv_heads, k_head_dim, v_head_dim)),
            LayerKind::Mla { .. } | LayerKind::NoKv(_) => None,
        }
    }

    /// Elements one token occupies in one layer of this kind (0 for [`LayerKind::NoKv`]), saturating at
    /// `u64::MAX`.
    #[must_use]
    pub const fn elements_per_token(&self) -> u64 {
        match (self.attention_dims(), *self) {
            (Some((heads, k, v)), _) => (heads as u64).saturating_mul(k as u64 + v as u64),
            (None, LayerKind::Mla { latent_dim }) => latent_dim as u64,
            (None, _) => 0,
        }
    }

    /// Tokens one layer of this kind holds for a sequence of `tokens` tokens: `min(tokens, window)` for a
    /// sliding layer, `tokens` for full and MLA layers, 0 for layers without a cache.
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
            LayerKind::Full { .. } | LayerKind::Mla { .. } => tokens,
            LayerKind::NoKv(_) => 0,
        }
    }

    /// The same layer treated as full attention (what the naive estimate assumes): a sliding layer loses its
    /// window; other kinds are unchanged.
    #[must_use]
    pub const fn as_full(&self) -> LayerKind {
        match *self {
            LayerKind::Sliding { kv_heads, k_head_dim, v_head_dim, .. } => {
                LayerKind::Full { kv_heads, k_head_dim, v_head_dim }
            }
            other => other,
        }
    }

    fn validate(&self) -> Result<(), ConfigError> {
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
            LayerKind::Mla { latent_dim: 0 } => zero("MLA latent_dim"),
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
            LayerKind::Mla { latent_dim } => write!(f, "MLA latent, {latent_dim} per token"),
            LayerKind::NoKv(reason) => write!(f, "no KV cache ({reason:?})"),
        }
    }
}

/// A run of `layers` layers of one [`LayerKind`] (not necessarily adjacent in the model).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerGroup {
    kind: LayerKind,
    layers: u32,
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

/// The KV-cache-relevant shape of a model: its layers grouped by how they store their cache.
///
/// Build one by hand with [`ModelSpec::builder`], from a Hugging Face `config.json` with
/// `ModelSpec::from_hf_config` (feature `hf-config`), or by name with [`ModelSpec::preset`]. Groups of
/// identical layers are merged, in order of first appearance, so the byte counts loop over a handful of
/// groups whatever the depth of the model; they neither allocate nor panic.
///
/// # Examples
///
/// ```
/// use kvgate::kv::{KvDtype, ModelSpec};
///
/// // Gemma 3 27B: 52 sliding-window layers (1024 tokens) and 10 global layers, 16 KV heads of 128.
/// let spec = ModelSpec::builder("gemma-3-27b")
///     .sliding(52, 16, 128, 1024)
///     .full(10, 16, 128)
///     .build()?;
/// // Per layer per token: 2 (K and V) x 16 heads x 128 x 2 bytes = 8192 bytes.
/// assert_eq!(spec.kv_bytes(32_768, KvDtype::Bf16), (10 * 32_768 + 52 * 1024) * 8192);
/// assert_eq!(spec.kv_bytes_naive(32_768, KvDtype::Bf16), 62 * 32_768 * 8192);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    name: String,
    groups: Vec<LayerGroup>,
    params: Option<u64>,
    active_params: Option<u64>,
}

impl ModelSpec {
    /// Starts a hand-built spec called `name`.
    #[must_use]
    pub fn builder(name: impl Into<String>) -> ModelSpecBuilder {
        ModelSpecBuilder { name: name.into(), groups: Vec::new(), params: None, active_params: None }
    }

    /// The model's name (a preset name, the `model_type` of a parsed config, or what the builder was given).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The layer groups, in order of first appearance; no two have the same kind.
    #[must_use]
    pub fn groups(&self) -> &[LayerGroup] {
        &self.groups
    }

    /// Total number of layers, including those without a cache.
    #[must_use]
    pub fn num_layers(&self) -> u32 {
        self.groups.iter().map(|g| g.layers).sum()
    }

    /// Layers of full attention.
    #[must_use]
    pub fn full_layers(&self) -> u32 {
        self.count(|k| matches!(k, LayerKind::Full { .. }))
    }

    /// Layers of sliding-window attention.
    #[must_use]
    pub fn sliding_layers(&self) -> u32 {
        self.count(|k| matches!(k, LayerKind::Sliding { .. }))
    }

    /// Layers of MLA latent cache.
    #[must_use]
    pub fn mla_layers(&self) -> u32 {
        self.count(|k| matches!(k, LayerKind::Mla { .. }))
    }

    /// Layers that hold no KV cache of their own.
    #[must_use]
    pub fn no_kv_layers(&self) -> u32 {
        self.count(|k| matches!(k, LayerKind::NoKv(_)))
    }

    fn count(&self, pred: impl Fn(&LayerKind) -> bool) -> u32 {
        self.groups.iter().filter(|g| pred(&g.kind)).map(|g| g.layers).sum()
    }

    /// The parameter count, when known (presets know it; parsed configs do not), for sizing weights.
    #[must_use]
    pub fn params(&self) -> Option<u64> {
        self.params
    }

    /// Parameters that take part in computing one token, when known: every parameter except the routed
    /// experts a token does not select. Embedding tables count, as the model cards of Mixtral ("12.9B
    /// active") and DeepSeek-V3 ("37B activated") count them; OpenAI's gpt-oss cards leave the input
    /// embedding out ("3.6B active" for gpt-oss-20b, which counts 4.19B here).
    ///
    /// For a dense model (or a spec built without [`ModelSpecBuilder::active_params`]) this is
    /// [`params`](Self::params). A decode step reads about this many weights; a token costs about twice this
    /// many FLOPs.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::ModelSpec;
    /// let mixtral = ModelSpec::preset("mixtral-8x7b")?;
    /// assert_eq!(mixtral.params(), Some(46_702_792_704));
    /// assert_eq!(mixtral.active_params(), Some(12_879_925_248)); // 2 of 8 experts per token
    /// let llama = ModelSpec::preset("llama-3.1-8b")?;
    /// assert_eq!(llama.active_params(), llama.params());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[must_use]
    pub fn active_params(&self) -> Option<u64> {
        self.active_params.or(self.params)
    }

    /// Bytes one sequence of `tokens` tokens holds across all layers, each layer exactly as many tokens as it
    /// keeps (a sliding layer `min(tokens, window)`), with no rounding to blocks.
    ///
    /// Saturates at `u64::MAX` instead of overflowing (only reachable with absurd token counts); below
    /// saturation, an `Fp8` count is exactly half a `Bf16` one.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{KvDtype, ModelSpec};
    /// let spec = ModelSpec::builder("m").full(32, 8, 128).build()?; // Llama 3.1 8B
    /// assert_eq!(spec.kv_bytes(1000, KvDtype::Bf16), 1000 * 131_072);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[must_use]
    pub fn kv_bytes(&self, tokens: u64, dtype: KvDtype) -> u64 {
        self.sum(dtype, |kind| kind.tokens_held(tokens))
    }

    /// Like [`kv_bytes`](Self::kv_bytes), with each layer's token count rounded up to whole blocks of
    /// `block_size` tokens: what vLLM's paged allocator holds for the sequence. A `block_size` of 0 is treated
    /// as 1. Saturates at `u64::MAX`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{KvDtype, ModelSpec};
    /// let spec = ModelSpec::builder("m").full(32, 8, 128).build()?;
    /// // 1000 tokens occupy 63 blocks of 16 = 1008 token slots.
    /// assert_eq!(spec.kv_bytes_paged(1000, KvDtype::Bf16, 16), 1008 * 131_072);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[must_use]
    pub fn kv_bytes_paged(&self, tokens: u64, dtype: KvDtype, block_size: u32) -> u64 {
        let block = u64::from(block_size.max(1));
        self.sum(dtype, |kind| kind.tokens_held(tokens).div_ceil(block).saturating_mul(block))
    }

    /// The widely shared estimate: every attention layer treated as full attention (sliding windows
    /// ignored), no block rounding. Always `>= kv_bytes`. Saturates at `u64::MAX`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{KvDtype, ModelSpec};
    /// let spec = ModelSpec::builder("m").sliding(32, 8, 128, 4096).build()?; // Mistral 7B v0.1
    /// assert_eq!(spec.kv_bytes(32_768, KvDtype::Bf16) * 8, spec.kv_bytes_naive(32_768, KvDtype::Bf16));
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[must_use]
    pub fn kv_bytes_naive(&self, tokens: u64, dtype: KvDtype) -> u64 {
        self.sum(dtype, |kind| kind.as_full().tokens_held(tokens))
    }

    /// Bytes each token adds while the sequence is shorter than every window: the sum over all layers that
    /// hold a cache. This is `kv_bytes(1, dtype)`, and the naive estimate's bytes per token.
    #[must_use]
    pub fn bytes_per_token(&self, dtype: KvDtype) -> u64 {
        self.sum(dtype, |kind| if matches!(kind, LayerKind::NoKv(_)) { 0 } else { 1 })
    }

    /// Bytes each token adds once the sequence is longer than every window: the sum over full-attention
    /// and MLA layers only.
    #[must_use]
    pub fn bytes_per_token_past_windows(&self, dtype: KvDtype) -> u64 {
        self.sum(dtype, |kind| u64::from(matches!(kind, LayerKind::Full { .. } | LayerKind::Mla { .. })))
    }

    /// Bytes of one block of `block_size` tokens across every layer holding a cache (`block_size` 0 counts
    /// as 1): for a model whose layers are all alike this is vLLM's page size times the number of layers,
    /// the unit its `available_memory // page_bytes` rule divides by.
    #[must_use]
    pub fn block_bytes(&self, dtype: KvDtype, block_size: u32) -> u64 {
        self.bytes_per_token(dtype).saturating_mul(u64::from(block_size.max(1)))
    }

    /// Sum over groups of `layers * tokens(kind) * elements_per_token(kind) * dtype bytes`, saturating.
    #[inline]
    fn sum(&self, dtype: KvDtype, tokens: impl Fn(&LayerKind) -> u64) -> u64 {
        self.groups.iter().fold(0u64, |acc, g| {
            let per_layer = g.kind.elements_per_token().saturating_mul(dtype.bytes());
            let bytes = per_layer.saturating_mul(u64::from(g.layers)).saturating_mul(tokens(&g.kind));
            acc.saturating_add(bytes)
        })
    }

    /// The share of this model one GPU holds under tensor parallelism of degree `tp`: KV heads of full and
    /// sliding layers are split across the GPUs (`kv_heads / tp` each; one head each, replicated, when `tp` is
    /// a multiple of `kv_heads`); an MLA latent is replicated on every GPU. These are vLLM's rules.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for `tp == 0`; [`ConfigError::Conflict`] when `tp` neither divides nor is a
    /// multiple of the KV heads of some layer group.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{KvDtype, ModelSpec};
    /// let spec = ModelSpec::preset("llama-3.1-70b")?;
    /// let shard = spec.tensor_parallel_shard(4)?;
    /// assert_eq!(shard.bytes_per_token(KvDtype::Bf16) * 4, spec.bytes_per_token(KvDtype::Bf16));
    /// assert!(spec.tensor_parallel_shard(3).is_err()); // 8 KV heads
    /// // 16 GPUs: one of the 8 heads on each, every head on two GPUs.
    /// assert_eq!(spec.tensor_parallel_shard(16)?.bytes_per_token(KvDtype::Bf16) * 8, spec.bytes_per_token(KvDtype::Bf16));
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn tensor_parallel_shard(&self, tp: u32) -> Result<ModelSpec, ConfigError> {
        if tp == 0 {
            return Err(ConfigError::Zero { what: "tensor-parallel degree" });
        }
        let mut shard = self.clone();
        for group in &mut shard.groups {
            let heads = match &mut group.kind {
                LayerKind::Full { kv_heads, .. } | LayerKind::Sliding { kv_heads, .. } => kv_heads,
                LayerKind::Mla { .. } | LayerKind::NoKv(_) => continue,
            };
            if *heads % tp == 0 {
                *heads /= tp;
            } else if tp % *heads == 0 {
                // More GPUs than KV heads: each GPU holds one head, replicated tp / heads times.
                *heads = 1;
            } else {
                return Err(ConfigError::Conflict(format!(
                    "tensor-parallel degree {tp} neither divides nor is a multiple of the {heads} KV heads of \
                     {}; use a degree that divides {heads} or a multiple of it",
                    self.name
                )));
            }
        }
        Ok(shard)
    }
}

/// Builds a [`ModelSpec`] layer group by layer group; see [`ModelSpec::builder`].
///
/// Groups of the same kind are merged. Nothing is checked until [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct ModelSpecBuilder {
    name: String,
    groups: Vec<LayerGroup>,
    params: Option<u64>,
    active_params: Option<u64>,
}

impl ModelSpecBuilder {
    /// Adds `layers` layers of any kind.
    #[must_use]
    pub fn group(mut self, layers: u32, kind: LayerKind) -> Self {
        match self.groups.iter_mut().find(|g| g.kind == kind) {
            Some(g) => g.layers = g.layers.saturating_add(layers),
            None => self.groups.push(LayerGroup { kind, layers }),
        }
        self
    }

    /// Adds `layers` full-attention layers with `kv_heads` heads of `head_dim` (keys and values alike).
    #[must_use]
    pub fn full(self, layers: u32, kv_heads: u32, head_dim: u32) -> Self {
        self.group(layers, LayerKind::Full { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim })
    }

    /// Adds `layers` sliding-window layers keeping the last `window` tokens.
    #[must_use]
    pub fn sliding(self, layers: u32, kv_heads: u32, head_dim: u32, window: u32) -> Self {
        self.group(layers, LayerKind::Sliding { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim, window })
    }

    /// Adds `layers` MLA layers storing `latent_dim` elements per token (`kv_lora_rank + qk_rope_head_dim`).
    #[must_use]
    pub fn mla(self, layers: u32, latent_dim: u32) -> Self {
        self.group(layers, LayerKind::Mla { latent_dim })
    }

    /// Adds `layers` layers without a KV cache of their own.
    #[must_use]
    pub fn no_kv(self, layers: u32, reason: NoKvReason) -> Self {
        self.group(layers, LayerKind::NoKv(reason))
    }

    /// Records the parameter count, for sizing weights in a [`GpuPlan`](crate::kv::GpuPlan).
    #[must_use]
    pub fn params(mut self, params: u64) -> Self {
        self.params = Some(params);
        self
    }

    /// Records the parameters used per token of a mixture-of-experts model (see
    /// [`ModelSpec::active_params`]); must not exceed [`params`](Self::params) when both are set.
    #[must_use]
    pub fn active_params(mut self, active_params: u64) -> Self {
        self.active_params = Some(active_params);
        self
    }

    /// Checks and builds the spec.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] when the spec has no layer holding a KV cache, or a group has zero layers,
    /// heads, head size or window; [`ConfigError::Conflict`] when the active parameters exceed the
    /// parameters; [`ConfigError::OutOfRange`] when one token's bytes across all layers at
    /// 4 bytes per element would not fit in a `u64` (absurd sizes are refused here, so that byte counts only
    /// saturate for absurd token counts).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{ConfigError, kv::ModelSpec};
    /// assert!(matches!(ModelSpec::builder("m").full(32, 0, 128).build(), Err(ConfigError::Zero { .. })));
    /// ```
    pub fn build(self) -> Result<ModelSpec, ConfigError> {
        let mut per_token: u64 = 0;
        for g in &self.groups {
            if g.layers == 0 {
                return Err(ConfigError::Zero { what: "layers in a group" });
            }
            g.kind.validate()?;
            // A saturated element count (u64::MAX) fails the first multiplication, so overflow is caught.
            let bytes = g
                .kind
                .elements_per_token()
                .checked_mul(KvDtype::F32.bytes())
                .and_then(|b| b.checked_mul(u64::from(g.layers)));
            per_token = bytes.and_then(|b| per_token.checked_add(b)).ok_or_else(|| ConfigError::OutOfRange {
                what: "model size",
                reason: format!(
                    "{}: one token's KV bytes across all layers overflow u64; check heads, head sizes and layers",
                    self.name
                ),
            })?;
        }
        if per_token == 0 {
            return Err(ConfigError::Zero { what: "layers holding a KV cache" });
        }
        if let (Some(total), Some(active)) = (self.params, self.active_params) {
            if active > total {
                return Err(ConfigError::Conflict(format!(
                    "{}: {active} active parameters exceed the {total} parameters of the model",
                    self.name
                )));
            }
        }
        Ok(ModelSpec { name: self.name, groups: self.groups, params: self.params, active_params: self.active_params })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_merge_and_count() {
        let spec = ModelSpec::builder("x")
            .sliding(5, 8, 64, 128)
            .full(1, 8, 64)
            .sliding(5, 8, 64, 128)
            .no_kv(2, NoKvReason::Mamba)
            .build()
            .unwrap();
        assert_eq!(spec.groups().len(), 3);
        assert_eq!((spec.sliding_layers(), spec.full_layers(), spec.no_kv_layers()), (10, 1, 2));
        assert_eq!(spec.num_layers(), 13);
    }

    #[test]
    fn absurd_sizes_are_refused_and_bytes_saturate() {
        let too_big = ModelSpec::builder("x").full(u32::MAX, u32::MAX, u32::MAX).build();
        assert!(matches!(too_big, Err(ConfigError::OutOfRange { .. })));
        let spec = ModelSpec::builder("x").full(1, 1, 1).build().unwrap();
        assert_eq!(spec.kv_bytes(u64::MAX, KvDtype::F32), u64::MAX);
        assert_eq!(spec.kv_bytes_paged(u64::MAX, KvDtype::Fp8, 16), u64::MAX);
        assert_eq!(spec.kv_bytes_paged(10, KvDtype::Fp8, 0), 20);
        assert!(matches!(ModelSpec::builder("x").no_kv(3, NoKvReason::Mamba).build(), Err(ConfigError::Zero { .. })));
    }

    #[test]
    fn mla_has_no_factor_two() {
        let spec = ModelSpec::builder("dsv3").mla(61, 576).build().unwrap();
        assert_eq!(spec.bytes_per_token(KvDtype::Bf16), 61 * 576 * 2);
        assert_eq!(spec.tensor_parallel_shard(8).unwrap(), spec);
    }
}
