//! HTTP adapters: [`PermitBody`], a response body that holds its request's permit while it streams, and
//! the HTTP form of a [`Rejection`] ([`rejection_response`]: status, `Retry-After`, an OpenAI-style JSON
//! error).
//!
//! Requires the `http-body` feature (`http`, `http-body` 1.x and `bytes`).
#![cfg_attr(docsrs, doc(cfg(feature = "http-body")))]

use crate::stream::{Completion, OnePerItem, TokenCounter};
use crate::{Permit, Rejection};
use ::http::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use ::http::{Response, StatusCode};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The `retry-after-ms` header (milliseconds), as sent by OpenAI-compatible servers next to `Retry-After`.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// An [`http_body::Body`] that holds a [`Permit`] until the body ends or is dropped, counting its data
/// frames as output tokens.
///
/// The permit is [completed](Permit::complete) exactly once with the tokens counted: when the inner body
/// ends (`poll_frame` returns `Ready(None)`), when it fails (`Ready(Some(Err(_)))`: the generation is
/// over), or when the body is dropped early — the client disconnected, or the server stopped polling
/// after [`is_end_stream`](Body::is_end_stream) said the body was done. Trailers frames count nothing;
/// each data frame counts one token unless a counter is set with
/// [`count_with`](PermitBody::count_with).
///
/// # Examples
///
/// ```
/// use bytes::Bytes;
/// use http_body::Body;
/// use kvgate::http::PermitBody;
/// use kvgate::{Admission, Request};
///
/// let admission = Admission::builder().max_in_flight(1).build().unwrap();
/// let permit = admission.try_admit(&Request::new(10, 100)).unwrap();
/// // Count the server-sent events in each chunk as tokens.
/// let body = PermitBody::new(String::from("data: a\n\ndata: b\n\n"), permit)
///     .count_with(|chunk: &Bytes| chunk.split(|b| *b == b'\n').filter(|l| l.starts_with(b"data:")).count() as u32);
/// assert!(!body.is_end_stream());
/// assert_eq!(admission.snapshot().in_flight, 1);
/// drop(body); // hyper drops the body when the response is done or the client goes away
/// assert_eq!(admission.snapshot().in_flight, 0);
/// ```
#[pin_project]
pub struct PermitBody<B, F = OnePerItem> {
    // Field order matters: the body is dropped before the permit is completed.
    #[pin]
    inner: B,
    counter: F,
    completion: Completion,
}

impl<B: Body> PermitBody<B> {
    /// Wraps `body`, holding `permit`, counting one output token per data frame.
    pub fn new(body: B, permit: Permit) -> Self {
        Self { inner: body, counter: OnePerItem, completion: Completion::new(permit) }
    }
}

impl<B: Body, F> PermitBody<B, F> {
    /// Counts output tokens with `counter` instead, a function of each data frame (for example the SSE
    /// `data:` lines in it).
    pub fn count_with<G: TokenCounter<B::Data>>(self, counter: G) -> PermitBody<B, G> {
        let PermitBody { inner, counter: _, completion } = self;
        PermitBody { inner, counter, completion }
    }
}

impl<B, F> PermitBody<B, F> {
    /// Output tokens counted so far.
    pub fn tokens_so_far(&self) -> u32 {
        self.completion.counted()
    }

    /// The permit, until the body ended (then it was completed).
    pub fn permit(&self) -> Option<&Permit> {
        self.completion.permit()
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Unwraps into the inner body, the permit **not** completed (`None` if the body ended), and the
    /// tokens counted so far.
    pub fn into_inner(self) -> (B, Option<Permit>, u32) {
        let PermitBody { inner, counter: _, mut completion } = self;
        let counted = completion.counted();
        (inner, completion.take(), counted)
    }
}

impl<B: Body, F: TokenCounter<B::Data>> Body for PermitBody<B, F> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        if this.completion.is_done() {
            return Poll::Ready(None);
        }
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let tokens = this.counter.count(data);
                    this.completion.add(tokens);
                }
            }
            Poll::Ready(Some(Err(_)) | None) => this.completion.finish(),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.completion.is_done() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        if self.completion.is_done() { SizeHint::with_exact(0) } else { self.inner.size_hint() }
    }
}

impl<B, F> fmt::Debug for PermitBody<B, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody")
            .field("permit", &self.completion.permit())
            .field("tokens_so_far", &self.completion.counted())
            .finish_non_exhaustive()
    }
}

/// A JSON error response in the OpenAI API's shape:
/// `{"error":{"message":…,"type":…,"param":null,"code":…}}`, with `content-type: application/json`.
///
/// For request mappers that refuse malformed input (see [`AdmissionLayer`](crate::tower::AdmissionLayer)).
///
/// # Examples
///
/// ```
/// use http::StatusCode;
///
/// let res = kvgate::http::error_response(StatusCode::BAD_REQUEST, "max_tokens must be a \"number\"", "invalid_request_error", "invalid");
/// assert_eq!(res.status(), 400);
/// assert_eq!(
///     res.body().as_ref(),
///     br#"{"error":{"message":"max_tokens must be a \"number\"","type":"invalid_request_error","param":null,"code":"invalid"}}"#
/// );
/// ```
pub fn error_response(status: StatusCode, message: &str, kind: &str, code: &str) -> Response<Bytes> {
    let mut json = String::with_capacity(64 + message.len() + kind.len() + code.len());
    json.push_str(r#"{"error":{"message":"#);
    push_json_string(&mut json, message);
    json.push_str(r#","type":"#);
    push_json_string(&mut json, kind);
    json.push_str(r#","param":null,"code":"#);
    push_json_string(&mut json, code);
    json.push_str("}}");
    let mut response = Response::new(Bytes::from(json));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The HTTP response for a rejection: status [`http_status`](Rejection::http_status) (or 429 for every
/// retryable rejection with `all_as_429`), `Retry-After` in whole seconds rounded up (at least 1) and
/// `retry-after-ms` when the rejection carries a hint, and an OpenAI-style JSON error body whose `code`
/// is [`reason`](Rejection::reason).
///
/// Retryable means [`RetryHint::is_retryable`](crate::retry::RetryHint::is_retryable): every reason but
/// `TooLarge`, `Closed` and `Invalid`.
///
/// # Examples
///
/// ```
/// use kvgate::Rejection;
/// use std::time::Duration;
///
/// let res = kvgate::http::rejection_response(&Rejection::NoCapacity { retry_after: Duration::from_millis(1200) }, false);
/// assert_eq!(res.status(), 503);
/// assert_eq!(res.headers()["retry-after"], "2");
/// assert_eq!(res.headers()["retry-after-ms"], "1200");
/// let as_429 = kvgate::http::rejection_response(&Rejection::NoCapacity { retry_after: Duration::from_millis(1200) }, true);
/// assert_eq!(as_429.status(), 429);
/// ```
pub fn rejection_response(rejection: &Rejection, all_as_429: bool) -> Response<Bytes> {
    use crate::retry::RetryHint;
    let status = if all_as_429 && rejection.is_retryable() {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::from_u16(rejection.http_status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
    };
    let kind = match status.as_u16() {
        429 => "rate_limit_error",
        400 | 413 => "invalid_request_error",
        _ => "service_unavailable_error",
    };
    let mut response = error_response(status, &rejection.to_string(), kind, rejection.reason());
    if let Some(after) = rejection.retry_after() {
        let headers = response.headers_mut();
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        headers.insert(RETRY_AFTER_MS, HeaderValue::from(retry_after_millis(after)));
    }
    response
}

/// Whole seconds for `Retry-After`: rounded up, at least 1 (clients read 0 as "now").
fn retry_after_secs(after: Duration) -> u64 {
    let secs = after.as_secs() + u64::from(after.subsec_nanos() != 0);
    secs.max(1)
}

/// Milliseconds for `retry-after-ms`: rounded up, at least 1.
fn retry_after_millis(after: Duration) -> u64 {
    let millis = after.as_nanos().div_ceil(1_000_000);
    u64::try_from(millis).unwrap_or(u64::MAX).max(1)
}

/// The server's retry hint in a response's headers: `retry-after-ms` if present and valid, else
/// `Retry-After` in delta-seconds (an HTTP-date is ignored). For clients feeding
/// [`retry`](crate::retry::retry).
///
/// # Examples
///
/// ```
/// use http::HeaderMap;
/// use std::time::Duration;
///
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "3".parse().unwrap());
/// assert_eq!(kvgate::http::retry_after(&headers), Some(Duration::from_secs(3)));
/// ```
pub fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    crate::retry::retry_after_from_headers(value(RETRY_AFTER.as_str()), value(RETRY_AFTER_MS))
}

/// Appends `s` as a JSON string literal (RFC 8259 escaping).
fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                use std::fmt::Write;
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        let mut out = String::new();
        push_json_string(&mut out, "a\"b\\c\nd\u{1}é");
        assert_eq!(out, r#""a\"b\\c\nd\u0001é""#);
    }

    #[test]
    fn retry_after_rounds_up() {
        assert_eq!(retry_after_secs(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(2000)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2001)), 3);
        assert_eq!(retry_after_millis(Duration::from_nanos(1)), 1);
        assert_eq!(retry_after_millis(Duration::from_micros(1500)), 2);
    }

    #[test]
    fn fatal_rejections_keep_their_status_even_as_429() {
        let res = rejection_response(&Rejection::Invalid { reason: "zero" }, true);
        assert_eq!(res.status(), 400);
        assert!(res.headers().get(RETRY_AFTER).is_none());
        let res = rejection_response(&Rejection::TimedOut, true);
        assert_eq!(res.status(), 429);
    }
}
