//! What a request costs in the KV budget: tokens, or the bytes the engine's KV-cache manager holds for it.

use crate::kv::KvLayout;
use std::sync::Arc;

/// How a request's KV reservation is computed.
#[derive(Debug, Clone)]
pub(crate) enum KvCost {
    /// `prompt_tokens + max_new_tokens` tokens.
    Tokens,
    /// The most bytes a sequence of `prompt_tokens + max_new_tokens` tokens holds while it grows, under
    /// the engine's allocator ([`KvLayout::max_sequence_bytes`]), times the GPUs of a tensor-parallel
    /// group (each holds its share of every request).
    Bytes { layout: Arc<KvLayout>, gpus: u64 },
}

impl KvCost {
    #[inline]
    pub(crate) fn units(&self, total_tokens: u64) -> u64 {
        match self {
            KvCost::Tokens => total_tokens,
            KvCost::Bytes { layout, gpus } => layout.max_sequence_bytes(total_tokens).saturating_mul(*gpus),
        }
    }
}
