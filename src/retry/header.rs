//! Reading a server's retry advice: the `Retry-After` and `retry-after-ms` header values, and which
//! answers are final ([`retry_after_for_status`]).

use std::fmt;
use std::time::Duration;

/// Why a `Retry-After` or `retry-after-ms` header value could not be used.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ParseRetryAfterError {
    /// Neither a non-negative number of (milli)seconds nor an HTTP-date.
    Invalid,
}

impl fmt::Display for ParseRetryAfterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParseRetryAfterError::Invalid => {
                "not a non-negative number of seconds nor an HTTP-date (like `Wed, 21 Oct 2015 07:28:00 GMT`)"
            }
        })
    }
}

impl std::error::Error for ParseRetryAfterError {}

/// Parses a `Retry-After` header value: delta-seconds (`"120"`; a fractional `"1.5"`, which some servers
/// send, is rounded up to the next millisecond) or an HTTP-date in any of the three formats of RFC 9110
/// §5.6.7, read against the wall clock (a date in the past is a delay of zero). Surrounding whitespace is
/// allowed; numbers too large saturate.
///
/// # Errors
///
/// [`ParseRetryAfterError::Invalid`] for anything else.
///
/// # Examples
///
/// ```
/// use kvgate::retry::parse_retry_after;
/// use std::time::Duration;
///
/// assert_eq!(parse_retry_after(" 3 "), Ok(Duration::from_secs(3)));
/// assert_eq!(parse_retry_after("0.25"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), Ok(Duration::ZERO)); // long past
/// ```
pub fn parse_retry_after(value: &str) -> Result<Duration, ParseRetryAfterError> {
    parse_retry_after_at(value, std::time::SystemTime::now())
}

/// [`parse_retry_after`] with the wall clock's reading given, for HTTP-dates.
///
/// # Errors
///
/// As [`parse_retry_after`].
///
/// # Examples
///
/// ```
/// use kvgate::retry::parse_retry_after_at;
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
///
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
/// for date in ["Sun, 06 Nov 1994 09:49:37 GMT", "Sunday, 06-Nov-94 09:49:37 GMT", "Sun Nov  6 09:49:37 1994"] {
///     assert_eq!(parse_retry_after_at(date, now), Ok(Duration::from_secs(3600)));
/// }
/// ```
pub fn parse_retry_after_at(value: &str, now: std::time::SystemTime) -> Result<Duration, ParseRetryAfterError> {
    let value = value.trim();
    if value.bytes().any(|b| b.is_ascii_alphabetic()) {
        let date = httpdate::parse_http_date(value).map_err(|_| ParseRetryAfterError::Invalid)?;
        return Ok(date.duration_since(now).unwrap_or(Duration::ZERO));
    }
    decimal_millis(value, 1000).map(Duration::from_millis)
}

/// Parses a `retry-after-ms` header value (milliseconds, as sent by OpenAI-compatible servers). A
/// fractional value (`"1500.5"`) is accepted and rounded up to the next millisecond.
///
/// # Errors
///
/// [`ParseRetryAfterError::Invalid`] for anything that is not a non-negative number.
///
/// # Examples
///
/// ```
/// use kvgate::retry::parse_retry_after_ms;
/// use std::time::Duration;
///
/// assert_eq!(parse_retry_after_ms("250"), Ok(Duration::from_millis(250)));
/// assert!(parse_retry_after_ms("-1").is_err());
/// ```
pub fn parse_retry_after_ms(value: &str) -> Result<Duration, ParseRetryAfterError> {
    decimal_millis(value.trim(), 1).map(Duration::from_millis)
}

/// The server's hint from the two headers' values, preferring the more precise `retry-after-ms`; a value
/// that does not parse is ignored.
///
/// # Examples
///
/// ```
/// use kvgate::retry::retry_after_from_headers;
/// use std::time::Duration;
///
/// assert_eq!(retry_after_from_headers(Some("2"), Some("1500")), Some(Duration::from_millis(1500)));
/// assert_eq!(retry_after_from_headers(Some("2"), None), Some(Duration::from_secs(2)));
/// assert_eq!(retry_after_from_headers(None, Some("soon")), None);
/// ```
pub fn retry_after_from_headers(retry_after: Option<&str>, retry_after_ms: Option<&str>) -> Option<Duration> {
    retry_after_ms
        .and_then(|v| parse_retry_after_ms(v).ok())
        .or_else(|| retry_after.and_then(|v| parse_retry_after(v).ok()))
}

/// Whether, and after how long, a client may retry a request that a kvgate server answered with
/// `status`, given the answer's `Retry-After` and `retry-after-ms` header values (as
/// [`retry_after_from_headers`] reads them): `Some(hint)` — retry, no earlier than `hint` — only for a
/// `429` or `503` that carries a hint; `None` — the answer is final, do not retry — for everything else.
///
/// This is the contract between kvgate servers and their clients, and it needs no header of its own: a
/// kvgate server (the gateway, or a service answering with `kvgate::http::rejection_response`) sends
/// `Retry-After` and `retry-after-ms` with every refusal that a later try can overcome, and leaves both
/// out when retrying is pointless — the server is closing, or the request's own deadline has already
/// passed, so that a retry would only add load for an answer nobody waits for any more. A `503` without
/// a hint is therefore final, even though a generic client would retry it.
///
/// A hint that does not parse counts as absent: a client that cannot read the server's advice stops
/// instead of guessing. Other statuses (a `502` from a proxy, a transport error) are outside this
/// contract; this function calls them final, and a client that wants to retry them decides so itself.
///
/// # Examples
///
/// ```
/// use kvgate::retry::retry_after_for_status;
/// use std::time::Duration;
///
/// assert_eq!(retry_after_for_status(503, Some("2"), Some("1500")), Some(Duration::from_millis(1500)));
/// assert_eq!(retry_after_for_status(429, Some("1"), None), Some(Duration::from_secs(1)));
/// assert_eq!(retry_after_for_status(503, None, None), None); // closing, or the deadline has passed
/// assert_eq!(retry_after_for_status(413, Some("1"), None), None); // too large: retrying cannot help
/// ```
pub fn retry_after_for_status(
    status: u16,
    retry_after: Option<&str>,
    retry_after_ms: Option<&str>,
) -> Option<Duration> {
    match status {
        429 | 503 => retry_after_from_headers(retry_after, retry_after_ms),
        _ => None,
    }
}

/// `value` — digits, optionally a `.` and more digits — in units of `unit_millis` (1000 for seconds, 1 for
/// milliseconds), as whole milliseconds rounded up; saturating.
fn decimal_millis(value: &str, unit_millis: u64) -> Result<u64, ParseRetryAfterError> {
    let (whole, fraction) = match value.split_once('.') {
        None => (value, None),
        Some((whole, fraction)) => (whole, Some(fraction)),
    };
    let mut millis = parse_digits(whole)?.saturating_mul(unit_millis);
    if let Some(fraction) = fraction {
        if fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ParseRetryAfterError::Invalid);
        }
        // The fraction digits that are whole milliseconds (three for seconds, none for milliseconds); any
        // non-zero digit after them rounds up.
        let exact = if unit_millis == 1000 { 3 } else { 0 };
        let digits = fraction.as_bytes();
        let head = digits.iter().chain(b"000").take(exact).fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        let round_up = digits.iter().skip(exact).any(|&d| d != b'0');
        millis = millis.saturating_add(head).saturating_add(u64::from(round_up));
    }
    Ok(millis)
}

fn parse_digits(value: &str) -> Result<u64, ParseRetryAfterError> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseRetryAfterError::Invalid);
    }
    // All digits: the only failure left is overflow, which saturates (a hint of "forever").
    Ok(value.parse().unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn header_values_parse() {
        assert_eq!(parse_retry_after("0"), Ok(Duration::ZERO));
        assert_eq!(parse_retry_after("120"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("99999999999999999999999"), Ok(Duration::from_millis(u64::MAX)));
        assert_eq!(parse_retry_after("1.5"), Ok(1500 * MS));
        assert_eq!(parse_retry_after("0.0001"), Ok(MS));
        assert_eq!(parse_retry_after("2.000"), Ok(2000 * MS));
        // A date an hour from now, in all three HTTP-date formats, is an hour.
        let now = std::time::UNIX_EPOCH + Duration::from_secs(946_681_199); // Fri, 31 Dec 1999 22:59:59 GMT
        for date in ["Fri, 31 Dec 1999 23:59:59 GMT", "Friday, 31-Dec-99 23:59:59 GMT", "Fri Dec 31 23:59:59 1999"] {
            assert_eq!(parse_retry_after_at(date, now), Ok(Duration::from_secs(3600)), "{date}");
            assert_eq!(retry_after_from_headers(Some(date), None).map(|_| ()), Some(()), "{date}");
        }
        // A date already past is "now".
        assert_eq!(parse_retry_after_at("Fri, 31 Dec 1999 21:00:00 GMT", now), Ok(Duration::ZERO));
        for bad in ["", "-1", "soon", "+3", "1.", ".5", "Fri, 32 Dec 1999 23:59:59 GMT"] {
            assert_eq!(parse_retry_after(bad), Err(ParseRetryAfterError::Invalid), "{bad:?}");
        }
        assert_eq!(parse_retry_after_ms("1500"), Ok(1500 * MS));
        assert_eq!(parse_retry_after_ms("1500.0"), Ok(1500 * MS));
        assert_eq!(parse_retry_after_ms("1500.2"), Ok(1501 * MS));
        for bad in ["", "1.", ".5", "x", "-3", "1e3"] {
            assert_eq!(parse_retry_after_ms(bad), Err(ParseRetryAfterError::Invalid), "{bad:?}");
        }
    }

    #[test]
    fn only_hinted_429_and_503_are_worth_retrying() {
        assert_eq!(retry_after_for_status(503, Some("1"), None), Some(Duration::from_secs(1)));
        assert_eq!(retry_after_for_status(429, None, Some("250")), Some(250 * MS));
        assert_eq!(retry_after_for_status(503, Some("0"), None), Some(Duration::ZERO));
        // No hint, or one that does not parse: final.
        for (retry_after, retry_after_ms) in
            [(None, None), (Some("soon"), None), (None, Some("-1")), (Some(""), Some("x"))]
        {
            assert_eq!(retry_after_for_status(503, retry_after, retry_after_ms), None);
            assert_eq!(retry_after_for_status(429, retry_after, retry_after_ms), None);
        }
        // Other statuses are final, hint or not.
        for status in [0, 200, 301, 400, 408, 413, 500, 502, 504, u16::MAX] {
            assert_eq!(retry_after_for_status(status, Some("1"), Some("1000")), None, "{status}");
        }
    }
}
