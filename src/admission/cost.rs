//! What a request costs in the KV budget: tokens, or the bytes a paged KV cache holds for it.

use crate::kv::{KvDtype, ModelSpec};
use std::sync::Arc;

/// How a request's KV reservation is computed.
#[derive(Debug, Clone)]
pub(crate) enum KvCost {
    /// `prompt_tokens + max_new_tokens` tokens.
    Tokens,
    /// The bytes a sequence of `prompt_tokens + max_new_tokens` tokens holds in a paged KV cache.
    Bytes { spec: Arc<ModelSpec>, dtype: KvDtype, block_size: u32 },
}

impl KvCost {
    #[inline]
    pub(crate) fn units(&self, total_tokens: u64) -> u64 {
        match self {
            KvCost::Tokens => total_tokens,
            KvCost::Bytes { spec, dtype, block_size } => spec.kv_bytes_paged(total_tokens, *dtype, *block_size),
        }
    }
}
