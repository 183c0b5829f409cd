//! The gateway's background work while it serves: health checks of the upstreams (see
//! [`upstream`](crate::upstream) for the rules), engine feedback (`--engine-feedback`: each engine's
//! `/metrics` corrects its KV budget through [`kvgate::feedback`]), and saving usage every two seconds
//! when it changed.

use crate::server::Gateway;
use kvgate::clock::Clock;
use kvgate::feedback::{EngineFeedback, EngineMetrics, FeedbackConfig, Quantity};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often usage is saved when it changed.
pub const SAVE_EVERY: Duration = Duration::from_secs(2);

/// Starts the background tasks; they end when `stopped` turns `true` (or are aborted).
pub fn spawn(gateway: &Gateway, stopped: watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
    let config = gateway.config();
    let mut tasks = Vec::new();
    if gateway.upstreams().iter().any(|u| u.proxy().is_some()) {
        tasks.push(tokio::spawn(health_checks(gateway.clone(), config.health_interval, stopped.clone())));
    }
    if let Some(every) = config.engine_feedback {
        tasks.push(tokio::spawn(engine_feedback(gateway.clone(), every, stopped.clone())));
    }
    if config.state_file.is_some() {
        let gateway = gateway.clone();
        tasks.push(tokio::spawn(repeat(SAVE_EVERY, stopped, move || {
            if let Err(e) = gateway.save_usage() {
                eprintln!("kvgate-gateway: could not save usage: {e}");
            }
            std::future::ready(())
        })));
    }
    tasks
}

/// Resolves once `stopped` turns `true` (or its sender is gone).
pub async fn until_stopped(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await.map(|_| ());
}

/// Runs `work` every `every` until `stopped`.
async fn repeat<F, Fut>(every: Duration, mut stopped: watch::Receiver<bool>, mut work: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => work().await,
            () = until_stopped(&mut stopped) => return,
        }
    }
}

async fn health_checks(gateway: Gateway, every: Duration, stopped: watch::Receiver<bool>) {
    repeat(every, stopped, || {
        let gateway = gateway.clone();
        async move {
            let checks = gateway.upstreams().iter().filter_map(|upstream| {
                let proxy = upstream.proxy()?;
                Some(async move {
                    let passed =
                        proxy.healthy(upstream.health_path.as_deref(), every.min(Duration::from_secs(5))).await;
                    (upstream, passed)
                })
            });
            let mut changed = false;
            for (upstream, passed) in futures::future::join_all(checks).await {
                if upstream.health_check(passed) {
                    changed = true;
                    let state = if passed { "back in service" } else { "out of service: its health check failed" };
                    eprintln!("kvgate-gateway: upstream {} {state}", upstream.name);
                }
            }
            if changed {
                gateway.capacity_changed();
            }
        }
    })
    .await;
}

async fn engine_feedback(gateway: Gateway, every: Duration, stopped: watch::Receiver<bool>) {
    // One corrector per upstream with a KV budget and a real engine.
    let mut correctors: Vec<_> = gateway
        .upstreams()
        .iter()
        .filter(|u| u.proxy().is_some())
        .filter_map(|u| match EngineFeedback::new(u.limiter.local().clone(), FeedbackConfig::new()) {
            Ok(corrector) => Some((std::sync::Arc::clone(u), corrector)),
            Err(e) => {
                eprintln!("kvgate-gateway: no engine feedback for upstream {}: {e}", u.name);
                None
            }
        })
        .collect();
    let correctors = std::sync::Arc::new(tokio::sync::Mutex::new(std::mem::take(&mut correctors)));
    repeat(every, stopped, || {
        let (gateway, correctors) = (gateway.clone(), std::sync::Arc::clone(&correctors));
        async move {
            let mut correctors = correctors.lock().await;
            let mut changed = false;
            for (upstream, corrector) in correctors.iter_mut() {
                let Some(proxy) = upstream.proxy() else { continue };
                let metrics = match proxy.engine_metrics(every.min(Duration::from_secs(5))).await {
                    Ok(text) => EngineMetrics::parse(&text).map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                match metrics {
                    Ok(metrics) => {
                        if let Some(waiting) = metrics.get(Quantity::RequestsWaiting) {
                            upstream.set_engine_waiting(waiting.max(0.0) as u64);
                        }
                        let now = Duration::from_nanos(upstream.limiter.local().clock().now_nanos());
                        let correction = corrector.update(now, &metrics);
                        if correction.changed() {
                            changed = true;
                            eprintln!(
                                "kvgate-gateway: upstream {}: KV budget {} -> {} ({})",
                                upstream.name,
                                correction.from,
                                correction.to,
                                correction.reason.as_str()
                            );
                        }
                    }
                    Err(e) => eprintln!("kvgate-gateway: engine feedback from upstream {}: {e}", upstream.name),
                }
            }
            if changed {
                gateway.capacity_changed();
            }
        }
    })
    .await;
}
