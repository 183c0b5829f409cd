//! The `metrics` feature records the documented names through the facade.
#![cfg(all(feature = "metrics", not(loom)))]

use futures::FutureExt;
use kvgate::{Admission, Request, TenantLimits};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use std::collections::HashMap;

#[test]
fn admission_reports_counters_gauges_and_histograms() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let admission = Admission::builder()
            .max_in_flight(1)
            .kv_capacity_tokens(100)
            .queue_capacity(1)
            .tenant_defaults(TenantLimits::new())
            .build()
            .unwrap();
        let held = admission.try_admit(&Request::new(10, 10).tenant("alice")).unwrap();
        assert!(admission.try_admit(&Request::new(10, 10)).is_err());
        let mut waiting = admission.admit(&Request::new(10, 10));
        assert!((&mut waiting).now_or_never().is_none());
        admission.publish_metrics();
        drop(held);
        drop(waiting.now_or_never().unwrap().unwrap());
    });
    let values: HashMap<String, Vec<(Vec<String>, DebugValue)>> =
        snapshotter.snapshot().into_vec().into_iter().fold(HashMap::new(), |mut map, (key, _, _, value)| {
            let labels = key.key().labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            map.entry(key.key().name().to_string()).or_default().push((labels, value));
            map
        });
    let counter = |name: &str| -> u64 {
        values.get(name).map_or(0, |v| v.iter().map(|(_, d)| if let DebugValue::Counter(c) = d { *c } else { 0 }).sum())
    };
    assert_eq!(counter("kvgate_requests_admitted_total"), 2);
    assert_eq!(counter("kvgate_requests_rejected_total"), 1);
    let rejected = &values["kvgate_requests_rejected_total"][0].0;
    assert!(
        rejected.contains(&"reason=no_capacity".to_string()) && rejected.contains(&"tenant_class=none".to_string())
    );
    for gauge in ["kvgate_num_requests_running", "kvgate_num_requests_waiting", "kvgate_kv_cache_usage_perc"] {
        assert!(values.contains_key(gauge), "{gauge} missing");
    }
    let waiting = &values["kvgate_num_requests_waiting"][0].1;
    assert!(matches!(waiting, DebugValue::Gauge(g) if g.into_inner() == 1.0), "{waiting:?}");
    assert!(matches!(&values["kvgate_request_queue_time_seconds"][0].1, DebugValue::Histogram(h) if h.len() == 1));
    assert!(matches!(&values["kvgate_request_hold_time_seconds"][0].1, DebugValue::Histogram(h) if h.len() == 2));
    assert!(values.contains_key("kvgate_tenant_requests_running"));
}
