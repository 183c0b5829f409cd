//! `GET /metrics`: the crate's own metrics (`kvgate_*`, recorded by `kvgate` through the `metrics`
//! facade and documented once, in the crate's "Metrics for operators"), rendered in the Prometheus text
//! format by `metrics-exporter-prometheus`, plus the gateway's own (`kvgate_gateway_*`) and, with the
//! simulated engine, its books (`kvgate_sim_*`):
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `kvgate_gateway_requests_invalid_total` | counter | `code` | requests refused before admission (malformed JSON, unreadable or slow body, unknown key, ...) |
//! | `kvgate_gateway_responses_total` | counter | `status`, `tenant` | answers to completion requests, by status and tenant name (`none` without tenants) |
//! | `kvgate_gateway_upstream_errors_total` | counter | `code` | upstream failures (`upstream_unreachable`, `upstream_timeout`, `upstream_busy`, ...) |
//! | `kvgate_gateway_connections` | gauge | — | client connections open |
//! | `kvgate_gateway_connections_closed_total` | counter | `reason` | connections the gateway closed: `header_timeout`, `send_timeout` |
//! | `kvgate_gateway_buffered_bytes` | gauge | — | request-body bytes held (waiting or being forwarded) |
//! | `kvgate_gateway_tenant_requests_running` | gauge | `tenant` | in flight per tenant name, for the 10 busiest |
//! | `kvgate_sim_num_requests_running`, `kvgate_sim_peak_requests_running`, `kvgate_sim_kv_cache_used`, `kvgate_sim_peak_kv_cache_used`, `kvgate_sim_overflows_total`, `kvgate_sim_generation_tokens_total` | gauge | — | the simulated engine's books |
//!
//! The recorder is process-wide (the `metrics` facade has one): several gateways in one process (tests)
//! share it.

use crate::sim::SimStats;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::sync::OnceLock;

/// Upper bounds of the histograms' buckets, seconds.
pub const TIME_BUCKETS: [f64; 14] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// The process's Prometheus recorder: installed on first use.
///
/// If another recorder was installed first (an application embedding the gateway with its own
/// exporter), the metrics go there and `/metrics` renders only what this handle saw.
pub fn handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new().set_buckets(&TIME_BUCKETS).expect("the bucket list is not empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                eprintln!(
                    "kvgate-gateway: a metrics recorder was already installed; /metrics shows only the gateway's view"
                );
            }
            handle
        })
        .clone()
}

/// Counts a request refused before admission.
pub fn invalid(code: &'static str) {
    metrics::counter!("kvgate_gateway_requests_invalid_total", "code" => code).increment(1);
}

/// Counts an answer to a completion request.
pub fn response(status: u16, tenant: Option<&str>) {
    let tenant = tenant.unwrap_or("none").to_owned();
    metrics::counter!("kvgate_gateway_responses_total", "status" => status.to_string(), "tenant" => tenant)
        .increment(1);
}

/// Counts an upstream failure.
pub fn upstream_error(code: &'static str) {
    metrics::counter!("kvgate_gateway_upstream_errors_total", "code" => code).increment(1);
}

/// Counts a connection the gateway closed.
pub fn connection_closed(reason: &'static str) {
    metrics::counter!("kvgate_gateway_connections_closed_total", "reason" => reason).increment(1);
}

/// Sets the open-connection gauge.
pub fn connections(open: usize) {
    metrics::gauge!("kvgate_gateway_connections").set(open as f64);
}

/// Sets the gauges read at scrape time.
pub fn publish(buffered: usize, tenants: &[(std::sync::Arc<str>, u64)], sim: Option<&SimStats>) {
    metrics::gauge!("kvgate_gateway_buffered_bytes").set(buffered as f64);
    for (name, running) in tenants {
        metrics::gauge!("kvgate_gateway_tenant_requests_running", "tenant" => name.to_string()).set(*running as f64);
    }
    if let Some(sim) = sim {
        metrics::gauge!("kvgate_sim_num_requests_running").set(sim.running as f64);
        metrics::gauge!("kvgate_sim_peak_requests_running").set(sim.peak_running as f64);
        metrics::gauge!("kvgate_sim_kv_cache_used").set(sim.kv_in_use as f64);
        metrics::gauge!("kvgate_sim_peak_kv_cache_used").set(sim.peak_kv_in_use as f64);
        metrics::gauge!("kvgate_sim_overflows_total").set(sim.overflows as f64);
        metrics::gauge!("kvgate_sim_generation_tokens_total").set(sim.tokens_generated as f64);
    }
}
