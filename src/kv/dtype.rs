//! [`KvDtype`]: the element type of the KV cache (and, for weight sizing, of the weights).

use std::fmt;
use std::str::FromStr;

use crate::ConfigError;

/// The element type the KV cache is stored in.
///
/// vLLM's `--kv-cache-dtype auto` stores the cache in the model's dtype (bf16 for every preset here);
/// `fp8` (e4m3 or e5m2) halves it. The same type sizes weights in
/// [`GpuPlanBuilder::weight_dtype`](crate::kv::GpuPlanBuilder::weight_dtype).
///
/// # Examples
///
/// ```
/// use kvgate::kv::KvDtype;
///
/// let dtype: KvDtype = "fp8".parse()?;
/// assert_eq!(dtype, KvDtype::Fp8);
/// assert_eq!(dtype.bytes(), 1);
/// assert_eq!(KvDtype::Bf16.to_string(), "bf16");
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
}

impl KvDtype {
    /// Every dtype, in the order [`KvDtype::NAMES`] lists their names.
    pub const ALL: [KvDtype; 4] = [KvDtype::Bf16, KvDtype::F16, KvDtype::F32, KvDtype::Fp8];

    /// The names [`FromStr`] accepts, comma-separated (as used in error messages).
    pub const NAMES: &'static str = "bf16, fp16 (f16), fp32 (f32), fp8";

    /// Bytes per element.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::kv::KvDtype;
    /// assert_eq!(KvDtype::F32.bytes(), 4);
    /// ```
    #[must_use]
    pub const fn bytes(self) -> u64 {
        match self {
            KvDtype::Bf16 | KvDtype::F16 => 2,
            KvDtype::F32 => 4,
            KvDtype::Fp8 => 1,
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::Bf16 => "bf16",
            KvDtype::F16 => "fp16",
            KvDtype::F32 => "fp32",
            KvDtype::Fp8 => "fp8",
        })
    }
}

impl FromStr for KvDtype {
    type Err = ConfigError;

    /// Parses `bf16`, `fp16`/`f16`, `fp32`/`f32` or `fp8` (ASCII case-insensitive).
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
}
