//! The roofline: how long one engine step takes on one GPU.
//!
//! A transformer step is bound by one of two resources (Williams, Waterman and Patterson, "Roofline: an
//! insightful visual performance model", CACM 2009):
//!
//! - **memory**: every step reads all the weights once, plus the KV cache of every sequence in the batch;
//!   at batch sizes of chat serving, decode is memory-bound. Time `(weights + KV read) / bandwidth`.
//! - **compute**: every token processed costs `2 × active parameters` FLOPs (one multiply and one add per
//!   weight); a prefill of thousands of tokens is compute-bound. Time
//!   `2 × active × tokens / (peak × efficiency)`.
//!
//! A step takes the larger of the two, plus a fixed per-step overhead (scheduling, kernel launches). All
//! figures are per GPU: under tensor parallelism each GPU reads `1/tp` of the weights and computes `1/tp`
//! of the FLOPs.
//!
//! Worked example (the unit test below checks it): Llama-3.1-8B in bf16 has 8,030,261,248 parameters, so
//! 16.06 GB of weights. An H100 SXM reads HBM3 at 3.35 TB/s (NVIDIA H100 Tensor Core GPU datasheet), so
//! one decode step at batch 1 takes at least 16.06 GB / 3.35 TB/s ≈ 4.79 ms — about 209 tokens/s for one
//! user, and nearly the same step time for 64 users, which is why continuous batching pays.
//!
//! # What the roofline leaves out
//! Attention FLOPs (`∝ context × tokens`; small next to the weight FLOPs below ~8k tokens of context for
//! 8B-class models), communication between tensor-parallel GPUs, the less-than-peak bandwidth real kernels
//! reach (about 70–90 % on H100), and CUDA-graph padding of batch sizes. Its step times are therefore a
//! lower bound; set [`Roofline::compute_efficiency`] and [`Roofline::step_overhead`] to calibrate it
//! against a measured server.

use crate::error::ConfigError;
use crate::kv::{Gpu, WeightDtype};
use std::time::Duration;

/// The figures of one GPU that bound a step: memory bandwidth and peak dense FLOP rate for the
/// weights' data type.
///
/// # Examples
///
/// ```
/// use kvgate::sim::Hardware;
///
/// // H100 SXM: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16 (NVIDIA H100 datasheet).
/// let h100 = Hardware::new(3.35e12, 989e12)?;
/// assert_eq!(h100.memory_bandwidth(), 3.35e12);
/// assert!(Hardware::new(-1.0, 1e12).is_err());
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hardware {
    memory_bandwidth: f64,
    peak_flops: f64,
}

impl Hardware {
    /// The figures of a [`Gpu`] preset (the single table of GPUs, in `kvgate::kv`), with the tensor
    /// throughput for weights in `weight_dtype`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Conflict`] when the preset has no figure for `weight_dtype` (fp8 on a card without
    /// fp8 tensor cores, or f32).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::{Gpu, WeightDtype};
    /// use kvgate::sim::Hardware;
    ///
    /// let h100 = Hardware::from_gpu(&Gpu::preset("h100-80")?, WeightDtype::Bf16)?;
    /// assert_eq!((h100.memory_bandwidth(), h100.peak_flops()), (3.35e12, 989.4e12));
    /// assert!(Hardware::from_gpu(&Gpu::preset("a100-80")?, WeightDtype::Fp8).is_err());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn from_gpu(gpu: &Gpu, weight_dtype: impl Into<WeightDtype>) -> Result<Self, ConfigError> {
        let weight_dtype = weight_dtype.into();
        let flops = gpu.peak_flops(weight_dtype).ok_or_else(|| {
            ConfigError::Conflict(format!(
                "{} has no {weight_dtype:?} tensor throughput figure; use bf16 weights or Hardware::new",
                gpu.name()
            ))
        })?;
        Self::new(gpu.memory_bandwidth() as f64, flops as f64)
    }

    /// A GPU that reads `memory_bandwidth` bytes per second and computes `peak_flops` dense FLOPs per
    /// second (in the weights' data type: bf16 for bf16 weights, fp8 for fp8).
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] when either figure is not a finite positive number.
    pub fn new(memory_bandwidth: f64, peak_flops: f64) -> Result<Self, ConfigError> {
        positive("memory bandwidth (bytes/s)", memory_bandwidth)?;
        positive("peak FLOP/s", peak_flops)?;
        Ok(Self { memory_bandwidth, peak_flops })
    }

    /// Memory bandwidth, bytes per second.
    pub fn memory_bandwidth(&self) -> f64 {
        self.memory_bandwidth
    }

    /// Peak dense FLOPs per second.
    pub fn peak_flops(&self) -> f64 {
        self.peak_flops
    }
}

pub(crate) fn positive(what: &'static str, value: f64) -> Result<(), ConfigError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(ConfigError::OutOfRange { what, reason: format!("{value}; use a finite number above 0") })
    }
}

/// Step times of one model on one GPU.
///
/// # Examples
///
/// ```
/// use kvgate::sim::{Hardware, Roofline};
/// use std::time::Duration;
///
/// let h100 = Hardware::new(3.35e12, 989e12)?;
/// // Llama-3.1-8B, bf16: 16.06 GB of weights, 8.03 B parameters all active.
/// let roofline = Roofline::new(16_060_522_496, 8_030_261_248, h100)?;
/// let step = roofline.step_time(0, 1); // one decode token, no KV yet
/// assert_eq!(step.as_micros(), 4794);  // 16.06 GB / 3.35 TB/s
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Roofline {
    weight_bytes: f64,
    active_params: f64,
    hardware: Hardware,
    efficiency: f64,
    overhead_nanos: f64,
}

/// Default share of peak FLOPs a prefill reaches. Large GEMMs reach 60–80 % of peak on H100; prefill
/// chunks of a few thousand tokens mixed with decodes reach less, so half of peak is a middle estimate.
pub const DEFAULT_COMPUTE_EFFICIENCY: f64 = 0.5;

impl Roofline {
    /// The roofline of a GPU holding `weight_bytes` of weights, with `active_params` parameters used per
    /// token (all of them for a dense model; the routed experts' share for a mixture of experts), with
    /// [`DEFAULT_COMPUTE_EFFICIENCY`] and no per-step overhead. Both counts are per GPU.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for zero weights or parameters.
    pub fn new(weight_bytes: u64, active_params: u64, hardware: Hardware) -> Result<Self, ConfigError> {
        if weight_bytes == 0 {
            return Err(ConfigError::Zero { what: "weight bytes" });
        }
        if active_params == 0 {
            return Err(ConfigError::Zero { what: "active parameters" });
        }
        Ok(Self {
            weight_bytes: weight_bytes as f64,
            active_params: active_params as f64,
            hardware,
            efficiency: DEFAULT_COMPUTE_EFFICIENCY,
            overhead_nanos: 0.0,
        })
    }

    /// The share of peak FLOPs reached, in `(0, 1]`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::OutOfRange`] outside `(0, 1]`.
    pub fn compute_efficiency(mut self, efficiency: f64) -> Result<Self, ConfigError> {
        if !(efficiency > 0.0 && efficiency <= 1.0) {
            return Err(ConfigError::OutOfRange {
                what: "compute efficiency",
                reason: format!("{efficiency}; use a share of peak FLOPs in (0, 1]"),
            });
        }
        self.efficiency = efficiency;
        Ok(self)
    }

    /// A fixed time added to every step (scheduler and launch overhead).
    #[must_use]
    pub fn step_overhead(mut self, overhead: Duration) -> Self {
        self.overhead_nanos = overhead.as_nanos() as f64;
        self
    }

    /// The GPU's figures.
    pub fn hardware(&self) -> Hardware {
        self.hardware
    }

    /// Time to read `bytes` from GPU memory.
    pub fn memory_time(&self, bytes: u64) -> Duration {
        Duration::from_nanos(self.memory_nanos(bytes as f64) as u64)
    }

    /// Time to process `tokens` tokens' worth of weight FLOPs.
    pub fn compute_time(&self, tokens: u64) -> Duration {
        Duration::from_nanos(self.compute_nanos(tokens as f64) as u64)
    }

    /// One step that processes `tokens` tokens (decode tokens plus prefill chunk tokens) and reads
    /// `kv_bytes` of KV cache besides the weights: `max(memory, compute) + overhead`.
    pub fn step_time(&self, kv_bytes: u64, tokens: u64) -> Duration {
        Duration::from_nanos(self.step_nanos(kv_bytes, tokens))
    }

    /// [`step_time`](Self::step_time) in whole nanoseconds (at least 1, so that virtual time always
    /// moves).
    pub(crate) fn step_nanos(&self, kv_bytes: u64, tokens: u64) -> u64 {
        let memory = self.memory_nanos(self.weight_bytes + kv_bytes as f64);
        let compute = self.compute_nanos(tokens as f64);
        ((memory.max(compute) + self.overhead_nanos).ceil() as u64).max(1)
    }

    fn memory_nanos(&self, bytes: f64) -> f64 {
        bytes / self.hardware.memory_bandwidth * 1e9
    }

    fn compute_nanos(&self, tokens: f64) -> f64 {
        2.0 * self.active_params * tokens / (self.hardware.peak_flops * self.efficiency) * 1e9
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked() {
        assert!(Hardware::new(f64::NAN, 1.0).is_err());
        assert!(Hardware::new(1.0, 0.0).is_err());
        let hw = Hardware::new(1e12, 1e15).unwrap();
        assert!(Roofline::new(0, 1, hw).is_err());
        assert!(Roofline::new(1, 0, hw).is_err());
        let r = Roofline::new(1, 1, hw).unwrap();
        assert!(r.compute_efficiency(0.0).is_err());
        assert!(r.compute_efficiency(1.5).is_err());
        assert!(r.compute_efficiency(1.0).is_ok());
    }
}
