//! `--redis`: two gateway replicas share one upstream's capacity through a real `redis-server` (started
//! on a free loopback port; the test says it skipped when `redis-server` is not installed, unless `CI`
//! is set).

use futures::StreamExt;
use kvgate_gateway::{BackendConfig, Config, Gateway};
use kvgate_redis::server::LocalRedis;
use serde_json::json;
use std::time::Duration;

async fn start(gateway: &Gateway) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(kvgate_gateway::serve(listener, gateway.clone()));
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_one_budget() {
    let Some(redis) = LocalRedis::for_test().unwrap() else { return };
    let config = Config {
        backend: BackendConfig::Simulated { tokens_per_sec: 20.0 },
        max_in_flight: 2,
        kv_tokens: Some(10_000),
        max_queue_wait: Duration::from_millis(500),
        redis: Some(redis.url()),
        redis_prefix: format!("test-{}", std::process::id()),
        rate: Some((1_000.0, 1_000)),
        ..Config::default()
    };
    assert!(Gateway::new(config.clone()).is_err(), "a Redis gateway is connected, not built");
    let (a, b) = (Gateway::connect(config.clone()).await.unwrap(), Gateway::connect(config).await.unwrap());
    let (addr_a, addr_b) = (start(&a).await, start(&b).await);
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(30)).build().unwrap();
    let body = |max_tokens: u32, stream: bool| json!({"stream": stream, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]});
    // Replica A runs two long streams: the upstream's two shared slots.
    let mut streams = Vec::new();
    for _ in 0..2 {
        let response =
            http.post(format!("http://{addr_a}/v1/chat/completions")).json(&body(400, true)).send().await.unwrap();
        assert_eq!(response.status(), 200);
        let mut stream = response.bytes_stream();
        stream.next().await.unwrap().unwrap();
        streams.push(stream);
    }
    // Replica B, whose own admission is empty, finds no room: it waits its 500 ms, then 503.
    let refused = http.post(format!("http://{addr_b}/v1/chat/completions")).json(&body(4, false)).send().await.unwrap();
    assert_eq!(refused.status(), 503, "{}", refused.text().await.unwrap());
    assert_eq!(b.admission().snapshot().in_flight, 0);
    // A's streams end: B is served.
    drop(streams);
    let mut served = false;
    for _ in 0..50 {
        let response = http.post(format!("http://{addr_b}/v1/chat/completions")).json(&body(4, false)).send().await;
        if response.unwrap().status() == 200 {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "replica B was never served after A released the capacity");
}
