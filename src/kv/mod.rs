//! KV-cache memory model: how many bytes a sequence holds, and how many sequences fit on a GPU.
//!
//! Pure computation, no concurrency: [`ModelSpec`] describes a model's layers as groups by how they cache
//! keys and values, [`KvDtype`] the element type, and [`GpuPlan`] the pool a GPU leaves for the cache. The
//! admission controller uses them to size its KV budget and to price a request.
//!
//! # The formulas
//!
//! Per token, one layer stores
//!
//! - full or sliding-window attention: `2 × kv_heads × head_dim` elements — a K and a V vector per KV head
//!   (`kv_heads × (k_head_dim + v_head_dim)` when they differ). vLLM keeps separate K and V slots even for a
//!   model that shares them (Gemma 4's `attention_k_eq_v`), and so does this model;
//! - MLA latent cache (DeepSeek-V2/V3): `kv_lora_rank + qk_rope_head_dim` elements, no factor of 2 (one
//!   latent per token shared by all heads; `num_key_value_heads` plays no part);
//! - linear attention, Mamba, and layers that reuse another layer's cache: nothing per token (vLLM gives a
//!   shared-KV layer no cache of its own; a recurrent state has a fixed size per sequence, whatever its
//!   length).
//!
//! A sequence of `t` tokens holds `t` tokens in a full or MLA layer and `min(t, window)` in a sliding layer,
//! so [`ModelSpec::kv_bytes`] is
//!
//! ```text
//! Σ over groups  layers × held(t) × elements_per_token × dtype_bytes
//! ```
//!
//! and [`ModelSpec::kv_bytes_paged`] rounds each layer's `held(t)` up to whole blocks of `block_size`
//! tokens, because vLLM's paged allocator hands out whole blocks. [`ModelSpec::kv_bytes_naive`] is the
//! widely shared estimate that treats every attention layer as full. All three saturate at `u64::MAX`
//! instead of overflowing, loop over a few groups and allocate nothing, so they can run on the admission
//! hot path.
//!
//! # The vLLM rules followed
//!
//! - **Pool**: `floor(gpu_memory × gpu_memory_utilization) − weights − activation reserve` per GPU
//!   (vLLM measures the reserve by profiling; [`GpuPlan`] takes it as a setting).
//! - **Blocks**: `pool // block_bytes` (vLLM's `available_memory // page_size` rule), where a block holds
//!   `block_size` tokens in every layer that has a cache.
//! - **Sliding windows**: a sliding layer frees blocks that fall out of its window, so it holds
//!   `min(t, window)` tokens, rounded up to blocks.
//! - **Tensor parallelism**: each GPU holds `kv_heads / tp` heads of every layer and the same number of
//!   blocks; an MLA latent is replicated on every GPU.
//!
//! Three details of vLLM are deliberately not modelled: its sliding-window manager frees a block
//! only once the whole block has left the window, so a sliding layer can hold one block more than
//! `ceil(window / block_size)` while the window start is not block-aligned; and its hybrid allocator groups
//! layers of different kinds into equal-sized groups, which can pad the count of one kind (Gemma 3 27B's 52
//! sliding layers are stored as 6 groups of 10); and for hybrid models (Qwen3-Next, Jamba) it takes each
//! sequence's fixed-size recurrent state from the same pool, which this model leaves out.
//!
//! # Examples
//!
//! ```
//! use kvgate::kv::{GpuPlan, KvDtype, ModelSpec};
//!
//! let gemma = ModelSpec::preset("gemma-3-27b")?;
//! let naive = gemma.kv_bytes_naive(32_768, KvDtype::Bf16);
//! let real = gemma.kv_bytes_paged(32_768, KvDtype::Bf16, 16);
//! assert_eq!(naive, 16_642_998_272); // 62 layers × 32768 tokens × 8192 bytes: "15.5 GiB"
//! assert_eq!(real, 3_120_562_176); // 10 × 32768 + 52 × 1024 tokens × 8192 bytes: 3.1 GB
//!
//! let plan = GpuPlan::builder(gemma).gpu("h100-80").build()?;
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

pub use dtype::KvDtype;
pub use engine::Engine;
pub use gpu::{Gpu, GpuArch};
#[cfg(feature = "hf-config")]
pub use hf_defaults::hf_config_defaults_table;
pub use layer::{LayerGroup, LayerKind, NoKvReason, RecurrentKind};
pub use layout::{CacheGroup, GroupPolicy, KvLayout};
pub use plan::{DEFAULT_RESERVE_BYTES, GpuPlan, GpuPlanBuilder};
pub use spec::{ModelSpec, ModelSpecBuilder};
