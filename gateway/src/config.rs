//! What a gateway is built from: [`Config`], and [`ConfigError`] for what cannot be built. The flags and
//! the config file that make a `Config` are in `settings` (feature `cli`, on by default).

use crate::tenants::{TenantConfig, TenantLimitsConfig};
use kvgate::kv::{GpuPlan, ModelSpec};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Why the gateway's configuration cannot be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A setting's value is invalid.
    #[error("{setting} {value}: {reason}")]
    Invalid {
        /// The flag (`--max-queue-wait`) or file key.
        setting: &'static str,
        /// The value given.
        value: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// Two settings contradict each other, or one needs another.
    #[error("{0}")]
    Conflict(String),
    /// The config file cannot be read or parsed.
    #[error("--config {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The admission refused the limits.
    #[error(transparent)]
    Admission(#[from] kvgate::ConfigError),
}

/// Where completions come from.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendConfig {
    /// The built-in simulated LLM.
    Simulated {
        /// Tokens per second of one sequence running alone.
        tokens_per_sec: f64,
    },
    /// An OpenAI-compatible server at this base URL (plain http).
    Upstream(String),
}

/// Everything the gateway is built from. [`Default`] is what the binary runs with no flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The simulated engine or an upstream URL.
    pub backend: BackendConfig,
    /// Sent upstream as `Authorization: Bearer ...` (else the client's `Authorization` is passed on when
    /// no tenants are configured, and nothing when they are).
    pub upstream_api_key: Option<String>,
    /// Longest wait for the upstream's response headers, and then between two pieces of its body.
    pub upstream_timeout: Duration,
    /// Sequences running at once.
    pub max_in_flight: usize,
    /// Waiting room per priority class.
    pub queue: usize,
    /// Longest wait in the queue.
    pub max_queue_wait: Duration,
    /// Requests per second and burst.
    pub rate: Option<(f64, u32)>,
    /// LLM tokens (prompt + max_tokens) per second and burst.
    pub token_rate: Option<(f64, u64)>,
    /// KV-cache budget in tokens.
    pub kv_tokens: Option<u64>,
    /// Model preset (for a KV-byte budget with `gpu`), and the served model name.
    pub model: Option<String>,
    /// A Hugging Face `config.json` (for a KV-byte budget with `gpu`).
    pub model_config: Option<PathBuf>,
    /// GPU preset for a KV-byte budget.
    pub gpu: Option<String>,
    /// Weight size in GB when the model's parameter count is unknown.
    pub weight_gb: Option<f64>,
    /// Output reservation of a request without a generation limit.
    pub default_max_tokens: u32,
    /// Largest output reservation a request may ask for (413 above it).
    pub max_output_tokens: u32,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Bytes of request bodies held at once (read, parsed, waiting or being forwarded); past it, 503.
    pub max_buffered_bytes: usize,
    /// Longest time a client may take to send a request's headers (the connection is then answered
    /// 408 and closed); also the longest idle time of a keep-alive connection.
    pub header_timeout: Duration,
    /// Longest time a client may take to send a request's body (408).
    pub body_timeout: Duration,
    /// Longest time a write to a client may stay blocked (a client that stops reading); the connection
    /// is then closed and its permit returned.
    pub send_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog.
    pub max_connections: usize,
    /// On shutdown, how long running answers may take to finish.
    pub shutdown_grace: Duration,
    /// Answer every retryable rejection with 429.
    pub all_429: bool,
    /// Limits of every tenant without its own.
    pub tenant_defaults: Option<TenantLimitsConfig>,
    /// Named tenants: their API keys, priority and limits. With any, a request needs a known key.
    pub tenants: Vec<TenantConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            backend: BackendConfig::Simulated { tokens_per_sec: 50.0 },
            upstream_api_key: None,
            upstream_timeout: Duration::from_secs(120),
            max_in_flight: 32,
            queue: 256,
            max_queue_wait: Duration::from_secs(30),
            rate: None,
            token_rate: None,
            kv_tokens: None,
            model: None,
            model_config: None,
            gpu: None,
            weight_gb: None,
            default_max_tokens: 512,
            max_output_tokens: kvgate::openai::DEFAULT_MAX_OUTPUT_TOKENS,
            max_body_bytes: 4 << 20,
            max_buffered_bytes: 256 << 20,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            send_timeout: Duration::from_secs(30),
            max_connections: 1024,
            shutdown_grace: Duration::from_secs(30),
            all_429: false,
            tenant_defaults: None,
            tenants: Vec::new(),
        }
    }
}

impl Config {
    /// The GPU plan from `model`/`model_config` and `gpu`, if `gpu` was given.
    ///
    /// # Errors
    ///
    /// When the model or GPU is unknown, the config unreadable, or the plan impossible.
    pub fn gpu_plan(&self) -> Result<Option<GpuPlan>, ConfigError> {
        let Some(gpu) = &self.gpu else {
            return Ok(None);
        };
        let spec = match (&self.model_config, &self.model) {
            (Some(path), _) => {
                let file_error = |reason: String| ConfigError::File { path: path.clone(), reason };
                let json = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
                ModelSpec::from_hf_config(&json).map_err(|e| file_error(e.to_string()))?
            }
            (None, Some(name)) => ModelSpec::preset(name)?,
            (None, None) => {
                return Err(ConfigError::Conflict("--gpu needs --model NAME or --model-config PATH".into()));
            }
        };
        let mut builder = GpuPlan::builder(spec).gpu(gpu);
        if let Some(gb) = self.weight_gb {
            builder = builder.weight_bytes((gb * 1e9) as u64);
        }
        Ok(Some(builder.build()?))
    }
}
