//! kvgate-gateway: an OpenAI-compatible admission gateway in front of one or several inference servers
//! (vLLM, llama.cpp's server, SGLang, Ollama, TGI), built on [`kvgate`].
//!
//! The binary `kvgate-gateway` serves it; this library is what the binary, the demo
//! (`examples/demo.rs`), the tests and the fuzz targets use. See `README.md` for its operation: flags, the
//! config file, tenants, metrics and real servers.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | [`Config`]: what a gateway is built from |
//! | `settings` (feature `cli`) | flags (`clap`) and the TOML file that make a [`Config`] |
//! | [`plan`] | what a `Config` makes: the front admission and one admission per upstream |
//! | [`keys`] | API keys as SHA-256 digests, compared in constant time |
//! | [`tenants`] | keys → tenants, their priority and limits; the priority header |
//! | [`deadline`] | time-to-first-token deadlines: the default and the header that shortens it |
//! | [`budget`] | tenants' daily and monthly token budgets, usage kept in a state file |
//! | [`gate`] | the gateway's admission as the tower layer drives it: front admission, then an upstream |
//! | [`dispatch`] | the line shared by the upstreams, and which upstream a request goes to |
//! | [`upstream`] | one inference server: its engine, its admission, its health |
//! | [`limiter`] | where one set of limits is kept: in process, or shared through Redis |
//! | `shared` (feature `redis`) | `--redis`: the limits every replica shares |
//! | [`health`] | health checks, engine feedback, usage saving |
//! | [`trace`] | request ids, W3C trace context, the per-request log line |
//! | `otel` (feature `otel`) | one span per request to an OpenTelemetry collector (OTLP/HTTP JSON) |
//! | [`server`] | the routes, reading a request before admission, the handler behind it, reloads |
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

pub mod budget;
pub mod config;
pub mod conn;
pub mod deadline;
pub mod dispatch;
pub mod error;
pub mod gate;
pub mod health;
pub mod keys;
pub mod limiter;
pub mod metrics;
#[cfg(feature = "otel")]
pub mod otel;
pub mod plan;
pub mod proxy;
pub mod server;
#[cfg(feature = "cli")]
pub mod settings;
#[cfg(feature = "redis")]
mod shared;
pub mod sim;
pub mod tenants;
pub mod trace;
pub mod units;
pub mod upstream;

pub use config::{BackendConfig, Config, ConfigError, UpstreamConfig};
pub use server::{Gateway, serve, serve_until};
#[cfg(feature = "cli")]
pub use settings::{FromArgsError, Settings};
pub use sim::SimStats;
pub use upstream::{Backend, Upstream};
