//! The OpenAI API's request and response shapes, as far as admission needs them: reading a completion
//! request (prompt size, `max_tokens`, `stream`), OpenAI-style errors, and the JSON/SSE the simulated
//! backend answers with.

use super::tokens::TokenCounter;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use serde_json::{Map, Value, json};
use std::time::Instant;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions`
    Chat,
    /// `POST /v1/completions`
    Completions,
}

impl Endpoint {
    /// From the request path.
    pub fn from_path(path: &str) -> Option<Self> {
        match path.trim_end_matches('/') {
            "/v1/chat/completions" => Some(Endpoint::Chat),
            "/v1/completions" => Some(Endpoint::Completions),
            _ => None,
        }
    }

    /// The path after `/v1`.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/chat/completions",
            Endpoint::Completions => "/completions",
        }
    }
}

/// A completion request, read and checked before admission (put into the request's extensions by the
/// gateway's body-reading layer).
#[derive(Debug, Clone)]
pub struct Completion {
    pub endpoint: Endpoint,
    /// `model` as sent (may be empty).
    pub model: String,
    pub stream: bool,
    /// Estimated prompt tokens.
    pub prompt_tokens: u32,
    /// `max_completion_tokens`, else `max_tokens`, else the gateway's default.
    pub max_tokens: u32,
    /// Whether `max_tokens` came from the default (then it is added to the body sent upstream, so that the
    /// upstream server never generates more than was reserved).
    pub defaulted: bool,
    /// The request body as received.
    pub body: Bytes,
    /// The parsed body.
    pub json: Map<String, Value>,
    /// When the gateway had read the request (queue wait is measured from here).
    pub arrived: Instant,
}

impl Completion {
    /// The body to send upstream: as received, or with the default `max_tokens` added.
    pub fn upstream_body(&self) -> Bytes {
        if !self.defaulted {
            return self.body.clone();
        }
        let mut json = self.json.clone();
        json.insert("max_tokens".into(), Value::from(self.max_tokens));
        Bytes::from(serde_json::to_vec(&json).expect("a JSON map serializes"))
    }
}

/// An OpenAI-style error: `{"error":{"message","type","param","code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub code: &'static str,
}

impl ApiError {
    /// A `400 Bad Request` with `type: invalid_request_error`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), code }
    }

    /// A `413 Content Too Large` with `type: invalid_request_error`.
    pub fn too_large(code: &'static str, message: impl Into<String>) -> Self {
        Self { status: StatusCode::PAYLOAD_TOO_LARGE, message: message.into(), code }
    }

    /// The HTTP response (same shape as `kvgate::http::rejection_response`'s).
    pub fn to_response(&self) -> http::Response<Bytes> {
        let kind = match self.status.as_u16() {
            400..=499 => "invalid_request_error",
            502 | 504 => "upstream_error",
            _ => "server_error",
        };
        kvgate::http::error_response(self.status, &self.message, kind, self.code)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.to_response().map(axum::body::Body::from)
    }
}

/// Reads and checks a completion request body.
///
/// # Errors
///
/// `400` for malformed JSON, a body that is not an object, missing or mistyped `messages`/`prompt`,
/// `stream`, `n`, or a `max_tokens` that is not a positive integer; `413` for a `max_tokens` above
/// 2^32 - 1. (Sizes that are valid numbers but exceed the KV budget get their `413` from admission.)
pub fn parse(
    endpoint: Endpoint,
    body: Bytes,
    counter: &dyn TokenCounter,
    default_max_tokens: u32,
) -> Result<Completion, ApiError> {
    let arrived = Instant::now();
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(json) = value else {
        return Err(ApiError::bad_request("invalid_json", "the request body must be a JSON object"));
    };
    let model = match json.get("model") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::bad_request("invalid_type", "'model' must be a string")),
    };
    let stream = match json.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::bad_request("invalid_type", "'stream' must be a boolean")),
    };
    match json.get("n") {
        None | Some(Value::Null) => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                "unsupported_n",
                "'n' must be 1: this gateway reserves one sequence per request",
            ));
        }
    }
    let prompt_tokens = match endpoint {
        Endpoint::Chat => chat_tokens(json.get("messages"), counter)?,
        Endpoint::Completions => prompt_tokens(json.get("prompt"), counter)?,
    };
    let (max_tokens, defaulted) = match max_tokens(&json)? {
        Some(n) => (n, false),
        None => (default_max_tokens, true),
    };
    Ok(Completion {
        endpoint,
        model,
        stream,
        prompt_tokens: prompt_tokens.max(1),
        max_tokens,
        defaulted,
        body,
        json,
        arrived,
    })
}

fn max_tokens(json: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    for name in ["max_completion_tokens", "max_tokens"] {
        let value = match json.get(name) {
            None | Some(Value::Null) => continue,
            Some(value) => value,
        };
        let Some(n) =
            value.as_u64().or_else(|| value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
        else {
            return Err(ApiError::bad_request(
                "invalid_max_tokens",
                format!("'{name}' must be a positive integer, got {value}"),
            ));
        };
        if n == 0 {
            return Err(ApiError::bad_request("invalid_max_tokens", format!("'{name}' must be at least 1")));
        }
        return match u32::try_from(n) {
            Ok(n) => Ok(Some(n)),
            Err(_) => {
                Err(ApiError::too_large("max_tokens_too_large", format!("'{name}' = {n} exceeds any KV-cache budget")))
            }
        };
    }
    Ok(None)
}

fn chat_tokens(messages: Option<&Value>, counter: &dyn TokenCounter) -> Result<u32, ApiError> {
    let Some(messages) = messages else {
        return Err(ApiError::bad_request(
            "missing_messages",
            "'messages' is required: a non-empty array of {role, content}",
        ));
    };
    let Some(messages) = messages.as_array().filter(|m| !m.is_empty()) else {
        return Err(ApiError::bad_request(
            "invalid_messages",
            "'messages' must be a non-empty array of {role, content}",
        ));
    };
    let mut texts = Vec::with_capacity(messages.len());
    let mut extra = 0u32;
    for (i, message) in messages.iter().enumerate() {
        let Some(role) = message.get("role").and_then(Value::as_str) else {
            return Err(ApiError::bad_request("invalid_messages", format!("messages[{i}].role must be a string")));
        };
        let content = message.get("content").unwrap_or(&Value::Null);
        let text = match content {
            Value::Null => String::new(),
            Value::String(s) => s.clone(),
            // Content parts: text parts are counted; an image or audio part is priced at a flat 256 tokens.
            Value::Array(parts) => {
                let mut text = String::new();
                for part in parts {
                    match part.get("text").and_then(Value::as_str) {
                        Some(t) => text.push_str(t),
                        None => extra = extra.saturating_add(256),
                    }
                }
                text
            }
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_messages",
                    format!("messages[{i}].content must be a string or an array of parts"),
                ));
            }
        };
        texts.push((role, text));
    }
    let borrowed: Vec<(&str, &str)> = texts.iter().map(|(r, t)| (*r, t.as_str())).collect();
    Ok(counter.count_chat(&borrowed).saturating_add(extra))
}

fn prompt_tokens(prompt: Option<&Value>, counter: &dyn TokenCounter) -> Result<u32, ApiError> {
    let invalid = || {
        ApiError::bad_request(
            "invalid_prompt",
            "'prompt' must be a string, an array of strings, or an array of token ids",
        )
    };
    match prompt {
        None => Err(ApiError::bad_request("missing_prompt", "'prompt' is required")),
        Some(Value::String(s)) => Ok(counter.count_text(s)),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
            Ok(u32::try_from(items.len()).unwrap_or(u32::MAX))
        }
        Some(Value::Array(items)) if items.len() == 1 => match &items[0] {
            Value::String(s) => Ok(counter.count_text(s)),
            Value::Array(ids) if ids.iter().all(Value::is_u64) => Ok(u32::try_from(ids.len()).unwrap_or(u32::MAX)),
            _ => Err(invalid()),
        },
        // Several prompts are several sequences: like n > 1, not reserved as one.
        Some(Value::Array(_)) => Err(ApiError::bad_request("unsupported_batch", "send one prompt per request")),
        Some(_) => Err(invalid()),
    }
}

/// Seconds since the Unix epoch, for `created`.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One SSE event carrying `value`.
pub fn sse(value: &Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, value).expect("JSON values serialize");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The SSE stream's end marker.
pub const SSE_DONE: &[u8] = b"data: [DONE]\n\n";

/// A streamed chunk with `text` (or the role opener / finish chunk).
pub fn chunk(
    endpoint: Endpoint,
    id: &str,
    model: &str,
    created: u64,
    text: Option<&str>,
    finish: Option<&str>,
) -> Value {
    match endpoint {
        Endpoint::Chat => {
            let delta = match (text, finish) {
                (Some(t), _) => json!({ "content": t }),
                (None, None) => json!({ "role": "assistant", "content": "" }),
                (None, Some(_)) => json!({}),
            };
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }],
            })
        }
        Endpoint::Completions => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{ "index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish }],
        }),
    }
}

/// A whole (non-streamed) response.
#[allow(clippy::too_many_arguments)]
pub fn full_response(
    endpoint: Endpoint,
    id: &str,
    model: &str,
    created: u64,
    text: &str,
    finish: &str,
    prompt: u32,
    completion: u32,
) -> Value {
    let usage =
        json!({ "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion });
    match endpoint {
        Endpoint::Chat => json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{ "index": 0, "message": { "role": "assistant", "content": text }, "finish_reason": finish }],
            "usage": usage,
        }),
        Endpoint::Completions => json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{ "index": 0, "text": text, "logprobs": null, "finish_reason": finish }],
            "usage": usage,
        }),
    }
}

/// Counts output tokens in response body frames, to complete permits with what was produced (refunding
/// the rest of the token-rate reservation): one per SSE `data:` event other than `[DONE]` (role and
/// finish chunks included, so it overcounts by two), or the `completion_tokens` of a whole JSON response.
#[derive(Debug, Clone, Copy, Default)]
pub struct OutputTokens;

impl kvgate::stream::TokenCounter<Bytes> for OutputTokens {
    fn count(&mut self, frame: &Bytes) -> u32 {
        let events =
            frame.split(|&b| b == b'\n').filter(|l| l.starts_with(b"data:") && !l.ends_with(b"[DONE]")).count();
        if events > 0 {
            return u32::try_from(events).unwrap_or(u32::MAX);
        }
        const KEY: &[u8] = b"\"completion_tokens\":";
        frame
            .windows(KEY.len())
            .position(|w| w == KEY)
            .map(|at| {
                let digits = frame[at + KEY.len()..]
                    .iter()
                    .skip_while(|b| b.is_ascii_whitespace())
                    .take_while(|b| b.is_ascii_digit());
                digits.fold(0u32, |n, d| n.saturating_mul(10).saturating_add(u32::from(d - b'0')))
            })
            .unwrap_or(0)
    }
}
