//! Properties of the KV-memory model over random layer layouts (the `config.json` parser's are in
//! `kv_hf_config_proptest.rs`).

use kvgate::kv::{Engine, KvDtype, LayerKind, ModelSpec, NoKvReason, RecurrentKind};
use proptest::prelude::*;

fn kind() -> impl Strategy<Value = LayerKind> {
    prop_oneof![
        (1u32..=64, 1u32..=512, 1u32..=512)
            .prop_map(|(kv_heads, k_head_dim, v_head_dim)| { LayerKind::Full { kv_heads, k_head_dim, v_head_dim } }),
        (1u32..=64, 1u32..=512, 1u32..=512, 1u32..=200_000).prop_map(|(kv_heads, k, v, window)| {
            LayerKind::Sliding { kv_heads, k_head_dim: k, v_head_dim: v, window }
        }),
        (1u32..=2048).prop_map(|latent_dim| LayerKind::Mla { latent_dim }),
        Just(LayerKind::NoKv(NoKvReason::SharedKv)),
    ]
}

/// A spec of 1 to 5 groups with at least one layer holding a cache.
fn spec() -> impl Strategy<Value = ModelSpec> {
    (prop::collection::vec((1u32..=128, kind()), 1..=5), 1u32..=64, 1u32..=64).prop_map(|(groups, kv, dim)| {
        groups
            .into_iter()
            .fold(ModelSpec::builder("random").full(1, kv, dim), |b, (layers, kind)| b.group(layers, kind))
            .build()
            .expect("valid by construction")
    })
}

fn max_window(spec: &ModelSpec) -> u64 {
    spec.groups()
        .iter()
        .filter_map(|g| match g.kind() {
            LayerKind::Sliding { window, .. } => Some(u64::from(window)),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

const TOKENS: u64 = 10_000_000;

proptest! {
    #![proptest_config(support::proptest_config(256))]

    #[test]
    fn kv_bytes_is_monotone(spec in spec(), t in 0..TOKENS, d in 0..TOKENS, dtype in prop::sample::select(KvDtype::ALL.to_vec())) {
        prop_assert!(spec.kv_bytes(t, dtype) <= spec.kv_bytes(t + d, dtype));
        prop_assert!(spec.kv_bytes_naive(t, dtype) <= spec.kv_bytes_naive(t + d, dtype));
    }

    #[test]
    fn monotone_and_panic_free_up_to_saturation(spec in spec(), t in any::<u64>(), d in any::<u64>(), block in any::<u32>()) {
        let u = t.saturating_add(d);
        prop_assert!(spec.kv_bytes(t, KvDtype::F32) <= spec.kv_bytes(u, KvDtype::F32));
        prop_assert!(spec.kv_bytes_paged(t, KvDtype::F32, block) >= spec.kv_bytes(t, KvDtype::F32));
        prop_assert!(spec.kv_bytes_naive(t, KvDtype::F32) >= spec.kv_bytes(t, KvDtype::F32));
    }

    #[test]
    fn paged_covers_real_by_less_than_a_block_per_layer(spec in spec(), t in 0..TOKENS, block in 1u32..=512) {
        let real = spec.kv_bytes(t, KvDtype::Bf16);
        let paged = spec.kv_bytes_paged(t, KvDtype::Bf16, block);
        prop_assert!(paged >= real);
        // Each layer wastes at most block - 1 token slots.
        prop_assert!(paged - real <= spec.bytes_per_token(KvDtype::Bf16) * u64::from(block - 1));
        // With t and every window a whole number of blocks, nothing is rounded.
        let aligned = t % u64::from(block) == 0
            && spec.groups().iter().all(|g| match g.kind() {
                LayerKind::Sliding { window, .. } => window % block == 0,
                _ => true,
            });
        if aligned {
            prop_assert_eq!(paged, real);
        }
    }

    #[test]
    fn sliding_layers_stop_growing_past_the_window(spec in spec(), extra in 0..TOKENS, d in 0..TOKENS) {
        // Past every window only full and MLA layers grow, at bytes_per_token_past_windows per token.
        let t = max_window(&spec) + extra;
        let grow = spec.kv_bytes(t + d, KvDtype::Bf16) - spec.kv_bytes(t, KvDtype::Bf16);
        prop_assert_eq!(grow, d * spec.bytes_per_token_past_windows(KvDtype::Bf16));
        // A model of sliding layers only stops growing altogether.
        let sliding_only = ModelSpec::builder("s").sliding(4, 8, 128, 1000).build().unwrap();
        prop_assert_eq!(sliding_only.kv_bytes(1000 + extra, KvDtype::Bf16), sliding_only.kv_bytes(1000, KvDtype::Bf16));
    }

    #[test]
    fn fp8_is_half_of_bf16(spec in spec(), t in 0..TOKENS, block in 1u32..=256) {
        prop_assert_eq!(spec.kv_bytes(t, KvDtype::Fp8) * 2, spec.kv_bytes(t, KvDtype::Bf16));
        prop_assert_eq!(spec.kv_bytes_paged(t, KvDtype::Fp8, block) * 2, spec.kv_bytes_paged(t, KvDtype::Bf16, block));
        prop_assert_eq!(spec.kv_bytes(t, KvDtype::F16), spec.kv_bytes(t, KvDtype::Bf16));
        prop_assert_eq!(spec.kv_bytes(t, KvDtype::F32), 2 * spec.kv_bytes(t, KvDtype::Bf16));
    }

    #[test]
    fn naive_is_at_least_real_and_equal_below_every_window(spec in spec(), t in 0..TOKENS) {
        prop_assert!(spec.kv_bytes_naive(t, KvDtype::Bf16) >= spec.kv_bytes(t, KvDtype::Bf16));
        let below = t.min(spec.groups().iter().filter_map(|g| match g.kind() {
            LayerKind::Sliding { window, .. } => Some(u64::from(window)),
            _ => None,
        }).min().unwrap_or(u64::MAX));
        prop_assert_eq!(spec.kv_bytes_naive(below, KvDtype::Bf16), spec.kv_bytes(below, KvDtype::Bf16));
        prop_assert_eq!(spec.kv_bytes(below, KvDtype::Bf16), below * spec.bytes_per_token(KvDtype::Bf16));
    }
}

/// Layers for the engine properties: attention of every kind, MLA and recurrent state, small enough that
/// page sizes stay unifiable in most draws (the others are skipped where a layout is refused).
fn engine_kind() -> impl Strategy<Value = LayerKind> {
    let heads = prop::sample::select(vec![1u32, 2, 4, 8]);
    let dim = prop::sample::select(vec![64u32, 128, 256]);
    prop_oneof![
        (heads.clone(), dim.clone()).prop_map(|(kv_heads, d)| LayerKind::Full {
            kv_heads,
            k_head_dim: d,
            v_head_dim: d
        }),
        (heads.clone(), dim.clone(), 1u32..=5000).prop_map(|(kv_heads, d, window)| {
            LayerKind::Sliding { kv_heads, k_head_dim: d, v_head_dim: d, window }
        }),
        (heads, dim, 1u32..=5000).prop_map(|(kv_heads, d, chunk)| {
            LayerKind::ChunkedLocal { kv_heads, k_head_dim: d, v_head_dim: d, chunk }
        }),
        prop::sample::select(vec![256u32, 576]).prop_map(|latent_dim| LayerKind::Mla { latent_dim }),
        (1u32..=600_000)
            .prop_map(|state_elements| LayerKind::Recurrent { kind: RecurrentKind::GatedDeltaNet, state_elements }),
    ]
}

fn engine_spec() -> impl Strategy<Value = ModelSpec> {
    spec_of(engine_kind().boxed())
}

/// Like [`engine_spec`] without recurrent layers.
fn attention_spec() -> impl Strategy<Value = ModelSpec> {
    spec_of(engine_kind().prop_filter("attention only", |k| !matches!(k, LayerKind::Recurrent { .. })).boxed())
}

fn spec_of(kind: BoxedStrategy<LayerKind>) -> impl Strategy<Value = ModelSpec> {
    (prop::collection::vec((1u32..=40, kind), 1..=4), 1u32..=8).prop_map(|(groups, kv)| {
        groups
            .into_iter()
            .fold(ModelSpec::builder("random").full(1, kv, 128), |b, (layers, kind)| b.group(layers, kind))
            .build()
            .expect("valid by construction")
    })
}

fn engine() -> impl Strategy<Value = Engine> {
    prop_oneof![
        Just(Engine::Vllm),
        Just(Engine::VllmUniform),
        (1u32..=200_000, 1u32..=16).prop_map(|(n_ctx, n)| Engine::llama_cpp(n_ctx.max(n), n).unwrap()),
    ]
}

fn block() -> impl Strategy<Value = u32> {
    prop::sample::select(vec![1u32, 7, 16, 32, 64, 128])
}

proptest! {
    #![proptest_config(support::proptest_config(128))]

    #[test]
    fn peak_is_monotone_and_covers_every_shorter_length(
        spec in engine_spec(), engine in engine(), block in block(), t in 0u64..200_000, d in 0u64..20_000, n in 0u64..200_000,
    ) {
        let Ok(layout) = spec.kv_layout(KvDtype::Bf16, block, engine) else { return Ok(()) };
        prop_assert!(layout.max_sequence_bytes(t) <= layout.max_sequence_bytes(t + d));
        let n = n.min(t);
        prop_assert!(layout.sequence_bytes(n) <= layout.max_sequence_bytes(t), "at {} of {}", n, t);
    }

    #[test]
    fn vllm_holds_at_least_every_token_each_layer_needs(spec in engine_spec(), block in block(), t in 0u64..500_000) {
        let Ok(layout) = spec.kv_layout(KvDtype::Bf16, block, Engine::Vllm) else { return Ok(()) };
        prop_assert!(layout.sequence_bytes(t) >= spec.kv_bytes(t, KvDtype::Bf16));
    }

    #[test]
    fn uniform_engine_keeps_every_token_in_whole_blocks(spec in attention_spec(), block in block(), t in 0u64..500_000) {
        // Without recurrent layers the manager-off layout is one group: cdiv(t, block) blocks of every
        // layer, the naive count rounded up to blocks.
        let uniform = spec.sequence_bytes(t, KvDtype::Bf16, block, Engine::VllmUniform);
        let full = spec.groups().iter().map(|g| g.kind().as_full().bytes_per_token(KvDtype::Bf16) * u64::from(g.layers())).sum::<u64>();
        prop_assert_eq!(uniform, t.div_ceil(u64::from(block)) * u64::from(block) * full);
    }

    #[test]
    fn uniform_engine_never_holds_less_without_padding(
        kinds in prop::collection::vec(engine_kind(), 1..=4), layers in 1u32..=12, block in block(), t in 0u64..300_000,
    ) {
        // Every type has the same layer count and page (one KV head of 128, no state): no padding and no
        // page unification, so switching the manager off can only keep more.
        let spec = kinds
            .into_iter()
            .filter_map(|k| match k {
                LayerKind::Sliding { window, .. } => Some(LayerKind::Sliding { kv_heads: 1, k_head_dim: 128, v_head_dim: 128, window }),
                LayerKind::ChunkedLocal { chunk, .. } => Some(LayerKind::ChunkedLocal { kv_heads: 1, k_head_dim: 128, v_head_dim: 128, chunk }),
                _ => None,
            })
            .fold(ModelSpec::builder("same").full(layers, 1, 128), |b, kind| b.group(layers, kind))
            .build()
            .unwrap();
        prop_assume!(spec.groups().len() == (spec.num_layers() / layers) as usize);
        let hybrid = spec.sequence_bytes(t, KvDtype::Bf16, block, Engine::Vllm);
        prop_assert!(spec.sequence_bytes(t, KvDtype::Bf16, block, Engine::VllmUniform) >= hybrid);
        prop_assert!(hybrid >= spec.kv_bytes(t, KvDtype::Bf16));
    }

    #[test]
    fn shared_prefix_and_suffix_cover_the_sequence(
        spec in engine_spec(), block in block(), p in 0u64..50_000, n in 0u64..50_000, t in 0u64..50_000,
    ) {
        // For every length n between the prefix and the request's end: what the request holds is at most the
        // prefix (charged once) plus its own suffix charge.
        let Ok(layout) = spec.kv_layout(KvDtype::Bf16, block, Engine::Vllm) else { return Ok(()) };
        let t = t.max(p);
        let n = n.clamp(p, t);
        let charged = layout.prefix_bytes(p).saturating_add(layout.max_suffix_bytes(t, p));
        prop_assert!(layout.sequence_bytes(n) <= charged, "n {} p {} t {}", n, p, t);
        prop_assert!(layout.max_suffix_bytes(t, p) <= layout.max_sequence_bytes(t));
        prop_assert_eq!(layout.max_suffix_bytes(t, 0), layout.max_sequence_bytes(t));
    }

    #[test]
    fn requests_sharing_a_cached_prefix_hold_at_most_its_charge(
        spec in engine_spec(), block in block(), p in 1u64..3_000, prompt in 1u64..3_000, grow in 0u64..1_000,
        lengths in prop::collection::vec(0u64..1_000, 1..=4),
    ) {
        // Admission charges the prefix once and each request its suffix, with the prefix cut to the prompt
        // less one token; the simulation holds what vLLM's cache hits leave each request.
        let Ok(layout) = spec.kv_layout(KvDtype::Bf16, block, Engine::Vllm) else { return Ok(()) };
        let p = p.min(prompt - 1);
        let t = prompt + grow;
        let lengths: Vec<u64> = lengths.iter().map(|n| prompt + n % (grow + 1)).collect();
        let held = support::vllm_blocks::held_together(&layout, p, prompt, &lengths);
        let charged = layout.prefix_bytes(p) + lengths.len() as u64 * layout.max_suffix_bytes(t, p);
        prop_assert!(held <= charged, "p {} prompt {} t {} lengths {:?}: held {} > charged {}", p, prompt, t, lengths, held, charged);
    }

    #[test]
    fn prefill_peak_is_at_least_the_steady_state(spec in engine_spec(), block in block(), p in 0u64..100_000, chunk in 128u64..16_384) {
        let Ok(layout) = spec.kv_layout(KvDtype::Bf16, block, Engine::Vllm) else { return Ok(()) };
        prop_assert!(layout.prefill_peak_bytes(p, chunk) >= layout.sequence_bytes(p));
    }

    #[test]
    fn fp8_halves_an_attention_only_layout(spec in attention_spec(), block in block(), t in 0u64..500_000) {
        let Ok(bf16) = spec.kv_layout(KvDtype::Bf16, block, Engine::Vllm) else { return Ok(()) };
        let fp8 = spec.kv_layout(KvDtype::Fp8, block, Engine::Vllm).unwrap();
        prop_assert_eq!(fp8.sequence_bytes(t) * 2, bf16.sequence_bytes(t));
    }
}
