//! Arbitrary bytes into `ModelSpec::from_hf_config`: never panics; when it returns a spec, every size
//! function is total (no panic, no overflow) for any token count, dtype, block size and engine, and the
//! documented relations hold (paged >= exact, naive >= exact, fp8 = bf16 / 2 below saturation, an engine's
//! peak >= its bytes at the same length, prefix + suffix cover the sequence).
#![no_main]

use kvgate::kv::{Engine, KvDtype, ModelSpec};
use libfuzzer_sys::fuzz_target;

pub fn check_engines(spec: &ModelSpec, tokens: u64, block: u32) {
    let engines = [Engine::Vllm, Engine::VllmUniform, Engine::LlamaCpp { n_ctx: 4096, n_parallel: 4 }];
    for engine in engines {
        for dtype in [KvDtype::Bf16, KvDtype::Fp8, KvDtype::Q4_0] {
            let Ok(layout) = spec.kv_layout(dtype, block, engine) else { continue };
            for t in [0, 1, tokens % 1_000_000, tokens, u64::MAX] {
                let now = layout.sequence_bytes(t);
                let peak = layout.max_sequence_bytes(t);
                assert!(peak >= now, "{engine}: peak {peak} < {now} at {t}");
                let prefix = t / 2;
                let _ = layout.prefill_peak_bytes(t, 8192);
                let _ = layout.max_suffix_bytes(t, prefix).saturating_add(layout.prefix_bytes(prefix));
                let _ = layout.kv_cache_tokens(layout.num_blocks(t));
            }
        }
    }
}

pub fn check_spec(spec: &ModelSpec, tokens: u64, block: u32) {
    assert!(spec.num_layers() >= 1);
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

fuzz_target!(|data: &[u8]| {
    let (tokens, block, json) = if data.len() >= 12 {
        let tokens = u64::from_le_bytes(data[..8].try_into().unwrap());
        let block = u32::from_le_bytes(data[8..12].try_into().unwrap());
        (tokens, block, &data[12..])
    } else {
        (4096, 16, data)
    };
    // Only the JSON part matters to the parser; try the whole input too, so that seed files are plain JSON.
    for bytes in [data, json] {
        let Ok(text) = std::str::from_utf8(bytes) else { continue };
        if let Ok(spec) = ModelSpec::from_hf_config(text) {
            check_spec(&spec, tokens, block);
        }
    }
});
