//! [`check_spec`]: what every `ModelSpec` must satisfy, however odd the config it came from.

use kvgate::kv::{Engine, KvDtype, ModelSpec};

/// Checks that every size function of `spec` is total (no panic, no overflow) for `tokens`, `block` and the
/// extremes, for every dtype and engine, and that the documented relations hold: at least one layer, some
/// memory per token unless every layer is recurrent, paged >= exact, naive >= exact, fp8 = bf16 / 2 below
/// saturation, an engine's peak >= its bytes at the same length, prefix + suffix defined for every split.
///
/// # Panics
///
/// When a relation does not hold, or a size function panics.
pub fn check_spec(spec: &ModelSpec, tokens: u64, block: u32) {
    assert!(spec.num_layers() >= 1);
    assert!(spec.bytes_per_token(KvDtype::Bf16) > 0 || spec.recurrent_layers() > 0, "no memory per token: {spec:?}");
    check_engines(spec, tokens, block);
    for dtype in KvDtype::ALL {
        let exact = spec.kv_bytes(tokens, dtype);
        let paged = spec.kv_bytes_paged(tokens, dtype, block);
        let naive = spec.kv_bytes_naive(tokens, dtype);
        assert!(paged >= exact, "paged {paged} < exact {exact}");
        assert!(naive >= exact, "naive {naive} < exact {exact}");
        let _ = spec.bytes_per_token(dtype);
        let _ = spec.bytes_per_token_past_windows(dtype);
        let _ = spec.block_bytes(dtype, block);
        for t in [0, 1, u64::from(u32::MAX), u64::MAX] {
            let _ = spec.kv_bytes_paged(t, dtype, block);
        }
    }
    let bf16 = spec.kv_bytes(tokens, KvDtype::Bf16);
    if bf16 != u64::MAX {
        assert_eq!(spec.kv_bytes(tokens, KvDtype::Fp8) * 2, bf16);
    }
    for tp in [0, 1, 2, 3, 8, u32::MAX] {
        let _ = spec.tensor_parallel_shard(tp);
    }
}

/// The engine layouts of `spec` (where the engine accepts it): peaks (prefill peaks too) cover the steady state, and every
/// function of the layout is total.
fn check_engines(spec: &ModelSpec, tokens: u64, block: u32) {
    let engines = [Engine::Vllm, Engine::VllmUniform, Engine::LlamaCpp { n_ctx: 4096, n_parallel: 4 }];
    for engine in engines {
        for dtype in [KvDtype::Bf16, KvDtype::Fp8, KvDtype::Q4_0] {
            let Ok(layout) = spec.kv_layout(dtype, block, engine) else { continue };
            for t in [0, 1, tokens % 1_000_000, tokens, tokens.saturating_add(1), u64::MAX] {
                let now = layout.sequence_bytes(t);
                let peak = layout.max_sequence_bytes(t);
                assert!(peak >= now, "{engine}: peak {peak} < {now} at {t}");
                assert!(layout.max_sequence_bytes(t.saturating_add(1)) >= peak, "{engine}: peak not monotone at {t}");
                let prefix = t / 2;
                for chunk in [1, 512, 8192] {
                    let prefill = layout.prefill_peak_bytes(t, chunk);
                    assert!(prefill >= now, "{engine}: prefill peak {prefill} < {now} at {t} in chunks of {chunk}");
                }
                let _ = layout.max_suffix_bytes(t, prefix).saturating_add(layout.prefix_bytes(prefix));
                assert!(layout.cache_hit_tokens(prefix) <= prefix, "{engine}: a cache hit longer than its prefix");
                let _ = layout.kv_cache_tokens(layout.num_blocks(t));
            }
        }
    }
}
