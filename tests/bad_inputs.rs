//! The bad-input catalogue: every invalid configuration and request we know of, each with the exact error
//! it gets (variant and the key parts of the message). Nothing may panic (except `BoundedQueue::new(0)`,
//! which is documented to), nothing may hold capacity afterwards, and every call returns promptly (calls
//! that could block or loop run under a watchdog).
//!
//! Absurd HTTP bodies belong to the gateway's catalogue (it lands with the gateway example).
#![cfg(not(loom))]

use kvgate::bucket::TokenBucket;
use kvgate::clock::ManualClock;
use kvgate::kv::{GpuPlan, KvDtype, ModelSpec};
use kvgate::queue::BoundedQueue;
use kvgate::{Admission, ConfigError, Limit, Rejection, Request};
use std::time::Duration;
use support::admission::assert_idle;
use support::within;

const PROMPT: Duration = Duration::from_secs(5);

/// Every rate the buckets must refuse, with the reason it is bad.
const BAD_RATES: [(f64, &str); 11] = [
    (0.0, "zero"),
    (-0.0, "negative zero"),
    (-1.0, "negative"),
    (f64::NAN, "NaN"),
    (f64::INFINITY, "+infinity"),
    (f64::NEG_INFINITY, "-infinity"),
    (1e-4, "below 0.001/s"),
    (f64::MIN_POSITIVE, "smallest normal"),
    (5e-324, "subnormal"),
    (1.000_000_1e9, "above 1e9/s"),
    (f64::MAX, "f64::MAX"),
];

fn assert_invalid_rate(err: ConfigError, what: &str, rate: f64) {
    match &err {
        ConfigError::InvalidRate { what: w, value, min, max } => {
            assert_eq!(*w, what);
            assert_eq!(value.to_bits(), rate.to_bits(), "the error carries the value given");
            assert_eq!((*min, *max), (0.001, 1e9));
        }
        other => panic!("{rate}: expected InvalidRate, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(what) && msg.contains("between 0.001 and 1000000000 per second"), "{msg}");
}

// ---------------------------------------------------------------------------------------------------------
// Token bucket

#[test]
fn bucket_new_refuses_every_bad_rate() {
    for (rate, why) in BAD_RATES {
        let err = TokenBucket::new(rate, 10).expect_err(why);
        assert_invalid_rate(err, "token bucket rate", rate);
    }
    // The rate is checked before the burst.
    assert_invalid_rate(TokenBucket::new(f64::NAN, 0).unwrap_err(), "token bucket rate", f64::NAN);
}

#[test]
fn bucket_zero_burst() {
    let err = TokenBucket::new(1.0, 0).unwrap_err();
    assert_eq!(err, ConfigError::Zero { what: "token bucket burst" });
    assert!(err.to_string().contains("token bucket burst is 0"), "{err}");
}

#[test]
fn bucket_boundary_rates_are_accepted() {
    for rate in [0.001, 1e9] {
        assert!(TokenBucket::new(rate, 1).is_ok(), "{rate}");
    }
    assert!(TokenBucket::new(1.0, u64::MAX).is_ok());
}

#[test]
fn bucket_set_rate_refuses_and_changes_nothing() {
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(10.0, 5, clock).unwrap();
    bucket.try_acquire(2).unwrap();
    for (rate, why) in BAD_RATES {
        assert_invalid_rate(bucket.set_rate(rate, 10).expect_err(why), "token bucket rate", rate);
    }
    assert_eq!(bucket.set_rate(1.0, 0).unwrap_err(), ConfigError::Zero { what: "token bucket burst" });
    assert_eq!((bucket.rate(), bucket.burst(), bucket.available()), (10.0, 5, 3), "unchanged");
}

#[test]
fn bucket_absurd_amounts_do_not_panic() {
    let bucket = TokenBucket::with_clock(1.0, 5, ManualClock::new()).unwrap();
    let err = bucket.try_acquire(u64::MAX).unwrap_err();
    assert_eq!(err.retry_after(), None);
    assert!(err.to_string().contains("18446744073709551615 tokens requested but the bucket holds at most 5"), "{err}");
    bucket.refund(u64::MAX);
    assert_eq!(bucket.available(), 5, "a refund never overfills");
    assert!(bucket.try_acquire_at(1, u64::MAX).is_ok());
    // A time far before the last one used: no panic, no extra tokens, an honest positive hint (the
    // bucket waits for the clock to come back to where it was).
    match bucket.try_acquire_at(1, 0) {
        Err(kvgate::bucket::AcquireError::NotYet { retry_after }) => {
            assert!(retry_after > Duration::from_secs(1 << 33))
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Admission builder

#[test]
fn builder_request_and_token_rates() {
    for (rate, why) in BAD_RATES {
        let err = Admission::builder().request_rate(rate, 1).build().expect_err(why);
        assert_invalid_rate(err, "request rate", rate);
        let err = Admission::builder().token_rate(rate, 1).build().expect_err(why);
        assert_invalid_rate(err, "token rate", rate);
    }
    assert_eq!(
        Admission::builder().request_rate(1.0, 0).build().unwrap_err(),
        ConfigError::Zero { what: "request rate burst" }
    );
    assert_eq!(
        Admission::builder().token_rate(1.0, 0).build().unwrap_err(),
        ConfigError::Zero { what: "token rate burst" }
    );
}

#[test]
fn builder_zero_limits() {
    let err = Admission::builder().max_in_flight(0).build().unwrap_err();
    assert_eq!(err, ConfigError::Zero { what: "max_in_flight" });
    assert!(err.to_string().starts_with("max_in_flight is 0, so nothing could ever be admitted"), "{err}");
    assert_eq!(
        Admission::builder().kv_capacity_tokens(0).build().unwrap_err(),
        ConfigError::Zero { what: "KV capacity" }
    );
    let spec = ModelSpec::preset("llama-3.1-8b").unwrap();
    let err = Admission::builder().kv_model(spec, KvDtype::Bf16, 16).kv_capacity_bytes(0).build().unwrap_err();
    assert_eq!(err, ConfigError::Zero { what: "KV capacity" });
}

#[test]
fn builder_queue_capacity_above_the_maximum() {
    for cap in [(1 << 20) + 1, usize::MAX] {
        match Admission::builder().queue_capacity(cap).build().unwrap_err() {
            ConfigError::OutOfRange { what: "queue_capacity", reason } => {
                assert!(reason.contains(&format!("{cap} waiters per class")), "{reason}");
                assert!(reason.contains("at most 1048576"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(Admission::builder().queue_capacity(1 << 20).build().is_ok(), "the maximum itself is fine");
}

#[test]
fn builder_conflicting_kv_settings() {
    let spec = ModelSpec::preset("llama-3.1-8b").unwrap();
    let conflict = |b: kvgate::AdmissionBuilder| match b.build().unwrap_err() {
        ConfigError::Conflict(msg) => msg,
        other => panic!("{other:?}"),
    };
    let msg = conflict(Admission::builder().kv_model(spec.clone(), KvDtype::Bf16, 16));
    assert!(msg.contains("no byte budget is set"), "kv_model without bytes: {msg}");
    let msg = conflict(Admission::builder().kv_capacity_bytes(1 << 30));
    assert!(msg.contains("kv_capacity_bytes needs a KV model"), "bytes without a model: {msg}");
    let msg = conflict(Admission::builder().kv_capacity_tokens(1000).kv_capacity_bytes(1 << 30));
    assert!(msg.contains("both in tokens and in bytes"), "both units without a model: {msg}");
    let msg = conflict(
        Admission::builder().kv_model(spec.clone(), KvDtype::Bf16, 16).kv_capacity_bytes(1 << 30).kv_capacity_tokens(1),
    );
    assert!(msg.contains("both in tokens and in bytes"), "both units with a model: {msg}");
    // A block size of 0 is treated as 1, not refused.
    assert!(Admission::builder().kv_model(spec, KvDtype::Bf16, 0).kv_capacity_bytes(1 << 30).build().is_ok());
}

// ---------------------------------------------------------------------------------------------------------
// Admission at run time

#[test]
fn runtime_setters_refuse_bad_values_and_change_nothing() {
    let a = Admission::builder()
        .max_in_flight(4)
        .kv_capacity_tokens(100)
        .request_rate(10.0, 5)
        .token_rate(1000.0, 100)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    assert_eq!(a.set_max_in_flight(0).unwrap_err(), ConfigError::Zero { what: "max_in_flight" });
    assert_eq!(a.set_kv_capacity(0).unwrap_err(), ConfigError::Zero { what: "KV capacity" });
    for (rate, why) in BAD_RATES {
        assert_invalid_rate(a.set_request_rate(rate, 5).expect_err(why), "request rate", rate);
        assert_invalid_rate(a.set_token_rate(rate, 100).expect_err(why), "token rate", rate);
    }
    assert_eq!(a.set_request_rate(1.0, 0).unwrap_err(), ConfigError::Zero { what: "request rate burst" });
    assert_eq!(a.set_token_rate(1.0, 0).unwrap_err(), ConfigError::Zero { what: "token rate burst" });
    let s = a.snapshot();
    assert_eq!((s.max_in_flight, s.kv_capacity), (4, 100));
    // Five requests pass (request burst 5), so the rates were not changed.
    let permits: Vec<_> = (0..4).map(|_| a.try_admit(&Request::new(10, 10)).unwrap()).collect();
    drop(permits);
    assert_idle(&a);

    let bare = Admission::builder().build().unwrap();
    for (result, what) in [(bare.set_request_rate(1.0, 1), "request rate"), (bare.set_token_rate(1.0, 1), "token rate")]
    {
        match result.unwrap_err() {
            ConfigError::Conflict(msg) => assert!(msg.contains(&format!("built without a {what}")), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
}

/// The runtime rate setters name the admission's setting, like the builder ("request rate", "token rate
/// burst"), not the token bucket behind it.
#[test]
fn runtime_rate_errors_name_the_admission_setting() {
    let a = Admission::builder().request_rate(10.0, 5).token_rate(1000.0, 100).build().unwrap();
    assert_invalid_rate(a.set_request_rate(f64::NAN, 5).unwrap_err(), "request rate", f64::NAN);
    assert_invalid_rate(a.set_token_rate(f64::NAN, 5).unwrap_err(), "token rate", f64::NAN);
    assert_eq!(a.set_request_rate(1.0, 0).unwrap_err(), ConfigError::Zero { what: "request rate burst" });
    assert_eq!(a.set_token_rate(1.0, 0).unwrap_err(), ConfigError::Zero { what: "token rate burst" });
}

#[test]
fn zero_token_request_is_invalid_everywhere() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(4).build().unwrap();
    let expected = Rejection::Invalid { reason: "the request asks for zero tokens (prompt and output both 0)" };
    assert_eq!(a.try_admit(&Request::new(0, 0)).unwrap_err(), expected);
    assert_eq!(expected.http_status(), 400);
    assert_eq!(expected.retry_after(), None);
    let waited = within(PROMPT, "admit(0, 0)", {
        let a = a.clone();
        move || futures::executor::block_on(a.admit(&Request::new(0, 0)))
    });
    assert_eq!(waited.unwrap_err(), expected);
    let blocked = within(PROMPT, "admit_blocking(0, 0)", {
        let a = a.clone();
        move || a.admit_blocking(&Request::new(0, 0), None)
    });
    assert_eq!(blocked.unwrap_err(), expected);
    // Invalid is checked before Closed.
    a.close();
    assert_eq!(a.try_admit(&Request::new(0, 0)).unwrap_err(), expected);
    assert_eq!(a.snapshot().rejected.invalid, 4);
    assert_idle(&a);
}

#[test]
fn u32_max_tokens_do_not_wrap() {
    let huge = Request::new(u32::MAX, u32::MAX);
    assert_eq!(huge.total_tokens(), 2 * u64::from(u32::MAX));

    // Larger than the KV budget: TooLarge, not retryable, nothing held.
    let a = Admission::builder().kv_capacity_tokens(1_000_000).token_rate(1e9, u64::MAX).build().unwrap();
    let err = a.try_admit(&huge).unwrap_err();
    assert_eq!(err, Rejection::TooLarge { limit: Limit::KvBudget, requested: 8_589_934_590, capacity: 1_000_000 });
    assert!(err.to_string().contains("needs 8589934590 of the KV-cache budget, which holds 1000000 in total"), "{err}");
    assert_eq!((err.http_status(), err.retry_after()), (413, None));
    assert_idle(&a);

    // Larger than the token burst.
    let a = Admission::builder().token_rate(1000.0, 4096).build().unwrap();
    let err = a.try_admit(&Request::new(4096, 1)).unwrap_err();
    assert_eq!(err, Rejection::TooLarge { limit: Limit::TokenRate, requested: 4097, capacity: 4096 });
    assert!(err.to_string().contains("token-rate burst"), "{err}");
    assert_idle(&a);

    // Nothing limits KV: it fits and the counters hold the exact sum.
    let a = Admission::builder().max_in_flight(2).build().unwrap();
    let p = a.try_admit(&huge).unwrap();
    let q = a.try_admit(&huge).unwrap();
    assert_eq!(a.snapshot().kv_used, 4 * u64::from(u32::MAX));
    drop((p, q));
    assert_idle(&a);

    // Priced in bytes: the paged byte count of 2^33 tokens on a 70B model fits a u64 and exceeds any GPU.
    let spec = ModelSpec::preset("llama-3.1-70b").unwrap();
    let a = Admission::builder().kv_model(spec, KvDtype::F32, 16).kv_capacity_bytes(u64::MAX - 1).build().unwrap();
    match a.try_admit(&huge) {
        Ok(p) => assert_eq!(p.kv_reserved(), a.kv_cost(&huge)),
        Err(r) => assert!(matches!(r, Rejection::TooLarge { limit: Limit::KvBudget, .. }), "{r:?}"),
    }
    assert_idle(&a);
}

#[test]
fn requests_larger_than_the_whole_budget_never_wait() {
    let a = Admission::builder().kv_capacity_tokens(100).token_rate(1000.0, 50).queue_capacity(8).build().unwrap();
    for request in [Request::new(101, 0), Request::new(30, 30)] {
        let got = within(PROMPT, "admit(too large)", {
            let a = a.clone();
            move || futures::executor::block_on(a.admit(&request))
        });
        assert!(matches!(got, Err(Rejection::TooLarge { .. })), "{got:?}");
        let got = within(PROMPT, "admit_blocking(too large)", {
            let a = a.clone();
            move || a.admit_blocking(&request, None)
        });
        assert!(matches!(got, Err(Rejection::TooLarge { .. })), "{got:?}");
    }
    assert_eq!(a.snapshot().rejected.too_large, 4);
    assert_idle(&a);
}

#[test]
fn zero_and_huge_waits() {
    let a = Admission::builder().max_in_flight(1).queue_capacity(2).build().unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    // A request that may not wait at all is refused rather than queued.
    let zero = Request::new(1, 1).max_wait(Duration::ZERO);
    let got = within(PROMPT, "admit(max_wait 0)", {
        let a = a.clone();
        move || futures::executor::block_on(a.admit(&zero))
    });
    assert_eq!(got.unwrap_err(), Rejection::TimedOut);
    let got = within(PROMPT, "admit_blocking(timeout 0)", {
        let a = a.clone();
        move || a.admit_blocking(&Request::new(1, 1), Some(Duration::ZERO))
    });
    assert_eq!(got.unwrap_err(), Rejection::TimedOut);
    // Duration::MAX saturates instead of overflowing the deadline.
    let forever = Request::new(1, 1).max_wait(Duration::MAX);
    let mut fut = a.admit(&forever);
    assert!(futures::FutureExt::now_or_never(&mut fut).is_none());
    drop(held);
    assert!(futures::executor::block_on(fut).is_ok());
    // queue_capacity(0): never waits.
    let a = Admission::builder().max_in_flight(1).queue_capacity(0).build().unwrap();
    let held = a.try_admit(&Request::new(1, 1)).unwrap();
    let got = within(PROMPT, "admit with queue_capacity 0", {
        let a = a.clone();
        move || futures::executor::block_on(a.admit(&Request::new(1, 1)))
    });
    assert!(matches!(got, Err(Rejection::NoCapacity { retry_after }) if retry_after > Duration::ZERO), "{got:?}");
    drop(held);
    assert_idle(&a);
}

// ---------------------------------------------------------------------------------------------------------
// Queue

#[test]
#[should_panic(expected = "BoundedQueue capacity must be at least 1")]
fn queue_of_capacity_zero_panics_as_documented() {
    let _ = BoundedQueue::<u8>::new(0);
}

#[test]
#[should_panic(expected = "is too large")]
fn queue_of_absurd_capacity_panics_as_documented() {
    let _ = BoundedQueue::<u8>::new(usize::MAX);
}

// ---------------------------------------------------------------------------------------------------------
// Model configs (`config.json`)

fn parse(json: &str) -> Result<ModelSpec, ConfigError> {
    let json = json.to_owned();
    within(PROMPT, "from_hf_config", move || ModelSpec::from_hf_config(&json))
}

fn invalid_json(json: &str) -> String {
    match parse(json) {
        Err(ConfigError::InvalidJson(msg)) => msg,
        other => panic!("{json:.80}: expected InvalidJson, got {other:?}"),
    }
}

fn invalid_key(json: &str, key: &str) -> String {
    match parse(json) {
        Err(ConfigError::InvalidKey { key: k, reason }) if k == key => reason,
        other => panic!("{json:.120}: expected InvalidKey {key}, got {other:?}"),
    }
}

fn missing_key(json: &str, key: &str, model_type: &str) {
    assert_eq!(
        parse(json).unwrap_err(),
        ConfigError::MissingKey { key: key.into(), model_type: model_type.into() },
        "{json:.120}"
    );
}

/// A Llama-style config with `extra` keys appended (which override earlier ones).
fn llama(extra: &str) -> String {
    let base = r#""model_type":"llama","num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"hidden_size":256"#;
    if extra.is_empty() { format!("{{{base}}}") } else { format!("{{{base},{extra}}}") }
}

#[test]
fn config_not_json_or_not_an_object() {
    for bad in ["", " ", "not json", "{", "{\"model_type\":", "{\"model_type\":\"llama\",}", "\u{feff}{}", "NaN"] {
        invalid_json(bad);
    }
    for top in ["[]", "[{\"model_type\":\"llama\"}]", "null", "42", "\"llama\"", "true"] {
        assert_eq!(invalid_json(top), "the top level is not an object", "{top}");
    }
    // Truncated anywhere: never panics, always InvalidJson.
    let full = llama("");
    for cut in 0..full.len() {
        invalid_json(&full[..cut]);
    }
    // serde_json's message says where it stopped.
    assert!(invalid_json("{\"a\": tru}").contains("line 1"), "position in the message");
}

#[test]
fn config_model_type() {
    missing_key("{}", "model_type", "unknown");
    missing_key(r#"{"num_hidden_layers":2}"#, "model_type", "unknown");
    for wrong in ["5", "null", "[\"llama\"]", "{}", "true"] {
        let reason = invalid_key(&format!("{{\"model_type\":{wrong}}}"), "model_type");
        assert!(reason.starts_with("expected a string"), "{reason}");
    }
    for unknown in ["bert", "", "LLAMA ", "_text", "llama_vision"] {
        let json = llama(&format!("\"model_type\":\"{unknown}\""));
        assert_eq!(parse(&json).unwrap_err(), ConfigError::UnsupportedArchitecture { model_type: unknown.into() });
    }
    let msg = parse(r#"{"model_type":"bert"}"#).unwrap_err().to_string();
    assert!(msg.contains("unsupported model architecture \"bert\"") && msg.contains("ModelSpec::builder()"), "{msg}");
}

#[test]
fn config_missing_keys() {
    // Keys a config leaves out take its transformers class defaults; only keys no class default covers
    // are missing.
    assert_eq!(parse(r#"{"model_type":"llama"}"#).unwrap().num_layers(), 32);
    assert_eq!(parse(r#"{"model_type":"gemma3","text_config":{}}"#).unwrap().num_layers(), 26);
    missing_key(&llama(r#""layer_types":["mamba","full_attention"]"#), "mamba_expand", "llama");
    missing_key(
        &llama(r#""layer_types":["sliding_attention","full_attention"],"sliding_window":null"#),
        "sliding_window",
        "llama",
    );
    let msg = parse(&llama(r#""layer_types":["mamba","full_attention"]"#)).unwrap_err().to_string();
    assert!(msg.contains("missing required key `mamba_expand`") && msg.contains("\"llama\""), "{msg}");
}

#[test]
fn config_wrong_types() {
    for (value, found) in
        [("\"32\"", "\"32\""), ("32.0", "32.0"), ("32.5", "32.5"), ("true", "true"), ("[32]", "[32]"), ("{}", "{}")]
    {
        let reason = invalid_key(&llama(&format!("\"num_hidden_layers\":{value}")), "num_hidden_layers");
        assert_eq!(reason, format!("expected a non-negative integer up to 4294967295, found {found}"));
    }
    let reason = invalid_key(&llama(r#""use_sliding_window":"yes""#), "use_sliding_window");
    assert_eq!(reason, "expected true or false, found \"yes\"");
    let reason = invalid_key(&llama(r#""layer_types":"full_attention""#), "layer_types");
    assert!(reason.starts_with("expected a list of strings"), "{reason}");
    let reason = invalid_key(&llama(r#""layer_types":["full_attention",7]"#), "layer_types");
    assert!(reason.contains("unsupported layer type 7"), "{reason}");
    let reason = invalid_key(&llama(r#""layer_types":["full_attention","cross_attention"]"#), "layer_types");
    assert!(reason.contains("unsupported layer type \"cross_attention\"; known: full_attention"), "{reason}");
    for text_config in ["\"x\"", "[]", "3", "true"] {
        let reason =
            invalid_key(&format!("{{\"model_type\":\"gemma3\",\"text_config\":{text_config}}}"), "text_config");
        assert!(reason.starts_with("expected an object"), "{reason}");
    }
}

#[test]
fn config_negative_and_huge_numbers() {
    for value in ["-1", "-2147483648", "4294967296", "18446744073709551615", "1e30", "-0.0", "1e400"] {
        let json = llama(&format!("\"num_key_value_heads\":{value}"));
        match parse(&json) {
            Err(ConfigError::InvalidKey { key, .. }) => assert_eq!(key, "num_key_value_heads"),
            // serde_json refuses 1e400 (out of range) as JSON.
            Err(ConfigError::InvalidJson(msg)) => assert_eq!(value, "1e400", "{msg}"),
            other => panic!("{value}: {other:?}"),
        }
    }
    // Fits a u32 but the sizes overflow: refused by the builder, not wrapped.
    let json = llama(r#""num_key_value_heads":4294967295,"head_dim":4294967295"#);
    match parse(&json).unwrap_err() {
        ConfigError::OutOfRange { what: "model size", reason } => assert!(reason.contains("overflow u64"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let json = r#"{"model_type":"deepseek_v3","num_hidden_layers":2,"kv_lora_rank":4294967295,"qk_rope_head_dim":1}"#;
    assert_eq!(invalid_key(json, "kv_lora_rank"), "kv_lora_rank + qk_rope_head_dim overflows");
}

#[test]
fn config_zeros() {
    let no_kv_heads = r#"{"model_type":"llama","num_hidden_layers":2,"num_attention_heads":0,"hidden_size":256}"#;
    assert_eq!(invalid_key(no_kv_heads, "num_attention_heads"), "must be at least 1");
    for key in ["num_hidden_layers", "num_key_value_heads", "head_dim"] {
        let json = llama(&format!("\"{key}\":0,\"head_dim\":{}", if key == "head_dim" { 0 } else { 64 }));
        assert_eq!(invalid_key(&json, key), "must be at least 1", "{key}");
    }
    let reason = invalid_key(&llama(r#""hidden_size":0"#), "hidden_size");
    assert!(reason.contains("not a positive multiple of num_attention_heads 4"), "{reason}");
    let reason = invalid_key(&llama(r#""hidden_size":255"#), "hidden_size");
    assert!(reason.contains("hidden_size 255 is not a positive multiple"), "{reason}");
    let mistral = r#"{"model_type":"mistral","num_hidden_layers":2,"num_attention_heads":4,"hidden_size":256,"sliding_window":0}"#;
    assert_eq!(invalid_key(mistral, "sliding_window"), "must be at least 1");
    let gemma3 = r#"{"model_type":"gemma3","num_hidden_layers":2,"num_key_value_heads":1,"sliding_window_pattern":0}"#;
    assert_eq!(invalid_key(gemma3, "sliding_window_pattern"), "must be at least 1");
    // Recurrent layers in a family whose class has no state sizes.
    let mamba = llama(r#""layer_types":["mamba","linear_attention"]"#);
    assert!(matches!(parse(&mamba).unwrap_err(), ConfigError::MissingKey { .. }));
}

#[test]
fn config_inconsistent_layouts() {
    let reason = invalid_key(&llama(r#""layer_types":["full_attention"]"#), "layer_types");
    assert_eq!(reason, "has 1 entries but num_hidden_layers is 2");
    let jamba = r#"{"model_type":"jamba","num_hidden_layers":8,"num_attention_heads":4,"hidden_size":256,
                    "attn_layer_period":4,"attn_layer_offset":4}"#;
    assert_eq!(invalid_key(jamba, "attn_layer_offset"), "4 is not below attn_layer_period 4");
    let gemma4 = r#"{"model_type":"gemma4","num_hidden_layers":2,"num_key_value_heads":1,"head_dim":8,
                     "layer_types":["full_attention","full_attention"],"num_kv_shared_layers":3}"#;
    assert_eq!(invalid_key(gemma4, "num_kv_shared_layers"), "3 shared-KV layers but only 2 layers");
}

#[test]
fn config_hostile_shapes() {
    // Nesting deeper than serde_json's recursion limit (128) is refused as JSON.
    let deep = format!(
        "{{\"model_type\":\"gemma3\",\"text_config\":{}{}}}",
        "{\"text_config\":".repeat(200),
        "{}".to_owned() + &"}".repeat(200)
    );
    assert!(invalid_json(&deep).contains("recursion limit"));
    // A long chain below the limit: only the first text_config is read.
    let chain = format!(
        "{{\"model_type\":\"gemma3\",\"text_config\":{}{}}}",
        "{\"text_config\":".repeat(100),
        "{}".to_owned() + &"}".repeat(100)
    );
    // Its keys are absent, so Gemma3TextConfig's defaults apply (26 layers).
    assert_eq!(parse(&chain).unwrap().num_layers(), 26);
    // Deep arrays anywhere are refused the same way (no stack overflow).
    let arrays = format!("{{\"model_type\":\"llama\",\"x\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(invalid_json(&arrays).contains("recursion limit"));
    // A 10 MB model_type: refused promptly, the name carried in the error.
    let name = "x".repeat(10 << 20);
    match parse(&format!("{{\"model_type\":\"{name}\"}}")).unwrap_err() {
        ConfigError::UnsupportedArchitecture { model_type } => assert_eq!(model_type.len(), 10 << 20),
        other => panic!("{other:?}"),
    }
    // 10 MB of unknown keys and values next to a valid config: ignored.
    let padding = format!("\"junk\":\"{}\"", "y".repeat(10 << 20));
    assert_eq!(parse(&llama(&padding)).unwrap().num_layers(), 2);
    // A layer_types list of 100k entries that disagrees with num_hidden_layers.
    let many = format!("\"layer_types\":[{}\"full_attention\"]", "\"full_attention\",".repeat(99_999));
    assert_eq!(invalid_key(&llama(&many), "layer_types"), "has 100000 entries but num_hidden_layers is 2");
    // Duplicate keys: the last one wins (serde_json), no panic.
    assert_eq!(parse(&llama(r#""num_hidden_layers":3"#)).unwrap().num_layers(), 3);
    // NaN-like values are not JSON numbers.
    for nan in ["NaN", "Infinity", "-Infinity", "nan"] {
        invalid_json(&llama(&format!("\"head_dim\":{nan}")));
    }
    assert!(invalid_key(&llama(r#""head_dim":"NaN""#), "head_dim").contains("found \"NaN\""));
    // Invalid UTF-8 cannot reach the parser (it takes &str); escaped lone surrogates are refused as JSON.
    invalid_json(r#"{"model_type":"\ud800"}"#);
}

/// A hostile `config.json` with `"num_hidden_layers": 4294967295` is refused at once with
/// `InvalidKey { key: "num_hidden_layers" }` (the parser works per layer; at most 65,536 are accepted).
#[test]
fn config_with_huge_layer_count_returns_promptly() {
    let json = llama(r#""num_hidden_layers":4294967295"#);
    let result = within(Duration::from_secs(2), "from_hf_config(num_hidden_layers = u32::MAX)", move || {
        ModelSpec::from_hf_config(&json).map(|s| s.num_layers())
    });
    assert!(matches!(&result, Err(ConfigError::InvalidKey { key, .. }) if key == "num_hidden_layers"), "{result:?}");
}

// ---------------------------------------------------------------------------------------------------------
// Presets, dtypes, GPU plans

#[test]
fn unknown_names() {
    for garbage in ["", "int4", "BF16 ", "bf-16", "fp4", "\u{0}", "bfloat16\n"] {
        match garbage.parse::<KvDtype>().unwrap_err() {
            ConfigError::UnknownName { what: "dtype", name, known } => {
                assert_eq!(name, garbage);
                assert_eq!(known, "bf16, fp16 (f16), fp32 (f32), fp8, q8_0, q4_0");
            }
            other => panic!("{other:?}"),
        }
    }
    for garbage in ["", "gpt-5", "llama", "llama-3.1-8b ", "\u{0}"] {
        match ModelSpec::preset(garbage).unwrap_err() {
            ConfigError::UnknownName { what: "model preset", name, known } => {
                assert_eq!(name, garbage);
                assert!(known.contains("llama-3.1-8b"), "{known}");
            }
            other => panic!("{other:?}"),
        }
    }
    let msg = ModelSpec::preset("gpt-5").unwrap_err().to_string();
    assert!(msg.starts_with("unknown model preset \"gpt-5\"; known: "), "{msg}");
}

fn llama_8b_plan() -> kvgate::kv::GpuPlanBuilder {
    GpuPlan::builder(ModelSpec::preset("llama-3.1-8b").unwrap()).gpu("h100-80")
}

#[test]
fn gpu_plan_bad_settings() {
    for util in [0.0, -0.0, -0.5, 1.000_001, 1.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        match llama_8b_plan().memory_utilization(util).build().unwrap_err() {
            ConfigError::OutOfRange { what: "memory_utilization", reason } => {
                assert!(reason.contains("is outside (0, 1]"), "{reason}")
            }
            other => panic!("{util}: {other:?}"),
        }
    }
    assert!(llama_8b_plan().memory_utilization(1.0).build().is_ok());
    match llama_8b_plan().gpu("tpu-v5").build().unwrap_err() {
        ConfigError::UnknownName { what: "GPU", name, known } => {
            assert_eq!(name, "tpu-v5");
            assert!(known.contains("h100-80"), "{known}");
        }
        other => panic!("{other:?}"),
    }
    match llama_8b_plan().tensor_parallel(3).build().unwrap_err() {
        ConfigError::Conflict(msg) => {
            assert!(
                msg.contains("tensor-parallel degree 3 neither divides nor is a multiple of the 8 KV heads"),
                "{msg}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        llama_8b_plan().tensor_parallel(0).build().unwrap_err(),
        ConfigError::Zero { what: "tensor-parallel degree" }
    );
    assert_eq!(llama_8b_plan().block_size(0).build().unwrap_err(), ConfigError::Zero { what: "block size" });
    assert_eq!(llama_8b_plan().gpu_memory_bytes(0).build().unwrap_err(), ConfigError::Zero { what: "GPU memory" });
    for weights in [u64::MAX, 80 << 30] {
        match llama_8b_plan().weight_bytes(weights).build().unwrap_err() {
            ConfigError::Conflict(msg) => assert!(msg.contains("exceed the usable memory"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }
    match llama_8b_plan().reserve_bytes(u64::MAX).build().unwrap_err() {
        ConfigError::Conflict(msg) => assert!(msg.contains("exceed the usable memory"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let spec = ModelSpec::preset("llama-3.1-8b").unwrap();
    match GpuPlan::builder(spec.clone()).build().unwrap_err() {
        ConfigError::Conflict(msg) => assert!(msg.contains("no GPU given"), "{msg}"),
        other => panic!("{other:?}"),
    }
    // A pool smaller than one block.
    let tiny = GpuPlan::builder(spec).gpu_memory_bytes(3 << 30).weight_bytes(0).reserve_bytes((2 << 30) + (700 << 20));
    match tiny.block_size(1 << 20).build().unwrap_err() {
        ConfigError::Conflict(msg) => assert!(msg.contains("smaller than one block"), "{msg}"),
        other => panic!("{other:?}"),
    }
    let no_params = ModelSpec::builder("x").full(1, 1, 1).build().unwrap();
    match GpuPlan::builder(no_params).gpu("l4").build().unwrap_err() {
        ConfigError::Conflict(msg) => assert!(msg.contains("no parameter count"), "{msg}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(GpuPlan::gpu_memory("").unwrap_err().to_string().split(';').next().unwrap(), "unknown GPU \"\"");
}

#[test]
fn model_spec_builder_bad_shapes() {
    let zero = |b: kvgate::kv::ModelSpecBuilder| match b.build().unwrap_err() {
        ConfigError::Zero { what } => what,
        other => panic!("{other:?}"),
    };
    assert_eq!(zero(ModelSpec::builder("x")), "layers holding a KV cache");
    assert_eq!(zero(ModelSpec::builder("x").full(0, 1, 1)), "layers in a group");
    zero(ModelSpec::builder("x").full(1, 0, 1));
    zero(ModelSpec::builder("x").sliding(1, 1, 1, 0));
    assert!(matches!(
        ModelSpec::builder("x").full(u32::MAX, u32::MAX, u32::MAX).build(),
        Err(ConfigError::OutOfRange { what: "model size", .. })
    ));
    // Saturating byte counts for absurd token counts.
    let spec = ModelSpec::builder("x").full(1, 1, 1).build().unwrap();
    assert_eq!(spec.kv_bytes_paged(u64::MAX, KvDtype::F32, u32::MAX), u64::MAX);
    assert_eq!(spec.tensor_parallel_shard(0).unwrap_err(), ConfigError::Zero { what: "tensor-parallel degree" });
}
