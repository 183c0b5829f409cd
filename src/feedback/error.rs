//! Why engine metrics could not be read. Run-time errors of a scrape, not of configuration (those are
//! [`ConfigError`](crate::ConfigError)s): a corrector keeps its budget and the next scrape tries again.

/// A scrape of the engine's metrics that gave nothing usable, with what to check.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FeedbackError {
    /// The metrics URL cannot be fetched by [`fetch_metrics`](super::fetch_metrics).
    #[error("invalid engine metrics URL {url:?}: {reason}")]
    Url {
        /// The URL given.
        url: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// Connecting, sending or reading failed (refused, reset, timed out).
    #[error("cannot fetch engine metrics from {url}: {source}; is the engine up, and serving /metrics there?")]
    Fetch {
        /// The URL.
        url: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The engine answered with a status other than 200.
    #[error(
        "engine metrics at {url} answered HTTP {status}; vLLM serves /metrics by default, SGLang with --enable-metrics"
    )]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The answer is not a well-formed HTTP/1.x response.
    #[error("engine metrics at {url}: malformed HTTP response ({reason})")]
    Http {
        /// The URL.
        url: String,
        /// What was wrong.
        reason: String,
    },
    /// The answer is larger than the limit.
    #[error("engine metrics at {url} exceed {limit} bytes; point the URL at the metrics endpoint")]
    TooLarge {
        /// The URL.
        url: String,
        /// The limit, in bytes.
        limit: usize,
    },
    /// A line of the exposition is malformed.
    #[error("engine metrics, line {line}: {reason}")]
    Exposition {
        /// The line, 1-based.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The exposition has none of the vLLM or SGLang metrics the corrector reads.
    #[error(
        "the metrics hold neither vLLM's (vllm:kv_cache_usage_perc, vllm:num_preemptions_total, ...) nor SGLang's \
         (sglang:token_usage, sglang:num_retracted_requests_total, ...); is this the engine's /metrics, and is \
         SGLang started with --enable-metrics?"
    )]
    NoEngineMetrics,
}
