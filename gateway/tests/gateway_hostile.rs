//! The gateway against hostile or careless clients and upstreams, over real sockets on loopback: a
//! client that stops reading, slow headers and bodies, too many connections, queued bodies filling
//! memory, bodies that ask an engine for more than was reserved or hide prompt text in tools, upstream
//! addresses in error bodies, an upstream's own busy answers, methods other than POST, oversized headers,
//! and shutdown.
//!
//! Every wait is a bounded loop (`eventually`) or a read with a generous cap; no assertion is about
//! how long something took.

use bytes::Bytes;
use futures::StreamExt;
use kvgate_gateway::{BackendConfig, Config, Gateway};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Generous cap on every wait: far beyond what any step needs, only there so that a bug fails the test
/// instead of hanging it.
const CAP: Duration = Duration::from_secs(20);

async fn start(gateway: &Gateway) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kvgate_gateway::serve(listener, gateway.clone()));
    addr
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(CAP).build().unwrap()
}

fn sim(max_in_flight: usize, kv_tokens: u64) -> Config {
    Config {
        backend: BackendConfig::Simulated { tokens_per_sec: 200.0 },
        max_in_flight,
        kv_tokens: Some(kv_tokens),
        ..Config::default()
    }
}

fn chat(text: &str, max_tokens: u32, stream: bool) -> Value {
    json!({ "stream": stream, "max_tokens": max_tokens, "messages": [{ "role": "user", "content": text }] })
}

/// Polls `f` every 10 ms until it holds or [`CAP`] passes.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < CAP {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f()
}

/// Reads until the peer closes the connection (or [`CAP`]): everything it sent.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(CAP, stream.read_to_end(&mut out)).await;
    out
}

/// A mock OpenAI-compatible upstream answering every request with `answer(body)`, recording the bodies.
async fn upstream<F>(answer: F) -> (SocketAddr, Arc<Mutex<Vec<Value>>>)
where
    F: Fn(&Value) -> axum::response::Response + Clone + Send + Sync + 'static,
{
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&bodies);
    let handler = move |body: Bytes| {
        let answer = answer.clone();
        let seen = Arc::clone(&seen);
        async move {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let response = answer(&body);
            seen.lock().unwrap().push(body);
            response
        }
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(handler.clone()))
        .route("/v1/completions", axum::routing::post(handler));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, bodies)
}

fn proxy(upstream: String) -> Config {
    Config {
        backend: BackendConfig::Upstream(upstream),
        upstream_timeout: Duration::from_secs(2),
        max_in_flight: 1,
        kv_tokens: Some(100_000),
        ..Config::default()
    }
}

/// Defect: a client that stops reading held its permit for ever. The upstream streams 32 MB at once; the
/// client (a 4 KiB receive window) reads nothing. The send deadline closes the connection and the
/// permit comes back; the next client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_loses_its_permit_after_the_send_timeout() {
    let (upstream_addr, _) = upstream(|_| {
        let chunk = format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n", "x".repeat(8000));
        let events = futures::stream::iter((0..4000).map(move |_| Ok::<_, std::convert::Infallible>(chunk.clone())));
        ([("content-type", "text/event-stream")], axum::body::Body::from_stream(events)).into_response()
    })
    .await;
    let mut config = proxy(format!("http://{upstream_addr}"));
    config.send_timeout = Duration::from_millis(500);
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;

    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    let body = chat("stream a lot", 100, true).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stalled.write_all(request.as_bytes()).await.unwrap();
    assert!(eventually(|| gateway.admission().snapshot().in_flight == 1).await, "never admitted");
    // The client reads nothing from now on.
    let released = eventually(|| gateway.admission().snapshot().in_flight == 0).await;
    assert!(released, "a client that stopped reading still holds the only slot");
    let next = client().post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 5, false)).send().await;
    assert_eq!(next.unwrap().status(), 200, "the next client is served");
    drop(stalled);
}

use axum::response::IntoResponse;

/// Defect: headers trickled at a byte a second lived for ever. They get a 408 and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_headers_get_a_408_and_the_connection_closes() {
    let mut config = sim(4, 10_000);
    config.header_timeout = Duration::from_millis(500);
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let trickle = async {
        for byte in b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n".iter().cycle().take(10_000) {
            if slow.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let _ = tokio::time::timeout(CAP, trickle).await;
    let answer = String::from_utf8_lossy(&read_to_close(&mut slow).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("header_timeout"), "{answer}");
}

/// A request pipelined behind an answered one and cut short by the header deadline gets its 408 too (the
/// answer to the first request does not make the connection look idle), and an idle keep-alive
/// connection is closed without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_request_cut_short_gets_a_408_and_an_idle_connection_none() {
    let mut config = sim(4, 10_000);
    config.header_timeout = Duration::from_millis(500);
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let mut pipelined = TcpStream::connect(addr).await.unwrap();
    pipelined
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\nPOST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&read_to_close(&mut pipelined).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    assert!(answer.contains("HTTP/1.1 408"), "the request cut short got no 408: {answer:?}");
    // Idle after an answer, also with the empty line a client may send after a request (RFC 9112, 2.2).
    for request in ["GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n", "GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n\r\n"] {
        let mut idle = TcpStream::connect(addr).await.unwrap();
        idle.write_all(request.as_bytes()).await.unwrap();
        let answer = String::from_utf8_lossy(&read_to_close(&mut idle).await).into_owned();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert!(!answer.contains("408"), "an idle keep-alive connection was told its request timed out: {answer:?}");
    }
}

/// Defect: a body that stops half-way held its connection for ever. It gets a 408 after the body
/// deadline, nothing is reserved, and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stops_half_way_gets_a_408() {
    let mut config = sim(4, 10_000);
    config.body_timeout = Duration::from_millis(500);
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 200\r\n\r\n";
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(br#"{"messages":[{"role":"user","content":"#).await.unwrap();
    let answer = String::from_utf8_lossy(&read_to_close(&mut slow).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("body_timeout"), "{answer}");
    let s = gateway.admission().snapshot();
    assert_eq!((s.admitted, s.in_flight), (0, 0));
    assert_eq!(gateway.buffered_bytes(), 0, "the body budget came back");
}

/// Defect: connections were unlimited. At the cap the gateway stops accepting: a third client is served
/// only after one of two idle connections was closed by the header deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let mut config = sim(4, 10_000);
    config.max_connections = 2;
    config.header_timeout = Duration::from_millis(800);
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let mut idle = Vec::new();
    for _ in 0..2 {
        let conn = TcpStream::connect(addr).await.unwrap();
        conn.try_write(b"POST").unwrap(); // a request that never completes
        idle.push(conn);
    }
    // Queued in the backlog until a slot frees: served only after the header deadline closed an idle one.
    let third = client().get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(third.status(), 200);
    // The server closed an idle connection before it accepted the third; on loopback its end-of-stream has
    // arrived by the time the third's answer has.
    let closed = idle.iter().filter(|conn| closed_by_server(conn)).count();
    assert!(closed >= 1, "the third connection was served while both slots were taken");
}

/// Whether the server has closed `conn` (what it sent before, a 408, is read and dropped).
fn closed_by_server(conn: &TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        match conn.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return false,
            Err(_) => return true, // reset
        }
    }
}

/// Defect: a queued request held ~17x its body. Now a request holds one copy of what it forwards, and
/// the bodies held at once are bounded: past `--max-buffered-bytes`, 503 `memory_full` + Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_bodies_are_bounded_in_memory() {
    let mut config = sim(1, 10_000_000);
    config.max_body_bytes = 4 << 20;
    config.max_buffered_bytes = 9 << 20;
    config.max_queue_wait = Duration::from_secs(60);
    config.backend = BackendConfig::Simulated { tokens_per_sec: 5.0 };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    // One long request holds the only slot.
    let running = http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 1000, true)).send().await;
    let running = running.unwrap();
    assert_eq!(running.status(), 200);
    // Two bodies of 3.8 MB each wait behind it.
    let big = chat(&"word ".repeat(760_000), 10, false);
    let size = big.to_string().len();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let (http, big) = (http.clone(), big.clone());
            tokio::spawn(async move { http.post(format!("http://{addr}/v1/chat/completions")).json(&big).send().await })
        })
        .collect();
    assert!(eventually(|| gateway.admission().snapshot().queued == 2).await, "the two bodies never queued");
    let held = gateway.buffered_bytes();
    assert!(held <= 2 * (size + 4096), "two queued requests of {size} bytes hold {held} bytes");
    // A third does not fit in the budget: 503 at once, with a hint.
    let third = http.post(format!("http://{addr}/v1/chat/completions")).json(&big).send().await.unwrap();
    assert_eq!(third.status(), 503);
    assert!(third.headers().contains_key("retry-after"));
    let error: Value = third.json().await.unwrap();
    assert_eq!(error["error"]["code"], "memory_full");
    drop(running);
    for task in waiting {
        let response = tokio::time::timeout(CAP, task).await.unwrap().unwrap().unwrap();
        assert_eq!(response.status(), 200);
        response.bytes().await.unwrap();
    }
    assert!(eventually(|| gateway.buffered_bytes() == 0).await, "{} bytes still held", gateway.buffered_bytes());
}

/// Defect: the body was forwarded as is, so an engine could generate more than was reserved. Every
/// limit the engines read says the reservation; several sequences are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_is_told_to_generate_at_most_the_reservation() {
    let (upstream_addr, bodies) = upstream(|_| {
        axum::Json(json!({"choices": [{"message": {"content": "ok"}}], "usage": {"completion_tokens": 1}}))
            .into_response()
    })
    .await;
    let gateway = Gateway::new(proxy(format!("http://{upstream_addr}"))).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let body = json!({
        "max_completion_tokens": 10, "max_tokens": 5000, "n_predict": 9000, "max_new_tokens": 7000,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let ok = http.post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let completions = json!({"prompt": "hi", "n_predict": -1});
    let ok = http.post(format!("http://{addr}/v1/completions")).json(&completions).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    {
        let bodies = bodies.lock().unwrap();
        for field in ["max_completion_tokens", "max_tokens", "n_predict", "max_new_tokens"] {
            assert_eq!(bodies[0][field], 10, "{field}: {}", bodies[0]);
        }
        assert_eq!(bodies[1]["max_tokens"], 512, "the default reservation");
        assert_eq!(bodies[1]["n_predict"], 512, "-1 (no limit) becomes the reservation");
    }
    for extra in [json!({"n": 2}), json!({"best_of": 2}), json!({"use_beam_search": true})] {
        let mut body = json!({"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let refused = http.post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.unwrap();
        assert_eq!(refused.status(), 400, "{extra}");
    }
    assert_eq!(bodies.lock().unwrap().len(), 2, "nothing refused reached the engine");
}

/// Defect: text outside `messages[].content` was free: 810 KB of tools were admitted as 22 tokens under a
/// 10,000-token budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_text_in_tools_and_tool_calls_is_counted() {
    let gateway = Gateway::new(sim(4, 10_000)).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let tools: Vec<Value> = (0..100)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}"), "description": "d".repeat(8_000), "parameters": {"type": "object"}}}))
        .collect();
    let body = json!({"max_tokens": 10, "tools": tools, "messages": [{"role": "user", "content": "hi"}]});
    assert!(body.to_string().len() > 800_000);
    let refused = http.post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(refused.status(), 413, "810 KB of tools fit a 10,000-token budget?");
    let arguments = json!({"max_tokens": 10, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "a".repeat(80_000)}}]},
        {"role": "tool", "tool_call_id": "c", "name": "n".repeat(10), "content": "ok"},
    ]});
    let refused = http.post(format!("http://{addr}/v1/chat/completions")).json(&arguments).send().await.unwrap();
    assert_eq!(refused.status(), 413, "80 KB of tool-call arguments are 20,000 tokens");
    assert_eq!(gateway.admission().snapshot().admitted, 0);
}

/// Defect: the upstream URL, credentials included, appeared in 502/504 bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_bodies_never_name_the_upstream() {
    let dead = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let hung = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hung_addr = hung.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = hung.accept().await {
            held.push(socket); // accepts, never answers
        }
    });
    for (addr, status) in [(dead_addr, 502), (hung_addr, 504)] {
        let mut config = proxy(format!("http://admin:s3cret-token@{addr}"));
        config.upstream_timeout = Duration::from_millis(300);
        let gateway = Gateway::new(config).unwrap();
        let gateway_addr = start(&gateway).await;
        let response = client()
            .post(format!("http://{gateway_addr}/v1/chat/completions"))
            .json(&chat("hi", 5, false))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status);
        let text = response.text().await.unwrap();
        for secret in ["s3cret", "admin", &addr.port().to_string(), "127.0.0.1", "http://"] {
            assert!(!text.contains(secret), "{status} body names the upstream ({secret}): {text}");
        }
    }
}

/// Defect: an upstream's own 503 + Retry-After became a 502 without the hint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_busy_answer_passes_its_status_and_hint_through() {
    let (upstream_addr, _) = upstream(|body| {
        if body["model"] == "json" {
            (
                http::StatusCode::TOO_MANY_REQUESTS,
                [("retry-after-ms", "1500")],
                axum::Json(json!({"error": {"message": "slow down"}})),
            )
                .into_response()
        } else {
            (http::StatusCode::SERVICE_UNAVAILABLE, [("retry-after", "7")], "Loading model").into_response()
        }
    })
    .await;
    let gateway = Gateway::new(proxy(format!("http://{upstream_addr}"))).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let text =
        http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 5, false)).send().await.unwrap();
    assert_eq!(text.status(), 503);
    assert_eq!(text.headers()["retry-after"], "7");
    let error: Value = text.json().await.unwrap();
    assert_eq!(error["error"]["code"], "upstream_busy");
    let mut body = chat("hi", 5, false);
    body["model"] = json!("json");
    let json = http.post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(json.status(), 429);
    assert_eq!(json.headers()["retry-after-ms"], "1500");
    assert_eq!(kvgate::http::retry_after(json.headers()), Some(Duration::from_millis(1500)));
    assert!(eventually(|| gateway.admission().snapshot().in_flight == 0).await);
}

/// Defect: GET and other methods were parsed and admitted before the 405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_methods_get_405_before_admission() {
    let gateway = Gateway::new(sim(1, 10_000)).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    // The only slot is taken: a method that reached admission would wait or be refused with 503.
    let running = http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 500, true)).send().await;
    let running = running.unwrap();
    for method in [reqwest::Method::GET, reqwest::Method::PUT, reqwest::Method::DELETE] {
        let response = http
            .request(method.clone(), format!("http://{addr}/v1/chat/completions"))
            .json(&chat("hi", 5, false))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{method}");
    }
    let s = gateway.admission().snapshot();
    assert_eq!((s.admitted, s.rejected.total(), s.queued), (1, 0, 0), "{s:?}");
    drop(running);
}

/// Defect: shutdown never closed the admission. Now it stops accepting connections, waiting requests get
/// 503 `closed` with `Retry-After`, running answers finish, and the server stops once they have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_the_admission_and_drains() {
    let mut config = sim(1, 10_000);
    config.max_queue_wait = Duration::from_secs(60);
    config.shutdown_grace = Duration::from_secs(60);
    let gateway = Gateway::new(config).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(kvgate_gateway::serve_until(listener, gateway.clone(), async {
        let _ = stopped.await;
    }));
    let http = client();
    let running = http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 2000, true)).send().await;
    let mut running = running.unwrap().bytes_stream();
    running.next().await.unwrap().unwrap();
    let waiting = {
        let http = http.clone();
        tokio::spawn(async move {
            http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 5, false)).send().await
        })
    };
    assert!(eventually(|| gateway.admission().snapshot().queued == 1).await);
    stop.send(()).unwrap();
    let refused = tokio::time::timeout(CAP, waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"), "a waiting request is told when to come back");
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "closed");
    assert!(gateway.is_closing());
    // No new connection is accepted while the running answer finishes.
    assert!(eventually(|| std::net::TcpStream::connect(addr).is_err()).await, "still accepting after shutdown");
    assert!(!server.is_finished(), "the running answer is still streaming");
    assert!(running.next().await.unwrap().is_ok(), "the running stream goes on after shutdown started");
    drop(running); // the last answer ends
    tokio::time::timeout(CAP, server).await.expect("the server stopped after draining").unwrap().unwrap();
}

/// Without a KV budget, a `max_tokens` of 2^32 - 1 is refused before admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_max_tokens_is_refused_without_a_kv_budget() {
    let gateway = Gateway::new(Config { kv_tokens: None, ..sim(1, 1) }).unwrap();
    let addr = start(&gateway).await;
    let response =
        client().post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", u32::MAX, false)).send().await;
    let response = response.unwrap();
    assert_eq!(response.status(), 413);
    assert_eq!(response.json::<Value>().await.unwrap()["error"]["code"], "max_tokens_too_large");
    assert_eq!(gateway.admission().snapshot().admitted, 0);
}

/// Headers are bounded: more than 100 header fields get a 431, and a head past hyper's buffer (about
/// 400 KiB) is refused without being held; neither reaches admission, and the gateway serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_or_too_large_headers_are_refused_before_admission() {
    let gateway = Gateway::new(sim(4, 10_000)).unwrap();
    let addr = start(&gateway).await;
    let body = chat("hi", 2, false).to_string();
    let head = |extra: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\n{extra}\r\n{body}",
            body.len()
        )
    };
    let many: String = (0..200).map(|i| format!("x-filler-{i}: {i}\r\n")).collect();
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(head(&many).as_bytes()).await.unwrap();
    let answer = String::from_utf8_lossy(&read_to_close(&mut conn).await).into_owned();
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");

    let huge = format!("x-filler: {}\r\n", "a".repeat(500 << 10));
    let mut conn = TcpStream::connect(addr).await.unwrap();
    let _ = conn.write_all(head(&huge).as_bytes()).await; // the gateway may close before it is all sent
    let answer = String::from_utf8_lossy(&read_to_close(&mut conn).await).into_owned();
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer:?}");

    assert_eq!(gateway.admission().snapshot().admitted, 0, "nothing reached admission");
    let served = client().post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 2, false)).send().await;
    assert_eq!(served.unwrap().status(), 200);
}
