//! [`KvDtype`]: the element type of the KV cache.
//!
//! Plain types store every value in a whole number of bytes. llama.cpp's block-quantized types (`q8_0`,
//! `q4_0`) store values in blocks of 32 sharing one fp16 scale, so a row of `n` values takes
//! `cdiv(n, 32)` blocks; [`KvDtype::bytes_for`] is the one place that knows both rules.

use std::fmt;
use std::str::FromStr;

use crate::ConfigError;

/// The element type the KV cache is stored in.
///
/// vLLM's `--kv-cache-dtype auto` stores the cache in the model's dtype (bf16 for every preset here);
/// `fp8` (e4m3 or e5m2) halves it. llama.cpp and Ollama offer `q8_0` and `q4_0` (`--cache-type-k`,
/// `--cache-type-v`). The weights have their own type, [`WeightDtype`](crate::kv::WeightDtype), in the same
/// storage formats (its sizes and names are these).
///
/// # Examples
///
/// ```
/// use kvgate::kv::KvDtype;
///
/// let dtype: KvDtype = "fp8".parse()?;
/// assert_eq!(dtype, KvDtype::Fp8);
/// assert_eq!(dtype.bytes_for(1024), 1024);
/// assert_eq!(KvDtype::Bf16.to_string(), "bf16");
/// // q8_0: 32 values in 34 bytes (32 int8 and an fp16 scale).
/// assert_eq!("q8_0".parse::<KvDtype>()?.bytes_for(1024), 32 * 34);
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum KvDtype {
    /// bfloat16, 2 bytes: the default for every preset.
    #[default]
    Bf16,
    /// IEEE half precision, 2 bytes.
    F16,
    /// IEEE single precision, 4 bytes.
    F32,
    /// 8-bit float (e4m3 or e5m2), 1 byte.
    Fp8,
    /// llama.cpp's `q8_0`: blocks of 32 values, each 32 int8 and one fp16 scale, 34 bytes (8.5 bits a
    /// value). vLLM has no such cache type.
    Q8_0,
    /// llama.cpp's `q4_0`: blocks of 32 values, each 32 4-bit integers and one fp16 scale, 18 bytes (4.5
    /// bits a value). vLLM has no such cache type.
    Q4_0,
}

impl KvDtype {
    /// Every dtype, in the order [`KvDtype::NAMES`] lists their names.
    pub const ALL: [KvDtype; 6] =
        [KvDtype::Bf16, KvDtype::F16, KvDtype::F32, KvDtype::Fp8, KvDtype::Q8_0, KvDtype::Q4_0];

    /// The names [`FromStr`] accepts, comma-separated (as used in error messages).
    pub const NAMES: &'static str = "bf16, fp16 (f16), fp32 (f32), fp8, q8_0, q4_0";

    /// The storage block: `(values, bytes)` — one value in whole bytes for the plain types, 32 values in
    /// 34 (`q8_0`) or 18 (`q4_0`) bytes for llama.cpp's block-quantized types (ggml's `QK8_0`/`QK4_0`
    /// blocks: the quantized values and one fp16 scale).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::KvDtype;
    /// assert_eq!(KvDtype::F32.block(), (1, 4));
    /// assert_eq!(KvDtype::Q4_0.block(), (32, 18));
    /// ```
    #[must_use]
    pub const fn block(self) -> (u64, u64) {
        match self {
            KvDtype::Bf16 | KvDtype::F16 => (1, 2),
            KvDtype::F32 => (1, 4),
            KvDtype::Fp8 => (1, 1),
            KvDtype::Q8_0 => (32, 34),
            KvDtype::Q4_0 => (32, 18),
        }
    }

    /// Bytes of one row of `elements` values: `elements × bytes` for the plain types, `cdiv(elements, 32)`
    /// blocks for the block-quantized ones (llama.cpp quantizes each K and V row of a layer on its own, and
    /// its rows are multiples of 32 for every model it runs). Saturates at `u64::MAX`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::KvDtype;
    /// // One token's K row of Llama 3.1 8B (8 KV heads x 128) in one layer:
    /// assert_eq!(KvDtype::Bf16.bytes_for(1024), 2048);
    /// assert_eq!(KvDtype::Q8_0.bytes_for(1024), 1088); // 32 blocks x 34
    /// assert_eq!(KvDtype::Q4_0.bytes_for(1024), 576); // 32 blocks x 18
    /// ```
    #[must_use]
    pub const fn bytes_for(self, elements: u64) -> u64 {
        let (values, bytes) = self.block();
        elements.div_ceil(values).saturating_mul(bytes)
    }

    /// Whether vLLM can store its cache in this type (`--kv-cache-dtype`): every type but llama.cpp's
    /// block-quantized ones.
    #[must_use]
    pub const fn is_vllm_cache_type(self) -> bool {
        !matches!(self, KvDtype::Q8_0 | KvDtype::Q4_0)
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::Bf16 => "bf16",
            KvDtype::F16 => "fp16",
            KvDtype::F32 => "fp32",
            KvDtype::Fp8 => "fp8",
            KvDtype::Q8_0 => "q8_0",
            KvDtype::Q4_0 => "q4_0",
        })
    }
}

impl FromStr for KvDtype {
    type Err = ConfigError;

    /// Parses `bf16`, `fp16`/`f16`, `fp32`/`f32`, `fp8`, `q8_0` or `q4_0` (ASCII case-insensitive).
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownName`] for any other name, listing the accepted ones.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "bf16" | "bfloat16" => Ok(KvDtype::Bf16),
            "fp16" | "f16" | "float16" => Ok(KvDtype::F16),
            "fp32" | "f32" | "float32" => Ok(KvDtype::F32),
            "fp8" | "fp8_e4m3" | "fp8_e5m2" => Ok(KvDtype::Fp8),
            "q8_0" => Ok(KvDtype::Q8_0),
            "q4_0" => Ok(KvDtype::Q4_0),
            _ => Err(ConfigError::UnknownName { what: "dtype", name: s.to_owned(), known: Self::NAMES.to_owned() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_round_trips() {
        for dtype in KvDtype::ALL {
            assert_eq!(dtype.to_string().parse::<KvDtype>(), Ok(dtype));
        }
        assert_eq!("F16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert!(matches!("int4".parse::<KvDtype>(), Err(ConfigError::UnknownName { .. })));
    }

    #[test]
    fn block_formats() {
        // q8_0: 34 bytes per 32 values; q4_0: 18. A partial block costs a whole one.
        assert_eq!(KvDtype::Q8_0.bytes_for(32), 34);
        assert_eq!(KvDtype::Q8_0.bytes_for(33), 68);
        assert_eq!(KvDtype::Q4_0.bytes_for(4096), 128 * 18);
        assert_eq!(KvDtype::Q4_0.bytes_for(0), 0);
        assert_eq!(KvDtype::F32.bytes_for(u64::MAX), u64::MAX);
        assert_eq!(KvDtype::Q8_0.bytes_for(u64::MAX), u64::MAX);
        assert!(!KvDtype::Q4_0.is_vllm_cache_type() && KvDtype::Fp8.is_vllm_cache_type());
    }
}
