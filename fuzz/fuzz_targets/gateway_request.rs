//! The gateway (`kvgate-gateway`, simulated engine) on arbitrary requests: the method, path, key and
//! body come from the input; the request goes through the whole router in-process.
//!
//! It never panics; it answers only 200, 400, 401, 405, 408, 413, 429 or 503 (404 for the path with a
//! trailing slash, which is not a route); and once the answer's body is read, the gateway holds
//! nothing: no permit, no KV, no buffered body bytes. The runtime's clock is paused, so the simulated
//! engine's token delays pass at once.
//!
//! Input: one selector byte (method, path, key), then the body.
#![no_main]

use http_body_util::BodyExt;
use kvgate_gateway::tenants::TenantConfig;
use kvgate_gateway::{BackendConfig, Config, Gateway};
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use tower::ServiceExt;

struct World {
    runtime: tokio::runtime::Runtime,
    gateway: Gateway,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().start_paused(true).build().unwrap();
        let config = Config {
            backend: BackendConfig::Simulated { tokens_per_sec: 1e9 },
            max_in_flight: 2,
            kv_tokens: Some(4_096),
            max_output_tokens: 32,
            default_max_tokens: 8,
            max_body_bytes: 64 << 10,
            max_buffered_bytes: 1 << 20,
            tenants: vec![TenantConfig { name: "fuzz".into(), keys: vec!["sk-fuzz".into()], ..Default::default() }],
            ..Config::default()
        };
        let gateway = runtime.block_on(async { Gateway::new(config).unwrap() });
        World { runtime, gateway }
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let world = world();
    let method = if selector & 3 == 3 { http::Method::GET } else { http::Method::POST };
    let paths = ["/v1/chat/completions", "/v1/completions", "/v1/chat/completions/", "/v1/models"];
    let path = paths[usize::from(selector >> 2) & 3];
    let key = ["Bearer sk-fuzz", "Bearer sk-other", "", "Bearer sk-fuzz"][usize::from(selector >> 4) & 3];
    let mut request = http::Request::builder().method(method).uri(path);
    if !key.is_empty() {
        request = request.header(http::header::AUTHORIZATION, key);
    }
    let request = request.body(axum::body::Body::from(body.to_vec())).unwrap();
    let router = world.gateway.router();
    let (status, _) = world.runtime.block_on(async {
        let response = router.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.map(|c| c.to_bytes());
        (status, bytes)
    });
    let not_a_route = path.ends_with('/') && status == 404;
    assert!(not_a_route || matches!(status, 200 | 400 | 401 | 405 | 408 | 413 | 429 | 503), "status {status}");
    let snapshot = world.gateway.admission().snapshot();
    assert_eq!((snapshot.in_flight, snapshot.kv_used, snapshot.queued), (0, 0, 0), "{snapshot:?}");
    assert_eq!(world.gateway.buffered_bytes(), 0);
});
