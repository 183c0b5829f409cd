//! The engine's own view of its load, read from its Prometheus metrics: vLLM's or SGLang's names for the
//! same four quantities, in one table.

use super::error::FeedbackError;
use super::exposition::{Sample, samples};
use std::fmt;

/// An inference engine whose metrics kvgate reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// vLLM (the V1 engine's names, and the deprecated `vllm:gpu_cache_usage_perc` of older releases).
    Vllm,
    /// SGLang, started with `--enable-metrics`.
    Sglang,
}

impl EngineKind {
    /// Every engine, in the order detection prefers them.
    pub const ALL: [EngineKind; 2] = [EngineKind::Vllm, EngineKind::Sglang];

    /// The metric names this engine exposes for `quantity`, the current name first.
    pub const fn metric_names(self, quantity: Quantity) -> &'static [&'static str] {
        let names = &NAMES[self as usize];
        match quantity {
            Quantity::KvCacheUsage => names.kv_cache_usage,
            Quantity::RequestsWaiting => names.requests_waiting,
            Quantity::RequestsRunning => names.requests_running,
            Quantity::Preemptions => names.preemptions,
        }
    }
}

impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EngineKind::Vllm => "vLLM",
            EngineKind::Sglang => "SGLang",
        })
    }
}

/// A quantity the feedback reads from an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quantity {
    /// Share of the KV cache in use, 0–1 (a gauge; the fullest pool when several report).
    KvCacheUsage,
    /// Requests queued in the engine, not yet running (a gauge, summed over data-parallel ranks).
    RequestsWaiting,
    /// Requests running (a gauge, summed over data-parallel ranks).
    RequestsRunning,
    /// Running requests the engine evicted because its KV cache ran out, since it started (a counter,
    /// summed over data-parallel ranks; vLLM calls them preemptions, SGLang retractions).
    Preemptions,
}

impl Quantity {
    /// Every quantity.
    pub const ALL: [Quantity; 4] =
        [Quantity::KvCacheUsage, Quantity::RequestsWaiting, Quantity::RequestsRunning, Quantity::Preemptions];
}

/// One engine's names, the current name first.
struct Names {
    kv_cache_usage: &'static [&'static str],
    requests_waiting: &'static [&'static str],
    requests_running: &'static [&'static str],
    preemptions: &'static [&'static str],
}

/// The names, indexed by `EngineKind as usize` — the one list of them.
///
/// - vLLM: `vllm/v1/metrics/loggers.py` (`PrometheusStatLogger`), documented at
///   <https://docs.vllm.ai/en/stable/usage/metrics/>. `vllm:kv_cache_usage_perc` replaced
///   `vllm:gpu_cache_usage_perc` (kept, deprecated, by the releases in between); the counter
///   `vllm:num_preemptions` is exposed with prometheus_client's `_total` suffix.
/// - SGLang: `python/sglang/srt/metrics/collector.py` (`SchedulerMetricsCollector`), documented at
///   <https://docs.sglang.io/references/production_metrics.html>. `sglang:token_usage` is the share of the
///   token (KV) pool in use; `sglang:num_retracted_requests_total` counts the running requests the
///   scheduler retracted for lack of KV space — SGLang's preemption.
const NAMES: [Names; 2] = [
    Names {
        kv_cache_usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
        requests_waiting: &["vllm:num_requests_waiting"],
        requests_running: &["vllm:num_requests_running"],
        preemptions: &["vllm:num_preemptions_total"],
    },
    Names {
        kv_cache_usage: &["sglang:token_usage"],
        requests_waiting: &["sglang:num_queue_reqs"],
        requests_running: &["sglang:num_running_reqs"],
        preemptions: &["sglang:num_retracted_requests_total"],
    },
];

/// Labels that mark a series as a mirror of rank 0 (tensor, pipeline or expert parallel ranks report
/// the same scheduler): only their rank-0 series count in sums.
const MIRROR_LABELS: [&str; 4] = ["tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank"];

/// What an engine says about its load, from one scrape of its metrics.
///
/// # Examples
///
/// ```
/// use kvgate::feedback::{EngineKind, EngineMetrics};
///
/// let text = "\
/// ## TYPE vllm:kv_cache_usage_perc gauge
/// vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.31
/// vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.47
/// vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 12
/// vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 9
/// vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0
/// vllm:num_preemptions_total{engine=\"0\",model_name=\"m\"} 4
/// ";
/// let metrics = EngineMetrics::parse(text)?;
/// assert_eq!(metrics.engine, EngineKind::Vllm);
/// assert_eq!(metrics.kv_cache_usage, Some(0.47)); // the fullest engine
/// assert_eq!(metrics.requests_running, Some(21.0)); // summed over data-parallel engines
/// assert_eq!(metrics.preemptions, Some(4.0));
/// # Ok::<(), kvgate::feedback::FeedbackError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct EngineMetrics {
    /// Which engine's names were found.
    pub engine: EngineKind,
    /// Share of the KV cache in use, 0–1 ([`Quantity::KvCacheUsage`]).
    pub kv_cache_usage: Option<f64>,
    /// Requests queued in the engine ([`Quantity::RequestsWaiting`]).
    pub requests_waiting: Option<f64>,
    /// Requests running ([`Quantity::RequestsRunning`]).
    pub requests_running: Option<f64>,
    /// Preemptions since the engine started ([`Quantity::Preemptions`]).
    pub preemptions: Option<f64>,
}

impl EngineMetrics {
    /// Metrics of `engine` with nothing known (fill the fields by hand, e.g. from another source).
    pub const fn new(engine: EngineKind) -> Self {
        Self { engine, kv_cache_usage: None, requests_waiting: None, requests_running: None, preemptions: None }
    }

    /// Reads the metrics of vLLM or SGLang (whichever names the text holds; vLLM if both) from a
    /// Prometheus text exposition, such as the body of `GET /metrics`.
    ///
    /// Several series of one metric (data-parallel engines, labelled `engine` by vLLM and `dp_rank` by
    /// SGLang) are combined: the KV usage is the highest (the fullest pool preempts first), the counts
    /// are summed, leaving out series of a tensor/pipeline/expert-parallel rank other than 0 (mirrors of
    /// rank 0). Non-finite values are ignored.
    ///
    /// # Errors
    ///
    /// [`FeedbackError::Exposition`] for a malformed line, [`FeedbackError::NoEngineMetrics`] when none of
    /// the names is present.
    pub fn parse(text: &str) -> Result<Self, FeedbackError> {
        let mut found = EngineKind::ALL.map(EngineMetrics::new);
        for sample in samples(text) {
            let sample = sample?;
            if !sample.value.is_finite() {
                continue;
            }
            for metrics in &mut found {
                metrics.add(&sample);
            }
        }
        found
            .into_iter()
            .filter(|m| m.known() > 0)
            .fold(None, |best: Option<EngineMetrics>, m| match best {
                Some(b) if b.known() >= m.known() => Some(b),
                _ => Some(m),
            })
            .ok_or(FeedbackError::NoEngineMetrics)
    }

    /// The value of `quantity`, if the engine reported it.
    pub fn get(&self, quantity: Quantity) -> Option<f64> {
        match quantity {
            Quantity::KvCacheUsage => self.kv_cache_usage,
            Quantity::RequestsWaiting => self.requests_waiting,
            Quantity::RequestsRunning => self.requests_running,
            Quantity::Preemptions => self.preemptions,
        }
    }

    fn slot(&mut self, quantity: Quantity) -> &mut Option<f64> {
        match quantity {
            Quantity::KvCacheUsage => &mut self.kv_cache_usage,
            Quantity::RequestsWaiting => &mut self.requests_waiting,
            Quantity::RequestsRunning => &mut self.requests_running,
            Quantity::Preemptions => &mut self.preemptions,
        }
    }

    /// How many of the quantities are known.
    fn known(&self) -> usize {
        Quantity::ALL.iter().filter(|&&q| self.get(q).is_some()).count()
    }

    fn add(&mut self, sample: &Sample<'_>) {
        for quantity in Quantity::ALL {
            let names = self.engine.metric_names(quantity);
            if !names.contains(&sample.name) {
                continue;
            }
            // The KV usage under its current and its deprecated name (exposed together by some releases,
            // with one value) combine like two series: the highest.
            let slot = self.slot(quantity);
            if quantity == Quantity::KvCacheUsage {
                *slot = Some(slot.map_or(sample.value, |v| v.max(sample.value)));
            } else if !MIRROR_LABELS.iter().any(|l| sample.label(l).is_some_and(|v| v != "0")) {
                *slot = Some(slot.unwrap_or(0.0) + sample.value);
            }
            return;
        }
    }
}
