//! The axum application: routes, the body-reading middleware, the admission layer, and the handlers.

use super::config::{BackendConfig, Config};
use super::metrics::Metrics;
use super::openai::{self, ApiError, Completion, Endpoint, OutputTokens};
use super::proxy::Proxy;
use super::sim::{self, SimBackend, SimConfig, SimStats};
use super::tokens::{Heuristic, TokenCounter};
use axum::Router;
use axum::body::Body;
use axum::extract::{Extension, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use kvgate::Admission;
use kvgate::tower::{AdmissionLayer, Refusal};
use std::sync::Arc;

/// Where completions are generated.
#[derive(Debug, Clone)]
pub enum Backend {
    Simulated(Arc<SimBackend>),
    Upstream(Proxy),
}

/// A configured gateway: the admission, the backend, the counters. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    admission: Admission,
    backend: Backend,
    metrics: Metrics,
    counter: Box<dyn TokenCounter>,
    served_model: String,
    kv_unit: &'static str,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("admission", &self.inner.admission)
            .field("backend", &self.inner.backend)
            .finish_non_exhaustive()
    }
}

impl Gateway {
    /// A gateway with the default prompt-token estimate ([`Heuristic`]).
    ///
    /// # Errors
    ///
    /// A message for an invalid limit, an unknown model or GPU, or conflicting flags.
    pub fn new(config: Config) -> Result<Self, String> {
        Self::with_counter(config, Box::new(Heuristic))
    }

    /// A gateway estimating prompt tokens with `counter`.
    ///
    /// # Errors
    ///
    /// As [`Gateway::new`].
    pub fn with_counter(config: Config, counter: Box<dyn TokenCounter>) -> Result<Self, String> {
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
        let kv_unit = match (&plan, config.kv_tokens) {
            (Some(_), Some(_)) => return Err("give either --kv-tokens or --gpu with --model/--config, not both".into()),
            (Some(plan), None) => {
                builder = builder.gpu_plan(plan);
                "bytes"
            }
            (None, Some(tokens)) => {
                builder = builder.kv_capacity_tokens(tokens);
                "tokens"
            }
            (None, None) if config.model.is_some() || config.config_path.is_some() => {
                return Err("--model/--config set a KV-byte budget only with --gpu NAME".into());
            }
            (None, None) => "tokens",
        };
        let admission = builder.build().map_err(|e| e.to_string())?;
        let backend = match &config.backend {
            BackendConfig::Simulated { tokens_per_sec } => Backend::Simulated(SimBackend::new(SimConfig {
                tokens_per_sec: *tokens_per_sec,
                slowdown_per_seq: 0.02,
                max_seqs: config.max_in_flight,
                kv_budget: admission.snapshot().kv_capacity,
            })),
            BackendConfig::Upstream(url) => Backend::Upstream(Proxy::new(url, config.upstream_timeout)?),
        };
        let served_model = config.model.clone().unwrap_or_else(|| match backend {
            Backend::Simulated(_) => "kvgate-sim".into(),
            Backend::Upstream(_) => String::new(),
        });
        let inner = Inner { config, admission, backend, metrics: Metrics::default(), counter, served_model, kv_unit };
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

    /// The simulated backend's books (`None` in proxy mode).
    pub fn sim_stats(&self) -> Option<SimStats> {
        match &self.inner.backend {
            Backend::Simulated(sim) => Some(sim.stats()),
            Backend::Upstream(_) => None,
        }
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics_text(&self) -> String {
        let sim = self.sim_stats();
        self.inner.metrics.render(&self.inner.admission.snapshot(), self.inner.kv_unit, sim.as_ref())
    }

    /// The axum application.
    pub fn router(&self) -> Router {
        let admit = AdmissionLayer::new(self.inner.admission.clone(), admission_request)
            .all_rejections_as_429(self.inner.config.all_429)
            .count_with(OutputTokens);
        let completions = Router::new()
            .route("/v1/chat/completions", post(complete))
            .route("/v1/completions", post(complete))
            // Layers wrap what is above them: `read_completion` runs first, then admission, then `complete`.
            .layer(admit)
            .layer(middleware::from_fn_with_state(self.clone(), read_completion));
        Router::new()
            .route("/v1/models", get(models))
            .route("/metrics", get(metrics))
            .route("/healthz", get(healthz))
            .merge(completions)
            .with_state(self.clone())
    }
}

/// Serves the gateway on `listener` until the task is dropped or the listener fails.
///
/// # Errors
///
/// I/O errors of the listener.
pub async fn serve(listener: tokio::net::TcpListener, gateway: Gateway) -> std::io::Result<()> {
    axum::serve(listener, gateway.router()).await
}

/// The [`AdmissionLayer`]'s mapping function: the request to admit, from the [`Completion`] that
/// [`read_completion`] put into the extensions.
fn admission_request(request: &http::Request<Body>) -> Result<kvgate::Request, Refusal> {
    match request.extensions().get::<Arc<Completion>>() {
        Some(completion) => Ok(kvgate::Request::new(completion.prompt_tokens, completion.max_tokens)),
        None => Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: "request was not read".into(),
            code: "internal",
        }
        .to_response()
        .into()),
    }
}

/// Buffers and checks a completion request before admission; answers 400/413 itself. Also gives a
/// `Retry-After` to admission's 503s that lack one (a queue-wait timeout carries no hint).
async fn read_completion(State(gateway): State<Gateway>, request: Request, next: Next) -> Response {
    let inner = &gateway.inner;
    let Some(endpoint) = Endpoint::from_path(request.uri().path()) else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let bytes = match Limited::new(body, inner.config.max_body_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            inner.metrics.count_invalid("body_too_large");
            let message = format!("the request body exceeds {} bytes", inner.config.max_body_bytes);
            // The rest of the body is left unread: the connection cannot carry another request.
            let mut response = ApiError::too_large("body_too_large", message).into_response();
            response.headers_mut().insert(http::header::CONNECTION, HeaderValue::from_static("close"));
            return response;
        }
        Err(e) => {
            return ApiError::bad_request("unreadable_body", format!("could not read the request body: {e}"))
                .into_response();
        }
    };
    let completion = match openai::parse(endpoint, bytes, inner.counter.as_ref(), inner.config.default_max_tokens) {
        Ok(completion) => completion,
        Err(err) => {
            inner.metrics.count_invalid(err.code);
            return err.into_response();
        }
    };
    let mut request = Request::from_parts(parts, Body::empty());
    request.extensions_mut().insert(Arc::new(completion));
    let mut response = next.run(request).await;
    let status = response.status();
    if (status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS)
        && !response.headers().contains_key(http::header::RETRY_AFTER)
    {
        // Rejection::TimedOut has no hint; the mean permit hold time is when capacity typically frees up.
        let mean_hold = inner.admission.snapshot().mean_hold;
        let secs = mean_hold.as_secs() + u64::from(mean_hold.subsec_nanos() > 0);
        response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(secs.max(1)));
    }
    response
}

/// The handler behind admission: generate (simulated) or forward (proxy).
async fn complete(
    State(gateway): State<Gateway>,
    Extension(completion): Extension<Arc<Completion>>,
    Extension(admitted): Extension<kvgate::Request>,
    headers: HeaderMap,
) -> Response {
    let inner = &gateway.inner;
    inner.metrics.observe_queue_time(completion.arrived.elapsed());
    match &inner.backend {
        Backend::Simulated(sim) => {
            let kv = inner.admission.kv_cost(&admitted);
            sim.complete(&completion, kv, &inner.served_model).await
        }
        Backend::Upstream(proxy) => proxy.complete(&completion, &headers).await,
    }
}

async fn models(State(gateway): State<Gateway>, headers: HeaderMap) -> Response {
    match &gateway.inner.backend {
        Backend::Upstream(proxy) => proxy.models(&headers).await,
        Backend::Simulated(_) => sim::json_response(&serde_json::json!({
            "object": "list",
            "data": [{ "id": gateway.inner.served_model, "object": "model", "created": 0, "owned_by": "kvgate" }],
        })),
    }
}

async fn metrics(State(gateway): State<Gateway>) -> Response {
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
    });
    (status, axum::Json(body)).into_response()
}
