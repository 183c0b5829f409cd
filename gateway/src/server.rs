//! The gateway: its routes, the reading of a completion request before admission, the handler behind
//! admission, and reloads.
//!
//! ```text
//! POST /v1/chat/completions, /v1/completions (other methods: 405 from the router, before anything else)
//!   front_door        request id and trace context; the caller's key (401) or tenant header; the
//!                     priority header (can only lower); on the way out: x-request-id, the log line,
//!                     the budget charged when the answer ends, the response counted by tenant
//!   AdmissionLayer    kvgate::tower over the gateway's Gate, with `read` as its async mapping:
//!     read            the body within --max-body-bytes (413) and --body-timeout (408), within the
//!                     --max-buffered-bytes budget (503), parsed by kvgate::openai (400/413), the
//!                     tenant's budget reserved (429 with its renewal time); nothing else is reserved
//!     Gate            front admission (rates, tenants, fair queue), then an upstream with room
//!                     (see `gate`, `dispatch`); 429/503 + Retry-After; x-ratelimit-* on every answer
//!   complete          the upstream's engine: the simulated one or the proxy
//! GET /v1/models, /v1/usage (the caller's own usage), /metrics, /healthz
//! ```

use crate::budget::{BudgetHold, BudgetLimits, Budgets, system_clock};
use crate::config::{Config, ConfigError, restart_only_change};
use crate::conn::{self, ServeOptions};
use crate::deadline::request_ttft_deadline;
use crate::dispatch::Dispatcher;
use crate::error::ApiError;
use crate::gate::{Gate, Grant};
use crate::limiter::Limiter;
use crate::metrics;
use crate::plan::{self, UpstreamSpec};
use crate::sim::SimStats;
use crate::tenants::{Caller, KeyError, Keys, request_priority, tenant_name};
use crate::trace::{LogLine, REQUEST_ID, RequestLog, TRACEPARENT, Trace};
use crate::units;
use crate::upstream::{Backend, Upstream};
use arc_swap::ArcSwap;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, post_service};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kvgate::clock::{Clock, MonotonicClock};
use kvgate::openai::{CompletionRequest, Endpoint, OutputTokens, Parser, PromptEstimator};
use kvgate::stream::OutputCounter;
use kvgate::tower::AdmissionLayer;
use kvgate::{Admission, Priority};
use metrics_exporter_prometheus::PrometheusHandle;
use parking_lot::Mutex;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Where a reload reads its configuration from (the binary: its flags and `--config-file` again).
pub type ConfigSource = Arc<dyn Fn() -> Result<Config, ConfigError> + Send + Sync>;

/// A configured gateway: the admission, the upstreams, the request reader. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: ArcSwap<Config>,
    keys: ArcSwap<Keys>,
    parser: ArcSwap<Parser>,
    gate: Gate,
    budgets: Arc<Budgets>,
    /// The request-body budget: one permit per byte held.
    buffered: Arc<Semaphore>,
    buffered_limit: usize,
    served_model: String,
    metrics: PrometheusHandle,
    log: RequestLog,
    #[cfg(feature = "otel")]
    otel: Option<crate::otel::Exporter>,
    clock: MonotonicClock,
    closing: AtomicBool,
    source: Mutex<Option<ConfigSource>>,
    reloading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").field("gate", &self.inner.gate).finish_non_exhaustive()
    }
}

/// What a request brings to admission from the front door: its trace, caller and priority.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// Its id and trace context.
    pub trace: Trace,
    /// Its tenant, if any.
    pub caller: Option<Caller>,
    /// Whether the caller is a configured tenant (its name may label metrics).
    pub listed: bool,
    /// The class it asks for (its caller's, or lower).
    pub priority: Priority,
    /// Its time-to-first-token deadline: the gateway's default, or shorter by its header.
    pub ttft_deadline: Option<Duration>,
    /// When it arrived (the gateway's clock, nanoseconds).
    pub arrived: u64,
}

impl RequestContext {
    /// The context of a request refused before its caller is known.
    fn anonymous(trace: Trace, arrived: u64) -> Self {
        RequestContext { trace, caller: None, listed: false, priority: Priority::Normal, ttft_deadline: None, arrived }
    }
}

/// What the front door learns from the handler about a served request (in the response's extensions).
#[derive(Debug, Clone)]
struct Served {
    upstream: Arc<str>,
    upstream_status: u16,
    tokens_in: u32,
    waited: Duration,
    budget: Arc<Mutex<Option<BudgetHold>>>,
}

/// What `read` hands to `complete`: the checked request (its body to forward) and what it holds.
struct Forward {
    completion: CompletionRequest,
    /// The client's `Authorization`, passed upstream only when the gateway has no keys of its own.
    client_auth: Option<HeaderValue>,
    /// The request's reservation in its tenant's budgets (given back if it is refused).
    budget: Option<BudgetHold>,
    /// The share of the body budget this request holds until it has been forwarded.
    _bytes: OwnedSemaphorePermit,
}

fn budget_limits(config: &Config) -> Vec<BudgetLimits> {
    config
        .tenants
        .iter()
        .map(|t| BudgetLimits { name: t.name.as_str().into(), daily: t.daily_tokens, monthly: t.monthly_tokens })
        .collect()
}

fn parser(config: &Config, base: Parser) -> Parser {
    base.default_max_tokens(config.default_max_tokens).max_output_tokens(config.max_output_tokens)
}

impl Gateway {
    /// A gateway estimating prompts with the [`Heuristic`](kvgate::openai::Heuristic), its limits in
    /// this process. For limits shared through Redis, use [`connect`](Gateway::connect).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for invalid limits, an unknown model or GPU, conflicting settings, tenants or
    /// upstreams, an unreadable state file, or a `redis` setting.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::with_parser(config, Parser::new())
    }

    /// A gateway estimating prompts with `estimator` (a real tokenizer).
    ///
    /// # Errors
    ///
    /// As [`Gateway::new`].
    pub fn with_estimator(config: Config, estimator: impl PromptEstimator + 'static) -> Result<Self, ConfigError> {
        Self::with_parser(config, Parser::new().estimator(estimator))
    }

    fn with_parser(config: Config, base: Parser) -> Result<Self, ConfigError> {
        if config.redis.is_some() {
            return Err(ConfigError::Conflict(
                "--redis: build the gateway with Gateway::connect (it connects to Redis)".into(),
            ));
        }
        let specs = plan::upstream_specs(&config)?;
        let limiters = specs
            .iter()
            .map(|spec| plan::upstream_admission(&config, spec).map(Limiter::Local))
            .collect::<Result<Vec<_>, _>>()?;
        let front = Limiter::Local(plan::front_admission(&config, &specs, false)?);
        Self::assemble(config, base, &specs, front, limiters)
    }

    /// A gateway whose limits are shared through the Redis of `config.redis` (each upstream's capacity,
    /// the global and tenant rates), or in this process without it.
    ///
    /// # Errors
    ///
    /// As [`Gateway::new`], and a [`ConfigError`] for a Redis URL that cannot be used (Redis itself may be
    /// down: its fail policy applies until it answers).
    pub async fn connect(config: Config) -> Result<Self, ConfigError> {
        let Some(url) = config.redis.clone() else { return Self::new(config) };
        #[cfg(feature = "redis")]
        {
            let specs = plan::upstream_specs(&config)?;
            let mut limiters = Vec::with_capacity(specs.len());
            for spec in &specs {
                limiters.push(crate::shared::upstream(&url, &config, spec).await?);
            }
            let front = crate::shared::front(&url, &config, &specs).await?;
            Self::assemble(config, Parser::new(), &specs, front, limiters)
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = url;
            Err(ConfigError::Conflict("--redis: this gateway was built without the `redis` feature".into()))
        }
    }

    fn assemble(
        config: Config,
        base: Parser,
        specs: &[UpstreamSpec],
        front: Limiter,
        limiters: Vec<Limiter>,
    ) -> Result<Self, ConfigError> {
        let keys = Keys::new(&config.tenants).map_err(ConfigError::Conflict)?;
        let budgets = Budgets::new(budget_limits(&config), config.state_file.clone(), system_clock())
            .map_err(ConfigError::Conflict)?;
        let log = match &config.request_log {
            Some(path) => RequestLog::open(path).map_err(|e| ConfigError::File {
                path: path.clone(),
                reason: format!("cannot open the request log: {e}"),
            })?,
            None => RequestLog::off(),
        };
        #[cfg(feature = "otel")]
        let otel = match &config.otlp_endpoint {
            Some(endpoint) => Some(crate::otel::Exporter::start(endpoint).map_err(ConfigError::Conflict)?),
            None => None,
        };
        #[cfg(not(feature = "otel"))]
        if config.otlp_endpoint.is_some() {
            return Err(ConfigError::Conflict(
                "--otlp-endpoint: this gateway was built without the `otel` feature".into(),
            ));
        }
        let upstreams = plan::upstreams(&config, specs, limiters)?;
        let simulated = matches!(upstreams[0].backend, Backend::Simulated(_));
        let dispatcher = Dispatcher::new(upstreams, config.max_queue_wait);
        let served_model =
            config.model.clone().unwrap_or_else(|| if simulated { "kvgate-sim".into() } else { String::new() });
        let buffered_limit = config.max_buffered_bytes.min(Semaphore::MAX_PERMITS);
        let inner = Inner {
            keys: ArcSwap::from_pointee(keys),
            parser: ArcSwap::from_pointee(parser(&config, base)),
            gate: Gate::new(front, dispatcher),
            budgets,
            buffered: Arc::new(Semaphore::new(buffered_limit)),
            buffered_limit,
            served_model,
            metrics: metrics::handle(),
            log,
            #[cfg(feature = "otel")]
            otel,
            clock: MonotonicClock::new(),
            closing: AtomicBool::new(false),
            source: Mutex::new(None),
            reloading: tokio::sync::Mutex::new(()),
            config: ArcSwap::from_pointee(config),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The front admission every completion request goes through first (rates, tenants, the waiting
    /// room; its capacity is the sum of the in-service upstreams').
    pub fn admission(&self) -> Admission {
        self.inner.gate.front().local().clone()
    }

    /// The gateway's admission: front admission, then an upstream.
    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }

    /// The upstreams, in configuration order.
    pub fn upstreams(&self) -> &[Arc<Upstream>] {
        self.inner.gate.dispatcher().upstreams()
    }

    /// The configuration in force (the last one loaded).
    pub fn config(&self) -> Arc<Config> {
        self.inner.config.load_full()
    }

    /// Tenants' budgets and usage.
    pub fn budgets(&self) -> &Arc<Budgets> {
        &self.inner.budgets
    }

    /// The first upstream's simulated engine's books (`None` for a real server).
    pub fn sim_stats(&self) -> Option<SimStats> {
        self.upstreams()[0].sim_stats()
    }

    /// Request-body bytes held now (requests read and waiting, or being forwarded).
    pub fn buffered_bytes(&self) -> usize {
        self.inner.buffered_limit - self.inner.buffered.available_permits()
    }

    /// Writes the usage state file now (if usage changed).
    ///
    /// # Errors
    ///
    /// The I/O error.
    pub fn save_usage(&self) -> std::io::Result<()> {
        self.inner.budgets.save()
    }

    /// Stops admitting: waiting and new requests get `503` with `Retry-After`, `/healthz` says
    /// `closing`; running answers go on.
    pub fn close(&self) {
        self.inner.closing.store(true, Ordering::Release);
        self.inner.gate.close();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closing(&self) -> bool {
        self.inner.closing.load(Ordering::Acquire)
    }

    /// Sets where [`reload_from_source`](Self::reload_from_source) (SIGHUP, `POST /admin/reload`)
    /// reads the configuration.
    pub fn set_config_source(&self, source: ConfigSource) {
        *self.inner.source.lock() = Some(source);
    }

    /// Reads the configuration from its source and [reloads](Self::reload) it.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] (nothing changed): no source set, an invalid file, a setting that needs a restart.
    pub async fn reload_from_source(&self) -> Result<(), ConfigError> {
        let source = self.inner.source.lock().clone();
        let source = source.ok_or_else(|| ConfigError::Conflict("no configuration file to reload from".into()))?;
        self.reload(source()?).await
    }

    /// Applies a new configuration's limits, keys, tenants, budgets and upstream capacities without
    /// dropping anything: running answers and waiting requests keep the grants and places they have
    /// (the front admission is replaced by one with the new limits; the upstreams' admissions are
    /// resized in place, so the engines stay protected throughout).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming what is wrong — an invalid value, or a setting that only a restart can
    /// change (`listen`, the upstreams' addresses, ...) — and then nothing changed.
    pub async fn reload(&self, new: Config) -> Result<(), ConfigError> {
        let inner = &self.inner;
        let _one_at_a_time = inner.reloading.lock().await;
        let old = inner.config.load_full();
        if let Some(setting) = restart_only_change(&old, &new) {
            return Err(ConfigError::Conflict(format!("{setting} changed: it takes a restart; nothing was reloaded")));
        }
        let keys = Keys::new(&new.tenants).map_err(ConfigError::Conflict)?;
        let specs = plan::upstream_specs(&new)?;
        let upstreams = self.upstreams();
        for (spec, upstream) in specs.iter().zip(upstreams) {
            let had = upstream.limiter.local().snapshot().kv_capacity != u64::MAX;
            let kind_changed = had != spec.kv.units().is_some()
                || upstream.limiter.local().kv_in_bytes() != matches!(spec.kv, plan::KvBudget::Plan(_));
            if kind_changed {
                return Err(ConfigError::Conflict(format!(
                    "upstream {:?}: its KV budget changed unit or appeared/disappeared: it takes a restart; nothing was reloaded",
                    spec.name
                )));
            }
        }
        let front = match &new.redis {
            #[cfg(feature = "redis")]
            Some(url) => crate::shared::front(url, &new, &specs).await?,
            _ => Limiter::Local(plan::front_admission(&new, &specs, false)?),
        };
        // Everything is checked: apply.
        for (spec, upstream) in specs.iter().zip(upstreams) {
            let admission = upstream.limiter.local();
            admission.set_max_in_flight(spec.slots)?;
            if let Some(kv) = spec.kv.units() {
                admission.set_kv_capacity(kv)?;
            }
        }
        inner.gate.replace_front(front);
        inner.gate.dispatcher().set_max_wait(new.max_queue_wait);
        inner.keys.store(Arc::new(keys));
        inner.parser.store(Arc::new(parser(&new, Parser::clone(&inner.parser.load()))));
        inner.budgets.set_limits(budget_limits(&new));
        inner.config.store(Arc::new(new));
        self.capacity_changed();
        Ok(())
    }

    /// Sets the front admission's capacity to the sum of the in-service upstreams' (all of them when
    /// none is in service), after a health change, a reload or an engine-feedback correction; then lets
    /// the dispatcher's line move.
    pub fn capacity_changed(&self) {
        let upstreams = self.upstreams();
        let in_service: Vec<_> = upstreams.iter().filter(|u| u.is_healthy()).collect();
        let counted: Vec<&Arc<Upstream>> = if in_service.is_empty() { upstreams.iter().collect() } else { in_service };
        let (slots, kv) = plan::capacity_sum(counted.iter().map(|u| {
            let s = u.limiter.local().snapshot();
            (s.max_in_flight, (s.kv_capacity != u64::MAX).then_some(s.kv_capacity))
        }));
        let front = self.inner.gate.front();
        let _ = front.local().set_max_in_flight(slots.max(1));
        if let Some(kv) = kv {
            let _ = front.local().set_kv_capacity(kv.max(1));
        }
        self.inner.gate.dispatcher().kick();
    }

    /// The Prometheus text of `/metrics` (publishes the gauges first).
    pub fn metrics_text(&self) -> String {
        let inner = &self.inner;
        let front = inner.gate.front();
        match &*front {
            Limiter::Local(admission) => admission.publish_metrics(),
            #[cfg(feature = "redis")]
            Limiter::Shared(shared) => shared.publish_metrics(),
        }
        let keys_listed =
            self.config().tenants.iter().map(|t| t.name.clone()).collect::<std::collections::HashSet<_>>();
        let admission = front.local();
        let tenants: Vec<(Arc<str>, u64)> = admission
            .busiest_tenants(10)
            .into_iter()
            .filter_map(|(id, running)| admission.tenant_name(id).map(|name| (name, running)))
            .filter(|(name, _)| keys_listed.contains(&**name))
            .collect();
        metrics::publish(&metrics::Published {
            buffered: self.buffered_bytes(),
            tenants: &tenants,
            upstreams: self.upstreams(),
            waiting_for_upstream: inner.gate.dispatcher().waiting(),
            usage: &inner.budgets.usage(),
            budgets: &inner.budgets.limits(),
        });
        inner.metrics.render()
    }

    /// How connections are served.
    pub fn serve_options(&self) -> ServeOptions {
        let config = self.config();
        ServeOptions {
            header_timeout: config.header_timeout,
            send_timeout: config.send_timeout,
            max_connections: config.max_connections,
            shutdown_grace: config.shutdown_grace,
        }
    }

    /// The axum application.
    pub fn router(&self) -> Router {
        let reader = self.clone();
        let handler = self.clone();
        let completions = tower::ServiceBuilder::new()
            .layer(middleware::from_fn_with_state(self.clone(), front_door))
            .layer(
                AdmissionLayer::new_async(self.inner.gate.clone(), move |request| read(reader.clone(), request))
                    .all_rejections_as_429(self.config().all_429)
                    .count_with(OutputTokens::new()),
            )
            .service_fn(move |request| complete(handler.clone(), request));
        let router = Router::new()
            .route("/v1/chat/completions", post_service(completions.clone()))
            .route("/v1/completions", post_service(completions))
            .route("/v1/models", get(models))
            .route("/v1/usage", get(own_usage))
            .route("/healthz", get(healthz));
        let router = match self.config().metrics_listen {
            Some(_) => router,
            None => router.route("/metrics", get(metrics_route)),
        };
        router.with_state(self.clone())
    }

    /// The metrics application, for `--metrics-listen`: `GET /metrics`, `GET /healthz`.
    pub fn metrics_router(&self) -> Router {
        Router::new().route("/metrics", get(metrics_route)).route("/healthz", get(healthz)).with_state(self.clone())
    }

    /// The admin application (serve it on a loopback address only): `POST /admin/reload`,
    /// `GET /admin/usage`, `GET /metrics`, `GET /healthz`.
    pub fn admin_router(&self) -> Router {
        Router::new()
            .route("/admin/reload", post(admin_reload))
            .route("/admin/usage", get(admin_usage))
            .route("/metrics", get(metrics_route))
            .route("/healthz", get(healthz))
            .with_state(self.clone())
    }
}

/// Serves the gateway on `listener` until the task is dropped (tests and embedders).
///
/// # Errors
///
/// I/O errors of the listener.
pub async fn serve(listener: tokio::net::TcpListener, gateway: Gateway) -> std::io::Result<()> {
    serve_until(listener, gateway, std::future::pending()).await
}

/// Serves the gateway — and its admin and metrics endpoints, health checks, engine feedback and usage saving, as
/// configured — until `shutdown` resolves; then stops accepting, closes the admission (waiting requests
/// get `503` with `Retry-After`, `/healthz` says `closing`), lets running answers finish for at most
/// `--shutdown-grace`, saves usage, and returns.
///
/// # Errors
///
/// I/O errors of the listeners (the admin address cannot be bound, say).
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let options = gateway.serve_options();
    let config = gateway.config();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut tasks = crate::health::spawn(&gateway, stopped.clone());
    let side = [(config.admin_listen, gateway.admin_router()), (config.metrics_listen, gateway.metrics_router())];
    for (addr, router) in side {
        let Some(addr) = addr else { continue };
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let mut stopped = stopped.clone();
        tasks.push(tokio::spawn(async move {
            let _ = conn::serve(listener, router, options, async move {
                crate::health::until_stopped(&mut stopped).await;
            })
            .await;
        }));
    }
    let closing = gateway.clone();
    let signal = async move {
        shutdown.await;
        closing.close();
        let _ = stop.send(true);
    };
    let served = conn::serve(listener, gateway.router(), options, signal).await;
    if let Err(e) = gateway.save_usage() {
        eprintln!("kvgate-gateway: could not save usage: {e}");
    }
    for task in tasks {
        task.abort();
    }
    served
}

/// The body budget for a request that declares `declared` bytes (or the largest allowed).
fn reserve(inner: &Inner, declared: Option<usize>, max: usize) -> Result<OwnedSemaphorePermit, ApiError> {
    let bytes = declared.unwrap_or(max).max(1);
    let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
    Arc::clone(&inner.buffered).try_acquire_many_owned(permits).map_err(|_| {
        let message = format!(
            "the gateway holds {} of request bodies already (its limit); retry later",
            units::bytes(inner.buffered_limit as u64)
        );
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "memory_full", message)
    })
}

/// Reads a body to its end, keeping nothing.
async fn discard<B: http_body::Body + Unpin>(mut body: B) {
    while let Some(Ok(_)) = body.frame().await {}
}

/// The outermost step of a completion request: see the [module docs](self).
async fn front_door(State(gateway): State<Gateway>, mut request: axum::extract::Request, next: Next) -> Response {
    let inner = &gateway.inner;
    let arrived = inner.clock.now_nanos();
    let trace = Trace::from_headers(request.headers());
    let config = inner.config.load();
    let keys = inner.keys.load();
    let refuse = |error: ApiError| {
        metrics::invalid(error.code);
        error.to_response().map(Body::from)
    };
    let (caller, listed) = match keys.caller(request.headers()) {
        Ok(Some(caller)) => (Some(caller.clone()), true),
        Ok(None) => {
            let named = config
                .tenant_header
                .as_deref()
                .and_then(|h| request.headers().get(h))
                .and_then(|v| v.to_str().ok())
                .and_then(tenant_name)
                .map(Caller::named);
            (named, false)
        }
        Err(KeyError::Missing) => {
            let message = "this gateway needs an API key: Authorization: Bearer <key>";
            let response = refuse(ApiError::new(StatusCode::UNAUTHORIZED, "missing_api_key", message));
            return finish(&gateway, response, &RequestContext::anonymous(trace, arrived));
        }
        Err(KeyError::Unknown) => {
            let message = "the API key is not known to this gateway";
            let response = refuse(ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", message));
            return finish(&gateway, response, &RequestContext::anonymous(trace, arrived));
        }
    };
    let own = caller.as_ref().map_or(Priority::Normal, |c| c.priority);
    let priority = match request_priority(own, request.headers()) {
        Ok(priority) => priority,
        Err(message) => {
            let response = refuse(ApiError::new(StatusCode::BAD_REQUEST, "invalid_priority", message));
            let context = RequestContext { trace, caller, listed, priority: own, ttft_deadline: None, arrived };
            return finish(&gateway, response, &context);
        }
    };
    let ttft_deadline = match request_ttft_deadline(config.ttft_deadline, request.headers()) {
        Ok(deadline) => deadline,
        Err(message) => {
            let response = refuse(ApiError::new(StatusCode::BAD_REQUEST, "invalid_ttft_deadline", message));
            return finish(
                &gateway,
                response,
                &RequestContext { trace, caller, listed, priority, ttft_deadline: None, arrived },
            );
        }
    };
    // Shared with the steps behind (they read it from the request's extensions), never copied.
    let context = Arc::new(RequestContext { trace, caller, listed, priority, ttft_deadline, arrived });
    request.extensions_mut().insert(Arc::clone(&context));
    let response = next.run(request).await;
    finish(&gateway, response, &context)
}

/// The answer on its way out: headers, counts, and the body that logs and charges when it ends.
fn finish(gateway: &Gateway, mut response: Response, context: &RequestContext) -> Response {
    let inner = &gateway.inner;
    let status = response.status().as_u16();
    if let Ok(id) = HeaderValue::from_str(&context.trace.request_id) {
        response.headers_mut().insert(REQUEST_ID, id);
    }
    if status == 503 && gateway.is_closing() && !response.headers().contains_key(http::header::RETRY_AFTER) {
        // Shutting down: another replica (or this one, restarted) answers.
        kvgate::http::insert_retry_after(response.headers_mut(), Duration::from_secs(1));
    }
    let tenant =
        context.caller.as_ref().map(|c| if context.listed { Arc::clone(&c.name).into() } else { "unlisted".into() });
    metrics::response(status, tenant);
    let served = response.extensions_mut().remove::<Served>();
    #[cfg(feature = "otel")]
    let exporting = inner.otel.is_some();
    #[cfg(not(feature = "otel"))]
    let exporting = false;
    if !inner.log.is_on() && !exporting && served.as_ref().is_none_or(|s| s.budget.lock().is_none()) {
        return response;
    }
    let decision = match (status, &served) {
        (_, Some(_)) => "admitted",
        (429 | 503, None) => "rejected",
        _ => "invalid",
    };
    let line = LogLine {
        parent_span_id: context.trace.parent_span_id.clone(),
        span_id: context.trace.span_id.clone(),
        request_id: context.trace.request_id.clone(),
        trace_id: context.trace.trace_id.clone(),
        tenant: context.caller.as_ref().map(|c| c.name.to_string()),
        priority: Some(context.priority.as_str()),
        decision,
        status,
        queue_wait_ms: served.as_ref().map(|s| s.waited.as_secs_f64() * 1e3),
        upstream: served.as_ref().map(|s| s.upstream.to_string()),
        upstream_status: served.as_ref().map(|s| s.upstream_status),
        tokens_in: served.as_ref().map(|s| s.tokens_in),
        ..LogLine::default()
    };
    let budget = served.and_then(|s| s.budget.lock().take());
    response.map(|body| {
        Body::new(Logged {
            inner: body,
            gateway: Arc::clone(&gateway.inner),
            line: Some(line),
            arrived: context.arrived,
            counter: OutputTokens::new(),
            summed: 0,
            budget,
        })
    })
}

/// An answer's body that, when it ends or is dropped, writes the request's log line and charges its
/// budget with the output tokens counted in it.
struct Logged {
    inner: Body,
    gateway: Arc<Inner>,
    line: Option<LogLine>,
    arrived: u64,
    counter: OutputTokens,
    summed: u32,
    budget: Option<BudgetHold>,
}

impl Logged {
    fn end(&mut self) {
        let Some(mut line) = self.line.take() else { return };
        let tokens = <OutputTokens as OutputCounter<[u8]>>::total(&self.counter, self.summed);
        if let Some(budget) = self.budget.take() {
            budget.settle(tokens);
        }
        let now = self.gateway.clock.now_nanos();
        line.duration_ms = now.saturating_sub(self.arrived) as f64 / 1e6;
        line.tokens_out = if line.decision == "admitted" { tokens } else { None };
        line.ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        self.gateway.log.write(&line);
        #[cfg(feature = "otel")]
        if let Some(otel) = &self.gateway.otel {
            otel.export(&line, now.saturating_sub(self.arrived));
        }
    }
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = <OutputTokens as OutputCounter<[u8]>>::count(&mut this.counter, data);
                    this.summed = this.summed.saturating_add(n);
                    if let Some(line) = &mut this.line {
                        if line.ttft_ms.is_none() && !data.is_empty() {
                            let now = this.gateway.clock.now_nanos();
                            line.ttft_ms = Some(now.saturating_sub(this.arrived) as f64 / 1e6);
                        }
                    }
                }
            }
            Poll::Ready(None | Some(Err(_))) => this.end(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.end();
    }
}

/// The [`AdmissionLayer`]'s mapping: reads and checks a completion request before anything is reserved.
async fn read(
    gateway: Gateway,
    request: http::Request<Body>,
) -> Result<(kvgate::Request, http::Request<Forward>), http::Response<Bytes>> {
    let inner = &gateway.inner;
    let config = inner.config.load_full();
    let refuse = |error: ApiError| {
        metrics::invalid(error.code);
        let mut response = error.to_response();
        if error.status == StatusCode::SERVICE_UNAVAILABLE {
            kvgate::http::insert_retry_after(response.headers_mut(), inner.gate.front().local().capacity_retry_after());
        }
        response
    };
    let endpoint = Endpoint::from_path(request.uri().path()).unwrap_or(Endpoint::Chat);
    let context = request.extensions().get::<Arc<RequestContext>>().cloned();
    let max = config.max_body_bytes;
    let too_large = || {
        let message = format!("the request body exceeds {} ({max} bytes)", units::bytes(max as u64));
        // The rest of the body is left unread: the connection cannot carry another request.
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", message).closing()
    };
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if declared.is_some_and(|n| n > max) {
        return Err(refuse(too_large()));
    }
    let mut bytes_held = match reserve(inner, declared, max) {
        Ok(budget) => budget,
        Err(error) => {
            // Read the body to its end without keeping it (within the body deadline), so that the client is
            // not cut off while it writes and sees the 503 and its Retry-After.
            let body = Limited::new(request.into_body(), max);
            let _ = tokio::time::timeout(config.body_timeout, discard(body)).await;
            return Err(refuse(error));
        }
    };
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(config.body_timeout, Limited::new(body, max).collect()).await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return Err(refuse(too_large())),
        Ok(Err(e)) => {
            let message = format!("could not read the request body: {e}");
            return Err(refuse(ApiError::new(StatusCode::BAD_REQUEST, "unreadable_body", message).closing()));
        }
        Err(_) => {
            let message =
                format!("the request body did not arrive within {}", units::human_duration(config.body_timeout));
            return Err(refuse(ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", message).closing()));
        }
    };
    let completion = inner.parser.load().parse(endpoint, bytes).map_err(|e| {
        metrics::invalid(e.code());
        e.to_response()
    })?;
    // Hold what is kept (the body to forward), not what was declared.
    let held = completion.held_bytes().max(1);
    let reserved = bytes_held.num_permits();
    if held < reserved {
        drop(bytes_held.split(reserved - held));
    } else if let Ok(more) =
        Arc::clone(&inner.buffered).try_acquire_many_owned(u32::try_from(held - reserved).unwrap_or(u32::MAX))
    {
        bytes_held.merge(more);
    }
    let mut admit = completion.request();
    let mut caller = context.as_ref().and_then(|c| c.caller.clone());
    if caller.is_none() && config.tenant_from_user {
        caller = completion.user.as_deref().and_then(tenant_name).map(Caller::named);
    }
    let priority = context.as_ref().map_or(Priority::Normal, |c| c.priority);
    admit = admit.priority(priority);
    if let Some(deadline) = context.as_ref().and_then(|c| c.ttft_deadline) {
        admit = admit.ttft_deadline(deadline);
    }
    let mut budget = None;
    if let Some(caller) = &caller {
        admit = admit.tenant(caller.id);
        match inner.budgets.reserve(caller.id, completion.prompt_tokens, admit.total_tokens()) {
            Ok(hold) => budget = hold,
            Err(over) => {
                metrics::invalid("budget_exceeded");
                let message = format!(
                    "tenant {:?} has used {} of its {} budget of {} tokens (this request may use {}); it renews at {}",
                    &*over.tenant,
                    over.used,
                    over.period.as_str(),
                    over.limit,
                    admit.total_tokens(),
                    over.renews_at_rfc3339()
                );
                let mut response = kvgate::http::error_response(
                    StatusCode::TOO_MANY_REQUESTS,
                    &message,
                    "rate_limit_error",
                    "budget_exceeded",
                );
                kvgate::http::insert_retry_after(response.headers_mut(), over.renews_in);
                if let Ok(at) = HeaderValue::from_str(&over.renews_at_rfc3339()) {
                    response.headers_mut().insert("x-kvgate-budget-renews-at", at);
                }
                return Err(response);
            }
        }
    }
    let client_auth =
        if inner.keys.load().required() { None } else { parts.headers.get(http::header::AUTHORIZATION).cloned() };
    let forward = Forward { completion, client_auth, budget, _bytes: bytes_held };
    Ok((admit, http::Request::from_parts(parts, forward)))
}

/// The handler behind admission: generate (simulated) or forward (proxy) on the granted upstream.
async fn complete(gateway: Gateway, request: http::Request<Forward>) -> Result<Response, Infallible> {
    let (parts, forward) = request.into_parts();
    let admitted = parts.extensions.get::<kvgate::Request>().copied().expect("the admission layer inserts it");
    let grant = parts.extensions.get::<Grant>().cloned().expect("the gate inserts its grant");
    let context = parts.extensions.get::<Arc<RequestContext>>().cloned();
    let upstream = &grant.upstream;
    let mut response = match &upstream.backend {
        Backend::Simulated(sim) => {
            let kv = upstream.limiter.local().kv_cost(&admitted);
            sim.complete(&forward.completion, kv, &gateway.inner.served_model).await
        }
        Backend::Upstream(proxy) => {
            let body = forward.completion.forward_body().clone();
            let headers = context.as_ref().into_iter().flat_map(|c| {
                let id = HeaderValue::from_str(&c.trace.request_id).ok().map(|id| (REQUEST_ID, id));
                let parent = HeaderValue::try_from(c.trace.traceparent()).ok().map(|tp| (TRACEPARENT, tp));
                id.into_iter().chain(parent)
            });
            let endpoint = forward.completion.endpoint;
            let response = proxy.complete(endpoint, body, forward.client_auth.as_ref(), headers).await;
            if upstream.answered(response.status().as_u16() < 500) {
                eprintln!("kvgate-gateway: upstream {} taken out after failed answers in a row", upstream.name);
                gateway.capacity_changed();
            }
            response
        }
    };
    let upstream_status = response.status().as_u16();
    response.extensions_mut().insert(Served {
        upstream: Arc::clone(&upstream.name),
        upstream_status,
        tokens_in: admitted.prompt_tokens,
        waited: grant.waited,
        budget: Arc::new(Mutex::new(forward.budget)),
    });
    Ok(response.into_response())
}

async fn models(State(gateway): State<Gateway>, headers: http::HeaderMap) -> Response {
    let inner = &gateway.inner;
    let proxied = gateway.upstreams().iter().filter(|u| u.is_healthy()).find_map(|u| u.proxy());
    match proxied {
        Some(proxy) => {
            let client_auth =
                if inner.keys.load().required() { None } else { headers.get(http::header::AUTHORIZATION) };
            proxy.models(client_auth).await.into_response()
        }
        None => crate::sim::json_response(&serde_json::json!({
            "object": "list",
            "data": [{ "id": inner.served_model, "object": "model", "created": 0, "owned_by": "kvgate" }],
        }))
        .into_response(),
    }
}

fn usage_json(gateway: &Gateway, tenant: &str) -> serde_json::Value {
    let (usage, limits) = gateway.inner.budgets.usage_of(tenant);
    serde_json::json!({
        "tenant": tenant,
        "day_tokens": usage.day_tokens,
        "month_tokens": usage.month_tokens,
        "total_tokens": usage.total_tokens,
        "requests": usage.requests,
        "reserved_tokens": usage.reserved,
        "daily_tokens_limit": limits.as_ref().and_then(|l| l.daily),
        "monthly_tokens_limit": limits.as_ref().and_then(|l| l.monthly),
    })
}

/// `GET /v1/usage`: the caller's own tenant's usage and budgets (never another tenant's).
async fn own_usage(State(gateway): State<Gateway>, headers: http::HeaderMap) -> Response {
    match gateway.inner.keys.load().caller(&headers) {
        Ok(Some(caller)) => axum::Json(usage_json(&gateway, &caller.name)).into_response(),
        Ok(None) => {
            ApiError::new(StatusCode::NOT_FOUND, "no_tenants", "this gateway has no API keys: no usage to show")
                .into_response()
        }
        Err(_) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", "a known API key is needed").into_response()
        }
    }
}

async fn metrics_route(State(gateway): State<Gateway>) -> Response {
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], gateway.metrics_text()).into_response()
}

async fn healthz(State(gateway): State<Gateway>) -> Response {
    let front = gateway.inner.gate.front();
    let snapshot = front.local().snapshot();
    let closed = gateway.is_closing() || snapshot.closed;
    let status = if closed { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let upstreams: Vec<_> = gateway
        .upstreams()
        .iter()
        .map(|u| {
            let s = u.limiter.local().snapshot();
            serde_json::json!({ "name": &*u.name, "in_service": u.is_healthy(), "running": s.in_flight, "kv_cache_usage": s.kv_usage() })
        })
        .collect();
    let body = serde_json::json!({
        "status": if closed { "closing" } else { "ok" },
        "running": snapshot.in_flight,
        "waiting": snapshot.queued + gateway.inner.gate.dispatcher().waiting(),
        "kv_cache_usage": snapshot.kv_usage(),
        "buffered_bytes": gateway.buffered_bytes(),
        "upstreams": upstreams,
    });
    (status, axum::Json(body)).into_response()
}

/// `POST /admin/reload`: reads the configuration again and applies it, or says why not.
async fn admin_reload(State(gateway): State<Gateway>) -> Response {
    match gateway.reload_from_source().await {
        Ok(()) => {
            eprintln!("kvgate-gateway: configuration reloaded (admin endpoint)");
            axum::Json(serde_json::json!({ "reloaded": true })).into_response()
        }
        Err(e) => {
            eprintln!("kvgate-gateway: reload refused, the old configuration keeps running: {e}");
            let body = serde_json::json!({ "reloaded": false, "error": e.to_string() });
            (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response()
        }
    }
}

/// `GET /admin/usage`: every tenant's usage and budgets.
async fn admin_usage(State(gateway): State<Gateway>) -> Response {
    let tenants: Vec<_> = gateway.inner.budgets.usage().keys().map(|name| usage_json(&gateway, name)).collect();
    axum::Json(serde_json::json!({ "tenants": tenants })).into_response()
}
