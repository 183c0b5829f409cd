//! [`Gpu`]: the hardware presets a [`GpuPlan`](crate::kv::GpuPlan) is sized for — memory, memory bandwidth
//! and peak dense tensor throughput — from the vendors' datasheets.
//!
//! # Invariants
//!
//! - One table ([`GPUS`]) is the only list of presets; [`Gpu::names`], [`Gpu::preset`],
//!   [`GpuPlan::gpu_names`](crate::kv::GpuPlan::gpu_names) and
//!   [`GpuPlanBuilder::gpu`](crate::kv::GpuPlanBuilder::gpu) all read it.
//! - Memory is the total `nvidia-smi` / `rocm-smi` reports (what vLLM's `gpu_memory_utilization` multiplies).
//! - Bandwidth is in bytes per second (10^9 bytes per GB/s, as datasheets count). Throughput is dense
//!   (no 2:4 structured sparsity) tensor-core FLOP/s: NVIDIA's datasheets print the sparse figure with an
//!   asterisk and state that dense is half of it, so the tables below halve the printed value.
//! - A card without fp8 tensor cores (Ampere) has no fp8 figure: [`Gpu::peak_flops`] returns `None` for it,
//!   never a made-up number.

use std::fmt;

use super::WeightDtype;
use crate::ConfigError;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Datasheets count GB/s and TFLOPS in powers of ten.
const GB: u64 = 1_000_000_000;
const TFLOPS: u64 = 1_000_000_000_000;

/// A GPU: its memory, memory bandwidth and peak dense tensor throughput.
///
/// Look one up by the preset names [`GpuPlanBuilder::gpu`](crate::kv::GpuPlanBuilder::gpu) accepts. A
/// decode step of a memory-bound server reads every active weight and the batch's KV cache once, so
/// [`memory_bandwidth`](Self::memory_bandwidth) bounds decode speed; prefill is bounded by
/// [`peak_flops`](Self::peak_flops) (about `2 × active_params` FLOPs per token).
///
/// # Examples
///
/// ```
/// use kvgate::kv::{Gpu, WeightDtype};
///
/// let h100 = Gpu::preset("h100-80")?;
/// assert_eq!(h100.memory_bandwidth(), 3_350_000_000_000); // 3.35 TB/s
/// assert_eq!(h100.peak_flops(WeightDtype::Bf16), Some(989_400_000_000_000)); // 989.4 TFLOPS dense
/// assert_eq!(h100.peak_flops(WeightDtype::Fp8), Some(1_978_900_000_000_000));
/// // Ampere has no fp8 tensor cores.
/// assert_eq!(Gpu::preset("a100-80")?.peak_flops(WeightDtype::Fp8), None);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Gpu {
    name: &'static str,
    arch: GpuArch,
    memory_bytes: u64,
    memory_bandwidth: u64,
    bf16_flops: u64,
    fp8_flops: Option<u64>,
}

/// A GPU's architecture, where it changes what an engine does (vLLM runs MLA with FlashMLA, in blocks of
/// 64 tokens, on Hopper only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GpuArch {
    /// NVIDIA Ampere (A100, A10G): compute capability 8.0 / 8.6, no fp8.
    Ampere,
    /// NVIDIA Ada Lovelace (L4, L40S, RTX 4090): compute capability 8.9.
    Ada,
    /// NVIDIA Hopper (H100, H200): compute capability 9.0.
    Hopper,
    /// AMD CDNA 3 (MI300X).
    Cdna3,
}

/// The GPU presets, in the order [`Gpu::names`] lists them.
///
/// Sources (dense throughput is half the datasheet's sparse figure where only that is printed):
///
/// - `l4`: NVIDIA L4 datasheet — 24 GB GDDR6, 300 GB/s; BF16 242 and FP8 485 TFLOPS with sparsity.
/// - `a10g`: the AWS variant of the A10 (g5 instances). Memory and bandwidth are the A10 datasheet's (24 GB
///   GDDR6, 600 GB/s). NVIDIA publishes no A10G datasheet; its tensor throughput, 70 dense FP16/BF16 TFLOPS,
///   is the figure AWS partners quote (the A10's datasheet says 125). Ampere: no fp8.
/// - `rtx-4090`: NVIDIA Ada Lovelace architecture whitepaper, appendix table — 1008 GB/s; 165.2 dense
///   BF16 TFLOPS and 330.3 dense FP8 TFLOPS, both with FP32 accumulate (GeForce runs those at half rate).
/// - `a100-40`, `a100-80`: NVIDIA A100 datasheet, SXM — 1,555 GB/s (40 GB HBM2) and 2,039 GB/s (80 GB
///   HBM2e); BF16 312 TFLOPS dense. Ampere: no fp8.
/// - `l40s`: NVIDIA L40S datasheet — 48 GB GDDR6, 864 GB/s; BF16 362.05 and FP8 733 TFLOPS dense
///   (733 and 1,466 with sparsity).
/// - `h100-80`: NVIDIA H100 datasheet, SXM — 3.35 TB/s; BF16 1,979 and FP8 3,958 TFLOPS with sparsity; the
///   Hopper architecture whitepaper gives the dense 989.4 and 1,978.9.
/// - `h200-141`: NVIDIA H200 datasheet, SXM — 141 GB HBM3e, 4.8 TB/s; the same compute as H100 SXM.
/// - `mi300x`: AMD Instinct MI300X datasheet — 192 GB HBM3, 5.3 TB/s; peak BF16 1,307.4 and FP8 2,614.9
///   TFLOPS dense (twice that with sparsity).
#[rustfmt::skip]
const GPUS: &[Gpu] = &[
    Gpu::new("l4",       GpuArch::Ada,     23_034 * MIB,   300 * GB,    121 * TFLOPS,           Some(2_425 * TFLOPS / 10)),
    Gpu::new("a10g",     GpuArch::Ampere,  23_028 * MIB,   600 * GB,    70 * TFLOPS,            None),
    Gpu::new("rtx-4090", GpuArch::Ada,     24_564 * MIB,   1_008 * GB,  1_652 * TFLOPS / 10,    Some(3_303 * TFLOPS / 10)),
    Gpu::new("a100-40",  GpuArch::Ampere,  40_960 * MIB,   1_555 * GB,  312 * TFLOPS,           None),
    Gpu::new("l40s",     GpuArch::Ada,     46_068 * MIB,   864 * GB,    36_205 * TFLOPS / 100,  Some(733 * TFLOPS)),
    Gpu::new("a100-80",  GpuArch::Ampere,  81_920 * MIB,   2_039 * GB,  312 * TFLOPS,           None),
    Gpu::new("h100-80",  GpuArch::Hopper,  81_559 * MIB,   3_350 * GB,  9_894 * TFLOPS / 10,    Some(19_789 * TFLOPS / 10)),
    Gpu::new("h200-141", GpuArch::Hopper,  143_771 * MIB,  4_800 * GB,  9_894 * TFLOPS / 10,    Some(19_789 * TFLOPS / 10)),
    Gpu::new("mi300x",   GpuArch::Cdna3,   192 * GIB,      5_300 * GB,  13_074 * TFLOPS / 10,   Some(26_149 * TFLOPS / 10)),
];

impl Gpu {
    const fn new(
        name: &'static str,
        arch: GpuArch,
        memory_bytes: u64,
        memory_bandwidth: u64,
        bf16_flops: u64,
        fp8_flops: Option<u64>,
    ) -> Gpu {
        Gpu { name, arch, memory_bytes, memory_bandwidth, bf16_flops, fp8_flops }
    }

    /// The preset called `name` (ASCII case-insensitive); see [`Gpu::names`].
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownName`] listing the known GPUs.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::Gpu;
    /// assert_eq!(Gpu::preset("MI300X")?.memory_bytes(), 192 << 30);
    /// assert!(Gpu::preset("tpu-v5").is_err());
    /// # Ok::<(), kvgate::ConfigError>(())
    /// ```
    pub fn preset(name: &str) -> Result<Gpu, ConfigError> {
        GPUS.iter().find(|g| g.name.eq_ignore_ascii_case(name)).copied().ok_or_else(|| ConfigError::UnknownName {
            what: "GPU",
            name: name.to_owned(),
            known: Self::names().join(", "),
        })
    }

    /// The names [`Gpu::preset`] accepts.
    #[must_use]
    pub fn names() -> Vec<&'static str> {
        GPUS.iter().map(|g| g.name).collect()
    }

    /// The preset's name.
    #[must_use]
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The architecture.
    #[must_use]
    pub const fn arch(&self) -> GpuArch {
        self.arch
    }

    /// Total memory, bytes.
    #[must_use]
    pub const fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Peak memory bandwidth, bytes per second.
    #[must_use]
    pub const fn memory_bandwidth(&self) -> u64 {
        self.memory_bandwidth
    }

    /// Peak dense tensor-core throughput for matrix multiplications on weights in `dtype`, FLOP/s.
    ///
    /// `Bf16` and `F16` give the 16-bit figure (equal on every preset), `Fp8` the 8-bit one (`None` on cards
    /// without fp8 tensor cores). `F32` and llama.cpp's block-quantized types give `None`: their matrix
    /// products run as 16-bit (llama.cpp dequantizes) or on CUDA cores, so no single datasheet figure
    /// applies. A [`KvDtype`](super::KvDtype) is accepted and means the weight type of the same format.
    #[must_use]
    pub fn peak_flops(&self, dtype: impl Into<WeightDtype>) -> Option<u64> {
        match dtype.into() {
            WeightDtype::Bf16 | WeightDtype::F16 => Some(self.bf16_flops),
            WeightDtype::Fp8 => self.fp8_flops,
            WeightDtype::F32 | WeightDtype::Q8_0 | WeightDtype::Q4_0 => None,
        }
    }
}

impl fmt::Display for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({:.0} GiB, {:.0} GB/s, {:.0} dense BF16 TFLOPS",
            self.name,
            self.memory_bytes as f64 / GIB as f64,
            self.memory_bandwidth as f64 / GB as f64,
            self.bf16_flops as f64 / TFLOPS as f64
        )?;
        match self.fp8_flops {
            Some(fp8) => write!(f, ", {:.0} FP8)", fp8 as f64 / TFLOPS as f64),
            None => f.write_str(", no FP8)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_consistent() {
        for name in Gpu::names() {
            let gpu = Gpu::preset(name).unwrap();
            assert_eq!(gpu.name(), name);
            let bf16 = gpu.peak_flops(WeightDtype::Bf16).unwrap();
            assert_eq!(gpu.peak_flops(WeightDtype::F16), Some(bf16));
            // Where a card has fp8, it runs about twice its 16-bit rate (the L40S datasheet: 733 vs 362.05).
            if let Some(fp8) = gpu.peak_flops(WeightDtype::Fp8) {
                assert!(fp8 * 10 >= bf16 * 19 && fp8 * 10 <= bf16 * 21, "{name}");
            }
            assert!(gpu.memory_bandwidth() > 100 * GB && gpu.memory_bytes() > 16 * GIB);
        }
        let names = Gpu::names();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
    }

    #[test]
    fn datasheet_figures() {
        let l4 = Gpu::preset("l4").unwrap();
        assert_eq!((l4.memory_bandwidth(), l4.peak_flops(WeightDtype::Fp8)), (300 * GB, Some(242_500_000_000_000)));
        assert_eq!(Gpu::preset("a10g").unwrap().peak_flops(WeightDtype::Fp8), None);
        assert_eq!(Gpu::preset("l40s").unwrap().peak_flops(WeightDtype::Bf16), Some(362_050_000_000_000));
        assert_eq!(Gpu::preset("h200-141").unwrap().memory_bandwidth(), 4_800_000_000_000);
        assert_eq!(Gpu::preset("mi300x").unwrap().peak_flops(WeightDtype::Fp8), Some(2_614_900_000_000_000));
        assert_eq!(Gpu::preset("rtx-4090").unwrap().peak_flops(WeightDtype::F32), None);
        assert_eq!(
            Gpu::preset("h100-80").unwrap().to_string(),
            "h100-80 (80 GiB, 3350 GB/s, 989 dense BF16 TFLOPS, 1979 FP8)"
        );
    }
}
