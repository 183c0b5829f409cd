//! `GET /metrics` in the Prometheus text format.
//!
//! | name | type | meaning |
//! |---|---|---|
//! | `kvgate:num_requests_running` (`vllm:num_requests_running`) | gauge | requests holding a permit (generating) |
//! | `kvgate:num_requests_waiting` (`vllm:num_requests_waiting`) | gauge | requests waiting in the admission queue |
//! | `kvgate:kv_cache_usage_perc` (`vllm:kv_cache_usage_perc`) | gauge | KV budget in use, 0–1 (0 without a budget) |
//! | `kvgate:kv_cache_used` / `kvgate:kv_cache_capacity` | gauge | KV units held / budget; label `unit` = `tokens` or `bytes` |
//! | `kvgate:max_in_flight`, `kvgate:queue_capacity` | gauge | the configured limits |
//! | `kvgate:requests_admitted_total` | counter | requests admitted |
//! | `kvgate:requests_rejected_total{reason}` | counter | rejections by reason: `no_capacity`, `rate_limited`, `too_large`, `queue_full`, `timed_out`, `closed`, `invalid` |
//! | `kvgate:requests_invalid_total{code}` | counter | requests refused before admission (malformed JSON, missing fields, ...) |
//! | `kvgate:request_queue_time_seconds` (`vllm:request_queue_time_seconds`) | histogram | time from reading the request to admission |
//! | `kvgate:sim_num_requests_running`, `kvgate:sim_peak_requests_running`, `kvgate:sim_kv_cache_used`, `kvgate:sim_peak_kv_cache_used`, `kvgate:sim_overflows_total`, `kvgate:sim_generation_tokens_total` | gauge / counter | the simulated backend's own books (simulated mode only) |
//!
//! The `vllm:` names are the same numbers under the names vLLM's own `/metrics` uses, so dashboards and
//! autoscalers written for vLLM (KEDA, the Gateway API inference extension) can read the gateway. In proxy
//! mode in front of vLLM, scrape both and tell them apart by the `job` label.

use super::sim::SimStats;
use kvgate::Snapshot;
use labelled::Counters;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the queue-time histogram's buckets, seconds.
pub const QUEUE_TIME_BUCKETS: [f64; 14] =
    [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Counters the gateway keeps besides the admission's snapshot.
#[derive(Debug, Default)]
pub struct Metrics {
    queue_time: Histogram,
    invalid: Counters,
}

impl Metrics {
    /// Records one request's time from arrival to admission.
    pub fn observe_queue_time(&self, wait: Duration) {
        self.queue_time.observe(wait);
    }

    /// Counts a request refused before admission, by its error code.
    pub fn count_invalid(&self, code: &'static str) {
        self.invalid.add(code);
    }

    /// The Prometheus text exposition.
    pub fn render(&self, snapshot: &Snapshot, kv_unit: &str, sim: Option<&SimStats>) -> String {
        let mut out = String::with_capacity(4096);
        let usage = snapshot.kv_usage();
        for (prefix, vllm) in [("kvgate", false), ("vllm", true)] {
            let help = if vllm { " (vLLM-compatible name)" } else { "" };
            gauge(
                &mut out,
                &format!("{prefix}:num_requests_running"),
                &format!("Requests generating (holding a permit){help}."),
                snapshot.in_flight as f64,
            );
            gauge(
                &mut out,
                &format!("{prefix}:num_requests_waiting"),
                &format!("Requests waiting for admission{help}."),
                snapshot.queued as f64,
            );
            gauge(
                &mut out,
                &format!("{prefix}:kv_cache_usage_perc"),
                &format!("Fraction of the KV budget in use, 0-1{help}."),
                usage,
            );
        }
        let capacity = if snapshot.kv_capacity == u64::MAX { f64::INFINITY } else { snapshot.kv_capacity as f64 };
        let _ = writeln!(
            out,
            "# HELP kvgate:kv_cache_used KV units held by running requests.\n# TYPE kvgate:kv_cache_used gauge"
        );
        let _ = writeln!(out, "kvgate:kv_cache_used{{unit=\"{kv_unit}\"}} {}", snapshot.kv_used);
        let _ = writeln!(
            out,
            "# HELP kvgate:kv_cache_capacity The KV budget (+Inf: none).\n# TYPE kvgate:kv_cache_capacity gauge"
        );
        let _ = writeln!(out, "kvgate:kv_cache_capacity{{unit=\"{kv_unit}\"}} {}", prom_f64(capacity));
        let max_in_flight =
            if snapshot.max_in_flight == usize::MAX { f64::INFINITY } else { snapshot.max_in_flight as f64 };
        gauge(&mut out, "kvgate:max_in_flight", "The in-flight limit.", max_in_flight);
        gauge(
            &mut out,
            "kvgate:queue_capacity",
            "Waiting-room size per priority class.",
            snapshot.queue_capacity as f64,
        );
        counter(&mut out, "kvgate:requests_admitted_total", "Requests admitted.", snapshot.admitted);
        let _ = writeln!(
            out,
            "# HELP kvgate:requests_rejected_total Requests rejected by admission, by reason.\n# TYPE kvgate:requests_rejected_total counter"
        );
        for (reason, n) in snapshot.rejected.by_reason() {
            let _ = writeln!(out, "kvgate:requests_rejected_total{{reason=\"{reason}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP kvgate:requests_invalid_total Requests refused before admission, by error code.\n# TYPE kvgate:requests_invalid_total counter"
        );
        for (code, n) in self.invalid.get() {
            let _ = writeln!(out, "kvgate:requests_invalid_total{{code=\"{code}\"}} {n}");
        }
        for prefix in ["kvgate", "vllm"] {
            self.queue_time.render(
                &mut out,
                &format!("{prefix}:request_queue_time_seconds"),
                "Time from reading a request to its admission.",
            );
        }
        if let Some(sim) = sim {
            gauge(
                &mut out,
                "kvgate:sim_num_requests_running",
                "Simulated backend: sequences running.",
                sim.running as f64,
            );
            gauge(
                &mut out,
                "kvgate:sim_peak_requests_running",
                "Simulated backend: most sequences ever running at once.",
                sim.peak_running as f64,
            );
            gauge(&mut out, "kvgate:sim_kv_cache_used", "Simulated backend: KV units held.", sim.kv_in_use as f64);
            gauge(
                &mut out,
                "kvgate:sim_peak_kv_cache_used",
                "Simulated backend: most KV units ever held at once.",
                sim.peak_kv_in_use as f64,
            );
            counter(
                &mut out,
                "kvgate:sim_overflows_total",
                "Simulated backend: sequences refused for lack of slots or KV (0 behind the gateway).",
                sim.overflows,
            );
            counter(
                &mut out,
                "kvgate:sim_generation_tokens_total",
                "Simulated backend: tokens generated.",
                sim.tokens_generated,
            );
        }
        out
    }
}

fn prom_f64(v: f64) -> String {
    if v == f64::INFINITY { "+Inf".into() } else { format!("{v}") }
}

fn gauge(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}", prom_f64(value));
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
}

/// A fixed-bucket histogram of durations (lock-free: one atomic per bucket).
#[derive(Debug, Default)]
struct Histogram {
    /// Per bucket (non-cumulative), the last one is +Inf.
    buckets: [AtomicU64; QUEUE_TIME_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    fn observe(&self, value: Duration) {
        let secs = value.as_secs_f64();
        let at = QUEUE_TIME_BUCKETS.iter().position(|&le| secs <= le).unwrap_or(QUEUE_TIME_BUCKETS.len());
        self.buckets[at].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(u64::try_from(value.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            cumulative += bucket.load(Ordering::Relaxed);
            let le = QUEUE_TIME_BUCKETS.get(i).map_or_else(|| "+Inf".to_owned(), |le| format!("{le}"));
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum {}", self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count {}", self.count.load(Ordering::Relaxed));
    }
}

mod labelled {
    use std::sync::Mutex;

    /// A few labelled counters (the label set is small and fixed by the code: error codes).
    #[derive(Debug, Default)]
    pub struct Counters(Mutex<Vec<(&'static str, u64)>>);

    impl Counters {
        pub fn add(&self, label: &'static str) {
            let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match counts.iter_mut().find(|(l, _)| *l == label) {
                Some((_, n)) => *n += 1,
                None => counts.push((label, 1)),
            }
        }

        pub fn get(&self) -> Vec<(&'static str, u64)> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
        }
    }
}
