//! [`WeightDtype`]: the element type of the model's weights.
//!
//! The weights are stored in the same formats a cache can be (bf16, fp8, llama.cpp's `q8_0`/`q4_0`, ...),
//! so their sizes and names come from [`KvDtype`], the one place that knows both storage rules; what
//! differs is what the type decides. For a cache it is whether an engine can store it
//! ([`KvDtype::is_vllm_cache_type`]); for weights, which tensor units a GPU multiplies them on
//! ([`Gpu::peak_flops`](super::Gpu::peak_flops)).

use std::fmt;
use std::str::FromStr;

use super::KvDtype;
use crate::ConfigError;

/// The element type the model's weights are stored in: sizes the weights from the parameter count
/// ([`GpuPlanBuilder::weight_dtype`](super::GpuPlanBuilder::weight_dtype)) and picks the tensor throughput
/// a GPU reaches on them ([`Gpu::peak_flops`](super::Gpu::peak_flops)).
///
/// A cache type converts to the weight type of the same format (`From<KvDtype>`), so
/// `weight_dtype(KvDtype::Fp8)` still means fp8 weights.
///
/// # Examples
///
/// ```
/// use kvgate::kv::{KvDtype, WeightDtype};
///
/// let dtype: WeightDtype = "q4_0".parse()?;
/// assert_eq!(dtype, WeightDtype::Q4_0);
/// // 8 billion parameters in q4_0: 32 values in 18 bytes.
/// assert_eq!(dtype.bytes_for(8_000_000_000), 4_500_000_000);
/// assert_eq!(WeightDtype::from(KvDtype::Fp8), WeightDtype::Fp8);
/// assert_eq!(WeightDtype::default().to_string(), "bf16");
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum WeightDtype {
    /// bfloat16, 2 bytes: how most checkpoints are published, and the default.
    #[default]
    Bf16,
    /// IEEE half precision, 2 bytes.
    F16,
    /// IEEE single precision, 4 bytes.
    F32,
    /// 8-bit float (e4m3 or e5m2), 1 byte: fp8-quantized checkpoints.
    Fp8,
    /// llama.cpp's `q8_0` GGUF weights: blocks of 32 values in 34 bytes.
    Q8_0,
    /// llama.cpp's `q4_0` GGUF weights: blocks of 32 values in 18 bytes.
    Q4_0,
}

impl WeightDtype {
    /// The names [`FromStr`] accepts, comma-separated (those of [`KvDtype::NAMES`]).
    pub const NAMES: &'static str = KvDtype::NAMES;

    /// The storage format, which a cache element of the same type shares.
    const fn storage(self) -> KvDtype {
        match self {
            WeightDtype::Bf16 => KvDtype::Bf16,
            WeightDtype::F16 => KvDtype::F16,
            WeightDtype::F32 => KvDtype::F32,
            WeightDtype::Fp8 => KvDtype::Fp8,
            WeightDtype::Q8_0 => KvDtype::Q8_0,
            WeightDtype::Q4_0 => KvDtype::Q4_0,
        }
    }

    /// The storage block `(values, bytes)`, as [`KvDtype::block`].
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::WeightDtype;
    /// assert_eq!(WeightDtype::Fp8.block(), (1, 1));
    /// assert_eq!(WeightDtype::Q8_0.block(), (32, 34));
    /// ```
    #[must_use]
    pub const fn block(self) -> (u64, u64) {
        self.storage().block()
    }

    /// Bytes of `params` weights, in whole blocks for the block-quantized types ([`KvDtype::bytes_for`]).
    /// Saturates at `u64::MAX`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::WeightDtype;
    /// assert_eq!(WeightDtype::Bf16.bytes_for(8_030_261_248), 16_060_522_496); // Llama 3.1 8B
    /// assert_eq!(WeightDtype::Q8_0.bytes_for(33), 68); // a partial block costs a whole one
    /// ```
    #[must_use]
    pub const fn bytes_for(self, params: u64) -> u64 {
        self.storage().bytes_for(params)
    }
}

impl From<KvDtype> for WeightDtype {
    /// The weight type stored in the same format as the cache type `dtype`.
    fn from(dtype: KvDtype) -> Self {
        match dtype {
            KvDtype::Bf16 => WeightDtype::Bf16,
            KvDtype::F16 => WeightDtype::F16,
            KvDtype::F32 => WeightDtype::F32,
            KvDtype::Fp8 => WeightDtype::Fp8,
            KvDtype::Q8_0 => WeightDtype::Q8_0,
            KvDtype::Q4_0 => WeightDtype::Q4_0,
        }
    }
}

impl fmt::Display for WeightDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.storage(), f)
    }
}

impl FromStr for WeightDtype {
    type Err = ConfigError;

    /// Parses the names [`KvDtype`] parses (`bf16`, `fp16`/`f16`, `fp32`/`f32`, `fp8`, `q8_0`, `q4_0`;
    /// ASCII case-insensitive).
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownName`] for any other name, listing the accepted ones.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<KvDtype>().map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cache_format_is_a_weight_format_with_the_same_name_and_size() {
        for dtype in KvDtype::ALL {
            let weight = WeightDtype::from(dtype);
            assert_eq!(weight.storage(), dtype);
            assert_eq!(weight.to_string(), dtype.to_string());
            assert_eq!(weight.to_string().parse::<WeightDtype>(), Ok(weight));
            assert_eq!(weight.bytes_for(1_000_003), dtype.bytes_for(1_000_003));
        }
        assert!(matches!("int4".parse::<WeightDtype>(), Err(ConfigError::UnknownName { .. })));
    }
}
