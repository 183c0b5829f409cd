//! `ModelSpec::from_hf_config` on random and mutated `config.json` text: it never panics, and a spec it
//! returns passes the same checks as in the `hf_config_json` and `hf_config_bytes` fuzz targets
//! (`support::kv::check_spec`). The vocabulary is `support::hf`, shared with those targets.
#![cfg(feature = "hf-config")]

use kvgate::kv::ModelSpec;
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::sample::select(support::hf::words()).prop_map(|s| Value::String(s.to_owned())),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    // The parser's vocabulary (shared with the `hf_config_json` fuzz target), so random objects reach deep into it.
    prop_oneof![prop::sample::select(support::hf::words()).prop_map(str::to_owned), ".{0,8}"]
}

fn interesting() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        Just(json!(0)),
        Just(json!(-1)),
        Just(json!(1)),
        Just(json!(3)),
        Just(json!(u64::from(u32::MAX))),
        Just(json!(u64::from(u32::MAX) + 1)),
        Just(json!(u64::MAX)),
        Just(json!(1e300)),
        Just(json!(2.5)),
        Just(json!("sliding_attention")),
        Just(json!(["full_attention", "bogus"])),
        Just(json!({})),
        Just(json!(true)),
        value(),
    ]
}

fn bases() -> Vec<Value> {
    vec![
        json!({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 8}),
        json!({"model_type": "gemma3", "text_config": {"head_dim": 128, "hidden_size": 5376,
               "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
               "sliding_window": 1024}, "vision_config": {"num_hidden_layers": 27}}),
        json!({"model_type": "gpt_oss", "head_dim": 64, "num_hidden_layers": 4, "num_attention_heads": 64,
               "num_key_value_heads": 8, "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}),
        json!({"model_type": "deepseek_v3", "num_hidden_layers": 61, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "num_key_value_heads": 128}),
        json!({"model_type": "qwen3_next", "num_hidden_layers": 48, "full_attention_interval": 4,
               "head_dim": 256, "num_key_value_heads": 2, "num_attention_heads": 16}),
        json!({"model_type": "gemma4", "text_config": {"num_hidden_layers": 2, "num_key_value_heads": 8,
               "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
               "num_kv_shared_layers": 1, "sliding_window": 1024,
               "layer_types": ["sliding_attention", "full_attention"]}}),
        json!({"model_type": "jamba", "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "hidden_size": 4096, "attn_layer_period": 8, "attn_layer_offset": 4}),
        json!({"model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28,
               "num_key_value_heads": 4, "hidden_size": 3584, "sliding_window": 131072,
               "use_sliding_window": true, "max_window_layers": 21}),
    ]
}

/// Sets, replaces or removes `key` in the object at the root or under `text_config`.
fn mutate(mut config: Value, nested: bool, key: &str, new: Option<Value>) -> Value {
    let target = match config.get_mut("text_config") {
        Some(Value::Object(obj)) if nested => obj,
        _ => config.as_object_mut().expect("bases are objects"),
    };
    match new {
        Some(v) => {
            target.insert(key.to_owned(), v);
        }
        None => {
            target.remove(key);
        }
    }
    config
}

/// A spec the parser returns passes the checks the fuzz targets apply.
fn sane(json: &str) {
    if let Ok(spec) = ModelSpec::from_hf_config(json) {
        support::kv::check_spec(&spec, 32_768, 16);
    }
}

proptest! {
    #![proptest_config(support::proptest_config(256))]

    #[test]
    fn parser_never_panics_on_arbitrary_json(v in value()) {
        sane(&v.to_string());
    }

    #[test]
    fn parser_never_panics_on_arbitrary_objects(fields in prop::collection::vec((key(), interesting()), 0..12)) {
        let obj: Map<String, Value> = fields.into_iter().collect();
        sane(&Value::Object(obj).to_string());
    }

    #[test]
    fn parser_never_panics_on_mutated_configs(
        base in prop::sample::select(bases()),
        edits in prop::collection::vec((any::<bool>(), key(), prop::option::weighted(0.8, interesting())), 1..4),
    ) {
        let mut config = base;
        for (nested, key, new) in edits {
            config = mutate(config, nested, &key, new);
        }
        sane(&config.to_string());
    }

    #[test]
    fn parser_never_panics_on_truncated_text(base in prop::sample::select(bases()), cut in 0usize..400) {
        let text = base.to_string();
        let cut = cut.min(text.len());
        sane(&text[..cut]);
    }
}

#[test]
fn every_base_parses() {
    for base in bases() {
        ModelSpec::from_hf_config(&base.to_string()).unwrap();
    }
}
