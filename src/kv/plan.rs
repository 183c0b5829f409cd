//! [`GpuPlan`]: how much KV cache one GPU (or one tensor-parallel group) holds for a model.

use super::{Engine, Gpu, GpuArch, KvDtype, KvLayout, ModelSpec, WeightDtype};
use crate::ConfigError;

const GIB: u64 = 1 << 30;

/// Default memory reserved for activations, CUDA graphs and the runtime, per GPU.
pub const DEFAULT_RESERVE_BYTES: u64 = 2 * GIB;

/// The KV-cache capacity of a model on one GPU or a tensor-parallel group of identical GPUs, under one
/// engine's allocator.
///
/// Per GPU, the KV pool is what the engine leaves to it:
///
/// ```text
/// pool = floor(memory × memory_utilization) − weights / tp − reserve
/// ```
///
/// (vLLM's `gpu_worker.determine_available_memory`, with the activation peak and CUDA graphs it profiles
/// taken as the `reserve` setting). vLLM cuts the pool into `pool // block_bytes` block ids
/// ([`KvLayout::num_blocks`]; a block id costs one page of `group_size` layers, see [`KvLayout`]), keeps one
/// as the null block, and gives each sequence the ids its groups hold ([`KvLayout::sequence_blocks`]).
/// llama.cpp allocates its slots up front. Under tensor parallelism each GPU holds `kv_heads / tp` heads
/// of every attention layer (one head when `tp` exceeds `kv_heads`; an MLA latent is replicated on every
/// GPU) and the same number of blocks, so a group of `tp` GPUs holds as many tokens as one of its GPUs.
///
/// What an admission needs to price a request exactly is here: [`engine`](Self::engine), the per-request
/// price [`max_sequence_bytes`](Self::max_sequence_bytes) (or [`sequence_bytes`](Self::sequence_bytes) at
/// one length), the budget [`kv_budget_bytes`](Self::kv_budget_bytes) in the same unit, and for shared
/// prefixes [`prefix_bytes`](Self::prefix_bytes) and [`max_suffix_bytes`](Self::max_suffix_bytes).
///
/// # Examples
///
/// ```
/// use kvgate::kv::{Engine, GpuPlan, KvDtype, ModelSpec};
///
/// let plan = GpuPlan::builder(ModelSpec::preset("gemma-3-27b")?)
///     .gpu("h100-80")
///     .engine(Engine::Vllm)
///     .build()?;
/// // Pool: floor(79.6 GiB x 0.9) - 54.9 GB of bf16 weights - 2 GiB reserve = about 20 GB. A 32k sequence
/// // holds 3.19 GB (52 of 62 layers slide over 1024 tokens); every layer full it would hold 16.6 GB.
/// assert_eq!(plan.sequence_bytes(32_768), 3_187_671_040);
/// assert_eq!(plan.max_sequences(32_768), 6);
/// assert_eq!(plan.kv_pool_bytes() / plan.model().kv_bytes_naive(32_768, KvDtype::Bf16), 1);
/// // The figure vLLM logs as "GPU KV cache size: N tokens".
/// assert_eq!(plan.kv_cache_tokens(), plan.num_blocks() / 7 * 16);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct GpuPlan {
    model: ModelSpec,
    shard: ModelSpec,
    layout: KvLayout,
    gpu: String,
    gpu_memory_bytes: u64,
    memory_utilization: f64,
    weight_bytes: u64,
    reserve_bytes: u64,
    tensor_parallel: u32,
    kv_dtype: KvDtype,
    pool_per_gpu: u64,
}

/// Builds a [`GpuPlan`]; see [`GpuPlan::builder`]. Settings are checked in [`build`](Self::build).
#[derive(Debug, Clone)]
pub struct GpuPlanBuilder {
    model: ModelSpec,
    gpu: Option<String>,
    gpu_memory_bytes: Option<u64>,
    memory_utilization: f64,
    weight_bytes: Option<u64>,
    weight_dtype: WeightDtype,
    reserve_bytes: u64,
    tensor_parallel: u32,
    kv_dtype: KvDtype,
    block_size: Option<u32>,
    engine: Engine,
}

/// vLLM's default block size on CUDA (`CacheConfig.block_size`).
const DEFAULT_BLOCK_SIZE: u32 = 16;
/// FlashMLA's block size: vLLM forces it for MLA models on Hopper (`platforms/cuda.py`,
/// `check_and_update_config`: "Forcing kv cache block size to 64 for FlashMLA backend").
const FLASH_MLA_BLOCK_SIZE: u32 = 64;

impl GpuPlan {
    /// Starts a plan for `model`, with vLLM's defaults: [`Engine::Vllm`], `memory_utilization` 0.9, blocks of
    /// 16 tokens (64 for an MLA model on Hopper), a bf16 cache, bf16 weights sized from the model's
    /// parameter count, no tensor parallelism, and [`DEFAULT_RESERVE_BYTES`] for activations. A GPU (preset
    /// or memory size) must be given.
    #[must_use]
    pub fn builder(model: ModelSpec) -> GpuPlanBuilder {
        GpuPlanBuilder {
            model,
            gpu: None,
            gpu_memory_bytes: None,
            memory_utilization: 0.9,
            weight_bytes: None,
            weight_dtype: WeightDtype::Bf16,
            reserve_bytes: DEFAULT_RESERVE_BYTES,
            tensor_parallel: 1,
            kv_dtype: KvDtype::Bf16,
            block_size: None,
            engine: Engine::Vllm,
        }
    }

    /// GPU preset names accepted by [`GpuPlanBuilder::gpu`]: [`Gpu::names`].
    #[must_use]
    pub fn gpu_names() -> Vec<&'static str> {
        Gpu::names()
    }

    /// Total memory of the GPU preset `name` (ASCII case-insensitive), in bytes.
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownName`] listing the known GPUs.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(kvgate::kv::GpuPlan::gpu_memory("A100-80")?, 80 << 30);
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn gpu_memory(name: &str) -> Result<u64, ConfigError> {
        Gpu::preset(name).map(|gpu| gpu.memory_bytes())
    }

    /// The model planned for.
    #[must_use]
    pub fn model(&self) -> &ModelSpec {
        &self.model
    }

    /// The share of the model one GPU holds: [`ModelSpec::tensor_parallel_shard`] of the model.
    #[must_use]
    pub fn per_gpu_model(&self) -> &ModelSpec {
        &self.shard
    }

    /// The engine whose allocator the plan follows.
    #[must_use]
    pub fn engine(&self) -> Engine {
        self.layout.engine()
    }

    /// How the engine lays out one GPU's share of the cache.
    #[must_use]
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// The GPU's name (the preset, or `"custom"`).
    #[must_use]
    pub fn gpu(&self) -> &str {
        &self.gpu
    }

    /// The GPU preset planned for, with its bandwidth and throughput; `None` for a custom GPU given only by
    /// its memory size.
    #[must_use]
    pub fn gpu_spec(&self) -> Option<Gpu> {
        Gpu::preset(&self.gpu).ok()
    }

    /// Total memory of one GPU, bytes.
    #[must_use]
    pub fn gpu_memory_bytes(&self) -> u64 {
        self.gpu_memory_bytes
    }

    /// Fraction of GPU memory the server may use.
    #[must_use]
    pub fn memory_utilization(&self) -> f64 {
        self.memory_utilization
    }

    /// Weight bytes of the whole model (across all tensor-parallel GPUs).
    #[must_use]
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    /// Memory reserved per GPU for activations and runtime, bytes.
    #[must_use]
    pub fn reserve_bytes(&self) -> u64 {
        self.reserve_bytes
    }

    /// Tensor-parallel degree (number of GPUs).
    #[must_use]
    pub fn tensor_parallel(&self) -> u32 {
        self.tensor_parallel
    }

    /// Element type of the KV cache.
    #[must_use]
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// Tokens per block of attention in effect (vLLM: the one asked for, 64 for MLA on Hopper, raised for
    /// Mamba state; see [`KvLayout::block_size`]); llama.cpp, which has no blocks: the tokens of one slot.
    #[must_use]
    pub fn block_size(&self) -> u32 {
        match self.engine().slot_tokens() {
            Some(slot) => u32::try_from(slot).unwrap_or(u32::MAX),
            None => self.layout.block_size(),
        }
    }

    /// KV pool of one GPU, bytes.
    #[must_use]
    pub fn kv_pool_bytes_per_gpu(&self) -> u64 {
        self.pool_per_gpu
    }

    /// KV pool of the whole tensor-parallel group: per-GPU pool × degree.
    #[must_use]
    pub fn kv_pool_bytes(&self) -> u64 {
        self.pool_per_gpu.saturating_mul(u64::from(self.tensor_parallel))
    }

    /// Bytes of one block id on one GPU (llama.cpp: of one slot); see [`KvLayout::block_bytes`].
    #[must_use]
    pub fn block_bytes_per_gpu(&self) -> u64 {
        self.layout.block_bytes()
    }

    /// Block ids the engine makes of the pool: `pool_per_gpu // block_bytes` (vLLM's `get_num_blocks`; the
    /// minimum over GPUs is the same, every GPU holding the same share). llama.cpp: its slots.
    #[must_use]
    pub fn num_blocks(&self) -> u64 {
        self.layout.num_blocks(self.pool_per_gpu)
    }

    /// Block ids that can hold data: vLLM keeps block 0 as the null block (`BlockPool`), which stands in for
    /// freed sliding-window blocks and never holds a token. llama.cpp: every slot.
    #[must_use]
    pub fn usable_blocks(&self) -> u64 {
        match self.engine() {
            Engine::Vllm | Engine::VllmUniform => self.num_blocks().saturating_sub(1),
            _ => self.num_blocks(),
        }
    }

    /// The figure vLLM logs at start-up as "GPU KV cache size: N tokens": `num_blocks // groups × block
    /// size` ([`KvLayout::kv_cache_tokens`]). It counts a token once per group, so a hybrid model with
    /// sliding windows holds far longer sequences than this suggests. llama.cpp: its context, all slots.
    #[must_use]
    pub fn kv_cache_tokens(&self) -> u64 {
        self.layout.kv_cache_tokens(self.num_blocks())
    }

    /// Same as [`kv_cache_tokens`](Self::kv_cache_tokens) (the name earlier versions used).
    #[must_use]
    pub fn max_tokens(&self) -> u64 {
        self.kv_cache_tokens()
    }

    /// The byte budget an admission should hold in the unit of [`sequence_bytes`](Self::sequence_bytes):
    /// usable block ids × block bytes × tensor-parallel degree. The pool's remainder smaller than a block
    /// holds nothing, and neither does the null block.
    #[must_use]
    pub fn kv_budget_bytes(&self) -> u64 {
        self.usable_blocks().saturating_mul(self.layout.block_bytes()).saturating_mul(u64::from(self.tensor_parallel))
    }

    /// Bytes one sequence of `tokens` tokens holds on each GPU at steady decode, under the plan's engine.
    #[must_use]
    pub fn sequence_bytes_per_gpu(&self, tokens: u64) -> u64 {
        self.layout.sequence_bytes(tokens)
    }

    /// Bytes one sequence of `tokens` tokens holds across the tensor-parallel group at steady decode
    /// ([`KvLayout::sequence_bytes`] × degree), in the unit of [`kv_budget_bytes`](Self::kv_budget_bytes).
    #[must_use]
    pub fn sequence_bytes(&self, tokens: u64) -> u64 {
        self.across_group(self.layout.sequence_bytes(tokens))
    }

    /// An upper bound of the bytes a request of `tokens` tokens (prompt plus the most it may generate)
    /// holds across the group while it grows ([`KvLayout::max_sequence_bytes`] × degree): the price an
    /// admission reserves.
    #[must_use]
    pub fn max_sequence_bytes(&self, tokens: u64) -> u64 {
        self.across_group(self.layout.max_sequence_bytes(tokens))
    }

    /// An upper bound of the bytes a sequence holds across the group while its prompt of `prompt_tokens`
    /// is prefilled in chunks of at most `chunk_tokens`, however the scheduler splits it
    /// ([`KvLayout::prefill_peak_bytes`] × degree): sliding and chunked-local layers then briefly hold
    /// their window (or local chunk) plus the chunk, and a block more.
    #[must_use]
    pub fn prefill_peak_bytes(&self, prompt_tokens: u64, chunk_tokens: u64) -> u64 {
        self.across_group(self.layout.prefill_peak_bytes(prompt_tokens, chunk_tokens))
    }

    /// Bytes a shared prefix of `prefix_tokens` tokens occupies once across the group, for all the
    /// requests using it ([`KvLayout::prefix_bytes`] × degree).
    #[must_use]
    pub fn prefix_bytes(&self, prefix_tokens: u64) -> u64 {
        self.across_group(self.layout.prefix_bytes(prefix_tokens))
    }

    /// The most bytes a request of `tokens` tokens holds across the group beyond a shared prefix of
    /// `prefix_tokens` tokens ([`KvLayout::max_suffix_bytes`] × degree).
    #[must_use]
    pub fn max_suffix_bytes(&self, tokens: u64, prefix_tokens: u64) -> u64 {
        self.across_group(self.layout.max_suffix_bytes(tokens, prefix_tokens))
    }

    /// Bytes on each GPU times the tensor-parallel degree: the unit of the group-wide figures.
    fn across_group(&self, bytes_per_gpu: u64) -> u64 {
        bytes_per_gpu.saturating_mul(u64::from(self.tensor_parallel))
    }

    /// How many sequences of `context_tokens` tokens fit at once at steady decode: usable block ids over the
    /// ids one holds. llama.cpp: its slots, or 0 when the context is longer than a slot. A context of 0 costs
    /// nothing: the answer is then `u64::MAX`.
    #[must_use]
    pub fn max_sequences(&self, context_tokens: u64) -> u64 {
        if let Some(slot) = self.engine().slot_tokens() {
            return if context_tokens > slot { 0 } else { self.usable_blocks() };
        }
        match self.layout.sequence_blocks(context_tokens) {
            0 => u64::MAX,
            blocks => self.usable_blocks() / blocks,
        }
    }

    /// How many users fit at once when their contexts average `average_context_tokens`.
    ///
    /// Estimated as [`max_sequences`](Self::max_sequences) at the average. The bytes a sequence holds grow
    /// at most linearly in its length and windows cap them, so a mix of lengths with this average holds
    /// about as much as the same number of average-length sequences (up to the rounding of each to whole
    /// blocks).
    #[must_use]
    pub fn users_at_average_context(&self, average_context_tokens: u64) -> u64 {
        self.max_sequences(average_context_tokens)
    }
}

impl GpuPlanBuilder {
    /// A GPU preset by name (see [`GpuPlan::gpu_names`]); resolved in [`build`](Self::build).
    #[must_use]
    pub fn gpu(mut self, name: &str) -> Self {
        self.gpu = Some(name.to_owned());
        self
    }

    /// Total memory of one GPU in bytes, for a GPU without a preset (overrides [`gpu`](Self::gpu)'s size).
    #[must_use]
    pub fn gpu_memory_bytes(mut self, bytes: u64) -> Self {
        self.gpu_memory_bytes = Some(bytes);
        self
    }

    /// The engine whose allocator to follow (default [`Engine::Vllm`]).
    #[must_use]
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// Fraction of GPU memory the server may use, in `(0, 1]` (vLLM's `--gpu-memory-utilization`, default
    /// 0.9).
    #[must_use]
    pub fn memory_utilization(mut self, fraction: f64) -> Self {
        self.memory_utilization = fraction;
        self
    }

    /// Weight bytes of the whole model, overriding the estimate from the parameter count.
    #[must_use]
    pub fn weight_bytes(mut self, bytes: u64) -> Self {
        self.weight_bytes = Some(bytes);
        self
    }

    /// Element type of the weights when they are sized from the parameter count (default bf16; `q4_0` and
    /// `q8_0` for llama.cpp's GGUF files of those types). Not the cache's type, which is
    /// [`kv_dtype`](Self::kv_dtype); a [`KvDtype`] is accepted and means the weight type of the same format.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
    ///
    /// let model = ModelSpec::preset("llama-3.1-8b")?;
    /// let bf16 = GpuPlan::builder(model.clone()).gpu("l4").build()?;
    /// let q4 = GpuPlan::builder(model).gpu("l4").weight_dtype(WeightDtype::Q4_0).build()?;
    /// assert!(q4.kv_pool_bytes() > bf16.kv_pool_bytes()); // smaller weights leave more for the cache
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    #[must_use]
    pub fn weight_dtype(mut self, dtype: impl Into<WeightDtype>) -> Self {
        self.weight_dtype = dtype.into();
        self
    }

    /// Memory reserved per GPU for activations, CUDA graphs and runtime (default [`DEFAULT_RESERVE_BYTES`];
    /// vLLM measures it with a profiling run).
    #[must_use]
    pub fn reserve_bytes(mut self, bytes: u64) -> Self {
        self.reserve_bytes = bytes;
        self
    }

    /// Tensor-parallel degree: GPUs the model is split across (default 1).
    #[must_use]
    pub fn tensor_parallel(mut self, degree: u32) -> Self {
        self.tensor_parallel = degree;
        self
    }

    /// Element type of the KV cache (default bf16).
    #[must_use]
    pub fn kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = dtype;
        self
    }

    /// vLLM's `--block-size`: tokens per block (default 16). vLLM raises it to 64 for MLA models on Hopper
    /// (FlashMLA) unless it is a multiple of 64, and for attention + Mamba models until one attention page
    /// holds a state; the plan does the same. llama.cpp ignores it.
    #[must_use]
    pub fn block_size(mut self, tokens: u32) -> Self {
        self.block_size = Some(tokens);
        self
    }

    /// Checks the settings and computes the pool and the layout.
    ///
    /// # Errors
    ///
    /// - [`ConfigError::UnknownName`] for an unknown GPU preset;
    /// - [`ConfigError::Conflict`] when neither a GPU nor its memory was given, when weights are neither given
    ///   nor derivable (no parameter count), when the weights and reserve leave no memory for the KV cache,
    ///   when not even one block (llama.cpp: not every slot) fits, when the tensor-parallel degree neither
    ///   divides nor is a multiple of the KV heads, when vLLM is asked for a `q8_0`/`q4_0` cache or (with its
    ///   hybrid manager off) for a model with recurrent layers, when llama.cpp is planned across several
    ///   GPUs, or when vLLM could not unify the model's page sizes;
    /// - [`ConfigError::OutOfRange`] for a `memory_utilization` outside `(0, 1]`;
    /// - [`ConfigError::Zero`] for a block size, GPU memory or tensor-parallel degree of 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::{ConfigError, kv::{GpuPlan, ModelSpec}};
    /// let spec = ModelSpec::preset("llama-3.1-70b")?;
    /// // 141 GB of bf16 weights do not fit on one 80 GB card.
    /// let err = GpuPlan::builder(spec.clone()).gpu("h100-80").build().unwrap_err();
    /// assert!(matches!(err, ConfigError::Conflict(_)));
    /// assert!(GpuPlan::builder(spec).gpu("h100-80").tensor_parallel(4).build().is_ok());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn build(self) -> Result<GpuPlan, ConfigError> {
        let gpu = self.gpu.unwrap_or_else(|| "custom".to_owned());
        let gpu_memory_bytes = match self.gpu_memory_bytes {
            Some(bytes) => bytes,
            None if gpu == "custom" => {
                return Err(ConfigError::Conflict(
                    "no GPU given: set a GPU preset with .gpu(name) or its memory with .gpu_memory_bytes(bytes)".into(),
                ));
            }
            None => GpuPlan::gpu_memory(&gpu)?,
        };
        if gpu_memory_bytes == 0 {
            return Err(ConfigError::Zero { what: "GPU memory" });
        }
        if self.block_size == Some(0) {
            return Err(ConfigError::Zero { what: "block size" });
        }
        let util = self.memory_utilization;
        if !(util > 0.0 && util <= 1.0) {
            return Err(ConfigError::OutOfRange {
                what: "memory_utilization",
                reason: format!("{util} is outside (0, 1]; vLLM's default is 0.9"),
            });
        }
        let engine = self.engine;
        if engine.is_vllm() && !self.kv_dtype.is_vllm_cache_type() {
            return Err(ConfigError::Conflict(format!(
                "vLLM has no {} KV cache (that is llama.cpp's); use bf16, fp16 or fp8, or Engine::llama_cpp",
                self.kv_dtype
            )));
        }
        if engine == Engine::VllmUniform && self.model.recurrent_layers() > 0 {
            return Err(ConfigError::Conflict(format!(
                "{} has recurrent (Mamba / linear-attention) layers: vLLM refuses to run it with the hybrid KV-cache \
                 manager disabled; use Engine::Vllm",
                self.model.name()
            )));
        }
        if !engine.is_vllm() && self.tensor_parallel != 1 {
            return Err(ConfigError::Conflict(
                "llama.cpp plans are for one GPU: leave tensor_parallel at 1 (llama.cpp splits layers, not heads)"
                    .into(),
            ));
        }
        let shard = self.model.tensor_parallel_shard(self.tensor_parallel)?;
        let tp = u64::from(self.tensor_parallel);
        let weight_bytes = match (self.weight_bytes, self.model.params()) {
            (Some(bytes), _) => bytes,
            (None, Some(params)) => self.weight_dtype.bytes_for(params),
            (None, None) => {
                return Err(ConfigError::Conflict(format!(
                    "the weight size of {} is unknown (no parameter count): set .weight_bytes(bytes)",
                    self.model.name()
                )));
            }
        };
        // f64 holds every realistic memory size exactly enough (GPU sizes are far below 2^53 bytes).
        let usable = (gpu_memory_bytes as f64 * util).floor() as u64;
        let taken = weight_bytes.div_ceil(tp).saturating_add(self.reserve_bytes);
        let pool_per_gpu = usable.checked_sub(taken).filter(|&p| p > 0).ok_or_else(|| {
            ConfigError::Conflict(format!(
                "weights ({:.1} GiB per GPU) plus reserve ({:.1} GiB) exceed the usable memory ({:.1} GiB = \
                 {:.1} GiB x {util}); use more GPUs (tensor parallelism), smaller weights, or a larger GPU",
                gib(weight_bytes.div_ceil(tp)),
                gib(self.reserve_bytes),
                gib(usable),
                gib(gpu_memory_bytes),
            ))
        })?;
        let hopper = Gpu::preset(&gpu).is_ok_and(|g| g.arch() == GpuArch::Hopper);
        let block_size = match self.block_size {
            Some(b) if hopper && shard.mla_layers() > 0 && b % FLASH_MLA_BLOCK_SIZE != 0 => FLASH_MLA_BLOCK_SIZE,
            Some(b) => b,
            None if hopper && shard.mla_layers() > 0 => FLASH_MLA_BLOCK_SIZE,
            None => DEFAULT_BLOCK_SIZE,
        };
        let layout = shard.kv_layout(self.kv_dtype, block_size, engine)?;
        let block = layout.block_bytes();
        if let Some(slots) = engine.slots() {
            let needed = block.saturating_mul(slots);
            if pool_per_gpu < needed {
                return Err(ConfigError::Conflict(format!(
                    "llama.cpp allocates its {slots} slots up front: {:.2} GiB of KV cache, but the pool holds {:.2} \
                     GiB; use fewer slots (-np), a smaller context (-c), or a smaller cache type",
                    gib(needed),
                    gib(pool_per_gpu)
                )));
            }
        } else if pool_per_gpu < block {
            return Err(ConfigError::Conflict(format!(
                "the KV pool ({pool_per_gpu} bytes per GPU) is smaller than one block ({block} bytes)"
            )));
        }
        Ok(GpuPlan {
            model: self.model,
            shard,
            layout,
            gpu,
            gpu_memory_bytes,
            memory_utilization: util,
            weight_bytes,
            reserve_bytes: self.reserve_bytes,
            tensor_parallel: self.tensor_parallel,
            kv_dtype: self.kv_dtype,
            pool_per_gpu,
        })
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn llama8b() -> GpuPlanBuilder {
        GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("a100-80")
    }

    #[test]
    fn pool_follows_the_formula() {
        let plan = llama8b().build().unwrap();
        // floor(80 GiB x 0.9) - 8_030_261_248 x 2 - 2 GiB
        let usable = (81_920.0 * MIB as f64 * 0.9).floor() as u64;
        assert_eq!(plan.kv_pool_bytes(), usable - 16_060_522_496 - 2 * GIB);
        // A block: 16 tokens x 32 layers x 2 x 8 x 128 x 2 bytes = 2 MiB.
        assert_eq!(plan.block_bytes_per_gpu(), 2 * MIB);
        assert_eq!(plan.num_blocks(), plan.kv_pool_bytes() / (2 * MIB));
        // One group: the logged tokens are the blocks times 16.
        assert_eq!(plan.kv_cache_tokens(), plan.num_blocks() * 16);
        // 8192 tokens = 512 blocks; the null block holds nothing.
        assert_eq!(plan.max_sequences(8192), (plan.num_blocks() - 1) / 512);
        assert_eq!(plan.kv_budget_bytes(), (plan.num_blocks() - 1) * 2 * MIB);
    }

    #[test]
    fn invalid_settings_are_refused() {
        assert!(matches!(llama8b().memory_utilization(0.0).build(), Err(ConfigError::OutOfRange { .. })));
        assert!(matches!(llama8b().memory_utilization(1.5).build(), Err(ConfigError::OutOfRange { .. })));
        assert!(matches!(llama8b().memory_utilization(f64::NAN).build(), Err(ConfigError::OutOfRange { .. })));
        assert!(matches!(llama8b().gpu("tpu").build(), Err(ConfigError::UnknownName { .. })));
        assert!(matches!(llama8b().tensor_parallel(3).build(), Err(ConfigError::Conflict(_))));
        assert!(matches!(llama8b().tensor_parallel(0).build(), Err(ConfigError::Zero { .. })));
        assert!(matches!(llama8b().block_size(0).build(), Err(ConfigError::Zero { .. })));
        assert!(matches!(llama8b().weight_bytes(u64::MAX).build(), Err(ConfigError::Conflict(_))));
        let no_params = ModelSpec::builder("x").full(1, 1, 1).build().unwrap();
        assert!(matches!(GpuPlan::builder(no_params).gpu("l4").build(), Err(ConfigError::Conflict(_))));
    }

    #[test]
    fn tensor_parallel_keeps_tokens_and_multiplies_pool() {
        let spec = ModelSpec::preset("llama-3.1-8b").unwrap();
        let plan = GpuPlan::builder(spec).gpu("l4").tensor_parallel(2).build().unwrap();
        assert_eq!(plan.kv_pool_bytes(), 2 * plan.kv_pool_bytes_per_gpu());
        assert_eq!(plan.block_bytes_per_gpu(), MIB);
    }
}
