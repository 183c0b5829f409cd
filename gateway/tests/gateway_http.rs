//! The gateway example over real HTTP on loopback: overload, the simulated engine's peaks, client
//! disconnects, proxy pass-through and cancellation, malformed requests, `/metrics`, `/v1/models`.
//!
//! The gateway's modules are included from `examples/gateway/app/` and started in-process.

use futures::StreamExt;
use kvgate_gateway::{BackendConfig, Config, Gateway};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Starts `gateway` on a loopback port.
async fn start(gateway: &Gateway) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kvgate_gateway::serve(listener, gateway.clone()));
    addr
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn sim_config(max_in_flight: usize, queue: usize, kv_tokens: u64, tokens_per_sec: f64) -> Config {
    Config {
        backend: BackendConfig::Simulated { tokens_per_sec },
        max_in_flight,
        queue,
        max_queue_wait: Duration::from_secs(2),
        kv_tokens: Some(kv_tokens),
        default_max_tokens: 32,
        ..Config::default()
    }
}

fn chat(text: &str, max_tokens: u32, stream: bool) -> Value {
    json!({ "model": "test", "stream": stream, "max_tokens": max_tokens, "messages": [{ "role": "user", "content": text }] })
}

/// Polls `f` every 10 ms until it holds, for at most `limit`.
async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f()
}

async fn assert_drained(gateway: &Gateway) {
    let drained = eventually(Duration::from_secs(2), || {
        let s = gateway.admission().snapshot();
        let sim = gateway.sim_stats().map_or(0, |s| s.running + s.kv_in_use as usize);
        s.in_flight == 0 && s.kv_used == 0 && s.queued == 0 && sim == 0
    })
    .await;
    assert!(drained, "capacity not returned: {:?} {:?}", gateway.admission().snapshot(), gateway.sim_stats());
}

/// An OpenAI-style error body: `{"error":{"message": non-empty, "type", "code"}}`.
fn assert_error_body(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("error body is not JSON ({e}): {body}"));
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "no error message: {body}");
    assert!(v["error"]["type"].is_string() && v["error"]["code"].is_string(), "{body}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_gets_200_or_429_503_with_retry_after_and_the_engine_stays_within_limits() {
    // 4 running, 16 waiting at most 300 ms, a KV budget that holds about 4 of the requests, 60 requests/s
    // with a burst of 15; 40 clients in 4 waves 50 ms apart (5x what runs), half of them streaming.
    // Expected: some run, some wait and run, some time out waiting (503), some are over the rate (429).
    let mut config = sim_config(4, 16, 1800, 200.0);
    config.rate = Some((60.0, 15));
    config.max_queue_wait = Duration::from_millis(300);
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let mut tasks = Vec::new();
    for i in 0..40u32 {
        if i % 10 == 0 && i > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let http = http.clone();
        // Prompts of 40..400 bytes (10..100 estimated tokens) and 16..400 output tokens.
        let body = chat(&"word ".repeat(8 + (i as usize * 37) % 72), 16 + (i * 97) % 385, i % 2 == 0);
        tasks.push(tokio::spawn(async move {
            let response = http.post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
            let content_type = response.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
            let text = response.text().await.unwrap();
            (status, retry_after, content_type, text)
        }));
    }
    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for task in tasks {
        let (status, retry_after, content_type, body) = task.await.unwrap();
        *by_status.entry(status).or_default() += 1;
        match status {
            200 => assert!(body.contains("data: [DONE]") || body.contains("\"usage\""), "{body}"),
            429 | 503 => {
                let secs: u64 = retry_after.as_deref().expect("429/503 without Retry-After").parse().unwrap();
                assert!(secs >= 1, "Retry-After {secs}");
                assert_eq!(content_type.as_deref(), Some("application/json"));
                assert_error_body(&body);
            }
            other => panic!("unexpected status {other}: {body}"),
        }
    }
    assert!(by_status.get(&200).copied().unwrap_or(0) >= 4, "{by_status:?}");
    assert!(by_status.keys().any(|&s| s != 200), "no overload seen: {by_status:?}");

    let sim = gateway.sim_stats().unwrap();
    eprintln!("statuses {by_status:?}; engine {sim:?}; admission {:?}", gateway.admission().snapshot().rejected);
    assert_eq!(sim.overflows, 0, "{sim:?}");
    assert!(sim.peak_running <= 4, "engine saw {} sequences at once", sim.peak_running);
    assert!(sim.peak_kv_in_use <= 1800, "engine held {} KV tokens, budget 1800", sim.peak_kv_in_use);
    assert!(sim.peak_running >= 2, "the test never loaded the engine: {sim:?}");
    assert_drained(&gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_kv_budget_binds_the_engine_never_holds_more_than_it() {
    // 16 slots but KV for only 3-4 of these requests (250-400 tokens each): KV decides; everyone waits
    // their turn and is served.
    let mut config = sim_config(16, 64, 1200, 1000.0);
    config.max_queue_wait = Duration::from_secs(10);
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let tasks: Vec<_> = (0..24u32)
        .map(|i| {
            let http = http.clone();
            let body = chat(&"abcd".repeat(40 + i as usize * 5), 200 + i * 7, i % 3 != 0);
            tokio::spawn(async move {
                let response =
                    http.post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.unwrap();
                let status = response.status().as_u16();
                (status, response.text().await.unwrap())
            })
        })
        .collect();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let sim = gateway.sim_stats().unwrap();
    assert_eq!((sim.overflows, sim.started), (0, 24), "{sim:?}");
    assert!(sim.peak_kv_in_use <= 1200, "engine held {} KV tokens, budget 1200", sim.peak_kv_in_use);
    assert!(sim.peak_running <= 4, "KV for at most 4 of these requests, engine ran {}", sim.peak_running);
    assert!(sim.peak_kv_in_use > 600, "the test never filled the budget: {sim:?}");
    assert_drained(&gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_client_that_disconnects_frees_its_permit() {
    let gateway = Gateway::new(sim_config(2, 2, 100_000, 20.0)).unwrap();
    let addr = start(&gateway).await;
    // 2000 tokens at 20/s: far longer than the test.
    let response = client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .json(&chat("tell me everything", 2000, true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let second = body.next().await.unwrap().unwrap();
    assert!(second.starts_with(b"data: "));
    assert_eq!(gateway.admission().snapshot().in_flight, 1);
    assert_eq!(gateway.sim_stats().unwrap().running, 1);
    drop(body); // the client goes away mid-stream

    let freed = eventually(Duration::from_secs(1), || gateway.admission().snapshot().in_flight == 0).await;
    assert!(freed, "permit still held a second after the client left: {:?}", gateway.admission().snapshot());
    assert_drained(&gateway).await;
    assert!(gateway.sim_stats().unwrap().tokens_generated < 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_400_or_413_and_hold_nothing() {
    let gateway = Gateway::new(sim_config(2, 2, 10_000, 200.0)).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let cases: &[(&str, &str, u16, &str)] = &[
        ("/v1/chat/completions", "{\"messages\": [", 400, "invalid_json"),
        ("/v1/chat/completions", "[1, 2]", 400, "invalid_json"),
        ("/v1/chat/completions", r#"{"model":"m","max_tokens":10}"#, 400, "missing_messages"),
        ("/v1/chat/completions", r#"{"messages":[]}"#, 400, "invalid_messages"),
        ("/v1/chat/completions", r#"{"messages":[{"content":"hi"}]}"#, 400, "invalid_messages"),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":"lots"}"#,
            400,
            "invalid_max_tokens",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}"#,
            400,
            "invalid_max_tokens",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":-5}"#,
            400,
            "invalid_max_tokens",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"stream":"yes"}"#,
            400,
            "invalid_type",
        ),
        ("/v1/completions", r#"{"model":"m"}"#, 400, "missing_prompt"),
        ("/v1/completions", r#"{"prompt":{"a":1}}"#, 400, "invalid_prompt"),
        // Valid numbers, but more than the KV budget (10,000 tokens) could ever hold: admission says 413.
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":100000}"#,
            413,
            "too_large",
        ),
        ("/v1/completions", r#"{"prompt":"hi","max_completion_tokens":50000}"#, 413, "too_large"),
        // Beyond the largest reservation (--max-output-tokens): refused before admission.
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":1e13}"#,
            413,
            "max_tokens_too_large",
        ),
    ];
    for (path, body, status, code) in cases {
        let response = http
            .post(format!("http://{addr}{path}"))
            .header("content-type", "application/json")
            .body(*body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), *status, "{body}");
        assert!(response.headers().get("retry-after").is_none(), "{body}: retrying cannot help, no Retry-After");
        let error = assert_error_body(&response.text().await.unwrap());
        assert_eq!(error["error"]["code"], *code, "{body}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
    }
    // A body over the limit, declared: the 413 comes before the body is read, and the connection closes
    // (the client sends only the headers here, so it reads the answer whole).
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5242880\r\n\r\n{\"messages\"";
    tokio::io::AsyncWriteExt::write_all(&mut raw, head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::io::AsyncReadExt::read_to_end(&mut raw, &mut answer);
    let _ = tokio::time::timeout(Duration::from_secs(20), read).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("body_too_large") && answer.contains("connection: close"), "{answer}");
    // Undeclared (chunked), the limit cuts the read short: a 413 — or, if the client is still writing when
    // the connection closes, a broken pipe on its side. Either way nothing is held.
    let chunks = futures::stream::iter((0..80).map(|_| Ok::<_, std::io::Error>(vec![b'x'; 64 << 10])));
    let sent =
        http.post(format!("http://{addr}/v1/chat/completions")).body(reqwest::Body::wrap_stream(chunks)).send().await;
    if let Ok(response) = sent {
        assert_eq!(response.status(), 413);
        assert_eq!(assert_error_body(&response.text().await.unwrap())["error"]["code"], "body_too_large");
    }

    let snapshot = gateway.admission().snapshot();
    assert_eq!((snapshot.in_flight, snapshot.kv_used, snapshot.admitted), (0, 0, 0), "{snapshot:?}");
    assert_eq!(gateway.sim_stats().unwrap().started, 0);
    // Still serving.
    let ok = http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 4, false)).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let ok: Value = ok.json().await.unwrap();
    assert_eq!(ok["object"], "chat.completion");
    assert_drained(&gateway).await;
}

/// A mock OpenAI-compatible upstream: streams `chunks` SSE events `interval` apart, records the request
/// bodies it got and how many of its streams were dropped (the client, i.e. the gateway, went away).
#[derive(Clone, Default)]
struct Upstream {
    bodies: Arc<std::sync::Mutex<Vec<Value>>>,
    dropped: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
}

struct DropFlag(Arc<AtomicUsize>, Arc<AtomicUsize>, bool);

impl Drop for DropFlag {
    fn drop(&mut self) {
        if self.2 { &self.1 } else { &self.0 }.fetch_add(1, Ordering::SeqCst);
    }
}

async fn start_upstream(chunks: u32, interval: Duration) -> (SocketAddr, Upstream) {
    use axum::routing::{get, post};
    let upstream = Upstream::default();
    let state = upstream.clone();
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(move |axum::Json(body): axum::Json<Value>| {
                let state = state.clone();
                async move {
                    state.bodies.lock().unwrap().push(body);
                    let flag = DropFlag(state.dropped.clone(), state.finished.clone(), false);
                    let events = futures::stream::unfold((0u32, flag), move |(i, mut flag)| async move {
                        if i > chunks {
                            flag.2 = true;
                            drop(flag);
                            return None;
                        }
                        tokio::time::sleep(interval).await;
                        let event = if i == chunks {
                            "data: [DONE]\n\n".to_owned()
                        } else {
                            format!("data: {{\"chunk\":{i}}}\n\n")
                        };
                        Some((Ok::<_, std::convert::Infallible>(event), (i + 1, flag)))
                    });
                    ([("content-type", "text/event-stream")], axum::body::Body::from_stream(events))
                }
            }),
        )
        .route(
            "/v1/models",
            get(|| async {
                axum::Json(json!({"object": "list", "data": [{"id": "upstream-model", "object": "model"}]}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, upstream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_mode_passes_the_stream_through_and_cancels_upstream_when_the_client_leaves() {
    let (upstream_addr, upstream) = start_upstream(5, Duration::from_millis(20)).await;
    let config = Config {
        backend: BackendConfig::Upstream(format!("http://{upstream_addr}")),
        max_in_flight: 2,
        kv_tokens: Some(10_000),
        default_max_tokens: 77,
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();

    // Passed through chunk by chunk, in order, byte for byte; the default max_tokens is added upstream.
    let body = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let response = http.post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut stream = response.bytes_stream();
    let mut received = Vec::new();
    let mut frames = 0;
    while let Some(chunk) = stream.next().await {
        received.extend_from_slice(&chunk.unwrap());
        frames += 1;
    }
    let expected: String =
        (0..5).map(|i| format!("data: {{\"chunk\":{i}}}\n\n")).chain(["data: [DONE]\n\n".into()]).collect();
    assert_eq!(String::from_utf8(received).unwrap(), expected);
    assert!(frames >= 2, "the stream arrived in one piece: not streamed through");
    assert_eq!(upstream.bodies.lock().unwrap()[0]["max_tokens"], 77);
    assert_drained(&gateway).await;

    let models: Value = http.get(format!("http://{addr}/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "upstream-model");

    // A long upstream stream; the client leaves after the first chunk: the upstream request is cancelled
    // and the permit returned.
    let (upstream_addr, upstream) = start_upstream(10_000, Duration::from_millis(20)).await;
    let config = Config {
        backend: BackendConfig::Upstream(format!("http://{upstream_addr}/v1/")),
        max_in_flight: 2,
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let body = json!({"stream": true, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    let response = http.post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream();
    assert!(stream.next().await.unwrap().unwrap().starts_with(b"data: {\"chunk\":0}"));
    assert_eq!(gateway.admission().snapshot().in_flight, 1);
    drop(stream);
    let cancelled = eventually(Duration::from_secs(1), || upstream.dropped.load(Ordering::SeqCst) == 1).await;
    assert!(cancelled, "the upstream stream was not dropped within a second");
    assert_eq!(upstream.finished.load(Ordering::SeqCst), 0);
    assert_drained(&gateway).await;

    // An unreachable upstream is a 502 with an OpenAI-style error, and holds nothing.
    let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let gateway =
        Gateway::new(Config { backend: BackendConfig::Upstream(format!("http://{dead_addr}")), ..Config::default() })
            .unwrap();
    let addr = start(&gateway).await;
    let response =
        http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 5, false)).send().await.unwrap();
    assert_eq!(response.status(), 502);
    assert_error_body(&response.text().await.unwrap());
    assert_drained(&gateway).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_429_answers_capacity_rejections_with_429() {
    let mut config = sim_config(1, 0, 10_000, 20.0);
    config.all_429 = true;
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let running =
        http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 500, true)).send().await.unwrap();
    assert_eq!(running.status(), 200);
    let refused =
        http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("hi", 5, false)).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(assert_error_body(&refused.text().await.unwrap())["error"]["type"], "rate_limit_error");
    drop(running);
    assert_drained(&gateway).await;
}

#[test]
fn a_kv_byte_budget_comes_from_a_preset_and_a_gpu() {
    let args =
        |s: &str| std::iter::once("kvgate-gateway").chain(s.split_whitespace()).map(String::from).collect::<Vec<_>>();
    let gateway = Gateway::new(Config::from_args(args("--model llama-3.1-8b --gpu h100-80")).unwrap()).unwrap();
    assert!(gateway.admission().kv_in_bytes());
    let both = Config::from_args(args("--model llama-3.1-8b --gpu h100-80 --kv-tokens 5")).unwrap();
    assert!(Gateway::new(both).is_err());
    let no_gpu = Config::from_args(args("--model-config /nonexistent/config.json")).unwrap();
    assert!(Gateway::new(no_gpu).is_err());
}
