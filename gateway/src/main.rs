//! `kvgate-gateway`: the OpenAI-compatible admission gateway. `--help` lists the flags; the crate's
//! `README.md` explains them.

use clap::Parser as _;
use kvgate_gateway::settings::{FromArgsError, Settings};
use kvgate_gateway::{Config, Gateway, units};
use std::io::Read as _;
use std::sync::Arc;

/// Requests allocate and free on whichever worker runs them; mimalloc's per-thread heaps keep that off
/// the system allocator's arena locks.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() {
    let mut flags = match Settings::try_parse() {
        Ok(flags) => flags,
        Err(e) => e.exit(),
    };
    if flags.hash_key {
        let mut key = String::new();
        if let Err(e) = std::io::stdin().read_to_string(&mut key) {
            eprintln!("error: cannot read the key from standard input: {e}");
            std::process::exit(2);
        }
        let key = key.trim();
        if key.is_empty() {
            eprintln!("error: no key on standard input (echo -n \"$KEY\" | kvgate-gateway --hash-key)");
            std::process::exit(2);
        }
        println!("{}", kvgate_gateway::keys::KeyHash::of(key));
        return;
    }
    // The binary logs one line per request to standard error unless told otherwise.
    flags.request_log.get_or_insert_with(|| "-".into());
    let config = match Config::from_settings(flags.clone()) {
        Ok(config) => config,
        Err(FromArgsError::Flags(e)) => e.exit(),
        Err(FromArgsError::Config(e)) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let gateway = match Gateway::connect(config.clone()).await {
        Ok(gateway) => gateway,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let source = flags.clone();
    gateway.set_config_source(Arc::new(move || {
        Config::from_settings(source.clone()).map_err(|e| match e {
            FromArgsError::Config(e) => e,
            FromArgsError::Flags(e) => kvgate_gateway::ConfigError::Conflict(e.to_string()),
        })
    }));
    let listener = match tokio::net::TcpListener::bind(config.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("error: cannot listen on {}: {e}", config.listen);
            std::process::exit(1);
        }
    };
    let snapshot = gateway.admission().snapshot();
    let upstreams: Vec<String> = gateway
        .upstreams()
        .iter()
        .map(|u| match u.proxy() {
            Some(proxy) => format!("{} ({})", u.name, proxy.shown()),
            None => format!("{} (simulated engine)", u.name),
        })
        .collect();
    let kv = units::kv(snapshot.kv_capacity, gateway.admission().kv_in_bytes());
    eprintln!(
        "kvgate-gateway on http://{} -> {}; max in flight {}, queue {}, KV budget {kv}{}{}{}",
        listener.local_addr().map_or(config.listen, |a| a),
        upstreams.join(", "),
        snapshot.max_in_flight,
        snapshot.queue_capacity,
        if config.tenants.is_empty() { String::new() } else { format!(", {} tenants", config.tenants.len()) },
        config.admin_listen.map_or(String::new(), |a| format!(", admin on http://{a}")),
        if config.redis.is_some() { ", limits shared through Redis" } else { "" },
    );
    #[cfg(unix)]
    {
        let gateway = gateway.clone();
        tokio::spawn(async move {
            let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
            while hup.recv().await.is_some() {
                match gateway.reload_from_source().await {
                    Ok(()) => eprintln!("kvgate-gateway: configuration reloaded (SIGHUP)"),
                    Err(e) => eprintln!("kvgate-gateway: reload refused, the old configuration keeps running: {e}"),
                }
            }
        });
    }
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
        eprintln!(
            "kvgate-gateway: shutting down: no new connections, waiting requests get 503, running answers finish"
        );
    };
    if let Err(e) = kvgate_gateway::serve_until(listener, gateway, shutdown).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
