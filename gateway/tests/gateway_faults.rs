//! The gateway's proxy mode against broken upstreams: one that hangs without answering, one that resets
//! or closes the connection, one that answers garbage (not HTTP, HTTP with a body that is not JSON, an
//! SSE stream cut mid-event), and one that answers slowly and then stalls mid-stream or mid-body.
//!
//! For each, the client gets a 502 (bad upstream) or 504 (upstream timeout) with an OpenAI-style JSON
//! error — or, once a stream has started, an SSE error event and the end of the stream — never before the
//! upstream timeout (300 ms here) where one is involved, and the permit is returned: the admission's
//! snapshot is back to nothing in flight and no KV held. Every wait is bounded (the client gives up after
//! 10 s, the release check after 20 s); no assertion is about how fast anything was.
//!
//! The upstreams are raw `tokio::net::TcpListener`s on loopback, so they can misbehave below HTTP.

use futures::StreamExt;
use kvgate_gateway::{BackendConfig, Config, Gateway};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

const UPSTREAM_TIMEOUT: Duration = Duration::from_millis(300);

/// What a mock upstream does with each request, after reading it.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Never answers; holds the connection until the gateway closes it.
    Hang,
    /// Resets the connection (RST).
    Reset,
    /// Closes the connection without a word (FIN).
    Close,
    /// Answers bytes that are not HTTP.
    NotHttp,
    /// A `200` whose `application/json` body is HTML.
    NotJson,
    /// A `500` with a plain-text body.
    ServerErrorText,
    /// An SSE stream: two events, half of a third, then the connection is closed mid-body.
    SseCut,
    /// Headers after 100 ms, three SSE events 100 ms apart, then silence until the gateway leaves.
    SseStall,
    /// A JSON response whose headers promise 100 bytes; 10 arrive, then silence.
    BodyStall,
}

/// Writes all of `buf` (tokio's `io-util` extension traits are not among the dev-dependencies).
async fn write_all(socket: &TcpStream, mut buf: &[u8]) {
    while !buf.is_empty() {
        if socket.writable().await.is_err() {
            return;
        }
        match socket.try_write(buf) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return,
        }
    }
}

/// Reads what is there (0: the peer closed the connection).
async fn read(socket: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        socket.readable().await?;
        match socket.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            result => return result,
        }
    }
}

/// Reads one request (headers and a `content-length` body) from `socket`.
async fn read_request(socket: &TcpStream) -> Option<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let headers_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = read(socket, &mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..headers_end]).to_ascii_lowercase();
    let length: usize =
        head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    while buf.len() < headers_end + length {
        let n = read(socket, &mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(())
}

/// Waits until the peer (the gateway) closes the connection (bounded: at most 10 s).
async fn hold_until_closed(socket: &TcpStream) {
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while matches!(read(socket, &mut sink).await, Ok(n) if n > 0) {}
    })
    .await;
}

fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

async fn misbehave(socket: TcpStream, fault: Fault) {
    if read_request(&socket).await.is_none() {
        return;
    }
    const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
    match fault {
        Fault::Hang => hold_until_closed(&socket).await,
        Fault::Reset => {
            let _ = socket.set_zero_linger();
            drop(socket);
        }
        Fault::Close => drop(socket),
        Fault::NotHttp => {
            write_all(&socket, b"SSH-2.0-OpenSSH_9.6\r\n\x00\x01\x02 not http at all\r\n\r\n").await;
        }
        Fault::NotJson => {
            let body = "<html><body>502 Bad Gateway (nginx)</body></html>";
            let answer = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            write_all(&socket, answer.as_bytes()).await;
            hold_until_closed(&socket).await;
        }
        Fault::ServerErrorText => {
            let body = "Internal Server Error";
            let answer = format!(
                "HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            write_all(&socket, answer.as_bytes()).await;
            hold_until_closed(&socket).await;
        }
        Fault::SseCut => {
            let mut out = SSE_HEAD.to_owned();
            out += &chunk("data: {\"chunk\":0}\n\n");
            out += &chunk("data: {\"chunk\":1}\n\ndata: {\"chu");
            write_all(&socket, out.as_bytes()).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            // Dropped without the terminating zero-length chunk: the body is cut short.
        }
        Fault::SseStall => {
            tokio::time::sleep(Duration::from_millis(100)).await;
            write_all(&socket, SSE_HEAD.as_bytes()).await;
            for i in 0..3 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                write_all(&socket, chunk(&format!("data: {{\"chunk\":{i}}}\n\n")).as_bytes()).await;
            }
            hold_until_closed(&socket).await;
        }
        Fault::BodyStall => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\":\"x\",";
            write_all(&socket, head.as_bytes()).await;
            hold_until_closed(&socket).await;
        }
    }
}

/// A loopback upstream that answers every request with `fault`.
async fn start_upstream(fault: Fault) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(misbehave(socket, fault));
        }
    });
    addr
}

/// A gateway in proxy mode in front of `upstream`, on a loopback port.
async fn start_gateway(upstream: SocketAddr) -> (Gateway, SocketAddr) {
    let config = Config {
        backend: BackendConfig::Upstream(format!("http://{upstream}")),
        upstream_timeout: UPSTREAM_TIMEOUT,
        max_in_flight: 4,
        kv_tokens: Some(10_000),
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kvgate_gateway::serve(listener, gateway.clone()));
    (gateway, addr)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(10)).build().unwrap()
}

fn chat(stream: bool) -> Value {
    json!({ "model": "m", "stream": stream, "max_tokens": 64, "messages": [{ "role": "user", "content": "hi" }] })
}

/// The admission comes back to holding nothing (checked every 10 ms, for at most 20 s).
async fn assert_released(gateway: &Gateway, fault: Fault) {
    for _ in 0..2_000 {
        let s = gateway.admission().snapshot();
        if s.in_flight == 0 && s.kv_used == 0 && s.queued == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{fault:?}: permit not released: {:?}", gateway.admission().snapshot());
}

/// Sends one request through a gateway in front of a `fault` upstream; expects `status` with an
/// OpenAI-style error whose `code` is `code`, and the permit back.
async fn expect_error(fault: Fault, stream: bool, status: u16, code: &str) {
    let (gateway, addr) = start_gateway(start_upstream(fault).await).await;
    let response =
        client().post(format!("http://{addr}/v1/chat/completions")).json(&chat(stream)).send().await.unwrap();
    let got = response.status().as_u16();
    let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let body = response.text().await.unwrap();
    assert_eq!(got, status, "{fault:?} (stream {stream}): {body}");
    assert_eq!(content_type.as_deref(), Some("application/json"), "{fault:?}");
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{fault:?}: error is not JSON ({e}): {body}"));
    assert!(!v["error"]["message"].as_str().unwrap_or_default().is_empty(), "{fault:?}: {body}");
    assert_eq!(v["error"]["type"], "upstream_error", "{fault:?}: {body}");
    assert_eq!(v["error"]["code"], code, "{fault:?}: {body}");
    assert_released(&gateway, fault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_upstream_is_a_504_after_the_upstream_timeout() {
    for stream in [false, true] {
        let started = Instant::now();
        expect_error(Fault::Hang, stream, 504, "upstream_timeout").await;
        assert!(started.elapsed() >= UPSTREAM_TIMEOUT, "gave up before the timeout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_or_closed_connection_is_a_502() {
    for stream in [false, true] {
        expect_error(Fault::Reset, stream, 502, "upstream_unreachable").await;
        expect_error(Fault::Close, stream, 502, "upstream_unreachable").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_upstream_is_a_502() {
    expect_error(Fault::NotHttp, false, 502, "upstream_unreachable").await;
    expect_error(Fault::NotHttp, true, 502, "upstream_unreachable").await;
    expect_error(Fault::NotJson, false, 502, "upstream_bad_response").await;
    expect_error(Fault::ServerErrorText, false, 502, "upstream_bad_response").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_before_it_is_complete_is_a_504() {
    expect_error(Fault::BodyStall, false, 504, "upstream_timeout").await;
}

/// Reads a streamed answer to its end; returns the status, the SSE events' data, and how long it took.
async fn read_stream(addr: SocketAddr) -> (u16, Vec<String>, Duration) {
    let started = Instant::now();
    let response = client().post(format!("http://{addr}/v1/chat/completions")).json(&chat(true)).send().await.unwrap();
    let status = response.status().as_u16();
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        body.extend_from_slice(&chunk.expect("the client's stream ends cleanly"));
    }
    let text = String::from_utf8(body).unwrap();
    let events = text.split("\n\n").filter(|e| !e.is_empty()).map(|e| e.to_owned()).collect();
    (status, events, started.elapsed())
}

fn assert_error_event(event: &str, code: &str) {
    let data = event.strip_prefix("data: ").unwrap_or_else(|| panic!("not an SSE data event: {event:?}"));
    let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("error event is not JSON ({e}): {data}"));
    assert_eq!(v["error"]["code"], code, "{data}");
    assert_eq!(v["error"]["type"], "upstream_error", "{data}");
    assert!(!v["error"]["message"].as_str().unwrap_or_default().is_empty(), "{data}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_mid_event_ends_with_an_error_event_and_releases_the_permit() {
    let (gateway, addr) = start_gateway(start_upstream(Fault::SseCut).await).await;
    let (status, events, _) = read_stream(addr).await;
    assert_eq!(status, 200);
    // The whole events are passed on, the half one is not, and an error event ends the stream.
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(events[0], "data: {\"chunk\":0}");
    assert_eq!(events[1], "data: {\"chunk\":1}");
    assert_error_event(&events[2], "upstream_stream_error");
    assert_released(&gateway, Fault::SseCut).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stream_that_stalls_ends_after_the_upstream_timeout_and_releases_the_permit() {
    let (gateway, addr) = start_gateway(start_upstream(Fault::SseStall).await).await;
    let (status, events, elapsed) = read_stream(addr).await;
    assert_eq!(status, 200);
    // Slow (100 ms apart, within the 300 ms timeout) is fine; silence for 300 ms is not.
    assert_eq!(events.len(), 4, "{events:?}");
    for (i, event) in events[..3].iter().enumerate() {
        assert_eq!(event, &format!("data: {{\"chunk\":{i}}}"));
    }
    assert_error_event(&events[3], "upstream_timeout");
    assert!(elapsed >= Duration::from_millis(400) + UPSTREAM_TIMEOUT, "ended before the stall timed out: {elapsed:?}");
    assert_released(&gateway, Fault::SseStall).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_under_concurrency_release_every_permit() {
    // More clients than permits against a hanging upstream: every one is answered (504, or 503/429 when
    // admission turned it away) and nothing stays held.
    let (gateway, addr) = start_gateway(start_upstream(Fault::Hang).await).await;
    let http = client();
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move {
                let response =
                    http.post(format!("http://{addr}/v1/chat/completions")).json(&chat(false)).send().await.unwrap();
                response.status().as_u16()
            })
        })
        .collect();
    for task in tasks {
        let status = task.await.unwrap();
        assert!(matches!(status, 504 | 503 | 429), "status {status}");
    }
    assert_released(&gateway, Fault::Hang).await;
}

#[test]
fn the_upstream_timeout_flag_parses() {
    let args =
        |s: &str| std::iter::once("kvgate-gateway").chain(s.split_whitespace()).map(String::from).collect::<Vec<_>>();
    assert_eq!(Config::default().upstream_timeout, Duration::from_secs(120));
    let config = Config::from_args(args("--upstream http://127.0.0.1:8000 --upstream-timeout 300ms")).unwrap();
    assert_eq!(config.upstream_timeout, Duration::from_millis(300));
    assert_eq!(Config::from_args(args("--upstream-timeout=2m")).unwrap().upstream_timeout, Duration::from_secs(120));
    assert!(Config::from_args(args("--upstream-timeout 0")).is_err());
    assert!(Config::from_args(args("--upstream-timeout soon")).is_err());
}
