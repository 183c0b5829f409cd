//! The simulated engine's counters as vLLM exposes them on `GET /metrics`, so that engine feedback in
//! the lab reads the same text, through the same parser, as in front of a real vLLM.

use super::engine::EngineStatus;
use std::fmt::Write as _;

impl EngineStatus {
    /// The Prometheus text exposition of this status under vLLM's metric names (`vllm:kv_cache_usage_perc`,
    /// `vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:num_preemptions_total`), labelled
    /// like one vLLM engine serving `model`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate::feedback::EngineMetrics;
    /// use kvgate::sim::EngineStatus;
    ///
    /// let status = EngineStatus { running: 12, waiting: 3, kv_used_bytes: 40, kv_pool_bytes: 100, preemptions: 7, ..Default::default() };
    /// let metrics = EngineMetrics::parse(&status.prometheus_text("llama-3.1-8b"))?;
    /// assert_eq!(metrics.kv_cache_usage, Some(0.4));
    /// assert_eq!((metrics.requests_running, metrics.requests_waiting), (Some(12.0), Some(3.0)));
    /// assert_eq!(metrics.preemptions, Some(7.0));
    /// # Ok::<(), kvgate::feedback::FeedbackError>(())
    /// ```
    pub fn prometheus_text(&self, model: &str) -> String {
        let usage = if self.kv_pool_bytes == 0 { 0.0 } else { self.kv_used_bytes as f64 / self.kv_pool_bytes as f64 };
        let model = model.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
        let mut text = String::with_capacity(768);
        let metrics: [(&str, &str, &str, f64); 4] = [
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage),
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                self.running as f64,
            ),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", self.waiting as f64),
            (
                "vllm:num_preemptions_total",
                "counter",
                "Cumulative number of preemption from the engine.",
                self.preemptions as f64,
            ),
        ];
        for (name, kind, help, value) in metrics {
            let _ = writeln!(text, "# HELP {name} {help}");
            let _ = writeln!(text, "# TYPE {name} {kind}");
            let _ = writeln!(text, "{name}{{engine=\"0\",model_name=\"{model}\"}} {value:?}");
        }
        text
    }
}
