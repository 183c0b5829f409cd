//! Structured `config.json` fuzzing: `arbitrary` builds a JSON object from the keys the parser reads (and
//! a few it must ignore), each with a random value of a random type — small and edge integers, negatives,
//! floats, strings, nulls, lists of layer types, nested `text_config` objects — serialised with
//! serde_json. The vocabulary is `support::hf`, shared with `tests/kv_hf_config_proptest.rs`. The parser must never
//! panic; a returned spec must pass the same `support::kv::check_spec` as in `hf_config_bytes`, and its
//! layer count must follow `num_hidden_layers` of the section it came from.
#![no_main]

use kvgate::kv::ModelSpec;
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use support::hf::{CONFIG_KEYS, LAYER_TYPES, MODEL_TYPES};
use support::kv::check_spec;

#[derive(Debug, Arbitrary)]
enum Val {
    Null,
    Bool(bool),
    Small(u8),
    Int(u32),
    Edge(u8),
    Neg(i64),
    Float(f64),
    ModelType(u8),
    Str(String),
    Layers(Vec<u8>),
    /// `n` copies of one layer type (long uniform lists).
    LayerRun(u8, u16),
    List(Vec<Val>),
    Object(Vec<(u8, Val)>),
}

impl Val {
    fn to_json(&self, depth: u32) -> Value {
        match self {
            Val::Null => Value::Null,
            Val::Bool(b) => Value::Bool(*b),
            Val::Small(n) => Value::from(*n),
            Val::Int(n) => Value::from(*n),
            Val::Edge(i) => {
                let edges =
                    [0u64, 1, 2, 3, 4, 6, 8, 16, 64, 128, 256, 4096, 131_072, u64::from(u32::MAX), 1 << 32, u64::MAX];
                Value::from(edges[usize::from(*i) % edges.len()])
            }
            Val::Neg(n) => Value::from(*n),
            Val::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Val::ModelType(i) => Value::from(MODEL_TYPES[usize::from(*i) % MODEL_TYPES.len()]),
            Val::Str(s) => Value::from(s.as_str()),
            Val::Layers(v) => v.iter().map(|&i| Value::from(LAYER_TYPES[usize::from(i) % LAYER_TYPES.len()])).collect(),
            Val::LayerRun(i, n) => {
                let t = LAYER_TYPES[usize::from(*i) % LAYER_TYPES.len()];
                Value::Array(vec![Value::from(t); usize::from(*n % 1024)])
            }
            Val::List(v) if depth < 8 => v.iter().map(|x| x.to_json(depth + 1)).collect(),
            Val::Object(fields) if depth < 8 => object(fields, depth + 1),
            Val::List(_) | Val::Object(_) => Value::Null,
        }
    }
}

fn object(fields: &[(u8, Val)], depth: u32) -> Value {
    let mut map = Map::new();
    for (key, val) in fields {
        map.insert(CONFIG_KEYS[usize::from(*key) % CONFIG_KEYS.len()].to_owned(), val.to_json(depth));
    }
    Value::Object(map)
}

#[derive(Debug, Arbitrary)]
struct Input {
    model_type: Option<u8>,
    fields: Vec<(u8, Val)>,
    text_config: Option<Vec<(u8, Val)>>,
    tokens: u64,
    block: u32,
}

fuzz_target!(|input: Input| {
    let mut root = match object(&input.fields, 0) {
        Value::Object(map) => map,
        _ => unreachable!(),
    };
    if let Some(i) = input.model_type {
        root.insert("model_type".into(), Value::from(MODEL_TYPES[usize::from(i) % MODEL_TYPES.len()]));
    }
    if let Some(fields) = &input.text_config {
        root.insert("text_config".into(), object(fields, 1));
    }
    let json = serde_json::to_string(&Value::Object(root.clone())).unwrap();
    let Ok(spec) = ModelSpec::from_hf_config(&json) else { return };
    let section = match root.get("text_config") {
        Some(Value::Object(obj)) => obj,
        _ => &root,
    };
    // Absent, the class default applies; a Falcon-H1 (or `hybrid`) layer holds attention and Mamba2 side by
    // side, so the spec has between num_hidden_layers and twice that many layers.
    if let Some(layers) = section.get("num_hidden_layers").and_then(Value::as_u64) {
        let n = u64::from(spec.num_layers());
        assert!(n >= layers && n <= 2 * layers, "{n} layers for num_hidden_layers {layers}");
    }
    check_spec(&spec, input.tokens, input.block);
});
