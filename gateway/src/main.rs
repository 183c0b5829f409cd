//! `kvgate-gateway`: the OpenAI-compatible admission gateway. `--help` lists the flags; the crate's
//! `README.md` explains them.

use kvgate_gateway::settings::FromArgsError;
use kvgate_gateway::{BackendConfig, Config, Gateway, units};

#[tokio::main]
async fn main() {
    let config = match Config::from_args(std::env::args_os()) {
        Ok(config) => config,
        Err(FromArgsError::Flags(e)) => e.exit(),
        Err(FromArgsError::Config(e)) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let gateway = match Gateway::new(config.clone()) {
        Ok(gateway) => gateway,
        Err(e) => {
            eprintln!("error: {e}");
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
        BackendConfig::Simulated { tokens_per_sec } => format!("simulated engine, {tokens_per_sec} tokens/s"),
        BackendConfig::Upstream(url) => format!("upstream {}", kvgate_gateway::proxy::redact(url)),
    };
    let kv = units::kv(snapshot.kv_capacity, gateway.admission().kv_in_bytes());
    eprintln!(
        "kvgate-gateway on http://{} -> {backend}; max in flight {}, queue {}, KV budget {kv}{}",
        listener.local_addr().map_or(config.listen, |a| a),
        snapshot.max_in_flight,
        snapshot.queue_capacity,
        if config.tenants.is_empty() { String::new() } else { format!(", {} tenants", config.tenants.len()) },
    );
    let shutdown = async {
        #[cfg(unix)]
        {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("a SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("kvgate-gateway: shutting down: admission closed, running answers finish");
    };
    if let Err(e) = kvgate_gateway::serve_until(listener, gateway, shutdown).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
