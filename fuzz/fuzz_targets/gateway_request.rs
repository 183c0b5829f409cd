//! The gateway's request parsing (`examples/gateway/app/openai.rs`) on arbitrary bodies: it never
//! panics; it answers 400 or 413 with a machine-readable code, or a request whose prompt and output
//! reservations are usable by admission (`prompt_tokens >= 1`; `max_tokens` the client's or the default).
#![no_main]

use libfuzzer_sys::fuzz_target;

// The modules sit at the crate root so that `openai`'s `super::tokens` resolves as in the example.
#[allow(dead_code)]
#[path = "../../examples/gateway/app/openai.rs"]
mod openai;
#[allow(dead_code)]
#[path = "../../examples/gateway/app/tokens.rs"]
mod tokens;

use openai::{Endpoint, parse};
use tokens::Heuristic;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let endpoint = if selector & 1 == 0 { Endpoint::Chat } else { Endpoint::Completions };
    let default_max_tokens = u32::from(selector >> 1) * 16 + 1;
    match parse(endpoint, bytes::Bytes::copy_from_slice(body), &Heuristic, default_max_tokens) {
        Ok(request) => {
            assert!(request.prompt_tokens >= 1);
            if request.defaulted {
                assert_eq!(request.max_tokens, default_max_tokens);
            }
            let total = u64::from(request.prompt_tokens) + u64::from(request.max_tokens);
            let _ = kvgate::Request::new(request.prompt_tokens, request.max_tokens);
            assert!(total >= 1);
        }
        Err(error) => {
            assert!(
                error.status == http::StatusCode::BAD_REQUEST || error.status == http::StatusCode::PAYLOAD_TOO_LARGE
            );
            assert!(!error.code.is_empty() && !error.message.is_empty());
        }
    }
});
