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
//! Errors are OpenAI-shaped (`type: upstream_error`). The response ends in every case, so the
//! permit-holding body returns the permit.
//!
//! The upstream response body becomes the client's response body (inside the permit-holding body), so
//! when the client goes away hyper drops it, which drops reqwest's response and closes the upstream
//! connection: vLLM and llama-server abort a generation whose client disconnected.

use super::openai::{ApiError, Completion};
use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use http::{HeaderMap, StatusCode};
use std::convert::Infallible;
use std::time::Duration;

/// The upstream server.
#[derive(Debug, Clone)]
pub struct Proxy {
    client: reqwest::Client,
    /// Base URL ending in `/v1`.
    base: String,
    /// Longest wait for the response headers, and then between two body chunks.
    timeout: Duration,
}

/// Response headers passed through from upstream (hop-by-hop ones are left to hyper).
const PASSED_HEADERS: &[http::HeaderName] =
    &[http::header::CONTENT_TYPE, http::header::CACHE_CONTROL, http::header::RETRY_AFTER];

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
    /// A message if the HTTP client cannot be built.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let url = url.trim_end_matches('/');
        let base = if url.ends_with("/v1") { url.to_owned() } else { format!("{url}/v1") };
        // No system proxy: the upstream is normally on the same host or network.
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { client, base, timeout })
    }

    /// The base URL (ending in `/v1`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Forwards a completion request; `max_tokens` is added when the client left it to the default, so
    /// the upstream never generates more than admission reserved.
    pub async fn complete(&self, request: &Completion, headers: &HeaderMap) -> http::Response<Body> {
        let url = format!("{}{}", self.base, request.endpoint.path());
        let mut upstream =
            self.client.post(url).header(http::header::CONTENT_TYPE, "application/json").body(request.upstream_body());
        if let Some(auth) = headers.get(http::header::AUTHORIZATION) {
            upstream = upstream.header(http::header::AUTHORIZATION, auth);
        }
        self.pass_through(upstream).await
    }

    /// `GET /v1/models` upstream.
    pub async fn models(&self, headers: &HeaderMap) -> http::Response<Body> {
        let mut upstream = self.client.get(format!("{}/models", self.base));
        if let Some(auth) = headers.get(http::header::AUTHORIZATION) {
            upstream = upstream.header(http::header::AUTHORIZATION, auth);
        }
        self.pass_through(upstream).await
    }

    /// Sends the request and passes the answer on: an SSE stream event by event, anything else buffered
    /// and checked to be JSON. A hung, reset or garbled upstream becomes a 504 or 502 with an OpenAI-style
    /// error; a stream that breaks or stalls after it started ends with an SSE error event.
    async fn pass_through(&self, upstream: reqwest::RequestBuilder) -> http::Response<Body> {
        let response = match tokio::time::timeout(self.timeout, upstream.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                let status = if e.is_timeout() { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
                return self.error(status, "upstream_unreachable", format!("upstream {} unreachable: {e}", self.base));
            }
            Err(_) => {
                let message = format!("upstream {} sent no response within {:?}", self.base, self.timeout);
                return self.error(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", message);
            }
        };
        let status = response.status();
        let mut builder = http::Response::builder().status(status.as_u16());
        for name in PASSED_HEADERS {
            if let Some(value) = response.headers().get(name) {
                builder = builder.header(name, value.as_bytes());
            }
        }
        let is_sse = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if is_sse && status.is_success() {
            let events = sse_events(response.bytes_stream(), self.timeout, self.base.clone());
            return builder.body(Body::from_stream(events)).expect("a valid response");
        }
        let body = match self.read_body(response).await {
            Ok(body) => body,
            Err(e) => return e.to_response().map(Body::from),
        };
        if serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_err() {
            let message = format!(
                "upstream {} answered HTTP {} with a body that is not JSON ({} bytes)",
                self.base,
                status.as_u16(),
                body.len()
            );
            return self.error(StatusCode::BAD_GATEWAY, "upstream_bad_response", message);
        }
        builder.body(Body::from(body)).expect("a valid response")
    }

    /// The whole body, each chunk within the timeout, at most [`MAX_BUFFERED_BODY`] bytes.
    async fn read_body(&self, response: reqwest::Response) -> Result<Bytes, ApiError> {
        let mut chunks = response.bytes_stream();
        let mut body = BytesMut::new();
        loop {
            match tokio::time::timeout(self.timeout, chunks.next()).await {
                Ok(None) => return Ok(body.freeze()),
                Ok(Some(Ok(chunk))) if body.len() + chunk.len() <= MAX_BUFFERED_BODY => body.extend_from_slice(&chunk),
                Ok(Some(Ok(_))) => {
                    let message = format!("upstream {} answered with more than {MAX_BUFFERED_BODY} bytes", self.base);
                    return Err(api_error(StatusCode::BAD_GATEWAY, "upstream_bad_response", message));
                }
                Ok(Some(Err(e))) => {
                    let message = format!("upstream {} broke off its answer: {e}", self.base);
                    return Err(api_error(StatusCode::BAD_GATEWAY, "upstream_bad_response", message));
                }
                Err(_) => {
                    let message = format!("upstream {} stalled mid-answer for {:?}", self.base, self.timeout);
                    return Err(api_error(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", message));
                }
            }
        }
    }

    fn error(&self, status: StatusCode, code: &'static str, message: String) -> http::Response<Body> {
        api_error(status, code, message).to_response().map(Body::from)
    }
}

fn api_error(status: StatusCode, code: &'static str, message: String) -> ApiError {
    ApiError { status, message, code }
}

/// Passes an upstream SSE stream on whole events at a time (a partial event is held until its blank
/// line arrives), so that when the upstream breaks off or stalls for `timeout`, the client's stream can
/// end cleanly with one OpenAI-style error event instead of half an event.
fn sse_events(
    upstream: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    timeout: Duration,
    base: String,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    struct State<S> {
        upstream: std::pin::Pin<Box<S>>,
        partial: BytesMut,
        done: bool,
    }
    let state = State { upstream: Box::pin(upstream), partial: BytesMut::new(), done: false };
    futures::stream::unfold(state, move |mut state| {
        let base = base.clone();
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
                    Ok(Some(Err(e))) => ("upstream_stream_error", format!("upstream {base} broke off the stream: {e}")),
                    Err(_) => ("upstream_timeout", format!("upstream {base} stalled mid-stream for {timeout:?}")),
                };
                state.done = true;
                let error = serde_json::json!({
                    "error": { "message": message, "type": "upstream_error", "param": null, "code": code }
                });
                return Some((Ok(super::openai::sse(&error)), state));
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
