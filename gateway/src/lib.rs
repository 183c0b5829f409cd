//! kvgate-gateway: an OpenAI-compatible admission gateway in front of one inference server (vLLM,
//! llama.cpp's server, SGLang, Ollama, TGI), built on [`kvgate`].
//!
//! The binary `kvgate-gateway` serves it; this library is what the binary, the demo
//! (`examples/demo.rs`), the tests and the fuzz targets use. See `README.md` for its operation: flags, the
//! config file, tenants, metrics and real servers.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | [`Config`]: what a gateway is built from |
//! | `settings` (feature `cli`) | flags (`clap`) and the TOML file that make a [`Config`] |
//! | [`tenants`] | API keys → tenants, their priority and limits |
//! | [`server`] | the routes, reading a request before admission, the handler behind it |
//! | [`conn`] | connections: cap, header and send deadlines, graceful shutdown |
//! | [`proxy`] | forwarding to an upstream and passing its answer on |
//! | [`sim`] | the simulated engine |
//! | [`metrics`] | `/metrics` |
//! | [`error`] | the gateway's own OpenAI-style errors |
//! | [`units`] | durations read from settings, sizes written for people |
//!
//! # Examples
//!
//! ```no_run
//! use kvgate_gateway::{Config, Gateway};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let gateway = Gateway::new(Config { max_in_flight: 8, kv_tokens: Some(32_000), ..Config::default() })?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! kvgate_gateway::serve_until(listener, gateway, async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs, missing_debug_implementations)]

pub mod config;
pub mod conn;
pub mod error;
pub mod metrics;
pub mod proxy;
pub mod server;
#[cfg(feature = "cli")]
pub mod settings;
pub mod sim;
pub mod tenants;
pub mod units;

pub use config::{BackendConfig, Config, ConfigError};
pub use server::{Backend, Gateway, serve, serve_until};
#[cfg(feature = "cli")]
pub use settings::{FromArgsError, Settings};
pub use sim::SimStats;
