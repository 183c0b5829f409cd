//! [`KvLayout`]: how one engine's allocator lays out one model's cache — which layers share a block id,
//! how many tokens a block holds for each kind of layer, what one block id costs — and, from that, the
//! bytes a sequence holds.
//!
//! # Invariants
//!
//! - A layout is computed once ([`ModelSpec::kv_layout`]) and then prices sequences without allocating
//!   and without panicking: every count saturates at `u64::MAX`, every division is by a non-zero number.
//! - vLLM: a sequence holds `Σ_types groups_t × held_t(tokens)` block ids and each id costs
//!   [`KvLayout::block_bytes`]; the pool holds `pool // block_bytes` ids, one of them the null block.
//! - llama.cpp: a sequence holds one slot, whatever its length (one longer than a slot never fits: its
//!   price is `u64::MAX`); a slot costs [`KvLayout::block_bytes`].
//! - [`KvLayout::max_sequence_bytes`] is monotone in the token count and never below
//!   [`KvLayout::sequence_bytes`] at any smaller count: it is what an admission reserves for a request that
//!   may grow to that many tokens.

use super::engine::{LLAMA_CPP_PAD, LLAMA_CPP_UBATCH};
use super::{Engine, KvDtype, LayerKind, ModelSpec};
use crate::ConfigError;

/// Bytes of one element of a recurrent state: vLLM keeps Mamba / linear-attention state in the model's
/// dtype (bf16 for every preset; an fp8 KV cache does not shrink it — `MambaStateDtypeCalculator` in
/// `model_executor/layers/mamba/mamba_utils.py`), llama.cpp in f32 (its recurrent memory's `type_r` /
/// `type_s`).
const VLLM_STATE_BYTES: u64 = 2;
const LLAMA_CPP_STATE_BYTES: u64 = 4;

/// "Holds one block for the whole sequence": the block size vLLM gives a Mamba group (`mamba_block_size =
/// max_model_len`, `MambaModelConfig.verify_and_update_config`), for any sequence the engine accepts.
const WHOLE_SEQUENCE: u64 = u64::MAX;

/// Which tokens a group of layers keeps, and so which blocks vLLM frees while a sequence grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupPolicy {
    /// Every token (full attention, MLA).
    Full,
    /// The last `window` tokens: a block is freed once it lies wholly outside the window.
    Sliding {
        /// Tokens attended to.
        window: u32,
    },
    /// The tokens of the current chunk: blocks of earlier chunks are freed.
    Chunked {
        /// Tokens per chunk.
        chunk: u32,
    },
    /// One page per sequence (Mamba / linear-attention state).
    State,
}

/// One kind of cache in a [`KvLayout`]: layers with the same [`GroupPolicy`] and page, stored as `groups`
/// of the engine's allocation groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheGroup {
    policy: GroupPolicy,
    layers: u32,
    groups: u32,
    block_tokens: u64,
}

impl CacheGroup {
    /// Which tokens these layers keep.
    #[must_use]
    pub const fn policy(&self) -> GroupPolicy {
        self.policy
    }

    /// Layers of the model of this kind (padding not counted).
    #[must_use]
    pub const fn layers(&self) -> u32 {
        self.layers
    }

    /// vLLM: the allocation groups these layers fill (`cdiv(layers, group_size)`; the last one padded when
    /// the division is not exact). llama.cpp: 1.
    #[must_use]
    pub const fn groups(&self) -> u32 {
        self.groups
    }

    /// vLLM: tokens per block of these layers (`u64::MAX` for a state: one block for the whole sequence).
    /// llama.cpp: cells each slot holds in these layers.
    #[must_use]
    pub const fn block_tokens(&self) -> u64 {
        self.block_tokens
    }

    /// Blocks one group of this kind holds for a sequence with `tokens` token slots at steady decode
    /// (`tokens − 1` computed): `remove_skipped_blocks` has freed `skipped // block_size` blocks.
    fn held(&self, tokens: u64) -> u64 {
        let b = self.block_tokens;
        if tokens == 0 {
            return 0;
        }
        match self.policy {
            GroupPolicy::State => 1,
            GroupPolicy::Full => tokens.div_ceil(b),
            // skipped = max(0, computed − window + 1) with computed = tokens − 1.
            GroupPolicy::Sliding { window } => tokens.div_ceil(b) - tokens.saturating_sub(u64::from(window)) / b,
            // skipped = (computed // chunk) × chunk.
            GroupPolicy::Chunked { chunk } => {
                let chunk = u64::from(chunk);
                tokens.div_ceil(b) - ((tokens - 1) / chunk).saturating_mul(chunk) / b
            }
        }
    }

    /// The most blocks one group of this kind holds at steady decode for any length from 1 to `tokens`.
    fn peak(&self, tokens: u64) -> u64 {
        let b = self.block_tokens;
        if tokens == 0 {
            return 0;
        }
        match self.policy {
            GroupPolicy::State => 1,
            GroupPolicy::Full => tokens.div_ceil(b),
            // Past the window, held(W + k) = cdiv(W + k mod b, b): at most cdiv(W + b − 1, b), reached once
            // k mod b = b − 1; before it, cdiv(N, b) grows with N.
            GroupPolicy::Sliding { window } => tokens.min(u64::from(window).saturating_add(b - 1)).div_ceil(b),
            GroupPolicy::Chunked { chunk } => chunked_peak(u64::from(chunk), b, tokens),
        }
    }

    /// An upper bound of the blocks one group holds while a prompt of `prompt` tokens is prefilled in chunks
    /// of at most `chunk` tokens (`chunk ≥ 1`), whatever the schedule. A chunk computing tokens `s..e`
    /// (`e − s ≤ chunk`) holds the blocks from the first one not skipped at `s` computed tokens to
    /// `cdiv(e, b)`: sliding layers skip `max(0, s − window + 1)` tokens, chunked layers `(s // size) ×
    /// size`, so at most `window − 1 + chunk` (or `size − 1 + chunk`) tokens, which may start anywhere in a
    /// block: one block more than they fill.
    fn prefill_peak(&self, prompt: u64, chunk: u64) -> u64 {
        let all = prompt.div_ceil(self.block_tokens);
        let span = |kept: u32| {
            let tokens = u64::from(kept).saturating_sub(1).saturating_add(chunk).min(prompt);
            tokens.div_ceil(self.block_tokens).saturating_add(1).min(all)
        };
        match self.policy {
            GroupPolicy::Full | GroupPolicy::State => self.held(prompt),
            GroupPolicy::Sliding { window } => span(window),
            GroupPolicy::Chunked { chunk: size } => span(size),
        }
    }

    /// Blocks of one group lying wholly inside a shared prefix of `prefix` tokens that a sequence still holds
    /// right after its prefill (the most it ever holds of them; later, sliding and chunked layers free them).
    fn shared(&self, prefix: u64) -> u64 {
        let b = self.block_tokens;
        if b == WHOLE_SEQUENCE {
            return 0; // a state is the sequence's own
        }
        let whole = prefix / b;
        match self.policy {
            GroupPolicy::State => 0,
            GroupPolicy::Full => whole,
            GroupPolicy::Sliding { .. } | GroupPolicy::Chunked { .. } => {
                whole.saturating_sub(prefix.div_ceil(b) - self.held(prefix))
            }
        }
    }
}

/// Peak of `cdiv(N, b) − floor(floor((N − 1) / C) × C / b)` over `1 ≤ N ≤ tokens`. Within chunk `q`
/// (`qC < N ≤ (q + 1)C`) the value grows with `N`, so each chunk peaks at its last token (or at `tokens`).
fn chunked_peak(chunk: u64, b: u64, tokens: u64) -> u64 {
    if chunk % b == 0 {
        // Chunks start on block boundaries: a chunk holds cdiv(tokens in it, b) blocks.
        return tokens.min(chunk).div_ceil(b);
    }
    let last = (tokens - 1) / chunk;
    let value = |q: u64| {
        let start = q.saturating_mul(chunk);
        let end = tokens.min(start.saturating_add(chunk));
        end.div_ceil(b) - start / b
    };
    // The value of a whole chunk depends on qC mod b, which repeats every b / gcd(C, b) chunks.
    let period = b / gcd(chunk, b);
    const MAX_STEPS: u64 = 4096;
    if last.min(period) > MAX_STEPS {
        // An upper bound instead of a long loop: a whole chunk never spans more than cdiv(C + b − g, b).
        return chunk.saturating_add(b - gcd(chunk, b)).div_ceil(b).min(tokens.div_ceil(b));
    }
    (0..last.min(period)).map(value).fold(value(last), u64::max)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The least common multiple of the attention groups' block sizes (states have no token blocks):
/// `u64::MAX` when it does not fit, so that no cache hit is assumed.
fn hit_align(types: &[CacheGroup]) -> u64 {
    types
        .iter()
        .map(|t| t.block_tokens)
        .filter(|&b| b != WHOLE_SEQUENCE)
        .fold(1u64, |acc, b| (acc / gcd(acc, b)).saturating_mul(b))
}

/// How an engine lays out one model's cache; built by [`ModelSpec::kv_layout`].
///
/// Prices sequences without allocating (an admission can keep one and call it per request).
///
/// # Examples
///
/// ```
/// use kvgate::kv::{Engine, GroupPolicy, KvDtype, ModelSpec};
///
/// // Gemma 3 27B: 52 sliding layers and 10 full ones, one page size. vLLM groups them by 10: one full
/// // group and six sliding groups (the last padded with 8 empty layers); a block id costs 10 pages.
/// let layout = ModelSpec::preset("gemma-3-27b")?.kv_layout(KvDtype::Bf16, 16, Engine::Vllm)?;
/// assert_eq!(layout.group_size(), 10);
/// assert_eq!(layout.block_bytes(), 10 * 16 * 8192);
/// let groups: Vec<_> = layout.groups().iter().map(|g| (g.policy(), g.groups())).collect();
/// assert_eq!(groups, [(GroupPolicy::Sliding { window: 1024 }, 6), (GroupPolicy::Full, 1)]);
/// // At 32k tokens: 2048 full blocks + 6 x 64 sliding blocks.
/// assert_eq!(layout.sequence_bytes(32_768), (2048 + 6 * 64) * 10 * 16 * 8192);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    engine: Engine,
    dtype: KvDtype,
    block_size: u32,
    group_size: u32,
    block_bytes: u64,
    types: Vec<CacheGroup>,
    /// vLLM: tokens a cache hit is a multiple of (see [`KvLayout::cache_hit_tokens`]).
    hit_align: u64,
}

/// One cache type while a vLLM layout is being built.
struct Type {
    kind: LayerKind,
    layers: u64,
    /// Bytes per token of one layer (attention) or of one sequence's state (recurrent).
    unit: u64,
    page: u64,
    block: u64,
}

impl Type {
    fn is_state(&self) -> bool {
        matches!(self.kind, LayerKind::Recurrent { .. })
    }

    fn policy(&self) -> GroupPolicy {
        match self.kind {
            LayerKind::Sliding { window, .. } => GroupPolicy::Sliding { window },
            LayerKind::ChunkedLocal { chunk, .. } => GroupPolicy::Chunked { chunk },
            LayerKind::Recurrent { .. } => GroupPolicy::State,
            LayerKind::Full { .. } | LayerKind::Mla { .. } | LayerKind::NoKv(_) => GroupPolicy::Full,
        }
    }
}

impl KvLayout {
    /// Builds the layout of `spec` (one GPU's share of the model) under `engine`; see
    /// [`ModelSpec::kv_layout`].
    pub(crate) fn new(spec: &ModelSpec, dtype: KvDtype, block_size: u32, engine: Engine) -> Result<Self, ConfigError> {
        match engine {
            Engine::LlamaCpp { .. } => Ok(Self::llama_cpp(spec, dtype, engine)),
            Engine::Vllm | Engine::VllmUniform => Self::vllm(spec, dtype, block_size, engine),
        }
    }

    fn vllm(spec: &ModelSpec, dtype: KvDtype, block_size: u32, engine: Engine) -> Result<Self, ConfigError> {
        // Layer specs (`Attention.get_kv_cache_spec`, `MambaBase.get_kv_cache_spec`); layers sharing another
        // layer's cache get none. With the hybrid manager off, `unify_hybrid_kv_cache_specs` turns sliding and
        // chunked layers into full attention.
        let mut types: Vec<Type> = Vec::new();
        for g in spec.groups() {
            let kind = match g.kind() {
                LayerKind::NoKv(_) => continue,
                kind if engine == Engine::VllmUniform => kind.as_full(),
                kind => kind,
            };
            let unit = match kind {
                LayerKind::Recurrent { .. } => kind.state_elements().saturating_mul(VLLM_STATE_BYTES),
                _ => kind.bytes_per_token(dtype),
            };
            match types.iter_mut().find(|t| t.kind == kind) {
                Some(t) => t.layers += u64::from(g.layers()),
                None => types.push(Type { kind, layers: u64::from(g.layers()), unit, page: 0, block: 0 }),
            }
        }
        if types.is_empty() {
            return Err(ConfigError::Zero { what: "layers holding a KV cache" });
        }

        // Attention + Mamba (`HybridAttentionMambaModelConfig.verify_and_update_config`,
        // `model_executor/models/config.py`): the attention block grows to the smallest multiple of the
        // kernel alignment (16; 64 for MLA) whose page holds one state, and the state page is padded to it.
        let mut block = u64::from(block_size.max(1));
        let state_unit = types.iter().filter(|t| t.is_state()).map(|t| t.unit).max();
        let attention = types.iter().find(|t| !t.is_state()).map(|t| (t.unit, matches!(t.kind, LayerKind::Mla { .. })));
        let state_page = match (state_unit, attention) {
            (Some(state), Some((per_token, mla))) => {
                let align: u64 = if mla { 64 } else { 16 };
                let needed = align.saturating_mul(state.div_ceil(align.saturating_mul(per_token).max(1)));
                block = block.max(needed);
                block.saturating_mul(per_token).max(state)
            }
            (Some(state), None) => state,
            (None, _) => 0,
        };
        for t in &mut types {
            if t.is_state() {
                (t.page, t.block) = (state_page, WHOLE_SEQUENCE);
            } else {
                (t.page, t.block) = (block.saturating_mul(t.unit), block);
            }
        }
        let block_size = u32::try_from(block).unwrap_or(u32::MAX);
        let layout = |group_size: u64, block_bytes: u64, types: Vec<CacheGroup>| KvLayout {
            engine,
            dtype,
            block_size,
            group_size: u32::try_from(group_size).unwrap_or(u32::MAX),
            block_bytes,
            hit_align: hit_align(&types),
            types,
        };
        let to_u32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);

        // One spec for every layer (`is_kv_cache_spec_uniform`), or one type of spec needing the same token
        // slots in every layer (`UniformTypeKVCacheSpecs.is_uniform_type`): a single group, each block id
        // costing one page of every layer (`get_kv_cache_config_from_groups`).
        let first = &types[0];
        let one_type = types.iter().all(|t| t.policy() == first.policy() && t.block == first.block);
        if one_type {
            let layers: u64 = types.iter().map(|t| t.layers).sum();
            let block_bytes = types.iter().fold(0u64, |acc, t| acc.saturating_add(t.page.saturating_mul(t.layers)));
            let group =
                CacheGroup { policy: first.policy(), layers: to_u32(layers), groups: 1, block_tokens: first.block };
            return Ok(layout(layers, block_bytes, vec![group]));
        }

        // Several types: `unify_kv_cache_spec_page_size` raises the block size of smaller pages to the largest
        // page (which must be a multiple of each), then `_get_kv_cache_groups_uniform_page_size` splits every
        // type into groups of `group_size` layers, padding the last.
        let max_page = types.iter().map(|t| t.page).max().unwrap_or(1).max(1);
        for t in &mut types {
            if t.page == 0 || max_page % t.page != 0 {
                return Err(ConfigError::Conflict(format!(
                    "{}: vLLM cannot unify page sizes of {} and {max_page} bytes ({}); it refuses this model with \
                     this cache dtype and block size",
                    spec.name(),
                    t.page,
                    t.kind
                )));
            }
            if t.block != WHOLE_SEQUENCE {
                t.block = t.block.saturating_mul(max_page / t.page);
            }
            t.page = max_page;
        }
        let min_layers = types.iter().map(|t| t.layers).min().unwrap_or(1);
        let max_layers = types.iter().map(|t| t.layers).max().unwrap_or(1);
        // The smallest type count, or the largest when it is less than 1.5 times the smallest.
        let group_size =
            if max_layers.saturating_mul(2) < min_layers.saturating_mul(3) { max_layers } else { min_layers };
        let groups = types
            .iter()
            .map(|t| CacheGroup {
                policy: t.policy(),
                layers: to_u32(t.layers),
                groups: to_u32(t.layers.div_ceil(group_size)),
                block_tokens: t.block,
            })
            .collect();
        Ok(layout(group_size, group_size.saturating_mul(max_page), groups))
    }

    /// llama.cpp: every slot holds `slot_tokens` cells in every full-attention and MLA layer (MLA: the latent
    /// only, no V cache — `llama_kv_cache` allocates V only when `!is_mla`), and
    /// `pad256(min(slot_tokens, window + n_ubatch))` cells in every sliding-window or chunked layer
    /// (`llama_kv_cache_iswa`, with the default `n_ubatch` of 512 and per-slot streams); recurrent layers
    /// keep one f32 state per slot.
    fn llama_cpp(spec: &ModelSpec, dtype: KvDtype, engine: Engine) -> Self {
        let slot = engine.slot_tokens().unwrap_or(0);
        let mut types: Vec<CacheGroup> = Vec::new();
        let mut slot_bytes: u64 = 0;
        for g in spec.groups() {
            let kind = g.kind();
            let (policy, cells) = match kind {
                LayerKind::NoKv(_) => continue,
                LayerKind::Recurrent { .. } => (GroupPolicy::State, 1),
                LayerKind::Sliding { window, .. } => {
                    (GroupPolicy::Sliding { window }, swa_cells(slot, u64::from(window)))
                }
                LayerKind::ChunkedLocal { chunk, .. } => {
                    (GroupPolicy::Chunked { chunk }, swa_cells(slot, u64::from(chunk)))
                }
                LayerKind::Full { .. } | LayerKind::Mla { .. } => (GroupPolicy::Full, slot),
            };
            let per_cell = match kind {
                LayerKind::Recurrent { .. } => kind.state_elements().saturating_mul(LLAMA_CPP_STATE_BYTES),
                _ => kind.bytes_per_token(dtype),
            };
            slot_bytes =
                slot_bytes.saturating_add(per_cell.saturating_mul(cells).saturating_mul(u64::from(g.layers())));
            match types.iter_mut().find(|t| t.policy == policy && t.block_tokens == cells) {
                Some(t) => t.layers = t.layers.saturating_add(g.layers()),
                None => types.push(CacheGroup { policy, layers: g.layers(), groups: 1, block_tokens: cells }),
            }
        }
        KvLayout { engine, dtype, block_size: 0, group_size: 1, block_bytes: slot_bytes, types, hit_align: 1 }
    }

    /// The engine laid out for.
    #[must_use]
    pub const fn engine(&self) -> Engine {
        self.engine
    }

    /// Element type of the cache.
    #[must_use]
    pub const fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// vLLM: the attention block size in effect, in tokens — the one asked for, raised when Mamba /
    /// linear-attention state needs bigger pages (Qwen3-Next: 544). Layers whose pages were smaller than the
    /// largest hold more tokens per block ([`CacheGroup::block_tokens`]). 0 for llama.cpp.
    #[must_use]
    pub const fn block_size(&self) -> u32 {
        self.block_size
    }

    /// vLLM: layers that share one block id (one tensor per position in a group). llama.cpp: 1.
    #[must_use]
    pub const fn group_size(&self) -> u32 {
        self.group_size
    }

    /// vLLM: bytes one block id costs on one GPU (`group_size × page`, or a page of every layer when all
    /// layers form one group). llama.cpp: bytes of one slot.
    #[must_use]
    pub const fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// The cache types and their groups, in order of first appearance in the model.
    #[must_use]
    pub fn groups(&self) -> &[CacheGroup] {
        &self.types
    }

    /// vLLM's KV-cache groups: `Σ groups` (what the "GPU KV cache size" log divides the blocks by).
    #[must_use]
    pub fn num_groups(&self) -> u64 {
        self.types.iter().map(|t| u64::from(t.groups)).sum()
    }

    /// Block ids (vLLM) or slots (llama.cpp: 1) one sequence with `tokens` token slots holds at steady
    /// decode.
    #[must_use]
    pub fn sequence_blocks(&self, tokens: u64) -> u64 {
        self.blocks(tokens, CacheGroup::held)
    }

    /// The most block ids one sequence holds at steady decode while it grows to `tokens` tokens, each
    /// group at its own peak (so at least the blocks at any single length up to `tokens`).
    #[must_use]
    pub fn max_sequence_blocks(&self, tokens: u64) -> u64 {
        self.blocks(tokens, CacheGroup::peak)
    }

    fn blocks(&self, tokens: u64, per_group: fn(&CacheGroup, u64) -> u64) -> u64 {
        if tokens == 0 {
            return 0;
        }
        if let Some(slot) = self.engine.slot_tokens() {
            // One slot holds the sequence; a longer one never fits (llama.cpp would cut or shift it).
            return if tokens <= slot { 1 } else { u64::MAX };
        }
        self.types
            .iter()
            .fold(0u64, |acc, t| acc.saturating_add(per_group(t, tokens).saturating_mul(u64::from(t.groups))))
    }

    /// Bytes one sequence with `tokens` token slots holds at steady decode (`tokens − 1` computed, the
    /// next token's slot allocated): [`sequence_blocks`](Self::sequence_blocks) × [`block_bytes`](Self::block_bytes).
    /// llama.cpp: one slot, whatever the length; `u64::MAX` (never fits) for a sequence longer than a slot
    /// ([`Engine::slot_tokens`]). 0 for 0 tokens. Saturates at `u64::MAX`.
    #[must_use]
    pub fn sequence_bytes(&self, tokens: u64) -> u64 {
        self.sequence_blocks(tokens).saturating_mul(self.block_bytes)
    }

    /// An upper bound of the bytes one sequence holds at steady decode while it grows to `tokens` tokens:
    /// what an admission reserves for a request of `tokens` tokens (prompt plus the most it may generate).
    /// Each group counts at its own peak: a sliding group can hold one block more at an earlier length
    /// than at `tokens` (Gemma 3 27B: 65 blocks per sliding group at 32,767 tokens, 64 at 32,768). Groups
    /// may peak at different lengths — chunked-local layers early in a local chunk, full layers at the
    /// end — and then this is more than the sequence holds at any one length; exact for one group.
    /// Monotone in `tokens`. Saturates at `u64::MAX`.
    #[must_use]
    pub fn max_sequence_bytes(&self, tokens: u64) -> u64 {
        self.max_sequence_blocks(tokens).saturating_mul(self.block_bytes)
    }

    /// An upper bound of the bytes a sequence holds while its prompt of `prompt_tokens` tokens is prefilled
    /// in chunks of at most `chunk_tokens` (vLLM's `max_num_batched_tokens`), however the scheduler splits
    /// it: sliding layers then hold the last `window − 1` computed tokens plus the chunk,
    /// `cdiv(window − 1 + chunk, block) + 1` blocks (the bound of `SlidingWindowSpec.max_memory_usage_bytes`),
    /// chunked layers the computed part of the local chunk plus the chunk, `cdiv(chunk_size − 1 + chunk,
    /// block) + 1` blocks (at most one block more than `ChunkedLocalAttentionSpec.max_memory_usage_bytes`
    /// counts: the local chunk need not start on a block boundary); either at most the prompt's blocks. Full
    /// layers and states as at the end of the prompt. At least [`sequence_bytes`](Self::sequence_bytes) of
    /// the prompt; saturates at `u64::MAX`. llama.cpp: [`sequence_bytes`](Self::sequence_bytes) of the prompt
    /// (one slot, or `u64::MAX` for a prompt longer than a slot).
    #[must_use]
    pub fn prefill_peak_bytes(&self, prompt_tokens: u64, chunk_tokens: u64) -> u64 {
        if prompt_tokens == 0 || !self.engine.is_vllm() {
            return self.sequence_bytes(prompt_tokens);
        }
        let chunk = chunk_tokens.max(1);
        let blocks = self.types.iter().fold(0u64, |acc, t| {
            acc.saturating_add(t.prefill_peak(prompt_tokens, chunk).saturating_mul(u64::from(t.groups)))
        });
        blocks.saturating_mul(self.block_bytes)
    }

    /// vLLM: the tokens of a prefix of `prefix_tokens` tokens that a later request can take from the cache
    /// — whole blocks of every group at once, so a multiple of the least common multiple of the groups'
    /// block sizes (`HybridKVCacheCoordinator`; one group: its whole blocks). Gemma 4 26B A4B (sliding
    /// blocks of 16 tokens, full-attention blocks of 32): 1,024 of a 1,040-token prefix. llama.cpp: 0.
    #[must_use]
    pub fn cache_hit_tokens(&self, prefix_tokens: u64) -> u64 {
        if !self.engine.is_vllm() {
            return 0;
        }
        prefix_tokens / self.hit_align * self.hit_align
    }

    /// Bytes of a shared prefix of `prefix_tokens` tokens (a system prompt every request starts with) that
    /// requests using it hold in common under prefix caching: the prefix's whole blocks that a sequence
    /// still holds right after prefilling it — every whole block in full-attention and MLA layers, those
    /// inside the window in sliding and chunked layers, none of a recurrent state (vLLM caches only full
    /// blocks, and a state is each sequence's own), up to the longest cache hit the prefix gives
    /// ([`cache_hit_tokens`](Self::cache_hit_tokens)). Charge it once while any request using the prefix
    /// holds a permit, and each request [`max_suffix_bytes`](Self::max_suffix_bytes). 0 for llama.cpp,
    /// whose slots share nothing.
    ///
    /// It assumes the prefix's blocks stay cached while a request using it runs. A sliding or chunked
    /// layer that has moved past the prefix returns its blocks to vLLM's free queue, where they stay
    /// cached until evicted; under memory pressure a later request may find them gone and compute them
    /// again into blocks of its own. A model with recurrent layers is laid out as vLLM does by default
    /// (one state page per request); vLLM's prefix-caching modes for such models keep states at block
    /// boundaries and hold more, which this does not price.
    #[must_use]
    pub fn prefix_bytes(&self, prefix_tokens: u64) -> u64 {
        if !self.engine.is_vllm() {
            return 0;
        }
        let hit = self.cache_hit_tokens(prefix_tokens);
        let blocks = self
            .types
            .iter()
            .fold(0u64, |acc, t| acc.saturating_add(t.shared(hit).saturating_mul(u64::from(t.groups))));
        blocks.saturating_mul(self.block_bytes)
    }

    /// The most bytes one request of `tokens` tokens holds beyond a shared prefix of `prefix_tokens` tokens
    /// charged by [`prefix_bytes`](Self::prefix_bytes), while it grows to `tokens`: per group, its peak
    /// blocks less the prefix's whole blocks it shares (at most). With `prefix_tokens` 0 this is
    /// [`max_sequence_bytes`](Self::max_sequence_bytes). llama.cpp: a whole slot.
    #[must_use]
    pub fn max_suffix_bytes(&self, tokens: u64, prefix_tokens: u64) -> u64 {
        if !self.engine.is_vllm() || tokens == 0 {
            return self.max_sequence_bytes(tokens);
        }
        let prefix = self.cache_hit_tokens(prefix_tokens.min(tokens));
        let blocks = self.types.iter().fold(0u64, |acc, t| {
            let own = match t.policy {
                GroupPolicy::State => t.peak(tokens),
                _ => t.peak(tokens).min(tokens.div_ceil(t.block_tokens) - prefix / t.block_tokens),
            };
            acc.saturating_add(own.saturating_mul(u64::from(t.groups)))
        });
        blocks.saturating_mul(self.block_bytes)
    }

    /// vLLM: block ids in a pool of `pool_bytes` on one GPU: `pool // block_bytes` (`get_num_blocks`,
    /// `kv_cache_utils.py`), one of them the null block that holds nothing. llama.cpp: the slots the pool
    /// holds.
    #[must_use]
    pub fn num_blocks(&self, pool_bytes: u64) -> u64 {
        let blocks = pool_bytes / self.block_bytes.max(1);
        match self.engine.slots() {
            Some(slots) => blocks.min(slots),
            None => blocks,
        }
    }

    /// vLLM: the "GPU KV cache size: N tokens" figure the engine logs for `num_blocks` blocks:
    /// `num_blocks // num_groups × min block size` (`_report_kv_cache_config`). llama.cpp: the cells of the
    /// context, `slots × slot_tokens`.
    #[must_use]
    pub fn kv_cache_tokens(&self, num_blocks: u64) -> u64 {
        if let (Some(slots), Some(slot)) = (self.engine.slots(), self.engine.slot_tokens()) {
            return slots.min(num_blocks).saturating_mul(slot);
        }
        let min_block = self.types.iter().map(|t| t.block_tokens).filter(|&b| b != WHOLE_SEQUENCE).min();
        (num_blocks / self.num_groups().max(1)).saturating_mul(min_block.unwrap_or(1))
    }
}

/// Cells per slot of a llama.cpp sliding-window (or chunked) cache: `pad256(min(slot, window + n_ubatch))`.
fn swa_cells(slot: u64, window: u64) -> u64 {
    slot.min(window.saturating_add(LLAMA_CPP_UBATCH)).next_multiple_of(LLAMA_CPP_PAD).min(slot.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(policy: GroupPolicy, block: u64) -> CacheGroup {
        CacheGroup { policy, layers: 1, groups: 1, block_tokens: block }
    }

    #[test]
    fn peak_is_the_maximum_of_held() {
        let cases = [
            group(GroupPolicy::Sliding { window: 128 }, 16),
            group(GroupPolicy::Sliding { window: 100 }, 16),
            group(GroupPolicy::Sliding { window: 5 }, 7),
            group(GroupPolicy::Chunked { chunk: 64 }, 16),
            group(GroupPolicy::Chunked { chunk: 40 }, 16),
            group(GroupPolicy::Chunked { chunk: 7 }, 3),
            group(GroupPolicy::Full, 16),
            group(GroupPolicy::State, WHOLE_SEQUENCE),
        ];
        for g in cases {
            let mut max = 0;
            for tokens in 1..2000 {
                max = max.max(g.held(tokens));
                assert_eq!(g.peak(tokens), max, "{g:?} at {tokens}");
            }
        }
    }

    #[test]
    fn prefill_peak_covers_every_chunk_of_every_schedule() {
        // A chunk computing tokens s..e holds cdiv(e, b) − skipped(s) / b blocks; the worst chunk of any
        // schedule ends as far from s as allowed (e = min(s + chunk, prompt)).
        let skipped = |policy: GroupPolicy, s: u64| match policy {
            GroupPolicy::Sliding { window } => (s + 1).saturating_sub(u64::from(window)),
            GroupPolicy::Chunked { chunk } => s / u64::from(chunk) * u64::from(chunk),
            GroupPolicy::Full | GroupPolicy::State => 0,
        };
        let policies = [
            GroupPolicy::Sliding { window: 1 },
            GroupPolicy::Sliding { window: 5 },
            GroupPolicy::Sliding { window: 40 },
            GroupPolicy::Chunked { chunk: 1 },
            GroupPolicy::Chunked { chunk: 7 },
            GroupPolicy::Chunked { chunk: 40 },
            GroupPolicy::Chunked { chunk: 64 },
        ];
        for policy in policies {
            for b in [1u64, 3, 16, 100] {
                let g = group(policy, b);
                for chunk in [1u64, 2, 9, 16, 50] {
                    for prompt in 1u64..300 {
                        let worst = (0..prompt)
                            .map(|s| (s + chunk).min(prompt).div_ceil(b) - skipped(policy, s) / b)
                            .max()
                            .unwrap();
                        let bound = g.prefill_peak(prompt, chunk);
                        assert!(bound >= worst, "{g:?} chunk {chunk} prompt {prompt}: {bound} < {worst}");
                        assert!(bound >= g.held(prompt), "{g:?} chunk {chunk} prompt {prompt}");
                        assert!(bound <= prompt.div_ceil(b), "{g:?} chunk {chunk} prompt {prompt}");
                    }
                }
            }
        }
    }

    #[test]
    fn shared_prefix_blocks_are_those_still_held() {
        let g = group(GroupPolicy::Sliding { window: 128 }, 16);
        // Prefix of 1000: 62 whole blocks; at 1000 tokens 54 are freed ((1000 − 128) / 16), 9 held
        // (blocks 54..=62), of which 8 are whole prefix blocks (54..=61).
        assert_eq!(g.shared(1000), 8);
        assert_eq!(group(GroupPolicy::Full, 16).shared(1000), 62);
        assert_eq!(group(GroupPolicy::State, WHOLE_SEQUENCE).shared(1000), 0);
        assert_eq!(g.shared(100), 6);
    }
}
