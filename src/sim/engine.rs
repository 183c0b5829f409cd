//! The engine model: one continuous-batching inference server, scheduled like vLLM's v1 scheduler, on a
//! paged KV pool sized by a [`GpuPlan`], with step times from a [`Roofline`].

use super::roofline::{Hardware, Roofline};
use crate::error::ConfigError;
use crate::kv::GpuPlan;
use std::collections::VecDeque;
use std::time::Duration;

/// vLLM's default `max_num_seqs` for its OpenAI-compatible server on GPUs with at least 70 GiB
/// (`EngineArgs._set_default_args`, `vllm/engine/arg_utils.py`); 256 on smaller GPUs.
pub const DEFAULT_MAX_NUM_SEQS: u32 = 1024;
/// vLLM's default `max_num_batched_tokens` for its OpenAI-compatible server on GPUs with at least
/// 70 GiB (same place); 2048 on smaller GPUs.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: u32 = 8192;

/// How the modelled server is configured: vLLM's scheduler settings and the GPU's figures.
///
/// # Examples
///
/// ```
/// use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
/// use kvgate::sim::{Engine, EngineConfig, Hardware};
///
/// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("h100-80").build()?;
/// let mut config = EngineConfig::for_plan(&plan, WeightDtype::Bf16)?; // H100 SXM: 3.35 TB/s, 989 TFLOP/s
/// assert_eq!(config.hardware, Hardware::new(3.35e12, 989.4e12)?);
/// config.max_num_seqs = 256;
/// let engine = Engine::new(&plan, config)?;
/// assert_eq!(engine.pool_bytes(), plan.num_blocks() * plan.block_bytes_per_gpu());
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// The GPU's memory bandwidth and peak FLOPs.
    pub hardware: Hardware,
    /// Parameters used per token; `None`: the model's
    /// [`active_params`](crate::kv::ModelSpec::active_params) (the routed experts' share for the
    /// mixture-of-experts presets, all parameters for a dense model).
    pub active_params: Option<u64>,
    /// Share of peak FLOPs a prefill reaches, in `(0, 1]`.
    pub compute_efficiency: f64,
    /// Fixed time added to every step.
    pub step_overhead: Duration,
    /// Most sequences running at once (vLLM's `--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Token budget of one step (vLLM's `--max-num-batched-tokens`).
    pub max_num_batched_tokens: u32,
    /// Whether a prompt may be prefilled over several steps (vLLM's default in v1).
    pub chunked_prefill: bool,
    /// Cap on the engine's own waiting queue; a request beyond it is refused with a 503. `None`:
    /// unbounded, as vLLM's queue is by default.
    pub max_queued: Option<usize>,
    /// Share of each prompt found in the prefix cache, in `[0, 1)`: those tokens (whole blocks) skip
    /// their prefill compute.
    pub prefix_cache_hit: f64,
    /// Longest `prompt + max_tokens` accepted (vLLM's `--max-model-len`); longer requests are refused
    /// with a 400. `None`: the smaller of 32768 and what one sequence can hold in the pool.
    pub max_model_len: Option<u32>,
}

impl EngineConfig {
    /// The configuration for `plan`'s GPU preset ([`GpuPlan::gpu_spec`]), its weights in `weight_dtype`
    /// (bf16 or fp8: the tensor throughput the prefill runs at), with the defaults of
    /// [`EngineConfig::new`].
    ///
    /// # Errors
    ///
    /// As [`Hardware::from_gpu`], and [`ConfigError::Conflict`] for a plan on a custom GPU (given by its
    /// memory only): build its [`Hardware`] with [`Hardware::new`] and use [`EngineConfig::new`].
    pub fn for_plan(plan: &GpuPlan, weight_dtype: impl Into<crate::kv::WeightDtype>) -> Result<Self, ConfigError> {
        let gpu = plan.gpu_spec().ok_or_else(|| {
            ConfigError::Conflict(format!(
                "GPU {:?} is not a preset, so its bandwidth and FLOPs are unknown: use EngineConfig::new(Hardware::new(bytes_per_s, flops))",
                plan.gpu()
            ))
        })?;
        Ok(Self::new(Hardware::from_gpu(&gpu, weight_dtype)?))
    }

    /// vLLM's defaults for a large GPU: 1024 sequences, 8192 tokens a step, chunked prefill, an
    /// unbounded queue, no prefix-cache hits, half of peak FLOPs, no step overhead.
    pub fn new(hardware: Hardware) -> Self {
        Self {
            hardware,
            active_params: None,
            compute_efficiency: super::roofline::DEFAULT_COMPUTE_EFFICIENCY,
            step_overhead: Duration::ZERO,
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS,
            chunked_prefill: true,
            max_queued: None,
            prefix_cache_hit: 0.0,
            max_model_len: None,
        }
    }
}

/// Why the engine refused a request at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineRefusal {
    /// The waiting queue is at `max_queued` (HTTP 503).
    QueueFull,
    /// `prompt + max_tokens` exceeds `max_model_len` (HTTP 400; retrying cannot help).
    TooLong {
        /// `prompt + max_tokens`.
        tokens: u64,
        /// The engine's `max_model_len`.
        max_model_len: u32,
    },
}

impl EngineRefusal {
    /// The HTTP status a server answers with.
    pub const fn http_status(&self) -> u16 {
        match self {
            EngineRefusal::QueueFull => 503,
            EngineRefusal::TooLong { .. } => 400,
        }
    }
}

/// A handle to a submitted sequence. Stale handles (of a finished or aborted sequence) are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SeqId {
    index: u32,
    generation: u32,
}

/// Something that happened to a sequence at the end of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineEvent {
    /// The sequence's first token was produced.
    FirstToken {
        /// The tag given to [`Engine::submit`].
        tag: u64,
    },
    /// The sequence produced its last token and left the engine, freeing its blocks.
    Finished {
        /// The tag given to [`Engine::submit`].
        tag: u64,
        /// Tokens it generated.
        output_tokens: u32,
    },
}

/// The engine's state and counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineStatus {
    /// Sequences in the waiting queue (never started, or preempted).
    pub waiting: usize,
    /// Sequences running.
    pub running: usize,
    /// KV bytes held (per GPU).
    pub kv_used_bytes: u64,
    /// KV pool (per GPU).
    pub kv_pool_bytes: u64,
    /// Most KV bytes ever held.
    pub peak_kv_bytes: u64,
    /// Most sequences ever running at once.
    pub peak_running: usize,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Steps run so far.
    pub steps: u64,
    /// Tokens generated so far (recomputed tokens are not counted again).
    pub tokens_generated: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SeqState {
    Free,
    Waiting,
    Running,
}

#[derive(Debug, Clone)]
struct Seq {
    tag: u64,
    prompt: u32,
    output: u32,
    generated: u32,
    /// Tokens whose KV is in the cache.
    computed: u32,
    /// KV bytes held (per GPU).
    held: u64,
    state: SeqState,
    generation: u32,
    first_token_sent: bool,
}

impl Seq {
    /// Tokens known: the prompt and what was generated so far.
    fn len(&self) -> u32 {
        self.prompt + self.generated
    }
}

/// One sequence's share of the step being run.
#[derive(Debug, Clone, Copy)]
struct Scheduled {
    index: u32,
    generation: u32,
    tokens: u32,
}

/// A continuous-batching inference server in virtual time.
///
/// # Scheduling (one step)
/// Following `vllm/v1/core/sched/scheduler.py` (`Scheduler.schedule`):
///
/// 1. **Running sequences first**, in the order they started. Each gets the tokens it still has to process
///    — one decode token, or the rest of its prompt (cut to the step's remaining token budget with
///    chunked prefill) — and the KV blocks those tokens need. When the pool cannot hold them, the *most
///    recently started* running sequence is preempted (vLLM's `self.running.pop()`), until the blocks fit
///    or the sequence preempted itself.
/// 2. **Preemption is by recompute**: the victim frees all its blocks, forgets its computed tokens and
///    returns to the *front* of the waiting queue (`waiting.prepend_request`); when it runs again it
///    prefills its prompt and the tokens it had generated (already streamed to the client, so its time to
///    first token is not reset). Every preemption is counted.
/// 3. **Waiting sequences** are admitted only in a step that preempted nobody, in FIFO order, while the
///    token budget lasts, fewer than `max_num_seqs` run, and the head's blocks fit; a head that does not
///    fit blocks those behind it (strict FIFO, as vLLM's FCFS policy).
///
/// A sequence produces a token at the end of every step that completes its pending tokens: its first at
/// the end of its prefill, then one per decode step. It finishes after its output length.
///
/// # Invariants
/// - **The pool is never over-committed**: bytes held by all sequences ≤ the pool, after every call
///   (blocks are taken only when they fit; preemption and finishing give them back).
/// - **A sequence holds exactly the paged bytes of its computed tokens** (rounded up to whole blocks,
///   sliding layers capped at their window): what `kv::ModelSpec::kv_bytes_paged` says for one GPU.
/// - **No sequence is lost**: each submitted sequence is waiting, running, finished (reported once) or
///   aborted.
/// - **Progress**: `max_model_len` tokens of one sequence fit in the pool (checked when the engine is
///   built, as vLLM checks at start-up), so a sequence alone on the GPU always fits: preemption cannot
///   livelock.
///
/// # Limits of the model
/// The pool is counted in bytes per GPU with block granularity, not as a free list of block ids;
/// prefix-cache hits skip prefill compute but their blocks are still counted for each sequence (an
/// upper bound on memory: vLLM shares those blocks); there is no swapping to CPU, no speculative
/// decoding, no priority scheduling inside the engine, and no KV-cache watermark.
///
/// # Driving it
///
/// Drive it with [`submit`](Engine::submit) and [`abort`](Engine::abort), then alternately
/// [`schedule`](Engine::schedule) (which says how long the next step takes) and
/// [`complete_step`](Engine::complete_step) (once that time has passed).
///
/// # Examples
///
/// ```
/// use kvgate::kv::{GpuPlan, ModelSpec};
/// use kvgate::sim::{Engine, EngineConfig, EngineEvent, Hardware};
///
/// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("h100-80").build()?;
/// let mut engine = Engine::new(&plan, EngineConfig::new(Hardware::new(3.35e12, 989e12)?))?;
/// engine.submit(7, 1000, 64, 3).unwrap();
/// let mut events = Vec::new();
/// let mut elapsed = std::time::Duration::ZERO;
/// while let Some(step) = engine.schedule() {
///     elapsed += step;
///     engine.complete_step(&mut events);
/// }
/// assert_eq!(events.first(), Some(&EngineEvent::FirstToken { tag: 7 }));
/// assert_eq!(events.last(), Some(&EngineEvent::Finished { tag: 7, output_tokens: 3 }));
/// assert_eq!(engine.status().kv_used_bytes, 0);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
    plan: GpuPlan,
    roofline: Roofline,
    block_size: u32,
    max_model_len: u32,
    seqs: Vec<Seq>,
    free: Vec<u32>,
    waiting: VecDeque<(u32, u32)>,
    running: Vec<u32>,
    batch: Vec<Scheduled>,
    status: EngineStatus,
}

/// Default context limit when `max_model_len` is not set.
const DEFAULT_MAX_MODEL_LEN: u32 = 32_768;

impl Engine {
    /// An idle engine serving `plan`'s model on `plan`'s GPU(s).
    ///
    /// # Errors
    ///
    /// [`ConfigError`] when a setting is out of range (`max_num_seqs` or the token budget 0, an
    /// efficiency outside `(0, 1]`, a prefix-cache hit ratio outside `[0, 1)`), when the model has no
    /// parameter count and no `active_params` is given, when `max_model_len` tokens do not fit in the KV
    /// pool, or when chunked prefill is off and the token budget is below `max_model_len` (vLLM refuses
    /// both at start-up).
    pub fn new(plan: &GpuPlan, config: EngineConfig) -> Result<Self, ConfigError> {
        if config.max_num_seqs == 0 {
            return Err(ConfigError::Zero { what: "max_num_seqs" });
        }
        if config.max_num_batched_tokens == 0 {
            return Err(ConfigError::Zero { what: "max_num_batched_tokens" });
        }
        if config.max_queued == Some(0) {
            return Err(ConfigError::Zero { what: "engine max_queued (use None for an unbounded queue)" });
        }
        if !(0.0..1.0).contains(&config.prefix_cache_hit) {
            return Err(ConfigError::OutOfRange {
                what: "prefix_cache_hit",
                reason: format!("{}; use a share of the prompt in [0, 1)", config.prefix_cache_hit),
            });
        }
        let tp = u64::from(plan.tensor_parallel());
        let active = config.active_params.or(plan.model().active_params()).ok_or_else(|| {
            ConfigError::Conflict(format!(
                "the parameter count of {} is unknown: set EngineConfig::active_params",
                plan.model().name()
            ))
        })?;
        let roofline = Roofline::new(plan.weight_bytes().div_ceil(tp), active.div_ceil(tp), config.hardware)?
            .compute_efficiency(config.compute_efficiency)?
            .step_overhead(config.step_overhead);
        let pool = plan.num_blocks() * plan.block_bytes_per_gpu();
        let max_model_len = match config.max_model_len {
            Some(0) => return Err(ConfigError::Zero { what: "max_model_len" }),
            Some(len) => {
                if plan.sequence_bytes_per_gpu(u64::from(len)) > pool {
                    return Err(ConfigError::Conflict(format!(
                        "max_model_len {len} does not fit in the KV pool ({pool} bytes per GPU); lower it, \
                         use a larger GPU or a smaller KV dtype"
                    )));
                }
                len
            }
            None => largest_fitting(plan, pool, DEFAULT_MAX_MODEL_LEN),
        };
        if !config.chunked_prefill && config.max_num_batched_tokens < max_model_len {
            return Err(ConfigError::Conflict(format!(
                "without chunked prefill the token budget ({}) must be at least max_model_len ({max_model_len})",
                config.max_num_batched_tokens
            )));
        }
        let status = EngineStatus { kv_pool_bytes: pool, ..EngineStatus::default() };
        Ok(Self {
            block_size: plan.block_size(),
            plan: plan.clone(),
            roofline,
            max_model_len,
            config,
            seqs: Vec::new(),
            free: Vec::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            batch: Vec::new(),
            status,
        })
    }

    /// The KV pool, bytes per GPU: whole blocks only (vLLM's `available_memory // page_size`).
    pub fn pool_bytes(&self) -> u64 {
        self.status.kv_pool_bytes
    }

    /// The effective `max_model_len`.
    pub fn max_model_len(&self) -> u32 {
        self.max_model_len
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The step-time model.
    pub fn roofline(&self) -> &Roofline {
        &self.roofline
    }

    /// The GPU plan the engine was built from.
    pub fn plan(&self) -> &GpuPlan {
        &self.plan
    }

    /// KV bytes per GPU a sequence of `tokens` tokens holds.
    pub fn sequence_bytes(&self, tokens: u64) -> u64 {
        self.plan.sequence_bytes_per_gpu(tokens)
    }

    /// State and counters.
    pub fn status(&self) -> EngineStatus {
        self.status
    }

    /// A first estimate of the requests per second the engine sustains for requests of `mean_prompt`
    /// and `mean_output` tokens, from the roofline alone (no queueing, no simulation):
    ///
    /// ```text
    /// batch   = min(max_num_seqs, pool / bytes(mean_prompt + mean_output / 2))
    /// decode  = step_time(batch × bytes(mean_prompt + mean_output / 2), batch)   one token for each
    /// prefill = compute_time(mean_prompt × (1 − prefix_cache_hit))              per request
    /// rate    = 1 / (prefill + mean_output × decode / batch)
    /// ```
    ///
    /// Prefill and decode are counted one after the other (a mixed step overlaps them, so the real
    /// figure can be somewhat higher). It defines "1× load" for overload experiments; the simulation
    /// measures the truth.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{GpuPlan, ModelSpec, WeightDtype};
    /// use kvgate::sim::{Engine, EngineConfig};
    ///
    /// let plan = GpuPlan::builder(ModelSpec::preset("llama-3.1-8b")?).gpu("h100-80").build()?;
    /// let engine = Engine::new(&plan, EngineConfig::for_plan(&plan, WeightDtype::Bf16)?)?;
    /// let rate = engine.capacity_estimate(990.0, 320.0);
    /// assert!((15.0..25.0).contains(&rate), "{rate}");
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn capacity_estimate(&self, mean_prompt: f64, mean_output: f64) -> f64 {
        let context = (mean_prompt + mean_output / 2.0).max(1.0).round() as u64;
        let per_seq = self.sequence_bytes(context).max(1);
        let batch = (self.pool_bytes() / per_seq).clamp(1, u64::from(self.config.max_num_seqs));
        let decode = self.roofline.step_time(batch * per_seq, batch).as_secs_f64();
        let prefill_tokens = (mean_prompt * (1.0 - self.config.prefix_cache_hit)).max(1.0).round() as u64;
        let prefill = self.roofline.compute_time(prefill_tokens).as_secs_f64();
        1.0 / (prefill + mean_output.max(1.0) * decode / batch as f64)
    }

    /// Whether anything is waiting or running.
    pub fn has_work(&self) -> bool {
        self.status.waiting + self.status.running > 0
    }

    /// Queues a request of `prompt` tokens that asked for at most `max_new_tokens` and will generate
    /// `output_tokens` (at least 1, at most `max_new_tokens`; out-of-range values are clamped). `tag` comes
    /// back in its [`EngineEvent`]s.
    ///
    /// # Errors
    ///
    /// [`EngineRefusal::TooLong`] when `prompt + max_new_tokens` exceeds `max_model_len` (or either is
    /// 0), [`EngineRefusal::QueueFull`] when the waiting queue is at `max_queued`.
    pub fn submit(
        &mut self,
        tag: u64,
        prompt: u32,
        max_new_tokens: u32,
        output_tokens: u32,
    ) -> Result<SeqId, EngineRefusal> {
        let tokens = u64::from(prompt) + u64::from(max_new_tokens);
        if prompt == 0 || max_new_tokens == 0 || tokens > u64::from(self.max_model_len) {
            return Err(EngineRefusal::TooLong { tokens, max_model_len: self.max_model_len });
        }
        if self.config.max_queued.is_some_and(|cap| self.status.waiting >= cap) {
            return Err(EngineRefusal::QueueFull);
        }
        let seq = Seq {
            tag,
            prompt,
            output: output_tokens.clamp(1, max_new_tokens),
            generated: 0,
            computed: 0,
            held: 0,
            state: SeqState::Waiting,
            generation: 0,
            first_token_sent: false,
        };
        let index = match self.free.pop() {
            Some(index) => {
                let slot = &mut self.seqs[index as usize];
                let generation = slot.generation.wrapping_add(1);
                *slot = Seq { generation, ..seq };
                index
            }
            None => {
                self.seqs.push(seq);
                (self.seqs.len() - 1) as u32
            }
        };
        let generation = self.seqs[index as usize].generation;
        self.waiting.push_back((index, generation));
        self.status.waiting += 1;
        Ok(SeqId { index, generation })
    }

    /// Removes a sequence (the client went away), freeing its blocks. Returns whether it was still
    /// waiting or running.
    pub fn abort(&mut self, id: SeqId) -> bool {
        let Some(seq) = self.seqs.get_mut(id.index as usize) else { return false };
        if seq.generation != id.generation {
            return false;
        }
        match seq.state {
            SeqState::Free => return false,
            // Its entry in the waiting queue is skipped when it reaches the head.
            SeqState::Waiting => self.status.waiting -= 1,
            SeqState::Running => {
                self.status.kv_used_bytes -= seq.held;
                if let Some(pos) = self.running.iter().position(|&i| i == id.index) {
                    self.running.remove(pos);
                }
                self.status.running = self.running.len();
            }
        }
        seq.state = SeqState::Free;
        seq.held = 0;
        self.free.push(id.index);
        true
    }

    /// Plans the next step and returns how long it takes, or `None` when there is nothing to run.
    /// Call [`complete_step`](Engine::complete_step) once that time has passed; submitting or aborting in
    /// between is allowed (an aborted sequence's share of the step is dropped).
    pub fn schedule(&mut self) -> Option<Duration> {
        loop {
            let (preempted, kv_read, tokens) = self.schedule_once();
            if !self.batch.is_empty() {
                self.status.steps += 1;
                return Some(Duration::from_nanos(self.roofline.step_nanos(kv_read, tokens)));
            }
            // A step whose only running sequence preempted itself schedules nothing; the next pass admits
            // it again from the front of the queue (it fits alone).
            if !preempted {
                return None;
            }
        }
    }

    /// Applies the step planned by [`schedule`](Engine::schedule): computed tokens advance, sequences
    /// that finished their pending tokens produce one, finished sequences leave and free their blocks.
    /// Appends what happened to `events`.
    pub fn complete_step(&mut self, events: &mut Vec<EngineEvent>) {
        let mut finished_any = false;
        for s in std::mem::take(&mut self.batch) {
            let seq = &mut self.seqs[s.index as usize];
            if seq.generation != s.generation || seq.state != SeqState::Running {
                continue;
            }
            seq.computed += s.tokens;
            if seq.computed < seq.len() {
                continue;
            }
            seq.generated += 1;
            self.status.tokens_generated += 1;
            if !seq.first_token_sent {
                seq.first_token_sent = true;
                events.push(EngineEvent::FirstToken { tag: seq.tag });
            }
            if seq.generated >= seq.output {
                self.status.kv_used_bytes -= seq.held;
                seq.held = 0;
                seq.state = SeqState::Free;
                events.push(EngineEvent::Finished { tag: seq.tag, output_tokens: seq.generated });
                self.free.push(s.index);
                finished_any = true;
            }
        }
        if finished_any {
            let seqs = &self.seqs;
            self.running.retain(|&i| seqs[i as usize].state == SeqState::Running);
            self.status.running = self.running.len();
        }
    }

    /// One scheduling pass; returns whether it preempted, the KV bytes the step reads and its tokens.
    fn schedule_once(&mut self) -> (bool, u64, u64) {
        self.batch.clear();
        let mut budget = self.config.max_num_batched_tokens;
        let mut preempted = false;
        let (mut kv_read, mut tokens) = (0u64, 0u64);
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let index = self.running[i];
            let seq = &self.seqs[index as usize];
            let pending = seq.len() - seq.computed;
            if pending > budget && !self.config.chunked_prefill {
                i += 1;
                continue;
            }
            let n = pending.min(budget);
            let need = self.extra_bytes(seq, n);
            let mut preempted_itself = false;
            while self.status.kv_pool_bytes - self.status.kv_used_bytes < need {
                let Some(victim) = self.running.pop() else { break };
                self.preempt(victim);
                preempted = true;
                if victim == index {
                    preempted_itself = true;
                    break;
                }
            }
            if preempted_itself {
                break;
            }
            let seq = &mut self.seqs[index as usize];
            seq.held += need;
            self.status.kv_used_bytes += need;
            kv_read += seq.held;
            tokens += u64::from(n);
            budget -= n;
            self.batch.push(Scheduled { index, generation: seq.generation, tokens: n });
            i += 1;
        }
        if !preempted {
            self.admit_waiting(&mut budget, &mut kv_read, &mut tokens);
        }
        self.status.running = self.running.len();
        self.status.peak_running = self.status.peak_running.max(self.running.len());
        self.status.peak_kv_bytes = self.status.peak_kv_bytes.max(self.status.kv_used_bytes);
        (preempted, kv_read, tokens)
    }

    /// Moves waiting sequences to running while the budget, `max_num_seqs` and the pool allow (FIFO).
    fn admit_waiting(&mut self, budget: &mut u32, kv_read: &mut u64, tokens: &mut u64) {
        while *budget > 0 && self.running.len() < self.config.max_num_seqs as usize {
            let Some(&(index, generation)) = self.waiting.front() else { break };
            let seq = &mut self.seqs[index as usize];
            if seq.generation != generation || seq.state != SeqState::Waiting {
                self.waiting.pop_front(); // aborted while waiting
                continue;
            }
            // Prefix-cache hits: whole blocks of the prompt, never the whole sequence.
            let cached =
                (f64::from(seq.prompt) * self.config.prefix_cache_hit) as u32 / self.block_size * self.block_size;
            seq.computed = cached.min(seq.len() - 1);
            let pending = seq.len() - seq.computed;
            if pending > *budget && !self.config.chunked_prefill {
                break;
            }
            let n = pending.min(*budget);
            let need = self.plan.sequence_bytes_per_gpu(u64::from(seq.computed + n));
            if self.status.kv_pool_bytes - self.status.kv_used_bytes < need {
                break;
            }
            self.waiting.pop_front();
            self.status.waiting -= 1;
            let seq = &mut self.seqs[index as usize];
            seq.state = SeqState::Running;
            seq.held = need;
            self.status.kv_used_bytes += need;
            *kv_read += need;
            *tokens += u64::from(n);
            *budget -= n;
            self.running.push(index);
            self.batch.push(Scheduled { index, generation, tokens: n });
        }
    }

    /// Bytes `seq` must add to hold `n` more computed tokens. A decode token needs a new block only when
    /// the last one is full, so the paged size is recomputed only then.
    fn extra_bytes(&self, seq: &Seq, n: u32) -> u64 {
        if n == 1 && seq.computed % self.block_size != 0 {
            return 0;
        }
        self.plan.sequence_bytes_per_gpu(u64::from(seq.computed + n)).saturating_sub(seq.held)
    }

    /// Preemption by recompute: free everything, back to the front of the queue.
    fn preempt(&mut self, index: u32) {
        let seq = &mut self.seqs[index as usize];
        self.status.kv_used_bytes -= seq.held;
        seq.held = 0;
        seq.computed = 0;
        seq.state = SeqState::Waiting;
        self.waiting.push_front((index, seq.generation));
        self.status.waiting += 1;
        self.status.preemptions += 1;
    }
}

/// The largest context up to `limit` tokens that one sequence can hold in `pool` bytes.
fn largest_fitting(plan: &GpuPlan, pool: u64, limit: u32) -> u32 {
    if plan.sequence_bytes_per_gpu(u64::from(limit)) <= pool {
        return limit;
    }
    let (mut lo, mut hi) = (0u32, limit); // bytes(lo) fits, bytes(hi) does not
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if plan.sequence_bytes_per_gpu(u64::from(mid)) <= pool {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo.max(1)
}
