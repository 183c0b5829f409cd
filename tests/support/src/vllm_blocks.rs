//! A block-by-block simulation of what vLLM's allocator holds for requests sharing a cached prefix, to
//! check `KvLayout`'s closed forms against.
//!
//! Each group of a layout holds, for a sequence of `n` token slots (`n − 1` computed), the blocks
//! `skipped(n − 1) / b .. cdiv(n, b)`: sliding layers skip `max(0, c − window + 1)` tokens, chunked-local
//! layers `(c / size) × size`, full layers none; a recurrent state is one block of the sequence's own.
//! The first request computes the prefix itself, so its whole blocks inside the prefix are the cached
//! ones; a later request takes `hit` tokens from the cache — at most its prompt less one token, in whole
//! multiples of the least common multiple of the groups' block sizes (`HybridKVCacheCoordinator`) — and
//! shares the cached blocks below the hit that it holds. Every other block is a request's own.

use kvgate::kv::{GroupPolicy, KvLayout};
use std::collections::BTreeSet;

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Tokens a later request takes from the cache: `min(prefix, prompt − 1)` in whole multiples of every
/// group's block.
pub fn hit(layout: &KvLayout, prefix: u64, prompt: u64) -> u64 {
    let align = layout
        .groups()
        .iter()
        .map(|g| g.block_tokens())
        .filter(|&b| b != u64::MAX)
        .fold(1u64, |a, b| (a / gcd(a, b)).saturating_mul(b));
    prefix.min(prompt.saturating_sub(1)) / align * align
}

/// Bytes requests of `lengths` token slots hold together (the first computed the `prefix` itself; each
/// later one hit the cache for [`hit`] tokens of a `prompt`-token prompt), shared blocks counted once.
///
/// # Panics
///
/// On a group policy this simulation does not know.
pub fn held_together(layout: &KvLayout, prefix: u64, prompt: u64, lengths: &[u64]) -> u64 {
    let hit = hit(layout, prefix, prompt);
    let mut blocks = 0u64;
    for g in layout.groups() {
        let b = g.block_tokens();
        if g.policy() == GroupPolicy::State {
            blocks += lengths.iter().filter(|&&n| n > 0).count() as u64 * u64::from(g.groups());
            continue;
        }
        let mut shared = BTreeSet::new();
        let mut own = 0u64;
        for (i, &n) in lengths.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let c = n - 1;
            let skipped = match g.policy() {
                GroupPolicy::Full => 0,
                GroupPolicy::Sliding { window } => (c + 1).saturating_sub(u64::from(window)),
                GroupPolicy::Chunked { chunk } => c / u64::from(chunk) * u64::from(chunk),
                policy => panic!("no simulation of {policy:?}"),
            };
            let cached = if i == 0 { prefix / b } else { hit / b };
            for index in skipped / b..n.div_ceil(b) {
                if index < cached {
                    shared.insert(index);
                } else {
                    own += 1;
                }
            }
        }
        blocks += (shared.len() as u64 + own) * u64::from(g.groups());
    }
    blocks * layout.block_bytes()
}
