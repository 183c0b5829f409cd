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
//! | `kvgate_gateway_tenant_requests_running` | gauge | `tenant` | in flight per configured tenant, for the 10 busiest |
//! | `kvgate_gateway_tenant_tokens_used` | gauge | `tenant`, `period` (`day`, `month`, `total`) | prompt + output tokens charged to each configured tenant |
//! | `kvgate_gateway_tenant_tokens_budget` | gauge | `tenant`, `period` (`day`, `month`) | its budget, where it has one |
//! | `kvgate_gateway_upstream_in_service` | gauge | `upstream` | 1 while the upstream takes requests, 0 while it is out |
//! | `kvgate_gateway_upstream_requests_running` | gauge | `upstream` | requests running on it |
//! | `kvgate_gateway_upstream_kv_cache_used`, `kvgate_gateway_upstream_kv_cache_capacity` | gauge | `upstream` | KV units it holds / its budget (the front admission's `unit`) |
//! | `kvgate_gateway_upstream_prefixes` | gauge | `upstream` | shared prompt prefixes held on it now (`--prefix-sharing`) |
//! | `kvgate_gateway_upstream_prefix_kv_saved_total` | counter | `upstream` | KV units requests did not reserve because their prefix was held already |
//! | `kvgate_gateway_requests_waiting_for_upstream` | gauge | — | requests admitted by the front admission, waiting for an upstream with room |
//! | `kvgate_sim_num_requests_running`, `kvgate_sim_peak_requests_running`, `kvgate_sim_kv_cache_used`, `kvgate_sim_peak_kv_cache_used`, `kvgate_sim_overflows_total`, `kvgate_sim_generation_tokens_total` | gauge | `upstream` | the simulated engines' books |
//!
//! The recorder is process-wide (the `metrics` facade has one): several gateways in one process (tests)
//! share it.

use crate::budget::{BudgetLimits, Usage};
use crate::upstream::Upstream;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

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
/// `tenant` is its label: the tenant's name, `unlisted`, or `None` for `none`.
pub fn response(status: u16, tenant: Option<metrics::SharedString>) {
    // The statuses the gateway answers with, as static labels (no text made per answer).
    let status: metrics::SharedString = match status {
        200 => "200".into(),
        400 => "400".into(),
        401 => "401".into(),
        408 => "408".into(),
        413 => "413".into(),
        429 => "429".into(),
        502 => "502".into(),
        503 => "503".into(),
        504 => "504".into(),
        other => other.to_string().into(),
    };
    let tenant = tenant.unwrap_or_else(|| "none".into());
    metrics::counter!("kvgate_gateway_responses_total", "status" => status, "tenant" => tenant).increment(1);
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

/// What the gauges read at scrape time are set from.
#[derive(Debug)]
pub struct Published<'a> {
    /// Request-body bytes held.
    pub buffered: usize,
    /// The busiest configured tenants and their requests in flight.
    pub tenants: &'a [(Arc<str>, u64)],
    /// The upstreams.
    pub upstreams: &'a [Arc<Upstream>],
    /// Requests waiting for an upstream.
    pub waiting_for_upstream: usize,
    /// Usage by tenant.
    pub usage: &'a BTreeMap<String, Usage>,
    /// Budgets by tenant.
    pub budgets: &'a [BudgetLimits],
}

/// Sets the gauges read at scrape time.
pub fn publish(p: &Published<'_>) {
    metrics::gauge!("kvgate_gateway_buffered_bytes").set(p.buffered as f64);
    metrics::gauge!("kvgate_gateway_requests_waiting_for_upstream").set(p.waiting_for_upstream as f64);
    for (name, running) in p.tenants {
        metrics::gauge!("kvgate_gateway_tenant_requests_running", "tenant" => name.to_string()).set(*running as f64);
    }
    for budget in p.budgets {
        let tenant = budget.name.to_string();
        if let Some(usage) = p.usage.get(&*budget.name) {
            for (period, used) in
                [("day", usage.day_tokens), ("month", usage.month_tokens), ("total", usage.total_tokens)]
            {
                metrics::gauge!("kvgate_gateway_tenant_tokens_used", "tenant" => tenant.clone(), "period" => period)
                    .set(used as f64);
            }
        }
        for (period, limit) in [("day", budget.daily), ("month", budget.monthly)] {
            if let Some(limit) = limit {
                metrics::gauge!("kvgate_gateway_tenant_tokens_budget", "tenant" => tenant.clone(), "period" => period)
                    .set(limit as f64);
            }
        }
    }
    for upstream in p.upstreams {
        let name = upstream.name.to_string();
        let s = upstream.limiter.local().snapshot();
        metrics::gauge!("kvgate_gateway_upstream_in_service", "upstream" => name.clone())
            .set(if upstream.is_healthy() { 1.0 } else { 0.0 });
        metrics::gauge!("kvgate_gateway_upstream_requests_running", "upstream" => name.clone()).set(s.in_flight as f64);
        metrics::gauge!("kvgate_gateway_upstream_kv_cache_used", "upstream" => name.clone()).set(s.kv_used as f64);
        if s.kv_capacity != u64::MAX {
            metrics::gauge!("kvgate_gateway_upstream_kv_cache_capacity", "upstream" => name.clone())
                .set(s.kv_capacity as f64);
        }
        metrics::gauge!("kvgate_gateway_upstream_prefixes", "upstream" => name.clone()).set(s.prefixes as f64);
        metrics::counter!("kvgate_gateway_upstream_prefix_kv_saved_total", "upstream" => name.clone())
            .absolute(s.kv_saved_by_prefixes);
        if let Some(sim) = upstream.sim_stats() {
            let label = || ("upstream", name.clone());
            metrics::gauge!("kvgate_sim_num_requests_running", &[label()]).set(sim.running as f64);
            metrics::gauge!("kvgate_sim_peak_requests_running", &[label()]).set(sim.peak_running as f64);
            metrics::gauge!("kvgate_sim_kv_cache_used", &[label()]).set(sim.kv_in_use as f64);
            metrics::gauge!("kvgate_sim_peak_kv_cache_used", &[label()]).set(sim.peak_kv_in_use as f64);
            metrics::gauge!("kvgate_sim_overflows_total", &[label()]).set(sim.overflows as f64);
            metrics::gauge!("kvgate_sim_generation_tokens_total", &[label()]).set(sim.tokens_generated as f64);
        }
    }
}
