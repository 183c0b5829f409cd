//! KV-cache memory model: how many bytes a sequence holds, and how many sequences fit on a GPU.
//!
//! Pure computation, no concurrency: [`ModelSpec`] describes a model's layers as groups by how they cache
//! keys and values, [`KvDtype`] the cache's element type ([`WeightDtype`] the weights'), and [`GpuPlan`] the pool a
//! GPU leaves for the cache. The
//! admission controller uses them to size its KV budget and to price a request.
//!
//! # The formulas
//!
//! Per token, one layer stores
//!
//! - full, sliding-window or chunked-local attention: `2 × kv_heads × head_dim` elements — a K and a V vector per KV head
//!   (`kv_heads × (k_head_dim + v_head_dim)` when they differ). vLLM keeps separate K and V slots even for a
//!   model that shares them (Gemma 4's `attention_k_eq_v`), and so does this model;
//! - MLA latent cache (DeepSeek-V2/V3): `kv_lora_rank + qk_rope_head_dim` elements, no factor of 2 (one
//!   latent per token shared by all heads; `num_key_value_heads` plays no part);
//! - linear attention, Mamba, and layers that reuse another layer's cache: nothing per token (vLLM gives a
//!   shared-KV layer no cache of its own; a recurrent state has a fixed size per sequence, whatever its
//!   length).
//!
//! A sequence of `t` tokens holds `t` tokens in a full or MLA layer, `min(t, window)` in a sliding layer
//! and the tokens of its current chunk in a chunked-local layer, so [`ModelSpec::kv_bytes`] is
//!
//! ```text
//! Σ over groups  layers × held(t) × bytes_per_token(dtype)
//! ```
//!
//! and [`ModelSpec::kv_bytes_paged`] rounds each layer's `held(t)` up to whole blocks of `block_size`
//! tokens, because vLLM's paged allocator hands out whole blocks. [`ModelSpec::kv_bytes_naive`] is the
//! widely shared estimate that treats every attention layer as full. All three saturate at `u64::MAX`
//! instead of overflowing, loop over a few groups and allocate nothing, so they can run on the admission
//! hot path.
//!
//! # Engines
//!
//! [`ModelSpec::kv_bytes`] and [`ModelSpec::kv_bytes_paged`] keep the simple per-layer meaning above.
//! [`ModelSpec::sequence_bytes`] (and [`KvLayout`], [`GpuPlan`]) follow one [`Engine`]'s allocator exactly:
//! vLLM's v1 engine with its hybrid KV-cache manager ([`Engine::Vllm`], the default), the same engine with
//! the manager off ([`Engine::VllmUniform`]), or llama.cpp's slots ([`Engine::LlamaCpp`]).
//!
//! ## vLLM's v1 allocator, rule by rule
//!
//! Read in vLLM's main branch (late 2025 to 2026, the v0.11–v0.13 line; files at commits `001cabc`
//! `kv_cache_utils.py`, `129ab7c` `single_type_kv_cache_manager.py`, `bc8282e` `kv_cache_interface.py`,
//! `1936cf3` `model_executor/models/config.py`):
//!
//! 1. **Page per layer type** (`vllm/v1/kv_cache_interface.py`, `AttentionSpec.real_page_size_bytes`,
//!    `FullAttentionSpec`, `MLAAttentionSpec`, `MambaSpec.page_size_bytes`): attention `block × kv_heads ×
//!    (k_dim + v_dim) × dtype`; MLA `block × latent × dtype` (no factor 2); a Mamba / linear-attention layer
//!    one page holding its whole state (the sum of its state tensors, in the model dtype).
//! 2. **Groups of one size, the last padded** (`vllm/v1/core/kv_cache_utils.py`,
//!    `_get_kv_cache_groups_uniform_page_size`): layers of one spec form one group
//!    (`_get_kv_cache_groups_uniform_spec`), and so do layers of one type needing the same token slots
//!    (`UniformTypeKVCacheSpecs`); otherwise `group_size` is the smallest type's layer count (the largest when
//!    it is under 1.5 times the smallest), each type splits into `cdiv(layers, group_size)` groups, and
//!    `get_kv_cache_config_from_groups` makes `group_size` tensors each shared by one layer of every group,
//!    so one block id costs `group_size` pages ([`KvLayout::block_bytes`]).
//! 3. **Page-size unification** (`unify_kv_cache_spec_page_size`): a smaller page's block size grows by
//!    `max_page / page` (which must divide; otherwise vLLM refuses the model and [`ModelSpec::kv_layout`]
//!    returns [`ConfigError::Conflict`](crate::ConfigError::Conflict)).
//! 4. **Blocks freed only when wholly outside** (`vllm/v1/core/single_type_kv_cache_manager.py`,
//!    `remove_skipped_blocks`, `get_num_skipped_tokens`): with `c` tokens computed a sliding layer skips
//!    `max(0, c − window + 1)` tokens and a chunked layer `(c // chunk) × chunk`; only `skipped // block`
//!    blocks are freed. At steady decode (`tokens − 1` computed) a sliding group holds
//!    `cdiv(tokens, block) − (tokens − window) // block` blocks — sometimes one more than
//!    `cdiv(window, block)`; [`KvLayout::max_sequence_bytes`] counts that extra block.
//! 5. **Recurrent state as whole pages, attention block raised to match**
//!    (`HybridAttentionMambaModelConfig.verify_and_update_config`, `model_executor/models/config.py`):
//!    the attention block becomes `align × cdiv(state_page, align × attention_bytes_per_token)` (align 16;
//!    64 for MLA) when larger than asked, and the state page is padded to the attention page; a Mamba group
//!    holds one block per sequence (`mamba_block_size = max_model_len`, `MambaManager`, prefix-caching
//!    modes aside). State shapes: `MambaStateShapeCalculator` (`model_executor/layers/mamba/mamba_utils.py`),
//!    see [`ModelSpec::from_hf_config`].
//! 6. **Cross-layer KV sharing** (`Attention.get_kv_cache_spec` with `kv_sharing_target_layer_name`):
//!    a layer reading another's cache ([`NoKvReason::SharedKv`]) gets no spec and no group.
//! 7. **MLA block size per platform** (`vllm/platforms/cuda.py`, `check_and_update_config`): FlashMLA on
//!    Hopper forces blocks of 64 ([`GpuPlan`] applies it for [`GpuArch::Hopper`]); elsewhere 16.
//! 8. **The null block** (`BlockPool`): block 0 stands in for freed blocks and never holds data
//!    ([`GpuPlan::usable_blocks`]); the pool holds `pool // block_bytes` ids (`get_num_blocks`) and the
//!    "GPU KV cache size: N tokens" log line is `num_blocks // groups × min block size`
//!    (`_report_kv_cache_config`, [`GpuPlan::kv_cache_tokens`]).
//! 9. **Manager off** (`unify_hybrid_kv_cache_specs`): sliding and chunked layers become full attention
//!    ([`Engine::VllmUniform`]).
//!
//! ## llama.cpp
//!
//! `llama-server -c n_ctx -np n_parallel` pads `n_ctx` to 256 cells and gives each slot
//! `pad256(n_ctx / n_parallel)` cells in every full-attention layer (`n_ctx_seq`, `src/llama-context.cpp`),
//! `pad256(min(slot, window + n_ubatch))` in every sliding or chunked layer (`llama_kv_cache_iswa`), no V
//! cache for MLA, and one f32 state per slot for recurrent layers — all allocated at start-up. Its
//! `q8_0`/`q4_0` cache types store 32 values in 34 / 18 bytes ([`KvDtype::bytes_for`]).
//!
//! # Pool and tensor parallelism
//!
//! - **Pool**: `floor(gpu_memory × gpu_memory_utilization) − weights − activation reserve` per GPU
//!   (vLLM measures the reserve by profiling; [`GpuPlan`] takes it as a setting).
//! - **Tensor parallelism**: each GPU holds `kv_heads / tp` heads of every attention layer and the same
//!   number of blocks; an MLA latent is replicated on every GPU.
//!
//! # Examples
//!
//! ```
//! use kvgate::kv::{Engine, GpuPlan, KvDtype, ModelSpec};
//!
//! let gemma = ModelSpec::preset("gemma-3-27b")?;
//! let naive = gemma.kv_bytes_naive(32_768, KvDtype::Bf16);
//! let real = gemma.kv_bytes_paged(32_768, KvDtype::Bf16, 16);
//! assert_eq!(naive, 16_642_998_272); // 62 layers × 32768 tokens × 8192 bytes: "15.5 GiB"
//! assert_eq!(real, 3_120_562_176); // 10 × 32768 + 52 × 1024 tokens × 8192 bytes: 3.1 GB
//! // vLLM groups the layers by 10 and pads the last sliding group: 3.19 GB.
//! assert_eq!(gemma.sequence_bytes(32_768, KvDtype::Bf16, 16, Engine::Vllm), 3_187_671_040);
//!
//! let plan = GpuPlan::builder(gemma).gpu("h100-80").engine(Engine::Vllm).build()?;
//! println!("{} sequences of 32k fit", plan.max_sequences(32_768));
//! # Ok::<(), kvgate::ConfigError>(())
//! ```

mod dtype;
mod engine;
mod gpu;
#[cfg(feature = "hf-config")]
mod hf;
#[cfg(feature = "hf-config")]
mod hf_defaults;
mod layer;
mod layout;
mod plan;
mod presets;
mod spec;
mod weight_dtype;

pub use dtype::KvDtype;
pub use engine::Engine;
pub use gpu::{Gpu, GpuArch};
#[cfg(feature = "hf-config")]
pub use hf_defaults::hf_config_defaults_table;
pub use layer::{LayerGroup, LayerKind, NoKvReason, RecurrentKind};
pub use layout::{CacheGroup, GroupPolicy, KvLayout};
pub use plan::{DEFAULT_RESERVE_BYTES, GpuPlan, GpuPlanBuilder};
pub use spec::{ModelSpec, ModelSpecBuilder};
pub use weight_dtype::WeightDtype;
