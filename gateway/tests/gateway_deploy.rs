//! What an AI team deploys, over real HTTP on loopback: API keys and tenants, priorities, budgets that
//! survive a restart, request ids and trace context down to the upstream and the log line, reloads
//! under load, several upstreams with their own budgets, health checks, prefix sharing, engine
//! feedback.
//!
//! Every wait is bounded; no assertion is about how fast anything was.

use futures::StreamExt;
use kvgate::Priority;
use kvgate_gateway::config::UpstreamConfig;
use kvgate_gateway::keys::KeyHash;
use kvgate_gateway::tenants::{KeyConfig, PriorityConfig, TenantConfig, TenantLimitsConfig};
use kvgate_gateway::{BackendConfig, Config, Gateway};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The longest any wait of these tests may take.
const CAP: Duration = Duration::from_secs(30);

async fn start(gateway: &Gateway) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kvgate_gateway::serve(listener, gateway.clone()));
    addr
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().timeout(CAP).build().unwrap()
}

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

fn chat(text: &str, max_tokens: u32, stream: bool) -> Value {
    json!({ "model": "m", "stream": stream, "max_tokens": max_tokens, "messages": [{ "role": "user", "content": text }] })
}

fn tenant(name: &str, key: &str) -> TenantConfig {
    TenantConfig {
        name: name.into(),
        keys: vec![KeyConfig::Key(KeyHash::of(key).to_string())],
        ..TenantConfig::default()
    }
}

fn sim(max_in_flight: usize, kv_tokens: u64, tokens_per_sec: f64) -> Config {
    Config {
        backend: BackendConfig::Simulated { tokens_per_sec },
        max_in_flight,
        kv_tokens: Some(kv_tokens),
        max_queue_wait: Duration::from_secs(20),
        ..Config::default()
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgate-deploy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn post(http: &reqwest::Client, addr: SocketAddr, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = http.post(format!("http://{addr}/v1/chat/completions")).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

/// A mock OpenAI-compatible upstream: answers chats (streamed or not) after `delay`, records each
/// request's headers, counts requests at once; `/v1/models` and `/health` answer 200. While `failing`
/// is set, chats get a 500.
struct Mock {
    addr: SocketAddr,
    headers: Arc<Mutex<Vec<http::HeaderMap>>>,
    served: Arc<AtomicUsize>,
    failing: Arc<AtomicBool>,
    server: tokio::task::JoinHandle<()>,
}

async fn mock(delay: Duration, metrics: Option<Arc<Mutex<String>>>) -> Mock {
    use axum::response::IntoResponse;
    let headers = Arc::new(Mutex::new(Vec::new()));
    let served = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicBool::new(false));
    let (seen, count, fail) = (Arc::clone(&headers), Arc::clone(&served), Arc::clone(&failing));
    let chat = move |request_headers: http::HeaderMap, body: bytes::Bytes| {
        let (seen, count, fail) = (Arc::clone(&seen), Arc::clone(&count), Arc::clone(&fail));
        async move {
            seen.lock().unwrap().push(request_headers);
            count.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(delay).await;
            if fail.load(Ordering::Relaxed) {
                let error = json!({"error": {"message": "engine error", "type": "server_error"}});
                return (http::StatusCode::INTERNAL_SERVER_ERROR, axum::Json(error)).into_response();
            }
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            if body["stream"] == true {
                let events = ["data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n", "data: [DONE]\n\n"];
                let events = futures::stream::iter(events.map(Ok::<_, std::convert::Infallible>));
                ([("content-type", "text/event-stream")], axum::body::Body::from_stream(events)).into_response()
            } else {
                axum::Json(json!({"choices": [{"message": {"content": "hi"}}], "usage": {"completion_tokens": 1}}))
                    .into_response()
            }
        }
    };
    let models = || async { axum::Json(json!({"object": "list", "data": [{"id": "m"}]})) };
    let mut app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .route("/v1/models", axum::routing::get(models))
        .route("/health", axum::routing::get(|| async { "ok" }));
    if let Some(text) = metrics {
        app = app.route("/metrics", axum::routing::get(move || async move { text.lock().unwrap().clone() }));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Mock { addr, headers, served, failing, server }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_id_and_traceparent_reach_the_upstream_and_the_log_line() {
    let upstream = mock(Duration::ZERO, None).await;
    let dir = temp_dir("trace");
    let log = dir.join("requests.log");
    let config = Config {
        backend: BackendConfig::Upstream(format!("http://{}", upstream.addr)),
        tenants: vec![tenant("alice", "sk-alice")],
        request_log: Some(log.clone()),
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let response = http
        .post(format!("http://{addr}/v1/chat/completions"))
        .bearer_auth("sk-alice")
        .header("x-request-id", "req-123")
        .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .json(&chat("hello", 16, true))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-request-id"], "req-123");
    let text = response.text().await.unwrap();
    assert!(text.contains("[DONE]"), "{text}");
    // Without an id, one is made, returned, and sent upstream.
    let response = post(&http, addr, Some("sk-alice"), &chat("again", 8, false)).await;
    let made = response.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(made.len(), 32, "{made}");
    response.bytes().await.unwrap();

    let seen = upstream.headers.lock().unwrap().clone();
    assert_eq!(seen[0]["x-request-id"], "req-123");
    let parent = seen[0]["traceparent"].to_str().unwrap();
    assert!(parent.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"), "the client's trace goes on: {parent}");
    assert!(!parent.contains("00f067aa0ba902b7"), "in a span of the gateway's: {parent}");
    assert!(seen[0].get("authorization").is_none(), "the client's key never goes upstream");
    assert_eq!(seen[1]["x-request-id"], made.as_str());

    let lines = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(eventually(|| lines().lines().count() >= 2).await, "log: {}", lines());
    let line: Value = serde_json::from_str(lines().lines().next().unwrap()).unwrap();
    assert_eq!(line["request_id"], "req-123");
    assert_eq!(line["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!((line["tenant"].as_str(), line["priority"].as_str()), (Some("alice"), Some("normal")));
    assert_eq!((line["decision"].as_str(), line["status"].as_u64()), (Some("admitted"), Some(200)));
    assert_eq!((line["upstream"].as_str(), line["upstream_status"].as_u64()), (Some("upstream"), Some(200)));
    assert_eq!(line["tokens_out"], 1, "{line}");
    assert!(
        line["tokens_in"].as_u64().unwrap() > 0 && line["ttft_ms"].is_number() && line["queue_wait_ms"].is_number()
    );
    assert!(!lines().contains("sk-alice"), "keys are never logged");
    // A refusal is logged too.
    let refused = post(&http, addr, Some("sk-nobody"), &chat("x", 8, false)).await;
    assert_eq!(refused.status(), 401);
    assert!(eventually(|| lines().lines().count() >= 3).await);
    let line: Value = serde_json::from_str(lines().lines().nth(2).unwrap()).unwrap();
    assert_eq!((line["decision"].as_str(), line["status"].as_u64()), (Some("invalid"), Some(401)));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Midnight UTC after now, as the budget's renewal.
fn next_midnight() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let days = now / 86_400 + 1;
    // Civil date of `days` (Howard Hinnant's algorithm), for the comparison only.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    format!("{:04}-{m:02}-{d:02}T00:00:00Z", yoe + era * 400 + i64::from(m <= 2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_daily_budget_gets_429_with_the_renewal_time_and_its_usage_survives_a_restart() {
    let dir = temp_dir("budget");
    let state = dir.join("usage.json");
    let config = || Config {
        tenants: vec![
            TenantConfig { daily_tokens: Some(400), ..tenant("thrifty", "sk-thrifty") },
            tenant("other", "sk-other"),
        ],
        state_file: Some(state.clone()),
        ..sim(4, 100_000, 2_000.0)
    };
    let gateway = Gateway::new(config()).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let mut served = 0;
    let refused = loop {
        let response = post(&http, addr, Some("sk-thrifty"), &chat("hello", 100, false)).await;
        if response.status() != 200 {
            break response;
        }
        response.bytes().await.unwrap();
        served += 1;
        assert!(served < 10, "the budget never ran out");
    };
    assert!(served >= 2, "{served} served before the budget ran out");
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["x-kvgate-budget-renews-at"], next_midnight().as_str());
    assert!(refused.headers().contains_key("retry-after"));
    let error: Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["code"], "budget_exceeded");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("daily") && message.contains(&next_midnight()), "{message}");
    // Another tenant is not affected, and sees only its own usage.
    assert_eq!(post(&http, addr, Some("sk-other"), &chat("hello", 100, false)).await.status(), 200);
    let own: Value =
        http.get(format!("http://{addr}/v1/usage")).bearer_auth("sk-other").send().await.unwrap().json().await.unwrap();
    assert_eq!(own["tenant"], "other");
    assert!(!own.to_string().contains("thrifty"), "a tenant never sees another's data: {own}");
    let used = gateway.budgets().usage_of("thrifty").0;
    assert!(used.day_tokens > 0 && used.day_tokens <= 400, "{used:?}");
    gateway.save_usage().unwrap();
    drop(gateway);

    let again = Gateway::new(config()).unwrap();
    assert_eq!(again.budgets().usage_of("thrifty").0.day_tokens, used.day_tokens, "usage survives a restart");
    let addr = start(&again).await;
    assert_eq!(post(&http, addr, Some("sk-thrifty"), &chat("hello", 100, false)).await.status(), 429);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_limits_give_429_to_the_heavy_key_while_others_are_served() {
    let config = Config {
        tenants: vec![
            TenantConfig {
                limits: TenantLimitsConfig { request_rate: Some(0.5), request_burst: Some(2), ..Default::default() },
                ..tenant("heavy", "sk-heavy")
            },
            tenant("light", "sk-light"),
        ],
        ..sim(8, 100_000, 5_000.0)
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let heavy: Vec<_> = (0..10)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move {
                let response = post(&http, addr, Some("sk-heavy"), &chat("x", 4, false)).await;
                let status = response.status().as_u16();
                let code =
                    response.json::<Value>().await.ok().and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
                (status, code)
            })
        })
        .collect();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for task in heavy {
        let (status, code) = task.await.unwrap();
        *statuses.entry(status).or_default() += 1;
        if status == 429 {
            assert_eq!(code.as_deref(), Some("rate_limited"));
        }
    }
    assert_eq!(statuses.get(&200), Some(&2), "the heavy key's burst: {statuses:?}");
    assert_eq!(statuses.get(&429), Some(&8), "{statuses:?}");
    for _ in 0..5 {
        assert_eq!(post(&http, addr, Some("sk-light"), &chat("x", 4, false)).await.status(), 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_key_with_500_queued_requests_does_not_starve_a_light_key() {
    // Two sequences at once; the heavy key queues 500 requests; then the light key asks once. Weighted
    // round-robin between tenants grants it within one round: at most one heavy grant (its weight)
    // between its arrival and its own grant, plus the slots that free while the grant is delivered.
    // FIFO: the heavy key's 500 requests wait as long as it takes (controlled delay would shed most of
    // them once the queue stands); the order between keys is the same under both policies.
    let config = Config {
        queue: 1_000,
        wait_policy: kvgate::WaitPolicy::Fifo,
        tenants: vec![tenant("heavy", "sk-heavy"), tenant("light", "sk-light")],
        ..sim(2, 1_000_000, 400.0)
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .pool_max_idle_per_host(600)
        .build()
        .unwrap();
    let heavy: Vec<_> = (0..500)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(
                async move { post(&http, addr, Some("sk-heavy"), &chat("x", 8, false)).await.status().as_u16() },
            )
        })
        .collect();
    assert!(eventually(|| gateway.admission().snapshot().queued >= 400).await, "{:?}", gateway.admission().snapshot());
    let before = gateway.admission().snapshot().admitted;
    let light = post(&http, addr, Some("sk-light"), &chat("x", 8, true)).await;
    assert_eq!(light.status(), 200);
    let after = gateway.admission().snapshot().admitted;
    let overtaken = after - before - 1;
    eprintln!("heavy requests granted while the light one waited: {overtaken}");
    assert!(overtaken <= 3, "the light key waited behind {overtaken} heavy grants");
    drop(light);
    gateway.admission().close();
    for task in heavy {
        let status = task.await.unwrap();
        assert!(matches!(status, 200 | 503), "{status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_under_load_drops_nothing() {
    let base = || Config { queue: 200, tenants: vec![tenant("a", "sk-a")], ..sim(4, 100_000, 300.0) };
    let gateway = Gateway::new(base()).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let http = http.clone();
            tokio::spawn(async move {
                let response = post(&http, addr, Some("sk-a"), &chat("tell me", 20 + i % 7, true)).await;
                let status = response.status().as_u16();
                (status, response.text().await.unwrap_or_default())
            })
        })
        .collect();
    assert!(eventually(|| gateway.admission().snapshot().queued >= 20).await);
    let old_front = gateway.admission();
    // New limits and a new key while 4 run and the rest wait (the simulated engine batches 4: a reload
    // can lower its limit, not raise it past the engine).
    let mut new = base();
    new.max_in_flight = 3;
    new.tenants.push(tenant("b", "sk-b"));
    gateway.reload(new.clone()).await.unwrap();
    assert_eq!(gateway.admission().snapshot().max_in_flight, 3);
    assert_eq!(gateway.upstreams()[0].limiter.local().snapshot().max_in_flight, 3);
    // A file with a mistake, or a change only a restart can make, is refused; the old one runs on.
    let mut bad = new.clone();
    bad.tenants.push(tenant("a", "sk-c")); // "a" twice
    let error = gateway.reload(bad).await.unwrap_err().to_string();
    assert!(error.contains("twice"), "{error}");
    let mut moved = new.clone();
    moved.listen = "127.0.0.1:1".parse().unwrap();
    assert!(gateway.reload(moved).await.unwrap_err().to_string().contains("restart"));
    let fresh = post(&http, addr, Some("sk-b"), &chat("x", 4, false)).await;
    assert_eq!(fresh.status(), 200, "the new key works: {}", fresh.text().await.unwrap());

    let mut by_status = std::collections::BTreeMap::<u16, usize>::new();
    for task in tasks {
        let (status, text) = task.await.unwrap();
        *by_status.entry(status).or_default() += 1;
        assert!(status == 200 && text.contains("[DONE]"), "{status}: {text}");
    }
    assert_eq!(by_status.get(&200), Some(&40), "every stream completed: {by_status:?}");
    // Counts add up: every request granted by either front admission, nothing held afterwards.
    let (old, new) = (old_front.snapshot(), gateway.admission().snapshot());
    assert_eq!(old.admitted + new.admitted, 41, "{old:?} {new:?}");
    assert!(eventually(|| old_front.snapshot().in_flight == 0 && gateway.admission().snapshot().in_flight == 0).await);
    let sim = gateway.sim_stats().unwrap();
    assert!(sim.peak_running <= 4 && sim.overflows == 0, "{sim:?}");
    assert_eq!(sim.started, 41);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_upstreams_with_different_budgets_never_exceed_either() {
    let upstream = |name: &str, slots: usize, kv: u64| UpstreamConfig {
        name: Some(name.into()),
        sim_tokens_per_sec: Some(500.0),
        max_in_flight: Some(slots),
        kv_tokens: Some(kv),
        ..UpstreamConfig::default()
    };
    let config = Config {
        upstreams: vec![upstream("small", 2, 600), upstream("large", 5, 2_000)],
        queue: 200,
        max_queue_wait: Duration::from_secs(30),
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let front = gateway.admission().snapshot();
    assert_eq!((front.max_in_flight, front.kv_capacity), (7, 2_600), "the front's capacity is the sum");
    let addr = start(&gateway).await;
    let http = client();
    let tasks: Vec<_> = (0..60u32)
        .map(|i| {
            let http = http.clone();
            let body = chat(&"word ".repeat(20 + (i as usize * 13) % 80), 40 + (i * 37) % 200, i % 2 == 0);
            tokio::spawn(async move {
                let response = post(&http, addr, None, &body).await;
                (response.status().as_u16(), response.text().await.unwrap_or_default())
            })
        })
        .collect();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    for (upstream, (slots, kv)) in gateway.upstreams().iter().zip([(2, 600), (5, 2_000)]) {
        let books = upstream.sim_stats().unwrap();
        eprintln!("{}: {books:?}", upstream.name);
        assert!(books.peak_running <= slots, "{}: {books:?}", upstream.name);
        assert!(books.peak_kv_in_use <= kv, "{}: {books:?}", upstream.name);
        assert_eq!(books.overflows, 0);
        assert!(books.started > 0, "{} never served", upstream.name);
    }
    let started: u64 = gateway.upstreams().iter().map(|u| u.sim_stats().unwrap().started).sum();
    assert_eq!(started, 60);
    let text = gateway.metrics_text();
    assert!(text.contains("kvgate_gateway_upstream_kv_cache_capacity{upstream=\"small\"} 600"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_four_upstreams_two_random_choices_spread_the_load_within_every_budget() {
    // Six upstreams (more than `P2C_ABOVE`): each request tries two drawn at random first.
    const { assert!(6 > kvgate_gateway::dispatch::P2C_ABOVE) };
    let budgets = [(1, 400), (2, 800), (2, 600), (3, 1_500), (1, 300), (4, 2_000)];
    let upstreams = budgets
        .iter()
        .enumerate()
        .map(|(i, &(slots, kv))| UpstreamConfig {
            name: Some(format!("gpu-{i}")),
            sim_tokens_per_sec: Some(1_000.0),
            max_in_flight: Some(slots),
            kv_tokens: Some(kv),
            ..UpstreamConfig::default()
        })
        .collect();
    let config = Config { upstreams, queue: 200, max_queue_wait: Duration::from_secs(30), ..Config::default() };
    let gateway = Gateway::new(config).unwrap();
    let front = gateway.admission().snapshot();
    assert_eq!((front.max_in_flight, front.kv_capacity), (13, 5_600));
    let addr = start(&gateway).await;
    let http = client();
    let tasks: Vec<_> = (0..120u32)
        .map(|i| {
            let http = http.clone();
            let body = chat(&"word ".repeat(5 + (i as usize * 7) % 40), 20 + (i * 13) % 60, i % 3 == 0);
            tokio::spawn(async move {
                let response = post(&http, addr, None, &body).await;
                (response.status().as_u16(), response.text().await.unwrap_or_default())
            })
        })
        .collect();
    for task in tasks {
        let (status, body) = task.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    for (upstream, &(slots, kv)) in gateway.upstreams().iter().zip(&budgets) {
        let books = upstream.sim_stats().unwrap();
        assert!(books.peak_running <= slots && books.peak_kv_in_use <= kv, "{}: {books:?}", upstream.name);
        assert_eq!(books.overflows, 0, "{}: {books:?}", upstream.name);
        assert!(books.started > 0, "{} never served: {books:?}", upstream.name);
    }
    let started: u64 = gateway.upstreams().iter().map(|u| u.sim_stats().unwrap().started).sum();
    assert_eq!(started, 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_upstream_is_skipped_after_its_health_check() {
    let (a, b) = (mock(Duration::from_millis(100), None).await, mock(Duration::from_millis(100), None).await);
    let upstream = |name: &str, addr: SocketAddr| UpstreamConfig {
        name: Some(name.into()),
        url: Some(format!("http://{addr}")),
        max_in_flight: Some(4),
        kv_tokens: Some(100_000),
        health_path: Some("/health".into()),
        ..UpstreamConfig::default()
    };
    let config = Config {
        upstreams: vec![upstream("a", a.addr), upstream("b", b.addr)],
        health_interval: Duration::from_millis(200),
        upstream_timeout: Duration::from_secs(5),
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let at_once: Vec<_> = (0..8)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move { post(&http, addr, None, &chat("x", 4, false)).await.status() })
        })
        .collect();
    for request in at_once {
        assert_eq!(request.await.unwrap(), 200);
    }
    assert!(a.served.load(Ordering::Relaxed) > 0 && b.served.load(Ordering::Relaxed) > 0, "both serve while in");
    a.server.abort();
    let died = Instant::now();
    let dead = &gateway.upstreams()[0];
    assert!(eventually(|| !dead.is_healthy()).await, "the dead upstream was never taken out");
    eprintln!("taken out {:?} after it died (health interval 200 ms)", died.elapsed());
    assert_eq!(gateway.admission().snapshot().max_in_flight, 4, "the front's capacity is b's alone");
    let before = b.served.load(Ordering::Relaxed);
    for _ in 0..10 {
        assert_eq!(post(&http, addr, None, &chat("x", 4, false)).await.status(), 200, "every request goes to b");
    }
    assert_eq!(b.served.load(Ordering::Relaxed), before + 10);
    let metrics = gateway.metrics_text();
    assert!(metrics.contains("kvgate_gateway_upstream_in_service{upstream=\"a\"} 0"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_keeps_answering_5xx_is_taken_out_and_probed_back_in() {
    let (a, b) = (mock(Duration::ZERO, None).await, mock(Duration::ZERO, None).await);
    // `a` has the larger KV budget, so an idle gateway sends each request there first.
    let upstream = |name: &str, addr: SocketAddr, kv: u64| UpstreamConfig {
        name: Some(name.into()),
        url: Some(format!("http://{addr}")),
        max_in_flight: Some(4),
        kv_tokens: Some(kv),
        health_path: Some("/health".into()),
        ..UpstreamConfig::default()
    };
    let config = Config {
        upstreams: vec![upstream("a", a.addr, 200_000), upstream("b", b.addr, 100_000)],
        health_interval: Duration::from_millis(500),
        max_fails: 2,
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    assert_eq!(post(&http, addr, None, &chat("x", 4, false)).await.status(), 200);
    assert_eq!((a.served.load(Ordering::Relaxed), b.served.load(Ordering::Relaxed)), (1, 0), "a first");

    // `a` answers 500 while its health check passes: two in a row take it out at once (a health check
    // that passes in between starts the count again, so try a few times).
    a.failing.store(true, Ordering::Relaxed);
    let flaky = &gateway.upstreams()[0];
    let mut taken_out = false;
    for _ in 0..20 {
        let response = post(&http, addr, None, &chat("x", 4, false)).await;
        if response.status().is_server_error() && !flaky.is_healthy() {
            taken_out = true;
            break;
        }
    }
    assert!(taken_out, "two 5xx answers in a row never took the upstream out");
    let metrics = gateway.metrics_text();
    assert!(metrics.contains("kvgate_gateway_upstream_in_service{upstream=\"a\"} 0"), "{metrics}");

    // Fixed, it is probed back in by the next health check, and takes requests again.
    a.failing.store(false, Ordering::Relaxed);
    assert!(eventually(|| flaky.is_healthy()).await, "the health check never put it back in");
    let before = a.served.load(Ordering::Relaxed);
    for _ in 0..3 {
        assert_eq!(post(&http, addr, None, &chat("x", 4, false)).await.status(), 200);
    }
    assert_eq!(a.served.load(Ordering::Relaxed), before + 3, "back in, it is the first choice again");
    assert_eq!(gateway.admission().snapshot().max_in_flight, 8, "the front's capacity counts it again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_ten_busiest_tenants() {
    // Eleven tenants; ten run a stream each, the eleventh runs nothing and is left out.
    let tenants = (0..11).map(|i| tenant(&format!("busy-{i}"), &format!("sk-busy-{i}"))).collect();
    let gateway = Gateway::new(Config { tenants, ..sim(16, 1_000_000, 20.0) }).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let mut streams = Vec::new();
    for i in 0..10 {
        let response = post(&http, addr, Some(&format!("sk-busy-{i}")), &chat("x", 400, true)).await;
        assert_eq!(response.status(), 200);
        let mut stream = response.bytes_stream();
        stream.next().await.unwrap().unwrap();
        streams.push(stream);
    }
    let text = gateway.metrics_text();
    for i in 0..10 {
        let sample = format!("kvgate_gateway_tenant_requests_running{{tenant=\"busy-{i}\"}} 1");
        assert!(text.contains(&sample), "/metrics lacks {sample}:\n{text}");
    }
    assert!(!text.contains("tenant_requests_running{tenant=\"busy-10\"}"), "{text}");
    drop(streams);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_header_only_lowers() {
    let config = Config {
        tenants: vec![
            TenantConfig { priority: PriorityConfig::Interactive, ..tenant("chat", "sk-chat") },
            TenantConfig { priority: PriorityConfig::Batch, ..tenant("eval", "sk-eval") },
        ],
        ..sim(1, 100_000, 50.0)
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let running = post(&http, addr, Some("sk-chat"), &chat("x", 400, true)).await;
    let mut running = running.bytes_stream();
    running.next().await.unwrap().unwrap();
    let send = |key: &'static str, priority: &'static str| {
        let http = http.clone();
        tokio::spawn(async move {
            http.post(format!("http://{addr}/v1/chat/completions"))
                .bearer_auth(key)
                .header("x-kvgate-priority", priority)
                .json(&chat("x", 4, false))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    let lowered = send("sk-chat", "batch");
    assert!(eventually(|| gateway.admission().queued_in(Priority::Batch) == 1).await, "interactive lowered to batch");
    let raised = send("sk-eval", "interactive");
    assert!(eventually(|| gateway.admission().queued_in(Priority::Batch) == 2).await, "batch cannot raise itself");
    assert_eq!(gateway.admission().queued_in(Priority::Interactive), 0);
    let bad = http
        .post(format!("http://{addr}/v1/chat/completions"))
        .bearer_auth("sk-chat")
        .header("x-kvgate-priority", "urgent")
        .json(&chat("x", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    drop(running);
    assert_eq!(lowered.await.unwrap().unwrap(), 200);
    assert_eq!(raised.await.unwrap().unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_a_header_or_the_user_field_names_the_tenant() {
    let config = Config {
        tenant_header: Some("x-team".into()),
        tenant_from_user: true,
        tenant_defaults: Some(TenantLimitsConfig { max_in_flight: Some(1), ..Default::default() }),
        ..sim(4, 100_000, 50.0)
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    // One request of team "red" runs; its second waits on the tenant's own cap of 1, while "blue" (named by
    // the user field) runs at once.
    let red =
        http.post(format!("http://{addr}/v1/chat/completions")).header("x-team", "red").json(&chat("x", 400, true));
    let mut red = red.send().await.unwrap().bytes_stream();
    red.next().await.unwrap().unwrap();
    let red_again = {
        let http = http.clone();
        tokio::spawn(async move {
            http.post(format!("http://{addr}/v1/chat/completions"))
                .header("x-team", "red")
                .json(&chat("x", 4, false))
                .send()
                .await
        })
    };
    assert!(eventually(|| gateway.admission().snapshot().queued == 1).await);
    let mut blue = chat("x", 4, false);
    blue["user"] = json!("blue");
    assert_eq!(post(&http, addr, None, &blue).await.status(), 200, "another tenant is not held back");
    drop(red);
    assert_eq!(red_again.await.unwrap().unwrap().status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_is_charged_once_and_counted_in_the_metrics() {
    let config = Config { prefix_sharing: Some(100), ..sim(8, 6_000, 20.0) };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let system = "You are the company's assistant. ".repeat(100); // about 800 tokens
    let body = |question: &str| {
        json!({"stream": true, "max_tokens": 200, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": question}]})
    };
    // Without sharing, five of these (about 1,020 tokens each) would not fit 6,000 tokens at once.
    let mut streams = Vec::new();
    for i in 0..5 {
        let response = post(&http, addr, None, &body(&format!("question {i}"))).await;
        assert_eq!(response.status(), 200);
        let mut stream = response.bytes_stream();
        stream.next().await.unwrap().unwrap();
        streams.push(stream);
    }
    let s = gateway.admission().snapshot();
    assert_eq!(s.in_flight, 5);
    assert!(s.kv_used < 5 * 1_000, "the prefix is held once: {s:?}");
    let upstream = gateway.upstreams()[0].limiter.local().snapshot();
    assert!(upstream.kv_saved_by_prefixes >= 4 * 800, "{upstream:?}");
    let text = gateway.metrics_text();
    let saved = text
        .lines()
        .find(|l| l.starts_with("kvgate_gateway_upstream_prefix_kv_saved_total{upstream=\"sim\"}"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(saved.rsplit(' ').next().unwrap().parse::<f64>().unwrap() >= 3_200.0, "{saved}");
    drop(streams);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_feedback_shrinks_a_budget_the_engine_cannot_hold() {
    let metrics = Arc::new(Mutex::new(String::from(
        "vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_waiting 0\nvllm:num_requests_running 1\nvllm:num_preemptions_total 0\n",
    )));
    let upstream = mock(Duration::from_millis(50), Some(Arc::clone(&metrics))).await;
    let config = Config {
        backend: BackendConfig::Upstream(format!("http://{}", upstream.addr)),
        kv_tokens: Some(100_000),
        engine_feedback: Some(Duration::from_millis(100)),
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let _addr = start(&gateway).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The engine preempts: the budget shrinks, and the front admission follows.
    *metrics.lock().unwrap() = String::from(
        "vllm:kv_cache_usage_perc 0.99\nvllm:num_requests_waiting 3\nvllm:num_requests_running 1\nvllm:num_preemptions_total 5\n",
    );
    let budget = || gateway.upstreams()[0].limiter.local().snapshot().kv_capacity;
    assert!(eventually(|| budget() < 100_000).await, "the budget never moved");
    assert!(eventually(|| gateway.admission().snapshot().kv_capacity == budget()).await);
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_reloads_and_shows_usage_and_metrics_move_off_the_main_port() {
    let (admin, metrics) = (free_addr(), free_addr());
    let config = Config {
        admin_listen: Some(admin),
        metrics_listen: Some(metrics),
        tenants: vec![TenantConfig { daily_tokens: Some(1_000_000), ..tenant("a", "sk-a") }],
        ..sim(4, 100_000, 1_000.0)
    };
    let gateway = Gateway::new(config.clone()).unwrap();
    let next = Arc::new(Mutex::new(config));
    let source = Arc::clone(&next);
    gateway.set_config_source(Arc::new(move || Ok(source.lock().unwrap().clone())));
    let addr = start(&gateway).await;
    let http = client();
    assert_eq!(post(&http, addr, Some("sk-a"), &chat("x", 4, false)).await.status(), 200);
    assert!(eventually(|| std::net::TcpStream::connect(admin).is_ok()).await);
    // Metrics are on their own port only: a tenant cannot read other tenants' usage on the main one.
    assert_eq!(http.get(format!("http://{addr}/metrics")).send().await.unwrap().status(), 404);
    let text = http.get(format!("http://{metrics}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("kvgate_gateway_tenant_tokens_used{tenant=\"a\",period=\"day\"}"), "{text}");
    let usage: Value = http.get(format!("http://{admin}/admin/usage")).send().await.unwrap().json().await.unwrap();
    assert_eq!(usage["tenants"][0]["tenant"], "a");
    assert_eq!(usage["tenants"][0]["requests"], 1);
    assert_eq!(usage["tenants"][0]["daily_tokens_limit"], 1_000_000);
    // A reload through the admin endpoint: a new key.
    next.lock().unwrap().tenants.push(tenant("b", "sk-b"));
    let reloaded = http.post(format!("http://{admin}/admin/reload")).send().await.unwrap();
    assert_eq!(reloaded.status(), 200);
    assert_eq!(post(&http, addr, Some("sk-b"), &chat("x", 4, false)).await.status(), 200);
    // A refused one says why, and changes nothing.
    next.lock().unwrap().max_in_flight = 0;
    let refused = http.post(format!("http://{admin}/admin/reload")).send().await.unwrap();
    assert_eq!(refused.status(), 422);
    let why: Value = refused.json().await.unwrap();
    assert!(why["error"].as_str().unwrap().contains("max_in_flight"), "{why}");
    assert_eq!(gateway.admission().snapshot().max_in_flight, 4);
    // The admin endpoint is not on the main port.
    assert_eq!(http.post(format!("http://{addr}/admin/reload")).send().await.unwrap().status(), 404);
}

#[cfg(feature = "otel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_request_is_one_span_at_the_opentelemetry_collector() {
    let upstream = mock(Duration::ZERO, None).await;
    let received = Arc::new(Mutex::new(Vec::<Value>::new()));
    let seen = Arc::clone(&received);
    let collector = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: bytes::Bytes| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
                "{}"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let collector_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, collector).await });
    let config = Config {
        backend: BackendConfig::Upstream(format!("http://{}", upstream.addr)),
        otlp_endpoint: Some(format!("http://{collector_addr}")),
        tenants: vec![tenant("alice", "sk-alice")],
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let response = client()
        .post(format!("http://{addr}/v1/chat/completions"))
        .bearer_auth("sk-alice")
        .header("x-request-id", "otel-1")
        .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .json(&chat("hello", 8, false))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.bytes().await.unwrap();
    assert!(eventually(|| !received.lock().unwrap().is_empty()).await, "no span reached the collector");
    let export = received.lock().unwrap()[0].clone();
    let span = &export["resourceSpans"][0]["scopeSpans"][0]["spans"][0];
    assert_eq!(span["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(span["parentSpanId"], "00f067aa0ba902b7", "under the client's span");
    let upstream_parent = upstream.headers.lock().unwrap()[0]["traceparent"].to_str().unwrap().to_owned();
    assert_eq!(upstream_parent.split('-').nth(2), span["spanId"].as_str(), "the engine's parent is this span");
    assert_eq!(span["kind"], 2);
    let attributes = span["attributes"].as_array().unwrap();
    let attribute = |key: &str| attributes.iter().find(|a| a["key"] == key).map(|a| a["value"].clone());
    assert_eq!(attribute("kvgate.request_id"), Some(json!({"stringValue": "otel-1"})));
    assert_eq!(attribute("kvgate.tenant"), Some(json!({"stringValue": "alice"})));
    assert_eq!(attribute("http.response.status_code"), Some(json!({"intValue": "200"})));
    assert_eq!(export["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"], "kvgate-gateway");
    assert!(!export.to_string().contains("sk-alice"), "keys are never exported");
}

/// Holds the only slot with a long stream until dropped; returns once the stream has started.
async fn hold_the_slot(http: &reqwest::Client, addr: SocketAddr, key: Option<&str>) -> impl Send {
    hold_with(http, addr, key, 400).await
}

/// Holds a slot with a stream of `max_tokens` until dropped; returns once the stream has started.
async fn hold_the_slot_for(http: &reqwest::Client, addr: SocketAddr, max_tokens: u32) -> impl Send {
    hold_with(http, addr, None, max_tokens).await
}

async fn hold_with(http: &reqwest::Client, addr: SocketAddr, key: Option<&str>, max_tokens: u32) -> impl Send {
    let running = post(http, addr, key, &chat("x", max_tokens, true)).await;
    assert_eq!(running.status(), 200);
    let mut running = running.bytes_stream();
    running.next().await.unwrap().unwrap();
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_would_miss_its_ttft_deadline_is_refused_at_once_with_retry_after() {
    // One slot, held by a long stream: a new request is predicted to start in about one hold time (the
    // 5-s prior before any permit was returned). With the gateway's 200-ms default deadline it is
    // refused at once; a header asking for longer cannot lift the default; one without a deadline waits.
    let config = Config { ttft_deadline: Some(Duration::from_millis(200)), ..sim(1, 100_000, 50.0) };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let running = hold_the_slot(&http, addr, None).await;
    for header in [None, Some("30s")] {
        let mut request = http.post(format!("http://{addr}/v1/chat/completions")).json(&chat("x", 4, false));
        if let Some(value) = header {
            request = request.header("x-kvgate-ttft-deadline", value);
        }
        let shed = request.send().await.unwrap();
        assert_eq!(shed.status(), 503, "header {header:?}");
        let retry_after: u64 = shed.headers()["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(retry_after >= 1, "{retry_after}");
    }
    assert_eq!(gateway.admission().snapshot().queued, 0, "nothing waited");
    let bad = http
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("x-kvgate-ttft-deadline", "soon")
        .json(&chat("x", 4, false));
    assert_eq!(bad.send().await.unwrap().status(), 400);
    drop(running);

    // Without a default, only requests that ask for a deadline are shed.
    let gateway = Gateway::new(sim(1, 100_000, 50.0)).unwrap();
    let addr = start(&gateway).await;
    let running = hold_the_slot(&http, addr, None).await;
    let impatient = http
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("x-kvgate-ttft-deadline", "100ms")
        .json(&chat("x", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(impatient.status(), 503);
    let patient = tokio::spawn({
        let http = http.clone();
        async move { post(&http, addr, None, &chat("x", 4, false)).await.status().as_u16() }
    });
    assert!(eventually(|| gateway.admission().snapshot().queued == 1).await, "a request without a deadline waits");
    drop(running);
    assert_eq!(patient.await.unwrap(), 200);
}

/// The order in which `light` and `heavy` requests were served behind one slot, under `fairness`: three
/// heavy requests (long prompts) queue first, then three light ones.
async fn served_order(fairness: kvgate::Fairness) -> String {
    let config = Config {
        fairness,
        tenants: vec![tenant("heavy", "sk-heavy"), tenant("light", "sk-light"), tenant("first", "sk-first")],
        ..sim(1, 1_000_000, 2_000.0)
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let running = hold_the_slot(&http, addr, Some("sk-first")).await;
    let order = Arc::new(Mutex::new(String::new()));
    let mut tasks = Vec::new();
    for (i, (key, text)) in [("sk-heavy", "long document ".repeat(600)), ("sk-light", "hi".to_owned())]
        .into_iter()
        .flat_map(|kind| std::iter::repeat_n(kind, 3))
        .enumerate()
    {
        let (http, order) = (http.clone(), Arc::clone(&order));
        let mark = if key == "sk-heavy" { 'H' } else { 'L' };
        tasks.push(tokio::spawn(async move {
            let response = post(&http, addr, Some(key), &chat(&text, 4, false)).await;
            assert_eq!(response.status(), 200);
            order.lock().unwrap().push(mark);
        }));
        assert!(eventually(|| gateway.admission().snapshot().queued == i + 1).await, "request {i} queues");
    }
    drop(running);
    for task in tasks {
        task.await.unwrap();
    }
    order.lock().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_fairness_from_the_config_serves_short_prompts_before_a_long_prompt_tenant_gets_a_second_turn() {
    // Request fairness alternates the two tenants whatever their sizes; token fairness charges the heavy
    // tenant its ~2,000-token prompts, so the light tenant's three small requests all go before the heavy
    // tenant's second.
    let by_requests = served_order(kvgate::Fairness::Requests).await;
    assert_eq!(by_requests, "HLHLHL", "round-robin by requests");
    let by_tokens = served_order(kvgate::Fairness::tokens()).await;
    assert_eq!(by_tokens, "HLLLHH", "by tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_deadline_bounds_the_wait_in_the_line_behind_the_front_admission() {
    // Two upstreams of 1,000 KV tokens, each running a ~560-token stream: a 710-token request fits the
    // front admission's sum (880 free) but neither upstream (440 free each), so it waits in the
    // dispatcher's line. What is left of its 200-ms start deadline bounds that wait, not the 20-s
    // max_queue_wait.
    let upstream = |name: &str| UpstreamConfig {
        name: Some(name.into()),
        sim_tokens_per_sec: Some(50.0),
        max_in_flight: Some(2),
        kv_tokens: Some(1_000),
        ..UpstreamConfig::default()
    };
    let config = Config {
        upstreams: vec![upstream("a"), upstream("b")],
        ttft_deadline: Some(Duration::from_millis(200)),
        max_queue_wait: Duration::from_secs(20),
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let addr = start(&gateway).await;
    let http = client();
    let _a = hold_the_slot_for(&http, addr, 550).await;
    let _b = hold_the_slot_for(&http, addr, 550).await;
    let kv: Vec<u64> = gateway.upstreams().iter().map(|u| u.limiter.local().snapshot().kv_used).collect();
    assert!(kv.iter().all(|&used| used > 500), "each upstream runs one stream: {kv:?}");
    let started = Instant::now();
    let response = post(&http, addr, None, &chat("x", 700, false)).await;
    let waited = started.elapsed();
    assert_eq!(response.status(), 503);
    assert!(
        waited < Duration::from_secs(10),
        "the 200-ms deadline waited {waited:?} in the line (its wait limit is 20 s)"
    );
}
