//! [`Engine`]: which inference server's allocator decides the bytes a sequence holds.

use std::fmt;
use std::str::FromStr;

use crate::ConfigError;

/// The inference server whose KV-cache allocator the byte counts follow.
///
/// - [`Engine::Vllm`] (the default): vLLM's v1 engine with its hybrid KV-cache manager — layers grouped by
///   cache type, sliding-window and chunked-attention blocks freed once they fall wholly outside the window,
///   Mamba / linear-attention state held as whole pages. The rules are listed in the [module
///   docs](crate::kv#vllms-v1-allocator-rule-by-rule).
/// - [`Engine::VllmUniform`]: the same engine with the hybrid manager switched off
///   (`--disable-hybrid-kv-cache-manager`, and what vLLM falls back to on some platforms): sliding-window
///   and chunked-attention layers are treated as full attention and keep every token. vLLM refuses to start
///   a model with Mamba or linear-attention layers this way; kvgate prices such layers as under
///   [`Engine::Vllm`] and [`GpuPlan`](crate::kv::GpuPlan) refuses the combination.
/// - [`Engine::LlamaCpp`]: llama.cpp's server (and Ollama, which embeds it) with `-c n_ctx -np n_parallel`:
///   every slot gets `n_ctx / n_parallel` tokens of cache in every layer, allocated up front whether a
///   request uses them or not.
///
/// # Examples
///
/// ```
/// use kvgate::kv::Engine;
///
/// assert_eq!(Engine::default(), Engine::Vllm);
/// assert_eq!("vllm-uniform".parse::<Engine>()?, Engine::VllmUniform);
/// let llama = Engine::llama_cpp(32_768, 4)?;
/// assert_eq!(llama.slot_tokens(), Some(8192));
/// assert_eq!(llama.to_string(), "llama.cpp (n_ctx 32768, 4 slots of 8192 tokens)");
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Engine {
    /// vLLM v1 with the hybrid KV-cache manager (vLLM's default).
    #[default]
    Vllm,
    /// vLLM v1 with the hybrid KV-cache manager off: sliding and chunked layers keep every token.
    VllmUniform,
    /// llama.cpp's server with `n_parallel` slots sharing a context of `n_ctx` tokens. Build it with
    /// [`Engine::llama_cpp`], which checks the values; a zero in either is treated as 1.
    LlamaCpp {
        /// `-c`/`--ctx-size`: tokens of cache across all slots.
        n_ctx: u32,
        /// `-np`/`--parallel`: slots, each serving one request at a time.
        n_parallel: u32,
    },
}

/// llama.cpp pads its context (and each slot's share of it) to a multiple of 256 cells
/// (`llama_context` constructor, `src/llama-context.cpp`: `GGML_PAD(n_ctx, 256)`).
pub(crate) const LLAMA_CPP_PAD: u64 = 256;

/// llama.cpp's default physical batch (`-ub`/`--ubatch-size`), which sizes its sliding-window caches.
pub(crate) const LLAMA_CPP_UBATCH: u64 = 512;

impl Engine {
    /// The names [`FromStr`] accepts (llama.cpp needs its context and slots, so it is built with
    /// [`Engine::llama_cpp`] instead).
    pub const NAMES: &'static str = "vllm, vllm-uniform";

    /// llama.cpp with `-c n_ctx -np n_parallel`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Zero`] for a zero context or slot count; [`ConfigError::Conflict`] when there are more
    /// slots than context tokens.
    pub fn llama_cpp(n_ctx: u32, n_parallel: u32) -> Result<Engine, ConfigError> {
        if n_ctx == 0 {
            return Err(ConfigError::Zero { what: "llama.cpp context (n_ctx)" });
        }
        if n_parallel == 0 {
            return Err(ConfigError::Zero { what: "llama.cpp slots (n_parallel)" });
        }
        if n_parallel > n_ctx {
            return Err(ConfigError::Conflict(format!(
                "{n_parallel} llama.cpp slots cannot share a context of {n_ctx} tokens; use fewer slots or a larger -c"
            )));
        }
        Ok(Engine::LlamaCpp { n_ctx, n_parallel })
    }

    /// Whether this is one of vLLM's allocators.
    #[must_use]
    pub const fn is_vllm(&self) -> bool {
        matches!(self, Engine::Vllm | Engine::VllmUniform)
    }

    /// Tokens of cache each llama.cpp slot holds: `pad256(pad256(n_ctx) / n_parallel)`, the per-sequence
    /// context llama.cpp computes (`n_ctx_seq` in `src/llama-context.cpp`; its KV streams are that many
    /// cells each). `None` for vLLM, which allocates blocks as sequences grow.
    #[must_use]
    pub const fn slot_tokens(&self) -> Option<u64> {
        match *self {
            Engine::LlamaCpp { n_ctx, n_parallel } => {
                let n_ctx = (n_ctx as u64).next_multiple_of(LLAMA_CPP_PAD);
                let slots = if n_parallel == 0 { 1 } else { n_parallel as u64 };
                Some((n_ctx / slots).next_multiple_of(LLAMA_CPP_PAD))
            }
            Engine::Vllm | Engine::VllmUniform => None,
        }
    }

    /// Slots of a llama.cpp server (`None` for vLLM).
    #[must_use]
    pub const fn slots(&self) -> Option<u64> {
        match *self {
            Engine::LlamaCpp { n_parallel, .. } => Some(if n_parallel == 0 { 1 } else { n_parallel as u64 }),
            Engine::Vllm | Engine::VllmUniform => None,
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Engine::Vllm => f.write_str("vllm"),
            Engine::VllmUniform => f.write_str("vllm-uniform"),
            Engine::LlamaCpp { n_ctx, .. } => write!(
                f,
                "llama.cpp (n_ctx {n_ctx}, {} slots of {} tokens)",
                self.slots().unwrap_or(1),
                self.slot_tokens().unwrap_or(0)
            ),
        }
    }
}

impl FromStr for Engine {
    type Err = ConfigError;

    /// Parses `vllm` or `vllm-uniform` (ASCII case-insensitive; `_` for `-` too).
    ///
    /// # Errors
    ///
    /// [`ConfigError::UnknownName`] for any other name, listing the accepted ones.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().replace('_', "-").as_str() {
            "vllm" => Ok(Engine::Vllm),
            "vllm-uniform" => Ok(Engine::VllmUniform),
            _ => Err(ConfigError::UnknownName { what: "engine", name: s.to_owned(), known: Self::NAMES.to_owned() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_slots_are_padded() {
        // 8192 / 3 = 2730.67 -> 2730 -> padded to 2816.
        let engine = Engine::llama_cpp(8192, 3).unwrap();
        assert_eq!(engine.slot_tokens(), Some(2816));
        // n_ctx 1000 is padded to 1024 first: 1024 / 2 = 512.
        assert_eq!(Engine::llama_cpp(1000, 2).unwrap().slot_tokens(), Some(512));
        assert_eq!(Engine::LlamaCpp { n_ctx: 0, n_parallel: 0 }.slot_tokens(), Some(0));
        assert!(matches!(Engine::llama_cpp(0, 1), Err(ConfigError::Zero { .. })));
        assert!(matches!(Engine::llama_cpp(4, 8), Err(ConfigError::Conflict(_))));
        assert_eq!(Engine::Vllm.slot_tokens(), None);
    }

    #[test]
    fn names_round_trip() {
        for engine in [Engine::Vllm, Engine::VllmUniform] {
            assert_eq!(engine.to_string().parse::<Engine>(), Ok(engine));
        }
        assert!(matches!("sglang".parse::<Engine>(), Err(ConfigError::UnknownName { .. })));
    }
}
