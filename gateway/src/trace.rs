//! Following one request: its id (`x-request-id`, taken from the client when it sends a sane one, else
//! made here), its W3C trace context (`traceparent`: the client's trace continued with a span of the
//! gateway's, or a new trace), both returned to the client and sent upstream, and one structured log
//! line when its answer ends ([`RequestLog`]).
//!
//! The log line is JSON, one object per line, written when the answer's last byte is sent (or the
//! client went away):
//!
//! | field | meaning |
//! |---|---|
//! | `ts` | when the answer ended, seconds since the Unix epoch (UTC) |
//! | `request_id`, `trace_id` | as sent upstream and to the client |
//! | `tenant`, `priority` | the caller (`null` without tenants) and the class it was admitted in |
//! | `decision` | `admitted`, `rejected` (429/503 by admission, a budget), `invalid` (400/401/405/408/413) |
//! | `status` | the status the client got |
//! | `queue_wait_ms` | time waiting for admission (admitted requests) |
//! | `upstream`, `upstream_status` | the server it ran on and what it answered |
//! | `ttft_ms` | from the request's arrival to the first chunk of the answer's body |
//! | `duration_ms` | from arrival to the answer's end |
//! | `tokens_in`, `tokens_out` | the prompt estimate; the output tokens counted in the answer (`null` when unknown) |
//!
//! Keys, prompts and answers are never logged.

use parking_lot::Mutex;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The request-id header.
pub const REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
/// The W3C trace-context header.
pub const TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

/// The longest request id taken from a client (a longer one is replaced).
const MAX_REQUEST_ID: usize = 128;

/// A request's id and trace context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The request id.
    pub request_id: String,
    /// The trace id, 32 hex digits.
    pub trace_id: String,
    /// The gateway's span id for this request, 16 hex digits (the parent of the upstream's spans).
    pub span_id: String,
    /// The client's span, the parent of the gateway's (when the client sent a `traceparent`).
    pub parent_span_id: Option<String>,
    /// The trace flags (sampled: `01`).
    pub flags: String,
}

/// Random-looking 64-bit values for ids: SplitMix64 over a per-process random seed and a counter.
fn next_id() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(|| {
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), std::process::id())
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    kvgate::retry::SplitMix64::new(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64().max(1)
}

/// `ids` as lowercase hex, 16 digits each (what `format!("{:016x}", ..)` writes, without its formatter).
fn hex(ids: &[u64]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(16 * ids.len());
    for id in ids {
        let mut digits = [0u8; 16];
        for (i, digit) in digits.iter_mut().enumerate() {
            *digit = DIGITS[((id >> (60 - 4 * i)) & 0xf) as usize];
        }
        text.push_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"));
    }
    text
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Trace {
    /// The trace of a request with these headers.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate_gateway::trace::Trace;
    ///
    /// let mut headers = http::HeaderMap::new();
    /// headers.insert("x-request-id", "job-42".parse().unwrap());
    /// headers.insert("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".parse().unwrap());
    /// let trace = Trace::from_headers(&headers);
    /// assert_eq!(trace.request_id, "job-42");
    /// assert_eq!(trace.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736"); // the client's trace goes on
    /// assert_ne!(trace.span_id, "00f067aa0ba902b7"); // in a span of the gateway's
    /// assert!(trace.traceparent().starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"));
    /// ```
    pub fn from_headers(headers: &http::HeaderMap) -> Self {
        let request_id = headers
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|id| !id.is_empty() && id.len() <= MAX_REQUEST_ID && id.bytes().all(|b| b.is_ascii_graphic()))
            .map_or_else(|| hex(&[next_id(), next_id()]), str::to_owned);
        let parent = headers.get(TRACEPARENT).and_then(|v| v.to_str().ok()).and_then(|v| {
            let mut parts = v.trim().split('-');
            let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
            let valid = is_hex(version, 2)
                && version != "ff"
                && is_hex(trace, 32)
                && trace.bytes().any(|b| b != b'0')
                && is_hex(span, 16)
                && span.bytes().any(|b| b != b'0')
                && is_hex(flags, 2)
                && (version != "00" || parts.next().is_none());
            valid.then(|| (trace.to_owned(), span.to_owned(), flags.to_owned()))
        });
        let (trace_id, parent_span_id, flags) = match parent {
            Some((trace, span, flags)) => (trace, Some(span), flags),
            None => (hex(&[next_id(), next_id()]), None, "01".into()),
        };
        Self { request_id, trace_id, span_id: hex(&[next_id()]), parent_span_id, flags }
    }

    /// The `traceparent` sent upstream: this trace, the gateway's span as the parent.
    pub fn traceparent(&self) -> String {
        let mut text = String::with_capacity(6 + self.trace_id.len() + self.span_id.len() + self.flags.len());
        for part in ["00-", &self.trace_id, "-", &self.span_id, "-", &self.flags] {
            text.push_str(part);
        }
        text
    }
}

/// One request's log line; see the [module docs](self).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LogLine {
    /// The client's span (for the OpenTelemetry exporter; not logged).
    #[serde(skip)]
    pub parent_span_id: Option<String>,
    /// The gateway's span (for the OpenTelemetry exporter; not logged).
    #[serde(skip)]
    pub span_id: String,
    /// Seconds since the epoch.
    pub ts: f64,
    /// The request id.
    pub request_id: String,
    /// The trace id.
    pub trace_id: String,
    /// The tenant.
    pub tenant: Option<String>,
    /// The class.
    pub priority: Option<&'static str>,
    /// `admitted`, `rejected`, `invalid`.
    pub decision: &'static str,
    /// The client's status.
    pub status: u16,
    /// Admission wait.
    pub queue_wait_ms: Option<f64>,
    /// The upstream's name.
    pub upstream: Option<String>,
    /// The upstream's status.
    pub upstream_status: Option<u16>,
    /// Time to the first chunk of the body.
    pub ttft_ms: Option<f64>,
    /// Arrival to end.
    pub duration_ms: f64,
    /// The prompt estimate.
    pub tokens_in: Option<u32>,
    /// Output tokens counted.
    pub tokens_out: Option<u32>,
}

/// Where the log lines go: nowhere, standard error, or a file (appended).
pub struct RequestLog {
    sink: Option<Mutex<Box<dyn Write + Send>>>,
}

impl std::fmt::Debug for RequestLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestLog").field("on", &self.sink.is_some()).finish()
    }
}

impl RequestLog {
    /// No log.
    pub fn off() -> Self {
        Self { sink: None }
    }

    /// To `path` (`-`: standard error), appending.
    ///
    /// # Errors
    ///
    /// When the file cannot be opened.
    pub fn open(path: &std::path::Path) -> std::io::Result<Self> {
        let sink: Box<dyn Write + Send> = if path.as_os_str() == "-" {
            Box::new(std::io::stderr())
        } else {
            Box::new(std::fs::OpenOptions::new().create(true).append(true).open(path)?)
        };
        Ok(Self { sink: Some(Mutex::new(sink)) })
    }

    /// Whether lines are written.
    pub fn is_on(&self) -> bool {
        self.sink.is_some()
    }

    /// Writes one line (a failed write is dropped: logging never fails a request).
    pub fn write(&self, line: &LogLine) {
        if let Some(sink) = &self.sink {
            let mut text = serde_json::to_vec(line).expect("a log line serializes");
            text.push(b'\n');
            let mut sink = sink.lock();
            let _ = sink.write_all(&text);
            let _ = sink.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_written_as_the_formatter_writes_them() {
        for id in [0, 1, 0xf, 0x0123_4567_89ab_cdef, u64::MAX, next_id()] {
            assert_eq!(hex(&[id]), format!("{id:016x}"));
            assert_eq!(hex(&[id, !id]), format!("{id:016x}{:016x}", !id));
        }
    }

    #[test]
    fn bad_ids_and_trace_contexts_are_replaced() {
        let mut headers = http::HeaderMap::new();
        let fresh = Trace::from_headers(&headers);
        assert!(is_hex(&fresh.trace_id, 32) && is_hex(&fresh.span_id, 16) && fresh.request_id.len() == 32);
        assert_ne!(Trace::from_headers(&headers).request_id, fresh.request_id);
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "garbage",
        ] {
            headers.insert(TRACEPARENT, bad.parse().unwrap());
            assert_ne!(Trace::from_headers(&headers).trace_id, "4bf92f3577b34da6a3ce929d0e0e4736", "{bad}");
        }
        headers.insert(REQUEST_ID, "x".repeat(200).parse().unwrap());
        assert_eq!(Trace::from_headers(&headers).request_id.len(), 32);
    }
}
