//! Operator signals: metrics through the [`metrics`](https://docs.rs/metrics) facade (feature `metrics`)
//! and `tracing` events around admission decisions (feature `tracing`). Without the features every
//! function here is an empty inline function, so the hot path pays nothing.
//!
//! The application installs the exporter (Prometheus, StatsD, ...); kvgate only records. Names follow
//! vLLM's where one exists, so dashboards, Kubernetes autoscalers (HPA/KEDA on queue depth) and the
//! Gateway API inference extension's endpoint picker can read them:
//!
//! | name | kind | labels | meaning |
//! |---|---|---|---|
//! | `kvgate_requests_admitted_total` | counter | `priority` | requests admitted |
//! | `kvgate_requests_rejected_total` | counter | `reason`, `tenant_class` | requests rejected (`tenant_class`: `none` or `tenant`) |
//! | `kvgate_request_queue_time_seconds` | histogram | — | time from queueing to admission, waited requests only |
//! | `kvgate_request_hold_time_seconds` | histogram | — | time a permit was held |
//! | `kvgate_num_requests_running` | gauge | — | permits alive (like vLLM's `num_requests_running`) |
//! | `kvgate_num_requests_waiting` | gauge | — | requests queued (like vLLM's `num_requests_waiting`) |
//! | `kvgate_kv_cache_usage_perc` | gauge | — | KV budget in use, 0–1 (like vLLM's `kv_cache_usage_perc`) |
//! | `kvgate_kv_cache_used`, `kvgate_kv_cache_capacity` | gauge | `unit` (`tokens`/`bytes`) | KV units held / budget |
//! | `kvgate_tenant_requests_running` | gauge | `tenant` | in flight per tenant, for the busiest 10 (the name it was configured with, else `tenant-` and its id in hex) |
//! | `kvgate_tenants_tracked` | gauge | — | tenants with state |
//!
//! Counters and histograms are recorded as events happen; gauges are set by
//! [`Admission::publish_metrics`](crate::Admission::publish_metrics), which the application calls
//! periodically or when it is scraped.

use crate::Rejection;

/// Records an admission.
#[inline]
pub(crate) fn admitted(priority: crate::Priority) {
    // Literal labels only: the `metrics` macros then build the key statically, so recording allocates
    // nothing (the zero-allocation test runs with every feature on).
    #[cfg(feature = "metrics")]
    match priority {
        crate::Priority::Batch => {
            metrics::counter!("kvgate_requests_admitted_total", "priority" => "batch").increment(1)
        }
        crate::Priority::Normal => {
            metrics::counter!("kvgate_requests_admitted_total", "priority" => "normal").increment(1)
        }
        crate::Priority::Interactive => {
            metrics::counter!("kvgate_requests_admitted_total", "priority" => "interactive").increment(1)
        }
    }
    #[cfg(feature = "tracing")]
    tracing::trace!(target: "kvgate", priority = priority.as_str(), "admitted");
    let _ = priority;
}

/// Records a rejection.
#[inline]
pub(crate) fn rejected(rejection: &Rejection, has_tenant: bool) {
    // One arm per reason, generated from the one list (`with_rejection_reasons!`), with literal labels.
    #[cfg(feature = "metrics")]
    macro_rules! count_rejection {
        ($($variant:ident, $field:ident, $label:literal;)*) => {
            match (rejection, has_tenant) {
                $(
                    (Rejection::$variant { .. }, true) => metrics::counter!(
                        "kvgate_requests_rejected_total", "reason" => $label, "tenant_class" => "tenant"
                    )
                    .increment(1),
                    (Rejection::$variant { .. }, false) => metrics::counter!(
                        "kvgate_requests_rejected_total", "reason" => $label, "tenant_class" => "none"
                    )
                    .increment(1),
                )*
            }
        };
    }
    #[cfg(feature = "metrics")]
    crate::admission::with_rejection_reasons!(count_rejection);
    #[cfg(feature = "tracing")]
    tracing::debug!(target: "kvgate", reason = rejection.reason(), retry_after = ?rejection.retry_after(), has_tenant, "rejected");
    let _ = (rejection, has_tenant);
}

/// Records how long a waiter waited before it was admitted.
#[inline]
pub(crate) fn queue_wait(nanos: u64) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("kvgate_request_queue_time_seconds").record(nanos as f64 * 1e-9);
    let _ = nanos;
}

/// Whether waiters should read the clock to report their queue time.
pub(crate) const QUEUE_TIMES: bool = cfg!(feature = "metrics");

/// Whether permit drops should read the clock to report their hold time.
pub(crate) const HOLD_TIMES: bool = cfg!(feature = "metrics");

/// Records how long a permit was held.
#[inline]
pub(crate) fn hold_time(nanos: u64) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("kvgate_request_hold_time_seconds").record(nanos as f64 * 1e-9);
    let _ = nanos;
}

/// Sets the gauges from a snapshot (see `Admission::publish_metrics`).
#[cfg(feature = "metrics")]
pub(crate) fn publish(
    snapshot: &crate::Snapshot,
    kv_unit: &'static str,
    tenants_tracked: usize,
    busiest: &[(String, u64)],
) {
    metrics::gauge!("kvgate_num_requests_running").set(snapshot.in_flight as f64);
    metrics::gauge!("kvgate_num_requests_waiting").set(snapshot.queued as f64);
    metrics::gauge!("kvgate_kv_cache_usage_perc").set(snapshot.kv_usage());
    metrics::gauge!("kvgate_kv_cache_used", "unit" => kv_unit).set(snapshot.kv_used as f64);
    if snapshot.kv_capacity != u64::MAX {
        metrics::gauge!("kvgate_kv_cache_capacity", "unit" => kv_unit).set(snapshot.kv_capacity as f64);
    }
    metrics::gauge!("kvgate_tenants_tracked").set(tenants_tracked as f64);
    for (tenant, running) in busiest {
        metrics::gauge!("kvgate_tenant_requests_running", "tenant" => tenant.clone()).set(*running as f64);
    }
}
