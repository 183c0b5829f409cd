//! The gateway: its routes, the reading of a completion request before admission, and the handler
//! behind admission.
//!
//! ```text
//! POST /v1/chat/completions, /v1/completions (other methods: 405 from the router, before anything else)
//!   count_responses   counts the answer by status and tenant name
//!   AdmissionLayer    kvgate::tower, with `read` as its async mapping:
//!     read            the caller's key (401), the body within --max-body-bytes (413) and --body-timeout
//!                     (408), within the --max-buffered-bytes budget (503), parsed by kvgate::openai
//!                     (400/413); keeps only the body to forward; nothing is reserved until it returns
//!     admission       runs now, waits in the queue, or 429/503 + Retry-After (x-ratelimit-* on every
//!                     answer); the permit rides in the response body, counted by OutputTokens
//!   complete          the simulated engine or the upstream proxy
//! GET /v1/models, /metrics, /healthz
//! ```

use crate::config::{BackendConfig, Config, ConfigError};
use crate::conn::{self, ServeOptions};
use crate::error::ApiError;
use crate::metrics;
use crate::proxy::Proxy;
use crate::sim::{SimBackend, SimConfig, SimStats};
use crate::tenants::{KeyError, Keys};
use crate::units;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post_service};
use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kvgate::openai::{CompletionRequest, Endpoint, OutputTokens, Parser, PromptEstimator};
use kvgate::tower::AdmissionLayer;
use kvgate::{Admission, TenantId};
use metrics_exporter_prometheus::PrometheusHandle;
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Where completions are generated.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The built-in simulated engine.
    Simulated(Arc<SimBackend>),
    /// An OpenAI-compatible server (boxed: the client and its pool are large, the enum is cloned).
    Upstream(Box<Proxy>),
}

/// A configured gateway: the admission, the backend, the request reader. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    admission: Admission,
    backend: Backend,
    parser: Parser,
    keys: Keys,
    /// Tenant names by id, for metrics.
    names: HashMap<TenantId, Arc<str>>,
    /// The request-body budget: one permit per byte held.
    buffered: Arc<Semaphore>,
    buffered_limit: usize,
    served_model: String,
    metrics: PrometheusHandle,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("admission", &self.inner.admission)
            .field("backend", &self.inner.backend)
            .finish_non_exhaustive()
    }
}

/// What `read` hands to `complete`: the checked request (its body to forward) and what it holds.
struct Forward {
    completion: CompletionRequest,
    /// The client's `Authorization`, passed upstream only when the gateway has no tenants of its own.
    client_auth: Option<HeaderValue>,
    /// The share of the body budget this request holds until it has been forwarded.
    _budget: OwnedSemaphorePermit,
}

impl Gateway {
    /// A gateway estimating prompts with the [`Heuristic`](kvgate::openai::Heuristic).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] for invalid limits, an unknown model or GPU, conflicting settings or tenants.
    pub fn new(config: Config) -> Result<Self, ConfigError> {
        Self::with_parser(config.clone(), parser(&config))
    }

    /// A gateway estimating prompts with `estimator` (a real tokenizer).
    ///
    /// # Errors
    ///
    /// As [`Gateway::new`].
    pub fn with_estimator(config: Config, estimator: impl PromptEstimator + 'static) -> Result<Self, ConfigError> {
        let parser = parser(&config).estimator(estimator);
        Self::with_parser(config, parser)
    }

    fn with_parser(config: Config, parser: Parser) -> Result<Self, ConfigError> {
        let mut builder = Admission::builder()
            .max_in_flight(config.max_in_flight)
            .queue_capacity(config.queue)
            .max_queue_wait(config.max_queue_wait);
        if let Some((rate, burst)) = config.rate {
            builder = builder.request_rate(rate, burst);
        }
        if let Some((rate, burst)) = config.token_rate {
            builder = builder.token_rate(rate, burst);
        }
        let plan = config.gpu_plan()?;
        match (&plan, config.kv_tokens) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::Conflict(
                    "give either --kv-tokens or --gpu with --model/--model-config, not both".into(),
                ));
            }
            (Some(plan), None) => builder = builder.gpu_plan(plan),
            (None, Some(tokens)) => builder = builder.kv_capacity_tokens(tokens),
            (None, None) if config.model_config.is_some() => {
                return Err(ConfigError::Conflict("--model-config sets a KV-byte budget only with --gpu NAME".into()));
            }
            (None, None) => {}
        }
        if let Some(defaults) = &config.tenant_defaults {
            builder = builder.tenant_defaults(defaults.to_limits());
        }
        for tenant in &config.tenants {
            builder = builder.tenant_limits(tenant.name.as_str(), tenant.limits.to_limits());
        }
        let keys = Keys::new(&config.tenants).map_err(ConfigError::Conflict)?;
        let names =
            config.tenants.iter().map(|t| (TenantId::from(t.name.as_str()), Arc::from(t.name.as_str()))).collect();
        let admission = builder.build()?;
        let backend = match &config.backend {
            BackendConfig::Simulated { tokens_per_sec } => Backend::Simulated(SimBackend::new(SimConfig {
                tokens_per_sec: *tokens_per_sec,
                slowdown_per_seq: 0.02,
                max_seqs: config.max_in_flight,
                kv_budget: admission.snapshot().kv_capacity,
            })),
            BackendConfig::Upstream(url) => Backend::Upstream(Box::new(
                Proxy::new(url, config.upstream_timeout, config.upstream_api_key.as_deref())
                    .map_err(ConfigError::Conflict)?,
            )),
        };
        let served_model = config.model.clone().unwrap_or_else(|| match backend {
            Backend::Simulated(_) => "kvgate-sim".into(),
            Backend::Upstream(_) => String::new(),
        });
        let buffered_limit = config.max_buffered_bytes.min(Semaphore::MAX_PERMITS);
        let inner = Inner {
            buffered: Arc::new(Semaphore::new(buffered_limit)),
            buffered_limit,
            config,
            admission,
            backend,
            parser,
            keys,
            names,
            served_model,
            metrics: metrics::handle(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The admission every completion request goes through.
    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    /// The simulated engine's books (`None` in proxy mode).
    pub fn sim_stats(&self) -> Option<SimStats> {
        match &self.inner.backend {
            Backend::Simulated(sim) => Some(sim.stats()),
            Backend::Upstream(_) => None,
        }
    }

    /// Request-body bytes held now (requests read and waiting, or being forwarded).
    pub fn buffered_bytes(&self) -> usize {
        self.inner.buffered_limit - self.inner.buffered.available_permits()
    }

    /// The Prometheus text of `/metrics` (publishes the gauges first).
    pub fn metrics_text(&self) -> String {
        let inner = &self.inner;
        inner.admission.publish_metrics();
        let tenants: Vec<(Arc<str>, u64)> = inner
            .admission
            .busiest_tenants(10)
            .into_iter()
            .filter_map(|(id, running)| inner.names.get(&id).map(|name| (Arc::clone(name), running)))
            .collect();
        metrics::publish(self.buffered_bytes(), &tenants, self.sim_stats().as_ref());
        inner.metrics.render()
    }

    /// How connections are served.
    pub fn serve_options(&self) -> ServeOptions {
        let config = &self.inner.config;
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
            .layer(middleware::from_fn_with_state(self.clone(), count_responses))
            .layer(
                AdmissionLayer::new_async(self.inner.admission.clone(), move |request| read(reader.clone(), request))
                    .all_rejections_as_429(self.inner.config.all_429)
                    .count_with(OutputTokens::new()),
            )
            .service_fn(move |request| complete(handler.clone(), request));
        Router::new()
            .route("/v1/chat/completions", post_service(completions.clone()))
            .route("/v1/completions", post_service(completions))
            .route("/v1/models", get(models))
            .route("/metrics", get(metrics_route))
            .route("/healthz", get(healthz))
            .with_state(self.clone())
    }
}

fn parser(config: &Config) -> Parser {
    Parser::new().default_max_tokens(config.default_max_tokens).max_output_tokens(config.max_output_tokens)
}

/// Serves the gateway on `listener` until the task is dropped (tests and embedders).
///
/// # Errors
///
/// I/O errors of the listener.
pub async fn serve(listener: tokio::net::TcpListener, gateway: Gateway) -> std::io::Result<()> {
    serve_until(listener, gateway, std::future::pending()).await
}

/// Serves the gateway until `shutdown` resolves; then closes the admission (waiting requests get 503
/// `closed`, `/healthz` says `closing`), keeps answering while running requests finish — for at most
/// `--shutdown-grace` — and stops.
///
/// # Errors
///
/// I/O errors of the listener.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    gateway: Gateway,
    shutdown: impl Future<Output = ()> + Send,
) -> std::io::Result<()> {
    let options = gateway.serve_options();
    let admission = gateway.admission().clone();
    let drained = async move {
        shutdown.await;
        admission.close();
        let deadline = tokio::time::Instant::now() + options.shutdown_grace;
        while admission.snapshot().in_flight > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    conn::serve(listener, gateway.router(), options, drained).await
}

/// The body budget for a request that declares `declared` bytes (or the largest allowed).
fn reserve(inner: &Inner, declared: Option<usize>) -> Result<OwnedSemaphorePermit, ApiError> {
    let bytes = declared.unwrap_or(inner.config.max_body_bytes).max(1);
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

/// The [`AdmissionLayer`]'s mapping: reads and checks a completion request before anything is reserved.
async fn read(
    gateway: Gateway,
    request: http::Request<Body>,
) -> Result<(kvgate::Request, http::Request<Forward>), http::Response<Bytes>> {
    let inner = &gateway.inner;
    let refuse = |error: ApiError| {
        metrics::invalid(error.code);
        let mut response = error.to_response();
        if error.status == StatusCode::SERVICE_UNAVAILABLE {
            kvgate::http::insert_retry_after(response.headers_mut(), inner.admission.capacity_retry_after());
        }
        response
    };
    let endpoint = Endpoint::from_path(request.uri().path()).unwrap_or(Endpoint::Chat);
    let caller = match inner.keys.caller(request.headers()) {
        Ok(caller) => caller.cloned(),
        Err(KeyError::Missing) => {
            let message = "this gateway needs an API key: Authorization: Bearer <key>";
            return Err(refuse(ApiError::new(StatusCode::UNAUTHORIZED, "missing_api_key", message)));
        }
        Err(KeyError::Unknown) => {
            let message = "the API key is not known to this gateway";
            return Err(refuse(ApiError::new(StatusCode::UNAUTHORIZED, "invalid_api_key", message)));
        }
    };
    let max = inner.config.max_body_bytes;
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
    let mut budget = match reserve(inner, declared) {
        Ok(budget) => budget,
        Err(error) => {
            // Read the body to its end without keeping it (within the body deadline), so that the client is
            // not cut off while it writes and sees the 503 and its Retry-After.
            let body = Limited::new(request.into_body(), max);
            let _ = tokio::time::timeout(inner.config.body_timeout, discard(body)).await;
            return Err(refuse(error));
        }
    };
    let (parts, body) = request.into_parts();
    let read = tokio::time::timeout(inner.config.body_timeout, Limited::new(body, max).collect()).await;
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => return Err(refuse(too_large())),
        Ok(Err(e)) => {
            let message = format!("could not read the request body: {e}");
            return Err(refuse(ApiError::new(StatusCode::BAD_REQUEST, "unreadable_body", message).closing()));
        }
        Err(_) => {
            let message =
                format!("the request body did not arrive within {}", units::human_duration(inner.config.body_timeout));
            return Err(refuse(ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", message).closing()));
        }
    };
    let completion = inner.parser.parse(endpoint, bytes).map_err(|e| {
        metrics::invalid(e.code());
        e.to_response()
    })?;
    // Hold what is kept (the body to forward), not what was declared.
    let held = completion.held_bytes().max(1);
    let reserved = budget.num_permits();
    if held < reserved {
        drop(budget.split(reserved - held));
    } else if let Ok(more) =
        Arc::clone(&inner.buffered).try_acquire_many_owned(u32::try_from(held - reserved).unwrap_or(u32::MAX))
    {
        budget.merge(more);
    }
    let mut admit = completion.request();
    if let Some(caller) = &caller {
        admit = admit.tenant(caller.id).priority(caller.priority);
    }
    let client_auth =
        if inner.keys.required() { None } else { parts.headers.get(http::header::AUTHORIZATION).cloned() };
    let forward = Forward { completion, client_auth, _budget: budget };
    Ok((admit, http::Request::from_parts(parts, forward)))
}

/// The handler behind admission: generate (simulated) or forward (proxy).
async fn complete(gateway: Gateway, request: http::Request<Forward>) -> Result<Response, Infallible> {
    let inner = &gateway.inner;
    let (parts, forward) = request.into_parts();
    let admitted = parts.extensions.get::<kvgate::Request>().copied().expect("the admission layer inserts it");
    let response = match &inner.backend {
        Backend::Simulated(sim) => {
            let kv = inner.admission.kv_cost(&admitted);
            sim.complete(&forward.completion, kv, &inner.served_model).await
        }
        Backend::Upstream(proxy) => {
            let path = forward.completion.endpoint.path();
            let body = forward.completion.forward_body().clone();
            proxy.complete(path, body, forward.client_auth.as_ref()).await
        }
    };
    Ok(response.into_response())
}

/// Counts each answer to a completion request by status and tenant name.
async fn count_responses(State(gateway): State<Gateway>, request: axum::extract::Request, next: Next) -> Response {
    let tenant = gateway.inner.keys.caller(request.headers()).ok().flatten().map(|c| Arc::clone(&c.name));
    let response = next.run(request).await;
    metrics::response(response.status().as_u16(), tenant.as_deref());
    response
}

async fn models(State(gateway): State<Gateway>, headers: http::HeaderMap) -> Response {
    let inner = &gateway.inner;
    match &inner.backend {
        Backend::Upstream(proxy) => {
            let client_auth = if inner.keys.required() { None } else { headers.get(http::header::AUTHORIZATION) };
            proxy.models(client_auth).await.into_response()
        }
        Backend::Simulated(_) => crate::sim::json_response(&serde_json::json!({
            "object": "list",
            "data": [{ "id": inner.served_model, "object": "model", "created": 0, "owned_by": "kvgate" }],
        }))
        .into_response(),
    }
}

async fn metrics_route(State(gateway): State<Gateway>) -> Response {
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], gateway.metrics_text()).into_response()
}

async fn healthz(State(gateway): State<Gateway>) -> Response {
    let snapshot = gateway.inner.admission.snapshot();
    let status = if snapshot.closed { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    let body = serde_json::json!({
        "status": if snapshot.closed { "closing" } else { "ok" },
        "running": snapshot.in_flight,
        "waiting": snapshot.queued,
        "kv_cache_usage": snapshot.kv_usage(),
        "buffered_bytes": gateway.buffered_bytes(),
    });
    (status, axum::Json(body)).into_response()
}
