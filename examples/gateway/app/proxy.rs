//! Proxy mode: forwards admitted requests to an OpenAI-compatible server (vLLM, llama.cpp's
//! `llama-server`, Ollama, TGI, ...) over plain http, and passes its answer through chunk by chunk.
//!
//! The upstream response body becomes the client's response body (inside the permit-holding body), so
//! when the client goes away hyper drops it, which drops reqwest's response and closes the upstream
//! connection: vLLM and llama-server abort a generation whose client disconnected.

use super::openai::{ApiError, Completion};
use axum::body::Body;
use http::{HeaderMap, StatusCode};

/// The upstream server.
#[derive(Debug, Clone)]
pub struct Proxy {
    client: reqwest::Client,
    /// Base URL ending in `/v1`.
    base: String,
}

/// Response headers passed through from upstream (hop-by-hop ones are left to hyper).
const PASSED_HEADERS: &[http::HeaderName] =
    &[http::header::CONTENT_TYPE, http::header::CACHE_CONTROL, http::header::RETRY_AFTER];

impl Proxy {
    /// A proxy to `url` (`http://host:port` or `http://host:port/v1`).
    ///
    /// # Errors
    ///
    /// A message if the HTTP client cannot be built.
    pub fn new(url: &str) -> Result<Self, String> {
        let url = url.trim_end_matches('/');
        let base = if url.ends_with("/v1") { url.to_owned() } else { format!("{url}/v1") };
        // No system proxy: the upstream is normally on the same host or network.
        let client = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(std::time::Duration::from_secs(5))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { client, base })
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

    async fn pass_through(&self, upstream: reqwest::RequestBuilder) -> http::Response<Body> {
        let response = match upstream.send().await {
            Ok(response) => response,
            Err(e) => {
                let status = if e.is_timeout() { StatusCode::GATEWAY_TIMEOUT } else { StatusCode::BAD_GATEWAY };
                let message = format!("upstream {} unreachable: {e}", self.base);
                return ApiError { status, message, code: "upstream_unreachable" }.to_response().map(Body::from);
            }
        };
        let mut builder = http::Response::builder().status(response.status().as_u16());
        for name in PASSED_HEADERS {
            if let Some(value) = response.headers().get(name) {
                builder = builder.header(name, value.as_bytes());
            }
        }
        builder.body(Body::from_stream(response.bytes_stream())).expect("a valid response")
    }
}
