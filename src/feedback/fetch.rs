//! A small blocking HTTP/1.1 GET for `http://` metrics endpoints on the standard library alone — for
//! programs without an HTTP client. A gateway that has one (hyper, reqwest) fetches with it and hands the
//! body to [`EngineMetrics::parse`](super::EngineMetrics::parse).
//!
//! # What it does
//! One request per call on a fresh connection (`Connection: close`): resolve, connect within the
//! timeout (each resolved address in turn), send, read until the server closes, the body's length is
//! reached or `MAX_BODY` bytes (8 MiB) are exceeded. Every read and write is bounded by the timeout, so a
//! dead server cannot hang the caller for longer than a few timeouts; a server dripping one byte per
//! timeout can (call it from a thread you can abandon, e.g. tokio's `spawn_blocking`, or use your own
//! client with a total deadline). `Content-Length` and `chunked` bodies are understood; no TLS, no
//! redirects, no compression (it asks for `identity`).

use super::error::FeedbackError;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Largest response accepted, headers included: vLLM's metrics with their histograms are a few hundred
/// kilobytes per engine.
pub const MAX_BODY: usize = 8 << 20;

/// Fetches the body of `url` (an `http://host[:port][/path]` URL; the path defaults to `/metrics`), with
/// every connect, read and write bounded by `timeout`.
///
/// # Errors
///
/// [`FeedbackError::Url`] for a URL that is not plain `http://host[:port][/path]`,
/// [`FeedbackError::Fetch`] for a failed connection or I/O (a timeout included), [`FeedbackError::Status`]
/// for a status other than 200, [`FeedbackError::Http`] for a malformed response, and
/// [`FeedbackError::TooLarge`] beyond [`MAX_BODY`].
///
/// # Examples
///
/// ```
/// use kvgate::feedback::{EngineMetrics, fetch_metrics};
/// use std::io::{Read, Write};
/// use std::time::Duration;
///
/// // A one-shot server on loopback standing in for vLLM.
/// let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
/// let url = format!("http://{}/metrics", listener.local_addr()?);
/// let server = std::thread::spawn(move || -> std::io::Result<()> {
///     let (mut stream, _) = listener.accept()?;
///     let mut request = [0u8; 1024];
///     let _ = stream.read(&mut request)?;
///     let body = "vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n";
///     write!(stream, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len())
/// });
/// let text = fetch_metrics(&url, Duration::from_secs(5))?;
/// assert_eq!(EngineMetrics::parse(&text)?.kv_cache_usage, Some(0.5));
/// server.join().unwrap()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn fetch_metrics(url: &str, timeout: Duration) -> Result<String, FeedbackError> {
    let target = Target::parse(url)?;
    let fail = |source: std::io::Error| FeedbackError::Fetch { url: url.to_owned(), source };
    if timeout.is_zero() {
        return Err(FeedbackError::Url { url: url.to_owned(), reason: "the timeout is zero".into() });
    }
    let mut last = None;
    let mut stream = None;
    for address in (target.host, target.port).to_socket_addrs().map_err(fail)? {
        match TcpStream::connect_timeout(&address, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut stream = match (stream, last) {
        (Some(stream), _) => stream,
        (None, Some(error)) => return Err(fail(error)),
        (None, None) => {
            return Err(FeedbackError::Url { url: url.to_owned(), reason: "the host resolves to no address".into() });
        }
    };
    stream.set_read_timeout(Some(timeout)).map_err(fail)?;
    stream.set_write_timeout(Some(timeout)).map_err(fail)?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nAccept: text/plain;version=0.0.4, */*;q=0.1\r\nAccept-Encoding: identity\r\n\
         User-Agent: kvgate/{}\r\nConnection: close\r\n\r\n",
        target.path,
        target.authority,
        env!("CARGO_PKG_VERSION")
    );
    stream.write_all(request.as_bytes()).map_err(fail)?;
    let response = read_response(&mut stream, url).map_err(|e| match e {
        ReadError::Io(source) => fail(source),
        ReadError::Feedback(e) => e,
    })?;
    decode(&response, url)
}

/// `http://host[:port][/path]`, split.
struct Target<'a> {
    host: &'a str,
    port: u16,
    /// `host[:port]` as given, for the `Host` header.
    authority: &'a str,
    path: &'a str,
}

impl<'a> Target<'a> {
    fn parse(url: &'a str) -> Result<Self, FeedbackError> {
        let bad = |reason: &str| FeedbackError::Url { url: url.to_owned(), reason: reason.to_owned() };
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            bad("only plain http:// is supported here; fetch https with your own client and call EngineMetrics::parse")
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/metrics"),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("expected http://host[:port][/path]"));
        }
        if path.chars().any(|c| c.is_ascii_whitespace() || c.is_ascii_control()) {
            return Err(bad("the path holds spaces or control characters"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("an IPv6 address is not closed by `]`"))?;
            match after.strip_prefix(':') {
                Some(port) => (host, port),
                None if after.is_empty() => (host, "80"),
                None => return Err(bad("expected `:port` after the IPv6 address")),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, port),
                None => (authority, "80"),
            }
        };
        let port = port.parse::<u16>().map_err(|_| bad("the port is not a number from 0 to 65535"))?;
        if host.is_empty() {
            return Err(bad("the host is empty"));
        }
        Ok(Self { host, port, authority, path })
    }
}

enum ReadError {
    Io(std::io::Error),
    Feedback(FeedbackError),
}

/// Reads the response until the server closes the connection, the announced body is complete, or the
/// limit is passed.
fn read_response(stream: &mut TcpStream, url: &str) -> Result<Vec<u8>, ReadError> {
    let mut response = Vec::with_capacity(64 << 10);
    let mut buf = [0u8; 16 << 10];
    loop {
        let n = match stream.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ReadError::Io(e)),
        };
        if n == 0 {
            return Ok(response);
        }
        if response.len() + n > MAX_BODY {
            return Err(ReadError::Feedback(FeedbackError::TooLarge { url: url.to_owned(), limit: MAX_BODY }));
        }
        response.extend_from_slice(&buf[..n]);
        if complete(&response) {
            return Ok(response);
        }
    }
}

/// Whether `response` holds its headers and a body of the announced `Content-Length`.
fn complete(response: &[u8]) -> bool {
    let Some(end) = find(response, b"\r\n\r\n") else { return false };
    let head = String::from_utf8_lossy(&response[..end]);
    header(&head, "content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|length| response.len() - (end + 4) >= length)
}

fn decode(response: &[u8], url: &str) -> Result<String, FeedbackError> {
    let bad = |reason: String| FeedbackError::Http { url: url.to_owned(), reason };
    let end = find(response, b"\r\n\r\n").ok_or_else(|| bad("no end of headers".into()))?;
    let head = std::str::from_utf8(&response[..end]).map_err(|_| bad("headers are not UTF-8".into()))?;
    let status_line = head.lines().next().unwrap_or_default();
    let mut parts = status_line.split_ascii_whitespace();
    let (version, status) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if !version.starts_with("HTTP/1.") {
        return Err(bad(format!("status line {status_line:?}")));
    }
    let status: u16 = status.parse().map_err(|_| bad(format!("status line {status_line:?}")))?;
    if status != 200 {
        return Err(FeedbackError::Status { url: url.to_owned(), status });
    }
    let mut body = &response[end + 4..];
    let chunked;
    if header(head, "transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked")) {
        chunked = dechunk(body).ok_or_else(|| bad("malformed chunked body".into()))?;
        body = &chunked;
    } else if let Some(length) = header(head, "content-length") {
        let length: usize = length.parse().map_err(|_| bad(format!("Content-Length {length:?}")))?;
        if body.len() < length {
            return Err(bad(format!("the body ended after {} of {length} bytes", body.len())));
        }
        body = &body[..length];
    }
    let text = std::str::from_utf8(body).map_err(|_| bad("the body is not UTF-8 text".into()))?;
    Ok(text.to_owned())
}

/// The value of header `name` (lower case), trimmed.
fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
    })
}

/// Decodes a `chunked` body (extensions and trailers ignored); `None` if malformed or cut short.
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(body.len());
    loop {
        let line_end = find(body, b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size_text = size_text.split(';').next()?.trim();
        let size = usize::from_str_radix(size_text, 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        if body.len() < size + 2 || &body[size..size + 2] != b"\r\n" {
            return None;
        }
        out.extend_from_slice(&body[..size]);
        body = &body[size + 2..];
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        let t = Target::parse("http://10.0.0.5:8000/metrics").unwrap();
        assert_eq!((t.host, t.port, t.authority, t.path), ("10.0.0.5", 8000, "10.0.0.5:8000", "/metrics"));
        let t = Target::parse("http://vllm").unwrap();
        assert_eq!((t.host, t.port, t.path), ("vllm", 80, "/metrics"));
        let t = Target::parse("http://[::1]:30000/metrics?x=1").unwrap();
        assert_eq!((t.host, t.port, t.path), ("::1", 30000, "/metrics?x=1"));
        for bad in
            ["https://x/metrics", "x:80", "http://", "http://:80/", "http://h:99999/", "http://u@h/", "http://[::1/"]
        {
            assert!(matches!(Target::parse(bad), Err(FeedbackError::Url { .. })), "{bad}");
        }
    }

    #[test]
    fn bodies_are_decoded() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcdEXTRA";
        assert_eq!(decode(plain, "u").unwrap(), "abcd");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        assert_eq!(decode(chunked, "u").unwrap(), "abcde");
        let closed = b"HTTP/1.0 200 OK\r\n\r\nuntil close";
        assert_eq!(decode(closed, "u").unwrap(), "until close");
        assert!(matches!(decode(b"HTTP/1.1 503 Busy\r\n\r\n", "u"), Err(FeedbackError::Status { status: 503, .. })));
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort"[..],
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            b"SSH-2.0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n",
        ] {
            assert!(matches!(decode(bad, "u"), Err(FeedbackError::Http { .. })), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(complete(plain));
        assert!(!complete(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort"));
    }
}
