//! `kvgate::openai` on arbitrary bytes: the request parser and the output counter never panic, and keep
//! their promises.
//!
//! Input: one selector byte (endpoint, default and largest reservation), then the body. The same bytes
//! are also fed to `OutputTokens` as a response body, whole and cut in two at a point the selector
//! picks: the count must not depend on where the frames were cut.
//!
//! - the byte JSON reader reads the body into the tree serde_json reads (or leaves it to serde_json), and
//!   `is_json` answers as serde_json does;
//! - the body is read as `serde_json::Value` reads it: what `Value` refuses is refused as invalid JSON,
//!   a body that is not an object as such, and a parsed request came from a JSON object;
//! - a parsed request has `prompt_tokens >= 1`, `1 <= max_tokens <= max_output_tokens`, the default when
//!   the client set no limit, and a forwarded body that is a JSON object whose `max_tokens`, and every
//!   other generation limit it has, equals the reservation, and which has each key once (the parser
//!   reads a repeated key's last occurrence; an engine may read the first);
//! - a refusal has status 400 or 413, a code and a message.
#![no_main]

use bytes::Bytes;
use kvgate::openai::{Endpoint, GENERATION_LIMITS, OutputTokens, ParseError, Parser};
use kvgate::stream::OutputCounter;
use libfuzzer_sys::fuzz_target;

/// A JSON object's fields in order, repeated ones included (`serde_json::Map` keeps only the last).
struct Fields(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Fields {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Fields;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Fields, A::Error> {
                let mut fields = Vec::new();
                while let Some(field) = map.next_entry()? {
                    fields.push(field);
                }
                Ok(Fields(fields))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

fn count(frames: &[&[u8]]) -> Option<u32> {
    let mut counter = OutputTokens::new();
    let summed: u32 =
        frames.iter().map(|f| OutputCounter::<[u8]>::count(&mut counter, *f)).fold(0, u32::saturating_add);
    OutputCounter::<[u8]>::total(&counter, summed)
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let endpoint = if selector & 1 == 0 { Endpoint::Chat } else { Endpoint::Completions };
    let default_max_tokens = u32::from(selector >> 4) * 64 + 1;
    let max_output_tokens = u32::from((selector >> 1) & 7) * 1000 + 1;
    let parser = Parser::new().default_max_tokens(default_max_tokens).max_output_tokens(max_output_tokens);
    let value = serde_json::from_slice::<serde_json::Value>(body);
    assert!(kvgate::openai::agrees_with_serde_json(body), "the byte reader and serde_json disagree");
    let parsed = parser.parse(endpoint, Bytes::copy_from_slice(body));
    // With serde_json's `raw_value` feature (axum turns it on in this build), `Value` reads a map opening
    // with serde_json's private raw-value key as the JSON text in its value; the parser, as any JSON
    // reader, reads it as a key.
    let raw_value_token = memchr::memmem::find(body, b"$serde_json::private::RawValue").is_some();
    match (&value, &parsed) {
        _ if raw_value_token => {}
        (Err(_), Err(error)) => assert!(matches!(error, ParseError::InvalidJson(_)), "{error}"),
        (Err(e), Ok(_)) => panic!("serde_json refuses the body ({e}), the parser read it"),
        (Ok(v), Ok(_)) => assert!(v.is_object()),
        (Ok(v), Err(error)) if !v.is_object() => assert!(matches!(error, ParseError::NotAnObject), "{error}"),
        (Ok(_), Err(error)) => {
            assert!(!matches!(error, ParseError::InvalidJson(_) | ParseError::NotAnObject), "{error}")
        }
    }
    match parsed {
        Ok(request) => {
            assert!(request.prompt_tokens >= 1);
            assert!(request.max_tokens >= 1 && request.max_tokens <= max_output_tokens);
            if request.max_tokens_defaulted {
                assert_eq!(request.max_tokens, default_max_tokens.min(max_output_tokens));
            }
            let _ = request.request().total_tokens();
            // `Value` cannot read the forwarded body as an engine would when it holds the raw-value key (see above).
            if !raw_value_token {
                let forwarded: serde_json::Value =
                    serde_json::from_slice(request.forward_body()).expect("forwarded JSON");
                let object = forwarded.as_object().expect("a JSON object");
                assert_eq!(object.get("max_tokens").and_then(|v| v.as_u64()), Some(u64::from(request.max_tokens)));
                let Fields(fields) = serde_json::from_slice(request.forward_body()).expect("forwarded JSON");
                for (field, value) in fields.iter().filter(|(field, _)| GENERATION_LIMITS.contains(&field.as_str())) {
                    assert_eq!(value.as_u64(), Some(u64::from(request.max_tokens)), "{field}");
                }
                let mut keys: Vec<&str> = fields.iter().map(|(key, _)| key.as_str()).collect();
                keys.sort_unstable();
                assert!(keys.windows(2).all(|pair| pair[0] != pair[1]), "a repeated key forwarded: {keys:?}");
            }
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
