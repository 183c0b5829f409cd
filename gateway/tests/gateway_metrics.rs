//! `/metrics`, `/v1/models`, `/healthz`, tenants and their keys, and rate-limit headers, over real HTTP.
//! In a test binary of its own: the metrics recorder is process-wide, so the counts here are this
//! file's alone.

use kvgate_gateway::tenants::{TenantConfig, TenantLimitsConfig};
use kvgate_gateway::{BackendConfig, Config, Gateway};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_models_health_tenants_and_rate_headers() {
    let config = Config {
        backend: BackendConfig::Simulated { tokens_per_sec: 500.0 },
        max_in_flight: 3,
        queue: 5,
        kv_tokens: Some(5_000),
        rate: Some((100.0, 100)),
        model: Some("my-model".into()),
        tenants: vec![TenantConfig {
            name: "alice".into(),
            keys: vec!["sk-alice".into()],
            limits: TenantLimitsConfig { request_rate: Some(1.0), request_burst: Some(10), ..Default::default() },
            ..Default::default()
        }],
        ..Config::default()
    };
    let gateway = Gateway::new(config).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kvgate_gateway::serve(listener, gateway.clone()));
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(20)).build().unwrap();
    let url = format!("http://{addr}/v1/completions");

    // Without a key, or with an unknown one: 401, nothing admitted.
    let anonymous = http.post(&url).json(&json!({"prompt": "hi", "max_tokens": 3})).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let unknown = http.post(&url).bearer_auth("sk-mallory").json(&json!({"prompt": "hi"})).send().await.unwrap();
    assert_eq!(unknown.status(), 401);
    assert_eq!(unknown.json::<Value>().await.unwrap()["error"]["code"], "invalid_api_key");

    let ok =
        http.post(&url).bearer_auth("sk-alice").json(&json!({"prompt": "hi", "max_tokens": 3})).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    // The tenant's request bucket (burst 10) is tighter than the global one (100).
    assert_eq!(ok.headers()["x-ratelimit-limit-requests"], "10");
    assert_eq!(ok.headers()["x-ratelimit-remaining-requests"], "9");
    assert!(ok.headers().contains_key("x-ratelimit-reset-requests"));
    let answer: Value = ok.json().await.unwrap();
    assert_eq!(answer["object"], "text_completion");
    let invalid = http.post(&url).bearer_auth("sk-alice").body("nope").send().await.unwrap();
    assert_eq!(invalid.status(), 400);

    // A chunked body that breaks its own framing: 400 unreadable_body, counted like every refusal.
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-alice\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), raw.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("unreadable_body"), "{answer}");

    let models: Value = http.get(format!("http://{addr}/v1/models")).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["data"][0]["id"], "my-model");
    let health = http.get(format!("http://{addr}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.json::<Value>().await.unwrap()["status"], "ok");

    let metrics = http.get(format!("http://{addr}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    assert!(metrics.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    let text = metrics.text().await.unwrap();
    for sample in [
        "kvgate_num_requests_running 0",
        "kvgate_num_requests_waiting 0",
        "kvgate_kv_cache_capacity{unit=\"tokens\"} 5000",
        "kvgate_requests_admitted_total{priority=\"normal\"} 1",
        "kvgate_gateway_requests_invalid_total{code=\"missing_api_key\"} 1",
        "kvgate_gateway_requests_invalid_total{code=\"invalid_api_key\"} 1",
        "kvgate_gateway_requests_invalid_total{code=\"invalid_json\"} 1",
        "kvgate_gateway_requests_invalid_total{code=\"unreadable_body\"} 1",
        "kvgate_gateway_responses_total{status=\"200\",tenant=\"alice\"} 1",
        "kvgate_gateway_responses_total{status=\"401\",tenant=\"none\"} 2",
        "kvgate_sim_peak_requests_running{upstream=\"sim\"} 1",
        "kvgate_sim_overflows_total{upstream=\"sim\"} 0",
        "kvgate_gateway_upstream_in_service{upstream=\"sim\"} 1",
        "kvgate_gateway_upstream_kv_cache_capacity{upstream=\"sim\"} 5000",
        "kvgate_gateway_upstream_requests_running{upstream=\"sim\"} 0",
        "kvgate_gateway_requests_waiting_for_upstream 0",
        "kvgate_gateway_tenant_tokens_used{tenant=\"alice\",period=\"day\"}",
        "kvgate_gateway_buffered_bytes 0",
    ] {
        assert!(text.contains(sample), "/metrics lacks {sample}:\n{text}");
    }
    assert!(!text.contains("vllm:"), "one vocabulary");
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value == "+Inf" || value.parse::<f64>().is_ok(), "bad sample: {line}");
    }
}
