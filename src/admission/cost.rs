//! What a request costs in the KV budget: tokens, or the bytes the engine's KV-cache manager holds for it.

use super::prefix::{PrefixId, Split};
use crate::kv::KvLayout;
use std::sync::Arc;

/// How a request's KV reservation is computed.
#[derive(Debug, Clone)]
pub(crate) enum KvCost {
    /// `prompt_tokens + max_new_tokens` tokens.
    Tokens,
    /// At least the most bytes a sequence of `prompt_tokens + max_new_tokens` tokens holds while it grows,
    /// under the engine's allocator ([`KvLayout::max_sequence_bytes`]), times the GPUs of a tensor-parallel
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

impl KvCost {
    /// The cost of a request of `total_tokens` (prompt and reserved output) split around a prefix of
    /// `prefix_tokens` (at most the prompt less one token): the prefix's cached blocks once, and what the
    /// request adds.
    pub(crate) fn split(&self, id: PrefixId, total_tokens: u64, prefix_tokens: u64) -> Split {
        match self {
            KvCost::Tokens => Split {
                id,
                hit: prefix_tokens,
                prefix: prefix_tokens,
                suffix: total_tokens - prefix_tokens,
                alone: total_tokens,
            },
            KvCost::Bytes { layout, gpus } => Split {
                id,
                hit: layout.cache_hit_tokens(prefix_tokens),
                prefix: layout.prefix_bytes(prefix_tokens).saturating_mul(*gpus),
                suffix: layout.max_suffix_bytes(total_tokens, prefix_tokens).saturating_mul(*gpus),
                alone: self.units(total_tokens),
            },
        }
    }
}
