//! The gateway as a library of modules, shared by `examples/gateway/main.rs` (the binary),
//! `examples/demo.rs` and the HTTP tests (`tests/gateway_http.rs`), which include this folder with
//! `#[path = ".../examples/gateway/app/mod.rs"] mod app;` and start the gateway in-process.
//!
//! Request path (see [`server`]):
//!
//! ```text
//! POST /v1/chat/completions, /v1/completions
//!   read_completion   axum middleware: buffers the body (limit: 413), parses and checks it (400/413
//!                     with an OpenAI-style error; nothing is reserved), estimates prompt tokens, and puts
//!                     the parsed `Completion` into the request's extensions
//!   AdmissionLayer    kvgate::tower: its mapping function reads `Completion` from the extensions and
//!                     returns `Request::new(prompt_tokens, max_tokens)`; waits in the queue or answers
//!                     429/503 + Retry-After itself; the permit rides in the response body
//!   handler           the simulated engine or the upstream proxy; its body streams through the permit's
//!                     body, so the permit is returned when the last byte is sent or the client goes away
//! ```

// Each includer (the gateway binary, the demo, the tests) uses a different part of these modules.
#![allow(dead_code, unused_imports)]

pub mod config;
pub mod metrics;
pub mod openai;
pub mod proxy;
pub mod server;
pub mod sim;
pub mod tokens;

pub use config::{ArgError, BackendConfig, Config};
pub use server::{Gateway, serve};
pub use sim::SimStats;
