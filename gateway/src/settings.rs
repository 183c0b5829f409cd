//! The gateway's settings: command-line flags (`clap`), an optional TOML file (`--config-file`) with the
//! same settings, the tenants and the upstreams, and the [`Config`] they make. A flag overrides the
//! file, the file overrides the default.
//!
//! Every value is checked when the configuration is built: a duration that does not fit
//! (`--max-queue-wait 1e300s`), a zero limit or an unknown preset is a [`ConfigError`] that names the
//! setting, never a panic.

use crate::config::{BackendConfig, Config, ConfigError, UpstreamConfig};
use crate::tenants::{TenantConfig, TenantLimitsConfig};
use crate::units::parse_duration;
use clap::Parser;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest duration any setting accepts (a day): longer ones are mistakes, and some would not fit
/// the timers.
const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);

/// The settings, as flags and as keys of the TOML file (the same names, `--max-in-flight` and
/// `max_in_flight`). Every one is optional: what neither gives comes from [`Config::default`].
#[derive(Debug, Clone, Default, Parser, Deserialize)]
#[command(
    name = "kvgate-gateway",
    version,
    about = "An OpenAI-compatible admission gateway in front of one or several inference servers",
    after_help = "Durations: 500ms, 2s, 1.5s, 1m (a bare number is milliseconds), at most 1 day.\n\
                  See gateway/README.md for the config file, the metrics and real servers."
)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// A TOML file with any of these settings (without the dashes: max_in_flight = 32), the tenants and
    /// the upstreams; SIGHUP reloads it.
    #[arg(long = "config-file", visible_alias = "config", value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    /// Reads an API key from standard input, prints its `sha256:` form for the config file, and exits.
    #[arg(long)]
    #[serde(skip)]
    pub hash_key: bool,
    /// Address to listen on [default: 127.0.0.1:8080].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Proxy to an OpenAI-compatible server over plain http (http://localhost:8000 for vLLM,
    /// http://localhost:8080 for llama-server, http://localhost:11434/v1 for Ollama); without it a
    /// simulated engine answers. Several servers: `[[upstream]]` in the config file.
    #[arg(long, value_name = "URL")]
    #[serde(skip)]
    pub upstream: Option<String>,
    /// `upstream = "http://..."` or `[[upstream]]` tables (file only).
    #[arg(skip)]
    #[serde(rename = "upstream")]
    pub upstream_file: Option<UpstreamSetting>,
    /// API key sent to the upstream as a bearer token.
    #[arg(long, value_name = "KEY", env = "KVGATE_UPSTREAM_API_KEY", hide_env_values = true)]
    pub upstream_api_key: Option<String>,
    /// Longest wait for the upstream's response headers, then between two pieces of its body: past it
    /// the client gets a 504 (mid-stream: an SSE error event) [default: 120s].
    #[arg(long, value_name = "DURATION")]
    pub upstream_timeout: Option<String>,
    /// Simulated engine: tokens per second of one sequence alone [default: 50].
    #[arg(long, value_name = "N")]
    pub sim_tokens_per_sec: Option<f64>,
    /// Sequences running at once [default: 32].
    #[arg(long, value_name = "N")]
    pub max_in_flight: Option<usize>,
    /// Waiting room per priority class; 0: never wait [default: 256].
    #[arg(long, value_name = "N")]
    pub queue: Option<usize>,
    /// Longest wait in the queue [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub max_queue_wait: Option<String>,
    /// Default time-to-first-token deadline: a request predicted to start later is refused at once with
    /// 503 + Retry-After, a waiting one leaves when it can no longer make it; a request may shorten it
    /// with the x-kvgate-ttft-deadline header [default: none].
    #[arg(long, value_name = "DURATION")]
    pub ttft_deadline: Option<String>,
    /// How the waiting room orders and bounds waits: `controlled-delay` (FIFO while the queue drains;
    /// newest first and at most --delay-target of waiting once it has not been empty for --delay-interval)
    /// or `fifo` (first-in first-out, the full wait) [default: controlled-delay].
    #[arg(long, value_name = "POLICY")]
    pub wait_policy: Option<String>,
    /// Controlled delay: the longest wait while the queue stands [default: 500ms].
    #[arg(long, value_name = "DURATION")]
    pub delay_target: Option<String>,
    /// Controlled delay: how long the queue must stay non-empty to count as standing [default: 1s].
    #[arg(long, value_name = "DURATION")]
    pub delay_interval: Option<String>,
    /// How waiting tenants share the server: `requests` (weighted round-robin by requests) or `tokens`
    /// (by prompt + output tokens served, output weighted by --output-token-weight) [default: requests].
    #[arg(long, value_name = "POLICY")]
    pub fairness: Option<String>,
    /// With --fairness tokens: what one output token costs against one prompt token [default: 2].
    #[arg(long, value_name = "N")]
    pub output_token_weight: Option<u32>,
    /// Requests per second (burst: --rate-burst, default max(1, R)).
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Request-rate burst.
    #[arg(long, value_name = "N")]
    pub rate_burst: Option<u32>,
    /// Prompt + max_tokens per second (burst: --token-burst, default 10 x R).
    #[arg(long, value_name = "R")]
    pub token_rate: Option<f64>,
    /// Token-rate burst.
    #[arg(long, value_name = "N")]
    pub token_burst: Option<u64>,
    /// KV-cache budget in tokens (prompt + max_tokens of every running request).
    #[arg(long, value_name = "N")]
    pub kv_tokens: Option<u64>,
    /// Model preset for a KV-byte budget (with --gpu); also the served model name.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// A Hugging Face config.json for a KV-byte budget (with --gpu; give --weight-gb unless the model
    /// has a known parameter count).
    #[arg(long, value_name = "PATH")]
    pub model_config: Option<PathBuf>,
    /// GPU preset (h100-80, a100-80, l4, ...): KV pool = memory x 0.9 - weights.
    #[arg(long, value_name = "NAME")]
    pub gpu: Option<String>,
    /// Weight size in GB when the model's parameter count is unknown.
    #[arg(long, value_name = "GB")]
    pub weight_gb: Option<f64>,
    /// Output reservation when a request gives no max_tokens; written into the forwarded body
    /// [default: 512].
    #[arg(long, value_name = "N")]
    pub default_max_tokens: Option<u32>,
    /// Largest max_tokens a request may ask for; above it, 413 [default: 131072].
    #[arg(long, value_name = "N")]
    pub max_output_tokens: Option<u32>,
    /// Largest request body in bytes [default: 4194304].
    #[arg(long, value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
    /// Request-body bytes held at once (waiting or being forwarded); past it, 503 [default: 268435456].
    #[arg(long, value_name = "BYTES")]
    pub max_buffered_bytes: Option<usize>,
    /// Longest time to receive a request's headers, and longest keep-alive idle time; then 408 and
    /// close [default: 10s].
    #[arg(long, value_name = "DURATION")]
    pub header_timeout: Option<String>,
    /// Longest time to receive a request's body; then 408 [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub body_timeout: Option<String>,
    /// Longest time a write to a client may stay blocked (the client stopped reading); then the
    /// connection is closed and the permit returned [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub send_timeout: Option<String>,
    /// Connections served at once; more wait in the listen backlog [default: 1024].
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// On SIGINT/SIGTERM, how long running answers may take to finish [default: 30s].
    #[arg(long, value_name = "DURATION")]
    pub shutdown_grace: Option<String>,
    /// Answer every retryable rejection with 429 (for clients that retry only on 429).
    #[arg(long)]
    pub all_429: bool,
    /// Admin endpoint (POST /admin/reload, GET /admin/usage), on a loopback address only.
    #[arg(long, value_name = "ADDR")]
    pub admin_listen: Option<SocketAddr>,
    /// Serve /metrics on this address instead of the main one (a port clients cannot reach).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Without API keys: the header that names a request's tenant (x-tenant, say).
    #[arg(long, value_name = "NAME")]
    pub tenant_header: Option<String>,
    /// Without API keys: the OpenAI `user` field names a request's tenant.
    #[arg(long)]
    pub tenant_from_user: bool,
    /// Charge a shared system prompt once while requests holding it run (as engines with prefix
    /// caching store it); tracks at most N prefixes.
    #[arg(long, value_name = "N")]
    pub prefix_sharing: Option<usize>,
    /// Keep usage (budgets) in this file across restarts.
    #[arg(long, value_name = "FILE")]
    pub state_file: Option<PathBuf>,
    /// One JSON line per request to this file (`-`: standard error) [binary's default: -].
    #[arg(long, value_name = "FILE")]
    pub request_log: Option<PathBuf>,
    /// Send one span per request to this OpenTelemetry collector (OTLP/HTTP, e.g. http://collector:4318);
    /// needs the `otel` feature.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// How often upstreams are health-checked [default: 5s].
    #[arg(long, value_name = "DURATION")]
    pub health_interval: Option<String>,
    /// 5xx or missing answers in a row that take an upstream out until a health check passes [default: 3].
    #[arg(long, value_name = "N")]
    pub max_fails: Option<u32>,
    /// Read each upstream engine's /metrics (vLLM, SGLang) this often and correct its KV budget with it.
    #[arg(long, value_name = "DURATION")]
    pub engine_feedback: Option<String>,
    /// Share limits (rates, each upstream's capacity) with every replica through this Redis.
    #[arg(long, value_name = "URL", env = "KVGATE_REDIS_URL", hide_env_values = true)]
    pub redis: Option<String>,
    /// The name shared limits are kept under in Redis [default: kvgate].
    #[arg(long, value_name = "NAME")]
    pub redis_prefix: Option<String>,
    /// Limits of every tenant without its own (file only: `[tenant_defaults]`).
    #[arg(skip)]
    pub tenant_defaults: Option<TenantLimitsConfig>,
    /// Named tenants with their API keys (file only: `[[tenants]]`).
    #[arg(skip)]
    pub tenants: Vec<TenantConfig>,
}

impl Settings {
    /// Reads the TOML file at `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError::File`] when it cannot be read or is not valid TOML with known keys.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let file_error = |reason: String| ConfigError::File { path: path.to_owned(), reason };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        Self::from_toml(&text).map_err(file_error)
    }

    /// Reads the settings of a config file's text.
    ///
    /// # Errors
    ///
    /// The TOML parser's message (with the line and column) for text that is not valid TOML with known
    /// keys of the right types.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// These settings, each missing one taken from `file`.
    pub fn or(self, file: Settings) -> Settings {
        macro_rules! merge {
            ($($field:ident),*) => { Settings {
                $($field: self.$field.or(file.$field),)*
                config: self.config,
                hash_key: self.hash_key,
                all_429: self.all_429 || file.all_429,
                tenant_from_user: self.tenant_from_user || file.tenant_from_user,
                tenants: if self.tenants.is_empty() { file.tenants } else { self.tenants },
            } };
        }
        merge!(
            listen,
            upstream,
            upstream_file,
            admin_listen,
            metrics_listen,
            tenant_header,
            prefix_sharing,
            state_file,
            request_log,
            otlp_endpoint,
            health_interval,
            max_fails,
            engine_feedback,
            redis,
            redis_prefix,
            upstream_api_key,
            upstream_timeout,
            sim_tokens_per_sec,
            max_in_flight,
            queue,
            max_queue_wait,
            ttft_deadline,
            wait_policy,
            delay_target,
            delay_interval,
            fairness,
            output_token_weight,
            rate,
            rate_burst,
            token_rate,
            token_burst,
            kv_tokens,
            model,
            model_config,
            gpu,
            weight_gb,
            default_max_tokens,
            max_output_tokens,
            max_body_bytes,
            max_buffered_bytes,
            header_timeout,
            body_timeout,
            send_timeout,
            max_connections,
            shutdown_grace,
            tenant_defaults
        )
    }

    /// The configuration: these settings over [`Config::default`], every value checked.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] naming the setting for a value out of range (durations over a day or
    /// not numbers, zero limits, rates that are not positive), [`ConfigError::Conflict`] for settings
    /// that contradict each other.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        let invalid = |setting: &'static str, value: &dyn std::fmt::Display, reason: &str| ConfigError::Invalid {
            setting,
            value: value.to_string(),
            reason: reason.to_owned(),
        };
        let duration = |setting: &'static str, value: Option<String>, default: Duration, zero_ok: bool| {
            let Some(value) = value else { return Ok(default) };
            match parse_duration(&value, MAX_DURATION) {
                Ok(d) if d.is_zero() && !zero_ok => Err(invalid(setting, &value, "must be more than 0")),
                Ok(d) => Ok(d),
                Err(reason) => Err(invalid(setting, &value, &reason)),
            }
        };
        let positive = |setting: &'static str, value: f64| {
            if value.is_finite() && value > 0.0 {
                Ok(value)
            } else {
                Err(invalid(setting, &value, "expected a positive number"))
            }
        };
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        let check_url = |url: &str| {
            if url.starts_with("http://") {
                Ok(())
            } else {
                Err(invalid("--upstream", &crate::proxy::redact(url), "expected a plain http:// URL (no TLS)"))
            }
        };
        let url = match (self.upstream, self.upstream_file) {
            (Some(url), _) | (None, Some(UpstreamSetting::Url(url))) => Some(url),
            (None, Some(UpstreamSetting::List(list))) => {
                for upstream in &list {
                    if let Some(url) = &upstream.url {
                        check_url(url)?;
                    }
                }
                config.upstreams = list;
                None
            }
            (None, None) => None,
        };
        if let Some(url) = url {
            check_url(&url)?;
            config.backend = BackendConfig::Upstream(url);
        } else if let Some(rate) = self.sim_tokens_per_sec {
            config.backend = BackendConfig::Simulated { tokens_per_sec: positive("--sim-tokens-per-sec", rate)? };
        }
        config.upstream_api_key = self.upstream_api_key;
        config.upstream_timeout =
            duration("--upstream-timeout", self.upstream_timeout, config.upstream_timeout, false)?;
        config.max_queue_wait = duration("--max-queue-wait", self.max_queue_wait, config.max_queue_wait, true)?;
        if let Some(value) = self.ttft_deadline {
            config.ttft_deadline = Some(duration("--ttft-deadline", Some(value), Duration::ZERO, false)?);
        }
        let (target, interval) = match config.wait_policy {
            kvgate::WaitPolicy::ControlledDelay { target, interval } => (target, interval),
            kvgate::WaitPolicy::Fifo => (kvgate::DEFAULT_DELAY_TARGET, kvgate::DEFAULT_DELAY_INTERVAL),
        };
        let target = duration("--delay-target", self.delay_target.clone(), target, false)?;
        let interval = duration("--delay-interval", self.delay_interval.clone(), interval, false)?;
        config.wait_policy = match self.wait_policy.as_deref().map(str::trim) {
            None | Some("controlled-delay") => kvgate::WaitPolicy::ControlledDelay { target, interval },
            Some("fifo") if self.delay_target.is_some() || self.delay_interval.is_some() => {
                return Err(ConfigError::Conflict(
                    "--delay-target and --delay-interval need --wait-policy controlled-delay".into(),
                ));
            }
            Some("fifo") => kvgate::WaitPolicy::Fifo,
            Some(other) => return Err(invalid("--wait-policy", &other, "expected controlled-delay or fifo")),
        };
        config.fairness = match (self.fairness.as_deref().map(str::trim), self.output_token_weight) {
            (None | Some("requests"), None) => kvgate::Fairness::Requests,
            (None | Some("requests"), Some(_)) => {
                return Err(ConfigError::Conflict("--output-token-weight needs --fairness tokens".into()));
            }
            (Some("tokens"), weight) => {
                let output_weight = weight.unwrap_or(2);
                if output_weight == 0 {
                    return Err(invalid("--output-token-weight", &0, "must be at least 1"));
                }
                kvgate::Fairness::Tokens { prompt_weight: 1, output_weight }
            }
            (Some(other), _) => return Err(invalid("--fairness", &other, "expected requests or tokens")),
        };
        config.header_timeout = duration("--header-timeout", self.header_timeout, config.header_timeout, false)?;
        config.body_timeout = duration("--body-timeout", self.body_timeout, config.body_timeout, false)?;
        config.send_timeout = duration("--send-timeout", self.send_timeout, config.send_timeout, false)?;
        config.shutdown_grace = duration("--shutdown-grace", self.shutdown_grace, config.shutdown_grace, true)?;
        if let Some(n) = self.max_in_flight {
            config.max_in_flight = n;
        }
        if let Some(n) = self.queue {
            config.queue = n;
        }
        if let Some(rate) = self.rate {
            let rate = positive("--rate", rate)?;
            let burst = self.rate_burst.unwrap_or((rate.ceil().max(1.0)).min(f64::from(u32::MAX)) as u32);
            config.rate = Some((rate, burst));
        } else if self.rate_burst.is_some() {
            return Err(ConfigError::Conflict("--rate-burst needs --rate".into()));
        }
        if let Some(rate) = self.token_rate {
            let rate = positive("--token-rate", rate)?;
            let burst = self.token_burst.unwrap_or((rate * 10.0).ceil().min(u64::MAX as f64) as u64);
            config.token_rate = Some((rate, burst));
        } else if self.token_burst.is_some() {
            return Err(ConfigError::Conflict("--token-burst needs --token-rate".into()));
        }
        config.kv_tokens = self.kv_tokens;
        config.model = self.model;
        config.model_config = self.model_config;
        config.gpu = self.gpu;
        if let Some(gb) = self.weight_gb {
            config.weight_gb = Some(positive("--weight-gb", gb)?);
        }
        if let Some(n) = self.default_max_tokens {
            if n == 0 {
                return Err(invalid("--default-max-tokens", &n, "must be at least 1"));
            }
            config.default_max_tokens = n;
        }
        if let Some(n) = self.max_output_tokens {
            if n == 0 {
                return Err(invalid("--max-output-tokens", &n, "must be at least 1"));
            }
            config.max_output_tokens = n;
        }
        for (setting, value, target) in [
            ("--max-body-bytes", self.max_body_bytes, &mut config.max_body_bytes),
            ("--max-buffered-bytes", self.max_buffered_bytes, &mut config.max_buffered_bytes),
            ("--max-connections", self.max_connections, &mut config.max_connections),
        ] {
            match value {
                Some(0) => return Err(invalid(setting, &0, "must be at least 1")),
                Some(n) => *target = n,
                None => {}
            }
        }
        if config.max_buffered_bytes < config.max_body_bytes {
            return Err(ConfigError::Conflict(format!(
                "--max-buffered-bytes {} is below --max-body-bytes {}: no body of the largest size could be read",
                config.max_buffered_bytes, config.max_body_bytes
            )));
        }
        config.all_429 = self.all_429;
        config.tenant_defaults = self.tenant_defaults;
        config.tenants = self.tenants;
        if let Some(addr) = self.admin_listen {
            if !addr.ip().is_loopback() {
                let reason = "the admin endpoint listens on a loopback address only (127.0.0.1 or [::1])";
                return Err(invalid("--admin-listen", &addr, reason));
            }
            config.admin_listen = Some(addr);
        }
        config.metrics_listen = self.metrics_listen;
        if let Some(header) = self.tenant_header {
            if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                return Err(invalid("--tenant-header", &header, "not a valid header name"));
            }
            config.tenant_header = Some(header.to_ascii_lowercase());
        }
        config.tenant_from_user = self.tenant_from_user;
        if let Some(n) = self.prefix_sharing {
            if n == 0 {
                return Err(invalid("--prefix-sharing", &n, "must be at least 1"));
            }
            config.prefix_sharing = Some(n);
        }
        config.state_file = self.state_file;
        config.request_log = self.request_log;
        config.otlp_endpoint = self.otlp_endpoint;
        config.health_interval = duration("--health-interval", self.health_interval, config.health_interval, false)?;
        if let Some(n) = self.max_fails {
            if n == 0 {
                return Err(invalid("--max-fails", &n, "must be at least 1"));
            }
            config.max_fails = n;
        }
        if let Some(every) = self.engine_feedback {
            config.engine_feedback = Some(duration("--engine-feedback", Some(every), Duration::ZERO, false)?);
        }
        config.redis = self.redis;
        if let Some(prefix) = self.redis_prefix {
            if prefix.is_empty() || prefix.contains(['{', '}']) {
                return Err(invalid("--redis-prefix", &prefix, "use a non-empty name without braces"));
            }
            config.redis_prefix = prefix;
        }
        Ok(config)
    }
}

impl Config {
    /// Parses flags (the program name first, as `std::env::args()` gives them) and the `--config`
    /// file they name.
    ///
    /// # Errors
    ///
    /// A `clap` error (which prints help, the version, or what is wrong) for flags that do not parse,
    /// as a [`ConfigError`] through [`FromArgsError`].
    pub fn from_args<I, T>(args: I) -> Result<Self, FromArgsError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let flags = Settings::try_parse_from(args).map_err(FromArgsError::Flags)?;
        Self::from_settings(flags)
    }

    /// The configuration of parsed flags and the file they name (read now: a reload calls this again).
    ///
    /// # Errors
    ///
    /// As [`from_args`](Config::from_args).
    pub fn from_settings(flags: Settings) -> Result<Self, FromArgsError> {
        let settings = match &flags.config {
            Some(path) => {
                let file = Settings::from_file(path).map_err(FromArgsError::Config)?;
                flags.or(file)
            }
            None => flags,
        };
        settings.into_config().map_err(FromArgsError::Config)
    }
}

/// `upstream` in the config file: one URL, or `[[upstream]]` tables.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum UpstreamSetting {
    /// `upstream = "http://localhost:8000"`.
    Url(String),
    /// `[[upstream]]` tables: several servers, each with its own limits.
    List(Vec<UpstreamConfig>),
}

/// Why [`Config::from_args`] gave no configuration.
#[derive(Debug, thiserror::Error)]
pub enum FromArgsError {
    /// The flags do not parse, or `--help`/`--version` was asked for (`clap`'s error prints it; its
    /// `exit()` exits with the right code).
    #[error(transparent)]
    Flags(clap::Error),
    /// The flags parse, the values do not make a configuration.
    #[error(transparent)]
    Config(ConfigError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn parse(flags: &str) -> Result<Config, FromArgsError> {
        Config::from_args(std::iter::once("kvgate-gateway").chain(flags.split_whitespace()))
    }

    #[test]
    fn wait_policy_flags_and_keys_parse_and_bad_values_name_the_flag() {
        let default = parse("").unwrap().wait_policy;
        assert_eq!(default, kvgate::WaitPolicy::controlled_delay());
        assert_eq!(parse("--wait-policy fifo").unwrap().wait_policy, kvgate::WaitPolicy::Fifo);
        let tight = parse("--delay-target 200ms --delay-interval 2s").unwrap().wait_policy;
        assert_eq!(
            tight,
            kvgate::WaitPolicy::ControlledDelay {
                target: Duration::from_millis(200),
                interval: Duration::from_secs(2)
            }
        );
        for (flags, named) in [
            ("--wait-policy lifo", "--wait-policy"),
            ("--delay-target 0", "--delay-target"),
            ("--delay-interval soon", "--delay-interval"),
            ("--wait-policy fifo --delay-target 1s", "--delay-target"),
        ] {
            let err = parse(flags).unwrap_err().to_string();
            assert!(err.contains(named), "{flags}: {err}");
        }
        let file = Settings::from_toml("wait_policy = \"fifo\"\n").unwrap();
        assert_eq!(Settings::default().or(file).into_config().unwrap().wait_policy, kvgate::WaitPolicy::Fifo);
    }

    #[test]
    fn deadline_and_fairness_flags_parse_and_bad_values_name_the_flag() {
        let config = parse("--ttft-deadline 2s --fairness tokens --output-token-weight 4").unwrap();
        assert_eq!(config.ttft_deadline, Some(Duration::from_secs(2)));
        assert_eq!(config.fairness, kvgate::Fairness::Tokens { prompt_weight: 1, output_weight: 4 });
        assert_eq!(parse("--fairness tokens").unwrap().fairness, kvgate::Fairness::tokens());
        assert_eq!(parse("--fairness requests").unwrap().fairness, kvgate::Fairness::Requests);
        assert_eq!(parse("").unwrap().ttft_deadline, None);
        for (flags, named) in [
            ("--ttft-deadline 0", "--ttft-deadline"),
            ("--ttft-deadline soon", "--ttft-deadline"),
            ("--fairness bytes", "--fairness"),
            ("--fairness tokens --output-token-weight 0", "--output-token-weight"),
            ("--output-token-weight 3", "--output-token-weight"),
        ] {
            let error = parse(flags).unwrap_err().to_string();
            assert!(error.contains(named), "{flags}: {error}");
        }
        let file = Settings::from_toml("ttft_deadline = \"1500ms\"\nfairness = \"tokens\"\n").unwrap();
        let config = file.into_config().unwrap();
        assert_eq!(
            (config.ttft_deadline, config.fairness),
            (Some(Duration::from_millis(1500)), kvgate::Fairness::tokens())
        );
    }

    #[test]
    fn flags_parse() {
        let config = parse(
            "--listen 127.0.0.1:9000 --upstream http://localhost:11434/v1 --max-in-flight 8 --queue 16 \
             --max-queue-wait 1.5s --rate 20 --token-rate=5000 --kv-tokens 65536 --default-max-tokens 256 --all-429",
        )
        .unwrap();
        assert_eq!(config.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(config.backend, BackendConfig::Upstream("http://localhost:11434/v1".into()));
        assert_eq!((config.max_in_flight, config.queue, config.kv_tokens), (8, 16, Some(65_536)));
        assert_eq!(config.max_queue_wait, Duration::from_millis(1500));
        assert_eq!(config.rate, Some((20.0, 20)));
        assert_eq!(config.token_rate, Some((5000.0, 50_000)));
        assert_eq!((config.default_max_tokens, config.all_429), (256, true));
        assert_eq!(parse("--max-queue-wait 250").unwrap().max_queue_wait, Duration::from_millis(250));
        assert_eq!(parse("").unwrap(), Config::default());
    }

    #[test]
    fn misuse_is_reported_not_panicked() {
        for flags in [
            "--bogus 1",
            "--queue",
            "--upstream https://x",
            "--max-queue-wait 1e300s",
            "--upstream-timeout 1e300s",
            "--upstream-timeout 0",
            "--header-timeout -1s",
            "--body-timeout NaNs",
            "--max-queue-wait 2d",
            "--rate 0",
            "--rate-burst 5",
            "--max-body-bytes 0",
            "--max-buffered-bytes 10",
            "--default-max-tokens 0",
            "--admin-listen 0.0.0.0:9090",
            "--prefix-sharing 0",
            "--max-fails 0",
            "--health-interval 0",
            "--engine-feedback 2d",
            "--tenant-header a:b",
            "--redis-prefix a{b}",
        ] {
            let err = parse(flags).expect_err(flags);
            assert!(!err.to_string().is_empty(), "{flags}");
        }
        let err = parse("--admin-listen 10.0.0.1:9090").unwrap_err().to_string();
        assert!(err.contains("loopback"), "{err}");
        let err = parse("--max-queue-wait 1e300s").unwrap_err().to_string();
        assert!(err.contains("--max-queue-wait") && err.contains("1 day"), "{err}");
        assert!(
            matches!(parse("--help"), Err(FromArgsError::Flags(e)) if e.kind() == clap::error::ErrorKind::DisplayHelp)
        );
    }

    #[test]
    fn the_file_fills_in_what_the_flags_leave() {
        let dir = std::env::temp_dir().join(format!("kvgate-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("gateway.toml");
        std::fs::write(
            &path,
            r#"
max_in_flight = 4
queue = 9
max_queue_wait = "2s"
rate = 5.0

[tenant_defaults]
max_in_flight = 2

[[tenants]]
name = "alice"
keys = ["sk-alice"]
priority = "interactive"
request_rate = 1.0
request_burst = 3

[[upstream]]
name = "a"
url = "http://127.0.0.1:8000"
kv_tokens = 1000

[[upstream]]
name = "b"
"#,
        )
        .unwrap();
        let config = parse(&format!("--config {} --queue 3", path.display())).unwrap();
        assert_eq!((config.max_in_flight, config.queue), (4, 3), "flags win over the file");
        assert_eq!(config.max_queue_wait, Duration::from_secs(2));
        assert_eq!(config.rate, Some((5.0, 5)));
        assert_eq!(config.tenants[0].name, "alice");
        assert_eq!(config.tenant_defaults.as_ref().unwrap().max_in_flight, Some(2));
        assert_eq!(config.upstreams.len(), 2);
        assert_eq!((config.upstreams[0].kv_tokens, config.upstreams[1].url.as_deref()), (Some(1000), None));
        std::fs::write(&path, "upstream = \"http://127.0.0.1:9\"\n").unwrap();
        let one = parse(&format!("--config-file {}", path.display())).unwrap();
        assert_eq!(one.backend, BackendConfig::Upstream("http://127.0.0.1:9".into()));
        std::fs::write(&path, "max_in_flite = 4\n").unwrap();
        let err = parse(&format!("--config {}", path.display())).unwrap_err().to_string();
        assert!(err.contains("max_in_flite"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
