//! The gateway's settings and their command-line flags (hand-rolled: no argument-parsing dependency).

use kvgate::kv::{GpuPlan, ModelSpec};
use std::net::SocketAddr;
use std::time::Duration;

/// `--help` text.
pub const USAGE: &str = "\
kvgate gateway: an OpenAI-compatible admission gateway in front of one inference server

USAGE:
    cargo run --release --example gateway --features tower -- [OPTIONS]

SERVER:
    --listen ADDR              address to listen on (default 127.0.0.1:8080)
    --upstream URL             proxy to an OpenAI-compatible server over plain http, e.g.
                               http://localhost:8000 (vLLM), http://localhost:8080 (llama-server),
                               http://localhost:11434/v1 (Ollama); without it a simulated backend answers
    --upstream-timeout D       longest wait for the upstream's response headers, and then between two
                               pieces of its body; past it the client gets a 504 (or, mid-stream, an SSE
                               error event) and the permit is returned. A non-streamed completion sends
                               nothing until it is done: raise it for long ones (default 120s)
    --sim-tokens-per-sec N     simulated backend: tokens per second of one sequence alone (default 50);
                               it slows down as its batch grows

LIMITS:
    --max-in-flight N          sequences running at once (default 32)
    --queue N                  waiting room per priority class; 0: never wait (default 256)
    --max-queue-wait D         longest wait in the queue: ms, or with a unit: 500ms, 2s, 1m (default 30s)
    --rate R                   requests per second (burst: --rate-burst, default max(1, R))
    --rate-burst N
    --token-rate R             prompt + max_tokens per second (burst: --token-burst, default 10 x R)
    --token-burst N
    --kv-tokens N              KV-cache budget in tokens (prompt + max_tokens of every running request)
    --model NAME               model preset for a KV-byte budget (with --gpu); also the served model name
    --config PATH              a Hugging Face config.json for a KV-byte budget (with --gpu; give
                               --weight-gb unless the config's model has a known parameter count)
    --gpu NAME                 GPU preset (h100-80, a100-80, l4, ...): KV pool = memory x 0.9 - weights
    --weight-gb N              weight size in GB when the model's parameter count is unknown
    --default-max-tokens N     output reservation when a request gives no max_tokens (default 512)
    --max-body-bytes N         largest request body (default 4194304)
    --all-429                  answer every retryable rejection with 429 (for clients that retry only on 429)
    -h, --help                 this text
";

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

/// Everything the gateway is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub listen: SocketAddr,
    pub backend: BackendConfig,
    /// Proxy mode: longest wait for response headers, and then between two body chunks.
    pub upstream_timeout: Duration,
    pub max_in_flight: usize,
    pub queue: usize,
    pub max_queue_wait: Duration,
    pub rate: Option<(f64, u32)>,
    pub token_rate: Option<(f64, u64)>,
    pub kv_tokens: Option<u64>,
    pub model: Option<String>,
    pub config_path: Option<String>,
    pub gpu: Option<String>,
    pub weight_gb: Option<f64>,
    pub default_max_tokens: u32,
    pub max_body_bytes: usize,
    pub all_429: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            backend: BackendConfig::Simulated { tokens_per_sec: 50.0 },
            upstream_timeout: Duration::from_secs(120),
            max_in_flight: 32,
            queue: 256,
            max_queue_wait: Duration::from_secs(30),
            rate: None,
            token_rate: None,
            kv_tokens: None,
            model: None,
            config_path: None,
            gpu: None,
            weight_gb: None,
            default_max_tokens: 512,
            max_body_bytes: 4 << 20,
            all_429: false,
        }
    }
}

/// Why the flags did not give a configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgError {
    /// `--help` was asked for.
    Help,
    /// A flag is unknown, lacks its value, or its value is invalid.
    Bad(String),
}

impl Config {
    /// Parses flags (without the program name).
    ///
    /// # Errors
    ///
    /// [`ArgError::Help`] for `--help`, [`ArgError::Bad`] for anything wrong.
    pub fn from_args<I: IntoIterator<Item = String>>(args: I) -> Result<Self, ArgError> {
        let mut config = Config::default();
        let mut sim_rate = 50.0;
        let mut upstream = None;
        let (mut rate, mut rate_burst, mut token_rate, mut token_burst) = (None, None, None, None);
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let (flag, inline) = match flag.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
                _ => (flag, None),
            };
            match flag.as_str() {
                "-h" | "--help" => return Err(ArgError::Help),
                "--all-429" => {
                    config.all_429 = true;
                    continue;
                }
                _ => {}
            }
            let value = match inline.or_else(|| args.next()) {
                Some(value) => value,
                None => return Err(ArgError::Bad(format!("{flag} needs a value (see --help)"))),
            };
            let bad = |what: &str| ArgError::Bad(format!("{flag} {value}: expected {what}"));
            match flag.as_str() {
                "--listen" => config.listen = value.parse().map_err(|_| bad("an address like 127.0.0.1:8080"))?,
                "--upstream" => {
                    if !value.starts_with("http://") {
                        return Err(bad("a plain http:// URL (this example has no TLS)"));
                    }
                    upstream = Some(value);
                }
                "--upstream-timeout" => {
                    config.upstream_timeout =
                        parse_duration(&value).filter(|d| !d.is_zero()).ok_or_else(|| bad("a duration > 0"))?
                }
                "--sim-tokens-per-sec" => sim_rate = positive_f64(&value).ok_or_else(|| bad("a positive number"))?,
                "--max-in-flight" => config.max_in_flight = value.parse().map_err(|_| bad("a count"))?,
                "--queue" => config.queue = value.parse().map_err(|_| bad("a count"))?,
                "--max-queue-wait" => {
                    config.max_queue_wait = parse_duration(&value).ok_or_else(|| bad("a duration"))?
                }
                "--rate" => rate = Some(positive_f64(&value).ok_or_else(|| bad("requests per second"))?),
                "--rate-burst" => rate_burst = Some(value.parse().map_err(|_| bad("a count"))?),
                "--token-rate" => token_rate = Some(positive_f64(&value).ok_or_else(|| bad("tokens per second"))?),
                "--token-burst" => token_burst = Some(value.parse().map_err(|_| bad("a count"))?),
                "--kv-tokens" => config.kv_tokens = Some(value.parse().map_err(|_| bad("a token count"))?),
                "--model" => config.model = Some(value),
                "--config" => config.config_path = Some(value),
                "--gpu" => config.gpu = Some(value),
                "--weight-gb" => config.weight_gb = Some(positive_f64(&value).ok_or_else(|| bad("gigabytes"))?),
                "--default-max-tokens" => {
                    config.default_max_tokens =
                        value.parse().ok().filter(|&n| n > 0).ok_or_else(|| bad("a count > 0"))?
                }
                "--max-body-bytes" => config.max_body_bytes = value.parse().map_err(|_| bad("a byte count"))?,
                _ => return Err(ArgError::Bad(format!("unknown flag {flag} (see --help)"))),
            }
        }
        config.backend = match upstream {
            Some(url) => BackendConfig::Upstream(url),
            None => BackendConfig::Simulated { tokens_per_sec: sim_rate },
        };
        config.rate = rate.map(|r: f64| (r, rate_burst.unwrap_or(r.ceil().max(1.0) as u32)));
        config.token_rate = token_rate.map(|r: f64| (r, token_burst.unwrap_or((r * 10.0).ceil() as u64)));
        Ok(config)
    }

    /// The GPU plan from `--model`/`--config` and `--gpu`, if `--gpu` was given.
    ///
    /// # Errors
    ///
    /// A message when the model or GPU is unknown, the config unreadable, or the plan impossible.
    pub fn gpu_plan(&self) -> Result<Option<GpuPlan>, String> {
        let Some(gpu) = &self.gpu else {
            return Ok(None);
        };
        let spec = match (&self.config_path, &self.model) {
            (Some(path), _) => {
                let json = std::fs::read_to_string(path).map_err(|e| format!("--config {path}: {e}"))?;
                ModelSpec::from_hf_config(&json).map_err(|e| format!("--config {path}: {e}"))?
            }
            (None, Some(name)) => ModelSpec::preset(name).map_err(|e| format!("--model: {e}"))?,
            (None, None) => return Err("--gpu needs --model NAME or --config path/config.json".into()),
        };
        let mut builder = GpuPlan::builder(spec).gpu(gpu);
        if let Some(gb) = self.weight_gb {
            builder = builder.weight_bytes((gb * 1e9) as u64);
        }
        builder.build().map(Some).map_err(|e| e.to_string())
    }
}

fn positive_f64(value: &str) -> Option<f64> {
    value.parse::<f64>().ok().filter(|v| v.is_finite() && *v > 0.0)
}

/// `500` (milliseconds), `500ms`, `2s`, `1.5s`, `1m`.
pub fn parse_duration(value: &str) -> Option<Duration> {
    let value = value.trim();
    let (number, scale) = if let Some(n) = value.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = value.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = value.strip_suffix('m') {
        (n, 60.0)
    } else {
        (value, 1e-3)
    };
    let number: f64 = number.trim().parse().ok()?;
    (number.is_finite() && number >= 0.0).then(|| Duration::from_secs_f64(number * scale))
}
