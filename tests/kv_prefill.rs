//! Prefill peaks (`KvLayout::prefill_peak_bytes`): the bound covers the worst chunk of every schedule on
//! real and hybrid layouts, is at least the steady state and at most the prompt's blocks, and saturates at
//! the extremes instead of overflowing.

use kvgate::kv::{Engine, GroupPolicy, KvDtype, KvLayout, LayerKind, ModelSpec, RecurrentKind};

fn sliding(window: u32) -> LayerKind {
    LayerKind::Sliding { kv_heads: 1, k_head_dim: 128, v_head_dim: 128, window }
}
fn chunked(chunk: u32) -> LayerKind {
    LayerKind::ChunkedLocal { kv_heads: 1, k_head_dim: 128, v_head_dim: 128, chunk }
}
fn gdn(state_elements: u32) -> LayerKind {
    LayerKind::Recurrent { kind: RecurrentKind::GatedDeltaNet, state_elements }
}

/// Full attention and one other kind, the same page per token: the hybrid layout, `block` tokens a block.
fn hybrid(other: LayerKind, block: u32) -> KvLayout {
    let spec = ModelSpec::builder("x").full(1, 1, 128).group(1, other).build().unwrap();
    spec.kv_layout(KvDtype::Bf16, block, Engine::Vllm).unwrap()
}

/// The bytes a sequence holds during the worst chunk of any schedule, summed over the groups at the same
/// chunk: every start `s` is reachable (chunks of one token up to `s`), then the longest chunk allowed.
fn exact_worst_bytes(layout: &KvLayout, prompt: u64, chunk: u64) -> u64 {
    let mut worst = 0u64;
    for s in 0..prompt {
        let e = s.saturating_add(chunk).min(prompt);
        let mut blocks = 0u64;
        for g in layout.groups() {
            let b = g.block_tokens();
            let held = match g.policy() {
                GroupPolicy::Full => e.div_ceil(b),
                GroupPolicy::State => 1,
                GroupPolicy::Sliding { window } => e.div_ceil(b) - (s + 1).saturating_sub(u64::from(window)) / b,
                GroupPolicy::Chunked { chunk: c } => e.div_ceil(b) - s / u64::from(c) * u64::from(c) / b,
                policy => panic!("no model of {policy:?}"),
            };
            blocks += held * u64::from(g.groups());
        }
        worst = worst.max(blocks);
    }
    worst * layout.block_bytes()
}

fn layouts() -> Vec<(String, KvLayout)> {
    let mut out = Vec::new();
    let specs: Vec<ModelSpec> = vec![
        ModelSpec::preset("gemma-3-27b").unwrap(),
        ModelSpec::preset("gpt-oss-20b").unwrap(),
        ModelSpec::preset("qwen3-next-80b-a3b").unwrap(),
        ModelSpec::preset("mistral-7b").unwrap(),
        ModelSpec::builder("l4").full(1, 1, 128).group(3, chunked(64)).build().unwrap(),
        ModelSpec::builder("l4b").full(1, 1, 128).group(3, chunked(37)).build().unwrap(),
        // A recurrent state raises the attention blocks to its page (thousands of tokens a block).
        ModelSpec::builder("gdn-c").full(1, 1, 128).group(1, chunked(1730)).group(1, gdn(4_000_000)).build().unwrap(),
        ModelSpec::builder("gdn-s").full(1, 1, 128).group(1, sliding(33)).group(1, gdn(400_000)).build().unwrap(),
        ModelSpec::builder("mixed").full(2, 1, 64).group(1, sliding(5)).group(1, chunked(7)).build().unwrap(),
    ];
    for spec in specs {
        for block in [1u32, 7, 16] {
            for engine in [Engine::Vllm, Engine::VllmUniform] {
                if let Ok(l) = spec.kv_layout(KvDtype::Bf16, block, engine) {
                    out.push((format!("{} block {block} {engine}", spec.name()), l));
                }
            }
        }
    }
    out
}

#[test]
fn prefill_peak_bounds_the_exact_worst_chunk_of_real_layouts() {
    for (name, layout) in layouts() {
        let max_block = layout.groups().iter().map(|g| g.block_tokens()).filter(|&b| b != u64::MAX).max().unwrap();
        for chunk in [1u64, 2, 7, 100, 513, u64::MAX] {
            let mut prompts: Vec<u64> = (1..200).collect();
            prompts.extend((200..3000).step_by(37));
            prompts.extend([max_block - 1, max_block, max_block + 1, 2 * max_block + 3]);
            for prompt in prompts {
                let bound = layout.prefill_peak_bytes(prompt, chunk);
                let worst = exact_worst_bytes(&layout, prompt, chunk);
                assert!(bound >= worst, "{name}: prompt {prompt} chunk {chunk}: bound {bound} < real {worst}");
                assert!(bound >= layout.sequence_bytes(prompt), "{name}: prompt {prompt} chunk {chunk}");
                let all: u64 = layout
                    .groups()
                    .iter()
                    .map(|g| prompt.div_ceil(g.block_tokens()) * u64::from(g.groups()))
                    .sum::<u64>()
                    * layout.block_bytes();
                assert!(bound <= all, "{name}: prompt {prompt} chunk {chunk}: {bound} > prompt's blocks {all}");
            }
        }
    }
}

#[test]
fn llama_cpp_prefill_peak_is_the_steady_state() {
    let spec = ModelSpec::preset("gemma-3-27b").unwrap();
    let l = spec.kv_layout(KvDtype::Bf16, 16, Engine::llama_cpp(4096, 4).unwrap()).unwrap();
    for p in [0u64, 1, 1024, 4096, 4097, u64::MAX] {
        for c in [0u64, 1, 512, u64::MAX] {
            assert_eq!(l.prefill_peak_bytes(p, c), l.sequence_bytes(p));
        }
    }
}

#[test]
fn block_of_one_token_at_the_largest_prompt_saturates() {
    // The bound adds a block to `cdiv(tokens, 1)` = u64::MAX tokens: it must saturate, not wrap to 0.
    let cases = [
        ("sliding beside full", hybrid(sliding(4), 1), u64::MAX),
        ("chunked beside full", hybrid(chunked(8192), 1), u64::MAX),
        ("sliding, smallest overflowing chunk", hybrid(sliding(4096), 1), u64::MAX - 4095),
        (
            "mistral-7b (sliding only)",
            ModelSpec::preset("mistral-7b").unwrap().kv_layout(KvDtype::Bf16, 1, Engine::Vllm).unwrap(),
            u64::MAX,
        ),
        (
            "chunked only",
            ModelSpec::builder("chunked-only")
                .group(4, chunked(8192))
                .build()
                .unwrap()
                .kv_layout(KvDtype::Bf16, 1, Engine::Vllm)
                .unwrap(),
            u64::MAX,
        ),
    ];
    for (name, layout, chunk) in cases {
        let now = layout.sequence_bytes(u64::MAX);
        let peak = layout.prefill_peak_bytes(u64::MAX, chunk);
        assert!(peak >= now, "{name}: prefill peak {peak} < steady state {now}");
    }
}
