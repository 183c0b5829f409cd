//! Time-to-first-token deadlines: the gateway's default (`ttft_deadline`) and the header a request may
//! shorten it with.
//!
//! A request with a deadline is refused at once (`503` with a `Retry-After` from the predicted drain)
//! when the front admission predicts it would start later than the deadline, and a waiting request whose
//! deadline becomes unreachable leaves the queue early, instead of waiting and then failing (see
//! [`kvgate::Request::ttft_deadline`]); what is left of the deadline bounds its wait in the dispatcher's
//! line too ([`crate::gate`]). The deadline counts from the moment the request is admitted, that is once
//! its body has been read, and is a deadline for the start: the engine's prefill comes after it.

use crate::units::parse_duration;
use std::time::Duration;

/// The header a request may set or shorten its start deadline with (`500ms`, `2s`, a bare number is
/// milliseconds).
pub const TTFT_DEADLINE_HEADER: &str = "x-kvgate-ttft-deadline";
const TTFT_DEADLINE: http::HeaderName = http::HeaderName::from_static(TTFT_DEADLINE_HEADER);

/// The longest deadline the header accepts.
pub const MAX_TTFT_DEADLINE: Duration = Duration::from_secs(60 * 60);

/// The start deadline of a request: the shorter of the gateway's `default` and the request's
/// [`TTFT_DEADLINE_HEADER`]. A client can only make its own request more impatient: a header longer
/// than the default leaves the default.
///
/// # Errors
///
/// A message naming the header when its value is not a duration, is zero, or is over
/// [`MAX_TTFT_DEADLINE`].
///
/// # Examples
///
/// ```
/// use kvgate_gateway::deadline::request_ttft_deadline;
/// use std::time::Duration;
///
/// let mut headers = http::HeaderMap::new();
/// assert_eq!(request_ttft_deadline(Some(Duration::from_secs(5)), &headers), Ok(Some(Duration::from_secs(5))));
/// headers.insert("x-kvgate-ttft-deadline", "1500ms".parse().unwrap());
/// assert_eq!(request_ttft_deadline(Some(Duration::from_secs(5)), &headers), Ok(Some(Duration::from_millis(1500))));
/// assert_eq!(request_ttft_deadline(None, &headers), Ok(Some(Duration::from_millis(1500))));
/// headers.insert("x-kvgate-ttft-deadline", "9s".parse().unwrap());
/// assert_eq!(request_ttft_deadline(Some(Duration::from_secs(5)), &headers), Ok(Some(Duration::from_secs(5))));
/// headers.insert("x-kvgate-ttft-deadline", "soon".parse().unwrap());
/// assert!(request_ttft_deadline(None, &headers).is_err());
/// ```
pub fn request_ttft_deadline(default: Option<Duration>, headers: &http::HeaderMap) -> Result<Option<Duration>, String> {
    let Some(value) = headers.get(TTFT_DEADLINE) else { return Ok(default) };
    let text = value.to_str().map_err(|_| format!("{TTFT_DEADLINE_HEADER} must be ASCII"))?;
    let asked =
        parse_duration(text, MAX_TTFT_DEADLINE).map_err(|reason| format!("{TTFT_DEADLINE_HEADER}: {reason}"))?;
    if asked.is_zero() {
        return Err(format!("{TTFT_DEADLINE_HEADER} must be more than 0"));
    }
    Ok(Some(default.map_or(asked, |d| d.min(asked))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &[u8]) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        headers.insert(TTFT_DEADLINE_HEADER, http::HeaderValue::from_bytes(value).unwrap());
        headers
    }

    #[test]
    fn the_header_sets_or_shortens_and_bad_values_are_refused() {
        assert_eq!(request_ttft_deadline(None, &http::HeaderMap::new()), Ok(None));
        assert_eq!(request_ttft_deadline(None, &headers(b"250")), Ok(Some(Duration::from_millis(250))));
        assert_eq!(
            request_ttft_deadline(Some(Duration::from_secs(1)), &headers(b"2s")),
            Ok(Some(Duration::from_secs(1)))
        );
        for bad in [&b"0"[..], b"0ms", b"-1s", b"2h", b"NaN", b"1e400", b"\xff"] {
            let refused = request_ttft_deadline(Some(Duration::from_secs(1)), &headers(bad));
            assert!(refused.as_ref().is_err_and(|m| m.contains(TTFT_DEADLINE_HEADER)), "{bad:?}: {refused:?}");
        }
    }
}
