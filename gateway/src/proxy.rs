//! Proxy mode: forwards admitted requests to an OpenAI-compatible server (vLLM, llama.cpp's
//! `llama-server`, Ollama, TGI, ...) over plain http, and passes its answer on: an SSE stream event by
//! event, anything else (a whole JSON completion, an error) read whole and checked to be JSON.
//!
//! A broken upstream never holds a permit for longer than `--upstream-timeout` at a time:
//!
//! | upstream | client gets |
//! |---|---|
//! | no response headers within the timeout (hung) | 504 `upstream_timeout` |
//! | refuses, resets or closes the connection; answers something that is not HTTP | 502 `upstream_unreachable` |
//! | a non-SSE body that is not JSON (an HTML error page), or that breaks off | 502 `upstream_bad_response` |
//! | a non-SSE body that stalls for the timeout | 504 `upstream_timeout` |
//! | an SSE stream that breaks off / stalls for the timeout | the whole events so far, then one SSE error event (`upstream_stream_error` / `upstream_timeout`), then the end of the stream |
//!
//! | a `429` or `503` (busy, loading a model), with or without `Retry-After` / `retry-after-ms` | the same status and hints; a body that is not JSON becomes an OpenAI-style `upstream_busy` error |
//!
//! Errors are OpenAI-shaped (`type: upstream_error`) and never name the upstream: its address (which may
//! carry credentials) goes only to the gateway's log, with any `user:password@` removed. The response
//! ends in every case, so the permit-holding body returns the permit.
//!
//! The upstream response body becomes the client's response body (inside the permit-holding body), so
//! when the client goes away hyper drops it, which drops the upstream response and closes the upstream
//! connection: vLLM and llama-server abort a generation whose client disconnected.

use crate::error::ApiError;
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyDataStream, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kvgate::openai::Endpoint;
use std::convert::Infallible;
use std::time::Duration;

/// The upstream client: hyper's, over plain TCP (no TLS, no system proxy: the engine is on the same host
/// or network), with a connection pool.
type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// The upstream server.
#[derive(Clone)]
pub struct Proxy {
    client: HttpClient,
    /// For health checks and the engine's `/metrics`: a connection each, never pooled, so that a probe
    /// never shares a connection with requests.
    probe: HttpClient,
    /// Base URL ending in `/v1`.
    base: String,
    /// The upstream's chat, completions and models URLs, parsed once (a clone shares their text).
    uris: Uris,
    /// `http://host:port`, for the health path and the engine's `/metrics`.
    origin: String,
    /// The base URL without credentials, for logs.
    shown: String,
    /// Longest wait for the response headers, and then between two body chunks.
    timeout: Duration,
    /// `Authorization` sent upstream instead of the client's.
    api_key: Option<http::HeaderValue>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").field("upstream", &self.shown).field("timeout", &self.timeout).finish_non_exhaustive()
    }
}

/// The URLs requests go to.
#[derive(Clone)]
struct Uris {
    chat: http::Uri,
    completions: http::Uri,
    models: http::Uri,
}

impl Uris {
    fn under(base: &str) -> Result<Self, http::uri::InvalidUri> {
        let uri = |path: &str| format!("{base}{path}").parse::<http::Uri>();
        Ok(Self {
            chat: uri(Endpoint::Chat.path())?,
            completions: uri(Endpoint::Completions.path())?,
            models: uri("/models")?,
        })
    }

    fn of(&self, endpoint: Endpoint) -> &http::Uri {
        match endpoint {
            Endpoint::Chat => &self.chat,
            Endpoint::Completions => &self.completions,
        }
    }
}

/// Response headers passed through from upstream (hop-by-hop ones are left to hyper).
const PASSED_HEADERS: [http::HeaderName; 4] = [
    http::header::CONTENT_TYPE,
    http::header::CACHE_CONTROL,
    http::header::RETRY_AFTER,
    http::HeaderName::from_static(kvgate::http::RETRY_AFTER_MS),
];

/// `url` with any `user:password@` replaced by `***@`, for logs and messages.
///
/// # Examples
///
/// ```
/// assert_eq!(kvgate_gateway::proxy::redact("http://me:secret@engine:8000/v1"), "http://***@engine:8000/v1");
/// assert_eq!(kvgate_gateway::proxy::redact("http://engine:8000"), "http://engine:8000");
/// ```
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// Largest non-streamed upstream body the proxy buffers (to check that it is JSON).
const MAX_BUFFERED_BODY: usize = 16 << 20;

/// Longest partial SSE event held back while waiting for its end (a longer one is passed on as it is).
const MAX_PARTIAL_EVENT: usize = 1 << 20;

impl Proxy {
    /// A proxy to `url` (`http://host:port` or `http://host:port/v1`) that gives up on a response whose
    /// headers, or next body chunk, take longer than `timeout`.
    ///
    /// # Errors
    ///
    /// A message if the URL is not a valid `http://` URL or the API key not a valid header value.
    pub fn new(url: &str, timeout: Duration, api_key: Option<&str>) -> Result<Self, String> {
        let url = url.trim_end_matches('/');
        let base = if url.ends_with("/v1") { url.to_owned() } else { format!("{url}/v1") };
        match base.parse::<http::Uri>() {
            Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
            _ => return Err(format!("--upstream {}: not a valid http:// URL", redact(&base))),
        }
        let (origin, uris) = match (base.parse::<http::Uri>(), Uris::under(&base)) {
            (Ok(uri), Ok(uris)) => (format!("http://{}", uri.authority().map_or("", |a| a.as_str())), uris),
            _ => return Err(format!("--upstream {}: not a valid http:// URL", redact(&base))),
        };
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout.min(Duration::from_secs(5))));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector.clone());
        let probe = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(connector);
        let api_key = api_key
            .map(|key| http::HeaderValue::from_str(&format!("Bearer {key}")))
            .transpose()
            .map_err(|_| "--upstream-api-key: not a valid header value".to_owned())?;
        Ok(Self { client, probe, shown: redact(&base), base, uris, origin, timeout, api_key })
    }

    /// The base URL without credentials (ending in `/v1`).
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Forwards a completion request's body (every generation limit already set to the reservation) to
    /// `endpoint` upstream. `client_auth` is the client's `Authorization`, passed on only without an
    /// `--upstream-api-key`. `headers` go along (the request id and trace context).
    pub async fn complete(
        &self,
        endpoint: Endpoint,
        body: bytes::Bytes,
        client_auth: Option<&http::HeaderValue>,
        headers: impl IntoIterator<Item = (http::HeaderName, http::HeaderValue)>,
    ) -> http::Response<Body> {
        let mut request = self.request(http::Method::POST, self.uris.of(endpoint), client_auth, Full::new(body));
        let sent = request.headers_mut();
        sent.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (name, value) in headers {
            sent.append(name, value);
        }
        self.pass_through(request).await
    }

    /// Whether the server answers its health path (`path` on its origin; `None`: `/models` under the
    /// base URL) with a 2xx within `timeout`.
    pub async fn healthy(&self, path: Option<&str>, timeout: Duration) -> bool {
        let uri = match path {
            Some(path) => format!("{}{path}", self.origin),
            None => format!("{}/models", self.base),
        };
        let mut request = http::Request::builder().method(http::Method::GET).uri(uri);
        if let Some(key) = &self.api_key {
            request = request.header(http::header::AUTHORIZATION, key);
        }
        let Ok(request) = request.body(Full::default()) else { return false };
        let answer = async {
            let response = self.probe.request(request).await.ok()?;
            let ok = response.status().is_success();
            // Read the (small) body so that the connection goes back to the pool.
            let _ = http_body_util::BodyExt::collect(http_body_util::Limited::new(response.into_body(), 1 << 20)).await;
            Some(ok)
        };
        matches!(tokio::time::timeout(timeout, answer).await, Ok(Some(true)))
    }

    /// The engine's Prometheus text (`GET /metrics` on its origin), at most 4 MiB, within `timeout`.
    ///
    /// # Errors
    ///
    /// A message (without the server's address) when it does not answer 200 in time.
    pub async fn engine_metrics(&self, timeout: Duration) -> Result<String, String> {
        let request = http::Request::builder()
            .uri(format!("{}/metrics", self.origin))
            .body(Full::default())
            .map_err(|e| e.to_string())?;
        let answer = async {
            let response = self.probe.request(request).await.map_err(|e| ErrorChain(&e).to_string())?;
            if !response.status().is_success() {
                return Err(format!("/metrics answered {}", response.status()));
            }
            let body = http_body_util::BodyExt::collect(http_body_util::Limited::new(response.into_body(), 4 << 20))
                .await
                .map_err(|e| e.to_string())?;
            String::from_utf8(body.to_bytes().to_vec()).map_err(|_| "/metrics is not UTF-8".to_owned())
        };
        tokio::time::timeout(timeout, answer).await.map_err(|_| format!("/metrics took over {timeout:?}"))?
    }

    /// `GET /v1/models` upstream.
    pub async fn models(&self, client_auth: Option<&http::HeaderValue>) -> http::Response<Body> {
        self.pass_through(self.request(http::Method::GET, &self.uris.models, client_auth, Full::default())).await
    }

    /// A request to `uri` (under the base URL), with the upstream key (or the client's).
    fn request(
        &self,
        method: http::Method,
        uri: &http::Uri,
        client_auth: Option<&http::HeaderValue>,
        body: Full<Bytes>,
    ) -> http::Request<Full<Bytes>> {
        let mut request = http::Request::new(body);
        *request.method_mut() = method;
        *request.uri_mut() = uri.clone();
        if let Some(auth) = self.api_key.as_ref().or(client_auth) {
            request.headers_mut().insert(http::header::AUTHORIZATION, auth.clone());
        }
        request
    }

    /// Logs what went wrong with the upstream (its address without credentials, the error without its
    /// URL) and returns the error the client gets, which names neither.
    fn fail(
        &self,
        status: StatusCode,
        code: &'static str,
        client_message: &str,
        detail: &dyn std::fmt::Display,
    ) -> ApiError {
        eprintln!("kvgate-gateway: upstream {}: {code}: {detail}", self.shown);
        crate::metrics::upstream_error(code);
        ApiError::new(status, code, client_message)
    }

    /// Sends the request and passes the answer on: an SSE stream event by event, anything else buffered
    /// and checked to be JSON. A hung, reset or garbled upstream becomes a 504 or 502 with an OpenAI-style
    /// error; a stream that breaks or stalls after it started ends with an SSE error event.
    async fn pass_through(&self, request: http::Request<Full<Bytes>>) -> http::Response<Body> {
        let response = match tokio::time::timeout(self.timeout, self.client.request(request)).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                let status = if is_timeout(&e) { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
                let detail: &dyn std::fmt::Display = &ErrorChain(&e);
                return self
                    .fail(status, "upstream_unreachable", "the inference server could not be reached", detail)
                    .into_response_body();
            }
            Err(_) => {
                let message = format!("the inference server sent no response within {:?}", self.timeout);
                return self
                    .fail(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", &message, &"no response headers")
                    .into_response_body();
            }
        };
        let status = response.status();
        let mut passed = http::HeaderMap::with_capacity(PASSED_HEADERS.len());
        for name in PASSED_HEADERS {
            if let Some(value) = response.headers().get(&name) {
                passed.insert(name, value.clone());
            }
        }

        let is_sse = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if is_sse && status.is_success() {
            let events = sse_events(BodyDataStream::new(response.into_body()), self.timeout, self.shown.clone());
            return answer(status, passed, Body::from_stream(events));
        }
        let body = match self.read_body(response).await {
            Ok(body) => body,
            Err(e) => return e.into_response_body(),
        };
        if kvgate::openai::is_json(&body) {
            return answer(status, passed, Body::from(body));
        }
        let detail = format!("HTTP {} with a body that is not JSON ({} bytes)", status.as_u16(), body.len());
        if status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE {
            // The engine is busy (or loading its model): its status and its hints go to the client, so the
            // client retries when the engine said, not at once.
            let message = "the inference server is busy; retry after the time in Retry-After";
            let error = self.fail(status, "upstream_busy", message, &detail).to_response();
            let mut response = error.map(Body::from);
            for name in ["retry-after", kvgate::http::RETRY_AFTER_MS] {
                if let Some(value) = passed.get(name) {
                    response.headers_mut().insert(name, value.clone());
                }
            }
            return response;
        }
        let message = "the inference server answered with something that is not an OpenAI-compatible response";
        self.fail(StatusCode::BAD_GATEWAY, "upstream_bad_response", message, &detail).into_response_body()
    }

    /// The whole body, each chunk within the timeout, at most [`MAX_BUFFERED_BODY`] bytes.
    async fn read_body(&self, response: http::Response<hyper::body::Incoming>) -> Result<Bytes, ApiError> {
        let mut chunks = BodyDataStream::new(response.into_body());
        let mut body = BytesMut::new();
        loop {
            match tokio::time::timeout(self.timeout, chunks.next()).await {
                Ok(None) => return Ok(body.freeze()),
                Ok(Some(Ok(chunk))) if body.len() + chunk.len() <= MAX_BUFFERED_BODY => body.extend_from_slice(&chunk),
                Ok(Some(Ok(_))) => {
                    let message = "the inference server's answer is too large";
                    let detail = format!("more than {MAX_BUFFERED_BODY} bytes");
                    return Err(self.fail(StatusCode::BAD_GATEWAY, "upstream_bad_response", message, &detail));
                }
                Ok(Some(Err(e))) => {
                    let message = "the inference server broke off its answer";
                    return Err(self.fail(StatusCode::BAD_GATEWAY, "upstream_bad_response", message, &e));
                }
                Err(_) => {
                    let message = format!("the inference server stalled mid-answer for {:?}", self.timeout);
                    return Err(self.fail(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", &message, &"stalled"));
                }
            }
        }
    }
}

/// The upstream's answer as the client gets it: its status, the headers passed on, `body`.
fn answer(status: StatusCode, headers: http::HeaderMap, body: Body) -> http::Response<Body> {
    let mut answer = http::Response::new(body);
    *answer.status_mut() = status;
    *answer.headers_mut() = headers;
    answer
}

impl ApiError {
    fn into_response_body(self) -> http::Response<Body> {
        self.to_response().map(Body::from)
    }
}

/// Passes an upstream SSE stream on whole events at a time (a partial event is held until its blank
/// line arrives), so that when the upstream breaks off or stalls for `timeout`, the client's stream can
/// end cleanly with one OpenAI-style error event instead of half an event.
fn sse_events(
    upstream: impl Stream<Item = Result<Bytes, hyper::Error>> + Send + 'static,
    timeout: Duration,
    shown: String,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    struct State<S> {
        upstream: std::pin::Pin<Box<S>>,
        partial: BytesMut,
        done: bool,
    }
    let state = State { upstream: Box::pin(upstream), partial: BytesMut::new(), done: false };
    futures::stream::unfold(state, move |mut state| {
        let shown = shown.clone();
        async move {
            if state.done {
                return None;
            }
            loop {
                let (code, message) = match tokio::time::timeout(timeout, state.upstream.next()).await {
                    Ok(Some(Ok(chunk))) => {
                        state.partial.extend_from_slice(&chunk);
                        let cut = match events_end(&state.partial) {
                            _ if state.partial.len() > MAX_PARTIAL_EVENT => state.partial.len(),
                            Some(end) => end,
                            None => continue,
                        };
                        return Some((Ok(state.partial.split_to(cut).freeze()), state));
                    }
                    Ok(None) => {
                        state.done = true;
                        let rest = state.partial.split().freeze();
                        return (!rest.is_empty()).then_some((Ok(rest), state));
                    }
                    Ok(Some(Err(e))) => {
                        eprintln!("kvgate-gateway: upstream {shown}: stream broken: {}", ErrorChain(&e));
                        ("upstream_stream_error", "the inference server broke off the stream".to_owned())
                    }
                    Err(_) => {
                        eprintln!("kvgate-gateway: upstream {shown}: stream stalled for {timeout:?}");
                        ("upstream_timeout", format!("the inference server stalled mid-stream for {timeout:?}"))
                    }
                };
                state.done = true;
                let error = serde_json::json!({
                    "error": { "message": message, "type": "upstream_error", "param": null, "code": code }
                });
                return Some((Ok(crate::sim::sse(&error)), state));
            }
        }
    })
}

/// The length of the complete events at the start of `buf`: up to and including the last blank line
/// (`\n\n` or `\r\n\r\n`), if any.
fn events_end(buf: &[u8]) -> Option<usize> {
    (1..buf.len())
        .rev()
        .find(|&i| buf[i] == b'\n' && (buf[i - 1] == b'\n' || (i >= 3 && buf[i - 1] == b'\r' && buf[i - 2] == b'\n')))
        .map(|i| i + 1)
}

/// Whether a client error is a timeout (connecting, or below).
fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut) {
            return true;
        }
        source = e.source();
    }
    false
}

/// An error with its sources, `: `-separated, for logs (hyper's errors say little on their own).
struct ErrorChain<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(e) = source {
            write!(f, ": {e}")?;
            source = e.source();
        }
        Ok(())
    }
}
