//! HTTP adapters: [`PermitBody`], a response body that holds its request's permit while it streams; the
//! HTTP form of a [`Rejection`] ([`rejection_response`]: status, `Retry-After`, an OpenAI-style JSON
//! error); OpenAI's `x-ratelimit-*` headers ([`insert_rate_limit_headers`]); and the server's retry hint
//! read back from a response ([`retry_after`]).
//!
//! # Handler-style integration
//!
//! Without tower, a handler admits, then either streams its answer inside a [`PermitBody`] or answers
//! the rejection:
//!
//! ```
//! use bytes::Bytes;
//! use http_body_util::Full;
//! use kvgate::http::{PermitBody, insert_rate_limit_headers, rejection_response};
//! use kvgate::{Admission, Request};
//!
//! async fn handle(admission: &Admission, req: Request) -> http::Response<http_body_util::Either<PermitBody<Full<Bytes>>, Full<Bytes>>> {
//!     let mut response = match admission.admit(&req).await {
//!         Ok(permit) => {
//!             let answer = Full::new(Bytes::from("data: {}\n\n")); // the engine's (streamed) answer
//!             http::Response::new(http_body_util::Either::Left(PermitBody::new(answer, permit)))
//!         }
//!         Err(rejection) => rejection_response(&rejection, admission, false).map(|b| http_body_util::Either::Right(Full::new(b))),
//!     };
//!     insert_rate_limit_headers(response.headers_mut(), &admission.rate_status(req.tenant));
//!     response
//! }
//!
//! let admission = Admission::builder().max_in_flight(1).request_rate(10.0, 10).build()?;
//! let response = futures::executor::block_on(handle(&admission, Request::new(100, 50)));
//! assert_eq!(response.status(), 200);
//! assert_eq!(response.headers()["x-ratelimit-remaining-requests"], "9");
//! assert_eq!(admission.snapshot().in_flight, 1); // until the body is sent or dropped
//! drop(response);
//! assert_eq!(admission.snapshot().in_flight, 0);
//! # Ok::<(), kvgate::ConfigError>(())
//! ```
//!
//! With the `openai` feature, `kvgate::openai` reads the [`Request`](crate::Request) from a
//! chat/completions body and counts the answer's output tokens (see its module docs for the whole
//! recipe).
//!
//! Requires the `http-body` feature (`http`, `http-body` 1.x and `bytes`).
#![cfg_attr(docsrs, doc(cfg(feature = "http-body")))]

use crate::clock::Clock;
use crate::stream::{Complete, Completion, OutputCounter, Uncounted};
use crate::{Admission, Permit, RateLimitStatus, RateStatus, Rejection};
use ::http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
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

/// An [`http_body::Body`] that holds a [`Permit`] (or any [`Complete`] grant) until the body ends or is
/// dropped.
///
/// The permit is returned exactly once: when the inner body ends (`poll_frame` returns `Ready(None)`),
/// when it fails (`Ready(Some(Err(_)))`: the generation is over), or when the body is dropped early —
/// the client disconnected, or the server stopped polling after [`is_end_stream`](Body::is_end_stream)
/// said the body was done.
///
/// # Output tokens
///
/// Data frames are bytes, not tokens: a non-streamed answer arrives as one frame whatever its length.
/// So by default ([`Uncounted`]) nothing is reported — the permit is dropped, not
/// [completed](Permit::complete) — and the learned reservation and the token-rate refund never see a
/// made-up count. Give a counter that understands the body with [`count_with`](PermitBody::count_with):
/// `kvgate::openai::OutputTokens` (feature `openai`) reads OpenAI SSE chunks and `usage` objects, and a
/// closure can count what it knows (for example one token per SSE event).
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
pub struct PermitBody<B, F = Uncounted, P: Complete = Permit> {
    // Field order matters: the body is dropped before the permit is completed.
    #[pin]
    inner: B,
    completion: Completion<F, P>,
}

impl<B: Body, P: Complete> PermitBody<B, Uncounted, P> {
    /// Wraps `body`, holding `permit`, reporting no output count (see [Output tokens](#output-tokens)).
    pub fn new(body: B, permit: P) -> Self {
        Self { inner: body, completion: Completion::new::<B::Data>(permit, Uncounted) }
    }
}

impl<B: Body, F, P: Complete> PermitBody<B, F, P> {
    /// Counts output tokens with `counter`, an [`OutputCounter`] of the data frames (or a function of
    /// each frame). Call it before the first frame: the count starts from zero.
    pub fn count_with<G: OutputCounter<B::Data>>(self, counter: G) -> PermitBody<B, G, P> {
        let PermitBody { inner, completion } = self;
        PermitBody { inner, completion: completion.recount::<B::Data, G>(counter) }
    }
}

impl<B, F, P: Complete> PermitBody<B, F, P> {
    /// Output tokens counted so far; `None` when the counter cannot tell (always, without a counter).
    pub fn tokens_so_far(&self) -> Option<u32> {
        self.completion.tokens()
    }

    /// The permit, until the body ended (then it was completed).
    pub fn permit(&self) -> Option<&P> {
        self.completion.permit()
    }

    /// The wrapped body.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }

    /// Unwraps into the inner body, the permit **not** completed (`None` if the body ended), and the
    /// tokens counted so far.
    pub fn into_inner(self) -> (B, Option<P>, Option<u32>) {
        let PermitBody { inner, mut completion } = self;
        let counted = completion.tokens();
        (inner, completion.take(), counted)
    }
}

impl<B: Body, F: OutputCounter<B::Data>, P: Complete> Body for PermitBody<B, F, P> {
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
                    this.completion.count(data);
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

impl<B, F, P: Complete + fmt::Debug> fmt::Debug for PermitBody<B, F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitBody")
            .field("permit", &self.completion.permit())
            .field("tokens_so_far", &self.completion.tokens())
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

/// The longest retry hint a response carries (one day): a longer hint is sent as this, in both headers.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// The HTTP response for a rejection by `admission`: status [`http_status`](Rejection::http_status) (or
/// 429 for every retryable rejection with `all_as_429`), an OpenAI-style JSON error body whose `code` is
/// [`reason`](Rejection::reason), and for every retryable rejection `Retry-After` in whole seconds
/// (rounded up, at least 1) and `retry-after-ms`.
///
/// The hint is the rejection's own, or for [`Rejection::TimedOut`] (which carries none: the caller
/// chose how long to wait) the admission's current estimate,
/// [`capacity_retry_after`](Admission::capacity_retry_after). Hints are capped at
/// [`MAX_RETRY_AFTER`], and both headers always say the same time.
///
/// Retryable means [`RetryHint::is_retryable`](crate::retry::RetryHint::is_retryable): every reason but
/// `TooLarge`, `Closed` and `Invalid`.
///
/// # Examples
///
/// ```
/// use kvgate::{Admission, Rejection};
/// use std::time::Duration;
///
/// let admission = Admission::builder().build().unwrap();
/// let busy = Rejection::NoCapacity { retry_after: Duration::from_millis(1200) };
/// let res = kvgate::http::rejection_response(&busy, &admission, false);
/// assert_eq!(res.status(), 503);
/// assert_eq!(res.headers()["retry-after"], "2");
/// assert_eq!(res.headers()["retry-after-ms"], "1200");
/// assert_eq!(kvgate::http::rejection_response(&busy, &admission, true).status(), 429);
/// // A wait that timed out is retryable too: the hint is the admission's capacity estimate.
/// assert!(kvgate::http::rejection_response(&Rejection::TimedOut, &admission, false).headers().contains_key("retry-after"));
/// ```
pub fn rejection_response<C: Clock>(
    rejection: &Rejection,
    admission: &Admission<C>,
    all_as_429: bool,
) -> Response<Bytes> {
    let hint = match rejection {
        Rejection::TimedOut => Some(admission.capacity_retry_after()),
        other => other.retry_after(),
    };
    rejection_response_with_hint(rejection, hint, all_as_429)
}

/// [`rejection_response`] with the retry hint given: `hint` is used for every retryable rejection
/// (`None`: the rejection's own, which [`Rejection::TimedOut`] lacks).
///
/// # Examples
///
/// ```
/// use kvgate::Rejection;
/// use std::time::Duration;
///
/// let res = kvgate::http::rejection_response_with_hint(&Rejection::TimedOut, Some(Duration::MAX), false);
/// assert_eq!(res.status(), 503);
/// assert_eq!(res.headers()["retry-after"], "86400"); // capped at a day, in both headers
/// assert_eq!(res.headers()["retry-after-ms"], "86400000");
/// ```
pub fn rejection_response_with_hint(
    rejection: &Rejection,
    hint: Option<Duration>,
    all_as_429: bool,
) -> Response<Bytes> {
    use crate::retry::RetryHint;
    let retryable = rejection.is_retryable();
    let status = if all_as_429 && retryable {
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
    if let Some(after) = hint.or_else(|| rejection.retry_after()).filter(|_| retryable) {
        insert_retry_after(response.headers_mut(), after);
    }
    response
}

/// Sets `Retry-After` (whole seconds, rounded up, at least 1) and `retry-after-ms` (rounded up, at least
/// 1) to `after`, capped at [`MAX_RETRY_AFTER`] so that both say the same time.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
///
/// let mut headers = http::HeaderMap::new();
/// kvgate::http::insert_retry_after(&mut headers, Duration::from_millis(1500));
/// assert_eq!((&headers["retry-after"], &headers["retry-after-ms"]), (&"2".parse().unwrap(), &"1500".parse().unwrap()));
/// ```
pub fn insert_retry_after(headers: &mut HeaderMap, after: Duration) {
    let after = after.min(MAX_RETRY_AFTER);
    headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
    headers.insert(RETRY_AFTER_MS, HeaderValue::from(retry_after_millis(after)));
}

/// Whole seconds for `Retry-After`: rounded up, at least 1 (clients read 0 as "now"); saturating.
fn retry_after_secs(after: Duration) -> u64 {
    let secs = after.as_secs().saturating_add(u64::from(after.subsec_nanos() != 0));
    secs.max(1)
}

/// Milliseconds for `retry-after-ms`: rounded up, at least 1; saturating.
fn retry_after_millis(after: Duration) -> u64 {
    let millis = after.as_nanos().div_ceil(1_000_000);
    u64::try_from(millis).unwrap_or(u64::MAX).max(1)
}

/// The names of OpenAI's rate-limit headers, requests then tokens: limit, remaining, reset.
const RATE_LIMIT_HEADERS: [[&str; 3]; 2] = [
    ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"],
    ["x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"],
];

/// Sets OpenAI's rate-limit headers from `status` (see
/// [`Admission::rate_status`](crate::Admission::rate_status)): `x-ratelimit-limit-requests`,
/// `x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests` and the `-tokens` trio, for each rate
/// that is configured. The reset time is written as OpenAI writes it (`1s`, `6m0s`, `250ms`).
///
/// # Examples
///
/// ```
/// use kvgate::clock::ManualClock;
/// use kvgate::{Admission, Request};
///
/// let admission = Admission::builder().token_rate(100.0, 1_000).clock(ManualClock::new()).build()?;
/// admission.try_admit(&Request::new(200, 300)).unwrap().complete(300);
/// let mut headers = http::HeaderMap::new();
/// kvgate::http::insert_rate_limit_headers(&mut headers, &admission.rate_status(None));
/// assert_eq!(headers["x-ratelimit-limit-tokens"], "1000");
/// assert_eq!(headers["x-ratelimit-remaining-tokens"], "500");
/// assert_eq!(headers["x-ratelimit-reset-tokens"], "5s");
/// assert!(!headers.contains_key("x-ratelimit-limit-requests")); // no request rate configured
/// # Ok::<(), kvgate::ConfigError>(())
/// ```
pub fn insert_rate_limit_headers(headers: &mut HeaderMap, status: &RateLimitStatus) {
    for (rate, names) in [status.requests, status.tokens].iter().zip(RATE_LIMIT_HEADERS) {
        let Some(RateStatus { limit, remaining, reset }) = rate else { continue };
        let [limit_name, remaining_name, reset_name] = names.map(HeaderName::from_static);
        headers.insert(limit_name, HeaderValue::from(*limit));
        headers.insert(remaining_name, HeaderValue::from(*remaining));
        if let Ok(value) = HeaderValue::from_str(&openai_duration(*reset)) {
            headers.insert(reset_name, value);
        }
    }
}

/// A duration the way OpenAI's reset headers write it: `0s`, `250ms`, `1s`, `1.5s`, `6m0s`, `1h2m3s`
/// (milliseconds rounded up).
fn openai_duration(d: Duration) -> String {
    let millis = u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
    if millis < 1_000 {
        return if millis == 0 { "0s".into() } else { format!("{millis}ms") };
    }
    let (hours, minutes) = (millis / 3_600_000, millis / 60_000 % 60);
    let (secs, ms) = (millis / 1_000 % 60, millis % 1_000);
    let seconds =
        if ms == 0 { format!("{secs}s") } else { format!("{}s", format!("{secs}.{ms:03}").trim_end_matches('0')) };
    match (hours, minutes) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

/// The server's retry hint in a response's headers: `retry-after-ms` if present and valid, else
/// `Retry-After` in seconds or as an HTTP-date (read against the wall clock). For clients feeding
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
        let res =
            rejection_response_with_hint(&Rejection::Invalid { reason: "zero" }, Some(Duration::from_secs(1)), true);
        assert_eq!(res.status(), 400);
        assert!(res.headers().get(RETRY_AFTER).is_none());
        let res = rejection_response_with_hint(&Rejection::TimedOut, None, true);
        assert_eq!(res.status(), 429);
    }

    #[test]
    fn saturated_hints_are_capped_and_agree() {
        for after in [Duration::MAX, Duration::new(u64::MAX, 999_999_999), Duration::from_secs(u64::MAX / 2)] {
            let res = rejection_response_with_hint(&Rejection::RateLimited { retry_after: after }, None, false);
            assert_eq!(res.headers()[RETRY_AFTER], "86400");
            assert_eq!(res.headers()[RETRY_AFTER_MS], "86400000");
        }
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn timed_out_carries_the_capacity_estimate() {
        let admission = Admission::builder().build().unwrap();
        let res = rejection_response(&Rejection::TimedOut, &admission, false);
        assert_eq!(res.status(), 503);
        let hint = admission.capacity_retry_after();
        assert_eq!(res.headers()[RETRY_AFTER], retry_after_secs(hint).to_string().as_str());
    }

    #[test]
    fn durations_are_written_like_openai() {
        let cases = [
            (0, "0s"),
            (1, "1ms"),
            (250, "250ms"),
            (1_000, "1s"),
            (1_500, "1.5s"),
            (1_250, "1.25s"),
            (360_000, "6m0s"),
            (3_723_000, "1h2m3s"),
        ];
        for (millis, text) in cases {
            assert_eq!(openai_duration(Duration::from_millis(millis)), text);
        }
        assert_eq!(openai_duration(Duration::from_micros(1)), "1ms");
        assert!(!openai_duration(Duration::MAX).is_empty());
    }
}
