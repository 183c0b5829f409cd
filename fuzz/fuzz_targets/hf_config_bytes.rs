//! Arbitrary bytes into `ModelSpec::from_hf_config`: never panics; when it returns a spec, it passes
//! `support::kv::check_spec` (shared with `tests/kv_hf_config_proptest.rs` and `hf_config_json`): every
//! size function is total (no panic, no overflow) for any token count, dtype, block size and engine, and
//! the documented relations hold (paged >= exact, naive >= exact, fp8 = bf16 / 2 below saturation, an
//! engine's peak >= its bytes at the same length and monotone).
#![no_main]

use kvgate::kv::ModelSpec;
use libfuzzer_sys::fuzz_target;
use support::kv::check_spec;

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
