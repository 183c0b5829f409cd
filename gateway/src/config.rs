//! What a gateway is built from: [`Config`], and [`ConfigError`] for what cannot be built. The flags and
//! the config file that make a `Config` are in `settings` (feature `cli`, on by default).

use crate::tenants::{TenantConfig, TenantLimitsConfig};
use kvgate::kv::{GpuPlan, ModelSpec};
use serde::Deserialize;
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
    #[error("--config-file {path}: {reason}")]
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

/// One inference server behind the gateway (`[[upstream]]` in the config file). Its limits are its own:
/// the gateway never sends it more than its in-flight cap and KV budget.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// Its name in metrics and logs (default `upstream-N`).
    pub name: Option<String>,
    /// Its base URL (`http://host:port`, or ending in `/v1`); none: a simulated engine.
    pub url: Option<String>,
    /// Simulated engine: tokens per second of one sequence alone (default 50).
    pub sim_tokens_per_sec: Option<f64>,
    /// Sent to it as a bearer token (default: `upstream_api_key`).
    pub api_key: Option<String>,
    /// Sequences it runs at once (default: `max_in_flight`).
    pub max_in_flight: Option<usize>,
    /// Its KV budget in tokens (or `gpu`).
    pub kv_tokens: Option<u64>,
    /// Its GPU preset, for a KV budget in bytes of the gateway's `model` (or `model_config`).
    pub gpu: Option<String>,
    /// Weight size in GB when the model's parameter count is unknown.
    pub weight_gb: Option<f64>,
    /// Its health-check path on its origin (default `/models` under its base URL; `/health` for vLLM,
    /// SGLang and llama-server).
    pub health_path: Option<String>,
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
    /// Default time-to-first-token deadline: a request predicted to start later is refused at once
    /// (503 + `Retry-After`), and a waiting one leaves when its deadline becomes unreachable. `None`: no
    /// deadline unless a request sets one ([`TTFT_DEADLINE_HEADER`](crate::deadline::TTFT_DEADLINE_HEADER)).
    pub ttft_deadline: Option<Duration>,
    /// How the waiting room orders and bounds waits (controlled delay by default).
    pub wait_policy: kvgate::WaitPolicy,
    /// How waiting tenants share the server: by requests (weighted round-robin) or by tokens.
    pub fairness: kvgate::Fairness,
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
    /// Named tenants: their API keys, priority, limits and budgets. With any key, a request needs a
    /// known key.
    pub tenants: Vec<TenantConfig>,
    /// Several inference servers (`[[upstream]]`); empty: the one of `backend`, `max_in_flight` and the
    /// KV budget settings.
    pub upstreams: Vec<UpstreamConfig>,
    /// Address of the admin endpoint (`POST /admin/reload`, `GET /admin/usage`); must be a loopback
    /// address. `None`: no admin endpoint.
    pub admin_listen: Option<SocketAddr>,
    /// Where `/metrics` is served instead of the main address (a port clients cannot reach, so that no
    /// tenant reads another's usage). `None`: on the main address.
    pub metrics_listen: Option<SocketAddr>,
    /// Without keys: the header that names a request's tenant.
    pub tenant_header: Option<String>,
    /// Without keys: the OpenAI `user` field names a request's tenant (after `tenant_header`).
    pub tenant_from_user: bool,
    /// Charge a shared system prompt once while it is held, tracking at most this many prefixes.
    pub prefix_sharing: Option<usize>,
    /// Where usage is kept across restarts.
    pub state_file: Option<PathBuf>,
    /// Where the per-request log lines go (`-`: standard error); `None`: no log.
    pub request_log: Option<PathBuf>,
    /// An OpenTelemetry collector's OTLP/HTTP endpoint (`http://collector:4318`) for one span per
    /// request (feature `otel`).
    pub otlp_endpoint: Option<String>,
    /// How often upstreams are health-checked.
    pub health_interval: Duration,
    /// Failed answers in a row that take an upstream out.
    pub max_fails: u32,
    /// Read each upstream engine's `/metrics` this often and correct its KV budget with it.
    pub engine_feedback: Option<Duration>,
    /// Share the limits with every replica through this Redis (`redis://host:port`).
    pub redis: Option<String>,
    /// The name the replicas' shared limits are kept under in Redis.
    pub redis_prefix: String,
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
            ttft_deadline: None,
            wait_policy: kvgate::WaitPolicy::controlled_delay(),
            fairness: kvgate::Fairness::Requests,
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
            upstreams: Vec::new(),
            admin_listen: None,
            metrics_listen: None,
            tenant_header: None,
            tenant_from_user: false,
            prefix_sharing: None,
            state_file: None,
            request_log: None,
            otlp_endpoint: None,
            health_interval: Duration::from_secs(5),
            max_fails: 3,
            engine_feedback: None,
            redis: None,
            redis_prefix: "kvgate".into(),
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
        self.plan_for(self.gpu.as_deref(), self.weight_gb)
    }

    /// The GPU plan of the gateway's model on `gpu`, if given.
    ///
    /// # Errors
    ///
    /// As [`gpu_plan`](Self::gpu_plan).
    pub fn plan_for(&self, gpu: Option<&str>, weight_gb: Option<f64>) -> Result<Option<GpuPlan>, ConfigError> {
        let Some(gpu) = gpu else {
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
        if let Some(gb) = weight_gb {
            builder = builder.weight_bytes((gb * 1e9) as u64);
        }
        Ok(Some(builder.build()?))
    }
}

/// The settings that a reload cannot change (they are bound at start: sockets, servers, files,
/// connections): the name of the first one that differs between `old` and `new`.
pub fn restart_only_change(old: &Config, new: &Config) -> Option<&'static str> {
    let fields: [(&'static str, bool); 14] = [
        ("listen", old.listen != new.listen),
        ("admin_listen", old.admin_listen != new.admin_listen),
        ("metrics_listen", old.metrics_listen != new.metrics_listen),
        ("upstream", old.backend != new.backend),
        ("[[upstream]] url or name", {
            let key = |c: &Config| c.upstreams.iter().map(|u| (u.name.clone(), u.url.clone())).collect::<Vec<_>>();
            key(old) != key(new)
        }),
        ("upstream_api_key", old.upstream_api_key != new.upstream_api_key),
        ("model", old.model != new.model),
        ("model_config", old.model_config != new.model_config),
        ("redis", old.redis != new.redis || old.redis_prefix != new.redis_prefix),
        ("state_file", old.state_file != new.state_file),
        ("request_log and otlp_endpoint", old.request_log != new.request_log || old.otlp_endpoint != new.otlp_endpoint),
        ("max_connections", old.max_connections != new.max_connections),
        (
            "header_timeout and send_timeout",
            old.header_timeout != new.header_timeout || old.send_timeout != new.send_timeout,
        ),
        ("prefix_sharing", old.prefix_sharing != new.prefix_sharing),
    ];
    fields.into_iter().find_map(|(name, changed)| changed.then_some(name))
}
