//! OpenAI-compatible requests and answers, for services that put kvgate in front of an engine (vLLM,
//! llama.cpp's server, SGLang, Ollama, TGI): read a chat/completions body into a
//! [`Request`](crate::Request) ([`Parser`]), forward a body the engine cannot generate more than was
//! reserved from, and count the answer's output tokens ([`OutputTokens`]).
//!
//! Requires the `openai` feature (`serde_json`, and the `http-body` feature).
//!
//! # The handler recipe
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::{Either, Full};
//! use kvgate::http::{PermitBody, insert_rate_limit_headers, rejection_response};
//! use kvgate::openai::{Endpoint, OutputTokens, Parser};
//! use kvgate::Admission;
//!
//! type Body = Either<PermitBody<Full<Bytes>, OutputTokens>, Full<Bytes>>;
//!
//! async fn chat(admission: &Admission, parser: &Parser, tenant: &str, body: Bytes) -> http::Response<Body> {
//!     let chat = match parser.parse(Endpoint::Chat, body) {
//!         Ok(chat) => chat,
//!         Err(err) => return err.to_response().map(|b| Either::Right(Full::new(b))), // 400/413, nothing reserved
//!     };
//!     let request = chat.request().tenant(tenant);
//!     let mut response = match admission.admit(&request).await {
//!         Ok(permit) => {
//!             // Forward `chat.forward_body()` to the engine; here a canned answer stands in for its reply.
//!             let answer = Full::new(Bytes::from_static(br#"{"choices":[],"usage":{"completion_tokens":42}}"#));
//!             http::Response::new(Either::Left(PermitBody::new(answer, permit).count_with(OutputTokens::new())))
//!         }
//!         Err(rejection) => rejection_response(&rejection, admission, false).map(|b| Either::Right(Full::new(b))),
//!     };
//!     insert_rate_limit_headers(response.headers_mut(), &admission.rate_status(request.tenant));
//!     response
//! }
//!
//! let admission = Admission::builder().kv_capacity_tokens(8_192).token_rate(1_000.0, 10_000).build()?;
//! let body = Bytes::from_static(br#"{"model":"m","max_tokens":100,"messages":[{"role":"user","content":"Hi"}]}"#);
//! let response = futures::executor::block_on(chat(&admission, &Parser::new(), "alice", body));
//! assert_eq!(response.status(), 200);
//! assert!(response.headers().contains_key("x-ratelimit-remaining-tokens"));
//! drop(response); // sent: the permit is completed with the answer's 42 output tokens
//! assert_eq!(admission.snapshot().in_flight, 0);
//! # Ok::<(), kvgate::ConfigError>(())
//! ```
//!
//! With tower, [`AdmissionLayer::new_async`](crate::tower::AdmissionLayer::new_async) does the same with
//! a function that reads the body and calls [`Parser::parse`].
//!
//! # What the parser guarantees
//!
//! - The prompt estimate counts everything a chat template renders (messages with their names, tool
//!   calls and tool results, tool and function definitions, documents), so text outside
//!   `messages[].content` is not free.
//! - The output reservation is the client's generation limit or the default, at most
//!   [`max_output_tokens`](Parser::max_output_tokens); the forwarded body has every limit an engine
//!   reads ([`GENERATION_LIMITS`]) set to it, and requests for several sequences (`n`, `best_of`, beam
//!   search, several prompts) are refused.
//! - A parsed request holds one copy of the body (the one to forward), nothing else.

mod error;
mod estimate;
mod json;
mod json_reader;
mod output;
mod request;

pub use error::ParseError;
pub use estimate::{Heuristic, PromptEstimator};
#[cfg(feature = "fuzz-hooks")]
#[doc(hidden)]
pub use json_reader::agrees_with_serde_json;
pub use json_reader::is_json;
pub use output::OutputTokens;
pub use request::{
    CompletionRequest, DEFAULT_MAX_OUTPUT_TOKENS, DEFAULT_MAX_TOKENS, Endpoint, GENERATION_LIMITS, Parser,
};
