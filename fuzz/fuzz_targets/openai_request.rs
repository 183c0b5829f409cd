//! `kvgate::openai` on arbitrary bytes: the request parser and the output counter never panic, and keep
//! their promises.
//!
//! Input: one selector byte (endpoint, default and largest reservation), then the body. The same bytes
//! are also fed to `OutputTokens` as a response body, whole and cut in two at a point the selector
//! picks: the count must not depend on where the frames were cut.
//!
//! - a parsed request has `prompt_tokens >= 1`, `1 <= max_tokens <= max_output_tokens`, the default when
//!   the client set no limit, and a forwarded body that is a JSON object whose `max_tokens`, and every
//!   other generation limit it has, equals the reservation;
//! - a refusal has status 400 or 413, a code and a message.
#![no_main]

use bytes::Bytes;
use kvgate::openai::{Endpoint, GENERATION_LIMITS, OutputTokens, Parser};
use kvgate::stream::OutputCounter;
use libfuzzer_sys::fuzz_target;

fn count(frames: &[&[u8]]) -> Option<u32> {
    let mut counter = OutputTokens::new();
    let summed: u32 = frames.iter().map(|f| OutputCounter::<[u8]>::count(&mut counter, *f)).fold(0, u32::saturating_add);
    OutputCounter::<[u8]>::total(&counter, summed)
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let endpoint = if selector & 1 == 0 { Endpoint::Chat } else { Endpoint::Completions };
    let default_max_tokens = u32::from(selector >> 4) * 64 + 1;
    let max_output_tokens = u32::from((selector >> 1) & 7) * 1000 + 1;
    let parser = Parser::new().default_max_tokens(default_max_tokens).max_output_tokens(max_output_tokens);
    match parser.parse(endpoint, Bytes::copy_from_slice(body)) {
        Ok(request) => {
            assert!(request.prompt_tokens >= 1);
            assert!(request.max_tokens >= 1 && request.max_tokens <= max_output_tokens);
            if request.max_tokens_defaulted {
                assert_eq!(request.max_tokens, default_max_tokens.min(max_output_tokens));
            }
            let forwarded: serde_json::Value = serde_json::from_slice(request.forward_body()).expect("forwarded JSON");
            let object = forwarded.as_object().expect("a JSON object");
            assert_eq!(object.get("max_tokens").and_then(|v| v.as_u64()), Some(u64::from(request.max_tokens)));
            for field in GENERATION_LIMITS {
                if let Some(value) = object.get(field) {
                    assert_eq!(value.as_u64(), Some(u64::from(request.max_tokens)), "{field}");
                }
            }
            let _ = request.request().total_tokens();
        }
        Err(error) => {
            assert!(error.status() == 400 || error.status() == 413);
            assert!(!error.code().is_empty() && !error.to_string().is_empty());
            assert_eq!(error.to_response().status().as_u16(), error.status());
        }
    }
    let whole = count(&[body]);
    let cut = usize::from(selector) % (body.len() + 1);
    let (a, b) = body.split_at(cut);
    assert_eq!(count(&[a, b]), whole, "the count depends on where the body was cut ({cut})");
});
