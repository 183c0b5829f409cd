//! An OpenAI-compatible admission gateway: kvgate in front of one inference server.
//!
//! ```text
//! cargo run --release --example gateway --features tower -- --max-in-flight 32 --kv-tokens 200000
//! cargo run --release --example gateway --features tower -- --upstream http://localhost:8000 \
//!     --model llama-3.1-8b --gpu l4 --max-in-flight 64
//! ```
//!
//! See `--help` for the flags and `app/metrics.rs` for the metric names. The modules under `app/` are
//! shared with the demo (`examples/demo.rs`) and the HTTP tests (`tests/gateway_http.rs`).

mod app;

use app::{ArgError, Config, Gateway};

#[tokio::main]
async fn main() {
    let config = match Config::from_args(std::env::args().skip(1)) {
        Ok(config) => config,
        Err(ArgError::Help) => {
            print!("{}", app::config::USAGE);
            return;
        }
        Err(ArgError::Bad(message)) => {
            eprintln!("error: {message}");
            std::process::exit(2);
        }
    };
    let gateway = match Gateway::new(config.clone()) {
        Ok(gateway) => gateway,
        Err(message) => {
            eprintln!("error: {message}");
            std::process::exit(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", config.listen);
            std::process::exit(1);
        }
    };
    let snapshot = gateway.admission().snapshot();
    let backend = match &config.backend {
        app::BackendConfig::Simulated { tokens_per_sec } => format!("simulated backend, {tokens_per_sec} tokens/s"),
        app::BackendConfig::Upstream(url) => format!("upstream {url}"),
    };
    let kv = if snapshot.kv_capacity == u64::MAX { "unlimited".to_owned() } else { snapshot.kv_capacity.to_string() };
    eprintln!(
        "kvgate gateway on http://{} -> {backend}; max in flight {}, queue {}, KV budget {kv}",
        listener.local_addr().map_or(config.listen, |a| a),
        snapshot.max_in_flight,
        snapshot.queue_capacity,
    );
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    if let Err(e) = axum::serve(listener, gateway.router()).with_graceful_shutdown(shutdown).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
