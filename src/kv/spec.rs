//! [`ModelSpec`]: the KV-relevant shape of a model, and the byte counts derived from it.

use super::{Engine, KvDtype, KvLayout, LayerGroup, LayerKind, NoKvReason, RecurrentKind};
use crate::ConfigError;

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

    /// Layers of chunked local attention.
    #[must_use]
    pub fn chunked_layers(&self) -> u32 {
        self.count(|k| matches!(k, LayerKind::ChunkedLocal { .. }))
    }

    /// Layers with a recurrent state (Mamba, Gated DeltaNet) instead of a per-token cache.
    #[must_use]
    pub fn recurrent_layers(&self) -> u32 {
        self.count(|k| matches!(k, LayerKind::Recurrent { .. }))
    }

    /// Layers that hold nothing of their own (they read another layer's cache).
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

    /// How `engine` lays out this model's cache with `dtype` and a requested `block_size` (vLLM's
    /// `--block-size`; 0 counts as 1; llama.cpp ignores it): groups, block sizes, the bytes of a block id.
    /// Build it once to price many sequences without allocating.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Conflict`] when vLLM could not lay the model out: its page sizes cannot be unified
    /// (the largest is not a multiple of a smaller one; vLLM raises `NotImplementedError`).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{Engine, KvDtype, ModelSpec};
    ///
    /// // Qwen3-Next: Gated DeltaNet state pages of 1,097,728 bytes raise the attention block to 544 tokens.
    /// let layout = ModelSpec::preset("qwen3-next-80b-a3b")?.kv_layout(KvDtype::Bf16, 16, Engine::Vllm)?;
    /// assert_eq!(layout.block_size(), 544);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn kv_layout(&self, dtype: KvDtype, block_size: u32, engine: Engine) -> Result<KvLayout, ConfigError> {
        KvLayout::new(self, dtype, block_size, engine)
    }

    /// Bytes one sequence of `tokens` tokens holds at steady decode under `engine`'s allocator, with a cache
    /// of `dtype` in blocks of `block_size` tokens: [`KvLayout::sequence_bytes`] of
    /// [`kv_layout`](Self::kv_layout). Unlike [`kv_bytes_paged`](Self::kv_bytes_paged) this follows every
    /// rule of the engine — layer groups and their padding, page-size unification, sliding blocks freed only
    /// when wholly outside the window, recurrent state as whole pages — listed in the [module
    /// docs](crate::kv#vllms-v1-allocator-rule-by-rule).
    ///
    /// Builds the layout on each call; keep a [`KvLayout`] (or a [`GpuPlan`](crate::kv::GpuPlan)) to price
    /// many sequences. `u64::MAX` (never fits) when the engine cannot lay the model out. Saturates at
    /// `u64::MAX`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{Engine, KvDtype, ModelSpec};
    ///
    /// let gemma = ModelSpec::preset("gemma-3-27b")?;
    /// // 10 full + 52 sliding layers in groups of 10 (the last sliding group padded): 3.19 GB, not 3.12.
    /// assert_eq!(gemma.sequence_bytes(32_768, KvDtype::Bf16, 16, Engine::Vllm), 3_187_671_040);
    /// assert_eq!(gemma.kv_bytes_paged(32_768, KvDtype::Bf16, 16), 3_120_562_176);
    /// // With the hybrid manager off every layer keeps every token.
    /// assert_eq!(gemma.sequence_bytes(32_768, KvDtype::Bf16, 16, Engine::VllmUniform), 62 * 32_768 * 8192);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[must_use]
    pub fn sequence_bytes(&self, tokens: u64, dtype: KvDtype, block_size: u32, engine: Engine) -> u64 {
        self.kv_layout(dtype, block_size, engine).map_or(u64::MAX, |layout| layout.sequence_bytes(tokens))
    }

    /// The most bytes one sequence holds at steady decode while it grows to `tokens` tokens under `engine`
    /// ([`KvLayout::max_sequence_bytes`]): what an admission reserves. Monotone in `tokens`; at least
    /// [`sequence_bytes`](Self::sequence_bytes) at every length up to `tokens`. `u64::MAX` when the engine
    /// cannot lay the model out.
    #[must_use]
    pub fn max_sequence_bytes(&self, tokens: u64, dtype: KvDtype, block_size: u32, engine: Engine) -> u64 {
        self.kv_layout(dtype, block_size, engine).map_or(u64::MAX, |layout| layout.max_sequence_bytes(tokens))
    }

    /// Bytes each token adds while the sequence is shorter than every window: the sum over all layers that
    /// hold a cache. This is `kv_bytes(1, dtype)`, and the naive estimate's bytes per token.
    #[must_use]
    pub fn bytes_per_token(&self, dtype: KvDtype) -> u64 {
        self.sum(dtype, |_| 1)
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

    /// Sum over groups of `layers * tokens(kind) * bytes_per_token(kind)`, saturating.
    #[inline]
    fn sum(&self, dtype: KvDtype, tokens: impl Fn(&LayerKind) -> u64) -> u64 {
        self.groups.iter().fold(0u64, |acc, g| {
            let per_layer = g.kind.bytes_per_token(dtype);
            let bytes = per_layer.saturating_mul(u64::from(g.layers)).saturating_mul(tokens(&g.kind));
            acc.saturating_add(bytes)
        })
    }

    /// The share of this model one GPU holds under tensor parallelism of degree `tp`: KV heads of full and
    /// sliding layers are split across the GPUs (`kv_heads / tp` each; one head each, replicated, when `tp` is
    /// a multiple of `kv_heads`); an MLA latent is replicated on every GPU; a recurrent state is split
    /// across the GPUs (`state / tp`, rounded up). These are vLLM's rules (it shards a Mamba layer's heads and
    /// convolution channels; group replication when `tp` exceeds a Mamba2 layer's groups is not modelled).
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
                LayerKind::Full { kv_heads, .. }
                | LayerKind::Sliding { kv_heads, .. }
                | LayerKind::ChunkedLocal { kv_heads, .. } => kv_heads,
                LayerKind::Recurrent { state_elements, .. } => {
                    *state_elements = state_elements.div_ceil(tp);
                    continue;
                }
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

    /// Adds `layers` chunked-local-attention layers (Llama 4) with chunks of `chunk` tokens.
    #[must_use]
    pub fn chunked_local(self, layers: u32, kv_heads: u32, head_dim: u32, chunk: u32) -> Self {
        self.group(layers, LayerKind::ChunkedLocal { kv_heads, k_head_dim: head_dim, v_head_dim: head_dim, chunk })
    }

    /// Adds `layers` recurrent layers, each holding a state of `state_elements` elements per sequence.
    #[must_use]
    pub fn recurrent(self, layers: u32, kind: RecurrentKind, state_elements: u32) -> Self {
        self.group(layers, LayerKind::Recurrent { kind, state_elements })
    }

    /// Adds `layers` MLA layers storing `latent_dim` elements per token (`kv_lora_rank + qk_rope_head_dim`).
    #[must_use]
    pub fn mla(self, layers: u32, latent_dim: u32) -> Self {
        self.group(layers, LayerKind::Mla { latent_dim })
    }

    /// Adds `layers` layers that hold nothing of their own.
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
    /// [`ConfigError::Zero`] when the spec has no layer holding a KV cache or a state, or a group has zero
    /// layers, heads, head size, window, chunk or state; [`ConfigError::Conflict`] when the active parameters exceed the
    /// parameters; [`ConfigError::OutOfRange`] when one token's bytes across all layers at
    /// 4 bytes per element (or one sequence's states at 4 bytes per element) would not fit in a `u64`
    /// (absurd sizes are refused here, so that byte counts only saturate for absurd token counts).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{ConfigError, kv::ModelSpec};
    /// assert!(matches!(ModelSpec::builder("m").full(32, 0, 128).build(), Err(ConfigError::Zero { .. })));
    /// ```
    pub fn build(self) -> Result<ModelSpec, ConfigError> {
        let mut per_token: u64 = 0;
        let mut state: u64 = 0;
        let too_big = || ConfigError::OutOfRange {
            what: "model size",
            reason: format!(
                "{}: one token's KV bytes (or one sequence's state) across all layers overflow u64; check heads, \
                 head sizes, state sizes and layers",
                self.name
            ),
        };
        for g in &self.groups {
            if g.layers == 0 {
                return Err(ConfigError::Zero { what: "layers in a group" });
            }
            g.kind.validate()?;
            // A saturated element count (u64::MAX) fails the first multiplication, so overflow is caught.
            let layers = u64::from(g.layers);
            let bytes = g.kind.elements_per_token().checked_mul(4).and_then(|b| b.checked_mul(layers));
            per_token = bytes.and_then(|b| per_token.checked_add(b)).ok_or_else(too_big)?;
            let states = g.kind.state_elements().checked_mul(4).and_then(|b| b.checked_mul(layers));
            state = states.and_then(|b| state.checked_add(b)).ok_or_else(too_big)?;
        }
        if per_token == 0 && state == 0 {
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
            .no_kv(2, NoKvReason::SharedKv)
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
        assert!(matches!(
            ModelSpec::builder("x").no_kv(3, NoKvReason::SharedKv).build(),
            Err(ConfigError::Zero { .. })
        ));
        // A state-only model (pure Mamba) is accepted: it holds a state per sequence.
        assert!(ModelSpec::builder("x").recurrent(3, RecurrentKind::Mamba, 100).build().is_ok());
    }

    #[test]
    fn mla_has_no_factor_two() {
        let spec = ModelSpec::builder("dsv3").mla(61, 576).build().unwrap();
        assert_eq!(spec.bytes_per_token(KvDtype::Bf16), 61 * 576 * 2);
        assert_eq!(spec.tensor_parallel_shard(8).unwrap(), spec);
    }
}
